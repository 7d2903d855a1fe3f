//! The RBAC the cloud-controller-manager acts under, as cloud providers ship it next to
//! their CCM: ClusterRole `system:cloud-controller-manager` bound to the user
//! `system:cloud-controller-manager` (the identity of kubeadm-style
//! `cloud-controller-manager.conf`). The rules are upstream's addon role
//! (cluster/addons/cloud-controller-manager) plus what its controllers write and that role
//! leaves out: Service finalizers and status, Node deletion, route conditions.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::json;

/// The ClusterRole's and the user's name.
pub const NAME: &str = "system:cloud-controller-manager";

/// The ClusterRole.
pub fn cluster_role() -> ClusterRole {
    let rule = |groups: &[&str], resources: &[&str], verbs: &[&str]| json!({"apiGroups": groups, "resources": resources, "verbs": verbs});
    let v = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NAME},
        "rules": [
            rule(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]),
            rule(&["coordination.k8s.io"], &["leases"], &["create"]),
            json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                   "resourceNames": ["cloud-controller-manager"], "verbs": ["get", "update"]}),
            rule(&[""], &["endpoints", "serviceaccounts"], &["create", "get", "update"]),
            rule(&[""], &["nodes"], &["get", "update", "patch", "delete"]),
            rule(&[""], &["nodes/status"], &["patch", "update"]),
            rule(&[""], &["services"], &["get", "update", "patch"]),
            rule(&[""], &["services/status"], &["patch", "update"]),
            rule(&[""], &["namespaces", "configmaps"], &["get"]),
            rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
            rule(&["authorization.k8s.io"], &["subjectaccessreviews"], &["create"]),
            rule(&[""], &["serviceaccounts/token"], &["create"]),
            rule(&["*"], &["*"], &["list", "watch"]),
        ],
    });
    serde_json::from_value(v).unwrap_or_default()
}

/// The binding of the ClusterRole to the user `system:cloud-controller-manager`.
pub fn cluster_role_binding() -> ClusterRoleBinding {
    let v = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": NAME}],
    });
    serde_json::from_value(v).unwrap_or_default()
}

/// Creates or updates both with server-side apply (an installer's step, done with admin
/// credentials).
pub async fn ensure(client: &Client) -> Result<(), kube::Error> {
    let pp = PatchParams::apply("kumo").force();
    Api::<ClusterRole>::all(client.clone())
        .patch(NAME, &pp, &Patch::Apply(cluster_role()))
        .await?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(NAME, &pp, &Patch::Apply(cluster_role_binding()))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_and_binding_decode() {
        let role = cluster_role();
        assert_eq!(role.metadata.name.as_deref(), Some(NAME));
        assert_eq!(role.rules.as_ref().map(Vec::len), Some(13));
        let binding = cluster_role_binding();
        assert_eq!(binding.role_ref.name, NAME);
        assert_eq!(binding.subjects.as_ref().map(Vec::len), Some(1));
    }
}
