//! kumo's state store: a key-value store with etcd v3 semantics.
//!
//! Every write bumps one global revision; each key carries `create_revision`,
//! `mod_revision` and `version`; reads can be made at any revision that has not been
//! compacted away; watches deliver every change after a revision, in order, with the
//! previous value. Two backends implement [`Store`]:
//!
//! * [`embedded::EmbeddedStore`] — the default: one directory, redb underneath, group
//!   commit, in-process watch fan-out.
//! * [`etcd::EtcdStore`] — a real etcd cluster over its v3 gRPC API, so that several API
//!   servers can share state.
//!
//! Only the API server uses this crate (see ARCHITECTURE.md).

pub mod compactor;
pub mod embedded;
pub mod error;
pub mod etcd;
mod watch;

use std::time::Duration;

pub use error::{Result, StorageError};
pub use watch::{WatchEvent, WatchStream};

/// A store revision. Like etcd, revisions start at 1 and only ever grow.
pub type Revision = i64;

/// One key at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// Revision of the write that created this key (after its last deletion).
    pub create_revision: Revision,
    /// Revision of the write that produced this value.
    pub mod_revision: Revision,
    /// Number of writes to the key since it was created, starting at 1.
    pub version: i64,
}

/// A read of a key range at one consistent revision.
#[derive(Clone, Debug, Default)]
pub struct RangeRequest {
    /// Every key that starts with this prefix is in the range.
    pub prefix: Vec<u8>,
    /// Start at this key (inclusive) instead of the first key of the prefix: pagination.
    /// Must itself start with `prefix`.
    pub start: Option<Vec<u8>>,
    /// At most this many keys; 0 means no limit.
    pub limit: usize,
    /// Read at this revision; `None` reads at the current revision.
    pub revision: Option<Revision>,
}

/// The answer to a [`RangeRequest`].
#[derive(Clone, Debug, Default)]
pub struct RangeResponse {
    /// Keys in ascending byte order.
    pub kvs: Vec<KeyValue>,
    /// Number of keys in `[start, end of prefix)` at the read revision, ignoring `limit`.
    pub count: usize,
    /// Whether keys beyond `kvs` remain in the range.
    pub more: bool,
    /// The revision the read was made at.
    pub revision: Revision,
}

/// Size limits enforced identically by both backends, before anything is written.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest value accepted (etcd's default request limit is 1.5 MiB).
    pub max_value_bytes: usize,
    /// Largest key accepted.
    pub max_key_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_value_bytes: 1024 * 1024 * 3 / 2,
            max_key_bytes: 8 * 1024,
        }
    }
}

impl Limits {
    /// Checks a key and an optional value against the limits.
    pub fn check(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        if key.is_empty() {
            return Err(StorageError::EmptyKey);
        }
        if key.len() > self.max_key_bytes {
            return Err(StorageError::KeyTooLarge {
                size: key.len(),
                limit: self.max_key_bytes,
            });
        }
        if let Some(v) = value {
            if v.len() > self.max_value_bytes {
                return Err(StorageError::ValueTooLarge {
                    size: v.len(),
                    limit: self.max_value_bytes,
                });
            }
        }
        Ok(())
    }
}

/// Automatic compaction settings shared by both backends.
#[derive(Clone, Copy, Debug)]
pub struct CompactionConfig {
    /// Revisions older than this are dropped. `Duration::ZERO` disables automatic compaction.
    pub window: Duration,
    /// Most revisions removed per write batch, so compaction never stalls writers for long.
    pub batch: usize,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            window: Duration::from_secs(5 * 60),
            batch: 1000,
        }
    }
}

/// The first key after every key that starts with `prefix` (etcd's "range end" for a
/// prefix); `None` when no such key exists (prefix empty or all 0xff).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The storage interface the API server is written against.
///
/// Conditional writes take the `mod_revision` the caller last saw; a mismatch fails with
/// [`StorageError::Conflict`] carrying the current value, so the caller can answer
/// 409 Conflict or retry on fresh data.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Reads one key, at the current revision or at `revision`.
    /// Returns the value (if the key exists there) and the revision read at.
    async fn get(
        &self,
        key: &[u8],
        revision: Option<Revision>,
    ) -> Result<(Option<KeyValue>, Revision)>;

    /// Reads a range of keys at one consistent revision.
    async fn range(&self, req: RangeRequest) -> Result<RangeResponse>;

    /// Creates a key that must not exist; fails with [`StorageError::AlreadyExists`].
    async fn create(&self, key: &[u8], value: Vec<u8>) -> Result<KeyValue>;

    /// Replaces the value of an existing key. With `expected_mod_revision`, only if the key's
    /// current `mod_revision` is that one. Returns the new key-value (its `mod_revision` is
    /// the write's revision).
    async fn update(
        &self,
        key: &[u8],
        value: Vec<u8>,
        expected_mod_revision: Option<Revision>,
    ) -> Result<KeyValue>;

    /// Deletes an existing key, optionally guarded like [`Store::update`]. Returns the value
    /// deleted and the revision of the deletion.
    async fn delete(
        &self,
        key: &[u8],
        expected_mod_revision: Option<Revision>,
    ) -> Result<(KeyValue, Revision)>;

    /// Watches every key under `prefix` for changes with a revision greater than
    /// `from_revision` (0 means: from now on). Fails with [`StorageError::Compacted`] when
    /// events after `from_revision` are no longer kept.
    async fn watch(&self, prefix: &[u8], from_revision: Revision) -> Result<WatchStream>;

    /// The current (latest committed) revision.
    async fn current_revision(&self) -> Result<Revision>;

    /// Drops history older than `revision`: reads below it then fail with
    /// [`StorageError::Compacted`]. Compacting to an already compacted revision is a no-op.
    async fn compact(&self, revision: Revision) -> Result<()>;

    /// The newest revision this store knows to be compacted (0: none), without a round
    /// trip: caches in front of the store must not serve reads below it either.
    fn known_compacted(&self) -> Revision;
}
