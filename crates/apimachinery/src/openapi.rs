//! The OpenAPI schemas of the Kubernetes built-in types: facts of the API (types,
//! formats, properties, defaults, the `x-kubernetes-*` extensions), as `scripts/gen-openapi`
//! extracts them from k8s.io/kubernetes into `openapi_schemas.txt`, with upstream's
//! descriptions of each definition and property added by the build script from
//! k8s-openapi's JSON schemas (`build.rs`).
//! The API server builds its documents and validates fields with them; extension API
//! servers of the sim refer to the same meta types.

use std::collections::{BTreeSet, HashMap};
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

/// The schema facts, as `scripts/gen-openapi` wrote them, one definition a line, with the
/// descriptions `build.rs` added.
pub const SCHEMAS_TEXT: &str = include_str!(concat!(env!("OUT_DIR"), "/openapi_schemas.txt"));

/// Prefix of a reference to a schema in an OpenAPI v3 document.
pub const V3_REF: &str = "#/components/schemas/";
/// Prefix of a reference to a definition in an OpenAPI v2 document.
pub const V2_REF: &str = "#/definitions/";

/// One definition: its JSON text in the embedded data, parsed when first needed.
struct Definition {
    text: &'static str,
    parsed: OnceLock<Value>,
}

/// The built-in schemas, by definition name, with an index by group-version-kind.
///
/// Definitions stay text until something needs one as a value (field validation, the v2
/// conversion): documents copy the text, so serving OpenAPI parses almost nothing.
pub struct Schemas {
    defs: HashMap<&'static str, Definition>,
    by_gvk: HashMap<(&'static str, &'static str, &'static str), &'static str>,
}

impl Schemas {
    fn parse(text: &'static str) -> Schemas {
        let mut defs = HashMap::new();
        let mut by_gvk = HashMap::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let mut parts = line.splitn(3, ' ');
            let (Some(name), Some(gvks), Some(json)) = (parts.next(), parts.next(), parts.next())
            else {
                tracing::error!(line, "malformed line in the embedded OpenAPI schemas");
                continue;
            };
            let gvks: Vec<&str> = gvks.split(',').filter(|g| *g != "-").collect();
            // DeleteOptions and WatchEvent name every group version; they are no
            // resource's schema.
            if let [gvk] = gvks[..] {
                let mut p = gvk.splitn(3, '/');
                if let (Some(g), Some(v), Some(k)) = (p.next(), p.next(), p.next()) {
                    by_gvk.insert((g, v, k), name);
                }
            }
            let d = Definition {
                text: json,
                parsed: OnceLock::new(),
            };
            defs.insert(name, d);
        }
        Schemas { defs, by_gvk }
    }

    /// A definition by name.
    pub fn get(&self, name: &str) -> Option<&Value> {
        let d = self.defs.get(name)?;
        Some(d.parsed.get_or_init(|| {
            serde_json::from_str(d.text).unwrap_or_else(|e| {
                tracing::error!(name, error = %e, "malformed embedded OpenAPI schema");
                Value::Null
            })
        }))
    }

    /// A definition's JSON text.
    pub fn text(&self, name: &str) -> Option<&'static str> {
        self.defs.get(name).map(|d| d.text)
    }

    /// The name as the embedded data holds it (for sets that outlive the caller's string).
    pub fn name(&self, name: &str) -> Option<&'static str> {
        self.defs.get_key_value(name).map(|(n, _)| *n)
    }

    /// Every definition `text` refers to, and the ones those refer to, into `out`.
    pub fn referenced(&self, text: &str, out: &mut BTreeSet<&'static str>) {
        let mut stack: Vec<&str> = vec![text];
        while let Some(t) = stack.pop() {
            for name in refs_in(t) {
                if let (Some(n), Some(d)) = (self.name(name), self.text(name)) {
                    if out.insert(n) {
                        stack.push(d);
                    }
                }
            }
        }
    }

    /// The definition name of a kind (`io.k8s.api.core.v1.Pod` for `/v1, Kind=Pod`).
    pub fn for_kind(&self, group: &str, version: &str, kind: &str) -> Option<&'static str> {
        self.by_gvk.get(&(group, version, kind)).copied()
    }

    /// The definition a schema refers to (through `$ref` or a one-element `allOf`), or the
    /// schema itself.
    pub fn resolve<'a>(&'a self, mut s: &'a Value) -> &'a Value {
        for _ in 0..8 {
            let r = s.get("$ref").and_then(Value::as_str).or_else(|| {
                s.get("allOf")
                    .and_then(Value::as_array)
                    .filter(|a| a.len() == 1)
                    .and_then(|a| a[0].get("$ref"))
                    .and_then(Value::as_str)
            });
            match r
                .and_then(|r| r.strip_prefix(V3_REF))
                .and_then(|n| self.get(n))
            {
                Some(d) => s = d,
                None => return s,
            }
        }
        s
    }
}

/// The names a JSON text refers to (`"$ref":"#/components/schemas/<name>"`).
pub fn refs_in(text: &str) -> impl Iterator<Item = &str> {
    text.split("\"$ref\":\"")
        .skip(1)
        .filter_map(|rest| rest.strip_prefix(V3_REF).and_then(|r| r.split('"').next()))
}

/// The schemas, read on first use.
pub fn schemas() -> &'static Schemas {
    static S: OnceLock<Schemas> = OnceLock::new();
    S.get_or_init(|| Schemas::parse(SCHEMAS_TEXT))
}

/// A v3 schema in v2 form: `#/definitions/` references, and a reference wrapped in
/// `allOf` (v3's way to give it siblings) as a plain `$ref`.
pub fn schema_to_v2(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            if let Some(r) = m
                .get("allOf")
                .and_then(Value::as_array)
                .filter(|a| a.len() == 1)
                .and_then(|a| a[0].get("$ref"))
            {
                // v2 keeps a reference's description beside it (and no default).
                let mut out = json!({"$ref": r.as_str().unwrap_or("").replace(V3_REF, V2_REF)});
                if let Some(d) = m.get("description") {
                    out["description"] = d.clone();
                }
                return out;
            }
            // v2 has no oneOf: IntOrString and Quantity are strings there, and kube-apiserver
            // publishes no defaults in v2.
            let mut out: Map<String, Value> = m
                .iter()
                .filter(|(k, _)| *k != "oneOf" && *k != "default")
                .map(|(k, x)| match (k.as_str(), x) {
                    ("$ref", Value::String(r)) => (k.clone(), json!(r.replace(V3_REF, V2_REF))),
                    // Property names are data, not schemas.
                    ("properties", Value::Object(props)) => (
                        k.clone(),
                        Value::Object(
                            props
                                .iter()
                                .map(|(p, s)| (p.clone(), schema_to_v2(s)))
                                .collect(),
                        ),
                    ),
                    // Extension values are data.
                    (e, _) if e.starts_with("x-") => (k.clone(), x.clone()),
                    _ => (k.clone(), schema_to_v2(x)),
                })
                .collect();
            if m.contains_key("oneOf") && !m.contains_key("type") {
                out.insert("type".into(), json!("string"));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(schema_to_v2).collect()),
        other => other.clone(),
    }
}

/// A v3 operation in v2 form.
pub fn operation_to_v2(op: &Value) -> Value {
    let mut out = Map::new();
    let mut params: Vec<Value> = Vec::new();
    let mut consumes: Vec<Value> = Vec::new();
    for (k, v) in op.as_object().into_iter().flatten() {
        match k.as_str() {
            "parameters" => params.extend(v.as_array().into_iter().flatten().map(param_to_v2)),
            "requestBody" => {
                let c = v.get("content").and_then(Value::as_object);
                let schema = c
                    .and_then(|c| c.values().next())
                    .and_then(|x| x.get("schema"))
                    .map(schema_to_v2)
                    .unwrap_or(Value::Null);
                consumes.extend(c.into_iter().flat_map(|c| c.keys()).map(|k| json!(k)));
                params.push(
                    json!({"name": "body", "in": "body", "required": true, "schema": schema}),
                );
            }
            "responses" => {
                let mut rs = Map::new();
                for (code, r) in v.as_object().into_iter().flatten() {
                    let mut x = json!({"description": status_text(code)});
                    if let Some(s) = r
                        .get("content")
                        .and_then(Value::as_object)
                        .and_then(|c| c.values().next())
                        .and_then(|c| c.get("schema"))
                    {
                        x["schema"] = schema_to_v2(s);
                    }
                    rs.insert(code.clone(), x);
                }
                out.insert(k.clone(), Value::Object(rs));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if !consumes.is_empty() {
        out.insert("consumes".into(), Value::Array(consumes));
    }
    out.insert(
        "produces".into(),
        json!(["application/json", "application/yaml"]),
    );
    out.insert("schemes".into(), json!(["https"]));
    if !params.is_empty() {
        out.insert("parameters".into(), Value::Array(params));
    }
    Value::Object(out)
}

/// A v3 path item (operations and shared parameters) in v2 form.
pub fn path_item_to_v2(item: &Value) -> Value {
    let m: Map<String, Value> = item
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, x)| {
            let x = if k == "parameters" {
                let ps = x.as_array().into_iter().flatten();
                Value::Array(ps.map(param_to_v2).collect())
            } else {
                operation_to_v2(x)
            };
            (k.clone(), x)
        })
        .collect();
    Value::Object(m)
}

/// A v3 parameter in v2 form.
pub fn param_to_v2(p: &Value) -> Value {
    let mut out = json!({
        "name": p.get("name").cloned().unwrap_or(Value::Null),
        "in": p.get("in").cloned().unwrap_or(Value::Null),
        "type": p.pointer("/schema/type").cloned().unwrap_or(json!("string")),
        "uniqueItems": true,
    });
    if p.get("required") == Some(&json!(true)) {
        out["required"] = json!(true);
    }
    out
}

fn status_text(code: &str) -> &'static str {
    match code {
        "200" => "OK",
        "201" => "Created",
        "202" => "Accepted",
        "401" => "Unauthorized",
        _ => "",
    }
}

/// A parameter of an operation (path parameters are required).
pub fn param(name: &str, in_: &str, type_: &str) -> Value {
    let mut p = json!({"name": name, "in": in_, "schema": {"type": type_, "uniqueItems": true}});
    if in_ == "path" {
        p["required"] = json!(true);
    }
    p
}

/// Query parameters by (name, type).
pub fn query(names: &[(&str, &str)]) -> Vec<Value> {
    names.iter().map(|(n, t)| param(n, "query", t)).collect()
}

/// The query parameters of each kind of operation, as the generic API server lists them.
pub const LIST_PARAMS: &[(&str, &str)] = &[
    ("allowWatchBookmarks", "boolean"),
    ("continue", "string"),
    ("fieldSelector", "string"),
    ("labelSelector", "string"),
    ("limit", "integer"),
    ("resourceVersion", "string"),
    ("resourceVersionMatch", "string"),
    ("sendInitialEvents", "boolean"),
    ("timeoutSeconds", "integer"),
    ("watch", "boolean"),
];
pub const WRITE_PARAMS: &[(&str, &str)] = &[
    ("dryRun", "string"),
    ("fieldManager", "string"),
    ("fieldValidation", "string"),
];
pub const PATCH_PARAMS: &[(&str, &str)] = &[
    ("dryRun", "string"),
    ("fieldManager", "string"),
    ("fieldValidation", "string"),
    ("force", "boolean"),
];
pub const DELETE_PARAMS: &[(&str, &str)] = &[
    ("dryRun", "string"),
    ("gracePeriodSeconds", "integer"),
    (
        "ignoreStoreReadErrorWithClusterBreakingPotential",
        "boolean",
    ),
    ("orphanDependents", "boolean"),
    ("propagationPolicy", "string"),
];
pub const DELETE_COLLECTION_PARAMS: &[(&str, &str)] = &[
    ("continue", "string"),
    ("dryRun", "string"),
    ("fieldSelector", "string"),
    ("gracePeriodSeconds", "integer"),
    (
        "ignoreStoreReadErrorWithClusterBreakingPotential",
        "boolean",
    ),
    ("labelSelector", "string"),
    ("limit", "integer"),
    ("orphanDependents", "boolean"),
    ("propagationPolicy", "string"),
    ("resourceVersion", "string"),
    ("resourceVersionMatch", "string"),
    ("sendInitialEvents", "boolean"),
    ("timeoutSeconds", "integer"),
];
