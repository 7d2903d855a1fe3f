//! The simulated pod network of one `kumo up`: what the kernel's netfilter tables, the
//! cluster DNS and the pods' sockets are on a real node, as one in-process table shared
//! by every kubelet of the cluster and by the proxy.
//!
//! Three parts, each written by the component that owns it on a real cluster:
//! * Service rules (kube-proxy's iptables/nftables role): a frontend — ClusterIP:port,
//!   node IP:nodePort, LoadBalancer VIP:port, per protocol — to the ready endpoints
//!   (pod IP:targetPort); written by kumo-proxy per Service.
//! * DNS records (CoreDNS's role): `<svc>.<ns>.svc.cluster.local` to the ClusterIP (or, for
//!   a headless Service, the ready pod IPs); also written by kumo-proxy.
//! * Listeners (the pods' sockets): each kubelet records its pods as the API has them,
//!   and what listens on a pod IP:port is decided as for port-forward
//!   ([`crate::servers`]): a running container that declares the port, or nginx on 80.
//!
//! Simulated clients ([`crate::runtime::shell`]'s `curl` and `wget`) resolve names and
//! connect through [`Dataplane::resolve`] and [`Dataplane::connect`].

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use serde_json::Value;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::dns::{Answer, QType, RData, Rr};
use crate::servers::Listener;

pub use kumo_proxy::dataplane::{Protocol, Rule, ServiceEntry, CLUSTER_DOMAIN};

/// The proxy programs this data plane (kube-proxy's rules and CoreDNS's records).
impl kumo_proxy::dataplane::Dataplane for Dataplane {
    fn set_service(&self, key: &str, entry: ServiceEntry) {
        Dataplane::set_service(self, key, entry);
    }

    fn remove_service(&self, key: &str) {
        Dataplane::remove_service(self, key);
    }

    fn retain_services(&self, keep: &dyn Fn(&str) -> bool) {
        Dataplane::retain_services(self, keep);
    }

    fn set_node(&self, name: &str, ips: Vec<IpAddr>) {
        Dataplane::set_node(self, name, ips);
    }
}

/// Why a connection did not happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnectError {
    /// Refused: a Service without ready endpoints, or nothing listening on the port.
    Refused,
    /// No answer at all (an address nobody has): the client waits for its timeout.
    Unreachable,
}

#[derive(Default)]
struct Tables {
    /// Service key (`ns/name`) → its entry.
    services: HashMap<String, ServiceEntry>,
    /// (frontend, protocol) → endpoints, from every Service.
    rules: HashMap<(SocketAddr, Protocol), Vec<SocketAddr>>,
    /// (frontend, protocol) → the ClientIP affinity timeout of its Service.
    affinity: HashMap<(SocketAddr, Protocol), std::time::Duration>,
    /// The cluster DNS zone: owner name (lower case, no trailing dot) → its records.
    zone: HashMap<String, Vec<Rr>>,
    /// Pod IP → (pod uid → the pod as the kubelet last saw it).
    pods: HashMap<IpAddr, BTreeMap<String, Arc<Value>>>,
    /// Node IPs (a connection to one on a port without a NodePort is refused).
    nodes: HashMap<String, Vec<IpAddr>>,
}

/// The pod on node `node` that publishes `to`'s port as a hostPort for `proto`, bound to
/// `to`'s address or to every address (`hostIP` unset or 0.0.0.0), as its container port
/// on the pod's IP.
fn host_port(t: &Tables, node: &str, to: SocketAddr, proto: Protocol) -> Option<SocketAddr> {
    let want = match proto {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
        Protocol::Sctp => "SCTP",
    };
    t.pods.iter().find_map(|(ip, pods)| {
        pods.values().find_map(|p| {
            let spec = p.get("spec")?;
            if spec.get("nodeName").and_then(Value::as_str) != Some(node)
                || spec.get("hostNetwork").and_then(Value::as_bool) == Some(true)
            {
                return None;
            }
            let ports = spec
                .get("containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .flat_map(|c| {
                    c.get("ports")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                });
            ports.into_iter().find_map(|port| {
                let host = port.get("hostPort").and_then(Value::as_u64)?;
                let protocol = port
                    .get("protocol")
                    .and_then(Value::as_str)
                    .unwrap_or("TCP");
                let bound = port.get("hostIP").and_then(Value::as_str).unwrap_or("");
                let matches = host == u64::from(to.port())
                    && protocol == want
                    && (bound.is_empty()
                        || bound == "0.0.0.0"
                        || bound.parse::<IpAddr>().ok() == Some(to.ip()));
                let container = port.get("containerPort").and_then(Value::as_u64)?;
                let container = u16::try_from(container).ok()?;
                matches.then(|| SocketAddr::new(*ip, container))
            })
        })
    })
}

/// A client, a Service frontend and its protocol (what ClientIP affinity keys on).
type StickyKey = (IpAddr, SocketAddr, Protocol);

/// The shared table (see the module documentation).
#[derive(Default)]
pub struct Dataplane {
    tables: RwLock<Tables>,
    /// Round-robin among endpoints.
    next: AtomicUsize,
    /// ClientIP affinity: (client, frontend, protocol) → the endpoint it got, and when
    /// it last used it (kube-proxy's `recent` match).
    sticky: std::sync::Mutex<HashMap<StickyKey, (SocketAddr, std::time::Instant)>>,
    /// The runtimes of the kubelets on this network, for listeners that serve what their
    /// containers' files hold (weak: a kubelet that stops takes its runtime along).
    runtimes: RwLock<Vec<Weak<dyn crate::runtime::Runtime>>>,
    /// The in-memory state of simulated servers that keep one (agnhost nettest's
    /// counts), by container id.
    server_state: std::sync::Mutex<HashMap<String, Value>>,
    /// How many TCP connections each pod address has accepted (the simulated runtime's
    /// CPU model charges its servers per request).
    served: std::sync::Mutex<HashMap<IpAddr, u64>>,
    /// Servers the process owner runs for the pods of an image, by (image repository,
    /// port): `kumo up`'s add-ons whose pods stand for work its process does.
    hosted: RwLock<HashMap<(String, u16), HostedServer>>,
}

/// A server run in-process for the pods of an image: it takes the server's end of each
/// connection made to such a pod.
pub type HostedServer = Arc<dyn Fn(tokio::io::DuplexStream) + Send + Sync>;

/// An image reference's repository (`registry.k8s.io/metrics-server/metrics-server` of
/// `...:v0.8.0`).
fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => image,
    }
}

impl std::fmt::Debug for Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.read();
        f.debug_struct("Dataplane")
            .field("services", &t.services.len())
            .field("pods", &t.pods.len())
            .finish()
    }
}

impl Dataplane {
    /// Serves connections to port `port` of the pods running `repository`'s image with
    /// `serve`, in place of the simulated container (see [`HostedServer`]).
    pub fn host(&self, repository: &str, port: u16, serve: HostedServer) {
        let mut h = self.hosted.write().unwrap_or_else(|e| e.into_inner());
        h.insert((repository.to_owned(), port), serve);
    }

    /// The hosted server behind `to` (a Service frontend or a pod), if any.
    fn hosted_at(&self, to: SocketAddr) -> Option<HostedServer> {
        let hosted = self.hosted.read().unwrap_or_else(|e| e.into_inner());
        if hosted.is_empty() {
            return None;
        }
        let t = self.read();
        let target = self.route(&t, None, to, Protocol::Tcp)?;
        let pods = t.pods.get(&target.ip())?;
        pods.values().find_map(|p| {
            let running = p
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .is_some_and(|cs| cs.iter().any(|c| c.pointer("/state/running").is_some()));
            if !running {
                return None;
            }
            p.pointer("/spec/containers")
                .and_then(Value::as_array)?
                .iter()
                .find_map(|c| {
                    let image = c.get("image").and_then(Value::as_str)?;
                    hosted
                        .get(&(repository(image).to_owned(), target.port()))
                        .cloned()
                })
        })
    }

    /// How many TCP connections the pod at `ip` has accepted so far.
    pub fn served(&self, ip: IpAddr) -> u64 {
        let served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        served.get(&ip).copied().unwrap_or(0)
    }

    fn read(&self) -> RwLockReadGuard<'_, Tables> {
        self.tables.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Tables> {
        self.tables.write().unwrap_or_else(|e| e.into_inner())
    }

    /// A new, empty table.
    pub fn new() -> Arc<Dataplane> {
        Arc::new(Dataplane::default())
    }

    /// Replaces what Service `key` (`ns/name`) programs.
    pub fn set_service(&self, key: &str, entry: ServiceEntry) {
        let mut t = self.write();
        t.services.insert(key.to_owned(), entry);
        t.rebuild();
    }

    /// Removes Service `key`'s rules and records.
    pub fn remove_service(&self, key: &str) {
        let mut t = self.write();
        if t.services.remove(key).is_some() {
            t.rebuild();
        }
    }

    /// Keeps only the Services in `keys` (after a relist).
    pub fn retain_services(&self, keep: impl Fn(&str) -> bool) {
        let mut t = self.write();
        let before = t.services.len();
        t.services.retain(|k, _| keep(k));
        if t.services.len() != before {
            t.rebuild();
        }
    }

    /// The Services programmed now (keys).
    pub fn services(&self) -> Vec<String> {
        let mut v: Vec<String> = self.read().services.keys().cloned().collect();
        v.sort();
        v
    }

    /// What Service `key` programs now.
    pub fn service(&self, key: &str) -> Option<ServiceEntry> {
        self.read().services.get(key).cloned()
    }

    /// Records node `name`'s addresses.
    pub fn set_node(&self, name: &str, ips: Vec<IpAddr>) {
        self.write().nodes.insert(name.to_owned(), ips);
    }

    /// Records pod `uid` at `ip` as the kubelet sees it (its spec and container states
    /// decide what listens).
    pub fn set_pod(&self, uid: &str, ip: IpAddr, pod: Value) {
        let mut t = self.write();
        for m in t.pods.values_mut() {
            m.remove(uid);
        }
        t.pods.retain(|_, m| !m.is_empty());
        t.pods
            .entry(ip)
            .or_default()
            .insert(uid.to_owned(), Arc::new(pod));
    }

    /// Forgets pod `uid`.
    pub fn remove_pod(&self, uid: &str) {
        let mut t = self.write();
        for m in t.pods.values_mut() {
            m.remove(uid);
        }
        t.pods.retain(|_, m| !m.is_empty());
    }

    /// The addresses `name` resolves to as a fully qualified name (no search path).
    pub fn lookup(&self, name: &str) -> Option<Vec<IpAddr>> {
        let ips: Vec<IpAddr> = self
            .answer(name, QType::A)
            .records
            .into_iter()
            .filter_map(|r| match r.data {
                RData::A(ip) => Some(ip),
                _ => None,
            })
            .collect();
        (!ips.is_empty()).then_some(ips)
    }

    /// Resolves `host` as a pod's resolver does with `search` (its resolv.conf's search
    /// list) and `ndots:5`: a name with fewer dots than 5 is tried with each search
    /// domain first, then as is; a name ending in a dot only as is.
    pub fn resolve(&self, host: &str, search: &[String]) -> Option<Vec<IpAddr>> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Some(vec![ip]);
        }
        let rc = crate::dns::ResolvConf {
            nameservers: Vec::new(),
            search: search.to_vec(),
            ndots: 5,
        };
        rc.candidates(host).iter().find_map(|n| self.lookup(n))
    }

    /// What the cluster DNS answers for `name`/`qtype`.
    pub fn answer(&self, name: &str, qtype: QType) -> Answer {
        let t = self.read();
        crate::dns::answer(
            |n| {
                t.zone
                    .get(n)
                    .map(|v| v.iter().collect())
                    .unwrap_or_default()
            },
            |n| {
                let below = format!(".{n}");
                t.zone.keys().any(|k| k.ends_with(&below))
            },
            name,
            qtype,
        )
    }

    /// Sends a query to the DNS server at `server` (port 53, over TCP or UDP): the cluster
    /// DNS answers when `server` is a Service frontend with ready endpoints or a pod
    /// serving DNS (a CoreDNS image declaring port 53); anything else never answers
    /// (`None`: the client times out).
    pub fn query(&self, server: IpAddr, tcp: bool, name: &str, qtype: QType) -> Option<Answer> {
        let proto = if tcp { Protocol::Tcp } else { Protocol::Udp };
        let to = SocketAddr::new(server, 53);
        let serves = {
            let t = self.read();
            let target = match t.rules.get(&(to, proto)) {
                Some(eps) if eps.is_empty() => return None,
                Some(eps) => eps[self.next.fetch_add(1, Ordering::Relaxed) % eps.len()],
                None => to,
            };
            t.pods
                .get(&target.ip())
                .is_some_and(|pods| pods.values().any(|p| serves_dns(p)))
        };
        serves.then(|| self.answer(name, qtype))
    }

    /// Where a packet from `from` to `to` goes: `to` itself unless it is a Service
    /// frontend, else one of its ready endpoints — round robin, or with ClientIP affinity
    /// the one this client got last while it keeps using it. `None`: no endpoints.
    fn route(
        &self,
        t: &Tables,
        from: Option<IpAddr>,
        to: SocketAddr,
        proto: Protocol,
    ) -> Option<SocketAddr> {
        // Loopback is the client's own network namespace: a pod's, or the node's for a
        // host-network client, where hostPorts bound to loopback answer too.
        if to.ip().is_loopback() {
            let Some(client) = from.filter(|c| !c.is_unspecified()) else {
                return Some(to);
            };
            let node = t.nodes.iter().find(|(_, ips)| ips.contains(&client));
            if let Some(target) = node.and_then(|(n, _)| host_port(t, n, to, proto)) {
                return Some(target);
            }
            return Some(SocketAddr::new(client, to.port()));
        }
        // The CNI portmap plugin's DNAT of a node address to a pod's hostPort.
        let node = t.nodes.iter().find(|(_, ips)| ips.contains(&to.ip()));
        if let Some(target) = node.and_then(|(n, _)| host_port(t, n, to, proto)) {
            return Some(target);
        }
        let Some(eps) = t.rules.get(&(to, proto)) else {
            return Some(to);
        };
        if eps.is_empty() {
            return None;
        }
        let round_robin = || eps[self.next.fetch_add(1, Ordering::Relaxed) % eps.len()];
        let (Some(client), Some(timeout)) = (from, t.affinity.get(&(to, proto))) else {
            return Some(round_robin());
        };
        let mut sticky = self.sticky.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        let key = (client, to, proto);
        let ep = match sticky.get(&key) {
            Some((ep, at)) if now.duration_since(*at) < *timeout && eps.contains(ep) => *ep,
            _ => round_robin(),
        };
        if sticky.len() > 65536 {
            sticky.clear();
        }
        sticky.insert(key, (ep, now));
        Some(ep)
    }

    /// Connects to `to` over TCP as the node's netfilter rules route it: a Service
    /// frontend goes to one of its ready endpoints (round robin), then to what listens
    /// there. Returns the endpoint connected to and its listener.
    pub fn connect(&self, to: SocketAddr) -> Result<(SocketAddr, Listener), ConnectError> {
        self.connect_from(None, to)
    }

    /// [`Self::connect`] from client address `from` (for ClientIP session affinity).
    pub fn connect_from(
        &self,
        from: Option<IpAddr>,
        to: SocketAddr,
    ) -> Result<(SocketAddr, Listener), ConnectError> {
        let t = self.read();
        let Some(target) = self.route(&t, from, to, Protocol::Tcp) else {
            return Err(ConnectError::Refused);
        };
        if let Some(pods) = t.pods.get(&target.ip()) {
            let found = pods
                .values()
                .find_map(|p| crate::servers::listener(p, target.port()))
                .map(|l| (target, l))
                .ok_or(ConnectError::Refused);
            if found.is_ok() {
                let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
                *served.entry(target.ip()).or_default() += 1;
            }
            return found;
        }
        let is_node = t.nodes.values().any(|ips| ips.contains(&target.ip()));
        let is_frontend_ip = t.rules.keys().any(|(f, _)| f.ip() == target.ip());
        // An endpoint outside the pod network (the `kubernetes` Service's API server)
        // has no simulated listener: refused rather than a silent drop.
        let translated = target != to;
        if is_node || is_frontend_ip || translated {
            return Err(ConnectError::Refused);
        }
        Err(ConnectError::Unreachable)
    }
}

impl Dataplane {
    /// Sends UDP datagram `request` from `from` to `to` as the node's rules route it and
    /// returns the reply: a Service frontend goes to one of its ready endpoints. Refused
    /// when a Service has no endpoints or a pod has nothing on the port (ICMP port
    /// unreachable); `Unreachable` when nobody has the address (the client times out).
    pub fn send_udp(
        &self,
        to: SocketAddr,
        from: SocketAddr,
        request: &str,
    ) -> Result<String, ConnectError> {
        let t = self.read();
        let Some(target) = self.route(&t, Some(from.ip()), to, Protocol::Udp) else {
            return Err(ConnectError::Refused);
        };
        if let Some(pods) = t.pods.get(&target.ip()) {
            return pods
                .values()
                .find_map(|p| crate::servers::udp_answer(p, target.port(), request, from))
                .ok_or(ConnectError::Refused);
        }
        let is_node = t.nodes.values().any(|ips| ips.contains(&target.ip()));
        if is_node || target != to {
            return Err(ConnectError::Refused);
        }
        Err(ConnectError::Unreachable)
    }
}

impl Dataplane {
    /// A connection to what listens at `to`, for a client outside the simulation (the API
    /// server's pod and service proxies): one end of an in-memory pipe whose other end the
    /// listener answers. Refused and unreachable addresses fail with the I/O error a
    /// socket would give.
    pub fn dial(self: &Arc<Self>, to: SocketAddr) -> std::io::Result<tokio::io::DuplexStream> {
        if let Some(serve) = self.hosted_at(to) {
            let (client, server) = tokio::io::duplex(64 << 10);
            serve(server);
            return Ok(client);
        }
        let (_, listener) = self.connect(to).map_err(|e| match e {
            ConnectError::Refused => std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            ConnectError::Unreachable => {
                std::io::Error::new(std::io::ErrorKind::HostUnreachable, "no route to host")
            }
        })?;
        let (client, server) = tokio::io::duplex(64 << 10);
        match listener {
            Listener::AgnhostWebhook {
                container,
                cert_file,
                key_file,
                sidecar_image,
                crd_conversion,
            } => {
                let cfg = crate::agnhost_webhook::Config {
                    cert_pem: self.read_file(&container, &cert_file).unwrap_or_default(),
                    key_pem: self.read_file(&container, &key_file).unwrap_or_default(),
                    sidecar_image,
                    crd_conversion,
                };
                tokio::spawn(crate::agnhost_webhook::serve(server, cfg));
            }
            Listener::SampleApiserver {
                container,
                cert_file,
                key_file,
            } => {
                let cfg = crate::sample_apiserver::Config {
                    cert_pem: self.read_file(&container, &cert_file).unwrap_or_default(),
                    key_pem: self.read_file(&container, &key_file).unwrap_or_default(),
                    container,
                };
                tokio::spawn(crate::sample_apiserver::serve(server, cfg));
            }
            Listener::MtlsServer {
                container,
                creds_file,
                trust_file,
            } => {
                let party = crate::mtls::Party {
                    cred_bundle: self.read_file(&container, &creds_file).unwrap_or_default(),
                    trust_bundle: self.read_file(&container, &trust_file).unwrap_or_default(),
                };
                tokio::spawn(crate::mtls::serve(server, party));
            }
            Listener::Porter {
                tls: Some(ref container),
                ..
            } => {
                let cert = self
                    .read_file(container, "/localhost.crt")
                    .unwrap_or_default();
                let key = self
                    .read_file(container, "/localhost.key")
                    .unwrap_or_default();
                tokio::spawn(crate::agnhost_webhook::serve_porter_tls(
                    server, cert, key, listener,
                ));
            }
            l => {
                tokio::spawn(crate::servers::serve_stream(server, l, Some(self.clone())));
            }
        }
        Ok(client)
    }

    /// Runs `f` over the state of the server in container `id` (`init` the first time).
    /// The address a pod in `namespace` resolves `name` to through the cluster zone, with
    /// the search path the kubelet gives it (`<namespace>.svc`, `svc`, the cluster domain).
    pub(crate) fn resolve_in(&self, namespace: &str, name: &str) -> Option<IpAddr> {
        if let Ok(ip) = name.parse() {
            return Some(ip);
        }
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let candidates = [
            format!("{name}.{namespace}.svc.{CLUSTER_DOMAIN}"),
            format!("{name}.svc.{CLUSTER_DOMAIN}"),
            format!("{name}.{CLUSTER_DOMAIN}"),
            name,
        ];
        let t = self.read();
        candidates.iter().find_map(|n| {
            t.zone.get(n)?.iter().find_map(|r| match r.data {
                crate::dns::RData::A(ip) => Some(ip),
                _ => None,
            })
        })
    }

    /// The pods on the network now, with their IPs.
    pub(crate) fn pods(&self) -> Vec<(IpAddr, Arc<Value>)> {
        self.read()
            .pods
            .iter()
            .flat_map(|(ip, pods)| pods.values().map(|p| (*ip, p.clone())))
            .collect()
    }

    /// Whether TCP to `frontend` can reach `target`: it is `target`, or a Service frontend
    /// with an endpoint there.
    pub(crate) fn routes_to(&self, frontend: SocketAddr, target: IpAddr) -> bool {
        frontend.ip() == target
            || self
                .read()
                .rules
                .get(&(frontend, Protocol::Tcp))
                .is_some_and(|eps| eps.iter().any(|e| e.ip() == target))
    }

    pub(crate) fn with_server_state<T>(
        &self,
        id: &str,
        init: impl FnOnce() -> Value,
        f: impl FnOnce(&mut Value) -> T,
    ) -> T {
        let mut all = self.server_state.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() > 4096 {
            all.clear();
        }
        f(all.entry(id.to_owned()).or_insert_with(init))
    }

    /// Whether what listens at `to` speaks TLS (agnhost's webhook servers, porter's TLS
    /// ports, sample-apiserver).
    pub fn serves_tls(&self, to: SocketAddr) -> bool {
        matches!(
            self.connect(to),
            Ok((
                _,
                Listener::AgnhostWebhook { .. }
                    | Listener::SampleApiserver { .. }
                    | Listener::MtlsServer { .. }
                    | Listener::Porter { tls: Some(_), .. }
            ))
        )
    }

    /// Adds a kubelet's runtime (see `runtimes`).
    pub fn add_runtime(&self, rt: Weak<dyn crate::runtime::Runtime>) {
        let mut all = self.runtimes.write().unwrap_or_else(|e| e.into_inner());
        all.retain(|r| r.strong_count() > 0);
        all.push(rt);
    }

    /// Adds `text` to the log of container `id`, in whichever runtime runs it.
    pub(crate) fn write_log(&self, id: &str, text: &str) {
        let all = self.runtimes.read().unwrap_or_else(|e| e.into_inner());
        for rt in all.iter().filter_map(Weak::upgrade) {
            rt.write_log(id, text);
        }
    }

    /// File `path` of container `id`, from whichever runtime runs it.
    pub(crate) fn read_file(&self, id: &str, path: &str) -> Option<String> {
        let all = self.runtimes.read().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .filter_map(Weak::upgrade)
            .find_map(|rt| rt.read_file(id, path))
    }
}

impl Tables {
    /// Recomputes the rule and name indexes from the Services.
    fn rebuild(&mut self) {
        self.rules.clear();
        self.affinity.clear();
        self.zone.clear();
        for e in self.services.values() {
            for r in &e.rules {
                self.rules
                    .entry((r.frontend, r.protocol))
                    .or_default()
                    .extend(r.endpoints.iter().copied());
                if let Some(t) = e.affinity {
                    self.affinity.insert((r.frontend, r.protocol), t);
                }
            }
            for r in &e.records {
                let at = self.zone.entry(r.name.clone()).or_default();
                if !at.contains(r) {
                    at.push(r.clone());
                }
            }
        }
    }
}

/// Whether pod `pod` runs a DNS server: a running container of a CoreDNS image that
/// declares port 53.
fn serves_dns(pod: &Value) -> bool {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            let image = c.get("image").and_then(Value::as_str).unwrap_or("");
            let repo = image.split(['@', ':']).next().unwrap_or(image);
            let declares = c
                .get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|p| p.get("containerPort").and_then(Value::as_u64) == Some(53));
            repo.rsplit('/').next() == Some("coredns") && declares
        })
}

/// The search list of a pod in `namespace` (what the kubelet writes in its resolv.conf
/// with `dnsPolicy: ClusterFirst`).
pub fn search_path(namespace: &str) -> Vec<String> {
    vec![
        format!("{namespace}.svc.{CLUSTER_DOMAIN}"),
        format!("svc.{CLUSTER_DOMAIN}"),
        CLUSTER_DOMAIN.to_owned(),
    ]
}

/// The cluster DNS Service's address (the kubelet's `clusterDNS`, kube-dns's ClusterIP).
pub const CLUSTER_DNS: &str = "10.96.0.10";

/// A kube-dns Service at [`CLUSTER_DNS`] backed by a CoreDNS pod, for tests of clients.
#[cfg(test)]
pub(crate) fn add_cluster_dns(dp: &Dataplane) {
    let pod: IpAddr = IpAddr::from([10, 244, 0, 2]);
    dp.set_pod(
        "coredns",
        pod,
        serde_json::json!({
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "spec": {"containers": [{"name": "coredns", "image": "registry.k8s.io/coredns/coredns:v1.12.1",
                "ports": [{"containerPort": 53, "protocol": "UDP"}, {"containerPort": 53, "protocol": "TCP"}]}]},
            "status": {"containerStatuses": [{"name": "coredns", "state": {"running": {}}}]}
        }),
    );
    let vip: IpAddr = CLUSTER_DNS.parse().unwrap_or(IpAddr::from([10, 96, 0, 10]));
    dp.set_service(
        "kube-system/kube-dns",
        ServiceEntry {
            rules: [Protocol::Udp, Protocol::Tcp]
                .into_iter()
                .map(|protocol| Rule {
                    frontend: SocketAddr::new(vip, 53),
                    protocol,
                    endpoints: vec![SocketAddr::new(pod, 53)],
                })
                .collect(),
            records: vec![Rr::new(
                "kube-dns.kube-system.svc.cluster.local",
                RData::A(vip),
            )],
            affinity: None,
        },
    );
}

/// Keeps the dataplane's record of this node's pods current: a watch of the pods bound
/// to `node`, each recorded at its pod IP as the API has it (the kubelet's own status
/// reports decide what runs). Runs until aborted.
pub async fn sync_pods(client: kube::Client, node: String, dataplane: Arc<Dataplane>) {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::watcher::{self, Event};
    let api: kube::Api<Pod> = kube::Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut known: Vec<String> = Vec::new();
    let mut listing: Vec<String> = Vec::new();
    let mut stream = watcher::watcher(api, cfg).boxed();
    let record = |dp: &Dataplane, p: &Pod| -> Option<String> {
        let uid = p.metadata.uid.clone()?;
        let ip = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|s| s.parse::<IpAddr>().ok());
        match (ip, serde_json::to_value(p)) {
            (Some(ip), Ok(v)) if p.metadata.deletion_timestamp.is_none() => dp.set_pod(&uid, ip, v),
            _ => dp.remove_pod(&uid),
        }
        Some(uid)
    };
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(p)) => listing.extend(record(&dataplane, &p)),
            Ok(Event::InitDone) => {
                for uid in known.iter().filter(|u| !listing.contains(u)) {
                    dataplane.remove_pod(uid);
                }
                known = std::mem::take(&mut listing);
            }
            Ok(Event::Apply(p)) => {
                if let Some(uid) = record(&dataplane, &p) {
                    if !known.contains(&uid) {
                        known.push(uid);
                    }
                }
            }
            Ok(Event::Delete(p)) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    dataplane.remove_pod(uid);
                    known.retain(|u| u != uid);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "pod watch for the dataplane");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(test)]
mod hosted_tests {
    use super::repository;

    #[test]
    fn repositories_of_images() {
        assert_eq!(
            repository("registry.k8s.io/metrics-server/metrics-server:v0.8.0"),
            "registry.k8s.io/metrics-server/metrics-server"
        );
        assert_eq!(repository("localhost:5000/x"), "localhost:5000/x");
        assert_eq!(repository("nginx@sha256:abc"), "nginx");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nginx_pod(name: &str) -> Value {
        serde_json::json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "nginx", "image": "nginx:1.29", "ports": [{"containerPort": 80}]}]},
            "status": {"containerStatuses": [{"name": "nginx", "state": {"running": {}}}]}
        })
    }

    #[tokio::test]
    async fn dial_hands_out_a_connection_the_listener_answers() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dp = Arc::new(Dataplane::default());
        let ip: IpAddr = [10, 244, 0, 9].into();
        let pod = serde_json::json!({
            "metadata": {"name": "hostname-1"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
                "args": ["serve-hostname"], "ports": [{"containerPort": 9376}]}]},
            "status": {"containerStatuses": [{"name": "c", "state": {"running": {}}}]}
        });
        dp.set_pod("u1", ip, pod);
        let mut conn = dp.dial(SocketAddr::new(ip, 9376)).expect("a listener");
        conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("written");
        let mut answer = String::new();
        conn.read_to_string(&mut answer).await.expect("read");
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nhostname-1"), "{answer}");
        let refused = dp.dial(SocketAddr::new(ip, 80)).map(|_| ()).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        let nobody = dp
            .dial(([10, 244, 9, 9], 80).into())
            .map(|_| ())
            .unwrap_err();
        assert_eq!(nobody.to_string(), "no route to host");
    }

    #[test]
    fn services_route_to_ready_endpoints_and_names_resolve_by_search_path() {
        let dp = Dataplane::default();
        let ip: IpAddr = "10.244.0.5".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
        dp.set_pod("u1", ip, nginx_pod("hello-1"));
        let vip: SocketAddr = ([10, 96, 0, 20], 80).into();
        dp.set_service(
            "default/hello",
            ServiceEntry {
                rules: vec![Rule {
                    frontend: vip,
                    protocol: Protocol::Tcp,
                    endpoints: vec![SocketAddr::new(ip, 80)],
                }],
                records: vec![crate::dns::Rr::new(
                    "hello.default.svc.cluster.local",
                    crate::dns::RData::A(vip.ip()),
                )],
                affinity: None,
            },
        );
        let default = search_path("default");
        let other = search_path("other");
        assert_eq!(dp.resolve("hello", &default), Some(vec![vip.ip()]));
        assert_eq!(dp.resolve("hello", &other), None);
        assert_eq!(dp.resolve("hello.default", &other), Some(vec![vip.ip()]));
        assert_eq!(
            dp.resolve("hello.default.svc.cluster.local", &other),
            Some(vec![vip.ip()])
        );
        let (ep, l) = dp
            .connect(vip)
            .map_err(|e| format!("{e:?}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ep, SocketAddr::new(ip, 80));
        assert_eq!(l, Listener::Nginx(Some("1.29".into())));
        assert_eq!(
            dp.connect(SocketAddr::new(ip, 81)),
            Err(ConnectError::Refused)
        );
        assert_eq!(
            dp.connect(([10, 96, 0, 20], 81).into()),
            Err(ConnectError::Refused)
        );
        assert_eq!(
            dp.connect(([10, 1, 2, 3], 80).into()),
            Err(ConnectError::Unreachable)
        );
        dp.set_service(
            "default/hello",
            ServiceEntry {
                rules: vec![Rule {
                    frontend: vip,
                    protocol: Protocol::Tcp,
                    endpoints: vec![],
                }],
                records: vec![crate::dns::Rr::new(
                    "hello.default.svc.cluster.local",
                    crate::dns::RData::A(vip.ip()),
                )],
                affinity: None,
            },
        );
        assert_eq!(dp.connect(vip), Err(ConnectError::Refused));
        dp.remove_service("default/hello");
        assert_eq!(dp.resolve("hello", &default), None);
    }

    #[test]
    fn host_ports_follow_their_host_ip_and_protocol_and_loopback_is_the_clients() {
        let dp = Dataplane::default();
        let node: IpAddr = [10, 0, 0, 11].into();
        dp.set_node("n1", vec![node]);
        let hostport = |name: &str, host_ip: &str, protocol: &str| {
            serde_json::json!({
                "metadata": {"name": name},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "nginx:1.29",
                    "ports": [{"containerPort": 80, "hostPort": 54323, "hostIP": host_ip, "protocol": protocol}]}]},
                "status": {"containerStatuses": [{"name": "c", "state": {"running": {}}}]}})
        };
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            [10, 244, 0, 5].into(),
            [10, 244, 0, 6].into(),
            [10, 244, 0, 7].into(),
        );
        dp.set_pod("a", a, hostport("on-loopback", "127.0.0.1", "TCP"));
        dp.set_pod("b", b, hostport("on-node", "10.0.0.11", "TCP"));
        dp.set_pod("c", c, hostport("on-node-udp", "10.0.0.11", "UDP"));
        let t = dp.read();
        let at = |from: IpAddr, to: SocketAddr, proto| dp.route(&t, Some(from), to, proto);
        let loopback: SocketAddr = ([127, 0, 0, 1], 54323).into();
        let on_node = SocketAddr::new(node, 54323);
        // A host-network client (the node's address) reaches each by its hostIP.
        assert_eq!(
            at(node, loopback, Protocol::Tcp),
            Some(SocketAddr::new(a, 80))
        );
        assert_eq!(
            at(node, on_node, Protocol::Tcp),
            Some(SocketAddr::new(b, 80))
        );
        assert_eq!(
            at(node, on_node, Protocol::Udp),
            Some(SocketAddr::new(c, 80))
        );
        // A pod's loopback is its own, whatever the node publishes.
        let pod: IpAddr = [10, 244, 0, 9].into();
        assert_eq!(
            at(pod, loopback, Protocol::Tcp),
            Some(SocketAddr::new(pod, 54323))
        );
        // A pod reaches the node's published ports at the node's address.
        assert_eq!(
            at(pod, on_node, Protocol::Tcp),
            Some(SocketAddr::new(b, 80))
        );
        // A port nobody publishes stays the node's.
        let other = SocketAddr::new(node, 54324);
        assert_eq!(at(pod, other, Protocol::Tcp), Some(other));
    }

    #[test]
    fn client_ip_affinity_keeps_a_client_on_its_endpoint() {
        let dp = Dataplane::default();
        let (a, b): (IpAddr, IpAddr) = ([10, 244, 0, 5].into(), [10, 244, 0, 6].into());
        dp.set_pod("u1", a, nginx_pod("a"));
        dp.set_pod("u2", b, nginx_pod("b"));
        let vip: SocketAddr = ([10, 96, 0, 30], 80).into();
        let entry = |affinity| ServiceEntry {
            rules: vec![Rule {
                frontend: vip,
                protocol: Protocol::Tcp,
                endpoints: vec![SocketAddr::new(a, 80), SocketAddr::new(b, 80)],
            }],
            records: Vec::new(),
            affinity,
        };
        dp.set_service(
            "default/s",
            entry(Some(std::time::Duration::from_secs(10800))),
        );
        let client: IpAddr = [10, 244, 0, 9].into();
        let got: Vec<SocketAddr> = (0..6)
            .filter_map(|_| dp.connect_from(Some(client), vip).ok().map(|(ep, _)| ep))
            .collect();
        assert_eq!(got.len(), 6);
        assert!(got.iter().all(|e| *e == got[0]), "{got:?}");
        // Without affinity (or without a client address) the endpoints take turns.
        dp.set_service("default/s", entry(None));
        let got: std::collections::BTreeSet<SocketAddr> = (0..4)
            .filter_map(|_| dp.connect_from(Some(client), vip).ok().map(|(ep, _)| ep))
            .collect();
        assert_eq!(got.len(), 2);
    }
}
