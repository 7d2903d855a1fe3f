//! node-lifecycle-controller: a node whose kubelet stopped reporting becomes Unknown with
//! upstream's reason and message and gets the unreachable taints; a Ready node loses the
//! not-ready taint; a cordoned node gets the unschedulable taint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

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
    let at = |secs: i64| {
        k8s_openapi::jiff::Timestamp::now()
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(secs))
            .unwrap()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    for (n, ago) in [("quiet", 120), ("alive", 0)] {
        let patch = format!(
            r#"{{"status":{{"conditions":[{{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status","lastHeartbeatTime":"{t}","lastTransitionTime":"{t}"}}]}}}}"#,
            t = at(ago)
        );
        let out = k(
            &kc,
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
