//! The `kubernetes` Service's endpoints when several API servers share one etcd
//! (kube-apiserver's `--endpoint-reconciler-type=lease`): each server keeps a lease under
//! `/registry/masterleases/<ip>` and, every [`INTERVAL`], makes the `default/kubernetes`
//! Endpoints and EndpointSlice list the addresses whose leases are live.
//!
//! etcd's TTL leases are not part of the store's interface, so a lease carries its renewal
//! time and is live for [`TTL`] after it; the servers delete expired ones as they
//! reconcile, so a server that stopped leaves the endpoints within [`TTL`] + [`INTERVAL`].

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kumo_storage::{RangeRequest, StorageError};
use serde_json::{json, Value};

use crate::rest::Rest;

/// How long a lease lives after its renewal (upstream's master lease TTL).
pub const TTL: Duration = Duration::from_secs(15);
/// How often each server renews its lease and reconciles (upstream's reconcile interval).
pub const INTERVAL: Duration = Duration::from_secs(10);

const PREFIX: &str = "/registry/masterleases/";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Writes this server's lease at `ip`; the live addresses (expired leases deleted).
async fn renew(rest: &Rest, ip: IpAddr) -> Result<Vec<IpAddr>, StorageError> {
    let key = format!("{PREFIX}{ip}");
    let value = serde_json::to_vec(&json!({"ip": ip.to_string(), "renewTime": now_ms()}))
        .unwrap_or_default();
    match rest.store.get(key.as_bytes(), None).await? {
        (Some(kv), _) => {
            rest.store
                .update(key.as_bytes(), value, Some(kv.mod_revision))
                .await?;
        }
        (None, _) => {
            rest.store.create(key.as_bytes(), value).await?;
        }
    }
    let listed = rest
        .store
        .range(RangeRequest {
            prefix: PREFIX.as_bytes().to_vec(),
            ..Default::default()
        })
        .await?;
    let now = now_ms();
    let ttl = u64::try_from(TTL.as_millis()).unwrap_or(u64::MAX);
    let mut live = Vec::new();
    for kv in listed.kvs {
        let lease: Value = serde_json::from_slice(&kv.value).unwrap_or_default();
        let renewed = lease.get("renewTime").and_then(Value::as_u64).unwrap_or(0);
        let addr = lease
            .get("ip")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<IpAddr>().ok());
        match addr {
            Some(a) if renewed.saturating_add(ttl) >= now => live.push(a),
            _ => {
                // Another server may delete it first; either way it is gone.
                let _ = rest.store.delete(&kv.key, Some(kv.mod_revision)).await;
            }
        }
    }
    live.sort();
    live.dedup();
    Ok(live)
}

/// Keeps this server's lease and the `kubernetes` endpoints (`port` on every live address)
/// until the task is dropped.
pub async fn run(
    rest: Arc<Rest>,
    registry: impl std::ops::Deref<Target = crate::registry::Registry>,
    ip: IpAddr,
    port: u16,
) {
    let mut tick = tokio::time::interval(INTERVAL);
    loop {
        tick.tick().await;
        match renew(&rest, ip).await {
            Ok(live) => {
                if let Err(e) =
                    crate::server::write_kubernetes_endpoints(&rest, &registry, &live, port).await
                {
                    tracing::warn!(error = %e, "reconciling the kubernetes endpoints failed");
                }
            }
            Err(e) => tracing::warn!(%ip, error = %e, "renewing the master lease failed"),
        }
    }
}
