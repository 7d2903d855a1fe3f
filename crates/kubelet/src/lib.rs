//! kumo's kubelet: the node agent. It registers its Node, renews its Lease in
//! `kube-node-lease`, reports node status, runs the pods bound to it (watched by
//! `spec.nodeName`) on a CRI-shaped runtime (`kumo_cri::Runtime`, reaching pods through
//! its `PodNetwork`), and runs static pods from
//! `--pod-manifest-path` with a mirror pod for each in the API. It is an API client only,
//! as upstream's kubelet is.
//!
//! Layout: [`node`] registration, status and lease; [`pods`] the pod workers and their
//! status; [`static_pods`] the manifest directory and mirror pods; [`fleet`] many nodes in
//! one process. The kubelet knows no runtime: the caller gives it one
//! ([`KubeletConfig::runtime`]).

pub mod admission;
pub mod bootstrap;
pub mod cli;
mod credentials;
pub mod csi;
pub mod env;
pub mod events;
mod expansion;
pub mod fleet;
mod lifecycle;
pub mod node;
pub mod podcertificate;
pub mod pods;
pub mod portforward;
pub mod prober;
mod resolv;
mod sandbox;
pub mod server;
pub mod static_pods;
pub mod stats;
pub mod trustbundle;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;

/// Kubelet errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: PathBuf, message: String },
    #[error("API: {0}")]
    Api(#[from] kube::Error),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A taint to register with (`key[=value]:Effect`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: String,
}

impl std::str::FromStr for Taint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Taint> {
        let (kv, effect) = s
            .rsplit_once(':')
            .ok_or_else(|| Error::Invalid(format!("invalid taint spec: {s}")))?;
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(Error::Invalid(format!(
                "invalid taint effect: {effect}, unsupported taint effect"
            )));
        }
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        if key.is_empty() {
            return Err(Error::Invalid(format!("invalid taint spec: {s}")));
        }
        Ok(Taint {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
        })
    }
}

/// Settings of `kumo kubelet`, named after upstream's flags.
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    pub kubeconfig: PathBuf,
    /// `--hostname-override`: the Node's name.
    pub node_name: String,
    /// `--node-ip`.
    pub node_ip: Option<IpAddr>,
    /// `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// `--register-with-taints`.
    pub register_with_taints: Vec<Taint>,
    /// `--cloud-provider=external`.
    pub cloud_provider_external: bool,
    /// `--provider-id`.
    pub provider_id: Option<String>,
    /// `--pod-manifest-path` (staticPodPath).
    pub pod_manifest_path: Option<PathBuf>,
    /// `--max-pods`.
    pub max_pods: u32,
    /// Capacity the sim runtime reports.
    pub cpu: String,
    pub memory: String,
    /// `--pod-cidr`: pod IPs come from the Node's spec.podCIDR, else from here.
    pub pod_cidr: String,
    /// How often node status is computed (upstream's nodeStatusUpdateFrequency).
    pub status_update_frequency: Duration,
    /// How often the static pod path is read again (upstream: 20 s, plus file events).
    pub static_pod_rescan: Duration,
    /// The kubelet API (port 10250); `None` serves none.
    pub server: Option<server::ServerConfig>,
    /// What the node runs its pods on: the container runtime and the pod network.
    pub runtime: Option<kumo_cri::RuntimeFactory>,
    /// `--cgroup-root`: pods' cgroups go under `<root>/kubepods` (nodes sharing a machine
    /// each take a root of their own).
    pub cgroup_root: String,
    /// `clusterDNS`: the nameservers of ClusterFirst pods (kubeadm's: the 10th address
    /// of the Service range, the `kube-dns` Service's).
    pub cluster_dns: Vec<String>,
    /// `--root-dir`: where the kubelet keeps its state, CSI volumes' staging and publish
    /// directories among it (`plugins/kubernetes.io/csi/...`, `pods/<uid>/volumes/...`).
    /// Without one, the kubelet mounts no CSI volume.
    pub root_dir: Option<PathBuf>,
    /// The Unix sockets of the CSI node plugins on this node (what each driver's
    /// node-driver-registrar announces through the plugin registry): each is registered
    /// (the Node's `csi.volume.kubernetes.io/nodeid`, its topology labels, the CSINode's
    /// driver entry) and mounts the pods' volumes of its driver.
    pub csi_plugins: Vec<PathBuf>,
}

impl KubeletConfig {
    /// The kubelet port the Node reports in daemonEndpoints.
    pub fn kubelet_port(&self) -> u16 {
        self.server.as_ref().map_or(10250, |s| s.port)
    }

    /// Upstream's defaults for a node named `node_name` (without the kubelet API; the CLI
    /// and `kumo up` turn it on).
    pub fn new(kubeconfig: impl Into<PathBuf>, node_name: impl Into<String>) -> KubeletConfig {
        KubeletConfig {
            kubeconfig: kubeconfig.into(),
            node_name: node_name.into(),
            node_ip: None,
            node_labels: BTreeMap::new(),
            register_with_taints: Vec::new(),
            cloud_provider_external: false,
            provider_id: None,
            pod_manifest_path: None,
            max_pods: 110,
            cpu: "4".into(),
            memory: "8Gi".into(),
            pod_cidr: "10.244.0.0/24".into(),
            status_update_frequency: Duration::from_secs(10),
            static_pod_rescan: static_pods::RESCAN,
            server: None,
            runtime: None,
            cgroup_root: "/".into(),
            cluster_dns: vec![resolv::CLUSTER_DNS.into()],
            root_dir: None,
            csi_plugins: Vec::new(),
        }
    }
}

/// The kubelet version it reports (nodeInfo.kubeletVersion).
pub const KUBELET_VERSION: &str = "v1.37.2-kumo";

/// A client for `path`.
pub async fn client(path: &std::path::Path) -> Result<Client> {
    kumo_client::transport::client(config(path).await?).map_err(Error::Api)
}

/// The client configuration a kubeconfig file describes.
pub async fn config(path: &std::path::Path) -> Result<kube::Config> {
    kumo_client::clients::config_from_kubeconfig(path)
        .await
        .map_err(|e| match e {
            kumo_client::Error::Kubeconfig { message, .. } => Error::Kubeconfig {
                path: path.to_owned(),
                message,
            },
            other => Error::Invalid(other.to_string()),
        })
}

/// Stops a task when dropped (the API server goes with the kubelet that runs it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the kubelet until the process ends.
pub async fn run(cfg: KubeletConfig) -> Result<()> {
    let client = client(&cfg.kubeconfig).await?;
    run_with(cfg, client, None).await
}

/// Runs the kubelet on `client`; with `gate`, registers the Node holding one of its permits
/// (many nodes of one process do not all register at once).
async fn run_with(
    mut cfg: KubeletConfig,
    client: Client,
    gate: Option<&tokio::sync::Semaphore>,
) -> Result<()> {
    let kumo_cri::NodeRuntime { runtime, network } = cfg
        .runtime
        .as_ref()
        .ok_or_else(|| Error::Invalid("no container runtime".into()))?
        .make();
    let _net = network
        .follow(client.clone(), &cfg.node_name)
        .map(AbortOnDrop);
    // The API listens before the Node is registered, so that daemonEndpoints names the
    // port it got.
    let mut _server = None;
    if let Some(scfg) = cfg.server.as_mut() {
        let listener = server::bind(scfg).await?;
        if let Ok(a) = listener.local_addr() {
            scfg.port = a.port();
        }
        let mut names = vec![cfg.node_name.clone(), "localhost".to_owned()];
        names.dedup();
        let mut ips: Vec<IpAddr> = vec![IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)];
        ips.extend(cfg.node_ip);
        if !scfg.address.is_unspecified() && !ips.contains(&scfg.address) {
            ips.push(scfg.address);
        }
        let tls = server::tls_config(scfg, &names, &ips)?;
        tracing::info!(port = scfg.port, "kubelet API serving");
        _server = Some(AbortOnDrop(server::serve(
            listener,
            tls,
            scfg,
            client.clone(),
            cfg.node_name.clone(),
            runtime.clone(),
            network.clone(),
        )));
    }
    let cfg = Arc::new(cfg);
    // The pod workers start at once, before the Node is registered: static pods run
    // without an API server, as upstream's (kubeadm's control plane is static pods the
    // kubelet starts before there is an API server to register with). Mirror pods and the
    // node's own loops wait for the Node's uid.
    let (uid_tx, uid_rx) = tokio::sync::watch::channel(None::<String>);
    let volumes = csi::Volumes::new(client.clone(), &cfg.node_name, cfg.root_dir.clone());
    let registration = {
        let (client, cfg, runtime, volumes) = (
            client.clone(),
            cfg.clone(),
            runtime.clone(),
            volumes.clone(),
        );
        async move {
            let permit = match gate {
                Some(g) => g.acquire().await.ok(),
                None => None,
            };
            let (node, created) = node::register(&client, &cfg, &*runtime).await?;
            drop(permit);
            tracing::info!(node = %cfg.node_name, "node registered");
            let node_uid = node.metadata.uid.clone().unwrap_or_default();
            announce(&client, &cfg, &node_uid, created);
            {
                let (client, name, uid) = (client.clone(), cfg.node_name.clone(), node_uid.clone());
                tokio::spawn(async move { node::ensure_csi_node(&client, &name, &uid).await });
            }
            tokio::spawn(node::heartbeat(
                client.clone(),
                cfg.clone(),
                node_uid.clone(),
            ));
            tokio::spawn(node::status_loop(
                client.clone(),
                cfg.clone(),
                runtime.clone(),
            ));
            for socket in &cfg.csi_plugins {
                tokio::spawn(volumes.clone().register(socket.clone()));
            }
            if !cfg.csi_plugins.is_empty() {
                tokio::spawn(volumes.clone().expand_pending());
            }
            let _ = uid_tx.send(Some(node_uid));
            // Registered: the pod workers run on.
            std::future::pending::<Result<()>>().await
        }
    };
    let statics = static_pods::Source::new(cfg.clone());
    let workers = pods::run(client, cfg, runtime, network, uid_rx, statics, volumes);
    tokio::select! {
        r = registration => r,
        r = workers => r,
    }
}

/// The events upstream's kubelet announces when it starts; its node events carry the
/// Node's uid once it is known (nodeRefWithUID), the container manager's none. A new node
/// turns Ready once the first runtime status check is in, as upstream's first NotReady
/// status turns Ready; an existing one gets its event from the status loop when its Ready
/// condition changes.
fn announce(client: &Client, cfg: &KubeletConfig, node_uid: &str, created: bool) {
    let node_event = |reason: &'static str, uid: &str, message: String| events::Record {
        kind: "Node",
        namespace: String::new(),
        name: cfg.node_name.clone(),
        uid: uid.to_owned(),
        field_path: None,
        warning: false,
        reason: reason.into(),
        message,
    };
    let n = &cfg.node_name;
    let status_event = |reason: &'static str| {
        node_event(
            reason,
            node_uid,
            format!("Node {n} status is now: {reason}"),
        )
    };
    let mut started = vec![
        node_event("Starting", node_uid, "Starting kubelet.".into()),
        status_event("NodeHasSufficientMemory"),
        status_event("NodeHasNoDiskPressure"),
        status_event("NodeHasSufficientPID"),
        node_event(
            "NodeAllocatableEnforced",
            "",
            "Updated Node Allocatable limit across pods".into(),
        ),
    ];
    if created {
        started.push(status_event("NodeReady"));
    }
    events::emit(client, n, started);
}
