//! Ephemeral containers (`kubectl debug`) run by the kubelet in the sim runtime and
//! reported in status.ephemeralContainerStatuses, and in-place resize (the sim applies a
//! pod's new resources at once), against an in-process API server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{k, node_kubeconfig, until};
use kumo_kubelet::KubeletConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_debug_runs_an_ephemeral_container_and_resize_applies() {
    let (server, dir) = common::start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    let mut kcfg = KubeletConfig::new(node_kubeconfig(dir.path(), &admin, "w1"), "w1");
    kcfg.runtime = Some(kumo_sim::factory(None));
    kcfg.status_update_frequency = Duration::from_secs(1);
    common::spawn_kubelet(kcfg);
    common::default_service_account(&admin, dir.path()).await;
    let pod = dir.path().join("web.yaml");
    std::fs::write(
        &pod,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  nodeName: w1\n  containers:\n  - name: c\n    image: nginx:1.29\n    resources:\n      requests: {cpu: 100m, memory: 64Mi}\n      limits: {cpu: 500m, memory: 128Mi}\n",
    )
    .unwrap();
    let (ok, _, err) = k(&admin, &["create", "-f", pod.to_str().unwrap()]).await;
    assert!(ok, "{err}");
    until(
        &admin,
        &["get", "pod", "web", "-o", "jsonpath={.status.phase}"],
        "pod Running",
        |o| o == "Running",
    )
    .await;

    // A debug container that keeps running, and one that exits at once.
    let (ok, _, err) = k(
        &admin,
        &[
            "debug",
            "pod/web",
            "--image=busybox",
            "--target=c",
            "--container=dbg",
            "--",
            "sleep",
            "3600",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let (ok, _, err) = k(
        &admin,
        &[
            "debug",
            "pod/web",
            "--image=busybox",
            "--container=once",
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let out = until(
        &admin,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={range .status.ephemeralContainerStatuses[*]}{.name}={.ready}/{.state.running.startedAt}/{.state.terminated.exitCode};{end}",
        ],
        "ephemeral container statuses",
        |o| {
            o.contains("dbg=false/2") && o.contains("once=false//3;")
        },
    )
    .await;
    assert_eq!(out.matches(';').count(), 2, "{out}");
    // They leave the pod's readiness and its own containers alone.
    let (_, ready, _) = k(
        &admin,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.phase} {.status.conditions[?(@.type==\"Ready\")].status} {.status.containerStatuses[0].restartCount}",
        ],
    )
    .await;
    assert_eq!(ready, "Running True 0");
    // The exited one is not started again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, restarts, _) = k(
        &admin,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.ephemeralContainerStatuses[?(@.name==\"once\")].restartCount} {.status.ephemeralContainerStatuses[?(@.name==\"once\")].state.terminated.exitCode}",
        ],
    )
    .await;
    assert_eq!(restarts, "0 3");

    // The running container reports its resources, so the API server accepts a resize
    // (upstream refuses one for running containers without them), which then shows.
    let (_, reported, _) = k(
        &admin,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.containerStatuses[0].resources.requests.cpu} {.status.containerStatuses[0].allocatedResources.memory}",
        ],
    )
    .await;
    assert_eq!(reported, "100m 64Mi");
    let (ok, _, err) = k(
        &admin,
        &[
            "patch",
            "pod",
            "web",
            "--subresource",
            "resize",
            "--patch",
            r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"200m"}}}]}}"#,
        ],
    )
    .await;
    assert!(ok, "{err}");
    until(
        &admin,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.containerStatuses[0].resources.requests.cpu} {.status.containerStatuses[0].allocatedResources.cpu} {.status.observedGeneration} {.metadata.generation}",
        ],
        "resize applied",
        |o| {
            let f: Vec<&str> = o.split(' ').collect();
            f.len() == 4 && f[0] == "200m" && f[1] == "200m" && f[2] == f[3]
        },
    )
    .await;
}
