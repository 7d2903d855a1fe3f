//! ResourceQuota admission (upstream's `ResourceQuota` plugin, validating phase), and the
//! resource.Quantity arithmetic it and LimitRanger need.
//!
//! Every create (and the updates the evaluators care about) of an object in a namespace
//! with ResourceQuotas is charged against each matching quota's `status.hard`; the new
//! `status.used` is written back with a compare-and-swap before the object is stored, as
//! upstream's quota evaluator does, so two writers cannot both take the last unit.
//! Quotas without `status.hard` (not yet seen by the quota controller) constrain nothing,
//! as upstream.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kumo_apimachinery::status::{ApiError, GroupResource};
use kumo_storage::{RangeRequest, StorageError};
use serde_json::{json, Value};

use super::{Attributes, Operation, Plugin};

pub use kumo_apimachinery::quantity::{Format, Quantity};

/// A ResourceList: resource name to quantity, sorted by name.
pub type ResourceList = BTreeMap<String, Quantity>;

/// The ResourceList at a JSON object (unparseable quantities are left out: validation
/// refuses them).
pub fn resource_list(v: Option<&Value>) -> ResourceList {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), Quantity::from_json(v)?)))
                .collect()
        })
        .unwrap_or_default()
}

/// A ResourceList as JSON.
pub fn list_json(l: &ResourceList) -> Value {
    Value::Object(l.iter().map(|(k, q)| (k.clone(), q.json())).collect())
}

/// `a + b`, key by key (quota.Add).
pub fn add_lists(a: &ResourceList, b: &ResourceList) -> ResourceList {
    let mut out = a.clone();
    for (k, q) in b {
        out.entry(k.clone())
            .and_modify(|x| *x = x.add(q))
            .or_insert(*q);
    }
    out
}

/// Adds `b` into `a` (addResourceList).
pub fn add_into(a: &mut ResourceList, b: &ResourceList) {
    *a = add_lists(a, b);
}

/// Keeps in `a` the larger of each of `b`'s quantities (maxResourceList).
pub fn max_into(a: &mut ResourceList, b: &ResourceList) {
    for (k, q) in b {
        match a.get(k) {
            Some(x) if q.cmp(x) != Ordering::Greater => {}
            _ => {
                a.insert(k.clone(), *q);
            }
        }
    }
}

/// The containers of a pod spec in one list.
fn containers<'a>(pod: &'a Value, list: &str) -> impl Iterator<Item = &'a Value> {
    pod.pointer(&format!("/spec/{list}"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// A container's requests or limits (`which`).
pub fn container_resources(c: &Value, which: &str) -> ResourceList {
    resource_list(c.pointer(&format!("/resources/{which}")))
}

/// The pod's effective requests or limits from its containers: the sum of the containers
/// and sidecars, or the largest init container plus the sidecars started before it, as
/// upstream's AggregateContainerRequests/Limits.
pub fn aggregate_containers(pod: &Value, which: &str) -> ResourceList {
    let mut out = ResourceList::new();
    for c in containers(pod, "containers") {
        add_into(&mut out, &container_resources(c, which));
    }
    let mut sidecars = ResourceList::new();
    let mut init_max = ResourceList::new();
    for c in containers(pod, "initContainers") {
        let r = container_resources(c, which);
        let effective = if c.get("restartPolicy").and_then(Value::as_str) == Some("Always") {
            add_into(&mut out, &r);
            add_into(&mut sidecars, &r);
            sidecars.clone()
        } else {
            add_lists(&r, &sidecars)
        };
        max_into(&mut init_max, &effective);
    }
    max_into(&mut out, &init_max);
    out
}

// ---------------------------------------------------------------------------------------
// Shared admission helpers
// ---------------------------------------------------------------------------------------

/// admission.NewForbidden: `<resource> "<name>" is forbidden: <why>`, the name being the
/// request's, else the object's generateName, else `Unknown`.
pub fn forbidden(a: &Attributes<'_>, obj: Option<&Value>, why: &str) -> ApiError {
    let gr = a.resource.group_resource();
    let name = if !a.name.is_empty() {
        a.name.to_owned()
    } else {
        obj.and_then(|o| o.pointer("/metadata/generateName"))
            .and_then(Value::as_str)
            .filter(|g| !g.is_empty())
            .unwrap_or("Unknown")
            .to_owned()
    };
    ApiError::forbidden(&gr, &name, why)
}

/// The objects stored under `prefix`, with their revisions.
pub async fn list_stored(
    a: &Attributes<'_>,
    prefix: String,
) -> Result<Vec<(Value, i64)>, ApiError> {
    let page = a
        .rest
        .store
        .range(RangeRequest {
            prefix: prefix.into_bytes(),
            start: None,
            limit: 0,
            revision: None,
        })
        .await
        .map_err(ApiError::internal)?;
    let mut out = Vec::with_capacity(page.kvs.len());
    for kv in page.kvs {
        let v: Value = serde_json::from_slice(&kv.value).map_err(ApiError::internal)?;
        out.push((v, kv.mod_revision));
    }
    Ok(out)
}

/// One stored object, if it exists.
pub async fn get_stored(a: &Attributes<'_>, key: String) -> Result<Option<Value>, ApiError> {
    let (kv, _) = a
        .rest
        .store
        .get(key.as_bytes(), None)
        .await
        .map_err(ApiError::internal)?;
    match kv {
        Some(kv) => Ok(Some(
            serde_json::from_slice(&kv.value).map_err(ApiError::internal)?,
        )),
        None => Ok(None),
    }
}

// ---------------------------------------------------------------------------------------
// Evaluators
// ---------------------------------------------------------------------------------------

/// The resources no quota applies to (DefaultIgnoredResources).
const IGNORED: &[(&str, &str)] = &[
    ("", "bindings"),
    ("", "componentstatuses"),
    ("authentication.k8s.io", "tokenreviews"),
    ("authentication.k8s.io", "selfsubjectreviews"),
    ("authorization.k8s.io", "subjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "localsubjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
    ("", "events"),
    ("events.k8s.io", "events"),
];

/// `count/<resource>[.<group>]` (ObjectCountQuotaResourceNameFor).
fn count_name(group: &str, plural: &str) -> String {
    if group.is_empty() {
        format!("count/{plural}")
    } else {
        format!("count/{plural}.{group}")
    }
}

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

/// The quota evaluator of a resource.
enum Evaluator {
    Pods,
    Services,
    Claims,
    /// Counts objects under these names.
    Count(Vec<String>),
}

/// Whether `name` is a resource the quota system knows natively (helper.IsNativeResource).
fn is_native(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

impl Evaluator {
    fn of(group: &str, plural: &str) -> Evaluator {
        match (group, plural) {
            ("", "pods") => Evaluator::Pods,
            ("", "services") => Evaluator::Services,
            ("", "persistentvolumeclaims") => Evaluator::Claims,
            _ => {
                let mut names = vec![count_name(group, plural)];
                let alias = match (group, plural) {
                    ("", "configmaps") => Some("configmaps"),
                    ("", "resourcequotas") => Some("resourcequotas"),
                    ("", "replicationcontrollers") => Some("replicationcontrollers"),
                    ("", "secrets") => Some("secrets"),
                    _ => None,
                };
                names.extend(alias.map(str::to_owned));
                Evaluator::Count(names)
            }
        }
    }

    fn handles(&self, a: &Attributes<'_>, obj: Option<&Value>) -> bool {
        let sub = a.subresource.unwrap_or("");
        match self {
            Evaluator::Pods => match sub {
                "" => {
                    if a.operation == Operation::Update {
                        if let (Some(new), Some(old)) = (obj, a.old) {
                            if is_terminating(new) != is_terminating(old) {
                                return true;
                            }
                        }
                    }
                    a.operation == Operation::Create
                }
                "resize" => a.operation == Operation::Update,
                _ => false,
            },
            Evaluator::Services => {
                sub.is_empty() && matches!(a.operation, Operation::Create | Operation::Update)
            }
            Evaluator::Claims => match sub {
                "" => matches!(a.operation, Operation::Create | Operation::Update),
                "status" => {
                    // Only a change of the allocated storage or the attributes classes
                    // charges quota (RequiresQuotaReplenish).
                    let alloc = |o: Option<&Value>| {
                        o.and_then(|o| o.pointer("/status/allocatedResources/storage"))
                            .and_then(Quantity::from_json)
                    };
                    let vac = |o: Option<&Value>| claim_vac_names(o.unwrap_or(&Value::Null));
                    alloc(obj) != alloc(a.old) || vac(obj) != vac(a.old)
                }
                _ => false,
            },
            Evaluator::Count(_) => sub.is_empty() && a.operation == Operation::Create,
        }
    }

    /// The names among `input` this evaluator charges (MatchingResources).
    fn matching(&self, input: &[String]) -> Vec<String> {
        match self {
            Evaluator::Pods => input
                .iter()
                .filter(|r| {
                    POD_RESOURCES.contains(&r.as_str())
                        || r.starts_with("hugepages-")
                        || r.starts_with("requests.hugepages-")
                        || (r.starts_with("requests.")
                            && (!is_native(r)
                                || r.starts_with("requests.deviceclass.resource.kubernetes.io/")))
                })
                .cloned()
                .collect(),
            Evaluator::Services => input
                .iter()
                .filter(|r| SERVICE_RESOURCES.contains(&r.as_str()))
                .cloned()
                .collect(),
            Evaluator::Claims => input
                .iter()
                .filter(|r| {
                    matches!(
                        r.as_str(),
                        "count/persistentvolumeclaims"
                            | "persistentvolumeclaims"
                            | "requests.storage"
                    ) || ["persistentvolumeclaims", "requests.storage"]
                        .iter()
                        .any(|x| r.ends_with(&format!("{STORAGE_CLASS_SUFFIX}{x}")))
                })
                .cloned()
                .collect(),
            Evaluator::Count(names) => input
                .iter()
                .filter(|r| names.contains(r))
                .cloned()
                .collect(),
        }
    }

    /// Whether the object is in a scope selector's scope (MatchesScopeFunc).
    fn matches_scope(&self, sel: &Value, obj: &Value) -> bool {
        let scope = sel.get("scopeName").and_then(Value::as_str).unwrap_or("");
        let op = sel.get("operator").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = sel
            .get("values")
            .and_then(Value::as_array)
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let in_set = |candidates: &[String]| -> bool {
            // The scope as a label: `In`, `NotIn`, `Exists`, `DoesNotExist`.
            match op {
                "Exists" => !candidates.is_empty(),
                "DoesNotExist" => candidates.is_empty(),
                "In" => candidates.iter().any(|c| values.contains(&c.as_str())),
                "NotIn" => {
                    candidates.is_empty()
                        || candidates.iter().any(|c| !values.contains(&c.as_str()))
                }
                _ => false,
            }
        };
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
                    let c: Vec<String> = if pc.is_empty() {
                        vec![]
                    } else {
                        vec![pc.to_owned()]
                    };
                    in_set(&c)
                }
                "CrossNamespacePodAffinity" => uses_cross_namespace_affinity(obj),
                _ => false,
            },
            Evaluator::Claims if scope == "VolumeAttributesClass" => {
                let names: Vec<String> = claim_vac_names(obj).into_iter().collect();
                match op {
                    "In" | "NotIn" if !names.is_empty() => {
                        names.iter().any(|n| in_set(std::slice::from_ref(n)))
                    }
                    _ => in_set(&names),
                }
            }
            _ => false,
        }
    }

    /// The usage the object charges (Usage).
    fn usage(&self, obj: &Value) -> ResourceList {
        let mut out = ResourceList::new();
        match self {
            Evaluator::Pods => {
                out.insert("count/pods".into(), Quantity::int(1));
                if !charges_compute(obj) {
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
            Evaluator::Count(names) => {
                for n in names {
                    out.insert(n.clone(), Quantity::int(1));
                }
            }
        }
        out
    }

    /// Refuses a pod that does not say what a quota must charge (Constraints).
    fn constraints(&self, required: &[String], obj: &Value) -> Result<(), String> {
        if !matches!(self, Evaluator::Pods) || pod_level_resources_set(obj) {
            return Ok(());
        }
        const VALIDATED: &[&str] = &[
            "cpu",
            "memory",
            "requests.cpu",
            "requests.memory",
            "limits.cpu",
            "limits.memory",
        ];
        let required: BTreeSet<&str> = required
            .iter()
            .map(String::as_str)
            .filter(|r| VALIDATED.contains(r))
            .collect();
        let mut missing: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for list in ["containers", "initContainers"] {
            for c in containers(obj, list) {
                let usage = compute_usage(
                    &container_resources(c, "requests"),
                    &container_resources(c, "limits"),
                );
                let name = c.get("name").and_then(Value::as_str).unwrap_or("");
                for r in &required {
                    if !usage.contains_key(*r) {
                        missing.entry(r).or_default().insert(name.to_owned());
                    }
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let parts: Vec<String> = missing
            .iter()
            .map(|(r, names)| {
                format!(
                    "{r} for: {}",
                    names.iter().cloned().collect::<Vec<_>>().join(",")
                )
            })
            .collect();
        Err(format!("must specify {}", parts.join("; ")))
    }
}

/// A pod with activeDeadlineSeconds is in the Terminating scope.
fn is_terminating(pod: &Value) -> bool {
    pod.pointer("/spec/activeDeadlineSeconds")
        .and_then(Value::as_i64)
        .is_some_and(|s| s >= 0)
}

/// The BestEffort QoS class: no container requests or limits cpu or memory.
fn is_best_effort(pod: &Value) -> bool {
    let any = |c: &Value| {
        ["requests", "limits"].iter().any(|w| {
            container_resources(c, w)
                .iter()
                .any(|(k, q)| (k == "cpu" || k == "memory") && !q.is_zero())
        })
    };
    let containers_set = ["containers", "initContainers"]
        .iter()
        .any(|l| containers(pod, l).any(any));
    let pod_level = ["requests", "limits"].iter().any(|w| {
        resource_list(pod.pointer(&format!("/spec/resources/{w}")))
            .iter()
            .any(|(k, q)| (k == "cpu" || k == "memory") && !q.is_zero())
    });
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

/// Whether a pod still uses its compute resources (QuotaV1Pod): not finished and not past
/// its deletion grace period.
fn charges_compute(pod: &Value) -> bool {
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
        if let Some(t) = crate::time::parse_rfc3339(ts) {
            if crate::time::now_secs() > t.saturating_add(grace) {
                return false;
            }
        }
    }
    true
}

/// Whether the pod sets pod-level cpu or memory (IsPodLevelResourcesSet).
pub fn pod_level_resources_set(pod: &Value) -> bool {
    ["requests", "limits"].iter().any(|w| {
        resource_list(pod.pointer(&format!("/spec/resources/{w}")))
            .keys()
            .any(|k| k == "cpu" || k == "memory")
    })
}

/// The pod's requests and limits (PodRequests, PodLimits): its containers', pod-level
/// cpu and memory over them, plus its overhead.
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
    add_into(&mut requests, &overhead);
    for (k, q) in overhead {
        if let Some(l) = limits.get_mut(&k).filter(|l| !l.is_zero()) {
            *l = l.add(&q);
        }
    }
    (requests, limits)
}

/// The quota names a set of requests and limits charges (podComputeUsageHelper).
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
            // Extended resources (IsDRAExtendedResourceName) are charged as requests.
            out.insert(format!("requests.{r}"), *q);
        }
    }
    out
}

/// The storage class a claim names (GetPersistentVolumeClaimClass).
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

// ---------------------------------------------------------------------------------------
// The plugin
// ---------------------------------------------------------------------------------------

/// The `ResourceQuota` admission plugin.
#[derive(Default)]
pub struct ResourceQuota {
    /// One lock per namespace: upstream evaluates a namespace's requests one batch at a
    /// time, so the usage a request reads is the one the previous request wrote.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The resourcequotas resource, for the managed fields of the usage writes.
    quotas: std::sync::OnceLock<Option<Arc<crate::registry::Resource>>>,
}

/// A quota as read: its name, stored JSON and revision.
struct StoredQuota {
    name: String,
    obj: Value,
    rev: i64,
}

impl StoredQuota {
    fn hard(&self) -> ResourceList {
        resource_list(self.obj.pointer("/status/hard"))
    }
    fn used(&self) -> ResourceList {
        resource_list(self.obj.pointer("/status/used"))
    }
    fn selectors(&self) -> Vec<Value> {
        let mut out: Vec<Value> = self
            .obj
            .pointer("/spec/scopes")
            .and_then(Value::as_array)
            .map(|s| {
                s.iter()
                    .map(|scope| json!({"scopeName": scope, "operator": "Exists"}))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(m) = self
            .obj
            .pointer("/spec/scopeSelector/matchExpressions")
            .and_then(Value::as_array)
        {
            out.extend(m.iter().cloned());
        }
        out
    }
}

/// `a=1,b=2` (prettyPrint).
fn pretty(l: &ResourceList) -> String {
    l.iter()
        .map(|(k, q)| format!("{k}={q}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn mask(l: &ResourceList, names: &[String]) -> ResourceList {
    l.iter()
        .filter(|(k, _)| names.contains(k))
        .map(|(k, q)| (k.clone(), *q))
        .collect()
}

fn lists_equal(a: &ResourceList, b: &ResourceList) -> bool {
    a.len() == b.len() && a.iter().all(|(k, q)| b.get(k) == Some(q))
}

impl ResourceQuota {
    pub fn new() -> ResourceQuota {
        ResourceQuota::default()
    }

    /// Records the usage write in managedFields as kube-apiserver's own status update
    /// (upstream writes it through its loopback client).
    fn track(&self, old: &Value, new: &mut Value) {
        let res = self
            .quotas
            .get_or_init(|| crate::registry::Registry::builtin().find("", "v1", "resourcequotas"));
        let Some(res) = res else { return };
        let query = BTreeMap::from([("fieldManager".to_owned(), "kube-apiserver".to_owned())]);
        // Bookkeeping only: a failure leaves the entries as they were.
        let _ = crate::fieldmanager::track_update(
            res,
            Some("status"),
            &query,
            crate::fieldmanager::Options::Update,
            Some(old),
            new,
        );
    }

    /// Forgets a namespace's lock nobody else holds or waits for.
    fn unlock(&self, ns: &str, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        // Ours and the map's: clones are only made under the map's lock.
        if Arc::strong_count(&lock) == 2 {
            locks.remove(ns);
        }
    }

    fn lock_for(&self, ns: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(ns.to_owned()).or_default().clone()
    }

    async fn read_quotas(
        a: &Attributes<'_>,
        ns: &str,
        only: Option<&BTreeSet<String>>,
    ) -> Result<Vec<StoredQuota>, ApiError> {
        let quotas = list_stored(a, format!("/registry/resourcequotas/{ns}/")).await?;
        Ok(quotas
            .into_iter()
            .filter_map(|(obj, rev)| {
                let name = obj.pointer("/metadata/name")?.as_str()?.to_owned();
                Some(StoredQuota { name, obj, rev })
            })
            .filter(|q| only.is_none_or(|o| o.contains(&q.name)))
            .collect())
    }

    /// CheckRequest: the new `status.used` of each quota the request charges, or why the
    /// request is refused.
    fn check(
        ev: &Evaluator,
        quotas: &[StoredQuota],
        a: &Attributes<'_>,
        obj: &Value,
    ) -> Result<Vec<Option<ResourceList>>, ApiError> {
        let mut interesting = Vec::new();
        for (i, q) in quotas.iter().enumerate() {
            let hard = q.hard();
            let hard_names: Vec<String> = hard.keys().cloned().collect();
            let matches_resources = !ev.matching(&hard_names).is_empty();
            let matches_scope = q.selectors().iter().all(|s| ev.matches_scope(s, obj));
            if !(matches_resources && matches_scope) {
                continue;
            }
            let restricted = ev.matching(&hard_names);
            if let Err(e) = ev.constraints(&restricted, obj) {
                return Err(forbidden(
                    a,
                    Some(obj),
                    &format!("failed quota: {}: {e}", q.name),
                ));
            }
            let used = q.used();
            if restricted.iter().any(|r| !used.contains_key(r)) {
                let mut names = restricted.clone();
                names.sort();
                return Err(forbidden(
                    a,
                    Some(obj),
                    &format!(
                        "status unknown for quota: {}, resources: {}",
                        q.name,
                        names.join(",")
                    ),
                ));
            }
            interesting.push(i);
        }
        let input = ev.usage(obj);
        let negative: Vec<&str> = input
            .iter()
            .filter(|(_, q)| q.is_negative())
            .map(|(k, _)| k.as_str())
            .collect();
        if !negative.is_empty() {
            return Err(forbidden(
                a,
                Some(obj),
                &format!(
                    "quota usage is negative for resource(s): {}",
                    negative.join(",")
                ),
            ));
        }
        let mut deltas: BTreeMap<usize, ResourceList> =
            interesting.iter().map(|i| (*i, input.clone())).collect();
        if a.operation == Operation::Update {
            let Some(old) = a.old else {
                return Err(forbidden(
                    a,
                    Some(obj),
                    "unable to get previous usage since prior version of object was not found",
                ));
            };
            let prev = ev.usage(old);
            // SubtractWithNonNegativeResult.
            let delta: ResourceList = input
                .iter()
                .map(|(k, q)| {
                    let d = match prev.get(k) {
                        Some(p) => q.sub(p),
                        None => *q,
                    };
                    (
                        k.clone(),
                        if d.is_negative() { Quantity::zero() } else { d },
                    )
                })
                .collect();
            for i in &interesting {
                let q = &quotas[*i];
                if q.selectors().iter().all(|s| ev.matches_scope(s, old)) {
                    deltas.insert(*i, delta.clone());
                }
            }
        }
        deltas.retain(|_, d| {
            d.retain(|_, q| !q.is_zero());
            !d.is_empty()
        });
        let mut out = vec![None; quotas.len()];
        for (i, delta) in deltas {
            let q = &quotas[i];
            let hard = q.hard();
            let used = q.used();
            let hard_names: Vec<String> = hard.keys().cloned().collect();
            let requested = mask(&delta, &hard_names);
            let new_used = add_lists(&used, &requested);
            if a.subresource != Some("status") {
                let requested_names: Vec<String> = requested.keys().cloned().collect();
                let exceeded: Vec<String> = mask(&new_used, &requested_names)
                    .iter()
                    .filter(|(k, v)| hard.get(*k).is_some_and(|h| *v > h))
                    .map(|(k, _)| k.clone())
                    .collect();
                if !exceeded.is_empty() {
                    return Err(forbidden(
                        a,
                        Some(obj),
                        &format!(
                            "exceeded quota: {}, requested: {}, used: {}, limited: {}",
                            q.name,
                            pretty(&mask(&requested, &exceeded)),
                            pretty(&mask(&used, &exceeded)),
                            pretty(&mask(&hard, &exceeded)),
                        ),
                    ));
                }
            }
            if !lists_equal(&new_used, &used) {
                out[i] = Some(new_used);
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Plugin for ResourceQuota {
    fn name(&self) -> &'static str {
        "ResourceQuota"
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        let Some(ns) = a.namespace.filter(|n| !n.is_empty()) else {
            return Ok(());
        };
        let (group, plural) = (a.resource.group, a.resource.plural);
        if IGNORED.contains(&(group, plural)) {
            return Ok(());
        }
        let ev = Evaluator::of(group, plural);
        // Deletes and connects charge nothing: no evaluator handles them.
        let Some(obj) = obj else { return Ok(()) };
        if !ev.handles(a, Some(obj)) {
            return Ok(());
        }
        let lock = self.lock_for(ns);
        let result = {
            let _guard = lock.lock().await;
            self.charge(a, ns, &ev, obj).await
        };
        self.unlock(ns, lock);
        result
    }
}

impl ResourceQuota {
    /// Charges the request to the namespace's quotas (under the namespace's lock).
    async fn charge(
        &self,
        a: &Attributes<'_>,
        ns: &str,
        ev: &Evaluator,
        obj: &Value,
    ) -> Result<(), ApiError> {
        let mut only: Option<BTreeSet<String>> = None;
        // The first try and three retries on conflicting quota writes (checkQuotas).
        let mut last_err = None;
        for _ in 0..4 {
            let quotas = Self::read_quotas(a, ns, only.as_ref()).await?;
            if quotas.is_empty() {
                return match last_err {
                    Some(e) => Err(e),
                    None => Ok(()),
                };
            }
            let updates = Self::check(ev, &quotas, a, obj)?;
            if a.dry_run {
                return Ok(());
            }
            let mut failed = BTreeSet::new();
            for (q, used) in quotas.iter().zip(updates) {
                let Some(used) = used else { continue };
                let mut stored = q.obj.clone();
                stored["status"]["used"] = list_json(&used);
                self.track(&q.obj, &mut stored);
                let bytes = serde_json::to_vec(&stored).map_err(ApiError::internal)?;
                let key = format!("/registry/resourcequotas/{ns}/{}", q.name);
                match a
                    .rest
                    .store
                    .update(key.as_bytes(), bytes, Some(q.rev))
                    .await
                {
                    Ok(_) => {}
                    Err(StorageError::Conflict { .. }) | Err(StorageError::NotFound) => {
                        last_err = Some(ApiError::stale_update(
                            &GroupResource::new("", "resourcequotas"),
                            &q.name,
                        ));
                        failed.insert(q.name.clone());
                    }
                    Err(e) => return Err(ApiError::internal(e)),
                }
            }
            if failed.is_empty() {
                return Ok(());
            }
            only = Some(failed);
        }
        Err(last_err.unwrap_or_else(|| ApiError::internal("resource quota evaluation failed")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> String {
        Quantity::parse(s)
            .map(|q| q.to_string())
            .unwrap_or_else(|| "ERR".into())
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(q("0"), "0");
        assert_eq!(q("1"), "1");
        assert_eq!(q("1000m"), "1");
        assert_eq!(q("1.5"), "1500m");
        assert_eq!(q("0.5"), "500m");
        assert_eq!(q("1500"), "1500");
        assert_eq!(q("2000"), "2k");
        assert_eq!(q("1Gi"), "1Gi");
        assert_eq!(q("1024Mi"), "1Gi");
        assert_eq!(q("1536Mi"), "1536Mi");
        assert_eq!(q("512"), "512");
        assert_eq!(q("1e3"), "1e3");
        assert_eq!(q("128974848"), "128974848");
        assert_eq!(q("129e6"), "129e6");
        assert_eq!(q("123Mi"), "123Mi");
        assert_eq!(q("0.1Ki"), "102400m");
        assert_eq!(q("1n"), "1n");
        assert_eq!(q("0.0000000001"), "1n");
        assert_eq!(q("abc"), "ERR");
        assert_eq!(q("1Xi"), "ERR");
        assert_eq!(q(""), "ERR");
        assert_eq!(q("-1"), "-1");
        assert_eq!(q("1e2147483647"), "ERR");
        assert_eq!(q("1e-50"), "1e-9");
        assert_eq!(q("99999999999999999999999999999999999999999"), "ERR");
    }

    #[test]
    fn pod_usage_charges_compute_and_extended_resources() {
        let pod = json!({"spec": {
            "containers": [
                {"name": "a", "resources": {
                    "requests": {"cpu": "250m", "memory": "64Mi", "example.com/gpu": "1", "hugepages-2Mi": "4Mi"},
                    "limits": {"cpu": "500m", "example.com/gpu": "1"}}},
                {"name": "b", "resources": {"requests": {"cpu": "250m"}}},
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
            "overhead": {"cpu": "10m"},
        }});
        let usage: BTreeMap<String, String> = Evaluator::Pods
            .usage(&pod)
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect();
        let want: BTreeMap<String, String> = [
            ("count/pods", "1"),
            ("pods", "1"),
            ("cpu", "2010m"),
            ("requests.cpu", "2010m"),
            ("limits.cpu", "510m"),
            ("memory", "64Mi"),
            ("requests.memory", "64Mi"),
            ("requests.example.com/gpu", "1"),
            ("hugepages-2Mi", "4Mi"),
            ("requests.hugepages-2Mi", "4Mi"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(usage, want);
        let names = vec![
            "requests.example.com/gpu".to_owned(),
            "limits.memory".to_owned(),
            "secrets".to_owned(),
        ];
        assert_eq!(Evaluator::Pods.matching(&names), names[..2].to_vec());
        assert_eq!(
            Evaluator::Pods.constraints(&names, &pod),
            Err("must specify limits.memory for: a,b,i".to_owned())
        );
    }

    #[test]
    fn arithmetic_keeps_formats() {
        let zero = Quantity::zero();
        let gi = Quantity::parse("1Gi").expect("parses");
        assert_eq!(zero.add(&gi).to_string(), "1Gi");
        assert_eq!(gi.add(&gi).to_string(), "2Gi");
        let m = Quantity::parse("500m").expect("parses");
        assert_eq!(m.add(&m).to_string(), "1");
        assert_eq!(m.milli_value(), 500);
        assert_eq!(m.value(), 1);
    }
}
