//! An in-memory copy of every object under one storage prefix, decoded, kept current by
//! a store watch: what the authorizers and admission plugins read on every request
//! (RBAC objects, webhook configurations) without going to the store.
//!
//! It is eventually consistent, as upstream's informers are: a write is visible to the
//! next request once its watch event arrived (normally within a millisecond).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use kumo_storage::{RangeRequest, Revision, StorageError, Store, WatchEvent};
use serde_json::Value;

/// The objects under a prefix, by storage key.
pub struct Mirror {
    prefix: String,
    objects: RwLock<BTreeMap<String, Value>>,
    /// Bumped on every change, so readers can cache what they derive from the objects.
    generation: AtomicU64,
}

impl Mirror {
    /// Reads every object under `prefix` and keeps following it in a background task.
    pub async fn start(store: Arc<dyn Store>, prefix: &str) -> Result<Arc<Mirror>, StorageError> {
        let mirror = Arc::new(Mirror {
            prefix: prefix.to_owned(),
            objects: RwLock::new(BTreeMap::new()),
            generation: AtomicU64::new(1),
        });
        let rev = mirror.reload(&*store).await?;
        tokio::spawn(Arc::clone(&mirror).follow(store, rev));
        Ok(mirror)
    }

    // A panic while holding the lock cannot leave the map half-changed (each change is
    // one insert or remove), so a poisoned lock is still usable.
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<String, Value>> {
        self.objects.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<String, Value>> {
        self.objects.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The change counter: differs whenever the objects may have changed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Calls `f` with the objects, by storage key.
    pub fn with<R>(&self, f: impl FnOnce(&BTreeMap<String, Value>) -> R) -> R {
        f(&self.read())
    }

    /// One object by storage key.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.read().get(key).cloned()
    }

    async fn reload(&self, store: &dyn Store) -> Result<Revision, StorageError> {
        let page = store
            .range(RangeRequest {
                prefix: self.prefix.clone().into_bytes(),
                start: None,
                limit: 0,
                revision: None,
            })
            .await?;
        let objects = page
            .kvs
            .iter()
            .filter_map(|kv| {
                let key = String::from_utf8(kv.key.clone()).ok()?;
                let obj = serde_json::from_slice(&kv.value).ok()?;
                Some((key, obj))
            })
            .collect();
        *self.write() = objects;
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(page.revision)
    }

    async fn follow(self: Arc<Self>, store: Arc<dyn Store>, mut rev: Revision) {
        loop {
            match store.watch(self.prefix.as_bytes(), rev + 1).await {
                Ok(mut events) => {
                    while let Some(ev) = events.next().await {
                        let Ok(ev) = ev else { break };
                        rev = rev.max(ev.revision());
                        self.apply(ev);
                    }
                }
                Err(e) => tracing::warn!(prefix = %self.prefix, error = %e, "mirror watch failed"),
            }
            // The watch ended (compaction, a lost connection): read everything again.
            tokio::time::sleep(Duration::from_millis(100)).await;
            match self.reload(&*store).await {
                Ok(r) => rev = r,
                Err(e) => tracing::warn!(prefix = %self.prefix, error = %e, "mirror reload failed"),
            }
        }
    }

    fn apply(&self, ev: WatchEvent) {
        match ev {
            WatchEvent::Put { kv, .. } => {
                let (Ok(key), Ok(obj)) = (
                    String::from_utf8(kv.key),
                    serde_json::from_slice::<Value>(&kv.value),
                ) else {
                    return;
                };
                self.write().insert(key, obj);
            }
            WatchEvent::Delete { key, .. } => {
                if let Ok(key) = String::from_utf8(key) {
                    self.write().remove(&key);
                }
            }
            _ => return,
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}
