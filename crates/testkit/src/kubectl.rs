//! kubectl for tests: the real `kubectl` on a blocking thread (so in-process servers keep
//! serving), with polling helpers. Shared by every crate's kubectl-driven tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a kubectl run printed.
pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs kubectl on a blocking thread so the in-process servers keep serving.
pub async fn k(kubeconfig: &Path, args: &[&str]) -> Out {
    k_in(kubeconfig, args, None).await
}

pub async fn k_in(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Out {
    let kc: PathBuf = kubeconfig.to_owned();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .args(&args)
            .env("KUBECONFIG", &kc)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .unwrap()
}

pub fn json(out: &Out) -> serde_json::Value {
    assert!(out.ok, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

/// Polls `f` every 200 ms until it returns Some, failing after `secs`.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The object as JSON if `kubectl get` finds it.
pub async fn get(kubeconfig: &Path, args: &[&str]) -> Option<serde_json::Value> {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "json"]);
    let out = k(kubeconfig, &a).await;
    out.ok.then(|| serde_json::from_str(&out.stdout).unwrap())
}

/// Creates a Node object that looks Ready (allocatable cpu/memory/110 pods, labels, taints
/// as JSON or ""), as a kubelet would report it: for tests that run no kubelet.
pub async fn node(
    kubeconfig: &Path,
    name: &str,
    cpu: &str,
    memory: &str,
    labels: &[(&str, &str)],
    taints: &str,
) {
    let mut l = serde_json::json!({"kubernetes.io/hostname": name});
    for (k, v) in labels {
        l[*k] = serde_json::json!(v);
    }
    let taints: serde_json::Value = if taints.is_empty() {
        serde_json::json!([])
    } else {
        serde_json::from_str(taints).unwrap()
    };
    let obj = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": l},
        "spec": {"taints": taints},
    });
    let out = k_in(kubeconfig, &["create", "-f", "-"], Some(&obj.to_string())).await;
    assert!(out.ok, "{}", out.stderr);
    let status = serde_json::json!({"status": {
        "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
        "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}],
    }});
    let out = k(
        kubeconfig,
        &[
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    // TaintNodesByCondition admission adds the not-ready taint at creation; the
    // node-lifecycle controller (not running here) removes it once the node is Ready.
    let node = get(kubeconfig, &["node", name]).await.unwrap();
    let keep: Vec<serde_json::Value> = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t["key"] != "node.kubernetes.io/not-ready")
        .collect();
    let patch = serde_json::json!({"spec": {"taints": keep}});
    let out = k(
        kubeconfig,
        &[
            "patch",
            "node",
            name,
            "--type=merge",
            "-p",
            &patch.to_string(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}
