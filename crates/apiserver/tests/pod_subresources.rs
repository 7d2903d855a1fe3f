//! pods/ephemeralcontainers (`kubectl debug`), pods/resize (`kubectl patch --subresource
//! resize`), pods/proxy and services/proxy, driven by the real kubectl.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const POD: &str = "apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: c
    image: nginx:1.27
    ports: [{containerPort: 80}]
    resources:
      requests: {cpu: 100m, memory: 64Mi}
      limits: {cpu: 500m, memory: 128Mi}
";

async fn setup(kc: &Path) {
    let sa = k_in(
        None,
        kc,
        &["create", "-f", "-"],
        Some("{\"apiVersion\":\"v1\",\"kind\":\"ServiceAccount\",\"metadata\":{\"name\":\"default\",\"namespace\":\"default\"}}"),
    )
    .await;
    // The service account may exist already; creating the pod tells.
    let _ = sa;
    let out = k_in(None, kc, &["create", "-f", "-"], Some(POD)).await;
    assert!(out.ok, "{}", out.stderr);
}

async fn pod(kc: &Path) -> Value {
    out_json(
        &k(
            kc,
            &["get", "pod", "web", "-o", "json", "--show-managed-fields"],
        )
        .await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_debug_adds_an_ephemeral_container() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    setup(&kc).await;

    let out = k(
        &kc,
        &[
            "debug",
            "pod/web",
            "--image=busybox",
            "--target=c",
            "--",
            "sh",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let p = pod(&kc).await;
    let ec = &p["spec"]["ephemeralContainers"][0];
    assert_eq!(ec["image"], "busybox");
    assert_eq!(ec["targetContainerName"], "c");
    assert_eq!(ec["command"], json!(["sh"]));
    // Defaulted as a decoded pod's ephemeral containers are.
    assert_eq!(ec["imagePullPolicy"], "Always");
    assert_eq!(ec["terminationMessagePath"], "/dev/termination-log");
    assert_eq!(p["metadata"]["generation"], 2);
    let managers: Vec<&Value> = p["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["subresource"] == "ephemeralcontainers")
        .collect();
    assert_eq!(managers.len(), 1, "{:#}", p["metadata"]["managedFields"]);

    // GET of the subresource is the pod.
    let sub = out_json(
        &k(
            &kc,
            &[
                "get",
                "--raw",
                "/api/v1/namespaces/default/pods/web/ephemeralcontainers",
            ],
        )
        .await,
    );
    assert_eq!(sub["kind"], "Pod");
    assert_eq!(sub["spec"]["ephemeralContainers"][0]["name"], ec["name"]);

    // A PUT that changes the existing one, adds a bad one and touches the spec: only the
    // ephemeral containers count, and they are refused as upstream words it.
    let mut body = sub.clone();
    body["spec"]["containers"][0]["image"] = json!("changed");
    body["spec"]["ephemeralContainers"] = json!([
        {"name": "c", "image": "busybox", "ports": [{"containerPort": 80}],
         "readinessProbe": {"exec": {"command": ["true"]}}, "targetContainerName": "nope"},
    ]);
    let out = k_in(
        None,
        &kc,
        &[
            "replace",
            "--raw",
            "/api/v1/namespaces/default/pods/web/ephemeralcontainers",
            "-f",
            "-",
        ],
        Some(&body.to_string()),
    )
    .await;
    assert!(!out.ok);
    for msg in [
        "spec.ephemeralContainers[0].name: Duplicate value: \"c\"",
        "spec.ephemeralContainers[0].targetContainerName: Not found: \"nope\"",
        "spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container",
        "spec.ephemeralContainers[0].readinessProbe: Forbidden: cannot be set for an Ephemeral Container",
        "existing ephemeral containers",
        "may not be removed",
    ] {
        assert!(out.stderr.contains(msg), "{msg} not in {}", out.stderr);
    }
    let p = pod(&kc).await;
    assert_eq!(p["spec"]["containers"][0]["image"], "nginx:1.27");

    // A second debug container joins the first; the spec change elsewhere is dropped.
    body["spec"]["ephemeralContainers"] = json!([
        sub["spec"]["ephemeralContainers"][0].clone(),
        {"name": "second", "image": "alpine", "stdin": true, "tty": true},
    ]);
    let out = k_in(
        None,
        &kc,
        &[
            "replace",
            "--raw",
            "/api/v1/namespaces/default/pods/web/ephemeralcontainers",
            "-f",
            "-",
        ],
        Some(&body.to_string()),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let p = pod(&kc).await;
    assert_eq!(p["spec"]["ephemeralContainers"][1]["name"], "second");
    assert_eq!(p["spec"]["containers"][0]["image"], "nginx:1.27");
    assert_eq!(p["metadata"]["generation"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_patch_resize() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    setup(&kc).await;

    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            "web",
            "--subresource",
            "resize",
            "--patch",
            r#"{"spec":{"containers":[{"name":"c","image":"ignored","resources":{"requests":{"cpu":"200m"}}}]}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let p = pod(&kc).await;
    let c = &p["spec"]["containers"][0];
    assert_eq!(c["resources"]["requests"]["cpu"], "200m");
    assert_eq!(c["resources"]["requests"]["memory"], "64Mi");
    assert_eq!(c["image"], "nginx:1.27");
    assert_eq!(p["metadata"]["generation"], 2);
    assert_eq!(p["status"]["qosClass"], "Burstable");

    // A request removed comes back from the limit, as a decoded pod's defaults give it.
    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            "web",
            "--subresource",
            "resize",
            "--patch",
            r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"memory":null}}}]}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let p = pod(&kc).await;
    assert_eq!(
        p["spec"]["containers"][0]["resources"]["requests"]["memory"],
        "128Mi"
    );

    let refused = |patch: &'static str, want: &'static str| {
        let kc = kc.clone();
        async move {
            let out = k(
                &kc,
                &[
                    "patch",
                    "pod",
                    "web",
                    "--subresource",
                    "resize",
                    "--patch",
                    patch,
                ],
            )
            .await;
            assert!(!out.ok, "{patch} was accepted");
            assert!(out.stderr.contains(want), "{want} not in {}", out.stderr);
        }
    };
    refused(
        r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"ephemeral-storage":"1Gi"}}}]}}"#,
        "spec: Forbidden: only cpu and memory resources are mutable",
    )
    .await;
    refused(
        r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"500m","memory":"128Mi"}}}]}}"#,
        "spec: Invalid value: \"Burstable\": Pod QOS Class may not change as a result of resizing",
    )
    .await;
    refused(
        r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"2"}}}]}}"#,
        "spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 500m",
    )
    .await;
    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            "web",
            "--subresource",
            "resize",
            "--type",
            "json",
            "--patch",
            r#"[{"op":"add","path":"/spec/containers/-","value":{"name":"d","image":"x"}}]"#,
        ],
    )
    .await;
    assert!(
        out.stderr.contains(
            "spec.containers: Forbidden: containers may not be added or removed on resize"
        ),
        "{}",
        out.stderr
    );
    let p = pod(&kc).await;
    assert_eq!(p["metadata"]["generation"], 3);

    // The OpenAPI document has both subresources, as kube-apiserver's does.
    let doc = out_json(&k(&kc, &["get", "--raw", "/openapi/v2"]).await);
    for (sub, id) in [
        ("resize", "patchCoreV1NamespacedPodResize"),
        (
            "ephemeralcontainers",
            "replaceCoreV1NamespacedPodEphemeralcontainers",
        ),
    ] {
        let path = &doc["paths"][format!("/api/v1/namespaces/{{namespace}}/pods/{{name}}/{sub}")];
        let op = if sub == "resize" { "patch" } else { "put" };
        assert_eq!(path[op]["operationId"], id, "{path:#}");
    }
}

/// A non-loopback address of this machine that a backend can listen on, if there is one
/// (upstream only proxies to global unicast addresses).
fn local_unicast() -> Option<IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9")
        .or_else(|_| s.connect("10.255.255.1:9"))
        .ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// A one-request-per-connection HTTP backend that answers with what it was asked.
async fn backend(ip: IpAddr) -> SocketAddr {
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 << 10];
                let mut n = 0;
                while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(m) => n += m,
                    }
                }
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let line = head.lines().next().unwrap_or("").to_owned();
                let fwd = head
                    .lines()
                    .find(|l| l.to_ascii_lowercase().starts_with("x-forwarded-uri:"))
                    .map(|l| l[16..].trim().to_owned())
                    .unwrap_or_default();
                let auth = head.to_ascii_lowercase().contains("\nauthorization:");
                let from = head
                    .lines()
                    .find(|l| l.to_ascii_lowercase().starts_with("x-forwarded-for:"))
                    .map(|l| l[16..].trim().to_owned())
                    .unwrap_or_default();
                let body = format!("{line}|{fwd}|auth={auth}|from={from}");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nAccess-Control-Allow-Origin: *\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_and_service_proxy() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    setup(&kc).await;
    let raw = |path: String| {
        let kc = kc.clone();
        async move { k(&kc, &["get", "--raw", &path]).await }
    };

    // Discovery lists the subresources as kube-apiserver does.
    let core = out_json(&raw("/api/v1".into()).await);
    let names: Vec<&str> = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for n in [
        "pods/ephemeralcontainers",
        "pods/proxy",
        "pods/resize",
        "services/proxy",
    ] {
        assert!(names.contains(&n), "{n} not in {names:?}");
    }
    let kind = |n: &str| {
        core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == n)
            .unwrap()["kind"]
            .clone()
    };
    assert_eq!(kind("pods/proxy"), "PodProxyOptions");
    assert_eq!(kind("services/proxy"), "ServiceProxyOptions");

    // Errors before any backend is dialed.
    let out = raw("/api/v1/namespaces/default/pods/web/proxy/".into()).await;
    assert!(
        out.stderr.contains("(BadRequest): address not allowed"),
        "{}",
        out.stderr
    );
    let out = raw("/api/v1/namespaces/default/pods/nope/proxy/".into()).await;
    assert!(
        out.stderr.contains("pods \"nope\" not found"),
        "{}",
        out.stderr
    );
    let out = raw("/api/v1/namespaces/default/pods/a:b:c:d/proxy/".into()).await;
    assert!(
        out.stderr.contains("invalid pod request \"a:b:c:d\""),
        "{}",
        out.stderr
    );
    let out = raw("/api/v1/namespaces/default/services/nope/proxy/".into()).await;
    assert!(
        out.stderr
            .contains("(ServiceUnavailable): no endpoints available for service \"nope\""),
        "{}",
        out.stderr
    );
    let out = raw("/api/v1/namespaces/default/services/nope:80/proxy/".into()).await;
    assert!(
        out.stderr.contains("services \"nope\" not found"),
        "{}",
        out.stderr
    );

    let Some(ip) = local_unicast() else {
        eprintln!("no non-loopback address: the backend half of the test is skipped");
        return;
    };
    let addr = backend(ip).await;
    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            "web",
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            &json!({"status": {"podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}})
                .to_string(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let port = addr.port();
    let out = raw(format!(
        "/api/v1/namespaces/default/pods/web:{port}/proxy/a/../hello?x=1"
    ))
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!(
            "GET /hello?x=1 HTTP/1.1|/api/v1/namespaces/default/pods/web:{port}/proxy/hello|auth=false|from=127.0.0.1"
        )
    );
    // Nothing listens on the container port (80) of the pod: Go's dial error.
    if std::net::TcpStream::connect((ip, 80)).is_err() {
        let out = raw("/api/v1/namespaces/default/pods/web/proxy/".into()).await;
        let host = SocketAddr::new(ip, 80);
        assert!(
            out.stderr.contains(&format!(
                "(ServiceUnavailable): error trying to reach service: dial tcp {host}: connect: connection refused"
            )),
            "{}",
            out.stderr
        );
    }

    // A service whose endpoint slice names the pod.
    let svc = "apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 8080, targetPort: 80}]
";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(svc)).await;
    assert!(out.ok, "{}", out.stderr);
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": if ip.is_ipv4() { "IPv4" } else { "IPv6" },
        "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true},
                       "targetRef": {"kind": "Pod", "name": "web", "namespace": "default"}}],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    });
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(&slice.to_string())).await;
    assert!(out.ok, "{}", out.stderr);
    let out = raw("/api/v1/namespaces/default/services/web:8080/proxy/svc".into()).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.starts_with("GET /svc HTTP/1.1|"),
        "{}",
        out.stdout
    );
    let out = raw("/api/v1/namespaces/default/services/web:http/proxy/named".into()).await;
    assert!(
        out.stdout.starts_with("GET /named HTTP/1.1|"),
        "{}",
        out.stderr
    );
    // The unnamed port matches no slice port.
    let out = raw("/api/v1/namespaces/default/services/web/proxy/".into()).await;
    assert!(
        out.stderr
            .contains("no endpoints available for service \"web\""),
        "{}",
        out.stderr
    );
    let out = raw("/api/v1/namespaces/default/services/web:9999/proxy/".into()).await;
    assert!(
        out.stderr
            .contains("no service port 9999 found for service \"web\""),
        "{}",
        out.stderr
    );
}

/// The value of `key: value` in the admin kubeconfig.
fn kubeconfig_field(kc: &Path, key: &str) -> String {
    std::fs::read_to_string(kc)
        .unwrap()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(&format!("{key}: "))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("{key} in {}", kc.display()))
}

/// A backend that switches to an echo protocol on an upgrade request.
async fn echo_backend(ip: IpAddr) -> SocketAddr {
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 << 10];
                let mut n = 0;
                while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(m) => n += m,
                    }
                }
                let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
                if !head.contains("\nupgrade: echo") {
                    let _ = s
                        .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let _ = s
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
                    .await;
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_proxy_passes_upgrades_through() {
    use base64::Engine;
    let Some(ip) = local_unicast() else {
        eprintln!("no non-loopback address: skipped");
        return;
    };
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    setup(&kc).await;
    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            "web",
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            &json!({"status": {"podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}})
                .to_string(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let backend = echo_backend(ip).await;

    let b64 = |k: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(kubeconfig_field(&kc, k))
            .unwrap()
    };
    let ca = b64("certificate-authority-data");
    let cert = b64("client-certificate-data");
    let key = b64("client-key-data");
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca.as_slice()) {
        roots.add(c.unwrap()).unwrap();
    }
    let certs: Vec<_> = rustls_pemfile::certs(&mut cert.as_slice())
        .map(|c| c.unwrap())
        .collect();
    let key = rustls_pemfile::private_key(&mut key.as_slice())
        .unwrap()
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .unwrap();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let server_url = kubeconfig_field(&kc, "server");
    let authority = server_url.trim_start_matches("https://").to_owned();
    let tcp = tokio::net::TcpStream::connect(&authority).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut s = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
        .connect(name, tcp)
        .await
        .unwrap();
    let port = backend.port();
    s.write_all(
        format!(
            "GET /api/v1/namespaces/default/pods/web:{port}/proxy/ws HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
        let m = s.read(&mut buf[n..]).await.unwrap();
        assert!(m > 0, "closed: {}", String::from_utf8_lossy(&buf[..n]));
        n += m;
    }
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    s.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"ping");
}
