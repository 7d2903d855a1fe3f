//! `/metrics`: kube-apiserver's request metrics in the Prometheus text format.
//!
//! The series, label names and label values are upstream's (k8s.io/apiserver
//! endpoints/metrics): every request is counted and timed under the labels of its
//! RequestInfo, watches are also gauged while they are open, and the number of stored
//! objects per resource is read from the store at scrape time.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use kumo_storage::{RangeRequest, Store};

use crate::registry::Registry;

/// Upper bounds of `apiserver_request_duration_seconds`, in seconds.
pub const DURATION_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

/// The subresources upstream reports with the verb CONNECT.
const CONNECT_SUBRESOURCES: [&str; 5] = ["log", "exec", "portforward", "attach", "proxy"];

/// The verbs upstream reports as they are; any other is reported as `other`.
const VALID_VERBS: [&str; 14] = [
    "APPLY",
    "CONNECT",
    "CREATE",
    "DELETE",
    "DELETECOLLECTION",
    "GET",
    "LIST",
    "PATCH",
    "POST",
    "PROXY",
    "PUT",
    "UPDATE",
    "WATCH",
    "WATCHLIST",
];

/// What a request is counted under (upstream's label values).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestLabels {
    /// Upper case: GET, LIST, WATCH, POST, PUT, PATCH, APPLY, DELETE, CONNECT.
    pub verb: String,
    /// `""`, `All`, or `invalid`.
    pub dry_run: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    /// The subresource, or the path of a non-resource request.
    pub subresource: String,
    /// `resource` (named object or create), `namespace`, `cluster`, or `""`.
    pub scope: String,
    /// `apiserver`, or `""` for health and OpenAPI paths.
    pub component: String,
}

impl RequestLabels {
    /// Whether the request is a watch, which upstream also gauges while it runs.
    pub fn is_watch(&self) -> bool {
        self.verb == "WATCH"
    }
}

fn truthy(v: &str) -> bool {
    let v = v.to_ascii_lowercase();
    v != "0" && v != "false"
}

/// The labels of a request, or `None` for paths upstream does not instrument (unknown
/// paths and resources, `/version`, discovery documents below `/api` and `/apis`).
pub fn classify(
    registry: &Registry,
    method: &str,
    path: &str,
    query: &BTreeMap<String, String>,
    content_type: Option<&str>,
) -> Option<RequestLabels> {
    let method = method.to_ascii_uppercase();
    let dry_run = match query.get("dryRun") {
        None => String::new(),
        Some(v) if v == "All" => v.clone(),
        Some(_) => "invalid".to_owned(),
    };
    let trimmed = path.trim_end_matches('/');
    let non_resource = |subresource: &str, component: &str| RequestLabels {
        verb: method.clone(),
        dry_run: dry_run.clone(),
        subresource: subresource.to_owned(),
        component: component.to_owned(),
        ..RequestLabels::default()
    };
    if ["/healthz", "/livez", "/readyz"]
        .iter()
        .any(|h| trimmed == *h || trimmed.starts_with(&format!("{h}/")))
    {
        return Some(non_resource(trimmed, ""));
    }
    match trimmed {
        "/api" => return Some(non_resource("api", "apiserver")),
        "/apis" => return Some(non_resource("apis", "apiserver")),
        "/openapi/v3" => return Some(non_resource("openapi/v3", "")),
        p if p.starts_with("/openapi/v3/") => return Some(non_resource("openapi/v3/", "")),
        _ => {}
    }
    let segs: Vec<&str> = trimmed.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, mut rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["api", v, rest @ ..] if !rest.is_empty() => ("", *v, rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        _ => return None,
    };
    // The deprecated `/watch/` paths.
    let watch_path = rest.first() == Some(&"watch");
    if watch_path {
        rest = &rest[1..];
    }
    let namespaced = |plural: &str| {
        registry
            .find(group, version, plural)
            .is_some_and(|r| r.namespaced)
    };
    let (ns, plural, name, sub) = match rest {
        ["namespaces", ns, plural, tail @ ..] if namespaced(plural) => match tail {
            [] => (Some(*ns), *plural, None, None),
            [name] => (Some(*ns), *plural, Some(*name), None),
            [name, sub] => (Some(*ns), *plural, Some(*name), Some(*sub)),
            _ => return None,
        },
        [plural] => (None, *plural, None, None),
        [plural, name] => (None, *plural, Some(*name), None),
        [plural, name, sub] => (None, *plural, Some(*name), Some(*sub)),
        _ => return None,
    };
    registry.find(group, version, plural)?;
    let scope = if name.is_some() || (method == "POST" && name.is_none()) {
        "resource"
    } else if ns.is_some() {
        "namespace"
    } else {
        "cluster"
    };
    let mut verb = match method.as_str() {
        "GET" | "HEAD" if scope != "resource" => "LIST".to_owned(),
        "GET" | "HEAD" => "GET".to_owned(),
        m => m.to_owned(),
    };
    if matches!(method.as_str(), "GET" | "LIST")
        && (watch_path || query.get("watch").is_some_and(|v| truthy(v)))
    {
        verb = "WATCH".into();
    }
    if verb == "PATCH" && content_type == Some(crate::fieldmanager::APPLY_YAML) {
        verb = "APPLY".into();
    }
    if sub.is_some_and(|s| CONNECT_SUBRESOURCES.contains(&s)) {
        verb = "CONNECT".into();
    }
    if !VALID_VERBS.contains(&verb.as_str()) {
        verb = "other".into();
    }
    Some(RequestLabels {
        verb,
        dry_run,
        group: group.to_owned(),
        version: version.to_owned(),
        resource: plural.to_owned(),
        subresource: sub.unwrap_or("").to_owned(),
        scope: scope.to_owned(),
        component: "apiserver".to_owned(),
    })
}

/// One histogram series: per-bucket counts (not cumulative), their sum and count.
#[derive(Default)]
struct Histogram {
    buckets: [u64; DURATION_BUCKETS.len()],
    sum: f64,
    count: u64,
}

#[derive(Default)]
struct Series {
    /// `apiserver_request_total`, by labels and response code.
    requests: BTreeMap<(RequestLabels, u16), u64>,
    /// `apiserver_request_duration_seconds`.
    durations: BTreeMap<RequestLabels, Histogram>,
    /// `apiserver_longrunning_requests` (labels without dry_run).
    longrunning: BTreeMap<RequestLabels, i64>,
    /// The health checks' service-level indicators, by (check, endpoint): the last
    /// result and how many runs passed and failed.
    health: BTreeMap<(String, String), HealthSli>,
}

#[derive(Default)]
struct HealthSli {
    last_ok: bool,
    success: u64,
    error: u64,
}

/// The metrics of one API server.
#[derive(Default)]
pub struct Metrics {
    series: Mutex<Series>,
}

impl Metrics {
    /// Records one run of health check `name` for `endpoint` (`healthz`, `livez`,
    /// `readyz`).
    pub fn observe_health(&self, endpoint: &str, name: &str, ok: bool) {
        let mut s = self.lock();
        let h = s
            .health
            .entry((name.to_owned(), endpoint.to_owned()))
            .or_default();
        h.last_ok = ok;
        if ok {
            h.success += 1;
        } else {
            h.error += 1;
        }
    }

    /// `/metrics/slis`: the health checks' indicators, as component-base's SLI registry
    /// exposes them.
    pub fn render_slis(&self) -> String {
        let s = self.lock();
        let mut out = String::new();
        out.push_str("# HELP kubernetes_healthcheck [STABLE] The result of the last run of a health check (1 passed, 0 failed).\n");
        out.push_str("# TYPE kubernetes_healthcheck gauge\n");
        for ((name, kind), h) in &s.health {
            out.push_str(&format!(
                "kubernetes_healthcheck{{name=\"{name}\",type=\"{kind}\"}} {}\n",
                u8::from(h.last_ok)
            ));
        }
        out.push_str("# HELP kubernetes_healthchecks_total [STABLE] The runs of each health check, by result.\n");
        out.push_str("# TYPE kubernetes_healthchecks_total counter\n");
        for ((name, kind), h) in &s.health {
            for (status, n) in [("error", h.error), ("success", h.success)] {
                if n > 0 {
                    out.push_str(&format!(
                        "kubernetes_healthchecks_total{{name=\"{name}\",status=\"{status}\",type=\"{kind}\"}} {n}\n"
                    ));
                }
            }
        }
        out
    }

    fn lock(&self) -> MutexGuard<'_, Series> {
        match self.series.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Counts a finished request and its duration.
    pub fn observe(&self, labels: &RequestLabels, code: u16, started: Instant) {
        let seconds = started.elapsed().as_secs_f64();
        let mut s = self.lock();
        *s.requests.entry((labels.clone(), code)).or_default() += 1;
        let h = s.durations.entry(labels.clone()).or_default();
        if let Some(i) = DURATION_BUCKETS.iter().position(|b| seconds <= *b) {
            h.buckets[i] += 1;
        }
        h.sum += seconds;
        h.count += 1;
    }

    /// Gauges a long-running request (a watch) until the returned guard is dropped, when
    /// the request is also counted and timed, as upstream does when its handler returns.
    pub fn long_running(
        self: &Arc<Self>,
        labels: RequestLabels,
        code: u16,
        started: Instant,
    ) -> LongRunning {
        let gauge = RequestLabels {
            dry_run: String::new(),
            ..labels.clone()
        };
        *self.lock().longrunning.entry(gauge.clone()).or_default() += 1;
        LongRunning {
            metrics: Arc::clone(self),
            labels,
            gauge,
            code,
            started,
        }
    }

    /// The text exposition of every metric, with the stored object counts read from
    /// `store` now.
    pub async fn render(&self, registry: &Registry, store: &dyn Store) -> String {
        let objects = resource_objects(registry, store).await;
        let mut out = String::new();
        {
            let s = self.lock();
            header(
                &mut out,
                "apiserver_longrunning_requests",
                "[STABLE] Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope and component. Not all requests are tracked this way.",
                "gauge",
            );
            for (l, v) in &s.longrunning {
                let _ = writeln!(
                    out,
                    "apiserver_longrunning_requests{{{}}} {v}",
                    label_text(l, false)
                );
            }
            header(
                &mut out,
                "apiserver_request_duration_seconds",
                "[STABLE] Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.",
                "histogram",
            );
            for (l, h) in &s.durations {
                let labels = label_text(l, true);
                let mut cumulative = 0;
                for (b, n) in DURATION_BUCKETS.iter().zip(h.buckets) {
                    cumulative += n;
                    let _ = writeln!(
                        out,
                        "apiserver_request_duration_seconds_bucket{{{labels},le=\"{b}\"}} {cumulative}"
                    );
                }
                let _ = writeln!(
                    out,
                    "apiserver_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                    h.count
                );
                let _ = writeln!(
                    out,
                    "apiserver_request_duration_seconds_sum{{{labels}}} {}",
                    h.sum
                );
                let _ = writeln!(
                    out,
                    "apiserver_request_duration_seconds_count{{{labels}}} {}",
                    h.count
                );
            }
            header(
                &mut out,
                "apiserver_request_total",
                "[STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.",
                "counter",
            );
            for ((l, code), n) in &s.requests {
                let _ = writeln!(
                    out,
                    "apiserver_request_total{{code=\"{code}\",{}}} {n}",
                    label_text(l, true)
                );
            }
        }
        header(
            &mut out,
            "apiserver_resource_objects",
            "[ALPHA] Number of stored objects at the time of last check split by kind. In case of a fetching error, the value will be -1.",
            "gauge",
        );
        for ((group, resource), n) in objects {
            let _ = writeln!(
                out,
                "apiserver_resource_objects{{group=\"{}\",resource=\"{}\"}} {n}",
                escape(&group),
                escape(&resource)
            );
        }
        header(
            &mut out,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            "gauge",
        );
        let _ = writeln!(out, "process_resident_memory_bytes {}", resident_bytes());
        header(
            &mut out,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            "gauge",
        );
        let _ = writeln!(out, "process_start_time_seconds {}", start_time_seconds());
        out
    }
}

/// An open long-running request; see [`Metrics::long_running`].
pub struct LongRunning {
    metrics: Arc<Metrics>,
    labels: RequestLabels,
    gauge: RequestLabels,
    code: u16,
    started: Instant,
}

impl Drop for LongRunning {
    fn drop(&mut self) {
        {
            let mut s = self.metrics.lock();
            if let Some(v) = s.longrunning.get_mut(&self.gauge) {
                *v -= 1;
            }
        }
        self.metrics.observe(&self.labels, self.code, self.started);
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Label values escaped as the text format requires.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The labels in the name order Prometheus prints them (sorted), without `code`.
fn label_text(l: &RequestLabels, with_dry_run: bool) -> String {
    let mut pairs = vec![("component", &l.component)];
    if with_dry_run {
        pairs.push(("dry_run", &l.dry_run));
    }
    pairs.extend([
        ("group", &l.group),
        ("resource", &l.resource),
        ("scope", &l.scope),
        ("subresource", &l.subresource),
        ("verb", &l.verb),
        ("version", &l.version),
    ]);
    pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Stored objects per (group, resource): the key count under each resource's prefix
/// (-1 when the store fails), each storage prefix once.
async fn resource_objects(
    registry: &Registry,
    store: &dyn Store,
) -> BTreeMap<(String, String), i64> {
    let mut out = BTreeMap::new();
    let mut seen = HashSet::new();
    let group_versions = std::iter::once(("", vec!["v1"])).chain(registry.groups());
    for (group, versions) in group_versions {
        for version in versions {
            for res in registry.in_group_version(group, version) {
                let prefix = res.key_prefix(None);
                if !seen.insert(prefix.clone()) {
                    continue;
                }
                let count = store
                    .range(RangeRequest {
                        prefix: prefix.into_bytes(),
                        start: None,
                        limit: 1,
                        revision: None,
                    })
                    .await
                    .map(|r| i64::try_from(r.count).unwrap_or(i64::MAX))
                    .unwrap_or(-1);
                out.insert((res.group.to_owned(), res.plural.to_owned()), count);
            }
        }
    }
    out
}

/// Resident set size from /proc (0 where it is unavailable).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// When the process started: from /proc (its start in clock ticks after boot, at
/// Linux's fixed USER_HZ of 100, plus the boot time), else when this was first asked.
fn start_time_seconds() -> f64 {
    static START: OnceLock<f64> = OnceLock::new();
    *START.get_or_init(|| {
        let from_proc = || -> Option<f64> {
            let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
            // Fields after the command name, which is in parentheses and may hold spaces.
            let after = stat.rsplit_once(')')?.1;
            let ticks: f64 = after.split_whitespace().nth(19)?.parse().ok()?;
            let boot: f64 = std::fs::read_to_string("/proc/stat")
                .ok()?
                .lines()
                .find_map(|l| l.strip_prefix("btime "))?
                .trim()
                .parse()
                .ok()?;
            Some(boot + ticks / 100.0)
        };
        from_proc().unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        ct: Option<&str>,
    ) -> Option<RequestLabels> {
        let registry = Registry::builtin();
        let q = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        classify(&registry, method, path, &q, ct)
    }

    #[test]
    fn verbs_and_scopes_are_upstreams() {
        let l = labels("GET", "/api/v1/namespaces/d/configmaps", &[], None).unwrap();
        assert_eq!((l.verb.as_str(), l.scope.as_str()), ("LIST", "namespace"));
        let l = labels("GET", "/api/v1/configmaps", &[("watch", "true")], None).unwrap();
        assert_eq!((l.verb.as_str(), l.scope.as_str()), ("WATCH", "cluster"));
        let l = labels(
            "POST",
            "/api/v1/namespaces/d/configmaps",
            &[("dryRun", "All")],
            None,
        )
        .unwrap();
        assert_eq!(
            (l.verb.as_str(), l.scope.as_str(), l.dry_run.as_str()),
            ("POST", "resource", "All")
        );
        let l = labels(
            "PATCH",
            "/apis/apps/v1/namespaces/d/deployments/x/scale",
            &[],
            Some("application/apply-patch+yaml"),
        )
        .unwrap();
        assert_eq!(
            (l.verb.as_str(), l.group.as_str(), l.subresource.as_str()),
            ("APPLY", "apps", "scale")
        );
        let l = labels("GET", "/api/v1/namespaces/d", &[], None).unwrap();
        assert_eq!((l.verb.as_str(), l.scope.as_str()), ("GET", "resource"));
        let l = labels("DELETE", "/api/v1/namespaces/d/pods", &[], None).unwrap();
        assert_eq!((l.verb.as_str(), l.scope.as_str()), ("DELETE", "namespace"));
        let l = labels("GET", "/readyz", &[], None).unwrap();
        assert_eq!(
            (l.subresource.as_str(), l.component.as_str()),
            ("/readyz", "")
        );
        assert!(labels("GET", "/api/v1/nothings", &[], None).is_none());
        assert!(labels("GET", "/version", &[], None).is_none());
    }
}
