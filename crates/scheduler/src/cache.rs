//! The scheduler's cache: every node with the pods assigned to it (upstream's
//! `internal/cache`), kept by the informers' handlers, plus pods the scheduler has
//! assumed onto a node while their binding is in flight. A scheduling cycle works on a
//! [`Snapshot`]: cheap clones of the per-node entries.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::helpers::{pod_key, priority};
use crate::resources::{allocatable, pod_requests, Resources};

/// A host port a pod uses: (hostIP, protocol, port).
pub type HostPort = (String, String, i32);

/// A pod with what the plugins keep asking about it, computed once.
#[derive(Debug)]
pub struct PodInfo {
    /// `namespace/name`.
    pub key: String,
    /// The pod.
    pub pod: Arc<Pod>,
    /// Its effective requests.
    pub requests: Resources,
    /// Its requests with upstream's non-zero defaults (for scoring).
    pub non_zero: Resources,
    /// Host ports of its containers.
    pub ports: Vec<HostPort>,
    /// spec.priority.
    pub priority: i32,
}

impl PodInfo {
    /// Computes the info of `pod`.
    pub fn new(pod: Arc<Pod>) -> PodInfo {
        PodInfo {
            key: pod_key(&pod),
            requests: pod_requests(&pod, false),
            non_zero: pod_requests(&pod, true),
            ports: host_ports(&pod),
            priority: priority(&pod),
            pod,
        }
    }

    /// Whether the pod has any (anti-)affinity the InterPodAffinity plugin looks at.
    pub fn has_pod_affinity(&self) -> bool {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .is_some_and(|a| a.pod_affinity.is_some() || a.pod_anti_affinity.is_some())
    }
}

/// The host ports a pod's containers ask for (hostIP defaults to 0.0.0.0, protocol to TCP).
pub fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let mut out = Vec::new();
    let Some(spec) = &pod.spec else { return out };
    for c in &spec.containers {
        for p in c.ports.iter().flatten() {
            if let Some(hp) = p.host_port.filter(|p| *p > 0) {
                let ip = p
                    .host_ip
                    .clone()
                    .filter(|i| !i.is_empty())
                    .unwrap_or_else(|| "0.0.0.0".into());
                let proto = p
                    .protocol
                    .clone()
                    .filter(|i| !i.is_empty())
                    .unwrap_or_else(|| "TCP".into());
                out.push((ip, proto, hp));
            }
        }
    }
    out
}

/// Whether two host ports collide (same protocol and port, and the same or a wildcard IP).
pub fn ports_conflict(a: &HostPort, b: &HostPort) -> bool {
    a.1 == b.1 && a.2 == b.2 && (a.0 == b.0 || a.0 == "0.0.0.0" || b.0 == "0.0.0.0")
}

/// One node and the pods on it.
#[derive(Clone, Debug, Default)]
pub struct NodeInfo {
    /// The node; None while only pods naming it have been seen.
    pub node: Option<Arc<Node>>,
    /// Its allocatable resources.
    pub allocatable: Resources,
    /// The pods on it, by key.
    pub pods: BTreeMap<String, Arc<PodInfo>>,
    /// The sum of their requests.
    pub requested: Resources,
    /// The sum of their non-zero requests.
    pub non_zero_requested: Resources,
    /// How many of them have pod (anti-)affinity, so cycles can skip the other nodes.
    pub with_affinity: usize,
}

impl NodeInfo {
    /// The node's name.
    pub fn name(&self) -> &str {
        self.node
            .as_ref()
            .and_then(|n| n.metadata.name.as_deref())
            .unwrap_or_default()
    }

    pub(crate) fn add_pod(&mut self, p: Arc<PodInfo>) {
        self.requested.add(&p.requests);
        self.non_zero_requested.add(&p.non_zero);
        self.with_affinity += usize::from(p.has_pod_affinity());
        if let Some(old) = self.pods.insert(p.key.clone(), p) {
            self.forget_counts(&old);
        }
    }

    fn forget_counts(&mut self, old: &PodInfo) {
        self.requested.sub(&old.requests);
        self.non_zero_requested.sub(&old.non_zero);
        self.with_affinity -= usize::from(old.has_pod_affinity());
    }

    fn remove_pod(&mut self, key: &str) {
        if let Some(old) = self.pods.remove(key) {
            self.forget_counts(&old);
        }
    }

    /// A copy with `victims` removed (for the preemption dry run).
    pub fn without(&self, victims: &[String]) -> NodeInfo {
        let mut n = self.clone();
        for v in victims {
            n.remove_pod(v);
        }
        n
    }
}

/// The nodes a cycle schedules against.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Nodes in name order.
    pub nodes: Vec<Arc<NodeInfo>>,
    /// How many nodes have each (normalized) image.
    pub image_nodes: HashMap<String, usize>,
}

/// The cache proper.
#[derive(Default)]
pub struct Cache {
    nodes: BTreeMap<String, Arc<NodeInfo>>,
    pod_node: HashMap<String, String>,
    assumed: HashSet<String>,
}

/// Whether a pod counts against its node: assigned and not finished.
pub fn counts(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded") | Some("Failed"))
        && pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
}

impl Cache {
    /// Adds or replaces a node.
    pub fn set_node(&mut self, node: Arc<Node>) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let e = self.nodes.entry(name).or_default();
        let ni = Arc::make_mut(e);
        ni.allocatable = allocatable(&node);
        ni.node = Some(node);
    }

    /// Removes a node (its pods stay until they are deleted, as upstream).
    pub fn remove_node(&mut self, name: &str) {
        if let Some(e) = self.nodes.get_mut(name) {
            let ni = Arc::make_mut(e);
            ni.node = None;
            if ni.pods.is_empty() {
                self.nodes.remove(name);
            }
        }
    }

    /// Adds, updates or (when it no longer counts) removes an assigned pod.
    pub fn set_pod(&mut self, pod: Arc<Pod>) {
        let key = pod_key(&pod);
        if !counts(&pod) {
            self.remove_pod(&key);
            return;
        }
        self.assumed.remove(&key);
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if let Some(old) = self.pod_node.get(&key).cloned() {
            if old != node {
                self.remove_pod(&key);
            }
        }
        self.pod_node.insert(key, node.clone());
        let e = self.nodes.entry(node).or_default();
        Arc::make_mut(e).add_pod(Arc::new(PodInfo::new(pod)));
    }

    /// Removes a pod from its node.
    pub fn remove_pod(&mut self, key: &str) {
        self.assumed.remove(key);
        if let Some(node) = self.pod_node.remove(key) {
            if let Some(e) = self.nodes.get_mut(&node) {
                let ni = Arc::make_mut(e);
                ni.remove_pod(key);
                if ni.node.is_none() && ni.pods.is_empty() {
                    self.nodes.remove(&node);
                }
            }
        }
    }

    /// Counts a pod against `node` before its binding is confirmed.
    pub fn assume(&mut self, pod: &Pod, node: &str) {
        let mut p = pod.clone();
        if let Some(s) = p.spec.as_mut() {
            s.node_name = Some(node.to_owned());
        }
        let key = pod_key(&p);
        self.set_pod(Arc::new(p));
        self.assumed.insert(key);
    }

    /// Drops an assumed pod whose binding failed.
    pub fn forget(&mut self, key: &str) {
        if self.assumed.contains(key) {
            self.remove_pod(key);
        }
    }

    /// The nodes as they are now.
    pub fn snapshot(&self) -> Snapshot {
        let mut image_nodes: HashMap<String, usize> = HashMap::new();
        let nodes: Vec<Arc<NodeInfo>> = self
            .nodes
            .values()
            .filter(|n| n.node.is_some())
            .cloned()
            .collect();
        for n in &nodes {
            let mut seen = HashSet::new();
            let images = n
                .node
                .as_ref()
                .and_then(|n| n.status.as_ref())
                .and_then(|s| s.images.as_ref());
            for img in images.into_iter().flatten() {
                for name in img.names.iter().flatten() {
                    let norm = normalize_image(name);
                    if seen.insert(norm.clone()) {
                        *image_nodes.entry(norm).or_default() += 1;
                    }
                }
            }
        }
        Snapshot { nodes, image_nodes }
    }
}

/// An image name as the ImageLocality plugin compares them: with the default registry
/// and the `latest` tag when they are left out.
pub fn normalize_image(name: &str) -> String {
    let mut n = name.to_owned();
    let last = n.rsplit('/').next().unwrap_or_default();
    if !last.contains(':') && !last.contains('@') {
        n.push_str(":latest");
    }
    let first = n.split('/').next().unwrap_or_default();
    let has_registry =
        n.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if !has_registry {
        if n.contains('/') {
            n = format!("docker.io/{n}");
        } else {
            n = format!("docker.io/library/{n}");
        }
    }
    n
}
