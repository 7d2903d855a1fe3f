//! deployment-controller: rolls a Deployment's pod template out through ReplicaSets named
//! `<deployment>-<pod-template-hash>`, with the RollingUpdate (maxSurge / maxUnavailable)
//! or Recreate strategy, revisions in `deployment.kubernetes.io/revision`, proportional
//! scaling, pause/resume, revisionHistoryLimit cleanup, and the Available and Progressing
//! conditions (progressDeadlineSeconds) with upstream's reasons and messages.
//!
//! Rollback (`kubectl rollout undo`) is client-side: kubectl copies an old ReplicaSet's
//! template into the Deployment, which then finds that ReplicaSet as its new one again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec,
};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::replicaset::{
    adopt_patch, controller_of, controller_ref, record_event, release_patch, selector_is_empty,
    selector_matches,
};
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_already_exists, is_not_found, message};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::WorkQueue;

/// The label that tells a Deployment's ReplicaSets (and their pods) apart.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// The revision of a ReplicaSet (and of its Deployment).
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// The revisions a ReplicaSet had before a rollback made it the newest again.
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
/// The longest revision-history annotation (maxRevHistoryLengthInChars).
const MAX_REVISION_HISTORY_CHARS: usize = 2000;
/// The Deployment's replicas when the ReplicaSet was last scaled.
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// The Deployment's replicas plus maxSurge when the ReplicaSet was last scaled.
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
const ROLLBACK_TO: &str = "deprecated.deployment.rollback.to";
const COMPONENT: &str = "deployment-controller";

// Condition reasons (deploymentutil).
const REPLICA_SET_UPDATED: &str = "ReplicaSetUpdated";
const FAILED_RS_CREATE: &str = "ReplicaSetCreateError";
const NEW_RS_CREATED: &str = "NewReplicaSetCreated";
const FOUND_NEW_RS: &str = "FoundNewReplicaSet";
const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";
const TIMED_OUT: &str = "ProgressDeadlineExceeded";
const PAUSED: &str = "DeploymentPaused";
const RESUMED: &str = "DeploymentResumed";
const MIN_AVAILABLE: &str = "MinimumReplicasAvailable";
const MIN_UNAVAILABLE: &str = "MinimumReplicasUnavailable";

struct Ctl {
    client: ClientSource,
    deployments: Arc<Informer<Deployment>>,
    sets: Arc<Informer<ReplicaSet>>,
    pods: Arc<Informer<Pod>>,
    queue: Arc<WorkQueue<String>>,
}

/// The key of the Deployment controlling `meta`'s object, if one does.
fn deployment_owner(meta: &ObjectMeta) -> Option<String> {
    let r = controller_of(meta)?;
    (r.kind == "Deployment").then(|| {
        format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            r.name
        )
    })
}

/// The Deployments whose selector matches an orphaned ReplicaSet.
fn matching_deployments(deps: &Informer<Deployment>, rs: &ReplicaSet) -> Vec<String> {
    let ns = rs.metadata.namespace.as_deref();
    deps.list()
        .iter()
        .filter(|d| d.metadata.namespace.as_deref() == ns)
        .filter(|d| {
            !selector_is_empty(Some(&d.spec.selector))
                && selector_matches(&d.spec.selector, rs.metadata.labels.as_ref())
        })
        .map(|d| key_of(d.as_ref()))
        .collect()
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("deployment");
    let deployments = factory.informer::<Deployment>();
    let sets = factory.informer::<ReplicaSet>();
    let pods = factory.informer::<Pod>();

    let q = queue.clone();
    deployments.add_handler(move |c| match c {
        Change::Added(d) | Change::Updated { new: d, .. } | Change::Deleted(d) => q.add(key_of(d)),
    });
    let (q, deps) = (queue.clone(), deployments.clone());
    sets.add_handler(move |c| {
        let enqueue = |rs: &ReplicaSet| match deployment_owner(&rs.metadata) {
            Some(k) => q.add(k),
            None if controller_of(&rs.metadata).is_none() => {
                for k in matching_deployments(&deps, rs) {
                    q.add(k);
                }
            }
            None => {}
        };
        match c {
            Change::Added(rs) | Change::Deleted(rs) => enqueue(rs),
            Change::Updated { old, new } => {
                if deployment_owner(&old.metadata) != deployment_owner(&new.metadata) {
                    enqueue(old);
                }
                enqueue(new);
            }
        }
    });
    // Recreate waits for the old pods to be gone.
    let (q, s) = (queue.clone(), sets.clone());
    pods.add_handler(move |c| {
        if let Change::Deleted(p) = c {
            let Some(r) = controller_of(&p.metadata).filter(|r| r.kind == "ReplicaSet") else {
                return;
            };
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            if let Some(rs) = s.get(&format!("{ns}/{}", r.name)) {
                if let Some(k) = deployment_owner(&rs.metadata) {
                    q.add(k);
                }
            }
        }
    });

    tokio::spawn(async move {
        tracing::info!("Starting deployment controller");
        let Some(client) = client_for(&clients, "deployment-controller", &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            deployments,
            sets,
            pods,
            queue: queue.clone(),
        });
        let synced = async {
            ctl.deployments.wait_synced().await;
            ctl.sets.wait_synced().await;
            ctl.pods.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let tasks = run_workers_of("deployment", queue, 5, stop, &ctl, |c, key| async move {
            c.sync(&key).await
        });
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down deployment controller");
    })
}

// ---------------------------------------------------------------------------------------
// deploymentutil.

/// FNV-32a, as Go's hash/fnv.
fn fnv32a(data: &[u8], mut h: u32) -> u32 {
    for b in data {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The pod-template-hash of a template (controller.ComputeHash): FNV-32a of the template
/// (kumo hashes its canonical JSON where upstream hashes Go's spew dump, so the values
/// differ from upstream's), then the collision count as 8 little-endian bytes, printed in
/// decimal and mapped through rand.SafeEncodeString's alphabet.
pub fn compute_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let bytes = serde_json::to_vec(template).unwrap_or_default();
    let mut h = fnv32a(&bytes, 0x811c_9dc5);
    if let Some(c) = collision_count {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&(c as u32).to_le_bytes());
        h = fnv32a(&b, h);
    }
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    h.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// Whether two templates are equal once the pod-template-hash label is ignored.
fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let strip = |t: &PodTemplateSpec| {
        let mut t = t.clone();
        let m = t.metadata.get_or_insert_with(Default::default);
        if let Some(l) = m.labels.as_mut() {
            l.remove(POD_TEMPLATE_HASH);
            if l.is_empty() {
                m.labels = None;
            }
        }
        if m.annotations.as_ref().is_some_and(|a| a.is_empty()) {
            m.annotations = None;
        }
        serde_json::to_value(&t).unwrap_or_default()
    };
    strip(a) == strip(b)
}

fn replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.replicas.unwrap_or(1)
}

fn status_of(rs: &ReplicaSet) -> (i32, i32, i32, i32) {
    let s = rs.status.clone().unwrap_or_default();
    (
        s.replicas,
        s.ready_replicas.unwrap_or(0),
        s.available_replicas.unwrap_or(0),
        s.terminating_replicas.unwrap_or(0),
    )
}

fn revision(rs: &ReplicaSet) -> i64 {
    annotation(&rs.metadata, REVISION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn annotation<'a>(m: &'a ObjectMeta, k: &str) -> Option<&'a str> {
    m.annotations.as_ref()?.get(k).map(String::as_str)
}

fn desired(d: &Deployment) -> i32 {
    d.spec.replicas.unwrap_or(1)
}

fn is_rolling(d: &Deployment) -> bool {
    d.spec
        .strategy
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate")
}

/// intstr.GetScaledValueFromIntOrPercent.
fn scaled(v: Option<&IntOrString>, total: i32, round_up: bool) -> i32 {
    match v {
        None => {
            // The 25 % defaults.
            let x = f64::from(total) * 25.0 / 100.0;
            (if round_up { x.ceil() } else { x.floor() }) as i32
        }
        Some(IntOrString::Int(i)) => *i,
        Some(IntOrString::String(s)) => {
            let p: f64 = s.trim_end_matches('%').parse().unwrap_or(0.0);
            let x = p * f64::from(total) / 100.0;
            (if round_up { x.ceil() } else { x.floor() }) as i32
        }
    }
}

/// deploymentutil.ResolveFenceposts: (maxSurge, maxUnavailable).
fn fenceposts(d: &Deployment) -> (i32, i32) {
    let ru = d
        .spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref());
    let total = desired(d);
    let surge = scaled(ru.and_then(|r| r.max_surge.as_ref()), total, true);
    let mut unavailable = scaled(ru.and_then(|r| r.max_unavailable.as_ref()), total, false);
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    (surge, unavailable)
}

fn max_surge(d: &Deployment) -> i32 {
    if !is_rolling(d) {
        return 0;
    }
    fenceposts(d).0
}

fn max_unavailable(d: &Deployment) -> i32 {
    if !is_rolling(d) || desired(d) == 0 {
        return 0;
    }
    fenceposts(d).1.min(desired(d))
}

fn has_progress_deadline(d: &Deployment) -> bool {
    d.spec
        .progress_deadline_seconds
        .is_some_and(|s| s != i32::MAX)
}

fn condition<'a>(s: &'a DeploymentStatus, t: &str) -> Option<&'a DeploymentCondition> {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_.as_deref() == Some(t))
}

fn new_condition(t: &str, status: &str, reason: &str, msg: String) -> DeploymentCondition {
    let now = Some(Time(Timestamp::now()));
    DeploymentCondition {
        type_: Some(t.into()),
        status: Some(status.into()),
        reason: Some(reason.into()),
        message: Some(msg),
        last_update_time: now.clone(),
        last_transition_time: now,
    }
}

/// deploymentutil.SetDeploymentCondition: same status and reason leaves it alone; same
/// status keeps the transition time.
fn set_condition(s: &mut DeploymentStatus, mut c: DeploymentCondition) {
    let t = c.type_.clone().unwrap_or_default();
    if let Some(cur) = condition(s, &t) {
        if cur.status == c.status && cur.reason == c.reason {
            return;
        }
        if cur.status == c.status {
            c.last_transition_time = cur.last_transition_time.clone();
        }
    }
    remove_condition(s, &t);
    s.conditions.get_or_insert_with(Vec::new).push(c);
}

fn remove_condition(s: &mut DeploymentStatus, t: &str) {
    if let Some(cs) = s.conditions.as_mut() {
        cs.retain(|c| c.type_.as_deref() != Some(t));
    }
}

/// The replicas the new ReplicaSet should have now (deploymentutil.NewRSNewReplicas).
fn new_rs_new_replicas(d: &Deployment, all: &[&ReplicaSet], new_rs: &ReplicaSet) -> i32 {
    if !is_rolling(d) {
        return desired(d);
    }
    let current: i32 = all.iter().map(|rs| replicas(rs)).sum();
    let max_total = desired(d) + max_surge(d);
    if current >= max_total {
        return replicas(new_rs);
    }
    let up = (max_total - current)
        .min(desired(d) - replicas(new_rs))
        .max(0);
    replicas(new_rs) + up
}

/// Sets the replicas annotations; whether they changed.
fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    let a = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (k, v) in [(DESIRED_REPLICAS, desired), (MAX_REPLICAS, max)] {
        let v = v.to_string();
        if a.get(k) != Some(&v) {
            a.insert(k.to_owned(), v);
            changed = true;
        }
    }
    changed
}

/// deploymentutil.SetNewReplicaSetAnnotations: the Deployment's own annotations (but
/// upstream's skipped ones) and the revision; whether anything changed.
fn set_new_rs_annotations(
    d: &Deployment,
    rs: &mut ReplicaSet,
    new_revision: i64,
    exists: bool,
) -> bool {
    let mut changed = false;
    let a = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in d.metadata.annotations.iter().flatten() {
        if [
            LAST_APPLIED,
            REVISION,
            REVISION_HISTORY,
            DESIRED_REPLICAS,
            MAX_REPLICAS,
            ROLLBACK_TO,
        ]
        .contains(&k.as_str())
        {
            continue;
        }
        if a.get(k) != Some(v) {
            a.insert(k.clone(), v.clone());
            changed = true;
        }
    }
    let old_text = a.get(REVISION).cloned();
    let old: i64 = match old_text.as_deref() {
        None | Some("") => 0,
        Some(t) => match t.parse() {
            Ok(v) => v,
            // Not a number: upstream leaves the ReplicaSet alone.
            Err(_) => return false,
        },
    };
    if old < new_revision {
        a.insert(REVISION.into(), new_revision.to_string());
        changed = true;
        // A rollback to this ReplicaSet: remember the revisions it had, at most
        // MAX_REVISION_HISTORY_CHARS characters (the oldest go first).
        if let Some(prev) = old_text {
            let history = a.get(REVISION_HISTORY).cloned().unwrap_or_default();
            let value = if history.is_empty() {
                Some(prev)
            } else {
                let mut parts: Vec<&str> = history.split(',').collect();
                let mut total = history.len() + prev.len() + 1;
                let mut start = 0;
                while total > MAX_REVISION_HISTORY_CHARS && start < parts.len() {
                    total -= parts[start].len() + 1;
                    start += 1;
                }
                (total <= MAX_REVISION_HISTORY_CHARS).then(|| {
                    parts.drain(..start);
                    parts.push(&prev);
                    parts.join(",")
                })
            };
            if let Some(v) = value {
                a.insert(REVISION_HISTORY.into(), v);
            }
        }
    }
    if !exists {
        changed |= set_replicas_annotations(rs, desired(d), desired(d) + max_surge(d));
    }
    changed
}

/// deploymentutil.DeploymentComplete.
fn complete(d: &Deployment, s: &DeploymentStatus) -> bool {
    let n = desired(d);
    s.updated_replicas.unwrap_or(0) == n
        && s.replicas.unwrap_or(0) == n
        && s.available_replicas.unwrap_or(0) == n
        && s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
}

/// deploymentutil.DeploymentProgressing: more updated, ready or available pods, or fewer old.
fn progressing(d: &Deployment, s: &DeploymentStatus) -> bool {
    let o = d.status.clone().unwrap_or_default();
    let old_of = |s: &DeploymentStatus| s.replicas.unwrap_or(0) - s.updated_replicas.unwrap_or(0);
    s.updated_replicas.unwrap_or(0) > o.updated_replicas.unwrap_or(0)
        || old_of(s) < old_of(&o)
        || s.ready_replicas.unwrap_or(0) > o.ready_replicas.unwrap_or(0)
        || s.available_replicas.unwrap_or(0) > o.available_replicas.unwrap_or(0)
}

/// deploymentutil.DeploymentTimedOut.
fn timed_out(d: &Deployment, s: &DeploymentStatus) -> bool {
    if !has_progress_deadline(d) {
        return false;
    }
    let Some(c) = condition(s, "Progressing") else {
        return false;
    };
    match c.reason.as_deref() {
        Some(NEW_RS_AVAILABLE) => false,
        Some(TIMED_OUT) => true,
        _ => {
            let from = c.last_update_time.as_ref().map_or(0, |t| t.0.as_second());
            let deadline = i64::from(d.spec.progress_deadline_seconds.unwrap_or(600));
            Timestamp::now().as_second() > from + deadline
        }
    }
}

/// The status the ReplicaSets add up to (calculateStatus).
fn calculate_status(
    all: &[&ReplicaSet],
    new_rs: Option<&ReplicaSet>,
    d: &Deployment,
) -> DeploymentStatus {
    let sum = |f: &dyn Fn(&ReplicaSet) -> i32| all.iter().map(|rs| f(rs)).sum::<i32>();
    let available = sum(&|rs| status_of(rs).2);
    let total = sum(&replicas);
    let old = d.status.clone().unwrap_or_default();
    let mut s = DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: Some(sum(&|rs| status_of(rs).0)),
        updated_replicas: Some(new_rs.map_or(0, |rs| status_of(rs).0)),
        ready_replicas: Some(sum(&|rs| status_of(rs).1)),
        available_replicas: Some(available),
        unavailable_replicas: Some((total - available).max(0)),
        terminating_replicas: Some(sum(&|rs| status_of(rs).3)),
        collision_count: old.collision_count,
        conditions: old.conditions.clone(),
    };
    if available >= desired(d) - max_unavailable(d) {
        set_condition(
            &mut s,
            new_condition(
                "Available",
                "True",
                MIN_AVAILABLE,
                "Deployment has minimum availability.".into(),
            ),
        );
    } else {
        set_condition(
            &mut s,
            new_condition(
                "Available",
                "False",
                MIN_UNAVAILABLE,
                "Deployment does not have minimum availability.".into(),
            ),
        );
    }
    s
}

fn sort_by_creation(v: &mut [&ReplicaSet]) {
    v.sort_by(|a, b| {
        let ta = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let tb = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
        ta.cmp(&tb).then(a.metadata.name.cmp(&b.metadata.name))
    });
}

// ---------------------------------------------------------------------------------------
// The sync.

type Res<T> = Result<T, SyncError>;

impl Ctl {
    fn rs_api(&self, ns: &str) -> Api<ReplicaSet> {
        Api::namespaced(self.client.get(), ns)
    }

    fn d_api(&self, ns: &str) -> Api<Deployment> {
        Api::namespaced(self.client.get(), ns)
    }

    async fn sync(&self, key: &str) -> Res<()> {
        let Some(d) = self.deployments.get(key) else {
            return Ok(());
        };
        let mut d = (*d).clone();
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        if selector_is_empty(Some(&d.spec.selector)) {
            record_event(
                &self.client,
                COMPONENT,
                &d,
                "Warning",
                "SelectingAll",
                "This deployment is selecting all pods. A non-empty selector is required.".into(),
            )
            .await;
            let st = d.status.clone().unwrap_or_default();
            if st.observed_generation.unwrap_or(0) < d.metadata.generation.unwrap_or(0) {
                let mut st = st;
                st.observed_generation = d.metadata.generation;
                self.write_status(&mut d, st).await?;
            }
            return Ok(());
        }
        let mut sets = self.claim_replica_sets(&d, &ns).await?;
        if d.metadata.deletion_timestamp.is_some() {
            return self.sync_status_only(&mut d, &mut sets).await;
        }
        self.check_paused_conditions(&mut d).await?;
        if d.spec.paused == Some(true) {
            return self.sync_scale(&mut d, &mut sets).await;
        }
        if self.is_scaling_event(&d, &sets) {
            return self.sync_scale(&mut d, &mut sets).await;
        }
        if is_rolling(&d) {
            self.rollout_rolling(&mut d, &mut sets).await
        } else {
            self.rollout_recreate(&mut d, &mut sets).await
        }
    }

    /// The ReplicaSets this Deployment controls, adopting matching orphans and releasing
    /// those that stopped matching (getReplicaSetsForDeployment).
    async fn claim_replica_sets(&self, d: &Deployment, ns: &str) -> Res<Vec<ReplicaSet>> {
        let uid = d.metadata.uid.clone().unwrap_or_default();
        let deleting = d.metadata.deletion_timestamp.is_some();
        let api = self.rs_api(ns);
        let mut out = Vec::new();
        let mut checked = false;
        for rs in self.sets.list() {
            if rs.metadata.namespace.as_deref() != Some(ns) {
                continue;
            }
            let matches = selector_matches(&d.spec.selector, rs.metadata.labels.as_ref());
            let name = rs.metadata.name.clone().unwrap_or_default();
            match controller_of(&rs.metadata) {
                Some(r) if r.uid == uid => {
                    if matches || deleting {
                        out.push((*rs).clone());
                    } else {
                        let p = release_patch(&rs.metadata, &uid);
                        match api
                            .patch(&name, &PatchParams::default(), &Patch::Merge(&p))
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
                    if !matches || deleting || rs.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    if !checked {
                        let fresh = self
                            .d_api(ns)
                            .get(d.metadata.name.as_deref().unwrap_or_default())
                            .await?;
                        if fresh.metadata.uid != d.metadata.uid
                            || fresh.metadata.deletion_timestamp.is_some()
                        {
                            break;
                        }
                        checked = true;
                    }
                    let p = adopt_patch(&rs.metadata, controller_ref(d));
                    match api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&p))
                        .await
                    {
                        Ok(rs) => out.push(rs),
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(out)
    }

    /// Writes `status` unless it is what the Deployment has; `d` gets the answer.
    async fn write_status(&self, d: &mut Deployment, mut status: DeploymentStatus) -> Res<()> {
        // Upstream's counters are omitempty: zero is written as absent.
        for f in [
            &mut status.replicas,
            &mut status.updated_replicas,
            &mut status.ready_replicas,
            &mut status.available_replicas,
            &mut status.unavailable_replicas,
        ] {
            if *f == Some(0) {
                *f = None;
            }
        }
        if status.observed_generation == Some(0) {
            status.observed_generation = None;
        }
        if status.conditions.as_ref().is_some_and(|c| c.is_empty()) {
            status.conditions = None;
        }
        if d.status.as_ref() == Some(&status) {
            return Ok(());
        }
        // An update of the status subresource (the bootstrap role grants update, not
        // patch), guarded by the resourceVersion we read.
        let mut obj = d.clone();
        obj.status = Some(status);
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let name = d.metadata.name.clone().unwrap_or_default();
        *d = self
            .d_api(&ns)
            .replace_status(&name, &PostParams::default(), &obj)
            .await?;
        Ok(())
    }

    async fn check_paused_conditions(&self, d: &mut Deployment) -> Res<()> {
        if !has_progress_deadline(d) {
            return Ok(());
        }
        let mut st = d.status.clone().unwrap_or_default();
        let reason = condition(&st, "Progressing").and_then(|c| c.reason.clone());
        if reason.as_deref() == Some(TIMED_OUT) {
            return Ok(());
        }
        let paused_cond = reason.as_deref() == Some(PAUSED);
        let paused = d.spec.paused == Some(true);
        if paused && !paused_cond {
            set_condition(
                &mut st,
                new_condition(
                    "Progressing",
                    "Unknown",
                    PAUSED,
                    "Deployment is paused".into(),
                ),
            );
        } else if !paused && paused_cond {
            set_condition(
                &mut st,
                new_condition(
                    "Progressing",
                    "Unknown",
                    RESUMED,
                    "Deployment is resumed".into(),
                ),
            );
        } else {
            return Ok(());
        }
        self.write_status(d, st).await
    }

    /// Whether the Deployment was only scaled (an active ReplicaSet's desired-replicas
    /// annotation differs from the Deployment's replicas).
    fn is_scaling_event(&self, d: &Deployment, sets: &[ReplicaSet]) -> bool {
        let n = desired(d).to_string();
        let new_idx = self.find_new(d, sets);
        sets.iter()
            .enumerate()
            .filter(|(i, rs)| Some(*i) == new_idx || replicas(rs) > 0)
            .filter(|(_, rs)| replicas(rs) > 0)
            .any(|(_, rs)| annotation(&rs.metadata, DESIRED_REPLICAS).is_some_and(|v| v != n))
    }

    /// The index of the ReplicaSet whose template is the Deployment's (the oldest such).
    fn find_new(&self, d: &Deployment, sets: &[ReplicaSet]) -> Option<usize> {
        let mut idx: Vec<usize> = (0..sets.len()).collect();
        idx.sort_by(|a, b| {
            let (a, b) = (&sets[*a], &sets[*b]);
            let ta = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let tb = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
            ta.cmp(&tb).then(a.metadata.name.cmp(&b.metadata.name))
        });
        idx.into_iter().find(|i| {
            sets[*i]
                .spec
                .template
                .as_ref()
                .is_some_and(|t| equal_ignore_hash(t, &d.spec.template))
        })
    }

    /// getAllReplicaSetsAndSyncRevision: the index of the new ReplicaSet (created when
    /// asked and missing), with its revision and the Deployment's brought up to date.
    async fn sync_revision(
        &self,
        d: &mut Deployment,
        sets: &mut Vec<ReplicaSet>,
        create: bool,
    ) -> Res<Option<usize>> {
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let dname = d.metadata.name.clone().unwrap_or_default();
        let new_idx = self.find_new(d, sets);
        let max_old = sets
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != new_idx)
            .map(|(_, rs)| revision(rs))
            .max()
            .unwrap_or(0);
        let new_revision = max_old + 1;
        if let Some(i) = new_idx {
            let mut copy = sets[i].clone();
            let changed = set_new_rs_annotations(d, &mut copy, new_revision, true);
            let mrs_changed = copy.spec.min_ready_seconds != d.spec.min_ready_seconds;
            if changed || mrs_changed {
                copy.spec.min_ready_seconds = d.spec.min_ready_seconds;
                let name = copy.metadata.name.clone().unwrap_or_default();
                let p = json!({"metadata": {"annotations": copy.metadata.annotations,
                    "resourceVersion": copy.metadata.resource_version},
                    "spec": {"minReadySeconds": copy.spec.min_ready_seconds}});
                sets[i] = self
                    .rs_api(&ns)
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&p))
                    .await?;
            }
            let rev = annotation(&sets[i].metadata, REVISION).map(str::to_owned);
            self.set_deployment_revision(d, rev).await?;
            if has_progress_deadline(d)
                && condition(&d.status.clone().unwrap_or_default(), "Progressing").is_none()
            {
                let mut st = d.status.clone().unwrap_or_default();
                let msg = format!(
                    "Found new replica set {:?}",
                    sets[i].metadata.name.as_deref().unwrap_or_default()
                );
                set_condition(
                    &mut st,
                    new_condition("Progressing", "True", FOUND_NEW_RS, msg),
                );
                self.write_status(d, st).await?;
            }
            return Ok(Some(i));
        }
        if !create {
            return Ok(None);
        }

        // A new ReplicaSet.
        let collision = d.status.as_ref().and_then(|s| s.collision_count);
        let hash = compute_hash(&d.spec.template, collision);
        let mut template = d.spec.template.clone();
        template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let mut selector = d.spec.selector.clone();
        selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let name = format!("{dname}-{hash}");
        let mut rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                owner_references: Some(vec![controller_ref(d)]),
                labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                ..Default::default()
            },
            spec: ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: d.spec.min_ready_seconds,
                selector,
                template: Some(template),
            },
            status: None,
        };
        set_new_rs_annotations(d, &mut rs, new_revision, false);
        let all: Vec<&ReplicaSet> = sets.iter().collect();
        let n = new_rs_new_replicas(d, &all, &rs);
        rs.spec.replicas = Some(n);
        let created = match self.rs_api(&ns).create(&PostParams::default(), &rs).await {
            Ok(c) => c,
            Err(e) if is_already_exists(&e) => {
                // Either our own (the cache lags) or a hash collision.
                let existing = self.rs_api(&ns).get(&name).await?;
                let ours = controller_of(&existing.metadata).map(|r| r.uid.as_str())
                    == d.metadata.uid.as_deref();
                if ours
                    && existing
                        .spec
                        .template
                        .as_ref()
                        .is_some_and(|t| equal_ignore_hash(t, &d.spec.template))
                {
                    sets.push(existing);
                    return Ok(Some(sets.len() - 1));
                }
                let mut st = d.status.clone().unwrap_or_default();
                st.collision_count = Some(collision.unwrap_or(0).saturating_add(1));
                self.write_status(d, st).await?;
                return Err(SyncError::Failed(format!(
                    "hash collision for ReplicaSet {name:?}; collisionCount raised"
                )));
            }
            Err(e) => {
                let msg = format!("Failed to create new replica set {name:?}: {}", message(&e));
                if has_progress_deadline(d) {
                    let mut st = d.status.clone().unwrap_or_default();
                    set_condition(
                        &mut st,
                        new_condition("Progressing", "False", FAILED_RS_CREATE, msg.clone()),
                    );
                    self.write_status(d, st).await?;
                }
                record_event(
                    &self.client,
                    COMPONENT,
                    d,
                    "Warning",
                    FAILED_RS_CREATE,
                    msg.clone(),
                )
                .await;
                return Err(SyncError::Failed(msg));
            }
        };
        if n > 0 {
            record_event(
                &self.client,
                COMPONENT,
                d,
                "Normal",
                "ScalingReplicaSet",
                format!("Scaled up replica set {name} from 0 to {n}"),
            )
            .await;
        }
        self.set_deployment_revision(d, Some(new_revision.to_string()))
            .await?;
        if has_progress_deadline(d) {
            let mut st = d.status.clone().unwrap_or_default();
            set_condition(
                &mut st,
                new_condition(
                    "Progressing",
                    "True",
                    NEW_RS_CREATED,
                    format!("Created new replica set {name:?}"),
                ),
            );
            self.write_status(d, st).await?;
        }
        sets.push(created);
        Ok(Some(sets.len() - 1))
    }

    /// Puts the new ReplicaSet's revision on the Deployment.
    async fn set_deployment_revision(&self, d: &mut Deployment, rev: Option<String>) -> Res<()> {
        let Some(rev) = rev else { return Ok(()) };
        if annotation(&d.metadata, REVISION) == Some(rev.as_str()) {
            return Ok(());
        }
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let name = d.metadata.name.clone().unwrap_or_default();
        let mut obj = d.clone();
        obj.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(REVISION.into(), rev);
        // Upstream writes the annotation through the status subresource (whose strategy
        // keeps annotation changes), so the generation does not move; a server that drops
        // metadata changes there gets a plain update.
        let status = d.status.clone();
        *d = self
            .d_api(&ns)
            .replace_status(&name, &PostParams::default(), &obj)
            .await?;
        if annotation(&d.metadata, REVISION) != annotation(&obj.metadata, REVISION) {
            let mut again = d.clone();
            again.metadata.annotations = obj.metadata.annotations.clone();
            *d = self
                .d_api(&ns)
                .replace(&name, &PostParams::default(), &again)
                .await?;
        }
        // Keep the status we are working on if the answer carries none.
        if d.status.is_none() {
            d.status = status;
        }
        Ok(())
    }

    /// Scales `rs` to `n` and refreshes its replicas annotations; whether its size changed.
    async fn scale_rs(&self, rs: &mut ReplicaSet, n: i32, d: &Deployment) -> Res<bool> {
        let old = replicas(rs);
        let mut copy = rs.clone();
        let ann = set_replicas_annotations(&mut copy, desired(d), desired(d) + max_surge(d));
        if old == n && !ann {
            return Ok(false);
        }
        let ns = rs.metadata.namespace.clone().unwrap_or_default();
        let name = rs.metadata.name.clone().unwrap_or_default();
        let p = json!({"metadata": {"annotations": copy.metadata.annotations,
            "resourceVersion": rs.metadata.resource_version},
            "spec": {"replicas": n}});
        *rs = self
            .rs_api(&ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&p))
            .await?;
        if old != n {
            let op = if old < n { "up" } else { "down" };
            record_event(
                &self.client,
                COMPONENT,
                d,
                "Normal",
                "ScalingReplicaSet",
                format!("Scaled {op} replica set {name} from {old} to {n}"),
            )
            .await;
        }
        Ok(old != n)
    }

    /// sync: scaling (also when paused) and cleanup, then the status.
    async fn sync_scale(&self, d: &mut Deployment, sets: &mut Vec<ReplicaSet>) -> Res<()> {
        let new_idx = self.sync_revision(d, sets, false).await?;
        self.scale(d, sets, new_idx).await?;
        if d.spec.paused == Some(true) {
            self.cleanup(d, sets, new_idx).await?;
        }
        let all: Vec<&ReplicaSet> = sets.iter().collect();
        let st = calculate_status(&all, new_idx.map(|i| &sets[i]), d);
        self.write_status(d, st).await
    }

    async fn sync_status_only(&self, d: &mut Deployment, sets: &mut Vec<ReplicaSet>) -> Res<()> {
        let new_idx = self.sync_revision(d, sets, false).await?;
        let all: Vec<&ReplicaSet> = sets.iter().collect();
        let st = calculate_status(&all, new_idx.map(|i| &sets[i]), d);
        self.write_status(d, st).await
    }

    /// Proportional scaling (scale()).
    async fn scale(
        &self,
        d: &Deployment,
        sets: &mut [ReplicaSet],
        new_idx: Option<usize>,
    ) -> Res<()> {
        let active: Vec<usize> = (0..sets.len())
            .filter(|i| replicas(&sets[*i]) > 0)
            .collect();
        // FindActiveOrLatest.
        let target = match active.len() {
            0 => new_idx.or_else(|| {
                (0..sets.len())
                    .max_by_key(|i| sets[*i].metadata.creation_timestamp.as_ref().map(|t| t.0))
            }),
            1 => Some(active[0]),
            _ => None,
        };
        if let Some(i) = target {
            if replicas(&sets[i]) != desired(d) {
                self.scale_rs(&mut sets[i], desired(d), d).await?;
            }
            return Ok(());
        }
        // A saturated new ReplicaSet: the old ones go to zero.
        if let Some(n) = new_idx {
            let rs = &sets[n];
            let saturated = annotation(&rs.metadata, DESIRED_REPLICAS)
                == Some(desired(d).to_string().as_str())
                && replicas(rs) == desired(d)
                && status_of(rs).2 == desired(d);
            if saturated {
                for i in active.iter().copied().filter(|i| *i != n) {
                    self.scale_rs(&mut sets[i], 0, d).await?;
                }
                return Ok(());
            }
        }
        if !is_rolling(d) {
            return Ok(());
        }
        let mut order = active.clone();
        if let Some(n) = new_idx {
            if !order.contains(&n) {
                order.push(n);
            }
        }
        let total: i32 = order.iter().map(|i| replicas(&sets[*i])).sum();
        let allowed = if desired(d) > 0 {
            desired(d) + max_surge(d)
        } else {
            0
        };
        let to_add = allowed - total;
        let created = |i: &usize| sets[*i].metadata.creation_timestamp.as_ref().map(|t| t.0);
        if to_add > 0 {
            // Larger first; equal sizes: newer first.
            order.sort_by(|a, b| {
                replicas(&sets[*b])
                    .cmp(&replicas(&sets[*a]))
                    .then(created(b).cmp(&created(a)))
            });
        } else if to_add < 0 {
            // Larger first; equal sizes: older first.
            order.sort_by(|a, b| {
                replicas(&sets[*b])
                    .cmp(&replicas(&sets[*a]))
                    .then(created(a).cmp(&created(b)))
            });
        }
        let mut sizes: Vec<i32> = Vec::new();
        let mut added = 0;
        for i in &order {
            let rs = &sets[*i];
            if to_add == 0 {
                sizes.push(replicas(rs));
                continue;
            }
            // GetReplicaSetProportion.
            let fraction = if desired(d) == 0 {
                -replicas(rs)
            } else {
                let dep_replicas = desired(d) + max_surge(d);
                let annotated = annotation(&rs.metadata, MAX_REPLICAS)
                    .and_then(|v| v.parse::<i32>().ok())
                    .unwrap_or(d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0));
                if annotated == 0 {
                    0
                } else {
                    let size =
                        f64::from(replicas(rs)) * f64::from(dep_replicas) / f64::from(annotated);
                    size.round() as i32 - replicas(rs)
                }
            };
            let allowed_left = to_add - added;
            let p = if to_add > 0 {
                fraction.min(allowed_left)
            } else {
                fraction.max(allowed_left)
            };
            sizes.push(replicas(rs) + p);
            added += p;
        }
        for (k, i) in order.iter().enumerate() {
            let mut size = sizes[k];
            if k == 0 && to_add != 0 {
                size = (size + to_add - added).max(0);
            }
            self.scale_rs(&mut sets[*i], size, d).await?;
        }
        Ok(())
    }

    /// Deletes the oldest unused ReplicaSets beyond revisionHistoryLimit.
    async fn cleanup(
        &self,
        d: &Deployment,
        sets: &[ReplicaSet],
        new_idx: Option<usize>,
    ) -> Res<()> {
        let Some(limit) = d.spec.revision_history_limit else {
            return Ok(());
        };
        let mut old: Vec<&ReplicaSet> = sets
            .iter()
            .enumerate()
            .filter(|(i, rs)| Some(*i) != new_idx && rs.metadata.deletion_timestamp.is_none())
            .map(|(_, rs)| rs)
            .collect();
        let diff = old.len() as i64 - i64::from(limit);
        if diff <= 0 {
            return Ok(());
        }
        sort_by_creation(&mut old);
        old.sort_by_key(|rs| revision(rs));
        for rs in old.into_iter().take(diff as usize) {
            let st = rs.status.clone().unwrap_or_default();
            if st.replicas != 0
                || replicas(rs) != 0
                || rs.metadata.generation.unwrap_or(0) > st.observed_generation.unwrap_or(0)
            {
                continue;
            }
            let ns = rs.metadata.namespace.clone().unwrap_or_default();
            let name = rs.metadata.name.clone().unwrap_or_default();
            match self
                .rs_api(&ns)
                .delete(&name, &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// syncRolloutStatus: the status with the Progressing condition estimated.
    async fn sync_rollout_status(
        &self,
        d: &mut Deployment,
        sets: &[ReplicaSet],
        new_idx: Option<usize>,
    ) -> Res<()> {
        let all: Vec<&ReplicaSet> = sets.iter().collect();
        let new_rs = new_idx.map(|i| &sets[i]);
        let mut st = calculate_status(&all, new_rs, d);
        if !has_progress_deadline(d) {
            remove_condition(&mut st, "Progressing");
        }
        let cur = d
            .status
            .as_ref()
            .and_then(|s| condition(s, "Progressing"))
            .cloned();
        let is_complete = st.replicas == st.updated_replicas
            && cur.as_ref().and_then(|c| c.reason.as_deref()) == Some(NEW_RS_AVAILABLE);
        let rs_name = new_rs.and_then(|rs| rs.metadata.name.clone());
        let dname = d.metadata.name.clone().unwrap_or_default();
        if has_progress_deadline(d) && !is_complete {
            if complete(d, &st) {
                let msg = match &rs_name {
                    Some(n) => format!("ReplicaSet {n:?} has successfully progressed."),
                    None => format!("Deployment {dname:?} has successfully progressed."),
                };
                set_condition(
                    &mut st,
                    new_condition("Progressing", "True", NEW_RS_AVAILABLE, msg),
                );
            } else if progressing(d, &st) {
                let msg = match &rs_name {
                    Some(n) => format!("ReplicaSet {n:?} is progressing."),
                    None => format!("Deployment {dname:?} is progressing."),
                };
                let mut c = new_condition("Progressing", "True", REPLICA_SET_UPDATED, msg);
                if let Some(cur) = &cur {
                    if cur.status.as_deref() == Some("True") {
                        c.last_transition_time = cur.last_transition_time.clone();
                    }
                    remove_condition(&mut st, "Progressing");
                }
                set_condition(&mut st, c);
            } else if timed_out(d, &st) {
                let msg = match &rs_name {
                    Some(n) => format!("ReplicaSet {n:?} has timed out progressing."),
                    None => format!("Deployment {dname:?} has timed out progressing."),
                };
                set_condition(
                    &mut st,
                    new_condition("Progressing", "False", TIMED_OUT, msg),
                );
            }
        }
        // The ReplicaSets' failures (the new one's first) become the Deployment's.
        let failure = new_rs
            .into_iter()
            .chain(all.iter().copied())
            .filter_map(|rs| {
                rs.status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .find(|c| c.type_.as_deref() == Some("ReplicaFailure"))
                    .cloned()
            })
            .next();
        match failure {
            Some(f) => set_condition(
                &mut st,
                DeploymentCondition {
                    type_: f.type_,
                    status: f.status,
                    reason: f.reason,
                    message: f.message,
                    last_update_time: f.last_transition_time.clone(),
                    last_transition_time: f.last_transition_time,
                },
            ),
            None => remove_condition(&mut st, "ReplicaFailure"),
        }
        // A rollout in progress is looked at again when its deadline passes.
        if has_progress_deadline(d) && !complete(d, &st) {
            if let Some(c) = condition(&st, "Progressing") {
                if c.reason.as_deref() == Some(REPLICA_SET_UPDATED) {
                    let from = c.last_update_time.as_ref().map_or(0, |t| t.0.as_second());
                    let at = from + i64::from(d.spec.progress_deadline_seconds.unwrap_or(600));
                    let left = (at - Timestamp::now().as_second()).max(0) as u64 + 1;
                    self.queue.add_after(key_of(d), Duration::from_secs(left));
                }
            }
        }
        self.write_status(d, st).await
    }

    async fn rollout_rolling(&self, d: &mut Deployment, sets: &mut Vec<ReplicaSet>) -> Res<()> {
        let Some(n) = self.sync_revision(d, sets, true).await? else {
            return Ok(());
        };
        // reconcileNewReplicaSet.
        let want = {
            let all: Vec<&ReplicaSet> = sets.iter().collect();
            let cur = replicas(&sets[n]);
            if cur == desired(d) {
                cur
            } else if cur > desired(d) {
                desired(d)
            } else {
                new_rs_new_replicas(d, &all, &sets[n])
            }
        };
        if want != replicas(&sets[n]) {
            let up = want > replicas(&sets[n]);
            self.scale_rs(&mut sets[n], want, d).await?;
            if up {
                return self.sync_rollout_status(d, sets, Some(n)).await;
            }
        }
        // reconcileOldReplicaSets.
        if self.reconcile_old(d, sets, n).await? {
            return self.sync_rollout_status(d, sets, Some(n)).await;
        }
        let all: Vec<&ReplicaSet> = sets.iter().collect();
        let st = calculate_status(&all, Some(&sets[n]), d);
        if complete(d, &st) {
            self.cleanup(d, sets, Some(n)).await?;
        }
        self.sync_rollout_status(d, sets, Some(n)).await
    }

    /// Scales old ReplicaSets down as far as maxUnavailable allows; whether any was.
    async fn reconcile_old(&self, d: &Deployment, sets: &mut [ReplicaSet], n: usize) -> Res<bool> {
        let old_idx: Vec<usize> = (0..sets.len())
            .filter(|i| *i != n && replicas(&sets[*i]) > 0)
            .collect();
        let old_pods: i32 = old_idx.iter().map(|i| replicas(&sets[*i])).sum();
        if old_pods == 0 {
            return Ok(false);
        }
        let all_pods: i32 = sets.iter().map(replicas).sum();
        let min_available = desired(d) - max_unavailable(d);
        let new_unavailable = replicas(&sets[n]) - status_of(&sets[n]).2;
        let mut max_scaled_down = all_pods - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return Ok(false);
        }
        let mut order = old_idx.clone();
        order.sort_by_key(|i| {
            (
                sets[*i].metadata.creation_timestamp.as_ref().map(|t| t.0),
                sets[*i].metadata.name.clone(),
            )
        });
        // cleanupUnhealthyReplicas: unavailable old pods go first.
        let mut cleaned = 0;
        for i in &order {
            if cleaned >= max_scaled_down {
                break;
            }
            let r = replicas(&sets[*i]);
            let avail = status_of(&sets[*i]).2;
            if r == 0 || r == avail {
                continue;
            }
            let down = (max_scaled_down - cleaned).min(r - avail);
            self.scale_rs(&mut sets[*i], r - down, d).await?;
            cleaned += down;
        }
        max_scaled_down -= cleaned;
        // scaleDownOldReplicaSetsForRollingUpdate.
        let available: i32 = sets.iter().map(|rs| status_of(rs).2).sum();
        let mut scaled = 0;
        if available > min_available && max_scaled_down > 0 {
            let total = (available - min_available).min(max_scaled_down);
            for i in &order {
                if scaled >= total {
                    break;
                }
                let r = replicas(&sets[*i]);
                if r == 0 {
                    continue;
                }
                let down = r.min(total - scaled);
                self.scale_rs(&mut sets[*i], r - down, d).await?;
                scaled += down;
            }
        }
        Ok(cleaned + scaled > 0)
    }

    async fn rollout_recreate(&self, d: &mut Deployment, sets: &mut Vec<ReplicaSet>) -> Res<()> {
        let mut new_idx = self.sync_revision(d, sets, false).await?;
        // Scale every old ReplicaSet down first.
        let mut scaled_down = false;
        for (i, rs) in sets.iter_mut().enumerate() {
            if Some(i) != new_idx && replicas(rs) > 0 {
                scaled_down |= self.scale_rs(rs, 0, d).await?;
            }
        }
        if scaled_down {
            return self.sync_rollout_status(d, sets, new_idx).await;
        }
        // Wait for the old pods to be gone.
        let old_uids: Vec<String> = sets
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != new_idx)
            .filter_map(|(_, rs)| rs.metadata.uid.clone())
            .collect();
        let old_running = sets
            .iter()
            .enumerate()
            .any(|(i, rs)| Some(i) != new_idx && status_of(rs).0 > 0)
            || self.pods.list().iter().any(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                controller_of(&p.metadata).is_some_and(|r| old_uids.contains(&r.uid))
                    && phase != Some("Failed")
                    && phase != Some("Succeeded")
            });
        if old_running {
            return self.sync_rollout_status(d, sets, new_idx).await;
        }
        if new_idx.is_none() {
            new_idx = self.sync_revision(d, sets, true).await?;
        }
        if let Some(n) = new_idx {
            if replicas(&sets[n]) != desired(d) {
                self.scale_rs(&mut sets[n], desired(d), d).await?;
                return self.sync_rollout_status(d, sets, new_idx).await;
            }
        }
        let all: Vec<&ReplicaSet> = sets.iter().collect();
        let st = calculate_status(&all, new_idx.map(|i| &sets[i]), d);
        if complete(d, &st) {
            self.cleanup(d, sets, new_idx).await?;
        }
        self.sync_rollout_status(d, sets, new_idx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};

    #[test]
    fn hash_uses_the_safe_alphabet_and_the_collision_count() {
        let t = PodTemplateSpec::default();
        let a = compute_hash(&t, None);
        assert!(!a.is_empty());
        assert!(
            a.bytes()
                .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)),
            "{a}"
        );
        assert_eq!(a, compute_hash(&t, None));
        assert_ne!(a, compute_hash(&t, Some(1)));
        // FNV-32a of "a" is 0xe40c292c (Go's hash/fnv).
        assert_eq!(fnv32a(b"a", 0x811c_9dc5), 0xe40c_292c);
    }

    fn dep(replicas: i32, surge: Option<IntOrString>, unavail: Option<IntOrString>) -> Deployment {
        Deployment {
            spec: DeploymentSpec {
                replicas: Some(replicas),
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_surge: surge,
                        max_unavailable: unavail,
                    }),
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn fenceposts_round_surge_up_and_unavailable_down() {
        let pct = |s: &str| Some(IntOrString::String(s.into()));
        let d = dep(10, pct("25%"), pct("25%"));
        assert_eq!((max_surge(&d), max_unavailable(&d)), (3, 2));
        let d = dep(1, pct("25%"), pct("25%"));
        assert_eq!((max_surge(&d), max_unavailable(&d)), (1, 0));
        // Both zero: one may be unavailable.
        let d = dep(3, Some(IntOrString::Int(0)), Some(IntOrString::Int(0)));
        assert_eq!((max_surge(&d), max_unavailable(&d)), (0, 1));
        let d = dep(4, None, None);
        assert_eq!((max_surge(&d), max_unavailable(&d)), (1, 1));
    }
}
