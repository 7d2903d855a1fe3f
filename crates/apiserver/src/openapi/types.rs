//! Type checking of a decoded object against its schema, as kube-apiserver's decode into
//! the typed Go object fails: `json: cannot unmarshal bool into Go struct field
//! Service.spec of type v1.ServiceSpec`.
//!
//! Running it on every body before any strategy sees the object means the strategies can
//! trust the JSON types of the fields they read and write (a `spec` is an object, `ports` a
//! list), as the typed Go code upstream can.

use serde_json::Value;

use super::{schemas, Schemas};
use crate::registry::Resource;

/// Definitions that decode from more than one JSON type (custom unmarshalling upstream).
const LENIENT: &[&str] = &[
    "io.k8s.apimachinery.pkg.api.resource.Quantity",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time",
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime",
    "io.k8s.apimachinery.pkg.runtime.RawExtension",
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1",
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSON",
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaPropsOrArray",
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaPropsOrBool",
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaPropsOrStringArray",
];

/// Deeper than this the walk stops (the body depth limit refuses such bodies anyway).
const MAX_DEPTH: usize = 64;

/// The first field of `obj` whose JSON type its schema does not allow, worded as Go's
/// decoder words it; `None` when the types fit (or the resource has no schema).
pub fn type_error(res: &Resource, obj: &Value) -> Option<String> {
    let s = schemas();
    let name = s.for_kind(res.group, res.version, res.kind)?;
    let schema = s.get(name)?;
    check(s, schema, struct_name(name), obj, &Path::Root, 0)
}

/// `v1.ServiceSpec` for `io.k8s.api.core.v1.ServiceSpec`.
fn go_name(definition: &str) -> &str {
    let mut dots = definition.rmatch_indices('.');
    let _ = dots.next();
    match dots.next() {
        Some((i, _)) => &definition[i + 1..],
        None => definition,
    }
}

/// `ServiceSpec` for `io.k8s.api.core.v1.ServiceSpec` (Go names the struct without its
/// package when it reports a field).
fn struct_name(definition: &str) -> &str {
    definition.rsplit('.').next().unwrap_or(definition)
}

/// The definition a property refers to (`$ref`, or `allOf: [{$ref}]`).
fn ref_name(schema: &Value) -> Option<&str> {
    let r = schema.get("$ref").or_else(|| {
        schema
            .get("allOf")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(|f| f.get("$ref"))
    })?;
    r.as_str()?.rsplit('/').next()
}

/// The Go type of a value of `schema` (`[]v1.Container`, `map[string]string`, `int32`).
fn go_type(schema: &Value) -> String {
    if let Some(r) = ref_name(schema) {
        return go_name(r).to_owned();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("array") => format!(
            "[]{}",
            schema.get("items").map_or("interface {}".into(), go_type)
        ),
        Some("object") => match schema.get("additionalProperties").filter(|a| a.is_object()) {
            Some(a) => format!("map[string]{}", go_type(a)),
            None => "map[string]interface {}".into(),
        },
        Some("string") => "string".into(),
        Some("boolean") => "bool".into(),
        Some("integer") => match schema.get("format").and_then(Value::as_str) {
            Some("int32") => "int32".into(),
            _ => "int64".into(),
        },
        Some("number") => "float64".into(),
        _ => "interface {}".into(),
    }
}

fn json_type(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "bool".into(),
        Value::Number(_) => "number".into(),
        Value::String(_) => "string".into(),
        Value::Array(_) => "array".into(),
        Value::Object(_) => "object".into(),
    }
}

fn mismatch(got: String, owner: &str, path: &Path<'_>, want: String) -> Option<String> {
    Some(format!(
        "json: cannot unmarshal {got} into Go struct field {owner}.{} of type {want}",
        path.dotted()
    ))
}

/// Where the walk is, as a chain of field names: written out only for an error, so a
/// check of a well-typed object allocates nothing for its paths.
enum Path<'a> {
    Root,
    Field(&'a Path<'a>, &'a str),
}

impl Path<'_> {
    /// `spec.containers.image`, the dotted names Go reports.
    fn dotted(&self) -> String {
        match self {
            Path::Root => String::new(),
            Path::Field(Path::Root, k) => (*k).to_owned(),
            Path::Field(parent, k) => format!("{}.{k}", parent.dotted()),
        }
    }
}

/// Checks `v` at `path` (dotted JSON field names, as Go reports them) against `schema`;
/// `owner` is the Go struct the field belongs to.
fn check(
    s: &Schemas,
    schema: &Value,
    owner: &str,
    v: &Value,
    path: &Path<'_>,
    depth: usize,
) -> Option<String> {
    // Go leaves a field at its zero value for null.
    if v.is_null() || depth > MAX_DEPTH {
        return None;
    }
    let (def, owner_here) = match ref_name(schema) {
        Some(r) if LENIENT.contains(&r) => return None,
        Some(r) => (s.get(r)?, struct_name(r)),
        None => (schema, owner),
    };
    if def.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        || def.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
    {
        return None;
    }
    let want = || go_type(schema);
    match def.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Value::Object(m) = v else {
                return mismatch(json_type(v), owner, path, want());
            };
            if let Some(props) = def.get("properties").and_then(Value::as_object) {
                for (k, child) in m {
                    if let Some(ps) = props.get(k) {
                        let p = Path::Field(path, k);
                        if let Some(e) = check(s, ps, owner_here, child, &p, depth + 1) {
                            return Some(e);
                        }
                    }
                }
            } else if let Some(a) = def.get("additionalProperties").filter(|a| a.is_object()) {
                // A map value is reported at the map's field, with the value's type.
                for child in m.values() {
                    if let Some(e) = check(s, a, owner, child, path, depth + 1) {
                        return Some(e);
                    }
                }
            }
            None
        }
        Some("array") => {
            let Value::Array(items) = v else {
                return mismatch(json_type(v), owner, path, want());
            };
            let item = def.get("items")?;
            items
                .iter()
                .find_map(|child| check(s, item, owner, child, path, depth + 1))
        }
        Some("string") => match v {
            // []byte fields are base64 in JSON; Go's decoder refuses anything else.
            Value::String(b) if def.get("format").and_then(Value::as_str) == Some("byte") => {
                kumo_apimachinery::gojson::base64_error(b.as_bytes())
                    .map(|at| format!("illegal base64 data at input byte {at}"))
            }
            Value::String(_) => None,
            _ => mismatch(json_type(v), owner, path, want()),
        },
        Some("boolean") => match v {
            Value::Bool(_) => None,
            _ => mismatch(json_type(v), owner, path, want()),
        },
        Some("number") => match v {
            Value::Number(_) => None,
            _ => mismatch(json_type(v), owner, path, want()),
        },
        Some("integer") => {
            let Value::Number(n) = v else {
                return mismatch(json_type(v), owner, path, want());
            };
            let fits = match def.get("format").and_then(Value::as_str) {
                Some("int32") => n.as_i64().is_some_and(|i| i32::try_from(i).is_ok()),
                _ => n.as_i64().is_some(),
            };
            if fits {
                None
            } else {
                mismatch(format!("number {n}"), owner, path, want())
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use serde_json::json;

    fn err(plural: &str, obj: Value) -> Option<String> {
        let r = Registry::builtin();
        let res = r.find("", "v1", plural).unwrap();
        type_error(&res, &obj)
    }

    #[test]
    fn words_errors_as_go_does() {
        // Each message as kube-apiserver v1.37.2 answered the same body.
        assert_eq!(
            err("services", json!({"spec": false})).unwrap(),
            "json: cannot unmarshal bool into Go struct field Service.spec of type v1.ServiceSpec"
        );
        assert_eq!(
            err("pods", json!({"spec": {"containers": [{"name": 5, "image": "x"}]}})).unwrap(),
            "json: cannot unmarshal number into Go struct field Container.spec.containers.name of type string"
        );
        assert_eq!(
            err("pods", json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 1.5}]}]}})).unwrap(),
            "json: cannot unmarshal number 1.5 into Go struct field ContainerPort.spec.containers.ports.containerPort of type int32"
        );
        assert_eq!(
            err("pods", json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 99999999999i64}]}]}})).unwrap(),
            "json: cannot unmarshal number 99999999999 into Go struct field ContainerPort.spec.containers.ports.containerPort of type int32"
        );
        assert_eq!(
            err("configmaps", json!({"metadata": {"labels": [1]}})).unwrap(),
            "json: cannot unmarshal array into Go struct field ObjectMeta.metadata.labels of type map[string]string"
        );
        assert_eq!(
            err("configmaps", json!({"data": {"a": 1}})).unwrap(),
            "json: cannot unmarshal number into Go struct field ConfigMap.data of type string"
        );
        assert_eq!(
            err("pods", json!({"spec": {"containers": "x"}})).unwrap(),
            "json: cannot unmarshal string into Go struct field PodSpec.spec.containers of type []v1.Container"
        );
        // Quantities, int-or-strings and nulls decode.
        assert_eq!(
            err(
                "pods",
                json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": 1}},
                "ports": [{"containerPort": 80}], "livenessProbe": {"httpGet": {"port": "http"}}}],
                "nodeName": null}})
            ),
            None
        );
    }
}
