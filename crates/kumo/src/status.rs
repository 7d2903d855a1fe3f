//! `kumo status`: whether kumo runs on a data directory, the API server's health, the
//! control-plane components with their Leases in kube-system, and the nodes.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};

use crate::daemon;

/// The components `kumo up` runs that elect a leader, by Lease name in kube-system.
pub const COMPONENTS: &[&str] = &[
    "kube-controller-manager",
    "kube-scheduler",
    "cloud-controller-manager",
];

pub use kumo::kubeconfig::admin_client;

/// `GET /readyz` within 5 s: Ok(body) when it answered 200.
pub async fn readyz(client: &kube::Client) -> Result<String> {
    let req = http::Request::get("/readyz").body(Vec::new())?;
    let body = tokio::time::timeout(Duration::from_secs(5), client.request_text(req))
        .await
        .context("no answer in 5 s")??;
    Ok(body)
}

/// What a component's Lease says.
pub struct LeaseState {
    /// holderIdentity ("" when none).
    pub holder: String,
    /// Time since renewTime, if there is one.
    pub renewed_ago: Option<Duration>,
    /// Whether renewTime + leaseDurationSeconds is still ahead: the holder is alive.
    pub fresh: bool,
}

/// The Lease kube-system/`name`, if it exists.
pub async fn lease(client: &kube::Client, name: &str) -> Result<Option<LeaseState>> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let Some(l) = api.get_opt(name).await? else {
        return Ok(None);
    };
    let spec = l.spec.unwrap_or_default();
    let now = Timestamp::now();
    let renewed_ago = spec
        .renew_time
        .as_ref()
        .map(|t| age(now, t.0))
        .or_else(|| spec.acquire_time.as_ref().map(|t| age(now, t.0)));
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(0) as u64);
    Ok(Some(LeaseState {
        holder: spec.holder_identity.unwrap_or_default(),
        fresh: renewed_ago.is_some_and(|a| a <= duration),
        renewed_ago,
    }))
}

/// `now - t`, zero when `t` is in the future.
pub fn age(now: Timestamp, t: Timestamp) -> Duration {
    let secs = now.as_millisecond() - t.as_millisecond();
    Duration::from_millis(secs.max(0) as u64)
}

/// A duration as kubectl prints ages: 5s, 3m, 2h, 4d.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// The node's Ready condition status (`True`, `False`, `Unknown`; `Unknown` when missing).
pub fn node_ready(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone())
        .unwrap_or_else(|| "Unknown".into())
}

/// Prints the table; Ok(true) when the API server is ready (and, for a cluster whose data
/// directory is known, kumo runs on it).
pub async fn run(args: kumo::kubeconfig::ClusterArgs) -> Result<bool> {
    if let Some(dir) = &args.data_dir {
        if !dir.join("admin.conf").exists() {
            println!("kumo on {}", dir.display());
            println!("  API server: no admin.conf (kumo has never run here)");
            return Ok(false);
        }
    }
    let target = kumo::kubeconfig::target(&args).await?;
    let mut pid = None;
    match &target.data_dir {
        Some(dir) => {
            println!("kumo on {}", dir.display());
            pid = daemon::running(dir);
            match pid {
                Some(pid) => println!(
                    "  process:    running (pid {pid}), log {}",
                    dir.join(daemon::LOG_FILE).display()
                ),
                None => println!(
                    "  process:    not running (no live pid in {})",
                    daemon::PID_FILE
                ),
            }
        }
        None => println!("cluster of {}", target.source),
    }
    let (client, url) = (target.client.clone(), target.url.clone());
    match readyz(&client).await {
        Ok(_) => println!("  API server: {url} ready (/readyz ok)"),
        Err(e) => {
            println!("  API server: {url} not ready: {e:#}");
            return Ok(false);
        }
    }
    let cloud_dir = target.data_dir.as_ref().map(|d| d.join("cloud"));
    match cloud_dir.filter(|d| d.exists()) {
        Some(cloud_dir) => {
            let answer = match kumo_cloud::Client::from_data_dir(&cloud_dir) {
                Ok(c) => {
                    let asked = tokio::time::timeout(Duration::from_secs(5), c.regions()).await;
                    match asked {
                        Ok(Ok(_)) => format!("{} answering", c.endpoint()),
                        Ok(Err(e)) => format!("{} not answering: {e}", c.endpoint()),
                        Err(_) => format!("{} not answering in 5 s", c.endpoint()),
                    }
                }
                Err(e) => format!("unusable: {e}"),
            };
            println!("  cloud:      {answer}");
        }
        None if target.data_dir.is_some() => println!("  cloud:      none (--no-cloud)"),
        None => println!("  cloud:      unknown (no kumo data directory for this context)"),
    }
    println!();
    println!("{:<26}{:<8}{:<52}RENEWED", "COMPONENT", "LEASE", "HOLDER");
    for name in COMPONENTS {
        match lease(&client, name).await? {
            None => println!("{name:<26}{:<8}{:<52}-", "none", "(not running)"),
            Some(l) => println!(
                "{name:<26}{:<8}{:<52}{}",
                if l.fresh { "fresh" } else { "stale" },
                if l.holder.is_empty() {
                    "(released)"
                } else {
                    &l.holder
                },
                l.renewed_ago
                    .map(|a| format!("{} ago", human(a)))
                    .unwrap_or_else(|| "-".into())
            ),
        }
    }
    println!();
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    if nodes.items.is_empty() {
        println!("No nodes.");
    } else {
        println!("{:<32}{:<8}PROVIDER-ID", "NODE", "READY");
        for n in &nodes.items {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            let pid = n
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .unwrap_or("<none>");
            println!("{name:<32}{:<8}{pid}", node_ready(n));
        }
    }
    Ok(pid.is_some() || target.data_dir.is_none())
}
