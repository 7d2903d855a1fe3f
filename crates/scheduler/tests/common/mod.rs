//! Shared by the scheduler tests: an in-process API server on a temporary
//! directory, the scheduler against it, and the real kubectl.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use kumo_apiserver::{ApiServer, ApiServerConfig};
use kumo_scheduler::{Config, Scheduler};
pub use kumo_testkit::kubectl::*;

pub async fn start_apiserver() -> (ApiServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ApiServerConfig::new(dir.path());
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let server = ApiServer::start(cfg).await.unwrap();
    // No controller-manager runs here: the ServiceAccount admission needs `default`.
    let out = k(
        &server.admin_kubeconfig,
        &["create", "serviceaccount", "default"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    (server, dir)
}

/// A scheduler config for tests: /healthz on a free loopback port.
pub fn sched_config(kubeconfig: &Path, leader_elect: bool) -> Config {
    let mut cfg = Config::new(kubeconfig);
    cfg.leader_elect = leader_elect;
    cfg.serve = Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0));
    cfg
}

pub async fn start_scheduler(kubeconfig: &Path, leader_elect: bool) -> Scheduler {
    Scheduler::start(sched_config(kubeconfig, leader_elect))
        .await
        .unwrap()
}

/// Creates a Ready node with allocatable cpu/memory/pods, labels and taints.
pub async fn node(
    kubeconfig: &Path,
    name: &str,
    cpu: &str,
    memory: &str,
    labels: &[(&str, &str)],
    taints: &str,
) {
    let mut l = serde_json::json!({"kubernetes.io/hostname": name});
    for (k, v) in labels {
        l[*k] = serde_json::json!(v);
    }
    let taints: serde_json::Value = if taints.is_empty() {
        serde_json::json!([])
    } else {
        serde_json::from_str(taints).unwrap()
    };
    let obj = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": l},
        "spec": {"taints": taints},
    });
    let out = k_in(kubeconfig, &["create", "-f", "-"], Some(&obj.to_string())).await;
    assert!(out.ok, "{}", out.stderr);
    let status = serde_json::json!({"status": {
        "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
        "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}],
    }});
    let out = k(
        kubeconfig,
        &[
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    // TaintNodesByCondition admission adds the not-ready taint at creation; the
    // node-lifecycle controller (not running here) removes it once the node is Ready.
    let node = get(kubeconfig, &["node", name]).await.unwrap();
    let keep: Vec<serde_json::Value> = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t["key"] != "node.kubernetes.io/not-ready")
        .collect();
    let patch = serde_json::json!({"spec": {"taints": keep}});
    let out = k(
        kubeconfig,
        &[
            "patch",
            "node",
            name,
            "--type=merge",
            "-p",
            &patch.to_string(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

/// `kubectl run` with extra pod spec fields merged in (--overrides).
pub async fn pod(kubeconfig: &Path, name: &str, overrides: serde_json::Value) {
    let out = k(
        kubeconfig,
        &[
            "run",
            name,
            "--image=nginx",
            &format!("--overrides={overrides}"),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

/// The node a pod is bound to, if any.
pub async fn node_of(kubeconfig: &Path, pod: &str) -> Option<String> {
    let p = get(kubeconfig, &["pod", pod]).await?;
    p["spec"]["nodeName"].as_str().map(str::to_owned)
}

/// The notes of the events.k8s.io events about a pod with this reason.
pub async fn event_notes(kubeconfig: &Path, pod: &str, reason: &str) -> Vec<String> {
    let out = k(kubeconfig, &["get", "events.events.k8s.io", "-o", "json"]).await;
    let v = json(&out);
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == reason && e["regarding"]["name"] == pod)
        .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
        .collect()
}
