//! resourcequota-controller: keeps each ResourceQuota's `status.hard` (a copy of
//! `spec.hard`) and `status.used` (the usage of everything the quota tracks in its
//! namespace) current, as upstream's resource quota controller does. The ResourceQuota
//! admission plugin charges `status.used` on create; this controller recomputes it from the
//! informers' caches, so usage goes down again when objects are deleted or pods finish.
//!
//! A quota is recomputed when it is added, when its `spec.hard` changes, when an object it
//! tracks is deleted (or a pod turns terminal, a service changes type, a claim's allocated
//! storage changes: upstream's replenishment), and every 5 min for all quotas
//! (`--resource-quota-sync-period`).
//!
//! What each object charges and which scopes it is in are upstream's evaluators
//! (pkg/quota/v1/evaluator/core), in `kumo_apimachinery::quota`, shared with the
//! admission plugin: pods, services, persistent volume claims and object counts
//! (`count/<resource>.<group>` of any listable resource, watched metadata-only here once a
//! quota names it).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ReplicationController, ResourceQuota, Secret, Service,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta, PostParams};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::WatchStreamExt;
use kumo_apimachinery::quantity::Quantity;
use kumo_apimachinery::quota::{
    add_lists, charges_compute, claim_usage_changed, is_terminating, list_json, lists_equal, mask,
    resource_list, scope_selectors, Evaluator, ResourceList, IGNORED_RESOURCES,
};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_not_found, message};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::WorkQueue;

/// The ServiceAccount the controller acts as.
const SERVICE_ACCOUNT: &str = "resourcequota-controller";
/// --concurrent-resource-quota-syncs.
const WORKERS: usize = 5;
/// --resource-quota-sync-period: every quota is recomputed this often.
pub const SYNC_PERIOD: Duration = Duration::from_secs(5 * 60);

/// The scope selectors of a quota: its scopes (as Exists) and its scopeSelector.
fn quota_selectors(q: &ResourceQuota) -> Vec<Value> {
    scope_selectors(&to_json(q))
}

fn hard_of(q: &ResourceQuota) -> ResourceList {
    let v = q
        .spec
        .as_ref()
        .and_then(|s| s.hard.as_ref())
        .and_then(|h| serde_json::to_value(h).ok());
    resource_list(v.as_ref())
}

fn status_list(q: &ResourceQuota, field: &str) -> Option<ResourceList> {
    let s = q.status.as_ref()?;
    let l = if field == "hard" {
        s.hard.as_ref()
    } else {
        s.used.as_ref()
    }?;
    let v = serde_json::to_value(l).ok()?;
    Some(resource_list(Some(&v)))
}

// ---------------------------------------------------------------------------------------
// Object-count monitors for resources without a typed informer.

/// The names of the objects of one resource, by namespace, from a metadata-only watch.
struct Monitor {
    items: RwLock<HashMap<String, HashSet<String>>>,
    synced: AtomicBool,
}

impl Monitor {
    fn count(&self, ns: &str) -> usize {
        self.items.read().get(ns).map_or(0, HashSet::len)
    }
}

/// (group, plural).
type GroupResource = (String, String);

/// What the controller watches, shared with its handlers.
struct Ctl {
    client: ClientSource,
    quotas: Arc<Informer<ResourceQuota>>,
    pods: Arc<Informer<Pod>>,
    services: Arc<Informer<Service>>,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    configmaps: Arc<Informer<ConfigMap>>,
    secrets: Arc<Informer<Secret>>,
    rcs: Arc<Informer<ReplicationController>>,
    queue: Arc<WorkQueue<String>>,
    /// (group, plural) → its monitor, or None when discovery does not serve it as a
    /// quotable resource.
    monitors: Mutex<HashMap<GroupResource, Option<Arc<Monitor>>>>,
    stop: watch::Receiver<bool>,
}

/// Queues the quotas in `ns` that track what `ev` charges (replenishQuota).
fn replenish(
    quotas: &Informer<ResourceQuota>,
    queue: &WorkQueue<String>,
    ev: &Evaluator,
    ns: &str,
) {
    for q in quotas.list() {
        if q.metadata.namespace.as_deref() != Some(ns) {
            continue;
        }
        let hard = status_list(&q, "hard").unwrap_or_default();
        if !ev.matching(hard.keys()).is_empty() {
            queue.add(key_of(q.as_ref()));
        }
    }
}

fn to_json<K: Serialize>(o: &K) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}

/// Registers replenishment on deletion (and on the updates `changed` flags) of `K`.
fn watch_replenish<K: kumo_client::informer::Watchable + Serialize>(
    inf: &Informer<K>,
    quotas: &Arc<Informer<ResourceQuota>>,
    queue: &Arc<WorkQueue<String>>,
    ev: Evaluator,
    changed: fn(&Value, &Value) -> bool,
) {
    let (quotas, queue) = (quotas.clone(), queue.clone());
    inf.add_handler(move |c| {
        let (obj, fire) = match c {
            Change::Deleted(o) => (o, true),
            Change::Updated { old, new } => (new, changed(&to_json(old), &to_json(new))),
            Change::Added(_) => return,
        };
        if fire {
            let ns = obj.meta().namespace.clone().unwrap_or_default();
            replenish(&quotas, &queue, &ev, &ns);
        }
    });
}

/// The pod updates that change usage (DefaultUpdateFilter).
fn pod_changed(old: &Value, new: &Value) -> bool {
    let now = Timestamp::now().as_second();
    let resources = |p: &Value| -> Vec<Value> {
        ["containerStatuses", "initContainerStatuses"]
            .iter()
            .flat_map(|l| {
                p.pointer(&format!("/status/{l}"))
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|s| json!([s["name"], s["resources"]]))
            .collect()
    };
    let (ro, rn) = (resources(old), resources(new));
    let resized = ro
        .iter()
        .any(|o| rn.iter().any(|n| n[0] == o[0] && n[1] != o[1]));
    resized
        || is_terminating(old) != is_terminating(new)
        || (charges_compute(old, now) && !charges_compute(new, now))
}

fn service_changed(old: &Value, new: &Value) -> bool {
    let t = |s: &Value| match s.pointer("/spec/type").and_then(Value::as_str) {
        Some(x @ ("NodePort" | "LoadBalancer")) => x.to_owned(),
        _ => String::new(),
    };
    t(old) != t(new)
}

fn never(_: &Value, _: &Value) -> bool {
    false
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("resourcequota_primary");
    let quotas = factory.informer::<ResourceQuota>();
    let pods = factory.informer::<Pod>();
    let services = factory.informer::<Service>();
    let claims = factory.informer::<PersistentVolumeClaim>();
    let configmaps = factory.informer::<ConfigMap>();
    let secrets = factory.informer::<Secret>();
    let rcs = factory.informer::<ReplicationController>();

    let (q, qs) = (queue.clone(), quotas.clone());
    quotas.add_handler(move |c| match c {
        Change::Added(rq) => q.add(key_of(rq)),
        // Only a change of spec.hard needs a new status; status writes (ours and the
        // admission plugin's) do not.
        Change::Updated { old, new } => {
            if !lists_equal(&hard_of(old), &hard_of(new)) {
                q.add(key_of(new));
            }
        }
        Change::Deleted(rq) => {
            q.add(key_of(rq));
            let ns = rq.metadata.namespace.clone().unwrap_or_default();
            replenish(&qs, &q, &Evaluator::of("", "resourcequotas"), &ns);
        }
    });
    watch_replenish(&pods, &quotas, &queue, Evaluator::Pods, pod_changed);
    watch_replenish(
        &services,
        &quotas,
        &queue,
        Evaluator::Services,
        service_changed,
    );
    watch_replenish(
        &claims,
        &quotas,
        &queue,
        Evaluator::Claims,
        claim_usage_changed,
    );
    watch_replenish(
        &configmaps,
        &quotas,
        &queue,
        Evaluator::of("", "configmaps"),
        never,
    );
    watch_replenish(
        &secrets,
        &quotas,
        &queue,
        Evaluator::of("", "secrets"),
        never,
    );
    watch_replenish(
        &rcs,
        &quotas,
        &queue,
        Evaluator::of("", "replicationcontrollers"),
        never,
    );

    tokio::spawn(async move {
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            quotas,
            pods,
            services,
            claims,
            configmaps,
            secrets,
            rcs,
            queue: queue.clone(),
            monitors: Mutex::default(),
            stop: stop.clone(),
        });
        let synced = async {
            ctl.quotas.wait_synced().await;
            ctl.pods.wait_synced().await;
            ctl.services.wait_synced().await;
            ctl.claims.wait_synced().await;
            ctl.configmaps.wait_synced().await;
            ctl.secrets.wait_synced().await;
            ctl.rcs.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let mut tasks = run_workers_of(
            "resourcequota",
            queue,
            WORKERS,
            stop.clone(),
            &ctl,
            |c, key| async move { c.sync(&key).await },
        );
        // The full resync.
        let c = ctl.clone();
        let mut s = stop.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(SYNC_PERIOD) => {}
                    _ = s.wait_for(|s| *s) => return,
                }
                for q in c.quotas.list() {
                    c.queue.add(key_of(q.as_ref()));
                }
            }
        }));
        for t in tasks {
            let _ = t.await;
        }
    })
}

/// Why an evaluator could not compute usage; its resources keep their last usage.
struct NotReady(String);

impl Ctl {
    /// The evaluators for a quota's hard resources: the core ones, plus an object counter
    /// for each other `count/<resource>.<group>` that discovery serves.
    async fn evaluators(
        self: &Arc<Self>,
        hard: &ResourceList,
    ) -> Vec<(Evaluator, Option<Arc<Monitor>>)> {
        let mut out: Vec<(Evaluator, Option<Arc<Monitor>>)> = [
            Evaluator::Pods,
            Evaluator::Services,
            Evaluator::Claims,
            Evaluator::of("", "configmaps"),
            Evaluator::of("", "secrets"),
            Evaluator::of("", "replicationcontrollers"),
            Evaluator::of("", "resourcequotas"),
        ]
        .into_iter()
        .map(|e| (e, None))
        .collect();
        for name in hard.keys() {
            let Some(rest) = name.strip_prefix("count/") else {
                continue;
            };
            if out.iter().any(|(e, _)| !e.matching([name]).is_empty()) {
                continue;
            }
            let (plural, group) = match rest.split_once('.') {
                Some((p, g)) => (p.to_owned(), g.to_owned()),
                None => (rest.to_owned(), String::new()),
            };
            if plural.is_empty() || IGNORED_RESOURCES.contains(&(group.as_str(), plural.as_str())) {
                continue;
            }
            if let Some(m) = self.monitor(&group, &plural).await {
                let ev = Evaluator::of(&group, &plural);
                if !ev.matching([name]).is_empty() {
                    out.push((ev, Some(m)));
                }
            }
        }
        out
    }

    /// The monitor of (group, plural), started on first use; None when discovery does
    /// not serve it with create, list, watch and delete.
    async fn monitor(self: &Arc<Self>, group: &str, plural: &str) -> Option<Arc<Monitor>> {
        let key = (group.to_owned(), plural.to_owned());
        if let Some(m) = self.monitors.lock().get(&key) {
            return m.clone();
        }
        let ar = match self.discover(group, plural).await {
            Ok(ar) => ar,
            Err(e) => {
                // Not remembered: discovery may work next time.
                tracing::warn!(group, resource = plural, error = %e, "discovery failed");
                return None;
            }
        };
        let mut monitors = self.monitors.lock();
        if let Some(m) = monitors.get(&key) {
            return m.clone();
        }
        let m = ar.map(|ar| {
            let m = Arc::new(Monitor {
                items: RwLock::default(),
                synced: AtomicBool::new(false),
            });
            tokio::spawn(self.clone().run_monitor(ar, m.clone()));
            m
        });
        monitors.insert(key, m.clone());
        m
    }

    /// The preferred version of (group, plural) if it is quotable (GetQuotableResources).
    async fn discover(&self, group: &str, plural: &str) -> Result<Option<ApiResource>, String> {
        let client = self.client.get();
        let version = if group.is_empty() {
            "v1".to_owned()
        } else {
            let groups = client.list_api_groups().await.map_err(|e| message(&e))?;
            let Some(g) = groups.groups.into_iter().find(|g| g.name == group) else {
                return Ok(None);
            };
            match g
                .preferred_version
                .map(|p| p.version)
                .or_else(|| g.versions.first().map(|v| v.version.clone()))
            {
                Some(v) => v,
                None => return Ok(None),
            }
        };
        let gv = if group.is_empty() {
            version.clone()
        } else {
            format!("{group}/{version}")
        };
        let list = if group.is_empty() {
            client.list_core_api_resources(&version).await
        } else {
            client.list_api_group_resources(&gv).await
        };
        let list = match list {
            Ok(l) => l,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(message(&e)),
        };
        Ok(list
            .resources
            .into_iter()
            .find(|r| {
                r.name == plural
                    && r.namespaced
                    && ["create", "list", "watch", "delete"]
                        .iter()
                        .all(|v| r.verbs.iter().any(|x| x == v))
            })
            .map(|r| ApiResource {
                group: group.to_owned(),
                version: version.clone(),
                api_version: gv.clone(),
                kind: r.kind,
                plural: r.name,
            }))
    }

    /// One resource's metadata-only watch; a deletion replenishes the namespace's quotas.
    async fn run_monitor(self: Arc<Self>, ar: ApiResource, m: Arc<Monitor>) {
        let ev = Evaluator::of(&ar.group, &ar.plural);
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(self.client.get(), &ar);
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        let mut stop = self.stop.clone();
        let mut listing: Option<HashMap<String, HashSet<String>>> = None;
        let id = |o: &PartialObjectMeta<DynamicObject>| {
            (
                o.metadata.namespace.clone().unwrap_or_default(),
                o.metadata.name.clone().unwrap_or_default(),
            )
        };
        loop {
            let e = tokio::select! {
                e = stream.next() => e,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Some(e) = e else { return };
            match e {
                Ok(WatchEvent::Init) => listing = Some(HashMap::new()),
                Ok(WatchEvent::InitApply(o)) => {
                    let (ns, name) = id(&o);
                    listing
                        .get_or_insert_with(HashMap::new)
                        .entry(ns)
                        .or_default()
                        .insert(name);
                }
                Ok(WatchEvent::InitDone) => {
                    let listed = listing.take().unwrap_or_default();
                    let old = std::mem::replace(&mut *m.items.write(), listed.clone());
                    m.synced.store(true, Ordering::SeqCst);
                    // Namespaces that lost objects while the watch was down.
                    for (ns, names) in old {
                        if names
                            .iter()
                            .any(|n| !listed.get(&ns).is_some_and(|l| l.contains(n)))
                        {
                            replenish(&self.quotas, &self.queue, &ev, &ns);
                        }
                    }
                }
                Ok(WatchEvent::Apply(o)) => {
                    let (ns, name) = id(&o);
                    m.items.write().entry(ns).or_default().insert(name);
                }
                Ok(WatchEvent::Delete(o)) => {
                    let (ns, name) = id(&o);
                    if let Some(s) = m.items.write().get_mut(&ns) {
                        s.remove(&name);
                    }
                    replenish(&self.quotas, &self.queue, &ev, &ns);
                }
                Err(e) => {
                    tracing::debug!(resource = %ar.plural, group = %ar.group, error = %e, "watch failed; retrying")
                }
            }
        }
    }

    /// The objects `ev` evaluates in `ns`, as JSON; for monitored resources, only as many
    /// empty objects as there are.
    fn items(&self, ev: &Evaluator, m: Option<&Monitor>, ns: &str) -> Result<Vec<Value>, NotReady> {
        fn of<K: kumo_client::informer::Watchable + Serialize>(
            inf: &Informer<K>,
            ns: &str,
        ) -> Vec<Value> {
            inf.list()
                .iter()
                .filter(|o| o.meta().namespace.as_deref() == Some(ns))
                .map(|o| to_json(o.as_ref()))
                .collect()
        }
        let count = |n: usize| vec![Value::Null; n];
        Ok(match ev {
            Evaluator::Pods => of(&self.pods, ns),
            Evaluator::Services => of(&self.services, ns),
            Evaluator::Claims => of(&self.claims, ns),
            Evaluator::Count { group, plural, .. } if group.is_empty() => match plural.as_str() {
                "configmaps" => of(&self.configmaps, ns),
                "secrets" => of(&self.secrets, ns),
                "replicationcontrollers" => of(&self.rcs, ns),
                "resourcequotas" => of(&self.quotas, ns),
                _ => self.counted(m, group, plural, ns).map(count)?,
            },
            Evaluator::Count { group, plural, .. } => {
                self.counted(m, group, plural, ns).map(count)?
            }
        })
    }

    fn counted(
        &self,
        m: Option<&Monitor>,
        group: &str,
        plural: &str,
        ns: &str,
    ) -> Result<usize, NotReady> {
        match m {
            Some(m) if m.synced.load(Ordering::SeqCst) => Ok(m.count(ns)),
            _ => {
                let gvr = if group.is_empty() {
                    plural.to_owned()
                } else {
                    format!("{group}/{plural}")
                };
                Err(NotReady(format!(
                    "failed to list content: {gvr} not yet synced"
                )))
            }
        }
    }

    /// CalculateUsage: the usage of every hard resource some evaluator can compute, and
    /// the errors of those that could not.
    async fn calculate_usage(
        self: &Arc<Self>,
        rq: &ResourceQuota,
        hard: &ResourceList,
    ) -> (ResourceList, Vec<String>) {
        let ns = rq.metadata.namespace.clone().unwrap_or_default();
        let evaluators = self.evaluators(hard).await;
        let mut matched: BTreeSet<String> = BTreeSet::new();
        for (e, _) in &evaluators {
            matched.extend(e.matching(hard.keys()));
        }
        let selectors = quota_selectors(rq);
        let now = Timestamp::now().as_second();
        let mut usage = ResourceList::new();
        let mut errors = Vec::new();
        for (ev, m) in &evaluators {
            let inter = ev.matching(&matched);
            if inter.is_empty() {
                continue;
            }
            let items = match self.items(ev, m.as_deref(), &ns) {
                Ok(i) => i,
                Err(NotReady(e)) => {
                    errors.push(e);
                    matched.retain(|r| !inter.contains(r));
                    continue;
                }
            };
            // CalculateUsageStats: every tracked resource starts at zero.
            let mut used: ResourceList = inter
                .iter()
                .map(|r| (r.clone(), Quantity::zero()))
                .collect();
            for item in &items {
                if selectors.iter().all(|s| ev.matches_scope(s, item)) {
                    used = add_lists(&used, &ev.usage(item, now));
                }
            }
            usage = add_lists(&usage, &used);
        }
        (mask(&usage, &matched), errors)
    }

    async fn sync(self: &Arc<Self>, key: &str) -> Result<(), SyncError> {
        let Some(rq) = self.quotas.get(key) else {
            return Ok(());
        };
        let hard = hard_of(&rq);
        let old_hard = status_list(&rq, "hard");
        let old_used = status_list(&rq, "used");
        let mut dirty = old_hard.is_none()
            || old_used.is_none()
            || !lists_equal(&hard, old_hard.as_ref().unwrap_or(&ResourceList::new()));
        let old_used = old_used.unwrap_or_default();
        let (usage, errors) = self.calculate_usage(&rq, &hard).await;
        let mut used = old_used.clone();
        used.extend(usage);
        let names: BTreeSet<String> = hard.keys().cloned().collect();
        let used = mask(&used, &names);
        dirty = dirty || !lists_equal(&used, &old_used);
        let mut errors = errors;
        if dirty {
            let mut obj = to_json(rq.as_ref());
            let mut status = serde_json::Map::new();
            if !hard.is_empty() {
                status.insert("hard".into(), list_json(&hard));
            }
            if !used.is_empty() {
                status.insert("used".into(), list_json(&used));
            }
            obj["status"] = Value::Object(status);
            let next: ResourceQuota = serde_json::from_value(obj)
                .map_err(|e| SyncError::Failed(format!("encoding the status: {e}")))?;
            let api: Api<ResourceQuota> = Api::namespaced(
                self.client.get(),
                rq.metadata.namespace.as_deref().unwrap_or_default(),
            );
            match api
                .replace_status(
                    rq.metadata.name.as_deref().unwrap_or_default(),
                    &PostParams::default(),
                    &next,
                )
                .await
            {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => return Ok(()),
                Err(e) => errors.push(message(&e)),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SyncError::Failed(errors.join(", ")))
        }
    }
}
