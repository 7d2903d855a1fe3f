//! API aggregation as the e2e suite's Aggregator test sets it up: sample-apiserver in a
//! Deployment, its serving certificate from a Secret volume, a Service on 7443 → 443 and an
//! APIService `v1alpha1.wardle.example.com` with the CA as caBundle. The API server checks
//! the backend's availability with upstream's reasons and messages, proxies the wardle
//! group to the pod through the simulated pod network, publishes the group in discovery,
//! and the real kubectl works on flunders as on any resource.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use kumo::cluster::ClusterConfig;
use kumo_testkit::kubectl::{eventually, get, k, k_in, Out};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{ChildStdout, Command};

const BACKEND: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: sample-apiserver-deployment
  namespace: wardle
spec:
  replicas: 1
  selector:
    matchLabels: {app: sample-apiserver, apiserver: \"true\"}
  template:
    metadata:
      labels: {app: sample-apiserver, apiserver: \"true\"}
    spec:
      containers:
      - name: sample-apiserver
        image: registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2
        args:
        - --etcd-servers=http://127.0.0.1:2379
        - --tls-cert-file=/apiserver.local.config/certificates/tls.crt
        - --tls-private-key-file=/apiserver.local.config/certificates/tls.key
        readinessProbe:
          httpGet: {scheme: HTTPS, port: 443, path: /readyz}
          periodSeconds: 1
        volumeMounts:
        - {name: apiserver-certs, mountPath: /apiserver.local.config/certificates, readOnly: true}
      - name: etcd
        image: registry.k8s.io/etcd:3.6.4-0
        command: [/usr/local/bin/etcd, --listen-client-urls, http://127.0.0.1:2379,
                  --advertise-client-urls, http://127.0.0.1:2379]
      volumes:
      - name: apiserver-certs
        secret: {secretName: sample-apiserver-secret}
---
apiVersion: v1
kind: Service
metadata:
  name: sample-api
  namespace: wardle
spec:
  selector: {apiserver: \"true\"}
  ports:
  - {port: 7443, targetPort: 443}
";

fn api_service(version: &str, port: u16, ca_bundle: &str) -> String {
    format!(
        "apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: {version}.wardle.example.com
spec:
  service: {{namespace: wardle, name: sample-api, port: {port}}}
  group: wardle.example.com
  version: {version}
  caBundle: {ca_bundle}
  groupPriorityMinimum: 2000
  versionPriority: 200
"
    )
}

/// The watcher's next line.
/// A WebSocket client over TLS with the kubeconfig's credentials, raw as RFC 6455 frames
/// (the key is the RFC's sample, so the expected accept value is its sample too).
struct WebSocket {
    head: String,
    io: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
}

impl WebSocket {
    async fn open(kc: &std::path::Path, path: &str) -> WebSocket {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let cfg: serde_json::Value =
            serde_yaml::from_str(&std::fs::read_to_string(kc).unwrap()).unwrap();
        let pem = |v: &serde_json::Value| {
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap())
                .unwrap()
        };
        let server = cfg["clusters"][0]["cluster"]["server"].as_str().unwrap();
        let ca = pem(&cfg["clusters"][0]["cluster"]["certificate-authority-data"]);
        let cert = pem(&cfg["users"][0]["user"]["client-certificate-data"]);
        let key = pem(&cfg["users"][0]["user"]["client-key-data"]);
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pemfile::certs(&mut ca.as_slice()) {
            roots.add(c.unwrap()).unwrap();
        }
        let chain = rustls_pemfile::certs(&mut cert.as_slice())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls_pemfile::private_key(&mut key.as_slice())
            .unwrap()
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap();
        let addr = server.trim_start_matches("https://");
        let host = addr.rsplit_once(':').unwrap().0.to_owned();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from(host).unwrap();
        let mut io = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
            .connect(name, tcp)
            .await
            .unwrap();
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        );
        io.write_all(req.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            let n = tokio::time::timeout(Duration::from_secs(30), io.read(&mut b))
                .await
                .expect("the handshake's answer")
                .unwrap();
            assert_eq!(n, 1, "the connection ended in the handshake: {head:?}");
            head.push(b[0]);
        }
        WebSocket {
            head: String::from_utf8(head).unwrap(),
            io,
        }
    }

    /// The next text message's payload (the server's frames are unmasked).
    async fn text(&mut self) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let read = async {
            let mut h = [0u8; 2];
            self.io.read_exact(&mut h).await.unwrap();
            assert_eq!(h[0], 0x81, "a final text frame");
            let len = match h[1] & 0x7f {
                126 => u64::from(self.io.read_u16().await.unwrap()),
                127 => self.io.read_u64().await.unwrap(),
                n => u64::from(n),
            };
            let mut payload = vec![0u8; usize::try_from(len).unwrap()];
            self.io.read_exact(&mut payload).await.unwrap();
            payload
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("a watch event")
    }
}

async fn next(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("a watch event within 20 s")
        .unwrap()
        .unwrap_or_default()
}

fn ok(out: Out) -> String {
    assert!(out.ok, "{}", out.stderr);
    out.stdout
}

/// The Available condition of an APIService, once its reason is `reason`.
async fn available(kc: &std::path::Path, name: &str, reason: &str) -> serde_json::Value {
    eventually(
        30,
        &format!("{name} Available with reason {reason}"),
        || async {
            let svc = get(kc, &["apiservice", name]).await?;
            svc["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Available" && c["reason"] == reason)
                .cloned()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sample_apiserver_serves_its_group_through_the_aggregator() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ClusterConfig::new(dir.path().join("kumo"));
    cfg.port = 0;
    cfg.node_name = "aggregator-node".into();
    let cluster = kumo::cluster::start(cfg).await.unwrap();
    let kc = cluster.api.admin_kubeconfig.clone();
    let kc = kc.as_path();
    cluster
        .wait_nodes_ready(&cluster.node_names(), Duration::from_secs(30), |_| {})
        .await
        .unwrap();

    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca =
        kumo_testkit::certs::serving(&certs, "e2e-sample-apiserver-ca", "sample-api.wardle.svc")
            .unwrap();
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    ok(k(kc, &["create", "namespace", "wardle"]).await);
    ok(k(
        kc,
        &[
            "create",
            "secret",
            "generic",
            "sample-apiserver-secret",
            "-n",
            "wardle",
            &format!("--from-file=tls.crt={}", certs.join("tls.crt").display()),
            &format!("--from-file=tls.key={}", certs.join("tls.key").display()),
        ],
    )
    .await);
    eventually(30, "the default ServiceAccount of wardle", || async {
        get(kc, &["serviceaccount", "default", "-n", "wardle"]).await
    })
    .await;

    // Before the APIService exists the group is not served at all.
    let out = k(kc, &["get", "--raw", "/apis/wardle.example.com/v1alpha1"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("NotFound"), "{}", out.stderr);

    // An APIService registered before its Service: ServiceNotFound, and a 503 for requests.
    ok(k_in(
        kc,
        &["apply", "-f", "-"],
        Some(&api_service("v1alpha1", 7443, &bundle)),
    )
    .await);
    let cond = available(kc, "v1alpha1.wardle.example.com", "ServiceNotFound").await;
    assert_eq!(cond["status"], "False");
    assert_eq!(
        cond["message"],
        "service/sample-api in \"wardle\" is not present"
    );
    let out = k(
        kc,
        &[
            "get",
            "--raw",
            "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(out.stderr.contains("ServiceUnavailable"), "{}", out.stderr);

    ok(k_in(kc, &["apply", "-f", "-"], Some(BACKEND)).await);
    let cond = available(kc, "v1alpha1.wardle.example.com", "Passed").await;
    assert_eq!(cond["status"], "True");
    assert_eq!(cond["message"], "all checks passed");
    let table = ok(k(kc, &["get", "apiservice", "v1alpha1.wardle.example.com"]).await);
    assert!(
        table.contains("v1alpha1.wardle.example.com   wardle/sample-api   True"),
        "{table}"
    );

    // A port the Service does not have.
    ok(k_in(
        kc,
        &["apply", "-f", "-"],
        Some(&api_service("v1beta1", 1234, &bundle)),
    )
    .await);
    let cond = available(kc, "v1beta1.wardle.example.com", "ServicePortError").await;
    assert_eq!(
        cond["message"],
        "service/sample-api in \"wardle\" is not listening on port 1234"
    );
    // The right port but a CA that did not sign the backend's certificate.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let other_ca = kumo_testkit::certs::serving(&other, "someone-else", "x.y.svc").unwrap();
    let other_bundle = base64::engine::general_purpose::STANDARD.encode(other_ca);
    ok(k_in(
        kc,
        &["apply", "-f", "-"],
        Some(&api_service("v1beta1", 7443, &other_bundle)),
    )
    .await);
    let cond = available(kc, "v1beta1.wardle.example.com", "FailedDiscoveryCheck").await;
    let message = cond["message"].as_str().unwrap();
    assert!(
        message.starts_with("failing or missing response from https://")
            && message.contains("/apis/wardle.example.com/v1beta1: Get \"https://")
            && message.ends_with("x509: certificate signed by unknown authority"),
        "{message}"
    );
    let out = k(
        kc,
        &[
            "get",
            "--raw",
            "/apis/wardle.example.com/v1beta1/namespaces/default/flunders",
        ],
    )
    .await;
    assert!(out.stderr.contains("ServiceUnavailable"), "{}", out.stderr);
    ok(k(kc, &["delete", "apiservice", "v1beta1.wardle.example.com"]).await);

    // Discovery: the group in /apis and kubectl api-resources (aggregated discovery).
    let group = ok(k(kc, &["get", "--raw", "/apis/wardle.example.com"]).await);
    let group: serde_json::Value = serde_json::from_str(&group).unwrap();
    assert_eq!(group["kind"], "APIGroup");
    assert_eq!(
        group["preferredVersion"]["groupVersion"],
        "wardle.example.com/v1alpha1"
    );
    eventually(30, "flunders in kubectl api-resources", || async {
        let out = k(kc, &["api-resources", "--api-group=wardle.example.com"]).await;
        out.stdout.contains("flunders").then_some(())
    })
    .await;
    let resources = ok(k(kc, &["api-resources", "--api-group=wardle.example.com"]).await);
    assert!(
        resources
            .contains("flunders                wardle.example.com/v1alpha1   true         Flunder"),
        "{resources}"
    );

    // The backend's OpenAPI: its group versions in /openapi/v3, their documents proxied,
    // so kubectl explain works on flunders.
    let index = ok(k(kc, &["get", "--raw", "/openapi/v3"]).await);
    let index: serde_json::Value = serde_json::from_str(&index).unwrap();
    let url = index["paths"]["apis/wardle.example.com/v1alpha1"]["serverRelativeURL"]
        .as_str()
        .unwrap_or_else(|| panic!("{index}"));
    assert!(url.starts_with("/openapi/v3/apis/wardle.example.com/v1alpha1?hash="));
    assert!(index["paths"]["api/v1"].is_object(), "{index}");
    let explained = ok(k(kc, &["explain", "flunders"]).await);
    for line in [
        "GROUP:      wardle.example.com",
        "KIND:       Flunder",
        "VERSION:    v1alpha1",
        "  metadata\t<ObjectMeta>",
        "  spec\t<FlunderSpec>",
        "  status\t<FlunderStatus>",
    ] {
        assert!(explained.contains(line), "{line:?} in {explained}");
    }
    // The meta types the backend's document refers to resolve in it too.
    let explained = ok(k(kc, &["explain", "flunders.metadata.labels"]).await);
    assert!(
        explained.contains("FIELD: labels <map[string]string>"),
        "{explained}"
    );
    let explained = ok(k(
        kc,
        &[
            "explain",
            "flunders.spec",
            "--api-version=wardle.example.com/v1beta1",
        ],
    )
    .await);
    assert!(
        explained.contains("  flunderReference\t<string>") && !explained.contains("  reference\t"),
        "{explained}"
    );
    // /openapi/v2 merges the backend's paths of the group version and its definitions
    // (kubectl reads the protobuf form for the v2 explain).
    let v2 = ok(k(kc, &["get", "--raw", "/openapi/v2"]).await);
    let v2: serde_json::Value = serde_json::from_str(&v2).unwrap();
    assert!(
        v2["paths"]["/apis/wardle.example.com/v1alpha1/namespaces/{namespace}/flunders"]["post"]
            .is_object()
    );
    // Only the APIService's version: v1beta1 has no APIService now.
    assert!(v2["paths"]["/apis/wardle.example.com/v1beta1/flunders"].is_null());
    assert!(v2["paths"]["/api/v1/pods"].is_object());
    assert!(
        v2["definitions"]["io.k8s.sample-apiserver.pkg.apis.wardle.v1alpha1.FlunderSpec"]
            .is_object()
    );
    let explained = ok(k(
        kc,
        &["explain", "flunders.spec", "--output=plaintext-openapiv2"],
    )
    .await);
    assert!(
        explained.contains("KIND:     Flunder") && explained.contains("referenceType\t<string>"),
        "{explained}"
    );

    // kubectl finds fieldValidation in the backend's document and lets the server check
    // fields: Strict refuses an unknown field, Warn drops it with a warning.
    let bogus = "apiVersion: wardle.example.com/v1alpha1
kind: Flunder
metadata: {name: bogus-flunder, namespace: default}
spec: {reference: x, bogus: 1}
";
    let out = k_in(kc, &["create", "-f", "-"], Some(bogus)).await;
    assert_eq!(
        out.stderr.trim(),
        "Error from server (BadRequest): error when creating \"STDIN\": Flunder in version \"v1alpha1\" cannot be handled as a Flunder: strict decoding error: unknown field \"spec.bogus\""
    );
    let out = k_in(kc, &["create", "--validate=warn", "-f", "-"], Some(bogus)).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stderr.trim(), "Warning: unknown field \"spec.bogus\"");
    let obj = get(kc, &["flunder", "bogus-flunder"]).await.unwrap();
    assert_eq!(obj["spec"], serde_json::json!({"reference": "x"}));
    ok(k(kc, &["delete", "flunder", "bogus-flunder"]).await);

    // kubectl against the extension API server, through this server.
    let flunder = "apiVersion: wardle.example.com/v1alpha1
kind: Flunder
metadata:
  name: rest-flunder
  namespace: default
  labels: {sample-label: \"true\"}
";
    let created = ok(k_in(kc, &["create", "-f", "-"], Some(flunder)).await);
    assert_eq!(
        created.trim(),
        "flunder.wardle.example.com/rest-flunder created"
    );
    let obj = get(kc, &["flunder", "rest-flunder", "-n", "default"])
        .await
        .unwrap();
    assert_eq!(obj["kind"], "Flunder");
    assert_eq!(obj["apiVersion"], "wardle.example.com/v1alpha1");
    assert!(obj["metadata"]["uid"].is_string(), "{obj}");
    let listed = ok(k(kc, &["get", "flunders", "-l", "sample-label=true"]).await);
    assert!(
        listed.starts_with("NAME           CREATED AT\nrest-flunder   "),
        "{listed}"
    );
    // A watch streams through the proxy: the object, then each change as it happens.
    let mut watcher = Command::new("kubectl")
        .args([
            "get",
            "flunders",
            "-w",
            "--output-watch-events",
            "-o",
            "jsonpath={.type} {.object.metadata.name} {.object.metadata.labels.tier}{\"\\n\"}",
        ])
        .env("KUBECONFIG", kc)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watcher.stdout.take().unwrap()).lines();
    assert_eq!(next(&mut lines).await.trim(), "ADDED rest-flunder");
    ok(k(kc, &["label", "flunder", "rest-flunder", "tier=gold"]).await);
    assert_eq!(next(&mut lines).await.trim(), "MODIFIED rest-flunder gold");
    let obj = get(kc, &["flunder", "rest-flunder"]).await.unwrap();
    assert_eq!(obj["metadata"]["labels"]["tier"], "gold");
    let out = k_in(kc, &["create", "-f", "-"], Some(flunder)).await;
    assert_eq!(
        out.stderr.trim(),
        "Error from server (AlreadyExists): error when creating \"STDIN\": flunders.wardle.example.com \"rest-flunder\" already exists"
    );

    // Authorization stays this server's: a user without RBAC is refused before any proxying.
    let out = k(kc, &["get", "flunders", "--as=nobody"]).await;
    assert!(
        out.stderr.contains(
            "flunders.wardle.example.com is forbidden: User \"nobody\" cannot list resource \"flunders\" in API group \"wardle.example.com\" in the namespace \"default\""
        ),
        "{}",
        out.stderr
    );

    // A WebSocket watch (what browser clients use) passes through the aggregator's
    // upgrade: the handshake answers with the backend's accept key, and each event
    // arrives as a text message.
    let mut ws = WebSocket::open(
        kc,
        "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders?watch=true&resourceVersion=0",
    )
    .await;
    assert!(ws.head.starts_with("HTTP/1.1 101"), "{}", ws.head);
    assert!(
        ws.head
            .to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{}",
        ws.head
    );
    let first: serde_json::Value = serde_json::from_slice(&ws.text().await).unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["metadata"]["name"], "rest-flunder");
    ok(k(kc, &["annotate", "flunder", "rest-flunder", "seen=ws"]).await);
    let changed: serde_json::Value = serde_json::from_slice(&ws.text().await).unwrap();
    assert_eq!(changed["type"], "MODIFIED");
    assert_eq!(changed["object"]["metadata"]["annotations"]["seen"], "ws");
    assert_eq!(next(&mut lines).await.trim(), "MODIFIED rest-flunder gold");

    ok(k(kc, &["delete", "flunder", "rest-flunder"]).await);
    assert_eq!(next(&mut lines).await.trim(), "DELETED rest-flunder gold");
    let deleted: serde_json::Value = serde_json::from_slice(&ws.text().await).unwrap();
    assert_eq!(deleted["type"], "DELETED");
    let _ = watcher.kill().await;
    let out = k(kc, &["get", "flunders"]).await;
    assert!(out.stderr.contains("No resources found"), "{}", out.stderr);

    // Deleting the APIService takes the group away.
    ok(k(kc, &["delete", "apiservice", "v1alpha1.wardle.example.com"]).await);
    let apis = ok(k(kc, &["get", "--raw", "/apis"]).await);
    assert!(!apis.contains("wardle.example.com"), "{apis}");
    let out = k(
        kc,
        &[
            "get",
            "--raw",
            "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
        ],
    )
    .await;
    assert!(out.stderr.contains("NotFound"), "{}", out.stderr);
}
