//! The cloud's resources and the bodies of its API, shared by the server and the
//! [`Client`](crate::Client). JSON field names are camelCase; request bodies refuse unknown
//! fields (400 `UnknownParameter`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The one region of the cloud.
pub const REGION: &str = "kumo-1";
/// Its availability zones.
pub const ZONES: [&str; 3] = ["kumo-1a", "kumo-1b", "kumo-1c"];
/// The default VPC's address range.
pub const VPC_CIDR: &str = "10.0.0.0/16";
/// The public pool load-balancer VIPs come from, in order: the documentation ranges
/// TEST-NET-3, TEST-NET-2 and TEST-NET-1 (RFC 5737), then the benchmarking range
/// 198.18.0.0/15 (RFC 2544) for clouds with more than 762 load balancers. None of them is
/// routed on the internet, and the data plane only uses them inside its own namespaces.
pub const PUBLIC_POOLS: [&str; 4] = [
    "203.0.113.0/24",
    "198.51.100.0/24",
    "192.0.2.0/24",
    "198.18.0.0/15",
];
/// The instance type used when a run request names none.
pub const DEFAULT_INSTANCE_TYPE: &str = "k1.small";

/// A region and its zones (`GET /v1/regions`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Region {
    /// `kumo-1`.
    pub name: String,
    /// The zones, each `available`.
    pub zones: Vec<Zone>,
}

/// An availability zone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Zone {
    /// e.g. `kumo-1a`.
    pub name: String,
    /// Always `available`.
    pub state: String,
}

/// An instance type (`GET /v1/instance-types`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceType {
    /// e.g. `k1.small`.
    pub name: String,
    /// Virtual CPUs.
    pub cpu: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
}

/// The instance types the cloud offers.
pub fn instance_types() -> Vec<InstanceType> {
    [
        ("k1.small", 2, 4 * 1024),
        ("k1.medium", 4, 8 * 1024),
        ("k1.large", 8, 16 * 1024),
        ("k1.xlarge", 16, 32 * 1024),
    ]
    .into_iter()
    .map(|(n, cpu, mem)| InstanceType {
        name: n.to_owned(),
        cpu,
        memory_mib: mem,
    })
    .collect()
}

/// A VPC (`GET /v1/vpcs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Vpc {
    /// `vpc-` and 17 hex digits.
    pub id: String,
    /// Its address range.
    pub cidr: String,
    /// Whether it is the region's default VPC.
    pub is_default: bool,
}

/// A subnet of a VPC in one zone (`GET /v1/subnets`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subnet {
    /// `subnet-` and 17 hex digits.
    pub id: String,
    /// The VPC it belongs to.
    pub vpc_id: String,
    /// Its zone.
    pub zone: String,
    /// Its address range.
    pub cidr: String,
    /// Addresses still free (the first four and the last address are reserved).
    pub available_ip_count: u32,
}

/// The lifecycle state of an instance, as upstream clouds name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    /// Booting (the hypervisor's `boot` has not returned yet).
    Pending,
    /// Booted.
    Running,
    /// Being halted by a stop.
    Stopping,
    /// Halted; keeps its private IP.
    Stopped,
    /// Being halted by a terminate.
    ShuttingDown,
    /// Gone; its private IP is released. Stays visible for a while.
    Terminated,
}

impl InstanceState {
    /// The state's name on the wire (`pending`, `shutting-down`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Running => "running",
            InstanceState::Stopping => "stopping",
            InstanceState::Stopped => "stopped",
            InstanceState::ShuttingDown => "shutting-down",
            InstanceState::Terminated => "terminated",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<InstanceState> {
        Some(match s {
            "pending" => InstanceState::Pending,
            "running" => InstanceState::Running,
            "stopping" => InstanceState::Stopping,
            "stopped" => InstanceState::Stopped,
            "shutting-down" => InstanceState::ShuttingDown,
            "terminated" => InstanceState::Terminated,
            _ => return None,
        })
    }
}

impl std::fmt::Display for InstanceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an instance is in its state (set on failures and on terminations).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateReason {
    /// e.g. `Client.UserInitiatedShutdown`, `Server.InternalError`.
    pub code: String,
    /// Human-readable text.
    pub message: String,
}

/// An instance (a virtual machine).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// `i-` and 17 hex digits.
    pub id: String,
    /// The `Name` tag (empty when none).
    pub name: String,
    /// e.g. `k1.small`.
    pub instance_type: String,
    /// Virtual CPUs of its type.
    pub cpu: u32,
    /// Memory of its type, in MiB.
    pub memory_mib: u64,
    /// Lifecycle state.
    pub state: InstanceState,
    /// Why it is in this state, when that is worth saying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_reason: Option<StateReason>,
    /// The region (`kumo-1`).
    pub region: String,
    /// The zone.
    pub zone: String,
    /// The VPC.
    pub vpc_id: String,
    /// The subnet.
    pub subnet_id: String,
    /// Private IPv4 address in the subnet; empty once terminated.
    pub private_ip: String,
    /// `ip-10-0-1-23.kumo-1.compute.internal`; empty once terminated.
    pub private_dns_name: String,
    /// RFC 3339, when it was launched (or last started).
    pub launch_time: String,
    /// RFC 3339, when it became terminated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated_time: Option<String>,
    /// Tags, including `Name`.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// User data given at launch (opaque to the cloud; the hypervisor reads it).
    #[serde(default)]
    pub user_data: String,
}

/// `POST /v1/instances`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunInstanceRequest {
    /// The `Name` tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Defaults to `k1.small`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// The zone; the default VPC's subnet in it is used. Defaults to the zone with the
    /// fewest live instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// A subnet instead of a zone (must agree with `zone` when both are given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    /// Opaque user data (at most 16 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// A private address of the subnet's range to take instead of the next free one (a
    /// control-plane machine whose address is known before it exists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_ip_address: Option<String>,
    /// More tags.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// `POST /v1/instances/{id}/stop`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StopInstanceRequest {
    /// Accepted for compatibility; the halt is the same.
    #[serde(default)]
    pub force: bool,
}

/// Filters of `GET /v1/instances` (query parameters `state`, `zone`, `id`, `name`,
/// `privateIp`, `privateDnsName` and `tag.<key>`; values of `state` and `id` are
/// comma-separated alternatives; all given filters must match).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceFilter {
    /// Any of these states.
    pub states: Vec<InstanceState>,
    /// Any of these ids.
    pub ids: Vec<String>,
    /// The `Name` tag.
    pub name: Option<String>,
    /// In this zone.
    pub zone: Option<String>,
    /// With this private IP.
    pub private_ip: Option<String>,
    /// With this private DNS name (how upstream clouds find the instance of a node).
    pub private_dns_name: Option<String>,
    /// All of these tags with these values.
    pub tags: BTreeMap<String, String>,
}

impl InstanceFilter {
    /// Whether `i` passes the filter.
    pub fn matches(&self, i: &Instance) -> bool {
        (self.states.is_empty() || self.states.contains(&i.state))
            && (self.ids.is_empty() || self.ids.contains(&i.id))
            && self.name.as_ref().is_none_or(|n| *n == i.name)
            && self.zone.as_ref().is_none_or(|z| *z == i.zone)
            && self.private_ip.as_ref().is_none_or(|v| *v == i.private_ip)
            && self
                .private_dns_name
                .as_ref()
                .is_none_or(|v| *v == i.private_dns_name)
            && self
                .tags
                .iter()
                .all(|(k, v)| i.tags.get(k).is_some_and(|x| x == v))
    }

    /// The filter as query parameters (unencoded pairs).
    pub fn query_pairs(&self) -> Vec<(String, String)> {
        let mut q = Vec::new();
        if !self.states.is_empty() {
            let s: Vec<&str> = self.states.iter().map(|s| s.as_str()).collect();
            q.push(("state".to_owned(), s.join(",")));
        }
        if !self.ids.is_empty() {
            q.push(("id".to_owned(), self.ids.join(",")));
        }
        if let Some(n) = &self.name {
            q.push(("name".to_owned(), n.clone()));
        }
        if let Some(z) = &self.zone {
            q.push(("zone".to_owned(), z.clone()));
        }
        if let Some(v) = &self.private_ip {
            q.push(("privateIp".to_owned(), v.clone()));
        }
        if let Some(v) = &self.private_dns_name {
            q.push(("privateDnsName".to_owned(), v.clone()));
        }
        for (k, v) in &self.tags {
            q.push((format!("tag.{k}"), v.clone()));
        }
        q
    }
}

/// A listener's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Protocol {
    /// TCP.
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
}

impl Protocol {
    /// `TCP` or `UDP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

/// A listener: traffic to the VIP on `port`/`protocol` goes to every target on `targetPort`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listener {
    /// The VIP's port.
    pub port: u16,
    /// `TCP` or `UDP`.
    pub protocol: Protocol,
    /// The targets' port (a Service's NodePort).
    pub target_port: u16,
}

/// How targets are health-checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheck {
    /// `TCP` or `HTTP`.
    #[serde(default = "HealthCheck::default_protocol")]
    pub protocol: String,
    /// The port probed on each target (0: the first listener's target port).
    #[serde(default)]
    pub port: u16,
    /// The HTTP path (HTTP only), e.g. `/healthz`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Seconds between probes.
    #[serde(default = "HealthCheck::default_interval")]
    pub interval_seconds: u32,
    /// Seconds before a probe fails.
    #[serde(default = "HealthCheck::default_timeout")]
    pub timeout_seconds: u32,
    /// Successes before a target is healthy.
    #[serde(default = "HealthCheck::default_threshold")]
    pub healthy_threshold: u32,
    /// Failures before a target is unhealthy.
    #[serde(default = "HealthCheck::default_threshold")]
    pub unhealthy_threshold: u32,
}

impl HealthCheck {
    fn default_protocol() -> String {
        "TCP".to_owned()
    }
    fn default_interval() -> u32 {
        10
    }
    fn default_timeout() -> u32 {
        5
    }
    fn default_threshold() -> u32 {
        3
    }
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            protocol: HealthCheck::default_protocol(),
            port: 0,
            path: None,
            interval_seconds: HealthCheck::default_interval(),
            timeout_seconds: HealthCheck::default_timeout(),
            healthy_threshold: HealthCheck::default_threshold(),
            unhealthy_threshold: HealthCheck::default_threshold(),
        }
    }
}

/// A target's health, as reported by the cloud.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetHealthState {
    /// Registered, its first health checks not passed yet (`Elb.InitialHealthChecking`).
    Initial,
    /// Serving traffic.
    Healthy,
    /// Registered but failing.
    Unhealthy,
    /// Registered but not eligible (stopped, terminated or unknown instance).
    Unused,
}

/// One registered target and its health.
///
/// Where the network probes (the real data plane), a running instance's health is its
/// health check's: `initial` until `healthyThreshold` checks in a row pass, `unhealthy`
/// (`Target.FailedHealthChecks`) after `unhealthyThreshold` fail in a row. Otherwise it
/// is derived from the instance's state: `running` is healthy. Either way `pending`,
/// `stopping` and `shutting-down` are unhealthy (`Target.InvalidState`); `stopped`,
/// `terminated` and unknown instances are unused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// The instance.
    pub instance_id: String,
    /// Its health.
    pub health: TargetHealthState,
    /// Why, when not healthy (e.g. `Target.InvalidState`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A load balancer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancer {
    /// `lb-` and 17 hex digits.
    pub id: String,
    /// Unique within the cloud.
    pub name: String,
    /// `<name>-<hex>.elb.kumo-1.kumo.internal`.
    pub dns_name: String,
    /// The virtual IP from the public pool.
    pub vip: String,
    /// `internet-facing`.
    pub scheme: String,
    /// `active`.
    pub state: String,
    /// The VPC of its targets.
    pub vpc_id: String,
    /// Listeners, in the order given.
    pub listeners: Vec<Listener>,
    /// Targets with their health.
    pub targets: Vec<Target>,
    /// The health check.
    pub health_check: HealthCheck,
    /// Tags.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// RFC 3339 creation time.
    pub created_time: String,
}

/// `POST /v1/load-balancers`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateLoadBalancerRequest {
    /// 1–32 letters, digits and hyphens, not starting or ending with a hyphen.
    pub name: String,
    /// At least one listener.
    pub listeners: Vec<Listener>,
    /// Instance ids.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Defaults to TCP on the first listener's target port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// Tags.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// `PATCH /v1/load-balancers/{id}`: each field given replaces the current one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateLoadBalancerRequest {
    /// New listeners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listeners: Option<Vec<Listener>>,
    /// New targets (instance ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<String>>,
    /// New health check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// New tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
}

/// The largest volume, in GiB.
pub const MAX_VOLUME_GIB: u64 = 16_384;
/// The devices a volume is attached as, in the order they are handed out (`/dev/vda` is
/// the root disk).
pub const VOLUME_DEVICES: std::ops::RangeInclusive<char> = 'b'..='z';

/// Where a volume is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeState {
    /// Not attached to any instance.
    Available,
    /// Attached to an instance.
    InUse,
}

impl VolumeState {
    /// The state named `s`.
    pub fn parse(s: &str) -> Option<VolumeState> {
        match s {
            "available" => Some(VolumeState::Available),
            "in-use" => Some(VolumeState::InUse),
            _ => None,
        }
    }

    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeState::Available => "available",
            VolumeState::InUse => "in-use",
        }
    }
}

impl std::fmt::Display for VolumeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A volume's attachment to an instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAttachment {
    /// The instance.
    pub instance_id: String,
    /// The device it appears as on the instance (`/dev/vdb` ...).
    pub device: String,
    /// RFC 3339.
    pub attach_time: String,
}

/// A block volume (a disk) in one zone: storage of its own, kept while instances come and
/// go, attached to at most one instance of its zone at a time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// `vol-` and 17 hex digits.
    pub id: String,
    /// Unique among the cloud's volumes when given: creating a volume of the same name
    /// again answers the one there is (a retried create makes no second volume).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Its zone.
    pub zone: String,
    /// Its size.
    pub size_gib: u64,
    /// `available` or `in-use`.
    pub state: VolumeState,
    /// The instance it is attached to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<VolumeAttachment>,
    /// Tags.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// RFC 3339 creation time.
    pub created_time: String,
}

/// `POST /v1/volumes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateVolumeRequest {
    /// An idempotency name (see [`Volume::name`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// One of [`ZONES`].
    pub zone: String,
    /// 1 to [`MAX_VOLUME_GIB`].
    pub size_gib: u64,
    /// Tags.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// Filters of `GET /v1/volumes` (query parameters `zone`, `instanceId`, `name`, `state`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeFilter {
    /// In this zone.
    pub zone: Option<String>,
    /// Attached to this instance.
    pub instance_id: Option<String>,
    /// With this name.
    pub name: Option<String>,
    /// In this state.
    pub state: Option<VolumeState>,
}

impl VolumeFilter {
    /// Whether `v` passes the filter.
    pub fn matches(&self, v: &Volume) -> bool {
        self.zone.as_ref().is_none_or(|z| *z == v.zone)
            && self.name.as_ref().is_none_or(|n| *n == v.name)
            && self.state.is_none_or(|s| s == v.state)
            && self
                .instance_id
                .as_ref()
                .is_none_or(|i| v.attachment.as_ref().is_some_and(|a| a.instance_id == *i))
    }

    /// The filter as query parameters (unencoded pairs).
    pub fn query_pairs(&self) -> Vec<(String, String)> {
        let mut q = Vec::new();
        if let Some(z) = &self.zone {
            q.push(("zone".to_owned(), z.clone()));
        }
        if let Some(i) = &self.instance_id {
            q.push(("instanceId".to_owned(), i.clone()));
        }
        if let Some(n) = &self.name {
            q.push(("name".to_owned(), n.clone()));
        }
        if let Some(s) = self.state {
            q.push(("state".to_owned(), s.as_str().to_owned()));
        }
        q
    }
}

/// `POST /v1/volumes/{id}/attach`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttachVolumeRequest {
    /// An instance of the volume's zone, not terminated.
    pub instance_id: String,
}

/// `POST /v1/volumes/{id}/detach`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DetachVolumeRequest {
    /// When given, the volume must be attached to this instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
}

/// `POST /v1/volumes/{id}/modify`: grows a volume (volumes never shrink).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModifyVolumeRequest {
    /// The new size, not below the current one.
    pub size_gib: u64,
}

/// Whether a route's target can carry traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteState {
    /// The target instance exists and is not terminated.
    Active,
    /// The target instance is terminated or gone.
    Blackhole,
}

/// A route: packets to `destinationCidr` go to `instanceId`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// The destination, a canonical CIDR (no host bits).
    pub destination_cidr: String,
    /// The target instance; empty for the VPC's `local` route.
    pub instance_id: String,
    /// `local` for the VPC's own range, else the name given at creation.
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// `active` or `blackhole`.
    pub state: RouteState,
    /// `CreateRouteTable` for the local route, `CreateRoute` otherwise.
    pub origin: String,
}

/// A VPC's route table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteTable {
    /// `rtb-` and 17 hex digits.
    pub id: String,
    /// The VPC.
    pub vpc_id: String,
    /// Whether it is the VPC's main table (there is one per VPC).
    pub main: bool,
    /// The routes, the `local` one first.
    pub routes: Vec<Route>,
}

/// `POST /v1/route-tables/{id}/routes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRouteRequest {
    /// e.g. `10.244.1.0/24`; must not overlap the VPC or another route.
    pub destination_cidr: String,
    /// The target instance.
    pub instance_id: String,
    /// A name (e.g. the node's).
    #[serde(default)]
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
}

/// Injected faults of one operation (an action name such as `CreateLoadBalancer`, or `*`
/// for every resource operation).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fault {
    /// Added before the operation runs.
    #[serde(default)]
    pub latency_ms: u64,
    /// Probability in [0, 1] that the operation fails instead of running.
    #[serde(default)]
    pub error_rate: f64,
    /// The error answered: `ServiceUnavailable` (503, the default),
    /// `RequestLimitExceeded` (503 with `Retry-After`) or `InternalError` (500).
    #[serde(default = "Fault::default_code")]
    pub error_code: String,
}

impl Fault {
    fn default_code() -> String {
        crate::codes::SERVICE_UNAVAILABLE.to_owned()
    }
}

impl Default for Fault {
    fn default() -> Self {
        Fault {
            latency_ms: 0,
            error_rate: 0.0,
            error_code: Fault::default_code(),
        }
    }
}

/// A deny statement: `credential` (or every credential) may not perform `action`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatement {
    /// `pol-` and 17 hex digits.
    pub id: String,
    /// Always `Deny` (everything not denied is allowed).
    pub effect: String,
    /// An action name, `*`, or a prefix ending in `*` (`Describe*`).
    pub action: String,
    /// An access key id; `None` for every credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

impl PolicyStatement {
    /// Whether the statement covers `action` by `credential`.
    pub fn covers(&self, action: &str, credential: &str) -> bool {
        let action_ok = match self.action.strip_suffix('*') {
            Some(prefix) => action.starts_with(prefix),
            None => self.action == action,
        };
        action_ok && self.credential.as_deref().is_none_or(|c| c == credential)
    }
}

/// `POST /v1/policies`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreatePolicyRequest {
    /// Only `Deny` (the default) is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
    /// The action.
    pub action: String,
    /// The credential; every credential when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

/// Quotas: live (not terminated) instances, load balancers, routes per table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Quotas {
    /// Max instances not terminated.
    pub max_instances: u32,
    /// Max load balancers.
    pub max_load_balancers: u32,
    /// Max routes per route table (the local route not counted).
    pub max_routes_per_table: u32,
    /// Max volumes.
    #[serde(default = "Quotas::default_max_volumes")]
    pub max_volumes: u32,
    /// Max GiB of all volumes together.
    #[serde(default = "Quotas::default_max_volume_gib")]
    pub max_volume_gib: u64,
}

impl Quotas {
    fn default_max_volumes() -> u32 {
        1024
    }
    fn default_max_volume_gib() -> u64 {
        65_536
    }
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            max_instances: 256,
            max_load_balancers: 2048,
            max_routes_per_table: 1024,
            max_volumes: Quotas::default_max_volumes(),
            max_volume_gib: Quotas::default_max_volume_gib(),
        }
    }
}

/// `PUT /v1/quotas`: each field given replaces the current one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateQuotasRequest {
    /// New max instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_instances: Option<u32>,
    /// New max load balancers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_load_balancers: Option<u32>,
    /// New max routes per table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_routes_per_table: Option<u32>,
    /// New max volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_volumes: Option<u32>,
    /// New max GiB of all volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_volume_gib: Option<u64>,
}

/// An access key. The secret is only returned when the key is created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccessKey {
    /// `KKIA` and 16 upper-case letters and digits.
    pub access_key_id: String,
    /// A name for people (`admin` for the one made at first start).
    pub name: String,
    /// The secret, only in the answer to its creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<String>,
}

/// `POST /v1/access-keys`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateAccessKeyRequest {
    /// A name for people (e.g. `cloud-controller-manager`).
    pub name: String,
}

/// `GET /v1/caller-identity`: who the request's credential is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallerIdentity {
    /// The access key id.
    pub access_key_id: String,
    /// Its name.
    pub name: String,
    /// The region.
    pub region: String,
}
