//! The daemonset controller against an in-process `kumo apiserver`, driven with kubectl.
//! No scheduler or kubelet runs: the test binds pods to the node their affinity names (as
//! the scheduler would) and marks them Ready through the status subresource.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// The live (not terminating) pods matching `selector` in default.
async fn pods(kc: &Path, selector: &str) -> Vec<Value> {
    let v = get(kc, &["pods", "-l", selector]).await.unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .cloned()
        .collect()
}

/// The node a daemon pod's `metadata.name In [node]` affinity names.
fn target(p: &Value) -> String {
    let terms = &p["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    assert_eq!(terms.as_array().map(Vec::len), Some(1), "{p}");
    let f = &terms[0]["matchFields"][0];
    assert_eq!(f["key"], "metadata.name");
    assert_eq!(f["operator"], "In");
    f["values"][0].as_str().unwrap().to_owned()
}

/// The sorted target nodes of the live pods.
async fn pod_nodes(kc: &Path, selector: &str) -> Vec<String> {
    let mut v: Vec<String> = pods(kc, selector).await.iter().map(target).collect();
    v.sort();
    v
}

/// Waits until the live pods target exactly `nodes`.
async fn wait_nodes(kc: &Path, selector: &str, nodes: &[&str]) -> Vec<Value> {
    eventually(30, &format!("pods on {nodes:?}"), || async {
        let ps = pods(kc, selector).await;
        let mut got: Vec<String> = ps.iter().map(target).collect();
        got.sort();
        (got == nodes).then_some(ps)
    })
    .await
}

/// Plays scheduler and kubelet: binds unbound pods to their target node, then marks every
/// pod not yet ready Running and Ready.
async fn bind_and_ready(kc: &Path, selector: &str) {
    let now = "2026-01-01T00:00:00Z";
    // Terminating pods on a node are the kubelet's to remove.
    let all = get(kc, &["pods", "-l", selector]).await.unwrap();
    for p in all["items"].as_array().unwrap() {
        if !p["metadata"]["deletionTimestamp"].is_null() {
            let name = p["metadata"]["name"].as_str().unwrap();
            k(kc, &["delete", "pod", name, "--grace-period=0", "--force"]).await;
        }
    }
    for p in pods(kc, selector).await {
        let name = p["metadata"]["name"].as_str().unwrap().to_owned();
        if p["spec"]["nodeName"].is_null() {
            let b = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"kind": "Node", "name": target(&p)}});
            let path = format!("/api/v1/namespaces/default/pods/{name}/binding");
            let out = k_in(
                kc,
                &["create", "--raw", &path, "-f", "-"],
                Some(&b.to_string()),
            )
            .await;
            assert!(out.ok || out.stderr.contains("NotFound"), "{}", out.stderr);
        }
        let ready = p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if ready {
            continue;
        }
        let patch = json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
        ]}});
        let out = k(
            kc,
            &[
                "patch",
                "pod",
                &name,
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch.to_string(),
            ],
        )
        .await;
        assert!(out.ok || out.stderr.contains("NotFound"), "{}", out.stderr);
    }
}

/// The DaemonSet's status once it satisfies `f`.
async fn wait_status(kc: &Path, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    eventually(30, what, || async {
        get(kc, &["ds", "agent"])
            .await
            .filter(|d| f(&d["status"]))
            .map(|d| d["status"].clone())
    })
    .await
}

fn n(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// The ControllerRevisions of default, as (name, revision, hash label), by revision.
async fn revisions(kc: &Path) -> Vec<(String, i64, String)> {
    let v = get(kc, &["controllerrevisions"]).await.unwrap();
    let mut out: Vec<(String, i64, String)> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["metadata"]["name"].as_str().unwrap().to_owned(),
                n(&r["revision"]),
                r["metadata"]["labels"]["controller-revision-hash"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    out.sort_by_key(|r| r.1);
    out
}

fn hash_of(p: &Value) -> String {
    p["metadata"]["labels"]["controller-revision-hash"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Runs `kubectl rollout status ds/agent` while playing scheduler and kubelet, checking
/// that no more than one node ever lacks an available pod beyond `max_missing`.
async fn roll_out(kc: &Path, nodes: usize, max_missing: usize) {
    let kc2 = kc.to_owned();
    let status =
        tokio::spawn(
            async move { k(&kc2, &["rollout", "status", "ds/agent", "--timeout=60s"]).await },
        );
    while !status.is_finished() {
        let live = pods(kc, "app=agent").await.len();
        assert!(live + max_missing >= nodes, "{live} pods for {nodes} nodes");
        bind_and_ready(kc, "app=agent").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = status.await.unwrap();
    assert!(out.ok, "rollout status: {} {}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("daemon set \"agent\" successfully rolled out"),
        "{}",
        out.stdout
    );
}

const DS: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
  namespace: default
spec:
  selector:
    matchLabels:
      app: agent
  template:
    metadata:
      labels:
        app: agent
    spec:
      terminationGracePeriodSeconds: 0
      nodeSelector:
        role: worker
      tolerations:
      - key: node.kubernetes.io/not-ready
        operator: Exists
        effect: NoExecute
        tolerationSeconds: 30
      containers:
      - name: c
        image: busybox:1
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemonset_places_updates_and_rolls_back() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["daemonset-controller", "serviceaccount-controller"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    node(&kc, "n1", "4", "8Gi", &[("role", "worker")], "").await;
    node(&kc, "n2", "4", "8Gi", &[("role", "worker")], "").await;
    // Tainted: the pod does not tolerate dedicated=db:NoSchedule.
    node(
        &kc,
        "n3",
        "4",
        "8Gi",
        &[("role", "worker")],
        r#"[{"key":"dedicated","value":"db","effect":"NoSchedule"}]"#,
    )
    .await;
    // Not selected by the nodeSelector.
    node(&kc, "n4", "4", "8Gi", &[("role", "edge")], "").await;

    let out = k_in(&kc, &["apply", "-f", "-"], Some(DS)).await;
    assert!(out.ok, "{}", out.stderr);
    let ds = get(&kc, &["ds", "agent"]).await.unwrap();
    let uid = ds["metadata"]["uid"].as_str().unwrap().to_owned();

    // One pod on each eligible node, with the node affinity, tolerations and labels.
    let ps = wait_nodes(&kc, "app=agent", &["n1", "n2"]).await;
    let revs = revisions(&kc).await;
    assert_eq!(revs.len(), 1, "{revs:?}");
    let (rev1_name, rev1, hash1) = revs[0].clone();
    assert_eq!(rev1, 1);
    assert_eq!(rev1_name, format!("agent-{hash1}"));
    for p in &ps {
        let name = p["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("agent-"), "{name}");
        assert_eq!(p["metadata"]["generateName"], "agent-");
        let r = &p["metadata"]["ownerReferences"][0];
        assert_eq!(r["kind"], "DaemonSet");
        assert_eq!(r["uid"], uid.as_str());
        assert_eq!(r["controller"], true);
        assert_eq!(r["blockOwnerDeletion"], true);
        assert_eq!(
            p["metadata"]["labels"]["controller-revision-hash"],
            hash1.as_str()
        );
        assert_eq!(p["metadata"]["labels"]["pod-template-generation"], "1");
        assert!(p["spec"]["nodeName"].is_null());
        let tol: Vec<(String, String, Option<i64>)> = p["spec"]["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                assert_eq!(t["operator"], "Exists");
                (
                    t["key"].as_str().unwrap().to_owned(),
                    t["effect"].as_str().unwrap().to_owned(),
                    t["tolerationSeconds"].as_i64(),
                )
            })
            .collect();
        let want = [
            ("node.kubernetes.io/not-ready", "NoExecute"),
            ("node.kubernetes.io/unreachable", "NoExecute"),
            ("node.kubernetes.io/disk-pressure", "NoSchedule"),
            ("node.kubernetes.io/memory-pressure", "NoSchedule"),
            ("node.kubernetes.io/pid-pressure", "NoSchedule"),
            ("node.kubernetes.io/unschedulable", "NoSchedule"),
        ];
        // The template's not-ready toleration (with tolerationSeconds) is replaced.
        let got: Vec<(&str, &str)> = tol
            .iter()
            .map(|(k, e, _)| (k.as_str(), e.as_str()))
            .collect();
        assert_eq!(got, want, "{tol:?}");
        assert!(tol.iter().all(|t| t.2.is_none()), "{tol:?}");
    }
    let created = events(&kc, "default", "agent", "SuccessfulCreate").await;
    assert_eq!(created.len(), 2, "{created:?}");
    assert!(
        created.iter().all(|m| m.starts_with("Created pod: agent-")),
        "{created:?}"
    );

    // Status before any pod is ready; zero counters are left out (omitempty).
    let st = wait_status(&kc, "2 scheduled", |s| {
        s["currentNumberScheduled"] == 2 && s["observedGeneration"] == 1
    })
    .await;
    assert_eq!(st["desiredNumberScheduled"], 2, "{st}");
    assert_eq!(st["numberMisscheduled"], 0, "{st}");
    assert_eq!(st["numberReady"], 0, "{st}");
    assert_eq!(st["updatedNumberScheduled"], 2, "{st}");
    assert!(st["numberAvailable"].is_null(), "{st}");
    assert_eq!(st["numberUnavailable"], 2, "{st}");

    bind_and_ready(&kc, "app=agent").await;
    let st = wait_status(&kc, "2 ready", |s| s["numberReady"] == 2).await;
    assert_eq!(st["numberAvailable"], 2, "{st}");
    assert!(st["numberUnavailable"].is_null(), "{st}");

    // A new eligible node gets a pod.
    node(&kc, "n5", "4", "8Gi", &[("role", "worker")], "").await;
    wait_nodes(&kc, "app=agent", &["n1", "n2", "n5"]).await;
    bind_and_ready(&kc, "app=agent").await;
    wait_status(&kc, "3 available", |s| {
        s["desiredNumberScheduled"] == 3 && s["numberAvailable"] == 3
    })
    .await;

    // A node that stops matching the nodeSelector loses its pod.
    let on_n2 = pods(&kc, "app=agent")
        .await
        .into_iter()
        .find(|p| target(p) == "n2")
        .unwrap();
    let n2_pod = on_n2["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(k(&kc, &["label", "node", "n2", "role-"]).await.ok);
    wait_nodes(&kc, "app=agent", &["n1", "n5"]).await;
    let deleted = events(&kc, "default", "agent", "SuccessfulDelete").await;
    assert_eq!(deleted, vec![format!("Deleted pod: {n2_pod}")]);
    wait_status(&kc, "2 desired", |s| {
        s["desiredNumberScheduled"] == 2 && s["numberMisscheduled"] == 0
    })
    .await;

    // A failed daemon pod is deleted and replaced.
    let on_n1 = pods(&kc, "app=agent")
        .await
        .into_iter()
        .find(|p| target(p) == "n1")
        .unwrap();
    let failed = on_n1["metadata"]["name"].as_str().unwrap().to_owned();
    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            &failed,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Failed","conditions":[{"type":"Ready","status":"False"}]}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(30, "failed pod replaced", || async {
        let ps = pods(&kc, "app=agent").await;
        let replaced = ps
            .iter()
            .any(|p| target(p) == "n1" && p["metadata"]["name"] != failed.as_str());
        let gone = get(&kc, &["pod", &failed]).await.is_none();
        (replaced && gone).then_some(())
    })
    .await;
    let ev = events(&kc, "default", "agent", "FailedDaemonPod").await;
    assert_eq!(
        ev,
        vec![format!(
            "Found failed daemon pod default/{failed} on node n1, will try to kill it"
        )]
    );
    bind_and_ready(&kc, "app=agent").await;
    wait_status(&kc, "2 available", |s| s["numberAvailable"] == 2).await;

    // Rolling update (maxUnavailable 1): one node at a time, a new revision.
    assert!(
        k(&kc, &["set", "image", "ds/agent", "c=busybox:2"])
            .await
            .ok
    );
    let hash2 = eventually(30, "revision 2", || async {
        let r = revisions(&kc).await;
        (r.len() == 2 && r[1].1 == 2).then(|| r[1].2.clone())
    })
    .await;
    assert_ne!(hash1, hash2);
    // Without ready new pods the rollout stops after one node.
    let ps = eventually(30, "one node updated", || async {
        let ps = pods(&kc, "app=agent").await;
        (ps.iter().filter(|p| hash_of(p) == hash2).count() == 1).then_some(ps)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ps2 = pods(&kc, "app=agent").await;
    assert_eq!(
        ps2.iter().filter(|p| hash_of(p) == hash2).count(),
        1,
        "{ps:?}"
    );
    assert_eq!(
        ps2.iter().filter(|p| hash_of(p) == hash1).count(),
        1,
        "{ps2:?}"
    );
    let st = get(&kc, &["ds", "agent"]).await.unwrap()["status"].clone();
    assert_eq!(st["updatedNumberScheduled"], 1, "{st}");
    assert_eq!(st["observedGeneration"], 2, "{st}");
    roll_out(&kc, 2, 1).await;
    let ps = pods(&kc, "app=agent").await;
    assert_eq!(ps.len(), 2);
    for p in &ps {
        assert_eq!(hash_of(p), hash2);
        assert_eq!(p["metadata"]["labels"]["pod-template-generation"], "2");
        assert_eq!(p["spec"]["containers"][0]["image"], "busybox:2");
    }
    let st = get(&kc, &["ds", "agent"]).await.unwrap()["status"].clone();
    assert_eq!(st["updatedNumberScheduled"], 2, "{st}");
    assert_eq!(st["numberAvailable"], 2, "{st}");

    // History and undo go through the ControllerRevisions.
    let out = k(&kc, &["rollout", "history", "ds/agent"]).await;
    assert!(out.ok, "{}", out.stderr);
    let rows: Vec<&str> = out
        .stdout
        .lines()
        .skip(2)
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(rows.len(), 2, "{}", out.stdout);
    assert!(
        rows[0].starts_with('1') && rows[1].starts_with('2'),
        "{}",
        out.stdout
    );
    let out = k(&kc, &["rollout", "history", "ds/agent", "--revision=1"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("busybox:1"), "{}", out.stdout);
    let out = k(&kc, &["rollout", "undo", "ds/agent"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.contains("daemonset.apps/agent rolled back"),
        "{}",
        out.stdout
    );
    let ds = get(&kc, &["ds", "agent"]).await.unwrap();
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["image"],
        "busybox:1"
    );
    // The old revision is current again, renumbered 3; its pods carry its hash.
    eventually(30, "revision 1 renumbered", || async {
        let r = revisions(&kc).await;
        (r.len() == 2 && r[1] == (rev1_name.clone(), 3, hash1.clone())).then_some(())
    })
    .await;
    roll_out(&kc, 2, 1).await;
    let ps = pods(&kc, "app=agent").await;
    assert!(ps.iter().all(|p| hash_of(p) == hash1), "{ps:?}");
    assert!(ps
        .iter()
        .all(|p| p["spec"]["containers"][0]["image"] == "busybox:1"));
    // Undoing to the current revision changes nothing (kubectl 1.32 hashes its template
    // with `creationTimestamp: null`, so it may patch the same template rather than skip).
    let generation = get(&kc, &["ds", "agent"]).await.unwrap()["metadata"]["generation"].clone();
    let out = k(&kc, &["rollout", "undo", "ds/agent", "--to-revision=3"]).await;
    assert!(out.ok, "{}", out.stderr);
    let ds = get(&kc, &["ds", "agent"]).await.unwrap();
    assert_eq!(ds["metadata"]["generation"], generation, "{}", out.stdout);
    assert_eq!(revisions(&kc).await.len(), 2);

    // A NoExecute taint evicts the pod from the node; a NoSchedule one would not.
    let out = k(&kc, &["taint", "node", "n5", "maint=now:NoSchedule"]).await;
    assert!(out.ok, "{}", out.stderr);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(pod_nodes(&kc, "app=agent").await, ["n1", "n5"]);
    // Upstream queues no sync for that (the pod may stay); a sync for another reason
    // counts it as misscheduled.
    let out = k(&kc, &["annotate", "ds", "agent", "poke=1"]).await;
    assert!(out.ok, "{}", out.stderr);
    let st = wait_status(&kc, "n5 no longer desired", |s| {
        s["desiredNumberScheduled"] == 1
    })
    .await;
    assert_eq!(st["currentNumberScheduled"], 1, "{st}");
    assert_eq!(st["numberMisscheduled"], 1, "{st}");
    assert_eq!(pod_nodes(&kc, "app=agent").await, ["n1", "n5"]);
    let out = k(&kc, &["taint", "node", "n5", "maint=now:NoExecute"]).await;
    assert!(out.ok, "{}", out.stderr);
    wait_nodes(&kc, "app=agent", &["n1"]).await;
    wait_status(&kc, "nothing misscheduled", |s| {
        s["numberMisscheduled"] == 0
    })
    .await;
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemonset_surges_and_honours_on_delete() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["daemonset-controller", "serviceaccount-controller"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    node(&kc, "a", "4", "8Gi", &[("role", "worker")], "").await;
    node(&kc, "b", "4", "8Gi", &[("role", "worker")], "").await;
    let surge = DS.replace(
        "  template:\n",
        "  updateStrategy:\n    type: RollingUpdate\n    rollingUpdate:\n      maxSurge: 1\n      maxUnavailable: 0\n  template:\n",
    );
    let out = k_in(&kc, &["apply", "-f", "-"], Some(&surge)).await;
    assert!(out.ok, "{}", out.stderr);
    wait_nodes(&kc, "app=agent", &["a", "b"]).await;
    bind_and_ready(&kc, "app=agent").await;
    wait_status(&kc, "2 available", |s| s["numberAvailable"] == 2).await;
    let old: Vec<String> = pods(&kc, "app=agent")
        .await
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();

    // Surge: a new pod starts next to an old one before the old one goes.
    assert!(
        k(&kc, &["set", "image", "ds/agent", "c=busybox:2"])
            .await
            .ok
    );
    // With no new pod available yet, exactly one node runs an old and a new pod.
    let ps = eventually(30, "one surge pod", || async {
        let ps = pods(&kc, "app=agent").await;
        (ps.len() == 3).then_some(ps)
    })
    .await;
    let mut nodes: Vec<String> = ps.iter().map(target).collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes, ["a", "b"], "{ps:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(pods(&kc, "app=agent").await.len(), 3);
    roll_out(&kc, 2, 0).await;
    let now: Vec<String> = pods(&kc, "app=agent")
        .await
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(now.len(), 2);
    assert!(now.iter().all(|n| !old.contains(n)), "{now:?} {old:?}");

    // OnDelete: a template change replaces nothing until a pod is deleted.
    let out = k(
        &kc,
        &[
            "patch",
            "ds",
            "agent",
            "--type=merge",
            "-p",
            r#"{"spec":{"updateStrategy":{"type":"OnDelete","rollingUpdate":null}}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        k(&kc, &["set", "image", "ds/agent", "c=busybox:3"])
            .await
            .ok
    );
    wait_status(&kc, "generation 4 observed", |s| {
        s["observedGeneration"] == 4
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ps = pods(&kc, "app=agent").await;
    assert!(ps
        .iter()
        .all(|p| p["spec"]["containers"][0]["image"] == "busybox:2"));
    let victim = ps[0]["metadata"]["name"].as_str().unwrap().to_owned();
    let node_of = target(&ps[0]);
    assert!(k(&kc, &["delete", "pod", &victim, "--wait=false"]).await.ok);
    eventually(30, "replacement with the new image", || async {
        let ps = pods(&kc, "app=agent").await;
        ps.iter()
            .any(|p| target(p) == node_of && p["spec"]["containers"][0]["image"] == "busybox:3")
            .then_some(())
    })
    .await;
    let st = wait_status(&kc, "1 updated", |s| s["updatedNumberScheduled"] == 1).await;
    assert_eq!(st["currentNumberScheduled"], 2, "{st}");
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemonset_reports_failed_create() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["daemonset-controller", "serviceaccount-controller"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    node(&kc, "a", "4", "8Gi", &[("role", "worker")], "").await;
    node(&kc, "b", "4", "8Gi", &[("role", "worker")], "").await;
    // Admission refuses pods of a ServiceAccount that does not exist.
    let bad = DS.replace(
        "      nodeSelector:",
        "      serviceAccountName: nope\n      nodeSelector:",
    );
    let out = k_in(&kc, &["apply", "-f", "-"], Some(&bad)).await;
    assert!(out.ok, "{}", out.stderr);
    let msgs = eventually(30, "FailedCreate", || async {
        let m = events(&kc, "default", "agent", "FailedCreate").await;
        (!m.is_empty()).then_some(m)
    })
    .await;
    assert!(
        msgs.iter()
            .all(|m| m.starts_with("Error creating: ") && m.contains("nope")),
        "{msgs:?}"
    );
    let st = wait_status(&kc, "2 desired", |s| s["desiredNumberScheduled"] == 2).await;
    assert_eq!(st["currentNumberScheduled"], 0, "{st}");
    assert_eq!(st["numberUnavailable"], 2, "{st}");
    assert!(pods(&kc, "app=agent").await.is_empty());
    assert!(events(&kc, "default", "agent", "SuccessfulCreate")
        .await
        .is_empty());
    cm.shutdown().await.unwrap();
}
