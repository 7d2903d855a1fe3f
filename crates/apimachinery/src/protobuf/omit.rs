//! What the typed round trip of kube-apiserver leaves out of a built-in object.
//!
//! Upstream decodes a request into the Go struct, stores it as protobuf and answers with the
//! struct marshalled by encoding/json, so a field tagged `omitempty` disappears when it holds
//! its zero value: `metadata.labels: {}`, `finalizers: []`, `workingDir: ""`, `stdin: false`.
//! Pointer fields (`*bool`, `*int32`, `*string`, `*Struct`) keep every set value and only
//! vanish when null; structs are never left out by `omitempty`, only by `omitzero` when
//! zero (the zero `creationTimestamp` of a pod template). The field shapes come from the
//! protobuf schema (its `p`, `o`, `z`, `i` and `j` flags).

use std::sync::OnceLock;

use serde_json::{Map, Value};

use super::schema::{self, Field, Label, Message, Scalar, Schema, Special, Ty};
use super::MAX_DEPTH;

const OBJECT_META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// Removes from `obj` (a built-in object with `apiVersion` and `kind`) the fields its Go
/// type's JSON leaves out when empty. Returns false, changing nothing, when the kind is not
/// a built-in one of the schema (custom resources keep their bodies as sent).
pub fn omit_empty(obj: &mut Value) -> bool {
    let Ok(s) = schema::schema() else {
        return false;
    };
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let Some(i) = s.kind(api_version, kind) else {
        return false;
    };
    if let Some(o) = obj.as_object_mut() {
        walk(s, &s.messages[i], o, 1);
    }
    true
}

/// As [`omit_empty`] for an object's `metadata` alone (an `ObjectMeta`): what upstream does
/// to the metadata of custom resources, which it reads into the Go `ObjectMeta`.
pub fn omit_empty_meta(metadata: &mut Value) {
    static META: OnceLock<Option<usize>> = OnceLock::new();
    let Ok(s) = schema::schema() else {
        return;
    };
    let found = META.get_or_init(|| s.messages.iter().position(|m| m.name == OBJECT_META));
    if let (Some(i), Some(o)) = (found, metadata.as_object_mut()) {
        walk(s, &s.messages[*i], o, 1);
    }
}

fn walk(s: &Schema, m: &Message, obj: &mut Map<String, Value>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    for f in &m.fields {
        if f.skip {
            continue;
        }
        if f.inline {
            // The embedded struct's fields are this object's own.
            if let Ty::Message(i) = f.ty {
                walk(s, &s.messages[i], obj, depth + 1);
            }
            continue;
        }
        let Some(v) = obj.get_mut(f.json) else {
            continue;
        };
        descend(s, f, v, depth);
        if left_out(s, f, v) {
            obj.remove(f.json);
        }
    }
}

/// Normalizes the messages inside one field's value.
fn descend(s: &Schema, f: &Field, v: &mut Value, depth: usize) {
    let Ty::Message(i) = f.ty else {
        return;
    };
    let m = &s.messages[i];
    if m.special != Special::None {
        return;
    }
    match (f.label, v) {
        (Label::Single, Value::Object(o)) => walk(s, m, o, depth + 1),
        (Label::Repeated, Value::Array(items)) => {
            for item in items.iter_mut().filter_map(Value::as_object_mut) {
                walk(s, m, item, depth + 1);
            }
        }
        (Label::Map(_), Value::Object(entries)) => {
            for item in entries.values_mut().filter_map(Value::as_object_mut) {
                walk(s, m, item, depth + 1);
            }
        }
        _ => {}
    }
}

/// Whether encoding/json leaves the field out after the round trip.
fn left_out(s: &Schema, f: &Field, v: &Value) -> bool {
    if !(f.omitempty || f.omitzero) {
        return false;
    }
    // A Go slice or map (protobuf does not tell an empty one from nil).
    let collection = match (f.label, f.ty) {
        (Label::Repeated | Label::Map(_), _) => true,
        (Label::Single, Ty::Scalar(Scalar::Bytes)) => true,
        (Label::Single, Ty::Message(i)) => s.messages[i].special == Special::List,
        (Label::Single, Ty::Scalar(_)) => false,
    };
    if collection {
        return match v {
            Value::Null => true,
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            Value::String(b) => b.is_empty(),
            _ => false,
        };
    }
    if f.pointer {
        // nil: the only pointer value left out.
        return v.is_null();
    }
    match f.ty {
        Ty::Scalar(_) => match v {
            Value::Null => true,
            Value::String(x) => x.is_empty(),
            Value::Bool(b) => !b,
            Value::Number(n) => n.as_f64() == Some(0.0),
            _ => false,
        },
        // A struct: only `omitzero` leaves it out, when zero (a zero time is null).
        Ty::Message(i) => {
            f.omitzero
                && match v {
                    Value::Null => true,
                    Value::Object(o) => o.is_empty() && s.messages[i].special == Special::None,
                    _ => false,
                }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn drops_empty_omitempty_fields_and_keeps_pointers() {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {}, "annotations": {}, "finalizers": [],
                "generateName": "", "creationTimestamp": null, "generation": 0},
            "spec": {
                "containers": [{"name": "c", "image": "x", "args": [], "workingDir": "",
                    "stdin": false, "securityContext": {"privileged": false, "capabilities": {}}}],
                "nodeSelector": {}, "hostNetwork": false,
                "automountServiceAccountToken": false, "tolerations": [],
                "terminationGracePeriodSeconds": 0, "securityContext": {},
            },
        });
        assert!(omit_empty(&mut pod));
        assert_eq!(
            pod,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p"},
                "spec": {
                    "containers": [{"name": "c", "image": "x",
                        "securityContext": {"privileged": false, "capabilities": {}}}],
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 0, "securityContext": {},
                },
            })
        );
    }

    #[test]
    fn keeps_non_omitempty_fields_and_unknown_kinds() {
        let mut role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "r"}, "rules": []});
        let before = role.clone();
        assert!(omit_empty(&mut role));
        assert_eq!(role, before);
        let mut cr = json!({"apiVersion": "ex.com/v1", "kind": "W", "spec": {"a": {}}});
        assert!(!omit_empty(&mut cr));
        let mut meta = json!({"name": "w", "labels": {}, "finalizers": []});
        omit_empty_meta(&mut meta);
        assert_eq!(meta, json!({"name": "w"}));
    }

    #[test]
    fn template_metadata_and_maps_of_messages() {
        let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {"template": {"metadata": {"labels": {}, "creationTimestamp": null},
                "spec": {"containers": [{"name": "c", "image": "x",
                    "resources": {"limits": {}, "requests": {"cpu": "1"}}}]}}}});
        assert!(omit_empty(&mut d));
        assert_eq!(d["spec"]["template"]["metadata"], json!({}));
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["resources"],
            json!({"requests": {"cpu": "1"}})
        );
    }
}
