//! `kumo bench net`: the real network's costs, measured.
//!
//! 1. Rule sync: kube-proxy's nftables mode (kumo-proxy's `nft`) in a scratch network
//!    namespace with `--sync-services` Services of `--sync-endpoints` endpoints each: the
//!    first (full) sync, a sync that changes nothing, and a sync after one endpoint of one
//!    Service changed (p50 of several each), with the transaction's size.
//! 2. Service programming: on `kumo up --runtime containerd --nodes 2` (this binary), each
//!    of `--services` Services is created in turn and timed from just before its create
//!    request until a connection to its ClusterIP succeeds from every node's namespace
//!    (EndpointSlice controller, watch, each node's sync and the kernel included).
//! 3. Data plane cost: `--bytes` sent over one TCP connection to a sink pod on another
//!    node, directly to its pod IP, through its ClusterIP, and from the cloud's public side
//!    through its load balancer's VIP (the VPC's DNAT, the node port, kube-proxy's DNAT).

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::summary;

#[derive(clap::Args)]
pub struct Args {
    /// Services created one after the other for the programming latency.
    #[arg(long, default_value_t = 100)]
    services: usize,
    /// Services in the rule-sync measurement.
    #[arg(long, default_value_t = 1000)]
    sync_services: usize,
    /// Endpoints per Service in the rule-sync measurement.
    #[arg(long, default_value_t = 10)]
    sync_endpoints: usize,
    /// Bytes sent per throughput measurement.
    #[arg(long, default_value_t = 256 << 20)]
    bytes: usize,
    /// Keep the cluster's files here (default: a temporary directory, removed at the end).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

pub async fn run(args: Args) -> Result<()> {
    kumo_node::prerequisites()?;
    sync_bench(&args)?;
    let temp;
    let dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_owned()
        }
    };
    let data = dir.join("cluster");
    super::with_kumo_up("containerd", 2, &data, || cluster_bench(&args, &data)).await
}

/// Synthetic Services and their EndpointSlices (endpoints spread over two nodes).
fn synthetic(
    services: usize,
    endpoints: usize,
    bump: Option<usize>,
) -> (Vec<Arc<Service>>, Vec<Arc<EndpointSlice>>) {
    let mut svcs = Vec::with_capacity(services);
    let mut slices = Vec::with_capacity(services);
    for i in 0..services {
        let name = format!("svc-{i}");
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 16, 0)) + i as u32);
        svcs.push(Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "bench", "resourceVersion": "1"},
                "spec": {"type": "NodePort", "clusterIP": ip.to_string(),
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                        "nodePort": 30000 + (i % 2000), "protocol": "TCP"}]},
            }))
            .expect("a Service"),
        ));
        let eps: Vec<serde_json::Value> = (0..endpoints)
            .map(|e| {
                let n = i * endpoints + e + usize::from(bump == Some(i) && e == 0) * 1_000_000;
                let addr = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 0, 0)) + n as u32);
                json!({"addresses": [addr.to_string()], "conditions": {"ready": true},
                    "nodeName": if e % 2 == 0 { "node-a" } else { "node-b" }})
            })
            .collect();
        slices.push(Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": format!("{name}-x"), "namespace": "bench",
                    "resourceVersion": if bump == Some(i) { "2" } else { "1" },
                    "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": eps,
            }))
            .expect("an EndpointSlice"),
        ));
    }
    (svcs, slices)
}

fn sync_bench(args: &Args) -> Result<()> {
    let ns = format!("kumo-bench-nft-{}", std::process::id());
    let ok = Command::new("ip").args(["netns", "add", &ns]).status()?;
    if !ok.success() {
        bail!("ip netns add {ns} failed");
    }
    struct Gone(String);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = Command::new("ip")
                .args(["netns", "delete", &self.0])
                .status();
        }
    }
    let _gone = Gone(ns.clone());
    let cfg = kumo_proxy::nft::NftConfig {
        node_name: "node-a".into(),
        node_ips: vec![Ipv4Addr::new(10, 0, 1, 4)],
        cluster_cidr: Some((Ipv4Addr::new(10, 244, 0, 0), 16)),
        service_cidrs: vec![(Ipv4Addr::new(10, 96, 0, 0), 12)],
        netns: Some(Path::new("/run/netns").join(&ns)),
    };
    let (svcs, slices) = synthetic(args.sync_services, args.sync_endpoints, None);
    let (_, bumped) = synthetic(
        args.sync_services,
        args.sync_endpoints,
        Some(args.sync_services / 2),
    );
    let (mut full, mut noop, mut one) = (Vec::new(), Vec::new(), Vec::new());
    let (mut full_cmds, mut one_cmds) = (0, 0);
    for _ in 0..5 {
        let mut p = kumo_proxy::nft::NftProxier::new(cfg.clone());
        let t = Instant::now();
        full_cmds = p.sync(&svcs, &slices)?.commands;
        full.push(t.elapsed().as_secs_f64());
        for _ in 0..4 {
            let t = Instant::now();
            p.sync(&svcs, &slices)?;
            noop.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            one_cmds = p.sync(&svcs, &bumped)?.commands;
            one.push(t.elapsed().as_secs_f64());
            p.sync(&svcs, &slices)?;
        }
        p.cleanup()?;
    }
    let (f50, _, fmax) = summary(full);
    let (n50, _, _) = summary(noop);
    let (o50, o99, _) = summary(one);
    println!(
        "rule sync, {} Services x {} endpoints (nftables, one node's namespace):",
        args.sync_services, args.sync_endpoints
    );
    println!(
        "  full sync (table built): p50 {:.1} ms, max {:.1} ms, {full_cmds} commands",
        f50 * 1e3,
        fmax * 1e3
    );
    println!(
        "  sync with nothing changed: p50 {:.2} ms (nothing recomputed, nothing sent)",
        n50 * 1e3
    );
    println!(
        "  one endpoint of one Service changed: p50 {:.2} ms, p99 {:.2} ms, {one_cmds} commands",
        o50 * 1e3,
        o99 * 1e3
    );
    Ok(())
}

/// The nodes' namespaces of the cluster in `data`.
fn node_namespaces(data: &Path) -> Vec<(String, PathBuf)> {
    kumo_node::recorded(&data.join("nodes"))
        .into_iter()
        .filter_map(|d| {
            let name = d.file_name()?.to_string_lossy().into_owned();
            Some((name, kumo_node::netns_of(&d)?))
        })
        .collect()
}

fn connects(netns: &Path, to: SocketAddr) -> bool {
    kumo_cri_remote::netns::connect(Some(netns), to, Duration::from_millis(200)).is_ok()
}

async fn wait<T>(secs: u64, what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn cluster_bench(args: &Args, data: &Path) -> Result<()> {
    let kc = kube::config::Kubeconfig::read_from(data.join("admin.conf"))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let client = kumo_client::transport::client(cfg)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    for (name, node, cmd) in [
        (
            "echo-a",
            "kumo-worker",
            "mkdir -p /www; echo hi > /www/index.html; httpd -f -p 8080 -h /www",
        ),
        (
            "echo-b",
            "kumo-worker2",
            "mkdir -p /www; echo hi > /www/index.html; httpd -f -p 8080 -h /www",
        ),
        (
            "sink",
            "kumo-worker2",
            "while true; do nc -l -p 5001 > /dev/null; done",
        ),
    ] {
        let app = if name == "sink" { "sink" } else { "echo" };
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [{
                "name": "c", "image": "busybox:1.37", "command": ["sh", "-c", cmd]}]},
        }))?;
        pods.create(&pp, &pod).await?;
    }
    for name in ["echo-a", "echo-b", "sink"] {
        wait(120, &format!("pod {name} running"), async || {
            let p = pods.get(name).await.ok()?;
            let st = p.status?;
            (st.phase.as_deref() == Some("Running")).then_some(())
        })
        .await?;
    }
    let nodes = node_namespaces(data);
    if nodes.len() < 3 {
        bail!("expected 3 node machines, found {}", nodes.len());
    }
    // Service programming: create → reachable from every node.
    let mut took = Vec::with_capacity(args.services);
    for i in 0..args.services {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": format!("bench-{i}")},
            "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }))?;
        let start = Instant::now();
        let created = services.create(&pp, &svc).await?;
        let ip: Ipv4Addr = created
            .spec
            .and_then(|s| s.cluster_ip)
            .and_then(|c| c.parse().ok())
            .context("no clusterIP")?;
        let to = SocketAddr::from((ip, 80));
        let mut pending: Vec<PathBuf> = nodes.iter().map(|(_, p)| p.clone()).collect();
        while !pending.is_empty() {
            if start.elapsed() > Duration::from_secs(60) {
                bail!("Service bench-{i} not reachable from every node after 60 s");
            }
            let check = pending.clone();
            let left = tokio::task::spawn_blocking(move || {
                check
                    .into_iter()
                    .filter(|ns| !connects(ns, to))
                    .collect::<Vec<_>>()
            })
            .await?;
            pending = left;
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        took.push(start.elapsed().as_secs_f64());
    }
    let (p50, p99, max) = summary(took);
    println!(
        "Service create -> reachable through its ClusterIP from all {} nodes ({} Services, one at a time): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        nodes.len(),
        args.services,
        p50 * 1e3,
        p99 * 1e3,
        max * 1e3
    );

    // Data plane cost.
    let sink_ip: Ipv4Addr = pods
        .get("sink")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .and_then(|i| i.parse().ok())
        .context("the sink pod has no IP")?;
    let lb: Service = serde_json::from_value(json!({
        "metadata": {"name": "sink"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "sink"}, "ports": [{"port": 5001, "targetPort": 5001}]},
    }))?;
    let lb = services.create(&pp, &lb).await?;
    let cluster_ip: Ipv4Addr = lb
        .spec
        .and_then(|s| s.cluster_ip)
        .and_then(|c| c.parse().ok())
        .context("no clusterIP")?;
    let client_ns = nodes
        .iter()
        .find(|(n, _)| n == "kumo-worker")
        .map(|(_, p)| p.clone())
        .context("no kumo-worker")?;
    let bytes = args.bytes;
    let direct = send(&client_ns, SocketAddr::from((sink_ip, 5001)), bytes).await?;
    let via_cluster_ip = send(&client_ns, SocketAddr::from((cluster_ip, 5001)), bytes).await?;
    let vip: Ipv4Addr = wait(90, "the load balancer's VIP", async || {
        let s = services.get("sink").await.ok()?;
        s.status?
            .load_balancer?
            .ingress?
            .first()?
            .ip
            .as_deref()?
            .parse()
            .ok()
    })
    .await?;
    let public = kumo_vpc::public_netns_of(&kumo::machine::vpc_dir(data))?;
    let vip_to = SocketAddr::from((vip, 5001));
    wait(
        120,
        "the VIP to accept connections (health checks)",
        async || {
            let p = public.clone();
            tokio::task::spawn_blocking(move || connects(&p, vip_to))
                .await
                .ok()?
                .then_some(())
        },
    )
    .await?;
    // Let the sink's nc listen again after the probe's connection.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let via_vip = send(&public, vip_to, bytes).await?;
    let mb = |secs: f64| bytes as f64 / secs / 1e6;
    println!(
        "throughput, {} MiB over one TCP connection to a pod on another node:",
        bytes >> 20
    );
    println!("  node -> pod IP (direct): {:.0} MB/s", mb(direct));
    println!(
        "  node -> ClusterIP (kube-proxy DNAT): {:.0} MB/s ({:.2}x direct)",
        mb(via_cluster_ip),
        direct / via_cluster_ip
    );
    println!(
        "  internet -> load balancer VIP (VPC DNAT, node port, kube-proxy): {:.0} MB/s ({:.2}x direct)",
        mb(via_vip),
        direct / via_vip
    );
    Ok(())
}

/// Sends `bytes` to `to` from namespace `netns` over one connection; seconds taken
/// (connect retried while the sink restarts its listener).
async fn send(netns: &Path, to: SocketAddr, bytes: usize) -> Result<f64> {
    let netns = netns.to_owned();
    tokio::task::spawn_blocking(move || -> Result<f64> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut stream = loop {
            match kumo_cri_remote::netns::connect(Some(&netns), to, Duration::from_secs(2)) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => {
                    return Err(e).context(format!("connecting to {to}"))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        let chunk = vec![0u8; 1 << 20];
        let start = Instant::now();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len());
            stream
                .write_all(&chunk[..n])
                .with_context(|| format!("sending to {to}"))?;
            left -= n;
        }
        let _ = stream.shutdown(std::net::Shutdown::Both);
        Ok(start.elapsed().as_secs_f64())
    })
    .await?
}
