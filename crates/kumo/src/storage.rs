//! The cloud's storage in the cluster, as a cloud's CSI add-on installs it: the
//! `disk.csi.kumo.dev` CSIDriver, the default StorageClass `standard`, the driver's
//! controller service (with its own cloud access key) on a socket in the data directory,
//! and the provisioner, attacher and resizer beside it as the user
//! `system:csi-kumo-controller`, whose ClusterRole holds only what those roles need. The
//! node plugins run beside each kubelet (see the hypervisor).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// The default StorageClass's name.
pub const DEFAULT_CLASS: &str = "standard";
/// The user the sidecars act as.
pub const USER: &str = "system:csi-kumo-controller";
const ROLE: &str = "kumo:csi-controller";

/// Where the driver's controller service listens.
pub fn controller_socket(data_dir: &Path) -> PathBuf {
    data_dir.join("csi").join("controller.sock")
}

fn role() -> serde_json::Value {
    let rule = |groups: &[&str], resources: &[&str], verbs: &[&str]| json!({"apiGroups": groups, "resources": resources, "verbs": verbs});
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": ROLE},
        "rules": [
            rule(&[""], &["persistentvolumes"], &["get", "list", "watch", "create", "update", "patch", "delete"]),
            rule(&[""], &["persistentvolumeclaims"], &["get", "list", "watch", "update", "patch"]),
            rule(&[""], &["persistentvolumeclaims/status"], &["update", "patch"]),
            rule(&[""], &["nodes"], &["get", "list", "watch"]),
            rule(&["storage.k8s.io"], &["storageclasses", "csinodes"], &["get", "list", "watch"]),
            rule(&["storage.k8s.io"], &["volumeattachments"], &["get", "list", "watch", "update", "patch"]),
            rule(&["storage.k8s.io"], &["volumeattachments/status"], &["update", "patch"]),
            rule(&["", "events.k8s.io"], &["events"], &["create", "update", "patch", "list", "watch"]),
        ],
    })
}

/// Installs the driver's objects and starts its controller service and sidecars (retried
/// in the background until the driver answers).
pub async fn start(
    data_dir: &Path,
    cloud_dir: &Path,
    cloud: &kumo_cloud::Client,
    admin: &kube::Client,
    server: &str,
) -> Result<()> {
    let pp = PatchParams::apply("kumo").force();
    let role: ClusterRole = serde_json::from_value(role())?;
    Api::<ClusterRole>::all(admin.clone())
        .patch(ROLE, &pp, &Patch::Apply(role))
        .await
        .context("installing the CSI controller's ClusterRole")?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .patch(ROLE, &pp, &Patch::Apply(binding))
        .await
        .context("installing the CSI controller's ClusterRoleBinding")?;
    let driver: CSIDriver = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": kumo_disk::DRIVER},
        "spec": {
            "attachRequired": true,
            "podInfoOnMount": false,
            "fsGroupPolicy": "ReadWriteOnceWithFSType",
            "volumeLifecycleModes": ["Persistent"],
        },
    }))?;
    Api::<CSIDriver>::all(admin.clone())
        .patch(kumo_disk::DRIVER, &pp, &Patch::Apply(driver))
        .await
        .context("installing the CSIDriver")?;
    // Only made once: a user may change or remove it, or mark another class default.
    let classes: Api<StorageClass> = Api::all(admin.clone());
    if classes
        .get_opt(DEFAULT_CLASS)
        .await
        .context("reading the default StorageClass")?
        .is_none()
    {
        let class: StorageClass = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": DEFAULT_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": kumo_disk::DRIVER,
            "parameters": {"csi.storage.k8s.io/fstype": "ext4"},
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": true,
        }))?;
        match classes.create(&Default::default(), &class).await {
            Ok(_) => {}
            Err(e) if kumo_client::error::is_already_exists(&e) => {}
            Err(e) => return Err(e).context("creating the default StorageClass"),
        }
    }
    let (csi_cloud, _) = crate::cluster::cloud_credentials(
        cloud_dir,
        cloud,
        &data_dir.join("csi").join("cloud.json"),
        "csi-controller",
    )
    .await?;
    let socket = controller_socket(data_dir);
    let services = kumo_csi::endpoint::Services {
        identity: kumo_disk::Identity { controller: true },
        controller: Some(kumo_disk::Controller::new(csi_cloud)),
        node: None::<kumo_disk::Node>,
    };
    let s = socket.clone();
    tokio::spawn(async move {
        if let Err(e) = kumo_csi::serve(&s, services, std::future::pending()).await {
            tracing::error!(error = %e, "the CSI controller service stopped");
        }
    });
    let kubeconfig =
        kumo_apiserver::pki::user_kubeconfig(data_dir, "csi-controller.conf", USER, server)
            .context("the CSI controller's kubeconfig")?;
    tokio::spawn(async move {
        loop {
            match crate::hypervisor::kube_client(&kubeconfig).await {
                Ok(client) => {
                    let (_keep, stop) = tokio::sync::watch::channel(false);
                    kumo_csi::sidecar::run(client, socket.clone(), stop).await;
                    tracing::warn!("the CSI sidecars stopped; restarting");
                }
                Err(e) => tracing::warn!(error = %e, "the CSI sidecars' client"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    Ok(())
}
