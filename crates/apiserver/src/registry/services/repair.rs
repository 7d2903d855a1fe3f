//! The repair loops of kube-apiserver's `start-service-ip-repair-controllers` post-start
//! hook: what Services hold and what the allocators recorded are brought back together
//! after a crash between the two writes, a restore, or a hand edit.
//!
//! * Cluster IPs (upstream's RepairIPAddress): a Service's IP without its IPAddress object
//!   gets one (`ClusterIPNotAllocated`); one whose IPAddress names another existing
//!   Service holding the same IP is reported (`ClusterIPAlreadyAllocated`); an IP outside
//!   every ServiceCIDR is reported (`ClusterIPOutOfRange`). An IPAddress of the allocator
//!   whose Service is gone for more than a minute is deleted (`IPAddressNotAllocated`),
//!   one whose Service does not hold its IP is deleted (`IPAddressWrongReference`).
//! * Node ports (upstream's portallocator Repair): the bitmap is rebuilt from the
//!   Services; a Service's port missing from it is set (`PortNotAllocated`), one two
//!   Services hold is reported (`PortAlreadyAllocated`), one outside the range is
//!   reported (`PortOutOfRange`); a port set with no Service holding it is cleared after
//!   it was seen so on three passes in a row.
//!
//! Upstream follows Services and IPAddresses with informers and repairs node ports every
//! three minutes; kumo makes one pass over the store at start and then every minute. The
//! events are events.k8s.io/v1, from `ipallocator-repair-controller` and
//! `portallocator-repair-controller` as upstream's recorders name themselves.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use kumo_storage::{RangeRequest, Store};
use serde_json::{json, Value};

use super::alloc::{self, Bitmap, IP_PREFIX, MANAGED_BY, NODE_PORTS};
use crate::registry::{name_of, str_at, Resource};
use crate::rest::Rest;

/// The post-start hook, as /livez and /readyz name it.
pub const HOOK: &str = "poststarthook/start-service-ip-repair-controllers";
/// How often the loops run.
const INTERVAL: Duration = Duration::from_secs(60);
/// How long an IPAddress may name a missing Service (a create in flight) before it is a
/// leak.
const IP_LEAK_GRACE: Duration = Duration::from_secs(60);
/// Passes a node port must be seen leaked before it is released.
const PORT_REPAIRS_BEFORE_CLEANUP: u32 = 3;
const IP_CONTROLLER: &str = "ipallocator-repair-controller";
const PORT_CONTROLLER: &str = "portallocator-repair-controller";

/// Starts the loops over the Services of `services`; `events` is the events.k8s.io/v1
/// resource they report through.
pub fn start(rest: Arc<Rest>, services: &Resource, events: Option<Arc<Resource>>) {
    let mut repair = Repair {
        rest,
        service_prefix: services.key_prefix(None),
        events,
        port_leaks: HashMap::new(),
    };
    tokio::spawn(async move {
        loop {
            repair.pass().await;
            tokio::time::sleep(INTERVAL).await;
        }
    });
}

/// An event to record: the object it regards, its reason, action and note.
struct Report {
    controller: &'static str,
    regarding: Value,
    reason: &'static str,
    action: &'static str,
    note: String,
}

pub(super) struct Repair {
    rest: Arc<Rest>,
    /// Where the Services are stored.
    service_prefix: String,
    events: Option<Arc<Resource>>,
    /// How many passes in a row each node port has been seen set with no Service.
    port_leaks: HashMap<u16, u32>,
}

impl Repair {
    /// One pass of both loops.
    pub(super) async fn pass(&mut self) {
        let rest = self.rest.clone();
        let store = &*rest.store;
        let services = match objects(store, &self.service_prefix).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "service repair: listing services failed");
                return;
            }
        };
        let mut reports = self.repair_ips(store, &services).await;
        reports.extend(self.repair_ports(store, &services).await);
        for r in reports {
            self.record(r).await;
        }
    }

    async fn repair_ips(&self, store: &dyn Store, services: &[Value]) -> Vec<Report> {
        let mut out = Vec::new();
        let Ok(ips) = objects(store, IP_PREFIX).await else {
            return out;
        };
        let by_ip: BTreeMap<&str, &Value> = ips
            .iter()
            .map(|ip| (str_at(ip, "/metadata/name"), ip))
            .collect();
        let holders = |ip: &str| -> Vec<&Value> {
            services
                .iter()
                .filter(|s| cluster_ips(s).iter().any(|c| c == ip))
                .collect()
        };
        let ranges = alloc::service_ranges(store).await.unwrap_or_default();
        for svc in services {
            for ip in cluster_ips(svc) {
                let Ok(addr) = ip.parse::<Ipv4Addr>() else {
                    // IPv6 is not served; anything else is not an IP.
                    if ip.parse::<std::net::Ipv6Addr>().is_err() {
                        out.push(Report {
                            controller: IP_CONTROLLER,
                            regarding: regarding(svc),
                            reason: "ClusterIPNotValid",
                            action: "ClusterIPValidation",
                            note: format!(
                                "Cluster IP {ip} is not a valid IP; please recreate Service"
                            ),
                        });
                    }
                    continue;
                };
                let n = u32::from(addr);
                if !ranges
                    .iter()
                    .any(|(first, size)| n >= *first && n - first < *size)
                {
                    out.push(Report {
                        controller: IP_CONTROLLER,
                        regarding: regarding(svc),
                        reason: "ClusterIPOutOfRange",
                        action: "ClusterIPAllocation",
                        note: format!("Cluster IP [IPv4]: {ip} is not within any configured Service CIDR; please recreate service"),
                    });
                    continue;
                }
                match by_ip.get(ip.as_str()) {
                    None => {
                        out.push(Report {
                            controller: IP_CONTROLLER,
                            regarding: regarding(svc),
                            reason: "ClusterIPNotAllocated",
                            action: "ClusterIPAllocation",
                            note: format!("Cluster IP [IPv4]: {ip} is not allocated; repairing"),
                        });
                        if let Err(e) = alloc::create_ip(store, svc, &ip).await {
                            tracing::warn!(ip, error = %e, "service repair: creating the IPAddress failed");
                        }
                    }
                    Some(obj) if !is_parent(obj, svc) => {
                        let other = holders(&ip)
                            .into_iter()
                            .find(|s| is_parent(obj, s) && !same(s, svc));
                        if other.is_some() {
                            out.push(Report {
                                controller: IP_CONTROLLER,
                                regarding: regarding(svc),
                                reason: "ClusterIPAlreadyAllocated",
                                action: "ClusterIPAllocation",
                                note: format!("Cluster IP [IPv4]:{ip} was assigned to multiple services; please recreate service"),
                            });
                        } else {
                            // Its parent does not hold it: the IP is this Service's.
                            out.push(Report {
                                controller: IP_CONTROLLER,
                                regarding: regarding(svc),
                                reason: "ClusterIPNotAllocated",
                                action: "ClusterIPAllocation",
                                note: format!(
                                    "the ClusterIP [IPv4]: {ip} for Service {}/{} has a wrong reference; repairing",
                                    str_at(svc, "/metadata/namespace"),
                                    name_of(svc)
                                ),
                            });
                            if alloc::delete_ip(store, &ip).await {
                                if let Err(e) = alloc::create_ip(store, svc, &ip).await {
                                    tracing::warn!(ip, error = %e, "service repair: recreating the IPAddress failed");
                                }
                            }
                        }
                    }
                    Some(_) => {}
                }
            }
        }
        // IPAddresses of the allocator nobody holds.
        let now = crate::time::now_secs();
        for obj in &ips {
            if str_at(
                obj,
                &format!("/metadata/labels/{}", MANAGED_BY.replace('/', "~1")),
            ) != "ipallocator.k8s.io"
            {
                continue;
            }
            let ip = str_at(obj, "/metadata/name");
            let (ns, name) = (
                str_at(obj, "/spec/parentRef/namespace"),
                str_at(obj, "/spec/parentRef/name"),
            );
            let parent = services
                .iter()
                .find(|s| str_at(s, "/metadata/namespace") == ns && name_of(s) == name);
            let report = match parent {
                None => {
                    let created =
                        crate::time::parse_rfc3339(str_at(obj, "/metadata/creationTimestamp"));
                    let age = created.map_or(i64::MAX, |c| now - c);
                    if age < IP_LEAK_GRACE.as_secs() as i64 {
                        continue;
                    }
                    Report {
                        controller: IP_CONTROLLER,
                        regarding: regarding(obj),
                        reason: "IPAddressNotAllocated",
                        action: "IPAddressAllocation",
                        note: format!("IPAddress: {ip} for Service {ns}/{name} appears to have leaked: cleaning up"),
                    }
                }
                Some(svc) if !cluster_ips(svc).iter().any(|c| c == ip) => Report {
                    controller: IP_CONTROLLER,
                    regarding: regarding(obj),
                    reason: "IPAddressWrongReference",
                    action: "IPAddressAllocation",
                    note: format!("IPAddress: {ip} for Service {ns}/{name} has a wrong reference; cleaning up"),
                },
                Some(_) => continue,
            };
            if alloc::delete_ip(store, ip).await {
                out.push(report);
            }
        }
        out
    }

    async fn repair_ports(&mut self, store: &dyn Store, services: &[Value]) -> Vec<Report> {
        let mut out = Vec::new();
        let mut held: BTreeMap<u16, &Value> = BTreeMap::new();
        let mut missing: Vec<(u16, &Value)> = Vec::new();
        let Ok((current, _)) = alloc::read_bitmap(store).await else {
            return out;
        };
        for svc in services {
            for port in alloc::node_ports_of(svc) {
                if !Bitmap::in_range(port) {
                    out.push(Report {
                        controller: PORT_CONTROLLER,
                        regarding: regarding(svc),
                        reason: "PortOutOfRange",
                        action: "PortAllocation",
                        note: format!(
                            "Port {port} is not within the port range {}-{}; please recreate service",
                            NODE_PORTS.0, NODE_PORTS.1
                        ),
                    });
                    continue;
                }
                if let Some(first) = held.get(&port) {
                    if !same(first, svc) {
                        out.push(Report {
                            controller: PORT_CONTROLLER,
                            regarding: regarding(svc),
                            reason: "PortAlreadyAllocated",
                            action: "PortAllocation",
                            note: format!("Port {port} was assigned to multiple services; please recreate service"),
                        });
                    }
                    continue;
                }
                held.insert(port, svc);
                if !current.get(port) {
                    missing.push((port, svc));
                }
            }
        }
        // Ports set that no Service holds: released once seen on enough passes.
        let leaked: BTreeSet<u16> = (NODE_PORTS.0..=NODE_PORTS.1)
            .filter(|p| current.get(*p) && !held.contains_key(p))
            .collect();
        self.port_leaks.retain(|p, _| leaked.contains(p));
        let mut release = Vec::new();
        for p in &leaked {
            let seen = self.port_leaks.entry(*p).or_insert(0);
            *seen += 1;
            if *seen >= PORT_REPAIRS_BEFORE_CLEANUP {
                release.push(*p);
            }
        }
        if missing.is_empty() && release.is_empty() {
            return out;
        }
        let result = alloc::update_bitmap(store, |bits| {
            for (p, _) in &missing {
                bits.set(*p, true);
            }
            for p in &release {
                // Taken again meanwhile by a Service (it would be in `held` next pass).
                bits.set(*p, false);
            }
            Ok(())
        })
        .await;
        match result {
            Ok(()) => {
                for p in &release {
                    self.port_leaks.remove(p);
                    tracing::info!(port = p, "service repair: released a leaked node port");
                }
                out.extend(missing.into_iter().map(|(port, svc)| Report {
                    controller: PORT_CONTROLLER,
                    regarding: regarding(svc),
                    reason: "PortNotAllocated",
                    action: "PortAllocation",
                    note: format!("Port {port} is not allocated; repairing"),
                }));
            }
            Err(e) => {
                tracing::warn!(error = %e.message, "service repair: writing the node port bitmap failed")
            }
        }
        out
    }

    /// Records `r` as a Warning event (best effort: a failure is logged).
    async fn record(&self, r: Report) {
        tracing::warn!(reason = r.reason, note = %r.note, "service repair");
        let Some(events) = &self.events else {
            return;
        };
        let ns = match r.regarding["namespace"].as_str() {
            Some(ns) if !ns.is_empty() => ns.to_owned(),
            _ => "default".to_owned(),
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let host = crate::identity::hostname();
        let event = json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": format!("{}.{:x}", r.regarding["name"].as_str().unwrap_or(""), now.as_nanos()),
                "namespace": ns,
            },
            "eventTime": crate::time::now_micro(),
            "reportingController": r.controller,
            "reportingInstance": format!("{}-{host}", r.controller),
            "action": r.action,
            "reason": r.reason,
            "regarding": r.regarding,
            "note": r.note,
            "type": "Warning",
        });
        let query = BTreeMap::new();
        let body = event.to_string();
        let req = crate::rest::Request::json(&query, body.as_bytes());
        if let Err(e) = self.rest.create(events, Some(&ns), &req).await {
            tracing::warn!(error = %e.message, "service repair: recording an event failed");
        }
    }
}

/// The objects stored under `prefix`.
async fn objects(
    store: &dyn Store,
    prefix: &str,
) -> Result<Vec<Value>, kumo_storage::StorageError> {
    let page = store
        .range(RangeRequest {
            prefix: prefix.as_bytes().to_vec(),
            ..Default::default()
        })
        .await?;
    Ok(page
        .kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
        .collect())
}

/// The cluster IPs a Service holds (none for headless and ExternalName Services).
fn cluster_ips(svc: &Value) -> Vec<String> {
    let mut ips: Vec<String> = svc
        .pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    if ips.is_empty() {
        ips.extend(
            svc.pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .map(str::to_owned),
        );
    }
    ips.retain(|ip| !ip.is_empty() && ip != "None");
    ips
}

/// Whether IPAddress `ip` names Service `svc` as its parent.
fn is_parent(ip: &Value, svc: &Value) -> bool {
    str_at(ip, "/spec/parentRef/group").is_empty()
        && str_at(ip, "/spec/parentRef/resource") == "services"
        && str_at(ip, "/spec/parentRef/namespace") == str_at(svc, "/metadata/namespace")
        && str_at(ip, "/spec/parentRef/name") == name_of(svc)
}

fn same(a: &Value, b: &Value) -> bool {
    str_at(a, "/metadata/uid") == str_at(b, "/metadata/uid")
}

/// The `regarding` reference of an event about `obj`.
fn regarding(obj: &Value) -> Value {
    let mut r = json!({
        "kind": obj["kind"],
        "apiVersion": obj["apiVersion"],
        "name": name_of(obj),
        "uid": str_at(obj, "/metadata/uid"),
    });
    let ns = str_at(obj, "/metadata/namespace");
    if !ns.is_empty() {
        r["namespace"] = json!(ns);
    }
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use kumo_storage::embedded::{EmbeddedConfig, EmbeddedStore};

    async fn create(rest: &Rest, res: &Resource, ns: Option<&str>, body: Value) -> Value {
        let query = BTreeMap::new();
        let body = body.to_string();
        match rest
            .create(
                res,
                ns,
                &crate::rest::Request::json(&query, body.as_bytes()),
            )
            .await
            .unwrap()
        {
            crate::rest::Reply::Json(_, v) => v,
            crate::rest::Reply::Raw(_, b) => serde_json::from_slice(&b).unwrap(),
            crate::rest::Reply::Stream(_) => unreachable!(),
        }
    }

    #[tokio::test]
    async fn repairs_cluster_ips_and_node_ports_and_reports_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(EmbeddedConfig::new(dir.path().join("store")))
            .await
            .unwrap();
        let rest = Arc::new(Rest::new(store as Arc<dyn Store>));
        let registry = Registry::builtin();
        let namespaces = registry.find("", "v1", "namespaces").unwrap();
        create(
            &rest,
            &namespaces,
            None,
            json!({"metadata": {"name": "default"}}),
        )
        .await;
        let services = registry.find("", "v1", "services").unwrap();
        let svc = create(
            &rest,
            &services,
            Some("default"),
            json!({"metadata": {"name": "web"}, "spec": {"type": "NodePort",
                   "ports": [{"port": 80}]}}),
        )
        .await;
        let ip = str_at(&svc, "/spec/clusterIP").to_owned();
        let port = svc
            .pointer("/spec/ports/0/nodePort")
            .and_then(Value::as_u64)
            .unwrap() as u16;
        let store = &*rest.store;

        // Lost: the Service's IPAddress and its node port's bit. Leaked: an IPAddress of a
        // Service long gone and a node port nobody holds.
        assert!(alloc::delete_ip(store, &ip).await);
        let ghost = json!({"metadata": {"namespace": "default", "name": "ghost", "uid": "g"}});
        alloc::create_ip(store, &ghost, "10.96.0.77").await.unwrap();
        let key = format!("{IP_PREFIX}10.96.0.77");
        let (kv, _) = store.get(key.as_bytes(), None).await.unwrap();
        let mut old: Value = serde_json::from_slice(&kv.unwrap().value).unwrap();
        old["metadata"]["creationTimestamp"] = json!("2020-01-01T00:00:00Z");
        store
            .update(key.as_bytes(), old.to_string().into_bytes(), None)
            .await
            .unwrap();
        let leaked = if port == NODE_PORTS.0 {
            port + 1
        } else {
            NODE_PORTS.0
        };
        alloc::update_bitmap(store, |b| {
            b.set(port, false);
            b.set(leaked, true);
            Ok(())
        })
        .await
        .unwrap();

        let mut repair = Repair {
            rest: rest.clone(),
            service_prefix: services.key_prefix(None),
            events: registry.find("events.k8s.io", "v1", "events"),
            port_leaks: HashMap::new(),
        };
        repair.pass().await;
        let ips = objects(store, IP_PREFIX).await.unwrap();
        let names: Vec<&str> = ips.iter().map(|i| str_at(i, "/metadata/name")).collect();
        assert_eq!(names, [ip.as_str()], "recreated, and the leak removed");
        assert!(is_parent(&ips[0], &svc));
        let (bits, _) = alloc::read_bitmap(store).await.unwrap();
        assert!(bits.get(port), "the Service's port is set again");
        assert!(
            bits.get(leaked),
            "a leaked port stays until seen three times"
        );
        repair.pass().await;
        repair.pass().await;
        let (bits, _) = alloc::read_bitmap(store).await.unwrap();
        assert!(bits.get(port) && !bits.get(leaked));

        // Stored as core/v1 Events, as upstream stores events.k8s.io ones.
        let events = objects(store, "/registry/events/default/").await.unwrap();
        let mut seen: Vec<(&str, &str, &str)> = events
            .iter()
            .map(|e| {
                (
                    str_at(e, "/reason"),
                    str_at(e, "/reportingComponent"),
                    str_at(e, "/involvedObject/kind"),
                )
            })
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            [
                ("ClusterIPNotAllocated", IP_CONTROLLER, "Service"),
                ("IPAddressNotAllocated", IP_CONTROLLER, "IPAddress"),
                ("PortNotAllocated", PORT_CONTROLLER, "Service"),
            ]
        );
        let note = events
            .iter()
            .find(|e| str_at(e, "/reason") == "ClusterIPNotAllocated")
            .map(|e| str_at(e, "/message"))
            .unwrap();
        assert_eq!(
            note,
            format!("Cluster IP [IPv4]: {ip} is not allocated; repairing")
        );
    }
}
