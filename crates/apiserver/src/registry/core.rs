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
            // Marked as upstream's namespace storage does: a deletionTimestamp and no
            // deletionGracePeriodSeconds.
            if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                m.entry("deletionTimestamp")
                    .or_insert_with(|| json!(crate::time::format_rfc3339(crate::time::now_secs())));
            }
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

/// Upstream's MaxSecretSize: the most bytes of data a ConfigMap or Secret holds.
const MAX_SECRET_SIZE: usize = 1024 * 1024;

/// The bytes of a base64 `[]byte` value (what Go decodes it to).
fn decoded_len(v: &Value) -> usize {
    use base64::Engine;
    let s = v.as_str().unwrap_or("");
    base64::engine::general_purpose::STANDARD
        .decode(s.replace(['\n', '\r'], ""))
        .map_or(0, |b| b.len())
}

/// ConfigMap validation, as upstream's ValidateConfigMap: keys of `data` and `binaryData`,
/// no key in both (reported at `data`), at most 1 MiB in all.
fn validate_config_map(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let data = obj.get("data").and_then(Value::as_object);
    let binary = obj.get("binaryData").and_then(Value::as_object);
    let mut total = 0;
    for (key, v) in data.into_iter().flatten() {
        let path = Path::new("data").key(key);
        for msg in is_config_map_key(key) {
            errs.push(FieldError::invalid(&path, key.clone(), msg));
        }
        if binary.is_some_and(|b| b.contains_key(key)) {
            errs.push(FieldError::invalid(
                &path,
                key.clone(),
                "duplicate of key present in binaryData",
            ));
        }
        total += v.as_str().map_or(0, str::len);
    }
    for (key, v) in binary.into_iter().flatten() {
        let path = Path::new("binaryData").key(key);
        for msg in is_config_map_key(key) {
            errs.push(FieldError::invalid(&path, key.clone(), msg));
        }
        total += decoded_len(v);
    }
    if total > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long(&Path::new(""), MAX_SECRET_SIZE as i64));
    }
    errs
}

/// Secret validation, as upstream's ValidateSecret: keys, size, and the keys each built-in
/// type requires.
fn validate_secret(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let data = obj.get("data").and_then(Value::as_object);
    let has = |k: &str| data.is_some_and(|d| d.contains_key(k));
    let data_path = Path::new("data");
    let mut total = 0;
    for (key, v) in data.into_iter().flatten() {
        for msg in is_config_map_key(key) {
            errs.push(FieldError::invalid(&data_path.key(key), key.clone(), msg));
        }
        total += decoded_len(v);
    }
    if total > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long(&data_path, MAX_SECRET_SIZE as i64));
    }
    let required = |k: &str| FieldError::required(&data_path.key(k), "");
    match obj.get("type").and_then(Value::as_str).unwrap_or("") {
        "kubernetes.io/service-account-token" => {
            let name = obj
                .pointer("/metadata/annotations/kubernetes.io~1service-account.name")
                .and_then(Value::as_str)
                .unwrap_or("");
            if name.is_empty() {
                errs.push(FieldError::required(
                    &Path::new("metadata")
                        .child("annotations")
                        .key("kubernetes.io/service-account.name"),
                    "",
                ));
            }
        }
        t @ ("kubernetes.io/dockercfg" | "kubernetes.io/dockerconfigjson") => {
            let key = if t == "kubernetes.io/dockercfg" {
                ".dockercfg"
            } else {
                ".dockerconfigjson"
            };
            match data.and_then(|d| d.get(key)) {
                None => errs.push(required(key)),
                Some(v) => {
                    use base64::Engine;
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(v.as_str().unwrap_or(""))
                        .unwrap_or_default();
                    let why = match serde_json::from_slice::<Value>(&raw) {
                        Err(_) => kumo_apimachinery::gojson::syntax_error(&raw),
                        Ok(Value::Object(_)) | Ok(Value::Null) => None,
                        Ok(other) => Some(format!(
                            "json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
                            match other {
                                Value::Array(_) => "array",
                                Value::String(_) => "string",
                                Value::Number(_) => "number",
                                _ => "bool",
                            }
                        )),
                    };
                    if let Some(why) = why {
                        errs.push(FieldError::invalid(
                            &data_path.key(key),
                            "<secret contents redacted>",
                            why,
                        ));
                    }
                }
            }
        }
        // Either may be empty, but one must be there.
        "kubernetes.io/basic-auth" if !has("username") && !has("password") => {
            errs.push(required("username"));
            errs.push(required("password"));
        }
        "kubernetes.io/ssh-auth"
            if data
                .and_then(|d| d.get("ssh-privatekey"))
                .is_none_or(|v| decoded_len(v) == 0) =>
        {
            errs.push(required("ssh-privatekey"));
        }
        "kubernetes.io/tls" => {
            for k in ["tls.crt", "tls.key"] {
                if !has(k) {
                    errs.push(required(k));
                }
            }
        }
        _ => {}
    }
    errs
}

/// Upstream's rules for updating an immutable ConfigMap or Secret: `immutable` stays true
/// and the data fields do not change.
fn validate_immutable(new: &Value, old: &Value, fields: &[&str]) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if old.get("immutable").and_then(Value::as_bool) != Some(true) {
        return errs;
    }
    const MSG: &str = "field is immutable when `immutable` is set";
    if new.get("immutable").and_then(Value::as_bool) != Some(true) {
        errs.push(FieldError::forbidden(&Path::new("immutable"), MSG));
    }
    for f in fields {
        if new.get(*f) != old.get(*f) {
            errs.push(FieldError::forbidden(&Path::new(f), MSG));
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
        validate_config_map(obj)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = validate_immutable(new, old, &["data", "binaryData"]);
        errs.extend(validate_config_map(new));
        errs
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
        validate_secret(obj)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        if new.get("type") != old.get("type") {
            let t = new.get("type").and_then(Value::as_str).unwrap_or("");
            errs.push(FieldError::invalid(
                &Path::new("type"),
                t.to_owned(),
                "field is immutable",
            ));
        }
        errs.extend(validate_immutable(new, old, &["data"]));
        errs.extend(validate_secret(new));
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
