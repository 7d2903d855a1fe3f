//! The pod subresources that change part of a pod's spec: `ephemeralcontainers` (what
//! `kubectl debug` patches) and `resize` (in-place resource changes), as upstream's
//! podEphemeralContainersStrategy and podResizeStrategy with
//! ValidatePodEphemeralContainersUpdate and ValidatePodResize (v1.37, with its default
//! feature gates: init containers resizable, pod-level resources resizable, memory-backed
//! volumes not).
//!
//! Both take everything but their own fields from the stored pod (spec, status, and the
//! metadata as ResetObjectMetaForStatus keeps it), so a request may carry a whole pod; the
//! generation moves when the spec changed (rest's generation tracking).

use kumo_apimachinery::quantity::Quantity;
use kumo_apimachinery::validation::{FieldError, FieldErrorKind, Path};
use serde_json::{json, Map, Value};

use super::pods::{
    default_container, default_pod_spec, default_requests, qos_class, validate_pod_spec,
    CONTAINER_LISTS,
};
use super::{default_field, str_at};

/// Upstream's kubernetes.io/config.mirror annotation: static pods take neither.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The EphemeralContainerCommon fields an ephemeral container may not set, in the order
/// of the Go struct (upstream's allowedEphemeralContainerFields walks it in that order).
const EPHEMERAL_FORBIDDEN: [&str; 9] = [
    "ports",
    "resources",
    "resizePolicy",
    "restartPolicy",
    "restartPolicyRules",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
];

/// PrepareForUpdate of the subresource `sub` (`ephemeralcontainers` or `resize`).
pub(super) fn prepare_update(sub: &str, new: &mut Value, old: &Value) {
    match sub {
        "ephemeralcontainers" => prepare_ephemeral(new, old),
        "resize" => prepare_resize(new, old),
        _ => {}
    }
}

/// ValidateUpdate of the subresource `sub`.
pub(super) fn validate_update(sub: &str, new: &Value, old: &Value) -> Vec<FieldError> {
    match sub {
        "ephemeralcontainers" => validate_ephemeral(new, old),
        "resize" => validate_resize(new, old),
        _ => Vec::new(),
    }
}

/// The request as upstream's field manager sees it: decoded with a pod's defaults, its
/// status ignored (the pod strategy's reset field), nothing dropped yet.
pub(super) fn tracked_request(sub: &str, request: &Value, old: &Value) -> Option<Value> {
    if !matches!(sub, "ephemeralcontainers" | "resize") {
        return None;
    }
    let mut seen = request.clone();
    if let Some(spec) = seen.get_mut("spec") {
        default_pod_spec(spec);
        default_field(spec, "enableServiceLinks", json!(true));
        for list_name in CONTAINER_LISTS {
            if let Some(cs) = spec.get_mut(list_name).and_then(Value::as_array_mut) {
                cs.iter_mut().for_each(default_requests);
            }
        }
        if let Some(cs) = spec
            .get_mut("ephemeralContainers")
            .and_then(Value::as_array_mut)
        {
            cs.iter_mut().for_each(default_container);
        }
    }
    if let Some(o) = seen.as_object_mut() {
        match old.get("status") {
            Some(s) => o.insert("status".into(), s.clone()),
            None => o.remove("status"),
        };
    }
    Some(seen)
}

fn list<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn is_mirror(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

/// ResetObjectMetaForStatus: the stored metadata, but for the request's managed fields and
/// resourceVersion (the field manager and the precondition work on those).
fn reset_meta(new: &mut Value, old: &Value) {
    let mut meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
    for k in ["managedFields", "resourceVersion"] {
        let mine = new.pointer(&format!("/metadata/{k}")).cloned();
        if let Some(m) = meta.as_object_mut() {
            match mine {
                Some(v) => m.insert(k.to_owned(), v),
                None => m.remove(k),
            };
        }
    }
    if let Some(o) = new.as_object_mut() {
        o.insert("metadata".into(), meta);
        o.insert(
            "status".into(),
            old.get("status").cloned().unwrap_or_else(|| json!({})),
        );
    }
}

/// dropNonEphemeralContainerUpdates, after the defaults a decoded pod gets on its
/// ephemeral containers (SetDefaults_EphemeralContainer).
fn prepare_ephemeral(new: &mut Value, old: &Value) {
    let mut ephemeral = new.pointer("/spec/ephemeralContainers").cloned();
    if let Some(cs) = ephemeral.as_mut().and_then(Value::as_array_mut) {
        cs.iter_mut().for_each(default_container);
    }
    reset_meta(new, old);
    let mut spec = old.get("spec").cloned().unwrap_or_else(|| json!({}));
    if let Some(s) = spec.as_object_mut() {
        match ephemeral.filter(|e| !e.is_null()) {
            Some(e) => s.insert("ephemeralContainers".into(), e),
            None => s.remove("ephemeralContainers"),
        };
    }
    if let Some(o) = new.as_object_mut() {
        o.insert("spec".into(), spec);
    }
}

/// Whether an optional field of a decoded Go struct is set (not its zero value): present
/// and not null; `resources` is a struct, set when any of its fields is.
fn is_set(c: &Value, field: &str) -> bool {
    match c.get(field) {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) if field == "resources" => o.values().any(|v| !v.is_null()),
        Some(Value::String(s)) if field != "restartPolicy" => !s.is_empty(),
        Some(_) => true,
    }
}

/// validateContainerCommon's checks on the ephemeral containers, by kumo's pod spec
/// validation run on them as if they were the containers (paths renamed back).
fn common_checks(new: &Value) -> Vec<FieldError> {
    let spec = new.get("spec").cloned().unwrap_or_else(|| json!({}));
    let ephemeral = list(&spec, "/ephemeralContainers").to_vec();
    let as_containers = json!({
        "volumes": spec.get("volumes").cloned().unwrap_or_else(|| json!([])),
        "containers": ephemeral,
        "restartPolicy": "Always",
        "dnsPolicy": "ClusterFirst",
    });
    validate_pod_spec(&as_containers, &Path::new("spec"))
        .into_iter()
        // Name clashes are judged across every kind of container below.
        .filter(|e| e.kind != FieldErrorKind::Duplicate)
        .filter_map(|mut e| {
            let rest = e.field.strip_prefix("spec.containers[")?;
            e.field = format!("spec.ephemeralContainers[{rest}");
            Some(e)
        })
        .collect()
}

/// ValidatePodEphemeralContainersUpdate.
fn validate_ephemeral(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = validate_pod_spec(new.get("spec").unwrap_or(&Value::Null), &Path::new("spec"));
    errs.extend(ephemeral_checks(new));
    if is_mirror(old) {
        return vec![FieldError::forbidden(
            &Path::new(""),
            "static pods do not support ephemeral containers",
        )];
    }
    let path = Path::new("spec").child("ephemeralContainers");
    // Existing ephemeral containers stay as they are; a patch may reorder them.
    let new_list = list(new, "/spec/ephemeralContainers");
    for o in list(old, "/spec/ephemeralContainers") {
        let name = str_at(o, "/name");
        match new_list.iter().find(|n| str_at(n, "/name") == name) {
            None => errs.push(FieldError::forbidden(
                &path,
                format!("existing ephemeral containers {name:?} may not be removed\n"),
            )),
            Some(n) if !semantically_equal(o, n) => errs.push(FieldError::forbidden(
                &path,
                // Upstream appends a diff of its internal Go structs.
                format!("existing ephemeral containers {name:?} may not be changed\n"),
            )),
            Some(_) => {}
        }
    }
    errs
}

/// validateEphemeralContainers: the part of a pod's validation on its ephemeral
/// containers.
fn ephemeral_checks(new: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let common = common_checks(new);
    let path = Path::new("spec").child("ephemeralContainers");
    let mut others = std::collections::BTreeSet::new();
    for list_name in ["/spec/containers", "/spec/initContainers"] {
        for c in list(new, list_name) {
            others.insert(str_at(c, "/name").to_owned());
        }
    }
    let mut all = others.clone();
    for (i, ec) in list(new, "/spec/ephemeralContainers").iter().enumerate() {
        let idx = path.index(i);
        let prefix = format!("{}.", idx.as_str());
        errs.extend(
            common
                .iter()
                .filter(|e| e.field.starts_with(&prefix))
                .cloned(),
        );
        let image = str_at(ec, "/image");
        if image.trim() != image {
            errs.push(FieldError::invalid(
                &idx.child("image"),
                image,
                "must not have leading or trailing whitespace",
            ));
        }
        let name = str_at(ec, "/name");
        if !all.insert(name.to_owned()) {
            errs.push(FieldError::duplicate(&idx.child("name"), name));
        }
        let target = str_at(ec, "/targetContainerName");
        if !target.is_empty() && !others.contains(target) {
            errs.push(FieldError::not_found(
                &idx.child("targetContainerName"),
                target,
            ));
        }
        for field in EPHEMERAL_FORBIDDEN {
            if is_set(ec, field) {
                errs.push(FieldError::forbidden(
                    &idx.child(field),
                    "cannot be set for an Ephemeral Container",
                ));
            }
        }
        for (j, m) in list(ec, "/volumeMounts").iter().enumerate() {
            for field in ["subPath", "subPathExpr"] {
                if !str_at(m, &format!("/{field}")).is_empty() {
                    errs.push(FieldError::forbidden(
                        &idx.child("volumeMounts").index(j).child(field),
                        "cannot be set for an Ephemeral Container",
                    ));
                }
            }
        }
    }
    errs
}

/// apiequality.Semantic.DeepEqual on JSON: null and empty lists and maps are the same as
/// absent, quantities compare by value.
fn semantically_equal(a: &Value, b: &Value) -> bool {
    normalize(a) == normalize(b)
}

fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(o) => {
            let mut out = Map::new();
            for (k, x) in o {
                let x = normalize(x);
                let empty = match &x {
                    Value::Null => true,
                    Value::Array(a) => a.is_empty(),
                    Value::Object(m) => m.is_empty() && matches!(k.as_str(), "requests" | "limits"),
                    _ => false,
                };
                if !empty {
                    out.insert(k.clone(), x);
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

/// dropNonResizeUpdates, after the defaults a decoded pod gets (requests from limits).
fn prepare_resize(new: &mut Value, old: &Value) {
    for list_name in ["containers", "initContainers"] {
        if let Some(cs) = new
            .pointer_mut(&format!("/spec/{list_name}"))
            .and_then(Value::as_array_mut)
        {
            for c in cs {
                default_container(c);
                default_requests(c);
            }
        }
    }
    let counts_differ = ["/spec/containers", "/spec/initContainers"]
        .iter()
        .any(|p| list(new, p).len() != list(old, p).len());
    if counts_differ {
        // Left for validation to refuse.
        return;
    }
    let merged = |list_name: &str| -> Value {
        let pointer = format!("/spec/{list_name}");
        let (n, o) = (list(new, &pointer), list(old, &pointer));
        if n.is_empty() {
            return new.pointer(&pointer).cloned().unwrap_or(Value::Null);
        }
        if n.iter()
            .zip(o)
            .any(|(a, b)| str_at(a, "/name") != str_at(b, "/name"))
        {
            // A rename or reorder: left for validation to refuse.
            return Value::Array(n.to_vec());
        }
        let out: Vec<Value> = o
            .iter()
            .zip(n)
            .map(|(o, n)| {
                let mut c = o.clone();
                if let Some(obj) = c.as_object_mut() {
                    for k in ["resources", "resizePolicy"] {
                        match n.get(k) {
                            Some(v) => obj.insert(k.to_owned(), v.clone()),
                            None => obj.remove(k),
                        };
                    }
                }
                c
            })
            .collect();
        Value::Array(out)
    };
    let containers = merged("containers");
    let init = merged("initContainers");
    let mut pod_resources = new.pointer("/spec/resources").cloned();
    if pod_resources.as_ref().is_none_or(Value::is_null) {
        // PodLevelResourcesFixDefaulting: a client unaware of pod-level resources keeps them.
        pod_resources = old.pointer("/spec/resources").cloned();
    }
    reset_meta(new, old);
    let mut spec = old.get("spec").cloned().unwrap_or_else(|| json!({}));
    if let Some(s) = spec.as_object_mut() {
        for (k, v) in [
            ("containers", containers),
            ("initContainers", init),
            ("resources", pod_resources.unwrap_or(Value::Null)),
        ] {
            if v.is_null() {
                s.remove(k);
            } else {
                s.insert(k.to_owned(), v);
            }
        }
    }
    if let Some(o) = new.as_object_mut() {
        o.insert("spec".into(), spec);
    }
}

/// The resource names of `requirements[kind]`.
fn names(requirements: Option<&Value>, kind: &str) -> Vec<String> {
    requirements
        .and_then(|r| r.get(kind))
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// resourcesRemoved: a name of the old list missing from the new.
fn removed(new: Option<&Value>, old: Option<&Value>, kind: &str) -> bool {
    let n = names(new, kind);
    names(old, kind).iter().any(|k| !n.contains(k))
}

/// dropCPUMemoryUpdates on `requirements[kind]`: cpu and memory as in `old`.
fn mask_cpu_memory(requirements: &mut Map<String, Value>, old: Option<&Value>, kind: &str) {
    let old_list = old.and_then(|o| o.get(kind)).and_then(Value::as_object);
    let mut list = match requirements.get(kind).and_then(Value::as_object) {
        Some(m) => m.clone(),
        None if old_list.is_none() => {
            requirements.remove(kind);
            return;
        }
        None => Map::new(),
    };
    for r in ["cpu", "memory"] {
        list.remove(r);
        if let Some(v) = old_list.and_then(|o| o.get(r)) {
            list.insert(r.to_owned(), v.clone());
        }
    }
    requirements.insert(kind.to_owned(), Value::Object(list));
}

/// A container with the cpu and memory of its requests and limits taken from `old`.
fn masked_container(c: &Value, old: &Value) -> Value {
    let mut c = c.clone();
    let old_res = old.get("resources");
    if let Some(o) = c.as_object_mut() {
        let res = o.entry("resources").or_insert_with(|| json!({}));
        if let Some(r) = res.as_object_mut() {
            mask_cpu_memory(r, old_res, "limits");
            mask_cpu_memory(r, old_res, "requests");
        }
    }
    c
}

/// Quantities by value, so `0.5` and `500m` are the same request.
fn canonical_quantities(v: &mut Value) {
    for kind in ["requests", "limits"] {
        if let Some(m) = v.get_mut(kind).and_then(Value::as_object_mut) {
            for q in m.values_mut() {
                if let Some(parsed) = Quantity::from_json(q) {
                    *q = json!(parsed.milli_value().to_string());
                }
            }
        }
    }
}

fn same_container(a: &Value, b: &Value) -> bool {
    let canon = |c: &Value| {
        let mut c = normalize(c);
        if let Some(r) = c.get_mut("resources") {
            canonical_quantities(r);
        }
        c
    };
    canon(a) == canon(b)
}

/// Whether a running container's status says its node reports resources (upstream's
/// isPodResizeRequestSupported: the first running container decides).
fn resize_supported(old: &Value) -> bool {
    for s in list(old, "/status/containerStatuses") {
        if s.pointer("/state/running").is_some_and(|r| !r.is_null()) {
            return s.get("resources").is_some_and(|r| !r.is_null());
        }
    }
    true
}

/// Whether pod-level resources name anything.
fn pod_level_set(pod: &Value) -> bool {
    ["requests", "limits"].iter().any(|k| {
        pod.pointer(&format!("/spec/resources/{k}"))
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty())
    })
}

/// ValidatePodResize.
fn validate_resize(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = validate_pod_spec(new.get("spec").unwrap_or(&Value::Null), &Path::new("spec"));
    errs.extend(ephemeral_checks(new));
    if is_mirror(old) {
        return vec![FieldError::forbidden(
            &Path::new(""),
            "static pods cannot be resized",
        )];
    }
    if str_at(old, "/spec/os/name") == "windows" {
        return vec![FieldError::forbidden(
            &Path::new(""),
            "windows pods cannot be resized",
        )];
    }
    let spec = Path::new("spec");
    let old_qos = match str_at(old, "/status/qosClass") {
        "" => qos_class(old),
        q => q,
    };
    if old_qos != qos_class(new) {
        errs.push(FieldError::invalid(
            &spec,
            str_at(new, "/status/qosClass"),
            "Pod QOS Class may not change as a result of resizing",
        ));
    }
    if !resize_supported(old) {
        errs.push(FieldError::forbidden(
            &spec,
            "Pod running on node without support for resize",
        ));
    }
    let mut masked_spec = new.get("spec").cloned().unwrap_or_else(|| json!({}));
    if pod_level_set(old) || pod_level_set(new) {
        let old_res = old.pointer("/spec/resources");
        match new.pointer("/spec/resources").filter(|r| !r.is_null()) {
            None if old_res.is_some_and(|r| !r.is_null()) => {
                errs.push(FieldError::forbidden(
                    &spec.child("resources"),
                    "pod-level resources cannot be removed",
                ));
                return errs;
            }
            new_res => {
                let rp = spec.child("resources");
                if removed(new_res, old_res, "requests") {
                    errs.push(FieldError::forbidden(
                        &rp.child("requests"),
                        "pod-level resource requests cannot be removed",
                    ));
                }
                if removed(new_res, old_res, "limits") {
                    errs.push(FieldError::forbidden(
                        &rp.child("limits"),
                        "pod-level resource limits cannot be removed",
                    ));
                }
                if let Some(r) = masked_spec
                    .get_mut("resources")
                    .and_then(Value::as_object_mut)
                {
                    mask_cpu_memory(r, old_res, "limits");
                    mask_cpu_memory(r, old_res, "requests");
                }
            }
        }
    }
    // validatePodResizeContainerOrdering: the rest assumes the same containers in order.
    let mut ordering = Vec::new();
    for (list_name, what) in [
        ("containers", "containers"),
        ("initContainers", "initContainers"),
    ] {
        let pointer = format!("/spec/{list_name}");
        let (n, o) = (list(new, &pointer), list(old, &pointer));
        if n.len() != o.len() {
            ordering.push(FieldError::forbidden(
                &spec.child(list_name),
                format!("{what} may not be added or removed on resize"),
            ));
        } else {
            for (i, (a, b)) in n.iter().zip(o).enumerate() {
                if str_at(a, "/name") != str_at(b, "/name") {
                    ordering.push(FieldError::forbidden(
                        &spec.child(list_name).index(i).child("name"),
                        format!("{what} may not be renamed or reordered on resize"),
                    ));
                }
            }
        }
    }
    if !ordering.is_empty() {
        errs.extend(ordering);
        return errs;
    }
    for list_name in ["initContainers", "containers"] {
        let pointer = format!("/spec/{list_name}");
        for (i, (n, o)) in list(new, &pointer)
            .iter()
            .zip(list(old, &pointer))
            .enumerate()
        {
            let rp = spec.child(list_name).index(i).child("resources");
            if removed(n.get("resources"), o.get("resources"), "requests") {
                errs.push(FieldError::forbidden(
                    &rp.child("requests"),
                    "resource requests cannot be removed",
                ));
            }
            if removed(n.get("resources"), o.get("resources"), "limits") {
                errs.push(FieldError::forbidden(
                    &rp.child("limits"),
                    "resource limits cannot be removed",
                ));
            }
        }
    }
    let mut masked_containers = Vec::new();
    for (n, o) in list(new, "/spec/containers")
        .iter()
        .zip(list(old, "/spec/containers"))
    {
        let m = masked_container(n, o);
        if !same_container(&m, o) {
            errs.push(FieldError::forbidden(
                &spec,
                "only cpu and memory resources are mutable",
            ));
        }
        masked_containers.push(m);
    }
    let mut masked_init = Vec::new();
    for (i, (n, o)) in list(new, "/spec/initContainers")
        .iter()
        .zip(list(old, "/spec/initContainers"))
        .enumerate()
    {
        let restartable = str_at(n, "/restartPolicy") == "Always";
        let modified = !same_container(n, o);
        let m = masked_container(n, o);
        let ip = spec.child("initContainers").index(i);
        if !same_container(&m, o) {
            errs.push(FieldError::forbidden(
                &ip,
                "only cpu and memory resources for init or sidecar containers are mutable",
            ));
        }
        if modified && !restartable {
            for p in list(&m, "/resizePolicy") {
                if str_at(p, "/restartPolicy") == "RestartContainer" {
                    errs.push(FieldError::forbidden(
                        &ip,
                        "non-sidecar init containers with a resize policy of RestartContainer cannot be resized",
                    ));
                }
            }
        }
        masked_init.push(m);
    }
    if !semantically_equal(
        new.pointer("/spec/volumes").unwrap_or(&Value::Null),
        old.pointer("/spec/volumes").unwrap_or(&Value::Null),
    ) {
        errs.push(FieldError::forbidden(
            &spec.child("volumes"),
            "volumes are immutable on resize when InPlacePodVerticalScalingMemoryBackedVolumes feature gate is disabled",
        ));
    }
    if !errs.is_empty() {
        return errs;
    }
    if let Some(s) = masked_spec.as_object_mut() {
        if !masked_containers.is_empty() {
            s.insert("containers".into(), Value::Array(masked_containers));
        }
        if !masked_init.is_empty() {
            s.insert("initContainers".into(), Value::Array(masked_init));
        }
    }
    let old_spec = old.get("spec").cloned().unwrap_or(Value::Null);
    let canon_spec = |s: &Value| {
        let mut s = normalize(s);
        for list_name in ["containers", "initContainers"] {
            if let Some(cs) = s.get_mut(list_name).and_then(Value::as_array_mut) {
                for c in cs {
                    if let Some(r) = c.get_mut("resources") {
                        canonical_quantities(r);
                    }
                }
            }
        }
        if let Some(r) = s.get_mut("resources") {
            canonical_quantities(r);
        }
        s
    };
    if canon_spec(&masked_spec) != canon_spec(&old_spec) {
        errs.push(FieldError::forbidden(
            &spec,
            "only cpu and memory resources are mutable",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {
                "containers": [{
                    "name": "c", "image": "nginx", "imagePullPolicy": "Always",
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}},
                }],
                "restartPolicy": "Always",
                "dnsPolicy": "ClusterFirst",
            },
            "status": {"phase": "Pending", "qosClass": "Burstable"},
        })
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn ephemeral_containers_only_change_their_list() {
        let old = pod();
        let mut new = pod();
        new["metadata"]["labels"] = json!({"x": "y"});
        new["spec"]["containers"][0]["image"] = json!("other");
        new["spec"]["ephemeralContainers"] =
            json!([{"name": "d", "image": "busybox", "targetContainerName": "c"}]);
        prepare_update("ephemeralcontainers", &mut new, &old);
        assert_eq!(new["metadata"]["labels"], json!({"a": "b"}));
        assert_eq!(new["spec"]["containers"][0]["image"], "nginx");
        assert_eq!(
            new["spec"]["ephemeralContainers"][0]["imagePullPolicy"],
            "Always"
        );
        assert!(validate_update("ephemeralcontainers", &new, &old).is_empty());
        // Removing it again is refused.
        let mut gone = new.clone();
        gone["spec"]["ephemeralContainers"] = json!([]);
        assert_eq!(
            messages(&validate_update("ephemeralcontainers", &gone, &new)),
            vec!["spec.ephemeralContainers: Forbidden: existing ephemeral containers \"d\" may not be removed\n"]
        );
    }

    #[test]
    fn ephemeral_container_rules() {
        let old = pod();
        let mut new = pod();
        new["spec"]["ephemeralContainers"] = json!([{
            "name": "c", "image": "busybox", "targetContainerName": "nope",
            "ports": [{"containerPort": 80, "protocol": "TCP"}],
            "resources": {"limits": {"cpu": "1"}},
            "lifecycle": {"preStop": {"exec": {"command": ["x"]}}},
        }]);
        prepare_update("ephemeralcontainers", &mut new, &old);
        assert_eq!(
            messages(&validate_update("ephemeralcontainers", &new, &old)),
            vec![
                "spec.ephemeralContainers[0].name: Duplicate value: \"c\"",
                "spec.ephemeralContainers[0].targetContainerName: Not found: \"nope\"",
                "spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[0].resources: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[0].lifecycle: Forbidden: cannot be set for an Ephemeral Container",
            ]
        );
    }

    #[test]
    fn resize_keeps_only_resources() {
        let old = pod();
        let mut new = pod();
        new["spec"]["containers"][0]["image"] = json!("other");
        new["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("200m");
        prepare_update("resize", &mut new, &old);
        assert_eq!(new["spec"]["containers"][0]["image"], "nginx");
        assert_eq!(
            new["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "200m"
        );
        assert!(validate_update("resize", &new, &old).is_empty());
        // Another resource than cpu and memory.
        let mut bad = new.clone();
        bad["spec"]["containers"][0]["resources"]["requests"]["ephemeral-storage"] = json!("1Gi");
        assert_eq!(
            messages(&validate_update("resize", &bad, &old)),
            vec!["spec: Forbidden: only cpu and memory resources are mutable"]
        );
        // A removed request.
        let mut bad = new.clone();
        bad["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "500m"}});
        let mut old2 = old.clone();
        old2["spec"]["containers"][0]["resources"]["requests"]["memory"] = json!("1Mi");
        assert!(messages(&validate_update("resize", &bad, &old2))
            .contains(&"spec.containers[0].resources.requests: Forbidden: resource requests cannot be removed".to_owned()));
        // The QoS class may not change.
        let mut bad = new.clone();
        bad["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}});
        assert_eq!(
            messages(&validate_update("resize", &bad, &old)),
            vec!["spec: Invalid value: \"Burstable\": Pod QOS Class may not change as a result of resizing"]
        );
    }
}
