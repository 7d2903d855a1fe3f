//! endpointslice-controller: the EndpointSlices of every Service with a selector, one
//! endpoint per selected pod with an IP (terminating pods included, with their
//! conditions), at most 100 endpoints per slice, grouped by the ports each pod resolves
//! the Service's target ports to. Also the helpers the endpoints controller shares.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_not_found, message, namespace_terminating};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::WorkQueue;

/// The value of [`LABEL_MANAGED_BY`] on the slices this controller manages.
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
/// The label naming a slice's Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The label naming the controller that manages a slice.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// The label marking the endpoints of a headless Service.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// The annotation with the time of the change that triggered the last write.
pub const LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// Upstream's default `--max-endpoints-per-slice`.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// The zone label of nodes.
const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// How soon a sync that saw an out-of-date cache looks again.
const STALE_RETRY: Duration = Duration::from_millis(100);

// ---- Shared with the endpoints controller ----

/// The Service's selector; None (no endpoints from the controllers) when unset or empty,
/// as an empty map is stored as none upstream.
pub(crate) fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()?
        .selector
        .as_ref()
        .filter(|s| !s.is_empty())
}

/// Whether the Service is `type: ExternalName` (no endpoints from the controllers).
pub(crate) fn is_external_name(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName")
}

/// Whether the Service has a cluster IP (it is not headless).
pub(crate) fn is_service_ip_set(svc: &Service) -> bool {
    let ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or("");
    !ip.is_empty() && ip != "None"
}

fn selects(sel: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    sel.iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The pods in the Service's namespace its selector matches.
pub(crate) fn pods_for(pods: &Informer<Pod>, svc: &Service) -> Vec<Arc<Pod>> {
    let Some(sel) = selector(svc) else {
        return Vec::new();
    };
    let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
    pods.list()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns) && selects(sel, p))
        .collect()
}

/// The keys of the Services in the pod's namespace that select it.
pub(crate) fn services_for_pod(services: &Informer<Service>, pod: &Pod) -> Vec<String> {
    let ns = pod.metadata.namespace.as_deref();
    services
        .list()
        .into_iter()
        .filter(|s| s.metadata.namespace.as_deref() == ns)
        .filter(|s| selector(s).is_some_and(|sel| selects(sel, pod)))
        .map(|s| key_of(s.as_ref()))
        .collect()
}

/// Queues the Services selecting the pod before and after a change.
pub(crate) fn queue_pod_services(
    services: &Informer<Service>,
    queue: &WorkQueue<String>,
    c: Change<'_, Pod>,
) {
    let (old, new) = match c {
        Change::Added(p) | Change::Deleted(p) => (None, p),
        Change::Updated { old, new } => (Some(old), new),
    };
    let mut keys: BTreeSet<String> = services_for_pod(services, new).into_iter().collect();
    if let Some(old) = old {
        keys.extend(services_for_pod(services, old));
    }
    for k in keys {
        queue.add(k);
    }
}

/// The pod's Ready condition is True.
pub(crate) fn is_pod_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

fn ready_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// The pod's IPs (status.podIPs, or status.podIP when only that is set).
pub(crate) fn pod_ips(pod: &Pod) -> Vec<String> {
    let Some(st) = pod.status.as_ref() else {
        return Vec::new();
    };
    let ips: Vec<String> = st
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.clone())
        .filter(|ip| !ip.is_empty())
        .collect();
    if !ips.is_empty() {
        return ips;
    }
    st.pod_ip
        .iter()
        .filter(|ip| !ip.is_empty())
        .cloned()
        .collect()
}

/// Upstream's ShouldPodBeInEndpoints: not terminal, has an IP, and not terminating unless
/// `include_terminating`.
pub(crate) fn should_pod_be_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Failed" | "Succeeded")) {
        return false;
    }
    if pod_ips(pod).is_empty() {
        return false;
    }
    include_terminating || pod.metadata.deletion_timestamp.is_none()
}

/// The pod's hostname is published when its subdomain names the Service.
pub(crate) fn should_set_hostname(pod: &Pod, svc: &Service) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.hostname.as_deref().is_some_and(|h| !h.is_empty())
        && spec.subdomain.as_deref() == svc.metadata.name.as_deref()
        && pod.metadata.namespace == svc.metadata.namespace
}

/// The container port a Service port's targetPort names in the pod (upstream's FindPort):
/// a number as is, a name looked up in the containers' (and sidecars') ports with the
/// same protocol.
pub(crate) fn find_port(pod: &Pod, sp: &ServicePort) -> Option<i32> {
    let proto = sp.protocol.as_deref().unwrap_or("TCP");
    match sp.target_port.as_ref() {
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => {
            let spec = pod.spec.as_ref()?;
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            spec.containers
                .iter()
                .chain(sidecars)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == proto
                })
                .map(|p| p.container_port)
        }
        // Defaulted to the port by the API server; kept for objects that lack it.
        None => Some(sp.port),
    }
}

/// Upstream's TriggerTimeTracker: the earliest change (a pod's Ready transition, the
/// Service's creation) not seen by the previous sync of a Service.
#[derive(Default)]
pub(crate) struct TriggerTimeTracker {
    states: Mutex<HashMap<String, SeenTimes>>,
}

/// The Service's creation time and each pod's Ready transition time seen last.
type SeenTimes = (Option<Timestamp>, HashMap<String, Timestamp>);

impl TriggerTimeTracker {
    /// The trigger time for this sync; updates what was seen.
    pub(crate) fn compute(&self, svc: &Service, pods: &[Arc<Pod>]) -> Option<Timestamp> {
        let key = key_of(svc);
        let mut states = self.states.lock();
        let known = states.contains_key(&key);
        let state = states.entry(key).or_default();
        let mut min: Option<Timestamp> = None;
        let mut seen = HashMap::new();
        for pod in pods {
            let t = ready_condition(pod)
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0);
            let Some(t) = t else { continue };
            let name = pod.metadata.name.clone().unwrap_or_default();
            if state.1.get(&name).is_none_or(|last| t > *last) {
                min = Some(min.map_or(t, |m| m.min(t)));
            }
            seen.insert(name, t);
        }
        let created = svc.metadata.creation_timestamp.as_ref().map(|t| t.0);
        if let Some(c) = created {
            if state.0.is_none_or(|last| c > last) {
                min = Some(min.map_or(c, |m| m.min(c)));
            }
        }
        *state = (created, seen);
        if !known {
            return created;
        }
        min
    }

    /// Forgets a deleted Service.
    pub(crate) fn delete(&self, key: &str) {
        self.states.lock().remove(key);
    }
}

/// Sets (or, without a trigger time, removes) the last-change-trigger-time annotation.
pub(crate) fn set_trigger_time(meta: &mut ObjectMeta, t: Option<Timestamp>) {
    let a = meta.annotations.get_or_insert_with(BTreeMap::new);
    match t {
        Some(t) => {
            a.insert(LAST_CHANGE_TRIGGER_TIME.into(), t.to_string());
        }
        None => {
            a.remove(LAST_CHANGE_TRIGGER_TIME);
        }
    }
}

/// The resourceVersion as a number (kumo's are store revisions), 0 if it is not one.
pub(crate) fn rv(meta: &ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

// ---- The controller ----

/// What this controller last wrote per Service: slice name → the resourceVersion written,
/// or None for a deletion (upstream's EndpointSliceTracker), so a sync does not act on an
/// informer cache that has not seen its own writes yet. Entries expire after
/// [`TRACK_FOR`], so a write the cache can never show (a slice created and deleted by
/// someone else across a relist) does not block the Service for good.
#[derive(Default)]
struct Tracker(Mutex<HashMap<String, HashMap<String, Written>>>);

/// The resourceVersion written (None: deleted), and when.
type Written = (Option<u64>, Instant);

/// How long a write is waited for in the cache.
const TRACK_FOR: Duration = Duration::from_secs(30);

struct Ctl {
    client: ClientSource,
    services: Arc<Informer<Service>>,
    pods: Arc<Informer<Pod>>,
    nodes: Arc<Informer<Node>>,
    slices: Arc<Informer<EndpointSlice>>,
    tracker: Arc<Tracker>,
    triggers: TriggerTimeTracker,
}

fn managed(s: &EndpointSlice) -> Option<String> {
    let labels = s.metadata.labels.as_ref()?;
    if labels.get(LABEL_MANAGED_BY).map(String::as_str) != Some(CONTROLLER_NAME) {
        return None;
    }
    let svc = labels.get(LABEL_SERVICE_NAME).filter(|n| !n.is_empty())?;
    let ns = s.metadata.namespace.as_deref().unwrap_or_default();
    Some(format!("{ns}/{svc}"))
}

/// Registers the handlers and returns the controller task (workers start once the caches synced).
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("endpoint_slice");
    let services = factory.informer::<Service>();
    let pods = factory.informer::<Pod>();
    let nodes = factory.informer::<Node>();
    let slices = factory.informer::<EndpointSlice>();
    let q = queue.clone();
    services.add_handler(move |c| {
        let (Change::Added(s) | Change::Updated { new: s, .. } | Change::Deleted(s)) = c;
        q.add(key_of(s));
    });
    let q = queue.clone();
    let svcs = services.clone();
    pods.add_handler(move |c| queue_pod_services(&svcs, &q, c));
    let q = queue.clone();
    slices.add_handler(move |c| match c {
        Change::Added(s) | Change::Deleted(s) => {
            if let Some(k) = managed(s) {
                q.add(k);
            }
        }
        Change::Updated { old, new } => {
            for k in [managed(old), managed(new)].into_iter().flatten() {
                q.add(k);
            }
        }
    });
    // A deleted slice is no longer expected at the version written.
    let tracker = Arc::new(Tracker::default());
    let t = tracker.clone();
    slices.add_handler(move |ch| {
        if let Change::Deleted(s) = ch {
            if let (Some(k), Some(n)) = (managed(s), s.metadata.name.as_ref()) {
                if let Some(m) = t.0.lock().get_mut(&k) {
                    m.remove(n);
                }
            }
        }
    });
    tokio::spawn(async move {
        tracing::info!("Starting endpoint slice controller");
        let Some(client) = client_for(&clients, "endpointslice-controller", &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            services,
            pods,
            nodes,
            slices,
            tracker,
            triggers: TriggerTimeTracker::default(),
        });
        let synced = async {
            ctl.services.wait_synced().await;
            ctl.pods.wait_synced().await;
            ctl.nodes.wait_synced().await;
            ctl.slices.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let tasks = run_workers_of("endpointslice", queue, 5, stop, &ctl, |c, key| async move {
            c.sync(&key).await
        });
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down endpoint slice controller");
    })
}

/// The identity of an endpoint within a slice (upstream's endpoint hash): its addresses,
/// hostname and target pod.
fn ep_key(e: &Endpoint) -> String {
    let mut a = e.addresses.clone();
    a.sort();
    let (ns, name) = e
        .target_ref
        .as_ref()
        .map(|t| {
            (
                t.namespace.clone().unwrap_or_default(),
                t.name.clone().unwrap_or_default(),
            )
        })
        .unwrap_or_default();
    format!(
        "{}|{}|{ns}/{name}",
        a.join(","),
        e.hostname.as_deref().unwrap_or("")
    )
}

/// The identity of a set of ports, whatever their order (and with the API's defaults).
fn port_key(ports: &[EndpointPort]) -> String {
    let mut k: Vec<String> = ports
        .iter()
        .map(|p| {
            format!(
                "{}/{}/{}/{}",
                p.name.as_deref().unwrap_or(""),
                p.port.map(|n| n.to_string()).unwrap_or_default(),
                p.protocol.as_deref().unwrap_or("TCP"),
                p.app_protocol.as_deref().unwrap_or("")
            )
        })
        .collect();
    k.sort();
    k.join(";")
}

fn target_ref_eq(a: Option<&ObjectReference>, b: Option<&ObjectReference>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            let mut a = a.clone();
            let mut b = b.clone();
            a.resource_version = None;
            b.resource_version = None;
            a == b
        }
        _ => false,
    }
}

/// Upstream's EndpointsEqualBeyondHash.
fn equal_beyond_hash(a: &Endpoint, b: &Endpoint) -> bool {
    let cond = |e: &Endpoint| {
        let c = e.conditions.clone().unwrap_or_default();
        (c.ready, c.serving, c.terminating)
    };
    a.node_name == b.node_name
        && a.zone == b.zone
        && cond(a) == cond(b)
        && target_ref_eq(a.target_ref.as_ref(), b.target_ref.as_ref())
}

fn owned_by(s: &EndpointSlice, svc: &Service) -> bool {
    s.metadata.owner_references.iter().flatten().any(|o| {
        Some(&o.uid) == svc.metadata.uid.as_ref() && o.kind == "Service" && o.api_version == "v1"
    })
}

/// The slice's labels for the Service, and whether the Service's own labels changed
/// (upstream's setEndpointSliceLabels).
fn slice_labels(
    slice_labels: &BTreeMap<String, String>,
    svc: &Service,
) -> (BTreeMap<String, String>, bool) {
    let reserved =
        |k: &str| k == LABEL_SERVICE_NAME || k == LABEL_MANAGED_BY || k == LABEL_HEADLESS;
    let have: BTreeMap<&String, &String> =
        slice_labels.iter().filter(|(k, _)| !reserved(k)).collect();
    let mut want: BTreeMap<String, String> = svc
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !reserved(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let changed = have.len() != want.len() || have.iter().any(|(k, v)| want.get(*k) != Some(*v));
    if !is_service_ip_set(svc) {
        want.insert(LABEL_HEADLESS.into(), String::new());
    }
    want.insert(
        LABEL_SERVICE_NAME.into(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    want.insert(LABEL_MANAGED_BY.into(), CONTROLLER_NAME.into());
    (want, changed)
}

/// The address types the Service's endpoints have (its IP families).
fn address_types(svc: &Service) -> Vec<String> {
    let spec = svc.spec.as_ref();
    let fams: Vec<String> = spec
        .and_then(|s| s.ip_families.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| match f.as_str() {
            "IPv4" | "IPv6" => Some(f),
            _ => None,
        })
        .collect();
    if !fams.is_empty() {
        return fams;
    }
    let ip = spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or("");
    match ip.parse::<std::net::IpAddr>() {
        Ok(a) if a.is_ipv6() => vec!["IPv6".into()],
        _ => vec!["IPv4".into()],
    }
}

/// The slice ports for a pod: each Service port whose targetPort resolves in the pod.
fn endpoint_ports(svc: &Service, pod: &Pod) -> Vec<EndpointPort> {
    let ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    ports
        .iter()
        .filter_map(|sp| {
            let port = find_port(pod, sp)?;
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(port),
                protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}

fn pod_to_endpoint(pod: &Pod, node: Option<&Node>, svc: &Service, family: &str) -> Endpoint {
    let serving = is_pod_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let publish = svc
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let ready = publish || (serving && !terminating);
    let addresses = pod_ips(pod)
        .into_iter()
        .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok())
        .filter(|ip| ip.is_ipv6() == (family == "IPv6"))
        .map(|ip| ip.to_string())
        .collect();
    let node_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    let zone = node
        .and_then(|n| n.metadata.labels.as_ref())
        .and_then(|l| l.get(LABEL_ZONE))
        .filter(|z| !z.is_empty())
        .cloned();
    let hostname = should_set_hostname(pod, svc)
        .then(|| pod.spec.as_ref().and_then(|s| s.hostname.clone()))
        .flatten();
    Endpoint {
        addresses,
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        }),
        node_name,
        zone,
        hostname,
        ..Default::default()
    }
}

fn new_slice(svc: &Service, ports: Vec<EndpointPort>, family: &str) -> EndpointSlice {
    let name = svc.metadata.name.clone().unwrap_or_default();
    // The generated name adds 5 characters; a prefix too long for that goes without the dash.
    let prefix = if name.len() + 1 + 5 <= 253 {
        format!("{name}-")
    } else {
        name.clone()
    };
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name,
        uid: svc.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(prefix),
            namespace: svc.metadata.namespace.clone(),
            labels: Some(slice_labels(&BTreeMap::new(), svc).0),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        address_type: family.into(),
        ports: (!ports.is_empty()).then_some(ports),
        endpoints: None,
    }
}

fn eps_len(s: &EndpointSlice) -> usize {
    s.endpoints.as_ref().map_or(0, Vec::len)
}

/// The endpoints of one port mapping still to place, ordered for stable output.
struct Desired {
    ports: Vec<EndpointPort>,
    endpoints: BTreeMap<String, Endpoint>,
}

impl Desired {
    fn pop(&mut self) -> Option<Endpoint> {
        self.endpoints.pop_first().map(|(_, e)| e)
    }
}

#[derive(Default)]
struct Plan {
    create: Vec<EndpointSlice>,
    update: Vec<EndpointSlice>,
    delete: Vec<EndpointSlice>,
}

impl Ctl {
    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let Some(svc) = self.services.get(key) else {
            self.triggers.delete(key);
            self.tracker.0.lock().remove(key);
            return Ok(());
        };
        if is_external_name(&svc) || selector(&svc).is_none() {
            // Services without a selector get their slices from elsewhere (the
            // `kubernetes` Service's come from the API server).
            return Ok(());
        }
        let pods = pods_for(&self.pods, &svc);
        let slices: Vec<Arc<EndpointSlice>> = self
            .slices
            .list()
            .into_iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .filter(|s| managed(s).as_deref() == Some(key))
            .collect();
        if self.stale(key, &slices) {
            return Err(SyncError::After(STALE_RETRY));
        }
        let trigger = self.triggers.compute(&svc, &pods);
        let types = address_types(&svc);
        let mut errs = Vec::new();
        let mut delete = Vec::new();
        let mut by_type: BTreeMap<String, Vec<Arc<EndpointSlice>>> = BTreeMap::new();
        for s in slices {
            if types.contains(&s.address_type) {
                by_type.entry(s.address_type.clone()).or_default().push(s);
            } else {
                delete.push((*s).clone());
            }
        }
        for t in &types {
            let existing = by_type.remove(t).unwrap_or_default();
            let (plan, mut skipped) = self.plan(&svc, &pods, &existing, t);
            errs.append(&mut skipped);
            if let Err(e) = self.finalize(key, &svc, plan, trigger).await {
                errs.push(e);
            }
        }
        if !delete.is_empty() {
            let plan = Plan {
                delete,
                ..Default::default()
            };
            if let Err(e) = self.finalize(key, &svc, plan, trigger).await {
                errs.push(e);
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(SyncError::Failed(errs.join(", ")))
        }
    }

    /// Whether the cache lacks a write of ours (or still has a slice we deleted).
    fn stale(&self, key: &str, slices: &[Arc<EndpointSlice>]) -> bool {
        let mut t = self.tracker.0.lock();
        let Some(expect) = t.get_mut(key) else {
            return false;
        };
        let now: HashMap<&str, u64> = slices
            .iter()
            .filter_map(|s| Some((s.metadata.name.as_deref()?, rv(&s.metadata))))
            .collect();
        // Writes the cache has caught up with need no more tracking.
        expect.retain(|name, (want, at)| match (want, now.get(name.as_str())) {
            _ if at.elapsed() > TRACK_FOR => false,
            (Some(w), Some(have)) => have < w,
            (Some(_), None) => true,
            (None, Some(_)) => true,
            (None, None) => false,
        });
        !expect.is_empty()
    }

    /// What to create, update and delete for one address type (upstream's
    /// reconcileByAddressType), and the pods skipped for a missing node.
    fn plan(
        &self,
        svc: &Service,
        pods: &[Arc<Pod>],
        existing: &[Arc<EndpointSlice>],
        family: &str,
    ) -> (Plan, Vec<String>) {
        let mut plan = Plan::default();
        let mut errs = Vec::new();
        let mut existing_by_ports: BTreeMap<String, Vec<Arc<EndpointSlice>>> = BTreeMap::new();
        for s in existing {
            if owned_by(s, svc) {
                existing_by_ports
                    .entry(port_key(s.ports.as_deref().unwrap_or_default()))
                    .or_default()
                    .push(s.clone());
            } else {
                plan.delete.push((**s).clone());
            }
        }
        let publish = svc
            .spec
            .as_ref()
            .and_then(|s| s.publish_not_ready_addresses)
            .unwrap_or(false);
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        let svc_name = svc.metadata.name.as_deref().unwrap_or_default();
        let mut desired: BTreeMap<String, Desired> = BTreeMap::new();
        for pod in pods {
            if !should_pod_be_in_endpoints(pod, true) {
                continue;
            }
            let ports = endpoint_ports(svc, pod);
            let d = desired.entry(port_key(&ports)).or_insert_with(|| Desired {
                ports,
                endpoints: BTreeMap::new(),
            });
            let node_name = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or("");
            let node = self.nodes.get(node_name);
            if node.is_none() && !publish {
                // Retried later, but the slices are written without the pod meanwhile.
                errs.push(format!(
                    "skipping Pod {} for Service {ns}/{svc_name}: Node {node_name} Not Found",
                    pod.metadata.name.as_deref().unwrap_or_default()
                ));
                continue;
            }
            let ep = pod_to_endpoint(pod, node.as_deref(), svc, family);
            if !ep.addresses.is_empty() {
                d.endpoints.insert(ep_key(&ep), ep);
            }
        }
        for (k, d) in &mut desired {
            let mut d = Desired {
                ports: std::mem::take(&mut d.ports),
                endpoints: std::mem::take(&mut d.endpoints),
            };
            let have = existing_by_ports
                .get(k)
                .map(Vec::as_slice)
                .unwrap_or_default();
            Self::plan_ports(svc, have, &mut d, family, &mut plan);
        }
        for (k, slices) in &existing_by_ports {
            if !desired.contains_key(k) {
                plan.delete.extend(slices.iter().map(|s| (**s).clone()));
            }
        }
        // A Service with no endpoints still gets one (empty) slice.
        if existing.len() == plan.delete.len() && plan.create.is_empty() {
            let placeholder = new_slice(svc, Vec::new(), family);
            let same = plan.delete.len() == 1 && {
                let d = &plan.delete[0];
                d.address_type == placeholder.address_type
                    && eps_len(d) == 0
                    && d.ports.as_ref().is_none_or(Vec::is_empty)
                    && d.metadata.labels == placeholder.metadata.labels
                    && owned_by(d, svc)
            };
            if same {
                plan.delete.clear();
            } else {
                plan.create.push(placeholder);
            }
        }
        (plan, errs)
    }

    /// Upstream's reconcileByPortMapping: keep wanted endpoints where they are (updating
    /// changed ones), fill the slices being updated anyway, then the fullest unchanged
    /// slice that fits the rest, then new slices.
    fn plan_ports(
        svc: &Service,
        existing: &[Arc<EndpointSlice>],
        desired: &mut Desired,
        family: &str,
        plan: &mut Plan,
    ) {
        let mut by_name: BTreeMap<String, EndpointSlice> = BTreeMap::new();
        let mut unchanged = BTreeSet::new();
        let mut to_update = BTreeSet::new();
        for s in existing {
            let name = s.metadata.name.clone().unwrap_or_default();
            let old = s.endpoints.as_deref().unwrap_or_default();
            let mut kept = Vec::new();
            let mut changed = false;
            for e in old {
                if let Some(want) = desired.endpoints.remove(&ep_key(e)) {
                    changed |= !equal_beyond_hash(&want, e);
                    kept.push(want);
                }
            }
            let (labels, labels_changed) =
                slice_labels(s.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()), svc);
            if changed || old.len() != kept.len() {
                if kept.is_empty() {
                    plan.delete.push((**s).clone());
                    continue;
                }
                let mut n = (**s).clone();
                n.endpoints = Some(kept);
                n.metadata.labels = Some(labels);
                by_name.insert(name.clone(), n);
                to_update.insert(name);
            } else if labels_changed {
                let mut n = (**s).clone();
                n.metadata.labels = Some(labels);
                by_name.insert(name.clone(), n);
                to_update.insert(name);
            } else {
                by_name.insert(name.clone(), (**s).clone());
                unchanged.insert(name);
            }
        }
        if !desired.endpoints.is_empty() && !to_update.is_empty() {
            let mut names: Vec<String> = to_update.iter().cloned().collect();
            names.sort_by_key(|n| std::cmp::Reverse(by_name.get(n).map_or(0, eps_len)));
            for n in names {
                let Some(s) = by_name.get_mut(&n) else {
                    continue;
                };
                while eps_len(s) < MAX_ENDPOINTS_PER_SLICE {
                    let Some(e) = desired.pop() else { break };
                    s.endpoints.get_or_insert_with(Vec::new).push(e);
                }
            }
        }
        while !desired.endpoints.is_empty() {
            let left = desired.endpoints.len();
            let mut fill: Option<EndpointSlice> = None;
            if left < MAX_ENDPOINTS_PER_SLICE && !unchanged.is_empty() {
                let mut closest = MAX_ENDPOINTS_PER_SLICE;
                for n in &unchanged {
                    let Some(s) = by_name.get(n) else { continue };
                    let total = left + eps_len(s);
                    if total <= MAX_ENDPOINTS_PER_SLICE && MAX_ENDPOINTS_PER_SLICE - total < closest
                    {
                        closest = MAX_ENDPOINTS_PER_SLICE - total;
                        fill = Some(s.clone());
                    }
                }
            }
            let mut s = fill.unwrap_or_else(|| new_slice(svc, desired.ports.clone(), family));
            while eps_len(&s) < MAX_ENDPOINTS_PER_SLICE {
                let Some(e) = desired.pop() else { break };
                s.endpoints.get_or_insert_with(Vec::new).push(e);
            }
            match s.metadata.name.clone() {
                Some(n) => {
                    unchanged.remove(&n);
                    to_update.insert(n.clone());
                    by_name.insert(n, s);
                }
                None => plan.create.push(s),
            }
        }
        plan.update
            .extend(to_update.iter().filter_map(|n| by_name.remove(n)));
    }

    /// Writes a plan (upstream's finalize): a slice to create replaces one to delete by
    /// update where it can, and nothing is created for a Service being deleted.
    async fn finalize(
        &self,
        key: &str,
        svc: &Service,
        mut plan: Plan,
        trigger: Option<Timestamp>,
    ) -> Result<(), String> {
        let mut i = 0;
        while i < plan.delete.len() {
            let Some(last) = plan.create.last() else {
                break;
            };
            let d = &plan.delete[i];
            if d.address_type == last.address_type && owned_by(d, svc) {
                let d = plan.delete.remove(i);
                if let Some(mut s) = plan.create.pop() {
                    s.metadata.name = d.metadata.name;
                    s.metadata.generate_name = None;
                    s.metadata.resource_version = d.metadata.resource_version;
                    plan.update.push(s);
                }
            } else {
                i += 1;
            }
        }
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        let svc_name = svc.metadata.name.as_deref().unwrap_or_default();
        let api: Api<EndpointSlice> = Api::namespaced(self.client.get(), ns);
        if svc.metadata.deletion_timestamp.is_none() {
            for mut s in plan.create {
                set_trigger_time(&mut s.metadata, trigger);
                match api.create(&PostParams::default(), &s).await {
                    Ok(c) => self.expect(key, &c.metadata, true),
                    Err(e) if namespace_terminating(&e) => return Ok(()),
                    Err(e) => {
                        return Err(format!(
                            "failed to create EndpointSlice for Service {ns}/{svc_name}: {}",
                            message(&e)
                        ))
                    }
                }
            }
        }
        for mut s in plan.update {
            set_trigger_time(&mut s.metadata, trigger);
            let name = s.metadata.name.clone().unwrap_or_default();
            match api.replace(&name, &PostParams::default(), &s).await {
                Ok(u) => self.expect(key, &u.metadata, true),
                Err(e) => {
                    return Err(format!(
                        "failed to update {name} EndpointSlice for Service {ns}/{svc_name}: {}",
                        message(&e)
                    ))
                }
            }
        }
        for s in plan.delete {
            let name = s.metadata.name.clone().unwrap_or_default();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => self.expect(key, &s.metadata, false),
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    return Err(format!(
                        "failed to delete {name} EndpointSlice for Service {ns}/{svc_name}: {}",
                        message(&e)
                    ))
                }
            }
        }
        Ok(())
    }

    fn expect(&self, key: &str, meta: &ObjectMeta, exists: bool) {
        let Some(name) = meta.name.clone() else {
            return;
        };
        self.tracker
            .0
            .lock()
            .entry(key.to_owned())
            .or_default()
            .insert(name, (exists.then(|| rv(meta)), Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc() -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "labels": {"team": "a"}},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.0.9",
                "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}
        }))
        .expect("service")
    }

    fn endpoint(i: u32) -> Endpoint {
        Endpoint {
            addresses: vec![std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string()],
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some("ns".into()),
                name: Some(format!("p{i}")),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn desired(n: u32) -> Desired {
        Desired {
            ports: vec![],
            endpoints: (0..n).map(endpoint).map(|e| (ep_key(&e), e)).collect(),
        }
    }

    #[test]
    fn at_most_100_endpoints_per_slice() {
        let mut plan = Plan::default();
        Ctl::plan_ports(&svc(), &[], &mut desired(250), "IPv4", &mut plan);
        let sizes: Vec<usize> = plan.create.iter().map(eps_len).collect();
        assert_eq!(sizes, [100, 100, 50]);
        let labels = plan.create[0].metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(
            labels.get(LABEL_SERVICE_NAME).map(String::as_str),
            Some("web")
        );
        assert!(!labels.contains_key(LABEL_HEADLESS));
    }

    #[test]
    fn unchanged_slices_are_not_written_and_changes_fill_existing_ones() {
        let s = svc();
        let mut first = Plan::default();
        Ctl::plan_ports(&s, &[], &mut desired(3), "IPv4", &mut first);
        let mut existing = first.create.remove(0);
        existing.metadata.name = Some("web-abcde".into());
        existing.metadata.generate_name = None;
        let existing = vec![Arc::new(existing)];
        let mut again = Plan::default();
        Ctl::plan_ports(&s, &existing, &mut desired(3), "IPv4", &mut again);
        assert!(again.create.is_empty() && again.update.is_empty() && again.delete.is_empty());
        // One more endpoint fits the existing slice: an update, not a new slice.
        let mut more = Plan::default();
        Ctl::plan_ports(&s, &existing, &mut desired(4), "IPv4", &mut more);
        assert!(more.create.is_empty());
        assert_eq!(more.update.len(), 1);
        assert_eq!(eps_len(&more.update[0]), 4);
        // None left: the slice is deleted.
        let mut none = Plan::default();
        Ctl::plan_ports(&s, &existing, &mut desired(0), "IPv4", &mut none);
        assert_eq!(none.delete.len(), 1);
    }

    #[test]
    fn named_target_ports_resolve_per_pod() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "ports": [
                {"name": "http", "containerPort": 8080},
                {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]}
        }))
        .expect("pod");
        let sp = |target: &str, proto: &str| ServicePort {
            port: 80,
            target_port: Some(IntOrString::String(target.into())),
            protocol: Some(proto.into()),
            ..Default::default()
        };
        assert_eq!(find_port(&pod, &sp("http", "TCP")), Some(8080));
        assert_eq!(find_port(&pod, &sp("dns", "TCP")), None);
        assert_eq!(find_port(&pod, &sp("dns", "UDP")), Some(53));
        assert_eq!(find_port(&pod, &sp("nope", "TCP")), None);
    }
}
