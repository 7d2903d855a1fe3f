//! The scheduler against an in-process API server, driven with the real kubectl.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

const CP_TAINT: &str = r#"[{"key":"node-role.kubernetes.io/control-plane","effect":"NoSchedule"}]"#;

fn cpu(name: &str, cpu: &str) -> serde_json::Value {
    json!({"spec": {"containers": [{"name": name, "image": "nginx", "resources": {"requests": {"cpu": cpu}}}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binds_pods_spread_by_least_allocated() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    node(&kc, "w1", "2", "4Gi", &[], "").await;
    node(&kc, "w2", "2", "4Gi", &[], "").await;
    let s = start_scheduler(&kc, false).await;

    pod(&kc, "a", cpu("a", "500m")).await;
    let first = eventually(20, "a bound", || async { node_of(&kc, "a").await }).await;
    pod(&kc, "b", cpu("b", "500m")).await;
    let second = eventually(20, "b bound", || async { node_of(&kc, "b").await }).await;
    // LeastAllocated prefers the emptier node.
    assert_ne!(first, second);

    let out = k(&kc, &["get", "pod", "a", "-o", "wide"]).await;
    assert!(out.ok, "{}", out.stderr);
    let row = out.stdout.lines().nth(1).unwrap();
    assert!(row.split_whitespace().any(|c| c == first), "{row}");

    let notes = eventually(10, "Scheduled event", || async {
        let n = event_notes(&kc, "a", "Scheduled").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(
        notes,
        [format!("Successfully assigned default/a to {first}")]
    );
    let ev = json(&k(&kc, &["get", "events.events.k8s.io", "-o", "json"]).await);
    let ev = ev["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["reason"] == "Scheduled")
        .unwrap()
        .clone();
    assert_eq!(ev["reportingController"], "default-scheduler");
    assert_eq!(ev["action"], "Binding");
    assert_eq!(ev["type"], "Normal");
    let cond = get(&kc, &["pod", "a"]).await.unwrap()["status"]["conditions"].clone();
    assert!(
        cond.as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "PodScheduled" && c["status"] == "True"),
        "{cond}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unschedulable_pods_get_upstreams_message_and_are_requeued() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    node(&kc, "cp", "2", "4Gi", &[], CP_TAINT).await;
    node(&kc, "w1", "2", "4Gi", &[], "").await;
    node(&kc, "w2", "2", "4Gi", &[], "").await;
    let s = start_scheduler(&kc, false).await;

    // More cpu than any node has: preemption cannot help anywhere.
    pod(&kc, "big", cpu("big", "3")).await;
    let want = "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 Insufficient cpu. \
                preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.";
    let notes = eventually(20, "FailedScheduling for big", || async {
        let n = event_notes(&kc, "big", "FailedScheduling").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(notes[0], want);
    let p = get(&kc, &["pod", "big"]).await.unwrap();
    assert_eq!(p["status"]["phase"], "Pending");
    let c = p["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "PodScheduled")
        .unwrap()
        .clone();
    assert_eq!(
        (
            c["status"].as_str(),
            c["reason"].as_str(),
            c["message"].as_str()
        ),
        (Some("False"), Some("Unschedulable"), Some(want))
    );

    // A nodeSelector no node matches yet.
    pod(
        &kc,
        "sel",
        json!({"spec": {"nodeSelector": {"disk": "ssd"}}}),
    )
    .await;
    let notes = eventually(20, "FailedScheduling for sel", || async {
        let n = event_notes(&kc, "sel", "FailedScheduling").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(
        notes[0],
        "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 node(s) didn't match Pod's node affinity/selector. \
         preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    );

    // Labelling a node (a node update) requeues the pod, which then fits there.
    assert!(k(&kc, &["label", "node", "w2", "disk=ssd"]).await.ok);
    let n = eventually(20, "sel bound after the label", || async {
        node_of(&kc, "sel").await
    })
    .await;
    assert_eq!(n, "w2");

    // A new node that is large enough takes the big pod (node add).
    node(&kc, "w3", "4", "8Gi", &[], "").await;
    let n = eventually(20, "big bound after the node came", || async {
        node_of(&kc, "big").await
    })
    .await;
    assert_eq!(n, "w3");

    // A toleration lets a pod onto the tainted node; a required node affinity on its name
    // (matchFields) forces it there.
    pod(
        &kc,
        "tol",
        json!({"spec": {
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["cp"]}]}
            ]}}}
        }}),
    )
    .await;
    let n = eventually(20, "tol bound", || async { node_of(&kc, "tol").await }).await;
    assert_eq!(n, "cp");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_port_conflicts_and_full_nodes_find_no_victims() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    node(&kc, "cp", "2", "4Gi", &[], CP_TAINT).await;
    node(&kc, "w1", "2", "4Gi", &[], "").await;
    node(&kc, "w2", "2", "4Gi", &[], "").await;
    let s = start_scheduler(&kc, false).await;
    let hp = |n: &str| json!({"spec": {"containers": [{"name": n, "image": "nginx", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}});
    pod(&kc, "hp1", hp("hp1")).await;
    pod(&kc, "hp2", hp("hp2")).await;
    let a = eventually(20, "hp1 bound", || async { node_of(&kc, "hp1").await }).await;
    let b = eventually(20, "hp2 bound", || async { node_of(&kc, "hp2").await }).await;
    assert_ne!(a, b, "one host port per node");
    pod(&kc, "hp3", hp("hp3")).await;
    let notes = eventually(20, "FailedScheduling for hp3", || async {
        let n = event_notes(&kc, "hp3", "FailedScheduling").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(
        notes[0],
        "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 node(s) didn't have free ports for the requested pod ports. \
         preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod."
    );
    // Deleting an assigned pod (force: no kubelet here to finish a graceful delete) frees its port; the pending pod is requeued and bound.
    assert!(
        k(
            &kc,
            &["delete", "pod", "hp1", "--grace-period=0", "--force"]
        )
        .await
        .ok
    );
    let n = eventually(30, "hp3 bound after hp1 went", || async {
        node_of(&kc, "hp3").await
    })
    .await;
    assert_eq!(n, a);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_does_not_bind_while_the_lease_is_held() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    node(&kc, "w1", "2", "4Gi", &[], "").await;
    let mut first = start_scheduler(&kc, true).await;
    tokio::time::timeout(Duration::from_secs(20), first.wait_leading())
        .await
        .expect("first leads");
    let lease = get(&kc, &["lease", "-n", "kube-system", "kube-scheduler"])
        .await
        .unwrap();
    assert_eq!(
        lease["spec"]["holderIdentity"].as_str(),
        Some(first.identity.as_str())
    );
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 15);
    // The leader stops without releasing the lease; a standby must wait it out.
    first.shutdown().await.unwrap();
    let second = start_scheduler(&kc, true).await;
    pod(&kc, "p", json!({})).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!second.is_leader());
    assert_eq!(
        node_of(&kc, "p").await,
        None,
        "bound while another instance held the lease"
    );
    let n = eventually(40, "p bound by the new leader", || async {
        node_of(&kc, "p").await
    })
    .await;
    assert_eq!(n, "w1");
    assert!(second.is_leader());
    second.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inter_pod_affinity_and_topology_spread() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    node(&kc, "cp", "2", "4Gi", &[("zone", "a")], CP_TAINT).await;
    node(&kc, "w1", "2", "4Gi", &[("zone", "a")], "").await;
    node(&kc, "w2", "2", "4Gi", &[("zone", "b")], "").await;
    let s = start_scheduler(&kc, false).await;

    // Required anti-affinity per hostname: one pod per schedulable node, the third waits.
    let anti = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"affinity": {"podAntiAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
    ]}}}});
    for p in ["aa1", "aa2"] {
        pod(&kc, p, anti.clone()).await;
        eventually(20, p, || async { node_of(&kc, p).await }).await;
    }
    assert_ne!(node_of(&kc, "aa1").await, node_of(&kc, "aa2").await);
    pod(&kc, "aa3", anti.clone()).await;
    let notes = eventually(20, "FailedScheduling for aa3", || async {
        let n = event_notes(&kc, "aa3", "FailedScheduling").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(
        notes[0],
        "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 node(s) didn't match pod anti-affinity rules. \
         preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod."
    );

    // Spread over zones with maxSkew 1: two pods per zone.
    let spread = json!({"metadata": {"labels": {"app": "s"}}, "spec": {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "s"}}}
    ]}});
    let mut zones = Vec::new();
    for p in ["s1", "s2", "s3", "s4"] {
        pod(&kc, p, spread.clone()).await;
        let n = eventually(20, p, || async { node_of(&kc, p).await }).await;
        zones.push(if n == "w2" { "b" } else { "a" });
    }
    zones.sort();
    assert_eq!(zones, ["a", "a", "b", "b"]);

    // Required affinity to pods that do not exist yet: pending until one is bound in a zone.
    pod(
        &kc,
        "af",
        json!({"spec": {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}
        ]}}}}),
    )
    .await;
    let notes = eventually(20, "FailedScheduling for af", || async {
        let n = event_notes(&kc, "af", "FailedScheduling").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(
        notes[0],
        "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 node(s) didn't match pod affinity rules. \
         preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    );
    pod(
        &kc,
        "db",
        json!({"metadata": {"labels": {"app": "db"}}, "spec": {"nodeName": "w2"}}),
    )
    .await;
    let n = eventually(20, "af bound next to db", || async {
        node_of(&kc, "af").await
    })
    .await;
    assert_eq!(n, "w2");
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_priority_pod_preempts_a_lower_one() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    node(&kc, "cp", "2", "4Gi", &[], CP_TAINT).await;
    node(&kc, "w1", "2", "4Gi", &[], "").await;
    for (name, value) in [("low", "100"), ("high", "1000")] {
        let out = k(
            &kc,
            &["create", "priorityclass", name, &format!("--value={value}")],
        )
        .await;
        assert!(out.ok, "{}", out.stderr);
    }
    let s = start_scheduler(&kc, false).await;
    let with = |class: &str| {
        json!({"spec": {"priorityClassName": class, "containers": [
            {"name": "c", "image": "nginx", "resources": {"requests": {"cpu": "1500m"}}}
        ]}})
    };
    pod(&kc, "low1", with("low")).await;
    eventually(20, "low1 bound", || async { node_of(&kc, "low1").await }).await;

    // A pod of the same priority cannot preempt: no victims.
    pod(&kc, "low2", with("low")).await;
    let notes = eventually(20, "FailedScheduling for low2", || async {
        let n = event_notes(&kc, "low2", "FailedScheduling").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(
        notes[0],
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint(s). \
         preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling."
    );

    pod(&kc, "hi", with("high")).await;
    let notes = eventually(20, "FailedScheduling for hi", || async {
        let n = event_notes(&kc, "hi", "FailedScheduling").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(
        notes[0],
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint(s). \
         preemption: found a potential placement for pod on node w1, preempting 1 victims"
    );
    let hi = eventually(20, "hi nominated", || async {
        let p = get(&kc, &["pod", "hi"]).await?;
        (p["status"]["nominatedNodeName"] == "w1").then_some(p)
    })
    .await;
    let uid = hi["metadata"]["uid"].as_str().unwrap().to_owned();
    let victim = eventually(20, "low1 being deleted", || async {
        let p = get(&kc, &["pod", "low1"]).await?;
        p["metadata"]["deletionTimestamp"].is_string().then_some(p)
    })
    .await;
    let cond = victim["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .unwrap()
        .clone();
    assert_eq!(cond["reason"], "PreemptionByScheduler");
    assert_eq!(
        cond["message"],
        "default-scheduler: preempting to accommodate a higher priority pod"
    );
    let notes = eventually(20, "Preempted event", || async {
        let n = event_notes(&kc, "low1", "Preempted").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(notes, [format!("Preempted by pod {uid} on node w1")]);

    // No kubelet here finishes the graceful delete; once the victim is gone, hi binds.
    assert!(
        k(
            &kc,
            &["delete", "pod", "low1", "--grace-period=0", "--force"]
        )
        .await
        .ok
    );
    let n = eventually(30, "hi bound", || async { node_of(&kc, "hi").await }).await;
    assert_eq!(n, "w1");
    assert_eq!(node_of(&kc, "low2").await, None);
    s.shutdown().await.unwrap();
}
