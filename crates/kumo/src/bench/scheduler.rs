//! `kumo bench scheduler`: scheduler_perf's SchedulingBasic shape, `kumo scheduler` and the
//! real kube-scheduler side by side.
//!
//! Each round starts a fresh `kumo apiserver` (embedded store) per scheduler, with the same
//! workload as upstream's `SchedulingBasic/5000Nodes_10000Pods`: `--nodes` nodes from
//! scheduler_perf's node template (4 CPU, 32 GiB, 110 pods, Ready), `--init-pods` pods
//! scheduled first, then `--pods` measured pods from its pod template (100m CPU and 500 MiB
//! requested, a container port). As in scheduler_perf, where the test API server runs
//! without the ServiceAccount and TaintNodesByCondition admission plugins and no controller
//! manager, the benchmark creates each namespace's `default` ServiceAccount itself and
//! clears the not-ready taint the API server puts on a new node. Both schedulers run as
//! processes with leader election off and no client-side rate limit that binds
//! (kube-scheduler gets scheduler_perf's QPS and burst of 5000 through a
//! KubeSchedulerConfiguration file; kube-rs has no limiter).
//!
//! The figure is the issue's: measured pods per second from just before the first create
//! to the last bind a watch sees (`spec.nodeName` set). It also prints upstream's
//! SchedulingThroughput view (pods bound per one-second window: average and median), each
//! scheduler's CPU seconds over the measured phase and its resident memory. Rounds alternate
//! which scheduler goes first; the summary gives medians and the ratio kumo / kube-scheduler.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use super::api::{proc_cpu_seconds, proc_memory};
use super::nodes::{any_unpaged, check_running, wait_for_apiserver, Component};
use super::percentile;

#[derive(clap::Args)]
pub struct Args {
    /// Nodes (Node objects only: scheduler_perf's nodes run no kubelet).
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Pods scheduled before the measured ones.
    #[arg(long, default_value_t = 1000)]
    init_pods: usize,
    /// Measured pods.
    #[arg(long, default_value_t = 10000)]
    pods: usize,
    /// Rounds; each runs both schedulers, alternating which goes first.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Create requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// The kube-scheduler binary (default: `.reference/bin/kube-scheduler` of the
    /// current directory, as `scripts/reference build` leaves it).
    #[arg(long)]
    kube_scheduler: Option<PathBuf>,
    /// Run only this scheduler: `kumo` or `kube-scheduler` (default both).
    #[arg(long)]
    only: Option<String>,
    /// Keep each run's data and logs here (default: a temporary directory).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Which {
    Kumo,
    KubeScheduler,
}

impl Which {
    fn label(self) -> &'static str {
        match self {
            Which::Kumo => "kumo scheduler",
            Which::KubeScheduler => "kube-scheduler",
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
struct Run {
    /// Measured pods per second, first create to last bind.
    throughput: f64,
    /// Pods bound per one-second window (upstream's SchedulingThroughput samples).
    window_avg: f64,
    window_p50: f64,
    /// Seconds from the first create to the last bind, and to the last create answer.
    wall: f64,
    create_wall: f64,
    scheduler_cpu: f64,
    apiserver_cpu: f64,
    scheduler_rss_mib: f64,
}

const INIT_NS: &str = "namespace-1";
const MEASURE_NS: &str = "namespace-2";

pub async fn run(args: Args) -> Result<()> {
    if args.nodes == 0 || args.pods == 0 || args.rounds == 0 || args.concurrency == 0 {
        bail!("--nodes, --pods, --rounds and --concurrency must be positive");
    }
    let which: Vec<Which> = match args.only.as_deref() {
        None => vec![Which::Kumo, Which::KubeScheduler],
        Some("kumo") => vec![Which::Kumo],
        Some("kube-scheduler") => vec![Which::KubeScheduler],
        Some(other) => bail!("--only takes kumo or kube-scheduler, not {other:?}"),
    };
    let kube_scheduler = match &args.kube_scheduler {
        Some(p) => p.clone(),
        None => std::env::current_dir()?.join(".reference/bin/kube-scheduler"),
    };
    if which.contains(&Which::KubeScheduler) && !kube_scheduler.is_file() {
        bail!(
            "no kube-scheduler at {}: build the reference binaries (`scripts/reference build`), \
             pass --kube-scheduler PATH, or run with --only kumo",
            kube_scheduler.display()
        );
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
    println!(
        "bench scheduler: SchedulingBasic shape, {} nodes, {} init pods, {} measured pods, \
         {} round(s); logs in {}",
        args.nodes,
        args.init_pods,
        args.pods,
        args.rounds,
        dir.display()
    );
    let mut results: Vec<(Which, Run)> = Vec::new();
    for round in 0..args.rounds {
        let mut order = which.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for w in order {
            let run_dir = dir.join(format!(
                "round{}-{}",
                round + 1,
                match w {
                    Which::Kumo => "kumo",
                    Which::KubeScheduler => "kube-scheduler",
                }
            ));
            std::fs::create_dir_all(&run_dir)?;
            println!("round {}: {}", round + 1, w.label());
            let r = run_one(&args, w, &kube_scheduler, &run_dir)
                .await
                .with_context(|| format!("{} (logs in {})", w.label(), run_dir.display()))?;
            println!(
                "  {:.0} pods/s (first create to last bind, {:.2} s; creates answered in {:.2} s); \
                 per 1 s window avg {:.0}, p50 {:.0}; scheduler {:.1} CPU s, RSS {:.0} MiB; \
                 apiserver {:.1} CPU s",
                r.throughput,
                r.wall,
                r.create_wall,
                r.window_avg,
                r.window_p50,
                r.scheduler_cpu,
                r.scheduler_rss_mib,
                r.apiserver_cpu
            );
            results.push((w, r));
        }
    }
    println!();
    println!(
        "{:<16} {:>6} {:>12} {:>10} {:>10} {:>12} {:>10}",
        "SCHEDULER", "RUNS", "PODS/S", "WIN AVG", "WIN P50", "SCHED CPU s", "RSS MiB"
    );
    let median = |w: Which, f: fn(&Run) -> f64| -> f64 {
        let mut v: Vec<f64> = results
            .iter()
            .filter(|(x, _)| *x == w)
            .map(|(_, r)| f(r))
            .collect();
        v.sort_by(f64::total_cmp);
        percentile(&v, 50.0)
    };
    for &w in &which {
        println!(
            "{:<16} {:>6} {:>12.0} {:>10.0} {:>10.0} {:>12.1} {:>10.0}",
            w.label(),
            results.iter().filter(|(x, _)| *x == w).count(),
            median(w, |r| r.throughput),
            median(w, |r| r.window_avg),
            median(w, |r| r.window_p50),
            median(w, |r| r.scheduler_cpu),
            median(w, |r| r.scheduler_rss_mib)
        );
    }
    if which.len() == 2 {
        let k = median(Which::Kumo, |r| r.throughput);
        let g = median(Which::KubeScheduler, |r| r.throughput);
        let kc = median(Which::Kumo, |r| r.scheduler_cpu);
        let gc = median(Which::KubeScheduler, |r| r.scheduler_cpu);
        println!(
            "ratio kumo / kube-scheduler (medians): throughput {:.2}x, scheduler CPU seconds {:.2}x",
            k / g,
            kc / gc
        );
    }
    Ok(())
}

async fn run_one(args: &Args, which: Which, kube_scheduler: &Path, dir: &Path) -> Result<Run> {
    let data = dir.join("cluster");
    let data_arg = data.to_string_lossy().into_owned();
    let mut components = vec![Component::spawn(
        "apiserver",
        dir,
        &["apiserver", "--data-dir", &data_arg, "--secure-port", "0"],
    )?];
    let client = wait_for_apiserver(&data, &mut components[0]).await?;

    for ns in [INIT_NS, MEASURE_NS] {
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
            )
            .await?;
        Api::<ServiceAccount>::namespaced(client.clone(), ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
            )
            .await?;
    }
    create_nodes(&client, args.nodes, args.concurrency).await?;

    let scheduler_conf = data.join("scheduler.conf");
    match which {
        Which::Kumo => components.push(Component::spawn(
            "scheduler",
            dir,
            &[
                "scheduler",
                "--kubeconfig",
                &scheduler_conf.to_string_lossy(),
                "--secure-port",
                "0",
                "--leader-elect=false",
            ],
        )?),
        Which::KubeScheduler => {
            let config = dir.join("kube-scheduler-config.yaml");
            std::fs::write(
                &config,
                format!(
                    "apiVersion: kubescheduler.config.k8s.io/v1\n\
                     kind: KubeSchedulerConfiguration\n\
                     clientConnection:\n  kubeconfig: {}\n  qps: 5000\n  burst: 5000\n\
                     leaderElection:\n  leaderElect: false\n",
                    scheduler_conf.display()
                ),
            )?;
            components.push(Component::spawn_program(
                "scheduler",
                kube_scheduler,
                dir,
                &[
                    &format!("--config={}", config.display()),
                    "--bind-address=127.0.0.1",
                    "--secure-port=0",
                ],
            )?);
        }
    }

    // Init pods, scheduled before the measurement starts.
    let init_bound = BindWatch::start(&client, INIT_NS);
    create_pods(&client, INIT_NS, args.init_pods, args.concurrency).await?;
    init_bound
        .wait_for(args.init_pods, Duration::from_secs(300), &mut components)
        .await
        .context("init pods")?;

    let bound = BindWatch::start(&client, MEASURE_NS);
    // The watch has listed (an empty namespace) before the clock starts.
    bound
        .wait_for(0, Duration::from_secs(30), &mut components)
        .await?;
    let cpu = |c: &[Component], name: &str| {
        c.iter()
            .find(|c| c.name == name)
            .and_then(|c| proc_cpu_seconds(Some(c.pid()?)))
            .unwrap_or(f64::NAN)
    };
    let (sched_cpu0, api_cpu0) = (cpu(&components, "scheduler"), cpu(&components, "apiserver"));
    let start = Instant::now();
    bound.set_start(start);
    create_pods(&client, MEASURE_NS, args.pods, args.concurrency).await?;
    let create_wall = start.elapsed().as_secs_f64();
    bound
        .wait_for(args.pods, Duration::from_secs(600), &mut components)
        .await
        .context("measured pods")?;
    let (sched_cpu1, api_cpu1) = (cpu(&components, "scheduler"), cpu(&components, "apiserver"));
    let rss = components
        .iter()
        .find(|c| c.name == "scheduler")
        .and_then(|c| proc_memory(c.pid()?))
        .map_or(f64::NAN, |(rss, _)| rss as f64 / 1024.0);
    let times = bound.times();
    let last = times.iter().copied().fold(0.0, f64::max);
    let (window_avg, window_p50) = windows(&times);
    Ok(Run {
        throughput: args.pods as f64 / last,
        window_avg,
        window_p50,
        wall: last,
        create_wall,
        scheduler_cpu: sched_cpu1 - sched_cpu0,
        apiserver_cpu: api_cpu1 - api_cpu0,
        scheduler_rss_mib: rss,
    })
}

/// Pods bound per one-second window from the first create: the average over the windows
/// up to the last bind and their median (the last, partial window left out when there is
/// more than one).
fn windows(times: &[f64]) -> (f64, f64) {
    let Some(last) = times.iter().copied().reduce(f64::max) else {
        return (f64::NAN, f64::NAN);
    };
    let n = last.floor() as usize + 1;
    let mut counts = vec![0f64; n];
    for t in times {
        counts[(t.floor() as usize).min(n - 1)] += 1.0;
    }
    if counts.len() > 1 {
        counts.pop();
    }
    let avg = counts.iter().sum::<f64>() / counts.len() as f64;
    counts.sort_by(f64::total_cmp);
    (avg, percentile(&counts, 50.0))
}

/// scheduler_perf's node: 4 CPU, 32 GiB, 110 pods, Ready; the not-ready taint the API
/// server adds on create is cleared as the node lifecycle controller would.
async fn create_nodes(client: &kube::Client, n: usize, concurrency: usize) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("scheduler-perf-{i}");
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "status": {
                        "capacity": {"pods": "110", "cpu": "4", "memory": "32Gi"},
                        "conditions": [{"type": "Ready", "status": "True"}],
                        "phase": "Running",
                    },
                }))?;
                api.create(&PostParams::default(), &node).await?;
                api.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"taints": null}})),
                )
                .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await
        .context("creating nodes")
}

/// scheduler_perf's default pod template.
async fn create_pods(client: &kube::Client, ns: &str, n: usize, concurrency: usize) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "pod-"},
        "spec": {"containers": [{
            "name": "pause",
            "image": "registry.k8s.io/pause:3.10.1",
            "ports": [{"containerPort": 80}],
            "resources": {
                "limits": {"cpu": "100m", "memory": "500Mi"},
                "requests": {"cpu": "100m", "memory": "500Mi"},
            },
        }]},
    }))?;
    let pod = &pod;
    futures::stream::iter(0..n)
        .map(|_| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), pod).await.map(drop) }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await
        .with_context(|| format!("creating pods in {ns}"))
}

/// The bound pods of a namespace, with when a watch saw each bound: a watch on
/// `spec.nodeName!=`, so each pod arrives once, when the scheduler binds it.
struct BindWatch {
    state: Arc<Mutex<BindState>>,
    listed: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

struct BindState {
    start: Option<Instant>,
    seen: HashMap<String, Instant>,
    listed: bool,
}

impl BindWatch {
    fn start(client: &kube::Client, ns: &str) -> BindWatch {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let state = Arc::new(Mutex::new(BindState {
            start: None,
            seen: HashMap::new(),
            listed: false,
        }));
        let (tx, listed) = tokio::sync::watch::channel(0usize);
        let task = {
            let state = state.clone();
            tokio::spawn(async move {
                let cfg = any_unpaged().fields("spec.nodeName!=");
                let mut s = watcher::watcher(api, cfg).boxed();
                while let Some(ev) = s.next().await {
                    let now = Instant::now();
                    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                    match ev {
                        Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                            if let Some(name) = p.metadata.name {
                                st.seen.entry(name).or_insert(now);
                            }
                        }
                        Ok(watcher::Event::InitDone) => st.listed = true,
                        _ => continue,
                    }
                    if st.listed {
                        let _ = tx.send(st.seen.len() + 1);
                    }
                }
            })
        };
        BindWatch {
            state,
            listed,
            task,
        }
    }

    fn set_start(&self, at: Instant) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).start = Some(at);
    }

    /// Waits until the watch has listed and seen `n` pods bound.
    async fn wait_for(
        &self,
        n: usize,
        timeout: Duration,
        components: &mut [Component],
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut listed = self.listed.clone();
        loop {
            // The channel carries bound + 1 once the watch has listed.
            if *listed.borrow_and_update() > n {
                return Ok(());
            }
            check_running(components)?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let got = (*listed.borrow()).saturating_sub(1);
                bail!("{got} of {n} pods bound within {} s", timeout.as_secs());
            }
            let _ = tokio::time::timeout(left.min(Duration::from_secs(1)), listed.changed()).await;
        }
    }

    /// Seconds from the start to each bind.
    fn times(&self) -> Vec<f64> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(start) = st.start else {
            return Vec::new();
        };
        st.seen
            .values()
            .map(|t| t.saturating_duration_since(start).as_secs_f64())
            .collect()
    }
}

impl Drop for BindWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_count_binds_per_second() {
        // 3 in the first second, 1 in the second, 2 in a last partial one.
        let (avg, p50) = windows(&[0.1, 0.5, 0.9, 1.2, 2.1, 2.2]);
        assert_eq!(avg, 2.0);
        assert_eq!(p50, 3.0);
        assert!(windows(&[]).0.is_nan());
        // One window only: kept.
        assert_eq!(windows(&[0.2, 0.3]), (2.0, 2.0));
    }
}
