//! Cluster IPs and node ports of Services, held in the store as upstream v1.37 holds them:
//! one networking.k8s.io/v1 IPAddress object per allocated IP (named by the IP, its
//! `parentRef` the Service) inside the default ServiceCIDR, and a bitmap of node ports in
//! `/registry/ranges/servicenodeports`. Creating an IPAddress and updating the bitmap are
//! both compare-and-swap writes, so two racing Services never get the same IP or port.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use base64::Engine;
use futures::future::BoxFuture;
use futures::FutureExt;
use kumo_apimachinery::status::ApiError;
use kumo_apimachinery::validation::{FieldError, Path};
use kumo_storage::{RangeRequest, StorageError, Store};
use serde_json::{json, Value};

use super::super::{name_of, str_at, Allocator};

/// The service cluster IP range (kube-apiserver's `--service-cluster-ip-range`).
pub const SERVICE_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 96, 0, 0), 12);
/// The node port range (`--service-node-port-range`).
pub const NODE_PORTS: (u16, u16) = (30000, 32767);
/// Name of the default ServiceCIDR.
pub const DEFAULT_SERVICE_CIDR: &str = "kubernetes";

pub(super) const IP_PREFIX: &str = "/registry/ipaddresses/";
const CIDR_PREFIX: &str = "/registry/servicecidrs/";
const NODE_PORT_KEY: &str = "/registry/ranges/servicenodeports";
pub(super) const MANAGED_BY: &str = "ipaddress.kubernetes.io/managed-by";
const IP_FAMILY: &str = "ipaddress.kubernetes.io/ip-family";

/// `10.96.0.0/12`: kube-apiserver's `--service-cluster-ip-range` when none is given.
pub fn service_cidr() -> String {
    format!("{}/{}", SERVICE_CIDR.0, SERVICE_CIDR.1)
}

/// An IPv4 range that can hold Services (`a.b.c.d/n`, n from 1 to 30), as its network
/// address and prefix length.
pub fn parse_service_cidr(cidr: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, bits) = cidr.trim().split_once('/')?;
    let (ip, bits) = (ip.parse::<Ipv4Addr>().ok()?, bits.parse::<u8>().ok()?);
    if !(1..=30).contains(&bits) {
        return None;
    }
    let mask = u32::MAX << (32 - u32::from(bits));
    Some((Ipv4Addr::from(u32::from(ip) & mask), bits))
}

/// The `kubernetes` Service's address in `range`: its first host.
pub fn first_service_ip((net, _): (Ipv4Addr, u8)) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net).saturating_add(1))
}

/// Host addresses of a range: its first usable address and how many there are (the
/// network and broadcast addresses are never handed out).
fn hosts((net, bits): (Ipv4Addr, u8)) -> (u32, u32) {
    let size = 1u32 << (32 - u32::from(bits));
    (u32::from(net) + 1, size - 2)
}

/// The IPv4 ranges of the stored ServiceCIDRs, the default one (`kubernetes`, which the
/// API server makes from its `--service-cluster-ip-range`) first; the compiled default
/// when none is stored.
async fn stored_ranges(store: &dyn Store) -> Result<Vec<(Ipv4Addr, u8)>, ApiError> {
    let page = store
        .range(RangeRequest {
            prefix: CIDR_PREFIX.as_bytes().to_vec(),
            ..Default::default()
        })
        .await
        .map_err(ApiError::internal)?;
    let default_key = format!("{CIDR_PREFIX}{DEFAULT_SERVICE_CIDR}");
    let (mut out, mut others) = (Vec::new(), Vec::new());
    for kv in page.kvs {
        let Ok(obj) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        let cidrs = obj.pointer("/spec/cidrs").and_then(Value::as_array);
        let ranges = cidrs
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter_map(parse_service_cidr);
        if kv.key == default_key.as_bytes() {
            out.extend(ranges);
        } else {
            others.extend(ranges);
        }
    }
    out.append(&mut others);
    if out.is_empty() {
        out.push(SERVICE_CIDR);
    }
    Ok(out)
}

/// The host ranges of every IPv4 ServiceCIDR: an IP asked for by name may come from any
/// of them.
pub(super) async fn service_ranges(store: &dyn Store) -> Result<Vec<(u32, u32)>, ApiError> {
    Ok(stored_ranges(store).await?.into_iter().map(hosts).collect())
}

/// Where random allocation starts: the low part of the range is kept for IPs asked for
/// by name (upstream's offset: size/16, between 16 and 256).
fn dynamic_offset(size: u32) -> u32 {
    (size / 16).clamp(16, 256).min(size / 2)
}

/// A few random bits (no `rand` in this crate; a v4 UUID is random enough to spread picks).
fn random_u32() -> u32 {
    let b = uuid::Uuid::new_v4().into_bytes();
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn type_of(svc: &Value) -> &str {
    match str_at(svc, "/spec/type") {
        "" => "ClusterIP",
        t => t,
    }
}

/// Whether a Service holds cluster IPs: not ExternalName, not headless.
fn needs_ips(svc: &Value) -> bool {
    type_of(svc) != "ExternalName" && str_at(svc, "/spec/clusterIP") != "None"
}

/// The cluster IPs a Service holds.
fn ips_of(svc: &Value) -> Vec<String> {
    if !needs_ips(svc) {
        return Vec::new();
    }
    svc.pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .filter(|s| !s.is_empty() && *s != "None")
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn uses_node_ports(svc: &Value) -> bool {
    matches!(type_of(svc), "NodePort" | "LoadBalancer")
}

/// Whether a Service needs a health check node port (LoadBalancer with Local traffic).
pub fn needs_health_check(svc: &Value) -> bool {
    type_of(svc) == "LoadBalancer" && str_at(svc, "/spec/externalTrafficPolicy") == "Local"
}

/// The node ports a Service holds (its ports' and its health check port).
pub(super) fn node_ports_of(svc: &Value) -> BTreeSet<u16> {
    let mut out = BTreeSet::new();
    if uses_node_ports(svc) {
        for p in ports(svc) {
            if let Some(n) = p.get("nodePort").and_then(Value::as_u64).filter(|n| *n > 0) {
                out.insert(n as u16);
            }
        }
    }
    if needs_health_check(svc) {
        if let Some(n) = svc
            .pointer("/spec/healthCheckNodePort")
            .and_then(Value::as_u64)
            .filter(|n| *n > 0)
        {
            out.insert(n as u16);
        }
    }
    out
}

fn ports(svc: &Value) -> &[Value] {
    svc.pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn invalid(svc: &Value, errs: &[FieldError]) -> ApiError {
    let name = name_of(svc);
    let causes = errs.iter().map(FieldError::to_cause).collect();
    ApiError::invalid(
        "",
        "Service",
        name,
        kumo_apimachinery::validation::invalid_message("Service", name, errs),
        causes,
    )
}

fn cluster_ips_error(svc: &Value, ip: &str, why: &str) -> ApiError {
    let ips = svc
        .pointer("/spec/clusterIPs")
        .cloned()
        .unwrap_or_else(|| json!([ip]));
    invalid(
        svc,
        &[FieldError::invalid(
            &Path::new("spec").child("clusterIPs"),
            ips,
            format!("failed to allocate IP {ip}: {why}"),
        )],
    )
}

/// The allocator of Services.
pub struct ServiceAllocator;

impl Allocator for ServiceAllocator {
    fn allocate<'a>(
        &'a self,
        store: &'a dyn Store,
        new: &'a mut Value,
        old: Option<&'a Value>,
        dry_run: bool,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        async move {
            super::default_ip_families(new, old);
            // Upstream checks the IP fields before allocating; its other checks come after.
            let errs = super::validate_ip_fields(new);
            if !errs.is_empty() {
                return Err(invalid(new, &errs));
            }
            // Cluster IPs: on create, and when a Service stops being ExternalName.
            let allocated_ip = if needs_ips(new) && old.is_none_or(|o| !needs_ips(o)) {
                allocate_ip(store, new, dry_run).await?
            } else {
                None
            };
            if let Err(e) = allocate_node_ports(store, new, old, dry_run).await {
                if let Some(ip) = allocated_ip {
                    release_ip(store, new, &ip).await;
                }
                return Err(e);
            }
            Ok(())
        }
        .boxed()
    }

    fn release<'a>(
        &'a self,
        store: &'a dyn Store,
        held: &'a Value,
        kept: Option<&'a Value>,
    ) -> BoxFuture<'a, ()> {
        async move {
            let keep_ips = kept.map(ips_of).unwrap_or_default();
            for ip in ips_of(held) {
                if !keep_ips.contains(&ip) {
                    release_ip(store, held, &ip).await;
                }
            }
            let keep_ports = kept.map(node_ports_of).unwrap_or_default();
            let gone: Vec<u16> = node_ports_of(held)
                .difference(&keep_ports)
                .copied()
                .collect();
            if !gone.is_empty() {
                if let Err(e) = update_bitmap(store, |bits| {
                    for p in &gone {
                        bits.set(*p, false);
                    }
                    Ok(())
                })
                .await
                {
                    tracing::warn!(error = %e.message, ports = ?gone, "releasing node ports failed");
                }
            }
        }
        .boxed()
    }
}

/// The IPAddress object that records `ip` as held by `svc`.
fn ip_address_object(svc: &Value, ip: &str) -> Value {
    json!({
        "kind": "IPAddress",
        "apiVersion": "networking.k8s.io/v1",
        "metadata": {
            "name": ip,
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": crate::time::now_rfc3339(),
            "labels": {IP_FAMILY: "IPv4", MANAGED_BY: "ipallocator.k8s.io"},
        },
        "spec": {"parentRef": {
            "resource": "services",
            "namespace": str_at(svc, "/metadata/namespace"),
            "name": name_of(svc),
        }},
    })
}

/// Reserves the Service's cluster IP (the one asked for, or a free one), records it in
/// the Service, and returns it if something was reserved.
async fn allocate_ip(
    store: &dyn Store,
    svc: &mut Value,
    dry_run: bool,
) -> Result<Option<String>, ApiError> {
    let requested = svc
        .pointer("/spec/clusterIPs/0")
        .and_then(Value::as_str)
        .or_else(|| svc.pointer("/spec/clusterIP").and_then(Value::as_str))
        .unwrap_or("")
        .to_owned();
    let ip = if requested.is_empty() {
        // Dynamic addresses come from the default ServiceCIDR.
        let primary = stored_ranges(store).await?[0];
        if dry_run {
            // What upstream's dry-run allocator answers: the range's own address.
            set_ip(svc, &primary.0.to_string());
            return Ok(None);
        }
        let (first, count) = hosts(primary);
        let used: BTreeSet<String> = list_ips(store).await?;
        let offset = dynamic_offset(count);
        let dynamic = count - offset;
        let start = random_u32() % dynamic;
        // Random in the upper part of the range first, then the lower part.
        let candidates = (0..dynamic)
            .map(|i| first + offset + (start + i) % dynamic)
            .chain((0..offset).map(|i| first + i));
        let mut chosen = None;
        for n in candidates {
            let ip = Ipv4Addr::from(n).to_string();
            if used.contains(&ip) {
                continue;
            }
            match create_ip(store, svc, &ip).await {
                Ok(()) => {
                    chosen = Some(ip);
                    break;
                }
                Err(StorageError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(ApiError::internal(e)),
            }
        }
        let Some(ip) = chosen else {
            return Err(ApiError::internal(
                "failed to allocate a serviceIP: range is full",
            ));
        };
        ip
    } else {
        let Ok(parsed) = requested.parse::<Ipv4Addr>() else {
            // Not an IPv4 address: validation has its say.
            return Ok(None);
        };
        let n = u32::from(parsed);
        let in_range = service_ranges(store).await?.iter().any(|(first, count)| {
            n >= *first && u64::from(n) < u64::from(*first) + u64::from(*count)
        });
        if !in_range {
            return Err(cluster_ips_error(
                svc,
                &requested,
                "the provided network does not match the current range",
            ));
        }
        let taken = || cluster_ips_error(svc, &requested, "provided IP is already allocated");
        if dry_run {
            let key = format!("{IP_PREFIX}{requested}");
            let (kv, _) = store
                .get(key.as_bytes(), None)
                .await
                .map_err(ApiError::internal)?;
            if kv.is_some() {
                return Err(taken());
            }
            set_ip(svc, &requested);
            return Ok(None);
        }
        match create_ip(store, svc, &requested).await {
            Ok(()) => {}
            Err(StorageError::AlreadyExists { .. }) => return Err(taken()),
            Err(e) => return Err(ApiError::internal(e)),
        }
        requested
    };
    set_ip(svc, &ip);
    Ok(Some(ip))
}

fn set_ip(svc: &mut Value, ip: &str) {
    if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("clusterIP".into(), json!(ip));
        spec.insert("clusterIPs".into(), json!([ip]));
        spec.entry("ipFamilies").or_insert_with(|| json!(["IPv4"]));
    }
}

pub(super) async fn create_ip(
    store: &dyn Store,
    svc: &Value,
    ip: &str,
) -> Result<(), StorageError> {
    let key = format!("{IP_PREFIX}{ip}");
    let body = serde_json::to_vec(&ip_address_object(svc, ip))
        .map_err(|e| StorageError::Corrupt(e.to_string()))?;
    store.create(key.as_bytes(), body).await.map(|_| ())
}

async fn list_ips(store: &dyn Store) -> Result<BTreeSet<String>, ApiError> {
    let page = store
        .range(RangeRequest {
            prefix: IP_PREFIX.as_bytes().to_vec(),
            ..Default::default()
        })
        .await
        .map_err(ApiError::internal)?;
    Ok(page
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key[IP_PREFIX.len()..]).into_owned())
        .collect())
}

/// Deletes the IPAddress of `ip`, whoever holds it; whether it was deleted.
pub(super) async fn delete_ip(store: &dyn Store, ip: &str) -> bool {
    let key = format!("{IP_PREFIX}{ip}");
    match store.delete(key.as_bytes(), None).await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(ip, error = %e, "deleting an IPAddress failed");
            false
        }
    }
}

/// Deletes the IPAddress of `ip` if `svc` is its parent (never another Service's).
async fn release_ip(store: &dyn Store, svc: &Value, ip: &str) {
    let key = format!("{IP_PREFIX}{ip}");
    let Ok((Some(kv), _)) = store.get(key.as_bytes(), None).await else {
        return;
    };
    let Ok(obj) = serde_json::from_slice::<Value>(&kv.value) else {
        return;
    };
    let owned = str_at(&obj, "/spec/parentRef/resource") == "services"
        && str_at(&obj, "/spec/parentRef/namespace") == str_at(svc, "/metadata/namespace")
        && str_at(&obj, "/spec/parentRef/name") == name_of(svc);
    if owned {
        if let Err(e) = store.delete(key.as_bytes(), Some(kv.mod_revision)).await {
            tracing::warn!(ip, error = %e, "releasing a cluster IP failed");
        }
    }
}

/// The node port bitmap: bit `i` stands for port `NODE_PORTS.0 + i`.
pub(super) struct Bitmap(Vec<bool>);

impl Bitmap {
    fn size() -> usize {
        usize::from(NODE_PORTS.1 - NODE_PORTS.0) + 1
    }

    pub(super) fn in_range(port: u16) -> bool {
        (NODE_PORTS.0..=NODE_PORTS.1).contains(&port)
    }

    pub(super) fn get(&self, port: u16) -> bool {
        Self::in_range(port) && self.0[usize::from(port - NODE_PORTS.0)]
    }

    pub(super) fn set(&mut self, port: u16, on: bool) {
        if Self::in_range(port) {
            self.0[usize::from(port - NODE_PORTS.0)] = on;
        }
    }

    /// A free port, searching from a random place.
    fn next_free(&self) -> Option<u16> {
        let size = Self::size();
        let start = random_u32() as usize % size;
        (0..size)
            .map(|i| (start + i) % size)
            .find(|i| !self.0[*i])
            .map(|i| NODE_PORTS.0 + i as u16)
    }

    /// Big-endian bytes of the bitmap as one big integer (upstream's `big.Int.Bytes()`).
    fn encode(&self) -> Vec<u8> {
        let n = Self::size().div_ceil(8);
        let mut bytes = vec![0u8; n];
        for (i, on) in self.0.iter().enumerate() {
            if *on {
                bytes[n - 1 - i / 8] |= 1 << (i % 8);
            }
        }
        let first = bytes.iter().position(|b| *b != 0).unwrap_or(n);
        bytes.split_off(first)
    }

    fn decode(data: &[u8]) -> Bitmap {
        let mut bits = vec![false; Self::size()];
        for (j, b) in data.iter().rev().enumerate() {
            for k in 0..8 {
                let i = j * 8 + k;
                if i < bits.len() && b & (1 << k) != 0 {
                    bits[i] = true;
                }
            }
        }
        Bitmap(bits)
    }
}

/// Reads the bitmap (empty when absent): the bitmap and the revision to swap against.
pub(super) async fn read_bitmap(store: &dyn Store) -> Result<(Bitmap, Option<i64>), ApiError> {
    let (kv, _) = store
        .get(NODE_PORT_KEY.as_bytes(), None)
        .await
        .map_err(ApiError::internal)?;
    let Some(kv) = kv else {
        return Ok((Bitmap(vec![false; Bitmap::size()]), None));
    };
    let obj: Value = serde_json::from_slice(&kv.value).map_err(ApiError::internal)?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(str_at(&obj, "/data"))
        .map_err(ApiError::internal)?;
    Ok((Bitmap::decode(&data), Some(kv.mod_revision)))
}

/// Read-modify-write of the bitmap with compare-and-swap, retried on conflict; nothing
/// is written when the change leaves the bitmap as it was.
pub(super) async fn update_bitmap(
    store: &dyn Store,
    mut change: impl FnMut(&mut Bitmap) -> Result<(), ApiError>,
) -> Result<(), ApiError> {
    for _ in 0..32 {
        let (mut bits, rev) = read_bitmap(store).await?;
        let before = bits.0.clone();
        change(&mut bits)?;
        if bits.0 == before {
            return Ok(());
        }
        let doc = json!({
            "kind": "RangeAllocation",
            "apiVersion": "v1",
            "metadata": {"creationTimestamp": null},
            "range": format!("{}-{}", NODE_PORTS.0, NODE_PORTS.1),
            "data": base64::engine::general_purpose::STANDARD.encode(bits.encode()),
        });
        let body = serde_json::to_vec(&doc).map_err(ApiError::internal)?;
        let written = match rev {
            Some(r) => store
                .update(NODE_PORT_KEY.as_bytes(), body, Some(r))
                .await
                .map(|_| ()),
            None => store
                .create(NODE_PORT_KEY.as_bytes(), body)
                .await
                .map(|_| ()),
        };
        match written {
            Ok(()) => return Ok(()),
            Err(StorageError::Conflict { .. } | StorageError::AlreadyExists { .. }) => continue,
            Err(e) => return Err(ApiError::internal(e)),
        }
    }
    Err(ApiError::internal(
        "node port allocation kept conflicting; try again",
    ))
}

fn node_port_error(svc: &Value, i: usize, port: i64, why: &str) -> ApiError {
    invalid(
        svc,
        &[FieldError::invalid(
            &Path::new("spec").child("ports").index(i).child("nodePort"),
            port,
            why,
        )],
    )
}

/// Node ports of a NodePort or LoadBalancer Service: the ones asked for that `old` did
/// not hold yet are reserved, missing ones allocated (ports with the same number share
/// one), and the health check port of a Local LoadBalancer; all in one bitmap swap.
async fn allocate_node_ports(
    store: &dyn Store,
    svc: &mut Value,
    old: Option<&Value>,
    dry_run: bool,
) -> Result<(), ApiError> {
    let held = old.map(node_ports_of).unwrap_or_default();
    let allocate_missing = type_of(svc) == "NodePort"
        || svc
            .pointer("/spec/allocateLoadBalancerNodePorts")
            .and_then(Value::as_bool)
            .unwrap_or(true);
    let wants_ports = uses_node_ports(svc);
    let wants_health = needs_health_check(svc);
    if !wants_ports && !wants_health {
        return Ok(());
    }
    let snapshot = svc.clone();
    let mut result = snapshot.clone();
    let compute = |bits: &mut Bitmap, result: &mut Value| -> Result<(), ApiError> {
        *result = snapshot.clone();
        let mut by_port: Vec<(i64, u16)> = Vec::new();
        let mut taken_now: BTreeSet<u16> = BTreeSet::new();
        let n = ports(result).len();
        for i in 0..n {
            let p = &ports(result)[i];
            let number = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            let asked = p.get("nodePort").and_then(Value::as_i64).unwrap_or(0);
            if !wants_ports || (asked == 0 && !allocate_missing) {
                continue;
            }
            let shared = by_port
                .iter()
                .any(|(n, np)| *n == number && i64::from(*np) == asked);
            let port = if asked != 0 {
                let Ok(np) = u16::try_from(asked) else {
                    return Err(node_port_error(
                        &snapshot,
                        i,
                        asked,
                        "provided port is not in the valid range. The range of valid ports is 30000-32767",
                    ));
                };
                // Ports with the same number (TCP and UDP) may share a node port; others
                // may not, not even within one Service.
                if !held.contains(&np) && !shared {
                    if !Bitmap::in_range(np) {
                        return Err(node_port_error(
                            &snapshot,
                            i,
                            asked,
                            &format!(
                                "provided port is not in the valid range. The range of valid ports is {}-{}",
                                NODE_PORTS.0, NODE_PORTS.1
                            ),
                        ));
                    }
                    if bits.get(np) {
                        return Err(node_port_error(
                            &snapshot,
                            i,
                            asked,
                            "provided port is already allocated",
                        ));
                    }
                    bits.set(np, true);
                    taken_now.insert(np);
                }
                np
            } else if let Some((_, np)) = by_port.iter().find(|(n, _)| *n == number) {
                *np
            } else {
                let np = bits.next_free().ok_or_else(|| {
                    ApiError::internal("failed to allocate a nodePort: range is full")
                })?;
                bits.set(np, true);
                taken_now.insert(np);
                np
            };
            by_port.push((number, port));
            if let Some(p) = result
                .pointer_mut("/spec/ports")
                .and_then(Value::as_array_mut)
                .and_then(|a| a.get_mut(i))
                .and_then(Value::as_object_mut)
            {
                p.insert("nodePort".into(), json!(port));
            }
        }
        if wants_health {
            let asked = result
                .pointer("/spec/healthCheckNodePort")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let np = if asked != 0 {
                let np = u16::try_from(asked).unwrap_or(0);
                if !held.contains(&np) && !taken_now.contains(&np) {
                    if !Bitmap::in_range(np) || bits.get(np) {
                        return Err(ApiError::internal(format!(
                            "failed to allocate requested HealthCheck NodePort {asked}: provided port is already allocated"
                        )));
                    }
                    bits.set(np, true);
                }
                np
            } else {
                let np = bits.next_free().ok_or_else(|| {
                    ApiError::internal("failed to allocate a HealthCheck NodePort: range is full")
                })?;
                bits.set(np, true);
                np
            };
            if let Some(spec) = result.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("healthCheckNodePort".into(), json!(np));
            }
        }
        Ok(())
    };
    if dry_run {
        let (mut bits, _) = read_bitmap(store).await?;
        compute(&mut bits, &mut result)?;
    } else {
        update_bitmap(store, |bits| compute(bits, &mut result)).await?;
    }
    *svc = result;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_round_trips_as_a_big_endian_integer() {
        let mut b = Bitmap(vec![false; Bitmap::size()]);
        b.set(30000, true);
        b.set(30009, true);
        b.set(32767, true);
        let bytes = b.encode();
        // The highest port is the most significant bit of the first byte kept.
        assert_eq!(bytes.len(), Bitmap::size().div_ceil(8));
        assert_eq!(bytes[bytes.len() - 1], 1);
        assert_eq!(bytes[bytes.len() - 2], 2);
        let back = Bitmap::decode(&bytes);
        assert!(back.get(30000) && back.get(30009) && back.get(32767));
        assert!(!back.get(30001));
        assert!(Bitmap::decode(&[]).next_free().is_some());
    }

    #[test]
    fn the_dynamic_part_starts_after_the_static_block() {
        let (first, count) = hosts(SERVICE_CIDR);
        assert_eq!(Ipv4Addr::from(first), Ipv4Addr::new(10, 96, 0, 1));
        assert_eq!(count, (1 << 20) - 2);
        assert_eq!(dynamic_offset(count), 256);
        let small = parse_service_cidr("10.100.7.9/24").unwrap();
        assert_eq!(small, (Ipv4Addr::new(10, 100, 7, 0), 24));
        assert_eq!(first_service_ip(small), Ipv4Addr::new(10, 100, 7, 1));
        assert_eq!(dynamic_offset(hosts(small).1), 16);
        for bad in ["10.0.0.0/31", "10.0.0.0", "fd00::/108", "10.0.0.0/x"] {
            assert_eq!(parse_service_cidr(bad), None, "{bad}");
        }
    }
}
