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
