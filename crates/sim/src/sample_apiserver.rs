//! k8s.io/sample-apiserver in the sim: the extension API server the e2e suite deploys
//! (image `e2e-test-images/sample-apiserver`, `--tls-cert-file`, `--tls-private-key-file`,
//! an etcd sidecar) and registers with an APIService, served on a connection of the
//! simulated pod network.
//!
//! It terminates TLS with the certificate and key the container reads from its files and
//! serves the `wardle.example.com` group as the real one does: discovery (`/apis`, the
//! group, `v1alpha1` with flunders and fischers, `v1beta1` with flunders), and create,
//! get, list (with label selectors), update, merge patch, delete and deletecollection of
//! both kinds, watch (a streamed body, or WebSocket text messages), with the BanFlunder admission plugin (a flunder named in a fischer's
//! `disallowedFlunders` is forbidden). Its OpenAPI v3 documents (`sample_openapi`) advertise
//! `fieldValidation`, which it honours: unknown fields are dropped, refused under Strict,
//! warned about under Warn (the default). Objects live in the container's memory, as the real
//! server's live in its etcd sidecar without a volume: a new container starts empty.
//!
//! What the sim does not do: it trusts the aggregator's `X-Remote-User` header without
//! checking the front-proxy client certificate, and it authorizes nothing (the real server
//! asks kube-apiserver with a SubjectAccessReview); a request without the header is
//! `system:anonymous` and forbidden, as the real server's default authorizer would answer.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{json, Map, Value};

/// The API group the server serves.
pub(crate) const GROUP: &str = "wardle.example.com";

/// What the server needs beyond the connection.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub cert_pem: String,
    pub key_pem: String,
    /// The container's id: whose objects these are.
    pub container: String,
}

/// One change, for watches.
#[derive(Clone, Debug)]
struct Change {
    revision: u64,
    plural: String,
    namespace: String,
    /// ADDED, MODIFIED or DELETED.
    kind: &'static str,
    /// The object as stored (its resourceVersion the change's).
    object: Value,
}

/// How many recent changes a watch can resume from.
const HISTORY: usize = 1000;

/// One server's objects: by (plural, namespace, name).
struct Objects {
    items: BTreeMap<(String, String, String), Value>,
    revision: u64,
    history: VecDeque<Change>,
    changes: tokio::sync::broadcast::Sender<Change>,
}

impl Default for Objects {
    fn default() -> Self {
        Objects {
            items: BTreeMap::new(),
            revision: 0,
            history: VecDeque::new(),
            changes: tokio::sync::broadcast::channel(256).0,
        }
    }
}

impl Objects {
    /// Records a change made at the current revision and tells the watches.
    fn changed(&mut self, plural: &str, namespace: &str, kind: &'static str, object: &Value) {
        let change = Change {
            revision: self.revision,
            plural: plural.to_owned(),
            namespace: namespace.to_owned(),
            kind,
            object: object.clone(),
        };
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(change.clone());
        let _ = self.changes.send(change);
    }
}

/// Every sim sample-apiserver's objects, by container id.
fn stores() -> &'static Mutex<HashMap<String, Objects>> {
    static STORES: OnceLock<Mutex<HashMap<String, Objects>>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// Serves one connection: TLS, then HTTP/1.1 requests until the client closes it.
pub(crate) async fn serve(io: tokio::io::DuplexStream, cfg: Config) {
    let (cert, key) = (cfg.cert_pem.clone(), cfg.key_pem.clone());
    let cfg = Arc::new(cfg);
    let service = hyper::service::service_fn(move |req| {
        let cfg = cfg.clone();
        async move { Ok::<_, Infallible>(handle(req, &cfg).await) }
    });
    crate::agnhost_webhook::serve_tls(io, &cert, &key, "sample-apiserver", service).await;
}

/// Adds a `Warning: 299 - "<text>"` header for each warning, as the API server does.
fn with_warnings(
    mut r: http::Response<Full<Bytes>>,
    warnings: &[String],
) -> http::Response<Full<Bytes>> {
    for w in warnings {
        let text = format!("299 - {}", serde_json::to_string(w).unwrap_or_default());
        if let Ok(v) = http::HeaderValue::from_str(&text) {
            r.headers_mut().append(http::header::WARNING, v);
        }
    }
    r
}

fn reply(code: u16, body: &Value) -> http::Response<Full<Bytes>> {
    let mut r = http::Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::OK);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn status(code: u16, reason: &str, message: String, details: Value) -> http::Response<Full<Bytes>> {
    let mut s = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    if !details.is_null() {
        s["details"] = details;
    }
    reply(code, &s)
}

fn not_found_path() -> http::Response<Full<Bytes>> {
    status(
        404,
        "NotFound",
        "the server could not find the requested resource".into(),
        json!({}),
    )
}

/// The resources of one version: (plural, singular, kind, namespaced).
pub(crate) fn resources(
    version: &str,
) -> &'static [(&'static str, &'static str, &'static str, bool)] {
    match version {
        "v1alpha1" => &[
            ("fischers", "fischer", "Fischer", false),
            ("flunders", "flunder", "Flunder", true),
        ],
        "v1beta1" => &[("flunders", "flunder", "Flunder", true)],
        _ => &[],
    }
}

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn group_doc() -> Value {
    let v = |v: &str| json!({"groupVersion": format!("{GROUP}/{v}"), "version": v});
    json!({"name": GROUP, "versions": [v("v1beta1"), v("v1alpha1")], "preferredVersion": v("v1beta1")})
}

fn resource_list(version: &str) -> Value {
    let rs: Vec<Value> = resources(version)
        .iter()
        .map(|(plural, singular, kind, namespaced)| {
            json!({"name": plural, "singularName": singular, "namespaced": namespaced,
                   "kind": kind, "verbs": VERBS})
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{version}"), "resources": rs})
}

pub(crate) fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or(""), 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// A watch request: `GET` of a collection with `watch=true`, from an identified user.
fn watch_request(req: &http::Request<Incoming>) -> Option<Watch> {
    let query = req.uri().query().unwrap_or("");
    let watching = matches!(query_param(query, "watch").as_deref(), Some("true" | "1"));
    let user = req
        .headers()
        .get("x-remote-user")
        .is_some_and(|v| !v.is_empty());
    if !watching || !user || req.method() != http::Method::GET {
        return None;
    }
    let segs: Vec<&str> = req
        .uri()
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (version, ns, plural) = match segs.as_slice() {
        ["apis", GROUP, v, "namespaces", ns, p] => (*v, *ns, *p),
        ["apis", GROUP, v, p] => (*v, "", *p),
        _ => return None,
    };
    let &(_, _, kind, namespaced) = resources(version).iter().find(|r| r.0 == plural)?;
    if !namespaced && !ns.is_empty() {
        return None;
    }
    let name = query_param(query, "fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name=").map(str::to_owned));
    Some(Watch {
        version: version.to_owned(),
        plural: plural.to_owned(),
        kind,
        namespace: ns.to_owned(),
        labels: query_param(query, "labelSelector").unwrap_or_default(),
        name,
        from: query_param(query, "resourceVersion")
            .and_then(|rv| rv.parse::<u64>().ok())
            .filter(|rv| *rv > 0),
        timeout: query_param(query, "timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(1800),
    })
}

/// What a watch follows.
struct Watch {
    version: String,
    plural: String,
    kind: &'static str,
    namespace: String,
    labels: String,
    name: Option<String>,
    /// Changes after this revision (None: every object first, as ADDED).
    from: Option<u64>,
    timeout: u64,
}

impl Watch {
    fn wants(&self, selector: &kumo_apimachinery::selector::LabelSelector, c: &Change) -> bool {
        c.plural == self.plural
            && (self.namespace.is_empty() || c.namespace == self.namespace)
            && selector.matches(&labels_of(&c.object))
            && self.name.as_ref().is_none_or(|n| {
                c.object.pointer("/metadata/name").and_then(Value::as_str) == Some(n)
            })
    }

    fn event(&self, c: &Change) -> Bytes {
        let mut o = c.object.clone();
        o["apiVersion"] = json!(format!("{GROUP}/{}", self.version));
        o["kind"] = json!(self.kind);
        Bytes::from(json!({"type": c.kind, "object": o}).to_string() + "\n")
    }
}

/// A watch: the objects (or the changes since `from`), then each change as it happens,
/// until `timeoutSeconds`. Over HTTP each event is a JSON line of a streamed body; a
/// WebSocket handshake gets each event as a text message, as the generic API server's
/// watch handler sends them.
fn watch(
    w: Watch,
    cfg: &Config,
    mut req: http::Request<Incoming>,
) -> http::Response<BoxBody<Bytes, Infallible>> {
    let selector = match kumo_apimachinery::selector::LabelSelector::parse(&w.labels) {
        Ok(s) => s,
        Err(e) => return status(400, "BadRequest", e.to_string(), Value::Null).map(BodyExt::boxed),
    };
    let (first, mut rx) = {
        let mut all = stores().lock().unwrap_or_else(|e| e.into_inner());
        let objects = all.entry(cfg.container.clone()).or_default();
        let first: Vec<Change> = match w.from {
            Some(rv) => objects
                .history
                .iter()
                .filter(|c| c.revision > rv)
                .cloned()
                .collect(),
            None => objects
                .items
                .iter()
                .map(|((p, ns, _), o)| Change {
                    revision: objects.revision,
                    plural: p.clone(),
                    namespace: ns.clone(),
                    kind: "ADDED",
                    object: o.clone(),
                })
                .collect(),
        };
        (first, objects.changes.subscribe())
    };
    let (tx, out) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let deadline = tokio::time::sleep(std::time::Duration::from_secs(w.timeout));
        tokio::pin!(deadline);
        for c in first.iter().filter(|c| w.wants(&selector, c)) {
            if tx.send(w.event(c)).await.is_err() {
                return;
            }
        }
        let last = first.last().map(|c| c.revision).or(w.from).unwrap_or(0);
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                c = rx.recv() => match c {
                    Ok(c) if c.revision > last && w.wants(&selector, &c) => {
                        if tx.send(w.event(&c)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // Too slow to follow: the watch ends and the client lists again.
                    Err(_) => return,
                },
            }
        }
    });
    if let Some(key) = websocket_key(&req) {
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(websocket_watch(upgrade, out));
        let mut r = http::Response::new(Full::new(Bytes::new()).boxed());
        *r.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
        let h = r.headers_mut();
        h.insert(
            http::header::UPGRADE,
            http::HeaderValue::from_static("websocket"),
        );
        h.insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("Upgrade"),
        );
        if let Ok(v) = http::HeaderValue::from_str(&kumo_apimachinery::websocket::accept_key(&key))
        {
            h.insert("sec-websocket-accept", v);
        }
        return r;
    }
    let stream = futures::stream::unfold(out, |mut out| async move {
        out.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(hyper::body::Frame::data(b)), out))
    });
    let mut r = http::Response::new(http_body_util::StreamBody::new(stream).boxed());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// The client's `Sec-WebSocket-Key` when the request is a WebSocket handshake.
fn websocket_key(req: &http::Request<Incoming>) -> Option<String> {
    let h = req.headers();
    let wants = h
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    wants
        .then(|| h.get("sec-websocket-key")?.to_str().ok().map(str::to_owned))
        .flatten()
}

/// Sends each watch event as a WebSocket text message, then a close message when the
/// watch ends; a client that goes away ends it.
async fn websocket_watch(
    upgrade: hyper::upgrade::OnUpgrade,
    mut events: tokio::sync::mpsc::Receiver<Bytes>,
) {
    use tokio::io::AsyncWriteExt;
    let Ok(io) = upgrade.await else {
        return;
    };
    let mut io = hyper_util::rt::TokioIo::new(io);
    while let Some(e) = events.recv().await {
        if io
            .write_all(&kumo_apimachinery::websocket::frame(0x1, &e))
            .await
            .is_err()
        {
            return;
        }
    }
    let _ = io
        .write_all(&kumo_apimachinery::websocket::frame(
            0x8,
            &1000u16.to_be_bytes(),
        ))
        .await;
    let _ = io.shutdown().await;
}

async fn handle(
    req: http::Request<Incoming>,
    cfg: &Config,
) -> http::Response<BoxBody<Bytes, Infallible>> {
    if let Some(w) = watch_request(&req) {
        return watch(w, cfg, req);
    }
    handle_plain(req, cfg).await.map(BodyExt::boxed)
}

async fn handle_plain(req: http::Request<Incoming>, cfg: &Config) -> http::Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let method = req.method().clone();
    let user = req
        .headers()
        .get("x-remote-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let table = req
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.split(',').next().unwrap_or("").contains("as=Table"));
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let ["healthz" | "livez" | "readyz"] = segs.as_slice() {
        let mut r = http::Response::new(Full::new(Bytes::from_static(b"ok")));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return r;
    }
    if user.is_empty() {
        let verb = method.as_str().to_ascii_lowercase();
        return status(
            403,
            "Forbidden",
            format!("forbidden: User \"system:anonymous\" cannot {verb} path \"{path}\""),
            json!({}),
        );
    }
    let get = method == http::Method::GET;
    match segs.as_slice() {
        ["openapi", "v3"] if get => return reply(200, &crate::sample_openapi::index()),
        ["openapi", "v2"] if get => {
            let mut r = http::Response::new(Full::new(crate::sample_openapi::v2().clone()));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            return r;
        }
        ["openapi", "v3", "apis", GROUP, v] if get => {
            let Some(d) = crate::sample_openapi::document(v) else {
                return not_found_path();
            };
            let mut r = http::Response::new(Full::new(d.body.clone()));
            let h = r.headers_mut();
            h.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            if let Ok(etag) = http::HeaderValue::from_str(&format!("\"{}\"", d.hash)) {
                h.insert(http::header::ETAG, etag);
            }
            return r;
        }
        ["apis"] if get => {
            return reply(
                200,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_doc()]}),
            )
        }
        ["apis", GROUP] if get => {
            let mut g = group_doc();
            g["kind"] = json!("APIGroup");
            g["apiVersion"] = json!("v1");
            return reply(200, &g);
        }
        ["apis", GROUP, v] if get && !resources(v).is_empty() => {
            return reply(200, &resource_list(v))
        }
        _ => {}
    }
    let (version, ns, rest) = match segs.as_slice() {
        ["apis", GROUP, v, "namespaces", ns, rest @ ..] if !rest.is_empty() => (*v, *ns, rest),
        ["apis", GROUP, v, rest @ ..] if !rest.is_empty() => (*v, "", rest),
        _ => return not_found_path(),
    };
    let (plural, name) = match rest {
        [p] => (*p, None),
        [p, n] => (*p, Some(*n)),
        _ => return not_found_path(),
    };
    let Some(&(_, _, kind, namespaced)) = resources(version).iter().find(|r| r.0 == plural) else {
        return not_found_path();
    };
    if namespaced == ns.is_empty() && !(namespaced && name.is_none() && get) {
        return not_found_path();
    }
    let req = Req {
        version,
        plural,
        kind,
        ns,
        query: &query,
        content_type: &content_type,
        body: &body,
        table,
    };
    let mut all = stores().lock().unwrap_or_else(|e| e.into_inner());
    let objects = all.entry(cfg.container.clone()).or_default();
    match (method.as_str(), name) {
        ("GET", None) => req.list(objects),
        ("POST", None) => req.create(objects),
        ("DELETE", None) => req.delete_collection(objects),
        ("GET", Some(n)) => req.get(objects, n),
        ("PUT", Some(n)) => req.update(objects, n),
        ("PATCH", Some(n)) => req.patch(objects, n),
        ("DELETE", Some(n)) => req.delete(objects, n),
        _ => status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
            json!({}),
        ),
    }
}

/// One resource request.
struct Req<'a> {
    version: &'a str,
    plural: &'a str,
    kind: &'a str,
    ns: &'a str,
    query: &'a str,
    content_type: &'a str,
    body: &'a [u8],
    /// The client asked for a `meta.k8s.io/v1` Table (kubectl get).
    table: bool,
}

impl Req<'_> {
    fn qualified(&self) -> String {
        format!("{}.{GROUP}", self.plural)
    }

    fn key(&self, name: &str) -> (String, String, String) {
        (self.plural.to_owned(), self.ns.to_owned(), name.to_owned())
    }

    fn not_found(&self, name: &str) -> http::Response<Full<Bytes>> {
        status(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", self.qualified()),
            json!({"name": name, "group": GROUP, "kind": self.plural}),
        )
    }

    /// The stored object as this version shows it.
    fn shown(&self, obj: &Value) -> Value {
        let mut o = obj.clone();
        o["apiVersion"] = json!(format!("{GROUP}/{}", self.version));
        o["kind"] = json!(self.kind);
        o
    }

    /// The request's object, or why it is a bad request.
    /// Drops the fields the kind's schema does not know, as `fieldValidation` asks:
    /// Strict refuses the request, Warn (the default) answers with a warning each, Ignore
    /// says nothing. Returns the warnings.
    #[allow(clippy::result_large_err)]
    fn check_fields(&self, obj: &mut Value) -> Result<Vec<String>, http::Response<Full<Bytes>>> {
        let unknown = crate::sample_openapi::drop_unknown_fields(self.version, self.kind, obj);
        let quoted: Vec<String> = unknown
            .iter()
            .map(|f| {
                format!(
                    "unknown field {}",
                    serde_json::to_string(f).unwrap_or_default()
                )
            })
            .collect();
        match query_param(self.query, "fieldValidation").as_deref() {
            Some("Strict") if !quoted.is_empty() => Err(status(
                400,
                "BadRequest",
                format!(
                    "{kind} in version \"{v}\" cannot be handled as a {kind}: strict decoding error: {}",
                    quoted.join(", "),
                    kind = self.kind,
                    v = self.version
                ),
                Value::Null,
            )),
            Some("Ignore") => Ok(Vec::new()),
            _ => Ok(quoted),
        }
    }

    fn decode(&self) -> Result<Value, String> {
        match serde_json::from_slice::<Value>(self.body) {
            Ok(v) if v.is_object() => Ok(v),
            Ok(_) => Err("the object provided is unrecognized".into()),
            Err(e) => Err(format!("the object provided is unrecognized: {e}")),
        }
    }

    /// The generic API server's default Table: Name and Created At, rows with the
    /// objects' metadata.
    fn table(&self, objects: &[&Value], revision: Option<u64>) -> http::Response<Full<Bytes>> {
        let rows: Vec<Value> = objects
            .iter()
            .map(|o| {
                let meta = o.get("metadata").cloned().unwrap_or_else(|| json!({}));
                json!({
                    "cells": [meta["name"], meta["creationTimestamp"]],
                    "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta},
                })
            })
            .collect();
        let mut t = json!({
            "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {},
            "columnDefinitions": [
                {"name": "Name", "type": "string", "format": "name", "description": "The object's name.", "priority": 0},
                {"name": "Created At", "type": "date", "format": "", "description": "When the object was created.", "priority": 0},
            ],
            "rows": rows,
        });
        if let Some(rv) = revision {
            t["metadata"]["resourceVersion"] = json!(rv.to_string());
        }
        reply(200, &t)
    }

    fn list(&self, objects: &Objects) -> http::Response<Full<Bytes>> {
        let selector = query_param(self.query, "labelSelector").unwrap_or_default();
        let selector = match kumo_apimachinery::selector::LabelSelector::parse(&selector) {
            Ok(s) => s,
            Err(e) => return status(400, "BadRequest", e.to_string(), Value::Null),
        };
        let matched: Vec<&Value> = objects
            .items
            .iter()
            .filter(|((p, ns, _), _)| p == self.plural && (self.ns.is_empty() || ns == self.ns))
            .filter(|(_, o)| selector.matches(&labels_of(o)))
            .map(|(_, o)| o)
            .collect();
        if self.table {
            return self.table(&matched, Some(objects.revision));
        }
        let items: Vec<Value> = matched.into_iter().map(|o| self.item(o)).collect();
        reply(
            200,
            &json!({
                "kind": format!("{}List", self.kind),
                "apiVersion": format!("{GROUP}/{}", self.version),
                "metadata": {"resourceVersion": objects.revision.to_string()},
                "items": items,
            }),
        )
    }

    /// An object as a list item (no kind or apiVersion, as typed lists encode them).
    fn item(&self, o: &Value) -> Value {
        let mut o = self.shown(o);
        if let Some(m) = o.as_object_mut() {
            m.remove("apiVersion");
            m.remove("kind");
        }
        o
    }

    fn create(&self, objects: &mut Objects) -> http::Response<Full<Bytes>> {
        let mut obj = match self.decode() {
            Ok(o) => o,
            Err(why) => return status(400, "BadRequest", why, Value::Null),
        };
        let warnings = match self.check_fields(&mut obj) {
            Ok(w) => w,
            Err(r) => return r,
        };
        with_warnings(self.create_checked(objects, obj), &warnings)
    }

    fn create_checked(&self, objects: &mut Objects, mut obj: Value) -> http::Response<Full<Bytes>> {
        let meta = obj
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if name.is_empty() {
            let prefix = meta
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if prefix.is_empty() {
                return status(
                    422,
                    "Invalid",
                    format!(
                        "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                        self.qualified()
                    ),
                    json!({"group": GROUP, "kind": self.kind, "causes": [{"reason": "FieldValueRequired", "message": "Required value: name or generateName is required", "field": "metadata.name"}]}),
                );
            }
            let suffix: String = uuid::Uuid::new_v4()
                .simple()
                .to_string()
                .chars()
                .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                .take(5)
                .collect();
            name = format!("{prefix}{suffix}");
        }
        if self.plural == "flunders" && banned(objects, &name) {
            return status(
                403,
                "Forbidden",
                format!(
                    "{} \"{name}\" is forbidden: this name may not be used, please change the resource name",
                    self.qualified()
                ),
                json!({"name": name, "group": GROUP, "kind": self.plural}),
            );
        }
        let key = self.key(&name);
        if objects.items.contains_key(&key) {
            return status(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", self.qualified()),
                json!({"name": name, "group": GROUP, "kind": self.plural}),
            );
        }
        objects.revision += 1;
        let mut m: Map<String, Value> = meta;
        m.insert("name".into(), json!(name));
        if !self.ns.is_empty() {
            m.insert("namespace".into(), json!(self.ns));
        }
        m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        m.insert(
            "resourceVersion".into(),
            json!(objects.revision.to_string()),
        );
        m.insert("creationTimestamp".into(), json!(now()));
        obj["metadata"] = Value::Object(m);
        // A Flunder's spec and status default to {}; a Fischer has neither.
        for k in ["spec", "status"].iter().filter(|_| self.kind == "Flunder") {
            if !obj.get(*k).is_some_and(Value::is_object) {
                obj[k] = json!({});
            }
        }
        let shown = self.shown(&obj);
        objects.changed(self.plural, self.ns, "ADDED", &obj);
        objects.items.insert(key, obj);
        reply(201, &shown)
    }

    fn get(&self, objects: &Objects, name: &str) -> http::Response<Full<Bytes>> {
        match objects.items.get(&self.key(name)) {
            Some(o) if self.table => self.table(&[o], None),
            Some(o) => reply(200, &self.shown(o)),
            None => self.not_found(name),
        }
    }

    fn store(
        &self,
        objects: &mut Objects,
        name: &str,
        mut obj: Value,
        old: &Value,
    ) -> http::Response<Full<Bytes>> {
        let sent_rv = obj
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let old_rv = old
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !sent_rv.is_empty() && sent_rv != old_rv {
            return status(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                    self.qualified()
                ),
                json!({"name": name, "group": GROUP, "kind": self.plural}),
            );
        }
        objects.revision += 1;
        for k in ["uid", "creationTimestamp", "name", "namespace"] {
            if let Some(v) = old.pointer(&format!("/metadata/{k}")) {
                obj["metadata"][k] = v.clone();
            }
        }
        obj["metadata"]["resourceVersion"] = json!(objects.revision.to_string());
        let shown = self.shown(&obj);
        objects.changed(self.plural, self.ns, "MODIFIED", &obj);
        objects.items.insert(self.key(name), obj);
        reply(200, &shown)
    }

    fn update(&self, objects: &mut Objects, name: &str) -> http::Response<Full<Bytes>> {
        let Some(old) = objects.items.get(&self.key(name)).cloned() else {
            return self.not_found(name);
        };
        let mut obj = match self.decode() {
            Ok(o) => o,
            Err(why) => return status(400, "BadRequest", why, Value::Null),
        };
        let warnings = match self.check_fields(&mut obj) {
            Ok(w) => w,
            Err(r) => return r,
        };
        if !obj.get("metadata").is_some_and(Value::is_object) {
            return status(
                400,
                "BadRequest",
                "metadata is required".into(),
                Value::Null,
            );
        }
        with_warnings(self.store(objects, name, obj, &old), &warnings)
    }

    fn patch(&self, objects: &mut Objects, name: &str) -> http::Response<Full<Bytes>> {
        let Some(old) = objects.items.get(&self.key(name)).cloned() else {
            return self.not_found(name);
        };
        let patch = match self.decode() {
            Ok(p) => p,
            Err(why) => return status(400, "BadRequest", why, Value::Null),
        };
        let essence = self.content_type.split(';').next().unwrap_or("").trim();
        if !matches!(
            essence,
            "application/merge-patch+json" | "application/strategic-merge-patch+json"
        ) {
            return status(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json; got {essence}"),
                Value::Null,
            );
        }
        let mut obj = old.clone();
        merge(&mut obj, &patch);
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            if patch.pointer("/metadata/resourceVersion").is_none() {
                m.remove("resourceVersion");
            }
        }
        let warnings = match self.check_fields(&mut obj) {
            Ok(w) => w,
            Err(r) => return r,
        };
        with_warnings(self.store(objects, name, obj, &old), &warnings)
    }

    fn delete(&self, objects: &mut Objects, name: &str) -> http::Response<Full<Bytes>> {
        let Some(mut old) = objects.items.remove(&self.key(name)) else {
            return self.not_found(name);
        };
        objects.revision += 1;
        old["metadata"]["resourceVersion"] = json!(objects.revision.to_string());
        objects.changed(self.plural, self.ns, "DELETED", &old);
        reply(
            200,
            &json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": GROUP, "kind": self.plural,
                            "uid": old.pointer("/metadata/uid").cloned().unwrap_or(Value::Null)},
            }),
        )
    }

    fn delete_collection(&self, objects: &mut Objects) -> http::Response<Full<Bytes>> {
        let selector = query_param(self.query, "labelSelector").unwrap_or_default();
        let selector = match kumo_apimachinery::selector::LabelSelector::parse(&selector) {
            Ok(s) => s,
            Err(e) => return status(400, "BadRequest", e.to_string(), Value::Null),
        };
        let doomed: Vec<_> = objects
            .items
            .iter()
            .filter(|((p, ns, _), o)| {
                p == self.plural
                    && (self.ns.is_empty() || ns == self.ns)
                    && selector.matches(&labels_of(o))
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut items = Vec::new();
        for k in doomed {
            if let Some(mut o) = objects.items.remove(&k) {
                objects.revision += 1;
                o["metadata"]["resourceVersion"] = json!(objects.revision.to_string());
                objects.changed(self.plural, &k.1, "DELETED", &o);
                items.push(self.item(&o));
            }
        }
        reply(
            200,
            &json!({
                "kind": format!("{}List", self.kind),
                "apiVersion": format!("{GROUP}/{}", self.version),
                "metadata": {"resourceVersion": objects.revision.to_string()},
                "items": items,
            }),
        )
    }
}

fn labels_of(o: &Value) -> BTreeMap<String, String> {
    o.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// BanFlunder: a flunder named in a fischer's `disallowedFlunders`.
fn banned(objects: &Objects, name: &str) -> bool {
    objects
        .items
        .iter()
        .filter(|((p, _, _), _)| p == "fischers")
        .any(|(_, f)| {
            f.get("disallowedFlunders")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|n| n.as_str() == Some(name)))
        })
}

/// RFC 7386 merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (k, v) in p {
        if v.is_null() {
            if let Some(t) = target.as_object_mut() {
                t.remove(k);
            }
        } else {
            merge(&mut target[k.as_str()], v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patches_as_rfc_7386() {
        let mut t = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        merge(&mut t, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
        assert_eq!(t, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
    }

    #[test]
    fn query_values_are_decoded() {
        assert_eq!(
            query_param("labelSelector=a%3Db%2Cc&x=1", "labelSelector").as_deref(),
            Some("a=b,c")
        );
        assert_eq!(query_param("x=1", "labelSelector"), None);
    }

    #[test]
    fn discovery_names_both_versions() {
        assert_eq!(group_doc()["preferredVersion"]["version"], "v1beta1");
        let l = resource_list("v1alpha1");
        assert_eq!(l["resources"].as_array().map(Vec::len), Some(2));
        assert_eq!(resource_list("v1beta1")["resources"][0]["kind"], "Flunder");
    }
}
