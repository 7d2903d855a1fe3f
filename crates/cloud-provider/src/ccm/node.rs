//! The cloud node controller (upstream's `CloudNodeController`): initializes nodes that a
//! kubelet with `--cloud-provider=external` registered with the
//! `node.cloudprovider.kubernetes.io/uninitialized` taint — providerID, addresses, zone,
//! region and instance-type labels from the cloud — then removes the taint and records
//! `Synced`. Every `--node-status-update-frequency` it refreshes the addresses of the
//! initialized nodes, and it keeps the GA labels in step with their beta originals.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeAddress, Taint};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kumo_client::clients::ClientSource;
use kumo_client::error::{is_conflict, message};
use kumo_client::events;
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers, wait_for_sync, SyncError};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Context;
use crate::InstanceMetadata;

/// The taint a kubelet with `--cloud-provider=external` registers its node with
/// (upstream's `TaintExternalCloudProvider`).
pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// The kubelet's `--node-ip`, which must be among the cloud's addresses
/// (upstream's `AnnotationAlphaProvidedIPAddr`).
pub const ANNOTATION_PROVIDED_IP: &str = "alpha.kubernetes.io/provided-node-ip";
/// The event source (upstream's recorder component).
pub const COMPONENT: &str = "cloud-node-controller";

const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
const LABEL_ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
const LABEL_REGION: &str = "topology.kubernetes.io/region";
const LABEL_REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
const LABEL_INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";

/// The (beta, GA) label pairs reconciled on initialized nodes; the beta label is the
/// source of truth and the GA label is added when missing (upstream's labelReconcileInfo).
const LABEL_RECONCILE: &[(&str, &str)] = &[
    (LABEL_ZONE_BETA, LABEL_ZONE),
    (LABEL_REGION_BETA, LABEL_REGION),
    (LABEL_INSTANCE_TYPE_BETA, LABEL_INSTANCE_TYPE),
];

/// Upstream's UpdateNodeSpecBackoff: 20 tries, 50 ms with a jitter of 1.0.
const UPDATE_STEPS: u32 = 20;
const UPDATE_DELAY: Duration = Duration::from_millis(50);

struct Ctl {
    ctx: Arc<Context>,
    client: ClientSource,
    nodes: Arc<Informer<Node>>,
}

/// Registers the controller's handlers on `factory` and starts its workers.
pub fn start(
    ctx: Arc<Context>,
    factory: &InformerFactory,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let mut stop = stop;
    let queue = factory.queue::<String>("Nodes");
    let nodes = factory.informer::<Node>();
    let q = queue.clone();
    // Nodes that exist before the controller starts come in as additions.
    nodes.add_handler(move |c| match c {
        Change::Added(n) | Change::Updated { new: n, .. } => q.add(key_of(n)),
        Change::Deleted(_) => {}
    });
    tokio::spawn(async move {
        let Some(client) = client_for(&ctx.clients, "node-controller", &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl { ctx, client, nodes });
        tracing::info!("Waiting for informer caches to sync");
        if !wait_for_sync(&mut stop, ctl.nodes.wait_synced()).await {
            return;
        }
        let (c, mut s) = (ctl.clone(), stop.clone());
        let status_loop = tokio::spawn(async move {
            loop {
                c.update_node_status().await;
                tokio::select! {
                    _ = tokio::time::sleep(c.ctx.config.node_status_update_frequency) => {}
                    _ = s.wait_for(|s| *s) => return,
                }
            }
        });
        let workers = ctl.ctx.config.concurrent_node_syncs.max(1);
        let c = ctl.clone();
        let mut tasks = run_workers("cloud-node", queue, workers, stop, move |key| {
            let c = c.clone();
            async move { c.sync_node(&key).await }
        });
        tasks.push(status_loop);
        futures::future::join_all(tasks).await;
    })
}

fn has_cloud_taint(node: &Node) -> bool {
    taints(node).iter().any(|t| t.key == TAINT_UNINITIALIZED)
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

fn node_addresses(node: &Node) -> &[NodeAddress] {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default()
}

/// Whether the two address lists differ (upstream's nodeAddressesChangeDetected: by
/// length, then by the address of each type).
fn addresses_changed(old: &[NodeAddress], new: &[NodeAddress]) -> bool {
    if old.len() != new.len() {
        return true;
    }
    let by_type: BTreeMap<&str, &str> = old
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect();
    new.iter()
        .any(|a| by_type.get(a.type_.as_str()).copied().unwrap_or("") != a.address)
}

/// The `provided-node-ip` annotation's addresses (one IP or a dual-stack pair), with
/// upstream's messages (ParseNodeIPAnnotation).
fn parse_node_ips(value: &str) -> Result<Vec<IpAddr>, String> {
    let mut ips = Vec::new();
    for part in value.split(',') {
        let ip: IpAddr = part
            .parse()
            .map_err(|_| format!("could not parse {part:?}"))?;
        ips.push(ip.to_canonical());
    }
    let same_family = ips.len() == 2 && ips[0].is_ipv6() == ips[1].is_ipv6();
    if ips.len() > 2 || same_family {
        return Err("must contain either a single IP or a dual-stack pair of IPs".into());
    }
    if ips.len() == 2 && ips.iter().any(IpAddr::is_unspecified) {
        return Err("dual-stack node IP cannot include '0.0.0.0' or '::'".into());
    }
    Ok(ips)
}

/// The cloud's addresses filtered by the node's `provided-node-ip` annotation, if it has
/// one (upstream's GetNodeAddressesFromNodeIP): addresses equal to a provided IP come
/// first and are the only ones of their type; the other types follow. A provided IP the
/// cloud does not report is an error.
fn addresses_from_node_ip(node: &Node, cloud: &[NodeAddress]) -> Result<Vec<NodeAddress>, String> {
    let Some(provided) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_PROVIDED_IP))
    else {
        return Ok(cloud.to_vec());
    };
    let ips = parse_node_ips(provided)
        .map_err(|e| format!("failed to parse node IP {provided:?}: {e}"))?;
    let mut out = Vec::new();
    let mut types: Vec<&str> = Vec::new();
    for ip in ips {
        let mut matched = false;
        for a in cloud {
            let parsed = a.address.parse::<IpAddr>().ok().map(|p| p.to_canonical());
            if parsed == Some(ip) {
                out.push(a.clone());
                types.push(a.type_.as_str());
                matched = true;
            }
        }
        if !matched {
            return Err(format!(
                "failed to get node address from cloud provider that matches ip: {ip}"
            ));
        }
    }
    out.extend(
        cloud
            .iter()
            .filter(|a| !types.contains(&a.type_.as_str()))
            .cloned(),
    );
    Ok(out)
}

/// Whether a label key is in a Kubernetes namespace, which a cloud may not add labels in
/// (upstream's `(^|\.)(kubernetes|k8s)\.io/`).
fn is_k8s_namespace(key: &str) -> bool {
    ["kubernetes.io/", "k8s.io/"].iter().any(|ns| {
        key.match_indices(ns)
            .any(|(i, _)| i == 0 || key[..i].ends_with('.'))
    })
}

/// Sets the labels the cloud's metadata implies (instance type, zone, region, and the
/// provider's additional labels outside the Kubernetes namespaces, never overwriting).
fn apply_labels(node: &mut Node, md: &InstanceMetadata) {
    let labels = node.metadata.labels.get_or_insert_with(BTreeMap::new);
    let mut set = |k: &str, v: &str| {
        labels.insert(k.to_owned(), v.to_owned());
    };
    if !md.instance_type.is_empty() {
        set(LABEL_INSTANCE_TYPE_BETA, &md.instance_type);
        set(LABEL_INSTANCE_TYPE, &md.instance_type);
    }
    if !md.zone.is_empty() {
        set(LABEL_ZONE_BETA, &md.zone);
        set(LABEL_ZONE, &md.zone);
    }
    if !md.region.is_empty() {
        set(LABEL_REGION_BETA, &md.region);
        set(LABEL_REGION, &md.region);
    }
    for (k, v) in &md.additional_labels {
        if is_k8s_namespace(k) {
            tracing::warn!("Discarding node label {k} with kubernetes namespace");
        } else if let Some(old) = labels.get(k) {
            if old != v {
                tracing::warn!("Discarding node label {k} that is already present");
            }
        } else {
            labels.insert(k.clone(), v.clone());
        }
    }
}

/// `base` plus up to `base` again (wait.Backoff's Jitter 1.0); the randomness only spreads
/// retries, so the clock's nanoseconds are enough.
fn jittered(base: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    base + base.mul_f64(f64::from(nanos % 1000) / 1000.0)
}

impl Ctl {
    fn api(&self) -> Api<Node> {
        Api::all(self.client.get())
    }

    /// Initializes a tainted node; reconciles the labels of an initialized one.
    async fn sync_node(&self, name: &str) -> Result<(), SyncError> {
        let Some(cur) = self.nodes.get(name) else {
            return Ok(());
        };
        if !has_cloud_taint(&cur) {
            return self.reconcile_labels(&cur).await;
        }
        tracing::info!("Initializing node {name} with cloud provider");
        let Some(instances) = self.ctx.cloud.instances_v2() else {
            return Err(SyncError::Failed(
                "failed to get instances from cloud provider".into(),
            ));
        };
        let mut md = instances.instance_metadata(&cur).await.map_err(|e| {
            SyncError::Failed(format!(
                "failed to get instance metadata for node {name}: {e}"
            ))
        })?;
        // The providerID is needed by other controllers (load balancers): the taint stays
        // until it is known.
        let node_pid = cur
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default();
        if md.provider_id.is_empty() {
            if node_pid.is_empty() {
                return Err(SyncError::Failed(format!(
                    "failed to get instance metadata for node {name}: cloud provider does not set node provider ID for node {name}"
                )));
            }
            md.provider_id = node_pid.clone();
        }
        // A provided node IP must be valid before the taint goes.
        if let Err(e) = addresses_from_node_ip(&cur, &md.node_addresses) {
            return Err(SyncError::Failed(format!(
                "failed to get node modifiers from cloud provider: provided node ip for node {name:?} is not valid: {e}"
            )));
        }
        let modify = |n: &mut Node| {
            let spec = n.spec.get_or_insert_with(Default::default);
            if node_pid.is_empty() && !md.provider_id.is_empty() {
                spec.provider_id = Some(md.provider_id.clone());
            }
            apply_labels(n, &md);
            let spec = n.spec.get_or_insert_with(Default::default);
            let kept: Vec<Taint> = spec
                .taints
                .take()
                .unwrap_or_default()
                .into_iter()
                .filter(|t| t.key != TAINT_UNINITIALIZED)
                .collect();
            spec.taints = Some(kept);
        };
        let mut step = 0;
        let updated = loop {
            step += 1;
            let Some(fresh) = self.nodes.get(name) else {
                return Err(SyncError::Failed(format!("node \"{name}\" not found")));
            };
            let mut new = (*fresh).clone();
            modify(&mut new);
            match self.api().replace(name, &PostParams::default(), &new).await {
                Ok(_) => break new,
                Err(e) if is_conflict(&e) && step < UPDATE_STEPS => {
                    tokio::time::sleep(jittered(UPDATE_DELAY)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        // The addresses right away, so that users see no delay.
        self.update_node_address(&updated, &md).await;
        tracing::info!("Successfully initialized node {name} with cloud provider");
        events::record(
            &self.client,
            COMPONENT,
            events::reference(cur.as_ref()),
            "Normal",
            "Synced",
            "Node synced successfully".into(),
        )
        .await;
        Ok(())
    }

    /// Adds a missing GA label, or corrects one that differs from its beta label.
    async fn reconcile_labels(&self, node: &Node) -> Result<(), SyncError> {
        let Some(labels) = node.metadata.labels.as_ref() else {
            return Ok(());
        };
        let mut update = BTreeMap::new();
        for (primary, secondary) in LABEL_RECONCILE {
            let Some(value) = labels.get(*primary) else {
                continue;
            };
            if labels.get(*secondary) != Some(value) {
                update.insert(*secondary, value.clone());
            }
        }
        if update.is_empty() {
            return Ok(());
        }
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let patch = json!({"metadata": {"labels": update}});
        self.api()
            .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .map_err(|e| {
                SyncError::Failed(format!(
                    "failed update labels for node {name}: {}",
                    message(&e)
                ))
            })?;
        Ok(())
    }

    /// Writes the cloud's addresses into an initialized node's status when they changed
    /// (keeping the kubelet's Hostname when the cloud has none, and honouring the provided
    /// node IP). Failures are logged: the next refresh tries again.
    async fn update_node_address(&self, node: &Node, md: &InstanceMetadata) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if has_cloud_taint(node) {
            return;
        }
        let mut addrs = md.node_addresses.clone();
        if addrs.is_empty() {
            tracing::debug!(
                "Skipping node address update for node {name:?} since cloud provider did not return any"
            );
            return;
        }
        if !addrs.iter().any(|a| a.type_ == "Hostname") {
            addrs.extend(
                node_addresses(node)
                    .iter()
                    .filter(|a| a.type_ == "Hostname")
                    .cloned(),
            );
        }
        let addrs = match addresses_from_node_ip(node, &addrs) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!("Failed to update node addresses for node {name:?}: {e}");
                return;
            }
        };
        if !addresses_changed(node_addresses(node), &addrs) {
            return;
        }
        // A merge patch replaces the whole list (addresses merge by type in a strategic
        // patch, which upstream works around the same way).
        let patch = json!({"status": {"addresses": addrs}});
        if let Err(e) = self
            .api()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            tracing::error!(
                "Error patching node with cloud ip addresses = [{}]",
                message(&e)
            );
        }
    }

    /// The periodic refresh: the addresses of every initialized node
    /// (`--concurrent-node-syncs` at a time).
    async fn update_node_status(&self) {
        let nodes = self.nodes.list();
        let started = std::time::Instant::now();
        let Some(instances) = self.ctx.cloud.instances_v2() else {
            return;
        };
        let count = nodes.len();
        futures::stream::iter(nodes)
            .for_each_concurrent(
                self.ctx.config.concurrent_node_syncs.max(1),
                |node| async move {
                    if has_cloud_taint(&node) {
                        return;
                    }
                    match instances.instance_metadata(&node).await {
                        Ok(md) => self.update_node_address(&node, &md).await,
                        Err(e) => tracing::error!(
                            "Error getting instance metadata for node addresses: {e}"
                        ),
                    }
                },
            )
            .await;
        tracing::debug!("Update {count} nodes status took {:?}.", started.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(t: &str, a: &str) -> NodeAddress {
        NodeAddress {
            type_: t.into(),
            address: a.into(),
        }
    }

    fn annotated(ip: &str) -> Node {
        let mut n = Node::default();
        n.metadata.annotations = Some([(ANNOTATION_PROVIDED_IP.to_owned(), ip.to_owned())].into());
        n
    }

    #[test]
    fn provided_ip_comes_first_and_is_the_only_one_of_its_type() {
        let cloud = [
            addr("InternalIP", "10.0.1.5"),
            addr("InternalIP", "10.0.1.6"),
            addr("Hostname", "ip-10-0-1-5"),
        ];
        let got = addresses_from_node_ip(&annotated("10.0.1.6"), &cloud).unwrap();
        assert_eq!(
            got,
            [
                addr("InternalIP", "10.0.1.6"),
                addr("Hostname", "ip-10-0-1-5")
            ]
        );
        let err = addresses_from_node_ip(&annotated("10.9.9.9"), &cloud).unwrap_err();
        assert_eq!(
            err,
            "failed to get node address from cloud provider that matches ip: 10.9.9.9"
        );
        let err = addresses_from_node_ip(&annotated("nope"), &cloud).unwrap_err();
        assert_eq!(
            err,
            "failed to parse node IP \"nope\": could not parse \"nope\""
        );
        let err = addresses_from_node_ip(&annotated("10.0.1.5,10.0.1.6"), &cloud).unwrap_err();
        assert!(err.ends_with("must contain either a single IP or a dual-stack pair of IPs"));
        assert_eq!(
            addresses_from_node_ip(&Node::default(), &cloud).unwrap(),
            cloud
        );
    }

    #[test]
    fn address_changes_are_detected_by_type() {
        let a = [addr("InternalIP", "10.0.0.1"), addr("Hostname", "h")];
        let b = [addr("Hostname", "h"), addr("InternalIP", "10.0.0.1")];
        assert!(!addresses_changed(&a, &b));
        assert!(addresses_changed(
            &a,
            &[addr("InternalIP", "10.0.0.2"), addr("Hostname", "h")]
        ));
        assert!(addresses_changed(&a, &a[..1]));
    }

    #[test]
    fn kubernetes_namespaces_are_recognized() {
        assert!(is_k8s_namespace("kubernetes.io/hostname"));
        assert!(is_k8s_namespace("node.kubernetes.io/foo"));
        assert!(is_k8s_namespace("x.k8s.io/foo"));
        assert!(!is_k8s_namespace("example.com/kubernetes.io"));
        assert!(!is_k8s_namespace("mykubernetes.io/foo"));
    }
}
