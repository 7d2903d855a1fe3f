//! admissionregistration.k8s.io/v1 webhook configurations and validating admission
//! policies with their bindings. Stored and validated here; the webhooks are called by
//! `admission::webhook`. Validating admission policies (CEL) are not evaluated yet.

use kumo_apimachinery::validation::{is_dns1123_subdomain, FieldError, Path};
use serde_json::{json, Value};

use super::printing::{arr, col, keep_status, set};
use super::{age_of, default_field, name_of, str_at, Column, Resource, Strategy};

const GROUP: &str = "admissionregistration.k8s.io";

pub(super) fn resources() -> Vec<Resource> {
    let r = |kind, plural, singular, subresources, strategy: Box<dyn Strategy>| Resource {
        group: GROUP,
        version: "v1",
        kind,
        plural,
        singular,
        namespaced: false,
        short_names: &[],
        categories: &["api-extensions"],
        subresources,
        strategy,
    };
    vec![
        r(
            "MutatingAdmissionPolicy",
            "mutatingadmissionpolicies",
            "mutatingadmissionpolicy",
            &[],
            Box::new(Policies { mutating: true }),
        ),
        r(
            "MutatingAdmissionPolicyBinding",
            "mutatingadmissionpolicybindings",
            "mutatingadmissionpolicybinding",
            &[],
            Box::new(Bindings { mutating: true }),
        ),
        r(
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            "mutatingwebhookconfiguration",
            &[],
            Box::new(Webhooks { mutating: true }),
        ),
        r(
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            "validatingadmissionpolicy",
            &["status"],
            Box::new(Policies { mutating: false }),
        ),
        r(
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            "validatingadmissionpolicybinding",
            &[],
            Box::new(Bindings { mutating: false }),
        ),
        r(
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            "validatingwebhookconfiguration",
            &[],
            Box::new(Webhooks { mutating: false }),
        ),
    ]
}

/// The v1 defaults of admission rules (`rules` of webhooks, `resourceRules` of policies).
fn default_rules(rules: Option<&mut Value>) {
    if let Some(rules) = rules.and_then(Value::as_array_mut) {
        for r in rules.iter_mut().filter(|r| r.is_object()) {
            default_field(r, "scope", json!("*"));
        }
    }
}

struct Webhooks {
    mutating: bool,
}

impl Webhooks {
    fn apply_defaults(&self, obj: &mut Value) {
        let Some(hooks) = obj.get_mut("webhooks").and_then(Value::as_array_mut) else {
            return;
        };
        for h in hooks.iter_mut().filter(|h| h.is_object()) {
            default_field(h, "failurePolicy", json!("Fail"));
            default_field(h, "matchPolicy", json!("Equivalent"));
            default_field(h, "namespaceSelector", json!({}));
            default_field(h, "objectSelector", json!({}));
            default_field(h, "timeoutSeconds", json!(10));
            if self.mutating {
                default_field(h, "reinvocationPolicy", json!("Never"));
            }
            if let Some(s) = h
                .pointer_mut("/clientConfig/service")
                .filter(|s| s.is_object())
            {
                default_field(s, "port", json!(443));
            }
            default_rules(h.get_mut("rules"));
        }
    }
}

impl Strategy for Webhooks {
    fn prepare_create(&self, obj: &mut Value) {
        self.apply_defaults(obj);
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        self.apply_defaults(new);
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for (i, h) in arr(obj, "/webhooks").iter().enumerate() {
            let path = Path::new("webhooks").index(i);
            let name = str_at(h, "/name");
            if name.is_empty() {
                errs.push(FieldError::required(&path.child("name"), ""));
            } else {
                for msg in is_dns1123_subdomain(name) {
                    errs.push(FieldError::invalid(&path.child("name"), name, msg));
                }
                if name.split('.').count() < 3 {
                    errs.push(FieldError::invalid(
                        &path.child("name"),
                        name,
                        "should be a domain with at least three segments separated by dots",
                    ));
                }
                if !names.insert(name) {
                    errs.push(FieldError::duplicate(&path.child("name"), name));
                }
            }
            let effects = str_at(h, "/sideEffects");
            if effects.is_empty() {
                errs.push(FieldError::required(
                    &path.child("sideEffects"),
                    "must specify one of None, NoneOnDryRun",
                ));
            } else if !matches!(effects, "None" | "NoneOnDryRun") {
                errs.push(FieldError::not_supported(
                    &path.child("sideEffects"),
                    effects,
                    &["None", "NoneOnDryRun"],
                ));
            }
            errs.extend(validate_client_config(
                h.get("clientConfig").unwrap_or(&Value::Null),
                &path.child("clientConfig"),
            ));
            if arr(h, "/admissionReviewVersions").is_empty() {
                errs.push(FieldError::required(
                    &path.child("admissionReviewVersions"),
                    "must specify one of v1, v1beta1",
                ));
            }
            errs.extend(validate_match_conditions(
                arr(h, "/matchConditions"),
                &path.child("matchConditions"),
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "Webhooks",
                "integer",
                "Webhooks indicates the number of webhooks registered in this configuration",
            ),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(arr(obj, "/webhooks").len()),
            json!(age_of(obj)),
        ]
    }
}

/// A webhook's `clientConfig` (admission webhooks and CRD conversion alike): exactly one of
/// an https `url` or a `service` reference, as upstream's ValidateWebhookURL and
/// ValidateWebhookService check them.
pub(super) fn validate_client_config(cc: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let url = cc.get("url").filter(|u| !u.is_null());
    let svc = cc.get("service").filter(|s| !s.is_null());
    match (url, svc) {
        (Some(url), None) => {
            validate_webhook_url(url.as_str().unwrap_or(""), &path.child("url"), &mut errs)
        }
        (None, Some(svc)) => validate_webhook_service(svc, &path.child("service"), &mut errs),
        _ => errs.push(FieldError::required(
            path,
            "exactly one of url or service is required",
        )),
    }
    errs
}

/// The parts of a URL that the checks look at, split as Go's `url.Parse` does.
struct UrlParts<'a> {
    scheme: &'a str,
    user: Option<&'a str>,
    host: &'a str,
    query: &'a str,
    fragment: &'a str,
}

/// Go's `url.Parse`, as far as the webhook checks need it: Err carries its message.
fn parse_url(raw: &str) -> Result<UrlParts<'_>, String> {
    let fail = |why: &str| {
        format!(
            "parse {}: {why}",
            kumo_apimachinery::validation::go_quote(raw)
        )
    };
    if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(fail("net/url: invalid control character in URL"));
    }
    let (rest, fragment) = raw.split_once('#').unwrap_or((raw, ""));
    // A scheme is letters first, then letters, digits, '+', '-' or '.', up to a ':'.
    let mut scheme = "";
    let mut rest = rest;
    for (i, c) in rest.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i == 0 => return Err(fail("missing protocol scheme")),
            ':' => {
                scheme = &rest[..i];
                rest = &rest[i + 1..];
                break;
            }
            _ => break,
        }
    }
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (mut user, mut host) = (None, "");
    if let Some(after) = rest.strip_prefix("//") {
        let authority = &after[..after.find('/').unwrap_or(after.len())];
        match authority.rsplit_once('@') {
            Some((u, h)) => {
                user = Some(u);
                host = h;
            }
            None => host = authority,
        }
    } else if scheme.is_empty() && rest.split('/').next().is_some_and(|s| s.contains(':')) {
        return Err(fail("first path segment in URL cannot contain colon"));
    }
    Ok(UrlParts {
        scheme,
        user,
        host,
        query,
        fragment,
    })
}

fn validate_webhook_url(raw: &str, path: &Path, errs: &mut Vec<FieldError>) {
    const FORM: &str = "; desired format: https://host[/path]";
    let u = match parse_url(raw) {
        Ok(u) => u,
        Err(e) => {
            errs.push(FieldError::required(
                path,
                format!("url must be a valid URL: {e}{FORM}"),
            ));
            return;
        }
    };
    if u.scheme != "https" {
        errs.push(FieldError::invalid(
            path,
            u.scheme,
            format!("'https' is the only allowed URL scheme{FORM}"),
        ));
    }
    if u.host.is_empty() {
        errs.push(FieldError::invalid(
            path,
            u.host,
            format!("host must be specified{FORM}"),
        ));
    }
    if let Some(user) = u.user {
        errs.push(FieldError::invalid(
            path,
            user,
            "user information is not permitted in the URL",
        ));
    }
    if !u.fragment.is_empty() {
        errs.push(FieldError::invalid(
            path,
            u.fragment,
            "fragments are not permitted in the URL",
        ));
    }
    if !u.query.is_empty() {
        errs.push(FieldError::invalid(
            path,
            u.query,
            "query parameters are not permitted in the URL",
        ));
    }
}

fn validate_webhook_service(svc: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    if str_at(svc, "/name").is_empty() {
        errs.push(FieldError::required(&path.child("name"), ""));
    }
    if str_at(svc, "/namespace").is_empty() {
        errs.push(FieldError::required(&path.child("namespace"), ""));
    }
    // Defaulted to 443 before validation; 0 only if set so.
    let port = svc.get("port").and_then(Value::as_i64).unwrap_or(443);
    if !(1..=65535).contains(&port) {
        errs.push(FieldError::invalid(
            &path.child("port"),
            port,
            "port is not valid: must be between 1 and 65535, inclusive",
        ));
    }
    let Some(url_path) = svc.get("path").and_then(Value::as_str) else {
        return;
    };
    let pp = path.child("path");
    match url_path {
        "" | "/" => return,
        "//" => {
            errs.push(FieldError::invalid(
                &pp,
                url_path,
                "segment[0] may not be empty",
            ));
            return;
        }
        _ => {}
    }
    if !url_path.starts_with('/') {
        errs.push(FieldError::invalid(&pp, url_path, "must start with a '/'"));
    }
    // Go slices off the first byte whatever it is.
    let rest = url_path.get(1..).unwrap_or("");
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    for (i, step) in rest.split('/').enumerate() {
        if step.is_empty() {
            errs.push(FieldError::invalid(
                &pp,
                url_path,
                format!("segment[{i}] may not be empty"),
            ));
            continue;
        }
        for failure in is_dns1123_subdomain(step) {
            errs.push(FieldError::invalid(
                &pp,
                url_path,
                format!("segment[{i}]: {failure}"),
            ));
        }
    }
}

/// Upstream's validateMatchConditions: at most 64, each named (a qualified name, unique)
/// with a CEL expression that compiles.
fn validate_match_conditions(conditions: &[Value], path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if conditions.len() > 64 {
        errs.push(FieldError::too_many(path, conditions.len() as i64, 64));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, c) in conditions.iter().enumerate() {
        let at = path.index(i);
        let expression = str_at(c, "/expression").trim();
        if expression.is_empty() {
            errs.push(FieldError::required(&at.child("expression"), ""));
        } else if let Err(e) = crate::cel::compile(expression, &Value::Null) {
            errs.push(FieldError::invalid(
                &at.child("expression"),
                expression,
                format!("compilation failed: {e}"),
            ));
        }
        let name = str_at(c, "/name");
        if name.is_empty() {
            errs.push(FieldError::required(&at.child("name"), ""));
        } else {
            for msg in kumo_apimachinery::validation::is_qualified_name(name) {
                errs.push(FieldError::invalid(&at.child("name"), name, msg));
            }
        }
        if !name.is_empty() && !names.insert(name) {
            errs.push(FieldError::duplicate(&at.child("name"), name));
        }
    }
    errs
}

/// Validating or mutating admission policies (the mutating ones have no status).
struct Policies {
    mutating: bool,
}

fn default_policy(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default_field(spec, "failurePolicy", json!("Fail"));
    if let Some(m) = spec.get_mut("matchConstraints").filter(|m| m.is_object()) {
        default_field(m, "matchPolicy", json!("Equivalent"));
        default_field(m, "namespaceSelector", json!({}));
        default_field(m, "objectSelector", json!({}));
        default_rules(m.get_mut("resourceRules"));
    }
}

impl Strategy for Policies {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_policy(obj);
        if !self.mutating {
            set(obj, "status", json!({}));
        }
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_policy(new);
        if !self.mutating {
            keep_status(new, old);
        }
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        if obj
            .pointer("/spec/matchConstraints")
            .is_none_or(Value::is_null)
        {
            errs.push(FieldError::required(&spec.child("matchConstraints"), ""));
        }
        let has = |k: &str| !arr(obj, &format!("/spec/{k}")).is_empty();
        if self.mutating {
            if !has("mutations") {
                errs.push(FieldError::required(
                    &spec.child("mutations"),
                    "mutations must contain at least one item",
                ));
            }
            let policy = str_at(obj, "/spec/reinvocationPolicy");
            if policy.is_empty() {
                errs.push(FieldError::required(&spec.child("reinvocationPolicy"), ""));
            } else if !matches!(policy, "Never" | "IfNeeded") {
                errs.push(FieldError::not_supported(
                    &spec.child("reinvocationPolicy"),
                    policy,
                    &["Never", "IfNeeded"],
                ));
            }
        } else if !has("validations") && !has("auditAnnotations") {
            for field in ["validations", "auditAnnotations"] {
                errs.push(FieldError::required(
                    &spec.child(field),
                    "validations or auditAnnotations must contain at least one item",
                ));
            }
        }
        for (i, v) in arr(obj, "/spec/validations").iter().enumerate() {
            if str_at(v, "/expression").trim().is_empty() {
                errs.push(FieldError::required(
                    &spec.child("validations").index(i).child("expression"),
                    "",
                ));
            }
        }
        let fp = str_at(obj, "/spec/failurePolicy");
        if !matches!(fp, "Fail" | "Ignore") {
            errs.push(FieldError::not_supported(
                &spec.child("failurePolicy"),
                fp,
                &["Fail", "Ignore"],
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            if self.mutating {
                col("Mutations", "integer", "Mutation indicates the number of mutations rules defined in this configuration")
            } else {
                col("Validations", "integer", "Validations indicates the number of validation rules defined in this configuration")
            },
            col(
                "ParamKind",
                "string",
                "The kind of the policy's parameters.",
            ),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let param_kind = match obj.pointer("/spec/paramKind").filter(|p| p.is_object()) {
            Some(p) => format!("{}/{}", str_at(p, "/apiVersion"), str_at(p, "/kind")),
            None => "<unset>".to_owned(),
        };
        vec![
            json!(name_of(obj)),
            json!(arr(
                obj,
                if self.mutating {
                    "/spec/mutations"
                } else {
                    "/spec/validations"
                }
            )
            .len()),
            json!(param_kind),
            json!(age_of(obj)),
        ]
    }
}

/// Bindings of validating or mutating admission policies.
struct Bindings {
    mutating: bool,
}

const VALIDATION_ACTIONS: [&str; 3] = ["Audit", "Deny", "Warn"];

impl Strategy for Bindings {
    fn tracks_generation(&self) -> bool {
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        let actions = arr(obj, "/spec/validationActions");
        if actions.is_empty() && !self.mutating {
            errs.push(FieldError::required(&spec.child("validationActions"), ""));
        }
        for (i, a) in actions.iter().enumerate() {
            let a = a.as_str().unwrap_or("");
            if !VALIDATION_ACTIONS.contains(&a) {
                errs.push(FieldError::not_supported(
                    &spec.child("validationActions").index(i),
                    a,
                    &VALIDATION_ACTIONS,
                ));
            }
        }
        if str_at(obj, "/spec/policyName").is_empty() {
            errs.push(FieldError::required(&spec.child("policyName"), ""));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "PolicyName",
                "string",
                "PolicyName indicates the policy definition which the policy binding binded to",
            ),
            col(
                "ParamRef",
                "string",
                "The parameter resource the binding uses.",
            ),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let param = match obj.pointer("/spec/paramRef").filter(|p| p.is_object()) {
            None => "<unset>".to_owned(),
            Some(p) => match (str_at(p, "/namespace"), str_at(p, "/name")) {
                (_, "") => super::printing::format_label_selector(p.get("selector")),
                ("", n) => format!("*/{n}"),
                (ns, n) => format!("{ns}/{n}"),
            },
        };
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/policyName")),
            json!(param),
            json!(age_of(obj)),
        ]
    }
}
