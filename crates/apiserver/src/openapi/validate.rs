//! Server-side field validation: unknown and duplicate fields of a request body, found by
//! walking its JSON text against the resource's schema, as upstream's strict decoder reports
//! them (in document order, `unknown field "spec.foo"`, `duplicate field "metadata.name"`).
//!
//! The walk reads the body's text rather than a decoded value because a decoded value has
//! neither the duplicates nor the document order.

use std::collections::{BTreeMap, HashSet};

use kumo_apimachinery::status::ApiError;
use kumo_apimachinery::validation::{self, FieldError, Path};
use serde_json::{Map, Value};

use super::{schemas, Schemas};
use crate::registry::Resource;

/// Problems found in a body, each as upstream words it (`unknown field "x"`).
pub type FieldProblems = Vec<String>;

/// What the `fieldValidation` parameter asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Directive {
    Ignore,
    /// The default: problems become `Warning` headers.
    Warn,
    Strict,
}

impl Directive {
    /// The directive of a write request; `options` names the options kind for the error
    /// (`CreateOptions`, `UpdateOptions`, `PatchOptions`).
    pub fn of(query: &BTreeMap<String, String>, options: &str) -> Result<Directive, ApiError> {
        match query.get("fieldValidation").map(String::as_str) {
            None | Some("") | Some("Warn") => Ok(Directive::Warn),
            Some("Ignore") => Ok(Directive::Ignore),
            Some("Strict") => Ok(Directive::Strict),
            Some(other) => {
                let errs = [FieldError::not_supported(
                    &Path::new("fieldValidation"),
                    other,
                    &["", "Ignore", "Strict", "Warn"],
                )];
                let kind = format!("{options}.meta.k8s.io");
                Err(ApiError::invalid(
                    "meta.k8s.io",
                    options,
                    "",
                    validation::invalid_message(&kind, "", &errs),
                    errs.iter().map(FieldError::to_cause).collect(),
                ))
            }
        }
    }
}

/// Field validation of a create or update body: the problems as warnings (Warn), or the
/// strict decoding error (Strict). Also the body's fields the schema does not know, which
/// the caller prunes.
pub fn check_fields(
    res: &Resource,
    query: &BTreeMap<String, String>,
    options: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<FieldProblems, ApiError> {
    let directive = Directive::of(query, options)?;
    if directive == Directive::Ignore {
        return Ok(Vec::new());
    }
    let essence = content_type
        .and_then(|c| c.split(';').next())
        .map(str::trim)
        .unwrap_or("application/json");
    // YAML's repeated keys come first, as yaml.v2's strict errors: in one `yaml: unmarshal
    // errors:` problem for Strict, one warning per key for Warn.
    let mut problems = Vec::new();
    if essence == "application/yaml" {
        let dups = kumo_apimachinery::yaml::duplicate_keys(body);
        if !dups.is_empty() && directive == Directive::Strict {
            problems.push(format!("yaml: unmarshal errors:\n  {}", dups.join("\n  ")));
        } else {
            problems.extend(dups);
        }
    }
    let Some(schema) = resource_schema(res) else {
        // A custom resource: its strategy knows its schema.
        if let Ok(obj) = crate::negotiate::decode_body(content_type, body) {
            problems.extend(unknown_by_strategy(res, &obj));
        }
        return strict_or_warn(res, directive, problems);
    };
    problems.extend(match essence {
        "application/json" | "" => walk(body, Some(schema), true, true),
        // Walked as the JSON it decodes to: serde_yaml's Value keeps the mapping order
        // (for the order of the problems) but refuses repeated keys, which the lax decode
        // reads.
        "application/yaml" => match serde_yaml::from_slice::<serde_yaml::Value>(body)
            .ok()
            .and_then(|v| serde_json::to_vec(&v).ok())
            .or_else(|| {
                let v = kumo_apimachinery::yaml::from_slice_lax(body).ok()?;
                serde_json::to_vec(&v).ok()
            }) {
            Some(json) => walk(&json, Some(schema), true, true),
            None => Vec::new(),
        },
        // Protobuf bodies cannot carry unknown fields.
        _ => Vec::new(),
    });
    strict_or_warn(res, directive, problems)
}

/// The unknown fields a strategy reports, worded as the schema walk words them.
fn unknown_by_strategy(res: &Resource, obj: &Value) -> FieldProblems {
    res.strategy
        .unknown_fields(obj)
        .iter()
        .map(|f| format!("unknown field {}", quoted(f)))
        .collect()
}

/// The problems as warnings, or upstream's strict decoding error.
fn strict_or_warn(
    res: &Resource,
    directive: Directive,
    problems: FieldProblems,
) -> Result<FieldProblems, ApiError> {
    match directive {
        Directive::Strict if !problems.is_empty() => Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
            problems.join(", "),
            kind = res.kind,
            version = res.version,
        ))),
        _ => Ok(problems),
    }
}

/// Field validation of a patch: duplicate fields of the patch itself, then unknown fields
/// of the patched object. Strict answers upstream's 422 on the `patch` field.
pub fn check_patched(
    res: &Resource,
    query: &BTreeMap<String, String>,
    patch_type: &str,
    patch: &[u8],
    patched: &Value,
) -> Result<FieldProblems, ApiError> {
    let directive = Directive::of(query, "PatchOptions")?;
    if directive == Directive::Ignore {
        return Ok(Vec::new());
    }
    let mut problems = Vec::new();
    if patch_type != "application/json-patch+json" {
        problems.extend(walk(patch, None, false, true));
    }
    let text = serde_json::to_vec(patched).unwrap_or_default();
    match resource_schema(res) {
        Some(schema) => problems.extend(walk(&text, Some(schema), true, false)),
        // A custom resource: its strategy knows its schema.
        None => problems.extend(unknown_by_strategy(res, patched)),
    }
    if directive == Directive::Strict && !problems.is_empty() {
        // Upstream shows the patched object, or for a strategic merge patch the patch
        // itself as a Go map.
        let shown = if patch_type == "application/strategic-merge-patch+json" {
            serde_json::from_slice::<Value>(patch)
                .map(|p| go_map(&p))
                .unwrap_or_default()
        } else {
            String::from_utf8_lossy(&text).into_owned()
        };
        let errs = [FieldError::invalid(
            &Path::new("patch"),
            shown,
            format!("strict decoding error: {}", problems.join(", ")),
        )];
        return Err(ApiError::invalid(
            "",
            "",
            "",
            validation::invalid_message("", "", &errs),
            errs.iter().map(FieldError::to_cause).collect(),
        ));
    }
    Ok(problems)
}

/// Removes from `obj` the fields its schema does not know, as upstream's decoding into
/// typed objects drops them.
pub fn prune(res: &Resource, obj: &mut Value) {
    if let Some(schema) = resource_schema(res) {
        prune_value(schemas(), schema, obj, 0);
    }
}

fn prune_value(s: &Schemas, schema: &Value, v: &mut Value, depth: usize) {
    if depth > crate::negotiate::MAX_DEPTH {
        return;
    }
    match (shape(s, schema), v) {
        (Shape::Props(props), Value::Object(m)) => {
            m.retain(|k, _| props.contains_key(k));
            for (k, x) in m.iter_mut() {
                if let Some(ps) = props.get(k) {
                    prune_value(s, ps, x, depth + 1);
                }
            }
        }
        (Shape::Map(vs), Value::Object(m)) => {
            for x in m.values_mut() {
                prune_value(s, vs, x, depth + 1);
            }
        }
        (Shape::List(is), Value::Array(a)) => {
            for x in a {
                prune_value(s, is, x, depth + 1);
            }
        }
        _ => {}
    }
}

/// The definition of ObjectMeta.
const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// The fields of `meta` ObjectMeta does not declare, as paths under `path` (the
/// `metadata` field's own path), as upstream's strict decoding of a custom resource's
/// metadata reports them (`metadata.unknownMeta`).
pub(crate) fn object_meta_unknown(meta: &Value, path: &str) -> Vec<String> {
    let s = schemas();
    let mut out = Vec::new();
    if let Some(schema) = s.get(OBJECT_META) {
        unknown_value(s, schema, meta, path, &mut out, 0);
    }
    out
}

/// Drops the fields of `meta` ObjectMeta does not declare.
pub(crate) fn prune_object_meta(meta: &mut Value) {
    let s = schemas();
    if let Some(schema) = s.get(OBJECT_META) {
        prune_value(s, schema, meta, 0);
    }
}

fn unknown_value(
    s: &Schemas,
    schema: &Value,
    v: &Value,
    path: &str,
    out: &mut Vec<String>,
    depth: usize,
) {
    if depth > crate::negotiate::MAX_DEPTH {
        return;
    }
    match (shape(s, schema), v) {
        (Shape::Props(props), Value::Object(m)) => {
            for (k, x) in m {
                match props.get(k) {
                    Some(ps) => unknown_value(s, ps, x, &child(path, k), out, depth + 1),
                    None => out.push(child(path, k)),
                }
            }
        }
        (Shape::Map(vs), Value::Object(m)) => {
            for (k, x) in m {
                unknown_value(s, vs, x, &child(path, k), out, depth + 1);
            }
        }
        (Shape::List(is), Value::Array(a)) => {
            for (i, x) in a.iter().enumerate() {
                unknown_value(s, is, x, &format!("{path}[{i}]"), out, depth + 1);
            }
        }
        _ => {}
    }
}

fn resource_schema(res: &Resource) -> Option<&'static Value> {
    let s = schemas();
    s.get(s.for_kind(res.group, res.version, res.kind)?)
}

/// What a schema says about the shape of a value.
enum Shape<'a> {
    /// An object with known fields.
    Props(&'a Map<String, Value>),
    /// A map with values of one schema.
    Map(&'a Value),
    /// A list with items of one schema.
    List(&'a Value),
    /// Anything (raw extensions, fieldsV1, preserved unknown fields, scalars).
    Opaque,
}

fn shape<'a>(s: &'a Schemas, schema: &'a Value) -> Shape<'a> {
    let d = s.resolve(schema);
    if d.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return Shape::Opaque;
    }
    if let Some(p) = d.get("properties").and_then(Value::as_object) {
        return Shape::Props(p);
    }
    if let Some(a) = d.get("additionalProperties").filter(|a| a.is_object()) {
        return Shape::Map(a);
    }
    if let Some(i) = d.get("items") {
        return Shape::List(i);
    }
    Shape::Opaque
}

/// Walks a JSON text. With a schema, known fields are followed and (if `unknown`) unknown
/// ones reported; without one (a patch), every object is checked for duplicates only.
fn walk(text: &[u8], schema: Option<&Value>, unknown: bool, duplicates: bool) -> FieldProblems {
    let mut w = Walker {
        b: text,
        i: 0,
        s: schemas(),
        out: Vec::new(),
        unknown,
        duplicates,
    };
    // A malformed text (already refused by the decoder) ends the walk early.
    let _ = w.value(schema, "", 0);
    w.out
}

struct Walker<'a> {
    b: &'a [u8],
    i: usize,
    s: &'a Schemas,
    out: Vec<String>,
    unknown: bool,
    duplicates: bool,
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

impl Walker<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    fn string(&mut self) -> Option<String> {
        self.ws();
        let start = self.i;
        if self.b.get(self.i) != Some(&b'"') {
            return None;
        }
        self.i += 1;
        while self.i < self.b.len() {
            match self.b[self.i] {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    return serde_json::from_slice(&self.b[start..self.i]).ok();
                }
                _ => self.i += 1,
            }
        }
        None
    }

    /// Skips a scalar (number, true, false, null).
    fn scalar(&mut self) -> Option<()> {
        let start = self.i;
        while self.i < self.b.len()
            && !matches!(self.b[self.i], b',' | b'}' | b']')
            && !self.b[self.i].is_ascii_whitespace()
        {
            self.i += 1;
        }
        (self.i > start).then_some(())
    }

    fn value(&mut self, schema: Option<&Value>, path: &str, depth: usize) -> Option<()> {
        if depth > crate::negotiate::MAX_DEPTH {
            return None;
        }
        let shape = match schema {
            Some(sc) => Some(shape(self.s, sc)),
            None => None,
        };
        match self.peek()? {
            b'{' => {
                self.i += 1;
                let mut seen = HashSet::new();
                let mut reported = HashSet::new();
                if self.peek()? == b'}' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    let key = self.string()?;
                    self.eat(b':')?;
                    let field = child(path, &key);
                    let (known, next): (bool, Option<&Value>) = match &shape {
                        Some(Shape::Props(p)) => match p.get(&key) {
                            Some(ps) => (true, Some(ps)),
                            None => (false, None),
                        },
                        Some(Shape::Map(vs)) => (true, Some(*vs)),
                        // Opaque: nothing inside is checked.
                        Some(Shape::Opaque) | Some(Shape::List(_)) => (true, None),
                        None => (true, None),
                    };
                    let opaque = matches!(shape, Some(Shape::Opaque) | Some(Shape::List(_)));
                    if known {
                        if !seen.insert(key.clone()) && self.duplicates && !opaque {
                            self.out.push(format!("duplicate field {}", quoted(&field)));
                        }
                        if opaque {
                            self.skip(depth + 1)?;
                        } else {
                            self.value(next, &field, depth + 1)?;
                        }
                    } else {
                        if self.unknown && reported.insert(key.clone()) {
                            self.out.push(format!("unknown field {}", quoted(&field)));
                        }
                        self.skip(depth + 1)?;
                    }
                    match self.peek()? {
                        b',' => self.i += 1,
                        b'}' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let item = match &shape {
                    Some(Shape::List(i)) => Some(Some(*i)),
                    None => Some(None),
                    _ => None,
                };
                if self.peek()? == b']' {
                    self.i += 1;
                    return Some(());
                }
                let mut n = 0;
                loop {
                    match item {
                        Some(i) => self.value(i, &format!("{path}[{n}]"), depth + 1)?,
                        None => self.skip(depth + 1)?,
                    }
                    n += 1;
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b'"' => self.string().map(|_| ()),
            _ => self.scalar(),
        }
    }

    /// Skips one value without looking inside.
    fn skip(&mut self, depth: usize) -> Option<()> {
        if depth > crate::negotiate::MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'{' | b'[' => {
                let close = if self.b[self.i] == b'{' { b'}' } else { b']' };
                self.i += 1;
                if self.peek()? == close {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    if close == b'}' {
                        self.string()?;
                        self.eat(b':')?;
                    }
                    self.skip(depth + 1)?;
                    match self.peek()? {
                        b',' => self.i += 1,
                        c if c == close => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b'"' => self.string().map(|_| ()),
            _ => self.scalar(),
        }
    }
}

/// A JSON value as Go's `%v` prints the `map[string]interface{}` it decodes to.
fn go_map(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let inner: Vec<String> = m
                .iter()
                .map(|(k, x)| format!("{k}:{}", go_map(x)))
                .collect();
            format!("map[{}]", inner.join(" "))
        }
        Value::Array(a) => {
            let inner: Vec<String> = a.iter().map(go_map).collect();
            format!("[{}]", inner.join(" "))
        }
        Value::String(s) => s.clone(),
        Value::Null => "<nil>".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_schema() -> &'static Value {
        schemas().get("io.k8s.api.core.v1.Pod").unwrap()
    }

    #[test]
    fn unknown_and_duplicate_fields_in_document_order() {
        let body = br#"{"zz":1,"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":"a","name":"b","labels":{"x":"1","x":"2"},
              "managedFields":[{"fieldsV1":{"f:x":{},"f:x":{}},"q":1}]},
            "spec":{"containers":[{"name":"a","image":"b","foo":1,
               "ports":[{"containerPort":1,"bar":2}],"resources":{"limits":{"cpu":"1"}}}],
              "affinity":{"nodeAffinity":{"x":1}},"overhead":{"x":"1"}},
            "status":{"q":1,"q":2},"zz":3}"#;
        assert_eq!(
            walk(body, Some(pod_schema()), true, true),
            vec![
                r#"unknown field "zz""#,
                r#"duplicate field "metadata.name""#,
                r#"duplicate field "metadata.labels.x""#,
                r#"unknown field "metadata.managedFields[0].q""#,
                r#"unknown field "spec.containers[0].foo""#,
                r#"unknown field "spec.containers[0].ports[0].bar""#,
                r#"unknown field "spec.affinity.nodeAffinity.x""#,
                r#"unknown field "status.q""#,
            ]
        );
    }

    #[test]
    fn patches_report_duplicates_only() {
        let p = br#"{"foo":1,"metadata":{"bar":2,"bar":3},"l":[{"a":1,"a":2}]}"#;
        assert_eq!(
            walk(p, None, false, true),
            vec![
                r#"duplicate field "metadata.bar""#,
                r#"duplicate field "l[0].a""#
            ]
        );
        assert_eq!(
            go_map(&serde_json::json!({"foo":1,"metadata":{"bar":3},"x":[1,"a"]})),
            "map[foo:1 metadata:map[bar:3] x:[1 a]]"
        );
    }

    #[test]
    fn directives_and_body_types() {
        let reg = crate::registry::Registry::builtin();
        let lease = reg.find("coordination.k8s.io", "v1", "leases").unwrap();
        let q = |v: &str| BTreeMap::from([("fieldValidation".to_owned(), v.to_owned())]);
        let yaml = b"apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: a}\nspec: {foo: 1}\n";
        let e = check_fields(
            &lease,
            &q("Strict"),
            "CreateOptions",
            Some("application/yaml"),
            yaml,
        )
        .unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            r#"Lease in version "v1" cannot be handled as a Lease: strict decoding error: unknown field "spec.foo""#
        );
        let w = check_fields(
            &lease,
            &BTreeMap::new(),
            "CreateOptions",
            Some("application/yaml"),
            yaml,
        )
        .unwrap();
        assert_eq!(w, [r#"unknown field "spec.foo""#]);
        let none = check_fields(&lease, &q("Ignore"), "CreateOptions", None, b"{\"x\":1}").unwrap();
        assert!(none.is_empty());
        let e = check_fields(&lease, &q("bogus"), "UpdateOptions", None, b"{}").unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            r#"UpdateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "bogus": supported values: "", "Ignore", "Strict", "Warn""#
        );
        // Patches: duplicates in the patch, unknown fields in the result.
        let patched = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "a"}, "spec": {"foo": 1}});
        let e = check_patched(
            &lease,
            &q("Strict"),
            "application/strategic-merge-patch+json",
            br#"{"spec":{"foo":1,"foo":1}}"#,
            &patched,
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            r#" "" is invalid: patch: Invalid value: "map[spec:map[foo:1]]": strict decoding error: duplicate field "spec.foo", unknown field "spec.foo""#
        );
        let mut obj = patched.clone();
        prune(&lease, &mut obj);
        assert_eq!(obj["spec"], serde_json::json!({}));
    }

    #[test]
    fn malformed_text_ends_the_walk() {
        assert!(walk(br#"{"kind":"#, Some(pod_schema()), true, true).is_empty());
        assert!(walk(b"[1,", None, true, true).is_empty());
        assert!(walk(b"", None, true, true).is_empty());
    }
}
