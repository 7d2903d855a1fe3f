//! The replicaset and deployment controllers against an in-process `kumo apiserver`,
//! driven with kubectl. No kubelet runs: tests that need availability mark pods Ready
//! through the status subresource.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

/// Marks every not-yet-ready pod matching `selector` Ready (what a kubelet would report).
async fn make_ready(kc: &Path, ns: &str, selector: &str) {
    let now = "2026-01-01T00:00:00Z";
    for p in pods(kc, ns, selector).await {
        let ready = p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if ready {
            continue;
        }
        let name = p["metadata"]["name"].as_str().unwrap();
        let patch = serde_json::json!({"status": {"phase": "Running", "conditions": [
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
        // A pod deleted meanwhile is fine.
        assert!(out.ok || out.stderr.contains("NotFound"), "{}", out.stderr);
    }
}

fn owner_uid(p: &Value) -> Option<String> {
    p["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)
        .and_then(|r| r["uid"].as_str())
        .map(str::to_owned)
}

const RS: &str = r#"
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: front
  namespace: default
spec:
  replicas: 3
  selector:
    matchLabels:
      app: front
  template:
    metadata:
      labels:
        app: front
        tier: web
    spec:
      containers:
      - name: c
        image: nginx
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicaset_creates_scales_adopts_and_releases() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    // An orphan that matches the selector exists before the ReplicaSet: it is adopted.
    let orphan = r#"
apiVersion: v1
kind: Pod
metadata:
  name: stray
  labels: {app: front}
spec:
  containers:
  - name: c
    image: nginx
"#;
    // Pods need the default ServiceAccount, which the controller-manager makes; the
    // orphan is made with the replicaset controller switched off.
    let cm = start_cm(&kc, &["*", "-replicaset-controller"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(orphan)).await;
    assert!(out.ok, "{}", out.stderr);
    cm.shutdown().await.unwrap();
    let cm = start_cm(&kc, &["*"]).await;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(RS)).await;
    assert!(out.ok, "{}", out.stderr);
    let rs = get(&kc, &["rs", "front"]).await.unwrap();
    let uid = rs["metadata"]["uid"].as_str().unwrap().to_owned();

    let ps = wait_pods(&kc, "default", "app=front", 3).await;
    let mut created = 0;
    for p in &ps {
        assert_eq!(owner_uid(p).as_deref(), Some(uid.as_str()), "{p}");
        let r = &p["metadata"]["ownerReferences"][0];
        assert_eq!(r["kind"], "ReplicaSet");
        assert_eq!(r["blockOwnerDeletion"], true);
        let name = p["metadata"]["name"].as_str().unwrap();
        if name != "stray" {
            created += 1;
            assert!(name.starts_with("front-"), "{name}");
            assert_eq!(p["metadata"]["generateName"], "front-");
            assert_eq!(p["metadata"]["labels"]["tier"], "web");
        }
    }
    // The orphan was adopted, so only two were created.
    assert_eq!(created, 2);
    assert!(ps.iter().any(|p| p["metadata"]["name"] == "stray"));
    let created_events = events(&kc, "default", "front", "SuccessfulCreate").await;
    assert_eq!(created_events.len(), 2, "{created_events:?}");
    assert!(created_events
        .iter()
        .all(|m| m.starts_with("Created pod: front-")));

    // Status: replicas counted, none ready (no kubelet); then ready ones are counted.
    let st = eventually(20, "status replicas 3", || async {
        get(&kc, &["rs", "front"])
            .await
            .filter(|r| r["status"]["replicas"] == 3 && r["status"]["observedGeneration"] == 1)
    })
    .await;
    // The orphan lacks tier=web: not fully labeled.
    assert_eq!(st["status"]["fullyLabeledReplicas"], 2);
    // Zero counters are left out, as upstream's omitempty fields; terminatingReplicas is not.
    assert!(st["status"]["readyReplicas"].is_null(), "{st}");
    assert_eq!(st["status"]["terminatingReplicas"], 0);
    make_ready(&kc, "default", "app=front").await;
    eventually(20, "3 ready and available", || async {
        get(&kc, &["rs", "front"])
            .await
            .filter(|r| r["status"]["readyReplicas"] == 3 && r["status"]["availableReplicas"] == 3)
    })
    .await;

    // Scale up to 5, then down to 1: the not-ready new pods go first.
    assert!(k(&kc, &["scale", "rs", "front", "--replicas=5"]).await.ok);
    wait_pods(&kc, "default", "app=front", 5).await;
    let ready_before: Vec<String> = pods(&kc, "default", "app=front")
        .await
        .iter()
        .filter(|p| p["status"]["phase"] == "Running")
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ready_before.len(), 3);
    assert!(k(&kc, &["scale", "rs", "front", "--replicas=3"]).await.ok);
    let left = wait_pods(&kc, "default", "app=front", 3).await;
    for p in &left {
        let n = p["metadata"]["name"].as_str().unwrap().to_owned();
        assert!(
            ready_before.contains(&n),
            "a ready pod was deleted before a pending one: {n}"
        );
    }
    assert!(k(&kc, &["scale", "rs", "front", "--replicas=1"]).await.ok);
    wait_pods(&kc, "default", "app=front", 1).await;
    let deleted = events(&kc, "default", "front", "SuccessfulDelete").await;
    assert_eq!(deleted.len(), 4, "{deleted:?}");
    assert!(deleted.iter().all(|m| m.starts_with("Deleted pod: ")));
    eventually(20, "status replicas 1", || async {
        get(&kc, &["rs", "front"])
            .await
            .filter(|r| r["status"]["replicas"] == 1 && r["status"]["observedGeneration"] == 4)
    })
    .await;

    // Release: relabelling the pod takes it out of the set, which makes a new one.
    let p = pods(&kc, "default", "app=front").await.remove(0);
    let name = p["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(
        k(
            &kc,
            &["label", "pod", &name, "app=elsewhere", "--overwrite"]
        )
        .await
        .ok
    );
    let released = eventually(20, "pod released", || async {
        get(&kc, &["pod", &name])
            .await
            .filter(|p| owner_uid(p).is_none())
    })
    .await;
    assert!(
        released["metadata"]["ownerReferences"].is_null(),
        "{released}"
    );
    let now = wait_pods(&kc, "default", "app=front", 1).await;
    assert_ne!(now[0]["metadata"]["name"], name.as_str());
    // Labelled back, it is adopted again and the surplus one is deleted.
    assert!(
        k(&kc, &["label", "pod", &name, "app=front", "--overwrite"])
            .await
            .ok
    );
    eventually(20, "one pod after re-adoption", || async {
        let ps = pods(&kc, "default", "app=front").await;
        (ps.len() == 1 && owner_uid(&ps[0]).as_deref() == Some(uid.as_str())).then_some(())
    })
    .await;
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicaset_reports_failed_create() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    // The template names a ServiceAccount that does not exist: admission refuses the pods.
    let bad = RS.replace(
        "      containers:",
        "      serviceAccountName: robot\n      containers:",
    );
    let out = k_in(&kc, &["apply", "-f", "-"], Some(&bad)).await;
    assert!(out.ok, "{}", out.stderr);
    let rs = eventually(30, "ReplicaFailure condition", || async {
        get(&kc, &["rs", "front"]).await.filter(|r| {
            r["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "ReplicaFailure"))
        })
    })
    .await;
    let cond = &rs["status"]["conditions"][0];
    assert_eq!(cond["reason"], "FailedCreate");
    assert_eq!(cond["status"], "True");
    let failed = events(&kc, "default", "front", "FailedCreate").await;
    assert!(!failed.is_empty());
    assert!(failed[0].starts_with("Error creating: "), "{failed:?}");
    assert!(
        failed[0].contains("error looking up service account default/robot"),
        "{failed:?}"
    );
    assert!(cond["message"]
        .as_str()
        .unwrap()
        .contains("error looking up service account default/robot"));
    // Once the ServiceAccount exists the pods are made and the condition goes.
    assert!(k(&kc, &["create", "serviceaccount", "robot"]).await.ok);
    eventually(60, "condition cleared", || async {
        get(&kc, &["rs", "front"])
            .await
            .filter(|r| r["status"]["conditions"].is_null() && r["status"]["replicas"] == 3)
    })
    .await;
    cm.shutdown().await.unwrap();
}

/// The ReplicaSets in `ns` owned by the Deployment `name`, oldest revision first.
async fn replica_sets(kc: &Path, ns: &str, name: &str) -> Vec<Value> {
    let v = get(kc, &["rs", "-n", ns]).await.unwrap();
    let mut out: Vec<Value> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|rs| {
            rs["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|o| {
                    o.iter()
                        .any(|r| r["kind"] == "Deployment" && r["name"] == name)
                })
        })
        .cloned()
        .collect();
    out.sort_by_key(revision);
    out
}

fn revision(rs: &Value) -> i64 {
    rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn condition<'a>(d: &'a Value, t: &str) -> &'a Value {
    d["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == t))
        .unwrap_or(&Value::Null)
}

/// Runs `kubectl rollout status` while playing kubelet (marking new pods Ready), checking
/// that the ReplicaSets never add up to more than `max_total` replicas.
async fn roll_out(kc: &Path, ns: &str, name: &str, selector: &str, max_total: i64) {
    let kc2 = kc.to_owned();
    let target = format!("deployment/{name}");
    let ns2 = ns.to_owned();
    let status = tokio::spawn(async move {
        k(
            &kc2,
            &["rollout", "status", &target, "-n", &ns2, "--timeout=60s"],
        )
        .await
    });
    while !status.is_finished() {
        let total: i64 = replica_sets(kc, ns, name)
            .await
            .iter()
            .map(|rs| rs["spec"]["replicas"].as_i64().unwrap_or(0))
            .sum();
        assert!(total <= max_total, "surge exceeded: {total} > {max_total}");
        make_ready(kc, ns, selector).await;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let out = status.await.unwrap();
    assert!(out.ok, "rollout status: {} {}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("successfully rolled out"),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deployment_rolls_out_scales_and_undoes() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    let out = k(
        &kc,
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=3",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);

    // One ReplicaSet web-<hash>, labelled with the hash, owning three pods.
    let rs = eventually(30, "one ReplicaSet", || async {
        let r = replica_sets(&kc, "default", "web").await;
        (r.len() == 1).then(|| r[0].clone())
    })
    .await;
    let hash = rs["metadata"]["labels"]["pod-template-hash"]
        .as_str()
        .unwrap()
        .to_owned();
    let rs1 = format!("web-{hash}");
    assert_eq!(rs["metadata"]["name"], rs1.as_str());
    assert_eq!(
        rs["spec"]["selector"]["matchLabels"]["pod-template-hash"],
        hash.as_str()
    );
    assert_eq!(
        rs["spec"]["template"]["metadata"]["labels"]["pod-template-hash"],
        hash.as_str()
    );
    let ann = &rs["metadata"]["annotations"];
    assert_eq!(ann["deployment.kubernetes.io/revision"], "1");
    assert_eq!(ann["deployment.kubernetes.io/desired-replicas"], "3");
    assert_eq!(ann["deployment.kubernetes.io/max-replicas"], "4");
    let rs_uid = rs["metadata"]["uid"].as_str().unwrap().to_owned();
    let ps = wait_pods(&kc, "default", "app=web", 3).await;
    for p in &ps {
        assert_eq!(owner_uid(p).as_deref(), Some(rs_uid.as_str()));
        assert_eq!(p["metadata"]["labels"]["pod-template-hash"], hash.as_str());
    }
    let scaled = events(&kc, "default", "web", "ScalingReplicaSet").await;
    assert_eq!(
        scaled,
        vec![format!("Scaled up replica set {rs1} from 0 to 3")]
    );

    // Not available without ready pods; rollout status completes once they are.
    let d = eventually(20, "unavailable status", || async {
        get(&kc, &["deployment", "web"])
            .await
            .filter(|d| d["status"]["replicas"] == 3 && d["status"]["unavailableReplicas"] == 3)
    })
    .await;
    assert!(d["status"]["availableReplicas"].is_null(), "{d}");
    assert_eq!(condition(&d, "Available")["status"], "False");
    assert_eq!(
        condition(&d, "Available")["reason"],
        "MinimumReplicasUnavailable"
    );
    assert_eq!(
        condition(&d, "Available")["message"],
        "Deployment does not have minimum availability."
    );
    assert_eq!(
        d["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "1"
    );
    roll_out(&kc, "default", "web", "app=web", 4).await;
    let d = eventually(20, "available status", || async {
        get(&kc, &["deployment", "web"]).await.filter(|d| {
            d["status"]["availableReplicas"] == 3
                && condition(d, "Progressing")["reason"] == "NewReplicaSetAvailable"
        })
    })
    .await;
    assert_eq!(
        condition(&d, "Available")["reason"],
        "MinimumReplicasAvailable"
    );
    assert_eq!(
        condition(&d, "Available")["message"],
        "Deployment has minimum availability."
    );
    assert_eq!(
        condition(&d, "Progressing")["message"],
        format!("ReplicaSet \"{rs1}\" has successfully progressed.").as_str()
    );
    assert_eq!(d["status"]["updatedReplicas"], 3);
    assert_eq!(d["status"]["readyReplicas"], 3);
    assert_eq!(
        d["status"]["observedGeneration"],
        d["metadata"]["generation"]
    );
    // The revision annotation is written without a new generation (as upstream does it,
    // through the status subresource).
    assert_eq!(d["metadata"]["generation"], 1);

    // Scaling goes to the one ReplicaSet.
    assert!(
        k(&kc, &["scale", "deployment", "web", "--replicas=5"])
            .await
            .ok
    );
    wait_pods(&kc, "default", "app=web", 5).await;
    assert!(
        k(&kc, &["scale", "deployment", "web", "--replicas=1"])
            .await
            .ok
    );
    wait_pods(&kc, "default", "app=web", 1).await;
    let scaled = events(&kc, "default", "web", "ScalingReplicaSet").await;
    assert!(
        scaled.contains(&format!("Scaled up replica set {rs1} from 3 to 5")),
        "{scaled:?}"
    );
    assert!(
        scaled.contains(&format!("Scaled down replica set {rs1} from 5 to 1")),
        "{scaled:?}"
    );
    assert!(
        k(&kc, &["scale", "deployment", "web", "--replicas=3"])
            .await
            .ok
    );
    roll_out(&kc, "default", "web", "app=web", 4).await;

    // A new image: a second ReplicaSet (revision 2), surge bounded by maxSurge (25 % of 3,
    // rounded up: 1), the old one scaled down.
    let out = k(&kc, &["set", "image", "deployment/web", "nginx=nginx:1.27"]).await;
    assert!(out.ok, "{}", out.stderr);
    roll_out(&kc, "default", "web", "app=web", 4).await;
    let sets = replica_sets(&kc, "default", "web").await;
    assert_eq!(sets.len(), 2);
    let rs2 = sets[1]["metadata"]["name"].as_str().unwrap().to_owned();
    assert_ne!(rs2, rs1);
    assert_eq!(revision(&sets[1]), 2);
    assert_eq!(sets[0]["spec"]["replicas"], 0);
    assert_eq!(sets[1]["spec"]["replicas"], 3);
    let scaled = events(&kc, "default", "web", "ScalingReplicaSet").await;
    assert!(
        scaled.contains(&format!("Scaled up replica set {rs2} from 0 to 1")),
        "{scaled:?}"
    );
    assert!(
        scaled.contains(&format!("Scaled down replica set {rs1} from 3 to 2")),
        "{scaled:?}"
    );
    let ps = wait_pods(&kc, "default", "app=web", 3).await;
    assert!(ps
        .iter()
        .all(|p| p["spec"]["containers"][0]["image"] == "nginx:1.27"));

    // Undo: the first ReplicaSet is the new one again, as revision 3.
    let out = k(&kc, &["rollout", "undo", "deployment/web"]).await;
    assert!(out.ok, "{}", out.stderr);
    roll_out(&kc, "default", "web", "app=web", 4).await;
    let sets = replica_sets(&kc, "default", "web").await;
    assert_eq!(sets.len(), 2);
    assert_eq!(sets[1]["metadata"]["name"], rs1.as_str());
    assert_eq!(revision(&sets[1]), 3);
    assert_eq!(
        sets[1]["metadata"]["annotations"]["deployment.kubernetes.io/revision-history"],
        "1"
    );
    assert_eq!(sets[1]["spec"]["replicas"], 3);
    assert_eq!(sets[0]["spec"]["replicas"], 0);
    let d = get(&kc, &["deployment", "web"]).await.unwrap();
    assert_eq!(
        d["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "3"
    );
    let ps = wait_pods(&kc, "default", "app=web", 3).await;
    assert!(ps
        .iter()
        .all(|p| p["spec"]["containers"][0]["image"] == "nginx"));
    let hist = k(&kc, &["rollout", "history", "deployment/web"]).await;
    assert!(hist.ok, "{}", hist.stderr);

    // revisionHistoryLimit 0: the unused old ReplicaSet goes.
    let out = k(
        &kc,
        &[
            "patch",
            "deployment",
            "web",
            "-p",
            r#"{"spec":{"revisionHistoryLimit":0}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(30, "old ReplicaSet cleaned up", || async {
        let r = replica_sets(&kc, "default", "web").await;
        (r.len() == 1 && r[0]["metadata"]["name"] == rs1.as_str()).then_some(())
    })
    .await;
    cm.shutdown().await.unwrap();
}

const RECREATE: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: db
  namespace: default
spec:
  replicas: 2
  strategy:
    type: Recreate
  selector:
    matchLabels:
      app: db
  template:
    metadata:
      labels:
        app: db
    spec:
      containers:
      - name: db
        image: postgres:16
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deployment_recreate_pause_and_deadline() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(RECREATE)).await;
    assert!(out.ok, "{}", out.stderr);
    roll_out(&kc, "default", "db", "app=db", 2).await;
    let old = replica_sets(&kc, "default", "db").await[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    // No surge with Recreate: the old ReplicaSet goes to zero before the new one grows.
    let out = k(&kc, &["set", "image", "deployment/db", "db=postgres:17"]).await;
    assert!(out.ok, "{}", out.stderr);
    roll_out(&kc, "default", "db", "app=db", 2).await;
    let sets = replica_sets(&kc, "default", "db").await;
    assert_eq!(sets.len(), 2);
    let new = sets[1]["metadata"]["name"].as_str().unwrap().to_owned();
    let scaled = events(&kc, "default", "db", "ScalingReplicaSet").await;
    let down = scaled
        .iter()
        .position(|m| *m == format!("Scaled down replica set {old} from 2 to 0"))
        .unwrap_or_else(|| panic!("{scaled:?}"));
    let up = scaled
        .iter()
        .position(|m| *m == format!("Scaled up replica set {new} from 0 to 2"))
        .unwrap_or_else(|| panic!("{scaled:?}"));
    assert!(down < up, "{scaled:?}");
    let ps = wait_pods(&kc, "default", "app=db", 2).await;
    assert!(ps
        .iter()
        .all(|p| p["spec"]["containers"][0]["image"] == "postgres:17"));

    // Paused: a template change makes no ReplicaSet until resumed.
    assert!(k(&kc, &["rollout", "pause", "deployment/db"]).await.ok);
    let d = eventually(20, "paused condition", || async {
        get(&kc, &["deployment", "db"])
            .await
            .filter(|d| condition(d, "Progressing")["reason"] == "DeploymentPaused")
    })
    .await;
    assert_eq!(condition(&d, "Progressing")["status"], "Unknown");
    assert_eq!(
        condition(&d, "Progressing")["message"],
        "Deployment is paused"
    );
    assert!(
        k(&kc, &["set", "image", "deployment/db", "db=postgres:18"])
            .await
            .ok
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(replica_sets(&kc, "default", "db").await.len(), 2);
    assert!(k(&kc, &["rollout", "resume", "deployment/db"]).await.ok);
    roll_out(&kc, "default", "db", "app=db", 2).await;
    assert_eq!(replica_sets(&kc, "default", "db").await.len(), 3);

    // A rollout that cannot progress (no pod gets ready) times out.
    let out = k(
        &kc,
        &[
            "patch",
            "deployment",
            "db",
            "-p",
            r#"{"spec":{"progressDeadlineSeconds":2}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        k(&kc, &["set", "image", "deployment/db", "db=postgres:19"])
            .await
            .ok
    );
    let d = eventually(30, "ProgressDeadlineExceeded", || async {
        get(&kc, &["deployment", "db"])
            .await
            .filter(|d| condition(d, "Progressing")["reason"] == "ProgressDeadlineExceeded")
    })
    .await;
    let newest = replica_sets(&kc, "default", "db").await;
    let newest = newest.last().unwrap()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(condition(&d, "Progressing")["status"], "False");
    assert_eq!(
        condition(&d, "Progressing")["message"],
        format!("ReplicaSet \"{newest}\" has timed out progressing.").as_str()
    );
    let out = k(
        &kc,
        &["rollout", "status", "deployment/db", "--timeout=10s"],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("exceeded its progress deadline"),
        "{}",
        out.stderr
    );
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replication_controller_keeps_its_pods() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    let rc = r#"
apiVersion: v1
kind: ReplicationController
metadata:
  name: legacy
spec:
  replicas: 2
  selector: {app: legacy}
  template:
    metadata:
      labels: {app: legacy}
    spec:
      containers:
      - name: c
        image: nginx
"#;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(rc)).await;
    assert!(out.ok, "{}", out.stderr);
    let ps = wait_pods(&kc, "default", "app=legacy", 2).await;
    for p in &ps {
        assert_eq!(p["metadata"]["generateName"], "legacy-");
        assert_eq!(
            p["metadata"]["ownerReferences"][0]["kind"],
            "ReplicationController"
        );
    }
    make_ready(&kc, "default", "app=legacy").await;
    eventually(20, "rc status", || async {
        get(&kc, &["rc", "legacy"]).await.filter(|r| {
            r["status"]["replicas"] == 2
                && r["status"]["readyReplicas"] == 2
                && r["status"]["availableReplicas"] == 2
        })
    })
    .await;
    let v = get(&kc, &["events"]).await.unwrap();
    let sources: Vec<&Value> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "SuccessfulCreate" && e["involvedObject"]["name"] == "legacy")
        .map(|e| &e["source"]["component"])
        .collect();
    assert_eq!(sources.len(), 2);
    assert!(sources.iter().all(|s| *s == "replication-controller"));
    assert!(k(&kc, &["scale", "rc", "legacy", "--replicas=0"]).await.ok);
    wait_pods(&kc, "default", "app=legacy", 0).await;
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deployment_adopts_and_releases_replica_sets() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    // An orphan ReplicaSet with the Deployment's template: adopted as its new ReplicaSet.
    let orphan = r#"
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: kept
  labels: {app: adopt}
spec:
  replicas: 1
  selector:
    matchLabels: {app: adopt}
  template:
    metadata:
      labels: {app: adopt}
    spec:
      containers:
      - name: c
        image: nginx
"#;
    assert!(k_in(&kc, &["create", "-f", "-"], Some(orphan)).await.ok);
    wait_pods(&kc, "default", "app=adopt", 1).await;
    let dep = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: adopt
spec:
  replicas: 2
  selector:
    matchLabels: {app: adopt}
  template:
    metadata:
      labels: {app: adopt}
    spec:
      containers:
      - name: c
        image: nginx
"#;
    assert!(k_in(&kc, &["create", "-f", "-"], Some(dep)).await.ok);
    let d = get(&kc, &["deployment", "adopt"]).await.unwrap();
    let duid = d["metadata"]["uid"].as_str().unwrap().to_owned();
    let rs = eventually(30, "ReplicaSet adopted and scaled", || async {
        get(&kc, &["rs", "kept"]).await.filter(|rs| {
            owner_uid(rs).as_deref() == Some(duid.as_str()) && rs["spec"]["replicas"] == 2
        })
    })
    .await;
    assert_eq!(
        rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "1"
    );
    wait_pods(&kc, "default", "app=adopt", 2).await;
    assert_eq!(replica_sets(&kc, "default", "adopt").await.len(), 1);

    // Relabelled out of the selector, it is released and a new ReplicaSet takes over.
    let out = k(&kc, &["label", "rs", "kept", "app=gone", "--overwrite"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(30, "released", || async {
        get(&kc, &["rs", "kept"])
            .await
            .filter(|rs| rs["metadata"]["ownerReferences"].is_null())
    })
    .await;
    let sets = eventually(30, "a new ReplicaSet", || async {
        let r = replica_sets(&kc, "default", "adopt").await;
        (r.len() == 1 && r[0]["metadata"]["name"] != "kept").then_some(r)
    })
    .await;
    assert!(sets[0]["metadata"]["labels"]["pod-template-hash"].is_string());
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicaset_counts_available_after_min_ready_seconds() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    let rs = RS
        .replace("replicas: 3", "replicas: 1\n  minReadySeconds: 3")
        .replace("name: front", "name: slow")
        .replace("app: front", "app: slow");
    let out = k_in(&kc, &["apply", "-f", "-"], Some(&rs)).await;
    assert!(out.ok, "{}", out.stderr);
    let p = wait_pods(&kc, "default", "app=slow", 1).await.remove(0);
    let name = p["metadata"]["name"].as_str().unwrap();
    // Ready from now: ready at once, available only 3 s later.
    let now = k8s_now();
    let patch = serde_json::json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": now},
    ]}});
    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch.to_string(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let st = eventually(10, "ready", || async {
        get(&kc, &["rs", "slow"])
            .await
            .filter(|r| r["status"]["readyReplicas"] == 1)
    })
    .await;
    assert!(st["status"]["availableReplicas"].is_null(), "{st}");
    let started = std::time::Instant::now();
    eventually(15, "available", || async {
        get(&kc, &["rs", "slow"])
            .await
            .filter(|r| r["status"]["availableReplicas"] == 1)
    })
    .await;
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    cm.shutdown().await.unwrap();
}

/// The current time as RFC 3339 seconds, from `date` (no time crate in the tests).
fn k8s_now() -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deployment_scales_proportionally_mid_rollout() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    let out = k(
        &kc,
        &[
            "create",
            "deployment",
            "pr",
            "--image=nginx",
            "--replicas=4",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    wait_pods(&kc, "default", "app=pr", 4).await;
    // No pod ever gets ready: with maxSurge 1 and maxUnavailable 1 (25 % of 4) the rollout
    // stops at old 3 + new 2.
    assert!(
        k(&kc, &["set", "image", "deployment/pr", "nginx=nginx:2"])
            .await
            .ok
    );
    let sizes = |r: &[Value]| -> Vec<i64> {
        r.iter()
            .map(|rs| rs["spec"]["replicas"].as_i64().unwrap_or(-1))
            .collect()
    };
    let sets = eventually(30, "old 3, new 2", || async {
        let r = replica_sets(&kc, "default", "pr").await;
        (sizes(&r) == vec![3, 2]).then_some(r)
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(sizes(&replica_sets(&kc, "default", "pr").await), vec![3, 2]);
    // Scaled to 8 mid-rollout: 8 + 2 surge spread by size (upstream's proportions).
    assert!(
        k(&kc, &["scale", "deployment", "pr", "--replicas=8"])
            .await
            .ok
    );
    eventually(30, "old 6, new 4", || async {
        let r = replica_sets(&kc, "default", "pr").await;
        (sizes(&r) == vec![6, 4]).then_some(())
    })
    .await;
    let old = sets[0]["metadata"]["name"].as_str().unwrap();
    let new = sets[1]["metadata"]["name"].as_str().unwrap();
    let scaled = events(&kc, "default", "pr", "ScalingReplicaSet").await;
    assert!(
        scaled.contains(&format!("Scaled up replica set {old} from 3 to 6")),
        "{scaled:?}"
    );
    assert!(
        scaled.contains(&format!("Scaled up replica set {new} from 2 to 4")),
        "{scaled:?}"
    );
    cm.shutdown().await.unwrap();
}
