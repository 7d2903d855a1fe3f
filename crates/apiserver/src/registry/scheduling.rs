//! scheduling.k8s.io/v1 PriorityClasses, with the two system classes kube-apiserver creates
//! at start.

use kumo_apimachinery::status::{ApiError, GroupResource};
use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Value};

use super::printing::col;
use super::{age_of, default_field, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![Resource {
        group: "scheduling.k8s.io",
        version: "v1",
        kind: "PriorityClass",
        plural: "priorityclasses",
        singular: "priorityclass",
        namespaced: false,
        short_names: &["pc"],
        categories: &[],
        subresources: &[],
        strategy: Box::new(PriorityClasses),
    }]
}

/// The highest value a user-defined class may have.
const HIGHEST_USER_DEFINABLE_PRIORITY: i64 = 1_000_000_000;

/// The system classes: name, value, description (as kube-apiserver creates them).
const SYSTEM_CLASSES: [(&str, i64, &str); 2] = [
    (
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
];

const PREEMPTION_POLICIES: [&str; 2] = ["PreemptLowerPriority", "Never"];

struct PriorityClasses;

impl Strategy for PriorityClasses {
    fn prepare_create(&self, obj: &mut Value) {
        default_field(obj, "preemptionPolicy", json!("PreemptLowerPriority"));
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        default_field(new, "preemptionPolicy", json!("PreemptLowerPriority"));
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn admission_lists(&self, obj: &Value) -> Vec<(&'static str, String)> {
        if obj.get("globalDefault") == Some(&json!(true)) {
            vec![("priorityclasses", "/registry/priorityclasses/".to_owned())]
        } else {
            Vec::new()
        }
    }

    fn admit_create(
        &self,
        obj: &mut Value,
        found: &[(&'static str, Value)],
    ) -> Result<(), ApiError> {
        // Priority admission: one global default at most.
        let classes = found
            .iter()
            .filter(|(w, _)| *w == "priorityclasses")
            .flat_map(|(_, v)| v.as_array().into_iter().flatten());
        for c in classes {
            if c.get("globalDefault") == Some(&json!(true)) {
                return Err(ApiError::forbidden(
                    &GroupResource::new("scheduling.k8s.io", "priorityclasses"),
                    name_of(obj),
                    &format!(
                        "PriorityClass {} is already marked as default. Only one default can exist",
                        name_of(c)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let name = name_of(obj);
        let value = obj.get("value").and_then(Value::as_i64).unwrap_or(0);
        if name.starts_with("system-") {
            let known = SYSTEM_CLASSES.iter().find(|(n, _, _)| *n == name);
            let problem = match known {
                None => Some(format!("{name} is not a known system priority class")),
                Some((_, v, _)) if *v != value => {
                    Some(format!("value of {name} PriorityClass must be {v}"))
                }
                Some(_) => None,
            };
            if let Some(p) = problem {
                errs.push(FieldError::forbidden(
                    &Path::new("metadata").child("name"),
                    format!("priority class names with 'system-' prefix are reserved for system use only. error: {p}"),
                ));
            }
        } else if value > HIGHEST_USER_DEFINABLE_PRIORITY {
            errs.push(FieldError::forbidden(
                &Path::new("value"),
                format!("maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE_PRIORITY}"),
            ));
        }
        let policy = str_at(obj, "/preemptionPolicy");
        if !PREEMPTION_POLICIES.contains(&policy) {
            errs.push(FieldError::not_supported(
                &Path::new("preemptionPolicy"),
                policy,
                &PREEMPTION_POLICIES,
            ));
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        if new.get("value") != old.get("value") {
            errs.push(FieldError::forbidden(
                &Path::new("value"),
                "may not be changed in an update.",
            ));
        }
        if new.get("preemptionPolicy") != old.get("preemptionPolicy") {
            errs.push(FieldError::invalid(
                &Path::new("preemptionPolicy"),
                str_at(new, "/preemptionPolicy"),
                "field is immutable",
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Value", "integer", "The priority of pods of this class."),
            col(
                "Global-Default",
                "boolean",
                "Whether pods without a class get this one.",
            ),
            Column::AGE,
            col(
                "PreemptionPolicy",
                "string",
                "Whether pods of this class preempt lower ones.",
            ),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(obj.get("value").and_then(Value::as_i64).unwrap_or(0)),
            json!(obj
                .get("globalDefault")
                .and_then(Value::as_bool)
                .unwrap_or(false)),
            json!(age_of(obj)),
            json!(str_at(obj, "/preemptionPolicy")),
        ]
    }
}

/// The PriorityClasses kube-apiserver creates at start.
pub(super) fn bootstrap_objects() -> Vec<(&'static str, Value)> {
    SYSTEM_CLASSES
        .iter()
        .map(|(name, value, description)| {
            (
                "priorityclasses",
                json!({
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                    "description": description,
                    "preemptionPolicy": "PreemptLowerPriority",
                }),
            )
        })
        .collect()
}
