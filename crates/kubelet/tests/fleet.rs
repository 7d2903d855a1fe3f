//! `kumo kubelet --sim-nodes N`: many whole kubelets in one process over one connection
//! pool, each speaking as its own node through impersonation. Driven with the real kubectl
//! against an in-process API server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{k, until, until_within};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use kumo_kubelet::KubeletConfig;

const NODES: usize = 20;

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx"}]},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sim_nodes_run_as_their_own_nodes() {
    let (server, dir) = common::start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    let mut cfg = KubeletConfig::new(&admin, "sim");
    cfg.runtime = Some(kumo_sim::factory(None));
    cfg.status_update_frequency = std::time::Duration::from_secs(1);
    tokio::spawn(kumo_kubelet::fleet::run(cfg, NODES));

    // Every node registers, turns Ready and holds its own lease.
    until_within(
        60,
        &admin,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
        ],
        "all nodes Ready",
        |o| o.lines().filter(|l| *l == "True").count() == NODES,
    )
    .await;
    let mut want = kumo_kubelet::fleet::node_names("sim", NODES);
    want.sort_unstable();
    let want = want.join(" ");
    until(
        &admin,
        &[
            "get",
            "leases",
            "-n",
            "kube-node-lease",
            "-o",
            "jsonpath={range .items[*]}{.spec.holderIdentity}{\"\\n\"}{end}",
        ],
        "one lease per node, held by it",
        |o| {
            let mut holders: Vec<&str> = o.lines().collect();
            holders.sort_unstable();
            holders.join(" ") == want
        },
    )
    .await;

    // Renewals are updates of the Lease each node created once (upstream's lease
    // controller), not a create that conflicts and a patch.
    tokio::time::sleep(
        kumo_kubelet::node::LEASE_RENEW_INTERVAL + std::time::Duration::from_secs(2),
    )
    .await;
    let (_, metrics, _) = k(&admin, &["get", "--raw", "/metrics"]).await;
    let requests = |verb: &str, code: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("apiserver_request_total{"))
            .filter(|l| {
                l.contains("resource=\"leases\"") && l.contains(&format!("verb=\"{verb}\""))
            })
            .filter(|l| l.contains(&format!("code=\"{code}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert_eq!(requests("POST", "201"), NODES as u64, "one create per node");
    assert_eq!(requests("POST", "409"), 0, "no create of an existing lease");
    assert!(
        requests("PUT", "200") >= NODES as u64,
        "each node renewed by an update"
    );

    // A pod bound to one node is run by that node's kubelet, and only by it. (No
    // controller-manager runs here: the default service account is made by hand.)
    common::default_service_account(&admin, dir.path()).await;
    let pods: Api<Pod> = Api::namespaced(server_client(&admin).await, "default");
    pods.create(&PostParams::default(), &pod("on-7", "sim-7"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("on-12", "sim-12"))
        .await
        .unwrap();
    for p in ["on-7", "on-12"] {
        until(
            &admin,
            &["get", "pod", p, "-o", "jsonpath={.status.phase}"],
            "pod Running",
            |o| o == "Running",
        )
        .await;
    }
    // Events are posted by the recorder's own task, so the Started event may trail
    // the Running status: wait for it, then check which node wrote it.
    let hosts = until(
        &admin,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=on-7,reason=Started",
            "-o",
            "jsonpath={.items[*].source.host}",
        ],
        "the Started event of on-7",
        |o| !o.is_empty(),
    )
    .await;
    assert_eq!(hosts, "sim-7");
    // The node's own field-selected list (what its reflector reads) holds its pod only.
    let (_, names, _) = k(
        &admin,
        &[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=sim-12",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(names.trim(), "pod/on-12");

    // Each node has its node's rights only: NodeRestriction stops sim-0 from changing
    // sim-1 and from creating a pod that is not its mirror pod.
    let base = server_client(&admin).await;
    let as_sim0 = kumo_kubelet::fleet::node_client(&base, "sim-0").unwrap();
    let nodes: Api<Node> = Api::all(as_sim0.clone());
    let err = nodes
        .patch(
            "sim-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("node \"sim-0\" is not allowed to modify node \"sim-1\""),
        "{err}"
    );
    let err = Api::<Pod>::namespaced(as_sim0, "default")
        .create(&PostParams::default(), &pod("sneaky", "sim-0"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("pod does not have \"kubernetes.io/config.mirror\" annotation, node \"sim-0\" can only create mirror pods"),
        "{err}"
    );
}

async fn server_client(kc: &std::path::Path) -> kube::Client {
    kumo_kubelet::client(kc).await.unwrap()
}
