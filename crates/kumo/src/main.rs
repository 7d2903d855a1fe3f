//! `kumo`: one binary, one subcommand per component.

mod bench;
mod certs;

use anyhow::Result;
use clap::{Parser, Subcommand};

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
    /// Run kumo: the API server on the embedded store, the controller-manager, the
    /// scheduler and a kubelet (the cloud joins when it lands).
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
}

/// Flags of `kumo up`.
#[derive(clap::Args)]
struct UpArgs {
    /// Where the cluster's state lives (default: $HOME/.kumo/default).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// The API server's port on 127.0.0.1.
    #[arg(long, default_value_t = 6443)]
    port: u16,
    /// The kubelet's node name (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
}

async fn up(args: UpArgs) -> Result<()> {
    let data_dir = match args.data_dir {
        Some(d) => d,
        None => {
            let home = std::env::var_os("HOME")
                .ok_or_else(|| anyhow::anyhow!("HOME is not set; pass --data-dir"))?;
            std::path::PathBuf::from(home).join(".kumo").join("default")
        }
    };
    let mut cfg = kumo::cluster::ClusterConfig::new(&data_dir);
    cfg.port = args.port;
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
    println!("kumo: controller-manager, scheduler and kubelet started, each with its own identity");
    println!(
        "kumo: node {} (simulated containers); static pods: put manifests in {}",
        cluster.config.node_name,
        cluster.config.static_pod_path().display()
    );
    println!("kumo: not running yet: the cloud and its controller manager (see the open issues)");
    println!(
        "To use it:\n  export KUBECONFIG={}\n  kubectl get nodes",
        server.admin_kubeconfig.display()
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
        Command::Certs { what } => certs::run(what),
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
