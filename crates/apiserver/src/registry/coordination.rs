//! coordination.k8s.io/v1 Leases.

use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Value};

use super::{age_of, default_field, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![Resource {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        plural: "leases",
        singular: "lease",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &[],
        strategy: Box::new(Leases),
    }]
}

struct Leases;

impl Strategy for Leases {
    fn prepare_create(&self, obj: &mut Value) {
        default_field(obj, "spec", json!({}));
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        default_field(new, "spec", json!({}));
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        if let Some(d) = obj
            .pointer("/spec/leaseDurationSeconds")
            .and_then(Value::as_i64)
        {
            if d <= 0 {
                errs.push(FieldError::invalid(
                    &spec.child("leaseDurationSeconds"),
                    json!(d),
                    "must be greater than 0",
                ));
            }
        }
        if let Some(t) = obj
            .pointer("/spec/leaseTransitions")
            .and_then(Value::as_i64)
        {
            if t < 0 {
                errs.push(FieldError::invalid(
                    &spec.child("leaseTransitions"),
                    json!(t),
                    "must be greater than or equal to 0",
                ));
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            Column {
                name: "Holder",
                type_: "string",
                format: "",
                description: "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.",
                priority: 0,
            },
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/holderIdentity")),
            json!(age_of(obj)),
        ]
    }
}
