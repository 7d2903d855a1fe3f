//! VolumeBinding: a pod's claims decide where it can go and are settled before it is
//! bound. A claim that does not exist, is being deleted, or is unbound in a class that
//! binds immediately keeps the pod unschedulable; a bound claim's volume limits the pod to
//! the nodes of its node affinity; an unbound claim of a class that waits for its first
//! consumer needs, on the node, either an Available volume that fits it and may be used
//! there, or a provisioner allowed to make one there. PreBind then binds those volumes
//! (the claimRef of a matching volume, or the `volume.kubernetes.io/selected-node`
//! annotation that tells the provisioner where) and waits for every claim to be bound
//! before the pod is.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{Api, PostParams};

use kumo_apimachinery::quantity::Quantity;
use kumo_client::informer::Informer;

use crate::helpers::node_selector_matches;
use crate::plugins::{Code, Status};

/// The plugin's name.
pub const VOLUME_BINDING: &str = "VolumeBinding";
pub use kumo_apimachinery::storage::SELECTED_NODE;
/// How long PreBind waits for the claims to be bound (upstream's bind timeout).
const BIND_TIMEOUT: Duration = Duration::from_secs(600);

const CONFLICT: &str = "node(s) had volume node affinity conflict";
const NO_VOLUMES: &str = "node(s) didn't find available persistent volumes to bind";

/// The informers the plugin reads.
pub struct Informers {
    /// PersistentVolumeClaims.
    pub claims: Arc<Informer<PersistentVolumeClaim>>,
    /// PersistentVolumes.
    pub volumes: Arc<Informer<PersistentVolume>>,
    /// StorageClasses.
    pub classes: Arc<Informer<StorageClass>>,
    /// CSINodes (each driver's volume limit on a node).
    pub csi_nodes: Arc<Informer<CSINode>>,
}

/// NodeVolumeLimits' name.
pub const NODE_VOLUME_LIMITS: &str = "NodeVolumeLimits";
const TOO_MANY: &str = "node(s) exceed max volume count";

/// An unbound claim whose class waits for the first consumer.
#[derive(Clone)]
struct Delayed {
    claim: Arc<PersistentVolumeClaim>,
    class: Option<Arc<StorageClass>>,
    selected: Option<String>,
}

/// What PreFilter found for one pod.
#[derive(Clone, Default)]
pub struct PodVolumes {
    /// Why no node can do (the same for every node).
    pub reject: Option<Status>,
    affinity: Vec<NodeSelector>,
    delayed: Vec<Delayed>,
    volumes: Vec<Arc<PersistentVolume>>,
    /// The pod's CSI volumes by driver (a volume handle, or the claim for one yet to be
    /// provisioned), for NodeVolumeLimits.
    csi: BTreeMap<String, Vec<String>>,
    /// What NodeVolumeLimits reads to count a node's volumes.
    claims: Option<Arc<Informer<PersistentVolumeClaim>>>,
    pvs: Option<Arc<Informer<PersistentVolume>>>,
    csi_nodes: Option<Arc<Informer<CSINode>>>,
}

fn unresolvable(reason: &str) -> Status {
    Status {
        plugin: VOLUME_BINDING,
        code: Code::UnschedulableAndUnresolvable,
        reasons: vec![reason.to_owned()],
    }
}

fn annotation<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

fn claim_class(c: &PersistentVolumeClaim) -> String {
    kumo_apimachinery::storage::class_of(
        c.metadata.annotations.as_ref(),
        c.spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref()),
    )
}

/// The claims a pod's volumes name (a generic ephemeral volume's is `<pod>-<volume>`).
pub fn claim_names(pod: &Pod) -> Vec<String> {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|v| {
            if let Some(c) = &v.persistent_volume_claim {
                Some(c.claim_name.clone())
            } else {
                v.ephemeral.as_ref().map(|_| format!("{name}-{}", v.name))
            }
        })
        .collect()
}

/// PreFilter.
pub fn pre_filter(inf: &Informers, pod: &Pod) -> PodVolumes {
    let mut out = PodVolumes::default();
    let names = claim_names(pod);
    if names.is_empty() {
        return out;
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    for name in names {
        let Some(c) = inf.claims.get(&format!("{ns}/{name}")) else {
            out.reject = Some(unresolvable(&format!(
                "persistentvolumeclaim \"{name}\" not found"
            )));
            return out;
        };
        if c.metadata.deletion_timestamp.is_some() {
            out.reject = Some(unresolvable(&format!(
                "persistentvolumeclaim \"{name}\" is being deleted"
            )));
            return out;
        }
        let volume = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if !volume.is_empty() {
            if let Some(pv) = inf.volumes.get(&volume) {
                if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
                    out.csi
                        .entry(csi.driver.clone())
                        .or_default()
                        .push(csi.volume_handle.clone());
                }
                if let Some(req) = pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_affinity.as_ref())
                    .and_then(|a| a.required.clone())
                {
                    out.affinity.push(req);
                }
            }
            continue;
        }
        let class = inf.classes.get(&claim_class(&c));
        let delay = class
            .as_ref()
            .and_then(|k| k.volume_binding_mode.as_deref())
            == Some("WaitForFirstConsumer");
        if !delay {
            out.reject = Some(unresolvable(
                "pod has unbound immediate PersistentVolumeClaims",
            ));
            return out;
        }
        let selected = annotation(&c.metadata, SELECTED_NODE)
            .filter(|n| !n.is_empty())
            .map(str::to_owned);
        if let Some(k) = class.as_ref().filter(|k| !k.provisioner.is_empty()) {
            out.csi
                .entry(k.provisioner.clone())
                .or_default()
                .push(format!("claim:{ns}/{name}"));
        }
        out.delayed.push(Delayed {
            claim: c,
            class,
            selected,
        });
    }
    if !out.delayed.is_empty() {
        out.volumes = inf.volumes.list();
    }
    if !out.csi.is_empty() {
        out.claims = Some(inf.claims.clone());
        out.pvs = Some(inf.volumes.clone());
        out.csi_nodes = Some(inf.csi_nodes.clone());
    }
    out
}

/// NodeVolumeLimits: the CSI volumes of each driver on the node (its pods' and this
/// pod's, each counted once) within the count the node's CSINode allows.
pub fn volume_limits(v: &PodVolumes, node: &Node, pods: &[Arc<Pod>]) -> Option<Status> {
    let (Some(claims), Some(pvs), Some(csi_nodes)) = (&v.claims, &v.pvs, &v.csi_nodes) else {
        return None;
    };
    let name = node.metadata.name.as_deref()?;
    let csi = csi_nodes.get(name)?;
    for (driver, mine) in &v.csi {
        let Some(limit) = csi
            .spec
            .drivers
            .iter()
            .find(|d| d.name == *driver)
            .and_then(|d| d.allocatable.as_ref())
            .and_then(|a| a.count)
        else {
            continue;
        };
        let mut used: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        for p in pods {
            let ns = p.metadata.namespace.as_deref().unwrap_or("");
            for c in claim_names(p) {
                let Some(claim) = claims.get(&format!("{ns}/{c}")) else {
                    continue;
                };
                let pv = claim
                    .spec
                    .as_ref()
                    .and_then(|s| s.volume_name.clone())
                    .unwrap_or_default();
                match pvs
                    .get(&pv)
                    .and_then(|v| v.spec.as_ref().and_then(|s| s.csi.clone()))
                {
                    Some(csi) if csi.driver == *driver => {
                        used.insert(csi.volume_handle);
                    }
                    Some(_) => {}
                    // Not provisioned yet: counted as the claim it is.
                    None => {
                        used.insert(format!("claim:{ns}/{c}"));
                    }
                }
            }
        }
        let before = used.len();
        used.extend(mine.iter().cloned());
        if used.len() > before && used.len() > usize::try_from(limit).unwrap_or(usize::MAX) {
            return Some(Status {
                plugin: NODE_VOLUME_LIMITS,
                code: Code::Unschedulable,
                reasons: vec![TOO_MANY.to_owned()],
            });
        }
    }
    None
}

fn storage(
    m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Option<Quantity> {
    Quantity::parse(&m?.get("storage")?.0)
}

/// The smallest Available volume that fits `c` and may be used on `node`.
fn matching_volume<'a>(
    vols: &'a [Arc<PersistentVolume>],
    c: &PersistentVolumeClaim,
    node: &Node,
) -> Option<&'a Arc<PersistentVolume>> {
    let want = storage(
        c.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref()),
    );
    let class = claim_class(c);
    let modes: Vec<String> = c
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default();
    vols.iter()
        .filter(|v| {
            let spec = v.spec.as_ref();
            let phase = v.status.as_ref().and_then(|s| s.phase.as_deref());
            let have = storage(spec.and_then(|s| s.capacity.as_ref()));
            let vclass = kumo_apimachinery::storage::class_of(
                v.metadata.annotations.as_ref(),
                spec.and_then(|s| s.storage_class_name.as_deref()),
            );
            let vmodes = spec
                .and_then(|s| s.access_modes.clone())
                .unwrap_or_default();
            phase == Some("Available")
                && spec.and_then(|s| s.claim_ref.as_ref()).is_none()
                && vclass == class
                && matches!((&have, &want), (Some(h), Some(w)) if h >= w)
                && modes.iter().all(|m| vmodes.contains(m))
                && spec
                    .and_then(|s| s.node_affinity.as_ref())
                    .and_then(|a| a.required.as_ref())
                    .is_none_or(|sel| node_selector_matches(sel, node))
        })
        .min_by(|a, b| {
            let cap =
                |v: &PersistentVolume| storage(v.spec.as_ref().and_then(|s| s.capacity.as_ref()));
            cap(a).cmp(&cap(b))
        })
}

/// Whether the class may provision on `node` (its allowedTopologies, if any).
fn provisions_on(class: &StorageClass, node: &Node) -> bool {
    if class.provisioner.is_empty() || class.provisioner == "kubernetes.io/no-provisioner" {
        return false;
    }
    let Some(terms) = class.allowed_topologies.as_ref().filter(|t| !t.is_empty()) else {
        return true;
    };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    terms.iter().any(|t| {
        t.match_label_expressions
            .iter()
            .flatten()
            .all(|e| labels.get(&e.key).is_some_and(|v| e.values.contains(v)))
    })
}

/// Filter.
pub fn filter(v: &PodVolumes, node: &Node) -> Option<Status> {
    if let Some(r) = &v.reject {
        return Some(r.clone());
    }
    if v.affinity
        .iter()
        .any(|sel| !node_selector_matches(sel, node))
    {
        return Some(unresolvable(CONFLICT));
    }
    let name = node.metadata.name.as_deref().unwrap_or("");
    for d in &v.delayed {
        if let Some(sel) = &d.selected {
            if sel != name {
                return Some(unresolvable(NO_VOLUMES));
            }
            continue;
        }
        if matching_volume(&v.volumes, &d.claim, node).is_some() {
            continue;
        }
        if !d.class.as_ref().is_some_and(|k| provisions_on(k, node)) {
            return Some(unresolvable(NO_VOLUMES));
        }
    }
    None
}

/// PreBind: binds the pod's waiting claims for `node` and waits until every claim of the
/// pod is bound (or gives the reason it is not).
pub async fn pre_bind(
    client: &kube::Client,
    inf: &Informers,
    pod: &Pod,
    node: &Node,
) -> Result<(), String> {
    let v = pre_filter(inf, pod);
    if let Some(r) = v.reject {
        return Err(r.reasons.join(", "));
    }
    if v.delayed.is_empty() {
        return Ok(());
    }
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let mut taken: Vec<String> = Vec::new();
    for d in &v.delayed {
        let c = &d.claim;
        let cname = c.metadata.name.clone().unwrap_or_default();
        let free: Vec<Arc<PersistentVolume>> = v
            .volumes
            .iter()
            .filter(|p| !taken.contains(p.metadata.name.as_ref().unwrap_or(&String::new())))
            .cloned()
            .collect();
        if d.selected.is_none() {
            if let Some(pv) = matching_volume(&free, c, node) {
                // A static volume: its claimRef, as the binder would write it.
                let mut n = (**pv).clone();
                n.metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(
                        kumo_apimachinery::storage::BOUND_BY_CONTROLLER.into(),
                        "yes".into(),
                    );
                n.spec.get_or_insert_with(Default::default).claim_ref = Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PersistentVolumeClaim".into()),
                    name: Some(cname.clone()),
                    namespace: Some(ns.clone()),
                    uid: c.metadata.uid.clone(),
                    resource_version: c.metadata.resource_version.clone(),
                    field_path: None,
                });
                let name = n.metadata.name.clone().unwrap_or_default();
                taken.push(name.clone());
                pvs.replace(&name, &PostParams::default(), &n)
                    .await
                    .map_err(|e| format!("binding volumes: {}", kumo_client::error::message(&e)))?;
                continue;
            }
            // To be provisioned where the pod goes.
            let mut n = (**c).clone();
            n.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(SELECTED_NODE.into(), node_name.clone());
            claims
                .replace(&cname, &PostParams::default(), &n)
                .await
                .map_err(|e| format!("binding volumes: {}", kumo_client::error::message(&e)))?;
        }
    }
    // Every claim bound (its phase Bound with a volume name) before the pod is.
    let deadline = Instant::now() + BIND_TIMEOUT;
    let names = claim_names(pod);
    loop {
        let all = names.iter().all(|n| {
            inf.claims.get(&format!("{ns}/{n}")).is_some_and(|c| {
                c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                    && c.spec
                        .as_ref()
                        .and_then(|s| s.volume_name.as_deref())
                        .is_some_and(|v| !v.is_empty())
            })
        });
        if all {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("binding volumes: context deadline exceeded".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
