//! The strategy of a custom resource: one served version of a CustomResourceDefinition.
//!
//! Objects are checked against the version's structural `openAPIV3Schema` (types,
//! required, enum, minimum/maximum, lengths, item counts), pruned of the fields it does not
//! declare (unless `x-kubernetes-preserve-unknown-fields`) and defaulted from its `default`s,
//! as upstream's apiextensions-apiserver does. The `status` and `scale` subresources and the
//! `additionalPrinterColumns` come from the same version.

use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Map, Value};

use std::sync::Arc;

use kumo_apimachinery::status::ApiError;

use super::conversion::WebhookConverter;
use super::crd::intern;
use super::{json_path_pointer, name_of, Column, ScaleSpec, SelectorForm, Strategy};

/// One served version of a definition.
pub(super) struct CustomResource {
    /// `/registry/<group>/<plural>`.
    key_root: String,
    /// Group, version, kind and list kind, for the OpenAPI definitions.
    gvk: [String; 4],
    schema: Value,
    /// `schema` with the object's own fields (apiVersion, kind, metadata) at the root and
    /// in every embedded resource, as upstream builds the schema apply types with.
    object_schema: Value,
    status: bool,
    scale: Option<ScaleSpec>,
    /// The printer columns after `Name`, with their JSON paths.
    columns: Vec<(Column, String)>,
    /// Whether the schema sets any defaults.
    has_defaults: bool,
    /// Whether the schema has CEL rules (`x-kubernetes-validations`).
    has_rules: bool,
    /// The definition's storage version, when it has more than one version: objects are
    /// stored in it and served in this one (the `None` conversion: only apiVersion
    /// changes).
    storage_version: Option<String>,
    /// The definition's conversion webhook (`strategy: Webhook`); without it only
    /// apiVersion changes between versions.
    conversion: Option<Arc<WebhookConverter>>,
    /// `selectableFields`: (field name, JSON pointer of its path).
    selectable: Vec<(&'static str, String)>,
}

impl CustomResource {
    /// The strategy of `version` (an element of the definition's `spec.versions`).
    pub(super) fn new(
        group: &str,
        plural: &str,
        kind: &str,
        list_kind: &str,
        version: &Value,
    ) -> Self {
        let scale = version.pointer("/subresources/scale").map(|s| ScaleSpec {
            spec_replicas: s
                .get("specReplicasPath")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            status_replicas: s
                .get("statusReplicasPath")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            selector: s
                .get("labelSelectorPath")
                .and_then(Value::as_str)
                .map(|p| (p.to_owned(), SelectorForm::Serialized)),
        });
        let columns = match version
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
        {
            Some(cols) => cols
                .iter()
                .map(|c| {
                    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("");
                    let path = s("jsonPath").to_owned();
                    let description = if s("description").is_empty() {
                        format!("Custom resource definition column (in JSONPath format): {path}")
                    } else {
                        s("description").to_owned()
                    };
                    let col = Column {
                        name: intern(s("name")),
                        type_: intern(s("type")),
                        format: intern(s("format")),
                        description: intern(&description),
                        priority: c
                            .get("priority")
                            .and_then(Value::as_u64)
                            .map_or(0, |p| p.min(u64::from(u8::MAX)) as u8),
                    };
                    (col, path)
                })
                .collect(),
            None => vec![(
                Column {
                    type_: "date",
                    ..Column::AGE
                },
                ".metadata.creationTimestamp".to_owned(),
            )],
        };
        CustomResource {
            key_root: format!("/registry/{group}/{plural}"),
            gvk: [
                group.to_owned(),
                version
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                kind.to_owned(),
                list_kind.to_owned(),
            ],
            schema: version
                .pointer("/schema/openAPIV3Schema")
                .cloned()
                .unwrap_or(json!({"type": "object"})),
            object_schema: Value::Null,
            status: version.pointer("/subresources/status").is_some(),
            scale,
            columns,
            has_defaults: false,
            has_rules: false,
            storage_version: None,
            conversion: None,
            selectable: version
                .get("selectableFields")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
                .map(|p| (intern(p.trim_start_matches('.')), json_path_pointer(p)))
                .collect(),
        }
        .with_defaults_noted()
    }

    /// Notes the storage version of a definition with several versions (see
    /// `storage_version`).
    pub(super) fn with_storage_version(mut self, storage: Option<String>) -> Self {
        self.storage_version = storage;
        self
    }

    /// Notes the definition's conversion webhook.
    pub(super) fn with_conversion(mut self, conversion: Option<Arc<WebhookConverter>>) -> Self {
        self.conversion = conversion;
        self
    }

    /// `obj` in `version`: by the conversion webhook, or by its apiVersion alone.
    fn to_version(&self, obj: Value, version: &str) -> Result<Value, ApiError> {
        match &self.conversion {
            Some(c) => c.convert_blocking(obj, version),
            None => Ok(self.in_version(obj, version)),
        }
    }

    /// `obj` with apiVersion `<group>/<version>`.
    fn in_version(&self, mut obj: Value, version: &str) -> Value {
        if let Some(o) = obj.as_object_mut() {
            o.insert(
                "apiVersion".into(),
                Value::String(format!("{}/{version}", self.gvk[0])),
            );
        }
        obj
    }

    /// Notes whether the schema has any `default` (reads then apply them).
    fn with_defaults_noted(mut self) -> Self {
        self.object_schema = object_schema(&self.schema);
        self.has_defaults = self.schema.to_string().contains("\"default\":");
        self.has_rules = crate::cel::has_rules(&self.schema);
        self
    }

    /// Prunes and defaults `obj` by the schema (metadata, apiVersion and kind stay).
    fn normalize(&self, obj: &mut Value) {
        let Some(o) = obj.as_object_mut() else {
            return;
        };
        let keep: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
            .iter()
            .filter_map(|k| o.remove(*k).map(|v| ((*k).to_owned(), v)))
            .collect();
        prune(&self.schema, obj, 0);
        default(&self.schema, obj, 0);
        if let Some(o) = obj.as_object_mut() {
            for (k, v) in keep {
                o.insert(k, v);
            }
        }
    }

    /// The structural schema checks (upstream's schema validator).
    fn validate_schema(&self, obj: &Value) -> Vec<FieldError> {
        let mut body = obj.clone();
        if let Some(o) = body.as_object_mut() {
            o.remove("apiVersion");
            o.remove("kind");
            o.remove("metadata");
        }
        let mut errs = Vec::new();
        validate(&self.schema, &body, &Path::new(""), &mut errs, 0);
        if let Some(scale) = &self.scale {
            // The scale subresource reads the replicas as an integer.
            let p = &scale.spec_replicas;
            if let Some(v) = obj.pointer(&json_path_pointer(p)).filter(|v| !v.is_i64()) {
                let shown = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                errs.push(FieldError::invalid(
                    &Path::new(p),
                    0,
                    format!(
                        "{p} accessor error: {shown} is of the type {}, expected int64",
                        go_type(v)
                    ),
                ));
            }
        }
        errs
    }

    /// The `x-kubernetes-validations` rules, unless an error already makes the object
    /// unfit for them (upstream's hasBlockingErr).
    fn validate_rules(&self, obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
        if !self.has_rules {
            return;
        }
        use kumo_apimachinery::validation::FieldErrorKind as K;
        let blocking = errs.iter().any(|e| {
            matches!(
                e.kind,
                K::NotSupported | K::Required | K::TooLong | K::TooMany | K::TypeInvalid
            )
        });
        if blocking {
            errs.push(FieldError::invalid(
                &Path::new("<nil>"),
                Value::Null,
                "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
            ));
        } else {
            crate::cel::validate(&self.schema, obj, old, errs);
        }
    }
}

impl Strategy for CustomResource {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    fn prepare_create(&self, obj: &mut Value) {
        if self.status {
            // With a status subresource, status is set only through it.
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        }
        self.normalize(obj);
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        if self.status {
            if let Some(o) = new.as_object_mut() {
                match old.get("status") {
                    Some(s) => o.insert("status".into(), s.clone()),
                    None => o.remove("status"),
                };
            }
        }
        self.normalize(new);
    }

    fn prepare_status_update(&self, new: &mut Value, _old: &Value) {
        self.normalize(new);
    }

    fn default(&self, obj: &mut Value) {
        self.normalize(obj);
    }

    // Defaults apply on read too ("defaulting from storage"): objects stored before a
    // default was added to the schema are served with it.
    fn stored_form(&self, obj: Value) -> Result<Value, ApiError> {
        match &self.storage_version {
            Some(v) => self.to_version(obj, v),
            None => Ok(obj),
        }
    }

    fn served_form(&self, mut obj: Value) -> Result<Value, ApiError> {
        if self.storage_version.is_some() {
            obj = self.to_version(obj, &self.gvk[1])?;
        }
        if self.has_defaults {
            if let Some(o) = obj.as_object_mut() {
                let keep: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
                    .iter()
                    .filter_map(|k| o.remove(*k).map(|v| ((*k).to_owned(), v)))
                    .collect();
                default(&self.schema, &mut obj, 0);
                if let Some(o) = obj.as_object_mut() {
                    for (k, v) in keep {
                        o.insert(k, v);
                    }
                }
            }
        }
        Ok(obj)
    }

    fn converts(&self) -> bool {
        self.has_defaults || self.storage_version.is_some()
    }

    fn converts_field_labels(&self) -> bool {
        true
    }

    // Field values as upstream's `fmt.Sprint` of the unstructured value; "" when absent.
    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        self.selectable
            .iter()
            .map(|(name, ptr)| {
                let v = match obj.pointer(ptr) {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                };
                (*name, v)
            })
            .collect()
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = self.validate_schema(obj);
        self.validate_rules(obj, None, &mut errs);
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate_schema(new);
        // Ratcheting (CRDValidationRatcheting, GA): schema errors in values left unchanged
        // by the update do not refuse it.
        let body = |v: &Value| {
            let mut b = v.clone();
            if let Some(o) = b.as_object_mut() {
                for k in ["apiVersion", "kind", "metadata"] {
                    o.remove(k);
                }
            }
            b
        };
        let mut same = Vec::new();
        unchanged(
            &self.schema,
            &body(new),
            &body(old),
            &Path::new(""),
            &mut same,
            0,
        );
        errs.retain(|e| {
            !same.iter().any(|p| {
                p.is_empty()
                    || e.field == *p
                    || e.field.starts_with(&format!("{p}."))
                    || e.field.starts_with(&format!("{p}["))
            })
        });
        self.validate_rules(new, Some(old), &mut errs);
        errs
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn columns(&self) -> Vec<Column> {
        std::iter::once(Column::NAME)
            .chain(self.columns.iter().map(|(c, _)| *c))
            .collect()
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let mut cells = vec![json!(name_of(obj))];
        for (col, path) in &self.columns {
            let v = column_value(obj, path);
            cells.push(match (v, col.type_) {
                (None | Some(Value::Null), _) => Value::Null,
                (Some(Value::String(s)), "date") => json!(crate::time::age(Some(s))),
                (Some(Value::String(s)), _) => json!(s),
                (Some(v), "string") => json!(v.to_string()),
                (Some(v), _) => v.clone(),
            });
        }
        cells
    }

    fn scale(&self) -> Option<ScaleSpec> {
        self.scale.clone()
    }

    fn key_root(&self) -> Option<&str> {
        Some(&self.key_root)
    }

    fn list_items_keep_type(&self) -> bool {
        true
    }

    fn openapi_definitions(&self) -> Option<[(String, Value); 2]> {
        // Named as upstream: the group reversed, then version and kind
        // (`com.example.stable.v1.CronTab`).
        let [group, version, kind, list_kind] = &self.gvk;
        let reversed: Vec<&str> = group.split('.').rev().collect();
        let name = |k: &str| format!("{}.{version}.{k}", reversed.join("."));
        let meta_ref = |m: &str| json!({"allOf": [{"$ref": format!("#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.{m}")}]});
        let gvk = |k: &str| json!([{"group": group, "kind": k, "version": version}]);
        let mut obj = self.object_schema.clone();
        if let Some(o) = obj.as_object_mut() {
            o.insert("x-kubernetes-group-version-kind".into(), gvk(kind));
        }
        let list = json!({
            "type": "object",
            "required": ["items"],
            "properties": {
                "apiVersion": {"type": "string"},
                "items": {"type": "array", "items": {"$ref": format!("#/components/schemas/{}", name(kind))}},
                "kind": {"type": "string"},
                "metadata": meta_ref("ListMeta"),
            },
            "x-kubernetes-group-version-kind": gvk(list_kind),
        });
        Some([(name(kind), obj), (name(list_kind), list)])
    }

    fn apply_schema(&self) -> Option<&Value> {
        Some(&self.object_schema)
    }

    fn verbs(&self) -> Option<&'static [&'static str]> {
        Some(&[
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "create",
            "update",
            "watch",
        ])
    }

    /// As upstream reports them: the root metadata's unknown fields, then the ones the
    /// schema's pruning finds, then (sorted) those of embedded resources' metadata.
    fn unknown_fields(&self, obj: &Value) -> Vec<String> {
        let mut out = obj
            .get("metadata")
            .map(|m| crate::openapi::object_meta_unknown(m, "metadata"))
            .unwrap_or_default();
        let mut body = obj.clone();
        if let Some(o) = body.as_object_mut() {
            for k in ["apiVersion", "kind", "metadata"] {
                o.remove(k);
            }
        }
        let mut embedded_meta = Vec::new();
        unknown(&self.schema, &body, "", &mut out, &mut embedded_meta, 0);
        embedded_meta.sort();
        out.extend(embedded_meta);
        out
    }
}

/// A version's schema as the schema of whole objects: `apiVersion` and `kind` strings and
/// `metadata` an ObjectMeta, at the root and in each `x-kubernetes-embedded-resource`, as
/// upstream's OpenAPI builder adds them (which also makes `kubectl explain` show them).
fn object_schema(schema: &Value) -> Value {
    fn add_object_fields(s: &mut Value) {
        // The descriptions upstream gives these three fields are every built-in kind's
        // (TypeMeta's and "Standard object's metadata"): a ConfigMap's, say.
        let described = |field: &str, mut v: Value| {
            let meta = kumo_apimachinery::openapi::schemas().get("io.k8s.api.core.v1.ConfigMap");
            if let Some(d) =
                meta.and_then(|m| m.pointer(&format!("/properties/{field}/description")))
            {
                v["description"] = d.clone();
            }
            v
        };
        let Some(o) = s.as_object_mut() else { return };
        let props = o.entry("properties").or_insert_with(|| json!({}));
        if let Some(p) = props.as_object_mut() {
            p.insert(
                "apiVersion".into(),
                described("apiVersion", json!({"type": "string"})),
            );
            p.insert("kind".into(), described("kind", json!({"type": "string"})));
            p.insert(
                "metadata".into(),
                described(
                    "metadata",
                    json!({"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]}),
                ),
            );
        }
    }
    fn embedded(s: &mut Value, depth: usize) {
        if depth > 64 {
            return;
        }
        if let Some(props) = s.get_mut("properties").and_then(Value::as_object_mut) {
            for v in props.values_mut() {
                embedded(v, depth + 1);
            }
        }
        for k in ["items", "additionalProperties"] {
            if let Some(v) = s.get_mut(k).filter(|v| v.is_object()) {
                embedded(v, depth + 1);
            }
        }
        if s.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true)) {
            add_object_fields(s);
        }
    }
    let mut s = schema.clone();
    embedded(&mut s, 0);
    add_object_fields(&mut s);
    s
}

/// Collects the paths (as the schema validation renders them) of the values `new` leaves
/// as they were in `old`, following correlatable values only: object fields, map values
/// and the items of `x-kubernetes-list-type: map` lists with the same keys.
fn unchanged(
    schema: &Value,
    new: &Value,
    old: &Value,
    path: &Path,
    out: &mut Vec<String>,
    depth: usize,
) {
    if depth > 64 {
        return;
    }
    if new == old {
        // The root (rendered `[]`) holds every error.
        out.push(if is_root(path) {
            String::new()
        } else {
            path.as_str().to_owned()
        });
        return;
    }
    match (new, old) {
        (Value::Object(n), Value::Object(o)) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, x) in n {
                let (Some(s), Some(y)) = (props.and_then(|p| p.get(k)).or(additional), o.get(k))
                else {
                    continue;
                };
                let p = if is_root(path) {
                    Path::new(k)
                } else {
                    path.child(k)
                };
                unchanged(s, x, y, &p, out, depth + 1);
            }
        }
        (Value::Array(n), Value::Array(o))
            if schema.get("x-kubernetes-list-type") == Some(&json!("map")) =>
        {
            let keys: Vec<&str> = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|k| k.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let Some(s) = schema.get("items") else {
                return;
            };
            if keys.is_empty() {
                return;
            }
            for (i, x) in n.iter().enumerate() {
                if let Some(y) = o
                    .iter()
                    .find(|y| keys.iter().all(|k| y.get(*k) == x.get(*k)))
                {
                    unchanged(s, x, y, &path.index(i), out, depth + 1);
                }
            }
        }
        _ => {}
    }
}

/// Collects the paths of the fields `schema` does not declare, as pruning would drop them.
/// Collects the fields of `v` that `schema` does not declare. An
/// `x-kubernetes-embedded-resource` object may hold `apiVersion`, `kind` and an ObjectMeta
/// `metadata` besides its properties; that metadata's unknown fields go to `meta_out`.
fn unknown(
    schema: &Value,
    v: &Value,
    path: &str,
    out: &mut Vec<String>,
    meta_out: &mut Vec<String>,
    depth: usize,
) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            if props.is_none()
                && additional.is_none()
                && schema.get("type") != Some(&json!("object"))
            {
                return;
            }
            let embedded = is_embedded(schema);
            for (k, x) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if embedded && EMBEDDED_FIELDS.contains(&k.as_str()) {
                    if k == "metadata" {
                        meta_out.extend(crate::openapi::object_meta_unknown(x, &p));
                    }
                    continue;
                }
                match props.and_then(|ps| ps.get(k)).or(additional) {
                    Some(s) => unknown(s, x, &p, out, meta_out, depth + 1),
                    None if !preserves_unknown(schema) => out.push(p),
                    None => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, x) in items.iter().enumerate() {
                    unknown(s, x, &format!("{path}[{i}]"), out, meta_out, depth + 1);
                }
            }
        }
        _ => {}
    }
}

/// The fields every embedded resource may hold whatever its schema says.
const EMBEDDED_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

fn is_embedded(schema: &Value) -> bool {
    schema.get("x-kubernetes-embedded-resource") == Some(&json!(true))
}

/// Deeper than this the walks stop (the body depth limit refuses such bodies anyway).
const MAX_DEPTH: usize = 64;

fn preserves_unknown(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true))
}

/// Removes the fields `schema` does not declare.
fn prune(schema: &Value, v: &mut Value, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            if props.is_none()
                && additional.is_none()
                && schema.get("type") != Some(&json!("object"))
            {
                return;
            }
            let embedded = is_embedded(schema);
            if !preserves_unknown(schema) && additional.is_none() {
                m.retain(|k, _| {
                    (embedded && EMBEDDED_FIELDS.contains(&k.as_str()))
                        || props.is_some_and(|p| p.contains_key(k))
                });
            }
            for (k, x) in m.iter_mut() {
                if embedded && EMBEDDED_FIELDS.contains(&k.as_str()) {
                    // An embedded object's metadata is an ObjectMeta, pruned as one.
                    if k == "metadata" {
                        crate::openapi::prune_object_meta(x);
                    }
                    continue;
                }
                if let Some(s) = props.and_then(|p| p.get(k)).or(additional) {
                    prune(s, x, depth + 1);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for x in items {
                    prune(s, x, depth + 1);
                }
            }
        }
        _ => {}
    }
}

/// Sets the `default`s of absent fields.
fn default(schema: &Value, v: &mut Value, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, s) in props {
                    if let Some(d) = s.get("default") {
                        if !m.contains_key(k) {
                            m.insert(k.clone(), d.clone());
                        }
                    }
                }
                for (k, x) in m.iter_mut() {
                    if let Some(s) = props.get(k) {
                        default(s, x, depth + 1);
                    }
                }
            }
            if let Some(s) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for x in m.values_mut() {
                    default(s, x, depth + 1);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for x in items {
                    default(s, x, depth + 1);
                }
            }
        }
        _ => {}
    }
}

/// The Go type a JSON value decodes to, for the scale accessor's message.
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

/// The OpenAPI type name of a JSON value.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The path of the object itself (`Path::new("")`).
fn is_root(path: &Path) -> bool {
    path == &Path::new("")
}

/// The field name in messages: `spec.replicas`, or `body` at the root.
fn shown(path: &Path) -> &str {
    if is_root(path) {
        "body"
    } else {
        path.as_str()
    }
}

/// Checks `v` against `schema`, with upstream's messages (`<field> in body ...`).
fn validate(schema: &Value, v: &Value, path: &Path, errs: &mut Vec<FieldError>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let field = shown(path).to_owned();
    if v.is_null() {
        if schema.get("nullable") != Some(&json!(true)) && schema.get("type").is_some() {
            let t = schema.get("type").and_then(Value::as_str).unwrap_or("");
            errs.push(FieldError::type_invalid(
                path,
                "null",
                format!("{field} in body must be of type {t}: \"null\""),
            ));
        }
        return;
    }
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        let actual = type_name(v);
        let fits = actual == t || (t == "number" && actual == "integer");
        if !fits {
            errs.push(FieldError::type_invalid(
                path,
                actual,
                format!("{field} in body must be of type {t}: \"{actual}\""),
            ));
            return;
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.contains(v) {
            let shown: Vec<String> = options
                .iter()
                .map(|o| match o {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            errs.push(FieldError::not_supported(path, v.clone(), &shown));
        }
    }
    match v {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            let num = |f: f64| {
                if f.fract() == 0.0 && f.abs() < 1e15 {
                    format!("{}", f as i64)
                } else {
                    format!("{f}")
                }
            };
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
                let exclusive = schema.get("exclusiveMaximum") == Some(&json!(true));
                if x > max || (exclusive && x == max) {
                    let rel = if exclusive {
                        "less than"
                    } else {
                        "less than or equal to"
                    };
                    errs.push(FieldError::invalid(
                        path,
                        v.clone(),
                        format!("{field} in body should be {rel} {}", num(max)),
                    ));
                }
            }
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
                let exclusive = schema.get("exclusiveMinimum") == Some(&json!(true));
                if x < min || (exclusive && x == min) {
                    let rel = if exclusive {
                        "greater than"
                    } else {
                        "greater than or equal to"
                    };
                    errs.push(FieldError::invalid(
                        path,
                        v.clone(),
                        format!("{field} in body should be {rel} {}", num(min)),
                    ));
                }
            }
        }
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
                if len > max {
                    errs.push(FieldError::too_long(path, max as i64));
                }
            }
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
                if len < min {
                    errs.push(FieldError::invalid(
                        path,
                        s.as_str(),
                        format!("{field} in body should be at least {min} chars long"),
                    ));
                }
            }
        }
        Value::Array(items) => {
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
                if items.len() as u64 > max {
                    errs.push(FieldError::too_many(path, items.len() as i64, max as i64));
                }
            }
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
                if (items.len() as u64) < min {
                    errs.push(FieldError::invalid(
                        path,
                        v.clone(),
                        format!("{field} in body should have at least {min} items"),
                    ));
                }
            }
            if let Some(s) = schema.get("items") {
                for (i, x) in items.iter().enumerate() {
                    validate(s, x, &path.index(i), errs, depth + 1);
                }
            }
        }
        Value::Object(m) => validate_object(schema, m, path, errs, depth),
        _ => {}
    }
}

fn validate_object(
    schema: &Value,
    m: &Map<String, Value>,
    path: &Path,
    errs: &mut Vec<FieldError>,
    depth: usize,
) {
    let child = |k: &str| {
        if is_root(path) {
            Path::new(k)
        } else {
            path.child(k)
        }
    };
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !m.contains_key(r) {
            errs.push(FieldError::required(&child(r), ""));
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (k, x) in m {
        if let Some(s) = props.and_then(|p| p.get(k)).or(additional) {
            validate(s, x, &child(k), errs, depth + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crontab() -> CustomResource {
        CustomResource::new(
            "stable.example.com",
            "crontabs",
            "CronTab",
            "CronTabList",
            &json!({"name": "v1", "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "required": ["cronSpec"], "properties": {
                "cronSpec": {"type": "string"},
                "image": {"type": "string", "default": "busybox"},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 10},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            }}}}}}),
        )
    }

    #[test]
    fn embedded_resources_hold_type_and_object_meta() {
        let s = CustomResource::new(
            "e.example.com",
            "foos",
            "Foo",
            "FooList",
            &json!({"name": "v1", "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                    "properties": {"spec": {"type": "object"}}}}}}}}}),
        );
        let mut obj = json!({"apiVersion": "e.example.com/v1", "kind": "Foo",
            "metadata": {"name": "x", "unknownMeta": 1},
            "spec": {"template": {"apiVersion": "a/v1", "kind": "Sub",
                "metadata": {"name": "s", "namespace": "n", "zz": 1, "labels": {"a": "b"}},
                "spec": {}, "bogus": 1}}});
        assert_eq!(
            s.unknown_fields(&obj),
            [
                "metadata.unknownMeta",
                "spec.template.bogus",
                "spec.template.metadata.zz"
            ]
        );
        s.normalize(&mut obj);
        assert_eq!(
            obj["spec"]["template"],
            json!({"apiVersion": "a/v1", "kind": "Sub", "spec": {},
                   "metadata": {"name": "s", "namespace": "n", "labels": {"a": "b"}}})
        );
    }

    #[test]
    fn unchanged_values_ratchet_schema_errors() {
        let s = crontab();
        let old = json!({"metadata": {"name": "x"},
            "spec": {"cronSpec": "*", "replicas": 20, "mode": "c"}});
        let mut labelled = old.clone();
        labelled["metadata"]["labels"] = json!({"a": "b"});
        assert_eq!(s.validate_update(&labelled, &old), vec![]);
        let mut changed = old.clone();
        changed["spec"]["mode"] = json!("d");
        let errs: Vec<String> = s
            .validate_update(&changed, &old)
            .iter()
            .map(|e| e.field.clone())
            .collect();
        assert_eq!(errs, ["spec.mode"]);
    }

    #[test]
    fn validates_prunes_and_defaults() {
        let s = crontab();
        let mut obj = json!({"apiVersion": "stable.example.com/v1", "kind": "CronTab",
            "metadata": {"name": "x"}, "junk": 1,
            "spec": {"replicas": 20, "mode": "c", "other": true, "extra": {"kept": 1}}});
        s.prepare_create(&mut obj);
        assert!(obj.get("junk").is_none());
        assert!(obj.pointer("/spec/other").is_none());
        assert_eq!(obj.pointer("/spec/extra/kept"), Some(&json!(1)));
        assert_eq!(obj.pointer("/spec/image"), Some(&json!("busybox")));
        let errs: Vec<String> = s.validate(&obj).iter().map(|e| e.to_string()).collect();
        assert_eq!(
            errs,
            [
                "spec.cronSpec: Required value",
                "spec.mode: Unsupported value: \"c\": supported values: \"a\", \"b\"",
                "spec.replicas: Invalid value: 20: spec.replicas in body should be less than or equal to 10",
            ]
        );
        let bad = json!({"spec": {"cronSpec": 5}});
        let errs: Vec<String> = s.validate(&bad).iter().map(|e| e.to_string()).collect();
        assert_eq!(
            errs,
            ["spec.cronSpec: Invalid value: \"integer\": spec.cronSpec in body must be of type string: \"integer\""]
        );
    }
}

/// A printer column's value: the first result of its JSONPath, as upstream's CRD table
/// convertor takes it. Kubernetes' JSONPath (`.status.conditions[?(@.type=="Ready")].status`,
/// `.metadata.labels['a\.b/c']`) is read as RFC 9535's: rooted at `$`, with the dots
/// that Kubernetes escapes in quoted names unescaped.
fn column_value<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    use jsonpath_rust::JsonPath;
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let rooted = if path.starts_with('$') {
        path.to_owned()
    } else {
        format!("${path}")
    };
    let mut rfc = String::with_capacity(rooted.len());
    let mut quote = None;
    let mut chars = rooted.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(_), '\\') if chars.peek() == Some(&'.') => {}
            (Some(q), c) if c == q => {
                quote = None;
                rfc.push(c);
            }
            (None, '\'' | '"') => {
                quote = Some(c);
                rfc.push(c);
            }
            _ => rfc.push(c),
        }
    }
    match obj.query(&rfc) {
        Ok(found) => found.into_iter().next(),
        // Not JSONPath this reads: the dotted path it names.
        Err(_) => obj.pointer(&json_path_pointer(path)),
    }
}

#[cfg(test)]
mod column_tests {
    use super::column_value;
    use serde_json::json;

    #[test]
    fn printer_columns_read_kubernetes_jsonpath() {
        let obj = json!({
            "metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "demo"}},
            "spec": {"replicas": 3},
            "status": {"conditions": [
                {"type": "Available", "status": "False"},
                {"type": "Ready", "status": "True"},
            ]},
        });
        assert_eq!(column_value(&obj, ".spec.replicas"), Some(&json!(3)));
        assert_eq!(
            column_value(&obj, r#".status.conditions[?(@.type=="Ready")].status"#),
            Some(&json!("True"))
        );
        assert_eq!(
            column_value(&obj, r".metadata.labels['cluster\.x-k8s\.io/cluster-name']"),
            Some(&json!("demo"))
        );
        assert_eq!(
            column_value(&obj, ".status.conditions[0].type"),
            Some(&json!("Available"))
        );
        assert_eq!(column_value(&obj, ".status.missing"), None);
    }
}
