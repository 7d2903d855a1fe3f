//! The service (load balancer) controller, as k8s.io/cloud-provider's
//! controllers/service: a cloud load balancer for every Service of type LoadBalancer
//! without a loadBalancerClass, guarded by the `service.kubernetes.io/load-balancer-cleanup`
//! finalizer, with its ingress written to the Service's status; and a node sync that
//! points every balancer at the new node set whenever it changes.
//!
//! Failed syncs come back after a per-Service exponential delay of 5 s doubling to 300 s;
//! a provider's [`Error::RetryAfter`] comes back after its delay without counting a
//! failure. Cloud errors become events and retries, never a crash.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Node, ObjectReference, Service,
};
use kube::api::{Api, Patch, PatchParams};
use kumo_client::clients::ClientSource;
use kumo_client::error::{is_not_found, message};
use kumo_client::events::{self, reference};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers, wait_for_sync, SyncError};
use kumo_client::workqueue::{RateLimiter, WorkQueue};
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::Context;
use crate::{Error, LoadBalancer};

/// The finalizer that keeps a Service until its balancer is deleted.
pub const LOAD_BALANCER_CLEANUP_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// The label that keeps a node out of every load balancer (`v1.LabelNodeExcludeBalancers`).
pub const LABEL_NODE_EXCLUDE_BALANCERS: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";
/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
/// The first retry delay of a failed Service (upstream's `minRetryDelay`).
pub const MIN_RETRY_DELAY: Duration = Duration::from_secs(5);
/// The longest retry delay of a failed Service (upstream's `maxRetryDelay`).
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(300);
/// The events' source and the controller's ServiceAccount.
const COMPONENT: &str = "service-controller";
/// How many node names an UpdateLoadBalancerFailed event lists.
const MAX_NODE_NAMES_TO_LOG: usize = 20;

/// Registers the controller's handlers on `factory` and starts its workers.
pub fn start(
    ctx: Arc<Context>,
    factory: &InformerFactory,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    // Upstream's queues only have the per-item exponential limiter (no overall bucket).
    let limiter = || RateLimiter::new(MIN_RETRY_DELAY, MAX_RETRY_DELAY, 1e9, u32::MAX);
    let service_queue = factory.queue_with_limiter("service", limiter());
    let node_queue = factory.queue_with_limiter("node", limiter());
    let services = factory.informer::<Service>();
    let nodes = factory.informer::<Node>();
    let q = service_queue.clone();
    services.add_handler(move |c| match c {
        // Cleanup on add too: a remedy for changes missed while the controller was down.
        Change::Added(s) if wants_load_balancer(s) || needs_cleanup(s) => q.add(key_of(s)),
        Change::Updated { old, new } if needs_update(old, new) || needs_cleanup(new) => {
            q.add(key_of(new))
        }
        // Deletion arrives as the update that sets the deletionTimestamp (the finalizer).
        _ => {}
    });
    let q = node_queue.clone();
    nodes.add_handler(move |c| match c {
        Change::Added(n) | Change::Deleted(n) => q.add(key_of(n)),
        Change::Updated { old, new } if should_sync_updated_node(old, new) => q.add(key_of(new)),
        Change::Updated { .. } => {}
    });
    let mut stop = stop;
    tokio::spawn(async move {
        tracing::info!("Starting service controller");
        let Some(client) = client_for(&ctx.clients, COMPONENT, &mut stop).await else {
            return;
        };
        let synced = async {
            services.wait_synced().await;
            nodes.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let recorder = tokio::spawn(record_events(client.clone(), events_rx, stop.clone()));
        let workers = ctx.config.concurrent_service_syncs.max(1);
        let ctl = Arc::new(Ctl {
            ctx,
            client,
            services,
            nodes,
            service_queue: service_queue.clone(),
            events: events_tx,
            cache: Mutex::new(HashMap::new()),
            last_synced_nodes: Mutex::new(HashMap::new()),
        });
        let c = ctl.clone();
        let mut tasks = run_workers(
            "service",
            service_queue,
            workers,
            stop.clone(),
            move |key| {
                let c = c.clone();
                async move {
                    c.sync_service(&key).await.map_err(|f| {
                        if let Some(d) = f.retry_after {
                            tracing::warn!(service = %key, error = %f, "error processing service (retrying in {d:?})");
                        }
                        SyncError::from(f)
                    })
                }
            },
        );
        // One node worker, so one node change is handled at a time; it updates the
        // balancers `workers` at a time.
        let c = ctl.clone();
        tasks.extend(run_workers(
            "service-node",
            node_queue,
            1,
            stop,
            move |_key| {
                let c = c.clone();
                async move {
                    for key in c.sync_nodes(workers).await {
                        c.service_queue.add(key);
                    }
                    Ok(())
                }
            },
        ));
        drop(ctl);
        futures::future::join_all(tasks).await;
        let _ = recorder.await;
        tracing::info!("Shutting down service controller");
    })
}

/// One event to record.
struct Ev {
    object: ObjectReference,
    type_: &'static str,
    reason: &'static str,
    message: String,
}

/// Records events in the order they were made, off the sync path (as client-go's
/// broadcaster does), until the controller stops.
async fn record_events(
    client: ClientSource,
    mut rx: mpsc::UnboundedReceiver<Ev>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => ev,
            _ = stop.wait_for(|s| *s) => None,
        };
        let Some(ev) = ev else { return };
        events::record(
            &client, COMPONENT, ev.object, ev.type_, ev.reason, ev.message,
        )
        .await;
    }
}

/// Why a sync failed; `retry_after` when the provider asked to come back later.
#[derive(Debug)]
struct Failure {
    message: String,
    retry_after: Option<Duration>,
}

impl Failure {
    fn new(message: String) -> Self {
        Failure {
            message,
            retry_after: None,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<Failure> for SyncError {
    fn from(f: Failure) -> Self {
        match f.retry_after {
            Some(d) => SyncError::After(d),
            None => SyncError::Failed(f.message),
        }
    }
}

/// What a sync did to the balancer.
#[derive(PartialEq)]
enum Op {
    Delete,
    Ensure,
}

struct Ctl {
    ctx: Arc<Context>,
    client: ClientSource,
    services: Arc<Informer<Service>>,
    nodes: Arc<Informer<Node>>,
    service_queue: Arc<WorkQueue<String>>,
    events: mpsc::UnboundedSender<Ev>,
    /// The last state of every Service synced (upstream's serviceCache): the node sync
    /// updates these, and a Service gone from the informer is cleaned up from here.
    cache: Mutex<HashMap<String, Arc<Service>>>,
    /// The nodes each Service's balancer was last pointed at.
    last_synced_nodes: Mutex<HashMap<String, Vec<Arc<Node>>>>,
}

impl Ctl {
    fn balancer(&self) -> Result<&dyn LoadBalancer, Failure> {
        self.ctx.cloud.load_balancer().ok_or_else(|| {
            Failure::new("the cloud provider does not support external load balancers".into())
        })
    }

    fn cluster(&self) -> &str {
        &self.ctx.config.cluster_name
    }

    fn event(&self, svc: &Service, type_: &'static str, reason: &'static str, message: String) {
        let _ = self.events.send(Ev {
            object: reference(svc),
            type_,
            reason,
            message,
        });
    }

    async fn sync_service(&self, key: &str) -> Result<(), Failure> {
        match self.services.get(key) {
            // Gone from the store: make sure its balancer is gone too.
            None => self.process_service_deletion(key).await,
            Some(svc) => {
                self.process_service_create_or_update((*svc).clone(), key)
                    .await
            }
        }
    }

    async fn process_service_create_or_update(
        &self,
        svc: Service,
        key: &str,
    ) -> Result<(), Failure> {
        let cached = self.cache.lock().get(key).cloned();
        if let Some(old) = cached {
            // Deleted and re-created quickly (only possible without the finalizer).
            if old.metadata.uid != svc.metadata.uid {
                self.process_load_balancer_delete(&old).await?;
            }
        }
        let svc = Arc::new(svc);
        self.cache.lock().insert(key.to_owned(), svc.clone());
        match self.sync_load_balancer_if_needed(&svc, key).await {
            Err(e) => {
                self.event(
                    &svc,
                    "Warning",
                    "SyncLoadBalancerFailed",
                    format!("Error syncing load balancer: {e}"),
                );
                Err(e)
            }
            Ok(Op::Delete) => {
                // Forgotten only once the balancer is deleted.
                self.cache.lock().remove(key);
                Ok(())
            }
            Ok(Op::Ensure) => Ok(()),
        }
    }

    async fn sync_load_balancer_if_needed(&self, svc: &Service, key: &str) -> Result<Op, Failure> {
        let balancer = self.balancer()?;
        let cluster = self.cluster();
        let previous = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.clone())
            .unwrap_or_default();
        let op;
        let new_status;
        if !wants_load_balancer(svc) || needs_cleanup(svc) {
            op = Op::Delete;
            new_status = LoadBalancerStatus::default();
            let exists = balancer
                .get_load_balancer(cluster, svc)
                .await
                .map_err(|e| {
                    Failure::new(format!(
                        "failed to check if load balancer exists before cleanup: {e}"
                    ))
                })?
                .is_some();
            if exists {
                tracing::info!(service = key, "Deleting existing load balancer");
                self.event(
                    svc,
                    "Normal",
                    "DeletingLoadBalancer",
                    "Deleting load balancer".into(),
                );
                match balancer.ensure_load_balancer_deleted(cluster, svc).await {
                    Ok(()) | Err(Error::ImplementedElsewhere) => {}
                    Err(e) => {
                        return Err(Failure::new(format!("failed to delete load balancer: {e}")))
                    }
                }
            }
            // Always: the Service can go once its balancer is gone.
            self.remove_finalizer(svc).await.map_err(|e| {
                Failure::new(format!(
                    "failed to remove load balancer cleanup finalizer: {e}"
                ))
            })?;
            self.event(
                svc,
                "Normal",
                "DeletedLoadBalancer",
                "Deleted load balancer".into(),
            );
        } else {
            op = Op::Ensure;
            tracing::info!(service = key, "Ensuring load balancer");
            self.event(
                svc,
                "Normal",
                "EnsuringLoadBalancer",
                "Ensuring load balancer".into(),
            );
            // Before creating: the Service cannot go until its balancer is deleted.
            self.add_finalizer(svc).await.map_err(|e| {
                Failure::new(format!(
                    "failed to add load balancer cleanup finalizer: {e}"
                ))
            })?;
            match self.ensure_load_balancer(balancer, svc).await {
                Ok(s) => new_status = s,
                Err(Error::ImplementedElsewhere) => return Ok(op),
                Err(e) => {
                    let retry_after = match &e {
                        Error::RetryAfter { after, .. } => Some(*after),
                        _ => None,
                    };
                    return Err(Failure {
                        message: format!("failed to ensure load balancer: {e}"),
                        retry_after,
                    });
                }
            }
            self.event(
                svc,
                "Normal",
                "EnsuredLoadBalancer",
                "Ensured load balancer".into(),
            );
        }
        if let Err(e) = self.patch_status(svc, &previous, &new_status).await {
            // Not found: the Service went away right after its finalizer did.
            if !is_not_found(&e) {
                return Err(Failure::new(format!(
                    "failed to update load balancer status: {}",
                    message(&e)
                )));
            }
        }
        Ok(op)
    }

    async fn ensure_load_balancer(
        &self,
        balancer: &dyn LoadBalancer,
        svc: &Service,
    ) -> Result<LoadBalancerStatus, Error> {
        let nodes = filter_nodes(self.nodes.list(), stable_node_set);
        if nodes.is_empty() {
            self.event(
                svc,
                "Warning",
                "UnAvailableLoadBalancer",
                "There are no available nodes for LoadBalancer".into(),
            );
        }
        self.store_last_synced_nodes(svc, nodes.clone());
        let nodes: Vec<Node> = nodes.iter().map(|n| (**n).clone()).collect();
        balancer
            .ensure_load_balancer(self.cluster(), svc, &nodes)
            .await
    }

    fn store_last_synced_nodes(&self, svc: &Service, nodes: Vec<Arc<Node>>) {
        self.last_synced_nodes.lock().insert(key_of(svc), nodes);
    }

    fn last_synced_nodes(&self, svc: &Service) -> Vec<Arc<Node>> {
        self.last_synced_nodes
            .lock()
            .get(&key_of(svc))
            .cloned()
            .unwrap_or_default()
    }

    async fn process_service_deletion(&self, key: &str) -> Result<(), Failure> {
        let Some(cached) = self.cache.lock().get(key).cloned() else {
            // Never had a balancer, or it is already deleted.
            return Ok(());
        };
        tracing::info!(
            service = key,
            "Service has been deleted. Attempting to cleanup load balancer resources"
        );
        self.process_load_balancer_delete(&cached).await?;
        self.cache.lock().remove(key);
        Ok(())
    }

    async fn process_load_balancer_delete(&self, svc: &Service) -> Result<(), Failure> {
        if !wants_load_balancer(svc) {
            return Ok(());
        }
        let balancer = self.balancer()?;
        self.event(
            svc,
            "Normal",
            "DeletingLoadBalancer",
            "Deleting load balancer".into(),
        );
        if let Err(e) = balancer
            .ensure_load_balancer_deleted(self.cluster(), svc)
            .await
        {
            self.event(
                svc,
                "Warning",
                "DeleteLoadBalancerFailed",
                format!("Error deleting load balancer: {e}"),
            );
            return Err(Failure::new(e.to_string()));
        }
        self.event(
            svc,
            "Normal",
            "DeletedLoadBalancer",
            "Deleted load balancer".into(),
        );
        Ok(())
    }

    fn api(&self, svc: &Service) -> Api<Service> {
        Api::namespaced(
            self.client.get(),
            svc.metadata.namespace.as_deref().unwrap_or("default"),
        )
    }

    /// Patches through the status subresource, as upstream's `PatchService` does for both
    /// the finalizer and the status.
    async fn patch_service(&self, svc: &Service, patch: serde_json::Value) -> kube::Result<()> {
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        self.api(svc)
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .map(|_| ())
    }

    async fn add_finalizer(&self, svc: &Service) -> Result<(), String> {
        if has_lb_finalizer(svc) {
            return Ok(());
        }
        let mut finalizers = svc.metadata.finalizers.clone().unwrap_or_default();
        finalizers.push(LOAD_BALANCER_CLEANUP_FINALIZER.into());
        tracing::info!(service = %key_of(svc), "Adding finalizer to service");
        self.patch_service(svc, json!({"metadata": {"finalizers": finalizers}}))
            .await
            .map_err(|e| message(&e))
    }

    async fn remove_finalizer(&self, svc: &Service) -> Result<(), String> {
        if !has_lb_finalizer(svc) {
            return Ok(());
        }
        let rest: Vec<&String> = svc
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != LOAD_BALANCER_CLEANUP_FINALIZER)
            .collect();
        let finalizers = if rest.is_empty() {
            serde_json::Value::Null
        } else {
            json!(rest)
        };
        tracing::info!(service = %key_of(svc), "Removing finalizer from service");
        self.patch_service(svc, json!({"metadata": {"finalizers": finalizers}}))
            .await
            .map_err(|e| message(&e))
    }

    /// Writes the status only when its ingress changed.
    async fn patch_status(
        &self,
        svc: &Service,
        previous: &LoadBalancerStatus,
        new: &LoadBalancerStatus,
    ) -> kube::Result<()> {
        if load_balancer_status_equal(previous, new) {
            return Ok(());
        }
        tracing::info!(service = %key_of(svc), "Patching status for service");
        let ingress = match new.ingress.as_deref() {
            None | Some([]) => serde_json::Value::Null,
            Some(i) => json!(i),
        };
        self.patch_service(
            svc,
            json!({"status": {"loadBalancer": {"ingress": ingress}}}),
        )
        .await
    }

    /// Points every synced balancer at the current node set, `workers` at a time; returns
    /// the keys of the Services whose update failed (they get a full sync).
    async fn sync_nodes(&self, workers: usize) -> BTreeSet<String> {
        let services: Vec<Arc<Service>> = self.cache.lock().values().cloned().collect();
        let total = services.len();
        let retry: BTreeSet<String> = futures::stream::iter(services)
            .map(|svc| async move { self.node_sync_service(&svc).await.then(|| key_of(&*svc)) })
            .buffer_unordered(workers.max(1))
            .filter_map(|k| async move { k })
            .collect()
            .await;
        tracing::debug!(
            "Successfully updated {} out of {total} load balancers to direct traffic to the updated set of nodes",
            total - retry.len()
        );
        retry
    }

    /// Updates one Service's balancer if its node set changed; true when it should be
    /// retried.
    async fn node_sync_service(&self, svc: &Service) -> bool {
        if !wants_load_balancer(svc) {
            return false;
        }
        let new_nodes = filter_nodes(self.nodes.list(), stable_node_set);
        let old_nodes = filter_nodes(self.last_synced_nodes(svc), stable_node_set);
        // Stored whether or not the update succeeds: failures are retried through the
        // service queue, and storing now avoids updating twice.
        self.store_last_synced_nodes(svc, new_nodes.clone());
        if nodes_sufficiently_equal(&old_nodes, &new_nodes) {
            return false;
        }
        if let Err(e) = self.update_load_balancer_hosts(svc, &new_nodes).await {
            tracing::warn!(service = %key_of(svc), error = %e, "failed to update load balancer hosts");
            return true;
        }
        false
    }

    async fn update_load_balancer_hosts(
        &self,
        svc: &Service,
        hosts: &[Arc<Node>],
    ) -> Result<(), Failure> {
        let balancer = self.balancer()?;
        let cluster = self.cluster();
        let nodes: Vec<Node> = hosts.iter().map(|n| (**n).clone()).collect();
        tracing::info!(service = %key_of(svc), nodes = hosts.len(), "Updating backends for load balancer");
        let err = match balancer.update_load_balancer(cluster, svc, &nodes).await {
            Ok(()) => {
                if hosts.is_empty() {
                    self.event(
                        svc,
                        "Warning",
                        "UnAvailableLoadBalancer",
                        "There are no available nodes for LoadBalancer".into(),
                    );
                } else {
                    self.event(
                        svc,
                        "Normal",
                        "UpdatedLoadBalancer",
                        "Updated load balancer with new hosts".into(),
                    );
                }
                return Ok(());
            }
            Err(Error::ImplementedElsewhere) => return Ok(()),
            Err(e) => e,
        };
        // Only a failure if the balancer still exists.
        match balancer.get_load_balancer(cluster, svc).await {
            Err(e) => {
                tracing::warn!(service = %key_of(svc), error = %e, "failed to check if load balancer exists")
            }
            Ok(None) => return Ok(()),
            Ok(Some(_)) => {}
        }
        self.event(
            svc,
            "Warning",
            "UpdateLoadBalancerFailed",
            format!(
                "Error updating load balancer with new hosts {} [node names limited, total number of nodes: {}], error: {err}",
                loggable_node_names(hosts),
                hosts.len()
            ),
        );
        Err(Failure::new(err.to_string()))
    }
}

/// Whether the Service wants a balancer from this controller: type LoadBalancer and no
/// loadBalancerClass (a class means another implementation).
pub fn wants_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().is_some_and(|s| {
        s.type_.as_deref() == Some("LoadBalancer") && s.load_balancer_class.is_none()
    })
}

fn has_lb_finalizer(svc: &Service) -> bool {
    svc.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == LOAD_BALANCER_CLEANUP_FINALIZER)
}

/// Whether the Service's balancer must be cleaned up: it has the finalizer and is being
/// deleted or no longer of type LoadBalancer.
pub fn needs_cleanup(svc: &Service) -> bool {
    if !has_lb_finalizer(svc) {
        return false;
    }
    svc.metadata.deletion_timestamp.is_some()
        || svc.spec.as_ref().and_then(|s| s.type_.as_deref()) != Some("LoadBalancer")
}

/// Whether a change to the Service matters to its balancer (upstream's `needsUpdate`).
pub fn needs_update(old: &Service, new: &Service) -> bool {
    let (wo, wn) = (wants_load_balancer(old), wants_load_balancer(new));
    if !wo && !wn {
        return false;
    }
    if wo != wn {
        return true;
    }
    let default = Default::default();
    let os = old.spec.as_ref().unwrap_or(&default);
    let ns = new.spec.as_ref().unwrap_or(&default);
    if os.load_balancer_source_ranges != ns.load_balancer_source_ranges {
        return true;
    }
    let ports_equal = {
        let (a, b) = (
            os.ports.as_deref().unwrap_or_default(),
            ns.ports.as_deref().unwrap_or_default(),
        );
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                x.name == y.name
                    && x.protocol == y.protocol
                    && x.port == y.port
                    && x.node_port == y.node_port
                    && x.target_port == y.target_port
                    && x.app_protocol == y.app_protocol
            })
    };
    if !ports_equal || os.session_affinity != ns.session_affinity {
        return true;
    }
    if os.session_affinity_config != ns.session_affinity_config {
        return true;
    }
    if os.load_balancer_ip != ns.load_balancer_ip {
        return true;
    }
    if os.external_ips != ns.external_ips {
        return true;
    }
    if old.metadata.annotations != new.metadata.annotations {
        return true;
    }
    if old.metadata.uid != new.metadata.uid {
        return true;
    }
    if os.external_traffic_policy != ns.external_traffic_policy {
        return true;
    }
    if os.health_check_node_port != ns.health_check_node_port {
        return true;
    }
    // Families may be added or removed, not changed: only the count matters.
    let families =
        |s: &k8s_openapi::api::core::v1::ServiceSpec| s.ip_families.as_ref().map_or(0, Vec::len);
    families(os) != families(ns)
}

/// Ingress lists compared as upstream's semantic equality does (empty and absent alike).
fn load_balancer_status_equal(a: &LoadBalancerStatus, b: &LoadBalancerStatus) -> bool {
    fn norm(s: &LoadBalancerStatus) -> Vec<LoadBalancerIngress> {
        s.ingress
            .iter()
            .flatten()
            .cloned()
            .map(|mut i| {
                if i.ports.as_ref().is_some_and(Vec::is_empty) {
                    i.ports = None;
                }
                i
            })
            .collect()
    }
    norm(a) == norm(b)
}

/// The node is not labelled out of load balancers (a label value that is not a boolean
/// excludes it too).
pub fn node_included(node: &Node) -> bool {
    match node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_NODE_EXCLUDE_BALANCERS))
    {
        None => true,
        Some(v) => parse_bool(v) == Some(false),
    }
}

/// Go's strconv.ParseBool.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn node_untainted(node: &Node) -> bool {
    !node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT))
}

fn node_not_deleted(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
}

/// The nodes a balancer points at (upstream's `stableNodeSetPredicates`): not being
/// deleted, not labelled out, not about to be removed by the cluster autoscaler. Readiness
/// is deliberately not one of them: a flapping node does not reshuffle balancers.
pub fn stable_node_set(node: &Node) -> bool {
    node_not_deleted(node) && node_included(node) && node_untainted(node)
}

fn filter_nodes(nodes: Vec<Arc<Node>>, keep: fn(&Node) -> bool) -> Vec<Arc<Node>> {
    nodes.into_iter().filter(|n| keep(n)).collect()
}

fn provider_id(node: &Node) -> Option<&str> {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref())
}

/// Whether a node update can change a balancer's node set: its exclusion or its
/// providerID changed.
fn should_sync_updated_node(old: &Node, new: &Node) -> bool {
    node_included(old) != node_included(new) || provider_id(old) != provider_id(new)
}

/// The same nodes by name, with the same providerIDs.
fn nodes_sufficiently_equal(old: &[Arc<Node>], new: &[Arc<Node>]) -> bool {
    let distill = |ns: &[Arc<Node>]| -> BTreeMap<String, Option<String>> {
        ns.iter()
            .map(|n| {
                (
                    n.metadata.name.clone().unwrap_or_default(),
                    provider_id(n).map(str::to_owned),
                )
            })
            .collect()
    };
    old.len() == new.len() && distill(old) == distill(new)
}

/// Up to 20 sorted node names and `<N more>`, as Go prints a string slice.
fn loggable_node_names(nodes: &[Arc<Node>]) -> String {
    let names = |ns: &[Arc<Node>]| -> Vec<String> {
        ns.iter()
            .map(|n| n.metadata.name.clone().unwrap_or_default())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let out = if nodes.len() > MAX_NODE_NAMES_TO_LOG {
        let mut v = names(&nodes[..MAX_NODE_NAMES_TO_LOG]);
        v.push(format!("<{} more>", nodes.len() - MAX_NODE_NAMES_TO_LOG));
        v
    } else {
        names(nodes)
    };
    format!("[{}]", out.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, ServicePort, ServiceSpec, Taint};

    fn svc(type_: &str) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                ports: Some(vec![ServicePort {
                    port: 80,
                    node_port: Some(30080),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(name: &str, label: Option<&str>, taint: Option<&str>) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        if let Some(v) = label {
            n.metadata.labels = Some(BTreeMap::from([(
                LABEL_NODE_EXCLUDE_BALANCERS.to_owned(),
                v.to_owned(),
            )]));
        }
        n.spec = Some(NodeSpec {
            taints: taint.map(|k| {
                vec![Taint {
                    key: k.into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
        Arc::new(n)
    }

    #[test]
    fn wants_and_cleanup() {
        let mut s = svc("LoadBalancer");
        assert!(wants_load_balancer(&s));
        assert!(!needs_cleanup(&s));
        s.spec.as_mut().expect("spec").load_balancer_class = Some("example.com/lb".into());
        assert!(!wants_load_balancer(&s));
        let mut c = svc("ClusterIP");
        assert!(!needs_cleanup(&c));
        c.metadata.finalizers = Some(vec![LOAD_BALANCER_CLEANUP_FINALIZER.into()]);
        assert!(needs_cleanup(&c));
    }

    #[test]
    fn updates_that_matter() {
        let a = svc("LoadBalancer");
        let mut b = a.clone();
        b.metadata.finalizers = Some(vec![LOAD_BALANCER_CLEANUP_FINALIZER.into()]);
        b.metadata.resource_version = Some("9".into());
        assert!(
            !needs_update(&a, &b),
            "finalizer and version changes do not"
        );
        b.spec
            .as_mut()
            .expect("spec")
            .ports
            .as_mut()
            .expect("ports")[0]
            .node_port = Some(30081);
        assert!(needs_update(&a, &b));
        let mut c = a.clone();
        c.metadata.annotations = Some(BTreeMap::from([("x".into(), "y".into())]));
        assert!(needs_update(&a, &c));
        assert!(needs_update(&a, &svc("ClusterIP")));
        assert!(!needs_update(&svc("ClusterIP"), &svc("NodePort")));
    }

    #[test]
    fn node_predicates() {
        assert!(stable_node_set(&node("a", None, None)));
        assert!(stable_node_set(&node("a", Some("false"), None)));
        assert!(!stable_node_set(&node("a", Some("true"), None)));
        assert!(
            !stable_node_set(&node("a", Some(""), None)),
            "not a boolean"
        );
        assert!(!stable_node_set(&node(
            "a",
            None,
            Some(TO_BE_DELETED_TAINT)
        )));
        assert!(stable_node_set(&node("a", None, Some("other"))));
        assert!(should_sync_updated_node(
            &node("a", None, None),
            &node("a", Some("true"), None)
        ));
        assert!(!should_sync_updated_node(
            &node("a", None, None),
            &node("a", None, Some(TO_BE_DELETED_TAINT))
        ));
    }

    #[test]
    fn node_names_are_limited_like_upstream() {
        let ns: Vec<Arc<Node>> = (0..22)
            .map(|i| node(&format!("n{i:02}"), None, None))
            .collect();
        let s = loggable_node_names(&ns);
        assert!(s.starts_with("[n00 n01 "), "{s}");
        assert!(s.ends_with(" n19 <2 more>]"), "{s}");
        assert_eq!(loggable_node_names(&ns[..2]), "[n00 n01]");
        assert!(nodes_sufficiently_equal(&ns[..2], &ns[..2]));
        assert!(!nodes_sufficiently_equal(&ns[..2], &ns[1..3]));
    }
}
