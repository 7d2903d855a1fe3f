//! Bad input never gets a 500 or a panic, and concurrent clients never share an address.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use kumo_cloud::server::ROUTES;
use kumo_cloud::*;

/// Bodies that are wrong in every way a client gets them wrong.
fn bad_bodies() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = [
        "",
        "{",
        "}",
        "[]",
        "null",
        "7",
        "\"x\"",
        "{\"a\":",
        "{}",
        "{\"name\":null}",
        "{\"name\":\"\"}",
        "{\"name\":\"x\",\"listeners\":[{\"port\":70000,\"protocol\":\"TCP\",\"targetPort\":1}]}",
        "{\"name\":\"x\",\"listeners\":[{\"port\":-1,\"protocol\":\"TCP\",\"targetPort\":1}]}",
        "{\"name\":\"x\",\"listeners\":[{\"port\":80,\"protocol\":\"SCTP\",\"targetPort\":1}]}",
        "{\"name\":\"x\",\"listeners\":[{}]}",
        "{\"listeners\":null}",
        "{\"targets\":[1,2]}",
        "{\"destinationCidr\":\"10.244.0.0/16\",\"instanceId\":\"\"}",
        "{\"destinationCidr\":\"::/0\",\"instanceId\":\"i-1\"}",
        "{\"errorRate\":\"NaN\"}",
        "{\"errorRate\":1e400}",
        "{\"latencyMs\":-5}",
        "{\"maxInstances\":4294967296}",
        "{\"action\":\"\"}",
        "{\"action\":\"*\",\"effect\":\"Allow\"}",
        "{\"zone\":\"kumo-1a\",\"subnetId\":\"subnet-x\"}",
        "{\"userData\":{\"a\":1}}",
        "{\"healthCheck\":{\"protocol\":\"HTTP\"},\"name\":\"x\",\"listeners\":[]}",
        "\u{0}\u{1}",
        "{\"name\":\"\u{2603}\"}",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    v.push(vec![0xff, 0xfe, 0x00]);
    v.push(format!("{{\"name\":\"{}\"}}", "n".repeat(100_000)).into_bytes());
    v.push(format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes());
    v
}

#[tokio::test]
async fn bad_input_gets_4xx_never_500() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    let auth = admin_auth(dir.path());
    let inst = c
        .run_instance(&RunInstanceRequest::default())
        .await
        .expect("run");
    let table = c.main_route_table().await.expect("table").id;
    let ids = [inst.id.as_str(), table.as_str(), "i-%2F..%2F%00"];
    let mut n = 0;
    for r in ROUTES {
        let ids = if r.path.contains('{') {
            &ids[..]
        } else {
            &ids[..1]
        };
        for id in ids {
            let path = r.path.replace("{id}", id).replace("{operation}", id);
            for body in bad_bodies() {
                let got = raw(&s, r.method, &path, Some(&auth), &body).await;
                n += 1;
                assert!(
                    got.status < 500,
                    "{} {path} with {:?}: {} {}",
                    r.method,
                    String::from_utf8_lossy(&body[..body.len().min(80)]),
                    got.status,
                    got.body
                );
                if got.status >= 400 {
                    assert!(
                        got.body["error"]["code"]
                            .as_str()
                            .is_some_and(|c| !c.is_empty()),
                        "{} {path}: {}",
                        r.method,
                        got.body
                    );
                }
            }
        }
    }
    assert!(n > 2000, "{n} requests");
    // The cloud still works, and its state is still readable after a restart.
    c.regions().await.expect("alive");
    s.shutdown().await;
    let (s, c, _) = start(dir.path()).await;
    c.describe_instance(&inst.id).await.expect("state intact");
    s.shutdown().await;
}

#[tokio::test]
async fn concurrent_creates_get_distinct_addresses() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, c, _) = start(dir.path()).await;
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..120 {
        let c = c.clone();
        tasks.spawn(async move {
            let lb = c
                .create_load_balancer(&CreateLoadBalancerRequest {
                    name: format!("svc-{n}"),
                    listeners: vec![Listener {
                        port: 80,
                        protocol: Protocol::Tcp,
                        target_port: 30000 + n,
                    }],
                    ..Default::default()
                })
                .await
                .expect("lb");
            let i = c
                .run_instance(&RunInstanceRequest {
                    zone: Some("kumo-1b".into()),
                    ..Default::default()
                })
                .await
                .expect("instance");
            (lb.vip, i.private_ip)
        });
    }
    let mut vips = BTreeSet::new();
    let mut ips = BTreeSet::new();
    while let Some(r) = tasks.join_next().await {
        let (vip, ip) = r.expect("task");
        assert!(vips.insert(vip.clone()), "VIP {vip} handed out twice");
        assert!(ips.insert(ip.clone()), "IP {ip} handed out twice");
    }
    assert_eq!((vips.len(), ips.len()), (120, 120));
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "240 creates took {:?}",
        t.elapsed()
    );
    s.shutdown().await;
}
