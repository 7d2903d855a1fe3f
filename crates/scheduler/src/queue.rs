//! The scheduling queue (upstream's `PriorityQueue`): activeQ ordered by PrioritySort
//! (higher spec.priority first, then the time the pod was queued), backoffQ for pods that
//! failed recently (1 s doubling per attempt up to 10 s), and the unschedulable pods,
//! which go back when a cluster event that could help one of the plugins that rejected
//! them arrives, or after 5 minutes.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::helpers::{pod_key, priority};
use crate::plugins::hints;
use crate::plugins::names::*;

/// Initial backoff after a failed attempt.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Longest backoff.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How long a pod stays unschedulable without any event (podMaxInUnschedulablePodsDuration).
pub const MAX_UNSCHEDULABLE: Duration = Duration::from_secs(300);

/// A cluster event that may make unschedulable pods schedulable; pod events carry the
/// pod, for the plugins' queueing hints.
#[derive(Clone, Debug)]
pub enum ClusterEvent {
    /// A node was added.
    NodeAdd,
    /// A node's labels, taints, allocatable or schedulability changed.
    NodeUpdate,
    /// A pod was bound to a node.
    AssignedPodAdd(Arc<Pod>),
    /// A pod assigned to a node changed its labels.
    AssignedPodUpdate(Arc<Pod>),
    /// A pod assigned to a node went away (or finished).
    AssignedPodDelete(Arc<Pod>),
    /// A claim, volume or storage class was added or changed.
    StorageChange,
}

impl ClusterEvent {
    /// Whether `pending`, rejected by `plugin`, may become schedulable after this event:
    /// the plugins' EventsToRegister with their queueing hints for pod events.
    fn helps(&self, plugin: &str, pending: &Pod) -> bool {
        match self {
            ClusterEvent::NodeAdd | ClusterEvent::NodeUpdate => true,
            ClusterEvent::StorageChange => {
                plugin == crate::volumes::VOLUME_BINDING
                    || plugin == crate::volumes::NODE_VOLUME_LIMITS
            }
            ClusterEvent::AssignedPodAdd(p) | ClusterEvent::AssignedPodUpdate(p) => match plugin {
                POD_TOPOLOGY_SPREAD => hints::spread(pending, p),
                INTER_POD_AFFINITY => hints::affinity_after_add(pending, p),
                _ => false,
            },
            ClusterEvent::AssignedPodDelete(p) => match plugin {
                NODE_RESOURCES_FIT | crate::volumes::NODE_VOLUME_LIMITS => true,
                NODE_PORTS => hints::ports_freed(pending, p),
                POD_TOPOLOGY_SPREAD => hints::spread(pending, p),
                INTER_POD_AFFINITY => hints::affinity_after_delete(pending, p),
                _ => false,
            },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Active,
    Backoff,
    Unschedulable,
    InFlight,
}

struct Entry {
    pod: Arc<Pod>,
    place: Place,
    /// Queue time, for PrioritySort.
    timestamp: Instant,
    seq: u64,
    attempts: u32,
    last_failure: Option<Instant>,
    unschedulable_since: Instant,
    plugins: Vec<&'static str>,
    /// The pod changed while it was being scheduled.
    updated_in_flight: bool,
    cycle: u64,
}

impl Entry {
    fn backoff_until(&self) -> Option<Instant> {
        let last = self.last_failure?;
        let mut d = INITIAL_BACKOFF;
        for _ in 1..self.attempts {
            d *= 2;
            if d >= MAX_BACKOFF {
                d = MAX_BACKOFF;
                break;
            }
        }
        Some(last + d)
    }
}

type ActiveKey = (Reverse<i32>, Instant, u64, String);

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    active: BTreeSet<ActiveKey>,
    backoff: BTreeSet<(Instant, u64, String)>,
    seq: u64,
    cycle: u64,
    /// Events seen while pods were in flight, with the cycle counter at the time: a pod
    /// that fails afterwards is retried if one of them may help it (queueing hints).
    in_flight_events: Vec<(u64, ClusterEvent)>,
    /// Pending pods nominated to a node by preemption (upstream's nominator): pod key →
    /// node. Pods of no higher priority are filtered as if these ran there already.
    nominated: HashMap<String, String>,
}

impl Inner {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn unlink(&mut self, key: &str) {
        let Some(e) = self.entries.get(key) else {
            return;
        };
        match e.place {
            Place::Active => {
                self.active.remove(&(
                    Reverse(priority(&e.pod)),
                    e.timestamp,
                    e.seq,
                    key.to_owned(),
                ));
            }
            Place::Backoff => {
                if let Some(t) = e.backoff_until() {
                    self.backoff.remove(&(t, e.seq, key.to_owned()));
                }
            }
            _ => {}
        }
    }

    fn move_to_active(&mut self, key: &str) {
        self.unlink(key);
        let seq = self.next_seq();
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        e.place = Place::Active;
        e.timestamp = Instant::now();
        e.seq = seq;
        self.active
            .insert((Reverse(priority(&e.pod)), e.timestamp, seq, key.to_owned()));
    }

    /// To backoffQ if its backoff has not expired yet, else to activeQ.
    fn move_to_active_or_backoff(&mut self, key: &str) {
        let until = self.entries.get(key).and_then(Entry::backoff_until);
        match until {
            Some(t) if t > Instant::now() => {
                self.unlink(key);
                let seq = self.next_seq();
                if let Some(e) = self.entries.get_mut(key) {
                    e.place = Place::Backoff;
                    e.seq = seq;
                }
                self.backoff.insert((t, seq, key.to_owned()));
            }
            _ => self.move_to_active(key),
        }
    }
}

/// Whether an update of a pending pod may change the scheduling outcome: anything but
/// its status and bookkeeping metadata (upstream's isPodUpdated), so the scheduler's own
/// PodScheduled condition does not requeue the pod.
fn scheduling_relevant_change(old: &Pod, new: &Pod) -> bool {
    let strip = |p: &Pod| {
        let mut p = p.clone();
        p.status = None;
        p.metadata.resource_version = None;
        p.metadata.generation = None;
        p.metadata.managed_fields = None;
        p
    };
    strip(old) != strip(new)
}

/// What [`SchedulingQueue::pop`] hands out.
pub struct QueuedPod {
    /// The pod as last seen.
    pub pod: Arc<Pod>,
    /// Attempts so far, this one included.
    pub attempts: u32,
    /// The scheduling cycle of this attempt.
    pub cycle: u64,
}

/// The queue.
#[derive(Default)]
pub struct SchedulingQueue {
    inner: Mutex<Inner>,
    notify: Notify,
}

impl SchedulingQueue {
    /// A pod that needs scheduling was added or changed.
    pub fn add_or_update(&self, pod: Arc<Pod>) {
        let key = pod_key(&pod);
        let mut q = self.inner.lock();
        // A copy without nominatedNodeName (read before the scheduler's status write) keeps
        // the nomination made meanwhile.
        if let Some(node) = pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .filter(|n| !n.is_empty())
        {
            q.nominated.insert(key.clone(), node.to_owned());
        }
        match q.entries.get_mut(&key) {
            Some(e) => {
                let old_priority = priority(&e.pod);
                let place = e.place;
                if place == Place::Active && old_priority != priority(&pod) {
                    q.unlink(&key);
                    if let Some(e) = q.entries.get_mut(&key) {
                        e.pod = pod;
                    }
                    q.move_to_active(&key);
                } else if let Some(e) = q.entries.get_mut(&key) {
                    let changed = scheduling_relevant_change(&e.pod, &pod);
                    e.pod = pod;
                    if !changed {
                        return;
                    }
                    match place {
                        Place::InFlight => e.updated_in_flight = true,
                        // An update of the pod itself may make it schedulable.
                        Place::Unschedulable => q.move_to_active_or_backoff(&key),
                        _ => {}
                    }
                }
            }
            None => {
                let now = Instant::now();
                q.entries.insert(
                    key.clone(),
                    Entry {
                        pod,
                        place: Place::Unschedulable,
                        timestamp: now,
                        seq: 0,
                        attempts: 0,
                        last_failure: None,
                        unschedulable_since: now,
                        plugins: Vec::new(),
                        updated_in_flight: false,
                        cycle: 0,
                    },
                );
                q.move_to_active(&key);
            }
        }
        drop(q);
        self.notify.notify_one();
    }

    /// The pod is gone, bound elsewhere, or no longer ours.
    pub fn delete(&self, key: &str) {
        let mut q = self.inner.lock();
        q.unlink(key);
        q.entries.remove(key);
        q.nominated.remove(key);
    }

    /// Preemption nominated `node` for the pod `key` (its victims are on their way out).
    pub fn nominate(&self, key: &str, node: &str) {
        let mut q = self.inner.lock();
        if q.entries.contains_key(key) {
            q.nominated.insert(key.to_owned(), node.to_owned());
        }
    }

    /// The pending pods nominated to each node.
    pub fn nominated_pods(&self) -> HashMap<String, Vec<Arc<Pod>>> {
        let q = self.inner.lock();
        let mut out: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
        for (key, node) in &q.nominated {
            if let Some(e) = q.entries.get(key) {
                out.entry(node.clone()).or_default().push(e.pod.clone());
            }
        }
        out
    }

    /// The pod was scheduled (assumed); it leaves the queue.
    pub fn done(&self, key: &str) {
        let mut q = self.inner.lock();
        if q.entries
            .get(key)
            .is_some_and(|e| e.place == Place::InFlight)
        {
            q.entries.remove(key);
            q.nominated.remove(key);
        }
    }

    /// Waits for the head of activeQ.
    pub async fn pop(&self) -> QueuedPod {
        loop {
            let notified = self.notify.notified();
            {
                let mut q = self.inner.lock();
                if let Some(first) = q.active.pop_first() {
                    q.cycle += 1;
                    let cycle = q.cycle;
                    if let Some(e) = q.entries.get_mut(&first.3) {
                        e.place = Place::InFlight;
                        e.attempts += 1;
                        e.cycle = cycle;
                        e.updated_in_flight = false;
                        return QueuedPod {
                            pod: e.pod.clone(),
                            attempts: e.attempts,
                            cycle,
                        };
                    }
                    continue;
                }
            }
            notified.await;
        }
    }

    /// A failed attempt: back to the unschedulable pods (rejected by `plugins`), or to
    /// backoffQ when an event arrived meanwhile or the failure was an error.
    pub fn requeue_failed(&self, key: &str, plugins: Vec<&'static str>) {
        let mut guard = self.inner.lock();
        let q = &mut *guard;
        let Some(e) = q.entries.get_mut(key) else {
            return;
        };
        if e.place != Place::InFlight {
            return;
        }
        e.last_failure = Some(Instant::now());
        let missed = q
            .in_flight_events
            .iter()
            .any(|(at, ev)| *at >= e.cycle && plugins.iter().any(|p| ev.helps(p, &e.pod)));
        let retry_now = plugins.is_empty() || e.updated_in_flight || missed;
        e.plugins = plugins;
        if retry_now {
            q.move_to_active_or_backoff(key);
        } else {
            e.place = Place::Unschedulable;
            e.unschedulable_since = Instant::now();
        }
        drop(guard);
        self.notify.notify_one();
    }

    /// Moves the unschedulable pods this event may help to activeQ or backoffQ.
    pub fn on_event(&self, ev: ClusterEvent) {
        let mut q = self.inner.lock();
        // Keep only what a pod in flight now may still ask about.
        let oldest = q
            .entries
            .values()
            .filter(|e| e.place == Place::InFlight)
            .map(|e| e.cycle)
            .min();
        match oldest {
            Some(c) => {
                let at = q.cycle;
                q.in_flight_events.retain(|(t, _)| *t >= c);
                q.in_flight_events.push((at, ev.clone()));
            }
            None => q.in_flight_events.clear(),
        }
        let keys: Vec<String> = q
            .entries
            .iter()
            .filter(|(_, e)| {
                e.place == Place::Unschedulable
                    && (e.plugins.is_empty() || e.plugins.iter().any(|p| ev.helps(p, &e.pod)))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &keys {
            q.move_to_active_or_backoff(k);
        }
        drop(q);
        if !keys.is_empty() {
            self.notify.notify_one();
        }
    }

    /// Moves finished backoffs to activeQ and long-unschedulable pods back; run every second.
    pub fn flush(&self) {
        let mut q = self.inner.lock();
        let now = Instant::now();
        let mut moved = false;
        while let Some(first) = q.backoff.first().cloned() {
            if first.0 > now {
                break;
            }
            q.backoff.remove(&first);
            if let Some(e) = q.entries.get_mut(&first.2) {
                e.place = Place::Unschedulable;
            }
            q.move_to_active(&first.2);
            moved = true;
        }
        let stale: Vec<String> = q
            .entries
            .iter()
            .filter(|(_, e)| {
                e.place == Place::Unschedulable
                    && now.duration_since(e.unschedulable_since) >= MAX_UNSCHEDULABLE
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &stale {
            q.move_to_active_or_backoff(k);
            moved = true;
        }
        drop(q);
        if moved {
            self.notify.notify_one();
        }
    }

    /// (activeQ, backoffQ, unschedulable) sizes, for tests and metrics.
    pub fn lens(&self) -> (usize, usize, usize) {
        let q = self.inner.lock();
        let unsched = q
            .entries
            .values()
            .filter(|e| e.place == Place::Unschedulable)
            .count();
        (q.active.len(), q.backoff.len(), unsched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, prio: i32) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"containers": [], "priority": prio}
            }))
            .expect("pod"),
        )
    }

    #[tokio::test]
    async fn nominations_last_until_the_pod_leaves() {
        let q = SchedulingQueue::default();
        q.add_or_update(pod("hi", 1000));
        q.add_or_update(pod("low", 100));
        let names = |q: &SchedulingQueue, node: &str| -> Vec<String> {
            let mut v: Vec<String> = q
                .nominated_pods()
                .get(node)
                .map(|ps| ps.iter().filter_map(|p| p.metadata.name.clone()).collect())
                .unwrap_or_default();
            v.sort();
            v
        };
        assert!(q.nominated_pods().is_empty());
        q.nominate("default/hi", "w1");
        assert_eq!(names(&q, "w1"), ["hi"]);
        // A copy read before the status write (no nominatedNodeName) keeps the nomination.
        q.add_or_update(pod("hi", 1000));
        assert_eq!(names(&q, "w1"), ["hi"]);
        // The status carries one too: it counts.
        let mut low = (*pod("low", 100)).clone();
        low.status = Some(k8s_openapi::api::core::v1::PodStatus {
            nominated_node_name: Some("w2".into()),
            ..Default::default()
        });
        q.add_or_update(Arc::new(low));
        assert_eq!(names(&q, "w2"), ["low"]);
        // Bound or gone: no longer nominated. Unknown pods are not nominated.
        q.delete("default/hi");
        assert!(names(&q, "w1").is_empty());
        q.nominate("default/nobody", "w1");
        assert!(names(&q, "w1").is_empty());
    }

    #[tokio::test]
    async fn priority_then_fifo() {
        let q = SchedulingQueue::default();
        q.add_or_update(pod("a", 0));
        q.add_or_update(pod("b", 10));
        q.add_or_update(pod("c", 0));
        let order: Vec<String> = [q.pop().await, q.pop().await, q.pop().await]
            .iter()
            .map(|p| p.pod.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(order, ["b", "a", "c"]);
    }

    #[tokio::test]
    async fn unschedulable_moves_on_matching_event_with_backoff() {
        let q = SchedulingQueue::default();
        q.add_or_update(pod("a", 0));
        let p = q.pop().await;
        assert_eq!(p.attempts, 1);
        q.requeue_failed("default/a", vec![NODE_RESOURCES_FIT]);
        assert_eq!(q.lens(), (0, 0, 1));
        // An assigned pod being added cannot help NodeResourcesFit.
        q.on_event(ClusterEvent::AssignedPodAdd(pod("other", 0)));
        assert_eq!(q.lens(), (0, 0, 1));
        // A node being added can, but the pod is still backing off (1 s).
        q.on_event(ClusterEvent::NodeAdd);
        assert_eq!(q.lens(), (0, 1, 0));
        tokio::time::sleep(Duration::from_millis(1100)).await;
        q.flush();
        assert_eq!(q.lens(), (1, 0, 0));
    }

    #[tokio::test]
    async fn events_during_the_attempt_count_only_if_they_help() {
        let q = SchedulingQueue::default();
        q.add_or_update(pod("a", 0));
        q.add_or_update(pod("b", 0));
        let _a = q.pop().await;
        q.on_event(ClusterEvent::AssignedPodAdd(pod("other", 0)));
        // AssignedPodAdd cannot help a pod NodeResourcesFit rejected: unschedulable.
        q.requeue_failed("default/a", vec![NODE_RESOURCES_FIT]);
        assert_eq!(q.lens(), (1, 0, 1));
        let _b = q.pop().await;
        q.on_event(ClusterEvent::AssignedPodDelete(pod("other", 0)));
        // It can help pods rejected for resources: `a` moves now, and `b`, in flight
        // when it happened, is retried after its backoff instead of waiting.
        assert_eq!(q.lens(), (0, 1, 0));
        q.requeue_failed("default/b", vec![NODE_RESOURCES_FIT]);
        assert_eq!(q.lens(), (0, 2, 0));
    }

    #[tokio::test]
    async fn status_updates_do_not_requeue() {
        let q = SchedulingQueue::default();
        q.add_or_update(pod("a", 0));
        let _a = q.pop().await;
        q.requeue_failed("default/a", vec![NODE_RESOURCES_FIT]);
        let mut p = (*pod("a", 0)).clone();
        p.status = Some(Default::default());
        p.metadata.resource_version = Some("7".into());
        q.add_or_update(Arc::new(p.clone()));
        assert_eq!(q.lens(), (0, 0, 1));
        p.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
        q.add_or_update(Arc::new(p));
        assert_eq!(q.lens(), (0, 1, 0));
    }

    #[test]
    fn backoff_doubles_to_ten_seconds() {
        let now = Instant::now();
        let mut e = Entry {
            pod: pod("a", 0),
            place: Place::Unschedulable,
            timestamp: now,
            seq: 0,
            attempts: 1,
            last_failure: Some(now),
            unschedulable_since: now,
            plugins: vec![],
            updated_in_flight: false,
            cycle: 0,
        };
        let mut got = Vec::new();
        for a in 1..=6 {
            e.attempts = a;
            got.push(e.backoff_until().map(|t| t.duration_since(now).as_secs()));
        }
        assert_eq!(
            got,
            [Some(1), Some(2), Some(4), Some(8), Some(10), Some(10)]
        );
    }
}
