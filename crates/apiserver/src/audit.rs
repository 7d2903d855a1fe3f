//! The audit log (`--audit-policy-file`, `--audit-log-path`): one audit.k8s.io/v1 Event
//! per stage of a request, as JSON lines, at the level the policy's first matching rule
//! gives it, as kube-apiserver's audit filters write them.
//!
//! Every response carries an `Audit-Id` header (the request's own `Audit-ID` when it sent
//! one, else a new UUID), with or without a policy. Without a policy nothing else happens.
//! With one, [`handle`] keeps the request's audit context in a task-local that the handler
//! fills in at three points: the authenticated user ([`authenticated`], which decides the
//! level and writes the RequestReceived event), the authorization decision
//! ([`authorized`]) and the request body ([`request_body`]). The response then completes the
//! event: ResponseComplete (after ResponseStarted for a watch), or, for a request that
//! failed authentication, the single ResponseStarted event upstream writes with an empty
//! user.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use http::{header, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::auth::{Attributes, Decision, RequestInfo, UserInfo};
use crate::handler::{Body, State};

/// Audit configuration errors (they stop the server at start, as upstream's do).
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to decode audit policy file {path}: {why}")]
    Policy { path: PathBuf, why: String },
}

/// How much of a request is recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Level {
    None,
    Metadata,
    Request,
    RequestResponse,
}

/// The stages of a request that produce an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stage {
    RequestReceived,
    ResponseStarted,
    ResponseComplete,
    Panic,
}

/// An audit.k8s.io/v1 Policy.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub omit_stages: Vec<Stage>,
    #[serde(default)]
    pub omit_managed_fields: bool,
}

/// One rule of a policy; empty lists match everything.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub level: Level,
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub user_groups: Vec<String>,
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default)]
    pub resources: Vec<GroupResources>,
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    pub non_resource_urls: Vec<String>,
    #[serde(default)]
    pub omit_stages: Vec<Stage>,
    #[serde(default)]
    pub omit_managed_fields: Option<bool>,
}

/// Resources of one API group a rule names.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupResources {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub resource_names: Vec<String>,
}

/// What the policy says about one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eval {
    pub level: Level,
    pub omit_stages: Vec<Stage>,
    pub omit_managed_fields: bool,
}

impl Policy {
    /// Reads and checks a policy file.
    pub fn load(path: &Path) -> Result<Policy, AuditError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuditError::Io {
            path: path.to_owned(),
            source,
        })?;
        let bad = |why: String| AuditError::Policy {
            path: path.to_owned(),
            why,
        };
        let policy: Policy = serde_yaml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if policy.api_version != "audit.k8s.io/v1" || policy.kind != "Policy" {
            return Err(bad(format!(
                "no kind \"{}\" is registered for version \"{}\"",
                policy.kind, policy.api_version
            )));
        }
        if policy.rules.is_empty() {
            return Err(bad("loaded illegal policy with 0 rules".into()));
        }
        for (i, r) in policy.rules.iter().enumerate() {
            if !r.non_resource_urls.is_empty()
                && (!r.resources.is_empty() || !r.namespaces.is_empty())
            {
                return Err(bad(format!(
                    "rules[{i}].nonResourceURLs: rules cannot apply to both regular resources and non-resource URLs"
                )));
            }
            for u in &r.non_resource_urls {
                let star_inside = u.trim_end_matches('*').contains('*');
                if u != "*" && (!u.starts_with('/') || star_inside) {
                    return Err(bad(format!(
                        "rules[{i}].nonResourceURLs: Invalid value: \"{u}\""
                    )));
                }
            }
        }
        Ok(policy)
    }

    /// The first matching rule's level and omitted stages (the policy's added), or None.
    pub fn evaluate(&self, user: Option<&UserInfo>, info: &RequestInfo) -> Eval {
        let mut stages = self.omit_stages.clone();
        for r in &self.rules {
            if rule_matches(r, user, info) {
                for s in &r.omit_stages {
                    if !stages.contains(s) {
                        stages.push(*s);
                    }
                }
                return Eval {
                    level: r.level,
                    omit_stages: stages,
                    omit_managed_fields: r.omit_managed_fields.unwrap_or(self.omit_managed_fields),
                };
            }
        }
        Eval {
            level: Level::None,
            omit_stages: stages,
            omit_managed_fields: self.omit_managed_fields,
        }
    }
}

fn rule_matches(r: &Rule, user: Option<&UserInfo>, info: &RequestInfo) -> bool {
    if !r.users.is_empty() && !user.is_some_and(|u| r.users.contains(&u.name)) {
        return false;
    }
    if !r.user_groups.is_empty()
        && !user.is_some_and(|u| u.groups.iter().any(|g| r.user_groups.contains(g)))
    {
        return false;
    }
    if !r.verbs.is_empty() && !r.verbs.contains(&info.verb) {
        return false;
    }
    if !r.namespaces.is_empty() || !r.resources.is_empty() {
        return resource_matches(r, info);
    }
    if !r.non_resource_urls.is_empty() {
        return !info.resource_request
            && r.non_resource_urls
                .iter()
                .any(|s| path_matches(&info.path, s));
    }
    true
}

fn path_matches(path: &str, spec: &str) -> bool {
    spec == "*"
        || spec == path
        || (spec.ends_with('*') && path.starts_with(spec.trim_end_matches('*')))
}

fn resource_matches(r: &Rule, info: &RequestInfo) -> bool {
    if !info.resource_request {
        return false;
    }
    if !r.namespaces.is_empty() && !r.namespaces.contains(&info.namespace) {
        return false;
    }
    if r.resources.is_empty() {
        return true;
    }
    let combined = if info.subresource.is_empty() {
        info.resource.clone()
    } else {
        format!("{}/{}", info.resource, info.subresource)
    };
    r.resources.iter().any(|gr| {
        gr.group == info.api_group
            && (gr.resources.is_empty()
                || gr.resources.iter().any(|res| {
                    (gr.resource_names.is_empty() || gr.resource_names.contains(&info.name))
                        && (*res == combined
                            || res == "*"
                            || (!info.subresource.is_empty()
                                && res.strip_prefix("*/") == Some(info.subresource.as_str()))
                            || res.strip_suffix("/*") == Some(info.resource.as_str()))
                }))
    })
}

/// Where events go.
enum Sink {
    Stdout,
    File(Mutex<std::fs::File>),
}

/// A loaded policy and its log.
pub struct Auditor {
    policy: Policy,
    sink: Sink,
}

impl Auditor {
    /// The auditor of `--audit-policy-file` and `--audit-log-path`; `None` unless both
    /// are given (upstream audits nothing without a policy or a backend).
    pub fn from_config(
        policy: Option<&Path>,
        log: Option<&Path>,
    ) -> Result<Option<Arc<Auditor>>, AuditError> {
        let (Some(policy), Some(log)) = (policy, log) else {
            return Ok(None);
        };
        let policy = Policy::load(policy)?;
        Ok(Some(Arc::new(Auditor::new(policy, log)?)))
    }

    /// An auditor writing to `log` (`-`: stdout), appending to an existing file.
    pub fn new(policy: Policy, log: &Path) -> Result<Auditor, AuditError> {
        let sink = if log == Path::new("-") {
            Sink::Stdout
        } else {
            let io = |source| AuditError::Io {
                path: log.to_owned(),
                source,
            };
            if let Some(parent) = log.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(io)?;
            }
            use std::os::unix::fs::OpenOptionsExt;
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(log)
                .map_err(io)?;
            Sink::File(Mutex::new(f))
        };
        Ok(Auditor { policy, sink })
    }

    fn write(&self, event: &Event<'_>) {
        let line = match serde_json::to_vec(event) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "encoding an audit event");
                return;
            }
        };
        let mut line = go_escape(line);
        line.push(b'\n');
        let written = match &self.sink {
            Sink::Stdout => std::io::stdout().lock().write_all(&line),
            Sink::File(f) => match f.lock() {
                Ok(mut f) => f.write_all(&line),
                Err(_) => Ok(()),
            },
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, "writing an audit event");
        }
    }
}

/// Go's encoding/json escapes `<`, `>`, `&`, U+2028 and U+2029 inside strings; they
/// occur in nothing but strings, so the encoded line can be rewritten bytewise.
fn go_escape(line: Vec<u8>) -> Vec<u8> {
    let special = |w: &[u8]| matches!(w, [0xE2, 0x80, 0xA8 | 0xA9]);
    if !line.iter().any(|b| matches!(b, b'<' | b'>' | b'&')) && !line.windows(3).any(special) {
        return line;
    }
    let mut out = Vec::with_capacity(line.len() + 16);
    let mut i = 0;
    while i < line.len() {
        match line[i] {
            b'<' => out.extend_from_slice(b"\\u003c"),
            b'>' => out.extend_from_slice(b"\\u003e"),
            b'&' => out.extend_from_slice(b"\\u0026"),
            0xE2 if line.get(i..i + 3).is_some_and(special) => {
                out.extend_from_slice(if line[i + 2] == 0xA8 {
                    b"\\u2028"
                } else {
                    b"\\u2029"
                });
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// The audit context of one request.
struct Ctx {
    auditor: Arc<Auditor>,
    id: String,
    info: RequestInfo,
    uri: String,
    user_agent: String,
    source_ips: Vec<String>,
    received: time::OffsetDateTime,
    user: Option<UserInfo>,
    eval: Option<Eval>,
    impersonated: Option<UserInfo>,
    annotations: BTreeMap<String, String>,
    object_name: Option<String>,
    object_namespace: Option<String>,
    request_object: Option<Value>,
}

tokio::task_local! {
    static CTX: Arc<Mutex<Ctx>>;
}

fn with_ctx(f: impl FnOnce(&mut Ctx)) {
    let _ = CTX.try_with(|c| {
        if let Ok(mut c) = c.lock() {
            f(&mut c);
        }
    });
}

/// Hook: the request's authenticated user (before impersonation). Decides the level and
/// writes the RequestReceived event.
pub fn authenticated(user: &UserInfo) {
    with_ctx(|c| {
        let eval = c.auditor.policy.evaluate(Some(user), &c.info);
        c.user = Some(user.clone());
        if eval.level > Level::None && !eval.omit_stages.contains(&Stage::RequestReceived) {
            let ev = c.event(&eval, Stage::RequestReceived, None, None, c.received);
            c.auditor.write(&ev);
        }
        c.eval = Some(eval);
    });
}

/// Hook: the authorization decision for `attrs` (whose user is the impersonated one when
/// the request impersonates); returns `decision` unchanged.
pub fn authorized(attrs: &Attributes, decision: Decision) -> Decision {
    with_ctx(|c| {
        if c.eval.as_ref().is_none_or(|e| e.level == Level::None) {
            return;
        }
        if c.user.as_ref() != Some(&attrs.user) {
            c.impersonated = Some(attrs.user.clone());
        }
        let (verdict, reason) = match &decision {
            Decision::Allow(r) => ("allow", r),
            Decision::Deny(r) | Decision::NoOpinion(r) => ("forbid", r),
        };
        c.annotations
            .insert("authorization.k8s.io/decision".into(), verdict.into());
        c.annotations
            .insert("authorization.k8s.io/reason".into(), reason.clone());
    });
    decision
}

/// Hook: an annotation an admission plugin records on the request's audit events
/// (upstream's AddAuditAnnotation; PodSecurity's `pod-security.kubernetes.io/...`).
pub fn annotate(key: &str, value: &str) {
    with_ctx(|c| {
        c.annotations.insert(key.to_owned(), value.to_owned());
    });
}

/// Hook: the request body, read. At Metadata level a created object's name completes
/// the object reference; from Request level on, the body is the requestObject.
pub fn request_body(content_type: Option<&str>, body: &[u8]) {
    with_ctx(|c| {
        let Some(level) = c.eval.as_ref().map(|e| e.level) else {
            return;
        };
        if level == Level::None || body.is_empty() || !c.info.resource_request {
            return;
        }
        let verb = c.info.verb.as_str();
        let patch = verb == "patch";
        let object = matches!(verb, "create" | "update");
        if !(object || patch || verb.starts_with("delete")) || (level < Level::Request && !object) {
            return;
        }
        let essence = content_type
            .and_then(|t| t.split(';').next())
            .map(str::trim)
            .unwrap_or("application/json");
        let value: Option<Value> = if essence.ends_with("yaml") {
            serde_yaml::from_slice(body).ok()
        } else if essence.contains("json") || essence.is_empty() {
            serde_json::from_slice(body).ok()
        } else {
            // Protobuf: decode it the way the verbs do.
            crate::negotiate::decode_body(content_type, body).ok()
        };
        let Some(mut value) = value else {
            return;
        };
        if object {
            let meta = |k: &str| {
                value
                    .pointer(&format!("/metadata/{k}"))
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
            };
            c.object_name = meta("name");
            c.object_namespace = meta("namespace");
        }
        if verb.starts_with("delete") {
            // Upstream records DeleteOptions as decoded into its internal version.
            if let Some(o) = value.as_object_mut() {
                o.insert("kind".into(), "DeleteOptions".into());
                o.insert("apiVersion".into(), "meta.k8s.io/__internal".into());
            }
        }
        if level >= Level::Request {
            if c.eval.as_ref().is_some_and(|e| e.omit_managed_fields) {
                strip_managed_fields(&mut value);
            }
            c.request_object = Some(value);
        }
    });
}

fn strip_managed_fields(v: &mut Value) {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        for i in items {
            strip_managed_fields(i);
        }
    }
    if let Some(rows) = v.get_mut("rows").and_then(Value::as_array_mut) {
        for r in rows {
            if let Some(o) = r.get_mut("object") {
                strip_managed_fields(o);
            }
        }
    }
}

/// Go's `utilnet.SourceIPs`: X-Forwarded-For, then X-Real-Ip, then the peer.
fn source_ips(headers: &http::HeaderMap, peer: SocketAddr) -> Vec<String> {
    let mut ips: Vec<IpAddr> = Vec::new();
    if let Some(v) = headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        ips.extend(v.split(',').filter_map(|p| p.trim().parse::<IpAddr>().ok()));
    }
    if let Some(ip) = headers
        .get("x-real-ip")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<IpAddr>().ok())
    {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    let remote = peer.ip().to_canonical();
    if ips.last() != Some(&remote) {
        ips.push(remote);
    }
    ips.iter().map(|i| i.to_canonical().to_string()).collect()
}

/// RFC 3339 with microseconds, as metav1.MicroTime.
fn micro_time(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

#[derive(Serialize, Default)]
struct UserJson<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    username: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    uid: &'a str,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    groups: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    extra: Option<&'a BTreeMap<String, Vec<String>>>,
}

impl<'a> UserJson<'a> {
    fn of(u: &'a UserInfo) -> UserJson<'a> {
        UserJson {
            username: &u.name,
            uid: &u.uid,
            groups: &u.groups,
            extra: (!u.extra.is_empty()).then_some(&u.extra),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    resource: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    namespace: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    api_group: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    api_version: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    subresource: &'a str,
}

/// metav1.Status as the audit event bounds it (and StatusDetails in Go's field order).
#[derive(Serialize, Default)]
struct ResponseStatus {
    metadata: serde_json::Map<String, Value>,
    #[serde(skip_serializing_if = "String::is_empty")]
    status: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
    code: u16,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Details {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uid: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    causes: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<Value>,
}

impl ResponseStatus {
    /// The status of a response with `code` whose body is `body` (a Status or not).
    fn of(code: u16, body: Option<&Value>) -> ResponseStatus {
        let mut rs = ResponseStatus {
            code,
            ..Default::default()
        };
        let Some(s) = body.filter(|b| b.get("kind").and_then(Value::as_str) == Some("Status"))
        else {
            return rs;
        };
        let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        rs.status = text("status");
        rs.message = text("message");
        rs.reason = text("reason");
        if let Some(c) = s.get("code").and_then(Value::as_u64) {
            rs.code = u16::try_from(c).unwrap_or(code);
        }
        rs.details = s.get("details").and_then(Value::as_object).map(|d| {
            let f = |k: &str| d.get(k).filter(|v| !v.is_null()).cloned();
            Details {
                name: f("name"),
                group: f("group"),
                kind: f("kind"),
                uid: f("uid"),
                causes: f("causes"),
                retry_after_seconds: f("retryAfterSeconds"),
            }
        });
        rs
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Event<'a> {
    kind: &'static str,
    api_version: &'static str,
    level: Level,
    #[serde(rename = "auditID")]
    audit_id: &'a str,
    stage: Stage,
    #[serde(rename = "requestURI")]
    request_uri: &'a str,
    verb: &'a str,
    user: UserJson<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    impersonated_user: Option<UserJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    authentication_metadata: Option<Value>,
    #[serde(rename = "sourceIPs")]
    source_ips: &'a [String],
    #[serde(skip_serializing_if = "str::is_empty")]
    user_agent: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    object_ref: Option<ObjectRef<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_status: Option<ResponseStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_object: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_object: Option<&'a Value>,
    request_received_timestamp: String,
    stage_timestamp: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: &'a BTreeMap<String, String>,
}

impl Ctx {
    fn event<'a>(
        &'a self,
        eval: &Eval,
        stage: Stage,
        status: Option<ResponseStatus>,
        response_object: Option<&'a Value>,
        at: time::OffsetDateTime,
    ) -> Event<'a> {
        static NO_ANNOTATIONS: BTreeMap<String, String> = BTreeMap::new();
        let received = stage == Stage::RequestReceived;
        let info = &self.info;
        let object_ref = info.resource_request.then(|| ObjectRef {
            resource: &info.resource,
            namespace: if info.namespace.is_empty() && !received {
                self.object_namespace.as_deref().unwrap_or("")
            } else {
                &info.namespace
            },
            name: if info.name.is_empty() && !received {
                self.object_name.as_deref().unwrap_or("")
            } else {
                &info.name
            },
            api_group: &info.api_group,
            api_version: &info.api_version,
            subresource: &info.subresource,
        });
        let impersonated = self.impersonated.as_ref().filter(|_| !received);
        Event {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: eval.level,
            audit_id: &self.id,
            stage,
            request_uri: &self.uri,
            verb: &info.verb,
            user: self.user.as_ref().map(UserJson::of).unwrap_or_default(),
            impersonated_user: impersonated.map(UserJson::of),
            authentication_metadata: impersonated
                .map(|_| serde_json::json!({"impersonationConstraint": "impersonate:user-info"})),
            source_ips: &self.source_ips,
            user_agent: &self.user_agent,
            object_ref,
            response_status: status,
            request_object: self.request_object.as_ref().filter(|_| !received),
            response_object,
            request_received_timestamp: micro_time(self.received),
            stage_timestamp: micro_time(at),
            annotations: if received {
                &NO_ANNOTATIONS
            } else {
                &self.annotations
            },
        }
    }
}

/// The audit ID of a request: the one it brings, else a new UUID.
fn audit_id(req: &Request<Incoming>) -> String {
    req.headers()
        .get("audit-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

fn set_audit_id(resp: &mut Response<Body>, id: &str) {
    if let Ok(v) = header::HeaderValue::from_str(id) {
        resp.headers_mut().insert("audit-id", v);
    }
}

/// Answers a request through [`crate::handler::handle`], with its `Audit-Id` header and,
/// when `auditor` is set, its audit events.
pub async fn handle(
    auditor: Option<&Arc<Auditor>>,
    state: Arc<State>,
    cert_user: crate::auth::x509::ClientCert,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    let id = audit_id(&req);
    let Some(auditor) = auditor else {
        let mut resp = crate::handler::handle(state, cert_user, req).await;
        set_audit_id(&mut resp, &id);
        return resp;
    };
    let received = time::OffsetDateTime::now_utc();
    let query: BTreeMap<String, String> = kumo_apimachinery::query::pairs(req.uri().query())
        .into_iter()
        .collect();
    let info = RequestInfo::parse(req.method().as_str(), req.uri().path(), &query);
    let mut user_agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if user_agent.len() > 1024 {
        let mut cut = 1024;
        while !user_agent.is_char_boundary(cut) {
            cut -= 1;
        }
        user_agent.truncate(cut);
        user_agent.push_str("...TRUNCATED");
    }
    let ctx = Arc::new(Mutex::new(Ctx {
        auditor: auditor.clone(),
        id: id.clone(),
        uri: req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| req.uri().path().to_owned()),
        info,
        user_agent,
        source_ips: source_ips(req.headers(), peer),
        received,
        user: None,
        eval: None,
        impersonated: None,
        annotations: BTreeMap::new(),
        object_name: None,
        object_namespace: None,
        request_object: None,
    }));
    let mut resp = CTX
        .scope(ctx.clone(), crate::handler::handle(state, cert_user, req))
        .await;
    set_audit_id(&mut resp, &id);
    finish(ctx, resp).await
}

/// Writes the response's events and hands the response on.
async fn finish(ctx: Arc<Mutex<Ctx>>, resp: Response<Body>) -> Response<Body> {
    let code = resp.status().as_u16();
    let (auditor, eval, failed_auth, verb) = {
        let Ok(c) = ctx.lock() else {
            return resp;
        };
        let failed_auth = c.user.is_none();
        let eval = match &c.eval {
            Some(e) => e.clone(),
            // Refused before a user was known: upstream's failed-authentication audit.
            None if code == 401 => c.auditor.policy.evaluate(None, &c.info),
            None => return resp,
        };
        (c.auditor.clone(), eval, failed_auth, c.info.verb.clone())
    };
    if eval.level == Level::None {
        return resp;
    }
    let streaming = resp.body().size_hint().exact().is_none();
    if streaming && !failed_auth {
        // A watch: ResponseStarted now, ResponseComplete when the stream ends.
        if !eval.omit_stages.contains(&Stage::ResponseStarted) {
            if let Ok(c) = ctx.lock() {
                let ev = c.event(
                    &eval,
                    Stage::ResponseStarted,
                    Some(ResponseStatus::of(code, None)),
                    None,
                    time::OffsetDateTime::now_utc(),
                );
                auditor.write(&ev);
            }
        }
        let guard = Completion { ctx, eval, code };
        return resp.map(|b| {
            b.map_frame(move |f| {
                let _complete_on_drop = &guard;
                f
            })
            .boxed()
        });
    }
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    let need_body = !streaming
        && json
        && (eval.level == Level::RequestResponse || code >= 300 || verb.starts_with("delete"));
    let (resp, body) = if need_body {
        let (parts, b) = resp.into_parts();
        let bytes = match b.collect().await {
            Ok(c) => c.to_bytes(),
            Err(never) => match never {},
        };
        let value: Option<Value> = serde_json::from_slice(&bytes).ok();
        (Response::from_parts(parts, Full::new(bytes).boxed()), value)
    } else {
        (resp, None)
    };
    let (stage, omitted) = if failed_auth {
        (
            Stage::ResponseStarted,
            eval.omit_stages.contains(&Stage::ResponseStarted),
        )
    } else {
        (
            Stage::ResponseComplete,
            eval.omit_stages.contains(&Stage::ResponseComplete),
        )
    };
    if omitted {
        return resp;
    }
    let mut response_object = body
        .clone()
        .filter(|_| eval.level == Level::RequestResponse);
    if eval.omit_managed_fields {
        if let Some(o) = response_object.as_mut() {
            strip_managed_fields(o);
        }
    }
    if let Ok(c) = ctx.lock() {
        let ev = c.event(
            &eval,
            stage,
            Some(ResponseStatus::of(code, body.as_ref())),
            // A refused authentication has no response object upstream either way.
            response_object.as_ref().filter(|_| !failed_auth),
            time::OffsetDateTime::now_utc(),
        );
        auditor.write(&ev);
    }
    resp
}

/// Writes the ResponseComplete event of a watch when its stream is dropped.
struct Completion {
    ctx: Arc<Mutex<Ctx>>,
    eval: Eval,
    code: u16,
}

impl Drop for Completion {
    fn drop(&mut self) {
        if self.eval.omit_stages.contains(&Stage::ResponseComplete) {
            return;
        }
        if let Ok(c) = self.ctx.lock() {
            let ev = c.event(
                &self.eval,
                Stage::ResponseComplete,
                Some(ResponseStatus::of(self.code, None)),
                None,
                time::OffsetDateTime::now_utc(),
            );
            c.auditor.write(&ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(yaml: &str) -> Policy {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("policy.yaml");
        std::fs::write(&p, yaml).expect("write");
        Policy::load(&p).expect("policy")
    }

    fn info(method: &str, path: &str) -> RequestInfo {
        RequestInfo::parse(method, path, &BTreeMap::new())
    }

    #[test]
    fn first_matching_rule_decides() {
        let p = policy(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
             - level: None\n  users: [system:kube-proxy]\n  verbs: [watch]\n\
             - level: RequestResponse\n  resources:\n  - group: \"\"\n    resources: [configmaps]\n    resourceNames: [cm1]\n\
             - level: Request\n  resources:\n  - group: apps\n    resources: [\"deployments/*\"]\n  omitStages: [ResponseStarted]\n\
             - level: None\n  nonResourceURLs: [/healthz*, /version]\n\
             - level: Metadata\n  userGroups: [system:authenticated]\n  namespaces: [kube-system]\n\
             - level: Metadata\n  omitManagedFields: true\n",
        );
        let admin = UserInfo::authenticated("admin", vec![]);
        let proxy = UserInfo::authenticated("system:kube-proxy", vec![]);
        let watch = RequestInfo::parse(
            "GET",
            "/api/v1/pods",
            &[("watch".to_owned(), "true".to_owned())]
                .into_iter()
                .collect(),
        );
        assert_eq!(p.evaluate(Some(&proxy), &watch).level, Level::None);
        assert_eq!(p.evaluate(Some(&admin), &watch).level, Level::Metadata);
        let cm = info("GET", "/api/v1/namespaces/a/configmaps/cm1");
        assert_eq!(p.evaluate(Some(&admin), &cm).level, Level::RequestResponse);
        let other = info("GET", "/api/v1/namespaces/a/configmaps/cm2");
        let e = p.evaluate(Some(&admin), &other);
        assert_eq!(e.level, Level::Metadata);
        assert!(e.omit_managed_fields);
        let scale = info("PUT", "/apis/apps/v1/namespaces/a/deployments/d/scale");
        let e = p.evaluate(Some(&admin), &scale);
        assert_eq!(e.level, Level::Request);
        assert_eq!(
            e.omit_stages,
            vec![Stage::RequestReceived, Stage::ResponseStarted]
        );
        assert_eq!(
            p.evaluate(None, &info("GET", "/healthz/etcd")).level,
            Level::None
        );
        assert_eq!(
            p.evaluate(None, &info("GET", "/versions")).level,
            Level::Metadata
        );
        // A failed authentication (no user) does not match a user-group rule.
        let ks = info("GET", "/api/v1/namespaces/kube-system/pods");
        assert!(!p.evaluate(Some(&admin), &ks).omit_managed_fields);
        assert!(p.evaluate(None, &ks).omit_managed_fields);
    }

    #[test]
    fn bad_policies_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("p.yaml");
        for bad in [
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: []\n",
            "apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules:\n- level: Metadata\n",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Loud\n",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n  nonResourceURLs: [/a]\n  namespaces: [x]\n",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n  nonResourceURLs: [a*b]\n",
        ] {
            std::fs::write(&p, bad).expect("write");
            assert!(Policy::load(&p).is_err(), "accepted {bad}");
        }
    }

    #[test]
    fn source_ips_like_go() {
        let peer: SocketAddr = "[::ffff:10.0.0.9]:5000".parse().expect("addr");
        let mut h = http::HeaderMap::new();
        assert_eq!(source_ips(&h, peer), vec!["10.0.0.9"]);
        h.insert(
            "x-forwarded-for",
            "1.2.3.4, junk, 10.0.0.9".parse().expect("v"),
        );
        h.insert("x-real-ip", "5.6.7.8".parse().expect("v"));
        assert_eq!(
            source_ips(&h, peer),
            vec!["1.2.3.4", "10.0.0.9", "5.6.7.8", "10.0.0.9"]
        );
    }

    #[test]
    fn escapes_like_go() {
        let line = br#"{"a":"x&y<z>"}"#.to_vec();
        assert_eq!(
            String::from_utf8(go_escape(line)).expect("utf8"),
            r#"{"a":"x\u0026y\u003cz\u003e"}"#
        );
        let sep = "{\"a\":\"\u{2028}\"}".as_bytes().to_vec();
        assert_eq!(
            String::from_utf8(go_escape(sep)).expect("utf8"),
            r#"{"a":"\u2028"}"#
        );
    }

    #[test]
    fn status_of_a_failure() {
        let s = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "m", "reason": "NotFound",
            "details": {"kind": "pods", "name": "p"}, "code": 404});
        let rs = serde_json::to_string(&ResponseStatus::of(404, Some(&s))).expect("json");
        assert_eq!(
            rs,
            r#"{"metadata":{},"status":"Failure","message":"m","reason":"NotFound","details":{"name":"p","kind":"pods"},"code":404}"#
        );
        let ok = serde_json::to_string(&ResponseStatus::of(200, None)).expect("json");
        assert_eq!(ok, r#"{"metadata":{},"code":200}"#);
        assert_eq!(
            micro_time(time::OffsetDateTime::UNIX_EPOCH + time::Duration::microseconds(5)),
            "1970-01-01T00:00:00.000005Z"
        );
    }
}
