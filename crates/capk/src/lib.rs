//! Cluster API's infrastructure provider for the kumo cloud (v1beta2 contract):
//! `KumoCluster` — a cloud load balancer in front of the control plane (listener 6443 →
//! 6443 on the control-plane instances), the control-plane endpoint, the cloud's zones as
//! failure domains —, `KumoMachine` — an instance of `spec.instanceType` in the Machine's
//! failure domain booting the Machine's bootstrap data as its user data, its providerID
//! `kumo://<zone>/<instance-id>` and addresses — and `KumoMachineTemplate`. Talks to the
//! cloud through its API with the provider's own access key.
//!
//! The control-plane endpoint is what the host reaches: the cloud's VIPs are never routed
//! from it, so the process owner publishes the load balancer's listener on a loopback port
//! ([`Publisher`]) and that address is the endpoint (as kind's and CAPD's load balancers
//! are published on the host).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kumo_capi::object::{bool_at, merge_conditions, str_at, Condition, Kind, Obj};
use kumo_client::informer::{Change, InformerFactory};
use kumo_client::worker::SyncError;
use kumo_cloud::{InstanceFilter, InstanceState};
use serde_json::{json, Value};
use tokio::sync::watch;

pub const GROUP: &str = "infrastructure.cluster.x-k8s.io";
pub const CLUSTER_FINALIZER: &str = "kumocluster.infrastructure.cluster.x-k8s.io";
pub const MACHINE_FINALIZER: &str = "kumomachine.infrastructure.cluster.x-k8s.io";
/// The provider's user (client certificate CN) and ClusterRole.
pub const MANAGER_USER: &str = "system:capk-manager";
pub const MANAGER_ROLE: &str = "kumo:cluster-api-provider-kumo";
/// The API server's port on the control-plane instances and the load balancer.
pub const API_PORT: u16 = 6443;
/// The tag naming the Cluster (`<namespace>/<name>`) of an instance or load balancer.
pub const CLUSTER_TAG: &str = "sigs.k8s.io/cluster-api-provider-kumo/cluster";
/// The tag of an instance's role (`control-plane`, `worker`) and of the API load balancer.
pub const ROLE_TAG: &str = "kumo.io/role";

const CRDS: &[&str] = &[
    include_str!("../crds/kumoclusters.json"),
    include_str!("../crds/kumomachines.json"),
    include_str!("../crds/kumomachinetemplates.json"),
];

pub struct KumoClusterKind;
impl Kind for KumoClusterKind {
    const GROUP: &'static str = GROUP;
    const VERSION: &'static str = "v1beta2";
    const KIND: &'static str = "KumoCluster";
    const PLURAL: &'static str = "kumoclusters";
}
pub struct KumoMachineKind;
impl Kind for KumoMachineKind {
    const GROUP: &'static str = GROUP;
    const VERSION: &'static str = "v1beta2";
    const KIND: &'static str = "KumoMachine";
    const PLURAL: &'static str = "kumomachines";
}
pub type KumoCluster = Obj<KumoClusterKind>;
pub type KumoMachine = Obj<KumoMachineKind>;

/// Publishes a load balancer's listener on the host's loopback.
#[async_trait::async_trait]
pub trait Publisher: Send + Sync + 'static {
    /// Maps a loopback port (`preferred` when free) to `port` of load balancer `lb`;
    /// returns the loopback address. Publishing again returns the same address.
    async fn publish(
        &self,
        lb: &str,
        port: u16,
        preferred: Option<u16>,
    ) -> Result<SocketAddr, String>;
    /// Removes what [`Publisher::publish`] made for `lb`.
    async fn unpublish(&self, lb: &str);
}

#[derive(Debug)]
enum Error {
    Cloud(kumo_cloud::Error),
    Kube(kube::Error),
    Other(String),
}

impl From<kumo_cloud::Error> for Error {
    fn from(e: kumo_cloud::Error) -> Self {
        Error::Cloud(e)
    }
}
impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Error::Kube(e)
    }
}
impl From<Error> for SyncError {
    fn from(e: Error) -> SyncError {
        match e {
            Error::Kube(e) => e.into(),
            Error::Cloud(e) => SyncError::Failed(e.to_string()),
            Error::Other(e) => SyncError::Failed(e),
        }
    }
}

/// Installs the provider's CRDs and its ClusterRole (bound to [`MANAGER_USER`]).
pub async fn install(admin: &kube::Client) -> Result<(), kumo_capi::Error> {
    let crds: Vec<Value> = CRDS
        .iter()
        .map(|t| {
            serde_json::from_str(t)
                .map_err(|e| kumo_capi::Error::Invalid(format!("an embedded CRD: {e}")))
        })
        .collect::<Result<_, _>>()?;
    kumo_capi::crds::apply_crds(admin, &crds, "clusterctl").await?;
    let rules = json!([
        {"apiGroups": [GROUP], "resources": ["*"], "verbs": ["*"]},
        {"apiGroups": ["cluster.x-k8s.io"], "resources": ["clusters", "machines"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "update"]},
    ]);
    kumo_capi::rbac::ensure_cluster_role(admin, MANAGER_ROLE, MANAGER_USER, rules).await
}

struct Provider {
    client: kube::Client,
    cloud: kumo_cloud::Client,
    publisher: Arc<dyn Publisher>,
    clusters: Arc<kumo_client::informer::Informer<KumoCluster>>,
    machines: Arc<kumo_client::informer::Informer<KumoMachine>>,
}

/// Starts the provider's controllers with `client` (its identity) and `cloud` (its key).
pub fn start(
    client: kube::Client,
    cloud: kumo_cloud::Client,
    publisher: Arc<dyn Publisher>,
    stop: watch::Receiver<bool>,
) {
    let factory = InformerFactory::new(client.clone());
    let p = Arc::new(Provider {
        clusters: factory.informer(),
        machines: factory.informer(),
        client,
        cloud,
        publisher,
    });
    let cq = factory.queue::<String>("kumocluster");
    let mq = factory.queue::<String>("kumomachine");
    {
        let q = cq.clone();
        p.clusters.add_handler(move |c| q.add(key(c)));
        let q = mq.clone();
        p.machines.add_handler(move |c| q.add(key(c)));
    }
    factory.start(stop.clone());
    kumo_client::worker::run_workers_of(
        "kumocluster",
        cq.clone(),
        2,
        stop.clone(),
        &p,
        |p, k| async move { p.sync_cluster(&k).await },
    );
    kumo_client::worker::run_workers_of(
        "kumomachine",
        mq.clone(),
        2,
        stop.clone(),
        &p,
        |p, k| async move { p.sync_machine(&k).await },
    );
    // The cloud changes without an event here: look again.
    let weak = Arc::downgrade(&p);
    let mut stop = stop;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let Some(p) = weak.upgrade() else { return };
            for c in p.clusters.list() {
                cq.add(c.key());
            }
            for m in p.machines.list() {
                mq.add(m.key());
            }
        }
    });
}

fn key<K: Kind>(c: Change<'_, Obj<K>>) -> String {
    match c {
        Change::Added(o) | Change::Deleted(o) => o.key(),
        Change::Updated { new, .. } => new.key(),
    }
}

/// How the control-plane load balancer checks its targets: a TCP connection to the API
/// server's port every second (the cloud's shortest interval), 2 in a row to be healthy or
/// unhealthy. Quicker than the cloud's default (10 s, 3 in a row: half a minute before a
/// new cluster's endpoint answers), as the cluster's own components reach their API server
/// through it.
fn api_health_check() -> kumo_cloud::HealthCheck {
    kumo_cloud::HealthCheck {
        port: API_PORT,
        interval_seconds: 1,
        timeout_seconds: 1,
        healthy_threshold: 2,
        unhealthy_threshold: 2,
        ..Default::default()
    }
}

/// The load balancer's name for KumoCluster `ns/name` (the cloud allows 32 characters).
fn lb_name(ns: &str, name: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, format!("{ns}/{name}").as_bytes());
    let hex: String = d.as_ref()[..5].iter().map(|b| format!("{b:02x}")).collect();
    let mut short: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(16)
        .collect();
    short = short.trim_matches('-').to_owned();
    format!("{short}-api-{hex}")
}

impl Provider {
    async fn patch_status<K: Kind>(&self, o: &Obj<K>, status: Value) -> Result<(), Error> {
        if o.status == status {
            return Ok(());
        }
        Api::<Obj<K>>::namespaced(self.client.clone(), o.namespace())
            .patch_status(
                o.name(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await?;
        Ok(())
    }

    async fn patch<K: Kind>(&self, o: &Obj<K>, body: Value) -> Result<(), Error> {
        Api::<Obj<K>>::namespaced(self.client.clone(), o.namespace())
            .patch(o.name(), &PatchParams::default(), &Patch::Merge(body))
            .await?;
        Ok(())
    }

    async fn set_finalizers<K: Kind>(&self, o: &Obj<K>, fs: Vec<String>) -> Result<(), Error> {
        self.patch(
            o,
            json!({"metadata": {"finalizers": fs, "resourceVersion": o.metadata.resource_version}}),
        )
        .await
    }

    async fn sync_cluster(&self, key: &str) -> Result<(), SyncError> {
        let Some(c) = self.clusters.get(key) else {
            return Ok(());
        };
        let ns = c.namespace();
        let name = lb_name(ns, c.name());
        if c.deleting() {
            self.publisher.unpublish(&name).await;
            if let Some(lb) = self
                .cloud
                .find_load_balancer(&name)
                .await
                .map_err(Error::from)?
            {
                self.cloud
                    .delete_load_balancer(&lb.id)
                    .await
                    .map_err(Error::from)?;
            }
            let fs = c
                .metadata
                .finalizers
                .clone()
                .unwrap_or_default()
                .into_iter()
                .filter(|f| f != CLUSTER_FINALIZER)
                .collect();
            return Ok(self.set_finalizers(&*c, fs).await?);
        }
        if !c.has_finalizer(CLUSTER_FINALIZER) {
            let mut fs = c.metadata.finalizers.clone().unwrap_or_default();
            fs.push(CLUSTER_FINALIZER.into());
            return Ok(self.set_finalizers(&*c, fs).await?);
        }
        let lb = match self
            .cloud
            .find_load_balancer(&name)
            .await
            .map_err(Error::from)?
        {
            Some(lb) => lb,
            None => {
                let req = kumo_cloud::CreateLoadBalancerRequest {
                    name: name.clone(),
                    listeners: vec![kumo_cloud::Listener {
                        port: API_PORT,
                        protocol: kumo_cloud::Protocol::Tcp,
                        target_port: API_PORT,
                    }],
                    targets: Vec::new(),
                    health_check: Some(api_health_check()),
                    tags: BTreeMap::from([
                        (CLUSTER_TAG.to_owned(), c.key()),
                        (ROLE_TAG.to_owned(), "apiserver".to_owned()),
                    ]),
                };
                self.cloud
                    .create_load_balancer(&req)
                    .await
                    .map_err(Error::from)?
            }
        };
        let preferred = c
            .spec
            .pointer("/controlPlaneEndpoint/port")
            .and_then(Value::as_u64)
            .map(|p| p as u16);
        let addr = self
            .publisher
            .publish(&name, API_PORT, preferred)
            .await
            .map_err(Error::Other)?;
        let host = str_at(&c.spec, "/controlPlaneEndpoint/host").unwrap_or_default();
        if host.is_empty() {
            self.patch(&*c, json!({"spec": {"controlPlaneEndpoint": {"host": addr.ip().to_string(), "port": addr.port()}}})).await?;
            return Ok(());
        }
        let zones: Vec<Value> = kumo_cloud::ZONES
            .iter()
            .map(|z| json!({"name": z, "controlPlane": true}))
            .collect();
        let status = json!({
            "initialization": {"provisioned": true},
            "failureDomains": zones,
            "loadBalancer": {"id": lb.id, "name": lb.name, "vip": lb.vip, "dnsName": lb.dns_name},
            "conditions": merge_conditions(&c.status, &[Condition::new("Ready", true, "Ready"), Condition::new("Paused", false, "NotPaused")], c.metadata.generation),
        });
        self.patch_status(&*c, status).await?;
        Ok(())
    }

    async fn sync_machine(&self, key: &str) -> Result<(), SyncError> {
        let Some(km) = self.machines.get(key) else {
            return Ok(());
        };
        let ns = km.namespace();
        let cluster = km
            .label(kumo_capi::CLUSTER_NAME_LABEL)
            .unwrap_or_default()
            .to_owned();
        let role = if km.label(kumo_capi::CONTROL_PLANE_LABEL).is_some() {
            "control-plane"
        } else {
            "worker"
        };
        let instance = self.find_instance(&km).await?;
        if km.deleting() {
            if let Some(i) = &instance {
                if role == "control-plane" {
                    self.set_target(ns, &cluster, &i.id, false).await?;
                }
                if !matches!(
                    i.state,
                    InstanceState::Terminated | InstanceState::ShuttingDown
                ) {
                    self.cloud
                        .terminate_instance(&i.id)
                        .await
                        .map_err(Error::from)?;
                }
            }
            let fs = km
                .metadata
                .finalizers
                .clone()
                .unwrap_or_default()
                .into_iter()
                .filter(|f| f != MACHINE_FINALIZER)
                .collect();
            return Ok(self.set_finalizers(&*km, fs).await?);
        }
        if !km.has_finalizer(MACHINE_FINALIZER) {
            let mut fs = km.metadata.finalizers.clone().unwrap_or_default();
            fs.push(MACHINE_FINALIZER.into());
            return Ok(self.set_finalizers(&*km, fs).await?);
        }
        let instance = match instance {
            Some(i) => i,
            None => {
                if bool_at(&km.status, "/initialization/provisioned") {
                    // Its instance is gone for good: reported, never replaced (the
                    // Machine's health check remediates it).
                    return Ok(());
                }
                // Waits for its Machine's bootstrap data.
                let Some(owner) = km.metadata.owner_references.as_ref().and_then(|os| {
                    os.iter()
                        .find(|o| o.kind == "Machine" && o.controller == Some(true))
                }) else {
                    return self
                        .waiting(
                            &km,
                            "WaitingForMachine",
                            "Waiting for a Machine to own this KumoMachine",
                        )
                        .await;
                };
                let machines: Api<DynamicObject> = Api::namespaced_with(
                    self.client.clone(),
                    ns,
                    &ApiResource::from_gvk_with_plural(
                        &kube::core::GroupVersionKind::gvk(
                            "cluster.x-k8s.io",
                            "v1beta2",
                            "Machine",
                        ),
                        "machines",
                    ),
                );
                let Some(machine) = machines.get_opt(&owner.name).await.map_err(Error::from)?
                else {
                    return self
                        .waiting(&km, "WaitingForMachine", "Waiting for its Machine")
                        .await;
                };
                let Some(secret) = machine
                    .data
                    .pointer("/spec/bootstrap/dataSecretName")
                    .and_then(Value::as_str)
                else {
                    return self
                        .waiting(
                            &km,
                            "WaitingForBootstrapData",
                            "Waiting for the Machine's spec.bootstrap.dataSecretName",
                        )
                        .await;
                };
                let secrets: Api<k8s_openapi::api::core::v1::Secret> =
                    Api::namespaced(self.client.clone(), ns);
                let s = secrets.get(secret).await.map_err(Error::from)?;
                let data = s
                    .data
                    .as_ref()
                    .and_then(|d| d.get("value"))
                    .and_then(|v| String::from_utf8(v.0.clone()).ok())
                    .ok_or_else(|| {
                        Error::Other(format!("bootstrap data Secret {ns}/{secret} has no value"))
                    })?;
                let zone = machine
                    .data
                    .pointer("/spec/failureDomain")
                    .and_then(Value::as_str)
                    .or_else(|| str_at(&km.spec, "/failureDomain"))
                    .map(str::to_owned);
                let req = kumo_cloud::RunInstanceRequest {
                    name: Some(km.name().to_owned()),
                    instance_type: str_at(&km.spec, "/instanceType").map(str::to_owned),
                    zone,
                    user_data: Some(data),
                    tags: BTreeMap::from([
                        (CLUSTER_TAG.to_owned(), format!("{ns}/{cluster}")),
                        (ROLE_TAG.to_owned(), role.to_owned()),
                        ("kumo.io/kumo-machine".to_owned(), km.key()),
                    ]),
                    ..Default::default()
                };
                self.cloud.run_instance(&req).await.map_err(Error::from)?
            }
        };
        let provider_id = format!("kumo://{}/{}", instance.zone, instance.id);
        if str_at(&km.spec, "/providerID") != Some(provider_id.as_str()) {
            self.patch(
                &*km,
                json!({"spec": {"providerID": provider_id, "failureDomain": instance.zone}}),
            )
            .await?;
            return Ok(());
        }
        let running = instance.state == InstanceState::Running;
        if running && role == "control-plane" {
            self.set_target(ns, &cluster, &instance.id, true).await?;
        }
        let state = serde_json::to_value(instance.state).unwrap_or_default();
        let ready = match instance.state {
            InstanceState::Running => Condition::new("Ready", true, "Ready"),
            InstanceState::Pending => Condition::new("Ready", false, "InstancePending")
                .message(format!("Instance {} is pending", instance.id)),
            _ => Condition::new("Ready", false, "InstanceNotRunning").message(format!(
                "Instance {} is {}",
                instance.id,
                state.as_str().unwrap_or_default()
            )),
        };
        let provisioned = running || bool_at(&km.status, "/initialization/provisioned");
        let status = json!({
            "initialization": {"provisioned": provisioned},
            "instanceID": instance.id,
            "instanceState": state,
            "addresses": [
                {"type": "InternalIP", "address": instance.private_ip},
                {"type": "InternalDNS", "address": instance.private_dns_name},
                {"type": "Hostname", "address": instance.name},
            ],
            "conditions": merge_conditions(&km.status, &[ready, Condition::new("Paused", false, "NotPaused")], km.metadata.generation),
        });
        self.patch_status(&*km, status).await?;
        if !running {
            return Err(SyncError::After(Duration::from_millis(500)));
        }
        Ok(())
    }

    async fn waiting(
        &self,
        km: &KumoMachine,
        reason: &'static str,
        msg: &str,
    ) -> Result<(), SyncError> {
        let status = json!({
            "initialization": {"provisioned": false},
            "conditions": merge_conditions(&km.status, &[Condition::new("Ready", false, reason).message(msg)], km.metadata.generation),
        });
        self.patch_status(km, status).await?;
        Err(SyncError::After(Duration::from_secs(1)))
    }

    /// The machine's instance: the one it recorded, else one launched for it (by tag)
    /// that is not terminated.
    async fn find_instance(&self, km: &KumoMachine) -> Result<Option<kumo_cloud::Instance>, Error> {
        if let Some(id) = str_at(&km.status, "/instanceID") {
            match self.cloud.describe_instance(id).await {
                Ok(i) if i.state != InstanceState::Terminated => return Ok(Some(i)),
                Ok(_) => return Ok(None),
                Err(kumo_cloud::Error::Api { status: 404, .. }) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
        let filter = InstanceFilter {
            name: Some(km.name().to_owned()),
            states: vec![
                InstanceState::Pending,
                InstanceState::Running,
                InstanceState::Stopping,
                InstanceState::Stopped,
            ],
            ..Default::default()
        };
        let found = self.cloud.list_instances(&filter).await?;
        Ok(found.into_iter().find(|i| {
            i.tags.get("kumo.io/kumo-machine").map(String::as_str) == Some(km.key().as_str())
        }))
    }

    /// Adds (or removes) `instance` to the targets of the cluster's API load balancer.
    async fn set_target(
        &self,
        ns: &str,
        cluster: &str,
        instance: &str,
        on: bool,
    ) -> Result<(), Error> {
        let Some(kc) = self.clusters.list().into_iter().find(|c| {
            c.namespace() == ns && c.label(kumo_capi::CLUSTER_NAME_LABEL) == Some(cluster)
        }) else {
            return Ok(());
        };
        let Some(lb) = self
            .cloud
            .find_load_balancer(&lb_name(ns, kc.name()))
            .await?
        else {
            return Ok(());
        };
        let mut targets: Vec<String> = lb.targets.iter().map(|t| t.instance_id.clone()).collect();
        let has = targets.iter().any(|t| t == instance);
        if has == on {
            return Ok(());
        }
        if on {
            targets.push(instance.to_owned());
        } else {
            targets.retain(|t| t != instance);
        }
        let req = kumo_cloud::UpdateLoadBalancerRequest {
            targets: Some(targets),
            ..Default::default()
        };
        self.cloud.update_load_balancer(&lb.id, &req).await?;
        Ok(())
    }
}
