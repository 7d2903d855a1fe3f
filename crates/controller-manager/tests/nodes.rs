//! The node-side controllers, each acting as its upstream ServiceAccount:
//! * taint-eviction-controller: a NoExecute taint deletes a pod that does not tolerate it
//!   at once and a tolerating pod after its tolerationSeconds, with the DisruptionTarget
//!   condition and TaintManagerEviction events; removing the taint cancels;
//! * pod-garbage-collector-controller: orphans (bound to a missing node) are marked
//!   Failed with DisruptionTarget and force deleted, terminated pods beyond the threshold
//!   go oldest first, unscheduled terminating pods are marked Failed;
//! * node-ipam-controller: new nodes get /24s of the cluster CIDR, taken ranges are
//!   skipped, exhaustion records CIDRNotAvailable, a deleted node's range is reused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

async fn create(kc: &Path, obj: Value) {
    let out = k_in(kc, &["create", "-f", "-"], Some(&obj.to_string())).await;
    assert!(out.ok, "{}", out.stderr);
}

async fn set_phase(kc: &Path, pod: &str, phase: &str) {
    let patch = json!({"status": {"phase": phase}}).to_string();
    let out = k(
        kc,
        &[
            "patch",
            "pod",
            pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

fn pod(name: &str, node: Option<&str>, tolerations: Value) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}], "tolerations": tolerations},
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    p
}

fn condition(p: &Value, t: &str) -> Option<Value> {
    p["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
        .cloned()
}

/// The events with this reason, as (involved object name, message, source component).
async fn events(kc: &Path, reason: &str) -> Vec<(String, String, String)> {
    let list = get(kc, &["events", "-A"]).await.unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == reason)
        .map(|e| {
            (
                e["involvedObject"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
                e["message"].as_str().unwrap_or("").to_owned(),
                e["source"]["component"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

async fn terminating(kc: &Path, name: &str) -> bool {
    match get(kc, &["pod", name]).await {
        None => true,
        Some(p) => !p["metadata"]["deletionTimestamp"].is_null(),
    }
}

async fn start_as_service_accounts(
    kc: &Path,
    controllers: &[&str],
    edit: impl FnOnce(&mut kumo_controller_manager::Config),
) -> kumo_controller_manager::ControllerManager {
    let mut cfg = cm_config(kc, controllers);
    cfg.use_service_account_credentials = true;
    edit(&mut cfg);
    kumo_controller_manager::ControllerManager::start(cfg)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_execute_taints_evict_pods() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_as_service_accounts(&kc, &["taint-eviction-controller"], |_| {}).await;
    assert!(k(&kc, &["create", "serviceaccount", "default"]).await.ok);
    node(&kc, "n1", "4", "8Gi", &[], "").await;
    node(&kc, "n2", "4", "8Gi", &[], "").await;
    let tol = |key: &str, secs: Option<i64>| {
        let mut t = json!({"key": key, "operator": "Exists", "effect": "NoExecute"});
        if let Some(s) = secs {
            t["tolerationSeconds"] = json!(s);
        }
        t
    };
    create(&kc, pod("plain", Some("n1"), json!([]))).await;
    // n1 gets two taints; the smaller tolerationSeconds of the matching tolerations counts.
    let both = json!([
        tol("example.com/evict", Some(60)),
        tol("example.com/other", Some(4))
    ]);
    create(&kc, pod("tolerant", Some("n1"), both)).await;
    create(&kc, pod("forever", Some("n1"), json!([tol("", None)]))).await;
    create(
        &kc,
        pod(
            "saved",
            Some("n2"),
            json!([tol("example.com/evict", Some(6))]),
        ),
    )
    .await;

    let tainted = Instant::now();
    for (n, taints) in [
        (
            "n1",
            &[
                "example.com/evict=x:NoExecute",
                "example.com/other:NoExecute",
            ][..],
        ),
        ("n2", &["example.com/evict=x:NoExecute"][..]),
    ] {
        let mut args = vec!["taint", "node", n];
        args.extend_from_slice(taints);
        let out = k(&kc, &args).await;
        assert!(out.ok, "{}", out.stderr);
    }
    // Not tolerated: deleted at once, with the condition set first (no kubelet runs, so
    // the graceful deletion leaves the pod terminating).
    let plain = eventually(10, "plain pod deleted", || async {
        get(&kc, &["pod", "plain"])
            .await
            .filter(|p| !p["metadata"]["deletionTimestamp"].is_null())
    })
    .await;
    let c = condition(&plain, "DisruptionTarget").expect("DisruptionTarget");
    assert_eq!(c["status"], "True");
    assert_eq!(c["reason"], "DeletionByTaintManager");
    assert_eq!(
        c["message"],
        "Taint manager: deleting due to NoExecute taint"
    );
    assert!(tainted.elapsed() < Duration::from_secs(4));
    // The scheduled deletion of "saved" is cancelled when the taint goes.
    assert!(!terminating(&kc, "tolerant").await);
    let out = k(&kc, &["taint", "node", "n2", "example.com/evict-"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(10, "cancel event", || async {
        events(&kc, "TaintManagerEviction")
            .await
            .into_iter()
            .find(|e| {
                e.0 == "saved"
                    && e.1 == "Cancelling deletion of Pod default/saved"
                    && e.2 == "taint-eviction-controller"
            })
    })
    .await;
    // Tolerated for 4 s: deleted after that, not before.
    eventually(15, "tolerant pod deleted", || async {
        terminating(&kc, "tolerant").await.then_some(())
    })
    .await;
    assert!(
        tainted.elapsed() >= Duration::from_secs(4),
        "deleted after {:?}",
        tainted.elapsed()
    );
    let evs = events(&kc, "TaintManagerEviction").await;
    for p in ["plain", "tolerant"] {
        assert!(
            evs.iter().any(|e| e.0 == p
                && e.1 == format!("Marking for deletion Pod default/{p}")
                && e.2 == "taint-eviction-controller"),
            "{evs:?}"
        );
    }
    // Past the cancelled 6 s and the tolerated-forever pod stay.
    tokio::time::sleep(Duration::from_secs(7).saturating_sub(tainted.elapsed())).await;
    assert!(!terminating(&kc, "saved").await);
    assert!(!terminating(&kc, "forever").await);
    assert!(!evs
        .iter()
        .any(|e| e.0 == "forever" || e.0 == "saved" && e.1.starts_with("Marking")));
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pod_gc_collects_orphans_and_terminated_pods() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    assert!(k(&kc, &["create", "serviceaccount", "default"]).await.ok);
    node(&kc, "present", "4", "8Gi", &[], "").await;
    // Terminated pods, created oldest first in reverse name order (so the order of
    // deletion is by age, not by name).
    for (i, name) in ["t-d", "t-c", "t-b", "t-a"].iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
        create(&kc, pod(name, Some("present"), json!([]))).await;
    }
    for (name, phase) in [
        ("t-d", "Succeeded"),
        ("t-c", "Failed"),
        ("t-b", "Succeeded"),
        ("t-a", "Failed"),
    ] {
        set_phase(&kc, name, phase).await;
    }
    create(&kc, pod("running", Some("present"), json!([]))).await;
    set_phase(&kc, "running", "Running").await;
    // An orphan, held by a finalizer so its last status can be read.
    let mut orphan = pod("orphan", Some("ghost"), json!([]));
    orphan["metadata"]["finalizers"] = json!(["example.com/hold"]);
    create(&kc, orphan).await;
    set_phase(&kc, "orphan", "Running").await;
    // Never scheduled, and terminating.
    let mut stuck = pod("stuck", None, json!([]));
    stuck["metadata"]["finalizers"] = json!(["example.com/hold"]);
    create(&kc, stuck).await;
    assert!(k(&kc, &["delete", "pod", "stuck", "--wait=false"]).await.ok);

    let started = Instant::now();
    let cm = start_as_service_accounts(&kc, &["podgc"], |cfg| {
        cfg.pod_gc = kumo_controller_manager::controllers::podgc::Settings {
            terminated_pod_gc_threshold: 2,
            check_period: Duration::from_millis(500),
            quarantine: Duration::from_secs(3),
        };
    })
    .await;
    eventually(15, "oldest terminated pods collected", || async {
        (get(&kc, &["pod", "t-d"]).await.is_none() && get(&kc, &["pod", "t-c"]).await.is_none())
            .then_some(())
    })
    .await;
    assert!(get(&kc, &["pod", "t-b"]).await.is_some());
    assert!(get(&kc, &["pod", "t-a"]).await.is_some());
    let stuck = eventually(15, "unscheduled terminating pod failed", || async {
        get(&kc, &["pod", "stuck"])
            .await
            .filter(|p| p["status"]["phase"] == "Failed")
    })
    .await;
    assert!(condition(&stuck, "DisruptionTarget").is_none());
    let orphan = eventually(20, "orphan collected", || async {
        get(&kc, &["pod", "orphan"])
            .await
            .filter(|p| !p["metadata"]["deletionTimestamp"].is_null())
    })
    .await;
    // Not before the quarantine is over.
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert_eq!(orphan["status"]["phase"], "Failed");
    assert_eq!(orphan["metadata"]["deletionGracePeriodSeconds"], 0);
    let c = condition(&orphan, "DisruptionTarget").expect("DisruptionTarget");
    assert_eq!(c["status"], "True");
    assert_eq!(c["reason"], "DeletionByPodGC");
    assert_eq!(c["message"], "PodGC: node no longer exists");
    // Pods on an existing node, still running, stay.
    let running = get(&kc, &["pod", "running"]).await.unwrap();
    assert!(running["metadata"]["deletionTimestamp"].is_null());
    assert_eq!(running["status"]["phase"], "Running");
    for p in ["orphan", "stuck"] {
        let out = k(
            &kc,
            &[
                "patch",
                "pod",
                p,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ],
        )
        .await;
        assert!(out.ok, "{}", out.stderr);
    }
    cm.shutdown().await.unwrap();
}

async fn bare_node(kc: &Path, name: &str, cidr: Option<&str>) {
    let mut n = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
    if let Some(c) = cidr {
        n["spec"] = json!({"podCIDR": c, "podCIDRs": [c]});
    }
    create(kc, n).await;
}

async fn cidr_of(kc: &Path, name: &str) -> Value {
    let what = format!("podCIDR of {name}");
    eventually(15, &what, || async {
        get(kc, &["node", name])
            .await
            .filter(|n| !n["spec"]["podCIDR"].is_null())
    })
    .await["spec"]
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_ipam_hands_out_node_ranges() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    // A node that already has a range: it is taken at start.
    bare_node(&kc, "pre", Some("10.244.2.0/24")).await;
    let cm = start_as_service_accounts(&kc, &["node-ipam-controller"], |cfg| {
        cfg.node_ipam = kumo_controller_manager::controllers::nodeipam::Settings {
            allocate_node_cidrs: true,
            cluster_cidr: "10.244.0.0/22".into(),
            ..Default::default()
        };
    })
    .await;
    for (n, want) in [
        ("a", "10.244.0.0/24"),
        ("b", "10.244.1.0/24"),
        ("c", "10.244.3.0/24"),
    ] {
        bare_node(&kc, n, None).await;
        let spec = cidr_of(&kc, n).await;
        assert_eq!(spec["podCIDR"], want, "{n}");
        assert_eq!(spec["podCIDRs"], json!([want]), "{n}");
    }
    // The range is full: the event, and no CIDR.
    bare_node(&kc, "d", None).await;
    eventually(15, "CIDRNotAvailable event", || async {
        events(&kc, "CIDRNotAvailable").await.into_iter().find(|e| {
            e.0 == "d" && e.1 == "Node d status is now: CIDRNotAvailable" && e.2 == "cidrAllocator"
        })
    })
    .await;
    let ev = get(&kc, &["events", "-n", "default"]).await.unwrap()["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["reason"] == "CIDRNotAvailable")
        .cloned()
        .unwrap();
    assert_eq!(ev["involvedObject"]["kind"], "Node");
    assert_eq!(ev["type"], "Normal");
    assert!(get(&kc, &["node", "d"]).await.unwrap()["spec"]["podCIDR"].is_null());
    // Deleting a frees 10.244.0.0/24; d gets it (its retry, or its next update).
    assert!(k(&kc, &["delete", "node", "a"]).await.ok);
    assert!(k(&kc, &["label", "node", "d", "retry=1"]).await.ok);
    let spec = cidr_of(&kc, "d").await;
    assert_eq!(spec["podCIDR"], "10.244.0.0/24");
    assert_eq!(
        get(&kc, &["node", "pre"]).await.unwrap()["spec"]["podCIDR"],
        "10.244.2.0/24"
    );
    cm.shutdown().await.unwrap();
}
