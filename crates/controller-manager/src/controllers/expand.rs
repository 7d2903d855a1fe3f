//! persistentvolume-expander-controller: a bound claim asking for more than its capacity
//! whose volume a CSI driver serves is the external resizer's to grow; the controller says
//! so on the claim (`ExternalExpanding`), once per new size, as upstream's does.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_apimachinery::quantity::Quantity;
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

use super::replicaset::record_event;

const SERVICE_ACCOUNT: &str = "expand-controller";
/// Its events' component.
pub const COMPONENT: &str = "volume_expand";

struct Ctl {
    client: ClientSource,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    volumes: Arc<Informer<PersistentVolume>>,
    /// The size each claim's event was given for.
    told: Mutex<HashMap<String, String>>,
}

fn sizes(c: &PersistentVolumeClaim) -> Option<(String, Quantity, Quantity)> {
    let want = c
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")?;
    let have = c.status.as_ref()?.capacity.as_ref()?.get("storage")?;
    Some((
        want.0.clone(),
        Quantity::parse(&want.0)?,
        Quantity::parse(&have.0)?,
    ))
}

/// Registers the handler and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("volume_expand");
    let claims = factory.informer::<PersistentVolumeClaim>();
    let volumes = factory.informer::<PersistentVolume>();
    let q = queue.clone();
    claims.add_handler(move |c| {
        if let Change::Added(v) | Change::Updated { new: v, .. } = c {
            if sizes(v).is_some_and(|(_, want, have)| want > have) {
                q.add(key_of(v));
            }
        }
    });
    tokio::spawn(async move {
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            claims,
            volumes,
            told: Mutex::new(HashMap::new()),
        });
        let synced = async {
            ctl.claims.wait_synced().await;
            ctl.volumes.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let tasks = run_workers_of("volume_expand", queue, 1, stop, &ctl, |c, key| async move {
            c.sync(&key).await
        });
        futures::future::join_all(tasks).await;
    })
}

impl Ctl {
    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let Some(c) = self.claims.get(key) else {
            self.told.lock().remove(key);
            return Ok(());
        };
        let Some((text, want, have)) = sizes(&c) else {
            return Ok(());
        };
        if want <= have || c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            return Ok(());
        }
        let pv = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        let csi = self
            .volumes
            .get(&pv)
            .is_some_and(|v| v.spec.as_ref().is_some_and(|s| s.csi.is_some()));
        if !csi || self.told.lock().get(key) == Some(&text) {
            return Ok(());
        }
        self.told.lock().insert(key.to_owned(), text);
        record_event(
            &self.client,
            COMPONENT,
            &*c,
            "Normal",
            "ExternalExpanding",
            "waiting for an external controller to expand this PVC".into(),
        )
        .await;
        Ok(())
    }
}
