//! ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1): CEL validations of the
//! stored policies, applied through their bindings to the writes their match
//! constraints select, as upstream's ValidatingAdmissionPolicy plugin does.
//!
//! Expressions see `object`, `oldObject`, `request` (the AdmissionRequest), `params` (the
//! binding's parameter object), `namespaceObject` and `variables`. A failed validation
//! takes the binding's `validationActions`: `Deny` refuses the write (reason `Invalid`
//! unless the validation names another), `Warn` adds a `Warning` header, `Audit` is only
//! recorded. The policies' `status.typeChecking` is left unset.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use kumo_apimachinery::selector::LabelSelector;
use kumo_apimachinery::status::{ApiError, Cause, GroupResource};
use serde_json::{json, Value};

use super::{Attributes, Operation, Plugin};
use crate::cel::{Activation, Outcome};

const POLICIES: &str = "/registry/validatingadmissionpolicies/";
const BINDINGS: &str = "/registry/validatingadmissionpolicybindings/";

/// The ValidatingAdmissionPolicy admission plugin.
#[derive(Default)]
pub struct ValidatingAdmissionPolicy;

pub(super) fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn labels_of(obj: Option<&Value>) -> Option<BTreeMap<String, String>> {
    let m = obj?.pointer("/metadata/labels").and_then(Value::as_object);
    Some(
        m.into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect(),
    )
}

pub(super) fn is_namespaces(a: &Attributes<'_>) -> bool {
    a.resource.group.is_empty() && a.resource.plural == "namespaces"
}

/// The request's namespace (a namespace's own name for its updates and deletes).
fn request_namespace<'a>(a: &'a Attributes<'_>) -> &'a str {
    match a.namespace {
        Some(ns) => ns,
        None if is_namespaces(a) && a.operation != Operation::Create => a.name,
        None => "",
    }
}

/// One of `resourceRules` / `excludeResourceRules` (a NamedRuleWithOperations).
fn rule_matches(r: &Value, a: &Attributes<'_>) -> bool {
    let any = |items: Vec<&str>, want: &str| items.iter().any(|i| *i == "*" || *i == want);
    if !any(strings(r.get("operations")), a.operation.as_str())
        || !any(strings(r.get("apiGroups")), a.resource.group)
        || !any(strings(r.get("apiVersions")), a.resource.version)
    {
        return false;
    }
    let plural = a.resource.plural;
    let resource_ok = strings(r.get("resources")).iter().any(|res| {
        let (rr, rs) = res.split_once('/').unwrap_or((res, ""));
        let res_match = rr == "*" || rr == plural;
        match a.subresource {
            None => res_match && rs.is_empty(),
            Some(sub) => res_match && (rs == "*" || rs == sub),
        }
    });
    if !resource_ok {
        return false;
    }
    let names = strings(r.get("resourceNames"));
    if !names.is_empty() && !names.contains(&a.name) {
        return false;
    }
    let ns = request_namespace(a);
    match r.get("scope").and_then(Value::as_str).unwrap_or("*") {
        "Namespaced" => !is_namespaces(a) && !ns.is_empty(),
        "Cluster" => is_namespaces(a) || ns.is_empty(),
        _ => true,
    }
}

/// Whether `m` (a MatchResources) selects the request: `Err` when a selector cannot be
/// evaluated.
pub(super) async fn matches(
    m: &Value,
    a: &Attributes<'_>,
    obj: Option<&Value>,
    require_rules: bool,
) -> Result<bool, String> {
    let rules = m.get("resourceRules").and_then(Value::as_array);
    let rule_ok = match rules {
        Some(rs) if !rs.is_empty() => rs.iter().any(|r| rule_matches(r, a)),
        _ => !require_rules,
    };
    if !rule_ok {
        return Ok(false);
    }
    if m.get("excludeResourceRules")
        .and_then(Value::as_array)
        .is_some_and(|rs| rs.iter().any(|r| rule_matches(r, a)))
    {
        return Ok(false);
    }
    let sel = |k: &str| match m.get(k) {
        None | Some(Value::Null) => Ok(LabelSelector::everything()),
        Some(v) => LabelSelector::from_json(v).map_err(|e| e.to_string()),
    };
    let ns = request_namespace(a);
    let ns_sel = sel("namespaceSelector")?;
    if !ns_sel.is_empty() && (!ns.is_empty() || is_namespaces(a)) {
        let labels = if is_namespaces(a) && a.subresource.is_none() && obj.is_some() {
            labels_of(obj).unwrap_or_default()
        } else {
            labels_of(namespace(a, ns).await.as_ref()).unwrap_or_default()
        };
        if !ns_sel.matches(&labels) {
            return Ok(false);
        }
    }
    let obj_sel = sel("objectSelector")?;
    if !obj_sel.is_empty() {
        let m = |o: Option<&Value>| labels_of(o).is_some_and(|l| obj_sel.matches(&l));
        if !m(obj) && !m(a.old) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The first stored object under `prefix` named `name` (exact key `prefix + name`).
fn cached(a: &Attributes<'_>, root: &str, key: &str) -> Option<Value> {
    let cache = a.rest.caches.get(root);
    cache
        .snapshot(key)
        .objects
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, c)| c.object().clone())
}

pub(super) async fn namespace(a: &Attributes<'_>, ns: &str) -> Option<Value> {
    if ns.is_empty() {
        return None;
    }
    let key = format!("/registry/namespaces/{ns}");
    if let Some(v) = cached(a, "/registry/namespaces/", &key) {
        return Some(v);
    }
    let (kv, _) = a.rest.store.get(key.as_bytes(), None).await.ok()?;
    serde_json::from_slice(&kv?.value).ok()
}

/// Every stored object under `root`.
pub(super) async fn all(a: &Attributes<'_>, root: &str) -> Result<Vec<Value>, ApiError> {
    let cache = a.rest.caches.get(root);
    if cache.wait_for(1, Duration::from_secs(3)).await.is_none() {
        return Err(ApiError::forbidden(
            &a.resource.group_resource(),
            a.name,
            "not yet ready to handle request",
        ));
    }
    Ok(cache
        .snapshot(root)
        .objects
        .iter()
        .map(|(_, c)| c.object().clone())
        .collect())
}

/// The AdmissionRequest as expressions see it.
pub(super) fn request(a: &Attributes<'_>) -> Value {
    let res = a.resource;
    let kind = json!({"group": res.group, "version": res.version, "kind": res.kind});
    let resource = json!({"group": res.group, "version": res.version, "resource": res.plural});
    let mut r = json!({
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": a.name,
        "namespace": a.namespace.unwrap_or(""),
        "operation": a.operation.as_str(),
        "userInfo": {
            "username": a.user.name,
            "uid": a.user.uid,
            "groups": a.user.groups,
            "extra": a.user.extra,
        },
        "dryRun": a.dry_run,
        "options": a.options,
    });
    if let Some(sub) = a.subresource {
        r["subResource"] = json!(sub);
        r["requestSubResource"] = json!(sub);
    }
    r
}

/// The parameter objects a binding selects (`Ok(None)`: the policy takes none).
pub(super) async fn params(
    a: &Attributes<'_>,
    policy: &Value,
    binding: &Value,
) -> Result<Option<Vec<Value>>, String> {
    let Some(kind) = policy.pointer("/spec/paramKind").filter(|k| k.is_object()) else {
        return Ok(None);
    };
    let api_version = kind.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind_name = kind.get("kind").and_then(Value::as_str).unwrap_or("");
    // A binding that does not use the policy's paramKind validates with null params.
    let Some(pref) = binding.pointer("/spec/paramRef").filter(|p| p.is_object()) else {
        return Ok(None);
    };
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    let plural = format!("{}s", kind_name.to_lowercase());
    let roots = [
        format!("/registry/{plural}/"),
        format!("/registry/{group}/{plural}/"),
    ];
    let ns = match pref.get("namespace").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => Some(n.to_owned()),
        _ => a.namespace.map(str::to_owned),
    };
    let mut found = Vec::new();
    for root in &roots {
        let objs = a.rest.caches.get(root).snapshot(root).objects;
        for (_, c) in objs {
            let o = c.object();
            if o.get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k != kind_name)
            {
                continue;
            }
            let ons = o.pointer("/metadata/namespace").and_then(Value::as_str);
            if ns.is_some() && ons.is_some() && ons != ns.as_deref() {
                continue;
            }
            let name_ok = match pref.get("name").and_then(Value::as_str) {
                Some(n) if !n.is_empty() => {
                    o.pointer("/metadata/name").and_then(Value::as_str) == Some(n)
                }
                _ => match pref.get("selector") {
                    Some(s) => LabelSelector::from_json(s)
                        .map(|sel| sel.matches(&labels_of(Some(&o)).unwrap_or_default()))
                        .unwrap_or(false),
                    None => false,
                },
            };
            if name_ok {
                found.push(o.clone());
            }
        }
        if !found.is_empty() {
            break;
        }
    }
    if found.is_empty() {
        let action = pref
            .get("parameterNotFoundAction")
            .and_then(Value::as_str)
            .unwrap_or("Deny");
        if action == "Allow" {
            return Ok(Some(Vec::new()));
        }
        return Err(format!(
            "no params found for policy binding with `{action}` parameterNotFoundAction"
        ));
    }
    Ok(Some(found))
}

/// One failed validation: its message and the reason to refuse with.
struct Failure {
    message: String,
    reason: Option<String>,
}

/// Defines a policy's `variables` and evaluates its `matchConditions`: `Ok(false)` when one
/// does not hold, `Err` (the condition's name) when one does not evaluate to a bool.
pub(super) fn preamble(spec: &Value, act: &mut Activation) -> Result<bool, String> {
    for v in spec
        .get("variables")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = v.get("name").and_then(Value::as_str).unwrap_or("");
        let expr = v.get("expression").and_then(Value::as_str).unwrap_or("");
        act.define(name, expr);
    }
    for c in spec
        .get("matchConditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let expr = c.get("expression").and_then(Value::as_str).unwrap_or("");
        match act.eval(expr) {
            Ok(Outcome::Bool(true)) => {}
            Ok(Outcome::Bool(false)) => return Ok(false),
            Ok(Outcome::Other(_) | Outcome::String(_)) | Err(_) => {
                return Err(c
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned())
            }
        }
    }
    Ok(true)
}

/// Evaluates a policy's match conditions and validations with one parameter object.
fn evaluate(policy: &Value, act: &mut Activation, fail_closed: bool) -> Vec<Failure> {
    let spec = policy.get("spec").unwrap_or(&Value::Null);
    let mut out = Vec::new();
    match preamble(spec, act) {
        Ok(true) => {}
        Ok(false) => return out,
        Err(name) => {
            if fail_closed {
                out.push(Failure {
                    message: format!("failed to evaluate match condition '{name}'"),
                    reason: None,
                });
            }
            return out;
        }
    }
    for v in spec
        .get("validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let expr = v.get("expression").and_then(Value::as_str).unwrap_or("");
        let reason = v.get("reason").and_then(Value::as_str).map(str::to_owned);
        match act.eval(expr) {
            Ok(Outcome::Bool(true)) => {}
            Ok(Outcome::Bool(false)) => {
                let from_expression = v
                    .get("messageExpression")
                    .and_then(Value::as_str)
                    .filter(|m| !m.trim().is_empty())
                    .and_then(|m| match act.eval(m) {
                        Ok(Outcome::String(s)) => {
                            let t = s.trim();
                            (!t.is_empty() && !t.contains('\n') && t.len() <= 5 * 1024)
                                .then(|| t.to_owned())
                        }
                        _ => None,
                    });
                let message = from_expression
                    .or_else(|| {
                        v.get("message")
                            .and_then(Value::as_str)
                            .map(str::trim)
                            .filter(|m| !m.is_empty())
                            .map(str::to_owned)
                    })
                    .unwrap_or_else(|| format!("failed expression: {}", expr.trim()));
                out.push(Failure { message, reason });
            }
            Ok(Outcome::String(_)) => {
                if fail_closed {
                    out.push(Failure {
                        message: format!("expression '{expr}' resulted in error: no such overload"),
                        reason: None,
                    });
                }
            }
            Ok(Outcome::Other(t)) => {
                if fail_closed {
                    out.push(Failure {
                        message: format!(
                            "expression '{expr}' resulted in error: expected bool, got {t}"
                        ),
                        reason: None,
                    });
                }
            }
            Err(e) => {
                if fail_closed {
                    out.push(Failure {
                        message: format!("expression '{expr}' resulted in error: {e}"),
                        reason: None,
                    });
                }
            }
        }
    }
    out
}

/// The refusal of a denied request (upstream's admission.NewForbidden with the
/// decision's reason and code, the message repeated as a cause).
fn denied(
    a: &Attributes<'_>,
    obj: Option<&Value>,
    message: String,
    reason: Option<&str>,
) -> ApiError {
    let mut err = forbidden(a, obj, &message);
    let (reason, code) = match reason.unwrap_or("Invalid") {
        "Forbidden" => ("Forbidden", 403),
        "Unauthorized" => ("Unauthorized", 401),
        "RequestEntityTooLarge" => ("RequestEntityTooLarge", 413),
        _ => ("Invalid", 422),
    };
    err.reason = reason;
    err.code = code;
    if let Some(d) = err.details.as_mut() {
        d.causes.push(Cause {
            reason: String::new(),
            message,
            field: String::new(),
        });
    }
    err
}

/// Upstream's admission.NewForbidden: the request's resource and object name (the object's
/// own, on a create), refused for `why`.
pub(super) fn forbidden(a: &Attributes<'_>, obj: Option<&Value>, why: &str) -> ApiError {
    let name = if a.name.is_empty() {
        obj.and_then(|o| o.pointer("/metadata/name"))
            .and_then(Value::as_str)
            .unwrap_or("")
    } else {
        a.name
    };
    ApiError::forbidden(
        &GroupResource::new(a.resource.group, a.resource.plural),
        name,
        why,
    )
}

/// Policies and bindings are admissionregistration's own objects: never subject to them.
fn exempt(a: &Attributes<'_>) -> bool {
    a.resource.group == "admissionregistration.k8s.io"
}

#[async_trait]
impl Plugin for ValidatingAdmissionPolicy {
    fn name(&self) -> &'static str {
        "ValidatingAdmissionPolicy"
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        if exempt(a) || a.operation == Operation::Connect {
            return Ok(());
        }
        let bindings = all(a, BINDINGS).await?;
        if bindings.is_empty() {
            return Ok(());
        }
        let policies = all(a, POLICIES).await?;
        let by_name: BTreeMap<&str, &Value> = policies
            .iter()
            .filter_map(|p| Some((p.pointer("/metadata/name")?.as_str()?, p)))
            .collect();
        let mut namespace_object: Option<Option<Value>> = None;
        for binding in &bindings {
            let policy_name = binding
                .pointer("/spec/policyName")
                .and_then(Value::as_str)
                .unwrap_or("");
            let Some(policy) = by_name.get(policy_name) else {
                continue;
            };
            let fail_closed = policy
                .pointer("/spec/failurePolicy")
                .and_then(Value::as_str)
                != Some("Ignore");
            let constraints = policy
                .pointer("/spec/matchConstraints")
                .unwrap_or(&Value::Null);
            let binding_name = binding
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            // A configuration error (the policy's or the binding's match, the params) is a
            // Deny decision whatever the binding's actions, unless the policy ignores
            // failures (upstream's addConfigError).
            let config_error = |e: String, of_binding: bool| {
                let message = if of_binding {
                    format!("ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: failed to configure binding: {e}")
                } else {
                    format!("ValidatingAdmissionPolicy '{policy_name}' denied request: failed to configure policy: {e}")
                };
                denied(a, obj, message, None)
            };
            match matches(constraints, a, obj, true).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) if fail_closed => return Err(config_error(e, false)),
                Err(_) => continue,
            }
            if let Some(m) = binding
                .pointer("/spec/matchResources")
                .filter(|m| m.is_object())
            {
                match matches(m, a, obj, false).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) if fail_closed => return Err(config_error(e, true)),
                    Err(_) => continue,
                }
            }
            let actions = strings(binding.pointer("/spec/validationActions"));
            let params = match params(a, policy, binding).await {
                Ok(p) => p,
                Err(e) if fail_closed => return Err(config_error(e, true)),
                Err(_) => continue,
            };
            if namespace_object.is_none() {
                let ns = if is_namespaces(a) {
                    ""
                } else {
                    a.namespace.unwrap_or("")
                };
                namespace_object = Some(namespace(a, ns).await);
            }
            let ns_obj = namespace_object.as_ref().and_then(Option::as_ref);
            let request = request(a);
            let param_list: Vec<Option<&Value>> = match &params {
                None => vec![None],
                Some(ps) => ps.iter().map(Some).collect(),
            };
            for p in param_list {
                let mut act = Activation::default();
                let (object, old) = match a.operation {
                    Operation::Delete => (None, a.old),
                    _ => (obj, a.old),
                };
                act.bind("object", object);
                act.bind("oldObject", old);
                act.bind("request", Some(&request));
                act.bind("params", p);
                act.bind("namespaceObject", ns_obj);
                for f in evaluate(policy, &mut act, fail_closed) {
                    for action in &actions {
                        match *action {
                            "Deny" => {
                                return Err(denied(
                                    a,
                                    obj,
                                    format!("ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: {}", f.message),
                                    f.reason.as_deref(),
                                ));
                            }
                            "Warn" => crate::rest::warn(format!(
                                "Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}': {}",
                                f.message
                            )),
                            _ => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
