//! The API server identity Lease (APIServerIdentity, GA), as kube-apiserver keeps it.
//!
//! Each server owns a Lease in kube-system named `apiserver-<hash>` (the hash of the host
//! name and the identity `kube-apiserver`), labelled with its identity and host name and
//! annotated with the address peers reach it at. It renews the lease every 10 seconds for
//! an hour's duration; a garbage collector deletes identity leases whose holder stopped
//! renewing them (an API server that went away). Both run as post-start hooks upstream:
//! `start-kube-apiserver-identity-lease-controller` and
//! `start-kube-apiserver-identity-lease-garbage-collector`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::registry::Resource;
use crate::rest::{self, Reply, Rest};

/// The identity label key and this server's value of it.
pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
/// The identity of kube-apiserver (the label value and part of the hash).
pub const IDENTITY: &str = "kube-apiserver";
/// The host name label.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Where peers reach this server (UnknownVersionInteroperabilityProxy, on by default).
pub const PEER_ADDRESS_ANNOTATION: &str = "kubernetes.io/peer-advertise-address";
/// The namespace of the identity leases.
pub const NAMESPACE: &str = "kube-system";
/// `leaseDurationSeconds` of an identity lease.
pub const LEASE_DURATION_SECONDS: i64 = 3600;
/// How often the lease is renewed.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(10);
/// How often expired identity leases are collected.
pub const GC_PERIOD: Duration = Duration::from_secs(3600);
/// The post-start hooks that start the controllers, as /livez and /readyz name them.
pub const HOOKS: [&str; 2] = [
    "poststarthook/start-kube-apiserver-identity-lease-controller",
    "poststarthook/start-kube-apiserver-identity-lease-garbage-collector",
];

/// The lease name (upstream's APIServerID) of the server on `hostname`: `apiserver-` and
/// the lower-case unpadded base32 of the first 16 bytes of the SHA-256 of the host name
/// and the identity, each prefixed with its 16-bit big-endian length.
pub fn lease_name(hostname: &str) -> String {
    let mut data = Vec::with_capacity(hostname.len() + IDENTITY.len() + 4);
    for part in [hostname.as_bytes(), IDENTITY.as_bytes()] {
        // Host names are at most 64 bytes; a longer one would fail upstream's builder.
        let len = u16::try_from(part.len()).unwrap_or(u16::MAX);
        data.extend_from_slice(&len.to_be_bytes());
        data.extend_from_slice(&part[..usize::from(len).min(part.len())]);
    }
    let hash = ring::digest::digest(&ring::digest::SHA256, &data);
    format!("apiserver-{}", base32_lower(&hash.as_ref()[..16]))
}

/// RFC 4648 base32, lower case, no padding.
fn base32_lower(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((acc >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((acc << (5 - bits)) & 31) as usize]));
    }
    out
}

/// The host name, as Go's os.Hostname reads it on Linux.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Seconds since the epoch of a Time or MicroTime (its fraction ignored).
fn parse_time(s: &str) -> Option<i64> {
    match s.split_once('.') {
        Some((whole, _)) => crate::time::parse_rfc3339(&format!("{whole}Z")),
        None => crate::time::parse_rfc3339(s),
    }
}

/// Whether an identity lease is expired (or lacks what makes it live), as the garbage
/// collector judges it.
pub fn expired(lease: &Value, now_secs: i64) -> bool {
    let renew = lease
        .pointer("/spec/renewTime")
        .and_then(Value::as_str)
        .and_then(parse_time);
    let duration = lease
        .pointer("/spec/leaseDurationSeconds")
        .and_then(Value::as_i64);
    match (renew, duration) {
        (Some(r), Some(d)) => r.saturating_add(d) < now_secs,
        _ => true,
    }
}

fn reply_object(reply: Reply) -> Option<Value> {
    match reply {
        Reply::Json(_, v) => Some(v),
        Reply::Raw(_, b) => serde_json::from_slice(&b).ok(),
        Reply::Stream(_) => None,
    }
}

/// The identity lease controller of one server.
pub struct LeaseController {
    rest: Arc<Rest>,
    leases: Arc<Resource>,
    name: String,
    holder: String,
    hostname: String,
    peer_address: String,
}

impl LeaseController {
    /// The controller of the server on this host, reachable by peers at `peer_address`
    /// (`host:port`).
    pub fn new(
        rest: Arc<Rest>,
        leases: Arc<Resource>,
        peer_address: String,
        hostname: String,
    ) -> Self {
        let name = lease_name(&hostname);
        let holder = format!("{name}_{}", uuid::Uuid::new_v4());
        LeaseController {
            rest,
            leases,
            name,
            holder,
            hostname,
            peer_address,
        }
    }

    /// The lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease as this server asserts it over `base` (the stored one, or nothing).
    fn desired(&self, base: Option<Value>) -> Value {
        let mut lease = base.unwrap_or_else(|| {
            json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": NAMESPACE},
                "spec": {"holderIdentity": self.holder},
            })
        });
        if let Some(spec) = lease.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("leaseDurationSeconds".into(), json!(LEASE_DURATION_SECONDS));
            spec.insert("renewTime".into(), json!(crate::time::now_micro()));
        }
        if let Some(meta) = lease.get_mut("metadata").and_then(Value::as_object_mut) {
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert(IDENTITY_LABEL.into(), json!(IDENTITY));
                l.insert(HOSTNAME_LABEL.into(), json!(self.hostname));
            }
            let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
            if let Some(a) = annotations.as_object_mut() {
                if !self.peer_address.is_empty() {
                    a.insert(PEER_ADDRESS_ANNOTATION.into(), json!(self.peer_address));
                }
            }
        }
        lease
    }

    /// One renewal: creates the lease when missing, else updates the latest one seen
    /// (fetching it again after a conflict). Returns the lease written.
    async fn sync(
        &self,
        latest: Option<Value>,
    ) -> Result<Value, kumo_apimachinery::status::ApiError> {
        let query = BTreeMap::new();
        let ns = Some(NAMESPACE);
        let mut base = latest;
        for _ in 0..5 {
            let current = match base.take() {
                Some(b) => b,
                None => match self
                    .rest
                    .get(
                        &self.leases,
                        ns,
                        &self.name,
                        &rest::Request::json(&query, b""),
                    )
                    .await
                {
                    Ok(r) => reply_object(r).unwrap_or(Value::Null),
                    Err(e) if e.code == 404 => {
                        let body = self.desired(None).to_string();
                        let created = self
                            .rest
                            .create(
                                &self.leases,
                                ns,
                                &rest::Request::json(&query, body.as_bytes()),
                            )
                            .await?;
                        return Ok(reply_object(created).unwrap_or(Value::Null));
                    }
                    Err(e) => return Err(e),
                },
            };
            let body = self.desired(Some(current)).to_string();
            match self
                .rest
                .update(
                    &self.leases,
                    ns,
                    &self.name,
                    None,
                    &rest::Request::json(&query, body.as_bytes()),
                )
                .await
            {
                Ok(r) => return Ok(reply_object(r).unwrap_or(Value::Null)),
                // Someone else wrote it (or it was deleted): start over from the store.
                Err(e) if e.code == 409 || e.code == 404 => continue,
                Err(e) => return Err(e),
            }
        }
        Err(kumo_apimachinery::status::ApiError::internal(
            "failed 5 attempts to update lease",
        ))
    }

    /// Renews the lease every [`RENEW_INTERVAL`] (with upstream's 4 % jitter) forever.
    pub async fn run(self) {
        let mut latest: Option<Value> = None;
        loop {
            match self.sync(latest.take()).await {
                Ok(lease) if lease.is_object() => latest = Some(lease),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e.message, "renewing the apiserver identity lease");
                }
            }
            let jitter = RENEW_INTERVAL.mul_f64(0.04 * f64::from(rand_unit()));
            tokio::time::sleep(RENEW_INTERVAL + jitter).await;
        }
    }
}

/// A number in [0, 1) for jitter.
fn rand_unit() -> f32 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (nanos % 1000) as f32 / 1000.0
}

/// Deletes the identity leases of kube-apiservers that stopped renewing them: at start,
/// then every `period` (upstream: every hour).
pub async fn collect_garbage(rest: Arc<Rest>, leases: Arc<Resource>, period: Duration) {
    loop {
        collect_once(&rest, &leases).await;
        tokio::time::sleep(period).await;
    }
}

/// One pass of the identity lease garbage collector; returns the names deleted.
pub async fn collect_once(rest: &Rest, leases: &Resource) -> Vec<String> {
    let mut query = BTreeMap::new();
    query.insert(
        "labelSelector".to_owned(),
        format!("{IDENTITY_LABEL}={IDENTITY}"),
    );
    let ns = Some(NAMESPACE);
    let list = match rest
        .list(leases, ns, &rest::Request::json(&query, b""))
        .await
    {
        Ok(r) => reply_object(r).unwrap_or(Value::Null),
        Err(e) => {
            tracing::warn!(error = %e.message, "listing apiserver identity leases");
            return Vec::new();
        }
    };
    let now = crate::time::now_secs();
    let plain = BTreeMap::new();
    let mut deleted = Vec::new();
    let items = list.get("items").and_then(Value::as_array).cloned();
    for item in items.unwrap_or_default() {
        if !expired(&item, now) {
            continue;
        }
        let Some(name) = item.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        // Look again at the stored lease before deleting it: it may have been renewed.
        let fresh = match rest
            .get(leases, ns, name, &rest::Request::json(&plain, b""))
            .await
        {
            Ok(r) => reply_object(r).unwrap_or(Value::Null),
            Err(_) => continue,
        };
        if !expired(&fresh, now) {
            continue;
        }
        match rest
            .delete(leases, ns, name, &rest::Request::json(&plain, b""))
            .await
        {
            Ok(_) => deleted.push(name.to_owned()),
            Err(e) if e.code == 404 => {}
            Err(e) => {
                tracing::warn!(lease = name, error = %e.message, "deleting an expired apiserver identity lease")
            }
        }
    }
    deleted
}

/// Starts the lease controller and the garbage collector of this server.
pub fn start(rest: Arc<Rest>, leases: Arc<Resource>, peer_address: String, hostname: String) {
    let controller = LeaseController::new(rest.clone(), leases.clone(), peer_address, hostname);
    tokio::spawn(controller.run());
    tokio::spawn(collect_garbage(rest, leases, GC_PERIOD));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_name_matches_kube_apiserver() {
        // kube-apiserver v1.37.2 on host "vm" names its lease so.
        assert_eq!(lease_name("vm"), "apiserver-wlv32tlttr4jl3gtroqexyxapa");
    }

    #[test]
    fn expiry() {
        let t = 1_800_000_000;
        let at = |s: i64| {
            json!({"spec": {"renewTime": crate::time::format_rfc3339(s).replace('Z', ".123456Z"),
                "leaseDurationSeconds": 3600}})
        };
        assert!(!expired(&at(t), t + 3600));
        assert!(expired(&at(t), t + 3601));
        assert!(expired(&json!({"spec": {"leaseDurationSeconds": 3600}}), t));
    }
}
