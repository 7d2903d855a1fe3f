//! `kubectl logs` and `kubectl exec` against `kumo up`'s cluster (started in process):
//! the API server's pods/log and pods/exec go through the kubelet's HTTPS API with the
//! apiserver-kubelet-client certificate; the sim runtime prints what the pods' command
//! lines print. Also the kubelet API's own authentication and authorization.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// kubectl with `kubeconfig`: (exit code, stdout, stderr).
fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
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

async fn k(kc: &Path, args: &[&str]) -> (i32, String, String) {
    k_in(kc, args, None).await
}

async fn k_in(kc: &Path, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
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

/// Polls `kubectl args` until its stdout satisfies `ok` (60 s).
async fn until(kc: &Path, args: &[&str], what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, out, err) = k(kc, args).await;
        if ok(&out) {
            return out;
        }
        assert!(Instant::now() < deadline, "{what}: {out:?} {err}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn pod_yaml(name: &str, restart: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {restart}\n  containers:\n  - name: main\n    image: busybox:1.37\n    command: [sh, -c, {script:?}]\n    env:\n    - name: NAME\n      value: world\n"
    )
}

async fn apply(kc: &Path, yaml: &str) {
    // Until the controller-manager has made the default ServiceAccount.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, _, err) = k_in(kc, &["apply", "-f", "-"], Some(yaml)).await;
        if code == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{err}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_and_exec_through_the_kubelet() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = kumo::cluster::ClusterConfig::new(dir.path().join("kumo"));
    cfg.port = 0;
    cfg.node_name = "logs-node".into();
    let cluster = kumo::cluster::start(cfg).await.unwrap();
    let kc: PathBuf = cluster.api.admin_kubeconfig.clone();
    let kc = kc.as_path();

    apply(
        kc,
        &pod_yaml(
            "talker",
            "Always",
            "echo hello $(NAME); echo oops >&2; sleep 1; echo second; sleep 3600",
        ),
    )
    .await;
    apply(
        kc,
        &pod_yaml("crasher", "Always", "echo attempt $HOSTNAME; exit 1"),
    )
    .await;
    until(
        kc,
        &["get", "pod", "talker", "-o", "jsonpath={.status.phase}"],
        "talker runs",
        |o| o == "Running",
    )
    .await;

    // Logs: all of them (stdout and stderr), the tail, with timestamps.
    let out = until(kc, &["logs", "talker"], "talker's logs", |o| {
        o.contains("second")
    })
    .await;
    assert_eq!(out, "hello world\noops\nsecond\n");
    let (_, out, _) = k(kc, &["logs", "talker", "--tail", "1"]).await;
    assert_eq!(out, "second\n");
    let (_, out, _) = k(kc, &["logs", "talker", "--tail=1", "--timestamps"]).await;
    let (ts, line) = out.split_once(' ').unwrap();
    assert_eq!(line, "second\n");
    assert_eq!(ts.len(), "2026-01-02T03:04:05.123456789Z".len(), "{out}");
    assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{out}");
    let (_, out, _) = k(kc, &["logs", "talker", "--limit-bytes", "4"]).await;
    assert_eq!(out, "hell");

    // The API server's validation, as upstream's.
    let (code, _, err) = k(
        kc,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/pods/talker/log?container=nope",
        ],
    )
    .await;
    assert_ne!(code, 0);
    assert!(
        err.contains("container nope is not valid for pod talker"),
        "{err}"
    );
    let (_, _, err) = k(
        kc,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/pods/talker/log?tailLines=-1",
        ],
    )
    .await;
    assert!(
        err.contains("tailLines: Invalid value: -1: must be greater than or equal to 0"),
        "{err}"
    );
    let (code, _, err) = k(kc, &["logs", "talker", "--previous"]).await;
    assert_ne!(code, 0);
    assert!(
        err.contains(r#"previous terminated container "main" in pod "talker" not found"#),
        "{err}"
    );

    // Follow: lines arrive while the stream stays open.
    let kc_owned = kc.to_owned();
    let followed = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("kubectl")
            .args(["logs", "-f", "talker"])
            .env("KUBECONFIG", &kc_owned)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = Vec::new();
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            lines.push(line.unwrap());
            if lines.len() == 3 {
                break;
            }
        }
        // Still streaming: the container runs on.
        let running = child.try_wait().unwrap().is_none();
        let _ = child.kill();
        let _ = child.wait();
        (lines, running)
    });
    let (lines, running) = tokio::time::timeout(Duration::from_secs(30), followed)
        .await
        .expect("logs -f delivers lines")
        .unwrap();
    assert_eq!(lines, ["hello world", "oops", "second"]);
    assert!(running, "logs -f ended while the container runs");

    // --previous after a restart: the exited attempt's output.
    until(
        kc,
        &[
            "get",
            "pod",
            "crasher",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ],
        "crasher restarts",
        |o| o.parse::<u32>().is_ok_and(|n| n >= 1),
    )
    .await;
    let (code, out, err) = k(kc, &["logs", "crasher", "--previous"]).await;
    assert_eq!((code, out.as_str()), (0, "attempt crasher\n"), "{err}");

    // Exec: output, exit codes, stdin.
    let (code, out, err) = k(
        kc,
        &["exec", "talker", "--", "sh", "-c", "echo out; exit 3"],
    )
    .await;
    assert_eq!(code, 3, "{err}");
    assert_eq!(out, "out\n");
    assert!(err.contains("command terminated with exit code 3"), "{err}");
    let (code, out, _) = k(kc, &["exec", "talker", "--", "cat", "/etc/hostname"]).await;
    assert_eq!((code, out.as_str()), (0, "talker\n"));
    let (code, out, _) = k_in(kc, &["exec", "-i", "talker", "--", "cat"], Some("abc\n")).await;
    assert_eq!((code, out.as_str()), (0, "abc\n"));
    // A shell reading its stdin ends at `exit`, as an interactive one would.
    let (code, out, _) = k_in(
        kc,
        &["exec", "-i", "talker", "--", "sh"],
        Some("echo hi\nexit\n"),
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "hi\n"));
    // nodes/proxy reaches the kubelet's own endpoints.
    let (code, out, err) = k(
        kc,
        &["get", "--raw", "/api/v1/nodes/logs-node/proxy/healthz"],
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "ok"), "{err}");
    let (code, _, err) = k(kc, &["exec", "talker", "--", "no-such-binary"]).await;
    assert_ne!(code, 0);
    assert!(err.contains("executable file not found in $PATH"), "{err}");

    // The service-account volume: a bound token the API server accepts as the pod's
    // ServiceAccount, the cluster CA as kube-root-ca.crt publishes it, and the namespace.
    let sa_file = |f: &str| format!("/var/run/secrets/kubernetes.io/serviceaccount/{f}");
    let (code, out, err) = k(kc, &["exec", "talker", "--", "cat", &sa_file("namespace")]).await;
    assert_eq!((code, out.as_str()), (0, "default"), "{err}");
    let (code, ca, err) = k(kc, &["exec", "talker", "--", "cat", &sa_file("ca.crt")]).await;
    assert_eq!(code, 0, "{err}");
    let (_, root_ca, _) = k(
        kc,
        &[
            "get",
            "configmap",
            "kube-root-ca.crt",
            "-o",
            r"jsonpath={.data.ca\.crt}",
        ],
    )
    .await;
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    assert_eq!(ca, root_ca);
    let (code, token, err) = k(kc, &["exec", "talker", "--", "cat", &sa_file("token")]).await;
    assert_eq!(code, 0, "{err}");
    let review = format!(
        "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: {token}\n"
    );
    let (code, out, err) = k_in(kc, &["create", "-f", "-", "-o", "json"], Some(&review)).await;
    assert_eq!(code, 0, "{err}");
    let review: serde_json::Value = serde_json::from_str(&out).unwrap();
    let status = &review["status"];
    assert_eq!(status["authenticated"], true, "{out}");
    assert_eq!(
        status["user"]["username"],
        "system:serviceaccount:default:default"
    );
    assert_eq!(
        status["user"]["extra"]["authentication.kubernetes.io/pod-name"][0], "talker",
        "{out}"
    );

    // A user who may read pods but not exec into them or read their logs.
    for args in [
        &[
            "create",
            "role",
            "reader",
            "--verb=get,list",
            "--resource=pods",
        ][..],
        &[
            "create",
            "rolebinding",
            "reader",
            "--role=reader",
            "--serviceaccount=default:default",
        ],
    ] {
        let (code, _, err) = k(kc, args).await;
        assert_eq!(code, 0, "{err}");
    }
    let sa = "--as=system:serviceaccount:default:default";
    let (code, _, err) = until_forbidden(kc, &["exec", sa, "talker", "--", "true"]).await;
    assert_ne!(code, 0);
    assert!(
        err.contains(r#"Error from server (Forbidden): pods "talker" is forbidden: User "system:serviceaccount:default:default" cannot create resource "pods/exec" in API group "" in the namespace "default""#),
        "{err}"
    );
    let (_, _, err) = k(kc, &["logs", sa, "talker"]).await;
    assert!(
        err.contains(
            r#"cannot get resource "pods/log" in API group "" in the namespace "default""#
        ),
        "{err}"
    );

    // The kubelet's own API: a token the TokenReview refuses gets 401; the API server's
    // client certificate (kubeadm:cluster-admins) is allowed by the SubjectAccessReview.
    let port = until(
        kc,
        &[
            "get",
            "node",
            "logs-node",
            "-o",
            "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}",
        ],
        "kubelet port",
        |o| o.parse::<u16>().is_ok(),
    )
    .await;
    let server = format!("--server=https://127.0.0.1:{port}");
    let empty = dir.path().join("empty.conf");
    std::fs::write(&empty, "").unwrap();
    let (code, _, err) = k(
        &empty,
        &[
            &server,
            "--insecure-skip-tls-verify",
            "--token=not-a-token",
            "get",
            "--raw",
            "/healthz",
        ],
    )
    .await;
    assert_ne!(code, 0);
    assert!(
        err.contains("You must be logged in to the server (the server has asked for the client to provide credentials)"),
        "{err}"
    );
    let pki = dir.path().join("kumo").join("pki");
    let cert = format!(
        "--client-certificate={}",
        pki.join("apiserver-kubelet-client.crt").display()
    );
    let key = format!(
        "--client-key={}",
        pki.join("apiserver-kubelet-client.key").display()
    );
    let (code, out, err) = k(
        &empty,
        &[
            &server,
            "--insecure-skip-tls-verify",
            &cert,
            &key,
            "get",
            "--raw",
            "/healthz",
        ],
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "ok"), "{err}");
    let (code, out, err) = k(
        &empty,
        &[
            &server,
            "--insecure-skip-tls-verify",
            &cert,
            &key,
            "get",
            "--raw",
            "/pods",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(r#""name":"talker""#), "{out}");
}

/// Runs kubectl until it is refused (RBAC follows its objects by watch).
async fn until_forbidden(kc: &Path, args: &[&str]) -> (i32, String, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = k(kc, args).await;
        if r.2.contains("pods/exec") || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
