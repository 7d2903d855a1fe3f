//! `kumo cloud-controller-manager`: the cloud node, node-lifecycle, service and route
//! controllers on the kumo cloud, with upstream's flag names and defaults
//! (k8s.io/cloud-provider's options).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use kumo_cloud_provider::ccm::{CloudControllerManager, Config, PORT};
use kumo_cloud_provider::kumo::KumoCloud;

/// Flags of `kumo cloud-controller-manager`, named as upstream's cloud-controller-manager.
#[derive(clap::Args)]
pub struct Args {
    /// Path to a kubeconfig with the API server's address and this component's credentials.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The cloud provider; kumo ships one.
    #[arg(long, value_parser = ["kumo"])]
    cloud_provider: String,
    /// The cloud's client configuration (JSON: endpoint, accessKeyId, secretAccessKey,
    /// caFile or caData); default: the KUMO_CLOUD_* variables, $KUMO_CLOUD_DATA_DIR, then
    /// $HOME/.kumo/cloud.
    #[arg(long)]
    cloud_config: Option<PathBuf>,
    /// Controllers to enable: '*' all, 'foo' enables foo, '-foo' disables it (names or
    /// aliases: cloud-node, cloud-node-lifecycle, service, route).
    #[arg(long, value_delimiter = ',', default_value = "*")]
    controllers: Vec<String>,
    /// The instance prefix for the cluster (the cloud's resources are named after it).
    #[arg(long, default_value = "kubernetes")]
    cluster_name: String,
    /// CIDR range for pods in the cluster (one per IP family, comma-separated).
    #[arg(long, default_value = "")]
    cluster_cidr: String,
    /// Whether CIDRs for pods are allocated and set on the cloud provider.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    allocate_node_cidrs: bool,
    /// Whether CIDRs allocated by allocate-node-cidrs are configured on the cloud provider.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    configure_cloud_routes: bool,
    /// How often the node controller updates nodes' addresses.
    #[arg(long, default_value = "5m0s", value_parser = go_duration)]
    node_status_update_frequency: Duration,
    /// How often the node-lifecycle controller looks at nodes.
    #[arg(long, default_value = "5s", value_parser = go_duration)]
    node_monitor_period: Duration,
    /// The period for reconciling routes created for nodes by the cloud provider.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    route_reconciliation_period: Duration,
    /// The number of Services synchronized at once.
    #[arg(long, default_value_t = 1)]
    concurrent_service_syncs: usize,
    /// The number of nodes synchronized at once.
    #[arg(long, default_value_t = 1)]
    concurrent_node_syncs: usize,
    /// Take part in leader election (Lease kube-system/cloud-controller-manager) first.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    leader_elect: bool,
    /// Each controller acts as its own ServiceAccount in kube-system.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    use_service_account_credentials: bool,
    /// The address /healthz is served on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: std::net::IpAddr,
    /// The HTTPS port for /healthz (0: not served).
    #[arg(long, default_value_t = PORT)]
    secure_port: u16,
}

/// A Go duration flag value (`1m30s`, `500ms`, `1.5h`; not negative).
pub(crate) fn go_duration(s: &str) -> Result<Duration, String> {
    kumo_apimachinery::time::parse_go_duration(s)
        .ok_or_else(|| format!("time: invalid duration {s:?}"))
}

/// The cloud client configuration: `--cloud-config`, else the environment or data
/// directory, else `$HOME/.kumo/cloud` (where `kumo cloud serve` keeps it by default).
fn cloud_client_config(file: Option<&Path>) -> Result<kumo_cloud::ClientConfig> {
    if let Some(f) = file {
        return kumo_cloud::ClientConfig::from_file(f)
            .with_context(|| format!("--cloud-config {}", f.display()));
    }
    match kumo_cloud::ClientConfig::from_env_or_dir(None) {
        Ok(c) => Ok(c),
        Err(e) => {
            let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kumo/cloud"));
            match home {
                Some(d) if d.join(kumo_cloud::pki::ENDPOINT_FILE).exists() => {
                    Ok(kumo_cloud::ClientConfig::from_env_or_dir(Some(&d))?)
                }
                _ => Err(anyhow::Error::new(e).context(
                    "no cloud configuration: pass --cloud-config, set KUMO_CLOUD_DATA_DIR, \
                     or run `kumo cloud serve`",
                )),
            }
        }
    }
}

/// The settings `args` describe.
fn config(args: &Args) -> Config {
    let mut cfg = Config::new(&args.kubeconfig);
    cfg.leader_elect = args.leader_elect;
    cfg.controllers = args.controllers.clone();
    cfg.serve = (args.secure_port != 0)
        .then(|| std::net::SocketAddr::new(args.bind_address, args.secure_port));
    cfg.use_service_account_credentials = args.use_service_account_credentials;
    cfg.cluster_name = args.cluster_name.clone();
    cfg.cluster_cidr = (!args.cluster_cidr.trim().is_empty()).then(|| args.cluster_cidr.clone());
    cfg.allocate_node_cidrs = args.allocate_node_cidrs;
    cfg.configure_cloud_routes = args.configure_cloud_routes;
    cfg.node_status_update_frequency = args.node_status_update_frequency;
    cfg.node_monitor_period = args.node_monitor_period;
    cfg.route_reconciliation_period = args.route_reconciliation_period;
    cfg.concurrent_service_syncs = args.concurrent_service_syncs;
    cfg.concurrent_node_syncs = args.concurrent_node_syncs;
    cfg
}

/// Runs the cloud-controller-manager until it stops (an error when leadership is lost).
pub async fn run(args: Args) -> Result<()> {
    let client = kumo_cloud::Client::new(cloud_client_config(args.cloud_config.as_deref())?)?;
    let ccm =
        CloudControllerManager::start(config(&args), Arc::new(KumoCloud::new(client))).await?;
    match ccm.healthz_addr {
        Some(a) => println!("kumo cloud-controller-manager: serving /healthz on https://{a}"),
        None => println!("kumo cloud-controller-manager: started"),
    }
    ccm.wait().await?;
    Ok(())
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
    fn durations_parse_as_go_does() {
        assert_eq!(go_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(go_duration("5m0s"), Ok(Duration::from_secs(300)));
        assert_eq!(go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(go_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(go_duration("0"), Ok(Duration::ZERO));
        assert!(go_duration("10").is_err());
        assert!(go_duration("10x").is_err());
        assert!(go_duration("").is_err());
    }

    #[test]
    fn flags_map_to_the_config_with_upstream_defaults() {
        let cli = Cli::try_parse_from(["ccm", "--kubeconfig=k", "--cloud-provider=kumo"])
            .expect("defaults");
        let cfg = config(&cli.args);
        assert!(cfg.leader_elect && cfg.configure_cloud_routes && !cfg.allocate_node_cidrs);
        assert_eq!(cfg.cluster_name, "kubernetes");
        assert_eq!(cfg.cluster_cidr, None);
        assert_eq!(cfg.route_reconciliation_period, Duration::from_secs(10));
        assert_eq!(cfg.node_monitor_period, Duration::from_secs(5));
        assert_eq!(cfg.node_status_update_frequency, Duration::from_secs(300));
        assert_eq!(cfg.serve.map(|a| a.port()), Some(10258));
        let cli = Cli::try_parse_from([
            "ccm",
            "--kubeconfig=k",
            "--cloud-provider=kumo",
            "--controllers=*,-service",
            "--cluster-cidr=10.244.0.0/16",
            "--allocate-node-cidrs",
            "--route-reconciliation-period=1m",
            "--leader-elect=false",
            "--secure-port=0",
            "--concurrent-service-syncs=5",
        ])
        .expect("flags");
        let cfg = config(&cli.args);
        assert_eq!(cfg.controllers, ["*", "-service"]);
        assert_eq!(cfg.cluster_cidr.as_deref(), Some("10.244.0.0/16"));
        assert!(cfg.allocate_node_cidrs && !cfg.leader_elect);
        assert_eq!(cfg.route_reconciliation_period, Duration::from_secs(60));
        assert_eq!(cfg.serve, None);
        assert_eq!(cfg.concurrent_service_syncs, 5);
        assert!(Cli::try_parse_from(["ccm", "--kubeconfig=k", "--cloud-provider=aws"]).is_err());
    }
}
