//! LimitRanger (mutating and validating): the namespace's LimitRanges give containers of
//! new pods their default requests and limits (recorded in the
//! `kubernetes.io/limit-ranger` annotation), and refuse pods and PersistentVolumeClaims
//! outside their min, max and maxLimitRequestRatio, with upstream's messages.

use async_trait::async_trait;
use kumo_apimachinery::status::ApiError;
use serde_json::{json, Map, Value};

use super::quota::{
    aggregate_containers, container_resources, forbidden, list_stored, resource_list, Quantity,
    ResourceList,
};
use super::{Attributes, Operation, Plugin};

/// The annotation that lists what LimitRanger set.
pub const ANNOTATION: &str = "kubernetes.io/limit-ranger";

/// The `LimitRanger` admission plugin.
pub struct LimitRanger;

/// Which kind of object a request is about, for LimitRanger.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Pod,
    Claim,
}

/// SupportsAttributes: pod creates (and pods/resize), claim creates and updates.
fn target(a: &Attributes<'_>) -> Option<Target> {
    if !a.resource.group.is_empty() {
        return None;
    }
    let sub = a.subresource.unwrap_or("");
    match (a.resource.plural, sub, a.operation) {
        ("pods", "resize", Operation::Update) => Some(Target::Pod),
        ("pods", "", Operation::Create) => Some(Target::Pod),
        ("persistentvolumeclaims", "", Operation::Create | Operation::Update) => {
            Some(Target::Claim)
        }
        _ => None,
    }
}

/// The namespace's LimitRanges, or none when the request is not LimitRanger's or its
/// object is being deleted.
async fn limit_ranges(a: &Attributes<'_>) -> Result<Option<(Target, Vec<Value>)>, ApiError> {
    let Some(t) = target(a) else { return Ok(None) };
    if a.old.is_some_and(|o| {
        o.pointer("/metadata/deletionTimestamp")
            .is_some_and(|d| !d.is_null())
    }) {
        return Ok(None);
    }
    let Some(ns) = a.namespace else {
        return Ok(None);
    };
    let items = list_stored(a, format!("/registry/limitranges/{ns}/")).await?;
    Ok(Some((t, items.into_iter().map(|(v, _)| v).collect())))
}

/// The `spec.limits` items of a LimitRange.
fn items(lr: &Value) -> impl Iterator<Item = &Value> {
    lr.pointer("/spec/limits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn item_type(item: &Value) -> &str {
    item.get("type").and_then(Value::as_str).unwrap_or("")
}

#[async_trait]
impl Plugin for LimitRanger {
    fn name(&self) -> &'static str {
        "LimitRanger"
    }

    async fn admit(&self, a: &Attributes<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        let Some(obj) = obj else { return Ok(()) };
        let Some((t, ranges)) = limit_ranges(a).await? else {
            return Ok(());
        };
        if t != Target::Pod {
            return Ok(());
        }
        let mut changed = false;
        for lr in &ranges {
            changed |= apply_defaults(lr, obj);
        }
        // The QoS class follows the resources (upstream's strategy computes it after
        // admission; here the strategy ran first).
        if changed && obj.pointer("/status/qosClass").is_some() {
            let qos = qos_class(obj);
            obj["status"]["qosClass"] = json!(qos);
        }
        Ok(())
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        let Some(obj) = obj else { return Ok(()) };
        let Some((t, ranges)) = limit_ranges(a).await? else {
            return Ok(());
        };
        for lr in &ranges {
            let errs = match t {
                Target::Pod => validate_pod(lr, obj),
                Target::Claim => validate_claim(lr, obj),
            };
            if let Some(msg) = aggregate(&errs) {
                return Err(forbidden(a, Some(obj), &msg));
            }
        }
        Ok(())
    }
}

/// The pod's QoS class (GetPodQOS: cpu and memory only).
fn qos_class(pod: &Value) -> &'static str {
    let supported = |k: &str| k == "cpu" || k == "memory";
    let mut requests = ResourceList::new();
    let mut limits = ResourceList::new();
    let mut guaranteed = true;
    let mut account = |req: ResourceList, lim: ResourceList, guaranteed: &mut bool| {
        for (k, q) in req {
            if supported(&k) && q > Quantity::zero() {
                let sum = requests.get(&k).map_or(q, |x| x.add(&q));
                requests.insert(k, sum);
            }
        }
        let mut found = 0;
        for (k, q) in lim {
            if supported(&k) && q > Quantity::zero() {
                found += 1;
                let sum = limits.get(&k).map_or(q, |x| x.add(&q));
                limits.insert(k, sum);
            }
        }
        if found < 2 {
            *guaranteed = false;
        }
    };
    if super::quota::pod_level_resources_set(pod) {
        account(
            resource_list(pod.pointer("/spec/resources/requests")),
            resource_list(pod.pointer("/spec/resources/limits")),
            &mut guaranteed,
        );
    } else {
        for list in ["initContainers", "containers"] {
            for c in pod
                .pointer(&format!("/spec/{list}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                account(
                    container_resources(c, "requests"),
                    container_resources(c, "limits"),
                    &mut guaranteed,
                );
            }
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed
        && requests.iter().all(|(k, q)| limits.get(k) == Some(q))
        && requests.len() == limits.len()
    {
        return "Guaranteed";
    }
    "Burstable"
}

/// utilerrors.NewAggregate(...).Error(): one message, or the distinct ones in brackets.
fn aggregate(errs: &[String]) -> Option<String> {
    match errs {
        [] => None,
        [one] => Some(one.clone()),
        many => {
            let mut seen: Vec<&str> = Vec::new();
            for e in many {
                if !seen.contains(&e.as_str()) {
                    seen.push(e);
                }
            }
            if seen.len() == 1 {
                Some(seen[0].to_owned())
            } else {
                Some(format!("[{}]", seen.join(", ")))
            }
        }
    }
}

/// PodMutateLimitFunc: every container and init container gets the Container items'
/// defaultRequest and default it does not set; the annotation says what was set.
fn apply_defaults(lr: &Value, pod: &mut Value) -> bool {
    let mut requests = ResourceList::new();
    let mut limits = ResourceList::new();
    for item in items(lr).filter(|i| item_type(i) == "Container") {
        requests.extend(resource_list(item.get("defaultRequest")));
        limits.extend(resource_list(item.get("default")));
    }
    let mut notes = Vec::new();
    for (list, what) in [
        ("containers", "container"),
        ("initContainers", "init container"),
    ] {
        let Some(cs) = pod
            .pointer_mut(&format!("/spec/{list}"))
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for c in cs.iter_mut() {
            merge_container(c, &requests, &limits, what, &mut notes);
        }
    }
    if notes.is_empty() {
        return false;
    }
    let Some(o) = pod.as_object_mut() else {
        return true;
    };
    let meta = o.entry("metadata").or_insert_with(|| json!({}));
    let Some(meta) = meta.as_object_mut() else {
        return true;
    };
    let ann = meta.entry("annotations").or_insert_with(|| json!({}));
    if ann.is_null() {
        *ann = json!({});
    }
    if let Some(ann) = ann.as_object_mut() {
        ann.insert(
            ANNOTATION.into(),
            json!(format!("LimitRanger plugin set: {}", notes.join("; "))),
        );
    }
    true
}

/// mergeContainerResources.
fn merge_container(
    c: &mut Value,
    requests: &ResourceList,
    limits: &ResourceList,
    what: &str,
    notes: &mut Vec<String>,
) {
    let name = c
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let Some(c) = c.as_object_mut() else { return };
    let res = c.entry("resources").or_insert_with(|| json!({}));
    if !res.is_object() {
        *res = json!({});
    }
    let Some(res) = res.as_object_mut() else {
        return;
    };
    let mut fill = |key: &str, defaults: &ResourceList| -> Vec<String> {
        let list = res.entry(key).or_insert_with(|| json!({}));
        if !list.is_object() {
            *list = json!({});
        }
        let mut set = Vec::new();
        if let Some(list) = list.as_object_mut() {
            for (k, q) in defaults {
                if !list.contains_key(k) {
                    list.insert(k.clone(), q.json());
                    set.push(k.clone());
                }
            }
        }
        set
    };
    let set_limits = fill("limits", limits);
    let set_requests = fill("requests", requests);
    // Upstream leaves empty maps behind, which serialize as nothing.
    for key in ["limits", "requests"] {
        if res
            .get(key)
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        {
            res.remove(key);
        }
    }
    if !set_requests.is_empty() {
        notes.push(format!(
            "{} request for {what} {name}",
            set_requests.join(", ")
        ));
    }
    if !set_limits.is_empty() {
        notes.push(format!("{} limit for {what} {name}", set_limits.join(", ")));
    }
}

/// The observed request, limit and enforced values as compared
/// (requestLimitEnforcedValues: thousandths).
fn milli(q: Option<&Quantity>) -> i128 {
    q.map(Quantity::milli_value).unwrap_or(0)
}

fn min_constraint(
    kind: &str,
    res: &str,
    enforced: &Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let req = requests.get(res);
    let lim = limits.get(res);
    let Some(req) = req else {
        return Some(format!(
            "minimum {res} usage per {kind} is {enforced}.  No request is specified"
        ));
    };
    if milli(Some(req)) < enforced.milli_value() {
        return Some(format!(
            "minimum {res} usage per {kind} is {enforced}, but request is {req}"
        ));
    }
    if let Some(lim) = lim.filter(|l| l.milli_value() < enforced.milli_value()) {
        return Some(format!(
            "minimum {res} usage per {kind} is {enforced}, but limit is {lim}"
        ));
    }
    None
}

fn max_request_constraint(
    kind: &str,
    res: &str,
    enforced: &Quantity,
    requests: &ResourceList,
) -> Option<String> {
    let Some(req) = requests.get(res) else {
        return Some(format!(
            "maximum {res} usage per {kind} is {enforced}.  No request is specified"
        ));
    };
    if req.milli_value() > enforced.milli_value() {
        return Some(format!(
            "maximum {res} usage per {kind} is {enforced}, but request is {req}"
        ));
    }
    None
}

fn max_constraint(
    kind: &str,
    res: &str,
    enforced: &Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let Some(lim) = limits.get(res) else {
        return Some(format!(
            "maximum {res} usage per {kind} is {enforced}.  No limit is specified"
        ));
    };
    if lim.milli_value() > enforced.milli_value() {
        return Some(format!(
            "maximum {res} usage per {kind} is {enforced}, but limit is {lim}"
        ));
    }
    if let Some(req) = requests
        .get(res)
        .filter(|r| r.milli_value() > enforced.milli_value())
    {
        return Some(format!(
            "maximum {res} usage per {kind} is {enforced}, but request is {req}"
        ));
    }
    None
}

fn ratio_constraint(
    kind: &str,
    res: &str,
    enforced: &Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let req = milli(requests.get(res));
    let lim = milli(limits.get(res));
    if req == 0 {
        return Some(format!(
            "{res} max limit to request ratio per {kind} is {enforced}, but no request is specified or request is 0"
        ));
    }
    if lim == 0 {
        return Some(format!(
            "{res} max limit to request ratio per {kind} is {enforced}, but no limit is specified or limit is 0"
        ));
    }
    let observed = lim as f64 / req as f64;
    if observed * 1000.0 > enforced.milli_value() as f64 {
        return Some(format!(
            "{res} max limit to request ratio per {kind} is {enforced}, but provided ratio is {observed:.6}"
        ));
    }
    None
}

/// The min, max and ratio checks of one item against one set of requests and limits.
fn check_item(
    item: &Value,
    kind: &str,
    requests: &ResourceList,
    limits: &ResourceList,
    errs: &mut Vec<String>,
) {
    for (k, v) in resource_list(item.get("min")) {
        errs.extend(min_constraint(kind, &k, &v, requests, limits));
    }
    for (k, v) in resource_list(item.get("max")) {
        errs.extend(max_constraint(kind, &k, &v, requests, limits));
    }
    for (k, v) in resource_list(item.get("maxLimitRequestRatio")) {
        errs.extend(ratio_constraint(kind, &k, &v, requests, limits));
    }
}

/// PodValidateLimitFunc.
fn validate_pod(lr: &Value, pod: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    for item in items(lr) {
        match item_type(item) {
            "Container" => {
                for list in ["containers", "initContainers"] {
                    for c in pod
                        .pointer(&format!("/spec/{list}"))
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        check_item(
                            item,
                            "Container",
                            &container_resources(c, "requests"),
                            &container_resources(c, "limits"),
                            &mut errs,
                        );
                    }
                }
            }
            "Pod" => {
                let (mut requests, mut limits) = (
                    aggregate_containers(pod, "requests"),
                    aggregate_containers(pod, "limits"),
                );
                // Pod-level cpu and memory override the containers' sums.
                for (which, list) in [("requests", &mut requests), ("limits", &mut limits)] {
                    for (k, q) in resource_list(pod.pointer(&format!("/spec/resources/{which}"))) {
                        if k == "cpu" || k == "memory" {
                            list.insert(k, q);
                        }
                    }
                }
                check_item(item, "Pod", &requests, &limits, &mut errs);
            }
            _ => {}
        }
    }
    errs
}

/// PersistentVolumeClaimValidateLimitFunc: min and max of the claim's requests.
fn validate_claim(lr: &Value, pvc: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let requests = resource_list(pvc.pointer("/spec/resources/requests"));
    for item in items(lr).filter(|i| item_type(i) == "PersistentVolumeClaim") {
        for (k, v) in resource_list(item.get("min")) {
            errs.extend(min_constraint(
                "PersistentVolumeClaim",
                &k,
                &v,
                &requests,
                &ResourceList::new(),
            ));
        }
        for (k, v) in resource_list(item.get("max")) {
            errs.extend(max_request_constraint(
                "PersistentVolumeClaim",
                &k,
                &v,
                &requests,
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lr(limits: Value) -> Value {
        json!({"spec": {"limits": limits}})
    }

    #[test]
    fn defaults_and_annotation() {
        let lr = lr(json!([{
            "type": "Container",
            "default": {"cpu": "500m", "memory": "128Mi"},
            "defaultRequest": {"cpu": "100m", "memory": "64Mi"},
        }]));
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "a", "resources": {"limits": {"cpu": "1"}}}],
            "initContainers": [{"name": "i"}],
        }});
        apply_defaults(&lr, &mut pod);
        assert_eq!(
            pod["metadata"]["annotations"][ANNOTATION],
            "LimitRanger plugin set: cpu, memory request for container a; memory limit for container a; cpu, memory request for init container i; cpu, memory limit for init container i"
        );
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["limits"]["cpu"],
            "1"
        );
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "100m"
        );
        assert_eq!(
            pod["spec"]["initContainers"][0]["resources"]["limits"]["memory"],
            "128Mi"
        );
    }

    #[test]
    fn max_min_ratio_messages() {
        let lr = lr(json!([{
            "type": "Container",
            "max": {"cpu": "1"},
            "min": {"memory": "10Mi"},
            "maxLimitRequestRatio": {"cpu": "2"},
        }]));
        let pod = json!({"spec": {"containers": [{"name": "a", "resources": {
            "limits": {"cpu": "2", "memory": "5Mi"}, "requests": {"cpu": "500m", "memory": "5Mi"}}}]}});
        let errs = validate_pod(&lr, &pod);
        assert_eq!(
            aggregate(&errs).as_deref(),
            Some("[minimum memory usage per Container is 10Mi, but request is 5Mi, maximum cpu usage per Container is 1, but limit is 2, cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000]")
        );
        let claim_lr = json!({"spec": {"limits": [{"type": "PersistentVolumeClaim", "max": {"storage": "1Gi"}}]}});
        let pvc = json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
        assert_eq!(
            validate_claim(&claim_lr, &pvc),
            vec![
                "maximum storage usage per PersistentVolumeClaim is 1Gi, but request is 2Gi"
                    .to_owned()
            ]
        );
    }
}
