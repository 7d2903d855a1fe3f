//! Stale UDP flows, as kube-proxy clears them after a sync: UDP has no connection to
//! close, so a conntrack entry keeps sending a client's datagrams to the endpoint it was
//! NATed to (or nowhere, for a Service that had none) until it expires. A flow to a
//! Service's IP and port (cluster, external or load-balancer IP) whose reply comes from
//! no serving endpoint of it is deleted, and so is a flow to a NodePort that has serving
//! endpoints, from another source. The table is read and changed with conntrack-tools'
//! `conntrack` in the node's namespace, as `nft` is for the rules.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

/// A UDP Service port as the cleanup sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UdpPort {
    /// Its IPs with the Service's port: the cluster IP, external and load-balancer IPs.
    pub dests: Vec<(Ipv4Addr, u16)>,
    /// Its NodePort, if any.
    pub node_port: Option<u16>,
    /// Its serving endpoints (ready, or terminating and still serving).
    pub serving: BTreeSet<(Ipv4Addr, u16)>,
}

/// One UDP conntrack entry: the original direction's tuple and where replies come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    pub reply_src: Ipv4Addr,
    pub reply_sport: u16,
}

/// What can go wrong running `conntrack`.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("running conntrack: {0}")]
    Run(#[from] std::io::Error),
    #[error("conntrack {0}: {1}")]
    Failed(String, String),
}

/// A line of `conntrack -L -p udp`:
/// `udp 17 29 src=A dst=B sport=P dport=Q [UNREPLIED] src=C dst=D sport=R dport=S mark=0 use=1`.
pub fn parse(line: &str) -> Option<Flow> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "udp" {
        return None;
    }
    // The first src/dst/sport/dport are the original direction's, the second the reply's.
    let (mut orig, mut reply) = (BTreeMap::new(), BTreeMap::new());
    for f in fields {
        let Some((k, v)) = f.split_once('=') else {
            continue;
        };
        if !matches!(k, "src" | "dst" | "sport" | "dport") {
            continue;
        }
        if orig.contains_key(k) {
            reply.entry(k).or_insert(v);
        } else {
            orig.insert(k, v);
        }
    }
    Some(Flow {
        src: orig.get("src")?.parse().ok()?,
        dst: orig.get("dst")?.parse().ok()?,
        sport: orig.get("sport")?.parse().ok()?,
        dport: orig.get("dport")?.parse().ok()?,
        reply_src: reply.get("src")?.parse().ok()?,
        reply_sport: reply.get("sport")?.parse().ok()?,
    })
}

/// The flows to delete among `flows`, given the node's UDP Service ports.
pub fn stale<'a>(flows: &'a [Flow], ports: &[&UdpPort]) -> Vec<&'a Flow> {
    let mut by_ip: BTreeMap<(Ipv4Addr, u16), &BTreeSet<(Ipv4Addr, u16)>> = BTreeMap::new();
    let mut by_node_port: BTreeMap<u16, &BTreeSet<(Ipv4Addr, u16)>> = BTreeMap::new();
    for p in ports {
        for d in &p.dests {
            by_ip.insert(*d, &p.serving);
        }
        if let Some(np) = p.node_port.filter(|_| !p.serving.is_empty()) {
            by_node_port.insert(np, &p.serving);
        }
    }
    flows
        .iter()
        .filter(|f| {
            let replier = (f.reply_src, f.reply_sport);
            by_ip
                .get(&(f.dst, f.dport))
                .or_else(|| by_node_port.get(&f.dport))
                .is_some_and(|serving| !serving.contains(&replier))
        })
        .collect()
}

/// `conntrack ARGS` in `netns` (this process's namespace when `None`).
fn conntrack(
    netns: Option<&Path>,
    args: &[String],
) -> Result<std::process::Output, ConntrackError> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", ns.display()))
                .args(["--", "conntrack"]);
            c
        }
        None => Command::new("conntrack"),
    };
    Ok(cmd.args(args).output()?)
}

/// Deletes the stale UDP flows of the node's namespace; returns how many went.
pub fn clean(netns: Option<&Path>, ports: &[&UdpPort]) -> Result<usize, ConntrackError> {
    let list: Vec<String> = ["-L", "-p", "udp"].map(String::from).into();
    let out = conntrack(netns, &list)?;
    if !out.status.success() {
        return Err(ConntrackError::Failed(
            "-L".into(),
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    let flows: Vec<Flow> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(parse)
        .collect();
    let mut deleted = 0;
    for f in stale(&flows, ports) {
        let args: Vec<String> = [
            "-D",
            "-p",
            "udp",
            "--orig-src",
            &f.src.to_string(),
            "--orig-dst",
            &f.dst.to_string(),
            "--sport",
            &f.sport.to_string(),
            "--dport",
            &f.dport.to_string(),
        ]
        .map(String::from)
        .into();
        // A flow that expired meanwhile is not an error ("0 flow entries").
        if conntrack(netns, &args)?.status.success() {
            deleted += 1;
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().expect("ip")
    }

    #[test]
    fn flows_parse_from_conntracks_listing() {
        let f = parse("udp      17 28 src=10.244.1.5 dst=10.96.0.10 sport=40000 dport=53 src=10.244.2.3 dst=10.244.1.5 sport=53 dport=40000 mark=0 use=1")
            .expect("a flow");
        assert_eq!(
            f,
            Flow {
                src: ip("10.244.1.5"),
                dst: ip("10.96.0.10"),
                sport: 40000,
                dport: 53,
                reply_src: ip("10.244.2.3"),
                reply_sport: 53,
            }
        );
        let unreplied = parse("udp      17 29 src=10.0.1.4 dst=10.96.0.10 sport=1 dport=53 [UNREPLIED] src=10.96.0.10 dst=10.0.1.4 sport=53 dport=1 mark=0 use=1")
            .expect("a flow");
        assert_eq!(unreplied.reply_src, ip("10.96.0.10"));
        assert!(parse("tcp      6 431999 ESTABLISHED src=1.1.1.1 dst=2.2.2.2 sport=1 dport=2 src=2.2.2.2 dst=1.1.1.1 sport=2 dport=1").is_none());
        assert!(
            parse("conntrack v1.4.7 (conntrack-tools): 2 flow entries have been shown.").is_none()
        );
        assert!(parse("udp 17 src=garbage").is_none());
    }

    #[test]
    fn flows_to_gone_endpoints_and_to_services_without_any_are_stale() {
        let dns = UdpPort {
            dests: vec![(ip("10.96.0.10"), 53)],
            node_port: None,
            serving: [(ip("10.244.2.3"), 53)].into(),
        };
        let empty = UdpPort {
            dests: vec![(ip("10.96.0.20"), 9000)],
            node_port: Some(30090),
            serving: BTreeSet::new(),
        };
        let np = UdpPort {
            dests: vec![(ip("10.96.0.30"), 8000)],
            node_port: Some(30080),
            serving: [(ip("10.244.1.9"), 8000)].into(),
        };
        let flow = |dst: &str, dport, reply: &str, rport| Flow {
            src: ip("10.244.1.5"),
            dst: ip(dst),
            sport: 40000,
            dport,
            reply_src: ip(reply),
            reply_sport: rport,
        };
        let flows = vec![
            flow("10.96.0.10", 53, "10.244.2.3", 53), // to the serving endpoint: kept
            flow("10.96.0.10", 53, "10.244.9.9", 53), // to a gone endpoint: stale
            flow("10.96.0.20", 9000, "10.96.0.20", 9000), // no endpoint then: stale
            flow("10.0.1.4", 30080, "10.244.9.9", 8000), // NodePort to a gone one: stale
            flow("10.0.1.4", 30080, "10.244.1.9", 8000), // NodePort, serving: kept
            flow("10.0.1.4", 30090, "10.0.1.4", 30090), // NodePort without endpoints: kept
            flow("8.8.8.8", 53, "8.8.8.8", 53),       // not a Service: kept
        ];
        let gone: Vec<usize> = stale(&flows, &[&dns, &empty, &np])
            .into_iter()
            .map(|f| flows.iter().position(|g| g == f).expect("listed"))
            .collect();
        assert_eq!(gone, vec![1, 2, 3]);
    }
}
