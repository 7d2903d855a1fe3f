//! The hypervisor of `kumo up`'s cloud: a running instance is a kumo kubelet that joins the
//! cluster as a node named after the instance, with `--cloud-provider=external`,
//! `--node-ip=<private IP>`, its own identity (`system:node:<name>`) and the sim runtime.
//! The control plane's kubelet gets its kubeconfig from the cluster's PKI (`kubeadm init`'s
//! kubelet.conf); a worker joins as `kubeadm join` does, with the bootstrap token its user
//! data holds: `nodes/<name>/bootstrap-kubelet.conf`, then TLS bootstrap (a CSR the
//! controller-manager approves and signs) to `nodes/<name>/kubelet.conf`.
//! Stopping or terminating the instance halts the kubelet, as powering off a machine does.
//!
//! Each kubelet runs on a thread and a tokio runtime of its own, so that halting it ends
//! every task it started (its heartbeat, status loop, pod workers and API server), like a
//! machine that goes away. On the real network (containerd machines in the cloud's VPC)
//! that thread lives in its machine's network namespace, as a kubelet on its node: it
//! reaches the API server through the VPC at the control-plane node's address
//! (`https://10.0.1.4:6443`) and serves its API on its node's address, port 10250; the
//! API server in this process reaches that through a port kumo maps to 127.0.0.1. On the
//! simulated runtime the kubelet listens on a 127.0.0.1 port of its own. Either way the
//! instance's private IP does not route from the host, and must not be routed, so the API
//! server is told where to dial it instead ([`KubeletDialOverrides`]).
//!
//! What the node is for comes from the instance's user data, a [`NodeBootstrap`] document
//! (an instance without user data is a plain worker).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use kumo_apiserver::proxy::KubeletDialOverrides;
use kumo_cloud::{Hypervisor, HypervisorError, Instance};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The control-plane node's role label (kubeadm's mark-control-plane phase sets it with
/// admin credentials: NodeRestriction keeps kubelets from labelling themselves with it).
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// Keeps a node out of the targets of Service load balancers (set on control planes).
pub const EXCLUDE_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// An instance's user data: how its kubelet registers (kubelet flags) and whether it is
/// the control-plane node. JSON, camelCase; empty user data is a worker with no extras.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeBootstrap {
    /// `--node-labels` (only the labels a kubelet may set on itself).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// `--register-with-taints`, each `key[=value]:Effect`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub register_with_taints: Vec<String>,
    /// The control-plane node: its kubelet runs the static pods of `<data-dir>/manifests`
    /// and the node gets the control-plane role label once registered.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub control_plane: bool,
    /// `kubeadm join --token`: the bootstrap token (`<id>.<secret>`) the kubelet joins
    /// with. Its client certificate then comes from a CSR the controller-manager approves
    /// and signs (TLS bootstrap); without one the kubelet gets a certificate from the
    /// cluster's PKI, as `kubeadm init` writes the control plane's kubelet.conf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join_token: Option<String>,
}

impl NodeBootstrap {
    /// kubeadm's control-plane node: the exclusion label, the control-plane taint.
    pub fn control_plane() -> NodeBootstrap {
        NodeBootstrap {
            node_labels: BTreeMap::from([(EXCLUDE_LB_LABEL.to_owned(), String::new())]),
            register_with_taints: vec![format!("{CONTROL_PLANE_LABEL}:NoSchedule")],
            control_plane: true,
            join_token: None,
        }
    }

    /// kubeadm's worker: joins with `token`.
    pub fn worker(token: &str) -> NodeBootstrap {
        NodeBootstrap {
            join_token: Some(token.to_owned()),
            ..NodeBootstrap::default()
        }
    }

    /// Reads user data (empty: the default).
    pub fn parse(user_data: &str) -> Result<NodeBootstrap, String> {
        if user_data.trim().is_empty() {
            return Ok(NodeBootstrap::default());
        }
        serde_json::from_str(user_data).map_err(|e| format!("user data: {e}"))
    }

    /// As user data.
    pub fn to_user_data(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// One booted instance: its kubelet's thread and how to stop it.
struct Running {
    node: String,
    stop: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
    /// On the real runtime, the instance's machine (its relays, registry mirror and
    /// kube-proxy with it).
    machine: Option<crate::machine::VpcMachine>,
    /// The instance's CSI node plugin (the cloud's disk driver).
    csi: Option<tokio::task::JoinHandle<()>>,
}

/// Boots a kubelet per running instance (see the module documentation).
pub struct KubeletHypervisor {
    /// The cluster's data directory (its PKI signs the kubelets' kubeconfigs).
    data_dir: PathBuf,
    /// The API server's URL, written into the kubelets' kubeconfigs.
    server: String,
    /// The admin kubeconfig, to mark the control-plane node as kubeadm does.
    admin_kubeconfig: PathBuf,
    dial: KubeletDialOverrides,
    running: Mutex<HashMap<String, Running>>,
    /// The pods' network the kubelets share, if any.
    dataplane: Option<std::sync::Arc<kumo_sim::net::Dataplane>>,
    /// What the instances run their pods on.
    runtime: crate::machine::RuntimeKind,
    /// The VPC the machines attach to (the real network).
    vpc: Option<std::sync::Arc<kumo_vpc::Vpc>>,
    /// The workload clusters of the instances Cluster API boots (cloud-init user data).
    tenants: std::sync::Arc<crate::kubeadm::Tenants>,
    /// Those instances, by id.
    kubeadm_machines: Mutex<HashMap<String, crate::kubeadm::Running>>,
    /// The cloud's directory and an admin client of it, once it runs.
    cloud: std::sync::OnceLock<(PathBuf, kumo_cloud::Client)>,
}

impl KubeletHypervisor {
    /// Kubelets that join the API server at `server` (`https://host:port`), signed by the
    /// PKI in `data_dir`; the API server reaches them through `dial`.
    pub fn new(
        data_dir: impl Into<PathBuf>,
        server: impl Into<String>,
        admin_kubeconfig: impl Into<PathBuf>,
        dial: KubeletDialOverrides,
    ) -> KubeletHypervisor {
        KubeletHypervisor {
            data_dir: data_dir.into(),
            server: server.into(),
            admin_kubeconfig: admin_kubeconfig.into(),
            dial,
            running: Mutex::new(HashMap::new()),
            dataplane: None,
            runtime: crate::machine::RuntimeKind::Sim,
            vpc: None,
            tenants: Default::default(),
            kubeadm_machines: Mutex::new(HashMap::new()),
            cloud: std::sync::OnceLock::new(),
        }
    }

    /// The workload clusters this host's instances run.
    pub fn tenants(&self) -> std::sync::Arc<crate::kubeadm::Tenants> {
        self.tenants.clone()
    }

    /// Tells the hypervisor its cloud (for the cloud access keys of the control planes it
    /// boots).
    pub fn set_cloud(&self, cloud_dir: PathBuf, admin: kumo_cloud::Client) {
        let _ = self.cloud.set((cloud_dir, admin));
    }

    /// Machines attached to `vpc` (the real network): each instance's namespace gets its
    /// private address on its subnet's bridge, and a control-plane machine relays the API
    /// server's port (6443) on its address to the server.
    pub fn with_vpc(mut self, vpc: std::sync::Arc<kumo_vpc::Vpc>) -> Self {
        self.vpc = Some(vpc);
        self
    }

    /// Kubelets whose pods share `dataplane` (the cluster's pod network).
    pub fn with_dataplane(mut self, dataplane: std::sync::Arc<kumo_sim::net::Dataplane>) -> Self {
        self.dataplane = Some(dataplane);
        self
    }

    /// Runs the instances' pods on `runtime` (each instance a machine of its own with
    /// containerd).
    pub fn with_runtime(mut self, runtime: crate::machine::RuntimeKind) -> Self {
        self.runtime = runtime;
        self
    }

    /// The static pod directory of the control-plane node.
    pub fn static_pod_path(&self) -> PathBuf {
        self.data_dir.join("manifests")
    }

    /// The static pod directory of worker node `node`.
    pub fn node_static_pod_path(&self, node: &str) -> PathBuf {
        self.data_dir.join("nodes").join(node).join("manifests")
    }

    /// Boots instance `inst`'s machine on the VPC at its node IP, with its kube-proxy as
    /// `system:kube-proxy` (reaching the API server through the VPC, as a node's does)
    /// and, on the control plane, port 6443 of its address relayed to the API server.
    async fn boot_machine(
        &self,
        inst: &Instance,
        cfg: &kumo_kubelet::KubeletConfig,
        control_plane: bool,
    ) -> anyhow::Result<crate::machine::VpcMachine> {
        let vpc = self
            .vpc
            .clone()
            .ok_or_else(|| anyhow::anyhow!("the real runtime's machines need the cloud's VPC"))?;
        let Some(IpAddr::V4(ip)) = cfg.node_ip else {
            anyhow::bail!("the instance has no IPv4 private address");
        };
        let dir = crate::machine::node_dir(&self.data_dir, &inst.name);
        let mut m =
            crate::machine::VpcMachine::boot(&self.data_dir, &dir, &inst.name, vpc, ip).await?;
        let set_up = async {
            if control_plane {
                let to = api_address(&self.server).map_err(anyhow::Error::msg)?;
                m.relay(SocketAddr::from(([0, 0, 0, 0], API_SERVER_PORT)), to)?;
            }
            let kubeconfig =
                kumo_apiserver::pki::kube_proxy_kubeconfig(&self.data_dir, &self.node_server())?;
            let proxy = crate::machine::start_proxy(
                kubeconfig,
                m.proxy_config(
                    &inst.name,
                    crate::cluster::CLUSTER_CIDR,
                    crate::cluster::SERVICE_CIDR,
                ),
            )
            .await
            .map_err(|e| e.context("starting kube-proxy"))?;
            m.keep_proxy(proxy);
            Ok::<_, anyhow::Error>(())
        }
        .await;
        m.or_power_off(set_up).await
    }

    /// Names of the nodes whose kubelets run now.
    pub fn running_nodes(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().values().map(|r| r.node.clone()).collect();
        v.sort();
        v
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kubelet configuration of `inst`, whether it is the control plane, and how it
    /// joins when it does so with a bootstrap token.
    /// Whether the machines are real and on the cloud's VPC.
    fn on_vpc(&self) -> bool {
        self.runtime == crate::machine::RuntimeKind::Containerd && self.vpc.is_some()
    }

    /// The API server's URL as a node reaches it: through the VPC at the control-plane
    /// node's address on the real network, else this host's loopback.
    fn node_server(&self) -> String {
        if self.on_vpc() {
            format!(
                "https://{}:{API_SERVER_PORT}",
                crate::cluster::CONTROL_PLANE_IP
            )
        } else {
            self.server.clone()
        }
    }

    /// Starts the instance's node plugin of the cloud's CSI driver, as the driver's
    /// DaemonSet would on a node, and tells the kubelet where it is: the kubelet's
    /// directory under the node's, the plugin's socket in it. On a machine the disks are
    /// loop devices of the cloud's volume files; on a simulated node, directories.
    fn start_node_plugin(
        &self,
        inst: &Instance,
        cfg: &mut kumo_kubelet::KubeletConfig,
    ) -> tokio::task::JoinHandle<()> {
        let root = self.data_dir.join("nodes").join(&inst.name).join("kubelet");
        let socket = root
            .join("plugins")
            .join(kumo_disk::DRIVER)
            .join("csi.sock");
        let mounter: std::sync::Arc<dyn kumo_disk::Mounter> =
            if self.runtime == crate::machine::RuntimeKind::Containerd {
                std::sync::Arc::new(kumo_disk::mount::Loop::new(self.data_dir.join("cloud")))
            } else {
                std::sync::Arc::new(kumo_disk::mount::Directories)
            };
        let services = kumo_csi::endpoint::Services {
            identity: kumo_disk::Identity { controller: false },
            controller: None::<kumo_disk::Controller>,
            node: Some(kumo_disk::Node::new(&inst.id, &inst.zone, mounter)),
        };
        cfg.root_dir = Some(root);
        cfg.csi_plugins = vec![socket.clone()];
        let node = inst.name.clone();
        tokio::spawn(async move {
            if let Err(e) = kumo_csi::serve(&socket, services, std::future::pending()).await {
                tracing::error!(node = %node, error = %e, "the CSI node plugin stopped");
            }
        })
    }

    fn kubelet_config(
        &self,
        inst: &Instance,
    ) -> Result<(kumo_kubelet::KubeletConfig, bool, Option<TlsBootstrap>), String> {
        let boot = NodeBootstrap::parse(&inst.user_data)?;
        let node_ip: IpAddr = inst
            .private_ip
            .parse()
            .map_err(|_| format!("the instance has no private IP ({:?})", inst.private_ip))?;
        let server = self.node_server();
        let (kubeconfig, join) = match &boot.join_token {
            Some(token) => {
                let join = self.tls_bootstrap(&inst.name, token, &server)?;
                (join.kubeconfig.clone(), Some(join))
            }
            None => (
                kumo_apiserver::pki::kubelet_kubeconfig(&self.data_dir, &inst.name, &server)
                    .map_err(|e| format!("node {:?}: {e}", inst.name))?,
                None,
            ),
        };
        let mut cfg = kumo_kubelet::KubeletConfig::new(&kubeconfig, &inst.name);
        cfg.node_ip = Some(node_ip);
        cfg.cloud_provider_external = true;
        cfg.runtime = Some(kumo_sim::factory(self.dataplane.clone()));
        cfg.node_labels = boot.node_labels.clone();
        cfg.register_with_taints = boot
            .register_with_taints
            .iter()
            .map(|t| t.parse().map_err(|e| format!("user data: {e}")))
            .collect::<Result<_, String>>()?;
        // The machine's size is the instance type's.
        cfg.cpu = inst.cpu.to_string();
        cfg.memory = format!("{}Mi", inst.memory_mib);
        // Every node's kubelet reads a static pod directory, as kubeadm's
        // /etc/kubernetes/manifests: the control plane's holds its components.
        let manifests = if boot.control_plane {
            self.static_pod_path()
        } else {
            self.node_static_pod_path(&inst.name)
        };
        std::fs::create_dir_all(&manifests).map_err(|e| format!("{}: {e}", manifests.display()))?;
        cfg.pod_manifest_path = Some(manifests);
        // In its machine the kubelet listens on its node's address as on a real node;
        // otherwise on a loopback port picked when it starts.
        let (address, port) = if self.on_vpc() {
            (node_ip, KUBELET_PORT)
        } else {
            (IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
        };
        cfg.server = Some(kumo_kubelet::server::ServerConfig {
            address,
            port,
            client_ca_file: Some(self.data_dir.join("pki").join("ca.crt")),
            ..Default::default()
        });
        Ok((cfg, boot.control_plane, join))
    }

    /// What `kubeadm join` leaves on a worker: `bootstrap-kubelet.conf` with the token
    /// (mode 0600) in the node's directory, where the kubelet then keeps its certificate
    /// (`pki/`) and the `kubelet.conf` that uses it.
    fn tls_bootstrap(&self, node: &str, token: &str, server: &str) -> Result<TlsBootstrap, String> {
        use base64::Engine;
        let dir = self.data_dir.join("nodes").join(node);
        let ca_file = self.data_dir.join("pki").join("ca.crt");
        let ca = std::fs::read(&ca_file).map_err(|e| format!("{}: {e}", ca_file.display()))?;
        let ca = base64::engine::general_purpose::STANDARD.encode(ca);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    \
             server: {}\n    certificate-authority-data: {ca}\nusers:\n\
             - name: tls-bootstrap-token-user\n  user:\n    token: {token}\ncontexts:\n\
             - name: tls-bootstrap-token-user@kubernetes\n  context:\n    cluster: kubernetes\n    \
             user: tls-bootstrap-token-user\ncurrent-context: tls-bootstrap-token-user@kubernetes\n",
            server
        );
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let bootstrap = dir.join("bootstrap-kubelet.conf");
        write_private(&bootstrap, text.as_bytes())
            .map_err(|e| format!("{}: {e}", bootstrap.display()))?;
        let kubeconfig = dir.join("kubelet.conf");
        if kubeconfig.exists() {
            // Joined before: it keeps its certificate, but the API server may have moved
            // (`kumo up --port 0`), as a kubelet.conf follows a new control-plane endpoint.
            repoint_kubeconfig(&kubeconfig, server)
                .map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
        }
        Ok(TlsBootstrap {
            kubeconfig,
            bootstrap,
            cert_dir: dir.join("pki"),
        })
    }
}

/// A worker kubelet's TLS bootstrap files.
#[derive(Clone, Debug)]
pub(crate) struct TlsBootstrap {
    /// The kubeconfig it writes once its certificate is issued, and runs with.
    pub(crate) kubeconfig: PathBuf,
    /// The bootstrap kubeconfig (the token).
    pub(crate) bootstrap: PathBuf,
    /// Where its key and certificate are kept.
    pub(crate) cert_dir: PathBuf,
}

/// Points every cluster of the kubeconfig at `path` to `server`, if it is not already.
fn repoint_kubeconfig(path: &std::path::Path, server: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| e.to_string())?;
    let mut changed = false;
    if let Some(clusters) = doc.get_mut("clusters").and_then(|c| c.as_sequence_mut()) {
        for c in clusters {
            if let Some(cluster) = c.get_mut("cluster").and_then(|c| c.as_mapping_mut()) {
                let url = serde_yaml::Value::from(server);
                if cluster.get("server") != Some(&url) {
                    cluster.insert("server".into(), url);
                    changed = true;
                }
            }
        }
    }
    if changed {
        let text = serde_yaml::to_string(&doc).map_err(|e| e.to_string())?;
        write_private(path, text.as_bytes()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Writes `data` to `path`, readable by its owner only (it holds a credential).
pub(crate) fn write_private(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its mode through open(): make sure.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(data)
}

/// The port kube-apiserver serves on its node's address (kubeadm's default).
pub const API_SERVER_PORT: u16 = 6443;
/// The port a kubelet serves its API on (`--port`'s default).
pub const KUBELET_PORT: u16 = 10250;

/// The API server's address on this host, from its URL (`https://127.0.0.1:PORT`).
fn api_address(server: &str) -> Result<std::net::SocketAddr, String> {
    server
        .strip_prefix("https://")
        .and_then(|h| h.split('/').next())
        .and_then(|h| h.parse().ok())
        .ok_or_else(|| format!("the API server's URL {server:?} names no address"))
}

impl Drop for KubeletHypervisor {
    fn drop(&mut self) {
        for r in self.lock().values() {
            r.stop.send_replace(true);
        }
        for m in self
            .kubeadm_machines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            m.stop.send_replace(true);
        }
    }
}

#[async_trait]
impl Hypervisor for KubeletHypervisor {
    async fn boot(&self, inst: &Instance) -> Result<(), HypervisorError> {
        if crate::kubeadm::is_cloud_init(&inst.user_data) {
            let mut machines = self
                .kubeadm_machines
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if machines.contains_key(&inst.id) {
                return Ok(());
            }
            let ctx = crate::kubeadm::MachineContext {
                data_dir: self.data_dir.clone(),
                tenants: self.tenants.clone(),
                cloud: self.cloud.get().cloned(),
                vpc: self.vpc.clone().filter(|_| self.on_vpc()),
            };
            let running = crate::kubeadm::boot(ctx, inst)
                .map_err(|e| HypervisorError(format!("booting {}: {e:#}", inst.name)))?;
            tracing::info!(instance = %inst.id, name = %inst.name, "kubeadm machine booted");
            machines.insert(inst.id.clone(), running);
            return Ok(());
        }
        if self.lock().contains_key(&inst.id) {
            // Booted already (a cloud restarted in this process resumes its instances).
            return Ok(());
        }
        let (mut cfg, control_plane, join) = self.kubelet_config(inst).map_err(HypervisorError)?;
        let mut machine = None;
        let mut netns = None;
        if self.runtime == crate::machine::RuntimeKind::Containerd {
            // The instance's machine: its namespace and containerd on the VPC, its
            // kube-proxy, and on the control plane the relay of its port 6443 to the API
            // server, before its kubelet.
            let m = self
                .boot_machine(inst, &cfg, control_plane)
                .await
                .map_err(|e| HypervisorError(format!("booting the machine: {e:#}")))?;
            if let Ok(mut d) = self.dial.write() {
                d.insert(inst.name.clone(), m.kubelet_at);
            }
            cfg.runtime = Some(m.factory.clone());
            cfg.cgroup_root = m.cgroup_root.clone();
            netns = Some(m.netns.clone());
            machine = Some(m);
        }
        let csi = Some(self.start_node_plugin(inst, &mut cfg));
        let (stop, stop_rx) = watch::channel(false);
        // A kubelet in its machine is told where it listens; the others pick a port.
        let dial = netns.is_none().then(|| self.dial.clone());
        if control_plane {
            // kubeadm's phase runs beside the kubelet, with the admin's credentials.
            let (admin, node, mut stop) = (
                self.admin_kubeconfig.clone(),
                inst.name.clone(),
                stop_rx.clone(),
            );
            tokio::spawn(async move {
                tokio::select! {
                    _ = mark_control_plane(admin, node) => {}
                    _ = stop.wait_for(|s| *s) => {}
                }
            });
        }
        let thread = std::thread::Builder::new()
            .name(format!("kubelet-{}", inst.name))
            .spawn(move || kubelet_thread(cfg, join, dial, netns, stop_rx))
            .map_err(|e| HypervisorError(format!("starting the kubelet: {e}")))?;
        tracing::info!(instance = %inst.id, node = %inst.name, ip = %inst.private_ip, "kubelet booted");
        self.lock().insert(
            inst.id.clone(),
            Running {
                node: inst.name.clone(),
                stop,
                thread,
                machine,
                csi,
            },
        );
        Ok(())
    }

    async fn halt(&self, inst: &Instance) -> Result<(), HypervisorError> {
        let machine = self
            .kubeadm_machines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&inst.id);
        if let Some(m) = machine {
            m.stop.send_replace(true);
            let _ = tokio::task::spawn_blocking(move || m.thread.join()).await;
            tracing::info!(instance = %inst.id, name = %inst.name, "kubeadm machine halted");
            return Ok(());
        }
        let Some(r) = self.lock().remove(&inst.id) else {
            return Ok(());
        };
        r.stop.send_replace(true);
        if let Some(csi) = &r.csi {
            csi.abort();
        }
        let (node, thread, machine) = (r.node, r.thread, r.machine);
        let joined = tokio::task::spawn_blocking(move || thread.join()).await;
        if let Ok(mut m) = self.dial.write() {
            m.remove(&node);
        }
        if let Some(m) = machine {
            // Powered off: the machine's pods and containerd go with it.
            m.power_off().await;
        }
        tracing::info!(instance = %inst.id, node = %node, "kubelet halted");
        match joined {
            Ok(Ok(())) => Ok(()),
            _ => Err(HypervisorError(format!(
                "the kubelet of {} did not stop cleanly",
                node
            ))),
        }
    }
}

/// A free port on 127.0.0.1 (the kubelet binds it right after).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Runs the kubelet until told to stop; restarts it (on a fresh runtime, so nothing of the
/// previous one lingers) when it fails.
pub(crate) fn kubelet_thread(
    cfg: kumo_kubelet::KubeletConfig,
    join: Option<TlsBootstrap>,
    dial: Option<KubeletDialOverrides>,
    netns: Option<PathBuf>,
    mut stop: watch::Receiver<bool>,
) {
    let node = cfg.node_name.clone();
    if let Some(ns) = &netns {
        // Into the machine: every socket the kubelet opens (and every thread it starts)
        // is the node's from here on.
        if let Err(e) = kumo_cri_remote::netns::enter(ns) {
            tracing::error!(node = %node, error = %e, "kubelet: entering the machine's network namespace");
            return;
        }
    }
    while !*stop.borrow() {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(node = %node, error = %e, "kubelet: no runtime");
                return;
            }
        };
        let mut cfg = cfg.clone();
        if let Some(dial) = &dial {
            let port = match free_port() {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(node = %node, error = %e, "kubelet: no free port");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            if let Some(s) = cfg.server.as_mut() {
                s.port = port;
            }
            if let Ok(mut m) = dial.write() {
                m.insert(node.clone(), SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
            }
        }
        let stopped = rt.block_on(async {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => true,
                r = async {
                    if let Some(j) = &join {
                        kumo_kubelet::bootstrap::load_client_cert(
                            &j.kubeconfig,
                            &j.bootstrap,
                            &j.cert_dir,
                            &node,
                        )
                        .await?;
                    }
                    kumo_kubelet::run(cfg).await
                } => {
                    if let Err(e) = r {
                        tracing::warn!(node = %node, error = %e, "kubelet stopped; restarting");
                    }
                    false
                }
            }
        });
        rt.shutdown_timeout(Duration::from_secs(1));
        if stopped {
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// kubeadm's mark-control-plane phase: once the node has registered, label it as the
/// control plane (with admin credentials; the kubelet may not set this label itself).
pub(crate) async fn mark_control_plane(admin: PathBuf, node: String) {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams};
    let client = match kube_client(&admin).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(node = %node, error = %e, "marking the control plane");
            return;
        }
    };
    let nodes: Api<Node> = Api::all(client);
    let patch = serde_json::json!({"metadata": {"labels": {
        CONTROL_PLANE_LABEL: "",
        EXCLUDE_LB_LABEL: "",
    }}});
    loop {
        match nodes
            .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::debug!(node = %node, error = %e, "marking the control plane"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A client for a kubeconfig file.
pub(crate) async fn kube_client(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kumo_client::transport::client(
        kumo_client::clients::as_client_go(cfg),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips_and_rejects_garbage() {
        let cp = NodeBootstrap::control_plane();
        assert_eq!(
            cp.to_user_data(),
            r#"{"nodeLabels":{"node.kubernetes.io/exclude-from-external-load-balancers":""},"registerWithTaints":["node-role.kubernetes.io/control-plane:NoSchedule"],"controlPlane":true}"#
        );
        assert_eq!(NodeBootstrap::parse(&cp.to_user_data()), Ok(cp));
        assert_eq!(NodeBootstrap::parse(""), Ok(NodeBootstrap::default()));
        assert_eq!(NodeBootstrap::default().to_user_data(), "{}");
        assert!(NodeBootstrap::parse("#!/bin/sh").is_err());
        assert!(NodeBootstrap::parse(r#"{"nodeLabel":{}}"#).is_err());
    }
}
