//! The verbs every resource shares: create, get, list, watch, update, patch, delete and
//! deletecollection, over the store, with upstream's semantics and errors.
//!
//! Objects are handled as JSON values so that the same code serves built-in resources and,
//! later, custom resources. What differs per resource lives in its [`Strategy`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use kumo_apimachinery::selector::{FieldSelector, LabelSelector, Operator};
use kumo_apimachinery::status::{success_status, ApiError, Cause};
use kumo_apimachinery::validation::{self, FieldError, Path};
use kumo_storage::{RangeRequest, Revision, StorageError, Store, WatchEvent};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::cache::{CacheEvent, Cached, NoWatch, PageQuery, WatchCaches};
use crate::negotiate::{Accept, Output};
use crate::registry::{json_path_pointer, Resource, SelectorForm};

tokio::task_local! {
    /// Warnings for the reply to the request being handled, sent as `Warning: 299` headers
    /// (set up by the handler around each request).
    pub static WARNINGS: std::cell::RefCell<Vec<String>>;
}

/// Adds a warning to the reply of the request being handled (nothing outside a request).
pub fn warn(message: String) {
    let _ = WARNINGS.try_with(|w| w.borrow_mut().push(message));
}

/// What a verb answers: a JSON document with a status code, or a stream of watch events.
pub enum Reply {
    Json(u16, Value),
    /// A JSON document already serialized (lists spliced from the watch cache).
    Raw(u16, Bytes),
    /// Watch events, one JSON document per frame.
    Stream(mpsc::Receiver<Bytes>),
}

/// Shared state of the verbs.
pub struct Rest {
    pub store: Arc<dyn Store>,
    /// Lists and watches are served from here when they can be.
    pub caches: WatchCaches,
    /// The admission plugins beyond the strategies' own (set once at start).
    pub admission: std::sync::OnceLock<crate::admission::Chain>,
    /// Whether `store` is etcd (componentstatuses then report `etcd-0`).
    pub store_is_etcd: bool,
    /// The simulated pod network, when the cluster's pods live in one: what a Service
    /// reference (an admission webhook's) connects through, never the host's network.
    pub pod_network: Option<Arc<dyn crate::resource_proxy::PodNetwork>>,
}

/// The options object of a write, as admission webhooks see it.
fn write_options(kind: &str, req: &Request<'_>, dry_run: bool) -> Value {
    let mut o = json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
    if let Some(m) = req.param("fieldManager") {
        o["fieldManager"] = json!(m);
    }
    if dry_run {
        o["dryRun"] = json!(["All"]);
    }
    o
}

/// How long a list or watch waits for the watch cache to reach the revision it needs
/// before it reads the store instead (kube-apiserver waits up to 3 s).
const CACHE_WAIT: Duration = Duration::from_secs(3);

/// The parts of a request the verbs need.
pub struct Request<'a> {
    pub query: &'a BTreeMap<String, String>,
    pub accept: Accept,
    pub content_type: Option<&'a str>,
    pub body: &'a [u8],
}

impl<'a> Request<'a> {
    /// A JSON body answered with the object, as the server's own controllers send.
    pub fn json(query: &'a BTreeMap<String, String>, body: &'a [u8]) -> Self {
        Request {
            query,
            accept: Accept::OBJECT,
            content_type: Some("application/json"),
            body,
        }
    }

    fn param(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str)
    }

    /// `dryRun`, validated as a field of `options` (CreateOptions, UpdateOptions, ...).
    fn dry_run(&self, options: &str) -> Result<bool, ApiError> {
        match self.param("dryRun") {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(invalid_options(
                options,
                "dryRun",
                "FieldValueNotSupported",
                &format!(
                    "Unsupported value: [{}]: supported values: \"All\"",
                    kumo_apimachinery::validation::go_quote(other)
                ),
            )),
        }
    }
}

/// Maps a storage error on one object to the API's answer.
fn storage_error(res: &Resource, name: &str, e: StorageError) -> ApiError {
    let gr = res.group_resource();
    match e {
        StorageError::NotFound => ApiError::not_found(&gr, name),
        StorageError::AlreadyExists { .. } => ApiError::already_exists(&gr, name),
        StorageError::Conflict { .. } => ApiError::stale_update(&gr, name),
        StorageError::Compacted {
            requested,
            compacted,
        } => ApiError::resource_expired(format!(
            "too old resource version: {requested} ({compacted})"
        )),
        StorageError::FutureRevision { requested, current } => {
            ApiError::too_large_resource_version(requested, current)
        }
        StorageError::ValueTooLarge { .. } => {
            ApiError::request_entity_too_large(kumo_storage::Limits::default().max_value_bytes)
        }
        other => ApiError::internal(other),
    }
}

/// Decodes a stored object as the endpoint `res` serves it and stamps its resourceVersion.
fn decode_stored(res: &Resource, bytes: &[u8], rv: Revision) -> Result<Value, ApiError> {
    let obj = decode_raw(bytes, rv)?;
    res.strategy.served_form(obj)
}

/// Decodes a stored object in its stored form.
fn decode_raw(bytes: &[u8], rv: Revision) -> Result<Value, ApiError> {
    let mut obj: Value = serde_json::from_slice(bytes).map_err(ApiError::internal)?;
    set_meta(&mut obj, "resourceVersion", json!(rv.to_string()));
    Ok(obj)
}

/// Encodes an object for storage, in its stored form and without its resourceVersion,
/// which is the store's.
fn encode_stored(res: &Resource, obj: &Value) -> Result<Vec<u8>, ApiError> {
    let mut obj = res.strategy.stored_form(obj.clone())?;
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    serde_json::to_vec(&obj).map_err(ApiError::internal)
}

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(obj: &'a Value, k: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(k)).and_then(Value::as_str)
}

fn set_meta(obj: &mut Value, k: &str, v: Value) {
    if let Some(o) = obj.as_object_mut() {
        let m = o.entry("metadata").or_insert_with(|| json!({}));
        if let Some(m) = m.as_object_mut() {
            m.insert(k.to_owned(), v);
        }
    }
}

/// A JSON map of strings (a label map).
fn labels_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|l| {
            l.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    meta(obj)
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .map(|l| {
            l.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// A 422 Invalid answer for these field errors.
pub fn invalid(res: &Resource, name: &str, errs: &[FieldError]) -> ApiError {
    invalid_kind(res.group, res.kind, name, errs)
}

/// A 422 Invalid answer for an object of `kind` in `group` (the message names the
/// qualified kind, `Deployment.apps`, as upstream).
fn invalid_kind(group: &str, kind: &str, name: &str, errs: &[FieldError]) -> ApiError {
    let causes = errs.iter().map(FieldError::to_cause).collect();
    let qualified = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    ApiError::invalid(
        group,
        kind,
        name,
        validation::invalid_message(&qualified, name, errs),
        causes,
    )
}

/// The autoscaling/v1 Scale of an object, read where its strategy says replicas and the
/// selector live.
fn scale_of(res: &Resource, obj: &Value) -> Result<Value, ApiError> {
    let spec = res.strategy.scale().ok_or_else(ApiError::path_not_found)?;
    let int = |path: &str| {
        obj.pointer(&json_path_pointer(path))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    let selector = match &spec.selector {
        None => String::new(),
        Some((path, form)) => {
            let at = obj.pointer(&json_path_pointer(path));
            match form {
                SelectorForm::Serialized => at.and_then(Value::as_str).unwrap_or("").to_owned(),
                SelectorForm::LabelSelector => LabelSelector::from_json(at.unwrap_or(&Value::Null))
                    .map_err(|e| ApiError::bad_request(format!("invalid label selector: {e}")))?
                    .to_string(),
                SelectorForm::Map => LabelSelector::from_set(&labels_map(at)).to_string(),
            }
        }
    };
    let mut metadata = Map::new();
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta(obj).and_then(|m| m.get(k)) {
            metadata.insert(k.to_owned(), v.clone());
        }
    }
    let replicas = int(&spec.spec_replicas);
    let mut status = json!({"replicas": int(&spec.status_replicas)});
    if !selector.is_empty() {
        status["selector"] = json!(selector);
    }
    Ok(json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": metadata,
        // (replicas is omitted when 0, as upstream)
        "spec": if replicas == 0 { json!({}) } else { json!({"replicas": replicas}) },
        "status": status,
    }))
}

/// The object `old` with the desired replicas of `scale` (validated as upstream's
/// ValidateScale).
fn with_scale(res: &Resource, name: &str, old: &Value, scale: &Value) -> Result<Value, ApiError> {
    let spec = res.strategy.scale().ok_or_else(ApiError::path_not_found)?;
    let replicas = scale
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if replicas < 0 {
        let errs =
            validation::validate_nonnegative_field(replicas, &Path::new("spec").child("replicas"));
        return Err(invalid_kind("autoscaling", "Scale", name, &errs));
    }
    let mut new = old.clone();
    let pointer = json_path_pointer(&spec.spec_replicas);
    let (parent, field) = pointer.rsplit_once('/').unwrap_or(("", ""));
    let mut cur = &mut new;
    for key in parent.split('/').filter(|k| !k.is_empty()) {
        if !cur.get(key).is_some_and(Value::is_object) {
            cur[key] = json!({});
        }
        cur = &mut cur[key];
    }
    cur[field] = json!(replicas);
    Ok(new)
}

/// A Scale in the representation asked for; its Table is upstream's printScale.
fn render_scale(req: &Request<'_>, scale: Value) -> Value {
    match req.accept.output {
        Output::Object => scale,
        Output::Metadata => partial_metadata(&scale),
        Output::Table => {
            use crate::registry::Column;
            let columns = [
                Column {
                    format: "",
                    ..Column::NAME
                },
                Column {
                    name: "Desired",
                    type_: "integer",
                    format: "",
                    description: "The desired number of replicas.",
                    priority: 0,
                },
                Column {
                    name: "Available",
                    type_: "integer",
                    format: "",
                    description: "The observed number of replicas.",
                    priority: 0,
                },
                Column::AGE,
            ];
            let int = |p: &str| scale.pointer(p).and_then(Value::as_i64).unwrap_or(0);
            let cells = json!([
                meta_str(&scale, "name").unwrap_or(""),
                int("/spec/replicas"),
                int("/status/replicas"),
                crate::time::age(meta_str(&scale, "creationTimestamp")),
            ]);
            let object = match req.param("includeObject").unwrap_or("Metadata") {
                "None" => Value::Null,
                "Object" => scale.clone(),
                _ => partial_metadata(&scale),
            };
            json!({
                "kind": "Table",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": meta_str(&scale, "resourceVersion").unwrap_or("")},
                "columnDefinitions": columns.iter().map(Column::to_json).collect::<Vec<_>>(),
                "rows": [{"cells": cells, "object": object}],
            })
        }
    }
}

/// Checks the kind of a Scale sent to a `scale` subresource.
fn check_scale_type(obj: &mut Value) -> Result<(), ApiError> {
    let (o, kind, api_version) = body_type(obj)?;
    if (!kind.is_empty() && kind != "Scale")
        || (!api_version.is_empty() && api_version != "autoscaling/v1")
    {
        let version = api_version.rsplit('/').next().unwrap_or("");
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a Scale: converting ({version}.{kind}) to (autoscaling.Scale): unknown conversion"
        )));
    }
    o.insert("kind".into(), json!("Scale"));
    o.insert("apiVersion".into(), json!("autoscaling/v1"));
    if !o.get("metadata").is_some_and(Value::is_object) {
        o.insert("metadata".into(), json!({}));
    }
    Ok(())
}

/// A request body's object with the kind and apiVersion it declares ("" when absent).
fn body_type(obj: &mut Value) -> Result<(&mut Map<String, Value>, String, String), ApiError> {
    let Some(o) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized (must be of type object)",
        ));
    };
    let field = |k: &str| o.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let (kind, api_version) = (field("kind"), field("apiVersion"));
    Ok((o, kind, api_version))
}

/// Characters of generated name suffixes (no vowels, no look-alikes), as upstream.
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Objects a test deletes from the store right after a graceless delete marked them, as
/// a kubelet racing the request would (kubernetes#19403).
#[cfg(test)]
static RACING_DELETERS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Suffixes a test hands out, per generateName prefix, before random ones.
#[cfg(test)]
static FORCED_SUFFIXES: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

fn random_suffix(prefix: &str) -> String {
    #[cfg(test)]
    {
        let mut forced = FORCED_SUFFIXES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = forced.iter().position(|(p, _)| p == prefix) {
            return forced.remove(i).1;
        }
    }
    let _ = prefix;
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes[..5]
        .iter()
        .map(|b| NAME_ALPHABET[*b as usize % NAME_ALPHABET.len()] as char)
        .collect()
}

/// Checks apiVersion and kind of a request body against the endpoint's.
fn check_type(res: &Resource, obj: &mut Value) -> Result<(), ApiError> {
    let (o, kind, api_version) = body_type(obj)?;
    if kind.is_empty() {
        o.insert("kind".into(), json!(res.kind));
    } else if kind != res.kind {
        // The decoder reads the body as the kind it names, then fails to convert it to the
        // endpoint's internal type (Go package `core` for the core group, else the group's
        // first label).
        let version = match api_version.rsplit('/').next() {
            Some(v) if !v.is_empty() => v.to_owned(),
            _ => res.version.to_owned(),
        };
        let internal = match res.group.split('.').next() {
            Some("") | None => "core",
            Some(g) => g,
        };
        return Err(ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {}: converting ({version}.{kind}) to ({internal}.{}): unknown conversion",
            res.kind, res.kind
        )));
    }
    if api_version.is_empty() {
        o.insert("apiVersion".into(), json!(res.api_version()));
    } else if api_version != res.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            res.api_version()
        )));
    }
    match o.get("metadata") {
        None => {
            o.insert("metadata".into(), json!({}));
        }
        Some(Value::Object(_)) => {}
        Some(_) => return Err(ApiError::bad_request("metadata: expected an object")),
    }
    // Every field must have the JSON type of its schema, as decoding into the typed Go
    // object demands upstream; strategies rely on it.
    if let Some(e) = crate::openapi::type_error(res, obj) {
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {e}",
            kind = res.kind,
            version = res.version,
        )));
    }
    Ok(())
}

/// A body sent to an object's URL names that object: its name and namespace, when
/// given, must be the URL's (and are filled in from it when not).
fn match_url(
    res: &Resource,
    ns: Option<&str>,
    name: &str,
    obj: &mut Value,
) -> Result<(), ApiError> {
    match meta_str(obj, "name") {
        Some(n) if !n.is_empty() && n != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )))
        }
        _ => set_meta(obj, "name", json!(name)),
    }
    if res.namespaced {
        match meta_str(obj, "namespace") {
            Some(n) if !n.is_empty() && Some(n) != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => set_meta(obj, "namespace", json!(ns.unwrap_or(""))),
        }
    }
    Ok(())
}

/// Validation every resource shares: name, namespace, labels, annotations.
fn validate_meta(res: &Resource, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = meta_str(obj, "name").unwrap_or("");
    let name_path = Path::new("metadata").child("name");
    if name.is_empty() {
        errs.push(FieldError::required(
            &name_path,
            "name or generateName is required",
        ));
    } else {
        for msg in res.strategy.validate_name(name) {
            errs.push(FieldError::invalid(&name_path, name.to_owned(), msg));
        }
    }
    let string_map = |k: &str| -> BTreeMap<String, String> {
        meta(obj)
            .and_then(|m| m.get(k))
            .and_then(Value::as_object)
            .map(|l| {
                l.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    };
    errs.extend(validation::validate_labels(
        &string_map("labels"),
        &Path::new("metadata").child("labels"),
    ));
    errs.extend(validation::validate_annotations(
        &string_map("annotations"),
        &Path::new("metadata").child("annotations"),
    ));
    errs
}

/// Parsed list and watch selectors.
struct Selectors {
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Selectors {
    fn parse(res: &Resource, req: &Request<'_>) -> Result<Selectors, ApiError> {
        let labels = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let fields = FieldSelector::parse(req.param("fieldSelector").unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        // Every field must be one the resource can select on.
        let probe = json!({"metadata": {}});
        let supported: Vec<&str> = ["metadata.name", "metadata.namespace"]
            .into_iter()
            .chain(
                res.strategy
                    .selectable_fields(&probe)
                    .into_iter()
                    .map(|(f, _)| f),
            )
            .collect();
        for field in fields.requirements().iter().map(|r| r.field.as_str()) {
            if !supported.contains(&field) {
                // Kinds with their own field label conversion (the ones with selectable
                // fields) word it their way; the rest get apimachinery's default.
                return Err(ApiError::bad_request(
                    if supported.len() > 2 || res.strategy.converts_field_labels() {
                        format!("field label not supported: {field}")
                    } else {
                        format!(
                        "{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                    )
                    },
                ));
            }
        }
        Ok(Selectors { labels, fields })
    }

    /// The value the field selector pins the cache's index field to (`field=value`), if any.
    fn indexed_value(&self, index: Option<crate::cache::WatchIndex>) -> Option<&str> {
        let field = index?.field;
        self.fields
            .requirements()
            .iter()
            .find(|r| {
                r.field == field && matches!(r.operator, Operator::Equals | Operator::DoubleEquals)
            })
            .map(|r| r.value.as_str())
    }

    fn matches(&self, res: &Resource, obj: &Value) -> bool {
        if !self.labels.is_empty() && !self.labels.matches(&labels_of(obj)) {
            return false;
        }
        if self.fields.is_empty() {
            return true;
        }
        let extra = res.strategy.selectable_fields(obj);
        self.fields.matches(|f: &str| match f {
            "metadata.name" => Some(meta_str(obj, "name").unwrap_or("").to_owned()),
            "metadata.namespace" => Some(meta_str(obj, "namespace").unwrap_or("").to_owned()),
            other => extra
                .iter()
                .find(|(k, _)| *k == other)
                .map(|(_, v)| v.clone()),
        })
    }
}

/// The continue token kube-apiserver hands out: unpadded URL-safe base64 of
/// `{"v":"meta.k8s.io/v1","rv":N,"start":"<key after the prefix>"}`.
fn encode_continue(rv: Revision, start: &str) -> String {
    let doc = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(doc.to_string())
}

/// A continue token's revision (None: the latest, the `-1` of an inconsistent continue)
/// and start key.
fn decode_continue(token: &str) -> Result<(Option<Revision>, String), ApiError> {
    // Worded as upstream: "invalid continue token: continue key is not valid: <why>".
    let invalid = |why: String| {
        ApiError::bad_request(format!(
            "invalid continue token: continue key is not valid: {why}"
        ))
    };
    let bad = || ApiError::bad_request("continue key is not valid: invalid continue token");
    if let Some(at) = kumo_apimachinery::gojson::base64_raw_url_error(token.as_bytes()) {
        return Err(invalid(format!("illegal base64 data at input byte {at}")));
    }
    // Go's RawURLEncoding: newlines skipped, stray low bits of the last symbol allowed.
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireNone),
    );
    let raw = lenient
        .decode(token.replace(['\n', '\r'], ""))
        .map_err(|e| invalid(e.to_string()))?;
    let doc: Value = serde_json::from_slice(&raw).map_err(|e| {
        invalid(kumo_apimachinery::gojson::syntax_error(&raw).unwrap_or_else(|| e.to_string()))
    })?;
    if doc.get("v").and_then(Value::as_str) != Some("meta.k8s.io/v1") {
        return Err(ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        ));
    }
    // 0 is invalid; a negative revision continues at the latest one (the token an expired
    // continue hands out).
    let rv = doc
        .get("rv")
        .and_then(Value::as_i64)
        .filter(|r| *r != 0)
        .ok_or_else(bad)?;
    let start = doc.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    if start.contains("..") || start.starts_with('/') {
        return Err(bad());
    }
    Ok(((rv > 0).then_some(rv), start.to_owned()))
}

/// A resourceVersion from the query, as the storage layer parses it (a 500 whose message
/// is the field error, as kube-apiserver answers).
fn parse_rv(s: &str) -> Result<Revision, ApiError> {
    s.parse::<u64>()
        .ok()
        .and_then(|r| Revision::try_from(r).ok())
        .ok_or_else(|| {
            ApiError::unclassified(format!(
                "resourceVersion: Invalid value: {}: {}",
                validation::go_quote(s),
                go_strconv_error("ParseUint", s)
            ))
        })
}

/// A resourceVersion a list reads at: a 400, as the storage layer's list answers.
fn parse_list_rv(s: &str) -> Result<Revision, ApiError> {
    parse_rv(s)
        .map_err(|e| ApiError::bad_request(format!("invalid resource version: {}", e.message)))
}

/// Upstream's ValidateListOptions (with the WatchList feature on, as in v1.37): how
/// `resourceVersionMatch`, `sendInitialEvents` and `continue` may combine, for a list and
/// for a watch. All errors at once, as one 422 for `ListOptions.meta.k8s.io`.
fn validate_list_options(req: &Request<'_>, watch: bool) -> Result<(), ApiError> {
    let param = |k: &str| req.param(k).filter(|v| !v.is_empty());
    let rvm = Path::new("resourceVersionMatch");
    let matching = param("resourceVersionMatch");
    let send_initial = param("sendInitialEvents").is_some();
    let continued = param("continue").is_some();
    let mut errs = Vec::new();
    let forbidden = |errs: &mut Vec<FieldError>, detail: &str| {
        errs.push(FieldError::forbidden(&rvm, detail));
    };
    if watch {
        if send_initial && matching != Some("NotOlderThan") {
            forbidden(
                &mut errs,
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            );
        }
        if let Some(m) = matching {
            if !send_initial {
                forbidden(
                    &mut errs,
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                );
            }
            if m != "NotOlderThan" {
                errs.push(FieldError::not_supported(&rvm, m, &["NotOlderThan"]));
            }
            if continued {
                forbidden(
                    &mut errs,
                    "resourceVersionMatch is forbidden when continue is provided",
                );
            }
        }
    } else {
        if let Some(m) = matching {
            if param("resourceVersion").is_none() {
                forbidden(
                    &mut errs,
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                );
            }
            if continued {
                forbidden(
                    &mut errs,
                    "resourceVersionMatch is forbidden when continue is provided",
                );
            }
            if m != "Exact" && m != "NotOlderThan" {
                errs.push(FieldError::not_supported(
                    &rvm,
                    m,
                    &["Exact", "NotOlderThan", ""],
                ));
            }
            if m == "Exact" && param("resourceVersion") == Some("0") {
                forbidden(
                    &mut errs,
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                );
            }
        }
        if send_initial {
            errs.push(FieldError::forbidden(
                &Path::new("sendInitialEvents"),
                "sendInitialEvents is forbidden for list",
            ));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(invalid_kind("meta.k8s.io", "ListOptions", "", &errs))
    }
}

/// The DeleteOptions of a DELETE: its body, or without one its query parameters (so that
/// `?gracePeriodSeconds=0&propagationPolicy=Foreground` works as upstream), validated as
/// upstream's ValidateDeleteOptions before anything is read.
fn delete_options(req: &Request<'_>) -> Result<Value, ApiError> {
    let opts = if req.body.iter().all(u8::is_ascii_whitespace) {
        let mut o = Map::new();
        if let Some(g) = req.param("gracePeriodSeconds").filter(|g| !g.is_empty()) {
            let g: i64 = g
                .parse()
                .map_err(|_| ApiError::bad_request(go_strconv_error("ParseInt", g)))?;
            o.insert("gracePeriodSeconds".into(), json!(g));
        }
        if let Some(b) = req.param("orphanDependents").filter(|b| !b.is_empty()) {
            let b = go_parse_bool(b).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "strconv.ParseBool: parsing {}: invalid syntax",
                    validation::go_quote(b)
                ))
            })?;
            o.insert("orphanDependents".into(), json!(b));
        }
        if let Some(p) = req.param("propagationPolicy").filter(|p| !p.is_empty()) {
            o.insert("propagationPolicy".into(), json!(p));
        }
        Value::Object(o)
    } else {
        crate::negotiate::decode_body_as("DeleteOptions", req.content_type, req.body)?
    };
    let policy = Path::new("propagationPolicy");
    let mut errs = Vec::new();
    let set = |k: &str| opts.get(k).is_some_and(|v| !v.is_null());
    if set("orphanDependents") && set("propagationPolicy") {
        errs.push(FieldError::invalid(
            &policy,
            opts["propagationPolicy"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            "orphanDependents and deletionPropagation cannot be both set",
        ));
    }
    if let Some(p) = opts.get("propagationPolicy").and_then(Value::as_str) {
        if !matches!(p, "Foreground" | "Background" | "Orphan") {
            errs.push(FieldError::not_supported(
                &policy,
                p,
                &["Foreground", "Background", "Orphan", "nil"],
            ));
        }
    }
    if errs.is_empty() {
        Ok(opts)
    } else {
        Err(invalid_kind("meta.k8s.io", "DeleteOptions", "", &errs))
    }
}

/// Go's strconv.ParseBool.
fn go_parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A resourceVersion from an object's metadata (update, patch): a 500 with Go's parse error.
fn parse_body_rv(s: &str) -> Result<Revision, ApiError> {
    s.parse::<u64>()
        .ok()
        .and_then(|r| Revision::try_from(r).ok())
        .ok_or_else(|| ApiError::unclassified(go_strconv_error("ParseUint", s)))
}

/// Go's strconv error text for a number that does not parse (`ParseInt`, `ParseUint`).
fn go_strconv_error(func: &str, s: &str) -> String {
    let digits = s
        .strip_prefix(['+', '-'])
        .filter(|_| func == "ParseInt")
        .unwrap_or(s);
    let why = if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        "value out of range"
    } else {
        "invalid syntax"
    };
    format!("strconv.{func}: parsing {}: {why}", validation::go_quote(s))
}

/// The 400 for a `limit` that is not a number.
fn go_parse_int_error(s: &str) -> String {
    go_strconv_error("ParseInt", s)
}

/// Strips what list items do not carry (kind and apiVersion).
fn as_list_item(mut obj: Value) -> Value {
    if let Some(o) = obj.as_object_mut() {
        o.remove("kind");
        o.remove("apiVersion");
    }
    obj
}

/// `PartialObjectMetadata` of an object.
fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A `Table` of objects.
fn table(
    res: &Resource,
    objs: &[Value],
    list_meta: Value,
    with_columns: bool,
    include: &str,
) -> Value {
    let columns: Vec<Value> = if with_columns {
        res.strategy.columns().iter().map(|c| c.to_json()).collect()
    } else {
        Vec::new()
    };
    // Some printers order the rows of a list (FlowSchemas by precedence); the sort is
    // stable, so rows the strategy does not order keep the list's order.
    let mut ordered: Vec<&Value> = objs.iter().collect();
    ordered.sort_by(|a, b| res.strategy.row_order(a, b));
    let rows: Vec<Value> = ordered
        .into_iter()
        .map(|o| {
            let object = match include {
                "None" => Value::Null,
                "Object" => o.clone(),
                _ => partial_metadata(o),
            };
            // `includeObject=None` still carries the field, as null (upstream's empty
            // RawExtension).
            json!({"cells": res.strategy.cells(o), "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// A list's metadata: its revision, continue token (`next_start`: where the next page
/// starts, after the prefix) and remaining item count.
fn list_meta(at: Revision, next_start: Option<&str>, remaining: Option<usize>) -> Value {
    let mut meta = json!({"resourceVersion": at.to_string()});
    if let Some(s) = next_start {
        meta["continue"] = json!(encode_continue(at, s));
    }
    if let Some(r) = remaining {
        meta["remainingItemCount"] = json!(r);
    }
    meta
}

/// The answer to a list: the items in the representation asked for, with the list's
/// revision, continue token (`next_start`: where the next page starts, after the prefix)
/// and remaining item count.
fn list_reply(
    res: &Resource,
    req: &Request<'_>,
    items: Vec<Value>,
    at: Revision,
    next_start: Option<String>,
    remaining: Option<usize>,
) -> Reply {
    let list_meta = list_meta(at, next_start.as_deref(), remaining);
    let body = match req.accept.output {
        Output::Table => table(
            res,
            &items,
            list_meta,
            true,
            req.param("includeObject").unwrap_or("Metadata"),
        ),
        Output::Metadata => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": list_meta,
            "items": items.iter().map(partial_metadata).collect::<Vec<_>>(),
        }),
        Output::Object => json!({
            "kind": format!("{}List", res.kind),
            "apiVersion": res.api_version(),
            "metadata": list_meta,
            "items": if res.strategy.list_items_keep_type() {
                items
            } else {
                items.into_iter().map(as_list_item).collect::<Vec<_>>()
            },
        }),
    };
    Reply::Json(200, body)
}

/// A JSON list answer spliced from cached item bytes (see [`list_reply`] for the fields).
fn spliced_list(
    res: &Resource,
    items: &[Bytes],
    at: Revision,
    next_start: Option<String>,
    remaining: Option<usize>,
) -> Reply {
    let list_meta = list_meta(at, next_start.as_deref(), remaining);
    let head = format!(
        "{{\"kind\":{},\"apiVersion\":{},\"metadata\":{list_meta},\"items\":[",
        json!(format!("{}List", res.kind)),
        json!(res.api_version()),
    );
    let size = head.len() + items.iter().map(|b| b.len() + 1).sum::<usize>() + 3;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(head.as_bytes());
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.extend_from_slice(b"]}\n");
    Reply::Raw(200, Bytes::from(out))
}

/// Renders one object in the representation asked for.
fn render_one(res: &Resource, req: &Request<'_>, obj: Value) -> Value {
    match req.accept.output {
        Output::Object => obj,
        Output::Metadata => partial_metadata(&obj),
        Output::Table => {
            let rv = meta_str(&obj, "resourceVersion").unwrap_or("").to_owned();
            table(
                res,
                &[obj],
                json!({"resourceVersion": rv}),
                true,
                req.param("includeObject").unwrap_or("Metadata"),
            )
        }
    }
}

impl Rest {
    /// The verbs over `store`.
    pub fn new(store: Arc<dyn Store>) -> Rest {
        Rest {
            caches: WatchCaches::new(store.clone()),
            store,
            admission: std::sync::OnceLock::new(),
            store_is_etcd: false,
            pod_network: None,
        }
    }

    /// GET of a computed resource (componentstatuses): the collection, selectors applied,
    /// or the object `name`.
    pub async fn get_computed(
        &self,
        res: &Resource,
        computed: &dyn crate::registry::Computed,
        name: Option<&str>,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        let objects = computed.objects(self).await;
        match name {
            Some(n) => {
                let obj = objects
                    .into_iter()
                    .find(|o| meta_str(o, "name") == Some(n))
                    .ok_or_else(|| {
                        ApiError::not_found(
                            &kumo_apimachinery::status::GroupResource::new(res.group, res.singular),
                            n,
                        )
                    })?;
                Ok(Reply::Json(200, render_one(res, req, obj)))
            }
            None => {
                let selectors = Selectors::parse(res, req)?;
                let items: Vec<Value> = objects
                    .into_iter()
                    .filter(|o| selectors.matches(res, o))
                    .collect();
                // Computed lists carry no resourceVersion.
                let mut reply = list_reply(res, req, items, 0, None, None);
                if let Reply::Json(_, doc) = &mut reply {
                    if let Some(m) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.remove("resourceVersion");
                    }
                }
                Ok(reply)
            }
        }
    }

    /// The admission chain (empty until the server sets it).
    pub(crate) fn chain(&self) -> crate::admission::Chain {
        self.admission.get().cloned().unwrap_or_default()
    }

    async fn get_current(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<(Value, Revision), ApiError> {
        let key = res.key(ns, name);
        let (kv, _) = self
            .store
            .get(key.as_bytes(), None)
            .await
            .map_err(|e| storage_error(res, name, e))?;
        let kv = kv.ok_or_else(|| ApiError::not_found(&res.group_resource(), name))?;
        Ok((
            decode_stored(res, &kv.value, kv.mod_revision)?,
            kv.mod_revision,
        ))
    }

    /// NamespaceLifecycle: objects are created only in namespaces that exist and are not
    /// being deleted.
    /// NamespaceLifecycle for creating `name` of `res` in `ns`.
    async fn check_namespace(&self, res: &Resource, name: &str, ns: &str) -> Result<(), ApiError> {
        let key = format!("/registry/namespaces/{ns}");
        let (kv, _) = self
            .store
            .get(key.as_bytes(), None)
            .await
            .map_err(ApiError::internal)?;
        let Some(kv) = kv else {
            return Err(ApiError::not_found(
                &kumo_apimachinery::status::GroupResource::new("", "namespaces"),
                ns,
            ));
        };
        let obj: Value = serde_json::from_slice(&kv.value).map_err(ApiError::internal)?;
        if obj.pointer("/status/phase").and_then(Value::as_str) == Some("Terminating") {
            let mut e = ApiError::forbidden(
                &res.group_resource(),
                name,
                &format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
            );
            if let Some(d) = e.details.as_mut() {
                d.causes.push(Cause {
                    reason: "NamespaceTerminating".into(),
                    message: format!("namespace {ns} is being terminated"),
                    field: "metadata.namespace".into(),
                });
            }
            return Err(e);
        }
        Ok(())
    }

    /// POST on a collection.
    pub async fn create(
        &self,
        res: &Resource,
        ns: Option<&str>,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        let mut obj = crate::negotiate::decode_body_as(res.kind, req.content_type, req.body)?;
        check_type(res, &mut obj)?;
        let problems = crate::openapi::check_fields(
            res,
            req.query,
            "CreateOptions",
            req.content_type,
            req.body,
        )?;
        problems.into_iter().for_each(warn);
        crate::openapi::prune(res, &mut obj);
        self.create_object(res, ns, req, obj, false).await
    }

    /// Creates `obj`; `applied`: its managed fields are a server-side apply's, else the
    /// create is recorded as the request's manager's update. A name made from
    /// `generateName` that is taken is made again, up to 8 attempts in all (upstream's
    /// RetryGenerateName: five random characters collide within some ten thousand names).
    async fn create_object(
        &self,
        res: &Resource,
        ns: Option<&str>,
        req: &Request<'_>,
        obj: Value,
        applied: bool,
    ) -> Result<Reply, ApiError> {
        const ATTEMPTS: usize = 8;
        let generated = meta_str(&obj, "name").unwrap_or("").is_empty()
            && meta_str(&obj, "generateName").is_some_and(|p| !p.is_empty());
        if !generated {
            return self.create_object_once(res, ns, req, obj, applied).await;
        }
        let mut attempt = 1;
        loop {
            let result = self
                .create_object_once(res, ns, req, obj.clone(), applied)
                .await;
            match result {
                Err(e) if e.reason == "AlreadyExists" && attempt < ATTEMPTS => attempt += 1,
                other => return other,
            }
        }
    }

    async fn create_object_once(
        &self,
        res: &Resource,
        ns: Option<&str>,
        req: &Request<'_>,
        mut obj: Value,
        applied: bool,
    ) -> Result<Reply, ApiError> {
        let dry_run = req.dry_run("CreateOptions")?;
        if res.namespaced {
            let ns = ns.unwrap_or("");
            match meta_str(&obj, "namespace") {
                Some(body_ns) if !body_ns.is_empty() && body_ns != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ))
                }
                _ => set_meta(&mut obj, "namespace", json!(ns)),
            }
        } else if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("namespace");
        }
        let name = meta_str(&obj, "name").unwrap_or("").to_owned();
        if name.is_empty() {
            if let Some(prefix) = meta_str(&obj, "generateName").filter(|p| !p.is_empty()) {
                let generated = format!("{prefix}{}", random_suffix(prefix));
                set_meta(&mut obj, "name", json!(generated));
            }
        }
        let name = meta_str(&obj, "name").unwrap_or("").to_owned();
        // Fields the server owns.
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            m.insert(
                "creationTimestamp".into(),
                json!(crate::time::now_rfc3339()),
            );
            if res.strategy.tracks_generation() {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
        }
        // The field manager sees the typed object, without empty omitempty fields.
        crate::omitempty::normalize(&mut obj);
        res.strategy.prepare_create(&mut obj);
        if !applied {
            use crate::fieldmanager::{track_update, Options};
            track_update(res, None, req.query, Options::Create, None, &mut obj)?;
        }
        res.strategy.prepare_for_create(&mut obj);
        // NamespaceLifecycle comes first among the admission plugins.
        if let Some(ns) = ns.filter(|_| res.namespaced) {
            self.check_namespace(res, meta_str(&obj, "name").unwrap_or(""), ns)
                .await?;
        }
        // Admission plugins that change or refuse the object, with the objects they look
        // up (ServiceAccount, Priority, ...).
        let mut found = Vec::new();
        for l in res.strategy.admission_lookups(&obj) {
            let (kv, _) = self
                .store
                .get(l.key.as_bytes(), None)
                .await
                .map_err(ApiError::internal)?;
            let kv = kv.ok_or(l.missing)?;
            found.push((l.what, decode_raw(&kv.value, kv.mod_revision)?));
        }
        for (what, prefix) in res.strategy.admission_lists(&obj) {
            let page = self
                .store
                .range(RangeRequest {
                    prefix: prefix.into_bytes(),
                    start: None,
                    limit: 0,
                    revision: None,
                })
                .await
                .map_err(ApiError::internal)?;
            let items = page
                .kvs
                .iter()
                .map(|kv| decode_raw(&kv.value, kv.mod_revision))
                .collect::<Result<Vec<_>, _>>()?;
            found.push((what, Value::Array(items)));
        }
        res.strategy.admit_create(&mut obj, &found)?;
        let user = crate::auth::current_user();
        let chain = self.chain();
        let attrs = crate::admission::Attributes {
            operation: crate::admission::Operation::Create,
            resource: res,
            subresource: None,
            namespace: ns.filter(|_| res.namespaced),
            name: &name,
            old: None,
            user: &user,
            dry_run,
            options: write_options("CreateOptions", req, dry_run),
            rest: self,
        };
        chain.admit(&attrs, Some(&mut obj)).await?;
        // Allocation comes before validation, as upstream's BeginCreate: its errors win.
        if let Some(a) = res.strategy.allocator() {
            a.allocate(&*self.store, &mut obj, None, dry_run).await?;
        }
        let mut errs = validate_meta(res, &obj);
        errs.extend(res.strategy.validate(&obj));
        if !errs.is_empty() {
            if !dry_run {
                self.release(res, &obj, None).await;
            }
            return Err(invalid(res, &name, &errs));
        }
        if let Err(e) = chain.validate(&attrs, Some(&obj)).await {
            if !dry_run {
                self.release(res, &obj, None).await;
            }
            return Err(e);
        }
        // What the typed round trip leaves out (see `omitempty`).
        crate::omitempty::normalize(&mut obj);
        let key = res.key(ns, &name);
        if dry_run {
            // A dry run goes as far as the store, which refuses an existing name.
            let (existing, _) = self
                .store
                .get(key.as_bytes(), None)
                .await
                .map_err(ApiError::internal)?;
            if existing.is_some() {
                return Err(ApiError::already_exists(&res.group_resource(), &name));
            }
            return Ok(Reply::Json(201, render_one(res, req, obj)));
        }
        let written = match encode_stored(res, &obj) {
            Ok(bytes) => self
                .store
                .create(key.as_bytes(), bytes)
                .await
                .map_err(|e| storage_error(res, &name, e)),
            Err(e) => Err(e),
        };
        let kv = match written {
            Ok(kv) => kv,
            Err(e) => {
                self.release(res, &obj, None).await;
                return Err(e);
            }
        };
        set_meta(
            &mut obj,
            "resourceVersion",
            json!(kv.mod_revision.to_string()),
        );
        tracing::debug!(
            resource = res.plural,
            namespace = ns.unwrap_or(""),
            name,
            "created"
        );
        Ok(Reply::Json(201, render_one(res, req, obj)))
    }

    /// Releases what `held` holds in the store beyond `kept` (see `Allocator`).
    async fn release(&self, res: &Resource, held: &Value, kept: Option<&Value>) {
        if let Some(a) = res.strategy.allocator() {
            a.release(&*self.store, held, kept).await;
        }
    }

    /// GET of one object.
    pub async fn get(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        let key = res.key(ns, name);
        if req.param("resourceVersion") == Some("0") {
            // Any revision will do: the watch cache answers, as upstream's does.
            let cache = self
                .caches
                .get_indexed(&res.key_prefix(None), res.strategy.watch_index());
            if let Some(found) = cache.get(&key) {
                let obj = found.ok_or_else(|| ApiError::not_found(&res.group_resource(), name))?;
                if req.accept.output == Output::Object
                    && !req.accept.yaml
                    && !res.strategy.converts()
                {
                    let mut out = obj.object_json();
                    out.push(b'\n');
                    return Ok(Reply::Raw(200, Bytes::from(out)));
                }
                let obj = res.strategy.served_form(obj.object())?;
                return Ok(Reply::Json(200, render_one(res, req, obj)));
            }
        }
        let revision = match req.param("resourceVersion") {
            None | Some("") | Some("0") => None,
            Some(rv) => Some(parse_rv(rv)?),
        };
        let (kv, _) = self
            .store
            .get(key.as_bytes(), revision)
            .await
            .map_err(|e| storage_error(res, name, e))?;
        let kv = kv.ok_or_else(|| ApiError::not_found(&res.group_resource(), name))?;
        let obj = decode_stored(res, &kv.value, kv.mod_revision)?;
        Ok(Reply::Json(200, render_one(res, req, obj)))
    }

    /// GET of the `scale` subresource: the object's autoscaling/v1 Scale.
    pub async fn get_scale(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        let (obj, _) = self.get_current(res, ns, name).await?;
        Ok(Reply::Json(200, render_scale(req, scale_of(res, &obj)?)))
    }

    /// GET of a collection (without `watch`).
    pub async fn list(
        &self,
        res: &Resource,
        ns: Option<&str>,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        self.list_as(res, ns, req, true).await
    }

    /// A list; `raw_ok`: the answer may be [`Reply::Raw`] (callers that read the items
    /// themselves ask for [`Reply::Json`]).
    async fn list_as(
        &self,
        res: &Resource,
        ns: Option<&str>,
        req: &Request<'_>,
        raw_ok: bool,
    ) -> Result<Reply, ApiError> {
        validate_list_options(req, false)?;
        let selectors = Selectors::parse(res, req)?;
        let limit: usize = match req.param("limit") {
            None | Some("") => 0,
            Some(l) => l
                .parse::<i64>()
                .map_err(|_| ApiError::bad_request(go_parse_int_error(l)))?
                .max(0) as usize,
        };
        let prefix = res.key_prefix(ns);
        let (mut revision, mut start) = (None, None);
        if let Some(token) = req.param("continue").filter(|t| !t.is_empty()) {
            if req
                .param("resourceVersion")
                .is_some_and(|r| !r.is_empty() && r != "0")
            {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let (rv, s) = decode_continue(token)?;
            revision = rv;
            start = Some(format!("{prefix}{s}").into_bytes());
        } else {
            match (
                req.param("resourceVersion"),
                req.param("resourceVersionMatch"),
            ) {
                (None | Some(""), _) | (Some("0"), _) => {}
                (Some(rv), Some("Exact")) => revision = Some(parse_list_rv(rv)?),
                (Some(rv), _) => {
                    // NotOlderThan: the latest state is not older than any revision we have.
                    let want = parse_list_rv(rv)?;
                    let current = self
                        .store
                        .current_revision()
                        .await
                        .map_err(ApiError::internal)?;
                    if want > current {
                        return Err(ApiError::too_large_resource_version(want, current));
                    }
                }
            }
        }
        // Everything but an exact revision or a continued list is served by the watch cache,
        // once it has caught up with the revision the list needs: the store's current one
        // for a consistent list, the client's for NotOlderThan, any for "0".
        // A continued (or exact) list is served from it too when nothing changed since the
        // revision it reads at.
        let cache = self
            .caches
            .get_indexed(&res.key_prefix(None), res.strategy.watch_index());
        let by = selectors.indexed_value(cache.index());
        // Selected by labels and the index alone: the cache applies the limit itself.
        let cheap = selectors.fields.requirements().iter().all(|r| {
            by == Some(r.value.as_str())
                && cache.index().is_some_and(|i| i.field == r.field)
                && matches!(r.operator, Operator::Equals | Operator::DoubleEquals)
        });
        let unselective = selectors.labels.is_empty() && selectors.fields.is_empty();
        let ready = match revision {
            None => {
                let need = match req.param("resourceVersion") {
                    None | Some("") => self
                        .store
                        .current_revision()
                        .await
                        .map_err(ApiError::internal)?,
                    Some(rv) => parse_rv(rv)?.max(1),
                };
                cache.wait_for(need, CACHE_WAIT).await.is_some()
            }
            // The cache's window may reach further back than the store's history; a
            // revision the store compacted is expired here too, as upstream's cache
            // follows the compactions.
            Some(rv) => rv >= self.store.known_compacted(),
        };
        let from = start
            .as_deref()
            .map(|s| String::from_utf8_lossy(s).into_owned());
        let keep = |o: &Cached| selectors.labels.is_empty() || selectors.labels.matches(&o.labels);
        let page = ready
            .then(|| {
                cache.page(&PageQuery {
                    key_prefix: &prefix,
                    start: from.as_deref(),
                    at: revision,
                    by,
                    keep: &keep,
                    limit: if cheap { limit } else { 0 },
                    count_rest: cheap && unselective,
                })
            })
            .flatten();
        if let Some(page) = page {
            // Plain JSON lists of objects served as stored, selected by labels and the
            // index only, are spliced from the cached bytes.
            let splice = raw_ok
                && cheap
                && req.accept.output == Output::Object
                && !req.accept.yaml
                && !res.strategy.converts();
            let keep_type = res.strategy.list_items_keep_type();
            let (mut next_start, mut remaining) = (None, None);
            let continue_after = |key: &str| format!("{}\0", &key[prefix.len()..]);
            if cheap {
                if page.more {
                    next_start = page.objects.last().map(|(k, _)| continue_after(k));
                    remaining = page.rest;
                }
                if splice {
                    let raw: Vec<Bytes> = page
                        .objects
                        .iter()
                        .map(|(_, obj)| {
                            if keep_type {
                                Bytes::from(obj.object_json())
                            } else {
                                obj.item.clone()
                            }
                        })
                        .collect();
                    return Ok(spliced_list(
                        res,
                        &raw,
                        page.revision,
                        next_start,
                        remaining,
                    ));
                }
            }
            let mut items = Vec::new();
            for (i, (_, obj)) in page.objects.iter().enumerate() {
                if !cheap && limit > 0 && items.len() >= limit {
                    // Continue after the last key handed out, as the store path does.
                    if let Some((last, _)) = i.checked_sub(1).and_then(|j| page.objects.get(j)) {
                        next_start = Some(continue_after(last));
                    }
                    break;
                }
                let served = res.strategy.served_form(obj.object())?;
                if cheap || selectors.matches(res, &served) {
                    items.push(served);
                }
            }
            return Ok(list_reply(
                res,
                req,
                items,
                page.revision,
                next_start,
                remaining,
            ));
        }
        // Read pages from the store until `limit` objects matched or the range ended.
        // (Each object is decoded: on a busy server this is the expensive path, so it says
        // who took it.)
        tracing::info!(
            resource = res.plural,
            namespace = ns.unwrap_or(""),
            query = ?req.query,
            user_agent = crate::fieldmanager::USER_AGENT
                .try_with(|ua| ua.clone())
                .unwrap_or_default(),
            cache_ready = ready,
            "list served from the store"
        );
        let mut items = Vec::new();
        let mut next_start: Option<String> = None;
        let mut remaining: Option<usize> = None;
        let mut at: Revision;
        // Where the client's token starts: an expired continue starts there again.
        let continue_from = start.clone();
        loop {
            let page = self
                .store
                .range(RangeRequest {
                    prefix: prefix.clone().into_bytes(),
                    start: start.clone(),
                    limit: if limit == 0 {
                        0
                    } else {
                        (limit - items.len()).max(1)
                    },
                    revision,
                })
                .await
                .map_err(|e| match e {
                    // A continued list whose revision is gone: the token that continues
                    // from the same key at the latest revision, as upstream.
                    StorageError::Compacted { .. } if req.param("continue").is_some() => {
                        let from = continue_from
                            .as_deref()
                            .and_then(|k| k.get(prefix.len()..))
                            .map(String::from_utf8_lossy)
                            .unwrap_or_default();
                        ApiError::inconsistent_continue(encode_continue(-1, &from))
                    }
                    e => storage_error(res, "", e),
                })?;
            at = page.revision;
            revision = Some(at);
            let n = page.kvs.len();
            let mut last_key = None;
            for kv in page.kvs {
                last_key = Some(kv.key.clone());
                let obj = decode_stored(res, &kv.value, kv.mod_revision)?;
                if selectors.matches(res, &obj) {
                    items.push(obj);
                }
                if limit > 0 && items.len() >= limit {
                    break;
                }
            }
            let more_in_range =
                page.more || (limit > 0 && items.len() >= limit && last_key.is_some() && n > 0);
            if limit > 0 && items.len() >= limit {
                if let Some(k) = last_key {
                    // Is anything left after the last key handed out?
                    let mut after = k.clone();
                    after.push(0);
                    let rest = self
                        .store
                        .range(RangeRequest {
                            prefix: prefix.clone().into_bytes(),
                            start: Some(after.clone()),
                            limit: 1,
                            revision: Some(at),
                        })
                        .await
                        .map_err(|e| storage_error(res, "", e))?;
                    if rest.count > 0 {
                        let suffix = String::from_utf8_lossy(&after[prefix.len()..]).into_owned();
                        next_start = Some(suffix);
                        if selectors.labels.is_empty() && selectors.fields.is_empty() {
                            remaining = Some(rest.count);
                        }
                    }
                }
                let _ = more_in_range;
                break;
            }
            if !page.more {
                break;
            }
            match last_key {
                Some(mut k) => {
                    k.push(0);
                    start = Some(k);
                }
                None => break,
            }
        }
        Ok(list_reply(res, req, items, at, next_start, remaining))
    }

    /// GET of a collection with `watch=1`: a stream of watch events.
    pub async fn watch(
        self: &Arc<Self>,
        res: Arc<Resource>,
        ns: Option<String>,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        validate_list_options(req, true)?;
        let selectors = Selectors::parse(&res, req)?;
        let bookmarks = matches!(req.param("allowWatchBookmarks"), Some("true" | "1"));
        let send_initial = match req.param("sendInitialEvents") {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => None,
        };
        let timeout = match req.param("timeoutSeconds") {
            Some(t) if !t.is_empty() => Duration::from_secs(
                // Decoded as an int64 (a negative value is no timeout at all, as upstream).
                t.parse::<i64>()
                    .map_err(|_| ApiError::bad_request(go_strconv_error("ParseInt", t)))?
                    .max(0) as u64,
            ),
            _ => Duration::from_secs(1800),
        };
        let rv = req.param("resourceVersion").filter(|r| !r.is_empty());
        // Unset or "0": the current state as ADDED events, then changes. A revision: only
        // what changed after it (unless sendInitialEvents asks for the state too).
        let initial = match (rv, send_initial) {
            (_, Some(true)) => true,
            (_, Some(false)) => false,
            (None | Some("0"), None) => true,
            (Some(_), None) => false,
        };
        let from = match rv {
            None | Some("0") => None,
            Some(r) => Some(parse_rv(r)?),
        };
        let prefix = res.key_prefix(ns.as_deref());
        let (tx, rx) = mpsc::channel::<Bytes>(256);
        let output = req.accept.output;
        let include = req.param("includeObject").unwrap_or("Metadata").to_owned();
        let this = self.clone();
        let initial_end = send_initial == Some(true);
        let consistent = rv.is_none();
        tokio::spawn(async move {
            let run = WatchRun {
                rest: this,
                res,
                selectors,
                output,
                include,
                tx,
                columns_sent: false,
            };
            run.run(
                prefix,
                from,
                consistent,
                initial,
                initial_end,
                bookmarks,
                timeout,
            )
            .await;
        });
        Ok(Reply::Stream(rx))
    }

    /// PUT of an object or its status.
    pub async fn update(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
        subresource: Option<&str>,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        crate::fieldmanager::manager(req.query, crate::fieldmanager::Options::Update)?;
        let kind = if subresource == Some("scale") {
            "Scale"
        } else {
            res.kind
        };
        let mut obj = crate::negotiate::decode_body_as(kind, req.content_type, req.body)?;
        if subresource == Some("scale") {
            check_scale_type(&mut obj)?;
        } else {
            check_type(res, &mut obj)?;
            let problems = crate::openapi::check_fields(
                res,
                req.query,
                "UpdateOptions",
                req.content_type,
                req.body,
            )?;
            problems.into_iter().for_each(warn);
            crate::openapi::prune(res, &mut obj);
        }
        let dry_run = req.dry_run("UpdateOptions")?;
        match_url(res, ns, name, &mut obj)?;
        let body_rv = match meta_str(&obj, "resourceVersion") {
            Some(r) if !r.is_empty() => Some(parse_body_rv(r)?),
            _ => None,
        };
        self.write_update(res, ns, name, subresource, body_rv, dry_run, req, |_old| {
            Ok(obj.clone())
        })
        .await
    }

    /// PATCH of an object or its status.
    pub async fn patch(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
        subresource: Option<&str>,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        let dry_run = req.dry_run("PatchOptions")?;
        let kind = req
            .content_type
            .and_then(|c| c.split(';').next())
            .map(str::trim)
            .unwrap_or("");
        crate::fieldmanager::check_patch_options(
            req.query,
            kind == crate::fieldmanager::APPLY_YAML,
        )?;
        crate::fieldmanager::manager(req.query, crate::fieldmanager::Options::Patch)?;
        if kind == crate::fieldmanager::APPLY_YAML {
            return self.apply(res, ns, name, subresource, req).await;
        }
        let patch: Value = match kind {
            "application/json-patch+json"
            | "application/merge-patch+json"
            | "application/strategic-merge-patch+json" => {
                if req.body.len() > crate::negotiate::MAX_BODY_BYTES {
                    return Err(ApiError::request_entity_too_large(
                        crate::negotiate::MAX_BODY_BYTES,
                    ));
                }
                let patch: Value = serde_json::from_slice(req.body).map_err(|e| {
                    let why = kumo_apimachinery::gojson::syntax_error(req.body)
                        .unwrap_or_else(|| e.to_string());
                    ApiError::bad_request(format!("error decoding patch: {why}"))
                })?;
                let shape = match kind {
                    "application/json-patch+json" => json_patch_shape_error(&patch),
                    "application/merge-patch+json" => match crate::negotiate::go_json_type(&patch) {
                        Some(k) if k != "object" => Some(format!(
                            "json: cannot unmarshal {k} into Go value of type map[string]interface {{}}"
                        )),
                        _ => None,
                    },
                    _ => None,
                };
                if let Some(e) = shape {
                    return Err(ApiError::bad_request(format!("error decoding patch: {e}")));
                }
                patch
            }
            other => {
                // A PATCH of another type answers with the bare 415 upstream's handler gives.
                let mut e = ApiError::unsupported_media_type(other);
                e.message = "415: Unsupported Media Type".into();
                e.details = Some(Box::default());
                return Err(e);
            }
        };
        let kind = kind.to_owned();
        // A resourceVersion inside the patch is a precondition, as upstream.
        let patch_rv = match patch
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
        {
            Some(r) if !r.is_empty() && kind != "application/json-patch+json" => {
                Some(parse_body_rv(r)?)
            }
            _ => None,
        };
        self.write_update(res, ns, name, subresource, patch_rv, dry_run, req, |old| {
            let mut doc = old.clone();
            match kind.as_str() {
                "application/json-patch+json" => {
                    let p: json_patch::Patch = serde_json::from_value(patch.clone())
                        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                    // `doc` is a copy thrown away on error, so no undo is needed; the
                    // library's undo can panic on a move into itself (found by tests/fuzz.rs).
                    // Upstream answers a patch that does not apply with a generic 422
                    // whose message does not say why.
                    json_patch::patch_unsafe(&mut doc, &p).map_err(|_| {
                        let mut e = ApiError::unprocessable(
                            "the server rejected our request due to an error in our request",
                        );
                        e.details = Some(Box::default());
                        e
                    })?;
                }
                _ => {
                    if !patch.is_object() {
                        return Err(ApiError::bad_request(
                            "error decoding patch: expected a JSON object",
                        ));
                    }
                    if kind == "application/strategic-merge-patch+json" {
                        crate::strategic::apply(&mut doc, &patch);
                    } else {
                        json_patch::merge(&mut doc, &patch);
                    }
                }
            }
            if subresource != Some("scale") {
                // The patched object must decode as the type (upstream: 422 on `patch`).
                if let Some(e) = crate::openapi::type_error(res, &doc) {
                    let errs = [FieldError::invalid(&Path::new("patch"), doc.to_string(), e)];
                    return Err(ApiError::invalid(
                        "",
                        "",
                        "",
                        validation::invalid_message("", "", &errs),
                        errs.iter().map(FieldError::to_cause).collect(),
                    ));
                }
                // A retry on conflict repeats the warnings; the handler sends each once.
                crate::openapi::check_patched(res, req.query, &kind, req.body, &doc)?
                    .into_iter()
                    .for_each(warn);
                crate::openapi::prune(res, &mut doc);
            }
            Ok(doc)
        })
        .await
    }

    /// PATCH with an apply patch: server-side apply (see [`crate::fieldmanager`]), which
    /// creates the object when it does not exist.
    async fn apply(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
        subresource: Option<&str>,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        use crate::fieldmanager::{apply, decode_apply, manager, Options};
        let dry_run = req.dry_run("PatchOptions")?;
        let manager = manager(req.query, Options::Patch)?;
        let force = matches!(req.param("force"), Some("true" | "1"));
        let directive = crate::openapi::Directive::of(req.query, "PatchOptions")?;
        let mut config = decode_apply(res, req.body)?;
        crate::fieldmanager::strict_decoding(req.body, directive)?;
        match_url(res, ns, name, &mut config)?;
        crate::openapi::prune(res, &mut config);
        if subresource.is_none() {
            if let Err(e) = self.get_current(res, ns, name).await {
                if e.code != 404 {
                    return Err(e);
                }
                let mut live = json!({"apiVersion": res.api_version(), "kind": res.kind});
                set_meta(&mut live, "name", json!(name));
                if res.namespaced {
                    set_meta(&mut live, "namespace", json!(ns.unwrap_or("")));
                }
                let obj = apply(res, None, &live, &config, &manager, force)?;
                return self.create_object(res, ns, req, obj, true).await;
            }
        }
        self.write_update(res, ns, name, subresource, None, dry_run, req, |old| {
            apply(res, subresource, old, &config, &manager, force)
        })
        .await
    }

    /// Read-modify-write of one object with retries on conflict (GuaranteedUpdate).
    /// `precondition` is a resourceVersion the caller insists on.
    #[allow(clippy::too_many_arguments)]
    async fn write_update(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
        subresource: Option<&str>,
        precondition: Option<Revision>,
        dry_run: bool,
        req: &Request<'_>,
        mutate: impl Fn(&Value) -> Result<Value, ApiError>,
    ) -> Result<Reply, ApiError> {
        let key = res.key(ns, name);
        // The `scale` subresource reads and writes the object's Scale.
        let scale = subresource == Some("scale");
        let answer = |obj: Value| -> Result<Reply, ApiError> {
            if scale {
                Ok(Reply::Json(200, render_scale(req, scale_of(res, &obj)?)))
            } else {
                Ok(Reply::Json(200, render_one(res, req, obj)))
            }
        };
        let user = crate::auth::current_user();
        let chain = self.chain();
        // The first attempt starts from the watch cache's copy when there is one (upstream's
        // cachedExistingObject): no read from the store. A stale copy fails the write's
        // revision guard (or would make a no-op, or miss the precondition), and the next
        // attempt reads the store.
        let mut from_cache = !dry_run;
        for _ in 0..16 {
            let cached = if from_cache {
                self.caches
                    .running(&res.key_prefix(None))
                    .and_then(|c| c.get(&key).flatten())
                    .and_then(|c| {
                        let obj = c.object();
                        let rev = meta_str(&obj, "resourceVersion")?
                            .parse::<Revision>()
                            .ok()?;
                        Some((obj, rev))
                    })
                    .filter(|(_, rev)| precondition.is_none_or(|p| p == *rev))
            } else {
                None
            };
            from_cache = false;
            let (old, old_rev, stale_possible) = match cached {
                Some((obj, rev)) => (res.strategy.served_form(obj)?, rev, true),
                None => {
                    let (old, rev) = self.get_current(res, ns, name).await?;
                    (old, rev, false)
                }
            };
            if let Some(p) = precondition {
                if p != old_rev {
                    return Err(ApiError::stale_update(&res.group_resource(), name));
                }
            }
            let mut new = if scale {
                let scaled = mutate(&scale_of(res, &old)?)?;
                with_scale(res, name, &old, &scaled)?
            } else {
                mutate(&old)?
            };
            check_type(res, &mut new)?;
            // The field manager sees the typed object, without empty omitempty fields.
            crate::omitempty::normalize(&mut new);
            // An apply computed the managed fields; the subresource merges below start over
            // from the live object.
            let applied = crate::fieldmanager::is_apply(req.content_type)
                .then(|| crate::fieldmanager::managed_fields(&new));
            // Fields that never change through an update.
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "name",
                "namespace",
                "generation",
            ] {
                match meta(&old).and_then(|m| m.get(k)) {
                    Some(v) => set_meta(&mut new, k, v.clone()),
                    None => {
                        if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                            m.remove(k);
                        }
                    }
                }
            }
            // What the field manager sees, when not the prepared object.
            let mut tracked = subresource.and_then(|s| res.strategy.tracked_request(s, &new, &old));
            match subresource {
                Some("status") => {
                    // Only status changes through /status.
                    let status = new.get("status").cloned().unwrap_or(Value::Null);
                    let mut merged = old.clone();
                    if let Some(o) = merged.as_object_mut() {
                        o.insert("status".into(), status);
                        if res.strategy.status_keeps_metadata() {
                            if let Some(m) = new.get("metadata") {
                                o.insert("metadata".into(), m.clone());
                            }
                        }
                    }
                    new = merged;
                    res.strategy.prepare_status_update(&mut new, &old);
                }
                Some("finalize") => {
                    // Only spec.finalizers changes through /finalize.
                    let finalizers = new.pointer("/spec/finalizers").cloned();
                    let mut merged = old.clone();
                    if let Some(o) = merged.as_object_mut() {
                        let spec = o.entry("spec").or_insert_with(|| json!({}));
                        if let Some(sp) = spec.as_object_mut() {
                            match finalizers {
                                Some(f) => sp.insert("finalizers".into(), f),
                                None => sp.remove("finalizers"),
                            };
                        }
                    }
                    new = merged;
                    res.strategy.prepare_finalize_update(&mut new, &old);
                }
                Some(other) => res
                    .strategy
                    .prepare_subresource_update(other, &mut new, &old),
                None => res.strategy.prepare_update(&mut new, &old),
            }
            if res.strategy.tracks_generation() && spec_changed(&old, &new) {
                let g = meta(&old)
                    .and_then(|m| m.get("generation"))
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                set_meta(&mut new, "generation", json!(g + 1));
            }
            match applied {
                Some(m) => crate::fieldmanager::set_managed_fields(&mut new, m),
                None => {
                    use crate::fieldmanager::{track_update, Options};
                    let target = match tracked {
                        Some(ref mut seen) => seen,
                        None => &mut new,
                    };
                    track_update(
                        res,
                        subresource,
                        req.query,
                        Options::Update,
                        Some(&old),
                        target,
                    )?;
                    if let Some(seen) = tracked {
                        let managed = seen.pointer("/metadata/managedFields").cloned();
                        if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                            match managed {
                                Some(v) => m.insert("managedFields".into(), v),
                                None => m.remove("managedFields"),
                            };
                        }
                    }
                }
            }
            set_meta(&mut new, "resourceVersion", json!(old_rev.to_string()));
            let attrs = crate::admission::Attributes {
                operation: crate::admission::Operation::Update,
                resource: res,
                subresource,
                namespace: ns.filter(|_| res.namespaced),
                name,
                old: Some(&old),
                user: &user,
                dry_run,
                options: write_options(
                    if req
                        .content_type
                        .is_some_and(|c| c.starts_with("application/") && c.contains("patch"))
                    {
                        "PatchOptions"
                    } else {
                        "UpdateOptions"
                    },
                    req,
                    dry_run,
                ),
                rest: self,
            };
            chain.admit(&attrs, Some(&mut new)).await?;
            if let Some(a) = res.strategy.allocator() {
                a.allocate(&*self.store, &mut new, Some(&old), dry_run)
                    .await?;
            }
            let mut errs = validate_meta(res, &new);
            errs.extend(match subresource {
                Some("status") => res.strategy.validate_status_update(&new, &old),
                Some(other) => res.strategy.validate_subresource_update(other, &new, &old),
                None => res.strategy.validate_update(&new, &old),
            });
            if !errs.is_empty() {
                if !dry_run {
                    self.release(res, &new, Some(&old)).await;
                }
                return Err(invalid(res, name, &errs));
            }
            if let Err(e) = chain.validate(&attrs, Some(&new)).await {
                if !dry_run {
                    self.release(res, &new, Some(&old)).await;
                }
                return Err(e);
            }
            // What the typed round trip leaves out (see `omitempty`), before the no-op check.
            crate::omitempty::normalize(&mut new);
            if new == old && stale_possible {
                // A no-op against the cache's copy is only one against the store's.
                self.release(res, &new, Some(&old)).await;
                continue;
            }
            if new == old || dry_run {
                // A no-op update writes nothing and keeps the resourceVersion.
                return answer(new);
            }
            if meta_str(&new, "deletionTimestamp").is_some()
                && !res.strategy.finalizers_pending(&new)
            {
                // The last finalizer of an object being deleted is gone: delete it.
                match self.store.delete(key.as_bytes(), Some(old_rev)).await {
                    Ok((_, rev)) => {
                        self.release(res, &new, None).await;
                        self.release(res, &old, Some(&new)).await;
                        set_meta(&mut new, "resourceVersion", json!(rev.to_string()));
                        return answer(new);
                    }
                    Err(e) => {
                        self.release(res, &new, Some(&old)).await;
                        match e {
                            StorageError::Conflict { .. } if precondition.is_none() => continue,
                            e => return Err(storage_error(res, name, e)),
                        }
                    }
                }
            }
            let bytes = match encode_stored(res, &new) {
                Ok(b) => b,
                Err(e) => {
                    self.release(res, &new, Some(&old)).await;
                    return Err(e);
                }
            };
            match self
                .store
                .update(key.as_bytes(), bytes, Some(old_rev))
                .await
            {
                Ok(kv) => {
                    self.release(res, &old, Some(&new)).await;
                    set_meta(
                        &mut new,
                        "resourceVersion",
                        json!(kv.mod_revision.to_string()),
                    );
                    return answer(new);
                }
                Err(e) => {
                    // Nothing was written: give back what this attempt reserved.
                    self.release(res, &new, Some(&old)).await;
                    match e {
                        StorageError::Conflict { .. } if precondition.is_none() => continue,
                        e => return Err(storage_error(res, name, e)),
                    }
                }
            }
        }
        Err(ApiError::stale_update(&res.group_resource(), name))
    }

    /// DELETE of one object.
    pub async fn delete(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        let opts = delete_options(req)?;
        let dry_run = req.dry_run("DeleteOptions")?
            || opts
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v == "All"));
        let key = res.key(ns, name);
        let user = crate::auth::current_user();
        let chain = self.chain();
        // What a graceless delete last marked: if another deleter (the kubelet) removes
        // the object before this request does, the deletion asked for happened; upstream
        // tolerates that NotFound (kubernetes#19403).
        let mut marked: Option<Value> = None;
        let answer = |obj: Value| {
            if res.returns_deleted_object() {
                Reply::Json(200, render_one(res, req, obj))
            } else {
                let uid = meta_str(&obj, "uid").unwrap_or("").to_owned();
                Reply::Json(200, success_status(&res.group_resource(), name, &uid))
            }
        };
        for _ in 0..16 {
            let (old, old_rev) = match self.get_current(res, ns, name).await {
                Ok(current) => current,
                Err(e) if e.code == 404 => match marked.take() {
                    Some(last) => return Ok(answer(last)),
                    None => return Err(e),
                },
                Err(e) => return Err(e),
            };
            check_preconditions(res, name, &opts, &old, old_rev)?;
            let mut options = opts.clone();
            if let Some(o) = options.as_object_mut() {
                o.insert("kind".into(), json!("DeleteOptions"));
                o.insert("apiVersion".into(), json!("meta.k8s.io/v1"));
            }
            let attrs = crate::admission::Attributes {
                operation: crate::admission::Operation::Delete,
                resource: res,
                subresource: None,
                namespace: ns.filter(|_| res.namespaced),
                name,
                old: Some(&old),
                user: &user,
                dry_run,
                options,
                rest: self,
            };
            chain.admit(&attrs, None).await?;
            chain.validate(&attrs, None).await?;
            let mut new = old.clone();
            gc_finalizers(&mut new, &opts, res.strategy.default_gc_policy());
            let explicit = opts.get("orphanDependents").is_some_and(|v| !v.is_null())
                || opts.get("propagationPolicy").is_some_and(|v| !v.is_null());
            if let Some(w) = res.strategy.default_gc_warning().filter(|_| !explicit) {
                warn(w.to_owned());
            }
            let finalizers = meta(&new)
                .and_then(|m| m.get("finalizers"))
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty());
            let grace = res.strategy.graceful_delete(&old, &opts);
            let pending = res.strategy.delete_pending(&mut new);
            if finalizers || pending || grace.is_some_and(|g| g > 0) {
                // Mark for deletion; whoever owns the finalizers (or the kubelet, after
                // the grace period) completes it.
                mark_deleting(&mut new, grace);
                if new == old || dry_run {
                    return Ok(Reply::Json(200, render_one(res, req, new)));
                }
                match self
                    .store
                    .update(key.as_bytes(), encode_stored(res, &new)?, Some(old_rev))
                    .await
                {
                    Ok(kv) => {
                        set_meta(
                            &mut new,
                            "resourceVersion",
                            json!(kv.mod_revision.to_string()),
                        );
                        return Ok(Reply::Json(200, render_one(res, req, new)));
                    }
                    Err(StorageError::Conflict { .. }) => continue,
                    Err(e) => return Err(storage_error(res, name, e)),
                }
            }
            if grace.is_some() {
                // Graceful deletion with no grace left: marked, then removed at once.
                mark_deleting(&mut new, grace);
            }
            if dry_run {
                return Ok(answer(new));
            }
            // A graceless delete of a graceful resource stores the mark first, as upstream
            // does, so watchers see the object terminating before it goes.
            let mut rev = old_rev;
            if new != old {
                match self
                    .store
                    .update(key.as_bytes(), encode_stored(res, &new)?, Some(old_rev))
                    .await
                {
                    Ok(kv) => {
                        rev = kv.mod_revision;
                        set_meta(&mut new, "resourceVersion", json!(rev.to_string()));
                        marked = Some(new.clone());
                        #[cfg(test)]
                        if RACING_DELETERS
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .iter()
                            .any(|n| n == name)
                        {
                            let _ = self.store.delete(key.as_bytes(), None).await;
                        }
                    }
                    Err(StorageError::Conflict { .. }) => continue,
                    Err(e) => return Err(storage_error(res, name, e)),
                }
            }
            match self.store.delete(key.as_bytes(), Some(rev)).await {
                Ok(_) => {
                    self.release(res, &new, None).await;
                    return Ok(answer(new));
                }
                Err(StorageError::NotFound) if marked.is_some() => return Ok(answer(new)),
                Err(StorageError::Conflict { .. }) => continue,
                Err(e) => return Err(storage_error(res, name, e)),
            }
        }
        Err(ApiError::stale_update(&res.group_resource(), name))
    }

    /// Admission of a POST to a subresource that is answered rather than stored
    /// (TokenRequest, Eviction): a create of that subresource, as upstream admits it.
    pub async fn admit_post(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
        sub: &str,
        body: &mut Value,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let user = crate::auth::current_user();
        let chain = self.chain();
        let mut options = json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"});
        if dry_run {
            options["dryRun"] = json!(["All"]);
        }
        let attrs = crate::admission::Attributes {
            operation: crate::admission::Operation::Create,
            resource: res,
            subresource: Some(sub),
            namespace: ns.filter(|_| res.namespaced),
            name,
            old: None,
            user: &user,
            dry_run,
            options,
            rest: self,
        };
        chain.admit(&attrs, Some(body)).await?;
        chain.validate(&attrs, Some(body)).await
    }

    /// POST to a subresource that changes the object (pods/binding): the strategy turns
    /// the body and the current object into the object to write, which is written with a
    /// compare-and-swap (retried on conflict). Answers a success Status with code 201.
    pub async fn post_subresource(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
        sub: &str,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        let mut body = crate::negotiate::decode_body(req.content_type, req.body)?;
        let dry_run = req.dry_run("CreateOptions")?;
        let key = res.key(ns, name);
        let user = crate::auth::current_user();
        let chain = self.chain();
        let attrs = crate::admission::Attributes {
            operation: crate::admission::Operation::Create,
            resource: res,
            subresource: Some(sub),
            namespace: ns.filter(|_| res.namespaced),
            name,
            old: None,
            user: &user,
            dry_run,
            options: write_options("CreateOptions", req, dry_run),
            rest: self,
        };
        chain.admit(&attrs, Some(&mut body)).await?;
        chain.validate(&attrs, Some(&body)).await?;
        loop {
            let (current, rev) = self.get_current(res, ns, name).await?;
            let new = res.strategy.post_subresource(sub, name, &body, &current)?;
            if dry_run {
                break;
            }
            let bytes = encode_stored(res, &new)?;
            match self.store.update(key.as_bytes(), bytes, Some(rev)).await {
                Ok(_) => break,
                Err(StorageError::Conflict { .. }) => continue,
                Err(e) => return Err(storage_error(res, name, e)),
            }
        }
        Ok(Reply::Json(
            201,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        ))
    }

    /// DELETE of a collection: every object the selectors match.
    pub async fn delete_collection(
        &self,
        res: &Resource,
        ns: Option<&str>,
        req: &Request<'_>,
    ) -> Result<Reply, ApiError> {
        let Reply::Json(_, list) = self
            .list_as(
                res,
                ns,
                &Request {
                    query: req.query,
                    accept: Accept::OBJECT,
                    content_type: None,
                    body: &[],
                },
                false,
            )
            .await?
        else {
            return Err(ApiError::internal("list returned a stream"));
        };
        let mut deleted = Vec::new();
        for item in list
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
        {
            let name = meta_str(&item, "name").unwrap_or("").to_owned();
            let item_ns = meta_str(&item, "namespace").map(str::to_owned);
            match self
                .delete(res, item_ns.as_deref().or(ns), &name, req)
                .await
            {
                Ok(_) => deleted.push(item),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let rv = self
            .store
            .current_revision()
            .await
            .map_err(ApiError::internal)?;
        Ok(Reply::Json(
            200,
            json!({
                "kind": format!("{}List", res.kind),
                "apiVersion": res.api_version(),
                "metadata": {"resourceVersion": rv.to_string()},
                "items": deleted,
            }),
        ))
    }
}

/// The garbage collector's finalizers a DELETE sets, as upstream's
/// deletionFinalizersForGarbageCollection: `orphan` when dependents are orphaned
/// (orphanDependents=true, propagationPolicy=Orphan, or already so, or the resource's
/// default), `foregroundDeletion` when they are deleted first (propagationPolicy=Foreground,
/// or already so); neither for Background, nor ever for a resource without garbage
/// collection.
fn gc_finalizers(obj: &mut Value, opts: &Value, default: crate::registry::GcPolicy) {
    const ORPHAN: &str = "orphan";
    const FOREGROUND: &str = "foregroundDeletion";
    if default == crate::registry::GcPolicy::Unsupported {
        return;
    }
    let current: Vec<String> = meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    // Without an explicit option, whichever of the two finalizers comes first decides,
    // else the resource's default.
    let first = current.iter().find(|f| *f == ORPHAN || *f == FOREGROUND);
    let orphan_opt = opts.get("orphanDependents").and_then(Value::as_bool);
    let policy = opts.get("propagationPolicy").and_then(Value::as_str);
    let (orphan, foreground) = match (orphan_opt, policy) {
        (Some(o), _) => (o, false),
        (None, Some("Orphan")) => (true, false),
        (None, Some("Background")) => (false, false),
        (None, Some("Foreground")) => (false, true),
        _ => match first {
            Some(f) => (f == ORPHAN, f == FOREGROUND),
            None => (
                default == crate::registry::GcPolicy::OrphanDependents,
                false,
            ),
        },
    };
    let mut next: Vec<String> = current
        .iter()
        .filter(|f| *f != ORPHAN && *f != FOREGROUND)
        .cloned()
        .collect();
    if orphan {
        next.push(ORPHAN.into());
    }
    if foreground {
        next.push(FOREGROUND.into());
    }
    let same = next.len() == current.len() && next.iter().all(|f| current.contains(f));
    if same {
        return;
    }
    if next.is_empty() {
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("finalizers");
        }
    } else {
        set_meta(obj, "finalizers", json!(next));
    }
}

/// Marks an object as being deleted, as upstream's BeforeDelete: deletionTimestamp is when
/// the grace period ends. A later DELETE only ever shortens the grace period.
fn mark_deleting(obj: &mut Value, grace: Option<i64>) {
    let grace = grace.unwrap_or(0);
    let current = meta(obj)
        .and_then(|m| m.get("deletionGracePeriodSeconds"))
        .and_then(Value::as_i64);
    if meta_str(obj, "deletionTimestamp").is_some() && current.is_none_or(|c| c <= grace) {
        return;
    }
    let at = crate::time::format_rfc3339(crate::time::now_secs() + grace);
    set_meta(obj, "deletionTimestamp", json!(at));
    set_meta(obj, "deletionGracePeriodSeconds", json!(grace));
    if let Some(g) = meta(obj)
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64)
        .filter(|g| *g > 0)
    {
        set_meta(obj, "generation", json!(g + 1));
    }
}

/// The 422 kube-apiserver answers for a bad query parameter, validated as a field of the
/// request's options object: `ListOptions.meta.k8s.io "" is invalid: <field>: <detail>`.
fn invalid_options(kind: &str, field: &str, reason: &str, detail: &str) -> ApiError {
    ApiError::invalid(
        "meta.k8s.io",
        kind,
        "",
        format!("{kind}.meta.k8s.io \"\" is invalid: {field}: {detail}"),
        vec![Cause {
            reason: reason.into(),
            message: detail.into(),
            field: field.into(),
        }],
    )
}

/// Go's first decoding error of a JSON patch read as kube-apiserver's `[]jsonPatchOp`.
fn json_patch_shape_error(patch: &Value) -> Option<String> {
    let items = match patch {
        Value::Null => return None,
        Value::Array(items) => items,
        other => {
            return Some(format!(
                "json: cannot unmarshal {} into Go value of type []handlers.jsonPatchOp",
                crate::negotiate::go_json_type(other).unwrap_or("null")
            ))
        }
    };
    for item in items {
        match item {
            Value::Null => {}
            Value::Object(op) => {
                for (field, v) in op {
                    let k = crate::negotiate::go_json_type(v);
                    if matches!(field.as_str(), "op" | "path" | "from")
                        && k.is_some_and(|k| k != "string")
                    {
                        return Some(format!(
                            "json: cannot unmarshal {} into Go struct field jsonPatchOp.{field} of type string",
                            k.unwrap_or_default()
                        ));
                    }
                }
            }
            other => {
                return Some(format!(
                    "json: cannot unmarshal {} into Go value of type handlers.jsonPatchOp",
                    crate::negotiate::go_json_type(other).unwrap_or("null")
                ))
            }
        }
    }
    None
}

/// Whether anything but metadata and status changed.
fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("metadata");
            o.remove("status");
        }
        v
    };
    strip(old) != strip(new)
}

/// DeleteOptions.preconditions, checked as upstream's BeforeDelete does (the conflict names
/// the kind, not the resource).
fn check_preconditions(
    res: &Resource,
    name: &str,
    opts: &Value,
    old: &Value,
    old_rev: Revision,
) -> Result<(), ApiError> {
    let gr = kumo_apimachinery::status::GroupResource::new(res.group, res.kind);
    if let Some(uid) = opts.pointer("/preconditions/uid").and_then(Value::as_str) {
        let have = meta_str(old, "uid").unwrap_or("");
        if uid != have {
            return Err(ApiError::conflict(
                &gr,
                name,
                &format!(
                    "the UID in the precondition ({uid}) does not match the UID in record ({have}). The object might have been deleted and then recreated"
                ),
            ));
        }
    }
    if let Some(rv) = opts
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
    {
        if rv != old_rev.to_string() {
            return Err(ApiError::conflict(
                &gr,
                name,
                &format!(
                    "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({old_rev}). The object might have been modified"
                ),
            ));
        }
    }
    Ok(())
}

/// One running watch.
struct WatchRun {
    rest: Arc<Rest>,
    res: Arc<Resource>,
    selectors: Selectors,
    /// The representation of the objects sent (object, Table, PartialObjectMetadata).
    output: Output,
    include: String,
    tx: mpsc::Sender<Bytes>,
    columns_sent: bool,
}

impl WatchRun {
    /// Serves the watch. `from`: the revision it starts after, if any; `consistent`: no
    /// revision was given, so the state it starts from must be the store's current one.
    #[allow(clippy::too_many_arguments)]
    async fn run(
        mut self,
        prefix: String,
        from: Option<Revision>,
        consistent: bool,
        initial: bool,
        initial_end_bookmark: bool,
        bookmarks: bool,
        timeout: Duration,
    ) {
        let deadline = tokio::time::Instant::now() + timeout;
        // The watch cache serves every watch once filled, as upstream's cacher: one that
        // starts before its window is told it is too old (the client lists again), one that
        // starts past what the cache reaches in time is told to retry. (Serving either
        // from the store instead is what turns a busy server into a stalled one: each such
        // watch reads and decodes the store's history.)
        let need = match from {
            Some(r) => Some(r),
            None if consistent => self.rest.store.current_revision().await.ok(),
            // Any revision: once the cache is filled.
            None => Some(1),
        };
        if let Some(need) = need {
            let cache = self
                .rest
                .caches
                .get_indexed(&self.res.key_prefix(None), self.res.strategy.watch_index());
            let reached = cache.wait_for(need, CACHE_WAIT).await.is_some();
            let by = self.selectors.indexed_value(cache.index());
            match cache.watch(&prefix, from.unwrap_or(0), initial, by) {
                Ok(w) if reached || !consistent || from.is_some() => {
                    return self
                        .run_cached(w, &prefix, initial_end_bookmark, bookmarks, deadline)
                        .await;
                }
                Ok(_) => {
                    // The current state, which the cache did not reach in time.
                    let err = ApiError::too_large_resource_version(need, cache.current());
                    return self.send_error(err).await;
                }
                Err(NoWatch::TooOld { oldest }) => {
                    let err = ApiError::resource_expired(format!(
                        "too old resource version: {need} ({oldest})"
                    ));
                    return self.send_error(err).await;
                }
                Err(NoWatch::Ahead { current }) => {
                    let err = ApiError::too_large_resource_version(need, current);
                    return self.send_error(err).await;
                }
                Err(NoWatch::Unfilled) => {}
            }
        }
        // Where the change stream starts: after the initial state, or the client's revision.
        let mut start = match from {
            Some(r) => r,
            None => match self.rest.store.current_revision().await {
                Ok(r) => r,
                Err(e) => return self.send_error(ApiError::internal(e)).await,
            },
        };
        if initial {
            let mut page_start: Option<Vec<u8>> = None;
            let at = if from.is_some() { None } else { Some(start) };
            loop {
                let page = match self
                    .rest
                    .store
                    .range(RangeRequest {
                        prefix: prefix.clone().into_bytes(),
                        start: page_start.clone(),
                        limit: 500,
                        revision: at,
                    })
                    .await
                {
                    Ok(p) => p,
                    Err(e) => {
                        let err = storage_error(&self.res, "", e);
                        return self.send_error(err).await;
                    }
                };
                start = page.revision;
                let last = page.kvs.last().map(|kv| kv.key.clone());
                for kv in page.kvs {
                    let Ok(obj) = decode_stored(&self.res, &kv.value, kv.mod_revision) else {
                        continue;
                    };
                    if self.selectors.matches(&self.res, &obj) && !self.send("ADDED", obj).await {
                        return;
                    }
                }
                match (page.more, last) {
                    (true, Some(mut k)) => {
                        k.push(0);
                        page_start = Some(k);
                    }
                    _ => break,
                }
            }
            if initial_end_bookmark && !self.bookmark(start, true).await {
                return;
            }
        }
        let mut stream = match self.rest.store.watch(prefix.as_bytes(), start).await {
            Ok(s) => s,
            Err(StorageError::Compacted {
                requested,
                compacted,
            }) => {
                return self
                    .send_error(ApiError::resource_expired(format!(
                        "too old resource version: {requested} ({compacted})"
                    )))
                    .await
            }
            Err(e) => return self.send_error(ApiError::internal(e)).await,
        };
        let mut bookmark_tick = tokio::time::interval(Duration::from_secs(60));
        bookmark_tick.tick().await;
        loop {
            tokio::select! {
                ev = stream.next() => match ev {
                    None => return,
                    Some(Err(StorageError::Compacted { requested, compacted })) => {
                        return self.send_error(ApiError::resource_expired(format!(
                            "too old resource version: {requested} ({compacted})"
                        ))).await;
                    }
                    Some(Err(e)) => return self.send_error(ApiError::internal(e)).await,
                    Some(Ok(WatchEvent::Progress(rev))) => {
                        if bookmarks && !self.bookmark(rev, false).await {
                            return;
                        }
                    }
                    Some(Ok(ev)) => {
                        if !self.on_event(ev).await {
                            return;
                        }
                    }
                },
                _ = bookmark_tick.tick(), if bookmarks => stream.request_progress().await,
                _ = tokio::time::sleep_until(deadline) => return,
                _ = self.tx.closed() => return,
            }
        }
    }

    /// Follows a watch cache: the initial state or the replayed window, then its fan-out.
    async fn run_cached(
        mut self,
        w: crate::cache::CachedWatch,
        prefix: &str,
        initial_end_bookmark: bool,
        bookmarks: bool,
        deadline: tokio::time::Instant,
    ) {
        if let Some(snap) = w.initial {
            for (_, obj) in snap.objects {
                if self.splices() {
                    if self.selectors.labels.matches(&obj.labels)
                        && !self.send_raw("ADDED", &obj).await
                    {
                        return;
                    }
                    continue;
                }
                let obj = match self.res.strategy.served_form(obj.object()) {
                    Ok(obj) => obj,
                    Err(e) => return self.send_error(e).await,
                };
                if self.selectors.matches(&self.res, &obj) && !self.send("ADDED", obj).await {
                    return;
                }
            }
            if initial_end_bookmark && !self.bookmark(snap.revision, true).await {
                return;
            }
        }
        for ev in w.replay {
            if !self.on_cached(&ev).await {
                return;
            }
        }
        let (at, mut live) = (w.revision, w.live);
        loop {
            tokio::select! {
                ev = live.recv() => match ev {
                    Ok(ev) => {
                        let go_on = match &*ev {
                            CacheEvent::Reset => false,
                            CacheEvent::Progress(r) => !bookmarks || *r <= at || self.bookmark(*r, false).await,
                            e if e.revision() <= at || !e.key().is_some_and(|k| k.starts_with(prefix)) => true,
                            _ => self.on_cached(&ev).await,
                        };
                        if !go_on {
                            return;
                        }
                    }
                    // A watcher that fell this far behind ends; the client resumes from the
                    // last revision it saw.
                    Err(_) => return,
                },
                _ = tokio::time::sleep_until(deadline) => return,
                _ = self.tx.closed() => return,
            }
        }
    }

    /// Whether cached objects go out as they are stored (plain JSON objects, selected by
    /// labels only): then events are spliced from their bytes.
    fn splices(&self) -> bool {
        self.output == Output::Object
            && self.selectors.fields.is_empty()
            && !self.res.strategy.converts()
    }

    /// Sends a cached object as it is stored.
    async fn send_raw(&mut self, type_: &str, obj: &Cached) -> bool {
        let object = obj.object_json();
        let mut frame = Vec::with_capacity(object.len() + 32);
        frame.extend_from_slice(b"{\"type\":\"");
        frame.extend_from_slice(type_.as_bytes());
        frame.extend_from_slice(b"\",\"object\":");
        frame.extend_from_slice(&object);
        frame.extend_from_slice(b"}\n");
        self.tx.send(Bytes::from(frame)).await.is_ok()
    }

    /// Sends a cached change.
    async fn on_cached(&mut self, ev: &CacheEvent) -> bool {
        let res = self.res.clone();
        let served = |o: &Arc<Cached>| res.strategy.served_form(o.object());
        // A conversion that fails ends the watch with its error.
        macro_rules! or_end {
            ($r:expr) => {
                match $r {
                    Ok(v) => v,
                    Err(e) => {
                        self.send_error(e).await;
                        return false;
                    }
                }
            };
        }
        match ev {
            CacheEvent::Put { obj, prev, .. } if self.splices() => {
                let labels = &self.selectors.labels;
                let before = prev.as_ref().map(|p| labels.matches(&p.labels));
                if labels.matches(&obj.labels) {
                    let type_ = if before == Some(true) {
                        "MODIFIED"
                    } else {
                        "ADDED"
                    };
                    return self.send_raw(type_, obj).await;
                }
                if before != Some(true) {
                    return true;
                }
                // It stopped matching: DELETED, which carries the revision of the change.
                let prev = or_end!(prev.as_ref().map(served).transpose());
                self.on_change(ev.revision(), None, prev).await
            }
            CacheEvent::Put {
                revision,
                obj,
                prev,
                ..
            } => {
                let obj = or_end!(served(obj));
                let prev = or_end!(prev.as_ref().map(served).transpose());
                self.on_change(*revision, Some(obj), prev).await
            }
            CacheEvent::Delete { revision, prev, .. } => {
                let prev = or_end!(served(prev));
                self.on_change(*revision, None, Some(prev)).await
            }
            CacheEvent::Progress(_) | CacheEvent::Reset => true,
        }
    }

    /// Translates a store event.
    async fn on_event(&mut self, ev: WatchEvent) -> bool {
        let res = self.res.clone();
        let decode =
            |kv: &kumo_storage::KeyValue| decode_stored(&res, &kv.value, kv.mod_revision).ok();
        match ev {
            WatchEvent::Put { kv, prev } => {
                let Some(obj) = decode(&kv) else { return true };
                let old = prev.as_ref().and_then(decode);
                self.on_change(kv.mod_revision, Some(obj), old).await
            }
            WatchEvent::Delete { revision, prev, .. } => {
                let Some(obj) = prev.as_ref().and_then(decode) else {
                    return true;
                };
                self.on_change(revision, None, Some(obj)).await
            }
            WatchEvent::Progress(_) => true,
        }
    }

    /// Sends the change of one object at `revision` (`obj` None: deleted), honouring
    /// selector transitions: an object that starts matching is ADDED, one that stops is
    /// DELETED.
    async fn on_change(
        &mut self,
        revision: Revision,
        obj: Option<Value>,
        old: Option<Value>,
    ) -> bool {
        let before = old.as_ref().map(|o| self.selectors.matches(&self.res, o));
        let Some(obj) = obj else {
            let Some(mut old) = old else { return true };
            if before != Some(true) {
                return true;
            }
            // The deleted object carries the revision of its deletion.
            set_meta(&mut old, "resourceVersion", json!(revision.to_string()));
            return self.send("DELETED", old).await;
        };
        let now = self.selectors.matches(&self.res, &obj);
        match (before, now) {
            (Some(true), true) => self.send("MODIFIED", obj).await,
            (_, true) => self.send("ADDED", obj).await,
            (Some(true), false) => {
                // It stopped matching: DELETED, carrying the object as it was, at the
                // revision of the change (as kube-apiserver does).
                let Some(mut old) = old else { return true };
                set_meta(&mut old, "resourceVersion", json!(revision.to_string()));
                self.send("DELETED", old).await
            }
            (_, false) => true,
        }
    }

    async fn send(&mut self, type_: &str, obj: Value) -> bool {
        let object = match self.output {
            Output::Table => {
                let rv = meta_str(&obj, "resourceVersion").unwrap_or("").to_owned();
                let with_columns = !self.columns_sent;
                self.columns_sent = true;
                table(
                    &self.res,
                    &[obj],
                    json!({"resourceVersion": rv}),
                    with_columns,
                    &self.include,
                )
            }
            Output::Metadata => partial_metadata(&obj),
            Output::Object => obj,
        };
        self.emit(json!({"type": type_, "object": object})).await
    }

    async fn bookmark(&mut self, rev: Revision, initial_end: bool) -> bool {
        let mut metadata = json!({"resourceVersion": rev.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object = match self.output {
            Output::Metadata => json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": metadata,
            }),
            _ => json!({
                "kind": self.res.kind,
                "apiVersion": self.res.api_version(),
                "metadata": metadata,
            }),
        };
        self.emit(json!({"type": "BOOKMARK", "object": object}))
            .await
    }

    async fn send_error(&mut self, e: ApiError) {
        let _ = self
            .tx
            .send(Bytes::from(format!(
                "{}\n",
                json!({"type": "ERROR", "object": e.to_status()})
            )))
            .await;
    }

    async fn emit(&mut self, doc: Value) -> bool {
        self.tx.send(Bytes::from(format!("{doc}\n"))).await.is_ok()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod generate_name_tests {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    use super::FORCED_SUFFIXES;
    use crate::{ApiServer, ApiServerConfig};

    /// Runs kubectl with `args` (and `stdin`): whether it succeeded, and its output
    /// (stdout, or stderr on failure), trimmed.
    async fn kubectl(
        kubeconfig: std::path::PathBuf,
        args: &[&str],
        stdin: Option<String>,
    ) -> (bool, String) {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut child = std::process::Command::new("kubectl")
                .args(&args)
                .env("KUBECONFIG", kubeconfig)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("kubectl on PATH");
            let input = child.stdin.take().unwrap();
            if let Some(text) = stdin {
                let mut input = input;
                input.write_all(text.as_bytes()).unwrap();
            }
            let out = child.wait_with_output().unwrap();
            let text = if out.status.success() {
                out.stdout
            } else {
                out.stderr
            };
            (
                out.status.success(),
                String::from_utf8_lossy(&text).trim().to_owned(),
            )
        })
        .await
        .unwrap()
    }

    /// `kubectl create -f -` of a ConfigMap named by `generateName: <prefix>`.
    async fn create(kubeconfig: std::path::PathBuf, prefix: &str) -> (bool, String) {
        let manifest = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  generateName: {prefix}\n  namespace: default\n"
        );
        kubectl(
            kubeconfig,
            &["create", "-f", "-", "-o", "name"],
            Some(manifest),
        )
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_generated_name_that_is_taken_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ApiServerConfig::new(dir.path());
        cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        let server = ApiServer::start(cfg).await.unwrap();
        let kc = server.admin_kubeconfig.clone();
        let force = |prefix: &str, suffixes: &[&str]| {
            FORCED_SUFFIXES.lock().unwrap().extend(
                suffixes
                    .iter()
                    .map(|s| (prefix.to_owned(), (*s).to_owned())),
            );
        };

        force("retry-", &["aaaaa"]);
        assert_eq!(
            create(kc.clone(), "retry-").await,
            (true, "configmap/retry-aaaaa".to_owned())
        );
        // Two collisions, then a free name.
        force("retry-", &["aaaaa", "aaaaa", "bbbbb"]);
        assert_eq!(
            create(kc.clone(), "retry-").await,
            (true, "configmap/retry-bbbbb".to_owned())
        );
        // Eight collisions: upstream's attempts are spent, AlreadyExists.
        force("retry-", &["aaaaa"; 8]);
        let (ok, out) = create(kc.clone(), "retry-").await;
        assert!(!ok, "{out}");
        assert!(
            out.contains(r#"configmaps "retry-aaaaa" already exists"#),
            "{out}"
        );
        assert!(FORCED_SUFFIXES.lock().unwrap().is_empty());
    }

    /// A graceless delete that loses the race to another deleter (the kubelet deleting the
    /// pod it saw marked) still succeeds, as upstream tolerates the NotFound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_graceless_delete_raced_by_another_deleter_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ApiServerConfig::new(dir.path());
        cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        let server = ApiServer::start(cfg).await.unwrap();
        let kc = server.admin_kubeconfig.clone();
        // No controller-manager here: the ServiceAccount admission needs the account.
        let (ok, out) = kubectl(kc.clone(), &["create", "serviceaccount", "default"], None).await;
        assert!(ok, "{out}");
        let run = ["run", "raced", "--image=registry.k8s.io/pause:3.10"];
        let (ok, out) = kubectl(kc.clone(), &run, None).await;
        assert!(ok, "{out}");
        super::RACING_DELETERS.lock().unwrap().push("raced".into());
        let delete = ["delete", "pod", "raced", "--grace-period=0", "--force"];
        let (ok, out) = kubectl(kc.clone(), &delete, None).await;
        assert!(ok, "{out}");
        assert!(out.ends_with("pod \"raced\" force deleted"), "{out}");
        let (ok, out) = kubectl(kc, &["get", "pod", "raced"], None).await;
        assert!(!ok && out.contains("NotFound"), "{out}");
    }
}
