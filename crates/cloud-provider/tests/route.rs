//! The route controller against a real API server and kumo cloud, through kubectl: a route
//! per node podCIDR in the VPC's main route table, NetworkUnavailable=False/RouteCreated,
//! stale routes of the cluster deleted and foreign ones left alone, and a cloud failure
//! as a FailedToCreateRoute event with NetworkUnavailable=True until the cloud heals.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::path::Path;
use std::time::Duration;

use common::{eventually, get, k};
use kumo_cloud::{CreateRouteRequest, Route, RouteState};
use serde_json::Value;

/// Only the route controller, reconciling every 300 ms.
async fn start_ccm(env: &common::Env) -> kumo_cloud_provider::ccm::CloudControllerManager {
    let mut cfg = common::ccm_config(env, &["route"]);
    cfg.route_reconciliation_period = Duration::from_millis(300);
    common::start_ccm_with(env, cfg).await
}

/// Sets the node's pod CIDR as node-ipam does.
async fn set_pod_cidr(admin: &Path, name: &str, cidr: &str) {
    let patch = format!(r#"{{"spec":{{"podCIDR":"{cidr}","podCIDRs":["{cidr}"]}}}}"#);
    let out = k(admin, &["patch", "node", name, "-p", &patch]).await;
    assert!(out.ok, "patch node {name}: {}", out.stderr);
}

async fn routes(env: &common::Env) -> Vec<Route> {
    env.cloud_client
        .main_route_table()
        .await
        .expect("route table")
        .routes
}

fn route_to<'a>(routes: &'a [Route], cidr: &str) -> Option<&'a Route> {
    routes.iter().find(|r| r.destination_cidr == cidr)
}

fn network_unavailable(node: &Value) -> Option<Value> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "NetworkUnavailable")
        .cloned()
}

/// The NetworkUnavailable condition once it has `status` and `reason`.
async fn wait_condition(admin: &Path, name: &str, status: &str, reason: &str) -> Value {
    eventually(
        20,
        &format!("{name} NetworkUnavailable={status}/{reason}"),
        || async {
            let c = network_unavailable(&get(admin, &["node", name]).await?)?;
            (c["status"] == status && c["reason"] == reason).then_some(c)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn routes_follow_the_nodes_pod_cidrs() {
    let env = common::start().await;
    let a = common::run_instance(&env, "node-a", None).await;
    let b = common::run_instance(&env, "node-b", None).await;
    common::register_node(&env, "node-a").await;
    common::register_node(&env, "node-b").await;
    set_pod_cidr(&env.admin, "node-a", "10.244.1.0/24").await;
    set_pod_cidr(&env.admin, "node-b", "10.244.2.0/24").await;
    let table = env.cloud_client.main_route_table().await.unwrap().id;
    let add = |cidr: &str, name: &str, description: &str| CreateRouteRequest {
        destination_cidr: cidr.into(),
        instance_id: a.id.clone(),
        name: name.into(),
        description: description.into(),
    };
    // Someone else's route outside the cluster CIDR, another cluster's route inside it,
    // and a route this cluster made for a node that is no more.
    for req in [
        add("192.168.50.0/24", "vpn", "by hand"),
        add(
            "10.244.200.0/24",
            "other-uid",
            "Kubernetes cluster other: pods of node x",
        ),
        add(
            "10.244.9.0/24",
            "kubernetes-old-uid",
            "Kubernetes cluster kubernetes: pods of node gone",
        ),
    ] {
        env.cloud_client.create_route(&table, &req).await.unwrap();
    }

    let ccm = start_ccm(&env).await;
    eventually(20, "a route per pod CIDR, the stale one gone", || async {
        let r = routes(&env).await;
        let ok = route_to(&r, "10.244.1.0/24").is_some_and(|r| r.instance_id == a.id)
            && route_to(&r, "10.244.2.0/24").is_some_and(|r| r.instance_id == b.id)
            && route_to(&r, "10.244.9.0/24").is_none();
        ok.then_some(())
    })
    .await;
    let r = routes(&env).await;
    let ra = route_to(&r, "10.244.1.0/24").unwrap();
    assert_eq!(ra.state, RouteState::Active);
    let uid_a = get(&env.admin, &["node", "node-a"]).await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(ra.name, format!("kubernetes-{uid_a}"));
    assert_eq!(
        ra.description,
        "Kubernetes cluster kubernetes: pods of node node-a"
    );
    // Not the cluster's: left alone.
    assert!(route_to(&r, "192.168.50.0/24").is_some());
    assert!(route_to(&r, "10.244.200.0/24").is_some());

    for name in ["node-a", "node-b"] {
        let c = wait_condition(&env.admin, name, "False", "RouteCreated").await;
        assert_eq!(c["message"], "RouteController created a route");
        assert_eq!(c["lastHeartbeatTime"], c["lastTransitionTime"]);
    }
    // Already so: not written again on the next passes.
    let before = network_unavailable(&get(&env.admin, &["node", "node-a"]).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = network_unavailable(&get(&env.admin, &["node", "node-a"]).await.unwrap());
    assert_eq!(before, after);

    // A deleted node's route goes; the other stays.
    let out = k(&env.admin, &["delete", "node", "node-b"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(20, "node-b's route deleted", || async {
        route_to(&routes(&env).await, "10.244.2.0/24")
            .is_none()
            .then_some(())
    })
    .await;
    let r = routes(&env).await;
    assert!(route_to(&r, "10.244.1.0/24").is_some());
    assert!(route_to(&r, "192.168.50.0/24").is_some());

    // A terminated instance turns its route into a blackhole, which is deleted; the node
    // keeps asking for one, which the cloud refuses now.
    env.cloud_client.terminate_instance(&a.id).await.unwrap();
    eventually(20, "node-a's blackholed route deleted", || async {
        route_to(&routes(&env).await, "10.244.1.0/24")
            .is_none()
            .then_some(())
    })
    .await;
    let c = wait_condition(&env.admin, "node-a", "True", "NoRouteCreated").await;
    assert_eq!(c["message"], "RouteController failed to create a route");
    ccm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cloud_failure_is_an_event_and_network_unavailable_until_the_cloud_heals() {
    let env = common::start().await;
    common::run_instance(&env, "node-c", None).await;
    common::register_node(&env, "node-c").await;
    set_pod_cidr(&env.admin, "node-c", "10.244.3.0/24").await;
    let uid = get(&env.admin, &["node", "node-c"]).await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    env.cloud_client.deny("CreateRoute", None).await.unwrap();

    let ccm = start_ccm(&env).await;
    let ev = eventually(20, "FailedToCreateRoute event", || async {
        let v = get(&env.admin, &["events", "-n", "default"]).await?;
        v["items"]
            .as_array()?
            .iter()
            .find(|e| e["reason"] == "FailedToCreateRoute")
            .cloned()
    })
    .await;
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["source"]["component"], "route_controller");
    assert_eq!(ev["involvedObject"]["kind"], "Node");
    assert_eq!(ev["involvedObject"]["name"], "node-c");
    assert_eq!(ev["involvedObject"]["uid"], uid.as_str());
    let msg = ev["message"].as_str().unwrap();
    let prefix = format!("Could not create route {uid} 10.244.3.0/24 for node node-c after ");
    assert!(msg.starts_with(&prefix), "{msg}");
    assert!(
        msg.contains("is not authorized to perform: kumo:CreateRoute"),
        "the cloud's message: {msg}"
    );
    let c = wait_condition(&env.admin, "node-c", "True", "NoRouteCreated").await;
    assert_eq!(c["message"], "RouteController failed to create a route");
    assert!(route_to(&routes(&env).await, "10.244.3.0/24").is_none());
    // Retried every period: another event (the message names the time taken, so the
    // events differ).
    eventually(20, "a second FailedToCreateRoute event", || async {
        let v = get(&env.admin, &["events", "-n", "default"]).await?;
        let n = v["items"]
            .as_array()?
            .iter()
            .filter(|e| e["reason"] == "FailedToCreateRoute")
            .count();
        (n >= 2).then_some(())
    })
    .await;

    // The cloud heals: the route appears and the condition turns (a second later at least,
    // so that the transition time, in seconds, differs).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    env.cloud_client.allow("CreateRoute", None).await.unwrap();
    eventually(20, "node-c's route", || async {
        route_to(&routes(&env).await, "10.244.3.0/24").map(|_| ())
    })
    .await;
    let healed = wait_condition(&env.admin, "node-c", "False", "RouteCreated").await;
    assert_eq!(healed["message"], "RouteController created a route");
    assert_ne!(healed["lastTransitionTime"], c["lastTransitionTime"]);
    ccm.shutdown().await.unwrap();
}
