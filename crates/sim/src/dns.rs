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
//! Names outside the zone have no upstream in the simulation: NXDOMAIN. The zone logic
//! is kumo-dns's, which the real runtime's DNS pods serve.

use std::net::IpAddr;

pub use kumo_dns::{answer, reverse_name, Answer, QType, RData, Rcode, Rr, TTL};

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
