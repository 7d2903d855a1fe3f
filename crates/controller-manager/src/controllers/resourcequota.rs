//! resourcequota-controller: keeps each ResourceQuota's `status.hard` (a copy of
//! `spec.hard`) and `status.used` (the usage of everything the quota tracks in its
//! namespace) current, as upstream's resource quota controller does. The ResourceQuota
//! admission plugin charges `status.used` on create; this controller recomputes it from the
//! informers' caches, so usage goes down again when objects are deleted or pods finish.
//!
//! A quota is recomputed when it is added, when its `spec.hard` changes, when an object it
//! tracks is deleted (or a pod turns terminal, a service changes type, a claim's allocated
//! storage changes: upstream's replenishment), and every 5 min for all quotas
//! (`--resource-quota-sync-period`).
//!
//! Usage follows upstream's evaluators (pkg/quota/v1/evaluator/core): pods (compute
//! requests and limits with init containers, sidecars, pod-level resources and overhead;
//! terminal pods charge only `count/pods`; the Terminating, NotTerminating, BestEffort,
//! NotBestEffort, PriorityClass and CrossNamespacePodAffinity scopes), services (node
//! ports, load balancers), persistent volume claims (storage, per storage class) and object
//! counts (`count/<resource>.<group>` of any listable resource, watched metadata-only once
//! a quota names it).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ReplicationController, ResourceQuota, Secret, Service,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta, PostParams};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::WatchStreamExt;
use kumo_apimachinery::quantity::Quantity;
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{client_for, run_workers, wait_for_sync, SyncError};
use crate::clients::{ClientBuilder, ClientSource};
use crate::error::{is_not_found, message};
use crate::informer::{key_of, Change, Informer, InformerFactory};
use crate::workqueue::WorkQueue;

/// The ServiceAccount the controller acts as.
const SERVICE_ACCOUNT: &str = "resourcequota-controller";
/// --concurrent-resource-quota-syncs.
const WORKERS: usize = 5;
/// --resource-quota-sync-period: every quota is recomputed this often.
pub const SYNC_PERIOD: Duration = Duration::from_secs(5 * 60);

/// A ResourceList: resource name to quantity, sorted by name.
pub type ResourceList = BTreeMap<String, Quantity>;

/// The ResourceList at a JSON object (unparseable quantities are left out).
fn resource_list(v: Option<&Value>) -> ResourceList {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), Quantity::from_json(v)?)))
                .collect()
        })
        .unwrap_or_default()
}

fn list_json(l: &ResourceList) -> Value {
    Value::Object(l.iter().map(|(k, q)| (k.clone(), q.json())).collect())
}

/// quota.Add.
fn add_lists(a: &ResourceList, b: &ResourceList) -> ResourceList {
    let mut out = a.clone();
    for (k, q) in b {
        out.entry(k.clone())
            .and_modify(|x| *x = x.add(q))
            .or_insert(*q);
    }
    out
}

/// maxResourceList: the larger of each quantity.
fn max_into(a: &mut ResourceList, b: &ResourceList) {
    for (k, q) in b {
        if a.get(k).is_none_or(|x| q > x) {
            a.insert(k.clone(), *q);
        }
    }
}

/// quota.Mask: only the named resources.
fn mask(l: &ResourceList, names: &BTreeSet<String>) -> ResourceList {
    l.iter()
        .filter(|(k, _)| names.contains(*k))
        .map(|(k, q)| (k.clone(), *q))
        .collect()
}

/// quota.Equals: the same names with equal quantities.
fn lists_equal(a: &ResourceList, b: &ResourceList) -> bool {
    a.len() == b.len() && a.iter().all(|(k, q)| b.get(k) == Some(q))
}

// ---------------------------------------------------------------------------------------
// Evaluators (pkg/quota/v1/evaluator/core and the generic object counter).

/// Resources no quota tracks (upstream's ignored resources).
const IGNORED: &[(&str, &str)] = &[
    ("", "bindings"),
    ("", "componentstatuses"),
    ("", "events"),
    ("events.k8s.io", "events"),
    ("authentication.k8s.io", "tokenreviews"),
    ("authentication.k8s.io", "selfsubjectreviews"),
    ("authorization.k8s.io", "subjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "localsubjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
];

const POD_RESOURCES: &[&str] = &[
    "count/pods",
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
];

const SERVICE_RESOURCES: &[&str] = &[
    "count/services",
    "services",
    "services.nodeports",
    "services.loadbalancers",
];

const STORAGE_CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";

/// `count/<resource>[.<group>]` (ObjectCountQuotaResourceNameFor).
fn count_name(group: &str, plural: &str) -> String {
    if group.is_empty() {
        format!("count/{plural}")
    } else {
        format!("count/{plural}.{group}")
    }
}

/// helper.IsNativeResource.
fn is_native(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

/// An evaluator: how a resource is charged.
#[derive(Clone, Debug, PartialEq)]
enum Evaluator {
    Pods,
    Services,
    Claims,
    /// Counts objects of (group, plural) under these names.
    Count(String, String, Vec<String>),
}

impl Evaluator {
    /// The evaluator of a group resource (the core ones, else an object counter).
    fn of(group: &str, plural: &str) -> Evaluator {
        match (group, plural) {
            ("", "pods") => Evaluator::Pods,
            ("", "services") => Evaluator::Services,
            ("", "persistentvolumeclaims") => Evaluator::Claims,
            _ => {
                let mut names = vec![count_name(group, plural)];
                if group.is_empty()
                    && matches!(
                        plural,
                        "configmaps" | "resourcequotas" | "replicationcontrollers" | "secrets"
                    )
                {
                    names.push(plural.to_owned());
                }
                Evaluator::Count(group.into(), plural.into(), names)
            }
        }
    }

    /// MatchingResources: the names among `input` this evaluator charges.
    fn matching<'a>(&self, input: impl IntoIterator<Item = &'a String>) -> BTreeSet<String> {
        input
            .into_iter()
            .filter(|r| match self {
                Evaluator::Pods => {
                    POD_RESOURCES.contains(&r.as_str())
                        || r.starts_with("hugepages-")
                        || r.starts_with("requests.hugepages-")
                        || (r.starts_with("requests.")
                            && (!is_native(r)
                                || r.starts_with("requests.deviceclass.resource.kubernetes.io/")))
                }
                Evaluator::Services => SERVICE_RESOURCES.contains(&r.as_str()),
                Evaluator::Claims => {
                    matches!(
                        r.as_str(),
                        "count/persistentvolumeclaims"
                            | "persistentvolumeclaims"
                            | "requests.storage"
                    ) || ["persistentvolumeclaims", "requests.storage"]
                        .iter()
                        .any(|x| r.ends_with(&format!("{STORAGE_CLASS_SUFFIX}{x}")))
                }
                Evaluator::Count(_, _, names) => names.contains(r),
            })
            .cloned()
            .collect()
    }

    /// Whether the object is in a scope selector's scope (MatchesScopeFunc); object
    /// counters and services match no scope.
    fn matches_scope(&self, sel: &Value, obj: &Value) -> bool {
        let scope = sel.get("scopeName").and_then(Value::as_str).unwrap_or("");
        let op = sel.get("operator").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = sel
            .get("values")
            .and_then(Value::as_array)
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        match self {
            Evaluator::Pods => match scope {
                "Terminating" => is_terminating(obj),
                "NotTerminating" => !is_terminating(obj),
                "BestEffort" => is_best_effort(obj),
                "NotBestEffort" => !is_best_effort(obj),
                "PriorityClass" => {
                    let pc = obj
                        .pointer("/spec/priorityClassName")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    // The scope as a label that every pod has (podMatchesSelector).
                    match op {
                        "Exists" => !pc.is_empty(),
                        "DoesNotExist" => false,
                        "In" => values.contains(&pc),
                        "NotIn" => !values.contains(&pc),
                        _ => false,
                    }
                }
                "CrossNamespacePodAffinity" => uses_cross_namespace_affinity(obj),
                _ => false,
            },
            Evaluator::Claims if scope == "VolumeAttributesClass" => {
                let names = claim_vac_names(obj);
                match op {
                    "Exists" => !names.is_empty(),
                    "DoesNotExist" => names.is_empty(),
                    "In" => names.iter().any(|n| values.contains(&n.as_str())),
                    "NotIn" => {
                        names.is_empty() || names.iter().any(|n| !values.contains(&n.as_str()))
                    }
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// Usage: what the object charges.
    fn usage(&self, obj: &Value, now: i64) -> ResourceList {
        let mut out = ResourceList::new();
        match self {
            Evaluator::Pods => {
                out.insert("count/pods".into(), Quantity::int(1));
                if !charges_compute(obj, now) {
                    return out;
                }
                let (requests, limits) = pod_requests_limits(obj);
                out = add_lists(&out, &compute_usage(&requests, &limits));
            }
            Evaluator::Services => {
                out.insert("count/services".into(), Quantity::int(1));
                out.insert("services".into(), Quantity::int(1));
                let ports = obj
                    .pointer("/spec/ports")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                let n = |x: usize| Quantity::int(i64::try_from(x).unwrap_or(i64::MAX));
                let (mut node_ports, mut lbs) = (Quantity::zero(), Quantity::zero());
                match obj.pointer("/spec/type").and_then(Value::as_str) {
                    Some("NodePort") => node_ports = n(ports.len()),
                    Some("LoadBalancer") => {
                        node_ports = if obj
                            .pointer("/spec/allocateLoadBalancerNodePorts")
                            .and_then(Value::as_bool)
                            == Some(false)
                        {
                            n(ports
                                .iter()
                                .filter(|p| {
                                    p.get("nodePort").and_then(Value::as_i64).unwrap_or(0) != 0
                                })
                                .count())
                        } else {
                            n(ports.len())
                        };
                        lbs = Quantity::int(1);
                    }
                    _ => {}
                }
                out.insert("services.loadbalancers".into(), lbs);
                out.insert("services.nodeports".into(), node_ports);
            }
            Evaluator::Claims => {
                out.insert("persistentvolumeclaims".into(), Quantity::int(1));
                out.insert("count/persistentvolumeclaims".into(), Quantity::int(1));
                let class = claim_class(obj);
                if !class.is_empty() {
                    out.insert(
                        format!("{class}{STORAGE_CLASS_SUFFIX}persistentvolumeclaims"),
                        Quantity::int(1),
                    );
                }
                let mut storage = obj
                    .pointer("/spec/resources/requests/storage")
                    .and_then(Quantity::from_json)
                    .map(|q| q.round_up_whole());
                if let Some(req) = storage {
                    if let Some(alloc) = obj
                        .pointer("/status/allocatedResources/storage")
                        .and_then(Quantity::from_json)
                    {
                        if alloc > req {
                            storage = Some(alloc.round_up_whole());
                        }
                    }
                }
                if let Some(s) = storage {
                    out.insert("requests.storage".into(), s);
                    if !class.is_empty() {
                        out.insert(format!("{class}{STORAGE_CLASS_SUFFIX}requests.storage"), s);
                    }
                }
            }
            Evaluator::Count(_, _, names) => {
                for n in names {
                    out.insert(n.clone(), Quantity::int(1));
                }
            }
        }
        out
    }
}

/// The containers of one list of a pod spec.
fn containers<'a>(pod: &'a Value, list: &str) -> impl Iterator<Item = &'a Value> {
    pod.pointer(&format!("/spec/{list}"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn container_resources(c: &Value, which: &str) -> ResourceList {
    resource_list(c.pointer(&format!("/resources/{which}")))
}

/// The pod's requests or limits from its containers: the containers and sidecars summed,
/// or the largest init container plus the sidecars started before it
/// (AggregateContainerRequests/Limits).
fn aggregate_containers(pod: &Value, which: &str) -> ResourceList {
    let mut out = ResourceList::new();
    for c in containers(pod, "containers") {
        out = add_lists(&out, &container_resources(c, which));
    }
    let mut sidecars = ResourceList::new();
    let mut init_max = ResourceList::new();
    for c in containers(pod, "initContainers") {
        let r = container_resources(c, which);
        let effective = if c.get("restartPolicy").and_then(Value::as_str) == Some("Always") {
            out = add_lists(&out, &r);
            sidecars = add_lists(&sidecars, &r);
            sidecars.clone()
        } else {
            add_lists(&r, &sidecars)
        };
        max_into(&mut init_max, &effective);
    }
    max_into(&mut out, &init_max);
    out
}

/// A pod with activeDeadlineSeconds is in the Terminating scope.
fn is_terminating(pod: &Value) -> bool {
    pod.pointer("/spec/activeDeadlineSeconds")
        .and_then(Value::as_i64)
        .is_some_and(|s| s >= 0)
}

/// The BestEffort QoS class: no cpu or memory requested or limited anywhere.
fn is_best_effort(pod: &Value) -> bool {
    if let Some(q) = pod.pointer("/status/qosClass").and_then(Value::as_str) {
        if !q.is_empty() {
            return q == "BestEffort";
        }
    }
    let set = |l: ResourceList| {
        l.iter()
            .any(|(k, q)| (k == "cpu" || k == "memory") && !q.is_zero())
    };
    let containers_set = ["containers", "initContainers"].iter().any(|l| {
        containers(pod, l).any(|c| {
            set(container_resources(c, "requests")) || set(container_resources(c, "limits"))
        })
    });
    let pod_level = ["requests", "limits"]
        .iter()
        .any(|w| set(resource_list(pod.pointer(&format!("/spec/resources/{w}")))));
    !containers_set && !pod_level
}

fn uses_cross_namespace_affinity(pod: &Value) -> bool {
    let cross = |t: &Value| {
        t.get("namespaces")
            .and_then(Value::as_array)
            .is_some_and(|n| !n.is_empty())
            || t.get("namespaceSelector").is_some_and(|s| !s.is_null())
    };
    ["podAffinity", "podAntiAffinity"].iter().any(|kind| {
        let Some(a) = pod.pointer(&format!("/spec/affinity/{kind}")) else {
            return false;
        };
        let required = a
            .get("requiredDuringSchedulingIgnoredDuringExecution")
            .and_then(Value::as_array)
            .is_some_and(|ts| ts.iter().any(cross));
        let preferred = a
            .get("preferredDuringSchedulingIgnoredDuringExecution")
            .and_then(Value::as_array)
            .is_some_and(|ts| {
                ts.iter()
                    .any(|w| w.get("podAffinityTerm").is_some_and(cross))
            });
        required || preferred
    })
}

/// QuotaV1Pod: a pod charges compute resources until it is terminal or past its deletion
/// grace period.
fn charges_compute(pod: &Value, now: i64) -> bool {
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    if matches!(phase, Some("Failed") | Some("Succeeded")) {
        return false;
    }
    if let (Some(ts), Some(grace)) = (
        pod.pointer("/metadata/deletionTimestamp")
            .and_then(Value::as_str),
        pod.pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64),
    ) {
        if let Ok(t) = ts.parse::<Timestamp>() {
            if now > t.as_second().saturating_add(grace) {
                return false;
            }
        }
    }
    true
}

fn pod_level_resources_set(pod: &Value) -> bool {
    ["requests", "limits"].iter().any(|w| {
        resource_list(pod.pointer(&format!("/spec/resources/{w}")))
            .keys()
            .any(|k| k == "cpu" || k == "memory")
    })
}

/// PodRequests and PodLimits: the containers', pod-level cpu and memory over them, plus
/// the overhead (added to limits only where a limit is set).
fn pod_requests_limits(pod: &Value) -> (ResourceList, ResourceList) {
    let mut requests = aggregate_containers(pod, "requests");
    let mut limits = aggregate_containers(pod, "limits");
    let supported = |k: &str| k == "cpu" || k == "memory";
    for (k, q) in resource_list(pod.pointer("/spec/resources/requests")) {
        if supported(&k) {
            requests.insert(k, q);
        }
    }
    if pod_level_resources_set(pod) {
        for (k, q) in resource_list(pod.pointer("/spec/resources/limits")) {
            if supported(&k) {
                limits.insert(k, q);
            }
        }
    }
    let overhead = resource_list(pod.pointer("/spec/overhead"));
    requests = add_lists(&requests, &overhead);
    for (k, q) in overhead {
        if let Some(l) = limits.get_mut(&k).filter(|l| !l.is_zero()) {
            *l = l.add(&q);
        }
    }
    (requests, limits)
}

/// podComputeUsageHelper: the quota names requests and limits charge.
fn compute_usage(requests: &ResourceList, limits: &ResourceList) -> ResourceList {
    let mut out = ResourceList::new();
    out.insert("pods".into(), Quantity::int(1));
    for r in ["cpu", "memory", "ephemeral-storage"] {
        if let Some(q) = requests.get(r) {
            out.insert(r.into(), *q);
            out.insert(format!("requests.{r}"), *q);
        }
        if let Some(q) = limits.get(r) {
            out.insert(format!("limits.{r}"), *q);
        }
    }
    for (r, q) in requests {
        if r.starts_with("hugepages-") {
            out.insert(r.clone(), *q);
            out.insert(format!("requests.{r}"), *q);
        } else if (!is_native(r) && !r.starts_with("requests."))
            || r.starts_with("deviceclass.resource.kubernetes.io/")
        {
            out.insert(format!("requests.{r}"), *q);
        }
    }
    out
}

/// GetPersistentVolumeClaimClass.
fn claim_class(pvc: &Value) -> String {
    if let Some(c) = pvc
        .pointer("/metadata/annotations/volume.beta.kubernetes.io~1storage-class")
        .and_then(Value::as_str)
    {
        return c.to_owned();
    }
    pvc.pointer("/spec/storageClassName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// The VolumeAttributesClasses a claim refers to (spec, current and target).
fn claim_vac_names(pvc: &Value) -> BTreeSet<String> {
    [
        "/spec/volumeAttributesClassName",
        "/status/currentVolumeAttributesClassName",
        "/status/modifyVolumeStatus/targetVolumeAttributesClassName",
    ]
    .iter()
    .filter_map(|p| pvc.pointer(p).and_then(Value::as_str))
    .filter(|s| !s.is_empty())
    .map(str::to_owned)
    .collect()
}

/// The scope selectors of a quota: its scopes (as Exists) and its scopeSelector.
fn quota_selectors(q: &ResourceQuota) -> Vec<Value> {
    let Some(spec) = q.spec.as_ref() else {
        return Vec::new();
    };
    let mut out: Vec<Value> = spec
        .scopes
        .iter()
        .flatten()
        .map(|s| json!({"scopeName": s, "operator": "Exists"}))
        .collect();
    if let Some(m) = spec
        .scope_selector
        .as_ref()
        .and_then(|s| s.match_expressions.as_ref())
    {
        out.extend(m.iter().filter_map(|e| serde_json::to_value(e).ok()));
    }
    out
}

fn hard_of(q: &ResourceQuota) -> ResourceList {
    let v = q
        .spec
        .as_ref()
        .and_then(|s| s.hard.as_ref())
        .and_then(|h| serde_json::to_value(h).ok());
    resource_list(v.as_ref())
}

fn status_list(q: &ResourceQuota, field: &str) -> Option<ResourceList> {
    let s = q.status.as_ref()?;
    let l = if field == "hard" {
        s.hard.as_ref()
    } else {
        s.used.as_ref()
    }?;
    let v = serde_json::to_value(l).ok()?;
    Some(resource_list(Some(&v)))
}

// ---------------------------------------------------------------------------------------
// Object-count monitors for resources without a typed informer.

/// The names of the objects of one resource, by namespace, from a metadata-only watch.
struct Monitor {
    items: RwLock<HashMap<String, HashSet<String>>>,
    synced: AtomicBool,
}

impl Monitor {
    fn count(&self, ns: &str) -> usize {
        self.items.read().get(ns).map_or(0, HashSet::len)
    }
}

/// (group, plural).
type GroupResource = (String, String);

/// What the controller watches, shared with its handlers.
struct Ctl {
    client: ClientSource,
    quotas: Arc<Informer<ResourceQuota>>,
    pods: Arc<Informer<Pod>>,
    services: Arc<Informer<Service>>,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    configmaps: Arc<Informer<ConfigMap>>,
    secrets: Arc<Informer<Secret>>,
    rcs: Arc<Informer<ReplicationController>>,
    queue: Arc<WorkQueue<String>>,
    /// (group, plural) → its monitor, or None when discovery does not serve it as a
    /// quotable resource.
    monitors: Mutex<HashMap<GroupResource, Option<Arc<Monitor>>>>,
    stop: watch::Receiver<bool>,
}

/// Queues the quotas in `ns` that track what `ev` charges (replenishQuota).
fn replenish(
    quotas: &Informer<ResourceQuota>,
    queue: &WorkQueue<String>,
    ev: &Evaluator,
    ns: &str,
) {
    for q in quotas.list() {
        if q.metadata.namespace.as_deref() != Some(ns) {
            continue;
        }
        let hard = status_list(&q, "hard").unwrap_or_default();
        if !ev.matching(hard.keys()).is_empty() {
            queue.add(key_of(q.as_ref()));
        }
    }
}

fn to_json<K: Serialize>(o: &K) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}

/// Registers replenishment on deletion (and on the updates `changed` flags) of `K`.
fn watch_replenish<K: crate::informer::Watchable + Serialize>(
    inf: &Informer<K>,
    quotas: &Arc<Informer<ResourceQuota>>,
    queue: &Arc<WorkQueue<String>>,
    ev: Evaluator,
    changed: fn(&Value, &Value) -> bool,
) {
    let (quotas, queue) = (quotas.clone(), queue.clone());
    inf.add_handler(move |c| {
        let (obj, fire) = match c {
            Change::Deleted(o) => (o, true),
            Change::Updated { old, new } => (new, changed(&to_json(old), &to_json(new))),
            Change::Added(_) => return,
        };
        if fire {
            let ns = obj.meta().namespace.clone().unwrap_or_default();
            replenish(&quotas, &queue, &ev, &ns);
        }
    });
}

/// The pod updates that change usage (DefaultUpdateFilter).
fn pod_changed(old: &Value, new: &Value) -> bool {
    let now = Timestamp::now().as_second();
    let resources = |p: &Value| -> Vec<Value> {
        ["containerStatuses", "initContainerStatuses"]
            .iter()
            .flat_map(|l| {
                p.pointer(&format!("/status/{l}"))
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|s| json!([s["name"], s["resources"]]))
            .collect()
    };
    let (ro, rn) = (resources(old), resources(new));
    let resized = ro
        .iter()
        .any(|o| rn.iter().any(|n| n[0] == o[0] && n[1] != o[1]));
    resized
        || is_terminating(old) != is_terminating(new)
        || (charges_compute(old, now) && !charges_compute(new, now))
}

fn service_changed(old: &Value, new: &Value) -> bool {
    let t = |s: &Value| match s.pointer("/spec/type").and_then(Value::as_str) {
        Some(x @ ("NodePort" | "LoadBalancer")) => x.to_owned(),
        _ => String::new(),
    };
    t(old) != t(new)
}

fn claim_changed(old: &Value, new: &Value) -> bool {
    let alloc = |o: &Value| {
        o.pointer("/status/allocatedResources/storage")
            .and_then(Quantity::from_json)
    };
    alloc(old) != alloc(new) || claim_vac_names(old) != claim_vac_names(new)
}

fn never(_: &Value, _: &Value) -> bool {
    false
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = WorkQueue::<String>::new("resourcequota_primary");
    let quotas = factory.informer::<ResourceQuota>();
    let pods = factory.informer::<Pod>();
    let services = factory.informer::<Service>();
    let claims = factory.informer::<PersistentVolumeClaim>();
    let configmaps = factory.informer::<ConfigMap>();
    let secrets = factory.informer::<Secret>();
    let rcs = factory.informer::<ReplicationController>();

    let (q, qs) = (queue.clone(), quotas.clone());
    quotas.add_handler(move |c| match c {
        Change::Added(rq) => q.add(key_of(rq)),
        // Only a change of spec.hard needs a new status; status writes (ours and the
        // admission plugin's) do not.
        Change::Updated { old, new } => {
            if !lists_equal(&hard_of(old), &hard_of(new)) {
                q.add(key_of(new));
            }
        }
        Change::Deleted(rq) => {
            q.add(key_of(rq));
            let ns = rq.metadata.namespace.clone().unwrap_or_default();
            replenish(&qs, &q, &Evaluator::of("", "resourcequotas"), &ns);
        }
    });
    watch_replenish(&pods, &quotas, &queue, Evaluator::Pods, pod_changed);
    watch_replenish(
        &services,
        &quotas,
        &queue,
        Evaluator::Services,
        service_changed,
    );
    watch_replenish(&claims, &quotas, &queue, Evaluator::Claims, claim_changed);
    watch_replenish(
        &configmaps,
        &quotas,
        &queue,
        Evaluator::of("", "configmaps"),
        never,
    );
    watch_replenish(
        &secrets,
        &quotas,
        &queue,
        Evaluator::of("", "secrets"),
        never,
    );
    watch_replenish(
        &rcs,
        &quotas,
        &queue,
        Evaluator::of("", "replicationcontrollers"),
        never,
    );

    tokio::spawn(async move {
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            quotas,
            pods,
            services,
            claims,
            configmaps,
            secrets,
            rcs,
            queue: queue.clone(),
            monitors: Mutex::default(),
            stop: stop.clone(),
        });
        let synced = async {
            ctl.quotas.wait_synced().await;
            ctl.pods.wait_synced().await;
            ctl.services.wait_synced().await;
            ctl.claims.wait_synced().await;
            ctl.configmaps.wait_synced().await;
            ctl.secrets.wait_synced().await;
            ctl.rcs.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let c = ctl.clone();
        let mut tasks = run_workers("resourcequota", queue, WORKERS, stop.clone(), move |key| {
            let c = c.clone();
            async move { c.sync(&key).await }
        });
        // The full resync.
        let c = ctl.clone();
        let mut s = stop.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(SYNC_PERIOD) => {}
                    _ = s.wait_for(|s| *s) => return,
                }
                for q in c.quotas.list() {
                    c.queue.add(key_of(q.as_ref()));
                }
            }
        }));
        for t in tasks {
            let _ = t.await;
        }
    })
}

/// Why an evaluator could not compute usage; its resources keep their last usage.
struct NotReady(String);

impl Ctl {
    /// The evaluators for a quota's hard resources: the core ones, plus an object counter
    /// for each other `count/<resource>.<group>` that discovery serves.
    async fn evaluators(
        self: &Arc<Self>,
        hard: &ResourceList,
    ) -> Vec<(Evaluator, Option<Arc<Monitor>>)> {
        let mut out: Vec<(Evaluator, Option<Arc<Monitor>>)> = [
            Evaluator::Pods,
            Evaluator::Services,
            Evaluator::Claims,
            Evaluator::of("", "configmaps"),
            Evaluator::of("", "secrets"),
            Evaluator::of("", "replicationcontrollers"),
            Evaluator::of("", "resourcequotas"),
        ]
        .into_iter()
        .map(|e| (e, None))
        .collect();
        for name in hard.keys() {
            let Some(rest) = name.strip_prefix("count/") else {
                continue;
            };
            if out.iter().any(|(e, _)| !e.matching([name]).is_empty()) {
                continue;
            }
            let (plural, group) = match rest.split_once('.') {
                Some((p, g)) => (p.to_owned(), g.to_owned()),
                None => (rest.to_owned(), String::new()),
            };
            if plural.is_empty() || IGNORED.contains(&(group.as_str(), plural.as_str())) {
                continue;
            }
            if let Some(m) = self.monitor(&group, &plural).await {
                let ev = Evaluator::of(&group, &plural);
                if !ev.matching([name]).is_empty() {
                    out.push((ev, Some(m)));
                }
            }
        }
        out
    }

    /// The monitor of (group, plural), started on first use; None when discovery does
    /// not serve it with create, list, watch and delete.
    async fn monitor(self: &Arc<Self>, group: &str, plural: &str) -> Option<Arc<Monitor>> {
        let key = (group.to_owned(), plural.to_owned());
        if let Some(m) = self.monitors.lock().get(&key) {
            return m.clone();
        }
        let ar = match self.discover(group, plural).await {
            Ok(ar) => ar,
            Err(e) => {
                // Not remembered: discovery may work next time.
                tracing::warn!(group, resource = plural, error = %e, "discovery failed");
                return None;
            }
        };
        let mut monitors = self.monitors.lock();
        if let Some(m) = monitors.get(&key) {
            return m.clone();
        }
        let m = ar.map(|ar| {
            let m = Arc::new(Monitor {
                items: RwLock::default(),
                synced: AtomicBool::new(false),
            });
            tokio::spawn(self.clone().run_monitor(ar, m.clone()));
            m
        });
        monitors.insert(key, m.clone());
        m
    }

    /// The preferred version of (group, plural) if it is quotable (GetQuotableResources).
    async fn discover(&self, group: &str, plural: &str) -> Result<Option<ApiResource>, String> {
        let client = self.client.get();
        let version = if group.is_empty() {
            "v1".to_owned()
        } else {
            let groups = client.list_api_groups().await.map_err(|e| message(&e))?;
            let Some(g) = groups.groups.into_iter().find(|g| g.name == group) else {
                return Ok(None);
            };
            match g
                .preferred_version
                .map(|p| p.version)
                .or_else(|| g.versions.first().map(|v| v.version.clone()))
            {
                Some(v) => v,
                None => return Ok(None),
            }
        };
        let gv = if group.is_empty() {
            version.clone()
        } else {
            format!("{group}/{version}")
        };
        let list = if group.is_empty() {
            client.list_core_api_resources(&version).await
        } else {
            client.list_api_group_resources(&gv).await
        };
        let list = match list {
            Ok(l) => l,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(message(&e)),
        };
        Ok(list
            .resources
            .into_iter()
            .find(|r| {
                r.name == plural
                    && r.namespaced
                    && ["create", "list", "watch", "delete"]
                        .iter()
                        .all(|v| r.verbs.iter().any(|x| x == v))
            })
            .map(|r| ApiResource {
                group: group.to_owned(),
                version: version.clone(),
                api_version: gv.clone(),
                kind: r.kind,
                plural: r.name,
            }))
    }

    /// One resource's metadata-only watch; a deletion replenishes the namespace's quotas.
    async fn run_monitor(self: Arc<Self>, ar: ApiResource, m: Arc<Monitor>) {
        let ev = Evaluator::of(&ar.group, &ar.plural);
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(self.client.get(), &ar);
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        let mut stop = self.stop.clone();
        let mut listing: Option<HashMap<String, HashSet<String>>> = None;
        let id = |o: &PartialObjectMeta<DynamicObject>| {
            (
                o.metadata.namespace.clone().unwrap_or_default(),
                o.metadata.name.clone().unwrap_or_default(),
            )
        };
        loop {
            let e = tokio::select! {
                e = stream.next() => e,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Some(e) = e else { return };
            match e {
                Ok(WatchEvent::Init) => listing = Some(HashMap::new()),
                Ok(WatchEvent::InitApply(o)) => {
                    let (ns, name) = id(&o);
                    listing
                        .get_or_insert_with(HashMap::new)
                        .entry(ns)
                        .or_default()
                        .insert(name);
                }
                Ok(WatchEvent::InitDone) => {
                    let listed = listing.take().unwrap_or_default();
                    let old = std::mem::replace(&mut *m.items.write(), listed.clone());
                    m.synced.store(true, Ordering::SeqCst);
                    // Namespaces that lost objects while the watch was down.
                    for (ns, names) in old {
                        if names
                            .iter()
                            .any(|n| !listed.get(&ns).is_some_and(|l| l.contains(n)))
                        {
                            replenish(&self.quotas, &self.queue, &ev, &ns);
                        }
                    }
                }
                Ok(WatchEvent::Apply(o)) => {
                    let (ns, name) = id(&o);
                    m.items.write().entry(ns).or_default().insert(name);
                }
                Ok(WatchEvent::Delete(o)) => {
                    let (ns, name) = id(&o);
                    if let Some(s) = m.items.write().get_mut(&ns) {
                        s.remove(&name);
                    }
                    replenish(&self.quotas, &self.queue, &ev, &ns);
                }
                Err(e) => {
                    tracing::debug!(resource = %ar.plural, group = %ar.group, error = %e, "watch failed; retrying")
                }
            }
        }
    }

    /// The objects `ev` evaluates in `ns`, as JSON; for monitored resources, only as many
    /// empty objects as there are.
    fn items(&self, ev: &Evaluator, m: Option<&Monitor>, ns: &str) -> Result<Vec<Value>, NotReady> {
        fn of<K: crate::informer::Watchable + Serialize>(
            inf: &Informer<K>,
            ns: &str,
        ) -> Vec<Value> {
            inf.list()
                .iter()
                .filter(|o| o.meta().namespace.as_deref() == Some(ns))
                .map(|o| to_json(o.as_ref()))
                .collect()
        }
        let count = |n: usize| vec![Value::Null; n];
        Ok(match ev {
            Evaluator::Pods => of(&self.pods, ns),
            Evaluator::Services => of(&self.services, ns),
            Evaluator::Claims => of(&self.claims, ns),
            Evaluator::Count(g, p, _) if g.is_empty() => match p.as_str() {
                "configmaps" => of(&self.configmaps, ns),
                "secrets" => of(&self.secrets, ns),
                "replicationcontrollers" => of(&self.rcs, ns),
                "resourcequotas" => of(&self.quotas, ns),
                _ => self.counted(m, g, p, ns).map(count)?,
            },
            Evaluator::Count(g, p, _) => self.counted(m, g, p, ns).map(count)?,
        })
    }

    fn counted(
        &self,
        m: Option<&Monitor>,
        group: &str,
        plural: &str,
        ns: &str,
    ) -> Result<usize, NotReady> {
        match m {
            Some(m) if m.synced.load(Ordering::SeqCst) => Ok(m.count(ns)),
            _ => {
                let gvr = if group.is_empty() {
                    plural.to_owned()
                } else {
                    format!("{group}/{plural}")
                };
                Err(NotReady(format!(
                    "failed to list content: {gvr} not yet synced"
                )))
            }
        }
    }

    /// CalculateUsage: the usage of every hard resource some evaluator can compute, and
    /// the errors of those that could not.
    async fn calculate_usage(
        self: &Arc<Self>,
        rq: &ResourceQuota,
        hard: &ResourceList,
    ) -> (ResourceList, Vec<String>) {
        let ns = rq.metadata.namespace.clone().unwrap_or_default();
        let evaluators = self.evaluators(hard).await;
        let mut matched: BTreeSet<String> = BTreeSet::new();
        for (e, _) in &evaluators {
            matched.extend(e.matching(hard.keys()));
        }
        let selectors = quota_selectors(rq);
        let now = Timestamp::now().as_second();
        let mut usage = ResourceList::new();
        let mut errors = Vec::new();
        for (ev, m) in &evaluators {
            let inter = ev.matching(&matched);
            if inter.is_empty() {
                continue;
            }
            let items = match self.items(ev, m.as_deref(), &ns) {
                Ok(i) => i,
                Err(NotReady(e)) => {
                    errors.push(e);
                    matched.retain(|r| !inter.contains(r));
                    continue;
                }
            };
            // CalculateUsageStats: every tracked resource starts at zero.
            let mut used: ResourceList = inter
                .iter()
                .map(|r| (r.clone(), Quantity::zero()))
                .collect();
            for item in &items {
                if selectors.iter().all(|s| ev.matches_scope(s, item)) {
                    used = add_lists(&used, &ev.usage(item, now));
                }
            }
            usage = add_lists(&usage, &used);
        }
        (mask(&usage, &matched), errors)
    }

    async fn sync(self: &Arc<Self>, key: &str) -> Result<(), SyncError> {
        let Some(rq) = self.quotas.get(key) else {
            return Ok(());
        };
        let hard = hard_of(&rq);
        let old_hard = status_list(&rq, "hard");
        let old_used = status_list(&rq, "used");
        let mut dirty = old_hard.is_none()
            || old_used.is_none()
            || !lists_equal(&hard, old_hard.as_ref().unwrap_or(&ResourceList::new()));
        let old_used = old_used.unwrap_or_default();
        let (usage, errors) = self.calculate_usage(&rq, &hard).await;
        let mut used = old_used.clone();
        used.extend(usage);
        let names: BTreeSet<String> = hard.keys().cloned().collect();
        let used = mask(&used, &names);
        dirty = dirty || !lists_equal(&used, &old_used);
        let mut errors = errors;
        if dirty {
            let mut obj = to_json(rq.as_ref());
            let mut status = serde_json::Map::new();
            if !hard.is_empty() {
                status.insert("hard".into(), list_json(&hard));
            }
            if !used.is_empty() {
                status.insert("used".into(), list_json(&used));
            }
            obj["status"] = Value::Object(status);
            let next: ResourceQuota = serde_json::from_value(obj)
                .map_err(|e| SyncError::Failed(format!("encoding the status: {e}")))?;
            let api: Api<ResourceQuota> = Api::namespaced(
                self.client.get(),
                rq.metadata.namespace.as_deref().unwrap_or_default(),
            );
            match api
                .replace_status(
                    rq.metadata.name.as_deref().unwrap_or_default(),
                    &PostParams::default(),
                    &next,
                )
                .await
            {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => return Ok(()),
                Err(e) => errors.push(message(&e)),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SyncError::Failed(errors.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(l: &ResourceList) -> BTreeMap<String, String> {
        l.iter().map(|(k, v)| (k.clone(), v.to_string())).collect()
    }

    #[test]
    fn pod_usage_counts_init_containers_sidecars_and_overhead() {
        let pod = json!({"spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "250m"}}},
            ],
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "init", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            ],
            "overhead": {"cpu": "10m", "memory": "1Mi"},
        }});
        let u = strings(&Evaluator::Pods.usage(&pod, 0));
        // Containers 500m + sidecar 100m = 600m < init 1 + sidecar 100m = 1100m; + overhead.
        assert_eq!(u["requests.cpu"], "1110m");
        assert_eq!(u["cpu"], "1110m");
        assert_eq!(u["requests.memory"], "1025Mi");
        assert_eq!(u["limits.cpu"], "510m");
        assert_eq!(u["limits.memory"], "129Mi");
        assert_eq!(u["pods"], "1");
        assert_eq!(u["count/pods"], "1");
        // A finished pod charges only its object count.
        let mut done = pod.clone();
        done["status"] = json!({"phase": "Succeeded"});
        assert_eq!(
            strings(&Evaluator::Pods.usage(&done, 0)),
            BTreeMap::from([("count/pods".to_owned(), "1".to_owned())])
        );
    }

    #[test]
    fn scopes_select_pods() {
        let be = json!({"spec": {"containers": [{"name": "a"}]}});
        let burst = json!({"spec": {"activeDeadlineSeconds": 10, "priorityClassName": "high",
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}]}});
        let s = |name: &str| json!({"scopeName": name, "operator": "Exists"});
        let p = Evaluator::Pods;
        assert!(p.matches_scope(&s("BestEffort"), &be));
        assert!(!p.matches_scope(&s("BestEffort"), &burst));
        assert!(p.matches_scope(&s("NotBestEffort"), &burst));
        assert!(p.matches_scope(&s("Terminating"), &burst));
        assert!(p.matches_scope(&s("NotTerminating"), &be));
        let pc =
            |op: &str| json!({"scopeName": "PriorityClass", "operator": op, "values": ["high"]});
        assert!(p.matches_scope(&pc("In"), &burst));
        assert!(!p.matches_scope(&pc("In"), &be));
        assert!(p.matches_scope(&pc("NotIn"), &be));
        assert!(p.matches_scope(&s("PriorityClass"), &burst));
        assert!(!p.matches_scope(&s("PriorityClass"), &be));
        // Object counters match no scope.
        assert!(!Evaluator::of("", "configmaps").matches_scope(&s("BestEffort"), &be));
    }

    #[test]
    fn matching_resources_by_evaluator() {
        let hard: Vec<String> = [
            "pods",
            "requests.cpu",
            "count/configmaps",
            "configmaps",
            "services.nodeports",
            "requests.storage",
            "gold.storageclass.storage.k8s.io/requests.storage",
            "count/deployments.apps",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let m = |e: Evaluator| e.matching(&hard).into_iter().collect::<Vec<_>>();
        assert_eq!(m(Evaluator::Pods), ["pods", "requests.cpu"]);
        assert_eq!(
            m(Evaluator::of("", "configmaps")),
            ["configmaps", "count/configmaps"]
        );
        assert_eq!(m(Evaluator::Services), ["services.nodeports"]);
        assert_eq!(
            m(Evaluator::Claims),
            [
                "gold.storageclass.storage.k8s.io/requests.storage",
                "requests.storage"
            ]
        );
        assert_eq!(
            m(Evaluator::of("apps", "deployments")),
            ["count/deployments.apps"]
        );
    }
}
