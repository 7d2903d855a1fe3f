//! job-controller: runs a Job's pods to completion (upstream's pkg/controller/job).
//!
//! Pods are made from the template with generateName `<job>-` (Indexed jobs:
//! `<job>-<index>-`, the completion index as annotation, label, hostname and
//! `JOB_COMPLETION_INDEX`), a controller ownerReference and the
//! `batch.kubernetes.io/job-tracking` finalizer. A finished pod is first written to
//! `status.uncountedTerminatedPods`, then its finalizer is removed, then it is counted in
//! `succeeded`/`failed` (so no pod is counted twice or lost across restarts). The job
//! finishes through the interim `SuccessCriteriaMet`/`FailureTarget` conditions, then
//! `Complete`/`Failed` once no pod is uncounted or terminating. Failed pods are replaced
//! after an exponential backoff (10 s doubling, capped at 10 min); backoffLimit,
//! backoffLimitPerIndex, activeDeadlineSeconds, podFailurePolicy, successPolicy,
//! suspend and podReplacementPolicy behave as upstream's.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{
    Job, JobCondition, JobStatus, PodFailurePolicy, SuccessPolicy, UncountedTerminatedPods,
};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::replicaset::{
    controller_of, controller_ref, pod_ready, record_event, selector_matches, Expectations,
};
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_not_found, message, namespace_terminating};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers, run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::{RateLimiter, WorkQueue};

/// The finalizer that keeps a pod until the controller has counted it.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// The annotation and label with an Indexed job's pod's completion index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// How many failures of its index a pod's predecessors had (backoffLimitPerIndex).
pub const INDEX_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";
/// How many failures of its index were ignored by the podFailurePolicy.
pub const INDEX_IGNORED_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-ignored-failure-count";
/// `spec.managedBy` of jobs this controller handles.
const CONTROLLER_NAME: &str = "kubernetes.io/job-controller";
const COMPONENT: &str = "job-controller";
const COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";

/// syncJobBatchPeriod: pod events are batched for this long.
const SYNC_BATCH: Duration = Duration::from_secs(1);
/// DefaultJobPodFailureBackOff / MaxJobPodFailureBackOff.
const POD_FAILURE_BACKOFF: Duration = Duration::from_secs(10);
const MAX_POD_FAILURE_BACKOFF: Duration = Duration::from_secs(600);
/// MaxUncountedPods and MaxPodCreateDeletePerSync.
const MAX_UNCOUNTED: usize = 500;
const MAX_CREATE_DELETE: i32 = 500;
/// names.MaxGeneratedNameLength.
const MAX_GENERATED_NAME: usize = 58;

// ---------------------------------------------------------------------------------------
// Index intervals ("0-2,4").

/// Sorted, non-overlapping, non-adjacent index intervals (upstream's orderedIntervals).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Intervals(pub Vec<(i64, i64)>);

impl Intervals {
    /// Parses "0-2,4" keeping indexes below `completions` (corrupt parts are skipped).
    pub fn parse(s: &str, completions: i64) -> Intervals {
        let mut out: Vec<(i64, i64)> = Vec::new();
        if s.is_empty() {
            return Intervals(out);
        }
        for part in s.split(',') {
            let mut limits = part.split('-');
            let Some(Ok(first)) = limits.next().map(str::parse::<i64>) else {
                continue;
            };
            if first >= completions {
                break;
            }
            let last = match limits.next() {
                Some(l) => match l.parse::<i64>() {
                    Ok(l) => l.min(completions - 1),
                    Err(_) => continue,
                },
                None => first,
            };
            match out.last_mut() {
                Some(prev) if prev.1 == first - 1 => prev.1 = last,
                _ => out.push((first, last)),
            }
        }
        Intervals(out)
    }

    /// These intervals with the sorted indexes `new` added.
    pub fn with_indexes(&self, new: &[i64]) -> Intervals {
        self.merge(&Intervals(new.iter().map(|i| (*i, *i)).collect()))
    }

    /// The union of two interval lists.
    pub fn merge(&self, other: &Intervals) -> Intervals {
        let mut all: Vec<(i64, i64)> = self.0.iter().chain(other.0.iter()).copied().collect();
        all.sort();
        let mut out: Vec<(i64, i64)> = Vec::new();
        for iv in all {
            match out.last_mut() {
                Some(last) if iv.0 <= last.1 + 1 => last.1 = last.1.max(iv.1),
                _ => out.push(iv),
            }
        }
        Intervals(out)
    }

    /// How many indexes.
    pub fn total(&self) -> i64 {
        self.0.iter().map(|(a, b)| b - a + 1).sum()
    }

    /// Whether `ix` is in.
    pub fn has(&self, ix: i64) -> bool {
        self.0.iter().any(|(a, b)| *a <= ix && ix <= *b)
    }
}

impl std::fmt::Display for Intervals {
    /// Upstream's form: two adjacent indexes as "3,4", longer runs as "0-2".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (a, b)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{a}")?;
            if b > a {
                let sep = if *b == a + 1 { "," } else { "-" };
                write!(f, "{sep}{b}")?;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Pod facts.

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

fn pod_name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

fn has_tracking_finalizer(p: &Pod) -> bool {
    p.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == TRACKING_FINALIZER)
}

fn is_active(p: &Pod) -> bool {
    let ph = phase(p);
    ph != "Succeeded" && ph != "Failed" && p.metadata.deletion_timestamp.is_none()
}

/// Being deleted but not terminal yet (controller.IsPodTerminating).
fn is_terminating(p: &Pod) -> bool {
    let ph = phase(p);
    ph != "Succeeded" && ph != "Failed" && p.metadata.deletion_timestamp.is_some()
}

/// The completion index annotation, if valid.
fn completion_index(p: &Pod) -> Option<i64> {
    p.metadata
        .annotations
        .as_ref()?
        .get(COMPLETION_INDEX)?
        .parse::<i64>()
        .ok()
        .filter(|i| *i >= 0)
}

fn annotation_count(p: &Pod, key: &str) -> i32 {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|v| (0..=i64::from(i32::MAX)).contains(v))
        .map_or(0, |v| v as i32)
}

fn index_failure_count(p: &Pod) -> i32 {
    annotation_count(p, INDEX_FAILURE_COUNT)
}

fn index_absolute_failure_count(p: &Pod) -> i32 {
    annotation_count(p, INDEX_FAILURE_COUNT)
        .saturating_add(annotation_count(p, INDEX_IGNORED_FAILURE_COUNT))
}

fn millis(t: &Time) -> i64 {
    t.0.as_millisecond()
}

/// When the pod finished (upstream's getFinishedTime), in ms since the epoch.
fn finished_time(p: &Pod) -> i64 {
    if let Some(t) = finish_time_from_containers(p) {
        return t;
    }
    let ready_false = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .filter(|c| c.status == "False")
        .and_then(|c| c.last_transition_time.as_ref());
    if let Some(t) = ready_false {
        return millis(t);
    }
    if let Some(t) = &p.metadata.deletion_timestamp {
        return millis(t) - p.metadata.deletion_grace_period_seconds.unwrap_or(0) * 1000;
    }
    p.metadata.creation_timestamp.as_ref().map_or(0, millis)
}

fn finish_time_from_containers(p: &Pod) -> Option<i64> {
    let status = p.status.as_ref()?;
    let mut latest: Option<i64> = None;
    let mut consider = |cs: &k8s_openapi::api::core::v1::ContainerStatus| -> bool {
        match cs
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
        {
            Some(t) => {
                latest = Some(latest.map_or(millis(t), |l| l.max(millis(t))));
                true
            }
            None => false,
        }
    };
    for cs in status.container_statuses.iter().flatten() {
        if !consider(cs) {
            return None;
        }
    }
    // Sidecars (restartable init containers) count too.
    let sidecars: HashSet<&str> = p
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    for cs in status.init_container_statuses.iter().flatten() {
        if sidecars.contains(cs.name.as_str()) && !consider(cs) {
            return None;
        }
    }
    latest
}

// ---------------------------------------------------------------------------------------
// Job facts.

fn spec(job: &Job) -> k8s_openapi::api::batch::v1::JobSpec {
    job.spec.clone().unwrap_or_default()
}

fn is_indexed(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.completion_mode.as_deref()) == Some("Indexed")
}

fn completions(job: &Job) -> Option<i32> {
    job.spec.as_ref().and_then(|s| s.completions)
}

fn suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
}

fn backoff_limit_per_index(job: &Job) -> Option<i32> {
    job.spec.as_ref().and_then(|s| s.backoff_limit_per_index)
}

fn pod_failure_policy(job: &Job) -> Option<&PodFailurePolicy> {
    job.spec
        .as_ref()
        .and_then(|s| s.pod_failure_policy.as_ref())
}

/// podReplacementPolicy Failed: terminating pods are not replaced until they fail.
fn only_replace_failed(job: &Job) -> bool {
    job.spec
        .as_ref()
        .and_then(|s| s.pod_replacement_policy.as_deref())
        == Some("Failed")
}

fn condition<'a>(st: &'a St, type_: &str) -> Option<&'a JobCondition> {
    st.conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the job has a true Complete or Failed condition (util.IsJobFinished).
pub fn is_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

/// Counted as failed: phase Failed, or (unless only failed pods are replaced) deleted
/// before it succeeded.
fn is_pod_failed(p: &Pod, job: &Job) -> bool {
    if phase(p) == "Failed" {
        return true;
    }
    if only_replace_failed(job) {
        return false;
    }
    p.metadata.deletion_timestamp.is_some() && phase(p) != "Succeeded"
}

/// How the podFailurePolicy judges a failed pod: the FailJob message, whether the failure
/// counts against the backoff limits, and the action of the rule that matched.
fn match_pod_failure_policy(
    policy: Option<&PodFailurePolicy>,
    pod: &Pod,
) -> (Option<String>, bool, Option<String>) {
    let Some(policy) = policy else {
        return (None, true, None);
    };
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod_name(pod);
    let status = pod.status.clone().unwrap_or_default();
    for (index, rule) in policy.rules.iter().enumerate() {
        let matched: Option<String> = if let Some(req) = &rule.on_exit_codes {
            let find = |list: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
                list.iter().flatten().find_map(|cs| {
                    let t = cs.state.as_ref()?.terminated.as_ref()?;
                    if let Some(c) = &req.container_name {
                        if *c != cs.name {
                            return None;
                        }
                    }
                    if t.exit_code == 0 {
                        return None;
                    }
                    let ok = match req.operator.as_str() {
                        "In" => req.values.contains(&t.exit_code),
                        "NotIn" => !req.values.contains(&t.exit_code),
                        _ => false,
                    };
                    ok.then(|| (cs.name.clone(), t.exit_code))
                })
            };
            find(&status.container_statuses)
                .or_else(|| find(&status.init_container_statuses))
                .map(|(c, code)| {
                    format!(
                        "Container {c} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {index}",
                        rule.action
                    )
                })
        } else if let Some(patterns) = &rule.on_pod_conditions {
            status.conditions.iter().flatten().find_map(|c| {
                patterns
                    .iter()
                    .any(|p| {
                        p.type_ == c.type_ && p.status.as_deref().unwrap_or("True") == c.status
                    })
                    .then(|| {
                        format!(
                            "Pod {ns}/{name} has condition {} matching {} rule at index {index}",
                            c.type_, rule.action
                        )
                    })
            })
        } else {
            None
        };
        let Some(msg) = matched else { continue };
        match rule.action.as_str() {
            "Ignore" => return (None, false, Some(rule.action.clone())),
            "FailIndex" | "Count" => return (None, true, Some(rule.action.clone())),
            "FailJob" => return (Some(msg), true, Some(rule.action.clone())),
            _ => continue,
        }
    }
    (None, true, None)
}

/// The successPolicy rule the succeeded indexes satisfy: "Matched rules at index N".
fn match_success_policy(
    policy: Option<&SuccessPolicy>,
    completions: i64,
    succeeded: &Intervals,
) -> Option<String> {
    let policy = policy?;
    if succeeded.0.is_empty() {
        return None;
    }
    for (index, rule) in policy.rules.iter().enumerate() {
        let msg = format!("Matched rules at index {index}");
        if let Some(s) = &rule.succeeded_indexes {
            let required = Intervals::parse(s, completions);
            if required.0.is_empty() {
                continue;
            }
            let mut contains = 0;
            for (a, b) in &required.0 {
                for (c, d) in &succeeded.0 {
                    let overlap = (*b).min(*d) - (*a).max(*c) + 1;
                    if overlap > 0 {
                        contains += overlap;
                    }
                }
            }
            if contains == required.total()
                || rule
                    .succeeded_count
                    .is_some_and(|n| contains >= i64::from(n))
            {
                return Some(msg);
            }
        } else if let Some(n) = rule.succeeded_count {
            if succeeded.total() >= i64::from(n) {
                return Some(msg);
            }
        }
    }
    None
}

/// restartPolicy OnFailure: whether the running pods' restarts reach the backoff limit.
fn past_backoff_limit_on_failure(job: &Job, pods: &[Arc<Pod>]) -> bool {
    let sp = spec(job);
    if sp
        .template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        != Some("OnFailure")
    {
        return false;
    }
    let mut restarts: i64 = 0;
    for p in pods {
        if phase(p) == "Running" || phase(p) == "Pending" {
            if let Some(s) = &p.status {
                for cs in s
                    .init_container_statuses
                    .iter()
                    .flatten()
                    .chain(s.container_statuses.iter().flatten())
                {
                    restarts += i64::from(cs.restart_count);
                }
            }
        }
    }
    let limit = i64::from(sp.backoff_limit.unwrap_or(6));
    if limit == 0 {
        restarts > 0
    } else {
        restarts >= limit
    }
}

// ---------------------------------------------------------------------------------------
// Pod failure backoff.

/// Failures since the last success and when the last one happened (ms since the epoch).
#[derive(Clone, Debug, Default, PartialEq)]
struct BackoffRecord {
    failures: i32,
    last_failure: Option<i64>,
}

fn new_backoff_record(
    old: BackoffRecord,
    succeeded: &[Arc<Pod>],
    failed: &[Arc<Pod>],
) -> BackoffRecord {
    let mut s: Vec<i64> = succeeded.iter().map(|p| finished_time(p)).collect();
    let mut f: Vec<i64> = failed.iter().map(|p| finished_time(p)).collect();
    s.sort_unstable();
    f.sort_unstable();
    let mut b = old;
    match (s.last(), f.last()) {
        (None, None) => b,
        (None, Some(last)) => {
            b.failures += f.len() as i32;
            b.last_failure = Some(*last);
            b
        }
        (Some(last_success), _) => {
            b.failures = 0;
            b.last_failure = None;
            for t in f.iter().rev() {
                if *t <= *last_success {
                    break;
                }
                if b.last_failure.is_none() {
                    b.last_failure = Some(*t);
                }
                b.failures += 1;
            }
            b
        }
    }
}

/// How long pod creation still waits: 10 s doubling per failure, capped.
fn remaining_backoff(failures: i32, last_failure: Option<i64>, now: i64) -> Duration {
    let Some(last) = last_failure.filter(|_| failures > 0) else {
        return Duration::ZERO;
    };
    let mut d = POD_FAILURE_BACKOFF;
    for _ in 1..failures {
        d *= 2;
        if d >= MAX_POD_FAILURE_BACKOFF {
            d = MAX_POD_FAILURE_BACKOFF;
            break;
        }
    }
    let elapsed = Duration::from_millis((now - last).max(0) as u64);
    d.saturating_sub(elapsed)
}

fn remaining_backoff_per_index(last_failed: Option<&Arc<Pod>>, now: i64) -> Duration {
    match last_failed {
        None => Duration::ZERO,
        Some(p) => remaining_backoff(
            index_absolute_failure_count(p) + 1,
            Some(finished_time(p)),
            now,
        ),
    }
}

// ---------------------------------------------------------------------------------------
// Status being computed.

/// The job status as the sync works on it (upstream's batch.JobStatus).
#[derive(Clone, Debug, Default)]
struct St {
    conditions: Vec<JobCondition>,
    start_time: Option<Time>,
    completion_time: Option<Time>,
    active: i32,
    succeeded: i32,
    failed: i32,
    terminating: Option<i32>,
    ready: Option<i32>,
    completed_indexes: String,
    failed_indexes: Option<String>,
    unc_succeeded: Vec<String>,
    unc_failed: Vec<String>,
}

impl St {
    fn from(s: &JobStatus) -> St {
        let unc = s.uncounted_terminated_pods.clone().unwrap_or_default();
        St {
            conditions: s.conditions.clone().unwrap_or_default(),
            start_time: s.start_time.clone(),
            completion_time: s.completion_time.clone(),
            active: s.active.unwrap_or(0),
            succeeded: s.succeeded.unwrap_or(0),
            failed: s.failed.unwrap_or(0),
            terminating: s.terminating,
            ready: s.ready,
            completed_indexes: s.completed_indexes.clone().unwrap_or_default(),
            failed_indexes: s.failed_indexes.clone(),
            unc_succeeded: unc.succeeded.unwrap_or_default(),
            unc_failed: unc.failed.unwrap_or_default(),
        }
    }

    /// Upstream's JSON: zero counters and empty strings left out (omitempty), `ready`
    /// and `terminating` kept, `uncountedTerminatedPods` always present.
    fn to_status(&self) -> JobStatus {
        let nz = |n: i32| (n != 0).then_some(n);
        let nonempty = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        JobStatus {
            active: nz(self.active),
            completed_indexes: (!self.completed_indexes.is_empty())
                .then(|| self.completed_indexes.clone()),
            completion_time: self.completion_time.clone(),
            conditions: (!self.conditions.is_empty()).then(|| self.conditions.clone()),
            failed: nz(self.failed),
            failed_indexes: self.failed_indexes.clone(),
            ready: self.ready,
            start_time: self.start_time.clone(),
            succeeded: nz(self.succeeded),
            terminating: self.terminating,
            uncounted_terminated_pods: Some(UncountedTerminatedPods {
                failed: nonempty(&self.unc_failed),
                succeeded: nonempty(&self.unc_succeeded),
            }),
        }
    }
}

fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    msg: &str,
    now: Timestamp,
) -> JobCondition {
    JobCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(msg.into()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// Sets the condition of `type_` (ensureJobConditionStatus): replaced when its status,
/// reason or message differ; a missing condition is only added when not False.
fn ensure_condition(
    list: &mut Vec<JobCondition>,
    type_: &str,
    status: &str,
    reason: &str,
    msg: &str,
    now: Timestamp,
) -> bool {
    if let Some(c) = list.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status
            || c.reason.as_deref() != Some(reason)
            || c.message.as_deref() != Some(msg)
        {
            *c = new_condition(type_, status, reason, msg, now);
            return true;
        }
        return false;
    }
    if status != "False" {
        list.push(new_condition(type_, status, reason, msg, now));
        return true;
    }
    false
}

fn is_success_criteria_met(c: Option<&JobCondition>) -> bool {
    c.is_some_and(|c| c.type_ == "SuccessCriteriaMet" && c.status == "True")
}

// ---------------------------------------------------------------------------------------
// Orderings.

/// controller.ActivePods: the pods to delete first sort first (unassigned, pending, not
/// ready, ready for less time, more restarts, newer).
fn sort_for_deletion(pods: &mut [Arc<Pod>]) {
    let assigned = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
    };
    let phase_rank = |p: &Pod| match phase(p) {
        "Pending" | "" => 0,
        "Unknown" => 1,
        _ => 2,
    };
    let ready_time = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
            .and_then(|c| c.last_transition_time.as_ref())
            .map(millis)
    };
    let restarts = |p: &Pod| -> i32 {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map_or(0, |cs| {
                cs.iter().map(|c| c.restart_count).max().unwrap_or(0)
            })
    };
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(millis);
    pods.sort_by(|a, b| {
        assigned(a)
            .cmp(&assigned(b))
            .then(phase_rank(a).cmp(&phase_rank(b)))
            .then(pod_ready(a).cmp(&pod_ready(b)))
            .then_with(|| match (ready_time(a), ready_time(b)) {
                (Some(x), Some(y)) if pod_ready(a) && pod_ready(b) => y.cmp(&x),
                _ => std::cmp::Ordering::Equal,
            })
            .then(restarts(b).cmp(&restarts(a)))
            .then(created(b).cmp(&created(a)))
    });
}

fn index_key(p: &Pod) -> i64 {
    completion_index(p).unwrap_or(-1)
}

/// The active pods to delete: for Indexed jobs first those without a valid index or with
/// a duplicated one, then the first of the rest in deletion order.
fn active_pods_for_removal(job: &Job, pods: &[Arc<Pod>], rm_at_least: usize) -> Vec<Arc<Pod>> {
    let mut rm: Vec<Arc<Pod>> = Vec::new();
    let mut left: Vec<Arc<Pod>> = Vec::new();
    if is_indexed(job) {
        let comps = i64::from(completions(job).unwrap_or(0));
        let mut sorted = pods.to_vec();
        sorted.sort_by_key(|p| index_key(p));
        let mut groups: Vec<(i64, Vec<Arc<Pod>>)> = Vec::new();
        for p in sorted {
            let ix = index_key(&p);
            match groups.last_mut() {
                Some((g, v)) if *g == ix => v.push(p),
                _ => groups.push((ix, vec![p])),
            }
        }
        for (ix, mut group) in groups {
            if ix < 0 || ix >= comps {
                rm.extend(group);
            } else if group.len() == 1 {
                left.extend(group);
            } else {
                sort_for_deletion(&mut group);
                let keep = group.pop();
                rm.extend(group);
                left.extend(keep);
            }
        }
    } else {
        left = pods.to_vec();
    }
    if rm.len() < rm_at_least {
        sort_for_deletion(&mut left);
        let n = (rm_at_least - rm.len()).min(left.len());
        rm.extend(left.into_iter().take(n));
    }
    rm
}

/// The first `count` indexes that are neither succeeded, active, failed nor (with
/// podReplacementPolicy Failed) terminating.
fn first_pending_indexes(c: &SyncCtx, count: usize, comps: i64) -> Vec<i64> {
    if count == 0 {
        return Vec::new();
    }
    let active: BTreeSet<i64> = c
        .active_pods
        .iter()
        .filter_map(|p| completion_index(p))
        .collect();
    let mut non_pending = c
        .succeeded_idx
        .with_indexes(&active.into_iter().collect::<Vec<_>>());
    if only_replace_failed(&c.job) {
        let term: BTreeSet<i64> = c
            .pods
            .iter()
            .filter(|p| is_terminating(p))
            .filter_map(|p| completion_index(p))
            .collect();
        non_pending = non_pending.with_indexes(&term.into_iter().collect::<Vec<_>>());
    }
    if let Some(f) = &c.failed_idx {
        non_pending = non_pending.merge(f);
    }
    let mut out = Vec::new();
    let mut candidate = 0;
    for (first, last) in &non_pending.0 {
        while candidate < comps && out.len() < count && candidate < *first {
            out.push(candidate);
            candidate += 1;
        }
        if candidate < last + 1 {
            candidate = last + 1;
        }
    }
    while candidate < comps && out.len() < count {
        out.push(candidate);
        candidate += 1;
    }
    out
}

/// generateName of an Indexed job's pod: `<job>-<index>-`, the job name cut so it fits.
fn generate_name_with_index(job: &str, index: i64) -> String {
    let suffix = format!("-{index}-");
    let prefix = format!("{job}{suffix}");
    if prefix.len() > MAX_GENERATED_NAME {
        let keep = MAX_GENERATED_NAME.saturating_sub(suffix.len());
        let cut: String = job.chars().take(keep).collect();
        return format!("{cut}{suffix}");
    }
    prefix
}

// ---------------------------------------------------------------------------------------
// The controller.

struct SyncCtx {
    job: Job,
    st: St,
    pods: Vec<Arc<Pod>>,
    active_pods: Vec<Arc<Pod>>,
    finished: Option<JobCondition>,
    succeeded: i32,
    failed: i32,
    prev_succeeded_idx: Intervals,
    succeeded_idx: Intervals,
    failed_idx: Option<Intervals>,
    new_backoff: BackoffRecord,
    expected_rm: HashSet<String>,
    unc_succeeded0: HashSet<String>,
    unc_failed0: HashSet<String>,
    delayed_per_index: HashMap<i64, Arc<Pod>>,
    terminating: i32,
    ready: i32,
}

struct Ctl {
    client: ClientSource,
    jobs: Arc<Informer<Job>>,
    pods: Arc<Informer<Pod>>,
    queue: Arc<WorkQueue<String>>,
    orphans: Arc<WorkQueue<String>>,
    expectations: Arc<Expectations>,
    /// Pods whose tracking finalizer removal is not yet seen, per job key.
    finalizers: Arc<Mutex<HashMap<String, HashSet<String>>>>,
    backoff: Arc<Mutex<HashMap<String, BackoffRecord>>>,
    /// Jobs whose finishing status write is not yet seen in the cache (by uid).
    finished_uids: Arc<Mutex<HashSet<String>>>,
    /// The uid and resourceVersion of each job's last status write, so a sync waits
    /// until the cache has caught up with it (StaleControllerConsistencyJob).
    written: Mutex<HashMap<String, (String, u64)>>,
}

fn observe_finalizer_removed(f: &Mutex<HashMap<String, HashSet<String>>>, key: &str, uid: &str) {
    if let Some(s) = f.lock().get_mut(key) {
        s.remove(uid);
    }
}

/// The job key of the Job controlling the pod, if it is one in the cache with that uid.
fn resolve_owner(jobs: &Informer<Job>, pod: &Pod) -> Option<(String, Arc<Job>)> {
    let r = controller_of(&pod.metadata)?;
    if r.kind != "Job" {
        return None;
    }
    let key = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        r.name
    );
    let job = jobs.get(&key)?;
    (job.metadata.uid.as_deref() == Some(r.uid.as_str())).then_some((key, job))
}

/// The jobs in the pod's namespace whose selector matches it.
fn matching_jobs(jobs: &Informer<Job>, pod: &Pod) -> Vec<String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    jobs.list()
        .iter()
        .filter(|j| j.metadata.namespace.as_deref() == Some(ns))
        .filter(|j| {
            j.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|s| selector_matches(s, pod.metadata.labels.as_ref()))
        })
        .map(|j| key_of(j.as_ref()))
        .collect()
}

fn orphan_pod_key(p: &Pod) -> String {
    format!(
        "pod\t{}\t{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        pod_name(p)
    )
}

fn orphan_selector_key(job: &Job) -> String {
    let sel = job
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    format!(
        "sel\t{}\t{}",
        job.metadata.namespace.as_deref().unwrap_or_default(),
        serde_json::to_string(&sel).unwrap_or_default()
    )
}

struct Handlers {
    queue: Arc<WorkQueue<String>>,
    orphans: Arc<WorkQueue<String>>,
    jobs: Arc<Informer<Job>>,
    expectations: Arc<Expectations>,
    finalizers: Arc<Mutex<HashMap<String, HashSet<String>>>>,
    backoff: Arc<Mutex<HashMap<String, BackoffRecord>>>,
    finished_uids: Arc<Mutex<HashSet<String>>>,
}

impl Handlers {
    fn batched(&self, key: String) {
        self.queue.add_after(key, SYNC_BATCH);
    }

    fn delete_pod(&self, pod: &Pod, final_: bool) {
        let has_fin = has_tracking_finalizer(pod);
        if controller_of(&pod.metadata).is_none() {
            if has_fin {
                self.orphans.add(orphan_pod_key(pod));
            }
            return;
        }
        let Some((key, job)) = resolve_owner(&self.jobs, pod) else {
            if has_fin {
                self.orphans.add(orphan_pod_key(pod));
            }
            return;
        };
        if is_finished(&job) {
            if has_fin {
                self.orphans.add(orphan_pod_key(pod));
            }
            return;
        }
        self.expectations.lower(&key, 0, 1);
        if final_ || !has_fin {
            observe_finalizer_removed(&self.finalizers, &key, &uid(pod));
        }
        self.batched(key);
    }

    fn add_pod(&self, pod: &Pod) {
        if pod.metadata.deletion_timestamp.is_some() {
            self.delete_pod(pod, false);
            return;
        }
        if controller_of(&pod.metadata).is_some() {
            if let Some((key, _)) = resolve_owner(&self.jobs, pod) {
                self.expectations.lower(&key, 1, 0);
                self.batched(key);
            }
            return;
        }
        if has_tracking_finalizer(pod) {
            self.orphans.add(orphan_pod_key(pod));
        }
        for k in matching_jobs(&self.jobs, pod) {
            self.batched(k);
        }
    }

    fn update_pod(&self, old: &Pod, cur: &Pod) {
        if old.metadata.resource_version == cur.metadata.resource_version {
            return;
        }
        if cur.metadata.deletion_timestamp.is_some() {
            self.delete_pod(cur, false);
            return;
        }
        let removed = !has_tracking_finalizer(cur);
        let (cur_ref, old_ref) = (controller_of(&cur.metadata), controller_of(&old.metadata));
        let changed = cur_ref != old_ref;
        if changed && old_ref.is_some() {
            if let Some((key, _)) = resolve_owner(&self.jobs, old) {
                if removed {
                    observe_finalizer_removed(&self.finalizers, &key, &uid(cur));
                }
                self.batched(key);
            }
        }
        if cur_ref.is_some() {
            if let Some((key, _)) = resolve_owner(&self.jobs, cur) {
                if removed {
                    observe_finalizer_removed(&self.finalizers, &key, &uid(cur));
                }
                self.batched(key);
            }
            return;
        }
        if has_tracking_finalizer(cur) {
            self.orphans.add(orphan_pod_key(cur));
        }
        if old.metadata.labels != cur.metadata.labels || changed {
            for k in matching_jobs(&self.jobs, cur) {
                self.batched(k);
            }
        }
    }

    fn update_job(&self, old: &Job, cur: &Job) {
        let key = key_of(cur);
        if is_finished(cur) {
            self.orphans.add(orphan_selector_key(cur));
            return;
        }
        if cur.metadata.generation == old.metadata.generation {
            self.batched(key.clone());
        } else {
            self.queue.add(key.clone());
        }
        // A changed activeDeadlineSeconds: look again when it passes.
        let start = cur.status.as_ref().and_then(|s| s.start_time.as_ref());
        let cur_ads = cur.spec.as_ref().and_then(|s| s.active_deadline_seconds);
        let old_ads = old.spec.as_ref().and_then(|s| s.active_deadline_seconds);
        if let (Some(start), Some(ads)) = (start, cur_ads) {
            if old_ads != Some(ads) {
                let left = ads * 1000 - (Timestamp::now().as_millisecond() - millis(start));
                self.queue
                    .add_after(key, Duration::from_millis(left.max(0) as u64));
            }
        }
    }

    fn delete_job(&self, job: &Job) {
        let key = key_of(job);
        self.queue.add(key.clone());
        if let Some(u) = &job.metadata.uid {
            self.finished_uids.lock().remove(u);
        }
        self.orphans.add(orphan_selector_key(job));
        self.expectations.delete(&key);
        self.backoff.lock().remove(&key);
    }
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    // Upstream's queues: per-item exponential backoff from 1 s to 1 min, no bucket.
    let limiter = || {
        RateLimiter::new(
            Duration::from_secs(1),
            Duration::from_secs(60),
            1e9,
            u32::MAX,
        )
    };
    let queue = factory.queue_with_limiter::<String>("job", limiter());
    let orphans = factory.queue_with_limiter::<String>("job_orphan_pod", limiter());
    let jobs = factory.informer::<Job>();
    let pods = factory.informer::<Pod>();
    let h = Arc::new(Handlers {
        queue: queue.clone(),
        orphans: orphans.clone(),
        jobs: jobs.clone(),
        expectations: Arc::new(Expectations::default()),
        finalizers: Arc::default(),
        backoff: Arc::default(),
        finished_uids: Arc::default(),
    });

    let hj = h.clone();
    jobs.add_handler(move |c| match c {
        Change::Added(j) => hj.queue.add(key_of(j)),
        Change::Updated { old, new } => hj.update_job(old, new),
        Change::Deleted(j) => hj.delete_job(j),
    });
    let hp = h.clone();
    pods.add_handler(move |c| match c {
        Change::Added(p) => hp.add_pod(p),
        Change::Updated { old, new } => hp.update_pod(old, new),
        Change::Deleted(p) => hp.delete_pod(p, true),
    });

    tokio::spawn(async move {
        tracing::info!(controller = "job", "Starting job controller");
        let Some(client) = client_for(&clients, "job-controller", &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            jobs,
            pods,
            queue: queue.clone(),
            orphans: orphans.clone(),
            expectations: h.expectations.clone(),
            finalizers: h.finalizers.clone(),
            backoff: h.backoff.clone(),
            finished_uids: h.finished_uids.clone(),
            written: Mutex::default(),
        });
        let synced = async {
            ctl.jobs.wait_synced().await;
            ctl.pods.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let mut tasks = run_workers_of("job", queue, 5, stop.clone(), &ctl, |c, key| async move {
            c.sync(&key).await
        });
        let c = ctl.clone();
        tasks.extend(run_workers(
            "job_orphan_pod",
            orphans,
            5,
            stop,
            move |key| {
                let c = c.clone();
                async move { c.sync_orphan(&key).await }
            },
        ));
        futures::future::join_all(tasks).await;
        tracing::info!(controller = "job", "Shutting down job controller");
    })
}

/// The strategic merge patch that removes the tracking finalizer.
fn remove_finalizer_patch() -> serde_json::Value {
    json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}})
}

impl Ctl {
    fn pods_api(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.get(), ns)
    }

    async fn event(&self, job: &Job, type_: &str, reason: &str, msg: String) {
        record_event(&self.client, COMPONENT, job, type_, reason, msg).await;
    }

    // -- orphans ------------------------------------------------------------------------

    async fn sync_orphan(&self, key: &str) -> Result<(), SyncError> {
        let mut parts = key.splitn(3, '\t');
        let (kind, ns, value) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        match kind {
            "pod" => match self.pods.get(&format!("{ns}/{value}")) {
                Some(p) => self.handle_orphan(&p).await,
                None => Ok(()),
            },
            "sel" => {
                let sel: LabelSelector = serde_json::from_str(value).unwrap_or_default();
                let pods: Vec<Arc<Pod>> = self
                    .pods
                    .list()
                    .into_iter()
                    .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
                    .filter(|p| selector_matches(&sel, p.metadata.labels.as_ref()))
                    .collect();
                for p in pods {
                    if let Err(e) = self.handle_orphan(&p).await {
                        tracing::warn!(pod = %pod_name(&p), error = ?e, "syncing orphan pod failed");
                        self.orphans.add_rate_limited(orphan_pod_key(&p));
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    async fn handle_orphan(&self, pod: &Pod) -> Result<(), SyncError> {
        if let Some(r) = controller_of(&pod.metadata) {
            if r.kind != "Job" || r.api_version != "batch/v1" {
                return Ok(());
            }
            if let Some((_, job)) = resolve_owner(&self.jobs, pod) {
                if managed_elsewhere(&job) || !is_finished(&job) {
                    return Ok(());
                }
            }
        }
        if !has_tracking_finalizer(pod) {
            return Ok(());
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        match self
            .pods_api(ns)
            .patch(
                &pod_name(pod),
                &PatchParams::default(),
                &Patch::Strategic(remove_finalizer_patch()),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    // -- claiming -----------------------------------------------------------------------

    /// The job's pods: its own whose labels still match, plus adopted orphans (which get
    /// the ownerReference and the tracking finalizer); owned pods that stopped matching
    /// are released.
    async fn pods_for_job(&self, job: &Job) -> Result<Vec<Arc<Pod>>, SyncError> {
        let ns = job.metadata.namespace.clone().unwrap_or_default();
        let job_uid = job.metadata.uid.clone().unwrap_or_default();
        // No selector selects nothing (an empty one selects everything).
        let sel = spec(job).selector;
        let api = self.pods_api(&ns);
        let mut out = Vec::new();
        let mut can_adopt: Option<bool> = None;
        let deleting = job.metadata.deletion_timestamp.is_some();
        for p in self.pods.list() {
            if p.metadata.namespace.as_deref() != Some(ns.as_str()) {
                continue;
            }
            let matches = sel
                .as_ref()
                .is_some_and(|s| selector_matches(s, p.metadata.labels.as_ref()));
            match controller_of(&p.metadata) {
                Some(r) if r.uid == job_uid => {
                    if matches {
                        out.push(p);
                    } else if !deleting {
                        // Release: drop the ownerReference and the tracking finalizer
                        // (upstream's strategic merge patch, guarded by the pod's uid).
                        let patch = json!({"metadata": {
                            "ownerReferences": [{"$patch": "delete", "uid": job_uid}],
                            "uid": p.metadata.uid,
                            "$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER],
                        }});
                        match api
                            .patch(
                                &pod_name(&p),
                                &PatchParams::default(),
                                &Patch::Strategic(patch),
                            )
                            .await
                        {
                            Ok(_) => {}
                            Err(e) if is_not_found(&e) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                Some(_) => {}
                None => {
                    if !matches || deleting || p.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    if can_adopt.is_none() {
                        // A quorum read: never adopt for a job that is gone or going.
                        let japi: Api<Job> = Api::namespaced(self.client.get(), &ns);
                        let fresh = japi
                            .get(job.metadata.name.as_deref().unwrap_or_default())
                            .await?;
                        can_adopt = Some(
                            fresh.metadata.uid.as_deref() == Some(job_uid.as_str())
                                && fresh.metadata.deletion_timestamp.is_none(),
                        );
                    }
                    if can_adopt != Some(true) {
                        continue;
                    }
                    let mut refs = p.metadata.owner_references.clone().unwrap_or_default();
                    refs.push(controller_ref(job));
                    let mut fins = p.metadata.finalizers.clone().unwrap_or_default();
                    if !fins.iter().any(|f| f == TRACKING_FINALIZER) {
                        fins.push(TRACKING_FINALIZER.into());
                    }
                    let patch = json!({"metadata": {
                        "ownerReferences": refs,
                        "finalizers": fins,
                        "uid": p.metadata.uid,
                        "resourceVersion": p.metadata.resource_version,
                    }});
                    match api
                        .patch(
                            &pod_name(&p),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await
                    {
                        Ok(adopted) => out.push(Arc::new(adopted)),
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(out)
    }

    // -- sync ---------------------------------------------------------------------------

    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let Some(shared) = self.jobs.get(key) else {
            self.expectations.delete(key);
            self.finalizers.lock().remove(key);
            self.backoff.lock().remove(key);
            self.written.lock().remove(key);
            return Ok(());
        };
        let job_uid = shared.metadata.uid.clone().unwrap_or_default();
        {
            // Our own last status write not in the cache yet: its update event
            // brings the job back; acting on the stale copy would only conflict.
            let mut written = self.written.lock();
            if let Some((u, rv)) = written.get(key) {
                let cached = rv_of(&shared.metadata);
                if *u == job_uid && cached.is_some_and(|c| c < *rv) {
                    return Err(SyncError::After(SYNC_BATCH));
                }
                written.remove(key);
            }
        }
        if managed_elsewhere(&shared) {
            return Ok(());
        }
        if is_finished(&shared) {
            self.backoff.lock().remove(key);
            self.finished_uids.lock().remove(&job_uid);
            return Ok(());
        }
        if self.finished_uids.lock().contains(&job_uid) {
            return Ok(());
        }
        let job: Job = (*shared).clone();
        if let Some(m) = spec(&job).completion_mode {
            if m != "NonIndexed" && m != "Indexed" {
                self.event(
                    &job,
                    "Warning",
                    "UnknownCompletionMode",
                    "Skipped Job sync because completion mode is unknown".into(),
                )
                .await;
                return Ok(());
            }
        }
        let sp = spec(&job);
        let now = Timestamp::now();
        let now_ms = now.as_millisecond();
        let mut st = St::from(&job.status.clone().unwrap_or_default());

        let satisfied = self.expectations.satisfied(key);
        let pods = self.pods_for_job(&job).await?;
        let active_pods: Vec<Arc<Pod>> = pods.iter().filter(|p| is_active(p)).cloned().collect();
        let expected_rm = self.finalizers.lock().get(key).cloned().unwrap_or_default();
        let mut c = SyncCtx {
            ready: active_pods.iter().filter(|p| pod_ready(p)).count() as i32,
            terminating: pods.iter().filter(|p| is_terminating(p)).count() as i32,
            unc_succeeded0: st.unc_succeeded.iter().cloned().collect(),
            unc_failed0: st.unc_failed.iter().cloned().collect(),
            job,
            st: St::default(),
            pods,
            active_pods,
            finished: None,
            succeeded: 0,
            failed: 0,
            prev_succeeded_idx: Intervals::default(),
            succeeded_idx: Intervals::default(),
            failed_idx: None,
            new_backoff: BackoffRecord::default(),
            expected_rm,
            delayed_per_index: HashMap::new(),
        };
        let mut active = c.active_pods.len() as i32;
        let (new_succeeded, new_failed) = self.new_finished_pods(&c);
        let policy = pod_failure_policy(&c.job).cloned();
        let counted_failed = new_failed
            .iter()
            .filter(|p| match_pod_failure_policy(policy.as_ref(), p).1)
            .count() as i32;
        c.succeeded = st.succeeded + new_succeeded.len() as i32 + c.unc_succeeded0.len() as i32;
        c.failed = st.failed + counted_failed + c.unc_failed0.len() as i32;

        if st.start_time.is_none() && !suspended(&c.job) {
            st.start_time = Some(Time(now));
        }
        let old_backoff = self.backoff.lock().get(key).cloned().unwrap_or_default();
        c.new_backoff = new_backoff_record(old_backoff, &new_succeeded, &new_failed);

        let backoff_limit = sp.backoff_limit.unwrap_or(6);
        let exceeds_backoff = c.failed > backoff_limit;
        c.finished = condition(&st, "SuccessCriteriaMet")
            .filter(|c| c.status == "True")
            .cloned();
        if c.finished.is_none() {
            let ft = condition(&st, "FailureTarget")
                .filter(|c| c.status == "True")
                .cloned();
            if let Some(ft) = ft {
                c.finished = Some(new_condition(
                    "Failed",
                    "True",
                    ft.reason.as_deref().unwrap_or_default(),
                    ft.message.as_deref().unwrap_or_default(),
                    now,
                ));
            } else if let Some(msg) = c.pods.iter().find_map(|p| {
                if is_pod_failed(p, &c.job) {
                    match_pod_failure_policy(policy.as_ref(), p).0
                } else {
                    None
                }
            }) {
                c.finished = Some(new_condition(
                    "FailureTarget",
                    "True",
                    "PodFailurePolicy",
                    &msg,
                    now,
                ));
            }
        }
        let past_deadline = |st: &St| match (sp.active_deadline_seconds, &st.start_time) {
            (Some(ads), Some(start)) if !suspended(&c.job) => now_ms - millis(start) >= ads * 1000,
            _ => false,
        };
        if c.finished.is_none() {
            if exceeds_backoff || past_backoff_limit_on_failure(&c.job, &c.pods) {
                c.finished = Some(new_condition(
                    "FailureTarget",
                    "True",
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit",
                    now,
                ));
            } else if past_deadline(&st) {
                c.finished = Some(new_condition(
                    "FailureTarget",
                    "True",
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                    now,
                ));
            } else if let (Some(ads), false) = (sp.active_deadline_seconds, suspended(&c.job)) {
                let start = st.start_time.as_ref().map_or(now_ms, millis);
                let left = ads * 1000 - (now_ms - start);
                self.queue
                    .add_after(key.to_owned(), Duration::from_millis(left.max(0) as u64));
            }
        }

        if is_indexed(&c.job) {
            let comps = i64::from(completions(&c.job).unwrap_or(0));
            c.prev_succeeded_idx = Intervals::parse(&st.completed_indexes, comps);
            let newly: BTreeSet<i64> = c
                .pods
                .iter()
                .filter(|p| phase(p) == "Succeeded" && has_tracking_finalizer(p))
                .filter_map(|p| completion_index(p))
                .filter(|ix| *ix < comps)
                .collect();
            c.succeeded_idx = c
                .prev_succeeded_idx
                .with_indexes(&newly.into_iter().collect::<Vec<_>>());
            c.succeeded = c.succeeded_idx.total() as i32;
            if let Some(per_index) = backoff_limit_per_index(&c.job) {
                let prev = st
                    .failed_indexes
                    .as_deref()
                    .map(|s| Intervals::parse(s, comps))
                    .unwrap_or_default();
                let failed: BTreeSet<i64> = c
                    .pods
                    .iter()
                    .filter(|p| has_tracking_finalizer(p))
                    .filter(|p| is_index_failed(&c.job, policy.as_ref(), per_index, p))
                    .filter_map(|p| completion_index(p))
                    .filter(|ix| *ix < comps)
                    .collect();
                let failed_idx = prev.with_indexes(&failed.into_iter().collect::<Vec<_>>());
                if c.finished.is_none() {
                    if sp
                        .max_failed_indexes
                        .is_some_and(|m| failed_idx.total() > i64::from(m))
                    {
                        c.finished = Some(new_condition(
                            "FailureTarget",
                            "True",
                            "MaxFailedIndexesExceeded",
                            "Job has exceeded the specified maximal number of failed indexes",
                            now,
                        ));
                    } else if failed_idx.total() > 0
                        && failed_idx.total() + c.succeeded_idx.total() >= comps
                    {
                        c.finished = Some(new_condition(
                            "FailureTarget",
                            "True",
                            "FailedIndexes",
                            "Job has failed indexes",
                            now,
                        ));
                    }
                }
                c.failed_idx = Some(failed_idx);
                c.delayed_per_index = self.delayed_per_index(&c, comps);
            }
            if c.finished.is_none() {
                if let Some(msg) =
                    match_success_policy(sp.success_policy.as_ref(), comps, &c.succeeded_idx)
                {
                    c.finished = Some(new_condition(
                        "SuccessCriteriaMet",
                        "True",
                        "SuccessPolicy",
                        &msg,
                        now,
                    ));
                }
            }
        }

        let mut suspend_changed = false;
        let mut manage_err: Option<SyncError> = None;
        c.st = st;
        if c.finished.is_some() {
            let (deleted_ready, deleted, err) =
                self.delete_active_pods(&c.job, &c.active_pods).await;
            if deleted != active || !satisfied {
                c.finished = None;
            }
            active -= deleted;
            c.terminating += deleted;
            c.ready -= deleted_ready;
            manage_err = err;
        } else {
            let mut manage_called = false;
            if satisfied && c.job.metadata.deletion_timestamp.is_none() {
                match self.manage(key, &mut c, now_ms).await {
                    Ok(a) => active = a,
                    Err((a, e)) => {
                        active = a;
                        manage_err = Some(e);
                    }
                }
                manage_called = true;
            }
            let complete = match completions(&c.job) {
                None => c.succeeded > 0 && active == 0,
                Some(n) => c.succeeded >= n && active == 0,
            };
            if complete {
                c.finished = Some(new_condition(
                    "SuccessCriteriaMet",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    now,
                ));
            } else if manage_called {
                if suspended(&c.job) {
                    if ensure_condition(
                        &mut c.st.conditions,
                        "Suspended",
                        "True",
                        "JobSuspended",
                        "Job suspended",
                        now,
                    ) {
                        suspend_changed = true;
                        self.event(&c.job, "Normal", "Suspended", "Job suspended".into())
                            .await;
                        // MutableSchedulingDirectivesForSuspendedJobs (on by default).
                        c.st.start_time = None;
                    }
                } else if ensure_condition(
                    &mut c.st.conditions,
                    "Suspended",
                    "False",
                    "JobResumed",
                    "Job resumed",
                    now,
                ) {
                    suspend_changed = true;
                    self.event(&c.job, "Normal", "Resumed", "Job resumed".into())
                        .await;
                    // activeDeadlineSeconds counts from the resumption.
                    c.st.start_time = Some(Time(now));
                }
            }
        }

        let needs_update = suspend_changed
            || active != c.st.active
            || c.st.ready != Some(c.ready)
            || c.st.terminating != Some(c.terminating);
        c.st.active = active;
        c.st.ready = Some(c.ready);
        c.st.terminating = Some(c.terminating);
        self.track_status(key, &mut c, needs_update).await?;
        match manage_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The newly finished pods not counted yet (getNewFinishedPods).
    fn new_finished_pods(&self, c: &SyncCtx) -> (Vec<Arc<Pod>>, Vec<Arc<Pod>>) {
        let valid = |p: &Pod, uncounted: &HashSet<String>| {
            if !has_tracking_finalizer(p)
                || uncounted.contains(&uid(p))
                || c.expected_rm.contains(&uid(p))
            {
                return false;
            }
            if is_indexed(&c.job) {
                let comps = i64::from(completions(&c.job).unwrap_or(0));
                return completion_index(p).is_some_and(|ix| ix < comps);
            }
            true
        };
        let succeeded = c
            .pods
            .iter()
            .filter(|p| valid(p, &c.unc_succeeded0) && phase(p) == "Succeeded")
            .cloned()
            .collect();
        let failed = c
            .pods
            .iter()
            .filter(|p| valid(p, &c.unc_failed0) && is_pod_failed(p, &c.job))
            .cloned()
            .collect();
        (succeeded, failed)
    }

    /// Per index, the last failed pod kept (with its finalizer) until its replacement
    /// carries the failure count on (getPodsWithDelayedDeletionPerIndex).
    fn delayed_per_index(&self, c: &SyncCtx, comps: i64) -> HashMap<i64, Arc<Pod>> {
        let active: HashSet<i64> = c
            .active_pods
            .iter()
            .filter_map(|p| completion_index(p))
            .collect();
        let mut out: HashMap<i64, Arc<Pod>> = HashMap::new();
        for p in &c.pods {
            if !has_tracking_finalizer(p)
                || c.expected_rm.contains(&uid(p))
                || !is_pod_failed(p, &c.job)
            {
                continue;
            }
            let Some(ix) = completion_index(p).filter(|ix| *ix < comps) else {
                continue;
            };
            if c.succeeded_idx.has(ix)
                || c.failed_idx.as_ref().is_some_and(|f| f.has(ix))
                || active.contains(&ix)
            {
                continue;
            }
            match out.get(&ix) {
                Some(last) => {
                    if index_absolute_failure_count(last) <= index_absolute_failure_count(p)
                        && finished_time(p) >= finished_time(last)
                    {
                        out.insert(ix, p.clone());
                    }
                }
                None => {
                    out.insert(ix, p.clone());
                }
            }
        }
        out
    }

    /// Deletes the active pods of a finishing job, keeping their finalizers. Returns how
    /// many ready and how many in all were deleted.
    async fn delete_active_pods(
        &self,
        job: &Job,
        pods: &[Arc<Pod>],
    ) -> (i32, i32, Option<SyncError>) {
        let ns = job.metadata.namespace.clone().unwrap_or_default();
        let api = self.pods_api(&ns);
        let results = futures::future::join_all(pods.iter().map(|p| {
            let api = api.clone();
            async move {
                (
                    p.clone(),
                    api.delete(&pod_name(p), &DeleteParams::default()).await,
                )
            }
        }))
        .await;
        let (mut ready, mut deleted, mut err) = (0, pods.len() as i32, None);
        for (p, r) in results {
            match r {
                Ok(_) => {
                    self.event(
                        job,
                        "Normal",
                        "SuccessfulDelete",
                        format!("Deleted pod: {}", pod_name(&p)),
                    )
                    .await;
                }
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    deleted -= 1;
                    let m = message(&e);
                    self.event(
                        job,
                        "Warning",
                        "FailedDelete",
                        format!("Error deleting: {m}"),
                    )
                    .await;
                    err.get_or_insert(SyncError::Failed(m));
                }
            }
            if pod_ready(&p) {
                ready += 1;
            }
        }
        (ready, deleted, err)
    }

    /// Removes the finalizers of and deletes pods (suspension, surplus). Returns how many
    /// ready and how many in all were removed.
    async fn delete_job_pods(
        &self,
        key: &str,
        job: &Job,
        pods: &[Arc<Pod>],
    ) -> (i32, i32, Option<SyncError>) {
        let ns = job.metadata.namespace.clone().unwrap_or_default();
        let api = self.pods_api(&ns);
        let results = futures::future::join_all(pods.iter().map(|p| {
            let api = api.clone();
            async move {
                let name = pod_name(p);
                if has_tracking_finalizer(p) {
                    if let Err(e) = api
                        .patch(
                            &name,
                            &PatchParams::default(),
                            &Patch::Strategic(remove_finalizer_patch()),
                        )
                        .await
                    {
                        return (p.clone(), Err((e, false)));
                    }
                }
                (
                    p.clone(),
                    api.delete(&name, &DeleteParams::default())
                        .await
                        .map(|_| ())
                        .map_err(|e| (e, true)),
                )
            }
        }))
        .await;
        let (mut ready, mut deleted, mut err) = (0, pods.len() as i32, None);
        for (p, r) in results {
            match r {
                Ok(()) => {
                    self.event(
                        job,
                        "Normal",
                        "SuccessfulDelete",
                        format!("Deleted pod: {}", pod_name(&p)),
                    )
                    .await;
                }
                Err((e, deleting)) => {
                    self.expectations.lower(key, 0, 1);
                    if !is_not_found(&e) {
                        deleted -= 1;
                        let m = message(&e);
                        if deleting {
                            self.event(
                                job,
                                "Warning",
                                "FailedDelete",
                                format!("Error deleting: {m}"),
                            )
                            .await;
                        }
                        err.get_or_insert(SyncError::Failed(m));
                        continue;
                    }
                }
            }
            if pod_ready(&p) {
                ready += 1;
            }
        }
        (ready, deleted, err)
    }

    /// Creates or deletes pods towards the wanted number of active pods (manageJob).
    /// Returns the new active count (with the error, if any).
    async fn manage(
        &self,
        key: &str,
        c: &mut SyncCtx,
        now_ms: i64,
    ) -> Result<i32, (i32, SyncError)> {
        let job = c.job.clone();
        let sp = spec(&job);
        let mut active = c.active_pods.len() as i32;
        let parallelism = sp.parallelism.unwrap_or(1);
        if suspended(&job) {
            let rm = active_pods_for_removal(&job, &c.active_pods, active as usize);
            self.expectations.expect(key, 0, rm.len() as i64);
            let (ready, removed, err) = self.delete_job_pods(key, &job, &rm).await;
            active -= removed;
            c.terminating += removed;
            c.ready -= ready;
            return match err {
                Some(e) => Err((active, e)),
                None => Ok(active),
            };
        }
        let want = match sp.completions {
            None => {
                if c.succeeded > 0 {
                    active
                } else {
                    parallelism
                }
            }
            Some(n) => (n - c.succeeded).min(parallelism).max(0),
        };
        let rm_at_least = (active - want).max(0) as usize;
        let mut rm = active_pods_for_removal(&job, &c.active_pods, rm_at_least);
        rm.truncate(MAX_CREATE_DELETE as usize);
        if !rm.is_empty() {
            self.expectations.expect(key, 0, rm.len() as i64);
            let (ready, removed, err) = self.delete_job_pods(key, &job, &rm).await;
            active -= removed;
            c.terminating += removed;
            c.ready -= ready;
            return match err {
                Some(e) => Err((active, e)),
                None => Ok(active),
            };
        }
        let terminating = if only_replace_failed(&job) {
            c.terminating
        } else {
            0
        };
        let mut diff = want - terminating - active;
        if diff <= 0 {
            return Ok(active);
        }
        if backoff_limit_per_index(&job).is_none() {
            let left =
                remaining_backoff(c.new_backoff.failures, c.new_backoff.last_failure, now_ms);
            if !left.is_zero() {
                self.queue.add_after(key.to_owned(), left.max(SYNC_BATCH));
                return Ok(active);
            }
        }
        diff = diff.min(MAX_CREATE_DELETE);
        let mut indexes: Vec<i64> = Vec::new();
        if is_indexed(&job) {
            let comps = i64::from(sp.completions.unwrap_or(0));
            indexes = first_pending_indexes(c, diff as usize, comps);
            if backoff_limit_per_index(&job).is_some() {
                let mut now_ok = Vec::new();
                let mut min_left: Option<Duration> = None;
                for ix in indexes {
                    let left = remaining_backoff_per_index(c.delayed_per_index.get(&ix), now_ms);
                    if left.is_zero() {
                        now_ok.push(ix);
                    } else if min_left.is_none_or(|m| left < m) {
                        min_left = Some(left);
                    }
                }
                if now_ok.is_empty() {
                    if let Some(left) = min_left {
                        self.queue.add_after(key.to_owned(), left.max(SYNC_BATCH));
                        return Ok(active);
                    }
                }
                indexes = now_ok;
            }
            diff = indexes.len() as i32;
        }
        if diff == 0 {
            return Ok(active);
        }
        self.expectations.expect(key, i64::from(diff), 0);
        active += diff;
        let ns = job.metadata.namespace.clone().unwrap_or_default();
        let api = self.pods_api(&ns);
        let base = self.pod_template(&job);
        let job_name = job.metadata.name.clone().unwrap_or_default();
        let mut first_err: Option<SyncError> = None;
        let mut batch = 1i32.min(diff);
        let mut remaining = diff;
        let mut indexes = indexes.into_iter();
        while remaining > 0 {
            let mut pods = Vec::new();
            for _ in 0..batch {
                let mut pod = base.clone();
                if let Some(ix) = indexes.next() {
                    let s = ix.to_string();
                    pod.metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(COMPLETION_INDEX.into(), s.clone());
                    pod.metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .insert(COMPLETION_INDEX.into(), s);
                    if let Some(ps) = pod.spec.as_mut() {
                        ps.hostname = Some(format!("{job_name}-{ix}"));
                    }
                    pod.metadata.generate_name = Some(generate_name_with_index(&job_name, ix));
                    if backoff_limit_per_index(&job).is_some() {
                        let (failed, ignored) = match c.delayed_per_index.get(&ix) {
                            None => (0, 0),
                            Some(prev) => {
                                let (f, i) = (
                                    index_failure_count(prev),
                                    annotation_count(prev, INDEX_IGNORED_FAILURE_COUNT),
                                );
                                if match_pod_failure_policy(pod_failure_policy(&job), prev).1 {
                                    (f + 1, i)
                                } else {
                                    (f, i + 1)
                                }
                            }
                        };
                        let ann = pod
                            .metadata
                            .annotations
                            .get_or_insert_with(Default::default);
                        ann.insert(INDEX_FAILURE_COUNT.into(), failed.to_string());
                        if ignored > 0 {
                            ann.insert(INDEX_IGNORED_FAILURE_COUNT.into(), ignored.to_string());
                        }
                    }
                }
                pods.push(pod);
            }
            let pp = PostParams::default();
            let results = futures::future::join_all(pods.iter().map(|p| api.create(&pp, p))).await;
            let mut failed = 0;
            for r in results {
                match r {
                    Ok(p) => {
                        self.event(
                            &job,
                            "Normal",
                            "SuccessfulCreate",
                            format!("Created pod: {}", pod_name(&p)),
                        )
                        .await;
                    }
                    Err(e) => {
                        if namespace_terminating(&e) {
                            continue;
                        }
                        self.expectations.lower(key, 1, 0);
                        active -= 1;
                        failed += 1;
                        let m = message(&e);
                        self.event(
                            &job,
                            "Warning",
                            "FailedCreate",
                            format!("Error creating: {m}"),
                        )
                        .await;
                        first_err.get_or_insert(SyncError::Failed(m));
                    }
                }
            }
            remaining -= batch;
            if failed > 0 && remaining > 0 {
                // Slow start: the rest would fail the same way.
                active -= remaining;
                self.expectations.lower(key, i64::from(remaining), 0);
                break;
            }
            batch = (batch * 2).min(remaining);
        }
        match first_err {
            Some(e) => Err((active, e)),
            None => Ok(active),
        }
    }

    /// The pod made from the job's template (GetPodFromTemplate plus the job's additions).
    fn pod_template(&self, job: &Job) -> Pod {
        let tmpl = spec(job).template;
        let tm = tmpl.metadata.unwrap_or_default();
        let mut pod_spec = tmpl.spec.unwrap_or_default();
        if is_indexed(job) {
            let env = EnvVar {
                name: COMPLETION_INDEX_ENV.into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        api_version: None,
                        field_path: format!("metadata.labels['{COMPLETION_INDEX}']"),
                    }),
                    ..Default::default()
                }),
            };
            for ctr in pod_spec
                .init_containers
                .iter_mut()
                .flatten()
                .chain(pod_spec.containers.iter_mut())
            {
                let envs = ctr.env.get_or_insert_with(Vec::new);
                if !envs.iter().any(|e| e.name == COMPLETION_INDEX_ENV) {
                    envs.push(env.clone());
                }
            }
        }
        let mut finalizers = tm.finalizers.unwrap_or_default();
        if !finalizers.iter().any(|f| f == TRACKING_FINALIZER) {
            finalizers.push(TRACKING_FINALIZER.into());
        }
        Pod {
            metadata: ObjectMeta {
                generate_name: Some(format!(
                    "{}-",
                    job.metadata.name.as_deref().unwrap_or_default()
                )),
                namespace: job.metadata.namespace.clone(),
                labels: tm.labels,
                annotations: tm.annotations,
                finalizers: Some(finalizers),
                owner_references: Some(vec![controller_ref(job)]),
                ..Default::default()
            },
            spec: Some(pod_spec),
            status: None,
        }
    }

    /// Writes the job's status (the status subresource, guarded by resourceVersion).
    async fn write_status(&self, c: &mut SyncCtx) -> Result<(), SyncError> {
        let mut obj = c.job.clone();
        obj.status = Some(c.st.to_status());
        let ns = obj.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Job> = Api::namespaced(self.client.get(), &ns);
        let updated = api
            .replace_status(
                obj.metadata.name.as_deref().unwrap_or_default(),
                &PostParams::default(),
                &obj,
            )
            .await?;
        if let (Some(u), Some(rv)) = (&updated.metadata.uid, rv_of(&updated.metadata)) {
            self.written
                .lock()
                .insert(key_of(&updated), (u.clone(), rv));
        }
        c.job.metadata = updated.metadata;
        Ok(())
    }

    /// Counts finished pods through uncountedTerminatedPods, removes their finalizers,
    /// and finishes the job when it can (trackJobStatusAndRemoveFinalizers).
    async fn track_status(
        &self,
        key: &str,
        c: &mut SyncCtx,
        mut needs_flush: bool,
    ) -> Result<(), SyncError> {
        let indexed = is_indexed(&c.job);
        let comps = i64::from(completions(&c.job).unwrap_or(0));
        if indexed {
            c.pods.sort_by_key(|p| index_key(p));
        }
        let mut with_finalizer: HashSet<String> = c
            .pods
            .iter()
            .filter(|p| has_tracking_finalizer(p) && !c.expected_rm.contains(&uid(p)))
            .map(|p| uid(p))
            .collect();
        if clean_uncounted(&mut c.st, &with_finalizer) {
            needs_flush = true;
        }
        let policy = pod_failure_policy(&c.job).cloned();
        let mut to_remove: Vec<Arc<Pod>> = Vec::new();
        let mut new_succeeded_idx: Vec<i64> = Vec::new();
        let mut reached_max = false;
        let pods = c.pods.clone();
        for p in &pods {
            if !has_tracking_finalizer(p) || c.expected_rm.contains(&uid(p)) {
                continue;
            }
            let failed = is_pod_failed(p, &c.job);
            if !can_remove_finalizer(c, p, failed) {
                continue;
            }
            to_remove.push(p.clone());
            let u = uid(p);
            if phase(p) == "Succeeded" && !c.unc_failed0.contains(&u) {
                if indexed {
                    if let Some(ix) = completion_index(p) {
                        if ix < comps && !c.prev_succeeded_idx.has(ix) {
                            new_succeeded_idx.push(ix);
                            needs_flush = true;
                        }
                    }
                } else if !c.unc_succeeded0.contains(&u) {
                    needs_flush = true;
                    c.st.unc_succeeded.push(u);
                }
            } else if failed
                || (c.finished.is_some() && !is_success_criteria_met(c.finished.as_ref()))
            {
                let ix_ok = !indexed || completion_index(p).is_some_and(|ix| ix < comps);
                if !c.unc_failed0.contains(&u)
                    && ix_ok
                    && match_pod_failure_policy(policy.as_ref(), p).1
                {
                    needs_flush = true;
                    c.st.unc_failed.push(u);
                }
            }
            if new_succeeded_idx.len() + c.st.unc_succeeded.len() + c.st.unc_failed.len()
                >= MAX_UNCOUNTED
            {
                reached_max = true;
                break;
            }
        }
        if indexed {
            new_succeeded_idx.sort_unstable();
            c.succeeded_idx = c.succeeded_idx.with_indexes(&new_succeeded_idx);
            let s = c.succeeded_idx.to_string();
            if s != c.st.completed_indexes {
                needs_flush = true;
            }
            c.st.succeeded = c.succeeded_idx.total() as i32;
            c.st.completed_indexes = s;
            let f = c.failed_idx.as_ref().map(|f| f.to_string());
            if c.st.failed_indexes != f {
                c.st.failed_indexes = f;
                needs_flush = true;
            }
        }
        let now = Timestamp::now();
        if let Some(f) = c.finished.clone().filter(|f| f.type_ == "FailureTarget") {
            c.st.conditions.push(f.clone());
            needs_flush = true;
            c.finished = Some(new_condition(
                "Failed",
                "True",
                f.reason.as_deref().unwrap_or_default(),
                f.message.as_deref().unwrap_or_default(),
                now,
            ));
        }
        if is_success_criteria_met(c.finished.as_ref()) {
            if let Some(f) = c.finished.clone() {
                if condition(&c.st, "SuccessCriteriaMet").is_none_or(|x| x.status != "True") {
                    c.st.conditions.push(f.clone());
                    needs_flush = true;
                }
                c.finished = Some(new_condition(
                    "Complete",
                    "True",
                    f.reason.as_deref().unwrap_or_default(),
                    f.message.as_deref().unwrap_or_default(),
                    now,
                ));
            }
        }

        // Flush the uncounted pods, then remove the finalizers, then count them.
        if needs_flush {
            self.write_status(c).await?;
            self.backoff
                .lock()
                .insert(key.to_owned(), c.new_backoff.clone());
            needs_flush = false;
        }
        let mut rm_err: Option<SyncError> = None;
        if !to_remove.is_empty() {
            self.finalizers
                .lock()
                .entry(key.to_owned())
                .or_default()
                .extend(to_remove.iter().map(|p| uid(p)));
            let ns = c.job.metadata.namespace.clone().unwrap_or_default();
            let api = self.pods_api(&ns);
            let results = futures::future::join_all(to_remove.iter().map(|p| {
                let api = api.clone();
                async move {
                    let r = api
                        .patch(
                            &pod_name(p),
                            &PatchParams::default(),
                            &Patch::Strategic(remove_finalizer_patch()),
                        )
                        .await;
                    (uid(p), r)
                }
            }))
            .await;
            for (u, r) in results {
                match r {
                    Ok(_) => {
                        with_finalizer.remove(&u);
                    }
                    Err(e) => {
                        observe_finalizer_removed(&self.finalizers, key, &u);
                        if is_not_found(&e) {
                            with_finalizer.remove(&u);
                        } else {
                            rm_err.get_or_insert(SyncError::Failed(format!(
                                "removing tracking finalizer: {}",
                                message(&e)
                            )));
                        }
                    }
                }
            }
        }
        if clean_uncounted(&mut c.st, &with_finalizer) {
            needs_flush = true;
        }
        if let Some(e) = rm_err {
            if needs_flush {
                self.write_status(c).await?;
            }
            return Err(e);
        }
        let finished = !reached_max && self.enact_finished(c);
        if finished {
            needs_flush = true;
        }
        if needs_flush {
            self.write_status(c).await?;
            if finished {
                if let Some(f) = c.finished.clone() {
                    self.record_finished(&c.job, &c.st, &f).await;
                }
                if let Some(u) = &c.job.metadata.uid {
                    self.finished_uids.lock().insert(u.clone());
                }
            }
        }
        Ok(())
    }

    /// Adds the Complete or Failed condition once no pod is uncounted or terminating.
    fn enact_finished(&self, c: &mut SyncCtx) -> bool {
        let Some(f) = c.finished.clone() else {
            return false;
        };
        if !c.st.unc_succeeded.is_empty() || !c.st.unc_failed.is_empty() || c.terminating > 0 {
            return false;
        }
        let now = Timestamp::now();
        ensure_condition(
            &mut c.st.conditions,
            &f.type_,
            &f.status,
            f.reason.as_deref().unwrap_or_default(),
            f.message.as_deref().unwrap_or_default(),
            now,
        );
        if f.type_ == "Complete" {
            c.st.completion_time = f.last_transition_time.clone();
        }
        true
    }

    async fn record_finished(&self, job: &Job, st: &St, f: &JobCondition) {
        if f.type_ == "Complete" {
            if completions(job).is_some_and(|n| st.succeeded > n) {
                self.event(
                    job,
                    "Warning",
                    "TooManySucceededPods",
                    "Too many succeeded pods running after completion count reached".into(),
                )
                .await;
            }
            self.event(job, "Normal", "Completed", "Job completed".into())
                .await;
        } else {
            self.event(
                job,
                "Warning",
                f.reason.as_deref().unwrap_or_default(),
                f.message.clone().unwrap_or_default(),
            )
            .await;
        }
    }
}

/// A resourceVersion as a number (kumo's are the store's revisions).
fn rv_of(meta: &ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

/// Whether the job's `spec.managedBy` names another controller.
fn managed_elsewhere(job: &Job) -> bool {
    job.spec
        .as_ref()
        .and_then(|s| s.managed_by.as_deref())
        .is_some_and(|m| m != CONTROLLER_NAME)
}

/// Whether the index of a failed pod has failed for good (backoffLimitPerIndex).
fn is_index_failed(job: &Job, policy: Option<&PodFailurePolicy>, per_index: i32, p: &Pod) -> bool {
    if !is_pod_failed(p, job) {
        return false;
    }
    let counted = if policy.is_some() {
        let (_, count, action) = match_pod_failure_policy(policy, p);
        if action.as_deref() == Some("FailIndex") {
            return true;
        }
        count
    } else {
        true
    };
    counted && index_failure_count(p) >= per_index
}

/// Whether the pod's finalizer may go now (canRemoveFinalizer).
fn can_remove_finalizer(c: &SyncCtx, p: &Pod, failed: bool) -> bool {
    if c.job.metadata.deletion_timestamp.is_some()
        || c.finished.is_some()
        || phase(p) == "Succeeded"
    {
        return true;
    }
    if !failed {
        return false;
    }
    if backoff_limit_per_index(&c.job).is_some() {
        if let Some(ix) = completion_index(p) {
            if c.delayed_per_index
                .get(&ix)
                .is_some_and(|d| uid(d) == uid(p))
            {
                return false;
            }
        }
    }
    true
}

/// Moves the uncounted pods whose finalizer is gone into the counters.
fn clean_uncounted(st: &mut St, with_finalizer: &HashSet<String>) -> bool {
    let mut updated = false;
    let before = st.unc_succeeded.len();
    st.unc_succeeded.retain(|u| with_finalizer.contains(u));
    if st.unc_succeeded.len() != before {
        updated = true;
        st.succeeded += (before - st.unc_succeeded.len()) as i32;
    }
    let before = st.unc_failed.len();
    st.unc_failed.retain(|u| with_finalizer.contains(u));
    if st.unc_failed.len() != before {
        updated = true;
        st.failed += (before - st.unc_failed.len()) as i32;
    }
    updated
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_parse_merge_and_print_like_upstream() {
        let i = Intervals::parse("0-2,4", 10);
        assert_eq!(i.0, vec![(0, 2), (4, 4)]);
        assert_eq!(i.total(), 4);
        assert_eq!(i.to_string(), "0-2,4");
        let j = i.with_indexes(&[3, 7, 8]);
        assert_eq!(j.to_string(), "0-4,7,8");
        assert!(j.has(8) && !j.has(6));
        // Indexes past completions are dropped, intervals are cut.
        assert_eq!(Intervals::parse("1-9,12", 5).to_string(), "1-4");
        assert_eq!(Intervals::parse("", 5).to_string(), "");
    }

    #[test]
    fn backoff_doubles_from_10s_and_is_capped() {
        let now = 1_000_000_000;
        assert_eq!(remaining_backoff(0, Some(now), now), Duration::ZERO);
        assert_eq!(
            remaining_backoff(1, Some(now), now),
            Duration::from_secs(10)
        );
        assert_eq!(
            remaining_backoff(3, Some(now - 5_000), now),
            Duration::from_secs(35)
        );
        assert_eq!(
            remaining_backoff(30, Some(now), now),
            MAX_POD_FAILURE_BACKOFF
        );
        assert_eq!(
            remaining_backoff(1, Some(now - 20_000), now),
            Duration::ZERO
        );
    }

    #[test]
    fn success_policy_rules() {
        let policy: SuccessPolicy = serde_json::from_value(json!({"rules": [
            {"succeededIndexes": "0,2-3"},
            {"succeededCount": 4},
        ]}))
        .expect("policy");
        let got = |s: &str| match_success_policy(Some(&policy), 10, &Intervals::parse(s, 10));
        assert_eq!(got("0,2-3").as_deref(), Some("Matched rules at index 0"));
        assert_eq!(got("0-2").as_deref(), None);
        assert_eq!(got("5-8").as_deref(), Some("Matched rules at index 1"));
    }

    #[test]
    fn generate_name_with_index_is_cut_to_fit() {
        assert_eq!(generate_name_with_index("pi", 3), "pi-3-");
        let long = "a".repeat(70);
        let g = generate_name_with_index(&long, 12);
        assert_eq!(g.len(), MAX_GENERATED_NAME);
        assert!(g.ends_with("-12-"));
    }
}
