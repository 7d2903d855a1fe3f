//! kumo's scheduler: `kumo scheduler`, an API client like kube-scheduler. It never
//! touches storage: informers watch pods, nodes and namespaces through the API server
//! (the shared informers of `kumo-controller-manager`), unassigned pods of
//! `default-scheduler` go through the scheduling queue ([`queue`]) and the default
//! profile's plugins ([`plugins`]) against the scheduler's cache ([`cache`]), and the
//! result is written back: `pods/binding`, events.k8s.io/v1 events, and the PodScheduled
//! condition. With leader election only the holder of Lease kube-system/kube-scheduler
//! schedules.

pub mod cache;
pub mod cli;
pub mod error;
pub mod helpers;
pub mod plugins;
pub mod queue;
pub mod resources;
pub mod schedule;
pub mod volumes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Client;
use kumo_client::informer::{key_of, Change, InformerFactory};
use kumo_client::leader::{self, LeaderElectionConfig, LeaderElector};
use kumo_client::{clients, healthz};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use error::{Error, Result};

use cache::counts;
use helpers::pod_key;
use queue::ClusterEvent;
use schedule::{responsible, Sched, SCHEDULER_NAME};

/// Settings of `kumo scheduler`.
#[derive(Clone, Debug)]
pub struct Config {
    /// The kubeconfig to reach the API server with.
    pub kubeconfig: PathBuf,
    /// Take part in leader election before scheduling.
    pub leader_elect: bool,
    /// Where to serve /healthz (port 0 picks one); None: not served.
    pub serve: Option<SocketAddr>,
    /// The holderIdentity; default `<hostname>_<uuid>`.
    pub identity: Option<String>,
}

impl Config {
    /// kube-scheduler's defaults: leader election on, /healthz on 127.0.0.1:10259.
    pub fn new(kubeconfig: impl Into<PathBuf>) -> Self {
        Config {
            kubeconfig: kubeconfig.into(),
            leader_elect: true,
            serve: Some(SocketAddr::from(([127, 0, 0, 1], 10259))),
            identity: None,
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// A running scheduler.
pub struct Scheduler {
    /// Where /healthz is served, if it is.
    pub healthz_addr: Option<SocketAddr>,
    /// This instance's holderIdentity.
    pub identity: String,
    stop: watch::Sender<bool>,
    leading: watch::Receiver<bool>,
    task: JoinHandle<Result<()>>,
}

impl Scheduler {
    /// Reads the kubeconfig, serves /healthz, then (after winning the election, when
    /// enabled) starts the informers and the scheduling loop.
    pub async fn start(cfg: Config) -> Result<Scheduler> {
        let kcfg = clients::config_from_kubeconfig(&cfg.kubeconfig).await?;
        let client = kumo_client::transport::client(kcfg)?;
        let identity = cfg
            .identity
            .clone()
            .unwrap_or_else(leader::default_identity);
        let (stop, stop_rx) = watch::channel(false);
        let (leading_tx, leading) = watch::channel(false);
        let le_cfg = LeaderElectionConfig {
            namespace: "kube-system".into(),
            name: "kube-scheduler".into(),
            identity: identity.clone(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            component: SCHEDULER_NAME.into(),
        };
        let elector = cfg
            .leader_elect
            .then(|| LeaderElector::new(client.clone(), le_cfg.clone()));
        let mut checks: Vec<(String, healthz::Check)> = Vec::new();
        if let Some(e) = &elector {
            // The leaderElection watchdog: a leader that has not renewed for the lease
            // duration plus 20 s is unhealthy.
            let last = e.last_renew();
            let leading = leading.clone();
            let limit = le_cfg.lease_duration + Duration::from_secs(20);
            checks.push((
                "leaderElection".into(),
                Arc::new(move || {
                    if !*leading.borrow() {
                        return Ok(());
                    }
                    match *last.lock() {
                        Some(t) if Instant::now().duration_since(t) > limit => Err(
                            "failed election to renew leadership on lease kube-scheduler".into(),
                        ),
                        _ => Ok(()),
                    }
                }),
            ));
        }
        let metrics: Arc<kumo_client::metrics::Registry> = Arc::default();
        if elector.is_some() {
            metrics.leader_election("kube-scheduler", leading.clone());
        }
        let healthz_addr = match cfg.serve {
            Some(addr) => {
                let secure = healthz::secure(&client, &metrics).await;
                Some(
                    healthz::serve(
                        addr,
                        Arc::new(parking_lot::RwLock::new(checks)),
                        stop_rx.clone(),
                        secure,
                    )
                    .await
                    .map_err(|e| Error::Serve(e.to_string()))?,
                )
            }
            None => None,
        };
        let task = tokio::spawn(run(client, elector, stop_rx, leading_tx));
        Ok(Scheduler {
            healthz_addr,
            identity,
            stop,
            leading,
            task,
        })
    }

    /// Whether this instance holds the lease and schedules.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Waits until this instance leads.
    pub async fn wait_leading(&mut self) {
        let _ = self.leading.wait_for(|l| *l).await;
    }

    /// Stops scheduling (the lease is not released; a standby takes over once it expires).
    pub async fn shutdown(self) -> Result<()> {
        self.stop.send_replace(true);
        self.task.await.unwrap_or(Ok(()))
    }

    /// Runs until the scheduler stops (an error when leadership is lost).
    pub async fn wait(self) -> Result<()> {
        let r = self.task.await.unwrap_or(Ok(()));
        self.stop.send_replace(true);
        r
    }
}

async fn run(
    client: Client,
    elector: Option<LeaderElector>,
    mut stop: watch::Receiver<bool>,
    leading: watch::Sender<bool>,
) -> Result<()> {
    let Some(mut elector) = elector else {
        leading.send_replace(true);
        let task = tokio::spawn(scheduling(client, stop.clone()));
        let _ = stop.wait_for(|s| *s).await;
        let _ = task.await;
        return Ok(());
    };
    if !elector.acquire(&mut stop).await {
        return Ok(());
    }
    leading.send_replace(true);
    // Scheduling stops with its own signal, so losing the lease stops it too.
    let (sched_stop, sched_stop_rx) = watch::channel(false);
    let task = tokio::spawn(scheduling(client, sched_stop_rx));
    let r = elector.renew(&mut stop).await;
    leading.send_replace(false);
    sched_stop.send_replace(true);
    let _ = task.await;
    r.map_err(|_| Error::LeaderElectionLost)
}

fn node_changed(old: &Node, new: &Node) -> bool {
    old.metadata.labels != new.metadata.labels
        || old.spec != new.spec
        || old.status.as_ref().map(|s| (&s.allocatable, &s.images))
            != new.status.as_ref().map(|s| (&s.allocatable, &s.images))
}

/// Informers, their handlers, and the scheduling loop, until `stop`.
async fn scheduling(client: Client, mut stop: watch::Receiver<bool>) {
    let factory = InformerFactory::new(client.clone());
    let pods = factory.informer::<Pod>();
    let nodes = factory.informer::<Node>();
    let namespaces = factory.informer::<Namespace>();
    let recorder = kumo_client::events_v1::Recorder::new(
        client.clone(),
        SCHEDULER_NAME,
        format!("{SCHEDULER_NAME}-{}", hostname()),
    );
    let volumes = volumes::Informers {
        claims: factory.informer(),
        volumes: factory.informer(),
        classes: factory.informer(),
        csi_nodes: factory.informer(),
    };
    let s = Arc::new(Sched::new(
        client,
        pods.clone(),
        namespaces,
        recorder,
        volumes,
    ));
    {
        // VolumeBinding's events: a claim, volume or class added or changed.
        let h = s.clone();
        s.volumes.claims.add_handler(move |c| {
            if !matches!(c, Change::Deleted(_)) {
                h.queue.on_event(ClusterEvent::StorageChange);
            }
        });
        let h = s.clone();
        s.volumes.volumes.add_handler(move |c| {
            if !matches!(c, Change::Deleted(_)) {
                h.queue.on_event(ClusterEvent::StorageChange);
            }
        });
        let h = s.clone();
        s.volumes.classes.add_handler(move |c| {
            if !matches!(c, Change::Deleted(_)) {
                h.queue.on_event(ClusterEvent::StorageChange);
            }
        });
        let h = s.clone();
        s.volumes.csi_nodes.add_handler(move |c| {
            if !matches!(c, Change::Deleted(_)) {
                h.queue.on_event(ClusterEvent::StorageChange);
            }
        });
    }

    let (h, cached) = (s.clone(), nodes.clone());
    // The informer's own copy of a node, shared rather than cloned.
    let shared_node = move |n: &Node| {
        cached
            .get(&key_of(n))
            .unwrap_or_else(|| Arc::new(n.clone()))
    };
    nodes.add_handler(move |c| match c {
        Change::Added(n) => {
            h.cache.lock().set_node(shared_node(n));
            h.queue.on_event(ClusterEvent::NodeAdd);
        }
        Change::Updated { old, new } => {
            h.cache.lock().set_node(shared_node(new));
            if node_changed(old, new) {
                h.queue.on_event(ClusterEvent::NodeUpdate);
            }
        }
        Change::Deleted(n) => h
            .cache
            .lock()
            .remove_node(n.metadata.name.as_deref().unwrap_or_default()),
    });
    let h = s.clone();
    pods.add_handler(move |c| {
        let assigned = |p: &Pod| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty())
        };
        // The informer's own copy, shared rather than cloned: the cache holds every
        // assigned pod of the cluster.
        let shared = |p: &Pod| {
            h.pods
                .get(&key_of(p))
                .unwrap_or_else(|| Arc::new(p.clone()))
        };
        match c {
            Change::Added(p) | Change::Updated { new: p, .. } if assigned(p) => {
                let was = match &c {
                    Change::Updated { old, .. } => Some(*old),
                    _ => None,
                };
                h.queue.delete(&pod_key(p));
                let pod = shared(p);
                h.cache.lock().set_pod(pod.clone());
                match was {
                    Some(o) if assigned(o) => {
                        if counts(o) && !counts(p) {
                            h.queue.on_event(ClusterEvent::AssignedPodDelete(pod));
                        } else if o.metadata.labels != p.metadata.labels {
                            h.queue.on_event(ClusterEvent::AssignedPodUpdate(pod));
                        }
                    }
                    _ => h.queue.on_event(ClusterEvent::AssignedPodAdd(pod)),
                }
            }
            Change::Added(p) | Change::Updated { new: p, .. } => {
                if responsible(p) {
                    h.queue.add_or_update(shared(p));
                } else {
                    h.queue.delete(&pod_key(p));
                }
            }
            Change::Deleted(p) => {
                let key = pod_key(p);
                if assigned(p) {
                    h.cache.lock().remove_pod(&key);
                    h.queue
                        .on_event(ClusterEvent::AssignedPodDelete(Arc::new(p.clone())));
                } else {
                    h.queue.delete(&key);
                }
            }
        }
    });

    let informers = factory.start(stop.clone());
    let flusher = {
        let s = s.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => s.queue.flush(),
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        })
    };
    // Schedule only once the caches hold the cluster, as upstream waits for sync.
    tokio::select! {
        _ = async { pods.wait_synced().await; nodes.wait_synced().await; s.namespaces.wait_synced().await } => {}
        _ = stop.wait_for(|s| *s) => return,
    }
    tracing::info!("scheduler caches synced; scheduling");
    loop {
        let qp = tokio::select! {
            qp = s.queue.pop() => qp,
            _ = stop.wait_for(|s| *s) => break,
        };
        schedule::schedule_one(&s, qp).await;
    }
    let _ = flusher.await;
    futures::future::join_all(informers).await;
}
