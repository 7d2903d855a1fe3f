//! `kubectl port-forward` against `kumo up`'s cluster (started in process): pods/portforward
//! through the API server to the kubelet's `/portForward`, over kubectl's WebSocket
//! tunnel and over plain SPDY/3.1; the sim runtime's nginx answers HTTP, and a port
//! nothing listens on gives containerd's "connection refused" on the error stream.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn kubectl(kc: &Path, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kc)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn k(kc: &Path, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let kc = kc.to_owned();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl(&kc, &a, stdin.as_deref())
    })
    .await
    .unwrap()
}

/// A running `kubectl port-forward`, killed when dropped.
struct Forward {
    child: Child,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Forward {
    /// Starts `kubectl port-forward pod/<pod> <local>:<remote>` and waits for its
    /// "Forwarding from" line.
    fn start(kc: &Path, pod: &str, local: u16, remote: u16, websockets: bool) -> Forward {
        Forward::start_with("kubectl", kc, pod, local, remote, websockets)
    }

    fn start_with(
        kubectl: &str,
        kc: &Path,
        pod: &str,
        local: u16,
        remote: u16,
        websockets: bool,
    ) -> Forward {
        let mut child = Command::new(kubectl)
            .args([
                "port-forward",
                &format!("pod/{pod}"),
                &format!("{local}:{remote}"),
            ])
            .env("KUBECONFIG", kc)
            .env(
                "KUBECTL_PORT_FORWARD_WEBSOCKETS",
                if websockets { "true" } else { "false" },
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        let (tx, stderr) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(
            line.starts_with(&format!("Forwarding from 127.0.0.1:{local} -> {remote}")),
            "{line:?} {:?}",
            stderr.try_iter().collect::<Vec<_>>()
        );
        // Keep draining stdout ("Handling connection for ...").
        std::thread::spawn(move || {
            let mut sink = String::new();
            while out.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                sink.clear();
            }
        });
        Forward { child, stderr }
    }

    /// Stderr lines until `want` shows up or kubectl exits (10 s).
    fn stderr_until(&mut self, want: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut all = String::new();
        while Instant::now() < deadline {
            match self.stderr.recv_timeout(Duration::from_millis(200)) {
                Ok(l) => {
                    all.push_str(&l);
                    all.push('\n');
                    if l.contains(want) {
                        break;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(_) => {}
            }
        }
        all
    }
}

/// One HTTP/1.1 request on a fresh loopback connection; the whole answer.
fn http_get(port: u16, path: &str) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\nUser-Agent: test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_port_forward_reaches_the_sim_nginx() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = kumo::cluster::ClusterConfig::new(dir.path().join("kumo"));
    cfg.port = 0;
    cfg.node_name = "pf-node".into();
    let cluster = kumo::cluster::start(cfg).await.unwrap();
    let kc = cluster.api.admin_kubeconfig.clone();
    let kc = kc.as_path();

    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: nginx\n    image: nginx:1.27\n    ports:\n    - containerPort: 80\n";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, _, err) = k(kc, &["apply", "-f", "-"], Some(pod)).await;
        if code == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{err}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, out, _) = k(
            kc,
            &["get", "pod", "web", "-o", "jsonpath={.status.phase}"],
            None,
        )
        .await;
        if out == "Running" {
            break;
        }
        assert!(Instant::now() < deadline, "web is {out:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Discovery lists the subresource as kube-apiserver does.
    let (code, out, err) = k(kc, &["get", "--raw", "/api/v1"], None).await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let pf = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "pods/portforward")
        .cloned()
        .expect("pods/portforward in discovery");
    assert_eq!(pf["kind"], "PodPortForwardOptions");
    assert_eq!(pf["verbs"], serde_json::json!(["create", "get"]));

    for websockets in [true, false] {
        let ports = [kumo_testkit::free_port(), kumo_testkit::free_port()];
        let (port, closed) = (ports[0], ports[1]);
        let kc2 = kc.to_owned();
        let (fw, answer, again) = tokio::task::spawn_blocking(move || {
            let fw = Forward::start(&kc2, "web", port, 80, websockets);
            let answer = http_get(port, "/");
            // A second connection over the same forward.
            let again = http_get(port, "/missing");
            (fw, answer, again)
        })
        .await
        .unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200 OK\r\n"),
            "websockets={websockets}: {answer:?}"
        );
        assert!(answer.contains("\r\nServer: nginx/1.27\r\n"), "{answer}");
        assert!(answer.contains("<h1>Welcome to nginx!</h1>"), "{answer}");
        assert!(again.starts_with("HTTP/1.1 404 Not Found\r\n"), "{again:?}");
        drop(fw);

        // Nothing listens on 81: the connection closes and kubectl reports the
        // runtime's error, then gives up on the pod.
        let kc2 = kc.to_owned();
        let (answer, stderr) = tokio::task::spawn_blocking(move || {
            let mut fw = Forward::start(&kc2, "web", closed, 81, websockets);
            let answer = http_get(closed, "/");
            let stderr = fw.stderr_until("lost connection to pod");
            (answer, stderr)
        })
        .await
        .unwrap();
        assert_eq!(answer, "", "websockets={websockets}");
        assert!(
            stderr.contains(&format!("an error occurred forwarding {closed} -> 81: error forwarding port 81 to pod sandbox-"))
                && stderr.contains("failed to connect to localhost:81 inside namespace ")
                && stderr.contains("dial tcp4 127.0.0.1:81: connect: connection refused"),
            "websockets={websockets}: {stderr}"
        );
    }

    // kubectl 1.33, where there is one (beside kubectl, or in the Cloud SDK's bin).
    let newer = ["kubectl.1.33", "/usr/lib/google-cloud-sdk/bin/kubectl.1.33"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .args(["version", "--client"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("v1.33"))
        });
    if let Some(bin) = newer {
        for websockets in [true, false] {
            let port = kumo_testkit::free_port();
            let kc2 = kc.to_owned();
            let answer = tokio::task::spawn_blocking(move || {
                let _fw = Forward::start_with(bin, &kc2, "web", port, 80, websockets);
                http_get(port, "/")
            })
            .await
            .unwrap();
            assert!(
                answer.starts_with("HTTP/1.1 200 OK\r\n"),
                "{bin} websockets={websockets}: {answer:?}"
            );
        }
    }

    // A node that does not declare ExtendWebSocketsToKubelet: the API server translates
    // the WebSocket tunnel to SPDY itself. The kubelet declares the feature again with its
    // next status, so the forward counts only if the field was still gone after it.
    let mut translated = false;
    for _ in 0..5 {
        let (code, _, err) = k(
            kc,
            &[
                "patch",
                "node",
                "pf-node",
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"declaredFeatures":null}}"#,
            ],
            None,
        )
        .await;
        assert_eq!(code, 0, "{err}");
        let port = kumo_testkit::free_port();
        let kc2 = kc.to_owned();
        let answer = tokio::task::spawn_blocking(move || {
            let _fw = Forward::start(&kc2, "web", port, 80, true);
            http_get(port, "/")
        })
        .await
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
        let (_, features, _) = k(
            kc,
            &[
                "get",
                "node",
                "pf-node",
                "-o",
                "jsonpath={.status.declaredFeatures}",
            ],
            None,
        )
        .await;
        if features.is_empty() {
            translated = true;
            break;
        }
    }
    assert!(
        translated,
        "the kubelet kept declaring the feature back too soon"
    );
    // And the kubelet declares it again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, features, _) = k(
            kc,
            &[
                "get",
                "node",
                "pf-node",
                "-o",
                "jsonpath={.status.declaredFeatures}",
            ],
            None,
        )
        .await;
        if features == r#"["ExtendWebSocketsToKubelet"]"# {
            break;
        }
        assert!(Instant::now() < deadline, "declaredFeatures {features:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A pod that is not there.
    let (code, _, err) = k(kc, &["port-forward", "pod/nope", "0:80"], None).await;
    assert_ne!(code, 0);
    assert!(err.contains("pods \"nope\" not found"), "{err}");
}
