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

/// The nodes a cycle schedules against. Cloning it is two reference counts: the cache
/// keeps it up to date node by node (upstream's incremental snapshot), so a cycle does not
/// copy thousands of node entries.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Nodes in name order.
    pub nodes: Arc<Vec<Arc<NodeInfo>>>,
    /// How many nodes have each (normalized) image.
    pub image_nodes: Arc<HashMap<String, usize>>,
}

/// The cache proper.
#[derive(Default)]
pub struct Cache {
    nodes: BTreeMap<String, Arc<NodeInfo>>,
    pod_node: HashMap<String, String>,
    assumed: HashSet<String>,
    /// The snapshot as of the last change, with each node's position in it; rebuilt when
    /// `nodes_changed` (a node came or went), its images when `images_changed`.
    snap: Snapshot,
    position: HashMap<String, usize>,
    nodes_changed: bool,
    images_changed: bool,
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

/// A node's image names, as the snapshot counts them.
fn images(node: Option<&Node>) -> Option<&Vec<k8s_openapi::api::core::v1::ContainerImage>> {
    node.and_then(|n| n.status.as_ref())
        .and_then(|s| s.images.as_ref())
}

impl Cache {
    /// Adds or replaces a node.
    /// The node named `name`, if known.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(name).and_then(|n| n.node.clone())
    }

    pub fn set_node(&mut self, node: Arc<Node>) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let e = self.nodes.entry(name.clone()).or_default();
        let ni = Arc::make_mut(e);
        if images(ni.node.as_deref()) != images(Some(&node)) {
            self.images_changed = true;
        }
        ni.allocatable = allocatable(&node);
        ni.node = Some(node);
        self.touch(&name);
    }

    /// Removes a node (its pods stay until they are deleted, as upstream).
    pub fn remove_node(&mut self, name: &str) {
        if let Some(e) = self.nodes.get_mut(name) {
            let ni = Arc::make_mut(e);
            ni.node = None;
            if ni.pods.is_empty() {
                self.nodes.remove(name);
            }
            self.images_changed = true;
            self.touch(name);
        }
    }

    /// Brings the snapshot's entry of `name` up to date, or marks the snapshot for a
    /// rebuild when the node joined or left it.
    fn touch(&mut self, name: &str) {
        if self.nodes_changed {
            return;
        }
        let entry = self.nodes.get(name).filter(|n| n.node.is_some());
        match (self.position.get(name), entry) {
            (Some(&i), Some(e)) => Arc::make_mut(&mut self.snap.nodes)[i] = e.clone(),
            (None, None) => {}
            _ => self.nodes_changed = true,
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
        let e = self.nodes.entry(node.clone()).or_default();
        Arc::make_mut(e).add_pod(Arc::new(PodInfo::new(pod)));
        self.touch(&node);
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
                self.touch(&node);
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
    pub fn snapshot(&mut self) -> Snapshot {
        if self.nodes_changed {
            let nodes: Vec<Arc<NodeInfo>> = self
                .nodes
                .values()
                .filter(|n| n.node.is_some())
                .cloned()
                .collect();
            self.position = nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name().to_owned(), i))
                .collect();
            self.snap.nodes = Arc::new(nodes);
            self.nodes_changed = false;
            self.images_changed = true;
        }
        if self.images_changed {
            let mut image_nodes: HashMap<String, usize> = HashMap::new();
            for n in self.snap.nodes.iter() {
                let mut seen = HashSet::new();
                for img in images(n.node.as_deref()).into_iter().flatten() {
                    for name in img.names.iter().flatten() {
                        let norm = normalize_image(name);
                        if seen.insert(norm.clone()) {
                            *image_nodes.entry(norm).or_default() += 1;
                        }
                    }
                }
            }
            self.snap.image_nodes = Arc::new(image_nodes);
            self.images_changed = false;
        }
        self.snap.clone()
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn node(name: &str, images: &[&str]) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "status": {
                    "allocatable": {"cpu": "4", "pods": "110"},
                    "images": images.iter().map(|i| serde_json::json!({"names": [i]})).collect::<Vec<_>>(),
                },
            }))
            .unwrap(),
        )
    }

    fn pod(name: &str, node: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        }))
        .unwrap()
    }

    fn names(s: &Snapshot) -> Vec<(String, usize)> {
        s.nodes
            .iter()
            .map(|n| (n.name().to_owned(), n.pods.len()))
            .collect()
    }

    #[test]
    fn the_snapshot_follows_every_change_and_a_taken_one_stays_as_it_was() {
        let mut c = Cache::default();
        c.set_node(node("b", &["nginx"]));
        c.set_node(node("a", &[]));
        let first = c.snapshot();
        assert_eq!(names(&first), [("a".into(), 0), ("b".into(), 0)]);
        assert_eq!(
            first.image_nodes.get("docker.io/library/nginx:latest"),
            Some(&1)
        );

        // A pod assumed and then confirmed, one on a node not known yet.
        c.assume(&pod("p1", "b"), "b");
        c.set_pod(Arc::new(pod("p1", "b")));
        c.set_pod(Arc::new(pod("p2", "c")));
        let second = c.snapshot();
        assert_eq!(names(&second), [("a".into(), 0), ("b".into(), 1)]);
        assert_eq!(second.nodes[1].requested.get("cpu"), 1000);
        assert_eq!(names(&first), [("a".into(), 0), ("b".into(), 0)]);

        // Node c arrives (with its pod), b loses its image, a goes.
        c.set_node(node("c", &["nginx"]));
        c.set_node(node("b", &[]));
        c.remove_node("a");
        let third = c.snapshot();
        assert_eq!(names(&third), [("b".into(), 1), ("c".into(), 1)]);
        assert_eq!(
            third.image_nodes.get("docker.io/library/nginx:latest"),
            Some(&1)
        );

        // Pods leave.
        c.remove_pod("ns/p1");
        c.forget("ns/p2");
        c.set_pod(Arc::new(pod("p2", "")));
        assert_eq!(names(&c.snapshot()), [("b".into(), 0), ("c".into(), 0)]);
    }
}
