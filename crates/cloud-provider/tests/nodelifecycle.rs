//! The cloud node-lifecycle controller against a real API server and kumo cloud, through
//! kubectl: terminated instances lose their (NotReady) nodes, stopped ones get the
//! shutdown taint until they are Ready again.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::path::Path;
use std::time::Duration;

use common::{eventually, get, k};
use kumo_cloud::InstanceState;
use serde_json::Value;

const SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";

fn shutdown_taint(node: &Value) -> Option<Value> {
    node["spec"]["taints"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == SHUTDOWN)
        .cloned()
}

async fn wait_state(env: &common::Env, id: &str, state: InstanceState) {
    env.cloud_client
        .wait_for_instance_state(id, state, Duration::from_secs(10))
        .await
        .expect("instance state");
}

/// Both controllers, looking at nodes every 200 ms.
async fn start_ccm(env: &common::Env) -> kumo_cloud_provider::ccm::CloudControllerManager {
    let mut cfg = common::ccm_config(env, &["cloud-node", "cloud-node-lifecycle"]);
    cfg.node_monitor_period = Duration::from_millis(200);
    common::start_ccm_with(env, cfg).await
}

async fn wait_provider_id(admin: &Path, name: &str) {
    eventually(20, &format!("{name} initialized"), || async {
        let n = get(admin, &["node", name]).await?;
        n["spec"]["providerID"].as_str().map(|_| ())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_not_ready_node_whose_instance_is_gone_is_deleted() {
    let env = common::start().await;
    let a = common::run_instance(&env, "node-a", None).await;
    common::run_instance(&env, "node-b", None).await;
    common::register_node(&env, "node-a").await;
    common::register_node(&env, "node-b").await;
    // Registered, but no instance of that name ever existed.
    common::register_node(&env, "ghost").await;
    let ccm = start_ccm(&env).await;
    wait_provider_id(&env.admin, "node-a").await;
    wait_provider_id(&env.admin, "node-b").await;

    env.cloud_client.terminate_instance(&a.id).await.unwrap();
    wait_state(&env, &a.id, InstanceState::Terminated).await;
    // While Ready, a node is left alone, instance or not; a NotReady node whose instance
    // runs is not deleted either.
    common::set_ready(&env.admin, "node-b", false).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for name in ["node-a", "node-b", "ghost"] {
        let n = get(&env.admin, &["node", name]).await;
        assert!(n.is_some(), "{name} was deleted");
    }
    assert!(shutdown_taint(&get(&env.admin, &["node", "node-b"]).await.unwrap()).is_none());

    let uid = get(&env.admin, &["node", "node-a"]).await.unwrap()["metadata"]["uid"].clone();
    common::set_ready(&env.admin, "node-a", false).await;
    common::set_ready(&env.admin, "ghost", false).await;
    for name in ["node-a", "ghost"] {
        eventually(10, &format!("{name} deleted"), || async {
            let out = k(&env.admin, &["get", "node", name]).await;
            (!out.ok && out.stderr.contains("NotFound")).then_some(())
        })
        .await;
    }
    assert!(get(&env.admin, &["node", "node-b"]).await.is_some());

    let events = get(&env.admin, &["events", "-n", "default"]).await.unwrap();
    let deleting: Vec<&Value> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "DeletingNode")
        .collect();
    assert_eq!(deleting.len(), 2, "{deleting:?}");
    let e = deleting
        .iter()
        .find(|e| e["involvedObject"]["name"] == "node-a")
        .expect("node-a's event");
    assert_eq!(
        e["message"],
        "Deleting node node-a because it does not exist in the cloud provider"
    );
    assert_eq!(e["type"], "Normal");
    assert_eq!(e["involvedObject"]["kind"], "Node");
    assert_eq!(e["involvedObject"]["uid"], uid);
    assert_eq!(e["source"]["component"], "cloud-node-lifecycle-controller");
    let out = k(&env.admin, &["get", "events", "-n", "default"]).await;
    assert!(
        out.stdout
            .contains("Deleting node ghost because it does not exist in the cloud provider"),
        "{}",
        out.stdout
    );
    ccm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_instance_taints_its_not_ready_node_until_it_is_ready_again() {
    let env = common::start().await;
    let s = common::run_instance(&env, "node-s", None).await;
    common::register_node(&env, "node-s").await;
    let ccm = start_ccm(&env).await;
    wait_provider_id(&env.admin, "node-s").await;

    env.cloud_client.stop_instance(&s.id).await.unwrap();
    wait_state(&env, &s.id, InstanceState::Stopped).await;
    // Still Ready: no taint.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let n = get(&env.admin, &["node", "node-s"]).await.unwrap();
    assert!(shutdown_taint(&n).is_none(), "{n}");

    common::set_ready(&env.admin, "node-s", false).await;
    let taint = eventually(10, "the shutdown taint", || async {
        shutdown_taint(&get(&env.admin, &["node", "node-s"]).await?)
    })
    .await;
    assert_eq!(
        taint,
        serde_json::json!({"key": SHUTDOWN, "effect": "NoSchedule"})
    );
    // Stopped, not gone: the node stays.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let n = get(&env.admin, &["node", "node-s"])
        .await
        .expect("node kept");
    let count = n["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["key"] == SHUTDOWN)
        .count();
    assert_eq!(count, 1, "{n}");

    // Running again but not yet Ready: the taint stays until the node is Ready.
    env.cloud_client.start_instance(&s.id).await.unwrap();
    wait_state(&env, &s.id, InstanceState::Running).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(shutdown_taint(&get(&env.admin, &["node", "node-s"]).await.unwrap()).is_some());
    common::set_ready(&env.admin, "node-s", true).await;
    eventually(10, "the shutdown taint removed", || async {
        let n = get(&env.admin, &["node", "node-s"]).await?;
        shutdown_taint(&n).is_none().then_some(())
    })
    .await;
    let n = get(&env.admin, &["node", "node-s"]).await.unwrap();
    assert!(n["spec"]["providerID"].is_string());
    ccm.shutdown().await.unwrap();
}
