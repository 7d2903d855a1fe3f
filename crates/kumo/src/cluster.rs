//! A whole cluster in one process, as `kumo up` runs it: the API server on the embedded
//! store, then the controller-manager, the scheduler and one kubelet, each an API client
//! with its own identity (kubeadm's controller-manager.conf and scheduler.conf, a kubelet
//! kubeconfig for `system:node:<name>`), never admin. Tests start the same cluster.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

/// What to run.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub data_dir: PathBuf,
    /// The API server's port on 127.0.0.1 (0 picks one).
    pub port: u16,
    /// The kubelet's node name.
    pub node_name: String,
    pub controller_manager: bool,
    pub scheduler: bool,
    pub kubelet: bool,
}

impl ClusterConfig {
    /// Everything, in `data_dir`, on port 6443, with a node named after the host.
    pub fn new(data_dir: impl Into<PathBuf>) -> ClusterConfig {
        ClusterConfig {
            data_dir: data_dir.into(),
            port: 6443,
            node_name: default_node_name(),
            controller_manager: true,
            scheduler: true,
            kubelet: true,
        }
    }

    /// The kubelet's static pod directory (kubeadm's /etc/kubernetes/manifests).
    pub fn static_pod_path(&self) -> PathBuf {
        self.data_dir.join("manifests")
    }
}

/// The host name as a node name (lower case, a DNS subdomain), as kubeadm names nodes.
pub fn default_node_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_default();
    let valid = !host.is_empty()
        && host.len() <= 63
        && host
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !host.starts_with(['-', '.'])
        && !host.ends_with(['-', '.']);
    if valid {
        host
    } else {
        "kumo-node".into()
    }
}

/// A running cluster.
pub struct Cluster {
    pub api: kumo_apiserver::ApiServer,
    /// The kubelet's kubeconfig (`system:node:<name>`), when a kubelet runs.
    pub node_kubeconfig: Option<PathBuf>,
    pub config: ClusterConfig,
}

fn server_url(kubeconfig: &Path) -> Result<String> {
    let text = std::fs::read_to_string(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_owned))
        .context("the admin kubeconfig names no server")
}

/// Starts the API server and then each component; the components restart if they stop.
pub async fn start(cfg: ClusterConfig) -> Result<Cluster> {
    let mut api_cfg = kumo_apiserver::ApiServerConfig::new(&cfg.data_dir);
    api_cfg.bind = std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), cfg.port);
    let api = kumo_apiserver::ApiServer::start(api_cfg).await?;
    if cfg.controller_manager {
        let kubeconfig = cfg.data_dir.join("controller-manager.conf");
        tokio::spawn(run_controller_manager(kubeconfig));
    }
    if cfg.scheduler {
        tokio::spawn(run_scheduler(cfg.data_dir.join("scheduler.conf")));
    }
    let mut node_kubeconfig = None;
    if cfg.kubelet {
        let server = server_url(&api.admin_kubeconfig)?;
        let kc = kumo_apiserver::pki::kubelet_kubeconfig(&cfg.data_dir, &cfg.node_name, &server)?;
        let manifests = cfg.static_pod_path();
        std::fs::create_dir_all(&manifests)
            .with_context(|| format!("creating {}", manifests.display()))?;
        let mut k = kumo_kubelet::KubeletConfig::new(&kc, &cfg.node_name);
        k.pod_manifest_path = Some(manifests);
        // The kubelet API on 127.0.0.1 (the node's InternalIP): 10250, or any port when
        // another cluster on this machine has it. Clients are the API server's
        // apiserver-kubelet-client certificate (signed by the cluster CA) and tokens.
        let free = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 10250)).is_ok();
        k.server = Some(kumo_kubelet::server::ServerConfig {
            address: std::net::Ipv4Addr::LOCALHOST.into(),
            port: if free { 10250 } else { 0 },
            client_ca_file: Some(cfg.data_dir.join("pki").join("ca.crt")),
            ..Default::default()
        });
        tokio::spawn(run_kubelet(k));
        node_kubeconfig = Some(kc);
    }
    Ok(Cluster {
        api,
        node_kubeconfig,
        config: cfg,
    })
}

/// The controller-manager, each controller acting as its own ServiceAccount (kubeadm's
/// `--use-service-account-credentials`); started again if it stops (it stops when it
/// loses the lease).
async fn run_controller_manager(kubeconfig: PathBuf) {
    loop {
        let mut cfg = kumo_controller_manager::Config::new(&kubeconfig);
        cfg.use_service_account_credentials = true;
        // As kubeadm with a pod subnet: node-ipam hands each node its spec.podCIDR, which
        // the kubelet then uses.
        cfg.node_ipam.allocate_node_cidrs = true;
        cfg.node_ipam.cluster_cidr =
            kumo_controller_manager::controllers::nodeipam::DEFAULT_CLUSTER_CIDR.into();
        cfg.node_ipam.service_cluster_ip_range = "10.96.0.0/12".into();
        let mut cm = kumo_controller_manager::ControllerManager::start(cfg.clone()).await;
        if let Err(kumo_controller_manager::Error::Listen { .. }) = cm {
            // 10257 is taken (another cluster on this machine): serve /healthz elsewhere.
            cfg.serve = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
            cm = kumo_controller_manager::ControllerManager::start(cfg).await;
        }
        match cm {
            Ok(cm) => {
                if let Err(e) = cm.wait().await {
                    tracing::warn!(error = %e, "controller-manager stopped; restarting");
                }
            }
            Err(e) => tracing::error!(error = %e, "controller-manager failed to start"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The scheduler as system:kube-scheduler; started again if it stops.
async fn run_scheduler(kubeconfig: PathBuf) {
    loop {
        let mut cfg = kumo_scheduler::Config::new(&kubeconfig);
        let mut s = kumo_scheduler::Scheduler::start(cfg.clone()).await;
        if s.is_err() {
            // 10259 is taken (another cluster on this machine): serve /healthz elsewhere.
            cfg.serve = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
            s = kumo_scheduler::Scheduler::start(cfg).await;
        }
        match s {
            Ok(s) => {
                if let Err(e) = s.wait().await {
                    tracing::warn!(error = %e, "scheduler stopped; restarting");
                }
            }
            Err(e) => tracing::error!(error = %e, "scheduler failed to start"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The kubelet as system:node:<name>; started again if it stops.
async fn run_kubelet(cfg: kumo_kubelet::KubeletConfig) {
    loop {
        if let Err(e) = kumo_kubelet::run(cfg.clone()).await {
            tracing::error!(node = %cfg.node_name, error = %e, "kubelet stopped; restarting");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
