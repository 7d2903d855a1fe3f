//! pod-garbage-collector-controller: every 20 s, as upstream's PodGCController, force
//! deletes (grace period 0):
//! * terminated pods (phase neither Pending, Running nor Unknown) beyond
//!   `--terminated-pod-gc-threshold` (12500; ≤ 0 turns this off), evicted pods first, then
//!   the oldest, then by name;
//! * terminating pods on nodes that are not ready and carry the
//!   `node.kubernetes.io/out-of-service` taint;
//! * orphaned pods, bound to a node that still does not exist after a 40 s quarantine
//!   (checked with a GET, not only the informer);
//! * terminating pods that were never scheduled.
//!
//! A pod not yet Succeeded or Failed is first marked Failed; an orphan also gets the
//! `DisruptionTarget` condition (reason `DeletionByPodGC`). It acts as the
//! `pod-garbage-collector` ServiceAccount.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::tainteviction::disruption_patch;
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_not_found, message};
use kumo_client::informer::{Informer, InformerFactory};
use kumo_client::worker::{client_for, wait_for_sync};

/// Upstream's --terminated-pod-gc-threshold default.
pub const DEFAULT_TERMINATED_POD_GC_THRESHOLD: i32 = 12500;
/// How often the collector runs (gcCheckPeriod).
pub const GC_CHECK_PERIOD: Duration = Duration::from_secs(20);
/// How long a missing node is waited for before its pods count as orphans.
pub const QUARANTINE_TIME: Duration = Duration::from_secs(40);

const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

/// The collector's settings (upstream's NewPodGCInternal takes the periods for tests).
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--terminated-pod-gc-threshold`.
    pub terminated_pod_gc_threshold: i32,
    /// How often the collector runs.
    pub check_period: Duration,
    /// How long a missing node is quarantined.
    pub quarantine: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            terminated_pod_gc_threshold: DEFAULT_TERMINATED_POD_GC_THRESHOLD,
            check_period: GC_CHECK_PERIOD,
            quarantine: QUARANTINE_TIME,
        }
    }
}

struct Ctl {
    client: ClientSource,
    pods: Arc<Informer<Pod>>,
    nodes: Arc<Informer<Node>>,
    settings: Settings,
    /// Missing nodes and when their quarantine ends (a delaying queue).
    quarantined: parking_lot::Mutex<HashMap<String, Instant>>,
}

/// Registers the informers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    settings: Settings,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let pods = factory.informer::<Pod>();
    let nodes = factory.informer::<Node>();
    tokio::spawn(async move {
        tracing::info!("Starting GC controller");
        let Some(client) = client_for(&clients, "pod-garbage-collector", &mut stop).await else {
            return;
        };
        let ctl = Ctl {
            client,
            pods,
            nodes,
            settings,
            quarantined: parking_lot::Mutex::new(HashMap::new()),
        };
        let synced = async {
            ctl.pods.wait_synced().await;
            ctl.nodes.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        loop {
            ctl.gc().await;
            tokio::select! {
                _ = tokio::time::sleep(ctl.settings.check_period) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        tracing::info!("Shutting down GC controller");
    })
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn node_of(p: &Pod) -> &str {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
}

fn terminated(p: &Pod) -> bool {
    !matches!(phase(p), "Pending" | "Running" | "Unknown")
}

fn evicted(p: &Pod) -> bool {
    phase(p) == "Failed" && p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted")
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Evicted pods first, then by creation time, then by name (byEvictionAndCreationTimestamp).
fn sort_for_deletion(pods: &mut [Arc<Pod>]) {
    pods.sort_by(|a, b| {
        evicted(b)
            .cmp(&evicted(a))
            .then_with(|| {
                let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
                t(a).cmp(&t(b))
            })
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
}

impl Ctl {
    async fn gc(&self) {
        let pods = self.pods.list();
        if self.settings.terminated_pod_gc_threshold > 0 {
            self.gc_terminated(&pods).await;
        }
        self.gc_terminating(&pods).await;
        self.gc_orphaned(&pods).await;
        self.gc_unscheduled_terminating(&pods).await;
    }

    async fn gc_terminated(&self, pods: &[Arc<Pod>]) {
        let mut done: Vec<Arc<Pod>> = pods.iter().filter(|p| terminated(p)).cloned().collect();
        let threshold = usize::try_from(self.settings.terminated_pod_gc_threshold).unwrap_or(0);
        if done.len() <= threshold {
            return;
        }
        let count = done.len() - threshold;
        tracing::info!(num_pods = count, "Garbage collecting pods");
        sort_for_deletion(&mut done);
        let work = done[..count]
            .iter()
            .map(|p| self.mark_failed_and_delete(p, None));
        for (p, r) in done.iter().zip(futures::future::join_all(work).await) {
            if let Err(e) = r {
                tracing::warn!(pod = %key(p), error = %e, "Failed to delete terminated pod");
            }
        }
    }

    async fn gc_terminating(&self, pods: &[Arc<Pod>]) {
        let mut doomed = Vec::new();
        for p in pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
        {
            let Some(node) = self.nodes.get(node_of(p)) else {
                tracing::debug!(node = node_of(p), "Failed to get node");
                continue;
            };
            let out_of_service = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE));
            if !node_ready(&node) && out_of_service {
                doomed.push(p.clone());
            }
        }
        if doomed.is_empty() {
            return;
        }
        sort_for_deletion(&mut doomed);
        let work = doomed.iter().map(|p| self.mark_failed_and_delete(p, None));
        for (p, r) in doomed.iter().zip(futures::future::join_all(work).await) {
            if let Err(e) = r {
                tracing::warn!(pod = %key(p), error = %e, "Failed to delete terminating pod on out-of-service node");
            }
        }
    }

    async fn gc_orphaned(&self, pods: &[Arc<Pod>]) {
        let existing: HashSet<String> = self
            .nodes
            .list()
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let now = Instant::now();
        {
            let mut q = self.quarantined.lock();
            for p in pods {
                let n = node_of(p);
                if !n.is_empty() && !existing.contains(n) {
                    // A node already waiting keeps its earlier time (AddAfter).
                    q.entry(n.to_owned())
                        .or_insert(now + self.settings.quarantine);
                }
            }
        }
        // Nodes whose quarantine is over and that a GET confirms are gone.
        let ready: Vec<String> = {
            let mut q = self.quarantined.lock();
            let ready: Vec<String> = q
                .iter()
                .filter(|(_, t)| **t <= now)
                .map(|(n, _)| n.clone())
                .collect();
            for n in &ready {
                q.remove(n);
            }
            ready
        };
        let mut deleted = HashSet::new();
        let api: Api<Node> = Api::all(self.client.get());
        for n in ready.into_iter().filter(|n| !existing.contains(n)) {
            match api.get(&n).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {
                    deleted.insert(n);
                }
                Err(e) => {
                    tracing::warn!(node = %n, error = %message(&e), "Error while getting node")
                }
            }
        }
        for p in pods.iter().filter(|p| deleted.contains(node_of(p))) {
            tracing::info!(pod = %key(p), node = node_of(p), "Found orphaned Pod assigned to the Node, deleting");
            let cond = ("DeletionByPodGC", "PodGC: node no longer exists");
            match self.mark_failed_and_delete(p, Some(cond)).await {
                Ok(()) => {
                    tracing::info!(pod = %key(p), "Forced deletion of orphaned Pod succeeded")
                }
                Err(e) => {
                    tracing::warn!(pod = %key(p), error = %e, "Failed to delete orphaned pod")
                }
            }
        }
    }

    async fn gc_unscheduled_terminating(&self, pods: &[Arc<Pod>]) {
        for p in pods {
            if p.metadata.deletion_timestamp.is_none() || !node_of(p).is_empty() {
                continue;
            }
            match self.mark_failed_and_delete(p, None).await {
                Ok(()) => {
                    tracing::info!(pod = %key(p), "Forced deletion of unscheduled terminating Pod succeeded")
                }
                Err(e) => {
                    tracing::warn!(pod = %key(p), error = %e, "Failed to delete unscheduled terminating pod")
                }
            }
        }
    }

    /// Marks the pod Failed (with the condition, if any) unless it has finished, then
    /// deletes it with grace period 0.
    async fn mark_failed_and_delete(
        &self,
        pod: &Pod,
        condition: Option<(&str, &str)>,
    ) -> Result<(), String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("");
        let name = pod.metadata.name.as_deref().unwrap_or("");
        tracing::info!(pod = %key(pod), "PodGC is force deleting Pod");
        let api: Api<Pod> = Api::namespaced(self.client.get(), ns);
        if !matches!(phase(pod), "Succeeded" | "Failed") {
            let patch = match condition {
                Some((reason, msg)) => disruption_patch(pod, reason, msg, Some("Failed")),
                None => {
                    let mut st = json!({"phase": "Failed"});
                    if let Some(g) = pod.metadata.generation.filter(|g| *g != 0) {
                        st["observedGeneration"] = json!(g);
                    }
                    Some(json!({"metadata": {"uid": pod.metadata.uid}, "status": st}))
                }
            };
            if let Some(patch) = patch {
                api.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                    .map_err(|e| {
                        format!(
                            "failed to patch status for pod {ns}/{name}: {}",
                            message(&e)
                        )
                    })?;
            }
        }
        api.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .map_err(|e| message(&e))?;
        Ok(())
    }
}

fn key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or(""),
        p.metadata.name.as_deref().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod(name: &str, secs: i64, phase: &str, reason: Option<&str>) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(Time(
                    k8s_openapi::jiff::Timestamp::from_second(secs).expect("valid"),
                )),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some(phase.into()),
                reason: reason.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn evicted_then_oldest_then_name() {
        let mut pods = vec![
            pod("c", 10, "Succeeded", None),
            pod("b", 5, "Failed", None),
            pod("a", 5, "Failed", None),
            pod("z", 50, "Failed", Some("Evicted")),
        ];
        sort_for_deletion(&mut pods);
        let names: Vec<_> = pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["z", "a", "b", "c"]);
        assert!(terminated(&pod("x", 0, "", None)));
        assert!(!terminated(&pod("x", 0, "Unknown", None)));
    }
}
