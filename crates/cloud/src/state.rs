//! The cloud's state and the rules that change it: IPAM, the instance lifecycle, load
//! balancers and their VIPs, routes, policies, faults and quotas.
//!
//! Persistence ([`Store`]) costs in proportion to the change, not to the cloud: the data
//! directory holds a snapshot, `state.json` (the whole [`State`]), and an append-only
//! journal, `state.journal`, of the changes since (framing in [`crate::journal`]). Before
//! a change is answered, one record holding the whole new value of each instance and load
//! balancer it touched (`null` for one deleted) and, when it changed, the small rest
//! (routes, policies, faults, quotas, keys) is appended and fdatasync'd; concurrent
//! changes share one record and one fdatasync (group commit). A change that cannot be made
//! durable is undone and answered with 500. Opening loads the snapshot and replays the
//! journal: a torn last record (a crash mid-append; never acknowledged) is cut off, damage
//! before an intact record is refused. When the journal outgrows the snapshot (or holds
//! [`CompactionPolicy::max_records`] changes) the next commit writes a new snapshot
//! atomically instead of a record, with a generation one higher, then replaces the
//! journal with an empty one naming that generation; a crash between the two leaves a
//! journal naming an older generation, which opening recognises as already folded in.
//! Both files are mode 0600: they hold secrets.
//!
//! What changed is known without diffing: the instance and load balancer maps are
//! [`Tracked`], whose only mutators (`get_mut`, `insert`, `remove`, `retain`) record the
//! key and its earlier value, so the compiler guarantees no mutation goes unseen, and a
//! failed write can be undone exactly. The rest is small, so it is serialized at each
//! commit and compared with what was last made durable rather than tracked by hand.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::error::{codes, ApiError};
use crate::journal;
use crate::model::*;

/// The snapshot's name in the data directory.
pub const STATE_FILE: &str = "state.json";

/// The journal's name in the data directory.
pub const JOURNAL_FILE: &str = "state.journal";

/// An IPv4 CIDR block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    /// The network address.
    pub addr: u32,
    /// Prefix length, 0–32.
    pub len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n`; host bits must be zero.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (ip, len) = s
            .split_once('/')
            .ok_or_else(|| format!("'{s}' is not a CIDR block (expected a.b.c.d/n)"))?;
        let ip: Ipv4Addr = ip
            .parse()
            .map_err(|_| format!("'{s}' is not a valid IPv4 CIDR block"))?;
        let len: u8 = len
            .parse()
            .ok()
            .filter(|l| *l <= 32)
            .ok_or_else(|| format!("'{s}' has an invalid prefix length"))?;
        let addr = u32::from(ip);
        let c = Cidr { addr, len };
        if addr & !c.mask() != 0 {
            return Err(format!(
                "'{s}' has host bits set (did you mean {}?)",
                Cidr {
                    addr: addr & c.mask(),
                    len
                }
            ));
        }
        Ok(c)
    }

    fn mask(self) -> u32 {
        if self.len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.len))
        }
    }

    /// Whether the blocks share an address.
    pub fn overlaps(self, o: Cidr) -> bool {
        let m = self.mask() & o.mask();
        self.addr & m == o.addr & m
    }

    /// Whether `ip` is inside.
    pub fn contains(self, ip: u32) -> bool {
        ip & self.mask() == self.addr
    }

    /// Number of addresses.
    pub fn size(self) -> u64 {
        1u64 << (32 - u32::from(self.len))
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.addr), self.len)
    }
}

/// `prefix` and 17 random hex digits, as upstream clouds' resource ids.
pub fn new_id(prefix: &str) -> String {
    let mut rng = rand::rng();
    let mut s = String::with_capacity(prefix.len() + 18);
    s.push_str(prefix);
    s.push('-');
    for _ in 0..17 {
        let n: u8 = rng.random_range(0..16);
        s.push(char::from_digit(u32::from(n), 16).unwrap_or('0'));
    }
    s
}

/// The current time in RFC 3339.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

fn age(rfc3339: &str) -> Option<Duration> {
    let t = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .ok()?;
    let d = time::OffsetDateTime::now_utc() - t;
    Duration::try_from(d).ok()
}

fn expired(i: &Instance, retention: Duration) -> bool {
    i.state == InstanceState::Terminated
        && i.terminated_time
            .as_deref()
            .and_then(age)
            .is_some_and(|a| a >= retention)
}

/// A stored access key.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyRecord {
    /// Access key id.
    pub id: String,
    /// Secret.
    pub secret: String,
    /// Name.
    pub name: String,
}

/// A stored load balancer (targets as ids; health is computed when read).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LbRecord {
    id: String,
    name: String,
    dns_name: String,
    vip: String,
    listeners: Vec<Listener>,
    targets: Vec<String>,
    health_check: HealthCheck,
    #[serde(default)]
    tags: BTreeMap<String, String>,
    created_time: String,
}

/// A stored route.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RouteRecord {
    destination_cidr: String,
    instance_id: String,
    name: String,
    #[serde(default)]
    description: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SubnetRecord {
    id: String,
    zone: String,
    cidr: String,
}

/// Everything the cloud knows, as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    version: u32,
    /// Which snapshot this is; the journal names the one it continues (see [`Store`]).
    #[serde(default)]
    generation: u64,
    vpc_id: String,
    subnets: Vec<SubnetRecord>,
    route_table_id: String,
    instances: Tracked<Instance>,
    load_balancers: Tracked<LbRecord>,
    #[serde(default)]
    volumes: Tracked<Volume>,
    routes: Vec<RouteRecord>,
    faults: BTreeMap<String, Fault>,
    policies: Vec<PolicyStatement>,
    quotas: Quotas,
    access_keys: Vec<KeyRecord>,
    /// Targets' health as the network's probes found it: live data, shared by every copy
    /// of the state and never stored (probed again after a restart).
    #[serde(skip)]
    probed: Arc<parking_lot::RwLock<Probed>>,
}

/// Health checks' results (see [`State::record_probe`]).
#[derive(Debug, Default)]
pub struct Probed {
    /// Whether health comes from probes at all.
    pub active: bool,
    /// By (load balancer, instance): the state, its reason, passes and failures in a row.
    targets: HashMap<(String, String), ProbeCount>,
}

#[derive(Clone, Copy, Debug)]
struct ProbeCount {
    healthy: Option<bool>,
    passes: u32,
    failures: u32,
}

/// The range of the default VPC's subnet in zone `ZONES[i]`.
pub fn subnet_cidr(i: usize) -> String {
    format!("10.0.{}.0/24", i + 1)
}

impl State {
    /// A fresh cloud: the default VPC with one subnet per zone, its route table, and one
    /// access key named `admin`.
    pub fn new() -> State {
        State {
            version: 1,
            generation: 0,
            vpc_id: new_id("vpc"),
            subnets: ZONES
                .iter()
                .enumerate()
                .map(|(i, z)| SubnetRecord {
                    id: new_id("subnet"),
                    zone: (*z).to_owned(),
                    cidr: subnet_cidr(i),
                })
                .collect(),
            route_table_id: new_id("rtb"),
            instances: Tracked::default(),
            load_balancers: Tracked::default(),
            volumes: Tracked::default(),
            routes: Vec::new(),
            faults: BTreeMap::new(),
            policies: Vec::new(),
            quotas: Quotas::default(),
            access_keys: vec![new_key("admin")],
            probed: Arc::default(),
        }
    }

    /// Health comes from probes from now on (the network's are real).
    pub fn probe_targets(&self) {
        self.probed.write().active = true;
    }

    /// What to health-check now: (load balancer, instance, address to probe, check) for
    /// every registered running target with an address.
    pub fn health_checks(&self) -> Vec<(String, String, SocketAddr, HealthCheck)> {
        let mut out = Vec::new();
        for r in self.load_balancers.values() {
            let port = match r.health_check.port {
                0 => r.listeners.first().map_or(0, |l| l.target_port),
                p => p,
            };
            for id in &r.targets {
                let Some(i) = self.instances.get(id) else {
                    continue;
                };
                if i.state != InstanceState::Running {
                    continue;
                }
                let Ok(ip) = i.private_ip.parse::<Ipv4Addr>() else {
                    continue;
                };
                out.push((
                    r.id.clone(),
                    id.clone(),
                    SocketAddr::from((ip, port)),
                    r.health_check.clone(),
                ));
            }
        }
        out
    }

    /// Counts one health check's result, with the load balancer's thresholds.
    pub fn record_probe(&self, lb: &str, instance: &str, passed: bool) {
        let Some(r) = self.load_balancers.get(lb) else {
            return;
        };
        let mut p = self.probed.write();
        let c = p
            .targets
            .entry((lb.to_owned(), instance.to_owned()))
            .or_insert(ProbeCount {
                healthy: None,
                passes: 0,
                failures: 0,
            });
        if passed {
            c.passes += 1;
            c.failures = 0;
            if c.passes >= r.health_check.healthy_threshold.max(1) {
                c.healthy = Some(true);
            }
        } else {
            c.failures += 1;
            c.passes = 0;
            if c.failures >= r.health_check.unhealthy_threshold.max(1) {
                c.healthy = Some(false);
            }
        }
    }

    /// The load balancers as the network carries them: each with its healthy targets.
    pub fn lb_routes(&self) -> Vec<crate::network::LbRoute> {
        let mut out: Vec<crate::network::LbRoute> = self
            .load_balancers
            .values()
            .filter_map(|r| {
                let view = self.lb_view(r);
                let targets = view
                    .targets
                    .iter()
                    .filter(|t| t.health == TargetHealthState::Healthy)
                    .filter_map(|t| self.instances.get(&t.instance_id)?.private_ip.parse().ok())
                    .collect();
                Some(crate::network::LbRoute {
                    id: r.id.clone(),
                    vip: r.vip.parse().ok()?,
                    listeners: r.listeners.clone(),
                    targets,
                })
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    // ---- credentials, policies, faults, quotas ----

    /// The access keys.
    pub fn access_keys(&self) -> &[KeyRecord] {
        &self.access_keys
    }

    /// Adds an access key.
    pub fn create_access_key(&mut self, name: &str) -> Result<KeyRecord, ApiError> {
        if name.is_empty() || name.len() > 64 {
            return Err(ApiError::invalid(
                "name must be 1 to 64 characters long".to_owned(),
            ));
        }
        let k = new_key(name);
        self.access_keys.push(k.clone());
        Ok(k)
    }

    /// The deny statement covering `action` by `credential`, if any.
    pub fn denied(&self, action: &str, credential: &str) -> Option<&PolicyStatement> {
        self.policies.iter().find(|p| p.covers(action, credential))
    }

    /// The policy statements.
    pub fn policies(&self) -> &[PolicyStatement] {
        &self.policies
    }

    /// Adds a deny statement (the same statement twice is kept once).
    pub fn add_policy(&mut self, req: CreatePolicyRequest) -> Result<PolicyStatement, ApiError> {
        let effect = req.effect.unwrap_or_else(|| "Deny".to_owned());
        if effect != "Deny" {
            return Err(ApiError::invalid(format!(
                "effect '{effect}' is not supported: everything not denied is allowed, so only 'Deny' statements exist"
            )));
        }
        validate_action(&req.action)?;
        if let Some(c) = &req.credential {
            if !self.access_keys.iter().any(|k| k.id == *c) {
                return Err(ApiError::invalid(format!(
                    "the access key '{c}' does not exist"
                )));
            }
        }
        if let Some(p) = self
            .policies
            .iter()
            .find(|p| p.action == req.action && p.credential == req.credential)
        {
            return Ok(p.clone());
        }
        let p = PolicyStatement {
            id: new_id("pol"),
            effect,
            action: req.action,
            credential: req.credential,
        };
        self.policies.push(p.clone());
        Ok(p)
    }

    /// Removes one statement by id.
    pub fn delete_policy(&mut self, id: &str) -> Result<PolicyStatement, ApiError> {
        let i = self
            .policies
            .iter()
            .position(|p| p.id == id)
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    codes::POLICY_NOT_FOUND,
                    format!("The policy statement '{id}' does not exist"),
                )
            })?;
        Ok(self.policies.remove(i))
    }

    /// Removes the statements for `action` (and `credential`, when given); returns them.
    pub fn remove_policies(
        &mut self,
        action: &str,
        credential: Option<&str>,
    ) -> Vec<PolicyStatement> {
        let (gone, kept) = std::mem::take(&mut self.policies)
            .into_iter()
            .partition(|p| {
                p.action == action && credential.is_none_or(|c| p.credential.as_deref() == Some(c))
            });
        self.policies = kept;
        gone
    }

    /// The faults by operation.
    pub fn faults(&self) -> &BTreeMap<String, Fault> {
        &self.faults
    }

    /// The fault for `action`: its own, else the one for `*`.
    pub fn fault_for(&self, action: &str) -> Option<&Fault> {
        self.faults.get(action).or_else(|| self.faults.get("*"))
    }

    /// Sets the fault of an operation.
    pub fn set_fault(&mut self, op: &str, f: Fault) -> Result<Fault, ApiError> {
        validate_action(op)?;
        if op.ends_with('*') && op != "*" {
            return Err(ApiError::invalid(
                "faults apply to one operation or to '*'".to_owned(),
            ));
        }
        if !(0.0..=1.0).contains(&f.error_rate) || f.error_rate.is_nan() {
            return Err(ApiError::invalid(format!(
                "errorRate must be between 0 and 1, got {}",
                f.error_rate
            )));
        }
        if f.latency_ms > 600_000 {
            return Err(ApiError::invalid(
                "latencyMs must be at most 600000".to_owned(),
            ));
        }
        if ![
            codes::SERVICE_UNAVAILABLE,
            codes::REQUEST_LIMIT_EXCEEDED,
            codes::INTERNAL_ERROR,
        ]
        .contains(&f.error_code.as_str())
        {
            return Err(ApiError::invalid(format!(
                "errorCode must be ServiceUnavailable, RequestLimitExceeded or InternalError, got '{}'",
                f.error_code
            )));
        }
        self.faults.insert(op.to_owned(), f.clone());
        Ok(f)
    }

    /// Clears one operation's fault, or all with `None`.
    pub fn clear_faults(&mut self, op: Option<&str>) {
        match op {
            Some(op) => {
                self.faults.remove(op);
            }
            None => self.faults.clear(),
        }
    }

    /// The quotas.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// Changes the quotas given.
    pub fn update_quotas(&mut self, u: UpdateQuotasRequest) -> Quotas {
        if let Some(v) = u.max_instances {
            self.quotas.max_instances = v;
        }
        if let Some(v) = u.max_load_balancers {
            self.quotas.max_load_balancers = v;
        }
        if let Some(v) = u.max_routes_per_table {
            self.quotas.max_routes_per_table = v;
        }
        if let Some(v) = u.max_volumes {
            self.quotas.max_volumes = v;
        }
        if let Some(v) = u.max_volume_gib {
            self.quotas.max_volume_gib = v;
        }
        self.quotas.clone()
    }

    // ---- network ----

    /// The default VPC.
    pub fn vpc(&self) -> Vpc {
        Vpc {
            id: self.vpc_id.clone(),
            cidr: VPC_CIDR.to_owned(),
            is_default: true,
        }
    }

    /// The subnets with their free address counts.
    pub fn subnets(&self) -> Vec<Subnet> {
        self.subnets
            .iter()
            .map(|s| {
                let used = self
                    .instances
                    .values()
                    .filter(|i| i.subnet_id == s.id && !i.private_ip.is_empty())
                    .count() as u64;
                let size = Cidr::parse(&s.cidr).map(|c| c.size()).unwrap_or(0);
                Subnet {
                    id: s.id.clone(),
                    vpc_id: self.vpc_id.clone(),
                    zone: s.zone.clone(),
                    cidr: s.cidr.clone(),
                    available_ip_count: size.saturating_sub(5 + used) as u32,
                }
            })
            .collect()
    }

    /// The address `asked` for, when it is a free, unreserved one of the subnet's.
    fn take_private_ip(&self, subnet: &SubnetRecord, asked: &str) -> Result<Ipv4Addr, ApiError> {
        let ip: Ipv4Addr = asked
            .parse()
            .map_err(|_| ApiError::invalid(format!("Invalid IPv4 address: {asked:?}")))?;
        let cidr = Cidr::parse(&subnet.cidr).map_err(ApiError::internal)?;
        let n = u32::from(ip);
        if !cidr.contains(n) {
            return Err(ApiError::invalid(format!(
                "Address {ip} does not fall within the subnet's address range ({})",
                subnet.cidr
            )));
        }
        if n < cidr.addr + 4 || n > cidr.addr + (cidr.size() as u32) - 2 {
            return Err(ApiError::invalid(format!(
                "Address {ip} is reserved in subnet {} (the first four and the last)",
                subnet.id
            )));
        }
        if self
            .instances
            .values()
            .any(|i| i.private_ip == ip.to_string())
        {
            return Err(ApiError::new(
                409,
                codes::ADDRESS_IN_USE,
                format!("Address {ip} is in use."),
            ));
        }
        Ok(ip)
    }

    fn allocate_private_ip(&self, subnet: &SubnetRecord) -> Result<Ipv4Addr, ApiError> {
        let cidr = Cidr::parse(&subnet.cidr).map_err(ApiError::internal)?;
        let used: BTreeSet<u32> = self
            .instances
            .values()
            .filter_map(|i| i.private_ip.parse::<Ipv4Addr>().ok())
            .map(u32::from)
            .collect();
        // Upstream clouds reserve the network address, the next three and the last one.
        let first = cidr.addr + 4;
        let last = cidr.addr + (cidr.size() as u32) - 2;
        (first..=last)
            .find(|ip| !used.contains(ip))
            .map(Ipv4Addr::from)
            .ok_or_else(|| {
                ApiError::new(
                    503,
                    codes::INSUFFICIENT_ADDRESS_CAPACITY,
                    format!(
                        "There are not enough free addresses in subnet '{}' to satisfy the request",
                        subnet.id
                    ),
                )
            })
    }

    fn allocate_vip(&self) -> Result<Ipv4Addr, ApiError> {
        let used: BTreeSet<u32> = self
            .load_balancers
            .values()
            .filter_map(|l| l.vip.parse::<Ipv4Addr>().ok())
            .map(u32::from)
            .collect();
        for pool in PUBLIC_POOLS {
            let pool = Cidr::parse(pool).map_err(ApiError::internal)?;
            // Neither the network nor the broadcast address of a range.
            let last = pool.addr + (pool.size() - 2) as u32;
            if let Some(ip) = (pool.addr + 1..=last).find(|ip| !used.contains(ip)) {
                return Ok(Ipv4Addr::from(ip));
            }
        }
        Err(ApiError::new(
            503,
            codes::INSUFFICIENT_ADDRESS_CAPACITY,
            format!(
                "The public address pools ({}) have no free address",
                PUBLIC_POOLS.join(", ")
            ),
        ))
    }

    // ---- instances ----

    /// One instance.
    pub fn instance(&self, id: &str) -> Result<&Instance, ApiError> {
        self.instances
            .get(id)
            .ok_or_else(|| ApiError::instance_not_found(id))
    }

    /// The instances passing `filter`, ordered by id.
    pub fn instances(&self, filter: &InstanceFilter) -> Vec<Instance> {
        self.instances
            .values()
            .filter(|i| filter.matches(i))
            .cloned()
            .collect()
    }

    /// Every instance (for resuming transitions at start).
    pub fn all_instances(&self) -> Vec<Instance> {
        self.instances.values().cloned().collect()
    }

    /// Forgets terminated instances older than `retention`; whether any went.
    pub fn purge_terminated(&mut self, retention: Duration) -> bool {
        let before = self.instances.len();
        self.instances.retain(|_, i| !expired(i, retention));
        self.instances.len() != before
    }

    /// Whether a terminated instance is older than `retention`.
    pub fn has_expired(&self, retention: Duration) -> bool {
        self.instances.values().any(|i| expired(i, retention))
    }

    /// Launches an instance in state `pending`, with a private IP from its subnet.
    pub fn run_instance(&mut self, req: RunInstanceRequest) -> Result<Instance, ApiError> {
        let type_name = req
            .instance_type
            .unwrap_or_else(|| DEFAULT_INSTANCE_TYPE.to_owned());
        let itype = instance_types()
            .into_iter()
            .find(|t| t.name == type_name)
            .ok_or_else(|| {
                let names: Vec<String> = instance_types().into_iter().map(|t| t.name).collect();
                ApiError::invalid(format!(
                    "The instance type '{type_name}' does not exist; valid types: {}",
                    names.join(", ")
                ))
            })?;
        let subnet = match (&req.subnet_id, &req.zone) {
            (Some(sid), zone) => {
                let s = self.subnets.iter().find(|s| s.id == *sid).ok_or_else(|| {
                    ApiError::new(
                        404,
                        codes::SUBNET_NOT_FOUND,
                        format!("The subnet ID '{sid}' does not exist"),
                    )
                })?;
                if let Some(z) = zone {
                    if *z != s.zone {
                        return Err(ApiError::invalid(format!(
                            "The subnet '{sid}' is in zone '{}', not '{z}'",
                            s.zone
                        )));
                    }
                }
                s
            }
            (None, Some(z)) => self.subnets.iter().find(|s| s.zone == *z).ok_or_else(|| {
                ApiError::invalid(format!(
                    "The zone '{z}' does not exist in region {REGION}; valid zones: {}",
                    ZONES.join(", ")
                ))
            })?,
            (None, None) => self
                .subnets
                .iter()
                .min_by_key(|s| {
                    self.instances
                        .values()
                        .filter(|i| i.subnet_id == s.id && i.state != InstanceState::Terminated)
                        .count()
                })
                .ok_or_else(|| ApiError::internal("the VPC has no subnet"))?,
        };
        let name = req.name.unwrap_or_default();
        if name.len() > 255 {
            return Err(ApiError::invalid(
                "The Name tag must be at most 255 characters".to_owned(),
            ));
        }
        if req.user_data.as_ref().is_some_and(|u| u.len() > 16 * 1024) {
            return Err(ApiError::invalid(
                "User data is limited to 16384 bytes".to_owned(),
            ));
        }
        validate_tags(&req.tags)?;
        let live = self
            .instances
            .values()
            .filter(|i| i.state != InstanceState::Terminated)
            .count();
        if live >= self.quotas.max_instances as usize {
            return Err(ApiError::new(
                400,
                codes::INSTANCE_LIMIT_EXCEEDED,
                format!(
                    "You have requested more instances (1) than your current instance limit of {} allows",
                    self.quotas.max_instances.saturating_sub(live as u32)
                ),
            ));
        }
        let ip = match &req.private_ip_address {
            Some(asked) => self.take_private_ip(subnet, asked)?,
            None => self.allocate_private_ip(subnet)?,
        };
        let mut id = new_id("i");
        while self.instances.contains_key(&id) {
            id = new_id("i");
        }
        let mut tags = req.tags;
        if !name.is_empty() {
            tags.insert("Name".to_owned(), name.clone());
        }
        let inst = Instance {
            id: id.clone(),
            name,
            instance_type: itype.name,
            cpu: itype.cpu,
            memory_mib: itype.memory_mib,
            state: InstanceState::Pending,
            state_reason: None,
            region: REGION.to_owned(),
            zone: subnet.zone.clone(),
            vpc_id: self.vpc_id.clone(),
            subnet_id: subnet.id.clone(),
            private_ip: ip.to_string(),
            private_dns_name: private_dns_name(ip),
            launch_time: now_rfc3339(),
            terminated_time: None,
            tags,
            user_data: req.user_data.unwrap_or_default(),
        };
        self.instances.insert(id, inst.clone());
        Ok(inst)
    }

    /// Starts a stop: `running` → `stopping`. Idempotent on `stopping`/`stopped`.
    /// Returns the instance and whether a halt must now run.
    pub fn begin_stop(&mut self, id: &str) -> Result<(Instance, bool), ApiError> {
        let i = self
            .instances
            .get_mut(id)
            .ok_or_else(|| ApiError::instance_not_found(id))?;
        match i.state {
            InstanceState::Running => {
                i.state = InstanceState::Stopping;
                i.state_reason = Some(StateReason {
                    code: "Client.UserInitiatedShutdown".to_owned(),
                    message: "Client.UserInitiatedShutdown: User initiated shutdown".to_owned(),
                });
                Ok((i.clone(), true))
            }
            InstanceState::Stopping | InstanceState::Stopped => Ok((i.clone(), false)),
            s => Err(incorrect_state(id, s, "stopped")),
        }
    }

    /// Starts a start: `stopped` → `pending`. Idempotent on `pending`/`running`.
    /// Returns the instance and whether a boot must now run.
    pub fn begin_start(&mut self, id: &str) -> Result<(Instance, bool), ApiError> {
        let i = self
            .instances
            .get_mut(id)
            .ok_or_else(|| ApiError::instance_not_found(id))?;
        match i.state {
            InstanceState::Stopped => {
                i.state = InstanceState::Pending;
                i.state_reason = None;
                i.launch_time = now_rfc3339();
                Ok((i.clone(), true))
            }
            InstanceState::Pending | InstanceState::Running => Ok((i.clone(), false)),
            s => Err(incorrect_state(id, s, "started")),
        }
    }

    /// Starts a termination: any live state → `shutting-down`. Idempotent once terminating.
    /// Returns the instance and, when a termination started, whether the hypervisor must
    /// halt it (not when it was already stopped).
    pub fn begin_terminate(&mut self, id: &str) -> Result<(Instance, Option<bool>), ApiError> {
        let i = self
            .instances
            .get_mut(id)
            .ok_or_else(|| ApiError::instance_not_found(id))?;
        match i.state {
            InstanceState::ShuttingDown | InstanceState::Terminated => Ok((i.clone(), None)),
            prev => {
                i.state = InstanceState::ShuttingDown;
                i.state_reason = Some(StateReason {
                    code: "Client.UserInitiatedShutdown".to_owned(),
                    message: "Client.UserInitiatedShutdown: User initiated shutdown".to_owned(),
                });
                Ok((i.clone(), Some(prev != InstanceState::Stopped)))
            }
        }
    }

    /// Ends a transition: if the instance is still in `from`, it moves to `to` (releasing
    /// its private IP when `to` is terminated). `None` if something else happened meanwhile.
    pub fn finish_transition(
        &mut self,
        id: &str,
        from: InstanceState,
        to: InstanceState,
        reason: Option<StateReason>,
    ) -> Option<Instance> {
        let i = self.instances.get_mut(id)?;
        if i.state != from {
            return None;
        }
        i.state = to;
        if reason.is_some() || to == InstanceState::Running {
            i.state_reason = reason;
        }
        if to == InstanceState::Terminated {
            i.private_ip.clear();
            i.private_dns_name.clear();
            i.terminated_time = Some(now_rfc3339());
        }
        let i = i.clone();
        if to == InstanceState::Terminated {
            // A terminated instance's disks are detached, as a cloud does.
            let attached: Vec<String> = self
                .volumes
                .values()
                .filter(|v| v.attachment.as_ref().is_some_and(|a| a.instance_id == id))
                .map(|v| v.id.clone())
                .collect();
            for v in attached {
                if let Some(v) = self.volumes.get_mut(&v) {
                    v.attachment = None;
                    v.state = VolumeState::Available;
                }
            }
        }
        Some(i)
    }

    // ---- load balancers ----

    fn lb_view(&self, r: &LbRecord) -> LoadBalancer {
        let targets = r
            .targets
            .iter()
            .map(|id| {
                let probed = self.probed.read();
                let (health, reason) = match self.instances.get(id).map(|i| i.state) {
                    Some(InstanceState::Running) if probed.active => {
                        match probed
                            .targets
                            .get(&(r.id.clone(), id.clone()))
                            .and_then(|c| c.healthy)
                        {
                            Some(true) => (TargetHealthState::Healthy, None),
                            Some(false) => (
                                TargetHealthState::Unhealthy,
                                Some("Target.FailedHealthChecks"),
                            ),
                            None => (
                                TargetHealthState::Initial,
                                Some("Elb.InitialHealthChecking"),
                            ),
                        }
                    }
                    Some(InstanceState::Running) => (TargetHealthState::Healthy, None),
                    Some(
                        InstanceState::Pending
                        | InstanceState::Stopping
                        | InstanceState::ShuttingDown,
                    ) => (TargetHealthState::Unhealthy, Some("Target.InvalidState")),
                    Some(InstanceState::Stopped | InstanceState::Terminated) => {
                        (TargetHealthState::Unused, Some("Target.InvalidState"))
                    }
                    None => (TargetHealthState::Unused, Some("Target.NotRegistered")),
                };
                Target {
                    instance_id: id.clone(),
                    health,
                    reason: reason.map(str::to_owned),
                }
            })
            .collect();
        LoadBalancer {
            id: r.id.clone(),
            name: r.name.clone(),
            dns_name: r.dns_name.clone(),
            vip: r.vip.clone(),
            scheme: "internet-facing".to_owned(),
            state: "active".to_owned(),
            vpc_id: self.vpc_id.clone(),
            listeners: r.listeners.clone(),
            targets,
            health_check: r.health_check.clone(),
            tags: r.tags.clone(),
            created_time: r.created_time.clone(),
        }
    }

    /// The load balancers, by id; only those named `name` when given.
    pub fn load_balancers(&self, name: Option<&str>) -> Vec<LoadBalancer> {
        self.load_balancers
            .values()
            .filter(|r| name.is_none_or(|n| r.name == n))
            .map(|r| self.lb_view(r))
            .collect()
    }

    /// One load balancer by id.
    pub fn load_balancer(&self, id: &str) -> Result<LoadBalancer, ApiError> {
        self.load_balancers
            .get(id)
            .map(|r| self.lb_view(r))
            .ok_or_else(|| ApiError::load_balancer_not_found(id))
    }

    fn check_targets(&self, targets: &[String]) -> Result<Vec<String>, ApiError> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for t in targets {
            match self.instances.get(t) {
                None => {
                    return Err(ApiError::new(
                        400,
                        codes::INVALID_TARGET,
                        format!("The target '{t}' is not a valid instance: the instance ID '{t}' does not exist"),
                    ))
                }
                Some(i) if i.state == InstanceState::Terminated => {
                    return Err(ApiError::new(
                        400,
                        codes::INVALID_TARGET,
                        format!("The target '{t}' is not a valid instance: it is terminated"),
                    ))
                }
                Some(_) => {}
            }
            if seen.insert(t.clone()) {
                out.push(t.clone());
            }
        }
        Ok(out)
    }

    /// Creates a load balancer with a VIP from the public pool.
    pub fn create_load_balancer(
        &mut self,
        req: CreateLoadBalancerRequest,
    ) -> Result<LoadBalancer, ApiError> {
        validate_lb_name(&req.name)?;
        validate_listeners(&req.listeners)?;
        validate_tags(&req.tags)?;
        let health_check = match req.health_check {
            Some(h) => validate_health_check(h)?,
            None => HealthCheck::default(),
        };
        if self.load_balancers.values().any(|l| l.name == req.name) {
            return Err(ApiError::new(
                409,
                codes::DUPLICATE_LOAD_BALANCER_NAME,
                format!(
                    "A load balancer with the name '{}' already exists",
                    req.name
                ),
            ));
        }
        let targets = self.check_targets(&req.targets)?;
        if self.load_balancers.len() >= self.quotas.max_load_balancers as usize {
            return Err(ApiError::new(
                400,
                codes::LOAD_BALANCER_LIMIT_EXCEEDED,
                format!(
                    "Exceeded quota of account: the limit of {} load balancers is reached",
                    self.quotas.max_load_balancers
                ),
            ));
        }
        let vip = self.allocate_vip()?;
        let mut id = new_id("lb");
        while self.load_balancers.contains_key(&id) {
            id = new_id("lb");
        }
        let dns_name = format!(
            "{}-{}.elb.{REGION}.kumo.internal",
            req.name.to_ascii_lowercase(),
            &id[3..]
        );
        let r = LbRecord {
            id: id.clone(),
            name: req.name,
            dns_name,
            vip: vip.to_string(),
            listeners: req.listeners,
            targets,
            health_check,
            tags: req.tags,
            created_time: now_rfc3339(),
        };
        let view = self.lb_view(&r);
        self.load_balancers.insert(id, r);
        Ok(view)
    }

    /// Replaces the listeners, targets, health check or tags given.
    pub fn update_load_balancer(
        &mut self,
        id: &str,
        req: UpdateLoadBalancerRequest,
    ) -> Result<LoadBalancer, ApiError> {
        if !self.load_balancers.contains_key(id) {
            return Err(ApiError::load_balancer_not_found(id));
        }
        if let Some(l) = &req.listeners {
            validate_listeners(l)?;
        }
        if let Some(t) = &req.tags {
            validate_tags(t)?;
        }
        let targets = req
            .targets
            .as_deref()
            .map(|t| self.check_targets(t))
            .transpose()?;
        let health_check = req.health_check.map(validate_health_check).transpose()?;
        let r = self
            .load_balancers
            .get_mut(id)
            .ok_or_else(|| ApiError::load_balancer_not_found(id))?;
        if let Some(l) = req.listeners {
            r.listeners = l;
        }
        if let Some(t) = targets {
            r.targets = t;
        }
        if let Some(h) = health_check {
            r.health_check = h;
        }
        if let Some(t) = req.tags {
            r.tags = t;
        }
        let r = r.clone();
        Ok(self.lb_view(&r))
    }

    /// Deletes a load balancer, releasing its VIP.
    pub fn delete_load_balancer(&mut self, id: &str) -> Result<LoadBalancer, ApiError> {
        let r = self
            .load_balancers
            .remove(id)
            .ok_or_else(|| ApiError::load_balancer_not_found(id))?;
        Ok(self.lb_view(&r))
    }

    // ---- volumes ----

    /// The volumes, by id; only those in `zone`, attached to `instance` or named `name`
    /// when given.
    pub fn volumes(&self, filter: &VolumeFilter) -> Vec<Volume> {
        self.volumes
            .values()
            .filter(|v| filter.matches(v))
            .cloned()
            .collect()
    }

    /// One volume by id.
    pub fn volume(&self, id: &str) -> Result<Volume, ApiError> {
        self.volumes
            .get(id)
            .cloned()
            .ok_or_else(|| ApiError::volume_not_found(id))
    }

    /// Creates a volume, or answers the one of the same name (the same zone and size).
    /// The bool says whether it is new.
    pub fn create_volume(&mut self, req: CreateVolumeRequest) -> Result<(Volume, bool), ApiError> {
        if !ZONES.contains(&req.zone.as_str()) {
            return Err(ApiError::invalid(format!(
                "Invalid availability zone: [{}]",
                req.zone
            )));
        }
        if !(1..=MAX_VOLUME_GIB).contains(&req.size_gib) {
            return Err(ApiError::invalid(format!(
                "Volume of {} GiB is outside the range 1-{MAX_VOLUME_GIB} GiB",
                req.size_gib
            )));
        }
        validate_tags(&req.tags)?;
        if !req.name.is_empty() {
            validate_volume_name(&req.name)?;
            if let Some(v) = self.volumes.values().find(|v| v.name == req.name) {
                if v.zone != req.zone || v.size_gib != req.size_gib {
                    return Err(ApiError::new(
                        409,
                        codes::IDEMPOTENT_PARAMETER_MISMATCH,
                        format!(
                            "The volume '{}' named '{}' exists with zone {} and size {} GiB",
                            v.id, v.name, v.zone, v.size_gib
                        ),
                    ));
                }
                return Ok((v.clone(), false));
            }
        }
        if self.volumes.len() >= self.quotas.max_volumes as usize {
            return Err(ApiError::new(
                400,
                codes::VOLUME_LIMIT_EXCEEDED,
                format!(
                    "Exceeded quota of account: the limit of {} volumes is reached",
                    self.quotas.max_volumes
                ),
            ));
        }
        self.check_volume_gib(req.size_gib)?;
        let mut id = new_id("vol");
        while self.volumes.contains_key(&id) {
            id = new_id("vol");
        }
        let v = Volume {
            id: id.clone(),
            name: req.name,
            zone: req.zone,
            size_gib: req.size_gib,
            state: VolumeState::Available,
            attachment: None,
            tags: req.tags,
            created_time: now_rfc3339(),
        };
        self.volumes.insert(id, v.clone());
        Ok((v, true))
    }

    fn check_volume_gib(&self, more: u64) -> Result<(), ApiError> {
        let used: u64 = self.volumes.values().map(|v| v.size_gib).sum();
        if used.saturating_add(more) > self.quotas.max_volume_gib {
            return Err(ApiError::new(
                400,
                codes::VOLUME_LIMIT_EXCEEDED,
                format!(
                    "Exceeded quota of account: {more} GiB more would exceed the limit of {} GiB of volumes ({used} GiB used)",
                    self.quotas.max_volume_gib
                ),
            ));
        }
        Ok(())
    }

    /// Attaches a volume to an instance of its zone as the instance's next free device.
    /// Attaching it again to the instance it is attached to answers it unchanged.
    pub fn attach_volume(
        &mut self,
        id: &str,
        req: AttachVolumeRequest,
    ) -> Result<Volume, ApiError> {
        let v = self.volume(id)?;
        let inst = self.instance(&req.instance_id)?.clone();
        if let Some(a) = &v.attachment {
            if a.instance_id == req.instance_id {
                return Ok(v);
            }
            return Err(ApiError::new(
                409,
                codes::VOLUME_IN_USE,
                format!(
                    "{id} is already attached to an instance ({})",
                    a.instance_id
                ),
            ));
        }
        if matches!(
            inst.state,
            InstanceState::Terminated | InstanceState::ShuttingDown
        ) {
            return Err(ApiError::new(
                409,
                codes::INCORRECT_INSTANCE_STATE,
                format!(
                    "The instance '{}' is not in a valid state for this operation ({})",
                    inst.id, inst.state
                ),
            ));
        }
        if inst.zone != v.zone {
            return Err(ApiError::new(
                400,
                codes::VOLUME_ZONE_MISMATCH,
                format!(
                    "The volume '{id}' is not in the same availability zone as instance '{}'",
                    inst.id
                ),
            ));
        }
        let taken: BTreeSet<&str> = self
            .volumes
            .values()
            .filter_map(|o| o.attachment.as_ref())
            .filter(|a| a.instance_id == inst.id)
            .map(|a| a.device.as_str())
            .collect();
        let device = VOLUME_DEVICES
            .map(|c| format!("/dev/vd{c}"))
            .find(|d| !taken.contains(d.as_str()))
            .ok_or_else(|| {
                ApiError::new(
                    400,
                    codes::ATTACHMENT_LIMIT_EXCEEDED,
                    format!(
                        "The instance '{}' has no free device for another volume",
                        inst.id
                    ),
                )
            })?;
        let v = self
            .volumes
            .get_mut(id)
            .ok_or_else(|| ApiError::volume_not_found(id))?;
        v.state = VolumeState::InUse;
        v.attachment = Some(VolumeAttachment {
            instance_id: inst.id,
            device,
            attach_time: now_rfc3339(),
        });
        Ok(v.clone())
    }

    /// Detaches a volume.
    pub fn detach_volume(
        &mut self,
        id: &str,
        req: DetachVolumeRequest,
    ) -> Result<Volume, ApiError> {
        let v = self.volume(id)?;
        let Some(a) = &v.attachment else {
            return Err(ApiError::new(
                409,
                codes::INCORRECT_STATE,
                format!("Volume '{id}' is in the 'available' state."),
            ));
        };
        if let Some(want) = &req.instance_id {
            if *want != a.instance_id {
                return Err(ApiError::new(
                    409,
                    codes::INCORRECT_STATE,
                    format!(
                        "Volume '{id}' is attached to '{}', not to '{want}'",
                        a.instance_id
                    ),
                ));
            }
        }
        let v = self
            .volumes
            .get_mut(id)
            .ok_or_else(|| ApiError::volume_not_found(id))?;
        v.state = VolumeState::Available;
        v.attachment = None;
        Ok(v.clone())
    }

    /// Grows a volume.
    pub fn modify_volume(
        &mut self,
        id: &str,
        req: ModifyVolumeRequest,
    ) -> Result<Volume, ApiError> {
        let v = self.volume(id)?;
        if req.size_gib < v.size_gib {
            return Err(ApiError::invalid(format!(
                "New size {} GiB of volume '{id}' is smaller than its size {} GiB: volumes only grow",
                req.size_gib, v.size_gib
            )));
        }
        if req.size_gib > MAX_VOLUME_GIB {
            return Err(ApiError::invalid(format!(
                "Volume of {} GiB is outside the range 1-{MAX_VOLUME_GIB} GiB",
                req.size_gib
            )));
        }
        self.check_volume_gib(req.size_gib - v.size_gib)?;
        let v = self
            .volumes
            .get_mut(id)
            .ok_or_else(|| ApiError::volume_not_found(id))?;
        v.size_gib = req.size_gib;
        Ok(v.clone())
    }

    /// Deletes a volume that is not attached.
    pub fn delete_volume(&mut self, id: &str) -> Result<Volume, ApiError> {
        let v = self.volume(id)?;
        if let Some(a) = &v.attachment {
            return Err(ApiError::new(
                409,
                codes::VOLUME_IN_USE,
                format!("Volume {id} is currently attached to {}", a.instance_id),
            ));
        }
        self.volumes.remove(id);
        Ok(v)
    }

    // ---- routes ----

    fn check_table(&self, id: &str) -> Result<(), ApiError> {
        if id == self.route_table_id {
            Ok(())
        } else {
            Err(ApiError::new(
                404,
                codes::ROUTE_TABLE_NOT_FOUND,
                format!("The routeTable ID '{id}' does not exist"),
            ))
        }
    }

    fn route_view(&self, r: &RouteRecord) -> Route {
        let alive = self
            .instances
            .get(&r.instance_id)
            .is_some_and(|i| i.state != InstanceState::Terminated);
        Route {
            destination_cidr: r.destination_cidr.clone(),
            instance_id: r.instance_id.clone(),
            name: r.name.clone(),
            description: r.description.clone(),
            state: if alive {
                RouteState::Active
            } else {
                RouteState::Blackhole
            },
            origin: "CreateRoute".to_owned(),
        }
    }

    /// The routes the VPC's network carries: each active route to its instance's private
    /// address (a stopped instance keeps its address, so its routes stay).
    pub fn next_hops(&self) -> Vec<crate::network::NextHop> {
        let mut hops: Vec<crate::network::NextHop> = self
            .routes
            .iter()
            .filter_map(|r| {
                let i = self.instances.get(&r.instance_id)?;
                if i.state == InstanceState::Terminated {
                    return None;
                }
                Some(crate::network::NextHop {
                    destination: r.destination_cidr.clone(),
                    via: i.private_ip.parse().ok()?,
                })
            })
            .collect();
        hops.sort();
        hops
    }

    /// The route tables (one: the default VPC's main table).
    pub fn route_tables(&self) -> Vec<RouteTable> {
        let mut routes = vec![Route {
            destination_cidr: VPC_CIDR.to_owned(),
            instance_id: String::new(),
            name: "local".to_owned(),
            description: "the VPC's own range".to_owned(),
            state: RouteState::Active,
            origin: "CreateRouteTable".to_owned(),
        }];
        routes.extend(self.routes.iter().map(|r| self.route_view(r)));
        vec![RouteTable {
            id: self.route_table_id.clone(),
            vpc_id: self.vpc_id.clone(),
            main: true,
            routes,
        }]
    }

    /// One route table.
    pub fn route_table(&self, id: &str) -> Result<RouteTable, ApiError> {
        self.check_table(id)?;
        self.route_tables()
            .into_iter()
            .next()
            .ok_or_else(|| ApiError::internal("no route table"))
    }

    /// Adds a route to an instance.
    pub fn create_route(
        &mut self,
        table: &str,
        req: CreateRouteRequest,
    ) -> Result<Route, ApiError> {
        self.check_table(table)?;
        let dest = Cidr::parse(&req.destination_cidr).map_err(|e| {
            ApiError::invalid(format!(
                "Value ({}) for parameter destinationCidr is invalid: {e}",
                req.destination_cidr
            ))
        })?;
        let vpc = Cidr::parse(VPC_CIDR).map_err(ApiError::internal)?;
        if dest.overlaps(vpc) {
            return Err(ApiError::new(
                400,
                codes::ROUTE_OVERLAP,
                format!(
                    "The destination CIDR block {dest} overlaps the VPC's local route {VPC_CIDR}"
                ),
            ));
        }
        for r in &self.routes {
            let Ok(other) = Cidr::parse(&r.destination_cidr) else {
                continue;
            };
            if other == dest {
                return Err(ApiError::new(
                    409,
                    codes::ROUTE_ALREADY_EXISTS,
                    format!("The route identified by {dest} already exists in route table {table}"),
                ));
            }
            if other.overlaps(dest) {
                return Err(ApiError::new(
                    400,
                    codes::ROUTE_OVERLAP,
                    format!(
                        "The destination CIDR block {dest} overlaps the route {other} (to {})",
                        r.instance_id
                    ),
                ));
            }
        }
        match self.instances.get(&req.instance_id) {
            None => return Err(ApiError::instance_not_found(&req.instance_id)),
            Some(i) if i.state == InstanceState::Terminated => {
                return Err(incorrect_state(&req.instance_id, i.state, "a route target"))
            }
            Some(_) => {}
        }
        if req.name.len() > 255 || req.description.len() > 255 {
            return Err(ApiError::invalid(
                "name and description are limited to 255 characters".to_owned(),
            ));
        }
        if self.routes.len() >= self.quotas.max_routes_per_table as usize {
            return Err(ApiError::new(
                400,
                codes::ROUTE_LIMIT_EXCEEDED,
                format!(
                    "The maximum number of routes ({}) in route table {table} has been reached",
                    self.quotas.max_routes_per_table
                ),
            ));
        }
        let r = RouteRecord {
            destination_cidr: dest.to_string(),
            instance_id: req.instance_id,
            name: req.name,
            description: req.description,
        };
        let view = self.route_view(&r);
        self.routes.push(r);
        Ok(view)
    }

    /// Deletes the route to `destination`.
    pub fn delete_route(&mut self, table: &str, destination: &str) -> Result<Route, ApiError> {
        self.check_table(table)?;
        let dest = Cidr::parse(destination).map_err(|e| {
            ApiError::invalid(format!(
                "Value ({destination}) for parameter destinationCidr is invalid: {e}"
            ))
        })?;
        let i = self
            .routes
            .iter()
            .position(|r| Cidr::parse(&r.destination_cidr).is_ok_and(|c| c == dest))
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    codes::ROUTE_NOT_FOUND,
                    format!("There is no route defined for '{dest}' in the route table '{table}'"),
                )
            })?;
        let r = self.routes.remove(i);
        Ok(self.route_view(&r))
    }
}

impl Default for State {
    fn default() -> Self {
        State::new()
    }
}

fn new_key(name: &str) -> KeyRecord {
    const UPPER: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    const SECRET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut rng = rand::rng();
    let id: String = (0..16)
        .map(|_| char::from(UPPER[rng.random_range(0..UPPER.len())]))
        .collect();
    let secret: String = (0..40)
        .map(|_| char::from(SECRET[rng.random_range(0..SECRET.len())]))
        .collect();
    KeyRecord {
        id: format!("KKIA{id}"),
        secret,
        name: name.to_owned(),
    }
}

/// `ip-10-0-1-23.kumo-1.compute.internal`.
pub fn private_dns_name(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!(
        "ip-{}-{}-{}-{}.{REGION}.compute.internal",
        o[0], o[1], o[2], o[3]
    )
}

fn incorrect_state(id: &str, s: InstanceState, what: &str) -> ApiError {
    ApiError::new(
        409,
        codes::INCORRECT_INSTANCE_STATE,
        format!("The instance '{id}' is not in a state from which it can be {what} (it is {s})"),
    )
}

fn validate_action(a: &str) -> Result<(), ApiError> {
    let body = a.strip_suffix('*').unwrap_or(a);
    if a.is_empty() || a.len() > 64 || !body.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(ApiError::invalid(format!(
            "'{a}' is not an action: expected a name such as CreateLoadBalancer, '*', or a prefix ending in '*'"
        )));
    }
    Ok(())
}

fn validate_volume_name(name: &str) -> Result<(), ApiError> {
    let ok = name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "Invalid volume name '{name}': at most 128 letters, digits, '-', '_' and '.'"
        )))
    }
}

fn validate_tags(tags: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if tags.len() > 50 {
        return Err(ApiError::invalid("At most 50 tags are allowed".to_owned()));
    }
    for (k, v) in tags {
        if k.is_empty() || k.len() > 128 || v.len() > 256 {
            return Err(ApiError::invalid(format!(
                "Tag '{k}': keys are 1 to 128 characters, values at most 256"
            )));
        }
    }
    Ok(())
}

fn validate_lb_name(n: &str) -> Result<(), ApiError> {
    let ok = !n.is_empty()
        && n.len() <= 32
        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !n.starts_with('-')
        && !n.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "The load balancer name '{n}' is invalid: it must have 1 to 32 letters, digits and hyphens, and must not begin or end with a hyphen"
        )))
    }
}

fn validate_listeners(ls: &[Listener]) -> Result<(), ApiError> {
    if ls.is_empty() {
        return Err(ApiError::invalid(
            "A load balancer needs at least one listener".to_owned(),
        ));
    }
    if ls.len() > 100 {
        return Err(ApiError::invalid(
            "A load balancer has at most 100 listeners".to_owned(),
        ));
    }
    let mut seen = BTreeSet::new();
    for l in ls {
        if l.port == 0 || l.target_port == 0 {
            return Err(ApiError::invalid(format!(
                "Listener {}/{}: port and targetPort must be between 1 and 65535",
                l.port,
                l.protocol.as_str()
            )));
        }
        if !seen.insert((l.port, l.protocol)) {
            return Err(ApiError::invalid(format!(
                "Duplicate listener {}/{}",
                l.port,
                l.protocol.as_str()
            )));
        }
    }
    Ok(())
}

fn validate_health_check(h: HealthCheck) -> Result<HealthCheck, ApiError> {
    match h.protocol.as_str() {
        "TCP" if h.path.is_some() => {
            return Err(ApiError::invalid(
                "A TCP health check has no path".to_owned(),
            ))
        }
        "TCP" => {}
        "HTTP" if !h.path.as_deref().is_some_and(|p| p.starts_with('/')) => {
            return Err(ApiError::invalid(
                "An HTTP health check needs a path starting with '/'".to_owned(),
            ))
        }
        "HTTP" => {}
        p => {
            return Err(ApiError::invalid(format!(
                "Health check protocol '{p}' is not supported: TCP or HTTP"
            )))
        }
    }
    if !(1..=300).contains(&h.interval_seconds)
        || !(1..=120).contains(&h.timeout_seconds)
        || !(1..=10).contains(&h.healthy_threshold)
        || !(1..=10).contains(&h.unhealthy_threshold)
    {
        return Err(ApiError::invalid(
            "Health check: intervalSeconds 1-300, timeoutSeconds 1-120, thresholds 1-10".to_owned(),
        ));
    }
    Ok(h)
}

/// A map of records that remembers which keys changed since the journal last took them,
/// with each one's value from before (so a change that cannot be saved can be undone).
/// Reads go through `Deref`; every mutation goes through the methods below, so the
/// compiler enforces that nothing changes unseen.
#[derive(Clone, Debug)]
struct Tracked<V> {
    map: BTreeMap<String, V>,
    /// Key → its value when first touched since the last take (`None`: it did not exist).
    before: BTreeMap<String, Option<V>>,
}

/// Changed keys' earlier values (`None`: absent), newest batch applied last when undoing.
type Before<V> = BTreeMap<String, Option<V>>;

impl<V> Default for Tracked<V> {
    fn default() -> Self {
        Tracked {
            map: BTreeMap::new(),
            before: BTreeMap::new(),
        }
    }
}

impl<V> std::ops::Deref for Tracked<V> {
    type Target = BTreeMap<String, V>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<V: Clone> Tracked<V> {
    fn touch(&mut self, k: &str) {
        if !self.before.contains_key(k) {
            let v = self.map.get(k).cloned();
            self.before.insert(k.to_owned(), v);
        }
    }

    fn get_mut(&mut self, k: &str) -> Option<&mut V> {
        if self.map.contains_key(k) {
            self.touch(k);
        }
        self.map.get_mut(k)
    }

    fn insert(&mut self, k: String, v: V) -> Option<V> {
        self.touch(&k);
        self.map.insert(k, v)
    }

    fn remove(&mut self, k: &str) -> Option<V> {
        if self.map.contains_key(k) {
            self.touch(k);
        }
        self.map.remove(k)
    }

    fn retain(&mut self, keep: impl Fn(&String, &V) -> bool) {
        let gone: Vec<String> = self
            .map
            .iter()
            .filter(|(k, v)| !keep(k, v))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// The keys changed since the last take, with their earlier values.
    fn take(&mut self) -> Before<V> {
        std::mem::take(&mut self.before)
    }

    /// Sets (`Some`) or removes (`None`) each key without tracking: undo and replay.
    fn set_all(&mut self, values: Before<V>) {
        for (k, v) in values {
            match v {
                Some(v) => {
                    self.map.insert(k, v);
                }
                None => {
                    self.map.remove(&k);
                }
            }
        }
    }
}

impl<V: Serialize> Serialize for Tracked<V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.map.serialize(s)
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Tracked<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Tracked {
            map: BTreeMap::deserialize(d)?,
            before: BTreeMap::new(),
        })
    }
}

/// Everything but instances and load balancers, as journaled: small (routes, policies,
/// faults, quotas, keys), so it is compared and written whole.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RestRef<'a> {
    version: u32,
    vpc_id: &'a str,
    subnets: &'a [SubnetRecord],
    route_table_id: &'a str,
    routes: &'a [RouteRecord],
    faults: &'a BTreeMap<String, Fault>,
    policies: &'a [PolicyStatement],
    quotas: &'a Quotas,
    access_keys: &'a [KeyRecord],
}

/// [`RestRef`] read back.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rest {
    version: u32,
    vpc_id: String,
    subnets: Vec<SubnetRecord>,
    route_table_id: String,
    routes: Vec<RouteRecord>,
    faults: BTreeMap<String, Fault>,
    policies: Vec<PolicyStatement>,
    quotas: Quotas,
    access_keys: Vec<KeyRecord>,
}

/// A journal record as written: the whole new value of each changed record (`null`:
/// deleted), and the rest when it changed.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RecordOut<'a> {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    instances: BTreeMap<&'a str, Option<&'a Instance>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    load_balancers: BTreeMap<&'a str, Option<&'a LbRecord>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    volumes: BTreeMap<&'a str, Option<&'a Volume>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rest: Option<RestRef<'a>>,
}

/// [`RecordOut`] read back.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RecordIn {
    #[serde(default)]
    instances: Before<Instance>,
    #[serde(default)]
    load_balancers: Before<LbRecord>,
    #[serde(default)]
    volumes: Before<Volume>,
    #[serde(default)]
    rest: Option<Rest>,
}

/// The journal's first record: which snapshot it continues.
#[derive(Serialize, Deserialize)]
struct JournalHeader {
    journal: String,
    generation: u64,
}

const JOURNAL_KIND: &str = "kumo-cloud";

fn header_record(generation: u64) -> Result<Vec<u8>, String> {
    serde_json::to_vec(&JournalHeader {
        journal: JOURNAL_KIND.to_owned(),
        generation,
    })
    .map(|p| journal::frame(&p))
    .map_err(|e| format!("serializing the journal header: {e}"))
}

/// What a group commit took from the state: the changed records' earlier values.
struct Undo {
    instances: Before<Instance>,
    load_balancers: Before<LbRecord>,
    volumes: Before<Volume>,
}

impl State {
    fn rest(&self) -> RestRef<'_> {
        RestRef {
            version: self.version,
            vpc_id: &self.vpc_id,
            subnets: &self.subnets,
            route_table_id: &self.route_table_id,
            routes: &self.routes,
            faults: &self.faults,
            policies: &self.policies,
            quotas: &self.quotas,
            access_keys: &self.access_keys,
        }
    }

    fn rest_bytes(&self) -> Result<Vec<u8>, String> {
        serde_json::to_vec(&self.rest()).map_err(|e| format!("serializing the cloud state: {e}"))
    }

    fn set_rest(&mut self, r: Rest) {
        self.version = r.version;
        self.vpc_id = r.vpc_id;
        self.subnets = r.subnets;
        self.route_table_id = r.route_table_id;
        self.routes = r.routes;
        self.faults = r.faults;
        self.policies = r.policies;
        self.quotas = r.quotas;
        self.access_keys = r.access_keys;
    }

    fn take_undo(&mut self) -> Undo {
        Undo {
            instances: self.instances.take(),
            load_balancers: self.load_balancers.take(),
            volumes: self.volumes.take(),
        }
    }

    /// The journal record for the keys in `undo` (their current values) and the rest when
    /// `rest_changed`; `None` when there is nothing to write.
    fn record(&self, undo: &Undo, rest_changed: bool) -> Result<Option<Vec<u8>>, String> {
        if undo.instances.is_empty()
            && undo.load_balancers.is_empty()
            && undo.volumes.is_empty()
            && !rest_changed
        {
            return Ok(None);
        }
        let r = RecordOut {
            instances: undo
                .instances
                .keys()
                .map(|k| (k.as_str(), self.instances.get(k)))
                .collect(),
            load_balancers: undo
                .load_balancers
                .keys()
                .map(|k| (k.as_str(), self.load_balancers.get(k)))
                .collect(),
            volumes: undo
                .volumes
                .keys()
                .map(|k| (k.as_str(), self.volumes.get(k)))
                .collect(),
            rest: rest_changed.then(|| self.rest()),
        };
        serde_json::to_vec(&r)
            .map(|p| Some(journal::frame(&p)))
            .map_err(|e| format!("serializing a journal record: {e}"))
    }

    /// Puts back what was durable: undoes the changes made since `batch` was taken, then
    /// `batch`, and restores the rest from its durable bytes.
    fn roll_back(&mut self, batch: Undo, durable_rest: &[u8]) {
        let later = self.take_undo();
        for u in [later, batch] {
            self.instances.set_all(u.instances);
            self.load_balancers.set_all(u.load_balancers);
            self.volumes.set_all(u.volumes);
        }
        match serde_json::from_slice::<Rest>(durable_rest) {
            Ok(r) => self.set_rest(r),
            Err(e) => tracing::error!("cloud: restoring the saved state failed: {e}"),
        }
    }

    fn replay(&mut self, r: RecordIn) {
        self.instances.set_all(r.instances);
        self.load_balancers.set_all(r.load_balancers);
        self.volumes.set_all(r.volumes);
        if let Some(rest) = r.rest {
            self.set_rest(rest);
        }
    }
}

/// When the journal is folded into a new snapshot: once it holds `max_records` changes, or
/// once it is larger than the snapshot and at least `min_bytes` (so that a small cloud does
/// not rewrite its snapshot every other change). Either way the snapshot's cost is paid
/// once per journal's worth of changes, keeping the amortized cost of a change
/// proportional to its own size.
#[derive(Clone, Copy, Debug)]
pub struct CompactionPolicy {
    /// Change records after which the journal is compacted.
    pub max_records: u64,
    /// The journal size below which it is never compacted for its size.
    pub min_bytes: u64,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy {
            max_records: 10_000,
            min_bytes: 256 * 1024,
        }
    }
}

/// Sizes of the files behind a [`Store`], as last written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PersistStats {
    /// The snapshot's generation (one more per compaction).
    pub generation: u64,
    /// Bytes in `state.json`.
    pub snapshot_bytes: u64,
    /// Bytes in the journal (its header record included).
    pub journal_bytes: u64,
    /// Change records in the journal.
    pub journal_records: u64,
}

/// The state behind a lock, made durable in `state.json` plus `state.journal` before any
/// change is answered.
///
/// Writers group-commit: a change is applied in memory, then whoever holds the commit lock
/// appends one journal record for every change applied so far, fdatasyncs it and
/// acknowledges all of them (or, when compaction is due, writes a whole snapshot instead).
/// A change is answered only once it is durable. (Readers may see a change a moment before
/// it is durable; a crash in that moment loses it, and it was never acknowledged.) When a
/// write fails, every change not yet durable is undone in memory from the earlier values
/// kept by the change tracking, and answered with 500; the next append first cuts off
/// whatever the failed one left in the file (a crash before that may keep it: as with any
/// cloud API, a 500 does not promise the change was not made).
pub struct Store {
    snapshot_path: PathBuf,
    journal_path: PathBuf,
    policy: CompactionPolicy,
    state: Mutex<Applied>,
    commit: tokio::sync::Mutex<Commit>,
}

struct Applied {
    state: State,
    /// Changes applied so far.
    seq: u64,
}

struct Commit {
    /// Every change up to this one is durable or was lost.
    done: u64,
    /// Ranges of changes that were undone because writing them failed.
    lost: Vec<(u64, u64)>,
    /// The newest snapshot generation that may be on disk.
    generation: u64,
    /// Whether the journal on disk continues snapshot `generation` at `journal_len`. False
    /// after a snapshot or journal rotation failed: the next commit writes a snapshot.
    journal_ok: bool,
    journal_len: u64,
    journal_records: u64,
    snapshot_len: u64,
    /// The rest (see [`RestRef`]) as last made durable.
    rest: Vec<u8>,
}

impl Commit {
    fn compaction_due(&self, p: &CompactionPolicy) -> bool {
        !self.journal_ok
            || self.journal_records >= p.max_records
            || (self.journal_len > self.snapshot_len && self.journal_len >= p.min_bytes)
    }
}

enum Work {
    Nothing,
    Append(Vec<u8>),
    Snapshot { generation: u64, bytes: Vec<u8> },
}

enum Done {
    Nothing,
    Appended(u64),
    Snapshot {
        generation: u64,
        len: u64,
        /// The new journal's length, `None` when replacing it failed.
        journal: Option<u64>,
    },
}

fn persist(snapshot: &Path, journal_path: &Path, at: u64, work: Work) -> Result<Done, String> {
    match work {
        Work::Nothing => Ok(Done::Nothing),
        Work::Append(rec) => {
            journal::append(journal_path, at, &rec).map_err(|e| e.to_string())?;
            Ok(Done::Appended(rec.len() as u64))
        }
        Work::Snapshot { generation, bytes } => {
            write_atomic(snapshot, &bytes)?;
            // The snapshot holds everything: a failure from here on loses nothing. The old
            // journal names an older generation and is ignored at open until replaced.
            let journal = match header_record(generation).and_then(|h| {
                journal::replace(journal_path, &h)
                    .map_err(|e| e.to_string())
                    .map(|()| h)
            }) {
                Ok(h) => Some(h.len() as u64),
                Err(e) => {
                    tracing::warn!("cloud: starting a new journal failed (the next change writes a snapshot again): {e}");
                    None
                }
            };
            Ok(Done::Snapshot {
                generation,
                len: bytes.len() as u64,
                journal,
            })
        }
    }
}

fn parse_snapshot(path: &Path, b: &[u8]) -> Result<State, String> {
    serde_json::from_slice::<State>(b)
        .map_err(|e| format!("{}: corrupt cloud state: {e}", path.display()))
}

/// Replays the journal onto `state` (the snapshot); its length and change records.
fn recover(path: &Path, state: &mut State) -> Result<(u64, u64), String> {
    let generation = state.generation;
    let fresh = |why: Option<String>| -> Result<(u64, u64), String> {
        if let Some(why) = why {
            tracing::warn!("cloud: {}: {why}; starting a new journal", path.display());
        }
        let h = header_record(generation)?;
        journal::replace(path, &h).map_err(|e| e.to_string())?;
        Ok((h.len() as u64, 0))
    };
    let Some(bytes) = journal::read(path).map_err(|e| e.to_string())? else {
        return fresh(None);
    };
    let scan = journal::scan(path, &bytes).map_err(|e| e.to_string())?;
    let Some(first) = scan.records.first() else {
        // Only a torn header: it is written atomically, so this is damage to an empty one.
        return fresh(Some("no intact header record".to_owned()));
    };
    let corrupt = |what: String| format!("{}: corrupt cloud journal: {what}", path.display());
    let header: JournalHeader = serde_json::from_slice(first)
        .ok()
        .filter(|h: &JournalHeader| h.journal == JOURNAL_KIND)
        .ok_or_else(|| corrupt("the first record is not a kumo cloud journal header".to_owned()))?;
    if header.generation < generation {
        // A compaction wrote the snapshot and stopped before replacing the journal.
        return fresh(Some(format!(
            "it continues snapshot {} but the snapshot is already {generation}",
            header.generation
        )));
    }
    if header.generation > generation {
        return Err(format!(
            "{}: the journal continues snapshot {} but {STATE_FILE} is snapshot {generation} (an older copy?); refusing to start",
            path.display(),
            header.generation
        ));
    }
    for (i, p) in scan.records.iter().enumerate().skip(1) {
        let r: RecordIn = serde_json::from_slice(p)
            .map_err(|e| corrupt(format!("record {i} does not decode: {e}")))?;
        state.replay(r);
    }
    if scan.torn {
        tracing::warn!(
            "cloud: {}: dropping a torn last record ({} bytes; a crash during an append, never acknowledged)",
            path.display(),
            bytes.len() - scan.valid_len
        );
        journal::truncate(path, scan.valid_len as u64).map_err(|e| e.to_string())?;
    }
    Ok((scan.valid_len as u64, scan.records.len() as u64 - 1))
}

impl Store {
    /// Opens the cloud in `dir` (`state.json` and its journal), or creates a fresh one.
    pub fn open(dir: &Path) -> Result<Store, String> {
        Store::open_with(dir, CompactionPolicy::default())
    }

    /// [`Store::open`] with the given compaction policy.
    pub fn open_with(dir: &Path, policy: CompactionPolicy) -> Result<Store, String> {
        let snapshot_path = dir.join(STATE_FILE);
        let journal_path = dir.join(JOURNAL_FILE);
        let (state, snapshot_len, journal_len, journal_records) = if snapshot_path.exists() {
            let b = std::fs::read(&snapshot_path)
                .map_err(|e| format!("{}: {e}", snapshot_path.display()))?;
            let mut state = parse_snapshot(&snapshot_path, &b)?;
            let (len, records) = recover(&journal_path, &mut state)?;
            (state, b.len() as u64, len, records)
        } else {
            if journal_path.exists() {
                return Err(format!(
                    "{}: a journal without its snapshot {STATE_FILE}; remove it to start a fresh cloud",
                    journal_path.display()
                ));
            }
            let s = State::new();
            let b = serialize(&s)?;
            write_atomic(&snapshot_path, &b)?;
            let h = header_record(s.generation)?;
            journal::replace(&journal_path, &h).map_err(|e| e.to_string())?;
            (s, b.len() as u64, h.len() as u64, 0)
        };
        let rest = state.rest_bytes()?;
        Ok(Store {
            snapshot_path,
            journal_path,
            policy,
            commit: tokio::sync::Mutex::new(Commit {
                done: 0,
                lost: Vec::new(),
                generation: state.generation,
                journal_ok: true,
                journal_len,
                journal_records,
                snapshot_len,
                rest,
            }),
            state: Mutex::new(Applied { state, seq: 0 }),
        })
    }

    /// Reads the state.
    pub fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.state.lock().state)
    }

    /// The files' sizes as last written.
    pub async fn stats(&self) -> PersistStats {
        let c = self.commit.lock().await;
        PersistStats {
            generation: c.generation,
            snapshot_bytes: c.snapshot_len,
            journal_bytes: c.journal_len,
            journal_records: c.journal_records,
        }
    }

    /// Changes the state and makes the change durable before returning. `f` must leave
    /// the state untouched when it returns an error.
    pub async fn write<T>(
        &self,
        f: impl FnOnce(&mut State) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let (out, seq) = {
            let mut g = self.state.lock();
            let out = f(&mut g.state)?;
            g.seq += 1;
            (out, g.seq)
        };
        let mut c = self.commit.lock().await;
        if seq > c.done {
            let compact = c.compaction_due(&self.policy);
            let (prepared, undo, upto) = {
                let mut g = self.state.lock();
                let undo = g.state.take_undo();
                let prepared = g.state.rest_bytes().and_then(|rest| {
                    let work = if compact {
                        let generation = c.generation + 1;
                        g.state.generation = generation;
                        Work::Snapshot {
                            generation,
                            bytes: serialize(&g.state)?,
                        }
                    } else {
                        match g.state.record(&undo, rest != c.rest)? {
                            Some(r) => Work::Append(r),
                            None => Work::Nothing,
                        }
                    };
                    Ok((work, rest))
                });
                (prepared, undo, g.seq)
            };
            let written = match prepared {
                Ok((work, rest)) => {
                    let (s, j, at) = (
                        self.snapshot_path.clone(),
                        self.journal_path.clone(),
                        c.journal_len,
                    );
                    tokio::task::spawn_blocking(move || persist(&s, &j, at, work))
                        .await
                        .unwrap_or_else(|e| Err(e.to_string()))
                        .map(|d| (d, rest))
                }
                Err(e) => Err(e),
            };
            match written {
                Ok((d, rest)) => {
                    c.done = upto;
                    c.rest = rest;
                    match d {
                        Done::Nothing => {}
                        Done::Appended(n) => {
                            c.journal_len += n;
                            c.journal_records += 1;
                        }
                        Done::Snapshot {
                            generation,
                            len,
                            journal,
                        } => {
                            c.generation = generation;
                            c.snapshot_len = len;
                            c.journal_ok = journal.is_some();
                            c.journal_len = journal.unwrap_or(0);
                            c.journal_records = 0;
                        }
                    }
                }
                Err(e) => {
                    tracing::error!("cloud: saving the state failed: {e}");
                    if compact {
                        // The attempted snapshot may be on disk: the next one must be newer,
                        // and nothing may be appended to a journal it would make stale.
                        c.generation += 1;
                        c.journal_ok = false;
                    }
                    let mut g = self.state.lock();
                    g.state.roll_back(undo, &c.rest);
                    let from = c.done + 1;
                    c.lost.push((from, g.seq));
                    c.done = g.seq;
                }
            }
        }
        if c.lost.iter().any(|(a, b)| (*a..=*b).contains(&seq)) {
            return Err(ApiError::internal(
                "the cloud could not save its state; the change was not made",
            ));
        }
        Ok(out)
    }
}

fn serialize(s: &State) -> Result<Vec<u8>, String> {
    serde_json::to_vec(s).map_err(|e| format!("serializing the cloud state: {e}"))
}

/// Writes `data` to `path` atomically and durably, mode 0600 (it holds secrets).
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), String> {
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(err)?;
        f.write_all(data).map_err(err)?;
        f.sync_data().map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(err)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        let a = Cidr::parse("10.244.0.0/16").expect("valid");
        let b = Cidr::parse("10.244.1.0/24").expect("valid");
        let c = Cidr::parse("10.245.0.0/24").expect("valid");
        assert!(a.overlaps(b) && b.overlaps(a));
        assert!(!a.overlaps(c));
        assert!(Cidr::parse("10.244.1.1/24")
            .expect_err("host bits")
            .contains("did you mean 10.244.1.0/24"));
        assert!(Cidr::parse("10.244.1.0/33").is_err());
        assert!(Cidr::parse("10.244.1.0").is_err());
        assert!(Cidr::parse("0.0.0.0/0").expect("valid").overlaps(c));
    }

    #[test]
    fn an_address_asked_for_is_taken_once_and_routes_follow_their_instances() {
        let mut s = State::new();
        let launch = |s: &mut State, ip: Option<&str>| {
            s.run_instance(RunInstanceRequest {
                zone: Some("kumo-1a".into()),
                private_ip_address: ip.map(str::to_owned),
                ..Default::default()
            })
        };
        let cp = launch(&mut s, Some("10.0.1.9")).expect("a free address");
        assert_eq!(cp.private_ip, "10.0.1.9");
        let taken = launch(&mut s, Some("10.0.1.9")).expect_err("in use");
        assert_eq!(taken.code, codes::ADDRESS_IN_USE);
        for bad in ["10.0.1.2", "10.0.1.255", "10.0.2.9", "ten"] {
            let e = launch(&mut s, Some(bad)).expect_err(bad);
            assert_eq!(e.code, codes::INVALID_PARAMETER_VALUE, "{bad}");
        }
        // The next free one skips nothing it should not.
        assert_eq!(launch(&mut s, None).expect("next").private_ip, "10.0.1.4");
        let table = s.route_tables()[0].id.clone();
        s.create_route(
            &table,
            CreateRouteRequest {
                destination_cidr: "10.244.0.0/24".into(),
                instance_id: cp.id.clone(),
                ..Default::default()
            },
        )
        .expect("route");
        let hops = s.next_hops();
        assert_eq!(hops.len(), 1);
        assert_eq!(hops[0].via, Ipv4Addr::new(10, 0, 1, 9));
        s.begin_terminate(&cp.id).expect("terminate");
        s.finish_transition(
            &cp.id,
            InstanceState::ShuttingDown,
            InstanceState::Terminated,
            None,
        );
        assert!(
            s.next_hops().is_empty(),
            "a blackholed route carries nothing"
        );
    }

    #[test]
    fn probed_health_follows_the_thresholds_and_decides_the_targets() {
        let mut s = State::new();
        let i = s
            .run_instance(RunInstanceRequest {
                zone: Some("kumo-1a".into()),
                ..Default::default()
            })
            .expect("instance");
        s.finish_transition(&i.id, InstanceState::Pending, InstanceState::Running, None);
        let lb = s
            .create_load_balancer(CreateLoadBalancerRequest {
                name: "web".into(),
                listeners: vec![Listener {
                    port: 80,
                    protocol: Protocol::Tcp,
                    target_port: 30080,
                }],
                targets: vec![i.id.clone()],
                health_check: Some(HealthCheck {
                    healthy_threshold: 2,
                    unhealthy_threshold: 2,
                    ..HealthCheck::default()
                }),
                tags: BTreeMap::new(),
            })
            .expect("lb");
        let health = |s: &State| s.load_balancer(&lb.id).expect("lb").targets[0].health;
        // Derived from the instance until the network probes.
        assert_eq!(health(&s), TargetHealthState::Healthy);
        s.probe_targets();
        assert_eq!(health(&s), TargetHealthState::Initial);
        let checks = s.health_checks();
        assert_eq!(checks.len(), 1);
        assert_eq!(
            checks[0].2.port(),
            30080,
            "the first listener's target port"
        );
        s.record_probe(&lb.id, &i.id, true);
        assert_eq!(health(&s), TargetHealthState::Initial);
        assert!(s.lb_routes()[0].targets.is_empty());
        s.record_probe(&lb.id, &i.id, true);
        assert_eq!(health(&s), TargetHealthState::Healthy);
        assert_eq!(s.lb_routes()[0].targets.len(), 1);
        s.record_probe(&lb.id, &i.id, false);
        assert_eq!(
            health(&s),
            TargetHealthState::Healthy,
            "one failure is not enough"
        );
        s.record_probe(&lb.id, &i.id, false);
        let view = s.load_balancer(&lb.id).expect("lb");
        assert_eq!(view.targets[0].health, TargetHealthState::Unhealthy);
        assert_eq!(
            view.targets[0].reason.as_deref(),
            Some("Target.FailedHealthChecks")
        );
        assert!(s.lb_routes()[0].targets.is_empty());
    }

    #[test]
    fn ids_and_dns() {
        let id = new_id("i");
        assert_eq!(id.len(), 19);
        assert!(id[2..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            private_dns_name(Ipv4Addr::new(10, 0, 1, 23)),
            "ip-10-0-1-23.kumo-1.compute.internal"
        );
    }
}
