//! garbage-collector-controller: deletes objects whose owners are gone, as upstream's
//! garbage collector.
//!
//! A dependency graph (uid → node with its ownerReferences and dependents) is built from
//! metadata-only watches of every resource discovery lists with the list, watch and delete
//! verbs (rediscovered every 30 s, so new CRDs are watched). Owners referenced but not seen
//! yet are "virtual" nodes, checked against the API server. Two queues are worked:
//! - attemptToDelete: an object whose owners are all gone (dangling references) is deleted
//!   with a uid precondition; one with some live owner keeps it and loses the dangling
//!   references; an owner being deleted in the foreground (`foregroundDeletion` finalizer)
//!   waits until its dependents with blockOwnerDeletion are gone, then loses the finalizer.
//! - attemptToOrphan: an owner being deleted with the `orphan` finalizer has its dependents'
//!   references to it removed, then the finalizer.
//!
//! The graph is changed by one task only (graphChanges), so handling of an object's events
//! is ordered; workers read it and write through the API server.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams,
    PostParams, Preconditions, PropagationPolicy,
};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::WatchStreamExt;
use kube::Client;
use parking_lot::{Mutex, RwLock};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_conflict, is_not_found, message};
use kumo_client::informer::InformerFactory;
use kumo_client::worker::client_for;
use kumo_client::workqueue::WorkQueue;

/// The finalizer that makes an owner wait until its dependents lost their references.
pub const ORPHAN_FINALIZER: &str = "orphan";
/// The finalizer that makes an owner wait until its blocking dependents are deleted.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// --concurrent-gc-syncs.
const WORKERS: usize = 20;
/// How often the watched resources are rediscovered.
const REDISCOVERY: Duration = Duration::from_secs(30);
/// How long the first discovery's watches may take to list before workers start anyway.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// Conflicting writes are retried this often (client-go's retry.DefaultBackoff steps).
const MAX_RETRIES: usize = 5;
/// The absent-owner cache's size (upstream's LRU holds 500).
const ABSENT_CACHE_SIZE: usize = 500;
/// The component named in events.
const COMPONENT: &str = "garbage-collector-controller";

/// The coordinates of an object (upstream's objectReference): an owner reference's
/// apiVersion, kind, name and uid, plus the namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Identity {
    api_version: String,
    kind: String,
    name: String,
    namespace: String,
    uid: String,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{}/{}, namespace: {}, name: {}, uid: {}]",
            self.api_version, self.kind, self.namespace, self.name, self.uid
        )
    }
}

impl Identity {
    /// The owner a reference names, looked for in `namespace`.
    fn of_ref(r: &OwnerReference, namespace: &str) -> Self {
        Identity {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            name: r.name.clone(),
            namespace: namespace.to_owned(),
            uid: r.uid.clone(),
        }
    }

    /// Whether `r` names this object (namespace aside).
    fn matches_ref(&self, r: &OwnerReference) -> bool {
        r.uid == self.uid
            && r.name == self.name
            && r.kind == self.kind
            && r.api_version == self.api_version
    }
}

/// One object in the graph.
struct Node {
    identity: Identity,
    owners: Vec<OwnerReference>,
    dependents: HashSet<String>,
    /// deletionTimestamp is set.
    being_deleted: bool,
    /// Being deleted with the foregroundDeletion finalizer.
    deleting_dependents: bool,
    /// Seen in a watch (false: a virtual node made from an owner reference).
    observed: bool,
    /// The finalizers last seen.
    finalizers: Vec<String>,
}

impl Node {
    fn virtual_owner(identity: Identity) -> Self {
        Node {
            identity,
            owners: Vec::new(),
            dependents: HashSet::new(),
            being_deleted: false,
            deleting_dependents: false,
            observed: false,
            finalizers: Vec::new(),
        }
    }

    fn waits_for(&self, finalizer: &str) -> bool {
        self.being_deleted && self.finalizers.iter().any(|f| f == finalizer)
    }
}

#[derive(Default)]
struct Graph {
    nodes: HashMap<String, Node>,
    /// Owners known not to exist (upstream's absentOwnerCache).
    absent: HashSet<Identity>,
}

impl Graph {
    fn add_absent(&mut self, id: Identity) {
        if self.absent.len() >= ABSENT_CACHE_SIZE {
            self.absent.clear();
        }
        self.absent.insert(id);
    }
}

/// A change to the graph: an observed add/update/delete, or a virtual delete (the object
/// was looked up and is not there).
struct GraphEvent {
    delete: bool,
    virtual_: bool,
    identity: Identity,
    owners: Vec<OwnerReference>,
    being_deleted: bool,
    finalizers: Vec<String>,
}

/// (apiVersion, kind) → the resource and whether it is namespaced.
type Mapper = HashMap<(String, String), (ApiResource, bool)>;

/// Why an item could not be handled.
#[derive(Debug)]
enum GcError {
    /// The kind is not served (maybe not discovered yet): retried.
    Mapping(String),
    /// A cluster-scoped object names a namespaced owner: never resolves.
    ClusterScopedWithNamespacedOwner,
    /// The item was not found; a virtual delete event was sent.
    VirtualDeleteSent,
    /// Writes kept conflicting.
    Retries(String),
    /// The API server's answer.
    Api(kube::Error),
}

impl From<kube::Error> for GcError {
    fn from(e: kube::Error) -> Self {
        GcError::Api(e)
    }
}

impl std::fmt::Display for GcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GcError::Mapping(m) => f.write_str(m),
            GcError::ClusterScopedWithNamespacedOwner => {
                f.write_str("cluster-scoped objects cannot refer to namespaced owners")
            }
            GcError::VirtualDeleteSent => f.write_str("enqueued virtual delete event"),
            GcError::Retries(m) => f.write_str(m),
            GcError::Api(e) => f.write_str(&message(e)),
        }
    }
}

fn not_found(e: &GcError) -> bool {
    matches!(e, GcError::Api(e) if is_not_found(e))
}

struct Gc {
    client: ClientSource,
    root: Client,
    graph: Mutex<Graph>,
    mapper: RwLock<Mapper>,
    changes: mpsc::UnboundedSender<GraphEvent>,
    delete_q: Arc<WorkQueue<String>>,
    orphan_q: Arc<WorkQueue<String>>,
}

/// Starts the garbage collector; it stops when `stop` turns true.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let delete_q = factory.queue("garbage_collector_attempt_to_delete");
    let orphan_q = factory.queue("garbage_collector_attempt_to_orphan");
    tokio::spawn(async move {
        tracing::info!("Starting garbage collector controller");
        let Some(client) = client_for(&clients, "generic-garbage-collector", &mut stop).await
        else {
            return;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let gc = Arc::new(Gc {
            client,
            root: clients.root(),
            graph: Mutex::new(Graph::default()),
            mapper: RwLock::new(Mapper::new()),
            changes: tx,
            delete_q,
            orphan_q,
        });
        let (ready_tx, mut ready) = watch::channel(false);
        let mut tasks = vec![
            tokio::spawn(gc.clone().process_graph_changes(rx, stop.clone())),
            tokio::spawn(gc.clone().discovery_loop(ready_tx, stop.clone())),
        ];
        tokio::select! {
            _ = ready.wait_for(|r| *r) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
        if !*stop.borrow() {
            tracing::info!("all resource monitors have synced; proceeding to collect garbage");
            for _ in 0..WORKERS {
                let g = gc.clone();
                tasks.push(spawn_worker(gc.delete_q.clone(), move |uid| {
                    let g = g.clone();
                    async move { g.attempt_to_delete(&uid).await }
                }));
                let g = gc.clone();
                tasks.push(spawn_worker(gc.orphan_q.clone(), move |uid| {
                    let g = g.clone();
                    async move { g.attempt_to_orphan(&uid).await }
                }));
            }
        }
        let _ = stop.wait_for(|s| *s).await;
        gc.delete_q.shut_down();
        gc.orphan_q.shut_down();
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down garbage collector controller");
    })
}

/// What a worker does with an item after handling it.
enum Action {
    Forget,
    Requeue,
}

fn spawn_worker<F, Fut>(queue: Arc<WorkQueue<String>>, f: F) -> JoinHandle<()>
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Action> + Send + 'static,
{
    tokio::spawn(async move {
        while let Some(uid) = queue.get().await {
            match f(uid.clone()).await {
                Action::Forget => queue.forget(&uid),
                Action::Requeue => queue.add_rate_limited(uid.clone()),
            }
            queue.done(&uid);
        }
    })
}

fn has_finalizer(m: &ObjectMeta, f: &str) -> bool {
    m.finalizers.iter().flatten().any(|x| x == f)
}

impl Gc {
    // ---- discovery and monitors ----

    /// Rediscovers the deletable resources every 30 s, watching new ones and dropping
    /// gone ones; `ready` turns true once the first set of watches has listed.
    async fn discovery_loop(
        self: Arc<Self>,
        ready: watch::Sender<bool>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut monitors: HashMap<(String, String), (String, JoinHandle<()>)> = HashMap::new();
        loop {
            let started = std::time::Instant::now();
            let found = self.discover().await;
            tracing::debug!(elapsed = ?started.elapsed(), "discovery done");
            match found {
                Ok((mapper, deletable, failed)) => {
                    {
                        let mut m = self.mapper.write();
                        // Kinds of group versions that failed this time are kept.
                        let old = std::mem::take(&mut *m);
                        *m = mapper;
                        for (k, v) in old {
                            if failed.contains(&v.0.api_version) {
                                m.entry(k).or_insert(v);
                            }
                        }
                    }
                    let mut synced = Vec::new();
                    let wanted: HashSet<(String, String)> = deletable
                        .iter()
                        .map(|ar| (ar.group.clone(), ar.plural.clone()))
                        .collect();
                    monitors.retain(|k, (gv, task)| {
                        let keep = wanted.contains(k) || failed.contains(gv);
                        if !keep {
                            task.abort();
                        }
                        keep
                    });
                    for ar in deletable {
                        let key = (ar.group.clone(), ar.plural.clone());
                        if monitors
                            .get(&key)
                            .is_some_and(|(gv, _)| *gv == ar.api_version)
                        {
                            continue;
                        }
                        if let Some((_, old)) = monitors.remove(&key) {
                            old.abort();
                        }
                        let (tx, rx) = watch::channel(false);
                        synced.push(rx);
                        let gv = ar.api_version.clone();
                        let task = tokio::spawn(self.clone().monitor(ar, tx, stop.clone()));
                        monitors.insert(key, (gv, task));
                    }
                    if !*ready.borrow() {
                        let all = futures::future::join_all(
                            synced
                                .iter_mut()
                                .map(|rx| async move { rx.wait_for(|s| *s).await.is_ok() }),
                        );
                        tokio::select! {
                            r = tokio::time::timeout(SYNC_TIMEOUT, all) => {
                                if r.is_err() {
                                    tracing::warn!("timed out waiting for dependency graph builder sync during GC sync");
                                }
                            }
                            _ = stop.wait_for(|s| *s) => break,
                        }
                        ready.send_replace(true);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "failed to discover deletable resources"),
            }
            tokio::select! {
                _ = tokio::time::sleep(REDISCOVERY) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        for (_, (_, t)) in monitors {
            t.abort();
        }
    }

    /// Discovery (as client-go's ServerPreferredResources): the mapping of every served
    /// kind in every version, the preferred version of every resource that can be
    /// listed, watched and deleted (events excepted, as upstream's ignoredResources), and
    /// the group versions that could not be read.
    async fn discover(&self) -> Result<(Mapper, Vec<ApiResource>, HashSet<String>), String> {
        let client = &self.root;
        let mut groups: Vec<(String, Vec<String>, String)> = Vec::new();
        let core = client
            .list_core_api_versions()
            .await
            .map_err(|e| message(&e))?;
        let pref = core.versions.first().cloned().unwrap_or_default();
        groups.push((String::new(), core.versions, pref));
        for g in client
            .list_api_groups()
            .await
            .map_err(|e| message(&e))?
            .groups
        {
            let versions: Vec<String> = g.versions.iter().map(|v| v.version.clone()).collect();
            let pref = g
                .preferred_version
                .map(|p| p.version)
                .or_else(|| versions.first().cloned())
                .unwrap_or_default();
            groups.push((g.name, versions, pref));
        }
        let mut mapper = Mapper::new();
        let mut failed = HashSet::new();
        let mut chosen: BTreeMap<(String, String), (ApiResource, Vec<String>)> = BTreeMap::new();
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
                let Ok(list) = list else {
                    failed.insert(gv);
                    continue;
                };
                for r in list.resources {
                    if r.name.contains('/') {
                        continue;
                    }
                    let ar = ApiResource {
                        group: group.clone(),
                        version: version.clone(),
                        api_version: gv.clone(),
                        kind: r.kind.clone(),
                        plural: r.name.clone(),
                    };
                    mapper.insert((gv.clone(), r.kind.clone()), (ar.clone(), r.namespaced));
                    let key = (group.clone(), r.name.clone());
                    if chosen.contains_key(&key) && version != preferred {
                        continue;
                    }
                    chosen.insert(key, (ar, r.verbs));
                }
            }
        }
        let deletable = chosen
            .into_iter()
            .filter(|((g, r), _)| !(r == "events" && (g.is_empty() || g == "events.k8s.io")))
            .filter(|(_, (_, verbs))| {
                ["list", "watch", "delete"]
                    .iter()
                    .all(|v| verbs.iter().any(|x| x == v))
            })
            .map(|(_, (ar, _))| ar)
            .collect();
        Ok((mapper, deletable, failed))
    }

    /// One resource's metadata-only watch, feeding the graph; a relist reports what is
    /// gone as deleted.
    async fn monitor(
        self: Arc<Self>,
        ar: ApiResource,
        synced: watch::Sender<bool>,
        mut stop: watch::Receiver<bool>,
    ) {
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(self.root.clone(), &ar);
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        let mut known: HashMap<String, Identity> = HashMap::new();
        let mut listing: Option<HashMap<String, Identity>> = None;
        loop {
            let ev = tokio::select! {
                ev = stream.next() => ev,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Some(ev) = ev else { return };
            match ev {
                Ok(WatchEvent::Init) => listing = Some(HashMap::new()),
                Ok(WatchEvent::InitApply(obj)) => {
                    if let Some(e) = self.event_of(&ar, &obj.metadata, false) {
                        listing
                            .get_or_insert_with(HashMap::new)
                            .insert(e.identity.uid.clone(), e.identity.clone());
                        let _ = self.changes.send(e);
                    }
                }
                Ok(WatchEvent::InitDone) => {
                    let listed = listing.take().unwrap_or_default();
                    for (uid, identity) in known.drain() {
                        if !listed.contains_key(&uid) {
                            let _ = self.changes.send(GraphEvent {
                                delete: true,
                                virtual_: false,
                                identity,
                                owners: Vec::new(),
                                being_deleted: false,
                                finalizers: Vec::new(),
                            });
                        }
                    }
                    known = listed;
                    if !*synced.borrow() {
                        tracing::debug!(resource = %ar.plural, group = %ar.group, "monitor synced");
                    }
                    synced.send_replace(true);
                }
                Ok(WatchEvent::Apply(obj)) => {
                    if let Some(e) = self.event_of(&ar, &obj.metadata, false) {
                        known.insert(e.identity.uid.clone(), e.identity.clone());
                        let _ = self.changes.send(e);
                    }
                }
                Ok(WatchEvent::Delete(obj)) => {
                    if let Some(e) = self.event_of(&ar, &obj.metadata, true) {
                        known.remove(&e.identity.uid);
                        let _ = self.changes.send(e);
                    }
                }
                Err(e) => {
                    tracing::debug!(resource = %ar.plural, group = %ar.group, error = %e, "watch failed; retrying")
                }
            }
        }
    }

    fn event_of(&self, ar: &ApiResource, m: &ObjectMeta, delete: bool) -> Option<GraphEvent> {
        let uid = m.uid.clone().filter(|u| !u.is_empty())?;
        Some(GraphEvent {
            delete,
            virtual_: false,
            identity: Identity {
                api_version: ar.api_version.clone(),
                kind: ar.kind.clone(),
                name: m.name.clone().unwrap_or_default(),
                namespace: m.namespace.clone().unwrap_or_default(),
                uid,
            },
            owners: m.owner_references.clone().unwrap_or_default(),
            being_deleted: m.deletion_timestamp.is_some(),
            finalizers: m.finalizers.clone().unwrap_or_default(),
        })
    }

    fn send_virtual_delete(&self, identity: Identity) {
        let _ = self.changes.send(GraphEvent {
            delete: true,
            virtual_: true,
            identity,
            owners: Vec::new(),
            being_deleted: false,
            finalizers: Vec::new(),
        });
    }

    // ---- the graph builder ----

    async fn process_graph_changes(
        self: Arc<Self>,
        mut rx: mpsc::UnboundedReceiver<GraphEvent>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Some(ev) = ev else { return };
            if ev.delete {
                self.process_delete(ev);
            } else {
                self.process_upsert(ev);
            }
        }
    }

    fn process_upsert(&self, ev: GraphEvent) {
        let uid = ev.identity.uid.clone();
        let mut g = self.graph.lock();
        // A virtual node is now observed: dependents that named it with other
        // coordinates are checked again.
        let mut invalid = Vec::new();
        if let Some(n) = g.nodes.get_mut(&uid).filter(|n| !n.observed) {
            n.observed = true;
            if n.identity != ev.identity {
                n.identity = ev.identity.clone();
                invalid = n.dependents.iter().cloned().collect();
            }
        }
        for dep in invalid {
            let Some(d) = g.nodes.get(&dep) else { continue };
            let ns_ok =
                ev.identity.namespace.is_empty() || d.identity.namespace == ev.identity.namespace;
            let matches = ns_ok && d.owners.iter().any(|o| ev.identity.matches_ref(o));
            if !matches {
                if !ns_ok {
                    self.report_invalid_namespace(d, &uid);
                }
                self.delete_q.add(dep);
            }
        }
        let Some(node) = g.nodes.get_mut(&uid) else {
            let node = Node {
                identity: ev.identity.clone(),
                owners: ev.owners.clone(),
                dependents: HashSet::new(),
                being_deleted: ev.being_deleted,
                deleting_dependents: false,
                observed: true,
                finalizers: Vec::new(),
            };
            g.nodes.insert(uid.clone(), node);
            self.add_dependent_to_owners(&mut g, &uid, &ev.owners);
            self.process_transitions(&mut g, &uid, ev);
            return;
        };
        let old_owners = std::mem::replace(&mut node.owners, ev.owners.clone());
        let added: Vec<OwnerReference> = ev
            .owners
            .iter()
            .filter(|o| !old_owners.iter().any(|x| x.uid == o.uid))
            .cloned()
            .collect();
        let removed: Vec<OwnerReference> = old_owners
            .iter()
            .filter(|o| !ev.owners.iter().any(|x| x.uid == o.uid))
            .cloned()
            .collect();
        // Owners waiting for this dependent no longer wait once it stops blocking them.
        let mut unblocked: Vec<String> = removed
            .iter()
            .filter(|o| o.block_owner_deletion == Some(true))
            .map(|o| o.uid.clone())
            .collect();
        for o in &ev.owners {
            let was_blocking = old_owners
                .iter()
                .any(|x| x.uid == o.uid && x.block_owner_deletion == Some(true));
            if was_blocking && o.block_owner_deletion != Some(true) {
                unblocked.push(o.uid.clone());
            }
        }
        for o in unblocked {
            if g.nodes.get(&o).is_some_and(|n| n.deleting_dependents) {
                self.delete_q.add(o);
            }
        }
        self.add_dependent_to_owners(&mut g, &uid, &added);
        for o in &removed {
            if let Some(owner) = g.nodes.get_mut(&o.uid) {
                owner.dependents.remove(&uid);
            }
        }
        self.process_transitions(&mut g, &uid, ev);
    }

    /// Adds `uid` to its owners' dependents; owners not in the graph become virtual nodes
    /// to be looked up.
    fn add_dependent_to_owners(&self, g: &mut Graph, uid: &str, owners: &[OwnerReference]) {
        let Some(ns) = g.nodes.get(uid).map(|n| n.identity.namespace.clone()) else {
            return;
        };
        let mut recheck = false;
        for o in owners {
            match g.nodes.get_mut(&o.uid) {
                None => {
                    let mut n = Node::virtual_owner(Identity::of_ref(o, &ns));
                    n.dependents.insert(uid.to_owned());
                    g.nodes.insert(o.uid.clone(), n);
                    self.delete_q.add(o.uid.clone());
                }
                Some(owner) => {
                    owner.dependents.insert(uid.to_owned());
                    let owner_ns = owner.identity.namespace.clone();
                    let observed = owner.observed;
                    if !recheck && !owner_ns.is_empty() && owner_ns != ns {
                        // A namespaced owner must be in the dependent's namespace.
                        if observed {
                            if let Some(d) = g.nodes.get(uid) {
                                self.report_invalid_namespace(d, &o.uid);
                            }
                        }
                        recheck = true;
                    } else if !recheck
                        && (!owner_identity_matches(g, &o.uid, o)
                            || (owner_ns.is_empty() && ns != owner_ns && !observed))
                    {
                        recheck = true;
                    }
                }
            }
        }
        if recheck {
            self.delete_q.add(uid.to_owned());
        }
    }

    /// Queues an owner whose deletion started with `orphan` or `foregroundDeletion`.
    fn process_transitions(&self, g: &mut Graph, uid: &str, ev: GraphEvent) {
        let Some(n) = g.nodes.get_mut(uid) else {
            return;
        };
        let was_orphaning = n.waits_for(ORPHAN_FINALIZER);
        let was_foreground = n.waits_for(FOREGROUND_FINALIZER);
        n.finalizers = ev.finalizers;
        n.being_deleted = n.being_deleted || ev.being_deleted;
        if !was_orphaning && n.waits_for(ORPHAN_FINALIZER) {
            self.orphan_q.add(uid.to_owned());
            return;
        }
        if !was_foreground && n.waits_for(FOREGROUND_FINALIZER) {
            n.deleting_dependents = true;
            for d in &n.dependents {
                self.delete_q.add(d.clone());
            }
            self.delete_q.add(uid.to_owned());
        }
    }

    fn process_delete(&self, ev: GraphEvent) {
        let uid = ev.identity.uid.clone();
        let mut g = self.graph.lock();
        let Some(existing) = g.nodes.get(&uid) else {
            return;
        };
        if ev.virtual_ {
            let (matching, nonmatching): (Vec<String>, Vec<String>) =
                existing.dependents.iter().cloned().partition(|d| {
                    g.nodes
                        .get(d)
                        .is_some_and(|dn| references(dn, &ev.identity))
                });
            let keep = if !existing.observed {
                !nonmatching.is_empty()
            } else {
                existing.identity != ev.identity
            };
            if keep {
                if !matching.is_empty() {
                    g.add_absent(ev.identity.clone());
                    for d in matching {
                        self.delete_q.add(d);
                    }
                }
                // Look the virtual node up again by another identity its dependents use.
                let replacement = g.nodes.get(&uid).filter(|n| !n.observed).and_then(|n| {
                    (n.identity == ev.identity).then_some(())?;
                    nonmatching.iter().find_map(|d| {
                        let dn = g.nodes.get(d)?;
                        dn.owners
                            .iter()
                            .find(|o| o.uid == uid)
                            .map(|o| Identity::of_ref(o, &dn.identity.namespace))
                    })
                });
                if let Some(r) = replacement {
                    if let Some(n) = g.nodes.get_mut(&uid) {
                        n.identity = r;
                    }
                    self.delete_q.add_rate_limited(uid);
                }
                return;
            }
        }
        let Some(node) = g.nodes.remove(&uid) else {
            return;
        };
        for o in &node.owners {
            if let Some(owner) = g.nodes.get_mut(&o.uid) {
                owner.dependents.remove(&uid);
            }
        }
        if !node.dependents.is_empty() {
            g.add_absent(ev.identity.clone());
        }
        for d in node.dependents {
            self.delete_q.add(d);
        }
        for o in &node.owners {
            if g.nodes.get(&o.uid).is_some_and(|n| n.deleting_dependents) {
                self.delete_q.add(o.uid.clone());
            }
        }
    }

    /// The `OwnerRefInvalidNamespace` warning on a dependent naming an owner that lives in
    /// another namespace.
    fn report_invalid_namespace(&self, dependent: &Node, owner_uid: &str) {
        let Some(r) = dependent.owners.iter().find(|o| o.uid == owner_uid) else {
            return;
        };
        let d = dependent.identity.clone();
        let invalid = Identity::of_ref(r, &d.namespace);
        let msg = format!(
            "ownerRef {invalid} does not exist in namespace {:?}",
            d.namespace
        );
        tracing::info!(item = %d, "{msg}");
        let client = self.client.get();
        tokio::spawn(async move {
            record_event(client, &d, "Warning", "OwnerRefInvalidNamespace", msg).await;
        });
    }

    // ---- API access ----

    fn resource(&self, api_version: &str, kind: &str) -> Result<(ApiResource, bool), GcError> {
        self.mapper
            .read()
            .get(&(api_version.to_owned(), kind.to_owned()))
            .cloned()
            .ok_or_else(|| {
                GcError::Mapping(format!(
                    "unable to get REST mapping for {api_version}/{kind}."
                ))
            })
    }

    fn api(&self, api_version: &str, kind: &str, ns: &str) -> Result<Api<DynamicObject>, GcError> {
        let (ar, namespaced) = self.resource(api_version, kind)?;
        if namespaced && ns.is_empty() {
            return Err(GcError::ClusterScopedWithNamespacedOwner);
        }
        let client = self.client.get();
        Ok(if namespaced {
            Api::namespaced_with(client, ns, &ar)
        } else {
            Api::all_with(client, &ar)
        })
    }

    async fn get_meta(&self, id: &Identity) -> Result<ObjectMeta, GcError> {
        let api = self.api(&id.api_version, &id.kind, &id.namespace)?;
        Ok(api.get_metadata(&id.name).await?.metadata)
    }

    async fn patch_meta(&self, id: &Identity, patch: Value) -> Result<(), GcError> {
        let api = self.api(&id.api_version, &id.kind, &id.namespace)?;
        api.patch(&id.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Rewrites the object's ownerReferences with `f` (a JSON merge patch with the
    /// resourceVersion read, retried on conflict); nothing if `f` changes nothing.
    async fn update_owner_refs(
        &self,
        id: &Identity,
        f: impl Fn(Vec<OwnerReference>) -> Vec<OwnerReference>,
    ) -> Result<(), GcError> {
        for _ in 0..MAX_RETRIES {
            let m = self.get_meta(id).await?;
            if m.uid.as_deref() != Some(id.uid.as_str()) {
                return Ok(());
            }
            let old = m.owner_references.clone().unwrap_or_default();
            let new = f(old.clone());
            if new == old {
                return Ok(());
            }
            let patch = json!({"metadata": {
                "resourceVersion": m.resource_version,
                // null, not [], as client-go's nil slice: the field goes away.
                "ownerReferences": if new.is_empty() { Value::Null } else { json!(new) },
            }});
            match self.patch_meta(id, patch).await {
                Err(GcError::Api(e)) if is_conflict(&e) => continue,
                r => return r,
            }
        }
        Err(GcError::Retries(format!(
            "updateMaxRetries({MAX_RETRIES}) has reached. The garbage collector will retry later for {id}"
        )))
    }

    async fn remove_finalizer(&self, id: &Identity, finalizer: &str) -> Result<(), GcError> {
        for _ in 0..MAX_RETRIES {
            let m = match self.get_meta(id).await {
                Err(e) if not_found(&e) => return Ok(()),
                r => r?,
            };
            if !has_finalizer(&m, finalizer) {
                return Ok(());
            }
            let rest: Vec<&String> = m
                .finalizers
                .iter()
                .flatten()
                .filter(|f| *f != finalizer)
                .collect();
            let patch = json!({"metadata": {
                "resourceVersion": m.resource_version,
                "finalizers": if rest.is_empty() { Value::Null } else { json!(rest) },
            }});
            match self.patch_meta(id, patch).await {
                Err(GcError::Api(e)) if is_conflict(&e) => continue,
                r => return r,
            }
        }
        Err(GcError::Retries(format!(
            "updateMaxRetries({MAX_RETRIES}) has reached. The garbage collector will retry later for owner {id}"
        )))
    }

    /// Deletes with uid and resourceVersion preconditions; a conflict only because of
    /// unrelated changes (same owners) is retried without the resourceVersion.
    async fn delete_object(
        &self,
        id: &Identity,
        latest: &ObjectMeta,
        policy: PropagationPolicy,
    ) -> Result<(), GcError> {
        let api = self.api(&id.api_version, &id.kind, &id.namespace)?;
        let mut rv = latest.resource_version.clone();
        loop {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(id.uid.clone()),
                    resource_version: rv.clone(),
                }),
                propagation_policy: Some(policy.clone()),
                ..DeleteParams::default()
            };
            match api.delete(&id.name, &dp).await {
                Ok(_) => return Ok(()),
                Err(e) if is_conflict(&e) && rv.is_some() => {
                    let live = api.get_metadata(&id.name).await?.metadata;
                    if live.uid.as_deref() == Some(id.uid.as_str())
                        && live.resource_version != rv
                        && live.owner_references == latest.owner_references
                    {
                        rv = None;
                        continue;
                    }
                    return Err(e.into());
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    // ---- attemptToDelete ----

    async fn attempt_to_delete(&self, uid: &str) -> Action {
        let Some(identity) = self.graph.lock().nodes.get(uid).map(|n| n.identity.clone()) else {
            return Action::Forget;
        };
        let r = self.attempt_to_delete_item(uid).await;
        // A virtual node is looked at again until a watch reports it (or it is found gone).
        let observed = self.graph.lock().nodes.get(uid).is_none_or(|n| n.observed);
        match r {
            Ok(()) if !observed => Action::Requeue,
            Ok(()) | Err(GcError::VirtualDeleteSent) => Action::Forget,
            Err(GcError::ClusterScopedWithNamespacedOwner) => Action::Forget,
            Err(e @ GcError::Mapping(_)) => {
                tracing::debug!(item = %identity, error = %e, "error syncing item");
                Action::Requeue
            }
            Err(e) => {
                tracing::warn!(item = %identity, error = %e, "error syncing item");
                Action::Requeue
            }
        }
    }

    async fn attempt_to_delete_item(&self, uid: &str) -> Result<(), GcError> {
        let Some((item, being_deleted, deleting_dependents, n_dependents)) =
            self.graph.lock().nodes.get(uid).map(|n| {
                (
                    n.identity.clone(),
                    n.being_deleted,
                    n.deleting_dependents,
                    n.dependents.len(),
                )
            })
        else {
            return Ok(());
        };
        tracing::debug!(item = %item, "processing item");
        // Being deleted is a one-way trip: its dependents are handled once it is gone.
        if being_deleted && !deleting_dependents {
            return Ok(());
        }
        let latest = match self.get_meta(&item).await {
            Err(e) if not_found(&e) => {
                self.send_virtual_delete(item);
                return Err(GcError::VirtualDeleteSent);
            }
            r => r?,
        };
        if latest.uid.as_deref() != Some(item.uid.as_str()) {
            self.send_virtual_delete(item);
            return Err(GcError::VirtualDeleteSent);
        }
        if deleting_dependents {
            return self.process_deleting_dependents(uid, &item).await;
        }
        let refs = latest.owner_references.clone().unwrap_or_default();
        if refs.is_empty() {
            return Ok(());
        }
        let mut solid = Vec::new();
        let mut dangling = Vec::new();
        let mut waiting = Vec::new();
        for r in refs {
            match self.owner_state(&r, &item).await? {
                None => dangling.push(r),
                Some(owner) => {
                    if owner.deletion_timestamp.is_some()
                        && has_finalizer(&owner, FOREGROUND_FINALIZER)
                    {
                        waiting.push(r);
                    } else {
                        solid.push(r);
                    }
                }
            }
        }
        if !solid.is_empty() {
            if dangling.is_empty() && waiting.is_empty() {
                return Ok(());
            }
            tracing::info!(item = %item, "remove dangling references and waiting references for item");
            let gone: HashSet<String> = dangling
                .iter()
                .chain(&waiting)
                .map(|r| r.uid.clone())
                .collect();
            return self
                .update_owner_refs(&item, |refs| {
                    refs.into_iter()
                        .filter(|r| !gone.contains(&r.uid))
                        .collect()
                })
                .await;
        }
        if !waiting.is_empty() && n_dependents > 0 {
            // A cycle guard: a dependent also deleting its dependents would wait for this
            // item forever, so this item stops blocking its owners.
            let cycle = {
                let g = self.graph.lock();
                g.nodes.get(uid).is_some_and(|n| {
                    n.dependents
                        .iter()
                        .any(|d| g.nodes.get(d).is_some_and(|dn| dn.deleting_dependents))
                })
            };
            if cycle {
                self.update_owner_refs(&item, |refs| {
                    refs.into_iter()
                        .map(|mut r| {
                            if r.block_owner_deletion.is_some() {
                                r.block_owner_deletion = Some(false);
                            }
                            r
                        })
                        .collect()
                })
                .await?;
            }
            tracing::info!(item = %item, "at least one owner of item has FinalizerDeletingDependents, and the item itself has dependents, so it is going to be deleted in Foreground");
            return self
                .delete_or_virtual(&item, &latest, PropagationPolicy::Foreground)
                .await;
        }
        let policy = if has_finalizer(&latest, ORPHAN_FINALIZER) {
            PropagationPolicy::Orphan
        } else if has_finalizer(&latest, FOREGROUND_FINALIZER) {
            PropagationPolicy::Foreground
        } else {
            PropagationPolicy::Background
        };
        tracing::info!(item = %item, ?policy, "Deleting item");
        self.delete_or_virtual(&item, &latest, policy).await
    }

    async fn delete_or_virtual(
        &self,
        item: &Identity,
        latest: &ObjectMeta,
        policy: PropagationPolicy,
    ) -> Result<(), GcError> {
        match self.delete_object(item, latest, policy).await {
            Err(e) if not_found(&e) => {
                self.send_virtual_delete(item.clone());
                Err(GcError::VirtualDeleteSent)
            }
            r => r,
        }
    }

    /// The owner a reference names, if it exists (upstream's isDangling, negated).
    async fn owner_state(
        &self,
        r: &OwnerReference,
        item: &Identity,
    ) -> Result<Option<ObjectMeta>, GcError> {
        let mut key = Identity::of_ref(r, "");
        {
            let g = self.graph.lock();
            if g.absent.contains(&key) {
                return Ok(None);
            }
            key.namespace = item.namespace.clone();
            if g.absent.contains(&key) {
                return Ok(None);
            }
        }
        let (_, namespaced) = self.resource(&r.api_version, &r.kind)?;
        if !namespaced {
            key.namespace.clear();
        }
        if item.namespace.is_empty() && namespaced {
            tracing::info!(item = %item, owner = %key, "item is cluster-scoped, but refers to a namespaced owner");
            return Err(GcError::ClusterScopedWithNamespacedOwner);
        }
        match self.get_meta(&key).await {
            Err(e) if not_found(&e) => {
                self.graph.lock().add_absent(key);
                Ok(None)
            }
            Err(e) => Err(e),
            Ok(m) if m.uid.as_deref() != Some(r.uid.as_str()) => {
                self.graph.lock().add_absent(key);
                Ok(None)
            }
            Ok(m) => Ok(Some(m)),
        }
    }

    /// An owner in foreground deletion: done (finalizer removed) once no dependent blocks
    /// it; otherwise its blocking dependents are looked at.
    async fn process_deleting_dependents(&self, uid: &str, item: &Identity) -> Result<(), GcError> {
        let blocking: Vec<(String, bool)> = {
            let g = self.graph.lock();
            let Some(n) = g.nodes.get(uid) else {
                return Ok(());
            };
            n.dependents
                .iter()
                .filter_map(|d| g.nodes.get(d).map(|dn| (d, dn)))
                .filter(|(_, dn)| {
                    dn.owners
                        .iter()
                        .any(|o| o.uid == uid && o.block_owner_deletion == Some(true))
                })
                .map(|(d, dn)| (d.clone(), dn.deleting_dependents))
                .collect()
        };
        if blocking.is_empty() {
            tracing::info!(item = %item, "remove DeleteDependents finalizer for item");
            return self.remove_finalizer(item, FOREGROUND_FINALIZER).await;
        }
        for (d, deleting) in blocking {
            if !deleting {
                self.delete_q.add(d);
            }
        }
        Ok(())
    }

    // ---- attemptToOrphan ----

    async fn attempt_to_orphan(&self, uid: &str) -> Action {
        let Some((owner, dependents)) = ({
            let g = self.graph.lock();
            g.nodes.get(uid).map(|n| {
                let deps: Vec<Identity> = n
                    .dependents
                    .iter()
                    .filter_map(|d| g.nodes.get(d).map(|dn| dn.identity.clone()))
                    .collect();
                (n.identity.clone(), deps)
            })
        }) else {
            return Action::Forget;
        };
        let results = futures::future::join_all(dependents.iter().map(|d| async move {
            match self
                .update_owner_refs(d, |refs| {
                    refs.into_iter().filter(|r| r.uid != uid).collect()
                })
                .await
            {
                Err(e) if !not_found(&e) => Some(format!("orphaning {d} failed, {e}")),
                _ => None,
            }
        }))
        .await;
        let errs: Vec<String> = results.into_iter().flatten().collect();
        if !errs.is_empty() {
            tracing::warn!(owner = %owner, errors = ?errs, "orphaning dependents failed");
            return Action::Requeue;
        }
        tracing::info!(owner = %owner, "successfully updated all dependents");
        match self.remove_finalizer(&owner, ORPHAN_FINALIZER).await {
            Ok(()) => Action::Forget,
            Err(e) => {
                tracing::warn!(owner = %owner, error = %e, "removing the orphan finalizer failed");
                Action::Requeue
            }
        }
    }
}

/// Whether the graph's node `owner_uid` has the coordinates `r` names.
fn owner_identity_matches(g: &Graph, owner_uid: &str, r: &OwnerReference) -> bool {
    g.nodes
        .get(owner_uid)
        .is_some_and(|n| n.identity.matches_ref(r))
}

/// Whether `dependent` refers to `owner` by these coordinates (namespace included for a
/// namespaced owner).
fn references(dependent: &Node, owner: &Identity) -> bool {
    (owner.namespace.is_empty() || owner.namespace == dependent.identity.namespace)
        && dependent.owners.iter().any(|o| owner.matches_ref(o))
}

/// A core/v1 Event about `obj`, best effort.
async fn record_event(client: Client, obj: &Identity, type_: &str, reason: &str, msg: String) {
    let ns = if obj.namespace.is_empty() {
        "default".to_owned()
    } else {
        obj.namespace.clone()
    };
    let now = Time(Timestamp::now());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let ev = Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{nanos:x}", obj.name)),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(obj.api_version.clone()),
            kind: Some(obj.kind.clone()),
            name: Some(obj.name.clone()),
            namespace: (!obj.namespace.is_empty()).then(|| obj.namespace.clone()),
            uid: Some(obj.uid.clone()),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(msg),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: None,
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        type_: Some(type_.into()),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(String::new()),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client, &ns);
    if let Err(e) = api.create(&PostParams::default(), &ev).await {
        tracing::debug!(error = %e, "recording an event failed");
    }
}
