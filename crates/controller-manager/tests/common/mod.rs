//! Shared by the controller-manager tests: an in-process API server on a temporary
//! directory, the controller-manager against it, and the real kubectl.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use kumo_apiserver::{ApiServer, ApiServerConfig};
use kumo_controller_manager::{Config, ControllerManager};
pub use kumo_testkit::kubectl::*;

pub async fn start_apiserver() -> (ApiServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ApiServerConfig::new(dir.path());
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let server = ApiServer::start(cfg).await.unwrap();
    (server, dir)
}

/// A controller-manager config for tests: /healthz on a free loopback port.
pub fn cm_config(kubeconfig: &Path, controllers: &[&str]) -> Config {
    let mut cfg = Config::new(kubeconfig);
    cfg.controllers = controllers.iter().map(|s| s.to_string()).collect();
    cfg.serve = Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0));
    cfg
}

pub async fn start_cm(kubeconfig: &Path, controllers: &[&str]) -> ControllerManager {
    ControllerManager::start(cm_config(kubeconfig, controllers))
        .await
        .unwrap()
}

/// The live pods (not being deleted) in `ns` matching `selector`, as JSON items.
pub async fn pods(kc: &Path, ns: &str, selector: &str) -> Vec<serde_json::Value> {
    let v = get(kc, &["pods", "-n", ns, "-l", selector]).await.unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .cloned()
        .collect()
}

/// Waits until exactly `n` live pods in `ns` match `selector`.
pub async fn wait_pods(kc: &Path, ns: &str, selector: &str, n: usize) -> Vec<serde_json::Value> {
    eventually(30, &format!("{n} pods with {selector}"), || async {
        let p = pods(kc, ns, selector).await;
        (p.len() == n).then_some(p)
    })
    .await
}

/// The messages of the core/v1 events in `ns` with `reason` about the object `name`.
pub async fn events(kc: &Path, ns: &str, name: &str, reason: &str) -> Vec<String> {
    let v = get(kc, &["events", "-n", ns]).await.unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["name"] == name && e["reason"] == reason)
        .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
        .collect()
}
