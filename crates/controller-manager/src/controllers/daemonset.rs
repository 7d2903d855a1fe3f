//! daemonset-controller: one pod of a DaemonSet's template on every node that fits it
//! (upstream's pkg/controller/daemon). A node fits when the template's nodeName,
//! nodeSelector and required node affinity match it and its NoSchedule/NoExecute taints
//! are tolerated (with the tolerations every daemon pod gets); a node whose only
//! untolerated taints are NoSchedule keeps the pods it already runs. Pods are created with
//! generateName `<ds>-`, a required node affinity `matchFields metadata.name In [node]`
//! (the scheduler binds them), the labels `controller-revision-hash` and
//! `pod-template-generation`, and a controller ownerReference. Each template is
//! snapshotted in a ControllerRevision `<ds>-<hash>` (what `kubectl rollout history/undo`
//! read); updates roll out with RollingUpdate (maxUnavailable / maxSurge) or OnDelete.
//! Failed daemon pods are deleted and recreated with a per-node exponential backoff.
//!
//! The hash is FNV-32a like upstream's ComputeHash, but of the template's JSON rather than
//! Go's spew dump of it, so revision names differ from upstream's (they are stable).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, PodTemplateSpec, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::deployment::compute_hash;
use super::replicaset::{
    adopt_patch, controller_of, controller_ref, pod_available, pod_ready, record_event,
    release_patch, selector_is_empty, selector_matches, Expectations,
};
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{
    is_already_exists, is_conflict, is_not_found, message, namespace_terminating,
};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers, run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::WorkQueue;

/// The event source component and the queue's name prefix.
const COMPONENT: &str = "daemonset-controller";
/// The ServiceAccount upstream's controller acts as.
const SERVICE_ACCOUNT: &str = "daemon-set-controller";
/// Upstream's BurstReplicas: the most pods created or deleted in one sync.
const BURST_REPLICAS: usize = 250;
/// The label with the ControllerRevision hash of a pod's template.
pub const REVISION_HASH: &str = "controller-revision-hash";
/// The label with the DaemonSet template generation a pod was made from.
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";
/// The DaemonSet annotation holding the template generation (apps/v1).
const TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";
/// The failed-pod backoff (kube-controller-manager: 1 s doubling up to 15 min).
const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

type Res<T> = Result<T, SyncError>;

// ---------------------------------------------------------------------------------------
// Placement: tolerations, node affinity, taints.

/// Adds `t` to the spec's tolerations, replacing one with the same key, operator, value
/// and effect (v1helper.AddOrUpdateTolerationInPodSpec).
fn add_or_update_toleration(spec: &mut PodSpec, t: Toleration) {
    let same = |a: &Toleration| {
        a.key == t.key && a.effect == t.effect && a.operator == t.operator && a.value == t.value
    };
    let list = spec.tolerations.get_or_insert_with(Vec::new);
    match list.iter_mut().find(|a| same(a)) {
        Some(a) => *a = t,
        None => list.push(t),
    }
}

/// Adds the tolerations every daemon pod gets (util.AddOrUpdateDaemonPodTolerations).
pub fn add_daemon_tolerations(spec: &mut PodSpec) {
    let mut wanted = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if spec.host_network == Some(true) {
        wanted.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    for (key, effect) in wanted {
        add_or_update_toleration(
            spec,
            Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                effect: Some(effect.into()),
                ..Default::default()
            },
        );
    }
}

/// Whether `t` tolerates `taint` (Toleration.ToleratesTaint; Lt/Gt are behind a feature
/// gate that is off by default, so they match nothing).
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let eff = t.effect.as_deref().unwrap_or_default();
    if !eff.is_empty() && eff != taint.effect {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

/// Whether some taint with an effect accepted by `effects` is not tolerated.
fn untolerated(taints: &[Taint], tolerations: &[Toleration], effects: &[&str]) -> bool {
    taints
        .iter()
        .filter(|t| effects.contains(&t.effect.as_str()))
        .any(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// Whether a node selector requirement on labels matches (In, NotIn, Exists,
/// DoesNotExist, Gt, Lt).
fn requirement_matches(r: &NodeSelectorRequirement, get: impl Fn(&str) -> Option<String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let got = get(&r.key);
    match r.operator.as_str() {
        "In" => got.is_some_and(|g| values.contains(&g)),
        "NotIn" => got.is_none_or(|g| !values.contains(&g)),
        "Exists" => got.is_some(),
        "DoesNotExist" => got.is_none(),
        "Gt" | "Lt" => {
            let (Some(g), [v]) = (got, values) else {
                return false;
            };
            match (g.parse::<i64>(), v.parse::<i64>()) {
                (Ok(g), Ok(v)) => {
                    if r.operator == "Gt" {
                        g > v
                    } else {
                        g < v
                    }
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// Whether one node selector term matches the node (an empty term matches nothing).
fn term_matches(t: &NodeSelectorTerm, node: &Node) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.clone().unwrap_or_default();
    exprs
        .iter()
        .all(|r| requirement_matches(r, |k| labels.get(k).cloned()))
        && fields.iter().all(|r| {
            // Only metadata.name with In / NotIn is a valid field requirement.
            r.key == "metadata.name"
                && matches!(r.operator.as_str(), "In" | "NotIn")
                && requirement_matches(r, |_| Some(name.clone()))
        })
}

/// The template's nodeSelector and required node affinity match the node
/// (nodeaffinity.RequiredNodeAffinity.Match).
fn fits_node_affinity(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (k, v) in spec.node_selector.iter().flatten() {
        if labels.get(k) != Some(v) {
            return false;
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        None => true,
        Some(sel) => sel
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, node)),
    }
}

/// The tolerations the DaemonSet's pods have (the template's plus the daemon ones).
fn daemon_tolerations(ds: &DaemonSet) -> Vec<Toleration> {
    let mut spec = ds.spec.template.spec.clone().unwrap_or_default();
    add_daemon_tolerations(&mut spec);
    spec.tolerations.unwrap_or_default()
}

/// Whether a daemon pod should run on the node, and whether one already there may keep
/// running (nodeShouldRunDaemonPod).
fn node_should_run(node: &Node, ds: &DaemonSet, tolerations: &[Toleration]) -> (bool, bool) {
    let spec = ds.spec.template.spec.clone().unwrap_or_default();
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != name)
    {
        return (false, false);
    }
    if !fits_node_affinity(&spec, node) {
        return (false, false);
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if untolerated(&taints, tolerations, &["NoSchedule", "NoExecute"]) {
        return (false, !untolerated(&taints, tolerations, &["NoExecute"]));
    }
    (true, true)
}

/// `affinity` with its required node affinity replaced by `metadata.name In [node]`
/// (util.ReplaceDaemonSetPodNodeNameNodeAffinity).
fn node_name_affinity(affinity: Option<Affinity>, node: &str) -> Affinity {
    let term = NodeSelectorTerm {
        match_expressions: None,
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![node.to_owned()]),
        }]),
    };
    let mut a = affinity.unwrap_or_default();
    let na = a.node_affinity.get_or_insert_with(NodeAffinity::default);
    match na
        .required_during_scheduling_ignored_during_execution
        .as_mut()
    {
        Some(sel) => sel.node_selector_terms = vec![term],
        None => {
            na.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
                node_selector_terms: vec![term],
            })
        }
    }
    a
}

/// The node a daemon pod is for: its nodeName, else its `metadata.name In [node]`
/// affinity (util.GetTargetNodeName).
fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    for t in terms {
        for r in t.match_fields.iter().flatten() {
            if r.key == "metadata.name" && r.operator == "In" {
                return match r.values.as_deref() {
                    Some([v]) => Some(v.clone()),
                    _ => None,
                };
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// DaemonSet helpers.

/// The template generation from the DaemonSet's annotation, if any.
fn template_generation(ds: &DaemonSet) -> Option<i64> {
    ds.metadata
        .annotations
        .as_ref()?
        .get(TEMPLATE_GENERATION)?
        .parse()
        .ok()
}

/// Whether the pod runs the current template (util.IsPodUpdated).
fn pod_updated(pod: &Pod, hash: &str, generation: Option<i64>) -> bool {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let gen_matches = generation.is_some_and(|g| {
        labels.get(TEMPLATE_GENERATION_LABEL).map(String::as_str) == Some(g.to_string().as_str())
    });
    let hash_matches =
        !hash.is_empty() && labels.get(REVISION_HASH).map(String::as_str) == Some(hash);
    hash_matches || gen_matches
}

fn is_rolling(ds: &DaemonSet) -> bool {
    ds.spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate")
}

/// An int-or-percent scaled against `total`, rounding up (GetScaledValueFromIntOrPercent).
fn scaled(v: Option<&IntOrString>, total: i32) -> Result<i32, String> {
    match v {
        None => Ok(0),
        Some(IntOrString::Int(n)) => Ok(*n),
        Some(IntOrString::String(s)) => {
            let p: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("invalid value for IntOrString: invalid value {s:?}"))?;
            Ok(((p * i64::from(total)) as f64 / 100.0).ceil() as i32)
        }
    }
}

fn surge_count(ds: &DaemonSet, n: i32) -> Result<i32, String> {
    if !is_rolling(ds) {
        return Ok(0);
    }
    let r = ds
        .spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref());
    scaled(r.and_then(|r| r.max_surge.as_ref()), n)
}

fn unavailable_count(ds: &DaemonSet, n: i32) -> Result<i32, String> {
    if !is_rolling(ds) {
        return Ok(0);
    }
    let r = ds
        .spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref());
    scaled(r.and_then(|r| r.max_unavailable.as_ref()), n)
}

fn allows_surge(ds: &DaemonSet) -> bool {
    surge_count(ds, 1).is_ok_and(|n| n > 0)
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn pod_name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

/// Bound pods first, then oldest, then by name (podByCreationTimestampAndPhase).
fn sort_pods(pods: &mut [Arc<Pod>]) {
    let bound = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
    };
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    pods.sort_by(|a, b| {
        bound(b)
            .cmp(&bound(a))
            .then(created(a).cmp(&created(b)))
            .then(a.metadata.name.cmp(&b.metadata.name))
    });
}

/// The revision data: the template with `$patch: replace` under spec (getPatch).
fn revision_patch(ds: &DaemonSet) -> Value {
    let mut template = serde_json::to_value(&ds.spec.template).unwrap_or_default();
    if let Some(m) = template.as_object_mut() {
        m.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": template}})
}

/// Whether the revision holds the DaemonSet's template (Match).
fn revision_matches(ds: &DaemonSet, rev: &ControllerRevision) -> bool {
    revision_patch(ds) == rev.data.0
}

fn rev_number(r: &ControllerRevision) -> i64 {
    r.revision.unwrap_or(0)
}

fn rev_hash(r: &ControllerRevision) -> Option<&str> {
    r.metadata
        .labels
        .as_ref()?
        .get(REVISION_HASH)
        .map(String::as_str)
}

// ---------------------------------------------------------------------------------------
// The failed-pod backoff (flowcontrol.Backoff, no jitter).

#[derive(Default)]
struct Backoff {
    m: Mutex<HashMap<String, (Duration, Instant)>>,
}

impl Backoff {
    fn expired(now: Instant, last: Instant) -> bool {
        now.duration_since(last) > 2 * BACKOFF_MAX
    }

    /// Whether `key` is still waiting out the delay set by its last [`Self::next`].
    fn in_backoff(&self, key: &str, now: Instant) -> Option<Duration> {
        let m = self.m.lock();
        let (d, last) = m.get(key)?;
        (!Self::expired(now, *last) && now.duration_since(*last) < *d).then_some(*d)
    }

    /// Starts or doubles the delay of `key`.
    fn next(&self, key: &str, now: Instant) {
        let mut m = self.m.lock();
        // Garbage-collect entries long expired (upstream does it every minute).
        m.retain(|_, (_, last)| !Self::expired(now, *last));
        let e = m.entry(key.to_owned()).or_insert((Duration::ZERO, now));
        e.0 = if e.0.is_zero() {
            BACKOFF_INITIAL
        } else {
            (e.0 * 2).min(BACKOFF_MAX)
        };
        e.1 = now;
    }
}

// ---------------------------------------------------------------------------------------
// The controller.

struct Ctl {
    client: ClientSource,
    dss: Arc<Informer<DaemonSet>>,
    revs: Arc<Informer<ControllerRevision>>,
    pods: Arc<Informer<Pod>>,
    nodes: Arc<Informer<Node>>,
    queue: Arc<WorkQueue<String>>,
    expectations: Arc<Expectations>,
    backoff: Backoff,
}

/// The DaemonSet the controller reference points at, if it is in the cache with that uid
/// (resolveControllerRef).
fn resolve(
    dss: &Informer<DaemonSet>,
    ns: Option<&str>,
    r: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) -> Option<String> {
    if r.kind != "DaemonSet" {
        return None;
    }
    let key = format!("{}/{}", ns.unwrap_or_default(), r.name);
    let ds = dss.get(&key)?;
    (ds.metadata.uid.as_deref() == Some(r.uid.as_str())).then_some(key)
}

/// The DaemonSets in the namespace whose (non-empty) selector matches the labels.
fn selecting(
    dss: &Informer<DaemonSet>,
    ns: Option<&str>,
    labels: Option<&BTreeMap<String, String>>,
) -> Vec<String> {
    dss.list()
        .iter()
        .filter(|ds| {
            ds.metadata.namespace.as_deref() == ns
                && !selector_is_empty(Some(&ds.spec.selector))
                && selector_matches(&ds.spec.selector, labels)
        })
        .map(|ds| key_of(ds.as_ref()))
        .collect()
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("daemonset");
    let node_queue = factory.queue::<String>("daemonset-node-updates");
    let dss = factory.informer::<DaemonSet>();
    let revs = factory.informer::<ControllerRevision>();
    let pods = factory.informer::<Pod>();
    let nodes = factory.informer::<Node>();
    let expectations = Arc::new(Expectations::default());

    let (q, ex) = (queue.clone(), expectations.clone());
    dss.add_handler(move |c| match c {
        Change::Added(ds) => q.add(key_of(ds)),
        Change::Updated { old, new } => {
            if old.metadata.uid != new.metadata.uid {
                ex.delete(&key_of(old));
            }
            q.add(key_of(new));
        }
        Change::Deleted(ds) => {
            ex.delete(&key_of(ds));
            q.add(key_of(ds));
        }
    });

    let (q, d) = (queue.clone(), dss.clone());
    revs.add_handler(move |c| {
        let owner = |r: &ControllerRevision| {
            controller_of(&r.metadata)
                .and_then(|cr| resolve(&d, r.metadata.namespace.as_deref(), cr))
        };
        match c {
            Change::Added(r) => {
                if controller_of(&r.metadata).is_some() {
                    if let Some(k) = owner(r) {
                        q.add(k);
                    }
                    return;
                }
                if r.metadata.deletion_timestamp.is_some() {
                    return;
                }
                for k in selecting(
                    &d,
                    r.metadata.namespace.as_deref(),
                    r.metadata.labels.as_ref(),
                ) {
                    q.add(k);
                }
            }
            Change::Updated { old, new } => {
                if old.metadata.resource_version == new.metadata.resource_version {
                    return;
                }
                let (oc, nc) = (controller_of(&old.metadata), controller_of(&new.metadata));
                let changed = oc != nc;
                if changed && oc.is_some() {
                    if let Some(k) = owner(old) {
                        q.add(k);
                    }
                }
                if nc.is_some() {
                    if let Some(k) = owner(new) {
                        q.add(k);
                    }
                    return;
                }
                if changed || old.metadata.labels != new.metadata.labels {
                    for k in selecting(
                        &d,
                        new.metadata.namespace.as_deref(),
                        new.metadata.labels.as_ref(),
                    ) {
                        q.add(k);
                    }
                }
            }
            Change::Deleted(r) => {
                if let Some(k) = owner(r) {
                    q.add(k);
                }
            }
        }
    });

    let (q, ex, d) = (queue.clone(), expectations.clone(), dss.clone());
    pods.add_handler(move |c| {
        let owner = |p: &Pod| {
            controller_of(&p.metadata)
                .and_then(|cr| resolve(&d, p.metadata.namespace.as_deref(), cr))
        };
        let deleted = |p: &Pod| {
            if let Some(k) = owner(p) {
                ex.lower(&k, 0, 1);
                q.add(k);
            }
        };
        match c {
            Change::Added(p) => {
                if p.metadata.deletion_timestamp.is_some() {
                    deleted(p);
                    return;
                }
                if controller_of(&p.metadata).is_some() {
                    if let Some(k) = owner(p) {
                        ex.lower(&k, 1, 0);
                        q.add(k);
                    }
                    return;
                }
                for k in selecting(
                    &d,
                    p.metadata.namespace.as_deref(),
                    p.metadata.labels.as_ref(),
                ) {
                    q.add(k);
                }
            }
            Change::Updated { old, new } => {
                if old.metadata.resource_version == new.metadata.resource_version {
                    return;
                }
                if new.metadata.deletion_timestamp.is_some() {
                    deleted(new);
                    return;
                }
                let (oc, nc) = (controller_of(&old.metadata), controller_of(&new.metadata));
                let changed = oc != nc;
                if changed && oc.is_some() {
                    if let Some(k) = owner(old) {
                        q.add(k);
                    }
                }
                if nc.is_some() {
                    let Some(k) = owner(new) else { return };
                    q.add(k.clone());
                    // A pod that became ready becomes available after minReadySeconds.
                    if !pod_ready(old) && pod_ready(new) {
                        let mrs = d
                            .get(&k)
                            .and_then(|ds| ds.spec.min_ready_seconds)
                            .unwrap_or(0);
                        if mrs > 0 {
                            q.add_after(k, Duration::from_secs(mrs as u64 + 1));
                        }
                    }
                    return;
                }
                if changed || old.metadata.labels != new.metadata.labels {
                    for k in selecting(
                        &d,
                        new.metadata.namespace.as_deref(),
                        new.metadata.labels.as_ref(),
                    ) {
                        q.add(k);
                    }
                }
            }
            Change::Deleted(p) => deleted(p),
        }
    });

    let nq = node_queue.clone();
    nodes.add_handler(move |c| match c {
        Change::Added(n) => nq.add(n.metadata.name.clone().unwrap_or_default()),
        Change::Updated { old, new } => {
            let taints = |n: &Node| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default()
            };
            let labels = |n: &Node| n.metadata.labels.clone().unwrap_or_default();
            if labels(old) != labels(new) || taints(old) != taints(new) {
                nq.add(new.metadata.name.clone().unwrap_or_default());
            }
        }
        // Pods of deleted nodes are the pod garbage collector's.
        Change::Deleted(_) => {}
    });

    tokio::spawn(async move {
        tracing::info!("Starting daemon sets controller");
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            dss,
            revs,
            pods,
            nodes,
            queue: queue.clone(),
            expectations,
            backoff: Backoff::default(),
        });
        let synced = async {
            ctl.pods.wait_synced().await;
            ctl.nodes.wait_synced().await;
            ctl.revs.wait_synced().await;
            ctl.dss.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let mut tasks = run_workers_of(
            "daemonset",
            queue,
            2,
            stop.clone(),
            &ctl,
            |c, key| async move { c.sync(&key).await },
        );
        let c = ctl.clone();
        tasks.extend(run_workers(
            "daemonset-node-updates",
            node_queue,
            2,
            stop,
            move |name| {
                let c = c.clone();
                async move {
                    c.sync_node(&name);
                    Ok(())
                }
            },
        ));
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down daemon sets controller");
    })
}

impl Ctl {
    fn ds_api(&self, ns: &str) -> Api<DaemonSet> {
        Api::namespaced(self.client.get(), ns)
    }

    fn rev_api(&self, ns: &str) -> Api<ControllerRevision> {
        Api::namespaced(self.client.get(), ns)
    }

    fn pod_api(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.get(), ns)
    }

    /// A node changed: queue the DaemonSets whose placement on it may have changed
    /// (syncNodeUpdate).
    fn sync_node(&self, name: &str) {
        let Some(node) = self.nodes.get(name) else {
            return;
        };
        let mut on_node: HashMap<String, usize> = HashMap::new();
        for p in self.pods.list() {
            if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(name) {
                continue;
            }
            if let Some(r) = controller_of(&p.metadata).filter(|r| r.kind == "DaemonSet") {
                let k = format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    r.name
                );
                *on_node.entry(k).or_default() += 1;
            }
        }
        for ds in self.dss.list() {
            let (run, keep) = node_should_run(&node, &ds, &daemon_tolerations(&ds));
            let key = key_of(ds.as_ref());
            let scheduled = on_node.get(&key).is_some_and(|n| *n > 0);
            let misscheduled = ds
                .status
                .as_ref()
                .is_some_and(|s| s.number_misscheduled > 0);
            if (run && !scheduled) || (scheduled && (!keep || misscheduled)) {
                self.queue.add(key);
            }
        }
    }

    async fn sync(&self, key: &str) -> Res<()> {
        let Some(ds) = self.dss.get(key) else {
            self.expectations.delete(key);
            return Ok(());
        };
        let nodes = self.nodes.list();
        if selector_is_empty(Some(&ds.spec.selector)) {
            record_event(
                &self.client,
                COMPONENT,
                ds.as_ref(),
                "Warning",
                "SelectingAll",
                "This daemon set is selecting all pods. A non-empty selector is required.".into(),
            )
            .await;
            return Ok(());
        }
        if ds.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let (cur, old) = self.construct_history(&ds).await?;
        let hash = rev_hash(&cur).unwrap_or_default().to_owned();
        if !self.expectations.satisfied(key) {
            return self.update_status(&ds, &nodes, &hash, false).await;
        }
        let res = self.update_daemon_set(&ds, &nodes, &hash, key, old).await;
        let status = self.update_status(&ds, &nodes, &hash, true).await;
        match (res, status) {
            (Err(e), Err(s)) => {
                tracing::error!(daemonset = key, error = ?s, "Failed to update status");
                Err(e)
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    async fn update_daemon_set(
        &self,
        ds: &Arc<DaemonSet>,
        nodes: &[Arc<Node>],
        hash: &str,
        key: &str,
        old: Vec<ControllerRevision>,
    ) -> Res<()> {
        self.manage(ds, nodes, hash).await?;
        if self.expectations.satisfied(key) && is_rolling(ds) {
            self.rolling_update(ds, nodes, hash).await?;
        }
        self.cleanup_history(ds, old).await.map_err(|e| match e {
            SyncError::Failed(m) => {
                SyncError::Failed(format!("failed to clean up revisions of DaemonSet: {m}"))
            }
            e => e,
        })
    }

    // -- pods ----------------------------------------------------------------------------

    /// The DaemonSet's pods: owned ones that match, plus adopted orphans; owned ones that
    /// stopped matching are released (ClaimPods).
    async fn daemon_pods(&self, ds: &DaemonSet) -> Res<Vec<Arc<Pod>>> {
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let uid = ds.metadata.uid.clone().unwrap_or_default();
        let api = self.pod_api(&ns);
        let mut out = Vec::new();
        let mut adopt_checked = false;
        for p in self.pods.list() {
            if p.metadata.namespace.as_deref() != Some(ns.as_str()) {
                continue;
            }
            let matches = selector_matches(&ds.spec.selector, p.metadata.labels.as_ref());
            match controller_of(&p.metadata) {
                Some(r) if r.uid == uid => {
                    if matches {
                        out.push(p);
                        continue;
                    }
                    if ds.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let patch = release_patch(&p.metadata, &uid);
                    match api
                        .patch(
                            &pod_name(&p),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await
                    {
                        Ok(_) => {}
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Some(_) => {}
                None => {
                    if !matches
                        || p.metadata.deletion_timestamp.is_some()
                        || ds.metadata.deletion_timestamp.is_some()
                    {
                        continue;
                    }
                    if !adopt_checked {
                        self.check_adoptable(ds).await?;
                        adopt_checked = true;
                    }
                    let patch = adopt_patch(&p.metadata, controller_ref(ds));
                    match api
                        .patch(
                            &pod_name(&p),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await
                    {
                        Ok(adopted) => out.push(Arc::new(adopted)),
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(out)
    }

    /// Upstream re-reads the DaemonSet before adopting: it must still be there, with this
    /// uid, and not being deleted.
    async fn check_adoptable(&self, ds: &DaemonSet) -> Res<()> {
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let name = ds.metadata.name.clone().unwrap_or_default();
        let fresh = self.ds_api(&ns).get(&name).await?;
        if fresh.metadata.uid != ds.metadata.uid {
            return Err(SyncError::Failed(format!(
                "original DaemonSet {ns}/{name} is gone: got uid {}, wanted {}",
                fresh.metadata.uid.unwrap_or_default(),
                ds.metadata.uid.clone().unwrap_or_default()
            )));
        }
        if fresh.metadata.deletion_timestamp.is_some() {
            return Err(SyncError::Failed(format!(
                "{ns}/{name} has just been deleted at {:?}",
                fresh.metadata.deletion_timestamp.map(|t| t.0.to_string())
            )));
        }
        Ok(())
    }

    /// The DaemonSet's pods by the node they are for (getNodesToDaemonPods); terminal pods
    /// being deleted are left out unless `include_deleted_terminal`.
    async fn node_to_pods(
        &self,
        ds: &DaemonSet,
        include_deleted_terminal: bool,
    ) -> Res<BTreeMap<String, Vec<Arc<Pod>>>> {
        let mut m: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        for p in self.daemon_pods(ds).await? {
            let terminal = matches!(phase(&p), "Failed" | "Succeeded");
            if !include_deleted_terminal && terminal && p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let Some(node) = target_node(&p) else {
                continue;
            };
            m.entry(node).or_default().push(p);
        }
        Ok(m)
    }

    /// What one node needs: a pod created, or pods deleted (podsShouldBeOnNode).
    async fn pods_should_be_on_node(
        &self,
        node: &Node,
        node_pods: &BTreeMap<String, Vec<Arc<Pod>>>,
        ds: &DaemonSet,
        hash: &str,
        tolerations: &[Toleration],
    ) -> (Vec<String>, Vec<String>) {
        let (mut create, mut delete) = (Vec::new(), Vec::new());
        let node_name = node.metadata.name.clone().unwrap_or_default();
        let (run, keep) = node_should_run(node, ds, tolerations);
        let pods = node_pods.get(&node_name);
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        if run && pods.is_none() {
            create.push(node_name);
        } else if keep {
            let mut running = Vec::new();
            for p in pods.into_iter().flatten() {
                if p.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                match phase(p) {
                    "Failed" => {
                        let bkey = format!(
                            "{}/{}/{}",
                            ds.metadata.uid.as_deref().unwrap_or_default(),
                            ds.status
                                .as_ref()
                                .and_then(|s| s.observed_generation)
                                .unwrap_or(0),
                            node_name
                        );
                        let now = Instant::now();
                        if let Some(delay) = self.backoff.in_backoff(&bkey, now) {
                            self.queue.add_after(key_of(ds), delay);
                            continue;
                        }
                        self.backoff.next(&bkey, now);
                        record_event(
                            &self.client,
                            COMPONENT,
                            ds,
                            "Warning",
                            "FailedDaemonPod",
                            format!(
                                "Found failed daemon pod {ns}/{} on node {node_name}, will try to kill it",
                                pod_name(p)
                            ),
                        )
                        .await;
                        delete.push(pod_name(p));
                    }
                    "Succeeded" => {
                        record_event(
                            &self.client,
                            COMPONENT,
                            ds,
                            "Normal",
                            "SucceededDaemonPod",
                            format!(
                                "Found succeeded daemon pod {ns}/{} on node {node_name}, will try to delete it",
                                pod_name(p)
                            ),
                        )
                        .await;
                        delete.push(pod_name(p));
                    }
                    _ => running.push(p.clone()),
                }
            }
            sort_pods(&mut running);
            if !allows_surge(ds) {
                // Only the oldest pod stays.
                delete.extend(running.iter().skip(1).map(|p| pod_name(p)));
            } else if running.is_empty() {
                if run {
                    create.push(node_name);
                }
            } else if running.len() > 1 {
                // Surge: keep the oldest new and the oldest old pod; the old one goes once
                // the new one is available (or if it is not ready anyway).
                let (mut newest, mut oldest): (Option<&Arc<Pod>>, Option<&Arc<Pod>>) = (None, None);
                for p in &running {
                    let h = p
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(REVISION_HASH));
                    if h.map(String::as_str).unwrap_or_default() == hash {
                        if newest.is_none() {
                            newest = Some(p);
                            continue;
                        }
                    } else if oldest.is_none() {
                        oldest = Some(p);
                        continue;
                    }
                    delete.push(pod_name(p));
                }
                if let (Some(n), Some(o)) = (newest, oldest) {
                    let mrs = ds.spec.min_ready_seconds.unwrap_or(0);
                    if !pod_ready(o) || pod_available(n, mrs, Timestamp::now()) {
                        delete.push(pod_name(o));
                    }
                }
            }
        } else if pods.is_some() {
            for p in pods.into_iter().flatten() {
                if p.metadata.deletion_timestamp.is_none() {
                    delete.push(pod_name(p));
                }
            }
        }
        (create, delete)
    }

    /// Creates the missing daemon pods and deletes those that should not run (manage).
    async fn manage(&self, ds: &Arc<DaemonSet>, nodes: &[Arc<Node>], hash: &str) -> Res<()> {
        let node_pods = self.node_to_pods(ds, false).await.map_err(|e| match e {
            SyncError::Failed(m) => SyncError::Failed(format!(
                "couldn't get node to daemon pod mapping for daemon set {:?}: {m}",
                ds.metadata.name.as_deref().unwrap_or_default()
            )),
            e => e,
        })?;
        let tolerations = daemon_tolerations(ds);
        let (mut create, mut delete) = (Vec::new(), Vec::new());
        for n in nodes {
            let (c, d) = self
                .pods_should_be_on_node(n, &node_pods, ds, hash, &tolerations)
                .await;
            create.extend(c);
            delete.extend(d);
        }
        // Pods for nodes that do not exist and never got bound.
        let names: BTreeSet<String> = nodes
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        for (n, pods) in &node_pods {
            if names.contains(n) {
                continue;
            }
            for p in pods {
                let bound = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_some_and(|n| !n.is_empty());
                if !bound {
                    delete.push(pod_name(p));
                }
            }
        }
        self.sync_nodes(ds, delete, create, hash).await
    }

    /// Creates pods for `create` (nodes) in slow-start batches and deletes `delete` (pod
    /// names), with expectations (syncNodes).
    async fn sync_nodes(
        &self,
        ds: &Arc<DaemonSet>,
        delete: Vec<String>,
        create: Vec<String>,
        hash: &str,
    ) -> Res<()> {
        let key = key_of(ds.as_ref());
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let api = self.pod_api(&ns);
        let create_n = create.len().min(BURST_REPLICAS);
        let delete_n = delete.len().min(BURST_REPLICAS);
        self.expectations
            .expect(&key, create_n as i64, delete_n as i64);
        let mut errors: Vec<String> = Vec::new();

        let template = pod_template(ds, template_generation(ds), hash);
        let mut pos = 0usize;
        let mut batch = create_n.min(1);
        while pos < create_n {
            let results = futures::future::join_all((pos..pos + batch).map(|i| {
                let pod = new_pod(ds, &template, &create[i]);
                let api = api.clone();
                async move { api.create(&PostParams::default(), &pod).await }
            }))
            .await;
            let before = errors.len();
            for r in results {
                match r {
                    Ok(p) => {
                        record_event(
                            &self.client,
                            COMPONENT,
                            ds.as_ref(),
                            "Normal",
                            "SuccessfulCreate",
                            format!("Created pod: {}", pod_name(&p)),
                        )
                        .await;
                    }
                    Err(e) => {
                        if namespace_terminating(&e) {
                            // Upstream neither counts nor reports these: the namespace is
                            // going away with the DaemonSet.
                            continue;
                        }
                        self.expectations.lower(&key, 1, 0);
                        let m = message(&e);
                        record_event(
                            &self.client,
                            COMPONENT,
                            ds.as_ref(),
                            "Warning",
                            "FailedCreate",
                            format!("Error creating: {m}"),
                        )
                        .await;
                        errors.push(m);
                    }
                }
            }
            let next_pos = pos + batch;
            let skipped = create_n - next_pos;
            if errors.len() > before && skipped > 0 {
                // The rest would fail the same way: skip them.
                self.expectations.lower(&key, skipped as i64, 0);
                break;
            }
            batch = (2 * batch).min(skipped);
            pos = next_pos;
        }

        let results = futures::future::join_all(delete.iter().take(delete_n).map(|name| {
            let api = api.clone();
            async move {
                (
                    name.clone(),
                    api.delete(name, &DeleteParams::default()).await,
                )
            }
        }))
        .await;
        for (name, r) in results {
            match r {
                Ok(_) => {
                    record_event(
                        &self.client,
                        COMPONENT,
                        ds.as_ref(),
                        "Normal",
                        "SuccessfulDelete",
                        format!("Deleted pod: {name}"),
                    )
                    .await;
                }
                Err(e) => {
                    self.expectations.lower(&key, 0, 1);
                    if is_not_found(&e) {
                        continue;
                    }
                    let m = message(&e);
                    record_event(
                        &self.client,
                        COMPONENT,
                        ds.as_ref(),
                        "Warning",
                        "FailedDelete",
                        format!("Error deleting: {m}"),
                    )
                    .await;
                    errors.push(format!("unable to delete pods: {m}"));
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SyncError::Failed(errors.join(", ")))
        }
    }

    // -- rolling update ------------------------------------------------------------------

    /// Replaces old pods within maxUnavailable, or surges new ones within maxSurge
    /// (rollingUpdate).
    async fn rolling_update(
        &self,
        ds: &Arc<DaemonSet>,
        nodes: &[Arc<Node>],
        hash: &str,
    ) -> Res<()> {
        let mut node_pods = self.node_to_pods(ds, false).await?;
        let tolerations = daemon_tolerations(ds);
        let mut desired = 0;
        for n in nodes {
            if node_should_run(n, ds, &tolerations).0 {
                desired += 1;
                node_pods
                    .entry(n.metadata.name.clone().unwrap_or_default())
                    .or_default();
            }
        }
        let max_unavailable = unavailable_count(ds, desired).map_err(|e| {
            SyncError::Failed(format!(
                "couldn't get unavailable numbers: invalid value for MaxUnavailable: {e}"
            ))
        })?;
        let max_surge = surge_count(ds, desired).map_err(|e| {
            SyncError::Failed(format!(
                "couldn't get unavailable numbers: invalid value for MaxSurge: {e}"
            ))
        })?;
        let max_unavailable = if desired > 0 && max_unavailable == 0 && max_surge == 0 {
            1
        } else {
            max_unavailable
        };
        let now = Timestamp::now();
        let mrs = ds.spec.min_ready_seconds.unwrap_or(0);
        let generation = template_generation(ds);
        let available = |p: &Pod| pod_available(p, mrs, now);

        if max_surge == 0 {
            let mut unavailable = 0;
            let mut allowed: Vec<String> = Vec::new();
            let mut candidates: Vec<String> = Vec::new();
            for pods in node_pods.values() {
                let Some((new, old)) = updated_pods_on_node(pods, hash, generation) else {
                    unavailable += 1;
                    continue;
                };
                match (new, old) {
                    (None, None) | (Some(_), Some(_)) => unavailable += 1,
                    (Some(n), None) => {
                        if !available(n) {
                            unavailable += 1;
                        }
                    }
                    (None, Some(o)) => {
                        if !available(o) {
                            allowed.push(pod_name(o));
                            unavailable += 1;
                        } else if unavailable < max_unavailable {
                            candidates.push(pod_name(o));
                        }
                    }
                }
            }
            let remaining = (max_unavailable - unavailable).max(0) as usize;
            let remaining = remaining.min(candidates.len());
            allowed.extend(candidates.into_iter().take(remaining));
            return self.sync_nodes(ds, allowed, Vec::new(), hash).await;
        }

        let mut old_to_delete: Vec<String> = Vec::new();
        let mut should_not_run: Vec<String> = Vec::new();
        let mut candidate_nodes: Vec<String> = Vec::new();
        let mut allowed_nodes: Vec<String> = Vec::new();
        let (mut surge, mut n_available) = (0, 0);
        for (node_name, pods) in &node_pods {
            let Some((new, old)) = updated_pods_on_node(pods, hash, generation) else {
                surge += 1;
                continue;
            };
            if let Some(o) = old {
                if available(o) {
                    n_available += 1;
                }
            } else if let Some(n) = new {
                if available(n) {
                    n_available += 1;
                }
            }
            match (new, old) {
                (_, None) => {}
                (None, Some(o)) => {
                    let runs = match self.nodes.get(node_name) {
                        Some(node) => node_should_run(&node, ds, &tolerations).0,
                        None => {
                            return Err(SyncError::Failed(format!(
                                "couldn't get node for nodeName {node_name:?}: node {node_name:?} not found"
                            )))
                        }
                    };
                    if !available(o) {
                        if !runs {
                            old_to_delete.push(pod_name(o));
                            continue;
                        }
                        allowed_nodes.push(node_name.clone());
                    } else {
                        if !runs {
                            should_not_run.push(pod_name(o));
                            continue;
                        }
                        if surge >= max_surge {
                            continue;
                        }
                        candidate_nodes.push(node_name.clone());
                    }
                }
                (Some(n), Some(o)) => {
                    if !available(n) {
                        surge += 1;
                        continue;
                    }
                    old_to_delete.push(pod_name(o));
                }
            }
        }
        let deletable = n_available - desired;
        if deletable > 0 {
            let n = (deletable as usize).min(should_not_run.len());
            old_to_delete.extend(should_not_run.into_iter().take(n));
        }
        let remaining = ((max_surge - surge).max(0) as usize).min(candidate_nodes.len());
        allowed_nodes.extend(candidate_nodes.into_iter().take(remaining));
        self.sync_nodes(ds, old_to_delete, allowed_nodes, hash)
            .await
    }

    // -- status --------------------------------------------------------------------------

    /// Computes and stores the status counters (updateDaemonSetStatus).
    async fn update_status(
        &self,
        ds: &Arc<DaemonSet>,
        nodes: &[Arc<Node>],
        hash: &str,
        update_observed_gen: bool,
    ) -> Res<()> {
        let node_pods = self.node_to_pods(ds, false).await?;
        let tolerations = daemon_tolerations(ds);
        let now = Timestamp::now();
        let mrs = ds.spec.min_ready_seconds.unwrap_or(0);
        let generation = template_generation(ds);
        let (mut desired, mut current, mut mis, mut ready, mut updated, mut available) =
            (0, 0, 0, 0, 0, 0);
        for n in nodes {
            let (run, _) = node_should_run(n, ds, &tolerations);
            let name = n.metadata.name.clone().unwrap_or_default();
            let pods = node_pods.get(&name).filter(|p| !p.is_empty());
            if run {
                desired += 1;
                let Some(pods) = pods else { continue };
                current += 1;
                let mut pods = pods.clone();
                sort_pods(&mut pods);
                let p = &pods[0];
                if pod_ready(p) {
                    ready += 1;
                    if pod_available(p, mrs, now) {
                        available += 1;
                    }
                }
                if pod_updated(p, hash, generation) {
                    updated += 1;
                }
            } else if pods.is_some() {
                mis += 1;
            }
        }
        let unavailable = desired - available;
        let gen = ds.metadata.generation.unwrap_or(0);
        let st = ds.status.clone().unwrap_or_default();
        let same = st.desired_number_scheduled == desired
            && st.current_number_scheduled == current
            && st.number_misscheduled == mis
            && st.number_ready == ready
            && st.updated_number_scheduled.unwrap_or(0) == updated
            && st.number_available.unwrap_or(0) == available
            && st.number_unavailable.unwrap_or(0) == unavailable
            && st.observed_generation.unwrap_or(0) >= gen;
        if !same {
            let set = |s: &mut DaemonSetStatus| {
                if update_observed_gen {
                    s.observed_generation = Some(gen).filter(|g| *g != 0);
                }
                s.desired_number_scheduled = desired;
                s.current_number_scheduled = current;
                s.number_misscheduled = mis;
                s.number_ready = ready;
                // omitempty upstream: zero is left out.
                s.updated_number_scheduled = Some(updated).filter(|n| *n != 0);
                s.number_available = Some(available).filter(|n| *n != 0);
                s.number_unavailable = Some(unavailable).filter(|n| *n != 0);
            };
            let ns = ds.metadata.namespace.clone().unwrap_or_default();
            let name = ds.metadata.name.clone().unwrap_or_default();
            let api = self.ds_api(&ns);
            let mut obj = (**ds).clone();
            // One retry on a fresh copy after a conflict (StatusUpdateRetries).
            for attempt in 0..2 {
                let mut s = obj.status.clone().unwrap_or_default();
                set(&mut s);
                obj.status = Some(s);
                match api
                    .replace_status(&name, &PostParams::default(), &obj)
                    .await
                {
                    Ok(_) => break,
                    Err(e) if is_not_found(&e) => return Ok(()),
                    Err(e) if attempt == 0 && is_conflict(&e) => {
                        obj = api.get(&name).await?;
                    }
                    Err(e) => {
                        return Err(SyncError::Failed(format!(
                            "error storing status for daemon set {ns}/{name}: {}",
                            message(&e)
                        )))
                    }
                }
            }
        }
        if mrs > 0 && ready != available {
            self.queue
                .add_after(key_of(ds.as_ref()), Duration::from_secs(mrs as u64));
        }
        Ok(())
    }

    // -- history -------------------------------------------------------------------------

    /// The ControllerRevisions the DaemonSet controls, adopting and releasing like pods
    /// (controlledHistories).
    async fn controlled_histories(&self, ds: &DaemonSet) -> Res<Vec<ControllerRevision>> {
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let uid = ds.metadata.uid.clone().unwrap_or_default();
        let api = self.rev_api(&ns);
        let mut out = Vec::new();
        let mut adopt_checked = false;
        for r in self.revs.list() {
            if r.metadata.namespace.as_deref() != Some(ns.as_str()) {
                continue;
            }
            let name = r.metadata.name.clone().unwrap_or_default();
            let matches = selector_matches(&ds.spec.selector, r.metadata.labels.as_ref());
            match controller_of(&r.metadata) {
                Some(c) if c.uid == uid => {
                    if matches {
                        out.push((*r).clone());
                    } else if ds.metadata.deletion_timestamp.is_none() {
                        let patch = release_patch(&r.metadata, &uid);
                        match api
                            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                        {
                            Ok(_) => {}
                            Err(e) if is_not_found(&e) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                Some(_) => {}
                None => {
                    if !matches
                        || r.metadata.deletion_timestamp.is_some()
                        || ds.metadata.deletion_timestamp.is_some()
                    {
                        continue;
                    }
                    if !adopt_checked {
                        self.check_adoptable(ds).await?;
                        adopt_checked = true;
                    }
                    let patch = adopt_patch(&r.metadata, controller_ref(ds));
                    match api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(adopted) => out.push(adopted),
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(out)
    }

    /// The current revision (made if missing, renumbered to the newest) and the old ones
    /// (constructHistory).
    async fn construct_history(
        &self,
        ds: &Arc<DaemonSet>,
    ) -> Res<(ControllerRevision, Vec<ControllerRevision>)> {
        let wrap = |e: SyncError| match e {
            SyncError::Failed(m) => {
                SyncError::Failed(format!("failed to construct revisions of DaemonSet: {m}"))
            }
            e => e,
        };
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let api = self.rev_api(&ns);
        let mut current = Vec::new();
        let mut old = Vec::new();
        for mut h in self.controlled_histories(ds).await.map_err(wrap)? {
            if rev_hash(&h).is_none() {
                let name = h.metadata.name.clone().unwrap_or_default();
                h.metadata
                    .labels
                    .get_or_insert_with(BTreeMap::new)
                    .insert(REVISION_HASH.into(), name.clone());
                h = api
                    .replace(&name, &PostParams::default(), &h)
                    .await
                    .map_err(|e| wrap(e.into()))?;
            }
            if revision_matches(ds, &h) {
                current.push(h);
            } else {
                old.push(h);
            }
        }
        let next = old.iter().map(rev_number).max().unwrap_or(0) + 1;
        let cur = if current.is_empty() {
            self.snapshot(ds, next).await.map_err(wrap)?
        } else {
            let mut cur = self.dedup(ds, current).await.map_err(wrap)?;
            if rev_number(&cur) < next {
                cur.revision = Some(next);
                let name = cur.metadata.name.clone().unwrap_or_default();
                cur = api
                    .replace(&name, &PostParams::default(), &cur)
                    .await
                    .map_err(|e| wrap(e.into()))?;
            }
            cur
        };
        Ok((cur, old))
    }

    /// Keeps the newest of several revisions holding the current template, relabels pods
    /// of the others to it and deletes the others (dedupCurHistories).
    async fn dedup(
        &self,
        ds: &DaemonSet,
        mut current: Vec<ControllerRevision>,
    ) -> Res<ControllerRevision> {
        if current.len() == 1 {
            return Ok(current.remove(0));
        }
        let mut keep = 0;
        for (i, c) in current.iter().enumerate() {
            if rev_number(c) >= rev_number(&current[keep]) {
                keep = i;
            }
        }
        let keep = current.remove(keep);
        let hash = rev_hash(&keep).unwrap_or_default().to_owned();
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let pods = self.pod_api(&ns);
        for p in self.daemon_pods(ds).await? {
            let ph = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(REVISION_HASH));
            if ph.map(String::as_str) != Some(hash.as_str()) {
                let patch = json!({"metadata": {"labels": {REVISION_HASH: hash}}});
                pods.patch(
                    &pod_name(&p),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
            }
        }
        let api = self.rev_api(&ns);
        for c in current {
            let name = c.metadata.name.clone().unwrap_or_default();
            api.delete(&name, &DeleteParams::default()).await?;
        }
        Ok(keep)
    }

    /// Records the current template as revision `revision` (snapshot); a name taken by a
    /// different template raises collisionCount.
    async fn snapshot(&self, ds: &DaemonSet, revision: i64) -> Res<ControllerRevision> {
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let ds_name = ds.metadata.name.clone().unwrap_or_default();
        let collision = ds.status.as_ref().and_then(|s| s.collision_count);
        let hash = compute_hash(&ds.spec.template, collision);
        let name = format!("{ds_name}-{hash}");
        let mut labels = ds
            .spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert(REVISION_HASH.into(), hash);
        let rev = ControllerRevision {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                labels: Some(labels),
                annotations: ds.metadata.annotations.clone(),
                owner_references: Some(vec![controller_ref(ds)]),
                ..Default::default()
            },
            data: RawExtension(revision_patch(ds)),
            revision: Some(revision),
        };
        let api = self.rev_api(&ns);
        match api.create(&PostParams::default(), &rev).await {
            Ok(r) => Ok(r),
            Err(e) if is_already_exists(&e) => {
                let existing = api.get(&name).await?;
                if revision_matches(ds, &existing) {
                    return Ok(existing);
                }
                // A hash collision: count it so the next name differs.
                let dapi = self.ds_api(&ns);
                let mut fresh = dapi.get(&ds_name).await?;
                let fresh_count = fresh.status.as_ref().and_then(|s| s.collision_count);
                if fresh_count != collision {
                    return Err(SyncError::Failed(format!(
                        "found a stale collision count ({}, expected {}) of DaemonSet {ds_name:?} while processing; will retry until it is updated",
                        collision.unwrap_or(0),
                        fresh_count.unwrap_or(0)
                    )));
                }
                let st = fresh.status.get_or_insert_with(Default::default);
                st.collision_count = Some(fresh_count.unwrap_or(0) + 1);
                dapi.replace_status(&ds_name, &PostParams::default(), &fresh)
                    .await?;
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the oldest revisions beyond revisionHistoryLimit that no pod runs
    /// (cleanupHistory).
    async fn cleanup_history(&self, ds: &DaemonSet, mut old: Vec<ControllerRevision>) -> Res<()> {
        let keep = ds.spec.revision_history_limit.unwrap_or(10).max(0) as usize;
        if old.len() <= keep {
            return Ok(());
        }
        let mut to_kill = old.len() - keep;
        let node_pods = self.node_to_pods(ds, true).await?;
        let live: BTreeSet<String> = node_pods
            .values()
            .flatten()
            .filter_map(|p| p.metadata.labels.as_ref()?.get(REVISION_HASH).cloned())
            .filter(|h| !h.is_empty())
            .collect();
        old.sort_by_key(rev_number);
        let api = self.rev_api(ds.metadata.namespace.as_deref().unwrap_or_default());
        for h in old {
            if to_kill == 0 {
                break;
            }
            if rev_hash(&h).is_some_and(|x| live.contains(x)) {
                continue;
            }
            let name = h.metadata.name.clone().unwrap_or_default();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
            to_kill -= 1;
        }
        Ok(())
    }
}

/// A node's updated pod and old pod.
type NewAndOld<'a> = (Option<&'a Arc<Pod>>, Option<&'a Arc<Pod>>);

/// The updated and the old pod on a node; None when there is more than one of either
/// (findUpdatedPodsOnNode).
fn updated_pods_on_node<'a>(
    pods: &'a [Arc<Pod>],
    hash: &str,
    generation: Option<i64>,
) -> Option<NewAndOld<'a>> {
    let (mut new, mut old) = (None, None);
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if pod_updated(p, hash, generation) {
            if new.is_some() {
                return None;
            }
            new = Some(p);
        } else {
            if old.is_some() {
                return None;
            }
            old = Some(p);
        }
    }
    Some((new, old))
}

/// The template daemon pods are made from: the tolerations added and the generation and
/// hash labels set (util.CreatePodTemplate).
fn pod_template(ds: &DaemonSet, generation: Option<i64>, hash: &str) -> PodTemplateSpec {
    let mut t = ds.spec.template.clone();
    add_daemon_tolerations(t.spec.get_or_insert_with(Default::default));
    let labels = t
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(BTreeMap::new);
    if let Some(g) = generation {
        labels.insert(TEMPLATE_GENERATION_LABEL.into(), g.to_string());
    }
    if !hash.is_empty() {
        labels.insert(REVISION_HASH.into(), hash.to_owned());
    }
    t
}

/// The pod for `node` (controller.GetPodFromTemplate with the node-name affinity).
fn new_pod(ds: &DaemonSet, template: &PodTemplateSpec, node: &str) -> Pod {
    let tm = template.metadata.clone().unwrap_or_default();
    let mut spec = template.spec.clone().unwrap_or_default();
    spec.affinity = Some(node_name_affinity(spec.affinity.take(), node));
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!(
                "{}-",
                ds.metadata.name.as_deref().unwrap_or_default()
            )),
            namespace: ds.metadata.namespace.clone(),
            labels: tm.labels,
            annotations: tm.annotations,
            finalizers: tm.finalizers,
            owner_references: Some(vec![controller_ref(ds)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(name: &str, labels: &[(&str, &str)], taints: Vec<Taint>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: None,
        }
    }

    fn ds(spec: PodSpec) -> DaemonSet {
        let mut d = DaemonSet::default();
        d.spec.template.spec = Some(spec);
        d
    }

    #[test]
    fn taints_decide_run_and_keep() {
        let d = ds(PodSpec::default());
        let tol = daemon_tolerations(&d);
        assert_eq!(tol.len(), 6);
        let plain = node("a", &[], vec![]);
        assert_eq!(node_should_run(&plain, &d, &tol), (true, true));
        // NoSchedule: no new pod, the running one stays.
        let ns = node("b", &[], vec![taint("x", "NoSchedule")]);
        assert_eq!(node_should_run(&ns, &d, &tol), (false, true));
        // NoExecute: neither.
        let ne = node("c", &[], vec![taint("x", "NoExecute")]);
        assert_eq!(node_should_run(&ne, &d, &tol), (false, false));
        // The daemon tolerations cover unschedulable and not-ready NoExecute.
        let un = node(
            "d",
            &[],
            vec![
                taint("node.kubernetes.io/unschedulable", "NoSchedule"),
                taint("node.kubernetes.io/not-ready", "NoExecute"),
            ],
        );
        assert_eq!(node_should_run(&un, &d, &tol), (true, true));
        // PreferNoSchedule never blocks.
        let p = node("e", &[], vec![taint("x", "PreferNoSchedule")]);
        assert_eq!(node_should_run(&p, &d, &tol), (true, true));
    }

    #[test]
    fn host_network_adds_the_network_toleration() {
        let mut spec = PodSpec {
            host_network: Some(true),
            tolerations: Some(vec![Toleration {
                key: Some("node.kubernetes.io/not-ready".into()),
                operator: Some("Exists".into()),
                effect: Some("NoExecute".into()),
                toleration_seconds: Some(30),
                value: None,
            }]),
            ..Default::default()
        };
        add_daemon_tolerations(&mut spec);
        let t = spec.tolerations.unwrap();
        assert_eq!(t.len(), 7);
        // The existing not-ready toleration is replaced (no tolerationSeconds).
        assert_eq!(t[0].toleration_seconds, None);
        assert!(t
            .iter()
            .any(|t| t.key.as_deref() == Some("node.kubernetes.io/network-unavailable")));
    }

    #[test]
    fn node_selector_and_affinity() {
        let mut spec = PodSpec {
            node_selector: Some([("disk".to_string(), "ssd".to_string())].into()),
            ..Default::default()
        };
        let d = ds(spec.clone());
        let tol = daemon_tolerations(&d);
        assert!(node_should_run(&node("a", &[("disk", "ssd")], vec![]), &d, &tol).0);
        assert!(!node_should_run(&node("a", &[("disk", "hdd")], vec![]), &d, &tol).0);
        spec.node_selector = None;
        spec.affinity = Some(node_name_affinity(None, "b"));
        let d = ds(spec);
        assert!(!node_should_run(&node("a", &[], vec![]), &d, &tol).0);
        assert!(node_should_run(&node("b", &[], vec![]), &d, &tol).0);
    }

    #[test]
    fn affinity_is_replaced_and_read_back() {
        let user = Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "zone".into(),
                            operator: "In".into(),
                            values: Some(vec!["a".into()]),
                        }]),
                        match_fields: None,
                    }],
                }),
                preferred_during_scheduling_ignored_during_execution: None,
            }),
            ..Default::default()
        };
        let a = node_name_affinity(Some(user), "n1");
        let terms = &a
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        assert!(terms[0].match_expressions.is_none());
        let pod = Pod {
            spec: Some(PodSpec {
                affinity: Some(a),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(target_node(&pod).as_deref(), Some("n1"));
    }

    #[test]
    fn percentages_round_up() {
        assert_eq!(scaled(Some(&IntOrString::String("10%".into())), 3), Ok(1));
        assert_eq!(scaled(Some(&IntOrString::String("50%".into())), 3), Ok(2));
        assert_eq!(scaled(Some(&IntOrString::Int(2)), 3), Ok(2));
        assert!(scaled(Some(&IntOrString::String("x".into())), 3).is_err());
    }

    #[test]
    fn backoff_doubles() {
        let b = Backoff::default();
        let t = Instant::now();
        assert!(b.in_backoff("k", t).is_none());
        b.next("k", t);
        assert_eq!(b.in_backoff("k", t), Some(Duration::from_secs(1)));
        assert!(b.in_backoff("k", t + Duration::from_secs(2)).is_none());
        b.next("k", t);
        assert_eq!(b.in_backoff("k", t), Some(Duration::from_secs(2)));
    }
}
