//! API errors and the `Status` object they are answered with.
//!
//! Reasons, codes, messages and the shape of `details` follow k8s.io/apimachinery's
//! `api/errors` package, because clients (kubectl, client-go, kube-rs) branch on them and
//! users read them.

use serde_json::{json, Map, Value};

/// A group and a resource (plural), as named in error messages: `configmaps`,
/// `deployments.apps`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupResource {
    pub group: String,
    pub resource: String,
}

impl GroupResource {
    pub fn new(group: impl Into<String>, resource: impl Into<String>) -> Self {
        GroupResource {
            group: group.into(),
            resource: resource.into(),
        }
    }
}

impl std::fmt::Display for GroupResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// One cause of an error: a field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// Upstream's CauseType, e.g. `FieldValueRequired`.
    pub reason: String,
    pub message: String,
    pub field: String,
}

/// `details` of a Status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Details {
    pub name: String,
    pub group: String,
    /// The resource for most errors; the Kind for `Invalid`.
    pub kind: String,
    pub causes: Vec<Cause>,
    pub retry_after_seconds: Option<u32>,
    /// Not a detail: the Status's `metadata.continue`, which only an expired paged list
    /// sets (kept here, boxed, so errors stay small).
    pub list_continue: Option<String>,
}

/// An error the API answers with: HTTP code, machine-readable reason, message, details.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// Boxed: errors travel in `Result`s everywhere and should stay small.
    pub details: Option<Box<Details>>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, gr: &GroupResource, name: &str) -> Self {
        self.details = Some(Box::new(Details {
            name: name.to_owned(),
            group: gr.group.clone(),
            kind: gr.resource.clone(),
            ..Details::default()
        }));
        self
    }

    /// 404: `configmaps "x" not found`.
    pub fn not_found(gr: &GroupResource, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{gr} \"{name}\" not found")).with_details(gr, name)
    }

    /// 404 for a path that names nothing the server serves.
    pub fn path_not_found() -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        e.details = Some(Box::default());
        e
    }

    /// 409: `configmaps "x" already exists`.
    pub fn already_exists(gr: &GroupResource, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{gr} \"{name}\" already exists"),
        )
        .with_details(gr, name)
    }

    /// 409 on a stale resourceVersion or a failed precondition.
    pub fn conflict(gr: &GroupResource, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {gr} \"{name}\": {why}"),
        )
        .with_details(gr, name)
    }

    /// The Conflict of an update with a resourceVersion that is not the current one.
    pub fn stale_update(gr: &GroupResource, name: &str) -> Self {
        Self::conflict(
            gr,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422: `<Kind> "<name>" is invalid: ...`, with one cause per field error.
    pub fn invalid(
        group: &str,
        kind: &str,
        name: &str,
        message: String,
        causes: Vec<Cause>,
    ) -> Self {
        let mut e = Self::new(422, "Invalid", message);
        e.details = Some(Box::new(Details {
            name: name.to_owned(),
            group: group.to_owned(),
            kind: kind.to_owned(),
            causes,
            ..Details::default()
        }));
        e
    }

    /// 422 without field causes (a patch that cannot be applied, for instance).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405.
    pub fn method_not_supported(gr: &GroupResource, verb: &str) -> Self {
        let mut e = Self::new(
            405,
            "MethodNotAllowed",
            format!("{verb} is not supported on resources of kind \"{gr}\""),
        );
        e.details = Some(Box::new(Details {
            group: gr.group.clone(),
            kind: gr.resource.clone(),
            ..Details::default()
        }));
        e
    }

    /// 406: no representation of the answer matches the Accept header.
    pub fn not_acceptable(accepted: &[&str]) -> Self {
        Self::new(
            406,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: {}",
                accepted.join(", ")
            ),
        )
    }

    /// 415: the request body's Content-Type is not one the endpoint reads.
    pub fn unsupported_media_type(_content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf",
        )
    }

    /// 413.
    pub fn request_entity_too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// 410 for a watch or list from a resourceVersion that was compacted away.
    pub fn resource_expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// The 410 of a paged list whose continue token's revision was compacted away, with
    /// the token that continues it at the latest revision (upstream's inconsistent
    /// continue).
    pub fn inconsistent_continue(token: String) -> Self {
        let mut e = Self::resource_expired(
            "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter, or use the continue \
             token in this response to retrieve the remainder of the results. Continuing with \
             the provided token results in an inconsistent list - objects that were created, \
             modified, or deleted between the time the first chunk was returned and now may \
             show up in the list.",
        );
        e.details = Some(Box::new(Details {
            list_continue: Some(token),
            ..Details::default()
        }));
        e
    }

    /// 410 with reason Gone (an older form some paths still use).
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Gone", message)
    }

    /// 500.
    pub fn internal(err: impl std::fmt::Display) -> Self {
        let msg = err.to_string();
        let mut e = Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {msg}"),
        );
        e.details = Some(Box::new(Details {
            causes: vec![Cause {
                reason: String::new(),
                message: msg,
                field: String::new(),
            }],
            ..Details::default()
        }));
        e
    }

    /// 500 for an error kube-apiserver does not classify (a plain Go error turned into a
    /// Status): its text as the message, no reason, no details.
    pub fn unclassified(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    /// 504.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    /// 504 for a read at a resourceVersion the server has not reached in time (the watch
    /// cache's or the store's `current`); clients retry after a second.
    pub fn too_large_resource_version(requested: i64, current: i64) -> Self {
        let mut e = Self::timeout(format!(
            "Timeout: Too large resource version: {requested}, current: {current}"
        ));
        e.details = Some(Box::new(Details {
            causes: vec![Cause {
                reason: "ResourceVersionTooLarge".into(),
                message: "Too large resource version".into(),
                field: String::new(),
            }],
            retry_after_seconds: Some(1),
            ..Details::default()
        }));
        e
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403: `<user> cannot <verb> resource "<resource>" in API group "<group>" ...`.
    pub fn forbidden(gr: &GroupResource, name: &str, why: &str) -> Self {
        let target = if name.is_empty() {
            format!("{gr}")
        } else {
            format!("{gr} \"{name}\"")
        };
        Self::new(403, "Forbidden", format!("{target} is forbidden: {why}")).with_details(gr, name)
    }

    /// The `Status` object (meta/v1) this error is answered with.
    pub fn to_status(&self) -> Value {
        let mut status = Map::new();
        status.insert("kind".into(), json!("Status"));
        status.insert("apiVersion".into(), json!("v1"));
        let list_continue = self.details.as_ref().and_then(|d| d.list_continue.as_ref());
        status.insert(
            "metadata".into(),
            match list_continue {
                Some(c) => json!({ "continue": c }),
                None => json!({}),
            },
        );
        status.insert("status".into(), json!("Failure"));
        status.insert("message".into(), json!(self.message));
        // An empty reason is left out, as Go's omitempty does.
        if !self.reason.is_empty() {
            status.insert("reason".into(), json!(self.reason));
        }
        // Details that only carry the continue token are no details.
        let only_continue = |d: &Details| {
            d.list_continue.is_some()
                && d.name.is_empty()
                && d.group.is_empty()
                && d.kind.is_empty()
                && d.causes.is_empty()
                && d.retry_after_seconds.is_none()
        };
        if let Some(d) = self.details.as_ref().filter(|d| !only_continue(d)) {
            let mut details = Map::new();
            if !d.name.is_empty() {
                details.insert("name".into(), json!(d.name));
            }
            if !d.group.is_empty() {
                details.insert("group".into(), json!(d.group));
            }
            if !d.kind.is_empty() {
                details.insert("kind".into(), json!(d.kind));
            }
            if !d.causes.is_empty() {
                let causes: Vec<Value> = d
                    .causes
                    .iter()
                    .map(|c| {
                        let mut m = Map::new();
                        if !c.reason.is_empty() {
                            m.insert("reason".into(), json!(c.reason));
                        }
                        if !c.message.is_empty() {
                            m.insert("message".into(), json!(c.message));
                        }
                        if !c.field.is_empty() {
                            m.insert("field".into(), json!(c.field));
                        }
                        Value::Object(m)
                    })
                    .collect();
                details.insert("causes".into(), Value::Array(causes));
            }
            if let Some(s) = d.retry_after_seconds {
                details.insert("retryAfterSeconds".into(), json!(s));
            }
            status.insert("details".into(), Value::Object(details));
        }
        status.insert("code".into(), json!(self.code));
        Value::Object(status)
    }
}

/// The `Status` of a successful delete that returns no object.
pub fn success_status(gr: &GroupResource, name: &str, uid: &str) -> Value {
    let mut details = Map::new();
    details.insert("name".into(), json!(name));
    if !gr.group.is_empty() {
        details.insert("group".into(), json!(gr.group));
    }
    details.insert("kind".into(), json!(gr.resource));
    if !uid.is_empty() {
        details.insert("uid".into(), json!(uid));
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": Value::Object(details),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_upstream_shape() {
        let e = ApiError::not_found(&GroupResource::new("", "configmaps"), "x");
        assert_eq!(
            e.to_status(),
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                   "message":"configmaps \"x\" not found","reason":"NotFound",
                   "details":{"name":"x","kind":"configmaps"},"code":404})
        );
        let e = ApiError::already_exists(&GroupResource::new("apps", "deployments"), "web");
        assert_eq!(e.message, "deployments.apps \"web\" already exists");
        assert_eq!(e.to_status()["details"]["group"], "apps");
    }

    #[test]
    fn conflict_message() {
        let e = ApiError::stale_update(&GroupResource::new("", "configmaps"), "c");
        assert_eq!(
            e.message,
            "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again"
        );
        assert_eq!((e.code, e.reason), (409, "Conflict"));
    }
}
