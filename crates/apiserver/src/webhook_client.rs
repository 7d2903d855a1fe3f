//! The HTTPS client of the API server's callouts: admission webhooks and custom resource
//! conversion webhooks, both configured by a `WebhookClientConfig` (`url`, or a Service
//! reference, and `caBundle`).
//!
//! A Service reference `<service>.<namespace>.svc:<port>` is resolved as upstream's
//! endpoint resolver does (`--enable-aggregator-routing`): the Service's port, then a ready
//! address of its EndpointSlices with that port's target port, reached through the
//! simulated pod network when the cluster has one (a pod IP is never dialed on the host).
//! The TLS server name stays `<service>.<namespace>.svc`. `caBundle` is the only trusted
//! root. Errors are worded as Go's rest client words them.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use kumo_storage::Store;
use rustls::pki_types::ServerName;
use serde_json::Value;

use crate::resource_proxy::PodNetwork;

/// Largest answer read.
const MAX_RESPONSE: usize = 16 << 20;

/// Where a webhook is reached.
pub(crate) enum Target {
    Url(String),
    Service {
        namespace: String,
        name: String,
        path: String,
        port: u16,
    },
}

/// A TLS client trusting only the certificates of `ca_bundle` (base64 of PEM).
pub(crate) fn tls_config(ca_bundle: &str) -> Result<rustls::ClientConfig, String> {
    let roots = roots(ca_bundle)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The certificates of `ca_bundle` (base64 of PEM) as trust roots; an empty bundle trusts
/// nothing.
pub(crate) fn roots(ca_bundle: &str) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    if !ca_bundle.is_empty() {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(ca_bundle)
            .map_err(|e| format!("unable to load root certificates: {e}"))?;
        for c in rustls_pemfile::certs(&mut pem.as_slice()) {
            let c = c.map_err(|e| format!("unable to load root certificates: {e}"))?;
            roots
                .add(c)
                .map_err(|e| format!("unable to load root certificates: {e}"))?;
        }
        // As Go's x509 pool: a bundle without a single certificate is refused.
        if roots.is_empty() {
            return Err(
                "unable to load root certificates: unable to parse bytes as PEM block".into(),
            );
        }
    }
    Ok(roots)
}

/// The webhook's URL as a Go rest client prints it (path cleaned, `timeout` added), with
/// the address to connect to and the TLS server name.
struct Endpoint {
    url: String,
    server_name: String,
    path_and_query: String,
    host_header: String,
}

/// `path.Join("/", p)` as Go cleans it.
pub(crate) fn clean_path(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

pub(crate) fn go_duration(secs: u64) -> String {
    if secs >= 60 {
        let (m, s) = (secs / 60, secs % 60);
        if s == 0 {
            format!("{m}m0s")
        } else {
            format!("{m}m{s}s")
        }
    } else {
        format!("{secs}s")
    }
}

/// The rest client's error for a non-2xx answer (`NewGenericServerResponse`), or the
/// message of the Status the webhook answered with.
fn server_response_error(code: u16, body: &[u8], text: bool) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if v.get("kind").and_then(Value::as_str) == Some("Status") {
            if let Some(m) = v
                .get("message")
                .and_then(Value::as_str)
                .filter(|m| !m.is_empty())
            {
                return m.to_owned();
            }
        }
    }
    let server_message = if text {
        let mut s = String::from_utf8_lossy(body).trim().to_owned();
        if s.len() > 2048 {
            let mut end = 2048;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s = format!("{}...", &s[..end]);
        }
        s
    } else {
        "unknown".to_owned()
    };
    match code {
        409 => "the server reported a conflict".into(),
        404 => "the server could not find the requested resource".into(),
        400 => "the server rejected our request for an unknown reason".into(),
        401 => "the server has asked for the client to provide credentials".into(),
        403 | 415 => server_message,
        405 => "the server does not allow this method on the requested resource".into(),
        422 => "the server rejected our request due to an error in our request".into(),
        503 => "the server is currently unable to handle the request".into(),
        504 => "the server was unable to return a response in the time allotted, but may still be processing the request".into(),
        429 => "the server has received too many requests and has asked us to try again later".into(),
        c if c >= 500 => format!(
            "an error on the server ({}) has prevented the request from succeeding",
            kumo_apimachinery::validation::go_quote(&server_message)
        ),
        c => format!("the server responded with the status code {c} but did not return more information"),
    }
}

/// Go's text of a TLS handshake failure.
pub(crate) fn tls_error(e: &std::io::Error) -> String {
    use rustls::{CertificateError, Error as T};
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match inner {
        Some(T::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        )) => {
            "tls: failed to verify certificate: x509: certificate signed by unknown authority"
                .into()
        }
        Some(T::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected,
            presented,
        })) => format!(
            "tls: failed to verify certificate: {}",
            hostname_error(&expected.to_str(), presented)
        ),
        Some(T::InvalidCertificate(CertificateError::NotValidForName)) => {
            "tls: failed to verify certificate: x509: certificate is not valid for the requested name".into()
        }
        Some(T::InvalidCertificate(CertificateError::Expired))
        | Some(T::InvalidCertificate(CertificateError::ExpiredContext { .. }))
        | Some(T::InvalidCertificate(CertificateError::NotValidYet))
        | Some(T::InvalidCertificate(CertificateError::NotValidYetContext { .. })) => {
            "tls: failed to verify certificate: x509: certificate has expired or is not yet valid".into()
        }
        Some(other) => format!("tls: {other}"),
        None if e.kind() == std::io::ErrorKind::UnexpectedEof => "EOF".into(),
        None => e.to_string(),
    }
}

/// Go's x509 HostnameError: the certificate's IP names when an IP was asked for, else its
/// DNS names.
fn hostname_error(host: &str, presented: &[String]) -> String {
    // rustls may quote or wrap the names it presents; keep the bare name.
    let bare = |n: &String| {
        let n = n.trim_end_matches(')');
        let n = n.rsplit('(').next().unwrap_or(n);
        n.trim_matches('"').to_owned()
    };
    let names: Vec<String> = presented.iter().map(bare).collect();
    let is_ip = |n: &str| n.parse::<std::net::IpAddr>().is_ok();
    let valid: Vec<&str> = if is_ip(host) {
        let ips: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| is_ip(n))
            .collect();
        if ips.is_empty() {
            return format!(
                "x509: cannot validate certificate for {host} because it doesn't contain any IP SANs"
            );
        }
        ips
    } else {
        names
            .iter()
            .map(String::as_str)
            .filter(|n| !is_ip(n))
            .collect()
    };
    if valid.is_empty() {
        return format!("x509: certificate is not valid for any names, but wanted to match {host}");
    }
    format!(
        "x509: certificate is valid for {}, not {host}",
        valid.join(", ")
    )
}

/// Go's text of a failed TCP dial to `addr`.
pub(crate) fn dial_error(addr: &str, e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    let why = match e.kind() {
        K::ConnectionRefused => "connection refused".to_owned(),
        K::ConnectionReset => "connection reset by peer".to_owned(),
        K::TimedOut => "i/o timeout".to_owned(),
        _ => e.to_string(),
    };
    format!("dial tcp {addr}: connect: {why}")
}

/// Aborts a task when dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A connection to a webhook: TCP, or one of the simulated pod network.
trait Conn: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Conn for T {}

/// A TLS stream that takes a peer closing the connection without TLS's close_notify as
/// the end of the stream, as Go's HTTP client does (a body read to the end of the
/// connection is then complete).
pub(crate) struct CloseTolerant<S>(pub(crate) S);

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for CloseTolerant<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match std::pin::Pin::new(&mut self.0).poll_read(cx, buf) {
            std::task::Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                std::task::Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for CloseTolerant<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Client {
    /// Resolves where to connect (a Service reference through its EndpointSlices).
    async fn endpoint(
        &self,
        store: &dyn Store,
    ) -> Result<(Endpoint, Result<String, String>), String> {
        let query = &self.query;
        match &self.target {
            Target::Url(u) => {
                let uri: http::Uri = u
                    .parse()
                    .map_err(|e| format!("could not get REST client: {e}"))?;
                let host = uri.host().unwrap_or("").trim_matches(['[', ']']).to_owned();
                let port = uri.port_u16().unwrap_or(443);
                let path = clean_path(uri.path());
                let pq = match (uri.query().filter(|q| !q.is_empty()), query.is_empty()) {
                    (Some(q), false) => format!("{path}?{q}&{query}"),
                    (Some(q), true) => format!("{path}?{q}"),
                    (None, false) => format!("{path}?{query}"),
                    (None, true) => path,
                };
                let authority = uri
                    .authority()
                    .map(|a| a.as_str().to_owned())
                    .unwrap_or_default();
                let dial = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                Ok((
                    Endpoint {
                        url: format!("https://{authority}{pq}"),
                        server_name: host,
                        path_and_query: pq,
                        host_header: authority,
                    },
                    Ok(dial),
                ))
            }
            Target::Service {
                namespace,
                name,
                path,
                port,
            } => {
                let server_name = format!("{name}.{namespace}.svc");
                let host = format!("{server_name}:{port}");
                let pq = if query.is_empty() {
                    clean_path(path)
                } else {
                    format!("{}?{query}", clean_path(path))
                };
                let resolved = resolve_service(store, namespace, name, *port).await;
                Ok((
                    Endpoint {
                        url: format!("https://{host}{pq}"),
                        server_name,
                        path_and_query: pq,
                        host_header: host,
                    },
                    resolved,
                ))
            }
        }
    }
}

/// A ready address of Service `ns/name`'s EndpointSlices for its port `port`, as
/// `ip:targetPort` (upstream's ResolveEndpoint, with its errors).
pub(crate) async fn resolve_service(
    store: &dyn Store,
    ns: &str,
    name: &str,
    port: u16,
) -> Result<String, String> {
    let get = |key: String| async move {
        let (kv, _) = store
            .get(key.as_bytes(), None)
            .await
            .map_err(|e| e.to_string())?;
        match kv {
            Some(kv) => serde_json::from_slice::<Value>(&kv.value)
                .map(Some)
                .map_err(|e| e.to_string()),
            None => Ok(None),
        }
    };
    let svc = get(format!("/registry/services/{ns}/{name}"))
        .await?
        .ok_or_else(|| format!("service \"{name}\" not found"))?;
    let typ = svc
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    if !matches!(typ, "ClusterIP" | "LoadBalancer" | "NodePort") {
        return Err(format!("unsupported service type \"{typ}\""));
    }
    let svc_port = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p.get("port").and_then(Value::as_u64) == Some(u64::from(port)))
        .ok_or_else(|| format!("no service port {port} found for service \"{name}\""))?;
    let port_name = svc_port.get("name").and_then(Value::as_str).unwrap_or("");
    let page = store
        .range(kumo_storage::RangeRequest {
            prefix: format!("/registry/endpointslices/{ns}/").into_bytes(),
            start: None,
            limit: 0,
            revision: None,
        })
        .await
        .map_err(|e| e.to_string())?;
    for kv in &page.kvs {
        let Ok(slice) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        if slice
            .pointer("/metadata/labels/kubernetes.io~1service-name")
            .and_then(Value::as_str)
            != Some(name)
        {
            continue;
        }
        let target = slice
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str).unwrap_or("") == port_name)
            .and_then(|p| p.get("port").and_then(Value::as_u64));
        let Some(target) = target else { continue };
        for ep in slice
            .get("endpoints")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if ep.pointer("/conditions/ready").and_then(Value::as_bool) == Some(false) {
                continue;
            }
            if let Some(ip) = ep
                .get("addresses")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .and_then(Value::as_str)
            {
                return Ok(if ip.contains(':') {
                    format!("[{ip}]:{target}")
                } else {
                    format!("{ip}:{target}")
                });
            }
        }
    }
    Err(format!("no endpoints available for service \"{name}\""))
}

/// Where and how a callout is made.
pub(crate) struct Client {
    pub target: Target,
    pub tls: Result<Arc<rustls::ClientConfig>, String>,
    /// The exchange's deadline.
    pub timeout: Duration,
    /// Added to the URL's query (admission's `timeout=10s`), or empty.
    pub query: String,
    pub user_agent: &'static str,
}

/// Why a callout has no answer to read.
#[derive(Debug)]
pub(crate) enum PostError {
    /// The client could not be built or the Service not resolved: the whole message.
    Setup(String),
    /// The exchange failed (`Post "<url>": <why>`).
    Post { url: String, why: String },
    /// The server answered outside 2xx: the rest client's message for it.
    Status(String),
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostError::Setup(s) | PostError::Status(s) => f.write_str(s),
            PostError::Post { url, why } => write!(f, "Post \"{url}\": {why}"),
        }
    }
}

impl Client {
    /// The client of a `WebhookClientConfig` (`clientConfig`): a Service reference's port
    /// defaults to 443.
    pub(crate) fn from_config(
        cc: &Value,
        timeout: Duration,
        query: String,
        user_agent: &'static str,
    ) -> Client {
        let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let target = match cc.get("service") {
            Some(svc) if svc.is_object() => Target::Service {
                namespace: text(svc, "namespace"),
                name: text(svc, "name"),
                path: text(svc, "path"),
                port: svc
                    .get("port")
                    .and_then(Value::as_u64)
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or(443),
            },
            _ => Target::Url(text(cc, "url")),
        };
        Client {
            target,
            tls: tls_config(&text(cc, "caBundle")).map(Arc::new),
            timeout,
            query,
            user_agent,
        }
    }

    /// POSTs `body` (JSON) and reads a 2xx answer's body.
    pub(crate) async fn post(
        &self,
        store: &dyn Store,
        pod_network: Option<&Arc<dyn PodNetwork>>,
        body: Vec<u8>,
    ) -> Result<Bytes, PostError> {
        let (ep, dial) = self.endpoint(store).await.map_err(PostError::Setup)?;
        let failed = |why: String| PostError::Post {
            url: ep.url.clone(),
            why,
        };
        let tls = self
            .tls
            .clone()
            .map_err(|e| PostError::Setup(format!("could not get REST client: {e}")))?;
        // A Service's endpoints are on the pod network: through the simulated one when
        // the cluster has it.
        let pod_network = match self.target {
            Target::Service { .. } => pod_network,
            Target::Url(_) => None,
        };
        let exchange = async {
            let addr = dial?;
            let conn: Box<dyn Conn> = match (pod_network, addr.parse::<std::net::SocketAddr>()) {
                (Some(net), Ok(to)) => {
                    Box::new(net.connect(to).map_err(|e| dial_error(&addr, &e))?)
                }
                _ => Box::new(tokio::net::TcpStream::connect(&addr).await.map_err(|e| {
                    if addr.parse::<std::net::SocketAddr>().is_ok() {
                        dial_error(&addr, &e)
                    } else {
                        format!("dial tcp: lookup {}: {e}", ep.server_name)
                    }
                })?),
            };
            let name =
                ServerName::try_from(ep.server_name.clone()).map_err(|e| format!("tls: {e}"))?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(name, conn)
                .await
                .map_err(|e| tls_error(&e))?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(
                hyper_util::rt::TokioIo::new(CloseTolerant(stream)),
            )
            .await
            .map_err(|e| e.to_string())?;
            // The connection is driven beside the exchange and ends with it (also when the
            // timeout drops the exchange).
            let _conn = AbortOnDrop(tokio::spawn(async move {
                let _ = conn.await;
            }));
            let req = http::Request::post(ep.path_and_query.as_str())
                .header(http::header::HOST, ep.host_header.as_str())
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::ACCEPT, "application/json, */*")
                .header(http::header::USER_AGENT, self.user_agent)
                .body(Full::new(Bytes::from(body)))
                .map_err(|e| e.to_string())?;
            let resp = sender.send_request(req).await.map_err(|e| {
                if e.is_incomplete_message() {
                    "EOF".to_owned()
                } else {
                    e.to_string()
                }
            })?;
            let status = resp.status().as_u16();
            let text = resp
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|c| c.starts_with("text/") || c.contains("json"));
            let bytes = Limited::new(resp.into_body(), MAX_RESPONSE)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, text, bytes))
        };
        let (status, text, bytes) = match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => return Err(failed("context deadline exceeded".into())),
            Ok(Err(why)) => return Err(failed(why)),
            Ok(Ok(r)) => r,
        };
        if !(200..300).contains(&status) {
            return Err(PostError::Status(server_response_error(
                status, &bytes, text,
            )));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_are_cleaned_as_go_joins_them() {
        assert_eq!(clean_path(""), "/");
        assert_eq!(clean_path("/"), "/");
        assert_eq!(clean_path("/validate/"), "/validate");
        assert_eq!(clean_path("a//b/./c"), "/a/b/c");
    }

    #[tokio::test]
    async fn services_resolve_to_a_ready_endpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = kumo_storage::embedded::EmbeddedStore::open(
            kumo_storage::embedded::EmbeddedConfig::new(dir.path()),
        )
        .await
        .expect("store");
        let put = |key: &str, v: Value| {
            let store = store.clone();
            let key = key.to_owned();
            async move {
                store
                    .create(key.as_bytes(), serde_json::to_vec(&v).expect("json"))
                    .await
                    .expect("write");
            }
        };
        put(
            "/registry/services/hooks/svc",
            json!({"metadata": {"name": "svc"}, "spec": {"type": "ClusterIP",
                "ports": [{"name": "https", "port": 443, "targetPort": 9443}]}}),
        )
        .await;
        put(
            "/registry/services/hooks/ext",
            json!({"metadata": {"name": "ext"}, "spec": {"type": "ExternalName",
                "ports": [{"port": 443}]}}),
        )
        .await;
        put(
            "/registry/endpointslices/hooks/other",
            json!({"metadata": {"name": "other", "labels": {"kubernetes.io/service-name": "x"}},
                "ports": [{"name": "https", "port": 1}],
                "endpoints": [{"addresses": ["10.0.0.9"]}]}),
        )
        .await;
        put(
            "/registry/endpointslices/hooks/svc-1",
            json!({"metadata": {"name": "svc-1", "labels": {"kubernetes.io/service-name": "svc"}},
                "ports": [{"name": "https", "port": 9443}],
                "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": false}},
                              {"addresses": ["127.0.0.1"], "conditions": {"ready": true}}]}),
        )
        .await;
        assert_eq!(
            resolve_service(&*store, "hooks", "svc", 443).await,
            Ok("127.0.0.1:9443".to_owned())
        );
        assert_eq!(
            resolve_service(&*store, "hooks", "ext", 443).await,
            Err("unsupported service type \"ExternalName\"".to_owned())
        );
        assert_eq!(
            resolve_service(&*store, "hooks", "svc", 80).await,
            Err("no service port 80 found for service \"svc\"".to_owned())
        );
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(10), "10s");
        assert_eq!(go_duration(30), "30s");
    }
}
