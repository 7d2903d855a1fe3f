//! The kubelet's resource metrics (`/metrics/resource`, what metrics-server scrapes): the
//! CPU time and memory working set of each running container, its pod and the node, in
//! Prometheus text with upstream's metric names and labels, from the runtime's
//! [`ContainerStats`](crate::runtime::ContainerStats).
//!
//! The node's counter must only grow while containers come and go, so it is kept here: the
//! node's own share (system daemons, modelled as [`SYSTEM_NANOCORES`]) plus every CPU
//! nanosecond its containers were seen to use.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use kumo_cri::{ContainerStats, Runtime};

/// What the node itself uses besides its pods: 50m of CPU and 256 MiB of memory.
pub const SYSTEM_NANOCORES: u64 = 50_000_000;
pub const SYSTEM_MEMORY: u64 = 256 << 20;

/// The node's CPU counter.
#[derive(Debug, Default)]
pub struct NodeMeter {
    inner: Mutex<Meter>,
}

#[derive(Debug, Default)]
struct Meter {
    /// Since when the system share is charged.
    since: Option<SystemTime>,
    system_nanos: u64,
    /// CPU nanoseconds of containers that are gone or restarted.
    finished_nanos: u64,
    /// The last figure seen of each container.
    last: HashMap<String, u64>,
}

impl NodeMeter {
    /// The node's cumulative CPU nanoseconds, given the containers running now.
    fn charge(&self, now: SystemTime, running: &HashMap<String, u64>) -> u64 {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let since = *m.since.get_or_insert(now);
        let elapsed = now.duration_since(since).unwrap_or_default();
        m.system_nanos = (SYSTEM_NANOCORES as u128 * elapsed.as_nanos() / 1_000_000_000) as u64;
        let gone: u64 = m
            .last
            .iter()
            .filter(|(id, _)| !running.contains_key(*id))
            .map(|(_, n)| *n)
            .sum();
        m.finished_nanos += gone;
        m.last = running.clone();
        m.system_nanos + m.finished_nanos + running.values().sum::<u64>()
    }
}

/// One running container of a pod, with its figures.
struct Sample {
    namespace: String,
    pod: String,
    container: String,
    started: Option<f64>,
    stats: ContainerStats,
}

/// The runtime's id of a `containerID` (`<runtime>://<id>`).
fn runtime_id(container_id: &str) -> Option<&str> {
    container_id.split_once("://").map(|(_, id)| id)
}

/// The running containers of `pods` (a PodList's items) with the runtime's figures.
fn samples(pods: &[Value], runtime: &dyn Runtime) -> Vec<Sample> {
    let mut out = Vec::new();
    for p in pods {
        let text = |ptr: &str| p.pointer(ptr).and_then(Value::as_str).unwrap_or("");
        for key in ["initContainerStatuses", "containerStatuses"] {
            for st in p
                .pointer(&format!("/status/{key}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let Some(running) = st.pointer("/state/running") else {
                    continue;
                };
                let id = st.get("containerID").and_then(Value::as_str).unwrap_or("");
                let Some(stats) = runtime_id(id).and_then(|id| runtime.container_stats(id)) else {
                    continue;
                };
                let started = running
                    .get("startedAt")
                    .and_then(Value::as_str)
                    .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                    .map(|t| t.as_millisecond() as f64 / 1000.0);
                out.push(Sample {
                    namespace: text("/metadata/namespace").to_owned(),
                    pod: text("/metadata/name").to_owned(),
                    container: st
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                    started,
                    stats,
                });
            }
        }
    }
    out
}

fn millis(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()
}

fn seconds(nanos: u64) -> f64 {
    nanos as f64 / 1e9
}

/// A Prometheus label value, escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The `/metrics/resource` text for the pods bound to the node.
pub fn resource_metrics(pods: &[Value], runtime: &dyn Runtime, node: &NodeMeter) -> String {
    let now = SystemTime::now();
    let samples = samples(pods, runtime);
    let running: HashMap<String, u64> = samples
        .iter()
        .map(|s| {
            let key = format!("{}/{}/{}", s.namespace, s.pod, s.container);
            (key, s.stats.cpu_usage_core_nano_seconds)
        })
        .collect();
    let node_cpu = node.charge(now, &running);
    let node_memory = SYSTEM_MEMORY
        + samples
            .iter()
            .map(|s| s.stats.memory_working_set_bytes)
            .sum::<u64>();
    let mut out = String::new();
    let section = |out: &mut String, name: &str, kind: &str, help: &str, body: String| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        out.push_str(&body);
    };
    let per_container = |f: &dyn Fn(&Sample) -> Option<String>| {
        let mut body = String::new();
        for s in &samples {
            if let Some(v) = f(s) {
                let _ = writeln!(
                    body,
                    "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}} {v}",
                    label(&s.container),
                    label(&s.namespace),
                    label(&s.pod)
                );
            }
        }
        body
    };
    let prefixed = |name: &str, body: String| -> String {
        body.lines().map(|l| format!("{name}{l}\n")).collect()
    };
    section(
        &mut out,
        "container_cpu_usage_seconds_total",
        "counter",
        "CPU time the container has used, in seconds of one core",
        prefixed(
            "container_cpu_usage_seconds_total",
            per_container(&|s| {
                Some(format!(
                    "{} {}",
                    seconds(s.stats.cpu_usage_core_nano_seconds),
                    millis(s.stats.timestamp)
                ))
            }),
        ),
    );
    section(
        &mut out,
        "container_memory_working_set_bytes",
        "gauge",
        "The container's memory working set, in bytes",
        prefixed(
            "container_memory_working_set_bytes",
            per_container(&|s| {
                Some(format!(
                    "{} {}",
                    s.stats.memory_working_set_bytes,
                    millis(s.stats.timestamp)
                ))
            }),
        ),
    );
    section(
        &mut out,
        "container_start_time_seconds",
        "gauge",
        "When the container started, in seconds since the Unix epoch",
        prefixed(
            "container_start_time_seconds",
            per_container(&|s| s.started.map(|t| format!("{t}"))),
        ),
    );
    section(
        &mut out,
        "node_cpu_usage_seconds_total",
        "counter",
        "CPU time the node has used, in seconds of one core",
        format!(
            "node_cpu_usage_seconds_total {} {}\n",
            seconds(node_cpu),
            millis(now)
        ),
    );
    section(
        &mut out,
        "node_memory_working_set_bytes",
        "gauge",
        "The node's memory working set, in bytes",
        format!(
            "node_memory_working_set_bytes {node_memory} {}\n",
            millis(now)
        ),
    );
    let mut by_pod: BTreeMap<(&str, &str), (u64, u64, SystemTime)> = BTreeMap::new();
    for s in &samples {
        let e = by_pod
            .entry((&s.namespace, &s.pod))
            .or_insert((0, 0, s.stats.timestamp));
        e.0 += s.stats.cpu_usage_core_nano_seconds;
        e.1 += s.stats.memory_working_set_bytes;
    }
    let pod_lines = |f: &dyn Fn(&(u64, u64, SystemTime)) -> String, name: &str| {
        by_pod
            .iter()
            .map(|((ns, pod), v)| {
                format!(
                    "{name}{{namespace=\"{}\",pod=\"{}\"}} {}\n",
                    label(ns),
                    label(pod),
                    f(v)
                )
            })
            .collect::<String>()
    };
    section(
        &mut out,
        "pod_cpu_usage_seconds_total",
        "counter",
        "CPU time the pod has used, in seconds of one core",
        pod_lines(
            &|v| format!("{} {}", seconds(v.0), millis(v.2)),
            "pod_cpu_usage_seconds_total",
        ),
    );
    section(
        &mut out,
        "pod_memory_working_set_bytes",
        "gauge",
        "The pod's memory working set, in bytes",
        pod_lines(
            &|v| format!("{} {}", v.1, millis(v.2)),
            "pod_memory_working_set_bytes",
        ),
    );
    section(
        &mut out,
        "resource_scrape_error",
        "gauge",
        "1 when the container figures could not be read, else 0",
        "resource_scrape_error 0\n".into(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_counter_only_grows() {
        let m = NodeMeter::default();
        let t0 = SystemTime::now();
        let a = m.charge(t0, &HashMap::from([("a".to_owned(), 100)]));
        // The container is gone: what it used stays counted.
        let b = m.charge(
            t0 + std::time::Duration::from_secs(1),
            &HashMap::from([("b".to_owned(), 5)]),
        );
        assert!(b >= a + 5, "{a} {b}");
        assert_eq!(b, SYSTEM_NANOCORES + 100 + 5);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c"), "a\\\"b\\\\c");
    }
}
