//! The cloud node controller against a real API server and kumo cloud, through kubectl.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::path::Path;
use std::time::Duration;

use common::{eventually, get, k};
use serde_json::{json, Value};

const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";

fn has_taint(node: &Value, key: &str) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["key"] == key))
}

/// The node once the controller has removed the taint and written addresses.
async fn initialized(admin: &Path, name: &str, secs: u64) -> Value {
    eventually(secs, &format!("{name} initialized"), || async {
        let n = get(admin, &["node", name]).await?;
        let done = !has_taint(&n, UNINITIALIZED)
            && n["status"]["addresses"]
                .as_array()
                .is_some_and(|a| !a.is_empty());
        done.then_some(n)
    })
    .await
}

/// The events about node `name` (in `default`, where events of nodes go).
async fn node_events(admin: &Path, name: &str) -> Vec<Value> {
    let all = get(admin, &["events", "-n", "default"]).await.unwrap();
    all["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["name"] == name && e["involvedObject"]["kind"] == "Node")
        .cloned()
        .collect()
}

async fn annotate_node_ip(admin: &Path, name: &str, ip: &str) {
    let out = k(
        admin,
        &[
            "annotate",
            "--overwrite",
            "node",
            name,
            &format!("alpha.kubernetes.io/provided-node-ip={ip}"),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn uninitialized_node_gets_cloud_metadata_and_loses_the_taint() {
    let env = common::start().await;
    let inst = common::run_instance(&env, "node-a", Some("kumo-1b")).await;
    common::register_node(&env, "node-a").await;
    // A taint of someone else's stays.
    let out = k(
        &env.admin,
        &["taint", "node", "node-a", "example.com/keep=yes:NoSchedule"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let ccm = common::start_ccm(&env, &["cloud-node"]).await;

    let n = initialized(&env.admin, "node-a", 20).await;
    assert_eq!(
        n["spec"]["providerID"],
        format!("kumo://kumo-1b/{}", inst.id)
    );
    let taints = n["spec"]["taints"].as_array().unwrap();
    assert!(
        taints
            .contains(&json!({"key": "example.com/keep", "value": "yes", "effect": "NoSchedule"})),
        "{taints:?}"
    );
    assert!(!inst.private_ip.is_empty() && !inst.private_dns_name.is_empty());
    assert_eq!(
        n["status"]["addresses"],
        json!([
            {"type": "InternalIP", "address": inst.private_ip},
            {"type": "InternalDNS", "address": inst.private_dns_name},
            {"type": "Hostname", "address": inst.private_dns_name},
        ])
    );
    let labels = &n["metadata"]["labels"];
    assert_eq!(labels["topology.kubernetes.io/zone"], "kumo-1b");
    assert_eq!(labels["failure-domain.beta.kubernetes.io/zone"], "kumo-1b");
    assert_eq!(
        labels["topology.kubernetes.io/region"],
        inst.region.as_str()
    );
    assert_eq!(
        labels["failure-domain.beta.kubernetes.io/region"],
        inst.region.as_str()
    );
    assert_eq!(inst.region, "kumo-1");
    assert_eq!(
        labels["node.kubernetes.io/instance-type"],
        inst.instance_type.as_str()
    );
    assert_eq!(
        labels["beta.kubernetes.io/instance-type"],
        inst.instance_type.as_str()
    );
    // The kubelet's labels are kept.
    assert_eq!(labels["kubernetes.io/hostname"], "node-a");

    let events = eventually(10, "the Synced event", || async {
        let ev = node_events(&env.admin, "node-a").await;
        (!ev.is_empty()).then_some(ev)
    })
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e["reason"], "Synced");
    assert_eq!(e["message"], "Node synced successfully");
    assert_eq!(e["type"], "Normal");
    assert_eq!(e["source"]["component"], "cloud-node-controller");
    // The kubectl view users read.
    let out = k(&env.admin, &["get", "events", "-n", "default"]).await;
    assert!(
        out.stdout.contains("Synced") && out.stdout.contains("Node synced successfully"),
        "{}",
        out.stdout
    );
    ccm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provided_node_ip_the_cloud_does_not_report_or_a_missing_instance_keeps_the_taint() {
    let env = common::start().await;
    let b = common::run_instance(&env, "node-b", None).await;
    common::run_instance(&env, "node-c", None).await;
    common::register_node(&env, "node-b").await;
    common::register_node(&env, "node-c").await;
    common::register_node(&env, "ghost").await;
    annotate_node_ip(&env.admin, "node-b", "10.99.0.1").await;
    let ccm = common::start_ccm(&env, &["cloud-node"]).await;

    // node-c shows the controller works; the others stay as they are.
    initialized(&env.admin, "node-c", 20).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["node-b", "ghost"] {
        let n = get(&env.admin, &["node", name]).await.unwrap();
        assert!(has_taint(&n, UNINITIALIZED), "{name}: {n}");
        assert!(n["spec"]["providerID"].is_null(), "{name}: {n}");
        assert!(n["status"]["addresses"].is_null(), "{name}: {n}");
        assert!(
            node_events(&env.admin, name).await.is_empty(),
            "{name} has events"
        );
    }

    // The kubelet's real node IP: initialized, that address first.
    annotate_node_ip(&env.admin, "node-b", &b.private_ip).await;
    let n = initialized(&env.admin, "node-b", 20).await;
    assert_eq!(
        n["status"]["addresses"][0],
        json!({"type": "InternalIP", "address": b.private_ip})
    );
    assert_eq!(n["status"]["addresses"].as_array().unwrap().len(), 3);
    assert_eq!(
        n["spec"]["providerID"],
        format!("kumo://{}/{}", b.zone, b.id)
    );

    // The instance shows up later: the rate-limited retries find it.
    let g = common::run_instance(&env, "ghost", Some("kumo-1c")).await;
    let n = initialized(&env.admin, "ghost", 40).await;
    assert_eq!(n["spec"]["providerID"], format!("kumo://kumo-1c/{}", g.id));
    ccm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn addresses_are_refreshed_and_ga_labels_reconciled() {
    let env = common::start().await;
    let inst = common::run_instance(&env, "node-r", None).await;
    common::register_node(&env, "node-r").await;
    // An initialized node from before the GA labels: only the beta zone label.
    common::node(
        &env.admin,
        "old",
        "2",
        "4Gi",
        &[("failure-domain.beta.kubernetes.io/zone", "kumo-1c")],
        "",
    )
    .await;
    let mut cfg = common::ccm_config(&env, &["cloud-node"]);
    cfg.node_status_update_frequency = Duration::from_millis(300);
    let ccm = common::start_ccm_with(&env, cfg).await;
    initialized(&env.admin, "node-r", 20).await;

    eventually(10, "the GA zone label", || async {
        let n = get(&env.admin, &["node", "old"]).await?;
        (n["metadata"]["labels"]["topology.kubernetes.io/zone"] == "kumo-1c").then_some(())
    })
    .await;

    // Someone overwrites the addresses: the next refresh puts the cloud's back.
    let patch = r#"{"status":{"addresses":[{"type":"InternalIP","address":"192.0.2.1"}]}}"#;
    let out = k(
        &env.admin,
        &[
            "patch",
            "node",
            "node-r",
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(10, "the cloud's addresses again", || async {
        let n = get(&env.admin, &["node", "node-r"]).await?;
        (n["status"]["addresses"][0]["address"] == inst.private_ip.as_str()
            && n["status"]["addresses"].as_array()?.len() == 3)
            .then_some(())
    })
    .await;
    ccm.shutdown().await.unwrap();
}
