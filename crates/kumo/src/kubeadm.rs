//! The machine image of the kumo cloud's instances that Cluster API boots: their user data
//! is cloud-init (`#cloud-config`, as the kubeadm bootstrap provider writes it), whose
//! `write_files` land in the machine's directory (`<data-dir>/machines/<instance>/`, its
//! disk: `/etc/kubernetes/pki/ca.crt` is `<machine>/etc/kubernetes/pki/ca.crt`) and whose
//! `runcmd` this image understands as far as kubeadm goes:
//!
//! - `kubeadm init --config F`: the workload cluster's control plane on this machine — a
//!   stacked etcd member ([`crate::etcd`]) and kumo's API server on it in
//!   `<machine>/etc/kubernetes` with the certificates Cluster API wrote there (and
//!   kubeadm's etcd ones), the controller-manager, the scheduler, the
//!   cloud-controller-manager (its node controllers, with a cloud access key of the
//!   cluster's own), kube-proxy and the cluster DNS's records on the cluster's own
//!   simulated network, `kube-public/cluster-info` for discovery, and the node's kubelet.
//! - `kubeadm join --config F`: a kubelet that discovers the cluster through
//!   `cluster-info` with its bootstrap token (the CA pinned by `caCertHashes`), then
//!   joins by TLS bootstrap; with `controlPlane`, another control-plane machine whose
//!   etcd member joins the cluster's (found through its etcd pods).
//!
//! The control-plane machines show their components as kubeadm's static pods.
//!
//! Other commands are logged and skipped. Each machine runs on a thread and runtime of its
//! own, so halting the instance ends everything it started. The control plane listens on
//! a loopback port; the cloud's load balancer reaches it through [`Tenants::api_address`].

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::Engine;
use kumo_apiserver::proxy::KubeletDialOverrides;
use kumo_cloud::Instance;
use serde_json::{json, Value};
use tokio::sync::watch;

/// Whether `user_data` is cloud-init.
pub fn is_cloud_init(user_data: &str) -> bool {
    let first = user_data
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    first.starts_with("#cloud-config") || first.starts_with("## template: jinja")
}

/// What cloud-init's user data asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CloudInit {
    /// `(path, content, permissions)`.
    pub files: Vec<(String, String, u32)>,
    pub runcmd: Vec<String>,
}

/// Parses cloud-init user data, with the instance's metadata rendered where the jinja
/// template names it (`{{ ds.meta_data.local_hostname }}`, `{{ ds.meta_data.instance_id }}`).
pub fn parse(user_data: &str, inst: &Instance) -> Result<CloudInit> {
    let rendered = user_data
        .replace("{{ ds.meta_data.local_hostname }}", &inst.name)
        .replace("{{ v1.local_hostname }}", &inst.name)
        .replace("{{ ds.meta_data.instance_id }}", &inst.id)
        .replace("{{ v1.instance_id }}", &inst.id);
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&rendered).context("the user data is not YAML")?;
    let mut out = CloudInit::default();
    if let Some(files) = doc.get("write_files").and_then(|f| f.as_sequence()) {
        for f in files {
            let path = f
                .get("path")
                .and_then(|p| p.as_str())
                .context("a write_files entry without a path")?;
            let content = f
                .get("content")
                .and_then(|c| c.as_str())
                .unwrap_or_default();
            let perms = f
                .get("permissions")
                .and_then(|p| p.as_str())
                .and_then(|p| u32::from_str_radix(p.trim_start_matches("0o"), 8).ok())
                .unwrap_or(0o644);
            out.files.push((path.to_owned(), content.to_owned(), perms));
        }
    }
    if let Some(cmds) = doc.get("runcmd").and_then(|c| c.as_sequence()) {
        for c in cmds {
            match c {
                serde_yaml::Value::String(s) => out.runcmd.push(s.clone()),
                serde_yaml::Value::Sequence(argv) => out.runcmd.push(
                    argv.iter()
                        .filter_map(|a| a.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
                _ => {}
            }
        }
    }
    Ok(out)
}

/// The kubeadm step of the commands: `init` or `join` and its `--config` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Init(String),
    Join(String),
}

pub fn kubeadm_step(cmds: &[String]) -> Option<Step> {
    for c in cmds {
        for part in c.split("&&") {
            let words: Vec<&str> = part.split_whitespace().collect();
            let config = words
                .iter()
                .position(|w| *w == "--config")
                .and_then(|i| words.get(i + 1))
                .map(|s| s.to_string());
            match (words.first(), words.get(1), config) {
                (Some(&"kubeadm"), Some(&"init"), Some(c)) => return Some(Step::Init(c)),
                (Some(&"kubeadm"), Some(&"join"), Some(c)) => return Some(Step::Join(c)),
                _ => {}
            }
        }
    }
    None
}

/// The documents of a kubeadm configuration file, by kind.
fn kubeadm_documents(text: &str) -> Result<HashMap<String, Value>> {
    let mut out = HashMap::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v: Value =
            serde::Deserialize::deserialize(doc).context("a kubeadm configuration document")?;
        if let Some(kind) = v.get("kind").and_then(Value::as_str) {
            out.insert(kind.to_owned(), v);
        }
    }
    Ok(out)
}

/// The kubeadm configuration file `config` of the machine whose disk is `dir`.
fn read_kubeadm_config(dir: &Path, config: &str) -> Result<HashMap<String, Value>> {
    let text = std::fs::read_to_string(dir.join(config.trim_start_matches('/')))
        .with_context(|| format!("reading {config}"))?;
    kubeadm_documents(&text)
}

/// One workload cluster's shared parts on this host, by its control-plane endpoint.
pub struct Tenant {
    /// Its pods' simulated network (the control plane's proxy programs it).
    pub dataplane: Arc<kumo_sim::net::Dataplane>,
    /// Where its API server dials its kubelets.
    pub dial: KubeletDialOverrides,
    /// On the real runtime: its machines' network namespaces (its API server's pod and
    /// service proxies dial pods through them).
    pub machines: Arc<crate::machine::NetnsList>,
    /// On the real runtime: the credentials of its nodes' kube-proxies, which a
    /// control-plane machine issues from the cluster's CA, and the cluster's ranges (on a
    /// kubeadm cluster the kube-proxy DaemonSet's pods get both from the control plane,
    /// a token and the `kube-proxy` ConfigMap; here kube-proxy runs beside each machine's
    /// kubelet, not in a pod).
    pub proxy_kubeconfig: watch::Sender<Option<(PathBuf, crate::controlplane::Networking)>>,
    /// On the real runtime: its etcd members' client URLs, by instance (there the
    /// control-plane machines run no static pods, whose annotations a joining machine
    /// reads them from otherwise).
    pub etcd: Mutex<BTreeMap<String, String>>,
}

/// The workload clusters of this host's instances.
#[derive(Default)]
pub struct Tenants {
    by_endpoint: Mutex<HashMap<String, Arc<Tenant>>>,
    /// Instance id → its API server's loopback address (control-plane machines).
    api: Mutex<HashMap<String, SocketAddr>>,
}

impl Tenants {
    fn tenant(&self, endpoint: &str) -> Arc<Tenant> {
        let mut m = self.by_endpoint.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(endpoint.to_owned())
            .or_insert_with(|| {
                Arc::new(Tenant {
                    dataplane: kumo_sim::net::Dataplane::new(),
                    dial: KubeletDialOverrides::default(),
                    machines: Default::default(),
                    proxy_kubeconfig: watch::channel(None).0,
                    etcd: Mutex::new(BTreeMap::new()),
                })
            })
            .clone()
    }

    /// Where instance `id`'s API server listens on this host, if it runs one.
    pub fn api_address(&self, id: &str) -> Option<SocketAddr> {
        self.api
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .copied()
    }

    /// The client URL of the etcd member on instance `id`, if it runs one (on the real
    /// runtime, where no etcd pod shows it).
    pub fn etcd_client_url(&self, id: &str) -> Option<String> {
        let tenants: Vec<Arc<Tenant>> = self
            .by_endpoint
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        tenants.iter().find_map(|t| {
            t.etcd
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(id)
                .cloned()
        })
    }

    fn set_api_address(&self, id: &str, addr: Option<SocketAddr>) {
        let mut m = self.api.lock().unwrap_or_else(|e| e.into_inner());
        match addr {
            Some(a) => m.insert(id.to_owned(), a),
            None => m.remove(id),
        };
    }
}

/// Cluster API's control plane finds the members of clusters on real machines here: they
/// show no etcd pods (upstream reaches them through those pods' port-forward).
impl kumo_capi::etcd::Members for Tenants {
    fn client_url(&self, provider_id: &str) -> Option<String> {
        self.etcd_client_url(kumo_cloud_provider::kumo::instance_id(provider_id)?)
    }
}

/// What a booted kubeadm machine needs from the host.
pub struct MachineContext {
    pub data_dir: PathBuf,
    pub tenants: Arc<Tenants>,
    /// The cloud and an admin client of it, for the control plane's cloud access key.
    pub cloud: Option<(PathBuf, kumo_cloud::Client)>,
    /// The cloud's VPC when the machines are real (`kumo up --runtime containerd`): each
    /// is then a network namespace with its containerd on the VPC; else the kubelets run
    /// the simulator on the cluster's simulated network.
    pub vpc: Option<Arc<kumo_vpc::Vpc>>,
}

/// A real machine's parts, as its kubeadm step boots them.
struct RealNode {
    machine: crate::machine::VpcMachine,
    tenant: Arc<Tenant>,
    instance: String,
    /// The node its kubelet runs as, once configured.
    node: Option<String>,
}

/// Where a kubeadm step leaves its real machine, so that the machine is powered off when
/// the instance halts even if the step is cut short.
type RealSlot = Arc<Mutex<Option<RealNode>>>;

fn with_real<T>(slot: &RealSlot, f: impl FnOnce(&mut RealNode) -> T) -> Option<T> {
    slot.lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .map(f)
}

/// Boots instance `inst`'s real machine (`machines/<instance>/node`) on the VPC and relays
/// the control-plane endpoint into it: the endpoint is a port of this host's loopback (the
/// load balancer published there), which the machine's own loopback forwards to.
async fn boot_real(
    ctx: &MachineContext,
    vpc: &Arc<kumo_vpc::Vpc>,
    inst: &Instance,
    node_name: &str,
    endpoint: &str,
    tenant: &Arc<Tenant>,
    slot: &RealSlot,
) -> Result<()> {
    let ip: Ipv4Addr = inst
        .private_ip
        .parse()
        .with_context(|| format!("the instance's address {:?}", inst.private_ip))?;
    let dir = machine_dir(&ctx.data_dir, &inst.id).join("node");
    let mut machine =
        crate::machine::VpcMachine::boot(&ctx.data_dir, &dir, node_name, vpc.clone(), ip).await?;
    match endpoint.parse::<SocketAddr>() {
        Ok(at) if at.ip().is_loopback() => {
            if let Err(e) = machine.relay(at, at) {
                machine.power_off().await;
                return Err(e.context("relaying the control-plane endpoint into the machine"));
            }
        }
        _ => {
            tracing::warn!(instance = %inst.id, endpoint, "the control-plane endpoint is not this host's loopback: not relayed into the machine")
        }
    }
    tenant.machines.insert(&inst.id, machine.netns.clone());
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(RealNode {
        machine,
        tenant: tenant.clone(),
        instance: inst.id.clone(),
        node: None,
    });
    Ok(())
}

impl RealNode {
    /// The kubelet runs in the machine, serving on its address; its API server dials it
    /// through the relay this host's loopback has to it.
    fn configure_kubelet(&mut self, cfg: &mut kumo_kubelet::KubeletConfig) -> Result<()> {
        cfg.runtime = Some(self.machine.factory.clone());
        cfg.cgroup_root = self.machine.cgroup_root.clone();
        if let Some(s) = cfg.server.as_mut() {
            s.address = IpAddr::V4(self.machine.ip);
            s.port = crate::hypervisor::KUBELET_PORT;
        }
        self.tenant
            .dial
            .write()
            .map_err(|_| anyhow::anyhow!("the kubelet dial table is poisoned"))?
            .insert(cfg.node_name.clone(), self.machine.kubelet_at);
        self.node = Some(cfg.node_name.clone());
        Ok(())
    }

    async fn power_off(self) {
        self.tenant.machines.remove(&self.instance);
        if let (Some(node), Ok(mut dial)) = (&self.node, self.tenant.dial.write()) {
            dial.remove(node);
        }
        self.tenant
            .etcd
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.instance);
        self.machine.power_off().await;
    }
}

/// A running kubeadm machine: stop it to power it off.
pub struct Running {
    pub stop: watch::Sender<bool>,
    pub thread: std::thread::JoinHandle<()>,
}

/// The directory that stands for instance `id`'s disk.
pub fn machine_dir(data_dir: &Path, id: &str) -> PathBuf {
    data_dir.join("machines").join(id)
}

/// Boots instance `inst` from its cloud-init user data.
pub fn boot(ctx: MachineContext, inst: &Instance) -> Result<Running> {
    let init = parse(&inst.user_data, inst)?;
    let step = kubeadm_step(&init.runcmd)
        .context("the user data runs neither kubeadm init nor kubeadm join")?;
    let dir = machine_dir(&ctx.data_dir, &inst.id);
    for (path, content, perms) in &init.files {
        let to = dir.join(path.trim_start_matches('/'));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        kumo_apiserver::pki::write_file(&to, content.as_bytes(), *perms)
            .with_context(|| format!("writing {path}"))?;
    }
    for c in &init.runcmd {
        if !c.contains("kubeadm ") {
            tracing::info!(instance = %inst.id, command = %c, "cloud-init: command not run (this image runs only kubeadm)");
        }
    }
    let (stop, stop_rx) = watch::channel(false);
    let inst = inst.clone();
    let slot = RealSlot::default();
    let thread = std::thread::Builder::new()
        .name(format!("machine-{}", inst.name))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name(format!("machine-{}", inst.name))
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(instance = %inst.id, error = %e, "machine: no runtime");
                    return;
                }
            };
            let mut stop = stop_rx.clone();
            rt.block_on(async {
                let run = async {
                    match &step {
                        Step::Init(f) => init_control_plane(&ctx, &inst, &dir, f, &slot, stop_rx.clone()).await,
                        Step::Join(f) => join(&ctx, &inst, &dir, f, &slot, stop_rx.clone()).await,
                    }
                };
                tokio::select! {
                    r = run => if let Err(e) = r {
                        tracing::error!(instance = %inst.id, error = %format!("{e:#}"), "kubeadm failed");
                    },
                    _ = stop.wait_for(|s| *s) => {}
                }
                // Runs until powered off.
                let _ = stop.wait_for(|s| *s).await;
                let real = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(real) = real {
                    real.power_off().await;
                }
            });
            ctx.tenants.set_api_address(&inst.id, None);
            rt.shutdown_timeout(Duration::from_secs(1));
        })
        .context("starting the machine")?;
    Ok(Running { stop, thread })
}

/// The node's kubelet flags from `nodeRegistration` (kubeletExtraArgs as v1beta4's list
/// of `{name, value}` or a map).
fn kubelet_args(reg: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    match reg.get("kubeletExtraArgs") {
        Some(Value::Array(a)) => {
            for arg in a {
                if let (Some(n), Some(v)) = (
                    arg.get("name").and_then(Value::as_str),
                    arg.get("value").and_then(Value::as_str),
                ) {
                    out.insert(n.to_owned(), v.to_owned());
                }
            }
        }
        Some(Value::Object(o)) => {
            for (k, v) in o {
                out.insert(k.clone(), v.as_str().unwrap_or_default().to_owned());
            }
        }
        _ => {}
    }
    out
}

/// A kubelet for `inst` configured from `nodeRegistration` (control plane: kubeadm's
/// default taint unless the registration gives taints).
fn kubelet_config(
    inst: &Instance,
    reg: &Value,
    kubeconfig: &Path,
    control_plane: bool,
    ca: &Path,
    tenant: &Tenant,
) -> Result<kumo_kubelet::KubeletConfig> {
    let name = reg
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or(&inst.name)
        .to_owned();
    let mut cfg = kumo_kubelet::KubeletConfig::new(kubeconfig, &name);
    cfg.node_ip = inst.private_ip.parse::<IpAddr>().ok();
    let args = kubelet_args(reg);
    cfg.cloud_provider_external =
        args.get("cloud-provider").map(String::as_str) == Some("external");
    cfg.provider_id = args.get("provider-id").cloned();
    if let Some(labels) = args.get("node-labels") {
        for kv in labels.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            cfg.node_labels.insert(k.to_owned(), v.to_owned());
        }
    }
    let taints: Vec<String> = match reg.get("taints") {
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(|t| {
                let key = t.get("key")?.as_str()?;
                let effect = t.get("effect")?.as_str()?;
                Some(match t.get("value").and_then(Value::as_str) {
                    Some(v) => format!("{key}={v}:{effect}"),
                    None => format!("{key}:{effect}"),
                })
            })
            .collect(),
        _ if control_plane => vec![format!(
            "{}:NoSchedule",
            crate::hypervisor::CONTROL_PLANE_LABEL
        )],
        _ => Vec::new(),
    };
    cfg.register_with_taints = taints
        .iter()
        .map(|t| t.parse().map_err(|e| anyhow::anyhow!("taint {t}: {e}")))
        .collect::<Result<_>>()?;
    cfg.cpu = inst.cpu.to_string();
    cfg.memory = format!("{}Mi", inst.memory_mib);
    cfg.runtime = Some(kumo_sim::factory(Some(tenant.dataplane.clone())));
    cfg.server = Some(kumo_kubelet::server::ServerConfig {
        address: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 0,
        client_ca_file: Some(ca.to_owned()),
        ..Default::default()
    });
    Ok(cfg)
}

/// `kubeadm init`: the control plane, then the node.
async fn init_control_plane(
    ctx: &MachineContext,
    inst: &Instance,
    dir: &Path,
    config: &str,
    slot: &RealSlot,
    stop: watch::Receiver<bool>,
) -> Result<()> {
    let docs = read_kubeadm_config(dir, config)?;
    let cluster_cfg = docs
        .get("ClusterConfiguration")
        .cloned()
        .unwrap_or_default();
    let init_cfg = docs.get("InitConfiguration").cloned().unwrap_or_default();
    let endpoint = cluster_cfg
        .get("controlPlaneEndpoint")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let net = networking(&cluster_cfg)?;
    let reg = init_cfg
        .get("nodeRegistration")
        .cloned()
        .unwrap_or_default();
    let start = Start::Init {
        cluster_configuration: &cluster_cfg,
    };
    control_plane(ctx, inst, dir, &endpoint, &net, &reg, start, slot, stop).await
}

/// The cluster's name and ranges from its ClusterConfiguration (kubeadm's defaults where
/// it gives none); a range this image cannot serve is refused.
fn networking(cluster_configuration: &Value) -> Result<crate::controlplane::Networking> {
    let mut net = crate::controlplane::Networking::default();
    let field = |path: &str| cluster_configuration.pointer(path).and_then(Value::as_str);
    if let Some(name) = field("/clusterName").filter(|n| !n.is_empty()) {
        net.cluster_name = name.to_owned();
    }
    if let Some(pods) = field("/networking/podSubnet").filter(|p| !p.is_empty()) {
        // One range per family, comma-separated; this cluster is IPv4.
        let v4 = pods
            .split(',')
            .map(str::trim)
            .find(|c| {
                c.split_once('/').is_some_and(|(ip, bits)| {
                    ip.parse::<Ipv4Addr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= 32)
                })
            })
            .with_context(|| format!("networking.podSubnet {pods:?} has no IPv4 range"))?;
        net.pod_subnet = v4.to_owned();
    }
    if let Some(services) = field("/networking/serviceSubnet").filter(|s| !s.is_empty()) {
        // The API server's IPv4 range; this cluster is IPv4.
        let (ip, bits) = services
            .split(',')
            .find_map(kumo_apiserver::registry::parse_service_cidr)
            .with_context(|| {
                format!("networking.serviceSubnet {services:?} has no IPv4 range from /1 to /30")
            })?;
        net.service_subnet = format!("{ip}/{bits}");
    }
    Ok(net)
}

/// How a control-plane machine comes up.
enum Start<'a> {
    /// `kubeadm init`: the cluster's first member, with its ClusterConfiguration.
    Init { cluster_configuration: &'a Value },
    /// `kubeadm join --control-plane`: a member added through these etcd client URLs.
    Join { etcd: Vec<String> },
}

/// The API server's port on every control-plane machine (kubeadm's bindPort): where the
/// `kubernetes` Service's endpoints point, at each machine's address.
const BIND_PORT: u16 = 6443;

/// A control-plane machine: its stacked etcd member (the first of the cluster, or
/// `joining` the members the cluster's etcd pods advertise), the API server on it, the
/// controller-manager, scheduler and cloud-controller-manager (leader-elected among the
/// machines), the static pods that show them, and the node's kubelet. The first machine
/// also writes what `kubeadm init` leaves in the cluster (`kube-system/kubeadm-config`,
/// the add-ons, `cluster-info`).
#[allow(clippy::too_many_arguments)]
async fn control_plane(
    ctx: &MachineContext,
    inst: &Instance,
    dir: &Path,
    endpoint: &str,
    net: &crate::controlplane::Networking,
    reg: &Value,
    start: Start<'_>,
    slot: &RealSlot,
    stop: watch::Receiver<bool>,
) -> Result<()> {
    let joining = match &start {
        Start::Init { .. } => None,
        Start::Join { etcd } => Some(etcd.clone()),
    };
    let tenant = ctx.tenants.tenant(endpoint);
    let data_dir = dir.join("etc/kubernetes");
    let pki = data_dir.join("pki");
    let node_name = reg
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or(&inst.name)
        .to_owned();
    let ip: IpAddr = inst
        .private_ip
        .parse()
        .with_context(|| format!("the instance's address {:?}", inst.private_ip))?;
    let real = ctx.vpc.is_some();
    // The machine boots (its containerd takes seconds to answer) while its etcd member and
    // API server start: they run in this process and need the machine only from the
    // relays on.
    let booting = async {
        if let Some(vpc) = &ctx.vpc {
            boot_real(ctx, vpc, inst, &node_name, endpoint, &tenant, slot).await?;
        }
        Ok::<_, anyhow::Error>(())
    };
    let serving = async {
        kumo_apiserver::pki::ensure_etcd(&data_dir, &node_name, &[ip])
            .context("the etcd certificates")?;
        let etcd_tls = crate::etcd::client_tls(&pki);
        let urls = crate::etcd::Urls::pick()?;
        let (member, learner) = match &joining {
            None => (Vec::new(), None),
            Some(endpoints) => {
                let (id, existing) =
                    crate::etcd::add_learner(endpoints, &etcd_tls, &node_name, &urls.peer).await?;
                (existing, Some((endpoints, id)))
            }
        };
        let member = crate::etcd::Member::start(crate::etcd::MemberSpec {
            name: &node_name,
            machine: dir,
            pki: &pki,
            urls,
            existing: member,
        })
        .await?;
        if let Some((endpoints, id)) = learner {
            crate::etcd::promote(endpoints, &etcd_tls, id).await?;
        }
        let mut api_cfg = kumo_apiserver::ApiServerConfig::new(&data_dir);
        api_cfg.bind = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        api_cfg.store = kumo_apiserver::server::StoreConfig::Etcd(vec![member.urls.client.clone()]);
        api_cfg.etcd_tls = Some(etcd_tls);
        api_cfg.hostname = Some(node_name.clone());
        api_cfg.service_cluster_ip_range = net.service_subnet.clone();
        api_cfg.service_endpoint = Some(SocketAddr::new(ip, BIND_PORT));
        api_cfg.kubelet_dial_overrides = tenant.dial.clone();
        api_cfg.pod_network = Some(if real {
            Arc::new(crate::machine::MachinesNetwork::listed(
                tenant.machines.clone(),
            ))
        } else {
            Arc::new(crate::cluster::PodNetwork(tenant.dataplane.clone()))
        });
        let api = kumo_apiserver::ApiServer::start(api_cfg)
            .await
            .context("starting the API server")?;
        Ok::<_, anyhow::Error>((member, api))
    };
    let (booted, served) = tokio::join!(booting, serving);
    booted?;
    let (member, api) = served?;
    // Known to the other machines and to Cluster API once the machine is up too (a machine
    // powered off takes its entry out).
    if real {
        tenant
            .etcd
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(inst.id.clone(), member.urls.client.clone());
    }
    ctx.tenants.set_api_address(&inst.id, Some(api.local_addr));
    let server = crate::cluster::server_url(&api.admin_kubeconfig)?;
    // What runs in a real machine reaches the API server as on a kubeadm node: through
    // the control-plane endpoint. The machine's address and port 6443 (the `kubernetes`
    // Service's endpoint, the load balancer's target) lead to this API server.
    let node_server = if real {
        let listen = SocketAddr::from((Ipv4Addr::UNSPECIFIED, BIND_PORT));
        with_real(slot, |r| r.machine.relay(listen, api.local_addr))
            .context("the machine is gone")??;
        format!("https://{endpoint}")
    } else {
        server.clone()
    };
    let admin = crate::hypervisor::kube_client(&api.admin_kubeconfig).await?;
    if let Start::Init {
        cluster_configuration,
    } = &start
    {
        // kubeadm init's phases that write objects: its configuration, the addons,
        // cluster-info.
        upload_config(&admin, cluster_configuration).await?;
        upload_kubelet_config(&admin, net).await?;
        if real {
            // CoreDNS's pods run this binary's DNS server; kube-proxy runs beside each
            // machine's kubelet.
            match crate::machine::kumo_binary() {
                Some(exe) => crate::addons::ensure_real(&admin, &exe, &net.dns_ip())
                    .await
                    .context("the cluster DNS")?,
                None => {
                    tracing::warn!(instance = %inst.id, "no kumo binary to run the cluster DNS pods ($KUMO_BINARY names one): no coredns pods")
                }
            }
        } else {
            crate::addons::ensure(&admin, net)
                .await
                .context("the addons")?;
        }
        let ca_pem = std::fs::read_to_string(pki.join("ca.crt")).context("the cluster CA")?;
        publish_cluster_info(&admin, &format!("https://{endpoint}"), &ca_pem)
            .await
            .context("cluster-info")?;
    }
    // The components' lease holders are named after their machine, as on a kubeadm node.
    let (cm_tx, mut cm_rx) = watch::channel(None);
    tokio::spawn(crate::cluster::run_controller_manager(
        data_dir.join("controller-manager.conf"),
        cm_tx,
        Some(node_name.clone()),
        net.clone(),
    ));
    let (sched_tx, mut sched_rx) = watch::channel(None);
    tokio::spawn(crate::cluster::run_scheduler(
        data_dir.join("scheduler.conf"),
        sched_tx,
        Some(node_name.clone()),
    ));
    if real {
        // The node's kube-proxy, and its credentials for the other machines' ones.
        let proxy_kc = kumo_apiserver::pki::kube_proxy_kubeconfig(&data_dir, &node_server)?;
        tenant
            .proxy_kubeconfig
            .send_replace(Some((proxy_kc.clone(), net.clone())));
        start_real_proxy(slot, &node_name, proxy_kc, net).await?;
    } else {
        // The kube-proxy that programs the cluster's simulated network, which every node
        // shares: on every control-plane machine, since scale-downs and rollouts remove
        // the first one (each writes the same rules from the same API).
        let proxy_kc = kumo_apiserver::pki::kube_proxy_kubeconfig(&data_dir, &server)?;
        tokio::spawn(crate::cluster::run_proxy(
            proxy_kc,
            tenant.dataplane.clone(),
        ));
    }
    if let Some((cloud_dir, cloud)) = &ctx.cloud {
        // The cluster's own cloud-controller-manager (node controllers, as seed 000's
        // environment runs it), with an access key of the cluster's own.
        kumo_cloud_provider::ccm::rbac::ensure(&admin)
            .await
            .context("the cloud-controller-manager's RBAC")?;
        let key_name = format!("ccm-{}-{}", net.cluster_name, inst.id);
        let (client, _) = crate::cluster::cloud_credentials(
            cloud_dir,
            cloud,
            &data_dir.join("cloud.json"),
            &key_name,
        )
        .await?;
        // Its `--cluster-name` tells its routes and load balancers from other clusters' in
        // the same cloud: the cluster's name with its CA's hash, since clusters handed out
        // may share a name (every learner's `demo`).
        let ca_pem = std::fs::read_to_string(pki.join("ca.crt")).context("the cluster CA")?;
        let hash = kumo_capi::certs::ca_cert_hash(&ca_pem)?;
        let mut ccm_net = net.clone();
        ccm_net.cluster_name = format!(
            "{}-{}",
            net.cluster_name,
            hash.trim_start_matches("sha256:")
                .get(..8)
                .unwrap_or_default()
        );
        tokio::spawn(crate::cluster::run_cloud_controller_manager(
            data_dir.join("cloud-controller-manager.conf"),
            cloud_controllers(dir, real),
            client,
            Some(node_name.clone()),
            ccm_net,
        ));
    }
    // The static pods that show the components, probed where they serve. Not on the
    // real runtime: its kubelet would run them, and their images (kube-apiserver's,
    // etcd's) are not this host's components.
    let manifests = data_dir.join("manifests");
    std::fs::create_dir_all(&manifests)
        .with_context(|| format!("creating {}", manifests.display()))?;
    let endpoints = (!real).then_some(crate::controlplane::Endpoints {
        apiserver: api.local_addr.port(),
        controller_manager: crate::cluster::serving_port(true, &mut cm_rx).await,
        scheduler: crate::cluster::serving_port(true, &mut sched_rx).await,
        advertise_address: Some(ip),
        etcd: Some(crate::controlplane::EtcdPod {
            command: member.command.clone(),
            client_url: member.urls.client.clone(),
            metrics_port: member.urls.metrics_port,
            data_dir: dir.join("var/lib/etcd"),
            health: crate::etcd::health_paths(),
        }),
    });
    if let Some(endpoints) = endpoints {
        crate::controlplane::write_manifests(&manifests, &data_dir, &endpoints, net)?;
    }
    let kubeconfig = kumo_apiserver::pki::kubelet_kubeconfig(&data_dir, &node_name, &node_server)?;
    let mut cfg = kubelet_config(inst, reg, &kubeconfig, true, &pki.join("ca.crt"), &tenant)?;
    cfg.cluster_dns = vec![net.dns_ip()];
    cfg.pod_manifest_path = Some(manifests);
    let netns = with_real(slot, |r| {
        r.configure_kubelet(&mut cfg)?;
        Ok::<_, anyhow::Error>(r.machine.netns.clone())
    })
    .transpose()?;
    tokio::spawn(crate::hypervisor::mark_control_plane(
        api.admin_kubeconfig.clone(),
        node_name.clone(),
    ));
    // A simulated node's kubelet listens on a loopback port it picks.
    let dial = netns.is_none().then(|| tenant.dial.clone());
    let stop_kubelet = stop.clone();
    std::thread::Builder::new()
        .name(format!("kubelet-{node_name}"))
        .spawn(move || crate::hypervisor::kubelet_thread(cfg, None, dial, netns, stop_kubelet))
        .context("starting the kubelet")?;
    tracing::info!(instance = %inst.id, cluster = %net.cluster_name, api = %api.local_addr, etcd = %member.urls.client, joined = joining.is_some(), "kubeadm: control plane up");
    // The API server and the etcd member serve until the machine powers off.
    let mut stop = stop;
    let _ = stop.wait_for(|s| *s).await;
    drop(api);
    drop(member);
    Ok(())
}

/// What a joining control-plane machine reads before it has an API server of its own:
/// the etcd members' client URLs, from the annotations of the cluster's etcd pods
/// (kubeadm's `GetEtcdEndpoints`), through the control-plane endpoint with the admin
/// credentials it makes from the cluster CA.
async fn etcd_endpoints(
    data_dir: &Path,
    endpoint: &str,
    ip: IpAddr,
    known: Vec<String>,
) -> Result<(Vec<String>, crate::controlplane::Networking)> {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    let server = format!("https://{endpoint}");
    let (dns, mut ips) = kumo_apiserver::pki::apiserver_sans(None, IpAddr::V4(Ipv4Addr::LOCALHOST));
    ips.push(ip);
    let certs = kumo_apiserver::pki::ensure(data_dir, &server, &dns, &ips)
        .context("the control plane's certificates")?;
    let admin = crate::hypervisor::kube_client(&certs.admin_kubeconfig).await?;
    // The cluster's name and ranges from the configuration `kubeadm init` uploaded.
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(admin.clone(), "kube-system");
    let config = cms
        .get("kubeadm-config")
        .await
        .context("reading kube-system/kubeadm-config")?;
    let cluster_configuration = config
        .data
        .as_ref()
        .and_then(|d| d.get("ClusterConfiguration"))
        .context("kube-system/kubeadm-config has no ClusterConfiguration")?;
    let cluster_configuration: Value = serde_yaml::from_str(cluster_configuration)
        .context("kube-system/kubeadm-config's ClusterConfiguration")?;
    let net = networking(&cluster_configuration)?;
    let pods: kube::Api<Pod> = kube::Api::namespaced(admin, "kube-system");
    let list = pods
        .list(&kube::api::ListParams::default().labels("component=etcd,tier=control-plane"))
        .await
        .context("listing the etcd pods")?;
    let urls: Vec<String> = list
        .items
        .iter()
        .filter_map(|p| {
            p.metadata
                .annotations
                .as_ref()?
                .get("kubeadm.kubernetes.io/etcd.advertise-client-urls")
                .cloned()
        })
        .collect();
    let urls = if urls.is_empty() { known } else { urls };
    if urls.is_empty() {
        bail!("no etcd pod of the cluster advertises its client URLs yet");
    }
    Ok((urls, net))
}

/// kubeadm's `upload-config` phase: `kube-system/kubeadm-config` with the
/// ClusterConfiguration, which joining control-plane machines read.
async fn upload_config(admin: &kube::Client, cluster_configuration: &Value) -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams};
    let text =
        serde_yaml::to_string(cluster_configuration).context("encoding the configuration")?;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-system");
    cms.patch(
        "kubeadm-config",
        &PatchParams::apply("kubeadm").force(),
        &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
            "data": {"ClusterConfiguration": text},
        })),
    )
    .await
    .context("uploading kube-system/kubeadm-config")?;
    Ok(())
}

/// kubeadm's ConfigMap of the kubelets' shared configuration, and its key.
const KUBELET_CONFIG_MAP: &str = "kubelet-config";
const KUBELET_CONFIG_KEY: &str = "kubelet";

/// The KubeletConfiguration kubeadm uploads for the cluster's kubelets (the fields it
/// sets by default), with the cluster DNS at the Service range's 10th address.
fn kubelet_configuration(net: &crate::controlplane::Networking) -> Value {
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true, "cacheTTL": "0s"},
            "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
        },
        "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "0s", "cacheUnauthorizedTTL": "0s"}},
        "cgroupDriver": "systemd",
        "clusterDNS": [net.dns_ip()],
        "clusterDomain": "cluster.local",
        "containerRuntimeEndpoint": "",
        "cpuManagerReconcilePeriod": "0s",
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "rotateCertificates": true,
        "staticPodPath": "/etc/kubernetes/manifests",
    })
}

/// kubeadm's `upload-config kubelet` phase: `kube-system/kubelet-config`, which joining
/// nodes read with their bootstrap token (the Role `kubeadm:kubelet-config` lets them and
/// the nodes get it, and nothing else).
async fn upload_kubelet_config(
    admin: &kube::Client,
    net: &crate::controlplane::Networking,
) -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::{Api, Patch, PatchParams};
    let text = serde_yaml::to_string(&kubelet_configuration(net))
        .context("encoding the kubelet configuration")?;
    let ns = "kube-system";
    let apply = PatchParams::apply("kubeadm").force();
    Api::<ConfigMap>::namespaced(admin.clone(), ns)
        .patch(
            KUBELET_CONFIG_MAP,
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": KUBELET_CONFIG_MAP, "namespace": ns},
                "data": {KUBELET_CONFIG_KEY: text},
            })),
        )
        .await
        .context("uploading kube-system/kubelet-config")?;
    let role = "kubeadm:kubelet-config";
    Api::<Role>::namespaced(admin.clone(), ns)
        .patch(
            role,
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": role, "namespace": ns},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                    "resourceNames": [KUBELET_CONFIG_MAP]}],
            })),
        )
        .await
        .context("the Role kubeadm:kubelet-config")?;
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .patch(
            role,
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": role, "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"},
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                        "name": "system:bootstrappers:kubeadm:default-node-token"},
                ],
            })),
        )
        .await
        .context("the RoleBinding kubeadm:kubelet-config")?;
    Ok(())
}

/// What `kubeadm join` reads before the kubelet starts: the cluster DNS of the
/// KubeletConfiguration in `kube-system/kubelet-config`, with the bootstrap credentials.
async fn download_cluster_dns(bootstrap_kubeconfig: &Path) -> Result<Vec<String>> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = crate::hypervisor::kube_client(bootstrap_kubeconfig).await?;
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client, "kube-system");
    let cm = cms
        .get(KUBELET_CONFIG_MAP)
        .await
        .context("reading kube-system/kubelet-config")?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(KUBELET_CONFIG_KEY))
        .context("kube-system/kubelet-config has no kubelet key")?;
    let config: Value =
        serde_yaml::from_str(text).context("kube-system/kubelet-config's KubeletConfiguration")?;
    let dns: Vec<String> = config
        .get("clusterDNS")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|ip| ip.parse::<IpAddr>().is_ok())
        .map(str::to_owned)
        .collect();
    if dns.is_empty() {
        bail!("kube-system/kubelet-config names no clusterDNS");
    }
    Ok(dns)
}

/// Where a cluster's KubeadmControlPlane may say which cloud-controller-manager
/// controllers its control plane runs (a file of its `kubeadmConfigSpec.files`:
/// comma-separated, `*` for all, as `--controllers`).
pub const CLOUD_CONTROLLERS_FILE: &str = "etc/kumo/cloud-controllers";

/// The control plane's cloud-controller-manager controllers: the file's, else the node
/// controllers only (seed 000's environment: no service controller).
fn cloud_controllers(machine: &Path, real: bool) -> Vec<String> {
    std::fs::read_to_string(machine.join(CLOUD_CONTROLLERS_FILE))
        .ok()
        .map(|t| {
            t.split(',')
                .map(|c| c.trim().to_owned())
                .filter(|c| !c.is_empty())
                .collect::<Vec<_>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| {
            let mut v = vec!["cloud-node".into(), "cloud-node-lifecycle".into()];
            if real {
                // Pods on different machines reach each other through the VPC's routes
                // to each node's pod range.
                v.push("route".into());
            }
            v
        })
}

/// Starts the real machine's kube-proxy with `kubeconfig` and the cluster's ranges.
async fn start_real_proxy(
    slot: &RealSlot,
    node: &str,
    kubeconfig: PathBuf,
    net: &crate::controlplane::Networking,
) -> Result<()> {
    let cfg = with_real(slot, |r| {
        r.machine
            .proxy_config(node, &net.pod_subnet, &net.service_subnet)
    })
    .context("the machine is gone")?;
    let proxy = crate::machine::start_proxy(kubeconfig, cfg)
        .await
        .context("starting kube-proxy")?;
    // A machine gone meanwhile drops it, which stops it.
    with_real(slot, |r| r.machine.keep_proxy(proxy));
    Ok(())
}

/// kubeadm init's `kube-public/cluster-info` (a kubeconfig of the endpoint and the CA)
/// and the Role that lets joining nodes read it: upstream binds it to `system:anonymous`,
/// which kumo gives nothing, so here the bootstrap tokens' group reads it.
async fn publish_cluster_info(admin: &kube::Client, server: &str, ca_pem: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::{Api, Patch, PatchParams};
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    certificate-authority-data: {ca}\n    server: {server}\ncontexts: null\ncurrent-context: \"\"\npreferences: {{}}\nusers: null\n"
    );
    let pp = PatchParams::apply("kubeadm").force();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-public");
    cms.patch(
        "cluster-info",
        &pp,
        &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": kubeconfig},
        })),
    )
    .await?;
    let roles: Api<Role> = Api::namespaced(admin.clone(), "kube-public");
    roles.patch("kubeadm:bootstrap-signer-clusterinfo", &pp, &Patch::Apply(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "kubeadm:bootstrap-signer-clusterinfo", "namespace": "kube-public"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cluster-info"], "verbs": ["get"]}],
    })))
    .await?;
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), "kube-public");
    bindings.patch("kubeadm:bootstrap-signer-clusterinfo", &pp, &Patch::Apply(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "kubeadm:bootstrap-signer-clusterinfo", "namespace": "kube-public"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kubeadm:bootstrap-signer-clusterinfo"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:bootstrappers:kubeadm:default-node-token"}],
    })))
    .await?;
    Ok(())
}

/// kubeadm's token discovery: cluster-info read with the bootstrap token, its CA checked
/// against the pinned hashes. Returns the CA (PEM) and the API server's URL.
async fn discover(endpoint: &str, token: &str, hashes: &[String]) -> Result<(String, String)> {
    // The CA is not known yet: the connection is not verified; the pin checks the answer.
    let url = format!("https://{endpoint}/api/v1/namespaces/kube-public/configmaps/cluster-info");
    let kubeconfig_yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{endpoint}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: {token}\n"
    );
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig_yaml)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let client = kumo_client::transport::client(cfg)?;
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client, "kube-public");
    let cm = cms
        .get("cluster-info")
        .await
        .with_context(|| format!("GET {url}"))?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .context("cluster-info has no kubeconfig")?;
    let doc: serde_yaml::Value = serde_yaml::from_str(text).context("cluster-info's kubeconfig")?;
    let cluster = doc
        .get("clusters")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("cluster"))
        .context("cluster-info names no cluster")?;
    let ca_b64 = cluster
        .get("certificate-authority-data")
        .and_then(|c| c.as_str())
        .context("cluster-info has no CA")?;
    let ca = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(ca_b64)?)?;
    let hash = kumo_capi::certs::ca_cert_hash(&ca)?;
    if !hashes.iter().any(|h| h.eq_ignore_ascii_case(&hash)) {
        bail!("the cluster CA's public key hash {hash} is not one of the pinned caCertHashes");
    }
    let server = cluster
        .get("server")
        .and_then(|s| s.as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| format!("https://{endpoint}"));
    Ok((ca, server))
}

/// `kubeadm join`: discovery, then the kubelet's TLS bootstrap.
async fn join(
    ctx: &MachineContext,
    inst: &Instance,
    dir: &Path,
    config: &str,
    slot: &RealSlot,
    stop: watch::Receiver<bool>,
) -> Result<()> {
    let docs = read_kubeadm_config(dir, config)?;
    let join_cfg = docs
        .get("JoinConfiguration")
        .context("no JoinConfiguration")?;
    let bt = join_cfg
        .pointer("/discovery/bootstrapToken")
        .context("no discovery.bootstrapToken")?;
    let endpoint = bt
        .get("apiServerEndpoint")
        .and_then(Value::as_str)
        .context("no apiServerEndpoint")?
        .to_owned();
    let token = bt
        .get("token")
        .and_then(Value::as_str)
        .context("no token")?
        .to_owned();
    let hashes: Vec<String> = bt
        .get("caCertHashes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|h| h.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if hashes.is_empty()
        && !bt
            .get("unsafeSkipCAVerification")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    {
        bail!("discovery.bootstrapToken has neither caCertHashes nor unsafeSkipCAVerification");
    }
    let tenant = ctx.tenants.tenant(&endpoint);
    let mut attempt = 0;
    let (ca, server) = loop {
        match discover(&endpoint, &token, &hashes).await {
            Ok(r) => break r,
            Err(e) if attempt < 300 => {
                attempt += 1;
                tracing::debug!(instance = %inst.id, error = %format!("{e:#}"), "kubeadm join: discovery; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let reg = join_cfg
        .get("nodeRegistration")
        .cloned()
        .unwrap_or_default();
    if join_cfg.get("controlPlane").is_some() {
        // A control-plane machine: the CA from discovery must be the one it was given.
        let kdir = dir.join("etc/kubernetes");
        let given = std::fs::read_to_string(kdir.join("pki/ca.crt"))
            .context("a control-plane machine joins with the cluster's certificates")?;
        if given.trim() != ca.trim() {
            bail!("the discovered cluster CA is not the CA this machine was given");
        }
        let ip: IpAddr = inst.private_ip.parse()?;
        let mut attempt = 0;
        let (etcd, net) = loop {
            // On the real runtime (no static pods) the members this host knows of.
            let known = tenant
                .etcd
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned()
                .collect();
            match etcd_endpoints(&kdir, &endpoint, ip, known).await {
                Ok(m) => break m,
                Err(e) if attempt < 120 => {
                    attempt += 1;
                    tracing::debug!(instance = %inst.id, error = %format!("{e:#}"), "kubeadm join: etcd endpoints; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let start = Start::Join { etcd };
        return control_plane(ctx, inst, dir, &endpoint, &net, &reg, start, slot, stop).await;
    }
    let kdir = dir.join("etc/kubernetes");
    let pki = kdir.join("pki");
    std::fs::create_dir_all(&pki)?;
    let ca_file = pki.join("ca.crt");
    kumo_apiserver::pki::write_file(&ca_file, ca.as_bytes(), 0o644)?;
    let ca_b64 = base64::engine::general_purpose::STANDARD.encode(&ca);
    let bootstrap = kdir.join("bootstrap-kubelet.conf");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca_b64}\nusers:\n- name: tls-bootstrap-token-user\n  user:\n    token: {token}\ncontexts:\n- name: tls-bootstrap-token-user@kubernetes\n  context:\n    cluster: kubernetes\n    user: tls-bootstrap-token-user\ncurrent-context: tls-bootstrap-token-user@kubernetes\n"
    );
    crate::hypervisor::write_private(&bootstrap, text.as_bytes())?;
    let tls = crate::hypervisor::TlsBootstrap {
        kubeconfig: kdir.join("kubelet.conf"),
        bootstrap,
        cert_dir: dir.join("var/lib/kubelet/pki"),
    };
    let mut cfg = kubelet_config(inst, &reg, &tls.kubeconfig, false, &ca_file, &tenant)?;
    if let Some(vpc) = &ctx.vpc {
        let node_name = cfg.node_name.clone();
        boot_real(ctx, vpc, inst, &node_name, &endpoint, &tenant, slot).await?;
        with_real(slot, |r| r.configure_kubelet(&mut cfg)).context("the machine is gone")??;
        // Its kube-proxy, with the credentials the control plane issued.
        let mut issued = tenant.proxy_kubeconfig.subscribe();
        let (kc, net) =
            tokio::time::timeout(Duration::from_secs(300), issued.wait_for(Option::is_some))
                .await
                .context("no control-plane machine of the cluster issued kube-proxy's credentials")?
                .map_err(|_| anyhow::anyhow!("kube-proxy's credentials"))?
                .clone()
                .context("kube-proxy's credentials")?;
        start_real_proxy(slot, &node_name, kc, &net).await?;
    }
    let mut attempt = 0;
    cfg.cluster_dns = loop {
        match download_cluster_dns(&tls.bootstrap).await {
            Ok(dns) => break dns,
            Err(e) if attempt < 60 => {
                attempt += 1;
                tracing::debug!(instance = %inst.id, error = %format!("{e:#}"), "kubeadm join: kubelet-config; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let netns = with_real(slot, |r| r.machine.netns.clone());
    let dial = netns.is_none().then(|| tenant.dial.clone());
    let node = cfg.node_name.clone();
    std::thread::Builder::new()
        .name(format!("kubelet-{node}"))
        .spawn(move || crate::hypervisor::kubelet_thread(cfg, Some(tls), dial, netns, stop))
        .context("starting the kubelet")?;
    tracing::info!(instance = %inst.id, node = %node, endpoint = %endpoint, "kubeadm join: kubelet started");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_configuration_names_the_cluster_and_its_ranges() {
        let net = networking(&json!({})).unwrap();
        assert_eq!(net, crate::controlplane::Networking::default());
        let net = networking(&json!({
            "clusterName": "demo",
            "networking": {"podSubnet": "fd00::/48, 192.168.0.0/16", "serviceSubnet": "10.96.0.0/12"},
        }))
        .unwrap();
        assert_eq!(net.cluster_name, "demo");
        assert_eq!(net.pod_subnet, "192.168.0.0/16");
        let net = networking(&json!({"networking": {"serviceSubnet": "10.100.0.0/16"}})).unwrap();
        assert_eq!(net.service_subnet, "10.100.0.0/16");
        let err = networking(&json!({"networking": {"serviceSubnet": "10.100.0.0/31"}}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("10.100.0.0/31"), "{err}");
        assert!(networking(&json!({"networking": {"podSubnet": "fd00::/48"}})).is_err());
    }

    #[test]
    fn cloud_init_is_read_as_kubeadm_runs_it() {
        let inst: Instance = serde_json::from_value(json!({
            "id": "i-1", "name": "cp-abc", "instanceType": "m1.small", "cpu": 2, "memoryMib": 2048,
            "state": "running", "region": "kumo-1", "zone": "kumo-1a", "vpcId": "v", "subnetId": "s",
            "privateIp": "10.0.1.5", "privateDnsName": "x", "launchTime": "t", "tags": {}, "userData": ""
        }))
        .expect("an instance");
        let ud = "## template: jinja\n#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm.yaml\n  owner: root:root\n  permissions: '0640'\n  content: |\n    name: '{{ ds.meta_data.local_hostname }}'\nruncmd:\n- 'kubeadm init --config /run/kubeadm/kubeadm.yaml && echo success > /run/cluster-api/bootstrap-success.complete'\n";
        assert!(is_cloud_init(ud));
        assert!(!is_cloud_init("{\"controlPlane\":true}"));
        let c = parse(ud, &inst).expect("parsed");
        assert_eq!(
            c.files,
            vec![(
                "/run/kubeadm/kubeadm.yaml".into(),
                "name: 'cp-abc'\n".into(),
                0o640
            )]
        );
        assert_eq!(
            kubeadm_step(&c.runcmd),
            Some(Step::Init("/run/kubeadm/kubeadm.yaml".into()))
        );
        assert_eq!(kubeadm_step(&["echo hi".into()]), None);
        assert!(parse("#cloud-config\nwrite_files: [{content: x}]\n", &inst).is_err());
    }

    #[test]
    fn the_bootstrap_providers_data_is_what_this_image_runs() {
        let inst: Instance = serde_json::from_value(json!({
            "id": "i-2", "name": "w-1", "instanceType": "k1.small", "cpu": 2, "memoryMib": 2048,
            "state": "running", "region": "kumo-1", "zone": "kumo-1b", "vpcId": "v", "subnetId": "s",
            "privateIp": "10.0.2.5", "privateDnsName": "x", "launchTime": "t", "tags": {}, "userData": ""
        }))
        .expect("an instance");
        let facts = kumo_capi::kubeadm::ClusterFacts {
            name: "demo".into(),
            endpoint: "127.0.0.1:40000".into(),
            version: "v1.37.2".into(),
            ..Default::default()
        };
        let spec = json!({"joinConfiguration": {"nodeRegistration": {
            "kubeletExtraArgs": [{"name": "cloud-provider", "value": "external"}]}}});
        let data = kumo_capi::kubeadm::join_data(
            &spec,
            &facts,
            "abcdef.0123456789abcdef",
            "sha256:00",
            None,
        );
        let c = parse(&data, &inst).expect("parsed");
        assert_eq!(
            kubeadm_step(&c.runcmd),
            Some(Step::Join(kumo_capi::kubeadm::JOIN_CONFIG_PATH.into()))
        );
        let (_, text, mode) = c
            .files
            .iter()
            .find(|f| f.0 == kumo_capi::kubeadm::JOIN_CONFIG_PATH)
            .expect("the join configuration");
        assert_eq!(*mode, 0o640);
        let docs = kubeadm_documents(text).expect("kubeadm documents");
        let join = &docs["JoinConfiguration"];
        assert_eq!(join["apiVersion"], "kubeadm.k8s.io/v1beta4");
        assert_eq!(
            join["discovery"]["bootstrapToken"]["apiServerEndpoint"],
            "127.0.0.1:40000"
        );
        assert_eq!(join["nodeRegistration"]["name"], "w-1");
        assert_eq!(
            kubelet_args(&join["nodeRegistration"])
                .get("cloud-provider")
                .map(String::as_str),
            Some("external")
        );
    }
}
