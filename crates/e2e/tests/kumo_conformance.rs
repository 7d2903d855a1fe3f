//! The conformance tests kumo is recorded as passing (conformance/kumo-passing.txt) still
//! pass against the cluster `kumo up` runs (API server, controller-manager, scheduler and
//! a kubelet, in process): no regressions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use kumo_e2e::{repo_root, require_reference_binaries, run};

/// Names listed in a passing list (comments and blank lines skipped).
fn listed_in(file: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

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
    let out = tokio::task::spawn_blocking(move || {
        run(Command::new(repo_root().join("scripts/conformance"))
            .arg("--list")
            .arg(&list)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--out")
            .arg(&out_dir))
        .unwrap()
    })
    .await
    .unwrap();
    let names = listed_in("conformance/kumo-passing-multinode.txt");
    let last = out.stdout.lines().last().unwrap_or("").to_owned();
    assert!(
        out.status.success(),
        "a recorded test regressed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        last.starts_with(&format!("{} passed, 0 failed", names.len())),
        "{last}"
    );
}

/// Takes a cluster's node machines down when the test ends, passed or not.
struct Machines(std::path::PathBuf);

impl Drop for Machines {
    fn drop(&mut self) {
        kumo::machine::power_off_all(&self.0);
    }
}

/// CI's subset of the tests that pass on the real runtime (conformance/ci-containerd.txt)
/// passes on `kumo up --runtime containerd` with one worker, the e2e images packed offline
/// (scripts/test-images) and loaded into the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recorded_containerd_conformance_tests_still_pass_on_kumo() {
    require_reference_binaries(&["e2e.test", "agnhost"]).unwrap();
    kumo_node::prerequisites().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    let built = tokio::task::spawn_blocking({
        let images = images.clone();
        move || {
            run(Command::new(repo_root().join("scripts/test-images"))
                .arg("build")
                .arg("--dir")
                .arg(&images))
            .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(built.status.success(), "{}\n{}", built.stdout, built.stderr);
    let data = dir.path().join("kumo");
    let mut cfg = kumo::cluster::ClusterConfig::with_cloud(&data);
    cfg.port = 0;
    cfg.runtime = kumo::machine::RuntimeKind::Containerd;
    let _machines = Machines(data.clone());
    let cluster = kumo::cluster::start(cfg).await.unwrap();
    let nodes = cluster.node_names();
    cluster
        .wait_nodes_ready(&nodes, std::time::Duration::from_secs(60), |_| {})
        .await
        .unwrap();
    let archive = images.join("agnhost.tar");
    let loaded = {
        let data = data.clone();
        tokio::task::spawn_blocking(move || kumo::machine::load_image_archives(&data, &[archive]))
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(loaded.len(), 2, "{loaded:?}");
    let kubeconfig = cluster.api.admin_kubeconfig.clone();
    let out_dir = dir.path().join("conformance");
    let list = repo_root().join("conformance/ci-containerd.txt");
    let out = tokio::task::spawn_blocking(move || {
        run(Command::new(repo_root().join("scripts/conformance"))
            .arg("--list")
            .arg(&list)
            .arg("--parallel")
            .arg("2")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--out")
            .arg(&out_dir))
        .unwrap()
    })
    .await
    .unwrap();
    let names = listed_in("conformance/ci-containerd.txt");
    assert!(
        names.len() >= 60,
        "CI runs at least 60 tests on the real runtime"
    );
    let last = out.stdout.lines().last().unwrap_or("").to_owned();
    assert!(
        out.status.success(),
        "a recorded test regressed on containerd:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        last.starts_with(&format!("{} passed, 0 failed", names.len())),
        "{last}"
    );
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
    let out = tokio::task::spawn_blocking(move || {
        run(Command::new(repo_root().join("scripts/conformance"))
            .arg("--list")
            .arg(&list)
            // Two ginkgo processes ([Serial] tests still run alone, at the end): the list
            // grows with every controller, and CI has two cores.
            .arg("--parallel")
            .arg("2")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--out")
            .arg(&out_dir))
        .unwrap()
    })
    .await
    .unwrap();
    let last = out.stdout.lines().last().unwrap_or("").to_owned();
    assert!(
        out.status.success(),
        "a recorded test regressed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        last.starts_with(&format!("{} passed, 0 failed", names.len())),
        "{last}"
    );
}
