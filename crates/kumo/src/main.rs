//! `kumo`: one binary, one subcommand per component.

mod bench;

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
    /// Run kumo: today the API server on the embedded store (controllers, scheduler,
    /// kubelet and the cloud join as they land).
    Up(UpArgs),
    /// The API server alone: HTTPS on --secure-port over the embedded store or etcd.
    Apiserver(ApiserverArgs),
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
    let mut cfg = kumo_apiserver::ApiServerConfig::new(&data_dir);
    cfg.bind = std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), args.port);
    let server = kumo_apiserver::ApiServer::start(cfg).await?;
    println!(
        "kumo: API server ready at https://{} in {} ms (state in {})",
        server.local_addr,
        server.startup.as_millis(),
        data_dir.display()
    );
    println!(
        "kumo: not running yet: controller-manager, scheduler, kubelet, cloud (see the open issues)"
    );
    println!(
        "To use it:\n  export KUBECONFIG={}\n  kubectl get namespaces",
        server.admin_kubeconfig.display()
    );
    server.wait().await
}

async fn apiserver(args: ApiserverArgs) -> Result<()> {
    use kumo_apiserver::server::StoreConfig;
    let mut cfg = kumo_apiserver::ApiServerConfig::new(&args.data_dir);
    cfg.bind = std::net::SocketAddr::new(args.bind_address, args.secure_port);
    cfg.advertise_address = args.advertise_address;
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
