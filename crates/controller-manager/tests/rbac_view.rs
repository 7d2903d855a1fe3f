//! Issue 5's RBAC check end to end: with the clusterrole-aggregation controller filling in
//! the aggregated `view` role, a user bound to it can get but not delete, refused with
//! kube-apiserver's message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_bound_to_view_can_get_but_not_delete() {
    let (server, dir) = start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    let _cm = start_cm(&admin, &["*"]).await;
    // A client certificate for jane, signed by the cluster CA.
    let ca = kumo_apiserver::pki::Ca::load_or_create(&dir.path().join("pki")).unwrap();
    let cert = ca.issue_client("jane", &[]).unwrap();
    let server_url = std::fs::read_to_string(&admin)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_owned))
        .unwrap();
    let jane = dir.path().join("jane.conf");
    std::fs::write(
        &jane,
        kumo_apiserver::pki::kubeconfig("kumo", &server_url, &ca.cert_pem, "jane", &cert),
    )
    .unwrap();
    assert!(
        k(
            &admin,
            &["create", "configmap", "settings", "--from-literal=a=b"]
        )
        .await
        .ok
    );
    let out = k(
        &admin,
        &[
            "create",
            "rolebinding",
            "jane-view",
            "--clusterrole=view",
            "--user=jane",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    // view gets its rules from the aggregation controller; then jane may read.
    eventually(30, "jane reads through view", || async {
        let out = k(&jane, &["get", "configmap", "settings", "-o", "name"]).await;
        out.ok.then_some(())
    })
    .await;
    assert!(k(&jane, &["get", "pods"]).await.ok);
    let out = k(&jane, &["delete", "configmap", "settings"]).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "Error from server (Forbidden): configmaps \"settings\" is forbidden: User \"jane\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"default\""
    );
    // view does not include secrets.
    let out = k(&jane, &["get", "secrets"]).await;
    assert!(
        out.stderr
            .contains("secrets is forbidden: User \"jane\" cannot list resource \"secrets\""),
        "{}",
        out.stderr
    );
}
