//! Automatic compaction, the same for both backends.
//!
//! Like kube-apiserver's compactor, this samples the store's revision over time and
//! compacts to the newest revision that is at least one window old, so history newer than
//! the window is always kept. The backends decide how to free the space (the embedded
//! store in small batches between writes, etcd by itself).

use std::collections::VecDeque;
use std::sync::Weak;
use std::time::{Duration, Instant};

use crate::{CompactionConfig, Revision, Store};

/// How often the revision is sampled for a given window: a tenth of it, between 50 ms
/// and 10 s, so a revision is compacted at most ~10 % of the window late.
pub fn sample_interval(window: Duration) -> Duration {
    (window / 10).clamp(Duration::from_millis(50), Duration::from_secs(10))
}

/// Starts the compactor as a task on the current tokio runtime. It stops when the store is
/// dropped. Does nothing when the window is zero.
pub fn spawn<S: Store + ?Sized>(store: Weak<S>, cfg: CompactionConfig) {
    if cfg.window.is_zero() {
        return;
    }
    let tick = sample_interval(cfg.window);
    tokio::spawn(async move {
        let mut samples: VecDeque<(Instant, Revision)> = VecDeque::new();
        let mut compacted: Revision = 0;
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let Some(store) = store.upgrade() else { return };
            let now = Instant::now();
            match store.current_revision().await {
                Ok(rev) => samples.push_back((now, rev)),
                Err(e) => {
                    tracing::warn!(error = %e, "compactor: reading the current revision failed");
                    continue;
                }
            }
            let mut target = None;
            while let Some(&(at, rev)) = samples.front() {
                if now.duration_since(at) >= cfg.window {
                    target = Some(rev);
                    samples.pop_front();
                } else {
                    break;
                }
            }
            if let Some(rev) = target.filter(|r| *r > compacted) {
                match store.compact(rev).await {
                    Ok(()) => {
                        tracing::debug!(revision = rev, "compacted");
                        compacted = rev;
                    }
                    Err(e) => tracing::warn!(error = %e, revision = rev, "compaction failed"),
                }
            }
        }
    });
}
