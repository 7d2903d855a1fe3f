//! taint-eviction-controller: deletes pods from nodes with `NoExecute` taints they do not
//! tolerate, as upstream's tainteviction.Controller does:
//! * a pod that does not tolerate every NoExecute taint of its node is deleted at once;
//! * a pod whose matching tolerations all carry `tolerationSeconds` is deleted after the
//!   smallest of them (counted from when the eviction was first scheduled);
//! * a scheduled deletion is cancelled when the taints go or become tolerated forever.
//!
//! Before deleting, the pod gets the `DisruptionTarget` condition (reason
//! `DeletionByTaintManager`). `TaintManagerEviction` events ("Marking for deletion Pod
//! ns/name", "Cancelling deletion of Pod ns/name") come from the source
//! `taint-eviction-controller`. Upstream runs it as the `node-controller` ServiceAccount.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::message;
use kumo_client::informer::{Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers, wait_for_sync, SyncError};

/// The controller's name, also its events' source.
const NAME: &str = "taint-eviction-controller";
/// Upstream's retries of one deletion (10 ms apart).
const RETRIES: usize = 5;

/// A reference to a pod as upstream's taint manager builds it (no uid).
fn pod_ref(ns: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    }
}

/// Whether `t` tolerates `taint` (TaintTolerationComparisonOperators is off by default,
/// so Lt and Gt match nothing).
pub(crate) fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    if t.key
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != taint.key)
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or("") {
        "" | "Equal" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        "Exists" => true,
        _ => false,
    }
}

/// Whether every taint is tolerated, and the first toleration matching each
/// (upstream's GetMatchingTolerations).
fn matching_tolerations<'a>(
    taints: &[Taint],
    tolerations: &'a [Toleration],
) -> (bool, Vec<&'a Toleration>) {
    let mut used = Vec::new();
    for taint in taints {
        match tolerations.iter().find(|t| tolerates(t, taint)) {
            Some(t) => used.push(t),
            None => return (false, Vec::new()),
        }
    }
    (true, used)
}

/// The smallest tolerationSeconds of `used`: zero if any is ≤ 0 or none were used,
/// None (forever) if none has tolerationSeconds.
fn min_toleration_time(used: &[&Toleration]) -> Option<Duration> {
    if used.is_empty() {
        return Some(Duration::ZERO);
    }
    let mut min: Option<i64> = None;
    for t in used {
        if let Some(s) = t.toleration_seconds {
            if s <= 0 {
                return Some(Duration::ZERO);
            }
            min = Some(min.map_or(s, |m| m.min(s)));
        }
    }
    min.map(|s| Duration::from_secs(s.unsigned_abs()))
}

fn no_execute(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| {
            t.iter()
                .filter(|t| t.effect == "NoExecute")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

fn node_of(p: &Pod) -> &str {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
}

/// A scheduled deletion; `None` in the map while it runs (cannot be cancelled any more).
struct Timed {
    created: Instant,
    id: u64,
    task: JoinHandle<()>,
}

struct Ctl {
    client: ClientSource,
    pods: Arc<Informer<Pod>>,
    nodes: Arc<Informer<Node>>,
    /// Each tainted node's NoExecute taints.
    tainted: Mutex<HashMap<String, Vec<Taint>>>,
    /// Deletions by `namespace/name` (upstream's TimedWorkerQueue).
    timed: Mutex<HashMap<String, Option<Timed>>>,
    next_id: Mutex<u64>,
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("noexec_taint");
    let pods = factory.informer::<Pod>();
    let nodes = factory.informer::<Node>();
    let q = queue.clone();
    pods.add_handler(move |c| {
        let p = match c {
            Change::Added(p) | Change::Deleted(p) => p,
            Change::Updated { old, new } => {
                let tol = |p: &Pod| p.spec.as_ref().and_then(|s| s.tolerations.clone());
                if tol(old) == tol(new) && node_of(old) == node_of(new) {
                    return;
                }
                new
            }
        };
        let ns = p.metadata.namespace.as_deref().unwrap_or("");
        let name = p.metadata.name.as_deref().unwrap_or("");
        q.add(format!("pod/{ns}/{name}/{}", node_of(p)));
    });
    let q = queue.clone();
    nodes.add_handler(move |c| {
        let n = match c {
            Change::Added(n) | Change::Deleted(n) => n,
            Change::Updated { old, new } => {
                if no_execute(old) == no_execute(new) {
                    return;
                }
                new
            }
        };
        if let Some(name) = &n.metadata.name {
            q.add(format!("node/{name}"));
        }
    });
    tokio::spawn(async move {
        tracing::info!(controller = NAME, "Starting");
        // Upstream's taint manager uses the node-controller's ClusterRole.
        let Some(client) = client_for(&clients, "node-controller", &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            pods,
            nodes,
            tainted: Mutex::new(HashMap::new()),
            timed: Mutex::new(HashMap::new()),
            next_id: Mutex::new(0),
        });
        let synced = async {
            ctl.pods.wait_synced().await;
            ctl.nodes.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let c = ctl.clone();
        let tasks = run_workers(NAME, queue, 1, stop, move |key| {
            let c = c.clone();
            async move {
                c.sync(&key).await;
                Ok::<(), SyncError>(())
            }
        });
        futures::future::join_all(tasks).await;
        for (_, t) in ctl.timed.lock().drain() {
            if let Some(t) = t {
                t.task.abort();
            }
        }
        tracing::info!(controller = NAME, "Shutting down controller");
    })
}

impl Ctl {
    async fn sync(self: &Arc<Self>, key: &str) {
        if let Some(name) = key.strip_prefix("node/") {
            self.node_update(name).await;
        } else if let Some(rest) = key.strip_prefix("pod/") {
            let mut parts = rest.splitn(3, '/');
            let (ns, name, node) = (
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
            );
            self.pod_update(ns, name, node).await;
        }
    }

    async fn pod_update(self: &Arc<Self>, ns: &str, name: &str, node: &str) {
        let Some(pod) = self.pods.get(&format!("{ns}/{name}")) else {
            self.cancel_with_event(ns, name).await;
            return;
        };
        // Only the item naming the pod's current node acts on it.
        if node_of(&pod) != node || node.is_empty() {
            return;
        }
        let Some(taints) = self.tainted.lock().get(node).cloned() else {
            return;
        };
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default();
        self.process_pod(ns, name, &tolerations, &taints, Instant::now())
            .await;
    }

    async fn node_update(self: &Arc<Self>, name: &str) {
        let Some(node) = self.nodes.get(name) else {
            self.tainted.lock().remove(name);
            return;
        };
        let taints = no_execute(&node);
        {
            let mut t = self.tainted.lock();
            if taints.is_empty() {
                t.remove(name);
            } else {
                t.insert(name.to_owned(), taints.clone());
            }
        }
        let pods: Vec<Arc<Pod>> = self
            .pods
            .list()
            .into_iter()
            .filter(|p| node_of(p) == name)
            .collect();
        let now = Instant::now();
        for p in pods {
            let ns = p.metadata.namespace.as_deref().unwrap_or("");
            let pname = p.metadata.name.as_deref().unwrap_or("");
            if taints.is_empty() {
                self.cancel_with_event(ns, pname).await;
                continue;
            }
            let tolerations = p
                .spec
                .as_ref()
                .and_then(|s| s.tolerations.clone())
                .unwrap_or_default();
            self.process_pod(ns, pname, &tolerations, &taints, now)
                .await;
        }
    }

    async fn process_pod(
        self: &Arc<Self>,
        ns: &str,
        name: &str,
        tolerations: &[Toleration],
        taints: &[Taint],
        now: Instant,
    ) {
        let (all, used) = matching_tolerations(taints, tolerations);
        if !all {
            tracing::debug!(pod = %format!("{ns}/{name}"), "not all taints are tolerated");
            self.cancel_with_event(ns, name).await;
            self.add_work(ns, name, now, now);
            return;
        }
        let Some(min) = min_toleration_time(&used) else {
            // Tolerated forever.
            self.cancel_with_event(ns, name).await;
            return;
        };
        let key = format!("{ns}/{name}");
        let mut start = now;
        let scheduled = self
            .timed
            .lock()
            .get(&key)
            .and_then(|t| t.as_ref().map(|t| t.created));
        if let Some(created) = scheduled {
            start = created;
            if created + min < now + min {
                return;
            }
            self.cancel_with_event(ns, name).await;
        }
        self.add_work(ns, name, start, start + min);
    }

    /// Schedules the deletion unless one is already scheduled or running.
    fn add_work(self: &Arc<Self>, ns: &str, name: &str, created: Instant, fire_at: Instant) {
        let key = format!("{ns}/{name}");
        let mut timed = self.timed.lock();
        if timed.contains_key(&key) {
            return;
        }
        let id = {
            let mut n = self.next_id.lock();
            *n += 1;
            *n
        };
        let delay = fire_at.saturating_duration_since(Instant::now());
        let immediate = fire_at <= created;
        let c = self.clone();
        let (ns2, name2, key2) = (ns.to_owned(), name.to_owned(), key.clone());
        let task = tokio::spawn(async move {
            if !immediate {
                tokio::time::sleep(delay).await;
                // Fired: from now on it cannot be cancelled.
                let mut t = c.timed.lock();
                match t.get(&key2) {
                    Some(Some(w)) if w.id == id => {
                        t.insert(key2.clone(), None);
                    }
                    _ => return,
                }
            }
            c.delete_pod(&ns2, &name2).await;
            c.timed.lock().remove(&key2);
        });
        timed.insert(key, (!immediate).then_some(Timed { created, id, task }));
    }

    /// Cancels a scheduled deletion, with the event, if there is one.
    async fn cancel_with_event(&self, ns: &str, name: &str) {
        let removed = self.timed.lock().remove(&format!("{ns}/{name}"));
        if let Some(Some(t)) = removed {
            t.task.abort();
            kumo_client::events::record(
                &self.client,
                NAME,
                pod_ref(ns, name),
                "Normal",
                "TaintManagerEviction",
                format!("Cancelling deletion of Pod {ns}/{name}"),
            )
            .await;
        }
    }

    async fn delete_pod(&self, ns: &str, name: &str) {
        tracing::info!(controller = NAME, pod = %format!("{ns}/{name}"), "Deleting pod");
        kumo_client::events::record(
            &self.client,
            NAME,
            pod_ref(ns, name),
            "Normal",
            "TaintManagerEviction",
            format!("Marking for deletion Pod {ns}/{name}"),
        )
        .await;
        let mut last = String::new();
        for _ in 0..RETRIES {
            match self.add_condition_and_delete(ns, name).await {
                Ok(()) => return,
                Err(e) => last = message(&e),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::warn!(controller = NAME, pod = %format!("{ns}/{name}"), error = %last, "timed worker failed");
    }

    async fn add_condition_and_delete(&self, ns: &str, name: &str) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.get(), ns);
        let pod = api.get(name).await?;
        let patch = disruption_patch(
            &pod,
            "DeletionByTaintManager",
            "Taint manager: deleting due to NoExecute taint",
            None,
        );
        if let Some(patch) = patch {
            api.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await?;
        }
        api.delete(name, &DeleteParams::default()).await?;
        Ok(())
    }
}

/// The status patch that sets the DisruptionTarget condition (and `phase`, when given) as
/// upstream's UpdatePodCondition + PatchPodStatus do: the uid as a precondition, the
/// condition's lastTransitionTime kept while its status stays; None if nothing changes.
pub(crate) fn disruption_patch(
    pod: &Pod,
    reason: &str,
    msg: &str,
    phase: Option<&str>,
) -> Option<serde_json::Value> {
    let status = pod.status.clone().unwrap_or_default();
    let old = status
        .conditions
        .as_ref()
        .and_then(|c| c.iter().find(|c| c.type_ == "DisruptionTarget"));
    let mut changed = phase.is_some_and(|p| status.phase.as_deref() != Some(p));
    let mut cond = json!({
        "type": "DisruptionTarget", "status": "True", "reason": reason, "message": msg,
        "lastTransitionTime": Time(Timestamp::now()),
    });
    // PodObservedGenerationTracking is GA: the condition records the pod's generation.
    let generation = pod.metadata.generation.unwrap_or(0);
    if generation != 0 {
        cond["observedGeneration"] = json!(generation);
    }
    match old {
        Some(o) if o.status == "True" => {
            cond["lastTransitionTime"] = json!(o.last_transition_time);
            if o.reason.as_deref() != Some(reason) || o.message.as_deref() != Some(msg) {
                changed = true;
            }
        }
        _ => changed = true,
    }
    if !changed {
        return None;
    }
    let mut st = json!({"conditions": [cond]});
    if let Some(p) = phase {
        st["phase"] = json!(p);
        if generation != 0 {
            st["observedGeneration"] = json!(generation);
        }
    }
    Some(json!({"metadata": {"uid": pod.metadata.uid}, "status": st}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: Option<&str>) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: "NoExecute".into(),
            time_added: None,
        }
    }

    fn tol(key: &str, op: &str, secs: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some(op.into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: secs,
            value: None,
        }
    }

    #[test]
    fn minimum_over_matching_tolerations() {
        let taints = [taint("a", None), taint("b", None)];
        let tols = [
            tol("a", "Exists", Some(30)),
            tol("b", "Exists", Some(10)),
            tol("c", "Exists", Some(1)),
        ];
        let (all, used) = matching_tolerations(&taints, &tols);
        assert!(all);
        assert_eq!(min_toleration_time(&used), Some(Duration::from_secs(10)));
        let forever = [tol("a", "Exists", None), tol("b", "Exists", None)];
        let (all, used) = matching_tolerations(&taints, &forever);
        assert!(all);
        assert_eq!(min_toleration_time(&used), None);
        let (all, _) = matching_tolerations(&taints, &tols[..1]);
        assert!(!all);
        let zero = [tol("", "Exists", Some(-5))];
        let (all, used) = matching_tolerations(&taints, &zero);
        assert!(all);
        assert_eq!(min_toleration_time(&used), Some(Duration::ZERO));
        // Equal compares values; Lt/Gt are off by default.
        let eq = Toleration {
            operator: Some("Equal".into()),
            value: Some("x".into()),
            ..tol("a", "Equal", None)
        };
        assert!(tolerates(&eq, &taint("a", Some("x"))));
        assert!(!tolerates(&eq, &taint("a", Some("y"))));
        assert!(!tolerates(&tol("a", "Gt", None), &taint("a", Some("1"))));
    }
}
