//! The cloud's API, driven in process through the typed client and raw HTTP.

mod common;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::*;
use kumo_cloud::*;

fn err_code(e: &Error) -> &str {
    e.code().unwrap_or("<not an API error>")
}

#[tokio::test]
async fn raw_http_errors_have_codes_and_request_ids() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, _c, _) = start(dir.path()).await;
    let auth = admin_auth(dir.path());

    let r = raw(&s, "GET", "/v1/instances", None, b"").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.body["error"]["code"], "MissingAuthenticationToken");

    let bad = format!("{}x", auth);
    let r = raw(&s, "GET", "/v1/instances", Some(&bad), b"").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.body["error"]["code"], "AuthFailure");
    let r = raw(&s, "GET", "/v1/instances", Some("Basic abc"), b"").await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (401, Some("AuthFailure"))
    );

    let r = raw(&s, "POST", "/v1/instances", Some(&auth), b"{\"name\": ").await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"]["code"], "MalformedInput");

    let r = raw(&s, "POST", "/v1/instances", Some(&auth), br#"{"nmae":"x"}"#).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"]["code"], "UnknownParameter");
    assert!(
        r.body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("nmae"),
        "{}",
        r.body
    );

    let r = raw(
        &s,
        "POST",
        "/v1/load-balancers",
        Some(&auth),
        br#"{"listeners":[]}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (400, Some("MissingParameter"))
    );

    let r = raw(&s, "POST", "/v1/instances", Some(&auth), br#"{"name":7}"#).await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (400, Some("InvalidParameterValue"))
    );

    let r = raw(
        &s,
        "POST",
        "/v1/instances",
        Some(&auth),
        br#"{"instanceType":"k9.huge"}"#,
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(r.body["error"]["message"]
        .as_str()
        .expect("m")
        .contains("k9.huge"));

    let r = raw(
        &s,
        "GET",
        "/v1/instances/i-00000000000000000",
        Some(&auth),
        b"",
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.body["error"]["code"], "InvalidInstanceID.NotFound");
    assert_eq!(
        r.body["error"]["message"],
        "The instance ID 'i-00000000000000000' does not exist"
    );
    let id = r.headers["x-kumo-request-id"].to_str().expect("header");
    assert_eq!(r.body["requestId"], id);

    let r = raw(&s, "GET", "/v1/load-balancers/lb-0", Some(&auth), b"").await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (404, Some("LoadBalancerNotFound"))
    );
    let r = raw(&s, "GET", "/v1/nothing", Some(&auth), b"").await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (404, Some("UnknownOperation"))
    );
    let r = raw(&s, "PUT", "/v1/instances", Some(&auth), b"").await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (405, Some("MethodNotAllowed"))
    );
    let r = raw(&s, "GET", "/v1/instances?color=red", Some(&auth), b"").await;
    assert_eq!(r.status, 400);
    let r = raw(&s, "GET", "/v1/regions", Some(&auth), br#"{"a":1}"#).await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (400, Some("UnknownParameter"))
    );
    let big = vec![b' '; 2 << 20];
    let r = raw(&s, "POST", "/v1/instances", Some(&auth), &big).await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (413, Some("RequestEntityTooLarge"))
    );

    // Discovery-like documents.
    let r = raw(&s, "GET", "/openapi.json", None, b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["openapi"], "3.0.3");
    assert_eq!(
        r.body["paths"]["/v1/instances/{id}/stop"]["post"]["operationId"],
        "StopInstance"
    );
    let r = raw(&s, "GET", "/v1/regions", Some(&auth), b"").await;
    assert_eq!(r.body["regions"][0]["name"], "kumo-1");
    let zones: Vec<&str> = r.body["regions"][0]["zones"]
        .as_array()
        .expect("zones")
        .iter()
        .filter_map(|z| z["name"].as_str())
        .collect();
    assert_eq!(zones, ["kumo-1a", "kumo-1b", "kumo-1c"]);
    s.shutdown().await;
}

#[tokio::test]
async fn credentials_file_is_private_and_typed_client_reads_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    let mode = std::fs::metadata(&s.credentials_file)
        .expect("credentials")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let me = c.caller_identity().await.expect("identity");
    assert_eq!(me.name, "admin");
    assert!(me.access_key_id.starts_with("KKIA") && me.access_key_id.len() == 20);
    let types = c.instance_types().await.expect("types");
    let small = types
        .iter()
        .find(|t| t.name == "k1.small")
        .expect("k1.small");
    assert_eq!((small.cpu, small.memory_mib), (2, 4096));
    assert_eq!(c.vpcs().await.expect("vpcs")[0].cidr, "10.0.0.0/16");
    let subnets = c.subnets().await.expect("subnets");
    assert_eq!(subnets.len(), 3);
    assert_eq!(subnets[0].available_ip_count, 251);
    // A --cloud-config style file with the CA embedded, for another access key.
    let key = c.create_access_key("ccm").await.expect("key");
    let cfg = ClientConfig::from_data_dir(dir.path())
        .expect("cfg")
        .with_credentials(
            &key.access_key_id,
            key.secret_access_key.as_deref().expect("secret"),
        );
    let file = dir.path().join("ccm-cloud-config.json");
    cfg.write_file(&file).expect("write");
    let mode = std::fs::metadata(&file).expect("file").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let ccm = Client::new(ClientConfig::from_file(&file).expect("read")).expect("client");
    assert_eq!(ccm.caller_identity().await.expect("identity").name, "ccm");
    let bad = c
        .with_credentials(&me.access_key_id, "wrong")
        .expect("client");
    let e = bad.regions().await.expect_err("bad secret");
    assert_eq!((e.status(), err_code(&e)), (Some(401), "AuthFailure"));
    assert!(e.to_string().contains("AuthFailure"), "{e}");
    s.shutdown().await;
}

#[tokio::test]
async fn instance_lifecycle() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, rec) = start_with(dir.path(), |cfg| {
        cfg.transition_delay = Duration::from_millis(150)
    })
    .await;
    let i = c
        .run_instance(&RunInstanceRequest {
            name: Some("node-1".into()),
            instance_type: Some("k1.medium".into()),
            zone: Some("kumo-1b".into()),
            user_data: Some("#cloud-config\n".into()),
            ..Default::default()
        })
        .await
        .expect("run");
    assert_eq!(i.state, InstanceState::Pending);
    assert!(i.id.starts_with("i-") && i.id.len() == 19, "{}", i.id);
    assert!(i.id[2..].chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!((i.cpu, i.memory_mib), (4, 8192));
    assert_eq!(i.zone, "kumo-1b");
    assert_eq!(i.tags["Name"], "node-1");
    assert_eq!(i.private_ip, "10.0.2.4");
    assert_eq!(i.private_dns_name, "ip-10-0-2-4.kumo-1.compute.internal");
    assert!(time_ok(&i.launch_time), "{}", i.launch_time);

    let i = running(&c, &i.id).await;
    assert_eq!(rec.count("boot", &i.id), 1);
    // Idempotent start of a running instance.
    assert_eq!(
        c.start_instance(&i.id).await.expect("start").state,
        InstanceState::Running
    );

    let stopping = c.stop_instance(&i.id).await.expect("stop");
    assert_eq!(stopping.state, InstanceState::Stopping);
    let stopped = c
        .wait_for_instance_state(&i.id, InstanceState::Stopped, Duration::from_secs(5))
        .await
        .expect("stopped");
    assert_eq!(
        stopped.private_ip, "10.0.2.4",
        "a stopped instance keeps its IP"
    );
    assert_eq!(rec.count("halt", &i.id), 1);
    assert_eq!(
        c.stop_instance(&i.id).await.expect("again").state,
        InstanceState::Stopped
    );

    assert_eq!(
        c.start_instance(&i.id).await.expect("start").state,
        InstanceState::Pending
    );
    running(&c, &i.id).await;
    assert_eq!(rec.count("boot", &i.id), 2);

    let listed = c
        .list_instances(&InstanceFilter {
            states: vec![InstanceState::Running],
            tags: [("Name".to_owned(), "node-1".to_owned())].into(),
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    let by_dns = c
        .list_instances(&InstanceFilter {
            private_dns_name: Some("ip-10-0-2-4.kumo-1.compute.internal".into()),
            ..Default::default()
        })
        .await
        .expect("by dns name");
    assert_eq!(by_dns.iter().map(|i| &i.id).collect::<Vec<_>>(), [&i.id]);
    let by_ip = c
        .list_instances(&InstanceFilter {
            private_ip: Some("10.0.2.5".into()),
            ..Default::default()
        })
        .await
        .expect("by ip");
    assert!(by_ip.is_empty());
    let none = c
        .list_instances(&InstanceFilter {
            states: vec![InstanceState::Stopped],
            ..Default::default()
        })
        .await
        .expect("list");
    assert!(none.is_empty());

    assert_eq!(
        c.terminate_instance(&i.id).await.expect("terminate").state,
        InstanceState::ShuttingDown
    );
    let t = c
        .wait_for_instance_state(&i.id, InstanceState::Terminated, Duration::from_secs(5))
        .await
        .expect("terminated");
    assert!(t.private_ip.is_empty() && t.private_dns_name.is_empty());
    assert!(t.terminated_time.is_some());
    assert_eq!(rec.count("halt", &i.id), 2);
    let e = c.start_instance(&i.id).await.expect_err("terminated");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(409), "IncorrectInstanceState")
    );
    // Still visible, as upstream clouds keep terminated instances for a while.
    assert_eq!(
        c.describe_instance(&i.id).await.expect("visible").state,
        InstanceState::Terminated
    );
    let e = c
        .describe_instance("i-0123456789abcdef0")
        .await
        .expect_err("404");
    assert!(e.is_not_found());
    assert_eq!(err_code(&e), "InvalidInstanceID.NotFound");
    s.shutdown().await;
}

fn time_ok(t: &str) -> bool {
    t.len() == 20 && t.ends_with('Z') && t.as_bytes()[10] == b'T'
}

#[tokio::test]
async fn failed_boot_leaves_the_instance_stopped_with_a_reason() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, rec) = start(dir.path()).await;
    *rec.fail_boot.lock() = true;
    let i = c
        .run_instance(&RunInstanceRequest::default())
        .await
        .expect("run");
    let i = c
        .wait_for_instance_state(&i.id, InstanceState::Stopped, Duration::from_secs(5))
        .await
        .expect("stopped");
    let reason = i.state_reason.expect("reason");
    assert_eq!(reason.code, "Server.InternalError");
    assert!(
        reason.message.contains("no kubelet binary"),
        "{}",
        reason.message
    );
    s.shutdown().await;
}

#[tokio::test]
async fn terminated_instances_disappear_after_the_retention() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start_with(dir.path(), |cfg| {
        cfg.terminated_retention = Duration::from_millis(300)
    })
    .await;
    let i = c
        .run_instance(&RunInstanceRequest::default())
        .await
        .expect("run");
    c.terminate_instance(&i.id).await.expect("terminate");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.describe_instance(&i.id).await {
            Err(e) if e.is_not_found() => break,
            Err(e) => panic!("{e}"),
            Ok(_) => {
                assert!(
                    Instant::now() < deadline,
                    "terminated instance never purged"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    s.shutdown().await;
}

#[tokio::test]
async fn ipam_allocates_unique_addresses_and_releases_them() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    let mut ips = BTreeSet::new();
    let mut ids = Vec::new();
    for n in 0..12 {
        let i = c
            .run_instance(&RunInstanceRequest {
                name: Some(format!("n{n}")),
                zone: Some("kumo-1a".into()),
                ..Default::default()
            })
            .await
            .expect("run");
        let ip: Ipv4Addr = i.private_ip.parse().expect("ip");
        assert_eq!(
            ip.octets()[..3],
            [10, 0, 1],
            "{ip} outside kumo-1a's subnet"
        );
        assert!(ip.octets()[3] >= 4, "{ip} is a reserved address");
        assert!(ips.insert(ip), "duplicate {ip}");
        ids.push(i.id);
    }
    assert_eq!(ips.first().copied(), Some(Ipv4Addr::new(10, 0, 1, 4)));
    // Spread over zones when none is named.
    let j = c
        .run_instance(&RunInstanceRequest::default())
        .await
        .expect("run");
    assert_ne!(j.zone, "kumo-1a");
    // Terminating releases the address; the next launch reuses it.
    let victim = c.describe_instance(&ids[3]).await.expect("get");
    c.terminate_instance(&victim.id).await.expect("terminate");
    c.wait_for_instance_state(
        &victim.id,
        InstanceState::Terminated,
        Duration::from_secs(5),
    )
    .await
    .expect("terminated");
    let k = c
        .run_instance(&RunInstanceRequest {
            zone: Some("kumo-1a".into()),
            ..Default::default()
        })
        .await
        .expect("run");
    assert_eq!(k.private_ip, victim.private_ip);
    let subnets = c.subnets().await.expect("subnets");
    let a = subnets.iter().find(|s| s.zone == "kumo-1a").expect("a");
    assert_eq!(a.available_ip_count, 251 - 12);
    let e = c
        .run_instance(&RunInstanceRequest {
            zone: Some("kumo-9z".into()),
            ..Default::default()
        })
        .await
        .expect_err("zone");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(400), "InvalidParameterValue")
    );
    s.shutdown().await;
}

fn listener(port: u16, target: u16) -> Listener {
    Listener {
        port,
        protocol: Protocol::Tcp,
        target_port: target,
    }
}

#[tokio::test]
async fn load_balancers_get_vips_and_report_target_health() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    let a = c
        .run_instance(&RunInstanceRequest::default())
        .await
        .expect("a");
    let b = c
        .run_instance(&RunInstanceRequest::default())
        .await
        .expect("b");
    running(&c, &a.id).await;
    running(&c, &b.id).await;
    let lb = c
        .create_load_balancer(&CreateLoadBalancerRequest {
            name: "a1b2c3".into(),
            listeners: vec![
                listener(80, 30080),
                Listener {
                    port: 53,
                    protocol: Protocol::Udp,
                    target_port: 30053,
                },
            ],
            targets: vec![a.id.clone(), b.id.clone()],
            ..Default::default()
        })
        .await
        .expect("create");
    assert!(lb.id.starts_with("lb-") && lb.id.len() == 20);
    let vip: Ipv4Addr = lb.vip.parse().expect("vip");
    assert_eq!(vip.octets()[..3], [203, 0, 113]);
    assert_eq!(
        lb.dns_name,
        format!("a1b2c3-{}.elb.kumo-1.kumo.internal", &lb.id[3..])
    );
    assert_eq!(lb.health_check.protocol, "TCP");
    assert!(lb
        .targets
        .iter()
        .all(|t| t.health == TargetHealthState::Healthy));

    let lb2 = c
        .create_load_balancer(&CreateLoadBalancerRequest {
            name: "second".into(),
            listeners: vec![listener(443, 30443)],
            health_check: Some(HealthCheck {
                protocol: "HTTP".into(),
                port: 32000,
                path: Some("/healthz".into()),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("second");
    assert_ne!(lb2.vip, lb.vip);

    let e = c
        .create_load_balancer(&CreateLoadBalancerRequest {
            name: "a1b2c3".into(),
            listeners: vec![listener(80, 30080)],
            ..Default::default()
        })
        .await
        .expect_err("duplicate");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(409), "DuplicateLoadBalancerName")
    );
    let e = c
        .create_load_balancer(&CreateLoadBalancerRequest {
            name: "x".into(),
            listeners: vec![listener(80, 30080)],
            targets: vec!["i-00000000000000000".into()],
            ..Default::default()
        })
        .await
        .expect_err("bad target");
    assert_eq!((e.status(), err_code(&e)), (Some(400), "InvalidTarget"));
    for (name, ls) in [
        ("-bad", vec![listener(80, 1)]),
        ("ok", vec![]),
        ("ok", vec![listener(80, 1), listener(80, 2)]),
        ("ok", vec![listener(80, 0)]),
    ] {
        let e = c
            .create_load_balancer(&CreateLoadBalancerRequest {
                name: name.into(),
                listeners: ls,
                ..Default::default()
            })
            .await
            .expect_err("invalid");
        assert_eq!(
            (e.status(), err_code(&e)),
            (Some(400), "InvalidParameterValue"),
            "{e}"
        );
    }

    // Health follows the instance's state.
    c.stop_instance(&b.id).await.expect("stop");
    c.wait_for_instance_state(&b.id, InstanceState::Stopped, Duration::from_secs(5))
        .await
        .expect("stopped");
    let got = c.describe_load_balancer(&lb.id).await.expect("get");
    let hb = got
        .targets
        .iter()
        .find(|t| t.instance_id == b.id)
        .expect("b");
    assert_eq!(hb.health, TargetHealthState::Unused);
    assert_eq!(hb.reason.as_deref(), Some("Target.InvalidState"));

    let up = c
        .update_load_balancer(
            &lb.id,
            &UpdateLoadBalancerRequest {
                listeners: Some(vec![listener(8080, 31080)]),
                targets: Some(vec![a.id.clone()]),
                ..Default::default()
            },
        )
        .await
        .expect("update");
    assert_eq!(up.listeners, vec![listener(8080, 31080)]);
    assert_eq!(up.targets.len(), 1);
    assert_eq!(up.vip, lb.vip, "an update keeps the VIP");
    assert_eq!(
        c.find_load_balancer("a1b2c3")
            .await
            .expect("find")
            .map(|l| l.id),
        Some(lb.id.clone())
    );
    assert!(c.find_load_balancer("nope").await.expect("find").is_none());
    assert_eq!(c.list_load_balancers().await.expect("list").len(), 2);

    let gone = c.delete_load_balancer(&lb.id).await.expect("delete");
    assert_eq!(gone.id, lb.id);
    let e = c.delete_load_balancer(&lb.id).await.expect_err("404");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(404), "LoadBalancerNotFound")
    );
    // The VIP went back to the pool.
    let lb3 = c
        .create_load_balancer(&CreateLoadBalancerRequest {
            name: "third".into(),
            listeners: vec![listener(80, 30080)],
            ..Default::default()
        })
        .await
        .expect("third");
    assert_eq!(lb3.vip, lb.vip);
    s.shutdown().await;
}

#[tokio::test]
async fn routes_are_validated() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    let i = c
        .run_instance(&RunInstanceRequest::default())
        .await
        .expect("run");
    let tables = c.list_route_tables().await.expect("tables");
    assert_eq!(tables.len(), 1);
    let t = &tables[0];
    assert!(t.id.starts_with("rtb-") && t.main);
    assert_eq!(t.routes[0].name, "local");
    assert_eq!(t.routes[0].destination_cidr, "10.0.0.0/16");
    assert_eq!(c.main_route_table().await.expect("main").id, t.id);

    let req = |cidr: &str, inst: &str| CreateRouteRequest {
        destination_cidr: cidr.into(),
        instance_id: inst.into(),
        name: "node-1".into(),
        description: "pod CIDR of node-1".into(),
    };
    let r = c
        .create_route(&t.id, &req("10.244.1.0/24", &i.id))
        .await
        .expect("route");
    assert_eq!(
        (r.state, r.origin.as_str()),
        (RouteState::Active, "CreateRoute")
    );
    for (cidr, status, code) in [
        ("10.244.1.0/24", 409, "RouteAlreadyExists"),
        ("10.244.0.0/16", 400, "InvalidRoute.Overlap"),
        ("10.0.5.0/24", 400, "InvalidRoute.Overlap"),
        ("10.244.1.7/24", 400, "InvalidParameterValue"),
        ("10.244.1.0/40", 400, "InvalidParameterValue"),
        ("banana", 400, "InvalidParameterValue"),
    ] {
        let e = c
            .create_route(&t.id, &req(cidr, &i.id))
            .await
            .expect_err(cidr);
        assert_eq!(
            (e.status(), err_code(&e)),
            (Some(status), code),
            "{cidr}: {e}"
        );
    }
    let e = c
        .create_route(&t.id, &req("10.244.2.0/24", "i-00000000000000000"))
        .await
        .expect_err("unknown instance");
    assert_eq!(err_code(&e), "InvalidInstanceID.NotFound");
    let e = c
        .create_route("rtb-00000000000000000", &req("10.244.2.0/24", &i.id))
        .await
        .expect_err("unknown table");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(404), "InvalidRouteTableID.NotFound")
    );

    c.create_route(&t.id, &req("10.244.2.0/24", &i.id))
        .await
        .expect("second");
    assert_eq!(c.list_routes(&t.id).await.expect("routes").len(), 3);
    c.terminate_instance(&i.id).await.expect("terminate");
    c.wait_for_instance_state(&i.id, InstanceState::Terminated, Duration::from_secs(5))
        .await
        .expect("terminated");
    let routes = c.list_routes(&t.id).await.expect("routes");
    assert!(routes[1..].iter().all(|r| r.state == RouteState::Blackhole));

    let d = c
        .delete_route(&t.id, "10.244.1.0/24")
        .await
        .expect("delete");
    assert_eq!(d.destination_cidr, "10.244.1.0/24");
    let e = c
        .delete_route(&t.id, "10.244.1.0/24")
        .await
        .expect_err("gone");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(404), "InvalidRoute.NotFound")
    );
    assert_eq!(c.list_routes(&t.id).await.expect("routes").len(), 2);
    s.shutdown().await;
}

#[tokio::test]
async fn deny_policies_answer_access_denied() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, admin, _) = start(dir.path()).await;
    let key = admin
        .create_access_key("cloud-controller-manager")
        .await
        .expect("key");
    let secret = key.secret_access_key.clone().expect("secret once");
    assert!(admin
        .list_access_keys()
        .await
        .expect("keys")
        .iter()
        .all(|k| k.secret_access_key.is_none()));
    let ccm = admin
        .with_credentials(&key.access_key_id, &secret)
        .expect("client");
    let lb = CreateLoadBalancerRequest {
        name: "svc".into(),
        listeners: vec![listener(80, 30080)],
        ..Default::default()
    };

    let p = admin
        .deny("CreateLoadBalancer", Some(&key.access_key_id))
        .await
        .expect("deny");
    assert_eq!(p.effect, "Deny");
    let e = ccm.create_load_balancer(&lb).await.expect_err("denied");
    assert_eq!((e.status(), err_code(&e)), (Some(403), "AccessDenied"));
    let m = e.message().expect("message");
    assert!(
        m.contains("CreateLoadBalancer") && m.contains(&key.access_key_id),
        "{m}"
    );
    // Other actions and other credentials are not affected.
    ccm.list_load_balancers().await.expect("describe allowed");
    let made = admin.create_load_balancer(&lb).await.expect("admin may");
    admin.delete_load_balancer(&made.id).await.expect("delete");

    // A statement for every credential, and a prefix.
    admin.deny("Describe*", None).await.expect("deny all");
    let e = admin
        .list_instances(&InstanceFilter::default())
        .await
        .expect_err("denied");
    assert_eq!(err_code(&e), "AccessDenied");
    // Control operations stay available, so the policy can be lifted.
    assert_eq!(admin.policies().await.expect("policies").len(), 2);
    assert_eq!(
        admin.allow("Describe*", None).await.expect("allow").len(),
        1
    );
    admin
        .list_instances(&InstanceFilter::default())
        .await
        .expect("allowed again");

    let removed = admin
        .allow("CreateLoadBalancer", None)
        .await
        .expect("allow");
    assert_eq!(removed.len(), 1);
    ccm.create_load_balancer(&lb).await.expect("allowed again");
    let e = admin
        .deny("Create Load", None)
        .await
        .expect_err("bad action");
    assert_eq!(err_code(&e), "InvalidParameterValue");
    let e = admin
        .deny("RunInstances", Some("KKIANOTAKEY"))
        .await
        .expect_err("bad key");
    assert_eq!(err_code(&e), "InvalidParameterValue");
    s.shutdown().await;
}

#[tokio::test]
async fn faults_inject_errors_and_latency() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    c.set_fault(
        "DescribeInstances",
        &Fault {
            error_rate: 1.0,
            ..Default::default()
        },
    )
    .await
    .expect("fault");
    for _ in 0..5 {
        let e = c
            .list_instances(&InstanceFilter::default())
            .await
            .expect_err("503");
        assert_eq!(
            (e.status(), err_code(&e)),
            (Some(503), "ServiceUnavailable")
        );
        assert!(e.is_retryable());
    }
    c.list_load_balancers()
        .await
        .expect("other operations work");

    c.set_fault(
        "CreateLoadBalancer",
        &Fault {
            error_rate: 1.0,
            error_code: "RequestLimitExceeded".into(),
            ..Default::default()
        },
    )
    .await
    .expect("fault");
    let e = c
        .create_load_balancer(&CreateLoadBalancerRequest {
            name: "x".into(),
            listeners: vec![listener(80, 30080)],
            ..Default::default()
        })
        .await
        .expect_err("throttled");
    assert_eq!(err_code(&e), "RequestLimitExceeded");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(1)));
    assert!(
        c.list_load_balancers().await.expect("list").is_empty(),
        "nothing was created"
    );

    c.set_fault(
        "DescribeRegions",
        &Fault {
            latency_ms: 300,
            ..Default::default()
        },
    )
    .await
    .expect("latency");
    let t = Instant::now();
    c.regions().await.expect("slow but fine");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(c.faults().await.expect("faults").len(), 3);

    let e = c
        .set_fault(
            "RunInstances",
            &Fault {
                error_rate: 1.5,
                ..Default::default()
            },
        )
        .await
        .expect_err("rate");
    assert_eq!(err_code(&e), "InvalidParameterValue");

    c.clear_faults(Some("DescribeInstances"))
        .await
        .expect("clear one");
    c.list_instances(&InstanceFilter::default())
        .await
        .expect("works again");
    c.set_fault(
        "*",
        &Fault {
            error_rate: 1.0,
            ..Default::default()
        },
    )
    .await
    .expect("all");
    assert!(c.subnets().await.is_err());
    c.clear_faults(None).await.expect("clear all");
    assert!(c.faults().await.expect("faults").is_empty());
    c.subnets().await.expect("works again");
    s.shutdown().await;
}

#[tokio::test]
async fn quotas_limit_instances_and_load_balancers() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    let q = c
        .set_quotas(&UpdateQuotasRequest {
            max_instances: Some(2),
            max_load_balancers: Some(1),
            ..Default::default()
        })
        .await
        .expect("quotas");
    assert_eq!((q.max_instances, q.max_load_balancers), (2, 1));
    let a = c
        .run_instance(&RunInstanceRequest::default())
        .await
        .expect("1");
    c.run_instance(&RunInstanceRequest::default())
        .await
        .expect("2");
    let e = c
        .run_instance(&RunInstanceRequest::default())
        .await
        .expect_err("3");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(400), "InstanceLimitExceeded")
    );
    c.terminate_instance(&a.id).await.expect("terminate");
    c.wait_for_instance_state(&a.id, InstanceState::Terminated, Duration::from_secs(5))
        .await
        .expect("terminated");
    c.run_instance(&RunInstanceRequest::default())
        .await
        .expect("terminated ones do not count");

    let lb = |n: &str| CreateLoadBalancerRequest {
        name: n.into(),
        listeners: vec![listener(80, 30080)],
        ..Default::default()
    };
    c.create_load_balancer(&lb("one")).await.expect("one");
    let e = c.create_load_balancer(&lb("two")).await.expect_err("two");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(400), "LoadBalancerLimitExceeded")
    );
    s.shutdown().await;
}

#[tokio::test]
async fn volumes_are_files_attached_to_one_instance_of_their_zone() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    let in_zone = |z: &str| RunInstanceRequest {
        zone: Some(z.into()),
        ..Default::default()
    };
    let a = c.run_instance(&in_zone("kumo-1a")).await.expect("a");
    let b = c.run_instance(&in_zone("kumo-1a")).await.expect("b");
    let other = c.run_instance(&in_zone("kumo-1b")).await.expect("other");
    for i in [&a, &b, &other] {
        running(&c, &i.id).await;
    }
    let req = CreateVolumeRequest {
        name: "pvc-1".into(),
        zone: "kumo-1a".into(),
        size_gib: 2,
        ..Default::default()
    };
    let v = c.create_volume(&req).await.expect("create");
    assert_eq!(
        (v.state, v.size_gib, v.zone.as_str()),
        (VolumeState::Available, 2, "kumo-1a")
    );
    // The data is a sparse file of the volume's size.
    let file = server::volume_file(&std::fs::canonicalize(dir.path()).expect("dir"), &v.id);
    let meta = std::fs::metadata(&file).expect("the volume's file");
    assert_eq!(meta.len(), 2 << 30);
    assert!(meta.blocks() < 64, "sparse: {} blocks", meta.blocks());
    // A retried create answers the same volume; another size under that name is refused.
    assert_eq!(c.create_volume(&req).await.expect("again").id, v.id);
    let e = c
        .create_volume(&CreateVolumeRequest {
            size_gib: 3,
            ..req.clone()
        })
        .await
        .expect_err("mismatch");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(409), "IdempotentParameterMismatch")
    );
    for (zone, size) in [("mars-1a", 1), ("kumo-1a", 0), ("kumo-1a", 20_000)] {
        let e = c
            .create_volume(&CreateVolumeRequest {
                zone: zone.into(),
                size_gib: size,
                ..Default::default()
            })
            .await
            .expect_err("invalid");
        assert_eq!(err_code(&e), "InvalidParameterValue", "{zone} {size}");
    }

    // Attach: only to an instance of its zone, to one instance at a time.
    let e = c.attach_volume(&v.id, &other.id).await.expect_err("zone");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(400), "InvalidVolume.ZoneMismatch")
    );
    let e = c
        .attach_volume("vol-0123456789abcdef0", &a.id)
        .await
        .expect_err("none");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(404), "InvalidVolume.NotFound")
    );
    let att = c.attach_volume(&v.id, &a.id).await.expect("attach");
    assert_eq!(att.state, VolumeState::InUse);
    let at = att.attachment.clone().expect("attachment");
    assert_eq!(
        (at.instance_id.as_str(), at.device.as_str()),
        (a.id.as_str(), "/dev/vdb")
    );
    assert_eq!(c.attach_volume(&v.id, &a.id).await.expect("again"), att);
    let e = c.attach_volume(&v.id, &b.id).await.expect_err("in use");
    assert_eq!((e.status(), err_code(&e)), (Some(409), "VolumeInUse"));
    let e = c.delete_volume(&v.id).await.expect_err("attached");
    assert_eq!((e.status(), err_code(&e)), (Some(409), "VolumeInUse"));
    let w = c
        .create_volume(&CreateVolumeRequest {
            zone: "kumo-1a".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .expect("second");
    let w = c.attach_volume(&w.id, &a.id).await.expect("second attach");
    assert_eq!(w.attachment.expect("att").device, "/dev/vdc");
    let f = VolumeFilter {
        instance_id: Some(a.id.clone()),
        ..Default::default()
    };
    assert_eq!(c.list_volumes(&f).await.expect("list").len(), 2);

    // Grow only.
    let g = c.modify_volume(&v.id, 4).await.expect("grow");
    assert_eq!(g.size_gib, 4);
    assert_eq!(std::fs::metadata(&file).expect("file").len(), 4 << 30);
    let e = c.modify_volume(&v.id, 1).await.expect_err("shrink");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(400), "InvalidParameterValue")
    );

    // Detach, then attach elsewhere; deleting takes the data.
    let e = c
        .detach_volume(&v.id, Some(&b.id))
        .await
        .expect_err("not there");
    assert_eq!((e.status(), err_code(&e)), (Some(409), "IncorrectState"));
    c.detach_volume(&v.id, None).await.expect("detach");
    let e = c.detach_volume(&v.id, None).await.expect_err("twice");
    assert_eq!((e.status(), err_code(&e)), (Some(409), "IncorrectState"));
    c.attach_volume(&v.id, &b.id).await.expect("to b");

    // Terminating an instance detaches its volumes.
    c.terminate_instance(&a.id).await.expect("terminate");
    c.wait_for_instance_state(&a.id, InstanceState::Terminated, Duration::from_secs(5))
        .await
        .expect("terminated");
    assert!(c.list_volumes(&f).await.expect("list").is_empty());

    // Quotas: a count and a total size.
    c.set_quotas(&UpdateQuotasRequest {
        max_volume_gib: Some(6),
        ..Default::default()
    })
    .await
    .expect("quota");
    let big = CreateVolumeRequest {
        zone: "kumo-1c".into(),
        size_gib: 2,
        ..Default::default()
    };
    let e = c.create_volume(&big).await.expect_err("gib");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(400), "VolumeLimitExceeded")
    );
    c.set_quotas(&UpdateQuotasRequest {
        max_volume_gib: Some(1000),
        max_volumes: Some(2),
        ..Default::default()
    })
    .await
    .expect("quota");
    let e = c.create_volume(&big).await.expect_err("count");
    assert_eq!(
        (e.status(), err_code(&e)),
        (Some(400), "VolumeLimitExceeded")
    );

    // A deny policy covers the volume actions like any other.
    c.deny("AttachVolume", None).await.expect("deny");
    let e = c.attach_volume(&v.id, &b.id).await.expect_err("denied");
    assert_eq!((e.status(), err_code(&e)), (Some(403), "AccessDenied"));

    // Everything survives a restart; deleting removes the file.
    s.shutdown().await;
    let (s, c, _) = start(dir.path()).await;
    let again = c.describe_volume(&v.id).await.expect("after restart");
    assert_eq!(
        (again.size_gib, again.attachment.map(|a| a.instance_id)),
        (4, Some(b.id.clone()))
    );
    c.detach_volume(&v.id, Some(&b.id)).await.expect("detach");
    c.delete_volume(&v.id).await.expect("delete");
    assert!(!file.exists());
    let e = c.describe_volume(&v.id).await.expect_err("gone");
    assert_eq!(err_code(&e), "InvalidVolume.NotFound");
    s.shutdown().await;
}
