//! authorization.k8s.io/v1: SubjectAccessReview, LocalSubjectAccessReview,
//! SelfSubjectAccessReview and SelfSubjectRulesReview. Create-only resources that are
//! answered by the server's authorizers (`auth::Auth`), never stored, as upstream's
//! pkg/registry/authorization.

use std::collections::BTreeMap;

use kumo_apimachinery::selector::{FieldRequirement, LabelSelector, Operator};
use kumo_apimachinery::status::ApiError;
use kumo_apimachinery::validation::{
    self, go_json, go_quote, is_qualified_name, is_valid_label_value, BadValue, FieldError,
    FieldErrorKind, Path,
};
use serde_json::{json, Map, Value};

use super::{Resource, Strategy};
use crate::auth::{Attributes, Decision, Review, ReviewContext, UserInfo};

const GROUP: &str = "authorization.k8s.io";
const VERSION: &str = "v1";

/// The four review resources, for discovery and routing (their POSTs are answered by
/// [`reviews`]).
pub(super) fn resources() -> Vec<Resource> {
    Kind::ALL.iter().map(|k| k.resource()).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Local,
    SelfAccess,
    SelfRules,
    Subject,
}

impl Kind {
    /// In discovery's (alphabetical) order.
    const ALL: [Kind; 4] = [
        Kind::Local,
        Kind::SelfAccess,
        Kind::SelfRules,
        Kind::Subject,
    ];

    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Kind::Local => (
                "LocalSubjectAccessReview",
                "localsubjectaccessreviews",
                "localsubjectaccessreview",
            ),
            Kind::SelfAccess => (
                "SelfSubjectAccessReview",
                "selfsubjectaccessreviews",
                "selfsubjectaccessreview",
            ),
            Kind::SelfRules => (
                "SelfSubjectRulesReview",
                "selfsubjectrulesreviews",
                "selfsubjectrulesreview",
            ),
            Kind::Subject => (
                "SubjectAccessReview",
                "subjectaccessreviews",
                "subjectaccessreview",
            ),
        }
    }

    fn resource(self) -> Resource {
        let (kind, plural, singular) = self.names();
        Resource {
            group: GROUP,
            version: VERSION,
            kind,
            plural,
            singular,
            namespaced: self == Kind::Local,
            short_names: &[],
            categories: &[],
            subresources: &[],
            strategy: Box::new(CreateOnly),
        }
    }
}

/// The strategy of a resource that only takes creates (which the review answers).
struct CreateOnly;

impl Strategy for CreateOnly {
    fn verbs(&self) -> Option<&'static [&'static str]> {
        Some(&["create"])
    }

    fn delete_collection(&self) -> bool {
        false
    }
}

/// One of the four reviews, answering its resource's POSTs.
pub struct AccessReview(Kind);

impl AccessReview {
    /// `subjectaccessreviews`: may a user do something.
    pub const SUBJECT: AccessReview = AccessReview(Kind::Subject);
    /// `namespaces/<ns>/localsubjectaccessreviews`: the same, within one namespace.
    pub const LOCAL: AccessReview = AccessReview(Kind::Local);
    /// `selfsubjectaccessreviews`: may I do something.
    pub const SELF: AccessReview = AccessReview(Kind::SelfAccess);
    /// `selfsubjectrulesreviews`: what may I do in a namespace.
    pub const SELF_RULES: AccessReview = AccessReview(Kind::SelfRules);
}

#[async_trait::async_trait]
impl Review for AccessReview {
    fn serves(&self) -> (&'static str, &'static str, &'static str) {
        (GROUP, self.0.names().1, "")
    }

    async fn create(&self, mut ctx: ReviewContext<'_>) -> Result<(u16, Value), ApiError> {
        let kind = self.0;
        let res = kind.resource();
        let mut obj = std::mem::take(&mut ctx.body);
        check_type(&res, &mut obj)?;
        // Decoding into the typed object drops what it does not know.
        crate::openapi::prune(&res, &mut obj);
        let namespace = ctx.namespace.unwrap_or("");
        set_namespace(&mut obj, namespace)?;
        if let Some(spec) = obj.get_mut("spec") {
            drop_zero_fields(spec);
        }
        crate::fieldmanager::track_update(
            &res,
            None,
            &BTreeMap::new(),
            crate::fieldmanager::Options::Create,
            None,
            &mut obj,
        )?;
        let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
        let metadata = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
        if kind == Kind::SelfRules {
            return self_rules(&ctx, &spec);
        }
        let errs = validate(kind, &metadata, &spec);
        if !errs.is_empty() {
            // The decoded internal object has no kind: upstream's message starts with
            // `.authorization.k8s.io ""`.
            return Err(ApiError::invalid(
                GROUP,
                "",
                "",
                validation::invalid_message(&format!(".{GROUP}"), "", &errs),
                errs.iter().map(FieldError::to_cause).collect(),
            ));
        }
        if kind == Kind::Local {
            let ns = str_at(&metadata, "/namespace");
            if namespace.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "namespace is required on this type: {namespace}"
                )));
            }
            if namespace != ns {
                return Err(ApiError::bad_request(format!(
                    "spec.resourceAttributes.namespace must match namespace: {namespace}"
                )));
            }
        }
        let user = match kind {
            Kind::SelfAccess => ctx.user.clone(),
            _ => subject(&spec),
        };
        let (attrs, selector_errors) = attributes(user, &spec);
        let decision = ctx.auth.authorize(&attrs);
        let mut status = Map::new();
        let (allowed, denied, reason) = match decision {
            Decision::Allow(r) => (true, false, r),
            Decision::Deny(r) => (false, true, r),
            Decision::NoOpinion(r) => (false, false, r),
        };
        status.insert("allowed".into(), json!(allowed));
        if denied {
            status.insert("denied".into(), json!(true));
        }
        if !reason.is_empty() {
            status.insert("reason".into(), json!(reason));
        }
        if !selector_errors.is_empty() {
            status.insert("evaluationError".into(), json!(selector_errors.join("; ")));
        }
        let (kind_name, _, _) = kind.names();
        Ok((
            201,
            json!({
                "kind": kind_name,
                "apiVersion": res.api_version(),
                "metadata": metadata,
                "spec": spec,
                "status": status,
            }),
        ))
    }
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Checks the body's kind and apiVersion against the endpoint's, fills them in when
/// absent, and checks field types against the schema.
fn check_type(res: &Resource, obj: &mut Value) -> Result<(), ApiError> {
    let Some(o) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized (must be of type object)",
        ));
    };
    let field = |k: &str| o.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let (mut kind, mut api_version) = (field("kind"), field("apiVersion"));
    // Missing ones are defaulted from the endpoint, as the decoder does.
    if kind.is_empty() {
        kind = res.kind.to_owned();
    }
    if api_version.is_empty() {
        api_version = res.api_version();
    }
    if kind != res.kind || api_version != res.api_version() {
        let version = api_version.rsplit('/').next().unwrap_or("");
        let registered =
            api_version == res.api_version() && Kind::ALL.iter().any(|k| k.names().0 == kind);
        let why = if registered {
            format!(
                "converting ({VERSION}.{kind}) to (authorization.{}): unknown conversion",
                res.kind
            )
        } else {
            format!(
                "no kind {} is registered for version {} in scheme \"pkg/runtime/scheme.go:111\"",
                go_quote(&kind),
                go_quote(&api_version)
            )
        };
        return Err(ApiError::bad_request(format!(
            "{kind} in version {} cannot be handled as a {}: {why}",
            go_quote(version),
            res.kind
        )));
    }
    o.insert("kind".into(), json!(res.kind));
    o.insert("apiVersion".into(), json!(res.api_version()));
    match o.get("metadata") {
        None | Some(Value::Null) => {
            o.insert("metadata".into(), json!({}));
        }
        Some(Value::Object(_)) => {}
        Some(_) => return Err(ApiError::bad_request("metadata: expected an object")),
    }
    if let Some(e) = crate::openapi::type_error(res, obj) {
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {e}",
            kind = res.kind,
            version = res.version,
        )));
    }
    Ok(())
}

/// Upstream's EnsureObjectNamespaceMatchesRequestNamespace: the URL's namespace fills an
/// empty one, a cluster-scoped request clears it, a different one is refused.
fn set_namespace(obj: &mut Value, url_namespace: &str) -> Result<(), ApiError> {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let current = meta
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if current == url_namespace {
        return Ok(());
    }
    if current.is_empty() || url_namespace.is_empty() {
        if url_namespace.is_empty() {
            meta.remove("namespace");
        } else {
            meta.insert("namespace".into(), json!(url_namespace));
        }
        return Ok(());
    }
    Err(ApiError::bad_request(
        "the namespace of the provided object does not match the namespace sent on the request",
    ))
}

/// Leaves out what Go's encoding leaves out of a decoded spec (`omitempty` strings, lists
/// and the `extra` map); the attribute structs themselves are pointers and stay even when
/// empty.
fn drop_zero_fields(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.retain(|k, v| match v {
                Value::Null => false,
                Value::String(s) => !s.is_empty(),
                Value::Array(a) => !a.is_empty(),
                Value::Object(m) if k == "extra" => !m.is_empty(),
                _ => true,
            });
            for (k, v) in o.iter_mut() {
                // The values of `extra` are lists of strings kept as they are.
                if k != "extra" {
                    drop_zero_fields(v);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(drop_zero_fields),
        _ => {}
    }
}

/// Whether a JSON value is Go's zero value once decoded (nil and empty are the same to
/// upstream's semantic equality).
fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Bool(b) => !b,
    }
}

/// ObjectMeta's fields in Go's order, for rendering it as upstream does in errors.
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// ObjectMeta as Go's encoding/json writes it (fields in declaration order, zero values
/// left out).
fn go_object_meta(meta: &Value) -> String {
    let parts: Vec<String> = OBJECT_META_FIELDS
        .iter()
        .filter_map(|k| {
            let v = meta.get(*k).filter(|v| !is_zero(v))?;
            let rendered = match (*k, v) {
                ("managedFields", Value::Array(entries)) => {
                    let entries: Vec<String> = entries
                        .iter()
                        .map(|e| go_struct(e, MANAGED_FIELDS_ENTRY_FIELDS))
                        .collect();
                    format!("[{}]", entries.join(","))
                }
                _ => go_json(v),
            };
            Some(format!("{}:{rendered}", go_quote(k)))
        })
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// ManagedFieldsEntry's fields in Go's order.
const MANAGED_FIELDS_ENTRY_FIELDS: &[&str] = &[
    "manager",
    "operation",
    "apiVersion",
    "time",
    "fieldsType",
    "fieldsV1",
    "subresource",
];

/// A JSON object with `fields` in that order, zero values left out.
fn go_struct(v: &Value, fields: &[&str]) -> String {
    let parts: Vec<String> = fields
        .iter()
        .filter_map(|k| {
            let v = v.get(*k).filter(|v| !is_zero(v))?;
            Some(format!("{}:{}", go_quote(k), go_json(v)))
        })
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// A field error whose value is already rendered (struct values that Go prints in their
/// declaration order, which a JSON map would not keep).
fn invalid_rendered(path: &Path, rendered: String, detail: &str) -> FieldError {
    FieldError {
        field: path.as_str().to_owned(),
        kind: FieldErrorKind::Invalid,
        bad_value: BadValue::Omitted,
        message: format!("{rendered}: {detail}"),
    }
}

/// NonResourceAttributes as the internal Go struct (no JSON tags) prints: `{"Path":..,"Verb":..}`.
fn go_non_resource(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "null".to_owned(),
        Some(v) => format!(
            "{{\"Path\":{},\"Verb\":{}}}",
            go_json(&json!(str_at(v, "/path"))),
            go_json(&json!(str_at(v, "/verb")))
        ),
    }
}

/// Upstream's ValidateSubjectAccessReview, ValidateLocalSubjectAccessReview and
/// ValidateSelfSubjectAccessReview.
fn validate(kind: Kind, metadata: &Value, spec: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec_path = Path::new("spec");
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    if resource.is_some() == non_resource.is_some() {
        errs.push(invalid_rendered(
            &spec_path,
            go_non_resource(non_resource),
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    }
    if kind != Kind::SelfAccess
        && str_at(spec, "/user").is_empty()
        && strings(spec.get("groups")).is_empty()
    {
        errs.push(FieldError::invalid(
            &spec_path.child("user"),
            str_at(spec, "/user"),
            "at least one of user or group must be specified",
        ));
    }
    if let Some(r) = resource {
        validate_selectors(r, &mut errs);
    }
    let mut rest = metadata.as_object().cloned().unwrap_or_default();
    rest.remove("managedFields");
    if kind == Kind::Local {
        rest.remove("namespace");
    }
    if rest.values().any(|v| !is_zero(v)) {
        let detail = if kind == Kind::Local {
            "must be empty except for namespace"
        } else {
            "must be empty"
        };
        errs.push(invalid_rendered(
            &Path::new("metadata"),
            go_object_meta(metadata),
            detail,
        ));
    }
    if kind == Kind::Local {
        let ns = str_at(metadata, "/namespace");
        if let Some(r) = resource {
            let want = str_at(r, "/namespace");
            if want != ns {
                errs.push(FieldError::invalid(
                    &Path::new("spec.resourceAttributes.namespace"),
                    want,
                    "must match metadata.namespace",
                ));
            }
        }
        if non_resource.is_some() {
            errs.push(invalid_rendered(
                &Path::new("spec.nonResourceAttributes"),
                go_non_resource(non_resource),
                "disallowed on this kind of request",
            ));
        }
    }
    errs
}

/// The field and label selector attributes of a SubjectAccessReview.
fn validate_selectors(r: &Value, errs: &mut Vec<FieldError>) {
    let base = Path::new("spec.resourceAttributes");
    for (key, field_selector) in [("fieldSelector", true), ("labelSelector", false)] {
        let Some(sel) = r.get(key).filter(|v| !v.is_null()) else {
            continue;
        };
        let path = base.child(key);
        let raw = str_at(sel, "/rawSelector");
        let reqs = sel
            .get("requirements")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if !raw.is_empty() && !reqs.is_empty() {
            errs.push(FieldError::invalid(
                &path.child("rawSelector"),
                raw,
                "may not specified at the same time as requirements",
            ));
        }
        if raw.is_empty() && reqs.is_empty() {
            errs.push(FieldError::required(
                &path.child("requirements"),
                format!(
                    "when {} is specified, requirements or rawSelector is required",
                    path.as_str()
                ),
            ));
        }
        for (i, req) in reqs.iter().enumerate() {
            let at = path.child("requirements").index(i);
            let op = str_at(req, "/operator");
            let values = strings(req.get("values"));
            let key_name = str_at(req, "/key");
            if field_selector && key_name.is_empty() {
                errs.push(FieldError::required(&at.child("key"), "must be specified"));
            }
            match op {
                "In" | "NotIn" if values.is_empty() => errs.push(FieldError::required(
                    &at.child("values"),
                    "must be specified when `operator` is 'In' or 'NotIn'",
                )),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    errs.push(FieldError::forbidden(
                        &at.child("values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ))
                }
                _ => {}
            }
            if !field_selector {
                for msg in is_qualified_name(key_name) {
                    errs.push(FieldError::invalid(&at.child("key"), key_name, msg));
                }
                for (j, v) in values.iter().enumerate() {
                    for msg in is_valid_label_value(v) {
                        errs.push(FieldError::invalid(
                            &at.child("values").index(j),
                            v.as_str(),
                            msg,
                        ));
                    }
                }
            }
        }
    }
}

/// The user a SubjectAccessReview asks about.
fn subject(spec: &Value) -> UserInfo {
    let extra = spec
        .get("extra")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), strings(Some(v))))
                .collect()
        })
        .unwrap_or_default();
    UserInfo {
        name: str_at(spec, "/user").to_owned(),
        uid: str_at(spec, "/uid").to_owned(),
        groups: strings(spec.get("groups")),
        extra,
    }
}

/// The attributes a review asks about (upstream's ResourceAttributesFrom and
/// NonResourceAttributesFrom), with the evaluation errors of selectors that do not parse.
fn attributes(user: UserInfo, spec: &Value) -> (Attributes, Vec<String>) {
    let mut errors = Vec::new();
    let Some(r) = spec.get("resourceAttributes").filter(|v| v.is_object()) else {
        let n = spec
            .get("nonResourceAttributes")
            .cloned()
            .unwrap_or(Value::Null);
        let attrs = Attributes {
            user,
            verb: str_at(&n, "/verb").to_owned(),
            resource_request: false,
            path: str_at(&n, "/path").to_owned(),
            ..Default::default()
        };
        return (attrs, errors);
    };
    let version = match str_at(r, "/version") {
        "" => "*",
        v => v,
    };
    let mut attrs = Attributes {
        user,
        verb: str_at(r, "/verb").to_owned(),
        resource_request: true,
        api_group: str_at(r, "/group").to_owned(),
        api_version: version.to_owned(),
        namespace: str_at(r, "/namespace").to_owned(),
        resource: str_at(r, "/resource").to_owned(),
        subresource: str_at(r, "/subresource").to_owned(),
        name: str_at(r, "/name").to_owned(),
        ..Default::default()
    };
    if let Some(sel) = r.get("fieldSelector").filter(|v| v.is_object()) {
        let (selector, outcome) = field_selector(sel);
        attrs.field_selector = selector;
        if let Some(partial) = outcome {
            errors.push(format!(
                "spec.resourceAttributes.fieldSelector {} due to parse error",
                if partial {
                    "partially ignored"
                } else {
                    "ignored"
                }
            ));
        }
    }
    if let Some(sel) = r.get("labelSelector").filter(|v| v.is_object()) {
        if let Some(partial) = label_selector_errors(sel) {
            errors.push(format!(
                "spec.resourceAttributes.labelSelector {} due to parse error",
                if partial {
                    "partially ignored"
                } else {
                    "ignored"
                }
            ));
        }
    }
    (attrs, errors)
}

/// A SubjectAccessReview's field selector as a raw selector for [`Attributes`], and
/// whether part (`Some(true)`) or all (`Some(false)`) of it failed to parse.
fn field_selector(sel: &Value) -> (String, Option<bool>) {
    let raw = str_at(sel, "/rawSelector");
    let reqs = sel
        .get("requirements")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !reqs.is_empty() {
        let mut terms = Vec::new();
        let mut failed = false;
        for r in &reqs {
            let values = strings(r.get("values"));
            let operator = match str_at(r, "/operator") {
                "In" => Operator::Equals,
                "NotIn" => Operator::NotEquals,
                _ => {
                    failed = true;
                    continue;
                }
            };
            if values.len() != 1 {
                failed = true;
                continue;
            }
            terms.push(
                FieldRequirement {
                    field: str_at(r, "/key").to_owned(),
                    operator,
                    value: values[0].clone(),
                }
                .to_string(),
            );
        }
        let outcome = failed.then_some(!terms.is_empty());
        return (terms.join(","), outcome);
    }
    if raw.is_empty() {
        return (String::new(), None);
    }
    match kumo_apimachinery::selector::FieldSelector::parse(raw) {
        Ok(_) => (raw.to_owned(), None),
        Err(_) => (String::new(), Some(false)),
    }
}

/// Whether part (`Some(true)`) or all (`Some(false)`) of a label selector failed to parse.
fn label_selector_errors(sel: &Value) -> Option<bool> {
    let reqs = sel
        .get("requirements")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !reqs.is_empty() {
        let mut ok = 0;
        let mut failed = false;
        for r in &reqs {
            let one = json!({"matchExpressions": [r]});
            if LabelSelector::from_json(&one).is_ok() {
                ok += 1;
            } else {
                failed = true;
            }
        }
        return failed.then_some(ok > 0);
    }
    let raw = str_at(sel, "/rawSelector");
    if raw.is_empty() {
        return None;
    }
    LabelSelector::parse(raw).err().map(|_| false)
}

/// A SelfSubjectRulesReview: the rules every authorizer lists for the requester.
fn self_rules(ctx: &ReviewContext<'_>, spec: &Value) -> Result<(u16, Value), ApiError> {
    let namespace = str_at(spec, "/namespace");
    if namespace.is_empty() {
        return Err(ApiError::bad_request("no namespace on request"));
    }
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    let mut incomplete = false;
    let mut errors = Vec::new();
    for a in &ctx.auth.authorizers {
        // An authorizer that cannot list rules makes the list incomplete.
        let Some(list) = a.rules_for(ctx.user, namespace) else {
            incomplete = true;
            continue;
        };
        resource_rules.extend(list.resource_rules);
        non_resource_rules.extend(list.non_resource_rules);
        incomplete |= list.incomplete;
        if !list.evaluation_error.is_empty() {
            errors.push(list.evaluation_error);
        }
    }
    let mut status = json!({
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": incomplete,
    });
    if !errors.is_empty() {
        // Upstream's aggregate error: one message alone, several as a list.
        status["evaluationError"] = json!(if errors.len() == 1 {
            errors.remove(0)
        } else {
            format!("[{}]", errors.join(", "))
        });
    }
    Ok((
        201,
        json!({
            "kind": "SelfSubjectRulesReview",
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "metadata": {},
            "spec": {},
            "status": status,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn validation_messages() {
        let errs = validate(
            Kind::Subject,
            &json!({}),
            &json!({"resourceAttributes": {"verb": "get"}}),
        );
        assert_eq!(
            messages(&errs),
            [r#"spec.user: Invalid value: "": at least one of user or group must be specified"#]
        );
        let errs = validate(Kind::Subject, &json!({}), &json!({"user": "a"}));
        assert_eq!(
            messages(&errs),
            ["spec: Invalid value: null: exactly one of nonResourceAttributes or resourceAttributes must be specified"]
        );
        let errs = validate(
            Kind::Local,
            &json!({"namespace": "default"}),
            &json!({"user": "a", "nonResourceAttributes": {"path": "/x", "verb": "get"}}),
        );
        assert_eq!(
            messages(&errs),
            [
                r#"spec.nonResourceAttributes: Invalid value: {"Path":"/x","Verb":"get"}: disallowed on this kind of request"#
            ]
        );
        let errs = validate(
            Kind::Local,
            &json!({"namespace": "default"}),
            &json!({"user": "a", "resourceAttributes": {"namespace": "other"}}),
        );
        assert_eq!(
            messages(&errs),
            [
                r#"spec.resourceAttributes.namespace: Invalid value: "other": must match metadata.namespace"#
            ]
        );
        let errs = validate(
            Kind::SelfAccess,
            &json!({"labels": {"a": "b"}, "name": "x"}),
            &json!({"resourceAttributes": {}}),
        );
        assert_eq!(
            messages(&errs),
            [r#"metadata: Invalid value: {"name":"x","labels":{"a":"b"}}: must be empty"#]
        );
    }

    #[test]
    fn selectors() {
        let (sel, err) = field_selector(&json!({"requirements": [
            {"key": "spec.nodeName", "operator": "In", "values": ["n1"]},
            {"key": "x", "operator": "Exists"}
        ]}));
        assert_eq!((sel.as_str(), err), ("spec.nodeName=n1", Some(true)));
        let (sel, err) = field_selector(&json!({"rawSelector": "spec.nodeName"}));
        assert_eq!((sel.as_str(), err), ("", Some(false)));
        assert_eq!(
            label_selector_errors(&json!({"rawSelector": "a in (b"})),
            Some(false)
        );
        assert_eq!(label_selector_errors(&json!({"rawSelector": "a=b"})), None);
    }
}
