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

/// A namespace of its own named `name`-PID, and node-a's proxier programming it.
fn proxier(name: &str) -> (Netns, NftProxier) {
    let ns = Netns(format!("{name}-{}", std::process::id()));
    let ok = Command::new("ip")
        .args(["netns", "add", &ns.0])
        .status()
        .expect("ip");
    assert!(ok.success(), "ip netns add (root and iproute2 needed)");
    let p = NftProxier::new(NftConfig {
        node_name: "node-a".into(),
        node_ips: vec!["10.0.1.4".parse().expect("ip")],
        cluster_cidr: Some(("10.244.0.0".parse().expect("ip"), 16)),
        service_cidrs: vec![("10.96.0.0".parse().expect("ip"), 12)],
        netns: Some(format!("/run/netns/{}", ns.0).into()),
    });
    (ns, p)
}

#[test]
fn the_table_has_upstreams_shape_and_syncs_incrementally() {
    let (ns, mut p) = proxier("kumo-nft-test");
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

/// `obj` with a uid and resourceVersion, as an informer hands it out.
fn versioned<T>(obj: &T, rv: &str) -> Arc<T>
where
    T: Clone
        + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
{
    let mut obj = obj.clone();
    let meta = obj.metadata_mut();
    meta.resource_version = Some(rv.to_owned());
    meta.uid = meta.name.as_ref().map(|n| format!("uid-{n}"));
    Arc::new(obj)
}

#[test]
fn unchanged_services_are_not_recomputed_and_shared_elements_stay() {
    let (ns, mut p) = proxier("kumo-nft-test2");
    let svc = |name: &str, ip: &str| {
        let s = service(
            name,
            json!({"type": "ClusterIP", "clusterIP": ip,
                "ports": [{"name": "p80", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}),
            json!({}),
        );
        versioned(&*s, "1")
    };
    // Two Services select the same local pod: both want its hairpin element.
    let (a, b) = (svc("a", "10.96.0.51"), svc("b", "10.96.0.52"));
    let pod = json!([ready("10.244.1.2", "node-a")]);
    let (sa, sb) = (
        versioned(&*slice("a", "p80", pod.clone()), "1"),
        versioned(&*slice("b", "p80", pod.clone()), "1"),
    );
    let hairpin = "10.244.1.2 . 10.244.1.2 . tcp . 8080";
    let first = p
        .sync(&[a.clone(), b.clone()], &[sa.clone(), sb.clone()])
        .expect("first sync");
    assert!(first.full && first.service_ports == 2, "{first:?}");
    assert!(list(&ns.0).contains(hairpin));
    // The same objects (same resourceVersions): nothing recomputed, nothing sent, even
    // if a copy's content differed (the informer's objects are what a version means).
    let altered = versioned(&*slice("a", "p80", json!([])), "1");
    let same = p
        .sync(&[a.clone(), b.clone()], &[altered, sb.clone()])
        .expect("second sync");
    assert_eq!(same.commands, 0, "{same:?}");
    // One slice at a new version: only its Service's part is sent.
    let moved = versioned(
        &*slice(
            "a",
            "p80",
            json!([ready("10.244.1.2", "node-a"), ready("10.244.2.7", "node-b")]),
        ),
        "2",
    );
    let one = p
        .sync(&[a.clone(), b.clone()], &[moved.clone(), sb.clone()])
        .expect("third sync");
    assert!(one.commands > 0 && one.commands <= 4, "{one:?}");
    assert!(list(&ns.0).contains("numgen random mod 2"));
    // b goes: the element a still wants stays; b's cluster IP goes.
    p.sync(std::slice::from_ref(&a), std::slice::from_ref(&moved))
        .expect("fourth sync");
    let text = list(&ns.0);
    assert!(text.contains(hairpin), "{text}");
    assert!(!text.contains("10.96.0.52"), "{text}");
    // a goes too: so does the element.
    p.sync(&[], &[]).expect("fifth sync");
    let text = list(&ns.0);
    assert!(!text.contains("10.244.1.2 . 10.244.1.2"), "{text}");
    assert!(!text.contains("10.96.0.51"), "{text}");
    p.cleanup().expect("cleanup");
}

/// `conntrack ARGS` in namespace `ns`.
fn conntrack(ns: &str, args: &[&str]) -> String {
    let o = Command::new("ip")
        .args(["netns", "exec", ns, "conntrack"])
        .args(args)
        .output()
        .expect("conntrack (apt-get install conntrack)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn udp_flows_to_endpoints_that_are_gone_are_cleared() {
    let (ns, mut p) = proxier("kumo-nft-test3");
    // A client's DNS flow, NATed to the endpoint 10.244.9.9, and one to the endpoint
    // that stays (10.244.2.3).
    for (sport, ep) in [("40000", "10.244.9.9"), ("40001", "10.244.2.3")] {
        conntrack(
            &ns.0,
            &[
                "-I",
                "-p",
                "udp",
                "-s",
                "10.244.1.5",
                "-d",
                "10.96.0.10",
                "--sport",
                sport,
                "--dport",
                "53",
                "-r",
                ep,
                "-q",
                "10.244.1.5",
                "--reply-port-src",
                "53",
                "--reply-port-dst",
                sport,
                "-t",
                "100",
                "-u",
                "SEEN_REPLY",
            ],
        );
    }
    let dns = versioned(
        &*service(
            "kube-dns",
            json!({"type": "ClusterIP", "clusterIP": "10.96.0.10",
                "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
            json!({}),
        ),
        "1",
    );
    let mut s = (*slice("kube-dns", "dns", json!([ready("10.244.2.3", "node-b")]))).clone();
    s.ports = Some(vec![serde_json::from_value(
        json!({"name": "dns", "port": 53, "protocol": "UDP"}),
    )
    .expect("port")]);
    let s = versioned(&s, "1");
    p.sync(&[dns], &[s]).expect("sync");
    let flows = conntrack(&ns.0, &["-L", "-p", "udp"]);
    assert!(!flows.contains("src=10.244.9.9"), "{flows}");
    assert!(flows.contains("src=10.244.2.3"), "{flows}");
    p.cleanup().expect("cleanup");
}
