//! The cluster DNS: what CoreDNS's `kubernetes` plugin answers for the zone
//! `cluster.local` as kubeadm configures it (`pods insecure`, `ttl 30`), kept from the
//! Services and EndpointSlices kumo-proxy computes records for
//! ([`kumo_proxy::dataplane::Rr`]), and served over UDP and TCP port 53 with hickory's
//! wire format.
//!
//! Names follow the Kubernetes DNS specification:
//! * `<svc>.<ns>.svc.<zone>`: A to the ClusterIP, for a headless Service to each ready
//!   endpoint, for an ExternalName Service a CNAME to the external name;
//! * `<hostname>.<svc>.<ns>.svc.<zone>`: A for a headless Service's endpoint with a
//!   hostname (else the address with dashes stands in for it);
//! * `_<port>._<proto>.<svc>.<ns>.svc.<zone>`: SRV for each named port;
//! * the reverse names (`in-addr.arpa`) of ClusterIPs and headless endpoints: PTR;
//! * `<a-b-c-d>.<ns>.pod.<zone>`: A to the address (`pods insecure` answers any).
//!
//! The simulator answers from the same zone logic ([`answer`]); the server ([`server`])
//! is what runs as the `coredns` pods on the real runtime.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

pub use kumo_proxy::dataplane::{reverse_name, QType, RData, Rr, CLUSTER_DOMAIN, TTL};

pub mod server;

/// A response code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rcode {
    NoError,
    NxDomain,
}

impl Rcode {
    pub fn name(self) -> &'static str {
        match self {
            Rcode::NoError => "NOERROR",
            Rcode::NxDomain => "NXDOMAIN",
        }
    }
}

/// What a server answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub rcode: Rcode,
    pub records: Vec<Rr>,
}

/// Answers `name`/`qtype` from `records` (the zone's records, any order): the records of
/// that type at the name, following CNAMEs inside the zone; NOERROR without records when
/// the name exists with other types or has names below it; NXDOMAIN otherwise.
pub fn answer<'a>(
    records: impl Fn(&str) -> Vec<&'a Rr>,
    exists_below: impl Fn(&str) -> bool,
    name: &str,
    qtype: QType,
) -> Answer {
    let mut name = name.trim_end_matches('.').to_ascii_lowercase();
    let mut out = Vec::new();
    if let Some(rr) = pod_record(&name, qtype) {
        return Answer {
            rcode: Rcode::NoError,
            records: vec![rr],
        };
    }
    for _ in 0..8 {
        let here = records(&name);
        if here.is_empty() {
            let rcode = if out.is_empty() && !exists_below(&name) {
                Rcode::NxDomain
            } else {
                Rcode::NoError
            };
            return Answer {
                rcode,
                records: out,
            };
        }
        let matching: Vec<Rr> = here
            .iter()
            .filter(|r| qtype == QType::Any || r.data.kind() == qtype)
            .map(|r| (*r).clone())
            .collect();
        if !matching.is_empty() {
            out.extend(matching);
            break;
        }
        // A CNAME answers any type; its target is looked up in turn.
        match here.iter().find_map(|r| match &r.data {
            RData::Cname(t) => Some((r, t.clone())),
            _ => None,
        }) {
            Some((r, target)) => {
                out.push((*r).clone());
                name = target.trim_end_matches('.').to_ascii_lowercase();
            }
            None => break,
        }
    }
    Answer {
        rcode: Rcode::NoError,
        records: out,
    }
}

/// `<a-b-c-d>.<ns>.pod.cluster.local` (`pods insecure`: any namespace, no check).
fn pod_record(name: &str, qtype: QType) -> Option<Rr> {
    let rest = name.strip_suffix(&format!(".pod.{CLUSTER_DOMAIN}"))?;
    let (dashed, ns) = rest.split_once('.')?;
    if ns.is_empty() || ns.contains('.') {
        return None;
    }
    let ip: std::net::Ipv4Addr = dashed.replace('-', ".").parse().ok()?;
    matches!(qtype, QType::A | QType::Any).then(|| Rr::new(name, RData::A(IpAddr::V4(ip))))
}

/// The zone: each Service's records, indexed by name. It is the data plane the DNS
/// server's own kumo-proxy programs (rules ignored: a DNS server forwards no packets).
#[derive(Debug, Default)]
pub struct Zone {
    inner: RwLock<ZoneInner>,
}

#[derive(Debug, Default)]
struct ZoneInner {
    by_service: HashMap<String, Vec<Rr>>,
    by_name: HashMap<String, Vec<Rr>>,
}

impl ZoneInner {
    fn unindex(&mut self, key: &str) {
        if let Some(old) = self.by_service.remove(key) {
            for r in old {
                if let Some(v) = self.by_name.get_mut(&r.name) {
                    if let Some(i) = v.iter().position(|x| *x == r) {
                        v.swap_remove(i);
                    }
                    if v.is_empty() {
                        self.by_name.remove(&r.name);
                    }
                }
            }
        }
    }
}

impl Zone {
    pub fn new() -> Zone {
        Zone::default()
    }

    /// What the zone answers for `name`/`qtype`.
    pub fn answer(&self, name: &str, qtype: QType) -> Answer {
        let z = self.inner.read().unwrap_or_else(|e| e.into_inner());
        answer(
            |n| {
                z.by_name
                    .get(n)
                    .map(|v| v.iter().collect())
                    .unwrap_or_default()
            },
            |n| {
                let below = format!(".{n}");
                z.by_name.keys().any(|k| k.ends_with(&below))
            },
            name,
            qtype,
        )
    }

    /// How many names the zone holds.
    pub fn len(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_name
            .len()
    }

    /// Whether the zone holds no name.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl kumo_proxy::dataplane::Dataplane for Zone {
    fn set_service(&self, key: &str, entry: kumo_proxy::dataplane::ServiceEntry) {
        let mut z = self.inner.write().unwrap_or_else(|e| e.into_inner());
        z.unindex(key);
        for r in &entry.records {
            z.by_name.entry(r.name.clone()).or_default().push(r.clone());
        }
        z.by_service.insert(key.to_owned(), entry.records);
    }

    fn remove_service(&self, key: &str) {
        self.inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .unindex(key);
    }

    fn retain_services(&self, keep: &dyn Fn(&str) -> bool) {
        let mut z = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<String> = z.by_service.keys().filter(|k| !keep(k)).cloned().collect();
        for k in gone {
            z.unindex(&k);
        }
    }

    fn set_node(&self, _name: &str, _ips: Vec<IpAddr>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use kumo_proxy::dataplane::{Dataplane, ServiceEntry};

    fn kubernetes_records() -> Vec<Rr> {
        let fqdn = "kubernetes.default.svc.cluster.local";
        vec![
            Rr::new(fqdn, RData::A(IpAddr::from([10, 96, 0, 1]))),
            Rr::new(
                &format!("_https._tcp.{fqdn}"),
                RData::Srv {
                    priority: 0,
                    weight: 100,
                    port: 443,
                    target: fqdn.into(),
                },
            ),
        ]
    }

    #[test]
    fn answers_by_type_with_cnames_nodata_and_nxdomain() {
        let z = Zone::new();
        z.set_service(
            "default/kubernetes",
            ServiceEntry {
                records: kubernetes_records(),
                ..Default::default()
            },
        );
        z.set_service(
            "default/ext",
            ServiceEntry {
                records: vec![Rr::new(
                    "ext.default.svc.cluster.local",
                    RData::Cname("kubernetes.default.svc.cluster.local".into()),
                )],
                ..Default::default()
            },
        );
        let a = z.answer("Kubernetes.Default.svc.cluster.local.", QType::A);
        assert_eq!(a.rcode, Rcode::NoError);
        assert_eq!(a.records.len(), 1);
        assert_eq!(a.records[0].data.text(), "10.96.0.1");
        // The CNAME, then its target's A.
        let a = z.answer("ext.default.svc.cluster.local", QType::A);
        assert_eq!(
            a.records.iter().map(|r| r.data.text()).collect::<Vec<_>>(),
            ["kubernetes.default.svc.cluster.local.", "10.96.0.1"]
        );
        // NODATA: the name exists, not with this type; so do names with names below.
        let a = z.answer("kubernetes.default.svc.cluster.local", QType::Txt);
        assert_eq!((a.rcode, a.records.len()), (Rcode::NoError, 0));
        let a = z.answer("default.svc.cluster.local", QType::A);
        assert_eq!((a.rcode, a.records.len()), (Rcode::NoError, 0));
        let a = z.answer("nothing.default.svc.cluster.local", QType::A);
        assert_eq!(a.rcode, Rcode::NxDomain);
        let srv = z.answer(
            "_https._tcp.kubernetes.default.svc.cluster.local",
            QType::Srv,
        );
        assert_eq!(
            srv.records[0].data.text(),
            "0 100 443 kubernetes.default.svc.cluster.local."
        );
        // Pods by dashed address, any namespace.
        let a = z.answer("10-244-1-5.web.pod.cluster.local", QType::A);
        assert_eq!(a.records[0].data.text(), "10.244.1.5");
        // A Service removed takes its names along.
        z.remove_service("default/kubernetes");
        let a = z.answer("kubernetes.default.svc.cluster.local", QType::A);
        assert_eq!(a.rcode, Rcode::NxDomain);
        z.retain_services(&|_| false);
        assert!(z.is_empty());
    }
}

/// Why the DNS server stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// Where the server listens: DNS (UDP and TCP), and CoreDNS's `health` (`/health`) and
/// `ready` (`/ready`) endpoints.
#[derive(Clone, Copy, Debug)]
pub struct Listen {
    pub dns: std::net::SocketAddr,
    pub health: Option<std::net::SocketAddr>,
    pub ready: Option<std::net::SocketAddr>,
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            dns: ([0, 0, 0, 0], 53).into(),
            health: Some(([0, 0, 0, 0], 8080).into()),
            ready: Some(([0, 0, 0, 0], 8181).into()),
        }
    }
}

/// Runs the cluster DNS with `client` (Services and EndpointSlices, as CoreDNS's
/// `system:coredns` role allows) until the process ends. `/ready` answers 200 once the
/// zone holds the first lists.
pub async fn run(client: kube::Client, listen: Listen) -> Result<(), Error> {
    let zone = Arc::new(Zone::new());
    let proxy = kumo_proxy::Proxy::start_with(client, zone.clone(), false);
    let (udp, tcp) = server::bind(listen.dns)
        .await
        .map_err(|source| Error::Listen {
            addr: listen.dns,
            source,
        })?;
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for (addr, path, gate) in [
        (listen.health, "/health", None),
        (listen.ready, "/ready", Some(ready.clone())),
    ] {
        if let Some(addr) = addr {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Listen { addr, source })?;
            tokio::spawn(http_ok(l, path, gate));
        }
    }
    tracing::info!(addr = %listen.dns, "cluster DNS serving {CLUSTER_DOMAIN}");
    let srv = Arc::new(server::Server::new(zone));
    let serving = tokio::spawn(srv.serve(udp, tcp));
    proxy.wait_synced().await;
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = serving.await;
    Ok(())
}

/// A plain-HTTP endpoint answering `OK` on `path` (503 until `gate` is set).
async fn http_ok(
    listener: tokio::net::TcpListener,
    path: &'static str,
    gate: Option<Arc<std::sync::atomic::AtomicBool>>,
) {
    kumo_proxy::health::serve(listener, move |asked| {
        let open = gate
            .as_ref()
            .is_none_or(|g| g.load(std::sync::atomic::Ordering::Relaxed));
        let (code, body) = if asked != path {
            (hyper::StatusCode::NOT_FOUND, "404 page not found\n")
        } else if open {
            (hyper::StatusCode::OK, "OK")
        } else {
            (hyper::StatusCode::SERVICE_UNAVAILABLE, "not ready")
        };
        (code, "text/plain; charset=utf-8", body.to_owned())
    })
    .await
}
