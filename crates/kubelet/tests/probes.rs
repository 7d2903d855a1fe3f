//! The kubelet's network probes, observed with the real kubectl: httpGet and tcpSocket
//! probes against the simulated pods' listeners, and against real servers on loopback for
//! host-network pods (HTTP, HTTPS to the API server's /readyz, gRPC health); readiness
//! follows the server, a failing liveness probe restarts the container, a startup probe
//! holds the others back, and each failed attempt is an `Unhealthy` event with
//! upstream's message.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{k, node_kubeconfig, until, until_within};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kumo_kubelet::KubeletConfig;

/// An HTTP server on a free loopback port answering every request with the code in
/// `code` (changed by the test as it goes); returns its port.
async fn http_server(code: Arc<AtomicU16>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let code = code.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let code = code.load(Ordering::SeqCst);
                    let agent = req
                        .headers()
                        .get("user-agent")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    async move {
                        // Only the kubelet's prober is answered as told.
                        let code = if agent.starts_with("kube-probe/") {
                            code
                        } else {
                            400
                        };
                        Ok::<_, Infallible>(
                            hyper::Response::builder()
                                .status(code)
                                .body(Full::new(Bytes::from_static(b"ok")))
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
    port
}

/// A gRPC health server (h2c) on a free loopback port answering `Check` with the status
/// in `status` (1 SERVING, 2 NOT_SERVING); returns its port.
async fn grpc_health_server(status: Arc<AtomicU16>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let status = status.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let status = status.load(Ordering::SeqCst) as u8;
                    async move {
                        assert_eq!(req.uri().path(), "/grpc.health.v1.Health/Check");
                        // HealthCheckResponse { status }, length-prefixed; grpc-status 0.
                        let body = vec![0u8, 0, 0, 0, 2, 0x08, status];
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                        let body = http_body_util::StreamBody::new(futures::stream::iter(vec![
                            Ok::<_, Infallible>(hyper::body::Frame::data(Bytes::from(body))),
                            Ok(hyper::body::Frame::trailers(trailers)),
                        ]));
                        Ok::<_, Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(body)
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    port
}

fn ready_of(pod: &str) -> [String; 5] {
    [
        "get".into(),
        "pod".into(),
        pod.into(),
        "-o".into(),
        "jsonpath={.status.phase} {.status.containerStatuses[0].started} {.status.containerStatuses[0].ready}".into(),
    ]
}

async fn events_of(admin: &std::path::Path, pod: &str, what: &str, needle: &str) -> String {
    until_within(
        30,
        admin,
        &[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod}"),
            "-o",
            "jsonpath={range .items[*]}{.type} {.reason}: {.message}{\"\\n\"}{end}",
        ],
        what,
        |o| o.contains(needle),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn network_probes_follow_the_servers_they_probe() {
    let (server, dir) = common::start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    let mut kcfg = KubeletConfig::new(node_kubeconfig(dir.path(), &admin, "w1"), "w1");
    kcfg.runtime = Some(kumo_sim::factory(None));
    kcfg.status_update_frequency = Duration::from_secs(1);
    common::spawn_kubelet(kcfg);
    common::node_ready(&admin, "w1").await;

    common::default_service_account(&admin, dir.path()).await;
    let code = Arc::new(AtomicU16::new(200));
    let http_port = http_server(code.clone()).await;
    let grpc_status = Arc::new(AtomicU16::new(2));
    let grpc_port = grpc_health_server(grpc_status.clone()).await;
    let api_port = server.local_addr.port();
    // A port nothing listens on: bound, then released.
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };

    let pods = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: web404}}
spec:
  nodeName: w1
  containers:
  - name: c
    image: nginx:1.29
    readinessProbe: {{httpGet: {{path: /healthz, port: 80}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: webok}}
spec:
  nodeName: w1
  containers:
  - name: c
    image: nginx:1.29
    ports: [{{name: http, containerPort: 80}}]
    readinessProbe: {{httpGet: {{path: /, port: http}}, periodSeconds: 1}}
    livenessProbe: {{tcpSocket: {{port: 80}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: nolisten}}
spec:
  nodeName: w1
  containers:
  - name: c
    image: busybox:1.37
    command: [sleep, "3600"]
    livenessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1, failureThreshold: 2}}
---
apiVersion: v1
kind: Pod
metadata: {{name: agnhost}}
spec:
  nodeName: w1
  containers:
  - name: c
    image: registry.k8s.io/e2e-test-images/agnhost:2.56
    args: [liveness]
    livenessProbe: {{httpGet: {{path: /healthz, port: 8080}}, initialDelaySeconds: 2, periodSeconds: 1, failureThreshold: 1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: hosthttp}}
spec:
  nodeName: w1
  hostNetwork: true
  containers:
  - name: c
    image: busybox:1.37
    command: [sleep, "3600"]
    readinessProbe: {{httpGet: {{host: 127.0.0.1, path: /healthz, port: {http_port}}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: apiserver}}
spec:
  nodeName: w1
  hostNetwork: true
  containers:
  - name: c
    image: busybox:1.37
    command: [sleep, "3600"]
    startupProbe: {{httpGet: {{host: 127.0.0.1, path: /livez, port: {api_port}, scheme: HTTPS}}, periodSeconds: 1}}
    readinessProbe: {{httpGet: {{host: 127.0.0.1, path: /readyz, port: {api_port}, scheme: HTTPS}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: starting}}
spec:
  nodeName: w1
  hostNetwork: true
  containers:
  - name: c
    image: busybox:1.37
    command: [sleep, "3600"]
    startupProbe: {{tcpSocket: {{host: 127.0.0.1, port: {closed_port}}}, periodSeconds: 1, failureThreshold: 1000}}
    readinessProbe: {{tcpSocket: {{host: 127.0.0.1, port: {http_port}}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: grpc}}
spec:
  nodeName: w1
  hostNetwork: true
  containers:
  - name: c
    image: busybox:1.37
    command: [sleep, "3600"]
    readinessProbe: {{grpc: {{port: {grpc_port}}}, periodSeconds: 1}}
"#
    );
    let f = dir.path().join("pods.yaml");
    std::fs::write(&f, pods).unwrap();
    let (ok, _, err) = k(&admin, &["create", "-f", f.to_str().unwrap()]).await;
    assert!(ok, "{err}");

    // nginx answers /healthz with 404: running, never ready, an event per failure.
    until(
        &admin,
        &ready_of("web404").each_ref().map(String::as_str),
        "web404 not ready",
        |o| o == "Running true false",
    )
    .await;
    let ev = events_of(
        &admin,
        "web404",
        "readiness events",
        "Readiness probe failed",
    )
    .await;
    assert!(
        ev.contains(
            "Warning Unhealthy: Readiness probe failed: HTTP probe failed with statuscode: 404"
        ),
        "{ev}"
    );
    // A named port to nginx's /: ready; its TCP liveness probe passes (no restarts).
    until(
        &admin,
        &ready_of("webok").each_ref().map(String::as_str),
        "webok ready",
        |o| o == "Running true true",
    )
    .await;

    // Nothing listens on 8080: refused twice in a row, then killed and restarted.
    until_within(
        40,
        &admin,
        &[
            "get",
            "pod",
            "nolisten",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ],
        "liveness restarts",
        |o| o.parse::<u32>().is_ok_and(|n| n >= 1),
    )
    .await;
    let (_, ip, _) = k(
        &admin,
        &["get", "pod", "nolisten", "-o", "jsonpath={.status.podIP}"],
    )
    .await;
    let ev = events_of(&admin, "nolisten", "liveness events", "Killing").await;
    assert!(
        ev.contains(&format!(
            "Warning Unhealthy: Liveness probe failed: dial tcp {ip}:8080: connect: connection refused"
        )),
        "{ev}"
    );
    assert!(
        ev.contains("Normal Killing: Container c failed liveness probe, will be restarted"),
        "{ev}"
    );

    // agnhost's liveness server turns unhealthy 10 s after its start: restarted.
    until_within(
        40,
        &admin,
        &[
            "get",
            "pod",
            "agnhost",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ],
        "agnhost liveness restarts",
        |o| o.parse::<u32>().is_ok_and(|n| n >= 1),
    )
    .await;
    let ev = events_of(&admin, "agnhost", "agnhost events", "Killing").await;
    assert!(
        ev.contains("Liveness probe failed: HTTP probe failed with statuscode: 500"),
        "{ev}"
    );

    // A real server on loopback: ready while it answers 200, not ready on 500, ready again.
    let hosthttp = ready_of("hosthttp");
    let hosthttp: Vec<&str> = hosthttp.iter().map(String::as_str).collect();
    until(&admin, &hosthttp, "hosthttp ready", |o| {
        o == "Running true true"
    })
    .await;
    code.store(500, Ordering::SeqCst);
    until(&admin, &hosthttp, "hosthttp unready on 500", |o| {
        o == "Running true false"
    })
    .await;
    let ev = events_of(&admin, "hosthttp", "500 event", "statuscode: 500").await;
    assert!(
        ev.contains("Readiness probe failed: HTTP probe failed with statuscode: 500"),
        "{ev}"
    );
    code.store(200, Ordering::SeqCst);
    until(&admin, &hosthttp, "hosthttp ready again", |o| {
        o == "Running true true"
    })
    .await;
    // The pod's Ready condition follows, and so would its endpoints.
    until(
        &admin,
        &[
            "get",
            "pod",
            "hosthttp",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        "Ready condition",
        |o| o == "True",
    )
    .await;

    // HTTPS without verification to the API server's own health endpoints.
    until(
        &admin,
        &ready_of("apiserver").each_ref().map(String::as_str),
        "apiserver probes",
        |o| o == "Running true true",
    )
    .await;

    // A startup probe that has not passed: not started, and readiness is not run.
    let starting = ready_of("starting");
    let starting: Vec<&str> = starting.iter().map(String::as_str).collect();
    until(&admin, &starting, "starting not started", |o| {
        o == "Running false false"
    })
    .await;
    let ev = events_of(&admin, "starting", "startup events", "Startup probe failed").await;
    assert!(
        ev.contains(&format!(
            "Startup probe failed: dial tcp 127.0.0.1:{closed_port}: connect: connection refused"
        )),
        "{ev}"
    );
    assert!(!ev.contains("Readiness probe failed"), "{ev}");
    // Once something listens there, the container starts and turns ready.
    let _listener = tokio::net::TcpListener::bind(("127.0.0.1", closed_port))
        .await
        .unwrap();
    until(&admin, &starting, "starting started", |o| {
        o == "Running true true"
    })
    .await;

    // gRPC health: NOT_SERVING is a failure with upstream's message; SERVING passes.
    let grpc = ready_of("grpc");
    let grpc: Vec<&str> = grpc.iter().map(String::as_str).collect();
    let ev = events_of(&admin, "grpc", "grpc events", "Readiness probe failed").await;
    assert!(
        ev.contains("Readiness probe failed: service unhealthy (responded with \"NOT_SERVING\")"),
        "{ev}"
    );
    until(&admin, &grpc, "grpc unready", |o| o == "Running true false").await;
    grpc_status.store(1, Ordering::SeqCst);
    until(&admin, &grpc, "grpc ready", |o| o == "Running true true").await;
}
