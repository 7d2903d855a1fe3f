//! Cluster API's management side (v1beta2): the CRDs (upstream's schemas), the core
//! controllers (Cluster, Machine, MachineSet, MachineDeployment), the kubeadm bootstrap
//! provider (KubeadmConfig → cloud-init running `kubeadm init`/`join`) and the kubeadm
//! control-plane provider (KubeadmControlPlane: the cluster's certificates, its
//! `<cluster>-kubeconfig` Secret, its control-plane Machines). An API client of the
//! management cluster only: the machines' infrastructure is an infrastructure provider's
//! (the kumo cloud's is `kumo-capk`), reached through contract references.

pub mod bootstrap;
pub mod certs;
pub mod cluster;
pub mod controlplane;
pub mod crds;
pub mod etcd;
pub mod healthcheck;
pub mod kubeadm;
pub mod machine;
pub mod machineset;
pub mod object;
pub mod rbac;
pub mod refs;
pub mod remote;

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kumo_client::informer::{Change, Informer, InformerFactory};
use kumo_client::worker::SyncError;
use kumo_client::workqueue::WorkQueue;
use object::*;
use serde_json::Value;
use tokio::sync::watch;

pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
pub const CONTROL_PLANE_NAME_LABEL: &str = "cluster.x-k8s.io/control-plane-name";
pub const SET_NAME_LABEL: &str = "cluster.x-k8s.io/set-name";
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
pub const CLONED_FROM_NAME: &str = "cluster.x-k8s.io/cloned-from-name";
pub const CLONED_FROM_GROUPKIND: &str = "cluster.x-k8s.io/cloned-from-groupkind";
pub const CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
pub const MACHINE_DEPLOYMENT_FINALIZER: &str = "cluster.x-k8s.io/machinedeployment";
pub const MACHINE_SET_FINALIZER: &str = "cluster.x-k8s.io/machineset";
pub const KCP_FINALIZER: &str = "kubeadm.controlplane.cluster.x-k8s.io";
/// The component name of the events (upstream's managers name their recorders so).
pub const COMPONENT: &str = "cluster-api";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("{0} not found")]
    NotFound(String),
}

impl From<Error> for SyncError {
    fn from(e: Error) -> SyncError {
        match e {
            Error::Api(e) => e.into(),
            e => SyncError::Failed(e.to_string()),
        }
    }
}

/// What every controller shares: the client, the caches, the queues.
pub struct Manager {
    pub client: kube::Client,
    pub refs: refs::Refs,
    pub remote: remote::Remote,
    pub clusters: Arc<Informer<Cluster>>,
    pub machines: Arc<Informer<Machine>>,
    pub machine_sets: Arc<Informer<MachineSet>>,
    pub deployments: Arc<Informer<MachineDeployment>>,
    pub control_planes: Arc<Informer<KubeadmControlPlane>>,
    pub configs: Arc<Informer<KubeadmConfig>>,
    pub health_checks: Arc<Informer<MachineHealthCheck>>,
    pub cluster_queue: Arc<WorkQueue<String>>,
    pub machine_queue: Arc<WorkQueue<String>>,
    pub set_queue: Arc<WorkQueue<String>>,
    pub deployment_queue: Arc<WorkQueue<String>>,
    pub kcp_queue: Arc<WorkQueue<String>>,
    pub config_queue: Arc<WorkQueue<String>>,
    pub health_check_queue: Arc<WorkQueue<String>>,
    /// Machines a control plane created that its cache has not shown yet (controller-
    /// runtime's expectations): control plane key → machine name. No control plane creates
    /// another machine before the last one is seen, so a stale cache never makes two
    /// `kubeadm init` machines.
    pub expected_machines:
        parking_lot::Mutex<std::collections::HashMap<String, (String, std::time::Instant)>>,
    /// Where workload clusters' etcd members are found when a cluster shows no etcd pods
    /// (see [`etcd::Members`]).
    pub etcd_members: Option<Arc<dyn etcd::Members>>,
}

/// How often every object is looked at again (the infrastructure and the workload
/// clusters are not watched).
const RESYNC: Duration = Duration::from_secs(5);

impl Manager {
    /// Starts the controllers with `client` (the manager's identity); they stop when
    /// `stop` turns true.
    pub fn start(client: kube::Client, stop: watch::Receiver<bool>) -> Arc<Manager> {
        Self::start_with(client, stop, None)
    }

    /// [`Manager::start`], finding etcd members that no pod shows through `etcd_members`.
    pub fn start_with(
        client: kube::Client,
        stop: watch::Receiver<bool>,
        etcd_members: Option<Arc<dyn etcd::Members>>,
    ) -> Arc<Manager> {
        let factory = InformerFactory::new(client.clone());
        let m = Arc::new(Manager {
            refs: refs::Refs::new(client.clone()),
            remote: remote::Remote::new(client.clone()),
            clusters: factory.informer(),
            machines: factory.informer(),
            machine_sets: factory.informer(),
            deployments: factory.informer(),
            control_planes: factory.informer(),
            configs: factory.informer(),
            health_checks: factory.informer(),
            cluster_queue: factory.queue("cluster"),
            machine_queue: factory.queue("machine"),
            set_queue: factory.queue("machineset"),
            deployment_queue: factory.queue("machinedeployment"),
            kcp_queue: factory.queue("kubeadmcontrolplane"),
            config_queue: factory.queue("kubeadmconfig"),
            health_check_queue: factory.queue("machinehealthcheck"),
            expected_machines: Default::default(),
            etcd_members,
            client,
        });
        // Each change enqueues the object and what it belongs to.
        let weak = Arc::downgrade(&m);
        m.clusters.add_handler(move |c| {
            if let Some(m) = weak.upgrade() {
                let obj = changed(c);
                m.cluster_queue.add(obj.key());
                // Machines and control planes wait on the cluster's state.
                for k in m.kcps_of(obj.namespace(), obj.name()) {
                    m.kcp_queue.add(k);
                }
                for c in m.configs.list() {
                    if c.namespace() == obj.namespace()
                        && c.label(CLUSTER_NAME_LABEL) == Some(obj.name())
                    {
                        m.config_queue.add(c.key());
                    }
                }
            }
        });
        let weak = Arc::downgrade(&m);
        m.machines.add_handler(move |c| {
            if let Some(m) = weak.upgrade() {
                let obj = changed(c);
                m.machine_queue.add(obj.key());
                let ns = obj.namespace();
                if let Some(cl) = obj.cluster_name() {
                    m.cluster_queue.add(format!("{ns}/{cl}"));
                }
                if let Some(o) = obj.controller_of_kind::<MachineSetKind>() {
                    m.set_queue.add(format!("{ns}/{}", o.name));
                }
                if let Some(o) = obj.controller_of_kind::<KubeadmControlPlaneKind>() {
                    m.kcp_queue.add(format!("{ns}/{}", o.name));
                }
                if let Some(n) = str_at(&obj.spec, "/bootstrap/configRef/name") {
                    m.config_queue.add(format!("{ns}/{n}"));
                }
            }
        });
        let weak = Arc::downgrade(&m);
        m.machine_sets.add_handler(move |c| {
            if let Some(m) = weak.upgrade() {
                let obj = changed(c);
                m.set_queue.add(obj.key());
                if let Some(o) = obj.controller_of_kind::<MachineDeploymentKind>() {
                    m.deployment_queue
                        .add(format!("{}/{}", obj.namespace(), o.name));
                }
            }
        });
        let weak = Arc::downgrade(&m);
        m.deployments.add_handler(move |c| {
            if let Some(m) = weak.upgrade() {
                let obj = changed(c);
                m.deployment_queue.add(obj.key());
                if let Some(cl) = obj.cluster_name() {
                    m.cluster_queue.add(format!("{}/{cl}", obj.namespace()));
                }
            }
        });
        let weak = Arc::downgrade(&m);
        m.control_planes.add_handler(move |c| {
            if let Some(m) = weak.upgrade() {
                let obj = changed(c);
                m.kcp_queue.add(obj.key());
                if let Some(cl) = obj.label(CLUSTER_NAME_LABEL) {
                    m.cluster_queue.add(format!("{}/{cl}", obj.namespace()));
                }
            }
        });
        let weak = Arc::downgrade(&m);
        m.configs.add_handler(move |c| {
            if let Some(m) = weak.upgrade() {
                let obj = changed(c);
                m.config_queue.add(obj.key());
                if let Some(o) = obj.controller_of_kind::<MachineKind>() {
                    m.machine_queue
                        .add(format!("{}/{}", obj.namespace(), o.name));
                }
            }
        });
        let weak = Arc::downgrade(&m);
        m.health_checks.add_handler(move |c| {
            if let Some(m) = weak.upgrade() {
                m.health_check_queue.add(changed(c).key());
            }
        });
        factory.start(stop.clone());
        let run = |name: &'static str,
                   q: &Arc<WorkQueue<String>>,
                   f: fn(
            Arc<Manager>,
            String,
        ) -> futures::future::BoxFuture<'static, Result<(), SyncError>>| {
            kumo_client::worker::run_workers_of(name, q.clone(), 2, stop.clone(), &m, f);
        };
        run("cluster", &m.cluster_queue, |m, k| {
            Box::pin(async move { cluster::sync(&m, &k).await })
        });
        run("machine", &m.machine_queue, |m, k| {
            Box::pin(async move { machine::sync(&m, &k).await })
        });
        run("machineset", &m.set_queue, |m, k| {
            Box::pin(async move { machineset::sync_set(&m, &k).await })
        });
        run("machinedeployment", &m.deployment_queue, |m, k| {
            Box::pin(async move { machineset::sync_deployment(&m, &k).await })
        });
        run("kubeadmcontrolplane", &m.kcp_queue, |m, k| {
            Box::pin(async move { controlplane::sync(&m, &k).await })
        });
        run("kubeadmconfig", &m.config_queue, |m, k| {
            Box::pin(async move { bootstrap::sync(&m, &k).await })
        });
        run("machinehealthcheck", &m.health_check_queue, |m, k| {
            Box::pin(async move { healthcheck::sync(&m, &k).await })
        });
        // The infrastructure and the workload clusters change without an event here.
        let weak = Arc::downgrade(&m);
        let mut stop_resync = stop;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(RESYNC) => {}
                    _ = stop_resync.wait_for(|s| *s) => return,
                }
                let Some(m) = weak.upgrade() else { return };
                for o in m.clusters.list() {
                    m.cluster_queue.add(o.key());
                }
                for o in m.machines.list() {
                    m.machine_queue.add(o.key());
                }
                for o in m.machine_sets.list() {
                    m.set_queue.add(o.key());
                }
                for o in m.deployments.list() {
                    m.deployment_queue.add(o.key());
                }
                for o in m.control_planes.list() {
                    m.kcp_queue.add(o.key());
                }
                for o in m.configs.list() {
                    m.config_queue.add(o.key());
                }
            }
        });
        m
    }

    fn kcps_of(&self, ns: &str, cluster: &str) -> Vec<String> {
        self.control_planes
            .list()
            .iter()
            .filter(|k| k.namespace() == ns && k.label(CLUSTER_NAME_LABEL) == Some(cluster))
            .map(|k| k.key())
            .collect()
    }

    /// The API of kind `K` in `ns`.
    pub fn api<K: Kind>(&self, ns: &str) -> Api<Obj<K>> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Merge-patches `status` of `obj` when it differs.
    pub async fn patch_status<K: Kind>(&self, obj: &Obj<K>, status: Value) -> Result<(), Error> {
        if obj.status == status {
            return Ok(());
        }
        self.api::<K>(obj.namespace())
            .patch_status(
                obj.name(),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": status})),
            )
            .await?;
        Ok(())
    }

    /// Sets conditions `cs` on `obj` (a status patch only when it changes something).
    pub async fn set_conditions<K: Kind>(
        &self,
        obj: &Obj<K>,
        cs: &[Condition],
    ) -> Result<(), Error> {
        let merged = merge_conditions(&obj.status, cs, obj.metadata.generation);
        if obj.status.get("conditions") == Some(&merged) {
            return Ok(());
        }
        self.api::<K>(obj.namespace())
            .patch_status(
                obj.name(),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"conditions": merged}})),
            )
            .await?;
        Ok(())
    }

    /// Merge-patches `metadata` (labels, finalizers, owner references) of `obj`.
    pub async fn patch_meta<K: Kind>(&self, obj: &Obj<K>, meta: Value) -> Result<(), Error> {
        self.api::<K>(obj.namespace())
            .patch(
                obj.name(),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": meta})),
            )
            .await?;
        Ok(())
    }

    /// Adds `finalizer` to `obj` (true: it was missing, the object changes).
    pub async fn add_finalizer<K: Kind>(
        &self,
        obj: &Obj<K>,
        finalizer: &str,
    ) -> Result<bool, Error> {
        if obj.has_finalizer(finalizer) {
            return Ok(false);
        }
        let mut fs = obj.metadata.finalizers.clone().unwrap_or_default();
        fs.push(finalizer.into());
        self.api::<K>(obj.namespace())
            .patch(
                obj.name(),
                &PatchParams::default(),
                &Patch::Merge(finalizers_patch(obj, fs)),
            )
            .await?;
        Ok(true)
    }

    /// Removes `finalizer` from `obj`.
    pub async fn remove_finalizer<K: Kind>(
        &self,
        obj: &Obj<K>,
        finalizer: &str,
    ) -> Result<(), Error> {
        if !obj.has_finalizer(finalizer) {
            return Ok(());
        }
        let fs: Vec<String> = obj
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != finalizer)
            .collect();
        match self
            .api::<K>(obj.namespace())
            .patch(
                obj.name(),
                &PatchParams::default(),
                &Patch::Merge(finalizers_patch(obj, fs)),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if kumo_client::error::is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The objects of `items` whose controller is `owner`.
    pub fn controlled_by<C: Kind, O: Kind>(
        items: Vec<Arc<Obj<C>>>,
        owner: &Obj<O>,
    ) -> Vec<Arc<Obj<C>>> {
        items
            .into_iter()
            .filter(|x| {
                x.namespace() == owner.namespace()
                    && x.controller_of_kind::<O>()
                        .is_some_and(|o| o.name == owner.name())
            })
            .collect()
    }

    /// An owner's deletion: its `children` deleted, then (once they are gone) its
    /// `finalizer` removed.
    pub async fn delete_children<C: Kind, O: Kind>(
        &self,
        owner: &Obj<O>,
        children: &[Arc<Obj<C>>],
        finalizer: &str,
    ) -> Result<(), SyncError> {
        for x in children.iter().filter(|x| !x.deleting()) {
            let _ = self
                .api::<C>(x.namespace())
                .delete(x.name(), &kube::api::DeleteParams::background())
                .await;
        }
        if !children.is_empty() {
            return Err(SyncError::After(Duration::from_millis(500)));
        }
        self.remove_finalizer(owner, finalizer).await?;
        Ok(())
    }

    /// Records an event about `obj`.
    pub async fn event<K: Kind>(&self, obj: &Obj<K>, type_: &str, reason: &str, msg: String) {
        kumo_client::events::record_from(
            &self.client,
            COMPONENT,
            None,
            kumo_client::events::reference(obj),
            type_,
            reason,
            msg,
        )
        .await
    }
}

/// A merge patch that sets the finalizers, guarded by the resourceVersion it read (a
/// concurrent change makes it fail with a conflict rather than drop someone's finalizer).
fn finalizers_patch<K: Kind>(obj: &Obj<K>, fs: Vec<String>) -> Value {
    serde_json::json!({"metadata": {
        "finalizers": fs,
        "resourceVersion": obj.metadata.resource_version,
    }})
}

fn changed<K>(c: Change<'_, K>) -> &K {
    match c {
        Change::Added(o) | Change::Deleted(o) => o,
        Change::Updated { new, .. } => new,
    }
}

/// The scaling conditions of a set of replicas (ScalingUp, ScalingDown, MachinesReady).
pub fn scaling_conditions(have: i64, want: i64, ready: i64) -> Vec<Condition> {
    vec![
        if have < want {
            Condition::new("ScalingUp", true, "ScalingUp")
                .message(format!("Scaling up from {have} to {want} replicas"))
        } else {
            Condition::new("ScalingUp", false, "NotScalingUp")
        },
        if have > want {
            Condition::new("ScalingDown", true, "ScalingDown")
                .message(format!("Scaling down from {have} to {want} replicas"))
        } else {
            Condition::new("ScalingDown", false, "NotScalingDown")
        },
        if have == 0 {
            Condition::new("MachinesReady", true, "NoReplicas")
        } else if ready == have {
            Condition::new("MachinesReady", true, "Ready")
        } else {
            Condition::new("MachinesReady", false, "NotReady")
        },
    ]
}

/// The RollingOut condition of a set of machines (a KubeadmControlPlane's or a
/// MachineDeployment's): how many are not up to date and every reason their UpToDate
/// conditions give, a version change first, as upstream words it.
pub fn rolling_out<'a>(machines: impl Iterator<Item = &'a Machine>) -> Condition {
    let mut n = 0;
    let mut reasons = std::collections::BTreeSet::new();
    for x in machines {
        let Some(c) = condition_of(&x.status, "UpToDate") else {
            continue;
        };
        if c.get("status").and_then(Value::as_str) != Some("False") {
            continue;
        }
        n += 1;
        let message = c.get("message").and_then(Value::as_str).unwrap_or_default();
        reasons.extend(message.lines().filter(|l| !l.is_empty()).map(str::to_owned));
    }
    if n == 0 {
        return Condition::new("RollingOut", false, "NotRollingOut");
    }
    let mut reasons: Vec<String> = reasons.into_iter().collect();
    reasons.sort_by_key(|r| !r.starts_with("* Version"));
    let mut message = format!("Rolling out {n} not up-to-date replicas");
    if !reasons.is_empty() {
        message.push('\n');
        message.push_str(&reasons.join("\n"));
    }
    Condition::new("RollingOut", true, "RollingOut").message(message)
}

/// A random suffix of five of upstream's name-generator characters.
pub fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}
