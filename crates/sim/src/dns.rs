//! The cluster DNS: the records CoreDNS's `kubernetes` plugin serves for the zone
//! `cluster.local` as kubeadm configures it (`pods insecure`), and the pods' stub resolver
//! (`/etc/resolv.conf`: nameservers, search list, `ndots`).
//!
//! The records of each Service come from kumo-proxy (`kumo_proxy::dataplane::ServiceEntry`); the
//! zone is the union of them, kept in the [`crate::net::Dataplane`]. Names follow the
//! Kubernetes DNS specification:
//! * `<svc>.<ns>.svc.<zone>`: A to the ClusterIP, for a headless Service to each ready
//!   endpoint, for an ExternalName Service a CNAME to the external name;
//! * `<hostname>.<svc>.<ns>.svc.<zone>`: A for a headless Service's endpoint with a
//!   hostname (else the address with dashes stands in for it);
//! * `_<port>._<proto>.<svc>.<ns>.svc.<zone>`: SRV for each named port;
//! * the reverse names (`in-addr.arpa`) of ClusterIPs and headless endpoints: PTR;
//! * `<a-b-c-d>.<ns>.pod.<zone>`: A to the address (`pods insecure` answers any).
//!
//! Names outside the zone have no upstream in the simulation: NXDOMAIN.

use std::net::IpAddr;

pub use kumo_proxy::dataplane::{reverse_name, QType, RData, Rr, TTL};

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
    let rest = name.strip_suffix(&format!(".pod.{}", crate::net::CLUSTER_DOMAIN))?;
    let (dashed, ns) = rest.split_once('.')?;
    if ns.is_empty() || ns.contains('.') {
        return None;
    }
    let ip: std::net::Ipv4Addr = dashed.replace('-', ".").parse().ok()?;
    matches!(qtype, QType::A | QType::Any).then(|| Rr::new(name, RData::A(IpAddr::V4(ip))))
}

/// A pod's `/etc/resolv.conf`, as its resolver reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<IpAddr>,
    pub search: Vec<String>,
    pub ndots: usize,
}

impl ResolvConf {
    /// Parses the file (the resolver's defaults where it is silent: ndots 1).
    pub fn parse(text: &str) -> ResolvConf {
        let mut rc = ResolvConf {
            ndots: 1,
            ..ResolvConf::default()
        };
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    if let Some(ip) = words.next().and_then(|w| w.parse().ok()) {
                        rc.nameservers.push(ip);
                    }
                }
                // The last search (or domain) line wins.
                Some("search" | "domain") => rc.search = words.map(str::to_owned).collect(),
                Some("options") => {
                    for w in words {
                        if let Some(n) = w.strip_prefix("ndots:").and_then(|n| n.parse().ok()) {
                            rc.ndots = std::cmp::min(n, 15);
                        }
                    }
                }
                _ => {}
            }
        }
        rc
    }

    /// The names a lookup of `name` tries, in order: a name ending in a dot only as it
    /// is; one with fewer dots than `ndots` with each search domain first, then as is;
    /// otherwise as is first.
    pub fn candidates(&self, name: &str) -> Vec<String> {
        if name.ends_with('.') {
            return vec![name.trim_end_matches('.').to_owned()];
        }
        let searched = self.search.iter().map(|d| format!("{name}.{d}"));
        if name.matches('.').count() < self.ndots {
            searched.chain(std::iter::once(name.to_owned())).collect()
        } else {
            std::iter::once(name.to_owned()).chain(searched).collect()
        }
    }
}

/// The records of a pod's `/etc/hosts` for `name` (addresses, IPv4 first).
pub fn hosts_lookup(hosts: &str, name: &str) -> Vec<(IpAddr, Vec<String>)> {
    hosts
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let ip = w.next()?.parse::<IpAddr>().ok()?;
            let names: Vec<String> = w.map(str::to_owned).collect();
            names
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name.trim_end_matches('.')))
                .then_some((ip, names))
        })
        .collect()
}

/// The `kubernetes` Service's records at 10.96.0.1 (A, and SRV for its `https` port),
/// for tests.
#[cfg(test)]
pub(crate) fn kubernetes_records() -> Vec<Rr> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn zone(rrs: &[Rr]) -> HashMap<String, Vec<Rr>> {
        let mut m: HashMap<String, Vec<Rr>> = HashMap::new();
        for r in rrs {
            m.entry(r.name.clone()).or_default().push(r.clone());
        }
        m
    }

    fn ask(z: &HashMap<String, Vec<Rr>>, name: &str, q: QType) -> Answer {
        answer(
            |n| z.get(n).map(|v| v.iter().collect()).unwrap_or_default(),
            |n| z.keys().any(|k| k.ends_with(&format!(".{n}"))),
            name,
            q,
        )
    }

    #[test]
    fn answers_by_type_with_cnames_nodata_and_nxdomain() {
        let mut records = kubernetes_records();
        records.extend([Rr::new(
            "ext.default.svc.cluster.local",
            RData::Cname("kubernetes.default.svc.cluster.local".into()),
        )]);
        let z = zone(&records);
        let a = ask(&z, "Kubernetes.Default.svc.cluster.local.", QType::A);
        assert_eq!(a.rcode, Rcode::NoError);
        assert_eq!(a.records.len(), 1);
        assert_eq!(a.records[0].data.text(), "10.96.0.1");
        // The CNAME, then its target's A.
        let a = ask(&z, "ext.default.svc.cluster.local", QType::A);
        assert_eq!(
            a.records.iter().map(|r| r.data.text()).collect::<Vec<_>>(),
            ["kubernetes.default.svc.cluster.local.", "10.96.0.1"]
        );
        let c = ask(&z, "ext.default.svc.cluster.local", QType::Cname);
        assert_eq!(c.records.len(), 1);
        // Exists with another type, or has names below it: NOERROR, no records.
        let none = ask(&z, "kubernetes.default.svc.cluster.local", QType::Srv);
        assert_eq!((none.rcode, none.records.len()), (Rcode::NoError, 0));
        let ent = ask(&z, "default.svc.cluster.local", QType::A);
        assert_eq!((ent.rcode, ent.records.len()), (Rcode::NoError, 0));
        let nx = ask(&z, "nope.default.svc.cluster.local", QType::A);
        assert_eq!(nx.rcode, Rcode::NxDomain);
        let srv = ask(
            &z,
            "_https._tcp.kubernetes.default.svc.cluster.local",
            QType::Srv,
        );
        assert_eq!(
            srv.records[0].data.text(),
            "0 100 443 kubernetes.default.svc.cluster.local."
        );
        // Pod names answer with the address they spell.
        let pod = ask(&z, "10-244-0-5.any.pod.cluster.local", QType::A);
        assert_eq!(pod.records[0].data.text(), "10.244.0.5");
    }

    #[test]
    fn resolv_conf_search_order_follows_ndots() {
        let rc = ResolvConf::parse(
            "search ns.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
        );
        assert_eq!(rc.ndots, 5);
        assert_eq!(rc.nameservers, ["10.96.0.10".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            rc.candidates("web")[..2],
            ["web.ns.svc.cluster.local", "web.svc.cluster.local"]
        );
        assert_eq!(rc.candidates("web").last().unwrap(), "web");
        assert_eq!(rc.candidates("a.b.c.d.e.f")[0], "a.b.c.d.e.f");
        assert_eq!(rc.candidates("web."), ["web"]);
        assert_eq!(
            reverse_name("10.96.0.1".parse().unwrap()),
            "1.0.96.10.in-addr.arpa"
        );
    }
}
