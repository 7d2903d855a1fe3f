//! The cloud node-lifecycle controller (upstream's `CloudNodeLifecycleController`): every
//! `--node-monitor-period` it looks at each node. A Ready node loses the
//! `node.cloudprovider.kubernetes.io/shutdown` taint; a node that is not Ready is deleted
//! (event `DeletingNode`) when the cloud says its instance no longer exists, and gets the
//! shutdown taint when its instance exists but is shut down.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Taint};
use kube::api::{Api, DeleteParams, GetParams, Patch, PatchParams};
use kumo_client::clients::ClientSource;
use kumo_client::error::{is_conflict, message};
use kumo_client::events;
use kumo_client::informer::{Informer, InformerFactory};
use kumo_client::worker::{client_for, wait_for_sync};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Context;

/// The taint of a node whose instance is shut down (upstream's `TaintNodeShutdown`), with
/// effect NoSchedule.
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// The event source (upstream's recorder component).
pub const COMPONENT: &str = "cloud-node-lifecycle-controller";

const DELETE_NODE_EVENT: &str = "DeletingNode";
const DELETE_NODE_FAILED_EVENT: &str = "DeletingNodeFailed";

/// Upstream's `--concurrent-node-lifecycle-syncs` default.
const CONCURRENT_SYNCS: usize = 1;

/// Upstream's updateTaintBackoff: 5 tries, 100 ms with a jitter of 1.0.
const TAINT_STEPS: u32 = 5;
const TAINT_DELAY: Duration = Duration::from_millis(100);

struct Ctl {
    ctx: Arc<Context>,
    client: ClientSource,
    nodes: Arc<Informer<Node>>,
}

/// Registers the controller's handlers on `factory` and starts its workers.
pub fn start(
    ctx: Arc<Context>,
    factory: &InformerFactory,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let mut stop = stop;
    let nodes = factory.informer::<Node>();
    tokio::spawn(async move {
        let Some(client) = client_for(&ctx.clients, "node-controller", &mut stop).await else {
            return;
        };
        let ctl = Ctl { ctx, client, nodes };
        if !wait_for_sync(&mut stop, ctl.nodes.wait_synced()).await {
            return;
        }
        // Like wait.Until: a pass, then the period, measured from the pass's end.
        loop {
            ctl.monitor_nodes().await;
            tokio::select! {
                _ = tokio::time::sleep(ctl.ctx.config.node_monitor_period) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    })
}

fn is_shutdown_taint(t: &Taint) -> bool {
    t.key == TAINT_SHUTDOWN && t.effect == "NoSchedule"
}

fn shutdown_taint() -> Taint {
    Taint {
        key: TAINT_SHUTDOWN.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    }
}

fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// The node's Ready status; Unknown without the condition.
fn ready_status(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map_or_else(|| "Unknown".to_owned(), |c| c.status.clone())
}

/// `base` plus up to `base` again (wait.Backoff's Jitter 1.0).
fn jittered(base: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    base + base.mul_f64(f64::from(nanos % 1000) / 1000.0)
}

impl Ctl {
    fn api(&self) -> Api<Node> {
        Api::all(self.client.get())
    }

    /// One pass over every node in the cache.
    async fn monitor_nodes(&self) {
        let nodes = self.nodes.list();
        futures::stream::iter(nodes)
            .for_each_concurrent(CONCURRENT_SYNCS, |node| async move {
                self.process_node(&node).await;
            })
            .await;
    }

    async fn process_node(&self, node: &Node) {
        let Some(instances) = self.ctx.cloud.instances_v2() else {
            return;
        };
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if ready_status(node) == "True" {
            if taints(node).iter().any(is_shutdown_taint) {
                if let Err(e) = self.update_taints(name, false).await {
                    tracing::error!("error patching node taints: {e}");
                }
            }
            return;
        }
        // Not Ready: has the instance gone from the cloud?
        let exists = match instances.instance_exists(node).await {
            Ok(x) => x,
            Err(e) => {
                tracing::error!("error checking if node {name} exists: {e}");
                return;
            }
        };
        if !exists {
            // Its taints do not matter any more.
            tracing::info!("deleting node since it is no longer present in cloud provider: {name}");
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.to_owned()),
                uid: node.metadata.uid.clone(),
                ..Default::default()
            };
            events::record(
                &self.client,
                COMPONENT,
                reference.clone(),
                "Normal",
                DELETE_NODE_EVENT,
                format!("Deleting node {name} because it does not exist in the cloud provider"),
            )
            .await;
            if let Err(e) = self.api().delete(name, &DeleteParams::default()).await {
                let msg = message(&e);
                tracing::error!("unable to delete node {name:?}: {msg}");
                events::record(
                    &self.client,
                    COMPONENT,
                    reference,
                    "Warning",
                    DELETE_NODE_FAILED_EVENT,
                    format!("Failed deleting node {name}: {msg}"),
                )
                .await;
            }
            return;
        }
        let shutdown = match instances.instance_shutdown(node).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("error checking if node {name} is shutdown: {e}");
                return;
            }
        };
        if shutdown {
            if let Err(e) = self.update_taints(name, true).await {
                tracing::error!(
                    "failed to apply shutdown taint to node {name}, it may have been deleted: {e}"
                );
            }
        }
    }

    /// Adds (or removes) the shutdown taint on the node as it is now, conditional on its
    /// resourceVersion and retried on conflict (upstream's AddOrUpdateTaintOnNode and
    /// RemoveTaintOffNode).
    async fn update_taints(&self, name: &str, add: bool) -> Result<(), String> {
        let api = self.api();
        let mut step = 0;
        loop {
            step += 1;
            // First from the API server's cache, then fresh after a conflict.
            let params = if step == 1 {
                GetParams::any()
            } else {
                GetParams::default()
            };
            let node = api.get_with(name, &params).await.map_err(|e| message(&e))?;
            let old = taints(&node);
            let mut new: Vec<Taint> = old
                .iter()
                .filter(|t| !is_shutdown_taint(t))
                .cloned()
                .collect();
            if add {
                let want = shutdown_taint();
                let same = |t: &Taint| {
                    is_shutdown_taint(t)
                        && t.value.as_deref().unwrap_or_default().is_empty()
                        && t.time_added.is_none()
                };
                if old.iter().any(same) {
                    return Ok(());
                }
                // In place of a differing one, else at the end.
                match old.iter().position(is_shutdown_taint) {
                    Some(i) => new.insert(i.min(new.len()), want),
                    None => new.push(want),
                }
            } else if new.len() == old.len() {
                return Ok(());
            }
            let taints = if new.is_empty() {
                Value::Null
            } else {
                json!(new)
            };
            let patch = json!({
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": taints},
            });
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if is_conflict(&e) && step < TAINT_STEPS => {
                    tokio::time::sleep(jittered(TAINT_DELAY)).await;
                }
                Err(e) => return Err(message(&e)),
            }
        }
    }
}
