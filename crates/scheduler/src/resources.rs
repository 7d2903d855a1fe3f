//! Resource quantities and a pod's effective requests, as the scheduler counts them
//! (upstream's `resource.Quantity` arithmetic and `resourcehelper.PodRequests`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kumo_apimachinery::quantity::Quantity as Exact;

/// CPU a container without a CPU request counts as when scoring (upstream's
/// `DefaultMilliCPURequest`).
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// Memory a container without a memory request counts as when scoring (200 MiB).
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// An amount of each resource: CPU in millicores, the rest in their base unit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resources {
    /// cpu, in millicores.
    pub milli_cpu: i64,
    /// memory, bytes.
    pub memory: i64,
    /// ephemeral-storage, bytes.
    pub ephemeral_storage: i64,
    /// Pods (only meaningful for allocatable).
    pub allowed_pods: i64,
    /// Extended resources and hugepages, by name.
    pub scalar: BTreeMap<String, i64>,
}

impl Resources {
    /// Adds `o` into self.
    pub fn add(&mut self, o: &Resources) {
        self.milli_cpu += o.milli_cpu;
        self.memory += o.memory;
        self.ephemeral_storage += o.ephemeral_storage;
        for (k, v) in &o.scalar {
            *self.scalar.entry(k.clone()).or_default() += v;
        }
    }

    /// Subtracts `o` from self.
    pub fn sub(&mut self, o: &Resources) {
        self.milli_cpu -= o.milli_cpu;
        self.memory -= o.memory;
        self.ephemeral_storage -= o.ephemeral_storage;
        for (k, v) in &o.scalar {
            *self.scalar.entry(k.clone()).or_default() -= v;
        }
    }

    /// Each resource the larger of self and `o`.
    pub fn max_with(&mut self, o: &Resources) {
        self.milli_cpu = self.milli_cpu.max(o.milli_cpu);
        self.memory = self.memory.max(o.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(o.ephemeral_storage);
        for (k, v) in &o.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
    }

    /// The amount of one named resource (`cpu` in millicores).
    pub fn get(&self, name: &str) -> i64 {
        match name {
            "cpu" => self.milli_cpu,
            "memory" => self.memory,
            "ephemeral-storage" => self.ephemeral_storage,
            "pods" => self.allowed_pods,
            other => self.scalar.get(other).copied().unwrap_or(0),
        }
    }

    /// From a resource list (requests, allocatable).
    pub fn from_list(list: Option<&BTreeMap<String, Quantity>>) -> Resources {
        let mut r = Resources::default();
        for (k, q) in list.into_iter().flatten() {
            match k.as_str() {
                "cpu" => r.milli_cpu = parse_milli(&q.0).unwrap_or(0),
                "memory" => r.memory = parse_value(&q.0).unwrap_or(0),
                "ephemeral-storage" => r.ephemeral_storage = parse_value(&q.0).unwrap_or(0),
                "pods" => r.allowed_pods = parse_value(&q.0).unwrap_or(0),
                other if is_scalar(other) => {
                    r.scalar
                        .insert(other.to_owned(), parse_value(&q.0).unwrap_or(0));
                }
                _ => {}
            }
        }
        r
    }
}

/// Whether the scheduler counts `name` as a scalar resource: extended resources
/// (`domain/name` outside kubernetes.io), hugepages and attachable volumes.
fn is_scalar(name: &str) -> bool {
    name.starts_with("hugepages-")
        || name.starts_with("attachable-volumes-")
        || (name.contains('/') && !name.starts_with("requests."))
}

/// A quantity as a float of its base unit (`100m` → 0.1, `1Ki` → 1024).
pub fn parse_quantity(s: &str) -> Option<f64> {
    Exact::parse(s).map(|q| q.as_f64())
}

/// `Quantity.MilliValue()`: rounded up to a whole milli-unit.
pub fn parse_milli(s: &str) -> Option<i64> {
    Exact::parse(s).and_then(|q| i64::try_from(q.milli_value()).ok())
}

/// `Quantity.Value()`: rounded up to a whole unit.
pub fn parse_value(s: &str) -> Option<i64> {
    Exact::parse(s).and_then(|q| i64::try_from(q.value()).ok())
}

fn container_requests(c: &Container) -> Resources {
    Resources::from_list(c.resources.as_ref().and_then(|r| r.requests.as_ref()))
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The pod's effective request: the larger of the app containers (plus sidecars) and
/// each init container (plus the sidecars started before it), plus the pod overhead.
/// With `non_zero`, a container with no cpu / memory request counts upstream's defaults.
pub fn pod_requests(pod: &Pod, non_zero: bool) -> Resources {
    let Some(spec) = &pod.spec else {
        return Resources::default();
    };
    let req = |c: &Container| {
        let mut r = container_requests(c);
        if non_zero {
            let has = |n: &str| {
                c.resources
                    .as_ref()
                    .and_then(|r| r.requests.as_ref())
                    .is_some_and(|m| m.contains_key(n))
            };
            if !has("cpu") {
                r.milli_cpu = DEFAULT_MILLI_CPU_REQUEST;
            }
            if !has("memory") {
                r.memory = DEFAULT_MEMORY_REQUEST;
            }
        }
        r
    };
    let mut total = Resources::default();
    for c in &spec.containers {
        total.add(&req(c));
    }
    let mut sidecars = Resources::default();
    let mut init_max = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let r = req(c);
        if is_sidecar(c) {
            total.add(&r);
            sidecars.add(&r);
            init_max.max_with(&sidecars);
        } else {
            let mut x = r;
            x.add(&sidecars);
            init_max.max_with(&x);
        }
    }
    total.max_with(&init_max);
    if let Some(o) = &spec.overhead {
        total.add(&Resources::from_list(Some(o)));
    }
    total
}

/// The node's allocatable resources (capacity when allocatable is absent, as the
/// kubelet reports both).
pub fn allocatable(node: &Node) -> Resources {
    let st = node.status.as_ref();
    let list = st
        .and_then(|s| s.allocatable.as_ref())
        .or_else(|| st.and_then(|s| s.capacity.as_ref()));
    Resources::from_list(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_milli("100m"), Some(100));
        assert_eq!(parse_milli("1.5"), Some(1500));
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_value("2Gi"), Some(2 * 1024 * 1024 * 1024));
        assert_eq!(parse_value("1k"), Some(1000));
        assert_eq!(parse_value("1e3"), Some(1000));
        assert_eq!(parse_value("129M"), Some(129_000_000));
        assert_eq!(parse_value("x"), None);
    }

    #[test]
    fn init_containers_and_overhead() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "200m"}}}
                ],
                "initContainers": [
                    {"name": "i", "resources": {"requests": {"cpu": "1", "memory": "100Mi"}}}
                ],
                "overhead": {"cpu": "50m"}
            }
        }))
        .expect("pod");
        let r = pod_requests(&pod, false);
        assert_eq!(r.milli_cpu, 1050);
        assert_eq!(r.memory, 1024 * 1024 * 1024);
        let nz = pod_requests(&pod, true);
        // Container b has no memory request: 200 MiB when scoring.
        assert_eq!(nz.memory, 1024 * 1024 * 1024 + 200 * 1024 * 1024);
    }
}
