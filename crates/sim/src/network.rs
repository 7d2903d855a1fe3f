//! The simulated pod network as the kubelet sees it ([`PodNetwork`]): a pod's own
//! servers are the simulated ones its spec declares (the image catalogue's), other
//! addresses are reached through the cluster's in-process [`Dataplane`], and a request
//! is answered by the simulated server in memory. No packet exists.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};

use kumo_cri::{DialError, NodeRuntime, PodNetwork, Runtime, RuntimeFactory};
use serde_json::Value;

use crate::net::{ConnectError, Dataplane};
use crate::servers::{self, Listener};

/// The host-local IPAM of a node's pod range.
#[derive(Default)]
struct Ipam {
    /// The range (`10.244.0.0/24` until told).
    cidr: Option<(Ipv4Addr, u8)>,
    /// Where the next search starts (addresses are given in turn).
    next: u32,
    /// The address of each pod's sandbox.
    assigned: HashMap<String, Ipv4Addr>,
}

impl Ipam {
    /// The next free address of the range, as the CNI's host-local IPAM gives them: from
    /// .2 (.1 is the bridge) to the last before the broadcast address, in turn, skipping
    /// those in use. A full range: upstream's IPAM fails the sandbox; the sim says so in
    /// its log and shares the first address.
    fn allocate(&mut self, uid: &str) -> Result<Ipv4Addr, String> {
        if let Some(ip) = self.assigned.get(uid) {
            return Ok(*ip);
        }
        let (base, len) = self.cidr.unwrap_or((Ipv4Addr::new(10, 244, 0, 0), 24));
        let size = 1u32 << (32 - u32::from(len.min(30)));
        let usable = size - 3;
        for _ in 0..usable {
            let ip = Ipv4Addr::from(u32::from(base) + 2 + self.next % usable);
            self.next = self.next.wrapping_add(1);
            if !self.assigned.values().any(|a| *a == ip) {
                self.assigned.insert(uid.to_owned(), ip);
                return Ok(ip);
            }
        }
        tracing::warn!(
            uid,
            "failed to allocate for range 0: no IP addresses available in range set: {base}/{len}; the simulated pod shares the first address"
        );
        let first = Ipv4Addr::from(u32::from(base) + 2);
        self.assigned.insert(uid.to_owned(), first);
        Ok(first)
    }
}

/// One node's view of the simulated pod network.
pub struct SimNetwork {
    /// Its pod range's addresses.
    ipam: Mutex<Ipam>,
    /// The cluster's network (`None`: only the node's own pods are reachable).
    dataplane: Option<Arc<Dataplane>>,
    /// The node's runtime, whose files a file server serves.
    runtime: Weak<dyn Runtime>,
}

impl SimNetwork {
    /// The network of a node whose containers run on `runtime`.
    pub fn new(dataplane: Option<Arc<Dataplane>>, runtime: Weak<dyn Runtime>) -> SimNetwork {
        SimNetwork {
            ipam: Mutex::default(),
            dataplane,
            runtime,
        }
    }

    /// The status code `l` answers `GET path` with; with `effects` the server handles the
    /// request as any (netexec logs it, `/dial` dials).
    fn status(&self, l: Listener, path: &str, effects: bool) -> u16 {
        if effects {
            let raw = servers::answer(self.dataplane.as_deref(), &l, "GET", path, false);
            return String::from_utf8_lossy(&raw)
                .split(' ')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(500);
        }
        let l = match l {
            Listener::FileServer { pod, container, .. } => {
                let found = self
                    .runtime
                    .upgrade()
                    .and_then(|r| r.file_exists(&container, path.split('?').next().unwrap_or("")));
                Listener::FileServer {
                    pod,
                    container,
                    found,
                }
            }
            l => l,
        };
        servers::status(&l, "GET", path, "HTTP/1.1").0
    }

    fn route(&self, addr: SocketAddr) -> Result<Listener, DialError> {
        match &self.dataplane {
            Some(d) => match d.connect(addr) {
                Ok((_, l)) => Ok(l),
                Err(ConnectError::Refused) => Err(DialError::Refused),
                Err(ConnectError::Unreachable) => Err(DialError::Unreachable),
            },
            None => Err(DialError::Unreachable),
        }
    }
}

impl PodNetwork for SimNetwork {
    fn set_pod_cidr(&self, cidr: &str) {
        let parsed = cidr
            .split_once('/')
            .and_then(|(ip, len)| Some((ip.parse().ok()?, len.parse().ok()?)));
        if let Some(c) = parsed {
            self.ipam.lock().unwrap_or_else(|e| e.into_inner()).cidr = Some(c);
        }
    }

    fn set_up(&self, uid: &str) -> Result<IpAddr, String> {
        self.ipam
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allocate(uid)
            .map(IpAddr::V4)
    }

    fn tear_down(&self, uid: &str) {
        self.ipam
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .assigned
            .remove(uid);
    }

    fn serves(&self, pod: &Value, port: u16) -> bool {
        servers::declared_listener(pod, port).is_some()
    }

    fn get_pod(&self, pod: &Value, port: u16, path: &str, effects: bool) -> Result<u16, DialError> {
        let l = servers::declared_listener(pod, port).ok_or(DialError::Refused)?;
        Ok(self.status(l, path, effects))
    }

    fn connect(&self, addr: SocketAddr) -> Result<(), DialError> {
        self.route(addr).map(|_| ())
    }

    fn get(&self, addr: SocketAddr, path: &str, effects: bool) -> Result<u16, DialError> {
        let l = self.route(addr)?;
        Ok(self.status(l, path, effects))
    }

    fn forward(&self, pod: &Value, port: u16) -> Option<tokio::io::DuplexStream> {
        let l = servers::listener(pod, port)?;
        let (ours, theirs) = tokio::io::duplex(64 << 10);
        tokio::spawn(servers::serve_stream(theirs, l, self.dataplane.clone()));
        Some(ours)
    }

    fn follow(&self, client: kube::Client, node: &str) -> Option<tokio::task::JoinHandle<()>> {
        let dp = self.dataplane.clone()?;
        Some(tokio::spawn(crate::net::sync_pods(
            client,
            node.to_owned(),
            dp,
        )))
    }
}

/// The simulated node: a `sim` runtime whose containers reach the cluster network
/// through `dataplane` (if any), and that network.
pub fn factory(dataplane: Option<Arc<Dataplane>>) -> RuntimeFactory {
    RuntimeFactory(Arc::new(move || {
        let runtime: Arc<dyn Runtime> =
            Arc::new(crate::runtime::Sim::with_dataplane(dataplane.clone()));
        if let Some(dp) = &dataplane {
            dp.add_runtime(Arc::downgrade(&runtime));
        }
        let network: Arc<dyn PodNetwork> =
            Arc::new(SimNetwork::new(dataplane.clone(), Arc::downgrade(&runtime)));
        NodeRuntime { runtime, network }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_local_ipam_gives_addresses_in_turn_and_takes_them_back() {
        let net = factory(None).make().network;
        net.set_pod_cidr("10.244.3.0/30");
        // A /30 has one usable pod address after the bridge's (.1) and before broadcast.
        assert_eq!(net.set_up("a"), Ok(IpAddr::from([10, 244, 3, 2])));
        // The same sandbox keeps its address.
        assert_eq!(net.set_up("a"), Ok(IpAddr::from([10, 244, 3, 2])));
        net.tear_down("a");
        assert_eq!(net.set_up("b"), Ok(IpAddr::from([10, 244, 3, 2])));
        net.set_pod_cidr("10.244.1.0/24");
        let c = net.set_up("c").unwrap();
        let d = net.set_up("d").unwrap();
        assert_ne!(c, d);
        assert!(c.to_string().starts_with("10.244.1."), "{c}");
    }
}
