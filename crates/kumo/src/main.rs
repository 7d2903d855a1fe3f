//! `kumo`: one binary, one subcommand per component.

mod bench;
mod ccm;
mod certs;
mod classroom;
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
    /// The node agent alone: registers a Node and runs its pods on a CRI runtime
    /// (--container-runtime-endpoint) or the sim runtime.
    Kubelet(Box<kumo_kubelet::cli::Args>),
    /// The local cloud: `kumo cloud serve`, and its client commands (instances, lbs,
    /// routes, policy, faults, ...).
    Cloud(Box<kumo_cloud::cli::Args>),
    /// The cloud-controller-manager: the cloud node, node-lifecycle, service and route
    /// controllers on the kumo cloud (--kubeconfig, --cloud-provider=kumo).
    CloudControllerManager(Box<ccm::Args>),
    /// The resource metrics API (metrics.k8s.io) as an extension API server: scrapes the
    /// kubelets and serves NodeMetrics and PodMetrics (`kubectl top`, the HPA).
    MetricsServer(MetricsServerArgs),
    /// The cluster DNS (what the `coredns` pods run on the real runtime): the zone
    /// `cluster.local` from Services and EndpointSlices, over UDP and TCP.
    Dns(DnsArgs),
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
    /// The classroom: each user signs in to a cluster of their own (Cluster API, `kumo up
    /// --cluster-api`) with a web terminal and a map of it.
    Classroom {
        #[command(subcommand)]
        what: classroom::Classroom,
    },
    /// Stop the `kumo up` running on a data directory, and take its context out of your
    /// kubeconfig.
    Down {
        /// The data directory (default: that of --name).
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
        /// The cluster's name, as given to `kumo up --name` (data directory
        /// $HOME/.kumo/<name>; `kumo`: $HOME/.kumo/default).
        #[arg(long)]
        name: Option<String>,
    },
    /// Load images into the nodes' runtime, as `kind load`: `kumo load image-archive FILE...`.
    Load {
        #[command(subcommand)]
        what: Load,
    },
    /// Container images for the real runtime: `kumo image pack` makes an OCI archive
    /// (for `kumo load image-archive`) from the machine's own files.
    Image {
        #[command(subcommand)]
        what: ImageCommand,
    },
    /// A node's machine, as ssh to it would: `kumo node exec NODE -- crictl ps`.
    Node {
        #[command(subcommand)]
        what: NodeCommand,
    },
    /// Whether kumo runs, the API server's health, the components' leases and the nodes.
    Status {
        #[command(flatten)]
        cluster: kumo::kubeconfig::ClusterArgs,
    },
    /// What kumo knows of a cluster, as `kind get`: `kumo get kubeconfig`.
    Get {
        #[command(subcommand)]
        what: Get,
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

#[derive(Subcommand)]
enum Load {
    /// Import OCI or docker image archives into every node's containerd (and nodes that
    /// boot later), so pods use them without a registry.
    ImageArchive {
        /// The archives (`docker save`, `skopeo copy ... oci-archive:FILE`, ...).
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
        /// The data directory (default: that of --name).
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
        /// The cluster's name, as given to `kumo up --name`.
        #[arg(long)]
        name: Option<String>,
    },
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Pack an image (one layer) into an OCI archive, from kumo's busybox root or nothing,
    /// with files of this machine added: what the offline test images are made of.
    Pack {
        /// The archive to write.
        #[arg(long)]
        out: std::path::PathBuf,
        /// A name the image answers to (`registry.k8s.io/e2e-test-images/agnhost:2.66.1`);
        /// repeatable.
        #[arg(long = "name", required = true)]
        names: Vec<String>,
        /// Start from kumo's busybox root (busybox-static with its applets, /etc/passwd,
        /// /tmp, ...) instead of an empty one.
        #[arg(long)]
        busybox: bool,
        /// SRC:DST — this machine's file SRC at DST in the image, with its mode; a later
        /// file at the same path replaces an earlier one. Repeatable.
        #[arg(long = "add")]
        adds: Vec<String>,
        /// PATH — a program of this machine at the same path, with the shared libraries it
        /// loads (as `ldd` lists them) and its loader. Repeatable.
        #[arg(long = "add-program")]
        programs: Vec<std::path::PathBuf>,
        /// DIR — an empty directory (mode 0755). Repeatable.
        #[arg(long = "mkdir")]
        dirs: Vec<String>,
        /// DST:TARGET — a symbolic link. Repeatable.
        #[arg(long = "symlink")]
        symlinks: Vec<String>,
        /// The entrypoint, one argument per flag.
        #[arg(long = "entrypoint")]
        entrypoint: Vec<String>,
        /// The default arguments (cmd), one argument per flag.
        #[arg(long = "cmd")]
        cmd: Vec<String>,
    },
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Run a command on a node (--runtime containerd), the cluster's or a workload
    /// cluster's (--cluster-api): in its network namespace, with its containerd as the CRI
    /// endpoint of `crictl` and the address of `ctr`. Works while the API server is down.
    Exec {
        /// The node's name.
        node: String,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
        /// The data directory (default: that of --name).
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
        /// The cluster's name, as given to `kumo up --name`.
        #[arg(long)]
        name: Option<String>,
    },
}

/// Flags of `kumo metrics-server`, named as metrics-server's.
#[derive(clap::Args)]
struct MetricsServerArgs {
    /// A kubeconfig with metrics-server's credentials (its ServiceAccount's token, say).
    #[arg(long)]
    kubeconfig: std::path::PathBuf,
    /// The address to serve HTTPS on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: std::net::IpAddr,
    /// The port to serve HTTPS on.
    #[arg(long, default_value_t = 10250)]
    secure_port: u16,
    /// How often the kubelets are scraped.
    #[arg(long, default_value = "1m0s", value_parser = ccm::go_duration)]
    metric_resolution: std::time::Duration,
}

#[derive(clap::Args)]
struct DnsArgs {
    /// A kubeconfig (default: the pod's in-cluster configuration, as CoreDNS).
    #[arg(long)]
    kubeconfig: Option<std::path::PathBuf>,
    /// A Corefile, as CoreDNS's `-conf`: read for the record only; the server answers as
    /// kubeadm's Corefile configures CoreDNS (kubernetes, health, ready).
    #[arg(long = "conf", alias = "c")]
    conf: Option<std::path::PathBuf>,
    /// Where DNS is served (UDP and TCP).
    #[arg(long, default_value = "0.0.0.0:53")]
    dns_address: std::net::SocketAddr,
    /// CoreDNS's `health` endpoint (`/health`).
    #[arg(long, default_value = "0.0.0.0:8080")]
    health_address: std::net::SocketAddr,
    /// CoreDNS's `ready` endpoint (`/ready`).
    #[arg(long, default_value = "0.0.0.0:8181")]
    ready_address: std::net::SocketAddr,
}

async fn dns(args: DnsArgs) -> Result<()> {
    let cfg = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => {
            anyhow::Context::context(kube::Config::incluster(), "the in-cluster configuration")?
        }
    };
    if let Some(conf) = &args.conf {
        println!(
            "kumo dns: {} is not interpreted: serving kubeadm's CoreDNS configuration (kubernetes cluster.local in-addr.arpa ip6.arpa, pods insecure, ttl 30; health; ready)",
            conf.display()
        );
    }
    let client = kumo_client::transport::client(cfg)?;
    kumo_dns::run(
        client,
        kumo_dns::Listen {
            dns: args.dns_address,
            health: Some(args.health_address),
            ready: Some(args.ready_address),
        },
    )
    .await?;
    Ok(())
}

async fn metrics_server(args: MetricsServerArgs) -> Result<()> {
    let kc = kube::config::Kubeconfig::read_from(&args.kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let client = kumo_client::transport::client(cfg)?;
    let server = kumo_metrics_server::MetricsServer::start(kumo_metrics_server::Config {
        client: std::sync::Arc::new(move || client.clone()),
        resolution: args.metric_resolution,
    })
    .await?;
    let addr = server
        .listen(std::net::SocketAddr::new(
            args.bind_address,
            args.secure_port,
        ))
        .await?;
    println!("kumo metrics-server: serving metrics.k8s.io/v1beta1 on https://{addr}");
    std::future::pending::<()>().await;
    Ok(())
}

/// `kumo get ...`.
#[derive(Subcommand)]
enum Get {
    /// Print the cluster's admin kubeconfig, with cluster, user and context `kumo-<name>`.
    Kubeconfig {
        /// The data directory (default: that of --name).
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
        /// The cluster's name, as given to `kumo up --name`.
        #[arg(long)]
        name: Option<String>,
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
    /// The CA of etcd members that serve TLS (with --etcd-certfile and --etcd-keyfile).
    #[arg(long, requires_all = ["etcd_certfile", "etcd_keyfile"])]
    etcd_cafile: Option<std::path::PathBuf>,
    /// The client certificate for etcd.
    #[arg(long, requires = "etcd_cafile")]
    etcd_certfile: Option<std::path::PathBuf>,
    /// The client certificate's key for etcd.
    #[arg(long, requires = "etcd_cafile")]
    etcd_keyfile: Option<std::path::PathBuf>,
    /// What the nodes run their pods on: `sim` (simulated containers, no process runs) or
    /// `containerd` (real containers: each node a network namespace of its own with its
    /// containerd and runc, driven through the CRI; needs root and
    /// `apt-get install containerd runc containernetworking-plugins busybox-static`).
    #[arg(long, default_value = "sim", value_parser = ["sim", "containerd"])]
    runtime: String,
    /// An audit.k8s.io/v1 Policy file; requests are audited only with one.
    #[arg(long)]
    audit_policy_file: Option<std::path::PathBuf>,
    /// Where audit events are written, one JSON line each ('-' for stdout).
    #[arg(long)]
    audit_log_path: Option<std::path::PathBuf>,
    /// How much history the store keeps: older revisions are compacted away (0 keeps all).
    #[arg(long, default_value = "5m0s", value_parser = ccm::go_duration)]
    etcd_compaction_interval: std::time::Duration,
    /// The Services' IPv4 range (the default ServiceCIDR, made at the first start); the
    /// `kubernetes` Service takes its first address.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
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
    /// Where the cluster's state lives (default: $HOME/.kumo/<name>, and
    /// $HOME/.kumo/default for the default name).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// The API server's port on 127.0.0.1 (default: the one it had, else 6443, else a
    /// free one when another program holds 6443).
    #[arg(long)]
    port: Option<u16>,
    /// The node's name with --no-cloud (default: the host name).
    #[arg(long, requires = "no_cloud")]
    node_name: Option<String>,
    /// The cluster's name: the kubeconfig context is kumo-<name>, and with the cloud the
    /// nodes are <name>-control-plane, <name>-worker, <name>-worker2, ... (default: kumo,
    /// or the data directory's name when only --data-dir is given).
    #[arg(long)]
    name: Option<String>,
    /// How many worker nodes (cloud instances) besides the control-plane one.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// No cloud: one kubelet named after the host, as plain on-premises kubeadm.
    #[arg(long, conflicts_with_all = ["nodes", "cloud_controllers"])]
    no_cloud: bool,
    /// The cloud-controller-manager's controllers ('*' all, 'name' or '-name'; e.g.
    /// cloud-node,cloud-node-lifecycle runs it without the service controller; empty: no
    /// cloud-controller-manager, so nodes stay uninitialized).
    #[arg(long, value_delimiter = ',', default_value = "*")]
    cloud_controllers: Vec<String>,
    /// Hand out clusters: install Cluster API (v1beta2) with the kumo cloud's
    /// infrastructure provider, as `clusterctl init --infrastructure kumo` would; a
    /// Cluster applied to this cluster gets machines in the cloud, booted on this host.
    #[arg(long, conflicts_with = "no_cloud")]
    cluster_api: bool,
    /// Merge a kumo-<name> context into your kubeconfig ($KUBECONFIG or ~/.kube/config)
    /// and make it the current one, as kind does (`kumo down` takes it out again).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    kubeconfig_update: bool,
    /// The API server's store: `embedded` (in --data-dir) or `etcd` (at --etcd-servers).
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "etcd"])]
    store: String,
    /// etcd endpoints, comma-separated, for --store etcd.
    #[arg(long, value_delimiter = ',')]
    etcd_servers: Vec<String>,
    /// What the nodes run their pods on: `sim` (simulated containers, no process runs) or
    /// `containerd` (real containers: each node a network namespace of its own with its
    /// containerd and runc, driven through the CRI; needs root and
    /// `apt-get install containerd runc containernetworking-plugins busybox-static`).
    #[arg(long, default_value = "sim", value_parser = ["sim", "containerd"])]
    runtime: String,
    /// Also show the components' logs on the terminal (-v info, -vv debug); they always
    /// go to <data-dir>/kumo.log. RUST_LOG sets the filter.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    verbose: u8,
}

impl UpArgs {
    /// The data directory: --data-dir, else that of --name.
    fn data_dir(&self) -> Result<std::path::PathBuf> {
        daemon::data_dir(self.data_dir.clone(), self.name.as_deref())
    }

    /// The cluster's name: --name, else the data directory's name when only --data-dir
    /// is given (a second cluster gets a context of its own), else `kumo`.
    fn cluster_name(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        self.data_dir
            .as_deref()
            .and_then(|d| std::path::absolute(d).ok())
            .and_then(|d| d.file_name().map(|f| f.to_string_lossy().into_owned()))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "kumo".into())
    }
}

async fn up(args: UpArgs) -> Result<()> {
    let data_dir = args.data_dir()?;
    if args.detach {
        return daemon::up_detached(&data_dir).await;
    }
    daemon::foreground(&data_dir)?;
    let port = daemon::api_port(&data_dir, args.port)?;
    let mut cfg = if args.no_cloud {
        kumo::cluster::ClusterConfig::new(&data_dir)
    } else {
        let mut c = kumo::cluster::ClusterConfig::with_cloud(&data_dir);
        c.cloud = Some(kumo::cluster::CloudSettings {
            name: args.name.clone().unwrap_or_else(|| "kumo".into()),
            workers: args.nodes,
            // `--cloud-controllers=` (nothing): no cloud-controller-manager at all.
            controllers: args
                .cloud_controllers
                .iter()
                .filter(|c| !c.is_empty())
                .cloned()
                .collect(),
            cluster_api: args.cluster_api,
        });
        c
    };
    cfg.port = port.port;
    if let Some(note) = &port.note {
        println!("kumo: {note}");
    }
    cfg.store = match args.store.as_str() {
        "etcd" if args.etcd_servers.is_empty() => {
            anyhow::bail!("--store etcd needs --etcd-servers")
        }
        "etcd" => kumo_apiserver::server::StoreConfig::Etcd(args.etcd_servers.clone()),
        _ => kumo_apiserver::server::StoreConfig::Embedded,
    };
    if let Some(n) = &args.node_name {
        cfg.node_name = n.clone();
    }
    cfg.runtime = args
        .runtime
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let real = cfg.runtime == kumo::machine::RuntimeKind::Containerd;
    if real {
        kumo_node::prerequisites()?;
    }
    let cluster = kumo::cluster::start(cfg).await?;
    let server = &cluster.api;
    if real && cluster.cloud.is_some() {
        println!(
            "kumo: runtime containerd: the control plane runs in this process (no static pods); \
             nodes are network namespaces in the cloud's VPC (pod routes in its route table), \
             each with its own containerd and an nftables kube-proxy; the coredns pods run \
             kumo's DNS server; load balancer VIPs answer on the cloud's public side \
             (`kumo cloud exec -- curl http://VIP/`)"
        );
    } else if real {
        println!(
            "kumo: runtime containerd: the control plane runs in this process (no static pods); \
             without a cloud the node has no VPC: no Service routing or cluster DNS (pods \
             reach only their own node)"
        );
    }
    println!(
        "kumo: API server ready at https://{} in {} ms (state in {})",
        server.local_addr,
        server.startup.as_millis(),
        data_dir.display()
    );
    if let Some(cloud) = &cluster.cloud {
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
        let control_plane = cluster
            .config
            .cloud
            .as_ref()
            .map(|s| s.control_plane_name())
            .unwrap_or_default();
        for i in &cloud.instances {
            let dir = if i.instance.name == control_plane {
                cluster.config.static_pod_path()
            } else {
                cloud.hypervisor.node_static_pod_path(&i.instance.name)
            };
            println!(
                "kumo: static pods of {}: put manifests in {}",
                i.instance.name,
                dir.display()
            );
        }
    } else {
        println!(
            "kumo: controller-manager, scheduler and kubelet started, each with its own identity"
        );
        if real {
            println!(
                "kumo: node {} (containerd: real containers in network namespace {}); `kumo node exec {} -- crictl ps` lists them",
                cluster.config.node_name,
                kumo_node::recorded(&cluster.config.data_dir.join("nodes"))
                    .first()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default(),
                cluster.config.node_name,
            );
        } else {
            println!(
                "kumo: node {} (simulated containers); static pods: put manifests in {}",
                cluster.config.node_name,
                cluster.config.static_pod_path().display()
            );
        }
        println!("kumo: no cloud (--no-cloud)");
    }
    let name = args.cluster_name();
    let merged = if args.kubeconfig_update {
        daemon::merge_kubeconfig(&server.admin_kubeconfig, &name, &data_dir)
    } else {
        None
    };
    match merged {
        Some(path) => println!(
            "kumo: context kumo-{name} set in {} (now current)\nTo use it:\n  kubectl get nodes",
            path.display()
        ),
        None => println!(
            "To use it:\n  export KUBECONFIG={}\n  kubectl get nodes",
            server.admin_kubeconfig.display()
        ),
    }
    if cluster.cloud.is_some() {
        println!("The cloud:\n  kumo cloud instances list");
    }
    println!("{}", daemon::READY_MARKER);
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
    cfg.service_cluster_ip_range = args.service_cluster_ip_range;
    cfg.store = match args.store.as_str() {
        "etcd" if args.etcd_servers.is_empty() => {
            anyhow::bail!("--store etcd needs --etcd-servers")
        }
        "etcd" => StoreConfig::Etcd(args.etcd_servers),
        _ => StoreConfig::Embedded,
    };
    if let (Some(ca_file), Some(cert_file), Some(key_file)) =
        (args.etcd_cafile, args.etcd_certfile, args.etcd_keyfile)
    {
        cfg.etcd_tls = Some(kumo_storage::etcd::EtcdTls {
            ca_file,
            cert_file,
            key_file,
        });
    }
    let server = kumo_apiserver::ApiServer::start(cfg).await?;
    println!(
        "kumo apiserver: serving on https://{} (ready in {} ms)",
        server.local_addr,
        server.startup.as_millis()
    );
    println!("export KUBECONFIG={}", server.admin_kubeconfig.display());
    server.wait().await
}

/// Logs to stderr for the single components (as upstream's do), filtered by RUST_LOG
/// (default: warnings).
fn log_to_stderr() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// `kumo up`'s logs: the components' lines go to `<data-dir>/kumo.log` (info, or RUST_LOG),
/// so that the terminal shows only `kumo up`'s own progress; `-v` adds them on stderr
/// (info; `-vv` debug).
fn log_for_up(args: &UpArgs) -> Result<()> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(match args.verbose {
                0 | 1 => "info",
                _ => "debug",
            })
        })
    };
    if args.detach {
        // The parent only waits; the child it starts logs.
        log_to_stderr();
        return Ok(());
    }
    let file = daemon::log_file(&args.data_dir()?)?;
    let to_file = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .with_filter(filter());
    let to_terminal = (args.verbose > 0).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(filter())
    });
    tracing_subscriber::registry()
        .with(to_file)
        .with(to_terminal)
        .init();
    Ok(())
}

/// A closed stdout (`kumo status | head`) ends the process quietly, as it ends a C
/// program by SIGPIPE, rather than with a panic and its backtrace.
fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> Result<()> {
    quiet_broken_pipe();
    let cli = Cli::parse();
    match cli.command {
        Command::Up(args) => {
            let run = || -> Result<()> {
                log_for_up(&args)?;
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(up(args))
            };
            if let Err(e) = run() {
                // One line a user can act on (`kumo up -d` shows the same line).
                eprintln!("{}{e:#}", daemon::ERROR_PREFIX);
                std::process::exit(1);
            }
            Ok(())
        }
        command => {
            log_to_stderr();
            other(command)
        }
    }
}

/// `kumo cloud` without a say of its own (no --data-dir, --cloud-config, --endpoint or
/// `KUMO_CLOUD_*` variable) talks to the cloud of the cluster the kubeconfig's current
/// context points at (the data directory `kumo up` recorded there), else to the default
/// cluster's, else to `kumo cloud serve`'s default ($HOME/.kumo/cloud).
fn cloud_of_current_cluster(args: &mut kumo_cloud::cli::Args) {
    let c = &args.conn;
    let told = c.data_dir.is_some()
        || c.cloud_config.is_some()
        || c.endpoint.is_some()
        || ["KUMO_CLOUD_DATA_DIR", "KUMO_CLOUD_ENDPOINT"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
    if told || matches!(args.command, kumo_cloud::cli::Command::Serve { .. }) {
        return;
    }
    let cluster = kumo::kubeconfig::current_data_dir(&Default::default())
        .or_else(|| kumo::kubeconfig::default_data_dir().ok())
        .map(|d| d.join("cloud"))
        .filter(|d| d.join(kumo_cloud::pki::ENDPOINT_FILE).exists());
    if let Some(dir) = cluster {
        args.conn.data_dir = Some(dir);
    }
}

/// Every command but `kumo up`.
fn other(command: Command) -> Result<()> {
    match command {
        Command::Up(_) => unreachable!("kumo up is run by main"),
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
            let factory = match &args.container_runtime_endpoint {
                Some(endpoint) => {
                    let runtime =
                        kumo_cri_remote::RemoteRuntime::connect(kumo_cri_remote::Options {
                            socket: kumo_cri_remote::socket_of(endpoint).to_owned(),
                            root_dir: args.root_dir.clone(),
                            pod_logs_dir: args.pod_logs_dir.clone(),
                            netns: args.pod_network_namespace.clone(),
                        })?;
                    kumo_cri_remote::factory(std::sync::Arc::new(runtime))
                }
                None => kumo_sim::factory(None),
            };
            Ok(rt.block_on(kumo_kubelet::cli::run(*args, factory))?)
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
        Command::Cloud(mut args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            cloud_of_current_cluster(&mut args);
            if let kumo_cloud::cli::Command::Exec { command } = &args.command {
                let dir = kumo_cloud::cli::data_dir(&args.conn)
                    .ok_or_else(|| anyhow::anyhow!("no cloud data directory (--data-dir)"))?;
                let code = kumo::machine::cloud_exec(&dir, command)?;
                std::process::exit(code);
            }
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
        Command::MetricsServer(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(metrics_server(args))
        }
        Command::Dns(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(dns(args))
        }
        Command::Certs { what } => certs::run(what),
        Command::Down { data_dir, name } => {
            daemon::down(&daemon::data_dir(data_dir, name.as_deref())?)
        }
        Command::Load {
            what:
                Load::ImageArchive {
                    files,
                    data_dir,
                    name,
                },
        } => {
            let dir = daemon::data_dir(data_dir, name.as_deref())?;
            let nodes = kumo::machine::load_image_archives(&dir, &files)?;
            if nodes.is_empty() {
                println!("kumo: no running node; the images load into nodes as they boot");
            } else {
                println!("kumo: loaded into {}", nodes.join(", "));
            }
            Ok(())
        }
        Command::Image {
            what:
                ImageCommand::Pack {
                    out,
                    names,
                    busybox,
                    adds,
                    programs,
                    dirs,
                    symlinks,
                    entrypoint,
                    cmd,
                },
        } => {
            use kumo_node::images::{Entry, Image};
            let mut image = Image {
                entries: if busybox {
                    kumo_node::images::busybox_entries()?
                } else {
                    Vec::new()
                },
                entrypoint: (!entrypoint.is_empty()).then_some(entrypoint),
                cmd: (!cmd.is_empty()).then_some(cmd),
                names,
            };
            let pair = |s: &str, what: &str| {
                s.split_once(':')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| anyhow::anyhow!("{what} {s:?}: want A:B"))
            };
            for d in dirs {
                image.put(Entry::Dir(d.trim_matches('/').to_owned(), 0o755));
            }
            for a in adds {
                let (src, dst) = pair(&a, "--add")?;
                image.add_host_file(std::path::Path::new(&src), &dst)?;
            }
            for program in programs {
                image.add_program(&program)?;
            }
            for l in symlinks {
                let (dst, target) = pair(&l, "--symlink")?;
                image.put(Entry::Symlink(
                    dst.trim_start_matches('/').to_owned(),
                    target,
                ));
            }
            let bytes = kumo_node::images::archive(&image)?;
            std::fs::write(&out, &bytes)
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
            println!(
                "kumo: packed {} ({} KiB): {}",
                out.display(),
                bytes.len() / 1024,
                image.names.join(" ")
            );
            Ok(())
        }
        Command::Node {
            what:
                NodeCommand::Exec {
                    node,
                    command,
                    data_dir,
                    name,
                },
        } => {
            let dir = daemon::data_dir(data_dir, name.as_deref())?;
            let mut cmd =
                kumo_node::exec_command(&kumo::machine::find_node_dir(&dir, &node), &command)?;
            let status = cmd
                .status()
                .map_err(|e| anyhow::anyhow!("running {command:?} on {node}: {e}"))?;
            std::process::exit(status.code().unwrap_or(1));
        }
        Command::Status { cluster } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let ok = rt.block_on(status::run(cluster))?;
            std::process::exit(if ok { 0 } else { 1 });
        }
        Command::Get {
            what: Get::Kubeconfig { data_dir, name },
        } => {
            let dir = daemon::data_dir(data_dir.clone(), name.as_deref())?;
            let admin = dir.join("admin.conf");
            if !admin.exists() {
                anyhow::bail!("no cluster on {} (no admin.conf)", dir.display());
            }
            let cluster = name.unwrap_or_else(|| {
                data_dir
                    .as_deref()
                    .and_then(|d| std::path::absolute(d).ok())
                    .and_then(|d| d.file_name().map(|f| f.to_string_lossy().into_owned()))
                    .unwrap_or_else(|| "kumo".into())
            });
            let doc = kumo::kubeconfig::named(&admin, &cluster, &dir)?;
            print!("{}", serde_yaml::to_string(&doc)?);
            Ok(())
        }
        Command::Doctor { what } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let healthy = rt.block_on(doctor::run(what))?;
            std::process::exit(if healthy { 0 } else { 1 });
        }
        Command::Classroom { what } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(classroom::run(what))
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
