//! The resource quota controller against an in-process `kumo apiserver`, driven with
//! kubectl: status.hard and status.used computed from what exists, usage going down after
//! deletions and when pods finish, object counts of any resource, and scopes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use serde_json::{json, Value};

fn apply_ok(out: Out) {
    assert!(out.ok, "{}", out.stderr);
}

async fn apply(kc: &Path, yaml: &str) {
    apply_ok(k_in(kc, &["apply", "-f", "-"], Some(yaml)).await);
}

/// A pod in `ns` with one container requesting (and limiting) these resources.
fn pod(ns: &str, name: &str, requests: Value, limits: Value, extra: Value) -> String {
    let mut spec = json!({"containers": [{"name": "c", "image": "nginx",
        "resources": {"requests": requests, "limits": limits}}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
    .to_string()
}

fn as_strings(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

fn want(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Waits until the quota's status.used is exactly `used`; returns the quota.
async fn wait_used(kc: &Path, ns: &str, name: &str, used: &[(&str, &str)]) -> Value {
    let w = want(used);
    let mut last = Value::Null;
    for _ in 0..150 {
        if let Some(q) = get(kc, &["quota", name, "-n", ns]).await {
            if as_strings(&q["status"]["used"]) == w {
                return q;
            }
            last = q["status"].clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("quota {name}: want used {w:?}, last status {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn usage_is_computed_and_goes_down_after_deletes() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(
        &kc,
        &["serviceaccount-controller", "resourcequota-controller"],
    )
    .await;
    apply_ok(k(&kc, &["create", "namespace", "q"]).await);
    eventually(20, "default SA", || get(&kc, &["sa", "default", "-n", "q"])).await;

    // Objects that exist before the quota: its first usage comes from the controller.
    for (name, cpu, mem) in [("a", "500m", "256Mi"), ("b", "250m", "256Mi")] {
        let p = pod(
            "q",
            name,
            json!({"cpu": cpu, "memory": mem}),
            json!({"cpu": "1", "memory": "512Mi"}),
            json!({}),
        );
        apply_ok(k_in(&kc, &["create", "-f", "-"], Some(&p)).await);
    }
    for name in ["c1", "c2"] {
        apply_ok(
            k(
                &kc,
                &["create", "configmap", name, "-n", "q", "--from-literal=k=v"],
            )
            .await,
        );
    }
    apply_ok(
        k(
            &kc,
            &[
                "create",
                "deployment",
                "d1",
                "-n",
                "q",
                "--image=nginx",
                "--replicas=0",
            ],
        )
        .await,
    );

    apply(
        &kc,
        r#"
apiVersion: v1
kind: ResourceQuota
metadata:
  name: compute
  namespace: q
spec:
  hard:
    pods: "5"
    requests.cpu: "2"
    requests.memory: 2Gi
    limits.cpu: "4"
    limits.memory: 4Gi
    count/pods: "10"
    configmaps: "4"
    count/configmaps: "4"
    count/deployments.apps: "3"
    count/widgets.example.com: "1"
    secrets: "5"
"#,
    )
    .await;
    let q = wait_used(
        &kc,
        "q",
        "compute",
        &[
            ("pods", "2"),
            ("count/pods", "2"),
            ("requests.cpu", "750m"),
            ("requests.memory", "512Mi"),
            ("limits.cpu", "2"),
            ("limits.memory", "1Gi"),
            ("configmaps", "2"),
            ("count/configmaps", "2"),
            ("count/deployments.apps", "1"),
            ("secrets", "0"),
        ],
    )
    .await;
    // status.hard is spec.hard; a resource nothing serves has no usage.
    assert_eq!(
        as_strings(&q["status"]["hard"]),
        as_strings(&q["spec"]["hard"])
    );
    assert_eq!(q["status"]["hard"]["requests.memory"], "2Gi");

    // kubectl describe shows the same numbers.
    let out = k(&kc, &["describe", "quota", "compute", "-n", "q"]).await;
    assert!(out.ok, "{}", out.stderr);
    let rows: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    for row in [
        ["pods", "2", "5"],
        ["requests.cpu", "750m", "2"],
        ["requests.memory", "512Mi", "2Gi"],
        ["count/deployments.apps", "1", "3"],
    ] {
        assert!(
            rows.iter().any(|r| r.as_slice() == row),
            "{row:?} not in\n{}",
            out.stdout
        );
    }

    // Created objects are charged (by admission), and the controller keeps the same count.
    apply_ok(k(&kc, &["create", "configmap", "c3", "-n", "q"]).await);
    apply_ok(
        k(
            &kc,
            &[
                "create",
                "deployment",
                "d2",
                "-n",
                "q",
                "--image=nginx",
                "--replicas=0",
            ],
        )
        .await,
    );
    wait_used(
        &kc,
        "q",
        "compute",
        &[
            ("pods", "2"),
            ("count/pods", "2"),
            ("requests.cpu", "750m"),
            ("requests.memory", "512Mi"),
            ("limits.cpu", "2"),
            ("limits.memory", "1Gi"),
            ("configmaps", "3"),
            ("count/configmaps", "3"),
            ("count/deployments.apps", "2"),
            ("secrets", "0"),
        ],
    )
    .await;

    // Deletions give the usage back.
    apply_ok(k(&kc, &["delete", "pod", "a", "-n", "q", "--wait=false"]).await);
    apply_ok(k(&kc, &["delete", "configmap", "c1", "c2", "-n", "q"]).await);
    apply_ok(k(&kc, &["delete", "deployment", "d1", "-n", "q"]).await);
    wait_used(
        &kc,
        "q",
        "compute",
        &[
            ("pods", "1"),
            ("count/pods", "1"),
            ("requests.cpu", "250m"),
            ("requests.memory", "256Mi"),
            ("limits.cpu", "1"),
            ("limits.memory", "512Mi"),
            ("configmaps", "1"),
            ("count/configmaps", "1"),
            ("count/deployments.apps", "1"),
            ("secrets", "0"),
        ],
    )
    .await;

    // A finished pod uses no compute any more, but still counts as an object.
    let status = json!({"status": {"phase": "Succeeded"}}).to_string();
    apply_ok(
        k(
            &kc,
            &[
                "patch",
                "pod",
                "b",
                "-n",
                "q",
                "--subresource=status",
                "--type=merge",
                "-p",
                &status,
            ],
        )
        .await,
    );
    wait_used(
        &kc,
        "q",
        "compute",
        &[
            ("pods", "0"),
            ("count/pods", "1"),
            ("requests.cpu", "0"),
            ("requests.memory", "0"),
            ("limits.cpu", "0"),
            ("limits.memory", "0"),
            ("configmaps", "1"),
            ("count/configmaps", "1"),
            ("count/deployments.apps", "1"),
            ("secrets", "0"),
        ],
    )
    .await;

    // A new limit is picked up at once: status.hard follows spec.hard.
    apply_ok(
        k(
            &kc,
            &["patch", "quota", "compute", "-n", "q", "--type=json", "-p",
              r#"[{"op":"remove","path":"/spec/hard/count~1widgets.example.com"},{"op":"add","path":"/spec/hard/services","value":"2"}]"#],
        )
        .await,
    );
    let q = wait_used(
        &kc,
        "q",
        "compute",
        &[
            ("pods", "0"),
            ("count/pods", "1"),
            ("requests.cpu", "0"),
            ("requests.memory", "0"),
            ("limits.cpu", "0"),
            ("limits.memory", "0"),
            ("configmaps", "1"),
            ("count/configmaps", "1"),
            ("count/deployments.apps", "1"),
            ("secrets", "0"),
            ("services", "0"),
        ],
    )
    .await;
    assert_eq!(q["status"]["hard"]["services"], "2");
    assert!(q["status"]["hard"]["count/widgets.example.com"].is_null());

    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scopes_select_what_a_quota_counts() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(
        &kc,
        &["serviceaccount-controller", "resourcequota-controller"],
    )
    .await;
    apply_ok(k(&kc, &["create", "namespace", "s"]).await);
    eventually(20, "default SA", || get(&kc, &["sa", "default", "-n", "s"])).await;
    apply(
        &kc,
        r#"
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: high
value: 1000
"#,
    )
    .await;
    let pods = [
        pod("s", "besteffort", json!({}), json!({}), json!({})),
        pod(
            "s",
            "burstable",
            json!({"cpu": "200m"}),
            json!({}),
            json!({}),
        ),
        pod(
            "s",
            "deadline",
            json!({}),
            json!({}),
            json!({"activeDeadlineSeconds": 600}),
        ),
        pod(
            "s",
            "important",
            json!({"cpu": "300m", "memory": "64Mi"}),
            json!({"cpu": "300m", "memory": "64Mi"}),
            json!({"priorityClassName": "high"}),
        ),
    ];
    for p in &pods {
        apply_ok(k_in(&kc, &["create", "-f", "-"], Some(p)).await);
    }
    apply(
        &kc,
        r#"
apiVersion: v1
kind: ResourceQuota
metadata: {name: besteffort, namespace: s}
spec:
  hard: {pods: "10"}
  scopes: [BestEffort]
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: notbesteffort, namespace: s}
spec:
  hard: {pods: "10", requests.cpu: "4"}
  scopes: [NotBestEffort]
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: terminating, namespace: s}
spec:
  hard: {pods: "10"}
  scopes: [Terminating]
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: notterminating, namespace: s}
spec:
  hard: {pods: "10"}
  scopes: [NotTerminating]
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: high, namespace: s}
spec:
  hard: {pods: "10", requests.memory: 1Gi}
  scopeSelector:
    matchExpressions:
    - {scopeName: PriorityClass, operator: In, values: [high]}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: nothigh, namespace: s}
spec:
  hard: {pods: "10"}
  scopeSelector:
    matchExpressions:
    - {scopeName: PriorityClass, operator: NotIn, values: [high]}
"#,
    )
    .await;
    wait_used(&kc, "s", "besteffort", &[("pods", "2")]).await;
    wait_used(
        &kc,
        "s",
        "notbesteffort",
        &[("pods", "2"), ("requests.cpu", "500m")],
    )
    .await;
    wait_used(&kc, "s", "terminating", &[("pods", "1")]).await;
    wait_used(&kc, "s", "notterminating", &[("pods", "3")]).await;
    wait_used(
        &kc,
        "s",
        "high",
        &[("pods", "1"), ("requests.memory", "64Mi")],
    )
    .await;
    wait_used(&kc, "s", "nothigh", &[("pods", "3")]).await;

    // Deleting a pod gives back only what its scopes charged.
    apply_ok(
        k(
            &kc,
            &["delete", "pod", "important", "-n", "s", "--wait=false"],
        )
        .await,
    );
    wait_used(&kc, "s", "high", &[("pods", "0"), ("requests.memory", "0")]).await;
    wait_used(
        &kc,
        "s",
        "notbesteffort",
        &[("pods", "1"), ("requests.cpu", "200m")],
    )
    .await;
    wait_used(&kc, "s", "besteffort", &[("pods", "2")]).await;

    cm.shutdown().await.unwrap();
}
