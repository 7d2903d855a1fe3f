//! `kumo bench storage`: the embedded store and a real etcd in one run, both fsyncing.
//!
//! Measures write throughput and commit latency at several writer counts, watch delivery
//! latency to many watchers, and a large range read, then prints both columns and the
//! ratio embedded / etcd.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kumo_storage::embedded::{EmbeddedConfig, EmbeddedStore};
use kumo_storage::etcd::EtcdStore;
use kumo_storage::{CompactionConfig, Limits, RangeRequest, Store, WatchEvent};

use super::percentile;

#[derive(clap::Args)]
pub struct Args {
    /// Seconds each write step runs.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Concurrent writer counts to measure.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 16, 128])]
    writers: Vec<usize>,
    /// Watcher counts to measure delivery latency for.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 100, 1000])]
    watchers: Vec<usize>,
    /// Writes observed per watcher count.
    #[arg(long, default_value_t = 200)]
    watch_writes: usize,
    /// Writes in the history a late watcher catches up on (half of them under its prefix,
    /// most of them updates, so each needs its previous value).
    #[arg(long, default_value_t = 50_000)]
    catch_up_writes: usize,
    /// Keys in the range-read step.
    #[arg(long, default_value_t = 10_000)]
    range_keys: usize,
    /// Value size in bytes (a small Pod is about 1-2 KiB).
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// Directory for both stores' data (default: a temporary directory).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

/// One measured figure for both stores.
struct Row {
    name: String,
    unit: &'static str,
    embedded: f64,
    etcd: f64,
    /// Whether a bigger number is better (throughput) or worse (latency).
    higher_is_better: bool,
}

pub async fn run(args: Args) -> Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix("kumo-bench-storage")
        .tempdir_in(args.dir.clone().unwrap_or_else(std::env::temp_dir))?;
    let no_compaction = CompactionConfig {
        window: Duration::ZERO,
        ..CompactionConfig::default()
    };
    let mut cfg = EmbeddedConfig::new(tmp.path().join("embedded"));
    cfg.compaction = no_compaction;
    let embedded: Arc<dyn Store> = EmbeddedStore::open(cfg).await?;
    let cluster = kumo_testkit::EtcdCluster::start(1)
        .await
        .context("starting etcd")?;
    let etcd: Arc<dyn Store> =
        EtcdStore::connect(&cluster.endpoints(), Limits::default(), no_compaction).await?;
    let etcd_version = std::process::Command::new(kumo_testkit::etcd_binary()?)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "etcd".into());
    println!(
        "kumo bench storage: embedded (redb, group commit, fsync) vs {etcd_version} (single member, WAL fsync)"
    );
    println!(
        "value {} B, {} s per write step, data in {}",
        args.value_bytes,
        args.seconds,
        tmp.path().display()
    );

    let mut rows = Vec::new();
    let value = vec![b'v'; args.value_bytes];
    for &w in &args.writers {
        let e = writes(&embedded, w, args.seconds, &value, "e").await?;
        let d = writes(&etcd, w, args.seconds, &value, "d").await?;
        rows.push(Row {
            name: format!("write throughput, {w} writers"),
            unit: "ops/s",
            embedded: e.ops_per_sec,
            etcd: d.ops_per_sec,
            higher_is_better: true,
        });
        rows.push(Row {
            name: format!("commit latency p50, {w} writers"),
            unit: "ms",
            embedded: e.p50_ms,
            etcd: d.p50_ms,
            higher_is_better: false,
        });
        rows.push(Row {
            name: format!("commit latency p99, {w} writers"),
            unit: "ms",
            embedded: e.p99_ms,
            etcd: d.p99_ms,
            higher_is_better: false,
        });
    }
    for &n in &args.watchers {
        let e = watch_latency(&embedded, n, args.watch_writes, &value, "e").await?;
        let d = watch_latency(&etcd, n, args.watch_writes, &value, "d").await?;
        rows.push(Row {
            name: format!("watch delivery p50, {n} watchers"),
            unit: "ms",
            embedded: e.0,
            etcd: d.0,
            higher_is_better: false,
        });
        rows.push(Row {
            name: format!("watch delivery p99, {n} watchers"),
            unit: "ms",
            embedded: e.1,
            etcd: d.1,
            higher_is_better: false,
        });
    }
    let e = catch_up(&embedded, args.catch_up_writes, &value, "e").await?;
    let d = catch_up(&etcd, args.catch_up_writes, &value, "d").await?;
    rows.push(Row {
        name: format!("watch catch-up over {} writes", args.catch_up_writes),
        unit: "ev/s",
        embedded: e,
        etcd: d,
        higher_is_better: true,
    });
    let e = range_read(&embedded, args.range_keys, &value).await?;
    let d = range_read(&etcd, args.range_keys, &value).await?;
    rows.push(Row {
        name: format!("range read of {} keys, median", args.range_keys),
        unit: "ms",
        embedded: e,
        etcd: d,
        higher_is_better: false,
    });

    println!();
    println!(
        "{:<38} {:>6} {:>12} {:>12} {:>9}",
        "metric", "unit", "embedded", "etcd", "advantage"
    );
    for r in &rows {
        // "advantage" > 1 means the embedded store is better by that factor.
        let adv = if r.higher_is_better {
            r.embedded / r.etcd
        } else {
            r.etcd / r.embedded
        };
        println!(
            "{:<38} {:>6} {:>12.2} {:>12.2} {:>8.2}x",
            r.name, r.unit, r.embedded, r.etcd, adv
        );
    }
    drop(cluster);
    Ok(())
}

struct WriteResult {
    ops_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// `writers` tasks each creating fresh keys for `seconds`; every create is durable when
/// acknowledged.
async fn writes(
    store: &Arc<dyn Store>,
    writers: usize,
    seconds: f64,
    value: &[u8],
    tag: &str,
) -> Result<WriteResult> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        let value = value.to_vec();
        let prefix = format!("/bench/writes/{tag}-{writers}/{w}/");
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                store
                    .create(format!("{prefix}{i}").as_bytes(), value.clone())
                    .await?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                i += 1;
            }
            anyhow::Ok(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    Ok(WriteResult {
        ops_per_sec: all.len() as f64 / elapsed,
        p50_ms: percentile(&all, 50.0),
        p99_ms: percentile(&all, 99.0),
    })
}

/// Time from issuing a write to each of `watchers` watches receiving its event, over
/// `writes` writes issued one at a time; returns (p50, p99) in ms.
async fn watch_latency(
    store: &Arc<dyn Store>,
    watchers: usize,
    writes: usize,
    value: &[u8],
    tag: &str,
) -> Result<(f64, f64)> {
    let prefix = format!("/bench/watch/{tag}-{watchers}/");
    let from = store.current_revision().await?;
    let mut streams = Vec::with_capacity(watchers);
    for _ in 0..watchers {
        streams.push(store.watch(prefix.as_bytes(), from).await?);
    }
    // Each watcher reports the instant it saw each event; the writer records when it sent.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    let mut tasks = Vec::new();
    for mut s in streams {
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = 0;
            while seen < writes {
                match s.next().await {
                    Some(Ok(WatchEvent::Progress(_))) => {}
                    Some(Ok(_)) => {
                        let _ = tx.send((seen, Instant::now()));
                        seen += 1;
                    }
                    Some(Err(e)) => return Err(anyhow::anyhow!("watch failed: {e}")),
                    None => return Err(anyhow::anyhow!("watch ended early")),
                }
            }
            Ok(())
        }));
    }
    drop(tx);
    let mut sent = Vec::with_capacity(writes);
    for i in 0..writes {
        sent.push(Instant::now());
        store
            .create(format!("{prefix}{i}").as_bytes(), value.to_vec())
            .await?;
        // Spaced writes: this measures delivery, not queueing behind a burst.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut lat = Vec::with_capacity(writes * watchers);
    let collect = async {
        while let Some((i, at)) = rx.recv().await {
            lat.push(at.duration_since(sent[i]).as_secs_f64() * 1000.0);
        }
    };
    tokio::time::timeout(Duration::from_secs(120), collect)
        .await
        .context("watchers did not receive every event within 120 s")?;
    for t in tasks {
        t.await??;
    }
    lat.sort_by(f64::total_cmp);
    Ok((percentile(&lat, 50.0), percentile(&lat, 99.0)))
}

/// Events per second a watch started at an old revision delivers while reading the
/// history of `writes` writes (two prefixes interleaved, 1000 keys each, so nearly every
/// event is an update with a previous value), as the API server's watch cache does when it
/// fell behind the live feed.
async fn catch_up(store: &Arc<dyn Store>, writes: usize, value: &[u8], tag: &str) -> Result<f64> {
    const KEYS: usize = 1000;
    let from = store.current_revision().await?;
    let writers = 64;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        let value = value.to_vec();
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while i < writes {
                let prefix = if i % 2 == 0 { "watched" } else { "other" };
                let key = format!("/bench/catchup/{tag}/{prefix}/{}", (i / 2) % KEYS);
                match store.update(key.as_bytes(), value.clone(), None).await {
                    // First write of the key (a racing creator's write is just as good).
                    Err(kumo_storage::StorageError::NotFound) => {
                        match store.create(key.as_bytes(), value.clone()).await {
                            Err(kumo_storage::StorageError::AlreadyExists { .. }) | Ok(_) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    r => {
                        r?;
                    }
                }
                i += writers;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let want = writes.div_ceil(2);
    let prefix = format!("/bench/catchup/{tag}/watched/");
    let start = Instant::now();
    let mut s = store.watch(prefix.as_bytes(), from).await?;
    let mut seen = 0usize;
    let read = async {
        while seen < want {
            match s.next().await {
                Some(Ok(WatchEvent::Progress(_))) => {}
                Some(Ok(_)) => seen += 1,
                Some(Err(e)) => return Err(anyhow::anyhow!("watch failed: {e}")),
                None => return Err(anyhow::anyhow!("watch ended early")),
            }
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(300), read)
        .await
        .context("the catch-up did not finish within 300 s")??;
    let secs = start.elapsed().as_secs_f64();
    Ok(seen as f64 / secs)
}

/// Median time of a full read of `keys` keys under one prefix, over 9 reads.
async fn range_read(store: &Arc<dyn Store>, keys: usize, value: &[u8]) -> Result<f64> {
    let prefix = "/bench/range/";
    // Load with 64 concurrent writers so setup takes seconds, not minutes.
    let per = keys.div_ceil(64);
    let mut tasks = Vec::new();
    for w in 0..64 {
        let store = store.clone();
        let value = value.to_vec();
        tasks.push(tokio::spawn(async move {
            for i in (w * per)..((w + 1) * per).min(keys) {
                store
                    .create(format!("{prefix}{i:06}").as_bytes(), value.clone())
                    .await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let mut times = Vec::new();
    for _ in 0..9 {
        let t = Instant::now();
        let r = store
            .range(RangeRequest {
                prefix: prefix.as_bytes().to_vec(),
                ..Default::default()
            })
            .await?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(r.kvs.len() == keys, "range returned {} keys", r.kvs.len());
    }
    times.sort_by(f64::total_cmp);
    Ok(percentile(&times, 50.0))
}
