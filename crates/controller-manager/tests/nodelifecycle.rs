//! node-lifecycle-controller: a node whose kubelet stopped reporting becomes Unknown with
//! upstream's reason and message and gets the unreachable taints; a Ready node loses the
//! not-ready taint; a cordoned node gets the unschedulable taint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

/// Patches node `n`'s status as a kubelet that reported Ready `ago` seconds ago.
async fn reported_ready(kc: &std::path::Path, n: &str, ago: i64) {
    let t = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(ago))
        .unwrap()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let patch = format!(
        r#"{{"status":{{"conditions":[{{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status","lastHeartbeatTime":"{t}","lastTransitionTime":"{t}"}}]}}}}"#
    );
    let out = k(
        kc,
        &[
            "patch",
            "node",
            n,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_nodes_become_unknown_and_tainted() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["*"]).await;
    for n in ["quiet", "alive"] {
        let body = format!(r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{n}"}}}}"#);
        let out = k_in(&kc, &["create", "-f", "-"], Some(&body)).await;
        assert!(out.ok, "{}", out.stderr);
    }
    // "quiet" last reported two minutes ago; "alive" just now.
    for (n, ago) in [("quiet", 120), ("alive", 0)] {
        reported_ready(&kc, n, ago).await;
    }
    let quiet = eventually(20, "quiet node Unknown", || async {
        get(&kc, &["node", "quiet"]).await.filter(|n| {
            n["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "Unknown")
            })
        })
    })
    .await;
    let ready = quiet["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["reason"], "NodeStatusUnknown");
    assert_eq!(ready["message"], "Kubelet stopped posting node status.");
    let tainted = eventually(20, "unreachable taints", || async {
        get(&kc, &["node", "quiet"])
            .await
            .filter(|n| n["spec"]["taints"].as_array().is_some_and(|t| t.len() == 2))
    })
    .await;
    let taints: Vec<String> = tainted["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            format!(
                "{}:{}",
                t["key"].as_str().unwrap(),
                t["effect"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        taints.contains(&"node.kubernetes.io/unreachable:NoSchedule".to_owned()),
        "{taints:?}"
    );
    assert!(
        taints.contains(&"node.kubernetes.io/unreachable:NoExecute".to_owned()),
        "{taints:?}"
    );
    // The live node keeps Ready and loses the not-ready taint it was created with.
    eventually(20, "alive untainted", || async {
        get(&kc, &["node", "alive"])
            .await
            .filter(|n| n["spec"].get("taints").is_none())
    })
    .await;
    // Cordoned: unschedulable.
    assert!(k(&kc, &["cordon", "alive"]).await.ok);
    eventually(20, "unschedulable taint", || async {
        get(&kc, &["node", "alive"]).await.filter(|n| {
            n["spec"]["taints"].as_array().is_some_and(|t| {
                t.iter()
                    .any(|t| t["key"] == "node.kubernetes.io/unschedulable")
            })
        })
    })
    .await;
}

/// `--node-monitor-grace-period` and `--node-startup-grace-period`: a heartbeat 20 s old is
/// fine under the default 50 s but stale under 5 s; a node that never posted status becomes
/// Unknown with upstream's "never posted" reason once the startup grace period is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grace_periods_come_from_the_flags() {
    use kumo_controller_manager::controllers::nodelifecycle::{parse_duration_flag, Settings};
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let mut cfg = cm_config(&kc, &["node-lifecycle-controller"]);
    cfg.node_lifecycle = Settings {
        monitor_period: parse_duration_flag("1s").unwrap(),
        grace_period: parse_duration_flag("5s").unwrap(),
        startup_grace_period: parse_duration_flag("3s").unwrap(),
    };
    let _cm = kumo_controller_manager::ControllerManager::start(cfg)
        .await
        .unwrap();
    for n in ["twenty", "never"] {
        let body = format!(r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{n}"}}}}"#);
        let out = k_in(&kc, &["create", "-f", "-"], Some(&body)).await;
        assert!(out.ok, "{}", out.stderr);
    }
    reported_ready(&kc, "twenty", 20).await;
    let ready_of = |n: &serde_json::Value| {
        n["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
    };
    let twenty = eventually(20, "twenty Unknown", || async {
        get(&kc, &["node", "twenty"])
            .await
            .and_then(|n| ready_of(&n))
            .filter(|c| c["status"] == "Unknown")
    })
    .await;
    assert_eq!(twenty["reason"], "NodeStatusUnknown");
    let never = eventually(20, "never Unknown", || async {
        get(&kc, &["node", "never"])
            .await
            .and_then(|n| ready_of(&n))
            .filter(|c| c["status"] == "Unknown")
    })
    .await;
    assert_eq!(never["reason"], "NodeStatusNeverUpdated");
    assert_eq!(never["message"], "Kubelet never posted node status.");
    // Refused flag values.
    assert!(parse_duration_flag("0s").is_err());
    assert!(parse_duration_flag("-5s").is_err());
    assert_eq!(
        parse_duration_flag("50").unwrap_err(),
        "time: missing unit in duration \"50\""
    );
}
