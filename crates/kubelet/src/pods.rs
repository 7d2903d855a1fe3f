//! Pod workers: the pods bound to this node (watched by `spec.nodeName`) and the static
//! pods are run on the runtime — sandbox, init containers in order, then containers —
//! restarted by restartPolicy with CrashLoopBackOff (10 s doubling to 300 s), reported in
//! pods/status with upstream's phases, conditions and container states, and finished when
//! deleted (containers stopped, then the pod deleted with grace period 0). Static pods get
//! a mirror pod, recreated when deleted and replaced when the manifest changes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::TypeMeta;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::{json, Value};

use crate::events::Record;
use crate::prober::{self, Kind, Outcome, Prober};
use crate::static_pods::{self, CONFIG_HASH, CONFIG_MIRROR};
use crate::{KubeletConfig, Result};
use kumo_cri::{Runtime, State};

const BACKOFF_START: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// How soon a container whose config could not be made is tried again (upstream's pod
/// worker back-off period).
const CONFIG_ERROR_RETRY: Duration = Duration::from_secs(10);

fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// One container the worker runs.
#[derive(Default)]
struct Container {
    id: Option<String>,
    image_ref: String,
    restart_count: u32,
    /// The last exit, for lastState.
    last: Option<Value>,
    /// No restart before this instant (CrashLoopBackOff / ImagePullBackOff).
    backoff_until: Option<Instant>,
    backoff: Duration,
    waiting: Option<(String, String)>,
    /// The resources the runtime applied to the running container (see [`resources_of`]).
    applied: Option<[Option<u64>; 4]>,
    /// The running container was told to stop (its exit may take the grace period).
    stop_requested: bool,
    /// While the pod terminates: when the container is told to stop (after its preStop
    /// hook).
    stop_at: Option<Instant>,
    /// The user was told the simulated runtime cannot run its command.
    told_not_simulated: bool,
    /// Being created and started in the background (a slow runtime's).
    starting: Option<std::sync::mpsc::Receiver<Launch>>,
}

/// How a container created and started in the background came out.
enum Launch {
    Running(String),
    /// CreateContainer failed.
    NotCreated(kumo_cri::RuntimeError),
    /// Created, but StartContainer failed (the container stays with its sandbox).
    NotStarted(kumo_cri::RuntimeError),
}

/// A container spec's CPU request and limit (millicores) and memory request and limit
/// (bytes): what an in-place resize changes.
fn resources_of(spec: &Value) -> [Option<u64>; 4] {
    let q = |p: &str, milli: bool| {
        spec.pointer(p)
            .and_then(Value::as_str)
            .and_then(kumo_apimachinery::quantity::Quantity::parse)
            .map(|q| if milli { q.milli_value() } else { q.value() }.max(0) as u64)
    };
    [
        q("/resources/requests/cpu", true),
        q("/resources/limits/cpu", true),
        q("/resources/requests/memory", false),
        q("/resources/limits/memory", false),
    ]
}

/// Whether the container's resizePolicy restarts it when `resource` changes.
fn resize_restarts(spec: &Value, resource: &str) -> bool {
    spec.get("resizePolicy")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|p| s(p, "/resourceName") == resource && s(p, "/restartPolicy") == "RestartContainer")
}

/// A pod bound to this node as the watch last delivered it: passes read its uid and
/// resourceVersion, and parse the JSON only to sync it. (A simulated fleet holds a hundred
/// thousand pods; as typed structs or JSON trees each would take ten times its text.)
struct Bound {
    resource_version: String,
    /// A mirror pod (it stands for a static pod; it is not run).
    mirror: bool,
    json: Arc<str>,
    /// Set by a pass that found the pod steady with the runtime vouching for its
    /// containers: until then passes skip it without looking up its worker. A new version
    /// from the watch replaces the entry, and with it this.
    quiet: Option<Instant>,
}

impl Bound {
    /// The uid and the kept form of a watched pod, without its managedFields (which the
    /// kubelet never reads).
    fn new(mut pod: DynamicObject) -> Option<(Arc<str>, Bound)> {
        let uid = pod.metadata.uid.clone()?;
        pod.metadata.managed_fields = None;
        pod.types = Some(TypeMeta {
            api_version: "v1".into(),
            kind: "Pod".into(),
        });
        let json = serde_json::to_string(&pod).ok()?;
        let bound = Bound {
            resource_version: pod.metadata.resource_version.unwrap_or_default(),
            mirror: pod
                .metadata
                .annotations
                .is_some_and(|a| a.contains_key(CONFIG_MIRROR)),
            json: json.into(),
            quiet: None,
        };
        Some((uid.into(), bound))
    }
}

/// How often `FailedMount` events repeat while a pod's volumes cannot be set up.
const MOUNT_EVENT_INTERVAL: Duration = Duration::from_secs(10);

/// What the kubelet keeps of one pod.
struct Worker {
    sandbox: Option<String>,
    /// When a sandbox that failed is tried again.
    sandbox_retry: Option<Instant>,
    /// A sandbox being made in the background (a slow runtime's).
    sandbox_pending: Option<SandboxPending>,
    ip: Option<String>,
    start_time: String,
    started: Instant,
    /// activeDeadlineSeconds ran out: the pod failed.
    deadline_exceeded: bool,
    containers: BTreeMap<String, Container>,
    init_done: bool,
    /// The status last written (as JSON text, a tenth of its tree) and when, to write only
    /// changes.
    written: Option<(String, Instant)>,
    /// Set when a pass found nothing to do for the pod: until the pod or one of its
    /// containers changes, or the resync period ends, passes skip it (upstream's pod
    /// workers sync on pod updates, PLEG events and every syncFrequency, not on a timer).
    steady: Option<Steady>,
    /// When `FailedMount` events were last posted (they repeat while volumes fail).
    mount_failed_at: Option<Instant>,
    /// The pod is being deleted: whatever runs at this instant is killed.
    terminating: Option<Instant>,
}

/// What a pod with nothing to do looked like.
struct Steady {
    resource_version: String,
    /// restartPolicy Never: an exited container is final.
    never: bool,
    states: Vec<State>,
    until: Instant,
    /// The runtime vouched that no container changes before `until`: the states need no
    /// reading until then.
    quiet: bool,
}

/// How long a status written but not yet seen back through the watch goes before it is
/// written again (upstream's status manager reconciles every 10 s).
const STATUS_RECONCILE: Duration = Duration::from_secs(10);

/// What a sandbox made in the background answers: its id and the runtime's address for it.
type SandboxPending =
    std::sync::mpsc::Receiver<Result<(String, Option<std::net::IpAddr>), kumo_cri::RuntimeError>>;

/// How long after a sandbox failed to be created the kubelet tries again.
const SANDBOX_RETRY: Duration = Duration::from_secs(5);

/// How long a deleted mirror pod stays away before the kubelet creates its replacement.
const MIRROR_RECREATE_DELAY: Duration = Duration::from_secs(1);
/// How long a steady pod goes without a sync (upstream's syncFrequency).
const RESYNC: Duration = Duration::from_secs(60);

/// The pod workers of a node.
struct Workers {
    client: Client,
    cfg: Arc<KubeletConfig>,
    runtime: Arc<dyn Runtime>,
    /// The Node's uid, once registered (empty before).
    node_uid: String,
    workers: HashMap<String, Worker>,
    /// The pod network (it gives the pods their addresses).
    network: Arc<dyn kumo_cri::PodNetwork>,
    /// Starts a pass at once (a sandbox made in the background is ready).
    wake: Arc<tokio::sync::Notify>,
    /// The node's spec.podCIDR was read (and handed to the pod network).
    pod_cidr_known: bool,
    /// Images pulled on this node (for "already present on machine").
    pulled: std::collections::HashSet<String>,
    /// What each pod's environment refers to (see `env`), by pod uid.
    sources: HashMap<String, Value>,
    /// The network probes' workers.
    prober: Prober,
    /// Pods the last pass found quiet: uid, resourceVersion, until when.
    quiet_found: Vec<(String, String, Instant)>,
    /// The API pods admitted to run here (what the next admission counts), by uid.
    admitted: HashMap<String, Pod>,
    /// The Node as admission last read it, and when.
    node_seen: Option<(Instant, Node)>,
    /// Mirror pods this kubelet deleted to replace them, and when.
    mirrors_deleted: HashMap<(String, String), Instant>,
    /// The pods' persistent volumes and the node's CSI drivers.
    volumes: Arc<crate::csi::Volumes>,
}

/// The waiting reason of a container the runtime could not create: a configuration it
/// cannot make (a subPath leaving its volume) is CreateContainerConfigError, as upstream.
fn create_error_reason(e: &kumo_cri::RuntimeError) -> &'static str {
    match e {
        kumo_cri::RuntimeError::Config(_) => "CreateContainerConfigError",
        _ => "CreateContainerError",
    }
}

fn parse_cidr(c: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, len) = c.split_once('/')?;
    Some((ip.parse().ok()?, len.parse().ok()?))
}

/// A Warning on the Node for a manifest in the static pod path that was skipped. Upstream
/// only logs it; an event lets `kubectl describe node` show why a static pod is missing.
/// The reason is the one upstream's pod config gives pods it ignores.
fn rejected_manifest_event(node: &str, uid: &str, r: static_pods::Rejected) -> Record {
    Record {
        kind: "Node",
        namespace: String::new(),
        name: node.to_owned(),
        uid: uid.to_owned(),
        field_path: None,
        warning: true,
        reason: "FailedValidation".into(),
        message: format!(
            "Could not process manifest file {:?}: {}, ignoring",
            r.path, r.error
        ),
    }
}

/// Runs the pod workers until the process ends.
pub async fn run(
    client: Client,
    cfg: Arc<KubeletConfig>,
    runtime: Arc<dyn Runtime>,
    network: Arc<dyn kumo_cri::PodNetwork>,
    node_uid: tokio::sync::watch::Receiver<Option<String>>,
    mut statics: static_pods::Source,
    volumes: Arc<crate::csi::Volumes>,
) -> Result<()> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<Pod>(&()));
    let selector = format!("spec.nodeName={}", cfg.node_name);
    let wake = Arc::new(tokio::sync::Notify::new());
    statics.watch_files(wake.clone());
    let bound: Arc<Mutex<HashMap<Arc<str>, Bound>>> = Arc::default();
    // Lists read the watch cache (`resourceVersion=0`), as client-go's reflectors do. Not
    // paged: kube-rs leaves `resourceVersion=0` out of a list with a limit, which makes it a
    // consistent read (and the cache answers `0` whole anyway).
    let mut config = watcher::Config::default().fields(&selector).any_semantic();
    config.page_size = None;
    let stream = watcher(api, config).default_backoff();
    let (notify, pods) = (wake.clone(), bound.clone());
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut listing: Option<HashMap<Arc<str>, Bound>> = None;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Init) => listing = Some(HashMap::new()),
                Ok(watcher::Event::InitApply(p)) => {
                    if let Some((uid, b)) = Bound::new(p) {
                        listing.get_or_insert_with(HashMap::new).insert(uid, b);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    *pods.lock().unwrap_or_else(|e| e.into_inner()) =
                        listing.take().unwrap_or_default();
                }
                Ok(watcher::Event::Apply(p)) => {
                    if let Some((uid, b)) = Bound::new(p) {
                        pods.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(uid, b);
                    }
                }
                Ok(watcher::Event::Delete(p)) => {
                    if let Some(uid) = p.metadata.uid {
                        pods.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(uid.as_str());
                    }
                }
                Err(e) => tracing::debug!(error = %e, "pod watch"),
            }
            notify.notify_one();
        }
    });
    let prober = Prober::new(
        client.clone(),
        cfg.node_name.clone(),
        runtime.clone(),
        network.clone(),
        cfg.node_ip.into_iter().collect(),
        wake.clone(),
    );
    // The kubelet's --pod-cidr until the Node has a spec.podCIDR. Not to a real runtime:
    // containerd renders its CNI configuration once, from the first range it is handed,
    // so it gets only the Node's (pods wait for it, as upstream's until the network is
    // ready).
    if !network.real() {
        network.set_pod_cidr(&cfg.pod_cidr);
    }
    let mut w = Workers {
        client,
        prober,
        network,
        wake: wake.clone(),
        pod_cidr_known: false,
        cfg,
        runtime,
        node_uid: String::new(),
        workers: HashMap::new(),
        pulled: std::collections::HashSet::new(),
        sources: HashMap::new(),
        quiet_found: Vec::new(),
        admitted: HashMap::new(),
        node_seen: None,
        mirrors_deleted: HashMap::new(),
        volumes,
    };
    let mut last_node_read = None::<Instant>;
    loop {
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        if w.node_uid.is_empty() {
            if let Some(uid) = node_uid.borrow().as_ref() {
                w.node_uid = uid.clone();
            }
        }
        // The pod range is read until the node has one (spec.podCIDR never changes once set).
        let every = if w.network.real() {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(10)
        };
        if !w.pod_cidr_known && last_node_read.is_none_or(|t: Instant| t.elapsed() > every) {
            last_node_read = Some(Instant::now());
            w.read_pod_cidr().await;
        }
        let rejected = statics.rescan(false);
        if !rejected.is_empty() {
            let records = rejected
                .into_iter()
                .map(|r| rejected_manifest_event(&w.cfg.node_name, &w.node_uid, r))
                .collect();
            crate::events::emit(&w.client, &w.cfg.node_name, records);
        }
        // Steady pods are passed over (quiet ones without a lookup, the others by uid and
        // resourceVersion); the others are parsed.
        let mut steady = Vec::new();
        let now = Instant::now();
        let texts: Vec<Arc<str>> = {
            let mut pods = bound.lock().unwrap_or_else(|e| e.into_inner());
            for (uid, rv, until) in w.quiet_found.drain(..) {
                if let Some(b) = pods.get_mut(uid.as_str()) {
                    if b.resource_version == rv {
                        b.quiet = Some(until);
                    }
                }
            }
            pods.iter()
                .filter(|(uid, b)| {
                    let skip = !b.mirror
                        && (b.quiet.is_some_and(|t| now < t)
                            || w.is_steady(uid, &b.resource_version));
                    if skip {
                        steady.push(Arc::clone(uid));
                    }
                    !skip
                })
                .map(|(_, b)| b.json.clone())
                .collect()
        };
        let api_pods: Vec<Value> = texts
            .iter()
            .filter_map(|t| serde_json::from_str(t).ok())
            .collect();
        w.sync(&api_pods, &steady, &statics.pods()).await;
    }
}

impl Workers {
    async fn read_pod_cidr(&mut self) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        if let Ok(n) = nodes.get(&self.cfg.node_name).await {
            if let Some(c) = n.spec.and_then(|s| s.pod_cidr) {
                if parse_cidr(&c).is_some() {
                    self.network.set_pod_cidr(&c);
                    self.pod_cidr_known = true;
                }
            }
        }
    }

    fn host_ip(&self) -> String {
        self.cfg
            .node_ip
            .map(|i| i.to_string())
            .unwrap_or_else(|| "127.0.0.1".into())
    }

    /// The address of a new pod's sandbox: the pod network's (CNI ADD).
    fn allocate_ip(&mut self, uid: &str) -> String {
        match self.network.set_up(uid) {
            Ok(ip) => ip.to_string(),
            Err(e) => {
                tracing::warn!(pod = uid, error = %e, "setting up the pod's network");
                String::new()
            }
        }
    }

    /// One pass over the node's pods: `api_pods` to sync, `steady` (uids, each with a
    /// worker) to keep as they are.
    async fn sync(&mut self, api_pods: &[Value], steady: &[Arc<str>], statics: &[Value]) {
        let pods_api: Api<Pod> = Api::all(self.client.clone());
        // Mirror pods are not run; they stand for static pods.
        let mirrors: HashMap<(String, String), &Value> = api_pods
            .iter()
            .filter(|p| {
                p.pointer("/metadata/annotations")
                    .and_then(|a| a.get(CONFIG_MIRROR))
                    .is_some()
            })
            .map(|p| {
                (
                    (
                        s(p, "/metadata/namespace").to_owned(),
                        s(p, "/metadata/name").to_owned(),
                    ),
                    p,
                )
            })
            .collect();
        let mut desired: Vec<(&Value, bool)> = api_pods
            .iter()
            .filter(|p| {
                p.pointer("/metadata/annotations")
                    .and_then(|a| a.get(CONFIG_MIRROR))
                    .is_none()
            })
            .map(|p| (p, false))
            .collect();
        desired.extend(statics.iter().map(|p| (p, true)));
        // Workers of pods neither steady nor desired below are stopped.
        let mut keep: HashSet<String> = HashSet::new();
        for &(pod, is_static) in &desired {
            let uid = s(pod, "/metadata/uid").to_owned();
            let ns = s(pod, "/metadata/namespace").to_owned();
            let name = s(pod, "/metadata/name").to_owned();
            if !is_static
                && pod
                    .pointer("/metadata/deletionTimestamp")
                    .is_some_and(|v| !v.is_null())
            {
                // Its containers get the grace period to stop; the pod goes once they
                // have (or the period is over).
                if self.workers.contains_key(&uid) && !self.terminate(&uid, pod) {
                    keep.insert(uid.clone());
                    continue;
                }
                let last = self.final_status(&uid, pod);
                self.kill(&uid);
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                // The final status goes before the pod is let go: a finalizer (a Job's
                // job-tracking) holds the pod until its controller has seen it terminal.
                if let Some(st) = last {
                    if let Err(e) = api
                        .patch_status(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": st})),
                        )
                        .await
                    {
                        tracing::debug!(namespace = %ns, pod = %name, error = %e, "final status of a deleted pod");
                    }
                }
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid.clone()),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                if let Err(e) = api.delete(&name, &dp).await {
                    tracing::debug!(namespace = %ns, pod = %name, error = %e, "deleting a terminated pod");
                }
                continue;
            }
            if !is_static && !self.workers.contains_key(&uid) {
                // A terminal pod is not run again; a new one is admitted first.
                let phase = pod.pointer("/status/phase").and_then(Value::as_str);
                if matches!(phase, Some("Succeeded" | "Failed")) {
                    self.admitted.remove(&uid);
                    continue;
                }
                if let Err(r) = self.admit(&uid, pod).await {
                    self.reject(pod, r).await;
                    continue;
                }
            }
            keep.insert(uid.clone());
            // What the containers' environment refers to (ConfigMaps, Secrets), read once
            // per pod.
            // (again every few seconds for pods with ConfigMap, Secret or downward API
            // volumes, whose files follow their sources)
            if self
                .sources
                .get(&uid)
                .is_none_or(|s| crate::env::sources_stale(pod, s))
            {
                let mut src = crate::env::sources(
                    &self.client,
                    pod,
                    self.sources.get(&uid),
                    &self.host_ip(),
                    &self.cfg.cpu,
                    &self.cfg.memory,
                )
                .await;
                src["clusterDNS"] = serde_json::json!(self.cfg.cluster_dns);
                // Its claims' volumes, mounted (or why not yet).
                src[crate::csi::DISKS] = self.volumes.mount(pod).await;
                self.sources.insert(uid.clone(), src);
            }
            let prepared =
                crate::env::with_sources(pod, self.sources.get(&uid).unwrap_or(&Value::Null));
            let status = self.run_pod(&prepared);
            // A static pod reports through its mirror pod.
            let (target_ns, target_name, current) = if is_static {
                let hash = pod
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(CONFIG_HASH))
                    .cloned();
                match mirrors.get(&(ns.clone(), name.clone())) {
                    Some(m)
                        if m.pointer("/metadata/annotations")
                            .and_then(|a| a.get(CONFIG_MIRROR))
                            .cloned()
                            == hash
                            && m.pointer("/metadata/deletionTimestamp")
                                .is_none_or(Value::is_null) =>
                    {
                        (ns.clone(), name.clone(), Some(*m))
                    }
                    _ => continue,
                }
            } else {
                (ns.clone(), name.clone(), Some(pod))
            };
            let merged = merge_conditions(current.and_then(|c| c.get("status")), status);
            let text = serde_json::to_string(&merged).unwrap_or_default();
            let worker = self.workers.get(&uid);
            let written = worker
                .and_then(|w| w.written.as_ref())
                .filter(|(t, _)| *t == text)
                .map(|(_, at)| *at);
            let unchanged = written.is_some()
                && current
                    .and_then(|c| c.get("status"))
                    .is_some_and(|st| same_status(st, &merged));
            // Written already, and the watch has not brought it back yet: not again until
            // the reconcile period passes (upstream's status manager compares with what it
            // sent, and reconciles with the API's copy every 10 s). Writing on every pass
            // instead multiplied the patches by the watch's delay under load.
            if !unchanged && written.is_some_and(|at| at.elapsed() < STATUS_RECONCILE) {
                continue;
            }
            if unchanged {
                if !is_static {
                    let steady = self.steady_states(&uid, pod).map(|(never, states)| {
                        let resync = Instant::now() + RESYNC;
                        let quiet = self.quiet_until(&uid);
                        Steady {
                            resource_version: s(pod, "/metadata/resourceVersion").to_owned(),
                            never,
                            states,
                            until: quiet.map_or(resync, |q| q.min(resync)),
                            quiet: quiet.is_some(),
                        }
                    });
                    if let Some(st) = steady.as_ref().filter(|st| st.quiet) {
                        let found = (uid.clone(), st.resource_version.clone(), st.until);
                        self.quiet_found.push(found);
                    }
                    if let Some(w) = self.workers.get_mut(&uid) {
                        w.steady = steady;
                    }
                }
                continue;
            }
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &target_ns);
            match api
                .patch_status(
                    &target_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": merged})),
                )
                .await
            {
                Ok(_) => {
                    if let Some(w) = self.workers.get_mut(&uid) {
                        w.written = Some((text, Instant::now()));
                    }
                }
                Err(e) => {
                    tracing::debug!(namespace = %target_ns, pod = %target_name, error = %e, "status update")
                }
            }
        }
        // Every worker is kept or steady, unless some are counted by neither (the common
        // case checked without hashing each steady uid).
        let kept = keep
            .iter()
            .filter(|u| self.workers.contains_key(u.as_str()))
            .count();
        let gone: Vec<String> = if kept + steady.len() < self.workers.len() {
            let steady: HashSet<&str> = steady.iter().map(|u| &**u).collect();
            self.workers
                .keys()
                .filter(|u| !keep.contains(*u) && !steady.contains(u.as_str()))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        for uid in gone {
            self.kill(&uid);
        }
        // Mirror pods belong to the Node: made once it is registered.
        if !self.node_uid.is_empty() {
            self.sync_mirrors(&pods_api, &mirrors, statics).await;
        }
    }

    /// Whether restartPolicy is Never, and the states of the pod's containers, when the pod
    /// cannot change by itself: every container started and running (or, with restartPolicy
    /// Never, exited), no probes, deadline, termination, or projected volumes (whose files
    /// follow their sources). `None` otherwise.
    fn steady_states(&self, uid: &str, pod: &Value) -> Option<(bool, Vec<State>)> {
        let w = self.workers.get(uid)?;
        let spec = pod.get("spec")?;
        let never = spec.get("restartPolicy").and_then(Value::as_str) == Some("Never");
        let probed = spec
            .get("containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| {
                ["readinessProbe", "livenessProbe", "startupProbe"]
                    .iter()
                    .any(|p| c.get(p).is_some_and(|v| !v.is_null()))
            });
        if probed
            || spec
                .get("activeDeadlineSeconds")
                .is_some_and(|v| !v.is_null())
            || pod
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|v| !v.is_null())
            || !w.init_done
            || !self.sources.contains_key(uid)
            || crate::env::has_projected_volumes(pod)
        {
            return None;
        }
        Some((never, self.container_states(w, never)?))
    }

    /// The runtime states of a worker's containers, while each is running (or, with `never`,
    /// exited).
    fn container_states(&self, w: &Worker, never: bool) -> Option<Vec<State>> {
        if w.containers.is_empty() {
            return None;
        }
        w.containers
            .values()
            .map(|c| self.settled_state(c, never))
            .collect()
    }

    /// A container's state while it is running (or, with `never`, exited).
    fn settled_state(&self, c: &Container, never: bool) -> Option<State> {
        let state = self.runtime.container_state(c.id.as_deref()?).ok()?;
        match state {
            State::Running { .. } => Some(state),
            State::Exited { .. } if never => Some(state),
            _ => None,
        }
    }

    /// Until when none of the worker's containers changes by itself, when the runtime can
    /// tell for each of them.
    fn quiet_until(&self, uid: &str) -> Option<Instant> {
        let w = self.workers.get(uid)?;
        let mut until: Option<SystemTime> = None;
        for c in w.containers.values() {
            let t = self.runtime.steady_until(c.id.as_deref()?)?;
            until = Some(until.map_or(t, |u| u.min(t)));
        }
        let left = until?.duration_since(SystemTime::now()).unwrap_or_default();
        Some(Instant::now() + left)
    }

    /// Whether the pod, at `resource_version`, is as a pass last left it with nothing to do.
    /// Asked of every pod each second: allocates nothing, and reads no container state
    /// while the runtime vouched for them.
    fn is_steady(&self, uid: &str, resource_version: &str) -> bool {
        let Some(w) = self.workers.get(uid) else {
            return false;
        };
        let Some(steady) = w.steady.as_ref() else {
            return false;
        };
        Instant::now() < steady.until
            && steady.resource_version == resource_version
            && (steady.quiet
                || w.containers.len() == steady.states.len()
                    && w.containers.values().zip(&steady.states).all(|(c, want)| {
                        self.settled_state(c, steady.never).as_ref() == Some(want)
                    }))
    }

    /// Creates missing mirror pods, replaces outdated or deleted ones, deletes orphans.
    async fn sync_mirrors(
        &mut self,
        _all: &Api<Pod>,
        mirrors: &HashMap<(String, String), &Value>,
        statics: &[Value],
    ) {
        let mut wanted = std::collections::HashSet::new();
        for pod in statics {
            let ns = s(pod, "/metadata/namespace").to_owned();
            let name = s(pod, "/metadata/name").to_owned();
            wanted.insert((ns.clone(), name.clone()));
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let hash = pod
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(CONFIG_HASH))
                .cloned();
            if let Some(m) = mirrors.get(&(ns.clone(), name.clone())) {
                let current = m
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(CONFIG_MIRROR))
                    .cloned()
                    == hash
                    && m.pointer("/metadata/deletionTimestamp")
                        .is_none_or(Value::is_null);
                if current {
                    continue;
                }
                delete_now(&api, &name, s(m, "/metadata/uid")).await;
                self.mirrors_deleted.insert((ns, name), Instant::now());
                continue;
            }
            // A replacement waits a moment after the deletion: `kubectl delete` reads the
            // pod, then lists by name and waits for its DELETED event. A new pod of the same
            // name created in between would hide that deletion, and the wait would not end.
            if self
                .mirrors_deleted
                .get(&(ns.clone(), name.clone()))
                .is_some_and(|at| at.elapsed() < MIRROR_RECREATE_DELAY)
            {
                continue;
            }
            self.mirrors_deleted.remove(&(ns.clone(), name.clone()));
            let mirror = static_pods::mirror_of(pod, &self.cfg.node_name, &self.node_uid);
            match serde_json::from_value::<Pod>(mirror) {
                Ok(p) => {
                    if let Err(e) = api.create(&PostParams::default(), &p).await {
                        tracing::warn!(namespace = %ns, pod = %name, error = %e, "failed creating a mirror pod");
                    }
                }
                Err(e) => tracing::warn!(pod = %name, error = %e, "mirror pod"),
            }
        }
        for ((ns, name), m) in mirrors {
            if !wanted.contains(&(ns.clone(), name.clone())) {
                let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                delete_now(&api, name, s(m, "/metadata/uid")).await;
            }
        }
    }

    /// Advances the termination of a pod being deleted, as upstream's killPod: each
    /// running container gets a `Killing` event and its preStop hook, then is told to stop
    /// once the hook is done, with what is left of the grace period; the sidecars are
    /// stopped after the containers have exited, the last first. Whatever still runs when
    /// the period is over is killed. True once no container runs.
    fn terminate(&mut self, uid: &str, pod: &Value) -> bool {
        let runtime = self.runtime.clone();
        let network = self.prober.network();
        let Some(w) = self.workers.get_mut(uid) else {
            return true;
        };
        let now = Instant::now();
        let mut events = Vec::new();
        let specs: Vec<(Value, bool)> = [
            "/spec/containers",
            "/spec/ephemeralContainers",
            "/spec/initContainers",
        ]
        .iter()
        .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
        .flatten()
        .map(|c| (c.clone(), is_sidecar(c)))
        .collect();
        let running = |w: &Worker, name: &str| {
            w.containers
                .get(name)
                .and_then(|c| c.id.as_deref())
                .is_some_and(|id| matches!(runtime.container_state(id), Ok(State::Running { .. })))
        };
        let deadline = *w.terminating.get_or_insert_with(|| now + grace_period(pod));
        let pod_ip = w.ip.clone().unwrap_or_default();
        // The containers first, then the sidecars in reverse order, each after the later
        // ones exited.
        let mains_running = specs
            .iter()
            .any(|(c, sidecar)| !sidecar && running(w, s(c, "/name")));
        let mut order: Vec<&Value> = specs.iter().filter(|(_, sc)| !sc).map(|(c, _)| c).collect();
        if !mains_running {
            if let Some(last) = specs
                .iter()
                .filter(|(c, sc)| *sc && running(w, s(c, "/name")))
                .map(|(c, _)| c)
                .next_back()
            {
                order.push(last);
            }
        }
        for spec in order {
            let name = s(spec, "/name").to_owned();
            if !running(w, &name) {
                continue;
            }
            let Some(c) = w.containers.get_mut(&name) else {
                continue;
            };
            let Some(id) = c.id.clone() else { continue };
            if c.stop_at.is_none() {
                let init = is_sidecar(spec);
                events.push(Record::container(
                    pod,
                    &name,
                    init,
                    false,
                    "Killing",
                    format!("Stopping container {name}"),
                ));
                // The preStop hook runs before the container is told to stop, within
                // the grace period.
                let mut hook_took = Duration::ZERO;
                if let Some(hook) = spec.pointer("/lifecycle/preStop") {
                    match crate::lifecycle::run(&*runtime, &*network, pod, spec, &id, &pod_ip, hook)
                    {
                        Ok(took) => hook_took = took,
                        Err(e) => {
                            tracing::info!(container = %name, error = %e, "PreStop hook failed");
                            events.push(Record::container(
                                pod,
                                &name,
                                init,
                                true,
                                "FailedPreStopHook",
                                "PreStopHook failed".into(),
                            ));
                        }
                    }
                }
                c.stop_at = Some((now + hook_took).min(deadline));
            }
            if !c.stop_requested && c.stop_at.is_some_and(|t| now >= t) {
                c.stop_requested = true;
                let _ = runtime.stop_container(&id, deadline.saturating_duration_since(now));
            }
        }
        if !events.is_empty() {
            crate::events::emit(&self.client, &self.cfg.node_name, events);
        }
        let Some(w) = self.workers.get(uid) else {
            return true;
        };
        let left: Vec<String> = specs
            .iter()
            .map(|(c, _)| s(c, "/name").to_owned())
            .filter(|n| running(w, n))
            .collect();
        if left.is_empty() {
            return true;
        }
        if now >= deadline {
            for n in left {
                if let Some(id) = w.containers.get(&n).and_then(|c| c.id.as_deref()) {
                    let _ = runtime.kill_container(id);
                }
            }
            return true;
        }
        false
    }

    /// The final status of a pod whose containers have stopped, as upstream's kubelet
    /// reports it before the pod goes: each container that ran terminated (its exit code;
    /// `Completed` for 0, else `Error`), the phase `Succeeded` when every container exited
    /// 0 and `Failed` otherwise, not ready. `None` when the pod was already terminal or
    /// this kubelet never ran it.
    fn final_status(&mut self, uid: &str, pod: &Value) -> Option<Value> {
        let current = pod.get("status")?;
        if matches!(
            current.get("phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        ) {
            return None;
        }
        let w = self.workers.get(uid)?;
        let mut exits: HashMap<String, (i32, SystemTime, SystemTime)> = HashMap::new();
        for (name, c) in &w.containers {
            let Some(id) = &c.id else { continue };
            if let Ok(State::Exited {
                exit_code,
                started_at,
                finished_at,
            }) = self.runtime.container_state(id)
            {
                exits.insert(name.clone(), (exit_code, started_at, finished_at));
            }
        }
        let mut statuses = current
            .get("containerStatuses")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut all_zero = !statuses.is_empty();
        for st in &mut statuses {
            let name = st["name"].as_str().unwrap_or("").to_owned();
            match exits.get(&name) {
                Some(&(code, started, finished)) => {
                    st["state"] = json!({"terminated": {
                        "exitCode": code,
                        "reason": if code == 0 { "Completed" } else { "Error" },
                        "startedAt": rfc3339(started),
                        "finishedAt": rfc3339(finished),
                        "containerID": st["containerID"].clone(),
                    }});
                    all_zero &= code == 0;
                }
                None => {
                    all_zero &= st
                        .pointer("/state/terminated/exitCode")
                        .and_then(Value::as_i64)
                        == Some(0);
                }
            }
            st["ready"] = json!(false);
            st["started"] = json!(false);
        }
        let now = rfc3339(SystemTime::now());
        let not_ready = |t: &str| {
            json!({"type": t, "status": "False", "reason": "PodCompleted",
                   "lastProbeTime": null, "lastTransitionTime": now})
        };
        let new = json!({
            "phase": if all_zero { "Succeeded" } else { "Failed" },
            "containerStatuses": statuses,
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "False",
                 "lastProbeTime": null, "lastTransitionTime": now},
                not_ready("Ready"),
                not_ready("ContainersReady"),
            ],
        });
        Some(merge_conditions(Some(current), new))
    }

    /// Admits an API pod this kubelet does not run yet (see [`crate::admission`]) and
    /// counts it from then on. A pod or Node that cannot be read is admitted.
    async fn admit(
        &mut self,
        uid: &str,
        pod: &Value,
    ) -> std::result::Result<(), crate::admission::Rejection> {
        let Ok(typed) = serde_json::from_value::<Pod>(pod.clone()) else {
            return Ok(());
        };
        let others: Vec<Pod> = self
            .admitted
            .iter()
            .filter(|(u, _)| u.as_str() != uid)
            .map(|(_, p)| p.clone())
            .collect();
        // A Node read in the last moments admits; a refusal is only trusted on a Node
        // read now (a label added just before the pod must count, as with a watch).
        let cached = self
            .node_seen
            .as_ref()
            .filter(|(at, _)| at.elapsed() < Duration::from_secs(2))
            .map(|(_, n)| crate::admission::admit(&typed, n, &others, false));
        if !matches!(cached, Some(Ok(()))) {
            let nodes: Api<Node> = Api::all(self.client.clone());
            if let Ok(n) = nodes.get(&self.cfg.node_name).await {
                self.node_seen = Some((Instant::now(), n));
            }
            if let Some((_, node)) = &self.node_seen {
                crate::admission::admit(&typed, node, &others, false)?;
            }
        }
        self.admitted.insert(uid.to_owned(), typed);
        Ok(())
    }

    /// Fails a pod admission refused, as upstream's rejectPod: a Warning event with the
    /// reason, and the pod Failed with `Pod was rejected: <message>`.
    async fn reject(&mut self, pod: &Value, r: crate::admission::Rejection) {
        let (ns, name) = (s(pod, "/metadata/namespace"), s(pod, "/metadata/name"));
        tracing::info!(namespace = %ns, pod = %name, reason = %r.reason, "pod rejected");
        let status = json!({"status": {
            "phase": "Failed",
            "reason": r.reason,
            "message": format!("Pod was rejected: {}", r.message),
            "startTime": rfc3339(SystemTime::now()),
        }});
        crate::events::emit(
            &self.client,
            &self.cfg.node_name,
            vec![Record::pod(pod, true, r.reason, r.message)],
        );
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        if let Err(e) = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
        {
            tracing::debug!(namespace = %ns, pod = %name, error = %e, "status of a rejected pod");
        }
    }

    fn kill(&mut self, uid: &str) {
        self.admitted.remove(uid);
        self.sources.remove(uid);
        {
            // Its persistent volumes are unpublished (and unstaged when no other pod here
            // uses them) after its containers and sandbox are gone.
            let (volumes, uid) = (self.volumes.clone(), uid.to_owned());
            tokio::spawn(async move { volumes.release(&uid).await });
        }
        crate::podcertificate::forget(uid);
        if let Some(w) = self.workers.remove(uid) {
            for c in w.containers.values() {
                if let Some(id) = &c.id {
                    let _ = self.runtime.stop_container(id, Duration::from_secs(30));
                }
            }
            if let Some(sb) = &w.sandbox {
                self.runtime.remove_pod_sandbox(sb);
            }
            // A sandbox still being made goes once it is.
            if let Some(rx) = w.sandbox_pending {
                let runtime = self.runtime.clone();
                let _ = std::thread::Builder::new()
                    .name("sandbox-gc".into())
                    .spawn(move || {
                        if let Ok(Ok((id, _))) = rx.recv() {
                            runtime.remove_pod_sandbox(&id);
                        }
                    });
            }
            self.network.tear_down(uid);
        }
    }

    /// Takes up a sandbox the runtime made for pod `uid` (its address from the runtime's
    /// network, else the kubelet's), or reports why it could not be made, to be tried again
    /// after a pause.
    fn take_sandbox(
        &mut self,
        uid: &str,
        pod: &Value,
        host_network: bool,
        made: Result<(String, Option<std::net::IpAddr>), kumo_cri::RuntimeError>,
        events: &mut Vec<Record>,
    ) {
        match made {
            Ok((id, runtime_ip)) => {
                let ip = if host_network {
                    self.host_ip()
                } else {
                    match runtime_ip {
                        Some(ip) => ip.to_string(),
                        None => self.allocate_ip(uid),
                    }
                };
                match self.workers.get_mut(uid) {
                    Some(w) => {
                        w.ip = Some(ip);
                        w.sandbox = Some(id);
                    }
                    // The pod went while its sandbox was being made.
                    None => self.runtime.remove_pod_sandbox(&id),
                }
            }
            Err(e) => {
                tracing::warn!(pod = %uid, error = %e, "creating the pod's sandbox");
                events.push(Record {
                    kind: "Pod",
                    namespace: s(pod, "/metadata/namespace").to_owned(),
                    name: s(pod, "/metadata/name").to_owned(),
                    uid: uid.to_owned(),
                    field_path: None,
                    warning: true,
                    reason: "FailedCreatePodSandBox".into(),
                    message: format!("Failed to create pod sandbox: {e}"),
                });
                if let Some(w) = self.workers.get_mut(uid) {
                    w.sandbox_retry = Some(Instant::now() + SANDBOX_RETRY);
                }
            }
        }
    }

    /// Advances one pod (starts, restarts, observes its containers) and returns its
    /// status as the kubelet computes it.
    fn run_pod(&mut self, pod: &Value) -> Value {
        let uid = s(pod, "/metadata/uid").to_owned();
        let host_network = pod.pointer("/spec/hostNetwork").and_then(Value::as_bool) == Some(true);
        if !self.workers.contains_key(&uid) {
            self.workers.insert(
                uid.clone(),
                Worker {
                    sandbox: None,
                    sandbox_pending: None,
                    sandbox_retry: None,
                    ip: None,
                    start_time: rfc3339(SystemTime::now()),
                    started: Instant::now(),
                    deadline_exceeded: false,
                    containers: BTreeMap::new(),
                    init_done: false,
                    written: None,
                    steady: None,
                    mount_failed_at: None,
                    terminating: None,
                },
            );
        }
        let mut events = Vec::new();
        // The sandbox first (the runtime's network gives it its address, else the
        // kubelet's pod network); one that fails is tried again after a pause, the pod
        // waiting in ContainerCreating meanwhile.
        let retry_due = self.workers.get(&uid).is_some_and(|w| {
            w.sandbox.is_none()
                && w.sandbox_pending.is_none()
                && w.sandbox_retry.is_none_or(|t| Instant::now() >= t)
        });
        if retry_due {
            let config = crate::sandbox::config(pod, &self.cfg.cgroup_root, &self.cfg.cluster_dns);
            let make = {
                let runtime = self.runtime.clone();
                move || {
                    runtime.run_pod_sandbox(&config).map(|id| {
                        let ip = runtime.pod_sandbox_ip(&id);
                        (id, ip)
                    })
                }
            };
            if self.runtime.slow_sandboxes() {
                // Made in the background, many pods' at once; the pass that follows its
                // end (it wakes the loop) takes it up.
                let (tx, rx) = std::sync::mpsc::channel();
                let wake = self.wake.clone();
                let spawned = std::thread::Builder::new()
                    .name("sandbox".into())
                    .spawn(move || {
                        let _ = tx.send(make());
                        wake.notify_one();
                    });
                if spawned.is_ok() {
                    if let Some(w) = self.workers.get_mut(&uid) {
                        w.sandbox_pending = Some(rx);
                    }
                }
            } else {
                let made = make();
                self.take_sandbox(&uid, pod, host_network, made, &mut events);
            }
        }
        let finished = self
            .workers
            .get(&uid)
            .and_then(|w| w.sandbox_pending.as_ref())
            .map(|rx| rx.try_recv());
        match finished {
            Some(Ok(made)) => {
                if let Some(w) = self.workers.get_mut(&uid) {
                    w.sandbox_pending = None;
                }
                self.take_sandbox(&uid, pod, host_network, made, &mut events);
            }
            Some(Err(std::sync::mpsc::TryRecvError::Disconnected)) => {
                if let Some(w) = self.workers.get_mut(&uid) {
                    w.sandbox_pending = None;
                }
            }
            Some(Err(std::sync::mpsc::TryRecvError::Empty)) | None => {}
        }
        let annotations: BTreeMap<String, String> = pod
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let restart_policy = match s(pod, "/spec/restartPolicy") {
            "" => "Always",
            p => p,
        }
        .to_owned();
        let phase_now = s(pod, "/status/phase").to_owned();
        let runtime = self.runtime.clone();
        let Some(w) = self.workers.get_mut(&uid) else {
            return json!({});
        };
        let pulled = &mut self.pulled;
        let prober = &self.prober;
        let has_sandbox = w.sandbox.is_some();
        let sandbox = w.sandbox.clone().unwrap_or_default();
        // activeDeadlineSeconds: past it, every container is stopped and the pod fails.
        let deadline = pod
            .pointer("/spec/activeDeadlineSeconds")
            .and_then(Value::as_u64)
            .map(Duration::from_secs);
        if !w.deadline_exceeded && deadline.is_some_and(|d| w.started.elapsed() >= d) {
            w.deadline_exceeded = true;
            for c in w.containers.values() {
                if let Some(id) = &c.id {
                    let _ = runtime.stop_container(id, Duration::from_secs(0));
                }
            }
            let s = |p: &str| {
                pod.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned()
            };
            events.push(Record {
                kind: "Pod",
                namespace: s("/metadata/namespace"),
                name: s("/metadata/name"),
                uid: s("/metadata/uid"),
                field_path: None,
                warning: false,
                reason: "DeadlineExceeded".into(),
                message: "Pod was active on the node longer than the specified deadline".into(),
            });
        }
        let terminal = matches!(phase_now.as_str(), "Succeeded" | "Failed") || w.deadline_exceeded;
        let inits: Vec<Value> = pod
            .pointer("/spec/initContainers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mains: Vec<Value> = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        // What `kubectl debug` adds: run once, never restarted, never part of readiness.
        let ephemerals: Vec<Value> = pod
            .pointer("/spec/ephemeralContainers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        // Volumes are set up before any container starts; one that cannot be keeps them all
        // waiting (ContainerCreating), retried on each pass.
        let mount_failures = if w.containers.is_empty() && !terminal {
            crate::env::mount_failures(pod)
        } else {
            Vec::new()
        };
        if !mount_failures.is_empty()
            && w.mount_failed_at
                .is_none_or(|t| t.elapsed() >= MOUNT_EVENT_INTERVAL)
        {
            w.mount_failed_at = Some(Instant::now());
            for (_, message) in &mount_failures {
                events.push(Record {
                    kind: "Pod",
                    namespace: s(pod, "/metadata/namespace").to_owned(),
                    name: s(pod, "/metadata/name").to_owned(),
                    uid: uid.clone(),
                    field_path: None,
                    warning: true,
                    reason: "FailedMount".into(),
                    message: message.clone(),
                });
            }
        }
        // One container advanced by `step` with this pod's context.
        let mut run =
            |w: &mut Worker, events: &mut Vec<Record>, c: &Value, policy: &str, role: Role| {
                step(
                    &*runtime,
                    prober,
                    &sandbox,
                    w,
                    pod,
                    c,
                    &annotations,
                    policy,
                    role,
                    pulled,
                    events,
                )
            };
        let mounts_pending =
            w.containers.is_empty() && !terminal && crate::env::mounts_pending(pod);
        if !terminal && mount_failures.is_empty() && !mounts_pending && has_sandbox {
            // Init containers one at a time, each to a successful exit; a sidecar
            // (restartPolicy Always) only has to be started before the next one begins.
            if !w.init_done {
                let mut all_done = true;
                for c in &inits {
                    if is_sidecar(c) {
                        run(w, &mut events, c, "Always", Role::Sidecar);
                        if !started(&*runtime, prober, w, &annotations, c) {
                            all_done = false;
                            break;
                        }
                        continue;
                    }
                    // Init containers restart on failure, unless the pod never restarts
                    // anything.
                    let policy = if restart_policy == "Never" {
                        "Never"
                    } else {
                        "OnFailure"
                    };
                    let done = run(w, &mut events, c, policy, Role::Init);
                    if !done {
                        all_done = false;
                        break;
                    }
                }
                w.init_done = all_done;
            } else {
                // Sidecars run beside the containers, restarted whenever they exit, until
                // the containers are done for good (a Job's pod): then they are stopped,
                // the last started first.
                let finished = mains_finished(&*runtime, w, &mains, &restart_policy);
                let sidecars: Vec<&Value> = inits.iter().filter(|c| is_sidecar(c)).collect();
                if finished {
                    stop_sidecars(&*runtime, w, pod, &sidecars, &mut events);
                } else {
                    for c in sidecars {
                        run(w, &mut events, c, "Always", Role::Sidecar);
                    }
                }
            }
            if w.init_done {
                for c in &mains {
                    run(w, &mut events, c, &restart_policy, Role::Regular);
                }
                for c in &ephemerals {
                    run(w, &mut events, c, "Never", Role::Regular);
                }
            }
        }
        let status = pod_status(
            pod,
            w,
            &*runtime,
            prober,
            &inits,
            &mains,
            &ephemerals,
            &restart_policy,
            &self
                .cfg
                .node_ip
                .map(|i| i.to_string())
                .unwrap_or_else(|| "127.0.0.1".into()),
        );
        crate::events::emit(&self.client, &self.cfg.node_name, events);
        status
    }
}

/// Deletes a pod at once (grace period 0), only the incarnation with `uid`.
async fn delete_now(api: &Api<Pod>, name: &str, uid: &str) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    if let Err(e) = api.delete(name, &dp).await {
        tracing::debug!(pod = %name, error = %e, "deleting a mirror pod");
    }
}

/// What a container is to its pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// An init container: runs to a successful exit before the next one starts.
    Init,
    /// An init container with `restartPolicy: Always` (a native sidecar): started in
    /// order with the init containers, then running beside the containers.
    Sidecar,
    /// A container (or an ephemeral one).
    Regular,
}

/// Whether init container `spec` is a sidecar (`restartPolicy: Always`).
fn is_sidecar(spec: &Value) -> bool {
    s(spec, "/restartPolicy") == "Always"
}

/// Whether container `spec` of the worker runs and its startup probe (if any) passed: a
/// sidecar's condition for the next init container to start.
fn started(
    runtime: &dyn Runtime,
    prober: &Prober,
    w: &Worker,
    annotations: &BTreeMap<String, String>,
    spec: &Value,
) -> bool {
    let Some(id) = w
        .containers
        .get(s(spec, "/name"))
        .and_then(|c| c.id.as_deref())
    else {
        return false;
    };
    let Ok(State::Running { started_at }) = runtime.container_state(id) else {
        return false;
    };
    !probe_pending(spec, annotations, "startup", started_at)
        && !exec_probe_fails(runtime, id, spec, "startup", SystemTime::now())
        && (prober::network_probe(spec, Kind::Startup).is_none()
            || prober.result(id, Kind::Startup) == Some(Outcome::Success))
}

/// Whether every container of the pod has exited for good (restartPolicy Never, or
/// OnFailure and exit code 0): the pod is done once its sidecars have stopped.
fn mains_finished(
    runtime: &dyn Runtime,
    w: &Worker,
    mains: &[Value],
    restart_policy: &str,
) -> bool {
    restart_policy != "Always"
        && !mains.is_empty()
        && mains.iter().all(|spec| {
            let exited = w
                .containers
                .get(s(spec, "/name"))
                .and_then(|c| c.id.as_deref())
                .and_then(|id| runtime.container_state(id).ok());
            match exited {
                Some(State::Exited { exit_code, .. }) => {
                    restart_policy == "Never" || exit_code == 0
                }
                _ => false,
            }
        })
}

/// Stops the running sidecars of a pod whose containers are done, the last one in the
/// spec first, each once those after it have exited (upstream's termination order).
fn stop_sidecars(
    runtime: &dyn Runtime,
    w: &mut Worker,
    pod: &Value,
    sidecars: &[&Value],
    events: &mut Vec<Record>,
) {
    let grace = grace_period(pod);
    for spec in sidecars.iter().rev() {
        let name = s(spec, "/name");
        let Some(c) = w.containers.get_mut(name) else {
            continue;
        };
        let Some(id) = c.id.as_deref() else {
            continue;
        };
        if !matches!(runtime.container_state(id), Ok(State::Running { .. })) {
            continue;
        }
        if !c.stop_requested {
            c.stop_requested = true;
            events.push(Record::container(
                pod,
                name,
                true,
                false,
                "Killing",
                format!("Stopping container {name}"),
            ));
            let _ = runtime.stop_container(id, grace);
        }
        // The next one waits for this one to exit.
        return;
    }
}

/// How long a pod's containers get to stop: the deletion's grace period, else the pod's
/// `terminationGracePeriodSeconds` (30 s by default), at least 2 s as upstream's kubelet
/// gives.
fn grace_period(pod: &Value) -> Duration {
    let seconds = pod
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_u64)
        .or_else(|| {
            pod.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_u64)
        })
        .unwrap_or(30);
    Duration::from_secs(seconds.max(2))
}

/// Advances one container: pulls, creates and starts it, or restarts it after an exit as
/// `restart_policy` says (with back-off). Returns whether it exited successfully (for
/// init containers).
#[allow(clippy::too_many_arguments)]
fn step(
    runtime: &dyn Runtime,
    prober: &Prober,
    sandbox: &str,
    w: &mut Worker,
    pod: &Value,
    spec: &Value,
    annotations: &BTreeMap<String, String>,
    restart_policy: &str,
    role: Role,
    pulled: &mut std::collections::HashSet<String>,
    events: &mut Vec<Record>,
) -> bool {
    let init = role != Role::Regular;
    let name = s(spec, "/name").to_owned();
    let image = s(spec, "/image").to_owned();
    let ev = |warning: bool, reason: &'static str, message: String| {
        Record::container(pod, &name, init, warning, reason, message)
    };
    let pod_ip = w.ip.clone().unwrap_or_default();
    let c = w.containers.entry(name.clone()).or_default();
    // A container a slow runtime is creating and starting in the background.
    let done = c.starting.as_ref().map(|rx| rx.try_recv());
    match done {
        Some(Err(std::sync::mpsc::TryRecvError::Empty)) => return false,
        Some(Err(std::sync::mpsc::TryRecvError::Disconnected)) => c.starting = None,
        Some(Ok(outcome)) => {
            c.starting = None;
            let id = match outcome {
                Launch::Running(id) => {
                    events.push(ev(false, "Created", format!("Created container: {name}")));
                    id
                }
                Launch::NotCreated(e) => {
                    events.push(ev(true, "Failed", format!("Error: {e}")));
                    c.waiting = Some((create_error_reason(&e).into(), e.to_string()));
                    c.backoff_until = Some(Instant::now() + CONFIG_ERROR_RETRY);
                    return false;
                }
                Launch::NotStarted(e) => {
                    events.push(ev(false, "Created", format!("Created container: {name}")));
                    run_container_error(c, &ev, e, events);
                    return false;
                }
            };
            started_container(runtime, prober, pod, spec, &pod_ip, c, id, &ev, events);
            return false;
        }
        None => {}
    }
    if let Some(id) = c.id.clone() {
        let Ok(st) = runtime.container_status(&id) else {
            c.id = None;
            return false;
        };
        let (exit_code, started_at, finished_at) = match st.state {
            State::Exited {
                exit_code,
                started_at,
                finished_at,
            } => (exit_code, started_at, finished_at),
            State::Running { started_at } => {
                // In-place resize: the spec's new requests and limits are applied to the
                // running container (the CRI's UpdateContainerResources), or the container
                // is restarted when its resizePolicy says so for a resource that changed.
                let want = resources_of(spec);
                match c.applied {
                    None => c.applied = Some(want),
                    Some(had) if had != want => {
                        let cpu = had[0] != want[0] || had[1] != want[1];
                        let memory = had[2] != want[2] || had[3] != want[3];
                        if (cpu && resize_restarts(spec, "cpu"))
                            || (memory && resize_restarts(spec, "memory"))
                        {
                            c.applied = None;
                            let _ = runtime.kill_container(&id);
                            return false;
                        }
                        let config = crate::env::container_config(
                            pod,
                            spec,
                            annotations,
                            &pod_ip,
                            c.restart_count,
                        );
                        if let Ok(config) = config {
                            if runtime.update_container_resources(&id, &config).is_ok() {
                                c.applied = Some(want);
                            }
                        }
                    }
                    Some(_) => {}
                }
                if crate::env::has_projected_volumes(pod) {
                    let config = crate::env::container_config(
                        pod,
                        spec,
                        annotations,
                        &pod_ip,
                        c.restart_count,
                    );
                    if let Ok(config) = config {
                        runtime.refresh_volumes(&id, &config);
                    }
                }
                if role != Role::Init {
                    prober.ensure(&id, pod, spec, &pod_ip);
                }
                // A liveness or startup probe that failed (the prober recorded each
                // failure) restarts the container.
                for (kind, what) in [(Kind::Liveness, "liveness"), (Kind::Startup, "startup")] {
                    if prober.result(&id, kind) == Some(Outcome::Failure) {
                        events.push(ev(
                            false,
                            "Killing",
                            format!("Container {name} failed {what} probe, will be restarted"),
                        ));
                        let _ = runtime.kill_container(&id);
                        return false;
                    }
                }
                // A liveness probe that keeps failing restarts the container.
                if probe_failing(spec, annotations, "liveness", started_at)
                    || exec_probe_failing(runtime, &id, spec, "liveness", started_at)
                {
                    events.push(ev(
                        true,
                        "Unhealthy",
                        "Liveness probe failed: simulated failure".into(),
                    ));
                    events.push(ev(
                        false,
                        "Killing",
                        format!("Container {name} failed liveness probe, will be restarted"),
                    ));
                    let _ = runtime.kill_container(&id);
                }
                return false;
            }
            State::Created => return false,
        };
        let succeeded = exit_code == 0;
        if role == Role::Init && succeeded {
            return true;
        }
        let restart = match restart_policy {
            "Always" => true,
            "OnFailure" => !succeeded,
            _ => false,
        };
        if !restart {
            return succeeded;
        }
        // Remember the exit, then wait out the back-off before starting again.
        c.last = Some(terminated_json(
            &runtime.version().0,
            exit_code,
            started_at,
            finished_at,
            &st,
        ));
        c.id = None;
        c.backoff = if c.backoff.is_zero() {
            BACKOFF_START
        } else {
            (c.backoff * 2).min(BACKOFF_MAX)
        };
        c.backoff_until = Some(Instant::now() + c.backoff);
        c.restart_count += 1;
        c.waiting = Some(("CrashLoopBackOff".into(), String::new()));
        events.push(ev(
            true,
            "BackOff",
            format!(
                "Back-off restarting failed container {name} in pod {}_{}({})",
                s(pod, "/metadata/name"),
                s(pod, "/metadata/namespace"),
                s(pod, "/metadata/uid")
            ),
        ));
        return false;
    }
    if c.backoff_until.is_some_and(|t| Instant::now() < t) {
        // A pull that failed waits out its back-off as ImagePullBackOff, said once per
        // failure (upstream's image manager on the syncs within the back-off).
        if let Some((reason, message)) = &c.waiting {
            if reason == "ErrImagePull" {
                let message =
                    format!("Back-off pulling image \"{image}\": ErrImagePull: {message}");
                c.waiting = Some(("ImagePullBackOff".into(), message));
                events.push(ev(
                    false,
                    "BackOff",
                    format!("Back-off pulling image \"{image}\""),
                ));
                events.push(ev(true, "Failed", "Error: ImagePullBackOff".into()));
            }
        }
        return false;
    }
    // Pulled once per node unless the policy says always (or the tag is latest/absent).
    let policy = match s(spec, "/imagePullPolicy") {
        "" if image.ends_with(":latest")
            || !image.rsplit('/').next().unwrap_or("").contains(':') =>
        {
            "Always"
        }
        "" => "IfNotPresent",
        p => p,
    };
    // An image the runtime already has is not pulled unless the policy says Always.
    let known = (policy != "Always")
        .then(|| runtime.image_status(&image))
        .flatten();
    let present = known.is_some() || (pulled.contains(&image) && policy != "Always");
    if !present {
        events.push(ev(false, "Pulling", format!("Pulling image \"{image}\"")));
    }
    let started_pull = Instant::now();
    let result = match known {
        Some(r) => Ok(r),
        None => {
            // Each credential of the pod's imagePullSecrets that matches the registry, the
            // most specific first, until one works; without any, an anonymous pull.
            let credentials = crate::credentials::for_image(pod, &image);
            let mut result = None;
            for auth in &credentials {
                let r = runtime.pull_image(&image, Some(auth), annotations, &name);
                let ok = r.is_ok();
                result = Some(r);
                if ok {
                    break;
                }
            }
            result.unwrap_or_else(|| runtime.pull_image(&image, None, annotations, &name))
        }
    };
    match result {
        Ok(r) => {
            c.image_ref = r;
            if present {
                events.push(ev(
                    false,
                    "Pulled",
                    format!("Container image \"{image}\" already present on machine"),
                ));
            } else {
                let took = started_pull.elapsed();
                let size = runtime.image_size(&image).unwrap_or(0);
                events.push(ev(
                    false,
                    "Pulled",
                    format!("Successfully pulled image \"{image}\" in {took:?} ({took:?} including waiting). Image size: {size} bytes."),
                ));
                pulled.insert(image.clone());
            }
        }
        Err(e) => {
            events.push(ev(
                true,
                "Failed",
                format!("Failed to pull image \"{image}\": {e}"),
            ));
            events.push(ev(true, "Failed", "Error: ErrImagePull".into()));
            c.waiting = Some(("ErrImagePull".into(), e.to_string()));
            c.backoff = if c.backoff.is_zero() {
                BACKOFF_START
            } else {
                (c.backoff * 2).min(BACKOFF_MAX)
            };
            c.backoff_until = Some(Instant::now() + c.backoff);
            return false;
        }
    }
    let config =
        match crate::env::container_config(pod, spec, annotations, &pod_ip, c.restart_count) {
            Ok(config) => config,
            Err(e) => {
                // Upstream's CreateContainerConfigError: the container waits, and the pod
                // worker tries again after its back-off period.
                events.push(ev(true, "Failed", format!("Error: {e}")));
                c.waiting = Some(("CreateContainerConfigError".into(), e));
                c.backoff_until = Some(Instant::now() + CONFIG_ERROR_RETRY);
                return false;
            }
        };
    if runtime.slow_sandboxes() {
        // Created and started in the background, many pods' at once; the pass after it
        // ends (it wakes the loop) takes it up.
        let (tx, rx) = std::sync::mpsc::channel();
        let (runtime, sandbox, image_ref) =
            (prober.runtime(), sandbox.to_owned(), c.image_ref.clone());
        let wake = prober.waker();
        let spawned = std::thread::Builder::new()
            .name("container".into())
            .spawn(move || {
                let outcome = match runtime.create_container(&sandbox, &config, &image_ref) {
                    Err(e) => Launch::NotCreated(e),
                    Ok(id) => match runtime.start_container(&id) {
                        Ok(()) => Launch::Running(id),
                        Err(e) => Launch::NotStarted(e),
                    },
                };
                let _ = tx.send(outcome);
                wake.notify_one();
            });
        if spawned.is_ok() {
            c.starting = Some(rx);
        }
        return false;
    }
    let id = match runtime.create_container(sandbox, &config, &c.image_ref) {
        Ok(id) => id,
        Err(e) => {
            events.push(ev(true, "Failed", format!("Error: {e}")));
            c.waiting = Some((create_error_reason(&e).into(), e.to_string()));
            c.backoff_until = Some(Instant::now() + CONFIG_ERROR_RETRY);
            return false;
        }
    };
    events.push(ev(false, "Created", format!("Created container: {name}")));
    // A simulated runtime that has no model of the command says so, once per container.
    if let Some(command) = runtime.not_simulated(&id).filter(|_| !c.told_not_simulated) {
        c.told_not_simulated = true;
        events.push(ev(
            true,
            "NotSimulated",
            format!("The simulated runtime cannot run {command:?} of image {image:?}: the container runs without doing anything until it is stopped"),
        ));
    }
    if let Err(e) = runtime.start_container(&id) {
        run_container_error(c, &ev, e, events);
        return false;
    }
    started_container(runtime, prober, pod, spec, &pod_ip, c, id, &ev, events);
    false
}

/// Upstream's RunContainerError: the container waits with the runtime's message and is
/// tried again after the back-off.
fn run_container_error(
    c: &mut Container,
    ev: &dyn Fn(bool, &'static str, String) -> Record,
    e: kumo_cri::RuntimeError,
    events: &mut Vec<Record>,
) {
    events.push(ev(true, "Failed", format!("Error: {e}")));
    c.waiting = Some(("RunContainerError".into(), e.to_string()));
    c.restart_count += 1;
    c.backoff = if c.backoff.is_zero() {
        BACKOFF_START
    } else {
        (c.backoff * 2).min(BACKOFF_MAX)
    };
    c.backoff_until = Some(Instant::now() + c.backoff);
}

/// A container that started: the `Started` event, its postStart hook (a failed one kills
/// it, to be restarted as its policy says), and the worker's record of it.
#[allow(clippy::too_many_arguments)]
fn started_container(
    runtime: &dyn Runtime,
    prober: &Prober,
    pod: &Value,
    spec: &Value,
    pod_ip: &str,
    c: &mut Container,
    id: String,
    ev: &dyn Fn(bool, &'static str, String) -> Record,
    events: &mut Vec<Record>,
) {
    let name = s(spec, "/name");
    events.push(ev(false, "Started", format!("Started container {name}")));
    if let Some(hook) = spec.pointer("/lifecycle/postStart") {
        if let Err(e) =
            crate::lifecycle::run(runtime, &*prober.network(), pod, spec, &id, pod_ip, hook)
        {
            tracing::info!(container = %name, error = %e, "Failed to execute PostStartHook");
            events.push(ev(
                true,
                "FailedPostStartHook",
                "PostStartHook failed".into(),
            ));
            let _ = runtime.stop_container(&id, Duration::ZERO);
        }
    }
    c.id = Some(id);
    c.stop_requested = false;
    c.waiting = None;
    c.backoff_until = None;
    c.applied = Some(resources_of(spec));
}

/// The probe of `kind` (`readiness`, `liveness`, `startup`) of a container spec.
fn probe<'a>(spec: &'a Value, kind: &str) -> Option<&'a Value> {
    spec.get(format!("{kind}Probe")).filter(|p| p.is_object())
}

/// Whether the sim makes probe `kind` of this container fail.
fn sim_fails(spec: &Value, annotations: &BTreeMap<String, String>, kind: &str) -> bool {
    let name = s(spec, "/name");
    annotations
        .get(&format!("sim.kumo.io/probe-fail/{name}"))
        .or_else(|| annotations.get("sim.kumo.io/probe-fail"))
        .is_some_and(|v| v.split(',').any(|k| k.trim() == kind))
}

fn probe_field(p: &Value, k: &str, default: u64) -> u64 {
    p.get(k).and_then(Value::as_u64).unwrap_or(default)
}

/// Whether the probe has not (yet) passed: within initialDelaySeconds, or failing.
fn probe_pending(
    spec: &Value,
    annotations: &BTreeMap<String, String>,
    kind: &str,
    started: SystemTime,
) -> bool {
    let Some(p) = probe(spec, kind) else {
        return false;
    };
    let delay = Duration::from_secs(probe_field(p, "initialDelaySeconds", 0));
    let elapsed = started.elapsed().unwrap_or_default();
    elapsed < delay || sim_fails(spec, annotations, kind)
}

/// Whether the probe failed `failureThreshold` times in a row (after its delay).
fn probe_failing(
    spec: &Value,
    annotations: &BTreeMap<String, String>,
    kind: &str,
    started: SystemTime,
) -> bool {
    let Some(p) = probe(spec, kind) else {
        return false;
    };
    if !sim_fails(spec, annotations, kind) {
        return false;
    }
    let delay = probe_field(p, "initialDelaySeconds", 0);
    let period = probe_field(p, "periodSeconds", 10).max(1);
    let threshold = probe_field(p, "failureThreshold", 3).max(1);
    started.elapsed().unwrap_or_default() >= Duration::from_secs(delay + period * threshold)
}

/// Whether the exec probe of `kind` fails when run at `at` (false without one).
fn exec_probe_fails(
    runtime: &dyn Runtime,
    id: &str,
    spec: &Value,
    kind: &str,
    at: SystemTime,
) -> bool {
    let Some(p) = probe(spec, kind) else {
        return false;
    };
    let Some(cmd) = p.pointer("/exec/command").and_then(Value::as_array) else {
        return false;
    };
    let cmd: Vec<String> = cmd
        .iter()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    let timeout = Duration::from_secs(probe_field(p, "timeoutSeconds", 1).max(1));
    runtime.probe_exec(id, &cmd, at, timeout) == Some(false)
}

/// Whether an exec probe failed `failureThreshold` times in a row: the probes of the
/// last periods (after the initial delay) all fail.
fn exec_probe_failing(
    runtime: &dyn Runtime,
    id: &str,
    spec: &Value,
    kind: &str,
    started: SystemTime,
) -> bool {
    let Some(p) = probe(spec, kind) else {
        return false;
    };
    if p.pointer("/exec/command").is_none() {
        return false;
    }
    let delay = Duration::from_secs(probe_field(p, "initialDelaySeconds", 0));
    let period = Duration::from_secs(probe_field(p, "periodSeconds", 10).max(1));
    let threshold = probe_field(p, "failureThreshold", 3).max(1) as u32;
    let now = SystemTime::now();
    (0..threshold).all(|k| {
        let at = now.checked_sub(period * k).unwrap_or(started);
        at >= started + delay && exec_probe_fails(runtime, id, spec, kind, at)
    })
}

/// The `terminated` state of an exited container (`scheme`: the runtime's name, as the
/// container ID's prefix).
fn terminated_json(
    scheme: &str,
    exit_code: i32,
    started_at: SystemTime,
    finished_at: SystemTime,
    st: &kumo_cri::ContainerStatus,
) -> Value {
    let reason = st
        .reason
        .as_deref()
        .filter(|r| !r.is_empty())
        .unwrap_or(if exit_code == 0 { "Completed" } else { "Error" });
    let mut t = json!({"terminated": {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": rfc3339(started_at),
        "finishedAt": rfc3339(finished_at),
        "containerID": format!("{scheme}://{}", st.id),
    }});
    if let Some(m) = st.message.as_deref().filter(|m| !m.is_empty()) {
        t["terminated"]["message"] = json!(m);
    }
    t
}

/// The status of one pod: container states, phase and conditions as upstream computes
/// them.
#[allow(clippy::too_many_arguments)]
fn pod_status(
    pod: &Value,
    w: &Worker,
    runtime: &dyn Runtime,
    prober: &Prober,
    inits: &[Value],
    mains: &[Value],
    ephemerals: &[Value],
    restart_policy: &str,
    host_ip: &str,
) -> Value {
    let pod_name = s(pod, "/metadata/name");
    let pod_ns = s(pod, "/metadata/namespace");
    let uid = s(pod, "/metadata/uid");
    let annotations: BTreeMap<String, String> = pod
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let status_of = |spec: &Value, role: Role| -> Reported {
        let init = role == Role::Init;
        // (status, running, ready, exit code if exited)
        let name = s(spec, "/name");
        let image = s(spec, "/image");
        let c = w.containers.get(name);
        let mut v = json!({"name": name, "image": image, "imageID": "", "ready": false, "restartCount": c.map_or(0, |c| c.restart_count), "started": false});
        if let Some(last) = c.and_then(|c| c.last.clone()) {
            v["lastState"] = last;
        } else {
            v["lastState"] = json!({});
        }
        let live = c
            .and_then(|c| c.id.as_ref())
            .and_then(|id| runtime.container_status(id).ok());
        match live {
            Some(st) => {
                v["imageID"] = json!(st.image_ref);
                v["containerID"] = json!(format!("{}://{}", runtime.version().0, st.id));
                // InPlacePodVerticalScaling: what the runtime applies and what is
                // allocated; the sim applies the spec's resources at once, so a resize
                // completes with the next status.
                let resources = spec
                    .get("resources")
                    .filter(|r| r.is_object())
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                if let Some(requests) = resources
                    .get("requests")
                    .filter(|r| r.as_object().is_some_and(|m| !m.is_empty()))
                {
                    v["allocatedResources"] = requests.clone();
                }
                v["resources"] = resources;
                match st.state {
                    State::Running { started_at } => {
                        v["state"] = json!({"running": {"startedAt": rfc3339(started_at)}});
                        // Not started while a startup probe has not passed; not ready
                        // while the readiness probe does not pass (or before its delay).
                        let now = SystemTime::now();
                        // A network probe's worker result (none yet: the initial one).
                        let passed = |kind: Kind| {
                            prober::network_probe(spec, kind).is_none()
                                || prober.result(&st.id, kind) == Some(Outcome::Success)
                        };
                        let started = !probe_pending(spec, &annotations, "startup", started_at)
                            && !exec_probe_fails(runtime, &st.id, spec, "startup", now)
                            && passed(Kind::Startup);
                        let ready = !init
                            && started
                            && !probe_pending(spec, &annotations, "readiness", started_at)
                            && !exec_probe_fails(runtime, &st.id, spec, "readiness", now)
                            && passed(Kind::Readiness);
                        v["started"] = json!(started);
                        v["ready"] = json!(ready);
                        (v, true, ready, None)
                    }
                    State::Exited {
                        exit_code,
                        started_at,
                        finished_at,
                    } => {
                        v["state"] = terminated_json(
                            &runtime.version().0,
                            exit_code,
                            started_at,
                            finished_at,
                            &st,
                        );
                        // An init container that succeeded is ready (upstream's status).
                        let ready = init && exit_code == 0;
                        v["ready"] = json!(ready);
                        (v, false, ready, Some(exit_code))
                    }
                    State::Created => {
                        v["state"] = json!({"waiting": {"reason": "ContainerCreating"}});
                        (v, false, false, None)
                    }
                }
            }
            None => {
                let (reason, message) = match c.and_then(|c| c.waiting.clone()) {
                    Some((r, _)) if r == "CrashLoopBackOff" => {
                        let backoff = c.map_or(BACKOFF_START, |c| c.backoff);
                        (r, format!("back-off {}s restarting failed container={name} pod={pod_name}_{pod_ns}({uid})", backoff.as_secs()))
                    }
                    Some(rm) => rm,
                    // Upstream's default waiting state: PodInitializing in a pod with
                    // init containers, else ContainerCreating.
                    None if inits.is_empty() => ("ContainerCreating".into(), String::new()),
                    None => ("PodInitializing".into(), String::new()),
                };
                let mut waiting = json!({"reason": reason});
                if !message.is_empty() {
                    waiting["message"] = json!(message);
                }
                v["state"] = json!({"waiting": waiting});
                (v, false, false, None)
            }
        }
    };
    let init_statuses: Vec<_> = inits
        .iter()
        .map(|c| {
            let role = if is_sidecar(c) {
                Role::Sidecar
            } else {
                Role::Init
            };
            (status_of(c, role), role)
        })
        .collect();
    let statuses: Vec<_> = mains.iter().map(|c| status_of(c, Role::Regular)).collect();
    let phase = phase(w.init_done, &init_statuses, &statuses, restart_policy);
    // Sidecars count for readiness, before the containers (upstream's order).
    let not_ready: Vec<String> = init_statuses
        .iter()
        .filter(|(_, role)| *role == Role::Sidecar)
        .map(|(s, _)| s)
        .chain(&statuses)
        .filter(|s| !s.2)
        .map(|s| s.0["name"].as_str().unwrap_or("").to_owned())
        .collect();
    let now = rfc3339(SystemTime::now());
    // The pod generation this status describes (PodObservedGenerationTracking).
    let generation = pod
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let cond = |t: &str, ok: bool, reason: &str, message: String| {
        let mut c = json!({"type": t, "status": if ok { "True" } else { "False" }, "lastProbeTime": null, "lastTransitionTime": now});
        if generation > 0 {
            c["observedGeneration"] = json!(generation);
        }
        if !ok && !reason.is_empty() {
            c["reason"] = json!(reason);
            c["message"] = json!(message);
        }
        c
    };
    let terminal = matches!(phase, "Succeeded" | "Failed");
    let ready = not_ready.is_empty() && !terminal;
    let (ready_reason, ready_message) = if terminal {
        ("PodCompleted", String::new())
    } else {
        (
            "ContainersNotReady",
            format!("containers with unready status: [{}]", not_ready.join(" ")),
        )
    };
    let pending_inits: Vec<String> = if w.init_done {
        Vec::new()
    } else {
        init_statuses
            .iter()
            .filter(|(s, role)| match role {
                Role::Sidecar => s.0["started"] != json!(true),
                _ => s.3 != Some(0),
            })
            .map(|(s, _)| s.0["name"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    let mut conditions = vec![
        cond(
            "PodReadyToStartContainers",
            w.sandbox.is_some() && !terminal,
            "",
            String::new(),
        ),
        cond(
            "Initialized",
            w.init_done,
            "ContainersNotInitialized",
            format!(
                "containers with incomplete status: [{}]",
                pending_inits.join(" ")
            ),
        ),
        cond("Ready", ready, ready_reason, ready_message.clone()),
        cond("ContainersReady", ready, ready_reason, ready_message),
        cond("PodScheduled", true, "", String::new()),
    ];
    if terminal {
        conditions[2]["reason"] = json!("PodCompleted");
        conditions[3]["reason"] = json!("PodCompleted");
    }
    let ip = w.ip.clone().unwrap_or_default();
    let mut st = json!({
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": w.start_time,
        "containerStatuses": statuses.into_iter().map(|s| s.0).collect::<Vec<_>>(),
        "qosClass": pod.pointer("/status/qosClass").cloned().unwrap_or(json!("BestEffort")),
    });
    if generation > 0 {
        st["observedGeneration"] = json!(generation);
    }
    if w.deadline_exceeded {
        st["phase"] = json!("Failed");
        st["reason"] = json!("DeadlineExceeded");
        st["message"] = json!("Pod was active on the node longer than the specified deadline");
    }
    if !inits.is_empty() {
        st["initContainerStatuses"] = json!(init_statuses
            .into_iter()
            .map(|(s, _)| s.0)
            .collect::<Vec<_>>());
    }
    if !ephemerals.is_empty() {
        // Ephemeral containers are never ready (upstream's status of them).
        let statuses: Vec<Value> = ephemerals
            .iter()
            .map(|c| {
                let mut v = status_of(c, Role::Regular).0;
                v["ready"] = json!(false);
                v
            })
            .collect();
        st["ephemeralContainerStatuses"] = json!(statuses);
    }
    st
}

/// The kubelet's conditions, keeping the others' (DisruptionTarget, readiness gates) and
/// the transition times of conditions whose status did not change.
/// A container's status as the kubelet reports it: (status, running, ready, exit code if
/// exited).
type Reported = (Value, bool, bool, Option<i32>);

/// The pod's phase from its containers' statuses (upstream's getPhase).
fn phase(
    init_done: bool,
    init_statuses: &[(Reported, Role)],
    statuses: &[Reported],
    restart_policy: &str,
) -> &'static str {
    let running = statuses.iter().filter(|s| s.1).count();
    let exited: Vec<i32> = statuses.iter().filter_map(|s| s.3).collect();
    // A pod is done only once its sidecars have stopped too.
    let sidecars_running = init_statuses
        .iter()
        .any(|(s, role)| *role == Role::Sidecar && s.1);
    let all_exited = !statuses.is_empty() && exited.len() == statuses.len();
    // A container that has never run keeps the pod Pending, whatever the others do
    // (upstream counts waiting containers before running ones).
    let never_ran = statuses
        .iter()
        .filter(|s| s.0.pointer("/state/waiting").is_some())
        .filter(|s| s.0.pointer("/lastState/terminated").is_none())
        .count();
    let init_failed = restart_policy == "Never"
        && init_statuses
            .iter()
            .any(|(s, role)| *role == Role::Init && s.3.is_some_and(|code| code != 0));
    if !init_done && init_failed {
        // A failed init container fails a pod that restarts nothing.
        "Failed"
    } else if !init_done || never_ran > 0 {
        "Pending"
    } else if all_exited && restart_policy != "Always" && sidecars_running {
        "Running"
    } else if all_exited && restart_policy == "Never" {
        if exited.iter().all(|c| *c == 0) {
            "Succeeded"
        } else {
            "Failed"
        }
    } else if all_exited && restart_policy == "OnFailure" && exited.iter().all(|c| *c == 0) {
        "Succeeded"
    } else if running > 0
        || statuses
            .iter()
            .any(|s| s.0["restartCount"].as_u64().unwrap_or(0) > 0)
        || all_exited
    {
        "Running"
    } else {
        "Pending"
    }
}

fn merge_conditions(current: Option<&Value>, mut new: Value) -> Value {
    let old: Vec<Value> = current
        .and_then(|c| c.get("conditions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(list) = new.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in list.iter_mut() {
            if let Some(o) = old
                .iter()
                .find(|o| o["type"] == c["type"] && o["status"] == c["status"])
            {
                c["lastTransitionTime"] = o["lastTransitionTime"].clone();
            }
        }
        let ours: Vec<Value> = list.iter().map(|c| c["type"].clone()).collect();
        for o in old {
            if !ours.contains(&o["type"]) {
                list.push(o);
            }
        }
    }
    if let Some(t) = current.and_then(|c| c.get("startTime")) {
        new["startTime"] = t.clone();
    }
    new
}

/// Whether the stored status already says what `new` says. A null or empty-string field is
/// an absent one (the pod read through the typed client has none of the nulls written,
/// such as a condition's `lastProbeTime`, and a Node has required strings that are "").
fn same_status(stored: &Value, new: &Value) -> bool {
    new.as_object().is_some_and(|o| {
        o.iter()
            .all(|(k, v)| same_ignoring_empty(stored.get(k).unwrap_or(&Value::Null), v))
    })
}

/// `a == b` where null and empty-string object fields count as absent (as
/// [`without_nulls`] would make them), without copying either.
fn same_ignoring_empty(a: &Value, b: &Value) -> bool {
    let empty = |v: &Value| v.is_null() || v.as_str() == Some("");
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let present =
                |m: &'_ serde_json::Map<String, Value>| m.values().filter(|v| !empty(v)).count();
            present(x) == present(y)
                && y.iter()
                    .filter(|(_, v)| !empty(v))
                    .all(|(k, v)| x.get(k).is_some_and(|w| same_ignoring_empty(w, v)))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| same_ignoring_empty(v, w))
        }
        _ => a == b,
    }
}

/// `v` without its null and empty-string object fields, at every depth.
pub(crate) fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(_, v)| !v.is_null() && v.as_str() != Some(""))
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_read_back_typed_is_the_same() {
        // What the kubelet writes: conditions with a null lastProbeTime.
        let new = json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": null,
                            "lastTransitionTime": "2026-12-03T14:26:21Z"}],
        });
        // What the typed client reads back: no nulls, plus its own empty strings.
        let stored = json!({
            "phase": "Running",
            "message": "",
            "conditions": [{"type": "Ready", "status": "True",
                            "lastTransitionTime": "2026-12-03T14:26:21Z"}],
        });
        assert!(same_status(&stored, &new));
        let mut changed = new.clone();
        changed["conditions"][0]["status"] = json!("False");
        assert!(!same_status(&stored, &changed));
        assert!(!same_status(&json!({}), &new));
    }

    #[test]
    fn a_container_that_never_ran_keeps_the_pod_pending() {
        let running = (
            json!({"state": {"running": {}}, "restartCount": 0}),
            true,
            true,
            None,
        );
        let creating = (
            json!({"state": {"waiting": {"reason": "ContainerCreating"}}, "lastState": {}}),
            false,
            false,
            None,
        );
        let backing_off = (
            json!({"state": {"waiting": {"reason": "CrashLoopBackOff"}},
                   "lastState": {"terminated": {"exitCode": 1}}, "restartCount": 1}),
            false,
            false,
            None,
        );
        let pending = [running.clone(), creating.clone()];
        assert_eq!(phase(true, &[], &pending, "Always"), "Pending");
        assert_eq!(
            phase(true, &[], std::slice::from_ref(&running), "Always"),
            "Running"
        );
        assert_eq!(
            phase(true, &[], &[running, backing_off], "Always"),
            "Running"
        );
        assert_eq!(phase(false, &[], &[creating], "Always"), "Pending");
    }
}
