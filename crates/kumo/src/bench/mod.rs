//! `kumo bench ...`: benchmarks that print their figures, kumo beside the reference.

mod api;
mod clusters;
mod lb;
mod net;
mod nodes;
mod pods;
mod scheduler;
mod storage;
mod volumes;

use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum Bench {
    /// The embedded store and a real etcd, side by side, both durable.
    Storage(storage::Args),
    /// Load on any Kubernetes API server: throughput and latency per verb and concurrency.
    Api(Box<api::Args>),
    /// The cloud-controller-manager's service controller: Service create to EXTERNAL-IP,
    /// and the fan-out of a node joining many load balancers.
    Lb(lb::Args),
    /// Many simulated nodes (one `kumo kubelet --sim-nodes`) under a stream of pods: pod
    /// startup latency, API latency, each component's CPU and memory.
    Nodes(nodes::Args),
    /// Pod startup on the real runtime (containerd): the kubelet beside the raw CRI, in
    /// one run, and the kubelet's CPU and memory per running pod.
    Pods(pods::Args),
    /// scheduler_perf's SchedulingBasic shape (5000 nodes, 1000 + 10 000 pods): `kumo
    /// scheduler` and the real kube-scheduler side by side, pods per second.
    Scheduler(scheduler::Args),
    /// The real network (`--runtime containerd`): nftables rule sync at scale, Service
    /// create to reachable on every node, throughput through ClusterIP and VIP.
    Net(net::Args),
    /// Claims of the default class with a pod each: claim create to pod Running with a
    /// fresh volume (provisioned, attached, mounted by the cloud's CSI driver), beside pods
    /// without a volume.
    Volumes(volumes::Args),
    /// Workload clusters handed out by Cluster API (`kumo up --cluster-api`): apply to API
    /// answering and to all nodes Ready, memory per cluster, how many answer at once.
    Clusters(clusters::Args),
}

pub async fn run(what: Bench) -> Result<()> {
    match what {
        Bench::Storage(args) => storage::run(args).await,
        Bench::Api(args) => api::run(*args).await,
        Bench::Lb(args) => lb::run(args).await,
        Bench::Nodes(args) => nodes::run(args).await,
        Bench::Scheduler(args) => scheduler::run(args).await,
        Bench::Pods(args) => pods::run(args).await,
        Bench::Net(args) => net::run(args).await,
        Bench::Volumes(args) => volumes::run(args).await,
        Bench::Clusters(args) => clusters::run(args).await,
    }
}

/// Runs `kumo up -d --runtime <runtime> --nodes <nodes>` (this binary) in `data`, then
/// `f`, then `kumo down`, whatever `f` returned.
pub async fn with_kumo_up<Fut>(
    runtime: &str,
    nodes: usize,
    data: &std::path::Path,
    f: impl FnOnce() -> Fut,
) -> Result<()>
where
    Fut: std::future::Future<Output = Result<()>>,
{
    with_kumo_up_args(runtime, nodes, &[], data, f).await
}

/// [`with_kumo_up`] with more `kumo up` arguments.
pub async fn with_kumo_up_args<Fut>(
    runtime: &str,
    nodes: usize,
    extra: &[&str],
    data: &std::path::Path,
    f: impl FnOnce() -> Fut,
) -> Result<()>
where
    Fut: std::future::Future<Output = Result<()>>,
{
    use anyhow::Context;
    let kumo = std::env::current_exe().context("finding the kumo binary")?;
    let up = std::process::Command::new(&kumo)
        .args([
            "up",
            "-d",
            "--runtime",
            runtime,
            "--nodes",
            &nodes.to_string(),
        ])
        .args(extra)
        .args(["--port", "0", "--kubeconfig-update=false", "--data-dir"])
        .arg(data)
        .output()
        .context("kumo up")?;
    let result = if up.status.success() {
        f().await
    } else {
        Err(anyhow::anyhow!(
            "kumo up failed: {}",
            String::from_utf8_lossy(&up.stdout)
        ))
    };
    let _ = std::process::Command::new(&kumo)
        .args(["down", "--data-dir"])
        .arg(data)
        .output();
    result
}

/// (p50, p99, max) of samples.
pub fn summary(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (
        percentile(&v, 50.0),
        percentile(&v, 99.0),
        v.last().copied().unwrap_or(f64::NAN),
    )
}

/// The p-th percentile (0..=100) of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}
