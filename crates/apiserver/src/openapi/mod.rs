//! OpenAPI: `/openapi/v2`, `/openapi/v3` and `/openapi/v3/<api|apis/group>/<version>`, and
//! server-side field validation (`fieldValidation=Strict|Warn|Ignore`) against the same
//! schemas.
//!
//! The schemas of the built-in types are facts of the Kubernetes API, extracted by
//! `scripts/gen-openapi` (`kumo_apimachinery::openapi`, with upstream's descriptions from
//! k8s-openapi added at build time) and embedded in the binary.
//! The paths are generated from the [`Registry`], so the documents list exactly the
//! resources and verbs this server serves. kubectl reads them to decide that the server
//! validates fields itself (the `fieldValidation` parameter of each PATCH operation, found
//! by its `x-kubernetes-group-version-kind`), for `kubectl explain`, and for strategic
//! merge patches in `kubectl apply`.
//!
//! Documents are built on first request and kept: an idle server holds none of this.

mod proto;
mod types;
mod validate;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::registry::{Registry, Resource};

pub use types::type_error;
pub use validate::{check_fields, check_patched, prune, Directive, FieldProblems};
pub(crate) use validate::{object_meta_unknown, prune_object_meta};

use kumo_apimachinery::openapi::{
    param, path_item_to_v2, query, schema_to_v2, DELETE_COLLECTION_PARAMS, DELETE_PARAMS,
    LIST_PARAMS, PATCH_PARAMS, V3_REF, WRITE_PARAMS,
};
pub use kumo_apimachinery::openapi::{schemas, Schemas};

/// One served document with its content hash (upstream: SHA-512, upper-case hex).
#[derive(Clone)]
pub struct Document {
    pub body: Bytes,
    pub hash: String,
}

impl Document {
    fn new(mut text: String) -> Document {
        // Kept for the server's lifetime: no spare capacity.
        text.shrink_to_fit();
        let body = Bytes::from(text);
        let digest = ring::digest::digest(&ring::digest::SHA512, &body);
        let hash = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
        Document { body, hash }
    }
}

/// The OpenAPI documents of a registry, built on first request, and again after the
/// registry's resources change (custom resources come and go).
#[derive(Default)]
pub struct Documents {
    current: std::sync::Mutex<Option<(Generation, Arc<Built>)>>,
    /// What other servers add to `/openapi/v2` (the aggregator's backends), with its
    /// generation.
    extra: std::sync::Mutex<(u64, Arc<Vec<V2Part>>)>,
}

/// What the documents were built from: the registry's generation and the extra parts'.
type Generation = (u64, u64);

/// Paths and definitions (both in v2 form) that a backend adds to `/openapi/v2`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct V2Part {
    pub paths: Map<String, Value>,
    pub definitions: Map<String, Value>,
}

/// The documents of one generation of the registry.
#[derive(Default)]
struct Built {
    /// The backends' parts of `/openapi/v2`.
    extra: Arc<Vec<V2Part>>,
    v3: OnceLock<V3>,
    v2: OnceLock<Document>,
    v2_protobuf: OnceLock<Document>,
}

struct V3 {
    /// By path key (`api/v1`, `apis/coordination.k8s.io/v1`).
    groups: BTreeMap<String, Document>,
    /// `/openapi/v3`.
    index: Bytes,
}

impl Documents {
    /// The documents of the registry as it is now.
    fn built(&self, registry: &Registry) -> Arc<Built> {
        let (extra_generation, extra) = self
            .extra
            .lock()
            .map(|e| e.clone())
            .unwrap_or_else(|p| p.into_inner().clone());
        let generation = (registry.generation(), extra_generation);
        let mut current = match self.current.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        match &*current {
            Some((g, b)) if *g == generation => b.clone(),
            _ => {
                let b = Arc::new(Built {
                    extra,
                    ..Built::default()
                });
                *current = Some((generation, b.clone()));
                b
            }
        }
    }

    /// Sets what backends add to `/openapi/v2`; the documents are built again when it
    /// differs from what they hold.
    pub fn set_v2_extra(&self, parts: Vec<V2Part>) {
        let mut e = self.extra.lock().unwrap_or_else(|p| p.into_inner());
        if *e.1 != parts {
            *e = (e.0 + 1, Arc::new(parts));
        }
    }

    /// `/openapi/v3`: the index of the group-version documents.
    pub fn v3_index(&self, registry: &Registry) -> Bytes {
        self.built(registry).v3(registry).index.clone()
    }

    /// `/openapi/v3/<key>`, if served.
    pub fn v3_group(&self, registry: &Registry, key: &str) -> Option<Document> {
        self.built(registry).v3(registry).groups.get(key).cloned()
    }

    /// `/openapi/v2`: every served path and the definitions they use.
    pub fn v2(&self, registry: &Registry) -> Document {
        self.built(registry).v2(registry).clone()
    }

    /// `/openapi/v2` in protobuf: the definitions only (see [`proto`]).
    pub fn v2_protobuf(&self, registry: &Registry) -> Document {
        self.built(registry).v2_protobuf(registry).clone()
    }
}

impl Built {
    fn v3(&self, registry: &Registry) -> &V3 {
        self.v3.get_or_init(|| {
            let mut groups: BTreeMap<String, Document> = group_versions(registry)
                .into_iter()
                .map(|(g, v)| {
                    let key = gv_path(g, v).trim_start_matches('/').to_owned();
                    (key, v3_document(registry, g, v))
                })
                .collect();
            groups.extend(discovery_documents(registry));
            let paths: Map<String, Value> = groups
                .iter()
                .map(|(k, d)| {
                    (
                        k.clone(),
                        json!({"serverRelativeURL": format!("/openapi/v3/{k}?hash={}", d.hash)}),
                    )
                })
                .collect();
            let index = Bytes::from(json!({ "paths": paths }).to_string());
            V3 { groups, index }
        })
    }

    fn v2(&self, registry: &Registry) -> &Document {
        self.v2.get_or_init(|| v2_document(registry, &self.extra))
    }

    fn v2_protobuf(&self, registry: &Registry) -> &Document {
        self.v2_protobuf.get_or_init(|| {
            let mut defs = Vec::new();
            v2_definitions(registry, |n, d| defs.push((n.to_owned(), d)));
            let own: BTreeSet<String> = defs.iter().map(|(n, _)| n.clone()).collect();
            for (n, d) in extra_definitions(&self.extra, &own) {
                defs.push((n.to_owned(), d.clone()));
            }
            let body = proto::document(
                crate::KUBERNETES_VERSION,
                defs.iter().map(|(n, d)| (n.as_str(), d.clone())),
            );
            let digest = ring::digest::digest(&ring::digest::SHA512, &body);
            Document {
                hash: digest.as_ref().iter().map(|b| format!("{b:02X}")).collect(),
                body: Bytes::from(body),
            }
        })
    }
}

/// The served group versions, core first, in discovery order.
fn group_versions(registry: &Registry) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    if registry.in_group_version("", "v1").next().is_some() {
        out.push(("", "v1"));
    }
    for (g, vs) in registry.groups() {
        for v in vs {
            out.push((g, v));
        }
    }
    out
}

/// `/api/v1` or `/apis/<group>/<version>`.
fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    }
}

/// The group as operation ids spell it: `Core`, `Coordination`, `RbacAuthorization`.
fn group_camel(group: &str) -> String {
    if group.is_empty() {
        return "Core".into();
    }
    group
        .trim_end_matches(".k8s.io")
        .split('.')
        .map(capitalize)
        .collect()
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];
/// What the server answers in (JSON and YAML).
const RESPONSE_TYPES: &[&str] = &["application/json", "application/yaml"];

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("{V3_REF}{name}") })
}

fn content(types: &[&str], schema: &str) -> Value {
    let m: Map<String, Value> = types
        .iter()
        .map(|t| ((*t).to_owned(), json!({"schema": schema_ref(schema)})))
        .collect();
    Value::Object(m)
}

/// One operation of a v3 document.
struct Op<'a> {
    action: &'a str,
    id: String,
    params: Vec<Value>,
    /// Request body media types and schema.
    body: Option<(&'a [&'a str], &'a str)>,
    /// Status codes answered with the schema.
    responses: &'a [&'a str],
    response: &'a str,
}

impl Op<'_> {
    fn render(self, tag: &str, gvk: Option<&Value>) -> Value {
        let mut responses = Map::new();
        for code in self.responses {
            responses.insert(
                (*code).to_owned(),
                json!({"content": content(RESPONSE_TYPES, self.response)}),
            );
        }
        responses.insert("401".into(), json!({}));
        let mut op = json!({
            "tags": [tag],
            "operationId": self.id,
            "responses": responses,
        });
        if !self.params.is_empty() {
            op["parameters"] = Value::Array(self.params);
        }
        if let Some((types, schema)) = self.body {
            op["requestBody"] = json!({"content": content(types, schema), "required": true});
        }
        if !self.action.is_empty() {
            op["x-kubernetes-action"] = json!(self.action);
        }
        if let Some(g) = gvk {
            op["x-kubernetes-group-version-kind"] = g.clone();
        }
        op
    }
}

const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
const RESOURCE_LIST: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList";

/// The paths of one resource, as kube-apiserver documents them (without the deprecated
/// `/watch/` paths, which this server does not serve).
fn resource_paths(r: &Resource, tag: &str, paths: &mut Map<String, Value>) {
    let s = schemas();
    let custom = r.strategy.openapi_definitions();
    let (obj, list): (&str, &str) = match (&custom, s.for_kind(r.group, r.version, r.kind)) {
        (Some([(obj, _), (list, _)]), _) => (obj, list),
        (None, Some(obj)) => (
            obj,
            s.for_kind(r.group, r.version, &format!("{}List", r.kind))
                .unwrap_or(obj),
        ),
        (None, None) => {
            tracing::warn!(kind = r.kind, "no OpenAPI schema for a served kind");
            return;
        }
    };
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let verbs = r.verbs();
    let has = |v: &str| verbs.contains(&v);
    let base = gv_path(r.group, r.version);
    let id = |verb: &str, mid: &str, suffix: &str| {
        format!(
            "{verb}{}{}{mid}{}{suffix}",
            group_camel(r.group),
            capitalize(r.version),
            r.kind
        )
    };
    let ns = if r.namespaced { "Namespaced" } else { "" };
    let (collection, item) = if r.namespaced {
        (
            format!("{base}/namespaces/{{namespace}}/{}", r.plural),
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", r.plural),
        )
    } else {
        (
            format!("{base}/{}", r.plural),
            format!("{base}/{}/{{name}}", r.plural),
        )
    };
    let deleted = if r.returns_deleted_object() {
        obj
    } else {
        STATUS
    };
    let path_params = |item: bool| {
        let mut p = Vec::new();
        if item {
            p.push(param("name", "path", "string"));
        }
        if r.namespaced {
            p.push(param("namespace", "path", "string"));
        }
        p.push(param("pretty", "query", "string"));
        Value::Array(p)
    };

    // The collection.
    let mut coll = Map::new();
    if has("list") {
        let op = Op {
            action: "list",
            id: id("list", ns, ""),
            params: query(LIST_PARAMS),
            body: None,
            responses: &["200"],
            response: list,
        };
        coll.insert("get".into(), op.render(tag, Some(&gvk)));
    }
    if has("create") {
        let op = Op {
            action: "post",
            id: id("create", ns, ""),
            params: query(WRITE_PARAMS),
            body: Some((&["*/*"], obj)),
            responses: &["200", "201", "202"],
            response: obj,
        };
        coll.insert("post".into(), op.render(tag, Some(&gvk)));
    }
    if has("deletecollection") {
        let op = Op {
            action: "deletecollection",
            id: id("delete", &format!("Collection{ns}"), ""),
            params: query(DELETE_COLLECTION_PARAMS),
            body: Some((&["*/*"], DELETE_OPTIONS)),
            responses: &["200"],
            response: STATUS,
        };
        coll.insert("delete".into(), op.render(tag, Some(&gvk)));
    }
    if !coll.is_empty() {
        coll.insert("parameters".into(), path_params(false));
        paths.insert(collection, Value::Object(coll));
    }
    if r.namespaced && has("list") {
        let op = Op {
            action: "list",
            id: id("list", "", "ForAllNamespaces"),
            params: query(LIST_PARAMS),
            body: None,
            responses: &["200"],
            response: list,
        };
        let mut m = Map::new();
        m.insert("get".into(), op.render(tag, Some(&gvk)));
        m.insert(
            "parameters".into(),
            json!([param("pretty", "query", "string")]),
        );
        paths.insert(format!("{base}/{}", r.plural), Value::Object(m));
    }

    // One object, and its subresources.
    let mut one = Map::new();
    item_ops(&mut one, &has, tag, &gvk, obj, deleted, &|verb| {
        id(verb, ns, "")
    });
    if !one.is_empty() {
        one.insert("parameters".into(), path_params(true));
        paths.insert(item.clone(), Value::Object(one));
    }
    let scale_gvk = json!({"group": "autoscaling", "version": "v1", "kind": "Scale"});
    for sub in r.subresources {
        let (sub_verbs, kind, sub_gvk): (&[&str], &str, &Value) = match *sub {
            // Pods' ephemeralcontainers and resize take the Pod, as status does.
            "status" | "ephemeralcontainers" | "resize" => (&["get", "update", "patch"], obj, &gvk),
            "finalize" => (&["update"], obj, &gvk),
            "scale" => (
                &["get", "update", "patch"],
                "io.k8s.api.autoscaling.v1.Scale",
                &scale_gvk,
            ),
            // Other subresources (connect verbs, bindings) are not documented yet.
            _ => continue,
        };
        let mut m = Map::new();
        let suffix = capitalize(sub);
        item_ops(
            &mut m,
            &|v| sub_verbs.contains(&v),
            tag,
            sub_gvk,
            kind,
            STATUS,
            &|verb| id(verb, ns, &suffix),
        );
        m.insert("parameters".into(), path_params(true));
        paths.insert(format!("{item}/{sub}"), Value::Object(m));
    }
}

#[allow(clippy::too_many_arguments)]
fn item_ops(
    m: &mut Map<String, Value>,
    has: &dyn Fn(&str) -> bool,
    tag: &str,
    gvk: &Value,
    obj: &str,
    deleted: &str,
    id: &dyn Fn(&str) -> String,
) {
    if has("get") {
        let op = Op {
            action: "get",
            id: id("read"),
            params: Vec::new(),
            body: None,
            responses: &["200"],
            response: obj,
        };
        m.insert("get".into(), op.render(tag, Some(gvk)));
    }
    if has("update") {
        let op = Op {
            action: "put",
            id: id("replace"),
            params: query(WRITE_PARAMS),
            body: Some((&["*/*"], obj)),
            responses: &["200", "201"],
            response: obj,
        };
        m.insert("put".into(), op.render(tag, Some(gvk)));
    }
    if has("delete") {
        let op = Op {
            action: "delete",
            id: id("delete"),
            params: query(DELETE_PARAMS),
            body: Some((&["*/*"], DELETE_OPTIONS)),
            responses: &["200", "202"],
            response: deleted,
        };
        m.insert("delete".into(), op.render(tag, Some(gvk)));
    }
    if has("patch") {
        let op = Op {
            action: "patch",
            id: id("patch"),
            params: query(PATCH_PARAMS),
            body: Some((PATCH_TYPES, PATCH)),
            responses: &["200", "201"],
            response: obj,
        };
        m.insert("patch".into(), op.render(tag, Some(gvk)));
    }
}

/// The paths of one group version.
/// Custom resources' paths are included with `custom`.
fn gv_paths(registry: &Registry, group: &str, version: &str, custom: bool) -> Map<String, Value> {
    let camel = group_camel(group);
    let tag = format!(
        "{}{}_{version}",
        camel.get(..1).unwrap_or("").to_lowercase(),
        camel.get(1..).unwrap_or("")
    );
    let mut paths = Map::new();
    let discovery = Op {
        action: "",
        id: format!("get{camel}{}APIResources", capitalize(version)),
        params: Vec::new(),
        body: None,
        responses: &["200"],
        response: RESOURCE_LIST,
    };
    paths.insert(
        format!("{}/", gv_path(group, version)),
        json!({"get": discovery.render(&tag, None)}),
    );
    for r in registry.in_group_version(group, version) {
        if custom || r.strategy.openapi_definitions().is_none() {
            resource_paths(&r, &tag, &mut paths);
        }
    }
    paths
}

/// The OpenAPI v3 document of one group version: its paths, and the definitions they use
/// copied as text.
fn v3_document(registry: &Registry, group: &str, version: &str) -> Document {
    let paths = Value::Object(gv_paths(registry, group, version, true)).to_string();
    let mut names = BTreeSet::new();
    schemas().referenced(&paths, &mut names);
    // The custom resources' own definitions, and the built-in ones they use.
    let mut custom: BTreeMap<String, String> = BTreeMap::new();
    for r in registry.in_group_version(group, version) {
        for (n, d) in r.strategy.openapi_definitions().into_iter().flatten() {
            let text = d.to_string();
            schemas().referenced(&text, &mut names);
            custom.insert(n, text);
        }
    }
    let mut all: BTreeMap<&str, &str> = names
        .iter()
        .map(|n| (*n, schemas().text(n).unwrap_or("{}")))
        .collect();
    all.extend(custom.iter().map(|(n, t)| (n.as_str(), t.as_str())));
    let mut out = String::with_capacity(paths.len() + names.len() * 512);
    out.push_str("{\"openapi\":\"3.0.0\",\"info\":");
    out.push_str(&json!({"title": "Kubernetes", "version": version_string()}).to_string());
    out.push_str(",\"paths\":");
    out.push_str(&paths);
    out.push_str(",\"components\":{\"schemas\":{");
    for (i, (n, text)) in all.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&json!(n).to_string());
        out.push(':');
        out.push_str(text);
    }
    out.push_str("},\"securitySchemes\":");
    out.push_str(&security_scheme().to_string());
    out.push_str("}}");
    Document::new(out)
}

/// The OpenAPI v3 documents of the paths that are not resources, as kube-apiserver lists
/// them in its index: the discovery documents (`/api/`, `/apis/`, `/apis/<group>/`), the
/// version and the service-account issuer's OIDC paths. Each is one GET operation.
fn discovery_documents(registry: &Registry) -> Vec<(String, Document)> {
    const ALL: &[&str] = &[
        "application/json",
        "application/vnd.kubernetes.protobuf",
        "application/yaml",
    ];
    let meta = |k: &str| format!("io.k8s.apimachinery.pkg.apis.meta.v1.{k}");
    let mut docs = vec![
        (
            "api".to_owned(),
            "core".to_owned(),
            "getCoreAPIVersions".to_owned(),
            ALL,
            Some(meta("APIVersions")),
        ),
        (
            "apis".to_owned(),
            "apis".to_owned(),
            "getAPIVersions".to_owned(),
            ALL,
            Some(meta("APIGroupList")),
        ),
        (
            "version".to_owned(),
            "version".to_owned(),
            "getCodeVersion".to_owned(),
            &["application/json"][..],
            Some("io.k8s.apimachinery.pkg.version.Info".to_owned()),
        ),
        (
            ".well-known/openid-configuration".to_owned(),
            "WellKnown".to_owned(),
            "getServiceAccountIssuerOpenIDConfiguration".to_owned(),
            &["application/json"][..],
            None,
        ),
        (
            "openid/v1/jwks".to_owned(),
            "openid".to_owned(),
            "getServiceAccountIssuerOpenIDKeyset".to_owned(),
            &["application/jwk-set+json"][..],
            None,
        ),
    ];
    for (group, _) in registry.groups() {
        let camel = group_camel(group);
        let mut tag = camel.clone();
        if let Some(first) = tag.get_mut(0..1) {
            first.make_ascii_lowercase();
        }
        docs.push((
            format!("apis/{group}"),
            tag,
            format!("get{camel}APIGroup"),
            ALL,
            Some(meta("APIGroup")),
        ));
    }
    docs.into_iter()
        .map(|(key, tag, op, media, schema)| {
            let body = match &schema {
                Some(name) => json!({"$ref": format!("#/components/schemas/{name}")}),
                None => json!({"type": "string"}),
            };
            let content: Map<String, Value> = media
                .iter()
                .map(|m| ((*m).to_owned(), json!({"schema": body.clone()})))
                .collect();
            let op = json!({
                "tags": [tag],
                "operationId": op,
                "responses": {
                    "200": {"description": "OK", "content": content},
                    "401": {"description": "Unauthorized"},
                },
            });
            let paths = json!({ format!("/{key}/"): {"get": op} }).to_string();
            let mut names = BTreeSet::new();
            schemas().referenced(&paths, &mut names);
            let schemas: Map<String, Value> = names
                .iter()
                .filter_map(|n| {
                    let text = schemas().text(n)?;
                    Some(((*n).to_owned(), serde_json::from_str(text).ok()?))
                })
                .collect();
            let mut components = json!({"securitySchemes": security_scheme()});
            if !schemas.is_empty() {
                components["schemas"] = Value::Object(schemas);
            }
            let doc = json!({
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes", "version": version_string()},
                "paths": serde_json::from_str::<Value>(&paths).unwrap_or(Value::Null),
                "components": components,
            });
            (key, Document::new(doc.to_string()))
        })
        .collect()
}

fn security_scheme() -> Value {
    json!({"BearerToken": {"type": "apiKey", "name": "authorization", "in": "header"}})
}

/// `info.version` as kube-apiserver sets it (`v1.37.2` → `1.37`).
fn version_string() -> String {
    let v = crate::KUBERNETES_VERSION.trim_start_matches('v');
    let mut parts = v.split('.');
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) => format!("{a}.{b}"),
        _ => v.to_owned(),
    }
}

/// The definitions the served paths use (the names are the same in both forms), custom
/// resources' included, each in v2 form when `f` asks for it.
fn v2_definitions(registry: &Registry, mut f: impl FnMut(&str, Value)) {
    let mut names = BTreeSet::new();
    let mut custom: BTreeMap<String, Value> = BTreeMap::new();
    for (g, v) in group_versions(registry) {
        schemas().referenced(
            &Value::Object(gv_paths(registry, g, v, true)).to_string(),
            &mut names,
        );
        for r in registry.in_group_version(g, v) {
            for (n, d) in r.strategy.openapi_definitions().into_iter().flatten() {
                schemas().referenced(&d.to_string(), &mut names);
                custom.insert(n, d);
            }
        }
    }
    for n in &names {
        f(n, v2_definition(n));
    }
    for (n, mut d) in custom {
        crd_schema_to_v2(&mut d, true);
        f(&n, schema_to_v2(&d));
    }
}

/// What OpenAPI v2 (and kubectl reading it) cannot express, taken out of a custom
/// resource's structural schema as apiextensions-apiserver's ToStructuralOpenAPIV2 does:
/// junctors go, a nullable field loses its type and children, a field that preserves
/// unknown fields loses its children (and, below the root, its object type).
fn crd_schema_to_v2(s: &mut Value, root: bool) {
    let Some(o) = s.as_object_mut() else {
        return;
    };
    for k in ["allOf", "oneOf", "anyOf", "not"] {
        o.remove(k);
    }
    if o.remove("nullable") == Some(Value::Bool(true)) {
        o.remove("type");
        o.remove("items");
        o.remove("properties");
    }
    if o.remove("x-kubernetes-preserve-unknown-fields") == Some(Value::Bool(true)) {
        o.remove("items");
        o.remove("properties");
        if !root && o.get("type").and_then(Value::as_str) == Some("object") {
            o.remove("type");
        }
    }
    if o.get("type").and_then(Value::as_str) == Some("array") && !o.contains_key("items") {
        o.remove("type");
    }
    // Required fields that may be null are not required in v2.
    let nullable: Vec<String> = o
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.iter()
                .filter(|(_, v)| v.get("nullable") == Some(&Value::Bool(true)))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    if let Some(req) = o.get_mut("required").and_then(Value::as_array_mut) {
        req.retain(|r| !r.as_str().is_some_and(|r| nullable.iter().any(|n| n == r)));
    }
    if let Some(props) = o.get_mut("properties").and_then(Value::as_object_mut) {
        for v in props.values_mut() {
            crd_schema_to_v2(v, false);
        }
    }
    if let Some(items) = o.get_mut("items") {
        crd_schema_to_v2(items, false);
    }
    if let Some(extra) = o.get_mut("additionalProperties").filter(|v| v.is_object()) {
        crd_schema_to_v2(extra, false);
    }
}

/// One definition in v2 form, parsed for the conversion only (the value is not kept).
fn v2_definition(name: &str) -> Value {
    let def: Value = schemas()
        .text(name)
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_else(|| json!({}));
    schema_to_v2(&def)
}

/// The backends' definitions that this server does not define itself (a name it has is
/// its own: the meta types are the same facts), each once.
fn extra_definitions<'a>(
    extra: &'a [V2Part],
    own: &BTreeSet<String>,
) -> impl Iterator<Item = (&'a String, &'a Value)> {
    let mut seen = own.clone();
    extra
        .iter()
        .flat_map(|p| p.definitions.iter())
        .filter(move |(n, _)| seen.insert((*n).clone()))
}

/// The OpenAPI v2 document: every served group version's paths, in v2 form, then the
/// backends' (`extra`). Each definition is converted and written on its own, so building
/// it holds few values at once.
fn v2_document(registry: &Registry, extra: &[V2Part]) -> Document {
    let mut out = String::new();
    out.push_str("{\"swagger\":\"2.0\",\"info\":");
    out.push_str(&json!({"title": "Kubernetes", "version": crate::KUBERNETES_VERSION}).to_string());
    out.push_str(",\"paths\":{");
    let mut paths = Members::new(&mut out);
    for (g, v) in group_versions(registry) {
        for (p, item) in gv_paths(registry, g, v, true) {
            paths.push(&p, &path_item_to_v2(&item));
        }
    }
    for (p, item) in extra.iter().flat_map(|e| e.paths.iter()) {
        paths.push(p, item);
    }
    out.push_str("},\"definitions\":{");
    let mut own = BTreeSet::new();
    let mut definitions = Members::new(&mut out);
    v2_definitions(registry, |n, d| {
        own.insert(n.to_owned());
        definitions.push(n, &d);
    });
    for (n, d) in extra_definitions(extra, &own) {
        definitions.push(n, d);
    }
    out.push_str("},\"securityDefinitions\":");
    out.push_str(&security_scheme().to_string());
    out.push_str(",\"security\":[{\"BearerToken\":[]}]}");
    Document::new(out)
}

/// Writes the members of a JSON object one at a time, commas between them.
struct Members<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> Members<'a> {
    fn new(out: &'a mut String) -> Self {
        Members { out, first: true }
    }

    fn push(&mut self, name: &str, value: &Value) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        self.out.push_str(&json!(name).to_string());
        self.out.push(':');
        self.out.push_str(&value.to_string());
    }
}

/// Media type of the protobuf form of `/openapi/v2` as clients ask for it.
const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
/// ... and as kube-apiserver labels its answer.
const V2_PROTOBUF_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

enum V2Format {
    Json,
    Protobuf,
}

/// The form of `/openapi/v2` the Accept header prefers, if any is served.
fn v2_format(accept: Option<&str>) -> Option<V2Format> {
    let Some(a) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(V2Format::Json);
    };
    a.split(',')
        .find_map(|r| match r.split(';').next().unwrap_or("").trim() {
            "application/json" | "application/*" | "*/*" => Some(V2Format::Json),
            V2_PROTOBUF | V2_PROTOBUF_TYPE => Some(V2Format::Protobuf),
            _ => None,
        })
}

/// Answers `GET /openapi/v2`, `/openapi/v3` and `/openapi/v3/<group version>`; `None` for
/// any other path or method (the caller answers 404).
pub fn serve(
    docs: &Documents,
    registry: &Registry,
    method: &http::Method,
    path: &str,
    query: &BTreeMap<String, String>,
    accept: Option<&str>,
    if_none_match: Option<&str>,
) -> Option<http::Response<Bytes>> {
    if method != http::Method::GET && method != http::Method::HEAD {
        return None;
    }
    if path == "/openapi/v2" {
        let (d, content_type) = match v2_format(accept) {
            Some(V2Format::Json) => (docs.v2(registry), "application/json"),
            Some(V2Format::Protobuf) => (docs.v2_protobuf(registry), V2_PROTOBUF_TYPE),
            None => return Some(not_acceptable()),
        };
        let mut resp = document_response(&d, "no-cache, private", if_none_match);
        set(&mut resp, "content-type", content_type);
        return Some(resp);
    }
    if path == "/openapi/v3" {
        let mut resp = http::Response::new(docs.v3_index(registry));
        set(&mut resp, "content-type", "text/plain; charset=utf-8");
        set(&mut resp, "cache-control", "no-cache, private");
        return Some(resp);
    }
    let key = path.strip_prefix("/openapi/v3/")?;
    let Some(d) = docs.v3_group(registry, key) else {
        let mut resp = http::Response::new(Bytes::new());
        *resp.status_mut() = http::StatusCode::NOT_FOUND;
        set(&mut resp, "cache-control", "no-cache, private");
        return Some(resp);
    };
    if !accepts_json(accept) {
        return Some(not_acceptable());
    }
    match query.get("hash") {
        // The hash the index named: the document never changes at this URL.
        Some(h) if *h == d.hash => {
            let mut resp = document_response(&d, "public, immutable", if_none_match);
            let expires = http_date(crate::time::now_secs() + 365 * 24 * 3600);
            set(&mut resp, "expires", &expires);
            Some(resp)
        }
        // A stale hash: upstream redirects to the current one.
        Some(_) => {
            let mut resp = http::Response::new(Bytes::new());
            *resp.status_mut() = http::StatusCode::MOVED_PERMANENTLY;
            set(
                &mut resp,
                "location",
                &format!("/openapi/v3/{key}?hash={}", d.hash),
            );
            set(&mut resp, "etag", &format!("\"{}\"", d.hash));
            set(&mut resp, "cache-control", "no-cache, private");
            set(&mut resp, "vary", "Accept");
            Some(resp)
        }
        None => Some(document_response(&d, "no-cache, private", if_none_match)),
    }
}

fn set(resp: &mut http::Response<Bytes>, name: &'static str, value: &str) {
    if let Ok(v) = http::HeaderValue::from_str(value) {
        resp.headers_mut().insert(name, v);
    }
}

fn document_response(
    d: &Document,
    cache_control: &str,
    if_none_match: Option<&str>,
) -> http::Response<Bytes> {
    let etag = format!("\"{}\"", d.hash);
    let unchanged = if_none_match.is_some_and(|t| t.split(',').any(|t| t.trim() == etag));
    let mut resp = if unchanged {
        let mut r = http::Response::new(Bytes::new());
        *r.status_mut() = http::StatusCode::NOT_MODIFIED;
        r
    } else {
        http::Response::new(d.body.clone())
    };
    set(&mut resp, "content-type", "application/json");
    set(&mut resp, "etag", &etag);
    set(&mut resp, "cache-control", cache_control);
    set(&mut resp, "vary", "Accept");
    resp
}

fn not_acceptable() -> http::Response<Bytes> {
    let status = kumo_apimachinery::status::ApiError::not_acceptable(&["application/json"]);
    let mut resp = http::Response::new(Bytes::from(status.to_status().to_string()));
    *resp.status_mut() = http::StatusCode::NOT_ACCEPTABLE;
    set(&mut resp, "content-type", "application/json");
    set(&mut resp, "cache-control", "no-cache, private");
    resp
}

/// Whether an Accept header admits the JSON documents (the protobuf form of the v3
/// documents is not served).
fn accepts_json(accept: Option<&str>) -> bool {
    let Some(a) = accept.filter(|a| !a.trim().is_empty()) else {
        return true;
    };
    a.split(',').any(|r| {
        let essence = r.split(';').next().unwrap_or("").trim();
        matches!(essence, "application/json" | "application/*" | "*/*")
    })
}

/// An HTTP date as kube-apiserver writes `Expires` (`Thu, 02 Dec 2027 19:56:00 UTC`).
fn http_date(secs: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let rfc = crate::time::format_rfc3339(secs);
    // 2027-12-02T19:56:00Z
    let num = |r: std::ops::Range<usize>| rfc.get(r).and_then(|x| x.parse::<usize>().ok());
    let (Some(y), Some(m), Some(d)) = (num(0..4), num(5..7), num(8..10)) else {
        return rfc;
    };
    let weekday = DAYS[secs.div_euclid(86400).rem_euclid(7) as usize];
    let month = MONTHS.get(m.wrapping_sub(1)).copied().unwrap_or("Jan");
    let hms = rfc.get(11..19).unwrap_or("00:00:00");
    format!("{weekday}, {d:02} {month} {y} {hms} UTC")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates() {
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 UTC");
        assert_eq!(http_date(1827777360), "Thu, 02 Dec 2027 19:56:00 UTC");
        assert!(accepts_json(None));
        assert!(accepts_json(Some("application/json, */*")));
        assert!(!accepts_json(Some(
            "application/com.github.proto-openapi.spec.v3@v1.0+protobuf"
        )));
        assert!(matches!(
            v2_format(Some(V2_PROTOBUF)),
            Some(V2Format::Protobuf)
        ));
        assert!(v2_format(Some("text/html")).is_none());
    }

    #[test]
    fn schemas_index_kinds() {
        let s = schemas();
        assert_eq!(s.for_kind("", "v1", "Pod"), Some("io.k8s.api.core.v1.Pod"));
        assert_eq!(
            s.for_kind("coordination.k8s.io", "v1", "Lease"),
            Some("io.k8s.api.coordination.v1.Lease")
        );
        assert_eq!(s.for_kind("", "v1", "DeleteOptions"), None);
        let spec = s.get("io.k8s.api.core.v1.PodSpec").unwrap();
        let containers = &spec["properties"]["containers"];
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(containers["x-kubernetes-list-type"], "map");
        // Upstream's descriptions, from k8s-openapi (the apimachinery build script).
        let node_name = &spec["properties"]["nodeName"]["description"];
        assert!(
            node_name
                .as_str()
                .unwrap_or("")
                .starts_with("NodeName indicates in which node this pod is scheduled."),
            "{node_name}"
        );
        let names: Vec<&str> = kumo_apimachinery::openapi::refs_in(
            r##"{"a":{"$ref":"#/components/schemas/X"},"b":[{"$ref":"#/components/schemas/Y"}]}"##,
        )
        .collect();
        assert_eq!(names, ["X", "Y"]);
    }

    #[test]
    fn names() {
        assert_eq!(group_camel(""), "Core");
        assert_eq!(group_camel("coordination.k8s.io"), "Coordination");
        assert_eq!(
            group_camel("rbac.authorization.k8s.io"),
            "RbacAuthorization"
        );
        assert_eq!(version_string(), "1.37");
    }

    #[test]
    fn documents_cover_the_registry() {
        let reg = Registry::builtin();
        let docs = Documents::default();
        let index: Value = serde_json::from_slice(&docs.v3_index(&reg)).unwrap();
        let url = index["paths"]["api/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/api/v1?hash="), "{url}");
        let d = docs.v3_group(&reg, "api/v1").unwrap();
        assert_eq!(d.hash.len(), 128);
        let v: Value = serde_json::from_slice(&d.body).unwrap();
        let patch = &v["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Pod");
        assert_eq!(patch["operationId"], "patchCoreV1NamespacedPod");
        assert!(patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation"));
        assert!(v["components"]["schemas"]["io.k8s.api.core.v1.Container"].is_object());
        // Only served kinds' paths.
        let mut served: BTreeSet<&str> = reg.in_group_version("", "v1").map(|r| r.kind).collect();
        served.insert("Scale");
        for item in v["paths"].as_object().unwrap().values() {
            for op in item.as_object().unwrap().values() {
                if let Some(k) = op.pointer("/x-kubernetes-group-version-kind/kind") {
                    assert!(served.contains(k.as_str().unwrap()), "{k}");
                }
            }
        }
        let v2: Value = serde_json::from_slice(&docs.v2(&reg).body).unwrap();
        assert_eq!(
            v2["definitions"]["io.k8s.api.core.v1.Pod"]["properties"]["spec"]["$ref"],
            "#/definitions/io.k8s.api.core.v1.PodSpec"
        );
    }
}
