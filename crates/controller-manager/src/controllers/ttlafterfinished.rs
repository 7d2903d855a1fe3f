//! ttl-after-finished-controller: deletes a finished Job (a Complete or Failed condition)
//! once `spec.ttlSecondsAfterFinished` seconds have passed since that condition's
//! lastTransitionTime. A Job not yet expired is requeued for exactly the time left. The
//! deletion is in the foreground (its pods go first) and guarded by the uid of a freshly
//! read Job, so a Job whose TTL was changed meanwhile, or a new Job of the same name, is
//! not deleted.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions, PropagationPolicy};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::is_not_found;
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::WorkQueue;

const SERVICE_ACCOUNT: &str = "ttl-after-finished-controller";

/// Whether the Job has a TTL and has finished (needsCleanup).
fn needs_cleanup(j: &Job) -> bool {
    j.spec
        .as_ref()
        .is_some_and(|s| s.ttl_seconds_after_finished.is_some())
        && finish_condition_time(j).is_some()
}

/// The finished condition, with its lastTransitionTime if it has one.
fn finish_condition_time(j: &Job) -> Option<Option<Timestamp>> {
    j.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| c.last_transition_time.as_ref().map(|t| t.0))
}

/// When the Job expires (finish time plus TTL), or upstream's error text.
fn expire_at(j: &Job) -> Result<Timestamp, String> {
    let ns = j.metadata.namespace.as_deref().unwrap_or_default();
    let name = j.metadata.name.as_deref().unwrap_or_default();
    let ttl = j
        .spec
        .as_ref()
        .and_then(|s| s.ttl_seconds_after_finished)
        .ok_or_else(|| format!("job {ns}/{name} should not be cleaned up"))?;
    let finished = match finish_condition_time(j) {
        None => {
            return Err(format!(
                "unable to find the status of the finished Job {ns}/{name}"
            ))
        }
        Some(None) => {
            return Err(format!(
                "unable to find the time when the Job {ns}/{name} finished"
            ))
        }
        Some(Some(t)) => t,
    };
    let ns_at = finished.as_nanosecond() + i128::from(ttl) * 1_000_000_000;
    Ok(Timestamp::from_nanosecond(ns_at).unwrap_or(Timestamp::MAX))
}

/// Time left before the Job expires (negative: expired), in nanoseconds.
fn time_left(j: &Job, now: Timestamp) -> Result<i128, String> {
    Ok(expire_at(j)?.as_nanosecond() - now.as_nanosecond())
}

struct Ctl {
    client: ClientSource,
    jobs: Arc<Informer<Job>>,
    queue: Arc<WorkQueue<String>>,
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("ttl_jobs_to_delete");
    let jobs = factory.informer::<Job>();
    let q = queue.clone();
    jobs.add_handler(move |c| match c {
        Change::Added(j) | Change::Updated { new: j, .. } => {
            if j.metadata.deletion_timestamp.is_none() && needs_cleanup(j) {
                q.add(key_of(j));
            }
        }
        Change::Deleted(_) => {}
    });
    tokio::spawn(async move {
        tracing::info!("Starting TTL after finished controller");
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            jobs,
            queue: queue.clone(),
        });
        if !wait_for_sync(&mut stop, ctl.jobs.wait_synced()).await {
            return;
        }
        let tasks = run_workers_of(
            "ttl_jobs_to_delete",
            queue,
            5,
            stop,
            &ctl,
            |c, key| async move { c.process(&key).await },
        );
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down TTL after finished controller");
    })
}

impl Ctl {
    /// Whether the Job is due for deletion now; if it will be later, it is requeued for
    /// exactly the time left (processTTL).
    fn expired(&self, j: &Job) -> Result<bool, SyncError> {
        if j.metadata.deletion_timestamp.is_some() || !needs_cleanup(j) {
            return Ok(false);
        }
        let left = time_left(j, Timestamp::now()).map_err(SyncError::Failed)?;
        if left <= 0 {
            return Ok(true);
        }
        let d = Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX));
        self.queue.add_after(key_of(j), d);
        Ok(false)
    }

    async fn process(&self, key: &str) -> Result<(), SyncError> {
        let Some(cached) = self.jobs.get(key) else {
            return Ok(());
        };
        if !self.expired(&cached)? {
            return Ok(());
        }
        // The cache may be behind (the TTL changed, or the Job was recreated): decide on a
        // fresh copy.
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let api: Api<Job> = Api::namespaced(self.client.get(), ns);
        let fresh = match api.get(name).await {
            Ok(j) => j,
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if !self.expired(&fresh)? {
            return Ok(());
        }
        tracing::debug!(job = key, "Cleaning up Job");
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            preconditions: Some(Preconditions {
                uid: fresh.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        api.delete(name, &dp).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{JobCondition, JobSpec, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn job(ttl: Option<i32>, cond: Option<(&str, Option<&str>)>) -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some("j".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(JobSpec {
                ttl_seconds_after_finished: ttl,
                ..Default::default()
            }),
            status: Some(JobStatus {
                conditions: cond.map(|(t, at)| {
                    vec![JobCondition {
                        type_: t.into(),
                        status: "True".into(),
                        last_transition_time: at.map(|a| Time(a.parse().expect("time"))),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn expiry_from_the_finished_condition() {
        let now: Timestamp = "2026-03-01T10:00:00Z".parse().expect("time");
        let j = job(Some(10), Some(("Complete", Some("2026-03-01T09:59:55Z"))));
        assert!(needs_cleanup(&j));
        assert_eq!(time_left(&j, now), Ok(5_000_000_000));
        let j = job(Some(0), Some(("Failed", Some("2026-03-01T09:59:55Z"))));
        assert_eq!(time_left(&j, now), Ok(-5_000_000_000));
        assert!(!needs_cleanup(&job(None, Some(("Complete", None)))));
        assert!(!needs_cleanup(&job(Some(1), Some(("Suspended", None)))));
        assert_eq!(
            time_left(&job(Some(1), Some(("Complete", None))), now),
            Err("unable to find the time when the Job ns/j finished".to_string())
        );
    }
}
