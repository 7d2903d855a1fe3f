//! Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection
//! package does it: the holder renews every retry period; a candidate takes the lease
//! only once the record it last observed has not changed for the lease duration (measured
//! on its own clock, never comparing clocks); a leader that cannot renew within the renew
//! deadline has lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::{is_not_found, Error, Result};

/// Timing and names of one election.
#[derive(Clone, Debug)]
pub struct LeaderElectionConfig {
    /// The Lease's namespace (`kube-system`).
    pub namespace: String,
    /// The Lease's name (`kube-controller-manager`).
    pub name: String,
    /// This candidate's holderIdentity (`<hostname>_<uuid>`).
    pub identity: String,
    /// How long a non-leader waits after the last observed change (15 s).
    pub lease_duration: Duration,
    /// How long the leader keeps retrying a renewal before giving up (10 s).
    pub renew_deadline: Duration,
    /// The time between tries (2 s).
    pub retry_period: Duration,
    /// The component named as the source of the `LeaderElection` event.
    pub component: String,
}

impl LeaderElectionConfig {
    /// kube-controller-manager's defaults for `identity`.
    pub fn kube_controller_manager(identity: String) -> Self {
        LeaderElectionConfig {
            namespace: "kube-system".into(),
            name: "kube-controller-manager".into(),
            identity,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            component: "kube-controller-manager".into(),
        }
    }
}

/// `<hostname>_<uuid>`, as kube-controller-manager names itself.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    identity_on(&host)
}

/// The identity of a component on machine `host`: `<host>_<uuid>`, as upstream's
/// components name their lease holder.
pub fn identity_on(host: &str) -> String {
    format!("{host}_{}", uuid::Uuid::new_v4())
}

struct Observed {
    spec: LeaseSpec,
    at: Instant,
}

/// One candidate.
pub struct LeaderElector {
    api: Api<Lease>,
    events: Api<Event>,
    cfg: LeaderElectionConfig,
    lease: Option<Lease>,
    observed: Option<Observed>,
    /// Shared with health checks: when the lease was last renewed by us.
    last_renew: Arc<Mutex<Option<Instant>>>,
}

impl LeaderElector {
    /// A candidate for `cfg` talking through `client`.
    pub fn new(client: Client, cfg: LeaderElectionConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client.clone(), &cfg.namespace),
            events: Api::namespaced(client, &cfg.namespace),
            cfg,
            lease: None,
            observed: None,
            last_renew: Arc::new(Mutex::new(None)),
        }
    }

    /// When this candidate last renewed (or acquired) the lease, for the health check.
    pub fn last_renew(&self) -> Arc<Mutex<Option<Instant>>> {
        self.last_renew.clone()
    }

    fn is_leader(&self) -> bool {
        self.observed
            .as_ref()
            .and_then(|o| o.spec.holder_identity.as_deref())
            == Some(self.cfg.identity.as_str())
    }

    fn lease_valid(&self, now: Instant) -> bool {
        self.observed.as_ref().is_some_and(|o| {
            let secs = o.spec.lease_duration_seconds.unwrap_or(0).max(0) as u64;
            o.at + Duration::from_secs(secs) > now
        })
    }

    fn observe(&mut self, spec: LeaseSpec) {
        self.observed = Some(Observed {
            spec,
            at: Instant::now(),
        });
    }

    /// One try (client-go's tryAcquireOrRenew); true when we hold the lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> bool {
        let now = MicroTime(Timestamp::now());
        let mut record = LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(self.cfg.lease_duration.as_secs() as i32),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..Default::default()
        };

        // Fast path: we lead and our view is fresh, so update the lease we hold.
        if self.is_leader() && self.lease_valid(Instant::now()) {
            if let (Some(o), Some(lease)) = (&self.observed, &self.lease) {
                record.acquire_time = o.spec.acquire_time.clone();
                record.lease_transitions = o.spec.lease_transitions;
                let mut next = lease.clone();
                next.spec = Some(record.clone());
                match self
                    .api
                    .replace(&self.cfg.name, &PostParams::default(), &next)
                    .await
                {
                    Ok(l) => {
                        self.lease = Some(l);
                        self.observe(record);
                        return true;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "failed to update lease optimistically, falling back to slow path")
                    }
                }
            }
        }

        let current = match self.api.get(&self.cfg.name).await {
            Ok(l) => l,
            Err(e) if is_not_found(&e) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(record.clone()),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(l) => {
                        self.lease = Some(l);
                        self.observe(record);
                        true
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "error initially creating lease lock");
                        false
                    }
                };
            }
            Err(e) => {
                tracing::error!(error = %e, "error retrieving lease lock");
                return false;
            }
        };
        let old = current.spec.clone().unwrap_or_default();
        self.lease = Some(current);
        if self.observed.as_ref().map(|o| &o.spec) != Some(&old) {
            self.observe(old.clone());
        }
        let held = old
            .holder_identity
            .as_deref()
            .is_some_and(|h| !h.is_empty());
        if held && self.lease_valid(Instant::now()) && !self.is_leader() {
            tracing::debug!(holder = ?old.holder_identity, "lease is held and has not yet expired");
            return false;
        }
        if self.is_leader() {
            record.acquire_time = old.acquire_time.clone();
            record.lease_transitions = old.lease_transitions;
        } else {
            record.lease_transitions = Some(old.lease_transitions.unwrap_or(0) + 1);
        }
        let Some(mut next) = self.lease.clone() else {
            return false;
        };
        next.spec = Some(record.clone());
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &next)
            .await
        {
            Ok(l) => {
                self.lease = Some(l);
                self.observe(record);
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "failed to update lease");
                false
            }
        }
    }

    /// Retry period with client-go's jitter (up to +120 %).
    fn jittered(&self) -> Duration {
        let r = f64::from(uuid::Uuid::new_v4().as_bytes()[0]) / 255.0;
        self.cfg.retry_period.mul_f64(1.0 + 1.2 * r)
    }

    /// Upstream's leaderElection health check: a leader that has not renewed for the lease
    /// duration plus 20 s is unhealthy. `leading` says whether this candidate leads.
    pub fn watchdog(&self, leading: watch::Receiver<bool>) -> crate::healthz::Check {
        let last = self.last_renew();
        let name = self.cfg.name.clone();
        let limit = self.cfg.lease_duration + Duration::from_secs(20);
        Arc::new(move || {
            if !*leading.borrow() {
                return Ok(());
            }
            match *last.lock() {
                Some(t) if Instant::now().duration_since(t) > limit => Err(format!(
                    "failed election to renew leadership on lease {name}"
                )),
                _ => Ok(()),
            }
        })
    }

    /// Tries until the lease is ours; false if `stop` turned true first.
    pub async fn acquire(&mut self, stop: &mut watch::Receiver<bool>) -> bool {
        tracing::info!(lease = %format!("{}/{}", self.cfg.namespace, self.cfg.name), "attempting to acquire leader lease...");
        loop {
            if *stop.borrow() {
                return false;
            }
            if self.try_acquire_or_renew().await {
                *self.last_renew.lock() = Some(Instant::now());
                tracing::info!(lease = %format!("{}/{}", self.cfg.namespace, self.cfg.name), "successfully acquired lease");
                self.record_event().await;
                return true;
            }
            let wait = self.jittered();
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return false,
            }
        }
    }

    /// Renews until `stop` turns true (Ok) or a renewal misses the deadline (Err).
    pub async fn renew(&mut self, stop: &mut watch::Receiver<bool>) -> Result<()> {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
                _ = stop.wait_for(|s| *s) => return Ok(()),
            }
            let deadline = Instant::now() + self.cfg.renew_deadline;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let ok = tokio::time::timeout(left, self.try_acquire_or_renew())
                    .await
                    .unwrap_or(false);
                if ok {
                    *self.last_renew.lock() = Some(Instant::now());
                    break;
                }
                if Instant::now() + self.cfg.retry_period >= deadline {
                    tracing::error!(lease = %self.cfg.name, "failed to renew lease: timed out waiting for the condition");
                    return Err(Error::LeaderElectionLost);
                }
                tokio::select! {
                    _ = tokio::time::sleep(self.cfg.retry_period) => {}
                    _ = stop.wait_for(|s| *s) => return Ok(()),
                }
            }
        }
    }

    /// The `LeaderElection` event ("<identity> became leader") on the Lease, as the
    /// lease lock records it; best effort.
    async fn record_event(&self) {
        let Some(lease) = &self.lease else { return };
        let now = Time(Timestamp::now());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(format!("{}.{:x}", self.cfg.name, nanos)),
                namespace: Some(self.cfg.namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
                name: lease.metadata.name.clone(),
                namespace: lease.metadata.namespace.clone(),
                uid: lease.metadata.uid.clone(),
                resource_version: lease.metadata.resource_version.clone(),
                ..Default::default()
            },
            reason: Some("LeaderElection".into()),
            message: Some(format!("{} became leader", self.cfg.identity)),
            source: Some(EventSource {
                component: Some(self.cfg.component.clone()),
                host: None,
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            type_: Some("Normal".into()),
            reporting_component: Some(self.cfg.component.clone()),
            reporting_instance: Some(String::new()),
            ..Default::default()
        };
        if let Err(e) = self.events.create(&PostParams::default(), &ev).await {
            tracing::debug!(error = %e, "recording the LeaderElection event failed");
        }
    }
}

/// Runs a component's controllers while this candidate leads: `start` creates them (with the
/// stop signal they must honour) and returns their tasks. Without an elector they run until
/// `stop`; with one, after acquiring the lease and until `stop` or until the lease is lost
/// (an error, after which the caller exits as upstream does). `leading` tells which.
pub async fn run_elected<F>(
    elector: Option<LeaderElector>,
    mut stop: watch::Receiver<bool>,
    leading: watch::Sender<bool>,
    start: F,
) -> Result<()>
where
    F: FnOnce(watch::Receiver<bool>) -> Vec<tokio::task::JoinHandle<()>>,
{
    let Some(mut elector) = elector else {
        leading.send_replace(true);
        let tasks = start(stop.clone());
        let _ = stop.wait_for(|s| *s).await;
        futures::future::join_all(tasks).await;
        return Ok(());
    };
    if !elector.acquire(&mut stop).await {
        return Ok(());
    }
    leading.send_replace(true);
    // Controllers stop with their own signal, so losing the lease stops them too.
    let (ctl_stop, ctl_stop_rx) = watch::channel(false);
    let tasks = start(ctl_stop_rx);
    let r = elector.renew(&mut stop).await;
    leading.send_replace(false);
    ctl_stop.send_replace(true);
    futures::future::join_all(tasks).await;
    r
}
