#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The real kube-controller-manager and kube-scheduler v1.37.2 against `kumo apiserver`:
//! client-go clients asking for protobuf (lists, watch streams, bindings) with the
//! identities kubeadm gives them, so kumo must serve what upstream's components need —
//! every resource their informers watch (resource.k8s.io included), TokenRequest for
//! per-controller credentials, RBAC's bootstrap roles.
//!
//! Needs the reference binaries (`scripts/reference build`) and kubectl on PATH.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use kumo_apiserver::{ApiServer, ApiServerConfig};
use kumo_e2e::{reference_bin_dir, require_command, require_reference_binaries};
use kumo_testkit::kubectl::{eventually, get, k, node};
use serde_json::Value;

/// A reference component, killed when dropped.
struct Component(Child);

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(bin: &str, args: &[String], log: &Path) -> Component {
    let out = std::fs::File::create(log).unwrap();
    let err = out.try_clone().unwrap();
    Component(
        Command::new(reference_bin_dir().join(bin))
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_controller_manager_and_kube_scheduler_run_on_kumo() {
    require_reference_binaries(&["kube-controller-manager", "kube-scheduler"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    require_command("kubectl").unwrap_or_else(|e| panic!("{e:#}"));
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = ApiServerConfig::new(tmp.path().join("kumo"));
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let server = ApiServer::start(cfg).await.unwrap();
    let kc = server.admin_kubeconfig.clone();
    let data = tmp.path().join("kumo");
    let pki = data.join("pki");
    let p = |f: &str| pki.join(f).display().to_string();
    let kcm_dir = tmp.path().join("kcm");
    std::fs::create_dir_all(&kcm_dir).unwrap();

    let _kcm = spawn(
        "kube-controller-manager",
        &[
            format!(
                "--kubeconfig={}",
                data.join("controller-manager.conf").display()
            ),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=true".into(),
            format!("--root-ca-file={}", p("ca.crt")),
            format!("--service-account-private-key-file={}", p("sa.key")),
            format!("--cluster-signing-cert-file={}", p("ca.crt")),
            format!("--cluster-signing-key-file={}", p("ca.key")),
            "--service-cluster-ip-range=10.96.0.0/12".into(),
            "--bind-address=127.0.0.1".into(),
            "--secure-port=0".into(),
            format!("--cert-dir={}", kcm_dir.display()),
        ],
        &tmp.path().join("kcm.log"),
    );
    let _sched = spawn(
        "kube-scheduler",
        &[
            format!("--kubeconfig={}", data.join("scheduler.conf").display()),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            "--secure-port=0".into(),
        ],
        &tmp.path().join("scheduler.log"),
    );
    let logs = || {
        let read = |f: &str| std::fs::read_to_string(tmp.path().join(f)).unwrap_or_default();
        let tail = |s: String| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        format!(
            "kube-controller-manager:\n{}\nkube-scheduler:\n{}",
            tail(read("kcm.log")),
            tail(read("scheduler.log"))
        )
    };

    // The serviceaccount and root-ca-cert-publisher controllers fill a new namespace.
    let out = k(&kc, &["create", "namespace", "apps"]).await;
    assert!(out.ok, "{}", out.stderr);
    node(&kc, "worker-1", "4", "8Gi", &[], "").await;
    let filled = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        loop {
            let sa = get(&kc, &["serviceaccount", "default", "-n", "apps"]).await;
            let cm = get(&kc, &["configmap", "kube-root-ca.crt", "-n", "apps"]).await;
            if sa.is_some() && cm.is_some() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    })
    .await;
    assert!(filled.is_ok(), "namespace not filled in 60 s\n{}", logs());

    // Deployment → ReplicaSet → Pods (kube-controller-manager) → bound (kube-scheduler).
    let out = k(
        &kc,
        &[
            "create",
            "deployment",
            "web",
            "-n",
            "apps",
            "--image=nginx",
            "--replicas=2",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let bound = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        loop {
            if let Some(v) = get(&kc, &["pods", "-n", "apps", "-l", "app=web"]).await {
                let items = v["items"].as_array().cloned().unwrap_or_default();
                if items.len() == 2 && items.iter().all(|p| p["spec"]["nodeName"] == "worker-1") {
                    return items;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("pods not bound in 60 s\n{}", logs()));
    for p in &bound {
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");
    }
    // Upstream's event texts, recorded through kumo's events APIs.
    let notes = eventually(30, "Scheduled events", || async {
        let v: Value = get(&kc, &["events.events.k8s.io", "-n", "apps"]).await?;
        let notes: Vec<String> = v["items"]
            .as_array()?
            .iter()
            .filter(|e| e["reason"] == "Scheduled")
            .filter_map(|e| e["note"].as_str().map(str::to_owned))
            .collect();
        (notes.len() == 2).then_some(notes)
    })
    .await;
    for n in notes {
        assert!(
            n.starts_with("Successfully assigned apps/web-") && n.ends_with(" to worker-1"),
            "{n}"
        );
    }
    let v = get(&kc, &["events", "-n", "apps"]).await.unwrap();
    let reasons: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(reasons.contains(&"ScalingReplicaSet"), "{reasons:?}");
    assert!(reasons.contains(&"SuccessfulCreate"), "{reasons:?}");
    drop(server);
}
