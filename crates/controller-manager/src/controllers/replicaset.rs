//! replicaset-controller: keeps `spec.replicas` pods of a ReplicaSet's template running.
//! Pods are created with generateName `<rs>-` and a controller ownerReference, in
//! slow-start batches (1, 2, 4, … up to 500 per sync); surplus pods are deleted in
//! upstream's preference order; orphans matching the selector are adopted and owned pods
//! that stop matching are released. Expectations (client-go's ControllerExpectations)
//! stop a burst of watch events from creating or deleting twice.
//!
//! Also holds the helpers the deployment controller shares: label selectors, controller
//! references, pod readiness and events.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::core::v1::{PodTemplateSpec, ReplicationController};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams, Preconditions};
use kube::Resource;
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_not_found, message, namespace_terminating};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::WorkQueue;

/// Upstream's BurstReplicas: the most pods created or deleted in one sync.
const BURST_REPLICAS: usize = 500;
/// Expectations older than this are ignored (ExpectationsTimeout).
const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// What the controller needs of its owner kind: ReplicaSet, or ReplicationController (the
/// same controller with a map selector, as upstream's replication manager).
pub(crate) trait Owner:
    kumo_client::informer::Watchable
    + Resource<Scope = k8s_openapi::NamespaceResourceScope>
    + serde::Serialize
{
    /// The event source component.
    const COMPONENT: &'static str;
    /// The ServiceAccount the controller acts as.
    const SERVICE_ACCOUNT: &'static str;
    /// The work queue's name.
    const QUEUE: &'static str;
    /// Whether the status has `terminatingReplicas` (ReplicaSets only).
    const TERMINATING: bool;
    /// The label selector.
    fn selector(&self) -> LabelSelector;
    /// The pod template.
    fn template(&self) -> Option<&PodTemplateSpec>;
    /// `spec.replicas` (default 1).
    fn replicas(&self) -> i32;
    /// `spec.minReadySeconds`.
    fn min_ready_seconds(&self) -> i32;
    /// The status, as JSON.
    fn status_json(&self) -> serde_json::Value;
}

impl Owner for ReplicaSet {
    const COMPONENT: &'static str = "replicaset-controller";
    const SERVICE_ACCOUNT: &'static str = "replicaset-controller";
    const QUEUE: &'static str = "replicaset";
    const TERMINATING: bool = true;
    fn selector(&self) -> LabelSelector {
        self.spec.selector.clone()
    }
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.template.as_ref()
    }
    fn replicas(&self) -> i32 {
        self.spec.replicas.unwrap_or(1)
    }
    fn min_ready_seconds(&self) -> i32 {
        self.spec.min_ready_seconds.unwrap_or(0)
    }
    fn status_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.status).unwrap_or_default()
    }
}

impl Owner for ReplicationController {
    const COMPONENT: &'static str = "replication-controller";
    const SERVICE_ACCOUNT: &'static str = "replication-controller";
    const QUEUE: &'static str = "replicationmanager";
    const TERMINATING: bool = false;
    fn selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: self.spec.as_ref().and_then(|s| s.selector.clone()),
            match_expressions: None,
        }
    }
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref()?.template.as_ref()
    }
    fn replicas(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
    }
    fn min_ready_seconds(&self) -> i32 {
        self.spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .unwrap_or(0)
    }
    fn status_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.status).unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------
// Shared helpers.

/// Whether `labels` satisfy `sel` (matchLabels and matchExpressions; an empty selector
/// matches everything, as metav1.LabelSelectorAsSelector).
pub(crate) fn selector_matches(
    sel: &LabelSelector,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    for (k, v) in sel.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return false;
        }
    }
    for e in sel.match_expressions.iter().flatten() {
        let got = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        let ok = match e.operator.as_str() {
            "In" => got.is_some_and(|g| values.contains(g)),
            "NotIn" => got.is_none_or(|g| !values.contains(g)),
            "Exists" => got.is_some(),
            "DoesNotExist" => got.is_none(),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Whether the selector selects everything.
pub(crate) fn selector_is_empty(sel: Option<&LabelSelector>) -> bool {
    sel.is_none_or(|s| {
        s.match_labels.as_ref().is_none_or(|m| m.is_empty())
            && s.match_expressions.as_ref().is_none_or(|m| m.is_empty())
    })
}

/// The controller ownerReference of an object, if it has one.
pub(crate) fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// A controller ownerReference to `owner` (blockOwnerDeletion set, as upstream).
pub(crate) fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.meta().name.clone().unwrap_or_default(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The patch that makes `owner` the controller of an object (adoption), guarded by the
/// object's uid and resourceVersion so it never applies to a replaced or changed object.
pub(crate) fn adopt_patch(meta: &ObjectMeta, owner: OwnerReference) -> serde_json::Value {
    let mut refs: Vec<OwnerReference> = meta.owner_references.clone().unwrap_or_default();
    refs.retain(|r| r.uid != owner.uid);
    refs.push(owner);
    json!({"metadata": {"ownerReferences": refs, "uid": meta.uid, "resourceVersion": meta.resource_version}})
}

/// The patch that removes the ownerReference with `owner_uid` (release).
pub(crate) fn release_patch(meta: &ObjectMeta, owner_uid: &str) -> serde_json::Value {
    let refs: Vec<OwnerReference> = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != owner_uid)
        .cloned()
        .collect();
    let refs = if refs.is_empty() {
        serde_json::Value::Null
    } else {
        json!(refs)
    };
    json!({"metadata": {"ownerReferences": refs, "uid": meta.uid, "resourceVersion": meta.resource_version}})
}

/// Whether the pod counts as active (podutil: not Succeeded/Failed, not being deleted).
pub(crate) fn pod_active(p: &Pod) -> bool {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    phase != Some("Succeeded") && phase != Some("Failed") && p.metadata.deletion_timestamp.is_none()
}

/// The pod's Ready condition, if true: when it became true.
fn ready_since(p: &Pod) -> Option<Option<Timestamp>> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    (c.status == "True").then(|| c.last_transition_time.as_ref().map(|t| t.0))
}

/// Whether the pod is Ready.
pub(crate) fn pod_ready(p: &Pod) -> bool {
    ready_since(p).is_some()
}

/// Whether the pod has been Ready for `min_ready_seconds` (podutil.IsPodAvailable).
pub(crate) fn pod_available(p: &Pod, min_ready_seconds: i32, now: Timestamp) -> bool {
    match ready_since(p) {
        None => false,
        Some(_) if min_ready_seconds <= 0 => true,
        Some(None) => false,
        Some(Some(t)) => t.as_second() + i64::from(min_ready_seconds) <= now.as_second(),
    }
}

/// Records an event on `obj` from `component` ([`kumo_client::events::record`]: repeats are
/// folded into one event's count, as client-go's recorder does).
pub(crate) async fn record_event<K: Resource<DynamicType = ()>>(
    client: &ClientSource,
    component: &str,
    obj: &K,
    type_: &str,
    reason: &str,
    msg: String,
) {
    kumo_client::events::record(
        client,
        component,
        kumo_client::events::reference(obj),
        type_,
        reason,
        msg,
    )
    .await;
}

/// client-go's ControllerExpectations: creations and deletions a controller has asked for
/// and not yet seen through its informer.
#[derive(Default)]
pub(crate) struct Expectations {
    m: Mutex<HashMap<String, (i64, i64, Instant)>>,
}

impl Expectations {
    /// Whether the controller may act on `key` (nothing pending, or pending too long).
    pub(crate) fn satisfied(&self, key: &str) -> bool {
        match self.m.lock().get(key) {
            None => true,
            Some((add, del, at)) => (*add <= 0 && *del <= 0) || at.elapsed() > EXPECTATIONS_TIMEOUT,
        }
    }

    /// Expects `add` creations and `del` deletions for `key`.
    pub(crate) fn expect(&self, key: &str, add: i64, del: i64) {
        self.m
            .lock()
            .insert(key.to_owned(), (add, del, Instant::now()));
    }

    /// Lowers the pending creations (`add`) and deletions (`del`) of `key`.
    pub(crate) fn lower(&self, key: &str, add: i64, del: i64) {
        if let Some(e) = self.m.lock().get_mut(key) {
            e.0 -= add;
            e.1 -= del;
        }
    }

    /// Forgets `key` (its controller is gone).
    pub(crate) fn delete(&self, key: &str) {
        self.m.lock().remove(key);
    }
}

// ---------------------------------------------------------------------------------------
// The controller.

struct Ctl<K> {
    client: ClientSource,
    sets: Arc<Informer<K>>,
    pods: Arc<Informer<Pod>>,
    queue: Arc<WorkQueue<String>>,
    expectations: Arc<Expectations>,
}

/// The ReplicaSets in the pod's namespace whose selector matches it (for orphans).
fn matching_sets<K: Owner>(sets: &Informer<K>, pod: &Pod) -> Vec<String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    sets.list()
        .iter()
        .filter(|rs| {
            rs.meta().namespace.as_deref() == Some(ns) && {
                let sel = rs.selector();
                !selector_is_empty(Some(&sel))
                    && selector_matches(&sel, pod.metadata.labels.as_ref())
            }
        })
        .map(|rs| key_of(rs.as_ref()))
        .collect()
}

/// The key of the ReplicaSet controlling the pod, if one does.
fn owner_key<K: Owner>(pod: &Pod) -> Option<String> {
    let r = controller_of(&pod.metadata)?;
    (r.kind == K::kind(&())).then(|| {
        format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            r.name
        )
    })
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    start_for::<ReplicaSet>(clients, factory, stop)
}

/// replicationcontroller-controller: the same controller for ReplicationControllers.
pub fn start_replication_controllers(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    start_for::<ReplicationController>(clients, factory, stop)
}

fn start_for<K: Owner>(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>(K::QUEUE);
    let sets = factory.informer::<K>();
    let pods = factory.informer::<Pod>();
    let expectations = Arc::new(Expectations::default());

    let (q, ex) = (queue.clone(), expectations.clone());
    sets.add_handler(move |c| match c {
        Change::Added(rs) | Change::Updated { new: rs, .. } => q.add(key_of(rs)),
        Change::Deleted(rs) => {
            ex.delete(&key_of(rs));
            q.add(key_of(rs));
        }
    });
    let (q, ex, s) = (queue.clone(), expectations.clone(), sets.clone());
    pods.add_handler(move |c| match c {
        Change::Added(p) => {
            if p.metadata.deletion_timestamp.is_some() {
                // Already being deleted (seen after a relist): a deletion, not a creation.
                if let Some(k) = owner_key::<K>(p) {
                    ex.lower(&k, 0, 1);
                    q.add(k);
                }
                return;
            }
            match owner_key::<K>(p) {
                Some(k) => {
                    ex.lower(&k, 1, 0);
                    q.add(k);
                }
                None if controller_of(&p.metadata).is_none() => {
                    for k in matching_sets(&s, p) {
                        q.add(k);
                    }
                }
                None => {}
            }
        }
        Change::Updated { old, new } => {
            if old.metadata.resource_version == new.metadata.resource_version {
                return;
            }
            let (ok, nk) = (owner_key::<K>(old), owner_key::<K>(new));
            if new.metadata.deletion_timestamp.is_some()
                && old.metadata.deletion_timestamp.is_none()
            {
                // A graceful deletion started: count it as the deletion we expected.
                if let Some(k) = &nk {
                    ex.lower(k, 0, 1);
                }
            }
            if ok != nk {
                if let Some(k) = ok {
                    q.add(k);
                }
            }
            match nk {
                Some(k) => {
                    // A pod that became ready becomes available after minReadySeconds.
                    if !pod_ready(old) && pod_ready(new) {
                        if let Some(mrs) = s
                            .get(&k)
                            .map(|rs| rs.min_ready_seconds())
                            .filter(|m| *m > 0)
                        {
                            q.add_after(k.clone(), Duration::from_secs(mrs as u64 + 1));
                        }
                    }
                    q.add(k);
                }
                None if controller_of(&new.metadata).is_none()
                    && (old.metadata.labels != new.metadata.labels
                        || controller_of(&old.metadata).is_some()) =>
                {
                    for k in matching_sets(&s, new) {
                        q.add(k);
                    }
                }
                None => {}
            }
        }
        Change::Deleted(p) => {
            if let Some(k) = owner_key::<K>(p) {
                if p.metadata.deletion_timestamp.is_none() {
                    ex.lower(&k, 0, 1);
                }
                q.add(k);
            }
        }
    });

    tokio::spawn(async move {
        tracing::info!(controller = K::QUEUE, "Starting controller");
        let Some(client) = client_for(&clients, K::SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            sets,
            pods,
            queue: queue.clone(),
            expectations,
        });
        let synced = async {
            ctl.sets.wait_synced().await;
            ctl.pods.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let tasks = run_workers_of(K::QUEUE, queue, 5, stop, &ctl, |c, key| async move {
            c.sync(&key).await
        });
        futures::future::join_all(tasks).await;
        tracing::info!(controller = K::QUEUE, "Shutting down controller");
    })
}

/// The pod made from the ReplicaSet's template (controller.GetPodFromTemplate).
fn pod_from_template<K: Owner>(rs: &K) -> Pod {
    let tmpl = rs.template().cloned().unwrap_or_default();
    let tm = tmpl.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!(
                "{}-",
                rs.meta().name.as_deref().unwrap_or_default()
            )),
            namespace: rs.meta().namespace.clone(),
            labels: tm.labels,
            annotations: tm.annotations,
            finalizers: tm.finalizers,
            owner_references: Some(vec![controller_ref(rs)]),
            ..Default::default()
        },
        spec: tmpl.spec,
        status: None,
    }
}

/// Upstream's deletion preference (controller.ActivePodsWithRanks), most deletable first:
/// unassigned, then pending/unknown before running, not ready, more related pods on the
/// same node, ready for a shorter time, more restarts, newer.
fn deletion_order(pods: &mut [Arc<Pod>], related: &[Arc<Pod>]) {
    let mut on_node: HashMap<String, usize> = HashMap::new();
    for p in related.iter().filter(|p| pod_active(p)) {
        let n = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        *on_node.entry(n).or_default() += 1;
    }
    let phase_rank = |p: &Pod| match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") | None => 0,
        Some("Unknown") => 1,
        _ => 2,
    };
    let node = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    };
    let restarts = |p: &Pod| -> i32 {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|cs| cs.iter().map(|c| c.restart_count).max().unwrap_or(0))
            .unwrap_or(0)
    };
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    pods.sort_by(|a, b| {
        let (na, nb) = (node(a), node(b));
        (!na.is_empty())
            .cmp(&!nb.is_empty())
            .then(phase_rank(a).cmp(&phase_rank(b)))
            .then(pod_ready(a).cmp(&pod_ready(b)))
            .then(
                on_node
                    .get(&nb)
                    .copied()
                    .unwrap_or(0)
                    .cmp(&on_node.get(&na).copied().unwrap_or(0)),
            )
            .then_with(
                || match (ready_since(a).flatten(), ready_since(b).flatten()) {
                    (Some(x), Some(y)) => y.cmp(&x),
                    _ => std::cmp::Ordering::Equal,
                },
            )
            .then(restarts(b).cmp(&restarts(a)))
            .then(created(b).cmp(&created(a)))
    });
}

impl<K: Owner> Ctl<K> {
    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let Some(rs) = self.sets.get(key) else {
            self.expectations.delete(key);
            return Ok(());
        };
        let selector = rs.selector();
        let meta = rs.meta();
        let ns = meta.namespace.clone().unwrap_or_default();
        let uid = meta.uid.clone().unwrap_or_default();
        let needs_sync = self.expectations.satisfied(key);
        // An empty selector selects nothing here (upstream refuses to act on it).
        let selector_ok = !selector_is_empty(Some(&selector));
        let pods_api: Api<Pod> = Api::namespaced(self.client.get(), &ns);

        // Claim: adopt matching orphans, release owned pods that no longer match.
        let mut owned: Vec<Arc<Pod>> = Vec::new();
        let all: Vec<Arc<Pod>> = self
            .pods
            .list()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
            .collect();
        let mut related = Vec::new();
        let deleting = meta.deletion_timestamp.is_some();
        let mut adopt_checked = false;
        for p in &all {
            let matches = selector_ok && selector_matches(&selector, p.metadata.labels.as_ref());
            match controller_of(&p.metadata) {
                Some(r) if r.uid == uid => {
                    if matches || deleting {
                        owned.push(p.clone());
                    } else if pod_active(p) {
                        let patch = release_patch(&p.metadata, &uid);
                        let name = p.metadata.name.clone().unwrap_or_default();
                        match pods_api
                            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                        {
                            Ok(_) => {}
                            Err(e) if is_not_found(&e) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                Some(r) => {
                    // Another controller's pod: counts for the deletion ranking if it is a
                    // sibling (same kind of owner).
                    if r.kind == K::kind(&()) {
                        related.push(p.clone());
                    }
                }
                None => {
                    if !matches || deleting || !pod_active(p) {
                        continue;
                    }
                    if !adopt_checked {
                        // Upstream re-reads the owner before adopting: it must still exist,
                        // with this uid, and not be being deleted.
                        let api: Api<K> = Api::namespaced(self.client.get(), &ns);
                        let fresh = api.get(meta.name.as_deref().unwrap_or_default()).await?;
                        if fresh.meta().uid.as_deref() != Some(uid.as_str())
                            || fresh.meta().deletion_timestamp.is_some()
                        {
                            break;
                        }
                        adopt_checked = true;
                    }
                    let patch = adopt_patch(&p.metadata, controller_ref(rs.as_ref()));
                    let name = p.metadata.name.clone().unwrap_or_default();
                    match pods_api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(adopted) => owned.push(Arc::new(adopted)),
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        related.extend(owned.iter().cloned());
        let active: Vec<Arc<Pod>> = owned.iter().filter(|p| pod_active(p)).cloned().collect();

        let mut manage_err: Option<(String, String)> = None;
        if needs_sync && !deleting {
            if let Err((reason, msg)) = self.manage(&rs, key, active.clone(), &related).await {
                manage_err = Some((reason, msg));
            }
        }

        // Status.
        let now = Timestamp::now();
        let mrs = rs.min_ready_seconds();
        let tmpl_labels = rs
            .template()
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        let fully = active
            .iter()
            .filter(|p| {
                let l = p.metadata.labels.clone().unwrap_or_default();
                tmpl_labels.iter().all(|(k, v)| l.get(k) == Some(v))
            })
            .count();
        let ready = active.iter().filter(|p| pod_ready(p)).count();
        let available = active.iter().filter(|p| pod_available(p, mrs, now)).count();
        let terminating = owned
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .count();
        let old = rs.status_json();
        let mut conditions: Vec<serde_json::Value> =
            old["conditions"].as_array().cloned().unwrap_or_default();
        let has_failure = conditions.iter().any(|c| c["type"] == "ReplicaFailure");
        match &manage_err {
            Some((reason, msg)) if !has_failure => conditions.push(json!({
                "type": "ReplicaFailure",
                "status": "True",
                "reason": reason,
                "message": msg,
                "lastTransitionTime": Time(now),
            })),
            None if has_failure => conditions.retain(|c| c["type"] != "ReplicaFailure"),
            _ => {}
        }
        let generation = meta.generation.unwrap_or(0);
        let num = |f: &str| old[f].as_i64().unwrap_or(0);
        let changed = num("replicas") != active.len() as i64
            || num("fullyLabeledReplicas") != fully as i64
            || num("readyReplicas") != ready as i64
            || num("availableReplicas") != available as i64
            || (K::TERMINATING && num("terminatingReplicas") != terminating as i64)
            || num("observedGeneration") != generation
            || old["conditions"].as_array().cloned().unwrap_or_default() != conditions;
        if changed {
            let conds = if conditions.is_empty() {
                serde_json::Value::Null
            } else {
                json!(conditions)
            };
            // Upstream's counters but replicas are omitempty: zero is left out.
            let mut status = serde_json::Map::new();
            status.insert("replicas".into(), json!(active.len()));
            for (f, n) in [
                ("fullyLabeledReplicas", fully as i64),
                ("readyReplicas", ready as i64),
                ("availableReplicas", available as i64),
                ("observedGeneration", generation),
            ] {
                if n != 0 {
                    status.insert(f.into(), json!(n));
                }
            }
            if K::TERMINATING {
                status.insert("terminatingReplicas".into(), json!(terminating));
            }
            if !conds.is_null() {
                status.insert("conditions".into(), conds);
            }
            // An update of the status subresource (the bootstrap role grants update, not
            // patch), guarded by the cached resourceVersion.
            let mut obj = serde_json::to_value(rs.as_ref()).unwrap_or_default();
            obj["status"] = serde_json::Value::Object(status);
            let obj: K = serde_json::from_value(obj)
                .map_err(|e| SyncError::Failed(format!("encoding the status: {e}")))?;
            let api: Api<K> = Api::namespaced(self.client.get(), &ns);
            match api
                .replace_status(
                    meta.name.as_deref().unwrap_or_default(),
                    &PostParams::default(),
                    &obj,
                )
                .await
            {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        if let Some((_, msg)) = manage_err {
            return Err(SyncError::Failed(msg));
        }
        // Pods ready but not yet available: look again once minReadySeconds have passed.
        if mrs > 0 && ready == rs.replicas().max(0) as usize && available != ready {
            self.queue
                .add_after(key.to_owned(), Duration::from_secs(mrs as u64 + 1));
        }
        Ok(())
    }

    /// Creates or deletes pods towards `spec.replicas` (manageReplicas). The error is the
    /// ReplicaFailure condition's reason and message.
    async fn manage(
        &self,
        rs: &K,
        key: &str,
        mut active: Vec<Arc<Pod>>,
        related: &[Arc<Pod>],
    ) -> Result<(), (String, String)> {
        let desired = rs.replicas().max(0) as usize;
        let ns = rs.meta().namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.get(), &ns);
        if active.len() < desired {
            let diff = (desired - active.len()).min(BURST_REPLICAS);
            self.expectations.expect(key, diff as i64, 0);
            // Slow start: batches of 1, 2, 4, … so a failing template costs one call.
            let mut remaining = diff;
            let mut batch = 1usize;
            let mut first_err: Option<String> = None;
            while remaining > 0 {
                let n = batch.min(remaining);
                let pod = pod_from_template(rs);
                let pp = PostParams::default();
                let results =
                    futures::future::join_all((0..n).map(|_| api.create(&pp, &pod))).await;
                let mut ok = 0;
                for r in results {
                    match r {
                        Ok(p) => {
                            ok += 1;
                            record_event(
                                &self.client,
                                K::COMPONENT,
                                rs,
                                "Normal",
                                "SuccessfulCreate",
                                format!("Created pod: {}", p.metadata.name.unwrap_or_default()),
                            )
                            .await;
                        }
                        Err(e) => {
                            // The informer will never see this pod.
                            self.expectations.lower(key, 1, 0);
                            if namespace_terminating(&e) {
                                continue;
                            }
                            let m = message(&e);
                            record_event(
                                &self.client,
                                K::COMPONENT,
                                rs,
                                "Warning",
                                "FailedCreate",
                                format!("Error creating: {m}"),
                            )
                            .await;
                            first_err.get_or_insert(m);
                        }
                    }
                }
                remaining -= n;
                if ok < n {
                    // Skip the rest; they are not coming either.
                    self.expectations.lower(key, remaining as i64, 0);
                    break;
                }
                batch *= 2;
            }
            if let Some(e) = first_err {
                return Err(("FailedCreate".into(), e));
            }
        } else if active.len() > desired {
            let diff = (active.len() - desired).min(BURST_REPLICAS);
            if diff < active.len() {
                deletion_order(&mut active, related);
            }
            let victims = &active[..diff];
            self.expectations.expect(key, 0, diff as i64);
            let results = futures::future::join_all(victims.iter().map(|p| {
                let name = p.metadata.name.clone().unwrap_or_default();
                let api = api.clone();
                async move {
                    let r = api
                        .delete(
                            &name,
                            &kube::api::DeleteParams {
                                preconditions: Some(Preconditions {
                                    uid: p.metadata.uid.clone(),
                                    resource_version: None,
                                }),
                                ..Default::default()
                            },
                        )
                        .await;
                    (name, r)
                }
            }))
            .await;
            let mut first_err = None;
            for (name, r) in results {
                match r {
                    Ok(_) => {
                        record_event(
                            &self.client,
                            K::COMPONENT,
                            rs,
                            "Normal",
                            "SuccessfulDelete",
                            format!("Deleted pod: {name}"),
                        )
                        .await;
                    }
                    Err(e) => {
                        self.expectations.lower(key, 0, 1);
                        if is_not_found(&e) {
                            continue;
                        }
                        let m = message(&e);
                        record_event(
                            &self.client,
                            K::COMPONENT,
                            rs,
                            "Warning",
                            "FailedDelete",
                            format!("Error deleting: {m}"),
                        )
                        .await;
                        first_err.get_or_insert(m);
                    }
                }
            }
            if let Some(e) = first_err {
                return Err(("FailedDelete".into(), e));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    #[test]
    fn selectors_match_labels_and_expressions() {
        let sel = LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        };
        let l = |v: &[(&str, &str)]| -> BTreeMap<String, String> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert!(selector_matches(&sel, Some(&l(&[("app", "web")]))));
        assert!(!selector_matches(
            &sel,
            Some(&l(&[("app", "web"), ("tier", "db")]))
        ));
        assert!(!selector_matches(&sel, Some(&l(&[("app", "api")]))));
        assert!(!selector_matches(&sel, None));
        assert!(selector_is_empty(Some(&LabelSelector::default())));
    }

    #[test]
    fn expectations_block_until_observed() {
        let e = Expectations::default();
        assert!(e.satisfied("a/b"));
        e.expect("a/b", 2, 0);
        assert!(!e.satisfied("a/b"));
        e.lower("a/b", 1, 0);
        assert!(!e.satisfied("a/b"));
        e.lower("a/b", 1, 0);
        assert!(e.satisfied("a/b"));
    }
}
