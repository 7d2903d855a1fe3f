//! Objects walked with their OpenAPI schema, as structured-merge-diff walks typed values:
//! the set of fields an object sets, the comparison of two objects, the merge of an applied
//! configuration into a live object and the removal of a set of fields.
//!
//! The schema decides how each node merges: structs and maps field by field unless
//! `x-kubernetes-map-type: atomic`; lists as a whole (`atomic`), by value (`set`) or by their
//! key fields (`map`, `x-kubernetes-list-map-keys`), falling back on the patch strategy
//! (`merge` with a merge key) as upstream's schema conversion does. Nodes without a schema
//! are deduced from their value: objects merge by field, lists are atomic.

use serde_json::{Map, Value};

use super::fieldpath::{Pe, Set};
use crate::openapi::Schemas;

/// How a list merges.
#[derive(Clone, Debug, PartialEq)]
enum ListKind {
    Atomic,
    Set,
    Assoc(Vec<String>),
}

/// The shape of a schema node.
enum Shape<'a> {
    Scalar,
    /// Named fields (`properties`).
    Struct {
        props: &'a Map<String, Value>,
        atomic: bool,
        /// `x-kubernetes-preserve-unknown-fields`: other fields are kept, untyped.
        open: bool,
    },
    /// A map of one element type (`additionalProperties`).
    Map {
        elem: Option<&'a Value>,
        atomic: bool,
    },
    List {
        elem: Option<&'a Value>,
        kind: ListKind,
    },
    /// No schema: deduced from the value.
    Untyped,
}

/// A schema node (None: no schema).
pub type Schema<'a> = Option<&'a Value>;

/// Walks values against the built-in schemas.
#[derive(Clone, Copy)]
pub struct Typer<'a> {
    pub schemas: &'a Schemas,
}

/// What changed from one object to another.
#[derive(Default, Debug)]
pub struct Comparison {
    pub added: Set,
    pub modified: Set,
    pub removed: Set,
}

fn attr<'a>(raw: &'a Value, resolved: &'a Value, k: &str) -> Option<&'a Value> {
    raw.get(k).or_else(|| resolved.get(k))
}

impl<'a> Typer<'a> {
    fn shape(&self, s: Schema<'a>) -> Shape<'a> {
        let Some(raw) = s else { return Shape::Untyped };
        let r = self.schemas.resolve(raw);
        let type_ = attr(raw, r, "type").and_then(Value::as_str);
        if attr(raw, r, "x-kubernetes-int-or-string").is_some()
            || attr(raw, r, "format").and_then(Value::as_str) == Some("int-or-string")
        {
            return Shape::Scalar;
        }
        if type_ == Some("array") || r.get("items").is_some() {
            let list_type = attr(raw, r, "x-kubernetes-list-type").and_then(Value::as_str);
            let strategy = attr(raw, r, "x-kubernetes-patch-strategy")
                .and_then(Value::as_str)
                .unwrap_or("");
            let kind = match list_type {
                Some("atomic") => ListKind::Atomic,
                Some("set") => ListKind::Set,
                Some("map") => ListKind::Assoc(
                    attr(raw, r, "x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|k| k.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default(),
                ),
                _ if strategy.split(',').any(|s| s == "merge") => {
                    match attr(raw, r, "x-kubernetes-patch-merge-key").and_then(Value::as_str) {
                        Some(k) => ListKind::Assoc(vec![k.to_owned()]),
                        None => ListKind::Set,
                    }
                }
                _ => ListKind::Atomic,
            };
            return Shape::List {
                elem: r.get("items"),
                kind,
            };
        }
        let atomic =
            attr(raw, r, "x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic");
        if let Some(props) = r.get("properties").and_then(Value::as_object) {
            let open =
                attr(raw, r, "x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            return Shape::Struct {
                props,
                atomic,
                open,
            };
        }
        if let Some(ap) = r.get("additionalProperties") {
            return Shape::Map {
                elem: ap.as_object().map(|_| ap),
                atomic,
            };
        }
        match type_ {
            Some("object") | None => Shape::Untyped,
            Some(_) => Shape::Scalar,
        }
    }

    /// The shape of a node with its value: nodes without a schema are deduced.
    fn shape_of(&self, s: Schema<'a>, v: Option<&Value>) -> Shape<'a> {
        match self.shape(s) {
            Shape::Untyped => match v {
                Some(Value::Object(_)) => Shape::Map {
                    elem: None,
                    atomic: false,
                },
                Some(Value::Array(_)) => Shape::List {
                    elem: None,
                    kind: ListKind::Atomic,
                },
                _ => Shape::Scalar,
            },
            other => other,
        }
    }

    fn field_schema(shape: &Shape<'a>, key: &str) -> Schema<'a> {
        match shape {
            Shape::Struct { props, .. } => props.get(key),
            Shape::Map { elem, .. } => *elem,
            _ => None,
        }
    }

    /// The path element of a list item; a key field the item lacks takes its schema
    /// default (a container port without protocol is `"protocol":"TCP"`), as upstream.
    fn item_pe(&self, kind: &ListKind, elem: Schema<'a>, i: usize, item: &Value) -> Pe {
        match kind {
            ListKind::Atomic => Pe::Index(i as i64),
            ListKind::Set => Pe::Value(item.clone()),
            ListKind::Assoc(keys) => {
                let props = elem
                    .map(|e| self.schemas.resolve(e))
                    .and_then(|e| e.get("properties"));
                let mut k: Vec<(String, Value)> = keys
                    .iter()
                    .filter_map(|k| {
                        let v = item.get(k).or_else(|| {
                            props.and_then(|p| p.get(k)).and_then(|p| p.get("default"))
                        })?;
                        Some((k.clone(), v.clone()))
                    })
                    .collect();
                k.sort_by(|a, b| a.0.cmp(&b.0));
                Pe::Key(k)
            }
        }
    }

    /// Items of a list by path element, first occurrence kept.
    fn index_items<'v>(
        &self,
        kind: &ListKind,
        elem: Schema<'a>,
        list: &'v [Value],
    ) -> Vec<(Pe, &'v Value)> {
        let mut out: Vec<(Pe, &Value)> = Vec::new();
        for (i, item) in list.iter().enumerate() {
            let pe = self.item_pe(kind, elem, i, item);
            if !out.iter().any(|(p, _)| *p == pe) {
                out.push((pe, item));
            }
        }
        out
    }

    /// The set of fields `v` sets (upstream's ToFieldSet).
    pub fn field_set(&self, v: &Value, s: Schema<'a>) -> Set {
        let mut out = Set::new();
        self.field_set_at(v, s, &mut Vec::new(), &mut out);
        out
    }

    fn field_set_at(&self, v: &Value, s: Schema<'a>, path: &mut Vec<Pe>, out: &mut Set) {
        let shape = self.shape_of(s, Some(v));
        match &shape {
            Shape::Scalar
            | Shape::Untyped
            | Shape::List {
                kind: ListKind::Atomic,
                ..
            }
            | Shape::Struct { atomic: true, .. }
            | Shape::Map { atomic: true, .. } => out.insert(path),
            Shape::List { elem, kind } => {
                let Some(list) = v.as_array() else { return };
                for (i, item) in list.iter().enumerate() {
                    path.push(self.item_pe(kind, *elem, i, item));
                    self.field_set_at(item, *elem, path, out);
                    out.insert(path);
                    path.pop();
                }
            }
            Shape::Struct { .. } | Shape::Map { .. } => {
                let Some(m) = v.as_object() else { return };
                for (k, child) in m {
                    path.push(Pe::Field(k.clone()));
                    self.field_set_at(child, Self::field_schema(&shape, k), path, out);
                    if !matches!(shape, Shape::Struct { props, .. } if props.contains_key(k)) {
                        out.insert(path);
                    }
                    path.pop();
                }
            }
        }
    }

    /// What of `v` its schema does not allow, as upstream's typed conversion reports it
    /// (`.spec.foo: field not declared in schema`).
    pub fn validate(&self, v: &Value, s: Schema<'a>) -> Vec<String> {
        let mut errs = Vec::new();
        self.validate_at(v, s, &mut Vec::new(), &mut errs);
        errs
    }

    fn validate_at(&self, v: &Value, s: Schema<'a>, path: &mut Vec<Pe>, errs: &mut Vec<String>) {
        let shape = self.shape_of(s, Some(v));
        match &shape {
            Shape::Struct { props, open, .. } => {
                let Some(m) = v.as_object() else { return };
                for (k, child) in m {
                    path.push(Pe::Field(k.clone()));
                    match props.get(k) {
                        Some(p) => self.validate_at(child, Some(p), path, errs),
                        None if *open => {}
                        None => errs.push(format!(
                            "{}: field not declared in schema",
                            super::fieldpath::PathDisplay(path)
                        )),
                    }
                    path.pop();
                }
            }
            Shape::Map { elem, .. } => {
                let Some(m) = v.as_object() else { return };
                for (k, child) in m {
                    path.push(Pe::Field(k.clone()));
                    self.validate_at(child, *elem, path, errs);
                    path.pop();
                }
            }
            Shape::List { elem, kind } => {
                let Some(list) = v.as_array() else { return };
                for (i, item) in list.iter().enumerate() {
                    path.push(self.item_pe(kind, *elem, i, item));
                    self.validate_at(item, *elem, path, errs);
                    path.pop();
                }
            }
            Shape::Scalar => {
                let declared = s
                    .map(|s| self.schemas.resolve(s))
                    .and_then(|r| r.get("type"))
                    .and_then(Value::as_str);
                // A number or boolean where a string belongs (`key: 1` in YAML), printed
                // as Go prints the value it got.
                if declared == Some("string") && (v.is_number() || v.is_boolean()) {
                    errs.push(format!(
                        "{}: expected string, got &value.valueUnstructured{{Value:{v}}}",
                        super::fieldpath::PathDisplay(path)
                    ));
                }
            }
            Shape::Untyped => {}
        }
    }

    /// What changed from `lhs` to `rhs` (upstream's Compare).
    pub fn compare(&self, lhs: &Value, rhs: &Value, s: Schema<'a>) -> Comparison {
        let mut c = Comparison::default();
        self.compare_at(Some(lhs), Some(rhs), s, &mut Vec::new(), &mut c);
        c
    }

    fn compare_at(
        &self,
        lhs: Option<&Value>,
        rhs: Option<&Value>,
        s: Schema<'a>,
        path: &mut Vec<Pe>,
        c: &mut Comparison,
    ) {
        // Equal subtrees have no differences whatever their schema: most of an updated
        // object is unchanged, and this skips it without resolving types or indexing lists.
        if let (Some(l), Some(r)) = (lhs, rhs) {
            if l == r {
                return;
            }
        }
        let shape = self.shape_of(s, rhs.or(lhs));
        let leaf = |c: &mut Comparison| match (lhs, rhs) {
            (None, _) => c.added.insert(path),
            (_, None) => c.removed.insert(path),
            (Some(l), Some(r)) if l != r => c.modified.insert(path),
            _ => {}
        };
        match &shape {
            Shape::Scalar | Shape::Untyped => return leaf(c),
            Shape::List { elem, kind } => {
                let empty = Vec::new();
                let l = lhs.and_then(Value::as_array).unwrap_or(&empty);
                let r = rhs.and_then(Value::as_array).unwrap_or(&empty);
                if *kind == ListKind::Atomic || (l.is_empty() && r.is_empty()) {
                    return leaf(c);
                }
                let li = self.index_items(kind, *elem, l);
                let ri = self.index_items(kind, *elem, r);
                for (pe, rv) in &ri {
                    let lv = li.iter().find(|(p, _)| p == pe).map(|(_, v)| *v);
                    path.push(pe.clone());
                    self.compare_at(lv, Some(rv), *elem, path, c);
                    path.pop();
                }
                for (pe, lv) in &li {
                    if !ri.iter().any(|(p, _)| p == pe) {
                        path.push(pe.clone());
                        self.compare_at(Some(lv), None, *elem, path, c);
                        path.pop();
                    }
                }
            }
            Shape::Struct { atomic, .. } | Shape::Map { atomic, .. } => {
                let empty = Map::new();
                let l = lhs.and_then(Value::as_object).unwrap_or(&empty);
                let r = rhs.and_then(Value::as_object).unwrap_or(&empty);
                if *atomic || (l.is_empty() && r.is_empty()) {
                    return leaf(c);
                }
                let keys: std::collections::BTreeSet<&String> = l.keys().chain(r.keys()).collect();
                for k in keys {
                    path.push(Pe::Field(k.clone()));
                    self.compare_at(l.get(k), r.get(k), Self::field_schema(&shape, k), path, c);
                    path.pop();
                }
            }
        }
        match (lhs, rhs) {
            (None, _) => c.added.insert(path),
            (_, None) => c.removed.insert(path),
            _ => {}
        }
    }

    /// `rhs` merged into `lhs` (upstream's Merge: the applied configuration wins).
    pub fn merge(&self, lhs: &Value, rhs: &Value, s: Schema<'a>) -> Value {
        let shape = self.shape_of(s, Some(rhs));
        match &shape {
            Shape::List { elem, kind } if *kind != ListKind::Atomic => {
                let (Some(l), Some(r)) = (lhs.as_array(), rhs.as_array()) else {
                    return rhs.clone();
                };
                let ri = self.index_items(kind, *elem, r);
                let li = self.index_items(kind, *elem, l);
                let mut out = Vec::new();
                for (pe, lv) in &li {
                    match ri.iter().find(|(p, _)| p == pe) {
                        Some((_, rv)) => out.push(self.merge(lv, rv, *elem)),
                        None => out.push((*lv).clone()),
                    }
                }
                for (pe, rv) in &ri {
                    if !li.iter().any(|(p, _)| p == pe) {
                        out.push((*rv).clone());
                    }
                }
                Value::Array(out)
            }
            Shape::Struct { atomic: false, .. } | Shape::Map { atomic: false, .. } => {
                let (Some(l), Some(r)) = (lhs.as_object(), rhs.as_object()) else {
                    return rhs.clone();
                };
                let mut out = l.clone();
                for (k, rv) in r {
                    let merged = match l.get(k) {
                        Some(lv) => self.merge(lv, rv, Self::field_schema(&shape, k)),
                        None => rv.clone(),
                    };
                    out.insert(k.clone(), merged);
                }
                Value::Object(out)
            }
            _ => rhs.clone(),
        }
    }

    /// `v` without the items and fields that are members of `set` (upstream's RemoveItems).
    pub fn remove_items(&self, v: &Value, set: &Set, s: Schema<'a>) -> Value {
        let shape = self.shape_of(s, Some(v));
        match &shape {
            Shape::List { elem, kind } if *kind != ListKind::Atomic => {
                let Some(list) = v.as_array() else {
                    return v.clone();
                };
                let mut out = Vec::new();
                for (i, item) in list.iter().enumerate() {
                    let pe = self.item_pe(kind, *elem, i, item);
                    if set.member(&pe) {
                        continue;
                    }
                    match set.child(&pe) {
                        Some(c) => out.push(self.remove_items(item, c, *elem)),
                        None => out.push(item.clone()),
                    }
                }
                Value::Array(out)
            }
            Shape::Struct { atomic: false, .. } | Shape::Map { atomic: false, .. } => {
                let Some(m) = v.as_object() else {
                    return v.clone();
                };
                let mut out = Map::new();
                for (k, child) in m {
                    let pe = Pe::Field(k.clone());
                    if set.member(&pe) {
                        continue;
                    }
                    let kept = match set.child(&pe) {
                        Some(c) => {
                            let field = Self::field_schema(&shape, k);
                            let kept = self.remove_items(child, c, field);
                            // Go omits the maps and lists removal emptied (`omitempty`), so
                            // upstream's objects lose them; emptied structs stay.
                            let emptied = match (&kept, child) {
                                (Value::Array(a), Value::Array(b)) => a.is_empty() && !b.is_empty(),
                                (Value::Object(a), Value::Object(b)) => {
                                    a.is_empty()
                                        && !b.is_empty()
                                        && !matches!(self.shape(field), Shape::Struct { .. })
                                }
                                _ => false,
                            };
                            if emptied {
                                continue;
                            }
                            kept
                        }
                        None => child.clone(),
                    };
                    out.insert(k.clone(), kept);
                }
                Value::Object(out)
            }
            _ => v.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod_schema() -> &'static Value {
        let s = crate::openapi::schemas();
        s.get(s.for_kind("", "v1", "Pod").unwrap()).unwrap()
    }

    #[test]
    fn field_sets_follow_the_schema() {
        let t = Typer {
            schemas: crate::openapi::schemas(),
        };
        let pod = json!({
            "metadata": {"labels": {"a": "b"}, "finalizers": ["x"]},
            "spec": {"containers": [{"name": "web", "image": "nginx", "args": ["a"], "resources": {}}]},
        });
        let set = t.field_set(&pod, Some(pod_schema()));
        assert_eq!(
            set.to_fields_v1(),
            json!({
                "f:metadata": {"f:labels": {"f:a": {}}, "f:finalizers": {"v:\"x\"": {}}},
                "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {
                    ".": {}, "f:name": {}, "f:image": {}, "f:args": {}
                }}},
            })
        );
    }

    #[test]
    fn compare_marks_new_maps_and_items() {
        let t = Typer {
            schemas: crate::openapi::schemas(),
        };
        let old = json!({"metadata": {}, "spec": {"containers": null}, "status": {}});
        let new = json!({
            "metadata": {"labels": {"run": "p"}},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            "status": {},
        });
        let c = t.compare(&old, &new, Some(pod_schema()));
        assert_eq!(
            c.added.to_fields_v1(),
            json!({
                "f:metadata": {"f:labels": {".": {}, "f:run": {}}},
                "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:name": {}, "f:image": {}}}},
            })
        );
        assert!(c.modified.is_empty() && c.removed.is_empty());
    }

    #[test]
    fn values_of_the_wrong_type_do_not_panic() {
        let t = Typer {
            schemas: crate::openapi::schemas(),
        };
        let odd = [
            json!({"spec": "x"}),
            json!({"spec": {"containers": {"a": 1}}}),
            json!({"spec": {"containers": [1, "a", null, [], {"name": 3}]}}),
            json!({"metadata": {"labels": [1], "finalizers": {"a": "b"}}}),
            json!([1, 2]),
            json!(null),
        ];
        for a in &odd {
            for b in &odd {
                let merged = t.merge(a, b, Some(pod_schema()));
                let set = t.field_set(&merged, Some(pod_schema()));
                t.compare(a, b, Some(pod_schema()));
                t.remove_items(&merged, &set, Some(pod_schema()));
            }
        }
    }

    #[test]
    fn merge_and_remove_by_keys() {
        let t = Typer {
            schemas: crate::openapi::schemas(),
        };
        let live = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        let cfg = json!({"spec": {"containers": [{"name": "b", "image": "z"}]}});
        let merged = t.merge(&live, &cfg, Some(pod_schema()));
        assert_eq!(merged["spec"]["containers"][1]["image"], "z");
        assert_eq!(merged["spec"]["containers"][0]["image"], "x");
        let mut rm = Set::new();
        rm.insert(&[
            Pe::Field("spec".into()),
            Pe::Field("containers".into()),
            Pe::Key(vec![("name".into(), json!("a"))]),
        ]);
        let pruned = t.remove_items(&merged, &rm, Some(pod_schema()));
        assert_eq!(
            pruned["spec"]["containers"],
            json!([{"name": "b", "image": "z"}])
        );
    }
}
