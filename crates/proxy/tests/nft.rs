//! The nftables proxier against the real `nft` in a namespace of its own: the table it
//! writes has upstream's shape, a sync without change sends nothing, and a change sends
//! only what changed.

use std::process::Command;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kumo_proxy::nft::{NftConfig, NftProxier};
use serde_json::json;

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

fn service(name: &str, spec: serde_json::Value, status: serde_json::Value) -> Arc<Service> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns1"},
            "spec": spec, "status": status,
        }))
        .expect("service"),
    )
}

fn slice(svc: &str, port: &str, eps: serde_json::Value) -> Arc<EndpointSlice> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": format!("{svc}-abc"), "namespace": "ns1",
                "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "ports": [{"name": port, "port": 8080, "protocol": "TCP"}],
            "endpoints": eps,
        }))
        .expect("slice"),
    )
}

fn ready(ip: &str, node: &str) -> serde_json::Value {
    json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": node})
}

fn list(ns: &str) -> String {
    let o = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "nft",
            "list",
            "table",
            "ip",
            "kube-proxy",
        ])
        .output()
        .expect("nft");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_table_has_upstreams_shape_and_syncs_incrementally() {
    let ns = Netns(format!("kumo-nft-test-{}", std::process::id()));
    let ok = Command::new("ip")
        .args(["netns", "add", &ns.0])
        .status()
        .expect("ip");
    assert!(ok.success(), "ip netns add (root and iproute2 needed)");
    let mut p = NftProxier::new(NftConfig {
        node_name: "node-a".into(),
        node_ips: vec!["10.0.1.4".parse().expect("ip")],
        cluster_cidr: Some(("10.244.0.0".parse().expect("ip"), 16)),
        service_cidrs: vec![("10.96.0.0".parse().expect("ip"), 12)],
        netns: Some(format!("/run/netns/{}", ns.0).into()),
    });
    let web = service(
        "svc1",
        json!({"type": "NodePort", "clusterIP": "10.96.0.41",
            "ports": [{"name": "p80", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"}]}),
        json!({}),
    );
    let sticky = service(
        "sticky",
        json!({"type": "ClusterIP", "clusterIP": "10.96.0.42", "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
            "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}]}),
        json!({}),
    );
    let lb = service(
        "lb",
        json!({"type": "LoadBalancer", "clusterIP": "10.96.0.43", "externalTrafficPolicy": "Local",
            "loadBalancerSourceRanges": ["203.0.113.0/24"],
            "ports": [{"name": "p80", "port": 80, "nodePort": 30081, "protocol": "TCP"}]}),
        json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}),
    );
    let empty = service(
        "empty",
        json!({"type": "ClusterIP", "clusterIP": "10.96.0.44",
            "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}]}),
        json!({}),
    );
    let services = vec![web, sticky, lb, empty];
    let mut slices = vec![
        slice(
            "svc1",
            "p80",
            json!([ready("10.244.1.2", "node-a"), ready("10.244.2.2", "node-b")]),
        ),
        slice("sticky", "p80", json!([ready("10.244.1.3", "node-a")])),
        slice("lb", "p80", json!([ready("10.244.2.9", "node-b")])),
    ];
    let first = p.sync(&services, &slices).expect("first sync");
    assert!(first.full);
    assert_eq!(first.service_ports, 4);
    let text = list(&ns.0);
    for want in [
        "chain services",
        "map service-ips",
        "map service-nodeports",
        "set cluster-ips",
        "chain service-ULMVA6XW-ns1/svc1/tcp/p80",
        "chain external-ULMVA6XW-ns1/svc1/tcp/p80",
        "numgen random mod 2",
        "10.96.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80",
        "tcp . 30080 : goto external-ULMVA6XW-ns1/svc1/tcp/p80",
        "type filter hook forward priority filter",
        "type nat hook prerouting priority dstnat",
        "type filter hook prerouting priority dstnat - 10",
        "masquerade fully-random",
        "ip saddr != 10.244.0.0/16",
        "update @affinity-",
        "10.96.0.44 . tcp . 80 comment \"ns1/empty:p80\" : goto reject-chain",
        "198.51.100.7 . tcp . 80 : goto firewall-",
        "ip saddr != 203.0.113.0/24 drop",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    // eTP Local with no endpoint on this node: external traffic is dropped.
    assert!(
        text.contains("tcp . 30081 comment \"ns1/lb:p80\" : drop"),
        "{text}"
    );
    // Nothing changed: nothing sent.
    let again = p.sync(&services, &slices).expect("second sync");
    assert_eq!((again.full, again.commands), (false, 0));
    // One endpoint goes: only that Service's chain and nothing else.
    slices[0] = slice("svc1", "p80", json!([ready("10.244.1.2", "node-a")]));
    let third = p.sync(&services, &slices).expect("third sync");
    assert!(!third.full);
    assert!(third.commands <= 4, "{third:?}");
    let text = list(&ns.0);
    assert!(!text.contains("numgen random mod 2"), "{text}");
    assert!(text.contains("dnat to 10.244.1.2:8080"), "{text}");
    // A Service gone takes its chains and elements along.
    let fewer = vec![services[0].clone()];
    p.sync(&fewer, &slices).expect("fourth sync");
    assert!(p.has_stale_chains());
    // The next sync deletes the chains the last one emptied.
    let fifth = p.sync(&fewer, &slices).expect("fifth sync");
    assert!(fifth.commands > 0 && !p.has_stale_chains(), "{fifth:?}");
    let text = list(&ns.0);
    assert!(
        !text.contains("sticky") && !text.contains("affinity-"),
        "{text}"
    );
    assert!(!text.contains("10.96.0.44"), "{text}");
    p.cleanup().expect("cleanup");
    let o = Command::new("ip")
        .args(["netns", "exec", &ns.0, "nft", "list", "tables"])
        .output()
        .expect("nft");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("kube-proxy"));
}
