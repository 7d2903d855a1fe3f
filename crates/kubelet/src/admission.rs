//! Pod admission: what the kubelet checks before it runs a pod bound to its node, as
//! upstream's predicate admit handler does with the scheduler's own predicates (here
//! kumo-scheduler's): resources against what the admitted pods request, the node
//! selector and required node affinity, the node name, host ports, and NoExecute taints
//! the pod does not tolerate. A rejected pod is never started: it fails with the first
//! reason (`OutOfcpu`, `NodePorts`, ...) and `Pod was rejected: <message>`.

use k8s_openapi::api::core::v1::{Node, Pod};
use kumo_scheduler::cache::{host_ports, ports_conflict};
use kumo_scheduler::helpers::{pod_matches_node_selector_and_affinity, tolerates};
use kumo_scheduler::resources::{pod_requests, Resources};

/// Why a pod may not run here: the event reason and its message (upstream's
/// PodAdmitResult).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

impl Rejection {
    fn predicate(name: &str, desc: &str) -> Rejection {
        Rejection {
            reason: name.to_owned(),
            message: format!("Predicate {name} failed: {desc}"),
        }
    }
}

/// Checks `pod` against `node` and the pods already admitted there (`admitted`, this
/// kubelet's running ones). Static pods skip the taint check, as upstream.
pub fn admit(pod: &Pod, node: &Node, admitted: &[Pod], is_static: bool) -> Result<(), Rejection> {
    fit_resources(pod, node, admitted)?;
    if !pod_matches_node_selector_and_affinity(pod, node) {
        return Err(Rejection::predicate(
            "NodeAffinity",
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    let node_name = node.metadata.name.as_deref().unwrap_or("");
    let wanted = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("");
    if !wanted.is_empty() && wanted != node_name {
        return Err(Rejection::predicate(
            "NodeName",
            "node(s) didn't match the requested node name",
        ));
    }
    let mine = host_ports(pod);
    if !mine.is_empty() {
        let taken: Vec<_> = admitted.iter().flat_map(host_ports).collect();
        if mine
            .iter()
            .any(|p| taken.iter().any(|t| ports_conflict(p, t)))
        {
            return Err(Rejection::predicate(
                "NodePorts",
                "node(s) didn't have free ports for the requested pod ports",
            ));
        }
    }
    if !is_static {
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or(&[]);
        let untolerated = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or(&[])
            .iter()
            .filter(|t| t.effect == "NoExecute")
            .any(|t| !tolerations.iter().any(|tol| tolerates(tol, t)));
        if untolerated {
            return Err(Rejection::predicate(
                "TaintToleration",
                "node(s) had taints that the pod didn't tolerate",
            ));
        }
    }
    Ok(())
}

/// The resource check (upstream's noderesources.Fits): the pod count first, then each
/// resource the pod requests against the node's allocatable less what the admitted pods
/// request.
fn fit_resources(pod: &Pod, node: &Node, admitted: &[Pod]) -> Result<(), Rejection> {
    let allocatable =
        Resources::from_list(node.status.as_ref().and_then(|s| s.allocatable.as_ref()));
    let insufficient = |name: &str, requested: i64, used: i64, capacity: i64| {
        Rejection {
        // OutOfcpu, OutOfmemory, OutOfpods, and the same prefix for extended resources.
        reason: format!("OutOf{name}"),
        message: format!(
            "Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
    };
    let count = i64::try_from(admitted.len()).unwrap_or(i64::MAX);
    if allocatable.allowed_pods > 0 && count + 1 > allocatable.allowed_pods {
        return Err(insufficient("pods", 1, count, allocatable.allowed_pods));
    }
    let want = pod_requests(pod, false);
    let mut used = Resources::default();
    for p in admitted {
        used.add(&pod_requests(p, false));
    }
    for (name, w, u, cap) in [
        ("cpu", want.milli_cpu, used.milli_cpu, allocatable.milli_cpu),
        ("memory", want.memory, used.memory, allocatable.memory),
        (
            "ephemeral-storage",
            want.ephemeral_storage,
            used.ephemeral_storage,
            allocatable.ephemeral_storage,
        ),
    ] {
        if w > 0 && w > cap - u {
            return Err(insufficient(name, w, u, cap));
        }
    }
    for (name, w) in &want.scalar {
        let cap = allocatable.get(name);
        let u = used.get(name);
        if *w > 0 && *w > cap - u {
            return Err(insufficient(name, *w, u, cap));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node() -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"disk": "ssd"}},
            "spec": {"taints": [{"key": "maint", "effect": "NoExecute"}, {"key": "soft", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "2", "memory": "1Gi", "pods": "3"}}
        }))
        .unwrap_or_default()
    }

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["nodeName"] = json!("n1");
        spec["tolerations"] = json!([{"key": "maint", "operator": "Exists"}]);
        if spec.get("containers").is_none() {
            spec["containers"] = json!([{"name": "c", "image": "nginx"}]);
        }
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap_or_default()
    }

    #[test]
    fn rejections_say_what_upstream_says() {
        let n = node();
        assert_eq!(admit(&pod(json!({})), &n, &[], false), Ok(()));
        let big = pod(json!({"containers": [{"name": "c", "image": "nginx",
            "resources": {"requests": {"cpu": "1500m"}}}]}));
        assert_eq!(admit(&big, &n, &[], false), Ok(()));
        let err = admit(&big, &n, std::slice::from_ref(&big), false).unwrap_err();
        assert_eq!(err.reason, "OutOfcpu");
        assert_eq!(
            err.message,
            "Node didn't have enough resource: cpu, requested: 1500, used: 1500, capacity: 2000"
        );
        let three = vec![pod(json!({})), pod(json!({})), pod(json!({}))];
        let err = admit(&pod(json!({})), &n, &three, false).unwrap_err();
        assert_eq!(err.reason, "OutOfpods");
        let err = admit(
            &pod(json!({"nodeSelector": {"disk": "hdd"}})),
            &n,
            &[],
            false,
        )
        .unwrap_err();
        assert_eq!(
            err,
            Rejection {
                reason: "NodeAffinity".into(),
                message: "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector".into()
            }
        );
        let port = |ip: &str| {
            pod(json!({"containers": [{"name": "c", "image": "nginx",
                "ports": [{"containerPort": 80, "hostPort": 8080, "hostIP": ip}]}]}))
        };
        let err = admit(&port(""), &n, &[port("10.0.0.1")], false).unwrap_err();
        assert_eq!(err.reason, "NodePorts");
        assert_eq!(
            err.message,
            "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
        );
        assert_eq!(
            admit(&port("10.0.0.2"), &n, &[port("10.0.0.1")], false),
            Ok(())
        );
        let mut untolerant = pod(json!({}));
        if let Some(s) = untolerant.spec.as_mut() {
            s.tolerations = None;
        }
        assert_eq!(
            admit(&untolerant, &n, &[], false).unwrap_err().reason,
            "TaintToleration"
        );
        assert_eq!(admit(&untolerant, &n, &[], true), Ok(()));
    }
}
