//! From an HTTP request to an answer: health, discovery, or a verb on a resource.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use kumo_apimachinery::status::ApiError;
use serde_json::Value;

use crate::auth::{Attributes, Decision, RequestInfo, TokenResult, UserInfo};
use crate::negotiate::{self, Accept, MAX_BODY_BYTES};
use crate::registry::Registry;
use crate::rest::{self, Reply, Rest};

/// Response body type: a full document or a stream of watch events.
pub type Body = BoxBody<Bytes, Infallible>;

/// A named health check.
pub type Check = (&'static str, Arc<dyn Fn() -> bool + Send + Sync>);

/// What every request handler shares.
pub struct State {
    pub registry: Registry,
    pub rest: Arc<Rest>,
    /// host:port clients reach the server at (for `/api`).
    pub address: String,
    /// Health checks beyond ping, with their current result.
    pub checks: Vec<Check>,
    /// The OpenAPI documents of `registry`, built on first request.
    pub openapi: crate::openapi::Documents,
    /// What `/metrics` reports.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Authentication and authorization.
    pub auth: crate::auth::Auth,
    /// The key service-account tokens are signed with, published for OIDC discovery.
    pub service_account_key: Option<Arc<crate::auth::serviceaccount::SigningKey>>,
    /// The client towards kubelets (pods/log, exec, attach, portforward, nodes/proxy).
    pub kubelet: Option<Arc<crate::proxy::KubeletClient>>,
    /// Kubelet addresses that replace the Nodes' own (see [`crate::proxy::KubeletDialOverrides`]).
    pub kubelet_dial: crate::proxy::KubeletDialOverrides,
    /// Where pod IPs are reached when the host does not route them (see
    /// [`crate::resource_proxy::PodNetwork`]).
    pub pod_network: Option<Arc<dyn crate::resource_proxy::PodNetwork>>,
    /// The APIServices served by extension API servers (see [`crate::aggregator`]).
    pub aggregator: Arc<crate::aggregator::Aggregator>,
}

/// A backend's answer body passed on as it arrives, each frame flushed (logs that follow,
/// watches); `keep` lives as long as the body is read (the backend connection).
pub(crate) fn relay(mut body: Incoming, keep: impl Send + 'static) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let _keep = keep;
        while let Some(Ok(f)) = body.frame().await {
            if let Ok(d) = f.into_data() {
                if tx.send(d).await.is_err() {
                    return;
                }
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(hyper::body::Frame::data(b)), rx))
    });
    http_body_util::StreamBody::new(stream).boxed()
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

fn json_response(code: u16, doc: &Value, yaml: bool) -> Response<Body> {
    let (ct, body) = if yaml {
        match serde_yaml::to_string(doc) {
            Ok(y) => ("application/yaml", Bytes::from(y)),
            Err(_) => ("application/json", Bytes::from(doc.to_string() + "\n")),
        }
    } else {
        // Like Go's json.Encoder, which kube-apiserver writes with, end with a newline.
        ("application/json", Bytes::from(doc.to_string() + "\n"))
    };
    let mut resp = Response::new(full(body));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = header::HeaderValue::from_str(ct) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

/// An answer in Kubernetes protobuf; kinds the protobuf schema does not know (custom
/// resources) go as JSON when the client takes JSON too, else 406 as upstream.
fn protobuf_response(code: u16, doc: &Value, json_too: bool) -> Response<Body> {
    match kumo_apimachinery::protobuf::encode(doc) {
        Ok(bytes) => {
            let mut resp = Response::new(full(bytes));
            *resp.status_mut() =
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(negotiate::PROTOBUF),
            );
            resp
        }
        Err(_) if json_too => json_response(code, doc, false),
        Err(_) => error_response(&ApiError::not_acceptable(&[
            "application/json",
            "application/yaml",
        ])),
    }
}

/// A watch stream in protobuf frames (`application/vnd.kubernetes.protobuf;stream=watch`).
/// An event that cannot be encoded ends the stream: the client watches again.
fn protobuf_stream(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Response<Body> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let frame = rx.recv().await?;
        let event: Value = serde_json::from_slice(&frame).ok()?;
        let bytes = kumo_apimachinery::protobuf::encode_watch_frame(&event).ok()?;
        Some((Ok::<_, Infallible>(Frame::data(Bytes::from(bytes))), rx))
    });
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/vnd.kubernetes.protobuf;stream=watch"),
    );
    resp
}

fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status(), false)
}

fn text_response(code: StatusCode, text: String) -> Response<Body> {
    let mut resp = Response::new(full(text));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    resp
}

fn parse_query(q: Option<&str>) -> BTreeMap<String, String> {
    kumo_apimachinery::query::pairs(q).into_iter().collect()
}

/// Handles one request from a connection whose client certificate (verified by TLS)
/// named `peer`: authentication, authorization, then the answer, counted in `/metrics` as
/// upstream counts it.
pub async fn handle(
    state: Arc<State>,
    peer: crate::auth::x509::ClientCert,
    req: Request<Incoming>,
) -> Response<Body> {
    let query = parse_query(req.uri().query());
    let user = match authenticate(&state, &peer, &req).await {
        Ok(u) => u,
        Err(e) => return error_response(&e),
    };
    crate::audit::authenticated(&user);
    let info = RequestInfo::parse(req.method().as_str(), req.uri().path(), &query);
    let user = match impersonate(&state, user, req.headers()) {
        Ok(u) => u,
        Err(e) => return error_response(&e),
    };
    let attrs = Attributes::new(user, &info);
    match crate::audit::authorized(&attrs, state.auth.authorize(&attrs)) {
        Decision::Allow(_) => {}
        Decision::Deny(reason) | Decision::NoOpinion(reason) => {
            tracing::debug!(user = %attrs.user.name, verb = %attrs.verb, resource = %attrs.resource, path = %attrs.path, "forbidden");
            return error_response(&crate::auth::forbidden(&attrs, &reason));
        }
    }
    if crate::proxy::handles(&attrs) {
        return crate::auth::USER
            .scope(attrs.user.clone(), crate::proxy::serve(state, attrs, req))
            .await;
    }
    let backend = state.aggregator.backend_for(req.uri().path()).or_else(|| {
        state
            .aggregator
            .openapi_v3_backend(req.uri().path(), |key| {
                state.openapi.v3_group(&state.registry, key).is_some()
            })
    });
    if let Some(backend) = backend {
        let user = attrs.user.clone();
        return crate::aggregator::serve(state, backend, user, req).await;
    }
    if crate::resource_proxy::handles(&attrs) {
        return crate::auth::USER
            .scope(
                attrs.user.clone(),
                crate::resource_proxy::serve(state, attrs, req),
            )
            .await;
    }
    crate::auth::USER
        .scope(attrs.user, handle_authorized(state, req))
        .await
}

/// The user of a request: its client certificate's, its bearer token's, or anonymous
/// where anonymous requests are allowed; else 401.
async fn authenticate(
    state: &State,
    peer: &crate::auth::x509::ClientCert,
    req: &Request<Incoming>,
) -> Result<UserInfo, ApiError> {
    use crate::auth::x509::ClientCert;
    if let ClientCert::User(u) = peer {
        return Ok(UserInfo::clone(u));
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_owned())
        })
        .filter(|t| !t.is_empty());
    if let Some(token) = bearer {
        return match state.auth.authenticate_token(&token, &[]).await {
            TokenResult::User(u, _) => Ok(u),
            TokenResult::Invalid(why) => {
                tracing::debug!(reason = %why, "invalid bearer token");
                Err(crate::auth::unauthorized())
            }
            TokenResult::NotMine => Err(crate::auth::unauthorized()),
        };
    }
    // A bad certificate fails the request even where anonymous ones pass (upstream's
    // anonymous authenticator is FailOnError behind the others).
    if matches!(peer, ClientCert::Absent) && crate::auth::anonymous_allowed(req.uri().path()) {
        return Ok(UserInfo::anonymous());
    }
    Err(crate::auth::unauthorized())
}

/// Acting as another user (`kubectl --as`, `--as-group`): the requester must be allowed
/// to `impersonate` each user, group, uid and extra it names, as upstream checks them.
fn impersonate(
    state: &State,
    user: UserInfo,
    headers: &http::HeaderMap,
) -> Result<UserInfo, ApiError> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
            .collect()
    };
    let as_user = values("impersonate-user").into_iter().next();
    let as_groups = values("impersonate-group");
    let as_uid = values("impersonate-uid").into_iter().next();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in headers {
        if let Some(key) = k.as_str().strip_prefix("impersonate-extra-") {
            if let Ok(v) = v.to_str() {
                // Header names carry the key path-escaped (url.PathUnescape upstream).
                extra
                    .entry(kumo_apimachinery::query::unescape_path(key))
                    .or_default()
                    .push(v.to_owned());
            }
        }
    }
    let Some(as_user) = as_user else {
        if as_groups.is_empty() && as_uid.is_none() && extra.is_empty() {
            return Ok(user);
        }
        return Err(ApiError::internal(
            "requested impersonation of groups, uid or extras without a user",
        ));
    };
    let check = |resource: &str, group: &str, namespace: &str, name: &str| {
        let attrs = Attributes {
            user: user.clone(),
            verb: "impersonate".into(),
            resource_request: true,
            api_group: group.into(),
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        };
        match state.auth.authorize(&attrs) {
            Decision::Allow(_) => Ok(()),
            Decision::Deny(r) | Decision::NoOpinion(r) => Err(crate::auth::forbidden(&attrs, &r)),
        }
    };
    let mut target = UserInfo {
        name: as_user.clone(),
        uid: as_uid.clone().unwrap_or_default(),
        groups: Vec::new(),
        extra: extra.clone(),
    };
    match target
        .service_account()
        .map(|(n, s)| (n.to_owned(), s.to_owned()))
    {
        Some((ns, sa)) => {
            check("serviceaccounts", "", &ns, &sa)?;
            if as_groups.is_empty() {
                target.groups = vec![
                    crate::auth::names::SERVICE_ACCOUNTS.to_owned(),
                    format!("{}:{ns}", crate::auth::names::SERVICE_ACCOUNTS),
                ];
            }
        }
        None => check("users", "", "", &as_user)?,
    }
    for g in &as_groups {
        check("groups", "", "", g)?;
        target.groups.push(g.clone());
    }
    if let Some(uid) = &as_uid {
        check("uids", "authentication.k8s.io", "", uid)?;
    }
    for (k, vs) in &extra {
        for v in vs {
            check(&format!("userextras/{k}"), "authentication.k8s.io", "", v)?;
        }
    }
    if target.name != crate::auth::names::ANONYMOUS
        && !target.in_group(crate::auth::names::ALL_AUTHENTICATED)
    {
        target
            .groups
            .push(crate::auth::names::ALL_AUTHENTICATED.to_owned());
    } else if target.name == crate::auth::names::ANONYMOUS
        && !target.in_group(crate::auth::names::ALL_UNAUTHENTICATED)
    {
        target
            .groups
            .push(crate::auth::names::ALL_UNAUTHENTICATED.to_owned());
    }
    Ok(target)
}

/// Answers an authenticated and authorized request.
async fn handle_authorized(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let started = std::time::Instant::now();
    if req.method() == Method::GET && matches!(req.uri().path(), "/metrics" | "/metrics/slis") {
        let text = if req.uri().path() == "/metrics" {
            state
                .metrics
                .render(&state.registry, &*state.rest.store)
                .await
        } else {
            state.metrics.render_slis()
        };
        let mut resp = text_response(StatusCode::OK, text);
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return resp;
    }
    let query = parse_query(req.uri().query());
    let labels = crate::metrics::classify(
        &state.registry,
        req.method().as_str(),
        req.uri().path(),
        &query,
        req.headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    // Upstream's WithRequestDeadline: a short request's `timeout` must be a Go duration.
    let long_running = labels
        .as_ref()
        .is_some_and(|l| l.is_watch() || l.verb == "CONNECT");
    if !long_running {
        if let Some(t) = query
            .get("timeout")
            .filter(|t| !t.is_empty() && !kumo_apimachinery::time::is_go_duration(t))
        {
            return error_response(&ApiError::bad_request(format!(
                "invalid timeout specified in the request URL - time: invalid duration {t:?}"
            )));
        }
    }
    let metrics = Arc::clone(&state.metrics);
    let resp = serve(state, req).await;
    let code = resp.status().as_u16();
    // Upstream instruments its routes only: a verb a resource does not serve has none.
    let Some(labels) = labels.filter(|_| code != 405) else {
        return resp;
    };
    if labels.is_watch() && code == 200 {
        // Open until the client or the server ends the stream.
        let guard = metrics.long_running(labels, code, started);
        return resp.map(|b| {
            b.map_frame(move |f| {
                let _open = &guard;
                f
            })
            .boxed()
        });
    }
    metrics.observe(&labels, code, started);
    resp
}

/// Answers one request: health, OpenAPI, discovery or a resource verb.
async fn serve(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = parse_query(req.uri().query());
    let span = tracing::debug_span!("request", %method, %path);
    let _enter = span.enter();
    let accept_header = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // The manager of writes that name none.
    let user_agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);

    // Health endpoints answer plain text.
    let trimmed = path.trim_end_matches('/');
    if matches!(trimmed, "/healthz" | "/livez" | "/readyz")
        || trimmed.starts_with("/healthz/")
        || trimmed.starts_with("/livez/")
        || trimmed.starts_with("/readyz/")
    {
        return health(&state, trimmed, &query);
    }

    if trimmed.starts_with("/openapi/") {
        let if_none_match = req
            .headers()
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok());
        if let Some(resp) = crate::openapi::serve(
            &state.openapi,
            &state.registry,
            &method,
            trimmed,
            &query,
            accept_header.as_deref(),
            if_none_match,
        ) {
            if trimmed == "/openapi/v3" && resp.status() == StatusCode::OK {
                return resp.map(|own| full(state.aggregator.extend_openapi_v3_index(own)));
            }
            return resp.map(full);
        }
    }
    if let (Some(key), &Method::GET) = (&state.service_account_key, &method) {
        if let Some(resp) = oidc_discovery(key, &state.address, trimmed) {
            return resp;
        }
    }
    if method == Method::GET
        && matches!(trimmed, "/api" | "/apis")
        && negotiate::wants_aggregated_discovery(accept_header.as_deref())
    {
        let mut doc = crate::discovery::aggregated(&state.registry, trimmed == "/api");
        if trimmed == "/apis" {
            state
                .aggregator
                .extend_aggregated(&state.registry, &mut doc);
        }
        let mut resp = Response::new(full(doc.to_string() + "\n"));
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(crate::discovery::AGGREGATED_CONTENT_TYPE),
        );
        headers.insert(header::VARY, header::HeaderValue::from_static("Accept"));
        return resp;
    }

    // Read the body, refusing oversized ones without buffering them.
    let body = match read_body(req.into_body()).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    crate::audit::request_body(content_type.as_deref(), &body);

    let Some(accept) = negotiate::choose(accept_header.as_deref()) else {
        return error_response(&negotiate::not_acceptable(
            accept_header.as_deref(),
            method == Method::GET && negotiate::is_collection_path(trimmed),
        ));
    };
    let aggregated_group = matches!(trimmed.split('/').filter(|s| !s.is_empty()).collect::<Vec<_>>().as_slice(),
        ["apis", g] if state.aggregator.group(&state.registry, g).is_some());
    if !aggregated_group && !routed(&state.registry, trimmed) {
        return text_response(StatusCode::NOT_FOUND, "404 page not found\n".into());
    }
    // Warnings the verbs add travel back with the answer.
    let verbs = async {
        let result = route(
            &state,
            &method,
            trimmed,
            &query,
            accept,
            content_type.as_deref(),
            &body,
        )
        .await;
        (result, rest::WARNINGS.with(|w| w.take()))
    };
    let (result, warnings) = rest::WARNINGS
        .scope(
            std::cell::RefCell::new(Vec::new()),
            crate::fieldmanager::USER_AGENT.scope(user_agent, verbs),
        )
        .await;
    let protobuf = negotiate::protobuf(accept_header.as_deref());
    let result = match (result, protobuf) {
        // Cached lists are JSON bytes: decoded again to be encoded as protobuf.
        (Ok(Reply::Raw(code, bytes)), Some(_)) => serde_json::from_slice(&bytes)
            .map(|doc| Reply::Json(code, doc))
            .map_err(ApiError::internal),
        (r, _) => r,
    };
    let mut resp = match result {
        Ok(Reply::Json(code, mut doc)) => {
            accept.version_meta(&mut doc);
            match protobuf {
                Some(json_too) => protobuf_response(code, &doc, json_too),
                None => json_response(code, &doc, accept.yaml),
            }
        }
        Ok(Reply::Stream(rx)) if protobuf == Some(false) => protobuf_stream(rx),
        Ok(Reply::Raw(code, bytes)) => {
            let mut resp = Response::new(full(bytes));
            *resp.status_mut() =
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            resp
        }
        Ok(Reply::Stream(rx)) => {
            let stream = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
            });
            let mut resp = Response::new(StreamBody::new(stream).boxed());
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err(e) => error_response(&e),
    };
    let mut sent = std::collections::HashSet::new();
    // Each distinct warning once, as kube-apiserver's recorder does.
    for w in warnings.into_iter().filter(|w| sent.insert(w.clone())) {
        // RFC 7234 warn-text: a quoted string, as kube-apiserver sends it.
        let text = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = header::HeaderValue::from_str(&format!("299 - \"{text}\"")) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

async fn read_body(mut body: Incoming) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt as _;
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.len() + data.len() > MAX_BODY_BYTES {
            // The rest is read and dropped beside the answer: over HTTP/2, a stream whose
            // body is abandoned is reset, and the client would never see the 413 that
            // HTTP/1.1 (and kube-apiserver on both) gives. Bounded, so a client cannot
            // keep a task reading forever.
            tokio::spawn(async move {
                let drain = async { while let Some(Ok(_)) = body.frame().await {} };
                let _ = tokio::time::timeout(std::time::Duration::from_secs(60), drain).await;
            });
            return Err(ApiError::request_entity_too_large(MAX_BODY_BYTES));
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

fn health(state: &State, path: &str, query: &BTreeMap<String, String>) -> Response<Body> {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let endpoint = parts.next().unwrap_or("");
    let single = parts.next();
    // ping and log always pass; readyz also names the informers' sync after etcd (kumo's
    // watch cache is synced before it serves).
    let mut all: Vec<(&str, bool)> = vec![("ping", true), ("log", true)];
    for (name, check) in &state.checks {
        all.push((name, check()));
        if *name == "etcd" && endpoint == "readyz" {
            all.push(("informer-sync", true));
        }
    }
    // `/<endpoint>/<check>`: that check alone.
    if let Some(name) = single {
        return match all.iter().find(|(n, _)| *n == name) {
            Some((_, true)) => text_response(StatusCode::OK, "ok".into()),
            Some((n, false)) => text_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("internal server error: {n} check failed\n"),
            ),
            None => text_response(StatusCode::NOT_FOUND, "404 page not found\n".into()),
        };
    }
    let excluded: Vec<&str> = query
        .get("exclude")
        .map(|e| e.split(',').filter(|x| !x.is_empty()).collect())
        .unwrap_or_default();
    let mut lines = Vec::new();
    let mut ok = true;
    for (name, passed) in &all {
        if excluded.contains(name) {
            lines.push(format!("[+]{name} excluded: ok"));
            continue;
        }
        state.metrics.observe_health(endpoint, name, *passed);
        if *passed {
            lines.push(format!("[+]{name} ok"));
        } else {
            ok = false;
            lines.push(format!("[-]{name} failed: reason withheld"));
        }
    }
    let unknown: Vec<&str> = excluded
        .iter()
        .filter(|e| !all.iter().any(|(n, _)| n == *e))
        .copied()
        .collect();
    if !unknown.is_empty() {
        lines.push(format!(
            "warn: some health checks cannot be excluded: no matches for {}",
            unknown
                .iter()
                .map(|u| format!("\"{u}\""))
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    if query.contains_key("verbose") {
        let verdict = if ok {
            format!("{endpoint} check passed")
        } else {
            format!("{endpoint} check failed")
        };
        lines.push(verdict);
        return text_response(code, lines.join("\n") + "\n");
    }
    if ok {
        text_response(code, "ok".into())
    } else {
        text_response(
            code,
            lines.join("\n") + &format!("\n{endpoint} check failed\n"),
        )
    }
}

/// Service-account issuer discovery (OpenID Connect): the issuer's configuration and its
/// public keys, so that others can verify service-account tokens.
fn oidc_discovery(
    key: &crate::auth::serviceaccount::SigningKey,
    address: &str,
    path: &str,
) -> Option<Response<Body>> {
    let (doc, content_type) = match path {
        "/.well-known/openid-configuration" => (
            serde_json::json!({
                "issuer": crate::auth::serviceaccount::ISSUER,
                "jwks_uri": format!("https://{address}/openid/v1/jwks"),
                "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["ES256"],
            }),
            "application/json",
        ),
        "/openid/v1/jwks" => (
            serde_json::json!({"keys": [key.jwk()]}),
            "application/jwk-set+json",
        ),
        _ => return None,
    };
    let mut resp = Response::new(full(doc.to_string()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("public, max-age=3600"),
    );
    Some(resp)
}

/// The 405 of kube-apiserver's router for a method a path has no route for.
fn router_method_not_allowed() -> ApiError {
    ApiError {
        code: 405,
        reason: "MethodNotAllowed",
        message: "the server does not allow this method on the requested resource".into(),
        details: Some(Box::default()),
    }
}

/// Dispatches by path and method.
#[allow(clippy::too_many_arguments)]
async fn route(
    state: &State,
    method: &Method,
    path: &str,
    query: &BTreeMap<String, String>,
    accept: Accept,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Reply, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let get_only = |doc: Option<Value>| -> Result<Reply, ApiError> {
        if method != Method::GET {
            return Err(ApiError::path_not_found());
        }
        doc.map(|d| Reply::Json(200, d))
            .ok_or_else(ApiError::path_not_found)
    };
    let (group, version, rest_segs): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return get_only(Some(crate::discovery::version())),
        ["api"] => return get_only(Some(crate::discovery::core_versions(&state.address))),
        ["apis"] => {
            let mut doc = crate::discovery::group_list(&state.registry);
            state
                .aggregator
                .extend_group_list(&state.registry, &mut doc);
            return get_only(Some(doc));
        }
        ["api", v] => return get_only(crate::discovery::resource_list(&state.registry, "", v)),
        ["apis", g] => {
            return get_only(
                crate::discovery::group(&state.registry, g)
                    .or_else(|| state.aggregator.group(&state.registry, g)),
            )
        }
        ["apis", g, v] => return get_only(crate::discovery::resource_list(&state.registry, g, v)),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::path_not_found()),
    };
    // The deprecated watch paths: /api/v1/watch/[namespaces/ns/]plural[/name].
    let (rest_segs, watch_path) = match rest_segs {
        ["watch", tail @ ..] => (tail, true),
        _ => (rest_segs, false),
    };
    // [plural] [plural name] [plural name sub]
    // [namespaces ns plural] [namespaces ns plural name] [namespaces ns plural name sub]
    let (ns, plural, name, sub) = match rest_segs {
        ["namespaces", ns, plural, tail @ ..]
            if state
                .registry
                .find(group, version, plural)
                .is_some_and(|r| r.namespaced) =>
        {
            match tail {
                [] => (Some(*ns), *plural, None, None),
                [name] => (Some(*ns), *plural, Some(*name), None),
                [name, sub] => (Some(*ns), *plural, Some(*name), Some(*sub)),
                _ => return Err(ApiError::path_not_found()),
            }
        }
        [plural] => (None, *plural, None, None),
        [plural, name] => (None, *plural, Some(*name), None),
        [plural, name, sub] => (None, *plural, Some(*name), Some(*sub)),
        _ => return Err(ApiError::path_not_found()),
    };
    let res = state
        .registry
        .find(group, version, plural)
        .ok_or_else(ApiError::path_not_found)?;
    if let Some(w) = res.strategy.deprecation() {
        rest::warn(w.to_owned());
    }
    if let Some(s) = sub {
        if !res.subresources.contains(&s) {
            return Err(ApiError::path_not_found());
        }
    }
    if res.namespaced && ns.is_none() && name.is_some() {
        return Err(ApiError::path_not_found());
    }
    if !res.namespaced && ns.is_some() {
        return Err(ApiError::path_not_found());
    }
    let req = rest::Request {
        query,
        accept,
        content_type,
        body,
    };
    let r = &state.rest;
    if watch_path {
        if *method != Method::GET || sub.is_some() {
            return Err(ApiError::path_not_found());
        }
        // A watch of one object is a watch of its collection narrowed to its name.
        let mut q = query.clone();
        q.insert("watch".into(), "true".into());
        if let Some(n) = name {
            let by_name = format!("metadata.name={n}");
            let fs = match q.get("fieldSelector").filter(|f| !f.is_empty()) {
                Some(f) => format!("{f},{by_name}"),
                None => by_name,
            };
            q.insert("fieldSelector".into(), fs);
        }
        let req = rest::Request { query: &q, ..req };
        return r.watch(res.clone(), ns.map(str::to_owned), &req).await;
    }
    // Resources and subresources that are answered, not stored (reviews, TokenRequest).
    let review = state
        .auth
        .reviews
        .iter()
        .find(|v| v.serves() == (res.group, res.plural, sub.unwrap_or("")));
    if let Some(review) = review {
        // kube-apiserver routes only POST to these: a named review has no route (404) and
        // another method gets the router's 405.
        if sub.is_none() && name.is_some() {
            return Err(ApiError::path_not_found());
        }
        if *method != Method::POST {
            return Err(router_method_not_allowed());
        }
        // They have no table convertor: kube-apiserver's negotiation refuses a Table.
        if accept.output == negotiate::Output::Table {
            return Err(negotiate::not_acceptable_here());
        }
        let dry_run = matches!(query.get("dryRun").map(String::as_str), Some("All"));
        let mut decoded = negotiate::decode_body(content_type, body)?;
        // A POSTed subresource (TokenRequest, Eviction) is a create of that subresource
        // for admission (NodeRestriction checks both).
        if let (Some(s), Some(n)) = (sub, name) {
            r.admit_post(&res, ns, n, s, &mut decoded, dry_run).await?;
        }
        let user = crate::auth::current_user();
        let (code, doc) = review
            .create(crate::auth::ReviewContext {
                namespace: ns,
                name,
                body: decoded,
                query,
                user: &user,
                dry_run,
                auth: &state.auth,
                rest: r,
                registry: &state.registry,
            })
            .await?;
        return Ok(Reply::Json(code, doc));
    }
    // Resources computed on request (componentstatuses): get and list only.
    if let Some(computed) = res.strategy.computed() {
        let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        return match (method, sub) {
            (&Method::GET, None) if !watch => r.get_computed(&res, computed, name, &req).await,
            _ => Err(router_method_not_allowed()),
        };
    }
    // Subresources that only take a POST (pods/binding).
    if let (Some(s), Some(n)) = (sub, name) {
        if res.strategy.post_subresources().contains(&s) {
            return match *method {
                Method::POST => r.post_subresource(&res, ns, n, s, &req).await,
                // kube-apiserver has no route for the other methods: its router's 405.
                _ => Err(router_method_not_allowed()),
            };
        }
    }
    match (method, name) {
        (&Method::GET, None) => {
            if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) {
                r.watch(res.clone(), ns.map(str::to_owned), &req).await
            } else {
                r.list(&res, ns, &req).await
            }
        }
        (&Method::POST, None) => r.create(&res, ns, &req).await,
        (&Method::DELETE, None) if res.strategy.delete_collection() => {
            r.delete_collection(&res, ns, &req).await
        }
        (&Method::GET, Some(n)) if sub == Some("scale") => r.get_scale(&res, ns, n, &req).await,
        (&Method::GET, Some(n)) => r.get(&res, ns, n, &req).await,
        (&Method::PUT, Some(n)) => r.update(&res, ns, n, sub, &req).await,
        (&Method::PATCH, Some(n)) => r.patch(&res, ns, n, sub, &req).await,
        (&Method::DELETE, Some(n)) if sub.is_none() => r.delete(&res, ns, n, &req).await,
        // Upstream registers a route per verb a resource serves: the rest is its router's.
        _ => Err(router_method_not_allowed()),
    }
}

/// Whether kube-apiserver would route `path` at all; the rest gets Go's plain-text
/// `404 page not found`, not a Status.
fn routed(registry: &crate::registry::Registry, path: &str) -> bool {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        // Every /api path has a route (an unknown version gets a 404 Status).
        ["version"] | ["api", ..] | ["apis"] => true,
        ["apis", g] => registry.groups().iter().any(|(name, _)| name == g),
        ["apis", g, v, ..] => registry.serves(g, v),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = parse_query(Some("labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1&x"));
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        assert_eq!(q["watch"], "1");
        assert_eq!(q["x"], "");
    }
}
