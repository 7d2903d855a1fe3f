//! `metadata.managedFields` and server-side apply, with the semantics of kube-apiserver's
//! field manager (k8s.io/apimachinery managedfields over structured-merge-diff).
//!
//! Every write records which manager set which fields: an `Update` entry per manager,
//! API version and subresource holds the fields the writes of that manager added or
//! changed, and fields a write changes leave the sets of every other manager. An apply
//! (`application/apply-patch+yaml`) merges the applied configuration into the live object
//! by the schema, owns exactly the fields it applied (an `Apply` entry per manager and
//! subresource), removes what it applied before and no longer applies unless another
//! applier owns it, and refuses to change fields other managers own unless forced.

mod fieldpath;
mod typed;

use std::collections::BTreeMap;

use kumo_apimachinery::status::{ApiError, Cause, Details};
use kumo_apimachinery::validation::{self, go_quote, FieldError, Path};
use serde_json::{json, Map, Value};

use crate::registry::Resource;
use fieldpath::{PathDisplay, Pe, Set};
use typed::{Schema, Typer};

pub use typed::Comparison;

tokio::task_local! {
    /// The User-Agent of the request being handled (set up by the handler), which names
    /// the manager of a write that does not give `fieldManager`.
    pub static USER_AGENT: String;
}

/// The longest manager name (upstream's FieldManagerMaxLength).
const MAX_MANAGER_LEN: usize = 128;

/// The annotation client-side apply keeps its configuration in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The content type of an apply patch.
pub const APPLY_YAML: &str = "application/apply-patch+yaml";

/// Whether a request is a server-side apply.
pub fn is_apply(content_type: Option<&str>) -> bool {
    content_type
        .and_then(|c| c.split(';').next())
        .map(str::trim)
        == Some(APPLY_YAML)
}

/// One entry of `metadata.managedFields`.
#[derive(Clone, Debug)]
struct Entry {
    manager: String,
    /// `Apply` or `Update`.
    operation: String,
    api_version: String,
    time: Option<String>,
    subresource: String,
    set: Set,
}

impl Entry {
    fn applied(&self) -> bool {
        self.operation == "Apply"
    }

    /// Who the entry is: appliers are one entry whatever API version they used.
    fn same_manager(&self, manager: &str, operation: &str, version: &str, sub: &str) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource == sub
            && (operation == "Apply" || self.api_version == version)
    }

    /// The manager as conflict messages name it.
    fn describe(&self) -> String {
        let mut s = go_quote(&self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(
                " with subresource {}",
                go_quote(&self.subresource)
            ));
        }
        if !self.applied() {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), json!(self.manager));
        m.insert("operation".into(), json!(self.operation));
        m.insert("apiVersion".into(), json!(self.api_version));
        if let Some(t) = &self.time {
            m.insert("time".into(), json!(t));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), self.set.to_fields_v1());
        if !self.subresource.is_empty() {
            m.insert("subresource".into(), json!(self.subresource));
        }
        Value::Object(m)
    }
}

/// The managed fields of an object; None when they are absent.
fn managed_of(obj: &Value) -> Option<&Value> {
    obj.pointer("/metadata/managedFields")
}

/// The `metadata.managedFields` of an object, as they are.
pub fn managed_fields(obj: &Value) -> Option<Value> {
    managed_of(obj).cloned()
}

/// Sets (or, None, removes) `metadata.managedFields`.
pub fn set_managed_fields(obj: &mut Value, managed: Option<Value>) {
    let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    match managed {
        Some(v) => m.insert("managedFields".into(), v),
        None => m.remove("managedFields"),
    };
}

/// Decodes `managedFields` as upstream's DecodeManagedFields (later duplicates win).
fn decode(v: Option<&Value>) -> Result<Vec<Entry>, String> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let list = v.as_array().ok_or("managedFields must be a list")?;
    let mut out: Vec<Entry> = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let operation = s("operation");
        if operation != "Apply" && operation != "Update" {
            return Err("operation must be `Apply` or `Update`".into());
        }
        let api_version = s("apiVersion");
        if api_version.is_empty() {
            return Err("apiVersion must not be empty".into());
        }
        match s("fieldsType").as_str() {
            "FieldsV1" => {}
            "" => return Err(format!("missing fieldsType in managed fields entry {i}")),
            other => {
                return Err(format!(
                    "invalid fieldsType {other:?} in managed fields entry {i}"
                ))
            }
        }
        let set = match e.get("fieldsV1") {
            None | Some(Value::Null) => Set::new(),
            Some(f) => Set::from_fields_v1(f)?,
        };
        let entry = Entry {
            manager: s("manager"),
            operation,
            api_version,
            time: e.get("time").and_then(Value::as_str).map(str::to_owned),
            subresource: s("subresource"),
            set,
        };
        out.retain(|o| {
            !o.same_manager(
                &entry.manager,
                &entry.operation,
                &entry.api_version,
                &entry.subresource,
            )
        });
        out.push(entry);
    }
    Ok(out)
}

/// Writes the entries into the object, in upstream's order (operation, time, manager,
/// API version, subresource); no entries: no field.
fn encode(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    let secs = |e: &Entry| {
        e.time
            .as_deref()
            .and_then(crate::time::parse_rfc3339)
            .unwrap_or(0)
    };
    entries.sort_by(|a, b| {
        a.operation
            .cmp(&b.operation)
            .then_with(|| secs(a).cmp(&secs(b)))
            .then_with(|| a.manager.cmp(&b.manager))
            .then_with(|| a.api_version.cmp(&b.api_version))
            .then_with(|| a.subresource.cmp(&b.subresource))
    });
    let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if entries.is_empty() {
        m.remove("managedFields");
    } else {
        let list: Vec<Value> = entries.iter().map(Entry::to_json).collect();
        m.insert("managedFields".into(), Value::Array(list));
    }
}

/// Upstream's "reset" request: an empty list or a list of one empty entry.
fn is_reset(v: Option<&Value>) -> bool {
    match v.and_then(Value::as_array).map(Vec::as_slice) {
        Some([]) => true,
        Some([one]) => one.as_object().is_some_and(|o| o.is_empty()),
        _ => false,
    }
}

fn without_managed(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    o
}

/// Paths no manager ever owns (upstream's stripMetaManager).
fn strip_set() -> Set {
    let f = |s: &str| Pe::Field(s.to_owned());
    let mut s = Set::new();
    s.insert(&[f("apiVersion")]);
    s.insert(&[f("kind")]);
    s.insert(&[f("metadata")]);
    for k in [
        "name",
        "namespace",
        "creationTimestamp",
        "selfLink",
        "uid",
        "clusterName",
        "generation",
        "managedFields",
        "resourceVersion",
    ] {
        s.insert(&[f("metadata"), f(k)]);
    }
    s
}

/// Fields a write through this endpoint does not own: the main resource of a kind with a
/// status subresource does not set status (upstream's reset fields).
fn ignored(res: &Resource, subresource: Option<&str>) -> Set {
    let mut s = Set::new();
    if subresource.is_none() && res.subresources.contains(&"status") {
        s.insert(&[Pe::Field("status".into())]);
    }
    s
}

fn typer() -> Typer<'static> {
    Typer {
        schemas: crate::openapi::schemas(),
    }
}

fn schema_of(res: &Resource) -> Schema<'_> {
    if let Some(s) = res.strategy.apply_schema() {
        return Some(s);
    }
    let s = crate::openapi::schemas();
    s.for_kind(res.group, res.version, res.kind)
        .and_then(|n| s.get(n))
}

/// `config` merged into `obj` as server-side apply merges an applied configuration (maps
/// and structs field by field, lists by their merge keys or whole), without tracking
/// ownership: how a MutatingAdmissionPolicy's `ApplyConfiguration` mutates.
pub fn merge_applied(res: &Resource, obj: &Value, config: &Value) -> Value {
    typer().merge(obj, config, schema_of(res))
}

/// Which options a request's query carries, for error messages.
#[derive(Clone, Copy)]
pub enum Options {
    Create,
    Update,
    Patch,
}

impl Options {
    fn kind(self) -> &'static str {
        match self {
            Options::Create => "CreateOptions",
            Options::Update => "UpdateOptions",
            Options::Patch => "PatchOptions",
        }
    }

    fn invalid(self, errs: &[FieldError]) -> ApiError {
        let qualified = format!("{}.meta.k8s.io", self.kind());
        ApiError::invalid(
            "meta.k8s.io",
            self.kind(),
            "",
            validation::invalid_message(&qualified, "", errs),
            errs.iter().map(FieldError::to_cause).collect(),
        )
    }
}

/// The manager of a write: `fieldManager`, else the User-Agent up to its first `/`
/// (printable characters only, at most 128 bytes), as upstream.
pub fn manager(query: &BTreeMap<String, String>, opts: Options) -> Result<String, ApiError> {
    if let Some(m) = query.get("fieldManager").filter(|m| !m.is_empty()) {
        let path = Path::new("fieldManager");
        if m.len() > MAX_MANAGER_LEN {
            return Err(opts.invalid(&[FieldError::too_long(&path, MAX_MANAGER_LEN as i64)]));
        }
        if !m.chars().all(validation::go_is_print) {
            return Err(opts.invalid(&[FieldError::invalid(
                &path,
                m.clone(),
                "must only contain printable characters",
            )]));
        }
        return Ok(m.clone());
    }
    // Writes the server makes itself have no request around them.
    let ua = USER_AGENT
        .try_with(Clone::clone)
        .unwrap_or_else(|_| "kube-apiserver".to_owned());
    let mut out = String::new();
    for c in ua.split('/').next().unwrap_or("").chars() {
        if !validation::go_is_print(c) {
            continue;
        }
        if out.len() + c.len_utf8() > MAX_MANAGER_LEN {
            break;
        }
        out.push(c);
    }
    Ok(out)
}

/// Checks the apply-only options of a PATCH: `force` only with apply, `fieldManager`
/// required for it.
pub fn check_patch_options(query: &BTreeMap<String, String>, apply: bool) -> Result<(), ApiError> {
    let force = query.get("force").map(String::as_str);
    if !apply && force.is_some_and(|f| f == "true" || f == "1") {
        return Err(Options::Patch.invalid(&[FieldError::forbidden(
            &Path::new("force"),
            "may not be specified for non-apply patch",
        )]));
    }
    if apply && query.get("fieldManager").is_none_or(|m| m.is_empty()) {
        return Err(Options::Patch.invalid(&[FieldError::required(
            &Path::new("fieldManager"),
            "is required for apply patch",
        )]));
    }
    Ok(())
}

/// The object a created object is compared with: the kind's zero value, with what Go
/// serializes of an empty object (non-pointer structs as `{}`, fields without
/// `omitempty` as their zero value).
fn zero(s: Schema<'_>) -> Value {
    let schemas = crate::openapi::schemas();
    let Some(s) = s else { return json!({}) };
    let r = schemas.resolve(s);
    let Some(props) = r.get("properties").and_then(Value::as_object) else {
        return json!({});
    };
    let required: Vec<&str> = r
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = Map::new();
    for (k, p) in props {
        let pr = schemas.resolve(p);
        if p.get("default").is_some_and(|d| d == &json!({})) && pr.get("properties").is_some() {
            out.insert(k.clone(), zero(Some(p)));
        } else if required.contains(&k.as_str()) {
            let v = match pr.get("type").and_then(Value::as_str) {
                Some("string") => json!(""),
                Some("integer") | Some("number") => json!(0),
                Some("boolean") => json!(false),
                _ => Value::Null,
            };
            out.insert(k.clone(), v);
        }
    }
    Value::Object(out)
}

/// Removes the fields `cmp` reports as set or changed from every entry's set, returning
/// the conflicts: per entry (other than `skip`), the owned fields that changed.
fn take_over(entries: &mut [Entry], cmp: &Comparison, skip: Option<usize>) -> Vec<(usize, Set)> {
    let changed = cmp.modified.union(&cmp.added);
    let mut conflicts = Vec::new();
    for (i, e) in entries.iter_mut().enumerate() {
        if Some(i) == skip {
            continue;
        }
        let c = e.set.intersection(&changed);
        e.set = e.set.difference(&c).difference(&cmp.removed);
        if !c.is_empty() {
            conflicts.push((i, c));
        }
    }
    conflicts
}

/// A comparison without the fields this endpoint does not own.
fn filtered(mut cmp: Comparison, ignored: &Set) -> Comparison {
    cmp.added = cmp.added.recursive_difference(ignored);
    cmp.modified = cmp.modified.recursive_difference(ignored);
    cmp.removed = cmp.removed.recursive_difference(ignored);
    cmp
}

/// Records a create (`create`) or an update from `old` to `new` by the request's manager in
/// `new`'s managed fields (an `Update` entry). Managed fields the client sent are kept
/// when valid, `[]` clears them, and writes to subresources keep the live ones.
pub fn track_update(
    res: &Resource,
    subresource: Option<&str>,
    query: &BTreeMap<String, String>,
    opts: Options,
    old: Option<&Value>,
    new: &mut Value,
) -> Result<(), ApiError> {
    let manager = manager(query, opts)?;
    let schema = schema_of(res);
    let zero_obj;
    let old = match old {
        Some(o) => o,
        None => {
            zero_obj = zero(schema);
            &zero_obj
        }
    };
    let live_entries = || decode(managed_of(old)).unwrap_or_default();
    let mut entries = if subresource.is_some() {
        live_entries()
    } else if is_reset(managed_of(new)) {
        Vec::new()
    } else {
        match decode(managed_of(new)) {
            Ok(e) if !e.is_empty() => e,
            _ => live_entries(),
        }
    };
    let stripped = without_managed(new);
    let ignored = ignored(res, subresource);
    let cmp = filtered(
        typer().compare(&without_managed(old), &stripped, schema),
        &ignored,
    );
    take_over(&mut entries, &cmp, None);
    let mine = cmp
        .added
        .union(&cmp.modified)
        .difference(&strip_set())
        .recursive_difference(&ignored);
    if !mine.is_empty() {
        let sub = subresource.unwrap_or("");
        let version = res.api_version();
        // Upstream's scale handler carries a scale writer's entry over to the parent
        // with the time the parent had for it: none, the first time (and so ever after).
        let now = (sub != "scale").then(crate::time::now_rfc3339);
        match entries
            .iter_mut()
            .find(|e| e.same_manager(&manager, "Update", &version, sub))
        {
            Some(e) => {
                e.set = mine.union(&e.set);
                if now.is_some() {
                    e.time = now;
                }
            }
            None => entries.push(Entry {
                manager,
                operation: "Update".into(),
                api_version: version,
                time: now,
                subresource: sub.to_owned(),
                set: mine,
            }),
        }
    }
    cap_updaters(&mut entries);
    *new = stripped;
    encode(new, entries);
    Ok(())
}

/// At most this many `Update` entries are kept (upstream's DefaultMaxUpdateManagers).
const MAX_UPDATERS: usize = 10;

/// The manager the oldest update entries are merged into, one per API version.
const ANCIENT: &str = "ancient-changes";

/// Merges the oldest update entries into `ancient-changes` buckets until at most
/// [`MAX_UPDATERS`] remain, as upstream's capManagersManager.
fn cap_updaters(entries: &mut Vec<Entry>) {
    let mut updaters: Vec<usize> = (0..entries.len())
        .filter(|i| !entries[*i].applied())
        .collect();
    if updaters.len() <= MAX_UPDATERS {
        return;
    }
    let secs = |e: &Entry| {
        e.time
            .as_deref()
            .and_then(crate::time::parse_rfc3339)
            .unwrap_or(0)
    };
    updaters.sort_by(|a, b| {
        let (ea, eb) = (&entries[*a], &entries[*b]);
        secs(ea)
            .cmp(&secs(eb))
            .then_with(|| ea.manager.cmp(&eb.manager))
            .then_with(|| ea.api_version.cmp(&eb.api_version))
            .then_with(|| ea.subresource.cmp(&eb.subresource))
    });
    let mut first: BTreeMap<String, usize> = BTreeMap::new();
    let mut removed = vec![false; entries.len()];
    let mut length = updaters.len();
    for i in updaters {
        if length <= MAX_UPDATERS {
            break;
        }
        let version = entries[i].api_version.clone();
        let Some(&f) = first.get(&version) else {
            first.insert(version, i);
            continue;
        };
        let bucket = match (0..entries.len())
            .find(|b| !removed[*b] && entries[*b].same_manager(ANCIENT, "Update", &version, ""))
        {
            Some(b) => b,
            None => {
                entries[f].manager = ANCIENT.into();
                entries[f].subresource = String::new();
                f
            }
        };
        if bucket == i {
            continue;
        }
        entries[bucket].set = entries[i].set.union(&entries[bucket].set);
        entries[bucket].time = entries[i].time.clone();
        removed[i] = true;
        length -= 1;
    }
    let mut i = 0;
    entries.retain(|_| {
        i += 1;
        !removed[i - 1]
    });
}

/// Decodes an apply patch (YAML or JSON) and checks what upstream checks of it.
pub fn decode_apply(res: &Resource, body: &[u8]) -> Result<Value, ApiError> {
    // Lax, as upstream's first decode: a repeated key keeps its last value; the strict
    // check of the body comes after the apply ([`strict_decoding`]).
    let config = kumo_apimachinery::yaml::from_slice_lax(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    if !config.is_object() {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized (must be of type object)",
        ));
    }
    let api_version = config
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = config.get("kind").and_then(Value::as_str).unwrap_or("");
    if api_version != res.api_version() || kind != res.kind {
        // As a GroupVersionKind prints: the core group is empty (`/v1, Kind=ConfigMap`).
        let gv = if api_version.contains('/') {
            api_version.to_owned()
        } else {
            format!("/{api_version}")
        };
        return Err(ApiError::bad_request(format!(
            "invalid object type: {gv}, Kind={kind}"
        )));
    }
    if managed_of(&config).is_some_and(|m| !m.is_null()) {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    let errs = typer().validate(&config, schema_of(res));
    if !errs.is_empty() {
        let meta = |k: &str| {
            config
                .pointer(&format!("/metadata/{k}"))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        let what = match errs.as_slice() {
            [one] => one.clone(),
            _ => format!("errors:\n  {}", errs.join("\n  ")),
        };
        let gv = if api_version.contains('/') {
            api_version.to_owned()
        } else {
            format!("/{api_version}")
        };
        // Upstream answers with a bare 500 (no reason).
        return Err(ApiError {
            code: 500,
            reason: "",
            message: format!(
                "failed to create typed patch object ({}/{}; {gv}, Kind={kind}): {what}",
                meta("namespace"),
                meta("name"),
            ),
            details: None,
        });
    }
    Ok(config)
}

/// The strict decoding of an apply patch after the apply, as upstream: its repeated keys
/// fail the request under `fieldValidation=Strict` and are warnings under `Warn`.
pub fn strict_decoding(body: &[u8], directive: crate::openapi::Directive) -> Result<(), ApiError> {
    use crate::openapi::Directive;
    if directive == Directive::Ignore {
        return Ok(());
    }
    let dups = kumo_apimachinery::yaml::duplicate_keys(body);
    if dups.is_empty() {
        return Ok(());
    }
    if directive == Directive::Strict {
        let lines: Vec<String> = dups.iter().map(|d| format!("  {d}")).collect();
        return Err(ApiError::bad_request(format!(
            "error strict decoding patch: error converting YAML to JSON: yaml: unmarshal errors:\n{}",
            lines.join("\n")
        )));
    }
    dups.into_iter().for_each(crate::rest::warn);
    Ok(())
}

/// Fields an apply would change that others own: (manager as messages name it, path).
type Conflicts = Vec<(String, Vec<Pe>)>;

/// The 409 of an apply that would change fields other managers own.
fn conflict_error(conflicts: &[(String, Vec<Pe>)]) -> ApiError {
    let causes: Vec<Cause> = conflicts
        .iter()
        .map(|(who, p)| Cause {
            reason: "FieldManagerConflict".into(),
            message: format!("conflict with {who}"),
            field: PathDisplay(p).to_string(),
        })
        .collect();
    let message = if let [(who, p)] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {who}: {}",
            PathDisplay(p)
        )
    } else {
        let mut by: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (who, p) in conflicts {
            by.entry(who).or_default().push(PathDisplay(p).to_string());
        }
        let mut lines = Vec::new();
        for (who, paths) in by {
            lines.push(format!("conflicts with {who}:"));
            lines.extend(paths.into_iter().map(|p| format!("- {p}")));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    ApiError {
        code: 409,
        reason: "Conflict",
        message,
        details: Some(Box::new(Details {
            causes,
            ..Details::default()
        })),
    }
}

/// The fields client-side apply's annotation set that still hold the values it set: an
/// apply by `kubectl` may take these over without conflict (upstream's lastAppliedManager).
fn allowed_from_last_applied(res: &Resource, live: &Value) -> Option<Set> {
    let text = live
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(LAST_APPLIED))
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())?;
    let last: Value = serde_json::from_str(text).ok()?;
    if last.get("apiVersion").and_then(Value::as_str) != Some(&res.api_version()) {
        return None;
    }
    let t = typer();
    let schema = schema_of(res);
    let set = t.field_set(&last, schema);
    let cmp = t.compare(&last, live, schema);
    Some(
        set.difference(&cmp.modified)
            .difference(&cmp.added)
            .difference(&cmp.removed),
    )
}

/// Server-side apply of `config` by `manager` onto `live` (for a create: the object with
/// only its name and namespace). Returns the new object with its managed fields.
pub fn apply(
    res: &Resource,
    subresource: Option<&str>,
    live: &Value,
    config: &Value,
    manager: &str,
    force: bool,
) -> Result<Value, ApiError> {
    let t = typer();
    let schema = schema_of(res);
    let live_entries = decode(managed_of(live)).unwrap_or_default();
    let live_obj = without_managed(live);
    let sub = subresource.unwrap_or("");
    let version = res.api_version();
    let ignored = ignored(res, subresource);
    let attempt = |force: bool| -> Result<(Value, Vec<Entry>), Conflicts> {
        let mut entries = live_entries.clone();
        let merged = t.merge(&live_obj, config, schema);
        let applied = t
            .field_set(config, schema)
            .difference(&strip_set())
            .recursive_difference(&ignored);
        let pos = entries
            .iter()
            .position(|e| e.same_manager(manager, "Apply", &version, sub));
        let last = pos.map(|i| entries[i].set.clone());
        let me = match pos {
            Some(i) => {
                entries[i].set = applied;
                entries[i].api_version = version.clone();
                i
            }
            None => {
                entries.push(Entry {
                    manager: manager.to_owned(),
                    operation: "Apply".into(),
                    api_version: version.clone(),
                    time: None,
                    subresource: sub.to_owned(),
                    set: applied,
                });
                entries.len() - 1
            }
        };
        let new = match last.filter(|l| !l.is_empty()) {
            None => merged,
            Some(last) => {
                // Remove what this manager applied last time and no longer applies, unless
                // an applier (this one included) still owns it (upstream's prune).
                let owned = entries
                    .iter()
                    .filter(|e| e.applied())
                    .fold(Set::new(), |acc, e| acc.union(&e.set));
                let merged_set = t.field_set(&merged, schema);
                let pruned = t.remove_items(&merged, &last, schema);
                let pruned_set = t.field_set(&pruned, schema);
                let keep = pruned_set.union(&owned);
                let pruned = t.remove_items(&merged, &merged_set.difference(&keep), schema);
                let pruned_set = t.field_set(&pruned, schema);
                let gone = merged_set.difference(&pruned_set).intersection(&last);
                t.remove_items(&merged, &gone, schema)
            }
        };
        let cmp = filtered(t.compare(&live_obj, &new, schema), &ignored);
        let conflicts = take_over(&mut entries, &cmp, Some(me));
        if !force && !conflicts.is_empty() {
            let mut list = Vec::new();
            for (i, set) in conflicts {
                for p in set.paths() {
                    list.push((entries[i].describe(), p));
                }
            }
            return Err(list);
        }
        // A no-op apply leaves the time as it was (a first one has none).
        if new != live_obj {
            entries[me].time = Some(crate::time::now_rfc3339());
        }
        Ok((new, entries))
    };
    let (mut new, entries) = match attempt(force) {
        Ok(r) => r,
        Err(conflicts) => {
            // kubectl's server-side apply takes over from its client-side apply the fields
            // whose values the annotation still describes.
            let allowed = (manager == "kubectl")
                .then(|| allowed_from_last_applied(res, &live_obj))
                .flatten();
            let remaining: Conflicts = match &allowed {
                Some(a) => conflicts.into_iter().filter(|(_, p)| !a.has(p)).collect(),
                None => conflicts,
            };
            if !remaining.is_empty() {
                return Err(conflict_error(&remaining));
            }
            attempt(true).map_err(|c| conflict_error(&c))?
        }
    };
    if manager == "kubectl" {
        sync_last_applied(&mut new, config);
    }
    encode(&mut new, entries);
    Ok(new)
}

/// kubectl's server-side apply keeps an existing client-side apply annotation in step with
/// what it applied (upstream's lastAppliedUpdater).
fn sync_last_applied(obj: &mut Value, config: &Value) {
    let Some(annotations) = obj
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if !annotations.contains_key(LAST_APPLIED) {
        return;
    }
    let mut applied = config.clone();
    if let Some(a) = applied
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(LAST_APPLIED);
        if a.is_empty() {
            if let Some(m) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("annotations");
            }
        }
    }
    annotations.insert(LAST_APPLIED.into(), json!(format!("{applied}\n")));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_forms() {
        assert!(is_reset(Some(&json!([]))));
        assert!(is_reset(Some(&json!([{}]))));
        assert!(!is_reset(None));
        assert!(!is_reset(Some(&json!([{"manager": "x"}]))));
    }

    #[test]
    fn decode_rejects_bad_entries() {
        assert!(decode(Some(
            &json!([{"manager": "a", "operation": "Nope", "apiVersion": "v1"}])
        ))
        .is_err());
        assert!(decode(Some(
            &json!([{"manager": "a", "operation": "Update", "apiVersion": "v1"}])
        ))
        .is_err());
        let ok = decode(Some(
            &json!([{"manager": "a", "operation": "Update", "apiVersion": "v1",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:x": {}}}}]),
        ))
        .unwrap();
        assert_eq!(ok.len(), 1);
    }

    #[test]
    fn conflict_messages() {
        let p = vec![Pe::Field("data".into()), Pe::Field("key".into())];
        let e = conflict_error(&[("\"kubectl-create\" using v1".into(), p.clone())]);
        assert_eq!(
            e.message,
            "Apply failed with 1 conflict: conflict with \"kubectl-create\" using v1: .data.key"
        );
        let e = conflict_error(&[("\"a\"".into(), p.clone()), ("\"a\"".into(), p)]);
        assert_eq!(
            e.message,
            "Apply failed with 2 conflicts: conflicts with \"a\":\n- .data.key\n- .data.key"
        );
    }
}
