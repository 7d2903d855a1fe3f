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
    /// A kubeconfig with a bootstrap token: while --kubeconfig holds no valid client
    /// certificate, the kubelet asks for one with a CertificateSigningRequest and writes
    /// --kubeconfig when it is issued (TLS bootstrap).
    #[arg(long)]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Where the bootstrapped client certificate and key are kept.
    #[arg(long, default_value = "/var/lib/kubelet/pki")]
    pub cert_dir: PathBuf,
    /// A KubeletConfiguration file (kubelet.config.k8s.io/v1beta1); flags given on the
    /// command line win over it, as upstream.
    #[arg(long)]
    pub config: Option<PathBuf>,
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
    /// Most pods on this node (default 110).
    #[arg(long)]
    pub max_pods: Option<u32>,
    /// The pod range to use while the Node has no spec.podCIDR (default 10.244.0.0/24).
    #[arg(long)]
    pub pod_cidr: Option<String>,
    /// The container runtime; `sim` simulates containers (unless
    /// --container-runtime-endpoint names a CRI runtime).
    #[arg(long, default_value = "sim", value_parser = ["sim"])]
    pub runtime: String,
    /// A CRI v1 runtime's socket (`unix:///run/containerd/containerd.sock`): pods run
    /// there, as real containers, instead of on the simulator.
    #[arg(long)]
    pub container_runtime_endpoint: Option<String>,
    /// The network namespace the runtime's pods are in, when it is not the kubelet's own
    /// (a kumo node machine's `/run/netns/<name>`): probes, hooks and port-forwards dial
    /// the pods from there (kumo's, not upstream's).
    #[arg(long)]
    pub pod_network_namespace: Option<PathBuf>,
    /// Where the kubelet keeps its pods' files (volumes, termination messages).
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub root_dir: PathBuf,
    /// Where the pods' logs go (the runtime writes them there).
    #[arg(long, default_value = "/var/log/pods")]
    pub pod_logs_dir: PathBuf,
    /// The cgroup the pods' cgroups go under (`<root>/kubepods/...`).
    #[arg(long, default_value = "/")]
    pub cgroup_root: String,
    /// The cluster DNS servers of ClusterFirst pods, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10.96.0.10")]
    pub cluster_dns: Vec<std::net::IpAddr>,
    /// CPU capacity the sim runtime reports.
    #[arg(long, default_value = "4")]
    pub sim_cpu: String,
    /// Memory capacity the sim runtime reports.
    #[arg(long, default_value = "8Gi")]
    pub sim_memory: String,
    /// The address the kubelet API listens on.
    /// Run this many simulated nodes in this process (`<name>-0` ... `<name>-<N-1>`), one
    /// connection pool shared: each node's requests impersonate `system:node:<node>`, so the
    /// kubeconfig's identity must be allowed to impersonate nodes. They serve no kubelet API.
    #[arg(long, default_value_t = 0)]
    pub sim_nodes: usize,
    #[arg(long, default_value = "0.0.0.0")]
    pub address: std::net::IpAddr,
    /// The kubelet API's port (0 picks a free one, reported in daemonEndpoints).
    #[arg(long, default_value_t = 10250)]
    pub port: u16,
    /// The serving certificate (a self-signed one is made without it).
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    #[arg(long)]
    pub tls_private_key_file: Option<PathBuf>,
    /// CA bundle that client certificates must be signed by.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Lets requests without credentials in as system:anonymous (kubeadm: false).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub anonymous_auth: bool,
    /// `Webhook` (SubjectAccessReview, kubeadm's setting) or `AlwaysAllow`.
    #[arg(long, default_value = "Webhook", value_parser = ["Webhook", "AlwaysAllow"])]
    pub authorization_mode: String,
}

/// The fields of a KubeletConfiguration file kumo's kubelet uses.
#[derive(serde::Deserialize, Default, Debug)]
#[serde(rename_all = "camelCase")]
struct FileConfig {
    kind: Option<String>,
    static_pod_path: Option<PathBuf>,
    max_pods: Option<u32>,
    pod_cidr: Option<String>,
    provider_id: Option<String>,
    register_with_taints: Option<Vec<FileTaint>>,
    node_status_update_frequency: Option<String>,
}

#[derive(serde::Deserialize, Debug)]
struct FileTaint {
    key: String,
    #[serde(default)]
    value: String,
    effect: String,
}

/// A Go duration such as `10s`, `1m30s`, `500ms`.
fn go_duration(s: &str) -> Option<std::time::Duration> {
    let mut total = 0f64;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (n, tail) = rest.split_at(digits);
        let n: f64 = n.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let factor = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * factor;
        rest = tail;
    }
    std::time::Duration::try_from_secs_f64(total).ok()
}

impl Args {
    /// The configuration these flags (and the --config file under them) describe.
    pub fn config(self) -> crate::Result<KubeletConfig> {
        let file: FileConfig = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    crate::Error::Invalid(format!(
                        "failed to load Kubelet config file {}: {e}",
                        path.display()
                    ))
                })?;
                let f: FileConfig = serde_yaml::from_str(&text).map_err(|e| {
                    crate::Error::Invalid(format!(
                        "failed to load Kubelet config file {}: {e}",
                        path.display()
                    ))
                })?;
                if f.kind
                    .as_deref()
                    .is_some_and(|k| k != "KubeletConfiguration")
                {
                    return Err(crate::Error::Invalid(format!(
                        "{}: kind must be KubeletConfiguration",
                        path.display()
                    )));
                }
                f
            }
            None => FileConfig::default(),
        };
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
        cfg.register_with_taints = if self.register_with_taints.is_empty() {
            file.register_with_taints
                .unwrap_or_default()
                .into_iter()
                .map(|t| Taint {
                    key: t.key,
                    value: t.value,
                    effect: t.effect,
                })
                .collect()
        } else {
            self.register_with_taints
        };
        cfg.cloud_provider_external = self.cloud_provider == "external";
        cfg.provider_id = self.provider_id.or(file.provider_id);
        cfg.pod_manifest_path = self.pod_manifest_path.or(file.static_pod_path);
        if let Some(m) = self.max_pods.or(file.max_pods) {
            cfg.max_pods = m;
        }
        if let Some(c) = self.pod_cidr.or(file.pod_cidr) {
            cfg.pod_cidr = c;
        }
        if let Some(d) = file
            .node_status_update_frequency
            .as_deref()
            .and_then(go_duration)
        {
            cfg.status_update_frequency = d;
        }
        cfg.server = Some(crate::server::ServerConfig {
            address: self.address,
            port: self.port,
            tls_cert_file: self.tls_cert_file,
            tls_private_key_file: self.tls_private_key_file,
            client_ca_file: self.client_ca_file,
            anonymous_auth: self.anonymous_auth,
            authorization_webhook: self.authorization_mode == "Webhook",
        });
        cfg.cpu = self.sim_cpu;
        cfg.memory = self.sim_memory;
        cfg.cgroup_root = self.cgroup_root;
        cfg.cluster_dns = self.cluster_dns.iter().map(ToString::to_string).collect();
        Ok(cfg)
    }
}

/// Runs `kumo kubelet` with its pods on what `runtime` makes.
pub async fn run(args: Args, runtime: kumo_cri::RuntimeFactory) -> crate::Result<()> {
    let nodes = args.sim_nodes;
    let bootstrap = args.bootstrap_kubeconfig.clone();
    let cert_dir = args.cert_dir.clone();
    let mut cfg = args.config()?;
    cfg.runtime = Some(runtime);
    if let Some(b) = bootstrap {
        crate::bootstrap::load_client_cert(&cfg.kubeconfig, &b, &cert_dir, &cfg.node_name).await?;
    }
    if nodes > 0 {
        return crate::fleet::run(cfg, nodes).await;
    }
    crate::run(cfg).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn config_file_under_flags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("config.yaml");
        std::fs::write(
            &f,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: /etc/kubernetes/manifests\nmaxPods: 50\nnodeStatusUpdateFrequency: 1m30s\nregisterWithTaints:\n- key: dedicated\n  value: infra\n  effect: NoSchedule\n",
        )
        .expect("write");
        let cli = Cli::parse_from([
            "kubelet",
            "--kubeconfig",
            "/k",
            "--hostname-override",
            "w1",
            "--config",
            f.to_str().expect("utf8"),
            "--max-pods",
            "20",
        ]);
        let cfg = cli.args.config().expect("config");
        assert_eq!(
            cfg.pod_manifest_path.as_deref(),
            Some(std::path::Path::new("/etc/kubernetes/manifests"))
        );
        assert_eq!(cfg.max_pods, 20, "the flag wins");
        assert_eq!(
            cfg.status_update_frequency,
            std::time::Duration::from_secs(90)
        );
        assert_eq!(cfg.register_with_taints[0].value, "infra");
        std::fs::write(&f, "kind: Pod\n").expect("write");
        let cli = Cli::parse_from([
            "kubelet",
            "--kubeconfig",
            "/k",
            "--config",
            f.to_str().expect("utf8"),
        ]);
        assert!(cli.args.config().is_err());
        assert_eq!(
            go_duration("500ms"),
            Some(std::time::Duration::from_millis(500))
        );
        assert_eq!(go_duration("x"), None);
    }
}
