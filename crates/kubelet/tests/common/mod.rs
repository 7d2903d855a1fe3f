//! Shared by the kubelet tests: an in-process API server on a temporary directory, node
//! kubeconfigs signed by its CA, a kubelet run in the background, the real kubectl
//! (through kumo_testkit) and a client-side verifier for the kubelet's serving cert.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kumo_apiserver::{pki, ApiServer, ApiServerConfig};
use kumo_kubelet::server::ServerConfig;
use kumo_kubelet::KubeletConfig;

/// An API server on a free loopback port over a fresh temporary directory.
pub async fn start_apiserver() -> (ApiServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ApiServerConfig::new(dir.path());
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let server = ApiServer::start(cfg).await.unwrap();
    (server, dir)
}

/// What the controller-manager makes in the `default` namespace and these tests play (no
/// controller-manager runs): the `default` ServiceAccount pods are admitted with, and the
/// `kube-root-ca.crt` ConfigMap their token volume projects (without it the volume cannot
/// be set up and the pod's containers never start).
pub async fn default_service_account(admin: &Path, data_dir: &Path) {
    let (ok, _, err) = k(admin, &["create", "sa", "default"]).await;
    assert!(ok, "{err}");
    publish_root_ca(admin, data_dir).await;
}

/// The root-ca-cert-publisher's `kube-root-ca.crt` in `default`.
pub async fn publish_root_ca(admin: &Path, data_dir: &Path) {
    let ca = format!(
        "--from-file=ca.crt={}",
        data_dir.join("pki/ca.crt").display()
    );
    let (ok, _, err) = k(admin, &["create", "configmap", "kube-root-ca.crt", &ca]).await;
    assert!(ok, "{err}");
}

/// Writes a kubeconfig for `system:node:<node>` (group `system:nodes`), signed by the
/// cluster CA under `data_dir/pki`, pointing at the server named in `admin`.
pub fn node_kubeconfig(data_dir: &Path, admin: &Path, node: &str) -> PathBuf {
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

/// Runs the kubelet in the background; the test fails if it stops with an error.
pub fn spawn_kubelet(cfg: KubeletConfig) {
    tokio::spawn(async move {
        if let Err(e) = kumo_kubelet::run(cfg).await {
            panic!("kubelet: {e}");
        }
    });
}

/// kubectl (kumo_testkit's) as (success, stdout, stderr).
pub async fn k(kc: &Path, args: &[&str]) -> (bool, String, String) {
    let out = kumo_testkit::kubectl::k(kc, args).await;
    (out.ok, out.stdout, out.stderr)
}

/// Polls `kubectl args` until its stdout satisfies `ok` (20 s).
pub async fn until(kc: &Path, args: &[&str], what: &str, ok: impl Fn(&str) -> bool) -> String {
    until_within(20, kc, args, what, ok).await
}

/// Waits (20 s) until Node `node` reports Ready.
pub async fn node_ready(kc: &Path, node: &str) {
    until(
        kc,
        &[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        "node Ready",
        |o| o == "True",
    )
    .await;
}

/// Polls `kubectl args` every 200 ms until its stdout satisfies `ok`, failing with the
/// last output after `secs`.
pub async fn until_within(
    secs: u64,
    kc: &Path,
    args: &[&str],
    what: &str,
    ok: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
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

/// Starts a kubelet for `node` that serves its HTTPS API on a free loopback port,
/// trusting client certificates of the cluster CA, and returns that port once the Node's
/// daemonEndpoints publish it (30 s).
pub async fn start_serving_kubelet(data_dir: &Path, admin: &Path, node: &str) -> u16 {
    let node_kc = node_kubeconfig(data_dir, admin, node);
    let mut kcfg = KubeletConfig::new(&node_kc, node);
    kcfg.runtime = Some(kumo_sim::factory(None));
    kcfg.status_update_frequency = Duration::from_secs(1);
    kcfg.server = Some(ServerConfig {
        address: Ipv4Addr::LOCALHOST.into(),
        port: 0,
        client_ca_file: Some(data_dir.join("pki").join("ca.crt")),
        ..Default::default()
    });
    spawn_kubelet(kcfg);
    until_within(
        30,
        admin,
        &[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}",
        ],
        "registered",
        |o| o.parse::<u16>().is_ok_and(|p| p != 0 && p != 10250),
    )
    .await
    .parse()
    .unwrap()
}

/// Writes `yaml` to `dir/<name>.yaml` and creates it with kubectl.
#[allow(dead_code)]
pub async fn create(admin: &Path, dir: &Path, name: &str, yaml: &str) {
    let f = dir.join(format!("{name}.yaml"));
    std::fs::write(&f, yaml).unwrap();
    let (ok, _, err) = k(admin, &["create", "-f", f.to_str().unwrap()]).await;
    assert!(ok, "{err}");
}
