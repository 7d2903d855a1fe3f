//! namespace-controller: empties a namespace that is being deleted, then removes the
//! `kubernetes` finalizer through `/finalize` so the API server can delete it.
//!
//! As upstream: the namespace is marked Terminating; every namespaced resource the server
//! serves in its preferred version and that can be deleted is removed (pods first,
//! deletecollection where served, otherwise list and delete one by one, propagation
//! Background); the five deletion conditions report discovery, parsing, deletion, remaining
//! content and remaining finalizers; while content remains the namespace is looked at again
//! after an estimate.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, NamespaceCondition, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIResourceList, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};
use kube::Client;
use parking_lot::RwLock;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_conflict, is_method_not_supported, is_not_found, message};
use kumo_client::informer::{Change, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::{RateLimiter, WorkQueue};

/// The finalizer this controller owns.
pub const FINALIZER: &str = "kubernetes";
/// How long after a deletion is seen before the namespace is first looked at.
const DELETION_GRACE: Duration = Duration::from_secs(5);
/// The estimate when content remains only because of finalizers.
const FINALIZER_ESTIMATE_SECONDS: i64 = 15;
/// --namespace-sync-period.
const RESYNC: Duration = Duration::from_secs(300);
/// --concurrent-namespace-syncs.
const WORKERS: usize = 10;

/// One group/version/resource.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gvr {
    /// API group ("" for core).
    pub group: String,
    /// Version.
    pub version: String,
    /// Plural resource name.
    pub resource: String,
}

impl std::fmt::Display for Gvr {
    // schema.GroupVersionResource's String().
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}, Resource={}",
            self.group, self.version, self.resource
        )
    }
}

impl Gvr {
    fn collection_path(&self, ns: &str) -> String {
        if self.group.is_empty() {
            format!("/api/{}/namespaces/{ns}/{}", self.version, self.resource)
        } else {
            format!(
                "/apis/{}/{}/namespaces/{ns}/{}",
                self.group, self.version, self.resource
            )
        }
    }
}

/// A discovery failure: whole (no lists at all) or for some group versions.
#[derive(Debug)]
pub enum DiscoveryError {
    /// Some group versions could not be read (client-go's ErrGroupDiscoveryFailed).
    Groups(BTreeMap<String, String>),
    /// The group list itself failed.
    Other(String),
}

impl std::fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiscoveryError::Groups(g) => {
                let parts: Vec<String> = g.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                write!(
                    f,
                    "unable to retrieve the complete list of server APIs: {}",
                    parts.join(", ")
                )
            }
            DiscoveryError::Other(e) => f.write_str(e),
        }
    }
}

/// client-go's ServerPreferredNamespacedResources: for every group and resource, the
/// preferred version's entry (or the first version serving it), namespaced only, without
/// subresources; the lists that could be read, and what failed.
pub async fn preferred_namespaced_resources(
    client: &Client,
) -> (Vec<APIResourceList>, Option<DiscoveryError>) {
    // (group, versions in order, preferred version)
    let mut groups: Vec<(String, Vec<String>, String)> = Vec::new();
    match client.list_core_api_versions().await {
        Ok(v) => {
            let pref = v.versions.first().cloned().unwrap_or_default();
            groups.push((String::new(), v.versions, pref));
        }
        Err(e) => return (Vec::new(), Some(DiscoveryError::Other(message(&e)))),
    }
    match client.list_api_groups().await {
        Ok(list) => {
            for g in list.groups {
                let versions: Vec<String> = g.versions.iter().map(|v| v.version.clone()).collect();
                let pref = g
                    .preferred_version
                    .map(|p| p.version)
                    .or_else(|| versions.first().cloned())
                    .unwrap_or_default();
                groups.push((g.name, versions, pref));
            }
        }
        Err(e) => return (Vec::new(), Some(DiscoveryError::Other(message(&e)))),
    }
    let mut failed = BTreeMap::new();
    // (group, resource) -> (version, resource entry); remembers first-seen order.
    let mut chosen: BTreeMap<
        (String, String),
        (
            String,
            k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource,
        ),
    > = BTreeMap::new();
    let mut gv_order: Vec<(String, String)> = Vec::new();
    for (group, versions, preferred) in &groups {
        for version in versions {
            let gv = if group.is_empty() {
                version.clone()
            } else {
                format!("{group}/{version}")
            };
            let list = if group.is_empty() {
                client.list_core_api_resources(version).await
            } else {
                client.list_api_group_resources(&gv).await
            };
            let list = match list {
                Ok(l) => l,
                Err(e) => {
                    failed.insert(gv, message(&e));
                    continue;
                }
            };
            gv_order.push((group.clone(), version.clone()));
            for r in list.resources {
                if r.name.contains('/') {
                    continue;
                }
                let key = (group.clone(), r.name.clone());
                if chosen.contains_key(&key) && version != preferred {
                    continue;
                }
                chosen.insert(key, (version.clone(), r));
            }
        }
    }
    let mut result = Vec::new();
    for (group, version) in gv_order {
        let resources: Vec<_> = chosen
            .iter()
            .filter(|((g, _), (v, r))| *g == group && *v == version && r.namespaced)
            .map(|(_, (_, r))| r.clone())
            .collect();
        if resources.is_empty() {
            continue;
        }
        result.push(APIResourceList {
            group_version: if group.is_empty() {
                version
            } else {
                format!("{group}/{version}")
            },
            resources,
        });
    }
    let err = (!failed.is_empty()).then_some(DiscoveryError::Groups(failed));
    (result, err)
}

/// schema.ParseGroupVersion.
fn parse_group_version(gv: &str) -> Result<(String, String), String> {
    if gv.is_empty() || gv == "/" {
        return Ok((String::new(), String::new()));
    }
    match gv.matches('/').count() {
        0 => Ok((String::new(), gv.to_owned())),
        1 => {
            let (g, v) = gv.split_once('/').unwrap_or_default();
            Ok((g.to_owned(), v.to_owned()))
        }
        _ => Err(format!("unexpected GroupVersion string: {gv}")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    List,
    DeleteCollection,
}

struct Ctl {
    client: ClientSource,
    /// Operations discovery said a resource does not serve.
    unsupported: RwLock<HashSet<(Op, Gvr)>>,
}

/// Registers the handlers and returns the controller task (workers start once the cache synced).
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    // Upstream caps the namespace queue's per-item backoff at 60 s.
    let queue = factory.queue_with_limiter(
        "namespace",
        RateLimiter::new(Duration::from_millis(5), Duration::from_secs(60), 10.0, 100),
    );
    let informer = factory.informer::<Namespace>();
    let q = queue.clone();
    informer.add_handler(move |c| {
        let ns = match c {
            Change::Added(ns) | Change::Updated { new: ns, .. } => ns,
            Change::Deleted(_) => return,
        };
        enqueue(&q, ns);
    });
    tokio::spawn(async move {
        tracing::info!("Starting namespace controller");
        let Some(client) = client_for(&clients, "namespace-controller", &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            unsupported: RwLock::new(HashSet::new()),
        });
        ctl.init_op_cache().await;
        if !wait_for_sync(&mut stop, informer.wait_synced()).await {
            return;
        }
        // The informer's resync: every namespace is handed to the handler again.
        let resync = {
            let q = queue.clone();
            let informer = informer.clone();
            let mut stop = stop.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(RESYNC) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                    for ns in informer.list() {
                        enqueue(&q, &ns);
                    }
                }
            })
        };
        let mut tasks = run_workers_of(
            "namespace",
            queue,
            WORKERS,
            stop,
            &ctl,
            |c, key| async move { c.sync(&key).await },
        );
        tasks.push(resync);
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down namespace controller");
    })
}

fn enqueue(q: &Arc<WorkQueue<String>>, ns: &Namespace) {
    if ns.metadata.deletion_timestamp.is_none() {
        return;
    }
    if let Some(n) = &ns.metadata.name {
        // Give the deletion a moment so that content created alongside is seen.
        q.add_after(n.clone(), DELETION_GRACE);
    }
}

#[derive(Default)]
struct Conditions {
    new: Vec<NamespaceCondition>,
    delete_errors: Vec<String>,
}

const CONDITION_TYPES: [&str; 5] = [
    "NamespaceDeletionDiscoveryFailure",
    "NamespaceDeletionGroupVersionParsingFailure",
    "NamespaceDeletionContentFailure",
    "NamespaceContentRemaining",
    "NamespaceFinalizersRemaining",
];

fn ok_reason_message(t: &str) -> (&'static str, &'static str) {
    match t {
        "NamespaceDeletionDiscoveryFailure" => (
            "ResourcesDiscovered",
            "All resources successfully discovered",
        ),
        "NamespaceDeletionGroupVersionParsingFailure" => (
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed",
        ),
        "NamespaceDeletionContentFailure" => (
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization",
        ),
        "NamespaceContentRemaining" => ("ContentRemoved", "All content successfully removed"),
        _ => (
            "ContentHasNoFinalizers",
            "All content-preserving finalizers finished",
        ),
    }
}

fn condition(t: &str, status: &str, reason: &str, message: String) -> NamespaceCondition {
    NamespaceCondition {
        type_: t.into(),
        status: status.into(),
        last_transition_time: Some(Time(Timestamp::now())),
        reason: Some(reason.into()),
        message: Some(message),
    }
}

impl Conditions {
    fn discovery_err(&mut self, e: &DiscoveryError) {
        let msg = match e {
            DiscoveryError::Groups(g) => {
                format!("Discovery failed for some groups, {} failing: {e}", g.len())
            }
            DiscoveryError::Other(_) => e.to_string(),
        };
        self.new.push(condition(
            "NamespaceDeletionDiscoveryFailure",
            "True",
            "DiscoveryFailed",
            msg,
        ));
    }

    fn group_version_err(&mut self, e: String) {
        self.new.push(condition(
            "NamespaceDeletionGroupVersionParsingFailure",
            "True",
            "GroupVersionParsingFailed",
            e,
        ));
    }

    fn content_totals(
        &mut self,
        remaining: &BTreeMap<Gvr, usize>,
        finalizers: &BTreeMap<String, usize>,
    ) {
        if !remaining.is_empty() {
            let mut parts: Vec<String> = remaining
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(g, n)| format!("{}.{} has {n} resource instances", g.resource, g.group))
                .collect();
            parts.sort();
            self.new.push(condition(
                "NamespaceContentRemaining",
                "True",
                "SomeResourcesRemain",
                format!("Some resources are remaining: {}", parts.join(", ")),
            ));
        }
        if !finalizers.is_empty() {
            let mut parts: Vec<String> = finalizers
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(f, n)| format!("{f} in {n} resource instances"))
                .collect();
            parts.sort();
            self.new.push(condition(
                "NamespaceFinalizersRemaining",
                "True",
                "SomeFinalizersRemain",
                format!(
                    "Some content in the namespace has finalizers remaining: {}",
                    parts.join(", ")
                ),
            ));
        }
    }

    /// Applies the new conditions to `ns` (successful ones for the types not reported);
    /// true when anything changed.
    fn update(&mut self, ns: &mut Namespace) -> bool {
        if !self
            .new
            .iter()
            .any(|c| c.type_ == "NamespaceDeletionContentFailure")
            && !self.delete_errors.is_empty()
        {
            let mut msgs = self.delete_errors.clone();
            msgs.sort();
            self.new.push(condition(
                "NamespaceDeletionContentFailure",
                "True",
                "ContentDeletionFailed",
                format!(
                    "Failed to delete all resource types, {} remaining: {}",
                    msgs.len(),
                    msgs.join(", ")
                ),
            ));
        }
        let status = ns.status.get_or_insert_with(Default::default);
        let conds = status.conditions.get_or_insert_with(Vec::new);
        let mut changed = false;
        for t in CONDITION_TYPES {
            let new = self
                .new
                .iter()
                .find(|c| c.type_ == t)
                .cloned()
                .unwrap_or_else(|| {
                    let (reason, msg) = ok_reason_message(t);
                    condition(t, "False", reason, msg.to_owned())
                });
            match conds.iter_mut().find(|c| c.type_ == t) {
                None => {
                    conds.push(new);
                    changed = true;
                }
                Some(old) => {
                    if old.status != new.status
                        || old.message != new.message
                        || old.reason != new.reason
                    {
                        if old.status != new.status {
                            old.last_transition_time = Some(Time(Timestamp::now()));
                        }
                        old.status = new.status;
                        old.reason = new.reason;
                        old.message = new.message;
                        changed = true;
                    }
                }
            }
        }
        changed
    }
}

/// What one resource's deletion left behind.
#[derive(Default)]
struct Remaining {
    estimate: i64,
    count: usize,
    finalizers: BTreeMap<String, usize>,
}

enum Outcome {
    Deleted,
    Remaining(i64),
}

impl Ctl {
    fn namespaces(&self) -> Api<Namespace> {
        Api::all(self.client.get())
    }

    async fn init_op_cache(&self) {
        let (lists, err) = preferred_namespaced_resources(&self.client.get()).await;
        if let Some(e) = err {
            tracing::warn!(error = %e, "unable to get all supported resources from server");
        }
        let mut un = self.unsupported.write();
        for list in lists {
            let Ok((group, version)) = parse_group_version(&list.group_version) else {
                continue;
            };
            for r in list.resources {
                let gvr = Gvr {
                    group: group.clone(),
                    version: version.clone(),
                    resource: r.name.clone(),
                };
                for (op, verb) in [
                    (Op::List, "list"),
                    (Op::DeleteCollection, "deletecollection"),
                ] {
                    if !r.verbs.iter().any(|v| v == verb) {
                        un.insert((op, gvr.clone()));
                    }
                }
            }
        }
    }

    fn supported(&self, op: Op, gvr: &Gvr) -> bool {
        !self.unsupported.read().contains(&(op, gvr.clone()))
    }

    async fn sync(&self, name: &str) -> Result<(), SyncError> {
        match self.delete(name).await {
            Ok(Outcome::Deleted) => Ok(()),
            Ok(Outcome::Remaining(estimate)) => {
                let secs = estimate / 2 + 1;
                tracing::debug!(
                    namespace = name,
                    wait_seconds = secs,
                    "content remaining in namespace"
                );
                Err(SyncError::After(Duration::from_secs(secs.max(1) as u64)))
            }
            Err(e) => Err(SyncError::Failed(e)),
        }
    }

    async fn delete(&self, name: &str) -> Result<Outcome, String> {
        let ns = match self.namespaces().get(name).await {
            Ok(ns) => ns,
            Err(e) if is_not_found(&e) => return Ok(Outcome::Deleted),
            Err(e) => return Err(message(&e)),
        };
        if ns.metadata.deletion_timestamp.is_none() {
            return Ok(Outcome::Deleted);
        }
        let ns = match self.retry_on_conflict(ns, Step::MarkTerminating).await {
            Ok(ns) => ns,
            Err(e) if is_not_found(&e) => return Ok(Outcome::Deleted),
            Err(e) => return Err(message(&e)),
        };
        let finalizers_left = ns
            .spec
            .as_ref()
            .and_then(|s| s.finalizers.as_ref())
            .is_some_and(|f| !f.is_empty());
        if !finalizers_left {
            return Ok(Outcome::Deleted);
        }
        let estimate = self.delete_all_content(ns.clone()).await?;
        if estimate > 0 {
            return Ok(Outcome::Remaining(estimate));
        }
        match self.retry_on_conflict(ns, Step::Finalize).await {
            Ok(_) => Ok(Outcome::Deleted),
            Err(e) if is_not_found(&e) => Ok(Outcome::Deleted),
            Err(e) => Err(message(&e)),
        }
    }

    async fn retry_on_conflict(
        &self,
        mut ns: Namespace,
        step: Step,
    ) -> Result<Namespace, kube::Error> {
        loop {
            let r = match step {
                Step::MarkTerminating => self.mark_terminating(&ns).await,
                Step::Finalize => self.finalize(&ns).await,
            };
            match r {
                Err(e) if is_conflict(&e) => {
                    let name = ns.metadata.name.clone().unwrap_or_default();
                    let latest = self.namespaces().get(&name).await?;
                    if latest.metadata.uid != ns.metadata.uid {
                        return Err(kube::Error::Api(
                            kube::core::Status::failure(
                                "namespace uid has changed across retries",
                                "",
                            )
                            .boxed(),
                        ));
                    }
                    ns = latest;
                }
                other => return other,
            }
        }
    }

    async fn mark_terminating(&self, ns: &Namespace) -> Result<Namespace, kube::Error> {
        let phase = ns.status.as_ref().and_then(|s| s.phase.as_deref());
        if ns.metadata.deletion_timestamp.is_none() || phase == Some("Terminating") {
            return Ok(ns.clone());
        }
        let mut next = ns.clone();
        next.status.get_or_insert_with(Default::default).phase = Some("Terminating".into());
        let name = ns.metadata.name.clone().unwrap_or_default();
        self.namespaces()
            .replace_status(&name, &PostParams::default(), &next)
            .await
    }

    /// PUT /finalize with our finalizer removed (the rest sorted, as a string set).
    async fn finalize(&self, ns: &Namespace) -> Result<Namespace, kube::Error> {
        let mut next = Namespace {
            metadata: ns.metadata.clone(),
            spec: ns.spec.clone(),
            status: None,
        };
        let rest: BTreeSet<String> = ns
            .spec
            .as_ref()
            .and_then(|s| s.finalizers.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != FINALIZER)
            .collect();
        next.spec.get_or_insert_with(Default::default).finalizers =
            Some(rest.into_iter().collect());
        let name = ns.metadata.name.clone().unwrap_or_default();
        match self
            .namespaces()
            .replace_subresource("finalize", &name, &PostParams::default(), &next)
            .await
        {
            Err(e) if is_not_found(&e) => Ok(next),
            other => other,
        }
    }

    /// Deletes everything in the namespace; the estimate (seconds) of how long what is
    /// left will take, 0 when nothing is left.
    async fn delete_all_content(&self, mut ns: Namespace) -> Result<i64, String> {
        let name = ns.metadata.name.clone().unwrap_or_default();
        let deleted_at = ns
            .metadata
            .deletion_timestamp
            .as_ref()
            .map(|t| t.0)
            .unwrap_or_else(Timestamp::now);
        let mut errs: Vec<String> = Vec::new();
        let mut conds = Conditions::default();
        let mut estimate = 0i64;

        let (lists, derr) = preferred_namespaced_resources(&self.client.get()).await;
        if let Some(e) = derr {
            errs.push(e.to_string());
            conds.discovery_err(&e);
        }
        let mut gvrs: BTreeSet<Gvr> = BTreeSet::new();
        let mut parse_err = None;
        for list in &lists {
            let deletable: Vec<_> = list
                .resources
                .iter()
                .filter(|r| r.verbs.iter().any(|v| v == "delete"))
                .collect();
            if deletable.is_empty() {
                continue;
            }
            match parse_group_version(&list.group_version) {
                Ok((group, version)) => {
                    for r in deletable {
                        gvrs.insert(Gvr {
                            group: group.clone(),
                            version: version.clone(),
                            resource: r.name.clone(),
                        });
                    }
                }
                Err(e) => {
                    // GroupVersionResources gives up on the first bad group version.
                    parse_err = Some(e);
                    gvrs.clear();
                    break;
                }
            }
        }
        if let Some(e) = parse_err {
            errs.push(e.clone());
            conds.group_version_err(e);
        }

        let mut remaining: BTreeMap<Gvr, usize> = BTreeMap::new();
        let mut finalizers: BTreeMap<String, usize> = BTreeMap::new();
        let pods = Gvr {
            group: String::new(),
            version: "v1".into(),
            resource: "pods".into(),
        };
        if gvrs.contains(&pods) {
            let r = self.delete_gvr(&pods, &name, deleted_at).await;
            let (meta, err) = match r {
                Ok(m) => (m, None),
                Err((m, e)) => (m, Some(e)),
            };
            if let Some(e) = err {
                errs.push(format!(
                    "failed to delete pods for namespace: {name}, err: {e}"
                ));
                conds.delete_errors.push(e);
            }
            estimate = estimate.max(meta.estimate);
            if meta.count > 0 {
                remaining.insert(pods.clone(), meta.count);
                for (f, n) in meta.finalizers {
                    *finalizers.entry(f).or_default() += n;
                }
                // Pods go first: other content may be needed while they terminate.
                if conds.update(&mut ns) {
                    self.update_status(&ns).await;
                }
                return if errs.is_empty() {
                    Ok(estimate)
                } else {
                    Err(errs.join(", "))
                };
            }
        }
        for gvr in gvrs.iter().filter(|g| **g != pods) {
            let (meta, err) = match self.delete_gvr(gvr, &name, deleted_at).await {
                Ok(m) => (m, None),
                Err((m, e)) => (m, Some(e)),
            };
            if let Some(e) = err {
                errs.push(e.clone());
                conds.delete_errors.push(e);
            }
            estimate = estimate.max(meta.estimate);
            if meta.count > 0 {
                remaining.insert(gvr.clone(), meta.count);
                for (f, n) in meta.finalizers {
                    *finalizers.entry(f).or_default() += n;
                }
            }
        }
        conds.content_totals(&remaining, &finalizers);
        if conds.update(&mut ns) {
            self.update_status(&ns).await;
        }
        if errs.is_empty() {
            Ok(estimate)
        } else {
            // utilerrors.NewAggregate's format.
            Err(if errs.len() == 1 {
                errs.remove(0)
            } else {
                format!("[{}]", errs.join(", "))
            })
        }
    }

    async fn update_status(&self, ns: &Namespace) {
        let name = ns.metadata.name.clone().unwrap_or_default();
        if let Err(e) = self
            .namespaces()
            .replace_status(&name, &PostParams::default(), ns)
            .await
        {
            tracing::warn!(namespace = %name, error = %e, "couldn't update status condition for namespace");
        }
    }

    /// Deletes one resource's content and reports what is left.
    async fn delete_gvr(
        &self,
        gvr: &Gvr,
        ns: &str,
        deleted_at: Timestamp,
    ) -> Result<Remaining, (Remaining, String)> {
        let estimate = self
            .estimate_graceful_termination(gvr, ns, deleted_at)
            .await
            .map_err(|e| (Remaining::default(), e))?;
        let with_estimate = |e: String| {
            (
                Remaining {
                    estimate,
                    ..Default::default()
                },
                e,
            )
        };
        let collection = self
            .delete_collection(gvr, ns)
            .await
            .map_err(with_estimate)?;
        if !collection {
            self.delete_each_item(gvr, ns)
                .await
                .map_err(with_estimate)?;
        }
        let Some(items) = self.list_collection(gvr, ns).await.map_err(with_estimate)? else {
            return Ok(Remaining {
                estimate,
                ..Default::default()
            });
        };
        if items.is_empty() {
            return Ok(Remaining::default());
        }
        let mut finalizers: BTreeMap<String, usize> = BTreeMap::new();
        for item in &items {
            for f in item["metadata"]["finalizers"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if let Some(f) = f.as_str() {
                    *finalizers.entry(f.to_owned()).or_default() += 1;
                }
            }
        }
        if estimate != 0 {
            return Ok(Remaining {
                estimate,
                count: items.len(),
                finalizers,
            });
        }
        if !finalizers.is_empty() {
            return Ok(Remaining {
                estimate: FINALIZER_ESTIMATE_SECONDS,
                count: items.len(),
                finalizers,
            });
        }
        // Nothing should be left that has no finalizer and no grace period.
        Err((
            Remaining {
                estimate,
                count: items.len(),
                finalizers: BTreeMap::new(),
            },
            format!("unexpected items still remain in namespace: {ns} for gvr: {gvr}"),
        ))
    }

    /// The longest grace period of the pods still running, unless it has already passed
    /// since the namespace's deletion.
    async fn estimate_graceful_termination(
        &self,
        gvr: &Gvr,
        ns: &str,
        deleted_at: Timestamp,
    ) -> Result<i64, String> {
        if !(gvr.group.is_empty() && gvr.resource == "pods") {
            return Ok(0);
        }
        let pods: Api<Pod> = Api::namespaced(self.client.get(), ns);
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| message(&e))?;
        let mut estimate = 0i64;
        for p in list.items {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded") | Some("Failed")) {
                continue;
            }
            if let Some(g) = p
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
            {
                estimate = estimate.max(g);
            }
        }
        let since = Timestamp::now().duration_since(deleted_at).as_secs();
        if since >= estimate {
            estimate = 0;
        }
        Ok(estimate)
    }

    fn delete_options() -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }))
        .unwrap_or_default()
    }

    /// true when deletecollection did the work (or failed in a way that must be reported).
    async fn delete_collection(&self, gvr: &Gvr, ns: &str) -> Result<bool, String> {
        if !self.supported(Op::DeleteCollection, gvr) {
            return Ok(false);
        }
        let req = http::Request::delete(gvr.collection_path(ns))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Self::delete_options())
            .map_err(|e| e.to_string())?;
        match self.client.get().request_text(req).await {
            Ok(_) => Ok(true),
            Err(e) if is_method_not_supported(&e) || is_not_found(&e) => Ok(false),
            Err(e) => Err(message(&e)),
        }
    }

    /// The items (metadata only); None when listing is not served.
    async fn list_collection(&self, gvr: &Gvr, ns: &str) -> Result<Option<Vec<Value>>, String> {
        if !self.supported(Op::List, gvr) {
            return Ok(None);
        }
        let req = http::Request::get(gvr.collection_path(ns))
            .header(
                http::header::ACCEPT,
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
            )
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        match self.client.get().request::<Value>(req).await {
            Ok(mut v) => Ok(Some(match v["items"].take() {
                Value::Array(items) => items,
                _ => Vec::new(),
            })),
            Err(e) if is_method_not_supported(&e) || is_not_found(&e) => Ok(None),
            Err(e) => Err(message(&e)),
        }
    }

    async fn delete_each_item(&self, gvr: &Gvr, ns: &str) -> Result<(), String> {
        let Some(items) = self.list_collection(gvr, ns).await? else {
            return Ok(());
        };
        for item in items {
            let Some(name) = item["metadata"]["name"].as_str() else {
                continue;
            };
            let req = http::Request::delete(format!("{}/{name}", gvr.collection_path(ns)))
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Self::delete_options())
                .map_err(|e| e.to_string())?;
            match self.client.get().request_text(req).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) || is_method_not_supported(&e) => {}
                Err(e) => return Err(message(&e)),
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Step {
    MarkTerminating,
    Finalize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_versions_parse_as_upstream() {
        assert_eq!(parse_group_version("v1"), Ok((String::new(), "v1".into())));
        assert_eq!(
            parse_group_version("apps/v1"),
            Ok(("apps".into(), "v1".into()))
        );
        assert_eq!(
            parse_group_version("a/b/c"),
            Err("unexpected GroupVersion string: a/b/c".into())
        );
    }

    #[test]
    fn conditions_default_to_success_and_report_remaining() {
        let mut ns = Namespace::default();
        let mut c = Conditions::default();
        let gvr = Gvr {
            group: "apps".into(),
            version: "v1".into(),
            resource: "deployments".into(),
        };
        c.content_totals(
            &BTreeMap::from([(gvr.clone(), 2)]),
            &BTreeMap::from([("example.com/x".to_string(), 2)]),
        );
        assert!(c.update(&mut ns));
        let conds = ns
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let types: Vec<&str> = conds.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, CONDITION_TYPES.to_vec());
        assert_eq!(conds[0].status, "False");
        assert_eq!(conds[0].reason.as_deref(), Some("ResourcesDiscovered"));
        assert_eq!(
            conds[3].message.as_deref(),
            Some("Some resources are remaining: deployments.apps has 2 resource instances")
        );
        assert_eq!(
            conds[4].message.as_deref(),
            Some("Some content in the namespace has finalizers remaining: example.com/x in 2 resource instances")
        );
        assert_eq!(gvr.to_string(), "apps/v1, Resource=deployments");
        // The same conditions again change nothing.
        let mut again = Conditions::default();
        again.content_totals(
            &BTreeMap::from([(gvr, 2)]),
            &BTreeMap::from([("example.com/x".to_string(), 2)]),
        );
        assert!(!again.update(&mut ns));
    }
}
