//! The watch cache: one in-memory copy of each resource's objects, kept current by one
//! store watch, that serves lists and watches so that they do not each reach the store.
//!
//! Like kube-apiserver's cacher, a cache holds the decoded objects of one storage prefix
//! (`/registry/pods/`), the revision they reflect, and a window of recent events. Lists with
//! `resourceVersion` unset (a consistent read), `0` or a `NotOlderThan` revision are served
//! from it once it has caught up with the revision they need, and so are continued lists
//! whose revision the window still reaches (the changes since are undone page by page);
//! watches start from its snapshot or from its event window and then follow its fan-out.
//! Reads it cannot answer (an exact revision, a revision older than the window) go to the
//! store.
//!
//! A resource may name one field its cache is indexed by (upstream's watch-cache
//! "triggers": pods by `spec.nodeName`). Each cached object carries its value, so lists and
//! watches that pin that field with `=` skip the rest without decoding them, and such a
//! watcher follows a fan-out of its own value only: a change wakes the kubelet of the pod's
//! node, not every kubelet of the cluster.
//!
//! A cache starts on the first list or watch of its resource, so resources nobody reads cost
//! nothing. If its store watch fails (history compacted under it, a broken connection), it
//! lists again and tells its watchers to end; clients re-watch from their last revision.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kumo_storage::{RangeRequest, Revision, Store, WatchEvent};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, watch};

/// Events the window always keeps, however old (watchers of quiet resources resume):
/// upstream's lower bound of a watch cache's capacity. More stay while they are fresh;
/// an idle cluster's leases, renewed every few seconds, keep no more than this.
const HISTORY: usize = 100;
/// Events younger than this stay in the window (upstream's eventFreshDuration), so that a
/// watcher that got a bookmark a minute ago can resume from it under any write rate...
const FRESH: Duration = Duration::from_secs(75);
/// ...up to this many (upstream's largest watch-cache capacity).
const HISTORY_MAX: usize = 100 * 1024;
/// Events a watcher may fall behind the fan-out before it is ended (then it resumes from
/// the window): upstream's largest per-watcher buffer. The fan-out's ring is allocated
/// whole (32 bytes a slot), for every watched resource of every API server of the process.
const FANOUT: usize = 1024;
/// Events a watcher of one index value may fall behind (one node's pods change rarely).
const INDEXED_FANOUT: usize = 256;
/// Objects read per store range while filling a cache.
const FILL_PAGE: usize = 2000;
/// How often a cache asks the store for a progress notification (watch bookmarks).
const PROGRESS_EVERY: Duration = Duration::from_secs(60);

/// An object as the cache keeps it: serialized once, as a list item (without `kind` and
/// `apiVersion`) with its resourceVersion stamped, plus its labels for selectors. Lists and
/// watches splice the bytes into their answers without decoding; whoever needs the value
/// (field selectors, tables, converted views) decodes it.
#[derive(Debug)]
pub struct Cached {
    /// The object's JSON without `kind` and `apiVersion`.
    pub item: Bytes,
    /// `"apiVersion":"…","kind":"…"`, the members the item lacks.
    head: Box<str>,
    pub labels: BTreeMap<String, String>,
    /// The value of the cache's index field, when the resource has one.
    pub index: Option<Box<str>>,
}

/// The field a resource's watch cache is indexed by, and how to read it from an object.
#[derive(Clone, Copy)]
pub struct WatchIndex {
    /// The field selector's name for it (`spec.nodeName`).
    pub field: &'static str,
    pub value: fn(&Value) -> String,
}

impl std::fmt::Debug for WatchIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.field)
    }
}

impl Cached {
    /// From the stored bytes of an object written at `rv`.
    pub fn from_stored(bytes: &[u8], rv: Revision, index: Option<WatchIndex>) -> Option<Cached> {
        let mut obj: Value = serde_json::from_slice(bytes).ok()?;
        let index = index.map(|i| (i.value)(&obj).into_boxed_str());
        let o = obj.as_object_mut()?;
        let api_version = o.remove("apiVersion").unwrap_or(Value::Null);
        let kind = o.remove("kind").unwrap_or(Value::Null);
        let mut labels = BTreeMap::new();
        if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            m.insert("resourceVersion".into(), json!(rv.to_string()));
            if let Some(l) = m.get("labels").and_then(Value::as_object) {
                labels = l
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect();
            }
        }
        let head = format!("\"apiVersion\":{api_version},\"kind\":{kind}").into_boxed_str();
        Some(Cached {
            item: Bytes::from(serde_json::to_vec(&obj).ok()?),
            head,
            labels,
            index,
        })
    }

    /// The whole object (with `kind` and `apiVersion`) as JSON.
    pub fn object_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.item.len() + self.head.len() + 2);
        out.push(b'{');
        out.extend_from_slice(self.head.as_bytes());
        let rest = self.item.get(1..).unwrap_or_default();
        if rest.first().is_some_and(|&c| c != b'}') {
            out.push(b',');
        }
        out.extend_from_slice(rest);
        out
    }

    /// The whole object, decoded.
    pub fn object(&self) -> Value {
        serde_json::from_slice(&self.object_json()).unwrap_or(Value::Null)
    }
}

/// One change, as the cache fans it out. Objects are in their stored form, with their
/// resourceVersion set.
#[derive(Debug)]
pub enum CacheEvent {
    /// Created or updated; `prev` is the object before (None on create).
    Put {
        key: String,
        revision: Revision,
        obj: Arc<Cached>,
        prev: Option<Arc<Cached>>,
    },
    /// Deleted at `revision`; `prev` is the object as it was.
    Delete {
        key: String,
        revision: Revision,
        prev: Arc<Cached>,
    },
    /// Nothing else changed up to this revision.
    Progress(Revision),
    /// The cache lost its store watch and refilled: every watcher following it must end.
    Reset,
}

impl CacheEvent {
    /// The revision of a change (0 for a reset).
    pub fn revision(&self) -> Revision {
        match self {
            CacheEvent::Put { revision, .. } | CacheEvent::Delete { revision, .. } => *revision,
            CacheEvent::Progress(r) => *r,
            CacheEvent::Reset => 0,
        }
    }

    /// The key of a change.
    /// The index values of the object before and after the change.
    fn index_values(&self) -> [Option<&str>; 2] {
        match self {
            CacheEvent::Put { obj, prev, .. } => [
                obj.index.as_deref(),
                prev.as_ref().and_then(|p| p.index.as_deref()),
            ],
            CacheEvent::Delete { prev, .. } => [prev.index.as_deref(), None],
            _ => [None, None],
        }
    }

    /// Whether the change concerns an object whose index value is (or was) `value`.
    pub fn touches(&self, value: &str) -> bool {
        self.index_values().contains(&Some(value))
    }

    pub fn key(&self) -> Option<&str> {
        match self {
            CacheEvent::Put { key, .. } | CacheEvent::Delete { key, .. } => Some(key),
            _ => None,
        }
    }
}

struct Inner {
    objects: BTreeMap<String, Arc<Cached>>,
    /// The keys of the objects by their index value (when the cache has an index).
    by_index: HashMap<Box<str>, BTreeSet<String>>,
    /// The revision the objects reflect (0 until the first fill).
    revision: Revision,
    /// Recent changes and when they arrived, oldest first.
    history: VecDeque<(Instant, Arc<CacheEvent>)>,
    /// Every change after this revision is in `history`.
    floor: Revision,
    /// The revision of the newest change applied (the fill's revision before any).
    last_change: Revision,
}

/// How many events a cache's window keeps.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Kept whatever their age.
    pub min: usize,
    /// Never more than this.
    pub max: usize,
    /// Events younger than this are kept (up to `max`).
    pub fresh: Duration,
}

impl Default for Window {
    fn default() -> Window {
        Window {
            min: HISTORY,
            max: HISTORY_MAX,
            fresh: FRESH,
        }
    }
}

/// The cache of one storage prefix.
pub struct WatchCache {
    prefix: String,
    window: Window,
    inner: RwLock<Inner>,
    /// Made for the first watcher: a resource nobody watches needs no ring.
    fanout: std::sync::OnceLock<broadcast::Sender<Arc<CacheEvent>>>,
    /// The resource's index field, if any.
    index: Option<WatchIndex>,
    /// One fan-out per index value that has watchers.
    indexed: Mutex<HashMap<Box<str>, broadcast::Sender<Arc<CacheEvent>>>>,
    revision: watch::Sender<Revision>,
    progress: mpsc::Sender<()>,
}

/// What a list reads from the cache: a key range, at a revision, selected cheaply.
pub struct PageQuery<'a> {
    /// The key prefix listed (the cache's prefix, or a namespace's within it).
    pub key_prefix: &'a str,
    /// The first key to hand out (a continued list), if any.
    pub start: Option<&'a str>,
    /// The revision to read at (a continued list); `None` for the current state.
    pub at: Option<Revision>,
    /// The value of the cache's index field the objects must have.
    pub by: Option<&'a str>,
    /// Any further selection on the cached form (label selectors).
    pub keep: &'a dyn Fn(&Cached) -> bool,
    /// At most this many objects (0: all).
    pub limit: usize,
    /// Count the objects in the range after the page (for `remainingItemCount`).
    pub count_rest: bool,
}

/// One page of a list.
pub struct Page {
    pub revision: Revision,
    /// (key, object) in key order.
    pub objects: Vec<(String, Arc<Cached>)>,
    /// Whether selected objects follow the page.
    pub more: bool,
    /// How many objects of the range follow the page, when counted.
    pub rest: Option<usize>,
}

/// A consistent view of the objects under a key prefix.
pub struct Snapshot {
    pub revision: Revision,
    /// (key, object) in key order.
    pub objects: Vec<(String, Arc<Cached>)>,
}

/// Why the cache cannot serve a watch.
#[derive(Debug, PartialEq, Eq)]
pub enum NoWatch {
    /// Not filled from the store yet.
    Unfilled,
    /// The window starts after the watch's revision: `oldest` is the newest revision whose
    /// changes are gone.
    TooOld { oldest: Revision },
    /// The cache has not reached the watch's revision; it stands at `current`.
    Ahead { current: Revision },
}

/// Where a cached watch starts.
pub struct CachedWatch {
    /// The state to send first (as ADDED), when asked for.
    pub initial: Option<Snapshot>,
    /// Changes after the start that the window still held.
    pub replay: Vec<Arc<CacheEvent>>,
    /// The revision the watch stands at once `initial` and `replay` are sent.
    pub revision: Revision,
    /// Changes from then on.
    pub live: broadcast::Receiver<Arc<CacheEvent>>,
}

impl WatchCache {
    /// The revision the cache reflects, waiting up to `wait` for it to reach `at_least`.
    /// `None` when it did not (the caller reads the store instead).
    pub async fn wait_for(&self, at_least: Revision, wait: Duration) -> Option<Revision> {
        let mut rx = self.revision.subscribe();
        let current = *rx.borrow_and_update();
        if current >= at_least && current > 0 {
            return Some(current);
        }
        // Other prefixes may have moved the revision; a progress notification brings the
        // cache's revision up to the store's without any change of its own.
        let _ = self.progress.try_send(());
        let reached = tokio::time::timeout(wait, async {
            loop {
                if rx.changed().await.is_err() {
                    return None;
                }
                let r = *rx.borrow_and_update();
                if r >= at_least && r > 0 {
                    return Some(r);
                }
            }
        })
        .await;
        reached.ok().flatten()
    }

    /// The revision the cache reflects (0 until filled).
    pub fn current(&self) -> Revision {
        *self.revision.borrow()
    }

    /// The objects under `key_prefix` (which starts with the cache's prefix).
    pub fn snapshot(&self, key_prefix: &str) -> Snapshot {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        Snapshot {
            revision: inner.revision,
            objects: range(&inner.objects, key_prefix)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// A page of a list, read under one lock without decoding: the objects of the query's
    /// range as they are, or as they were at its revision (the changes since, undone from
    /// the window). `None` when the cache is empty or its window does not reach back to
    /// that revision (the store must serve).
    pub fn page(&self, q: &PageQuery<'_>) -> Option<Page> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        if inner.revision == 0 {
            return None;
        }
        let at = q.at.unwrap_or(inner.revision);
        if at > inner.revision || (at < inner.last_change && at < inner.floor) {
            return None;
        }
        let from = match q.start {
            Some(s) if s > q.key_prefix => s,
            _ => q.key_prefix,
        };
        // The keys changed after `at` and their state at `at` (None: absent), from the
        // oldest change after it.
        let mut undo: BTreeMap<&String, Option<&Arc<Cached>>> = BTreeMap::new();
        if at < inner.last_change {
            let first = inner.history.partition_point(|(_, e)| e.revision() <= at);
            for (_, e) in inner.history.range(first..) {
                let (key, before) = match &**e {
                    CacheEvent::Put { key, prev, .. } => (key, prev.as_ref()),
                    CacheEvent::Delete { key, prev, .. } => (key, Some(prev)),
                    _ => continue,
                };
                if key.as_str() >= from && key.starts_with(q.key_prefix) {
                    undo.entry(key).or_insert(before);
                }
            }
        }
        let by = q.by.filter(|_| self.index.is_some());
        let mut view: Box<dyn Iterator<Item = (&String, &Arc<Cached>)>> = match by {
            // The index serves the current state; the undone keys join it in order.
            Some(v) => {
                let current = inner.indexed(v, q.key_prefix, from);
                Box::new(
                    Merge::new(current, undo.into_iter())
                        .filter(move |(_, o)| o.index.as_deref() == Some(v)),
                )
            }
            None => Box::new(Merge::new(
                inner
                    .objects
                    .range::<str, _>((Bound::Included(from), Bound::Unbounded))
                    .take_while(|(k, _)| k.starts_with(q.key_prefix)),
                undo.into_iter(),
            )),
        };
        let mut objects = Vec::new();
        let mut more = false;
        for (k, o) in view.by_ref() {
            if !(q.keep)(o) {
                continue;
            }
            if q.limit > 0 && objects.len() >= q.limit {
                more = true;
                break;
            }
            objects.push((k.clone(), o.clone()));
        }
        let rest = (q.count_rest && more).then(|| 1 + view.count());
        Some(Page {
            revision: at,
            objects,
            more,
            rest,
        })
    }

    /// The object at `key` as the cache holds it: `None` until the cache is filled,
    /// `Some(None)` when there is no such object.
    pub fn get(&self, key: &str) -> Option<Option<Arc<Cached>>> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        (inner.revision != 0).then(|| inner.objects.get(key).cloned())
    }

    /// The field the cache is indexed by, if any.
    pub fn index(&self) -> Option<WatchIndex> {
        self.index
    }

    /// Starts a watch: with `initial`, from the current state (as a snapshot of
    /// `key_prefix`); otherwise from revision `from`. Refused when the cache is not filled
    /// yet, when its window no longer holds the changes after `from`, or when it is behind
    /// `from`.
    /// With `by` (a value of the cache's index field the watcher requires), the watch gets
    /// only the objects and changes with that value, and follows that value's fan-out.
    pub fn watch(
        &self,
        key_prefix: &str,
        from: Revision,
        initial: bool,
        by: Option<&str>,
    ) -> Result<CachedWatch, NoWatch> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        if inner.revision == 0 {
            return Err(NoWatch::Unfilled);
        }
        let by = by.filter(|_| self.index.is_some());
        // Subscribing under the read lock: the writer applies and fans out under the write
        // lock, so nothing falls between the snapshot (or the replay) and the live stream.
        let live = match by {
            None => self
                .fanout
                .get_or_init(|| broadcast::channel(FANOUT).0)
                .subscribe(),
            Some(v) => {
                let mut indexed = self.indexed.lock().unwrap_or_else(|e| e.into_inner());
                indexed
                    .entry(v.into())
                    .or_insert_with(|| broadcast::channel(INDEXED_FANOUT).0)
                    .subscribe()
            }
        };
        if initial {
            let objects = match by {
                Some(v) => inner
                    .indexed(v, key_prefix, key_prefix)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                None => range(&inner.objects, key_prefix)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            };
            return Ok(CachedWatch {
                initial: Some(Snapshot {
                    revision: inner.revision,
                    objects,
                }),
                replay: Vec::new(),
                revision: inner.revision,
                live,
            });
        }
        if from < inner.floor {
            return Err(NoWatch::TooOld {
                oldest: inner.floor,
            });
        }
        if from > inner.revision {
            return Err(NoWatch::Ahead {
                current: inner.revision,
            });
        }
        let replay = inner
            .history
            .range(inner.history.partition_point(|(_, e)| e.revision() <= from)..)
            .map(|(_, e)| e)
            .filter(|e| e.key().is_some_and(|k| k.starts_with(key_prefix)))
            .filter(|e| by.is_none_or(|v| e.touches(v)))
            .cloned()
            .collect();
        Ok(CachedWatch {
            initial: None,
            replay,
            revision: inner.revision,
            live,
        })
    }

    /// Fills the cache from the store and follows its changes until the watch fails.
    async fn follow(self: &Arc<Self>, store: &Arc<dyn Store>, progress: &mut mpsc::Receiver<()>) {
        let Some(at) = self.fill(store).await else {
            return;
        };
        let mut stream = match store.watch(self.prefix.as_bytes(), at).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(prefix = %self.prefix, error = %e, "watch cache: store watch failed");
                return;
            }
        };
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.tick().await;
        loop {
            tokio::select! {
                ev = stream.next() => match ev {
                    Some(Ok(ev)) => self.apply(ev),
                    Some(Err(e)) => {
                        tracing::warn!(prefix = %self.prefix, error = %e, "watch cache: store watch ended");
                        return;
                    }
                    None => return,
                },
                Some(()) = progress.recv() => stream.request_progress().await,
                _ = tick.tick() => stream.request_progress().await,
            }
        }
    }

    /// Lists the prefix at one revision into the cache; ends followers of an earlier fill.
    async fn fill(&self, store: &Arc<dyn Store>) -> Option<Revision> {
        let mut objects = BTreeMap::new();
        let mut start: Option<Vec<u8>> = None;
        let mut at: Option<Revision> = None;
        loop {
            let page = match store
                .range(RangeRequest {
                    prefix: self.prefix.clone().into_bytes(),
                    start: start.clone(),
                    limit: FILL_PAGE,
                    revision: at,
                })
                .await
            {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(prefix = %self.prefix, error = %e, "watch cache: fill failed");
                    return None;
                }
            };
            at = Some(page.revision);
            let last = page.kvs.last().map(|kv| kv.key.clone());
            for kv in page.kvs {
                if let Some(obj) = Cached::from_stored(&kv.value, kv.mod_revision, self.index) {
                    objects.insert(String::from_utf8_lossy(&kv.key).into_owned(), Arc::new(obj));
                }
            }
            match (page.more, last) {
                (true, Some(mut k)) => {
                    k.push(0);
                    start = Some(k);
                }
                _ => break,
            }
        }
        let at = at?;
        let mut by_index: HashMap<Box<str>, BTreeSet<String>> = HashMap::new();
        if self.index.is_some() {
            for (k, o) in &objects {
                if let Some(v) = &o.index {
                    by_index.entry(v.clone()).or_default().insert(k.clone());
                }
            }
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let refill = inner.revision != 0;
        *inner = Inner {
            objects,
            by_index,
            revision: at,
            history: VecDeque::new(),
            floor: at,
            last_change: at,
        };
        if refill {
            self.send(Arc::new(CacheEvent::Reset));
        }
        self.revision.send_replace(at);
        drop(inner);
        tracing::debug!(prefix = %self.prefix, revision = at, "watch cache filled");
        Some(at)
    }

    /// Applies one store event and fans it out.
    fn apply(&self, ev: WatchEvent) {
        // Decoded before the lock: readers wait only for the insert.
        let decoded = match &ev {
            WatchEvent::Put { kv, .. } => {
                Cached::from_stored(&kv.value, kv.mod_revision, self.index).map(Arc::new)
            }
            _ => None,
        };
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let event = match ev {
            WatchEvent::Put { kv, .. } => {
                let key = String::from_utf8_lossy(&kv.key).into_owned();
                let Some(obj) = decoded else {
                    tracing::warn!(%key, "watch cache: undecodable object skipped");
                    inner.revision = inner.revision.max(kv.mod_revision);
                    self.revision.send_replace(inner.revision);
                    return;
                };
                let prev = inner.objects.insert(key.clone(), obj.clone());
                inner.reindex(&key, prev.as_deref(), Some(&obj));
                CacheEvent::Put {
                    key,
                    revision: kv.mod_revision,
                    obj,
                    prev,
                }
            }
            WatchEvent::Delete { key, revision, .. } => {
                let key = String::from_utf8_lossy(&key).into_owned();
                match inner.objects.remove(&key) {
                    Some(prev) => {
                        inner.reindex(&key, Some(&prev), None);
                        CacheEvent::Delete {
                            key,
                            revision,
                            prev,
                        }
                    }
                    None => {
                        inner.revision = inner.revision.max(revision);
                        self.revision.send_replace(inner.revision);
                        return;
                    }
                }
            }
            WatchEvent::Progress(r) => CacheEvent::Progress(r),
        };
        let event = Arc::new(event);
        inner.revision = inner.revision.max(event.revision());
        if !matches!(*event, CacheEvent::Progress(_)) {
            inner.last_change = event.revision();
        }
        if !matches!(*event, CacheEvent::Progress(_)) {
            let now = Instant::now();
            inner.history.push_back((now, event.clone()));
            let w = self.window;
            while let Some((when, old)) = inner.history.front() {
                let n = inner.history.len();
                if n <= w.min || (n <= w.max && now.duration_since(*when) < w.fresh) {
                    break;
                }
                inner.floor = old.revision();
                inner.history.pop_front();
            }
        }
        self.send(event);
        self.revision.send_replace(inner.revision);
    }

    /// Fans an event out: to every unindexed watcher, and to the watchers of the index
    /// values it touches (all of them for progress and reset). Called under the write lock.
    fn send(&self, event: Arc<CacheEvent>) {
        if self.index.is_some() {
            let mut indexed = self.indexed.lock().unwrap_or_else(|e| e.into_inner());
            // Values whose watchers are all gone are dropped as they come by.
            match event.index_values() {
                [None, None] => indexed.retain(|_, tx| tx.send(event.clone()).is_ok()),
                [a, b] => {
                    for v in [a, b.filter(|b| Some(*b) != a)].into_iter().flatten() {
                        if let Some(tx) = indexed.get(v) {
                            if tx.send(event.clone()).is_err() {
                                indexed.remove(v);
                            }
                        }
                    }
                }
            }
        }
        if let Some(fanout) = self.fanout.get() {
            let _ = fanout.send(event);
        }
    }
}

impl Inner {
    /// The objects whose index value is `value`, under `prefix`, from key `from` on, in
    /// key order.
    fn indexed<'a>(
        &'a self,
        value: &str,
        prefix: &'a str,
        from: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a Arc<Cached>)> + 'a {
        self.by_index
            .get(value)
            .into_iter()
            .flat_map(move |ks| ks.range::<str, _>((Bound::Included(from), Bound::Unbounded)))
            .take_while(move |k| k.starts_with(prefix))
            .filter_map(|k| self.objects.get_key_value(k.as_str()))
    }

    /// Moves `key` in the index from the value of `before` to that of `after`.
    fn reindex(&mut self, key: &str, before: Option<&Cached>, after: Option<&Cached>) {
        let (old, new) = (
            before.and_then(|o| o.index.as_deref()),
            after.and_then(|o| o.index.as_deref()),
        );
        if old == new {
            return;
        }
        if let Some(v) = old {
            if let Some(keys) = self.by_index.get_mut(v) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_index.remove(v);
                }
            }
        }
        if let Some(v) = new {
            self.by_index
                .entry(v.into())
                .or_default()
                .insert(key.to_owned());
        }
    }
}

/// The current entries of a range merged with the state, at an earlier revision, of the
/// keys changed since (which replaces theirs; `None`: the key did not exist then).
struct Merge<'a, C: Iterator<Item = (&'a String, &'a Arc<Cached>)>, U: Iterator> {
    current: std::iter::Peekable<C>,
    undo: std::iter::Peekable<U>,
}

impl<'a, C, U> Merge<'a, C, U>
where
    C: Iterator<Item = (&'a String, &'a Arc<Cached>)>,
    U: Iterator<Item = (&'a String, Option<&'a Arc<Cached>>)>,
{
    fn new(current: C, undo: U) -> Self {
        Merge {
            current: current.peekable(),
            undo: undo.peekable(),
        }
    }
}

impl<'a, C, U> Iterator for Merge<'a, C, U>
where
    C: Iterator<Item = (&'a String, &'a Arc<Cached>)>,
    U: Iterator<Item = (&'a String, Option<&'a Arc<Cached>>)>,
{
    type Item = (&'a String, &'a Arc<Cached>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let order = match (self.current.peek(), self.undo.peek()) {
                (None, None) => return None,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some((c, _)), Some((u, _))) => c.cmp(u),
            };
            match order {
                std::cmp::Ordering::Less => return self.current.next(),
                ord => {
                    if ord == std::cmp::Ordering::Equal {
                        self.current.next();
                    }
                    if let Some((key, Some(before))) = self.undo.next() {
                        return Some((key, before));
                    }
                }
            }
        }
    }
}

/// Entries of `objects` whose key starts with `prefix`.
fn range<'a>(
    objects: &'a BTreeMap<String, Arc<Cached>>,
    prefix: &'a str,
) -> impl Iterator<Item = (&'a String, &'a Arc<Cached>)> + 'a {
    objects
        .range::<str, _>((
            std::ops::Bound::Included(prefix),
            std::ops::Bound::Unbounded,
        ))
        .take_while(move |(k, _)| k.starts_with(prefix))
}

/// Every cache of a server, by storage prefix.
pub struct WatchCaches {
    store: Arc<dyn Store>,
    window: Window,
    caches: Mutex<HashMap<String, Arc<WatchCache>>>,
    runtime: CacheRuntime,
}

/// The thread the caches follow the store on. Every list and watch reads a cache, so a
/// cache that falls behind the store stalls them all, and one that falls a compaction
/// window behind starts over and makes every client list again. On the request runtime,
/// a follower is one task among thousands of connections and watches and, on a
/// saturated machine, fell minutes behind; on its own thread the OS schedules it as a peer
/// of the request workers.
struct CacheRuntime(Option<tokio::runtime::Runtime>);

impl CacheRuntime {
    fn new() -> CacheRuntime {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("watch-cache")
            .enable_all()
            .build();
        match rt {
            Ok(rt) => CacheRuntime(Some(rt)),
            Err(e) => {
                tracing::warn!(error = %e, "watch cache: no thread of its own; following on the request runtime");
                CacheRuntime(None)
            }
        }
    }

    fn spawn<F: std::future::Future<Output = ()> + Send + 'static>(&self, f: F) {
        match &self.0 {
            Some(rt) => {
                rt.spawn(f);
            }
            None => {
                tokio::spawn(f);
            }
        }
    }
}

impl Drop for CacheRuntime {
    fn drop(&mut self) {
        // Dropped from async code (a server shutting down): no blocking wait.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl WatchCaches {
    pub fn new(store: Arc<dyn Store>) -> WatchCaches {
        Self::with_window(store, Window::default())
    }

    /// Caches whose windows keep exactly `history` events.
    pub fn with_history(store: Arc<dyn Store>, history: usize) -> WatchCaches {
        Self::with_window(
            store,
            Window {
                min: history,
                max: history,
                fresh: Duration::ZERO,
            },
        )
    }

    /// Caches whose windows keep what `window` says.
    pub fn with_window(store: Arc<dyn Store>, window: Window) -> WatchCaches {
        WatchCaches {
            store,
            window,
            caches: Mutex::new(HashMap::new()),
            runtime: CacheRuntime::new(),
        }
    }

    /// The cache of `prefix` (`/registry/<resource>/`), started on first use.
    pub fn get(&self, prefix: &str) -> Arc<WatchCache> {
        self.get_indexed(prefix, None)
    }

    /// The cache of `prefix` if one is running (none is started).
    pub fn running(&self, prefix: &str) -> Option<Arc<WatchCache>> {
        let caches = self.caches.lock().unwrap_or_else(|e| e.into_inner());
        caches.get(prefix).cloned()
    }

    /// The cache of `prefix`, indexed by `index` when this call starts it.
    pub fn get_indexed(&self, prefix: &str, index: Option<WatchIndex>) -> Arc<WatchCache> {
        let mut caches = self.caches.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = caches.get(prefix) {
            return c.clone();
        }
        let (progress_tx, mut progress_rx) = mpsc::channel(1);
        let cache = Arc::new(WatchCache {
            prefix: prefix.to_owned(),
            window: self.window,
            inner: RwLock::new(Inner {
                objects: BTreeMap::new(),
                by_index: HashMap::new(),
                revision: 0,
                history: VecDeque::new(),
                floor: 0,
                last_change: 0,
            }),
            fanout: std::sync::OnceLock::new(),
            index,
            indexed: Mutex::new(HashMap::new()),
            revision: watch::channel(0).0,
            progress: progress_tx,
        });
        caches.insert(prefix.to_owned(), cache.clone());
        let store = self.store.clone();
        let weak = Arc::downgrade(&cache);
        self.runtime.spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                let Some(cache) = weak.upgrade() else { return };
                cache.follow(&store, &mut progress_rx).await;
                drop(cache);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        });
        cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kumo_storage::embedded::{EmbeddedConfig, EmbeddedStore};

    async fn store() -> (Arc<dyn Store>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let s: Arc<dyn Store> = EmbeddedStore::open(EmbeddedConfig::new(dir.path().join("s")))
            .await
            .unwrap();
        (s, dir)
    }

    fn obj(name: &str) -> Vec<u8> {
        json!({"metadata": {"name": name}}).to_string().into_bytes()
    }

    #[tokio::test]
    async fn follows_the_store_and_replays_its_window() {
        let (store, _dir) = store().await;
        store.create(b"/registry/x/a", obj("a")).await.unwrap();
        let caches = WatchCaches::new(store.clone());
        let cache = caches.get("/registry/x/");
        let r0 = store.current_revision().await.unwrap();
        assert_eq!(cache.wait_for(r0, Duration::from_secs(5)).await, Some(r0));
        assert_eq!(cache.snapshot("/registry/x/").objects.len(), 1);

        let b = store.create(b"/registry/x/b", obj("b")).await.unwrap();
        store.delete(b"/registry/x/a", None).await.unwrap();
        // A change elsewhere moves the revision; a progress request catches the cache up.
        store.create(b"/registry/y/z", obj("z")).await.unwrap();
        let now = store.current_revision().await.unwrap();
        assert_eq!(cache.wait_for(now, Duration::from_secs(5)).await, Some(now));
        let snap = cache.snapshot("/registry/x/");
        let keys: Vec<&str> = snap.objects.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["/registry/x/b"]);
        assert_eq!(
            snap.objects[0].1.object()["metadata"]["resourceVersion"],
            json!(b.mod_revision.to_string())
        );

        // From r0: the create of b and the delete of a, in order.
        let w = cache.watch("/registry/x/", r0, false, None).unwrap();
        let kinds: Vec<String> = w
            .replay
            .iter()
            .map(|e| match &**e {
                CacheEvent::Put { key, .. } => format!("put {key}"),
                CacheEvent::Delete { key, .. } => format!("delete {key}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(kinds, ["put /registry/x/b", "delete /registry/x/a"]);
        // Before the window: too old (the client lists again); after the cache: ahead.
        assert_eq!(
            cache.watch("/registry/x/", r0 - 1, false, None).err(),
            Some(NoWatch::TooOld { oldest: r0 })
        );
        assert_eq!(
            cache.watch("/registry/x/", now + 10, false, None).err(),
            Some(NoWatch::Ahead { current: now })
        );

        // Live events follow.
        let mut live = cache.watch("/registry/x/", now, false, None).unwrap().live;
        store.create(b"/registry/x/c", obj("c")).await.unwrap();
        let ev = tokio::time::timeout(Duration::from_secs(5), live.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ev.key(), Some("/registry/x/c"));
    }

    #[test]
    fn cached_objects_splice_back_whole() {
        let stored = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","labels":{"x":"1"}},"data":{"k":"v"}}"#;
        let c = Cached::from_stored(stored, 7, None).unwrap();
        assert_eq!(
            std::str::from_utf8(&c.item).unwrap(),
            r#"{"data":{"k":"v"},"metadata":{"labels":{"x":"1"},"name":"a","resourceVersion":"7"}}"#
        );
        assert_eq!(c.labels["x"], "1");
        assert_eq!(
            c.object(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"},
                   "metadata": {"labels": {"x": "1"}, "name": "a", "resourceVersion": "7"}})
        );
        // An object with nothing but kind and apiVersion.
        let bare = Cached::from_stored(br#"{"apiVersion":"v1","kind":"X"}"#, 1, None).unwrap();
        assert_eq!(bare.object(), json!({"apiVersion": "v1", "kind": "X"}));
    }

    #[tokio::test]
    async fn window_is_bounded() {
        let (store, _dir) = store().await;
        let caches = WatchCaches::with_history(store.clone(), 3);
        let cache = caches.get("/registry/x/");
        let r0 = store.current_revision().await.unwrap();
        cache.wait_for(r0, Duration::from_secs(5)).await.unwrap();
        let mut revs = Vec::new();
        for i in 0..5 {
            let kv = store
                .create(format!("/registry/x/{i}").as_bytes(), obj("o"))
                .await
                .unwrap();
            revs.push(kv.mod_revision);
        }
        let last = *revs.last().unwrap();
        cache.wait_for(last, Duration::from_secs(5)).await.unwrap();
        // The window holds the last three creates: from the revision of the second one on.
        assert!(matches!(
            cache.watch("/registry/x/", revs[0], false, None),
            Err(NoWatch::TooOld { .. })
        ));
        let w = cache.watch("/registry/x/", revs[1], false, None).unwrap();
        assert_eq!(w.replay.len(), 3);
        assert_eq!(w.revision, last);
        // A namespace-like sub-prefix sees only its keys.
        let w = cache.watch("/registry/x/4", revs[1], false, None).unwrap();
        assert_eq!(w.replay.len(), 1);
        // Ahead of the cache: refused with where the cache stands.
        assert_eq!(
            cache.watch("/registry/x/", last + 100, false, None).err(),
            Some(NoWatch::Ahead { current: last })
        );
        // A list continued at the current revision is served from memory, from its key on;
        // at a revision before the window, with changes since, it is not.
        let page = cache.page(&query("/registry/x/3", Some(last), 0)).unwrap();
        assert_eq!(keys(&page), ["/registry/x/3", "/registry/x/4"]);
        assert_eq!(page.revision, last);
        assert!(cache.page(&query("", Some(revs[0]), 0)).is_none());
    }

    fn query(start: &str, at: Option<Revision>, limit: usize) -> PageQuery<'_> {
        PageQuery {
            key_prefix: "/registry/x/",
            start: Some(start),
            at,
            by: None,
            keep: &|_| true,
            limit,
            count_rest: true,
        }
    }

    fn keys(page: &Page) -> Vec<&str> {
        page.objects.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[tokio::test]
    async fn continued_pages_read_their_revision_across_changes() {
        let (store, _dir) = store().await;
        for k in ["a", "b", "c", "d"] {
            store
                .create(format!("/registry/x/{k}").as_bytes(), obj(k))
                .await
                .unwrap();
        }
        let caches = WatchCaches::new(store.clone());
        let cache = caches.get("/registry/x/");
        let r0 = store.current_revision().await.unwrap();
        cache.wait_for(r0, Duration::from_secs(5)).await.unwrap();
        let first = cache.page(&query("", None, 2)).unwrap();
        assert_eq!(keys(&first), ["/registry/x/a", "/registry/x/b"]);
        assert!(first.more);
        assert_eq!(first.rest, Some(2));
        let at = first.revision;

        // After the first page: c is updated twice, d deleted, e and bb created.
        store
            .update(b"/registry/x/c", obj("c2"), None)
            .await
            .unwrap();
        store
            .update(b"/registry/x/c", obj("c3"), None)
            .await
            .unwrap();
        store.delete(b"/registry/x/d", None).await.unwrap();
        store.create(b"/registry/x/bb", obj("bb")).await.unwrap();
        store.create(b"/registry/x/e", obj("e")).await.unwrap();
        let now = store.current_revision().await.unwrap();
        cache.wait_for(now, Duration::from_secs(5)).await.unwrap();

        // The next page still reads the list's revision: c as it was, d, no bb or e.
        let next = cache.page(&query("/registry/x/b\0", Some(at), 0)).unwrap();
        assert_eq!(keys(&next), ["/registry/x/c", "/registry/x/d"]);
        assert_eq!(next.objects[0].1.object()["metadata"]["name"], json!("c"));
        assert_eq!(next.revision, at);
        assert!(!next.more);
        // The current state has all of it.
        let current = cache.page(&query("/registry/x/b\0", None, 0)).unwrap();
        assert_eq!(
            keys(&current),
            ["/registry/x/bb", "/registry/x/c", "/registry/x/e"]
        );
        assert_eq!(
            current.objects[1].1.object()["metadata"]["name"],
            json!("c3")
        );
    }

    fn pod(name: &str, node: &str) -> Vec<u8> {
        json!({"metadata": {"name": name}, "spec": {"nodeName": node}})
            .to_string()
            .into_bytes()
    }

    const BY_NODE: WatchIndex = WatchIndex {
        field: "spec.nodeName",
        value: |o| {
            o.pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        },
    };

    /// The events received so far on `live` (progress only if `progress`).
    fn drain(live: &mut broadcast::Receiver<Arc<CacheEvent>>, progress: bool) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(e) = live.try_recv() {
            match &*e {
                CacheEvent::Put { key, .. } => out.push(format!("put {key}")),
                CacheEvent::Delete { key, .. } => out.push(format!("delete {key}")),
                CacheEvent::Progress(_) if progress => out.push("progress".into()),
                CacheEvent::Progress(_) => {}
                CacheEvent::Reset => out.push("reset".into()),
            }
        }
        out
    }

    #[tokio::test]
    async fn indexed_watchers_get_their_value_only() {
        let (store, _dir) = store().await;
        store
            .create(b"/registry/pods/a", pod("a", "n1"))
            .await
            .unwrap();
        store
            .create(b"/registry/pods/b", pod("b", "n2"))
            .await
            .unwrap();
        let caches = WatchCaches::new(store.clone());
        let cache = caches.get_indexed("/registry/pods/", Some(BY_NODE));
        let r0 = store.current_revision().await.unwrap();
        assert!(cache.wait_for(r0, Duration::from_secs(5)).await.is_some());

        // The initial state of an indexed watcher holds its value's objects only.
        let w1 = cache.watch("/registry/pods/", 0, true, Some("n1")).unwrap();
        let initial: Vec<String> = w1
            .initial
            .unwrap()
            .objects
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(initial, ["/registry/pods/a"]);
        let on = |node, limit| PageQuery {
            key_prefix: "/registry/pods/",
            start: None,
            at: None,
            by: Some(node),
            keep: &|_| true,
            limit,
            count_rest: false,
        };
        let page = cache.page(&on("n2", 0)).unwrap();
        assert_eq!(keys(&page), ["/registry/pods/b"]);
        let mut n1 = w1.live;
        let mut n2 = cache
            .watch("/registry/pods/", r0, false, Some("n2"))
            .unwrap()
            .live;
        let mut all = cache
            .watch("/registry/pods/", r0, false, None)
            .unwrap()
            .live;

        // c lands on n2, then a moves from n1 to n2 (n1 hears of it: it stops matching),
        // then b is deleted.
        store
            .create(b"/registry/pods/c", pod("c", "n2"))
            .await
            .unwrap();
        store
            .update(b"/registry/pods/a", pod("a", "n2"), None)
            .await
            .unwrap();
        store.delete(b"/registry/pods/b", None).await.unwrap();
        let now = store.current_revision().await.unwrap();
        assert!(cache.wait_for(now, Duration::from_secs(5)).await.is_some());

        assert_eq!(drain(&mut n1, false), ["put /registry/pods/a"]);
        assert_eq!(
            drain(&mut n2, false),
            [
                "put /registry/pods/c",
                "put /registry/pods/a",
                "delete /registry/pods/b"
            ]
        );
        assert_eq!(drain(&mut all, false).len(), 3);

        // A watch resumed from r0 replays what touched its value only.
        let replay: Vec<String> = cache
            .watch("/registry/pods/", r0, false, Some("n1"))
            .unwrap()
            .replay
            .iter()
            .filter_map(|e| e.key().map(str::to_owned))
            .collect();
        assert_eq!(replay, ["/registry/pods/a"]);
        // Lists by value read the index, which followed the move.
        let page = cache.page(&on("n2", 1)).unwrap();
        assert_eq!(keys(&page), ["/registry/pods/a"]);
        assert!(page.more);
        assert!(cache.page(&on("n1", 0)).unwrap().objects.is_empty());
        assert!(!cache.inner.read().unwrap().by_index.contains_key("n1"));

        // Progress reaches every indexed watcher (their bookmarks keep them current).
        store.create(b"/registry/other/z", obj("z")).await.unwrap();
        let later = store.current_revision().await.unwrap();
        assert!(cache
            .wait_for(later, Duration::from_secs(5))
            .await
            .is_some());
        assert!(drain(&mut n1, true).contains(&"progress".to_owned()));
        assert!(drain(&mut n2, true).contains(&"progress".to_owned()));

        // A value whose watchers are gone loses its fan-out.
        drop(n1);
        store
            .create(b"/registry/pods/d", pod("d", "n1"))
            .await
            .unwrap();
        let last = store.current_revision().await.unwrap();
        assert!(cache.wait_for(last, Duration::from_secs(5)).await.is_some());
        let values = cache.indexed.lock().unwrap().len();
        assert_eq!(values, 1, "only n2's fan-out is left");
    }
}
