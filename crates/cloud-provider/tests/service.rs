//! The service controller against the in-process API server and the kumo cloud, driven
//! with the real kubectl.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::collections::BTreeSet;

use common::{eventually, get, k, k_in, Env};
use serde_json::Value;

const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
const EXCLUDE: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// A node with its instance; returns the instance id.
async fn node(env: &Env, name: &str) -> String {
    let i = common::run_instance(env, name, None).await;
    common::register_node(env, name).await;
    i.id
}

/// The Service's events, oldest first.
async fn events(env: &Env, svc: &str) -> Vec<Value> {
    let out = k(
        &env.admin,
        &["get", "events", "-n", "default", "-o", "json"],
    )
    .await;
    let mut evs: Vec<Value> = common::json(&out)["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == svc && e["involvedObject"]["kind"] == "Service")
        .collect();
    evs.sort_by_key(|e| {
        (
            e["firstTimestamp"].as_str().unwrap_or_default().to_owned(),
            e["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    });
    evs
}

fn reasons(evs: &[Value]) -> Vec<String> {
    evs.iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Waits for an event with `reason` on the Service and returns it.
async fn event(env: &Env, svc: &str, reason: &str) -> Value {
    eventually(20, &format!("event {reason} on {svc}"), || async {
        events(env, svc)
            .await
            .into_iter()
            .find(|e| e["reason"] == reason)
    })
    .await
}

async fn svc(env: &Env, name: &str) -> Value {
    get(&env.admin, &["svc", name])
        .await
        .expect("service exists")
}

/// Waits until the Service's status has an ingress point and returns the Service.
async fn wait_ingress(env: &Env, name: &str) -> Value {
    eventually(20, &format!("the ingress of {name}"), || async {
        let s = get(&env.admin, &["svc", name]).await?;
        s["status"]["loadBalancer"]["ingress"][0]["ip"]
            .is_string()
            .then_some(s)
    })
    .await
}

/// The cloud's balancer of the Service with this uid, if any.
async fn cloud_lb(env: &Env, uid: &str) -> Option<kumo_cloud::LoadBalancer> {
    let name: String = std::iter::once('a')
        .chain(uid.chars().filter(|c| *c != '-'))
        .take(32)
        .collect();
    env.cloud_client
        .list_load_balancers()
        .await
        .expect("list load balancers")
        .into_iter()
        .find(|l| l.name == name)
}

fn targets(lb: &kumo_cloud::LoadBalancer) -> BTreeSet<String> {
    lb.targets.iter().map(|t| t.instance_id.clone()).collect()
}

fn finalizers(s: &Value) -> Vec<String> {
    s["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn create(env: &Env, manifest: &str) {
    let out = k_in(&env.admin, &["create", "-f", "-"], Some(manifest)).await;
    assert!(out.ok, "create: {}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn load_balancer_service_gets_a_cloud_balancer_and_follows_the_nodes() {
    let env = common::start().await;
    let a = node(&env, "node-a").await;
    let b = node(&env, "node-b").await;
    // A control-plane node labelled as kubeadm does (empty value: excluded too).
    let cp = node(&env, "cp").await;
    let out = k(&env.admin, &["label", "node", "cp", &format!("{EXCLUDE}=")]).await;
    assert!(out.ok, "{}", out.stderr);
    let ccm = common::start_ccm(&env, &["service"]).await;

    let out = k(
        &env.admin,
        &["create", "service", "loadbalancer", "web", "--tcp=80:8080"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let s = wait_ingress(&env, "web").await;
    let uid = s["metadata"]["uid"].as_str().unwrap().to_owned();
    let node_port = s["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
    assert_eq!(finalizers(&s), [FINALIZER]);

    // The cloud's balancer: a listener per port to the NodePort, the included nodes.
    let lb = cloud_lb(&env, &uid)
        .await
        .expect("the cloud has the balancer");
    let ing = &s["status"]["loadBalancer"]["ingress"][0];
    assert_eq!(ing["ip"], lb.vip.as_str());
    assert!(ing.get("hostname").is_none(), "{ing}");
    assert_eq!(ing["ipMode"], "VIP");
    assert_eq!(lb.listeners.len(), 1);
    assert_eq!(lb.listeners[0].port, 80);
    assert_eq!(lb.listeners[0].protocol, kumo_cloud::Protocol::Tcp);
    assert_eq!(u64::from(lb.listeners[0].target_port), node_port);
    assert_eq!(targets(&lb), BTreeSet::from([a.clone(), b.clone()]));
    assert!(!targets(&lb).contains(&cp));
    assert_eq!(lb.health_check.protocol, "TCP");
    assert_eq!(u64::from(lb.health_check.port), node_port);
    assert_eq!(lb.tags["kubernetes.io/cluster/kubernetes"], "owned");
    assert_eq!(lb.tags["kubernetes.io/service-name"], "default/web");

    // kubectl shows the VIP as EXTERNAL-IP.
    let out = k(&env.admin, &["get", "svc", "web", "--no-headers"]).await;
    assert!(out.ok, "{}", out.stderr);
    let cols: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(cols[3], lb.vip, "EXTERNAL-IP: {}", out.stdout);

    // Events, from the service-controller, in order.
    let evs = events(&env, "web").await;
    let r = reasons(&evs);
    let ensuring = r.iter().position(|x| x == "EnsuringLoadBalancer");
    let ensured = r.iter().position(|x| x == "EnsuredLoadBalancer");
    assert!(
        ensuring.is_some() && ensured.is_some() && ensuring < ensured,
        "{r:?}"
    );
    let e = &evs[ensured.unwrap()];
    assert_eq!(e["message"], "Ensured load balancer");
    assert_eq!(e["type"], "Normal");
    assert_eq!(e["source"]["component"], "service-controller");
    assert_eq!(evs[ensuring.unwrap()]["message"], "Ensuring load balancer");

    // A node joins: the balancer gets it.
    let c = node(&env, "node-c").await;
    let ev = event(&env, "web", "UpdatedLoadBalancer").await;
    assert_eq!(ev["message"], "Updated load balancer with new hosts");
    eventually(10, "node-c as a target", || async {
        let lb = cloud_lb(&env, &uid).await?;
        (targets(&lb) == BTreeSet::from([a.clone(), b.clone(), c.clone()])).then_some(())
    })
    .await;

    // Labelled out: it leaves the balancer.
    let out = k(
        &env.admin,
        &["label", "node", "node-c", &format!("{EXCLUDE}=true")],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(10, "node-c no longer a target", || async {
        let lb = cloud_lb(&env, &uid).await?;
        (targets(&lb) == BTreeSet::from([a.clone(), b.clone()])).then_some(())
    })
    .await;
    // A change that matters syncs again; the unchanged status is not written again.
    let out = k(
        &env.admin,
        &["annotate", "svc", "web", "example.com/x=1", "-o", "json"],
    )
    .await;
    let rv = common::json(&out)["metadata"]["resourceVersion"].clone();
    eventually(20, "a second EnsuredLoadBalancer", || async {
        events(&env, "web")
            .await
            .into_iter()
            .find(|e| e["reason"] == "EnsuredLoadBalancer" && e["count"] == 2)
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(svc(&env, "web").await["metadata"]["resourceVersion"], rv);

    // Deleting the Service deletes the balancer, then the object goes.
    let out = k(&env.admin, &["delete", "svc", "web", "--timeout=20s"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(get(&env.admin, &["svc", "web"]).await.is_none());
    assert!(cloud_lb(&env, &uid).await.is_none());
    // The events are recorded in the background: the last may land after the object goes.
    event(&env, "web", "DeletedLoadBalancer").await;
    let r = reasons(&events(&env, "web").await);
    let deleting = r.iter().position(|x| x == "DeletingLoadBalancer");
    let deleted = r.iter().position(|x| x == "DeletedLoadBalancer");
    assert!(
        deleting.is_some() && deleted.is_some() && deleting < deleted,
        "{r:?}"
    );
    ccm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_load_balancer_class_is_left_to_its_implementation() {
    let env = common::start().await;
    node(&env, "node-a").await;
    let ccm = common::start_ccm(&env, &["service"]).await;
    create(
        &env,
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"other"},
"spec":{"type":"LoadBalancer","loadBalancerClass":"example.com/lb","selector":{"app":"x"},"ports":[{"port":80}]}}"#,
    )
    .await;
    // A Service without a class, created after it, is handled: so the classed one was seen.
    let out = k(
        &env.admin,
        &["create", "service", "loadbalancer", "mine", "--tcp=80:80"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    wait_ingress(&env, "mine").await;
    event(&env, "mine", "EnsuredLoadBalancer").await;
    let s = svc(&env, "other").await;
    assert!(finalizers(&s).is_empty(), "{s}");
    assert_eq!(s["status"], serde_json::json!({"loadBalancer": {}}));
    assert!(events(&env, "other").await.is_empty());
    assert_eq!(
        env.cloud_client.list_load_balancers().await.unwrap().len(),
        1
    );
    ccm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cloud_denial_is_reported_and_retried_until_lifted() {
    let env = common::start().await;
    let a = node(&env, "node-a").await;
    let policy = env
        .cloud_client
        .deny("CreateLoadBalancer", None)
        .await
        .expect("deny");
    let ccm = common::start_ccm(&env, &["service"]).await;
    let out = k(
        &env.admin,
        &["create", "service", "loadbalancer", "web", "--tcp=80:8080"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let ev = event(&env, "web", "SyncLoadBalancerFailed").await;
    assert_eq!(ev["type"], "Warning");
    let msg = ev["message"].as_str().unwrap();
    assert!(
        msg.starts_with("Error syncing load balancer: failed to ensure load balancer: AccessDenied: User: kumo:iam::access-key/"),
        "{msg}"
    );
    assert!(
        msg.contains("is not authorized to perform: kumo:CreateLoadBalancer with an explicit deny"),
        "{msg}"
    );
    assert!(msg.contains(&policy.id), "{msg}");
    // The finalizer comes first; no status until the balancer exists.
    let s = svc(&env, "web").await;
    assert_eq!(finalizers(&s), [FINALIZER]);
    assert_eq!(s["status"], serde_json::json!({"loadBalancer": {}}));
    assert!(env
        .cloud_client
        .list_load_balancers()
        .await
        .unwrap()
        .is_empty());

    // Lifted: the retry (5 s after the first failure) succeeds.
    env.cloud_client
        .delete_policy(&policy.id)
        .await
        .expect("lift");
    let s = wait_ingress(&env, "web").await;
    event(&env, "web", "EnsuredLoadBalancer").await;
    let lb = cloud_lb(&env, s["metadata"]["uid"].as_str().unwrap())
        .await
        .expect("balancer");
    assert_eq!(targets(&lb), BTreeSet::from([a]));
    let r = reasons(&events(&env, "web").await);
    let failed = r.iter().position(|x| x == "SyncLoadBalancerFailed");
    let ensured = r.iter().position(|x| x == "EnsuredLoadBalancer");
    assert!(failed < ensured, "{r:?}");

    // A denied deletion keeps the Service (the finalizer) until the balancer can go.
    let policy = env
        .cloud_client
        .deny("DeleteLoadBalancer", None)
        .await
        .expect("deny");
    let out = k(&env.admin, &["delete", "svc", "web", "--wait=false"]).await;
    assert!(out.ok, "{}", out.stderr);
    let ev = eventually(20, "the failed deletion", || async {
        events(&env, "web").await.into_iter().find(|e| {
            e["reason"] == "SyncLoadBalancerFailed"
                && e["message"].as_str().is_some_and(|m| {
                    m.starts_with(
                    "Error syncing load balancer: failed to delete load balancer: AccessDenied: ",
                )
                })
        })
    })
    .await;
    assert_eq!(ev["type"], "Warning");
    let s = svc(&env, "web").await;
    assert!(s["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(finalizers(&s), [FINALIZER]);
    assert!(cloud_lb(&env, s["metadata"]["uid"].as_str().unwrap())
        .await
        .is_some());
    env.cloud_client
        .delete_policy(&policy.id)
        .await
        .expect("lift");
    eventually(20, "the Service gone", || async {
        get(&env.admin, &["svc", "web"])
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert!(env
        .cloud_client
        .list_load_balancers()
        .await
        .unwrap()
        .is_empty());
    ccm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn local_traffic_policy_checks_health_and_cluster_ip_cleans_up() {
    let env = common::start().await;
    node(&env, "node-a").await;
    let ccm = common::start_ccm(&env, &["service"]).await;
    create(
        &env,
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"local"},
"spec":{"type":"LoadBalancer","externalTrafficPolicy":"Local","selector":{"app":"x"},
"ports":[{"name":"dns","port":53,"protocol":"UDP"},{"name":"http","port":80,"protocol":"TCP"}]}}"#,
    )
    .await;
    let s = wait_ingress(&env, "local").await;
    let uid = s["metadata"]["uid"].as_str().unwrap().to_owned();
    let hc_port = s["spec"]["healthCheckNodePort"]
        .as_u64()
        .expect("healthCheckNodePort");
    let lb = cloud_lb(&env, &uid).await.expect("balancer");
    assert_eq!(lb.health_check.protocol, "HTTP");
    assert_eq!(u64::from(lb.health_check.port), hc_port);
    assert_eq!(lb.health_check.path.as_deref(), Some("/healthz"));
    let protos: Vec<(u16, kumo_cloud::Protocol)> =
        lb.listeners.iter().map(|l| (l.port, l.protocol)).collect();
    assert_eq!(
        protos,
        [
            (53, kumo_cloud::Protocol::Udp),
            (80, kumo_cloud::Protocol::Tcp)
        ]
    );

    // Type ClusterIP: the balancer, the finalizer and the ingress go.
    let out = k(
        &env.admin,
        &[
            "patch",
            "svc",
            "local",
            "--type=merge",
            "-p",
            r#"{"spec":{"type":"ClusterIP","externalTrafficPolicy":null}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    event(&env, "local", "DeletedLoadBalancer").await;
    let s = eventually(20, "the cleanup", || async {
        let s = get(&env.admin, &["svc", "local"]).await?;
        (finalizers(&s).is_empty() && s["status"]["loadBalancer"]["ingress"].is_null()).then_some(s)
    })
    .await;
    assert_eq!(s["spec"]["type"], "ClusterIP");
    assert!(cloud_lb(&env, &uid).await.is_none());
    let r = reasons(&events(&env, "local").await);
    assert!(r.contains(&"DeletingLoadBalancer".to_owned()), "{r:?}");
    ccm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn no_nodes_is_a_warning_and_the_first_node_is_added() {
    let env = common::start().await;
    let ccm = common::start_ccm(&env, &["service"]).await;
    let out = k(
        &env.admin,
        &["create", "service", "loadbalancer", "web", "--tcp=80:8080"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let ev = event(&env, "web", "UnAvailableLoadBalancer").await;
    assert_eq!(ev["type"], "Warning");
    assert_eq!(
        ev["message"],
        "There are no available nodes for LoadBalancer"
    );
    let s = wait_ingress(&env, "web").await;
    let uid = s["metadata"]["uid"].as_str().unwrap().to_owned();
    assert!(targets(&cloud_lb(&env, &uid).await.expect("balancer")).is_empty());
    let a = node(&env, "node-a").await;
    event(&env, "web", "UpdatedLoadBalancer").await;
    let lb = cloud_lb(&env, &uid).await.expect("balancer");
    assert_eq!(targets(&lb), BTreeSet::from([a]));
    ccm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_retried_after_the_cloud_says_without_backing_off() {
    let env = common::start().await;
    node(&env, "node-a").await;
    let fault = kumo_cloud::Fault {
        error_rate: 1.0,
        error_code: "RequestLimitExceeded".into(),
        ..Default::default()
    };
    env.cloud_client
        .set_fault("CreateLoadBalancer", &fault)
        .await
        .expect("fault");
    let ccm = common::start_ccm(&env, &["service"]).await;
    let out = k(
        &env.admin,
        &["create", "service", "loadbalancer", "web", "--tcp=80:8080"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    // Retry-After is 1 s: three failures well before the 5 s first back-off step.
    let started = std::time::Instant::now();
    let ev = eventually(20, "three throttled attempts", || async {
        events(&env, "web")
            .await
            .into_iter()
            .find(|e| e["reason"] == "SyncLoadBalancerFailed" && e["count"].as_i64() >= Some(3))
    })
    .await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let msg = ev["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "Error syncing load balancer: failed to ensure load balancer: RequestLimitExceeded: "
        ),
        "{msg}"
    );
    env.cloud_client.clear_faults(None).await.expect("clear");
    wait_ingress(&env, "web").await;
    ccm.shutdown().await.unwrap();
}
