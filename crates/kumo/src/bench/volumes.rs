//! `kumo bench volumes`: a claim of the default class (WaitForFirstConsumer) and a pod
//! using it, `--claims` pairs created at once on `kumo up --nodes 2`, each timed from its
//! claim's create request until a watch sees its pod Running: scheduling, the volume
//! selected-node, provisioned by the CSI driver in the cloud, bound, attached, staged and
//! published. Beside them in the same run, as many pods without a volume, for what the
//! volume adds. `--runtime containerd` makes the volumes real (loop devices, ext4).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use super::summary;

#[derive(clap::Args)]
pub struct Args {
    /// Claims (each with its pod) created at once.
    #[arg(long, default_value_t = 50)]
    claims: usize,
    /// sim or containerd.
    #[arg(long, default_value = "sim")]
    runtime: String,
    /// Keep the cluster's files here (default: a temporary directory, removed at the end).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

pub async fn run(args: Args) -> Result<()> {
    if args.claims == 0 {
        bail!("--claims must be positive");
    }
    if args.runtime == "containerd" {
        kumo_node::prerequisites()?;
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
    super::with_kumo_up(&args.runtime, 2, &data, || measure(&args, &data)).await
}

fn pod(name: &str, claim: Option<&str>) -> Pod {
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:1.37", "command": ["sleep", "3600"]}],
        },
    });
    if let Some(c) = claim {
        p["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "d", "mountPath": "/data"}]);
        p["spec"]["volumes"] = json!([{"name": "d", "persistentVolumeClaim": {"claimName": c}}]);
    }
    serde_json::from_value(p).unwrap_or_default()
}

async fn measure(args: &Args, data: &std::path::Path) -> Result<()> {
    let client = super::lb::admin_client(&data.join("admin.conf")).await?;
    let ns = "default";
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    // Pods are timed by a watch from before anything is created.
    let started: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let running: Arc<Mutex<HashMap<String, Duration>>> = Arc::default();
    let (s2, r2) = (started.clone(), running.clone());
    let watch = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(pods.clone(), watcher::Config::default()));
        while let Some(ev) = stream.next().await {
            let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev else {
                continue;
            };
            if p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running") {
                continue;
            }
            let name = p.metadata.name.clone().unwrap_or_default();
            let t0 = s2.lock().ok().and_then(|m| m.get(&name).copied());
            if let (Some(t0), Ok(mut r)) = (t0, r2.lock()) {
                r.entry(name).or_insert_with(|| t0.elapsed());
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "bench volumes: {} claims with a pod each, and {} pods without, at once, on kumo up --runtime {} --nodes 2",
        args.claims, args.claims, args.runtime
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut creates = Vec::new();
    for i in 0..args.claims {
        let (claims, pods, started) = (claims.clone(), pods.clone(), started.clone());
        creates.push(tokio::spawn(async move {
            let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": format!("c{i}")},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            }))?;
            let with = format!("with-{i}");
            let without = format!("without-{i}");
            if let Ok(mut m) = started.lock() {
                m.insert(with.clone(), Instant::now());
            }
            claims.create(&PostParams::default(), &claim).await?;
            pods.create(&PostParams::default(), &pod(&with, Some(&format!("c{i}")))).await?;
            if let Ok(mut m) = started.lock() {
                m.insert(without.clone(), Instant::now());
            }
            pods.create(&PostParams::default(), &pod(&without, None)).await?;
            Ok::<_, anyhow::Error>(())
        }));
    }
    for c in creates {
        c.await??;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let done = running.lock().map(|r| r.len()).unwrap_or(0);
        if done == 2 * args.claims {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "only {done} of {} pods Running after 300 s",
                2 * args.claims
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watch.abort();
    let r = running.lock().map(|r| r.clone()).unwrap_or_default();
    let ms = |prefix: &str| -> Vec<f64> {
        r.iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, d)| d.as_secs_f64() * 1000.0)
            .collect()
    };
    let (p50, p99, max) = summary(ms("with-"));
    let (b50, b99, bmax) = summary(ms("without-"));
    println!("  claim create -> pod Running, fresh volume:  p50 {p50:.0} ms  p99 {p99:.0} ms  max {max:.0} ms");
    println!("  pod create -> Running, no volume:           p50 {b50:.0} ms  p99 {b99:.0} ms  max {bmax:.0} ms");
    println!("  the volume adds at p50: {:.0} ms", p50 - b50);
    Ok(())
}
