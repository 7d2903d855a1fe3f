#![allow(clippy::unwrap_used, clippy::expect_used)]
//! kumo apiserver against kube-apiserver v1.37.2, request for request (the difftest corpus,
//! crates/difftest/corpus): every difference must be one the corpus explains
//! (`known_difference`), so a regression in an answer, an error's wording or discovery
//! fails CI.
//!
//! `KUMO_DIFFTEST_ONLY=bad-input` runs only the scenarios whose name contains it.
//!
//! Needs the reference binaries (`scripts/reference build`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use kumo_apiserver::{ApiServer, ApiServerConfig};
use kumo_difftest::{run_corpus, Side, DEFAULT_CORPUS};
use kumo_e2e::{require_reference_binaries, ReferenceCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kumo_answers_as_kube_apiserver_does() {
    require_reference_binaries(&["etcd", "kube-apiserver"]).unwrap_or_else(|e| panic!("{e:#}"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("reference");
    let reference = tokio::task::spawn_blocking(move || ReferenceCluster::up(&dir, false))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let mut cfg = ApiServerConfig::new(tmp.path().join("kumo"));
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let kumo = ApiServer::start(cfg).await.unwrap();

    let left = Side::from_kubeconfig("kube-apiserver", reference.kubeconfig())
        .await
        .unwrap();
    let right = Side::from_kubeconfig("kumo", &kumo.admin_kubeconfig)
        .await
        .unwrap();
    // KUMO_DIFFTEST_ONLY=<part of a scenario name> runs just the scenarios it names.
    let only = std::env::var("KUMO_DIFFTEST_ONLY").ok();
    let report = run_corpus(&left, &right, DEFAULT_CORPUS.as_ref(), only.as_deref())
        .await
        .unwrap();
    assert!(report.is_empty(), "unexplained differences:\n{report}");

    tokio::task::spawn_blocking(move || reference.down())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e:#}"));
}
