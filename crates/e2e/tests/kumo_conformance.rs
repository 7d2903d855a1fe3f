//! The conformance tests kumo is recorded as passing (conformance/kumo-passing.txt) still
//! pass against the cluster `kumo up` runs (API server, controller-manager, scheduler and
//! a kubelet, in process): no regressions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kumo_e2e::{conformance_list_passes, listed_in, repo_root, require_reference_binaries};

fn listed() -> Vec<String> {
    listed_in("conformance/kumo-passing.txt")
}

/// The tests that need two schedulable nodes (conformance/kumo-passing-multinode.txt) pass
/// on `kumo up --nodes 2`: the cloud's control-plane instance (tainted) and two workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recorded_multinode_conformance_tests_still_pass_on_kumo() {
    require_reference_binaries(&["e2e.test"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = kumo::cluster::ClusterConfig::with_cloud(dir.path().join("kumo"));
    cfg.port = 0;
    if let Some(c) = cfg.cloud.as_mut() {
        c.workers = 2;
    }
    let cluster = kumo::cluster::start(cfg).await.unwrap();
    let nodes = cluster.node_names();
    cluster
        .wait_nodes_ready(&nodes, std::time::Duration::from_secs(60), |_| {})
        .await
        .unwrap();
    let kubeconfig = cluster.api.admin_kubeconfig.clone();
    let out_dir = dir.path().join("conformance");
    let list = repo_root().join("conformance/kumo-passing-multinode.txt");
    let count = listed_in("conformance/kumo-passing-multinode.txt").len();
    tokio::task::spawn_blocking(move || {
        conformance_list_passes(&list, count, &kubeconfig, &out_dir, 1)
    })
    .await
    .unwrap()
    .unwrap();
}

/// The simulator's recorded tests, less those CI runs on the real runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recorded_conformance_tests_still_pass_on_kumo() {
    require_reference_binaries(&["e2e.test"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = kumo::cluster::ClusterConfig::new(dir.path().join("kumo"));
    cfg.port = 0;
    cfg.node_name = "kumo-e2e".into();
    let cluster = kumo::cluster::start(cfg).await.unwrap();
    let kubeconfig = cluster.api.admin_kubeconfig.clone();
    let out_dir = dir.path().join("conformance");
    let on_containerd: std::collections::HashSet<String> =
        listed_in("conformance/ci-containerd.txt")
            .into_iter()
            .collect();
    let names: Vec<String> = listed()
        .into_iter()
        .filter(|n| !on_containerd.contains(n))
        .collect();
    let list = dir.path().join("sim-list.txt");
    std::fs::write(&list, names.join("\n") + "\n").unwrap();
    // Four ginkgo processes ([Serial] tests still run alone, at the end): most of a
    // test's time is spent waiting (timeouts, intervals), so two cores keep up with four
    // (at two, the list took 15 of CI's 60 minutes at a load of about 1).
    let count = names.len();
    tokio::task::spawn_blocking(move || {
        conformance_list_passes(&list, count, &kubeconfig, &out_dir, 4)
    })
    .await
    .unwrap()
    .unwrap();
}
