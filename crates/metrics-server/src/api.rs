//! The HTTPS API of `metrics.k8s.io/v1beta1`: discovery, NodeMetrics and PodMetrics
//! (get and list, label and field selectors, Table), with delegated authentication and
//! authorization.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kumo_apimachinery::quantity::Quantity;
use kumo_apimachinery::selector::{FieldSelector, LabelSelector};
use kumo_apimachinery::status::{ApiError, GroupResource};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};

use kumo_client::delegated::{Attributes, Delegated, User};

use crate::scrape::{NodeMetrics, PodMetrics, Store, Usage};
use crate::Error;

pub const GROUP: &str = "metrics.k8s.io";
pub const VERSION: &str = "v1beta1";
const GROUP_VERSION: &str = "metrics.k8s.io/v1beta1";

type Body = Full<Bytes>;

/// The API, shared by every connection.
pub struct Api {
    store: Arc<Store>,
    delegated: Delegated,
}

/// A self-signed serving certificate for `localhost` (metrics-server makes one in memory
/// when given none; the APIService skips verification).
fn self_signed() -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Error> {
    let tls = |e: rcgen::Error| Error::Tls(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(tls)?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).map_err(tls)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("localhost@{stamp}"));
    let cert = params.self_signed(&key).map_err(tls)?;
    Ok((
        vec![cert.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    ))
}

impl Api {
    /// The API and its TLS configuration: the front-proxy CA verifies client certificates
    /// when the cluster publishes one (a client without a certificate may still come with
    /// a token).
    pub(crate) async fn new(
        client: crate::ClientFn,
        store: Arc<Store>,
    ) -> Result<(Arc<Api>, Arc<rustls::ServerConfig>), Error> {
        let (delegated, verifier) = Delegated::load(client)
            .await
            .map_err(|e| Error::Authentication(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| Error::Tls(e.to_string()))?;
        let builder = match verifier {
            Some(v) => builder.with_client_cert_verifier(v),
            None => builder.with_no_client_auth(),
        };
        let (certs, key) = self_signed()?;
        let mut tls = builder
            .with_single_cert(certs, key)
            .map_err(|e| Error::Tls(e.to_string()))?;
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let api = Arc::new(Api { store, delegated });
        Ok((api, Arc::new(tls)))
    }

    /// Serves HTTP on one TLS connection.
    pub(crate) async fn serve<S>(self: Arc<Self>, stream: tokio_rustls::server::TlsStream<S>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let peer: Option<Arc<Vec<CertificateDer<'static>>>> = stream
            .get_ref()
            .1
            .peer_certificates()
            .map(|c| Arc::new(c.iter().map(|c| c.clone().into_owned()).collect()));
        let api = self.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (api, peer) = (api.clone(), peer.clone());
            async move {
                Ok::<_, std::convert::Infallible>(
                    api.answer(req, peer.as_deref().map(Vec::as_slice)).await,
                )
            }
        });
        let served = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), service)
            .await;
        if let Err(e) = served {
            tracing::debug!(error = %e, "metrics-server: connection ended");
        }
    }

    async fn answer(
        &self,
        req: Request<Incoming>,
        peer: Option<&[CertificateDer<'static>]>,
    ) -> Response<Body> {
        let path = req.uri().path().to_owned();
        if matches!(path.as_str(), "/healthz" | "/livez" | "/readyz") {
            return text(StatusCode::OK, "ok");
        }
        let user = match self.delegated.authenticate(req.headers(), peer).await {
            Some(u) => u,
            None => return status(&ApiError::unauthorized()),
        };
        if !matches!(*req.method(), Method::GET | Method::HEAD) {
            return status(&ApiError::method_not_supported(
                &GroupResource::new(GROUP, resource_of(&path).unwrap_or("")),
                &req.method().as_str().to_lowercase(),
            ));
        }
        let query = query(&req);
        let attrs = attributes(&path, &query);
        if !self.delegated.authorize(&user, &attrs).await {
            return status(&forbidden(&user, &attrs));
        }
        let table = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|a| a.to_str().ok())
            .is_some_and(|a| a.contains("as=Table"));
        match route(&path) {
            Some(Route::Discovery(doc)) => json_response(StatusCode::OK, &doc),
            Some(Route::Nodes(name)) => self.nodes(name.as_deref(), &query, table),
            Some(Route::Pods(ns, name)) => self.pods(ns.as_deref(), name.as_deref(), &query, table),
            None => status(&ApiError::path_not_found()),
        }
    }

    fn nodes(
        &self,
        name: Option<&str>,
        q: &HashMap<String, String>,
        table: bool,
    ) -> Response<Body> {
        let all = self.store.nodes();
        if let Some(n) = name {
            return match all.iter().find(|m| m.name == n) {
                Some(m) if table => json_response(StatusCode::OK, &node_table(&[m])),
                Some(m) => json_response(StatusCode::OK, &node_json(m)),
                None => status(&ApiError::not_found(&GroupResource::new(GROUP, "nodes"), n)),
            };
        }
        let (labels, fields) = match selectors(q) {
            Ok(s) => s,
            Err(e) => return status(&e),
        };
        let items: Vec<&NodeMetrics> = all
            .iter()
            .filter(|m| labels.as_ref().is_none_or(|s| s.matches(&m.labels)))
            .filter(|m| {
                fields.as_ref().is_none_or(|f| {
                    f.matches(|field| (field == "metadata.name").then_some(m.name.as_str()))
                })
            })
            .collect();
        if table {
            return json_response(StatusCode::OK, &node_table(&items));
        }
        json_response(
            StatusCode::OK,
            &json!({
                "kind": "NodeMetricsList", "apiVersion": GROUP_VERSION, "metadata": {},
                "items": items.iter().map(|m| node_json(m)).collect::<Vec<_>>(),
            }),
        )
    }

    fn pods(
        &self,
        ns: Option<&str>,
        name: Option<&str>,
        q: &HashMap<String, String>,
        table: bool,
    ) -> Response<Body> {
        let all = self.store.pods();
        if let (Some(ns), Some(n)) = (ns, name) {
            return match all.iter().find(|m| m.namespace == ns && m.name == n) {
                Some(m) if table => json_response(StatusCode::OK, &pod_table(&[m])),
                Some(m) => json_response(StatusCode::OK, &pod_json(m)),
                None => status(&ApiError::not_found(&GroupResource::new(GROUP, "pods"), n)),
            };
        }
        let (labels, fields) = match selectors(q) {
            Ok(s) => s,
            Err(e) => return status(&e),
        };
        let items: Vec<&PodMetrics> = all
            .iter()
            .filter(|m| ns.is_none_or(|ns| m.namespace == ns))
            .filter(|m| labels.as_ref().is_none_or(|s| s.matches(&m.labels)))
            .filter(|m| {
                fields.as_ref().is_none_or(|f| {
                    f.matches(|field| match field {
                        "metadata.name" => Some(m.name.as_str()),
                        "metadata.namespace" => Some(m.namespace.as_str()),
                        _ => None,
                    })
                })
            })
            .collect();
        if table {
            return json_response(StatusCode::OK, &pod_table(&items));
        }
        json_response(
            StatusCode::OK,
            &json!({
                "kind": "PodMetricsList", "apiVersion": GROUP_VERSION, "metadata": {},
                "items": items.iter().map(|m| pod_json(m)).collect::<Vec<_>>(),
            }),
        )
    }
}

/// The parsed label and field selectors of a list.
type Selectors = (Option<LabelSelector>, Option<FieldSelector>);

fn selectors(q: &HashMap<String, String>) -> Result<Selectors, ApiError> {
    let labels = match q.get("labelSelector").filter(|s| !s.is_empty()) {
        Some(s) => Some(LabelSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?),
        None => None,
    };
    let fields = match q.get("fieldSelector").filter(|s| !s.is_empty()) {
        Some(s) => Some(FieldSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?),
        None => None,
    };
    Ok((labels, fields))
}

/// What a path asks for.
enum Route {
    Discovery(Value),
    /// nodes, or one node.
    Nodes(Option<String>),
    /// pods in a namespace (or all), or one pod.
    Pods(Option<String>, Option<String>),
}

fn api_group() -> Value {
    json!({
        "name": GROUP,
        "versions": [{"groupVersion": GROUP_VERSION, "version": VERSION}],
        "preferredVersion": {"groupVersion": GROUP_VERSION, "version": VERSION},
    })
}

fn route(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["apis"] => Some(Route::Discovery(json!({
            "kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()],
        }))),
        ["apis", GROUP] => {
            let mut g = api_group();
            g["kind"] = json!("APIGroup");
            g["apiVersion"] = json!("v1");
            Some(Route::Discovery(g))
        }
        ["apis", GROUP, VERSION] => Some(Route::Discovery(json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
            "resources": [
                {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics",
                 "verbs": ["get", "list"]},
                {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics",
                 "verbs": ["get", "list"]},
            ],
        }))),
        ["apis", GROUP, VERSION, "nodes"] => Some(Route::Nodes(None)),
        ["apis", GROUP, VERSION, "nodes", n] => Some(Route::Nodes(Some((*n).to_owned()))),
        ["apis", GROUP, VERSION, "pods"] => Some(Route::Pods(None, None)),
        ["apis", GROUP, VERSION, "namespaces", ns, "pods"] => {
            Some(Route::Pods(Some((*ns).to_owned()), None))
        }
        ["apis", GROUP, VERSION, "namespaces", ns, "pods", n] => {
            Some(Route::Pods(Some((*ns).to_owned()), Some((*n).to_owned())))
        }
        _ => None,
    }
}

fn resource_of(path: &str) -> Option<&'static str> {
    if path.contains("/pods") {
        Some("pods")
    } else if path.contains("/nodes") {
        Some("nodes")
    } else {
        None
    }
}

fn attributes(path: &str, q: &HashMap<String, String>) -> Attributes {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (namespace, rest): (&str, &[&str]) = match segs.as_slice() {
        ["apis", GROUP, VERSION, "namespaces", ns, rest @ ..] => (ns, rest),
        ["apis", GROUP, VERSION, rest @ ..] => ("", rest),
        _ => {
            return Attributes::NonResource {
                path: path.to_owned(),
                verb: "get".into(),
            }
        }
    };
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    match rest {
        [resource] if *resource == "nodes" || *resource == "pods" => Attributes::Resource {
            group: GROUP.into(),
            version: VERSION.into(),
            verb: if watch { "watch" } else { "list" }.into(),
            resource: (*resource).to_owned(),
            namespace: namespace.to_owned(),
            name: String::new(),
        },
        [resource, name] => Attributes::Resource {
            group: GROUP.into(),
            version: VERSION.into(),
            verb: "get".into(),
            resource: (*resource).to_owned(),
            namespace: namespace.to_owned(),
            name: (*name).to_owned(),
        },
        _ => Attributes::NonResource {
            path: path.to_owned(),
            verb: "get".into(),
        },
    }
}

/// The 403 of a denied request, worded as the API server words it.
fn forbidden(user: &User, attrs: &Attributes) -> ApiError {
    match attrs {
        Attributes::Resource {
            verb,
            resource,
            namespace,
            name,
            ..
        } => {
            let scope = if namespace.is_empty() {
                "at the cluster scope".to_owned()
            } else {
                format!("in the namespace \"{namespace}\"")
            };
            ApiError::forbidden(
                &GroupResource::new(GROUP, resource.clone()),
                name,
                &format!(
                    "User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{GROUP}\" {scope}",
                    user.name
                ),
            )
        }
        Attributes::NonResource { path, .. } => ApiError::forbidden(
            &GroupResource::new("", ""),
            "",
            &format!("User \"{}\" cannot get path \"{path}\"", user.name),
        ),
    }
}

fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    kumo_apimachinery::query::pairs(req.uri().query())
        .into_iter()
        .collect()
}

/// CPU nanocores as a quantity (`250m`, `123456789n`).
fn cpu(nanocores: u64) -> String {
    Quantity::parse(&format!("{nanocores}n"))
        .map(|q| q.to_string())
        .unwrap_or_else(|| format!("{nanocores}n"))
}

/// Bytes as a binary quantity (`64Mi`, `8200Ki`).
fn memory(bytes: u64) -> String {
    if bytes % 1024 == 0 {
        if let Some(q) = Quantity::parse(&format!("{}Ki", bytes / 1024)) {
            return q.to_string();
        }
    }
    bytes.to_string()
}

fn usage(u: &Usage) -> Value {
    json!({"cpu": cpu(u.nanocores), "memory": memory(u.memory)})
}

fn rfc3339(ms: i64) -> String {
    kumo_apimachinery::time::format_rfc3339(ms.div_euclid(1000)).unwrap_or_default()
}

fn now() -> String {
    rfc3339(crate::scrape::millis(std::time::SystemTime::now()))
}

fn window(d: Duration) -> String {
    kumo_apimachinery::time::format_go_duration(d)
}

fn node_json(m: &NodeMetrics) -> Value {
    json!({
        "kind": "NodeMetrics", "apiVersion": GROUP_VERSION,
        "metadata": {"name": m.name, "creationTimestamp": now(), "labels": m.labels},
        "timestamp": rfc3339(m.usage.at_ms),
        "window": window(m.usage.window),
        "usage": usage(&m.usage),
    })
}

fn pod_json(m: &PodMetrics) -> Value {
    json!({
        "kind": "PodMetrics", "apiVersion": GROUP_VERSION,
        "metadata": {
            "name": m.name, "namespace": m.namespace, "creationTimestamp": now(),
            "labels": m.labels,
        },
        "timestamp": rfc3339(m.at_ms),
        "window": window(m.window),
        "containers": m.containers.iter().map(|(name, u)| json!({"name": name, "usage": usage(u)}))
            .collect::<Vec<_>>(),
    })
}

fn columns() -> Value {
    json!([
        {"name": "Name", "type": "string", "format": "name", "description": "The object's name.", "priority": 0},
        {"name": "cpu", "type": "string", "format": "quantity", "description": "CPU usage, in cores.", "priority": 0},
        {"name": "memory", "type": "string", "format": "quantity", "description": "Memory working set, in bytes.", "priority": 0},
        {"name": "Window", "type": "string", "format": "duration", "description": "The window the usage was measured over.", "priority": 0},
    ])
}

fn table(rows: Vec<Value>) -> Value {
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {},
        "columnDefinitions": columns(), "rows": rows,
    })
}

fn node_table(items: &[&NodeMetrics]) -> Value {
    table(
        items
            .iter()
            .map(|m| {
                let u = usage(&m.usage);
                json!({
                    "cells": [m.name, u["cpu"], u["memory"], window(m.usage.window)],
                    "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                               "metadata": {"name": m.name, "labels": m.labels}},
                })
            })
            .collect(),
    )
}

fn pod_table(items: &[&PodMetrics]) -> Value {
    table(
        items
            .iter()
            .map(|m| {
                // A pod's usage is the sum over its containers.
                let total = Usage {
                    nanocores: m.containers.iter().map(|(_, u)| u.nanocores).sum(),
                    memory: m.containers.iter().map(|(_, u)| u.memory).sum(),
                    at_ms: m.at_ms,
                    window: m.window,
                };
                let u = usage(&total);
                json!({
                    "cells": [m.name, u["cpu"], u["memory"], window(m.window)],
                    "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                               "metadata": {"name": m.name, "namespace": m.namespace, "labels": m.labels}},
                })
            })
            .collect(),
    )
}

fn text(code: StatusCode, body: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn status(e: &ApiError) -> Response<Body> {
    json_response(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &e.to_status(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_canonical() {
        assert_eq!(cpu(250_000_000), "250m");
        assert_eq!(cpu(123_456_789), "123456789n");
        assert_eq!(memory(64 << 20), "64Mi");
        assert_eq!(memory(8200 * 1024), "8200Ki");
        assert_eq!(memory(1000), "1000");
    }

    #[test]
    fn paths_route_and_authorize() {
        let q = HashMap::new();
        assert_eq!(
            attributes("/apis/metrics.k8s.io/v1beta1/namespaces/a/pods", &q),
            Attributes::Resource {
                group: GROUP.into(),
                version: VERSION.into(),
                verb: "list".into(),
                resource: "pods".into(),
                namespace: "a".into(),
                name: String::new()
            }
        );
        assert_eq!(
            attributes("/apis/metrics.k8s.io/v1beta1/nodes/n1", &q),
            Attributes::Resource {
                group: GROUP.into(),
                version: VERSION.into(),
                verb: "get".into(),
                resource: "nodes".into(),
                namespace: String::new(),
                name: "n1".into()
            }
        );
        assert!(matches!(
            attributes("/apis/metrics.k8s.io/v1beta1", &q),
            Attributes::NonResource { .. }
        ));
        assert!(matches!(
            route("/apis/metrics.k8s.io/v1beta1/namespaces/a/pods/p"),
            Some(Route::Pods(Some(_), Some(_)))
        ));
        assert!(route("/apis/other").is_none());
    }
}
