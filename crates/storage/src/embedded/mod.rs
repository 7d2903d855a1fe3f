//! The embedded backend: one directory, redb underneath.
//!
//! Layout follows etcd's: the database maps each revision to the key-value record written
//! at that revision (a put or a tombstone), and an in-memory index maps each key to the
//! revisions of it still kept. Reads consult the index, then fetch values by revision.
//!
//! Writes go through a single writer thread that drains every request waiting in its queue
//! into one redb transaction and one fsync (group commit), then updates the index and
//! publishes the batch's events to the in-process watch fan-out. A request is answered only
//! after its transaction is durable.
//!
//! Compaction is logical first (reads below the compacted revision fail at once), then
//! physical: the writer deletes superseded records a few hundred revisions at a time between
//! write batches, so it never stalls writers; redb reuses the freed pages.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;

mod wal;

use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::{
    prefix_end, CompactionConfig, KeyValue, Limits, RangeRequest, RangeResponse, Result, Revision,
    StorageError, Store, WatchEvent, WatchStream,
};

/// revision → encoded record (see [`Record`]).
const KV: TableDefinition<u64, &[u8]> = TableDefinition::new("kv");
/// Bookkeeping: "revision" (last written), "compacted", "compacted_physical".
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

const META_REVISION: &str = "revision";
const META_COMPACTED: &str = "compacted";
const META_PHYSICAL: &str = "compacted_physical";
/// Incremented by every checkpoint; write-ahead log entries of other epochs are stale.
const META_EPOCH: &str = "wal_epoch";

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "kumo.redb";
/// File name of the write-ahead log inside the data directory.
pub const WAL_FILE: &str = "kumo.wal";

/// Settings of an [`EmbeddedStore`].
#[derive(Clone, Debug)]
pub struct EmbeddedConfig {
    /// Data directory; created if missing.
    pub dir: PathBuf,
    pub limits: Limits,
    pub compaction: CompactionConfig,
    /// redb page cache size.
    pub cache_bytes: usize,
    /// Most requests committed together in one transaction.
    pub max_batch: usize,
    /// Capacity of the in-process event fan-out, in write batches. A watcher that falls
    /// further behind catches up from disk.
    pub fanout_capacity: usize,
    /// Size of the write-ahead log file. A checkpoint empties it when half full; at least
    /// eight of the largest writes always fit.
    pub wal_bytes: u64,
    /// Longest time between checkpoints while there are writes.
    pub checkpoint_interval: Duration,
}

impl EmbeddedConfig {
    /// Defaults for a data directory.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        EmbeddedConfig {
            dir: dir.into(),
            limits: Limits::default(),
            compaction: CompactionConfig::default(),
            cache_bytes: 64 * 1024 * 1024,
            max_batch: 512,
            // A batch is a few writes: at thousands of writes a second, 1024 batches were a
            // second or two of slack before a busy watcher fell back to reading from disk.
            fanout_capacity: 8192,
            wal_bytes: 64 * 1024 * 1024,
            checkpoint_interval: Duration::from_secs(5),
        }
    }
}

/// One stored revision of a key, as encoded on disk:
/// `kind u8 | create_revision i64 | version i64 | key_len u32 | key | value`.
struct Record<'a> {
    tombstone: bool,
    create_revision: Revision,
    version: i64,
    key: &'a [u8],
    value: &'a [u8],
}

const KIND_PUT: u8 = 1;
const KIND_TOMBSTONE: u8 = 2;
const HEADER: usize = 1 + 8 + 8 + 4;

impl<'a> Record<'a> {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.key.len() + self.value.len());
        out.push(if self.tombstone {
            KIND_TOMBSTONE
        } else {
            KIND_PUT
        });
        out.extend_from_slice(&self.create_revision.to_be_bytes());
        out.extend_from_slice(&self.version.to_be_bytes());
        // Keys are bounded by Limits (far below 4 GiB); the cast cannot truncate.
        out.extend_from_slice(&(self.key.len() as u32).to_be_bytes());
        out.extend_from_slice(self.key);
        out.extend_from_slice(self.value);
        out
    }

    fn decode(rev: u64, buf: &'a [u8]) -> Result<Self> {
        let corrupt = || StorageError::Corrupt(format!("record at revision {rev}"));
        if buf.len() < HEADER {
            return Err(corrupt());
        }
        let tombstone = match buf[0] {
            KIND_PUT => false,
            KIND_TOMBSTONE => true,
            _ => return Err(corrupt()),
        };
        let num = |r: std::ops::Range<usize>| -> Result<i64> {
            let b: [u8; 8] = buf[r].try_into().map_err(|_| corrupt())?;
            Ok(i64::from_be_bytes(b))
        };
        let create_revision = num(1..9)?;
        let version = num(9..17)?;
        let klen_b: [u8; 4] = buf[17..21].try_into().map_err(|_| corrupt())?;
        let klen = u32::from_be_bytes(klen_b) as usize;
        if buf.len() < HEADER + klen {
            return Err(corrupt());
        }
        Ok(Record {
            tombstone,
            create_revision,
            version,
            key: &buf[HEADER..HEADER + klen],
            value: &buf[HEADER + klen..],
        })
    }

    fn to_kv(&self, mod_revision: Revision) -> KeyValue {
        KeyValue {
            key: self.key.to_vec(),
            value: self.value.to_vec(),
            create_revision: self.create_revision,
            mod_revision,
            version: self.version,
        }
    }
}

/// One kept revision of a key in the index.
#[derive(Clone, Copy, Debug)]
struct Rev {
    rev: Revision,
    create: Revision,
    version: i64,
    tombstone: bool,
}

/// The in-memory index: key → its kept revisions (ascending).
#[derive(Default)]
struct Index {
    keys: BTreeMap<Vec<u8>, Vec<Rev>>,
    current: Revision,
    compacted: Revision,
}

impl Index {
    /// The key's revision visible at `at`, if it is live there.
    fn visible(&self, key: &[u8], at: Revision) -> Option<Rev> {
        visible_in(self.keys.get(key)?, at)
    }

    /// The key's latest revision if the key currently exists.
    fn latest(&self, key: &[u8]) -> Option<Rev> {
        self.keys
            .get(key)
            .and_then(|revs| revs.last().copied())
            .filter(|r| !r.tombstone)
    }

    fn check_read_revision(&self, requested: Option<Revision>) -> Result<Revision> {
        match requested {
            None | Some(0) => Ok(self.current),
            Some(r) if r < self.compacted => Err(StorageError::Compacted {
                requested: r,
                compacted: self.compacted,
            }),
            Some(r) if r > self.current => Err(StorageError::FutureRevision {
                requested: r,
                current: self.current,
            }),
            Some(r) => Ok(r),
        }
    }
}

fn visible_in(revs: &[Rev], at: Revision) -> Option<Rev> {
    let idx = revs.partition_point(|r| r.rev <= at);
    let r = *revs.get(idx.checked_sub(1)?)?;
    (!r.tombstone).then_some(r)
}

/// Events of one committed write batch, shared by every watcher.
struct Batch {
    /// The last revision of the batch.
    revision: Revision,
    events: Vec<WatchEvent>,
}

struct Shared {
    db: Database,
    index: RwLock<Index>,
    fanout: broadcast::Sender<Arc<Batch>>,
    limits: Limits,
}

enum Op {
    Create {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Update {
        key: Vec<u8>,
        value: Vec<u8>,
        expected: Option<Revision>,
    },
    Delete {
        key: Vec<u8>,
        expected: Option<Revision>,
    },
    Compact {
        revision: Revision,
    },
}

enum Outcome {
    Put(KeyValue),
    Deleted(KeyValue, Revision),
    Compacted,
}

struct Request {
    op: Op,
    reply: oneshot::Sender<Result<Outcome>>,
}

/// The embedded store. Cheap to share behind an `Arc`; dropping the last handle stops the
/// writer after it has committed what it was given.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    writer: Mutex<Option<std_mpsc::Sender<Request>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    dir: PathBuf,
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `cfg.dir`, rebuilds the index from disk, and starts
    /// the writer thread and, when a window is set, the compactor (on the current tokio
    /// runtime).
    pub async fn open(cfg: EmbeddedConfig) -> Result<Arc<EmbeddedStore>> {
        let compaction = cfg.compaction;
        let store = tokio::task::spawn_blocking(move || Self::open_blocking(cfg))
            .await
            .map_err(|e| StorageError::Database(format!("open task failed: {e}")))??;
        let store = Arc::new(store);
        crate::compactor::spawn(Arc::downgrade(&store), compaction);
        Ok(store)
    }

    fn open_blocking(cfg: EmbeddedConfig) -> Result<EmbeddedStore> {
        std::fs::create_dir_all(&cfg.dir)?;
        let path = cfg.dir.join(DB_FILE);
        let db = Database::builder()
            .set_cache_size(cfg.cache_bytes)
            .create(&path)
            .map_err(db_err)?;
        // Make sure both tables exist so read transactions can open them.
        let txn = db.begin_write().map_err(db_err)?;
        {
            txn.open_table(KV).map_err(db_err)?;
            txn.open_table(META).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;

        let limits = cfg.limits;
        let min_wal = 8 * (limits.max_value_bytes + limits.max_key_bytes + 64) as u64;
        let (mut wal, entries) =
            wal::Wal::open(&cfg.dir.join(WAL_FILE), cfg.wal_bytes.max(min_wal))?;
        let epoch = replay(&db, entries)?;
        // Start the new epoch with an empty log: what was replayed is durable in the database.
        let epoch = checkpoint(&db, epoch)?;
        wal.reset();

        let (index, physical) = load_index(&db)?;
        tracing::info!(
            dir = %cfg.dir.display(),
            revision = index.current,
            compacted = index.compacted,
            keys = index.keys.len(),
            "embedded store opened"
        );
        let (fanout, _) = broadcast::channel(cfg.fanout_capacity.max(16));
        let shared = Arc::new(Shared {
            db,
            index: RwLock::new(index),
            fanout,
            limits: cfg.limits,
        });
        let (tx, rx) = std_mpsc::channel();
        let writer = Writer {
            shared: shared.clone(),
            rx,
            max_batch: cfg.max_batch.max(1),
            compaction_batch: cfg.compaction.batch.max(1),
            physical,
            max_batch_bytes: (wal.capacity() / 8) as usize,
            wal,
            epoch,
            last_checkpoint: Instant::now(),
            checkpoint_interval: cfg.checkpoint_interval,
            failed: None,
        };
        let thread = std::thread::Builder::new()
            .name("kumo-storage-writer".into())
            .spawn(move || writer.run())?;
        Ok(EmbeddedStore {
            shared,
            writer: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            dir: cfg.dir,
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The revision up to which history is kept (reads below it fail).
    pub fn compacted_revision(&self) -> Revision {
        self.shared.index.read().compacted
    }

    /// Stops the writer after it commits everything already queued, and waits for it.
    pub fn close(&self) {
        self.writer.lock().take();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }

    async fn submit(&self, op: Op) -> Result<Outcome> {
        let (reply, rx) = oneshot::channel();
        {
            let guard = self.writer.lock();
            let tx = guard.as_ref().ok_or(StorageError::Closed)?;
            tx.send(Request { op, reply })
                .map_err(|_| StorageError::Closed)?;
        }
        rx.await.map_err(|_| StorageError::Closed)?
    }

    /// Reads the values of the given (key, revision) pairs in one read transaction.
    fn fetch(&self, txn: &redb::ReadTransaction, revs: &[Revision]) -> Result<Vec<KeyValue>> {
        let table = txn.open_table(KV).map_err(db_err)?;
        let mut out = Vec::with_capacity(revs.len());
        for &rev in revs {
            let urev = rev as u64;
            let guard = table
                .get(urev)
                .map_err(db_err)?
                .ok_or_else(|| StorageError::Corrupt(format!("revision {rev} is missing")))?;
            out.push(Record::decode(urev, guard.value())?.to_kv(rev));
        }
        Ok(out)
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.close();
    }
}

fn db_err(e: impl std::fmt::Display) -> StorageError {
    StorageError::Database(e.to_string())
}

/// Applies the write-ahead log entries that are newer than the database's last checkpoint.
/// Returns the database's epoch.
fn replay(db: &Database, entries: Vec<wal::Entry>) -> Result<u64> {
    let txn = db.begin_write().map_err(db_err)?;
    let epoch;
    let mut applied = 0usize;
    {
        let mut meta = txn.open_table(META).map_err(db_err)?;
        let get = |meta: &redb::Table<&str, u64>, name: &str| -> Result<u64> {
            Ok(meta
                .get(name)
                .map_err(db_err)?
                .map(|g| g.value())
                .unwrap_or(0))
        };
        epoch = get(&meta, META_EPOCH)?;
        let mut current = (get(&meta, META_REVISION)? as Revision).max(1);
        let mut compacted = get(&meta, META_COMPACTED)? as Revision;
        let mut kv = txn.open_table(KV).map_err(db_err)?;
        for entry in entries {
            // Entries of another epoch, or not continuing from where the database is, were
            // written before the last checkpoint (or never completed): replay ends there.
            if entry.epoch != epoch || entry.base_revision != current {
                break;
            }
            for (rev, rec) in &entry.records {
                if *rev != current + 1 {
                    return Err(StorageError::Corrupt(format!(
                        "write-ahead log skips from revision {current} to {rev}"
                    )));
                }
                Record::decode(*rev as u64, rec)?;
                kv.insert(*rev as u64, rec.as_slice()).map_err(db_err)?;
                current = *rev;
            }
            compacted = compacted.max(entry.compacted);
            applied += 1;
        }
        meta.insert(META_REVISION, current as u64).map_err(db_err)?;
        meta.insert(META_COMPACTED, compacted as u64)
            .map_err(db_err)?;
    }
    txn.commit().map_err(db_err)?;
    if applied > 0 {
        tracing::info!(entries = applied, "replayed the write-ahead log");
    }
    Ok(epoch)
}

/// Makes every commit so far durable in the database and starts a new log epoch.
fn checkpoint(db: &Database, epoch: u64) -> Result<u64> {
    let txn = db.begin_write().map_err(db_err)?;
    {
        let mut meta = txn.open_table(META).map_err(db_err)?;
        meta.insert(META_EPOCH, epoch + 1).map_err(db_err)?;
    }
    txn.commit().map_err(db_err)?;
    Ok(epoch + 1)
}

/// Rebuilds the index from the KV table; returns it with the physical-compaction cursor.
fn load_index(db: &Database) -> Result<(Index, Revision)> {
    let txn = db.begin_read().map_err(db_err)?;
    let meta = txn.open_table(META).map_err(db_err)?;
    let get_meta = |name: &str| -> Result<Revision> {
        Ok(meta
            .get(name)
            .map_err(db_err)?
            .map(|g| g.value() as Revision)
            .unwrap_or(0))
    };
    let mut index = Index {
        // Like etcd, an empty store is at revision 1, so the first write is revision 2 and
        // revision 0 never names a state (watch and read use it to mean "now").
        current: get_meta(META_REVISION)?.max(1),
        compacted: get_meta(META_COMPACTED)?,
        ..Index::default()
    };
    let physical = get_meta(META_PHYSICAL)?;
    let kv = txn.open_table(KV).map_err(db_err)?;
    for item in kv.iter().map_err(db_err)? {
        let (k, v) = item.map_err(db_err)?;
        let rev = k.value();
        let rec = Record::decode(rev, v.value())?;
        let rev = rev as Revision;
        index.current = index.current.max(rev);
        index.keys.entry(rec.key.to_vec()).or_default().push(Rev {
            rev,
            create: rec.create_revision,
            version: rec.version,
            tombstone: rec.tombstone,
        });
    }
    Ok((index, physical))
}

/// The writer thread's state.
struct Writer {
    shared: Arc<Shared>,
    rx: std_mpsc::Receiver<Request>,
    max_batch: usize,
    compaction_batch: usize,
    /// Records at or below this revision have been physically compacted.
    physical: Revision,
    /// Upper bound of the bytes one batch may log (requests are taken until it is reached;
    /// a single request always fits).
    max_batch_bytes: usize,
    wal: wal::Wal,
    epoch: u64,
    last_checkpoint: Instant,
    checkpoint_interval: Duration,
    /// Set when the log or the database failed mid-commit: state on disk is then only
    /// known after a restart (which replays the log), so every further write is refused.
    failed: Option<String>,
}

/// What one batch has written so far, on top of the index.
#[derive(Default)]
struct BatchWrites {
    /// The last revision written (the store's revision before the batch, at first).
    rev: Revision,
    /// Each written key's latest state within the batch.
    pending: HashMap<Vec<u8>, Pending>,
    /// (revision, encoded record) for the write-ahead log.
    logged: Vec<(Revision, Vec<u8>)>,
    index_updates: Vec<(Vec<u8>, Rev)>,
    events: Vec<WatchEvent>,
}

impl BatchWrites {
    /// The key's latest state if it exists: this batch's writes first, then the index.
    fn latest(&self, index: &Index, key: &[u8]) -> Option<Pending> {
        match self.pending.get(key) {
            Some(p) => (!p.rev.tombstone).then(|| p.clone()),
            None => index.latest(key).map(|rev| Pending { rev, value: None }),
        }
    }

    /// The key's current value, if it exists and passes the mod_revision precondition.
    fn existing(
        &self,
        index: &Index,
        kv: &redb::Table<u64, &[u8]>,
        key: &[u8],
        expected: Option<Revision>,
    ) -> Result<KeyValue> {
        let p = self.latest(index, key).ok_or(StorageError::NotFound)?;
        let current = current_kv(kv, key, &p)?;
        match expected {
            Some(exp) if exp != p.rev.rev => Err(StorageError::Conflict {
                expected: exp,
                current: Box::new(current),
            }),
            _ => Ok(current),
        }
    }

    /// Writes the next revision of `key`: a put of `value`, or a tombstone when `None`.
    /// `prev` is the key's current value (required for a delete).
    fn write(
        &mut self,
        kv: &mut redb::Table<u64, &[u8]>,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
        prev: Option<KeyValue>,
    ) -> Result<Outcome> {
        let rev = self.rev + 1;
        let (create, version) = match (&prev, &value) {
            (Some(p), Some(_)) => (p.create_revision, p.version + 1),
            (None, Some(_)) => (rev, 1),
            (Some(p), None) => (p.create_revision, 0),
            (None, None) => return Err(StorageError::NotFound),
        };
        let r = Rev {
            rev,
            create,
            version,
            tombstone: value.is_none(),
        };
        let bytes = Record {
            tombstone: value.is_none(),
            create_revision: create,
            version,
            key: &key,
            value: value.as_deref().unwrap_or_default(),
        }
        .encode();
        kv.insert(rev as u64, bytes.as_slice()).map_err(db_err)?;
        self.rev = rev;
        self.logged.push((rev, bytes));
        self.index_updates.push((key.clone(), r));
        match (value, prev) {
            (Some(value), prev) => {
                let out = KeyValue {
                    key: key.clone(),
                    value,
                    create_revision: create,
                    mod_revision: rev,
                    version,
                };
                self.pending.insert(
                    key,
                    Pending {
                        rev: r,
                        value: Some(Arc::new(out.value.clone())),
                    },
                );
                self.events.push(WatchEvent::Put {
                    kv: out.clone(),
                    prev,
                });
                Ok(Outcome::Put(out))
            }
            (None, prev) => {
                self.pending.insert(
                    key.clone(),
                    Pending {
                        rev: r,
                        value: None,
                    },
                );
                self.events.push(WatchEvent::Delete {
                    key,
                    revision: rev,
                    prev: prev.clone(),
                });
                prev.map(|p| Outcome::Deleted(p, rev))
                    .ok_or(StorageError::NotFound)
            }
        }
    }
}

/// The value of a key's latest state `p`, read from the batch or the database.
fn current_kv(kv: &redb::Table<u64, &[u8]>, key: &[u8], p: &Pending) -> Result<KeyValue> {
    let value = match &p.value {
        Some(v) => v.as_ref().clone(),
        None => {
            let urev = p.rev.rev as u64;
            let g = kv.get(urev).map_err(db_err)?.ok_or_else(|| {
                StorageError::Corrupt(format!("revision {} is missing", p.rev.rev))
            })?;
            Record::decode(urev, g.value())?.value.to_vec()
        }
    };
    Ok(KeyValue {
        key: key.to_vec(),
        value,
        create_revision: p.rev.create,
        mod_revision: p.rev.rev,
        version: p.rev.version,
    })
}

/// Bytes a request can add to a log entry, at most.
fn logged_bytes(op: &Op) -> usize {
    let body = match op {
        Op::Create { key, value } | Op::Update { key, value, .. } => key.len() + value.len(),
        Op::Delete { key, .. } => key.len(),
        Op::Compact { .. } => 0,
    };
    body + HEADER + 12
}

/// The latest state of a key while a batch is being applied.
#[derive(Clone)]
struct Pending {
    rev: Rev,
    value: Option<Arc<Vec<u8>>>,
}

impl Writer {
    fn run(mut self) {
        loop {
            let behind =
                self.failed.is_none() && self.physical < self.shared.index.read().compacted;
            let first = if behind {
                match self.rx.try_recv() {
                    Ok(r) => Some(r),
                    Err(std_mpsc::TryRecvError::Empty) => None,
                    Err(std_mpsc::TryRecvError::Disconnected) => break,
                }
            } else {
                match self.rx.recv_timeout(self.checkpoint_interval) {
                    Ok(r) => Some(r),
                    Err(std_mpsc::RecvTimeoutError::Timeout) => None,
                    Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
                }
            };
            if let Some(first) = first {
                let mut bytes = logged_bytes(&first.op);
                let mut batch = vec![first];
                while batch.len() < self.max_batch && bytes < self.max_batch_bytes {
                    match self.rx.try_recv() {
                        Ok(r) => {
                            bytes += logged_bytes(&r.op);
                            batch.push(r);
                        }
                        Err(_) => break,
                    }
                }
                self.apply(batch, bytes);
            }
            if behind {
                if let Err(e) = self.compaction_step() {
                    tracing::error!(error = %e, "physical compaction step failed");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            let due = self.wal.used() > 0.5
                || (self.wal.used() > 0.0
                    && self.last_checkpoint.elapsed() >= self.checkpoint_interval);
            if due && self.failed.is_none() {
                if let Err(e) = self.checkpoint() {
                    self.fail(format!("checkpoint failed: {e}"));
                }
            }
        }
        // Closing: leave an empty log behind, so the next open replays nothing.
        if self.failed.is_none() && self.wal.used() > 0.0 {
            if let Err(e) = self.checkpoint() {
                tracing::error!(error = %e, "final checkpoint failed; the log will be replayed");
            }
        }
    }

    fn checkpoint(&mut self) -> Result<()> {
        self.epoch = checkpoint(&self.shared.db, self.epoch)?;
        self.wal.reset();
        self.last_checkpoint = Instant::now();
        Ok(())
    }

    fn fail(&mut self, msg: String) {
        tracing::error!(error = %msg, "embedded store stopped accepting writes");
        self.failed = Some(msg);
    }

    /// Applies a batch of requests in one transaction and answers them after the commit.
    fn apply(&mut self, batch: Vec<Request>, bytes: usize) {
        if let Some(msg) = &self.failed {
            for r in batch {
                let _ = r.reply.send(Err(StorageError::Database(format!(
                    "store failed earlier: {msg}"
                ))));
            }
            return;
        }
        if !self.wal.fits(bytes + 64) {
            if let Err(e) = self.checkpoint() {
                self.fail(format!("checkpoint failed: {e}"));
                return self.apply(batch, bytes);
            }
        }
        let mut replies = Vec::with_capacity(batch.len());
        match self.apply_inner(batch, &mut replies) {
            Ok(()) => {}
            Err(e) => {
                tracing::error!(error = %e, "write batch failed");
                let msg = e.to_string();
                for (reply, result) in replies.drain(..) {
                    // Requests that already failed keep their own error.
                    let result = match result {
                        Ok(_) => Err(StorageError::Database(msg.clone())),
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(result);
                }
                return;
            }
        }
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
    }

    #[allow(clippy::type_complexity)]
    fn apply_inner(
        &mut self,
        batch: Vec<Request>,
        replies: &mut Vec<(oneshot::Sender<Result<Outcome>>, Result<Outcome>)>,
    ) -> Result<()> {
        let mut txn = self.shared.db.begin_write().map_err(db_err)?;
        // Durability comes from the write-ahead log; the database is made durable at
        // checkpoints.
        txn.set_durability(redb::Durability::None).map_err(db_err)?;
        let mut new_compacted: Option<Revision> = None;
        let (start_rev, compacted) = {
            let idx = self.shared.index.read();
            (idx.current, idx.compacted)
        };
        let mut w = BatchWrites {
            rev: start_rev,
            ..BatchWrites::default()
        };
        {
            let mut kv = txn.open_table(KV).map_err(db_err)?;
            let index = self.shared.index.read();
            for Request { op, reply } in batch {
                let result: Result<Outcome> = match op {
                    Op::Create { key, value } => match w.latest(&index, &key) {
                        Some(p) => current_kv(&kv, &key, &p).and_then(|current| {
                            Err(StorageError::AlreadyExists {
                                current: Box::new(current),
                            })
                        }),
                        None => w.write(&mut kv, key, Some(value), None),
                    },
                    Op::Update {
                        key,
                        value,
                        expected,
                    } => w
                        .existing(&index, &kv, &key, expected)
                        .and_then(|prev| w.write(&mut kv, key, Some(value), Some(prev))),
                    Op::Delete { key, expected } => w
                        .existing(&index, &kv, &key, expected)
                        .and_then(|prev| w.write(&mut kv, key, None, Some(prev))),
                    Op::Compact { revision } => {
                        if revision > w.rev {
                            Err(StorageError::FutureRevision {
                                requested: revision,
                                current: w.rev,
                            })
                        } else {
                            if revision > new_compacted.unwrap_or(compacted) {
                                new_compacted = Some(revision);
                            }
                            Ok(Outcome::Compacted)
                        }
                    }
                };
                replies.push((reply, result));
            }
        }
        let BatchWrites {
            rev,
            logged,
            index_updates,
            events,
            ..
        } = w;
        if rev == start_rev && new_compacted.is_none() {
            // Nothing to write: every request failed its checks.
            txn.abort().map_err(db_err)?;
            return Ok(());
        }
        {
            let mut meta = txn.open_table(META).map_err(db_err)?;
            meta.insert(META_REVISION, rev as u64).map_err(db_err)?;
            if let Some(c) = new_compacted {
                meta.insert(META_COMPACTED, c as u64).map_err(db_err)?;
            }
        }
        // Durable once logged; the database commit only makes it visible (and readers go
        // through the index, which names the new revisions only after this).
        let entry = wal::Entry {
            epoch: self.epoch,
            base_revision: start_rev,
            compacted: new_compacted.unwrap_or(0),
            records: logged,
        };
        if let Err(e) = self.wal.append(&entry) {
            let _ = txn.abort();
            self.fail(format!("write-ahead log append failed: {e}"));
            return Err(e);
        }
        if let Err(e) = txn.commit() {
            // Logged but not applied: a restart replays it. Until then refuse writes.
            self.fail(format!("database commit failed: {e}"));
            return Err(db_err(e));
        }
        {
            let mut index = self.shared.index.write();
            for (key, r) in index_updates {
                index.keys.entry(key).or_default().push(r);
            }
            index.current = rev;
            if let Some(c) = new_compacted {
                index.compacted = c;
            }
        }
        if !events.is_empty() {
            // No receiver is not an error: nobody is watching.
            let _ = self.shared.fanout.send(Arc::new(Batch {
                revision: rev,
                events,
            }));
        }
        Ok(())
    }

    /// Physically removes one batch of compacted history: for each record in the next
    /// `compaction_batch` revisions up to the compacted revision, every older revision of
    /// its key goes, and the record itself goes too when it is a tombstone.
    fn compaction_step(&mut self) -> Result<()> {
        let target = self.shared.index.read().compacted;
        if self.physical >= target {
            return Ok(());
        }
        let hi = target.min(self.physical + self.compaction_batch as Revision);
        let mut txn = self.shared.db.begin_write().map_err(db_err)?;
        // Derived state: after a crash it is redone from the last checkpoint's cursor.
        txn.set_durability(redb::Durability::None).map_err(db_err)?;
        {
            let mut kv = txn.open_table(KV).map_err(db_err)?;
            let mut seen: Vec<(Vec<u8>, Revision, bool)> = Vec::new();
            for item in kv
                .range((self.physical + 1) as u64..=hi as u64)
                .map_err(db_err)?
            {
                let (k, v) = item.map_err(db_err)?;
                let rec = Record::decode(k.value(), v.value())?;
                seen.push((rec.key.to_vec(), k.value() as Revision, rec.tombstone));
            }
            let mut doomed: Vec<Revision> = Vec::new();
            {
                let mut index = self.shared.index.write();
                for (key, rev, tombstone) in seen {
                    let Some(revs) = index.keys.get_mut(&key) else {
                        continue;
                    };
                    let cut = revs.partition_point(|r| r.rev < rev);
                    doomed.extend(revs.drain(..cut).map(|r| r.rev));
                    if tombstone && revs.first().is_some_and(|r| r.rev == rev) {
                        revs.remove(0);
                        doomed.push(rev);
                    }
                    if revs.is_empty() {
                        index.keys.remove(&key);
                    }
                }
            }
            for rev in doomed {
                kv.remove(rev as u64).map_err(db_err)?;
            }
            let mut meta = txn.open_table(META).map_err(db_err)?;
            meta.insert(META_PHYSICAL, hi as u64).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;
        self.physical = hi;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for EmbeddedStore {
    async fn get(
        &self,
        key: &[u8],
        revision: Option<Revision>,
    ) -> Result<(Option<KeyValue>, Revision)> {
        if key.is_empty() {
            return Err(StorageError::EmptyKey);
        }
        let (rev, txn, at) = {
            let index = self.shared.index.read();
            let at = index.check_read_revision(revision)?;
            let rev = index.visible(key, at);
            // The read transaction is opened under the index lock, so it sees every record
            // the index names (compaction changes the index before deleting records).
            let txn = match rev {
                Some(_) => Some(self.shared.db.begin_read().map_err(db_err)?),
                None => None,
            };
            (rev, txn, at)
        };
        match (rev, txn) {
            (Some(r), Some(txn)) => {
                let mut kvs = self.fetch(&txn, &[r.rev])?;
                Ok((kvs.pop(), at))
            }
            _ => Ok((None, at)),
        }
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        let start = match &req.start {
            Some(s) if !s.starts_with(&req.prefix) => {
                return Err(StorageError::InvalidRange(
                    "start key is outside the prefix".into(),
                ))
            }
            Some(s) => s.clone(),
            None => req.prefix.clone(),
        };
        let end = prefix_end(&req.prefix);
        let (revs, count, txn, at) = {
            let index = self.shared.index.read();
            let at = index.check_read_revision(req.revision)?;
            let upper = match &end {
                Some(e) => Bound::Excluded(e.clone()),
                None => Bound::Unbounded,
            };
            let mut revs = Vec::new();
            let mut count = 0usize;
            for (_, kr) in index.keys.range((Bound::Included(start), upper)) {
                if let Some(r) = visible_in(kr, at) {
                    count += 1;
                    if req.limit == 0 || revs.len() < req.limit {
                        revs.push(r.rev);
                    }
                }
            }
            let txn = self.shared.db.begin_read().map_err(db_err)?;
            (revs, count, txn, at)
        };
        let kvs = self.fetch(&txn, &revs)?;
        Ok(RangeResponse {
            more: count > kvs.len(),
            kvs,
            count,
            revision: at,
        })
    }

    async fn create(&self, key: &[u8], value: Vec<u8>) -> Result<KeyValue> {
        self.shared.limits.check(key, Some(&value))?;
        match self
            .submit(Op::Create {
                key: key.to_vec(),
                value,
            })
            .await?
        {
            Outcome::Put(kv) => Ok(kv),
            _ => Err(StorageError::Database("unexpected writer outcome".into())),
        }
    }

    async fn update(
        &self,
        key: &[u8],
        value: Vec<u8>,
        expected_mod_revision: Option<Revision>,
    ) -> Result<KeyValue> {
        self.shared.limits.check(key, Some(&value))?;
        match self
            .submit(Op::Update {
                key: key.to_vec(),
                value,
                expected: expected_mod_revision,
            })
            .await?
        {
            Outcome::Put(kv) => Ok(kv),
            _ => Err(StorageError::Database("unexpected writer outcome".into())),
        }
    }

    async fn delete(
        &self,
        key: &[u8],
        expected_mod_revision: Option<Revision>,
    ) -> Result<(KeyValue, Revision)> {
        self.shared.limits.check(key, None)?;
        match self
            .submit(Op::Delete {
                key: key.to_vec(),
                expected: expected_mod_revision,
            })
            .await?
        {
            Outcome::Deleted(kv, rev) => Ok((kv, rev)),
            _ => Err(StorageError::Database("unexpected writer outcome".into())),
        }
    }

    async fn watch(&self, prefix: &[u8], from_revision: Revision) -> Result<WatchStream> {
        // Subscribe before reading the index: every batch committed after this point is in
        // the subscription, every one before it is on disk; duplicates are dropped by revision.
        let sub = self.shared.fanout.subscribe();
        let from = {
            let index = self.shared.index.read();
            if from_revision <= 0 {
                index.current
            } else if from_revision < index.compacted {
                return Err(StorageError::Compacted {
                    requested: from_revision,
                    compacted: index.compacted,
                });
            } else {
                from_revision
            }
        };
        let (tx, rx) = mpsc::channel(1024);
        let (ptx, prx) = mpsc::channel(1);
        let watcher = Watcher {
            shared: self.shared.clone(),
            prefix: prefix.to_vec(),
            last: from,
            tx,
        };
        tokio::spawn(watcher.run(sub, prx));
        Ok(WatchStream::new(rx, ptx))
    }

    async fn current_revision(&self) -> Result<Revision> {
        Ok(self.shared.index.read().current)
    }

    fn known_compacted(&self) -> Revision {
        self.compacted_revision()
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        if revision <= self.shared.index.read().compacted {
            return Ok(());
        }
        match self.submit(Op::Compact { revision }).await? {
            Outcome::Compacted => Ok(()),
            _ => Err(StorageError::Database("unexpected writer outcome".into())),
        }
    }
}

/// Records fetched per read transaction when a watcher catches up from disk.
const CATCH_UP_CHUNK: usize = 512;

/// Why a watcher did not get the next fan-out batch.
enum Missed {
    Lagged,
    Closed,
}

/// One watch: catches up from disk, then follows the in-process fan-out.
struct Watcher {
    shared: Arc<Shared>,
    prefix: Vec<u8>,
    /// Every event up to this revision has been delivered (or did not match).
    last: Revision,
    tx: mpsc::Sender<Result<WatchEvent>>,
}

impl Watcher {
    async fn run(
        mut self,
        mut sub: broadcast::Receiver<Arc<Batch>>,
        mut progress: mpsc::Receiver<()>,
    ) {
        if self.catch_up().await.is_err() {
            return;
        }
        let closed = self.tx.clone();
        loop {
            tokio::select! {
                batch = sub.recv() => {
                    let batch = batch.map_err(|e| match e {
                        broadcast::error::RecvError::Lagged(_) => Missed::Lagged,
                        broadcast::error::RecvError::Closed => Missed::Closed,
                    });
                    if !self.on_batch(batch, &mut sub).await {
                        return;
                    }
                }
                req = progress.recv() => {
                    if req.is_none() {
                        return; // the stream was dropped
                    }
                    // Deliver what is already committed so the progress revision is current.
                    loop {
                        let batch = match sub.try_recv() {
                            Ok(b) => Ok(b),
                            Err(broadcast::error::TryRecvError::Empty) => break,
                            Err(broadcast::error::TryRecvError::Lagged(_)) => Err(Missed::Lagged),
                            Err(broadcast::error::TryRecvError::Closed) => Err(Missed::Closed),
                        };
                        if !self.on_batch(batch, &mut sub).await {
                            return;
                        }
                    }
                    if self.tx.send(Ok(WatchEvent::Progress(self.last))).await.is_err() {
                        return;
                    }
                }
                _ = closed.closed() => return,
            }
        }
    }

    /// Handles one fan-out batch (or the news that some were missed); false ends the watch.
    async fn on_batch(
        &mut self,
        batch: std::result::Result<Arc<Batch>, Missed>,
        sub: &mut broadcast::Receiver<Arc<Batch>>,
    ) -> bool {
        match batch {
            Ok(batch) => {
                if batch.revision <= self.last {
                    return true;
                }
                for ev in &batch.events {
                    if ev.revision() > self.last
                        && self.matches(ev)
                        && self.tx.send(Ok(ev.clone())).await.is_err()
                    {
                        return false;
                    }
                }
                self.last = batch.revision;
                true
            }
            Err(Missed::Lagged) => {
                // Too slow for the in-memory fan-out: resubscribe, then read the missed
                // revisions from disk.
                *sub = self.shared.fanout.subscribe();
                self.catch_up().await.is_ok()
            }
            Err(Missed::Closed) => {
                let _ = self.tx.send(Err(StorageError::Closed)).await;
                false
            }
        }
    }

    fn matches(&self, ev: &WatchEvent) -> bool {
        match ev {
            WatchEvent::Put { kv, .. } => kv.key.starts_with(&self.prefix),
            WatchEvent::Delete { key, .. } => key.starts_with(&self.prefix),
            WatchEvent::Progress(_) => false,
        }
    }

    /// Delivers every matching event in `(last, current]` from disk. An `Err` means the
    /// watch ended (consumer gone, or history compacted, which was reported).
    async fn catch_up(&mut self) -> std::result::Result<(), ()> {
        loop {
            let chunk = match self.read_chunk() {
                Ok(c) => c,
                Err(e) => {
                    let _ = self.tx.send(Err(e)).await;
                    return Err(());
                }
            };
            let Some((events, upto, done)) = chunk else {
                return Ok(());
            };
            for ev in events {
                if self.tx.send(Ok(ev)).await.is_err() {
                    return Err(());
                }
            }
            self.last = upto;
            if done {
                return Ok(());
            }
        }
    }

    /// Reads the next chunk of history after `last`: its matching events, the revision the
    /// chunk reaches, and whether that is the current revision.
    #[allow(clippy::type_complexity)]
    fn read_chunk(&self) -> Result<Option<(Vec<WatchEvent>, Revision, bool)>> {
        let (txn, current, compacted) = {
            let index = self.shared.index.read();
            let txn = self.shared.db.begin_read().map_err(db_err)?;
            (txn, index.current, index.compacted)
        };
        if self.last >= current {
            return Ok(None);
        }
        if self.last < compacted {
            return Err(StorageError::Compacted {
                requested: self.last,
                compacted,
            });
        }
        let table = txn.open_table(KV).map_err(db_err)?;
        let mut events = Vec::new();
        let mut upto = self.last;
        let mut n = 0;
        let mut prevs: Vec<(usize, Vec<u8>, Revision)> = Vec::new();
        for item in table
            .range((self.last + 1) as u64..=current as u64)
            .map_err(db_err)?
        {
            let (k, v) = item.map_err(db_err)?;
            let rev = k.value() as Revision;
            upto = rev;
            n += 1;
            let rec = Record::decode(k.value(), v.value())?;
            if rec.key.starts_with(&self.prefix) {
                if rec.tombstone {
                    events.push(WatchEvent::Delete {
                        key: rec.key.to_vec(),
                        revision: rev,
                        prev: None,
                    });
                } else {
                    events.push(WatchEvent::Put {
                        kv: rec.to_kv(rev),
                        prev: None,
                    });
                }
                if rec.tombstone || rec.version > 1 {
                    prevs.push((events.len() - 1, rec.key.to_vec(), rev));
                }
            }
            if n >= CATCH_UP_CHUNK {
                break;
            }
        }
        // Previous values: the key's kept revision just before this one, if any.
        if !prevs.is_empty() {
            let index = self.shared.index.read();
            for (i, key, rev) in prevs {
                let Some(before) = index
                    .keys
                    .get(&key)
                    .and_then(|revs| visible_in(revs, rev - 1))
                else {
                    continue;
                };
                let urev = before.rev as u64;
                let Some(g) = table.get(urev).map_err(db_err)? else {
                    continue;
                };
                let prev = Record::decode(urev, g.value())?.to_kv(before.rev);
                match &mut events[i] {
                    WatchEvent::Put { prev: p, .. } | WatchEvent::Delete { prev: p, .. } => {
                        *p = Some(prev)
                    }
                    WatchEvent::Progress(_) => {}
                }
            }
        }
        let done = n < CATCH_UP_CHUNK || upto >= current;
        // Revisions between the last record read and `current` were compacted away
        // without anything to deliver; the chunk covers them when it reached the end.
        Ok(Some((events, if done { current } else { upto }, done)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore};

    #[test]
    fn record_round_trip() {
        let rec = Record {
            tombstone: false,
            create_revision: 7,
            version: 3,
            key: b"/registry/pods/a/b",
            value: b"{\"kind\":\"Pod\"}",
        };
        let buf = rec.encode();
        let back = Record::decode(9, &buf).unwrap();
        assert_eq!(back.to_kv(9), rec.to_kv(9));
        assert!(!back.tombstone);
    }

    #[test]
    fn decoding_garbage_is_an_error_never_a_panic() {
        let mut rng = rand::rng();
        let good = Record {
            tombstone: true,
            create_revision: 1,
            version: 0,
            key: b"k",
            value: b"",
        }
        .encode();
        for n in 0..20_000 {
            let mut buf = if n % 2 == 0 {
                let mut b = vec![0u8; rng.random_range(0..64)];
                rng.fill_bytes(&mut b);
                b
            } else {
                // Truncations and bit flips of a valid record.
                let mut b = good[..rng.random_range(0..=good.len())].to_vec();
                if !b.is_empty() {
                    let i = rng.random_range(0..b.len());
                    b[i] ^= 1 << rng.random_range(0..8);
                }
                b
            };
            if n % 3 == 0 && buf.len() > 20 {
                buf[17..21].copy_from_slice(&u32::MAX.to_be_bytes());
            }
            if let Ok(r) = Record::decode(1, &buf) {
                assert!(r.key.len() + HEADER <= buf.len());
            }
        }
    }
}
