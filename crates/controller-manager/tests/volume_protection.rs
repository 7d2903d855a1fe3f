//! The PVC and PV protection controllers against an in-process `kumo apiserver`, driven
//! with kubectl: a deleted claim stays while a scheduled pod uses it and goes after; a
//! deleted volume stays while Bound.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;

const CLAIM: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: default}
---
apiVersion: v1
kind: Pod
metadata: {name: user, namespace: default}
spec:
  nodeName: n1
  automountServiceAccountToken: false
  containers: [{name: c, image: busybox}]
  volumes: [{name: v, persistentVolumeClaim: {claimName: data}}]
"#;

const VOLUME: &str = r#"
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv1}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /tmp/pv1}
"#;

/// Sets volume pv1's status.phase, as the binder would.
async fn set_phase(kc: &std::path::Path, phase: &str) {
    let patch = format!(r#"{{"status":{{"phase":"{phase}"}}}}"#);
    let args = [
        "patch",
        "pv",
        "pv1",
        "--subresource=status",
        "--type=merge",
        "-p",
        &patch,
    ];
    let out = k(kc, &args).await;
    assert!(out.ok, "{}", out.stderr);
}

async fn gone(kc: &std::path::Path, what: &[&str]) -> bool {
    get(kc, what).await.is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_and_volumes_stay_while_in_use() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(
        &kc,
        &[
            "persistentvolumeclaim-protection-controller",
            "persistentvolume-protection-controller",
        ],
    )
    .await;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(CLAIM)).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["delete", "pvc", "data", "--wait=false"]).await;
    assert!(out.ok, "{}", out.stderr);
    // The pod uses it: it stays, marked.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pvc = get(&kc, &["pvc", "data"]).await.expect("the claim stays");
    assert!(pvc["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(
        pvc["metadata"]["finalizers"][0],
        "kubernetes.io/pvc-protection"
    );
    let out = k(
        &kc,
        &["delete", "pod", "user", "--grace-period=0", "--force"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(20, "the claim to go", || async {
        gone(&kc, &["pvc", "data"]).await.then_some(())
    })
    .await;

    let out = k_in(&kc, &["apply", "-f", "-"], Some(VOLUME)).await;
    assert!(out.ok, "{}", out.stderr);
    set_phase(&kc, "Bound").await;
    let out = k(&kc, &["delete", "pv", "pv1", "--wait=false"]).await;
    assert!(out.ok, "{}", out.stderr);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        get(&kc, &["pv", "pv1"]).await.is_some(),
        "a Bound volume stays"
    );
    set_phase(&kc, "Released").await;
    eventually(20, "the volume to go", || async {
        gone(&kc, &["pv", "pv1"]).await.then_some(())
    })
    .await;
}
