//! The statefulset controller against an in-process `kumo apiserver`, driven with kubectl.
//! No kubelet runs: the tests play it by patching pods' status (Running, Ready, Failed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// The live (not terminating) pods in `default` matching `selector`, by name.
async fn pod_names(kc: &Path, selector: &str) -> Vec<String> {
    let v = get(kc, &["pods", "-l", selector]).await.unwrap();
    let mut names: Vec<String> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

async fn wait_names(kc: &Path, selector: &str, want: &[&str]) {
    eventually(30, &format!("pods {want:?}"), || async {
        (pod_names(kc, selector).await == want).then_some(())
    })
    .await
}

/// Sets a pod's status as a kubelet would.
async fn set_status(kc: &Path, pod: &str, status: Value) {
    let patch = json!({ "status": status });
    let out = k(
        kc,
        &[
            "patch",
            "pod",
            pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch.to_string(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

async fn make_ready(kc: &Path, pod: &str) {
    set_status(
        kc,
        pod,
        json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]}),
    )
    .await;
}

/// The messages of the events about `name` with `reason`, oldest first.
async fn events(kc: &Path, name: &str, reason: &str) -> Vec<String> {
    let v = get(kc, &["events"]).await.unwrap();
    let mut evs: Vec<(u128, String)> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["name"] == name && e["reason"] == reason)
        .map(|e| {
            // The recorder names events `<object>.<creation nanoseconds in hex>`.
            let n = e["metadata"]["name"].as_str().unwrap();
            let t = n.rsplit('.').next().unwrap();
            (
                u128::from_str_radix(t, 16).unwrap_or(0),
                e["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    evs.sort();
    evs.into_iter().map(|(_, m)| m).collect()
}

/// Asserts that `name` does not appear for a while.
async fn stays_absent(kc: &Path, kind: &str, name: &str) {
    for _ in 0..6 {
        assert!(
            get(kc, &[kind, name]).await.is_none(),
            "{kind}/{name} appeared too early"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: nginx
spec:
  clusterIP: None
  selector: {app: web}
  ports:
  - {port: 80, name: web}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: nginx
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: nginx
        image: nginx:1.27
        volumeMounts:
        - {name: www, mountPath: /usr/share/nginx/html}
  volumeClaimTemplates:
  - metadata:
      name: www
    spec:
      accessModes: [ReadWriteOnce]
      resources:
        requests: {storage: 1Gi}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ordered_ready_creates_in_order_with_claims_and_scales_down_in_reverse() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(WEB)).await;
    assert!(out.ok, "{}", out.stderr);
    let sts = get(&kc, &["sts", "web"]).await.unwrap();
    let uid = sts["metadata"]["uid"].as_str().unwrap().to_owned();

    // web-0 first, with its claim; web-1 waits for web-0 to be Running and Ready.
    wait_names(&kc, "app=web", &["web-0"]).await;
    let pvc = get(&kc, &["pvc", "www-web-0"])
        .await
        .expect("claim www-web-0");
    assert_eq!(pvc["metadata"]["labels"]["app"], "web");
    // Retain/Retain: the claim is owned by nobody.
    assert!(pvc["metadata"]["ownerReferences"].is_null(), "{pvc}");
    let p0 = get(&kc, &["pod", "web-0"]).await.unwrap();
    assert_eq!(
        p0["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"],
        "web-0"
    );
    assert_eq!(
        p0["metadata"]["labels"]["apps.kubernetes.io/pod-index"],
        "0"
    );
    let rev = p0["metadata"]["labels"]["controller-revision-hash"]
        .as_str()
        .unwrap()
        .to_owned();
    // The same name kube-controller-manager v1.37.2 gives this template's revision.
    assert_eq!(rev, "web-5cd9bbdc7");
    assert_eq!(p0["metadata"]["generateName"], "web-");
    assert_eq!(p0["spec"]["hostname"], "web-0");
    assert_eq!(p0["spec"]["subdomain"], "nginx");
    let r = &p0["metadata"]["ownerReferences"][0];
    assert_eq!(
        (r["kind"].as_str(), r["uid"].as_str()),
        (Some("StatefulSet"), Some(uid.as_str()))
    );
    assert_eq!(r["controller"], true);
    let vol = &p0["spec"]["volumes"][0];
    assert_eq!(vol["name"], "www");
    assert_eq!(vol["persistentVolumeClaim"]["claimName"], "www-web-0");
    stays_absent(&kc, "pod", "web-1").await;

    make_ready(&kc, "web-0").await;
    wait_names(&kc, "app=web", &["web-0", "web-1"]).await;
    assert!(get(&kc, &["pvc", "www-web-1"]).await.is_some());
    stays_absent(&kc, "pod", "web-2").await;
    make_ready(&kc, "web-1").await;
    wait_names(&kc, "app=web", &["web-0", "web-1", "web-2"]).await;
    make_ready(&kc, "web-2").await;

    // The status once all are ready; the revision is a ControllerRevision owned by the set.
    let st = eventually(20, "3 ready", || async {
        get(&kc, &["sts", "web"])
            .await
            .filter(|s| s["status"]["readyReplicas"] == 3 && s["status"]["availableReplicas"] == 3)
    })
    .await;
    let s = &st["status"];
    assert_eq!(s["replicas"], 3);
    assert_eq!(s["currentReplicas"], 3);
    assert_eq!(s["updatedReplicas"], 3);
    assert_eq!(s["currentRevision"], rev.as_str());
    assert_eq!(s["updateRevision"], rev.as_str());
    assert_eq!(s["observedGeneration"], 1);
    assert_eq!(s["collisionCount"], 0);
    let cr = get(&kc, &["controllerrevision", &rev])
        .await
        .expect("revision");
    assert_eq!(cr["revision"], 1);
    assert_eq!(cr["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    assert_eq!(cr["data"]["spec"]["template"]["$patch"], "replace");
    assert_eq!(
        cr["metadata"]["labels"]["controller.kubernetes.io/hash"],
        rev.trim_start_matches("web-")
    );

    let created = events(&kc, "web", "SuccessfulCreate").await;
    assert_eq!(
        created,
        [
            "Create Claim www-web-0 Pod web-0 in StatefulSet web success",
            "Create Pod web-0 in StatefulSet web successful",
            "Create Claim www-web-1 Pod web-1 in StatefulSet web success",
            "Create Pod web-1 in StatefulSet web successful",
            "Create Claim www-web-2 Pod web-2 in StatefulSet web success",
            "Create Pod web-2 in StatefulSet web successful",
        ]
    );

    let out = k(&kc, &["rollout", "status", "sts/web", "--timeout=20s"]).await;
    assert!(out.ok, "{} {}", out.stdout, out.stderr);
    // The API defaults rollingUpdate.partition to 0, so kubectl reports a partitioned roll out.
    assert!(
        out.stdout
            .contains("partitioned roll out complete: 3 new pods have been updated"),
        "{}",
        out.stdout
    );

    // Scale down: highest ordinal first, one at a time; the claims stay (Retain).
    assert!(k(&kc, &["scale", "sts", "web", "--replicas=1"]).await.ok);
    wait_names(&kc, "app=web", &["web-0"]).await;
    let deleted = events(&kc, "web", "SuccessfulDelete").await;
    assert_eq!(
        deleted,
        [
            "Delete Pod web-2 in StatefulSet web successful",
            "Delete Pod web-1 in StatefulSet web successful",
        ]
    );
    for c in ["www-web-0", "www-web-1", "www-web-2"] {
        assert!(get(&kc, &["pvc", c]).await.is_some(), "{c} kept");
    }
    eventually(20, "status of 1", || async {
        get(&kc, &["sts", "web"]).await.filter(|s| {
            s["status"]["replicas"] == 1
                && s["status"]["readyReplicas"] == 1
                && s["status"]["observedGeneration"] == 2
        })
    })
    .await;

    // A failed pod is deleted and made again.
    let old_uid = get(&kc, &["pod", "web-0"]).await.unwrap()["metadata"]["uid"].clone();
    set_status(&kc, "web-0", json!({"phase": "Failed"})).await;
    eventually(20, "web-0 recreated", || async {
        get(&kc, &["pod", "web-0"])
            .await
            .filter(|p| p["metadata"]["uid"] != old_uid && p["status"]["phase"] == "Pending")
    })
    .await;
    let deleted = events(&kc, "web", "SuccessfulDelete").await;
    assert_eq!(
        deleted.last().unwrap(),
        "Delete Pod web-0 in StatefulSet web successful"
    );
}

const DB: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: db
spec:
  serviceName: db
  replicas: 3
  podManagementPolicy: Parallel
  selector:
    matchLabels: {app: db}
  updateStrategy:
    type: RollingUpdate
    rollingUpdate: {partition: 1}
  template:
    metadata:
      labels: {app: db}
    spec:
      containers:
      - name: db
        image: db:1
"#;

fn image_of(p: &Value) -> String {
    p["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn images(kc: &Path) -> Vec<(String, String, String)> {
    let v = get(kc, &["pods", "-l", "app=db"]).await.unwrap();
    let mut out: Vec<(String, String, String)> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                image_of(p),
                p["metadata"]["labels"]["controller-revision-hash"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_creates_at_once_and_rolls_partitioned_updates_in_reverse() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(DB)).await;
    assert!(out.ok, "{}", out.stderr);
    // Parallel: all three without waiting for readiness.
    wait_names(&kc, "app=db", &["db-0", "db-1", "db-2"]).await;
    for p in ["db-0", "db-1", "db-2"] {
        make_ready(&kc, p).await;
    }
    let st = eventually(20, "3 ready", || async {
        get(&kc, &["sts", "db"])
            .await
            .filter(|s| s["status"]["readyReplicas"] == 3)
    })
    .await;
    let rev1 = st["status"]["updateRevision"].as_str().unwrap().to_owned();

    // A new template with partition 1: db-2 then db-1 are replaced, db-0 stays.
    let out = k(&kc, &["set", "image", "sts/db", "db=db:2"]).await;
    assert!(out.ok, "{}", out.stderr);
    let st = eventually(20, "new update revision", || async {
        get(&kc, &["sts", "db"])
            .await
            .filter(|s| s["status"]["updateRevision"] != rev1.as_str())
    })
    .await;
    let rev2 = st["status"]["updateRevision"].as_str().unwrap().to_owned();
    // The names kube-controller-manager v1.37.2 gives these two templates' revisions.
    assert_eq!(
        (rev1.as_str(), rev2.as_str()),
        ("db-6bcb98b9b4", "db-86d9d467b7")
    );
    assert_eq!(st["status"]["currentRevision"], rev1.as_str());
    eventually(20, "db-2 updated", || async {
        let i = images(&kc).await;
        (i.len() == 3 && i[2].1 == "db:2").then_some(())
    })
    .await;
    // db-1 waits while db-2 is unavailable (maxUnavailable 1).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let i = images(&kc).await;
    assert_eq!(i[1].1, "db:1", "{i:?}");
    assert_eq!(i[2].2, rev2);
    make_ready(&kc, "db-2").await;
    eventually(20, "db-1 updated", || async {
        let i = images(&kc).await;
        (i.len() == 3 && i[1].1 == "db:2").then_some(())
    })
    .await;
    make_ready(&kc, "db-1").await;
    let st = eventually(20, "partitioned status", || async {
        get(&kc, &["sts", "db"])
            .await
            .filter(|s| s["status"]["updatedReplicas"] == 2 && s["status"]["readyReplicas"] == 3)
    })
    .await;
    assert_eq!(st["status"]["currentReplicas"], 1);
    assert_eq!(st["status"]["currentRevision"], rev1.as_str());
    assert_eq!(images(&kc).await[0].1, "db:1");
    let deleted = events(&kc, "db", "SuccessfulDelete").await;
    assert_eq!(
        deleted,
        [
            "Delete Pod db-2 in StatefulSet db successful",
            "Delete Pod db-1 in StatefulSet db successful",
        ]
    );
    let out = k(&kc, &["rollout", "status", "sts/db", "--timeout=20s"]).await;
    assert!(out.ok, "{} {}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("partitioned roll out complete: 2 new pods have been updated"),
        "{}",
        out.stdout
    );

    // Partition 0 finishes the rollout: current becomes the update revision.
    let out = k(
        &kc,
        &[
            "patch",
            "sts",
            "db",
            "--type=merge",
            "-p",
            r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(20, "db-0 updated", || async {
        let i = images(&kc).await;
        (i.len() == 3 && i[0].1 == "db:2").then_some(())
    })
    .await;
    make_ready(&kc, "db-0").await;
    let st = eventually(20, "rolled out", || async {
        get(&kc, &["sts", "db"]).await.filter(|s| {
            s["status"]["currentRevision"] == rev2.as_str() && s["status"]["currentReplicas"] == 3
        })
    })
    .await;
    assert_eq!(st["status"]["updatedReplicas"], 3);

    // History and undo: revision 1 comes back as revision 3.
    let out = k(&kc, &["rollout", "history", "sts/db"]).await;
    assert!(out.ok, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().map(str::trim).collect();
    assert!(
        lines.iter().any(|l| l.starts_with('1')) && lines.iter().any(|l| l.starts_with('2')),
        "{}",
        out.stdout
    );
    let out = k(&kc, &["rollout", "undo", "sts/db"]).await;
    assert!(out.ok, "{} {}", out.stdout, out.stderr);
    assert!(out.stdout.contains("rolled back"), "{}", out.stdout);
    let st = eventually(20, "undo", || async {
        get(&kc, &["sts", "db"])
            .await
            .filter(|s| s["status"]["updateRevision"] == rev1.as_str())
    })
    .await;
    assert_eq!(
        st["spec"]["template"]["spec"]["containers"][0]["image"],
        "db:1"
    );
    let cr = get(&kc, &["controllerrevision", &rev1]).await.unwrap();
    assert_eq!(cr["revision"], 3);
    eventually(20, "db-2 back to db:1", || async {
        let i = images(&kc).await;
        (i.len() == 3 && i[2].1 == "db:1").then_some(())
    })
    .await;
}

const ORD: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: ord
spec:
  replicas: 2
  podManagementPolicy: Parallel
  ordinals: {start: 5}
  persistentVolumeClaimRetentionPolicy: {whenDeleted: Delete, whenScaled: Delete}
  selector:
    matchLabels: {app: ord}
  template:
    metadata:
      labels: {app: ord}
    spec:
      containers:
      - name: c
        image: busybox
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      accessModes: [ReadWriteOnce]
      resources:
        requests: {storage: 1Gi}
"#;

fn owner_kinds(v: &Value) -> Vec<String> {
    v["metadata"]["ownerReferences"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    format!(
                        "{}/{}",
                        r["kind"].as_str().unwrap(),
                        r["name"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn start_ordinal_retention_policy_and_failed_create() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(ORD)).await;
    assert!(out.ok, "{}", out.stderr);
    wait_names(&kc, "app=ord", &["ord-5", "ord-6"]).await;
    assert_eq!(
        get(&kc, &["pod", "ord-6"]).await.unwrap()["metadata"]["labels"]
            ["apps.kubernetes.io/pod-index"],
        "6"
    );
    // whenDeleted Delete: the claims are controlled by the set.
    for c in ["data-ord-5", "data-ord-6"] {
        eventually(20, &format!("{c} owned by the set"), || async {
            get(&kc, &["pvc", c])
                .await
                .filter(|p| owner_kinds(p) == ["StatefulSet/ord"])
        })
        .await;
    }
    make_ready(&kc, "ord-5").await;
    make_ready(&kc, "ord-6").await;
    // whenScaled Delete: a condemned pod's claim is handed to the pod before it goes.
    assert!(k(&kc, &["scale", "sts", "ord", "--replicas=1"]).await.ok);
    wait_names(&kc, "app=ord", &["ord-5"]).await;
    // Then the garbage collector deletes it with its owner.
    eventually(30, "data-ord-6 deleted", || async {
        match get(&kc, &["pvc", "data-ord-6"]).await {
            None => Some(()),
            Some(p) => (owner_kinds(&p) == ["Pod/ord-6"]
                && !p["metadata"]["deletionTimestamp"].is_null())
            .then_some(()),
        }
    })
    .await;
    assert_eq!(
        owner_kinds(&get(&kc, &["pvc", "data-ord-5"]).await.unwrap()),
        ["StatefulSet/ord"]
    );

    // A pod that cannot be created: FailedCreate with upstream's message.
    let bad = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: bad
spec:
  replicas: 1
  selector:
    matchLabels: {app: bad}
  template:
    metadata:
      labels: {app: bad}
    spec:
      serviceAccountName: missing
      containers:
      - name: c
        image: busybox
"#;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(bad)).await;
    assert!(out.ok, "{}", out.stderr);
    let failed = eventually(20, "FailedCreate", || async {
        let e = events(&kc, "bad", "FailedCreate").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert!(
        failed[0].starts_with("Create Pod bad-0 in StatefulSet bad failed error: "),
        "{failed:?}"
    );
}

const OD: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: od
spec:
  replicas: 2
  minReadySeconds: 3
  revisionHistoryLimit: 0
  updateStrategy: {type: OnDelete}
  selector:
    matchLabels: {app: od}
  template:
    metadata:
      labels: {app: od}
    spec:
      containers:
      - name: c
        image: od:1
"#;

/// The image of each live `app=od` pod, by name.
async fn od_images(kc: &Path) -> Vec<(String, String)> {
    let v = get(kc, &["pods", "-l", "app=od"]).await.unwrap();
    let mut out: Vec<(String, String)> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                image_of(p),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn min_ready_seconds_on_delete_history_limit_and_adoption() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(OD)).await;
    assert!(out.ok, "{}", out.stderr);
    wait_names(&kc, "app=od", &["od-0"]).await;

    // Ready just now: od-1 waits until od-0 has been ready for minReadySeconds.
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    set_status(
        &kc,
        "od-0",
        json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
        ]}),
    )
    .await;
    let st = eventually(10, "ready, not available", || async {
        get(&kc, &["sts", "od"])
            .await
            .filter(|s| s["status"]["readyReplicas"] == 1)
    })
    .await;
    assert_eq!(st["status"]["availableReplicas"], 0, "{st}");
    assert!(get(&kc, &["pod", "od-1"]).await.is_none());
    wait_names(&kc, "app=od", &["od-0", "od-1"]).await;
    eventually(10, "od-0 available", || async {
        get(&kc, &["sts", "od"])
            .await
            .filter(|s| s["status"]["availableReplicas"] == 1)
    })
    .await;
    make_ready(&kc, "od-1").await;
    let st = eventually(10, "2 available", || async {
        get(&kc, &["sts", "od"])
            .await
            .filter(|s| s["status"]["availableReplicas"] == 2)
    })
    .await;
    let rev1 = st["status"]["currentRevision"].as_str().unwrap().to_owned();

    // An orphaned pod is adopted back.
    let uid = st["metadata"]["uid"].as_str().unwrap().to_owned();
    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            "od-1",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/ownerReferences"}]"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(20, "od-1 adopted", || async {
        get(&kc, &["pod", "od-1"])
            .await
            .filter(|p| p["metadata"]["ownerReferences"][0]["uid"] == uid.as_str())
    })
    .await;

    // OnDelete: a new template replaces no pod until the pod is deleted.
    assert!(k(&kc, &["set", "image", "sts/od", "c=od:2"]).await.ok);
    let st = eventually(20, "update revision", || async {
        get(&kc, &["sts", "od"])
            .await
            .filter(|s| s["status"]["updateRevision"] != rev1.as_str())
    })
    .await;
    let rev2 = st["status"]["updateRevision"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        od_images(&kc).await,
        [
            ("od-0".into(), "od:1".into()),
            ("od-1".into(), "od:1".into())
        ]
    );
    assert!(k(&kc, &["delete", "pod", "od-1"]).await.ok);
    eventually(20, "od-1 at od:2", || async {
        (od_images(&kc).await
            == [
                ("od-0".into(), "od:1".into()),
                ("od-1".into(), "od:2".into()),
            ])
        .then_some(())
    })
    .await;
    make_ready(&kc, "od-1").await;
    let st = eventually(20, "one updated", || async {
        get(&kc, &["sts", "od"])
            .await
            .filter(|s| s["status"]["updatedReplicas"] == 1 && s["status"]["readyReplicas"] == 2)
    })
    .await;
    assert_eq!(st["status"]["currentReplicas"], 1);
    assert_eq!(st["status"]["currentRevision"], rev1.as_str());
    // The old revision is still used, so revisionHistoryLimit 0 keeps it.
    assert!(get(&kc, &["controllerrevision", &rev1]).await.is_some());

    assert!(k(&kc, &["delete", "pod", "od-0"]).await.ok);
    eventually(20, "od-0 at od:2", || async {
        (od_images(&kc).await
            == [
                ("od-0".into(), "od:2".into()),
                ("od-1".into(), "od:2".into()),
            ])
        .then_some(())
    })
    .await;
    make_ready(&kc, "od-0").await;
    eventually(20, "rolled over", || async {
        get(&kc, &["sts", "od"])
            .await
            .filter(|s| s["status"]["currentRevision"] == rev2.as_str())
    })
    .await;
    // Nothing uses the old revision any more: it is deleted.
    eventually(20, "old revision pruned", || async {
        get(&kc, &["controllerrevision", &rev1])
            .await
            .is_none()
            .then_some(())
    })
    .await;
}
