#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `EtcdStore` against real etcd processes: semantics on one member, and fail-over when a
//! member of a three-member cluster is killed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kumo_storage::etcd::EtcdStore;
use kumo_storage::{
    CompactionConfig, KeyValue, Limits, RangeRequest, Revision, StorageError, Store, WatchEvent,
    WatchStream,
};
use kumo_testkit::EtcdCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn no_compaction() -> CompactionConfig {
    CompactionConfig {
        window: Duration::ZERO,
        ..CompactionConfig::default()
    }
}

async fn next_event(watch: &mut WatchStream) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(20), watch.next())
        .await
        .expect("watch event within 20 s")
        .expect("watch still open")
        .expect("watch event, not error")
}

/// Number of watchers member `endpoint` serves, from its Prometheus metrics.
async fn watchers_on(endpoint: &str) -> u64 {
    let addr = endpoint.trim_start_matches("http://");
    let Ok(mut conn) = tokio::net::TcpStream::connect(addr).await else {
        return 0;
    };
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .map(|v| v.trim().parse::<f64>().unwrap() as u64)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_member_semantics() {
    let cluster = EtcdCluster::start(1).await.unwrap();
    let store = EtcdStore::connect(&cluster.endpoints(), Limits::default(), no_compaction())
        .await
        .unwrap();
    let k = b"/registry/things/a";

    // create / AlreadyExists
    let a = store.create(k, b"1".to_vec()).await.unwrap();
    assert_eq!(a.version, 1);
    assert_eq!(a.create_revision, a.mod_revision);
    assert_eq!(store.current_revision().await.unwrap(), a.mod_revision);
    match store.create(k, b"x".to_vec()).await {
        Err(StorageError::AlreadyExists { current }) => assert_eq!(*current, a),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }

    // update: unconditional, guarded, conflict, missing key
    let b = store.update(k, b"2".to_vec(), None).await.unwrap();
    assert_eq!(
        (b.create_revision, b.version, b.value.as_slice()),
        (a.create_revision, 2, &b"2"[..])
    );
    assert!(b.mod_revision > a.mod_revision);
    let c = store
        .update(k, b"3".to_vec(), Some(b.mod_revision))
        .await
        .unwrap();
    assert_eq!(c.version, 3);
    match store.update(k, b"4".to_vec(), Some(b.mod_revision)).await {
        Err(StorageError::Conflict { expected, current }) => {
            assert_eq!(expected, b.mod_revision);
            assert_eq!(*current, c);
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert!(matches!(
        store
            .update(b"/registry/things/none", b"x".to_vec(), None)
            .await,
        Err(StorageError::NotFound)
    ));
    assert!(matches!(
        store
            .update(b"/registry/things/none", b"x".to_vec(), Some(5))
            .await,
        Err(StorageError::NotFound)
    ));

    // get, also at an old revision
    assert_eq!(store.get(k, None).await.unwrap().0, Some(c.clone()));
    let (old, at) = store.get(k, Some(a.mod_revision)).await.unwrap();
    assert_eq!((old, at), (Some(a.clone()), a.mod_revision));

    // limits, checked before anything is sent
    assert!(matches!(
        store.create(b"", b"x".to_vec()).await,
        Err(StorageError::EmptyKey)
    ));
    let big = vec![0u8; Limits::default().max_value_bytes + 1];
    assert!(matches!(
        store.create(b"/registry/big", big).await,
        Err(StorageError::ValueTooLarge { .. })
    ));
    // A value at the limit goes through.
    let at_limit = vec![7u8; Limits::default().max_value_bytes];
    let kv = store
        .create(b"/registry/big", at_limit.clone())
        .await
        .unwrap();
    assert_eq!(store.get(b"/registry/big", None).await.unwrap().0, Some(kv));

    // range: prefix, pagination, limit, count, more, InvalidRange
    for name in ["b", "c", "d"] {
        store
            .create(format!("/registry/things/{name}").as_bytes(), name.into())
            .await
            .unwrap();
    }
    store
        .create(b"/registry/thingsX", b"no".to_vec())
        .await
        .unwrap();
    let page = store
        .range(RangeRequest {
            prefix: b"/registry/things/".to_vec(),
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.kvs.len(), 2);
    assert_eq!(page.count, 4);
    assert!(page.more);
    assert_eq!(page.revision, store.current_revision().await.unwrap());
    let rest = store
        .range(RangeRequest {
            prefix: b"/registry/things/".to_vec(),
            start: Some(b"/registry/things/c".to_vec()),
            revision: Some(page.revision),
            ..Default::default()
        })
        .await
        .unwrap();
    let keys: Vec<_> = rest.kvs.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(
        keys,
        vec![
            b"/registry/things/c".to_vec(),
            b"/registry/things/d".to_vec()
        ]
    );
    assert_eq!(
        (rest.count, rest.more, rest.revision),
        (2, false, page.revision)
    );
    let all = store.range(RangeRequest::default()).await.unwrap();
    assert_eq!(all.count, 6);
    assert!(matches!(
        store
            .range(RangeRequest {
                prefix: b"/registry/things/".to_vec(),
                start: Some(b"/registry/other".to_vec()),
                ..Default::default()
            })
            .await,
        Err(StorageError::InvalidRange(_))
    ));

    // delete: guarded, conflict, missing
    let d = store
        .get(b"/registry/things/d", None)
        .await
        .unwrap()
        .0
        .unwrap();
    assert!(matches!(
        store
            .delete(b"/registry/things/d", Some(d.mod_revision - 1))
            .await,
        Err(StorageError::Conflict { .. })
    ));
    let (prev, del_rev) = store
        .delete(b"/registry/things/d", Some(d.mod_revision))
        .await
        .unwrap();
    assert_eq!(prev, d);
    assert_eq!(del_rev, store.current_revision().await.unwrap());
    assert!(matches!(
        store.delete(b"/registry/things/d", None).await,
        Err(StorageError::NotFound)
    ));

    // watch from a past revision replays, with previous values
    let mut w = store
        .watch(b"/registry/things/", a.mod_revision)
        .await
        .unwrap();
    match next_event(&mut w).await {
        WatchEvent::Put { kv, prev } => {
            assert_eq!(kv, b);
            assert_eq!(prev, Some(a.clone()));
        }
        other => panic!("unexpected {other:?}"),
    }
    // progress requests are answered
    let current = store.current_revision().await.unwrap();
    let mut last_seen = b.mod_revision;
    w.request_progress().await;
    loop {
        let ev = next_event(&mut w).await;
        assert!(ev.revision() >= last_seen);
        last_seen = ev.revision();
        if let WatchEvent::Delete {
            key,
            revision,
            prev,
        } = &ev
        {
            assert_eq!(key, b"/registry/things/d");
            assert_eq!(*revision, del_rev);
            assert_eq!(prev.as_ref(), Some(&d));
        }
        if matches!(ev, WatchEvent::Progress(r) if r >= current) {
            break;
        }
    }

    // future revisions
    assert!(matches!(
        store.get(k, Some(current + 100)).await,
        Err(StorageError::FutureRevision { requested, current: cur }) if requested == current + 100 && cur == current
    ));

    // compaction: reads and watches below it fail with Compacted
    store.compact(c.mod_revision).await.unwrap();
    store.compact(c.mod_revision).await.unwrap(); // again: no-op
    store.compact(a.mod_revision).await.unwrap(); // older: no-op
    match store.get(k, Some(a.mod_revision)).await {
        Err(StorageError::Compacted {
            requested,
            compacted,
        }) => assert_eq!((requested, compacted), (a.mod_revision, c.mod_revision)),
        other => panic!("expected Compacted, got {other:?}"),
    }
    match store.watch(b"/registry/things/", a.mod_revision).await {
        Err(StorageError::Compacted {
            requested,
            compacted,
        }) => assert_eq!((requested, compacted), (a.mod_revision, c.mod_revision)),
        Err(e) => panic!("expected Compacted, got {e:?}"),
        Ok(_) => panic!("expected Compacted, got a watch"),
    }
    // The last compacted revision itself is still readable.
    assert_eq!(
        store.get(k, Some(c.mod_revision)).await.unwrap().0,
        Some(c.clone())
    );
    assert!(matches!(
        store.compact(current + 100).await,
        Err(StorageError::FutureRevision { .. })
    ));

    // Dropping a watch cancels it on the server.
    drop(w);
    let endpoint = cluster.endpoints()[0].clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while watchers_on(&endpoint).await > 0 {
        assert!(Instant::now() < deadline, "watchers not canceled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes go on, acknowledged writes stay readable and a watch keeps delivering every
/// revision exactly once after the member serving the watch is killed with SIGKILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_survive_a_killed_member() {
    let mut cluster = EtcdCluster::start(3).await.unwrap();
    let endpoints = cluster.endpoints();
    let store: Arc<EtcdStore> = EtcdStore::connect(&endpoints, Limits::default(), no_compaction())
        .await
        .unwrap();
    let prefix = b"/registry/pods/";
    let start: Revision = store.current_revision().await.unwrap();
    let mut watch = store.watch(prefix, 0).await.unwrap();

    // The member serving the watch is the one to kill.
    let mut victim = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while victim.is_none() {
        for (i, e) in endpoints.iter().enumerate() {
            if watchers_on(e).await > 0 {
                victim = Some(i);
            }
        }
        assert!(Instant::now() < deadline, "no member reports the watch");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim = victim.unwrap();

    // A writer creating keys continuously; the member goes away in the middle.
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut acked: BTreeMap<usize, KeyValue> = BTreeMap::new();
            let mut errors = Vec::new();
            for i in 0..400 {
                let key = format!("/registry/pods/p{i:04}");
                match store.create(key.as_bytes(), format!("v{i}").into()).await {
                    Ok(kv) => {
                        acked.insert(i, kv);
                    }
                    // A write in flight when its member died has an unknown outcome.
                    Err(StorageError::Etcd(e)) => errors.push((i, e)),
                    Err(e) => panic!("write {i}: {e}"),
                }
                if i % 50 == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            (acked, errors)
        })
    };
    // Let the writer get going, then kill.
    let mut events = Vec::new();
    while events.len() < 100 {
        events.push(next_event(&mut watch).await);
    }
    let killed_at = store.current_revision().await.unwrap();
    cluster.kill_member(victim);
    assert_eq!(cluster.pid(victim), None);
    eprintln!("killed member {victim} at revision ~{killed_at}");

    let (acked, errors) = writer.await.unwrap();
    eprintln!(
        "{} writes acknowledged, {} failed: {errors:?}",
        acked.len(),
        errors.len()
    );
    // Only the writes around the kill may fail (in flight on the dead member, or waiting
    // for a dead leader until etcd's request timeout).
    assert!(errors.len() <= 5, "too many failed writes: {errors:?}");
    let after_kill = acked
        .values()
        .filter(|kv| kv.mod_revision > killed_at)
        .count();
    assert!(after_kill >= 200, "only {after_kill} writes after the kill");

    // More writes and reads, after the kill, through the same store.
    let last = store
        .create(b"/registry/pods/zz-last", b"end".to_vec())
        .await
        .unwrap();
    let end = store.current_revision().await.unwrap();
    assert_eq!(end, last.mod_revision);

    // Every acknowledged write is readable, at its revision and now.
    let all = store
        .range(RangeRequest {
            prefix: prefix.to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    let now: BTreeMap<Vec<u8>, KeyValue> =
        all.kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
    for kv in acked.values() {
        assert_eq!(now.get(&kv.key), Some(kv), "acknowledged write lost");
    }
    assert_eq!(now.get(&last.key), Some(&last));
    for kv in acked.values().step_by(37) {
        let (read, at) = store.get(&kv.key, Some(kv.mod_revision)).await.unwrap();
        assert_eq!((read.as_ref(), at), (Some(kv), kv.mod_revision));
    }

    // The watch opened before the kill delivered every revision once, in order.
    while events.last().map(|e| e.revision()) != Some(end) {
        events.push(next_event(&mut watch).await);
    }
    let revisions: Vec<Revision> = events
        .iter()
        .filter(|e| !matches!(e, WatchEvent::Progress(_)))
        .map(|e| e.revision())
        .collect();
    let expected: Vec<Revision> = (start + 1..=end).collect();
    assert_eq!(
        revisions, expected,
        "watch revisions have gaps or duplicates"
    );
    for ev in &events {
        if let WatchEvent::Put { kv, prev } = ev {
            assert_eq!(kv.version, 1);
            assert_eq!(prev, &None);
            assert_eq!(now.get(&kv.key), Some(kv));
        }
    }
    // The watch keeps working for new writes too.
    let again = store
        .update(&last.key, b"again".to_vec(), Some(last.mod_revision))
        .await
        .unwrap();
    match next_event(&mut watch).await {
        WatchEvent::Put { kv, prev } => {
            assert_eq!(kv, again);
            assert_eq!(prev, Some(last));
        }
        other => panic!("unexpected {other:?}"),
    }
}
