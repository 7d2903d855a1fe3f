//! core/v1 ReplicationControllers (with `scale`) and PodTemplates.

use kumo_apimachinery::selector::LabelSelector;
use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Value};

use super::apps::{
    col, container_cells, default_template, format_labels, int_at, keep_status, nonneg, object_at,
    replica_cells, replica_columns, string_map, validate_long_running_template, validate_status,
    StatusRules,
};
use super::pods::validate_pod_template;
use super::{default_field, name_of, Column, Resource, ScaleSpec, SelectorForm, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource {
            group: "",
            version: "v1",
            kind: "ReplicationController",
            plural: "replicationcontrollers",
            singular: "replicationcontroller",
            namespaced: true,
            short_names: &["rc"],
            categories: &["all"],
            subresources: &["status", "scale"],
            strategy: Box::new(ReplicationControllers),
        },
        Resource {
            group: "",
            version: "v1",
            kind: "PodTemplate",
            plural: "podtemplates",
            singular: "podtemplate",
            namespaced: true,
            short_names: &[],
            categories: &[],
            subresources: &[],
            strategy: Box::new(PodTemplates),
        },
    ]
}

struct ReplicationControllers;

/// SetDefaults_ReplicationController: the template's labels are the selector and the
/// labels when those are empty; one replica.
fn default_rc(obj: &mut Value) {
    let labels = obj
        .pointer("/spec/template/metadata/labels")
        .filter(|l| l.is_object())
        .cloned();
    if let Some(labels) = labels {
        let empty = |v: Option<&Value>| v.and_then(Value::as_object).is_none_or(|m| m.is_empty());
        if empty(obj.pointer("/spec/selector")) {
            object_at(obj, "/spec")["selector"] = labels.clone();
        }
        if empty(obj.pointer("/metadata/labels")) {
            object_at(obj, "/metadata")["labels"] = labels;
        }
    }
    default_field(object_at(obj, "/spec"), "replicas", json!(1));
    if obj.pointer("/spec/template").is_some_and(Value::is_object) {
        default_template(obj, "/spec/template");
    }
}

fn validate_rc(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = Path::new("spec");
    nonneg(
        &mut errs,
        obj,
        "/spec/minReadySeconds",
        &spec.child("minReadySeconds"),
    );
    let selector = string_map(obj.pointer("/spec/selector"));
    if selector.is_empty() {
        errs.push(FieldError::required(&spec.child("selector"), ""));
    }
    match obj.pointer("/spec/replicas").filter(|r| !r.is_null()) {
        None => errs.push(FieldError::required(&spec.child("replicas"), "")),
        Some(_) => nonneg(&mut errs, obj, "/spec/replicas", &spec.child("replicas")),
    }
    let tpath = spec.child("template");
    match obj.pointer("/spec/template").filter(|t| !t.is_null()) {
        None => errs.push(FieldError::required(&tpath, "")),
        Some(template) => {
            let labels = template.pointer("/metadata/labels");
            if !selector.is_empty()
                && !LabelSelector::from_set(&selector).matches(&string_map(labels))
            {
                errs.push(FieldError::invalid(
                    &tpath.child("metadata").child("labels"),
                    labels.cloned().unwrap_or(Value::Null),
                    "`selector` does not match template `labels`",
                ));
            }
            validate_long_running_template(&mut errs, template, &tpath, "ReplicationController");
        }
    }
    errs
}

const RC_STATUS: StatusRules = StatusRules {
    nonneg: &[
        "replicas",
        "fullyLabeledReplicas",
        "readyReplicas",
        "availableReplicas",
        "observedGeneration",
    ],
    at_most_replicas: &["fullyLabeledReplicas", "readyReplicas", "availableReplicas"],
    available_over_ready: Some("cannot be greater than readyReplicas"),
    collision_count: false,
};

impl Strategy for ReplicationControllers {
    fn default_gc_policy(&self) -> super::GcPolicy {
        super::GcPolicy::OrphanDependents
    }
    fn validate_status_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        validate_status(new, old, &RC_STATUS)
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        // (apps/v1 ReplicaSets have no such field selector.)
        let n = int_at(obj, "/status/replicas").unwrap_or(0);
        vec![("status.replicas", n.to_string())]
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_rc(obj);
        obj["status"] = json!({"replicas": 0});
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_rc(new);
        keep_status(new, old);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_rc(obj)
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn scale(&self) -> Option<ScaleSpec> {
        Some(ScaleSpec::builtin(SelectorForm::Map))
    }

    fn columns(&self) -> Vec<Column> {
        replica_columns()
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        replica_cells(obj, format_labels(obj.pointer("/spec/selector")))
    }
}

struct PodTemplates;

impl Strategy for PodTemplates {
    fn prepare_create(&self, obj: &mut Value) {
        default_template(obj, "/template");
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        default_template(new, "/template");
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_pod_template(
            obj.get("template").unwrap_or(&Value::Null),
            &Path::new("template"),
        )
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "Containers",
                "string",
                "Names of each container in the template.",
            ),
            col(
                "Images",
                "string",
                "Images referenced by each container in the template.",
            ),
            col("Pod Labels", "string", "The labels for the pod template."),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (names, images) = container_cells(obj, "/template/spec");
        vec![
            json!(name_of(obj)),
            json!(names),
            json!(images),
            json!(format_labels(obj.pointer("/template/metadata/labels"))),
        ]
    }
}
