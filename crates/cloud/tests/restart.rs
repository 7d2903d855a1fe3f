//! A cloud restart loses nothing: instances, load balancers, routes, policies, faults,
//! quotas and credentials survive, and running instances are booted again.

mod common;

use std::time::Duration;

use common::*;
use kumo_cloud::*;

#[tokio::test]
async fn restart_keeps_everything() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    let creds_before = std::fs::read(&s.credentials_file).expect("creds");
    let a = c
        .run_instance(&RunInstanceRequest {
            name: Some("node-a".into()),
            zone: Some("kumo-1c".into()),
            ..Default::default()
        })
        .await
        .expect("a");
    let b = c
        .run_instance(&RunInstanceRequest::default())
        .await
        .expect("b");
    running(&c, &a.id).await;
    running(&c, &b.id).await;
    c.stop_instance(&b.id).await.expect("stop");
    c.wait_for_instance_state(&b.id, InstanceState::Stopped, Duration::from_secs(5))
        .await
        .expect("stopped");
    let lb = c
        .create_load_balancer(&CreateLoadBalancerRequest {
            name: "web".into(),
            listeners: vec![Listener {
                port: 80,
                protocol: Protocol::Tcp,
                target_port: 30080,
            }],
            targets: vec![a.id.clone()],
            ..Default::default()
        })
        .await
        .expect("lb");
    let table = c.list_route_tables().await.expect("tables")[0].id.clone();
    c.create_route(
        &table,
        &CreateRouteRequest {
            destination_cidr: "10.244.3.0/24".into(),
            instance_id: a.id.clone(),
            name: "node-a".into(),
            description: String::new(),
        },
    )
    .await
    .expect("route");
    let key = c.create_access_key("ccm").await.expect("key");
    c.deny("DeleteLoadBalancer", Some(&key.access_key_id))
        .await
        .expect("deny");
    c.set_fault(
        "RunInstances",
        &Fault {
            latency_ms: 5,
            ..Default::default()
        },
    )
    .await
    .expect("fault");
    c.set_quotas(&UpdateQuotasRequest {
        max_instances: Some(7),
        ..Default::default()
    })
    .await
    .expect("quotas");
    let instances_before = c
        .list_instances(&InstanceFilter::default())
        .await
        .expect("list");
    let subnets_before = c.subnets().await.expect("subnets");
    s.shutdown().await;
    drop(c);

    let (s, c, rec) = start(dir.path()).await;
    assert_eq!(
        std::fs::read(&s.credentials_file).expect("creds"),
        creds_before
    );
    let after = c
        .list_instances(&InstanceFilter::default())
        .await
        .expect("list");
    assert_eq!(after, instances_before);
    assert_eq!(c.subnets().await.expect("subnets"), subnets_before);
    let got = c.describe_load_balancer(&lb.id).await.expect("lb survives");
    assert_eq!(
        (got.vip, got.dns_name, got.listeners),
        (lb.vip, lb.dns_name, lb.listeners)
    );
    let routes = c.list_routes(&table).await.expect("routes");
    assert_eq!(routes.len(), 2);
    assert_eq!(
        (
            routes[1].destination_cidr.as_str(),
            routes[1].instance_id.as_str()
        ),
        ("10.244.3.0/24", a.id.as_str())
    );
    let ps = c.policies().await.expect("policies");
    assert_eq!(ps.len(), 1);
    assert_eq!(
        ps[0].credential.as_deref(),
        Some(key.access_key_id.as_str())
    );
    assert_eq!(
        c.faults().await.expect("faults")["RunInstances"].latency_ms,
        5
    );
    assert_eq!(c.quotas().await.expect("quotas").max_instances, 7);
    let ccm = c
        .with_credentials(
            &key.access_key_id,
            key.secret_access_key.as_deref().expect("secret"),
        )
        .expect("client");
    let e = ccm
        .delete_load_balancer(&lb.id)
        .await
        .expect_err("still denied");
    assert_eq!(e.code(), Some("AccessDenied"));
    // The running instance is booted again by the new process; the stopped one is not.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while rec.count("boot", &a.id) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "running instance not booted again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rec.count("boot", &b.id), 0);
    // IPAM continues from the saved state: no address is handed out twice.
    let n = c
        .run_instance(&RunInstanceRequest {
            zone: Some("kumo-1c".into()),
            ..Default::default()
        })
        .await
        .expect("new");
    assert_ne!(n.private_ip, a.private_ip);
    s.shutdown().await;
}

#[tokio::test]
async fn interrupted_transitions_finish_after_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start_with(dir.path(), |cfg| {
        cfg.transition_delay = Duration::from_secs(60)
    })
    .await;
    let i = c
        .run_instance(&RunInstanceRequest::default())
        .await
        .expect("run");
    assert_eq!(i.state, InstanceState::Pending);
    s.shutdown().await;
    let (s, c, rec) = start(dir.path()).await;
    running(&c, &i.id).await;
    assert_eq!(rec.count("boot", &i.id), 1);
    s.shutdown().await;
}

#[tokio::test]
async fn a_corrupt_state_file_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("state.json"), b"{not json").expect("write");
    let e = CloudServer::start(CloudConfig::new(dir.path()))
        .await
        .err()
        .expect("refused");
    assert!(e.contains("corrupt cloud state"), "{e}");
}

#[tokio::test]
async fn one_cloud_per_data_directory() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, _c, _) = start(dir.path()).await;
    let e = CloudServer::start(CloudConfig::new(dir.path()))
        .await
        .err()
        .expect("refused");
    assert!(e.contains("already serves this data directory"), "{e}");
    s.shutdown().await;
    let (s, _c, _) = start(dir.path()).await;
    s.shutdown().await;
}

#[tokio::test]
async fn a_change_that_cannot_be_saved_is_undone() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    let lb = |n: &str| CreateLoadBalancerRequest {
        name: n.into(),
        listeners: vec![Listener {
            port: 80,
            protocol: Protocol::Tcp,
            target_port: 30080,
        }],
        ..Default::default()
    };
    c.create_load_balancer(&lb("kept")).await.expect("kept");
    // The journal's name is taken by a directory: every save fails, even as root.
    let journal = dir.path().join("state.journal");
    let aside = dir.path().join("journal.aside");
    std::fs::rename(&journal, &aside).expect("move the journal aside");
    std::fs::create_dir(&journal).expect("dir");
    let e = c.create_load_balancer(&lb("lost")).await.expect_err("500");
    assert_eq!((e.status(), e.code()), (Some(500), Some("InternalError")));
    let names: Vec<String> = c
        .list_load_balancers()
        .await
        .expect("list")
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(names, ["kept"], "the unsaved change is not visible");
    std::fs::remove_dir(&journal).expect("rmdir");
    std::fs::rename(&aside, &journal).expect("journal back");
    c.create_load_balancer(&lb("lost"))
        .await
        .expect("saved now");
    s.shutdown().await;
    let (s, c, _) = start(dir.path()).await;
    assert_eq!(c.list_load_balancers().await.expect("list").len(), 2);
    s.shutdown().await;
}
