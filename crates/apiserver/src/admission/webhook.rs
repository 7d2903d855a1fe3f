//! MutatingAdmissionWebhook and ValidatingAdmissionWebhook: the webhooks of the stored
//! Mutating/ValidatingWebhookConfigurations (admissionregistration.k8s.io/v1), matched and
//! called as kube-apiserver does, with its errors.
//!
//! The configurations are read from the watch cache of their prefix (one store watch keeps
//! it current) and parsed again only when an object under it changed, so a request costs no
//! store read. Like upstream's informer, a configuration takes effect shortly after it is
//! written, not at its revision.
//!
//! A webhook is called over HTTPS with an `admission.k8s.io/v1` (or `v1beta1`)
//! AdmissionReview, through [`crate::webhook_client`] (`clientConfig.url` or a Service
//! reference; `caBundle` the only trusted root).
//!
//! `matchConditions` are evaluated with `object`, `oldObject` and `request` (not
//! `authorizer`). A mutating webhook's result is defaulted again (and a custom resource's
//! pruned), as upstream decodes it.
//!
//! Not implemented: `reinvocationPolicy: IfNeeded` (webhooks run once), audit annotations,
//! the `authorizer` variable of match conditions. `matchPolicy: Equivalent` finds the built-in resources stored under the same prefix
//! (autoscaling v1/v2, core and events.k8s.io Events), not the other versions of a custom
//! resource. The `scale` subresource is sent as its parent object, not as a Scale.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use kumo_apimachinery::selector::LabelSelector;
use kumo_apimachinery::status::{ApiError, Cause, Details, GroupResource};
use serde_json::{json, Value};

use super::{Attributes, Operation, Plugin};
use crate::cache::Cached;
use crate::registry::{Registry, Resource};
use crate::rest::Rest;
use crate::webhook_client::{go_duration, Client, PostError};
use kumo_apimachinery::validation::go_quote;

/// Longest a webhook may take (`timeoutSeconds` is at most 30).
const MAX_TIMEOUT: u64 = 30;
/// The timeout of a webhook without `timeoutSeconds` (the v1 default).
const DEFAULT_TIMEOUT: u64 = 10;

/// One of the two webhook admission plugins.
pub struct Webhooks {
    mutating: bool,
    /// The parsed webhooks, with the cached objects they were parsed from.
    snapshot: Mutex<Parsed>,
}

#[derive(Default)]
struct Parsed {
    from: Vec<Arc<Cached>>,
    hooks: Arc<Vec<Arc<Hook>>>,
}

/// One rule of a webhook (`rules[*]`).
struct Rule {
    operations: Vec<String>,
    groups: Vec<String>,
    versions: Vec<String>,
    resources: Vec<String>,
    scope: String,
}

/// One webhook of a configuration, parsed.
struct Hook {
    mutating: bool,
    name: String,
    rules: Vec<Rule>,
    equivalent: bool,
    namespace_selector: Result<LabelSelector, String>,
    object_selector: Result<LabelSelector, String>,
    /// Where and how it is called; its timeout is `timeoutSeconds`.
    client: Client,
    ignore_failures: bool,
    side_effects: Option<String>,
    review_versions: Vec<String>,
    /// `matchConditions`: (name, CEL expression), all of which must hold for a call.
    match_conditions: Vec<(String, String)>,
}

/// What a webhook is sent the request as (upstream's WebhookInvocation).
struct Invocation {
    /// An equivalent resource the webhook matched (none: the request's own).
    equivalent: Option<Arc<Resource>>,
    /// The group, version and kind of the object sent.
    kind: (String, String, String),
}

impl Invocation {
    fn resource<'s>(&'s self, a: &'s Attributes<'_>) -> &'s Resource {
        self.equivalent.as_deref().unwrap_or(a.resource)
    }
}

/// Why a call did not produce an answer.
enum CallError {
    /// Upstream's ErrCallingWebhook: subject to the failure policy.
    Calling(String),
    /// Refused (a denial, or an error no failure policy lets through).
    Refused(ApiError),
}

impl Webhooks {
    /// MutatingAdmissionWebhook.
    pub fn mutating() -> Webhooks {
        Webhooks {
            mutating: true,
            snapshot: Mutex::default(),
        }
    }

    /// ValidatingAdmissionWebhook.
    pub fn validating() -> Webhooks {
        Webhooks {
            mutating: false,
            snapshot: Mutex::default(),
        }
    }

    fn prefix(&self) -> &'static str {
        if self.mutating {
            "/registry/mutatingwebhookconfigurations/"
        } else {
            "/registry/validatingwebhookconfigurations/"
        }
    }

    /// The webhooks of the stored configurations, in configuration name order.
    async fn hooks(&self, a: &Attributes<'_>) -> Result<Arc<Vec<Arc<Hook>>>, ApiError> {
        let prefix = self.prefix();
        let cache = a.rest.caches.get(prefix);
        if cache.wait_for(1, Duration::from_secs(3)).await.is_none() {
            return Err(ApiError::forbidden(
                &a.resource.group_resource(),
                a.name,
                "not yet ready to handle request",
            ));
        }
        let snap = cache.snapshot(prefix);
        let mut parsed = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        let same = parsed.from.len() == snap.objects.len()
            && parsed
                .from
                .iter()
                .zip(&snap.objects)
                .all(|(a, (_, b))| Arc::ptr_eq(a, b));
        if !same {
            let mut hooks = Vec::new();
            for (_, c) in &snap.objects {
                let obj = c.object();
                for w in obj
                    .get("webhooks")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    hooks.push(Arc::new(Hook::parse(w, self.mutating)));
                }
            }
            parsed.from = snap.objects.iter().map(|(_, c)| c.clone()).collect();
            parsed.hooks = Arc::new(hooks);
        }
        Ok(parsed.hooks.clone())
    }
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn selector(v: Option<&Value>) -> Result<LabelSelector, String> {
    match v {
        None | Some(Value::Null) => Ok(LabelSelector::everything()),
        Some(v) => LabelSelector::from_json(v).map_err(|e| e.to_string()),
    }
}

impl Hook {
    fn parse(w: &Value, mutating: bool) -> Hook {
        let s = |k: &str| w.get(k).and_then(Value::as_str).map(str::to_owned);
        let rules = w
            .get("rules")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|r| Rule {
                operations: strings(r.get("operations")),
                groups: strings(r.get("apiGroups")),
                versions: strings(r.get("apiVersions")),
                resources: strings(r.get("resources")),
                scope: r
                    .get("scope")
                    .and_then(Value::as_str)
                    .unwrap_or("*")
                    .to_owned(),
            })
            .collect();
        let timeout = w
            .get("timeoutSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_TIMEOUT)
            .clamp(1, MAX_TIMEOUT);
        let client = Client::from_config(
            w.get("clientConfig").unwrap_or(&Value::Null),
            Duration::from_secs(timeout),
            format!("timeout={}", go_duration(timeout)),
            "kube-apiserver-admission",
        );
        Hook {
            mutating,
            name: s("name").unwrap_or_default(),
            rules,
            equivalent: s("matchPolicy").as_deref() != Some("Exact"),
            namespace_selector: selector(w.get("namespaceSelector")),
            object_selector: selector(w.get("objectSelector")),
            client,
            ignore_failures: s("failurePolicy").as_deref() == Some("Ignore"),
            side_effects: s("sideEffects"),
            review_versions: strings(w.get("admissionReviewVersions")),
            match_conditions: w
                .get("matchConditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|c| {
                    let text = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                    (text("name"), text("expression"))
                })
                .collect(),
        }
    }
}

/// Whether `items` holds `requested` or `*`.
fn exact_or_wildcard(items: &[String], requested: &str) -> bool {
    items.iter().any(|i| i == "*" || i == requested)
}

fn is_namespaces(res: &Resource) -> bool {
    res.group.is_empty() && res.plural == "namespaces"
}

/// The request's namespace as upstream's request info has it: a namespace's own name on
/// the paths `/api/v1/namespaces/<name>[/...]`.
fn request_namespace<'a>(a: &'a Attributes<'_>) -> &'a str {
    match a.namespace {
        Some(ns) => ns,
        None if is_namespaces(a.resource) && a.operation != Operation::Create => a.name,
        None => "",
    }
}

impl Rule {
    fn matches(&self, a: &Attributes<'_>, res: &Resource) -> bool {
        let ns = request_namespace(a);
        let scope = match self.scope.as_str() {
            "*" | "" => true,
            "Namespaced" => !is_namespaces(res) && !ns.is_empty(),
            "Cluster" => is_namespaces(res) || ns.is_empty(),
            _ => false,
        };
        let operation = self
            .operations
            .iter()
            .any(|o| o == "*" || o == a.operation.as_str());
        let sub = a.subresource.unwrap_or("");
        let resource = self.resources.iter().any(|r| {
            let (r, s) = r.split_once('/').unwrap_or((r, ""));
            (r == "*" || r == res.plural) && (s == "*" || s == sub)
        });
        scope
            && operation
            && exact_or_wildcard(&self.groups, res.group)
            && exact_or_wildcard(&self.versions, res.version)
            && resource
    }
}

/// Built-in resources stored under the same prefix as another (upstream's equivalent
/// resources): autoscaling/v1 and v2 HorizontalPodAutoscalers, core and events.k8s.io
/// Events.
fn equivalents(res: &Resource) -> Vec<Arc<Resource>> {
    static BY_PREFIX: OnceLock<HashMap<String, Vec<Arc<Resource>>>> = OnceLock::new();
    let all = BY_PREFIX.get_or_init(|| {
        let reg = Registry::builtin();
        let mut gvs: Vec<(&str, &str)> = vec![("", "v1")];
        for (g, vs) in reg.groups() {
            gvs.extend(vs.into_iter().map(|v| (g, v)));
        }
        let mut out: HashMap<String, Vec<Arc<Resource>>> = HashMap::new();
        for (g, v) in gvs {
            for r in reg.in_group_version(g, v) {
                out.entry(r.key_prefix(None)).or_default().push(r);
            }
        }
        out.retain(|_, v| v.len() > 1);
        out
    });
    all.get(&res.key_prefix(None))
        .map(|v| {
            v.iter()
                .filter(|r| !(r.group == res.group && r.version == res.version))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The kind of what a request to `res` (with `sub`) carries.
fn request_kind(res: &Resource, sub: Option<&str>) -> (String, String, String) {
    match sub {
        Some("binding") => ("".into(), "v1".into(), "Binding".into()),
        Some("eviction") => ("policy".into(), "v1".into(), "Eviction".into()),
        Some("attach") => ("".into(), "v1".into(), "PodAttachOptions".into()),
        Some("exec") => ("".into(), "v1".into(), "PodExecOptions".into()),
        Some("portforward") => ("".into(), "v1".into(), "PodPortForwardOptions".into()),
        _ => (res.group.into(), res.version.into(), res.kind.into()),
    }
}

/// Whether a subresource's object is a type of its own, not the resource's (so never
/// converted between the resource's versions).
fn own_type(sub: Option<&str>) -> bool {
    matches!(sub, Some("binding" | "attach" | "exec" | "portforward"))
}

/// The object `obj` of `from` as `to` serves it.
fn convert(from: &Resource, to: &Resource, obj: &Value) -> Result<Value, ApiError> {
    if std::ptr::eq(from, to) {
        return Ok(obj.clone());
    }
    to.strategy
        .served_form(from.strategy.stored_form(obj.clone())?)
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

/// The labels of namespace `ns`, from the watch cache, else from the store.
async fn namespace_labels(rest: &Rest, ns: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let key = format!("/registry/namespaces/{ns}");
    let cache = rest.caches.get("/registry/namespaces/");
    if let Some((_, c)) = cache
        .snapshot(&key)
        .objects
        .into_iter()
        .find(|(k, _)| *k == key)
    {
        return Ok(c.labels.clone());
    }
    let (kv, _) = rest
        .store
        .get(key.as_bytes(), None)
        .await
        .map_err(ApiError::internal)?;
    let kv = kv.ok_or_else(|| ApiError::not_found(&GroupResource::new("", "namespaces"), ns))?;
    let obj: Value = serde_json::from_slice(&kv.value).map_err(ApiError::internal)?;
    Ok(labels_of(Some(&obj)).unwrap_or_default())
}

impl Hook {
    /// Whether the webhook is called for this request, and as what (upstream's
    /// ShouldCallHook). A selector that cannot be evaluated refuses the request, but only
    /// when a rule matches.
    async fn should_call(
        &self,
        a: &Attributes<'_>,
        obj: Option<&Value>,
    ) -> Result<Option<Invocation>, ApiError> {
        let ns = request_namespace(a);
        let mut pending: Option<ApiError> = None;
        if ns.is_empty() && !is_namespaces(a.resource) {
            // Cluster-scoped: no namespace to select.
        } else {
            match &self.namespace_selector {
                Err(e) => pending = Some(ApiError::internal(e)),
                Ok(sel) if sel.is_empty() => {}
                Ok(sel) => {
                    let labels = if is_namespaces(a.resource)
                        && a.subresource.is_none()
                        && matches!(a.operation, Operation::Create | Operation::Update)
                    {
                        Ok(labels_of(obj).unwrap_or_default())
                    } else {
                        namespace_labels(a.rest, ns).await
                    };
                    match labels {
                        Ok(l) if !sel.matches(&l) => return Ok(None),
                        Ok(_) => {}
                        Err(e) => pending = Some(e),
                    }
                }
            }
        }
        match &self.object_selector {
            Err(e) => pending = pending.or_else(|| Some(ApiError::internal(e))),
            Ok(sel) if sel.is_empty() => {}
            Ok(sel) => {
                let m = |o: Option<&Value>| labels_of(o).is_some_and(|l| sel.matches(&l));
                if !m(obj) && !m(a.old) {
                    return Ok(None);
                }
            }
        }
        let mut invocation = None;
        if self.rules.iter().any(|r| r.matches(a, a.resource)) {
            invocation = Some(Invocation {
                equivalent: None,
                kind: request_kind(a.resource, a.subresource),
            });
        } else if self.equivalent {
            'rules: for r in &self.rules {
                for e in equivalents(a.resource) {
                    if r.matches(a, &e) {
                        let kind = match a.subresource {
                            None | Some("status") => {
                                (e.group.into(), e.version.into(), e.kind.into())
                            }
                            sub => request_kind(&e, sub),
                        };
                        invocation = Some(Invocation {
                            equivalent: Some(e),
                            kind,
                        });
                        break 'rules;
                    }
                }
            }
        }
        if invocation.is_none() {
            return Ok(None);
        }
        if let Some(e) = pending {
            return Err(e);
        }
        Ok(invocation)
    }
}

/// The answer of a webhook, verified (upstream's AdmissionResponse).
struct Answer {
    allowed: bool,
    /// The patch and its type (mutating webhooks only).
    patch: Option<(Vec<u8>, String)>,
    result: Option<Value>,
    warnings: Vec<String>,
}

impl Hook {
    /// Builds the AdmissionReview, posts it and verifies the answer.
    async fn call(
        &self,
        a: &Attributes<'_>,
        inv: &Invocation,
        obj: Option<&Value>,
    ) -> Result<Answer, CallError> {
        let calling = |why: String| {
            CallError::Calling(format!("failed calling webhook \"{}\": {why}", self.name))
        };
        if a.dry_run {
            match self.side_effects.as_deref() {
                None => return Err(calling("Webhook SideEffects is nil".into())),
                Some("None") | Some("NoneOnDryRun") => {}
                Some(_) => {
                    return Err(CallError::Refused(ApiError::bad_request(format!(
                        "admission webhook \"{}\" does not support dry run",
                        self.name
                    ))))
                }
            }
        }
        let version = self
            .review_versions
            .iter()
            .find(|v| *v == "v1" || *v == "v1beta1")
            .cloned()
            .ok_or_else(|| {
                calling("could not create admission objects: webhook does not accept known AdmissionReview versions (v1, v1beta1)".into())
            })?;
        let uid = uuid::Uuid::new_v4().to_string();
        let review = review(a, inv, obj, &uid, &version).map_err(CallError::Refused)?;
        let body = serde_json::to_vec(&review).map_err(|e| calling(e.to_string()))?;
        let bytes = self
            .client
            .post(&*a.rest.store, a.rest.pod_network.as_ref(), body)
            .await
            .map_err(|e| match e {
                PostError::Setup(why) => calling(why),
                e => calling(format!("failed to call webhook: {e}")),
            })?;
        let invalid = |why: String| calling(format!("received invalid webhook response: {why}"));
        let resp: Value = serde_json::from_slice(&bytes).map_err(|e| {
            calling(format!(
                "failed to call webhook: couldn't get version/kind; json parse error: {e}"
            ))
        })?;
        let got_version = resp.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let got_kind = resp.get("kind").and_then(Value::as_str).unwrap_or("");
        if got_kind.is_empty() {
            return Err(calling(format!(
                "failed to call webhook: Object 'Kind' is missing in '{}'",
                String::from_utf8_lossy(&bytes)
            )));
        }
        let r = resp
            .get("response")
            .filter(|r| r.is_object())
            .ok_or_else(|| invalid("webhook response was absent".into()))?;
        let patch = r
            .get("patch")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty());
        let patch_type = r.get("patchType").and_then(Value::as_str);
        let mut patch_out = None;
        if version == "v1" {
            let got_uid = r.get("uid").and_then(Value::as_str).unwrap_or("");
            if got_uid != uid {
                return Err(invalid(format!(
                    "expected response.uid={}, got {}",
                    go_quote(&uid),
                    go_quote(got_uid)
                )));
            }
            if got_version != "admission.k8s.io/v1" || got_kind != "AdmissionReview" {
                let (g, v) = got_version.split_once('/').unwrap_or(("", got_version));
                return Err(invalid(format!(
                    "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {g}/{v}, Kind={got_kind}"
                )));
            }
            if self.mutating {
                match (patch, patch_type) {
                    (Some(_), None) => {
                        return Err(invalid(
                            "webhook returned response.patch but not response.patchType".into(),
                        ))
                    }
                    (None, Some(_)) => {
                        return Err(invalid(
                            "webhook returned response.patchType but not response.patch".into(),
                        ))
                    }
                    (Some(_), Some("")) => {
                        return Err(invalid(
                            "webhook returned invalid response.patchType of \"\"".into(),
                        ))
                    }
                    (Some(p), Some(t)) => patch_out = Some((p, t.to_owned())),
                    (None, None) => {}
                }
            } else if patch.is_some() {
                return Err(invalid(
                    "validating webhook may not return response.patch".into(),
                ));
            } else if patch_type.is_some() {
                return Err(invalid(
                    "validating webhook may not return response.patchType".into(),
                ));
            }
        } else if self.mutating {
            patch_out = patch.map(|p| (p, "JSONPatch".to_owned()));
        }
        let patch = match patch_out {
            None => None,
            Some((p, t)) => Some((
                base64::engine::general_purpose::STANDARD
                    .decode(p)
                    .map_err(|e| {
                        calling(format!("failed to call webhook: illegal base64 data: {e}"))
                    })?,
                t,
            )),
        };
        Ok(Answer {
            allowed: r.get("allowed").and_then(Value::as_bool).unwrap_or(false),
            patch,
            result: r.get("status").filter(|s| s.is_object()).cloned(),
            warnings: strings(r.get("warnings")),
        })
    }
}

/// The AdmissionReview of a request.
fn review(
    a: &Attributes<'_>,
    inv: &Invocation,
    obj: Option<&Value>,
    uid: &str,
    version: &str,
) -> Result<Value, ApiError> {
    let (rg, rv, rk) = request_kind(a.resource, a.subresource);
    let sub = a.subresource.unwrap_or("");
    let res = inv.resource(a);
    let mut req = json!({
        "uid": uid,
        "kind": {"group": inv.kind.0, "version": inv.kind.1, "kind": inv.kind.2},
        "resource": {"group": res.group, "version": res.version, "resource": res.plural},
    });
    if !sub.is_empty() {
        req["subResource"] = json!(sub);
    }
    req["requestKind"] = json!({"group": rg, "version": rv, "kind": rk});
    req["requestResource"] = json!({"group": a.resource.group, "version": a.resource.version, "resource": a.resource.plural});
    if !sub.is_empty() {
        req["requestSubResource"] = json!(sub);
    }
    if !a.name.is_empty() {
        req["name"] = json!(a.name);
    }
    let ns = request_namespace(a);
    if !ns.is_empty() {
        req["namespace"] = json!(ns);
    }
    req["operation"] = json!(a.operation.as_str());
    req["userInfo"] = a.user.to_json();
    let conv = |o: Option<&Value>| match o {
        Some(o) if !own_type(a.subresource) => convert(a.resource, res, o),
        Some(o) => Ok(o.clone()),
        None => Ok(Value::Null),
    };
    req["object"] = conv(obj)?;
    req["oldObject"] = conv(a.old)?;
    req["dryRun"] = json!(a.dry_run);
    req["options"] = a.options.clone();
    Ok(json!({
        "kind": "AdmissionReview",
        "apiVersion": format!("admission.k8s.io/{version}"),
        "request": req,
    }))
}

/// A webhook's Status reason as the `'static` string [`ApiError`] holds. Upstream passes
/// any reason through; the distinct reasons are few (they are written into the webhooks by
/// cluster administrators), so each is kept once for the life of the process, up to a
/// bound beyond which new ones are dropped.
fn intern_reason(reason: &str) -> &'static str {
    static SEEN: OnceLock<Mutex<std::collections::HashSet<&'static str>>> = OnceLock::new();
    const MOST: usize = 1024;
    if reason.is_empty() {
        return "";
    }
    let mut seen = SEEN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(r) = seen.get(reason) {
        return r;
    }
    if seen.len() >= MOST || reason.len() > 256 {
        return "";
    }
    let r: &'static str = Box::leak(reason.to_owned().into_boxed_str());
    seen.insert(r);
    r
}

/// The error of a denial (upstream's `ToStatusErr`): the webhook's Status with at least code
/// 400 and the message `admission webhook "<name>" denied the request: <message>`.
fn denied(name: &str, result: Option<&Value>) -> ApiError {
    let empty = json!({});
    let r = result.unwrap_or(&empty);
    let code = r
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    let reason_text = r.get("reason").and_then(Value::as_str).unwrap_or("");
    let message = r.get("message").and_then(Value::as_str).unwrap_or("");
    let denied_by = format!("admission webhook \"{name}\" denied the request");
    let message = if !message.is_empty() {
        format!("{denied_by}: {message}")
    } else if !reason_text.is_empty() {
        format!("{denied_by}: {reason_text}")
    } else {
        format!("{denied_by} without explanation")
    };
    let reason = intern_reason(reason_text);
    let details = r.get("details").filter(|d| d.is_object()).map(|d| {
        let s = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        Box::new(Details {
            name: s("name"),
            group: s("group"),
            kind: s("kind"),
            causes: d
                .get("causes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|c| {
                    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                    Cause {
                        reason: s("reason"),
                        message: s("message"),
                        field: s("field"),
                    }
                })
                .collect(),
            retry_after_seconds: d
                .get("retryAfterSeconds")
                .and_then(Value::as_u64)
                .and_then(|s| u32::try_from(s).ok()),
            list_continue: None,
        })
    });
    ApiError {
        code,
        reason,
        message,
        details,
    }
}

/// Whether requests on `res` never go to webhooks: the admission configuration itself, so
/// that a broken webhook can always be removed.
fn exempt(res: &Resource) -> bool {
    res.group == "admissionregistration.k8s.io"
        && matches!(
            res.kind,
            "ValidatingWebhookConfiguration"
                | "MutatingWebhookConfiguration"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
                | "MutatingAdmissionPolicy"
                | "MutatingAdmissionPolicyBinding"
        )
}

impl Hook {
    /// Whether the webhook's `matchConditions` all hold for the request, evaluated with
    /// `object`, `oldObject` and `request` as the webhook would be sent them. One that is
    /// false skips the call; one that fails to evaluate (with none false) is a calling
    /// error, which the failure policy decides, as upstream's matcher.
    fn conditions_hold(
        &self,
        a: &Attributes<'_>,
        inv: &Invocation,
        obj: Option<&Value>,
    ) -> Result<bool, CallError> {
        if self.match_conditions.is_empty() {
            return Ok(true);
        }
        let request = review(a, inv, obj, "", "v1").map_err(CallError::Refused)?["request"].take();
        let present = |k: &str| request.get(k).filter(|v| !v.is_null());
        let mut act = crate::cel::Activation::default();
        act.bind("object", present("object"));
        act.bind("oldObject", present("oldObject"));
        act.bind("request", Some(&request));
        let mut errors = Vec::new();
        for (name, expression) in &self.match_conditions {
            match act.eval(expression) {
                Ok(crate::cel::Outcome::Bool(true)) => {}
                Ok(crate::cel::Outcome::Bool(false)) => return Ok(false),
                Ok(_) => errors.push(format!("matchCondition '{name}' must evaluate to bool")),
                Err(e) => errors.push(format!("matchCondition '{name}': {e}")),
            }
        }
        if errors.is_empty() {
            return Ok(true);
        }
        Err(CallError::Calling(format!(
            "failed calling webhook \"{}\": an error occurred while evaluating matchConditions: {}",
            self.name,
            errors.join(", ")
        )))
    }

    /// Calls a mutating webhook and applies its patch to `obj`.
    async fn mutate(
        &self,
        a: &Attributes<'_>,
        inv: &Invocation,
        obj: Option<&mut Value>,
    ) -> Result<(), CallError> {
        let ans = self.call(a, inv, obj.as_deref()).await?;
        for w in &ans.warnings {
            crate::rest::warn(w.clone());
        }
        if !ans.allowed {
            return Err(CallError::Refused(denied(&self.name, ans.result.as_ref())));
        }
        let Some((patch, patch_type)) = ans.patch else {
            return Ok(());
        };
        let calling = |why: String| {
            CallError::Calling(format!("failed calling webhook \"{}\": {why}", self.name))
        };
        if patch_type != "JSONPatch" {
            return Err(calling(format!(
                "unsupported patch type {}",
                go_quote(&patch_type)
            )));
        }
        let ops: json_patch::Patch = serde_json::from_slice(&patch).map_err(|e| {
            calling(format!(
                "received undecodable patch in webhook response: {e}"
            ))
        })?;
        if ops.0.is_empty() {
            return Ok(());
        }
        let Some(obj) = obj else {
            return Err(CallError::Refused(ApiError::internal(format!(
                "admission webhook \"{}\" attempted to modify the object, which is not supported for this operation",
                self.name
            ))));
        };
        let binding = own_type(a.subresource);
        let res = inv.resource(a);
        let mut versioned = if binding {
            obj.clone()
        } else {
            convert(a.resource, res, obj).map_err(CallError::Refused)?
        };
        json_patch::patch(&mut versioned, &ops.0)
            .map_err(|e| CallError::Refused(ApiError::internal(e)))?;
        // The patched object must still decode as its type.
        if !binding {
            if let Some(why) = crate::openapi::type_error(res, &versioned) {
                return Err(CallError::Refused(ApiError::internal(why)));
            }
        }
        let mut back = if binding {
            versioned
        } else {
            convert(res, a.resource, &versioned).map_err(CallError::Refused)?
        };
        // The kind and apiVersion are the decoder's, not the patch's.
        if let (Some(b), Some(o)) = (back.as_object_mut(), obj.as_object()) {
            for k in ["kind", "apiVersion"] {
                match o.get(k) {
                    Some(v) => b.insert(k.into(), v.clone()),
                    None => b.remove(k),
                };
            }
        }
        // Decoded again: defaults for what the patch added, pruning of what a custom
        // resource's schema does not know.
        if !binding {
            a.resource.strategy.default(&mut back);
        }
        *obj = back;
        Ok(())
    }
}

#[async_trait]
impl Plugin for Webhooks {
    fn name(&self) -> &'static str {
        if self.mutating {
            "MutatingAdmissionWebhook"
        } else {
            "ValidatingAdmissionWebhook"
        }
    }

    async fn admit(&self, a: &Attributes<'_>, mut obj: Option<&mut Value>) -> Result<(), ApiError> {
        if !self.mutating || exempt(a.resource) {
            return Ok(());
        }
        let hooks = self.hooks(a).await?;
        for h in hooks.iter() {
            let Some(inv) = h.should_call(a, obj.as_deref()).await? else {
                continue;
            };
            let result = match h.conditions_hold(a, &inv, obj.as_deref()) {
                Ok(false) => continue,
                Ok(true) => h.mutate(a, &inv, obj.as_deref_mut()).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => {}
                Err(CallError::Calling(why)) if h.ignore_failures => {
                    tracing::warn!(webhook = %h.name, "failed calling webhook, failing open: {why}");
                }
                Err(CallError::Calling(why)) => {
                    tracing::warn!(webhook = %h.name, "failed calling webhook, failing closed: {why}");
                    return Err(ApiError::internal(why));
                }
                Err(CallError::Refused(e)) => return Err(e),
            }
        }
        Ok(())
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        if self.mutating || exempt(a.resource) {
            return Ok(());
        }
        let hooks = self.hooks(a).await?;
        let mut relevant = Vec::new();
        for h in hooks.iter() {
            if let Some(inv) = h.should_call(a, obj).await? {
                relevant.push((h, inv));
            }
        }
        if relevant.is_empty() {
            return Ok(());
        }
        // In parallel, as upstream; the first refusal in webhook order wins.
        let results = futures::future::join_all(relevant.iter().map(|(h, inv)| async move {
            if !h.conditions_hold(a, inv, obj)? {
                return Ok(());
            }
            let ans = match h.call(a, inv, obj).await {
                Ok(ans) => ans,
                Err(e) => return Err(e),
            };
            for w in &ans.warnings {
                crate::rest::warn(w.clone());
            }
            if ans.allowed {
                Ok(())
            } else {
                Err(CallError::Refused(denied(&h.name, ans.result.as_ref())))
            }
        }))
        .await;
        for ((h, _), r) in relevant.iter().zip(results) {
            match r {
                Ok(()) => {}
                Err(CallError::Calling(why)) if h.ignore_failures => {
                    tracing::warn!(webhook = %h.name, "failed calling webhook, failing open: {why}");
                }
                Err(CallError::Calling(why)) => {
                    tracing::warn!(webhook = %h.name, "failed calling webhook, failing closed: {why}");
                    return Err(ApiError::internal(why));
                }
                Err(CallError::Refused(e)) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denial_keeps_code_and_reason() {
        let e = denied(
            "deny.example.com",
            Some(&json!({"code": 403, "reason": "Forbidden", "message": "no"})),
        );
        assert_eq!((e.code, e.reason), (403, "Forbidden"));
        assert_eq!(
            e.message,
            "admission webhook \"deny.example.com\" denied the request: no"
        );
        let e = denied("d", Some(&json!({"code": 200})));
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "admission webhook \"d\" denied the request without explanation"
        );
        let e = denied("d", Some(&json!({"reason": "Custom"})));
        assert_eq!((e.code, e.reason), (400, "Custom"));
        assert_eq!(
            e.message,
            "admission webhook \"d\" denied the request: Custom"
        );
    }

    /// A Rest over an embedded store in a temporary directory.
    async fn rest() -> (Rest, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = kumo_storage::embedded::EmbeddedStore::open(
            kumo_storage::embedded::EmbeddedConfig::new(dir.path()),
        )
        .await
        .expect("store");
        (Rest::new(store), dir)
    }

    #[tokio::test]
    async fn dry_run_is_refused_to_webhooks_with_side_effects() {
        let (rest, _dir) = rest().await;
        let reg = Registry::builtin();
        let res = reg.find("", "v1", "configmaps").expect("configmaps");
        let user = crate::auth::UserInfo::authenticated("u", vec![]);
        let hook = |effects: &str| {
            Hook::parse(
                &json!({"name": "unknown.kumo.test", "sideEffects": effects,
                    "admissionReviewVersions": ["v1"],
                    "clientConfig": {"url": "https://127.0.0.1:1/"}}),
                false,
            )
        };
        let attrs = |dry_run| Attributes {
            operation: Operation::Create,
            resource: &res,
            subresource: None,
            namespace: Some("default"),
            name: "x",
            old: None,
            user: &user,
            dry_run,
            options: json!({}),
            rest: &rest,
        };
        let inv = Invocation {
            equivalent: None,
            kind: request_kind(&res, None),
        };
        let obj = json!({"metadata": {"name": "x"}});
        for effects in ["Unknown", "Some"] {
            match hook(effects).call(&attrs(true), &inv, Some(&obj)).await {
                Err(CallError::Refused(e)) => {
                    assert_eq!((e.code, e.reason), (400, "BadRequest"));
                    assert_eq!(
                        e.message,
                        "admission webhook \"unknown.kumo.test\" does not support dry run"
                    );
                }
                _ => panic!("dry run was not refused"),
            }
        }
        // Without dry run (and with sideEffects None on dry run) the webhook is called:
        // here it cannot be reached, a failure the failure policy decides on.
        for (effects, dry_run) in [("Unknown", false), ("None", true)] {
            match hook(effects).call(&attrs(dry_run), &inv, Some(&obj)).await {
                Err(CallError::Calling(why)) => {
                    assert!(why.contains("connection refused"), "{why}")
                }
                _ => panic!("the webhook was not called"),
            }
        }
    }

    #[test]
    fn rules_match_as_upstream() {
        let reg = Registry::builtin();
        let pods = reg.find("", "v1", "pods").expect("pods");
        let ns = reg.find("", "v1", "namespaces").expect("namespaces");
        let user = crate::auth::UserInfo::default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (rest, _dir) = rt.block_on(rest());
        let rule = |resources: &[&str], scope: &str| Rule {
            operations: vec!["*".into()],
            groups: vec!["".into()],
            versions: vec!["*".into()],
            resources: resources.iter().map(|r| r.to_string()).collect(),
            scope: scope.into(),
        };
        let check = |r: &Rule, res: &Resource, sub: Option<&str>, namespace: Option<&str>| {
            let a = Attributes {
                operation: Operation::Update,
                resource: res,
                subresource: sub,
                namespace,
                name: "n",
                old: None,
                user: &user,
                dry_run: false,
                options: json!({}),
                rest: &rest,
            };
            r.matches(&a, res)
        };
        assert!(check(&rule(&["pods"], "*"), &pods, None, Some("d")));
        assert!(!check(
            &rule(&["pods"], "*"),
            &pods,
            Some("status"),
            Some("d")
        ));
        assert!(check(
            &rule(&["pods/status"], "*"),
            &pods,
            Some("status"),
            Some("d")
        ));
        assert!(check(
            &rule(&["pods/*"], "*"),
            &pods,
            Some("binding"),
            Some("d")
        ));
        // Upstream's `*` subresource also matches the resource itself.
        assert!(check(&rule(&["pods/*"], "*"), &pods, None, Some("d")));
        assert!(check(&rule(&["*"], "*"), &pods, None, Some("d")));
        assert!(!check(&rule(&["*"], "*"), &pods, Some("status"), Some("d")));
        assert!(check(
            &rule(&["*/*"], "*"),
            &pods,
            Some("status"),
            Some("d")
        ));
        assert!(check(
            &rule(&["*/status"], "*"),
            &pods,
            Some("status"),
            Some("d")
        ));
        assert!(check(
            &rule(&["pods"], "Namespaced"),
            &pods,
            None,
            Some("d")
        ));
        assert!(!check(&rule(&["pods"], "Cluster"), &pods, None, Some("d")));
        // A namespace is cluster-scoped, even though its requests name it as namespace.
        assert!(check(&rule(&["namespaces"], "Cluster"), &ns, None, None));
        assert!(!check(
            &rule(&["namespaces"], "Namespaced"),
            &ns,
            None,
            None
        ));
    }

    #[test]
    fn patched_objects_must_keep_their_types() {
        let reg = Registry::builtin();
        let res = reg.find("", "v1", "configmaps").expect("configmaps");
        let obj =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": 5});
        assert_eq!(
            crate::openapi::type_error(&res, &obj).as_deref(),
            Some("json: cannot unmarshal number into Go struct field ConfigMap.data of type map[string]string")
        );
    }
}
