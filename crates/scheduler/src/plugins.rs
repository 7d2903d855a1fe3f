//! The default profile's Filter and Score plugins (upstream's `framework/plugins`), with
//! their reasons, status codes, weights and score normalization.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::cache::{ports_conflict, NodeInfo, PodInfo, Snapshot};
use crate::helpers::{
    labels_of, pod_matches_node_selector_and_affinity, selector_matches, taints_of, term_matches,
    tolerates, tolerations_of, untolerated_taint,
};

/// Highest score a plugin gives a node.
pub const MAX_NODE_SCORE: i64 = 100;

/// Why a node was rejected, as upstream's framework.Status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Preemption may help.
    Unschedulable,
    /// Preemption cannot help.
    UnschedulableAndUnresolvable,
}

/// A failed Filter: the plugin, its code and reasons.
#[derive(Clone, Debug)]
pub struct Status {
    /// The plugin that rejected the node.
    pub plugin: &'static str,
    /// Its code.
    pub code: Code,
    /// The reasons counted in the FailedScheduling message.
    pub reasons: Vec<String>,
}

fn reject(plugin: &'static str, code: Code, reason: &str) -> Status {
    Status {
        plugin,
        code,
        reasons: vec![reason.to_owned()],
    }
}

/// Plugin names as upstream registers them.
pub mod names {
    /// NodeUnschedulable.
    pub const NODE_UNSCHEDULABLE: &str = "NodeUnschedulable";
    /// NodeName.
    pub const NODE_NAME: &str = "NodeName";
    /// TaintToleration.
    pub const TAINT_TOLERATION: &str = "TaintToleration";
    /// NodeAffinity.
    pub const NODE_AFFINITY: &str = "NodeAffinity";
    /// NodePorts.
    pub const NODE_PORTS: &str = "NodePorts";
    /// NodeResourcesFit.
    pub const NODE_RESOURCES_FIT: &str = "NodeResourcesFit";
    /// PodTopologySpread.
    pub const POD_TOPOLOGY_SPREAD: &str = "PodTopologySpread";
    /// InterPodAffinity.
    pub const INTER_POD_AFFINITY: &str = "InterPodAffinity";
}
use names::*;

/// An affinity term with its namespaces resolved (upstream's `framework.AffinityTerm`).
#[derive(Clone, Debug)]
struct Term {
    namespaces: HashSet<String>,
    ns_selector: Option<LabelSelector>,
    selector: Option<LabelSelector>,
    match_in: Vec<(String, String)>,
    mismatch: Vec<(String, String)>,
    topology_key: String,
    weight: i64,
}

/// Namespace labels, looked up for namespaceSelector.
pub type NamespaceLabels<'a> = &'a (dyn Fn(&str) -> BTreeMap<String, String> + Sync);

impl Term {
    fn new(owner: &Pod, t: &PodAffinityTerm, weight: i64) -> Term {
        let labels = labels_of(&owner.metadata.labels);
        let mut namespaces: HashSet<String> = t.namespaces.iter().flatten().cloned().collect();
        if namespaces.is_empty() && t.namespace_selector.is_none() {
            namespaces.insert(owner.metadata.namespace.clone().unwrap_or_default());
        }
        let pick = |keys: &Option<Vec<String>>| -> Vec<(String, String)> {
            keys.iter()
                .flatten()
                .filter_map(|k| labels.get(k).map(|v| (k.clone(), v.clone())))
                .collect()
        };
        Term {
            namespaces,
            ns_selector: t.namespace_selector.clone(),
            selector: t.label_selector.clone(),
            match_in: pick(&t.match_label_keys),
            mismatch: pick(&t.mismatch_label_keys),
            topology_key: t.topology_key.clone(),
            weight,
        }
    }

    fn matches(&self, pod: &Pod, ns_labels: NamespaceLabels<'_>) -> bool {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let in_ns = self.namespaces.contains(ns)
            || self
                .ns_selector
                .as_ref()
                .is_some_and(|s| selector_matches(Some(s), &[], &ns_labels(ns)));
        if !in_ns {
            return false;
        }
        let labels = labels_of(&pod.metadata.labels);
        selector_matches(self.selector.as_ref(), &self.match_in, labels)
            && self.mismatch.iter().all(|(k, v)| labels.get(k) != Some(v))
    }
}

#[derive(Default)]
struct PodTerms {
    required_affinity: Vec<Term>,
    required_anti: Vec<Term>,
    preferred_affinity: Vec<Term>,
    preferred_anti: Vec<Term>,
}

fn terms_of(pod: &Pod) -> PodTerms {
    let mut out = PodTerms::default();
    let Some(a) = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
        return out;
    };
    if let Some(pa) = &a.pod_affinity {
        for t in pa
            .required_during_scheduling_ignored_during_execution
            .iter()
            .flatten()
        {
            out.required_affinity.push(Term::new(pod, t, 1));
        }
        for w in pa
            .preferred_during_scheduling_ignored_during_execution
            .iter()
            .flatten()
        {
            out.preferred_affinity
                .push(Term::new(pod, &w.pod_affinity_term, i64::from(w.weight)));
        }
    }
    if let Some(pa) = &a.pod_anti_affinity {
        for t in pa
            .required_during_scheduling_ignored_during_execution
            .iter()
            .flatten()
        {
            out.required_anti.push(Term::new(pod, t, 1));
        }
        for w in pa
            .preferred_during_scheduling_ignored_during_execution
            .iter()
            .flatten()
        {
            out.preferred_anti
                .push(Term::new(pod, &w.pod_affinity_term, i64::from(w.weight)));
        }
    }
    out
}

type Pair = (String, String);

/// A topology spread constraint, prepared.
struct Constraint {
    max_skew: i64,
    topology_key: String,
    selector: Option<LabelSelector>,
    match_in: Vec<(String, String)>,
    min_domains: i64,
    honor_affinity: bool,
    honor_taints: bool,
}

fn constraints_of(pod: &Pod, action: &str) -> Vec<Constraint> {
    let labels = labels_of(&pod.metadata.labels);
    let list: &[TopologySpreadConstraint] = pod
        .spec
        .as_ref()
        .and_then(|s| s.topology_spread_constraints.as_deref())
        .unwrap_or_default();
    list.iter()
        .filter(|c| c.when_unsatisfiable == action)
        .map(|c| Constraint {
            max_skew: i64::from(c.max_skew),
            topology_key: c.topology_key.clone(),
            selector: c.label_selector.clone(),
            match_in: c
                .match_label_keys
                .iter()
                .flatten()
                .filter_map(|k| labels.get(k).map(|v| (k.clone(), v.clone())))
                .collect(),
            min_domains: i64::from(c.min_domains.unwrap_or(1)),
            honor_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        })
        .collect()
}

impl Constraint {
    fn counts_pod(&self, incoming: &Pod, existing: &Pod) -> bool {
        existing.metadata.deletion_timestamp.is_none()
            && existing.metadata.namespace == incoming.metadata.namespace
            && selector_matches(
                self.selector.as_ref(),
                &self.match_in,
                labels_of(&existing.metadata.labels),
            )
    }

    /// Whether pods on this node count for the constraint (nodeAffinityPolicy,
    /// nodeTaintsPolicy).
    fn node_included(&self, pod: &Pod, n: &NodeInfo) -> bool {
        let Some(node) = &n.node else { return false };
        if self.honor_affinity && !pod_matches_node_selector_and_affinity(pod, node) {
            return false;
        }
        if self.honor_taints
            && untolerated_taint(taints_of(node), tolerations_of(pod), |t| {
                t.effect == "NoSchedule" || t.effect == "NoExecute"
            })
            .is_some()
        {
            return false;
        }
        true
    }
}

fn node_label<'a>(n: &'a NodeInfo, key: &str) -> Option<&'a String> {
    n.node
        .as_ref()
        .and_then(|n| n.metadata.labels.as_ref())
        .and_then(|l| l.get(key))
}

/// Per-cycle state: the pod and what PreFilter computed over the snapshot.
pub struct CycleState {
    /// The pod being scheduled.
    pub pod: Arc<PodInfo>,
    terms: PodTerms,
    hard_spread: Vec<Constraint>,
    spread_counts: HashMap<Pair, i64>,
    spread_min: Vec<i64>,
    affinity_counts: HashMap<Pair, i64>,
    anti_affinity_counts: HashMap<Pair, i64>,
    existing_anti_counts: HashMap<Pair, i64>,
}

/// PreFilter: everything the filters need from the whole snapshot.
pub fn pre_filter(
    pod: Arc<PodInfo>,
    snap: &Snapshot,
    ns_labels: NamespaceLabels<'_>,
) -> CycleState {
    let p = &pod.pod;
    let terms = terms_of(p);
    let hard_spread = constraints_of(p, "DoNotSchedule");

    // PodTopologySpread: matching pods per domain, over nodes that have every key.
    let mut spread_counts: HashMap<Pair, i64> = HashMap::new();
    if !hard_spread.is_empty() {
        for n in snap.nodes.iter() {
            if !hard_spread
                .iter()
                .all(|c| node_label(n, &c.topology_key).is_some())
            {
                continue;
            }
            for c in &hard_spread {
                if !c.node_included(p, n) {
                    continue;
                }
                let Some(v) = node_label(n, &c.topology_key) else {
                    continue;
                };
                let cnt = n.pods.values().filter(|e| c.counts_pod(p, &e.pod)).count() as i64;
                *spread_counts
                    .entry((c.topology_key.clone(), v.clone()))
                    .or_default() += cnt;
            }
        }
    }
    let spread_min = hard_spread
        .iter()
        .map(|c| {
            let domains: Vec<i64> = spread_counts
                .iter()
                .filter(|((k, _), _)| *k == c.topology_key)
                .map(|(_, v)| *v)
                .collect();
            if (domains.len() as i64) < c.min_domains {
                0
            } else {
                domains.into_iter().min().unwrap_or(0)
            }
        })
        .collect();

    // InterPodAffinity: the counts of matching pods per topology pair.
    let mut affinity_counts: HashMap<Pair, i64> = HashMap::new();
    let mut anti_affinity_counts: HashMap<Pair, i64> = HashMap::new();
    let mut existing_anti_counts: HashMap<Pair, i64> = HashMap::new();
    let own_terms = !terms.required_affinity.is_empty() || !terms.required_anti.is_empty();
    for n in snap.nodes.iter() {
        // Without terms of its own, only pods with affinity on the node matter.
        if !own_terms && n.with_affinity == 0 {
            continue;
        }
        for e in n.pods.values() {
            if !terms.required_affinity.is_empty()
                && terms
                    .required_affinity
                    .iter()
                    .all(|t| t.matches(&e.pod, ns_labels))
            {
                for t in &terms.required_affinity {
                    if let Some(v) = node_label(n, &t.topology_key) {
                        *affinity_counts
                            .entry((t.topology_key.clone(), v.clone()))
                            .or_default() += 1;
                    }
                }
            }
            for t in &terms.required_anti {
                if t.matches(&e.pod, ns_labels) {
                    if let Some(v) = node_label(n, &t.topology_key) {
                        *anti_affinity_counts
                            .entry((t.topology_key.clone(), v.clone()))
                            .or_default() += 1;
                    }
                }
            }
            if e.has_pod_affinity() {
                for t in terms_of(&e.pod).required_anti {
                    if t.matches(p, ns_labels) {
                        if let Some(v) = node_label(n, &t.topology_key) {
                            *existing_anti_counts
                                .entry((t.topology_key.clone(), v.clone()))
                                .or_default() += 1;
                        }
                    }
                }
            }
        }
    }
    CycleState {
        pod,
        terms,
        hard_spread,
        spread_counts,
        spread_min,
        affinity_counts,
        anti_affinity_counts,
        existing_anti_counts,
    }
}

/// Runs the Filter plugins in the default profile's order; the first rejection wins.
pub fn filter(st: &CycleState, n: &NodeInfo, ns_labels: NamespaceLabels<'_>) -> Option<Status> {
    let pod = &st.pod.pod;
    let node = n.node.as_ref()?;
    let spec = pod.spec.as_ref();
    let tolerations = tolerations_of(pod);

    // NodeUnschedulable.
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        let taint = k8s_openapi::api::core::v1::Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        if !tolerations.iter().any(|t| tolerates(t, &taint)) {
            return Some(reject(
                NODE_UNSCHEDULABLE,
                Code::UnschedulableAndUnresolvable,
                "node(s) were unschedulable",
            ));
        }
    }
    // NodeName.
    if let Some(want) = spec
        .and_then(|s| s.node_name.as_deref())
        .filter(|s| !s.is_empty())
    {
        if want != n.name() {
            return Some(reject(
                NODE_NAME,
                Code::UnschedulableAndUnresolvable,
                "node(s) didn't match the requested node name",
            ));
        }
    }
    // TaintToleration.
    if untolerated_taint(taints_of(node), tolerations, |t| {
        t.effect == "NoSchedule" || t.effect == "NoExecute"
    })
    .is_some()
    {
        return Some(reject(
            TAINT_TOLERATION,
            Code::UnschedulableAndUnresolvable,
            "node(s) had untolerated taint(s)",
        ));
    }
    // NodeAffinity.
    if !pod_matches_node_selector_and_affinity(pod, node) {
        return Some(reject(
            NODE_AFFINITY,
            Code::UnschedulableAndUnresolvable,
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    // NodePorts.
    if !st.pod.ports.is_empty() {
        let used = n.pods.values().flat_map(|p| p.ports.iter());
        let conflict = used
            .clone()
            .any(|u| st.pod.ports.iter().any(|w| ports_conflict(u, w)));
        if conflict {
            return Some(reject(
                NODE_PORTS,
                Code::Unschedulable,
                "node(s) didn't have free ports for the requested pod ports",
            ));
        }
    }
    // NodeResourcesFit.
    if let Some(s) = fit(&st.pod, n) {
        return Some(s);
    }
    // PodTopologySpread.
    if !st.hard_spread.is_empty() {
        let own = labels_of(&pod.metadata.labels);
        for (i, c) in st.hard_spread.iter().enumerate() {
            let Some(v) = node_label(n, &c.topology_key) else {
                return Some(reject(
                    POD_TOPOLOGY_SPREAD,
                    Code::UnschedulableAndUnresolvable,
                    "node(s) didn't match pod topology spread constraints (missing required label)",
                ));
            };
            let self_match = i64::from(selector_matches(c.selector.as_ref(), &c.match_in, own));
            let cnt = st
                .spread_counts
                .get(&(c.topology_key.clone(), v.clone()))
                .copied()
                .unwrap_or(0);
            let min = st.spread_min.get(i).copied().unwrap_or(0);
            if cnt + self_match - min > c.max_skew {
                return Some(reject(
                    POD_TOPOLOGY_SPREAD,
                    Code::Unschedulable,
                    "node(s) didn't match pod topology spread constraints",
                ));
            }
        }
    }
    // InterPodAffinity.
    inter_pod_affinity(st, n, ns_labels)
}

fn fit(p: &PodInfo, n: &NodeInfo) -> Option<Status> {
    let mut reasons = Vec::new();
    let mut unresolvable = false;
    if n.pods.len() as i64 + 1 > n.allocatable.allowed_pods {
        reasons.push("Too many pods".to_owned());
    }
    let r = &p.requests;
    let a = &n.allocatable;
    let u = &n.requested;
    let mut check = |name: &str, want: i64, have: i64, used: i64| {
        if want > 0 && want > have - used {
            reasons.push(format!("Insufficient {name}"));
            // A request larger than the whole node: no preemption can make room.
            if want > have {
                unresolvable = true;
            }
        }
    };
    check("cpu", r.milli_cpu, a.milli_cpu, u.milli_cpu);
    check("memory", r.memory, a.memory, u.memory);
    check(
        "ephemeral-storage",
        r.ephemeral_storage,
        a.ephemeral_storage,
        u.ephemeral_storage,
    );
    for (name, want) in &r.scalar {
        check(name, *want, a.get(name), u.get(name));
    }
    if reasons.is_empty() {
        return None;
    }
    Some(Status {
        plugin: NODE_RESOURCES_FIT,
        code: if unresolvable {
            Code::UnschedulableAndUnresolvable
        } else {
            Code::Unschedulable
        },
        reasons,
    })
}

fn inter_pod_affinity(
    st: &CycleState,
    n: &NodeInfo,
    ns_labels: NamespaceLabels<'_>,
) -> Option<Status> {
    let terms = &st.terms;
    if !terms.required_affinity.is_empty() {
        let mut exist = true;
        let mut labels_ok = true;
        for t in &terms.required_affinity {
            match node_label(n, &t.topology_key) {
                Some(v) => {
                    if st
                        .affinity_counts
                        .get(&(t.topology_key.clone(), v.clone()))
                        .copied()
                        .unwrap_or(0)
                        <= 0
                    {
                        exist = false;
                    }
                }
                None => labels_ok = false,
            }
        }
        // The first pod of a group with affinity to itself may go anywhere.
        let first = st.affinity_counts.is_empty()
            && terms
                .required_affinity
                .iter()
                .all(|t| t.matches(&st.pod.pod, ns_labels));
        if !labels_ok || (!exist && !first) {
            return Some(reject(
                INTER_POD_AFFINITY,
                Code::UnschedulableAndUnresolvable,
                "node(s) didn't match pod affinity rules",
            ));
        }
    }
    for t in &terms.required_anti {
        if let Some(v) = node_label(n, &t.topology_key) {
            if st
                .anti_affinity_counts
                .get(&(t.topology_key.clone(), v.clone()))
                .copied()
                .unwrap_or(0)
                > 0
            {
                return Some(reject(
                    INTER_POD_AFFINITY,
                    Code::Unschedulable,
                    "node(s) didn't match pod anti-affinity rules",
                ));
            }
        }
    }
    if !st.existing_anti_counts.is_empty() {
        let labels = n.node.as_ref().map(|n| labels_of(&n.metadata.labels));
        for (k, v) in labels.into_iter().flatten() {
            if st
                .existing_anti_counts
                .get(&(k.clone(), v.clone()))
                .copied()
                .unwrap_or(0)
                > 0
            {
                return Some(reject(
                    INTER_POD_AFFINITY,
                    Code::Unschedulable,
                    "node(s) didn't satisfy existing pods anti-affinity rules",
                ));
            }
        }
    }
    None
}

/// Score plugins of the default profile with their weights.
pub const SCORE_WEIGHTS: &[(&str, i64)] = &[
    (TAINT_TOLERATION, 3),
    (NODE_AFFINITY, 2),
    (NODE_RESOURCES_FIT, 1),
    (POD_TOPOLOGY_SPREAD, 2),
    (INTER_POD_AFFINITY, 2),
    ("NodeResourcesBalancedAllocation", 1),
    ("ImageLocality", 1),
];

/// upstream's `helper.DefaultNormalizeScore`.
fn default_normalize(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    if max == 0 {
        if reverse {
            scores.iter_mut().for_each(|s| *s = MAX_NODE_SCORE);
        }
        return;
    }
    for s in scores.iter_mut() {
        *s = MAX_NODE_SCORE * *s / max;
        if reverse {
            *s = MAX_NODE_SCORE - *s;
        }
    }
}

/// Scores the feasible nodes: the weighted sum of every Score plugin, each normalized to
/// 0–100 as upstream.
pub fn score(
    st: &CycleState,
    feasible: &[Arc<NodeInfo>],
    snap: &Snapshot,
    ns_labels: NamespaceLabels<'_>,
) -> Vec<i64> {
    let pod = &st.pod.pod;
    let k = feasible.len();
    let mut total = vec![0i64; k];
    let mut add = |scores: &[i64], weight: i64| {
        for (t, s) in total.iter_mut().zip(scores) {
            *t += s * weight;
        }
    };

    // TaintToleration: intolerable PreferNoSchedule taints, fewer is better.
    let prefer_tols: Vec<_> = tolerations_of(pod)
        .iter()
        .filter(|t| {
            t.effect
                .as_deref()
                .is_none_or(|e| e.is_empty() || e == "PreferNoSchedule")
        })
        .cloned()
        .collect();
    let mut s: Vec<i64> = feasible
        .iter()
        .map(|n| {
            let taints = n.node.as_ref().map(|n| taints_of(n)).unwrap_or_default();
            taints
                .iter()
                .filter(|t| {
                    t.effect == "PreferNoSchedule"
                        && !prefer_tols.iter().any(|tol| tolerates(tol, t))
                })
                .count() as i64
        })
        .collect();
    default_normalize(&mut s, true);
    add(&s, 3);

    // NodeAffinity: the weights of the preferred terms that match.
    let preferred = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if let Some(pref) = preferred {
        let mut s: Vec<i64> = feasible
            .iter()
            .map(|n| {
                let Some(node) = &n.node else { return 0 };
                pref.iter()
                    .filter(|p| p.weight != 0 && term_matches(&p.preference, node))
                    .map(|p| i64::from(p.weight))
                    .sum()
            })
            .collect();
        default_normalize(&mut s, false);
        add(&s, 2);
    }

    // NodeResourcesFit, LeastAllocated over cpu and memory (weight 1 each).
    let s: Vec<i64> = feasible
        .iter()
        .map(|n| {
            let mut sum = 0;
            let mut weights = 0;
            let (alloc, used, pod) = (&n.allocatable, &n.non_zero_requested, &st.pod.non_zero);
            for (alloc, req) in [
                (alloc.milli_cpu, used.milli_cpu + pod.milli_cpu),
                (alloc.memory, used.memory + pod.memory),
            ] {
                if alloc == 0 {
                    continue;
                }
                sum += if req > alloc {
                    0
                } else {
                    (alloc - req) * MAX_NODE_SCORE / alloc
                };
                weights += 1;
            }
            if weights == 0 {
                0
            } else {
                sum / weights
            }
        })
        .collect();
    add(&s, 1);

    // PodTopologySpread, ScheduleAnyway constraints.
    let soft = constraints_of(pod, "ScheduleAnyway");
    if !soft.is_empty() {
        add(&spread_scores(st, &soft, feasible, snap), 2);
    }

    // InterPodAffinity, preferred terms both ways and existing pods' required affinity.
    if let Some(s) = affinity_scores(st, feasible, snap, ns_labels) {
        add(&s, 2);
    }

    // NodeResourcesBalancedAllocation (skipped for pods that request nothing).
    let r = &st.pod.requests;
    if r.milli_cpu > 0 || r.memory > 0 {
        let s: Vec<i64> = feasible
            .iter()
            .map(|n| {
                // cpu and memory: with two fractions the standard deviation is half
                // their difference.
                let (alloc, used) = (&n.allocatable, &n.requested);
                let fraction = |alloc: i64, req: i64| {
                    (alloc != 0).then(|| (req as f64 / alloc as f64).min(1.0))
                };
                let cpu = fraction(alloc.milli_cpu, used.milli_cpu + r.milli_cpu);
                let mem = fraction(alloc.memory, used.memory + r.memory);
                let std = match (cpu, mem) {
                    (Some(c), Some(m)) => (c - m).abs() / 2.0,
                    _ => 0.0,
                };
                ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
            })
            .collect();
        add(&s, 1);
    }

    // ImageLocality: the pod's images are normalized once per cycle.
    let pod_images: Vec<Option<String>> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .map(|c| c.image.as_deref().map(crate::cache::normalize_image))
        .collect();
    let s: Vec<i64> = feasible
        .iter()
        .map(|n| image_score(&pod_images, n, snap))
        .collect();
    add(&s, 1);
    total
}

/// ImageLocality for a pod whose containers' (normalized) images are `pod_images`.
fn image_score(pod_images: &[Option<String>], n: &NodeInfo, snap: &Snapshot) -> i64 {
    const MB: i64 = 1024 * 1024;
    const MIN: i64 = 23 * MB;
    const MAX_PER_CONTAINER: i64 = 1000 * MB;
    let images = n
        .node
        .as_ref()
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.images.as_deref())
        .unwrap_or_default();
    let mut sum = 0i64;
    if !images.is_empty() {
        // The size of each image the node has, by normalized name (the last listing wins).
        let mut sizes: HashMap<String, i64> = HashMap::new();
        for img in images {
            for name in img.names.iter().flatten() {
                sizes.insert(
                    crate::cache::normalize_image(name),
                    img.size_bytes.unwrap_or(0),
                );
            }
        }
        let total = snap.nodes.len().max(1) as f64;
        for norm in pod_images.iter().flatten() {
            if let Some(size) = sizes.get(norm) {
                let spread = *snap.image_nodes.get(norm).unwrap_or(&0) as f64 / total;
                sum += (*size as f64 * spread) as i64;
            }
        }
    }
    let max = MAX_PER_CONTAINER * pod_images.len() as i64;
    let sum = sum.clamp(MIN, max.max(MIN));
    if max <= MIN {
        return 0;
    }
    MAX_NODE_SCORE * (sum - MIN) / (max - MIN)
}

fn spread_scores(
    st: &CycleState,
    soft: &[Constraint],
    feasible: &[Arc<NodeInfo>],
    snap: &Snapshot,
) -> Vec<i64> {
    let pod = &st.pod.pod;
    let ignored: Vec<bool> = feasible
        .iter()
        .map(|n| {
            !soft
                .iter()
                .all(|c| node_label(n, &c.topology_key).is_some())
        })
        .collect();
    // The domains of the feasible nodes, and their sizes (the normalizing weight).
    let mut pairs: HashSet<Pair> = HashSet::new();
    for (n, ign) in feasible.iter().zip(&ignored) {
        if *ign {
            continue;
        }
        for c in soft {
            if let Some(v) = node_label(n, &c.topology_key) {
                pairs.insert((c.topology_key.clone(), v.clone()));
            }
        }
    }
    let weights: Vec<f64> = soft
        .iter()
        .map(|c| {
            let size = pairs.iter().filter(|(k, _)| *k == c.topology_key).count();
            ((size + 2) as f64).ln()
        })
        .collect();
    let mut counts: HashMap<Pair, i64> = HashMap::new();
    for n in snap.nodes.iter() {
        if !soft
            .iter()
            .all(|c| node_label(n, &c.topology_key).is_some())
        {
            continue;
        }
        for c in soft {
            if !c.node_included(pod, n) {
                continue;
            }
            let Some(v) = node_label(n, &c.topology_key) else {
                continue;
            };
            let pair = (c.topology_key.clone(), v.clone());
            if !pairs.contains(&pair) {
                continue;
            }
            let cnt = n
                .pods
                .values()
                .filter(|e| c.counts_pod(pod, &e.pod))
                .count() as i64;
            *counts.entry(pair).or_default() += cnt;
        }
    }
    let raw: Vec<i64> = feasible
        .iter()
        .zip(&ignored)
        .map(|(n, ign)| {
            if *ign {
                return 0;
            }
            let mut s = 0.0;
            for (c, w) in soft.iter().zip(&weights) {
                if let Some(v) = node_label(n, &c.topology_key) {
                    let cnt = counts
                        .get(&(c.topology_key.clone(), v.clone()))
                        .copied()
                        .unwrap_or(0);
                    s += cnt as f64 * w + (c.max_skew - 1) as f64;
                }
            }
            s.round() as i64
        })
        .collect();
    let considered = raw
        .iter()
        .zip(&ignored)
        .filter(|(_, i)| !**i)
        .map(|(s, _)| *s);
    let min = considered.clone().min().unwrap_or(0);
    let max = considered.max().unwrap_or(0);
    raw.iter()
        .zip(&ignored)
        .map(|(s, ign)| {
            if *ign {
                0
            } else if max == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE * (max + min - s) / max
            }
        })
        .collect()
}

fn affinity_scores(
    st: &CycleState,
    feasible: &[Arc<NodeInfo>],
    snap: &Snapshot,
    ns_labels: NamespaceLabels<'_>,
) -> Option<Vec<i64>> {
    let pod = &st.pod.pod;
    let own = &st.terms;
    let has_own = !own.preferred_affinity.is_empty() || !own.preferred_anti.is_empty();
    let mut topo: HashMap<Pair, i64> = HashMap::new();
    let mut any = false;
    for n in snap.nodes.iter() {
        if !has_own && n.with_affinity == 0 {
            continue;
        }
        for e in n.pods.values() {
            let theirs = if e.has_pod_affinity() {
                Some(terms_of(&e.pod))
            } else {
                None
            };
            if !has_own && theirs.is_none() {
                continue;
            }
            any = true;
            let mut bump = |t: &Term, delta: i64| {
                if let Some(v) = node_label(n, &t.topology_key) {
                    *topo.entry((t.topology_key.clone(), v.clone())).or_default() += delta;
                }
            };
            for t in &own.preferred_affinity {
                if t.matches(&e.pod, ns_labels) {
                    bump(t, t.weight);
                }
            }
            for t in &own.preferred_anti {
                if t.matches(&e.pod, ns_labels) {
                    bump(t, -t.weight);
                }
            }
            if let Some(th) = theirs {
                // hardPodAffinityWeight is 1 by default.
                for t in &th.required_affinity {
                    if t.matches(pod, ns_labels) {
                        bump(t, 1);
                    }
                }
                for t in &th.preferred_affinity {
                    if t.matches(pod, ns_labels) {
                        bump(t, t.weight);
                    }
                }
                for t in &th.preferred_anti {
                    if t.matches(pod, ns_labels) {
                        bump(t, -t.weight);
                    }
                }
            }
        }
    }
    if !any {
        return None;
    }
    let raw: Vec<i64> = feasible
        .iter()
        .map(|n| {
            let labels = n.node.as_ref().map(|n| labels_of(&n.metadata.labels));
            labels
                .into_iter()
                .flatten()
                .map(|(k, v)| topo.get(&(k.clone(), v.clone())).copied().unwrap_or(0))
                .sum()
        })
        .collect();
    let min = raw.iter().copied().min().unwrap_or(0);
    let max = raw.iter().copied().max().unwrap_or(0);
    let diff = max - min;
    Some(
        raw.iter()
            .map(|s| {
                if diff > 0 {
                    MAX_NODE_SCORE * (s - min) / diff
                } else {
                    0
                }
            })
            .collect(),
    )
}

/// Queueing hints for assigned-pod events: whether the event may make a pending pod
/// that this plugin rejected schedulable (upstream's isSchedulableAfter* functions).
pub mod hints {
    use super::*;

    fn no_ns_labels(_: &str) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    fn uses_ns_selector(terms: &[Term]) -> bool {
        terms.iter().any(|t| t.ns_selector.is_some())
    }

    /// PodTopologySpread: the pod counts for one of the pending pod's constraints.
    pub fn spread(pending: &Pod, changed: &Pod) -> bool {
        let all = [
            constraints_of(pending, "DoNotSchedule"),
            constraints_of(pending, "ScheduleAnyway"),
        ];
        all.iter().flatten().any(|c| {
            changed.metadata.namespace == pending.metadata.namespace
                && selector_matches(
                    c.selector.as_ref(),
                    &c.match_in,
                    labels_of(&changed.metadata.labels),
                )
        })
    }

    /// InterPodAffinity after a pod was added: it matches the pending pod's required
    /// affinity (adding a pod never satisfies an anti-affinity).
    pub fn affinity_after_add(pending: &Pod, added: &Pod) -> bool {
        let t = terms_of(pending);
        uses_ns_selector(&t.required_affinity)
            || t.required_affinity
                .iter()
                .any(|t| t.matches(added, &no_ns_labels))
    }

    /// InterPodAffinity after a pod went away: it was what the pending pod's
    /// anti-affinity, or its own anti-affinity towards the pending pod, rejected.
    pub fn affinity_after_delete(pending: &Pod, deleted: &Pod) -> bool {
        let mine = terms_of(pending);
        let theirs = terms_of(deleted);
        uses_ns_selector(&mine.required_anti)
            || uses_ns_selector(&theirs.required_anti)
            || mine
                .required_anti
                .iter()
                .any(|t| t.matches(deleted, &no_ns_labels))
            || theirs
                .required_anti
                .iter()
                .any(|t| t.matches(pending, &no_ns_labels))
    }

    /// NodePorts: the deleted pod held a host port the pending pod wants.
    pub fn ports_freed(pending: &Pod, deleted: &Pod) -> bool {
        let want = crate::cache::host_ports(pending);
        crate::cache::host_ports(deleted)
            .iter()
            .any(|h| want.iter().any(|w| ports_conflict(h, w)))
    }
}
