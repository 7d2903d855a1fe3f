//! RBAC's privilege-escalation prevention: a user may create or update a Role or
//! ClusterRole only with rules they already hold (or with the `escalate` verb on it), and
//! a binding only to a role whose rules they hold (or with the `bind` verb on it), as
//! upstream's RBAC storage enforces. It runs as an admission plugin in the validating
//! phase, after the object is valid.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use kumo_apimachinery::status::{ApiError, GroupResource};
use serde_json::Value;

use super::rbac::{Rbac, Rule};
use super::{names, Attributes, Authorizer, Decision, UserInfo};
use crate::admission::{self, Operation, Plugin};

const GROUP: &str = "rbac.authorization.k8s.io";

/// The escalation check of the four RBAC resources.
pub struct Escalation {
    pub rbac: Arc<Rbac>,
}

/// One verb on one resource (or URL), the unit rules are compared in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Atom {
    group: String,
    resource: String,
    name: Option<String>,
    url: Option<String>,
    verb: String,
}

fn atoms(rule: &Rule) -> Vec<Atom> {
    let mut out = Vec::new();
    for verb in &rule.verbs {
        for url in &rule.non_resource_urls {
            out.push(Atom {
                group: String::new(),
                resource: String::new(),
                name: None,
                url: Some(url.clone()),
                verb: verb.clone(),
            });
        }
        for group in &rule.api_groups {
            for resource in &rule.resources {
                let names: Vec<Option<String>> = if rule.resource_names.is_empty() {
                    vec![None]
                } else {
                    rule.resource_names.iter().cloned().map(Some).collect()
                };
                for name in names {
                    out.push(Atom {
                        group: group.clone(),
                        resource: resource.clone(),
                        name,
                        url: None,
                        verb: verb.clone(),
                    });
                }
            }
        }
    }
    out
}

/// Whether an owner's rule covers one atom (upstream's `ruleCovers`).
fn covers(owner: &Rule, a: &Atom) -> bool {
    if !owner.verbs.iter().any(|v| v == "*" || *v == a.verb) {
        return false;
    }
    if let Some(url) = &a.url {
        return owner.non_resource_urls.iter().any(|u| {
            u == "*" || u == url || u.strip_suffix('*').is_some_and(|p| url.starts_with(p))
        });
    }
    if !owner.api_groups.iter().any(|g| g == "*" || *g == a.group) {
        return false;
    }
    let resource_ok = owner.resources.iter().any(|r| {
        r == "*"
            || *r == a.resource
            || a.resource
                .split_once('/')
                .is_some_and(|(res, sub)| *r == format!("{res}/*") || *r == format!("*/{sub}"))
    });
    if !resource_ok {
        return false;
    }
    owner.resource_names.is_empty()
        || a.name
            .as_ref()
            .is_some_and(|n| owner.resource_names.contains(n))
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn quoted(items: &[String]) -> String {
    let parts: Vec<String> = items
        .iter()
        .map(|s| serde_json::to_string(s).unwrap_or_default())
        .collect();
    format!("[{}]", parts.join(" "))
}

/// The missing atoms, compacted into rules that differ only in verbs, each printed as
/// upstream's `CompactString`, sorted.
fn describe_missing(missing: &[Atom]) -> Vec<String> {
    let mut groups: Vec<(Atom, Vec<String>)> = Vec::new();
    for a in missing {
        let key = Atom {
            verb: String::new(),
            ..a.clone()
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, verbs)) => {
                if !verbs.contains(&a.verb) {
                    verbs.push(a.verb.clone())
                }
            }
            None => groups.push((key, vec![a.verb.clone()])),
        }
    }
    let set: BTreeSet<String> = groups
        .into_iter()
        .map(|(k, verbs)| {
            let mut parts = Vec::new();
            match &k.url {
                Some(url) => parts.push(format!(
                    "NonResourceURLs:{}",
                    quoted(std::slice::from_ref(url))
                )),
                None => {
                    parts.push(format!(
                        "APIGroups:{}",
                        quoted(std::slice::from_ref(&k.group))
                    ));
                    parts.push(format!(
                        "Resources:{}",
                        quoted(std::slice::from_ref(&k.resource))
                    ));
                    if let Some(n) = &k.name {
                        parts.push(format!("ResourceNames:{}", quoted(std::slice::from_ref(n))));
                    }
                }
            }
            parts.push(format!("Verbs:{}", quoted(&verbs)));
            format!("{{{}}}", parts.join(", "))
        })
        .collect();
    set.into_iter().collect()
}

fn rules_of(obj: &Value) -> Vec<Rule> {
    obj.get("rules")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(Rule::from_json).collect())
        .unwrap_or_default()
}

impl Escalation {
    /// Whether `user` may `verb` (escalate, bind) the role `resource`/`name`.
    fn authorized(
        &self,
        user: &UserInfo,
        verb: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> bool {
        let attrs = Attributes {
            user: user.clone(),
            verb: verb.into(),
            resource_request: true,
            api_group: GROUP.into(),
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        };
        matches!(self.rbac.authorize(&attrs), Decision::Allow(_))
    }

    /// Upstream's ConfirmNoEscalation: every rule must be covered by the user's own rules
    /// in `namespace`.
    fn confirm_no_escalation(
        &self,
        user: &UserInfo,
        namespace: &str,
        gr: &GroupResource,
        name: &str,
        rules: &[Rule],
    ) -> Result<(), ApiError> {
        let (owned, errors) = self.rbac.rules_of_user(user, namespace);
        let missing: Vec<Atom> = rules
            .iter()
            .flat_map(atoms)
            .filter(|a| !owned.iter().any(|o| covers(o, a)))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut why = format!(
            "user \"{}\" (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
            user.name,
            quoted(&user.groups),
            describe_missing(&missing).join("\n")
        );
        if !errors.is_empty() {
            why.push_str(&format!("; resolution errors: [{}]", errors.join(" ")));
        }
        Err(ApiError::forbidden(gr, name, &why))
    }
}

#[async_trait]
impl Plugin for Escalation {
    fn name(&self) -> &'static str {
        "RBACEscalationPrevention"
    }

    async fn validate(
        &self,
        a: &admission::Attributes<'_>,
        obj: Option<&Value>,
    ) -> Result<(), ApiError> {
        let (Some(obj), true) = (obj, a.resource.group == GROUP) else {
            return Ok(());
        };
        if !matches!(a.operation, Operation::Create | Operation::Update) || a.subresource.is_some()
        {
            return Ok(());
        }
        let user = a.user;
        if user.in_group(names::MASTERS) {
            return Ok(());
        }
        let namespace = a.namespace.unwrap_or("");
        let gr = GroupResource::new(GROUP, a.resource.plural);
        // Only the fields the garbage collector changes: nothing is granted.
        if let Some(old) = a.old {
            let strip = |v: &Value| {
                let mut v = v.clone();
                if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                    for k in [
                        "ownerReferences",
                        "finalizers",
                        "resourceVersion",
                        "managedFields",
                    ] {
                        m.remove(k);
                    }
                }
                v
            };
            if strip(old) == strip(obj) {
                return Ok(());
            }
        }
        match a.resource.plural {
            "roles" | "clusterroles" => {
                if self.authorized(user, "escalate", a.resource.plural, namespace, a.name) {
                    return Ok(());
                }
                self.confirm_no_escalation(user, namespace, &gr, a.name, &rules_of(obj))
            }
            "rolebindings" | "clusterrolebindings" => {
                let kind = crate::registry::str_at(obj, "/roleRef/kind");
                let role = crate::registry::str_at(obj, "/roleRef/name");
                let role_resource = if kind == "Role" {
                    "roles"
                } else {
                    "clusterroles"
                };
                if self.authorized(user, "bind", role_resource, namespace, role) {
                    return Ok(());
                }
                let Some(rules) = self.rbac.role_rules(kind, namespace, role) else {
                    // Upstream answers NotFound with the binding's resource and the role's
                    // name.
                    return Err(ApiError::not_found(&gr, role));
                };
                self.confirm_no_escalation(user, namespace, &gr, a.name, &rules)
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn coverage_and_messages() {
        let owner = Rule::from_json(
            &json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/*", "configmaps"]}),
        );
        let want = Rule::from_json(
            &json!({"verbs": ["get", "list"], "apiGroups": ["", "apps"], "resources": ["pods/log", "configmaps"]}),
        );
        let missing: Vec<Atom> = atoms(&want)
            .into_iter()
            .filter(|a| !covers(&owner, a))
            .collect();
        assert_eq!(
            describe_missing(&missing),
            vec![
                "{APIGroups:[\"\"], Resources:[\"configmaps\"], Verbs:[\"list\"]}",
                "{APIGroups:[\"\"], Resources:[\"pods/log\"], Verbs:[\"list\"]}",
                "{APIGroups:[\"apps\"], Resources:[\"configmaps\"], Verbs:[\"get\" \"list\"]}",
                "{APIGroups:[\"apps\"], Resources:[\"pods/log\"], Verbs:[\"get\" \"list\"]}",
            ]
        );
        let named = Rule::from_json(
            &json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["a"]}),
        );
        let a = &atoms(&Rule::from_json(
            &json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"]}),
        ))[0];
        assert!(!covers(&named, a), "a named rule does not cover all names");
        let urls = Rule::from_json(&json!({"verbs": ["get"], "nonResourceURLs": ["/logs/*"]}));
        let a = &atoms(&Rule::from_json(
            &json!({"verbs": ["get"], "nonResourceURLs": ["/logs/x"]}),
        ))[0];
        assert!(covers(&urls, a));
    }
}
