//! ephemeral-volume-controller: a pod's generic ephemeral volume gets its claim
//! `<pod>-<volume>`, made from the volume's claim template and owned by the pod (so it goes
//! with it). A claim of that name the pod does not own is an error on the pod
//! (`FailedBinding`), as upstream reports it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_already_exists, message};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

use super::replicaset::record_event;

const SERVICE_ACCOUNT: &str = "ephemeral-volume-controller";
/// Its events' component.
pub const COMPONENT: &str = "ephemeral_volume";

struct Ctl {
    client: ClientSource,
    pods: Arc<Informer<Pod>>,
    claims: Arc<Informer<PersistentVolumeClaim>>,
}

fn has_ephemeral(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.ephemeral.is_some()))
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("ephemeral_volume");
    let pods = factory.informer::<Pod>();
    let claims = factory.informer::<PersistentVolumeClaim>();
    let q = queue.clone();
    pods.add_handler(move |c| {
        if let Change::Added(p) | Change::Updated { new: p, .. } = c {
            if has_ephemeral(p) && p.metadata.deletion_timestamp.is_none() {
                q.add(key_of(p));
            }
        }
    });
    let (q, pods2) = (queue.clone(), pods.clone());
    claims.add_handler(move |c| {
        // A claim of a pod's that went away is made again.
        if let Change::Deleted(claim) = c {
            for o in claim.metadata.owner_references.iter().flatten() {
                if o.kind == "Pod" {
                    let key = format!(
                        "{}/{}",
                        claim.metadata.namespace.as_deref().unwrap_or(""),
                        o.name
                    );
                    if pods2.get(&key).is_some() {
                        q.add(key);
                    }
                }
            }
        }
    });
    tokio::spawn(async move {
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            pods,
            claims,
        });
        let synced = async {
            ctl.pods.wait_synced().await;
            ctl.claims.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let tasks = run_workers_of(
            "ephemeral_volume",
            queue,
            1,
            stop,
            &ctl,
            |c, key| async move { c.sync(&key).await },
        );
        futures::future::join_all(tasks).await;
    })
}

impl Ctl {
    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let Some(pod) = self.pods.get(key) else {
            return Ok(());
        };
        if pod.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        for v in pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
        {
            let Some(eph) = &v.ephemeral else { continue };
            let claim_name = format!("{name}-{}", v.name);
            if let Some(existing) = self.claims.get(&format!("{ns}/{claim_name}")) {
                let owned = existing
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| {
                        Some(&o.uid) == pod.metadata.uid.as_ref() && o.controller == Some(true)
                    });
                if !owned {
                    let msg = format!(
                        "ephemeral volume {}: PVC {ns}/{claim_name} was not created for pod {ns}/{name} (pod is not owner)",
                        v.name
                    );
                    record_event(
                        &self.client,
                        COMPONENT,
                        &*pod,
                        "Warning",
                        "FailedBinding",
                        msg.clone(),
                    )
                    .await;
                    return Err(SyncError::Failed(msg));
                }
                continue;
            }
            let Some(template) = &eph.volume_claim_template else {
                continue;
            };
            let meta = template.metadata.clone().unwrap_or_default();
            let claim = json!({
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": claim_name,
                    "namespace": ns,
                    "labels": meta.labels,
                    "annotations": meta.annotations,
                    "ownerReferences": [{
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": name,
                        "uid": pod.metadata.uid,
                        "controller": true,
                        "blockOwnerDeletion": true,
                    }],
                },
                "spec": template.spec,
            });
            let claim: PersistentVolumeClaim =
                serde_json::from_value(claim).map_err(|e| SyncError::Failed(e.to_string()))?;
            let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.get(), &ns);
            match api.create(&PostParams::default(), &claim).await {
                Ok(_) => {}
                Err(e) if is_already_exists(&e) => {}
                Err(e) => {
                    let msg = format!(
                        "ephemeral volume {}: create PVC {claim_name}: {}",
                        v.name,
                        message(&e)
                    );
                    record_event(
                        &self.client,
                        COMPONENT,
                        &*pod,
                        "Warning",
                        "FailedBinding",
                        msg.clone(),
                    )
                    .await;
                    return Err(SyncError::Failed(msg));
                }
            }
        }
        Ok(())
    }
}
