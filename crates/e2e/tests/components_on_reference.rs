#![allow(clippy::unwrap_used, clippy::expect_used)]
//! kumo's controller-manager and scheduler against the reference kube-apiserver v1.37.2
//! (issue 6: "the same controller-manager and scheduler binaries run against the reference
//! kube-apiserver"). Each uses the identity kubeadm gives it — system:kube-controller-manager
//! with one ServiceAccount token per controller, system:kube-scheduler — so upstream's RBAC
//! and admission judge every request they make.
//!
//! Needs the reference binaries (`scripts/reference build`) and kubectl on PATH.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use kumo_controller_manager::ControllerManager;
use kumo_e2e::{require_command, require_reference_binaries, ReferenceCluster};
use kumo_scheduler::Scheduler;
use kumo_testkit::kubectl::{eventually, get, k, node};
use serde_json::Value;

fn loopback() -> Option<SocketAddr> {
    Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0))
}

/// The holder of the lease kube-system/`name`, once there is one.
async fn holder(kc: &Path, name: &str) -> String {
    eventually(30, &format!("lease {name}"), || async {
        let l = get(kc, &["lease", "-n", "kube-system", name]).await?;
        l["spec"]["holderIdentity"].as_str().map(str::to_owned)
    })
    .await
}

/// Live pods of `ns` with label app=`app`.
async fn pods(kc: &Path, ns: &str, app: &str) -> Vec<Value> {
    let v = get(kc, &["pods", "-n", ns, "-l", &format!("app={app}")])
        .await
        .unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_manager_and_scheduler_on_the_reference_apiserver() {
    require_reference_binaries(&["etcd", "kube-apiserver"]).unwrap_or_else(|e| panic!("{e:#}"));
    require_command("kubectl").unwrap_or_else(|e| panic!("{e:#}"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("reference");
    let cluster = tokio::task::spawn_blocking(move || ReferenceCluster::up(&dir, false))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let kc = cluster.kubeconfig().to_owned();
    let dir = cluster.dir().to_owned();

    let mut cfg =
        kumo_controller_manager::Config::new(dir.join("kube-controller-manager.kubeconfig"));
    cfg.serve = loopback();
    cfg.use_service_account_credentials = true;
    cfg.root_ca_file = Some(dir.join("pki/ca.crt"));
    let cm = ControllerManager::start(cfg).await.unwrap();
    let mut cfg = kumo_scheduler::Config::new(dir.join("kube-scheduler.kubeconfig"));
    cfg.serve = loopback();
    let sched = Scheduler::start(cfg).await.unwrap();

    // Leader election on upstream's Leases.
    assert_eq!(holder(&kc, "kube-controller-manager").await, cm.identity);
    assert_eq!(holder(&kc, "kube-scheduler").await, sched.identity);

    // The serviceaccount and root-ca publisher controllers fill a new namespace, acting as
    // their own ServiceAccounts (the tokens come from the reference's TokenRequest API).
    let out = k(&kc, &["create", "namespace", "apps"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(
        30,
        "default ServiceAccount and kube-root-ca.crt",
        || async {
            get(&kc, &["serviceaccount", "default", "-n", "apps"]).await?;
            let cm = get(&kc, &["configmap", "kube-root-ca.crt", "-n", "apps"]).await?;
            cm["data"]["ca.crt"]
                .as_str()
                .is_some_and(|c| c.contains("BEGIN CERTIFICATE"))
                .then_some(())
        },
    )
    .await;

    // Deployment → ReplicaSet → Pods → bound to the two nodes.
    node(&kc, "worker-1", "4", "8Gi", &[], "").await;
    node(&kc, "worker-2", "4", "8Gi", &[], "").await;
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
    let bound = eventually(60, "two web pods bound", || async {
        let p = pods(&kc, "apps", "web").await;
        (p.len() == 2 && p.iter().all(|p| p["spec"]["nodeName"].is_string())).then_some(p)
    })
    .await;
    let rs = get(&kc, &["replicasets", "-n", "apps", "-l", "app=web"])
        .await
        .unwrap();
    let rs = &rs["items"][0];
    assert_eq!(rs["metadata"]["ownerReferences"][0]["kind"], "Deployment");
    assert_eq!(
        rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "1"
    );
    for p in &bound {
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");
        assert_eq!(
            p["metadata"]["labels"]["pod-template-hash"],
            rs["metadata"]["labels"]["pod-template-hash"]
        );
    }
    // Events are posted asynchronously by each recorder: they may trail the binding.
    eventually(
        30,
        "ScalingReplicaSet, SuccessfulCreate and Scheduled events",
        || async {
            let out = k(&kc, &["get", "events", "-n", "apps", "-o", "json"]).await;
            let ev: Value = serde_json::from_str(&out.stdout).ok()?;
            let reasons: Vec<String> = ev["items"]
                .as_array()?
                .iter()
                .filter_map(|e| e["reason"].as_str().map(str::to_owned))
                .collect();
            ["ScalingReplicaSet", "SuccessfulCreate", "Scheduled"]
                .iter()
                .all(|want| reasons.iter().any(|r| r == want))
                .then_some(())
        },
    )
    .await;

    // A pod no node tolerates: upstream's FailedScheduling text.
    for n in ["worker-1", "worker-2"] {
        let out = k(&kc, &["taint", "node", n, "dedicated=infra:NoSchedule"]).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let out = k(&kc, &["run", "lonely", "-n", "apps", "--image=nginx"]).await;
    assert!(out.ok, "{}", out.stderr);
    let note = eventually(30, "FailedScheduling for lonely", || async {
        let out = k(
            &kc,
            &["get", "events.events.k8s.io", "-n", "apps", "-o", "json"],
        )
        .await;
        let v: Value = serde_json::from_str(&out.stdout).ok()?;
        v["items"]
            .as_array()?
            .iter()
            .find(|e| e["reason"] == "FailedScheduling" && e["regarding"]["name"] == "lonely")
            .and_then(|e| e["note"].as_str().map(str::to_owned))
    })
    .await;
    assert_eq!(
        note,
        "0/2 nodes are available: 2 node(s) had untolerated taint(s). \
         preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    );

    // Deleting the namespace deletes its content, then the namespace (the `kubernetes`
    // finalizer removed through /finalize on kube-apiserver).
    let out = k(&kc, &["delete", "namespace", "apps", "--wait=false"]).await;
    assert!(out.ok, "{}", out.stderr);
    // No kubelet runs: play its part and remove the pods once they are terminating.
    eventually(30, "web pods terminating", || async {
        let v = get(&kc, &["pods", "-n", "apps", "-l", "app=web"]).await?;
        let items = v["items"].as_array()?;
        items
            .iter()
            .all(|p| p["metadata"]["deletionTimestamp"].is_string())
            .then_some(())
    })
    .await;
    let out = k(
        &kc,
        &[
            "delete",
            "pods",
            "--all",
            "-n",
            "apps",
            "--force",
            "--grace-period=0",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let out = k(&kc, &["get", "namespace", "apps", "-o", "yaml"]).await;
        if !out.ok && out.stderr.contains("NotFound") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "namespace apps not deleted after 90 s:\n{}",
            out.stdout
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }

    cm.shutdown().await.unwrap();
    sched.shutdown().await.unwrap();
    tokio::task::spawn_blocking(move || cluster.down())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e:#}"));
}
