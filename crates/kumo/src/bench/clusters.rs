//! `kumo bench clusters`: workload clusters handed out by Cluster API on `kumo up
//! --cluster-api` (the simulated runtime, or with `--runtime containerd` real machines).
//! First `--timed` clusters one after the other,
//! each the example of docs/examples/cluster-api.yaml (one control-plane machine, two
//! workers) in a namespace of its own, timed from its apply until its kubeconfig Secret
//! opens an API that answers, and until all three nodes are Ready. Then more clusters of a
//! control plane only, `--batch` at a time, up to `--clusters` in all or until a batch's
//! control planes do not come up (as many as the machine holds); after a 10 s idle the
//! memory per cluster of the `kumo up` process and the etcd members (their growth over
//! the count, RSS and PSS), and whether every cluster's API answers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::summary;

const EXAMPLE: &str = include_str!("../../../../docs/examples/cluster-api.yaml");

#[derive(clap::Args)]
pub struct Args {
    /// Clusters (one control-plane machine, two workers) timed one after the other.
    #[arg(long, default_value_t = 5)]
    timed: usize,
    /// Clusters in all at the end (the rest with a control-plane machine only).
    #[arg(long, default_value_t = 50)]
    clusters: usize,
    /// Clusters applied at once while filling up.
    #[arg(long, default_value_t = 5)]
    batch: usize,
    /// Keep the management cluster's files here (default: a temporary directory).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// What the machines run their pods on: sim, or containerd (each machine a namespace
    /// of the cloud's VPC with its containerd; needs root).
    #[arg(long, default_value = "sim")]
    runtime: String,
}

pub async fn run(args: Args) -> Result<()> {
    if args.clusters < args.timed || args.batch == 0 {
        bail!("--clusters must be at least --timed, --batch positive");
    }
    let temp;
    let dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_owned()
        }
    };
    let data = dir.join("cluster");
    super::with_kumo_up_args(&args.runtime, 0, &["--cluster-api"], &data, || {
        measure(&args, &data)
    })
    .await
}

/// Applies the example cluster in namespace `ns` with `workers` workers and the `i`th pod
/// range of 172.16.0.0/12's /20s (clusters on the real runtime share the VPC's route
/// table: each needs a range of its own).
async fn apply(admin: &kube::Client, ns: &str, workers: usize, i: usize) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let n: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?;
    namespaces.create(&PostParams::default(), &n).await?;
    let range = format!("172.{}.{}.0/20", 16 + i / 16, (i % 16) * 16);
    let text = EXAMPLE
        .replace("replicas: 2", &format!("replicas: {workers}"))
        .replace("192.168.0.0/16", &range);
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        let (Some(api_version), Some(kind), Some(name)) = (
            v["apiVersion"].as_str(),
            v["kind"].as_str(),
            v.pointer("/metadata/name").and_then(|n| n.as_str()),
        ) else {
            continue;
        };
        let (group, version) = api_version.split_once('/').context("a grouped kind")?;
        let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
        let (ar, _) = kube::discovery::pinned_kind(admin, &gvk).await?;
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(admin.clone(), ns, &ar);
        api.patch(
            name,
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&v),
        )
        .await?;
    }
    Ok(())
}

/// The workload cluster's client, once its kubeconfig Secret exists.
async fn tenant(admin: &kube::Client, ns: &str) -> Option<kube::Client> {
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    let s = secrets.get_opt("demo-kubeconfig").await.ok()??;
    let text = String::from_utf8(s.data?.get("value")?.0.clone()).ok()?;
    let kc = kube::config::Kubeconfig::from_yaml(&text).ok()?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .ok()?;
    cfg.connect_timeout = Some(Duration::from_secs(2));
    cfg.read_timeout = Some(Duration::from_secs(5));
    kumo_client::transport::client(kumo_client::clients::as_client_go(cfg)).ok()
}

/// How many Ready nodes the workload cluster has (None: its API does not answer).
async fn ready_nodes(client: &kube::Client) -> Option<usize> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&Default::default()).await.ok()?;
    Some(
        list.items
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count(),
    )
}

async fn measure(args: &Args, data: &std::path::Path) -> Result<()> {
    let admin = super::lb::admin_client(&data.join("admin.conf")).await?;
    let pid = crate::daemon::running(data).context("the kumo up process")?;
    // The `kumo up` process and the control-plane machines' etcd members (processes of
    // their own): a workload control plane costs both.
    let machines = data.join("machines");
    // Resident (RSS) and proportional (PSS) set sizes, MiB: every etcd member's RSS
    // counts the etcd executable's pages again, its PSS a share of them.
    let memory = || {
        let members: Vec<u32> = std::fs::read_dir(&machines)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("var/run/etcd.pid")).ok())
            .filter_map(|t| t.trim().parse::<u32>().ok())
            // On the real runtime, each machine's containerd too (not its shims or pods).
            .chain(
                std::fs::read_dir(&machines)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|e| kumo_node::read_record(&e.path().join("node")))
                    .filter_map(|r| r.containerd_pid),
            )
            .collect();
        let procs = || std::iter::once(pid).chain(members.iter().copied());
        let rss: f64 = procs()
            .map(|p| super::api::proc_memory(p).map_or(0.0, |(rss, _)| rss as f64))
            .sum();
        let pss: f64 = procs()
            .map(|p| super::api::proc_pss(p).map_or(0.0, |k| k as f64))
            .sum();
        (rss / 1024.0, pss / 1024.0)
    };
    println!(
        "kumo bench clusters: management cluster up (pid {pid}, RSS {:.0} MiB)",
        memory().0
    );
    let (mut to_api, mut to_nodes) = (Vec::new(), Vec::new());
    for i in 0..args.timed {
        let ns = format!("bench-{i}");
        let t = Instant::now();
        apply(&admin, &ns, 2, i).await?;
        let deadline = t + Duration::from_secs(120);
        let mut client = None;
        let mut api_at = None;
        loop {
            if Instant::now() > deadline {
                bail!("cluster {ns}: not all nodes Ready within 120 s");
            }
            if client.is_none() {
                client = tenant(&admin, &ns).await;
            }
            if let Some(c) = &client {
                if let Some(n) = ready_nodes(c).await {
                    api_at.get_or_insert_with(|| t.elapsed());
                    if n == 3 {
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (a, n) = (api_at.unwrap_or_default(), t.elapsed());
        println!(
            "  {ns}: applied → API answering {:.2} s, → 3 nodes Ready {:.2} s",
            a.as_secs_f64(),
            n.as_secs_f64()
        );
        to_api.push(a.as_secs_f64() * 1000.0);
        to_nodes.push(n.as_secs_f64() * 1000.0);
    }
    let (a50, a99, _) = summary(to_api);
    let (n50, n99, _) = summary(to_nodes);
    println!(
        "Cluster applied → API answering: p50 {a50:.0} ms, p99 {a99:.0} ms; → all nodes Ready: p50 {n50:.0} ms, p99 {n99:.0} ms ({} clusters of 1 control plane + 2 workers)",
        args.timed
    );
    let base = memory();
    let base_count = args.timed;
    let mut next = args.timed;
    // Clusters whose control plane came up (the fill stops at the first batch that does
    // not: that is as many as this machine holds).
    let mut held = args.timed;
    let t = Instant::now();
    'fill: while next < args.clusters {
        let end = (next + args.batch).min(args.clusters);
        for i in next..end {
            apply(&admin, &format!("bench-{i}"), 0, i).await?;
        }
        next = end;
        // The batch's control planes answer before the next batch.
        let first = held;
        for i in first..end {
            let ns = format!("bench-{i}");
            let deadline = Instant::now() + Duration::from_secs(180);
            loop {
                if let Some(c) = tenant(&admin, &ns).await {
                    if ready_nodes(&c).await == Some(1) {
                        break;
                    }
                }
                if Instant::now() > deadline {
                    println!(
                        "  cluster {ns}: its control plane not Ready within 180 s; filling stops at {held} clusters"
                    );
                    break 'fill;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            held = i + 1;
        }
        let (rss, pss) = memory();
        println!(
            "  {end} clusters up ({:.0} s, RSS {rss:.0} MiB, PSS {pss:.0} MiB)",
            t.elapsed().as_secs_f64(),
        );
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = memory();
    let applied = next;
    let mut answering = 0;
    let t = Instant::now();
    for i in 0..applied {
        if let Some(c) = tenant(&admin, &format!("bench-{i}")).await {
            if ready_nodes(&c).await.is_some() {
                answering += 1;
            }
        }
    }
    println!(
        "{applied} clusters applied, {held} came up, {answering} answering (each listed its nodes; {:.1} s for all); kumo up and the etcd members at idle: RSS {:.0} MiB, PSS {:.0} MiB",
        t.elapsed().as_secs_f64(),
        idle.0,
        idle.1
    );
    let added = applied - base_count;
    if added > 0 {
        println!(
            "per control-plane-only cluster at idle: RSS {:.1} MiB ({base_rss:.0} → {idle_rss:.0} MiB), PSS {:.1} MiB ({base_pss:.0} → {idle_pss:.0} MiB), {added} clusters added",
            (idle.0 - base.0) / added as f64,
            (idle.1 - base.1) / added as f64,
            base_rss = base.0,
            idle_rss = idle.0,
            base_pss = base.1,
            idle_pss = idle.1,
        );
    }
    Ok(())
}
