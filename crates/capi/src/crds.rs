//! Installing Cluster API: its CRDs (upstream's v1beta2 schemas, see `scripts/gen-capi-crds`)
//! and the manager's ClusterRole, as `clusterctl init` would with admin credentials.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};

use crate::Error;

/// Upstream's CRDs, as `scripts/gen-capi-crds` writes them.
const CRDS: &[&str] = &[
    include_str!("../crds/cluster.x-k8s.io_clusters.json"),
    include_str!("../crds/cluster.x-k8s.io_machines.json"),
    include_str!("../crds/cluster.x-k8s.io_machinesets.json"),
    include_str!("../crds/cluster.x-k8s.io_machinedeployments.json"),
    include_str!("../crds/cluster.x-k8s.io_machinehealthchecks.json"),
    include_str!("../crds/cluster.x-k8s.io_machinepools.json"),
    include_str!("../crds/cluster.x-k8s.io_clusterclasses.json"),
    include_str!("../crds/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.json"),
    include_str!("../crds/controlplane.cluster.x-k8s.io_kubeadmcontrolplanetemplates.json"),
    include_str!("../crds/bootstrap.cluster.x-k8s.io_kubeadmconfigs.json"),
    include_str!("../crds/bootstrap.cluster.x-k8s.io_kubeadmconfigtemplates.json"),
];

/// The manager's user (its client certificate's CN) and ClusterRole.
pub const MANAGER_USER: &str = "system:capi-manager";
pub const MANAGER_ROLE: &str = "kumo:cluster-api-manager";

/// Applies every CRD in `crds` (server-side apply, field manager `field_manager`) and waits
/// until each is Established.
pub async fn apply_crds(
    client: &kube::Client,
    crds: &[Value],
    field_manager: &str,
) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(field_manager).force();
    let mut names = Vec::new();
    for crd in crds {
        let name = crd
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::Invalid("a CRD without a name".into()))?;
        let mut crd = crd.clone();
        crd["apiVersion"] = "apiextensions.k8s.io/v1".into();
        crd["kind"] = "CustomResourceDefinition".into();
        api.patch(name, &pp, &Patch::Apply(&crd)).await?;
        names.push(name.to_owned());
    }
    for name in names {
        for _ in 0..100 {
            let c = api.get(&name).await?;
            let established = c.status.and_then(|s| s.conditions).is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            if established {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// Installs Cluster API's CRDs and the manager's ClusterRole (bound to [`MANAGER_USER`]).
pub async fn install(admin: &kube::Client) -> Result<(), Error> {
    let crds: Vec<Value> = CRDS
        .iter()
        .map(|t| {
            serde_json::from_str(t).map_err(|e| Error::Invalid(format!("an embedded CRD: {e}")))
        })
        .collect::<Result<_, _>>()?;
    apply_crds(admin, &crds, "clusterctl").await?;
    let rules = json!([
        {"apiGroups": ["cluster.x-k8s.io", "controlplane.cluster.x-k8s.io",
                       "bootstrap.cluster.x-k8s.io", "infrastructure.cluster.x-k8s.io"],
         "resources": ["*"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["secrets"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
         "verbs": ["get", "list", "watch"]},
    ]);
    crate::rbac::ensure_cluster_role(admin, MANAGER_ROLE, MANAGER_USER, rules).await
}
