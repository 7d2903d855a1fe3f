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
