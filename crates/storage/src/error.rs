//! Storage errors. Each variant maps onto one API server answer (409, 404, 410, 413, 500).

use crate::{KeyValue, Revision};

/// Result alias for this crate.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// What can go wrong talking to a store.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// `create` of a key that exists.
    #[error("key already exists")]
    AlreadyExists { current: Box<KeyValue> },
    /// `update`/`delete` of a key that does not exist.
    #[error("key not found")]
    NotFound,
    /// The mod_revision precondition did not hold; `current` is the key's present value.
    #[error("mod_revision precondition failed: expected {expected}, current {}", .current.mod_revision)]
    Conflict {
        expected: Revision,
        current: Box<KeyValue>,
    },
    /// The requested revision has been compacted away (the API server answers 410 Gone).
    #[error("required revision {requested} has been compacted (compacted revision {compacted})")]
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    /// The requested revision is newer than the store's current revision.
    #[error("required revision {requested} is a future revision (current revision {current})")]
    FutureRevision {
        requested: Revision,
        current: Revision,
    },
    #[error("key is empty")]
    EmptyKey,
    #[error("key of {size} bytes exceeds the limit of {limit} bytes")]
    KeyTooLarge { size: usize, limit: usize },
    #[error("value of {size} bytes exceeds the limit of {limit} bytes")]
    ValueTooLarge { size: usize, limit: usize },
    /// A range start key outside the range's prefix.
    #[error("invalid range: {0}")]
    InvalidRange(String),
    /// The store was closed (or its writer stopped after an I/O failure).
    #[error("store is closed")]
    Closed,
    /// The embedded database failed.
    #[error("embedded database: {0}")]
    Database(String),
    /// The on-disk data could not be decoded.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// etcd answered with an error or could not be reached.
    #[error("etcd: {0}")]
    Etcd(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl StorageError {
    /// Whether this error is [`StorageError::Compacted`].
    pub fn is_compacted(&self) -> bool {
        matches!(self, StorageError::Compacted { .. })
    }
}
