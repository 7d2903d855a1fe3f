//! clusterrole-aggregation-controller: a ClusterRole with an aggregationRule gets, as its
//! rules, the rules of the ClusterRoles its clusterRoleSelectors match (selector by
//! selector, roles by name, each rule once), written with server-side apply as the field
//! manager `clusterrole-aggregation-controller` when they differ.

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::informer::{Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

/// The field manager of the aggregated rules.
pub const FIELD_MANAGER: &str = "clusterrole-aggregation-controller";

struct Ctl {
    client: ClientSource,
    roles: Arc<Informer<ClusterRole>>,
}

/// Registers the handlers and returns the controller task (workers start once the cache synced).
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("ClusterRoleAggregator");
    let roles = factory.informer::<ClusterRole>();
    let q = queue.clone();
    let weak = Arc::downgrade(&roles);
    // Any change to any ClusterRole may change what any aggregated role selects.
    roles.add_handler(move |_| {
        let Some(roles) = weak.upgrade() else { return };
        for r in roles.list() {
            if r.aggregation_rule.is_some() {
                if let Some(n) = &r.metadata.name {
                    q.add(n.clone());
                }
            }
        }
    });
    tokio::spawn(async move {
        tracing::info!("Starting ClusterRoleAggregator controller");
        let Some(client) =
            client_for(&clients, "clusterrole-aggregation-controller", &mut stop).await
        else {
            return;
        };
        let ctl = Arc::new(Ctl { client, roles });
        if !wait_for_sync(&mut stop, ctl.roles.wait_synced()).await {
            return;
        }
        let tasks = run_workers_of(
            "clusterrole-aggregation",
            queue,
            5,
            stop,
            &ctl,
            |c, key| async move { c.sync(&key).await },
        );
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down ClusterRoleAggregator controller");
    })
}

impl Ctl {
    async fn sync(&self, name: &str) -> Result<(), SyncError> {
        let Some(role) = self.roles.get(name) else {
            return Ok(());
        };
        let Some(rule) = &role.aggregation_rule else {
            return Ok(());
        };
        let all = self.roles.list();
        let mut rules: Vec<PolicyRule> = Vec::new();
        for selector in rule.cluster_role_selectors.iter().flatten() {
            // The cache lists by key, which for cluster-scoped objects is the name.
            for other in &all {
                if other.metadata.name.as_deref() == Some(name) {
                    continue;
                }
                let labels = other.metadata.labels.clone().unwrap_or_default();
                if !matches(selector, &labels).map_err(SyncError::Failed)? {
                    continue;
                }
                for r in other.rules.iter().flatten() {
                    if !rules.iter().any(|have| same_rule(have, r)) {
                        rules.push(r.clone());
                    }
                }
            }
        }
        let current = role.rules.as_deref().unwrap_or_default();
        if current.len() == rules.len() && current.iter().zip(&rules).all(|(a, b)| same_rule(a, b))
        {
            return Ok(());
        }
        let body = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": rules,
        });
        let api: Api<ClusterRole> = Api::all(self.client.get());
        api.patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
        Ok(())
    }
}

/// Semantic equality of two rules (a missing list equals an empty one).
fn same_rule(a: &PolicyRule, b: &PolicyRule) -> bool {
    fn l(v: &Option<Vec<String>>) -> &[String] {
        v.as_deref().unwrap_or_default()
    }
    a.verbs == b.verbs
        && l(&a.api_groups) == l(&b.api_groups)
        && l(&a.resources) == l(&b.resources)
        && l(&a.resource_names) == l(&b.resource_names)
        && l(&a.non_resource_urls) == l(&b.non_resource_urls)
}

/// Whether `labels` match `sel` (metav1.LabelSelectorAsSelector; an empty selector
/// matches everything). Errors are upstream's messages for invalid requirements.
pub fn matches(
    sel: &LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<bool, String> {
    for (k, v) in sel.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return Ok(false);
        }
    }
    for req in sel.match_expressions.iter().flatten() {
        let values = req.values.as_deref().unwrap_or_default();
        let have = labels.get(&req.key);
        let ok = match req.operator.as_str() {
            "In" | "NotIn" => {
                if values.is_empty() {
                    return Err(
                        "values: Invalid value: []string{}: for 'in', 'notin' operators, values set can't be empty"
                            .into(),
                    );
                }
                let found = have.is_some_and(|h| values.contains(h));
                if req.operator == "In" {
                    found
                } else {
                    !found
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    return Err(format!(
                        "values: Invalid value: {values:?}: values set must be empty for exists and does not exist"
                    ));
                }
                have.is_some() == (req.operator == "Exists")
            }
            op => return Err(format!("{op:?} is not a valid label selector operator")),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use std::collections::BTreeMap;

    #[test]
    fn selector_matching() {
        let labels = BTreeMap::from([("a".to_string(), "1".to_string())]);
        let mut sel = LabelSelector {
            match_labels: Some(BTreeMap::from([("a".to_string(), "1".to_string())])),
            ..Default::default()
        };
        assert_eq!(matches(&sel, &labels), Ok(true));
        sel.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "b".into(),
            operator: "Exists".into(),
            values: None,
        }]);
        assert_eq!(matches(&sel, &labels), Ok(false));
        sel.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "a".into(),
            operator: "Bogus".into(),
            values: None,
        }]);
        assert!(matches(&sel, &labels).is_err());
        assert_eq!(matches(&LabelSelector::default(), &labels), Ok(true));
    }

    #[test]
    fn rules_compare_semantically() {
        let a = PolicyRule {
            verbs: vec!["get".into()],
            api_groups: Some(vec![]),
            ..Default::default()
        };
        let b = PolicyRule {
            verbs: vec!["get".into()],
            ..Default::default()
        };
        assert!(same_rule(&a, &b));
        let c = PolicyRule {
            verbs: vec!["list".into()],
            ..Default::default()
        };
        assert!(!same_rule(&a, &c));
    }
}
