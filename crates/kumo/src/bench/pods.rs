//! `kumo bench pods`: pod startup on the real runtime, the kubelet beside the raw CRI in
//! one run, on one node machine (a network namespace with its containerd, as `kumo up
//! --runtime containerd` makes).
//!
//! First the raw runtime: `--pods` sandboxes, each with a busybox container, created and
//! started straight through the CRI client, all at once (one thread each, as a kubelet's
//! pod workers would), each timed from the start of the batch until its container started;
//! then they are removed. Then the kubelet: the API server, controller-manager and
//! scheduler as processes of this binary, and `kumo kubelet --container-runtime-endpoint`
//! on the same containerd as a process of its own; `--pods` pods with the same container
//! are created at once and each is timed from just before its create request until a
//! watch sees it Running (scheduling and status included). It reports both latencies
//! (p50, p99), the kubelet's overhead over the raw runtime at p50, and the kubelet
//! process's CPU and resident memory per running pod over `--settle` seconds.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use kumo_cri::Runtime;
use serde_json::json;

use super::api::{proc_cpu_seconds, proc_memory};
use super::nodes::{any_unpaged, check_running, wait_for_apiserver, Component};
use super::summary;

#[derive(clap::Args)]
pub struct Args {
    /// Pods started at once, on each side.
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// Seconds the kubelet's pods keep running while its CPU is measured.
    #[arg(long, default_value_t = 10)]
    settle: u64,
    /// Keep everything here (default: a temporary directory, removed at the end).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

const NS: &str = "bench";
const NODE: &str = "bench-node";
const IMAGE: &str = "docker.io/library/busybox:1.37";

/// The raw runtime: `n` sandboxes with a container each, at once, through the CRI.
fn raw(
    runtime: Arc<kumo_cri_remote::RemoteRuntime>,
    n: usize,
    cgroup_root: &str,
) -> Result<Vec<f64>> {
    let image = runtime
        .image_status(IMAGE)
        .with_context(|| format!("{IMAGE} is not in the node's containerd"))?;
    let start = Instant::now();
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (runtime, image) = (runtime.clone(), image.clone());
            let uid = format!("raw-{i}");
            let cgroup_parent = format!("{cgroup_root}/kubepods/besteffort/pod{uid}");
            std::thread::spawn(move || -> Result<(String, f64)> {
                let sandbox = runtime.run_pod_sandbox(&kumo_cri::SandboxConfig {
                    name: uid.clone(),
                    namespace: NS.into(),
                    uid: uid.clone(),
                    hostname: uid.clone(),
                    cgroup_parent,
                    ..Default::default()
                })?;
                let id = runtime.create_container(
                    &sandbox,
                    &kumo_cri::ContainerConfig {
                        name: "c".into(),
                        image: IMAGE.into(),
                        command: vec!["sleep".into(), "3600".into()],
                        ..Default::default()
                    },
                    &image,
                )?;
                runtime.start_container(&id)?;
                Ok((sandbox, start.elapsed().as_secs_f64()))
            })
        })
        .collect();
    let mut took = Vec::new();
    let mut sandboxes = Vec::new();
    for h in handles {
        let (sandbox, secs) = h
            .join()
            .map_err(|_| anyhow::anyhow!("a raw pod's thread panicked"))??;
        took.push(secs);
        sandboxes.push(sandbox);
    }
    for s in sandboxes {
        runtime.remove_pod_sandbox(&s);
    }
    Ok(took)
}

pub async fn run(args: Args) -> Result<()> {
    if args.pods == 0 {
        bail!("--pods must be positive");
    }
    kumo_node::prerequisites()?;
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
        "bench pods: {} pods at once on one containerd node, raw CRI then the kubelet; logs in {}",
        args.pods,
        dir.display()
    );
    let node_dir = dir.join("nodes").join(NODE);
    std::fs::create_dir_all(&node_dir)?;
    let images = kumo_node::images::build(&dir.join("images"))?;
    let spec = kumo_node::NodeSpec {
        name: NODE.into(),
        dir: node_dir.clone(),
        images,
    };
    // The machine goes whatever happens, before the directory does.
    let _guard = kumo_node::TeardownGuard(node_dir.clone());
    let host = tokio::task::spawn_blocking(move || kumo_node::NodeHost::start(&spec)).await??;
    measure(&args, &dir, &host).await
}

async fn measure(args: &Args, dir: &std::path::Path, host: &kumo_node::NodeHost) -> Result<()> {
    let node_dir = host.dir().to_owned();
    let cgroup_root = host.record().cgroup_root.clone();
    let runtime = Arc::new(kumo_cri_remote::RemoteRuntime::connect(
        kumo_cri_remote::Options {
            socket: host.socket(),
            root_dir: node_dir.join("raw"),
            pod_logs_dir: node_dir.join("raw-logs"),
            netns: Some(host.netns_path()),
        },
    )?);
    runtime.update_pod_cidr("10.244.0.0/24")?;
    let (n, rt, root) = (args.pods, runtime.clone(), cgroup_root.clone());
    let raw = tokio::task::spawn_blocking(move || raw(rt, n, &root)).await??;
    drop(runtime);
    let (raw_p50, raw_p99, raw_max) = summary(raw);
    println!(
        "raw CRI: {} pods started in {:.2} s; per pod p50 {:.3} s, p99 {:.3} s",
        args.pods, raw_max, raw_p50, raw_p99
    );

    // The kubelet's side.
    let data = dir.join("cluster");
    let d = |p: &str| data.join(p).to_string_lossy().into_owned();
    let data_arg = data.to_string_lossy().into_owned();
    let mut components = vec![Component::spawn(
        "apiserver",
        dir,
        &["apiserver", "--data-dir", &data_arg, "--secure-port", "0"],
    )?];
    let client = wait_for_apiserver(&data, &mut components[0]).await?;
    components.push(Component::spawn(
        "controller-manager",
        dir,
        &[
            "controller-manager",
            "--kubeconfig",
            &d("controller-manager.conf"),
            "--secure-port",
            "0",
            "--allocate-node-cidrs",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--use-service-account-credentials",
        ],
    )?);
    components.push(Component::spawn(
        "scheduler",
        dir,
        &[
            "scheduler",
            "--kubeconfig",
            &d("scheduler.conf"),
            "--secure-port",
            "0",
        ],
    )?);
    let endpoint = format!("unix://{}", host.socket().display());
    let netns = host.netns_path().to_string_lossy().into_owned();
    let kubelet_root = node_dir.join("kubelet").to_string_lossy().into_owned();
    let logs = node_dir
        .join("log")
        .join("pods")
        .to_string_lossy()
        .into_owned();
    components.push(Component::spawn(
        "kubelet",
        dir,
        &[
            "kubelet",
            "--kubeconfig",
            &d("admin.conf"),
            "--hostname-override",
            NODE,
            "--container-runtime-endpoint",
            &endpoint,
            "--root-dir",
            &kubelet_root,
            "--pod-logs-dir",
            &logs,
            "--cgroup-root",
            &cgroup_root,
            "--pod-network-namespace",
            &netns,
            "--port",
            "0",
            "--address",
            "127.0.0.1",
        ],
    )?);
    let kubelet_pid = components
        .last()
        .and_then(Component::pid)
        .context("the kubelet's pid")?;
    let nodes: Api<Node> = Api::all(client.clone());
    let started = Instant::now();
    loop {
        let ready = nodes
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
        if ready {
            break;
        }
        check_running(&mut components)?;
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the node did not turn Ready");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ns_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    while sa.get_opt("default").await?.is_none() {
        check_running(&mut components)?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rss_before = proc_memory(kubelet_pid).map_or(0, |m| m.0);
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let running: Arc<Mutex<HashMap<String, f64>>> = Arc::default();
    let (all_tx, mut all_rx) = tokio::sync::watch::channel(0usize);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let watch = {
        let (sent, running, api) = (sent.clone(), running.clone(), pods.clone());
        tokio::spawn(async move {
            let mut s = watcher::watcher(api, any_unpaged()).boxed();
            while let Some(ev) = s.next().await {
                let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev else {
                    continue;
                };
                if p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running") {
                    continue;
                }
                let name = p.metadata.name.unwrap_or_default();
                let at = sent
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&name)
                    .copied();
                if let Some(at) = at {
                    let mut r = running.lock().unwrap_or_else(|e| e.into_inner());
                    r.entry(name).or_insert(at.elapsed().as_secs_f64());
                    let _ = all_tx.send(r.len());
                }
            }
        })
    };
    let cpu_before = proc_cpu_seconds(Some(kubelet_pid)).unwrap_or(0.0);
    let batch = Instant::now();
    let creates: Vec<_> = (0..args.pods)
        .map(|i| {
            let (api, sent) = (pods.clone(), sent.clone());
            tokio::spawn(async move {
                let name = format!("pod-{i}");
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": NS},
                    "spec": {
                        "containers": [{"name": "c", "image": IMAGE, "command": ["sleep", "3600"]}],
                        "terminationGracePeriodSeconds": 0,
                    },
                }))?;
                sent.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name, Instant::now());
                api.create(&PostParams::default(), &pod).await?;
                anyhow::Ok(())
            })
        })
        .collect();
    for c in creates {
        c.await??;
    }
    let done = tokio::time::timeout(
        Duration::from_secs(300),
        all_rx.wait_for(|n| *n >= args.pods),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    let all_running = batch.elapsed();
    watch.abort();
    if !done {
        bail!(
            "only {} of {} pods Running after 300 s",
            running.lock().unwrap_or_else(|e| e.into_inner()).len(),
            args.pods
        );
    }
    let cpu_startup = proc_cpu_seconds(Some(kubelet_pid)).unwrap_or(0.0) - cpu_before;
    let latencies: Vec<f64> = running
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .copied()
        .collect();
    let (p50, p99, _) = summary(latencies);
    println!(
        "kubelet: {} pods Running in {:.2} s; per pod (created → Running) p50 {:.3} s, p99 {:.3} s",
        args.pods,
        all_running.as_secs_f64(),
        p50,
        p99
    );
    println!(
        "kubelet overhead over the raw runtime at p50: {:+.0} % ({:.3} s vs {:.3} s)",
        (p50 / raw_p50 - 1.0) * 100.0,
        p50,
        raw_p50
    );
    let settle_cpu = proc_cpu_seconds(Some(kubelet_pid)).unwrap_or(0.0);
    tokio::time::sleep(Duration::from_secs(args.settle)).await;
    let steady = proc_cpu_seconds(Some(kubelet_pid)).unwrap_or(0.0) - settle_cpu;
    let rss_after = proc_memory(kubelet_pid).map_or(0, |m| m.0);
    println!(
        "kubelet process: {:.2} CPU s to start them ({:.1} ms per pod); with them running {:.2} % of a core ({:.3} % per pod); RSS {} → {} KiB ({:+.1} KiB per pod)",
        cpu_startup,
        cpu_startup * 1000.0 / args.pods as f64,
        steady * 100.0 / args.settle as f64,
        steady * 100.0 / args.settle as f64 / args.pods as f64,
        rss_before,
        rss_after,
        (rss_after as f64 - rss_before as f64) / args.pods as f64
    );
    // The pods go with the node: the kubelet stops, the machine's teardown removes them.
    drop(components);
    Ok(())
}
