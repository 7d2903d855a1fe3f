#![allow(clippy::unwrap_used, clippy::expect_used)]

use kumo_testkit::EtcdCluster;

#[tokio::test]
async fn single_member_put_get() {
    let mut cluster = EtcdCluster::start(1).await.expect("start etcd");
    assert_eq!(cluster.len(), 1);
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 1);
    assert!(endpoints[0].starts_with("http://127.0.0.1:"));
    let pid = cluster.pid(0).expect("member runs");
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());

    let mut client = etcd_client::Client::connect(&endpoints, None)
        .await
        .unwrap();
    client.put("/kumo/test", "hello", None).await.unwrap();
    let resp = client.get("/kumo/test", None).await.unwrap();
    assert_eq!(resp.kvs().len(), 1);
    assert_eq!(resp.kvs()[0].value(), b"hello");
    assert_eq!(resp.kvs()[0].version(), 1);

    cluster.kill_member(0);
    assert_eq!(cluster.pid(0), None);
    assert!(client.get("/kumo/test", None).await.is_err());
    // Killing twice is harmless.
    cluster.kill_member(0);

    // A restarted member comes back with its data (the WAL was fsynced).
    cluster.restart_member(0).await.expect("restart etcd");
    assert!(cluster.pid(0).is_some_and(|p| p != pid));
    let mut client = etcd_client::Client::connect(&endpoints, None)
        .await
        .unwrap();
    let resp = client.get("/kumo/test", None).await.unwrap();
    assert_eq!(resp.kvs()[0].value(), b"hello");
}

#[tokio::test]
async fn three_members_start() {
    let cluster = EtcdCluster::start(3).await.expect("start etcd");
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 3);
    let mut client = etcd_client::Client::connect(&endpoints, None)
        .await
        .unwrap();
    let members = client.member_list().await.unwrap();
    assert_eq!(members.members().len(), 3);
    for e in &endpoints {
        let mut one = etcd_client::Client::connect([e], None).await.unwrap();
        one.put("/kumo/from", e.as_str(), None).await.unwrap();
    }
}
