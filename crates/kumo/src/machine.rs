//! What a node runs its pods on: the simulator (`--runtime sim`, every node in this
//! process's shared simulated network), or a machine of its own (`--runtime containerd`):
//! a network namespace with its containerd, which the kubelet drives through the CRI.
//! Nodes' machines live in `<data-dir>/nodes/<node>/` and are torn down when the node
//! goes (an instance halted, `kumo down`, the process's end).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};

/// The container runtime of a cluster's nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RuntimeKind {
    /// The simulator: no process runs; every container is a model.
    #[default]
    Sim,
    /// containerd and runc through the CRI, one containerd per node.
    Containerd,
}

impl std::str::FromStr for RuntimeKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sim" => Ok(RuntimeKind::Sim),
            "containerd" => Ok(RuntimeKind::Containerd),
            _ => Err(format!("unknown runtime {s:?} (sim, containerd)")),
        }
    }
}

/// A booted node machine, as the kubelet is configured for it.
pub struct Machine {
    pub factory: kumo_cri::RuntimeFactory,
    /// The kubelet's `--cgroup-root`.
    pub cgroup_root: String,
    /// The machine's network namespace (under `/run/netns`).
    pub netns: String,
    /// The node's registry mirror's socket, on its loopback (see [`serve_registry`]).
    pub registry: std::net::TcpListener,
}

/// The directory of node `node`'s machine.
pub fn node_dir(data_dir: &Path, node: &str) -> PathBuf {
    data_dir.join("nodes").join(node)
}

/// The directory of the machine that runs node `node`: a cluster node's (`nodes/<node>`),
/// else that of a workload cluster's machine whose node it is
/// (`machines/<instance>/node`).
pub fn find_node_dir(data_dir: &Path, node: &str) -> PathBuf {
    let own = node_dir(data_dir, node);
    if kumo_node::read_record(&own).is_some() {
        return own;
    }
    tenant_machines(data_dir)
        .into_iter()
        .find(|d| kumo_node::read_record(d).is_some_and(|r| r.name == node))
        .unwrap_or(own)
}

/// Where kumo packs its offline images (pause, busybox) for the nodes to import.
pub fn images_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("images")
}

/// Boots node `node`'s machine: its namespace and containerd (with kumo's images and
/// those loaded with `kumo load image-archive` before), and the CRI client the kubelet
/// drives it with. Blocking (about a second).
pub fn boot(data_dir: &Path, node: &str) -> Result<Machine> {
    boot_at(data_dir, &node_dir(data_dir, node), node)
}

/// [`boot`] with the machine's directory `dir` (a workload cluster's machine keeps it
/// under its instance's, `<data-dir>/machines/<instance>/node`).
pub fn boot_at(data_dir: &Path, dir: &Path, node: &str) -> Result<Machine> {
    let dir = dir.to_path_buf();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // The sandbox image is imported as the machine boots; kumo's other images (and the
    // cluster DNS's) are pulled from the machine's registry mirror when a pod first asks
    // for them (each import at boot took seconds off every machine's start).
    let mut images: Vec<PathBuf> =
        kumo_node::images::build(&images_dir(data_dir)).context("packing kumo's offline images")?;
    images.retain(|p| p.ends_with(kumo_node::images::PAUSE_ARCHIVE));
    if let Some(exe) = kumo_binary() {
        dns_image(&images_dir(data_dir), &exe).context("packing the cluster DNS's image")?;
    }
    images.extend(loaded_archives(data_dir));
    let host = kumo_node::NodeHost::start(&kumo_node::NodeSpec {
        name: node.to_owned(),
        dir: dir.clone(),
        images,
    })?;
    let runtime = kumo_cri_remote::RemoteRuntime::connect(kumo_cri_remote::Options {
        socket: host.socket(),
        root_dir: dir.join("kubelet"),
        pod_logs_dir: dir.join("log").join("pods"),
        netns: Some(host.netns_path()),
    })?;
    let registry = kumo_cri_remote::netns::run_in(Some(&host.netns_path()), || {
        std::net::TcpListener::bind((
            std::net::Ipv4Addr::LOCALHOST,
            kumo_node::REGISTRY_MIRROR_PORT,
        ))
    })
    .context("the node's registry mirror")?;
    registry.set_nonblocking(true)?;
    Ok(Machine {
        factory: kumo_cri_remote::factory(Arc::new(runtime)),
        cgroup_root: host.record().cgroup_root.clone(),
        netns: host.record().netns.clone(),
        registry,
    })
}

/// Serves the node's registry mirror on `listener`: the archives its containerd imported
/// (kumo's offline images, those `kumo load image-archive` keeps), as a registry would,
/// so pulls of them (`imagePullPolicy: Always`, `:latest`) work offline. Runs until the
/// returned task is aborted.
pub fn serve_registry(
    data_dir: &Path,
    listener: std::net::TcpListener,
) -> Result<tokio::task::JoinHandle<()>> {
    let store = kumo_registry::Store::new(vec![images_dir(data_dir), loaded_dir(data_dir)]);
    let listener = tokio::net::TcpListener::from_std(listener)?;
    Ok(tokio::spawn(kumo_registry::serve(
        listener,
        Arc::new(store),
    )))
}

/// The image the `coredns` pods run `kumo dns` in: this binary's libraries, the binary
/// itself mounted from the machine (see [`crate::addons::ensure_real`]).
fn dns_image(dir: &Path, exe: &Path) -> Result<PathBuf> {
    Ok(kumo_node::images::write_once(dir, "kumo-dns.tar", || {
        kumo_node::images::archive(&kumo_node::images::program_image(
            exe,
            crate::addons::DNS_BINARY_MOUNT,
            vec![crate::addons::dns_image()],
        )?)
    })?)
}

/// The kumo binary the `coredns` pods run: `$KUMO_BINARY`, else this process's program
/// when it is kumo (a test harness that runs a cluster in process is not: its clusters
/// get no cluster DNS pods).
pub fn kumo_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KUMO_BINARY").map(PathBuf::from) {
        return p.is_file().then_some(p);
    }
    let exe = std::env::current_exe().ok()?;
    (exe.file_name()? == "kumo").then_some(exe)
}

/// Where the cloud's VPC of a cluster on the real runtime is recorded (in the cloud's
/// data directory: the VPC is the cloud's).
pub fn vpc_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("cloud").join("vpc")
}

/// Whether `vip` accepts a TCP connection from the cloud's public side (`None`: the
/// cluster of `data_dir` has no real network).
pub fn vip_answers(data_dir: &Path, vip: std::net::SocketAddr) -> Option<bool> {
    let netns = kumo_vpc::public_netns_of(&vpc_dir(data_dir)).ok()?;
    // The connection is opened by a thread that entered the public side's namespace.
    Some(
        kumo_cri_remote::netns::connect(Some(&netns), vip, std::time::Duration::from_secs(3))
            .is_ok(),
    )
}

/// `kumo cloud exec -- CMD...`: runs `command` on the public side of the cloud whose data
/// directory is `cloud_dir`; returns its exit code.
pub fn cloud_exec(cloud_dir: &Path, command: &[String]) -> Result<i32> {
    let (program, args) = command.split_first().context("no command")?;
    let status = kumo_vpc::public_command_of(&cloud_dir.join("vpc"), program)
        .context("the cloud's network is not real here (kumo up --runtime containerd makes it)")?
        .args(args)
        .status()
        .with_context(|| format!("running {program}"))?;
    Ok(status.code().unwrap_or(1))
}

/// Makes the cloud's VPC for a cluster on the real runtime: a namespace with a bridge per
/// subnet of the cloud's layout. Blocking.
pub fn create_vpc(data_dir: &Path) -> Result<kumo_vpc::Vpc> {
    let subnets = (0..kumo_cloud::ZONES.len())
        .map(|i| kumo_vpc::Cidr::parse(&kumo_cloud::state::subnet_cidr(i)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(kumo_vpc::Vpc::create(&vpc_dir(data_dir), &subnets)?)
}

/// The cloud's route table carried by the VPC's namespace.
pub struct VpcNetwork(pub Arc<kumo_vpc::Vpc>);

#[async_trait::async_trait]
impl kumo_cloud::Network for VpcNetwork {
    async fn set_routes(&self, routes: &[kumo_cloud::NextHop]) -> Result<(), String> {
        let routes = routes
            .iter()
            .map(|r| Ok((kumo_vpc::Cidr::parse(&r.destination)?, r.via)))
            .collect::<Result<Vec<_>, kumo_vpc::Error>>()
            .map_err(|e| e.to_string())?;
        let vpc = self.0.clone();
        tokio::task::spawn_blocking(move || vpc.set_routes(&routes))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    fn probes(&self) -> bool {
        true
    }

    async fn probe(&self, target: std::net::SocketAddr, check: &kumo_cloud::HealthCheck) -> bool {
        let vpc = self.0.clone();
        let path = (check.protocol.eq_ignore_ascii_case("HTTP"))
            .then(|| check.path.clone().unwrap_or_else(|| "/".into()));
        let timeout = std::time::Duration::from_secs(u64::from(check.timeout_seconds.max(1)));
        tokio::task::spawn_blocking(move || vpc.probe(target, path.as_deref(), timeout))
            .await
            .unwrap_or(false)
    }

    async fn set_load_balancers(&self, lbs: &[kumo_cloud::LbRoute]) -> Result<(), String> {
        let lbs: Vec<kumo_vpc::LoadBalancer> = lbs
            .iter()
            .map(|l| kumo_vpc::LoadBalancer {
                id: l.id.clone(),
                vip: l.vip,
                listeners: l
                    .listeners
                    .iter()
                    .map(|x| {
                        (
                            x.protocol.as_str().to_ascii_lowercase(),
                            x.port,
                            x.target_port,
                        )
                    })
                    .collect(),
                targets: l.targets.clone(),
            })
            .collect();
        let vpc = self.0.clone();
        tokio::task::spawn_blocking(move || vpc.set_load_balancers(&lbs))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }
}

/// Relays connections made to `listen` inside namespace `netns` to `to` on this host's
/// loopback: how the control-plane node's address reaches the API server that runs in
/// this process (kube-apiserver listens on its node's address; this one on loopback).
/// Ends when the returned task is aborted.
fn relay(
    netns: &Path,
    listen: std::net::SocketAddr,
    to: std::net::SocketAddr,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener =
        kumo_cri_remote::netns::run_in(Some(netns), move || std::net::TcpListener::bind(listen))
            .with_context(|| format!("listening on {listen} in {}", netns.display()))?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    Ok(tokio::spawn(pipe_each(listener, move || async move {
        tokio::net::TcpStream::connect(to).await
    })))
}

/// Accepts connections on `listener` and pipes each, both ways, to a connection `dial`
/// opens for it (one that does not open drops the accepted one). Ends when aborted.
async fn pipe_each<F, Fut>(listener: tokio::net::TcpListener, dial: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<tokio::net::TcpStream>> + Send + 'static,
{
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            // Out of descriptors, say: try again in a moment rather than spin.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let up = dial();
        tokio::spawn(async move {
            if let Ok(mut up) = up.await {
                let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
            }
        });
    }
}

/// The other way round: connections made to a fresh port on this host's loopback are
/// relayed to `to` inside namespace `netns` — how the API server in this process reaches a
/// kubelet that listens on its node's address (a port kumo maps to 127.0.0.1; nothing is
/// dialed from the host's own namespace). Returns the loopback address and the task.
async fn relay_into(
    netns: &Path,
    to: std::net::SocketAddr,
) -> Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
    let at = listener.local_addr()?;
    let netns = netns.to_path_buf();
    let task = tokio::spawn(pipe_each(listener, move || {
        let netns = netns.clone();
        async move {
            let s = tokio::task::spawn_blocking(move || {
                let s = kumo_cri_remote::netns::connect(
                    Some(&netns),
                    to,
                    std::time::Duration::from_secs(10),
                )?;
                s.set_nonblocking(true)?;
                Ok::<_, std::io::Error>(s)
            })
            .await
            .map_err(std::io::Error::other)??;
            tokio::net::TcpStream::from_std(s)
        }
    }));
    Ok((at, task))
}

/// A node's kube-proxy thread and how to stop it (it removes its table as it goes).
pub struct ProxyThread {
    stop: tokio::sync::watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl ProxyThread {
    /// Stops it and waits until it has removed its table.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

/// A node's kube-proxy with the credentials of `kubeconfig`, in nftables mode, on a thread
/// and runtime of its own in the namespace `cfg` names: it programs that namespace and
/// reaches the API server from there, as a node's kube-proxy does.
pub async fn start_proxy(
    kubeconfig: PathBuf,
    cfg: kumo_proxy::nft::NftConfig,
) -> Result<ProxyThread> {
    let node = cfg.node_name.clone();
    let netns = cfg.netns.clone().context("kube-proxy's namespace")?;
    let (stop, mut stop_rx) = tokio::sync::watch::channel(false);
    let (started_tx, started) = tokio::sync::oneshot::channel::<anyhow::Result<()>>();
    let thread = std::thread::Builder::new()
        .name(format!("kube-proxy-{node}"))
        .spawn(move || {
            let run = || -> anyhow::Result<tokio::runtime::Runtime> {
                kumo_cri_remote::netns::enter(&netns)?;
                Ok(tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?)
            };
            let rt = match run() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                let client = match async {
                    let config = kumo_client::clients::config_from_kubeconfig(&kubeconfig).await?;
                    Ok::<_, anyhow::Error>(kumo_client::transport::client(config)?)
                }
                .await
                {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                };
                let _ = started_tx.send(Ok(()));
                let proxy = kumo_proxy::nft::NftProxy::start(
                    client,
                    cfg,
                    kumo_proxy::nft::SyncPeriods::default(),
                );
                let _ = stop_rx.wait_for(|s| *s).await;
                proxy.shutdown().await;
            });
        })?;
    started
        .await
        .map_err(|_| anyhow::anyhow!("kube-proxy's thread ended"))??;
    Ok(ProxyThread { stop, thread })
}

/// A machine of the cloud's VPC as a workload cluster's instance has it: booted in its
/// directory, its NIC on its subnet's bridge at its private address, its registry mirror
/// served, the kubelet's port (10250 on that address) reachable from this host's loopback
/// at [`VpcMachine::kubelet_at`], and whatever relays and kube-proxy it is given. Powered
/// off with [`VpcMachine::power_off`].
pub struct VpcMachine {
    pub factory: kumo_cri::RuntimeFactory,
    pub cgroup_root: String,
    /// The machine's network namespace (a path under `/run/netns`).
    pub netns: PathBuf,
    pub ip: std::net::Ipv4Addr,
    /// Where this host reaches the kubelet's port in the machine.
    pub kubelet_at: std::net::SocketAddr,
    dir: PathBuf,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    proxy: Option<ProxyThread>,
}

impl VpcMachine {
    /// Boots machine `name` in `dir`, attached to `vpc` at `ip`.
    pub async fn boot(
        data_dir: &Path,
        dir: &Path,
        name: &str,
        vpc: Arc<kumo_vpc::Vpc>,
        ip: std::net::Ipv4Addr,
    ) -> Result<VpcMachine> {
        let (data, at, node) = (data_dir.to_path_buf(), dir.to_path_buf(), name.to_owned());
        let m = tokio::task::spawn_blocking(move || {
            let m = boot_at(&data, &at, &node)?;
            if let Err(e) = vpc.attach(&m.netns, ip) {
                let _ = kumo_node::teardown(&at);
                return Err(anyhow::anyhow!("attaching {node} to the VPC: {e}"));
            }
            Ok::<_, anyhow::Error>(m)
        })
        .await
        .context("booting the machine")??;
        let netns = Path::new("/run/netns").join(&m.netns);
        let mut machine = VpcMachine {
            factory: m.factory,
            cgroup_root: m.cgroup_root,
            netns: netns.clone(),
            ip,
            kubelet_at: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            dir: dir.to_path_buf(),
            tasks: Vec::new(),
            proxy: None,
        };
        // From here on, a failure powers the machine off as it drops out of scope.
        let started = async {
            machine.tasks.push(serve_registry(data_dir, m.registry)?);
            let (at, task) = relay_into(
                &netns,
                std::net::SocketAddr::from((ip, crate::hypervisor::KUBELET_PORT)),
            )
            .await?;
            machine.kubelet_at = at;
            machine.tasks.push(task);
            Ok::<_, anyhow::Error>(())
        }
        .await;
        machine.or_power_off(started).await
    }

    /// The machine if its setting up (`set_up`) went well, else powered off and the error.
    pub async fn or_power_off(self, set_up: Result<()>) -> Result<VpcMachine> {
        match set_up {
            Ok(()) => Ok(self),
            Err(e) => {
                self.power_off().await;
                Err(e)
            }
        }
    }

    /// Relays connections to `listen` in the machine to `to` on this host's loopback.
    pub fn relay(&mut self, listen: std::net::SocketAddr, to: std::net::SocketAddr) -> Result<()> {
        self.tasks.push(relay(&self.netns, listen, to)?);
        Ok(())
    }

    /// The configuration of the node's kube-proxy (nftables, in this machine) for the
    /// cluster's ranges; [`start_proxy`] starts it, [`VpcMachine::keep_proxy`] keeps it.
    pub fn proxy_config(
        &self,
        node: &str,
        cluster_cidr: &str,
        service_cidr: &str,
    ) -> kumo_proxy::nft::NftConfig {
        kumo_proxy::nft::NftConfig {
            node_name: node.to_owned(),
            node_ips: vec![self.ip],
            cluster_cidr: kumo_proxy::nft::parse_cidr(cluster_cidr),
            service_cidrs: kumo_proxy::nft::parse_cidr(service_cidr)
                .into_iter()
                .collect(),
            netns: Some(self.netns.clone()),
        }
    }

    /// Keeps the node's kube-proxy, to stop it when the machine powers off.
    pub fn keep_proxy(&mut self, proxy: ProxyThread) {
        self.proxy = Some(proxy);
    }

    /// Powers the machine off: its relays, kube-proxy (which removes its table), pods,
    /// containerd and namespace go.
    pub async fn power_off(mut self) {
        for t in self.tasks.drain(..) {
            // A listening socket would keep the namespace alive.
            t.abort();
        }
        if let Some(p) = self.proxy.take() {
            p.stop().await;
        }
        let dir = self.dir.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Err(e) = kumo_node::teardown(&dir) {
                tracing::warn!(machine = %dir.display(), error = %e, "tearing the machine down");
            }
        })
        .await;
    }
}

/// Powers off every node machine recorded under `data_dir`, then the VPC they were on.
pub fn power_off_all(data_dir: &Path) {
    for dir in kumo_node::recorded(&data_dir.join("nodes")) {
        if let Err(e) = kumo_node::teardown(&dir) {
            tracing::warn!(node = %dir.display(), error = %e, "tearing the node's machine down");
        }
    }
    // The workload clusters' machines (Cluster API's instances on the real runtime).
    for dir in tenant_machines(data_dir) {
        if let Err(e) = kumo_node::teardown(&dir) {
            tracing::warn!(machine = %dir.display(), error = %e, "tearing the machine down");
        }
    }
    if let Err(e) = kumo_vpc::teardown(&vpc_dir(data_dir)) {
        tracing::warn!(error = %e, "tearing the VPC down");
    }
    // The stacked etcd members of Cluster API's control-plane machines.
    crate::etcd::stop_all(&data_dir.join("machines"));
}

/// The recorded machines of Cluster API's instances (`machines/<instance>/node`).
fn tenant_machines(data_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("machines")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path().join("node"))
        .filter(|d| kumo_node::netns_of(d).is_some())
        .collect()
}

/// The directory `kumo load image-archive` keeps archives in, for nodes that boot later.
fn loaded_dir(data_dir: &Path) -> PathBuf {
    images_dir(data_dir).join("loaded")
}

fn loaded_archives(data_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(loaded_dir(data_dir)) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    v.sort();
    v
}

/// `kumo load image-archive`: imports each archive into every running node's containerd
/// and keeps a copy for nodes that boot later. Returns the nodes it went to.
pub fn load_image_archives(data_dir: &Path, archives: &[PathBuf]) -> Result<Vec<String>> {
    let keep = loaded_dir(data_dir);
    std::fs::create_dir_all(&keep).with_context(|| format!("creating {}", keep.display()))?;
    let nodes = kumo_node::recorded(&data_dir.join("nodes"));
    let mut names = Vec::new();
    for archive in archives {
        let name = archive
            .file_name()
            .with_context(|| format!("{} is not a file", archive.display()))?;
        std::fs::copy(archive, keep.join(name))
            .with_context(|| format!("copying {}", archive.display()))?;
        for dir in &nodes {
            let socket = dir.join("containerd").join("containerd.sock");
            kumo_node::import(&socket, archive).with_context(|| {
                format!("importing {} into {}", archive.display(), dir.display())
            })?;
        }
    }
    for dir in &nodes {
        if let Some(n) = dir.file_name() {
            names.push(n.to_string_lossy().into_owned());
        }
    }
    Ok(names)
}

/// The machine's CPUs and memory (what a node on this host has), as quantities.
pub fn host_capacity() -> (String, String) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(8 << 20);
    (cpus.to_string(), format!("{mem_kib}Ki"))
}

/// The pod network of the nodes' machines, as the API server's pod and service proxies
/// reach it: a pod's address is dialed from inside the namespace of the node whose pods
/// have it (each node's namespace routes only its own pod range, so the others answer
/// "network unreachable" at once).
#[derive(Debug)]
pub struct MachinesNetwork {
    machines: Machines,
}

/// Where [`MachinesNetwork`] finds the machines' namespaces.
#[derive(Debug)]
enum Machines {
    /// Those recorded under a directory (a cluster's `nodes/`).
    Recorded(PathBuf),
    /// Those a workload cluster's machines registered as they booted.
    Listed(Arc<NetnsList>),
}

/// The network namespaces of one workload cluster's machines, by instance id.
#[derive(Debug, Default)]
pub struct NetnsList(std::sync::Mutex<std::collections::BTreeMap<String, PathBuf>>);

impl NetnsList {
    pub fn insert(&self, id: &str, netns: PathBuf) {
        self.lock().insert(id.to_owned(), netns);
    }

    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    fn paths(&self) -> Vec<PathBuf> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, PathBuf>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl MachinesNetwork {
    pub fn new(data_dir: &Path) -> Self {
        MachinesNetwork {
            machines: Machines::Recorded(data_dir.join("nodes")),
        }
    }

    /// The pod network of a workload cluster's machines.
    pub fn listed(list: Arc<NetnsList>) -> Self {
        MachinesNetwork {
            machines: Machines::Listed(list),
        }
    }

    fn dial(&self, to: std::net::SocketAddr) -> std::io::Result<std::net::TcpStream> {
        let mut last = std::io::Error::from(std::io::ErrorKind::NetworkUnreachable);
        let namespaces = match &self.machines {
            Machines::Recorded(dir) => kumo_node::recorded(dir)
                .iter()
                .filter_map(|d| kumo_node::netns_of(d))
                .collect(),
            Machines::Listed(list) => list.paths(),
        };
        for netns in namespaces {
            match kumo_cri_remote::netns::connect(
                Some(&netns),
                to,
                std::time::Duration::from_secs(5),
            ) {
                Ok(s) => return Ok(s),
                Err(e) if e.kind() == std::io::ErrorKind::NetworkUnreachable => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }
}

impl kumo_apiserver::resource_proxy::PodNetwork for MachinesNetwork {
    /// Real servers: whether one speaks TLS is for the handshake to find out.
    fn serves_tls(&self, _to: std::net::SocketAddr) -> bool {
        true
    }

    fn connect(&self, to: std::net::SocketAddr) -> std::io::Result<tokio::io::DuplexStream> {
        let stream = self.dial(to)?;
        stream.set_nonblocking(true)?;
        let mut stream = tokio::net::TcpStream::from_std(stream)?;
        let (near, mut far) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let _ = tokio::io::copy_bidirectional(&mut far, &mut stream).await;
        });
        Ok(near)
    }
}
