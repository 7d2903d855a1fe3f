//! core/v1 resources.

use kumo_apimachinery::validation::{is_config_map_key, FieldError, Path};
use serde_json::{json, Value};

use super::{age_of, name_of, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource {
            group: "",
            version: "v1",
            kind: "Namespace",
            plural: "namespaces",
            singular: "namespace",
            namespaced: false,
            short_names: &["ns"],
            categories: &[],
            subresources: &["status", "finalize"],
            strategy: Box::new(Namespaces),
        },
        Resource {
            group: "",
            version: "v1",
            kind: "ConfigMap",
            plural: "configmaps",
            singular: "configmap",
            namespaced: true,
            short_names: &["cm"],
            categories: &[],
            subresources: &[],
            strategy: Box::new(ConfigMaps),
        },
        Resource {
            group: "",
            version: "v1",
            kind: "Secret",
            plural: "secrets",
            singular: "secret",
            namespaced: true,
            short_names: &[],
            categories: &[],
            subresources: &[],
            strategy: Box::new(Secrets),
        },
    ]
}

/// Namespaces: phase Active on create, the `kubernetes` finalizer, the
/// `kubernetes.io/metadata.name` label.
struct Namespaces;

const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

impl Strategy for Namespaces {
    fn delete_collection(&self) -> bool {
        false
    }
    fn validate_name(&self, name: &str) -> Vec<String> {
        kumo_apimachinery::validation::is_dns1123_label(name)
    }

    fn prepare_create(&self, obj: &mut Value) {
        let name = name_of(obj).to_owned();
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert(NAMESPACE_NAME_LABEL.into(), json!(name));
            }
        }
        if let Some(o) = obj.as_object_mut() {
            o.insert("status".into(), json!({"phase": "Active"}));
        }
    }

    fn prepare_for_create(&self, obj: &mut Value) {
        if let Some(o) = obj.as_object_mut() {
            let spec = o.entry("spec").or_insert_with(|| json!({}));
            if let Some(s) = spec.as_object_mut() {
                let fin = s.entry("finalizers").or_insert_with(|| json!([]));
                if let Some(f) = fin.as_array_mut() {
                    if !f.iter().any(|v| v == "kubernetes") {
                        f.push(json!("kubernetes"));
                    }
                }
            }
        }
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        // Status and spec.finalizers change only through their subresources.
        if let Some(o) = new.as_object_mut() {
            o.insert(
                "status".into(),
                old.get("status").cloned().unwrap_or_else(|| json!({})),
            );
            let spec = old.get("spec").cloned().unwrap_or_else(|| json!({}));
            o.insert("spec".into(), spec);
        }
        let name = name_of(new).to_owned();
        if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert(NAMESPACE_NAME_LABEL.into(), json!(name));
            }
        }
    }

    fn delete_pending(&self, obj: &mut Value) -> bool {
        // Deletion marks the namespace Terminating; the namespace controller empties it
        // and removes the `kubernetes` finalizer through `finalize`.
        if let Some(o) = obj.as_object_mut() {
            o.insert("status".into(), json!({"phase": "Terminating"}));
        }
        self.finalizers_pending(obj)
    }

    fn finalizers_pending(&self, obj: &Value) -> bool {
        let non_empty = |p: &str| {
            obj.pointer(p)
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty())
        };
        non_empty("/metadata/finalizers") || non_empty("/spec/finalizers")
    }

    fn prepare_finalize_update(&self, new: &mut Value, _old: &Value) {
        let name = name_of(new).to_owned();
        if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert(NAMESPACE_NAME_LABEL.into(), json!(name));
            }
        }
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            Column {
                name: "Status",
                type_: "string",
                format: "",
                description: "The status of the namespace",
                priority: 0,
            },
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(obj
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("")),
            json!(age_of(obj)),
        ]
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        let phase = obj
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        vec![("status.phase", phase.to_owned())]
    }
}

/// Keys of `data` and `binaryData` in ConfigMaps and Secrets.
fn validate_config_keys(obj: &Value, fields: &[&str]) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for field in fields {
        let Some(map) = obj.get(*field).and_then(Value::as_object) else {
            continue;
        };
        for key in map.keys() {
            let path = Path::new(field).key(key);
            for msg in is_config_map_key(key) {
                errs.push(FieldError::invalid(&path, key.clone(), msg));
            }
            if !seen.insert(key.clone()) {
                errs.push(FieldError::duplicate(&path, key.clone()));
            }
        }
    }
    errs
}

/// Number of entries in `data` plus `binaryData`.
fn data_count(obj: &Value) -> usize {
    ["data", "binaryData"]
        .iter()
        .filter_map(|f| obj.get(*f).and_then(Value::as_object))
        .map(|m| m.len())
        .sum()
}

const DATA_COLUMN: Column = Column {
    name: "Data",
    type_: "string",
    format: "",
    description: "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.",
    priority: 0,
};

struct ConfigMaps;

impl Strategy for ConfigMaps {
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_config_keys(obj, &["data", "binaryData"])
    }

    fn columns(&self) -> Vec<Column> {
        vec![Column::NAME, DATA_COLUMN, Column::AGE]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(data_count(obj)),
            json!(age_of(obj)),
        ]
    }
}

struct Secrets;

impl Strategy for Secrets {
    fn prepare_create(&self, obj: &mut Value) {
        // stringData is write-only: merged into data (base64), then dropped.
        if let Some(o) = obj.as_object_mut() {
            if let Some(Value::Object(sd)) = o.remove("stringData") {
                use base64::Engine;
                let data = o.entry("data").or_insert_with(|| json!({}));
                if !data.is_object() {
                    *data = json!({});
                }
                if let Some(d) = data.as_object_mut() {
                    for (k, v) in sd {
                        let s = v.as_str().unwrap_or("");
                        d.insert(
                            k,
                            json!(base64::engine::general_purpose::STANDARD.encode(s)),
                        );
                    }
                }
            }
        }
        if let Some(o) = obj.as_object_mut() {
            let empty = o
                .get("type")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty);
            if empty {
                o.insert("type".into(), json!("Opaque"));
            }
        }
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        self.prepare_create(new);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_config_keys(obj, &["data"])
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        if new.get("type") != old.get("type") {
            let t = new.get("type").and_then(Value::as_str).unwrap_or("");
            errs.push(FieldError::invalid(
                &Path::new("type"),
                t.to_owned(),
                "field is immutable",
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            Column {
                name: "Type",
                type_: "string",
                format: "",
                description: "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types",
                priority: 0,
            },
            Column {
                name: "Data",
                type_: "string",
                format: "",
                description: "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4",
                priority: 0,
            },
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(obj.get("type").and_then(Value::as_str).unwrap_or("")),
            json!(obj
                .get("data")
                .and_then(Value::as_object)
                .map_or(0, |m| m.len())),
            json!(age_of(obj)),
        ]
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        vec![(
            "type",
            obj.get("type")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        )]
    }
}
