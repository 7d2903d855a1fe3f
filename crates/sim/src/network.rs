//! The simulated pod network as the kubelet sees it ([`PodNetwork`]): a pod's own
//! servers are the simulated ones its spec declares (the image catalogue's), other
//! addresses are reached through the cluster's in-process [`Dataplane`], and a request
//! is answered by the simulated server in memory. No packet exists.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use kumo_cri::{DialError, NodeRuntime, PodNetwork, Runtime, RuntimeFactory};
use serde_json::Value;

use crate::net::{ConnectError, Dataplane};
use crate::servers::{self, Listener};

/// One node's view of the simulated pod network.
pub struct SimNetwork {
    /// The cluster's network (`None`: only the node's own pods are reachable).
    dataplane: Option<Arc<Dataplane>>,
    /// The node's runtime, whose files a file server serves.
    runtime: Weak<dyn Runtime>,
}

impl SimNetwork {
    /// The network of a node whose containers run on `runtime`.
    pub fn new(dataplane: Option<Arc<Dataplane>>, runtime: Weak<dyn Runtime>) -> SimNetwork {
        SimNetwork { dataplane, runtime }
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
