//! cronjob-controller: creates a Job from each CronJob's template at the times of its
//! schedule (upstream's ControllerV2). A Job is named `<cronjob>-<scheduled minutes since
//! the epoch>` (the name is the lock against creating one twice), is controlled by the
//! CronJob and carries the `batch.kubernetes.io/cronjob-scheduled-timestamp` annotation.
//! concurrencyPolicy, startingDeadlineSeconds, suspend and the history limits act as
//! upstream's; the status keeps the active Jobs and the last schedule and success times.
//! A CronJob is requeued for its next schedule time; nothing polls.

mod schedule;

pub use schedule::parse_go_duration;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::replicaset::{controller_of, controller_ref, record_event};
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_already_exists, is_not_found, message, namespace_terminating};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers, wait_for_sync, SyncError};
use kumo_client::workqueue::WorkQueue;

use schedule::{go_quote, ns_of, ts_of, ZERO};
pub use schedule::{load_location, parse_standard, Schedule};

const COMPONENT: &str = "cronjob-controller";
/// The annotation with the time a Job was scheduled for (batchv1.CronJobScheduledTimestampAnnotation).
pub const SCHEDULED_TIMESTAMP_ANNOTATION: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
const NS: i128 = 1_000_000_000;
/// Upstream's nextScheduleDelta: requeue a little after the schedule time.
const NEXT_SCHEDULE_DELTA: i128 = 100_000_000;

fn spec_of(cj: &CronJob) -> k8s_openapi::api::batch::v1::CronJobSpec {
    cj.spec.clone()
}

fn active_of(cj: &CronJob) -> &[ObjectReference] {
    cj.status
        .as_ref()
        .and_then(|s| s.active.as_deref())
        .unwrap_or_default()
}

fn in_active_list(cj: &CronJob, uid: &str) -> bool {
    active_of(cj).iter().any(|r| r.uid.as_deref() == Some(uid))
}

fn delete_from_active_list(cj: &mut CronJob, uid: &str) {
    let status = cj.status.get_or_insert_with(Default::default);
    let kept: Vec<ObjectReference> = status
        .active
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.uid.as_deref() != Some(uid))
        .collect();
    // An empty list is left out, as upstream's omitempty field.
    status.active = (!kept.is_empty()).then_some(kept);
}

/// The finished condition (Complete or Failed, status True) of a Job, if any.
fn finished_condition(j: &Job) -> Option<&str> {
    j.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| c.type_.as_str())
}

fn job_succeeded(j: &Job) -> bool {
    j.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
        })
}

/// The schedule string the parser sees: with `TZ=<spec.timeZone>` prepended when the
/// zone is valid and the schedule has no TZ of its own (formatSchedule).
fn format_schedule(cj: &CronJob) -> String {
    let spec = spec_of(cj);
    if spec.schedule.contains("TZ") {
        return spec.schedule;
    }
    match &spec.time_zone {
        Some(tz) if load_location(tz).is_ok() => format!("TZ={tz} {}", spec.schedule),
        _ => spec.schedule,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Missed {
    None,
    Few,
    Many,
}

struct MostRecent {
    earliest: i128,
    most_recent: Option<i128>,
    missed: Missed,
    err: Option<String>,
}

/// Go's Duration.Round(time.Second) of a nanosecond span, in seconds.
fn round_secs(d: i128) -> i128 {
    if d >= 0 {
        (d + NS / 2) / NS
    } else {
        -((-d + NS / 2) / NS)
    }
}

/// The latest unmet schedule time up to `now` and how many were missed
/// (mostRecentScheduleTime).
fn most_recent_schedule_time(
    cj: &CronJob,
    now: i128,
    sched: &Schedule,
    include_deadline: bool,
) -> MostRecent {
    let mut earliest = cj
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(ZERO, |t| ns_of(t.0));
    if let Some(t) = cj
        .status
        .as_ref()
        .and_then(|s| s.last_schedule_time.as_ref())
    {
        earliest = ns_of(t.0);
    }
    if include_deadline {
        if let Some(sds) = spec_of(cj).starting_deadline_seconds {
            let deadline = now - i128::from(sds) * NS;
            if deadline > earliest {
                earliest = deadline;
            }
        }
    }
    let mut out = MostRecent {
        earliest,
        most_recent: None,
        missed: Missed::None,
        err: None,
    };
    let t1 = sched.next(earliest);
    let t2 = sched.next(t1);
    if now < t1 {
        return out;
    }
    if now < t2 {
        out.most_recent = Some(t1);
        return out;
    }
    let between = round_secs(t2 - t1);
    if between < 1 {
        out.err = Some("time difference between two schedules is less than 1 second".into());
        return out;
    }
    // Go's time.Sub saturates at the largest Duration.
    let elapsed = (now - t1).min(i128::from(i64::MAX)) / NS;
    let missed = elapsed / between + 1;
    let potential_earliest = t1 + (missed - 2) * between * NS;
    let mut most_recent = None;
    let mut t = sched.next(potential_earliest);
    while t <= now {
        most_recent = Some(t);
        let n = sched.next(t);
        if n <= t {
            // No progress (nothing matches any more): stop rather than spin.
            break;
        }
        t = n;
    }
    out.missed = if missed > 100 {
        Missed::Many
    } else if missed > 0 {
        Missed::Few
    } else {
        Missed::None
    };
    out.most_recent = most_recent.filter(|t| *t != ZERO);
    out
}

/// How long until the next schedule time after the most recent one (plus 100 ms), as
/// upstream's nextScheduleTimeDuration; zero when it is already due.
fn next_schedule_time_duration(cj: &CronJob, now: i128, sched: &Schedule) -> Duration {
    let m = most_recent_schedule_time(cj, now, sched, false);
    let base = match (m.err, m.most_recent) {
        (Some(_), _) => now,
        (None, Some(t)) => t,
        (None, None) if m.missed == Missed::None => m.earliest,
        (None, None) => now,
    };
    let d = sched.next(base) + NEXT_SCHEDULE_DELTA - now;
    Duration::from_nanos(u64::try_from(d.max(0)).unwrap_or(u64::MAX))
}

/// RFC 3339 as Go prints it: `Z` for a zero offset, `±hh:mm` otherwise.
fn rfc3339_in(t: i128, tz: &jiff::tz::TimeZone) -> String {
    let ts = ts_of(t);
    let z = ts.to_zoned(tz.clone());
    let off = z.offset().seconds();
    let base = z.strftime("%Y-%m-%dT%H:%M:%S").to_string();
    if off == 0 {
        format!("{base}Z")
    } else {
        let sign = if off < 0 { '-' } else { '+' };
        let a = off.abs();
        format!("{base}{sign}{:02}:{:02}", a / 3600, a % 3600 / 60)
    }
}

/// The Job's name for a schedule time: `<cronjob>-<minutes since the epoch>`.
fn job_name(cj: &CronJob, scheduled: i128) -> String {
    format!(
        "{}-{}",
        cj.metadata.name.as_deref().unwrap_or_default(),
        scheduled.div_euclid(NS) / 60
    )
}

/// The Job for a schedule time, from the CronJob's template (getJobFromTemplate2).
fn job_from_template(cj: &CronJob, scheduled: i128) -> Result<Job, String> {
    let spec = spec_of(cj);
    let tmeta = spec.job_template.metadata.clone().unwrap_or_default();
    let tz = load_location(spec.time_zone.as_deref().unwrap_or_default())?;
    let labels = tmeta.labels.filter(|l| !l.is_empty());
    let mut annotations = tmeta.annotations.unwrap_or_default();
    annotations.insert(
        SCHEDULED_TIMESTAMP_ANNOTATION.into(),
        rfc3339_in(scheduled, &tz),
    );
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(job_name(cj, scheduled)),
            namespace: cj.metadata.namespace.clone(),
            labels,
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref(cj)]),
            ..Default::default()
        },
        spec: spec.job_template.spec.clone(),
        status: None,
    })
}

/// The object reference of a Job kept in `status.active` (reference.GetReference).
fn job_ref(j: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: j.metadata.name.clone(),
        namespace: j.metadata.namespace.clone(),
        uid: j.metadata.uid.clone(),
        resource_version: j.metadata.resource_version.clone(),
        field_path: None,
    }
}

/// Jobs sorted oldest start first, those without a start time last, then by name.
fn sort_by_start_time(jobs: &mut [Arc<Job>]) {
    let start = |j: &Job| {
        j.status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0)
    };
    jobs.sort_by(|a, b| match (start(a), start(b)) {
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (x, y) if x == y => a.metadata.name.cmp(&b.metadata.name),
        (x, y) => x.cmp(&y),
    });
}

/// The pending delayed requeue of each CronJob. Like client-go's delaying queue, only the
/// earliest is kept: a later one is dropped, since the earlier sync computes it again.
#[derive(Default)]
struct Wakeups(Mutex<HashMap<String, Instant>>);

impl Wakeups {
    fn add_after(&self, q: &Arc<WorkQueue<String>>, key: String, d: Duration) {
        let now = Instant::now();
        let at = now + d;
        {
            let mut m = self.0.lock();
            if m.get(&key).is_some_and(|p| *p > now && *p <= at) {
                return;
            }
            m.insert(key.clone(), at);
        }
        q.add_after(key, d);
    }

    fn forget(&self, key: &str) {
        self.0.lock().remove(key);
    }
}

struct Ctl {
    client: ClientSource,
    cronjobs: Arc<Informer<CronJob>>,
    jobs: Arc<Informer<Job>>,
}

/// The key of the CronJob a Job's controller reference points to, if it is in the cache
/// with that uid (resolveControllerRef).
fn resolve(cronjobs: &Informer<CronJob>, job: &Job) -> Option<String> {
    let r = controller_of(&job.metadata)?;
    if r.kind != "CronJob" {
        return None;
    }
    let key = format!(
        "{}/{}",
        job.metadata.namespace.as_deref().unwrap_or_default(),
        r.name
    );
    let cj = cronjobs.get(&key)?;
    (cj.metadata.uid.as_deref() == Some(r.uid.as_str())).then_some(key)
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("cronjob");
    let cronjobs = factory.informer::<CronJob>();
    let jobs = factory.informer::<Job>();
    // The handlers record one event; the client exists once the controller has started.
    let event_client: Arc<OnceLock<ClientSource>> = Arc::default();
    let wakeups: Arc<Wakeups> = Arc::default();

    let (q, ec, w) = (queue.clone(), event_client.clone(), wakeups.clone());
    cronjobs.add_handler(move |c| match c {
        Change::Added(cj) => q.add(key_of(cj)),
        Change::Deleted(cj) => {
            w.forget(&key_of(cj));
            q.add(key_of(cj));
        }
        Change::Updated { old, new } => {
            let (os, ns) = (spec_of(old), spec_of(new));
            if os.schedule == ns.schedule && os.time_zone == ns.time_zone {
                q.add(key_of(new));
                return;
            }
            // The schedule changed: requeue for its next time.
            match parse_standard(&format_schedule(new)) {
                Ok(sched) => {
                    let d = next_schedule_time_duration(new, ns_of(Timestamp::now()), &sched);
                    w.add_after(&q, key_of(new), d);
                }
                Err(_) => {
                    if let Some(client) = ec.get().cloned() {
                        let cj = new.clone();
                        tokio::spawn(async move {
                            let msg = format!(
                                "unparseable schedule for cronjob: {}",
                                spec_of(&cj).schedule
                            );
                            record_event(
                                &client,
                                COMPONENT,
                                &cj,
                                "Warning",
                                "UnParseableCronJobSchedule",
                                msg,
                            )
                            .await;
                        });
                    }
                }
            }
        }
    });
    let (q, cjs) = (queue.clone(), cronjobs.clone());
    jobs.add_handler(move |c| match c {
        Change::Added(j) | Change::Deleted(j) => {
            if let Some(k) = resolve(&cjs, j) {
                q.add(k);
            }
        }
        Change::Updated { old, new } => {
            if old.metadata.resource_version == new.metadata.resource_version {
                return;
            }
            if controller_of(&old.metadata) != controller_of(&new.metadata) {
                if let Some(k) = resolve(&cjs, old) {
                    q.add(k);
                }
            }
            if let Some(k) = resolve(&cjs, new) {
                q.add(k);
            }
        }
    });

    tokio::spawn(async move {
        tracing::info!("Starting cronjob controller v2");
        let Some(client) = client_for(&clients, COMPONENT, &mut stop).await else {
            return;
        };
        let _ = event_client.set(client.clone());
        let ctl = Arc::new(Ctl {
            client,
            cronjobs,
            jobs,
        });
        let synced = async {
            ctl.cronjobs.wait_synced().await;
            ctl.jobs.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let (c, q) = (ctl.clone(), queue.clone());
        let tasks = run_workers("cronjob", queue, 5, stop, move |key| {
            let (c, q, w) = (c.clone(), q.clone(), wakeups.clone());
            async move {
                // Success (failures forgotten), then a wake-up at the next schedule time.
                if let Some(d) = c.sync(&key).await? {
                    w.add_after(&q, key, d);
                }
                Ok(())
            }
        });
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down cronjob controller v2");
    })
}

/// What one pass of syncCronJob decided.
struct Outcome {
    requeue: Option<Duration>,
    update: bool,
    err: Option<SyncError>,
}

impl Ctl {
    async fn event(&self, cj: &CronJob, type_: &str, reason: &str, msg: String) {
        record_event(&self.client, COMPONENT, cj, type_, reason, msg).await;
    }

    fn jobs_api(&self, ns: &str) -> Api<Job> {
        Api::namespaced(self.client.get(), ns)
    }

    /// Returns when to look again (the next schedule time), if at all.
    async fn sync(&self, key: &str) -> Result<Option<Duration>, SyncError> {
        let Some(cached) = self.cronjobs.get(key) else {
            return Ok(None);
        };
        let uid = cached.metadata.uid.clone().unwrap_or_default();
        let jobs: Vec<Arc<Job>> = self
            .jobs
            .list()
            .into_iter()
            .filter(|j| controller_of(&j.metadata).is_some_and(|r| r.uid == uid))
            .collect();
        let mut cj = (*cached).clone();
        let cleaned = self.cleanup_finished_jobs(&mut cj, &jobs).await;
        let out = self.sync_cronjob(&mut cj, &jobs).await;
        if let Some(SyncError::Failed(e)) = &out.err {
            tracing::debug!(cronjob = key, error = %e, "Error reconciling cronjob");
        }
        if cleaned || out.update {
            let api: Api<CronJob> = Api::namespaced(
                self.client.get(),
                cj.metadata.namespace.as_deref().unwrap_or_default(),
            );
            let name = cj.metadata.name.clone().unwrap_or_default();
            api.replace_status(&name, &PostParams::default(), &cj)
                .await?;
        }
        match (out.requeue, out.err) {
            (Some(d), _) => Ok(Some(d)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
        }
    }

    /// Deletes the oldest finished Jobs beyond the history limits (cleanupFinishedJobs).
    async fn cleanup_finished_jobs(&self, cj: &mut CronJob, jobs: &[Arc<Job>]) -> bool {
        let spec = spec_of(cj);
        if spec.failed_jobs_history_limit.is_none() && spec.successful_jobs_history_limit.is_none()
        {
            return false;
        }
        let mut succeeded = Vec::new();
        let mut failed = Vec::new();
        for j in jobs {
            match finished_condition(j) {
                Some("Complete") => succeeded.push(j.clone()),
                Some("Failed") => failed.push(j.clone()),
                _ => {}
            }
        }
        let mut update = false;
        for (limit, mut list) in [
            (spec.successful_jobs_history_limit, succeeded),
            (spec.failed_jobs_history_limit, failed),
        ] {
            let Some(limit) = limit else { continue };
            let excess = list.len() as i64 - i64::from(limit);
            if excess <= 0 {
                continue;
            }
            sort_by_start_time(&mut list);
            for j in list.iter().take(excess as usize) {
                if self.delete_job(cj, j).await {
                    update = true;
                }
            }
        }
        update
    }

    /// Deletes a Job (background propagation) and drops it from the active list.
    async fn delete_job(&self, cj: &mut CronJob, job: &Job) -> bool {
        let name = job.metadata.name.clone().unwrap_or_default();
        let api = self.jobs_api(job.metadata.namespace.as_deref().unwrap_or_default());
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        if let Err(e) = api.delete(&name, &dp).await {
            self.event(
                cj,
                "Warning",
                "FailedDelete",
                format!("Deleted job: {}", message(&e)),
            )
            .await;
            return false;
        }
        delete_from_active_list(cj, job.metadata.uid.as_deref().unwrap_or_default());
        self.event(
            cj,
            "Normal",
            "SuccessfulDelete",
            format!("Deleted job {name}"),
        )
        .await;
        true
    }

    /// Reconciles the CronJob with its Jobs and starts the one due, if any (syncCronJob).
    async fn sync_cronjob(&self, cj: &mut CronJob, jobs: &[Arc<Job>]) -> Outcome {
        let now = ns_of(Timestamp::now());
        let mut update = false;
        let done = |requeue: Option<Duration>, update: bool, err: Option<SyncError>| Outcome {
            requeue,
            update,
            err,
        };
        let ns = cj.metadata.namespace.clone().unwrap_or_default();
        let name = cj.metadata.name.clone().unwrap_or_default();

        for j in jobs {
            let juid = j.metadata.uid.clone().unwrap_or_default();
            let jname = j.metadata.name.clone().unwrap_or_default();
            let found = in_active_list(cj, &juid);
            let finished = finished_condition(j);
            if !found && finished.is_none() {
                // Maybe the cache's CronJob is behind: ask the API server.
                let api: Api<CronJob> = Api::namespaced(self.client.get(), &ns);
                let fresh = match api.get(&name).await {
                    Ok(c) => c,
                    Err(e) => return done(None, update, Some(e.into())),
                };
                if in_active_list(&fresh, &juid) {
                    *cj = fresh;
                    continue;
                }
                self.event(
                    cj,
                    "Warning",
                    "UnexpectedJob",
                    format!("Saw a job that the controller did not create or forgot: {jname}"),
                )
                .await;
            } else if let Some(cond) = finished {
                if found {
                    delete_from_active_list(cj, &juid);
                    self.event(
                        cj,
                        "Normal",
                        "SawCompletedJob",
                        format!("Saw completed job: {jname}, condition: {cond}"),
                    )
                    .await;
                    update = true;
                }
                if job_succeeded(j) {
                    let completion = j.status.as_ref().and_then(|s| s.completion_time.clone());
                    let status = cj.status.get_or_insert_with(Default::default);
                    match (&status.last_successful_time, &completion) {
                        (None, _) => {
                            status.last_successful_time = completion;
                            update = true;
                        }
                        (Some(last), Some(c)) if c.0 > last.0 => {
                            status.last_successful_time = completion;
                            update = true;
                        }
                        _ => {}
                    }
                }
            }
        }

        // Active Jobs that no longer exist are dropped (asking the API server first: the
        // cache may just be behind).
        let children: Vec<String> = jobs.iter().filter_map(|j| j.metadata.uid.clone()).collect();
        for r in active_of(cj).to_vec() {
            let ruid = r.uid.clone().unwrap_or_default();
            if children.contains(&ruid) {
                continue;
            }
            let rname = r.name.clone().unwrap_or_default();
            let api = self.jobs_api(r.namespace.as_deref().unwrap_or_default());
            match api.get(&rname).await {
                Err(e) if is_not_found(&e) => {
                    self.event(
                        cj,
                        "Normal",
                        "MissingJob",
                        format!("Active job went missing: {rname}"),
                    )
                    .await;
                    delete_from_active_list(cj, &ruid);
                    update = true;
                }
                Err(e) => return done(None, update, Some(e.into())),
                Ok(_) => {}
            }
        }

        if cj.metadata.deletion_timestamp.is_some() {
            return done(None, update, None);
        }
        let spec = spec_of(cj);
        if let Some(tz) = &spec.time_zone {
            if let Err(e) = load_location(tz) {
                self.event(
                    cj,
                    "Warning",
                    "UnknownTimeZone",
                    format!("invalid timeZone: {}: {e}", go_quote(tz)),
                )
                .await;
                return done(None, update, None);
            }
        }
        if spec.suspend == Some(true) {
            return done(None, update, None);
        }
        if spec.schedule.contains("TZ") {
            self.event(
                cj,
                "Warning",
                "UnsupportedSchedule",
                format!(
                    "CRON_TZ or TZ used in schedule {} is not officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more details",
                    go_quote(&spec.schedule)
                ),
            )
            .await;
        }
        let sched = match parse_standard(&format_schedule(cj)) {
            Ok(s) => s,
            Err(e) => {
                self.event(
                    cj,
                    "Warning",
                    "UnparseableSchedule",
                    format!("unparseable schedule: {} : {e}", go_quote(&spec.schedule)),
                )
                .await;
                return done(None, update, None);
            }
        };

        // nextScheduleTime: the most recent unmet time, if it is due.
        let m = most_recent_schedule_time(cj, now, &sched, true);
        let scheduled = match m.most_recent.filter(|t| *t <= now) {
            None => {
                if let Some(e) = m.err {
                    self.event(
                        cj,
                        "Warning",
                        "InvalidSchedule",
                        format!("invalid schedule: {} : {e}", spec.schedule),
                    )
                    .await;
                    return done(None, update, None);
                }
                let t = next_schedule_time_duration(cj, now, &sched);
                return done(Some(t), update, None);
            }
            Some(t) => t,
        };
        if m.missed == Missed::Many {
            self.event(
                cj,
                "Warning",
                "TooManyMissedTimes",
                "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew".into(),
            )
            .await;
        }

        let too_late = spec
            .starting_deadline_seconds
            .is_some_and(|sds| scheduled + i128::from(sds) * NS < now);
        if too_late {
            let when = ts_of(scheduled).strftime("%a, %d %b %Y %H:%M:%S +0000");
            self.event(
                cj,
                "Warning",
                "MissSchedule",
                format!("Missed scheduled time to start a job: {when}"),
            )
            .await;
            let t = next_schedule_time_duration(cj, now, &sched);
            return done(Some(t), update, None);
        }
        let jname = job_name(cj, scheduled);
        let last_schedule = cj
            .status
            .as_ref()
            .and_then(|s| s.last_schedule_time.as_ref())
            .map(|t| ns_of(t.0));
        let processed = active_of(cj).iter().any(|r| {
            r.name.as_deref() == Some(jname.as_str()) && r.namespace.as_deref() == Some(ns.as_str())
        }) || last_schedule == Some(scheduled);
        if processed {
            let t = next_schedule_time_duration(cj, now, &sched);
            return done(Some(t), update, None);
        }
        let policy = spec.concurrency_policy.as_deref().unwrap_or("Allow");
        if policy == "Forbid" && !active_of(cj).is_empty() {
            self.event(
                cj,
                "Normal",
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
            )
            .await;
            let t = next_schedule_time_duration(cj, now, &sched);
            return done(Some(t), update, None);
        }
        if policy == "Replace" {
            for r in active_of(cj).to_vec() {
                let rns = r.namespace.clone().unwrap_or_default();
                let rname = r.name.clone().unwrap_or_default();
                let job = match self.jobs_api(&rns).get(&rname).await {
                    Ok(j) => j,
                    Err(e) => {
                        self.event(
                            cj,
                            "Warning",
                            "FailedGet",
                            format!("Get job: {}", message(&e)),
                        )
                        .await;
                        return done(None, update, Some(e.into()));
                    }
                };
                if !self.delete_job(cj, &job).await {
                    return done(
                        None,
                        update,
                        Some(SyncError::Failed(format!(
                            "could not replace job {rns}/{rname}"
                        ))),
                    );
                }
                update = true;
            }
        }

        let req = match job_from_template(cj, scheduled) {
            Ok(j) => j,
            Err(e) => return done(None, update, Some(SyncError::Failed(e))),
        };
        let api = self.jobs_api(&ns);
        let created = match api.create(&PostParams::default(), &req).await {
            Ok(j) => {
                self.event(
                    cj,
                    "Normal",
                    "SuccessfulCreate",
                    format!(
                        "Created job {}",
                        j.metadata.name.as_deref().unwrap_or_default()
                    ),
                )
                .await;
                j
            }
            Err(e) if namespace_terminating(&e) => return done(None, update, Some(e.into())),
            Err(e) if is_already_exists(&e) => {
                // Created before but not recorded (or by someone else).
                let job = match api.get(&jname).await {
                    Ok(j) => j,
                    Err(e) => return done(None, update, Some(e.into())),
                };
                let ours = controller_of(&job.metadata)
                    .is_some_and(|r| Some(r.uid.as_str()) == cj.metadata.uid.as_deref());
                if !ours || in_active_list(cj, job.metadata.uid.as_deref().unwrap_or_default()) {
                    return done(None, update, None);
                }
                tracing::info!(job = %jname, "Job already exists");
                job
            }
            Err(e) => {
                self.event(
                    cj,
                    "Warning",
                    "FailedCreate",
                    format!("Error creating job: {}", message(&e)),
                )
                .await;
                return done(None, update, Some(e.into()));
            }
        };
        let status = cj.status.get_or_insert_with(Default::default);
        status
            .active
            .get_or_insert_with(Vec::new)
            .push(job_ref(&created));
        status.last_schedule_time = Some(Time(ts_of(scheduled)));
        let t = next_schedule_time_duration(cj, now, &sched);
        done(Some(t), true, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{CronJobSpec, CronJobStatus};

    fn at(s: &str) -> i128 {
        ns_of(s.parse::<Timestamp>().expect("timestamp"))
    }

    fn cronjob(schedule: &str, created: &str, last: Option<&str>) -> CronJob {
        CronJob {
            metadata: ObjectMeta {
                name: Some("nightly".into()),
                namespace: Some("default".into()),
                creation_timestamp: Some(Time(created.parse().expect("timestamp"))),
                ..Default::default()
            },
            spec: CronJobSpec {
                schedule: schedule.into(),
                ..Default::default()
            },
            status: Some(CronJobStatus {
                last_schedule_time: last.map(|l| Time(l.parse().expect("timestamp"))),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn most_recent_and_missed_times() {
        let sched = parse_standard("TZ=UTC */1 * * * *").expect("valid");
        let cj = cronjob("*/1 * * * *", "2026-03-01T10:00:30Z", None);
        // Before the first time: nothing due, next in 29.6 s (+100 ms).
        let now = at("2026-03-01T10:00:30.5Z");
        let m = most_recent_schedule_time(&cj, now, &sched, true);
        assert_eq!(m.most_recent, None);
        assert_eq!(
            next_schedule_time_duration(&cj, now, &sched),
            Duration::from_millis(29_600)
        );
        // One due.
        let now = at("2026-03-01T10:01:10Z");
        let m = most_recent_schedule_time(&cj, now, &sched, true);
        assert_eq!(m.most_recent, Some(at("2026-03-01T10:01:00Z")));
        assert_eq!(m.missed, Missed::None);
        // Several missed: the latest, "few".
        let now = at("2026-03-01T10:05:10Z");
        let m = most_recent_schedule_time(&cj, now, &sched, true);
        assert_eq!(m.most_recent, Some(at("2026-03-01T10:05:00Z")));
        assert_eq!(m.missed, Missed::Few);
        // More than 100: "many".
        let now = at("2026-03-01T13:00:10Z");
        let m = most_recent_schedule_time(&cj, now, &sched, true);
        assert_eq!(m.most_recent, Some(at("2026-03-01T13:00:00Z")));
        assert_eq!(m.missed, Missed::Many);
        // A starting deadline moves the earliest time up: 100 missed, but only the
        // last one within the deadline counts.
        let mut cj2 = cj.clone();
        cj2.spec.starting_deadline_seconds = Some(30);
        let m = most_recent_schedule_time(&cj2, now, &sched, true);
        assert_eq!(m.most_recent, Some(at("2026-03-01T13:00:00Z")));
        assert_eq!(m.missed, Missed::None);
        // lastScheduleTime takes over from creation.
        let cj3 = cronjob(
            "*/1 * * * *",
            "2026-03-01T10:00:30Z",
            Some("2026-03-01T13:00:00Z"),
        );
        let m = most_recent_schedule_time(&cj3, now, &sched, true);
        assert_eq!(m.most_recent, None);
        assert_eq!(
            next_schedule_time_duration(&cj3, now, &sched),
            Duration::from_millis(50_100)
        );
        // A schedule that never fires.
        let never = parse_standard("TZ=UTC 0 0 30 2 *").expect("valid");
        let m = most_recent_schedule_time(&cj, now, &never, true);
        assert_eq!(
            m.err.as_deref(),
            Some("time difference between two schedules is less than 1 second")
        );
    }

    #[tokio::test]
    async fn wakeups_keep_only_the_earliest() {
        let q = WorkQueue::<String>::new("t");
        let w = Wakeups::default();
        w.add_after(&q, "ns/a".into(), Duration::from_millis(100));
        let first = w.0.lock()["ns/a"];
        // A later one is dropped: the earlier sync computes it again.
        w.add_after(&q, "ns/a".into(), Duration::from_secs(3600));
        assert_eq!(w.0.lock()["ns/a"], first);
        // An earlier one replaces it.
        w.add_after(&q, "ns/a".into(), Duration::from_millis(10));
        assert!(w.0.lock()["ns/a"] < first);
        let got = tokio::time::timeout(Duration::from_secs(2), q.get()).await;
        assert_eq!(got.ok().flatten().as_deref(), Some("ns/a"));
    }

    #[test]
    fn jobs_from_the_template() {
        let mut cj = cronjob("*/1 * * * *", "2026-03-01T10:00:30Z", None);
        cj.metadata.uid = Some("u1".into());
        let t = at("2026-03-01T10:05:00Z");
        let j = job_from_template(&cj, t).expect("job");
        assert_eq!(j.metadata.name.as_deref(), Some("nightly-29539325"));
        assert_eq!(
            j.metadata.annotations.as_ref().expect("annotations")[SCHEDULED_TIMESTAMP_ANNOTATION],
            "2026-03-01T10:05:00Z"
        );
        let r = &j.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (r.kind.as_str(), r.api_version.as_str(), r.uid.as_str()),
            ("CronJob", "batch/v1", "u1")
        );
        assert_eq!(r.controller, Some(true));
        cj.spec.time_zone = Some("Asia/Kolkata".into());
        let j = job_from_template(&cj, t).expect("job");
        assert_eq!(
            j.metadata.annotations.as_ref().expect("annotations")[SCHEDULED_TIMESTAMP_ANNOTATION],
            "2026-03-01T15:35:00+05:30"
        );
        assert_eq!(format_schedule(&cj), "TZ=Asia/Kolkata */1 * * * *");
        cj.spec.time_zone = Some("Nowhere/Special".into());
        assert_eq!(format_schedule(&cj), "*/1 * * * *");
    }
}
