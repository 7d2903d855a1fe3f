//! The sandbox the kubelet asks the runtime for, per pod (upstream's
//! generatePodSandboxConfig): metadata, host name, resolver, host ports, namespaces,
//! sysctls and the pod's cgroup.

use std::collections::BTreeMap;

use kumo_cri::{DnsConfig, PortMapping, SandboxConfig};
use serde_json::Value;

fn str_at(v: &Value, p: &str) -> String {
    v.pointer(p)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

fn flag(v: &Value, p: &str) -> bool {
    v.pointer(p).and_then(Value::as_bool).unwrap_or(false)
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// The pod's cgroup under `cgroup_root` (`--cgroup-root`), by its QoS class as the
/// cgroupfs driver names it: `kubepods/pod<uid>` (Guaranteed), `kubepods/burstable/...`,
/// `kubepods/besteffort/...`.
pub fn cgroup_parent(pod: &Value, cgroup_root: &str) -> String {
    let qos = match str_at(pod, "/status/qosClass").as_str() {
        "Guaranteed" => "",
        "BestEffort" => "besteffort/",
        _ => "burstable/",
    };
    format!(
        "{}/kubepods/{qos}pod{}",
        cgroup_root.trim_end_matches('/'),
        str_at(pod, "/metadata/uid")
    )
}

/// The sandbox of `pod` (its resolver: `cluster_dns` for ClusterFirst).
pub fn config(pod: &Value, cgroup_root: &str, cluster_dns: &[String]) -> SandboxConfig {
    let host_network = flag(pod, "/spec/hostNetwork");
    // A host-network pod keeps the node's host name: the runtime cannot set one without a
    // UTS namespace of its own.
    let hostname = if host_network {
        String::new()
    } else {
        let mut h = str_at(pod, "/spec/hostname");
        if h.is_empty() {
            h = str_at(pod, "/metadata/name");
            h.truncate(63);
        }
        h
    };
    let mut labels = string_map(pod.pointer("/metadata/labels"));
    for (k, p) in [
        ("io.kubernetes.pod.name", "/metadata/name"),
        ("io.kubernetes.pod.namespace", "/metadata/namespace"),
        ("io.kubernetes.pod.uid", "/metadata/uid"),
    ] {
        labels.insert(k.into(), str_at(pod, p));
    }
    let port_mappings = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|c| {
            c.get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .filter_map(|p| {
            let host_port = p.get("hostPort")?.as_u64().filter(|&h| h > 0)?;
            Some(PortMapping {
                protocol: match p.get("protocol").and_then(Value::as_str) {
                    Some(proto) => proto.to_owned(),
                    None => "TCP".into(),
                },
                container_port: p.get("containerPort")?.as_u64()? as u16,
                host_port: host_port as u16,
                host_ip: str_at(p, "/hostIP"),
            })
        })
        .collect();
    let sysctls = pod
        .pointer("/spec/securityContext/sysctls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|s| (str_at(s, "/name"), str_at(s, "/value")))
        .collect();
    let dns_policy = str_at(pod, "/spec/dnsPolicy");
    // A host-network pod with the default policy uses the node's resolver as it is.
    let node_resolver = host_network
        && !matches!(dns_policy.as_str(), "ClusterFirstWithHostNet" | "None")
        && pod.pointer("/spec/dnsConfig").is_none();
    SandboxConfig {
        name: str_at(pod, "/metadata/name"),
        namespace: str_at(pod, "/metadata/namespace"),
        uid: str_at(pod, "/metadata/uid"),
        attempt: 0,
        hostname,
        dns: (!node_resolver).then(|| {
            DnsConfig::from_resolv_conf(&crate::resolv::pod_resolv_conf(pod, cluster_dns))
        }),
        port_mappings,
        labels,
        annotations: string_map(pod.pointer("/metadata/annotations")),
        host_network,
        host_pid: flag(pod, "/spec/hostPID"),
        host_ipc: flag(pod, "/spec/hostIPC"),
        privileged: ["initContainers", "containers", "ephemeralContainers"]
            .iter()
            .flat_map(|k| {
                pod.pointer(&format!("/spec/{k}"))
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
            })
            .any(|c| flag(c, "/securityContext/privileged")),
        sysctls,
        cgroup_parent: cgroup_parent(pod, cgroup_root),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_becomes_the_sandbox_upstream_asks_for() {
        let pod = json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}]}]},
            "status": {"qosClass": "BestEffort"}
        });
        let c = config(&pod, "/kumo/n1", &["10.96.0.10".into()]);
        assert_eq!(c.hostname, "web");
        assert_eq!(c.cgroup_parent, "/kumo/n1/kubepods/besteffort/podu1");
        assert!(!c.privileged);
        assert_eq!(c.labels["io.kubernetes.pod.uid"], "u1");
        assert_eq!(c.labels["app"], "web");
        assert_eq!(
            c.port_mappings,
            [PortMapping {
                protocol: "TCP".into(),
                container_port: 80,
                host_port: 8080,
                host_ip: String::new()
            }]
        );
        let dns = c.dns.expect("cluster DNS");
        assert_eq!(dns.servers, ["10.96.0.10"]);
        assert_eq!(dns.searches[0], "default.svc.cluster.local");
        assert!(dns.options.contains(&"ndots:5".to_owned()));

        let host = json!({"metadata": {"name": "h", "uid": "u2"}, "spec": {"hostNetwork": true,
            "initContainers": [{"name": "i", "securityContext": {"privileged": true}}]},
            "status": {"qosClass": "Guaranteed"}});
        let c = config(&host, "/", &["10.96.0.10".into()]);
        assert!(c.privileged);
        assert_eq!(c.hostname, "");
        assert!(c.dns.is_none());
        assert_eq!(c.cgroup_parent, "/kubepods/podu2");
    }
}
