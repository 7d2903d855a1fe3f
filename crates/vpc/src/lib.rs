//! The cloud's VPC made of this host's network namespaces: the VPC is a namespace of its
//! own holding one bridge per subnet (the subnet's first address is the gateway, as a
//! cloud's implicit router); each instance's namespace is attached to its subnet's bridge
//! by a veth whose inner end is the instance's `eth0` with its private address; the
//! route table's routes (`10.244.1.0/24 via 10.0.2.4`) are routes of the VPC namespace.
//!
//! Nothing of it touches the host's own namespace: every link is created inside the VPC's
//! namespace with its peer moved straight into the instance's, and deleting a namespace
//! takes its links with it. What a VPC made is recorded in its directory (`vpc.json`) so
//! that [`teardown`] finds it again after a crash.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("{command} failed: {output}")]
    Command { command: String, output: String },
    #[error("{0}")]
    Invalid(String),
}

/// An IPv4 range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    /// Parses `10.0.1.0/24`.
    pub fn parse(s: &str) -> Result<Cidr, Error> {
        let bad = || Error::Invalid(format!("not an IPv4 CIDR: {s:?}"));
        let (a, p) = s.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = a.parse().map_err(|_| bad())?;
        let prefix: u8 = p.parse().map_err(|_| bad())?;
        if prefix > 32 {
            return Err(bad());
        }
        Ok(Cidr { addr, prefix })
    }

    fn mask(self) -> u32 {
        if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix)
        }
    }

    /// Whether `ip` is in the range.
    pub fn contains(self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.addr) & self.mask()
    }

    /// The range's first host address (a subnet's gateway).
    pub fn first_host(self) -> Ipv4Addr {
        Ipv4Addr::from((u32::from(self.addr) & self.mask()) + 1)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// One subnet's bridge.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SubnetLink {
    pub cidr: Cidr,
    /// The bridge's name in the VPC namespace (`br-10-0-1`).
    pub bridge: String,
    /// The gateway address the bridge carries.
    pub gateway: Ipv4Addr,
}

/// What is recorded of a VPC in its directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    /// The VPC's namespace (under `/run/netns`).
    pub netns: String,
    pub subnets: Vec<SubnetLink>,
    /// The public side's namespace: "the internet", where load balancers' VIPs are
    /// reached from.
    #[serde(default)]
    pub public_netns: String,
}

/// The link between the VPC and the public side (the internet gateway): the VPC's end,
/// and the public side's own address (the client every `kumo cloud exec` command is).
pub const GATEWAY_VPC: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 1);
/// The public side's address on the gateway link.
pub const GATEWAY_PUBLIC: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 2);

/// One load balancer as the VPC carries it: connections to `vip` on each listener go to
/// one of `targets` (their private addresses) on the listener's target port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadBalancer {
    pub id: String,
    pub vip: Ipv4Addr,
    /// (protocol `tcp`/`udp`, port, target port).
    pub listeners: Vec<(String, u16, u16)>,
    /// The healthy targets; none: connections are refused.
    pub targets: Vec<Ipv4Addr>,
}

/// The table the load balancers' rules live in, in the VPC's namespace.
pub const LB_TABLE: &str = "kumo-lb";

/// A VPC on this host.
#[derive(Debug)]
pub struct Vpc {
    dir: PathBuf,
    record: Record,
}

/// The route protocol number the VPC's programmed routes carry, so that routes of the
/// route table are told from the subnets' own (`proto static`).
const ROUTE_PROTO: &str = "static";

impl Vpc {
    /// Makes the VPC's namespace with a bridge for each subnet, taking down first what an
    /// earlier run of the same directory left.
    pub fn create(dir: &Path, subnets: &[Cidr]) -> Result<Vpc, Error> {
        teardown(dir)?;
        std::fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let record = Record {
            netns: netns_name(dir, "vpc"),
            public_netns: netns_name(dir, "public"),
            subnets: subnets
                .iter()
                .map(|c| {
                    let o = c.addr.octets();
                    SubnetLink {
                        cidr: *c,
                        bridge: format!("br-{}-{}-{}", o[0], o[1], o[2]),
                        gateway: c.first_host(),
                    }
                })
                .collect(),
        };
        let vpc = Vpc {
            dir: dir.to_owned(),
            record,
        };
        vpc.save()?;
        vpc.build().inspect_err(|_| {
            if let Err(e) = teardown(dir) {
                tracing::warn!(error = %e, "tearing down a VPC that did not come up");
            }
        })?;
        Ok(vpc)
    }

    fn build(&self) -> Result<(), Error> {
        let ns = &self.record.netns;
        run(Command::new("ip").args(["netns", "add", ns]))?;
        self.ip(&["link", "set", "lo", "up"])?;
        // The VPC routes between its subnets and to the routes' targets.
        sysctl(ns, "net.ipv4.ip_forward", "1")?;
        for s in &self.record.subnets {
            self.ip(&["link", "add", &s.bridge, "type", "bridge"])?;
            let gw = format!("{}/{}", s.gateway, s.cidr.prefix);
            self.ip(&["addr", "add", &gw, "dev", &s.bridge])?;
            self.ip(&["link", "set", &s.bridge, "up"])?;
        }
        // The public side: its own namespace behind the internet gateway, which routes
        // the VIP ranges to the VPC and nothing else (private addresses are not reachable
        // from the internet).
        let public = &self.record.public_netns;
        run(Command::new("ip").args(["netns", "add", public]))?;
        let pub_ip = |args: &[&str]| run(Command::new("ip").arg("-n").arg(public).args(args));
        pub_ip(&["link", "set", "lo", "up"])?;
        self.ip(&[
            "link", "add", "igw0", "type", "veth", "peer", "name", "eth0", "netns", public,
        ])?;
        self.ip(&["addr", "add", &format!("{GATEWAY_VPC}/30"), "dev", "igw0"])?;
        self.ip(&["link", "set", "igw0", "up"])?;
        pub_ip(&[
            "addr",
            "add",
            &format!("{GATEWAY_PUBLIC}/30"),
            "dev",
            "eth0",
        ])?;
        pub_ip(&["link", "set", "eth0", "up"])?;
        for pool in VIP_POOLS {
            pub_ip(&["route", "add", pool, "via", &GATEWAY_VPC.to_string()])?;
        }
        tracing::info!(netns = %ns, subnets = self.record.subnets.len(), "VPC is up");
        Ok(())
    }

    fn save(&self) -> Result<(), Error> {
        let text = serde_json::to_string_pretty(&self.record).unwrap_or_default();
        std::fs::write(self.dir.join("vpc.json"), text).map_err(io_err("writing vpc.json"))
    }

    fn ip(&self, args: &[&str]) -> Result<String, Error> {
        run(Command::new("ip")
            .arg("-n")
            .arg(&self.record.netns)
            .args(args))
    }

    /// The VPC's namespace.
    pub fn netns(&self) -> &str {
        &self.record.netns
    }

    /// The public side's namespace.
    pub fn record_public_netns(&self) -> String {
        self.record.public_netns.clone()
    }

    /// The subnets' bridges.
    pub fn subnets(&self) -> &[SubnetLink] {
        &self.record.subnets
    }

    /// Attaches the instance whose namespace is `node_netns` with private address `ip`:
    /// a veth from its subnet's bridge to its `eth0`, the address on it, and its default
    /// route through the subnet's gateway. The instance forwards (its pods' traffic goes
    /// out through it).
    pub fn attach(&self, node_netns: &str, ip: Ipv4Addr) -> Result<(), Error> {
        let subnet = self
            .record
            .subnets
            .iter()
            .find(|s| s.cidr.contains(ip))
            .ok_or_else(|| Error::Invalid(format!("{ip} is in none of the VPC's subnets")))?;
        let outer = veth_name(node_netns);
        // A veth left from an earlier boot of the same instance goes first.
        let _ = self.ip(&["link", "del", &outer]);
        self.ip(&[
            "link", "add", &outer, "type", "veth", "peer", "name", "eth0", "netns", node_netns,
        ])?;
        self.ip(&["link", "set", &outer, "master", &subnet.bridge])?;
        self.ip(&["link", "set", &outer, "up"])?;
        let node = |args: &[&str]| run(Command::new("ip").arg("-n").arg(node_netns).args(args));
        node(&[
            "addr",
            "add",
            &format!("{ip}/{}", subnet.cidr.prefix),
            "dev",
            "eth0",
        ])?;
        node(&["link", "set", "eth0", "up"])?;
        node(&[
            "route",
            "add",
            "default",
            "via",
            &subnet.gateway.to_string(),
        ])?;
        sysctl(node_netns, "net.ipv4.ip_forward", "1")?;
        tracing::info!(netns = %node_netns, %ip, bridge = %subnet.bridge, "instance attached");
        Ok(())
    }

    /// Makes the VPC carry exactly `routes` (destination, next hop) beyond its subnets.
    /// Every route is tried; the first failure is returned after.
    pub fn set_routes(&self, routes: &[(Cidr, Ipv4Addr)]) -> Result<(), Error> {
        let current = self.routes()?;
        let mut first_error = None;
        for dst in &current {
            if !routes.iter().any(|(c, _)| c.to_string() == *dst) {
                if let Err(e) = self.ip(&["route", "del", dst, "proto", ROUTE_PROTO]) {
                    first_error.get_or_insert(e);
                }
            }
        }
        for (dst, via) in routes {
            let Some(subnet) = self.record.subnets.iter().find(|s| s.cidr.contains(*via)) else {
                first_error.get_or_insert(Error::Invalid(format!(
                    "the next hop {via} of {dst} is in none of the VPC's subnets"
                )));
                continue;
            };
            let (dst, via) = (dst.to_string(), via.to_string());
            // onlink: the next hop is on its subnet's bridge even while no instance is
            // attached to it (a bridge without ports has no carrier).
            if let Err(e) = self.ip(&[
                "route",
                "replace",
                &dst,
                "via",
                &via,
                "dev",
                &subnet.bridge,
                "proto",
                ROUTE_PROTO,
                "onlink",
            ]) {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The destinations of the routes the VPC carries for its route table.
    pub fn routes(&self) -> Result<Vec<String>, Error> {
        let text = self.ip(&["-j", "route", "show", "proto", ROUTE_PROTO])?;
        let routes: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
        Ok(routes
            .iter()
            .filter_map(|r| r.get("dst").and_then(|d| d.as_str()).map(str::to_owned))
            .collect())
    }

    /// A command to run inside the VPC's namespace (only its network: files and processes
    /// are the host's).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.record.netns))
            .arg("--")
            .arg(program);
        c
    }

    /// Makes the VPC carry exactly `lbs`: the table `ip kumo-lb` in its namespace, DNAT of
    /// each VIP:port to one of its healthy targets at random (connections spread; the
    /// client's address kept, the reply un-NATed on its way back through the VPC), a
    /// reset or port-unreachable where no target is healthy. Rebuilt whole in one
    /// transaction (load balancers change rarely).
    pub fn set_load_balancers(&self, lbs: &[LoadBalancer]) -> Result<(), Error> {
        let mut cmds = vec![
            json!({"add": {"table": {"family": "ip", "name": LB_TABLE}}}),
            json!({"delete": {"table": {"family": "ip", "name": LB_TABLE}}}),
            json!({"add": {"table": {"family": "ip", "name": LB_TABLE}}}),
            json!({"add": {"chain": {"family": "ip", "table": LB_TABLE, "name": "prerouting",
                "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}}}),
            json!({"add": {"chain": {"family": "ip", "table": LB_TABLE, "name": "refuse"}}}),
            json!({"add": {"rule": {"family": "ip", "table": LB_TABLE, "chain": "refuse",
                "expr": [{"reject": null}]}}}),
            json!({"add": {"chain": {"family": "ip", "table": LB_TABLE, "name": "filter",
                "type": "filter", "hook": "prerouting", "prio": -110, "policy": "accept"}}}),
        ];
        for lb in lbs {
            for (proto, port, target_port) in &lb.listeners {
                let key = || {
                    vec![
                        json!({"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": lb.vip.to_string()}}),
                        json!({"match": {"op": "==", "left": {"payload": {"protocol": proto, "field": "dport"}}, "right": port}}),
                    ]
                };
                if lb.targets.is_empty() {
                    // Refused before any address translation (no target to send it to).
                    let mut expr = key();
                    expr.push(json!({"reject": null}));
                    cmds.push(json!({"add": {"rule": {"family": "ip", "table": LB_TABLE,
                        "chain": "filter", "expr": expr,
                        "comment": format!("{} {proto}/{port}: no healthy target", lb.id)}}}));
                    continue;
                }
                let items: Vec<Value> = lb
                    .targets
                    .iter()
                    .enumerate()
                    .map(|(i, t)| json!([i, {"concat": [t.to_string(), target_port]}]))
                    .collect();
                let mut expr = key();
                expr.push(json!({"dnat": {"family": "ip", "addr": {"map": {
                    "key": {"numgen": {"mode": "random", "mod": lb.targets.len(), "offset": 0}},
                    "data": {"set": items},
                }}}}));
                cmds.push(json!({"add": {"rule": {"family": "ip", "table": LB_TABLE,
                    "chain": "prerouting", "expr": expr,
                    "comment": format!("{} {proto}/{port}", lb.id)}}}));
            }
        }
        let doc = json!({"nftables": std::iter::once(json!({"metainfo": {"json_schema_version": 1}})).chain(cmds).collect::<Vec<_>>()});
        // Checked against the `nftables` crate's schema, then applied with `nft -j`.
        let typed: nftables::schema::Nftables<'_> = serde_json::from_value(doc.clone())
            .map_err(|e| Error::Invalid(format!("the load balancers' ruleset: {e}")))?;
        let payload = serde_json::to_string(&typed).unwrap_or_default();
        let mut child = self
            .command("nft")
            .args(["-j", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_err("running nft"))?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            stdin
                .write_all(payload.as_bytes())
                .map_err(io_err("writing to nft"))?;
        }
        let out = child.wait_with_output().map_err(io_err("running nft"))?;
        if !out.status.success() {
            return Err(Error::Command {
                command: "nft -j -f -".into(),
                output: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(())
    }

    /// A health check of `target` from inside the VPC (where the cloud's checkers are):
    /// TCP connects; with `http_path` an HTTP GET whose status must be 2xx or 3xx.
    pub fn probe(&self, target: SocketAddr, http_path: Option<&str>, timeout: Duration) -> bool {
        let path = format!("/run/netns/{}", self.record.netns);
        let http_path = http_path.map(str::to_owned);
        let thread = std::thread::Builder::new()
            .name("vpc-probe".into())
            .spawn(move || {
                let file = std::fs::File::open(&path).ok()?;
                nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
                let mut s = std::net::TcpStream::connect_timeout(&target, timeout).ok()?;
                let Some(p) = http_path else {
                    return Some(true);
                };
                use std::io::{Read, Write};
                s.set_read_timeout(Some(timeout)).ok()?;
                let req = format!(
                    "GET {p} HTTP/1.1\r\nHost: {target}\r\nUser-Agent: kumo-elb-healthchecker/1.0\r\nConnection: close\r\n\r\n"
                );
                s.write_all(req.as_bytes()).ok()?;
                let mut head = [0u8; 64];
                let n = s.read(&mut head).ok()?;
                let line = String::from_utf8_lossy(&head[..n]);
                let code: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
                Some((200..400).contains(&code))
            });
        match thread {
            Ok(t) => t.join().ok().flatten().unwrap_or(false),
            Err(_) => false,
        }
    }

    /// A command to run on the public side ("from the internet"): only its network.
    pub fn public_command(&self, program: &str) -> Command {
        public_command(&self.record, program)
    }
}

/// A command on the public side of the VPC recorded in `dir` (`kumo cloud exec`).
pub fn public_command_of(dir: &Path, program: &str) -> Result<Command, Error> {
    Ok(public_command(&recorded(dir)?, program))
}

/// The public side's namespace (`/run/netns/NAME`) of the VPC recorded in `dir`.
pub fn public_netns_of(dir: &Path) -> Result<PathBuf, Error> {
    Ok(Path::new("/run/netns").join(recorded(dir)?.public_netns))
}

fn recorded(dir: &Path) -> Result<Record, Error> {
    let file = dir.join("vpc.json");
    let text = std::fs::read_to_string(&file)
        .map_err(io_err(format!("{}: no VPC runs here", file.display())))?;
    let record: Record = serde_json::from_str(&text)
        .map_err(|e| Error::Invalid(format!("{}: {e}", file.display())))?;
    if record.public_netns.is_empty() {
        return Err(Error::Invalid("the VPC has no public side".into()));
    }
    Ok(record)
}

fn public_command(record: &Record, program: &str) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/run/netns/{}", record.public_netns))
        .arg("--")
        .arg(program);
    c
}

/// The ranges load balancers' VIPs come from (the cloud's public pools: documentation
/// and benchmark ranges, never routed on the internet).
pub const VIP_POOLS: [&str; 4] = [
    "203.0.113.0/24",
    "198.51.100.0/24",
    "192.0.2.0/24",
    "198.18.0.0/15",
];

/// Removes the VPC recorded in `dir` (its namespace and every link in it). Nothing to do
/// when none was made.
pub fn teardown(dir: &Path) -> Result<(), Error> {
    let Ok(text) = std::fs::read_to_string(dir.join("vpc.json")) else {
        return Ok(());
    };
    let Ok(record) = serde_json::from_str::<Record>(&text) else {
        let _ = std::fs::remove_file(dir.join("vpc.json"));
        return Ok(());
    };
    for ns in [&record.netns, &record.public_netns] {
        if !ns.is_empty() && Path::new("/run/netns").join(ns).exists() {
            run(Command::new("ip").args(["netns", "delete", ns]))?;
        }
    }
    let _ = std::fs::remove_file(dir.join("vpc.json"));
    Ok(())
}

/// A namespace name unique to `dir` (two kumo clusters on one host never share one).
pub fn netns_name(dir: &Path, what: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for b in dir.as_os_str().as_encoded_bytes() {
        hash ^= u32::from(*b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let short: String = what.chars().take(24).collect();
    format!("kumo-{hash:08x}-{short}")
}

/// The VPC-side end of an instance's veth (interface names are at most 15 bytes).
fn veth_name(node_netns: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for b in node_netns.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("veth{hash:08x}")
}

fn sysctl(netns: &str, key: &str, value: &str) -> Result<(), Error> {
    run(Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["--", "sysctl", "-q", "-w", &format!("{key}={value}")]))
    .map(|_| ())
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}

fn run(cmd: &mut Command) -> Result<String, Error> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(format!("running {shown}")))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: shown,
            output: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_names() {
        let c = Cidr::parse("10.0.2.0/24").expect("cidr");
        assert!(c.contains(Ipv4Addr::new(10, 0, 2, 4)));
        assert!(!c.contains(Ipv4Addr::new(10, 0, 3, 4)));
        assert_eq!(c.first_host(), Ipv4Addr::new(10, 0, 2, 1));
        assert!(Cidr::parse("10.0.2.0/33").is_err());
        assert!(Cidr::parse("10.0.2.0").is_err());
        assert!(veth_name("kumo-12345678-a-very-long-node-name").len() <= 15);
        assert_ne!(veth_name("a"), veth_name("b"));
        assert!(netns_name(Path::new("/x"), "vpc").ends_with("-vpc"));
    }
}
