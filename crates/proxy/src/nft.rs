//! kube-proxy's nftables mode, for a node whose packets are real: the table `ip
//! kube-proxy` with upstream's base chains, maps and per-Service chains, programmed in the
//! node's network namespace through `nft -j` (the `nftables` crate's schema and runner).
//!
//! Each sync recomputes only the Services whose object or EndpointSlices changed (their
//! resourceVersions tell, as upstream's change trackers do) and sends `nft` only the
//! difference from what it sent last (chains added, changed or gone, map and set elements
//! added or removed); the first sync, and the one after a failure, rebuilds the table. Names follow upstream's: `service-<HASH>-ns/name/tcp/port` for a
//! Service port's cluster-policy chain (`local-`, `external-`, `firewall-` alike),
//! `endpoint-<HASH>-ns/name/tcp/port__ip/port` and `affinity-…` for ClientIP affinity,
//! where HASH is the first 8 characters of the base32 SHA-256 of the rest.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use nftables::schema::NfObject;
use serde_json::{json, Value};

use crate::conntrack::UdpPort;

/// The table's name and family.
pub const TABLE: &str = "kube-proxy";
/// The mark bit of packets to masquerade (`--masquerade-bit` 14).
const MASQUERADE_MARK: u32 = 0x4000;
/// The chain that rejects (what the no-endpoint maps jump to).
const REJECT_CHAIN: &str = "reject-chain";

/// What a node's proxy needs to know of its node.
#[derive(Clone, Debug)]
pub struct NftConfig {
    /// The node's name (endpoints on it are local).
    pub node_name: String,
    /// Its addresses that NodePorts answer on (`--nodeport-addresses primary`).
    pub node_ips: Vec<Ipv4Addr>,
    /// The pods' range (`--cluster-cidr`): traffic from outside it to a ClusterIP is
    /// masqueraded, and pods' own traffic to an external destination short-circuits.
    pub cluster_cidr: Option<(Ipv4Addr, u8)>,
    /// The Service ranges: traffic to an unallocated address of them is dropped.
    pub service_cidrs: Vec<(Ipv4Addr, u8)>,
    /// The network namespace to program (`/run/netns/NAME`); `None`: this process's.
    pub netns: Option<PathBuf>,
}

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("nft: {0}")]
    Nft(String),
    #[error("building the ruleset: {0}")]
    Build(String),
}

/// One rule: its statements and comment.
#[derive(Clone, Debug, PartialEq)]
struct Rule {
    expr: Vec<Value>,
    comment: Option<String>,
}

fn rule(expr: Vec<Value>) -> Rule {
    Rule {
        expr,
        comment: None,
    }
}

fn commented(expr: Vec<Value>, comment: &str) -> Rule {
    Rule {
        expr,
        comment: Some(comment.to_owned()),
    }
}

/// A set or map element: its key, its value (maps), its comment.
type Element = (Value, Option<Value>, Option<String>);

/// The Service-dependent part of the table.
#[derive(Clone, Debug, Default, PartialEq)]
struct Desired {
    /// Service and endpoint chains (their names hold a `/`).
    chains: BTreeMap<String, Vec<Rule>>,
    /// Elements of each set or map, by their key's JSON text: (key, value, comment).
    elements: BTreeMap<&'static str, BTreeMap<String, Element>>,
    /// ClientIP affinity sets with their timeouts (seconds).
    affinity_sets: BTreeMap<String, u32>,
}

impl Desired {
    fn elem(&mut self, set: &'static str, key: Value, value: Option<Value>, comment: Option<&str>) {
        self.elements
            .entry(set)
            .or_default()
            .insert(key.to_string(), (key, value, comment.map(str::to_owned)));
    }
}

/// The sets and maps whose elements follow the Services.
const CONTAINERS: [&str; 7] = [
    "cluster-ips",
    "hairpin-connections",
    "service-ips",
    "service-nodeports",
    "no-endpoint-services",
    "no-endpoint-nodeports",
    "firewall-ips",
];

/// How much a sync sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Whether the table was rebuilt.
    pub full: bool,
    /// Commands in the transaction.
    pub commands: usize,
    /// Service ports programmed.
    pub service_ports: usize,
}

/// A Service, by namespace and name.
type ServiceKey = (String, String);

/// One Service's part of the table, and what it was computed from.
#[derive(Debug)]
struct Fragment {
    /// The Service's uid and resourceVersion and its slices' names and resourceVersions;
    /// `None` (an object without a resourceVersion) is never reused.
    inputs: Option<Vec<String>>,
    desired: Desired,
    /// Service ports programmed.
    ports: usize,
    /// Its UDP ports, for the conntrack cleanup.
    udp: Vec<UdpPort>,
}

/// What the table holds, as the last sync sent it.
#[derive(Debug, Default)]
struct Applied {
    fragments: BTreeMap<ServiceKey, Arc<Fragment>>,
    /// How many Services want each set or map element (two Services selecting one pod
    /// share its hairpin element): an element goes when its last owner lets it go.
    owners: BTreeMap<(&'static str, String), usize>,
}

/// The nftables proxier of one node.
pub struct NftProxier {
    cfg: NftConfig,
    applied: Option<Applied>,
    /// Chains flushed by an earlier sync, to delete, with their Service.
    stale: BTreeMap<String, ServiceKey>,
}

impl NftProxier {
    pub fn new(cfg: NftConfig) -> Self {
        NftProxier {
            cfg,
            applied: None,
            stale: BTreeMap::new(),
        }
    }

    /// Whether a sync has chains left to delete (the next one does it).
    pub fn has_stale_chains(&self) -> bool {
        !self.stale.is_empty()
    }

    /// Programs the table for `services` and their `slices`.
    pub fn sync(
        &mut self,
        services: &[Arc<Service>],
        slices: &[Arc<EndpointSlice>],
    ) -> Result<SyncStats, NftError> {
        let full = self.applied.is_none();
        let mut applied = self.applied.take().unwrap_or_default();
        let by_service = slices_by_service(slices);
        let mut fragments = BTreeMap::new();
        for svc in services {
            let key = (
                svc.metadata.namespace.clone().unwrap_or_default(),
                svc.metadata.name.clone().unwrap_or_default(),
            );
            let svc_slices = by_service.get(&key).map(Vec::as_slice).unwrap_or_default();
            let inputs = inputs_of(svc, svc_slices);
            let fragment = match applied.fragments.get(&key) {
                Some(f) if inputs.is_some() && f.inputs == inputs => f.clone(),
                _ => {
                    let (desired, ports, udp) = compute(&self.cfg, svc, svc_slices);
                    Arc::new(Fragment {
                        inputs,
                        desired,
                        ports,
                        udp,
                    })
                }
            };
            fragments.insert(key, fragment);
        }
        let empty = Desired::default();
        let mut changes: Vec<(&Desired, &Desired)> = Vec::new();
        let mut udp_changed = false;
        for (key, after) in &fragments {
            match applied.fragments.get(key) {
                Some(before) if Arc::ptr_eq(before, after) => continue,
                Some(before) => {
                    changes.push((&before.desired, &after.desired));
                    udp_changed |= !before.udp.is_empty();
                }
                None => changes.push((&empty, &after.desired)),
            }
            udp_changed |= !after.udp.is_empty();
        }
        for (key, before) in &applied.fragments {
            if !fragments.contains_key(key) {
                changes.push((&before.desired, &empty));
                udp_changed |= !before.udp.is_empty();
            }
        }
        let mut cmds: Vec<Value> = Vec::new();
        let mut stale = std::mem::take(&mut self.stale);
        if full {
            // The table is made anew: nothing of it is stale.
            stale.clear();
            base(&self.cfg, &mut cmds);
        }
        for (name, key) in &stale {
            let wanted = fragments
                .get(key)
                .is_some_and(|f| f.desired.chains.contains_key(name));
            if !wanted {
                cmds.push(json!({"delete": chain_obj(name)}));
            }
        }
        stale.clear();
        let mut owners = std::mem::take(&mut applied.owners);
        diff(&changes, &mut owners, &mut cmds);
        for (key, before) in &applied.fragments {
            let after = fragments.get(key).map(|f| &f.desired.chains);
            for name in before.desired.chains.keys() {
                if !after.is_some_and(|a| a.contains_key(name)) {
                    stale.insert(name.clone(), key.clone());
                }
            }
        }
        drop(changes);
        let commands = cmds.len();
        if commands > 0 {
            // A failed transaction changes nothing known: the next sync rebuilds the table.
            self.apply(cmds)?;
        }
        if udp_changed {
            // Flows NATed to endpoints that are gone (or to nothing) are cleared once the
            // rules that replace them are in; a failure here leaves them to expire.
            let udp: Vec<&UdpPort> = fragments.values().flat_map(|f| &f.udp).collect();
            match crate::conntrack::clean(self.cfg.netns.as_deref(), &udp) {
                Ok(n) if n > 0 => tracing::debug!(deleted = n, "stale UDP conntrack entries"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "clearing stale UDP conntrack entries"),
            }
        }
        let service_ports = fragments.values().map(|f| f.ports).sum();
        self.applied = Some(Applied { fragments, owners });
        self.stale = stale;
        Ok(SyncStats {
            full,
            commands,
            service_ports,
        })
    }

    fn apply(&self, cmds: Vec<Value>) -> Result<(), NftError> {
        let payload = document(cmds)?;
        if let Ok(f) = std::env::var("KUMO_NFT_DUMP") {
            let _ = std::fs::write(f, &payload);
        }
        // `nft -j -f -` in the node's namespace; run here rather than by the crate's
        // helper, which lets nft's error messages go to this process's stderr.
        let mut cmd = match &self.cfg.netns {
            Some(ns) => {
                let mut c = std::process::Command::new("nsenter");
                c.arg(format!("--net={}", ns.display())).args(["--", "nft"]);
                c
            }
            None => std::process::Command::new("nft"),
        };
        cmd.args(["-j", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| NftError::Nft(format!("running nft: {e}")))?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            stdin
                .write_all(payload.as_bytes())
                .map_err(|e| NftError::Nft(format!("writing to nft: {e}")))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| NftError::Nft(format!("running nft: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(NftError::Nft(
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ))
        }
    }

    /// Removes the table (the proxy stops).
    pub fn cleanup(&mut self) -> Result<(), NftError> {
        self.applied = None;
        self.stale.clear();
        self.apply(vec![
            add(json!({"table": table()})),
            json!({"delete": {"table": table()}}),
        ])
    }
}

/// The transaction as `nft -j` reads it. Each object is checked against the `nftables`
/// crate's schema types first (the crate's runner is not used: it leaves nft's error
/// messages on this process's stderr), so that what does not fit is refused here, before `nft`
/// sees it; the one kind the crate cannot describe (a map whose values are verdicts,
/// `map: verdict`, which every kube-proxy dispatch map is) goes as nft's JSON schema
/// documents it.
fn document(cmds: Vec<Value>) -> Result<String, NftError> {
    let mut objects = vec![json!({"metainfo": {"json_schema_version": 1}})];
    for c in cmds {
        if let Err(e) = serde_json::from_value::<NfObject<'_>>(c.clone()) {
            let verdict_map = ["add", "delete"]
                .iter()
                .any(|op| c.pointer(&format!("/{op}/map/map")) == Some(&json!("verdict")));
            if !verdict_map {
                return Err(NftError::Build(format!("{e}: {c}")));
            }
        }
        objects.push(c);
    }
    Ok(json!({ "nftables": objects }).to_string())
}

fn table() -> Value {
    json!({"family": "ip", "name": TABLE})
}

fn add(obj: Value) -> Value {
    json!({ "add": obj })
}

fn chain_obj(name: &str) -> Value {
    json!({"chain": {"family": "ip", "table": TABLE, "name": name}})
}

fn rule_obj(chain: &str, r: &Rule) -> Value {
    let mut o = json!({"family": "ip", "table": TABLE, "chain": chain, "expr": r.expr});
    if let Some(c) = &r.comment {
        o["comment"] = json!(c);
    }
    json!({ "rule": o })
}

// Expression and statement builders, in nft's JSON.
fn payload(proto: &str, field: &str) -> Value {
    json!({"payload": {"protocol": proto, "field": field}})
}
fn meta(key: &str) -> Value {
    json!({"meta": {"key": key}})
}
fn concat(items: Vec<Value>) -> Value {
    json!({ "concat": items })
}
fn matches(op: &str, left: Value, right: Value) -> Value {
    json!({"match": {"op": op, "left": left, "right": right}})
}
fn jump(target: &str) -> Value {
    json!({"jump": {"target": target}})
}
fn goto(target: &str) -> Value {
    json!({"goto": {"target": target}})
}
fn prefix(addr: Ipv4Addr, len: u8) -> Value {
    json!({"prefix": {"addr": addr.to_string(), "len": len}})
}
fn ct_new() -> Value {
    matches("in", json!({"ct": {"key": "state"}}), json!("new"))
}
fn daddr_proto_port() -> Value {
    concat(vec![
        payload("ip", "daddr"),
        meta("l4proto"),
        payload("th", "dport"),
    ])
}
fn proto_port() -> Value {
    concat(vec![meta("l4proto"), payload("th", "dport")])
}
fn mark_for_masquerade() -> Value {
    json!({"mangle": {"key": meta("mark"), "value": {"|": [meta("mark"), MASQUERADE_MARK]}}})
}
fn vmap(key: Value, set: &str) -> Value {
    json!({"vmap": {"key": key, "data": format!("@{set}")}})
}

/// The table's fixed part, rebuilt from nothing: base chains hooked where upstream hooks
/// them, the jumps to the regular chains, the sets and maps, the static rules.
fn base(cfg: &NftConfig, cmds: &mut Vec<Value>) {
    // Add then delete: no error when the table is not there, and nothing left of it.
    cmds.push(add(json!({"table": table()})));
    cmds.push(json!({"delete": {"table": table()}}));
    cmds.push(add(json!({"table": table()})));
    let base_chains: [(&str, &str, &str, i32); 8] = [
        ("filter-prerouting-pre-dnat", "filter", "prerouting", -110),
        ("filter-output-pre-dnat", "filter", "output", -110),
        ("filter-input", "filter", "input", 0),
        ("filter-forward", "filter", "forward", 0),
        ("filter-output", "filter", "output", 0),
        ("nat-prerouting", "nat", "prerouting", -100),
        ("nat-output", "nat", "output", -100),
        ("nat-postrouting", "nat", "postrouting", 100),
    ];
    for (name, ty, hook, prio) in base_chains {
        cmds.push(add(json!({"chain": {
            "family": "ip", "table": TABLE, "name": name,
            "type": ty, "hook": hook, "prio": prio, "policy": "accept",
        }})));
    }
    for name in [
        "nodeport-endpoints-check",
        "service-endpoints-check",
        "firewall-check",
        "services",
        "masquerading",
        "cluster-ips-check",
        REJECT_CHAIN,
    ] {
        cmds.push(add(chain_obj(name)));
    }
    let set = |name: &str, ty: Value, comment: &str| {
        add(
            json!({"set": {"family": "ip", "table": TABLE, "name": name, "type": ty,
            "comment": comment}}),
        )
    };
    let map = |name: &str, ty: Value, comment: &str| {
        add(
            json!({"map": {"family": "ip", "table": TABLE, "name": name, "type": ty,
            "map": "verdict", "comment": comment}}),
        )
    };
    let addr_proto_port = json!(["ipv4_addr", "inet_proto", "inet_service"]);
    cmds.push(set(
        "hairpin-connections",
        json!(["ipv4_addr", "ipv4_addr", "inet_proto", "inet_service"]),
        "service hairpin connections",
    ));
    cmds.push(set("cluster-ips", json!("ipv4_addr"), "Active ClusterIPs"));
    cmds.push(set(
        "nodeport-ips",
        json!("ipv4_addr"),
        "IPs that accept NodePort traffic",
    ));
    cmds.push(map(
        "no-endpoint-services",
        addr_proto_port.clone(),
        "vmap to drop or reject packets to services with no endpoints",
    ));
    cmds.push(map(
        "no-endpoint-nodeports",
        json!(["inet_proto", "inet_service"]),
        "vmap to drop or reject packets to service nodeports with no endpoints",
    ));
    cmds.push(map(
        "firewall-ips",
        addr_proto_port.clone(),
        "destinations that are subject to LoadBalancerSourceRanges",
    ));
    cmds.push(map(
        "service-ips",
        addr_proto_port,
        "ClusterIP, ExternalIP and LoadBalancer IP traffic",
    ));
    cmds.push(map(
        "service-nodeports",
        json!(["inet_proto", "inet_service"]),
        "NodePort traffic",
    ));
    // The jumps from the base chains.
    let jumps: [(&str, &str, bool); 11] = [
        ("filter-input", "nodeport-endpoints-check", true),
        ("filter-input", "service-endpoints-check", true),
        ("filter-forward", "service-endpoints-check", true),
        ("filter-output", "service-endpoints-check", true),
        ("filter-prerouting-pre-dnat", "firewall-check", true),
        ("filter-output-pre-dnat", "firewall-check", true),
        ("nat-output", "services", false),
        ("nat-prerouting", "services", false),
        ("nat-postrouting", "masquerading", false),
        ("filter-forward", "cluster-ips-check", true),
        ("filter-output", "cluster-ips-check", true),
    ];
    for (from, to, new_only) in jumps {
        let mut expr = Vec::new();
        if new_only {
            expr.push(ct_new());
        }
        expr.push(jump(to));
        cmds.push(add(rule_obj(from, &rule(expr))));
    }
    let mut rules: Vec<(&str, Rule)> = vec![
        (
            "masquerading",
            rule(vec![
                matches(
                    "!=",
                    json!({"&": [meta("mark"), MASQUERADE_MARK]}),
                    json!(0),
                ),
                json!({"mangle": {"key": meta("mark"), "value": {"^": [meta("mark"), MASQUERADE_MARK]}}}),
                json!({"masquerade": {"flags": ["fully-random"]}}),
            ]),
        ),
        (
            "masquerading",
            rule(vec![
                matches("in", json!({"ct": {"key": "status"}}), json!("dnat")),
                matches(
                    "==",
                    concat(vec![
                        payload("ip", "saddr"),
                        payload("ip", "daddr"),
                        meta("l4proto"),
                        payload("th", "dport"),
                    ]),
                    json!("@hairpin-connections"),
                ),
                json!({"masquerade": {"flags": ["fully-random"]}}),
            ]),
        ),
        (
            "cluster-ips-check",
            commented(
                vec![
                    matches("==", payload("ip", "daddr"), json!("@cluster-ips")),
                    json!({"reject": null}),
                ],
                "Reject traffic to invalid ports of ClusterIPs",
            ),
        ),
    ];
    if !cfg.service_cidrs.is_empty() {
        let ranges: Vec<Value> = cfg
            .service_cidrs
            .iter()
            .map(|(a, l)| prefix(*a, *l))
            .collect();
        rules.push((
            "cluster-ips-check",
            commented(
                vec![
                    matches("==", payload("ip", "daddr"), json!({ "set": ranges })),
                    json!({"drop": null}),
                ],
                "Drop traffic to unallocated ClusterIPs",
            ),
        ));
    }
    rules.push((REJECT_CHAIN, rule(vec![json!({"reject": null})])));
    rules.push((
        "service-endpoints-check",
        rule(vec![vmap(daddr_proto_port(), "no-endpoint-services")]),
    ));
    rules.push((
        "nodeport-endpoints-check",
        rule(vec![
            matches("==", payload("ip", "daddr"), json!("@nodeport-ips")),
            vmap(proto_port(), "no-endpoint-nodeports"),
        ]),
    ));
    rules.push((
        "firewall-check",
        rule(vec![vmap(daddr_proto_port(), "firewall-ips")]),
    ));
    if let Some((addr, len)) = cfg.cluster_cidr {
        rules.push((
            "services",
            commented(
                vec![
                    matches("==", payload("ip", "daddr"), json!("@cluster-ips")),
                    matches("!=", payload("ip", "saddr"), prefix(addr, len)),
                    mark_for_masquerade(),
                ],
                "masquerade clusterIP traffic from outside cluster",
            ),
        ));
    }
    rules.push((
        "services",
        rule(vec![vmap(daddr_proto_port(), "service-ips")]),
    ));
    rules.push((
        "services",
        rule(vec![
            matches("==", payload("ip", "daddr"), json!("@nodeport-ips")),
            vmap(proto_port(), "service-nodeports"),
        ]),
    ));
    for (chain, r) in &rules {
        cmds.push(add(rule_obj(chain, r)));
    }
    if !cfg.node_ips.is_empty() {
        let elems: Vec<Value> = cfg
            .node_ips
            .iter()
            .map(|ip| json!(ip.to_string()))
            .collect();
        cmds.push(add(json!({"element": {"family": "ip", "table": TABLE,
            "name": "nodeport-ips", "elem": elems}})));
    }
}

/// The commands that turn each changed Service's part of the table from `before` into
/// `after`; `owners` counts the Services that want each element.
fn diff(
    changes: &[(&Desired, &Desired)],
    owners: &mut BTreeMap<(&'static str, String), usize>,
    cmds: &mut Vec<Value>,
) {
    // Affinity sets first: endpoint chains' rules update them.
    for (before, after) in changes {
        for (name, timeout) in &after.affinity_sets {
            if before.affinity_sets.get(name) != Some(timeout) {
                if before.affinity_sets.contains_key(name) {
                    cmds.push(json!({"delete": {"set": {"family": "ip", "table": TABLE, "name": name, "type": "ipv4_addr"}}}));
                }
                cmds.push(add(
                    json!({"set": {"family": "ip", "table": TABLE, "name": name,
                    "type": "ipv4_addr", "flags": ["timeout"], "timeout": timeout}}),
                ));
            }
        }
    }
    // New and changed chains: every chain exists before any rule refers to it.
    let changed: Vec<(&String, &Vec<Rule>)> = changes
        .iter()
        .flat_map(|(before, after)| {
            after
                .chains
                .iter()
                .filter(|(name, rules)| before.chains.get(*name) != Some(*rules))
        })
        .collect();
    for (before, after) in changes {
        for (name, rules) in &after.chains {
            if before.chains.get(name) != Some(rules) {
                cmds.push(add(chain_obj(name)));
                if before.chains.contains_key(name) {
                    cmds.push(json!({"flush": chain_obj(name)}));
                }
            }
        }
    }
    for (name, rules) in &changed {
        for r in *rules {
            cmds.push(add(rule_obj(name, r)));
        }
    }
    // Elements gone or changed go, then the new ones come; an element another Service
    // still wants stays.
    let empty = BTreeMap::new();
    for set in CONTAINERS {
        let mut gone = Vec::new();
        for (before, after) in changes {
            let old = before.elements.get(set).unwrap_or(&empty);
            let new = after.elements.get(set).unwrap_or(&empty);
            for (k, v) in old {
                if new.get(k) == Some(v) {
                    continue;
                }
                let count = owners.entry((set, k.clone())).or_default();
                *count = count.saturating_sub(1);
                if *count == 0 {
                    owners.remove(&(set, k.clone()));
                    gone.push(v.0.clone());
                }
            }
        }
        let mut came = Vec::new();
        for (before, after) in changes {
            let old = before.elements.get(set).unwrap_or(&empty);
            let new = after.elements.get(set).unwrap_or(&empty);
            for (k, (key, value, comment)) in new {
                if old.get(k) == Some(&(key.clone(), value.clone(), comment.clone())) {
                    continue;
                }
                let count = owners.entry((set, k.clone())).or_default();
                *count += 1;
                if *count > 1 {
                    continue;
                }
                let key = match comment {
                    Some(c) => json!({"elem": {"val": key, "comment": c}}),
                    None => key.clone(),
                };
                came.push(match value {
                    Some(v) => json!([key, v]),
                    None => key,
                });
            }
        }
        if !gone.is_empty() {
            cmds.push(
                json!({"delete": {"element": {"family": "ip", "table": TABLE,
                "name": set, "elem": gone}}}),
            );
        }
        if !came.is_empty() {
            cmds.push(add(json!({"element": {"family": "ip", "table": TABLE,
                "name": set, "elem": came}})));
        }
    }
    // Chains no longer wanted are flushed now and deleted by a later transaction: the
    // kernel counts the references of the map elements removed above until this one
    // commits (upstream does the same).
    for (before, after) in changes {
        for name in before.chains.keys() {
            if !after.chains.contains_key(name) {
                cmds.push(json!({"flush": chain_obj(name)}));
            }
        }
        for name in before.affinity_sets.keys() {
            if !after.affinity_sets.contains_key(name) {
                cmds.push(json!({"delete": {"set": {"family": "ip", "table": TABLE, "name": name, "type": "ipv4_addr"}}}));
            }
        }
    }
}

/// Upstream's chain name base: `HASH-name`, HASH the first 8 characters of the base32
/// SHA-256 of `name`, truncated to nftables' limit.
pub fn hash_and_truncate(name: &str) -> String {
    const MAX: usize = 256 - 16;
    let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let hash = base32(digest.as_ref());
    let mut out = format!("{}-{name}", &hash[..8]);
    if out.len() > MAX {
        out.truncate(MAX - 3);
        out.push_str("...");
    }
    out
}

/// RFC 4648 base32 (upper case, with padding).
fn base32(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    let (mut buf, mut bits) = (0u32, 0u32);
    for &b in data {
        buf = (buf << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            out.push(ALPHABET[((buf >> (bits - 5)) & 31) as usize] as char);
            bits -= 5;
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buf << (5 - bits)) & 31) as usize] as char);
    }
    while out.len() % 8 != 0 {
        out.push('=');
    }
    out
}

/// An endpoint as a Service port uses it.
#[derive(Clone, Debug)]
struct Endpoint {
    ip: Ipv4Addr,
    port: u16,
    local: bool,
}

fn proto_name(p: Option<&str>) -> &'static str {
    match p {
        Some("UDP") => "udp",
        Some("SCTP") => "sctp",
        _ => "tcp",
    }
}

/// The whole Service-dependent table, and how many Service ports it programs.
/// Each Service's IPv4 EndpointSlices.
fn slices_by_service(slices: &[Arc<EndpointSlice>]) -> BTreeMap<ServiceKey, Vec<&EndpointSlice>> {
    let mut by_service: BTreeMap<ServiceKey, Vec<&EndpointSlice>> = BTreeMap::new();
    for s in slices {
        if s.address_type != "IPv4" {
            continue;
        }
        let Some(svc) = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::SERVICE_NAME_LABEL))
        else {
            continue;
        };
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        by_service.entry((ns, svc.clone())).or_default().push(s);
    }
    by_service
}

/// What a Service's part of the table is computed from: its uid and resourceVersion and
/// its slices'; `None` when one has no resourceVersion.
fn inputs_of(svc: &Service, slices: &[&EndpointSlice]) -> Option<Vec<String>> {
    let mut inputs = vec![
        svc.metadata.uid.clone().unwrap_or_default(),
        svc.metadata.resource_version.clone()?,
    ];
    let mut of_slices = slices
        .iter()
        .map(|s| {
            Some(format!(
                "{}@{}",
                s.metadata.name.as_deref().unwrap_or_default(),
                s.metadata.resource_version.as_deref()?
            ))
        })
        .collect::<Option<Vec<String>>>()?;
    of_slices.sort();
    inputs.extend(of_slices);
    Some(inputs)
}

/// One Service's part of the table, how many of its ports it programs, and its UDP ports.
fn compute(
    cfg: &NftConfig,
    svc: &Service,
    svc_slices: &[&EndpointSlice],
) -> (Desired, usize, Vec<UdpPort>) {
    let mut d = Desired::default();
    let mut count = 0;
    let mut udp = Vec::new();
    {
        let labels = svc.metadata.labels.as_ref();
        if labels.is_some_and(|l| {
            l.contains_key(crate::SERVICE_PROXY_NAME_LABEL) || l.contains_key(crate::HEADLESS_LABEL)
        }) {
            return (d, 0, udp);
        }
        let Some(spec) = &svc.spec else {
            return (d, 0, udp);
        };
        let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
        if ty == "ExternalName" {
            return (d, 0, udp);
        }
        let Some(cluster_ip) = spec
            .cluster_ip
            .as_deref()
            .and_then(|c| c.parse::<Ipv4Addr>().ok())
        else {
            return (d, 0, udp);
        };
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let external_ips: Vec<Ipv4Addr> = spec
            .external_ips
            .iter()
            .flatten()
            .filter_map(|i| i.parse().ok())
            .collect();
        let lb_ips: Vec<Ipv4Addr> = if ty == "LoadBalancer" {
            svc.status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref())
                .map(|ing| {
                    ing.iter()
                        .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
                        .filter_map(|i| i.ip.as_deref()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let source_ranges: Vec<(Ipv4Addr, u8)> = spec
            .load_balancer_source_ranges
            .iter()
            .flatten()
            .filter_map(|r| parse_cidr(r))
            .collect();
        let externally = ty == "NodePort" || ty == "LoadBalancer" || !external_ips.is_empty();
        let ext_local = externally && spec.external_traffic_policy.as_deref() == Some("Local");
        let int_local = spec.internal_traffic_policy.as_deref() == Some("Local");
        let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .and_then(|t| u32::try_from(t).ok())
                .unwrap_or(10800)
        });
        for port in spec.ports.iter().flatten() {
            count += 1;
            let proto = proto_name(port.protocol.as_deref());
            let port_name = port.name.clone().unwrap_or_default();
            let svc_port = u16::try_from(port.port).unwrap_or(0);
            let base = hash_and_truncate(&format!("{ns}/{name}/{proto}/{port_name}"));
            let comment = format!("{ns}/{name}:{port_name}");
            let (cluster_eps, local_eps, serving) = categorize(
                svc_slices,
                &port_name,
                port.protocol.as_deref(),
                &cfg.node_name,
            );
            let has_endpoints = !cluster_eps.is_empty();
            let cluster_chain = format!("service-{base}");
            let local_chain = format!("local-{base}");
            let external_chain = format!("external-{base}");
            let fw_chain = format!("firewall-{base}");
            let has_internal = if int_local {
                !local_eps.is_empty()
            } else {
                has_endpoints
            };
            let has_external = if ext_local {
                !local_eps.is_empty()
            } else {
                has_endpoints
            };
            let internal_chain = if int_local {
                &local_chain
            } else {
                &cluster_chain
            };
            let external_policy_chain = if ext_local {
                &local_chain
            } else {
                &cluster_chain
            };
            let (internal_verdict, external_verdict) = if !has_endpoints {
                (goto(REJECT_CHAIN), goto(REJECT_CHAIN))
            } else {
                (json!({"drop": null}), json!({"drop": null}))
            };
            let key = |ip: Ipv4Addr| json!({"concat": [ip.to_string(), proto, svc_port]});
            let uses_cluster_chain = has_endpoints && (!int_local || (externally && !ext_local));
            let uses_local_chain = !local_eps.is_empty() && (int_local || ext_local);
            let uses_external_chain = has_endpoints && externally;
            for ep in cluster_eps.iter().chain(local_eps.iter()) {
                if ep.local {
                    d.elem(
                        "hairpin-connections",
                        json!({"concat": [ep.ip.to_string(), ep.ip.to_string(), proto, ep.port]}),
                        None,
                        None,
                    );
                }
            }
            d.elem("cluster-ips", json!(cluster_ip.to_string()), None, None);
            if has_internal {
                d.elem(
                    "service-ips",
                    key(cluster_ip),
                    Some(goto(internal_chain)),
                    None,
                );
            } else {
                d.elem(
                    "no-endpoint-services",
                    key(cluster_ip),
                    Some(internal_verdict.clone()),
                    Some(&comment),
                );
            }
            // External IPs and load-balancer ingress IPs lead to the external chain alike;
            // only the latter are subject to loadBalancerSourceRanges.
            let uses_fw = !lb_ips.is_empty() && !source_ranges.is_empty();
            let external = external_ips.iter().map(|ip| (ip, false));
            for (ip, is_lb) in external.chain(lb_ips.iter().map(|ip| (ip, true))) {
                if has_endpoints {
                    d.elem("service-ips", key(*ip), Some(goto(&external_chain)), None);
                }
                if is_lb && uses_fw {
                    d.elem("firewall-ips", key(*ip), Some(goto(&fw_chain)), None);
                }
                if !has_external {
                    d.elem(
                        "no-endpoint-services",
                        key(*ip),
                        Some(external_verdict.clone()),
                        Some(&comment),
                    );
                }
            }
            let node_port = port.node_port.and_then(|p| u16::try_from(p).ok());
            if proto == "udp" {
                udp.push(UdpPort {
                    dests: std::iter::once(&cluster_ip)
                        .chain(&external_ips)
                        .chain(&lb_ips)
                        .map(|ip| (*ip, svc_port))
                        .collect(),
                    node_port: node_port.filter(|p| *p != 0),
                    serving,
                });
            }
            if let Some(np) = node_port.filter(|p| *p != 0) {
                let k = json!({"concat": [proto, np]});
                if has_endpoints {
                    d.elem(
                        "service-nodeports",
                        k.clone(),
                        Some(goto(&external_chain)),
                        None,
                    );
                }
                if !has_external {
                    d.elem(
                        "no-endpoint-nodeports",
                        k,
                        Some(external_verdict.clone()),
                        Some(&comment),
                    );
                }
            }
            if uses_external_chain {
                let mut rules = Vec::new();
                if !ext_local {
                    // Endpoints on other nodes: the reply must come back through here.
                    rules.push(commented(vec![mark_for_masquerade()], "masquerade"));
                } else {
                    if let Some((addr, len)) = cfg.cluster_cidr {
                        rules.push(commented(
                            vec![
                                matches("==", payload("ip", "saddr"), prefix(addr, len)),
                                goto(&cluster_chain),
                            ],
                            "short-circuit pod traffic",
                        ));
                    }
                    let from_local = matches(
                        "==",
                        json!({"fib": {"result": "type", "flags": ["saddr"]}}),
                        json!("local"),
                    );
                    rules.push(commented(
                        vec![from_local.clone(), mark_for_masquerade()],
                        "masquerade local traffic",
                    ));
                    rules.push(commented(
                        vec![from_local, goto(&cluster_chain)],
                        "short-circuit local traffic",
                    ));
                }
                if has_external {
                    rules.push(rule(vec![goto(external_policy_chain)]));
                }
                d.chains.insert(external_chain.clone(), rules);
            }
            if uses_fw {
                let mut sources: Vec<Value> =
                    source_ranges.iter().map(|(a, l)| prefix(*a, *l)).collect();
                let from_node = cfg.node_ips.iter().any(|ip| {
                    source_ranges.iter().any(|(a, l)| {
                        parse_cidr(&format!("{a}/{l}")).is_some_and(|c| contains(c, *ip))
                    })
                });
                if from_node {
                    sources.extend(lb_ips.iter().map(|ip| json!(ip.to_string())));
                }
                d.chains.insert(
                    fw_chain.clone(),
                    vec![rule(vec![
                        matches("!=", payload("ip", "saddr"), json!({ "set": sources })),
                        json!({"drop": null}),
                    ])],
                );
            }
            let policy = |chain: &str, eps: &[Endpoint], d: &mut Desired| match affinity {
                None => {
                    d.chains
                        .insert(chain.to_owned(), vec![dnat_rule(proto, eps)]);
                }
                Some(timeout) => {
                    let mut rules = Vec::new();
                    let mut vmap_items = Vec::new();
                    for (i, ep) in eps.iter().enumerate() {
                        let ep_base = hash_and_truncate(&format!(
                            "{ns}/{name}/{proto}/{port_name}__{}/{}",
                            ep.ip, ep.port
                        ));
                        let ep_chain = format!("endpoint-{ep_base}");
                        let set = format!("affinity-{ep_base}");
                        rules.push(rule(vec![
                            matches("==", payload("ip", "saddr"), json!(format!("@{set}"))),
                            goto(&ep_chain),
                        ]));
                        vmap_items.push(json!([i, goto(&ep_chain)]));
                        d.affinity_sets.insert(set.clone(), timeout);
                        d.chains.insert(
                            ep_chain,
                            vec![
                                rule(vec![json!({"set": {"op": "update",
                                    "elem": payload("ip", "saddr"), "set": format!("@{set}")}})]),
                                rule(vec![
                                    matches("==", meta("l4proto"), json!(proto)),
                                    json!({"dnat": {"addr": ep.ip.to_string(), "port": ep.port}}),
                                ]),
                            ],
                        );
                    }
                    rules.push(rule(vec![json!({"vmap": {
                        "key": {"numgen": {"mode": "random", "mod": eps.len(), "offset": 0}},
                        "data": {"set": vmap_items},
                    }})]));
                    d.chains.insert(chain.to_owned(), rules);
                }
            };
            if uses_cluster_chain {
                policy(&cluster_chain, &cluster_eps, &mut d);
            }
            if uses_local_chain {
                policy(&local_chain, &local_eps, &mut d);
            }
        }
    }
    (d, count, udp)
}

/// A Service port chain's DNAT: straight to the one endpoint, else to one picked at
/// random (`numgen random mod N map`).
fn dnat_rule(proto: &str, eps: &[Endpoint]) -> Rule {
    let l4 = matches("==", meta("l4proto"), json!(proto));
    if let [ep] = eps {
        return rule(vec![
            l4,
            json!({"dnat": {"addr": ep.ip.to_string(), "port": ep.port}}),
        ]);
    }
    let items: Vec<Value> = eps
        .iter()
        .enumerate()
        .map(|(i, ep)| json!([i, {"concat": [ep.ip.to_string(), ep.port]}]))
        .collect();
    rule(vec![
        l4,
        json!({"dnat": {"family": "ip", "addr": {"map": {
            "key": {"numgen": {"mode": "random", "mod": eps.len(), "offset": 0}},
            "data": {"set": items},
        }}}}),
    ])
}

/// The endpoints a Service port uses (upstream's CategorizeEndpoints without topology):
/// the ready ones, else the serving terminating ones; and those of them on this node.
fn categorize(
    slices: &[&EndpointSlice],
    port_name: &str,
    protocol: Option<&str>,
    node: &str,
) -> (Vec<Endpoint>, Vec<Endpoint>, BTreeSet<(Ipv4Addr, u16)>) {
    let mut ready = Vec::new();
    let mut terminating = Vec::new();
    let mut all_serving = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for s in slices {
        let Some(port) = s.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or_default() == port_name
                && proto_name(p.protocol.as_deref()) == proto_name(protocol)
        }) else {
            continue;
        };
        let Some(number) = port.port.and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        for e in s.endpoints.iter().flatten() {
            let c = e.conditions.as_ref();
            let is_ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(is_ready);
            let term = c.and_then(|c| c.terminating).unwrap_or(false);
            let local = e.node_name.as_deref() == Some(node);
            for a in &e.addresses {
                let Ok(ip) = a.parse::<Ipv4Addr>() else {
                    continue;
                };
                if !seen.insert((ip, number)) {
                    continue;
                }
                if serving {
                    all_serving.insert((ip, number));
                }
                let ep = Endpoint {
                    ip,
                    port: number,
                    local,
                };
                if is_ready {
                    ready.push(ep);
                } else if serving && term {
                    terminating.push(ep);
                }
            }
        }
    }
    let pick = |v: &[Endpoint], t: &[Endpoint]| if v.is_empty() { t.to_vec() } else { v.to_vec() };
    let cluster = pick(&ready, &terminating);
    let local_ready: Vec<Endpoint> = ready.iter().filter(|e| e.local).cloned().collect();
    let local_term: Vec<Endpoint> = terminating.iter().filter(|e| e.local).cloned().collect();
    let local = pick(&local_ready, &local_term);
    (cluster, local, all_serving)
}

/// `10.0.0.0/8` as an address and prefix length.
pub fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (a, l) = s.split_once('/')?;
    let len: u8 = l.parse().ok().filter(|l| *l <= 32)?;
    Some((a.parse().ok()?, len))
}

fn contains((addr, len): (Ipv4Addr, u8), ip: Ipv4Addr) -> bool {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    u32::from(addr) & mask == u32::from(ip) & mask
}

/// The address of an IPv4 `IpAddr`.
pub fn v4(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(v) => Some(v),
        IpAddr::V6(_) => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_hash_as_upstream() {
        // Upstream's own example: ns1/svc1/tcp/p80 → ULMVA6XW.
        assert_eq!(
            hash_and_truncate("ns1/svc1/tcp/p80"),
            "ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert_eq!(
            hash_and_truncate("ns1/svc1/tcp/p80__10.180.0.1/80"),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        assert_eq!(base32(b"foobar"), "MZXW6YTBOI======");
    }
}

/// How often the proxier may sync at most (`--min-sync-period`), and how often it syncs
/// anyway (`--sync-period`).
#[derive(Clone, Copy, Debug)]
pub struct SyncPeriods {
    pub min: std::time::Duration,
    pub full: std::time::Duration,
}

impl Default for SyncPeriods {
    fn default() -> Self {
        // Upstream's defaults are 1s and 30s; a node here is a namespace, and a sync of
        // a few Services a few milliseconds, so changes go out as they come.
        SyncPeriods {
            min: std::time::Duration::from_millis(100),
            full: std::time::Duration::from_secs(30),
        }
    }
}

/// The health-check node ports of the Services with `externalTrafficPolicy: Local`, with
/// each one's ready endpoints on `node`.
pub fn service_health(
    node: &str,
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
) -> BTreeMap<u16, crate::health::ServiceHealth> {
    let mut out = BTreeMap::new();
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        if spec.external_traffic_policy.as_deref() != Some("Local") {
            continue;
        }
        let Some(port) = spec
            .health_check_node_port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
        else {
            continue;
        };
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let mut local = BTreeSet::new();
        for s in slices {
            let ours = s.metadata.namespace.as_deref() == Some(ns.as_str())
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(crate::SERVICE_NAME_LABEL))
                    == Some(&name);
            if !ours {
                continue;
            }
            for e in s.endpoints.iter().flatten() {
                let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                if ready && e.node_name.as_deref() == Some(node) {
                    local.extend(e.addresses.iter().cloned());
                }
            }
        }
        out.insert(
            port,
            crate::health::ServiceHealth {
                namespace: ns,
                name,
                local_endpoints: local.len(),
            },
        );
    }
    out
}

/// Now, as RFC 3339 (the health answers' times).
pub fn rfc3339_now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// A node's running nftables proxy: informers on Services and EndpointSlices, and a task
/// that syncs the table when they change (at most every `min`, at least every `full`).
/// Dropping it stops the proxy and removes the table.
pub struct NftProxy {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    synced: tokio::sync::watch::Receiver<u64>,
}

impl NftProxy {
    /// Starts watching through `client` and programming the table of `cfg`'s node.
    pub fn start(client: kube::Client, cfg: NftConfig, periods: SyncPeriods) -> NftProxy {
        use kumo_client::informer::InformerFactory;
        let factory = InformerFactory::new(client);
        let services = factory.informer::<Service>();
        let slices = factory.informer::<EndpointSlice>();
        let changed = Arc::new(tokio::sync::Notify::new());
        {
            let c = changed.clone();
            services.add_handler(move |_| c.notify_one());
            let c = changed.clone();
            slices.add_handler(move |_| c.notify_one());
        }
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut tasks = factory.start(stop_rx.clone());
        let (synced_tx, synced) = tokio::sync::watch::channel(0u64);
        let node = cfg.node_name.clone();
        let netns = cfg.netns.clone();
        let mut health = crate::health::HealthServers::new(cfg.netns.clone());
        let metrics = Arc::new(crate::metrics::ProxyMetrics::default());
        let proxier = Arc::new(std::sync::Mutex::new(NftProxier::new(cfg)));
        tasks.push(tokio::spawn(async move {
            services.wait_synced().await;
            slices.wait_synced().await;
            let mut generation = 0u64;
            loop {
                if netns.as_ref().is_some_and(|n| !n.exists()) {
                    // The node's machine is gone (powered off): so is its table.
                    tracing::debug!(node = %node, "the node's namespace is gone; kube-proxy stops");
                    return;
                }
                let started = std::time::Instant::now();
                let (svcs, sls) = (services.list(), slices.list());
                health.sync(&service_health(&node, &svcs, &sls));
                let p = proxier.clone();
                let result = tokio::task::spawn_blocking(move || {
                    let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
                    let r = p.sync(&svcs, &sls);
                    (r, p.has_stale_chains())
                })
                .await;
                let mut again_soon = false;
                match result {
                    Ok((Ok(stats), stale)) => {
                        health.set_proxy_healthy(true);
                        health.serve_metrics(metrics.clone());
                        metrics.synced(stats.full, started.elapsed().as_secs_f64());
                        generation += 1;
                        synced_tx.send_replace(generation);
                        again_soon = stale;
                        tracing::debug!(node = %node, ?stats, elapsed = ?started.elapsed(), "nftables synced");
                    }
                    Ok((Err(e), _)) => {
                        health.set_proxy_healthy(false);
                        metrics.failed();
                        again_soon = true;
                        tracing::warn!(node = %node, error = %e, "nftables sync failed");
                    }
                    Err(e) => tracing::warn!(node = %node, error = %e, "nftables sync panicked"),
                }
                let wait = if again_soon {
                    std::time::Duration::from_secs(1)
                } else {
                    periods.full
                };
                let mut stop_rx = stop_rx.clone();
                tokio::select! {
                    _ = changed.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop_rx.changed() => break,
                }
                let since = started.elapsed();
                if since < periods.min {
                    tokio::time::sleep(periods.min - since).await;
                }
            }
            let p = proxier.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(e) = p.cleanup() {
                    tracing::debug!(error = %e, "removing the kube-proxy table");
                }
            })
            .await;
        }));
        NftProxy {
            stop,
            tasks,
            synced,
        }
    }

    /// Waits until the table has been synced once after the caches filled.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.clone();
        let _ = rx.wait_for(|g| *g > 0).await;
    }

    /// Stops syncing and removes the table (waits for it).
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        if let Some(last) = self.tasks.pop() {
            let _ = last.await;
        }
    }
}

impl Drop for NftProxy {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        // The watches end at once; the sync task removes the table as it ends.
        let n = self.tasks.len().saturating_sub(1);
        for t in self.tasks.iter().take(n) {
            t.abort();
        }
    }
}
