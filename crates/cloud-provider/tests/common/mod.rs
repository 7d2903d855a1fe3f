//! Shared by the cloud-controller-manager tests: an in-process API server and kumo cloud on
//! a temporary directory, the CCM against both with its own identity
//! (`cloud-controller-manager.conf`, the `system:cloud-controller-manager` ClusterRole), and
//! the real kubectl.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kumo_apiserver::{ApiServer, ApiServerConfig};
use kumo_cloud::{CloudConfig, CloudServer, Instance, InstanceState, RunInstanceRequest};
use kumo_cloud_provider::ccm::{CloudControllerManager, Config};
use kumo_cloud_provider::kumo::KumoCloud;
pub use kumo_testkit::kubectl::*;

/// The API server, the cloud and their files.
pub struct Env {
    pub api: ApiServer,
    pub cloud: CloudServer,
    /// A client of the cloud with the admin's credentials.
    pub cloud_client: kumo_cloud::Client,
    /// The admin kubeconfig.
    pub admin: PathBuf,
    /// The CCM's kubeconfig (user `system:cloud-controller-manager`).
    pub ccm_kubeconfig: PathBuf,
    pub dir: tempfile::TempDir,
}

/// Starts the API server and the cloud (instances are records only) and installs the CCM's
/// RBAC.
pub async fn start() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ApiServerConfig::new(dir.path().join("cluster"));
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let api = ApiServer::start(cfg).await.unwrap();
    let cloud = CloudServer::start(CloudConfig::new(dir.path().join("cloud")))
        .await
        .expect("cloud starts");
    let cloud_client = cloud.client().expect("cloud client");
    let admin = api.admin_kubeconfig.clone();
    let ccm_kubeconfig = dir
        .path()
        .join("cluster")
        .join("cloud-controller-manager.conf");
    let kc = kube::config::Kubeconfig::read_from(&admin).unwrap();
    let kcfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(kcfg).unwrap();
    kumo_cloud_provider::ccm::rbac::ensure(&client)
        .await
        .unwrap();
    Env {
        api,
        cloud,
        cloud_client,
        admin,
        ccm_kubeconfig,
        dir,
    }
}

/// A CCM config for tests: /healthz on a free loopback port, no leader election, node
/// CIDRs allocated from 10.244.0.0/16, the given controllers.
pub fn ccm_config(env: &Env, controllers: &[&str]) -> Config {
    let mut cfg = Config::new(&env.ccm_kubeconfig);
    cfg.controllers = controllers.iter().map(|s| s.to_string()).collect();
    cfg.serve = Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0));
    cfg.leader_elect = false;
    cfg.allocate_node_cidrs = true;
    cfg.cluster_cidr = Some("10.244.0.0/16".into());
    cfg
}

/// Starts a CCM with `cfg` on the kumo cloud (with the admin's cloud credentials).
pub async fn start_ccm_with(env: &Env, cfg: Config) -> CloudControllerManager {
    let cloud = Arc::new(KumoCloud::new(env.cloud_client.clone()));
    CloudControllerManager::start(cfg, cloud).await.unwrap()
}

/// Starts a CCM with the test defaults and `controllers`.
pub async fn start_ccm(env: &Env, controllers: &[&str]) -> CloudControllerManager {
    start_ccm_with(env, ccm_config(env, controllers)).await
}

/// Runs an instance named `name` in `zone` (None: the cloud's choice) and waits until it
/// is running.
pub async fn run_instance(env: &Env, name: &str, zone: Option<&str>) -> Instance {
    let req = RunInstanceRequest {
        name: Some(name.into()),
        zone: zone.map(Into::into),
        ..Default::default()
    };
    let i = env
        .cloud_client
        .run_instance(&req)
        .await
        .expect("run instance");
    env.cloud_client
        .wait_for_instance_state(&i.id, InstanceState::Running, Duration::from_secs(10))
        .await
        .expect("running")
}

/// Registers a Node as a kubelet with `--cloud-provider=external` does: the uninitialized
/// taint, no providerID, no addresses from the kubelet; Ready.
pub async fn register_node(env: &Env, name: &str) {
    let manifest = format!(
        r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{name}","labels":{{"kubernetes.io/hostname":"{name}","kubernetes.io/os":"linux","kubernetes.io/arch":"amd64"}}}},
"spec":{{"taints":[{{"key":"node.cloudprovider.kubernetes.io/uninitialized","value":"true","effect":"NoSchedule"}}]}}}}"#
    );
    let out = k_in(&env.admin, &["create", "-f", "-"], Some(&manifest)).await;
    assert!(out.ok, "create node {name}: {}", out.stderr);
    set_ready(&env.admin, name, true).await;
}

/// Sets the node's Ready condition (as its kubelet would) through the status subresource.
pub async fn set_ready(admin: &Path, name: &str, ready: bool) {
    let now = "2026-01-01T00:00:00Z";
    let (status, reason) = if ready {
        ("True", "KubeletReady")
    } else {
        ("Unknown", "NodeStatusUnknown")
    };
    let patch = format!(
        r#"{{"status":{{"conditions":[{{"type":"Ready","status":"{status}","reason":"{reason}","message":"","lastHeartbeatTime":"{now}","lastTransitionTime":"{now}"}}]}}}}"#
    );
    let out = k(
        admin,
        &[
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ],
    )
    .await;
    assert!(out.ok, "patch node {name} status: {}", out.stderr);
}
