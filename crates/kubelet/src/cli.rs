//! `kumo kubelet`: flags named as upstream's kubelet's.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::{KubeletConfig, Taint};

/// Flags of `kumo kubelet`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Kubeconfig with the API server's address and this node's credentials
    /// (system:node:<name> in system:nodes).
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// The Node's name (default: the host name).
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// The node's IP address.
    #[arg(long)]
    pub node_ip: Option<std::net::IpAddr>,
    /// Labels to register the node with, `key=value,...`.
    #[arg(long, value_delimiter = ',')]
    pub node_labels: Vec<String>,
    /// Taints to register the node with, `key[=value]:Effect,...`.
    #[arg(long, value_delimiter = ',')]
    pub register_with_taints: Vec<Taint>,
    /// `external`: a cloud-controller-manager initializes the node.
    #[arg(long, value_parser = ["", "external"], default_value = "")]
    pub cloud_provider: String,
    /// The node's providerID.
    #[arg(long)]
    pub provider_id: Option<String>,
    /// The directory of static pod manifests (staticPodPath).
    #[arg(long)]
    pub pod_manifest_path: Option<PathBuf>,
    /// Most pods on this node.
    #[arg(long, default_value_t = 110)]
    pub max_pods: u32,
    /// The pod range to use while the Node has no spec.podCIDR.
    #[arg(long, default_value = "10.244.0.0/24")]
    pub pod_cidr: String,
    /// The container runtime; `sim` simulates containers.
    #[arg(long, default_value = "sim", value_parser = ["sim"])]
    pub runtime: String,
    /// CPU capacity the sim runtime reports.
    #[arg(long, default_value = "4")]
    pub sim_cpu: String,
    /// Memory capacity the sim runtime reports.
    #[arg(long, default_value = "8Gi")]
    pub sim_memory: String,
}

impl Args {
    /// The configuration these flags describe.
    pub fn config(self) -> crate::Result<KubeletConfig> {
        let name = match self.hostname_override {
            Some(n) => n,
            None => std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_lowercase())
                .unwrap_or_else(|_| "localhost".into()),
        };
        let mut cfg = KubeletConfig::new(self.kubeconfig, name);
        cfg.node_ip = self.node_ip;
        let mut labels = BTreeMap::new();
        for l in self.node_labels.iter().filter(|l| !l.is_empty()) {
            let (k, v) = l.split_once('=').ok_or_else(|| {
                crate::Error::Invalid(format!("invalid label {l:?}: want key=value"))
            })?;
            labels.insert(k.to_owned(), v.to_owned());
        }
        cfg.node_labels = labels;
        cfg.register_with_taints = self.register_with_taints;
        cfg.cloud_provider_external = self.cloud_provider == "external";
        cfg.provider_id = self.provider_id;
        cfg.pod_manifest_path = self.pod_manifest_path;
        cfg.max_pods = self.max_pods;
        cfg.pod_cidr = self.pod_cidr;
        cfg.cpu = self.sim_cpu;
        cfg.memory = self.sim_memory;
        Ok(cfg)
    }
}

/// Runs `kumo kubelet`.
pub async fn run(args: Args) -> crate::Result<()> {
    crate::run(args.config()?).await
}
