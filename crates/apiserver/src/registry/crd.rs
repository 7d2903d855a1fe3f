//! apiextensions.k8s.io/v1 CustomResourceDefinitions, and keeping the registry's custom
//! resources in step with the stored definitions.
//!
//! A definition is written as upstream's strategy leaves it (no names accepted, no
//! conditions). [`watch`] watches the definitions; on every change it takes the next step of
//! upstream's naming and establishing controllers ([`naming_step`], written back as status)
//! and replaces the registry's custom resources with those of the Established definitions. Deleting a definition works as upstream: the DELETE marks it
//! and adds the `customresourcecleanup.apiextensions.k8s.io` finalizer, [`watch`] stops
//! serving the resource, deletes its objects and then the definition.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use kumo_apimachinery::validation::{self, FieldError, Path};
use kumo_storage::{RangeRequest, Revision, WatchEvent};
use serde_json::{json, Value};

use super::conversion::{Network, WebhookConverter};
use super::custom::CustomResource;
use super::{name_of, str_at, Column, Registry, Resource, Strategy};
use crate::rest::Rest;

/// The finalizer that holds a deleted definition until its objects are gone.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Storage prefix of the definitions.
const PREFIX: &str = "/registry/customresourcedefinitions/";

pub(super) fn resources() -> Vec<Resource> {
    vec![Resource {
        group: "apiextensions.k8s.io",
        version: "v1",
        kind: "CustomResourceDefinition",
        plural: "customresourcedefinitions",
        singular: "customresourcedefinition",
        namespaced: false,
        short_names: &["crd", "crds"],
        categories: &["api-extensions"],
        subresources: &["status"],
        strategy: Box::new(Crds),
    }]
}

struct Crds;

/// Defaults of a definition's spec (upstream's SetDefaults).
fn default_spec(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec.get("conversion").is_none_or(Value::is_null) {
        spec.insert("conversion".into(), json!({"strategy": "None"}));
    }
    if let Some(svc) = spec
        .get_mut("conversion")
        .and_then(|c| c.pointer_mut("/webhook/clientConfig/service"))
        .and_then(Value::as_object_mut)
    {
        svc.entry("port").or_insert(json!(443));
    }
    if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
        let kind = names
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if names.get("singular").is_none_or(|s| s.as_str() == Some("")) {
            names.insert("singular".into(), json!(kind.to_lowercase()));
        }
        if names.get("listKind").is_none_or(|s| s.as_str() == Some("")) && !kind.is_empty() {
            names.insert("listKind".into(), json!(format!("{kind}List")));
        }
    }
}

/// The status a definition is written with, as upstream's strategy leaves it: names not yet
/// accepted, no conditions, and the storage version recorded (added to the old status on an
/// update). [`naming_step`] then does what upstream's naming and establishing controllers do.
fn written_status(obj: &mut Value, old: Option<&Value>) {
    let mut status = match old.and_then(|o| o.get("status")).filter(|s| s.is_object()) {
        Some(s) => s.clone(),
        None => json!({"acceptedNames": {"plural": "", "kind": ""}, "conditions": null}),
    };
    let storage = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage") == Some(&json!(true)))
        .filter_map(|v| v.get("name").cloned());
    let mut stored: Vec<Value> = status
        .get("storedVersions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for v in storage {
        if !stored.contains(&v) {
            stored.push(v);
        }
    }
    status["storedVersions"] = json!(stored);
    if let Some(o) = obj.as_object_mut() {
        o.insert("status".into(), status);
    }
}

/// The names a group's definitions have been given (accepted names): resource names
/// (plural, singular, short names) and kinds (kind, list kind).
#[derive(Default)]
struct TakenNames {
    resources: HashSet<String>,
    kinds: HashSet<String>,
}

impl TakenNames {
    fn of_group(crds: &[Value], group: &str) -> TakenNames {
        let mut t = TakenNames::default();
        for c in crds.iter().filter(|c| str_at(c, "/spec/group") == group) {
            let Some(a) = c.pointer("/status/acceptedNames") else {
                continue;
            };
            t.resources.insert(str_at(a, "/plural").to_owned());
            t.resources.insert(str_at(a, "/singular").to_owned());
            t.resources.extend(strings(a, "/shortNames"));
            t.kinds.insert(str_at(a, "/kind").to_owned());
            t.kinds.insert(str_at(a, "/listKind").to_owned());
        }
        t
    }
}

fn strings(v: &Value, ptr: &str) -> Vec<String> {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str().map(str::to_owned))
        .collect()
}

/// Sets a condition as upstream's SetCRDCondition: the transition time changes only with
/// the status.
fn set_condition(conds: &mut Vec<Value>, type_: &str, status: &str, reason: &str, msg: &str) {
    let now = crate::time::now_rfc3339();
    match conds.iter_mut().find(|c| str_at(c, "/type") == type_) {
        Some(c) => {
            if str_at(c, "/status") != status || str_at(c, "/lastTransitionTime").is_empty() {
                c["lastTransitionTime"] = json!(now);
            }
            c["status"] = json!(status);
            c["reason"] = json!(reason);
            c["message"] = json!(msg);
        }
        None => conds.push(json!({
            "type": type_, "status": status, "lastTransitionTime": now,
            "reason": reason, "message": msg,
        })),
    }
}

fn condition_true(crd: &Value, type_: &str) -> bool {
    crd.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| str_at(c, "/type") == type_ && str_at(c, "/status") == "True")
        })
}

/// One step of upstream's naming controller, or else of its establishing controller: the
/// definition's next status, or None when it is settled. Names are accepted unless another
/// definition of the group holds them (NamesAccepted False with the conflict); Established
/// becomes True once every name is accepted (False, InvalidCABundle, when the conversion
/// webhook's caBundle holds no certificate).
fn naming_step(crd: &Value, taken: &TakenNames) -> Option<Value> {
    let status = crd.get("status").cloned().unwrap_or_else(|| json!({}));
    let requested = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let accepted = status.get("acceptedNames").cloned().unwrap_or(json!({}));
    let mut names = accepted.clone();
    let mut conflict: Option<(&str, String)> = None;
    let in_use = |n: &str| {
        format!(
            "{} is already in use",
            kumo_apimachinery::validation::go_quote(n)
        )
    };
    // Requested names equal to the accepted ones, or free, are taken.
    let fresh = |field: &str, used: &HashSet<String>| {
        let want = str_at(&requested, &format!("/{field}"));
        want == str_at(&accepted, &format!("/{field}")) || !used.contains(want)
    };
    for (field, reason, used) in [
        ("plural", "PluralConflict", &taken.resources),
        ("singular", "SingularConflict", &taken.resources),
    ] {
        if fresh(field, used) {
            names[field] = requested.get(field).cloned().unwrap_or(json!(""));
        } else {
            conflict = Some((reason, in_use(str_at(&requested, &format!("/{field}")))));
        }
    }
    let want_short = strings(&requested, "/shortNames");
    let have_short = strings(&accepted, "/shortNames");
    if want_short != have_short {
        let clashes: Vec<String> = want_short
            .iter()
            .filter(|n| !have_short.contains(n) && taken.resources.contains(*n))
            .map(|n| in_use(n))
            .collect();
        match clashes.len() {
            0 => names["shortNames"] = json!(want_short),
            1 => conflict = Some(("ShortNamesConflict", clashes[0].clone())),
            _ => conflict = Some(("ShortNamesConflict", format!("[{}]", clashes.join(", ")))),
        }
    }
    for (field, reason) in [("kind", "KindConflict"), ("listKind", "ListKindConflict")] {
        if fresh(field, &taken.kinds) {
            names[field] = requested.get(field).cloned().unwrap_or(json!(""));
        } else {
            conflict = Some((reason, in_use(str_at(&requested, &format!("/{field}")))));
        }
    }
    match requested.get("categories") {
        Some(c) => names["categories"] = c.clone(),
        None => {
            if let Some(n) = names.as_object_mut() {
                n.remove("categories");
            }
        }
    }
    let mut next = status.clone();
    let mut conds: Vec<Value> = status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let was_established = condition_true(crd, "Established");
    match &conflict {
        Some((reason, msg)) => set_condition(&mut conds, "NamesAccepted", "False", reason, msg),
        None => set_condition(
            &mut conds,
            "NamesAccepted",
            "True",
            "NoConflicts",
            "no conflicts found",
        ),
    }
    if !was_established {
        if conflict.is_none() {
            set_condition(
                &mut conds,
                "Established",
                "False",
                "Installing",
                "the initial names have been accepted",
            );
        } else if !conds.iter().any(|c| str_at(c, "/type") == "Established") {
            set_condition(
                &mut conds,
                "Established",
                "False",
                "NotAccepted",
                "not all names are accepted",
            );
        }
    }
    next["acceptedNames"] = names;
    next["conditions"] = json!(conds);
    if next != status {
        return Some(next);
    }
    // Settled names: the establishing controller's turn.
    if !condition_true(crd, "NamesAccepted") || was_established {
        return None;
    }
    let ca = crd
        .pointer("/spec/conversion/webhook/clientConfig/caBundle")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty());
    let bad_ca = ca.is_some_and(|c| crate::webhook_client::tls_config(c).is_err());
    if bad_ca {
        set_condition(
            &mut conds,
            "Established",
            "False",
            "InvalidCABundle",
            "The conversion webhook CABundle is invalid",
        );
    } else {
        set_condition(
            &mut conds,
            "Established",
            "True",
            "InitialNamesAccepted",
            "the initial names have been accepted",
        );
    }
    next["conditions"] = json!(conds);
    (next != status).then_some(next)
}

impl Strategy for Crds {
    fn prepare_create(&self, obj: &mut Value) {
        default_spec(obj);
        written_status(obj, None);
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_spec(new);
        written_status(new, Some(old));
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn delete_pending(&self, obj: &mut Value) -> bool {
        // As upstream's CRD storage: the definition stays, with the cleanup finalizer,
        // until `watch` has removed its objects.
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            let f = m.entry("finalizers").or_insert_with(|| json!([]));
            if let Some(a) = f.as_array_mut() {
                if !a.iter().any(|x| x == CLEANUP_FINALIZER) {
                    a.push(json!(CLEANUP_FINALIZER));
                }
            }
        }
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_crd(obj)
    }

    fn validate_status_update(&self, _new: &Value, _old: &Value) -> Vec<FieldError> {
        Vec::new()
    }

    fn columns(&self) -> Vec<Column> {
        let col = |name, type_, description, priority| Column {
            name,
            type_,
            format: "",
            description,
            priority,
        };
        vec![
            Column::NAME,
            col("Scope", "string", "Cluster/Namespaced", 0),
            col("Versions", "string", "Served versions", 0),
            Column {
                type_: "date",
                name: "Created At",
                ..Column::AGE
            },
            col("Group", "string", "API group", 1),
            col("Kind", "string", "Kind of the objects", 1),
            col("ShortNames", "string", "Short names", 1),
            col(
                "Established",
                "boolean",
                "Whether the resource is served",
                1,
            ),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let versions: Vec<String> = obj
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|v| v.get("served") == Some(&json!(true)))
            .map(|v| {
                let name = str_at(v, "/name");
                if v.get("storage") == Some(&json!(true)) {
                    format!("{name}(storage)")
                } else {
                    name.to_owned()
                }
            })
            .collect();
        let short: Vec<&str> = obj
            .pointer("/spec/names/shortNames")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/scope")),
            json!(versions.join(",")),
            json!(str_at(obj, "/metadata/creationTimestamp")),
            json!(str_at(obj, "/spec/group")),
            json!(str_at(obj, "/spec/names/kind")),
            json!(short.join(",")),
            json!(established(obj)),
        ]
    }
}

/// Whether a definition has the condition Established True.
fn established(obj: &Value) -> bool {
    condition_true(obj, "Established")
}

/// Upstream's ValidateCustomResourceDefinition, its main rules.
fn validate_crd(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = Path::new("spec");
    let group = str_at(obj, "/spec/group");
    let plural = str_at(obj, "/spec/names/plural");
    let name = name_of(obj);
    if name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            &Path::new("metadata").child("name"),
            name,
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if group.is_empty() {
        errs.push(FieldError::required(&spec.child("group"), ""));
    } else if !validation::is_dns1123_subdomain(group).is_empty() {
        errs.push(FieldError::invalid(
            &spec.child("group"),
            group,
            validation::is_dns1123_subdomain(group).join(","),
        ));
    } else if group.split('.').count() < 2 {
        errs.push(FieldError::invalid(
            &spec.child("group"),
            group,
            "should be a domain with at least one dot",
        ));
    }
    let scope = str_at(obj, "/spec/scope");
    if scope.is_empty() {
        errs.push(FieldError::required(&spec.child("scope"), ""));
    } else if scope != "Cluster" && scope != "Namespaced" {
        errs.push(FieldError::not_supported(
            &spec.child("scope"),
            scope,
            &["Cluster", "Namespaced"],
        ));
    }
    let names = spec.child("names");
    for (field, label) in [
        ("plural", true),
        ("singular", true),
        ("kind", false),
        ("listKind", false),
    ] {
        let v = str_at(obj, &format!("/spec/names/{field}"));
        if v.is_empty() {
            errs.push(FieldError::required(&names.child(field), ""));
        } else if label {
            let problems = validation::is_dns1035_label(v);
            if !problems.is_empty() {
                errs.push(FieldError::invalid(
                    &names.child(field),
                    v,
                    problems.join(","),
                ));
            }
        }
    }
    let versions = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let vpath = spec.child("versions");
    if versions.is_empty() {
        errs.push(FieldError::invalid(
            &vpath,
            json!(versions),
            "must have exactly one version marked as storage version",
        ));
        return errs;
    }
    let mut seen = HashSet::new();
    let mut storage = 0;
    for (i, v) in versions.iter().enumerate() {
        let p = vpath.index(i);
        let vname = str_at(v, "/name");
        if !seen.insert(vname.to_owned()) {
            errs.push(FieldError::invalid(
                &vpath,
                json!(versions),
                "must contain unique version names",
            ));
        }
        if vname.is_empty() {
            errs.push(FieldError::required(&p.child("name"), ""));
        } else {
            let problems = validation::is_dns1035_label(vname);
            if !problems.is_empty() {
                errs.push(FieldError::invalid(
                    &p.child("name"),
                    vname,
                    problems.join(","),
                ));
            }
        }
        if v.get("storage") == Some(&json!(true)) {
            storage += 1;
        }
        match v.pointer("/schema/openAPIV3Schema") {
            None | Some(Value::Null) => errs.push(FieldError::required(
                &p.child("schema").child("openAPIV3Schema"),
                "schemas are required",
            )),
            Some(s) => {
                if s.get("type").and_then(Value::as_str) != Some("object") {
                    errs.push(FieldError::invalid(
                        &p.child("schema").child("openAPIV3Schema").child("type"),
                        str_at(s, "/type"),
                        "must be object at the root",
                    ));
                }
                // CEL rules; upstream reports identical per-version schemas once, under
                // the internal `spec.validation`.
                let same = versions
                    .iter()
                    .all(|o| o.pointer("/schema/openAPIV3Schema") == Some(s));
                if !same {
                    let sp = p.child("schema").child("openAPIV3Schema");
                    crate::cel::check_schema(s, &sp, &mut errs);
                } else if i == 0 {
                    let sp = spec.child("validation").child("openAPIV3Schema");
                    crate::cel::check_schema(s, &sp, &mut errs);
                }
            }
        }
        for (j, c) in v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let cp = p.child("additionalPrinterColumns").index(j);
            let t = str_at(c, "/type");
            const TYPES: [&str; 6] = ["boolean", "date", "integer", "number", "string", ""];
            if !TYPES.contains(&t) {
                errs.push(FieldError::not_supported(
                    &cp.child("type"),
                    t,
                    &["boolean", "date", "integer", "number", "string"],
                ));
            }
            if str_at(c, "/name").is_empty() {
                errs.push(FieldError::required(&cp.child("name"), ""));
            }
            if str_at(c, "/jsonPath").is_empty() {
                errs.push(FieldError::required(&cp.child("jsonPath"), ""));
            }
        }
    }
    if storage != 1 {
        errs.push(FieldError::invalid(
            &vpath,
            json!(versions),
            "must have exactly one version marked as storage version",
        ));
    }
    validate_conversion(obj, &spec.child("conversion"), &mut errs);
    errs
}

/// `spec.conversion`, worded with upstream's internal field names (`webhookClientConfig`,
/// `conversionReviewVersions` directly under `conversion`), as kube-apiserver reports them.
fn validate_conversion(obj: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let Some(conv) = obj.pointer("/spec/conversion").filter(|c| c.is_object()) else {
        return;
    };
    let strategy = str_at(conv, "/strategy");
    let hook = conv.get("webhook").filter(|w| !w.is_null());
    let cc = hook
        .and_then(|w| w.get("clientConfig"))
        .filter(|c| !c.is_null());
    let review_versions: Vec<&str> = hook
        .and_then(|w| w.get("conversionReviewVersions"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap_or(""))
        .collect();
    match strategy {
        "None" => {
            if cc.is_some() {
                errs.push(FieldError::forbidden(
                    &path.child("webhookClientConfig"),
                    "should not be set when strategy is not set to Webhook",
                ));
            }
            if !review_versions.is_empty() {
                errs.push(FieldError::forbidden(
                    &path.child("conversionReviewVersions"),
                    "should not be set when strategy is not set to Webhook",
                ));
            }
        }
        "Webhook" => {
            let ccp = path.child("webhookClientConfig");
            match cc {
                None => errs.push(FieldError::required(
                    &ccp,
                    "required when strategy is set to Webhook",
                )),
                Some(cc) => errs.extend(super::admissionregistration::validate_client_config(
                    cc, &ccp,
                )),
            }
            let rp = path.child("conversionReviewVersions");
            if review_versions.is_empty() {
                errs.push(FieldError::required(&rp, ""));
            } else {
                let mut seen = HashSet::new();
                for (i, v) in review_versions.iter().enumerate() {
                    if !seen.insert(*v) {
                        errs.push(FieldError::invalid(&rp.index(i), *v, "duplicate version"));
                    }
                }
                if !review_versions
                    .iter()
                    .any(|v| matches!(*v, "v1" | "v1beta1"))
                {
                    errs.push(FieldError::invalid(
                        &rp,
                        json!(review_versions),
                        "must include at least one of v1, v1beta1",
                    ));
                }
            }
        }
        other => errs.push(FieldError::not_supported(
            &path.child("strategy"),
            other,
            &["None", "Webhook"],
        )),
    }
}

/// Interned strings: a custom resource's names live as long as the server (`Resource`
/// holds `&'static str`), and each distinct string is leaked once, so the memory is
/// bounded by the distinct names ever defined, not by the number of definition writes.
pub(super) fn intern(s: &str) -> &'static str {
    static STRINGS: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut guard = match STRINGS.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    let set = guard.get_or_insert_with(HashSet::new);
    if let Some(s) = set.get(s) {
        return s;
    }
    let leaked: &'static str = Box::leak(s.to_owned().into_boxed_str());
    set.insert(leaked);
    leaked
}

/// An interned list of strings (see [`intern`]).
fn intern_list(items: &[&str]) -> &'static [&'static str] {
    static LISTS: Mutex<Option<HashSet<&'static [&'static str]>>> = Mutex::new(None);
    let interned: Vec<&'static str> = items.iter().map(|s| intern(s)).collect();
    let mut guard = match LISTS.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    let set = guard.get_or_insert_with(HashSet::new);
    if let Some(l) = set.get(interned.as_slice()) {
        return l;
    }
    let leaked: &'static [&'static str] = Box::leak(interned.into_boxed_slice());
    set.insert(leaked);
    leaked
}

/// The resources a definition serves: one per served version, none while it is being
/// deleted or not yet Established.
fn served(crd: &Value, net: &Network) -> Vec<Resource> {
    if crd.pointer("/metadata/deletionTimestamp").is_some() || !established(crd) {
        return Vec::new();
    }
    let strs = |p: &str| -> Vec<&str> {
        crd.pointer(p)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    };
    let group = intern(str_at(crd, "/spec/group"));
    let kind = intern(str_at(crd, "/spec/names/kind"));
    let plural = intern(str_at(crd, "/spec/names/plural"));
    let singular = intern(str_at(crd, "/spec/names/singular"));
    let list_kind = str_at(crd, "/spec/names/listKind");
    let namespaced = str_at(crd, "/spec/scope") == "Namespaced";
    let short_names = intern_list(&strs("/spec/names/shortNames"));
    let categories = intern_list(&strs("/spec/names/categories"));
    // With more than one version, objects are stored in the storage version.
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let storage = versions
        .iter()
        .find(|v| v.get("storage") == Some(&json!(true)))
        .map(|v| str_at(v, "/name").to_owned())
        .filter(|_| versions.len() > 1);
    let conversion = WebhookConverter::of(crd, net).map(Arc::new);
    crd.pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("served") == Some(&json!(true)))
        .map(|v| {
            let mut subs = Vec::new();
            if v.pointer("/subresources/status").is_some() {
                subs.push("status");
            }
            if v.pointer("/subresources/scale").is_some() {
                subs.push("scale");
            }
            Resource {
                group,
                version: intern(str_at(v, "/name")),
                kind,
                plural,
                singular,
                namespaced,
                short_names,
                categories,
                subresources: intern_list(&subs),
                strategy: Box::new(
                    CustomResource::new(group, plural, kind, list_kind, v)
                        .with_storage_version(storage.clone())
                        .with_conversion(conversion.clone()),
                ),
            }
        })
        .collect()
}

/// Reads every definition and serves what they define. Returns the revision read at and
/// the definitions being deleted (for [`cleanup`]).
async fn reload(rest: &Rest, registry: &Registry) -> anyhow::Result<(Revision, Vec<Value>)> {
    let page = rest
        .store
        .range(RangeRequest {
            prefix: PREFIX.as_bytes().to_vec(),
            ..Default::default()
        })
        .await?;
    let net = Network {
        store: rest.store.clone(),
        pod_network: rest.pod_network.clone(),
    };
    let mut resources = Vec::new();
    let mut source = String::new();
    let mut deleting = Vec::new();
    let crds: Vec<(&kumo_storage::KeyValue, Value)> = page
        .kvs
        .iter()
        .filter_map(|kv| match serde_json::from_slice::<Value>(&kv.value) {
            Ok(v) => Some((kv, v)),
            Err(_) => {
                tracing::warn!(key = %String::from_utf8_lossy(&kv.key), "undecodable definition");
                None
            }
        })
        .collect();
    let all: Vec<Value> = crds.iter().map(|(_, c)| c.clone()).collect();
    for (kv, mut crd) in crds {
        if crd.pointer("/metadata/deletionTimestamp").is_none() {
            let taken = TakenNames::of_group(&all, str_at(&crd, "/spec/group"));
            if let Some(status) = naming_step(&crd, &taken) {
                // Served (or not) as written; the watch brings the write back for the next
                // step (or, on a conflict, the newer definition).
                crd["status"] = status;
                if let Some(m) = crd.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                match rest
                    .store
                    .update(&kv.key, serde_json::to_vec(&crd)?, Some(kv.mod_revision))
                    .await
                {
                    Ok(_)
                    | Err(kumo_storage::StorageError::Conflict { .. })
                    | Err(kumo_storage::StorageError::NotFound) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if crd.pointer("/metadata/deletionTimestamp").is_some() {
            if let Some(m) = crd.get_mut("metadata").and_then(Value::as_object_mut) {
                m.insert("resourceVersion".into(), json!(kv.mod_revision.to_string()));
            }
            deleting.push(crd);
            continue;
        }
        let built = served(&crd, &net);
        if !built.is_empty() {
            // Only what the resources are built from: status-only writes change nothing.
            source.push_str(&crd["spec"].to_string());
        }
        resources.extend(built.into_iter().map(Arc::new));
    }
    registry.set_dynamic(source, resources);
    // Their APIServices follow; a failure there must not stop the resources being served.
    if let Err(e) =
        super::apiregistration::sync_custom_resource_api_services(rest, registry, &all).await
    {
        tracing::warn!(error = %e, "syncing the APIServices of custom resources failed");
    }
    Ok((page.revision, deleting))
}

/// Deletes the objects of a definition being deleted, then the definition (or just the
/// cleanup finalizer, when others remain).
async fn cleanup(rest: &Rest, crd: &Value) -> anyhow::Result<()> {
    let group = str_at(crd, "/spec/group");
    let plural = str_at(crd, "/spec/names/plural");
    if !group.is_empty() && !plural.is_empty() {
        let prefix = format!("/registry/{group}/{plural}/");
        let page = rest
            .store
            .range(RangeRequest {
                prefix: prefix.into_bytes(),
                ..Default::default()
            })
            .await?;
        for kv in page.kvs {
            match rest.store.delete(&kv.key, None).await {
                Ok(_) | Err(kumo_storage::StorageError::NotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let key = format!("{PREFIX}{}", name_of(crd));
    let rev: Revision = str_at(crd, "/metadata/resourceVersion")
        .parse()
        .unwrap_or(0);
    let mut crd = crd.clone();
    let mut rest_finalizers = Vec::new();
    if let Some(m) = crd.get_mut("metadata").and_then(Value::as_object_mut) {
        if let Some(f) = m.get("finalizers").and_then(Value::as_array) {
            rest_finalizers = f
                .iter()
                .filter(|x| *x != CLEANUP_FINALIZER)
                .cloned()
                .collect();
        }
        m.remove("resourceVersion");
        m.insert("finalizers".into(), json!(rest_finalizers));
    }
    let expected = (rev > 0).then_some(rev);
    let result = if rest_finalizers.is_empty() {
        rest.store
            .delete(key.as_bytes(), expected)
            .await
            .map(|_| ())
    } else {
        rest.store
            .update(key.as_bytes(), serde_json::to_vec(&crd)?, expected)
            .await
            .map(|_| ())
    };
    match result {
        // A concurrent write: the watch brings the definition back to us.
        Ok(()) | Err(kumo_storage::StorageError::Conflict { .. }) => Ok(()),
        Err(kumo_storage::StorageError::NotFound) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Serves the stored definitions' resources now, and keeps serving what they define as
/// they change (run [`watch`] afterwards). Returns the revision read at.
pub async fn load(rest: &Rest, registry: &Registry) -> anyhow::Result<Revision> {
    let (rev, deleting) = reload(rest, registry).await?;
    for crd in &deleting {
        if crd
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|x| x == CLEANUP_FINALIZER))
        {
            cleanup(rest, crd).await?;
        }
    }
    Ok(rev)
}

/// Follows the definitions from revision `from` on, reloading the registry's custom
/// resources on each change and cleaning up deleted definitions. Runs for the server's
/// lifetime; when the watch ends (or fails) it starts over from a fresh read.
pub async fn watch(
    rest: Arc<Rest>,
    registry: impl std::ops::Deref<Target = Registry>,
    from: Revision,
) {
    let mut from = from;
    loop {
        let mut events = match rest.store.watch(PREFIX.as_bytes(), from).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "watching CustomResourceDefinitions failed");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                match load(&rest, &registry).await {
                    Ok(r) => from = r,
                    Err(e) => tracing::warn!(error = %e, "reloading definitions failed"),
                }
                continue;
            }
        };
        while let Some(ev) = events.next().await {
            let ev: WatchEvent = match ev {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::warn!(error = %e, "definition watch ended");
                    break;
                }
            };
            from = from.max(ev.revision());
            if matches!(ev, WatchEvent::Progress(_)) {
                continue;
            }
            match load(&rest, &registry).await {
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reloading definitions failed"),
            }
        }
        // The watch ended: start over from a fresh read, without spinning.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        match load(&rest, &registry).await {
            Ok(r) => from = r,
            Err(e) => tracing::warn!(error = %e, "reloading definitions failed"),
        }
    }
}
