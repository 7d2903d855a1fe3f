//! The state's journal: changes are appended rather than rewriting the whole state, and a
//! restart replays them; a torn last record is dropped, corruption before intact records is
//! refused, and compaction survives a crash between its two steps.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::*;
use kumo_cloud::state::{CompactionPolicy, Store, JOURNAL_FILE, STATE_FILE};
use kumo_cloud::*;

fn lb_req(name: &str, targets: Vec<String>) -> CreateLoadBalancerRequest {
    CreateLoadBalancerRequest {
        name: name.into(),
        listeners: vec![Listener {
            port: 80,
            protocol: Protocol::Tcp,
            target_port: 30080,
        }],
        targets,
        ..Default::default()
    }
}

fn dump(s: &Store) -> serde_json::Value {
    s.read(|s| serde_json::to_value(s).expect("serializes"))
}

fn lb_names(s: &Store) -> Vec<String> {
    let mut v: Vec<String> =
        s.read(|s| s.load_balancers(None).into_iter().map(|l| l.name).collect());
    v.sort();
    v
}

/// The byte offsets where each journal record starts, from the framing.
fn record_offsets(path: &Path) -> Vec<usize> {
    let b = std::fs::read(path).expect("journal");
    let mut out = Vec::new();
    let mut off = 0;
    while off + 12 <= b.len() {
        out.push(off);
        let len = u32::from_le_bytes(b[off..off + 4].try_into().expect("4")) as usize;
        off += 12 + len;
    }
    assert_eq!(off, b.len(), "whole records");
    out
}

async fn make_lbs(s: &Store, names: &[&str]) {
    for n in names {
        s.write(|st| st.create_load_balancer(lb_req(n, vec![])))
            .await
            .expect("create");
    }
}

#[tokio::test]
async fn a_torn_last_record_is_dropped_and_appending_goes_on() {
    let dir = tempfile::tempdir().expect("tmp");
    let jpath = dir.path().join(JOURNAL_FILE);
    let s = Store::open(dir.path()).expect("open");
    make_lbs(&s, &["a", "b", "c"]).await;
    drop(s);
    let offsets = record_offsets(&jpath);
    assert_eq!(offsets.len(), 4, "a header and one record per change");
    let full = std::fs::metadata(&jpath).expect("meta").len();
    // A crash in the middle of the last append: only part of it reached the disk.
    let last = offsets[3] as u64;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&jpath)
        .expect("open");
    f.set_len(full - 7).expect("truncate");
    drop(f);

    let s = Store::open(dir.path()).expect("a torn tail is not an error");
    assert_eq!(lb_names(&s), ["a", "b"]);
    assert_eq!(
        std::fs::metadata(&jpath).expect("meta").len(),
        last,
        "the torn record is cut off before anything is appended"
    );
    make_lbs(&s, &["d"]).await;
    drop(s);

    // A tail of zeros (the file grew but the data never landed) is torn too.
    let mut b = std::fs::read(&jpath).expect("read");
    b.extend_from_slice(&[0; 100]);
    std::fs::write(&jpath, &b).expect("write");
    let s = Store::open(dir.path()).expect("reopen");
    assert_eq!(lb_names(&s), ["a", "b", "d"]);
    drop(s);
    let s = Store::open(dir.path()).expect("reopen again");
    assert_eq!(lb_names(&s).len(), 3);
}

#[tokio::test]
async fn a_corrupt_record_in_the_middle_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let jpath = dir.path().join(JOURNAL_FILE);
    let s = Store::open(dir.path()).expect("open");
    make_lbs(&s, &["a", "b", "c"]).await;
    drop(s);
    let offsets = record_offsets(&jpath);
    let mut b = std::fs::read(&jpath).expect("read");
    // One flipped bit in the second change's payload.
    b[offsets[2] + 20] ^= 0x01;
    std::fs::write(&jpath, &b).expect("write");
    let e = Store::open(dir.path()).err().expect("refused");
    assert!(e.contains("corrupt cloud journal"), "{e}");
    assert!(
        e.contains(&format!("record 2 at byte {}", offsets[2])),
        "{e}"
    );
    assert!(e.contains("payload checksum mismatch"), "{e}");
    // The server refuses too, with the same message, instead of starting with lost changes.
    let e = CloudServer::start(CloudConfig::new(dir.path()))
        .await
        .err()
        .expect("refused");
    assert!(e.contains("corrupt cloud journal"), "{e}");
    // A damaged length is recognised as damage (the header has its own checksum).
    b[offsets[2] + 20] ^= 0x01;
    b[offsets[1]] ^= 0x10;
    std::fs::write(&jpath, &b).expect("write");
    let e = Store::open(dir.path()).err().expect("refused");
    assert!(
        e.contains("record 1") && e.contains("header checksum"),
        "{e}"
    );
}

#[tokio::test]
async fn many_changes_replay_after_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    let snapshot = std::fs::read(dir.path().join(STATE_FILE)).expect("snapshot");
    let mut ids = Vec::new();
    for _ in 0..6 {
        let i = c
            .run_instance(&RunInstanceRequest::default())
            .await
            .expect("run");
        ids.push(running(&c, &i.id).await.id);
    }
    let mut lbs = Vec::new();
    for n in 0..12 {
        lbs.push(
            c.create_load_balancer(&lb_req(&format!("lb-{n}"), ids[..2].to_vec()))
                .await
                .expect("lb")
                .id,
        );
    }
    for round in 0..4 {
        for (n, lb) in lbs.iter().enumerate() {
            c.update_load_balancer(
                lb,
                &UpdateLoadBalancerRequest {
                    targets: Some(ids[..(n + round) % ids.len() + 1].to_vec()),
                    ..Default::default()
                },
            )
            .await
            .expect("update");
        }
    }
    for lb in &lbs[..3] {
        c.delete_load_balancer(lb).await.expect("delete");
    }
    c.terminate_instance(&ids[5]).await.expect("terminate");
    c.wait_for_instance_state(
        &ids[5],
        InstanceState::Terminated,
        std::time::Duration::from_secs(10),
    )
    .await
    .expect("terminated");
    let table = c.main_route_table().await.expect("table").id;
    c.create_route(
        &table,
        &CreateRouteRequest {
            destination_cidr: "10.244.1.0/24".into(),
            instance_id: ids[0].clone(),
            name: "n0".into(),
            description: String::new(),
        },
    )
    .await
    .expect("route");
    c.set_quotas(&UpdateQuotasRequest {
        max_load_balancers: Some(77),
        ..Default::default()
    })
    .await
    .expect("quotas");
    let instances = c
        .list_instances(&InstanceFilter::default())
        .await
        .expect("list");
    let balancers = c.list_load_balancers().await.expect("list");
    s.shutdown().await;
    drop(c);
    assert_eq!(
        std::fs::read(dir.path().join(STATE_FILE)).expect("snapshot"),
        snapshot,
        "the changes went to the journal, not into a rewritten snapshot"
    );
    // Every change's own values, not the whole state: the journal stays far smaller than
    // 90-odd rewrites of it would be.
    let journal = std::fs::metadata(dir.path().join(JOURNAL_FILE))
        .expect("journal")
        .len();
    assert!(
        record_offsets(&dir.path().join(JOURNAL_FILE)).len() > 70,
        "one record per change"
    );
    assert!(journal < 200_000, "{journal} bytes");

    let (s, c, _) = start(dir.path()).await;
    assert_eq!(
        c.list_instances(&InstanceFilter::default())
            .await
            .expect("list"),
        instances
    );
    let again = c.list_load_balancers().await.expect("list");
    assert_eq!(
        serde_json::to_value(&again).expect("json"),
        serde_json::to_value(&balancers).expect("json")
    );
    assert_eq!(again.len(), 9);
    assert_eq!(c.list_routes(&table).await.expect("routes").len(), 2);
    assert_eq!(c.quotas().await.expect("quotas").max_load_balancers, 77);
    s.shutdown().await;
}

#[tokio::test]
async fn compaction_then_restart_and_a_crash_between_its_steps() {
    let dir = tempfile::tempdir().expect("tmp");
    let jpath = dir.path().join(JOURNAL_FILE);
    let policy = CompactionPolicy {
        max_records: 5,
        min_bytes: u64::MAX,
    };
    let s = Store::open_with(dir.path(), policy).expect("open");
    let inst = s
        .write(|st| st.run_instance(RunInstanceRequest::default()))
        .await
        .expect("run");
    make_lbs(&s, &["a", "b", "c", "d"]).await;
    assert_eq!(s.stats().await.generation, 0);
    assert_eq!(s.stats().await.journal_records, 5);
    // The journal as it was before the compaction: what a crash between writing the new
    // snapshot and replacing the journal leaves behind.
    let stale = std::fs::read(&jpath).expect("journal");
    make_lbs(&s, &["e"]).await;
    let st = s.stats().await;
    assert_eq!((st.generation, st.journal_records), (1, 0), "{st:?}");
    let snap: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(STATE_FILE)).expect("snapshot"))
            .expect("json");
    assert_eq!(snap["generation"], 1);
    assert_eq!(snap["loadBalancers"].as_object().expect("map").len(), 5);
    let compacted = dump(&s);
    drop(s);
    // The crash between the steps: the new snapshot, the old journal. Replaying it would
    // be wrong (it is older than the snapshot); it is recognised by its generation.
    std::fs::write(&jpath, &stale).expect("stale journal");
    let s = Store::open_with(dir.path(), policy).expect("a stale journal is recognised");
    assert_eq!(dump(&s), compacted);
    assert_eq!(s.stats().await.journal_records, 0);
    for n in 0..12 {
        let id = s.read(|st| st.load_balancers(Some("a"))[0].id.clone());
        s.write(|st| {
            st.update_load_balancer(
                &id,
                UpdateLoadBalancerRequest {
                    targets: Some(if n % 2 == 0 {
                        vec![inst.id.clone()]
                    } else {
                        vec![]
                    }),
                    ..Default::default()
                },
            )
        })
        .await
        .expect("update");
    }
    make_lbs(&s, &["f"]).await;
    let st = s.stats().await;
    assert!(st.generation >= 3, "{st:?}");
    let before = dump(&s);
    drop(s);
    for f in [STATE_FILE, JOURNAL_FILE] {
        let mode = std::fs::metadata(dir.path().join(f))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f} holds secrets");
    }

    let s = Store::open_with(dir.path(), policy).expect("reopen");
    assert_eq!(dump(&s), before);
    assert_eq!(
        s.read(|st| st.load_balancers(Some("a"))[0].targets.len()),
        0
    );
    make_lbs(&s, &["g"]).await;
    drop(s);
    let s = Store::open_with(dir.path(), policy).expect("reopen");
    assert_eq!(lb_names(&s), ["a", "b", "c", "d", "e", "f", "g"]);

    // A journal newer than the snapshot means the snapshot was swapped for an older copy.
    drop(s);
    let snap_path = dir.path().join(STATE_FILE);
    let mut snap: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&snap_path).expect("snapshot")).expect("json");
    snap["generation"] = serde_json::json!(0);
    std::fs::write(&snap_path, serde_json::to_vec(&snap).expect("json")).expect("write");
    let e = Store::open(dir.path()).err().expect("refused");
    assert!(e.contains("an older copy"), "{e}");
}

#[tokio::test]
async fn a_failed_compaction_is_undone_and_retried() {
    let dir = tempfile::tempdir().expect("tmp");
    let policy = CompactionPolicy {
        max_records: 2,
        min_bytes: u64::MAX,
    };
    let s = Store::open_with(dir.path(), policy).expect("open");
    make_lbs(&s, &["a", "b"]).await;
    // The snapshot's temporary name is taken: the compaction this change is due for fails.
    let blocker = dir.path().join("state.tmp");
    std::fs::create_dir(&blocker).expect("dir");
    let e = s
        .write(|st| st.create_load_balancer(lb_req("lost", vec![])))
        .await
        .expect_err("500");
    assert_eq!(e.status, 500);
    assert_eq!(lb_names(&s), ["a", "b"], "undone in memory");
    // Until a snapshot is written, nothing is appended to the journal either.
    let e = s
        .write(|st| st.create_load_balancer(lb_req("lost2", vec![])))
        .await
        .expect_err("500");
    assert_eq!(e.status, 500);
    std::fs::remove_dir(&blocker).expect("rmdir");
    make_lbs(&s, &["c"]).await;
    assert!(s.stats().await.generation >= 2);
    make_lbs(&s, &["d"]).await;
    let before = dump(&s);
    drop(s);
    let s = Store::open_with(dir.path(), policy).expect("reopen");
    assert_eq!(dump(&s), before);
    assert_eq!(lb_names(&s), ["a", "b", "c", "d"]);
}

#[tokio::test]
async fn concurrent_changes_all_survive() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = std::sync::Arc::new(Store::open(dir.path()).expect("open"));
    let mut tasks = Vec::new();
    for n in 0..40 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.write(|st| st.create_load_balancer(lb_req(&format!("lb-{n}"), vec![])))
                .await
                .expect("create")
        }));
    }
    for t in tasks {
        t.await.expect("join");
    }
    let st = s.stats().await;
    assert!(
        st.journal_records >= 1 && st.journal_records <= 40,
        "{st:?}"
    );
    let before = dump(&s);
    drop(s);
    let s = Store::open(dir.path()).expect("reopen");
    assert_eq!(dump(&s), before);
    assert_eq!(lb_names(&s).len(), 40);
}
