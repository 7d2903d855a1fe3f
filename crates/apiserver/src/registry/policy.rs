//! policy/v1 PodDisruptionBudgets.

use kumo_apimachinery::selector::ApiLabelSelector;
use kumo_apimachinery::validation::{
    is_valid_percent, validate_label_selector, FieldError, LabelSelectorValidationOptions, Path,
};
use serde_json::{json, Value};

use super::printing::{col, int_or_string, keep_status, set};
use super::{age_of, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![Resource {
        group: "policy",
        version: "v1",
        kind: "PodDisruptionBudget",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        namespaced: true,
        short_names: &["pdb"],
        categories: &[],
        subresources: &["status"],
        strategy: Box::new(PodDisruptionBudgets),
    }]
}

struct PodDisruptionBudgets;

/// Upstream's ValidatePositiveIntOrPercent and IsValidPercent (at most 100%).
fn validate_int_or_percent(v: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    match v {
        Value::Number(n) if n.as_i64().is_some_and(|i| i < 0) => {
            errs.push(FieldError::invalid(
                path,
                n.as_i64().unwrap_or(0),
                "must be greater than or equal to 0",
            ));
        }
        Value::String(s) => {
            let msgs = is_valid_percent(s);
            if msgs.is_empty() {
                let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
                if pct > 100 {
                    errs.push(FieldError::invalid(
                        path,
                        s.as_str(),
                        "must not be greater than 100%",
                    ));
                }
            }
            for msg in msgs {
                errs.push(FieldError::invalid(path, s.as_str(), msg));
            }
        }
        _ => {}
    }
}

impl Strategy for PodDisruptionBudgets {
    fn prepare_create(&self, obj: &mut Value) {
        set(
            obj,
            "status",
            json!({"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0}),
        );
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        keep_status(new, old);
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        let min = obj.pointer("/spec/minAvailable").filter(|v| !v.is_null());
        let max = obj.pointer("/spec/maxUnavailable").filter(|v| !v.is_null());
        if let (Some(mn), Some(mx)) = (min, max) {
            // Upstream shows the internal spec struct (Go field names).
            let value = json!({
                "MinAvailable": mn,
                "Selector": obj.pointer("/spec/selector").cloned().unwrap_or(Value::Null),
                "MaxUnavailable": mx,
                "UnhealthyPodEvictionPolicy": obj.pointer("/spec/unhealthyPodEvictionPolicy").cloned().unwrap_or(Value::Null),
            });
            errs.push(FieldError::invalid(
                &spec,
                value,
                "minAvailable and maxUnavailable cannot be both set",
            ));
        }
        if let Some(v) = min {
            validate_int_or_percent(v, &spec.child("minAvailable"), &mut errs);
        }
        if let Some(v) = max {
            validate_int_or_percent(v, &spec.child("maxUnavailable"), &mut errs);
        }
        if let Some(sel) = obj.pointer("/spec/selector").filter(|s| !s.is_null()) {
            if let Ok(sel) = serde_json::from_value::<ApiLabelSelector>(sel.clone()) {
                errs.extend(validate_label_selector(
                    &sel,
                    LabelSelectorValidationOptions::default(),
                    &spec.child("selector"),
                ));
            }
        }
        let policy = str_at(obj, "/spec/unhealthyPodEvictionPolicy");
        if !policy.is_empty() && !matches!(policy, "IfHealthyBudget" | "AlwaysAllow") {
            errs.push(FieldError::not_supported(
                &spec.child("unhealthyPodEvictionPolicy"),
                policy,
                &["AlwaysAllow", "IfHealthyBudget"],
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "Min Available",
                "string",
                "The minimum number of pods that must be available.",
            ),
            col(
                "Max Unavailable",
                "string",
                "The maximum number of pods that may be unavailable.",
            ),
            col(
                "Allowed Disruptions",
                "integer",
                "Calculated number of pods that may be disrupted at this time.",
            ),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let or_na = |p: &str| match int_or_string(obj.pointer(p)) {
            s if s.is_empty() => "N/A".to_owned(),
            s => s,
        };
        vec![
            json!(name_of(obj)),
            json!(or_na("/spec/minAvailable")),
            json!(or_na("/spec/maxUnavailable")),
            json!(obj
                .pointer("/status/disruptionsAllowed")
                .and_then(Value::as_i64)
                .unwrap_or(0)),
            json!(age_of(obj)),
        ]
    }
}
