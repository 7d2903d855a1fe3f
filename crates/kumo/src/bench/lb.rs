//! `kumo bench lb`: how fast Services of type LoadBalancer get their external address, and
//! what a node joining costs when many balancers must learn about it.
//!
//! Everything runs in this process on a temporary directory: the API server, the kumo cloud
//! (instances are records; no kubelets), and the cloud-controller-manager with only its
//! service controller, acting as `system:cloud-controller-manager`. Nodes are Node objects
//! made Ready with a providerID naming a running instance, as the cloud node controller
//! would leave them.
//!
//! Step 1 creates `--services` Services (`--concurrency` at a time) and times each from just
//! before its create request until a watch sees `status.loadBalancer.ingress` filled in.
//! Step 2 brings the total to `--fanout-services`, waits for all of them, then joins one
//! more node and times until every balancer in the cloud targets its instance (the service
//! controller's node sync: one UpdateLoadBalancer per Service).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kumo_cloud::{InstanceState, RunInstanceRequest, UpdateQuotasRequest};
use serde_json::json;

use super::percentile;

#[derive(clap::Args)]
pub struct Args {
    /// Services timed in step 1.
    #[arg(long, default_value_t = 200)]
    services: usize,
    /// Ready nodes (each a running instance) behind every balancer.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Services in all for step 2 (the node-join fan-out); 0 skips step 2.
    #[arg(long, default_value_t = 1000)]
    fanout_services: usize,
    /// Service creates in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// The service controller's `--concurrent-service-syncs`.
    #[arg(long, default_value_t = 1)]
    concurrent_service_syncs: usize,
}

const NS: &str = "default";

pub async fn run(args: Args) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut api_cfg = kumo_apiserver::ApiServerConfig::new(dir.path().join("cluster"));
    api_cfg.bind = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let api = kumo_apiserver::ApiServer::start(api_cfg).await?;
    let cloud =
        kumo_cloud::CloudServer::start(kumo_cloud::CloudConfig::new(dir.path().join("cloud")))
            .await
            .map_err(anyhow::Error::msg)?;
    let cloud_client = cloud.client()?;
    let want = (args.fanout_services.max(args.services) + 10) as u32;
    cloud_client
        .set_quotas(&UpdateQuotasRequest {
            max_instances: Some(args.nodes as u32 + 10),
            max_load_balancers: Some(want),
            ..Default::default()
        })
        .await?;
    let client = admin_client(&api.admin_kubeconfig).await?;
    kumo_cloud_provider::ccm::rbac::ensure(&client).await?;

    let mut ccm_cfg = kumo_cloud_provider::ccm::Config::new(
        dir.path()
            .join("cluster")
            .join("cloud-controller-manager.conf"),
    );
    ccm_cfg.controllers = vec!["service".into()];
    ccm_cfg.leader_elect = false;
    ccm_cfg.serve = None;
    ccm_cfg.concurrent_service_syncs = args.concurrent_service_syncs;
    let provider = Arc::new(kumo_cloud_provider::kumo::KumoCloud::new(
        cloud_client.clone(),
    ));
    let ccm = kumo_cloud_provider::ccm::CloudControllerManager::start(ccm_cfg, provider).await?;

    println!(
        "kumo bench lb: {} nodes, {} timed Services, fan-out over {} Services; --concurrency {}, --concurrent-service-syncs {}",
        args.nodes, args.services, args.fanout_services, args.concurrency, args.concurrent_service_syncs
    );
    let t = Instant::now();
    futures::stream::iter(0..args.nodes)
        .map(|i| join_node(&client, &cloud_client, format!("node-{i}")))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    println!(
        "  {} nodes ready in {:.1} s",
        args.nodes,
        t.elapsed().as_secs_f64()
    );

    // Step 1: create → EXTERNAL-IP.
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let (lat, wall) = create_and_time(&services, 0, args.services, args.concurrency).await?;
    report("create → EXTERNAL-IP", &lat, wall);

    // Step 2: the fan-out of one node joining.
    if args.fanout_services > args.services {
        let t = Instant::now();
        create_and_time(
            &services,
            args.services,
            args.fanout_services - args.services,
            args.concurrency,
        )
        .await?;
        println!(
            "  {} Services with an EXTERNAL-IP after {:.1} s more",
            args.fanout_services,
            t.elapsed().as_secs_f64()
        );
    }
    let total = args.fanout_services.max(args.services);
    let t = Instant::now();
    let instance = join_node(&client, &cloud_client, "node-joining".into()).await?;
    loop {
        let lbs = cloud_client.list_load_balancers().await?;
        let updated = lbs
            .iter()
            .filter(|lb| lb.targets.iter().any(|tg| tg.instance_id == instance))
            .count();
        if updated >= total {
            break;
        }
        if t.elapsed() > Duration::from_secs(600) {
            bail!("after 600 s only {updated} of {total} balancers target the new node");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fan = t.elapsed().as_secs_f64();
    println!(
        "  node join → all {total} balancers target it: {fan:.2} s ({:.1} ms per balancer)",
        fan * 1000.0 / total as f64
    );
    if let Some(rss) = rss_mib() {
        println!("  process peak RSS (API server + cloud + CCM + this client): {rss:.0} MiB");
    }
    ccm.shutdown().await?;
    cloud.shutdown().await;
    drop(api);
    Ok(())
}

/// A kube client from a kubeconfig file.
pub(super) async fn admin_client(path: &std::path::Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kumo_client::transport::client(cfg)?)
}

/// Runs an instance and makes a Ready Node for it; returns the instance id.
async fn join_node(
    client: &kube::Client,
    cloud: &kumo_cloud::Client,
    name: String,
) -> Result<String> {
    let i = cloud
        .run_instance(&RunInstanceRequest {
            name: Some(name.clone()),
            ..Default::default()
        })
        .await?;
    let i = cloud
        .wait_for_instance_state(&i.id, InstanceState::Running, Duration::from_secs(30))
        .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"providerID": kumo_cloud_provider::kumo::provider_id(&i.zone, &i.id)},
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": i.private_ip}],
    }});
    nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(i.id)
}

/// Creates `count` LoadBalancer Services `lb-<first..>` with `concurrency` creates in flight,
/// and returns each one's time from create to ingress (seconds) and the wall time.
async fn create_and_time(
    services: &Api<Service>,
    first: usize,
    count: usize,
    concurrency: usize,
) -> Result<(Vec<f64>, f64)> {
    let list = services.list(&Default::default()).await?;
    let rv = list.metadata.resource_version.unwrap_or_default();
    let mut stream = services
        .watch(&WatchParams::default().timeout(290), &rv)
        .await?
        .boxed();
    let started: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let t0 = Instant::now();
    let creates = {
        let started = started.clone();
        let services = services.clone();
        async move {
            futures::stream::iter(first..first + count)
                .map(|i| {
                    let started = started.clone();
                    let services = services.clone();
                    async move {
                        let name = format!("lb-{i}");
                        let svc: Service = serde_json::from_value(json!({
                            "metadata": {"name": name},
                            "spec": {"type": "LoadBalancer", "selector": {"app": name},
                                     "ports": [{"port": 80, "targetPort": 8080}]},
                        }))?;
                        if let Ok(mut m) = started.lock() {
                            m.insert(name.clone(), Instant::now());
                        }
                        services.create(&PostParams::default(), &svc).await?;
                        anyhow::Ok(())
                    }
                })
                .buffer_unordered(concurrency.max(1))
                .try_collect::<Vec<_>>()
                .await
        }
    };
    let creating = tokio::spawn(creates);
    let mut lat = Vec::with_capacity(count);
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(280);
    while lat.len() < count {
        let ev = tokio::time::timeout_at(deadline.into(), stream.next())
            .await
            .context("timed out waiting for external addresses")?;
        let Some(ev) = ev else {
            bail!("the watch ended after {} of {count} addresses", lat.len())
        };
        let svc = match ev? {
            WatchEvent::Added(s) | WatchEvent::Modified(s) => s,
            WatchEvent::Error(e) => bail!("watch error: {}", e.message),
            _ => continue,
        };
        let has_ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_some_and(|i| !i.is_empty());
        let name = svc.metadata.name.unwrap_or_default();
        if has_ingress && seen.insert(name.clone()) {
            if let Some(t) = started.lock().ok().and_then(|m| m.get(&name).copied()) {
                lat.push(t.elapsed().as_secs_f64());
            }
        }
    }
    creating.await??;
    Ok((lat, t0.elapsed().as_secs_f64()))
}

fn report(what: &str, lat: &[f64], wall: f64) {
    let mut s = lat.to_vec();
    s.sort_by(f64::total_cmp);
    println!(
        "  {what}: n={} p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {:.1} Services/s",
        s.len(),
        percentile(&s, 50.0) * 1000.0,
        percentile(&s, 90.0) * 1000.0,
        percentile(&s, 99.0) * 1000.0,
        s.last().copied().unwrap_or(f64::NAN) * 1000.0,
        s.len() as f64 / wall
    );
}

/// This process's peak resident memory (VmHWM), MiB.
fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}
