//! The garbage collector against an in-process `kumo apiserver`, driven with kubectl:
//! background, orphan and foreground cascades, multiple owners, pods of a ReplicaSet.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const GC: &[&str] = &["garbage-collector-controller"];

/// Creates ConfigMap `name` owned by the given ConfigMaps (blockOwnerDeletion set).
async fn create_cm(kc: &Path, name: &str, owners: &[&Value], finalizers: &[&str]) -> Value {
    create_cm_in(kc, "default", name, owners, finalizers).await
}

async fn create_cm_in(
    kc: &Path,
    ns: &str,
    name: &str,
    owners: &[&Value],
    finalizers: &[&str],
) -> Value {
    let refs: Vec<Value> = owners
        .iter()
        .map(|o| {
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": o["metadata"]["name"],
                "uid": o["metadata"]["uid"],
                "blockOwnerDeletion": true,
            })
        })
        .collect();
    let mut obj = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns},
    });
    if !refs.is_empty() {
        obj["metadata"]["ownerReferences"] = json!(refs);
    }
    if !finalizers.is_empty() {
        obj["metadata"]["finalizers"] = json!(finalizers);
    }
    let out = k_in(
        kc,
        &["create", "-o", "json", "-f", "-"],
        Some(&obj.to_string()),
    )
    .await;
    json(&out)
}

async fn gone(kc: &Path, what: &str, kind: &str, name: &str) {
    eventually(20, what, || async {
        let out = k(kc, &["get", kind, name, "--ignore-not-found", "-o", "name"]).await;
        (out.ok && out.stdout.trim().is_empty()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn background_deletion_and_multiple_owners() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, GC).await;

    // Background: the dependent goes after its owner.
    let owner = create_cm(&kc, "owner", &[], &[]).await;
    create_cm(&kc, "child", &[&owner], &[]).await;
    create_cm(
        &kc,
        "grandchild",
        &[&get(&kc, &["cm", "child"]).await.unwrap()],
        &[],
    )
    .await;
    assert!(k(&kc, &["delete", "cm", "owner"]).await.ok);
    gone(&kc, "child collected", "cm", "child").await;
    gone(&kc, "grandchild collected", "cm", "grandchild").await;

    // Two owners: the dependent lives while one does, and loses the dangling reference.
    let a = create_cm(&kc, "a", &[], &[]).await;
    let b = create_cm(&kc, "b", &[], &[]).await;
    create_cm(&kc, "shared", &[&a, &b], &[]).await;
    assert!(k(&kc, &["delete", "cm", "a"]).await.ok);
    let shared = eventually(20, "dangling reference removed", || async {
        get(&kc, &["cm", "shared"])
            .await
            .filter(|s| s["metadata"]["ownerReferences"].as_array().map(Vec::len) == Some(1))
    })
    .await;
    assert_eq!(shared["metadata"]["ownerReferences"][0]["name"], "b");
    assert!(shared["metadata"]["deletionTimestamp"].is_null());
    assert!(k(&kc, &["delete", "cm", "b"]).await.ok);
    gone(&kc, "shared collected with its last owner", "cm", "shared").await;

    // An owner that never existed (unknown uid): the dependent is collected.
    let ghost =
        json!({"metadata": {"name": "ghost", "uid": "00000000-0000-0000-0000-000000000001"}});
    create_cm(&kc, "orphaned-at-birth", &[&ghost], &[]).await;
    gone(
        &kc,
        "dependent of a missing owner",
        "cm",
        "orphaned-at-birth",
    )
    .await;

    // An owner in another namespace is not an owner: a warning on the dependent, which
    // is then collected as its owner cannot be found in its namespace.
    let there = create_cm(&kc, "there", &[], &[]).await;
    assert!(k(&kc, &["create", "namespace", "other"]).await.ok);
    let wrong = create_cm_in(&kc, "other", "wrong-ns", &[&there], &[]).await;
    let ev = eventually(20, "OwnerRefInvalidNamespace event", || async {
        let out = k(&kc, &["get", "events", "-n", "other", "-o", "json"]).await;
        json(&out)["items"].as_array().and_then(|a| {
            a.iter()
                .find(|e| e["reason"] == "OwnerRefInvalidNamespace")
                .cloned()
        })
    })
    .await;
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["involvedObject"]["name"], "wrong-ns");
    assert_eq!(ev["involvedObject"]["uid"], wrong["metadata"]["uid"]);
    assert_eq!(
        ev["message"].as_str().unwrap(),
        format!(
            "ownerRef [v1/ConfigMap, namespace: other, name: there, uid: {}] does not exist in namespace \"other\"",
            there["metadata"]["uid"].as_str().unwrap()
        )
    );
    eventually(
        20,
        "dependent with an owner elsewhere collected",
        || async {
            let out = k(
                &kc,
                &[
                    "get",
                    "cm",
                    "wrong-ns",
                    "-n",
                    "other",
                    "--ignore-not-found",
                    "-o",
                    "name",
                ],
            )
            .await;
            (out.ok && out.stdout.trim().is_empty()).then_some(())
        },
    )
    .await;
    assert!(get(&kc, &["cm", "there"]).await.is_some());

    // An unrelated ConfigMap stays.
    create_cm(&kc, "bystander", &[], &[]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(get(&kc, &["cm", "bystander"]).await.is_some());
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orphan_and_foreground_cascades() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, GC).await;

    // Orphan: the owner goes, the dependent stays without the reference.
    let owner = create_cm(&kc, "owner", &[], &[]).await;
    create_cm(&kc, "kept", &[&owner], &[]).await;
    let out = k(&kc, &["delete", "cm", "owner", "--cascade=orphan"]).await;
    assert!(out.ok, "{}", out.stderr);
    gone(&kc, "owner deleted", "cm", "owner").await;
    let kept = get(&kc, &["cm", "kept"])
        .await
        .expect("the dependent is kept");
    assert!(kept["metadata"]["ownerReferences"].is_null(), "{kept}");
    assert!(kept["metadata"]["deletionTimestamp"].is_null(), "{kept}");

    // Foreground: the owner waits (foregroundDeletion) while a blocking dependent exists.
    let owner = create_cm(&kc, "fg-owner", &[], &[]).await;
    create_cm(&kc, "held", &[&owner], &["example.com/hold"]).await;
    let out = k(
        &kc,
        &[
            "delete",
            "cm",
            "fg-owner",
            "--cascade=foreground",
            "--wait=false",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(20, "the blocking dependent is being deleted", || async {
        get(&kc, &["cm", "held"])
            .await
            .filter(|h| !h["metadata"]["deletionTimestamp"].is_null())
    })
    .await;
    let o = get(&kc, &["cm", "fg-owner"]).await.expect("owner waits");
    assert_eq!(o["metadata"]["finalizers"], json!(["foregroundDeletion"]));
    assert!(!o["metadata"]["deletionTimestamp"].is_null());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        get(&kc, &["cm", "fg-owner"]).await.is_some(),
        "owner went first"
    );
    let out = k(
        &kc,
        &[
            "patch",
            "cm",
            "held",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    gone(&kc, "dependent deleted", "cm", "held").await;
    gone(&kc, "owner deleted after its dependent", "cm", "fg-owner").await;

    // A cycle (each owns the other, both blocking): the foreground deletion still ends.
    let x = create_cm(&kc, "x", &[], &[]).await;
    let y = create_cm(&kc, "y", &[&x], &[]).await;
    let patch = json!({"metadata": {"ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "y",
        "uid": y["metadata"]["uid"], "blockOwnerDeletion": true,
    }]}});
    let out = k(
        &kc,
        &["patch", "cm", "x", "--type=merge", "-p", &patch.to_string()],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &["delete", "cm", "x", "--cascade=foreground", "--wait=false"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    gone(&kc, "x of the cycle", "cm", "x").await;
    gone(&kc, "y of the cycle", "cm", "y").await;

    // kubectl's own wait: when it returns, the dependent is already gone.
    let owner = create_cm(&kc, "fg2", &[], &[]).await;
    create_cm(&kc, "fg2-child", &[&owner], &[]).await;
    let out = k(&kc, &["delete", "cm", "fg2", "--cascade=foreground"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(get(&kc, &["cm", "fg2"]).await.is_none());
    assert!(get(&kc, &["cm", "fg2-child"]).await.is_none());
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_of_a_deleted_replicaset_are_collected() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    // As kubeadm runs it: the collector acts as its own ServiceAccount.
    let mut cfg = cm_config(&kc, GC);
    cfg.use_service_account_credentials = true;
    let cm = kumo_controller_manager::ControllerManager::start(cfg)
        .await
        .unwrap();
    // No serviceaccount controller here: the pod's ServiceAccount is made by hand.
    assert!(k(&kc, &["create", "serviceaccount", "default"]).await.ok);
    let rs = json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
    });
    let rs = json(
        &k_in(
            &kc,
            &["create", "-o", "json", "-f", "-"],
            Some(&rs.to_string()),
        )
        .await,
    );
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": "web", "uid": rs["metadata"]["uid"],
                        "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
    });
    let out = k_in(&kc, &["create", "-f", "-"], Some(&pod.to_string())).await;
    assert!(out.ok, "{}", out.stderr);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        get(&kc, &["pod", "web-1"]).await.is_some(),
        "collected too early"
    );
    assert!(k(&kc, &["delete", "rs", "web"]).await.ok);
    // The pod is deleted (gracefully: it has a deletionTimestamp, or is gone).
    eventually(20, "pod collected", || async {
        match get(&kc, &["pod", "web-1"]).await {
            None => Some(()),
            Some(p) => (!p["metadata"]["deletionTimestamp"].is_null()).then_some(()),
        }
    })
    .await;
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_deployment_or_service_removes_what_controllers_made() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*"]).await;
    eventually(20, "default ServiceAccount", || {
        get(&kc, &["sa", "default"])
    })
    .await;
    let out = k(
        &kc,
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=2",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(30, "two pods", || async {
        let out = k(&kc, &["get", "pods", "-l", "app=web", "-o", "json"]).await;
        (json(&out)["items"].as_array().map(Vec::len) == Some(2)).then_some(())
    })
    .await;
    let out = k(&kc, &["expose", "deployment", "web", "--port=80"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(30, "an EndpointSlice for the Service", || async {
        let out = k(
            &kc,
            &[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web",
                "-o",
                "json",
            ],
        )
        .await;
        (json(&out)["items"].as_array().map(Vec::len) == Some(1)).then_some(())
    })
    .await;

    assert!(k(&kc, &["delete", "deployment", "web"]).await.ok);
    eventually(30, "ReplicaSets collected", || async {
        let out = k(&kc, &["get", "rs", "-l", "app=web", "-o", "json"]).await;
        (json(&out)["items"].as_array().map(Vec::len) == Some(0)).then_some(())
    })
    .await;
    // Pods are deleted gracefully (no kubelet here): terminating, or gone.
    eventually(30, "pods collected", || async {
        let out = k(&kc, &["get", "pods", "-l", "app=web", "-o", "json"]).await;
        json(&out)["items"]
            .as_array()
            .is_some_and(|a| {
                a.iter()
                    .all(|p| !p["metadata"]["deletionTimestamp"].is_null())
            })
            .then_some(())
    })
    .await;
    assert!(k(&kc, &["delete", "service", "web"]).await.ok);
    eventually(30, "EndpointSlices collected", || async {
        let out = k(
            &kc,
            &[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web",
                "-o",
                "json",
            ],
        )
        .await;
        (json(&out)["items"].as_array().map(Vec::len) == Some(0)).then_some(())
    })
    .await;
    cm.shutdown().await.unwrap();
}
