//! node-lifecycle-controller: watches each node's heartbeats (its Ready condition and its
//! Lease in kube-node-lease) and, as upstream's NodeLifecycleController does:
//! * marks a node whose kubelet stopped reporting for longer than the grace period (50 s)
//!   Unknown — "Kubelet stopped posting node status." — and the pods on it not ready;
//! * keeps the condition taints in step with the conditions: `node.kubernetes.io/not-ready`
//!   and `node.kubernetes.io/unreachable` (NoSchedule and NoExecute), the pressure taints,
//!   `node.kubernetes.io/unschedulable` for cordoned nodes.
//!
//! Evicting pods from NoExecute-tainted nodes is the taint-eviction controller's job.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::informer::{Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

/// Upstream's --node-monitor-period, --node-monitor-grace-period and
/// --node-startup-grace-period defaults.
pub const MONITOR_PERIOD: Duration = Duration::from_secs(5);
pub const GRACE_PERIOD: Duration = Duration::from_secs(50);
pub const STARTUP_GRACE_PERIOD: Duration = Duration::from_secs(60);

/// The node controller's flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--node-monitor-period`: how often every node's health is looked at.
    pub monitor_period: Duration,
    /// `--node-monitor-grace-period`: how long a kubelet may stay silent before its node's
    /// conditions become Unknown.
    pub grace_period: Duration,
    /// `--node-startup-grace-period`: the same for a node whose kubelet never posted status.
    pub startup_grace_period: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            monitor_period: MONITOR_PERIOD,
            grace_period: GRACE_PERIOD,
            startup_grace_period: STARTUP_GRACE_PERIOD,
        }
    }
}

/// A duration flag as kube-controller-manager reads it (Go's `time.ParseDuration`, e.g.
/// `40s`, `1m30s`); zero and negative durations are refused, as they would stop the loop
/// or mark every node Unknown at once.
pub fn parse_duration_flag(s: &str) -> Result<Duration, String> {
    let ns = super::cronjob::parse_go_duration(s)?;
    if ns <= 0 {
        return Err(format!("must be a positive duration, not {s:?}"));
    }
    u64::try_from(ns)
        .map(Duration::from_nanos)
        .map_err(|_| format!("duration {s:?} is too long"))
}

const NOT_READY: &str = "node.kubernetes.io/not-ready";
const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// The NoSchedule taint each condition status stands for (upstream's nodeConditionToTaintKeyStatusMap).
const CONDITION_TAINTS: &[(&str, &str, &str)] = &[
    ("Ready", "False", NOT_READY),
    ("Ready", "Unknown", UNREACHABLE),
    (
        "MemoryPressure",
        "True",
        "node.kubernetes.io/memory-pressure",
    ),
    ("DiskPressure", "True", "node.kubernetes.io/disk-pressure"),
    (
        "NetworkUnavailable",
        "True",
        "node.kubernetes.io/network-unavailable",
    ),
    ("PIDPressure", "True", "node.kubernetes.io/pid-pressure"),
];

struct Ctl {
    client: ClientSource,
    nodes: Arc<Informer<Node>>,
    leases: Arc<Informer<Lease>>,
    pods: Arc<Informer<Pod>>,
    settings: Settings,
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    settings: Settings,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("node_lifecycle_controller");
    let nodes = factory.informer::<Node>();
    let leases = factory.informer::<Lease>();
    let pods = factory.informer::<Pod>();
    let q = queue.clone();
    nodes.add_handler(move |c| match c {
        Change::Added(n) | Change::Updated { new: n, .. } => {
            if let Some(name) = &n.metadata.name {
                q.add(name.clone());
            }
        }
        Change::Deleted(_) => {}
    });
    tokio::spawn(async move {
        tracing::info!("Starting node controller");
        let Some(client) = client_for(&clients, "node-controller", &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            nodes,
            leases,
            pods,
            settings,
        });
        let synced = async {
            ctl.nodes.wait_synced().await;
            ctl.leases.wait_synced().await;
            ctl.pods.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        // Every monitor period, every node is looked at again (heartbeats age silently).
        let (c, q, mut s) = (ctl.clone(), queue.clone(), stop.clone());
        let period = ctl.settings.monitor_period;
        tokio::spawn(async move {
            loop {
                for n in c.nodes.list() {
                    if let Some(name) = &n.metadata.name {
                        q.add(name.clone());
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(period) => {}
                    _ = s.wait_for(|s| *s) => return,
                }
            }
        });
        let tasks = run_workers_of(
            "node-lifecycle",
            queue,
            1,
            stop,
            &ctl,
            |c, key| async move { c.sync(&key).await },
        );
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down node controller");
    })
}

fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

fn rfc3339(t: k8s_openapi::jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

impl Ctl {
    /// When the kubelet was last heard of: the later of its Ready heartbeat and its
    /// lease's renewal.
    fn last_heard(&self, node: &Node) -> Option<k8s_openapi::jiff::Timestamp> {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .map(|t| t.0);
        let name = node.metadata.name.as_deref().unwrap_or("");
        let lease = self
            .leases
            .get(&format!("kube-node-lease/{name}"))
            .and_then(|l| {
                l.spec
                    .as_ref()
                    .and_then(|s| s.renew_time.as_ref())
                    .map(|t| t.0)
            });
        match (ready, lease) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    async fn sync(&self, name: &str) -> Result<(), SyncError> {
        let Some(node) = self.nodes.get(name) else {
            return Ok(());
        };
        let mut node =
            serde_json::to_value(node.as_ref()).map_err(|e| SyncError::Failed(e.to_string()))?;
        let api: Api<Node> = Api::all(self.client.get());
        // 1. Heartbeats: past the grace period, every condition becomes Unknown.
        let created = node
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
        let typed: Node =
            serde_json::from_value(node.clone()).map_err(|e| SyncError::Failed(e.to_string()))?;
        let heard = self.last_heard(&typed).or(created);
        let conditions = node
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        // A kubelet that never posted a Ready condition gets the startup grace period.
        let grace = if conditions.iter().any(|c| c["type"] == "Ready") {
            self.settings.grace_period
        } else {
            self.settings.startup_grace_period
        };
        let grace = k8s_openapi::jiff::SignedDuration::try_from(grace).unwrap_or_default();
        let stale = heard.is_some_and(|t| now().duration_since(t) > grace);
        let ready_status = conditions
            .iter()
            .find(|c| c["type"] == "Ready")
            .and_then(|c| c["status"].as_str())
            .unwrap_or("Unknown")
            .to_owned();
        if stale && (ready_status != "Unknown" || conditions.is_empty()) {
            let never = conditions.is_empty();
            let (reason, message) = if never {
                (
                    "NodeStatusNeverUpdated",
                    "Kubelet never posted node status.",
                )
            } else {
                ("NodeStatusUnknown", "Kubelet stopped posting node status.")
            };
            let stamp = rfc3339(now());
            let mut updated: Vec<Value> = Vec::new();
            for t in ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"] {
                let old = conditions.iter().find(|c| c["type"] == t);
                let mut c = json!({
                    "type": t, "status": "Unknown", "reason": reason, "message": message,
                    "lastTransitionTime": stamp,
                });
                c["lastHeartbeatTime"] = old
                    .map(|o| o["lastHeartbeatTime"].clone())
                    .unwrap_or(json!(stamp));
                if old.is_some_and(|o| o["status"] == "Unknown") {
                    if let Some(o) = old {
                        c["lastTransitionTime"] = o["lastTransitionTime"].clone();
                    }
                }
                updated.push(c);
            }
            for c in &conditions {
                if !updated.iter().any(|u| u["type"] == c["type"]) {
                    updated.push(c.clone());
                }
            }
            let patch = json!({"status": {"conditions": updated}});
            let written = api
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await?;
            node = serde_json::to_value(&written).map_err(|e| SyncError::Failed(e.to_string()))?;
            tracing::info!(node = name, "node became Unknown: {message}");
            self.mark_pods_not_ready(name).await;
        }
        // 2. Taints follow the conditions.
        self.sync_taints(&api, name, &node).await
    }

    /// Pods on an unreachable node are not ready any more (upstream's MarkPodsNotReady).
    async fn mark_pods_not_ready(&self, node: &str) {
        for p in self.pods.list() {
            if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node) {
                continue;
            }
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let name = p.metadata.name.clone().unwrap_or_default();
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if !ready {
                continue;
            }
            let api: Api<Pod> = Api::namespaced(self.client.get(), &ns);
            let patch = json!({"status": {"conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": rfc3339(now())},
            ]}});
            if let Err(e) = api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                tracing::warn!(namespace = %ns, pod = %name, error = %e, "marking a pod not ready");
            }
        }
    }

    async fn sync_taints(
        &self,
        api: &Api<Node>,
        name: &str,
        node: &Value,
    ) -> Result<(), SyncError> {
        let conditions = node
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let status_of = |t: &str| {
            conditions
                .iter()
                .find(|c| c["type"] == t)
                .and_then(|c| c["status"].as_str())
                .map(str::to_owned)
        };
        let mut wanted_no_schedule: Vec<&str> = CONDITION_TAINTS
            .iter()
            .filter(|(t, s, _)| status_of(t).as_deref() == Some(*s))
            .map(|(_, _, k)| *k)
            .collect();
        if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
            wanted_no_schedule.push(UNSCHEDULABLE);
        }
        let wanted_no_execute: Option<&str> = match status_of("Ready").as_deref() {
            Some("False") => Some(NOT_READY),
            Some("Unknown") => Some(UNREACHABLE),
            _ => None,
        };
        let taints: Vec<Value> = node
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let managed_no_schedule: Vec<&str> = CONDITION_TAINTS
            .iter()
            .map(|(_, _, k)| *k)
            .chain([UNSCHEDULABLE])
            .collect();
        let mut new: Vec<Value> = Vec::new();
        let mut seen: HashMap<(String, String), bool> = HashMap::new();
        for t in &taints {
            let key = t["key"].as_str().unwrap_or("");
            let effect = t["effect"].as_str().unwrap_or("");
            let keep = match effect {
                "NoSchedule" if managed_no_schedule.contains(&key) => {
                    wanted_no_schedule.contains(&key)
                }
                "NoExecute" if key == NOT_READY || key == UNREACHABLE => {
                    wanted_no_execute == Some(key)
                }
                _ => true,
            };
            if keep {
                seen.insert((key.to_owned(), effect.to_owned()), true);
                new.push(t.clone());
            }
        }
        for k in &wanted_no_schedule {
            if !seen.contains_key(&((*k).to_owned(), "NoSchedule".to_owned())) {
                new.push(json!({"key": k, "effect": "NoSchedule"}));
            }
        }
        if let Some(k) = wanted_no_execute {
            if !seen.contains_key(&(k.to_owned(), "NoExecute".to_owned())) {
                new.push(json!({"key": k, "effect": "NoExecute", "timeAdded": rfc3339(now())}));
            }
        }
        if new == taints {
            return Ok(());
        }
        // The resourceVersion makes the write conditional: a conflict is retried.
        let rv = node
            .pointer("/metadata/resourceVersion")
            .cloned()
            .unwrap_or(Value::Null);
        // No taints left: the field goes (upstream's omitempty), not an empty list.
        let taints = if new.is_empty() {
            Value::Null
        } else {
            json!(new)
        };
        let patch = json!({"metadata": {"resourceVersion": rv}, "spec": {"taints": taints}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        Ok(())
    }
}
