//! Network probes (`httpGet`, `tcpSocket`, `grpc`) as upstream's prober workers run them:
//! one worker per container and probe kind, probing every `periodSeconds` after
//! `initialDelaySeconds` with `timeoutSeconds`, turning `successThreshold` successes or
//! `failureThreshold` failures in a row into a result, recording an `Unhealthy` event for
//! each failed attempt (`Readiness probe failed: ...`), and holding a failed liveness or
//! startup result until the container is restarted. Liveness and readiness wait for the
//! startup probe to pass. Results start as upstream's: readiness failing, liveness
//! passing, startup unknown.
//!
//! Where a probe goes: through the pod network ([`PodNetwork`]) to the pod's own servers
//! and to anything else the cluster network reaches; to real sockets only on loopback,
//! which is where a host-network pod's server runs on this machine when the pod network
//! has none of it (the node's own addresses stand for 127.0.0.1). No probe ever leaves
//! the machine.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::Client;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::events::Record;
use kumo_cri::{DialError, PodNetwork, Runtime, State};

/// Which probe of a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Liveness,
    Readiness,
    Startup,
}

impl Kind {
    /// The container spec's field (`livenessProbe`, ...).
    fn field(self) -> &'static str {
        match self {
            Kind::Liveness => "livenessProbe",
            Kind::Readiness => "readinessProbe",
            Kind::Startup => "startupProbe",
        }
    }

    /// How events name it (`Liveness probe failed: ...`).
    fn title(self) -> &'static str {
        match self {
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
            Kind::Startup => "Startup",
        }
    }

    /// The result before the first probe (upstream's initial values).
    fn initial(self) -> Outcome {
        match self {
            Kind::Liveness => Outcome::Success,
            Kind::Readiness => Outcome::Failure,
            Kind::Startup => Outcome::Unknown,
        }
    }
}

/// A probe worker's current result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    Unknown,
}

/// The network probe of `kind` in a container spec, if it has one (exec probes are the
/// runtime's, see [`Runtime::probe_exec`]).
pub fn network_probe(container: &Value, kind: Kind) -> Option<&Value> {
    container.get(kind.field()).filter(|p| {
        ["httpGet", "tcpSocket", "grpc"]
            .iter()
            .any(|k| p.get(k).is_some())
    })
}

/// What one probe does.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    Http {
        https: bool,
        host: String,
        port: u16,
        path: String,
        headers: Vec<(String, String)>,
    },
    Tcp {
        host: String,
        port: u16,
    },
    Grpc {
        host: String,
        port: u16,
        service: String,
    },
}

/// A probe's settings with upstream's defaults.
#[derive(Clone, Debug)]
struct Settings {
    action: Action,
    initial_delay: Duration,
    period: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
}

fn field(p: &Value, k: &str, default: u64) -> u64 {
    p.get(k).and_then(Value::as_u64).unwrap_or(default)
}

/// A probe port: a number, or the name of one of the container's ports.
fn resolve_port(port: &Value, container: &Value) -> Result<u16, String> {
    if let Some(n) = port.as_u64() {
        return u16::try_from(n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("invalid port number: {n}"));
    }
    let name = port.as_str().unwrap_or("");
    if let Ok(n) = name.parse::<u16>() {
        return Ok(n);
    }
    container
        .get("ports")
        .and_then(Value::as_array)
        .and_then(|ps| {
            ps.iter()
                .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
        })
        .and_then(|p| p.get("containerPort").and_then(Value::as_u64))
        .and_then(|n| u16::try_from(n).ok())
        .ok_or_else(|| {
            format!(
                "couldn't find port: {name} in {}",
                container_name(container)
            )
        })
}

fn container_name(c: &Value) -> &str {
    c.get("name").and_then(Value::as_str).unwrap_or("")
}

impl Settings {
    fn parse(probe: &Value, container: &Value, pod_ip: &str) -> Result<Settings, String> {
        let host = |h: Option<&Value>| {
            h.and_then(Value::as_str)
                .filter(|h| !h.is_empty())
                .unwrap_or(pod_ip)
                .to_owned()
        };
        let action = if let Some(h) = probe.get("httpGet") {
            let mut path = h
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            if !path.starts_with('/') {
                path.insert(0, '/');
            }
            Action::Http {
                https: h.get("scheme").and_then(Value::as_str) == Some("HTTPS"),
                host: host(h.get("host")),
                port: resolve_port(h.get("port").unwrap_or(&Value::Null), container)?,
                path,
                headers: h
                    .get("httpHeaders")
                    .and_then(Value::as_array)
                    .map(|hs| {
                        hs.iter()
                            .filter_map(|x| {
                                Some((
                                    x.get("name")?.as_str()?.to_owned(),
                                    x.get("value")?.as_str()?.to_owned(),
                                ))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        } else if let Some(t) = probe.get("tcpSocket") {
            Action::Tcp {
                host: host(t.get("host")),
                port: resolve_port(t.get("port").unwrap_or(&Value::Null), container)?,
            }
        } else if let Some(g) = probe.get("grpc") {
            Action::Grpc {
                host: pod_ip.to_owned(),
                port: g
                    .get("port")
                    .and_then(Value::as_u64)
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or("invalid gRPC port")?,
                service: g
                    .get("service")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            }
        } else {
            return Err("missing probe handler".into());
        };
        Ok(Settings {
            action,
            initial_delay: Duration::from_secs(field(probe, "initialDelaySeconds", 0)),
            period: Duration::from_secs(field(probe, "periodSeconds", 10).max(1)),
            timeout: Duration::from_secs(field(probe, "timeoutSeconds", 1).max(1)),
            success_threshold: field(probe, "successThreshold", 1).max(1) as u32,
            failure_threshold: field(probe, "failureThreshold", 3).max(1) as u32,
        })
    }
}

/// Where a connection goes.
enum Route {
    /// A server of the probed pod at its own address, through the pod network: the pod
    /// (with the probed container's state as the runtime has it) and the port.
    Pod(Box<Value>, u16),
    /// Another address of the cluster network.
    Cluster(SocketAddr),
    /// A real socket (loopback only).
    Real(SocketAddr),
    Refused,
    /// Nobody answers: the probe waits out its timeout.
    Unreachable,
}

/// The kubelet's probe workers and their results.
#[derive(Clone)]
pub struct Prober {
    inner: Arc<Inner>,
}

struct Inner {
    /// (container id, kind) → the current result; present while a worker runs.
    results: Mutex<HashMap<(String, Kind), Outcome>>,
    client: Client,
    node: String,
    runtime: Arc<dyn Runtime>,
    network: Arc<dyn PodNetwork>,
    /// The node's own addresses (they stand for this machine's loopback).
    node_ips: Vec<IpAddr>,
    /// Woken when a result changes, so that status follows at once.
    wake: Arc<Notify>,
}

impl Inner {
    fn results(&self) -> std::sync::MutexGuard<'_, HashMap<(String, Kind), Outcome>> {
        self.results.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: &str, kind: Kind) -> Option<Outcome> {
        self.results().get(&(id.to_owned(), kind)).copied()
    }

    fn set(&self, id: &str, kind: Kind, outcome: Outcome) {
        let before = self.results().insert((id.to_owned(), kind), outcome);
        if before != Some(outcome) {
            self.wake.notify_one();
        }
    }
}

impl Prober {
    /// Probers of the node `node` whose own addresses are `node_ips`.
    pub fn new(
        client: Client,
        node: String,
        runtime: Arc<dyn Runtime>,
        network: Arc<dyn PodNetwork>,
        node_ips: Vec<IpAddr>,
        wake: Arc<Notify>,
    ) -> Prober {
        Prober {
            inner: Arc::new(Inner {
                results: Mutex::default(),
                client,
                node,
                runtime,
                network,
                node_ips,
                wake,
            }),
        }
    }

    /// The container runtime the probes run in.
    pub(crate) fn runtime(&self) -> Arc<dyn Runtime> {
        self.inner.runtime.clone()
    }

    /// What starts a pass of the pod workers at once.
    pub(crate) fn waker(&self) -> Arc<Notify> {
        self.inner.wake.clone()
    }

    /// The pod network the probes (and lifecycle hooks) go through.
    pub(crate) fn network(&self) -> Arc<dyn PodNetwork> {
        self.inner.network.clone()
    }

    /// The result of the `kind` worker of container `id`: `None` when it has none.
    pub fn result(&self, id: &str, kind: Kind) -> Option<Outcome> {
        self.inner.get(id, kind)
    }

    /// Starts the workers of the running container `id` (spec `container` of `pod`,
    /// whose IP is `pod_ip`) for its network probes, unless they run already. A worker
    /// ends when the container stops running.
    pub fn ensure(&self, id: &str, pod: &Value, container: &Value, pod_ip: &str) {
        let has_startup = network_probe(container, Kind::Startup).is_some();
        for kind in [Kind::Startup, Kind::Liveness, Kind::Readiness] {
            let Some(probe) = network_probe(container, kind) else {
                continue;
            };
            {
                let mut results = self.inner.results();
                let key = (id.to_owned(), kind);
                if results.contains_key(&key) {
                    continue;
                }
                results.insert(key, kind.initial());
            }
            let worker = Worker {
                inner: self.inner.clone(),
                id: id.to_owned(),
                kind,
                has_startup,
                settings: Settings::parse(probe, container, pod_ip),
                pod: pod.clone(),
                pod_ip: pod_ip.parse().ok(),
                container: container_name(container).to_owned(),
            };
            tokio::spawn(worker.run());
        }
    }
}

/// One probe worker.
struct Worker {
    inner: Arc<Inner>,
    id: String,
    kind: Kind,
    has_startup: bool,
    /// Or why the probe cannot run (reported as the probe's error).
    settings: Result<Settings, String>,
    pod: Value,
    /// The pod's IP as the kubelet gave it (the API's status may not have it yet).
    pod_ip: Option<IpAddr>,
    container: String,
}

impl Worker {
    async fn run(self) {
        let period = self
            .settings
            .as_ref()
            .map_or(Duration::from_secs(10), |s| s.period);
        let (mut successes, mut failures) = (0u32, 0u32);
        while let Some(started_at) = self.running_since() {
            let current = self.inner.get(&self.id, self.kind);
            // A failed liveness or startup probe holds until the restart; a passed
            // startup probe is not run again.
            let on_hold = match self.kind {
                Kind::Liveness => current == Some(Outcome::Failure),
                Kind::Startup => current.is_some_and(|o| o != Outcome::Unknown),
                Kind::Readiness => false,
            };
            let waiting_for_startup = self.kind != Kind::Startup
                && self.has_startup
                && self.inner.get(&self.id, Kind::Startup) != Some(Outcome::Success);
            let delay = self
                .settings
                .as_ref()
                .map_or(Duration::ZERO, |s| s.initial_delay);
            let elapsed = started_at.elapsed().unwrap_or_default();
            if elapsed < delay {
                tokio::time::sleep((delay - elapsed).min(period)).await;
                continue;
            }
            if !on_hold && !waiting_for_startup {
                let (threshold_ok, threshold_fail) = self
                    .settings
                    .as_ref()
                    .map_or((1, 3), |s| (s.success_threshold, s.failure_threshold));
                match self.probe(started_at).await {
                    Ok(()) => {
                        failures = 0;
                        successes += 1;
                        if successes >= threshold_ok {
                            self.inner.set(&self.id, self.kind, Outcome::Success);
                        }
                    }
                    Err(message) => {
                        successes = 0;
                        failures += 1;
                        crate::events::emit(
                            &self.inner.client,
                            &self.inner.node,
                            vec![Record::container(
                                &self.pod,
                                &self.container,
                                false,
                                true,
                                "Unhealthy",
                                format!("{} probe failed: {message}", self.kind.title()),
                            )],
                        );
                        if failures >= threshold_fail {
                            self.inner.set(&self.id, self.kind, Outcome::Failure);
                            failures = 0;
                        }
                    }
                }
            }
            tokio::time::sleep(period).await;
        }
        self.inner.results().remove(&(self.id.clone(), self.kind));
    }

    /// When the container started, while it runs.
    fn running_since(&self) -> Option<std::time::SystemTime> {
        match self.inner.runtime.container_status(&self.id).ok()?.state {
            State::Running { started_at } => Some(started_at),
            _ => None,
        }
    }

    /// One probe: `Err` carries the message upstream's prober reports.
    async fn probe(&self, started_at: std::time::SystemTime) -> Result<(), String> {
        let s = self.settings.as_ref().map_err(Clone::clone)?;
        let (host, port) = match &s.action {
            Action::Http { host, port, .. }
            | Action::Tcp { host, port }
            | Action::Grpc { host, port, .. } => (host.as_str(), *port),
        };
        let route = self.route(host, port, started_at);
        let network = self.inner.network.clone();
        match tokio::time::timeout(s.timeout, run(&s.action, route, &*network)).await {
            Ok(r) => r,
            Err(_) => Err(timeout_message(&s.action, s.timeout)),
        }
    }

    /// The pod as the probe sees it: the probed container running since `started_at`
    /// with its runtime id, whatever the API's status says yet.
    fn probed_pod(&self, started_at: std::time::SystemTime) -> Value {
        let mut pod = self.pod.clone();
        let started = k8s_openapi::jiff::Timestamp::try_from(started_at)
            .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default();
        let entry = serde_json::json!({
            "name": self.container,
            "containerID": format!("{}://{}", self.inner.runtime.version().0, self.id),
            "state": {"running": {"startedAt": started}},
        });
        let statuses = pod
            .pointer_mut("/status/containerStatuses")
            .and_then(Value::as_array_mut);
        match statuses {
            Some(list) => match list
                .iter_mut()
                .find(|c| c["name"] == self.container.as_str())
            {
                Some(c) => *c = entry,
                None => list.push(entry),
            },
            None => {
                if let Some(obj) = pod.as_object_mut() {
                    let status = obj.entry("status").or_insert_with(|| serde_json::json!({}));
                    status["containerStatuses"] = serde_json::json!([entry]);
                }
            }
        }
        pod
    }

    /// Where a probe of `host:port` goes (see the module documentation).
    fn route(&self, host: &str, port: u16, started_at: std::time::SystemTime) -> Route {
        let Ok(ip) = host.parse::<IpAddr>() else {
            // Names resolve as the node resolves them: only localhost here.
            return if host.eq_ignore_ascii_case("localhost") {
                Route::Real(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port))
            } else {
                Route::Unreachable
            };
        };
        let pod_ip = self.pod_ip;
        let host_network = self
            .pod
            .pointer("/spec/hostNetwork")
            .and_then(Value::as_bool)
            == Some(true);
        let on_host = ip.is_loopback() || self.inner.node_ips.contains(&ip);
        if self.inner.network.real() {
            // Real servers, reached from the node (its own addresses are its loopback).
            let to = if on_host && !ip.is_loopback() {
                Ipv4Addr::LOCALHOST.into()
            } else {
                ip
            };
            return Route::Real(SocketAddr::new(to, port));
        }
        if on_host {
            // A host-network container's declared port is the sim's; anything else on
            // the host is a real server (the control plane's, on loopback).
            if host_network {
                let pod = self.probed_pod(started_at);
                if self.inner.network.serves(&pod, port) {
                    return Route::Pod(Box::new(pod), port);
                }
            }
            let to = if ip.is_loopback() {
                ip
            } else {
                Ipv4Addr::LOCALHOST.into()
            };
            return Route::Real(SocketAddr::new(to, port));
        }
        if !host_network && (pod_ip == Some(ip) || pod_ip.is_none()) {
            let pod = self.probed_pod(started_at);
            return if self.inner.network.serves(&pod, port) {
                Route::Pod(Box::new(pod), port)
            } else {
                Route::Refused
            };
        }
        let addr = SocketAddr::new(ip, port);
        match self.inner.network.connect(addr) {
            Ok(()) => Route::Cluster(addr),
            Err(DialError::Refused) => Route::Refused,
            Err(DialError::Unreachable) => Route::Unreachable,
        }
    }
}

/// `host:port` as Go writes it (IPv6 in brackets).
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn url(https: bool, host: &str, port: u16, path: &str) -> String {
    let scheme = if https { "https" } else { "http" };
    format!("{scheme}://{}{path}", join_host_port(host, port))
}

fn refused_message(action: &Action) -> String {
    match action {
        Action::Http {
            https,
            host,
            port,
            path,
            ..
        } => format!(
            "Get \"{}\": dial tcp {}: connect: connection refused",
            url(*https, host, *port, path),
            join_host_port(host, *port)
        ),
        Action::Tcp { host, port } => {
            format!("dial tcp {}: connect: connection refused", join_host_port(host, *port))
        }
        Action::Grpc { host, port, .. } => format!(
            "rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial tcp {}: connect: connection refused\"",
            join_host_port(host, *port)
        ),
    }
}

fn timeout_message(action: &Action, timeout: Duration) -> String {
    match action {
        Action::Http {
            https,
            host,
            port,
            path,
            ..
        } => format!(
            "Get \"{}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
            url(*https, host, *port, path)
        ),
        Action::Tcp { host, port } => {
            format!("dial tcp {}: i/o timeout", join_host_port(host, *port))
        }
        Action::Grpc { host, port, .. } => format!(
            "timeout: failed to connect service \"{}\" within {}s",
            join_host_port(host, *port),
            timeout.as_secs()
        ),
    }
}

/// Runs `action` over `route` (the caller bounds it with the probe's timeout).
async fn run(action: &Action, route: Route, network: &dyn PodNetwork) -> Result<(), String> {
    let answered = |r: Result<u16, DialError>| match r {
        Ok(code) => Some(http_verdict(code)),
        Err(DialError::Refused) => Some(Err(refused_message(action))),
        Err(DialError::Unreachable) => None,
    };
    match route {
        Route::Unreachable => std::future::pending().await,
        Route::Refused => Err(refused_message(action)),
        Route::Pod(pod, port) => match action {
            Action::Http { path, .. } => match answered(network.get_pod(&pod, port, path, false)) {
                Some(r) => r,
                None => std::future::pending().await,
            },
            // The pod network's servers stand for the container's, whatever they speak.
            Action::Tcp { .. } | Action::Grpc { .. } => Ok(()),
        },
        Route::Cluster(addr) => match action {
            Action::Http { path, .. } => match answered(network.get(addr, path, false)) {
                Some(r) => r,
                None => std::future::pending().await,
            },
            Action::Tcp { .. } | Action::Grpc { .. } => Ok(()),
        },
        Route::Real(addr) => {
            let opened = network.open(addr, Duration::from_secs(1)).and_then(|s| {
                s.set_nonblocking(true)?;
                TcpStream::from_std(s)
            });
            let stream = match opened {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    return Err(refused_message(action))
                }
                Err(e) => return Err(format!("dial tcp {addr}: connect: {e}")),
            };
            match action {
                Action::Tcp { .. } => Ok(()),
                Action::Http {
                    https,
                    host,
                    port,
                    path,
                    headers,
                } => {
                    // Redirects to the same host are followed (up to 10, as upstream's
                    // prober); one elsewhere ends the probe with its 3xx, a pass.
                    let mut stream = Some(stream);
                    let mut path = path.clone();
                    let mut code = 0;
                    for _ in 0..10 {
                        let conn = match stream.take() {
                            Some(s) => s,
                            None => network
                                .open(addr, Duration::from_secs(1))
                                .and_then(|s| {
                                    s.set_nonblocking(true)?;
                                    TcpStream::from_std(s)
                                })
                                .map_err(|e| format!("dial tcp {addr}: connect: {e}"))?,
                        };
                        let target = url(*https, host, *port, &path);
                        let (c, location) = if *https {
                            let tls = tls_connect(conn, host)
                                .await
                                .map_err(|e| format!("Get \"{target}\": {e}"))?;
                            http_get(tls, host, *port, &path, headers).await
                        } else {
                            http_get(conn, host, *port, &path, headers).await
                        }
                        .map_err(|e| format!("Get \"{target}\": {e}"))?;
                        code = c;
                        let next = location.as_deref().and_then(|l| {
                            kumo_cri::network::same_host_redirect(l, &join_host_port(host, *port))
                        });
                        match next {
                            Some(p) if (300..400).contains(&c) => path = p,
                            _ => break,
                        }
                    }
                    http_verdict(code)
                }
                Action::Grpc { service, .. } => grpc_check(stream, addr, service).await,
            }
        }
    }
}

/// Upstream's HTTP verdict: 2xx and 3xx pass.
fn http_verdict(code: u16) -> Result<(), String> {
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {code}"))
    }
}

/// The probe's User-Agent: `kube-probe/<major>.<minor>`.
const USER_AGENT: &str = "kube-probe/1.37";

/// GETs `path` over `io`; returns the status code.
async fn http_get<T>(
    io: T,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Result<(u16, Option<String>), String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = http::Request::get(path)
        .header(http::header::HOST, join_host_port(host, port))
        .header(http::header::USER_AGENT, USER_AGENT)
        .header(http::header::ACCEPT, "*/*");
    for (k, v) in headers {
        // A Host header in the probe replaces the URL's, as upstream's does.
        if k.eq_ignore_ascii_case("host") {
            if let Some(h) = req.headers_mut() {
                if let Ok(v) = http::HeaderValue::from_str(v) {
                    h.insert(http::header::HOST, v);
                }
            }
            continue;
        }
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let code = resp.status().as_u16();
    let location = resp
        .headers()
        .get(http::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Upstream reads at most 10 KiB of the body; the verdict is the code's.
    let mut body = resp.into_body();
    let mut read = 0usize;
    while read < 10 * 1024 {
        match body.frame().await {
            Some(Ok(f)) => read += f.data_ref().map_or(0, |d| d.len()),
            _ => break,
        }
    }
    Ok((code, location))
}

/// TLS without verifying the server (the kubelet's HTTPS probes skip verification).
async fn tls_connect(
    stream: TcpStream,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_no_client_auth();
    let name =
        rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
        .map_err(|e| e.to_string())
}

/// Accepts any server certificate (handshake signatures are still checked): what the
/// kubelet's HTTPS probes trust.
#[derive(Debug)]
pub struct AnyServer(pub Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// grpc.health.v1 status names.
fn serving_status(n: u64) -> &'static str {
    match n {
        1 => "SERVING",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "UNKNOWN",
    }
}

/// `grpc.health.v1.Health/Check` over h2c; passes when the answer is SERVING.
async fn grpc_check(stream: TcpStream, addr: SocketAddr, service: &str) -> Result<(), String> {
    let failed = |e: String| format!("rpc error: code = Unavailable desc = {e}");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| failed(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    // HealthCheckRequest { service = 1 }, length-prefixed as gRPC frames messages.
    let mut msg = Vec::new();
    if !service.is_empty() {
        msg.push(0x0a);
        let mut n = service.len();
        while n >= 0x80 {
            msg.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        msg.push(n as u8);
        msg.extend_from_slice(service.as_bytes());
    }
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    let req = http::Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
        .header(http::header::USER_AGENT, USER_AGENT)
        .body(Full::new(Bytes::from(frame)))
        .map_err(|e| failed(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let head_status = resp
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let collected = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| failed(e.to_string()))?;
    let trailers = collected.trailers().cloned();
    let body = collected.to_bytes();
    let status = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or(head_status)
        .unwrap_or_else(|| "0".into());
    if status == "12" {
        return Err(
            "this server does not implement the grpc health protocol (grpc.health.v1.Health)"
                .into(),
        );
    }
    if status != "0" {
        let desc = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-message"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        return Err(format!(
            "health rpc probe failed: rpc error: code = {status} desc = {desc}"
        ));
    }
    // HealthCheckResponse { status = 1 (enum) } after the 5-byte prefix.
    let msg = body.get(5..).unwrap_or(&[]);
    let mut serving = 0u64;
    let mut i = 0;
    while i < msg.len() {
        let tag = msg[i];
        i += 1;
        if tag == 0x08 {
            let (mut v, mut shift) = (0u64, 0);
            while i < msg.len() {
                let b = msg[i];
                i += 1;
                v |= u64::from(b & 0x7f) << shift;
                shift += 7;
                if b & 0x80 == 0 || shift > 63 {
                    break;
                }
            }
            serving = v;
        } else {
            break;
        }
    }
    if serving == 1 {
        Ok(())
    } else {
        Err(format!(
            "service unhealthy (responded with \"{}\")",
            serving_status(serving)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn settings_take_upstream_defaults_and_named_ports() {
        let c = json!({"name": "web", "ports": [{"name": "http", "containerPort": 8080}]});
        let p = json!({"httpGet": {"path": "healthz", "port": "http"}});
        let s = Settings::parse(&p, &c, "10.244.0.5").expect("parses");
        assert_eq!(
            s.action,
            Action::Http {
                https: false,
                host: "10.244.0.5".into(),
                port: 8080,
                path: "/healthz".into(),
                headers: vec![],
            }
        );
        assert_eq!(s.period, Duration::from_secs(10));
        assert_eq!(s.timeout, Duration::from_secs(1));
        assert_eq!((s.success_threshold, s.failure_threshold), (1, 3));
        let bad = json!({"tcpSocket": {"port": "nope"}});
        assert_eq!(
            Settings::parse(&bad, &c, "10.244.0.5").err().as_deref(),
            Some("couldn't find port: nope in web")
        );
    }

    #[test]
    fn messages_read_as_upstreams() {
        let http = Action::Http {
            https: false,
            host: "10.244.0.5".into(),
            port: 8080,
            path: "/healthz".into(),
            headers: vec![],
        };
        assert_eq!(
            refused_message(&http),
            "Get \"http://10.244.0.5:8080/healthz\": dial tcp 10.244.0.5:8080: connect: connection refused"
        );
        assert_eq!(
            timeout_message(
                &Action::Tcp {
                    host: "fd00::1".into(),
                    port: 80
                },
                Duration::from_secs(1)
            ),
            "dial tcp [fd00::1]:80: i/o timeout"
        );
        assert_eq!(http_verdict(302), Ok(()));
        assert_eq!(
            http_verdict(500),
            Err("HTTP probe failed with statuscode: 500".into())
        );
    }

    #[test]
    fn only_network_probes_are_the_probers() {
        let c = json!({"livenessProbe": {"exec": {"command": ["true"]}}, "readinessProbe": {"tcpSocket": {"port": 80}}});
        assert!(network_probe(&c, Kind::Liveness).is_none());
        assert!(network_probe(&c, Kind::Readiness).is_some());
        assert!(network_probe(&c, Kind::Startup).is_none());
    }
}
