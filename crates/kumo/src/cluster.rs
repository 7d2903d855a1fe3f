//! A whole cluster in one process, as `kumo up` runs it: the API server (on the embedded
//! store or etcd), then the controller-manager, the scheduler and the nodes, each an API client
//! with its own identity (kubeadm's controller-manager.conf and scheduler.conf, a kubelet
//! kubeconfig for `system:node:<name>`), never admin. Tests start the same cluster.
//!
//! Without a cloud ([`ClusterConfig::new`], `kumo up --no-cloud`) there is one kubelet
//! named after the host, as plain on-premises kubeadm. With one ([`ClusterConfig::with_cloud`],
//! `kumo up`'s default) the kumo cloud runs too, in `<data-dir>/cloud`: the nodes are its
//! instances (`<name>-control-plane`, `<name>-worker`, `<name>-worker2`, ..., kind's
//! names), each booting a kubelet with `--cloud-provider=external` (see
//! [`crate::hypervisor`]), and the cloud-controller-manager runs with its own identity in
//! the cluster and its own access key in the cloud.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use kumo_apiserver::proxy::KubeletDialOverrides;
use kumo_cloud::{InstanceFilter, InstanceState, RunInstanceRequest};
use tokio::sync::watch;

use crate::hypervisor::{KubeletHypervisor, NodeBootstrap};

/// The taint a kubelet with `--cloud-provider=external` registers with, until the cloud
/// node controller has initialized the node.
const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// What to run.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub data_dir: PathBuf,
    /// The API server's port on 127.0.0.1 (0 picks one).
    pub port: u16,
    /// The API server's store: embedded (in `data_dir`) or etcd.
    pub store: kumo_apiserver::server::StoreConfig,
    /// The kubelet's node name.
    pub node_name: String,
    pub controller_manager: bool,
    pub scheduler: bool,
    /// The host-named kubelet (without a cloud only: with one, the nodes are instances).
    pub kubelet: bool,
    /// The cloud, its instances and the cloud-controller-manager; None: no cloud.
    pub cloud: Option<CloudSettings>,
    /// kubeadm's addons (CoreDNS and the kube-proxy DaemonSet, see [`crate::addons`]).
    pub addons: bool,
    /// What the nodes run their pods on.
    pub runtime: crate::machine::RuntimeKind,
}

/// The cloud part of a cluster.
#[derive(Clone, Debug)]
pub struct CloudSettings {
    /// The cluster's name: the instances are `<name>-control-plane` and the workers.
    pub name: String,
    /// How many worker instances (besides the control-plane one).
    pub workers: usize,
    /// The cloud-controller-manager's `--controllers` (`*`: all of them); empty: no
    /// cloud-controller-manager at all.
    pub controllers: Vec<String>,
    /// Cluster API and the kumo cloud's infrastructure provider (see
    /// [`crate::clusterapi`]): this cluster hands out workload clusters.
    pub cluster_api: bool,
}

impl Default for CloudSettings {
    /// `kumo`, one worker, every cloud controller.
    fn default() -> CloudSettings {
        CloudSettings {
            name: "kumo".into(),
            workers: 1,
            controllers: vec!["*".into()],
            cluster_api: false,
        }
    }
}

impl CloudSettings {
    /// The control-plane instance's (and node's) name.
    pub fn control_plane_name(&self) -> String {
        format!("{}-control-plane", self.name)
    }

    /// The workers' names, as kind names them: `<name>-worker`, `<name>-worker2`, ...
    pub fn worker_names(&self) -> Vec<String> {
        (1..=self.workers)
            .map(|i| match i {
                1 => format!("{}-worker", self.name),
                i => format!("{}-worker{i}", self.name),
            })
            .collect()
    }

    /// Every node's name, the control plane first.
    pub fn node_names(&self) -> Vec<String> {
        let mut v = vec![self.control_plane_name()];
        v.extend(self.worker_names());
        v
    }
}

impl ClusterConfig {
    /// Everything, in `data_dir`, on port 6443, with a node named after the host.
    pub fn new(data_dir: impl Into<PathBuf>) -> ClusterConfig {
        ClusterConfig {
            data_dir: data_dir.into(),
            port: 6443,
            store: kumo_apiserver::server::StoreConfig::Embedded,
            node_name: default_node_name(),
            controller_manager: true,
            scheduler: true,
            kubelet: true,
            cloud: None,
            addons: true,
            runtime: crate::machine::RuntimeKind::Sim,
        }
    }

    /// Everything with the cloud ([`CloudSettings::default`]), in `data_dir`, on port 6443.
    pub fn with_cloud(data_dir: impl Into<PathBuf>) -> ClusterConfig {
        ClusterConfig {
            kubelet: false,
            cloud: Some(CloudSettings::default()),
            ..ClusterConfig::new(data_dir)
        }
    }

    /// The cloud's data directory (`kumo cloud --data-dir` takes it).
    pub fn cloud_dir(&self) -> PathBuf {
        self.data_dir.join("cloud")
    }

    /// The cloud-controller-manager's cloud credentials (a `--cloud-config` file).
    pub fn ccm_cloud_config(&self) -> PathBuf {
        self.data_dir.join("cloud-controller-manager.cloud.json")
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
    /// The kubelet's kubeconfig (`system:node:<name>`), when a host kubelet runs.
    pub node_kubeconfig: Option<PathBuf>,
    pub config: ClusterConfig,
    /// The cloud, when there is one.
    pub cloud: Option<ClusterCloud>,
    /// The pods' simulated network: the proxy programs it, the kubelets' pods use it.
    pub dataplane: Arc<kumo_sim::net::Dataplane>,
}

/// The cloud of a running cluster.
pub struct ClusterCloud {
    pub server: kumo_cloud::CloudServer,
    /// A client with the cloud's admin access key.
    pub client: kumo_cloud::Client,
    /// The cluster's instances, control plane first, as found or created at start.
    pub instances: Vec<InstanceStart>,
    /// The cloud-controller-manager's access key id (what `kumo cloud policy deny
    /// --credential` names), when it runs.
    pub ccm_access_key_id: Option<String>,
    /// Boots and halts the instances' kubelets.
    pub hypervisor: Arc<KubeletHypervisor>,
}

/// An instance of the cluster at start.
#[derive(Clone, Debug)]
pub struct InstanceStart {
    pub instance: kumo_cloud::Instance,
    /// Launched by this start (false: found from an earlier one).
    pub created: bool,
}

pub(crate) fn server_url(kubeconfig: &Path) -> Result<String> {
    let text = std::fs::read_to_string(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_owned))
        .context("the admin kubeconfig names no server")
}

/// The InternalIP of the one node of `kumo up --no-cloud`: an address of the simulated
/// network (the cloud's instances get theirs from their subnet).
pub const NO_CLOUD_NODE_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 0, 11);

/// The pods' range (the controller-manager's `--cluster-cidr`, kube-proxy's too).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The Services' range (`--service-cluster-ip-range`).
pub const SERVICE_CIDR: &str = "10.96.0.0/12";

/// The control-plane instance's address on the real network (the first free one of
/// zone kumo-1a's subnet, asked for at launch so that the API server can name it first).
pub const CONTROL_PLANE_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 1, 4);

/// Starts the API server and then each component; the components restart if they stop.
pub async fn start(cfg: ClusterConfig) -> Result<Cluster> {
    if let Some(c) = &cfg.cloud {
        // A bad --cloud-controllers would otherwise only show in the restart loop's logs.
        kumo_cloud_provider::ccm::resolve_controllers(&c.controllers)
            .context("--cloud-controllers")?;
    }
    let dial = KubeletDialOverrides::default();
    // The network every kubelet's pods share; the API server's pod and service proxies
    // reach the pods through it, never through the host.
    let dataplane = kumo_sim::net::Dataplane::new();
    let mut api_cfg = kumo_apiserver::ApiServerConfig::new(&cfg.data_dir);
    api_cfg.bind = std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), cfg.port);
    api_cfg.kubelet_dial_overrides = dial.clone();
    api_cfg.pod_network = Some(match cfg.runtime {
        crate::machine::RuntimeKind::Sim => Arc::new(PodNetwork(dataplane.clone())),
        crate::machine::RuntimeKind::Containerd => {
            Arc::new(crate::machine::MachinesNetwork::new(&cfg.data_dir))
        }
    });
    api_cfg.store = cfg.store.clone();
    if cfg.runtime == crate::machine::RuntimeKind::Containerd && cfg.cloud.is_some() {
        // On the real network pods reach the API server as on a kubeadm cluster: the
        // `kubernetes` Service leads to the control-plane node's address and port 6443,
        // which its machine relays to this process.
        api_cfg.service_endpoint = Some(std::net::SocketAddr::new(
            CONTROL_PLANE_IP.into(),
            crate::hypervisor::API_SERVER_PORT,
        ));
    }
    let api = kumo_apiserver::ApiServer::start(api_cfg).await?;
    // On the real runtime the addons' pods would need their images and the cluster's
    // network (issue: the real network); the control plane runs in this process either way.
    let real = cfg.runtime == crate::machine::RuntimeKind::Containerd;
    if cfg.addons && !real {
        let admin = crate::hypervisor::kube_client(&api.admin_kubeconfig).await?;
        crate::addons::ensure(&admin, &Default::default())
            .await
            .context("creating kubeadm's addons")?;
        tokio::spawn(run_metrics_server(
            api.admin_kubeconfig.clone(),
            dataplane.clone(),
        ));
    } else if cfg.addons && cfg.cloud.is_some() {
        // The real network: CoreDNS's pods are real, running this binary's DNS server.
        match crate::machine::kumo_binary() {
            Some(exe) => {
                let admin = crate::hypervisor::kube_client(&api.admin_kubeconfig).await?;
                crate::addons::ensure_real(
                    &admin,
                    &exe,
                    &crate::controlplane::Networking::default().dns_ip(),
                )
                    .await
                    .context("creating the cluster DNS")?;
            }
            None => tracing::warn!(
                "no kumo binary to run the cluster DNS pods (not running as kumo; $KUMO_BINARY names one): no coredns pods"
            ),
        }
    }
    let (cm_addr, mut cm_rx) = watch::channel(None);
    if cfg.controller_manager {
        let kubeconfig = cfg.data_dir.join("controller-manager.conf");
        tokio::spawn(run_controller_manager(
            kubeconfig,
            cm_addr,
            None,
            Default::default(),
        ));
    }
    let (sched_addr, mut sched_rx) = watch::channel(None);
    if cfg.scheduler {
        tokio::spawn(run_scheduler(
            cfg.data_dir.join("scheduler.conf"),
            sched_addr,
            None,
        ));
    }
    if (cfg.kubelet || cfg.cloud.is_some()) && !real {
        // The control-plane node's static pods stand for the components, probed where
        // they serve (known once they listen).
        let endpoints = crate::controlplane::Endpoints {
            apiserver: api.local_addr.port(),
            controller_manager: serving_port(cfg.controller_manager, &mut cm_rx).await,
            scheduler: serving_port(cfg.scheduler, &mut sched_rx).await,
            advertise_address: None,
            etcd: None,
        };
        crate::controlplane::write_manifests(
            &cfg.static_pod_path(),
            &cfg.data_dir,
            &endpoints,
            &Default::default(),
        )?;
    }
    // kube-proxy as system:kube-proxy, programming the network every kubelet's pods share.
    let server = server_url(&api.admin_kubeconfig)?;
    let proxy_kc = kumo_apiserver::pki::kube_proxy_kubeconfig(&cfg.data_dir, &server)?;
    if !real {
        // On the real runtime each node's machine runs its own (see the hypervisor).
        tokio::spawn(run_proxy(proxy_kc, dataplane.clone()));
    }
    let mut node_kubeconfig = None;
    let mut cloud = None;
    if let Some(settings) = &cfg.cloud {
        cloud = Some(start_cloud(&cfg, settings, &api, dial, &dataplane).await?);
    } else if cfg.kubelet {
        let server = server_url(&api.admin_kubeconfig)?;
        let kc = kumo_apiserver::pki::kubelet_kubeconfig(&cfg.data_dir, &cfg.node_name, &server)?;
        let manifests = cfg.static_pod_path();
        std::fs::create_dir_all(&manifests)
            .with_context(|| format!("creating {}", manifests.display()))?;
        let mut k = kumo_kubelet::KubeletConfig::new(&kc, &cfg.node_name);
        k.pod_manifest_path = Some(manifests);
        match cfg.runtime {
            crate::machine::RuntimeKind::Sim => {
                k.runtime = Some(kumo_sim::factory(Some(dataplane.clone())));
            }
            crate::machine::RuntimeKind::Containerd => {
                let (data_dir, node) = (cfg.data_dir.clone(), cfg.node_name.clone());
                let machine =
                    tokio::task::spawn_blocking(move || crate::machine::boot(&data_dir, &node))
                        .await
                        .context("booting the node's machine")??;
                // Serves as long as the process (the machine goes with it).
                crate::machine::serve_registry(&cfg.data_dir, machine.registry)?;
                k.runtime = Some(machine.factory);
                k.cgroup_root = machine.cgroup_root;
                (k.cpu, k.memory) = crate::machine::host_capacity();
            }
        }
        // The node's InternalIP is an address of the simulated network, as a kubeadm
        // machine's is of its LAN: pods reach its NodePorts and host ports through the
        // dataplane, and a pod's 127.0.0.1 stays its own. Nothing dials it on the host: the
        // kubelet API listens on 127.0.0.1 (10250, or another port when another cluster on
        // this machine has it), where the API server's dial override sends it. Clients are
        // the API server's apiserver-kubelet-client certificate (signed by the cluster CA)
        // and tokens.
        k.node_ip = Some(NO_CLOUD_NODE_IP.into());
        let port = if std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 10250)).is_ok() {
            10250
        } else {
            std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .context("a port for the kubelet API")?
                .port()
        };
        k.server = Some(kumo_kubelet::server::ServerConfig {
            address: std::net::Ipv4Addr::LOCALHOST.into(),
            port,
            client_ca_file: Some(cfg.data_dir.join("pki").join("ca.crt")),
            ..Default::default()
        });
        if let Ok(mut m) = dial.write() {
            m.insert(
                cfg.node_name.clone(),
                std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)),
            );
        }
        tokio::spawn(run_kubelet(k));
        node_kubeconfig = Some(kc);
    }
    Ok(Cluster {
        api,
        node_kubeconfig,
        config: cfg,
        cloud,
        dataplane,
    })
}

impl Cluster {
    /// The names of the nodes this cluster runs: its instances' that are not stopped
    /// (control plane first), or the host kubelet's.
    pub fn node_names(&self) -> Vec<String> {
        if let Some(c) = &self.cloud {
            c.instances
                .iter()
                .filter(|i| i.instance.state != InstanceState::Stopped)
                .map(|i| i.instance.name.clone())
                .collect()
        } else if self.config.kubelet {
            vec![self.config.node_name.clone()]
        } else {
            Vec::new()
        }
    }

    /// Waits until each of `nodes` has registered and is Ready (and, when the cloud node
    /// controller runs, initialized by it: no uninitialized taint), calling `ready` for
    /// each as it gets there; an error names those that did not within `timeout`.
    pub async fn wait_nodes_ready(
        &self,
        nodes: &[String],
        timeout: Duration,
        mut ready: impl FnMut(&str),
    ) -> Result<()> {
        use k8s_openapi::api::core::v1::Node;
        let client = crate::hypervisor::kube_client(&self.api.admin_kubeconfig).await?;
        let api: kube::Api<Node> = kube::Api::all(client);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut waiting: Vec<String> = nodes.to_vec();
        let initialized_by_cloud = self.config.cloud.as_ref().is_some_and(|c| {
            kumo_cloud_provider::ccm::resolve_controllers(&c.controllers)
                .is_ok_and(|on| on.contains(&"cloud-node-controller"))
        });
        let mut last: Option<kube::core::ObjectList<Node>> = None;
        loop {
            if let Ok(list) = api.list(&Default::default()).await {
                let is_ready = |n: &Node| {
                    let ready = n
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        });
                    let uninitialized = n
                        .spec
                        .as_ref()
                        .and_then(|s| s.taints.as_ref())
                        .is_some_and(|ts| ts.iter().any(|t| t.key == UNINITIALIZED_TAINT));
                    ready && !(initialized_by_cloud && uninitialized)
                };
                waiting.retain(|name| {
                    let up = list
                        .items
                        .iter()
                        .any(|n| n.metadata.name.as_deref() == Some(name) && is_ready(n));
                    if up {
                        ready(name);
                    }
                    !up
                });
                last = Some(list);
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                // Each node as last seen: absent, or its Ready condition and taints.
                let seen: Vec<String> = waiting
                    .iter()
                    .map(|name| {
                        let node = last.as_ref().and_then(|l| {
                            l.items
                                .iter()
                                .find(|n| n.metadata.name.as_deref() == Some(name))
                        });
                        let Some(n) = node else {
                            return format!("{name} (not registered)");
                        };
                        let ready = n
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                            .map_or("no Ready condition".to_owned(), |c| {
                                format!(
                                    "Ready={} {} {}",
                                    c.status,
                                    c.reason.as_deref().unwrap_or(""),
                                    c.message.as_deref().unwrap_or("")
                                )
                            });
                        let taints: Vec<&str> = n
                            .spec
                            .as_ref()
                            .and_then(|s| s.taints.as_ref())
                            .map(|ts| ts.iter().map(|t| t.key.as_str()).collect())
                            .unwrap_or_default();
                        format!("{name} ({ready}; taints {taints:?})")
                    })
                    .collect();
                anyhow::bail!("not Ready after {timeout:?}: {}", seen.join(", "));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Starts the cloud with kubelets for hypervisor, makes sure the cluster's instances
/// exist, and starts the cloud-controller-manager.
async fn start_cloud(
    cfg: &ClusterConfig,
    settings: &CloudSettings,
    api: &kumo_apiserver::ApiServer,
    dial: KubeletDialOverrides,
    dataplane: &Arc<kumo_sim::net::Dataplane>,
) -> Result<ClusterCloud> {
    let server = server_url(&api.admin_kubeconfig)?;
    let mut hypervisor = KubeletHypervisor::new(&cfg.data_dir, server, &api.admin_kubeconfig, dial)
        .with_dataplane(dataplane.clone())
        .with_runtime(cfg.runtime);
    let mut cloud_cfg = kumo_cloud::CloudConfig::new(cfg.cloud_dir());
    let real = cfg.runtime == crate::machine::RuntimeKind::Containerd;
    if real {
        // The real network: the VPC is made before any instance boots into it.
        let data_dir = cfg.data_dir.clone();
        let vpc = tokio::task::spawn_blocking(move || crate::machine::create_vpc(&data_dir))
            .await
            .context("making the VPC")?
            .context("making the VPC")?;
        let vpc = Arc::new(vpc);
        cloud_cfg.network = Arc::new(crate::machine::VpcNetwork(vpc.clone()));
        hypervisor = hypervisor.with_vpc(vpc);
    }
    let hypervisor = Arc::new(hypervisor);
    cloud_cfg.hypervisor = hypervisor.clone();
    // The cloud boots the instances it recorded as running again (a restart).
    let cloud = kumo_cloud::CloudServer::start(cloud_cfg)
        .await
        .map_err(|e| anyhow::anyhow!("starting the cloud: {e}"))?;
    let client = cloud.client().context("a client of the cloud")?;
    hypervisor.set_cloud(cfg.cloud_dir(), client.clone());
    let mut instances = Vec::new();
    let workers = settings.worker_names();
    // As `kubeadm init`: a bootstrap token the workers join with (`kubeadm join --token`).
    let join_token = {
        let admin = crate::hypervisor::kube_client(&api.admin_kubeconfig).await?;
        ensure_join_token(&admin)
            .await
            .context("creating the workers' bootstrap token")?
    };
    let plan = std::iter::once((
        settings.control_plane_name(),
        NodeBootstrap::control_plane(),
    ))
    .chain(
        workers
            .into_iter()
            .map(|w| (w, NodeBootstrap::worker(&join_token))),
    );
    for (i, (name, boot)) in plan.enumerate() {
        let role = if boot.control_plane {
            "control-plane"
        } else {
            "worker"
        };
        let address = (real && boot.control_plane).then_some(CONTROL_PLANE_IP);
        instances
            .push(ensure_instance(&client, &settings.name, &name, role, boot, i, address).await?);
    }
    {
        // The cloud's CSI add-on: its driver, default StorageClass, controller and sidecars.
        let admin = crate::hypervisor::kube_client(&api.admin_kubeconfig).await?;
        let server = server_url(&api.admin_kubeconfig)?;
        crate::storage::start(&cfg.data_dir, &cfg.cloud_dir(), &client, &admin, &server)
            .await
            .context("installing the cloud's CSI driver")?;
    }
    if settings.cluster_api {
        let admin = crate::hypervisor::kube_client(&api.admin_kubeconfig).await?;
        let server = server_url(&api.admin_kubeconfig)?;
        crate::clusterapi::start(
            &cfg.data_dir,
            &cfg.cloud_dir(),
            &client,
            &admin,
            &server,
            hypervisor.tenants(),
        )
        .await
        .context("starting Cluster API")?;
    }
    let mut ccm_access_key_id = None;
    if !settings.controllers.is_empty() {
        let admin = crate::hypervisor::kube_client(&api.admin_kubeconfig).await?;
        // An installer's step, with admin credentials: the CCM's own ClusterRole.
        kumo_cloud_provider::ccm::rbac::ensure(&admin)
            .await
            .context("installing the cloud-controller-manager's RBAC")?;
        let ccm_cloud = cloud_credentials(
            &cfg.cloud_dir(),
            &client,
            &cfg.ccm_cloud_config(),
            "cloud-controller-manager",
        )
        .await?;
        ccm_access_key_id = Some(ccm_cloud.1);
        tokio::spawn(run_cloud_controller_manager(
            cfg.data_dir.join("cloud-controller-manager.conf"),
            settings.controllers.clone(),
            ccm_cloud.0,
            None,
            Default::default(),
        ));
    }
    Ok(ClusterCloud {
        server: cloud,
        client,
        instances,
        ccm_access_key_id,
        hypervisor,
    })
}

/// kubeadm init's default token's description, by which a restarted cluster finds it.
const JOIN_TOKEN_DESCRIPTION: &str = "The default bootstrap token generated by 'kubeadm init'.";
/// How long it lasts (kubeadm's default TTL).
const JOIN_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);

/// The bootstrap token (`<id>.<secret>`) workers join with: kubeadm init's default one if
/// it is still there and has an hour left, else a new one (a Secret
/// `kube-system/bootstrap-token-<id>`, 24 h, for authentication and signing, in group
/// `system:bootstrappers:kubeadm:default-node-token`).
async fn ensure_join_token(admin: &kube::Client) -> Result<String> {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, ListParams, PostParams};
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "kube-system");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    let list = secrets
        .list(&ListParams::default().fields("type=bootstrap.kubernetes.io/token"))
        .await?;
    let field = |s: &Secret, k: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(k))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
    };
    for s in &list.items {
        let expires = field(s, "expiration")
            .and_then(|e| kumo_apimachinery::time::parse_rfc3339(&e))
            .unwrap_or(i64::MAX);
        if field(s, "description").as_deref() == Some(JOIN_TOKEN_DESCRIPTION)
            && expires > now + 3600
        {
            if let (Some(id), Some(secret)) = (field(s, "token-id"), field(s, "token-secret")) {
                return Ok(format!("{id}.{secret}"));
            }
        }
    }
    let (id, secret) = kumo_capi::kubeadm::new_token();
    let expiration = kumo_apimachinery::time::format_rfc3339(now + JOIN_TOKEN_TTL.as_secs() as i64)
        .context("the token's expiration")?;
    let secret_obj = kumo_capi::kubeadm::bootstrap_token_secret(
        &id,
        &secret,
        JOIN_TOKEN_DESCRIPTION,
        &expiration,
    );
    secrets.create(&PostParams::default(), &secret_obj).await?;
    Ok(format!("{id}.{secret}"))
}

/// The cluster's instance `name`: the one found (not terminated), else a new one, in zone
/// `index` mod 3 (the nodes spread over the zones).
async fn ensure_instance(
    client: &kumo_cloud::Client,
    cluster: &str,
    name: &str,
    role: &str,
    boot: NodeBootstrap,
    index: usize,
    address: Option<std::net::Ipv4Addr>,
) -> Result<InstanceStart> {
    let filter = InstanceFilter {
        name: Some(name.to_owned()),
        states: vec![
            InstanceState::Pending,
            InstanceState::Running,
            InstanceState::Stopping,
            InstanceState::Stopped,
        ],
        ..Default::default()
    };
    let found = client
        .list_instances(&filter)
        .await
        .with_context(|| format!("looking for instance {name}"))?;
    if let Some(i) = found.into_iter().next() {
        return Ok(InstanceStart {
            instance: i,
            created: false,
        });
    }
    let req = RunInstanceRequest {
        name: Some(name.to_owned()),
        zone: Some(kumo_cloud::ZONES[index % kumo_cloud::ZONES.len()].to_owned()),
        user_data: Some(boot.to_user_data()),
        private_ip_address: address.map(|a| a.to_string()),
        tags: [
            ("kumo.io/cluster".to_owned(), cluster.to_owned()),
            ("kumo.io/role".to_owned(), role.to_owned()),
        ]
        .into(),
        ..Default::default()
    };
    let i = client
        .run_instance(&req)
        .await
        .with_context(|| format!("launching instance {name}"))?;
    Ok(InstanceStart {
        instance: i,
        created: true,
    })
}

/// The cloud-controller-manager's access key: the one saved in `path` while the cloud
/// still knows it, else a new one. `path` is (re)written as a `--cloud-config` file with
/// the cloud's current endpoint. Returns a client with the key, and the key's id.
/// A cloud client with an access key of its own named `name`, kept in `path` (a key the
/// cloud no longer knows is replaced), and the key's id.
pub(crate) async fn cloud_credentials(
    cloud_dir: &Path,
    admin: &kumo_cloud::Client,
    path: &Path,
    name: &str,
) -> Result<(kumo_cloud::Client, String)> {
    let here = kumo_cloud::ClientConfig::from_data_dir(cloud_dir)?;
    let mut key = None;
    if let Ok(saved) = kumo_cloud::ClientConfig::from_file(path) {
        let c = admin.with_credentials(&saved.access_key_id, &saved.secret_access_key)?;
        match c.caller_identity().await {
            Ok(_) => key = Some((saved.access_key_id, saved.secret_access_key)),
            // Unknown to this cloud (its state was reset): make another.
            Err(kumo_cloud::Error::Api { status, .. }) if status == 401 || status == 403 => {}
            Err(e) => return Err(e).with_context(|| format!("checking the {name}'s key")),
        }
    }
    let (id, secret) = match key {
        Some(k) => k,
        None => {
            let k = admin
                .create_access_key(name)
                .await
                .with_context(|| format!("creating the {name}'s access key"))?;
            let secret = k
                .secret_access_key
                .context("the cloud returned no secret for the new key")?;
            (k.access_key_id, secret)
        }
    };
    let cfg = here.with_credentials(&id, &secret);
    cfg.write_file(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok((kumo_cloud::Client::new(cfg)?, id))
}
/// The port a component reports it serves on, once it does (10 s at most); `None` when
/// it does not run (`on` false).
/// The metrics-server add-on's work: `kumo_metrics_server` as ServiceAccount
/// kube-system/metrics-server (its token rotated as the controllers' are), serving the
/// connections the simulated pod network makes to the metrics-server pod. Retried until it
/// starts (the API server's front-proxy ConfigMap may not be there at once).
async fn run_metrics_server(admin: PathBuf, dataplane: Arc<kumo_sim::net::Dataplane>) {
    let start = || async {
        let kc = kube::config::Kubeconfig::read_from(&admin)?;
        let base = kumo_client::clients::as_client_go(
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?,
        );
        let root = kumo_client::transport::client(base.clone())?;
        let (stop_tx, stop) = watch::channel(false);
        // The token renewal runs as long as the process.
        std::mem::forget(stop_tx);
        let clients = kumo_client::clients::ClientBuilder::new(root, base, true, stop);
        let source = clients.client("metrics-server").await?;
        let server = kumo_metrics_server::MetricsServer::start(kumo_metrics_server::Config {
            client: Arc::new(move || source.get()),
            resolution: kumo_metrics_server::RESOLUTION,
        })
        .await?;
        Ok::<_, anyhow::Error>(server)
    };
    let mut delay = Duration::from_secs(1);
    let server = loop {
        match start().await {
            Ok(s) => break s,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "metrics-server did not start; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    };
    let repository = kumo_metrics_server::IMAGE
        .rsplit_once(':')
        .map_or(kumo_metrics_server::IMAGE, |(r, _)| r);
    dataplane.host(
        repository,
        kumo_metrics_server::PORT,
        Arc::new(move |stream| server.serve(stream)),
    );
}

pub(crate) async fn serving_port(
    on: bool,
    rx: &mut watch::Receiver<Option<SocketAddr>>,
) -> Option<u16> {
    if !on {
        return None;
    }
    let got = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(Option::is_some)).await;
    got.ok()?.ok()?.map(|a| a.port())
}

/// The controller-manager, each controller acting as its own ServiceAccount (kubeadm's
/// `--use-service-account-credentials`); started again if it stops (it stops when it
/// loses the lease).
pub(crate) async fn run_controller_manager(
    kubeconfig: PathBuf,
    serving: watch::Sender<Option<SocketAddr>>,
    host: Option<String>,
    net: crate::controlplane::Networking,
) {
    loop {
        let mut cfg = kumo_controller_manager::Config::new(&kubeconfig);
        cfg.identity = host.as_deref().map(kumo_client::leader::identity_on);
        cfg.use_service_account_credentials = true;
        // As kubeadm with a pod subnet: node-ipam hands each node its spec.podCIDR, which
        // the kubelet then uses.
        cfg.node_ipam.allocate_node_cidrs = true;
        cfg.node_ipam.cluster_cidr = net.pod_subnet.clone();
        cfg.node_ipam.service_cluster_ip_range = net.service_subnet.clone();
        // As kubeadm: the bootstrap-token controllers too, and csrsigning issues from the
        // cluster CA (kubelets joining with a bootstrap token get their certificates).
        cfg.controllers = vec!["*".into(), "bootstrapsigner".into(), "tokencleaner".into()];
        if let Some(dir) = kubeconfig.parent() {
            cfg.csr_signing.cert_file = Some(dir.join("pki/ca.crt"));
            cfg.csr_signing.key_file = Some(dir.join("pki/ca.key"));
        }
        let mut cm = kumo_controller_manager::ControllerManager::start(cfg.clone()).await;
        if let Err(kumo_controller_manager::Error::Listen { .. }) = cm {
            // 10257 is taken (another cluster on this machine): serve /healthz elsewhere.
            cfg.serve = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
            cm = kumo_controller_manager::ControllerManager::start(cfg).await;
        }
        match cm {
            Ok(cm) => {
                serving.send_replace(cm.healthz_addr);
                if let Err(e) = cm.wait().await {
                    tracing::warn!(error = %e, "controller-manager stopped; restarting");
                }
            }
            Err(e) => tracing::error!(error = %e, "controller-manager failed to start"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The cloud-controller-manager as system:cloud-controller-manager, in the cloud with its
/// own access key; as kubeadm's CCM with a pod subnet, it allocates nothing itself but
/// writes a cloud route per node range (`--allocate-node-cidrs --configure-cloud-routes
/// --cluster-cidr <pod subnet> --cluster-name <cluster>`: the cluster's name tags its
/// routes and load balancers, so clusters in one cloud leave each other's alone). Started
/// again if it stops (it stops when it loses the lease).
pub(crate) async fn run_cloud_controller_manager(
    kubeconfig: PathBuf,
    controllers: Vec<String>,
    cloud: kumo_cloud::Client,
    host: Option<String>,
    net: crate::controlplane::Networking,
) {
    use kumo_cloud_provider::ccm;
    let provider: Arc<dyn kumo_cloud_provider::CloudProvider> =
        Arc::new(kumo_cloud_provider::kumo::KumoCloud::new(cloud));
    loop {
        let mut cfg = ccm::Config::new(&kubeconfig);
        cfg.identity = host.as_deref().map(kumo_client::leader::identity_on);
        cfg.controllers = controllers.clone();
        cfg.allocate_node_cidrs = true;
        cfg.configure_cloud_routes = true;
        cfg.cluster_cidr = Some(net.pod_subnet.clone());
        cfg.cluster_name = net.cluster_name.clone();
        let mut m = ccm::CloudControllerManager::start(cfg.clone(), provider.clone()).await;
        if let Err(ccm::Error::Client(kumo_client::Error::Listen { .. })) = m {
            // 10258 is taken (another cluster on this machine): serve /healthz elsewhere.
            cfg.serve = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
            m = ccm::CloudControllerManager::start(cfg, provider.clone()).await;
        }
        match m {
            Ok(m) => {
                if let Err(e) = m.wait().await {
                    tracing::warn!(error = %e, "cloud-controller-manager stopped; restarting");
                }
            }
            Err(e) => tracing::error!(error = %e, "cloud-controller-manager failed to start"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The scheduler as system:kube-scheduler; started again if it stops.
pub(crate) async fn run_scheduler(
    kubeconfig: PathBuf,
    serving: watch::Sender<Option<SocketAddr>>,
    host: Option<String>,
) {
    loop {
        let mut cfg = kumo_scheduler::Config::new(&kubeconfig);
        cfg.identity = host.as_deref().map(kumo_client::leader::identity_on);
        let mut s = kumo_scheduler::Scheduler::start(cfg.clone()).await;
        if s.is_err() {
            // 10259 is taken (another cluster on this machine): serve /healthz elsewhere.
            cfg.serve = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
            s = kumo_scheduler::Scheduler::start(cfg).await;
        }
        match s {
            Ok(s) => {
                serving.send_replace(s.healthz_addr);
                if let Err(e) = s.wait().await {
                    tracing::warn!(error = %e, "scheduler stopped; restarting");
                }
            }
            Err(e) => tracing::error!(error = %e, "scheduler failed to start"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// kube-proxy as system:kube-proxy; started again if it stops.
/// The simulated pod network as the API server reaches it.
pub(crate) struct PodNetwork(pub(crate) Arc<kumo_sim::net::Dataplane>);

impl std::fmt::Debug for PodNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PodNetwork(simulated)")
    }
}

impl kumo_apiserver::resource_proxy::PodNetwork for PodNetwork {
    fn connect(&self, to: std::net::SocketAddr) -> std::io::Result<tokio::io::DuplexStream> {
        self.0.dial(to)
    }

    fn serves_tls(&self, to: std::net::SocketAddr) -> bool {
        self.0.serves_tls(to)
    }
}

pub(crate) async fn run_proxy(kubeconfig: PathBuf, dataplane: Arc<kumo_sim::net::Dataplane>) {
    loop {
        if let Err(e) = kumo_proxy::run(&kubeconfig, dataplane.clone()).await {
            tracing::error!(error = %e, "kube-proxy stopped; restarting");
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
