//! What kube-proxy programs, and the interface it programs it through: per Service the
//! addresses it is reached on with the endpoints they lead to ([`Rule`]), its session
//! affinity, and its records in the cluster DNS ([`Rr`], CoreDNS's part); per node its
//! addresses (node ports). The simulator's in-process data plane implements
//! [`Dataplane`] today; the kernel's (nftables) implements it next.

use std::net::{IpAddr, SocketAddr};

/// The data plane the proxy programs.
pub trait Dataplane: Send + Sync {
    /// Sets the rules and records of the Service `key` (`namespace/name`).
    fn set_service(&self, key: &str, entry: ServiceEntry);
    /// Removes the Service `key`'s rules and records.
    fn remove_service(&self, key: &str);
    /// Keeps only the Services `keep` says yes to.
    fn retain_services(&self, keep: &dyn Fn(&str) -> bool);
    /// Sets node `name`'s addresses (where its node ports are; empty: the node is gone).
    fn set_node(&self, name: &str, ips: Vec<IpAddr>);
}

/// The cluster domain (the kubelet's `--cluster-domain` default).
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// A transport protocol of a Service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The Kubernetes name (`TCP`, the default, `UDP`, `SCTP`).
    pub fn parse(s: Option<&str>) -> Protocol {
        match s {
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            _ => Protocol::Tcp,
        }
    }
}

/// One address a Service is reached on, with where it sends connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub frontend: SocketAddr,
    pub protocol: Protocol,
    /// The ready endpoints; empty: the connection is rejected (kube-proxy's REJECT).
    pub endpoints: Vec<SocketAddr>,
}

/// What the proxy programs for one Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceEntry {
    pub rules: Vec<Rule>,
    /// Its records in the cluster DNS (see [`crate::dns`]).
    pub records: Vec<Rr>,
    /// `sessionAffinity: ClientIP`: how long a client stays with the endpoint it got.
    pub affinity: Option<std::time::Duration>,
}

/// The TTL CoreDNS's kubernetes plugin gives its records (kubeadm's Corefile: `ttl 30`).
pub const TTL: u32 = 30;

/// The data of a resource record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RData {
    A(IpAddr),
    Cname(String),
    Srv {
        priority: u16,
        weight: u16,
        port: u16,
        target: String,
    },
    Ptr(String),
}

impl RData {
    /// The record type's name.
    pub fn kind(&self) -> QType {
        match self {
            RData::A(IpAddr::V4(_)) => QType::A,
            RData::A(IpAddr::V6(_)) => QType::Aaaa,
            RData::Cname(_) => QType::Cname,
            RData::Srv { .. } => QType::Srv,
            RData::Ptr(_) => QType::Ptr,
        }
    }

    /// The data as zone files and `dig` write it (names fully qualified, with the dot).
    pub fn text(&self) -> String {
        match self {
            RData::A(ip) => ip.to_string(),
            RData::Cname(n) | RData::Ptr(n) => format!("{}.", n.trim_end_matches('.')),
            RData::Srv {
                priority,
                weight,
                port,
                target,
            } => format!(
                "{priority} {weight} {port} {}.",
                target.trim_end_matches('.')
            ),
        }
    }
}

/// A resource record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rr {
    /// The owner name: lower case, fully qualified, without the trailing dot.
    pub name: String,
    pub ttl: u32,
    pub data: RData,
}

impl Rr {
    /// A record with the plugin's TTL.
    pub fn new(name: &str, data: RData) -> Rr {
        Rr {
            name: name.trim_end_matches('.').to_ascii_lowercase(),
            ttl: TTL,
            data,
        }
    }
}

/// A query type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QType {
    A,
    Aaaa,
    Cname,
    Srv,
    Ptr,
    Txt,
    Mx,
    Ns,
    Soa,
    Any,
}

impl QType {
    /// Parses a type name (`A`, `srv`, ...).
    pub fn parse(s: &str) -> Option<QType> {
        Some(match s.to_ascii_uppercase().as_str() {
            "A" => QType::A,
            "AAAA" => QType::Aaaa,
            "CNAME" => QType::Cname,
            "SRV" => QType::Srv,
            "PTR" => QType::Ptr,
            "TXT" => QType::Txt,
            "MX" => QType::Mx,
            "NS" => QType::Ns,
            "SOA" => QType::Soa,
            "ANY" => QType::Any,
            _ => return None,
        })
    }

    /// The type's name.
    pub fn name(self) -> &'static str {
        match self {
            QType::A => "A",
            QType::Aaaa => "AAAA",
            QType::Cname => "CNAME",
            QType::Srv => "SRV",
            QType::Ptr => "PTR",
            QType::Txt => "TXT",
            QType::Mx => "MX",
            QType::Ns => "NS",
            QType::Soa => "SOA",
            QType::Any => "ANY",
        }
    }
}

/// The reverse name of `ip` (`4.3.2.1.in-addr.arpa`).
pub fn reverse_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let mut s = String::new();
            for b in v6.octets().iter().rev() {
                s.push_str(&format!("{:x}.{:x}.", b & 0xf, b >> 4));
            }
            s.push_str("ip6.arpa");
            s
        }
    }
}
