//! The VPC on real namespaces: two instances in different subnets reach each other, a
//! range behind one is reached only while the VPC carries its route, and the host's own
//! network never changes.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kumo_vpc::{Cidr, Vpc};

fn ip(args: &[&str]) -> String {
    let o = Command::new("ip").args(args).output().expect("ip");
    assert!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The host's links, addresses, routes and rules, without counters.
fn host_network() -> String {
    let mut out = String::new();
    for args in [
        &["-o", "link", "show"][..],
        &["-o", "addr", "show"],
        &["route", "show", "table", "all"],
        &["rule", "show"],
    ] {
        for line in ip(args).lines() {
            let words: Vec<&str> = line
                .split_whitespace()
                .filter(|w| !w.contains("lft"))
                .collect();
            out.push_str(&words.join(" "));
            out.push('\n');
        }
    }
    out
}

/// Runs `f` on a thread inside namespace `ns`.
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("namespace");
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("thread")
}

/// A server in `ns` on `addr` answering each connection with `hello`.
fn serve(ns: &str, addr: SocketAddr) {
    let listener = in_netns(ns, move || TcpListener::bind(addr).expect("bind"));
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let mut s = s;
            let _ = s.write_all(b"hello");
        }
    });
}

fn reach(ns: &str, addr: SocketAddr) -> Result<String, String> {
    in_netns(ns, move || {
        let mut s =
            TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
        let mut text = String::new();
        s.read_to_string(&mut text).map_err(|e| e.to_string())?;
        Ok(text)
    })
}

struct Netns(String);

struct Teardown(std::path::PathBuf);

impl Drop for Teardown {
    fn drop(&mut self) {
        let _ = kumo_vpc::teardown(&self.0);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

#[test]
fn instances_reach_each_other_and_routes_carry_pod_ranges() {
    if !nix::unistd::Uid::effective().is_root() {
        panic!("the VPC needs root (network namespaces)");
    }
    let before = host_network();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("vpc");
    let subnets = [
        Cidr::parse("10.0.1.0/24").expect("cidr"),
        Cidr::parse("10.0.2.0/24").expect("cidr"),
    ];
    let vpc = Vpc::create(&dir, &subnets).expect("VPC");
    let _vpc_gone = Teardown(dir.clone());
    let a = Netns(kumo_vpc::netns_name(tmp.path(), "a"));
    let b = Netns(kumo_vpc::netns_name(tmp.path(), "b"));
    for n in [&a, &b] {
        ip(&["netns", "add", &n.0]);
        ip(&["-n", &n.0, "link", "set", "lo", "up"]);
    }
    vpc.attach(&a.0, Ipv4Addr::new(10, 0, 1, 4))
        .expect("attach a");
    vpc.attach(&b.0, Ipv4Addr::new(10, 0, 2, 4))
        .expect("attach b");
    // Across subnets, through the VPC's router.
    serve(&b.0, "10.0.2.4:7000".parse().expect("addr"));
    assert_eq!(
        reach(&a.0, "10.0.2.4:7000".parse().expect("addr")).as_deref(),
        Ok("hello")
    );
    // A pod range behind b: reached only through the route.
    ip(&["-n", &b.0, "link", "add", "pods", "type", "bridge"]);
    ip(&["-n", &b.0, "addr", "add", "10.244.1.1/24", "dev", "pods"]);
    ip(&["-n", &b.0, "link", "set", "pods", "up"]);
    let pod: SocketAddr = "10.244.1.1:7001".parse().expect("addr");
    serve(&b.0, pod);
    assert!(reach(&a.0, pod).is_err(), "no route yet");
    let route = (
        Cidr::parse("10.244.1.0/24").expect("cidr"),
        Ipv4Addr::new(10, 0, 2, 4),
    );
    vpc.set_routes(&[route]).expect("routes");
    assert_eq!(vpc.routes().expect("routes"), ["10.244.1.0/24"]);
    assert_eq!(reach(&a.0, pod).as_deref(), Ok("hello"));
    vpc.set_routes(&[]).expect("no routes");
    assert!(vpc.routes().expect("routes").is_empty());
    assert!(reach(&a.0, pod).is_err(), "the route is gone");
    // A load balancer: from the public side, its VIP reaches the healthy target.
    let public = vpc.record_public_netns();
    let vip: SocketAddr = "203.0.113.9:80".parse().expect("addr");
    let lb = |targets: Vec<Ipv4Addr>| kumo_vpc::LoadBalancer {
        id: "lb-1".into(),
        vip: Ipv4Addr::new(203, 0, 113, 9),
        listeners: vec![("tcp".into(), 80, 7000)],
        targets,
    };
    vpc.set_load_balancers(&[lb(vec![Ipv4Addr::new(10, 0, 2, 4)])])
        .expect("load balancer");
    assert_eq!(reach(&public, vip).as_deref(), Ok("hello"));
    // The public side reaches no private address.
    assert!(reach(&public, "10.0.2.4:7000".parse().expect("addr")).is_err());
    // No healthy target: refused at once.
    vpc.set_load_balancers(&[lb(vec![])])
        .expect("load balancer");
    let refused = reach(&public, vip).expect_err("refused");
    assert!(refused.contains("refused"), "{refused}");
    // Health checks from inside the VPC.
    let timeout = std::time::Duration::from_secs(1);
    assert!(vpc.probe("10.0.2.4:7000".parse().expect("addr"), None, timeout));
    assert!(!vpc.probe("10.0.2.4:7009".parse().expect("addr"), None, timeout));
    // The host saw none of it; teardown leaves nothing.
    assert_eq!(host_network(), before, "the host's network changed");
    let ns = vpc.netns().to_owned();
    kumo_vpc::teardown(&dir).expect("teardown");
    let list = ip(&["netns", "list"]);
    assert!(!list.contains(&ns), "{ns} left");
    assert!(!list.contains(&public), "{public} left");
    assert!(!Path::new(&dir).join("vpc.json").exists());
}
