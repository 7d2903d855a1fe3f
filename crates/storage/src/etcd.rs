//! The etcd backend: [`EtcdStore`] implements [`Store`] over etcd's v3 gRPC API.
//!
//! Every conditional write is one etcd transaction (compare, then put/delete, else read
//! the current value), so there is never a read-then-write race. Keys are used as given.
//!
//! # Failures
//!
//! The client talks to every endpoint it was given. A request that fails because its
//! endpoint could not be reached is retried (for a few seconds, with backoff) on another
//! one; reads are also retried after other transient failures (the request may have been
//! lost in flight, and reading again is harmless). A write that may have reached etcd is
//! never retried: the error is returned, as with any etcd client.
//!
//! A watch whose connection breaks is re-created from the last delivered revision, so the
//! consumer sees neither a gap nor a duplicate. If the events it needs have been compacted
//! meanwhile, the stream ends with [`StorageError::Compacted`].
//!
//! # etcd versions
//!
//! etcd before 3.4.31 / 3.5.13 may answer a watch progress request
//! ([`crate::WatchStream::request_progress`]) with a revision ahead of events it has not
//! sent yet (etcd-io/etcd#15220, #17507); [`EtcdStore::connect`] logs a warning for such
//! servers.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, KvClient,
    PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchClient, WatchOptions,
    WatchRequestSender, WatchResponse, WatchResponseStream,
};
use tokio::sync::{mpsc, Notify};

use crate::{
    prefix_end, CompactionConfig, KeyValue, Limits, RangeRequest, RangeResponse, Result, Revision,
    StorageError, Store, WatchEvent, WatchStream,
};

/// How long a request keeps being retried on another endpoint.
const RETRY_BUDGET: Duration = Duration::from_secs(10);
/// How long a broken watch keeps trying to resume before giving up.
const WATCH_RESUME_BUDGET: Duration = Duration::from_secs(30);
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// Events buffered per watch before etcd's stream is back-pressured.
const WATCH_BUFFER: usize = 1024;
/// Largest response accepted (etcd itself sends up to 2 GiB).
const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;
/// How long a watch may take to be created (or a compaction probe to answer).
const WATCH_CREATE_TIMEOUT: Duration = Duration::from_secs(10);
const COMPACTION_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// etcd's error for a read or watch below the compacted revision.
const ERR_COMPACTED: &str = "required revision has been compacted";
/// etcd's error for a read above the current revision.
const ERR_FUTURE: &str = "required revision is a future revision";

/// How often endpoints are probed (see [`monitor_endpoints`]).
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The files of a TLS client of etcd: the CA that signed the members' serving
/// certificates, and the client's certificate and key (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca_file: std::path::PathBuf,
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
}

impl EtcdTls {
    /// The client's TLS options, read from the files.
    pub fn options(&self) -> Result<etcd_client::TlsOptions> {
        let read = |p: &std::path::Path| {
            std::fs::read(p)
                .map_err(|e| StorageError::Etcd(format!("reading {}: {e}", p.display())))
        };
        Ok(etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read(&self.ca_file)?))
            .identity(etcd_client::Identity::from_pem(
                read(&self.cert_file)?,
                read(&self.key_file)?,
            )))
    }
}

/// A [`Store`] backed by an etcd cluster.
pub struct EtcdStore {
    kv: KvClient,
    watch: WatchClient,
    limits: Limits,
    /// Wakes the endpoint monitor early (after a connection failure).
    probe: Arc<Notify>,
    monitor: tokio::task::JoinHandle<()>,
    /// The newest revision compacted through this client.
    compacted: std::sync::atomic::AtomicI64,
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.monitor.abort();
    }
}

impl EtcdStore {
    /// Connects to an etcd cluster through `endpoints` (`http://host:port`), checks that it
    /// answers, and starts automatic compaction (see [`crate::compactor`]).
    pub async fn connect(
        endpoints: &[String],
        limits: Limits,
        compaction: CompactionConfig,
    ) -> Result<Arc<EtcdStore>> {
        EtcdStore::connect_with(endpoints, None, limits, compaction).await
    }

    /// [`EtcdStore::connect`] to members that serve TLS (`https://host:port`), with the
    /// client certificate `tls` gives (kube-apiserver's `--etcd-cafile`, `--etcd-certfile`,
    /// `--etcd-keyfile`).
    pub async fn connect_with(
        endpoints: &[String],
        tls: Option<&EtcdTls>,
        limits: Limits,
        compaction: CompactionConfig,
    ) -> Result<Arc<EtcdStore>> {
        if endpoints.is_empty() {
            return Err(StorageError::Etcd("no etcd endpoints given".into()));
        }
        // The balancer knows endpoints by URI: give it the same strings as the monitor.
        let endpoints: Vec<String> = endpoints
            .iter()
            .map(|e| {
                if e.contains("://") {
                    e.clone()
                } else if tls.is_some() {
                    format!("https://{e}")
                } else {
                    format!("http://{e}")
                }
            })
            .collect();
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member cut off from the quorum answers "no leader" at once instead of
            // stalling, and a watch on it is ended so that it resumes elsewhere.
            .with_require_leader(true);
        let options = match tls {
            Some(t) => options.with_tls(t.options()?),
            None => options,
        };
        let client = Client::connect(&endpoints, Some(options))
            .await
            .map_err(etcd_err)?;
        let probe = Arc::new(Notify::new());
        let monitor = tokio::spawn(monitor_endpoints(
            client.clone(),
            endpoints.clone(),
            probe.clone(),
        ));
        let store = Arc::new(EtcdStore {
            kv: client
                .kv_client()
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            watch: client
                .watch_client()
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            limits,
            compacted: std::sync::atomic::AtomicI64::new(0),
            probe,
            monitor,
        });
        let revision = store.current_revision().await?;
        match client.maintenance_client().status().await {
            Ok(status) => {
                let version = status.version().to_string();
                tracing::info!(%version, revision, ?endpoints, "connected to etcd");
                if !progress_requests_ordered(&version) {
                    tracing::warn!(
                        %version,
                        "this etcd may answer watch progress requests ahead of undelivered \
                         events (etcd-io/etcd#15220); use etcd >= 3.4.31 or >= 3.5.13"
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, "etcd status failed"),
        }
        crate::compactor::spawn(Arc::downgrade(&store), compaction);
        Ok(store)
    }

    /// Runs `op` with a fresh client handle, retrying on another endpoint while the error
    /// says the request may be repeated (see [`retryable`]), for up to [`RETRY_BUDGET`].
    async fn call<T, F, Fut>(&self, kind: Kind, mut op: F) -> Result<T, etcd_client::Error>
    where
        F: FnMut(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + RETRY_BUDGET;
        let mut backoff = FIRST_BACKOFF;
        loop {
            match op(self.kv.clone()).await {
                Ok(v) => return Ok(v),
                Err(e) if retryable(&e, kind) && Instant::now() + backoff < deadline => {
                    tracing::debug!(error = %e, ?kind, "etcd request failed, retrying");
                    if is_connect_error(&e) {
                        self.probe.notify_one();
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs a write transaction (retried only when it cannot have reached etcd).
    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.call(Kind::Write, |mut kv| {
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
        .map_err(etcd_err)
    }

    /// Maps an etcd error of a read at `requested` (compacted, future revision, other).
    async fn read_error(&self, e: etcd_client::Error, requested: Option<Revision>) -> StorageError {
        let text = error_text(&e);
        let requested = requested.unwrap_or(0);
        if text.contains(ERR_COMPACTED) {
            StorageError::Compacted {
                requested,
                compacted: self.compacted_revision(requested).await.unwrap_or(0),
            }
        } else if text.contains(ERR_FUTURE) {
            StorageError::FutureRevision {
                requested,
                current: self.current_revision().await.unwrap_or(0),
            }
        } else {
            etcd_err(e)
        }
    }

    /// Best effort: the cluster's compacted revision, knowing `below` is compacted. etcd's
    /// error does not carry it, but a watch from a compacted revision is canceled with it.
    async fn compacted_revision(&self, below: Revision) -> Option<Revision> {
        let mut watch = self.watch.clone();
        let probe = async move {
            let options = WatchOptions::new().with_start_revision(below.max(1));
            let (_sender, mut stream) = watch
                .watch(&b"\0kumo/compaction-probe"[..], Some(options))
                .await
                .ok()?
                .split();
            while let Ok(Some(resp)) = stream.message().await {
                if resp.compact_revision() > 0 {
                    return Some(resp.compact_revision());
                }
                if resp.canceled() || !resp.events().is_empty() {
                    return None;
                }
            }
            None
        };
        tokio::time::timeout(COMPACTION_PROBE_TIMEOUT, probe)
            .await
            .ok()
            .flatten()
    }
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    async fn get(
        &self,
        key: &[u8],
        revision: Option<Revision>,
    ) -> Result<(Option<KeyValue>, Revision)> {
        if key.is_empty() {
            return Err(StorageError::EmptyKey);
        }
        let revision = revision.filter(|r| *r > 0);
        let mut options = GetOptions::new();
        if let Some(r) = revision {
            options = options.with_revision(r);
        }
        let result = self
            .call(Kind::Read, |mut kv| {
                let options = options.clone();
                async move { kv.get(key, Some(options)).await }
            })
            .await;
        let mut resp = match result {
            Ok(resp) => resp,
            Err(e) => return Err(self.read_error(e, revision).await),
        };
        let at = match revision {
            Some(r) => r,
            None => header_revision(resp.header())?,
        };
        Ok((resp.take_kvs().into_iter().next().map(convert_kv), at))
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        let start = match req.start {
            Some(s) if !s.starts_with(&req.prefix) => {
                return Err(StorageError::InvalidRange(
                    "start key is outside the prefix".into(),
                ))
            }
            Some(s) => s,
            None => req.prefix.clone(),
        };
        let (key, end) = key_range(start, &req.prefix);
        let revision = req.revision.filter(|r| *r > 0);
        let mut options = GetOptions::new()
            .with_range(end)
            .with_limit(i64::try_from(req.limit).unwrap_or(i64::MAX));
        if let Some(r) = revision {
            options = options.with_revision(r);
        }
        let result = self
            .call(Kind::Read, |mut kv| {
                let (key, options) = (key.clone(), options.clone());
                async move { kv.get(key, Some(options)).await }
            })
            .await;
        let mut resp = match result {
            Ok(resp) => resp,
            Err(e) => return Err(self.read_error(e, revision).await),
        };
        let at = match revision {
            Some(r) => r,
            None => header_revision(resp.header())?,
        };
        Ok(RangeResponse {
            count: usize::try_from(resp.count()).unwrap_or(0),
            more: resp.more(),
            kvs: resp.take_kvs().into_iter().map(convert_kv).collect(),
            revision: at,
        })
    }

    async fn create(&self, key: &[u8], value: Vec<u8>) -> Result<KeyValue> {
        self.limits.check(key, Some(&value))?;
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value.clone(), None)])
            .or_else([TxnOp::get(key, None)]);
        let resp = self.txn(txn).await?;
        let revision = header_revision(resp.header())?;
        if resp.succeeded() {
            return Ok(KeyValue {
                key: key.to_vec(),
                value,
                create_revision: revision,
                mod_revision: revision,
                version: 1,
            });
        }
        match read_back(&resp) {
            Some(current) => Err(StorageError::AlreadyExists {
                current: Box::new(current),
            }),
            None => Err(StorageError::Etcd(
                "create failed although the key does not exist".into(),
            )),
        }
    }

    async fn update(
        &self,
        key: &[u8],
        value: Vec<u8>,
        expected_mod_revision: Option<Revision>,
    ) -> Result<KeyValue> {
        self.limits.check(key, Some(&value))?;
        let txn = Txn::new()
            .when(guard(key, expected_mod_revision))
            .and_then([TxnOp::put(
                key,
                value.clone(),
                Some(PutOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(key, None)]);
        let resp = self.txn(txn).await?;
        let revision = header_revision(resp.header())?;
        if !resp.succeeded() {
            return Err(precondition_failed(&resp, expected_mod_revision));
        }
        let prev = resp
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Put(mut put) => put.take_prev_key(),
                _ => None,
            })
            .ok_or_else(|| StorageError::Etcd("update: etcd returned no previous value".into()))?;
        Ok(KeyValue {
            key: key.to_vec(),
            value,
            create_revision: prev.create_revision(),
            mod_revision: revision,
            version: prev.version() + 1,
        })
    }

    async fn delete(
        &self,
        key: &[u8],
        expected_mod_revision: Option<Revision>,
    ) -> Result<(KeyValue, Revision)> {
        self.limits.check(key, None)?;
        let txn = Txn::new()
            .when(guard(key, expected_mod_revision))
            .and_then([TxnOp::delete(
                key,
                Some(DeleteOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(key, None)]);
        let resp = self.txn(txn).await?;
        let revision = header_revision(resp.header())?;
        if !resp.succeeded() {
            return Err(precondition_failed(&resp, expected_mod_revision));
        }
        let prev = resp
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Delete(mut del) => del.take_prev_kvs().into_iter().next(),
                _ => None,
            })
            .ok_or_else(|| StorageError::Etcd("delete: etcd returned no previous value".into()))?;
        Ok((convert_kv(prev), revision))
    }

    async fn watch(&self, prefix: &[u8], from_revision: Revision) -> Result<WatchStream> {
        let (key, range_end) = key_range(prefix.to_vec(), prefix);
        if from_revision > 0 {
            // etcd reports a compacted start revision only after the watch is created;
            // a read at the first revision needed answers now.
            let options = GetOptions::new()
                .with_revision(from_revision + 1)
                .with_count_only();
            let result = self
                .call(Kind::Read, |mut kv| {
                    let (key, options) = (key.clone(), options.clone());
                    async move { kv.get(key, Some(options)).await }
                })
                .await;
            if let Err(e) = result {
                match self.read_error(e, Some(from_revision + 1)).await {
                    StorageError::Compacted { compacted, .. } => {
                        return Err(StorageError::Compacted {
                            requested: from_revision,
                            compacted,
                        })
                    }
                    // Watching from a future revision waits for it.
                    StorageError::FutureRevision { .. } => {}
                    other => return Err(other),
                }
            }
        }
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let (progress_tx, progress_rx) = mpsc::channel(1);
        let mut task = WatchTask {
            client: self.watch.clone(),
            probe: self.probe.clone(),
            key,
            range_end,
            last: from_revision.max(0),
            floor: 0,
            progress_pending: false,
            tx,
        };
        let start = if from_revision > 0 {
            from_revision + 1
        } else {
            0
        };
        let deadline = Instant::now() + RETRY_BUDGET;
        let mut backoff = FIRST_BACKOFF;
        let (conn, created) = loop {
            match task.open(start).await {
                Ok(opened) => break opened,
                Err(OpenError::Compacted(compacted)) => {
                    return Err(StorageError::Compacted {
                        requested: from_revision,
                        compacted,
                    })
                }
                Err(OpenError::Failed(e)) if Instant::now() + backoff < deadline => {
                    tracing::debug!(error = %e, "creating etcd watch failed, retrying");
                    self.probe.notify_one();
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(OpenError::Failed(e)) => return Err(StorageError::Etcd(e)),
            }
        };
        if from_revision <= 0 {
            // "From now on": the watch starts right after the revision it was created at.
            task.last = created;
        }
        task.floor = task.last;
        tokio::spawn(task.run(conn, progress_rx));
        Ok(WatchStream::new(rx, progress_tx))
    }

    async fn current_revision(&self) -> Result<Revision> {
        let options = GetOptions::new().with_count_only().with_limit(1);
        let resp = self
            .call(Kind::Read, |mut kv| {
                let options = options.clone();
                async move { kv.get(&b"\0"[..], Some(options)).await }
            })
            .await
            .map_err(etcd_err)?;
        header_revision(resp.header())
    }

    fn known_compacted(&self) -> Revision {
        self.compacted.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        if revision <= 0 {
            return Ok(());
        }
        // Compacting is idempotent (a repeat fails with "compacted", ignored), so it is
        // retried like a read.
        let result = self
            .call(Kind::Read, |mut kv| async move {
                kv.compact(revision, None).await
            })
            .await;
        match result {
            Ok(_) => {
                tracing::debug!(revision, "etcd compacted");
                self.compacted
                    .fetch_max(revision, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Err(e) if error_text(&e).contains(ERR_COMPACTED) => {
                self.compacted
                    .fetch_max(revision, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Err(e) if error_text(&e).contains(ERR_FUTURE) => Err(StorageError::FutureRevision {
                requested: revision,
                current: self.current_revision().await.unwrap_or(0),
            }),
            Err(e) => Err(etcd_err(e)),
        }
    }
}

/// One watch: forwards etcd's events to the consumer and resumes after failures.
struct WatchTask {
    client: WatchClient,
    /// Wakes the endpoint monitor when the watch's connection fails.
    probe: Arc<Notify>,
    key: Vec<u8>,
    range_end: Vec<u8>,
    /// Every event up to this revision has been delivered.
    last: Revision,
    /// Events at or below this revision are dropped: the current etcd watch started after
    /// it, so any such event would be a duplicate.
    floor: Revision,
    /// A progress request has been asked for and not answered yet.
    progress_pending: bool,
    tx: mpsc::Sender<Result<WatchEvent>>,
}

/// An established etcd watch.
struct Conn {
    sender: WatchRequestSender,
    stream: WatchResponseStream,
    watch_id: i64,
}

enum OpenError {
    /// The start revision is compacted; carries the compacted revision.
    Compacted(Revision),
    /// Anything else (worth retrying).
    Failed(String),
}

/// What ended the forwarding of one etcd watch.
enum Ended {
    /// The consumer is gone or the stream was ended with an error: stop.
    Stop,
    /// The etcd watch broke: resume it.
    Broken(String),
}

impl WatchTask {
    /// Creates an etcd watch from `start` (0: now) and waits for its confirmation; returns
    /// it with the revision it was created at.
    async fn open(&mut self, start: Revision) -> Result<(Conn, Revision), OpenError> {
        let mut options = WatchOptions::new()
            .with_range(self.range_end.clone())
            .with_prev_key()
            .with_progress_notify();
        if start > 0 {
            options = options.with_start_revision(start);
        }
        let mut client = self.client.clone();
        let key = self.key.clone();
        let create = async move {
            let (sender, mut stream) = client
                .watch(key, Some(options))
                .await
                .map_err(|e| OpenError::Failed(error_text(&e)))?
                .split();
            match stream.message().await {
                Ok(Some(resp)) if resp.compact_revision() > 0 => {
                    Err(OpenError::Compacted(resp.compact_revision()))
                }
                Ok(Some(resp)) if resp.created() && !resp.canceled() => {
                    let created = resp.header().map(|h| h.revision()).unwrap_or(0);
                    let watch_id = resp.watch_id();
                    Ok((
                        Conn {
                            sender,
                            stream,
                            watch_id,
                        },
                        created,
                    ))
                }
                Ok(Some(resp)) => Err(OpenError::Failed(format!(
                    "watch not created: {}",
                    resp.cancel_reason()
                ))),
                Ok(None) => Err(OpenError::Failed("watch stream ended".into())),
                Err(e) => Err(OpenError::Failed(error_text(&e))),
            }
        };
        tokio::time::timeout(WATCH_CREATE_TIMEOUT, create)
            .await
            .unwrap_or_else(|_| Err(OpenError::Failed("watch creation timed out".into())))
    }

    async fn run(mut self, mut conn: Conn, mut progress: mpsc::Receiver<()>) {
        // A watch that etcd keeps ending right away (say, it is canceled on creation) is
        // resumed with growing pauses instead of in a busy loop.
        let mut last_break: Option<Instant> = None;
        let mut pause = Duration::ZERO;
        loop {
            match self.forward(&mut conn, &mut progress).await {
                Ended::Stop => {
                    // Tell etcd; dropping the stream right after also ends it.
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        conn.sender.cancel(conn.watch_id),
                    )
                    .await;
                    return;
                }
                Ended::Broken(reason) => {
                    tracing::info!(%reason, last = self.last, "etcd watch broken, resuming");
                    self.probe.notify_one();
                    drop(conn);
                    pause = match last_break {
                        Some(at) if at.elapsed() < Duration::from_secs(1) => {
                            (pause * 2).clamp(FIRST_BACKOFF, Duration::from_secs(1))
                        }
                        _ => Duration::ZERO,
                    };
                    last_break = Some(Instant::now());
                    if !pause.is_zero() {
                        tokio::select! {
                            _ = self.tx.closed() => return,
                            _ = tokio::time::sleep(pause) => {}
                        }
                    }
                    match self.resume().await {
                        Some(c) => conn = c,
                        None => return,
                    }
                }
            }
        }
    }

    /// Forwards responses of one etcd watch until it breaks or the consumer leaves.
    async fn forward(&mut self, conn: &mut Conn, progress: &mut mpsc::Receiver<()>) -> Ended {
        loop {
            tokio::select! {
                biased;
                _ = self.tx.closed() => return Ended::Stop,
                request = progress.recv() => match request {
                    None => return Ended::Stop,
                    Some(()) => {
                        self.progress_pending = true;
                        if let Err(e) = conn.sender.request_progress().await {
                            return Ended::Broken(error_text(&e));
                        }
                    }
                },
                message = conn.stream.message() => match message {
                    Ok(Some(resp)) => {
                        if let Some(end) = self.handle(resp).await {
                            return end;
                        }
                    }
                    Ok(None) => return Ended::Broken("watch stream ended".into()),
                    Err(e) => return Ended::Broken(error_text(&e)),
                },
            }
        }
    }

    /// Handles one watch response; `Some` ends this etcd watch.
    async fn handle(&mut self, resp: WatchResponse) -> Option<Ended> {
        if resp.compact_revision() > 0 {
            let _ = self
                .tx
                .send(Err(StorageError::Compacted {
                    requested: self.last,
                    compacted: resp.compact_revision(),
                }))
                .await;
            return Some(Ended::Stop);
        }
        if resp.canceled() {
            return Some(Ended::Broken(format!(
                "watch canceled by etcd: {}",
                resp.cancel_reason()
            )));
        }
        if resp.created() {
            return None;
        }
        if resp.events().is_empty() {
            // A progress notification: every event up to the header revision was sent.
            let revision = resp.header()?.revision();
            self.progress_pending = false;
            if revision >= self.last
                && self
                    .tx
                    .send(Ok(WatchEvent::Progress(revision)))
                    .await
                    .is_err()
            {
                return Some(Ended::Stop);
            }
            return None;
        }
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            let revision = kv.mod_revision();
            if revision <= self.floor {
                tracing::debug!(
                    revision,
                    floor = self.floor,
                    "dropping replayed watch event"
                );
                continue;
            }
            let prev = event.prev_kv().map(copy_kv);
            let ev = match event.event_type() {
                EventType::Put => WatchEvent::Put {
                    kv: copy_kv(kv),
                    prev,
                },
                EventType::Delete => WatchEvent::Delete {
                    key: kv.key().to_vec(),
                    revision,
                    prev,
                },
            };
            if self.tx.send(Ok(ev)).await.is_err() {
                return Some(Ended::Stop);
            }
            self.last = self.last.max(revision);
        }
        None
    }

    /// Re-creates the etcd watch after the last delivered revision; `None` when the
    /// consumer left or the watch cannot continue (the consumer got the error).
    async fn resume(&mut self) -> Option<Conn> {
        let deadline = Instant::now() + WATCH_RESUME_BUDGET;
        let mut backoff = FIRST_BACKOFF;
        loop {
            if self.tx.is_closed() {
                return None;
            }
            match self.open(self.last + 1).await {
                Ok((mut conn, _)) => {
                    self.floor = self.last;
                    if self.progress_pending && conn.sender.request_progress().await.is_err() {
                        tracing::debug!("re-sending a progress request failed");
                    }
                    tracing::info!(from = self.last + 1, "etcd watch resumed");
                    return Some(conn);
                }
                Err(OpenError::Compacted(compacted)) => {
                    let _ = self
                        .tx
                        .send(Err(StorageError::Compacted {
                            requested: self.last,
                            compacted,
                        }))
                        .await;
                    return None;
                }
                Err(OpenError::Failed(e)) => {
                    if Instant::now() >= deadline {
                        tracing::warn!(error = %e, "etcd watch could not be resumed");
                        let _ = self
                            .tx
                            .send(Err(StorageError::Etcd(format!(
                                "watch lost and not resumed: {e}"
                            ))))
                            .await;
                        return None;
                    }
                    tracing::debug!(error = %e, "resuming etcd watch failed, retrying");
                    self.probe.notify_one();
                    tokio::select! {
                        _ = self.tx.closed() => return None,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

/// Whether a request is a read (repeatable) or a write (must not be applied twice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

/// Whether a failed request may be sent again.
///
/// Any request whose connection could not be established (or that etcd refused because
/// its member has no leader, which it checks before anything else) never took effect.
/// Reads may also be repeated after failures in flight.
fn retryable(e: &etcd_client::Error, kind: Kind) -> bool {
    let text = error_text(e).to_ascii_lowercase();
    let refused = ["etcdserver: no leader", "etcdserver: too many requests"]
        .iter()
        .any(|s| text.contains(s));
    if refused || is_connect_error(e) {
        return true;
    }
    if kind == Kind::Write {
        return false;
    }
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            matches!(
                i32::from(s.code()),
                GRPC_UNKNOWN | GRPC_DEADLINE_EXCEEDED | GRPC_UNAVAILABLE
            ) && !text.contains(ERR_COMPACTED)
                && !text.contains(ERR_FUTURE)
        }
        etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

// gRPC status codes (as numbers, so that tonic need not be a direct dependency).
const GRPC_UNKNOWN: i32 = 2;
const GRPC_DEADLINE_EXCEEDED: i32 = 4;
const GRPC_UNAVAILABLE: i32 = 14;

/// Whether the request failed to get a connection, so it was never sent.
fn is_connect_error(e: &etcd_client::Error) -> bool {
    if matches!(e, etcd_client::Error::TransportError(_)) {
        return true;
    }
    let text = error_text(e).to_ascii_lowercase();
    [
        "error trying to connect",
        "tcp connect error",
        "connecterror",
        "service was not ready",
    ]
    .iter()
    .any(|s| text.contains(s))
}

/// Keeps unreachable endpoints out of the client's load balancer.
///
/// etcd-client balances requests over every endpoint (power of two choices), and an
/// endpoint whose connection fails keeps being picked: each such request fails at once
/// (and is retried elsewhere). This task probes every endpoint with a TCP connect every
/// [`PROBE_INTERVAL`], or at once when `wake` is notified, removes the ones that refuse
/// and adds them back when they answer again. It never removes the last endpoint.
async fn monitor_endpoints(client: Client, endpoints: Vec<String>, wake: Arc<Notify>) {
    // One endpoint (a stacked member's API server talks to its own member) has nothing to
    // balance, and probing it would cost the member a refused handshake every second.
    if endpoints.len() < 2 {
        return;
    }
    let addrs: Vec<Option<String>> = endpoints.iter().map(|e| socket_addr(e)).collect();
    let mut active = vec![true; endpoints.len()];
    loop {
        tokio::select! {
            _ = tokio::time::sleep(PROBE_INTERVAL) => {}
            _ = wake.notified() => {}
        }
        let probes = addrs.iter().map(|addr| async move {
            let Some(addr) = addr else { return true };
            matches!(
                tokio::time::timeout(
                    Duration::from_millis(500),
                    tokio::net::TcpStream::connect(addr.as_str())
                )
                .await,
                Ok(Ok(_))
            )
        });
        let up = futures::future::join_all(probes).await;
        let any_up = up.iter().any(|u| *u);
        for (i, endpoint) in endpoints.iter().enumerate() {
            // With every endpoint down, all stay in (requests fail until one is back).
            let want = up[i] || !any_up;
            if want == active[i] {
                continue;
            }
            let result = if want {
                client.add_endpoint(endpoint).await
            } else {
                client.remove_endpoint(endpoint).await
            };
            match result {
                Ok(()) => {
                    tracing::info!(%endpoint, up = want, "etcd endpoint state changed");
                    active[i] = want;
                }
                Err(e) => tracing::warn!(%endpoint, error = %e, "updating etcd endpoints failed"),
            }
        }
    }
}

/// `host:port` of an endpoint URL, if it has an explicit port.
fn socket_addr(endpoint: &str) -> Option<String> {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let authority = rest.split('/').next()?;
    let (_, port) = authority.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    Some(authority.to_string())
}

/// The error and all its sources, as one line.
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

fn etcd_err(e: etcd_client::Error) -> StorageError {
    StorageError::Etcd(error_text(&e))
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<Revision> {
    header
        .map(|h| h.revision())
        .ok_or_else(|| StorageError::Etcd("response without header".into()))
}

/// The etcd key and range end covering `start..` up to the end of `prefix`.
fn key_range(start: Vec<u8>, prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    // "\0" as range end means "to the last key"; as key, "from the first key".
    let end = prefix_end(prefix).unwrap_or_else(|| vec![0]);
    let key = if start.is_empty() { vec![0] } else { start };
    (key, end)
}

/// Compares for `update`/`delete`: the key exists, and has the expected mod_revision.
fn guard(key: &[u8], expected: Option<Revision>) -> Vec<Compare> {
    let mut compares = vec![Compare::create_revision(key, CompareOp::Greater, 0)];
    if let Some(expected) = expected {
        compares.push(Compare::mod_revision(key, CompareOp::Equal, expected));
    }
    compares
}

/// The value read by the `or_else` branch of a failed transaction.
fn read_back(resp: &TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next().map(convert_kv),
        _ => None,
    })
}

/// The error for a failed `update`/`delete` guard.
fn precondition_failed(resp: &TxnResponse, expected: Option<Revision>) -> StorageError {
    match (read_back(resp), expected) {
        (None, _) => StorageError::NotFound,
        (Some(current), Some(expected)) => StorageError::Conflict {
            expected,
            current: Box::new(current),
        },
        (Some(_), None) => StorageError::Etcd("precondition failed on an existing key".into()),
    }
}

fn convert_kv(kv: etcd_client::KeyValue) -> KeyValue {
    let (create_revision, mod_revision, version) =
        (kv.create_revision(), kv.mod_revision(), kv.version());
    let (key, value) = kv.into_key_value();
    KeyValue {
        key,
        value,
        create_revision,
        mod_revision,
        version,
    }
}

fn copy_kv(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
    }
}

/// Whether etcd `version` answers progress requests in order with events: 3.4.31+,
/// 3.5.13+, 3.6+ (unparsable versions are assumed to).
fn progress_requests_ordered(version: &str) -> bool {
    let parts: Vec<u64> = version
        .split(['.', '-', '+'])
        .take(3)
        .map_while(|p| p.parse().ok())
        .collect();
    match parts[..] {
        [3, 4, patch] => patch >= 31,
        [3, 5, patch] => patch >= 13,
        [major, minor, _] => (major, minor) > (3, 5),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ranges() {
        assert_eq!(
            key_range(b"/a/".to_vec(), b"/a/"),
            (b"/a/".to_vec(), b"/a0".to_vec())
        );
        assert_eq!(
            key_range(b"/a/x".to_vec(), b"/a/"),
            (b"/a/x".to_vec(), b"/a0".to_vec())
        );
        assert_eq!(key_range(Vec::new(), b""), (vec![0], vec![0]));
        assert_eq!(key_range(vec![0xff], &[0xff]), (vec![0xff], vec![0]));
    }

    #[test]
    fn socket_addrs() {
        assert_eq!(
            socket_addr("http://127.0.0.1:2379"),
            Some("127.0.0.1:2379".into())
        );
        assert_eq!(socket_addr("https://etcd:2379/"), Some("etcd:2379".into()));
        assert_eq!(socket_addr("http://etcd"), None);
    }

    #[test]
    fn progress_request_versions() {
        assert!(!progress_requests_ordered("3.4.23"));
        assert!(progress_requests_ordered("3.4.31"));
        assert!(!progress_requests_ordered("3.5.9"));
        assert!(progress_requests_ordered("3.5.13"));
        assert!(progress_requests_ordered("3.6.0"));
        assert!(progress_requests_ordered("garbage"));
    }
}
