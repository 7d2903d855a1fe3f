//! Container lifecycle hooks on the kubelet with a simulated pod network, observed as
//! the e2e tests observe them: the postStart and preStop hooks of one pod reach an
//! agnhost netexec pod, whose log shows their requests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use common::{create, k, node_kubeconfig, until_within};
use kumo_kubelet::server::ServerConfig;
use kumo_kubelet::KubeletConfig;

const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.55";

async fn running(admin: &std::path::Path, name: &str) -> String {
    until_within(
        30,
        admin,
        &[
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.status.phase} {.status.podIP}",
        ],
        "pod runs",
        |o| o.starts_with("Running ") && o.len() > "Running ".len(),
    )
    .await
    .trim_start_matches("Running ")
    .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn post_start_and_pre_stop_hooks_reach_their_targets() {
    let (server, dir) = common::start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    common::default_service_account(&admin, dir.path()).await;
    let mut kcfg = KubeletConfig::new(node_kubeconfig(dir.path(), &admin, "h1"), "h1");
    kcfg.status_update_frequency = Duration::from_secs(1);
    kcfg.runtime = Some(kumo_sim::factory(Some(Arc::new(
        kumo_sim::net::Dataplane::default(),
    ))));
    kcfg.server = Some(ServerConfig {
        address: Ipv4Addr::LOCALHOST.into(),
        port: 0,
        client_ca_file: Some(dir.path().join("pki").join("ca.crt")),
        ..Default::default()
    });
    common::spawn_kubelet(kcfg);
    common::node_ready(&admin, "h1").await;

    create(&admin, dir.path(), "handler", &format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: handler\nspec:\n  nodeName: h1\n  containers:\n  - name: c\n    image: {AGNHOST}\n    args: [netexec]\n"
    ))
    .await;
    let target = running(&admin, "handler").await;
    // An exec postStart hook, and an httpGet preStop hook that asks the pod's own netexec
    // sidecar to dial the handler (as the conformance tests do).
    let request = "/dial?host={target}&port=8080&request=echo%3Fmsg%3Dprestop";
    create(&admin, dir.path(), "hooked", &format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hooked\nspec:\n  nodeName: h1\n  terminationGracePeriodSeconds: 1\n  initContainers:\n  - name: sidecar\n    image: {AGNHOST}\n    args: [netexec]\n    restartPolicy: Always\n  containers:\n  - name: c\n    image: {AGNHOST}\n    args: [pause]\n    lifecycle:\n      postStart:\n        exec:\n          command: [sh, -c, 'curl http://{target}:8080/echo?msg=poststart']\n      preStop:\n        httpGet:\n          path: '{}'\n          port: 8080\n",
        request.replace("{target}", &target)
    ))
    .await;
    running(&admin, "hooked").await;
    let logs = ["logs", "handler"];
    until_within(20, &admin, &logs, "the postStart request", |o| {
        o.contains("GET /echo?msg=poststart&code=")
    })
    .await;
    let (ok, _, err) = k(&admin, &["delete", "pod", "hooked", "--wait=false"]).await;
    assert!(ok, "{err}");
    until_within(20, &admin, &logs, "the preStop request", |o| {
        o.contains("GET /echo?msg=prestop&code=")
    })
    .await;
}
