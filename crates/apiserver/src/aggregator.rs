//! The kube-aggregator's part of the API server: APIServices whose `spec.service` names a
//! Service are served by that Service's pods (an extension API server such as
//! sample-apiserver or metrics-server), not by this server.
//!
//! * Requests under `/apis/<group>/<version>` of such an APIService are authenticated and
//!   authorized here, then proxied over HTTPS to a ready endpoint of the Service (through
//!   the simulated pod network when the cluster has one), with the user in the
//!   `X-Remote-User`/`-Uid`/`-Group`/`-Extra-*` headers and the front-proxy client
//!   certificate as the TLS client identity, as kube-apiserver's proxy handler does. The
//!   backend's certificate is checked against `caBundle` for `<service>.<namespace>.svc`
//!   unless `insecureSkipTLSVerify`. An APIService that is not Available answers 503
//!   `service unavailable`.
//! * The availability controller sets each such APIService's `Available` condition with
//!   upstream's reasons and messages (ServiceNotFound, ServicePortError,
//!   EndpointsNotFound, MissingEndpoints, FailedDiscoveryCheck, Passed / `all checks
//!   passed`), keeping the other conditions. It checks a failing APIService every second
//!   and every APIService every 30 s and whenever one changes.
//! * Discovery: the groups appear in `/apis`, `/apis/<group>` and the aggregated discovery
//!   document, with the resources of the backend's own `/apis/<group>/<version>` answer
//!   (fetched by the availability check).
//! * Upgrade requests (WebSocket, SPDY) are passed through once the backend switches
//!   protocols, as the proxy's UpgradeAwareHandler does.
//! * OpenAPI v3: while an APIService is available, its backend's `/openapi/v3` index entries
//!   (fetched as `system:aggregator` with each check) join this server's index under the
//!   keys it does not serve itself, and `/openapi/v3/<key>` for those is proxied to the
//!   backend, as kube-aggregator's v3 spec proxier does. `/openapi/v2` gains each backend's
//!   paths under `/apis/<group>/<version>/` and the definitions they use (a name this server
//!   defines stays its own; upstream renames a conflicting one), as its spec aggregator
//!   merges them.
//!
//! Endpoints are resolved as with kube-apiserver's `--enable-aggregator-routing` (a pod
//! address of the Service's EndpointSlices), as the admission webhooks' client does.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use kumo_storage::{StorageError, Store};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};

use crate::auth::UserInfo;
use crate::handler::{Body, State};
use crate::mirror::Mirror;
use crate::registry::Registry;
use crate::resource_proxy::PodNetwork;
use crate::webhook_client::{dial_error, roots, tls_error, AbortOnDrop, CloseTolerant};

/// Where APIServices are stored.
const PREFIX: &str = "/registry/apiservices/";

/// How long a discovery check may take (upstream's discovery client timeout).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// How often every APIService is checked again (upstream's resync period).
const RESYNC: Duration = Duration::from_secs(30);

/// Largest discovery answer read from a backend.
const MAX_DISCOVERY: usize = 4 << 20;

/// An APIService served by a Service rather than by this server.
#[derive(Clone, Debug)]
pub struct Backend {
    pub name: String,
    pub group: String,
    pub version: String,
    namespace: String,
    service: String,
    port: u16,
    ca_bundle: String,
    insecure: bool,
    available: bool,
    group_priority: i64,
    version_priority: i64,
}

impl Backend {
    fn of(obj: &Value) -> Option<Backend> {
        let spec = obj.get("spec")?;
        let svc = spec.get("service").filter(|s| s.is_object())?;
        let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        Some(Backend {
            name: text(&obj["metadata"], "name"),
            group: text(spec, "group"),
            version: text(spec, "version"),
            namespace: text(svc, "namespace"),
            service: text(svc, "name"),
            port: svc
                .get("port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(443),
            ca_bundle: text(spec, "caBundle"),
            insecure: spec
                .get("insecureSkipTLSVerify")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            available: obj
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Available" && c["status"] == "True"),
            group_priority: spec
                .get("groupPriorityMinimum")
                .and_then(Value::as_i64)
                .unwrap_or(0),
            version_priority: spec
                .get("versionPriority")
                .and_then(Value::as_i64)
                .unwrap_or(0),
        })
    }

    /// The TLS server name the backend's certificate must hold.
    fn server_name(&self) -> String {
        format!("{}.{}.svc", self.service, self.namespace)
    }
}

/// The APIServices and what the backends last said about their resources.
pub struct Aggregator {
    services: Arc<Mirror>,
    /// The front-proxy client certificate and key (kube-apiserver's
    /// `--proxy-client-cert-file`/`--proxy-client-key-file`), when the PKI has them.
    client_cert: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    /// Each backend's last `APIResourceList`, by APIService name.
    discovery: RwLock<HashMap<String, Value>>,
    /// Each available backend's OpenAPI v3 index entries (key → `serverRelativeURL`), by
    /// APIService name.
    openapi_v3: RwLock<HashMap<String, serde_json::Map<String, Value>>>,
    /// Each available backend's part of `/openapi/v2`, by APIService name.
    openapi_v2: RwLock<HashMap<String, crate::openapi::V2Part>>,
}

impl std::fmt::Debug for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregator").finish_non_exhaustive()
    }
}

fn load_client_cert(
    pki: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let cert = std::fs::read(pki.join("front-proxy-client.crt")).map_err(|e| e.to_string())?;
    let key = std::fs::read(pki.join("front-proxy-client.key")).map_err(|e| e.to_string())?;
    let certs = rustls_pemfile::certs(&mut cert.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let key = rustls_pemfile::private_key(&mut key.as_slice())
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "no key in front-proxy-client.key".to_owned())?;
    Ok((certs, key))
}

impl Aggregator {
    /// Follows the stored APIServices; the proxy's client certificate comes from `pki`.
    pub async fn start(store: Arc<dyn Store>, pki: &Path) -> Result<Arc<Aggregator>, StorageError> {
        let services = Mirror::start(store, PREFIX).await?;
        let client_cert = match load_client_cert(pki) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "no front-proxy client certificate: aggregated API servers see no client certificate");
                None
            }
        };
        Ok(Arc::new(Aggregator {
            services,
            client_cert,
            discovery: RwLock::new(HashMap::new()),
            openapi_v3: RwLock::new(HashMap::new()),
            openapi_v2: RwLock::new(HashMap::new()),
        }))
    }

    fn backends(&self) -> Vec<Backend> {
        self.services
            .with(|m| m.values().filter_map(Backend::of).collect())
    }

    /// The backend serving `path`, if it is under `/apis/<group>/<version>` of an
    /// APIService with a Service.
    pub fn backend_for(&self, path: &str) -> Option<Backend> {
        let mut segs = path.split('/').filter(|s| !s.is_empty());
        if segs.next()? != "apis" {
            return None;
        }
        let (g, v) = (segs.next()?, segs.next()?);
        // Read in place: most paths are local group versions (no Service, no copy).
        let key = format!("{PREFIX}{v}.{g}");
        self.services
            .with(|m| m.get(&key).and_then(Backend::of))
            .filter(|b| b.group == g && b.version == v)
    }

    /// `/openapi/v3` with the backends' entries added, each under a key this server does
    /// not serve itself (upstream merges every APIService's index the same way).
    pub fn extend_openapi_v3_index(&self, own: bytes::Bytes) -> bytes::Bytes {
        let specs = self.openapi_v3.read().unwrap_or_else(|e| e.into_inner());
        if specs.is_empty() {
            return own;
        }
        let Ok(mut index) = serde_json::from_slice::<Value>(&own) else {
            return own;
        };
        let Some(paths) = index.get_mut("paths").and_then(Value::as_object_mut) else {
            return own;
        };
        let mut names: Vec<&String> = specs.keys().collect();
        names.sort();
        for entries in names.into_iter().filter_map(|n| specs.get(n)) {
            for (k, v) in entries {
                if !paths.contains_key(k) {
                    paths.insert(k.clone(), v.clone());
                }
            }
        }
        bytes::Bytes::from(index.to_string())
    }

    /// The backend whose OpenAPI v3 index lists `/openapi/v3/<key>`, for a key this server
    /// does not serve itself (`served`).
    pub fn openapi_v3_backend(&self, path: &str, served: impl Fn(&str) -> bool) -> Option<Backend> {
        let key = path.strip_prefix("/openapi/v3/")?.trim_end_matches('/');
        let name = {
            let specs = self.openapi_v3.read().unwrap_or_else(|e| e.into_inner());
            let mut owners: Vec<&String> = specs
                .iter()
                .filter(|(_, entries)| entries.contains_key(key))
                .map(|(n, _)| n)
                .collect();
            owners.sort();
            owners.first().map(|n| (*n).clone())?
        };
        if served(key) {
            return None;
        }
        self.services
            .with(|m| m.get(&format!("{PREFIX}{name}")).and_then(Backend::of))
    }

    /// The groups only backends serve, by priority, each with its versions by priority.
    fn groups(&self, registry: &Registry) -> Vec<(String, Vec<Backend>)> {
        let served = registry.groups();
        let mut out: Vec<(String, Vec<Backend>)> = Vec::new();
        for b in self.backends() {
            if b.group.is_empty() || served.iter().any(|(g, _)| *g == b.group) {
                continue;
            }
            match out.iter_mut().find(|(g, _)| *g == b.group) {
                Some((_, vs)) => vs.push(b),
                None => out.push((b.group.clone(), vec![b])),
            }
        }
        for (_, vs) in &mut out {
            vs.sort_by(|a, b| {
                b.version_priority
                    .cmp(&a.version_priority)
                    .then_with(|| a.version.cmp(&b.version))
            });
        }
        let priority = |vs: &[Backend]| vs.iter().map(|b| b.group_priority).max().unwrap_or(0);
        out.sort_by(|(ga, a), (gb, b)| priority(b).cmp(&priority(a)).then_with(|| ga.cmp(gb)));
        out
    }

    fn group_doc(name: &str, versions: &[Backend]) -> Value {
        let vs: Vec<Value> = versions
            .iter()
            .map(|b| json!({"groupVersion": format!("{name}/{}", b.version), "version": b.version}))
            .collect();
        json!({
            "name": name,
            "versions": vs,
            "preferredVersion": vs.first().cloned().unwrap_or(Value::Null),
        })
    }

    /// Adds the backends' groups to `/apis`'s APIGroupList.
    pub fn extend_group_list(&self, registry: &Registry, doc: &mut Value) {
        let entries = self
            .groups(registry)
            .into_iter()
            .map(|(g, vs)| {
                (
                    vs.first().map_or(0, |b| b.group_priority),
                    Self::group_doc(&g, &vs),
                )
            })
            .collect();
        if let Some(groups) = doc.get_mut("groups").and_then(Value::as_array_mut) {
            insert_by_priority(groups, "/name", entries);
        }
    }

    /// `/apis/<group>` of a group only backends serve.
    pub fn group(&self, registry: &Registry, name: &str) -> Option<Value> {
        let groups = self.groups(registry);
        let (g, vs) = groups.iter().find(|(g, _)| g == name)?;
        let mut doc = Self::group_doc(g, vs);
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        Some(doc)
    }

    /// Adds the backends' groups to the aggregated discovery document of `/apis`: the
    /// versions whose backend answered a discovery check.
    pub fn extend_aggregated(&self, registry: &Registry, doc: &mut Value) {
        let Some(items) = doc.get_mut("items").and_then(Value::as_array_mut) else {
            return;
        };
        let discovery = self.discovery.read().unwrap_or_else(|e| e.into_inner());
        let mut entries = Vec::new();
        for (g, vs) in self.groups(registry) {
            let versions: Vec<Value> = vs
                .iter()
                .filter_map(|b| {
                    let list = discovery.get(&b.name)?;
                    Some(json!({
                        "version": b.version,
                        "resources": aggregated_resources(list),
                        "freshness": if b.available { "Current" } else { "Stale" },
                    }))
                })
                .collect();
            if !versions.is_empty() {
                let priority = vs.first().map_or(0, |b| b.group_priority);
                entries.push((
                    priority,
                    json!({"metadata": {"name": g}, "versions": versions}),
                ));
            }
        }
        insert_by_priority(items, "/metadata/name", entries);
    }

    /// The TLS client towards `b`.
    fn tls(&self, b: &Backend) -> Result<Arc<rustls::ClientConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| e.to_string())?;
        let builder = if b.insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(crate::proxy::AnyServer(provider)))
        } else {
            builder.with_root_certificates(roots(&b.ca_bundle)?)
        };
        let mut cfg = match &self.client_cert {
            Some((certs, key)) => builder
                .with_client_auth_cert(certs.clone(), key.clone_key())
                .map_err(|e| e.to_string())?,
            None => builder.with_no_client_auth(),
        };
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// Inserts the backends' group entries (already by priority) among the served ones as
/// kube-apiserver orders groups, by group priority: the built-in groups rank above every
/// backend, custom resources' groups (priority 1000) below those above 1000.
fn insert_by_priority(groups: &mut Vec<Value>, name_at: &str, entries: Vec<(i64, Value)>) {
    let first_custom = groups
        .iter()
        .position(|g| {
            let name = g.pointer(name_at).and_then(Value::as_str).unwrap_or("");
            !name.is_empty() && !crate::registry::apiregistration::is_builtin_group(name)
        })
        .unwrap_or(groups.len());
    let (high, low): (Vec<_>, Vec<_>) = entries.into_iter().partition(|(p, _)| *p > 1000);
    let at = first_custom;
    for (i, (_, doc)) in high.into_iter().enumerate() {
        groups.insert(at + i, doc);
    }
    groups.extend(low.into_iter().map(|(_, d)| d));
}

/// One APIResourceList in aggregated discovery form (apidiscovery.k8s.io/v2 resources,
/// subresources folded into their resource).
fn aggregated_resources(list: &Value) -> Vec<Value> {
    let all: Vec<&Value> = list
        .get("resources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let text = |r: &Value, k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let kind = |r: &Value| json!({"group": text(r, "group"), "version": text(r, "version"), "kind": text(r, "kind")});
    let mut out: Vec<Value> = all
        .iter()
        .filter(|r| !text(r, "name").contains('/'))
        .map(|r| {
            let name = text(r, "name");
            let namespaced = r.get("namespaced").and_then(Value::as_bool) == Some(true);
            let mut doc = json!({
                "resource": name,
                "responseKind": kind(r),
                "scope": if namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": text(r, "singularName"),
                "verbs": r.get("verbs").cloned().unwrap_or_else(|| json!([])),
            });
            for k in ["shortNames", "categories"] {
                if let Some(v) = r
                    .get(k)
                    .filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
                {
                    doc[k] = v.clone();
                }
            }
            let subs: Vec<Value> = all
                .iter()
                .filter_map(|s| {
                    let sub = text(s, "name")
                        .strip_prefix(&format!("{name}/"))?
                        .to_owned();
                    Some(json!({
                        "subresource": sub,
                        "responseKind": kind(s),
                        "verbs": s.get("verbs").cloned().unwrap_or_else(|| json!([])),
                    }))
                })
                .collect();
            if !subs.is_empty() {
                doc["subresources"] = json!(subs);
            }
            doc
        })
        .collect();
    out.sort_by(|a, b| a["resource"].as_str().cmp(&b["resource"].as_str()));
    out
}

/// An HTTP/1.1 connection to `addr` over TLS for `server_name`, through the pod network
/// when there is one.
async fn dial<B>(
    pod_network: Option<&Arc<dyn PodNetwork>>,
    addr: &str,
    server_name: &str,
    tls: Arc<rustls::ClientConfig>,
) -> Result<(hyper::client::conn::http1::SendRequest<B>, AbortOnDrop), String>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let to: std::net::SocketAddr = addr
        .parse()
        .map_err(|_| format!("dial tcp {addr}: no such host"))?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| format!("tls: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(tls);
    match pod_network {
        Some(net) => {
            let conn = net.connect(to).map_err(|e| dial_error(addr, &e))?;
            // A stream nothing answers on yet (a pod still starting) must not hold the
            // request, discovery's included, forever.
            tokio::time::timeout(CHECK_TIMEOUT, handshake(connector, name, conn))
                .await
                .map_err(|_| format!("dial tcp {addr}: i/o timeout"))?
        }
        None => {
            let tcp = tokio::time::timeout(CHECK_TIMEOUT, tokio::net::TcpStream::connect(to))
                .await
                .map_err(|_| format!("dial tcp {addr}: i/o timeout"))?
                .map_err(|e| dial_error(addr, &e))?;
            tokio::time::timeout(CHECK_TIMEOUT, handshake(connector, name, tcp))
                .await
                .map_err(|_| format!("dial tcp {addr}: i/o timeout"))?
        }
    }
}

/// TLS, then HTTP/1.1 over `io`; the connection is driven until the returned guard drops.
async fn handshake<S, B>(
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
    io: S,
) -> Result<(hyper::client::conn::http1::SendRequest<B>, AbortOnDrop), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = connector
        .connect(name, io)
        .await
        .map_err(|e| tls_error(&e))?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(CloseTolerant(stream)))
            .await
            .map_err(|e| e.to_string())?;
    Ok((
        sender,
        // With upgrades: a connection that switches protocols hands its stream over.
        AbortOnDrop(tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
        })),
    ))
}

/// A plain-text answer, as Go's `http.Error` writes it.
fn text(code: StatusCode, message: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{message}\n"))).boxed());
    *r.status_mut() = code;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// client-go's headerKeyEscape: an extra's key percent-encoded where a header name could
/// not hold it.
fn escape_header_key(key: &str) -> String {
    let mut out = String::new();
    for b in key.bytes() {
        let legal = b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b);
        if legal {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Adds the user to a proxied request as client-go's SetAuthProxyHeaders does.
fn auth_proxy_headers(mut b: http::request::Builder, user: &UserInfo) -> http::request::Builder {
    b = b.header("X-Remote-User", user.name.as_str());
    if !user.uid.is_empty() {
        b = b.header("X-Remote-Uid", user.uid.as_str());
    }
    for g in &user.groups {
        b = b.header("X-Remote-Group", g.as_str());
    }
    for (k, vs) in &user.extra {
        let name = format!("X-Remote-Extra-{}", escape_header_key(k));
        for v in vs {
            b = b.header(name.as_str(), v.as_str());
        }
    }
    b
}

/// Proxies an authorized request to its backend.
pub async fn serve(
    state: Arc<State>,
    backend: Backend,
    user: UserInfo,
    req: Request<Incoming>,
) -> Response<Body> {
    if !backend.available {
        return text(StatusCode::SERVICE_UNAVAILABLE, "service unavailable");
    }
    let tls = match state.aggregator.tls(&backend) {
        Ok(t) => t,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e),
    };
    let addr = match crate::webhook_client::resolve_service(
        &*state.rest.store,
        &backend.namespace,
        &backend.service,
        backend.port,
    )
    .await
    {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(apiservice = %backend.name, error = %e, "cannot resolve the backend");
            return text(StatusCode::SERVICE_UNAVAILABLE, "service unavailable");
        }
    };
    let (mut sender, conn) = match dial::<Incoming>(
        state.pod_network.as_ref(),
        &addr,
        &backend.server_name(),
        tls,
    )
    .await
    {
        Ok(s) => s,
        Err(e) => return text(StatusCode::SERVICE_UNAVAILABLE, &e),
    };
    // An upgrade (WebSocket, SPDY) passes through once the backend switches protocols, as
    // the aggregator's UpgradeAwareHandler does.
    let mut req = req;
    let upgrade = crate::resource_proxy::is_upgrade(req.headers());
    let front_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let pq = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".into());
    let listed: Vec<String> = parts
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    let mut out = Request::builder().method(parts.method.clone()).uri(pq);
    for (k, v) in &parts.headers {
        let name = k.as_str();
        // The credentials were this server's to check; the user travels in X-Remote-*.
        let dropped = crate::resource_proxy::hop_by_hop(name)
            || listed.iter().any(|l| l == name)
            || name == "host"
            || name == "authorization"
            || name.starts_with("impersonate-")
            || name.starts_with("x-remote-");
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
    out = out.header(
        header::HOST,
        format!("{}:{}", backend.server_name(), backend.port),
    );
    out = auth_proxy_headers(out, &user);
    let out = match out.body(body) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let resp = match sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => return text(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    };
    if let (Some(front), StatusCode::SWITCHING_PROTOCOLS) = (front_upgrade, resp.status()) {
        let mut resp = resp;
        let backend = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            // The backend connection hands its stream over only while it is driven.
            let _conn = conn;
            if let (Ok(f), Ok(b)) = (front.await, backend.await) {
                let (mut f, mut b) = (
                    hyper_util::rt::TokioIo::new(f),
                    hyper_util::rt::TokioIo::new(b),
                );
                let _ = tokio::io::copy_bidirectional(&mut f, &mut b).await;
            }
        });
        let mut r = Response::new(Full::new(Bytes::new()).boxed());
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *r.headers_mut() = resp.headers().clone();
        return r;
    }
    let (rparts, rbody) = resp.into_parts();
    let mut head = Response::new(());
    *head.status_mut() = rparts.status;
    for (k, v) in &rparts.headers {
        if !crate::resource_proxy::hop_by_hop(k.as_str()) {
            head.headers_mut().append(k, v.clone());
        }
    }
    // The answer streams as it comes (a watch stays open); the connection lives as long.
    let streamed = crate::handler::relay(rbody, conn);
    let (head, _) = head.into_parts();
    Response::from_parts(head, streamed)
}

/// The Available condition of one check: (status, reason, message).
type Verdict = (&'static str, &'static str, String);

/// Upstream's availability checks of one APIService; the backend's APIResourceList when
/// its discovery check passed.
async fn check(state: &State, b: &Backend) -> (Verdict, Option<Value>) {
    let store = &*state.rest.store;
    let svc_ref = format!("service/{} in {:?}", b.service, b.namespace);
    let svc = match store
        .get(
            format!("/registry/services/{}/{}", b.namespace, b.service).as_bytes(),
            None,
        )
        .await
    {
        Ok((Some(kv), _)) => serde_json::from_slice::<Value>(&kv.value).unwrap_or(Value::Null),
        Ok((None, _)) => {
            return (
                (
                    "False",
                    "ServiceNotFound",
                    format!("{svc_ref} is not present"),
                ),
                None,
            )
        }
        Err(e) => {
            return (
                (
                    "Unknown",
                    "ServiceAccessError",
                    format!("{svc_ref} cannot be checked due to: {e}"),
                ),
                None,
            )
        }
    };
    let typ = svc
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    if typ == "ClusterIP" {
        let port = svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("port").and_then(Value::as_u64) == Some(u64::from(b.port)));
        let Some(port) = port else {
            return (
                (
                    "False",
                    "ServicePortError",
                    format!("{svc_ref} is not listening on port {}", b.port),
                ),
                None,
            );
        };
        let port_name = port.get("name").and_then(Value::as_str).unwrap_or("");
        let slices = match store
            .range(kumo_storage::RangeRequest {
                prefix: format!("/registry/endpointslices/{}/", b.namespace).into_bytes(),
                start: None,
                limit: 0,
                revision: None,
            })
            .await
        {
            Ok(page) => page
                .kvs
                .iter()
                .filter_map(|kv| serde_json::from_slice::<Value>(&kv.value).ok())
                .filter(|s| {
                    s.pointer("/metadata/labels/kubernetes.io~1service-name")
                        .and_then(Value::as_str)
                        == Some(b.service.as_str())
                })
                .collect::<Vec<_>>(),
            Err(e) => {
                return (
                    (
                        "Unknown",
                        "EndpointsAccessError",
                        format!("{svc_ref} cannot be checked due to: {e}"),
                    ),
                    None,
                )
            }
        };
        if slices.is_empty() {
            return (
                (
                    "False",
                    "EndpointsNotFound",
                    format!(
                        "cannot find endpointslices for service/{} in {:?}",
                        b.service, b.namespace
                    ),
                ),
                None,
            );
        }
        let active = slices.iter().any(|s| {
            let ready = s
                .get("endpoints")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|e| e.pointer("/conditions/ready").and_then(Value::as_bool) != Some(false));
            let port = s
                .get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|p| {
                    p.get("name").and_then(Value::as_str) == Some(port_name)
                        && p.get("port").is_some_and(|x| !x.is_null())
                });
            ready && port
        });
        if !active {
            return (
                (
                    "False",
                    "MissingEndpoints",
                    format!(
                        "endpointslices for service/{} in {:?} have no addresses with port name {port_name:?}",
                        b.service, b.namespace
                    ),
                ),
                None,
            );
        }
    }
    match discovery_check(state, b).await {
        Ok(list) => (("True", "Passed", "all checks passed".into()), list),
        Err(e) => (("False", "FailedDiscoveryCheck", e), None),
    }
}

/// Why a GET of a backend got no answer: the Service did not resolve (its message), or
/// the request to `url` failed (Go's client error).
enum FetchError {
    Resolve(String),
    Failed { url: String, why: String },
}

/// GETs `path` from the backend as `user` (in `system:masters` for the discovery check,
/// as upstream's), within [`CHECK_TIMEOUT`]: the status, the body and the URL.
async fn fetch(
    state: &State,
    b: &Backend,
    path: &str,
    user: (&str, Option<&str>),
) -> Result<(u16, Bytes, String), FetchError> {
    let addr = crate::webhook_client::resolve_service(
        &*state.rest.store,
        &b.namespace,
        &b.service,
        b.port,
    )
    .await
    .map_err(FetchError::Resolve)?;
    let url = format!("https://{addr}{path}");
    let failed = |why: String| FetchError::Failed {
        url: url.clone(),
        why,
    };
    let tls = state.aggregator.tls(b).map_err(failed)?;
    let exchange = async {
        let (mut sender, _conn) =
            dial::<Full<Bytes>>(state.pod_network.as_ref(), &addr, &b.server_name(), tls).await?;
        let mut req = Request::get(path)
            .header(header::HOST, format!("{}:{}", b.server_name(), b.port))
            .header(header::ACCEPT, "application/json")
            .header("X-Remote-User", user.0);
        if let Some(g) = user.1 {
            req = req.header("X-Remote-Group", g);
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_DISCOVERY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Ok::<_, String>((status, body))
    };
    match tokio::time::timeout(CHECK_TIMEOUT, exchange).await {
        Err(_) => Err(failed(format!(
            "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        ))),
        Ok(Err(why)) => Err(failed(format!("Get \"{url}\": {why}"))),
        Ok(Ok((status, body))) => Ok((status, body, url)),
    }
}

/// GETs the backend's `/apis/<group>/<version>` as `system:kube-aggregator` in
/// `system:masters`; any 2xx passes.
async fn discovery_check(state: &State, b: &Backend) -> Result<Option<Value>, String> {
    let path = format!("/apis/{}/{}", b.group, b.version);
    let (status, body, url) = fetch(
        state,
        b,
        &path,
        ("system:kube-aggregator", Some("system:masters")),
    )
    .await
    .map_err(|e| match e {
        FetchError::Resolve(why) => why,
        FetchError::Failed { url, why } => {
            format!("failing or missing response from {url}: {why}")
        }
    })?;
    if !(200..300).contains(&status) {
        return Err(format!("bad status from {url}: {status}"));
    }
    Ok(serde_json::from_slice::<Value>(&body)
        .ok()
        .filter(|v| v.get("kind").and_then(Value::as_str) == Some("APIResourceList")))
}

/// The backend's `/openapi/v2` filtered to the APIService's paths (`/apis/<group>/<version>/`)
/// and the definitions they use, as upstream's spec aggregator keeps it; None when it
/// serves none.
async fn openapi_v2_part(state: &State, b: &Backend) -> Option<crate::openapi::V2Part> {
    let doc = openapi_document(state, b, "/openapi/v2").await?;
    let prefix = format!("/apis/{}/{}/", b.group, b.version);
    let paths: serde_json::Map<String, Value> = doc
        .get("paths")
        .and_then(Value::as_object)?
        .iter()
        .filter(|(p, _)| p.starts_with(&prefix))
        .map(|(p, v)| (p.clone(), v.clone()))
        .collect();
    let all = doc.get("definitions").and_then(Value::as_object)?;
    let mut definitions = serde_json::Map::new();
    let mut pending = vec![Value::Object(paths.clone()).to_string()];
    while let Some(text) = pending.pop() {
        for name in text
            .split("\"$ref\":\"#/definitions/")
            .skip(1)
            .filter_map(|r| r.split('"').next())
        {
            if let (false, Some(d)) = (definitions.contains_key(name), all.get(name)) {
                definitions.insert(name.to_owned(), d.clone());
                pending.push(d.to_string());
            }
        }
    }
    Some(crate::openapi::V2Part { paths, definitions })
}

/// The backend's OpenAPI v3 index entries (`paths` of its `/openapi/v3`), fetched as
/// upstream's downloader does, as `system:aggregator`; None when it serves none.
async fn openapi_v3_index(state: &State, b: &Backend) -> Option<serde_json::Map<String, Value>> {
    let v = openapi_document(state, b, "/openapi/v3").await?;
    v.get("paths").and_then(Value::as_object).cloned()
}

/// A JSON document the backend serves at `path` to `system:aggregator` (upstream's
/// OpenAPI downloaders' user), if it answers 200.
async fn openapi_document(state: &State, b: &Backend, path: &str) -> Option<Value> {
    let (status, body, _) = fetch(state, b, path, ("system:aggregator", None))
        .await
        .ok()?;
    if status != 200 {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

/// Sets the Available condition of APIService `name` as upstream's SetAPIServiceCondition
/// does (the transition time moves only with the status), writing only on a change.
async fn record(state: &State, name: &str, (status, reason, message): Verdict) {
    let key = format!("{PREFIX}{name}");
    let Ok((Some(kv), _)) = state.rest.store.get(key.as_bytes(), None).await else {
        return;
    };
    let Ok(mut obj) = serde_json::from_slice::<Value>(&kv.value) else {
        return;
    };
    let now = crate::time::format_rfc3339(crate::time::now_secs());
    let mut conditions: Vec<Value> = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let wanted = json!({
        "type": "Available", "status": status, "reason": reason, "message": message,
    });
    match conditions.iter_mut().find(|c| c["type"] == "Available") {
        Some(c) => {
            if c["status"] == status && c["reason"] == reason && c["message"] == message.as_str() {
                return;
            }
            let since = if c["status"] == status {
                c.get("lastTransitionTime").cloned().unwrap_or(json!(now))
            } else {
                json!(now)
            };
            *c = wanted;
            c["lastTransitionTime"] = since;
        }
        None => {
            let mut c = wanted;
            c["lastTransitionTime"] = json!(now);
            conditions.push(c);
        }
    }
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    obj["status"]["conditions"] = json!(conditions);
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    let Ok(bytes) = serde_json::to_vec(&obj) else {
        return;
    };
    match state
        .rest
        .store
        .update(key.as_bytes(), bytes, Some(kv.mod_revision))
        .await
    {
        Ok(_) => {
            tracing::info!(apiservice = %name, status, reason, "APIService availability changed")
        }
        // A newer write is checked on the next pass.
        Err(StorageError::Conflict { .. }) | Err(StorageError::NotFound) => {}
        Err(e) => tracing::warn!(apiservice = %name, error = %e, "cannot record availability"),
    }
}

/// Keeps what APIService `name`'s backend last said (`Some`), or forgets it (`None`).
fn keep<T>(map: &RwLock<HashMap<String, T>>, name: &str, value: Option<T>) {
    let mut m = map.write().unwrap_or_else(|e| e.into_inner());
    match value {
        Some(v) => {
            m.insert(name.to_owned(), v);
        }
        None => {
            m.remove(name);
        }
    }
}

/// Forgets what APIServices other than `names` said (they are gone).
fn forget_others<T>(map: &RwLock<HashMap<String, T>>, names: &[String]) {
    map.write()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|n, _| names.contains(n));
}

/// The availability controller: runs until the process ends.
pub async fn run_available_controller(state: Arc<State>) {
    let mut last_full: Option<Instant> = None;
    let mut seen = 0;
    loop {
        let generation = state.aggregator.services.generation();
        let full = generation != seen || last_full.is_none_or(|t| t.elapsed() >= RESYNC);
        if full {
            last_full = Some(Instant::now());
            seen = generation;
        }
        let due: Vec<Backend> = state
            .aggregator
            .backends()
            .into_iter()
            .filter(|b| full || !b.available)
            .collect();
        let checks = due.into_iter().map(|b| {
            let state = Arc::clone(&state);
            async move {
                let (verdict, list) = check(&state, &b).await;
                {
                    let mut d = state
                        .aggregator
                        .discovery
                        .write()
                        .unwrap_or_else(|e| e.into_inner());
                    match list {
                        Some(l) => {
                            d.insert(b.name.clone(), l);
                        }
                        // A backend that stopped answering keeps its last document (stale).
                        None if verdict.0 == "True" => {
                            d.remove(&b.name);
                        }
                        None => {}
                    }
                }
                // The backend's OpenAPI is followed while it is available (upstream's
                // OpenAPI controllers drop the specs of an unavailable APIService).
                let (index, v2) = if verdict.0 == "True" {
                    (
                        openapi_v3_index(&state, &b).await,
                        openapi_v2_part(&state, &b).await,
                    )
                } else {
                    (None, None)
                };
                keep(&state.aggregator.openapi_v2, &b.name, v2);
                keep(&state.aggregator.openapi_v3, &b.name, index);
                record(&state, &b.name, verdict).await;
            }
        });
        futures::future::join_all(checks).await;
        // Forget the documents of APIServices that are gone.
        let names: Vec<String> = state
            .aggregator
            .backends()
            .into_iter()
            .map(|b| b.name)
            .collect();
        forget_others(&state.aggregator.discovery, &names);
        forget_others(&state.aggregator.openapi_v3, &names);
        forget_others(&state.aggregator.openapi_v2, &names);
        let parts = {
            let v2 = state
                .aggregator
                .openapi_v2
                .read()
                .unwrap_or_else(|e| e.into_inner());
            let mut named: Vec<(&String, &crate::openapi::V2Part)> = v2.iter().collect();
            named.sort_by(|a, b| a.0.cmp(b.0));
            named.into_iter().map(|(_, p)| p.clone()).collect()
        };
        state.openapi.set_v2_extra(parts);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_keys_are_escaped_as_client_go_does() {
        assert_eq!(escape_header_key("scopes"), "scopes");
        assert_eq!(escape_header_key("example.org/key"), "example.org%2Fkey");
        assert_eq!(escape_header_key("a b%"), "a%20b%25");
    }

    #[test]
    fn backend_groups_rank_by_priority_among_custom_ones() {
        let mut groups = vec![
            json!({"name": "apps"}),
            json!({"name": "stable.example.com"}),
        ];
        insert_by_priority(
            &mut groups,
            "/name",
            vec![
                (2000, json!({"name": "wardle.example.com"})),
                (500, json!({"name": "low.example.com"})),
            ],
        );
        let names: Vec<&str> = groups.iter().filter_map(|g| g["name"].as_str()).collect();
        assert_eq!(
            names,
            [
                "apps",
                "wardle.example.com",
                "stable.example.com",
                "low.example.com"
            ]
        );
    }

    #[test]
    fn resource_lists_fold_subresources() {
        let list = json!({"kind": "APIResourceList", "groupVersion": "wardle.example.com/v1alpha1",
        "resources": [
            {"name": "flunders", "singularName": "flunder", "namespaced": true, "kind": "Flunder",
             "verbs": ["get", "list"], "shortNames": []},
            {"name": "flunders/status", "singularName": "", "namespaced": true, "kind": "Flunder",
             "verbs": ["get", "patch"]},
            {"name": "fischers", "singularName": "fischer", "namespaced": false, "kind": "Fischer",
             "verbs": ["get"], "categories": ["all"]},
        ]});
        let out = aggregated_resources(&list);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["resource"], "fischers");
        assert_eq!(out[0]["scope"], "Cluster");
        assert_eq!(out[0]["categories"], json!(["all"]));
        assert_eq!(out[1]["resource"], "flunders");
        assert!(out[1].get("shortNames").is_none());
        assert_eq!(out[1]["subresources"][0]["subresource"], "status");
        assert_eq!(out[1]["subresources"][0]["responseKind"]["kind"], "Flunder");
    }
}
