//! kumo's controller-manager: `kumo controller-manager`, an API client like
//! kube-controller-manager. It talks only to the API server (HTTPS, a kubeconfig), never to
//! storage. Controllers are informer-driven: one watch and cache per resource
//! (`kumo_client::informer`), shared by every controller, whose handlers put keys on a rate-limited
//! workqueue; workers reconcile one key at a time. With leader election (`kumo_client::leader`)
//! only the holder of the Lease kube-system/kube-controller-manager runs controllers.
//!
//! Which of upstream's controllers kumo has is the last column of [`KNOWN_CONTROLLERS`];
//! each lives in its own module under [`controllers`].

pub mod controllers;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use kumo_client::{Error, Result};

use kumo_client::informer::InformerFactory;
use kumo_client::leader::{self, LeaderElectionConfig, LeaderElector};
use kumo_client::{clients, healthz};

/// Every controller kube-controller-manager v1.37 knows, with its old alias (if any),
/// whether it is on by default, and whether kumo has it yet.
pub const KNOWN_CONTROLLERS: &[(&str, Option<&str>, bool, bool)] = &[
    (
        "bootstrap-signer-controller",
        Some("bootstrapsigner"),
        false,
        false,
    ),
    (
        "certificatesigningrequest-approving-controller",
        Some("csrapproving"),
        true,
        true,
    ),
    (
        "certificatesigningrequest-cleaner-controller",
        Some("csrcleaner"),
        true,
        true,
    ),
    (
        "certificatesigningrequest-signing-controller",
        Some("csrsigning"),
        true,
        true,
    ),
    (
        "clusterrole-aggregation-controller",
        Some("clusterrole-aggregation"),
        true,
        true,
    ),
    ("cronjob-controller", Some("cronjob"), true, true),
    ("daemonset-controller", Some("daemonset"), true, true),
    ("deployment-controller", Some("deployment"), true, true),
    ("device-taint-eviction-controller", None, true, false),
    ("disruption-controller", Some("disruption"), true, true),
    ("endpoints-controller", Some("endpoint"), true, true),
    (
        "endpointslice-controller",
        Some("endpointslice"),
        true,
        true,
    ),
    (
        "endpointslice-mirroring-controller",
        Some("endpointslicemirroring"),
        true,
        true,
    ),
    (
        "ephemeral-volume-controller",
        Some("ephemeral-volume"),
        true,
        true,
    ),
    (
        "garbage-collector-controller",
        Some("garbagecollector"),
        true,
        true,
    ),
    (
        "horizontal-pod-autoscaler-controller",
        Some("horizontalpodautoscaling"),
        true,
        true,
    ),
    ("job-controller", Some("job"), true, true),
    (
        "kube-apiserver-serving-clustertrustbundle-publisher-controller",
        None,
        true,
        false,
    ),
    (
        "legacy-serviceaccount-token-cleaner-controller",
        Some("legacy-service-account-token-cleaner"),
        true,
        false,
    ),
    ("namespace-controller", Some("namespace"), true, true),
    ("node-ipam-controller", Some("nodeipam"), true, true),
    (
        "node-lifecycle-controller",
        Some("nodelifecycle"),
        true,
        true,
    ),
    (
        "persistentvolume-attach-detach-controller",
        Some("attachdetach"),
        true,
        true,
    ),
    (
        "persistentvolume-binder-controller",
        Some("persistentvolume-binder"),
        true,
        true,
    ),
    (
        "persistentvolume-expander-controller",
        Some("persistentvolume-expander"),
        true,
        true,
    ),
    (
        "persistentvolume-protection-controller",
        Some("pv-protection"),
        true,
        true,
    ),
    (
        "persistentvolumeclaim-protection-controller",
        Some("pvc-protection"),
        true,
        true,
    ),
    (
        "pod-garbage-collector-controller",
        Some("podgc"),
        true,
        true,
    ),
    (
        "podcertificaterequest-cleaner-controller",
        None,
        true,
        false,
    ),
    ("podgroup-protection-controller", None, true, false),
    ("replicaset-controller", Some("replicaset"), true, true),
    (
        "replicationcontroller-controller",
        Some("replicationcontroller"),
        true,
        true,
    ),
    (
        "resourceclaim-controller",
        Some("resource-claim-controller"),
        true,
        false,
    ),
    ("resourcepoolstatusrequest-controller", None, true, false),
    (
        "resourcequota-controller",
        Some("resourcequota"),
        true,
        true,
    ),
    (
        "root-ca-certificate-publisher-controller",
        Some("root-ca-cert-publisher"),
        true,
        true,
    ),
    ("selinux-warning-controller", None, false, false),
    ("service-cidr-controller", None, true, false),
    (
        "serviceaccount-controller",
        Some("serviceaccount"),
        true,
        true,
    ),
    (
        "serviceaccount-token-controller",
        Some("serviceaccount-token"),
        true,
        false,
    ),
    ("statefulset-controller", Some("statefulset"), true, true),
    (
        "storage-version-migrator-controller",
        Some("svm"),
        true,
        false,
    ),
    (
        "storageversion-garbage-collector-controller",
        Some("storage-version-gc"),
        true,
        false,
    ),
    ("taint-eviction-controller", None, true, true),
    (
        "token-cleaner-controller",
        Some("tokencleaner"),
        false,
        true,
    ),
    (
        "ttl-after-finished-controller",
        Some("ttl-after-finished"),
        true,
        true,
    ),
    ("ttl-controller", Some("ttl"), true, false),
    (
        "validatingadmissionpolicy-status-controller",
        None,
        true,
        false,
    ),
    (
        "volumeattributesclass-protection-controller",
        None,
        true,
        false,
    ),
];

/// The canonical name of a controller name or alias, if upstream knows it.
pub fn canonical_name(name: &str) -> Option<&'static str> {
    KNOWN_CONTROLLERS
        .iter()
        .find(|(n, a, _, _)| *n == name || *a == Some(name))
        .map(|(n, ..)| *n)
}

/// Resolves `--controllers` (aliases to canonical names), rejecting unknown names with
/// upstream's message.
pub fn resolve_controllers(flags: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut errs = Vec::new();
    for f in flags {
        if f == "*" {
            out.push(f.clone());
            continue;
        }
        let bare = f.strip_prefix('-').unwrap_or(f);
        match canonical_name(bare) {
            Some(n) if f.starts_with('-') => out.push(format!("-{n}")),
            Some(n) => out.push(n.to_owned()),
            None => errs.push(format!("{bare:?} is not in the list of known controllers")),
        }
    }
    if !errs.is_empty() {
        return Err(Error::Flag(errs.join(", ")));
    }
    Ok(out)
}

/// Whether `name` runs under the resolved `controllers` (upstream's IsControllerEnabled).
pub fn is_enabled(name: &str, controllers: &[String]) -> bool {
    let mut star = false;
    for c in controllers {
        if c == name {
            return true;
        }
        if c.strip_prefix('-') == Some(name) {
            return false;
        }
        if c == "*" {
            star = true;
        }
    }
    star && KNOWN_CONTROLLERS
        .iter()
        .any(|(n, _, on, _)| *n == name && *on)
}

/// Settings of `kumo controller-manager`.
#[derive(Clone, Debug)]
pub struct Config {
    /// The kubeconfig to reach the API server with.
    pub kubeconfig: PathBuf,
    /// Take part in leader election before running controllers.
    pub leader_elect: bool,
    /// `--controllers` as given (names or aliases, `*`, `-name`).
    pub controllers: Vec<String>,
    /// The CA published in `kube-root-ca.crt`; default: the kubeconfig's CA.
    pub root_ca_file: Option<PathBuf>,
    /// Where to serve /healthz (port 0 picks one); None: not served.
    pub serve: Option<SocketAddr>,
    /// The holderIdentity; default `<hostname>_<uuid>`.
    pub identity: Option<String>,
    /// Each controller acts as its own ServiceAccount in kube-system (token from
    /// TokenRequest) instead of with the kubeconfig's credentials.
    pub use_service_account_credentials: bool,
    /// `--terminated-pod-gc-threshold` and the pod GC's periods.
    pub pod_gc: controllers::podgc::Settings,
    /// The node-ipam flags (`--allocate-node-cidrs`, `--cluster-cidr`, ...).
    pub node_ipam: controllers::nodeipam::Settings,
    /// The node controller's periods (`--node-monitor-grace-period`, ...).
    pub node_lifecycle: controllers::nodelifecycle::Settings,
    /// The CA csrsigning issues from (`--cluster-signing-cert-file`, ...).
    pub csr_signing: controllers::certificates::signer::Settings,
    /// The HPA controller's periods and tolerance (`--horizontal-pod-autoscaler-*`).
    pub hpa: controllers::podautoscaler::Settings,
}

impl Config {
    /// Upstream's defaults for this kubeconfig: leader election on, `*`, 127.0.0.1:10257.
    pub fn new(kubeconfig: impl Into<PathBuf>) -> Self {
        Config {
            kubeconfig: kubeconfig.into(),
            leader_elect: true,
            controllers: vec!["*".into()],
            root_ca_file: None,
            serve: Some(SocketAddr::from(([127, 0, 0, 1], 10257))),
            identity: None,
            use_service_account_credentials: false,
            pod_gc: controllers::podgc::Settings::default(),
            node_ipam: controllers::nodeipam::Settings::default(),
            node_lifecycle: controllers::nodelifecycle::Settings::default(),
            csr_signing: controllers::certificates::signer::Settings::default(),
            hpa: controllers::podautoscaler::Settings::default(),
        }
    }
}

/// What the controllers are configured with, beyond their names.
struct Settings {
    /// The CA published in `kube-root-ca.crt`.
    root_ca: String,
    pod_gc: controllers::podgc::Settings,
    /// Validated node-ipam flags; None when allocation is off.
    node_ipam: Option<controllers::nodeipam::Params>,
    node_lifecycle: controllers::nodelifecycle::Settings,
    csr_signing: controllers::certificates::signer::Settings,
    hpa: controllers::podautoscaler::Settings,
    /// The controller-manager's metrics (its work queues, its lease).
    metrics: Arc<kumo_client::metrics::Registry>,
}

/// The kubeconfig's cluster CA, PEM (certificate-authority-data or certificate-authority).
fn kubeconfig_ca(path: &Path, kc: &Kubeconfig) -> Result<String> {
    let bad = |message: String| Error::Kubeconfig {
        path: path.display().to_string(),
        message,
    };
    let ctx_name = kc.current_context.clone().unwrap_or_default();
    let cluster_name = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .ok_or_else(|| bad(format!("context {ctx_name:?} not found")))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| bad(format!("cluster {cluster_name:?} not found")))?;
    if let Some(data) = &cluster.certificate_authority_data {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| bad(format!("certificate-authority-data: {e}")))?;
        return String::from_utf8(pem).map_err(|e| bad(format!("certificate-authority-data: {e}")));
    }
    if let Some(file) = &cluster.certificate_authority {
        let p = path.parent().unwrap_or(Path::new(".")).join(file);
        return std::fs::read_to_string(&p).map_err(|source| Error::Io {
            path: p.display().to_string(),
            source,
        });
    }
    Err(bad("no certificate authority for the cluster".into()))
}

/// A running controller-manager.
pub struct ControllerManager {
    /// Where /healthz is served, if it is.
    pub healthz_addr: Option<SocketAddr>,
    /// This instance's holderIdentity.
    pub identity: String,
    stop: watch::Sender<bool>,
    leading: watch::Receiver<bool>,
    task: JoinHandle<Result<()>>,
}

impl ControllerManager {
    /// Reads the kubeconfig, starts /healthz, then (after winning the election, when
    /// enabled) the informers and controllers. Returns once serving has started.
    pub async fn start(cfg: Config) -> Result<ControllerManager> {
        let controllers = resolve_controllers(&cfg.controllers)?;
        // Bad node-ipam flags stop the start, as kube-controller-manager exits on them.
        let node_ipam = (cfg.node_ipam.allocate_node_cidrs
            && is_enabled("node-ipam-controller", &controllers))
        .then(|| controllers::nodeipam::Params::new(&cfg.node_ipam))
        .transpose()
        .map_err(Error::Flag)?;
        cfg.csr_signing.validate().map_err(Error::Flag)?;
        let path = cfg.kubeconfig.clone();
        let bad = |message: String| Error::Kubeconfig {
            path: path.display().to_string(),
            message,
        };
        let kc = Kubeconfig::read_from(&cfg.kubeconfig).map_err(|e| bad(e.to_string()))?;
        let root_ca = match &cfg.root_ca_file {
            Some(f) => std::fs::read_to_string(f).map_err(|source| Error::Io {
                path: f.display().to_string(),
                source,
            })?,
            None => kubeconfig_ca(&cfg.kubeconfig, &kc)?,
        };
        let kcfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map(kumo_client::clients::as_client_go)
            .map_err(|e| bad(e.to_string()))?;
        let client = kumo_client::transport::client(kcfg.clone())?;
        let identity = cfg
            .identity
            .clone()
            .unwrap_or_else(leader::default_identity);
        let (stop, stop_rx) = watch::channel(false);
        let (leading_tx, leading) = watch::channel(false);

        let le_cfg = LeaderElectionConfig::kube_controller_manager(identity.clone());
        let elector = cfg
            .leader_elect
            .then(|| LeaderElector::new(client.clone(), le_cfg.clone()));
        let checks: healthz::Checks = Arc::default();
        if let Some(e) = &elector {
            checks
                .write()
                .push(("leaderElection".into(), e.watchdog(leading.clone())));
        }
        let metrics: Arc<kumo_client::metrics::Registry> = Arc::default();
        if elector.is_some() {
            metrics.leader_election(&le_cfg.name, leading.clone());
        }
        let healthz_addr = match cfg.serve {
            Some(addr) => {
                let secure = healthz::secure(&client, &metrics).await;
                Some(healthz::serve(addr, checks.clone(), stop_rx.clone(), secure).await?)
            }
            None => None,
        };
        let clients = Arc::new(clients::ClientBuilder::new(
            client.clone(),
            kcfg,
            cfg.use_service_account_credentials,
            stop_rx.clone(),
        ));
        let task = tokio::spawn(run(
            clients,
            checks,
            controllers,
            Settings {
                root_ca,
                pod_gc: cfg.pod_gc.clone(),
                node_ipam,
                node_lifecycle: cfg.node_lifecycle.clone(),
                csr_signing: cfg.csr_signing.clone(),
                hpa: cfg.hpa,
                metrics,
            },
            elector,
            stop_rx,
            leading_tx,
        ));
        Ok(ControllerManager {
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

    /// Stops the controllers and informers (the lease is not released, as upstream by
    /// default: a standby takes over once it expires).
    pub async fn shutdown(self) -> Result<()> {
        self.stop.send_replace(true);
        self.task.await.unwrap_or(Ok(()))
    }

    /// Runs until the controllers stop (an error when leadership is lost).
    pub async fn wait(self) -> Result<()> {
        let r = self.task.await.unwrap_or(Ok(()));
        self.stop.send_replace(true);
        r
    }
}

async fn run(
    clients: Arc<clients::ClientBuilder>,
    checks: healthz::Checks,
    controllers: Vec<String>,
    settings: Settings,
    elector: Option<LeaderElector>,
    stop: watch::Receiver<bool>,
    leading: watch::Sender<bool>,
) -> Result<()> {
    leader::run_elected(elector, stop, leading, move |ctl_stop| {
        start_controllers(
            clients,
            &checks,
            &controllers,
            settings.root_ca.clone(),
            &settings,
            ctl_stop,
        )
    })
    .await
}

/// Creates the enabled controllers (registering their handlers), then starts the informers.
fn start_controllers(
    clients: Arc<clients::ClientBuilder>,
    checks: &healthz::Checks,
    controllers: &[String],
    root_ca: String,
    settings: &Settings,
    stop: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    // Informers watch with the controller-manager's own identity ("shared-informers").
    let factory = InformerFactory::with_metrics(clients.root(), settings.metrics.clone());
    let mut tasks = Vec::new();
    let on = |n: &str| is_enabled(n, controllers);
    if on("serviceaccount-controller") {
        tasks.push(controllers::serviceaccount::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("node-lifecycle-controller") {
        tasks.push(controllers::nodelifecycle::start(
            clients.clone(),
            &factory,
            settings.node_lifecycle.clone(),
            stop.clone(),
        ));
    }
    if on("certificatesigningrequest-approving-controller") {
        tasks.push(controllers::certificates::approver::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    let mut signing = false;
    if on("certificatesigningrequest-signing-controller") {
        if let Some(t) = controllers::certificates::signer::start(
            clients.clone(),
            &factory,
            &settings.csr_signing,
            stop.clone(),
        ) {
            signing = true;
            tasks.push(t);
        }
    }
    if on("certificatesigningrequest-cleaner-controller") {
        tasks.push(controllers::certificates::cleaner::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("token-cleaner-controller") {
        tasks.push(controllers::tokencleaner::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("root-ca-certificate-publisher-controller") {
        tasks.push(controllers::rootca::start(
            clients.clone(),
            root_ca,
            &factory,
            stop.clone(),
        ));
    }
    if on("clusterrole-aggregation-controller") {
        tasks.push(controllers::clusterrole_aggregation::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("deployment-controller") {
        tasks.push(controllers::deployment::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("replicationcontroller-controller") {
        tasks.push(controllers::replicaset::start_replication_controllers(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("replicaset-controller") {
        tasks.push(controllers::replicaset::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("garbage-collector-controller") {
        tasks.push(controllers::garbagecollector::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("namespace-controller") {
        tasks.push(controllers::namespace::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("endpointslice-mirroring-controller") {
        tasks.push(controllers::endpointslicemirroring::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("endpoints-controller") {
        tasks.push(controllers::endpoints::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("endpointslice-controller") {
        tasks.push(controllers::endpointslice::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("daemonset-controller") {
        tasks.push(controllers::daemonset::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("statefulset-controller") {
        tasks.push(controllers::statefulset::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("job-controller") {
        tasks.push(controllers::job::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("cronjob-controller") {
        tasks.push(controllers::cronjob::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("persistentvolume-protection-controller") {
        tasks.push(controllers::pvprotection::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("persistentvolume-attach-detach-controller") {
        tasks.push(controllers::attachdetach::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("ephemeral-volume-controller") {
        tasks.push(controllers::ephemeral::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("persistentvolume-expander-controller") {
        tasks.push(controllers::expand::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("persistentvolume-binder-controller") {
        tasks.push(controllers::pvbinder::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("persistentvolumeclaim-protection-controller") {
        tasks.push(controllers::pvcprotection::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("horizontal-pod-autoscaler-controller") {
        tasks.push(controllers::podautoscaler::start(
            clients.clone(),
            &factory,
            settings.hpa,
            stop.clone(),
        ));
    }
    if on("ttl-after-finished-controller") {
        tasks.push(controllers::ttlafterfinished::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("disruption-controller") {
        tasks.push(controllers::disruption::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("resourcequota-controller") {
        tasks.push(controllers::resourcequota::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("taint-eviction-controller") {
        tasks.push(controllers::tainteviction::start(
            clients.clone(),
            &factory,
            stop.clone(),
        ));
    }
    if on("pod-garbage-collector-controller") {
        tasks.push(controllers::podgc::start(
            clients.clone(),
            &factory,
            settings.pod_gc.clone(),
            stop.clone(),
        ));
    }
    // Upstream starts no node-ipam controller unless --allocate-node-cidrs is set.
    if let Some(params) = settings
        .node_ipam
        .clone()
        .filter(|_| on("node-ipam-controller"))
    {
        tasks.push(controllers::nodeipam::start(
            clients.clone(),
            &factory,
            params,
            stop.clone(),
        ));
    }
    for (name, _, default_on, have) in KNOWN_CONTROLLERS {
        if !have && *default_on && on(name) {
            tracing::debug!(controller = name, "not implemented in kumo yet; skipped");
        }
    }
    tasks.extend(factory.start(stop));
    // A ping check per started controller, named as upstream's (once per process: a
    // leader that lost the lease and won it again does not add them twice).
    let mut c = checks.write();
    // A controller its settings leave off (node-ipam without --allocate-node-cidrs) is
    // skipped, as upstream's nil controller, and gets no check.
    let skipped = |n: &str| {
        (n == "node-ipam-controller" && settings.node_ipam.is_none())
            || (n == "certificatesigningrequest-signing-controller" && !signing)
    };
    for (name, _, _, have) in KNOWN_CONTROLLERS {
        if *have && on(name) && !skipped(name) && !c.iter().any(|(n, _)| n == name) {
            c.push(((*name).to_owned(), Arc::new(|| Ok(()))));
        }
    }
    drop(c);
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controllers_flag_resolves_aliases_and_switches() {
        let c = resolve_controllers(&["*".into(), "-serviceaccount".into()]).expect("valid");
        assert_eq!(
            c,
            vec!["*".to_string(), "-serviceaccount-controller".to_string()]
        );
        assert!(!is_enabled("serviceaccount-controller", &c));
        assert!(is_enabled("namespace-controller", &c));
        assert!(!is_enabled("bootstrap-signer-controller", &c));
        let only = resolve_controllers(&["namespace".into()]).expect("valid");
        assert!(is_enabled("namespace-controller", &only));
        assert!(!is_enabled("serviceaccount-controller", &only));
        let err = resolve_controllers(&["nope".into()]).expect_err("unknown");
        assert_eq!(
            err.to_string(),
            "\"nope\" is not in the list of known controllers"
        );
    }
}
