//! The pod network of a node on a CRI runtime: the runtime's CNI plugins gave each
//! sandbox its address in the node's network namespace; the kubelet's probes, hooks and
//! port-forwards dial those addresses from inside that namespace.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use kumo_cri::{DialError, PodNetwork};
use serde_json::Value;

use crate::RemoteRuntime;

/// How long a probe's connection may take to open.
const DIAL_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an HTTP probe or hook may wait for its answer.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// The network of the node's namespace.
pub struct NetnsNetwork {
    runtime: Arc<RemoteRuntime>,
}

impl NetnsNetwork {
    pub fn new(runtime: Arc<RemoteRuntime>) -> Self {
        NetnsNetwork { runtime }
    }

    /// Where `pod` listens: its sandbox's address (the node's loopback for a host-network
    /// pod, which shares the node's namespace).
    fn address(&self, pod: &Value) -> Option<IpAddr> {
        if pod.pointer("/spec/hostNetwork").and_then(Value::as_bool) == Some(true) {
            return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        pod.pointer("/status/podIP")
            .and_then(Value::as_str)
            .and_then(|ip| ip.parse().ok())
            .or_else(|| {
                let uid = pod.pointer("/metadata/uid").and_then(Value::as_str)?;
                self.runtime.sandbox_ip_of_pod(uid)
            })
    }

    fn dial(&self, addr: SocketAddr) -> Result<std::net::TcpStream, DialError> {
        crate::netns::connect(self.runtime.options().netns.as_deref(), addr, DIAL_TIMEOUT).map_err(
            |e| match e.kind() {
                io::ErrorKind::ConnectionRefused => DialError::Refused,
                _ => DialError::Unreachable,
            },
        )
    }

    /// `GET path` at `addr`: the status code, redirects to the same host followed (up
    /// to 10, as upstream's prober; one elsewhere ends the request with its 3xx).
    fn http_get(&self, addr: SocketAddr, path: &str) -> Result<u16, DialError> {
        let mut path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        let host = addr.to_string();
        for _ in 0..10 {
            let stream = self.dial(addr)?;
            let (h, p) = (host.clone(), path.clone());
            let (code, location) = self
                .runtime
                .run(async move {
                    tokio::time::timeout(HTTP_TIMEOUT, get(stream, h, p))
                        .await
                        .unwrap_or(Err(DialError::Unreachable))
                })
                .unwrap_or(Err(DialError::Unreachable))?;
            match location
                .as_deref()
                .and_then(|l| kumo_cri::network::same_host_redirect(l, &host))
            {
                Some(next) if (300..400).contains(&code) => path = next,
                _ => return Ok(code),
            }
        }
        Ok(302)
    }
}

/// `GET path` over an open connection: the answer's status code and `Location`.
async fn get(
    stream: std::net::TcpStream,
    host: String,
    path: String,
) -> Result<(u16, Option<String>), DialError> {
    let lost = |_| DialError::Unreachable;
    stream.set_nonblocking(true).map_err(lost)?;
    let stream = tokio::net::TcpStream::from_std(stream).map_err(lost)?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|_| DialError::Unreachable)?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header(http::header::HOST, host)
        .header(http::header::USER_AGENT, "kube-probe/1.37")
        .header(http::header::ACCEPT, "*/*")
        .body(Empty::<Bytes>::new())
        .map_err(|_| DialError::Unreachable)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|_| DialError::Refused)?;
    let location = resp
        .headers()
        .get(http::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok((resp.status().as_u16(), location))
}

impl PodNetwork for NetnsNetwork {
    fn real(&self) -> bool {
        true
    }

    fn open(&self, addr: SocketAddr, timeout: Duration) -> io::Result<std::net::TcpStream> {
        crate::netns::connect(self.runtime.options().netns.as_deref(), addr, timeout)
    }

    fn set_pod_cidr(&self, cidr: &str) {
        if let Err(e) = self.runtime.update_pod_cidr(cidr) {
            tracing::warn!(cidr, error = %e, "handing the pod range to the runtime");
        }
    }

    fn set_up(&self, uid: &str) -> Result<IpAddr, String> {
        self.runtime
            .sandbox_ip_of_pod(uid)
            .ok_or_else(|| format!("the runtime gave pod {uid}'s sandbox no address"))
    }

    fn tear_down(&self, _uid: &str) {
        // RemovePodSandbox ran the CNI DEL.
    }

    fn serves(&self, pod: &Value, port: u16) -> bool {
        self.address(pod)
            .is_some_and(|ip| self.dial(SocketAddr::new(ip, port)).is_ok())
    }

    fn get_pod(
        &self,
        pod: &Value,
        port: u16,
        path: &str,
        _effects: bool,
    ) -> Result<u16, DialError> {
        let ip = self.address(pod).ok_or(DialError::Unreachable)?;
        self.http_get(SocketAddr::new(ip, port), path)
    }

    fn connect(&self, addr: SocketAddr) -> Result<(), DialError> {
        self.dial(addr).map(drop)
    }

    fn get(&self, addr: SocketAddr, path: &str, _effects: bool) -> Result<u16, DialError> {
        self.http_get(addr, path)
    }

    fn forward(&self, pod: &Value, port: u16) -> Option<tokio::io::DuplexStream> {
        let ip = self.address(pod)?;
        let stream = self.dial(SocketAddr::new(ip, port)).ok()?;
        let (near, far) = tokio::io::duplex(64 * 1024);
        self.runtime.detach(async move {
            if stream.set_nonblocking(true).is_err() {
                return;
            }
            let Ok(mut stream) = tokio::net::TcpStream::from_std(stream) else {
                return;
            };
            let mut far = far;
            let _ = tokio::io::copy_bidirectional(&mut far, &mut stream).await;
        });
        Some(near)
    }
}

impl RemoteRuntime {
    /// The address of the sandbox of pod `uid`, when the runtime gave it one.
    pub fn sandbox_ip_of_pod(&self, uid: &str) -> Option<IpAddr> {
        let sandboxes = self.sandboxes.lock().unwrap_or_else(|e| e.into_inner());
        sandboxes.values().find(|s| s.uid == uid).and_then(|s| s.ip)
    }

    /// Spawns `f` on the client's runtime.
    pub(crate) fn detach(&self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        self.spawn(f);
    }
}
