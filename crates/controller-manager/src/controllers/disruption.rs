//! disruption-controller: keeps each PodDisruptionBudget's status (expectedPods,
//! currentHealthy, desiredHealthy, disruptionsAllowed, disruptedPods, observedGeneration and
//! the DisruptionAllowed condition) in line with the pods it selects, as upstream's
//! DisruptionController. The API server's eviction subresource reads that status to allow
//! or refuse an eviction, and records the pods it evicted in `status.disruptedPods`; this
//! controller drops those entries once the pod is being deleted, or after the 2 min
//! DeletionTimeout when it never was.
//!
//! For a percentage (or `maxUnavailable`) the expected count is the summed scale of the
//! pods' controllers: ReplicationController, Deployment (through its ReplicaSet),
//! ReplicaSet, StatefulSet, or anything with a scale subresource. A sync that fails sets
//! disruptionsAllowed to 0 with the SyncFailed reason (upstream's failSafe).
//!
//! A second queue resets a pod's DisruptionTarget condition to False when it was set (by an
//! eviction or preemption) but the pod was not deleted within 2 min.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, PodCondition, ReplicationController};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, OwnerReference, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::replicaset::{controller_of, pod_ready, selector_matches};
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_conflict, is_not_found, message};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers, run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::WorkQueue;

/// How long a pod listed in `status.disruptedPods` may take to be marked for deletion
/// (upstream's DeletionTimeout).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a DisruptionTarget condition may stay on a pod that is not being deleted.
pub const STALE_POD_DISRUPTION_TIMEOUT: Duration = Duration::from_secs(120);
/// The event source upstream's recorder uses.
const COMPONENT: &str = "controllermanager";
/// The ServiceAccount the controller acts as.
const SERVICE_ACCOUNT: &str = "disruption-controller";
/// --concurrent-disruption-syncs.
const WORKERS: usize = 1;

const CONDITION: &str = "DisruptionAllowed";
const SUFFICIENT: &str = "SufficientPods";
const INSUFFICIENT: &str = "InsufficientPods";
const SYNC_FAILED: &str = "SyncFailed";

/// Why a PDB sync failed: a write conflict is retried as is, anything else goes through
/// the fail-safe status.
enum TryError {
    Conflict(String),
    Other(String),
}

impl From<kube::Error> for TryError {
    fn from(e: kube::Error) -> Self {
        if is_conflict(&e) {
            TryError::Conflict(message(&e))
        } else {
            TryError::Other(message(&e))
        }
    }
}

struct Ctl {
    client: ClientSource,
    pdbs: Arc<Informer<PodDisruptionBudget>>,
    pods: Arc<Informer<Pod>>,
    rcs: Arc<Informer<ReplicationController>>,
    rss: Arc<Informer<ReplicaSet>>,
    deployments: Arc<Informer<Deployment>>,
    statefulsets: Arc<Informer<StatefulSet>>,
    queue: Arc<WorkQueue<String>>,
    stale: Arc<WorkQueue<String>>,
    /// Pods already told they match several budgets (uid → chosen budget).
    multiple: Mutex<HashMap<String, String>>,
}

/// The label selector of a budget as a predicate; a missing selector selects nothing
/// (metav1.LabelSelectorAsSelector of nil), an empty one everything.
fn pdb_selects(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    pdb.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|sel| selector_matches(sel, pod.metadata.labels.as_ref()))
}

/// The budgets in the pod's namespace selecting it, ordered by name.
fn pdbs_for_pod(pdbs: &Informer<PodDisruptionBudget>, pod: &Pod) -> Vec<Arc<PodDisruptionBudget>> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    pdbs.list()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns) && pdb_selects(p, pod))
        .collect()
}

/// Whether the pod has a DisruptionTarget condition that goes stale when the pod is not
/// deleted, and how long until it is stale (nonTerminatingPodHasStaleDisruptionCondition).
fn stale_disruption_condition(pod: &Pod, now: Timestamp) -> Option<Duration> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let cond = status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DisruptionTarget")?;
    let phase = status.phase.as_deref();
    if cond.status != "True"
        || cond.reason.as_deref() == Some("TerminationByKubelet")
        || matches!(phase, Some("Succeeded") | Some("Failed"))
    {
        return None;
    }
    let since = cond
        .last_transition_time
        .as_ref()
        .map(|t| now.duration_since(t.0))
        .unwrap_or(SignedDuration::ZERO);
    let wait = SignedDuration::try_from(STALE_POD_DISRUPTION_TIMEOUT)
        .unwrap_or(SignedDuration::ZERO)
        - since;
    Some(Duration::try_from(wait).unwrap_or(Duration::ZERO))
}

/// The group of an apiVersion (`apps/v1` → `apps`, `v1` → ``), or the parse error of
/// schema.ParseGroupVersion.
fn group_of(api_version: &str) -> Result<&str, String> {
    match api_version.split('/').collect::<Vec<_>>().as_slice() {
        [_] => Ok(""),
        [g, _] => Ok(g),
        _ => Err(format!("unexpected GroupVersion string: {api_version}")),
    }
}

/// verifyGroupKind.
fn is_kind(r: &OwnerReference, kind: &str, groups: &[&str]) -> Result<bool, String> {
    let g = group_of(&r.api_version)?;
    Ok(r.kind == kind && groups.contains(&g))
}

/// intstr.GetScaledValueFromIntOrPercent with rounding up.
fn scaled_value(v: &IntOrString, total: i32) -> Result<i32, String> {
    match v {
        IntOrString::Int(i) => Ok(*i),
        IntOrString::String(s) => {
            let Some(n) = s.strip_suffix('%') else {
                return Err(
                    "invalid value for IntOrString: invalid type: string is not a percentage"
                        .into(),
                );
            };
            let n: i64 = n.parse().map_err(|_| {
                format!(
                    "invalid value for IntOrString: invalid value {s:?}: strconv.Atoi: parsing {n:?}: invalid syntax"
                )
            })?;
            let v = (n as f64 * f64::from(total) / 100.0).ceil();
            Ok(v as i32)
        }
    }
}

/// A label selector as Go's `%v` prints it (the generated String method).
fn selector_string(sel: Option<&LabelSelector>) -> String {
    let Some(sel) = sel else {
        return "nil".into();
    };
    let labels: String = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}: {v},"))
        .collect();
    let exprs: String = sel
        .match_expressions
        .iter()
        .flatten()
        .map(|e| {
            format!(
                "LabelSelectorRequirement{{Key:{},Operator:{},Values:[{}],}},",
                e.key,
                e.operator,
                e.values.as_deref().unwrap_or_default().join(" ")
            )
        })
        .collect();
    format!(
        "&LabelSelector{{MatchLabels:map[string]string{{{labels}}},MatchExpressions:[]LabelSelectorRequirement{{{exprs}}},}}"
    )
}

/// apimeta.SetStatusCondition: replaces the condition of the same type (the transition
/// time changes only with the status), or adds it.
fn set_condition(conds: &mut Vec<Condition>, c: Condition) {
    match conds.iter_mut().find(|x| x.type_ == c.type_) {
        Some(old) => {
            if old.status != c.status {
                old.status = c.status;
                old.last_transition_time = c.last_transition_time;
            }
            old.reason = c.reason;
            old.message = c.message;
            old.observed_generation = c.observed_generation;
        }
        None => conds.push(c),
    }
}

fn allowed_condition(status: &PodDisruptionBudgetStatus, now: Timestamp) -> Condition {
    let ok = status.disruptions_allowed.unwrap_or(0) > 0;
    Condition {
        type_: CONDITION.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: if ok { SUFFICIENT } else { INSUFFICIENT }.into(),
        message: String::new(),
        observed_generation: status.observed_generation,
        last_transition_time: Time(now),
    }
}

/// pdbhelper.ConditionsAreUpToDate.
fn conditions_up_to_date(pdb: &PodDisruptionBudget) -> bool {
    let Some(status) = pdb.status.as_ref() else {
        return false;
    };
    let Some(c) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == CONDITION)
    else {
        return false;
    };
    if status.observed_generation.unwrap_or(0) != pdb.metadata.generation.unwrap_or(0) {
        return false;
    }
    if status.disruptions_allowed.unwrap_or(0) > 0 {
        c.status == "True" && c.reason == SUFFICIENT
    } else {
        c.status == "False" && c.reason == INSUFFICIENT
    }
}

fn add_duration(t: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(t)
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("disruption");
    let stale = factory.queue::<String>("stale_pod_disruption");
    let pdbs = factory.informer::<PodDisruptionBudget>();
    let pods = factory.informer::<Pod>();
    let rcs = factory.informer::<ReplicationController>();
    let rss = factory.informer::<ReplicaSet>();
    let deployments = factory.informer::<Deployment>();
    let statefulsets = factory.informer::<StatefulSet>();

    let q = queue.clone();
    pdbs.add_handler(move |c| match c {
        Change::Added(p) | Change::Updated { new: p, .. } | Change::Deleted(p) => q.add(key_of(p)),
    });
    // The pod handler needs the controller (for the multiple-budgets event), which is made
    // once the client exists; until then it only queues.
    let ctl_slot: Arc<Mutex<Option<Arc<Ctl>>>> = Arc::default();
    let (q, sq, p, slot) = (queue.clone(), stale.clone(), pdbs.clone(), ctl_slot.clone());
    pods.add_handler(move |c| {
        let (pod, deleted) = match c {
            Change::Added(pod) | Change::Updated { new: pod, .. } => (pod, false),
            Change::Deleted(pod) => (pod, true),
        };
        let matching = pdbs_for_pod(&p, pod);
        if let Some(first) = matching.first() {
            q.add(key_of(first.as_ref()));
            if matching.len() > 1 {
                if let Some(ctl) = slot.lock().clone() {
                    ctl.report_multiple(pod, first);
                }
            }
        }
        if !deleted {
            if let Some(after) = stale_disruption_condition(pod, Timestamp::now()) {
                sq.add_after(key_of(pod), after);
            }
        }
    });

    tokio::spawn(async move {
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            pdbs,
            pods,
            rcs,
            rss,
            deployments,
            statefulsets,
            queue: queue.clone(),
            stale: stale.clone(),
            multiple: Mutex::default(),
        });
        *ctl_slot.lock() = Some(ctl.clone());
        let synced = async {
            ctl.pods.wait_synced().await;
            ctl.pdbs.wait_synced().await;
            ctl.rcs.wait_synced().await;
            ctl.rss.wait_synced().await;
            ctl.deployments.wait_synced().await;
            ctl.statefulsets.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let mut tasks = run_workers_of(
            "disruption",
            queue,
            WORKERS,
            stop.clone(),
            &ctl,
            |c, key| async move { c.sync(&key).await },
        );
        let c = ctl.clone();
        tasks.extend(run_workers(
            "disruption",
            stale,
            1,
            stop.clone(),
            move |key| {
                let c = c.clone();
                async move { c.sync_stale_pod(&key).await }
            },
        ));
        for t in tasks {
            let _ = t.await;
        }
    })
}

impl Ctl {
    /// The MultiplePodDisruptionBudgets warning, once per pod and chosen budget.
    fn report_multiple(self: &Arc<Self>, pod: &Pod, chosen: &PodDisruptionBudget) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let name = chosen.metadata.name.clone().unwrap_or_default();
        if self.multiple.lock().insert(uid, name.clone()).as_ref() == Some(&name) {
            return;
        }
        let msg = format!(
            "Pod {:?}/{:?} matches multiple PodDisruptionBudgets.  Chose {name:?} arbitrarily.",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
        );
        let (ctl, pod) = (self.clone(), pod.clone());
        tokio::spawn(async move {
            super::replicaset::record_event(
                &ctl.client,
                COMPONENT,
                &pod,
                "Warning",
                "MultiplePodDisruptionBudgets",
                msg,
            )
            .await;
        });
    }

    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let Some(pdb) = self.pdbs.get(key) else {
            return Ok(());
        };
        match self.try_sync(&pdb).await {
            Ok(()) => Ok(()),
            Err(TryError::Conflict(m)) => Err(SyncError::Conflict(m)),
            Err(TryError::Other(m)) => {
                tracing::warn!(pdb = key, error = %m, "failed to sync PDB");
                self.fail_safe(&pdb, m).await
            }
        }
    }

    async fn try_sync(&self, pdb: &PodDisruptionBudget) -> Result<(), TryError> {
        let ns = pdb.metadata.namespace.clone().unwrap_or_default();
        let pods: Vec<Arc<Pod>> = self
            .pods
            .list()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()) && pdb_selects(pdb, p))
            .collect();
        if pods.is_empty() {
            super::replicaset::record_event(
                &self.client,
                COMPONENT,
                pdb,
                "Normal",
                "NoPods",
                "No matching pods found".into(),
            )
            .await;
        }
        let (expected, desired, unmanaged) = match self.expected_pod_count(pdb, &pods).await {
            Ok(v) => v,
            Err(e) => {
                super::replicaset::record_event(
                    &self.client,
                    COMPONENT,
                    pdb,
                    "Warning",
                    "CalculateExpectedPodCountFailed",
                    format!("Failed to calculate the number of expected pods: {e}"),
                )
                .await;
                return Err(TryError::Other(e));
            }
        };
        if !unmanaged.is_empty() {
            let sel = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
            super::replicaset::record_event(&self.client, COMPONENT,
                    pdb,
                    "Warning",
                    "UnmanagedPods",
                    format!(
                        "Pods selected by this PodDisruptionBudget (selector: {}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value.",
                        selector_string(sel)
                    ),
                )
                .await;
        }
        let now = Timestamp::now();
        let (disrupted, recheck) = self.disrupted_pod_map(&pods, pdb, now).await;
        let healthy = count_healthy(&pods, &disrupted, now);
        self.update_status(pdb, healthy, desired, expected, disrupted, now)
            .await?;
        if let Some(at) = recheck {
            let d = at.duration_since(now);
            let d = Duration::try_from(d).unwrap_or(Duration::ZERO);
            self.queue.add_after(key_of(pdb), d);
        }
        Ok(())
    }

    /// expectedCount, desiredHealthy and the unmanaged pods (getExpectedPodCount).
    async fn expected_pod_count(
        &self,
        pdb: &PodDisruptionBudget,
        pods: &[Arc<Pod>],
    ) -> Result<(i32, i32, Vec<String>), String> {
        let spec = pdb.spec.clone().unwrap_or_default();
        if let Some(mu) = &spec.max_unavailable {
            let (expected, unmanaged) = self.expected_scale(pods).await?;
            let max_unavailable = scaled_value(mu, expected)?;
            return Ok((expected, (expected - max_unavailable).max(0), unmanaged));
        }
        match &spec.min_available {
            Some(IntOrString::Int(n)) => Ok((pods.len() as i32, *n, Vec::new())),
            Some(ma @ IntOrString::String(_)) => {
                let (expected, unmanaged) = self.expected_scale(pods).await?;
                Ok((expected, scaled_value(ma, expected)?, unmanaged))
            }
            None => Ok((0, 0, Vec::new())),
        }
    }

    /// The summed scale of the pods' controllers, and the pods without one
    /// (getExpectedScale).
    async fn expected_scale(&self, pods: &[Arc<Pod>]) -> Result<(i32, Vec<String>), String> {
        let mut scales: BTreeMap<String, i32> = BTreeMap::new();
        let mut unmanaged = Vec::new();
        for pod in pods {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let Some(cref) = controller_of(&pod.metadata) else {
                unmanaged.push(name);
                continue;
            };
            if scales.contains_key(&cref.uid) {
                continue;
            }
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            let found = match self.find_controller(cref, ns).await? {
                Some(f) => f,
                None => return Err(format!("found no controllers for pod {name:?}")),
            };
            scales.insert(found.0, found.1);
        }
        Ok((scales.values().sum(), unmanaged))
    }

    /// The finders in upstream's order: ReplicationController, Deployment, ReplicaSet,
    /// StatefulSet, then any scale subresource.
    async fn find_controller(
        &self,
        cref: &OwnerReference,
        ns: &str,
    ) -> Result<Option<(String, i32)>, String> {
        let key = format!("{ns}/{}", cref.name);
        if is_kind(cref, "ReplicationController", &[""])? {
            if let Some(rc) = self.rcs.get(&key) {
                if rc.metadata.uid.as_deref() == Some(cref.uid.as_str()) {
                    let n = rc.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    return Ok(Some((cref.uid.clone(), n)));
                }
            }
        }
        let rs_kind = is_kind(cref, "ReplicaSet", &["apps", "extensions"])?;
        let rs = self
            .rss
            .get(&key)
            .filter(|rs| rs_kind && rs.metadata.uid.as_deref() == Some(cref.uid.as_str()));
        if let Some(rs) = &rs {
            // A ReplicaSet of a Deployment: the Deployment's scale.
            if let Some(dref) = controller_of(&rs.metadata) {
                if is_kind(dref, "Deployment", &["apps", "extensions"])? {
                    if let Some(d) = self.deployments.get(&format!("{ns}/{}", dref.name)) {
                        if d.metadata.uid.as_deref() == Some(dref.uid.as_str()) {
                            let n = d.spec.replicas.unwrap_or(1);
                            return Ok(Some((dref.uid.clone(), n)));
                        }
                    }
                }
            }
            let by_deployment = controller_of(&rs.metadata).is_some_and(|r| r.kind == "Deployment");
            if !by_deployment {
                let n = rs.spec.replicas.unwrap_or(1);
                return Ok(Some((cref.uid.clone(), n)));
            }
        }
        if is_kind(cref, "StatefulSet", &["apps"])? {
            if let Some(ss) = self.statefulsets.get(&key) {
                if ss.metadata.uid.as_deref() == Some(cref.uid.as_str()) {
                    let n = ss.spec.replicas.unwrap_or(1);
                    return Ok(Some((cref.uid.clone(), n)));
                }
            }
        }
        self.scale_controller(cref, ns).await
    }

    /// The discovery document of a group version (`/api/v1` or `/apis/<g>/<v>`).
    async fn resources_of(&self, api_version: &str) -> Result<Option<Value>, String> {
        let path = if api_version.contains('/') {
            format!("/apis/{api_version}")
        } else {
            format!("/api/{api_version}")
        };
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        match self.client.get().request::<Value>(req).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(message(&e)),
        }
    }

    /// getScaleController: the scale subresource of whatever the reference names.
    async fn scale_controller(
        &self,
        cref: &OwnerReference,
        ns: &str,
    ) -> Result<Option<(String, i32)>, String> {
        let group = group_of(&cref.api_version)?;
        let no_match = || {
            format!(
                "no matches for kind {:?} in version {:?}",
                cref.kind, cref.api_version
            )
        };
        let doc = self
            .resources_of(&cref.api_version)
            .await?
            .ok_or_else(no_match)?;
        let resources = doc["resources"].as_array().cloned().unwrap_or_default();
        let plural = resources
            .iter()
            .find(|r| {
                r["kind"] == cref.kind.as_str()
                    && r["name"].as_str().is_some_and(|n| !n.contains('/'))
            })
            .and_then(|r| r["name"].as_str())
            .ok_or_else(no_match)?
            .to_owned();
        let prefix = if group.is_empty() {
            format!("/api/{}", cref.api_version)
        } else {
            format!("/apis/{}", cref.api_version)
        };
        let req = http::Request::get(format!(
            "{prefix}/namespaces/{ns}/{plural}/{}/scale",
            cref.name
        ))
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
        match self.client.get().request::<Value>(req).await {
            Ok(scale) => {
                if scale["metadata"]["uid"].as_str() != Some(cref.uid.as_str()) {
                    return Ok(None);
                }
                let n = scale["spec"]["replicas"].as_i64().unwrap_or(0);
                Ok(Some((
                    cref.uid.clone(),
                    i32::try_from(n).unwrap_or(i32::MAX),
                )))
            }
            Err(e) if is_not_found(&e) => {
                // Either the object is gone or it has no scale subresource.
                let sub = format!("{plural}/scale");
                let is_scale = resources.iter().any(|r| {
                    r["name"] == sub.as_str()
                        && r["kind"] == "Scale"
                        && r["group"]
                            .as_str()
                            .is_none_or(|g| g == "autoscaling" || g.is_empty())
                });
                if !is_scale {
                    let gr = if group.is_empty() {
                        plural
                    } else {
                        format!("{plural}.{group}")
                    };
                    return Err(format!("{gr} does not implement the scale subresource"));
                }
                Ok(None)
            }
            Err(e) => Err(message(&e)),
        }
    }

    /// The disrupted pods still expected to be deleted, and when to look again
    /// (buildDisruptedPodMap).
    async fn disrupted_pod_map(
        &self,
        pods: &[Arc<Pod>],
        pdb: &PodDisruptionBudget,
        now: Timestamp,
    ) -> (BTreeMap<String, Time>, Option<Timestamp>) {
        let mut out = BTreeMap::new();
        let mut recheck: Option<Timestamp> = None;
        let Some(old) = pdb.status.as_ref().and_then(|s| s.disrupted_pods.as_ref()) else {
            return (out, None);
        };
        for pod in pods {
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let name = pod.metadata.name.clone().unwrap_or_default();
            let Some(t) = old.get(&name) else { continue };
            let expected = add_duration(t.0, DELETION_TIMEOUT);
            if expected < now {
                // Upstream names the budget's namespace twice here.
                let ns = pdb.metadata.namespace.clone().unwrap_or_default();
                super::replicaset::record_event(
                    &self.client,
                    COMPONENT,
                    pod.as_ref(),
                    "Warning",
                    "NotDeleted",
                    format!("Pod was expected by PDB {ns}/{ns} to be deleted but it wasn't"),
                )
                .await;
            } else {
                if recheck.is_none_or(|r| expected < r) {
                    recheck = Some(expected);
                }
                out.insert(name, t.clone());
            }
        }
        (out, recheck)
    }

    async fn update_status(
        &self,
        pdb: &PodDisruptionBudget,
        healthy: i32,
        desired: i32,
        expected: i32,
        disrupted: BTreeMap<String, Time>,
        now: Timestamp,
    ) -> Result<(), TryError> {
        let mut allowed = healthy - desired;
        if expected <= 0 || allowed <= 0 {
            allowed = 0;
        }
        let generation = pdb.metadata.generation.unwrap_or(0);
        let old = pdb.status.clone().unwrap_or_default();
        let old_disrupted = old.disrupted_pods.clone().unwrap_or_default();
        if old.current_healthy.unwrap_or(0) == healthy
            && old.desired_healthy.unwrap_or(0) == desired
            && old.expected_pods.unwrap_or(0) == expected
            && old.disruptions_allowed.unwrap_or(0) == allowed
            && old_disrupted == disrupted
            && old.observed_generation.unwrap_or(0) == generation
            && conditions_up_to_date(pdb)
        {
            return Ok(());
        }
        let mut status = PodDisruptionBudgetStatus {
            current_healthy: Some(healthy),
            desired_healthy: Some(desired),
            expected_pods: Some(expected),
            disruptions_allowed: Some(allowed),
            disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
            observed_generation: Some(generation),
            conditions: None,
        };
        let mut conds = old.conditions.unwrap_or_default();
        set_condition(&mut conds, allowed_condition(&status, now));
        status.conditions = Some(conds);
        self.write_status(pdb, status).await
    }

    /// failSafe: disruptionsAllowed 0 and the SyncFailed condition with the error.
    async fn fail_safe(&self, pdb: &PodDisruptionBudget, err: String) -> Result<(), SyncError> {
        let mut status = pdb.status.clone().unwrap_or_default();
        status.disruptions_allowed = Some(0);
        for f in [
            &mut status.current_healthy,
            &mut status.desired_healthy,
            &mut status.expected_pods,
        ] {
            f.get_or_insert(0);
        }
        let mut conds = status.conditions.take().unwrap_or_default();
        set_condition(
            &mut conds,
            Condition {
                type_: CONDITION.into(),
                status: "False".into(),
                reason: SYNC_FAILED.into(),
                message: err,
                observed_generation: status.observed_generation,
                last_transition_time: Time(Timestamp::now()),
            },
        );
        status.conditions = Some(conds);
        match self.write_status(pdb, status).await {
            Ok(()) => Ok(()),
            Err(TryError::Conflict(m)) => Err(SyncError::Conflict(m)),
            Err(TryError::Other(m)) => Err(SyncError::Failed(m)),
        }
    }

    /// An update of the status subresource, guarded by the cached resourceVersion.
    async fn write_status(
        &self,
        pdb: &PodDisruptionBudget,
        status: PodDisruptionBudgetStatus,
    ) -> Result<(), TryError> {
        let mut next = pdb.clone();
        next.status = Some(status);
        let ns = pdb.metadata.namespace.clone().unwrap_or_default();
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.get(), &ns);
        match api
            .replace_status(
                pdb.metadata.name.as_deref().unwrap_or_default(),
                &PostParams::default(),
                &next,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Resets a stale DisruptionTarget condition to False (syncStalePodDisruption).
    async fn sync_stale_pod(&self, key: &str) -> Result<(), SyncError> {
        let Some(pod) = self.pods.get(key) else {
            return Ok(());
        };
        let Some(after) = stale_disruption_condition(&pod, Timestamp::now()) else {
            return Ok(());
        };
        if !after.is_zero() {
            self.stale.add_after(key.to_owned(), after);
            return Ok(());
        }
        let mut next = (*pod).clone();
        let Some(status) = next.status.as_mut() else {
            return Ok(());
        };
        let cond = PodCondition {
            type_: "DisruptionTarget".into(),
            status: "False".into(),
            observed_generation: pod.metadata.generation,
            last_transition_time: Some(Time(Timestamp::now())),
            ..Default::default()
        };
        if let Some(c) = status
            .conditions
            .get_or_insert_with(Vec::new)
            .iter_mut()
            .find(|c| c.type_ == "DisruptionTarget")
        {
            *c = cond;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.get(), &ns);
        match api
            .replace_status(
                pod.metadata.name.as_deref().unwrap_or_default(),
                &PostParams::default(),
                &next,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Ready pods that are neither being deleted nor recently evicted (countHealthyPods).
fn count_healthy(pods: &[Arc<Pod>], disrupted: &BTreeMap<String, Time>, now: Timestamp) -> i32 {
    let mut n = 0;
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        if disrupted
            .get(name)
            .is_some_and(|t| add_duration(t.0, DELETION_TIMEOUT) > now)
        {
            continue;
        }
        if pod_ready(pod) {
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    #[test]
    fn percentages_round_up() {
        assert_eq!(scaled_value(&IntOrString::String("50%".into()), 3), Ok(2));
        assert_eq!(scaled_value(&IntOrString::String("10%".into()), 10), Ok(1));
        assert_eq!(scaled_value(&IntOrString::Int(4), 10), Ok(4));
        assert_eq!(
            scaled_value(&IntOrString::String("5".into()), 10),
            Err("invalid value for IntOrString: invalid type: string is not a percentage".into())
        );
    }

    #[test]
    fn selectors_print_as_go() {
        let sel = LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(vec!["a".into(), "b".into()]),
            }]),
        };
        assert_eq!(
            selector_string(Some(&sel)),
            "&LabelSelector{MatchLabels:map[string]string{app: web,},MatchExpressions:[]LabelSelectorRequirement{LabelSelectorRequirement{Key:tier,Operator:In,Values:[a b],},},}"
        );
        assert_eq!(group_of("apps/v1"), Ok("apps"));
        assert_eq!(group_of("v1"), Ok(""));
    }

    #[test]
    fn stale_conditions_wait_two_minutes() {
        let now = Timestamp::now();
        let mut pod = Pod::default();
        assert_eq!(stale_disruption_condition(&pod, now), None);
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some("EvictionByEvictionAPI".into()),
                last_transition_time: Some(Time(now - SignedDuration::from_secs(30))),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(
            stale_disruption_condition(&pod, now),
            Some(Duration::from_secs(90))
        );
        if let Some(c) = pod
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .and_then(|c| c.first_mut())
        {
            c.reason = Some("TerminationByKubelet".into());
        }
        assert_eq!(stale_disruption_condition(&pod, now), None);
    }
}
