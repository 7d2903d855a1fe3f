//! The pod network as the kubelet reaches pods through it: its probes, its lifecycle
//! hooks and port-forward. The simulator's in-process network implements it today; the
//! node's network namespace with CNI implements it next.

use std::net::SocketAddr;

use serde_json::Value;

/// Why a connection from the node did not open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DialError {
    /// Nothing listens there (RST).
    Refused,
    /// No route: the connection would hang until its timeout.
    Unreachable,
}

/// The pod network, from the node.
pub trait PodNetwork: Send + Sync {
    /// The node's pod range (`spec.podCIDR`, else the kubelet's `--pod-cidr`), as the
    /// kubelet hands it to the runtime (the CRI's UpdateRuntimeConfig) for the CNI's IPAM.
    fn set_pod_cidr(&self, cidr: &str);
    /// Sets up the network of the sandbox of pod `uid` (CNI ADD): its address.
    fn set_up(&self, uid: &str) -> Result<std::net::IpAddr, String>;
    /// Tears the network of pod `uid`'s sandbox down (CNI DEL): its address is free again.
    fn tear_down(&self, uid: &str);
    /// Whether a server of `pod` listens on `port` at the pod's own address (for a
    /// host-network pod: a server of its containers, not whatever else the node runs).
    fn serves(&self, pod: &Value, port: u16) -> bool;
    /// `GET path` from the node to `port` of `pod` at the pod's own address: the
    /// response's status code. With `effects` the server acts on it as on any request
    /// (a lifecycle hook); without, only its answer is read (a probe).
    fn get_pod(&self, pod: &Value, port: u16, path: &str, effects: bool) -> Result<u16, DialError>;
    /// Whether a connection from the node to `addr` (another pod, a Service, a node port)
    /// opens.
    fn connect(&self, addr: SocketAddr) -> Result<(), DialError>;
    /// `GET path` from the node to `addr` through the network, as [`Self::get_pod`].
    fn get(&self, addr: SocketAddr, path: &str, effects: bool) -> Result<u16, DialError>;
    /// A byte stream to `port` of `pod` (what port-forward carries), when a server of the
    /// pod listens there.
    fn forward(&self, pod: &Value, port: u16) -> Option<tokio::io::DuplexStream>;
    /// Whether the pods' servers are real sockets: probes then speak to them as they are
    /// (TLS, headers, gRPC) over [`Self::open`]; a simulated network answers through
    /// [`Self::get_pod`] instead.
    fn real(&self) -> bool {
        false
    }
    /// A TCP connection from the node to `addr` (for a simulated network: this machine's
    /// own socket, which only a loopback address reaches).
    fn open(
        &self,
        addr: SocketAddr,
        timeout: std::time::Duration,
    ) -> std::io::Result<std::net::TcpStream> {
        std::net::TcpStream::connect_timeout(&addr, timeout)
    }
    /// Starts following the pods bound to `node` (their addresses and what listens there,
    /// as the API says), until the returned task is aborted; `None` when the network
    /// needs no such thing.
    fn follow(&self, _client: kube::Client, _node: &str) -> Option<tokio::task::JoinHandle<()>> {
        None
    }
}

/// Where an HTTP redirect leads when it stays on `host_port` (the kubelet's probes and
/// hooks follow those, as upstream's do): a path, or an http(s) URL naming the same host
/// and port.
pub fn same_host_redirect(location: &str, host_port: &str) -> Option<String> {
    if location.starts_with('/') {
        return Some(location.to_owned());
    }
    let rest = location
        .strip_prefix("http://")
        .or_else(|| location.strip_prefix("https://"))?;
    let (h, p) = rest.split_once('/').unwrap_or((rest, ""));
    (h == host_port).then(|| format!("/{p}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_redirects_to_the_same_host_are_followed() {
        let host = "10.244.0.5:8080";
        assert_eq!(
            super::same_host_redirect("/healthz", host).as_deref(),
            Some("/healthz")
        );
        assert_eq!(
            super::same_host_redirect("http://10.244.0.5:8080/x?y=1", host).as_deref(),
            Some("/x?y=1")
        );
        assert_eq!(
            super::same_host_redirect("http://0.0.0.0/healthz", host),
            None
        );
    }
}
