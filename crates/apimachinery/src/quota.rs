//! The ResourceQuota usage rules (upstream's pkg/quota/v1 and its core evaluators), shared
//! by the API server's ResourceQuota admission plugin, which charges usage on create, and
//! the controller-manager's resource quota controller, which recomputes it: what a pod,
//! service, persistent volume claim or other object charges under each quota resource
//! name, which quota scopes an object is in, and ResourceList arithmetic.
//!
//! Objects are their JSON (`serde_json::Value`), as both callers hold them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::quantity::Quantity;

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
    add_into(&mut out, b);
    out
}

/// Adds `b` into `a` (addResourceList).
pub fn add_into(a: &mut ResourceList, b: &ResourceList) {
    for (k, q) in b {
        a.entry(k.clone())
            .and_modify(|x| *x = x.add(q))
            .or_insert(*q);
    }
}

/// Keeps in `a` the larger of each of `b`'s quantities (maxResourceList).
pub fn max_into(a: &mut ResourceList, b: &ResourceList) {
    for (k, q) in b {
        if a.get(k).is_none_or(|x| q > x) {
            a.insert(k.clone(), *q);
        }
    }
}

/// Only the named resources of `l` (quota.Mask).
pub fn mask<'a>(l: &ResourceList, names: impl IntoIterator<Item = &'a String>) -> ResourceList {
    let names: BTreeSet<&str> = names.into_iter().map(String::as_str).collect();
    l.iter()
        .filter(|(k, _)| names.contains(k.as_str()))
        .map(|(k, q)| (k.clone(), *q))
        .collect()
}

/// The same names with equal quantities (quota.Equals).
pub fn lists_equal(a: &ResourceList, b: &ResourceList) -> bool {
    a.len() == b.len() && a.iter().all(|(k, q)| b.get(k) == Some(q))
}

/// `a=1,b=2`, as quota error messages print a ResourceList (prettyPrint).
pub fn pretty_print(l: &ResourceList) -> String {
    l.iter()
        .map(|(k, q)| format!("{k}={q}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The resources no quota applies to (DefaultIgnoredResources), as (group, plural).
pub const IGNORED_RESOURCES: &[(&str, &str)] = &[
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

/// `count/<resource>[.<group>]` (ObjectCountQuotaResourceNameFor).
pub fn object_count_name(group: &str, plural: &str) -> String {
    if group.is_empty() {
        format!("count/{plural}")
    } else {
        format!("count/{plural}.{group}")
    }
}

/// Whether `name` is a resource the quota system knows natively (helper.IsNativeResource).
pub fn is_native(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
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

/// The infix of the per-storage-class claim quota names
/// (`<class>.storageclass.storage.k8s.io/requests.storage`).
const STORAGE_CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";

/// The quota evaluator of a resource: how its objects are charged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evaluator {
    /// Pods: object count and compute resources.
    Pods,
    /// Services: object count, node ports and load balancers.
    Services,
    /// PersistentVolumeClaims: object count and storage, per storage class too.
    Claims,
    /// Any other resource: counts objects of (group, plural) under `names`.
    Count {
        /// The API group, empty for core.
        group: String,
        /// The resource's plural name.
        plural: String,
        /// `count/<resource>[.<group>]`, plus the legacy bare name of a few core ones.
        names: Vec<String>,
    },
}

impl Evaluator {
    /// The evaluator of a group resource (the core ones, else an object counter).
    pub fn of(group: &str, plural: &str) -> Evaluator {
        match (group, plural) {
            ("", "pods") => Evaluator::Pods,
            ("", "services") => Evaluator::Services,
            ("", "persistentvolumeclaims") => Evaluator::Claims,
            _ => {
                let mut names = vec![object_count_name(group, plural)];
                if group.is_empty()
                    && matches!(
                        plural,
                        "configmaps" | "resourcequotas" | "replicationcontrollers" | "secrets"
                    )
                {
                    names.push(plural.to_owned());
                }
                Evaluator::Count {
                    group: group.into(),
                    plural: plural.into(),
                    names,
                }
            }
        }
    }

    /// The names among `input` this evaluator charges (MatchingResources).
    pub fn matching<'a>(&self, input: impl IntoIterator<Item = &'a String>) -> BTreeSet<String> {
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
                Evaluator::Count { names, .. } => names.contains(r),
            })
            .cloned()
            .collect()
    }

    /// Whether the object is in a scope selector's scope (MatchesScopeFunc); services and
    /// object counters match no scope.
    ///
    /// The PriorityClass and VolumeAttributesClass scopes are label selectors over a label
    /// the object has only when it names a class, so `DoesNotExist` matches objects without
    /// one and `NotIn` matches them too (podMatchesSelector).
    pub fn matches_scope(&self, sel: &Value, obj: &Value) -> bool {
        let scope = sel.get("scopeName").and_then(Value::as_str).unwrap_or("");
        let op = sel.get("operator").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = sel
            .get("values")
            .and_then(Value::as_array)
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // A label requirement over the class names the object has (none: no label).
        let label_matches = |names: &BTreeSet<String>| match op {
            "Exists" => !names.is_empty(),
            "DoesNotExist" => names.is_empty(),
            "In" => names.iter().any(|n| values.contains(&n.as_str())),
            "NotIn" => names.is_empty() || names.iter().any(|n| !values.contains(&n.as_str())),
            _ => false,
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
                        .filter(|pc| !pc.is_empty());
                    label_matches(&pc.map(str::to_owned).into_iter().collect())
                }
                "CrossNamespacePodAffinity" => uses_cross_namespace_affinity(obj),
                _ => false,
            },
            Evaluator::Claims if scope == "VolumeAttributesClass" => {
                label_matches(&claim_vac_names(obj))
            }
            _ => false,
        }
    }

    /// The usage the object charges (Usage), `now` (seconds since the epoch) deciding
    /// whether a deleted pod is past its grace period.
    pub fn usage(&self, obj: &Value, now: i64) -> ResourceList {
        let mut out = ResourceList::new();
        match self {
            Evaluator::Pods => {
                out.insert("count/pods".into(), Quantity::int(1));
                if !charges_compute(obj, now) {
                    return out;
                }
                let (requests, limits) = pod_requests_limits(obj);
                add_into(&mut out, &compute_usage(&requests, &limits));
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
                        // Without allocated node ports only the ports given one count.
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
                // The larger of the request and the allocated size, in whole units.
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
            Evaluator::Count { names, .. } => {
                for n in names {
                    out.insert(n.clone(), Quantity::int(1));
                }
            }
        }
        out
    }

    /// Why a pod cannot be charged to quotas that constrain `required`: the containers
    /// that do not say their cpu or memory requests or limits (Constraints), as
    /// `must specify limits.memory for: a,b`. Other evaluators constrain nothing.
    pub fn constraints<'a>(
        &self,
        required: impl IntoIterator<Item = &'a String>,
        obj: &Value,
    ) -> Result<(), String> {
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
            .into_iter()
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

/// The scope selectors of a ResourceQuota (its JSON): `spec.scopes` as `Exists`
/// requirements, then `spec.scopeSelector.matchExpressions`. An object is in the quota's
/// scope when it matches all of them.
pub fn scope_selectors(quota: &Value) -> Vec<Value> {
    let mut out: Vec<Value> = quota
        .pointer("/spec/scopes")
        .and_then(Value::as_array)
        .map(|s| {
            s.iter()
                .map(|scope| json!({"scopeName": scope, "operator": "Exists"}))
                .collect()
        })
        .unwrap_or_default();
    if let Some(m) = quota
        .pointer("/spec/scopeSelector/matchExpressions")
        .and_then(Value::as_array)
    {
        out.extend(m.iter().cloned());
    }
    out
}

/// The containers of one list of a pod spec (`containers`, `initContainers`).
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

/// The pod's effective requests or limits (`which`) from its containers: the sum of the
/// containers and sidecars, or the largest init container plus the sidecars started
/// before it, whichever is larger (AggregateContainerRequests/Limits).
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

/// Whether a pod is in the Terminating scope: it has `activeDeadlineSeconds`.
pub fn is_terminating(pod: &Value) -> bool {
    pod.pointer("/spec/activeDeadlineSeconds")
        .and_then(Value::as_i64)
        .is_some_and(|s| s >= 0)
}

/// Whether a pod is of the BestEffort QoS class: its `status.qosClass` when set, else no
/// cpu or memory requested or limited anywhere (GetPodQOS).
pub fn is_best_effort(pod: &Value) -> bool {
    if let Some(q) = pod
        .pointer("/status/qosClass")
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
    {
        return q == "BestEffort";
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

/// Whether a pod's (anti-)affinity terms name other namespaces or a namespace selector
/// (the CrossNamespacePodAffinity scope).
pub fn uses_cross_namespace_affinity(pod: &Value) -> bool {
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

/// Whether a pod still charges compute resources at `now` (QuotaV1Pod): not terminal
/// (Failed, Succeeded) and not past its deletion grace period, so pods stuck terminating
/// on a lost node free their quota.
pub fn charges_compute(pod: &Value, now: i64) -> bool {
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
            if now > t.saturating_add(grace) {
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
/// cpu and memory over them, plus its overhead (added to a limit only where one is set).
pub fn pod_requests_limits(pod: &Value) -> (ResourceList, ResourceList) {
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
            // Extended resources (and IsDRAExtendedResourceName) are charged as requests.
            out.insert(format!("requests.{r}"), *q);
        }
    }
    out
}

/// The storage class a claim names: the beta annotation, else `spec.storageClassName`
/// (GetPersistentVolumeClaimClass).
pub fn claim_class(pvc: &Value) -> String {
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
pub fn claim_vac_names(pvc: &Value) -> BTreeSet<String> {
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

/// Whether a claim update changes its usage: its allocated storage or its attributes
/// classes (RequiresQuotaReplenish).
pub fn claim_usage_changed(old: &Value, new: &Value) -> bool {
    let alloc = |o: &Value| {
        o.pointer("/status/allocatedResources/storage")
            .and_then(Quantity::from_json)
    };
    alloc(old) != alloc(new) || claim_vac_names(old) != claim_vac_names(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(l: &ResourceList) -> BTreeMap<String, String> {
        l.iter().map(|(k, v)| (k.clone(), v.to_string())).collect()
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
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
        assert_eq!(strings(&Evaluator::Pods.usage(&pod, 0)), want);
        let hard = names(&["requests.example.com/gpu", "limits.memory", "secrets"]);
        assert_eq!(
            Evaluator::Pods.matching(&hard),
            BTreeSet::from([
                "requests.example.com/gpu".to_owned(),
                "limits.memory".to_owned()
            ])
        );
        assert_eq!(
            Evaluator::Pods.constraints(&hard, &pod),
            Err("must specify limits.memory for: a,b,i".to_owned())
        );
        // Pod-level resources satisfy the constraint.
        let mut pod_level = pod.clone();
        pod_level["spec"]["resources"] = json!({"limits": {"memory": "1Gi"}});
        assert_eq!(Evaluator::Pods.constraints(&hard, &pod_level), Ok(()));
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
    }

    #[test]
    fn terminal_and_expired_pods_charge_only_their_count() {
        let pod = json!({"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1"}}}]}});
        let only_count = BTreeMap::from([("count/pods".to_owned(), "1".to_owned())]);
        for phase in ["Succeeded", "Failed"] {
            let mut done = pod.clone();
            done["status"] = json!({"phase": phase});
            assert_eq!(strings(&Evaluator::Pods.usage(&done, 0)), only_count);
        }
        let mut deleting = pod.clone();
        deleting["metadata"] = json!({
            "deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 30});
        let t = crate::time::parse_rfc3339("2026-01-01T00:00:00Z").expect("parses");
        assert_eq!(
            strings(&Evaluator::Pods.usage(&deleting, t + 30))["requests.cpu"],
            "1"
        );
        assert_eq!(
            strings(&Evaluator::Pods.usage(&deleting, t + 31)),
            only_count
        );
    }

    #[test]
    fn service_usage_counts_node_ports_and_load_balancers() {
        let svc = |spec: Value| strings(&Evaluator::Services.usage(&json!({"spec": spec}), 0));
        let two_ports = json!([{"port": 80}, {"port": 443, "nodePort": 30443}]);
        let u = svc(json!({"type": "ClusterIP", "ports": two_ports}));
        assert_eq!(
            (u["services"].as_str(), u["services.nodeports"].as_str()),
            ("1", "0")
        );
        let u = svc(json!({"type": "NodePort", "ports": two_ports}));
        assert_eq!(u["services.nodeports"], "2");
        assert_eq!(u["services.loadbalancers"], "0");
        let u = svc(json!({"type": "LoadBalancer", "ports": two_ports}));
        assert_eq!(u["services.nodeports"], "2");
        assert_eq!(u["services.loadbalancers"], "1");
        let u = svc(
            json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false, "ports": two_ports}),
        );
        assert_eq!(u["services.nodeports"], "1");
        assert_eq!(u["count/services"], "1");
    }

    #[test]
    fn claim_usage_by_storage_class() {
        let pvc = json!({"spec": {"storageClassName": "gold",
            "resources": {"requests": {"storage": "1500m"}}},
            "status": {"allocatedResources": {"storage": "3"}}});
        let u = strings(&Evaluator::Claims.usage(&pvc, 0));
        assert_eq!(u["requests.storage"], "3");
        assert_eq!(u["gold.storageclass.storage.k8s.io/requests.storage"], "3");
        assert_eq!(
            u["gold.storageclass.storage.k8s.io/persistentvolumeclaims"],
            "1"
        );
        assert_eq!(u["persistentvolumeclaims"], "1");
        let mut grown = pvc.clone();
        grown["status"]["allocatedResources"]["storage"] = json!("4");
        assert!(claim_usage_changed(&pvc, &grown));
        assert!(!claim_usage_changed(&pvc, &pvc));
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
        // status.qosClass wins over the containers (GetPodQOS).
        let mut said = burst.clone();
        said["status"] = json!({"qosClass": "BestEffort"});
        assert!(p.matches_scope(&s("BestEffort"), &said));
        let pc =
            |op: &str| json!({"scopeName": "PriorityClass", "operator": op, "values": ["high"]});
        assert!(p.matches_scope(&pc("In"), &burst));
        assert!(!p.matches_scope(&pc("In"), &be));
        assert!(p.matches_scope(&pc("NotIn"), &be));
        assert!(!p.matches_scope(&pc("NotIn"), &burst));
        assert!(p.matches_scope(&s("PriorityClass"), &burst));
        assert!(!p.matches_scope(&s("PriorityClass"), &be));
        // No priority class is no label: DoesNotExist matches it.
        let dne = json!({"scopeName": "PriorityClass", "operator": "DoesNotExist"});
        assert!(p.matches_scope(&dne, &be));
        assert!(!p.matches_scope(&dne, &burst));
        let affinity = json!({"spec": {"affinity": {"podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "podAffinityTerm": {"namespaceSelector": {}}}]}}}});
        assert!(p.matches_scope(&s("CrossNamespacePodAffinity"), &affinity));
        assert!(!p.matches_scope(&s("CrossNamespacePodAffinity"), &be));
        // Object counters and services match no scope.
        assert!(!Evaluator::of("", "configmaps").matches_scope(&s("BestEffort"), &be));
        assert!(!Evaluator::Services.matches_scope(&s("BestEffort"), &be));
    }

    #[test]
    fn volume_attributes_class_scope() {
        let vac = |op: &str| json!({"scopeName": "VolumeAttributesClass", "operator": op, "values": ["fast"]});
        let fast = json!({"spec": {"volumeAttributesClassName": "fast"}});
        let none = json!({"spec": {}});
        let c = Evaluator::Claims;
        assert!(c.matches_scope(&vac("In"), &fast));
        assert!(!c.matches_scope(&vac("In"), &none));
        assert!(c.matches_scope(&vac("NotIn"), &none));
        assert!(!c.matches_scope(&vac("NotIn"), &fast));
        assert!(c.matches_scope(&vac("Exists"), &fast));
        assert!(c.matches_scope(&vac("DoesNotExist"), &none));
    }

    #[test]
    fn matching_resources_by_evaluator() {
        let hard = names(&[
            "pods",
            "requests.cpu",
            "count/configmaps",
            "configmaps",
            "services.nodeports",
            "requests.storage",
            "gold.storageclass.storage.k8s.io/requests.storage",
            "count/deployments.apps",
        ]);
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
        assert_eq!(
            strings(&Evaluator::of("apps", "deployments").usage(&Value::Null, 0)),
            BTreeMap::from([("count/deployments.apps".to_owned(), "1".to_owned())])
        );
    }

    #[test]
    fn list_arithmetic_and_printing() {
        let l = |v: Value| resource_list(Some(&v));
        let a = l(json!({"cpu": "500m", "memory": "1Gi"}));
        let b = l(json!({"cpu": "500m", "pods": "2"}));
        let sum = add_lists(&a, &b);
        assert_eq!(pretty_print(&sum), "cpu=1,memory=1Gi,pods=2");
        assert_eq!(
            list_json(&sum),
            json!({"cpu": "1", "memory": "1Gi", "pods": "2"})
        );
        let mut max = a.clone();
        max_into(&mut max, &l(json!({"cpu": "2", "memory": "1Mi"})));
        assert_eq!(pretty_print(&max), "cpu=2,memory=1Gi");
        let masked = mask(&sum, &names(&["pods", "secrets"]));
        assert_eq!(pretty_print(&masked), "pods=2");
        assert!(lists_equal(&a, &a.clone()));
        assert!(!lists_equal(&a, &sum));
        let selectors = scope_selectors(&json!({"spec": {"scopes": ["BestEffort"],
            "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}}}));
        assert_eq!(selectors.len(), 2);
        assert_eq!(
            selectors[0],
            json!({"scopeName": "BestEffort", "operator": "Exists"})
        );
    }
}
