//! Who is asking and whether they may: authentication (x509 client certificates,
//! service-account and bootstrap tokens), the request's attributes, and authorization
//! (the Node authorizer, then RBAC), as kube-apiserver chains them.
//!
//! The handler authenticates every request, authorizes it, and runs the verbs with the
//! user in the task-local [`USER`], so admission and the fieldmanager can read it without
//! threading it through every call.

pub mod bootstrap;
pub mod escalation;
pub mod node;
pub mod rbac;
pub mod request;
pub mod serviceaccount;
pub mod x509;

use std::collections::BTreeMap;

use kumo_apimachinery::status::{ApiError, GroupResource};
use serde_json::{json, Value};

pub use request::{Attributes, RequestInfo};

/// An authenticated user, as upstream's `user.Info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Well-known user and group names (k8s.io/apiserver/pkg/authentication/user).
pub mod names {
    pub const ANONYMOUS: &str = "system:anonymous";
    pub const APISERVER: &str = "system:apiserver";
    pub const ALL_AUTHENTICATED: &str = "system:authenticated";
    pub const ALL_UNAUTHENTICATED: &str = "system:unauthenticated";
    pub const MASTERS: &str = "system:masters";
    pub const NODES: &str = "system:nodes";
    pub const NODE_PREFIX: &str = "system:node:";
    pub const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";
    pub const SERVICE_ACCOUNTS: &str = "system:serviceaccounts";
    pub const BOOTSTRAPPERS: &str = "system:bootstrappers";
}

impl UserInfo {
    /// A user with `name` and `groups`, plus `system:authenticated` as every
    /// authenticated user gets it.
    pub fn authenticated(name: impl Into<String>, groups: Vec<String>) -> UserInfo {
        let mut groups = groups;
        if !groups.iter().any(|g| g == names::ALL_AUTHENTICATED) {
            groups.push(names::ALL_AUTHENTICATED.to_owned());
        }
        UserInfo {
            name: name.into(),
            groups,
            ..Default::default()
        }
    }

    /// The anonymous user.
    pub fn anonymous() -> UserInfo {
        UserInfo {
            name: names::ANONYMOUS.to_owned(),
            groups: vec![names::ALL_UNAUTHENTICATED.to_owned()],
            ..Default::default()
        }
    }

    /// The API server's own identity, for writes it makes itself (bootstrap objects).
    pub fn apiserver() -> UserInfo {
        UserInfo {
            name: names::APISERVER.to_owned(),
            uid: String::new(),
            groups: vec![
                names::MASTERS.to_owned(),
                names::ALL_AUTHENTICATED.to_owned(),
            ],
            extra: BTreeMap::new(),
        }
    }

    pub fn in_group(&self, g: &str) -> bool {
        self.groups.iter().any(|x| x == g)
    }

    /// The node name of a kubelet's identity (`system:node:<name>` in `system:nodes`).
    pub fn node_name(&self) -> Option<&str> {
        if !self.in_group(names::NODES) {
            return None;
        }
        self.name
            .strip_prefix(names::NODE_PREFIX)
            .filter(|n| !n.is_empty())
    }

    /// `(namespace, name)` of a service account's identity.
    pub fn service_account(&self) -> Option<(&str, &str)> {
        self.name
            .strip_prefix(names::SERVICE_ACCOUNT_PREFIX)?
            .split_once(':')
    }

    /// The `userInfo` of an AdmissionReview, a TokenReview or a SelfSubjectReview.
    pub fn to_json(&self) -> Value {
        let mut v = json!({"username": self.name});
        if !self.uid.is_empty() {
            v["uid"] = json!(self.uid);
        }
        if !self.groups.is_empty() {
            v["groups"] = json!(self.groups);
        }
        if !self.extra.is_empty() {
            v["extra"] = json!(self.extra);
        }
        v
    }
}

tokio::task_local! {
    /// The user of the request being handled (set by the handler around each request).
    pub static USER: UserInfo;
}

/// The user of the request being handled; the API server itself outside a request.
pub fn current_user() -> UserInfo {
    USER.try_with(Clone::clone)
        .unwrap_or_else(|_| UserInfo::apiserver())
}

/// What an authorizer says about a request (upstream's Decision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow(String),
    Deny(String),
    NoOpinion(String),
}

/// One authorizer of the chain.
pub trait Authorizer: Send + Sync {
    fn authorize(&self, attrs: &Attributes) -> Decision;
    /// The rules `user` has in `namespace` (SelfSubjectRulesReview): resource rules and
    /// non-resource rules as PolicyRule-shaped JSON (verbs, apiGroups, resources,
    /// resourceNames / verbs, nonResourceURLs), and whether the list is incomplete.
    /// `None`: this authorizer cannot list rules.
    fn rules_for(&self, _user: &UserInfo, _namespace: &str) -> Option<RuleList> {
        None
    }
}

/// The rules an authorizer grants a user (see [`Authorizer::rules_for`]).
#[derive(Clone, Debug, Default)]
pub struct RuleList {
    pub resource_rules: Vec<Value>,
    pub non_resource_rules: Vec<Value>,
    pub incomplete: bool,
    pub evaluation_error: String,
}

/// The 401 every request with missing or invalid credentials gets.
pub fn unauthorized() -> ApiError {
    ApiError::unauthorized()
}

/// The 403 of a request the authorizers did not allow, with upstream's message:
/// `pods "x" is forbidden: User "u" cannot get resource "pods" in API group "" in the
/// namespace "ns"` (and the authorizer's reason, when it gave one).
pub fn forbidden(attrs: &Attributes, reason: &str) -> ApiError {
    let user = &attrs.user.name;
    let mut why = if !attrs.resource_request {
        format!(
            "User \"{user}\" cannot {} path \"{}\"",
            attrs.verb, attrs.path
        )
    } else {
        let resource = if attrs.subresource.is_empty() {
            attrs.resource.clone()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        let scope = if attrs.namespace.is_empty() {
            " at the cluster scope".to_owned()
        } else {
            format!(" in the namespace \"{}\"", attrs.namespace)
        };
        format!(
            "User \"{user}\" cannot {} resource \"{resource}\" in API group \"{}\"{scope}",
            attrs.verb, attrs.api_group
        )
    };
    if !reason.is_empty() {
        why.push_str(": ");
        why.push_str(reason);
    }
    if !attrs.resource_request {
        let mut e = ApiError::forbidden(&GroupResource::new("", ""), "", &why);
        e.message = format!("forbidden: {why}");
        return e;
    }
    ApiError::forbidden(
        &GroupResource::new(attrs.api_group.clone(), attrs.resource.clone()),
        &attrs.name,
        &why,
    )
}

/// What a token authenticator says about a bearer token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenResult {
    /// Not a token of this kind: the next authenticator may know it.
    NotMine,
    /// A token of this kind that is not valid (expired, tampered, revoked); the reason is
    /// logged, never sent to the client.
    Invalid(String),
    /// The token's user and the audiences it was accepted for.
    User(UserInfo, Vec<String>),
}

/// One kind of bearer token (service-account JWTs, bootstrap tokens).
#[async_trait::async_trait]
pub trait TokenAuthenticator: Send + Sync {
    /// Checks `token` for `audiences` (the API server's own when empty).
    async fn authenticate(&self, token: &str, audiences: &[String]) -> TokenResult;
}

/// A create-only resource that is answered, not stored: TokenReview,
/// SubjectAccessReview and the other reviews, and subresources such as
/// `serviceaccounts/token` (TokenRequest).
#[async_trait::async_trait]
pub trait Review: Send + Sync {
    /// The (API group, resource, subresource) it answers POSTs to; subresource "" for a
    /// resource itself.
    fn serves(&self) -> (&'static str, &'static str, &'static str);
    /// Answers a POST: the status code and the object sent back.
    async fn create(&self, ctx: ReviewContext<'_>) -> Result<(u16, Value), ApiError>;
}

/// What a review is asked with.
pub struct ReviewContext<'a> {
    /// The namespace and name of the URL (a subresource's object).
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    /// The decoded request body.
    pub body: Value,
    /// The request's query (`fieldManager`, `dryRun`, ...).
    pub query: &'a BTreeMap<String, String>,
    pub user: &'a UserInfo,
    pub dry_run: bool,
    pub auth: &'a Auth,
    pub rest: &'a crate::rest::Rest,
    /// The served resources, for reviews that act on other resources (pods/eviction).
    pub registry: &'a crate::registry::Registry,
}

/// The authenticators, authorizers and reviews of a server, in upstream's order.
#[derive(Clone, Default)]
pub struct Auth {
    pub tokens: Vec<std::sync::Arc<dyn TokenAuthenticator>>,
    /// After the privileged group (system:masters), which is always first.
    pub authorizers: Vec<std::sync::Arc<dyn Authorizer>>,
    pub reviews: Vec<std::sync::Arc<dyn Review>>,
}

impl Auth {
    /// Authenticates a bearer token with each token authenticator in turn.
    pub async fn authenticate_token(&self, token: &str, audiences: &[String]) -> TokenResult {
        let mut result = TokenResult::NotMine;
        for a in &self.tokens {
            match a.authenticate(token, audiences).await {
                TokenResult::NotMine => {}
                TokenResult::Invalid(why) => result = TokenResult::Invalid(why),
                ok @ TokenResult::User(..) => return ok,
            }
        }
        result
    }

    /// The chain's decision: members of `system:masters` may do anything; then each
    /// authorizer in order, the first that allows or denies deciding.
    pub fn authorize(&self, attrs: &Attributes) -> Decision {
        authorize_with(&self.authorizers, attrs)
    }
}

/// The authorizer chain's decision for `attrs`: members of `system:masters` may do
/// anything; then each authorizer in order, the first that allows or denies deciding. Also
/// what admission plugins that authorize (CertificateApproval, ...) ask.
pub fn authorize_with(
    authorizers: &[std::sync::Arc<dyn Authorizer>],
    attrs: &Attributes,
) -> Decision {
    if attrs.user.in_group(names::MASTERS) {
        return Decision::Allow(String::new());
    }
    let mut reasons = Vec::new();
    for a in authorizers {
        match a.authorize(attrs) {
            Decision::NoOpinion(r) => {
                if !r.is_empty() {
                    reasons.push(r)
                }
            }
            d => return d,
        }
    }
    Decision::NoOpinion(reasons.join("\n"))
}

/// The paths anonymous requests may reach (kube-apiserver's anonymous authenticator
/// configured for health endpoints, and /version which RBAC opens to everyone).
pub fn anonymous_allowed(path: &str) -> bool {
    let p = path.trim_end_matches('/');
    matches!(p, "/healthz" | "/livez" | "/readyz" | "/version")
        || p.starts_with("/healthz/")
        || p.starts_with("/livez/")
        || p.starts_with("/readyz/")
}
