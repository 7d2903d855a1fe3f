//! A ClusterRole and its binding to one user, as an installer writes them.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};

use crate::Error;

/// Applies ClusterRole `name` with `rules` and binds it to `user`.
pub async fn ensure_cluster_role(
    admin: &kube::Client,
    name: &str,
    user: &str,
    rules: Value,
) -> Result<(), Error> {
    let pp = PatchParams::apply("kumo").force();
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    roles
        .patch(
            name,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name}, "rules": rules,
            })),
        )
        .await?;
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    bindings
        .patch(
            name,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            })),
        )
        .await?;
    Ok(())
}
