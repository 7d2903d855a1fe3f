//! A request's attributes for authorization, read from its method, path and query as
//! upstream's RequestInfoFactory reads them.

use std::collections::BTreeMap;

use super::UserInfo;

/// What a request is about: a resource (`/api/v1/namespaces/ns/pods/x/log`) or a plain
/// path (`/healthz`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    pub resource_request: bool,
    pub path: String,
    /// get, list, watch, create, update, patch, delete, deletecollection; for a path, the
    /// lower-case method.
    pub verb: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// The raw `fieldSelector` of a list or watch (the Node authorizer allows a kubelet's
    /// `spec.nodeName=<node>` lists).
    pub field_selector: String,
}

/// A request as the authorizers see it: who, and what.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    pub user: UserInfo,
    pub verb: String,
    pub resource_request: bool,
    pub path: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// The raw field selector of a list or watch ("" when none).
    pub field_selector: String,
}

impl Attributes {
    /// The attributes of `info` for `user`.
    pub fn new(user: UserInfo, info: &RequestInfo) -> Attributes {
        Attributes {
            user,
            verb: info.verb.clone(),
            resource_request: info.resource_request,
            path: info.path.clone(),
            api_group: info.api_group.clone(),
            api_version: info.api_version.clone(),
            namespace: info.namespace.clone(),
            resource: info.resource.clone(),
            subresource: info.subresource.clone(),
            name: info.name.clone(),
            field_selector: info.field_selector.clone(),
        }
    }
}

/// Subresources of a namespace that make `/namespaces/<ns>/<x>` a namespace's
/// subresource rather than a namespaced resource.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

impl RequestInfo {
    /// Reads `method`, `path` and `query` as kube-apiserver does.
    pub fn parse(method: &str, path: &str, query: &BTreeMap<String, String>) -> RequestInfo {
        let non_resource = || RequestInfo {
            resource_request: false,
            path: path.to_owned(),
            verb: method.to_lowercase(),
            ..Default::default()
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, mut rest): (&str, &str, &[&str]) = match parts.as_slice() {
            ["api", v, rest @ ..] => ("", v, rest),
            ["apis", g, v, rest @ ..] => (g, v, rest),
            _ => return non_resource(),
        };
        if rest.is_empty() {
            // /api/v1 and /apis/g/v are discovery documents.
            return non_resource();
        }
        let mut info = RequestInfo {
            resource_request: true,
            path: path.to_owned(),
            api_group: group.to_owned(),
            api_version: version.to_owned(),
            ..Default::default()
        };
        info.verb = match method {
            "POST" => "create",
            "GET" | "HEAD" => "get",
            "PUT" => "update",
            "PATCH" => "patch",
            "DELETE" => "delete",
            "OPTIONS" => "options",
            other => {
                return RequestInfo {
                    verb: other.to_lowercase(),
                    ..info
                }
            }
        }
        .to_owned();
        // The deprecated /watch/ prefix.
        if rest.first() == Some(&"watch") {
            info.verb = "watch".into();
            rest = &rest[1..];
            if rest.is_empty() {
                return info;
            }
        }
        if rest[0] == "namespaces" {
            if let Some(ns) = rest.get(1) {
                info.namespace = (*ns).to_owned();
                if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
                    rest = &rest[2..];
                }
            }
        }
        info.resource = rest.first().copied().unwrap_or_default().to_owned();
        info.name = rest.get(1).copied().unwrap_or_default().to_owned();
        info.subresource = rest.get(2).copied().unwrap_or_default().to_owned();
        if info.name.is_empty() && info.verb == "get" {
            let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
            info.verb = if watching || info.verb == "watch" {
                "watch"
            } else {
                "list"
            }
            .into();
        }
        if info.name.is_empty() && info.verb == "delete" {
            info.verb = "deletecollection".into();
        }
        if matches!(info.verb.as_str(), "list" | "watch" | "deletecollection") {
            info.field_selector = query.get("fieldSelector").cloned().unwrap_or_default();
        }
        // A list or watch of one object by name is authorized as that object.
        if matches!(info.verb.as_str(), "list" | "watch") && info.name.is_empty() {
            if let Some(sel) = query.get("fieldSelector") {
                for term in sel.split(',') {
                    let term = term.trim();
                    let value = term
                        .strip_prefix("metadata.name==")
                        .or_else(|| term.strip_prefix("metadata.name="));
                    if let Some(v) = value {
                        info.name = v.to_owned();
                    }
                }
            }
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(method: &str, path: &str, q: &[(&str, &str)]) -> RequestInfo {
        let q = q
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RequestInfo::parse(method, path, &q)
    }

    #[test]
    fn resources_and_paths() {
        let i = parse("GET", "/api/v1/namespaces/default/pods/web/log", &[]);
        assert_eq!(
            (i.verb.as_str(), i.namespace.as_str(), i.resource.as_str()),
            ("get", "default", "pods")
        );
        assert_eq!((i.name.as_str(), i.subresource.as_str()), ("web", "log"));
        let i = parse("GET", "/apis/apps/v1/deployments", &[("watch", "true")]);
        assert_eq!((i.verb.as_str(), i.api_group.as_str()), ("watch", "apps"));
        let i = parse("DELETE", "/api/v1/namespaces/x/configmaps", &[]);
        assert_eq!(i.verb, "deletecollection");
        let i = parse("PUT", "/api/v1/namespaces/x/finalize", &[]);
        assert_eq!(
            (i.resource.as_str(), i.name.as_str(), i.subresource.as_str()),
            ("namespaces", "x", "finalize")
        );
        assert_eq!(i.namespace, "x");
        let i = parse("GET", "/api/v1/namespaces/x", &[]);
        assert_eq!((i.resource.as_str(), i.name.as_str()), ("namespaces", "x"));
        let i = parse("GET", "/healthz", &[]);
        assert!(!i.resource_request);
        assert_eq!(i.verb, "get");
        let i = parse("GET", "/apis/apps/v1", &[]);
        assert!(!i.resource_request);
        let i = parse(
            "GET",
            "/api/v1/namespaces/a/secrets",
            &[("fieldSelector", "metadata.name=s")],
        );
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("list", "s"));
        let i = parse("GET", "/api/v1/watch/namespaces/a/pods", &[]);
        assert_eq!((i.verb.as_str(), i.resource.as_str()), ("watch", "pods"));
    }
}
