//! `kumo`: one binary, one subcommand per component.

mod bench;
mod ccm;
mod certs;
mod daemon;
mod doctor;
mod status;

use anyhow::Result;

/// mimalloc rather than the system allocator: the components allocate many small,
/// short-lived JSON values across threads, where glibc's malloc spent a quarter of the API
/// server's CPU (perf, `kumo bench nodes`) and fragmented its memory. Built with `no_thp`:
/// otherwise it asks for transparent huge pages and every 2 MiB it touches stays resident
/// (idle RSS 66 MiB instead of 37, docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use clap::{Parser, Subcommand};
use kumo_controller_manager::controllers::nodelifecycle;

#[derive(Parser)]
#[command(
    name = "kumo",
    version,
    about = "Kubernetes and the cloud it runs on, on one machine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run kumo: the API server, controller-manager and scheduler, the cloud with a
    /// control-plane instance and --nodes workers (each a kubelet), and the
    /// cloud-controller-manager (--no-cloud: one kubelet, no cloud).
    Up(UpArgs),
    /// The API server alone: HTTPS on --secure-port over the embedded store or etcd.
    Apiserver(ApiserverArgs),
    /// The controller-manager alone: controllers that watch the API server (--kubeconfig).
    ControllerManager(ControllerManagerArgs),
    /// The scheduler alone: binds pods to nodes through the API server (--kubeconfig).
    Scheduler(kumo_scheduler::cli::Args),
    /// The node agent alone: registers a Node and runs its pods on the sim runtime.
    Kubelet(Box<kumo_kubelet::cli::Args>),
    /// The local cloud: `kumo cloud serve`, and its client commands (instances, lbs,
    /// routes, policy, faults, ...).
    Cloud(Box<kumo_cloud::cli::Args>),
    /// The cloud-controller-manager: the cloud node, node-lifecycle, service and route
    /// controllers on the kumo cloud (--kubeconfig, --cloud-provider=kumo).
    CloudControllerManager(Box<ccm::Args>),
    /// Certificates of a data directory, as kubeadm's `certs`: check-expiration, renew.
    Certs {
        #[command(subcommand)]
        what: certs::Certs,
    },
    /// Benchmarks that measure kumo side by side with the reference.
    Bench {
        #[command(subcommand)]
        what: bench::Bench,
    },
    /// Stop the `kumo up` running in the background on a data directory.
    Down {
        /// The data directory (default: $HOME/.kumo/default).
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
    },
    /// Whether kumo runs, the API server's health, the components' leases and the nodes.
    Status {
        /// The data directory (default: $HOME/.kumo/default).
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
    },
    /// Find out why a Service has no external address, or a node is not initialized.
    Doctor {
        #[command(subcommand)]
        what: doctor::Doctor,
    },
    /// Replay the differential-test corpus against two API servers and report what differs.
    Difftest {
        /// Kubeconfig of the left side (e.g. the reference).
        #[arg(long)]
        left: std::path::PathBuf,
        /// Kubeconfig of the right side (e.g. kumo).
        #[arg(long)]
        right: std::path::PathBuf,
        /// The corpus directory.
        #[arg(long, default_value = kumo_difftest::DEFAULT_CORPUS)]
        corpus: std::path::PathBuf,
        /// Only the scenarios whose name contains this.
        #[arg(long)]
        only: Option<String>,
    },
}

/// Flags of `kumo apiserver`, named as kube-apiserver's where the meaning is the same.
#[derive(clap::Args)]
struct ApiserverArgs {
    /// Where certificates, kubeconfigs and the embedded store live.
    #[arg(long, default_value = "/var/lib/kumo")]
    data_dir: std::path::PathBuf,
    /// The IP address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: std::net::IpAddr,
    /// The port to serve HTTPS on (0 picks a free one).
    #[arg(long, default_value_t = 6443)]
    secure_port: u16,
    /// The address advertised to clients (written into the kubeconfig and the certificate).
    #[arg(long)]
    advertise_address: Option<std::net::IpAddr>,
    /// `embedded` (in --data-dir) or `etcd` (at --etcd-servers).
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "etcd"])]
    store: String,
    /// etcd endpoints, comma-separated, for --store etcd.
    #[arg(long, value_delimiter = ',')]
    etcd_servers: Vec<String>,
    /// An audit.k8s.io/v1 Policy file; requests are audited only with one.
    #[arg(long)]
    audit_policy_file: Option<std::path::PathBuf>,
    /// Where audit events are written, one JSON line each ('-' for stdout).
    #[arg(long)]
    audit_log_path: Option<std::path::PathBuf>,
    /// How much history the store keeps: older revisions are compacted away (0 keeps all).
    #[arg(long, default_value = "5m0s", value_parser = ccm::go_duration)]
    etcd_compaction_interval: std::time::Duration,
}

/// Flags of `kumo controller-manager`, named as kube-controller-manager's.
#[derive(clap::Args)]
struct ControllerManagerArgs {
    /// Path to a kubeconfig with the API server's address and this component's credentials.
    #[arg(long)]
    kubeconfig: std::path::PathBuf,
    /// Take part in leader election (Lease kube-system/kube-controller-manager) first.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    leader_elect: bool,
    /// Controllers to enable: '*' all on-by-default ones, 'foo' enables foo, '-foo' disables it.
    #[arg(long, value_delimiter = ',', default_value = "*")]
    controllers: Vec<String>,
    /// The CA published in the kube-root-ca.crt ConfigMaps (default: the kubeconfig's CA).
    #[arg(long)]
    root_ca_file: Option<std::path::PathBuf>,
    /// The address /healthz is served on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: std::net::IpAddr,
    /// The HTTPS port for /healthz (0: not served).
    #[arg(long, default_value_t = 10257)]
    secure_port: u16,
    /// Each controller acts as its own ServiceAccount in kube-system (as kubeadm sets it).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    use_service_account_credentials: bool,
    /// How many finished pods may remain before pod GC deletes the oldest (<= 0: never).
    #[arg(long, default_value_t = 12500, allow_negative_numbers = true)]
    terminated_pod_gc_threshold: i32,
    /// Give each node a pod range (spec.podCIDR) from --cluster-cidr.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    allocate_node_cidrs: bool,
    /// The pods' range(s), comma-separated (one per IP family); default 10.244.0.0/16.
    #[arg(long, default_value = "")]
    cluster_cidr: String,
    /// Prefix length of each node's range (single-stack; 24 for IPv4, 64 for IPv6).
    #[arg(long, default_value_t = 0)]
    node_cidr_mask_size: i32,
    /// Prefix length of each node's IPv4 range (default 24).
    #[arg(long, default_value_t = 0)]
    node_cidr_mask_size_ipv4: i32,
    /// Prefix length of each node's IPv6 range (default 64).
    #[arg(long, default_value_t = 0)]
    node_cidr_mask_size_ipv6: i32,
    /// The Service range(s): node ranges overlapping them are never handed out.
    #[arg(long, default_value = "")]
    service_cluster_ip_range: String,
    /// How often the node controller looks at every node's health.
    #[arg(long, default_value = "5s", value_parser = nodelifecycle::parse_duration_flag)]
    node_monitor_period: std::time::Duration,
    /// How long a kubelet may stay silent before its node's conditions become Unknown.
    #[arg(long, default_value = "50s", value_parser = nodelifecycle::parse_duration_flag)]
    node_monitor_grace_period: std::time::Duration,
    /// The same for a node whose kubelet never posted status.
    #[arg(long, default_value = "1m0s", value_parser = nodelifecycle::parse_duration_flag)]
    node_startup_grace_period: std::time::Duration,
    /// The CA certificate (PEM) csrsigning issues certificates from.
    #[arg(long)]
    cluster_signing_cert_file: Option<std::path::PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    cluster_signing_key_file: Option<std::path::PathBuf>,
    /// The longest certificate csrsigning issues; a request may ask for less
    /// (spec.expirationSeconds).
    #[arg(long, default_value = "8760h0m0s", value_parser = nodelifecycle::parse_duration_flag)]
    cluster_signing_duration: std::time::Duration,
}

/// Flags of `kumo up`.
#[derive(clap::Args)]
struct UpArgs {
    /// Run in the background (log in <data-dir>/kumo.log); `kumo down` stops it.
    #[arg(short = 'd', long)]
    detach: bool,
    /// Where the cluster's state lives (default: $HOME/.kumo/default).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// The API server's port on 127.0.0.1.
    #[arg(long, default_value_t = 6443)]
    port: u16,
    /// The node's name with --no-cloud (default: the host name).
    #[arg(long, requires = "no_cloud")]
    node_name: Option<String>,
    /// The cluster's name: nodes are <name>-control-plane, <name>-worker, <name>-worker2, ...
    #[arg(long, default_value = "kumo")]
    name: String,
    /// How many worker nodes (cloud instances) besides the control-plane one.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// No cloud: one kubelet named after the host, as plain on-premises kubeadm.
    #[arg(long, conflicts_with_all = ["nodes", "cloud_controllers", "name"])]
    no_cloud: bool,
    /// The cloud-controller-manager's controllers ('*' all, 'name' or '-name'; e.g.
    /// cloud-node,cloud-node-lifecycle runs it without the service controller; empty: no
    /// cloud-controller-manager, so nodes stay uninitialized).
    #[arg(long, value_delimiter = ',', default_value = "*")]
    cloud_controllers: Vec<String>,
    /// Also merge a kumo-<name> context into your kubeconfig ($KUBECONFIG or
    /// ~/.kube/config) and make it the current one.
    #[arg(long)]
    kubeconfig_update: bool,
    /// The API server's store: `embedded` (in --data-dir) or `etcd` (at --etcd-servers).
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "etcd"])]
    store: String,
    /// etcd endpoints, comma-separated, for --store etcd.
    #[arg(long, value_delimiter = ',')]
    etcd_servers: Vec<String>,
}

async fn up(args: UpArgs) -> Result<()> {
    if args.detach {
        return daemon::up_detached(args.data_dir.clone()).await;
    }
    daemon::foreground(args.data_dir.clone())?;
    let data_dir = match args.data_dir {
        Some(d) => d,
        None => {
            let home = std::env::var_os("HOME")
                .ok_or_else(|| anyhow::anyhow!("HOME is not set; pass --data-dir"))?;
            std::path::PathBuf::from(home).join(".kumo").join("default")
        }
    };
    let mut cfg = if args.no_cloud {
        kumo::cluster::ClusterConfig::new(&data_dir)
    } else {
        let mut c = kumo::cluster::ClusterConfig::with_cloud(&data_dir);
        c.cloud = Some(kumo::cluster::CloudSettings {
            name: args.name.clone(),
            workers: args.nodes,
            // `--cloud-controllers=` (nothing): no cloud-controller-manager at all.
            controllers: args
                .cloud_controllers
                .iter()
                .filter(|c| !c.is_empty())
                .cloned()
                .collect(),
        });
        c
    };
    cfg.port = args.port;
    cfg.store = match args.store.as_str() {
        "etcd" if args.etcd_servers.is_empty() => {
            anyhow::bail!("--store etcd needs --etcd-servers")
        }
        "etcd" => kumo_apiserver::server::StoreConfig::Etcd(args.etcd_servers.clone()),
        _ => kumo_apiserver::server::StoreConfig::Embedded,
    };
    if let Some(n) = args.node_name {
        cfg.node_name = n;
    }
    let cluster = kumo::cluster::start(cfg).await?;
    let server = &cluster.api;
    println!(
        "kumo: API server ready at https://{} in {} ms (state in {})",
        server.local_addr,
        server.startup.as_millis(),
        data_dir.display()
    );
    let Some(cloud) = &cluster.cloud else {
        println!(
            "kumo: controller-manager, scheduler and kubelet started, each with its own identity"
        );
        println!(
            "kumo: node {} (simulated containers); static pods: put manifests in {}",
            cluster.config.node_name,
            cluster.config.static_pod_path().display()
        );
        println!("kumo: no cloud (--no-cloud)");
        println!(
            "To use it:\n  export KUBECONFIG={}\n  kubectl get nodes",
            server.admin_kubeconfig.display()
        );
        return cluster.api.wait().await;
    };
    println!("kumo: controller-manager and scheduler started, each with its own identity");
    println!(
        "kumo: cloud {} serving at {} (state in {})",
        kumo_cloud::REGION,
        cloud.server.url,
        cluster.config.cloud_dir().display()
    );
    for i in &cloud.instances {
        let what = if i.created {
            "launched".to_owned()
        } else {
            format!("found ({})", i.instance.state)
        };
        let i = &i.instance;
        println!(
            "kumo: instance {} {} {what}: {}, {}, {}",
            i.id, i.name, i.instance_type, i.zone, i.private_ip
        );
    }
    match &cloud.ccm_access_key_id {
        Some(key) => println!(
            "kumo: cloud-controller-manager started (controllers: {}), cloud access key {key} ({})",
            args.cloud_controllers.join(","),
            cluster.config.ccm_cloud_config().display()
        ),
        None => println!("kumo: no cloud-controller-manager"),
    }
    let nodes = cluster.node_names();
    let waited = cluster
        .wait_nodes_ready(&nodes, std::time::Duration::from_secs(60), |n| {
            println!("kumo: node {n} Ready")
        })
        .await;
    if let Err(e) = waited {
        println!("kumo: {e}");
    }
    if let Some(c) = &cluster.cloud {
        for i in &c.instances {
            let dir = if i.instance.name
                == cluster
                    .config
                    .cloud
                    .as_ref()
                    .map(|s| s.control_plane_name())
                    .unwrap_or_default()
            {
                cluster.config.static_pod_path()
            } else {
                c.hypervisor.node_static_pod_path(&i.instance.name)
            };
            println!(
                "kumo: static pods of {}: put manifests in {}",
                i.instance.name,
                dir.display()
            );
        }
    }
    if args.kubeconfig_update {
        let merged = kumo::cluster::user_kubeconfig().and_then(|path| {
            kumo::cluster::merge_kubeconfig(&server.admin_kubeconfig, &args.name, &path)
                .map(|()| path)
        });
        match merged {
            Ok(path) => println!(
                "kumo: context kumo-{} set in {} (now current)",
                args.name,
                path.display()
            ),
            Err(e) => println!("kumo: kubeconfig not updated: {e:#}"),
        }
    }
    println!(
        "To use it:\n  export KUBECONFIG={}\n  kubectl get nodes",
        server.admin_kubeconfig.display()
    );
    println!(
        "The cloud:\n  export KUMO_CLOUD_DATA_DIR={}\n  kumo cloud instances list",
        cluster.config.cloud_dir().display()
    );
    cluster.api.wait().await
}

async fn controller_manager(args: ControllerManagerArgs) -> Result<()> {
    let mut cfg = kumo_controller_manager::Config::new(&args.kubeconfig);
    cfg.leader_elect = args.leader_elect;
    cfg.controllers = args.controllers;
    cfg.root_ca_file = args.root_ca_file;
    cfg.use_service_account_credentials = args.use_service_account_credentials;
    cfg.pod_gc.terminated_pod_gc_threshold = args.terminated_pod_gc_threshold;
    cfg.node_ipam = kumo_controller_manager::controllers::nodeipam::Settings {
        allocate_node_cidrs: args.allocate_node_cidrs,
        cluster_cidr: args.cluster_cidr,
        node_cidr_mask_size: args.node_cidr_mask_size,
        node_cidr_mask_size_ipv4: args.node_cidr_mask_size_ipv4,
        node_cidr_mask_size_ipv6: args.node_cidr_mask_size_ipv6,
        service_cluster_ip_range: args.service_cluster_ip_range,
    };
    cfg.csr_signing = kumo_controller_manager::controllers::certificates::signer::Settings {
        cert_file: args.cluster_signing_cert_file,
        key_file: args.cluster_signing_key_file,
        duration: args.cluster_signing_duration,
    };
    cfg.node_lifecycle = nodelifecycle::Settings {
        monitor_period: args.node_monitor_period,
        grace_period: args.node_monitor_grace_period,
        startup_grace_period: args.node_startup_grace_period,
    };
    cfg.serve = (args.secure_port != 0)
        .then(|| std::net::SocketAddr::new(args.bind_address, args.secure_port));
    let cm = kumo_controller_manager::ControllerManager::start(cfg).await?;
    match cm.healthz_addr {
        Some(a) => println!("kumo controller-manager: serving /healthz on https://{a}"),
        None => println!("kumo controller-manager: started"),
    }
    cm.wait().await?;
    Ok(())
}

async fn apiserver(args: ApiserverArgs) -> Result<()> {
    use kumo_apiserver::server::StoreConfig;
    let mut cfg = kumo_apiserver::ApiServerConfig::new(&args.data_dir);
    cfg.bind = std::net::SocketAddr::new(args.bind_address, args.secure_port);
    cfg.advertise_address = args.advertise_address;
    cfg.audit_policy_file = args.audit_policy_file;
    cfg.audit_log_path = args.audit_log_path;
    cfg.compaction_interval = args.etcd_compaction_interval;
    cfg.store = match args.store.as_str() {
        "etcd" if args.etcd_servers.is_empty() => {
            anyhow::bail!("--store etcd needs --etcd-servers")
        }
        "etcd" => StoreConfig::Etcd(args.etcd_servers),
        _ => StoreConfig::Embedded,
    };
    let server = kumo_apiserver::ApiServer::start(cfg).await?;
    println!(
        "kumo apiserver: serving on https://{} (ready in {} ms)",
        server.local_addr,
        server.startup.as_millis()
    );
    println!("export KUBECONFIG={}", server.admin_kubeconfig.display());
    server.wait().await
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Up(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(up(args))
        }
        Command::Apiserver(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(apiserver(args))
        }
        Command::Kubelet(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            Ok(rt.block_on(kumo_kubelet::cli::run(*args))?)
        }
        Command::Scheduler(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            Ok(rt.block_on(kumo_scheduler::cli::run(args))?)
        }
        Command::ControllerManager(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(controller_manager(args))
        }
        Command::Cloud(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            if let Err(e) = rt.block_on(kumo_cloud::cli::run(*args)) {
                // The cloud's code and message are the whole story; no backtrace.
                eprintln!("error: {e}");
                std::process::exit(1);
            }
            Ok(())
        }
        Command::CloudControllerManager(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(ccm::run(*args))
        }
        Command::Certs { what } => certs::run(what),
        Command::Down { data_dir } => daemon::down(data_dir),
        Command::Status { data_dir } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let ok = rt.block_on(status::run(data_dir))?;
            std::process::exit(if ok { 0 } else { 1 });
        }
        Command::Doctor { what } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let healthy = rt.block_on(doctor::run(what))?;
            std::process::exit(if healthy { 0 } else { 1 });
        }
        Command::Bench { what } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(bench::run(what))
        }
        Command::Difftest {
            left,
            right,
            corpus,
            only,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let clean = rt.block_on(kumo_difftest::run_cli(
                &left,
                &right,
                &corpus,
                only.as_deref(),
            ))?;
            std::process::exit(if clean { 0 } else { 1 });
        }
    }
}
