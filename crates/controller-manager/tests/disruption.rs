//! The disruption controller against an in-process `kumo apiserver`, with the eviction
//! subresource and `kubectl drain` on top. No kubelet runs: the tests mark pods Ready
//! through the status subresource.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use serde_json::{json, Value};

/// Marks the pod Running and Ready (what a kubelet would report).
async fn make_ready(kc: &Path, ns: &str, name: &str) {
    let now = "2026-01-01T00:00:00Z";
    let patch = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
    ]}});
    let out = k(
        kc,
        &[
            "patch",
            "pod",
            name,
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch.to_string(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

async fn make_all_ready(kc: &Path, ns: &str, selector: &str) {
    for p in pods(kc, ns, selector).await {
        make_ready(kc, ns, p["metadata"]["name"].as_str().unwrap()).await;
    }
}

/// Waits until the budget's status has these counters (and is observed).
async fn wait_status(kc: &Path, ns: &str, name: &str, want: [i64; 4]) -> Value {
    eventually(30, &format!("pdb {name} status {want:?}"), || async {
        let p = get(kc, &["pdb", name, "-n", ns]).await?;
        let s = &p["status"];
        let got = [
            s["expectedPods"].as_i64().unwrap_or(-1),
            s["currentHealthy"].as_i64().unwrap_or(-1),
            s["desiredHealthy"].as_i64().unwrap_or(-1),
            s["disruptionsAllowed"].as_i64().unwrap_or(-1),
        ];
        (got == want && s["observedGeneration"] == p["metadata"]["generation"]).then_some(p)
    })
    .await
}

fn condition<'a>(pdb: &'a Value, type_: &str) -> &'a Value {
    pdb["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

/// POSTs an Eviction for the pod through kubectl; the output.
async fn evict(kc: &Path, ns: &str, name: &str) -> Out {
    let body = json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": ns},
    });
    let path = format!("/api/v1/namespaces/{ns}/pods/{name}/eviction");
    k_in(
        kc,
        &["create", "--raw", &path, "-f", "-"],
        Some(&body.to_string()),
    )
    .await
}

async fn events(kc: &Path, ns: &str, name: &str, reason: &str) -> Vec<Value> {
    let v = get(kc, &["events", "-n", ns]).await.unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["name"] == name && e["reason"] == reason)
        .cloned()
        .collect()
}

const RS: &str = r#"
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: c
        image: nginx
"#;

const PDB: &str = r#"
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: web
spec:
  minAvailable: 2
  selector:
    matchLabels: {app: web}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn budget_status_and_eviction_allowed_then_refused() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(
        &kc,
        &[
            "serviceaccount-controller",
            "replicaset-controller",
            "disruption-controller",
        ],
    )
    .await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;

    // A budget that selects nothing yet: nothing may be disrupted.
    let out = k_in(&kc, &["apply", "-f", "-"], Some(PDB)).await;
    assert!(out.ok, "{}", out.stderr);
    let pdb = wait_status(&kc, "default", "web", [0, 0, 2, 0]).await;
    let c = condition(&pdb, "DisruptionAllowed");
    assert_eq!(c["status"], "False");
    assert_eq!(c["reason"], "InsufficientPods");
    let no_pods = eventually(20, "NoPods event", || async {
        events(&kc, "default", "web", "NoPods").await.pop()
    })
    .await;
    assert_eq!(no_pods["message"], "No matching pods found");
    assert_eq!(no_pods["type"], "Normal");
    assert_eq!(no_pods["source"]["component"], "controllermanager");

    // Three pods, not ready: none healthy.
    let out = k_in(&kc, &["apply", "-f", "-"], Some(RS)).await;
    assert!(out.ok, "{}", out.stderr);
    wait_pods(&kc, "default", "app=web", 3).await;
    wait_status(&kc, "default", "web", [3, 0, 2, 0]).await;

    // Ready: one disruption allowed.
    make_all_ready(&kc, "default", "app=web").await;
    let pdb = wait_status(&kc, "default", "web", [3, 3, 2, 1]).await;
    let c = condition(&pdb, "DisruptionAllowed");
    assert_eq!(c["status"], "True");
    assert_eq!(c["reason"], "SufficientPods");
    assert_eq!(c["observedGeneration"], pdb["metadata"]["generation"]);

    // The first eviction is allowed and takes the disruption.
    let victims = pods(&kc, "default", "app=web").await;
    let first = victims[0]["metadata"]["name"].as_str().unwrap().to_owned();
    let out = evict(&kc, "default", &first).await;
    assert!(out.ok, "eviction refused: {}", out.stderr);
    eventually(20, "evicted pod gone", || async {
        get(&kc, &["pod", &first]).await.is_none().then_some(())
    })
    .await;
    // The replacement is not ready: two healthy, nothing more allowed.
    let pdb = wait_status(&kc, "default", "web", [3, 2, 2, 0]).await;
    assert_eq!(
        condition(&pdb, "DisruptionAllowed")["reason"],
        "InsufficientPods"
    );
    // The controller dropped the evicted pod from disruptedPods once it was gone.
    assert!(pdb["status"]["disruptedPods"].is_null(), "{pdb}");

    // The next eviction is refused with 429.
    let second = pods(&kc, "default", "app=web")
        .await
        .into_iter()
        .find(|p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .unwrap();
    let second = second["metadata"]["name"].as_str().unwrap().to_owned();
    let out = evict(&kc, "default", &second).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("TooManyRequests")
            && out
                .stderr
                .contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{}",
        out.stderr
    );
    assert!(get(&kc, &["pod", &second]).await.is_some());

    // The replacement turns ready: one disruption allowed again.
    make_all_ready(&kc, "default", "app=web").await;
    wait_status(&kc, "default", "web", [3, 3, 2, 1]).await;
    let out = evict(&kc, "default", &second).await;
    assert!(out.ok, "eviction refused: {}", out.stderr);

    // Its replacement is not ready: with the budget still met by the ready pods, an unready
    // pod may be evicted although no disruption is allowed (IfHealthyBudget).
    let pdb = wait_status(&kc, "default", "web", [3, 2, 2, 0]).await;
    assert!(pdb["spec"]["unhealthyPodEvictionPolicy"].is_null());
    let unready = pods(&kc, "default", "app=web")
        .await
        .into_iter()
        .find(|p| {
            !p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .unwrap();
    let unready = unready["metadata"]["name"].as_str().unwrap().to_owned();
    let out = evict(&kc, "default", &unready).await;
    assert!(out.ok, "eviction of an unready pod refused: {}", out.stderr);
    eventually(20, "unready pod gone", || async {
        get(&kc, &["pod", &unready]).await.is_none().then_some(())
    })
    .await;

    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn percentages_use_the_controllers_scale_and_failures_fail_safe() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(
        &kc,
        &[
            "serviceaccount-controller",
            "replicaset-controller",
            "deployment-controller",
            "disruption-controller",
        ],
    )
    .await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    let deploy = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: api
spec:
  replicas: 4
  selector:
    matchLabels: {app: api}
  template:
    metadata:
      labels: {app: api}
    spec:
      containers:
      - name: c
        image: nginx
"#;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(deploy)).await;
    assert!(out.ok, "{}", out.stderr);
    wait_pods(&kc, "default", "app=api", 4).await;
    // Two of four ready; maxUnavailable 25% of the Deployment's 4 → 3 desired.
    let p = pods(&kc, "default", "app=api").await;
    for pod in &p[..2] {
        make_ready(&kc, "default", pod["metadata"]["name"].as_str().unwrap()).await;
    }
    let pdb = r#"
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: api
spec:
  maxUnavailable: 25%
  selector:
    matchLabels: {app: api}
"#;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(pdb)).await;
    assert!(out.ok, "{}", out.stderr);
    wait_status(&kc, "default", "api", [4, 2, 3, 0]).await;
    // minAvailable 50% of 4 → 2 desired; the spec change bumps the generation.
    let out = k(
        &kc,
        &[
            "patch",
            "pdb",
            "api",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/spec/maxUnavailable"},{"op":"add","path":"/spec/minAvailable","value":"50%"}]"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    wait_status(&kc, "default", "api", [4, 2, 2, 0]).await;
    make_all_ready(&kc, "default", "app=api").await;
    wait_status(&kc, "default", "api", [4, 4, 2, 2]).await;
    // Scaling the Deployment changes the expected count.
    let out = k(&kc, &["scale", "deployment", "api", "--replicas=6"]).await;
    assert!(out.ok, "{}", out.stderr);
    wait_pods(&kc, "default", "app=api", 6).await;
    wait_status(&kc, "default", "api", [6, 4, 3, 1]).await;

    // A pod whose controller does not exist: the budget cannot be computed.
    let orphan = r#"
apiVersion: v1
kind: Pod
metadata:
  name: lost
  labels: {app: lost}
  ownerReferences:
  - apiVersion: apps/v1
    kind: ReplicaSet
    name: gone
    uid: 00000000-0000-0000-0000-000000000001
    controller: true
spec:
  containers:
  - name: c
    image: nginx
"#;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(orphan)).await;
    assert!(out.ok, "{}", out.stderr);
    make_ready(&kc, "default", "lost").await;
    let pdb = r#"
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: lost
spec:
  maxUnavailable: 1
  selector:
    matchLabels: {app: lost}
"#;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(pdb)).await;
    assert!(out.ok, "{}", out.stderr);
    let pdb = eventually(30, "SyncFailed", || async {
        let p = get(&kc, &["pdb", "lost"]).await?;
        (condition(&p, "DisruptionAllowed")["reason"] == "SyncFailed").then_some(p)
    })
    .await;
    let c = condition(&pdb, "DisruptionAllowed");
    assert_eq!(c["status"], "False");
    assert_eq!(c["message"], "found no controllers for pod \"lost\"");
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0);
    let ev = eventually(20, "CalculateExpectedPodCountFailed", || async {
        events(&kc, "default", "lost", "CalculateExpectedPodCountFailed")
            .await
            .pop()
    })
    .await;
    assert_eq!(
        ev["message"],
        "Failed to calculate the number of expected pods: found no controllers for pod \"lost\""
    );
    assert_eq!(ev["type"], "Warning");
    // Evicting it is refused: the budget allows nothing.
    let out = evict(&kc, "default", "lost").await;
    assert!(out.stderr.contains("TooManyRequests"), "{}", out.stderr);

    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_evicts_within_the_budget_and_stale_conditions_are_reset() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["serviceaccount-controller", "disruption-controller"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    node(&kc, "n1", "4", "8Gi", &[], "").await;
    for i in 0..3 {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("db-{i}"), "labels": {"app": "db"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "nginx"}]},
        });
        let out = k_in(&kc, &["create", "-f", "-"], Some(&pod.to_string())).await;
        assert!(out.ok, "{}", out.stderr);
        make_ready(&kc, "default", &format!("db-{i}")).await;
    }
    let pdb = r#"
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: db
spec:
  minAvailable: 2
  selector:
    matchLabels: {app: db}
"#;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(pdb)).await;
    assert!(out.ok, "{}", out.stderr);
    wait_status(&kc, "default", "db", [3, 3, 2, 1]).await;

    // drain evicts one pod, then is refused by the budget until it gives up.
    let out = k(
        &kc,
        &["drain", "n1", "--force", "--grace-period=0", "--timeout=8s"],
    )
    .await;
    assert!(!out.ok, "drain should time out: {}", out.stdout);
    assert!(
        out.stderr
            .contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{}",
        out.stderr
    );
    assert!(out.stdout.contains("evicted"), "{}", out.stdout);
    assert!(out.stdout.contains("node/n1 cordoned"), "{}", out.stdout);
    wait_pods(&kc, "default", "app=db", 2).await;
    wait_status(&kc, "default", "db", [2, 2, 2, 0]).await;

    // A DisruptionTarget condition set two minutes ago on a pod that was never deleted is
    // stale: the controller resets it to False.
    let left = pods(&kc, "default", "app=db").await;
    let name = left[0]["metadata"]["name"].as_str().unwrap().to_owned();
    let patch = json!({"status": {"conditions": [{
        "type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting", "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]}});
    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            &name,
            "--subresource=status",
            "--type=strategic",
            "-p",
            &patch.to_string(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let cond = eventually(20, "DisruptionTarget reset", || async {
        let p = get(&kc, &["pod", &name]).await?;
        let c = p["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "DisruptionTarget")?
            .clone();
        (c["status"] == "False").then_some(c)
    })
    .await;
    assert!(cond["reason"].is_null(), "{cond}");
    assert_ne!(cond["lastTransitionTime"], "2026-01-01T00:00:00Z");

    cm.shutdown().await.unwrap();
}
