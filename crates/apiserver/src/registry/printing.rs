//! Pieces the table printers and strategies of the policy, storage and networking groups
//! share: column constructors, upstream's cell formats, status carried over on update.

use kumo_apimachinery::selector::LabelSelector;
use serde_json::{json, Value};

use super::{str_at, Column};

/// A column of priority 0 with no format.
pub(super) const fn col(
    name: &'static str,
    type_: &'static str,
    description: &'static str,
) -> Column {
    Column {
        name,
        type_,
        format: "",
        description,
        priority: 0,
    }
}

/// A column shown only with `-o wide`.
pub(super) const fn wide(
    name: &'static str,
    type_: &'static str,
    description: &'static str,
) -> Column {
    Column {
        name,
        type_,
        format: "",
        description,
        priority: 1,
    }
}

/// The `Created At` column of kube-apiserver's default table (resources without a printer).
pub(super) const CREATED_AT: Column = Column {
    name: "Created At",
    type_: "date",
    format: "",
    description: Column::AGE.description,
    priority: 0,
};

/// The `Created At` cell: the creation timestamp in RFC 3339, UTC.
pub(super) fn created_at(obj: &Value) -> Value {
    json!(str_at(obj, "/metadata/creationTimestamp"))
}

/// The array at a JSON pointer (empty when absent).
pub(super) fn arr<'a>(obj: &'a Value, pointer: &str) -> &'a [Value] {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// Upstream's FormatLabelSelector: the canonical selector string, `<none>` when it selects
/// everything (or is absent), `<error>` when it does not parse.
pub(super) fn format_label_selector(sel: Option<&Value>) -> String {
    let sel = sel.cloned().unwrap_or_else(|| json!({}));
    match LabelSelector::from_json(&sel) {
        Ok(s) => {
            let s = s.to_string();
            if s.is_empty() {
                "<none>".to_owned()
            } else {
                s
            }
        }
        Err(_) => "<error>".to_owned(),
    }
}

/// Upstream's GetAccessModesAsString: `RWO,ROX,RWX,RWOP`, each at most once, in that order.
pub(super) fn access_modes(modes: &[Value]) -> String {
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(m, _)| modes.iter().any(|v| v == m))
    .map(|(_, s)| *s)
    .collect::<Vec<_>>()
    .join(",")
}

/// An IntOrString as printed (`""` when absent).
pub(super) fn int_or_string(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// Keeps the stored status on an update of the main resource (status changes only through
/// the `status` subresource).
pub(super) fn keep_status(new: &mut Value, old: &Value) {
    if let Some(o) = new.as_object_mut() {
        match old.get("status") {
            Some(s) => o.insert("status".into(), s.clone()),
            None => o.remove("status"),
        };
    }
}

/// Keeps the stored value of a top-level field (what a status update may not change).
pub(super) fn keep_field(new: &mut Value, old: &Value, field: &str) {
    if let Some(o) = new.as_object_mut() {
        match old.get(field) {
            Some(s) => o.insert(field.into(), s.clone()),
            None => o.remove(field),
        };
    }
}

/// Upstream's IsValidPathSegmentName: anything but `.`, `..`, `/` and `%` (names of RBAC
/// objects and ClusterTrustBundles).
pub(super) fn path_segment_name(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    if name == "." || name == ".." {
        out.push(format!("may not be '{name}'"));
    }
    for c in ["/", "%"] {
        if name.contains(c) {
            out.push(format!("may not contain '{c}'"));
        }
    }
    out
}

/// Sets `obj[field]` to `v`.
pub(super) fn set(obj: &mut Value, field: &str, v: Value) {
    if let Some(o) = obj.as_object_mut() {
        o.insert(field.into(), v);
    }
}

/// A boolean field with its default.
pub(super) fn bool_at(obj: &Value, pointer: &str, default: bool) -> bool {
    obj.pointer(pointer)
        .and_then(Value::as_bool)
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_formats() {
        assert_eq!(format_label_selector(None), "<none>");
        assert_eq!(format_label_selector(Some(&json!({}))), "<none>");
        assert_eq!(
            format_label_selector(Some(&json!({"matchLabels": {"b": "1", "a": "2"}}))),
            "a=2,b=1"
        );
        assert_eq!(
            access_modes(&[
                json!("ReadOnlyMany"),
                json!("ReadWriteOnce"),
                json!("ReadWriteOnce")
            ]),
            "RWO,ROX"
        );
        assert_eq!(int_or_string(Some(&json!(1))), "1");
        assert_eq!(int_or_string(Some(&json!("50%"))), "50%");
    }
}
