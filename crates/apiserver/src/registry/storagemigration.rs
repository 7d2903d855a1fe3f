//! storagemigration.k8s.io/v1 StorageVersionMigrations, with their `status` subresource,
//! validated as upstream's registry does. No migrator runs: a migration's status is what
//! clients write to it.

use kumo_apimachinery::validation::{is_dns1035_label, is_dns1123_subdomain, FieldError, Path};
use serde_json::Value;

use super::apps::immutable;
use super::podcertificates::validate_metav1_conditions;
use super::printing::{col, keep_field, keep_status};
use super::{name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![Resource {
        group: "storagemigration.k8s.io",
        version: "v1",
        kind: "StorageVersionMigration",
        plural: "storageversionmigrations",
        singular: "storageversionmigration",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &["status"],
        strategy: Box::new(Migrations),
    }]
}

struct Migrations;

/// Whether condition `type_` is True.
fn condition_true(obj: &Value, type_: &str) -> bool {
    conditions(obj)
        .iter()
        .any(|c| str_at(c, "/type") == type_ && str_at(c, "/status") == "True")
}

fn conditions(obj: &Value) -> Vec<Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

impl Strategy for Migrations {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    // The status starts empty; Go's struct field still shows as `"status": {}`, which a
    // JSON patch adding `/status/conditions` relies on.
    fn prepare_create(&self, obj: &mut Value) {
        if let Some(o) = obj.as_object_mut() {
            o.insert("status".into(), Value::Object(Default::default()));
        }
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        keep_status(new, old);
    }

    fn prepare_status_update(&self, new: &mut Value, old: &Value) {
        keep_field(new, old, "spec");
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let res = Path::new("spec").child("resource");
        match str_at(obj, "/spec/resource/resource") {
            "" => errs.push(FieldError::required(
                &res.child("resource"),
                "resource is required to be set",
            )),
            r => {
                let why = is_dns1035_label(r);
                if !why.is_empty() {
                    errs.push(FieldError::invalid(
                        &res.child("resource"),
                        r,
                        why.join(","),
                    ));
                }
            }
        }
        let group = str_at(obj, "/spec/resource/group");
        if !group.is_empty() {
            let why = is_dns1123_subdomain(group);
            if !why.is_empty() {
                errs.push(FieldError::invalid(
                    &res.child("group"),
                    group,
                    why.join(","),
                ));
            }
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        immutable(&mut errs, new, old, "/spec", &Path::new("spec"));
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Resource", "string", "GroupResource to migrate"),
            col("Status", "string", "Status of the migration"),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (group, resource) = (
            str_at(obj, "/spec/resource/group"),
            str_at(obj, "/spec/resource/resource"),
        );
        let gr = if group.is_empty() {
            resource.to_owned()
        } else {
            format!("{resource}.{group}")
        };
        // The last True condition among Running, Failed and Succeeded.
        let status = conditions(obj)
            .iter()
            .filter(|c| str_at(c, "/status") == "True")
            .map(|c| str_at(c, "/type"))
            .rfind(|t| matches!(*t, "Running" | "Failed" | "Succeeded"))
            .unwrap_or("Unknown")
            .to_owned();
        vec![name_of(obj).into(), gr.into(), status.into()]
    }

    fn validate_status_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let status = Path::new("status");
        validate_metav1_conditions(&conditions(new), &status.child("conditions"), &mut errs);
        let (rv_new, rv_old) = (
            str_at(new, "/status/resourceVersion"),
            str_at(old, "/status/resourceVersion"),
        );
        if !rv_new.is_empty() && rv_new.parse::<u64>().map_or(true, |v| v == 0) {
            errs.push(FieldError::invalid(
                &status.child("resourceVersion"),
                rv_new,
                format!("unable to compare resource versions, {rv_new} is not equal to {rv_new}"),
            ));
        }
        if !rv_old.is_empty() && rv_old != rv_new {
            errs.push(FieldError::invalid(
                &status.child("resourceVersion"),
                rv_new,
                "field is immutable",
            ));
        }
        let conds = || Value::Array(conditions(new));
        let (ok, failed) = (
            condition_true(new, "Succeeded"),
            condition_true(new, "Failed"),
        );
        if ok && failed {
            errs.push(FieldError::invalid(
                &status.child("conditions"),
                conds(),
                "Both success and failed conditions cannot be true at the same time",
            ));
        }
        if condition_true(old, "Succeeded") && !ok {
            errs.push(FieldError::invalid(
                &status.child("conditions"),
                conds(),
                "Success condition cannot be set to false once it is true",
            ));
        }
        if condition_true(old, "Failed") && !failed {
            errs.push(FieldError::invalid(
                &status.child("conditions"),
                conds(),
                "Failed condition cannot be set to false once it is true",
            ));
        }
        errs
    }
}
