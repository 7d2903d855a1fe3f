//! The RBAC authorizer: Roles, ClusterRoles and their bindings, read from in-memory
//! mirrors of the stored objects, evaluated as upstream's `rbac.RBACAuthorizer` does
//! (ClusterRoleBindings first, then the RoleBindings of the request's namespace; the
//! first rule that allows wins; nothing denies).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kumo_storage::{StorageError, Store};
use serde_json::{json, Value};

use super::{names, Attributes, Authorizer, Decision, RuleList, UserInfo};
use crate::mirror::Mirror;

/// One PolicyRule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

impl Rule {
    /// A PolicyRule's JSON.
    pub fn from_json(v: &Value) -> Rule {
        Rule {
            verbs: strings(v.get("verbs")),
            api_groups: strings(v.get("apiGroups")),
            resources: strings(v.get("resources")),
            resource_names: strings(v.get("resourceNames")),
            non_resource_urls: strings(v.get("nonResourceURLs")),
        }
    }

    /// Whether the rule allows the request (upstream's `RuleAllows`).
    pub fn allows(&self, a: &Attributes) -> bool {
        let verb_ok = self.verbs.iter().any(|v| v == "*" || *v == a.verb);
        if !verb_ok {
            return false;
        }
        if !a.resource_request {
            return self.non_resource_urls.iter().any(|u| {
                u == "*"
                    || *u == a.path
                    || u.strip_suffix('*').is_some_and(|p| a.path.starts_with(p))
            });
        }
        let group_ok = self
            .api_groups
            .iter()
            .any(|g| g == "*" || *g == a.api_group);
        if !group_ok {
            return false;
        }
        let combined = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let resource_ok = self.resources.iter().any(|r| {
            r == "*"
                || *r == combined
                // "*/scale" matches every resource's scale subresource, "pods/*" every
                // subresource of pods.
                || (!a.subresource.is_empty()
                    && (*r == format!("*/{}", a.subresource)
                        || *r == format!("{}/*", a.resource)))
        });
        if !resource_ok {
            return false;
        }
        self.resource_names.is_empty() || self.resource_names.contains(&a.name)
    }

    /// As a SelfSubjectRulesReview lists it.
    fn to_review_json(&self) -> (bool, Value) {
        if !self.non_resource_urls.is_empty() {
            return (
                false,
                json!({"verbs": self.verbs, "nonResourceURLs": self.non_resource_urls}),
            );
        }
        let mut v =
            json!({"verbs": self.verbs, "apiGroups": self.api_groups, "resources": self.resources});
        if !self.resource_names.is_empty() {
            v["resourceNames"] = json!(self.resource_names);
        }
        (true, v)
    }
}

/// A subject of a binding.
#[derive(Clone, Debug)]
struct Subject {
    kind: String,
    name: String,
    namespace: String,
}

impl Subject {
    /// Upstream's `appliesToUser`.
    fn applies_to(&self, user: &UserInfo) -> bool {
        match self.kind.as_str() {
            "User" => self.name == user.name,
            "Group" => user.in_group(&self.name),
            "ServiceAccount" => {
                !self.namespace.is_empty()
                    && user.name
                        == format!(
                            "{}{}:{}",
                            names::SERVICE_ACCOUNT_PREFIX,
                            self.namespace,
                            self.name
                        )
            }
            _ => false,
        }
    }

    fn describe(&self) -> String {
        if self.kind == "ServiceAccount" {
            format!("{} \"{}/{}\"", self.kind, self.namespace, self.name)
        } else {
            format!("{} \"{}\"", self.kind, self.name)
        }
    }
}

#[derive(Clone, Debug)]
struct Binding {
    name: String,
    role_kind: String,
    role_name: String,
    subjects: Vec<Subject>,
}

impl Binding {
    fn from_json(v: &Value) -> Binding {
        let subjects = v
            .get("subjects")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|s| Subject {
                        kind: s.get("kind").and_then(Value::as_str).unwrap_or("").into(),
                        name: s.get("name").and_then(Value::as_str).unwrap_or("").into(),
                        namespace: s
                            .get("namespace")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .into(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Binding {
            name: crate::registry::name_of(v).to_owned(),
            role_kind: crate::registry::str_at(v, "/roleRef/kind").to_owned(),
            role_name: crate::registry::str_at(v, "/roleRef/name").to_owned(),
            subjects,
        }
    }
}

/// What the mirrors hold, indexed for evaluation.
#[derive(Default)]
struct Index {
    cluster_roles: HashMap<String, Arc<Vec<Rule>>>,
    /// By (namespace, name).
    roles: HashMap<(String, String), Arc<Vec<Rule>>>,
    cluster_role_bindings: Vec<Binding>,
    /// By namespace.
    role_bindings: HashMap<String, Vec<Binding>>,
}

fn rules_of(obj: &Value) -> Arc<Vec<Rule>> {
    Arc::new(
        obj.get("rules")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(Rule::from_json).collect())
            .unwrap_or_default(),
    )
}

fn namespace_of(obj: &Value) -> String {
    crate::registry::str_at(obj, "/metadata/namespace").to_owned()
}

/// The RBAC authorizer.
pub struct Rbac {
    cluster_roles: Arc<Mirror>,
    roles: Arc<Mirror>,
    cluster_role_bindings: Arc<Mirror>,
    role_bindings: Arc<Mirror>,
    /// The index and the mirrors' generations it was built from.
    index: Mutex<(Vec<u64>, Arc<Index>)>,
}

/// Where a binding's rules came from, for the decision's reason.
struct Source<'a> {
    binding_kind: &'static str,
    binding: &'a Binding,
    namespace: &'a str,
}

impl Rbac {
    /// Starts mirroring the RBAC objects of `store`.
    pub async fn start(store: Arc<dyn Store>) -> Result<Arc<Rbac>, StorageError> {
        Ok(Arc::new(Rbac {
            cluster_roles: Mirror::start(store.clone(), "/registry/clusterroles/").await?,
            roles: Mirror::start(store.clone(), "/registry/roles/").await?,
            cluster_role_bindings: Mirror::start(store.clone(), "/registry/clusterrolebindings/")
                .await?,
            role_bindings: Mirror::start(store, "/registry/rolebindings/").await?,
            index: Mutex::new((Vec::new(), Arc::new(Index::default()))),
        }))
    }

    fn generations(&self) -> Vec<u64> {
        [
            &self.cluster_roles,
            &self.roles,
            &self.cluster_role_bindings,
            &self.role_bindings,
        ]
        .iter()
        .map(|m| m.generation())
        .collect()
    }

    /// The current index, rebuilt when a mirror changed since the last one.
    fn index(&self) -> Arc<Index> {
        let generations = self.generations();
        let mut guard = self.index.lock().unwrap_or_else(|e| e.into_inner());
        if guard.0 != generations {
            let mut ix = Index::default();
            self.cluster_roles.with(|m| {
                for obj in m.values() {
                    ix.cluster_roles
                        .insert(crate::registry::name_of(obj).to_owned(), rules_of(obj));
                }
            });
            self.roles.with(|m| {
                for obj in m.values() {
                    ix.roles.insert(
                        (namespace_of(obj), crate::registry::name_of(obj).to_owned()),
                        rules_of(obj),
                    );
                }
            });
            self.cluster_role_bindings.with(|m| {
                ix.cluster_role_bindings = m.values().map(Binding::from_json).collect();
            });
            self.role_bindings.with(|m| {
                for obj in m.values() {
                    ix.role_bindings
                        .entry(namespace_of(obj))
                        .or_default()
                        .push(Binding::from_json(obj));
                }
            });
            *guard = (generations, Arc::new(ix));
        }
        Arc::clone(&guard.1)
    }

    /// Visits the rules that apply to `user` in `namespace` ("" for cluster scope only),
    /// in upstream's order, until `visit` returns true. Missing roles are reported as
    /// errors, with upstream's wording.
    fn visit(
        &self,
        user: &UserInfo,
        namespace: &str,
        mut visit: impl FnMut(&Source<'_>, &Rule) -> bool,
    ) -> Vec<String> {
        let ix = self.index();
        let mut errors = Vec::new();
        for b in &ix.cluster_role_bindings {
            if !b.subjects.iter().any(|s| s.applies_to(user)) {
                continue;
            }
            let Some(rules) = (b.role_kind == "ClusterRole")
                .then(|| ix.cluster_roles.get(&b.role_name))
                .flatten()
            else {
                errors.push(format!(
                    "clusterrole.rbac.authorization.k8s.io \"{}\" not found",
                    b.role_name
                ));
                continue;
            };
            let src = Source {
                binding_kind: "ClusterRoleBinding",
                binding: b,
                namespace: "",
            };
            for r in rules.iter() {
                if visit(&src, r) {
                    return errors;
                }
            }
        }
        if namespace.is_empty() {
            return errors;
        }
        for b in ix.role_bindings.get(namespace).into_iter().flatten() {
            if !b.subjects.iter().any(|s| s.applies_to(user)) {
                continue;
            }
            let rules = match b.role_kind.as_str() {
                "ClusterRole" => ix.cluster_roles.get(&b.role_name),
                "Role" => ix.roles.get(&(namespace.to_owned(), b.role_name.clone())),
                _ => None,
            };
            let Some(rules) = rules else {
                let what = if b.role_kind == "Role" {
                    "role"
                } else {
                    "clusterrole"
                };
                errors.push(format!(
                    "{what}.rbac.authorization.k8s.io \"{}\" not found",
                    b.role_name
                ));
                continue;
            };
            let src = Source {
                binding_kind: "RoleBinding",
                binding: b,
                namespace,
            };
            for r in rules.iter() {
                if visit(&src, r) {
                    return errors;
                }
            }
        }
        errors
    }
}

impl Rbac {
    /// Every rule `user` holds in `namespace` (cluster-wide ones included), and the
    /// bindings whose role is missing.
    pub fn rules_of_user(&self, user: &UserInfo, namespace: &str) -> (Vec<Rule>, Vec<String>) {
        let mut rules = Vec::new();
        let errors = self.visit(user, namespace, |_, r| {
            rules.push(r.clone());
            false
        });
        (rules, errors)
    }

    /// The rules of a Role (in `namespace`) or ClusterRole, if it exists.
    pub fn role_rules(&self, kind: &str, namespace: &str, name: &str) -> Option<Vec<Rule>> {
        let ix = self.index();
        let rules = match kind {
            "Role" => ix.roles.get(&(namespace.to_owned(), name.to_owned())),
            "ClusterRole" => ix.cluster_roles.get(name),
            _ => None,
        }?;
        Some(rules.as_ref().clone())
    }
}

impl Authorizer for Rbac {
    fn authorize(&self, attrs: &Attributes) -> Decision {
        let mut reason = None;
        let errors = self.visit(&attrs.user, &attrs.namespace, |src, rule| {
            if !rule.allows(attrs) {
                return false;
            }
            let subject = src
                .binding
                .subjects
                .iter()
                .find(|s| s.applies_to(&attrs.user))
                .map(Subject::describe)
                .unwrap_or_default();
            let binding = if src.namespace.is_empty() {
                format!("{} \"{}\"", src.binding_kind, src.binding.name)
            } else {
                format!(
                    "{} \"{}/{}\"",
                    src.binding_kind, src.binding.name, src.namespace
                )
            };
            reason = Some(format!(
                "RBAC: allowed by {binding} of {} \"{}\" to {subject}",
                src.binding.role_kind, src.binding.role_name
            ));
            true
        });
        match reason {
            Some(r) => Decision::Allow(r),
            None if errors.is_empty() => Decision::NoOpinion(String::new()),
            None => Decision::NoOpinion(format!("RBAC: {}", errors.join(", "))),
        }
    }

    fn rules_for(&self, user: &UserInfo, namespace: &str) -> Option<RuleList> {
        let mut list = RuleList::default();
        let errors = self.visit(user, namespace, |_, rule| {
            let (resource, v) = rule.to_review_json();
            if resource {
                list.resource_rules.push(v);
            } else {
                list.non_resource_rules.push(v);
            }
            false
        });
        if !errors.is_empty() {
            list.incomplete = true;
            list.evaluation_error = errors.join(", ");
        }
        Some(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            api_group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn rule_matching() {
        let r = Rule::from_json(
            &json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "pods/log"]}),
        );
        assert!(r.allows(&attrs("get", "", "pods", "", "x")));
        assert!(r.allows(&attrs("get", "", "pods", "log", "x")));
        assert!(!r.allows(&attrs("get", "", "pods", "exec", "x")));
        assert!(!r.allows(&attrs("delete", "", "pods", "", "x")));
        assert!(!r.allows(&attrs("get", "apps", "pods", "", "x")));
        let r =
            Rule::from_json(&json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*/scale"]}));
        assert!(r.allows(&attrs("update", "apps", "deployments", "scale", "d")));
        assert!(!r.allows(&attrs("update", "apps", "deployments", "", "d")));
        let r = Rule::from_json(
            &json!({"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a"]}),
        );
        assert!(r.allows(&attrs("get", "", "configmaps", "", "a")));
        assert!(!r.allows(&attrs("get", "", "configmaps", "", "b")));
        assert!(!r.allows(&attrs("list", "", "configmaps", "", "")));
        let r = Rule::from_json(
            &json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/healthz/*"]}),
        );
        let path = |p: &str| Attributes {
            verb: "get".into(),
            path: p.into(),
            ..Default::default()
        };
        assert!(r.allows(&path("/healthz")));
        assert!(r.allows(&path("/healthz/etcd")));
        assert!(!r.allows(&path("/metrics")));
    }

    #[test]
    fn subjects() {
        let u = UserInfo::authenticated("system:serviceaccount:ns:sa", vec!["g".into()]);
        let s = |kind: &str, name: &str, ns: &str| Subject {
            kind: kind.into(),
            name: name.into(),
            namespace: ns.into(),
        };
        assert!(s("ServiceAccount", "sa", "ns").applies_to(&u));
        assert!(!s("ServiceAccount", "sa", "other").applies_to(&u));
        assert!(s("Group", "g", "").applies_to(&u));
        assert!(s("Group", "system:authenticated", "").applies_to(&u));
        assert!(!s("User", "sa", "").applies_to(&u));
    }
}
