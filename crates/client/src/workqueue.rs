//! A rate-limited work queue with client-go's semantics: an item is queued at most once,
//! is never handed to two workers at once (an item added while it is being processed is
//! queued again when `done` is called), and failed items come back after a per-item
//! exponential delay, bounded overall by a token bucket.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// client-go's rate limiters: the larger of a per-item exponential delay
/// (`base * 2^failures`, capped at `max`) and an overall token bucket.
#[derive(Debug)]
pub struct RateLimiter<T> {
    base: Duration,
    max: Duration,
    failures: HashMap<T, u32>,
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl<T: Hash + Eq + Clone> RateLimiter<T> {
    /// `DefaultControllerRateLimiter`: 5 ms doubling up to 1000 s, 10 qps with a burst of 100.
    pub fn default_controller() -> Self {
        Self::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
            10.0,
            100,
        )
    }

    /// A limiter with the given per-item bounds and bucket.
    pub fn new(base: Duration, max: Duration, qps: f64, burst: u32) -> Self {
        RateLimiter {
            base,
            max,
            failures: HashMap::new(),
            qps,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            last: Instant::now(),
        }
    }

    /// How long `item` waits before it is retried; counts one more failure.
    pub fn when(&mut self, item: &T) -> Duration {
        let n = self.failures.entry(item.clone()).or_insert(0);
        let exp = *n;
        *n = n.saturating_add(1);
        let per_item = if exp >= 32 {
            self.max
        } else {
            self.base
                .checked_mul(1u32 << exp)
                .map_or(self.max, |d| d.min(self.max))
        };
        // The bucket: take a token, waiting for it if there is none left (a reservation).
        let now = Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst) - 1.0;
        let bucket = if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        };
        per_item.max(bucket)
    }

    /// Forgets the failures of `item`.
    pub fn forget(&mut self, item: &T) {
        self.failures.remove(item);
    }

    /// How many times `item` has failed since it was last forgotten.
    pub fn retries(&self, item: &T) -> u32 {
        self.failures.get(item).copied().unwrap_or(0)
    }
}

struct State<T> {
    queue: VecDeque<T>,
    dirty: HashSet<T>,
    processing: HashSet<T>,
    shutting_down: bool,
    limiter: RateLimiter<T>,
}

/// The queue; share it with `Arc`.
pub struct WorkQueue<T> {
    name: String,
    state: Mutex<State<T>>,
    notify: Notify,
    /// Items added, and rate-limited re-adds (for the component's metrics).
    adds: AtomicU64,
    retries: AtomicU64,
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> crate::metrics::QueueStats for WorkQueue<T> {
    fn name(&self) -> &str {
        &self.name
    }
    fn depth(&self) -> usize {
        self.len()
    }
    fn adds(&self) -> u64 {
        self.adds.load(Ordering::Relaxed)
    }
    fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> WorkQueue<T> {
    /// A queue with client-go's default controller rate limiter.
    pub fn new(name: &str) -> Arc<Self> {
        Self::with_limiter(name, RateLimiter::default_controller())
    }

    /// A queue with its own rate limiter.
    pub fn with_limiter(name: &str, limiter: RateLimiter<T>) -> Arc<Self> {
        Arc::new(WorkQueue {
            name: name.to_owned(),
            state: Mutex::new(State {
                queue: VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
                shutting_down: false,
                limiter,
            }),
            notify: Notify::new(),
            adds: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        })
    }

    /// The queue's name (as client-go's metrics name it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Queues `item` unless it is already waiting.
    pub fn add(&self, item: T) {
        let mut s = self.state.lock();
        if s.shutting_down || s.dirty.contains(&item) {
            return;
        }
        s.dirty.insert(item.clone());
        self.adds.fetch_add(1, Ordering::Relaxed);
        if s.processing.contains(&item) {
            return;
        }
        s.queue.push_back(item);
        drop(s);
        self.notify.notify_one();
    }

    /// Queues `item` after `delay`.
    pub fn add_after(self: &Arc<Self>, item: T, delay: Duration) {
        if delay.is_zero() {
            self.add(item);
            return;
        }
        if self.state.lock().shutting_down {
            return;
        }
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(q) = weak.upgrade() {
                q.add(item);
            }
        });
    }

    /// Queues `item` after its rate-limited delay (one more failure).
    pub fn add_rate_limited(self: &Arc<Self>, item: T) {
        self.retries.fetch_add(1, Ordering::Relaxed);
        let delay = self.state.lock().limiter.when(&item);
        self.add_after(item, delay);
    }

    /// Forgets the failures of `item` (it succeeded).
    pub fn forget(&self, item: &T) {
        self.state.lock().limiter.forget(item);
    }

    /// How many times `item` has been requeued with a rate limit.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.state.lock().limiter.retries(item)
    }

    /// The next item, or `None` once the queue is shut down.
    pub async fn get(&self) -> Option<T> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.state.lock();
                if let Some(item) = s.queue.pop_front() {
                    s.processing.insert(item.clone());
                    s.dirty.remove(&item);
                    let more = !s.queue.is_empty();
                    drop(s);
                    if more {
                        // Wake another worker for the rest (notify_one wakes only one).
                        self.notify.notify_one();
                    }
                    return Some(item);
                }
                if s.shutting_down {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Marks `item` processed; if it was added meanwhile, it is queued again.
    pub fn done(&self, item: &T) {
        let mut s = self.state.lock();
        s.processing.remove(item);
        if s.dirty.contains(item) {
            s.queue.push_back(item.clone());
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Items waiting (not counting those being processed).
    pub fn len(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops the queue: `get` returns `None` to every worker once it is drained.
    pub fn shut_down(&self) {
        let mut s = self.state.lock();
        s.shutting_down = true;
        s.queue.clear();
        s.dirty.clear();
        drop(s);
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dedups_and_requeues_items_added_while_processing() {
        let q = WorkQueue::<String>::new("t");
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        assert_eq!(q.len(), 2);
        let a = q.get().await.expect("item");
        assert_eq!(a, "a");
        // Added while processing: not handed out twice, queued again on done.
        q.add("a".into());
        assert_eq!(q.get().await.as_deref(), Some("b"));
        assert!(q.is_empty());
        q.done(&a);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.shut_down();
        assert_eq!(q.get().await, None);
    }

    #[test]
    fn exponential_per_item_delay() {
        let mut l = RateLimiter::new(Duration::from_millis(5), Duration::from_secs(1), 10.0, 100);
        let k = "x".to_string();
        assert_eq!(l.when(&k), Duration::from_millis(5));
        assert_eq!(l.when(&k), Duration::from_millis(10));
        assert_eq!(l.when(&k), Duration::from_millis(20));
        assert_eq!(l.retries(&k), 3);
        for _ in 0..20 {
            l.when(&k);
        }
        assert_eq!(l.when(&k), Duration::from_secs(1));
        l.forget(&k);
        assert_eq!(l.when(&k), Duration::from_millis(5));
    }

    #[test]
    fn bucket_limits_overall_rate() {
        let mut l = RateLimiter::new(Duration::ZERO, Duration::ZERO, 10.0, 2);
        assert_eq!(l.when(&1u32), Duration::ZERO);
        assert_eq!(l.when(&2u32), Duration::ZERO);
        // The third within the same instant waits about one token's worth (100 ms).
        let d = l.when(&3u32);
        assert!(
            d > Duration::from_millis(80) && d <= Duration::from_millis(100),
            "{d:?}"
        );
    }

    #[tokio::test]
    async fn add_after_arrives_later() {
        let q = WorkQueue::<u32>::new("t");
        q.add_after(7, Duration::from_millis(50));
        assert!(q.is_empty());
        let got = tokio::time::timeout(Duration::from_secs(2), q.get()).await;
        assert_eq!(got.ok().flatten(), Some(7));
    }
}
