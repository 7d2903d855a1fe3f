//! MutatingAdmissionPolicy (admissionregistration.k8s.io/v1): CEL mutations of the stored
//! policies, applied through their bindings to the writes their match constraints select,
//! in the mutating phase before the mutating webhooks, as upstream's plugin does.
//!
//! A mutation is an `ApplyConfiguration` (an expression making `Object{...}`, merged into
//! the object as server-side apply merges) or a `JSONPatch` (an expression making a list
//! of `JSONPatch{op, path, value}`). Expressions see what ValidatingAdmissionPolicy's do
//! (`object`, `oldObject`, `request`, `params`, `namespaceObject`, `variables`); each
//! mutation sees the object as the previous one left it. The result is defaulted again,
//! as a decoded object would be.
//!
//! Not implemented: `reinvocationPolicy: IfNeeded` (policies run once), and the static
//! type check of expressions against the object's schema.

use std::collections::BTreeMap;

use async_trait::async_trait;
use kumo_apimachinery::status::{ApiError, Cause};
use serde_json::Value;

use super::vap::{all, forbidden, is_namespaces, matches, namespace, params, preamble, request};
use super::{Attributes, Operation, Plugin};
use crate::cel::Activation;

const POLICIES: &str = "/registry/mutatingadmissionpolicies/";
const BINDINGS: &str = "/registry/mutatingadmissionpolicybindings/";

/// The MutatingAdmissionPolicy admission plugin.
#[derive(Default)]
pub struct MutatingAdmissionPolicy;

/// Policies and bindings are admissionregistration's own objects: never subject to them.
fn exempt(a: &Attributes<'_>) -> bool {
    a.resource.group == "admissionregistration.k8s.io"
}

/// Applies `policy`'s mutations to `obj` with the activation's inputs; `Ok(false)` when its
/// match conditions do not hold.
fn mutate(
    a: &Attributes<'_>,
    policy: &Value,
    act: &mut Activation,
    obj: &mut Value,
) -> Result<bool, String> {
    let spec = policy.get("spec").unwrap_or(&Value::Null);
    act.bind("object", Some(obj));
    match preamble(spec, act) {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(name) => return Err(format!("failed to evaluate match condition '{name}'")),
    }
    let mut first = true;
    for m in spec
        .get("mutations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        // Each mutation sees the object as the previous one left it.
        if !first {
            act.bind("object", Some(obj));
        }
        first = false;
        match m.get("patchType").and_then(Value::as_str).unwrap_or("") {
            "ApplyConfiguration" => {
                let expr = m
                    .pointer("/applyConfiguration/expression")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let config = act
                    .eval_json(expr)
                    .map_err(|e| format!("expression '{expr}' resulted in error: {e}"))?;
                if !config.is_object() {
                    return Err(format!(
                        "apply configuration must evaluate to an Object, got {}",
                        json_type(&config)
                    ));
                }
                *obj = crate::fieldmanager::merge_applied(a.resource, obj, &config);
            }
            "JSONPatch" => {
                let expr = m
                    .pointer("/jsonPatch/expression")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let ops = act
                    .eval_json(expr)
                    .map_err(|e| format!("expression '{expr}' resulted in error: {e}"))?;
                let patch: json_patch::Patch = serde_json::from_value(ops).map_err(|e| {
                    format!("JSONPatch expression did not make patch operations: {e}")
                })?;
                json_patch::patch(obj, &patch).map_err(|e| e.to_string())?;
            }
            other => return Err(format!("unsupported patch type \"{other}\"")),
        }
    }
    Ok(true)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null_type",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "double",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "map",
    }
}

#[async_trait]
impl Plugin for MutatingAdmissionPolicy {
    fn name(&self) -> &'static str {
        "MutatingAdmissionPolicy"
    }

    async fn admit(&self, a: &Attributes<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        let Some(obj) = obj else { return Ok(()) };
        if exempt(a) || matches!(a.operation, Operation::Connect | Operation::Delete) {
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
        let mut mutated = false;
        let mut failures: Vec<(String, Option<&'static str>)> = Vec::new();
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
            let binding_name = binding
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            // A failure of a policy that fails closed is kept (upstream's PolicyError) and
            // the others still run; one that is ignored is dropped.
            let mut refuse = |why: String, reason: Option<&'static str>| {
                if fail_closed {
                    failures.push((
                        format!("policy '{policy_name}' with binding '{binding_name}' denied request: {why}"),
                        reason,
                    ));
                }
            };
            let constraints = policy
                .pointer("/spec/matchConstraints")
                .unwrap_or(&Value::Null);
            match matches(constraints, a, Some(obj), true).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    refuse(e, None);
                    continue;
                }
            }
            if let Some(m) = binding
                .pointer("/spec/matchResources")
                .filter(|m| m.is_object())
            {
                match matches(m, a, Some(obj), false).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        refuse(e, None);
                        continue;
                    }
                }
            }
            let params = match params(a, policy, binding).await {
                Ok(p) => p,
                Err(e) => {
                    refuse(e, None);
                    continue;
                }
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
            let req = request(a);
            let param_list: Vec<Option<&Value>> = match &params {
                None => vec![None],
                Some(ps) => ps.iter().map(Some).collect(),
            };
            for p in param_list {
                let mut act = Activation::default();
                act.bind("oldObject", a.old);
                act.bind("request", Some(&req));
                act.bind("params", p);
                act.bind("namespaceObject", ns_obj);
                // On failure the object is left as it was before this policy.
                let mut candidate = obj.clone();
                match mutate(a, policy, &mut act, &mut candidate) {
                    Ok(true) => {
                        mutated |= candidate != *obj;
                        *obj = candidate;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        if !fail_closed {
                            tracing::warn!(
                                policy = policy_name,
                                binding = binding_name,
                                "mutation failed, ignored: {e}"
                            );
                        }
                        refuse(e, Some("Invalid"));
                    }
                }
            }
        }
        if mutated {
            // Decoded again: defaults for what the mutations added.
            a.resource.strategy.default(obj);
        }
        match failures.first() {
            None => Ok(()),
            Some((message, reason)) => Err(refused(a, obj, message, *reason, &failures)),
        }
    }
}

/// Upstream's refusal of a request whose policies failed: a Forbidden (403) whose message is
/// the first failure's, with its reason (Invalid for a mutation that failed; the code stays
/// 403) and every failure as a cause.
fn refused(
    a: &Attributes<'_>,
    obj: &Value,
    message: &str,
    reason: Option<&'static str>,
    failures: &[(String, Option<&'static str>)],
) -> ApiError {
    let mut err = forbidden(a, Some(obj), "admission request denied by policy");
    err.message = message.to_owned();
    if let Some(r) = reason {
        err.reason = r;
    }
    if let Some(d) = err.details.as_mut() {
        d.causes.extend(failures.iter().map(|(m, _)| Cause {
            reason: String::new(),
            message: m.clone(),
            field: String::new(),
        }));
    }
    err
}
