//! One scheduling cycle (upstream's `schedule_one.go`): PreFilter, Filter over the
//! nodes (as many as percentageOfNodesToScore asks for), Score, pick a node, assume the
//! pod, and bind it asynchronously; or, when no node fits, DefaultPreemption (evict
//! lower-priority victims and nominate their node, or explain why it cannot help), the
//! FailedScheduling event with upstream's message and the PodScheduled condition.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use kumo_client::informer::Informer;
use parking_lot::Mutex;
use serde_json::json;

use crate::cache::{Cache, NodeInfo, PodInfo, Snapshot};
use crate::helpers::pod_key;
use crate::plugins::{self, Code, Status};
use crate::queue::{QueuedPod, SchedulingQueue};
use kumo_client::events_v1::Recorder;

/// The scheduler's name in events and the pods it is responsible for.
pub const SCHEDULER_NAME: &str = "default-scheduler";

/// How many feasible nodes to look for among `n` (percentageOfNodesToScore's adaptive
/// default: 50 % minus 1 % per 125 nodes, at least 5 %, and at least 100 nodes).
pub fn num_feasible_nodes_to_find(n: usize) -> usize {
    if n < 100 {
        return n;
    }
    let pct = 50usize.saturating_sub(n / 125).max(5);
    (n * pct / 100).max(100)
}

/// upstream's FitError message: "0/N nodes are available: <histogram>." plus the
/// PostFilter (preemption) message.
pub fn fit_error_message(
    num_all: usize,
    statuses: &[(String, Status)],
    post: Option<&str>,
) -> String {
    let mut msg = format!("0/{num_all} nodes are available:");
    let mut hist: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, s) in statuses {
        for r in &s.reasons {
            *hist.entry(r.as_str()).or_default() += 1;
        }
    }
    let mut parts: Vec<String> = hist.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    if !parts.is_empty() {
        msg.push_str(&format!(" {}.", parts.join(", ")));
    }
    if let Some(p) = post.filter(|p| !p.is_empty()) {
        // Appended as is: upstream's PostFilter messages carry their own punctuation.
        msg.push(' ');
        msg.push_str(p);
    }
    msg
}

/// Shared state of a running scheduler.
pub struct Sched {
    pub(crate) client: Client,
    pub(crate) cache: Mutex<Cache>,
    pub(crate) queue: SchedulingQueue,
    pub(crate) pods: Arc<Informer<Pod>>,
    pub(crate) namespaces: Arc<Informer<Namespace>>,
    pub(crate) recorder: Recorder,
    /// What VolumeBinding reads.
    pub(crate) volumes: crate::volumes::Informers,
    next_start: AtomicUsize,
    rng: AtomicU64,
}

impl Sched {
    pub(crate) fn new(
        client: Client,
        pods: Arc<Informer<Pod>>,
        namespaces: Arc<Informer<Namespace>>,
        recorder: Recorder,
        volumes: crate::volumes::Informers,
    ) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        Sched {
            client,
            cache: Mutex::new(Cache::default()),
            queue: SchedulingQueue::default(),
            pods,
            namespaces,
            recorder,
            volumes,
            next_start: AtomicUsize::new(0),
            rng: AtomicU64::new(seed),
        }
    }

    fn random(&self) -> u64 {
        // xorshift; only breaks ties between equally scored nodes.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }

    fn ns_labels(&self, ns: &str) -> BTreeMap<String, String> {
        self.namespaces
            .get(ns)
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default()
    }
}

/// Whether this scheduler schedules the pod: unassigned, ours, alive and not gated.
pub fn responsible(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    spec.node_name.as_deref().unwrap_or_default().is_empty()
        && spec.scheduler_name.as_deref().unwrap_or(SCHEDULER_NAME) == SCHEDULER_NAME
        && pod.metadata.deletion_timestamp.is_none()
        && !matches!(phase, Some("Succeeded") | Some("Failed"))
        && spec.scheduling_gates.as_ref().is_none_or(|g| g.is_empty())
}

enum Outcome {
    Fit(String),
    NoFit {
        statuses: Vec<(String, Status)>,
        num_all: usize,
        state: Box<plugins::CycleState>,
        snap: Snapshot,
    },
}

fn find_node(s: &Sched, pod: Arc<Pod>) -> Option<Outcome> {
    let snap = s.cache.lock().snapshot();
    if snap.nodes.is_empty() {
        return None;
    }
    let nsl = |ns: &str| s.ns_labels(ns);
    let info = Arc::new(PodInfo::new(pod));
    let state = plugins::pre_filter(info, &snap, &nsl);
    let vols = crate::volumes::pre_filter(&s.volumes, &state.pod.pod);
    let n = snap.nodes.len();
    let want = num_feasible_nodes_to_find(n);
    let start = s.next_start.load(Ordering::Relaxed) % n;
    let mut feasible: Vec<Arc<NodeInfo>> = Vec::new();
    let mut statuses = Vec::new();
    let mut processed = 0;
    // Pods that preemption nominated, of at least this pod's priority, count on their node
    // (upstream's RunFilterPluginsWithNominatedPods): a victim's room is not taken by a
    // less important pod. As upstream, such a node must pass with and without them.
    let own_key = pod_key(&state.pod.pod);
    let own_priority = crate::helpers::priority(&state.pod.pod);
    let nominated = s.queue.nominated_pods();
    for i in 0..n {
        let node = &snap.nodes[(start + i) % n];
        processed += 1;
        let with_nominated = nominated.get(node.name()).and_then(|pods| {
            let mut added = (**node).clone();
            let mut any = false;
            for p in pods {
                if pod_key(p) != own_key && crate::helpers::priority(p) >= own_priority {
                    added.add_pod(Arc::new(PodInfo::new(p.clone())));
                    any = true;
                }
            }
            any.then_some(added)
        });
        let verdict = match &with_nominated {
            Some(added) => {
                plugins::filter(&state, added, &nsl).or_else(|| plugins::filter(&state, node, &nsl))
            }
            None => plugins::filter(&state, node, &nsl),
        }
        .or_else(|| {
            let n = node.node.as_ref()?;
            let pods: Vec<Arc<Pod>> = node.pods.values().map(|p| p.pod.clone()).collect();
            crate::volumes::volume_limits(&vols, n, &pods)
                .or_else(|| crate::volumes::filter(&vols, n))
        });
        match verdict {
            Some(st) => statuses.push((node.name().to_owned(), st)),
            None => {
                feasible.push(node.clone());
                if feasible.len() >= want {
                    break;
                }
            }
        }
    }
    s.next_start
        .store((start + processed) % n, Ordering::Relaxed);
    if feasible.is_empty() {
        return Some(Outcome::NoFit {
            statuses,
            num_all: n,
            state: Box::new(state),
            snap,
        });
    }
    if feasible.len() == 1 {
        return Some(Outcome::Fit(feasible[0].name().to_owned()));
    }
    let scores = plugins::score(&state, &feasible, &snap, &nsl);
    // The highest score; ties are broken uniformly at random (reservoir sampling).
    let mut best = 0;
    let mut ties = 0u64;
    for (i, sc) in scores.iter().enumerate() {
        if *sc > scores[best] {
            best = i;
            ties = 1;
        } else if *sc == scores[best] {
            ties += 1;
            if s.random() % ties == 0 {
                best = i;
            }
        }
    }
    Some(Outcome::Fit(feasible[best].name().to_owned()))
}

/// What DefaultPreemption (the PostFilter) decided.
enum Preemption {
    /// No node can be made to fit: the message for the FitError.
    NotHelpful(String),
    /// Evict these pods from this node and nominate it.
    Nominate {
        node: String,
        victims: Vec<Arc<PodInfo>>,
    },
}

/// upstream's MoreImportantPod: higher priority, then the one that started earlier.
fn more_important(a: &PodInfo, b: &PodInfo) -> std::cmp::Ordering {
    let start = |p: &PodInfo| {
        p.pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.clone())
            .or_else(|| p.pod.metadata.creation_timestamp.clone())
    };
    b.priority
        .cmp(&a.priority)
        .then_with(|| start(a).map(|t| t.0).cmp(&start(b).map(|t| t.0)))
}

/// SelectVictimsOnNode: remove every lower-priority pod; if the pod then fits, put back
/// (reprieve) as many as possible, most important first. PodDisruptionBudgets are not
/// considered yet.
fn select_victims(
    state: &plugins::CycleState,
    node: &NodeInfo,
    nsl: plugins::NamespaceLabels<'_>,
) -> Result<Vec<Arc<PodInfo>>, Status> {
    let prio = state.pod.priority;
    let mut potential: Vec<Arc<PodInfo>> = node
        .pods
        .values()
        .filter(|p| p.priority < prio)
        .cloned()
        .collect();
    if potential.is_empty() {
        return Err(Status {
            plugin: "DefaultPreemption",
            code: Code::UnschedulableAndUnresolvable,
            reasons: vec!["No preemption victims found for incoming pod".into()],
        });
    }
    potential.sort_by(|a, b| more_important(a, b));
    let keys: Vec<String> = potential.iter().map(|p| p.key.clone()).collect();
    let mut ni = node.without(&keys);
    if let Some(st) = plugins::filter(state, &ni, nsl) {
        return Err(st);
    }
    let mut victims = Vec::new();
    for p in potential {
        let mut with = ni.clone();
        with.add_pod(p.clone());
        if plugins::filter(state, &with, nsl).is_none() {
            ni = with;
        } else {
            victims.push(p);
        }
    }
    Ok(victims)
}

/// DefaultPreemption's PostFilter over the nodes the filters rejected.
fn preempt(
    s: &Sched,
    state: &plugins::CycleState,
    statuses: &[(String, Status)],
    snap: &Snapshot,
) -> Preemption {
    let pod = &state.pod.pod;
    let nsl = |ns: &str| s.ns_labels(ns);
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref())
        == Some("Never")
    {
        return Preemption::NotHelpful(
            "preemption: not eligible due to preemptionPolicy=Never.".into(),
        );
    }
    // A pod that already preempted waits for its victims to go.
    let nominated = pod
        .status
        .as_ref()
        .and_then(|s| s.nominated_node_name.as_deref())
        .filter(|n| !n.is_empty());
    if let Some(nom) = nominated {
        let resolvable = statuses
            .iter()
            .find(|(n, _)| n == nom)
            .is_some_and(|(_, st)| st.code == Code::Unschedulable);
        let terminating = snap
            .nodes
            .iter()
            .find(|n| n.name() == nom)
            .is_some_and(|n| {
                n.pods.values().any(|p| {
                    p.priority < state.pod.priority && p.pod.metadata.deletion_timestamp.is_some()
                })
            });
        if resolvable && terminating {
            return Preemption::NotHelpful(
                "preemption: not eligible due to a terminating pod on the nominated node.".into(),
            );
        }
    }
    let mut out = Vec::new();
    let mut candidates: Vec<(String, Vec<Arc<PodInfo>>)> = Vec::new();
    for (name, st) in statuses {
        if st.code == Code::UnschedulableAndUnresolvable {
            out.push((
                name.clone(),
                Status {
                    plugin: st.plugin,
                    code: Code::UnschedulableAndUnresolvable,
                    reasons: vec!["Preemption is not helpful for scheduling".into()],
                },
            ));
            continue;
        }
        let Some(node) = snap.nodes.iter().find(|n| n.name() == name) else {
            continue;
        };
        match select_victims(state, node, &nsl) {
            Ok(v) => candidates.push((name.clone(), v)),
            Err(st) => out.push((name.clone(), st)),
        }
    }
    if candidates.is_empty() {
        return Preemption::NotHelpful(format!(
            "preemption: {}",
            fit_error_message(snap.nodes.len(), &out, None)
        ));
    }
    // pickOneNodeForPreemption: the lowest highest-priority victim, then the lowest sum
    // of priorities, then the fewest victims.
    let key = |v: &Vec<Arc<PodInfo>>| {
        let highest = v.iter().map(|p| p.priority).max().unwrap_or(i32::MIN);
        let sum: i64 = v
            .iter()
            .map(|p| i64::from(p.priority) + i64::from(i32::MAX) + 1)
            .sum();
        (highest, sum, v.len())
    };
    candidates.sort_by_key(|(_, v)| key(v));
    let (node, victims) = candidates.swap_remove(0);
    Preemption::Nominate { node, victims }
}

/// Schedules one pod from the queue.
pub(crate) async fn schedule_one(s: &Arc<Sched>, qp: QueuedPod) {
    let key = pod_key(&qp.pod);
    // The informer's copy is the newest; the pod may be gone or bound by now.
    let Some(pod) = s.pods.get(&key) else {
        s.queue.delete(&key);
        return;
    };
    if !responsible(&pod) {
        s.queue.delete(&key);
        return;
    }
    let pod = Arc::new((*pod).clone());
    match find_node(s, pod.clone()) {
        None => {
            let msg = "no nodes available to schedule pods";
            failed(s, &pod, "SchedulerError", msg, Vec::new(), None).await;
        }
        Some(Outcome::NoFit {
            statuses,
            num_all,
            state,
            snap,
        }) => {
            let (post, nominate) = match preempt(s, &state, &statuses, &snap) {
                Preemption::NotHelpful(m) => (Some(m), None),
                Preemption::Nominate { node, victims } => (
                    Some(format!(
                        "preemption: found a potential placement for pod on node {node}, preempting {} victims",
                        victims.len()
                    )),
                    Some((node, victims)),
                ),
            };
            let msg = fit_error_message(num_all, &statuses, post.as_deref());
            let mut plugins: Vec<&'static str> = statuses
                .iter()
                .map(|(_, st)| st.plugin)
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            plugins.sort();
            let nominated = nominate.as_ref().map(|(n, _)| n.clone());
            if let Some(n) = &nominated {
                s.queue.nominate(&pod_key(&pod), n);
            }
            if let Some((node, victims)) = nominate {
                let s = s.clone();
                let preemptor = pod.clone();
                tokio::spawn(async move { evict(&s, &preemptor, &node, victims).await });
            }
            failed(s, &pod, "Unschedulable", &msg, plugins, nominated).await;
        }
        Some(Outcome::Fit(node)) => {
            s.cache.lock().assume(&pod, &node);
            s.queue.done(&key);
            let s = s.clone();
            tokio::spawn(async move { bind(&s, &pod, &node).await });
        }
    }
}

async fn failed(
    s: &Arc<Sched>,
    pod: &Pod,
    reason: &str,
    msg: &str,
    plugins: Vec<&'static str>,
    nominated: Option<String>,
) {
    let key = pod_key(pod);
    tracing::info!(pod = %key, %msg, "unable to schedule pod");
    s.queue.requeue_failed(&key, plugins);
    // The API calls run beside the scheduling loop, as upstream's asynchronous ones.
    let (s, pod, reason, msg) = (s.clone(), pod.clone(), reason.to_owned(), msg.to_owned());
    tokio::spawn(async move {
        s.recorder
            .pod_event(&pod, "Warning", "FailedScheduling", "Scheduling", &msg)
            .await;
        update_condition(&s, &pod, &reason, &msg, nominated).await;
    });
}

/// Sets PodScheduled=False with the reason and message (and status.nominatedNodeName
/// when preemption nominated a node), unless the pod already says so.
async fn update_condition(
    s: &Sched,
    pod: &Pod,
    reason: &str,
    msg: &str,
    nominated: Option<String>,
) {
    let current = pod
        .status
        .as_ref()
        .and_then(|st| st.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
    if let Some(c) = current {
        if c.status == "False"
            && c.reason.as_deref() == Some(reason)
            && c.message.as_deref() == Some(msg)
            && nominated.is_none()
        {
            return;
        }
    }
    let transition = match current {
        Some(c) if c.status == "False" => c.last_transition_time.clone(),
        _ => None,
    }
    .unwrap_or(Time(Timestamp::now()));
    let mut cond = json!({
        "type": "PodScheduled",
        "status": "False",
        "reason": reason,
        "message": msg,
        "lastProbeTime": null,
        "lastTransitionTime": transition,
    });
    if let Some(g) = pod.metadata.generation {
        cond["observedGeneration"] = json!(g);
    }
    let mut patch = json!({"status": {"conditions": [cond]}});
    if let Some(n) = nominated {
        patch["status"]["nominatedNodeName"] = json!(n);
    }
    let api: Api<Pod> = Api::namespaced(
        s.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let pp = PatchParams {
        field_manager: Some("kube-scheduler".into()),
        ..Default::default()
    };
    if let Err(e) = api
        .patch_status(
            pod.metadata.name.as_deref().unwrap_or_default(),
            &pp,
            &Patch::Strategic(&patch),
        )
        .await
    {
        if !kumo_client::error::is_not_found(&e) {
            tracing::warn!(error = %e, "updating the PodScheduled condition failed");
        }
    }
}

/// Preempts the victims: the DisruptionTarget condition, the delete, and the
/// `Preempted` event on each, as upstream's preemption executor.
async fn evict(s: &Sched, preemptor: &Pod, node: &str, victims: Vec<Arc<PodInfo>>) {
    let pp = PatchParams {
        field_manager: Some("kube-scheduler".into()),
        ..Default::default()
    };
    for v in victims {
        let victim = &v.pod;
        if victim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let ns = victim.metadata.namespace.clone().unwrap_or_default();
        let name = victim.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(s.client.clone(), &ns);
        let mut cond = json!({
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": format!("{SCHEDULER_NAME}: preempting to accommodate a higher priority pod"),
            "lastProbeTime": null,
            "lastTransitionTime": Time(Timestamp::now()),
        });
        if let Some(g) = victim.metadata.generation {
            cond["observedGeneration"] = json!(g);
        }
        let patch = json!({"status": {"conditions": [cond]}});
        if let Err(e) = api
            .patch_status(&name, &pp, &Patch::Strategic(&patch))
            .await
        {
            if !kumo_client::error::is_not_found(&e) {
                tracing::warn!(error = %e, victim = %v.key, "could not add DisruptionTarget condition due to preemption");
            }
            continue;
        }
        if let Err(e) = api.delete(&name, &Default::default()).await {
            if !kumo_client::error::is_not_found(&e) {
                tracing::warn!(error = %e, victim = %v.key, "preempting pod failed");
            }
            continue;
        }
        let note = format!(
            "Preempted by pod {} on node {node}",
            preemptor.metadata.uid.as_deref().unwrap_or_default()
        );
        s.recorder
            .pod_event(victim, "Normal", "Preempted", "Preempting", &note)
            .await;
    }
}

/// VolumeBinding's PreBind (the pod's claims bound for the node), then DefaultBinder: POST
/// pods/<name>/binding, then the `Scheduled` event.
async fn bind(s: &Arc<Sched>, pod: &Pod, node: &str) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    if !crate::volumes::claim_names(pod).is_empty() {
        let node_obj = s.cache.lock().node(node);
        let r = match node_obj {
            Some(n) => crate::volumes::pre_bind(&s.client, &s.volumes, pod, &n).await,
            None => Err(format!("node {node:?} not found")),
        };
        if let Err(e) = r {
            let key = pod_key(pod);
            s.cache.lock().forget(&key);
            let msg = format!("running PreBind plugin \"VolumeBinding\": {e}");
            tracing::warn!(pod = %key, %msg, "binding failed");
            if let Some(p) = s.pods.get(&key).filter(|p| responsible(p)) {
                s.queue.add_or_update(p.clone());
                s.recorder
                    .pod_event(pod, "Warning", "FailedScheduling", "Scheduling", &msg)
                    .await;
            }
            return;
        }
    }
    let api: Api<Pod> = Api::namespaced(s.client.clone(), &ns);
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": ns, "uid": pod.metadata.uid},
        "target": {"kind": "Node", "name": node},
    });
    let r: Result<serde_json::Value, kube::Error> = api
        .create_subresource("binding", &name, &PostParams::default(), &binding)
        .await;
    let key = pod_key(pod);
    match r {
        Ok(_) => {
            let msg = format!("Successfully assigned {ns}/{name} to {node}");
            s.recorder
                .pod_event(pod, "Normal", "Scheduled", "Binding", &msg)
                .await;
        }
        Err(e) => {
            s.cache.lock().forget(&key);
            let msg = format!(
                "running Bind plugin \"DefaultBinder\": {}",
                kumo_client::error::message(&e)
            );
            tracing::warn!(pod = %key, %msg, "binding failed");
            if let Some(p) = s.pods.get(&key).filter(|p| responsible(p)) {
                s.queue.add_or_update(p.clone());
                s.recorder
                    .pod_event(pod, "Warning", "FailedScheduling", "Scheduling", &msg)
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(reason: &str, code: Code) -> Status {
        Status {
            plugin: "X",
            code,
            reasons: vec![reason.into()],
        }
    }

    #[test]
    fn message_format() {
        let statuses = vec![
            (
                "cp".to_owned(),
                st(
                    "node(s) had untolerated taint(s)",
                    Code::UnschedulableAndUnresolvable,
                ),
            ),
            ("w1".to_owned(), st("Insufficient cpu", Code::Unschedulable)),
            ("w2".to_owned(), st("Insufficient cpu", Code::Unschedulable)),
        ];
        let pre = vec![
            (
                "cp".to_owned(),
                st(
                    "Preemption is not helpful for scheduling",
                    Code::UnschedulableAndUnresolvable,
                ),
            ),
            (
                "w1".to_owned(),
                st(
                    "No preemption victims found for incoming pod",
                    Code::UnschedulableAndUnresolvable,
                ),
            ),
            (
                "w2".to_owned(),
                st(
                    "No preemption victims found for incoming pod",
                    Code::UnschedulableAndUnresolvable,
                ),
            ),
        ];
        let post = format!("preemption: {}", fit_error_message(3, &pre, None));
        assert_eq!(
            fit_error_message(3, &statuses, Some(&post)),
            "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 Insufficient cpu. \
             preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, \
             2 No preemption victims found for incoming pod."
        );
    }

    #[test]
    fn feasible_nodes() {
        assert_eq!(num_feasible_nodes_to_find(3), 3);
        assert_eq!(num_feasible_nodes_to_find(150), 100);
        assert_eq!(num_feasible_nodes_to_find(5000), 500);
        assert_eq!(num_feasible_nodes_to_find(1000), 420);
    }
}
