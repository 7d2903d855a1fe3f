//! What only the embedded backend must prove: acknowledged writes survive a reopen and a
//! SIGKILL at any moment, and sustained churn keeps the directory's size bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kumo_storage::embedded::{EmbeddedConfig, EmbeddedStore, DB_FILE};
use kumo_storage::{CompactionConfig, RangeRequest, Store, WatchEvent};
use rand::Rng;

const CHILD_DIR_ENV: &str = "KUMO_CRASH_CHILD_DIR";

fn config(dir: &Path, window: Duration) -> EmbeddedConfig {
    let mut cfg = EmbeddedConfig::new(dir);
    cfg.compaction = CompactionConfig { window, batch: 500 };
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_keeps_data_and_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let (a, last) = {
        let s = EmbeddedStore::open(config(dir.path(), Duration::ZERO))
            .await
            .unwrap();
        let a = s.create(b"/registry/a", b"1".to_vec()).await.unwrap();
        s.update(b"/registry/a", b"2".to_vec(), None).await.unwrap();
        s.create(b"/registry/b", b"b".to_vec()).await.unwrap();
        let (_, last) = s.delete(b"/registry/b", None).await.unwrap();
        s.compact(a.mod_revision + 1).await.unwrap();
        s.close();
        (a, last)
    };
    let s = EmbeddedStore::open(config(dir.path(), Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(s.current_revision().await.unwrap(), last);
    assert_eq!(s.compacted_revision(), a.mod_revision + 1);
    let (v, _) = s.get(b"/registry/a", None).await.unwrap();
    let v = v.unwrap();
    assert_eq!(
        (v.value.as_slice(), v.version, v.create_revision),
        (&b"2"[..], 2, a.mod_revision)
    );
    assert!(s.get(b"/registry/b", None).await.unwrap().0.is_none());
    assert!(s
        .get(b"/registry/a", Some(a.mod_revision))
        .await
        .unwrap_err()
        .is_compacted());
    // Revisions continue where they were.
    let c = s.create(b"/registry/c", b"c".to_vec()).await.unwrap();
    assert_eq!(c.mod_revision, last + 1);
    // A watch from before the restart replays what happened after its revision.
    let mut w = s.watch(b"/registry/", a.mod_revision + 1).await.unwrap();
    let mut revs = Vec::new();
    while revs.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(5), w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Progress(_) => {}
            ev => revs.push(ev.revision()),
        }
    }
    assert_eq!(revs, vec![last - 1, last, last + 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_cannot_open_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _s = EmbeddedStore::open(config(dir.path(), Duration::ZERO))
        .await
        .unwrap();
    let err = EmbeddedStore::open(config(dir.path(), Duration::ZERO)).await;
    assert!(err.is_err(), "two stores on one directory would corrupt it");
}

/// The child side of the crash test: writes forever, printing each acknowledgement.
/// Runs only when the parent test starts it (it is ignored otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of crash_at_random_points_loses_no_acknowledged_write"]
async fn crash_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let s = EmbeddedStore::open(config(Path::new(&dir), Duration::from_millis(200)))
        .await
        .unwrap();
    let run: u64 = std::env::var("KUMO_CRASH_RUN").unwrap().parse().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    for t in 0..16u64 {
        let s = s.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let counter = format!("/crash/counter/{t}");
            for i in 0u64.. {
                // A fresh key per write, and a shared counter bumped with CAS.
                let key = format!("/crash/keys/{run}/{t}/{i}");
                let kv = s
                    .create(key.as_bytes(), format!("{run}-{t}-{i}").into_bytes())
                    .await
                    .unwrap();
                tx.send(format!("create {key} {}", kv.mod_revision))
                    .unwrap();
                let cur = s.get(counter.as_bytes(), None).await.unwrap().0;
                let kv = match cur {
                    None => s.create(counter.as_bytes(), b"1".to_vec()).await,
                    Some(c) => {
                        let n: u64 = String::from_utf8(c.value).unwrap().parse().unwrap();
                        s.update(
                            counter.as_bytes(),
                            (n + 1).to_string().into_bytes(),
                            Some(c.mod_revision),
                        )
                        .await
                    }
                }
                .unwrap();
                tx.send(format!(
                    "counter {counter} {} {}",
                    kv.mod_revision,
                    String::from_utf8(kv.value).unwrap()
                ))
                .unwrap();
            }
        });
    }
    drop(tx);
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    while let Some(line) = rx.recv().await {
        writeln!(out, "{line}").unwrap();
        out.flush().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_at_random_points_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rng();
    let mut created: Vec<(String, i64)> = Vec::new();
    let mut counters: HashMap<String, u64> = HashMap::new();
    let mut max_rev = 0i64;
    let runs = 25;
    for run in 0..runs {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR_ENV, dir.path())
            .env("KUMO_CRASH_RUN", run.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<_>>()
        });
        // Let it start and write for a random while, then SIGKILL it mid-flight.
        let wait = Duration::from_millis(rng.random_range(150..700));
        std::thread::sleep(wait);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let lines = reader.join().unwrap();
        for line in lines {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["create", key, rev] => created.push((key.to_string(), rev.parse().unwrap())),
                ["counter", key, rev, value] => {
                    let v: u64 = value.parse().unwrap();
                    let e = counters.entry(key.to_string()).or_default();
                    *e = (*e).max(v);
                    max_rev = max_rev.max(rev.parse().unwrap());
                }
                _ => {} // test harness chatter
            }
        }
        for (_, r) in &created {
            max_rev = max_rev.max(*r);
        }
        // Reopen: every acknowledged write is there, revisions never went backwards.
        let s = EmbeddedStore::open(config(dir.path(), Duration::ZERO))
            .await
            .unwrap();
        let cur = s.current_revision().await.unwrap();
        assert!(
            cur >= max_rev,
            "run {run}: revision {cur} < acknowledged {max_rev}"
        );
        for (key, rev) in &created {
            let (kv, _) = s.get(key.as_bytes(), None).await.unwrap();
            let kv = kv.unwrap_or_else(|| panic!("run {run}: acknowledged {key} is missing"));
            assert_eq!(kv.mod_revision, *rev, "run {run}: {key}");
        }
        for (key, v) in &counters {
            let (kv, _) = s.get(key.as_bytes(), None).await.unwrap();
            let n: u64 = String::from_utf8(kv.unwrap().value)
                .unwrap()
                .parse()
                .unwrap();
            // An unacknowledged increment may have landed too, never fewer.
            assert!(n >= *v, "run {run}: counter {key} is {n}, acknowledged {v}");
        }
        // The whole store still reads back.
        let all = s
            .range(RangeRequest {
                prefix: b"/crash/".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(all.count >= created.len());
        s.close();
        drop(s);
    }
    assert!(
        created.len() > runs * 10,
        "the child wrote too little: {}",
        created.len()
    );
    eprintln!(
        "{runs} SIGKILLs, {} acknowledged creates and {} counters checked",
        created.len(),
        counters.len()
    );
}

/// Bytes the directory's files occupy on disk (allocated blocks, not apparent length).
fn dir_size(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().blocks() * 512)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_keeps_disk_use_bounded() {
    let updates: usize = std::env::var("KUMO_CHURN_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let keys = 1000usize;
    let dir = tempfile::tempdir().unwrap();
    let s = EmbeddedStore::open(config(dir.path(), Duration::from_millis(250)))
        .await
        .unwrap();
    for k in 0..keys {
        s.create(format!("/churn/{k:04}").as_bytes(), vec![0u8; 256])
            .await
            .unwrap();
    }
    let writers = 128;
    let per = updates / writers / 4 * 4; // updates per writer, a multiple of the 4 rounds
    let start = Instant::now();
    let mut sizes = Vec::new();
    // Four rounds; the size after each one must stop growing once compaction keeps up.
    for round in 0..4 {
        let mut tasks = Vec::new();
        for w in 0..writers {
            let s: Arc<EmbeddedStore> = s.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..per / 4 {
                    let k = (w * 7919 + i * 31 + round) % keys;
                    let mut v = vec![0u8; 256];
                    v[..8].copy_from_slice(&(i as u64).to_be_bytes());
                    s.update(format!("/churn/{k:04}").as_bytes(), v, None)
                        .await
                        .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // Give compaction a window to catch up, as it would under steady load.
        tokio::time::sleep(Duration::from_millis(600)).await;
        sizes.push(dir_size(dir.path()));
    }
    let elapsed = start.elapsed();
    let cur = s.current_revision().await.unwrap();
    assert!(cur as usize >= keys + per * writers);
    let live = s
        .range(RangeRequest {
            prefix: b"/churn/".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(live.count, keys);
    // Compaction kept up: what is older than the last round was dropped.
    let compacted = s.compacted_revision();
    assert!(
        compacted > cur - (cur - keys as i64) / 4,
        "compacted only up to {compacted} of {cur}"
    );
    eprintln!(
        "churn: {} updates in {:.1} s ({:.0}/s), size of {} after each quarter: {:?} MiB",
        per * writers,
        elapsed.as_secs_f64(),
        (per * writers) as f64 / elapsed.as_secs_f64(),
        DB_FILE,
        sizes.iter().map(|b| b / (1024 * 1024)).collect::<Vec<_>>()
    );
    // Without compaction the directory would hold every revision: more than the 256 MiB of
    // values a million updates write. Bounded: it plateaus (the last quarter adds little to
    // the second's size) and stays well below what was written.
    let total_written = (per * writers * 256) as u64;
    assert!(
        sizes[3] <= sizes[1] + sizes[1] / 4 + 8 * 1024 * 1024,
        "disk use keeps growing: {sizes:?}"
    );
    assert!(
        sizes[3] < total_written / 2,
        "disk use {sizes:?} vs {total_written} written"
    );
}
