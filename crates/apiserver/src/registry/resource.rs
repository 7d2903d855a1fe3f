//! resource.k8s.io/v1 (dynamic resource allocation: DeviceClasses, ResourceClaims and their
//! templates, ResourceSlices, DeviceTaintRules): served so that clients which watch them
//! (kube-scheduler's DRA plugin, kube-controller-manager) work, with upstream's printing, immutability and
//! the structural rules of their validation (CEL selectors are stored, not evaluated).

use kumo_apimachinery::validation::{
    is_dns1123_subdomain, is_qualified_name, is_valid_label_value, FieldError, Path,
};
use serde_json::{json, Value};

use super::apps::immutable;
use super::printing::{col, keep_status, set};
use super::{age_of, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    let r =
        |kind, plural, singular, namespaced, subresources: &'static [&'static str], strategy| {
            Resource {
                group: "resource.k8s.io",
                version: "v1",
                kind,
                plural,
                singular,
                namespaced,
                short_names: &[],
                categories: &[],
                subresources,
                strategy,
            }
        };
    vec![
        r(
            "DeviceClass",
            "deviceclasses",
            "deviceclass",
            false,
            &[],
            Box::new(DeviceClasses),
        ),
        r(
            "DeviceTaintRule",
            "devicetaintrules",
            "devicetaintrule",
            false,
            &["status"],
            Box::new(DeviceTaintRules),
        ),
        r(
            "ResourceClaim",
            "resourceclaims",
            "resourceclaim",
            true,
            &["status"],
            Box::new(ResourceClaims),
        ),
        r(
            "ResourceClaimTemplate",
            "resourceclaimtemplates",
            "resourceclaimtemplate",
            true,
            &[],
            Box::new(ResourceClaimTemplates),
        ),
        r(
            "ResourceSlice",
            "resourceslices",
            "resourceslice",
            false,
            &[],
            Box::new(ResourceSlices),
        ),
    ]
}

/// Upstream validates driver names as CSI driver names: required, at most 63 bytes, a
/// DNS-1123 subdomain once lowercased.
fn validate_driver_name(name: &str, path: &Path) -> Vec<FieldError> {
    if name.is_empty() {
        return vec![FieldError::required(path, "")];
    }
    let mut errs = Vec::new();
    if name.len() > 63 {
        errs.push(FieldError::too_long(path, 63));
    }
    for msg in is_dns1123_subdomain(&name.to_lowercase()) {
        errs.push(FieldError::invalid(path, name, msg));
    }
    errs
}

/// A pool name: required, at most 253 bytes, DNS-1123 subdomains separated by `/`.
fn validate_pool_name(name: &str, path: &Path) -> Vec<FieldError> {
    if name.is_empty() {
        return vec![FieldError::required(path, "")];
    }
    let mut errs = Vec::new();
    if name.len() > 253 {
        errs.push(FieldError::too_long(path, 253));
    }
    for part in name.split('/') {
        for msg in is_dns1123_subdomain(part) {
            errs.push(FieldError::invalid(path, part, msg));
        }
    }
    errs
}

struct DeviceClasses;

impl Strategy for DeviceClasses {
    fn tracks_generation(&self) -> bool {
        true
    }
}

struct ResourceClaims;

/// `pending`, `allocated,reserved`, `deleted`: upstream's summary of a claim.
fn claim_state(obj: &Value) -> String {
    let deleted = obj.pointer("/metadata/deletionTimestamp").is_some();
    let allocated = obj
        .pointer("/status/allocation")
        .is_some_and(|a| !a.is_null());
    let reserved = obj
        .pointer("/status/reservedFor")
        .and_then(Value::as_array)
        .is_some_and(|r| !r.is_empty());
    let mut states = Vec::new();
    if deleted {
        states.push("deleted");
    }
    if allocated {
        states.push("allocated");
        if reserved {
            states.push("reserved");
        }
    } else if !deleted {
        states.push("pending");
    }
    states.join(",")
}

/// Request names of a claim spec: required DNS labels, unique.
fn validate_claim_spec(spec: Option<&Value>, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let requests = spec
        .and_then(|s| s.pointer("/devices/requests"))
        .and_then(Value::as_array);
    let mut seen = std::collections::BTreeSet::new();
    for (i, req) in requests.into_iter().flatten().enumerate() {
        let p = path.child("devices").child("requests").index(i);
        let name = str_at(req, "/name");
        if name.is_empty() {
            errs.push(FieldError::required(&p.child("name"), ""));
        } else {
            for msg in kumo_apimachinery::validation::is_dns1123_label(name) {
                errs.push(FieldError::invalid(&p.child("name"), name, msg));
            }
            if !seen.insert(name.to_owned()) {
                errs.push(FieldError::duplicate(&p.child("name"), name));
            }
        }
        let exactly = req.get("exactly").is_some_and(|v| !v.is_null());
        let first = req.get("firstAvailable").is_some_and(|v| !v.is_null());
        match (exactly, first) {
            (false, false) => errs.push(FieldError::required(
                &p,
                "exactly one of `exactly` or `firstAvailable` is required",
            )),
            (true, true) => errs.push(FieldError::invalid(
                &p,
                "{`exactly`, `firstAvailable`}",
                "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set",
            )),
            (true, false) => {
                if str_at(req, "/exactly/deviceClassName").is_empty() {
                    errs.push(FieldError::required(
                        &p.child("exactly").child("deviceClassName"),
                        "",
                    ));
                }
            }
            (false, true) => {}
        }
    }
    errs
}

impl Strategy for ResourceClaims {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    fn prepare_create(&self, obj: &mut Value) {
        set(obj, "status", json!({}));
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        keep_status(new, old);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_claim_spec(obj.get("spec"), &Path::new("spec"))
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        // The spec is immutable; only that is checked on update, as upstream.
        let mut errs = Vec::new();
        immutable(&mut errs, new, old, "/spec", &Path::new("spec"));
        errs
    }

    fn validate_status_update(&self, _new: &Value, _old: &Value) -> Vec<FieldError> {
        Vec::new()
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "State",
                "string",
                "A summary of the current state (allocated, pending, reserved, etc.).",
            ),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(claim_state(obj)),
            json!(age_of(obj)),
        ]
    }
}

struct ResourceClaimTemplates;

impl Strategy for ResourceClaimTemplates {
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_claim_spec(obj.pointer("/spec/spec"), &Path::new("spec").child("spec"))
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        immutable(&mut errs, new, old, "/spec", &Path::new("spec"));
        errs
    }
}

struct ResourceSlices;

impl Strategy for ResourceSlices {
    fn tracks_generation(&self) -> bool {
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        self.validate_spec(obj, None)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        self.validate_spec(new, Some(old))
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Node", "string", ""),
            col("Driver", "string", ""),
            col("Pool", "string", ""),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/nodeName")),
            json!(str_at(obj, "/spec/driver")),
            json!(str_at(obj, "/spec/pool/name")),
            json!(age_of(obj)),
        ]
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        vec![
            ("spec.nodeName", str_at(obj, "/spec/nodeName").to_owned()),
            ("spec.driver", str_at(obj, "/spec/driver").to_owned()),
        ]
    }
}

impl ResourceSlices {
    fn validate_spec(&self, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let spec = Path::new("spec");
        let mut errs = validate_driver_name(str_at(obj, "/spec/driver"), &spec.child("driver"));
        let pool = spec.child("pool");
        errs.extend(validate_pool_name(
            str_at(obj, "/spec/pool/name"),
            &pool.child("name"),
        ));
        let count = obj
            .pointer("/spec/pool/resourceSliceCount")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if count <= 0 {
            errs.push(FieldError::invalid(
                &pool.child("resourceSliceCount"),
                count,
                "must be greater than zero",
            ));
        }
        let generation = obj
            .pointer("/spec/pool/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if generation < 0 {
            errs.push(FieldError::invalid(
                &pool.child("generation"),
                generation,
                "must be greater than or equal to zero",
            ));
        }
        if let Some(old) = old {
            immutable(&mut errs, obj, old, "/spec/pool/name", &pool.child("name"));
            immutable(&mut errs, obj, old, "/spec/driver", &spec.child("driver"));
            immutable(
                &mut errs,
                obj,
                old,
                "/spec/nodeName",
                &spec.child("nodeName"),
            );
        }
        let mut set_fields = Vec::new();
        if let Some(n) = obj.pointer("/spec/nodeName").and_then(Value::as_str) {
            if n.is_empty() {
                errs.push(FieldError::invalid(
                    &spec.child("nodeName"),
                    n,
                    "must be either unset or set to a non-empty string",
                ));
            } else {
                set_fields.push("`nodeName`");
            }
        }
        if obj
            .pointer("/spec/nodeSelector")
            .is_some_and(|v| !v.is_null())
        {
            set_fields.push("`nodeSelector`");
            let terms = obj
                .pointer("/spec/nodeSelector/nodeSelectorTerms")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            if terms != 1 {
                errs.push(FieldError::invalid(
                    &spec.child("nodeSelector").child("nodeSelectorTerms"),
                    obj.pointer("/spec/nodeSelector/nodeSelectorTerms")
                        .cloned()
                        .unwrap_or(Value::Null),
                    "must have exactly one node selector term",
                ));
            }
        }
        for (field, name) in [
            ("allNodes", "`allNodes`"),
            ("perDeviceNodeSelection", "`perDeviceNodeSelection`"),
        ] {
            match obj
                .pointer(&format!("/spec/{field}"))
                .and_then(Value::as_bool)
            {
                Some(true) => set_fields.push(name),
                Some(false) => errs.push(FieldError::invalid(
                    &spec.child(field),
                    false,
                    "must be either unset or set to true",
                )),
                None => {}
            }
        }
        const ONE_OF: &str =
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required";
        match set_fields.len() {
            0 => errs.push(FieldError::required(&spec, ONE_OF)),
            1 => {}
            _ => errs.push(FieldError::invalid(
                &spec,
                format!("{{{}}}", set_fields.join(", ")),
                format!("{ONE_OF}, but multiple fields are set"),
            )),
        }
        errs
    }
}

struct DeviceTaintRules;

impl DeviceTaintRules {
    fn validate_spec(&self, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let sel = Path::new("spec").child("deviceSelector");
        if let Some(d) = obj
            .pointer("/spec/deviceSelector/driver")
            .and_then(Value::as_str)
        {
            errs.extend(validate_driver_name(d, &sel.child("driver")));
        }
        if let Some(p) = obj
            .pointer("/spec/deviceSelector/pool")
            .and_then(Value::as_str)
        {
            errs.extend(validate_pool_name(p, &sel.child("pool")));
        }
        let taint = Path::new("spec").child("taint");
        let key = str_at(obj, "/spec/taint/key");
        if key.is_empty() {
            errs.push(FieldError::required(&taint.child("key"), ""));
        }
        for msg in is_qualified_name(key)
            .into_iter()
            .filter(|_| !key.is_empty())
        {
            errs.push(FieldError::invalid(&taint.child("key"), key, msg));
        }
        let value = str_at(obj, "/spec/taint/value");
        for msg in is_valid_label_value(value) {
            errs.push(FieldError::invalid(&taint.child("value"), value, msg));
        }
        let effect = str_at(obj, "/spec/taint/effect");
        let changed = old.is_none_or(|o| str_at(o, "/spec/taint/effect") != effect);
        if changed {
            if effect.is_empty() {
                errs.push(FieldError::required(&taint.child("effect"), ""));
            } else if !matches!(effect, "NoExecute" | "NoSchedule" | "None") {
                errs.push(FieldError::not_supported(
                    &taint.child("effect"),
                    effect,
                    &["NoExecute", "NoSchedule", "None"],
                ));
            }
        }
        errs
    }
}

impl Strategy for DeviceTaintRules {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        keep_status(new, old);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        self.validate_spec(obj, None)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        self.validate_spec(new, Some(old))
    }

    fn validate_status_update(&self, _new: &Value, _old: &Value) -> Vec<FieldError> {
        Vec::new()
    }

    fn columns(&self) -> Vec<Column> {
        vec![Column::NAME, super::printing::CREATED_AT]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![json!(name_of(obj)), super::printing::created_at(obj)]
    }
}
