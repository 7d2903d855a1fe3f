//! apps/v1 Deployments, ReplicaSets, StatefulSets, DaemonSets and ControllerRevisions,
//! and the pieces every workload with a pod template shares (template defaults and
//! validation, selectors, the container columns), which `batch` and `workloads_core` use
//! too.
//!
//! Defaults are upstream's SetDefaults_* of apps/v1, validation its ValidateDeployment,
//! ValidateReplicaSet, ValidateStatefulSet, ValidateDaemonSet and
//! ValidateControllerRevision, with their paths and messages.

use std::collections::BTreeMap;

use kumo_apimachinery::selector::{ApiLabelSelector, LabelSelector};
use kumo_apimachinery::validation::{
    is_valid_percent, validate_label_selector, FieldError, LabelSelectorValidationOptions, Path,
};
use serde_json::{json, Value};

use super::pods::{default_pod_spec, validate_pod_template};
pub(super) use super::printing::{col, format_label_selector, keep_status, wide};
use super::{
    age_of, default_field, name_of, or_none, str_at, Column, Resource, ScaleSpec, SelectorForm,
    Strategy,
};

pub(super) fn resources() -> Vec<Resource> {
    let apps = |kind, plural, singular, short_names, subresources, strategy| Resource {
        group: "apps",
        version: "v1",
        kind,
        plural,
        singular,
        namespaced: true,
        short_names,
        categories: &["all"],
        subresources,
        strategy,
    };
    vec![
        apps(
            "Deployment",
            "deployments",
            "deployment",
            &["deploy"],
            &["status", "scale"],
            Box::new(Deployments),
        ),
        apps(
            "ReplicaSet",
            "replicasets",
            "replicaset",
            &["rs"],
            &["status", "scale"],
            Box::new(ReplicaSets),
        ),
        apps(
            "StatefulSet",
            "statefulsets",
            "statefulset",
            &["sts"],
            &["status", "scale"],
            Box::new(StatefulSets),
        ),
        apps(
            "DaemonSet",
            "daemonsets",
            "daemonset",
            &["ds"],
            &["status"],
            Box::new(DaemonSets),
        ),
        Resource {
            group: "apps",
            version: "v1",
            kind: "ControllerRevision",
            plural: "controllerrevisions",
            singular: "controllerrevision",
            namespaced: true,
            short_names: &[],
            categories: &[],
            subresources: &[],
            strategy: Box::new(ControllerRevisions),
        },
    ]
}

// ---------------------------------------------------------------------------------------
// What every workload with a pod template shares.
// ---------------------------------------------------------------------------------------

/// An integer at a JSON pointer.
pub(super) fn int_at(obj: &Value, pointer: &str) -> Option<i64> {
    obj.pointer(pointer).and_then(Value::as_i64)
}

/// The object at `pointer`, created (as `{}`) along the way where missing or not an object.
pub(super) fn object_at<'a>(obj: &'a mut Value, pointer: &str) -> &'a mut Value {
    let mut cur = obj;
    for key in pointer.split('/').filter(|k| !k.is_empty()) {
        if !cur.is_object() {
            *cur = json!({});
        }
        // (Indexing an object inserts the missing key.)
        let next = &mut cur[key];
        if !next.is_object() {
            *next = json!({});
        }
        cur = next;
    }
    cur
}

/// Pod spec defaults on the template at `pointer` (e.g. `/spec/template`).
pub(super) fn default_template(obj: &mut Value, pointer: &str) {
    let template = object_at(obj, pointer);
    default_field(template, "metadata", json!({}));
    let spec = object_at(template, "/spec");
    default_pod_spec(spec);
}

/// An error for a negative integer at `pointer`.
pub(super) fn nonneg(errs: &mut Vec<FieldError>, obj: &Value, pointer: &str, path: &Path) {
    if let Some(v) = int_at(obj, pointer) {
        errs.extend(kumo_apimachinery::validation::validate_nonnegative_field(
            v, path,
        ));
    }
}

/// A metav1.LabelSelector as a selector: absent or null selects nothing, as upstream's
/// LabelSelectorAsSelector.
pub(super) fn label_selector(sel: Option<&Value>) -> Option<LabelSelector> {
    LabelSelector::from_json(sel.unwrap_or(&Value::Null)).ok()
}

/// A JSON map of strings (labels, a selector map) as a sorted map.
pub(super) fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// upstream's labels.FormatLabels: `k=v,...` sorted by key, `<none>` when empty.
pub(super) fn format_labels(v: Option<&Value>) -> String {
    let s = string_map(v)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    or_none(&s)
}

/// The Containers and Images cells of the pod spec at `pointer`.
pub(super) fn container_cells(obj: &Value, pointer: &str) -> (String, String) {
    let containers = obj
        .pointer(&format!("{pointer}/containers"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let names: Vec<&str> = containers.iter().map(|c| str_at(c, "/name")).collect();
    let images: Vec<&str> = containers.iter().map(|c| str_at(c, "/image")).collect();
    (names.join(","), images.join(","))
}

pub(super) const CONTAINERS: Column = wide(
    "Containers",
    "string",
    "Names of each container in the template.",
);
pub(super) const IMAGES: Column = wide(
    "Images",
    "string",
    "Images referenced by each container in the template.",
);
pub(super) const SELECTOR: Column = wide("Selector", "string", "Label selector of the pods.");

/// `spec.selector` of a workload: required, a valid label selector and (with
/// `empty_invalid_for`) not empty.
pub(super) fn validate_selector(
    errs: &mut Vec<FieldError>,
    sel: Option<&Value>,
    path: &Path,
    empty_invalid_for: Option<&str>,
) {
    let Some(sel) = sel.filter(|s| !s.is_null()) else {
        errs.push(FieldError::required(path, ""));
        return;
    };
    match serde_json::from_value::<ApiLabelSelector>(sel.clone()) {
        Ok(api) => {
            errs.extend(validate_label_selector(
                &api,
                LabelSelectorValidationOptions::default(),
                path,
            ));
            if let Some(what) = empty_invalid_for {
                if api.match_labels.is_empty() && api.match_expressions.is_empty() {
                    errs.push(FieldError::invalid(
                        path,
                        sel.clone(),
                        format!("empty selector is invalid for {what}"),
                    ));
                }
            }
        }
        Err(_) => errs.push(FieldError::invalid(
            path,
            sel.clone(),
            "invalid label selector",
        )),
    }
}

/// The selector must select the template's labels (an empty selector selects anything).
pub(super) fn validate_selector_matches(
    errs: &mut Vec<FieldError>,
    sel: Option<&Value>,
    template: &Value,
    template_path: &Path,
) {
    let Some(selector) = label_selector(sel) else {
        return;
    };
    let labels = template.pointer("/metadata/labels");
    if !selector.is_empty() && !selector.matches(&string_map(labels)) {
        errs.push(FieldError::invalid(
            &template_path.child("metadata").child("labels"),
            labels.cloned().unwrap_or(Value::Null),
            "`selector` does not match template `labels`",
        ));
    }
}

/// The template of a controller that keeps pods running (upstream's
/// ValidatePodTemplateSpecForReplicaSet): restartPolicy Always, no activeDeadlineSeconds.
/// `what` names the controller in the activeDeadlineSeconds message.
pub(super) fn validate_long_running_template(
    errs: &mut Vec<FieldError>,
    template: &Value,
    path: &Path,
    what: &str,
) {
    errs.extend(validate_pod_template(template, path));
    let rp = str_at(template, "/spec/restartPolicy");
    if rp != "Always" {
        errs.push(FieldError::not_supported(
            &path.child("spec").child("restartPolicy"),
            rp.to_owned(),
            &["Always"],
        ));
    }
    if template.pointer("/spec/activeDeadlineSeconds").is_some() {
        errs.push(FieldError::forbidden(
            &path.child("spec").child("activeDeadlineSeconds"),
            format!("activeDeadlineSeconds in {what} is not Supported"),
        ));
    }
}

/// upstream's ValidateImmutableField for the value at `pointer`.
pub(super) fn immutable(
    errs: &mut Vec<FieldError>,
    new: &Value,
    old: &Value,
    pointer: &str,
    path: &Path,
) {
    let (n, o) = (new.pointer(pointer), old.pointer(pointer));
    if n != o {
        errs.push(FieldError::invalid(
            path,
            n.cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
}

/// The status rules of a controller that counts replicas (upstream's Validate*Status).
pub(super) struct StatusRules {
    /// Counts that may not be negative, in upstream's order.
    pub nonneg: &'static [&'static str],
    /// Counts that may not exceed `replicas`.
    pub at_most_replicas: &'static [&'static str],
    /// The message when `availableReplicas` exceeds `readyReplicas` (if checked).
    pub available_over_ready: Option<&'static str>,
    /// Whether `collisionCount` may not go down.
    pub collision_count: bool,
}

/// Validation of a status update by `rules`.
pub(super) fn validate_status(new: &Value, old: &Value, rules: &StatusRules) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let status = Path::new("status");
    for field in rules.nonneg {
        nonneg(
            &mut errs,
            new,
            &format!("/status/{field}"),
            &status.child(field),
        );
    }
    let count = |f: &str| int_at(new, &format!("/status/{f}")).unwrap_or(0);
    for field in rules.at_most_replicas {
        if count(field) > count("replicas") {
            errs.push(FieldError::invalid(
                &status.child(field),
                json!(count(field)),
                "cannot be greater than status.replicas",
            ));
        }
    }
    if let Some(msg) = rules.available_over_ready {
        if count("availableReplicas") > count("readyReplicas") {
            errs.push(FieldError::invalid(
                &status.child("availableReplicas"),
                json!(count("availableReplicas")),
                msg,
            ));
        }
    }
    if rules.collision_count {
        if let Some(o) = int_at(old, "/status/collisionCount") {
            let n = int_at(new, "/status/collisionCount");
            if n.is_none_or(|n| n < o) {
                errs.push(FieldError::invalid(
                    &status.child("collisionCount"),
                    json!(n.unwrap_or(0)),
                    "cannot be decremented",
                ));
            }
        }
    }
    errs
}

/// The value of an int-or-percent (`25%` is 25), as upstream's getIntOrPercentValue.
fn int_or_percent(v: &Value) -> i64 {
    match v {
        Value::String(s) if is_valid_percent(s).is_empty() => s[..s.len() - 1].parse().unwrap_or(0),
        Value::String(s) => s.parse().unwrap_or(0),
        other => other.as_i64().unwrap_or(0),
    }
}

/// upstream's ValidatePositiveIntOrPercent.
fn validate_int_or_percent(errs: &mut Vec<FieldError>, v: Option<&Value>, path: &Path) {
    match v {
        Some(Value::String(s)) => {
            for msg in is_valid_percent(s) {
                errs.push(FieldError::invalid(path, s.as_str(), msg));
            }
        }
        Some(n @ Value::Number(_)) => {
            errs.extend(kumo_apimachinery::validation::validate_nonnegative_field(
                n.as_i64().unwrap_or(0),
                path,
            ))
        }
        _ => {}
    }
}

/// upstream's IsNotMoreThan100Percent.
fn not_more_than_100_percent(errs: &mut Vec<FieldError>, v: Option<&Value>, path: &Path) {
    if let Some(Value::String(s)) = v {
        if is_valid_percent(s).is_empty() && int_or_percent(&Value::String(s.clone())) > 100 {
            errs.push(FieldError::invalid(
                path,
                s.as_str(),
                "must not be greater than 100%",
            ));
        }
    }
}

/// Whether the annotations differ (deployments bump their generation on those too).
fn annotations_changed(new: &Value, old: &Value) -> bool {
    new.pointer("/metadata/annotations") != old.pointer("/metadata/annotations")
}

fn bump_generation(new: &mut Value, old: &Value) {
    let g = int_at(old, "/metadata/generation").unwrap_or(0);
    object_at(new, "/metadata")["generation"] = json!(g + 1);
}

// ---------------------------------------------------------------------------------------
// Deployments
// ---------------------------------------------------------------------------------------

struct Deployments;

/// SetDefaults_Deployment and the template's pod defaults.
fn default_deployment(obj: &mut Value) {
    let spec = object_at(obj, "/spec");
    default_field(spec, "replicas", json!(1));
    let strategy = object_at(spec, "/strategy");
    default_field(strategy, "type", json!("RollingUpdate"));
    if str_at(strategy, "/type") == "RollingUpdate" {
        let ru = object_at(strategy, "/rollingUpdate");
        default_field(ru, "maxUnavailable", json!("25%"));
        default_field(ru, "maxSurge", json!("25%"));
    }
    default_field(spec, "revisionHistoryLimit", json!(10));
    default_field(spec, "progressDeadlineSeconds", json!(600));
    default_template(obj, "/spec/template");
}

fn validate_deployment(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = Path::new("spec");
    nonneg(&mut errs, obj, "/spec/replicas", &spec.child("replicas"));
    let sel = obj.pointer("/spec/selector");
    validate_selector(&mut errs, sel, &spec.child("selector"), Some("deployment"));
    let template = obj.pointer("/spec/template").unwrap_or(&Value::Null);
    let tpath = spec.child("template");
    validate_selector_matches(&mut errs, sel, template, &tpath);
    validate_long_running_template(&mut errs, template, &tpath, "ReplicaSet");
    // The strategy.
    let spath = spec.child("strategy");
    let ru = obj.pointer("/spec/strategy/rollingUpdate");
    match str_at(obj, "/spec/strategy/type") {
        "Recreate" => {
            if ru.is_some_and(|r| !r.is_null()) {
                errs.push(FieldError::forbidden(
                    &spath.child("rollingUpdate"),
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => match ru.filter(|r| r.is_object()) {
            None => errs.push(FieldError::required(
                &spath.child("rollingUpdate"),
                "this should be defaulted and never be nil",
            )),
            Some(ru) => {
                let rpath = spath.child("rollingUpdate");
                let mu = ru.get("maxUnavailable");
                let ms = ru.get("maxSurge");
                validate_int_or_percent(&mut errs, mu, &rpath.child("maxUnavailable"));
                validate_int_or_percent(&mut errs, ms, &rpath.child("maxSurge"));
                let zero = |v: Option<&Value>| v.map(int_or_percent).unwrap_or(0) == 0;
                if zero(mu) && zero(ms) {
                    errs.push(FieldError::invalid(
                        &rpath.child("maxUnavailable"),
                        mu.cloned().unwrap_or(json!(0)),
                        "may not be 0 when `maxSurge` is 0",
                    ));
                }
                not_more_than_100_percent(&mut errs, mu, &rpath.child("maxUnavailable"));
            }
        },
        other => errs.push(FieldError::not_supported(
            &spath,
            other.to_owned(),
            &["Recreate", "RollingUpdate"],
        )),
    }
    nonneg(
        &mut errs,
        obj,
        "/spec/minReadySeconds",
        &spec.child("minReadySeconds"),
    );
    nonneg(
        &mut errs,
        obj,
        "/spec/revisionHistoryLimit",
        &spec.child("revisionHistoryLimit"),
    );
    if let Some(p) = int_at(obj, "/spec/progressDeadlineSeconds") {
        let path = spec.child("progressDeadlineSeconds");
        errs.extend(kumo_apimachinery::validation::validate_nonnegative_field(
            p, &path,
        ));
        if p <= int_at(obj, "/spec/minReadySeconds").unwrap_or(0) {
            errs.push(FieldError::invalid(
                &path,
                json!(p),
                "must be greater than minReadySeconds",
            ));
        }
    }
    errs
}

const DEPLOYMENT_STATUS: StatusRules = StatusRules {
    nonneg: &[
        "observedGeneration",
        "replicas",
        "updatedReplicas",
        "readyReplicas",
        "availableReplicas",
        "unavailableReplicas",
        "terminatingReplicas",
        "collisionCount",
    ],
    at_most_replicas: &["updatedReplicas", "readyReplicas", "availableReplicas"],
    available_over_ready: Some("cannot be greater than readyReplicas"),
    collision_count: true,
};

impl Strategy for Deployments {
    // Upstream's status strategy resets the spec and the labels; the rest of the
    // metadata goes through (the deployment controller writes the revision annotation
    // through /status).
    fn prepare_status_update(&self, new: &mut Value, old: &Value) {
        super::keep_old_metadata(new, old, &["labels"]);
    }

    fn validate_status_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        validate_status(new, old, &DEPLOYMENT_STATUS)
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_deployment(obj);
        obj["status"] = json!({});
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_deployment(new);
        keep_status(new, old);
        // Annotations are copied to the ReplicaSets, so they count as a change too.
        if annotations_changed(new, old) {
            bump_generation(new, old);
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_deployment(obj)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = validate_deployment(new);
        immutable(
            &mut errs,
            new,
            old,
            "/spec/selector",
            &Path::new("spec").child("selector"),
        );
        errs
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn scale(&self) -> Option<ScaleSpec> {
        Some(ScaleSpec::builtin(SelectorForm::LabelSelector))
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Ready", "string", "Number of the pod with ready state"),
            col(
                "Up-to-date",
                "string",
                "Replicas with the desired template.",
            ),
            col("Available", "string", "Replicas available to users."),
            Column::AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (names, images) = container_cells(obj, "/spec/template/spec");
        let selector = match label_selector(obj.pointer("/spec/selector")) {
            Some(s) => s.to_string(),
            None => "<invalid>".to_owned(),
        };
        vec![
            json!(name_of(obj)),
            json!(format!(
                "{}/{}",
                int_at(obj, "/status/readyReplicas").unwrap_or(0),
                int_at(obj, "/spec/replicas").unwrap_or(0)
            )),
            json!(int_at(obj, "/status/updatedReplicas").unwrap_or(0)),
            json!(int_at(obj, "/status/availableReplicas").unwrap_or(0)),
            json!(age_of(obj)),
            json!(names),
            json!(images),
            json!(selector),
        ]
    }
}

// ---------------------------------------------------------------------------------------
// ReplicaSets
// ---------------------------------------------------------------------------------------

struct ReplicaSets;

fn default_replica_set(obj: &mut Value) {
    default_field(object_at(obj, "/spec"), "replicas", json!(1));
    default_template(obj, "/spec/template");
}

fn validate_replica_set(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = Path::new("spec");
    nonneg(&mut errs, obj, "/spec/replicas", &spec.child("replicas"));
    nonneg(
        &mut errs,
        obj,
        "/spec/minReadySeconds",
        &spec.child("minReadySeconds"),
    );
    let sel = obj.pointer("/spec/selector");
    // (upstream says "deployment" here too)
    validate_selector(&mut errs, sel, &spec.child("selector"), Some("deployment"));
    let template = obj.pointer("/spec/template").unwrap_or(&Value::Null);
    let tpath = spec.child("template");
    validate_selector_matches(&mut errs, sel, template, &tpath);
    validate_long_running_template(&mut errs, template, &tpath, "ReplicaSet");
    errs
}

/// Columns of ReplicaSets and ReplicationControllers.
pub(super) fn replica_columns() -> Vec<Column> {
    vec![
        Column::NAME,
        col("Desired", "integer", "Desired number of replicas."),
        col(
            "Current",
            "integer",
            "Most recently observed number of replicas.",
        ),
        col("Ready", "integer", "Number of ready replicas."),
        Column::AGE,
        CONTAINERS,
        IMAGES,
        SELECTOR,
    ]
}

/// Cells of ReplicaSets and ReplicationControllers, with the selector already formatted.
pub(super) fn replica_cells(obj: &Value, selector: String) -> Vec<Value> {
    let (names, images) = container_cells(obj, "/spec/template/spec");
    vec![
        json!(name_of(obj)),
        json!(int_at(obj, "/spec/replicas").unwrap_or(0)),
        json!(int_at(obj, "/status/replicas").unwrap_or(0)),
        json!(int_at(obj, "/status/readyReplicas").unwrap_or(0)),
        json!(age_of(obj)),
        json!(names),
        json!(images),
        json!(selector),
    ]
}

const REPLICA_SET_STATUS: StatusRules = StatusRules {
    nonneg: &[
        "replicas",
        "fullyLabeledReplicas",
        "readyReplicas",
        "availableReplicas",
        "observedGeneration",
        "terminatingReplicas",
    ],
    at_most_replicas: &["fullyLabeledReplicas", "readyReplicas", "availableReplicas"],
    available_over_ready: Some("cannot be greater than readyReplicas"),
    collision_count: false,
};

impl Strategy for ReplicaSets {
    fn validate_status_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        validate_status(new, old, &REPLICA_SET_STATUS)
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_replica_set(obj);
        obj["status"] = json!({"replicas": 0});
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_replica_set(new);
        keep_status(new, old);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_replica_set(obj)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = validate_replica_set(new);
        immutable(
            &mut errs,
            new,
            old,
            "/spec/selector",
            &Path::new("spec").child("selector"),
        );
        errs
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn scale(&self) -> Option<ScaleSpec> {
        Some(ScaleSpec::builtin(SelectorForm::LabelSelector))
    }

    fn columns(&self) -> Vec<Column> {
        replica_columns()
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        replica_cells(obj, format_label_selector(obj.pointer("/spec/selector")))
    }
}

// ---------------------------------------------------------------------------------------
// StatefulSets
// ---------------------------------------------------------------------------------------

struct StatefulSets;

/// SetDefaults_StatefulSet (MaxUnavailableStatefulSet is on in v1.37).
fn default_stateful_set(obj: &mut Value) {
    let spec = object_at(obj, "/spec");
    default_field(spec, "podManagementPolicy", json!("OrderedReady"));
    let us = object_at(spec, "/updateStrategy");
    if str_at(us, "/type").is_empty() {
        us["type"] = json!("RollingUpdate");
        default_field(us, "rollingUpdate", json!({}));
    }
    if str_at(us, "/type") == "RollingUpdate" {
        if let Some(ru) = us.get_mut("rollingUpdate").filter(|r| r.is_object()) {
            default_field(ru, "partition", json!(0));
            default_field(ru, "maxUnavailable", json!(1));
        }
    }
    let policy = object_at(spec, "/persistentVolumeClaimRetentionPolicy");
    default_field(policy, "whenDeleted", json!("Retain"));
    default_field(policy, "whenScaled", json!("Retain"));
    default_field(spec, "replicas", json!(1));
    default_field(spec, "revisionHistoryLimit", json!(10));
    default_field(spec, "serviceName", json!(""));
    default_template(obj, "/spec/template");
}

fn validate_stateful_set(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = Path::new("spec");
    match str_at(obj, "/spec/podManagementPolicy") {
        "" => errs.push(FieldError::required(&spec.child("podManagementPolicy"), "")),
        "OrderedReady" | "Parallel" => {}
        other => errs.push(FieldError::invalid(
            &spec.child("podManagementPolicy"),
            other.to_owned(),
            "must be 'OrderedReady' or 'Parallel'",
        )),
    }
    let ru = obj
        .pointer("/spec/updateStrategy/rollingUpdate")
        .filter(|r| !r.is_null());
    let upath = spec.child("updateStrategy");
    match str_at(obj, "/spec/updateStrategy/type") {
        "" => errs.push(FieldError::required(&upath, "")),
        "OnDelete" => {
            if let Some(ru) = ru {
                errs.push(FieldError::invalid(
                    &upath.child("rollingUpdate"),
                    ru.clone(),
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
        }
        "RollingUpdate" => {
            if let Some(ru) = ru {
                let rpath = upath.child("rollingUpdate");
                nonneg(&mut errs, ru, "/partition", &rpath.child("partition"));
                let mu = ru.get("maxUnavailable");
                validate_int_or_percent(&mut errs, mu, &rpath.child("maxUnavailable"));
                if let Some(mu) = mu {
                    if int_or_percent(mu) == 0 {
                        errs.push(FieldError::invalid(
                            &rpath.child("maxUnavailable"),
                            mu.clone(),
                            "cannot be 0",
                        ));
                    }
                }
                not_more_than_100_percent(&mut errs, mu, &rpath.child("maxUnavailable"));
            }
        }
        _ => errs.push(FieldError::invalid(
            &upath,
            obj.pointer("/spec/updateStrategy")
                .cloned()
                .unwrap_or(Value::Null),
            "must be 'RollingUpdate' or 'OnDelete'",
        )),
    }
    let ppath = spec.child("persistentVolumeClaimRetentionPolicy");
    if let Some(p) = obj
        .pointer("/spec/persistentVolumeClaimRetentionPolicy")
        .filter(|p| p.is_object())
    {
        for field in ["whenDeleted", "whenScaled"] {
            let v = str_at(p, &format!("/{field}"));
            if !matches!(v, "Retain" | "Delete") {
                errs.push(FieldError::not_supported(
                    &ppath.child(field),
                    v.to_owned(),
                    &["Retain", "Delete"],
                ));
            }
        }
    }
    nonneg(&mut errs, obj, "/spec/replicas", &spec.child("replicas"));
    nonneg(
        &mut errs,
        obj,
        "/spec/minReadySeconds",
        &spec.child("minReadySeconds"),
    );
    let service = str_at(obj, "/spec/serviceName");
    if !service.is_empty() {
        for msg in kumo_apimachinery::validation::is_dns1123_label(service) {
            errs.push(FieldError::invalid(
                &spec.child("serviceName"),
                service.to_owned(),
                msg,
            ));
        }
    }
    let sel = obj.pointer("/spec/selector");
    validate_selector(&mut errs, sel, &spec.child("selector"), Some("statefulset"));
    let template = obj.pointer("/spec/template").unwrap_or(&Value::Null);
    let tpath = spec.child("template");
    validate_selector_matches(&mut errs, sel, template, &tpath);
    // The controller sets hostname and subdomain and adds the claim templates' volumes.
    let mut checked = template.clone();
    if let Some(s) = checked.get_mut("spec").and_then(Value::as_object_mut) {
        s.remove("hostname");
        s.remove("subdomain");
        let claims: Vec<Value> = obj
            .pointer("/spec/volumeClaimTemplates")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|c| json!({"name": str_at(c, "/metadata/name"), "persistentVolumeClaim": {"claimName": str_at(c, "/metadata/name")}}))
                    .collect()
            })
            .unwrap_or_default();
        if !claims.is_empty() {
            let vols = s.entry("volumes").or_insert_with(|| json!([]));
            if let Some(v) = vols.as_array_mut() {
                let names: Vec<String> = claims
                    .iter()
                    .map(|c| str_at(c, "/name").to_owned())
                    .collect();
                v.retain(|x| !names.iter().any(|n| n == str_at(x, "/name")));
                let mut all = claims;
                all.append(v);
                *v = all;
            }
        }
    }
    errs.extend(validate_pod_template(&checked, &tpath));
    let rp = str_at(template, "/spec/restartPolicy");
    if rp != "Always" {
        errs.push(FieldError::not_supported(
            &tpath.child("spec").child("restartPolicy"),
            rp.to_owned(),
            &["Always"],
        ));
    }
    if template.pointer("/spec/activeDeadlineSeconds").is_some() {
        errs.push(FieldError::forbidden(
            &tpath.child("spec").child("activeDeadlineSeconds"),
            "activeDeadlineSeconds in StatefulSet is not Supported",
        ));
    }
    errs
}

const STATEFUL_SET_STATUS: StatusRules = StatusRules {
    nonneg: &[
        "replicas",
        "readyReplicas",
        "currentReplicas",
        "updatedReplicas",
        "availableReplicas",
        "observedGeneration",
        "collisionCount",
    ],
    at_most_replicas: &[
        "readyReplicas",
        "currentReplicas",
        "updatedReplicas",
        "availableReplicas",
    ],
    available_over_ready: Some("cannot be greater than status.readyReplicas"),
    collision_count: true,
};

impl Strategy for StatefulSets {
    fn validate_status_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        validate_status(new, old, &STATEFUL_SET_STATUS)
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_stateful_set(obj);
        obj["status"] = json!({"replicas": 0, "availableReplicas": 0});
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_stateful_set(new);
        keep_status(new, old);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_stateful_set(obj)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = validate_stateful_set(new);
        let spec = Path::new("spec");
        for field in [
            "selector",
            "volumeClaimTemplates",
            "serviceName",
            "podManagementPolicy",
        ] {
            immutable(
                &mut errs,
                new,
                old,
                &format!("/spec/{field}"),
                &spec.child(field),
            );
        }
        errs
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn scale(&self) -> Option<ScaleSpec> {
        Some(ScaleSpec::builtin(SelectorForm::LabelSelector))
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Ready", "string", "Number of the pod with ready state"),
            Column::AGE,
            CONTAINERS,
            IMAGES,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (names, images) = container_cells(obj, "/spec/template/spec");
        vec![
            json!(name_of(obj)),
            json!(format!(
                "{}/{}",
                int_at(obj, "/status/readyReplicas").unwrap_or(0),
                int_at(obj, "/spec/replicas").unwrap_or(0)
            )),
            json!(age_of(obj)),
            json!(names),
            json!(images),
        ]
    }
}

// ---------------------------------------------------------------------------------------
// DaemonSets
// ---------------------------------------------------------------------------------------

struct DaemonSets;

/// Where apps/v1 keeps a DaemonSet's template generation.
const TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";

fn default_daemon_set(obj: &mut Value) {
    let spec = object_at(obj, "/spec");
    let us = object_at(spec, "/updateStrategy");
    default_field(us, "type", json!("RollingUpdate"));
    if str_at(us, "/type") == "RollingUpdate" {
        let ru = object_at(us, "/rollingUpdate");
        default_field(ru, "maxUnavailable", json!(1));
        default_field(ru, "maxSurge", json!(0));
    }
    default_field(spec, "revisionHistoryLimit", json!(10));
    default_template(obj, "/spec/template");
}

fn template_generation(obj: &Value) -> i64 {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(TEMPLATE_GENERATION))
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn set_template_generation(obj: &mut Value, g: i64) {
    object_at(obj, "/metadata/annotations")[TEMPLATE_GENERATION] = json!(g.to_string());
}

fn validate_daemon_set(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = Path::new("spec");
    let sel = obj.pointer("/spec/selector");
    if let Some(s) = sel.filter(|s| !s.is_null()) {
        if let Ok(api) = serde_json::from_value::<ApiLabelSelector>(s.clone()) {
            errs.extend(validate_label_selector(
                &api,
                LabelSelectorValidationOptions::default(),
                &spec.child("selector"),
            ));
        }
    }
    let template = obj.pointer("/spec/template").unwrap_or(&Value::Null);
    let tpath = spec.child("template");
    // A missing selector selects nothing, so no template matches it.
    if let Some(selector) = label_selector(sel) {
        let labels = template.pointer("/metadata/labels");
        if !selector.matches(&string_map(labels)) {
            errs.push(FieldError::invalid(
                &tpath.child("metadata").child("labels"),
                labels.cloned().unwrap_or(Value::Null),
                "`selector` does not match template `labels`",
            ));
        }
    }
    if let Some(s) = sel.filter(|s| s.is_object()) {
        let empty = |k: &str| {
            s.get(k)
                .and_then(Value::as_object)
                .is_none_or(|m| m.is_empty())
        };
        let no_exprs = s
            .get("matchExpressions")
            .and_then(Value::as_array)
            .is_none_or(|a| a.is_empty());
        if empty("matchLabels") && no_exprs {
            errs.push(FieldError::invalid(
                &spec.child("selector"),
                s.clone(),
                "empty selector is invalid for daemonset",
            ));
        }
    }
    validate_long_running_template(&mut errs, template, &tpath, "DaemonSet");
    nonneg(
        &mut errs,
        obj,
        "/spec/minReadySeconds",
        &spec.child("minReadySeconds"),
    );
    let upath = spec.child("updateStrategy");
    match str_at(obj, "/spec/updateStrategy/type") {
        "OnDelete" => {}
        "RollingUpdate" => match obj
            .pointer("/spec/updateStrategy/rollingUpdate")
            .filter(|r| r.is_object())
        {
            None => errs.push(FieldError::required(&upath.child("rollingUpdate"), "")),
            Some(ru) => {
                let rpath = upath.child("rollingUpdate");
                let mu = ru.get("maxUnavailable");
                let ms = ru.get("maxSurge");
                validate_int_or_percent(&mut errs, mu, &rpath.child("maxUnavailable"));
                validate_int_or_percent(&mut errs, ms, &rpath.child("maxSurge"));
                not_more_than_100_percent(&mut errs, mu, &rpath.child("maxUnavailable"));
                not_more_than_100_percent(&mut errs, ms, &rpath.child("maxSurge"));
                let has = |v: Option<&Value>| v.map(int_or_percent).unwrap_or(0) != 0;
                match (has(mu), has(ms)) {
                    (true, true) => errs.push(FieldError::invalid(
                        &rpath.child("maxSurge"),
                        ms.cloned().unwrap_or(Value::Null),
                        "may not be set when maxUnavailable is non-zero",
                    )),
                    (false, false) => errs.push(FieldError::required(
                        &rpath.child("maxUnavailable"),
                        "cannot be 0 when maxSurge is 0",
                    )),
                    _ => {}
                }
            }
        },
        other => errs.push(FieldError::not_supported(
            &upath,
            other.to_owned(),
            &["RollingUpdate", "OnDelete"],
        )),
    }
    nonneg(
        &mut errs,
        obj,
        "/spec/revisionHistoryLimit",
        &spec.child("revisionHistoryLimit"),
    );
    errs
}

const DAEMON_SET_STATUS: StatusRules = StatusRules {
    nonneg: &[
        "currentNumberScheduled",
        "numberMisscheduled",
        "desiredNumberScheduled",
        "numberReady",
        "observedGeneration",
        "updatedNumberScheduled",
        "numberAvailable",
        "numberUnavailable",
        "collisionCount",
    ],
    at_most_replicas: &[],
    available_over_ready: None,
    collision_count: true,
};

impl Strategy for DaemonSets {
    fn validate_status_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        validate_status(new, old, &DAEMON_SET_STATUS)
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_daemon_set(obj);
        let g = template_generation(obj).max(1);
        set_template_generation(obj, g);
        obj["status"] = json!({
            "currentNumberScheduled": 0,
            "numberMisscheduled": 0,
            "desiredNumberScheduled": 0,
            "numberReady": 0,
        });
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_daemon_set(new);
        keep_status(new, old);
        // The template generation counts template changes.
        let mut g = template_generation(old);
        if new.pointer("/spec/template") != old.pointer("/spec/template") {
            g += 1;
        }
        set_template_generation(new, g);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_daemon_set(obj)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        immutable(
            &mut errs,
            new,
            old,
            "/spec/selector",
            &Path::new("spec").child("selector"),
        );
        errs.extend(validate_daemon_set(new));
        errs
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "Desired",
                "integer",
                "Nodes that should run the daemon pod.",
            ),
            col(
                "Current",
                "integer",
                "Nodes running at least one daemon pod.",
            ),
            col("Ready", "integer", "Nodes with a ready daemon pod."),
            col(
                "Up-to-date",
                "integer",
                "Nodes running the updated daemon pod.",
            ),
            col(
                "Available",
                "integer",
                "Nodes with an available daemon pod.",
            ),
            col(
                "Node Selector",
                "string",
                "The pod template's node selector.",
            ),
            Column::AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (names, images) = container_cells(obj, "/spec/template/spec");
        let n = |p: &str| json!(int_at(obj, p).unwrap_or(0));
        vec![
            json!(name_of(obj)),
            n("/status/desiredNumberScheduled"),
            n("/status/currentNumberScheduled"),
            n("/status/numberReady"),
            n("/status/updatedNumberScheduled"),
            n("/status/numberAvailable"),
            json!(format_labels(
                obj.pointer("/spec/template/spec/nodeSelector")
            )),
            json!(age_of(obj)),
            json!(names),
            json!(images),
            json!(format_label_selector(obj.pointer("/spec/selector"))),
        ]
    }
}

// ---------------------------------------------------------------------------------------
// ControllerRevisions
// ---------------------------------------------------------------------------------------

struct ControllerRevisions;

impl Strategy for ControllerRevisions {
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        match obj.get("data") {
            None | Some(Value::Null) => errs.push(FieldError::required(
                &Path::new("data"),
                "data is mandatory",
            )),
            Some(Value::Object(_)) => {}
            Some(_) => errs.push(FieldError::required(
                &Path::new("data"),
                "data must be a valid JSON object",
            )),
        }
        nonneg(&mut errs, obj, "/revision", &Path::new("revision"));
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        immutable(&mut errs, new, old, "/data", &Path::new("data"));
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Controller", "string", "Controller of the object"),
            col("Revision", "string", "Revision of the state."),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(controller_of(obj)),
            json!(int_at(obj, "/revision").unwrap_or(0)),
            json!(age_of(obj)),
        ]
    }
}

/// `kind.group/name` of the owner reference marked as controller (`<none>` without one).
fn controller_of(obj: &Value) -> String {
    let refs = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let Some(r) = refs
        .iter()
        .find(|r| r.get("controller") == Some(&json!(true)))
    else {
        return "<none>".to_owned();
    };
    let group = str_at(r, "/apiVersion")
        .rsplit_once('/')
        .map(|(g, _)| g)
        .unwrap_or("");
    let kind = str_at(r, "/kind");
    let name = str_at(r, "/name");
    if kind.is_empty() && group.is_empty() {
        return name.to_owned();
    }
    let gk = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    format!("{}/{name}", gk.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_or_percent_values() {
        assert_eq!(int_or_percent(&json!("25%")), 25);
        assert_eq!(int_or_percent(&json!(3)), 3);
        assert_eq!(int_or_percent(&json!("abc")), 0);
    }

    #[test]
    fn deployment_defaults() {
        let mut d = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}});
        default_deployment(&mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert!(d["spec"]["template"]["spec"]
            .get("enableServiceLinks")
            .is_none());
    }

    #[test]
    fn controller_names() {
        let cr = json!({"metadata": {"ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "controller": true}
        ]}});
        assert_eq!(controller_of(&cr), "statefulset.apps/web");
        assert_eq!(controller_of(&json!({})), "<none>");
    }
}
