//! A component's own metrics in the Prometheus text format, for its secure port's
//! `/metrics`: its work queues (`workqueue_depth`, `workqueue_adds_total`,
//! `workqueue_retries_total` by queue name, as client-go's workqueue reports them) and
//! the gauges it registers (`leader_election_master_status`). One registry per
//! component, so that components sharing a process (`kumo up`) each report their own.

use std::fmt::Write;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// What a work queue reports.
pub trait QueueStats: Send + Sync {
    fn name(&self) -> &str;
    /// Items waiting.
    fn depth(&self) -> usize;
    /// Items added since the queue was made.
    fn adds(&self) -> u64;
    /// Rate-limited re-adds (retries) since the queue was made.
    fn retries(&self) -> u64;
}

/// A gauge read when the metrics are: its name, help, labels and reader.
type Gauge = (
    String,
    String,
    Vec<(String, String)>,
    Box<dyn Fn() -> f64 + Send + Sync>,
);

/// A metric family of the work queues: name, type, help and the value of one queue.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&dyn QueueStats) -> f64,
);

/// One component's metrics.
#[derive(Default)]
pub struct Registry {
    queues: Mutex<Vec<Weak<dyn QueueStats>>>,
    gauges: Mutex<Vec<Gauge>>,
}

impl Registry {
    /// Reports `queue` while it lives.
    pub fn register_queue(&self, queue: Weak<dyn QueueStats>) {
        let mut q = self.queues.lock();
        q.retain(|w| w.strong_count() > 0);
        q.push(queue);
    }

    /// Reports gauge `name{labels}` with the value `read` gives when asked.
    pub fn gauge(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        read: impl Fn() -> f64 + Send + Sync + 'static,
    ) {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.gauges
            .lock()
            .push((name.to_owned(), help.to_owned(), labels, Box::new(read)));
    }

    /// `leader_election_master_status{name}`: 1 while `leading` says this instance holds
    /// the lease `name`, else 0.
    pub fn leader_election(&self, name: &str, leading: tokio::sync::watch::Receiver<bool>) {
        self.gauge(
            "leader_election_master_status",
            "Whether this instance holds the lease (1) or stands by (0).",
            &[("name", name)],
            move || if *leading.borrow() { 1.0 } else { 0.0 },
        );
    }

    /// Everything, in the Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let queues: Vec<Arc<dyn QueueStats>> = self
            .queues
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let families: [Family; 3] = [
            (
                "workqueue_adds_total",
                "counter",
                "Items added to the work queue.",
                |q| q.adds() as f64,
            ),
            (
                "workqueue_depth",
                "gauge",
                "Items waiting in the work queue.",
                |q| q.depth() as f64,
            ),
            (
                "workqueue_retries_total",
                "counter",
                "Items put back in the work queue after a failure.",
                |q| q.retries() as f64,
            ),
        ];
        if !queues.is_empty() {
            for (name, kind, help, value) in families {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
                for q in &queues {
                    let _ = writeln!(out, "{name}{{name={:?}}} {}", q.name(), value(&**q));
                }
            }
        }
        for (name, help, labels, read) in self.gauges.lock().iter() {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{}}} {}",
                labels.join(","),
                read()
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workqueue::WorkQueue;

    #[tokio::test]
    async fn queues_and_gauges_render() {
        let r = Registry::default();
        let q = WorkQueue::<String>::new("deployment");
        r.register_queue(Arc::downgrade(&q) as Weak<dyn QueueStats>);
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        r.gauge(
            "leader_election_master_status",
            "Leading.",
            &[("name", "kcm")],
            || 1.0,
        );
        let text = r.render();
        assert!(
            text.contains("workqueue_adds_total{name=\"deployment\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_depth{name=\"deployment\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE workqueue_retries_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("leader_election_master_status{name=\"kcm\"} 1\n"),
            "{text}"
        );
        drop(q);
        assert!(!r.render().contains("deployment"));
    }
}
