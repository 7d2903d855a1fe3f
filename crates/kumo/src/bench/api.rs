//! `kumo bench api`: a load generator for any Kubernetes API server.
//!
//! It creates a namespace `kumo-bench-<random>`, pre-creates `--objects` objects of
//! each resource in it, then measures one verb at a time at each concurrency: N workers,
//! each issuing requests back to back for `--seconds` (a closed loop); see `RUN_ORDER`. Every request is
//! timed from just before it is sent until its whole response body has arrived. The watch
//! step opens N watches on the namespace and measures the time from issuing a write to each
//! watcher receiving its event. At the end it deletes what it created and the namespace.
//!
//! Requests are raw `http::Request`s sent through one shared `kube::Client` (HTTP/1.1 with
//! a connection pool, so N workers use N connections; each worker makes one untimed request
//! before the clock starts, so TLS handshakes are not measured). Retries are off: a 429 is
//! an error, as is every other non-2xx answer except a 409 Conflict on update (a stale
//! resourceVersion), which is counted on its own.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures::StreamExt;
use http::{header, Method, Request, StatusCode};
use kube::client::Body;
use kube::core::WatchEvent;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};

use super::percentile;

#[derive(clap::Args)]
pub struct Args {
    /// kubeconfig of the API server to load (its current context).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Seconds each step (one verb at one concurrency) runs.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Concurrencies to measure: workers for request verbs, watchers for watch.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 16, 128])]
    concurrency: Vec<usize>,
    /// Objects of each resource pre-created for get, list, update and patch.
    #[arg(long, default_value_t = 500)]
    objects: usize,
    /// Items per page for list-paged (default: objects / 10, so a walk is 10 pages).
    #[arg(long)]
    page_size: Option<usize>,
    /// Bytes of data in each object (a ConfigMap data value; a Pod annotation).
    #[arg(long, default_value_t = 1024)]
    object_bytes: usize,
    /// Resources to load. Pods need no nodes: they are created and stay Pending.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Resource::Configmaps])]
    resources: Vec<Resource>,
    /// Verbs to measure (default: all).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = ALL_VERBS.to_vec())]
    verbs: Vec<Verb>,
    /// Pause between the writes of the watch step, in milliseconds, so that it measures
    /// delivery rather than queueing behind a burst.
    #[arg(long, default_value_t = 5)]
    watch_interval_ms: u64,
    /// Writers of the watch step, each creating objects back to back (with the pause above
    /// between its writes). More than one, with no pause, saturates the server's fan-out, so
    /// that the step measures how many events it can deliver rather than one writer's
    /// round trip.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    watch_writers: u16,
    /// Server processes on this machine to sample (resident memory from /proc/PID/status,
    /// CPU time from /proc/PID/stat); comma-separated, e.g. an API server and its etcd.
    #[arg(long, value_delimiter = ',')]
    pid: Vec<u32>,
    /// A directory made by `scripts/reference up --dir D`: sample the kube-apiserver and etcd
    /// whose pids it recorded in D/pids.
    #[arg(long)]
    reference_dir: Option<PathBuf>,
    /// Per-request timeout in seconds; a request that takes longer is an error.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// Also write the results as tab-separated lines to this file (used by scripts/bench-api
    /// to compare two servers).
    #[arg(long)]
    output: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Resource {
    Configmaps,
    Pods,
}

impl Resource {
    fn plural(self) -> &'static str {
        match self {
            Resource::Configmaps => "configmaps",
            Resource::Pods => "pods",
        }
    }
    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Verb {
    /// POST of a new object.
    Create,
    /// GET of one pre-created object.
    Get,
    /// LIST with a label selector matching a tenth of the pre-created objects.
    List,
    /// LIST of all pre-created objects with limit/continue; each page is one request.
    ListPaged,
    /// LIST of all pre-created objects in one request (no limit).
    ListAll,
    /// PUT of the last object seen, with its resourceVersion.
    Update,
    /// PATCH, application/merge-patch+json.
    PatchMerge,
    /// PATCH, application/strategic-merge-patch+json.
    PatchStrategic,
    /// N watchers on the namespace; delivery latency of each write to each watcher.
    Watch,
    /// DELETE of the objects the create and watch steps made.
    Delete,
}

const ALL_VERBS: [Verb; 10] = [
    Verb::Create,
    Verb::Get,
    Verb::List,
    Verb::ListPaged,
    Verb::ListAll,
    Verb::Update,
    Verb::PatchMerge,
    Verb::PatchStrategic,
    Verb::Watch,
    Verb::Delete,
];

/// The order the steps run in at each concurrency: reads and writes of the pre-created
/// objects first, so that they always see exactly `--objects` objects in the namespace; then
/// create, watch, and delete of what those two made (anything left is removed untimed).
const RUN_ORDER: [Verb; 10] = [
    Verb::Get,
    Verb::List,
    Verb::ListPaged,
    Verb::ListAll,
    Verb::Update,
    Verb::PatchMerge,
    Verb::PatchStrategic,
    Verb::Create,
    Verb::Watch,
    Verb::Delete,
];

impl Verb {
    fn name(self) -> &'static str {
        match self {
            Verb::Create => "create",
            Verb::Get => "get",
            Verb::List => "list",
            Verb::ListPaged => "list-paged",
            Verb::ListAll => "list-all",
            Verb::Update => "update",
            Verb::PatchMerge => "patch-merge",
            Verb::PatchStrategic => "patch-strategic",
            Verb::Watch => "watch",
            Verb::Delete => "delete",
        }
    }
}

/// A server process sampled through /proc.
struct Proc {
    name: String,
    pid: u32,
}

/// Resident memory of a process: (VmRSS, VmHWM) in KiB.
pub(super) fn proc_memory(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Proportional set size of a process in KiB (`/proc/PID/smaps_rollup`): its resident
/// pages with each shared page divided among the processes that map it, so that the
/// executable's pages, shared by every process of one binary, count once in a sum.
pub(super) fn proc_pss(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
}

/// User + system CPU time of a process in seconds (`pid` None: this process).
pub(super) fn proc_cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name (which is in parentheses and may contain spaces):
    // state is the first; utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // USER_HZ: the kernel reports these in 1/100 s on every Linux architecture.
    Some((utime + stime) as f64 / 100.0)
}

/// CPU seconds the whole machine has been busy (all cores), from /proc/stat.
fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = cpu
        .split_whitespace()
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy: u64 = ticks.iter().take(8).sum::<u64>() - ticks.get(3)? - ticks.get(4)?;
    Some(busy as f64 / 100.0)
}

/// CPU seconds used so far by this process, by the sampled server processes and by the
/// whole machine.
#[derive(Clone, Copy)]
struct CpuMark {
    client: f64,
    server: Option<f64>,
    machine: Option<f64>,
}

fn cpu_mark(procs: &[Proc]) -> CpuMark {
    let server = if procs.is_empty() {
        None
    } else {
        procs
            .iter()
            .map(|p| proc_cpu_seconds(Some(p.pid)))
            .sum::<Option<f64>>()
    };
    CpuMark {
        client: proc_cpu_seconds(None).unwrap_or(f64::NAN),
        server,
        machine: machine_busy_seconds(),
    }
}

/// A small, fast PRNG (splitmix64); the benchmark needs spread, not secrecy.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// Percent-encodes a query parameter value.
fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What one step recorded.
#[derive(Default)]
struct Recorder {
    lat_ms: Vec<f64>,
    errors: u64,
    conflicts: u64,
    /// The first few error messages, for the report.
    messages: Vec<String>,
}

impl Recorder {
    fn ok(&mut self, since: Instant) {
        self.lat_ms.push(since.elapsed().as_secs_f64() * 1000.0);
    }
    fn err(&mut self, msg: impl Into<String>) {
        self.errors += 1;
        if self.messages.len() < 3 {
            self.messages.push(msg.into());
        }
    }
    fn merge(&mut self, other: Recorder) {
        self.lat_ms.extend(other.lat_ms);
        self.errors += other.errors;
        self.conflicts += other.conflicts;
        for m in other.messages {
            if self.messages.len() < 3 {
                self.messages.push(m);
            }
        }
    }
}

/// One row of the table.
struct Row {
    resource: Resource,
    verb: Verb,
    conc: usize,
    ops: usize,
    ops_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    conflicts: u64,
    client_cpu_pct: f64,
    server_cpu_pct: Option<f64>,
    /// Everything else on the machine: other people's work competing for the cores.
    other_cpu_pct: Option<f64>,
    messages: Vec<String>,
}

fn row(
    resource: Resource,
    verb: Verb,
    conc: usize,
    mut rec: Recorder,
    elapsed: f64,
    (cpu0, cpu1, cpu_secs): (CpuMark, CpuMark, f64),
) -> Row {
    rec.lat_ms.sort_by(f64::total_cmp);
    let pct = |a: f64, b: f64| (b - a) / cpu_secs.max(0.001) * 100.0;
    Row {
        resource,
        verb,
        conc,
        ops: rec.lat_ms.len(),
        ops_per_sec: rec.lat_ms.len() as f64 / elapsed,
        p50_ms: percentile(&rec.lat_ms, 50.0),
        p99_ms: percentile(&rec.lat_ms, 99.0),
        errors: rec.errors,
        conflicts: rec.conflicts,
        client_cpu_pct: pct(cpu0.client, cpu1.client),
        server_cpu_pct: cpu0.server.zip(cpu1.server).map(|(a, b)| pct(a, b)),
        other_cpu_pct: cpu0.machine.zip(cpu1.machine).map(|(a, b)| {
            let server = cpu0.server.zip(cpu1.server).map_or(0.0, |(a, b)| b - a);
            pct(a + (cpu1.client - cpu0.client) + server, b).max(0.0)
        }),
        messages: rec.messages,
    }
}

/// A response, read to its end.
struct Resp {
    status: StatusCode,
    body: Vec<u8>,
}

impl Resp {
    /// "409 Conflict: <the Status message>" for the error report.
    fn describe(&self) -> String {
        let message = serde_json::from_slice::<Value>(&self.body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| {
                String::from_utf8_lossy(&self.body)
                    .chars()
                    .take(200)
                    .collect()
            });
        format!("{}: {message}", self.status)
    }
}

/// The parts of a list response the benchmark checks.
#[derive(Deserialize)]
struct ListBody {
    #[serde(default)]
    items: Vec<IgnoredAny>,
    #[serde(default)]
    metadata: ListMeta,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(rename = "continue", default)]
    cont: Option<String>,
    #[serde(rename = "resourceVersion", default)]
    resource_version: Option<String>,
}

/// The parts of a watched object the benchmark needs.
#[derive(Clone, Deserialize)]
struct MinObject {
    metadata: MinMeta,
}

#[derive(Clone, Deserialize)]
struct MinMeta {
    #[serde(default)]
    name: String,
}

const JSON: &str = "application/json";
const MERGE_PATCH: &str = "application/merge-patch+json";
const STRATEGIC_PATCH: &str = "application/strategic-merge-patch+json";

struct Bench {
    client: kube::Client,
    ns: String,
    objects: usize,
    groups: usize,
    page_size: usize,
    payload: String,
    seconds: f64,
    timeout: Duration,
    watch_interval: Duration,
    watch_writers: usize,
    /// The last version seen of each pre-created object, per resource: updates PUT it back.
    cache: [Vec<Mutex<Option<Value>>>; 2],
    /// Names made by the create and watch steps, per resource, for the delete step.
    created: [Mutex<Vec<String>>; 2],
    /// Makes every written value different, so that no write is a no-op.
    seq: AtomicU64,
    steps: AtomicU64,
    seed: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Bench {
    fn coll(&self, res: Resource) -> String {
        format!("/api/v1/namespaces/{}/{}", self.ns, res.plural())
    }

    fn item(&self, res: Resource, name: &str) -> String {
        format!("{}/{name}", self.coll(res))
    }

    fn pre_name(idx: usize) -> String {
        format!("pre-{idx:06}")
    }

    fn object(&self, res: Resource, name: &str, labels: Value) -> Vec<u8> {
        let v = match res {
            Resource::Configmaps => json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "labels": labels},
                "data": {"payload": self.payload, "counter": "0"},
            }),
            Resource::Pods => json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {"kumo-bench/payload": self.payload},
                },
                "spec": {
                    // Set explicitly, and no token volume: updates PUT back what they read.
                    "serviceAccountName": "default",
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                },
            }),
        };
        serde_json::to_vec(&v).unwrap_or_default()
    }

    /// Sends one request and reads the whole response.
    async fn call(
        &self,
        method: Method,
        uri: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<Resp> {
        let mut b = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::ACCEPT, JSON);
        if let Some(ct) = content_type {
            b = b.header(header::CONTENT_TYPE, ct);
        }
        let req = b.body(Body::from(body))?;
        let fut = async {
            let res = self.client.send(req).await?;
            let status = res.status();
            let body = res.into_body().collect_bytes().await?;
            anyhow::Ok(Resp {
                status,
                body: Vec::from(body),
            })
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| anyhow!("no answer within {:?}", self.timeout))?
    }

    fn store(&self, res: Resource, idx: usize, body: &[u8]) {
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            *lock(&self.cache[res.index()][idx]) = Some(v);
        }
    }

    /// GETs a pre-created object (untimed) and caches it.
    async fn refresh(&self, res: Resource, idx: usize) -> Result<Value> {
        let r = self
            .call(
                Method::GET,
                &self.item(res, &Self::pre_name(idx)),
                None,
                vec![],
            )
            .await?;
        if !r.status.is_success() {
            bail!("GET for update: {}", r.describe());
        }
        let v: Value = serde_json::from_slice(&r.body)?;
        *lock(&self.cache[res.index()][idx]) = Some(v.clone());
        Ok(v)
    }

    /// The pre-created object a writer works on: worker w of `conc` owns objects w, w+conc,
    /// w+2·conc, ... so writers do not race each other (unless conc > objects).
    fn owned(&self, conc: usize, w: usize, i: u64) -> usize {
        if w >= self.objects {
            return w % self.objects;
        }
        let owned = (self.objects - w).div_ceil(conc);
        w + (i as usize % owned) * conc
    }

    fn next_value(&self, w: usize) -> String {
        format!("{w}-{}", self.seq.fetch_add(1, Ordering::Relaxed))
    }

    /// One operation of `verb` by worker `w`; records into `rec`. Returns false when the
    /// worker has nothing left to do (delete ran out of objects).
    #[allow(clippy::too_many_arguments)]
    async fn op(
        &self,
        verb: Verb,
        res: Resource,
        conc: usize,
        w: usize,
        i: u64,
        rng: &mut Rng,
        deadline: Option<Instant>,
        rec: &mut Recorder,
    ) -> bool {
        match verb {
            Verb::Create => {
                let name = format!("c{conc}-{w}-{i}-{}", self.seed % 1000);
                let body = self.object(res, &name, json!({"kumo-bench/set": "created"}));
                let t = Instant::now();
                match self
                    .call(Method::POST, &self.coll(res), Some(JSON), body)
                    .await
                {
                    Ok(r) if r.status.is_success() => {
                        rec.ok(t);
                        lock(&self.created[res.index()]).push(name);
                    }
                    Ok(r) => rec.err(r.describe()),
                    Err(e) => rec.err(format!("{e:#}")),
                }
            }
            Verb::Get => {
                let uri = self.item(res, &Self::pre_name(rng.below(self.objects)));
                let t = Instant::now();
                match self.call(Method::GET, &uri, None, vec![]).await {
                    Ok(r) if r.status.is_success() => rec.ok(t),
                    Ok(r) => rec.err(r.describe()),
                    Err(e) => rec.err(format!("{e:#}")),
                }
            }
            Verb::List => {
                let g = rng.below(self.groups);
                let expected =
                    self.objects / self.groups + usize::from(g < self.objects % self.groups);
                let uri = format!(
                    "{}?labelSelector={}",
                    self.coll(res),
                    enc(&format!("kumo-bench/group={g}"))
                );
                let t = Instant::now();
                match self.call(Method::GET, &uri, None, vec![]).await {
                    Ok(r) if r.status.is_success() => {
                        rec.ok(t);
                        match serde_json::from_slice::<ListBody>(&r.body) {
                            Ok(l) if l.items.len() == expected => {}
                            Ok(l) => rec.err(format!(
                                "list returned {} items, expected {expected}",
                                l.items.len()
                            )),
                            Err(e) => rec.err(format!("list body: {e}")),
                        }
                    }
                    Ok(r) => rec.err(r.describe()),
                    Err(e) => rec.err(format!("{e:#}")),
                }
            }
            Verb::ListAll => {
                let uri = format!(
                    "{}?labelSelector={}",
                    self.coll(res),
                    enc("kumo-bench/set=pre")
                );
                let t = Instant::now();
                match self.call(Method::GET, &uri, None, vec![]).await {
                    Ok(r) if r.status.is_success() => {
                        rec.ok(t);
                        match serde_json::from_slice::<ListBody>(&r.body) {
                            Ok(l) if l.items.len() == self.objects => {}
                            Ok(l) => rec.err(format!(
                                "list returned {} items, expected {}",
                                l.items.len(),
                                self.objects
                            )),
                            Err(e) => rec.err(format!("list body: {e}")),
                        }
                    }
                    Ok(r) => rec.err(r.describe()),
                    Err(e) => rec.err(format!("{e:#}")),
                }
            }
            Verb::ListPaged => {
                // One walk over all pre-created objects; every page is timed on its own.
                let selector = enc("kumo-bench/set=pre");
                let mut cont: Option<String> = None;
                let mut seen = 0;
                loop {
                    let mut uri = format!(
                        "{}?labelSelector={selector}&limit={}",
                        self.coll(res),
                        self.page_size
                    );
                    if let Some(c) = &cont {
                        uri.push_str("&continue=");
                        uri.push_str(&enc(c));
                    }
                    let t = Instant::now();
                    let page = match self.call(Method::GET, &uri, None, vec![]).await {
                        Ok(r) if r.status.is_success() => {
                            rec.ok(t);
                            match serde_json::from_slice::<ListBody>(&r.body) {
                                Ok(l) => l,
                                Err(e) => {
                                    rec.err(format!("list body: {e}"));
                                    break;
                                }
                            }
                        }
                        Ok(r) => {
                            rec.err(r.describe());
                            break;
                        }
                        Err(e) => {
                            rec.err(format!("{e:#}"));
                            break;
                        }
                    };
                    seen += page.items.len();
                    cont = page.metadata.cont.filter(|c| !c.is_empty());
                    if cont.is_none() {
                        if seen != self.objects {
                            rec.err(format!(
                                "paginated list returned {seen} items, expected {}",
                                self.objects
                            ));
                        }
                        break;
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break;
                    }
                }
            }
            Verb::Update => {
                let idx = self.owned(conc, w, i);
                let cached = lock(&self.cache[res.index()][idx]).clone();
                let mut obj = match cached {
                    Some(v) => v,
                    None => match self.refresh(res, idx).await {
                        Ok(v) => v,
                        Err(e) => {
                            rec.err(format!("{e:#}"));
                            return true;
                        }
                    },
                };
                let value = Value::String(self.next_value(w));
                match res {
                    Resource::Configmaps => obj["data"]["counter"] = value,
                    Resource::Pods => obj["metadata"]["annotations"]["kumo-bench/updated"] = value,
                }
                let body = serde_json::to_vec(&obj).unwrap_or_default();
                let uri = self.item(res, &Self::pre_name(idx));
                let t = Instant::now();
                match self.call(Method::PUT, &uri, Some(JSON), body).await {
                    Ok(r) if r.status.is_success() => {
                        rec.ok(t);
                        self.store(res, idx, &r.body);
                    }
                    Ok(r) if r.status == StatusCode::CONFLICT => {
                        rec.conflicts += 1;
                        if let Err(e) = self.refresh(res, idx).await {
                            rec.err(format!("{e:#}"));
                        }
                    }
                    Ok(r) => rec.err(r.describe()),
                    Err(e) => rec.err(format!("{e:#}")),
                }
            }
            Verb::PatchMerge | Verb::PatchStrategic => {
                let idx = self.owned(conc, w, i);
                let value = self.next_value(w);
                let (ct, patch) = match (verb, res) {
                    (Verb::PatchMerge, Resource::Configmaps) => {
                        (MERGE_PATCH, json!({"data": {"counter": value}}))
                    }
                    (Verb::PatchMerge, Resource::Pods) => (
                        MERGE_PATCH,
                        json!({"metadata": {"annotations": {"kumo-bench/merge": value}}}),
                    ),
                    (_, Resource::Configmaps) => (
                        STRATEGIC_PATCH,
                        json!({"metadata": {"annotations": {"kumo-bench/strategic": value}}}),
                    ),
                    // Merges into the container named "c" (merge key `name`).
                    (_, Resource::Pods) => (
                        STRATEGIC_PATCH,
                        json!({"spec": {"containers": [
                            {"name": "c", "image": format!("registry.k8s.io/pause:v{value}")}
                        ]}}),
                    ),
                };
                let body = serde_json::to_vec(&patch).unwrap_or_default();
                let uri = self.item(res, &Self::pre_name(idx));
                let t = Instant::now();
                match self.call(Method::PATCH, &uri, Some(ct), body).await {
                    Ok(r) if r.status.is_success() => {
                        rec.ok(t);
                        self.store(res, idx, &r.body);
                    }
                    Ok(r) => rec.err(r.describe()),
                    Err(e) => rec.err(format!("{e:#}")),
                }
            }
            Verb::Delete => {
                let Some(name) = lock(&self.created[res.index()]).pop() else {
                    return false;
                };
                let t = Instant::now();
                match self
                    .call(Method::DELETE, &self.item(res, &name), None, vec![])
                    .await
                {
                    Ok(r) if r.status.is_success() => rec.ok(t),
                    Ok(r) => rec.err(r.describe()),
                    Err(e) => rec.err(format!("{e:#}")),
                }
            }
            Verb::Watch => unreachable!("watch is not a closed-loop verb"),
        }
        true
    }

    /// `conc` workers each run `verb` back to back for `seconds`.
    async fn closed_loop(
        self: &Arc<Self>,
        procs: &[Proc],
        res: Resource,
        verb: Verb,
        conc: usize,
    ) -> Result<Row> {
        let barrier = Arc::new(tokio::sync::Barrier::new(conc + 1));
        let mut tasks = Vec::with_capacity(conc);
        for w in 0..conc {
            let b = self.clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng::new(b.seed ^ ((w as u64) << 20) ^ conc as u64);
                // One untimed request first: it opens this worker's connection.
                let mut warm = Recorder::default();
                b.op(verb, res, conc, w, 0, &mut rng, None, &mut warm).await;
                barrier.wait().await;
                let deadline = Instant::now() + Duration::from_secs_f64(b.seconds);
                let mut rec = Recorder::default();
                let mut i = 1;
                while Instant::now() < deadline {
                    if !b
                        .op(verb, res, conc, w, i, &mut rng, Some(deadline), &mut rec)
                        .await
                    {
                        break;
                    }
                    i += 1;
                }
                (rec, Instant::now())
            }));
        }
        barrier.wait().await;
        let start = Instant::now();
        let cpu0 = cpu_mark(procs);
        let mut rec = Recorder::default();
        let mut end = start;
        for t in tasks {
            let (r, e) = t.await?;
            rec.merge(r);
            end = end.max(e);
        }
        let cpu1 = cpu_mark(procs);
        let elapsed = end.duration_since(start).as_secs_f64();
        Ok(row(res, verb, conc, rec, elapsed, (cpu0, cpu1, elapsed)))
    }

    /// `conc` watchers on the namespace; `watch_writers` writers each create objects
    /// `watch_interval` apart for `seconds`; the latency is from issuing each write to each watcher's event.
    async fn watch_step(
        self: &Arc<Self>,
        procs: &[Proc],
        res: Resource,
        conc: usize,
    ) -> Result<Row> {
        let step = self.steps.fetch_add(1, Ordering::Relaxed);
        let label = format!("w{conc}-{step}");
        // Watch from the current resourceVersion, as an informer does after its list: the
        // server need not look at the objects already there.
        let r = self
            .call(
                Method::GET,
                &format!("{}?limit=1", self.coll(res)),
                None,
                vec![],
            )
            .await?;
        if !r.status.is_success() {
            bail!("list before watch: {}", r.describe());
        }
        let rv = serde_json::from_slice::<ListBody>(&r.body)?
            .metadata
            .resource_version
            .context("list before watch: no resourceVersion")?;
        let uri = format!(
            "{}?watch=true&labelSelector={}&resourceVersion={}&timeoutSeconds={}",
            self.coll(res),
            enc(&format!("kumo-bench/watch={label}")),
            enc(&rv),
            self.seconds as u64 + 300
        );
        // A watch is established once its response headers have arrived (kube-apiserver
        // registers the watcher before it sends them); all are, before the first write.
        let opens = (0..conc).map(|_| {
            let client = self.client.clone();
            let uri = uri.clone();
            async move {
                let req = Request::get(&uri).body(Vec::new())?;
                let stream = client.request_events::<MinObject>(req).await?;
                anyhow::Ok(stream)
            }
        });
        let streams = tokio::time::timeout(
            self.timeout.max(Duration::from_secs(60)),
            futures::future::try_join_all(opens),
        )
        .await
        .context("opening watches timed out")?
        .context("opening watches")?;

        enum Seen {
            Event(usize, Instant),
            Failed(String),
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Seen>();
        let mut watchers = Vec::with_capacity(conc);
        for s in streams {
            let tx = tx.clone();
            let prefix = format!("{label}-");
            watchers.push(tokio::spawn(async move {
                let mut s = std::pin::pin!(s);
                while let Some(ev) = s.next().await {
                    let seen = match ev {
                        Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => {
                            let at = Instant::now();
                            match o
                                .metadata
                                .name
                                .strip_prefix(&prefix)
                                .and_then(|i| i.parse().ok())
                            {
                                Some(i) => Seen::Event(i, at),
                                None => Seen::Failed(format!(
                                    "unexpected object {} in watch",
                                    o.metadata.name
                                )),
                            }
                        }
                        Ok(WatchEvent::Deleted(_)) | Ok(WatchEvent::Bookmark(_)) => continue,
                        Ok(WatchEvent::Error(s)) => {
                            Seen::Failed(format!("watch error event: {s:?}"))
                        }
                        Err(e) => Seen::Failed(format!("watch stream: {e}")),
                    };
                    if tx.send(seen).is_err() {
                        return;
                    }
                }
                let _ = tx.send(Seen::Failed("watch ended early".into()));
            }));
        }
        drop(tx);

        // Each write's index, the instant it was issued and whether it succeeded.
        struct Writes {
            sent: Vec<Instant>,
            ok: Vec<bool>,
            errors: Vec<String>,
        }
        let writes = Mutex::new(Writes {
            sent: Vec::new(),
            ok: Vec::new(),
            errors: Vec::new(),
        });
        let cpu0 = cpu_mark(procs);
        let start = Instant::now();
        let deadline = start + Duration::from_secs_f64(self.seconds);
        let writer = || async {
            while Instant::now() < deadline {
                let i = {
                    let mut w = lock(&writes);
                    w.sent.push(Instant::now());
                    w.ok.push(false);
                    w.sent.len() - 1
                };
                let name = format!("{label}-{i}");
                let body = self.object(
                    res,
                    &name,
                    json!({"kumo-bench/set": "watch", "kumo-bench/watch": label}),
                );
                let failed = match self
                    .call(Method::POST, &self.coll(res), Some(JSON), body)
                    .await
                {
                    Ok(r) if r.status.is_success() => {
                        lock(&self.created[res.index()]).push(name);
                        None
                    }
                    Ok(r) => Some(format!("watch step write: {}", r.describe())),
                    Err(e) => Some(format!("watch step write: {e:#}")),
                };
                {
                    let mut w = lock(&writes);
                    match failed {
                        None => w.ok[i] = true,
                        Some(m) => w.errors.push(m),
                    }
                }
                tokio::time::sleep(self.watch_interval).await;
            }
        };
        futures::future::join_all((0..self.watch_writers).map(|_| writer())).await;
        let Writes {
            sent,
            ok: written,
            errors,
        } = writes.into_inner().unwrap_or_else(|e| e.into_inner());
        let mut rec = Recorder::default();
        for m in errors {
            rec.err(m);
        }
        let writes_done = Instant::now();
        let expected = written.iter().filter(|w| **w).count() * conc;
        let mut got = 0;
        let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
        while got < expected {
            match tokio::time::timeout_at(give_up, rx.recv()).await {
                Ok(Some(Seen::Event(i, at))) => {
                    if written.get(i).copied().unwrap_or(false) {
                        rec.lat_ms
                            .push(at.duration_since(sent[i]).as_secs_f64() * 1000.0);
                        got += 1;
                    }
                }
                Ok(Some(Seen::Failed(m))) => rec.err(m),
                Ok(None) | Err(_) => break,
            }
        }
        let cpu1 = cpu_mark(procs);
        for w in &watchers {
            w.abort();
        }
        if got < expected {
            rec.errors += (expected - got) as u64 - 1;
            rec.err(format!(
                "{} of {expected} watch events not delivered within 30 s",
                expected - got
            ));
        }
        // Throughput: events delivered per second of writing. CPU: over writing and
        // collecting.
        let elapsed = writes_done.duration_since(start).as_secs_f64();
        let cpu_secs = start.elapsed().as_secs_f64();
        Ok(row(
            res,
            Verb::Watch,
            conc,
            rec,
            elapsed,
            (cpu0, cpu1, cpu_secs),
        ))
    }

    /// Creates the namespace (and, for pods, its default ServiceAccount) and the
    /// pre-created objects.
    async fn setup(self: &Arc<Self>, resources: &[Resource]) -> Result<()> {
        let ns = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.ns, "labels": {"kumo-bench": "true"}},
        });
        let r = self
            .call(
                Method::POST,
                "/api/v1/namespaces",
                Some(JSON),
                serde_json::to_vec(&ns)?,
            )
            .await?;
        if !r.status.is_success() {
            bail!("creating namespace {}: {}", self.ns, r.describe());
        }
        if resources.contains(&Resource::Pods) {
            // Pods need their ServiceAccount; without a controller-manager nobody makes it.
            let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
            let r = self
                .call(
                    Method::POST,
                    &format!("/api/v1/namespaces/{}/serviceaccounts", self.ns),
                    Some(JSON),
                    serde_json::to_vec(&sa)?,
                )
                .await?;
            if !r.status.is_success() && r.status != StatusCode::CONFLICT {
                bail!("creating ServiceAccount default: {}", r.describe());
            }
        }
        for &res in resources {
            let next = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            for _ in 0..16 {
                let b = self.clone();
                let next = next.clone();
                tasks.push(tokio::spawn(async move {
                    loop {
                        let idx = next.fetch_add(1, Ordering::Relaxed) as usize;
                        if idx >= b.objects {
                            return anyhow::Ok(());
                        }
                        let labels = json!({
                            "kumo-bench/set": "pre",
                            "kumo-bench/group": (idx % b.groups).to_string(),
                        });
                        let body = b.object(res, &Self::pre_name(idx), labels);
                        let r = b.call(Method::POST, &b.coll(res), Some(JSON), body).await?;
                        if !r.status.is_success() {
                            bail!("creating {}: {}", Self::pre_name(idx), r.describe());
                        }
                        b.store(res, idx, &r.body);
                    }
                }));
            }
            for t in tasks {
                t.await??;
            }
        }
        Ok(())
    }

    /// Deletes (untimed) what the create and watch steps made and delete left.
    async fn remove_created(&self, res: Resource) -> Result<()> {
        let left = std::mem::take(&mut *lock(&self.created[res.index()]));
        if left.is_empty() {
            return Ok(());
        }
        let uri = format!(
            "{}?labelSelector={}",
            self.coll(res),
            enc("kumo-bench/set in (created,watch)")
        );
        let r = self.call(Method::DELETE, &uri, None, vec![]).await?;
        if !r.status.is_success() {
            bail!(
                "deleting {} left-over {}: {}",
                left.len(),
                res.plural(),
                r.describe()
            );
        }
        Ok(())
    }

    async fn delete_namespace(&self) -> Result<()> {
        let uri = format!("/api/v1/namespaces/{}", self.ns);
        let r = self.call(Method::DELETE, &uri, None, vec![]).await?;
        if !r.status.is_success() && r.status != StatusCode::NOT_FOUND {
            bail!("deleting namespace {}: {}", self.ns, r.describe());
        }
        Ok(())
    }

    async fn namespace_gone_within(&self, secs: u64) -> Result<bool> {
        let uri = format!("/api/v1/namespaces/{}", self.ns);
        let until = Instant::now() + Duration::from_secs(secs);
        loop {
            let r = self.call(Method::GET, &uri, None, vec![]).await?;
            if r.status == StatusCode::NOT_FOUND {
                return Ok(true);
            }
            if Instant::now() >= until {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes everything in the namespace and the namespace. Without a namespace
    /// controller (the reference runs without kube-controller-manager) the namespace would
    /// stay Terminating, so after 5 s the bench removes its `kubernetes` finalizer itself,
    /// as the controller does once the namespace is empty.
    async fn cleanup(&self, resources: &[Resource]) -> Result<String> {
        let mut kinds: Vec<&str> = resources.iter().map(|r| r.plural()).collect();
        if resources.contains(&Resource::Pods) {
            kinds.push("serviceaccounts");
        }
        for plural in kinds {
            let uri = format!("/api/v1/namespaces/{}/{plural}", self.ns);
            let r = self.call(Method::DELETE, &uri, None, vec![]).await?;
            if !r.status.is_success() && r.status != StatusCode::NOT_FOUND {
                bail!("deleting all {plural}: {}", r.describe());
            }
        }
        let ns_uri = format!("/api/v1/namespaces/{}", self.ns);
        self.delete_namespace().await?;
        if self.namespace_gone_within(5).await? {
            return Ok(format!("namespace {} deleted", self.ns));
        }
        let r = self.call(Method::GET, &ns_uri, None, vec![]).await?;
        if r.status == StatusCode::NOT_FOUND {
            return Ok(format!("namespace {} deleted", self.ns));
        }
        let mut ns: Value = serde_json::from_slice(&r.body)?;
        ns["spec"]["finalizers"] = json!([]);
        let r = self
            .call(
                Method::PUT,
                &format!("{ns_uri}/finalize"),
                Some(JSON),
                serde_json::to_vec(&ns)?,
            )
            .await?;
        if !r.status.is_success() {
            bail!("finalizing namespace {}: {}", self.ns, r.describe());
        }
        self.delete_namespace().await?;
        if !self.namespace_gone_within(15).await? {
            bail!("namespace {} still exists after deletion", self.ns);
        }
        Ok(format!(
            "namespace {} deleted (finalized by the bench: no namespace controller acted within 5 s)",
            self.ns
        ))
    }
}

fn kib_to_mib(k: u64) -> f64 {
    k as f64 / 1024.0
}

pub async fn run(args: Args) -> Result<()> {
    if args.objects == 0 {
        bail!("--objects must be at least 1");
    }
    if args.concurrency.contains(&0) {
        bail!("--concurrency values must be at least 1");
    }
    let mut procs: Vec<Proc> = args
        .pid
        .iter()
        .map(|&pid| Proc {
            name: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "server".into()),
            pid,
        })
        .collect();
    if let Some(dir) = &args.reference_dir {
        for name in ["kube-apiserver", "etcd"] {
            let f = dir.join("pids").join(format!("{name}.pid"));
            let pid: u32 = std::fs::read_to_string(&f)
                .with_context(|| format!("reading {}", f.display()))?
                .trim()
                .parse()
                .with_context(|| format!("parsing {}", f.display()))?;
            procs.push(Proc {
                name: name.into(),
                pid,
            });
        }
    }
    for p in &procs {
        if proc_memory(p.pid).is_none() {
            bail!(
                "process {} ({}) is not running on this machine",
                p.pid,
                p.name
            );
        }
    }
    let idle: Vec<Option<(u64, u64)>> = procs.iter().map(|p| proc_memory(p.pid)).collect();

    let kubeconfig = kube::config::Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    // Every answer counts as it comes: no transparent retry of 429/503/504.
    config.default_retry = false;
    config.connect_timeout = Some(Duration::from_secs(10));
    let server = config.cluster_url.to_string();
    let client = kumo_client::transport::client(config)?;
    let version = client
        .apiserver_version()
        .await
        .with_context(|| format!("reaching {server}"))?;

    let seed = seed();
    let mut rng = Rng::new(seed);
    let suffix: String = (0..6)
        .map(|_| b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.below(36)] as char)
        .collect();
    let payload: String = (0..args.object_bytes)
        .map(|_| {
            b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[rng.below(62)] as char
        })
        .collect();
    let groups = args.objects.min(10);
    let page_size = args.page_size.unwrap_or(args.objects / 10).max(1);
    let bench = Arc::new(Bench {
        client,
        ns: format!("kumo-bench-{suffix}"),
        objects: args.objects,
        groups,
        page_size,
        payload,
        seconds: args.seconds,
        timeout: Duration::from_secs_f64(args.timeout),
        watch_interval: Duration::from_millis(args.watch_interval_ms),
        watch_writers: usize::from(args.watch_writers),
        cache: [
            (0..args.objects).map(|_| Mutex::new(None)).collect(),
            (0..args.objects).map(|_| Mutex::new(None)).collect(),
        ],
        created: [Mutex::new(Vec::new()), Mutex::new(Vec::new())],
        seq: AtomicU64::new(0),
        steps: AtomicU64::new(0),
        seed,
    });

    let loadavg = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    println!(
        "kumo bench api: {server} ({} {}), client on {} cores, load average {loadavg}",
        version.git_version,
        version.platform,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!("namespace: {}", bench.ns);
    println!(
        "{} {} of {} B data pre-created; {} s per step; list: 1/{groups} of them by label; \
         list-paged: limit {page_size}; watch: {} writer(s), writes {} ms apart",
        args.objects,
        args.resources
            .iter()
            .map(|r| r.plural())
            .collect::<Vec<_>>()
            .join(" and "),
        args.object_bytes,
        args.seconds,
        args.watch_writers,
        args.watch_interval_ms,
    );

    let started = Instant::now();
    let mut loaded_lines: Vec<String> = Vec::new();
    let body = async {
        bench.setup(&args.resources).await?;
        eprintln!(
            "set up {} in {:.1} s",
            bench.ns,
            started.elapsed().as_secs_f64()
        );
        // Resident memory with the pre-created objects stored, before any step runs.
        for p in &procs {
            if let Some((rss, _)) = proc_memory(p.pid) {
                println!(
                    "memory of {} (pid {}) with the {} objects stored: {:.1} MiB RSS",
                    p.name,
                    p.pid,
                    args.objects,
                    kib_to_mib(rss)
                );
                loaded_lines.push(format!("loaded\t{}\t{}\t{rss}", p.name, p.pid));
            }
        }
        let mut rows = Vec::new();
        for &conc in &args.concurrency {
            for &res in &args.resources {
                for &verb in RUN_ORDER.iter().filter(|v| args.verbs.contains(v)) {
                    let r = if verb == Verb::Watch {
                        bench.watch_step(&procs, res, conc).await?
                    } else {
                        bench.closed_loop(&procs, res, verb, conc).await?
                    };
                    eprintln!(
                        "  {:<10} {:<15} {:>4}: {:>9.1} ops/s  p99 {:>8.2} ms  errors {}",
                        res.plural(),
                        verb.name(),
                        conc,
                        r.ops_per_sec,
                        r.p99_ms,
                        r.errors
                    );
                    rows.push(r);
                }
                bench.remove_created(res).await?;
            }
        }
        anyhow::Ok(rows)
    };
    let outcome = tokio::select! {
        r = body => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
    };
    let end_mem: Vec<Option<(u64, u64)>> = procs.iter().map(|p| proc_memory(p.pid)).collect();
    let total_client_cpu = proc_cpu_seconds(None).unwrap_or(f64::NAN);
    let mut rows = match outcome {
        Ok(rows) => rows,
        Err(e) => {
            if let Err(c) = bench.cleanup(&args.resources).await {
                eprintln!("cleaning up {} failed too: {c:#}", bench.ns);
            }
            return Err(e);
        }
    };

    rows.sort_by_key(|r| {
        (
            args.resources.iter().position(|x| *x == r.resource),
            ALL_VERBS.iter().position(|x| *x == r.verb),
            r.conc,
        )
    });
    println!();
    println!(
        "{:<10} {:<15} {:>5} {:>8} {:>10} {:>8} {:>8} {:>6} {:>5} {:>7} {:>7} {:>7}",
        "resource",
        "verb",
        "conc",
        "ops",
        "ops/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "409s",
        "cli cpu",
        "srv cpu",
        "oth cpu"
    );
    for r in &rows {
        println!(
            "{:<10} {:<15} {:>5} {:>8} {:>10.1} {:>8.2} {:>8.2} {:>6} {:>5} {:>6.0}% {:>7} {:>7}",
            r.resource.plural(),
            r.verb.name(),
            r.conc,
            r.ops,
            r.ops_per_sec,
            r.p50_ms,
            r.p99_ms,
            r.errors,
            r.conflicts,
            r.client_cpu_pct,
            r.server_cpu_pct
                .map_or_else(|| "-".to_owned(), |p| format!("{p:.0}%")),
            r.other_cpu_pct
                .map_or_else(|| "-".to_owned(), |p| format!("{p:.0}%")),
        );
    }
    println!();
    println!(
        "ops: requests answered 2xx (list-paged: pages; watch: events delivered to all watchers); \
         p50/p99: request latency (watch: from issuing a write to a watcher's event); \
         409s: update conflicts, not errors; cpu: % of one core during the step \
         (cli: this process; srv: {}; oth: everything else on the machine)",
        if procs.is_empty() {
            "not sampled, give --pid".to_owned()
        } else {
            procs
                .iter()
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
                .join(" + ")
        }
    );
    println!(
        "client CPU over the whole run: {:.1} s in {:.1} s",
        total_client_cpu,
        started.elapsed().as_secs_f64()
    );
    let mut mem_lines = Vec::new();
    let mut totals = (0u64, 0u64, 0u64);
    for ((p, i), e) in procs.iter().zip(&idle).zip(&end_mem) {
        let (Some((idle_rss, _)), Some((end_rss, peak))) = (i, e) else {
            println!("memory of {} (pid {}): not readable", p.name, p.pid);
            continue;
        };
        totals = (totals.0 + idle_rss, totals.1 + end_rss, totals.2 + peak);
        println!(
            "memory of {} (pid {}): idle {:.1} MiB RSS before the run; {:.1} MiB RSS at the end, peak {:.1} MiB (VmHWM)",
            p.name,
            p.pid,
            kib_to_mib(*idle_rss),
            kib_to_mib(*end_rss),
            kib_to_mib(*peak)
        );
        mem_lines.push(format!(
            "mem\t{}\t{}\t{idle_rss}\t{end_rss}\t{peak}",
            p.name, p.pid
        ));
    }
    if procs.len() > 1 {
        println!(
            "memory of all {} server processes: idle {:.1} MiB, end {:.1} MiB, peaks summed {:.1} MiB",
            procs.len(),
            kib_to_mib(totals.0),
            kib_to_mib(totals.1),
            kib_to_mib(totals.2)
        );
        mem_lines.push(format!(
            "mem\ttotal\t-\t{}\t{}\t{}",
            totals.0, totals.1, totals.2
        ));
    }
    let total_errors: u64 = rows.iter().map(|r| r.errors).sum();
    if total_errors > 0 {
        println!("errors: {total_errors}; first messages:");
        for r in rows.iter().filter(|r| r.errors > 0) {
            for m in &r.messages {
                println!(
                    "  {} {} {}: {m}",
                    r.resource.plural(),
                    r.verb.name(),
                    r.conc
                );
            }
        }
    } else {
        println!("errors: 0");
    }
    if let Some(out) = &args.output {
        let mut text = String::from(
            "# step\tresource\tverb\tconc\tops\tops_per_s\tp50_ms\tp99_ms\terrors\tconflicts\tclient_cpu_pct\tserver_cpu_pct\tother_cpu_pct\n\
             # mem\tprocess\tpid\tidle_kib\tend_kib\tpeak_kib\n\
             # loaded\tprocess\tpid\trss_kib_with_the_objects_stored\n",
        );
        for r in &rows {
            text.push_str(&format!(
                "step\t{}\t{}\t{}\t{}\t{:.2}\t{:.3}\t{:.3}\t{}\t{}\t{:.1}\t{}\t{}\n",
                r.resource.plural(),
                r.verb.name(),
                r.conc,
                r.ops,
                r.ops_per_sec,
                r.p50_ms,
                r.p99_ms,
                r.errors,
                r.conflicts,
                r.client_cpu_pct,
                r.server_cpu_pct
                    .map_or_else(|| "-".to_owned(), |p| format!("{p:.1}")),
                r.other_cpu_pct
                    .map_or_else(|| "-".to_owned(), |p| format!("{p:.1}")),
            ));
        }
        for l in mem_lines.into_iter().chain(loaded_lines) {
            text.push_str(&l);
            text.push('\n');
        }
        std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    }
    // Last, so that the figures are out even if the server fails to clean up.
    // A failed clean-up (e.g. a deletecollection of 100 000 pods outlasting the request
    // timeout) does not void the figures: report it and go on.
    match bench.cleanup(&args.resources).await {
        Ok(cleaned) => println!("{cleaned}"),
        Err(e) => eprintln!("warning: cleaning up namespace {} failed: {e:#}", bench.ns),
    }
    Ok(())
}
