//! The cloud's HTTPS API server.
//!
//! Every request except `GET /openapi.json` and `GET /healthz` carries an access key as
//! `Authorization: Bearer <ACCESS_KEY_ID>:<SECRET_ACCESS_KEY>` (TLS protects it in transit).
//! A request then goes through, in order: routing ([`ROUTES`]), authentication (401),
//! the deny policies (403 `AccessDenied`), the injected faults (latency, then an error
//! with the configured rate), body decoding (400s) and the operation. Policies and faults
//! do not apply to the control operations (policies, faults, quotas, access keys, caller
//! identity), so a cloud made unusable can always be repaired. Every answer carries
//! `x-kumo-request-id`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use rand::Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;
use tokio::task::JoinSet;

use crate::error::{codes, ApiError, ErrorBody, ErrorDetail};
use crate::hypervisor::{Hypervisor, NoopHypervisor};
use crate::model::*;
use crate::pki::{self, CredentialsFile, EndpointFile};
use crate::state::{Store, STATE_FILE};

/// The largest request body accepted.
pub const MAX_BODY: usize = 1 << 20;
/// The request id header.
pub const REQUEST_ID_HEADER: &str = "x-kumo-request-id";

/// One operation of the API: method, path template (`{id}` marks a parameter), the
/// operation id, the policy action it is authorized as, and what it takes and returns.
#[derive(Clone, Copy, Debug)]
pub struct RouteSpec {
    /// HTTP method.
    pub method: &'static str,
    /// Path template.
    pub path: &'static str,
    /// OpenAPI operationId (unique).
    pub operation_id: &'static str,
    /// The action deny policies and faults name.
    pub action: &'static str,
    /// Control operations are exempt from policies and faults.
    pub control: bool,
    /// One line for the OpenAPI document.
    pub summary: &'static str,
    /// The request body's schema name, if it takes one.
    pub request: Option<&'static str>,
    /// Query parameters: (name, description).
    pub query: &'static [(&'static str, &'static str)],
    /// The success status.
    pub status: u16,
    /// The success body's schema name.
    pub response: &'static str,
}

macro_rules! route {
    ($m:literal $p:literal $op:ident $action:literal $control:literal $status:literal $resp:literal $req:expr, $q:expr, $sum:literal) => {
        RouteSpec {
            method: $m,
            path: $p,
            operation_id: stringify!($op),
            action: $action,
            control: $control,
            summary: $sum,
            request: $req,
            query: $q,
            status: $status,
            response: $resp,
        }
    };
}

const VOLUME_QUERY: &[(&str, &str)] = &[
    ("zone", "The zone"),
    ("instanceId", "Attached to this instance"),
    ("name", "The volume's name"),
    ("state", "available or in-use"),
];

/// The file that holds volume `id`'s data in the cloud's data directory `dir`: a sparse
/// file of the volume's size, its blocks the volume's blocks. It is the disk the
/// instances' machines attach (the hypervisor's side of a volume).
pub fn volume_file(dir: &Path, id: &str) -> PathBuf {
    dir.join("volumes").join(format!("{id}.img"))
}

/// Makes (or grows) a volume's file to `size_gib`; sparse, so only what is written takes
/// room.
fn size_volume_file(dir: &Path, id: &str, size_gib: u64) -> Result<(), ApiError> {
    let path = volume_file(dir, id);
    let fail = |e: std::io::Error| {
        tracing::error!(volume = id, "cloud: sizing {}: {e}", path.display());
        ApiError::new(
            500,
            codes::INTERNAL_ERROR,
            format!("The volume '{id}' could not be provisioned"),
        )
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(fail)?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(fail)?;
    let want = size_gib << 30;
    if f.metadata().map_err(fail)?.len() < want {
        f.set_len(want).map_err(fail)?;
    }
    Ok(())
}

fn volume_filter(query: &[(String, String)]) -> Result<VolumeFilter, ApiError> {
    let mut f = VolumeFilter::default();
    for (k, v) in query {
        match k.as_str() {
            "zone" => f.zone = Some(v.clone()),
            "instanceId" => f.instance_id = Some(v.clone()),
            "name" => f.name = Some(v.clone()),
            "state" => {
                f.state = Some(VolumeState::parse(v).ok_or_else(|| {
                    ApiError::invalid(format!(
                        "The filter value '{v}' for 'state' is invalid: available or in-use"
                    ))
                })?)
            }
            k => {
                return Err(ApiError::invalid(format!(
                    "The filter '{k}' is invalid: zone, instanceId, name or state"
                )))
            }
        }
    }
    Ok(f)
}

const INSTANCE_QUERY: &[(&str, &str)] = &[
    (
        "state",
        "Comma-separated states (pending, running, stopping, stopped, shutting-down, terminated)",
    ),
    ("id", "Comma-separated instance ids"),
    ("name", "The Name tag"),
    ("zone", "The zone"),
    ("privateIp", "The private IP address"),
    ("privateDnsName", "The private DNS name"),
    ("tag.KEY", "The value of tag KEY (any tag key may be used)"),
];

/// Every operation of the API. The router and the OpenAPI document are both built from it.
pub const ROUTES: &[RouteSpec] = &[
    route!("GET" "/v1/regions" DescribeRegions "DescribeRegions" false 200 "RegionList" None, &[], "The region and its zones"),
    route!("GET" "/v1/instance-types" DescribeInstanceTypes "DescribeInstanceTypes" false 200 "InstanceTypeList" None, &[], "Instance types with cpu and memory"),
    route!("GET" "/v1/vpcs" DescribeVpcs "DescribeVpcs" false 200 "VpcList" None, &[], "The VPCs"),
    route!("GET" "/v1/subnets" DescribeSubnets "DescribeSubnets" false 200 "SubnetList" None, &[], "The subnets, one per zone"),
    route!("GET" "/v1/instances" DescribeInstances "DescribeInstances" false 200 "InstanceList" None, INSTANCE_QUERY, "List instances"),
    route!("POST" "/v1/instances" RunInstance "RunInstances" false 201 "Instance" Some("RunInstanceRequest"), &[], "Launch an instance (state pending)"),
    route!("GET" "/v1/instances/{id}" DescribeInstance "DescribeInstances" false 200 "Instance" None, &[], "One instance"),
    route!("DELETE" "/v1/instances/{id}" DeleteInstance "TerminateInstances" false 200 "Instance" None, &[], "Terminate an instance"),
    route!("POST" "/v1/instances/{id}/stop" StopInstance "StopInstances" false 200 "Instance" Some("StopInstanceRequest"), &[], "Stop a running instance"),
    route!("POST" "/v1/instances/{id}/start" StartInstance "StartInstances" false 200 "Instance" None, &[], "Start a stopped instance"),
    route!("POST" "/v1/instances/{id}/terminate" TerminateInstance "TerminateInstances" false 200 "Instance" None, &[], "Terminate an instance"),
    route!("GET" "/v1/load-balancers" DescribeLoadBalancers "DescribeLoadBalancers" false 200 "LoadBalancerList" None, &[("name", "Only the load balancer with this name")], "List load balancers"),
    route!("POST" "/v1/load-balancers" CreateLoadBalancer "CreateLoadBalancer" false 201 "LoadBalancer" Some("CreateLoadBalancerRequest"), &[], "Create a load balancer with a VIP"),
    route!("GET" "/v1/load-balancers/{id}" DescribeLoadBalancer "DescribeLoadBalancers" false 200 "LoadBalancer" None, &[], "One load balancer"),
    route!("PATCH" "/v1/load-balancers/{id}" UpdateLoadBalancer "UpdateLoadBalancer" false 200 "LoadBalancer" Some("UpdateLoadBalancerRequest"), &[], "Replace listeners, targets, health check or tags"),
    route!("DELETE" "/v1/load-balancers/{id}" DeleteLoadBalancer "DeleteLoadBalancer" false 200 "LoadBalancer" None, &[], "Delete a load balancer, releasing its VIP"),
    route!("GET" "/v1/volumes" DescribeVolumes "DescribeVolumes" false 200 "VolumeList" None, VOLUME_QUERY, "List volumes"),
    route!("POST" "/v1/volumes" CreateVolume "CreateVolume" false 201 "Volume" Some("CreateVolumeRequest"), &[], "Create a volume in a zone (a retried create of the same name answers the same volume)"),
    route!("GET" "/v1/volumes/{id}" DescribeVolume "DescribeVolumes" false 200 "Volume" None, &[], "One volume"),
    route!("DELETE" "/v1/volumes/{id}" DeleteVolume "DeleteVolume" false 200 "Volume" None, &[], "Delete a volume that is not attached, with its data"),
    route!("POST" "/v1/volumes/{id}/attach" AttachVolume "AttachVolume" false 200 "Volume" Some("AttachVolumeRequest"), &[], "Attach a volume to an instance of its zone"),
    route!("POST" "/v1/volumes/{id}/detach" DetachVolume "DetachVolume" false 200 "Volume" Some("DetachVolumeRequest"), &[], "Detach a volume"),
    route!("POST" "/v1/volumes/{id}/modify" ModifyVolume "ModifyVolume" false 200 "Volume" Some("ModifyVolumeRequest"), &[], "Grow a volume"),
    route!("GET" "/v1/route-tables" DescribeRouteTables "DescribeRouteTables" false 200 "RouteTableList" None, &[], "List route tables"),
    route!("GET" "/v1/route-tables/{id}" DescribeRouteTable "DescribeRouteTables" false 200 "RouteTable" None, &[], "One route table"),
    route!("GET" "/v1/route-tables/{id}/routes" DescribeRoutes "DescribeRouteTables" false 200 "RouteList" None, &[], "The routes of a table"),
    route!("POST" "/v1/route-tables/{id}/routes" CreateRoute "CreateRoute" false 201 "Route" Some("CreateRouteRequest"), &[], "Add a route to an instance"),
    route!("DELETE" "/v1/route-tables/{id}/routes" DeleteRoute "DeleteRoute" false 200 "Route" None, &[("destinationCidr", "The route's destination (required)")], "Delete the route to a destination"),
    route!("GET" "/v1/faults" GetFaults "GetFaults" true 200 "FaultMap" None, &[], "The injected faults by operation"),
    route!("PUT" "/v1/faults/{operation}" PutFault "PutFault" true 200 "Fault" Some("Fault"), &[], "Inject latency and errors into an operation ('*': all)"),
    route!("DELETE" "/v1/faults/{operation}" DeleteFault "DeleteFault" true 200 "FaultMap" None, &[], "Clear one operation's fault"),
    route!("DELETE" "/v1/faults" DeleteFaults "DeleteFault" true 200 "FaultMap" None, &[], "Clear every fault"),
    route!("GET" "/v1/policies" GetPolicies "GetPolicies" true 200 "PolicyList" None, &[], "The deny statements"),
    route!("POST" "/v1/policies" CreatePolicy "PutPolicy" true 201 "PolicyStatement" Some("CreatePolicyRequest"), &[], "Deny an action (to one credential or all)"),
    route!("DELETE" "/v1/policies/{id}" DeletePolicy "DeletePolicy" true 200 "PolicyStatement" None, &[], "Remove one deny statement"),
    route!("DELETE" "/v1/policies" DeletePolicies "DeletePolicy" true 200 "PolicyList" None, &[("action", "The action (required)"), ("credential", "Only this credential's statements")], "Remove the deny statements of an action (allow it again)"),
    route!("GET" "/v1/quotas" GetQuotas "GetQuotas" true 200 "Quotas" None, &[], "The quotas"),
    route!("PUT" "/v1/quotas" UpdateQuotas "UpdateQuotas" true 200 "Quotas" Some("UpdateQuotasRequest"), &[], "Change quotas"),
    route!("GET" "/v1/access-keys" ListAccessKeys "ListAccessKeys" true 200 "AccessKeyList" None, &[], "The access keys (without secrets)"),
    route!("POST" "/v1/access-keys" CreateAccessKey "CreateAccessKey" true 201 "AccessKey" Some("CreateAccessKeyRequest"), &[], "Create an access key (the secret is returned once)"),
    route!("GET" "/v1/caller-identity" GetCallerIdentity "GetCallerIdentity" true 200 "CallerIdentity" None, &[], "Who the request's credential is"),
];

/// How to run the cloud.
#[derive(Clone)]
pub struct CloudConfig {
    /// State, certificates and credentials live here.
    pub data_dir: PathBuf,
    /// Where to listen (port 0 picks one). Loopback only is the safe default.
    pub bind: SocketAddr,
    /// Boots and halts instances.
    pub hypervisor: Arc<dyn Hypervisor>,
    /// Carries the VPC's routes.
    pub network: Arc<dyn crate::network::Network>,
    /// Added before each boot and halt, to make `pending`/`stopping` observable.
    pub transition_delay: Duration,
    /// How long terminated instances stay visible (upstream clouds: about an hour).
    pub terminated_retention: Duration,
}

impl CloudConfig {
    /// Defaults: 127.0.0.1:0, the no-op hypervisor, no transition delay, 1 h retention.
    pub fn new(data_dir: impl Into<PathBuf>) -> CloudConfig {
        CloudConfig {
            data_dir: data_dir.into(),
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            hypervisor: Arc::new(NoopHypervisor),
            network: Arc::new(crate::network::NoopNetwork),
            transition_delay: Duration::ZERO,
            terminated_retention: Duration::from_secs(3600),
        }
    }
}

struct Inner {
    store: Store,
    /// Where volumes' data lives (see [`volume_file`]).
    data_dir: PathBuf,
    hypervisor: Arc<dyn Hypervisor>,
    transition_delay: Duration,
    tasks: parking_lot::Mutex<JoinSet<()>>,
    // Serializes the hypervisor's calls per instance.
    locks: parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A running cloud.
pub struct CloudServer {
    /// The address it listens on.
    pub local_addr: SocketAddr,
    /// `https://<addr>`.
    pub url: String,
    /// `endpoint.json`.
    pub endpoint_file: PathBuf,
    /// `credentials.json` (0600), the admin access key.
    pub credentials_file: PathBuf,
    /// The CA that signed the serving certificate.
    pub ca_file: PathBuf,
    inner: Arc<Inner>,
    accept: tokio::task::JoinHandle<()>,
    lock: DirLock,
}

/// One cloud per data directory: a `cloud.pid` file against other processes and a set
/// of directories against other servers in this process. Two writers of one
/// `state.json` would silently lose each other's changes.
struct DirLock {
    dir: PathBuf,
}

static IN_USE: parking_lot::Mutex<Vec<PathBuf>> = parking_lot::Mutex::new(Vec::new());

impl DirLock {
    fn acquire(dir: &Path) -> Result<DirLock, String> {
        let mut in_use = IN_USE.lock();
        if in_use.iter().any(|d| d == dir) {
            return Err(format!(
                "{}: a kumo cloud in this process already serves this data directory",
                dir.display()
            ));
        }
        let pid_file = dir.join("cloud.pid");
        if let Ok(pid) = std::fs::read_to_string(&pid_file) {
            let pid = pid.trim();
            let alive = pid != std::process::id().to_string()
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("kumo"));
            if alive {
                return Err(format!(
                    "{}: another kumo cloud (pid {pid}) serves this data directory",
                    dir.display()
                ));
            }
        }
        crate::state::write_atomic(&pid_file, std::process::id().to_string().as_bytes())?;
        in_use.push(dir.to_path_buf());
        Ok(DirLock {
            dir: dir.to_path_buf(),
        })
    }

    fn release(&self) {
        IN_USE.lock().retain(|d| *d != self.dir);
        let _ = std::fs::remove_file(self.dir.join("cloud.pid"));
    }
}

impl CloudServer {
    /// Opens (or creates) the cloud in `cfg.data_dir` and serves it.
    pub async fn start(cfg: CloudConfig) -> Result<CloudServer, String> {
        let dir = &cfg.data_dir;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let dir = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let lock = DirLock::acquire(&dir)?;
        let store = Store::open(&dir)?;
        let admin = store.read(|s| s.access_keys().first().cloned());
        let admin =
            admin.ok_or_else(|| format!("{}: no access key", dir.join(STATE_FILE).display()))?;
        let pki = pki::ensure(&dir, cfg.bind.ip())?;
        let tls = pki::server_config(&pki)?;
        let listener = tokio::net::TcpListener::bind(cfg.bind)
            .await
            .map_err(|e| format!("listening on {}: {e}", cfg.bind))?;
        let local_addr = listener.local_addr().map_err(|e| e.to_string())?;
        let host = if local_addr.ip().is_unspecified() {
            "127.0.0.1".to_owned()
        } else if local_addr.is_ipv6() {
            format!("[{}]", local_addr.ip())
        } else {
            local_addr.ip().to_string()
        };
        let url = format!("https://{host}:{}", local_addr.port());
        let credentials_file = dir.join(pki::CREDENTIALS_FILE);
        let creds = CredentialsFile {
            access_key_id: admin.id.clone(),
            secret_access_key: admin.secret.clone(),
        };
        crate::state::write_atomic(
            &credentials_file,
            &serde_json::to_vec_pretty(&creds).map_err(|e| e.to_string())?,
        )?;
        let ca_file = dir.join(pki::CA_FILE);
        let endpoint_file = dir.join(pki::ENDPOINT_FILE);
        let ep = EndpointFile {
            url: url.clone(),
            ca_file: ca_file.clone(),
            region: REGION.to_owned(),
        };
        crate::state::write_atomic(
            &endpoint_file,
            &serde_json::to_vec_pretty(&ep).map_err(|e| e.to_string())?,
        )?;

        let inner = Arc::new(Inner {
            store,
            data_dir: dir.clone(),
            hypervisor: cfg.hypervisor.clone(),
            transition_delay: cfg.transition_delay,
            tasks: parking_lot::Mutex::new(JoinSet::new()),
            locks: parking_lot::Mutex::new(HashMap::new()),
        });
        resume(&inner);
        {
            // The network follows the route table and the load balancers: whatever changed
            // them (an API call, an instance terminated, a health check), the next look
            // programs the difference.
            let (inner2, network) = (inner.clone(), cfg.network.clone());
            let probes = network.probes();
            if probes {
                inner.store.read(|s| s.probe_targets());
            }
            inner.tasks.lock().spawn(async move {
                let mut carried: Option<Vec<crate::network::NextHop>> = None;
                let mut balanced: Option<Vec<crate::network::LbRoute>> = None;
                let mut last_error = String::new();
                let mut checked: HashMap<(String, String), std::time::Instant> = HashMap::new();
                loop {
                    let hops = inner2.store.read(|s| s.next_hops());
                    if carried.as_ref() != Some(&hops) {
                        match network.set_routes(&hops).await {
                            Ok(()) => carried = Some(hops),
                            Err(e) if e != last_error => {
                                tracing::warn!("cloud: programming the VPC's routes: {e}");
                                last_error = e;
                            }
                            Err(_) => {}
                        }
                    }
                    if probes {
                        health_checks(&inner2, network.as_ref(), &mut checked).await;
                    }
                    let lbs = inner2.store.read(|s| s.lb_routes());
                    if balanced.as_ref() != Some(&lbs) {
                        match network.set_load_balancers(&lbs).await {
                            Ok(()) => balanced = Some(lbs),
                            Err(e) if e != last_error => {
                                tracing::warn!("cloud: programming the load balancers: {e}");
                                last_error = e;
                            }
                            Err(_) => {}
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            });
        }
        let retention = cfg.terminated_retention;
        {
            let inner2 = inner.clone();
            let period = (retention / 2).clamp(Duration::from_millis(100), Duration::from_secs(30));
            inner.tasks.lock().spawn(async move {
                loop {
                    tokio::time::sleep(period).await;
                    if inner2.store.read(|s| s.has_expired(retention)) {
                        let _ = inner2
                            .store
                            .write(|s| Ok(s.purge_terminated(retention)))
                            .await;
                    }
                }
            });
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let inner2 = inner.clone();
        let accept = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let (tcp, _) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!("cloud: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let inner = inner2.clone();
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(move |req| {
                        let inner = inner.clone();
                        async move { Ok::<_, Infallible>(handle(inner, req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(CloudServer {
            local_addr,
            url,
            endpoint_file,
            credentials_file,
            ca_file,
            inner,
            accept,
            lock,
        })
    }

    /// A client with the admin access key.
    pub fn client(&self) -> Result<crate::Client, crate::Error> {
        let dir = self.endpoint_file.parent().unwrap_or(Path::new("."));
        crate::Client::from_data_dir(dir)
    }

    /// Stops serving: closes the listener and every connection, and abandons transitions
    /// in flight (the next start resumes them from the saved state).
    pub async fn shutdown(self) {
        self.accept.abort();
        let _ = self.accept.await;
        let mut tasks = std::mem::take(&mut *self.inner.tasks.lock());
        tasks.shutdown().await;
        self.lock.release();
    }

    /// Serves until the process ends.
    pub async fn wait(self) -> Result<(), String> {
        match self.accept.await {
            Ok(()) => Ok(()),
            Err(e) => Err(format!("the cloud's server stopped: {e}")),
        }
    }
}

fn instance_lock(inner: &Inner, id: &str) -> Arc<tokio::sync::Mutex<()>> {
    inner.locks.lock().entry(id.to_owned()).or_default().clone()
}

/// Runs the health checks that are due (each target every `intervalSeconds` of its load
/// balancer's check, the first at once), all at the same time, and counts their results.
async fn health_checks(
    inner: &Arc<Inner>,
    network: &dyn crate::network::Network,
    checked: &mut HashMap<(String, String), std::time::Instant>,
) {
    let now = std::time::Instant::now();
    let checks = inner.store.read(|s| s.health_checks());
    // Targets no longer registered (or no longer running) are forgotten.
    let live: std::collections::HashSet<(String, String)> = checks
        .iter()
        .map(|(lb, inst, _, _)| (lb.clone(), inst.clone()))
        .collect();
    checked.retain(|k, _| live.contains(k));
    let due: Vec<_> = checks
        .into_iter()
        .filter(|(lb, inst, _, check)| {
            checked.get(&(lb.clone(), inst.clone())).is_none_or(|t| {
                now.duration_since(*t)
                    >= Duration::from_secs(u64::from(check.interval_seconds.max(1)))
            })
        })
        .collect();
    let results = futures_util::future::join_all(due.iter().map(|(_, _, addr, check)| {
        let timeout = Duration::from_secs(u64::from(check.timeout_seconds.max(1)));
        async move {
            tokio::time::timeout(timeout, network.probe(*addr, check))
                .await
                .unwrap_or(false)
        }
    }))
    .await;
    for ((lb, inst, _, _), passed) in due.into_iter().zip(results) {
        inner.store.read(|s| s.record_probe(&lb, &inst, passed));
        checked.insert((lb, inst), now);
    }
}

/// Boots `inst` (pending → running, or → stopped when the boot fails).
fn spawn_boot(inner: &Arc<Inner>, inst: Instance) {
    let i2 = inner.clone();
    inner.tasks.lock().spawn(async move {
        let lock = instance_lock(&i2, &inst.id);
        let _g = lock.lock().await;
        if !i2.transition_delay.is_zero() {
            tokio::time::sleep(i2.transition_delay).await;
        }
        let (to, reason) = match i2.hypervisor.boot(&inst).await {
            Ok(()) => (InstanceState::Running, None),
            Err(e) => {
                tracing::warn!("cloud: booting {} failed: {e}", inst.id);
                (
                    InstanceState::Stopped,
                    Some(StateReason {
                        code: "Server.InternalError".to_owned(),
                        message: format!("Server.InternalError: the instance failed to boot: {e}"),
                    }),
                )
            }
        };
        let _ = i2
            .store
            .write(|s| Ok(s.finish_transition(&inst.id, InstanceState::Pending, to, reason)))
            .await;
    });
}

/// Halts `inst` (when `halt`), then moves it from `from` to `to`.
fn spawn_halt(
    inner: &Arc<Inner>,
    inst: Instance,
    halt: bool,
    from: InstanceState,
    to: InstanceState,
) {
    let i2 = inner.clone();
    inner.tasks.lock().spawn(async move {
        let lock = instance_lock(&i2, &inst.id);
        let _g = lock.lock().await;
        if !i2.transition_delay.is_zero() {
            tokio::time::sleep(i2.transition_delay).await;
        }
        if halt {
            if let Err(e) = i2.hypervisor.halt(&inst).await {
                tracing::warn!("cloud: halting {} failed: {e}", inst.id);
            }
        }
        let _ = i2
            .store
            .write(|s| Ok(s.finish_transition(&inst.id, from, to, None)))
            .await;
        if to == InstanceState::Terminated {
            i2.locks.lock().remove(&inst.id);
        }
    });
}

/// Resumes what the previous process left: boots running and pending instances, finishes
/// halts.
fn resume(inner: &Arc<Inner>) {
    for i in inner.store.read(|s| s.all_instances()) {
        match i.state {
            InstanceState::Pending => spawn_boot(inner, i),
            InstanceState::Running => {
                let i2 = inner.clone();
                inner.tasks.lock().spawn(async move {
                    let lock = instance_lock(&i2, &i.id);
                    let _g = lock.lock().await;
                    if let Err(e) = i2.hypervisor.boot(&i).await {
                        tracing::warn!("cloud: booting {} again failed: {e}", i.id);
                    }
                });
            }
            InstanceState::Stopping => spawn_halt(
                inner,
                i,
                true,
                InstanceState::Stopping,
                InstanceState::Stopped,
            ),
            InstanceState::ShuttingDown => spawn_halt(
                inner,
                i,
                true,
                InstanceState::ShuttingDown,
                InstanceState::Terminated,
            ),
            InstanceState::Stopped | InstanceState::Terminated => {}
        }
    }
}

type Resp = Response<Full<Bytes>>;

fn respond(status: u16, body: Vec<u8>, request_id: &str, retry_after: Option<u64>) -> Resp {
    let mut b = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .header(REQUEST_ID_HEADER, request_id);
    if let Some(s) = retry_after {
        b = b.header("retry-after", s.to_string());
    }
    b.body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn error_response(e: &ApiError, request_id: &str) -> Resp {
    let body = ErrorBody {
        error: ErrorDetail {
            code: e.code.to_owned(),
            message: e.message.clone(),
        },
        request_id: Some(request_id.to_owned()),
    };
    respond(
        e.status,
        serde_json::to_vec(&body).unwrap_or_default(),
        request_id,
        e.retry_after,
    )
}

fn ok<T: Serialize>(status: u16, v: &T, request_id: &str) -> Resp {
    match serde_json::to_vec(v) {
        Ok(b) => respond(status, b, request_id, None),
        Err(e) => error_response(&ApiError::internal(e.to_string()), request_id),
    }
}

/// Finds the route of `method` `path`: Ok((route, params)), or the 404/405 error.
pub fn route(method: &str, path: &str) -> Result<(&'static RouteSpec, Vec<String>), ApiError> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let mut path_matched = false;
    for r in ROUTES {
        let tpl: Vec<&str> = r.path.split('/').collect();
        if tpl.len() != segs.len() {
            continue;
        }
        let mut params = Vec::new();
        let matched = tpl.iter().zip(&segs).all(|(t, s)| {
            if t.starts_with('{') {
                params.push(percent_decode(s));
                !s.is_empty()
            } else {
                t == s
            }
        });
        if !matched {
            continue;
        }
        path_matched = true;
        if r.method == method {
            return Ok((r, params));
        }
    }
    if path_matched {
        Err(ApiError::new(
            405,
            codes::METHOD_NOT_ALLOWED,
            format!("The method {method} is not allowed on {path}"),
        ))
    } else {
        Err(ApiError::new(
            404,
            codes::UNKNOWN_OPERATION,
            format!("There is no operation at {method} {path}"),
        ))
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match h {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses a query string into decoded pairs.
pub fn parse_query(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| {
        use serde_json::error::Category;
        let msg = e.to_string();
        match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => ApiError::new(
                400,
                codes::MALFORMED_INPUT,
                format!("The request body is not valid JSON: {msg}"),
            ),
            Category::Data if msg.starts_with("unknown field") => ApiError::new(
                400,
                codes::UNKNOWN_PARAMETER,
                format!("Unknown parameter in the request body: {msg}"),
            ),
            Category::Data if msg.starts_with("missing field") => ApiError::new(
                400,
                codes::MISSING_PARAMETER,
                format!("A required parameter is missing: {msg}"),
            ),
            Category::Data => ApiError::invalid(format!("Invalid parameter value: {msg}")),
        }
    })
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authenticate(inner: &Inner, req: &Request<Incoming>) -> Result<(String, String), ApiError> {
    let Some(h) = req.headers().get(http::header::AUTHORIZATION) else {
        return Err(ApiError::new(
            401,
            codes::MISSING_AUTHENTICATION_TOKEN,
            "The request has no credentials: send 'Authorization: Bearer <access key id>:<secret access key>'",
        ));
    };
    let bad = || {
        ApiError::new(
            401,
            codes::AUTH_FAILURE,
            "kumo was not able to validate the provided access credentials",
        )
    };
    let token = h
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(bad)?;
    let (id, secret) = token.trim().split_once(':').ok_or_else(bad)?;
    inner.store.read(|s| {
        s.access_keys()
            .iter()
            .find(|k| k.id == id)
            .filter(|k| same(k.secret.as_bytes(), secret.as_bytes()))
            .map(|k| (k.id.clone(), k.name.clone()))
            .ok_or_else(bad)
    })
}

async fn handle(inner: Arc<Inner>, req: Request<Incoming>) -> Resp {
    let request_id = uuid::Uuid::new_v4().to_string();
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if method == Method::GET && path == "/openapi.json" {
        return ok(200, &crate::openapi::document(), &request_id);
    }
    if method == Method::GET && (path == "/healthz" || path == "/readyz") {
        return respond(200, b"{\"status\":\"ok\"}".to_vec(), &request_id, None);
    }
    let result = async {
        let (r, params) = route(method.as_str(), &path)?;
        let (credential, key_name) = authenticate(&inner, &req)?;
        if !r.control {
            if let Some(p) = inner
                .store
                .read(|s| s.denied(r.action, &credential).cloned())
            {
                return Err(ApiError::new(
                    403,
                    codes::ACCESS_DENIED,
                    format!(
                        "User: kumo:iam::access-key/{credential} is not authorized to perform: kumo:{} with an explicit deny in an identity-based policy ({})",
                        r.action, p.id
                    ),
                ));
            }
            if let Some(f) = inner.store.read(|s| s.fault_for(r.action).cloned()) {
                if f.latency_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(f.latency_ms)).await;
                }
                if f.error_rate > 0.0 && rand::rng().random::<f64>() < f.error_rate {
                    return Err(injected(&f, r.action));
                }
            }
        }
        let query = parse_query(req.uri().query());
        let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                    return Err(ApiError::new(
                        413,
                        codes::REQUEST_TOO_LARGE,
                        format!("The request body is larger than {MAX_BODY} bytes"),
                    ));
                }
                return Err(ApiError::new(
                    400,
                    codes::MALFORMED_INPUT,
                    format!("Reading the request body failed: {e}"),
                ));
            }
        };
        if r.request.is_none() && !body.iter().all(u8::is_ascii_whitespace) {
            // Refuse bodies an operation does not read, so a mistake is not ignored.
            let v: serde_json::Value = decode(&body)?;
            if v.as_object().is_none_or(|o| !o.is_empty()) {
                return Err(ApiError::new(
                    400,
                    codes::UNKNOWN_PARAMETER,
                    format!("{} takes no request body", r.operation_id),
                ));
            }
        }
        dispatch(&inner, r, &params, &query, &body, &credential, &key_name).await
    }
    .await;
    match result {
        Ok((status, v)) => {
            tracing::debug!(request_id, %method, path, status, "cloud request");
            respond(status, v, &request_id, None)
        }
        Err(e) => {
            tracing::debug!(request_id, %method, path, status = e.status, code = e.code, "cloud request failed");
            error_response(&e, &request_id)
        }
    }
}

fn injected(f: &Fault, action: &str) -> ApiError {
    match f.error_code.as_str() {
        codes::REQUEST_LIMIT_EXCEEDED => ApiError {
            status: 503,
            code: codes::REQUEST_LIMIT_EXCEEDED,
            message: format!("Request limit exceeded for {action} (injected fault)"),
            retry_after: Some(1),
        },
        codes::INTERNAL_ERROR => ApiError::internal(format!(
            "We encountered an internal error performing {action}. Please try again. (injected fault)"
        )),
        _ => ApiError {
            status: 503,
            code: codes::SERVICE_UNAVAILABLE,
            message: format!(
                "The service is unavailable for {action}. Please try again shortly. (injected fault)"
            ),
            retry_after: Some(1),
        },
    }
}

fn js<T: Serialize>(status: u16, v: &T) -> Result<(u16, Vec<u8>), ApiError> {
    serde_json::to_vec(v)
        .map(|b| (status, b))
        .map_err(|e| ApiError::internal(e.to_string()))
}

fn param(params: &[String], i: usize) -> &str {
    params.get(i).map(String::as_str).unwrap_or("")
}

fn instance_filter(query: &[(String, String)]) -> Result<InstanceFilter, ApiError> {
    let mut f = InstanceFilter::default();
    for (k, v) in query {
        match k.as_str() {
            "state" => {
                for s in v.split(',').filter(|s| !s.is_empty()) {
                    f.states.push(InstanceState::parse(s).ok_or_else(|| {
                        ApiError::invalid(format!(
                            "The filter value '{s}' for 'state' is invalid: pending, running, stopping, stopped, shutting-down or terminated"
                        ))
                    })?);
                }
            }
            "id" => f
                .ids
                .extend(v.split(',').filter(|s| !s.is_empty()).map(str::to_owned)),
            "name" => f.name = Some(v.clone()),
            "zone" => f.zone = Some(v.clone()),
            "privateIp" => f.private_ip = Some(v.clone()),
            "privateDnsName" => f.private_dns_name = Some(v.clone()),
            k if k.starts_with("tag.") && k.len() > 4 => {
                f.tags.insert(k[4..].to_owned(), v.clone());
            }
            k => {
                return Err(ApiError::invalid(format!(
                    "The filter '{k}' is invalid: state, id, name, zone, privateIp, privateDnsName or tag.KEY"
                )))
            }
        }
    }
    Ok(f)
}

fn only_query(query: &[(String, String)], allowed: &[&str]) -> Result<(), ApiError> {
    match query.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        Some((k, _)) => Err(ApiError::invalid(format!(
            "The query parameter '{k}' is not known"
        ))),
        None => Ok(()),
    }
}

fn query_value<'a>(query: &'a [(String, String)], k: &str) -> Option<&'a str> {
    query.iter().find(|(q, _)| q == k).map(|(_, v)| v.as_str())
}

async fn dispatch(
    inner: &Arc<Inner>,
    r: &RouteSpec,
    params: &[String],
    query: &[(String, String)],
    body: &[u8],
    credential: &str,
    key_name: &str,
) -> Result<(u16, Vec<u8>), ApiError> {
    let store = &inner.store;
    let id = param(params, 0);
    // Operations that declare no query parameters take none.
    if r.query.is_empty() {
        only_query(query, &[])?;
    }
    match r.operation_id {
        "DescribeRegions" => js(
            200,
            &json!({"regions": [Region {
                name: REGION.to_owned(),
                zones: ZONES.iter().map(|z| Zone { name: (*z).to_owned(), state: "available".to_owned() }).collect(),
            }]}),
        ),
        "DescribeInstanceTypes" => js(200, &json!({ "instanceTypes": instance_types() })),
        "DescribeVpcs" => js(200, &json!({ "vpcs": [store.read(|s| s.vpc())] })),
        "DescribeSubnets" => js(200, &json!({ "subnets": store.read(|s| s.subnets()) })),
        "DescribeInstances" => {
            let f = instance_filter(query)?;
            js(
                200,
                &json!({ "instances": store.read(|s| s.instances(&f)) }),
            )
        }
        "DescribeInstance" => js(200, &store.read(|s| s.instance(id).cloned())?),
        "RunInstance" => {
            let req: RunInstanceRequest = decode(body)?;
            let inst = store.write(|s| s.run_instance(req)).await?;
            spawn_boot(inner, inst.clone());
            js(201, &inst)
        }
        "StopInstance" => {
            let _: StopInstanceRequest = decode(body)?;
            let (inst, halt) = store.write(|s| s.begin_stop(id)).await?;
            if halt {
                spawn_halt(
                    inner,
                    inst.clone(),
                    true,
                    InstanceState::Stopping,
                    InstanceState::Stopped,
                );
            }
            js(200, &inst)
        }
        "StartInstance" => {
            let (inst, boot) = store.write(|s| s.begin_start(id)).await?;
            if boot {
                spawn_boot(inner, inst.clone());
            }
            js(200, &inst)
        }
        "TerminateInstance" | "DeleteInstance" => {
            let (inst, started) = store.write(|s| s.begin_terminate(id)).await?;
            if let Some(halt) = started {
                spawn_halt(
                    inner,
                    inst.clone(),
                    halt,
                    InstanceState::ShuttingDown,
                    InstanceState::Terminated,
                );
            }
            js(200, &inst)
        }
        "DescribeLoadBalancers" => {
            only_query(query, &["name"])?;
            let name = query_value(query, "name");
            js(
                200,
                &json!({ "loadBalancers": store.read(|s| s.load_balancers(name)) }),
            )
        }
        "DescribeLoadBalancer" => js(200, &store.read(|s| s.load_balancer(id))?),
        "CreateLoadBalancer" => {
            let req: CreateLoadBalancerRequest = decode(body)?;
            js(201, &store.write(|s| s.create_load_balancer(req)).await?)
        }
        "UpdateLoadBalancer" => {
            let req: UpdateLoadBalancerRequest = decode(body)?;
            js(
                200,
                &store.write(|s| s.update_load_balancer(id, req)).await?,
            )
        }
        "DeleteLoadBalancer" => js(200, &store.write(|s| s.delete_load_balancer(id)).await?),
        "DescribeVolumes" => {
            let f = volume_filter(query)?;
            js(200, &json!({ "volumes": store.read(|s| s.volumes(&f)) }))
        }
        "DescribeVolume" => js(200, &store.read(|s| s.volume(id))?),
        "CreateVolume" => {
            let req: CreateVolumeRequest = decode(body)?;
            let (v, new) = store.write(|s| s.create_volume(req)).await?;
            if let Err(e) = size_volume_file(&inner.data_dir, &v.id, v.size_gib) {
                if new {
                    let _ = store.write(|s| s.delete_volume(&v.id)).await;
                }
                return Err(e);
            }
            js(if new { 201 } else { 200 }, &v)
        }
        "AttachVolume" => {
            let req: AttachVolumeRequest = decode(body)?;
            js(200, &store.write(|s| s.attach_volume(id, req)).await?)
        }
        "DetachVolume" => {
            let req: DetachVolumeRequest = decode(body)?;
            js(200, &store.write(|s| s.detach_volume(id, req)).await?)
        }
        "ModifyVolume" => {
            let req: ModifyVolumeRequest = decode(body)?;
            let v = store.write(|s| s.modify_volume(id, req)).await?;
            size_volume_file(&inner.data_dir, &v.id, v.size_gib)?;
            js(200, &v)
        }
        "DeleteVolume" => {
            let v = store.write(|s| s.delete_volume(id)).await?;
            let path = volume_file(&inner.data_dir, &v.id);
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(volume = %v.id, "cloud: removing {}: {e}", path.display());
                }
            }
            js(200, &v)
        }
        "DescribeRouteTables" => js(
            200,
            &json!({ "routeTables": store.read(|s| s.route_tables()) }),
        ),
        "DescribeRouteTable" => js(200, &store.read(|s| s.route_table(id))?),
        "DescribeRoutes" => js(
            200,
            &json!({ "routes": store.read(|s| s.route_table(id))?.routes }),
        ),
        "CreateRoute" => {
            let req: CreateRouteRequest = decode(body)?;
            js(201, &store.write(|s| s.create_route(id, req)).await?)
        }
        "DeleteRoute" => {
            only_query(query, &["destinationCidr"])?;
            let dest = query_value(query, "destinationCidr").ok_or_else(|| {
                ApiError::new(
                    400,
                    codes::MISSING_PARAMETER,
                    "The query parameter 'destinationCidr' is required",
                )
            })?;
            js(200, &store.write(|s| s.delete_route(id, dest)).await?)
        }
        "GetFaults" => js(
            200,
            &json!({ "faults": store.read(|s| s.faults().clone()) }),
        ),
        "PutFault" => {
            let f: Fault = decode(body)?;
            js(200, &store.write(|s| s.set_fault(id, f)).await?)
        }
        "DeleteFault" | "DeleteFaults" => {
            let op = (!id.is_empty()).then_some(id);
            store
                .write(|s| {
                    s.clear_faults(op);
                    Ok(())
                })
                .await?;
            js(
                200,
                &json!({ "faults": store.read(|s| s.faults().clone()) }),
            )
        }
        "GetPolicies" => js(
            200,
            &json!({ "policies": store.read(|s| s.policies().to_vec()) }),
        ),
        "CreatePolicy" => {
            let req: CreatePolicyRequest = decode(body)?;
            js(201, &store.write(|s| s.add_policy(req)).await?)
        }
        "DeletePolicy" => js(200, &store.write(|s| s.delete_policy(id)).await?),
        "DeletePolicies" => {
            only_query(query, &["action", "credential"])?;
            let action = query_value(query, "action").ok_or_else(|| {
                ApiError::new(
                    400,
                    codes::MISSING_PARAMETER,
                    "The query parameter 'action' is required",
                )
            })?;
            let cred = query_value(query, "credential");
            js(
                200,
                &json!({ "policies": store.write(|s| Ok(s.remove_policies(action, cred))).await? }),
            )
        }
        "GetQuotas" => js(200, &store.read(|s| s.quotas().clone())),
        "UpdateQuotas" => {
            let req: UpdateQuotasRequest = decode(body)?;
            js(200, &store.write(|s| Ok(s.update_quotas(req))).await?)
        }
        "ListAccessKeys" => {
            let keys: Vec<AccessKey> = store.read(|s| {
                s.access_keys()
                    .iter()
                    .map(|k| AccessKey {
                        access_key_id: k.id.clone(),
                        name: k.name.clone(),
                        secret_access_key: None,
                    })
                    .collect()
            });
            js(200, &json!({ "accessKeys": keys }))
        }
        "CreateAccessKey" => {
            let req: CreateAccessKeyRequest = decode(body)?;
            let k = store.write(|s| s.create_access_key(&req.name)).await?;
            js(
                201,
                &AccessKey {
                    access_key_id: k.id,
                    name: k.name,
                    secret_access_key: Some(k.secret),
                },
            )
        }
        "GetCallerIdentity" => js(
            200,
            &CallerIdentity {
                access_key_id: credential.to_owned(),
                name: key_name.to_owned(),
                region: REGION.to_owned(),
            },
        ),
        other => Err(ApiError::internal(format!(
            "operation {other} has no handler"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing() {
        let (r, p) = route("POST", "/v1/instances/i-0123/stop").expect("route");
        assert_eq!(r.operation_id, "StopInstance");
        assert_eq!(p, vec!["i-0123"]);
        assert_eq!(route("PUT", "/v1/instances").expect_err("405").status, 405);
        assert_eq!(route("GET", "/v2/nothing").expect_err("404").status, 404);
        let (r, p) = route("PUT", "/v1/faults/Create%4CoadBalancer").expect("route");
        assert_eq!(
            (r.operation_id, p[0].as_str()),
            ("PutFault", "CreateLoadBalancer")
        );
        assert_eq!(
            parse_query(Some("destinationCidr=10.244.1.0%2F24&a")),
            vec![
                ("destinationCidr".to_owned(), "10.244.1.0/24".to_owned()),
                ("a".to_owned(), String::new())
            ]
        );
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn every_operation_is_unique() {
        let mut ids: Vec<&str> = ROUTES.iter().map(|r| r.operation_id).collect();
        ids.sort_unstable();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }
}
