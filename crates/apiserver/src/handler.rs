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

/// Percent-decoding of a query component (`+` is a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: Option<&str>) -> BTreeMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (unescape(k), unescape(v)),
            None => (unescape(p), String::new()),
        })
        .collect()
}

/// Handles one request, counted in `/metrics` as upstream counts it.
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let started = std::time::Instant::now();
    if req.method() == Method::GET && req.uri().path() == "/metrics" {
        let text = state
            .metrics
            .render(&state.registry, &*state.rest.store)
            .await;
        let mut resp = text_response(StatusCode::OK, text);
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return resp;
    }
    let labels = crate::metrics::classify(
        &state.registry,
        req.method().as_str(),
        req.uri().path(),
        &parse_query(req.uri().query()),
        req.headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
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
            return resp.map(full);
        }
    }
    if method == Method::GET
        && matches!(trimmed, "/api" | "/apis")
        && negotiate::wants_aggregated_discovery(accept_header.as_deref())
    {
        let doc = crate::discovery::aggregated(&state.registry, trimmed == "/api");
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

    let Some(accept) = negotiate::choose(accept_header.as_deref()) else {
        return error_response(&ApiError::not_acceptable(&[
            "application/json",
            "application/yaml",
            "application/json;as=Table;v=v1;g=meta.k8s.io",
        ]));
    };
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
    let mut resp = match result {
        Ok(Reply::Json(code, doc)) => json_response(code, &doc, accept.yaml),
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

async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    let limited = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::request_entity_too_large(MAX_BODY_BYTES))
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "reading the request body: {e}"
        ))),
    }
}

fn health(state: &State, path: &str, query: &BTreeMap<String, String>) -> Response<Body> {
    let endpoint = path.trim_start_matches('/').split('/').next().unwrap_or("");
    let mut lines = vec!["[+]ping ok".to_owned(), "[+]log ok".to_owned()];
    let mut ok = true;
    for (name, check) in &state.checks {
        if check() {
            lines.push(format!("[+]{name} ok"));
        } else {
            ok = false;
            lines.push(format!("[-]{name} failed: reason withheld"));
        }
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
        ["apis"] => return get_only(Some(crate::discovery::group_list(&state.registry))),
        ["api", v] => return get_only(crate::discovery::resource_list(&state.registry, "", v)),
        ["apis", g] => return get_only(crate::discovery::group(&state.registry, g)),
        ["apis", g, v] => return get_only(crate::discovery::resource_list(&state.registry, g, v)),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::path_not_found()),
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
    let gr = res.group_resource();
    // Subresources that only take a POST (pods/binding).
    if let (Some(s), Some(n)) = (sub, name) {
        if res.strategy.post_subresources().contains(&s) {
            return match *method {
                Method::POST => r.post_subresource(&res, ns, n, s, &req).await,
                // kube-apiserver has no route for the other methods: its router's 405.
                _ => Err(ApiError {
                    code: 405,
                    reason: "MethodNotAllowed",
                    message: "the server does not allow this method on the requested resource"
                        .into(),
                    details: Some(Box::default()),
                }),
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
        (m, _) => Err(ApiError::method_not_supported(
            &gr,
            &m.as_str().to_lowercase(),
        )),
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
        assert_eq!(unescape("%"), "%");
        assert_eq!(unescape("%4"), "%4");
        assert_eq!(unescape("%zz"), "%zz");
    }
}
