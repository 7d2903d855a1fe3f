//! The OpenAPI v3 documents of the sim's sample-apiserver, as the generic API server
//! publishes them: `/openapi/v3` (the index, one entry per served group version with its
//! hash) and `/openapi/v3/apis/wardle.example.com/<version>` (the resources' paths and the
//! schemas they use). The wardle types' schemas are the facts of sample-apiserver's
//! generated definitions (no descriptions); the meta types they refer to come from the
//! built-in schemas (`kumo_apimachinery::openapi`). kube-apiserver's aggregator lists the
//! group versions in its own index and proxies the documents here, so `kubectl explain
//! flunders` works.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use kumo_apimachinery::openapi::{schemas, V3_REF};

use super::sample_apiserver::{resources, GROUP};

/// Definition-name prefix of the wardle types.
const PREFIX: &str = "io.k8s.sample-apiserver.pkg.apis.wardle";
const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

/// The versions with a document.
const VERSIONS: [&str; 2] = ["v1alpha1", "v1beta1"];

/// One built document and its hash (upper-case hex SHA-512, as kube-openapi's etag).
pub(crate) struct Doc {
    pub body: Bytes,
    pub hash: String,
}

fn reference(name: &str) -> Value {
    json!({"$ref": format!("{V3_REF}{name}")})
}

/// A reference with a default, which OpenAPI v3 writes as a one-element allOf.
fn defaulted(name: &str) -> Value {
    json!({"allOf": [reference(name)], "default": {}})
}

fn string() -> Value {
    json!({"type": "string"})
}

/// The wardle types of one version, by definition name.
fn definitions(version: &str) -> Vec<(String, Value)> {
    let name = |k: &str| format!("{PREFIX}.{version}.{k}");
    let gvk = |k: &str| json!([{"group": GROUP, "version": version, "kind": k}]);
    let list = |item: &str, kind: &str| {
        json!({"type": "object", "required": ["items"], "properties": {
            "apiVersion": string(), "kind": string(),
            "metadata": defaulted(&format!("{META}.ListMeta")),
            "items": {"type": "array", "items": reference(&name(item))}},
            "x-kubernetes-group-version-kind": gvk(kind)})
    };
    let spec = match version {
        "v1alpha1" => json!({"reference": string(), "referenceType": string()}),
        _ => json!({"flunderReference": string(), "fischerReference": string(),
                    "referenceType": string()}),
    };
    let mut defs = vec![
        (
            name("Flunder"),
            json!({"type": "object", "properties": {
                "apiVersion": string(), "kind": string(),
                "metadata": defaulted(&format!("{META}.ObjectMeta")),
                "spec": defaulted(&name("FlunderSpec")),
                "status": defaulted(&name("FlunderStatus"))},
                "x-kubernetes-group-version-kind": gvk("Flunder")}),
        ),
        (name("FlunderList"), list("Flunder", "FlunderList")),
        (
            name("FlunderSpec"),
            json!({"type": "object", "properties": spec}),
        ),
        (name("FlunderStatus"), json!({"type": "object"})),
    ];
    if version == "v1alpha1" {
        defs.push((
            name("Fischer"),
            json!({"type": "object", "properties": {
                "apiVersion": string(), "kind": string(),
                "metadata": defaulted(&format!("{META}.ObjectMeta")),
                "disallowedFlunders": {"type": "array", "items": string(),
                                       "x-kubernetes-list-type": "atomic"}},
                "x-kubernetes-group-version-kind": gvk("Fischer")}),
        ));
        defs.push((name("FischerList"), list("Fischer", "FischerList")));
    }
    defs
}

/// The definition of one wardle type (for field validation).
pub(crate) fn definition(version: &str, kind: &str) -> Option<Value> {
    let want = format!("{PREFIX}.{version}.{kind}");
    definitions(version)
        .into_iter()
        .find_map(|(n, d)| (n == want).then_some(d))
}

/// Resolves a `$ref` (or one-element allOf) against the wardle types of `version` and the
/// built-in schemas.
pub(crate) fn resolve(version: &str, schema: &Value) -> Value {
    let r = schema.get("$ref").and_then(Value::as_str).or_else(|| {
        schema
            .get("allOf")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 1)
            .and_then(|a| a[0].get("$ref"))
            .and_then(Value::as_str)
    });
    let Some(name) = r.and_then(|r| r.strip_prefix(V3_REF)) else {
        return schema.clone();
    };
    if let Some(d) = definitions(version)
        .into_iter()
        .find_map(|(n, d)| (n == name).then_some(d))
    {
        return d;
    }
    schemas().get(name).cloned().unwrap_or(Value::Null)
}

/// The fields of `obj` (a `kind` of `version`) that its schema does not know, as paths
/// (`spec.bogus`, `items[0].x`); they are removed, as decoding into the Go types drops them.
/// A schema without properties (FieldsV1, RawExtension, an empty status) takes anything.
pub(crate) fn drop_unknown_fields(version: &str, kind: &str, obj: &mut Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(schema) = definition(version, kind) {
        walk(version, &schema, obj, "", &mut out, 0);
    }
    out
}

fn walk(
    version: &str,
    schema: &Value,
    v: &mut Value,
    path: &str,
    out: &mut Vec<String>,
    depth: usize,
) {
    if depth > 64 {
        return;
    }
    let schema = resolve(version, schema);
    match v {
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                let keys: Vec<String> = m.keys().cloned().collect();
                for k in keys {
                    let at = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    match (props.get(&k), m.get_mut(&k)) {
                        (Some(p), Some(child)) => walk(version, p, child, &at, out, depth + 1),
                        _ => {
                            m.remove(&k);
                            out.push(at);
                        }
                    }
                }
            } else if let Some(each) = schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for (k, child) in m.iter_mut() {
                    walk(version, each, child, &format!("{path}.{k}"), out, depth + 1);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for (i, child) in a.iter_mut().enumerate() {
                    walk(
                        version,
                        items,
                        child,
                        &format!("{path}[{i}]"),
                        out,
                        depth + 1,
                    );
                }
            }
        }
        _ => {}
    }
}

/// The query parameters of each action, as the generic API server lists them.
fn params(action: &str) -> Value {
    use kumo_apimachinery::openapi as o;
    let names = match action {
        "list" => o::LIST_PARAMS,
        "deletecollection" => o::DELETE_COLLECTION_PARAMS,
        "post" | "put" => o::WRITE_PARAMS,
        "patch" => o::PATCH_PARAMS,
        "delete" => o::DELETE_PARAMS,
        _ => &[],
    };
    Value::Array(o::query(names))
}

/// `wardle.example.com` → `WardleExampleCom`, as operation ids spell a group.
fn group_camel() -> String {
    GROUP
        .split('.')
        .map(|p| {
            let mut c = p.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

/// The paths of one version's resources.
fn paths(version: &str) -> Map<String, Value> {
    let camel = group_camel();
    let ver = {
        let mut c = version.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect::<String>())
            .unwrap_or_default()
    };
    let tag = format!("wardleExampleCom_{version}");
    let json_yaml = |schema: Value| {
        json!({"application/json": {"schema": schema.clone()},
               "application/yaml": {"schema": schema}})
    };
    let op = |action: &str, id: String, kind: &str, response: &str, body: Option<&str>| {
        let mut o = json!({
            "tags": [tag],
            "operationId": id,
            "parameters": params(action),
            "responses": {
                "200": {"description": "OK", "content": json_yaml(reference(response))},
                "401": {"description": "Unauthorized"}},
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": {"group": GROUP, "version": version, "kind": kind}});
        if let Some(b) = body {
            let types = if action == "patch" {
                json!({
                    "application/apply-patch+yaml": {"schema": reference(&format!("{META}.Patch"))},
                    "application/json-patch+json": {"schema": reference(&format!("{META}.Patch"))},
                    "application/merge-patch+json": {"schema": reference(&format!("{META}.Patch"))}})
            } else {
                json_yaml(reference(b))
            };
            o["requestBody"] = json!({"content": types, "required": true});
        }
        o
    };
    let path_param = |n: &str| json!({"name": n, "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}});
    let pretty =
        json!({"name": "pretty", "in": "query", "schema": {"type": "string", "uniqueItems": true}});
    let base = format!("/apis/{GROUP}/{version}");
    let mut out = Map::new();
    out.insert(
        format!("{base}/"),
        json!({"get": {"tags": [tag], "operationId": format!("get{camel}{ver}APIResources"),
            "responses": {"200": {"description": "OK", "content": json_yaml(reference(&format!("{META}.APIResourceList")))},
                          "401": {"description": "Unauthorized"}}}}),
    );
    for &(plural, _, kind, namespaced) in resources(version) {
        let obj = format!("{PREFIX}.{version}.{kind}");
        let list = format!("{obj}List");
        let (scope, collection, mut common) = if namespaced {
            (
                "Namespaced",
                format!("{base}/namespaces/{{namespace}}/{plural}"),
                vec![path_param("namespace"), pretty.clone()],
            )
        } else {
            ("", format!("{base}/{plural}"), vec![pretty.clone()])
        };
        let id = |verb: &str| format!("{verb}{camel}{ver}{scope}{kind}");
        out.insert(
            collection.clone(),
            json!({
                "get": op("list", id("list"), kind, &list, None),
                "post": op("post", id("create"), kind, &obj, Some(&obj)),
                "delete": op("deletecollection", format!("deletecollection{camel}{ver}{scope}{kind}"),
                             kind, &format!("{META}.Status"), Some(&format!("{META}.DeleteOptions"))),
                "parameters": common.clone()}),
        );
        common.insert(0, path_param("name"));
        out.insert(
            format!("{collection}/{{name}}"),
            json!({
                "get": op("get", id("read"), kind, &obj, None),
                "put": op("put", id("replace"), kind, &obj, Some(&obj)),
                "patch": op("patch", id("patch"), kind, &obj, Some(&obj)),
                "delete": op("delete", id("delete"), kind, &format!("{META}.Status"),
                             Some(&format!("{META}.DeleteOptions"))),
                "parameters": common}),
        );
        if namespaced {
            out.insert(
                format!("{base}/{plural}"),
                json!({"get": op("list", format!("list{camel}{ver}{kind}ForAllNamespaces"), kind, &list, None),
                       "parameters": [pretty.clone()]}),
            );
        }
    }
    out
}

fn build(version: &str) -> Doc {
    let paths = Value::Object(paths(version));
    let own = definitions(version);
    let mut names = BTreeSet::new();
    schemas().referenced(&paths.to_string(), &mut names);
    for (_, d) in &own {
        schemas().referenced(&d.to_string(), &mut names);
    }
    let mut components: Map<String, Value> = names
        .iter()
        .filter_map(|n| Some(((*n).to_owned(), schemas().get(n)?.clone())))
        .collect();
    components.extend(own);
    let doc = json!({
        "openapi": "3.0.0",
        "info": {"title": "Wardle", "version": "0.1"},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"BearerToken": {"type": "apiKey", "name": "authorization", "in": "header"}}}});
    let body = Bytes::from(doc.to_string());
    let digest = ring::digest::digest(&ring::digest::SHA512, &body);
    let hash = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
    Doc { body, hash }
}

/// The document of `apis/wardle.example.com/<version>`, built once.
pub(crate) fn document(version: &str) -> Option<&'static Doc> {
    static DOCS: OnceLock<Vec<(&'static str, Doc)>> = OnceLock::new();
    DOCS.get_or_init(|| VERSIONS.iter().map(|v| (*v, build(v))).collect())
        .iter()
        .find_map(|(v, d)| (*v == version).then_some(d))
}

/// `/openapi/v2`: both versions' paths and every definition they use, in v2 form, built
/// once from the v3 documents.
pub(crate) fn v2() -> &'static Bytes {
    use kumo_apimachinery::openapi::{path_item_to_v2, schema_to_v2};
    static DOC: OnceLock<Bytes> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut paths = Map::new();
        let mut definitions = Map::new();
        for v in VERSIONS {
            let Some(doc) = document(v).and_then(|d| serde_json::from_slice::<Value>(&d.body).ok())
            else {
                continue;
            };
            for (p, item) in doc["paths"].as_object().into_iter().flatten() {
                paths.insert(p.clone(), path_item_to_v2(item));
            }
            for (n, d) in doc["components"]["schemas"].as_object().into_iter().flatten() {
                definitions.insert(n.clone(), schema_to_v2(d));
            }
        }
        let doc = json!({
            "swagger": "2.0",
            "info": {"title": "Wardle", "version": "0.1"},
            "paths": paths,
            "definitions": definitions,
            "securityDefinitions": {"BearerToken": {"type": "apiKey", "name": "authorization", "in": "header"}},
            "security": [{"BearerToken": []}]});
        Bytes::from(doc.to_string())
    })
}

/// `/openapi/v3`: each group version's document with its hash.
pub(crate) fn index() -> Value {
    let paths: Map<String, Value> = VERSIONS
        .iter()
        .filter_map(|v| {
            let d = document(v)?;
            let key = format!("apis/{GROUP}/{v}");
            let url = format!("/openapi/v3/{key}?hash={}", d.hash);
            Some((key, json!({ "serverRelativeURL": url })))
        })
        .collect();
    json!({ "paths": paths })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_hold_every_schema_they_refer_to() {
        for v in VERSIONS {
            let d = document(v).unwrap();
            let doc: Value = serde_json::from_slice(&d.body).unwrap();
            let comps = doc["components"]["schemas"].as_object().unwrap();
            let text = d.body.clone();
            let text = std::str::from_utf8(&text).unwrap();
            for name in kumo_apimachinery::openapi::refs_in(text) {
                assert!(
                    comps.contains_key(name),
                    "{v}: {name} is referred to, not held"
                );
            }
            assert!(comps.contains_key(&format!("{PREFIX}.{v}.Flunder")));
            assert!(comps.contains_key(&format!("{META}.ObjectMeta")));
            let flunder = &doc["paths"]
                [&format!("/apis/{GROUP}/{v}/namespaces/{{namespace}}/flunders/{{name}}")];
            assert_eq!(
                flunder["patch"]["x-kubernetes-group-version-kind"]["kind"],
                "Flunder"
            );
        }
        let idx = index();
        let url = idx["paths"]["apis/wardle.example.com/v1alpha1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.ends_with(&document("v1alpha1").unwrap().hash));
        assert!(document("v2").is_none());
        let v2: Value = serde_json::from_slice(v2()).unwrap();
        let text = v2.to_string();
        assert!(!text.contains("#/components/schemas/"));
        for name in text.split("\"$ref\":\"#/definitions/").skip(1) {
            let name = name.split('"').next().unwrap();
            assert!(v2["definitions"][name].is_object(), "{name}");
        }
        assert!(
            v2["paths"]["/apis/wardle.example.com/v1beta1/namespaces/{namespace}/flunders"]["post"]
                .is_object()
        );
    }

    #[test]
    fn unknown_fields_are_found_and_dropped() {
        let mut f = json!({"apiVersion": "wardle.example.com/v1alpha1", "kind": "Flunder",
            "metadata": {"name": "a", "labels": {"x": "y"}, "bogus": 1,
                         "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}, "nope": 2}]},
            "spec": {"reference": "b", "extra": true}, "other": {}});
        let unknown = drop_unknown_fields("v1alpha1", "Flunder", &mut f);
        assert_eq!(
            unknown,
            [
                "metadata.bogus",
                "metadata.managedFields[0].nope",
                "other",
                "spec.extra"
            ]
        );
        assert_eq!(f["spec"], json!({"reference": "b"}));
        assert_eq!(f["metadata"]["labels"], json!({"x": "y"}));
        assert_eq!(
            f["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:spec": {}})
        );
        // v1beta1 names its references apart.
        let mut g = json!({"spec": {"reference": "b", "flunderReference": "c"}});
        assert_eq!(
            drop_unknown_fields("v1beta1", "Flunder", &mut g),
            ["spec.reference"]
        );
        let mut h = json!({"disallowedFlunders": ["x"], "spec": {}});
        assert_eq!(drop_unknown_fields("v1alpha1", "Fischer", &mut h), ["spec"]);
    }
}
