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
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};

use kumo_apimachinery::quantity::Quantity;
use kumo_client::informer::Informer;

use crate::helpers::node_selector_matches;
use crate::plugins::{Code, Status};

/// The plugin's name.
pub const VOLUME_BINDING: &str = "VolumeBinding";
/// On a claim: the node chosen for its first consumer.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
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
}

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
    annotation(&c.metadata, BETA_CLASS)
        .map(str::to_owned)
        .or_else(|| c.spec.as_ref().and_then(|s| s.storage_class_name.clone()))
        .unwrap_or_default()
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
        out.delayed.push(Delayed {
            claim: c,
            class,
            selected,
        });
    }
    if !out.delayed.is_empty() {
        out.volumes = inf.volumes.list();
    }
    out
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
            let vclass = annotation(&v.metadata, BETA_CLASS)
                .map(str::to_owned)
                .or_else(|| spec.and_then(|s| s.storage_class_name.clone()))
                .unwrap_or_default();
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
                    .insert("pv.kubernetes.io/bound-by-controller".into(), "yes".into());
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
