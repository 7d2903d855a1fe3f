//! `kumo bench nodes`: a cluster of many simulated nodes under a steady stream of pods.
//!
//! It starts each component as its own process from this binary, on a temporary data
//! directory (embedded store): `kumo apiserver`, `kumo controller-manager` (as kubeadm runs
//! it, a service account per controller; node-ipam on 100.64.0.0/10, so every node gets a
//! /24), `kumo scheduler` and one
//! `kumo kubelet --sim-nodes N` (whole kubelets: 10 s lease renewals, node status, pod
//! workers). Once every node is Ready it creates `--pods` pods at `--rate` per second and
//! times each from just before its create request until a watch sees it Running (the
//! pod startup latency of the Kubernetes SLO: scheduling included, no image pulls), then
//! keeps the cluster running for `--settle` seconds. It reports the startup latency, the
//! API server's request latency per verb and resource over the load (from the difference
//! of its `apiserver_request_duration_seconds` histograms; the SLO: p99 ≤ 1 s for
//! mutating calls), whether any node stopped being Ready, and each process's CPU and
//! resident memory.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use super::api::{proc_cpu_seconds, proc_memory};
use super::percentile;

#[derive(clap::Args)]
pub struct Args {
    /// Simulated nodes, all in one `kumo kubelet --sim-nodes` process.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Pods created in all.
    #[arg(long, default_value_t = 6000)]
    pods: usize,
    /// Pods created per second.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Seconds the cluster keeps running after the last pod is Running.
    #[arg(long, default_value_t = 30)]
    settle: u64,
    /// Each node's --max-pods.
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// Run the controller-manager and scheduler with leader election (`--leader-elect`);
    /// each exits when it loses its lease, as upstream's do, and the benchmark with it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    leader_elect: bool,
    /// Keep the cluster's data here (default: a temporary directory, removed at the end).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

const NS: &str = "bench";

/// A component process, stopped when dropped.
pub(super) struct Component {
    pub(super) name: &'static str,
    child: tokio::process::Child,
}

impl Component {
    /// This binary with `args`, its output in `<dir>/<name>.log`.
    pub(super) fn spawn(name: &'static str, dir: &Path, args: &[&str]) -> Result<Component> {
        Component::spawn_program(name, &std::env::current_exe()?, dir, args)
    }

    /// `program` with `args`, its output in `<dir>/<name>.log`.
    pub(super) fn spawn_program(
        name: &'static str,
        program: &Path,
        dir: &Path,
        args: &[&str],
    ) -> Result<Component> {
        let exe = program;
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let child = tokio::process::Command::new(exe)
            .args(args)
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Component { name, child })
    }

    pub(super) fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// CPU seconds of each component (by name).
pub(super) fn cpu_of(components: &[Component]) -> BTreeMap<&'static str, f64> {
    components
        .iter()
        .filter_map(|c| Some((c.name, proc_cpu_seconds(Some(c.pid()?))?)))
        .collect()
}

pub async fn run(args: Args) -> Result<()> {
    if args.rate <= 0.0 || args.nodes == 0 {
        bail!("--rate and --nodes must be positive");
    }
    let temp;
    let dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_owned()
        }
    };
    std::fs::create_dir_all(&dir)?;
    let data = dir.join("cluster");
    let d = |p: &str| data.join(p).to_string_lossy().into_owned();
    let data_arg = data.to_string_lossy().into_owned();
    println!(
        "bench nodes: {} nodes, {} pods at {}/s; logs in {}",
        args.nodes,
        args.pods,
        args.rate,
        dir.display()
    );

    let mut components = vec![Component::spawn(
        "apiserver",
        &dir,
        &["apiserver", "--data-dir", &data_arg, "--secure-port", "0"],
    )?];
    let client = wait_for_apiserver(&data, &mut components[0]).await?;
    let leader_elect = format!("--leader-elect={}", args.leader_elect);
    components.push(Component::spawn(
        "controller-manager",
        &dir,
        &[
            "controller-manager",
            "--kubeconfig",
            &d("controller-manager.conf"),
            "--secure-port",
            "0",
            "--allocate-node-cidrs",
            "--cluster-cidr",
            "100.64.0.0/10",
            "--use-service-account-credentials",
            &leader_elect,
        ],
    )?);
    components.push(Component::spawn(
        "scheduler",
        &dir,
        &[
            "scheduler",
            "--kubeconfig",
            &d("scheduler.conf"),
            "--secure-port",
            "0",
            &leader_elect,
        ],
    )?);
    let started = Instant::now();
    let nodes = args.nodes.to_string();
    let max_pods = args.max_pods.to_string();
    components.push(Component::spawn(
        "kubelet",
        &dir,
        &[
            "kubelet",
            "--kubeconfig",
            &d("admin.conf"),
            "--sim-nodes",
            &nodes,
            "--hostname-override",
            "sim",
            "--max-pods",
            &max_pods,
        ],
    )?);

    // Every node Ready, each with its pod range.
    let node_api: Api<Node> = Api::all(client.clone());
    let mut last_report = Instant::now();
    loop {
        let list = node_api.list(&ListParams::default()).await?;
        let ready = list.items.iter().filter(|n| is_ready(n)).count();
        if ready >= args.nodes {
            break;
        }
        check_running(&mut components)?;
        if last_report.elapsed() > Duration::from_secs(10) {
            println!("  {ready}/{} nodes Ready", args.nodes);
            last_report = Instant::now();
        }
        if started.elapsed() > Duration::from_secs(60 + args.nodes as u64 / 10) {
            bail!("only {ready} of {} nodes turned Ready", args.nodes);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let nodes_ready = started.elapsed();
    println!(
        "nodes: {} Ready {:.1} s after the kubelet process started",
        args.nodes,
        nodes_ready.as_secs_f64()
    );

    // Nodes that stop being Ready from now on.
    let not_ready: Arc<Mutex<HashSet<String>>> = Arc::default();
    let node_watch = {
        let not_ready = not_ready.clone();
        let api = node_api.clone();
        tokio::spawn(async move {
            let mut s = watcher::watcher(api, any_unpaged()).boxed();
            while let Some(ev) = s.next().await {
                if let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev {
                    if !is_ready(&n) {
                        let name = n.metadata.name.unwrap_or_default();
                        not_ready
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(name);
                    }
                }
            }
        })
    };

    let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ns_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sa.get_opt("default").await?.is_none() {
        if Instant::now() > deadline {
            bail!("no default ServiceAccount in {NS}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Pods seen Running, with when.
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let running: Arc<Mutex<HashMap<String, Duration>>> = Arc::default();
    let (all_running_tx, mut all_running) = tokio::sync::watch::channel(0usize);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod_watch = {
        let (sent, running, api) = (sent.clone(), running.clone(), pod_api.clone());
        tokio::spawn(async move {
            let mut s = watcher::watcher(api, any_unpaged()).boxed();
            while let Some(ev) = s.next().await {
                let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev else {
                    continue;
                };
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                if phase != Some("Running") {
                    continue;
                }
                let seen = Instant::now();
                let name = p.metadata.name.unwrap_or_default();
                let Some(at) = sent
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&name)
                    .copied()
                else {
                    continue;
                };
                let mut r = running.lock().unwrap_or_else(|e| e.into_inner());
                r.entry(name).or_insert(seen - at);
                let _ = all_running_tx.send(r.len());
            }
        })
    };

    let before = scrape(&client).await?;
    let cpu_before = cpu_of(&components);
    let load_start = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(256));
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for i in 0..args.pods {
        tick.tick().await;
        let permit = gate.clone().acquire_owned().await?;
        let (api, sent, errors) = (pod_api.clone(), sent.clone(), errors.clone());
        tokio::spawn(async move {
            let name = format!("pod-{i}");
            let pod: Pod = match serde_json::from_value(pod_object(&name)) {
                Ok(p) => p,
                Err(e) => {
                    return errors
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(e.to_string())
                }
            };
            sent.lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(name, Instant::now());
            if let Err(e) = api.create(&PostParams::default(), &pod).await {
                errors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(e.to_string());
            }
            drop(permit);
        });
        if i % 1000 == 999 {
            check_running(&mut components)?;
        }
    }
    let create_wall = load_start.elapsed();
    println!(
        "created {} pods in {:.1} s ({:.1}/s)",
        args.pods,
        create_wall.as_secs_f64(),
        args.pods as f64 / create_wall.as_secs_f64()
    );
    let wait = Duration::from_secs(120);
    // (The borrow wait_for returns is let go at once: the watch task sends on.)
    let done = tokio::time::timeout(wait, all_running.wait_for(|n| *n >= args.pods))
        .await
        .is_ok_and(|r| r.is_ok());
    let all_running_after = load_start.elapsed();
    if !done {
        println!(
            "  not every pod Running within {} s of the last create",
            wait.as_secs()
        );
    }
    println!("settling for {} s", args.settle);
    tokio::time::sleep(Duration::from_secs(args.settle)).await;
    check_running(&mut components)?;
    let load_wall = load_start.elapsed();
    let cpu_after = cpu_of(&components);
    let after = scrape(&client).await?;
    pod_watch.abort();
    node_watch.abort();

    // Results.
    let mut lat: Vec<f64> = running
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .map(Duration::as_secs_f64)
        .collect();
    lat.sort_by(f64::total_cmp);
    let errors = errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
    println!();
    println!(
        "pod startup (create -> Running seen by a watch): {} of {} Running, {:.1} s after the first create",
        lat.len(),
        args.pods,
        all_running_after.as_secs_f64()
    );
    println!(
        "  p50 {:.3} s  p90 {:.3} s  p99 {:.3} s  max {:.3} s   (SLO: p99 <= 5 s)",
        percentile(&lat, 50.0),
        percentile(&lat, 90.0),
        percentile(&lat, 99.0),
        lat.last().copied().unwrap_or(f64::NAN)
    );
    if !errors.is_empty() {
        println!("  {} creates failed; first: {}", errors.len(), errors[0]);
    }
    let lost = not_ready.lock().unwrap_or_else(|e| e.into_inner()).len();
    println!("nodes not Ready at some point during the load: {lost}");
    println!();
    println!(
        "API requests during the load ({:.0} s), p99 from the server's histograms:",
        load_wall.as_secs_f64()
    );
    println!(
        "  {:<8} {:<28} {:>9} {:>8} {:>10}",
        "VERB", "RESOURCE", "COUNT", "RATE/s", "P99 <="
    );
    let deltas = histogram_deltas(&before, &after);
    let mut worst_mutating = 0.0f64;
    // Long-running requests are outside the API call latency SLO (a watch lasts minutes).
    for ((verb, resource), h) in deltas
        .iter()
        .filter(|((verb, _), _)| !matches!(verb.as_str(), "WATCH" | "CONNECT"))
    {
        let p99 = h.quantile(0.99);
        if matches!(verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY") {
            worst_mutating = worst_mutating.max(p99);
        }
        println!(
            "  {:<8} {:<28} {:>9} {:>8.1} {:>9} s",
            verb,
            resource,
            h.count,
            h.count as f64 / load_wall.as_secs_f64(),
            fmt_bound(p99)
        );
    }
    println!(
        "  worst mutating p99 <= {} s   (SLO: <= 1 s)",
        fmt_bound(worst_mutating)
    );
    println!();
    println!("processes: CPU over the load (cores = CPU seconds / wall seconds), resident memory");
    for c in &components {
        let cpu = match (cpu_before.get(c.name), cpu_after.get(c.name)) {
            (Some(b), Some(a)) => a - b,
            _ => f64::NAN,
        };
        let (rss, hwm) = c
            .pid()
            .and_then(proc_memory)
            .map_or((f64::NAN, f64::NAN), |(r, h)| {
                (r as f64 / 1024.0, h as f64 / 1024.0)
            });
        println!(
            "  {:<20} {:>8.1} s  {:>5.2} cores  RSS {:>7.0} MiB  peak {:>7.0} MiB",
            c.name,
            cpu,
            cpu / load_wall.as_secs_f64(),
            rss,
            hwm
        );
    }
    if lat.len() < args.pods {
        bail!("{} pods never turned Running", args.pods - lat.len());
    }
    Ok(())
}

/// The pod each create sends: one container, no requests, the sim runtime runs it.
fn pod_object(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]},
    })
}

fn is_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Fails when a component exited.
pub(super) fn check_running(components: &mut [Component]) -> Result<()> {
    for c in components {
        if let Ok(Some(status)) = c.child.try_wait() {
            bail!("{} exited ({status}); see its log", c.name);
        }
    }
    Ok(())
}

/// Waits (30 s) for the API server of `data` to write its admin kubeconfig and be ready.
pub(super) async fn wait_for_apiserver(
    data: &Path,
    apiserver: &mut Component,
) -> Result<kube::Client> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = apiserver.child.try_wait() {
            bail!("apiserver exited ({status}); see its log");
        }
        if data.join("admin.conf").exists() {
            if let Ok((client, _)) = crate::status::admin_client(data).await {
                if crate::status::readyz(&client).await.is_ok() {
                    return Ok(client);
                }
            }
        }
        if Instant::now() > deadline {
            bail!("the API server was not ready within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The server's `/metrics` text.
async fn scrape(client: &kube::Client) -> Result<String> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

/// A latency histogram: cumulative counts per upper bound.
#[derive(Default, Debug, Clone, PartialEq)]
struct Histogram {
    buckets: Vec<(f64, u64)>,
    count: u64,
}

impl Histogram {
    /// The upper bound of the bucket holding quantile `q` (as Prometheus reads a
    /// histogram without interpolating); infinity when it is past the last bound.
    fn quantile(&self, q: f64) -> f64 {
        let want = (q * self.count as f64).ceil() as u64;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= want)
            .map_or(f64::INFINITY, |(le, _)| *le)
    }
}

fn fmt_bound(v: f64) -> String {
    if v.is_infinite() {
        "+Inf".into()
    } else {
        format!("{v}")
    }
}

/// `apiserver_request_duration_seconds` per (verb, resource[/subresource]), summed over
/// the other labels.
fn histograms(metrics: &str) -> BTreeMap<(String, String), Histogram> {
    let mut out: BTreeMap<(String, String), BTreeMap<u64, (f64, u64)>> = BTreeMap::new();
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_duration_seconds_bucket{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(n) = value.trim().parse::<f64>() else {
            continue;
        };
        let labels = parse_labels(labels);
        let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
        let mut resource = get("resource");
        let sub = get("subresource");
        if !sub.is_empty() {
            resource = format!("{resource}/{sub}");
        }
        let key = (get("verb"), resource);
        let le = get("le");
        if le == "+Inf" {
            *counts.entry(key).or_default() += n as u64;
            continue;
        }
        let Ok(bound) = le.parse::<f64>() else {
            continue;
        };
        let slot = out
            .entry(key)
            .or_default()
            .entry(bound.to_bits())
            .or_insert((bound, 0));
        slot.1 += n as u64;
    }
    out.into_iter()
        .map(|(k, b)| {
            let mut buckets: Vec<(f64, u64)> = b.into_values().collect();
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let count = counts.get(&k).copied().unwrap_or(0);
            (k, Histogram { buckets, count })
        })
        .collect()
}

/// `key="value"` pairs of a Prometheus label set (values without escapes, as the API
/// server's labels are).
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    s.split("\",")
        .filter_map(|kv| {
            let (k, v) = kv.split_once("=\"")?;
            Some((k.trim().to_owned(), v.trim_end_matches('"').to_owned()))
        })
        .collect()
}

/// What each histogram of `after` gained since `before`; those with no requests left out.
fn histogram_deltas(before: &str, after: &str) -> BTreeMap<(String, String), Histogram> {
    let before = histograms(before);
    histograms(after)
        .into_iter()
        .filter_map(|(k, a)| {
            let b = before.get(&k).cloned().unwrap_or_default();
            let count = a.count.saturating_sub(b.count);
            if count == 0 {
                return None;
            }
            let buckets = a
                .buckets
                .iter()
                .map(|(le, n)| {
                    let prev = b
                        .buckets
                        .iter()
                        .find(|(l, _)| l == le)
                        .map_or(0, |(_, n)| *n);
                    (*le, n.saturating_sub(prev))
                })
                .collect();
            Some((k, Histogram { buckets, count }))
        })
        .collect()
}

/// Watcher config that lists from the watch cache (`resourceVersion=0`), unpaged: kube-rs drops
/// `resourceVersion=0` from a list with a limit, which would make every relist a consistent read.
pub(super) fn any_unpaged() -> watcher::Config {
    let mut cfg = watcher::Config::default().any_semantic();
    cfg.page_size = None;
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="0.005"} 1
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="1"} 2
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="+Inf"} 2
"#;
    const AFTER: &str = r#"
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="0.005"} 99
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="1"} 101
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="+Inf"} 102
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1",le="0.005"} 0
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1",le="1"} 10
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1",le="+Inf"} 10
"#;

    #[test]
    fn p99_of_what_the_load_added() {
        let d = histogram_deltas(BEFORE, AFTER);
        let post = &d[&("POST".to_owned(), "pods".to_owned())];
        // 100 requests: 98 within 5 ms, 1 within 1 s, 1 slower.
        assert_eq!(post.count, 100);
        assert_eq!(post.quantile(0.98), 0.005);
        assert_eq!(post.quantile(0.99), 1.0);
        assert!(post.quantile(1.0).is_infinite());
        let patch = &d[&("PATCH".to_owned(), "pods/status".to_owned())];
        assert_eq!((patch.count, patch.quantile(0.99)), (10, 1.0));
        // Nothing new: left out.
        assert!(histogram_deltas(AFTER, AFTER).is_empty());
    }
}
