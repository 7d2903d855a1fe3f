//! Ephemeral containers (`kubectl debug`) run by the kubelet in the sim runtime and
//! reported in status.ephemeralContainerStatuses, and in-place resize (the sim applies a
//! pod's new resources at once), against an in-process API server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kumo_apiserver::{pki, ApiServer, ApiServerConfig};
use kumo_kubelet::KubeletConfig;

async fn k(kc: &Path, args: &[&str]) -> (bool, String, String) {
    let kc = kc.to_owned();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new("kubectl")
            .args(&args)
            .env("KUBECONFIG", &kc)
            .output()
            .expect("kubectl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// Polls `kubectl args` until its stdout satisfies `ok` (20 s).
async fn until(kc: &Path, args: &[&str], what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, out, err) = k(kc, args).await;
        if ok(&out) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: last output {out:?} {err}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn node_kubeconfig(data_dir: &Path, admin: &Path, node: &str) -> PathBuf {
    let ca = pki::Ca::load_or_create(&data_dir.join("pki")).unwrap();
    let cert = ca
        .issue_client(&format!("system:node:{node}"), &["system:nodes"])
        .unwrap();
    let server = std::fs::read_to_string(admin)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_owned))
        .unwrap();
    let path = data_dir.join(format!("kubelet-{node}.conf"));
    std::fs::write(
        &path,
        pki::kubeconfig(
            "kumo",
            &server,
            &ca.cert_pem,
            &format!("system:node:{node}"),
            &cert,
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_debug_runs_an_ephemeral_container_and_resize_applies() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ApiServerConfig::new(dir.path());
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let server = ApiServer::start(cfg).await.unwrap();
    let admin = server.admin_kubeconfig.clone();
    let mut kcfg = KubeletConfig::new(node_kubeconfig(dir.path(), &admin, "w1"), "w1");
    kcfg.status_update_frequency = Duration::from_secs(1);
    tokio::spawn(async move {
        if let Err(e) = kumo_kubelet::run(kcfg).await {
            panic!("kubelet: {e}");
        }
    });
    let (ok, _, err) = k(&admin, &["create", "sa", "default"]).await;
    assert!(ok, "{err}");
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
