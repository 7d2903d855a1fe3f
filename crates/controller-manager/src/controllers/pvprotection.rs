//! persistentvolume-protection-controller: a PersistentVolume being deleted keeps its
//! `kubernetes.io/pv-protection` finalizer while it is Bound to a claim and loses it
//! otherwise; a PV not being deleted that lacks the finalizer gets it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::pvcprotection::{deletion_candidate, needs_finalizer};
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::is_not_found;
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

const SERVICE_ACCOUNT: &str = "pv-protection-controller";
/// The finalizer the PersistentVolumeClaimProtection admission plugin adds to volumes.
pub const FINALIZER: &str = "kubernetes.io/pv-protection";

/// Whether a claim still holds the volume (upstream's isBeingUsed: phase Bound).
fn bound(pv: &PersistentVolume) -> bool {
    pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

struct Ctl {
    client: ClientSource,
    volumes: Arc<Informer<PersistentVolume>>,
}

/// Registers the handler and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("pvprotection");
    let volumes = factory.informer::<PersistentVolume>();
    let q = queue.clone();
    volumes.add_handler(move |c| {
        if let Change::Added(v) | Change::Updated { new: v, .. } = c {
            if deletion_candidate(&v.metadata, FINALIZER) || needs_finalizer(&v.metadata, FINALIZER)
            {
                q.add(key_of(v));
            }
        }
    });
    tokio::spawn(async move {
        tracing::info!("Starting PV protection controller");
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl { client, volumes });
        if !wait_for_sync(&mut stop, ctl.volumes.wait_synced()).await {
            return;
        }
        let tasks = run_workers_of("pvprotection", queue, 1, stop, &ctl, |c, key| async move {
            c.process(&key).await
        });
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down PV protection controller");
    })
}

impl Ctl {
    async fn process(&self, key: &str) -> Result<(), SyncError> {
        let Some(pv) = self.volumes.get(key) else {
            return Ok(());
        };
        let mut v = (*pv).clone();
        if deletion_candidate(&pv.metadata, FINALIZER) {
            if bound(&pv) {
                return Ok(());
            }
            if let Some(f) = v.metadata.finalizers.as_mut() {
                f.retain(|x| x != FINALIZER);
            }
        } else if needs_finalizer(&pv.metadata, FINALIZER) {
            v.metadata
                .finalizers
                .get_or_insert_with(Vec::new)
                .push(FINALIZER.to_owned());
        } else {
            return Ok(());
        }
        let api: Api<PersistentVolume> = Api::all(self.client.get());
        match api.replace(key, &PostParams::default(), &v).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeStatus;

    #[test]
    fn only_bound_volumes_are_in_use() {
        let mut pv = PersistentVolume::default();
        assert!(!bound(&pv));
        pv.status = Some(PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        });
        assert!(!bound(&pv));
        pv.status = Some(PersistentVolumeStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        });
        assert!(bound(&pv));
    }
}
