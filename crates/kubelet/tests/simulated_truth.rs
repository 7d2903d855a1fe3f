//! What the simulated runtime does with a pod's containers, observed with kubectl as a
//! user would: init containers take their command's time and exit code, native sidecars
//! run beside the containers and stop after them, deletion waits for the preStop hook
//! within the grace period, and a command the simulator has no model of is said so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{create, k, until_within};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_simulated_runtime_runs_what_it_is_given_and_says_what_it_cannot() {
    let (server, dir) = common::start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    common::default_service_account(&admin, dir.path()).await;
    common::start_serving_kubelet(dir.path(), &admin, "h1").await;
    common::node_ready(&admin, "h1").await;

    // An init container that fails after 2 s: it fails then, not at once, and is
    // restarted (restartPolicy Always → the init container's OnFailure).
    let created = Instant::now();
    create(&admin, dir.path(), "initfail", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: initfail\nspec:\n  nodeName: h1\n  initContainers:\n  - name: init\n    image: busybox\n    command: [sh, -c, 'sleep 2; exit 1']\n  containers:\n  - name: main\n    image: busybox\n    command: [sh, -c, 'sleep 3600']\n").await;
    let failed = until_within(
        20,
        &admin,
        &["get", "pod", "initfail", "-o", "jsonpath={.status.initContainerStatuses[0].restartCount} {.status.initContainerStatuses[0].lastState.terminated.exitCode}"],
        "the init container failed",
        |o| o.starts_with("1 1") || o.starts_with("2 1"),
    )
    .await;
    assert!(
        created.elapsed() >= Duration::from_secs(2),
        "{failed} after {:?}",
        created.elapsed()
    );
    let (_, table, err) = k(&admin, &["get", "pod", "initfail", "--no-headers"]).await;
    assert!(table.contains("Init:"), "{table} {err}");

    // A native sidecar runs beside the container: both count as ready and running.
    create(&admin, dir.path(), "sidecar", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sidecar\nspec:\n  nodeName: h1\n  initContainers:\n  - name: log\n    image: busybox\n    restartPolicy: Always\n    command: [sh, -c, 'while true; do echo tick; sleep 1; done']\n  containers:\n  - name: main\n    image: busybox\n    command: [sh, -c, 'sleep 3600']\n").await;
    until_within(
        20,
        &admin,
        &["get", "pod", "sidecar", "--no-headers"],
        "the pod with a sidecar runs",
        |o| o.contains(" 2/2 ") && o.contains("Running"),
    )
    .await;
    let (_, sidecar_state, _) = k(&admin, &["get", "pod", "sidecar", "-o", "jsonpath={.status.initContainerStatuses[0].started} {.status.initContainerStatuses[0].state.running.startedAt}"]).await;
    assert!(sidecar_state.starts_with("true 20"), "{sidecar_state}");
    let (_, logs, err) = k(&admin, &["logs", "sidecar", "-c", "log"]).await;
    assert!(logs.contains("tick"), "{logs} {err}");

    // A pod that runs once: its container finishes, then its sidecar is stopped (SIGTERM
    // ignored by `sleep` as PID 1: killed at the end of the 2 s grace period), then the
    // pod succeeds.
    create(&admin, dir.path(), "once", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: once\nspec:\n  nodeName: h1\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 2\n  initContainers:\n  - name: log\n    image: busybox\n    restartPolicy: Always\n    command: [sh, -c, 'sleep 3600']\n  containers:\n  - name: main\n    image: busybox\n    command: [sh, -c, 'sleep 1; echo done']\n").await;
    let running_seen = until_within(
        20,
        &admin,
        &[
            "get",
            "pod",
            "once",
            "-o",
            "jsonpath={.status.phase} {.status.initContainerStatuses[0].state.running.startedAt}",
        ],
        "the sidecar runs",
        |o| o.starts_with("Running 20") || o.starts_with("Succeeded"),
    )
    .await;
    assert!(running_seen.starts_with("Running"), "{running_seen}");
    let done = until_within(
        30,
        &admin,
        &["get", "pod", "once", "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].state.terminated.exitCode} {.status.initContainerStatuses[0].state.terminated.exitCode}"],
        "the pod succeeds once its sidecar stopped",
        |o| o.starts_with("Succeeded") || o.starts_with("Failed"),
    )
    .await;
    assert_eq!(done, "Succeeded 0 137");
    let (_, table, _) = k(&admin, &["get", "pod", "once", "--no-headers"]).await;
    assert!(table.contains("Completed"), "{table}");

    // Deletion waits for the preStop hook (5 s) within the grace period (10 s).
    create(&admin, dir.path(), "prestop", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: prestop\nspec:\n  nodeName: h1\n  terminationGracePeriodSeconds: 10\n  containers:\n  - name: main\n    image: registry.k8s.io/e2e-test-images/agnhost:2.55\n    args: [pause]\n    lifecycle:\n      preStop:\n        exec:\n          command: [sh, -c, 'sleep 5']\n").await;
    until_within(
        20,
        &admin,
        &["get", "pod", "prestop", "-o", "jsonpath={.status.phase}"],
        "runs",
        |o| o == "Running",
    )
    .await;
    let deleting = Instant::now();
    let (ok, _, err) = k(&admin, &["delete", "pod", "prestop", "--timeout=60s"]).await;
    assert!(ok, "{err}");
    let took = deleting.elapsed();
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(12),
        "{took:?}"
    );

    // A command the simulator has no model of: it runs, and the pod is told so once.
    create(&admin, dir.path(), "py", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: py\nspec:\n  nodeName: h1\n  containers:\n  - name: py\n    image: python:3.12\n    command: [python, -c, 'print(1)']\n").await;
    let warned = until_within(
        20,
        &admin,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=py,reason=NotSimulated",
            "-o",
            "jsonpath={range .items[*]}{.type} {.count} {.message}{\"\\n\"}{end}",
        ],
        "the NotSimulated warning",
        |o| !o.trim().is_empty(),
    )
    .await;
    assert_eq!(warned.trim().lines().count(), 1, "{warned}");
    assert!(
        warned.starts_with("Warning 1 The simulated runtime cannot run \"python -c print(1)\" of image \"python:3.12\""),
        "{warned}"
    );
}
