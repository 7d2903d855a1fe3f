//! Shared informers: one list+watch and one in-memory cache per resource type, shared by
//! every controller that needs it, with add/update/delete handlers (client-go's
//! SharedInformerFactory). The cache is updated before handlers run, so a handler that
//! reads the cache sees the change it is told about.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use parking_lot::{Mutex, RwLock};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The cache key of an object: `namespace/name`, or `name` for cluster-scoped objects.
pub fn key_of<K: Resource>(obj: &K) -> String {
    let m = obj.meta();
    let name = m.name.as_deref().unwrap_or_default();
    match m.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// What happened to an object, as a handler sees it.
pub enum Change<'a, K> {
    /// Seen for the first time (initial list included).
    Added(&'a K),
    /// Changed, or listed again after a relist.
    Updated {
        /// The cached object before the change.
        old: &'a K,
        /// The object now.
        new: &'a K,
    },
    /// Gone (deleted, or missing from a relist).
    Deleted(&'a K),
}

type Handler<K> = Box<dyn Fn(Change<'_, K>) + Send + Sync>;

/// The bounds a resource type needs to be watched and cached.
pub trait Watchable:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}
impl<K> Watchable for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// One resource type's watch, cache and handlers.
pub struct Informer<K> {
    api: Api<K>,
    items: RwLock<BTreeMap<String, Arc<K>>>,
    handlers: RwLock<Vec<Handler<K>>>,
    synced: watch::Sender<bool>,
}

impl<K: Watchable> Informer<K> {
    fn new(client: Client) -> Self {
        Informer {
            api: Api::all(client),
            items: RwLock::new(BTreeMap::new()),
            handlers: RwLock::new(Vec::new()),
            synced: watch::channel(false).0,
        }
    }

    /// Registers a handler; register before the factory starts so it sees the initial list.
    pub fn add_handler(&self, f: impl Fn(Change<'_, K>) + Send + Sync + 'static) {
        self.handlers.write().push(Box::new(f));
    }

    /// The cached object with this key (`namespace/name` or `name`).
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.items.read().get(key).cloned()
    }

    /// Every cached object, ordered by key.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.items.read().values().cloned().collect()
    }

    /// Whether the initial list has been cached and handed to the handlers.
    pub fn has_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until [`Self::has_synced`].
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        // The sender lives in self, so this only ends when synced.
        let _ = rx.wait_for(|s| *s).await;
    }

    fn dispatch(&self, change: Change<'_, K>) {
        for h in self.handlers.read().iter() {
            h(change);
        }
    }

    fn apply(&self, obj: K) {
        let key = key_of(&obj);
        let new = Arc::new(obj);
        let old = self.items.write().insert(key, new.clone());
        match old {
            Some(old) => self.dispatch(Change::Updated {
                old: &old,
                new: &new,
            }),
            None => self.dispatch(Change::Added(&new)),
        }
    }

    fn delete(&self, obj: K) {
        self.items.write().remove(&key_of(&obj));
        // The watch event's final state of the object, as client-go hands it to OnDelete.
        self.dispatch(Change::Deleted(&obj));
    }

    /// A relist: everything listed is added or updated, everything not listed is deleted.
    fn replace(&self, listed: BTreeMap<String, K>) {
        let gone: Vec<Arc<K>> = {
            let items = self.items.read();
            items
                .iter()
                .filter(|(k, _)| !listed.contains_key(*k))
                .map(|(_, v)| v.clone())
                .collect()
        };
        for obj in gone {
            self.items.write().remove(&key_of(obj.as_ref()));
            self.dispatch(Change::Deleted(&obj));
        }
        for (_, obj) in listed {
            self.apply(obj);
        }
    }

    async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let kind = K::kind(&());
        // Lists read the watch cache (`resourceVersion=0`), as client-go's reflectors do.
        // Not paged: kube-rs leaves `resourceVersion=0` out of a list with a limit, which
        // makes it a consistent read (and the cache answers `0` whole anyway).
        let mut cfg = watcher::Config::default().any_semantic();
        cfg.page_size = None;
        let stream = watcher::watcher(self.api.clone(), cfg).default_backoff();
        futures::pin_mut!(stream);
        let mut buffer: Option<BTreeMap<String, K>> = None;
        loop {
            let ev = tokio::select! {
                ev = stream.next() => ev,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Some(mut ev) = ev else { return };
            // Like upstream's controller-manager and scheduler informers, the cache drops
            // managedFields: no controller reads them, and they are often half an object.
            if let Ok(Event::InitApply(obj) | Event::Apply(obj) | Event::Delete(obj)) = &mut ev {
                obj.meta_mut().managed_fields = None;
            }
            match ev {
                Ok(Event::Init) => buffer = Some(BTreeMap::new()),
                Ok(Event::InitApply(obj)) => {
                    buffer
                        .get_or_insert_with(BTreeMap::new)
                        .insert(key_of(&obj), obj);
                }
                Ok(Event::InitDone) => {
                    self.replace(buffer.take().unwrap_or_default());
                    self.synced.send_replace(true);
                    tracing::debug!(%kind, "informer synced");
                }
                Ok(Event::Apply(obj)) => self.apply(obj),
                Ok(Event::Delete(obj)) => self.delete(obj),
                Err(e) => tracing::warn!(%kind, error = %e, "watch failed; retrying"),
            }
        }
    }
}

// Manual impls: a change only holds references, so it is Copy whatever K is.
impl<K> Clone for Change<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for Change<'_, K> {}

trait Runnable: Send + Sync {
    fn spawn(self: Arc<Self>, stop: watch::Receiver<bool>) -> JoinHandle<()>;
}

impl<K: Watchable> Runnable for Informer<K> {
    fn spawn(self: Arc<Self>, stop: watch::Receiver<bool>) -> JoinHandle<()> {
        tokio::spawn(self.run(stop))
    }
}

struct Entry {
    any: Arc<dyn Any + Send + Sync>,
    run: Arc<dyn Runnable>,
    started: bool,
}

/// Hands out one informer per resource type and starts them together.
pub struct InformerFactory {
    client: Client,
    informers: Mutex<HashMap<TypeId, Entry>>,
    /// The component's metrics, which its work queues report to.
    metrics: Arc<crate::metrics::Registry>,
}

impl InformerFactory {
    /// A factory whose informers watch through `client`.
    pub fn new(client: Client) -> Self {
        Self::with_metrics(client, Arc::default())
    }

    /// A factory whose informers watch through `client`, and whose component reports its
    /// metrics to `metrics`.
    pub fn with_metrics(client: Client, metrics: Arc<crate::metrics::Registry>) -> Self {
        InformerFactory {
            client,
            informers: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// The component's metrics.
    pub fn metrics(&self) -> &Arc<crate::metrics::Registry> {
        &self.metrics
    }

    /// A work queue with client-go's default controller rate limiter, reported in the
    /// component's metrics.
    pub fn queue<T>(&self, name: &str) -> Arc<crate::workqueue::WorkQueue<T>>
    where
        T: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    {
        self.queue_with_limiter(name, crate::workqueue::RateLimiter::default_controller())
    }

    /// A work queue with its own rate limiter, reported in the component's metrics.
    pub fn queue_with_limiter<T>(
        &self,
        name: &str,
        limiter: crate::workqueue::RateLimiter<T>,
    ) -> Arc<crate::workqueue::WorkQueue<T>>
    where
        T: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    {
        let q = crate::workqueue::WorkQueue::with_limiter(name, limiter);
        let stats: std::sync::Weak<dyn crate::metrics::QueueStats> = Arc::downgrade(&q) as _;
        self.metrics.register_queue(stats);
        q
    }

    /// The shared informer of `K`, created on first use.
    pub fn informer<K: Watchable>(&self) -> Arc<Informer<K>> {
        let mut m = self.informers.lock();
        let e = m.entry(TypeId::of::<K>()).or_insert_with(|| {
            let inf = Arc::new(Informer::<K>::new(self.client.clone()));
            Entry {
                any: inf.clone(),
                run: inf,
                started: false,
            }
        });
        match e.any.clone().downcast::<Informer<K>>() {
            Ok(inf) => inf,
            // Unreachable: entries are keyed by the TypeId of K.
            Err(_) => Arc::new(Informer::<K>::new(self.client.clone())),
        }
    }

    /// Starts every informer not started yet; they stop when `stop` turns true.
    pub fn start(&self, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        let mut m = self.informers.lock();
        let mut tasks = Vec::new();
        for e in m.values_mut() {
            if !e.started {
                e.started = true;
                tasks.push(e.run.clone().spawn(stop.clone()));
            }
        }
        tasks
    }
}
