//! authentication.k8s.io/v1: TokenReview and SelfSubjectReview (create-only, answered and
//! never stored), and the TokenRequest of `serviceaccounts/<name>/token`, which issues
//! service-account tokens, each as upstream's REST storage answers them.

use std::sync::Arc;

use kumo_apimachinery::status::{ApiError, GroupResource};
use kumo_apimachinery::validation::{go_quote, invalid_message, FieldError, Path};
use serde_json::{json, Map, Value};

use super::{Resource, Strategy};
use crate::auth::serviceaccount::{
    self, read_object, Claims, ObjectRef, SigningKey, EXTENDED_EXPIRATION_SECS,
    WARN_ONLY_EXPIRATION_SECS,
};
use crate::auth::{Review, ReviewContext, TokenResult};

const GROUP: &str = "authentication.k8s.io";
const API_VERSION: &str = "authentication.k8s.io/v1";

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource {
            group: GROUP,
            version: "v1",
            kind: "SelfSubjectReview",
            plural: "selfsubjectreviews",
            singular: "selfsubjectreview",
            namespaced: false,
            short_names: &[],
            categories: &[],
            subresources: &[],
            strategy: Box::new(CreateOnly),
        },
        Resource {
            group: GROUP,
            version: "v1",
            kind: "TokenReview",
            plural: "tokenreviews",
            singular: "tokenreview",
            namespaced: false,
            short_names: &[],
            categories: &[],
            subresources: &[],
            strategy: Box::new(CreateOnly),
        },
    ]
}

/// A resource that only takes POSTs, answered by its [`Review`].
struct CreateOnly;

impl Strategy for CreateOnly {
    fn verbs(&self) -> Option<&'static [&'static str]> {
        Some(&["create"])
    }
    fn delete_collection(&self) -> bool {
        false
    }
}

/// The body as an object of `kind`: a body of another kind, or no object at all, is
/// refused with the decoder's messages.
fn body_of(body: Value, kind: &str) -> Result<Map<String, Value>, ApiError> {
    let Value::Object(obj) = body else {
        // Upstream summarizes the body it could not read: its first 30 bytes in hex.
        let raw = body.to_string();
        let summary = match raw.as_bytes() {
            b if b.len() > 30 => format!("{} ...", hex(&b[..30])),
            b => hex(b),
        };
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; json parse error: json: cannot unmarshal {} into Go value of type {} ({summary})",
            crate::negotiate::go_json_type(&body).unwrap_or("null"),
            crate::negotiate::GO_TYPE_META
        )));
    };
    let given = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if !given.is_empty() && given != kind {
        let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let version = av.rsplit('/').next().unwrap_or(av);
        return Err(ApiError::bad_request(format!(
            "{given} in version {} cannot be handled as a {kind}: converting ({version}.{given}) to ({}.{kind}): unknown conversion",
            go_quote(version),
            GROUP.split('.').next().unwrap_or(GROUP),
        )));
    }
    Ok(obj)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A string field of a body, refusing another JSON type as the decoder does.
fn string_at(kind: &str, obj: &Value, pointer: &str, go_field: &str) -> Result<String, ApiError> {
    match obj.pointer(pointer) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(decode_error(kind, v, go_field, "string")),
    }
}

/// The decoder's refusal of a field of the wrong JSON type in a body of `kind`.
fn decode_error(kind: &str, v: &Value, go_field: &str, go_type: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{kind} in version \"v1\" cannot be handled as a {kind}: json: cannot unmarshal {} into Go struct field {go_field} of type {go_type}",
        crate::negotiate::go_json_type(v).unwrap_or("null")
    ))
}

/// A list of strings at `pointer` (absent or null: empty).
fn strings_at(
    kind: &str,
    obj: &Value,
    pointer: &str,
    go_field: &str,
) -> Result<Vec<String>, ApiError> {
    match obj.pointer(pointer) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(decode_error(kind, other, go_field, "string")),
            })
            .collect(),
        Some(v) => Err(decode_error(kind, v, go_field, "[]string")),
    }
}

/// The fields a request sets, as a FieldsV1 object (struct fields by key, anything else
/// a leaf), without the ones the server owns (upstream's strip set). `parent` is the key
/// of `v`, to tell the maps (labels, annotations, attestations), which own themselves
/// (`.`) besides their keys, from structs.
fn fields_v1(v: &Value, parent: &str) -> Map<String, Value> {
    let mut out = Map::new();
    let Value::Object(m) = v else {
        return out;
    };
    let top = parent.is_empty();
    for (k, child) in m {
        if top && matches!(k.as_str(), "apiVersion" | "kind" | "status") {
            continue;
        }
        if parent == "metadata"
            && matches!(
                k.as_str(),
                "name"
                    | "namespace"
                    | "creationTimestamp"
                    | "selfLink"
                    | "uid"
                    | "generation"
                    | "managedFields"
                    | "resourceVersion"
            )
        {
            continue;
        }
        let inner = match child {
            Value::Null => continue,
            Value::Object(_) => {
                let mut f = fields_v1(child, k);
                let is_map = matches!(
                    (parent, k.as_str()),
                    ("metadata", "labels" | "annotations") | ("spec", "attestations")
                );
                if is_map {
                    f.insert(".".into(), json!({}));
                }
                if f.is_empty() && top {
                    continue;
                }
                Value::Object(f)
            }
            _ => json!({}),
        };
        out.insert(format!("f:{k}"), inner);
    }
    out
}

/// The managedFields entry upstream records for a create of an answered object: the
/// request's manager (`fieldManager`, else its User-Agent) owning what the request set.
fn managed_fields(
    ctx: &ReviewContext<'_>,
    request: &Value,
    subresource: Option<&str>,
) -> Result<Option<Value>, ApiError> {
    let manager = crate::fieldmanager::manager(ctx.query, crate::fieldmanager::Options::Create)?;
    let fields = fields_v1(request, "");
    if fields.is_empty() {
        return Ok(None);
    }
    let mut entry = json!({
        "manager": manager,
        "operation": "Update",
        "apiVersion": API_VERSION,
        "time": crate::time::now_rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    });
    if let Some(s) = subresource {
        entry["subresource"] = json!(s);
    }
    Ok(Some(json!([entry])))
}

/// TokenRequest: `POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`.
pub struct TokenRequest {
    key: Arc<SigningKey>,
}

impl TokenRequest {
    /// Issues tokens signed with `key`.
    pub fn new(key: Arc<SigningKey>) -> TokenRequest {
        TokenRequest { key }
    }
}

fn invalid_token_request(name: &str, errs: &[FieldError]) -> ApiError {
    ApiError::invalid(
        GROUP,
        "TokenRequest",
        name,
        invalid_message("TokenRequest.authentication.k8s.io", name, errs),
        errs.iter().map(FieldError::to_cause).collect(),
    )
}

/// Upstream's ValidateTokenRequest.
fn validate_token_request(spec: &Value, expiration: i64, audiences: &[String]) -> Vec<FieldError> {
    let path = Path::new("spec");
    let mut errs = Vec::new();
    if expiration < 10 * 60 {
        errs.push(FieldError::invalid(
            &path.child("expirationSeconds"),
            expiration,
            "may not specify a duration less than 10 minutes",
        ));
    }
    if expiration > 1 << 32 {
        errs.push(FieldError::invalid(
            &path.child("expirationSeconds"),
            expiration,
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let attestations = spec.get("attestations").and_then(Value::as_object);
    let kind = spec
        .pointer("/boundObjectRef/kind")
        .and_then(Value::as_str)
        .unwrap_or("");
    let webhook = matches!(
        kind,
        "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration"
    ) && spec
        .pointer("/boundObjectRef/apiVersion")
        .and_then(Value::as_str)
        == Some("admissionregistration.k8s.io/v1");
    if webhook {
        if audiences.len() != 1 {
            errs.push(FieldError::invalid(
                &path.child("audiences"),
                json!(audiences),
                "must be length 1 when bound to a webhook config",
            ));
        }
        if attestations.map_or(0, Map::len) != 1 {
            errs.push(FieldError::invalid(
                &path.child("attestations"),
                json!(attestations),
                "webhook bound requests require exactly one admissionReviewAPIGroups attestation",
            ));
        }
    } else if attestations.is_some_and(|a| !a.is_empty()) {
        return vec![FieldError::invalid(
            &path.child("attestations"),
            json!(attestations),
            "attestations may only be specified with a webhook bound object reference",
        )];
    }
    errs
}

/// `group/version, Kind=kind`, as Go prints a GroupVersionKind.
fn gvk_string(api_version: &str, kind: &str) -> (String, String) {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    (group.to_owned(), format!("{group}/{version}, Kind={kind}"))
}

async fn get_or_404(
    ctx: &ReviewContext<'_>,
    key: String,
    resource: &str,
    name: &str,
) -> Result<Value, ApiError> {
    read_object(&*ctx.rest.store, &key)
        .await
        .map_err(ApiError::internal)?
        .ok_or_else(|| ApiError::not_found(&GroupResource::new("", resource), name))
}

fn uid_of(obj: &Value) -> String {
    super::str_at(obj, "/metadata/uid").to_owned()
}

#[async_trait::async_trait]
impl Review for TokenRequest {
    fn serves(&self) -> (&'static str, &'static str, &'static str) {
        ("", "serviceaccounts", "token")
    }

    async fn create(&self, ctx: ReviewContext<'_>) -> Result<(u16, Value), ApiError> {
        let namespace = ctx.namespace.unwrap_or("").to_owned();
        let name = ctx.name.unwrap_or("").to_owned();
        let mut req = Value::Object(body_of(ctx.body.clone(), "TokenRequest")?);
        let req_ns = string_at(
            "TokenRequest",
            &req,
            "/metadata/namespace",
            "ObjectMeta.metadata.namespace",
        )?;
        if !req_ns.is_empty() && req_ns != namespace {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        // v1 defaulting (SetDefaults_TokenRequestSpec), so it counts as sent.
        let spec_val = req.get("spec").cloned().unwrap_or(Value::Null);
        if !matches!(spec_val, Value::Object(_) | Value::Null) {
            return Err(decode_error(
                "TokenRequest",
                &spec_val,
                "TokenRequest.spec",
                "v1.TokenRequestSpec",
            ));
        }
        let expiration = match spec_val.get("expirationSeconds") {
            None | Some(Value::Null) => 3600,
            Some(v) => v.as_i64().ok_or_else(|| {
                decode_error(
                    "TokenRequest",
                    v,
                    "TokenRequestSpec.spec.expirationSeconds",
                    "int64",
                )
            })?,
        };
        let mut audiences = strings_at(
            "TokenRequest",
            &req,
            "/spec/audiences",
            "TokenRequestSpec.spec.audiences",
        )?;
        let bound = match spec_val.get("boundObjectRef") {
            None | Some(Value::Null) => None,
            Some(Value::Object(_)) => Some((
                string_at(
                    "TokenRequest",
                    &spec_val,
                    "/boundObjectRef/apiVersion",
                    "BoundObjectReference.spec.boundObjectRef.apiVersion",
                )?,
                string_at(
                    "TokenRequest",
                    &spec_val,
                    "/boundObjectRef/kind",
                    "BoundObjectReference.spec.boundObjectRef.kind",
                )?,
                string_at(
                    "TokenRequest",
                    &spec_val,
                    "/boundObjectRef/name",
                    "BoundObjectReference.spec.boundObjectRef.name",
                )?,
                string_at(
                    "TokenRequest",
                    &spec_val,
                    "/boundObjectRef/uid",
                    "BoundObjectReference.spec.boundObjectRef.uid",
                )?,
            )),
            Some(v) => {
                return Err(decode_error(
                    "TokenRequest",
                    v,
                    "TokenRequestSpec.spec.boundObjectRef",
                    "v1.BoundObjectReference",
                ))
            }
        };
        if let Some(spec) = req.as_object_mut().map(|o| {
            o.entry("spec")
                .and_modify(|s| {
                    if s.is_null() {
                        *s = json!({})
                    }
                })
                .or_insert_with(|| json!({}))
        }) {
            spec["expirationSeconds"] = json!(expiration);
        }
        let managed = managed_fields(&ctx, &req, Some("token"))?;

        // NamespaceLifecycle: the namespace must exist.
        if read_object(
            &*ctx.rest.store,
            &format!("/registry/namespaces/{namespace}"),
        )
        .await
        .map_err(ApiError::internal)?
        .is_none()
        {
            return Err(ApiError::not_found(
                &GroupResource::new("", "namespaces"),
                &namespace,
            ));
        }
        let req_name = string_at(
            "TokenRequest",
            &req,
            "/metadata/name",
            "ObjectMeta.metadata.name",
        )?;
        if !req_name.is_empty() && req_name != name {
            return Err(invalid_token_request(
                &name,
                &[FieldError::invalid(
                    &Path::new("metadata").child("name"),
                    req_name.as_str(),
                    "must match the service account name if specified",
                )],
            ));
        }
        let account = get_or_404(
            &ctx,
            format!("/registry/serviceaccounts/{namespace}/{name}"),
            "serviceaccounts",
            &name,
        )
        .await?;
        let sa_uid = uid_of(&account);
        let req_uid = string_at(
            "TokenRequest",
            &req,
            "/metadata/uid",
            "ObjectMeta.metadata.uid",
        )?;
        if !req_uid.is_empty() && req_uid != sa_uid {
            return Err(ApiError::conflict(
                &GroupResource::new(GROUP, "TokenRequest"),
                &name,
                &format!("the UID in the token request ({req_uid}) does not match the UID of the service account ({sa_uid})"),
            ));
        }
        if audiences.is_empty() {
            audiences = serviceaccount::api_audiences();
        }
        let now = crate::time::now_secs();
        let errs = validate_token_request(&spec_val, expiration, &audiences);
        if !errs.is_empty() {
            return Err(invalid_token_request("", &errs));
        }

        let mut claims = Claims {
            namespace: namespace.clone(),
            service_account: ObjectRef::new(name.clone(), sa_uid.clone()),
            audiences: audiences.clone(),
            issued_at: now,
            jti: uuid::Uuid::new_v4().to_string(),
            ..Default::default()
        };
        if let Some((api_version, kind, ref_name, ref_uid)) = &bound {
            let (group, gvk) = gvk_string(api_version, kind);
            let uid = match (group.as_str(), kind.as_str()) {
                ("", "Pod") => {
                    let pod = get_or_404(
                        &ctx,
                        format!("/registry/pods/{namespace}/{ref_name}"),
                        "pods",
                        ref_name,
                    )
                    .await?;
                    if super::str_at(&pod, "/spec/serviceAccountName") != name {
                        return Err(ApiError::bad_request(format!(
                            "cannot bind token for serviceaccount {} to pod running with different serviceaccount name.",
                            go_quote(&name)
                        )));
                    }
                    let node_name = super::str_at(&pod, "/spec/nodeName");
                    if !node_name.is_empty() {
                        // A node that is gone still leaves its name in the claims.
                        let node =
                            read_object(&*ctx.rest.store, &format!("/registry/nodes/{node_name}"))
                                .await
                                .map_err(ApiError::internal)?;
                        claims.node = Some(ObjectRef::new(
                            node_name,
                            node.as_ref().map(uid_of).unwrap_or_default(),
                        ));
                    }
                    let uid = uid_of(&pod);
                    claims.pod = Some(ObjectRef::new(ref_name.clone(), uid.clone()));
                    uid
                }
                ("", "Node") => {
                    let node = get_or_404(
                        &ctx,
                        format!("/registry/nodes/{ref_name}"),
                        "nodes",
                        ref_name,
                    )
                    .await?;
                    let uid = uid_of(&node);
                    claims.node = Some(ObjectRef::new(ref_name.clone(), uid.clone()));
                    uid
                }
                ("", "Secret") => {
                    let secret = get_or_404(
                        &ctx,
                        format!("/registry/secrets/{namespace}/{ref_name}"),
                        "secrets",
                        ref_name,
                    )
                    .await?;
                    let uid = uid_of(&secret);
                    claims.secret = Some(ObjectRef::new(ref_name.clone(), uid.clone()));
                    uid
                }
                (
                    "admissionregistration.k8s.io",
                    "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration",
                ) if api_version == "admissionregistration.k8s.io/v1" => {
                    return Err(ApiError::bad_request(format!(
                        "cannot bind token to object of type {gvk} (feature gate APIServerWebhookAuthenticationToken is disabled)"
                    )));
                }
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "cannot bind token to object of type {gvk}"
                    )))
                }
            };
            if !ref_uid.is_empty() && *ref_uid != uid {
                return Err(ApiError::conflict(
                    &GroupResource::new(group, kind.clone()),
                    ref_name,
                    &format!("the UID in the bound object reference ({ref_uid}) does not match the UID in record. The object might have been deleted and then recreated"),
                ));
            }
        }
        // Tokens the ServiceAccount admission plugin projects into pods (1h7s, API
        // audiences) last a year but warn after their requested time, as upstream's
        // --service-account-extend-token-expiration (on by default).
        let mut lifetime = expiration;
        if claims.pod.is_some()
            && expiration == WARN_ONLY_EXPIRATION_SECS
            && audiences
                .iter()
                .all(|a| serviceaccount::api_audiences().contains(a))
        {
            claims.warn_after = Some(now + expiration);
            lifetime = EXTENDED_EXPIRATION_SECS;
        }
        claims.expires = now + lifetime;
        let token = self
            .key
            .sign(&claims.to_json())
            .map_err(|e| ApiError::internal(format!("failed to generate token: {e}")))?;

        // The answer: the request, completed, with its status.
        let mut meta = req
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        meta.insert("name".into(), json!(name));
        meta.insert("namespace".into(), json!(namespace));
        meta.insert("uid".into(), json!(sa_uid));
        meta.insert(
            "creationTimestamp".into(),
            json!(crate::time::format_rfc3339(now)),
        );
        meta.remove("resourceVersion");
        match managed {
            Some(m) => meta.insert("managedFields".into(), m),
            None => meta.remove("managedFields"),
        };
        let mut spec = req.get("spec").cloned().unwrap_or_else(|| json!({}));
        spec["audiences"] = json!(audiences);
        spec["expirationSeconds"] = json!(expiration);
        if spec.get("boundObjectRef").is_none() {
            spec["boundObjectRef"] = Value::Null;
        }
        let out = json!({
            "kind": "TokenRequest",
            "apiVersion": API_VERSION,
            "metadata": meta,
            "spec": spec,
            "status": {
                "token": token,
                "expirationTimestamp": crate::time::format_rfc3339(now + expiration),
            },
        });
        Ok((201, out))
    }
}

/// TokenReview: whether a token authenticates, and as whom.
pub struct TokenReview;

#[async_trait::async_trait]
impl Review for TokenReview {
    fn serves(&self) -> (&'static str, &'static str, &'static str) {
        (GROUP, "tokenreviews", "")
    }

    async fn create(&self, ctx: ReviewContext<'_>) -> Result<(u16, Value), ApiError> {
        let obj = Value::Object(body_of(ctx.body.clone(), "TokenReview")?);
        if let Some(ns) = ctx.namespace.filter(|n| !n.is_empty()) {
            return Err(ApiError::bad_request(format!(
                "namespace is not allowed on this type: {ns}"
            )));
        }
        let token = string_at(
            "TokenReview",
            &obj,
            "/spec/token",
            "TokenReviewSpec.spec.token",
        )?;
        let requested = strings_at(
            "TokenReview",
            &obj,
            "/spec/audiences",
            "TokenReviewSpec.spec.audiences",
        )?;
        if token.is_empty() {
            return Err(ApiError::bad_request(
                "token is required for TokenReview in authentication",
            ));
        }
        let audiences = if requested.is_empty() {
            serviceaccount::api_audiences()
        } else {
            requested
        };
        let status = match ctx.auth.authenticate_token(&token, &audiences).await {
            TokenResult::User(user, auds) => {
                let mut s = json!({"authenticated": true, "user": user.to_json()});
                if !auds.is_empty() {
                    s["audiences"] = json!(auds);
                }
                s
            }
            // Upstream's bearer-token authenticator adds its own error to the token
            // authenticators' one.
            TokenResult::NotMine => json!({"user": {}, "error": "invalid bearer token"}),
            TokenResult::Invalid(why) => {
                json!({"user": {}, "error": format!("[invalid bearer token, {why}]")})
            }
        };
        let mut out = obj;
        let managed = managed_fields(&ctx, &out, None)?;
        let mut meta = out
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        match managed {
            Some(m) => meta.insert("managedFields".into(), m),
            None => meta.remove("managedFields"),
        };
        out["kind"] = json!("TokenReview");
        out["apiVersion"] = json!(API_VERSION);
        out["metadata"] = Value::Object(meta);
        out["status"] = status;
        Ok((201, out))
    }
}

/// SelfSubjectReview: who the requester is (`kubectl auth whoami`).
pub struct SelfSubjectReview;

#[async_trait::async_trait]
impl Review for SelfSubjectReview {
    fn serves(&self) -> (&'static str, &'static str, &'static str) {
        (GROUP, "selfsubjectreviews", "")
    }

    async fn create(&self, ctx: ReviewContext<'_>) -> Result<(u16, Value), ApiError> {
        body_of(ctx.body.clone(), "SelfSubjectReview")?;
        Ok((
            201,
            json!({
                "kind": "SelfSubjectReview",
                "apiVersion": API_VERSION,
                "metadata": {"creationTimestamp": crate::time::now_rfc3339()},
                "status": {"userInfo": ctx.user.to_json()},
            }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_request_validation() {
        let spec = json!({});
        let auds = vec!["a".to_owned()];
        assert!(validate_token_request(&spec, 600, &auds).is_empty());
        assert!(validate_token_request(&spec, 1 << 32, &auds).is_empty());
        let errs = validate_token_request(&spec, 599, &auds);
        assert_eq!(
            errs[0].to_string(),
            "spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
        );
        let errs = validate_token_request(&spec, (1 << 32) + 1, &auds);
        assert_eq!(
            errs[0].to_string(),
            "spec.expirationSeconds: Invalid value: 4294967297: may not specify a duration larger than 2^32 seconds"
        );
        let att = json!({"attestations": {"admissionReviewAPIGroups": ["apps"]}});
        let errs = validate_token_request(&att, 10, &auds);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0]
            .to_string()
            .contains("attestations may only be specified with a webhook bound object reference"));
    }

    #[test]
    fn gvk_printing() {
        assert_eq!(
            gvk_string("v1", "ConfigMap"),
            ("".into(), "/v1, Kind=ConfigMap".into())
        );
        assert_eq!(
            gvk_string("apps/v1", "Pod"),
            ("apps".into(), "apps/v1, Kind=Pod".into())
        );
    }

    #[test]
    fn managed_field_sets() {
        let req = json!({
            "apiVersion": API_VERSION,
            "kind": "TokenRequest",
            "metadata": {"name": "x", "labels": {"a": "b"}},
            "spec": {"expirationSeconds": 3600, "boundObjectRef": {"kind": "Pod", "name": "p"}, "audiences": ["a"]},
            "status": {"token": "t"},
        });
        assert_eq!(
            Value::Object(fields_v1(&req, "")),
            json!({
                "f:metadata": {"f:labels": {".": {}, "f:a": {}}},
                "f:spec": {"f:audiences": {}, "f:boundObjectRef": {"f:kind": {}, "f:name": {}}, "f:expirationSeconds": {}},
            })
        );
        assert!(fields_v1(&json!({"metadata": {"name": "x"}}), "").is_empty());
    }

    #[test]
    fn bodies_of_another_kind() {
        let e = body_of(json!({"kind": "Pod", "apiVersion": "v1"}), "TokenRequest")
            .expect_err("a Pod is no TokenRequest");
        assert_eq!(
            e.message,
            "Pod in version \"v1\" cannot be handled as a TokenRequest: converting (v1.Pod) to (authentication.TokenRequest): unknown conversion"
        );
        let e = body_of(json!([1]), "TokenReview").expect_err("not an object");
        assert!(e.message.ends_with(" (5b315d)"), "{}", e.message);
        let e = string_at(
            "TokenReview",
            &json!({"spec": {"token": 5}}),
            "/spec/token",
            "TokenReviewSpec.spec.token",
        )
        .expect_err("a number is no token");
        assert_eq!(
            e.message,
            "TokenReview in version \"v1\" cannot be handled as a TokenReview: json: cannot unmarshal number into Go struct field TokenReviewSpec.spec.token of type string"
        );
        assert!(body_of(json!({"kind": "TokenReview"}), "TokenReview").is_ok());
    }
}
