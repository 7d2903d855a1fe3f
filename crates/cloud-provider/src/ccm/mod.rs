//! The cloud-controller-manager (`kumo cloud-controller-manager`), as k8s.io/cloud-provider's
//! app: an API client that runs the cloud node, cloud node-lifecycle, service and route
//! controllers against a [`CloudProvider`], after winning the Lease
//! kube-system/cloud-controller-manager. It reuses the controller-manager's machinery
//! (informers, work queues, leader election, per-controller clients, events, /healthz).

pub mod node;
pub mod nodelifecycle;
pub mod rbac;
pub mod route;
pub mod service;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kumo_client::clients::{self, ClientBuilder};
use kumo_client::healthz;
use kumo_client::informer::InformerFactory;
use kumo_client::leader::{self, LeaderElectionConfig, LeaderElector};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::CloudProvider;

/// The controllers, with their aliases (`--controllers` accepts both), all on by default
/// (upstream's `names.CCMControllerAliases`).
pub const CONTROLLERS: &[(&str, &str)] = &[
    ("cloud-node-controller", "cloud-node"),
    ("cloud-node-lifecycle-controller", "cloud-node-lifecycle"),
    ("service-lb-controller", "service"),
    ("node-route-controller", "route"),
];

/// The port upstream serves /healthz on (`cloudprovider.CloudControllerManagerPort`).
pub const PORT: u16 = 10258;

/// Why the cloud-controller-manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad flag.
    #[error("{0}")]
    Flag(String),
    /// The client machinery failed (kubeconfig, serving, lease).
    #[error(transparent)]
    Client(#[from] kumo_client::Error),
}

/// Settings of `kumo cloud-controller-manager`, with upstream's flag names.
#[derive(Clone, Debug)]
pub struct Config {
    /// `--kubeconfig`.
    pub kubeconfig: PathBuf,
    /// `--leader-elect` (default true).
    pub leader_elect: bool,
    /// `--controllers` as given (names or aliases, `*`, `-name`).
    pub controllers: Vec<String>,
    /// Where to serve /healthz (`--secure-port`, 10258; port 0 picks one); None: not served.
    pub serve: Option<SocketAddr>,
    /// The holderIdentity; default `<hostname>_<uuid>`.
    pub identity: Option<String>,
    /// `--use-service-account-credentials`: each controller acts as its own ServiceAccount
    /// (node-controller, service-controller, route-controller).
    pub use_service_account_credentials: bool,
    /// `--cluster-name` (default `kubernetes`), passed to the provider.
    pub cluster_name: String,
    /// `--cluster-cidr`: the pod network the route controller owns routes inside.
    pub cluster_cidr: Option<String>,
    /// `--allocate-node-cidrs`.
    pub allocate_node_cidrs: bool,
    /// `--configure-cloud-routes` (default true): the route controller runs only with it.
    pub configure_cloud_routes: bool,
    /// `--node-status-update-frequency` (5 m): how often the node controller refreshes
    /// addresses.
    pub node_status_update_frequency: Duration,
    /// `--node-monitor-period` (5 s): how often the node-lifecycle controller looks at nodes.
    pub node_monitor_period: Duration,
    /// `--route-reconciliation-period` (10 s).
    pub route_reconciliation_period: Duration,
    /// `--concurrent-service-syncs` (1).
    pub concurrent_service_syncs: usize,
    /// `--concurrent-node-syncs` (1).
    pub concurrent_node_syncs: usize,
}

impl Config {
    /// Upstream's defaults for this kubeconfig.
    pub fn new(kubeconfig: impl Into<PathBuf>) -> Self {
        Config {
            kubeconfig: kubeconfig.into(),
            leader_elect: true,
            controllers: vec!["*".into()],
            serve: Some(SocketAddr::from(([127, 0, 0, 1], PORT))),
            identity: None,
            use_service_account_credentials: false,
            cluster_name: "kubernetes".into(),
            cluster_cidr: None,
            allocate_node_cidrs: false,
            configure_cloud_routes: true,
            node_status_update_frequency: Duration::from_secs(300),
            node_monitor_period: Duration::from_secs(5),
            route_reconciliation_period: Duration::from_secs(10),
            concurrent_service_syncs: 1,
            concurrent_node_syncs: 1,
        }
    }
}

/// The canonical name of a controller given by name or alias.
pub fn canonical_name(name: &str) -> Option<&'static str> {
    CONTROLLERS
        .iter()
        .find(|(n, a)| *n == name || *a == name)
        .map(|(n, _)| *n)
}

/// Resolves `--controllers` (`*` = all, `name`, `-name`) to the enabled controllers.
pub fn resolve_controllers(flags: &[String]) -> Result<Vec<&'static str>, Error> {
    let mut star = false;
    let mut on = Vec::new();
    let mut off = Vec::new();
    for flag in flags.iter().flat_map(|f| f.split(',')).map(str::trim) {
        if flag == "*" {
            star = true;
            continue;
        }
        let (list, name) = match flag.strip_prefix('-') {
            Some(n) => (&mut off, n),
            None => (&mut on, flag),
        };
        let canonical = canonical_name(name).ok_or_else(|| {
            Error::Flag(format!("{name:?} is not in the list of known controllers"))
        })?;
        list.push(canonical);
    }
    Ok(CONTROLLERS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| (star || on.contains(n)) && !off.contains(n))
        .collect())
}

/// What every controller is handed.
pub struct Context {
    /// The cloud.
    pub cloud: Arc<dyn CloudProvider>,
    /// Per-controller clients (ServiceAccounts with `--use-service-account-credentials`).
    pub clients: Arc<ClientBuilder>,
    /// The settings.
    pub config: Config,
    /// Its metrics (work queues, lease), served on the secure port.
    pub metrics: Arc<kumo_client::metrics::Registry>,
}

/// A running cloud-controller-manager.
pub struct CloudControllerManager {
    /// Where /healthz is served, if it is.
    pub healthz_addr: Option<SocketAddr>,
    /// This instance's holderIdentity.
    pub identity: String,
    stop: watch::Sender<bool>,
    leading: watch::Receiver<bool>,
    task: JoinHandle<kumo_client::Result<()>>,
}

impl CloudControllerManager {
    /// Reads the kubeconfig, starts /healthz, then (after winning the election, when
    /// enabled) the informers and the enabled controllers the cloud supports. Returns once
    /// serving has started.
    pub async fn start(
        cfg: Config,
        cloud: Arc<dyn CloudProvider>,
    ) -> Result<CloudControllerManager, Error> {
        let controllers = resolve_controllers(&cfg.controllers)?;
        let kcfg = clients::config_from_kubeconfig(&cfg.kubeconfig).await?;
        let client =
            kumo_client::transport::client(kcfg.clone()).map_err(kumo_client::Error::from)?;
        let identity = cfg
            .identity
            .clone()
            .unwrap_or_else(leader::default_identity);
        let (stop, stop_rx) = watch::channel(false);
        let (leading_tx, leading) = watch::channel(false);
        let le_cfg = LeaderElectionConfig {
            name: "cloud-controller-manager".into(),
            component: "cloud-controller-manager".into(),
            ..LeaderElectionConfig::kube_controller_manager(identity.clone())
        };
        let elector = cfg
            .leader_elect
            .then(|| LeaderElector::new(client.clone(), le_cfg));
        let checks: healthz::Checks = Arc::default();
        if let Some(e) = &elector {
            checks
                .write()
                .push(("leaderElection".into(), e.watchdog(leading.clone())));
        }
        let metrics: Arc<kumo_client::metrics::Registry> = Arc::default();
        if elector.is_some() {
            metrics.leader_election("cloud-controller-manager", leading.clone());
        }
        let healthz_addr = match cfg.serve {
            Some(addr) => {
                let secure = healthz::secure(&client, &metrics).await;
                Some(healthz::serve(addr, checks, stop_rx.clone(), secure).await?)
            }
            None => None,
        };
        let clients = Arc::new(ClientBuilder::new(
            client,
            kcfg,
            cfg.use_service_account_credentials,
            stop_rx.clone(),
        ));
        let ctx = Arc::new(Context {
            cloud,
            clients,
            config: cfg,
            metrics,
        });
        let task = tokio::spawn(leader::run_elected(
            elector,
            stop_rx,
            leading_tx,
            move |ctl_stop| start_controllers(ctx, &controllers, ctl_stop),
        ));
        Ok(CloudControllerManager {
            healthz_addr,
            identity,
            stop,
            leading,
            task,
        })
    }

    /// Whether this instance holds the lease and runs controllers.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Waits until this instance leads.
    pub async fn wait_leading(&mut self) {
        let _ = self.leading.wait_for(|l| *l).await;
    }

    /// Stops the controllers and informers.
    pub async fn shutdown(self) -> kumo_client::Result<()> {
        self.stop.send_replace(true);
        self.task.await.unwrap_or(Ok(()))
    }

    /// Runs until the controllers stop (an error when leadership is lost).
    pub async fn wait(self) -> kumo_client::Result<()> {
        let r = self.task.await.unwrap_or(Ok(()));
        self.stop.send_replace(true);
        r
    }
}

/// Creates the enabled controllers the cloud supports (as upstream, a controller whose
/// capability the provider lacks is skipped with a log line), then starts the informers.
fn start_controllers(
    ctx: Arc<Context>,
    controllers: &[&'static str],
    stop: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let factory = InformerFactory::with_metrics(ctx.clients.root(), ctx.metrics.clone());
    let mut tasks = Vec::new();
    let on = |n: &str| controllers.contains(&n);
    let cloud = &ctx.cloud;
    if on("cloud-node-controller") {
        if cloud.instances_v2().is_some() {
            tasks.push(node::start(ctx.clone(), &factory, stop.clone()));
        } else {
            tracing::warn!("cloud-node-controller: the cloud provider does not support instances");
        }
    }
    if on("cloud-node-lifecycle-controller") {
        if cloud.instances_v2().is_some() {
            tasks.push(nodelifecycle::start(ctx.clone(), &factory, stop.clone()));
        } else {
            tracing::warn!(
                "cloud-node-lifecycle-controller: the cloud provider does not support instances"
            );
        }
    }
    if on("service-lb-controller") {
        if cloud.load_balancer().is_some() {
            tasks.push(service::start(ctx.clone(), &factory, stop.clone()));
        } else {
            tracing::warn!(
                "service-lb-controller: the cloud provider does not support load balancers"
            );
        }
    }
    if on("node-route-controller") {
        // As upstream's CCM (not kube-controller-manager): only --configure-cloud-routes.
        if !ctx.config.configure_cloud_routes {
            tracing::info!(
                "node-route-controller: will not configure cloud provider routes, --configure-cloud-routes: false"
            );
        } else if cloud.routes().is_none() {
            tracing::warn!("node-route-controller: --configure-cloud-routes is set, but cloud provider does not support routes. Will not configure cloud provider routes.");
        } else {
            tasks.push(route::start(ctx.clone(), &factory, stop.clone()));
        }
    }
    tasks.extend(factory.start(stop));
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controllers_flag_takes_names_aliases_star_and_minus() {
        let all = resolve_controllers(&["*".into()]).expect("star");
        assert_eq!(all.len(), 4);
        let seed =
            resolve_controllers(&["cloud-node,cloud-node-lifecycle".into()]).expect("aliases");
        assert_eq!(
            seed,
            ["cloud-node-controller", "cloud-node-lifecycle-controller"]
        );
        let no_lb = resolve_controllers(&["*".into(), "-service".into()]).expect("minus");
        assert!(!no_lb.contains(&"service-lb-controller"));
        assert_eq!(no_lb.len(), 3);
        assert!(resolve_controllers(&["nope".into()]).is_err());
    }
}
