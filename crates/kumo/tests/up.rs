//! `kumo up` starts what has landed and tells the user how to reach it with kubectl.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// `kumo up` merges a `kumo-<name>` context into the user's kubeconfig (here
/// `$KUBECONFIG`) and makes it current, as kind does: kubectl works with no export. Its
/// terminal shows only its own lines, the components' logs go to the log file.
#[test]
fn kumo_up_sets_a_working_context() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("first");
    let kubeconfig = dir.path().join("user.conf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["up", "--port", "0", "--data-dir"])
        .arg(&data)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        printed.push(line.clone());
        if line == "kumo: ready" {
            break;
        }
    }
    assert_eq!(
        printed.last().map(String::as_str),
        Some("kumo: ready"),
        "{printed:?}"
    );
    assert!(
        printed[0].starts_with("kumo: API server ready at https://127.0.0.1:"),
        "{printed:?}"
    );
    assert!(
        printed
            .iter()
            .any(|l| l.starts_with("kumo: context kumo-first set in ")),
        "{printed:?}"
    );
    // Every line on the terminal is kumo up's own: no component's log line (WARN ...).
    assert!(
        printed
            .iter()
            .all(|l| l.starts_with("kumo: ") || l.starts_with("  ") || l.ends_with(':')),
        "{printed:?}"
    );
    let ctx = Command::new("kubectl")
        .args(["config", "current-context"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&ctx.stdout), "kumo-first\n");
    let out = Command::new("kubectl")
        .args(["get", "namespaces", "-o", "name"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/default"));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!stderr.contains("WARN"), "{stderr}");
    // The components logged to the log file instead.
    let log = std::fs::read_to_string(data.join("kumo.log")).unwrap();
    assert!(log.contains(" INFO "), "{log}");
}

/// kubectl against `kubeconfig`: (ok, stdout, stderr).
fn kubectl(kubeconfig: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Polls `kubectl args` until its stdout satisfies `ok` (60 s).
fn until(kubeconfig: &str, args: &[&str], what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, out, err) = kubectl(kubeconfig, args);
        if ok(&out) {
            return out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {out:?} {err}"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Seed 003's walk through a cluster, on `kumo up`: the node registers and is Ready, the
/// control plane's leases are in kube-system, `kubectl run` is scheduled and runs, and a
/// static pod's mirror pod appears, owned by the node, and comes back when deleted.
#[test]
fn kumo_up_runs_pods_on_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args([
            "up",
            "--port",
            "0",
            "--no-cloud",
            "--node-name",
            "cka-w1",
            "--kubeconfig-update=false",
            "--data-dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut kubeconfig = None;
    let mut manifests = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(p) = line.split("static pods: put manifests in ").nth(1) {
            manifests = Some(p.trim().to_owned());
        }
        // Without the merge, it says which file to export.
        if let Some(path) = line.trim().strip_prefix("export KUBECONFIG=") {
            kubeconfig = Some(path.to_owned());
        }
        if line == "kumo: ready" {
            break;
        }
    }
    let kc = kubeconfig.unwrap();
    let manifests = manifests.unwrap();
    let check = std::panic::catch_unwind(|| {
        until(
            &kc,
            &[
                "get",
                "node",
                "cka-w1",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
            "node Ready",
            |o| o == "True",
        );
        // The node-lifecycle controller lifts the not-ready taint once the node is Ready.
        until(
            &kc,
            &["get", "node", "cka-w1", "-o", "jsonpath={.spec.taints}"],
            "no taints",
            |o| o.is_empty(),
        );
        until(
            &kc,
            &["-n", "kube-system", "get", "lease", "-o", "name"],
            "leases",
            |o| {
                o.contains("lease.coordination.k8s.io/kube-controller-manager")
                    && o.contains("lease.coordination.k8s.io/kube-scheduler")
            },
        );
        until(
            &kc,
            &["get", "sa", "default", "-o", "name"],
            "default service account",
            |o| o.contains("default"),
        );
        let (ok, _, err) = kubectl(&kc, &["run", "web", "--image=nginx:1.29", "--port=80"]);
        assert!(ok, "{err}");
        until(
            &kc,
            &[
                "get",
                "pod",
                "web",
                "-o",
                "jsonpath={.spec.nodeName} {.status.phase}",
            ],
            "web Running",
            |o| o == "cka-w1 Running",
        );
        // Seed 001's start: a Deployment's pods run, and its Service has their endpoints.
        let (ok, _, err) = kubectl(
            &kc,
            &[
                "create",
                "deployment",
                "hello",
                "--image=nginx:1.29",
                "--port=80",
                "--replicas=2",
            ],
        );
        assert!(ok, "{err}");
        let (ok, _, err) = kubectl(&kc, &["expose", "deployment", "hello", "--port=80"]);
        assert!(ok, "{err}");
        until(
            &kc,
            &[
                "get",
                "deployment",
                "hello",
                "-o",
                "jsonpath={.status.availableReplicas}",
            ],
            "deployment available",
            |o| o == "2",
        );
        until(
            &kc,
            &[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=hello",
                "-o",
                "jsonpath={.items[0].endpoints[*].conditions.ready}",
            ],
            "endpoints ready",
            |o| o == "true true",
        );
        std::fs::write(
            std::path::Path::new(&manifests).join("static-web.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static-web\nspec:\n  containers:\n  - name: web\n    image: nginx:1.29\n",
        )
        .unwrap();
        until(&kc, &["get", "pod", "static-web-cka-w1", "-o", "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {.status.phase}"], "mirror pod", |o| o == "Node/cka-w1 Running");
        let (ok, _, err) = kubectl(&kc, &["delete", "pod", "static-web-cka-w1"]);
        assert!(ok, "{err}");
        until(
            &kc,
            &[
                "get",
                "pod",
                "static-web-cka-w1",
                "-o",
                "jsonpath={.status.phase}",
            ],
            "mirror back",
            |o| o == "Running",
        );
        // A Job whose pod has a native sidecar completes: the container finishes, the
        // sidecar is stopped (its `sleep` ignores SIGTERM: killed after the 2 s grace).
        let job = std::path::Path::new(&manifests)
            .parent()
            .unwrap()
            .join("sidecar-job.yaml");
        std::fs::write(
            &job,
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: withsidecar\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      terminationGracePeriodSeconds: 2\n      initContainers:\n      - name: log\n        image: busybox:1.37\n        restartPolicy: Always\n        command: [sh, -c, 'sleep 3600']\n      containers:\n      - name: main\n        image: busybox:1.37\n        command: [sh, -c, 'sleep 1; echo done']\n",
        )
        .unwrap();
        let (ok, _, err) = kubectl(&kc, &["create", "-f", job.to_str().unwrap()]);
        assert!(ok, "{err}");
        until(
            &kc,
            &[
                "get",
                "job",
                "withsidecar",
                "-o",
                "jsonpath={.status.succeeded}",
            ],
            "the Job with a sidecar completes",
            |o| o == "1",
        );
        // A command the simulator has no model of is said so, not run in silence.
        let (ok, _, err) = kubectl(
            &kc,
            &[
                "create",
                "job",
                "py",
                "--image=python:3.12",
                "--",
                "python",
                "-c",
                "print(1)",
            ],
        );
        assert!(ok, "{err}");
        until(
            &kc,
            &[
                "get",
                "events",
                "--field-selector",
                "reason=NotSimulated",
                "-o",
                "jsonpath={.items[*].message}",
            ],
            "the NotSimulated warning",
            |o| o.contains("cannot run \"python -c print(1)\" of image \"python:3.12\""),
        );
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(e) = check {
        std::panic::resume_unwind(e);
    }
}
