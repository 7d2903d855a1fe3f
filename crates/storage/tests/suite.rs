//! The storage semantics, one suite run against both backends: the embedded store and a
//! real etcd started by the test (Debian's etcd-server, installed by scripts/test).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kumo_storage::embedded::{EmbeddedConfig, EmbeddedStore};
use kumo_storage::etcd::EtcdStore;
use kumo_storage::{
    CompactionConfig, Limits, RangeRequest, Revision, StorageError, Store, WatchEvent, WatchStream,
};

/// A store under test and whatever keeps it alive (a temp dir, an etcd process).
struct Harness {
    store: Arc<dyn Store>,
    _guard: Box<dyn Any + Send>,
}

fn compaction(window_ms: u64) -> CompactionConfig {
    CompactionConfig {
        window: Duration::from_millis(window_ms),
        batch: 7, // small, so physical compaction takes several steps
    }
}

async fn embedded(window_ms: u64) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EmbeddedConfig::new(dir.path());
    cfg.compaction = compaction(window_ms);
    let store = EmbeddedStore::open(cfg).await.unwrap();
    Harness {
        store,
        _guard: Box::new(dir),
    }
}

async fn etcd(window_ms: u64) -> Harness {
    let cluster = kumo_testkit::EtcdCluster::start(1).await.unwrap();
    let store = EtcdStore::connect(
        &cluster.endpoints(),
        Limits::default(),
        compaction(window_ms),
    )
    .await
    .unwrap();
    Harness {
        store,
        _guard: Box::new(cluster),
    }
}

/// Instantiates every case of the suite for one backend.
macro_rules! suite {
    ($backend:ident) => {
        mod $backend {
            use super::*;
            async fn harness() -> Harness {
                super::$backend(0).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn crud_and_revisions() {
                cases::crud_and_revisions(harness().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cas_conflicts() {
                cases::cas_conflicts(harness().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_cas_loses_no_update() {
                cases::concurrent_cas_loses_no_update(harness().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pagination_at_fixed_revision() {
                cases::pagination_at_fixed_revision(harness().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn prefix_boundaries() {
                cases::prefix_boundaries(harness().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn watch_order_and_prev_values() {
                cases::watch_order_and_prev_values(harness().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn watch_resumes_without_gap_or_duplicate() {
                cases::watch_resumes_without_gap_or_duplicate(harness().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn progress_notifications() {
                cases::progress_notifications(harness().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn compaction_and_compacted_errors() {
                cases::compaction_and_compacted_errors(harness().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn automatic_compaction() {
                cases::automatic_compaction(super::$backend(300).await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn size_limits() {
                cases::size_limits(harness().await.store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn future_revisions() {
                cases::future_revisions(harness().await.store).await
            }
        }
    };
}

suite!(embedded);
suite!(etcd);

/// Receives the next non-progress event, failing the test after 10 s.
async fn next_event(w: &mut WatchStream) -> WatchEvent {
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("watch event within 10 s")
            .expect("watch still open")
            .expect("watch event, not an error");
        if !matches!(ev, WatchEvent::Progress(_)) {
            return ev;
        }
    }
}

mod cases {
    use super::*;

    pub async fn crud_and_revisions(s: Arc<dyn Store>) {
        let r0 = s.current_revision().await.unwrap();
        let a = s
            .create(b"/registry/pods/default/a", b"v1".to_vec())
            .await
            .unwrap();
        assert_eq!(a.mod_revision, r0 + 1);
        assert_eq!(a.create_revision, r0 + 1);
        assert_eq!(a.version, 1);
        assert_eq!(s.current_revision().await.unwrap(), r0 + 1);

        let a2 = s
            .update(
                b"/registry/pods/default/a",
                b"v2".to_vec(),
                Some(a.mod_revision),
            )
            .await
            .unwrap();
        assert_eq!(a2.mod_revision, r0 + 2);
        assert_eq!(a2.create_revision, r0 + 1);
        assert_eq!(a2.version, 2);
        assert_eq!(a2.value, b"v2");

        // Unconditional update.
        let a3 = s
            .update(b"/registry/pods/default/a", b"v3".to_vec(), None)
            .await
            .unwrap();
        assert_eq!((a3.mod_revision, a3.version), (r0 + 3, 3));

        // Reads at the latest and at past revisions.
        let (got, at) = s.get(b"/registry/pods/default/a", None).await.unwrap();
        assert_eq!(got.unwrap(), a3);
        assert_eq!(at, r0 + 3);
        let (old, at) = s
            .get(b"/registry/pods/default/a", Some(a.mod_revision))
            .await
            .unwrap();
        assert_eq!(old.unwrap(), a);
        assert_eq!(at, a.mod_revision);
        let (before, _) = s
            .get(b"/registry/pods/default/a", Some(r0.max(1)))
            .await
            .unwrap();
        if r0 >= 1 {
            assert!(before.is_none());
        }

        let (prev, drev) = s
            .delete(b"/registry/pods/default/a", Some(a3.mod_revision))
            .await
            .unwrap();
        assert_eq!(prev, a3);
        assert_eq!(drev, r0 + 4);
        assert!(s
            .get(b"/registry/pods/default/a", None)
            .await
            .unwrap()
            .0
            .is_none());
        // History before the delete is still readable.
        assert_eq!(
            s.get(b"/registry/pods/default/a", Some(r0 + 3))
                .await
                .unwrap()
                .0
                .unwrap(),
            a3
        );

        // Re-creating starts a new generation.
        let again = s
            .create(b"/registry/pods/default/a", b"n".to_vec())
            .await
            .unwrap();
        assert_eq!(again.create_revision, r0 + 5);
        assert_eq!(again.version, 1);
    }

    pub async fn cas_conflicts(s: Arc<dyn Store>) {
        let k: &[u8] = b"/registry/configmaps/ns/cm";
        let v1 = s.create(k, b"1".to_vec()).await.unwrap();
        match s.create(k, b"x".to_vec()).await {
            Err(StorageError::AlreadyExists { current }) => assert_eq!(*current, v1),
            other => panic!("create of an existing key: {other:?}"),
        }
        let v2 = s
            .update(k, b"2".to_vec(), Some(v1.mod_revision))
            .await
            .unwrap();
        // A stale writer loses and learns the current value.
        match s.update(k, b"stale".to_vec(), Some(v1.mod_revision)).await {
            Err(StorageError::Conflict { expected, current }) => {
                assert_eq!(expected, v1.mod_revision);
                assert_eq!(*current, v2);
            }
            other => panic!("stale update: {other:?}"),
        }
        match s.delete(k, Some(v1.mod_revision)).await {
            Err(StorageError::Conflict { current, .. }) => assert_eq!(*current, v2),
            other => panic!("stale delete: {other:?}"),
        }
        // Nothing was written by the failed attempts.
        assert_eq!(s.current_revision().await.unwrap(), v2.mod_revision);
        assert_eq!(s.get(k, None).await.unwrap().0.unwrap(), v2);
        assert!(matches!(
            s.update(b"/registry/configmaps/ns/missing", b"x".to_vec(), None)
                .await,
            Err(StorageError::NotFound)
        ));
        assert!(matches!(
            s.update(b"/registry/configmaps/ns/missing", b"x".to_vec(), Some(3))
                .await,
            Err(StorageError::NotFound)
        ));
        assert!(matches!(
            s.delete(b"/registry/configmaps/ns/missing", None).await,
            Err(StorageError::NotFound)
        ));
        s.delete(k, Some(v2.mod_revision)).await.unwrap();
        assert!(matches!(
            s.update(k, b"x".to_vec(), Some(v2.mod_revision)).await,
            Err(StorageError::NotFound)
        ));
    }

    pub async fn concurrent_cas_loses_no_update(s: Arc<dyn Store>) {
        let k: &[u8] = b"/registry/counters/c";
        s.create(k, b"0".to_vec()).await.unwrap();
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut conflicts = 0;
                for _ in 0..25 {
                    loop {
                        let (cur, _) = s.get(k, None).await.unwrap();
                        let cur = cur.unwrap();
                        let n: u64 = String::from_utf8(cur.value.clone())
                            .unwrap()
                            .parse()
                            .unwrap();
                        match s
                            .update(k, (n + 1).to_string().into_bytes(), Some(cur.mod_revision))
                            .await
                        {
                            Ok(_) => break,
                            Err(StorageError::Conflict { .. }) => conflicts += 1,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                conflicts
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let (v, _) = s.get(k, None).await.unwrap();
        let v = v.unwrap();
        assert_eq!(v.value, b"200");
        assert_eq!(v.version, 201);
    }

    pub async fn pagination_at_fixed_revision(s: Arc<dyn Store>) {
        for i in 0..100 {
            s.create(
                format!("/registry/pods/ns/p{i:03}").as_bytes(),
                vec![b'x'; 10],
            )
            .await
            .unwrap();
        }
        // Something outside the prefix on both sides.
        s.create(b"/registry/pods/nr", b"o".to_vec()).await.unwrap();
        s.create(b"/registry/pods/nt", b"o".to_vec()).await.unwrap();
        let snapshot = s
            .range(RangeRequest {
                prefix: b"/registry/pods/ns/".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(snapshot.count, 100);
        assert!(!snapshot.more);
        let rev = snapshot.revision;

        // Writes continue while the pages are read.
        let writer = {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..60 {
                    let k = format!("/registry/pods/ns/p{:03}", (i * 7) % 100);
                    match i % 3 {
                        0 => {
                            s.update(k.as_bytes(), b"changed".to_vec(), None)
                                .await
                                .unwrap();
                        }
                        1 => {
                            let _ = s.delete(k.as_bytes(), None).await;
                        }
                        _ => {
                            s.create(
                                format!("/registry/pods/ns/q{i:03}").as_bytes(),
                                b"n".to_vec(),
                            )
                            .await
                            .unwrap();
                        }
                    }
                }
            })
        };
        let mut pages = Vec::new();
        let mut start: Option<Vec<u8>> = None;
        loop {
            let page = s
                .range(RangeRequest {
                    prefix: b"/registry/pods/ns/".to_vec(),
                    start: start.clone(),
                    limit: 9,
                    revision: Some(rev),
                })
                .await
                .unwrap();
            assert_eq!(page.revision, rev);
            assert!(page.kvs.len() <= 9);
            // count is everything from the start key on; more says whether a page follows.
            assert_eq!(page.count, 100 - pages.len());
            assert_eq!(page.more, page.count > page.kvs.len());
            let Some(last) = page.kvs.last() else { break };
            let mut next = last.key.clone();
            next.push(0);
            start = Some(next);
            pages.extend(page.kvs);
            if !page.more {
                break;
            }
            tokio::task::yield_now().await;
        }
        writer.await.unwrap();
        assert_eq!(pages, snapshot.kvs);
        // The latest view did change.
        let now = s
            .range(RangeRequest {
                prefix: b"/registry/pods/ns/".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(now.revision > rev);
        assert_ne!(now.kvs, snapshot.kvs);
    }

    pub async fn prefix_boundaries(s: Arc<dyn Store>) {
        for k in ["/a/x", "/a/y", "/a0", "/ab", "/a", "/b/x"] {
            s.create(k.as_bytes(), k.as_bytes().to_vec()).await.unwrap();
        }
        let keys = |r: kumo_storage::RangeResponse| {
            r.kvs
                .into_iter()
                .map(|kv| String::from_utf8(kv.key).unwrap())
                .collect::<Vec<_>>()
        };
        let r = s
            .range(RangeRequest {
                prefix: b"/a/".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(keys(r), ["/a/x", "/a/y"]);
        let r = s
            .range(RangeRequest {
                prefix: b"/a/".to_vec(),
                limit: 1,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!((r.count, r.more), (2, true));
        assert_eq!(keys(r), ["/a/x"]);
        let all = s.range(RangeRequest::default()).await.unwrap();
        assert_eq!(all.count, 6);
        assert!(matches!(
            s.range(RangeRequest {
                prefix: b"/a/".to_vec(),
                start: Some(b"/b".to_vec()),
                ..Default::default()
            })
            .await,
            Err(StorageError::InvalidRange(_))
        ));
        // A start key past every key of the prefix yields nothing.
        let r = s
            .range(RangeRequest {
                prefix: b"/a/".to_vec(),
                start: Some(b"/a/z".to_vec()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!((r.count, r.more, r.kvs.len()), (0, false, 0));
    }

    pub async fn watch_order_and_prev_values(s: Arc<dyn Store>) {
        let from = s.current_revision().await.unwrap();
        let mut w = s.watch(b"/registry/pods/", from).await.unwrap();
        // Concurrent writers on the watched prefix and elsewhere.
        let mut tasks = Vec::new();
        for t in 0..4 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut writes = 0;
                for i in 0..30 {
                    let k = format!("/registry/pods/ns/t{t}-{}", i % 5);
                    let r = if i % 7 == 6 {
                        s.delete(k.as_bytes(), None).await.map(|_| ())
                    } else {
                        match s
                            .create(k.as_bytes(), format!("{t}-{i}").into_bytes())
                            .await
                        {
                            Err(StorageError::AlreadyExists { .. }) => s
                                .update(k.as_bytes(), format!("{t}-{i}").into_bytes(), None)
                                .await
                                .map(|_| ()),
                            r => r.map(|_| ()),
                        }
                    };
                    match r {
                        Ok(()) => writes += 1,
                        Err(StorageError::NotFound) => {}
                        Err(e) => panic!("{e}"),
                    }
                    s.create(format!("/registry/other/{t}-{i}").as_bytes(), b"o".to_vec())
                        .await
                        .unwrap();
                }
                writes
            }));
        }
        let mut expected = 0;
        for t in tasks {
            expected += t.await.unwrap();
        }
        // Replay the events into a model and compare with the store.
        let mut model: BTreeMap<Vec<u8>, kumo_storage::KeyValue> = BTreeMap::new();
        let mut last: Revision = from;
        for _ in 0..expected {
            let ev = next_event(&mut w).await;
            assert!(ev.revision() > last, "revisions strictly increase");
            last = ev.revision();
            match ev {
                WatchEvent::Put { kv, prev } => {
                    assert!(kv.key.starts_with(b"/registry/pods/"));
                    assert_eq!(prev.as_ref(), model.get(&kv.key), "prev of a put");
                    if kv.version == 1 {
                        assert_eq!(kv.create_revision, kv.mod_revision);
                    }
                    model.insert(kv.key.clone(), kv);
                }
                WatchEvent::Delete { key, prev, .. } => {
                    let had = model.remove(&key);
                    assert!(had.is_some(), "delete of a key the watch saw");
                    assert_eq!(prev, had, "prev of a delete");
                }
                WatchEvent::Progress(_) => unreachable!(),
            }
        }
        let now = s
            .range(RangeRequest {
                prefix: b"/registry/pods/".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(model.into_values().collect::<Vec<_>>(), now.kvs);
        // No further (duplicate) event is pending.
        w.request_progress().await;
        let p = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(matches!(p, WatchEvent::Progress(_)), "got {p:?}");
    }

    pub async fn watch_resumes_without_gap_or_duplicate(s: Arc<dyn Store>) {
        let from = s.current_revision().await.unwrap();
        for i in 0..40 {
            s.create(format!("/registry/cm/{i:02}").as_bytes(), b"v".to_vec())
                .await
                .unwrap();
        }
        // The whole history from `from`, for reference.
        let mut full = s.watch(b"/registry/cm/", from).await.unwrap();
        let mut all = Vec::new();
        for _ in 0..40 {
            all.push(next_event(&mut full).await);
        }
        // A watcher that reads 15 events, goes away, and resumes from the last one it saw.
        let mut w = s.watch(b"/registry/cm/", from).await.unwrap();
        let mut got = Vec::new();
        for _ in 0..15 {
            got.push(next_event(&mut w).await);
        }
        drop(w);
        let resume = got.last().unwrap().revision();
        let mut w = s.watch(b"/registry/cm/", resume).await.unwrap();
        for _ in 15..40 {
            got.push(next_event(&mut w).await);
        }
        assert_eq!(got, all);
        // Live events keep flowing to both.
        s.create(b"/registry/cm/live", b"l".to_vec()).await.unwrap();
        let a = next_event(&mut w).await;
        let b = next_event(&mut full).await;
        assert_eq!(a, b);
        assert_eq!(a.revision(), s.current_revision().await.unwrap());
        // from_revision 0: only what happens from now on.
        let mut now = s.watch(b"/registry/cm/", 0).await.unwrap();
        s.update(b"/registry/cm/live", b"m".to_vec(), None)
            .await
            .unwrap();
        match next_event(&mut now).await {
            WatchEvent::Put { kv, prev } => {
                assert_eq!(kv.value, b"m");
                assert_eq!(prev.unwrap().value, b"l");
            }
            other => panic!("{other:?}"),
        }
    }

    pub async fn progress_notifications(s: Arc<dyn Store>) {
        s.create(b"/registry/a/1", b"x".to_vec()).await.unwrap();
        let mut w = s.watch(b"/registry/idle/", 0).await.unwrap();
        // Writes elsewhere move the revision without events for this watch.
        for i in 0..5 {
            s.create(format!("/registry/b/{i}").as_bytes(), b"x".to_vec())
                .await
                .unwrap();
        }
        let current = s.current_revision().await.unwrap();
        let mut seen = None;
        // The request may race with the watch's own synchronisation; ask until the
        // notification reaches the current revision.
        for _ in 0..50 {
            w.request_progress().await;
            match tokio::time::timeout(Duration::from_millis(500), w.next()).await {
                Ok(Some(Ok(WatchEvent::Progress(r)))) => {
                    assert!(r <= current);
                    seen = Some(r);
                    if r == current {
                        break;
                    }
                }
                Ok(other) => panic!("an idle watch got {other:?}"),
                Err(_) => {}
            }
        }
        assert_eq!(
            seen,
            Some(current),
            "progress notification at the current revision"
        );
    }

    pub async fn compaction_and_compacted_errors(s: Arc<dyn Store>) {
        let k: &[u8] = b"/registry/leases/l";
        let v1 = s.create(k, b"1".to_vec()).await.unwrap();
        let mut last = v1.clone();
        for i in 2..=10 {
            last = s.update(k, i.to_string().into_bytes(), None).await.unwrap();
        }
        let gone = s
            .create(b"/registry/leases/gone", b"g".to_vec())
            .await
            .unwrap();
        let (_, drev) = s.delete(b"/registry/leases/gone", None).await.unwrap();
        let keep = s
            .create(b"/registry/leases/keep", b"k".to_vec())
            .await
            .unwrap();
        let c = last.mod_revision + 1; // after the 10th update, before "gone" is deleted
        assert!(c < drev);
        s.compact(c).await.unwrap();
        // Compacting again, or lower, is a no-op.
        s.compact(c).await.unwrap();
        s.compact(c - 3).await.unwrap();

        match s.get(k, Some(v1.mod_revision)).await {
            Err(StorageError::Compacted {
                requested,
                compacted,
            }) => {
                assert_eq!(requested, v1.mod_revision);
                assert_eq!(compacted, c);
            }
            other => panic!("read below the compacted revision: {other:?}"),
        }
        assert!(s
            .range(RangeRequest {
                prefix: b"/registry/".to_vec(),
                revision: Some(c - 1),
                ..Default::default()
            })
            .await
            .unwrap_err()
            .is_compacted());
        // At and after the compacted revision everything is still there.
        assert_eq!(s.get(k, Some(c)).await.unwrap().0.unwrap(), last);
        assert_eq!(
            s.get(b"/registry/leases/gone", Some(c))
                .await
                .unwrap()
                .0
                .unwrap(),
            gone
        );
        assert!(s
            .get(b"/registry/leases/gone", None)
            .await
            .unwrap()
            .0
            .is_none());
        assert_eq!(
            s.get(b"/registry/leases/keep", None)
                .await
                .unwrap()
                .0
                .unwrap(),
            keep
        );
        // A watch from before the compacted revision fails with Compacted, at once or as
        // its first item.
        match s.watch(b"/registry/leases/", v1.mod_revision).await {
            Err(e) => assert!(e.is_compacted(), "{e}"),
            Ok(mut w) => {
                let first = tokio::time::timeout(Duration::from_secs(10), w.next())
                    .await
                    .unwrap()
                    .unwrap();
                assert!(first.unwrap_err().is_compacted());
            }
        }
        // A watch from the compacted revision gets everything after it.
        let mut w = s.watch(b"/registry/leases/", c).await.unwrap();
        // ("gone" was created at the compacted revision itself, so its deletion comes first.)
        assert_eq!(gone.mod_revision, c);
        let e1 = next_event(&mut w).await;
        assert!(
            matches!(&e1, WatchEvent::Delete { revision, prev: Some(p), .. } if *revision == drev && *p == gone),
            "{e1:?}"
        );
        let e2 = next_event(&mut w).await;
        assert_eq!(e2.revision(), keep.mod_revision);
        // Writes go on after compaction, with revisions still increasing.
        let after = s
            .update(k, b"after".to_vec(), Some(last.mod_revision))
            .await
            .unwrap();
        assert_eq!(after.version, 11);
        assert_eq!(after.create_revision, v1.create_revision);
    }

    pub async fn automatic_compaction(s: Arc<dyn Store>) {
        // The harness sets a 300 ms window.
        let k: &[u8] = b"/registry/events/e";
        let v1 = s.create(k, b"1".to_vec()).await.unwrap();
        let mut deadline = 100;
        loop {
            s.update(k, b"x".to_vec(), None).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            match s.get(k, Some(v1.mod_revision)).await {
                Err(e) if e.is_compacted() => break,
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
            deadline -= 1;
            assert!(
                deadline > 0,
                "history older than the window was never compacted"
            );
        }
        // Recent history is kept: the revision before a fresh write is still readable (it
        // could only be gone if it had been current for a whole window).
        let before = s.update(k, b"y".to_vec(), None).await.unwrap().mod_revision - 1;
        s.update(k, b"z".to_vec(), None).await.unwrap();
        s.get(k, Some(before)).await.unwrap();
    }

    pub async fn size_limits(s: Arc<dyn Store>) {
        let limits = Limits::default();
        assert_eq!(limits.max_value_bytes, 1_572_864);
        let big = vec![7u8; 1024 * 1024];
        let kv = s
            .create(b"/registry/secrets/ns/big", big.clone())
            .await
            .unwrap();
        assert_eq!(
            s.get(b"/registry/secrets/ns/big", None)
                .await
                .unwrap()
                .0
                .unwrap()
                .value,
            big
        );
        let too_big = vec![7u8; limits.max_value_bytes + 1];
        let before = s.current_revision().await.unwrap();
        assert!(matches!(
            s.create(b"/registry/secrets/ns/huge", too_big.clone()).await,
            Err(StorageError::ValueTooLarge { size, limit }) if size == too_big.len() && limit == limits.max_value_bytes
        ));
        assert!(matches!(
            s.update(b"/registry/secrets/ns/big", too_big, Some(kv.mod_revision))
                .await,
            Err(StorageError::ValueTooLarge { .. })
        ));
        assert!(matches!(
            s.create(b"", b"x".to_vec()).await,
            Err(StorageError::EmptyKey)
        ));
        assert!(matches!(
            s.get(b"", None).await,
            Err(StorageError::EmptyKey)
        ));
        let long_key = vec![b'k'; limits.max_key_bytes + 1];
        assert!(matches!(
            s.create(&long_key, b"x".to_vec()).await,
            Err(StorageError::KeyTooLarge { .. })
        ));
        // Nothing was written by the refused requests, and the big value is intact.
        assert_eq!(s.current_revision().await.unwrap(), before);
        assert_eq!(
            s.get(b"/registry/secrets/ns/big", None)
                .await
                .unwrap()
                .0
                .unwrap(),
            kv
        );
    }

    pub async fn future_revisions(s: Arc<dyn Store>) {
        s.create(b"/registry/x", b"1".to_vec()).await.unwrap();
        let cur = s.current_revision().await.unwrap();
        assert!(matches!(
            s.get(b"/registry/x", Some(cur + 10)).await,
            Err(StorageError::FutureRevision { requested, .. }) if requested == cur + 10
        ));
        assert!(matches!(
            s.range(RangeRequest {
                prefix: b"/registry/".to_vec(),
                revision: Some(cur + 1),
                ..Default::default()
            })
            .await,
            Err(StorageError::FutureRevision { .. })
        ));
        // A watch may start in the future: it sees writes past that revision only.
        let mut w = s.watch(b"/registry/", cur + 1).await.unwrap();
        s.update(b"/registry/x", b"2".to_vec(), None).await.unwrap(); // cur + 1: skipped
        s.update(b"/registry/x", b"3".to_vec(), None).await.unwrap(); // cur + 2
        match next_event(&mut w).await {
            WatchEvent::Put { kv, .. } => {
                assert_eq!((kv.mod_revision, kv.value), (cur + 2, b"3".to_vec()))
            }
            other => panic!("{other:?}"),
        }
    }
}
