//! The metrics pipeline: every resolution, each node's kubelet `/metrics/resource` (CPU
//! time and memory working set of the node and its running containers), reached through
//! the API server's node proxy; the last two points of each are kept, and usage is the
//! CPU rate between them and the last memory figure, as metrics-server computes it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use parking_lot::RwLock;

/// One reading of a cumulative CPU counter and a memory gauge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    /// When it was taken (milliseconds since the epoch).
    pub at_ms: i64,
    /// CPU time used so far, in nanoseconds of one core.
    pub cpu_nanos: u64,
    /// The memory working set, in bytes.
    pub memory: u64,
}

/// The last point of something and the one before it.
#[derive(Clone, Copy, Debug, Default)]
struct Series {
    prev: Option<Point>,
    last: Option<Point>,
}

impl Series {
    fn push(&mut self, p: Point) {
        match self.last {
            // The same reading twice (a kubelet that did not move on): keep the pair.
            Some(l) if l.at_ms == p.at_ms => {}
            _ => {
                self.prev = self.last;
                self.last = Some(p);
            }
        }
    }

    /// CPU (nanocores), memory (bytes), when, and over what window: from the last two
    /// points, or from a synthetic start point for a young container.
    fn usage(&self, start_ms: Option<i64>, resolution: Duration) -> Option<Usage> {
        let last = self.last?;
        let prev = match self.prev {
            Some(p) => p,
            // A container that started less than a resolution ago (and at least 10 s
            // ago) is measured from its start, as metrics-server does, so that it shows
            // up at its first scrape.
            None => {
                let start = start_ms?;
                let age = last.at_ms - start;
                if age < 10_000 || age > resolution.as_millis() as i64 {
                    return None;
                }
                Point {
                    at_ms: start,
                    cpu_nanos: 0,
                    memory: last.memory,
                }
            }
        };
        let window_ms = last.at_ms - prev.at_ms;
        if window_ms <= 0 || last.cpu_nanos < prev.cpu_nanos {
            return None;
        }
        let nanocores = (last.cpu_nanos - prev.cpu_nanos) as u128 * 1000 / window_ms as u128;
        Some(Usage {
            nanocores: nanocores as u64,
            memory: last.memory,
            at_ms: last.at_ms,
            window: Duration::from_millis(window_ms as u64),
        })
    }
}

/// Usage over a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub nanocores: u64,
    pub memory: u64,
    /// The end of the window (milliseconds since the epoch).
    pub at_ms: i64,
    pub window: Duration,
}

/// A node's metrics.
#[derive(Clone, Debug)]
pub struct NodeMetrics {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub usage: Usage,
}

/// A pod's metrics: one usage per container.
#[derive(Clone, Debug)]
pub struct PodMetrics {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub at_ms: i64,
    pub window: Duration,
    pub containers: Vec<(String, Usage)>,
}

/// (namespace, pod, container).
type ContainerKey = (String, String, String);

/// A container's usage (if measured), by pod.
type ByPod = BTreeMap<(String, String), Vec<(String, Option<Usage>)>>;

/// One scrape's figures of a container: CPU (when, seconds), memory, start (ms).
type Reading = (Option<(i64, f64)>, Option<u64>, Option<i64>);

/// What the scrapes found.
#[derive(Debug, Default)]
struct State {
    nodes: HashMap<String, Series>,
    node_labels: HashMap<String, BTreeMap<String, String>>,
    containers: HashMap<ContainerKey, (Series, Option<i64>)>,
    /// Running pods and their labels.
    pods: HashMap<(String, String), BTreeMap<String, String>>,
}

/// The scraped metrics, shared by the scraper and the API.
#[derive(Debug)]
pub struct Store {
    state: RwLock<State>,
    resolution: Duration,
}

impl Store {
    pub fn new(resolution: Duration) -> Arc<Store> {
        Arc::new(Store {
            state: RwLock::default(),
            resolution,
        })
    }

    /// The metrics of every node that has them, by name.
    pub fn nodes(&self) -> Vec<NodeMetrics> {
        let s = self.state.read();
        let mut out: Vec<NodeMetrics> = s
            .nodes
            .iter()
            .filter_map(|(name, series)| {
                Some(NodeMetrics {
                    name: name.clone(),
                    labels: s.node_labels.get(name).cloned().unwrap_or_default(),
                    usage: series.usage(None, self.resolution)?,
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The metrics of every running pod whose containers all have them, by namespace
    /// and name.
    pub fn pods(&self) -> Vec<PodMetrics> {
        let s = self.state.read();
        let mut by_pod: ByPod = BTreeMap::new();
        for ((ns, pod, c), (series, start)) in &s.containers {
            if !s.pods.contains_key(&(ns.clone(), pod.clone())) {
                continue;
            }
            by_pod
                .entry((ns.clone(), pod.clone()))
                .or_default()
                .push((c.clone(), series.usage(*start, self.resolution)));
        }
        by_pod
            .into_iter()
            .filter_map(|((ns, name), containers)| {
                // A pod is shown only when every container it runs is measured.
                let mut cs: Vec<(String, Usage)> = containers
                    .into_iter()
                    .map(|(c, u)| u.map(|u| (c, u)))
                    .collect::<Option<_>>()?;
                cs.sort_by(|a, b| a.0.cmp(&b.0));
                // The window of the container measured earliest.
                let first = cs.iter().min_by_key(|(_, u)| u.at_ms)?.1;
                Some(PodMetrics {
                    labels: s
                        .pods
                        .get(&(ns.clone(), name.clone()))
                        .cloned()
                        .unwrap_or_default(),
                    namespace: ns,
                    name,
                    at_ms: first.at_ms,
                    window: first.window,
                    containers: cs,
                })
            })
            .collect()
    }

    /// Takes one node's `/metrics/resource` text.
    pub fn record_node(&self, node: &str, text: &str) -> Result<(), String> {
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines).map_err(|e| e.to_string())?;
        let mut node_cpu = None;
        let mut node_mem = None;
        let mut containers: HashMap<ContainerKey, Reading> = HashMap::new();
        for sample in &scrape.samples {
            let value = match sample.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => continue,
            };
            let at = sample.timestamp.timestamp_millis();
            let key = || -> Option<ContainerKey> {
                Some((
                    sample.labels.get("namespace")?.to_owned(),
                    sample.labels.get("pod")?.to_owned(),
                    sample.labels.get("container")?.to_owned(),
                ))
            };
            match sample.metric.as_str() {
                "node_cpu_usage_seconds_total" => node_cpu = Some((at, value)),
                "node_memory_working_set_bytes" => node_mem = Some(value as u64),
                "container_cpu_usage_seconds_total" => {
                    if let Some(k) = key() {
                        containers.entry(k).or_default().0 = Some((at, value));
                    }
                }
                "container_memory_working_set_bytes" => {
                    if let Some(k) = key() {
                        containers.entry(k).or_default().1 = Some(value as u64);
                    }
                }
                "container_start_time_seconds" => {
                    if let Some(k) = key() {
                        containers.entry(k).or_default().2 = Some((value * 1000.0) as i64);
                    }
                }
                _ => {}
            }
        }
        let mut s = self.state.write();
        // Points with no CPU or no memory are dropped, as metrics-server drops them.
        if let (Some((at, cpu)), Some(mem)) = (node_cpu, node_mem) {
            if cpu > 0.0 && mem > 0 {
                s.nodes.entry(node.to_owned()).or_default().push(Point {
                    at_ms: at,
                    cpu_nanos: (cpu * 1e9) as u64,
                    memory: mem,
                });
            }
        }
        for (k, (cpu, mem, start)) in containers {
            let (Some((at, cpu)), Some(mem)) = (cpu, mem) else {
                continue;
            };
            if cpu <= 0.0 || mem == 0 {
                continue;
            }
            let e = s.containers.entry(k).or_default();
            e.0.push(Point {
                at_ms: at,
                cpu_nanos: (cpu * 1e9) as u64,
                memory: mem,
            });
            e.1 = start;
        }
        Ok(())
    }

    /// Forgets nodes, pods and containers that are gone.
    fn retain(
        &self,
        nodes: &HashMap<String, BTreeMap<String, String>>,
        pods: HashMap<(String, String), BTreeMap<String, String>>,
    ) {
        let mut s = self.state.write();
        s.nodes.retain(|n, _| nodes.contains_key(n));
        s.node_labels = nodes.clone();
        s.containers
            .retain(|(ns, pod, _), _| pods.contains_key(&(ns.clone(), pod.clone())));
        s.pods = pods;
    }
}

fn labels(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

/// Scrapes every node once, through the API server's node proxy.
pub async fn scrape_once(client: &kube::Client, store: &Store) -> Result<(), kube::Error> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields("status.phase=Running"))
        .await?;
    let node_labels: HashMap<String, BTreeMap<String, String>> = nodes
        .items
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, labels(&n.metadata))))
        .collect();
    let running: HashMap<(String, String), BTreeMap<String, String>> = pods
        .items
        .iter()
        .filter_map(|p| {
            Some((
                (p.metadata.namespace.clone()?, p.metadata.name.clone()?),
                labels(&p.metadata),
            ))
        })
        .collect();
    let scrapes = node_labels.keys().map(|name| {
        let client = client.clone();
        let name = name.clone();
        async move {
            let path = format!("/api/v1/nodes/{name}/proxy/metrics/resource");
            let req = http::Request::get(path).body(Vec::new());
            let got = match req {
                Ok(req) => {
                    tokio::time::timeout(Duration::from_secs(10), client.request_text(req)).await
                }
                Err(e) => return (name, Err(e.to_string())),
            };
            match got {
                Ok(Ok(text)) => (name, Ok(text)),
                Ok(Err(e)) => (name, Err(e.to_string())),
                Err(_) => (name, Err("timed out after 10s".into())),
            }
        }
    });
    for (node, got) in futures::future::join_all(scrapes).await {
        let recorded = got.and_then(|text| store.record_node(&node, &text));
        if let Err(e) = recorded {
            tracing::debug!(node, error = %e, "failed to scrape the node's resource metrics");
        }
    }
    store.retain(&node_labels, running);
    Ok(())
}

/// Scrapes every `resolution` until the task is dropped.
pub async fn run(client: crate::ClientFn, store: Arc<Store>) {
    let mut tick = tokio::time::interval(store.resolution);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = scrape_once(&client(), &store).await {
            tracing::info!(error = %e, "listing nodes and pods to scrape failed");
        }
    }
}

/// Milliseconds since the epoch of `t`.
pub fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(at_ms: i64, node_cpu: f64, c_cpu: f64, start: f64) -> String {
        format!(
            "# TYPE node_cpu_usage_seconds_total counter\n\
             node_cpu_usage_seconds_total {node_cpu} {at_ms}\n\
             # TYPE node_memory_working_set_bytes gauge\n\
             node_memory_working_set_bytes 1048576 {at_ms}\n\
             # TYPE container_cpu_usage_seconds_total counter\n\
             container_cpu_usage_seconds_total{{container=\"c\",namespace=\"ns\",pod=\"p\"}} {c_cpu} {at_ms}\n\
             # TYPE container_memory_working_set_bytes gauge\n\
             container_memory_working_set_bytes{{container=\"c\",namespace=\"ns\",pod=\"p\"}} 8388608 {at_ms}\n\
             # TYPE container_start_time_seconds gauge\n\
             container_start_time_seconds{{container=\"c\",namespace=\"ns\",pod=\"p\"}} {start}\n"
        )
    }

    #[test]
    fn usage_is_the_rate_between_two_scrapes() {
        let store = Store::new(Duration::from_secs(15));
        let t0 = 1_700_000_000_000;
        let pods = HashMap::from([(("ns".into(), "p".into()), BTreeMap::new())]);
        // Started long ago: one scrape is not enough.
        store
            .record_node("n", &text(t0, 10.0, 1.0, 1_600_000_000.0))
            .unwrap();
        store.retain(
            &HashMap::from([("n".into(), BTreeMap::new())]),
            pods.clone(),
        );
        assert!(store.nodes().is_empty());
        assert!(store.pods().is_empty());
        // 15 s later: the node used 3 s of CPU (200m), the container 0.75 s (50m).
        store
            .record_node("n", &text(t0 + 15_000, 13.0, 1.75, 1_600_000_000.0))
            .unwrap();
        let nodes = store.nodes();
        assert_eq!(nodes[0].usage.nanocores, 200_000_000);
        assert_eq!(nodes[0].usage.window, Duration::from_secs(15));
        let pods = store.pods();
        assert_eq!(pods[0].containers[0].1.nanocores, 50_000_000);
        assert_eq!(pods[0].containers[0].1.memory, 8 << 20);
    }

    #[test]
    fn a_young_container_is_measured_from_its_start() {
        let store = Store::new(Duration::from_secs(15));
        let t0: i64 = 1_700_000_000_000;
        let start = (t0 - 12_000) as f64 / 1000.0;
        store.record_node("n", &text(t0, 10.0, 0.6, start)).unwrap();
        store.retain(
            &HashMap::from([("n".into(), BTreeMap::new())]),
            HashMap::from([(("ns".into(), "p".into()), BTreeMap::new())]),
        );
        let pods = store.pods();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].containers[0].1.nanocores, 50_000_000);
        assert_eq!(pods[0].window, Duration::from_secs(12));
    }

    #[test]
    fn a_counter_that_went_back_gives_no_usage() {
        let mut s = Series::default();
        s.push(Point {
            at_ms: 1000,
            cpu_nanos: 10,
            memory: 1,
        });
        s.push(Point {
            at_ms: 2000,
            cpu_nanos: 5,
            memory: 1,
        });
        assert_eq!(s.usage(None, Duration::from_secs(15)), None);
    }
}
