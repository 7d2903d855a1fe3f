//! node-ipam-controller with upstream's RangeAllocator (the default `--cidr-allocator-type`):
//! when `--allocate-node-cidrs` is on, every node without `spec.podCIDRs` gets one range
//! of `--node-cidr-mask-size` (24 for IPv4, 64 for IPv6) from each `--cluster-cidr`
//! (one, or two of different families for dual-stack), written as `spec.podCIDR` and
//! `spec.podCIDRs`. Ranges of existing nodes are marked used at start, ranges overlapping
//! `--service-cluster-ip-range` are never handed out, and a deleted node's ranges are
//! released. The search is next-fit from the last allocation, as upstream's CidrSet.
//! Exhaustion records `CIDRNotAvailable`, a failed write `CIDRAssignmentFailed` (source
//! `cidrAllocator`). Like upstream's range allocator it leaves the NetworkUnavailable
//! condition to the network plugin. It acts as the `node-controller` ServiceAccount.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Api, Patch, PatchParams};
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::message;
use kumo_client::informer::{Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

/// The cluster CIDR `kumo up` allocates from (kubeadm's usual pod subnet).
pub const DEFAULT_CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Upstream's default node mask sizes.
pub const DEFAULT_MASK_IPV4: u8 = 24;
pub const DEFAULT_MASK_IPV6: u8 = 64;
/// Upstream's cidrUpdateRetries.
const UPDATE_RETRIES: usize = 3;

/// The flags of the node-ipam controller (kube-controller-manager's names).
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// `--allocate-node-cidrs`.
    pub allocate_node_cidrs: bool,
    /// `--cluster-cidr`: one CIDR, or two (one per family) separated by a comma.
    pub cluster_cidr: String,
    /// `--node-cidr-mask-size` (0: unset).
    pub node_cidr_mask_size: i32,
    /// `--node-cidr-mask-size-ipv4` (0: unset).
    pub node_cidr_mask_size_ipv4: i32,
    /// `--node-cidr-mask-size-ipv6` (0: unset).
    pub node_cidr_mask_size_ipv6: i32,
    /// `--service-cluster-ip-range`: up to two CIDRs kept out of the node ranges.
    pub service_cluster_ip_range: String,
}

/// A parsed CIDR: its network address as a number, its prefix length, its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    v6: bool,
    addr: u128,
    prefix: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n` or an IPv6 CIDR; the address is masked to the network.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let bad = || format!("invalid CIDR address: {s}");
        let (ip, len) = s.trim().split_once('/').ok_or_else(bad)?;
        let ip: IpAddr = ip.parse().map_err(|_| bad())?;
        let prefix: u8 = len.parse().map_err(|_| bad())?;
        let (v6, addr) = match ip {
            IpAddr::V4(a) => (false, u128::from(u32::from(a))),
            IpAddr::V6(a) => (true, u128::from(a)),
        };
        let c = Cidr { v6, addr, prefix };
        if prefix > c.bits() {
            return Err(bad());
        }
        Ok(Cidr {
            addr: addr & c.mask(),
            ..c
        })
    }

    fn bits(&self) -> u8 {
        if self.v6 {
            128
        } else {
            32
        }
    }

    /// Every bit of the family's addresses set.
    fn all(&self) -> u128 {
        if self.v6 {
            u128::MAX
        } else {
            u128::from(u32::MAX)
        }
    }

    fn mask_of(&self, prefix: u8) -> u128 {
        let host = u32::from(self.bits() - prefix.min(self.bits()));
        if host >= 128 {
            0
        } else {
            self.all() & !((1u128 << host) - 1)
        }
    }

    fn mask(&self) -> u128 {
        self.mask_of(self.prefix)
    }

    fn contains(&self, addr: u128) -> bool {
        addr & self.mask() == self.addr
    }

    fn overlaps(&self, o: &Cidr) -> bool {
        self.v6 == o.v6 && (self.contains(o.addr & self.mask()) || o.contains(self.addr & o.mask()))
    }

    /// The last address in the range.
    fn last(&self) -> u128 {
        self.addr | (self.all() & !self.mask())
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ip: IpAddr = if self.v6 {
            IpAddr::V6(self.addr.into())
        } else {
            IpAddr::V4(u32::try_from(self.addr).unwrap_or(0).into())
        };
        write!(f, "{ip}/{}", self.prefix)
    }
}

/// One cluster CIDR cut into node ranges (upstream's cidrset.CidrSet).
pub struct CidrSet {
    cluster: Cidr,
    node_mask: u8,
    max: u128,
    next: u128,
    used: BTreeSet<u128>,
}

/// Upstream's ErrCIDRRangeNoCIDRsRemaining text.
const NO_CIDRS_REMAINING: &str =
    "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range";

impl CidrSet {
    /// Node ranges of `/node_mask` in `cluster` (IPv6: at most 16 bits apart).
    pub fn new(cluster: Cidr, node_mask: u8) -> Result<CidrSet, String> {
        if cluster.v6 && node_mask.saturating_sub(cluster.prefix) > 16 {
            return Err("New CIDR set failed; the node CIDR size is too big".into());
        }
        let diff = u32::from(node_mask.saturating_sub(cluster.prefix));
        Ok(CidrSet {
            cluster,
            node_mask,
            max: 1u128.checked_shl(diff).unwrap_or(u128::MAX),
            next: 0,
            used: BTreeSet::new(),
        })
    }

    fn block(&self, index: u128) -> Cidr {
        let host = u32::from(self.cluster.bits() - self.node_mask);
        Cidr {
            v6: self.cluster.v6,
            addr: self.cluster.addr | index.checked_shl(host).unwrap_or(0),
            prefix: self.node_mask,
        }
    }

    fn index_of(&self, addr: u128) -> Result<u128, String> {
        let host = u32::from(self.cluster.bits() - self.node_mask);
        let i = (self.cluster.addr ^ addr).checked_shr(host).unwrap_or(0);
        if i >= self.max {
            let ip = Cidr {
                v6: self.cluster.v6,
                addr,
                prefix: self.node_mask,
            };
            let ip = ip.to_string();
            let ip = ip.rsplit_once('/').map_or(ip.as_str(), |(a, _)| a);
            return Err(format!(
                "CIDR: {ip}/{} is out of the range of CIDR allocator",
                self.node_mask
            ));
        }
        Ok(i)
    }

    fn range(&self, c: &Cidr) -> Result<(u128, u128), String> {
        if !self.cluster.overlaps(c) {
            return Err(format!(
                "cidr {c} is out the range of cluster cidr {}",
                self.cluster
            ));
        }
        if self.cluster.prefix < c.prefix {
            let node_mask = self.cluster.mask_of(self.node_mask);
            let begin = self.index_of(c.addr & node_mask)?;
            let end = self.index_of(c.last() & node_mask)?;
            Ok((begin, end))
        } else {
            Ok((0, self.max - 1))
        }
    }

    /// The next free range, searching on from the last one handed out.
    pub fn allocate_next(&mut self) -> Result<Cidr, String> {
        if self.used.len() as u128 >= self.max {
            return Err(NO_CIDRS_REMAINING.into());
        }
        let mut candidate = self.next;
        while self.used.contains(&candidate) {
            candidate = (candidate + 1) % self.max;
        }
        self.next = (candidate + 1) % self.max;
        self.used.insert(candidate);
        Ok(self.block(candidate))
    }

    /// Marks every range inside (or overlapping) `c` used.
    pub fn occupy(&mut self, c: &Cidr) -> Result<(), String> {
        let (b, e) = self.range(c)?;
        // A huge range (a service CIDR wider than the node mask) is still finite: at most
        // `max` entries, bounded by the set's own size.
        let mut i = b;
        while i <= e {
            self.used.insert(i);
            i += 1;
        }
        Ok(())
    }

    /// Gives back a range [`Self::allocate_next`] just handed out, so the next search
    /// starts from it again.
    fn undo(&mut self, c: &Cidr) {
        if let Ok(i) = self.index_of(c.addr) {
            if self.used.remove(&i) && (i + 1) % self.max == self.next {
                self.next = i;
            }
        }
    }

    /// Marks every range inside `c` free.
    pub fn release(&mut self, c: &Cidr) -> Result<(), String> {
        let (b, e) = self.range(c)?;
        let gone: Vec<u128> = self.used.range(b..=e).copied().collect();
        for i in gone {
            self.used.remove(&i);
        }
        Ok(())
    }
}

/// The validated configuration: cluster CIDRs with their node mask sizes, service CIDRs.
#[derive(Clone, Debug)]
pub struct Params {
    clusters: Vec<(Cidr, u8)>,
    services: Vec<Cidr>,
}

impl Params {
    /// Validates the flags as kube-controller-manager does (messages included); an
    /// empty `--cluster-cidr` means [`DEFAULT_CLUSTER_CIDR`].
    pub fn new(s: &Settings) -> Result<Params, String> {
        let list = if s.cluster_cidr.trim().is_empty() {
            DEFAULT_CLUSTER_CIDR
        } else {
            s.cluster_cidr.trim()
        };
        let cidrs = list
            .split(',')
            .map(Cidr::parse)
            .collect::<Result<Vec<_>, _>>()?;
        let dual = cidrs.iter().any(|c| c.v6) && cidrs.iter().any(|c| !c.v6);
        if cidrs.len() > 1 && !dual {
            return Err(format!("len of ClusterCIDRs=={} and they are not configured as dual stack (at least one from each IPFamily", cidrs.len()));
        }
        if cidrs.len() > 2 {
            return Err(format!(
                "length of clusterCIDRs is:{} more than max allowed of 2",
                cidrs.len()
            ));
        }
        let set = |v: i32| u8::try_from(v).ok().filter(|v| *v != 0);
        let (mask, m4, m6) = (
            set(s.node_cidr_mask_size),
            set(s.node_cidr_mask_size_ipv4),
            set(s.node_cidr_mask_size_ipv6),
        );
        let (mut v4, mut v6) = (DEFAULT_MASK_IPV4, DEFAULT_MASK_IPV6);
        if cidrs.len() > 1 {
            if mask.is_some() {
                return Err(
                    "usage of --node-cidr-mask-size is not allowed with dual-stack clusters".into(),
                );
            }
            v4 = m4.unwrap_or(v4);
            v6 = m6.unwrap_or(v6);
        } else if let Some(m) = mask {
            if m4.is_some() || m6.is_some() {
                return Err("usage of --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6 is not allowed if --node-cidr-mask-size is set. For dual-stack clusters please unset it and use IPFamily specific flags".into());
            }
            (v4, v6) = (m, m);
        } else {
            let single_v6 = cidrs.first().is_some_and(|c| c.v6);
            if let Some(m) = m4 {
                if single_v6 {
                    return Err("usage of --node-cidr-mask-size-ipv4 is not allowed for a single-stack IPv6 cluster".into());
                }
                v4 = m;
            }
            if let Some(m) = m6 {
                if !single_v6 {
                    return Err("usage of --node-cidr-mask-size-ipv6 is not allowed for a single-stack IPv4 cluster".into());
                }
                v6 = m;
            }
        }
        let mut clusters = Vec::new();
        for c in cidrs {
            let m = if c.v6 { v6 } else { v4 };
            if c.prefix > m || m > c.bits() {
                return Err("Controller: Invalid --cluster-cidr, mask size of cluster CIDR must be less than or equal to --node-cidr-mask-size configured for CIDR family".into());
            }
            clusters.push((c, m));
        }
        let mut services = Vec::new();
        for s in s
            .service_cluster_ip_range
            .split(',')
            .filter(|s| !s.trim().is_empty())
        {
            match Cidr::parse(s) {
                Ok(c) => services.push(c),
                Err(e) => {
                    tracing::info!(cidr = s, error = %e, "Warning: unsuccessful parsing of service CIDR")
                }
            }
        }
        if services.len() > 2 {
            return Err("--service-cluster-ip-range can not contain more than two entries".into());
        }
        Ok(Params { clusters, services })
    }
}

struct Ctl {
    client: ClientSource,
    nodes: Arc<Informer<Node>>,
    sets: Arc<Mutex<Vec<CidrSet>>>,
}

fn pod_cidrs(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

fn node_name(n: &Node) -> &str {
    n.metadata.name.as_deref().unwrap_or("")
}

/// Marks the node's ranges used (`occupy`) or free.
fn mark(sets: &mut [CidrSet], node: &Node, occupy: bool) -> Result<(), String> {
    for (i, c) in pod_cidrs(node).iter().enumerate() {
        let parsed = Cidr::parse(c)
            .map_err(|_| format!("failed to parse node {}, CIDR {c}", node_name(node)))?;
        let Some(set) = sets.get_mut(i) else {
            return Err(format!(
                "node:{} has an allocated cidr: {c} at index:{i} that does not exist in cluster cidrs configuration",
                node_name(node)
            ));
        };
        if occupy {
            set.occupy(&parsed).map_err(|e| {
                format!(
                    "failed to mark cidr[{parsed}] at idx [{i}] as occupied for node: {}: {e}",
                    node_name(node)
                )
            })?;
        } else {
            set.release(&parsed)
                .map_err(|e| format!("error when releasing CIDR {c}: {e}"))?;
        }
    }
    Ok(())
}

/// Registers the handlers and returns the controller task; None when allocation is off
/// (upstream does not start the controller then). `params` come from [`Params::new`].
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    params: Params,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let mut sets = Vec::new();
    for (c, m) in &params.clusters {
        match CidrSet::new(*c, *m) {
            Ok(s) => sets.push(s),
            Err(e) => {
                tracing::error!(error = %e, "node-ipam-controller not started");
                return tokio::spawn(async {});
            }
        }
    }
    for svc in &params.services {
        for s in sets.iter_mut() {
            if s.cluster.overlaps(svc) {
                if let Err(e) = s.occupy(svc) {
                    tracing::error!(error = %e, "Error filtering out service cidr out cluster cidr");
                }
            }
        }
    }
    let sets = Arc::new(Mutex::new(sets));
    let queue = factory.queue::<String>("cidrallocator_node");
    let nodes = factory.informer::<Node>();
    let q = queue.clone();
    let s = sets.clone();
    nodes.add_handler(move |c| match c {
        Change::Added(n) | Change::Updated { new: n, .. } => q.add(node_name(n).to_owned()),
        // Nodes have no finalizer: the delete is the only chance to free their ranges.
        Change::Deleted(n) => {
            if let Err(e) = mark(&mut s.lock(), n, false) {
                tracing::warn!(error = %e, "Error while processing CIDR Release");
            }
        }
    });
    tokio::spawn(async move {
        tracing::info!("Starting ipam controller");
        let Some(client) = client_for(&clients, "node-controller", &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            nodes,
            sets,
        });
        if !wait_for_sync(&mut stop, ctl.nodes.wait_synced()).await {
            return;
        }
        // The ranges nodes hold already are taken before any is handed out.
        for n in ctl.nodes.list() {
            if let Err(e) = mark(&mut ctl.sets.lock(), &n, true) {
                tracing::error!(error = %e, "node-ipam-controller: existing node CIDR");
            }
        }
        tracing::info!("Starting range CIDR allocator");
        let tasks = run_workers_of("node-ipam", queue, 4, stop, &ctl, |c, key| async move {
            c.sync(&key).await
        });
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down ipam controller");
    })
}

impl Ctl {
    async fn event(&self, node: &Node, status: &str) {
        let r = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: node.metadata.name.clone(),
            uid: node.metadata.uid.clone(),
            ..Default::default()
        };
        let msg = format!("Node {} status is now: {status}", node_name(node));
        kumo_client::events::record(&self.client, "cidrAllocator", r, "Normal", status, msg).await;
    }

    async fn sync(&self, name: &str) -> Result<(), SyncError> {
        let Some(node) = self.nodes.get(name) else {
            return Ok(());
        };
        if node.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        if !pod_cidrs(&node).is_empty() {
            return mark(&mut self.sets.lock(), &node, true).map_err(SyncError::Failed);
        }
        let allocated: Result<Vec<Cidr>, (usize, String)> = {
            let mut sets = self.sets.lock();
            let mut got = Vec::new();
            let mut err = None;
            for (i, s) in sets.iter_mut().enumerate() {
                match s.allocate_next() {
                    Ok(c) => got.push(c),
                    Err(e) => {
                        err = Some((i, e));
                        break;
                    }
                }
            }
            match err {
                // Upstream keeps the ranges taken before the failing family; so does this.
                Some(e) => Err(e),
                None => Ok(got),
            }
        };
        let cidrs = match allocated {
            Ok(c) => c,
            Err((i, e)) => {
                self.event(&node, "CIDRNotAvailable").await;
                return Err(SyncError::Failed(format!(
                    "failed to allocate cidr from cluster cidr at idx:{i}: {e}"
                )));
            }
        };
        self.update(name, &cidrs).await
    }

    async fn update(&self, name: &str, cidrs: &[Cidr]) -> Result<(), SyncError> {
        let strings: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        let Some(node) = self.nodes.get(name) else {
            return Err(SyncError::Failed(format!("node \"{name}\" not found")));
        };
        let have = pod_cidrs(&node);
        if have == strings {
            return Ok(());
        }
        if !have.is_empty() {
            tracing::warn!(
                node = name,
                "Node already has a CIDR allocated. Releasing the new one"
            );
            let mut sets = self.sets.lock();
            for (s, c) in sets.iter_mut().zip(cidrs) {
                let _ = s.release(c);
            }
            return Ok(());
        }
        let api: Api<Node> = Api::all(self.client.get());
        // The cached node's resourceVersion guards against a cache that has not seen an
        // earlier assignment yet: such a write conflicts and the node is looked at again
        // (the ranges go back first), rather than replacing the node's range.
        let patch = json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"podCIDR": strings[0], "podCIDRs": strings},
        });
        let mut last = None;
        for _ in 0..UPDATE_RETRIES {
            match api
                .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(node = name, pod_cidrs = ?strings, "Set node PodCIDR");
                    return Ok(());
                }
                Err(e) if kumo_client::error::is_conflict(&e) => {
                    let mut sets = self.sets.lock();
                    for (s, c) in sets.iter_mut().zip(cidrs) {
                        s.undo(c);
                    }
                    return Err(SyncError::After(Duration::from_millis(100)));
                }
                Err(e) => last = Some(e),
            }
        }
        self.event(&node, "CIDRAssignmentFailed").await;
        let timeout = last.as_ref().is_some_and(|e| {
            kumo_client::error::api_status(e).is_some_and(|s| s.reason == "ServerTimeout")
        });
        // After a timeout the write may have landed: the ranges stay taken (a restart
        // recovers them), as upstream.
        if !timeout {
            let mut sets = self.sets.lock();
            for (s, c) in sets.iter_mut().zip(cidrs) {
                let _ = s.release(c);
            }
        }
        Err(SyncError::Failed(format!(
            "failed to patch node CIDR: {}",
            last.map(|e| message(&e)).unwrap_or_default()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_fit_release_and_exhaustion() {
        let mut s = CidrSet::new(Cidr::parse("10.244.0.0/23").expect("cidr"), 24).expect("set");
        assert_eq!(
            s.allocate_next().expect("first").to_string(),
            "10.244.0.0/24"
        );
        assert_eq!(
            s.allocate_next().expect("second").to_string(),
            "10.244.1.0/24"
        );
        assert_eq!(s.allocate_next().expect_err("full"), NO_CIDRS_REMAINING);
        s.release(&Cidr::parse("10.244.0.0/24").expect("cidr"))
            .expect("release");
        assert_eq!(
            s.allocate_next().expect("reused").to_string(),
            "10.244.0.0/24"
        );
        assert!(s
            .occupy(&Cidr::parse("10.245.0.0/24").expect("cidr"))
            .is_err());
        let v6 = CidrSet::new(Cidr::parse("fd00:10:244::/56").expect("cidr"), 64);
        let mut v6 = v6.expect("set");
        assert_eq!(
            v6.allocate_next().expect("v6").to_string(),
            "fd00:10:244::/64"
        );
        assert_eq!(
            v6.allocate_next().expect("v6").to_string(),
            "fd00:10:244:1::/64"
        );
    }

    #[test]
    fn service_range_is_kept_out() {
        let p = Params::new(&Settings {
            allocate_node_cidrs: true,
            cluster_cidr: "10.0.0.0/16".into(),
            service_cluster_ip_range: "10.0.0.0/23".into(),
            ..Default::default()
        })
        .expect("valid");
        let mut s = CidrSet::new(p.clusters[0].0, p.clusters[0].1).expect("set");
        s.occupy(&p.services[0]).expect("occupy");
        assert_eq!(s.allocate_next().expect("third").to_string(), "10.0.2.0/24");
    }

    #[test]
    fn flags_are_validated_as_upstream() {
        let bad = |cidr: &str, m: i32| {
            Params::new(&Settings {
                cluster_cidr: cidr.into(),
                node_cidr_mask_size: m,
                ..Default::default()
            })
            .expect_err("invalid")
        };
        assert_eq!(
            bad("10.0.0.0/8,10.1.0.0/16", 0),
            "len of ClusterCIDRs==2 and they are not configured as dual stack (at least one from each IPFamily"
        );
        assert_eq!(
            bad("10.0.0.0/8,fd00::/48", 24),
            "usage of --node-cidr-mask-size is not allowed with dual-stack clusters"
        );
        assert!(bad("10.0.0.0/25", 0).starts_with("Controller: Invalid --cluster-cidr"));
        let dual = Params::new(&Settings {
            cluster_cidr: "10.0.0.0/8,fd00::/48".into(),
            ..Default::default()
        })
        .expect("dual-stack");
        assert_eq!(dual.clusters[0].1, 24);
        assert_eq!(dual.clusters[1].1, 64);
    }
}
