//! What the kubelet publishes about its node besides the Node: the CSINode (no drivers,
//! owned by the Node), and the node events of its start and of later changes (cordon,
//! Ready coming back after the node controller marked it Unknown), in upstream's words.
//! Driven with the real kubectl against an in-process API server, the kubelet with its
//! own node identity.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{k, node_kubeconfig, until};
use kumo_kubelet::KubeletConfig;

/// `reason: message` of the events about node `node`, one a line, oldest first.
async fn node_events(kc: &Path, node: &str) -> String {
    let (_, out, _) = k(
        kc,
        &[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            &format!("involvedObject.kind=Node,involvedObject.name={node}"),
            "--sort-by",
            "{.metadata.creationTimestamp}",
            "-o",
            "jsonpath={range .items[*]}{.reason}: {.message} uid={.involvedObject.uid} count={.count}{\"\\n\"}{end}",
        ],
    )
    .await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn csinode_and_node_events() {
    let (server, dir) = common::start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    let mut kcfg = KubeletConfig::new(node_kubeconfig(dir.path(), &admin, "n1"), "n1");
    kcfg.runtime = Some(kumo_sim::factory(None));
    kcfg.status_update_frequency = Duration::from_millis(500);
    common::spawn_kubelet(kcfg);
    until(
        &admin,
        &["get", "node", "n1", "-o", "jsonpath={.metadata.uid}"],
        "node registered",
        |o| !o.is_empty(),
    )
    .await;
    let (_, uid, _) = k(
        &admin,
        &["get", "node", "n1", "-o", "jsonpath={.metadata.uid}"],
    )
    .await;

    // The CSINode: what seed 001 asks of it, and upstream's shape.
    until(
        &admin,
        &["get", "csinodes", "n1", "-o", "name"],
        "CSINode",
        |o| o.trim() == "csinode.storage.k8s.io/n1",
    )
    .await;
    let (ok, drivers, err) = k(
        &admin,
        &[
            "get",
            "csinodes",
            "n1",
            "-o",
            "jsonpath={.spec.drivers[*].name}",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(drivers, "");
    let (_, csi, _) = k(&admin, &["get", "csinodes", "n1", "-o", "json"]).await;
    let csi: serde_json::Value = serde_json::from_str(&csi).unwrap();
    assert_eq!(
        csi["metadata"]["ownerReferences"],
        serde_json::json!([{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": uid}])
    );
    assert_eq!(csi["spec"]["drivers"], serde_json::json!([]));
    assert_eq!(
        csi["metadata"]["annotations"]["storage.alpha.kubernetes.io/migrated-plugins"],
        "kubernetes.io/aws-ebs,kubernetes.io/azure-disk,kubernetes.io/azure-file,kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/portworx-volume,kubernetes.io/vsphere-volume"
    );

    // The start.
    let deadline = Instant::now() + Duration::from_secs(20);
    let events = loop {
        let e = node_events(&admin, "n1").await;
        if e.contains("NodeReady") || Instant::now() > deadline {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for line in [
        format!("Starting: Starting kubelet. uid={uid}"),
        format!(
            "NodeHasSufficientMemory: Node n1 status is now: NodeHasSufficientMemory uid={uid}"
        ),
        format!("NodeHasNoDiskPressure: Node n1 status is now: NodeHasNoDiskPressure uid={uid}"),
        format!("NodeHasSufficientPID: Node n1 status is now: NodeHasSufficientPID uid={uid}"),
        "NodeAllocatableEnforced: Updated Node Allocatable limit across pods uid=".to_owned(),
        format!("NodeReady: Node n1 status is now: NodeReady uid={uid}"),
    ] {
        let want = format!("{line} count=1");
        assert!(events.lines().any(|l| l == want), "{want:?} in\n{events}");
    }

    // Cordon and uncordon: the kubelet reports both.
    let (ok, _, err) = k(&admin, &["cordon", "n1"]).await;
    assert!(ok, "{err}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !node_events(&admin, "n1")
        .await
        .contains("NodeNotSchedulable: Node n1 status is now: NodeNotSchedulable")
    {
        assert!(Instant::now() < deadline, "no NodeNotSchedulable");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (ok, _, err) = k(&admin, &["uncordon", "n1"]).await;
    assert!(ok, "{err}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !node_events(&admin, "n1")
        .await
        .contains("NodeSchedulable: Node n1 status is now: NodeSchedulable")
    {
        assert!(Instant::now() < deadline, "no NodeSchedulable");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The node controller marks the node Unknown; the kubelet's next status makes it
    // Ready again and says so (the recorder counts the repeat on the first event).
    let (ok, _, err) = k(
        &admin,
        &[
            "patch", "node", "n1", "--subresource=status", "--type=strategic", "-p",
            r#"{"status":{"conditions":[{"type":"Ready","status":"Unknown","reason":"NodeStatusUnknown","message":"Kubelet stopped posting node status."}]}}"#,
        ],
    )
    .await;
    assert!(ok, "{err}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let e = node_events(&admin, "n1").await;
        if e.lines().any(|l| {
            l.starts_with("NodeReady: Node n1 status is now: NodeReady") && l.ends_with(" count=2")
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "one NodeReady more expected:\n{e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    until(
        &admin,
        &[
            "get",
            "node",
            "n1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        "Ready again",
        |o| o == "True",
    )
    .await;
}
