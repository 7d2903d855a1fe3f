//! `pods/proxy` and `services/proxy`: HTTP requests forwarded to a pod, as kube-apiserver
//! does it, by dialing the pod's IP directly (a service's request goes to one of its ready
//! endpoints that is a pod of the service's namespace). The kubelet is not involved.
//!
//! The object names take upstream's `[scheme:]name[:port]` forms; a pod without a port
//! gets its first container port, a service port given by number is looked up by name in
//! the endpoint slices. Errors are kube-apiserver's: `address not allowed` for a pod
//! without a routable IP, 503 `no endpoints available for service "x"`, and a 503
//! `error trying to reach service: dial tcp ...` with Go's wording when the backend cannot
//! be reached (what a simulated pod's IP gives). Requests and answers pass through with
//! the hop-by-hop and CORS headers dropped, `X-Forwarded-Uri` added and a backend's
//! same-host redirects rewritten to stay under the proxy path.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kumo_apimachinery::status::ApiError;
use serde_json::Value;

use crate::auth::Attributes;
use crate::handler::{Body, State};

/// The address of the client a request came from (set by the server on each request).
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub std::net::SocketAddr);

/// How long a dial to a backend may take (kube-apiserver's proxy dialer timeout).
const DIAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The label tying an EndpointSlice to its service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Whether the request is a pods/proxy or services/proxy request this module answers.
pub fn handles(attrs: &Attributes) -> bool {
    attrs.resource_request
        && attrs.api_group.is_empty()
        && attrs.api_version == "v1"
        && !attrs.name.is_empty()
        && !attrs.namespace.is_empty()
        && attrs.subresource == "proxy"
        && matches!(attrs.resource.as_str(), "pods" | "services")
}

/// Answers a proxy request; `attrs` were authorized already.
pub async fn serve(state: Arc<State>, attrs: Attributes, req: Request<Incoming>) -> Response<Body> {
    match serve_inner(&state, &attrs, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(e.to_status().to_string())).boxed());
    *r.status_mut() = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn service_unavailable(message: String) -> ApiError {
    ApiError {
        code: 503,
        reason: "ServiceUnavailable",
        message,
        details: None,
    }
}

/// Where a request goes.
#[derive(Debug, PartialEq)]
struct Target {
    https: bool,
    host: String,
    /// As given: a number, or a name Go would look up (`http`).
    port: String,
}

/// The 503 of a backend the proxy cannot reach, worded as Go's dialer.
fn unreachable(why: String) -> ApiError {
    service_unavailable(format!("error trying to reach service: {why}"))
}

impl Target {
    /// The port to dial: a number, or `http`/`https` (and none) as Go looks them up.
    fn port_number(&self) -> Result<u16, ApiError> {
        match self.port.as_str() {
            "" if self.https => Ok(443),
            "" | "http" => Ok(80),
            "https" => Ok(443),
            p => p
                .parse()
                .map_err(|_| unreachable(format!("dial tcp: lookup tcp/{p}: unknown port"))),
        }
    }

    fn host_port(&self) -> String {
        let port = match self.port.as_str() {
            "" if self.https => "443",
            "" => "80",
            p => p,
        };
        if self.host.contains(':') {
            format!("[{}]:{port}", self.host)
        } else {
            format!("{}:{port}", self.host)
        }
    }
}

/// Upstream's SplitSchemeNamePort: `name`, `name:port` or `scheme:name:port`, with scheme
/// `http`, `https` or empty and a non-empty name.
fn split_scheme_name_port(id: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [n] => ("", *n, ""),
        [n, p] => ("", *n, *p),
        [s, n, p] => (*s, *n, *p),
        _ => return None,
    };
    (!name.is_empty() && matches!(scheme, "" | "http" | "https")).then_some((scheme, name, port))
}

/// Go's ParseIPSloppy: an IP, IPv4 octets with leading zeros allowed.
fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    let octets: Vec<u8> = s
        .split('.')
        .map(|p| {
            if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                None
            } else {
                p.parse().ok()
            }
        })
        .collect::<Option<_>>()?;
    let o: [u8; 4] = octets.try_into().ok()?;
    Some(IpAddr::from(o))
}

/// Go's net.IP.IsGlobalUnicast.
fn is_global_unicast(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            !v4.is_broadcast()
                && !v4.is_unspecified()
                && !v4.is_loopback()
                && !v4.is_multicast()
                && !v4.is_link_local()
        }
        IpAddr::V6(v6) => {
            !v6.is_unspecified()
                && !v6.is_loopback()
                && !v6.is_multicast()
                && (v6.segments()[0] & 0xffc0) != 0xfe80
        }
    }
}

async fn read_object(
    state: &State,
    group: &str,
    plural: &str,
    ns: &str,
    name: &str,
) -> Result<Value, ApiError> {
    let res = state
        .registry
        .find(group, "v1", plural)
        .ok_or_else(ApiError::path_not_found)?;
    let (kv, _) = state
        .rest
        .store
        .get(res.key(Some(ns), name).as_bytes(), None)
        .await
        .map_err(ApiError::internal)?;
    let kv = kv.ok_or_else(|| ApiError::not_found(&res.group_resource(), name))?;
    serde_json::from_slice(&kv.value).map_err(ApiError::internal)
}

/// The pod's location, as upstream's pod ResourceLocation.
async fn pod_location(state: &State, ns: &str, id: &str) -> Result<Target, ApiError> {
    let (scheme, name, port) = split_scheme_name_port(id)
        .ok_or_else(|| ApiError::bad_request(format!("invalid pod request {id:?}")))?;
    let pod = read_object(state, "", "pods", ns, name).await?;
    let mut port = port.to_owned();
    if port.is_empty() {
        let containers = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if let Some(p) = containers.iter().find_map(|c| {
            c.pointer("/ports/0/containerPort")
                .and_then(Value::as_i64)
                .map(|p| p.to_string())
        }) {
            port = p;
        }
    }
    let ip = pod
        .pointer("/status/podIPs/0/ip")
        .and_then(Value::as_str)
        .unwrap_or("");
    let host = match parse_ip_sloppy(ip) {
        Some(addr) if is_global_unicast(addr) => ip.to_owned(),
        _ => return Err(ApiError::bad_request("address not allowed")),
    };
    Ok(Target {
        https: scheme == "https",
        host,
        port,
    })
}

/// A few random bits (which slice and endpoint a service request starts at).
fn random() -> usize {
    let b = uuid::Uuid::new_v4().into_bytes();
    usize::from(b[0]) << 8 | usize::from(b[1])
}

/// The service's location, as upstream's service ResourceLocation with RandomEndpoint.
async fn service_location(state: &State, ns: &str, id: &str) -> Result<Target, ApiError> {
    let (scheme, name, port) = split_scheme_name_port(id)
        .ok_or_else(|| ApiError::bad_request(format!("invalid service request {id:?}")))?;
    let mut port_name = port.to_owned();
    // A port number names the service port it belongs to.
    if let Ok(number) = port.parse::<i64>() {
        let svc = read_object(state, "", "services", ns, name).await?;
        let ports = svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        match ports
            .iter()
            .find(|p| p.get("port").and_then(Value::as_i64) == Some(number))
        {
            Some(p) => {
                port_name = p
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned()
            }
            None => {
                return Err(service_unavailable(format!(
                    "no service port {number} found for service {name:?}"
                )))
            }
        }
    }
    let no_endpoints =
        || service_unavailable(format!("no endpoints available for service {name:?}"));
    let res = state
        .registry
        .find("discovery.k8s.io", "v1", "endpointslices")
        .ok_or_else(no_endpoints)?;
    let range = state
        .rest
        .store
        .range(kumo_storage::RangeRequest {
            prefix: res.key_prefix(Some(ns)).into_bytes(),
            start: None,
            limit: 0,
            revision: None,
        })
        .await
        .map_err(ApiError::internal)?;
    let mut slices: Vec<Value> = range
        .kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice::<Value>(&kv.value).ok())
        .filter(|s| {
            s.pointer("/metadata/labels")
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .and_then(Value::as_str)
                == Some(name)
        })
        .collect();
    if slices.is_empty() {
        return Err(no_endpoints());
    }
    // A random order, the primary family (IPv4 here) first.
    let seed = random();
    let len = slices.len();
    slices.rotate_left(seed % len);
    slices.sort_by_key(|s| s.get("addressType").and_then(Value::as_str) != Some("IPv4"));
    for slice in &slices {
        let ports = slice
            .get("ports")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let endpoints = slice
            .get("endpoints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for p in &ports {
            // A port without a name (null) matches no service port name.
            if p.get("name").and_then(Value::as_str) != Some(port_name.as_str()) {
                continue;
            }
            let Some(number) = p.get("port").and_then(Value::as_i64) else {
                continue;
            };
            if endpoints.is_empty() {
                continue;
            }
            let offset = random() % endpoints.len();
            for i in 0..endpoints.len() {
                let ep = &endpoints[(i + offset) % endpoints.len()];
                if ep.pointer("/conditions/ready") == Some(&Value::Bool(false)) {
                    continue;
                }
                let Some(addr) = ep.pointer("/addresses/0").and_then(Value::as_str) else {
                    continue;
                };
                if !endpoint_is_pod(state, ns, ep, addr).await {
                    continue;
                }
                return Ok(Target {
                    https: scheme == "https",
                    host: addr.to_owned(),
                    port: number.to_string(),
                });
            }
        }
    }
    Err(no_endpoints())
}

/// Upstream's isValidAddress: the endpoint is a pod of the namespace that has the address.
async fn endpoint_is_pod(state: &State, ns: &str, ep: &Value, addr: &str) -> bool {
    let Some(target) = ep.get("targetRef").filter(|t| t.is_object()) else {
        return false;
    };
    if target
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        != ns
    {
        return false;
    }
    let pod_name = target.get("name").and_then(Value::as_str).unwrap_or("");
    let Ok(pod) = read_object(state, "", "pods", ns, pod_name).await else {
        return false;
    };
    pod.pointer("/status/podIPs")
        .and_then(Value::as_array)
        .is_some_and(|ips| {
            ips.iter()
                .any(|i| i.get("ip").and_then(Value::as_str) == Some(addr))
        })
}

/// The part of the request path after `.../proxy` ("" when there is none).
fn proxy_suffix(path: &str) -> (&str, &str) {
    // /api/v1/namespaces/<ns>/<plural>/<name>/proxy[/...]
    let mut slashes = path.match_indices('/').map(|(i, _)| i);
    match slashes.nth(7) {
        Some(i) => (&path[..i], &path[i..]),
        None => (path, ""),
    }
}

/// Go's path.Clean of a non-empty path, keeping a trailing slash as
/// JoinPreservingTrailingSlash does; "" stays "".
fn clean_path(p: &str) -> String {
    if p.is_empty() {
        return String::new();
    }
    let mut out: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let mut cleaned = format!("/{}", out.join("/"));
    if p.ends_with('/') && !cleaned.ends_with('/') {
        cleaned.push('/');
    }
    cleaned
}

/// Headers that concern one connection only (Go's ReverseProxy drops them both ways).
pub(crate) fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "proxy-connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Whether a request asks to switch protocols (upstream's httpstream.IsUpgradeRequest).
pub(crate) fn is_upgrade(headers: &http::HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Go's error text for a failed connect: `connect: connection refused` and the like
/// (the OS's message without Rust's `(os error N)`, lower-cased as Go spells errnos).
fn go_dial_error(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match text.find(" (os error") {
        Some(i) => &text[..i],
        None => &text,
    };
    let mut chars = text.chars();
    let lower = match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    };
    format!("connect: {lower}")
}

async fn serve_inner(
    state: &State,
    attrs: &Attributes,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    const METHODS: [Method; 7] = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        Method::HEAD,
        Method::OPTIONS,
    ];
    if !METHODS.contains(req.method()) {
        // No route for other methods: the router's 405.
        return Err(ApiError {
            code: 405,
            reason: "MethodNotAllowed",
            message: "the server does not allow this method on the requested resource".into(),
            details: Some(Box::default()),
        });
    }
    let target = if attrs.resource == "pods" {
        pod_location(state, &attrs.namespace, &attrs.name).await?
    } else {
        service_location(state, &attrs.namespace, &attrs.name).await?
    };
    let raw_path = req.uri().path().to_owned();
    let (prefix, suffix) = proxy_suffix(&raw_path);
    let mut path = clean_path(suffix);
    if !path.ends_with('/') && raw_path.ends_with('/') {
        path.push('/');
    }
    let query = req.uri().query().map(str::to_owned);
    if path.is_empty() && matches!(*req.method(), Method::GET | Method::HEAD) {
        // Upstream redirects an empty path to one ending in '/'.
        let location = match &query {
            Some(q) if !q.is_empty() => format!("{raw_path}/?{q}"),
            _ => format!("{raw_path}/"),
        };
        let mut r = Response::new(Full::new(Bytes::new()).boxed());
        *r.status_mut() = StatusCode::MOVED_PERMANENTLY;
        if let Ok(v) = HeaderValue::from_str(&location) {
            r.headers_mut().insert(header::LOCATION, v);
        }
        return Ok(r);
    }
    let mut forwarded_uri = clean_path(&format!("{prefix}{path}"));
    if path.is_empty() {
        forwarded_uri = clean_path(prefix);
    }
    forward(
        state,
        &target,
        &path,
        query.as_deref(),
        prefix,
        &forwarded_uri,
        req,
    )
    .await
}

/// A network the pods live on that the host does not route to: the simulated pod network
/// of `kumo up`, whose pod IPs must never be dialed on the host. The API server's pod and
/// service proxies connect through it when one is set.
pub trait PodNetwork: Send + Sync + std::fmt::Debug {
    /// A connection to `to` (a pod IP and port), or the dial error (`connection refused`,
    /// `no route to host`) as the I/O error's kind.
    fn connect(&self, to: std::net::SocketAddr) -> std::io::Result<tokio::io::DuplexStream>;

    /// Whether what listens at `to` speaks TLS (an `https:` proxy to anything else fails
    /// as Go's client does on a plain answer).
    fn serves_tls(&self, _to: std::net::SocketAddr) -> bool {
        false
    }
}

/// A TLS client that accepts any backend certificate: kube-apiserver's proxy transport
/// does not verify pods and Services either.
fn backend_tls() -> Result<tokio_rustls::TlsConnector, ApiError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(ApiError::internal)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(crate::proxy::AnyServer(provider)))
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(tls)))
}

/// HTTP/1.1 over `io`, the connection driven by a task of its own.
async fn http1_over<S>(io: S) -> Result<hyper::client::conn::http1::SendRequest<Incoming>, ApiError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "proxied connection ended");
        }
    });
    Ok(sender)
}

/// Connects to the backend (TLS for `https:`), through the pod network when there is one.
async fn connect(
    state: &State,
    target: &Target,
) -> Result<hyper::client::conn::http1::SendRequest<Incoming>, ApiError> {
    if let Some(net) = &state.pod_network {
        return connect_through(net.as_ref(), target).await;
    }
    let host_port = target.host_port();
    let port = target.port_number()?;
    let tcp = tokio::time::timeout(
        DIAL_TIMEOUT,
        tokio::net::TcpStream::connect((target.host.as_str(), port)),
    )
    .await
    .map_err(|_| unreachable(format!("dial tcp {host_port}: i/o timeout")))?
    .map_err(|e| unreachable(format!("dial tcp {host_port}: {}", go_dial_error(&e))))?;
    let _ = tcp.set_nodelay(true);
    if target.https {
        let name = rustls::pki_types::ServerName::try_from(target.host.clone())
            .map_err(|e| unreachable(e.to_string()))?;
        let stream = backend_tls()?
            .connect(name, tcp)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        http1_over(stream).await
    } else {
        http1_over(tcp).await
    }
}

/// [`connect`] over a [`PodNetwork`] (TLS only to the simulated servers that speak it).
async fn connect_through(
    net: &dyn PodNetwork,
    target: &Target,
) -> Result<hyper::client::conn::http1::SendRequest<Incoming>, ApiError> {
    let host_port = target.host_port();
    let port = target.port_number()?;
    let ip: std::net::IpAddr = target
        .host
        .parse()
        .map_err(|_| unreachable(format!("dial tcp {host_port}: no such host")))?;
    let stream = net
        .connect(std::net::SocketAddr::new(ip, port))
        .map_err(|e| unreachable(format!("dial tcp {host_port}: {}", go_dial_error(&e))))?;
    if target.https {
        if !net.serves_tls(std::net::SocketAddr::new(ip, port)) {
            return Err(unreachable(format!(
                "dial tcp {host_port}: tls: first record does not look like a TLS handshake"
            )));
        }
        let name = rustls::pki_types::ServerName::try_from(target.host.clone())
            .map_err(|e| unreachable(e.to_string()))?;
        let tls = backend_tls()?
            .connect(name, stream)
            .await
            .map_err(|e| unreachable(format!("dial tcp {host_port}: {e}")))?;
        return http1_over(tls).await;
    }
    http1_over(stream).await
}

/// A backend's redirect, kept under the proxy path when it points at the same host
/// (upstream's Transport.rewriteURL).
fn rewrite_location(location: &str, backend: &str, front_host: &str, prefix: &str) -> String {
    let after_scheme = location
        .strip_prefix("http:")
        .or_else(|| location.strip_prefix("https:"))
        .unwrap_or(location);
    let (host, rest) = match after_scheme.strip_prefix("//") {
        Some(after) => match after.find(['/', '?', '#']) {
            Some(i) => (&after[..i], &after[i..]),
            None => (after, ""),
        },
        None => ("", after_scheme),
    };
    let different_host = !host.is_empty() && host != backend && host != front_host;
    if different_host || !rest.starts_with('/') {
        return location.to_owned();
    }
    let (path, tail) = match rest.find(['?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = escape_path(&unescape_percent(path));
    if path.starts_with(prefix) {
        return format!("{path}{tail}");
    }
    let mut joined = clean_path(&format!("{prefix}{path}"));
    if path.ends_with('/') && !joined.ends_with('/') {
        joined.push('/');
    }
    format!("{joined}{tail}")
}

/// A URL path with its %XX escapes decoded (invalid ones kept).
fn unescape_percent(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Go's escaping of a URL path (url.URL.EscapedPath).
fn escape_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'_'
                    | b'.'
                    | b'~'
                    | b'$'
                    | b'&'
                    | b'+'
                    | b','
                    | b'/'
                    | b':'
                    | b';'
                    | b'='
                    | b'@'
            )
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The attributes that hold URLs, by tag (upstream's atomsToAttrs).
fn url_attributes(tag: &str) -> &'static [&'static str] {
    match tag {
        "a" | "area" | "base" | "link" => &["href"],
        "applet" => &["codebase"],
        "audio" | "embed" | "script" | "source" => &["src"],
        "blockquote" | "del" | "ins" | "q" => &["cite"],
        "body" => &["background"],
        "button" => &["formaction"],
        "command" => &["icon"],
        "form" => &["action"],
        "frame" | "iframe" => &["longdesc", "src"],
        "head" => &["profile"],
        "html" => &["manifest"],
        "img" => &["longdesc", "src", "usemap"],
        "input" => &["src", "usemap", "formaction"],
        "object" => &["classid", "codebase", "data", "usemap"],
        "video" => &["poster", "src"],
        _ => &[],
    }
}

/// Elements whose content is text, not markup, to the HTML tokenizer.
const RAW_TEXT: [&str; 10] = [
    "iframe",
    "noembed",
    "noframes",
    "noscript",
    "plaintext",
    "script",
    "style",
    "textarea",
    "title",
    "xmp",
];

/// The character references an attribute value commonly holds, decoded.
fn unescape_html(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut rest = v;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let Some(end) = rest.find(';').filter(|e| *e <= 10) else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let entity = &rest[1..end];
        let ch = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            e if e.starts_with("#x") || e.starts_with("#X") => u32::from_str_radix(&e[2..], 16)
                .ok()
                .and_then(char::from_u32),
            e if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match ch {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Go's html escaping of an attribute value.
fn escape_html(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '\'' => out.push_str("&#39;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\r' => out.push_str("&#13;"),
            c => out.push(c),
        }
    }
    out
}

/// One start tag at the start of `b` (`<name ...>`): its lower-cased name, attributes,
/// whether it closes itself, and its length.
#[allow(clippy::type_complexity)]
fn parse_tag(b: &[u8]) -> Option<(String, Vec<(String, String)>, bool, usize)> {
    let mut i = 1;
    let start = i;
    while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'/' && b[i] != b'>' {
        i += 1;
    }
    let name = String::from_utf8_lossy(&b[start..i]).to_ascii_lowercase();
    let mut attrs = Vec::new();
    let mut self_closing = false;
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        match b.get(i)? {
            b'>' => return Some((name, attrs, self_closing, i + 1)),
            b'/' => {
                self_closing = b.get(i + 1) == Some(&b'>');
                i += 1;
                continue;
            }
            _ => {}
        }
        self_closing = false;
        let k = i;
        while i < b.len() && !b[i].is_ascii_whitespace() && !matches!(b[i], b'=' | b'>' | b'/') {
            i += 1;
        }
        let key = String::from_utf8_lossy(&b[k..i]).to_ascii_lowercase();
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = String::new();
        if b.get(i) == Some(&b'=') {
            i += 1;
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            match b.get(i)? {
                q @ (b'"' | b'\'') => {
                    let q = *q;
                    let v = i + 1;
                    let len = b[v..].iter().position(|c| *c == q)?;
                    value = unescape_html(&String::from_utf8_lossy(&b[v..v + len]));
                    i = v + len + 1;
                }
                _ => {
                    let v = i;
                    while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'>' {
                        i += 1;
                    }
                    value = unescape_html(&String::from_utf8_lossy(&b[v..i]));
                }
            }
        }
        attrs.push((key, value));
    }
}

/// Upstream's rewriteHTML: the start tags that carry URLs are written again with
/// `rewrite` applied to those URLs; everything else is copied as it is.
fn rewrite_html(page: &[u8], rewrite: &dyn Fn(&str) -> String) -> Vec<u8> {
    let mut out = Vec::with_capacity(page.len() + 256);
    let mut i = 0;
    while i < page.len() {
        let Some(lt) = page[i..].iter().position(|c| *c == b'<') else {
            out.extend_from_slice(&page[i..]);
            break;
        };
        out.extend_from_slice(&page[i..i + lt]);
        i += lt;
        let rest = &page[i..];
        let skip_to = |from: usize, end: &[u8]| -> usize {
            rest[from..]
                .windows(end.len())
                .position(|w| w == end)
                .map_or(rest.len(), |p| from + p + end.len())
        };
        let len = if rest.starts_with(b"<!--") {
            skip_to(4, b"-->")
        } else if rest.len() > 1 && matches!(rest[1], b'!' | b'?' | b'/') {
            skip_to(1, b">")
        } else if rest.len() > 1 && rest[1].is_ascii_alphabetic() {
            match parse_tag(rest) {
                Some((name, mut attrs, self_closing, len)) => {
                    let urls = url_attributes(&name);
                    if urls.is_empty() {
                        out.extend_from_slice(&rest[..len]);
                    } else {
                        for (k, v) in attrs.iter_mut() {
                            if urls.contains(&k.as_str()) {
                                *v = rewrite(v);
                            }
                        }
                        let mut tag = format!("<{name}");
                        for (k, v) in &attrs {
                            tag.push_str(&format!(" {k}=\"{}\"", escape_html(v)));
                        }
                        tag.push_str(if self_closing { "/>" } else { ">" });
                        out.extend_from_slice(tag.as_bytes());
                    }
                    i += len;
                    if RAW_TEXT.contains(&name.as_str()) && !self_closing {
                        // Raw text up to the element's end tag.
                        let close = format!("</{name}");
                        let body = &page[i..];
                        let end = body
                            .windows(close.len())
                            .position(|w| w.eq_ignore_ascii_case(close.as_bytes()))
                            .unwrap_or(body.len());
                        out.extend_from_slice(&body[..end]);
                        i += end;
                    }
                    continue;
                }
                None => rest.len(),
            }
        } else {
            1
        };
        out.extend_from_slice(&rest[..len]);
        i += len;
    }
    out
}

async fn forward(
    state: &State,
    target: &Target,
    path: &str,
    query: Option<&str>,
    prefix: &str,
    forwarded_uri: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let mut sender = connect(state, target).await?;
    let mut req = req;
    // An upgrade (WebSocket, SPDY) is passed through once the backend switches protocols.
    let upgrade = is_upgrade(req.headers());
    let front_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut uri = if path.is_empty() {
        "/".to_owned()
    } else {
        path.to_owned()
    };
    if let Some(q) = query {
        uri.push('?');
        uri.push_str(q);
    }
    // The Host header stays the client's, as Go's ReverseProxy leaves it.
    let front_host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| parts.uri.authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let mut out = Request::builder().method(parts.method.clone()).uri(uri);
    // Headers the Connection header names are hop-by-hop too.
    let listed: Vec<String> = parts
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    for (k, v) in &parts.headers {
        let name = k.as_str();
        // The credentials were the API server's to check, not the backend's.
        let dropped = hop_by_hop(name)
            || listed.iter().any(|l| l == name)
            || name == "host"
            || name == "authorization"
            || (name == "x-forwarded-for" && parts.extensions.get::<ClientAddr>().is_some())
            || name.starts_with("impersonate-");
        if !dropped {
            out = out.header(k, v);
        }
    }
    if upgrade {
        for k in [header::CONNECTION, header::UPGRADE] {
            for v in parts.headers.get_all(&k) {
                out = out.header(&k, v);
            }
        }
    }
    if !front_host.is_empty() {
        out = out.header(header::HOST, front_host.as_str());
    }
    out = out.header("X-Forwarded-Uri", forwarded_uri);
    // Go's ReverseProxy appends the client to X-Forwarded-For.
    if let Some(ClientAddr(peer)) = parts.extensions.get::<ClientAddr>() {
        let ip = peer.ip().to_canonical().to_string();
        let prior: Vec<&str> = parts
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let value = if prior.is_empty() {
            ip
        } else {
            format!("{}, {ip}", prior.join(", "))
        };
        out = out.header("X-Forwarded-For", value);
    }
    let out = out.body(body).map_err(ApiError::internal)?;
    let resp = sender
        .send_request(out)
        .await
        .map_err(|e| service_unavailable(format!("error trying to reach service: {e}")))?;
    if let (Some(front), StatusCode::SWITCHING_PROTOCOLS) = (front_upgrade, resp.status()) {
        let mut resp = resp;
        let backend = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            if let (Ok(f), Ok(b)) = (front.await, backend.await) {
                let (mut f, mut b) = (TokioIo::new(f), TokioIo::new(b));
                let _ = tokio::io::copy_bidirectional(&mut f, &mut b).await;
            }
        });
        let mut r = Response::new(Full::new(Bytes::new()).boxed());
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *r.headers_mut() = resp.headers().clone();
        return Ok(r);
    }
    let (rparts, mut rbody) = resp.into_parts();
    let mut r = Response::new(Full::new(Bytes::new()).boxed());
    *r.status_mut() = rparts.status;
    let backend = target.host_port();
    for (k, v) in &rparts.headers {
        let name = k.as_str();
        if hop_by_hop(name) || name.starts_with("access-control-allow-") {
            continue;
        }
        if name == "location" {
            if let Some(l) = v
                .to_str()
                .ok()
                .map(|l| rewrite_location(l, &backend, &front_host, prefix))
            {
                if let Ok(hv) = HeaderValue::from_str(&l) {
                    r.headers_mut().append(k, hv);
                    continue;
                }
            }
        }
        r.headers_mut().append(k, v.clone());
    }
    if parts.method == Method::HEAD {
        return Ok(r);
    }
    // An HTML page (not a redirect) gets its links kept under the proxy path, as
    // upstream's rewriting transport does; encoded pages pass as they are.
    let html = !rparts.headers.contains_key(header::LOCATION)
        && rparts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.split(';').next().unwrap_or("").trim() == "text/html")
        && rparts
            .headers
            .get(header::CONTENT_ENCODING)
            .is_none_or(|e| e.is_empty());
    if html {
        let mut page = Vec::new();
        while let Some(Ok(f)) = rbody.frame().await {
            if let Ok(d) = f.into_data() {
                page.extend_from_slice(&d);
            }
        }
        let rewritten = rewrite_html(&page, &|u| {
            rewrite_location(u, &backend, &front_host, prefix)
        });
        r.headers_mut().remove(header::CONTENT_LENGTH);
        let (head, _) = r.into_parts();
        return Ok(Response::from_parts(
            head,
            Full::new(Bytes::from(rewritten)).boxed(),
        ));
    }
    // Stream the answer as it comes.
    let streamed = crate::handler::relay(rbody, ());
    let (head, _) = r.into_parts();
    Ok(Response::from_parts(head, streamed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ports() {
        assert_eq!(split_scheme_name_port("web"), Some(("", "web", "")));
        assert_eq!(split_scheme_name_port("web:80"), Some(("", "web", "80")));
        assert_eq!(
            split_scheme_name_port("https:web:443"),
            Some(("https", "web", "443"))
        );
        assert_eq!(split_scheme_name_port("ftp:web:21"), None);
        assert_eq!(split_scheme_name_port("a:b:c:d"), None);
        assert_eq!(split_scheme_name_port(":80"), None);
    }

    #[test]
    fn addresses() {
        let ok = |s: &str| parse_ip_sloppy(s).is_some_and(is_global_unicast);
        assert!(ok("10.244.0.5"));
        assert!(ok("010.244.000.005"));
        assert!(ok("fd00::2"));
        assert!(!ok("127.0.0.1"));
        assert!(!ok("0.0.0.0"));
        assert!(!ok("169.254.1.1"));
        assert!(!ok("fe80::1"));
        assert!(!ok("::1"));
        assert!(!ok(""));
    }

    #[test]
    fn paths() {
        assert_eq!(
            proxy_suffix("/api/v1/namespaces/n/pods/p/proxy"),
            ("/api/v1/namespaces/n/pods/p/proxy", "")
        );
        assert_eq!(
            proxy_suffix("/api/v1/namespaces/n/pods/p/proxy/a/b/"),
            ("/api/v1/namespaces/n/pods/p/proxy", "/a/b/")
        );
        assert_eq!(clean_path("/a/../b//c/"), "/b/c/");
        assert_eq!(clean_path("/"), "/");
        assert_eq!(clean_path(""), "");
        let prefix = "/api/v1/namespaces/n/pods/p:80/proxy";
        assert_eq!(
            rewrite_location("/login?x=1", "10.0.0.1:80", "h:6443", prefix),
            format!("{prefix}/login?x=1")
        );
        assert_eq!(
            rewrite_location("http://10.0.0.1:80/a/", "10.0.0.1:80", "h:6443", prefix),
            format!("{prefix}/a/")
        );
        assert_eq!(
            rewrite_location("http://example.com/a", "10.0.0.1:80", "h:6443", prefix),
            "http://example.com/a"
        );
        assert_eq!(
            rewrite_location("relative", "10.0.0.1:80", "h:6443", prefix),
            "relative"
        );
    }

    #[test]
    fn html_links_stay_under_the_proxy() {
        let prefix = "/api/v1/namespaces/n/services/s/proxy";
        let page = br#"<!DOCTYPE html><HTML><head><!-- <a href="/no"> -->
<link rel=stylesheet href=/css/a.css><script src="/js/app.js">var x = "<a href='/no'>";</script>
<a class="x" href="/docs/?a=1&amp;b=2">docs</a> <a href="rel/x">r</a> <img src="http://other/i.png"/>
<p title="/keep">text</p></HTML>"#;
        let out = rewrite_html(page, &|u| rewrite_location(u, "10.0.0.1:80", "h", prefix));
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out,
            format!(
                r#"<!DOCTYPE html><html manifest=""><head profile=""><!-- <a href="/no"> -->
<link rel="stylesheet" href="{prefix}/css/a.css"><script src="{prefix}/js/app.js">var x = "<a href='/no'>";</script>
<a class="x" href="{prefix}/docs/?a=1&amp;b=2">docs</a> <a href="rel/x">r</a> <img src="http://other/i.png"/>
<p title="/keep">text</p></HTML>"#
            )
            .replace(r#"<html manifest="">"#, "<html>")
            .replace(r#"<head profile="">"#, "<head>")
        );
    }

    /// A page and what kube-apiserver v1.37.2 answered for it through pods/proxy.
    #[test]
    fn html_rewritten_as_kube_apiserver_does() {
        let prefix = "/api/v1/namespaces/t1/pods/web:18091/proxy";
        let page = r#"<!DOCTYPE html><HTML><head><!-- <a href="/no"> -->
<link rel=stylesheet href=/css/a.css><script src="/js/app.js">var x = "<a href='/no'>";</script>
<a class="x" href="/docs/?a=1&amp;b=2">docs</a> <a href="rel/x">r</a> <img src="http://other/i.png"/>
<p title="/keep">text</p><A HREF='/up'>u</A><form action="/submit" method=post disabled><img src='/a b.png' alt="x&quot;y"></HTML>
"#;
        let want = r#"<!DOCTYPE html><html><head><!-- <a href="/no"> -->
<link rel="stylesheet" href="/api/v1/namespaces/t1/pods/web:18091/proxy/css/a.css"><script src="/api/v1/namespaces/t1/pods/web:18091/proxy/js/app.js">var x = "<a href='/no'>";</script>
<a class="x" href="/api/v1/namespaces/t1/pods/web:18091/proxy/docs/?a=1&amp;b=2">docs</a> <a href="rel/x">r</a> <img src="http://other/i.png"/>
<p title="/keep">text</p><a href="/api/v1/namespaces/t1/pods/web:18091/proxy/up">u</A><form action="/api/v1/namespaces/t1/pods/web:18091/proxy/submit" method="post" disabled=""><img src="/api/v1/namespaces/t1/pods/web:18091/proxy/a%20b.png" alt="x&#34;y"></HTML>
"#;
        let out = rewrite_html(page.as_bytes(), &|u| {
            rewrite_location(u, "192.0.2.2:18091", "127.0.0.1:6443", prefix)
        });
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }

    #[test]
    fn dial_errors_read_as_go_writes_them() {
        let e = std::io::Error::from_raw_os_error(111);
        assert_eq!(go_dial_error(&e), "connect: connection refused");
    }
}
