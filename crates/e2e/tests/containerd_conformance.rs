//! CI's subset of the conformance tests kumo passes on the real runtime
//! (conformance/ci-containerd.txt, out of conformance/kumo-passing-containerd.txt) still
//! pass: `kumo up --runtime containerd` in process, with the e2e images packed offline.
//! A test binary of its own, so that it does not run beside the simulator's checks (two
//! cores).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use kumo_e2e::{conformance_list_passes, listed_in, repo_root, require_reference_binaries, run};

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
    // The cluster DNS pods run the kumo binary (built with the workspace's tests; the
    // image script builds it when missing), not this harness.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let kumo_bin = target.join("debug").join("kumo");
    assert!(kumo_bin.is_file(), "{} missing", kumo_bin.display());
    // Set before the cluster's threads start; nothing else touches the environment then.
    std::env::set_var("KUMO_BINARY", &kumo_bin);
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
    let archives: Vec<std::path::PathBuf> = std::fs::read_dir(&images)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "tar"))
        .collect();
    assert!(archives.len() >= 2, "{archives:?}");
    let loaded = {
        let data = data.clone();
        tokio::task::spawn_blocking(move || kumo::machine::load_image_archives(&data, &archives))
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(loaded.len(), 2, "{loaded:?}");
    let names = listed_in("conformance/ci-containerd.txt");
    assert!(
        names.len() >= 60,
        "CI runs at least 60 tests on the real runtime"
    );
    let kubeconfig = cluster.api.admin_kubeconfig.clone();
    let out_dir = dir.path().join("conformance");
    let list = repo_root().join("conformance/ci-containerd.txt");
    tokio::task::spawn_blocking(move || {
        conformance_list_passes(&list, names.len(), &kubeconfig, &out_dir, 2)
    })
    .await
    .unwrap()
    .unwrap();
}
