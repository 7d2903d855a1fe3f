//! Admission webhooks driven by the real kubectl: the test serves the webhooks itself over
//! HTTPS on 127.0.0.1 (a CA and a serving certificate made with rcgen), registers them with
//! `kubectl apply`, and checks denials, failure policies, mutation, selectors, timeouts,
//! dry-run and Service references with upstream's messages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

mod common;
use common::*;

/// A webhook server: its address, the CA bundle (base64 PEM) that trusts it, and the
/// AdmissionReviews it received.
struct Hooks {
    addr: SocketAddr,
    ca_bundle: String,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl Hooks {
    fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    /// The requests received at `path`.
    fn seen_at(&self, path: &str) -> Vec<Value> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r["path"] == path)
            .map(|r| r["review"].clone())
            .collect()
    }
}

/// The answer of the test's webhooks: `/deny` refuses objects named `bad*` (and every
/// object labeled `sentinel`), `/label` adds the label `mutated: "yes"`, `/slow` answers
/// after 3 s, `/warn` allows with a warning, `/allow` allows.
fn answer(path: &str, review: &Value) -> Value {
    if review["kind"] == "ConversionReview" {
        return convert(review);
    }
    let req = &review["request"];
    let uid = req["uid"].clone();
    let name = req["object"]["metadata"]["name"]
        .as_str()
        .or_else(|| req["name"].as_str())
        .unwrap_or("");
    let labels = &req["object"]["metadata"]["labels"];
    let response = match path {
        "/deny" if name.starts_with("bad") || labels.get("sentinel").is_some() => json!({
            "uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": format!("{name} is not welcome here")}
        }),
        "/label" => {
            let op = if labels.is_object() {
                json!({"op": "add", "path": "/metadata/labels/mutated", "value": "yes"})
            } else {
                json!({"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}})
            };
            let patch = base64::engine::general_purpose::STANDARD
                .encode(serde_json::to_vec(&json!([op])).unwrap());
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch})
        }
        "/warn" => json!({"uid": uid, "allowed": true, "warnings": ["be careful with this one"]}),
        _ => json!({"uid": uid, "allowed": true}),
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

/// A conversion webhook for `conv.kumo.test`: v1's `hostPort: "h:p"` is v2's `host` and
/// `port` (agnhost's example converter); an object labeled `broken` fails to convert.
fn convert(review: &Value) -> Value {
    let req = &review["request"];
    let desired = req["desiredAPIVersion"].as_str().unwrap_or("");
    let mut out = Vec::new();
    for obj in req["objects"].as_array().into_iter().flatten() {
        if obj["metadata"]["labels"]["broken"].is_string() {
            return json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                "response": {"uid": req["uid"], "result": {"status": "Failure", "message": "cannot convert this one"}}});
        }
        let mut o = obj.clone();
        let m = o.as_object_mut().unwrap();
        if desired.ends_with("/v2") {
            if let Some(hp) = m.remove("hostPort") {
                let (h, p) = hp.as_str().unwrap().split_once(':').unwrap();
                m.insert("host".into(), json!(h));
                m.insert("port".into(), json!(p));
            }
        } else if let (Some(h), Some(p)) = (m.remove("host"), m.remove("port")) {
            m.insert(
                "hostPort".into(),
                json!(format!("{}:{}", h.as_str().unwrap(), p.as_str().unwrap())),
            );
        }
        // A webhook may not change what it was not asked to: this change is dropped.
        m["metadata"]["generation"] = json!(99);
        m.insert("apiVersion".into(), json!(desired));
        out.push(o);
    }
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "response": {"uid": req["uid"], "convertedObjects": out, "result": {"status": "Success"}}})
}

/// Starts the webhook server on 127.0.0.1 with a certificate for 127.0.0.1 and
/// `hooks.webhooks.svc`, issued by a fresh CA.
async fn serve_hooks() -> Hooks {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "webhook-test-ca");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_cert.pem(), ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["hooks.webhooks.svc".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let cert = params.signed_by(&key, &issuer).unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let log = log.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let log = log.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let query = req.uri().query().unwrap_or("").to_owned();
                        let body = req.into_body().collect().await?.to_bytes();
                        let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        log.lock()
                            .unwrap()
                            .push(json!({"path": path, "query": query, "review": review.clone()}));
                        if path == "/slow" {
                            tokio::time::sleep(Duration::from_secs(3)).await;
                        }
                        if path == "/500" {
                            return Ok(hyper::Response::builder()
                                .status(500)
                                .header("Content-Type", "text/plain")
                                .body(Full::new(Bytes::from_static(b"boom")))
                                .unwrap());
                        }
                        let out = serde_json::to_vec(&answer(&path, &review)).unwrap();
                        Ok::<_, hyper::Error>(
                            hyper::Response::builder()
                                .header("Content-Type", "application/json")
                                .body(Full::new(Bytes::from(out)))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Hooks {
        addr,
        ca_bundle: base64::engine::general_purpose::STANDARD.encode(ca_cert.pem()),
        seen,
    }
}

/// One webhook entry of a configuration (YAML), on ConfigMaps in every namespace.
fn hook(name: &str, client_config: &str, extra: &str) -> String {
    format!(
        "- name: {name}
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig: {client_config}
  rules:
  - operations: [CREATE, UPDATE]
    apiGroups: [\"\"]
    apiVersions: [v1]
    resources: [configmaps]
{extra}"
    )
}

/// Registers a configuration of `kind` holding `hooks` plus a sentinel webhook (which
/// denies ConfigMaps labeled `sentinel=<name>`), and waits until the sentinel denies: from
/// then on the configuration is in effect.
async fn register(kc: &Path, h: &Hooks, kind: &str, name: &str, hooks: &[String]) {
    let sentinel = hook(
        &format!("sentinel.{name}.kumo.test"),
        &format!("{{url: \"{}\", caBundle: {}}}", h.url("/deny"), h.ca_bundle),
        &format!("  objectSelector: {{matchLabels: {{sentinel: {name}}}}}\n"),
    );
    let yaml = format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: {kind}\nmetadata: {{name: {name}}}\nwebhooks:\n{sentinel}{}",
        hooks.concat()
    );
    let out = k_in(None, kc, &["apply", "-f", "-"], Some(&yaml)).await;
    assert!(out.ok, "{}\n{yaml}", out.stderr);
    let probe = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: probe, namespace: default, labels: {{sentinel: {name}}}}}\n"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = k_in(
            None,
            kc,
            &["create", "--dry-run=server", "-f", "-"],
            Some(&probe),
        )
        .await;
        if !out.ok && out.stderr.contains(&format!("sentinel.{name}.kumo.test")) {
            return;
        }
        assert!(out.ok, "{}", out.stderr);
        assert!(Instant::now() < deadline, "{name} never took effect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn delete_config(kc: &Path, kind: &str, name: &str) {
    let out = k(kc, &["delete", kind, name]).await;
    assert!(out.ok, "{}", out.stderr);
}

fn configmap(name: &str, labels: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, labels: {{{labels}}}}}\ndata: {{a: b}}\n"
    )
}

async fn create(kc: &Path, ns: &str, yaml: &str) -> Out {
    k_in(None, kc, &["-n", ns, "create", "-f", "-"], Some(yaml)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validating_webhook_denies_with_its_message() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let h = serve_hooks().await;
    let cc = format!("{{url: \"{}\", caBundle: {}}}", h.url("/deny"), h.ca_bundle);
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "deny",
        &[hook("deny.kumo.test", &cc, "")],
    )
    .await;

    let out = create(&kc, "default", &configmap("bad-one", "")).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "Error from server (Forbidden): error when creating \"STDIN\": admission webhook \"deny.kumo.test\" denied the request: bad-one is not welcome here"
    );
    let out = k(&kc, &["-n", "default", "get", "configmap", "bad-one"]).await;
    assert!(!out.ok, "a denied ConfigMap was stored");

    // Allowed objects go through, and the webhook saw upstream's AdmissionReview.
    let out = create(&kc, "default", &configmap("good", "")).await;
    assert!(out.ok, "{}", out.stderr);
    let reviews = h.seen_at("/deny");
    let r = reviews
        .iter()
        .find(|r| r["request"]["name"] == "good")
        .expect("the webhook saw the create")
        .clone();
    let req = &r["request"];
    assert_eq!(r["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(req["operation"], "CREATE");
    assert_eq!(req["namespace"], "default");
    assert_eq!(
        req["kind"],
        json!({"group": "", "version": "v1", "kind": "ConfigMap"})
    );
    assert_eq!(
        req["resource"],
        json!({"group": "", "version": "v1", "resource": "configmaps"})
    );
    assert_eq!(req["requestKind"], req["kind"]);
    assert_eq!(req["object"]["data"], json!({"a": "b"}));
    assert_eq!(req["oldObject"], Value::Null);
    assert_eq!(req["dryRun"], false);
    assert_eq!(req["options"]["kind"], "CreateOptions");
    assert_eq!(req["userInfo"]["username"], "kubernetes-admin");
    assert!(req["uid"].as_str().is_some_and(|u| !u.is_empty()));

    // An update sends the old object too and can be denied.
    let out = k(&kc, &["-n", "default", "label", "configmap", "good", "x=y"]).await;
    assert!(out.ok, "{}", out.stderr);
    let reviews = h.seen_at("/deny");
    let upd = reviews
        .iter()
        .rev()
        .find(|r| r["request"]["operation"] == "UPDATE")
        .expect("the webhook saw the update");
    assert_eq!(upd["request"]["oldObject"]["metadata"]["name"], "good");
    assert_eq!(upd["request"]["object"]["metadata"]["labels"]["x"], "y");
    assert_eq!(upd["request"]["options"]["kind"], "PatchOptions");

    // Requests on the webhook configurations themselves never go to webhooks.
    delete_config(&kc, "validatingwebhookconfiguration", "deny").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policies_and_timeouts() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let h = serve_hooks().await;
    let dead = format!(
        "{{url: \"https://127.0.0.1:1/\", caBundle: {}}}",
        h.ca_bundle
    );

    // Ignore: a webhook that cannot be reached lets the request through.
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "ignore",
        &[hook("ignore.kumo.test", &dead, "  failurePolicy: Ignore\n")],
    )
    .await;
    let out = create(&kc, "default", &configmap("through", "")).await;
    assert!(out.ok, "{}", out.stderr);
    delete_config(&kc, "validatingwebhookconfiguration", "ignore").await;

    // Fail (the default): refused with upstream's InternalError.
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "fail",
        &[hook("fail.kumo.test", &dead, "")],
    )
    .await;
    let out = create(&kc, "default", &configmap("refused", "")).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "Error from server (InternalError): error when creating \"STDIN\": Internal error occurred: failed calling webhook \"fail.kumo.test\": failed to call webhook: Post \"https://127.0.0.1:1/?timeout=10s\": dial tcp 127.0.0.1:1: connect: connection refused"
    );
    delete_config(&kc, "validatingwebhookconfiguration", "fail").await;

    // timeoutSeconds is honoured: a webhook slower than it fails the call after ~1 s.
    let slow = format!("{{url: \"{}\", caBundle: {}}}", h.url("/slow"), h.ca_bundle);
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "slow",
        &[hook("slow.kumo.test", &slow, "  timeoutSeconds: 1\n")],
    )
    .await;
    let started = Instant::now();
    let out = create(&kc, "default", &configmap("late", "")).await;
    let took = started.elapsed();
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        format!(
            "Error from server (InternalError): error when creating \"STDIN\": Internal error occurred: failed calling webhook \"slow.kumo.test\": failed to call webhook: Post \"{}?timeout=1s\": context deadline exceeded",
            h.url("/slow")
        )
    );
    assert!(took < Duration::from_millis(2800), "took {took:?}");
    let q = h
        .seen
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|r| r["path"] == "/slow")
        .unwrap()["query"]
        .clone();
    assert_eq!(q, "timeout=1s");
    delete_config(&kc, "validatingwebhookconfiguration", "slow").await;

    // A webhook answering an error: the rest client's message for it.
    let broken = format!("{{url: \"{}\", caBundle: {}}}", h.url("/500"), h.ca_bundle);
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "broken",
        &[hook("broken.kumo.test", &broken, "")],
    )
    .await;
    let out = create(&kc, "default", &configmap("broken", "")).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "Error from server (InternalError): error when creating \"STDIN\": Internal error occurred: failed calling webhook \"broken.kumo.test\": failed to call webhook: an error on the server (\"boom\") has prevented the request from succeeding"
    );
    delete_config(&kc, "validatingwebhookconfiguration", "broken").await;

    // A server name the certificate is not valid for.
    let misnamed = format!(
        "{{url: \"https://localhost:{}/allow\", caBundle: {}}}",
        h.addr.port(),
        h.ca_bundle
    );
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "misnamed",
        &[hook("misnamed.kumo.test", &misnamed, "")],
    )
    .await;
    let out = create(&kc, "default", &configmap("misnamed", "")).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        format!("Error from server (InternalError): error when creating \"STDIN\": Internal error occurred: failed calling webhook \"misnamed.kumo.test\": failed to call webhook: Post \"https://localhost:{}/allow?timeout=10s\": tls: failed to verify certificate: x509: certificate is valid for hooks.webhooks.svc, not localhost", h.addr.port())
    );
    delete_config(&kc, "validatingwebhookconfiguration", "misnamed").await;

    // A caBundle that does not trust the server fails the call as well.
    let other = serve_hooks().await;
    let untrusted = format!(
        "{{url: \"{}\", caBundle: {}}}",
        h.url("/allow"),
        other.ca_bundle
    );
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "untrusted",
        &[hook("untrusted.kumo.test", &untrusted, "")],
    )
    .await;
    let out = create(&kc, "default", &configmap("mistrusted", "")).await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("x509: certificate signed by unknown authority"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_webhook_adds_a_label() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let h = serve_hooks().await;
    let cc = format!(
        "{{url: \"{}\", caBundle: {}}}",
        h.url("/label"),
        h.ca_bundle
    );
    let warn = format!("{{url: \"{}\", caBundle: {}}}", h.url("/warn"), h.ca_bundle);
    register(
        &kc,
        &h,
        "MutatingWebhookConfiguration",
        "label",
        &[
            hook("label.kumo.test", &cc, ""),
            hook("warn.kumo.test", &warn, ""),
        ],
    )
    .await;
    let out = create(&kc, "default", &configmap("plain", "")).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains("Warning: be careful with this one"),
        "{}",
        out.stderr
    );
    let cm = out_json(
        &k(
            &kc,
            &["-n", "default", "get", "configmap", "plain", "-o", "json"],
        )
        .await,
    );
    assert_eq!(cm["metadata"]["labels"], json!({"mutated": "yes"}));
    let out = create(&kc, "default", &configmap("labeled", "keep: me")).await;
    assert!(out.ok, "{}", out.stderr);
    let cm = out_json(
        &k(
            &kc,
            &["-n", "default", "get", "configmap", "labeled", "-o", "json"],
        )
        .await,
    );
    assert_eq!(
        cm["metadata"]["labels"],
        json!({"keep": "me", "mutated": "yes"})
    );
    // The later webhook saw the earlier one's change.
    let seen = h.seen_at("/warn");
    let r = seen
        .iter()
        .find(|r| r["request"]["name"] == "labeled")
        .unwrap();
    assert_eq!(
        r["request"]["object"]["metadata"]["labels"]["mutated"],
        "yes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_exclude_requests() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let h = serve_hooks().await;
    for ns in ["guarded", "open"] {
        assert!(k(&kc, &["create", "namespace", ns]).await.ok);
    }
    assert!(
        k(&kc, &["label", "namespace", "guarded", "policy=strict"])
            .await
            .ok
    );
    let cc = format!("{{url: \"{}\", caBundle: {}}}", h.url("/deny"), h.ca_bundle);
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "selective",
        &[hook(
            "selective.kumo.test",
            &cc,
            "  namespaceSelector: {matchLabels: {policy: strict}}\n  objectSelector: {matchExpressions: [{key: exempt, operator: DoesNotExist}]}\n",
        )],
    )
    .await;
    // For namespaces themselves, the namespace selector looks at the object's labels.
    let ns_hook = format!(
        "- name: namespaces.kumo.test
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig: {cc}
  namespaceSelector: {{matchLabels: {{policy: strict}}}}
  rules:
  - operations: [CREATE]
    apiGroups: [\"\"]
    apiVersions: [v1]
    resources: [namespaces]
"
    );
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "namespaces",
        &[ns_hook],
    )
    .await;
    let ns = |name: &str, labels: &str| {
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}, labels: {{{labels}}}}}\n"
        )
    };
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-"],
        Some(&ns("bad-strict", "policy: strict")),
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("admission webhook \"namespaces.kumo.test\" denied the request: bad-strict is not welcome here"),
        "{}",
        out.stderr
    );
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(&ns("bad-lax", ""))).await;
    assert!(out.ok, "{}", out.stderr);

    // Selected namespace, selected object: denied.
    let out = create(&kc, "guarded", &configmap("bad-a", "")).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("admission webhook \"selective.kumo.test\" denied the request: bad-a is not welcome here"),
        "{}",
        out.stderr
    );
    // A namespace the selector does not select: the webhook is not called.
    let out = create(&kc, "open", &configmap("bad-b", "")).await;
    assert!(out.ok, "{}", out.stderr);
    // An object the object selector does not select: not called either.
    let out = create(&kc, "guarded", &configmap("bad-c", "exempt: \"yes\"")).await;
    assert!(out.ok, "{}", out.stderr);
    let names: Vec<String> = h
        .seen_at("/deny")
        .iter()
        .filter_map(|r| r["request"]["name"].as_str().map(str::to_owned))
        .collect();
    assert!(names.contains(&"bad-a".to_owned()), "{names:?}");
    assert!(!names.contains(&"bad-b".to_owned()), "{names:?}");
    assert!(!names.contains(&"bad-c".to_owned()), "{names:?}");
    // An update removing the exempting label is selected through the new object.
    let out = k(
        &kc,
        &["-n", "guarded", "label", "configmap", "bad-c", "exempt-"],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("bad-c is not welcome here"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_and_side_effects() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let h = serve_hooks().await;
    let cc = format!(
        "{{url: \"{}\", caBundle: {}}}",
        h.url("/allow"),
        h.ca_bundle
    );
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "dry",
        &[hook("dry.kumo.test", &cc, "")],
    )
    .await;
    // sideEffects None: called on dry run, with dryRun true.
    let out = k_in(
        None,
        &kc,
        &["-n", "default", "create", "--dry-run=server", "-f", "-"],
        Some(&configmap("dry", "")),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let seen = h.seen_at("/allow");
    let r = seen.iter().find(|r| r["request"]["name"] == "dry").unwrap();
    assert_eq!(r["request"]["dryRun"], true);
    assert_eq!(r["request"]["options"]["dryRun"], json!(["All"]));
}

/// A Service reference resolves through the Service's port and its EndpointSlices (kumo
/// has no data plane). EndpointSlices may not point at loopback, so the address the
/// test's webhook listens on cannot be registered; the unit tests of `admission::webhook`
/// resolve one written to the store directly. Here: upstream's resolution errors, inside
/// the `Post "https://<service>.<namespace>.svc:<port>/<path>?timeout=10s"` message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_references_resolve_through_endpointslices() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let h = serve_hooks().await;
    assert!(k(&kc, &["create", "namespace", "webhooks"]).await.ok);
    let objects = "apiVersion: v1
kind: Service
metadata: {name: hooks, namespace: webhooks}
spec:
  ports: [{name: https, port: 443, targetPort: 8443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: hooks-1
  namespace: webhooks
  labels: {kubernetes.io/service-name: hooks}
addressType: IPv4
ports: [{name: https, port: 8443, protocol: TCP}]
endpoints: [{addresses: [10.1.2.3], conditions: {ready: false}}]
";
    let out = k_in(None, &kc, &["apply", "-f", "-"], Some(objects)).await;
    assert!(out.ok, "{}", out.stderr);
    let svc = |name: &str, port: u16| {
        format!(
            "{{service: {{namespace: webhooks, name: {name}, path: /deny/, port: {port}}}, caBundle: {}}}",
            h.ca_bundle
        )
    };
    let selected = |v: &str| format!("  objectSelector: {{matchLabels: {{svc: {v}}}}}\n");
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "svc",
        &[
            hook(
                "missing.kumo.test",
                &svc("nothing", 443),
                &selected("missing"),
            ),
            hook("port.kumo.test", &svc("hooks", 444), &selected("port")),
            hook(
                "unready.kumo.test",
                &svc("hooks", 443),
                &selected("unready"),
            ),
        ],
    )
    .await;
    let cases = [
        (
            "missing",
            "missing.kumo.test",
            "https://nothing.webhooks.svc:443/deny?timeout=10s",
            "service \"nothing\" not found",
        ),
        (
            "port",
            "port.kumo.test",
            "https://hooks.webhooks.svc:444/deny?timeout=10s",
            "no service port 444 found for service \"hooks\"",
        ),
        (
            "unready",
            "unready.kumo.test",
            "https://hooks.webhooks.svc:443/deny?timeout=10s",
            "no endpoints available for service \"hooks\"",
        ),
    ];
    for (label, name, url, why) in cases {
        let out = create(&kc, "default", &configmap(label, &format!("svc: {label}"))).await;
        assert!(!out.ok);
        assert_eq!(
            out.stderr.trim(),
            format!("Error from server (InternalError): error when creating \"STDIN\": Internal error occurred: failed calling webhook \"{name}\": failed to call webhook: Post \"{url}\": {why}")
        );
    }
}

/// matchPolicy Equivalent (the default) sends a request on autoscaling/v1 to a webhook
/// that asked for autoscaling/v2, converted; Exact does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equivalent_versions_are_converted() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let h = serve_hooks().await;
    let entry = |name: &str, path: &str, policy: &str| {
        format!(
            "- name: {name}
  admissionReviewVersions: [v1]
  sideEffects: None
  matchPolicy: {policy}
  clientConfig: {{url: \"{}\", caBundle: {}}}
  rules:
  - operations: [CREATE]
    apiGroups: [autoscaling]
    apiVersions: [v2]
    resources: [horizontalpodautoscalers]
",
            h.url(path),
            h.ca_bundle
        )
    };
    register(
        &kc,
        &h,
        "ValidatingWebhookConfiguration",
        "hpa",
        &[
            entry("equivalent.kumo.test", "/allow", "Equivalent"),
            entry("exact.kumo.test", "/warn", "Exact"),
        ],
    )
    .await;
    let hpa = "apiVersion: autoscaling/v1
kind: HorizontalPodAutoscaler
metadata: {name: web}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 3
  targetCPUUtilizationPercentage: 50
";
    let out = create(&kc, "default", hpa).await;
    assert!(out.ok, "{}", out.stderr);
    let seen = h.seen_at("/allow");
    let r = seen
        .iter()
        .find(|r| r["request"]["name"] == "web")
        .expect("the Equivalent webhook was called");
    let req = &r["request"];
    assert_eq!(
        req["kind"],
        json!({"group": "autoscaling", "version": "v2", "kind": "HorizontalPodAutoscaler"})
    );
    assert_eq!(
        req["resource"],
        json!({"group": "autoscaling", "version": "v2", "resource": "horizontalpodautoscalers"})
    );
    assert_eq!(
        req["requestKind"],
        json!({"group": "autoscaling", "version": "v1", "kind": "HorizontalPodAutoscaler"})
    );
    assert_eq!(req["requestResource"]["version"], "v1");
    assert_eq!(req["object"]["apiVersion"], "autoscaling/v2");
    assert_eq!(
        req["object"]["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
        50
    );
    assert!(
        h.seen_at("/warn").is_empty(),
        "the Exact webhook was called"
    );
}

/// A definition with versions v1 (stored) and v2 converted by the test's webhook: objects
/// are converted on write and read, lists of mixed stored versions are converted object by
/// object, `selectableFields` select on the converted object, and a failed conversion is
/// upstream's internal error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversion_webhooks_convert_between_versions() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let h = serve_hooks().await;
    let crd = |storage_v2: bool| {
        format!(
            "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: convs.conv.kumo.test}}
spec:
  group: conv.kumo.test
  scope: Namespaced
  names: {{plural: convs, singular: conv, kind: Conv, listKind: ConvList}}
  conversion:
    strategy: Webhook
    webhook:
      conversionReviewVersions: [v1, v1beta1]
      clientConfig: {{url: \"{}\", caBundle: {}}}
  versions:
  - name: v1
    served: true
    storage: {}
    schema: {{openAPIV3Schema: {{type: object, properties: {{hostPort: {{type: string}}}}}}}}
  - name: v2
    served: true
    storage: {}
    selectableFields: [{{jsonPath: .host}}]
    schema: {{openAPIV3Schema: {{type: object, properties: {{host: {{type: string}}, port: {{type: string}}}}}}}}
",
            h.url("/convert"),
            h.ca_bundle,
            !storage_v2,
            storage_v2
        )
    };
    let out = k_in(None, &kc, &["apply", "-f", "-"], Some(&crd(false))).await;
    assert!(out.ok, "{}", out.stderr);
    let obj = |name: &str, version: &str, body: &str| {
        format!("apiVersion: conv.kumo.test/{version}\nkind: Conv\nmetadata: {{name: {name}, namespace: default}}\n{body}\n")
    };
    // The resource is served once the definition is established.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = k_in(
            None,
            &kc,
            &["create", "-f", "-"],
            Some(&obj("one", "v1", "hostPort: \"localhost:8080\"")),
        )
        .await;
        if out.ok {
            break;
        }
        assert!(Instant::now() < deadline, "{}", out.stderr);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let get = |what: &str| {
        let kc = kc.clone();
        let what = what.to_owned();
        async move {
            let out = k(&kc, &["-n", "default", "get", &what, "-o", "json"]).await;
            assert!(out.ok, "{}", out.stderr);
            serde_json::from_str::<Value>(&out.stdout).unwrap()
        }
    };
    let v2 = get("convs.v2.conv.kumo.test/one").await;
    assert_eq!(v2["apiVersion"], "conv.kumo.test/v2");
    assert_eq!(
        (v2["host"].as_str(), v2["port"].as_str()),
        (Some("localhost"), Some("8080"))
    );
    assert!(v2.get("hostPort").is_none());
    // Metadata is the stored object's, whatever the webhook answered.
    assert!(v2["metadata"].get("generation") != Some(&json!(99)), "{v2}");
    let seen = h.seen_at("/convert");
    let r = seen
        .iter()
        .find(|r| r["request"]["desiredAPIVersion"] == "conv.kumo.test/v2")
        .expect("the webhook was asked for v2");
    assert_eq!(r["apiVersion"], "apiextensions.k8s.io/v1");
    assert_eq!(
        r["request"]["objects"][0]["apiVersion"],
        "conv.kumo.test/v1"
    );

    // A v2 write is converted to the storage version (v1), then the storage version moves
    // to v2 and a second object is stored as v2: lists of both versions are converted.
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-"],
        Some(&obj("two", "v2", "host: example\nport: \"80\"")),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k_in(None, &kc, &["apply", "-f", "-"], Some(&crd(true))).await;
    assert!(out.ok, "{}", out.stderr);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = k_in(
            None,
            &kc,
            &["create", "-f", "-"],
            Some(&obj("three", "v1", "hostPort: \"other:9090\"")),
        )
        .await;
        if out.ok {
            break;
        }
        assert!(Instant::now() < deadline, "{}", out.stderr);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let v1 = get("convs.v1.conv.kumo.test").await;
    let hp: Vec<&str> = v1["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["hostPort"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(hp, ["localhost:8080", "other:9090", "example:80"]);
    let v2 = get("convs.v2.conv.kumo.test").await;
    let hosts: Vec<&str> = v2["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["host"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(hosts, ["localhost", "other", "example"]);

    // selectableFields select on the version asked for.
    let out = k(
        &kc,
        &[
            "-n",
            "default",
            "get",
            "convs.v2.conv.kumo.test",
            "--field-selector",
            "host=other",
            "-o",
            "name",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "conv.conv.kumo.test/three");
    let out = k(
        &kc,
        &[
            "-n",
            "default",
            "get",
            "convs.v1.conv.kumo.test",
            "--field-selector",
            "host=other",
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("field label not supported: host"),
        "{}",
        out.stderr
    );

    // A failed conversion is an internal error naming the webhook's message.
    let out = k(
        &kc,
        &[
            "-n",
            "default",
            "label",
            "convs.v1.conv.kumo.test",
            "one",
            "broken=yes",
        ],
    )
    .await;
    assert!(
        !out.ok,
        "the label write needs a conversion to v2, which fails"
    );
    assert!(
        out.stderr.contains(
            "conversion webhook for conv.kumo.test/v1, Kind=Conv failed: cannot convert this one"
        ),
        "{}",
        out.stderr
    );
}
