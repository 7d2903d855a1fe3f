//! agnhost's `webhook` server in the sim: the admission webhook the e2e suite deploys
//! (`agnhost webhook --tls-cert-file=... --tls-private-key-file=... --port=8444`) and
//! registers with the API server, served on a connection of the simulated pod network.
//!
//! It terminates TLS with the certificate and key the container reads from its files (the
//! Secret volume the test mounts), then answers AdmissionReviews (admission.k8s.io v1 and
//! v1beta1) on agnhost's paths with agnhost's decisions, messages and JSON patches.
//! `GET /readyz` answers `ok` (the readiness probe; see [`crate::servers::Listener`]).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{json, Map, Value};

/// What the server needs beyond the connection.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub cert_pem: String,
    pub key_pem: String,
    /// `--sidecar-image` (empty: `/mutating-pods-sidecar` refuses).
    pub sidecar_image: String,
    /// agnhost `crd-conversion-webhook` rather than `webhook`: `/crdconvert` is served,
    /// the admission paths are not.
    pub crd_conversion: bool,
}

/// Serves one connection: TLS, then HTTP/1.1 requests until the client closes it.
pub(crate) async fn serve(io: tokio::io::DuplexStream, cfg: Config) {
    let (cert, key) = (cfg.cert_pem.clone(), cfg.key_pem.clone());
    let cfg = Arc::new(cfg);
    let service = hyper::service::service_fn(move |req| {
        let cfg = cfg.clone();
        async move { handle(req, &cfg).await }
    });
    serve_tls(io, &cert, &key, "agnhost webhook", service).await;
}

/// Serves one connection of agnhost porter's TLS port: every request gets its body.
pub(crate) async fn serve_porter_tls(
    io: tokio::io::DuplexStream,
    cert_pem: String,
    key_pem: String,
    l: crate::servers::Listener,
) {
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let (content_type, body) = crate::servers::porter_body(&l, req.method().as_str());
        async move {
            hyper::Response::builder()
                .header("Content-Type", content_type)
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        }
    });
    serve_tls(io, &cert_pem, &key_pem, "agnhost porter", service).await;
}

/// Serves one connection of a simulated TLS server: the handshake with the certificate
/// chain and key of these PEM texts, then HTTP/1.1 requests answered by `service` until
/// the client closes it. A certificate or key that does not load ends the connection, as
/// a server that failed to start would refuse it.
pub(crate) async fn serve_tls<S>(
    io: tokio::io::DuplexStream,
    cert_pem: &str,
    key_pem: &str,
    server: &str,
    service: S,
) where
    S: hyper::service::HttpService<Incoming>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Some(tls) = tls_server_config(cert_pem, key_pem) else {
        tracing::warn!(server, "the certificate or key does not load");
        return;
    };
    let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(io).await else {
        return;
    };
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}

/// A TLS server with the certificate chain and key of these PEM texts (None if either
/// does not load).
fn tls_server_config(cert_pem: &str, key_pem: &str) -> Option<Arc<rustls::ServerConfig>> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .ok()?;
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes()).ok()??;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .ok()
        .map(Arc::new)
}

/// Why a request gets no answer at all: Go's handler panicked (a nil response), and the
/// server drops the connection.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("handler gave no response")
    }
}

impl std::error::Error for Dropped {}

fn reply(code: u16, content_type: &str, body: impl Into<Bytes>) -> http::Response<Full<Bytes>> {
    let mut r = http::Response::new(Full::new(body.into()));
    *r.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::OK);
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

async fn handle(
    req: http::Request<Incoming>,
    cfg: &Config,
) -> Result<http::Response<Full<Bytes>>, Dropped> {
    let path = req.uri().path().to_owned();
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let json_body = content_type.as_deref() == Some("application/json");
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if cfg.crd_conversion {
        return Ok(match path.as_str() {
            "/crdconvert" => crd_convert(content_type.as_deref(), &body),
            "/readyz" => reply(200, "text/plain; charset=utf-8", "ok"),
            _ => reply(404, "text/plain; charset=utf-8", "404 page not found\n"),
        });
    }
    let Some(admit) = Admit::for_path(&path) else {
        return Ok(match path.as_str() {
            "/readyz" => reply(200, "text/plain; charset=utf-8", "ok"),
            _ => reply(404, "text/plain; charset=utf-8", "404 page not found\n"),
        });
    };
    // agnhost logs and answers nothing (an empty 200) for another content type.
    if !json_body {
        return Ok(reply(200, "text/plain; charset=utf-8", Bytes::new()));
    }
    let review: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let msg = format!("Request could not be decoded: {e}\n");
            return Ok(reply(400, "text/plain; charset=utf-8", msg));
        }
    };
    let api_version = review["apiVersion"].as_str().unwrap_or("").to_owned();
    if review["kind"] != "AdmissionReview"
        || !matches!(
            api_version.as_str(),
            "admission.k8s.io/v1" | "admission.k8s.io/v1beta1"
        )
    {
        let msg = format!(
            "Unsupported group version kind: {api_version}, Kind={}\n",
            review["kind"].as_str().unwrap_or("")
        );
        return Ok(reply(400, "text/plain; charset=utf-8", msg));
    }
    let request = &review["request"];
    let mut response = match admit {
        Admit::AllowAfterFiveSeconds => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            allow_with_message("this webhook allows all requests")
        }
        Admit::Deny => deny_with(json!({"message": "this webhook denies all requests"})),
        Admit::AddLabel => add_label(request),
        Admit::Pods => match admit_pods(request) {
            Verdict::Answer(r) => r,
            Verdict::Never => std::future::pending().await,
        },
        Admit::Attach => deny_attach(request),
        Admit::MutatePods => mutate_pods(request).ok_or(Dropped)?,
        Admit::MutatePodsSidecar => {
            mutate_pods_sidecar(request, &cfg.sidecar_image).ok_or(Dropped)?
        }
        Admit::ConfigMaps => admit_data(
            request,
            Some("configmaps"),
            "configmap",
            "the configmap contains unwanted key and value",
        )
        .ok_or(Dropped)?,
        Admit::MutateConfigMaps => mutate_data(request, Some("configmaps")).ok_or(Dropped)?,
        Admit::CustomResource => admit_data(
            request,
            None,
            "custom resource",
            "the custom resource contains unwanted data",
        )
        .ok_or(Dropped)?,
        Admit::MutateCustomResource => mutate_data(request, None).ok_or(Dropped)?,
        Admit::Crd => admit_crd(request),
    };
    response.insert("uid".into(), request["uid"].clone());
    let out = json!({
        "kind": "AdmissionReview",
        "apiVersion": api_version,
        "response": response,
    });
    Ok(reply(200, "application/json", out.to_string()))
}

/// agnhost `crd-conversion-webhook`'s `/crdconvert`: a ConversionReview (v1 or v1beta1,
/// in JSON) answered with the objects converted by its example converter.
fn crd_convert(content_type: Option<&str>, body: &[u8]) -> http::Response<Full<Bytes>> {
    let text = "text/plain; charset=utf-8";
    let ct = content_type.unwrap_or("");
    if !matches!(ct, "application/json" | "application/yaml") {
        return reply(400, text, format!("invalid Content-Type header `{ct}`\n"));
    }
    let review: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            let msg = format!(
                "failed to deserialize body ({}) with error {e}\n",
                String::from_utf8_lossy(body)
            );
            return reply(400, text, msg);
        }
    };
    let api_version = review["apiVersion"].as_str().unwrap_or("");
    if review["kind"] != "ConversionReview"
        || !matches!(
            api_version,
            "apiextensions.k8s.io/v1" | "apiextensions.k8s.io/v1beta1"
        )
    {
        let msg = format!(
            "Unsupported group version kind: {api_version}, Kind={}\n",
            review["kind"].as_str().unwrap_or("")
        );
        return reply(400, text, msg);
    }
    let request = &review["request"];
    let desired = request["desiredAPIVersion"].as_str().unwrap_or("");
    let mut converted = Vec::new();
    let mut result = json!({"metadata": {}, "status": "Success"});
    for obj in request["objects"].as_array().into_iter().flatten() {
        match convert_example(obj, desired) {
            Ok(mut o) => {
                o["apiVersion"] = json!(desired);
                converted.push(o);
            }
            Err(message) => {
                result = json!({"metadata": {}, "status": "Failure", "message": message});
                converted.clear();
                break;
            }
        }
    }
    let mut response = json!({"uid": request["uid"], "result": result});
    if !converted.is_empty() {
        response["convertedObjects"] = json!(converted);
    }
    let out = json!({
        "kind": "ConversionReview",
        "apiVersion": api_version,
        "request": {"uid": "", "desiredAPIVersion": "", "objects": null},
        "response": response,
    });
    reply(200, "application/json", out.to_string())
}

/// agnhost's example converter of `stable.example.com` v1 (`hostPort: "host:port"`) and
/// v2 (`host`, `port`).
fn convert_example(obj: &Value, to: &str) -> Result<Value, String> {
    let from = obj["apiVersion"].as_str().unwrap_or("");
    if from == to {
        return Err(format!(
            "conversion from a version to itself should not call the webhook: {to}"
        ));
    }
    let mut out = obj.clone();
    let Some(o) = out.as_object_mut() else {
        return Err(format!("unexpected conversion version {from:?}"));
    };
    match (from, to) {
        ("stable.example.com/v1", "stable.example.com/v2") => {
            if let Some(hp) = o.remove("hostPort") {
                let hp = hp.as_str().unwrap_or("").to_owned();
                let parts: Vec<&str> = hp.split(':').collect();
                if parts.len() != 2 {
                    return Err(format!("invalid hostPort value `{hp}`"));
                }
                o.insert("host".into(), json!(parts[0]));
                o.insert("port".into(), json!(parts[1]));
            }
        }
        ("stable.example.com/v2", "stable.example.com/v1") => {
            let (host, port) = (o.remove("host"), o.remove("port"));
            if host.is_some() || port.is_some() {
                let s = |v: Option<Value>| match v {
                    Some(Value::String(s)) => s,
                    Some(other) => other.to_string(),
                    None => String::new(),
                };
                o.insert("hostPort".into(), json!(format!("{}:{}", s(host), s(port))));
            }
        }
        ("stable.example.com/v1" | "stable.example.com/v2", _) => {
            return Err(format!("unexpected conversion version {to:?}"))
        }
        _ => return Err(format!("unexpected conversion version {from:?}")),
    }
    Ok(out)
}

/// agnhost's admission paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admit {
    AllowAfterFiveSeconds,
    Deny,
    AddLabel,
    Pods,
    Attach,
    MutatePods,
    MutatePodsSidecar,
    ConfigMaps,
    MutateConfigMaps,
    CustomResource,
    MutateCustomResource,
    Crd,
}

impl Admit {
    fn for_path(path: &str) -> Option<Admit> {
        Some(match path {
            "/always-allow-delay-5s" => Admit::AllowAfterFiveSeconds,
            "/always-deny" => Admit::Deny,
            "/add-label" => Admit::AddLabel,
            "/pods" => Admit::Pods,
            "/pods/attach" => Admit::Attach,
            "/mutating-pods" => Admit::MutatePods,
            "/mutating-pods-sidecar" => Admit::MutatePodsSidecar,
            "/configmaps" => Admit::ConfigMaps,
            "/mutating-configmaps" => Admit::MutateConfigMaps,
            "/custom-resource" => Admit::CustomResource,
            "/mutating-custom-resource" => Admit::MutateCustomResource,
            "/crd" => Admit::Crd,
            _ => return None,
        })
    }
}

type Response = Map<String, Value>;

fn allowed() -> Response {
    let mut r = Map::new();
    r.insert("allowed".into(), json!(true));
    r
}

fn allow_with_message(message: &str) -> Response {
    let mut r = allowed();
    r.insert("status".into(), status(json!({"message": message})));
    r
}

fn deny_with(status_fields: Value) -> Response {
    let mut r = Map::new();
    r.insert("allowed".into(), json!(false));
    r.insert("status".into(), status(status_fields));
    r
}

/// A metav1.Status as Go marshals it (its ListMeta is always there).
fn status(fields: Value) -> Value {
    let mut s = json!({"metadata": {}});
    if let (Some(s), Value::Object(f)) = (s.as_object_mut(), fields) {
        s.extend(f);
    }
    s
}

/// agnhost's answer to a request it cannot read: not allowed, the error as the message.
fn error_response(message: String) -> Response {
    deny_with(json!({"message": message}))
}

fn with_patch(mut r: Response, patch: &str) -> Response {
    r.insert(
        "patch".into(),
        json!(base64::engine::general_purpose::STANDARD.encode(patch)),
    );
    r.insert("patchType".into(), json!("JSONPatch"));
    r
}

/// The request's resource as Go prints a GroupVersionResource (`/v1, Resource=pods`).
fn resource_is(request: &Value, group: &str, version: &str, resource: &str) -> bool {
    let r = &request["resource"];
    r["group"].as_str().unwrap_or("") == group
        && r["version"].as_str().unwrap_or("") == version
        && r["resource"].as_str().unwrap_or("") == resource
}

fn gvr_string(group: &str, version: &str, resource: &str) -> String {
    format!("{group}/{version}, Resource={resource}")
}

fn labels(obj: &Value) -> &Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

fn add_label(request: &Value) -> Response {
    let obj = &request["object"];
    let l = labels(obj);
    match l.get("added-label").and_then(Value::as_str) {
        _ if l.is_empty() => with_patch(
            allowed(),
            r#"[{"op": "add", "path": "/metadata/labels", "value": {"added-label": "yes"}}]"#,
        ),
        None => with_patch(
            allowed(),
            r#"[{"op": "add", "path": "/metadata/labels/added-label", "value": "yes"}]"#,
        ),
        Some(v) if v != "yes" => with_patch(
            allowed(),
            r#"[{"op": "replace", "path": "/metadata/labels/added-label", "value": "yes"}]"#,
        ),
        Some(_) => allowed(),
    }
}

enum Verdict {
    Answer(Response),
    /// agnhost's `wait-forever`: the handler never returns.
    Never,
}

fn admit_pods(request: &Value) -> Verdict {
    if !resource_is(request, "", "v1", "pods") {
        return Verdict::Answer(error_response(format!(
            "expect resource to be {}",
            gvr_string("", "v1", "pods")
        )));
    }
    let pod = &request["object"];
    let mut allowed_ = true;
    let mut msg = String::new();
    match labels(pod).get("webhook-e2e-test").and_then(Value::as_str) {
        Some("webhook-disallow") => {
            allowed_ = false;
            msg.push_str("the pod contains unwanted label; ");
        }
        Some("wait-forever") => return Verdict::Never,
        _ => {}
    }
    for c in pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if c["name"]
            .as_str()
            .unwrap_or("")
            .contains("webhook-disallow")
        {
            allowed_ = false;
            msg.push_str("the pod contains unwanted container name; ");
        }
    }
    Verdict::Answer(if allowed_ {
        allowed()
    } else {
        deny_with(json!({"message": msg.trim()}))
    })
}

fn has_container(pod: &Value, list: &str, name: &str) -> bool {
    pod.pointer(&format!("/spec/{list}"))
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["name"] == name))
}

/// The pod patchers: None for another resource (agnhost's nil response, which drops the
/// connection).
fn mutate_pods(request: &Value) -> Option<Response> {
    let pod = &request["object"];
    if !resource_is(request, "", "v1", "pods") {
        return None;
    }
    if pod.pointer("/metadata/name").and_then(Value::as_str) == Some("webhook-to-be-mutated")
        && !has_container(pod, "initContainers", "webhook-added-init-container")
    {
        return Some(with_patch(
            allowed(),
            r#"[{"op":"add","path":"/spec/initContainers","value":[{"image":"webhook-added-image","name":"webhook-added-init-container","resources":{}}]}]"#,
        ));
    }
    Some(allowed())
}

fn mutate_pods_sidecar(request: &Value, image: &str) -> Option<Response> {
    if image.is_empty() {
        return Some(deny_with(json!({
            "status": "Failure",
            "message": "No image specified by the sidecar-image parameter",
            "code": 500,
        })));
    }
    if !resource_is(request, "", "v1", "pods") {
        return None;
    }
    if has_container(&request["object"], "containers", "webhook-added-sidecar") {
        return Some(allowed());
    }
    let patch = json!([{"op": "add", "path": "/spec/containers/-",
        "value": {"image": image, "name": "webhook-added-sidecar", "resources": {}}}]);
    Some(with_patch(allowed(), &patch.to_string()))
}

fn deny_attach(request: &Value) -> Response {
    if request["name"] != "to-be-attached-pod" {
        return allowed();
    }
    if !resource_is(request, "", "v1", "pods") {
        let r = &request["resource"];
        return error_response(format!(
            "expect resource to be {}, got {}",
            gvr_string("", "v1", "pods"),
            gvr_string(
                r["group"].as_str().unwrap_or(""),
                r["version"].as_str().unwrap_or(""),
                r["resource"].as_str().unwrap_or("")
            )
        ));
    }
    let sub = request["subResource"].as_str().unwrap_or("");
    if sub != "attach" {
        return error_response(format!("expect subresource to be attach, got {sub}"));
    }
    let opts = &request["object"];
    let stdin = opts["stdin"].as_bool().unwrap_or(false);
    if !stdin || opts["container"] != "container1" {
        return allowed();
    }
    deny_with(json!({"message": "attaching to pod 'to-be-attached-pod' is not allowed"}))
}

/// The ConfigMap and custom resource validators: `webhook-e2e-test: webhook-disallow` in
/// `data` refuses a create or update, `webhook-nondeletable` a delete. `resource`: the
/// only resource handled (None: any); another gets no answer (agnhost's nil response).
fn admit_data(
    request: &Value,
    resource: Option<&str>,
    what: &str,
    unwanted: &str,
) -> Option<Response> {
    if let Some(r) = resource {
        if !resource_is(request, "", "v1", r) {
            return None;
        }
    }
    let op = request["operation"].as_str().unwrap_or("");
    let obj = if op == "DELETE" {
        &request["oldObject"]
    } else {
        &request["object"]
    };
    let value = obj
        .pointer("/data/webhook-e2e-test")
        .and_then(Value::as_str);
    Some(match (value, op) {
        (Some("webhook-disallow"), "CREATE" | "UPDATE") => deny_with(json!({"reason": unwanted})),
        (Some("webhook-nondeletable"), "DELETE") => deny_with(json!({
            "reason": format!("the {what} cannot be deleted because it contains unwanted key and value")
        })),
        _ => allowed(),
    })
}

/// The two-stage mutators: `mutation-start: yes` adds `mutation-stage-1`, which (on the
/// second webhook) adds `mutation-stage-2`.
fn mutate_data(request: &Value, resource: Option<&str>) -> Option<Response> {
    if let Some(r) = resource {
        if !resource_is(request, "", "v1", r) {
            return None;
        }
    }
    let data = &request["object"]["data"];
    let stage = if data["mutation-stage-1"] == "yes" {
        Some(r#"[{"op": "add", "path": "/data/mutation-stage-2", "value": "yes"}]"#)
    } else if data["mutation-start"] == "yes" {
        Some(r#"[{"op": "add", "path": "/data/mutation-stage-1", "value": "yes"}]"#)
    } else {
        None
    };
    Some(match stage {
        Some(p) => with_patch(allowed(), p),
        None => allowed(),
    })
}

fn admit_crd(request: &Value) -> Response {
    let ok = ["v1", "v1beta1"].iter().any(|v| {
        resource_is(
            request,
            "apiextensions.k8s.io",
            v,
            "customresourcedefinitions",
        )
    });
    if !ok {
        let r = &request["resource"];
        return error_response(format!(
            "expect resource to be one of [{}, {}] but got {}",
            gvr_string(
                "apiextensions.k8s.io",
                "v1beta1",
                "customresourcedefinitions"
            ),
            gvr_string("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
            gvr_string(
                r["group"].as_str().unwrap_or(""),
                r["version"].as_str().unwrap_or(""),
                r["resource"].as_str().unwrap_or("")
            )
        ));
    }
    if labels(&request["object"]).get("webhook-e2e-test") == Some(&json!("webhook-disallow")) {
        return deny_with(json!({"message": "the crd contains unwanted label"}));
    }
    allowed()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(r: http::Response<Full<Bytes>>) -> (u16, Value) {
        let code = r.status().as_u16();
        let b = r.into_body().collect().await.expect("body").to_bytes();
        (code, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn crd_conversions_answer_as_agnhost() {
        let review = |desired: &str, obj: Value| {
            serde_json::to_vec(&json!({"kind": "ConversionReview",
                "apiVersion": "apiextensions.k8s.io/v1",
                "request": {"uid": "u1", "desiredAPIVersion": desired, "objects": [obj]}}))
            .expect("json")
        };
        let v1 = json!({"apiVersion": "stable.example.com/v1", "kind": "E",
            "metadata": {"name": "a"}, "hostPort": "localhost:8080"});
        let (code, out) = body_of(crd_convert(
            Some("application/json"),
            &review("stable.example.com/v2", v1.clone()),
        ))
        .await;
        assert_eq!(code, 200);
        assert_eq!(out["response"]["uid"], "u1");
        assert_eq!(out["response"]["result"]["status"], "Success");
        assert_eq!(
            out["response"]["convertedObjects"][0],
            json!({"apiVersion": "stable.example.com/v2", "kind": "E",
                "metadata": {"name": "a"}, "host": "localhost", "port": "8080"})
        );
        // And back.
        let v2 = out["response"]["convertedObjects"][0].clone();
        let (_, back) = body_of(crd_convert(
            Some("application/json"),
            &review("stable.example.com/v1", v2),
        ))
        .await;
        assert_eq!(back["response"]["convertedObjects"][0], v1);
        // A bad value and a conversion to the same version fail with agnhost's messages.
        let bad = json!({"apiVersion": "stable.example.com/v1", "hostPort": "nocolon"});
        let (_, out) = body_of(crd_convert(
            Some("application/json"),
            &review("stable.example.com/v2", bad),
        ))
        .await;
        assert_eq!(out["response"]["result"]["status"], "Failure");
        assert_eq!(
            out["response"]["result"]["message"],
            "invalid hostPort value `nocolon`"
        );
        let (_, out) = body_of(crd_convert(
            Some("application/json"),
            &review("stable.example.com/v1", v1),
        ))
        .await;
        assert_eq!(
            out["response"]["result"]["message"],
            "conversion from a version to itself should not call the webhook: stable.example.com/v1"
        );
        let r = crd_convert(Some("text/plain"), b"{}");
        assert_eq!(r.status().as_u16(), 400);
    }

    fn review(resource: &str, op: &str, obj: Value) -> Value {
        json!({"uid": "u", "operation": op,
            "resource": {"group": "", "version": "v1", "resource": resource},
            "object": obj, "oldObject": obj})
    }

    fn patch_of(r: &Response) -> Value {
        let b = base64::engine::general_purpose::STANDARD
            .decode(r["patch"].as_str().unwrap_or(""))
            .unwrap_or_default();
        serde_json::from_slice(&b).unwrap_or(Value::Null)
    }

    #[test]
    fn configmaps_are_refused_and_mutated_as_agnhost_does() {
        let bad = review(
            "configmaps",
            "CREATE",
            json!({"data": {"webhook-e2e-test": "webhook-disallow"}}),
        );
        let r = admit_data(
            &bad,
            Some("configmaps"),
            "configmap",
            "the configmap contains unwanted key and value",
        )
        .unwrap_or_default();
        assert_eq!(r["allowed"], false);
        assert_eq!(
            r["status"]["reason"],
            "the configmap contains unwanted key and value"
        );
        let keep = review(
            "configmaps",
            "DELETE",
            json!({"data": {"webhook-e2e-test": "webhook-nondeletable"}}),
        );
        let r = admit_data(&keep, Some("configmaps"), "configmap", "").unwrap_or_default();
        assert_eq!(
            r["status"]["reason"],
            "the configmap cannot be deleted because it contains unwanted key and value"
        );
        assert!(admit_data(
            &review("pods", "CREATE", json!({})),
            Some("configmaps"),
            "",
            ""
        )
        .is_none());

        let start = review(
            "configmaps",
            "CREATE",
            json!({"data": {"mutation-start": "yes"}}),
        );
        let r = mutate_data(&start, Some("configmaps")).unwrap_or_default();
        assert_eq!(patch_of(&r)[0]["path"], "/data/mutation-stage-1");
        assert_eq!(r["patchType"], "JSONPatch");
        let second = review(
            "configmaps",
            "CREATE",
            json!({"data": {"mutation-start": "yes", "mutation-stage-1": "yes"}}),
        );
        let r = mutate_data(&second, Some("configmaps")).unwrap_or_default();
        assert_eq!(patch_of(&r)[0]["path"], "/data/mutation-stage-2");
    }

    #[test]
    fn pods_labels_and_attach() {
        let p = review(
            "pods",
            "CREATE",
            json!({"metadata": {"labels": {"webhook-e2e-test": "webhook-disallow"}},
            "spec": {"containers": [{"name": "webhook-disallow"}]}}),
        );
        let Verdict::Answer(r) = admit_pods(&p) else {
            panic!("an answer")
        };
        assert_eq!(
            r["status"]["message"],
            "the pod contains unwanted label; the pod contains unwanted container name;"
        );
        let waits = review(
            "pods",
            "CREATE",
            json!({"metadata": {"labels": {"webhook-e2e-test": "wait-forever"}}}),
        );
        assert!(matches!(admit_pods(&waits), Verdict::Never));

        let r = add_label(&review("configmaps", "CREATE", json!({"metadata": {}})));
        assert_eq!(patch_of(&r)[0]["value"], json!({"added-label": "yes"}));
        let r = add_label(&review(
            "configmaps",
            "CREATE",
            json!({"metadata": {"labels": {"a": "b"}}}),
        ));
        assert_eq!(patch_of(&r)[0]["path"], "/metadata/labels/added-label");
        let r = add_label(&review(
            "configmaps",
            "CREATE",
            json!({"metadata": {"labels": {"added-label": "yes"}}}),
        ));
        assert!(r.get("patch").is_none());

        let mut attach = review(
            "pods",
            "CONNECT",
            json!({"stdin": true, "container": "container1"}),
        );
        attach["name"] = json!("to-be-attached-pod");
        attach["subResource"] = json!("attach");
        assert_eq!(
            deny_attach(&attach)["status"]["message"],
            "attaching to pod 'to-be-attached-pod' is not allowed"
        );
        attach["object"]["stdin"] = json!(false);
        assert_eq!(deny_attach(&attach)["allowed"], true);

        let mut mutated = review(
            "pods",
            "CREATE",
            json!({"metadata": {"name": "webhook-to-be-mutated"}, "spec": {}}),
        );
        let r = mutate_pods(&mutated).unwrap_or_default();
        assert_eq!(patch_of(&r)[0]["path"], "/spec/initContainers");
        mutated["object"]["spec"]["initContainers"] =
            json!([{"name": "webhook-added-init-container"}]);
        assert!(mutate_pods(&mutated).is_some_and(|r| r.get("patch").is_none()));
        assert!(mutate_pods(&review("configmaps", "CREATE", json!({}))).is_none());
        assert_eq!(
            mutate_pods_sidecar(&mutated, "").unwrap_or_default()["status"]["message"],
            "No image specified by the sidecar-image parameter"
        );
    }

    #[test]
    fn crds_with_the_label_are_refused() {
        let mut r = review(
            "customresourcedefinitions",
            "CREATE",
            json!({"metadata": {"labels": {"webhook-e2e-test": "webhook-disallow"}}}),
        );
        r["resource"] = json!({"group": "apiextensions.k8s.io", "version": "v1", "resource": "customresourcedefinitions"});
        assert_eq!(
            admit_crd(&r)["status"]["message"],
            "the crd contains unwanted label"
        );
        let other = review("configmaps", "CREATE", json!({}));
        assert_eq!(
            admit_crd(&other)["status"]["message"],
            "expect resource to be one of [apiextensions.k8s.io/v1beta1, Resource=customresourcedefinitions, apiextensions.k8s.io/v1, Resource=customresourcedefinitions] but got /v1, Resource=configmaps"
        );
    }
}
