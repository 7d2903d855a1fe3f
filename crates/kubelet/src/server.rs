//! The kubelet's HTTPS API (port 10250), as upstream's `pkg/kubelet/server`: `/healthz`,
//! `/pods`, `/containerLogs/{ns}/{pod}/{container}`, `/exec/...` and `/attach/...` over
//! WebSocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`), `/run/...`, and
//! `/portForward/...` ([`crate::portforward`]).
//!
//! Every request is authenticated (a client certificate signed by `--client-ca-file`, or
//! a bearer token checked with a TokenReview; anonymous only with `--anonymous-auth`) and
//! authorized with a SubjectAccessReview of upstream's attributes: the HTTP method's verb
//! on `nodes/<subresource>` named after this node (`/pods` → pods, `/healthz` → healthz,
//! each falling back to proxy; `/stats` → stats, `/metrics` → metrics, `/logs` → log;
//! everything else proxy). Failures answer upstream's plain-text 401 and 403.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::Client;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::{Error, Result};
use kumo_cri::{ExecStep, Runtime, RuntimeError, Stream};

type Body = BoxBody<Bytes, Infallible>;

/// How the kubelet serves its API (upstream's `--address`, `--port`, `--tls-*`,
/// `--client-ca-file`, `--anonymous-auth`, `--authorization-mode`).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub address: IpAddr,
    /// 0 picks a free port (reported in the Node's daemonEndpoints).
    pub port: u16,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub client_ca_file: Option<PathBuf>,
    pub anonymous_auth: bool,
    /// `Webhook` (SubjectAccessReview) when true, `AlwaysAllow` otherwise.
    pub authorization_webhook: bool,
}

impl Default for ServerConfig {
    /// kubeadm's kubelet settings: port 10250 on every address, no anonymous requests,
    /// Webhook authorization.
    fn default() -> ServerConfig {
        ServerConfig {
            address: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            port: 10250,
            tls_cert_file: None,
            tls_private_key_file: None,
            client_ca_file: None,
            anonymous_auth: false,
            authorization_webhook: true,
        }
    }
}

/// Binds the kubelet's port.
pub async fn bind(cfg: &ServerConfig) -> Result<TcpListener> {
    let addr = SocketAddr::new(cfg.address, cfg.port);
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Invalid(format!("failed to listen on {addr}: {e}")))
}

/// A self-signed CA and a serving certificate for the node's names and addresses, made in
/// memory as upstream's kubelet does without `--tls-cert-file`.
fn self_signed(
    names: &[String],
    ips: &[IpAddr],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let tls = |e: rcgen::Error| Error::Invalid(format!("serving certificate: {e}"));
    let host = names.first().cloned().unwrap_or_else(|| "localhost".into());
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let ca_key = KeyPair::generate().map_err(tls)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("{host}-ca@{stamp}"));
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
        KeyUsagePurpose::KeyCertSign,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(tls)?;
    let issuer = Issuer::from_ca_cert_der(ca_cert.der(), &ca_key).map_err(tls)?;
    let key = KeyPair::generate().map_err(tls)?;
    let mut leaf = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("{host}@{stamp}"));
    leaf.distinguished_name = dn;
    for n in names {
        if let Ok(n) = n.clone().try_into() {
            leaf.subject_alt_names.push(SanType::DnsName(n));
        }
    }
    for ip in ips {
        leaf.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_cert = leaf.signed_by(&key, &issuer).map_err(tls)?;
    Ok((
        vec![leaf_cert.der().clone(), ca_cert.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    ))
}

fn read_pem(path: &PathBuf) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))
}

/// The TLS settings: the serving certificate, and client certificates verified against
/// the client CA when one is given.
pub fn tls_config(
    cfg: &ServerConfig,
    names: &[String],
    ips: &[IpAddr],
) -> Result<rustls::ServerConfig> {
    let bad = |e: String| Error::Invalid(format!("kubelet TLS: {e}"));
    let (certs, key) = match (&cfg.tls_cert_file, &cfg.tls_private_key_file) {
        (Some(c), Some(k)) => {
            let certs = rustls_pemfile::certs(&mut read_pem(c)?.as_slice())
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(e.to_string()))?;
            let key = rustls_pemfile::private_key(&mut read_pem(k)?.as_slice())
                .map_err(|e| bad(e.to_string()))?
                .ok_or_else(|| bad(format!("no private key in {}", k.display())))?;
            (certs, key)
        }
        _ => self_signed(names, ips)?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| bad(e.to_string()))?;
    let builder = match &cfg.client_ca_file {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_pemfile::certs(&mut read_pem(ca)?.as_slice()) {
                roots
                    .add(c.map_err(|e| bad(e.to_string()))?)
                    .map_err(|e| bad(e.to_string()))?;
            }
            // Requests without a certificate go on to token or anonymous authentication.
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| bad(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut tls = builder
        .with_single_cert(certs, key)
        .map_err(|e| bad(e.to_string()))?;
    // WebSocket upgrades need HTTP/1.1.
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tls)
}

/// Who is asking.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct User {
    name: String,
    uid: String,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

fn cert_user(der: &[u8]) -> Option<User> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())?
        .to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(str::to_owned))
        .collect();
    Some(User {
        name,
        uid: String::new(),
        groups,
        extra: BTreeMap::new(),
    })
}

/// A cached authorization: user, verb, subresource.
type DecisionKey = (User, String, String);

/// What the server shares between requests.
pub struct State {
    client: Client,
    node_name: String,
    runtime: Arc<dyn Runtime>,
    network: Arc<dyn kumo_cri::PodNetwork>,
    anonymous: bool,
    webhook: bool,
    /// TokenReview answers (2 minutes, as upstream's webhook token cache).
    tokens: Mutex<HashMap<String, (Instant, Option<User>)>>,
    /// SubjectAccessReview answers (5 minutes allowed, 30 s denied, as upstream).
    decisions: Mutex<HashMap<DecisionKey, (Instant, bool)>>,
    /// The node's CPU counter of `/metrics/resource`.
    meter: crate::stats::NodeMeter,
}

/// Serves the kubelet API on `listener` until the process ends.
pub fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    cfg: &ServerConfig,
    client: Client,
    node_name: String,
    runtime: Arc<dyn Runtime>,
    network: Arc<dyn kumo_cri::PodNetwork>,
) -> tokio::task::JoinHandle<()> {
    let state = Arc::new(State {
        client,
        node_name,
        runtime,
        network,
        anonymous: cfg.anonymous_auth,
        webhook: cfg.authorization_webhook,
        tokens: Mutex::default(),
        decisions: Mutex::default(),
        meter: Default::default(),
    });
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "kubelet server: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let state = state.clone();
            tokio::spawn(async move {
                let tls = match acceptor.accept(tcp).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "kubelet server: TLS handshake failed");
                        return;
                    }
                };
                let user = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| cert_user(c));
                let service = service_fn(move |req| {
                    let state = state.clone();
                    let user = user.clone();
                    async move { Ok::<_, Infallible>(handle(state, user, req).await) }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                if let Err(e) = builder
                    .serve_connection_with_upgrades(TokioIo::new(tls), service)
                    .await
                {
                    tracing::debug!(%peer, error = %e, "kubelet server: connection ended");
                }
            });
        }
    })
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

/// A plain-text answer, as go-restful's WriteError / WriteErrorString write them.
fn text(code: StatusCode, body: impl Into<String>) -> Response<Body> {
    let mut r = Response::new(full(body.into()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Query parameters, repeated ones kept in order.
fn query(req: &Request<Incoming>) -> Vec<(String, String)> {
    kumo_apimachinery::query::pairs(req.uri().query())
}

fn param<'a>(q: &'a [(String, String)], k: &str) -> Option<&'a str> {
    q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

/// Go's strconv.ParseBool.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Whether `path` is `prefix` or below it (upstream's isSubpath).
fn is_subpath(path: &str, prefix: &str) -> bool {
    path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// The subresources of `nodes` a request to `path` is authorized as, in the order tried.
pub fn subresources(path: &str) -> Vec<&'static str> {
    let mut subs = Vec::new();
    if is_subpath(path, "/pods") || is_subpath(path, "/runningpods") {
        subs.push("pods");
    } else if is_subpath(path, "/healthz") {
        subs.push("healthz");
    } else if is_subpath(path, "/configz") {
        subs.push("configz");
    }
    subs.push(if is_subpath(path, "/stats") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs") {
        "log"
    } else if is_subpath(path, "/checkpoint") {
        "checkpoint"
    } else if is_subpath(path, "/statusz") {
        "statusz"
    } else if is_subpath(path, "/flagz") {
        "configz"
    } else {
        "proxy"
    });
    subs
}

/// The API verb of an HTTP method, as the kubelet maps it.
fn verb(m: &Method) -> &'static str {
    match *m {
        Method::POST => "create",
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

impl State {
    /// POSTs `body` to `path` as the kubelet's own identity.
    async fn post(&self, path: &str, body: &Value) -> Option<Value> {
        let req = http::Request::post(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(body).ok()?)
            .ok()?;
        match self.client.request::<Value>(req).await {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(path, error = %e, "kubelet server: review failed");
                None
            }
        }
    }

    async fn authenticate_token(&self, token: &str) -> Option<User> {
        if let Some((at, user)) = self.tokens.lock().ok()?.get(token).cloned() {
            if at.elapsed() < Duration::from_secs(120) {
                return user;
            }
        }
        let review = self
            .post(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}),
            )
            .await?;
        let user = if review.pointer("/status/authenticated") == Some(&json!(true)) {
            let u = review.pointer("/status/user").cloned().unwrap_or_default();
            Some(User {
                name: u["username"].as_str().unwrap_or("").to_owned(),
                uid: u["uid"].as_str().unwrap_or("").to_owned(),
                groups: serde_json::from_value(u["groups"].clone()).unwrap_or_default(),
                extra: serde_json::from_value(u["extra"].clone()).unwrap_or_default(),
            })
        } else {
            None
        };
        if let Ok(mut cache) = self.tokens.lock() {
            if cache.len() > 1024 {
                cache.clear();
            }
            cache.insert(token.to_owned(), (Instant::now(), user.clone()));
        }
        user
    }

    async fn authorize(&self, user: &User, verb: &str, sub: &str) -> bool {
        if !self.webhook {
            return true;
        }
        let key = (user.clone(), verb.to_owned(), sub.to_owned());
        if let Some((at, allowed)) = self
            .decisions
            .lock()
            .ok()
            .and_then(|c| c.get(&key).cloned())
        {
            let ttl = if allowed { 300 } else { 30 };
            if at.elapsed() < Duration::from_secs(ttl) {
                return allowed;
            }
        }
        let sar = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.name,
                "uid": user.uid,
                "groups": user.groups,
                "extra": user.extra,
                "resourceAttributes": {
                    "verb": verb,
                    "version": "v1",
                    "resource": "nodes",
                    "subresource": sub,
                    "name": self.node_name,
                },
            },
        });
        let Some(answer) = self
            .post("/apis/authorization.k8s.io/v1/subjectaccessreviews", &sar)
            .await
        else {
            return false;
        };
        let allowed = answer.pointer("/status/allowed") == Some(&json!(true));
        if let Ok(mut cache) = self.decisions.lock() {
            if cache.len() > 1024 {
                cache.clear();
            }
            cache.insert(key, (Instant::now(), allowed));
        }
        allowed
    }

    /// The pod `ns/name` bound to this node, as the API has it.
    async fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        let req = http::Request::get(format!("/api/v1/namespaces/{ns}/pods/{name}"))
            .body(Vec::new())
            .ok()?;
        let pod = self.client.request::<Value>(req).await.ok()?;
        (pod.pointer("/spec/nodeName").and_then(Value::as_str) == Some(&self.node_name))
            .then_some(pod)
    }
}

/// Authenticates, authorizes and answers one request.
async fn handle(state: Arc<State>, peer: Option<User>, req: Request<Incoming>) -> Response<Body> {
    let user = match peer {
        Some(u) => Some(u),
        None => match req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            Some(token) => state.authenticate_token(token).await,
            None if state.anonymous => Some(User {
                name: "system:anonymous".into(),
                uid: String::new(),
                groups: vec!["system:unauthenticated".into()],
                extra: BTreeMap::new(),
            }),
            None => None,
        },
    };
    let Some(user) = user else {
        return text(StatusCode::UNAUTHORIZED, "Unauthorized");
    };
    let path = req.uri().path().to_owned();
    let v = verb(req.method());
    let subs = subresources(&path);
    let mut allowed = false;
    for sub in &subs {
        if state.authorize(&user, v, sub).await {
            allowed = true;
            break;
        }
    }
    if !allowed {
        return text(
            StatusCode::FORBIDDEN,
            format!(
                "Forbidden (user={}, verb={v}, resource=nodes, subresource(s)=[{}])\n",
                user.name,
                subs.join(" ")
            ),
        );
    }
    route(state, req).await
}

fn not_found() -> Response<Body> {
    text(StatusCode::NOT_FOUND, "404 page not found\n")
}

async fn route(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(kumo_apimachinery::query::unescape_path)
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let get = matches!(*req.method(), Method::GET | Method::HEAD);
    match segs.as_slice() {
        ["healthz", ..] if get => text(StatusCode::OK, "ok"),
        ["pods"] if get => pods(&state).await,
        ["metrics", "resource"] if get => resource_metrics(&state).await,
        ["metrics", ..] if get => metrics(),
        ["containerLogs", ns, pod, container] if get => {
            let q = query(&req);
            container_logs(state, ns, pod, container, &q).await
        }
        ["exec", ns, pod, container] | ["exec", ns, pod, _, container]
            if get || *req.method() == Method::POST =>
        {
            let (ns, pod, container) = (ns.to_string(), pod.to_string(), container.to_string());
            stream(state, req, &ns, &pod, &container, false).await
        }
        ["attach", ns, pod, container] | ["attach", ns, pod, _, container]
            if get || *req.method() == Method::POST =>
        {
            let (ns, pod, container) = (ns.to_string(), pod.to_string(), container.to_string());
            stream(state, req, &ns, &pod, &container, true).await
        }
        ["portForward", ns, pod] | ["portForward", ns, pod, _]
            if get || *req.method() == Method::POST =>
        {
            let uid = segs.get(3).map(|s| s.to_string());
            let (ns, name) = (ns.to_string(), pod.to_string());
            let found = state.pod(&ns, &name).await;
            let st = state.clone();
            let fetch: crate::portforward::PodFetch = Arc::new(move || {
                let (st, ns, name) = (st.clone(), ns.clone(), name.clone());
                Box::pin(async move { st.pod(&ns, &name).await })
            });
            crate::portforward::serve(req, found, uid.as_deref(), fetch, state.network.clone())
        }
        ["run", ns, pod, container] | ["run", ns, pod, _, container]
            if *req.method() == Method::POST =>
        {
            let q = query(&req);
            run(&state, ns, pod, container, &q).await
        }
        _ => not_found(),
    }
}

/// `/metrics`: the Prometheus text the sim has (the build info every component reports).
fn metrics() -> Response<Body> {
    let mut r = text(
        StatusCode::OK,
        format!(
            "# HELP kubernetes_build_info [ALPHA] A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.\n# TYPE kubernetes_build_info gauge\nkubernetes_build_info{{git_version=\"{}\"}} 1\n",
            crate::KUBELET_VERSION
        ),
    );
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// `/metrics/resource`: the running containers' CPU and memory (see [`crate::stats`]).
async fn resource_metrics(state: &State) -> Response<Body> {
    let path = format!(
        "/api/v1/pods?fieldSelector=spec.nodeName%3D{}",
        state.node_name
    );
    let Ok(req) = http::Request::get(path).body(Vec::new()) else {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "request");
    };
    let list = match state.client.request::<Value>(req).await {
        Ok(l) => l,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let pods = list["items"].as_array().cloned().unwrap_or_default();
    let body = crate::stats::resource_metrics(&pods, state.runtime.as_ref(), &state.meter);
    let mut r = text(StatusCode::OK, body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// `/pods`: the pods bound to this node.
async fn pods(state: &State) -> Response<Body> {
    let path = format!(
        "/api/v1/pods?fieldSelector=spec.nodeName%3D{}",
        state.node_name
    );
    let Ok(req) = http::Request::get(path).body(Vec::new()) else {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "request");
    };
    match state.client.request::<Value>(req).await {
        Ok(mut list) => {
            list["kind"] = json!("PodList");
            list["apiVersion"] = json!("v1");
            list["metadata"] = json!({});
            let mut r = Response::new(full(list.to_string()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Whether the pod's spec has a container (init, regular or ephemeral) named `name`.
fn has_container(pod: &Value, name: &str) -> bool {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .filter_map(|k| pod.pointer(&format!("/spec/{k}")).and_then(Value::as_array))
        .flatten()
        .any(|c| c["name"] == name)
}

fn container_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    [
        "initContainerStatuses",
        "containerStatuses",
        "ephemeralContainerStatuses",
    ]
    .iter()
    .filter_map(|k| {
        pod.pointer(&format!("/status/{k}"))
            .and_then(Value::as_array)
    })
    .flatten()
    .find(|c| c["name"] == name)
}

fn runtime_id(container_id: &str) -> String {
    container_id
        .split_once("://")
        .map_or(container_id, |(_, id)| id)
        .to_owned()
}

/// The container whose logs are read, as upstream's validateContainerLogStatus picks it.
fn log_container(pod: &Value, name: &str, previous: bool) -> std::result::Result<String, String> {
    let pod_name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some(st) = container_status(pod, name) else {
        return Err(format!(
            "container {name:?} in pod {pod_name:?} is not available"
        ));
    };
    let id_of = |v: &Value| {
        v.get("containerID")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(runtime_id)
    };
    let last = st.pointer("/lastState/terminated");
    if previous {
        return last.and_then(id_of).ok_or_else(|| {
            format!("previous terminated container {name:?} in pod {pod_name:?} not found")
        });
    }
    if st.pointer("/state/running").is_some() {
        return id_of(st)
            .ok_or_else(|| format!("container {name:?} in pod {pod_name:?} is not available"));
    }
    if let Some(t) = st.pointer("/state/terminated") {
        return id_of(t)
            .or_else(|| last.and_then(id_of))
            .ok_or_else(|| format!("container {name:?} in pod {pod_name:?} is terminated"));
    }
    if let Some(t) = last {
        return id_of(t)
            .ok_or_else(|| format!("container {name:?} in pod {pod_name:?} is terminated"));
    }
    let reason = st
        .pointer("/state/waiting/reason")
        .and_then(Value::as_str)
        .unwrap_or("");
    Err(match reason {
        "ErrImagePull" => format!(
            "container {name:?} in pod {pod_name:?} is waiting to start: image can't be pulled"
        ),
        "ImagePullBackOff" => format!(
            "container {name:?} in pod {pod_name:?} is waiting to start: trying and failing to pull image"
        ),
        "" => format!("container {name:?} in pod {pod_name:?} is waiting to start - no logs yet"),
        r => format!("container {name:?} in pod {pod_name:?} is waiting to start: {r}"),
    })
}

/// One record of a CRI log file.
struct Record {
    time: SystemTime,
    ts: String,
    stream: Stream,
    partial: bool,
    content: String,
}

fn parse_time(s: &str) -> Option<SystemTime> {
    let ts: k8s_openapi::jiff::Timestamp = s.parse().ok()?;
    let secs = u64::try_from(ts.as_second()).ok()?;
    let nanos = u32::try_from(ts.subsec_nanosecond()).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

/// Parses a CRI log file (`<time> <stream> <F|P> <content>` per line).
fn parse_cri(file: &str) -> Vec<Record> {
    file.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(4, ' ');
            let ts = parts.next()?;
            let stream = match parts.next()? {
                "stdout" => Stream::Stdout,
                "stderr" => Stream::Stderr,
                _ => return None,
            };
            let partial = parts.next()? == "P";
            let content = parts.next().unwrap_or("").to_owned();
            Some(Record {
                time: parse_time(ts)?,
                ts: ts.to_owned(),
                stream,
                partial,
                content,
            })
        })
        .collect()
}

/// The log options of a `/containerLogs` request (v1 PodLogOptions).
#[derive(Default)]
struct LogOptions {
    follow: bool,
    previous: bool,
    timestamps: bool,
    tail: Option<i64>,
    limit_bytes: Option<i64>,
    since: Option<SystemTime>,
    streams: (bool, bool),
}

fn log_options(q: &[(String, String)]) -> std::result::Result<LogOptions, (StatusCode, String)> {
    let bad = || {
        (
            StatusCode::BAD_REQUEST,
            r#"{"message": "Unable to decode query."}"#.to_owned(),
        )
    };
    let invalid = || {
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"message": "Invalid request."}"#.to_owned(),
        )
    };
    let boolean = |k: &str| -> std::result::Result<bool, (StatusCode, String)> {
        match param(q, k) {
            None | Some("") => Ok(false),
            Some(v) => parse_bool(v).ok_or_else(bad),
        }
    };
    let int = |k: &str| -> std::result::Result<Option<i64>, (StatusCode, String)> {
        match param(q, k) {
            None | Some("") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| bad()),
        }
    };
    let mut o = LogOptions {
        follow: boolean("follow")?,
        previous: boolean("previous")?,
        timestamps: boolean("timestamps")?,
        tail: int("tailLines")?,
        limit_bytes: int("limitBytes")?,
        ..Default::default()
    };
    // Backwards compatibility: `tail`, where `all` means no limit.
    match param(q, "tail") {
        Some("all") => o.tail = None,
        Some(t) if !t.is_empty() => o.tail = Some(t.parse().map_err(|_| bad())?),
        _ => {}
    }
    let since_seconds = int("sinceSeconds")?;
    let since_time = match param(q, "sinceTime") {
        None | Some("") => None,
        Some(t) => Some(parse_time(t).ok_or_else(bad)?),
    };
    if o.tail.is_some_and(|t| t < 0)
        || o.limit_bytes.is_some_and(|b| b < 1)
        || (since_seconds.is_some() && since_time.is_some())
        || since_seconds.is_some_and(|s| s < 1)
    {
        return Err(invalid());
    }
    o.since = since_time.or_else(|| {
        since_seconds
            .and_then(|s| SystemTime::now().checked_sub(Duration::from_secs(s.unsigned_abs())))
    });
    o.streams = match param(q, "stream") {
        None | Some("") | Some("All") => (true, true),
        Some("Stdout") => (true, false),
        Some("Stderr") => (false, true),
        Some(s) => {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("invalid stream type {s:?}"),
            ))
        }
    };
    if o.tail.is_some() && o.streams != (true, true) {
        return Err(invalid());
    }
    Ok(o)
}

/// Renders records as the kubelet writes them to the client.
struct LogWriter {
    timestamps: bool,
    streams: (bool, bool),
    since: Option<SystemTime>,
    left: Option<u64>,
    /// The previous record of each stream was partial (no timestamp on its continuation).
    partial: [bool; 2],
}

impl LogWriter {
    /// The bytes of `r` to send; `None` once the byte limit is reached.
    fn render(&mut self, r: &Record) -> Option<Vec<u8>> {
        if self.left == Some(0) {
            return None;
        }
        let idx = usize::from(r.stream == Stream::Stderr);
        let wanted = if idx == 0 {
            self.streams.0
        } else {
            self.streams.1
        };
        if !wanted || self.since.is_some_and(|s| r.time < s) {
            return Some(Vec::new());
        }
        let mut out = Vec::new();
        if self.timestamps && !self.partial[idx] {
            out.extend_from_slice(r.ts.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(r.content.as_bytes());
        if !r.partial {
            out.push(b'\n');
        }
        self.partial[idx] = r.partial;
        if let Some(left) = &mut self.left {
            let n = (*left).min(out.len() as u64);
            out.truncate(n as usize);
            *left -= n;
        }
        Some(out)
    }
}

/// `/containerLogs/{ns}/{pod}/{container}`.
async fn container_logs(
    state: Arc<State>,
    ns: &str,
    pod_name: &str,
    container: &str,
    q: &[(String, String)],
) -> Response<Body> {
    let opts = match log_options(q) {
        Ok(o) => o,
        Err((code, message)) => return text(code, message),
    };
    let Some(pod) = state.pod(ns, pod_name).await else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist\n"),
        );
    };
    if !has_container(&pod, container) {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}\n"),
        );
    }
    let id = match log_container(&pod, container, opts.previous) {
        Ok(id) => id,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let file = match state.runtime.read_logs(&id) {
        Ok(f) => f,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("failed to get container status {id:?}: {e}"),
            )
        }
    };
    let records = parse_cri(&file);
    let skip = match opts.tail {
        Some(n) => records
            .len()
            .saturating_sub(usize::try_from(n).unwrap_or(usize::MAX)),
        None => 0,
    };
    let mut writer = LogWriter {
        timestamps: opts.timestamps,
        streams: opts.streams,
        since: opts.since,
        left: opts.limit_bytes.map(|b| b.unsigned_abs()),
        partial: [false; 2],
    };
    let mut first = Vec::new();
    let mut done = false;
    for r in records.iter().skip(skip) {
        match writer.render(r) {
            Some(b) => first.extend(b),
            None => {
                done = true;
                break;
            }
        }
    }
    fn running(rt: &dyn Runtime, id: &str) -> bool {
        matches!(
            rt.container_status(id).map(|s| s.state),
            Ok(kumo_cri::State::Running { .. })
        )
    }
    if !opts.follow || done || !running(&*state.runtime, &id) {
        let mut r = Response::new(full(first));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain"),
        );
        return r;
    }
    // Follow: send what there is, then new records until the container stops.
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let runtime = state.runtime.clone();
    let mut seen = records.len();
    tokio::spawn(async move {
        if !first.is_empty() && tx.send(Bytes::from(first)).await.is_err() {
            return;
        }
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let alive = running(&*runtime, &id);
            let Ok(file) = runtime.read_logs(&id) else {
                return;
            };
            let records = parse_cri(&file);
            let mut chunk = Vec::new();
            for r in records.iter().skip(seen) {
                match writer.render(r) {
                    Some(b) => chunk.extend(b),
                    None => {
                        let _ = tx.send(Bytes::from(chunk)).await;
                        return;
                    }
                }
            }
            seen = records.len().max(seen);
            if !chunk.is_empty() && tx.send(Bytes::from(chunk)).await.is_err() {
                return;
            }
            if tx.is_closed() || !alive {
                return;
            }
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(StreamBody::new(body).boxed());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    r
}

/// `/run/{ns}/{pod}/{container}?cmd=...`: runs a command, answers its output.
async fn run(
    state: &State,
    ns: &str,
    pod_name: &str,
    container: &str,
    q: &[(String, String)],
) -> Response<Body> {
    let cmd: Vec<String> = param(q, "cmd")
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let id = match running_container(state, ns, pod_name, container).await {
        Ok(id) => id,
        Err(r) => return r,
    };
    match state.runtime.exec(&id, &cmd, None) {
        Ok(steps) => {
            let out: String = steps
                .into_iter()
                .filter_map(|s| match s {
                    ExecStep::Out(_, t) => Some(t),
                    _ => None,
                })
                .collect();
            text(StatusCode::OK, out)
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The runtime id of the running container `container` of `ns/pod`.
async fn running_container(
    state: &State,
    ns: &str,
    pod_name: &str,
    container: &str,
) -> std::result::Result<String, Response<Body>> {
    let Some(pod) = state.pod(ns, pod_name).await else {
        return Err(text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist\n"),
        ));
    };
    container_status(&pod, container)
        .and_then(|s| s.pointer("/state/running"))
        .and_then(|_| {
            container_status(&pod, container)?
                .get("containerID")?
                .as_str()
        })
        .map(runtime_id)
        .ok_or_else(|| {
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("container not found ({container:?})"),
            )
        })
}

/// The stream protocols the kubelet speaks over WebSocket, best first.
const WS_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

/// `/exec` and `/attach`: a WebSocket upgrade, then the process's streams on channels
/// 0 (stdin), 1 (stdout), 2 (stderr), 3 (error: the final Status), 4 (resize).
async fn stream(
    state: Arc<State>,
    mut req: Request<Incoming>,
    ns: &str,
    pod_name: &str,
    container: &str,
    attach: bool,
) -> Response<Body> {
    let q = query(&req);
    let flag = |k: &str| param(&q, k).and_then(parse_bool).unwrap_or(false);
    let (stdin, stdout, stderr, tty) = (
        flag("stdin"),
        flag("output") || flag("stdout"),
        flag("error") || flag("stderr"),
        flag("tty"),
    );
    let (stdin, stdout, stderr) = (stdin || flag("input"), stdout, stderr);
    let cmd: Vec<String> = q
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    if !stdin && !stdout && !stderr {
        return text(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr",
        );
    }
    // The container first, as upstream's GetExec/GetAttach: a client that falls back to
    // SPDY hears the same error.
    let id = match running_container(&state, ns, pod_name, container).await {
        Ok(id) => id,
        Err(r) if attach && r.status() == StatusCode::INTERNAL_SERVER_ERROR => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("container {container} not found in pod {pod_name}_{ns}"),
            )
        }
        Err(r) => return r,
    };
    let headers = req.headers();
    let is_ws = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !is_ws {
        return text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: this kubelet streams over WebSocket (v5.channel.k8s.io, v4.channel.k8s.io) only",
        );
    }
    let Some(key) = headers
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return text(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
    };
    let offered: Vec<String> = headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .collect();
    let protocol = offered
        .iter()
        .find(|p| WS_PROTOCOLS.contains(&p.as_str()))
        .cloned();
    let accept = kumo_apimachinery::websocket::accept_key(&key);
    let upgrade = hyper::upgrade::on(&mut req);
    // v4 and v5 end with a JSON Status on the error channel; the older protocols with
    // only a failure's message.
    let json_status = matches!(
        protocol.as_deref(),
        Some("v5.channel.k8s.io" | "v4.channel.k8s.io")
    );
    let base64 = protocol.as_deref() == Some("base64.channel.k8s.io");
    let runtime = state.runtime.clone();
    let opts = StreamOpts {
        stdin,
        stdout,
        stderr,
        tty,
        json_status,
    };
    tokio::spawn(async move {
        match upgrade.await {
            Ok(io) => {
                let ws = Ws::new(TokioIo::new(io), base64);
                if attach {
                    attach_session(ws, runtime, id, opts).await;
                } else {
                    exec_session(ws, runtime, id, cmd, opts).await;
                }
            }
            Err(e) => tracing::debug!(error = %e, "kubelet server: upgrade failed"),
        }
    });
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(
        header::UPGRADE,
        header::HeaderValue::from_static("websocket"),
    );
    h.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(v) = header::HeaderValue::from_str(&accept) {
        h.insert("sec-websocket-accept", v);
    }
    if let Some(p) = protocol.and_then(|p| header::HeaderValue::from_str(&p).ok()) {
        h.insert("sec-websocket-protocol", p);
    }
    r
}

#[derive(Clone, Copy)]
struct StreamOpts {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
    json_status: bool,
}

impl StreamOpts {
    fn request(self) -> kumo_cri::StreamRequest {
        kumo_cri::StreamRequest {
            stdin: self.stdin,
            stdout: self.stdout,
            stderr: self.stderr,
            tty: self.tty,
        }
    }
}

/// A server-side WebSocket connection (RFC 6455), just what the stream protocols use. Its
/// reading and writing halves may be used from two tasks (a live exec reads stdin while
/// its output is written).
struct Ws<S> {
    rd: tokio::io::ReadHalf<S>,
    wr: WsWriter<S>,
}

/// The writing half of a [`Ws`].
struct WsWriter<S> {
    io: Arc<tokio::sync::Mutex<tokio::io::WriteHalf<S>>>,
    /// `base64.channel.k8s.io`: text messages, the channel as an ASCII digit.
    base64: bool,
}

impl<S> Clone for WsWriter<S> {
    fn clone(&self) -> Self {
        WsWriter {
            io: self.io.clone(),
            base64: self.base64,
        }
    }
}

/// A message from the client.
enum WsMessage {
    Data(Vec<u8>),
    Closed,
}

impl<S: AsyncRead + AsyncWrite> Ws<S> {
    fn new(io: S, base64: bool) -> Self {
        let (rd, wr) = tokio::io::split(io);
        Ws {
            rd,
            wr: WsWriter {
                io: Arc::new(tokio::sync::Mutex::new(wr)),
                base64,
            },
        }
    }

    async fn send(&mut self, channel: u8, data: &[u8]) -> std::io::Result<()> {
        self.wr.send(channel, data).await
    }

    async fn close(&mut self) {
        self.wr.close().await
    }
}

impl<S: AsyncRead + AsyncWrite> WsWriter<S> {
    async fn send_frame(&self, opcode: u8, payload: &[u8]) -> std::io::Result<()> {
        let mut frame = vec![0x80 | opcode];
        let n = payload.len();
        if n < 126 {
            frame.push(n as u8);
        } else if n <= 0xffff {
            frame.push(126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            frame.push(127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
        frame.extend_from_slice(payload);
        let mut io = self.io.lock().await;
        io.write_all(&frame).await?;
        io.flush().await
    }

    /// Sends `data` on stream `channel`.
    async fn send(&self, channel: u8, data: &[u8]) -> std::io::Result<()> {
        if self.base64 {
            let text = format!(
                "{}{}",
                char::from(b'0' + channel % 10),
                base64::engine::general_purpose::STANDARD.encode(data)
            );
            return self.send_frame(0x1, text.as_bytes()).await;
        }
        let mut msg = Vec::with_capacity(data.len() + 1);
        msg.push(channel);
        msg.extend_from_slice(data);
        self.send_frame(0x2, &msg).await
    }

    async fn close(&self) {
        let _ = self.send_frame(0x8, &1000u16.to_be_bytes()).await;
        let _ = self.io.lock().await.shutdown().await;
    }
}

impl<S: AsyncRead + AsyncWrite> Ws<S> {
    /// The next data message (pings answered, fragments joined).
    async fn recv(&mut self) -> WsMessage {
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            if self.rd.read_exact(&mut head).await.is_err() {
                return WsMessage::Closed;
            }
            let fin = head[0] & 0x80 != 0;
            let opcode = head[0] & 0x0f;
            let masked = head[1] & 0x80 != 0;
            let mut len = u64::from(head[1] & 0x7f);
            if len == 126 {
                let mut b = [0u8; 2];
                if self.rd.read_exact(&mut b).await.is_err() {
                    return WsMessage::Closed;
                }
                len = u64::from(u16::from_be_bytes(b));
            } else if len == 127 {
                let mut b = [0u8; 8];
                if self.rd.read_exact(&mut b).await.is_err() {
                    return WsMessage::Closed;
                }
                len = u64::from_be_bytes(b);
            }
            // Stdin arrives in small messages; refuse absurd ones.
            if len > 16 << 20 {
                return WsMessage::Closed;
            }
            let mut mask = [0u8; 4];
            if masked && self.rd.read_exact(&mut mask).await.is_err() {
                return WsMessage::Closed;
            }
            let mut payload = vec![0u8; len as usize];
            if self.rd.read_exact(&mut payload).await.is_err() {
                return WsMessage::Closed;
            }
            if masked {
                for (i, b) in payload.iter_mut().enumerate() {
                    *b ^= mask[i % 4];
                }
            }
            match opcode {
                0x8 => return WsMessage::Closed,
                0x9 => {
                    let _ = self.wr.send_frame(0xA, &payload).await;
                }
                0xA => {}
                _ => {
                    message.extend_from_slice(&payload);
                    if fin {
                        if self.wr.base64 {
                            // '0'+channel, then base64.
                            let Some((c, rest)) = message.split_first() else {
                                return WsMessage::Data(message);
                            };
                            let mut decoded = vec![c.wrapping_sub(b'0')];
                            decoded.extend(
                                base64::engine::general_purpose::STANDARD
                                    .decode(rest)
                                    .unwrap_or_default(),
                            );
                            return WsMessage::Data(decoded);
                        }
                        return WsMessage::Data(message);
                    }
                }
            }
        }
    }
}

/// The Status JSON the error channel carries at the end of a stream.
fn exit_status(cmd: &[String], code: i32) -> Value {
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "command terminated with non-zero exit code: command '{}' exited with {code}: ",
            cmd.join(" ")
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

fn internal_status(message: &str) -> Value {
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("Internal error occurred: error executing command in container: {message}"),
        "reason": "InternalError",
        "details": {"causes": [{"message": format!("error executing command in container: {message}")}]},
        "code": 500,
    })
}

/// Sends the ready signal: an empty message on the lowest writable channel.
async fn ready<S: AsyncRead + AsyncWrite>(ws: &mut Ws<S>, o: StreamOpts) -> bool {
    let channel = if o.stdout {
        1
    } else if o.stderr {
        2
    } else {
        3
    };
    ws.send(channel, &[]).await.is_ok()
}

/// Reads stdin until the client closes it (v5's close signal, or the connection), or
/// until a shell reading it has come to an `exit`.
async fn read_stdin<S: AsyncRead + AsyncWrite>(
    ws: &mut Ws<S>,
    runtime: &dyn Runtime,
    cmd: &[String],
) -> Vec<u8> {
    let mut input = Vec::new();
    loop {
        if runtime.exec_input_complete(cmd, &input) {
            return input;
        }
        match ws.recv().await {
            WsMessage::Data(m) => match m.split_first() {
                Some((0, data)) => input.extend_from_slice(data),
                Some((255, [0])) => return input,
                _ => {}
            },
            WsMessage::Closed => return input,
        }
    }
}

/// Waits until the client goes away.
async fn until_closed<S: AsyncRead + AsyncWrite>(ws: &mut Ws<S>) {
    while let WsMessage::Data(_) = ws.recv().await {}
}

async fn exec_session<S: AsyncRead + AsyncWrite + Send + 'static>(
    mut ws: Ws<S>,
    runtime: Arc<dyn Runtime>,
    id: String,
    cmd: Vec<String>,
    o: StreamOpts,
) {
    if !ready(&mut ws, o).await {
        return;
    }
    match runtime.stream(&id, Some(&cmd), o.request()) {
        Some(Ok(live)) => return pump(ws, live, Some(&cmd), o).await,
        Some(Err(e)) => {
            let status = internal_status(&e.to_string());
            return finish(&ws.wr, status, o).await;
        }
        None => {}
    }
    let input = if o.stdin && runtime.exec_reads_stdin(&cmd) {
        Some(read_stdin(&mut ws, &*runtime, &cmd).await)
    } else {
        None
    };
    let status = match runtime.exec(&id, &cmd, input) {
        Ok(steps) => {
            let mut code = 0;
            for step in steps {
                match step {
                    ExecStep::Out(stream, text) => {
                        // With a TTY, stderr is the terminal too.
                        let channel = match stream {
                            Stream::Stderr if !o.tty => 2,
                            _ => 1,
                        };
                        let wanted = if channel == 1 { o.stdout } else { o.stderr };
                        let mut text = text;
                        if o.tty {
                            text = text.replace('\n', "\r\n");
                        }
                        if wanted && ws.send(channel, text.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    ExecStep::Sleep(d) => tokio::time::sleep(d).await,
                    // Files an exec writes are not kept.
                    ExecStep::Exit(c) => {
                        code = c;
                        break;
                    }
                    // An exec runs against the network as it is: it never suspends.
                    ExecStep::Forever => {
                        until_closed(&mut ws).await;
                        return;
                    }
                }
            }
            exit_status(&cmd, code)
        }
        Err(RuntimeError::Exec(message)) => internal_status(&message),
        Err(e) => internal_status(&e.to_string()),
    };
    finish(&ws.wr, status, o).await;
}

/// Ends a stream: the Status on the error channel (its message only, before v4), then the
/// close.
async fn finish<S: AsyncRead + AsyncWrite>(ws: &WsWriter<S>, status: Value, o: StreamOpts) {
    if o.json_status {
        let _ = ws.send(3, status.to_string().as_bytes()).await;
    } else if status["status"] == "Failure" {
        let message = status["message"].as_str().unwrap_or("").to_owned();
        let _ = ws.send(3, message.as_bytes()).await;
    }
    ws.close().await;
}

/// Carries a live exec or attach: the client's stdin and terminal sizes to the process,
/// its output to the client, then how it ended (`cmd`: the exec's command, `None` for an
/// attach).
async fn pump<S: AsyncRead + AsyncWrite + Send + 'static>(
    mut ws: Ws<S>,
    mut live: kumo_cri::LiveStream,
    cmd: Option<&[String]>,
    o: StreamOpts,
) {
    let writer = ws.wr.clone();
    let (stdin, resize) = (live.stdin.take(), live.resize.take());
    // The client's messages: stdin (channel 0; v5's close signal 255 closes it), terminal
    // sizes (channel 4, JSON `{"Width":..,"Height":..}`).
    let reader = tokio::spawn(async move {
        let mut stdin = stdin;
        loop {
            match ws.recv().await {
                WsMessage::Data(m) => match m.split_first() {
                    Some((0, data)) => {
                        if let Some(tx) = &stdin {
                            if tx.send(data.to_vec()).await.is_err() {
                                stdin = None;
                            }
                        }
                    }
                    Some((255, [0])) => stdin = None,
                    Some((4, data)) => {
                        let size: Value = serde_json::from_slice(data).unwrap_or_default();
                        let dim = |k: &str| size[k].as_u64().and_then(|v| u16::try_from(v).ok());
                        if let (Some(tx), Some(w), Some(h)) = (&resize, dim("Width"), dim("Height"))
                        {
                            let _ = tx.send((w, h)).await;
                        }
                    }
                    _ => {}
                },
                WsMessage::Closed => return,
            }
        }
    });
    while let Some((stream, data)) = live.output.recv().await {
        // With a TTY, stderr is the terminal too.
        let channel = match stream {
            Stream::Stderr if !o.tty => 2,
            _ => 1,
        };
        let wanted = if channel == 1 { o.stdout } else { o.stderr };
        if wanted && writer.send(channel, &data).await.is_err() {
            reader.abort();
            return;
        }
    }
    let status = match live.exit.await {
        Ok(Ok(code)) => match cmd {
            Some(cmd) => exit_status(cmd, code),
            None => json!({"metadata": {}, "status": "Success"}),
        },
        Ok(Err(message)) => internal_status(&message),
        Err(_) => internal_status("the runtime's stream ended"),
    };
    reader.abort();
    finish(&writer, status, o).await;
}

/// Attach: the container's output from now on, until it exits or the client leaves.
async fn attach_session<S: AsyncRead + AsyncWrite + Send + 'static>(
    mut ws: Ws<S>,
    runtime: Arc<dyn Runtime>,
    id: String,
    o: StreamOpts,
) {
    if !ready(&mut ws, o).await {
        return;
    }
    match runtime.stream(&id, None, o.request()) {
        Some(Ok(live)) => return pump(ws, live, None, o).await,
        Some(Err(e)) => {
            let status = internal_status(&e.to_string());
            return finish(&ws.wr, status, o).await;
        }
        None => {}
    }
    // The sim replays what the process wrote before the attach: its output starts the
    // instant it starts, before any client could attach.
    let mut seen = 0;
    loop {
        let alive = matches!(
            runtime.container_status(&id).map(|s| s.state),
            Ok(kumo_cri::State::Running { .. })
        );
        let records = runtime
            .read_logs(&id)
            .map(|f| parse_cri(&f))
            .unwrap_or_default();
        for r in records.iter().skip(seen) {
            let channel = if r.stream == Stream::Stderr && !o.tty {
                2
            } else {
                1
            };
            let wanted = if channel == 1 { o.stdout } else { o.stderr };
            let mut data = r.content.clone().into_bytes();
            if !r.partial {
                data.push(b'\n');
            }
            if o.tty {
                // A terminal's line discipline (onlcr) ends lines with CR LF.
                data = String::from_utf8_lossy(&data)
                    .replace("\r\n", "\n")
                    .replace('\n', "\r\n")
                    .into_bytes();
            }
            if wanted && ws.send(channel, &data).await.is_err() {
                return;
            }
        }
        seen = seen.max(records.len());
        if !alive {
            break;
        }
        let closed = tokio::time::timeout(Duration::from_millis(200), ws.recv()).await;
        if let Ok(WsMessage::Closed) = closed {
            return;
        }
    }
    if o.json_status {
        let status = json!({"metadata": {}, "status": "Success"}).to_string();
        let _ = ws.send(3, status.as_bytes()).await;
    }
    ws.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes() {
        assert_eq!(subresources("/pods"), ["pods", "proxy"]);
        assert_eq!(subresources("/healthz"), ["healthz", "proxy"]);
        assert_eq!(subresources("/stats/summary"), ["stats"]);
        assert_eq!(subresources("/metrics/cadvisor"), ["metrics"]);
        assert_eq!(subresources("/logs/"), ["log"]);
        assert_eq!(subresources("/containerLogs/a/b/c"), ["proxy"]);
        assert_eq!(subresources("/podsx"), ["proxy"]);
        assert_eq!(verb(&Method::POST), "create");
    }

    #[test]
    fn cri_logs() {
        let file = "2026-01-02T03:04:05.000000001Z stdout F hello\n2026-01-02T03:04:06.5Z stderr P par\n2026-01-02T03:04:06.6Z stderr F tial\nbad line\n";
        let records = parse_cri(file);
        assert_eq!(records.len(), 3);
        let mut w = LogWriter {
            timestamps: true,
            streams: (true, true),
            since: None,
            left: None,
            partial: [false; 2],
        };
        let out: Vec<u8> = records
            .iter()
            .filter_map(|r| w.render(r))
            .flatten()
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&out),
            "2026-01-02T03:04:05.000000001Z hello\n2026-01-02T03:04:06.5Z partial\n"
        );
        let mut w = LogWriter {
            timestamps: false,
            streams: (true, true),
            since: None,
            left: Some(3),
            partial: [false; 2],
        };
        let out: Vec<u8> = records
            .iter()
            .map_while(|r| w.render(r))
            .flatten()
            .collect();
        assert_eq!(out, b"hel");
    }

    #[test]
    fn statuses() {
        let pod = json!({"metadata": {"name": "p"}, "status": {"containerStatuses": [
            {"name": "a", "state": {"running": {}}, "containerID": "sim://1", "lastState": {}},
            {"name": "b", "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"containerID": "sim://2"}}},
        ]}});
        assert_eq!(log_container(&pod, "a", false), Ok("1".into()));
        assert_eq!(
            log_container(&pod, "a", true),
            Err("previous terminated container \"a\" in pod \"p\" not found".into())
        );
        assert_eq!(log_container(&pod, "b", false), Ok("2".into()));
        assert_eq!(log_container(&pod, "b", true), Ok("2".into()));
        assert_eq!(
            log_container(&pod, "c", false),
            Err("container \"c\" in pod \"p\" is not available".into())
        );
        assert_eq!(
            exit_status(&["sh".into()], 3)["details"]["causes"][0]["message"],
            "3"
        );
    }
}
