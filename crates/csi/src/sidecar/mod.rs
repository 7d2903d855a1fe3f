//! The roles of the upstream CSI sidecars beside a driver's controller service, as API
//! clients: `provisioner` (external-provisioner: claims handed to the driver become
//! volumes and PersistentVolumes; Released ones with reclaim policy Delete are deleted),
//! `attacher` (external-attacher: VolumeAttachments become ControllerPublish/Unpublish
//! calls, their status written back) and `resizer` (external-resizer: a bound claim asking
//! for more becomes ControllerExpandVolume and the node's file system resize request).
//! Each runs only if the driver's controller service says it has the capability; a driver
//! without attaching gets its VolumeAttachments marked attached, as the attacher's trivial
//! handler does.

pub mod attacher;
pub mod provisioner;
pub mod resizer;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kumo_client::informer::InformerFactory;
use tokio::sync::watch;

use crate::spec::{controller_service_capability, ControllerGetCapabilitiesRequest};
use crate::Client;

/// What every sidecar shares: the API client, the driver and its name.
#[derive(Clone)]
pub struct Context {
    /// The API client (the sidecars' own identity).
    pub client: kube::Client,
    /// The driver's controller endpoint.
    pub driver: Client,
    /// The driver's name.
    pub name: String,
}

impl Context {
    /// Records an event about `obj` from `component` (the sidecar's name).
    pub async fn event<K: kube::Resource<DynamicType = ()>>(
        &self,
        component: &str,
        obj: &K,
        type_: &str,
        reason: &str,
        msg: String,
    ) {
        kumo_client::events::record(
            &kumo_client::clients::ClientSource::fixed(self.client.clone()),
            component,
            kumo_client::events::reference(obj),
            type_,
            reason,
            msg,
        )
        .await;
    }
}

/// The gRPC status as upstream's sidecars print it.
pub fn status_text(e: &tonic_csi::Status) -> String {
    format!("rpc error: code = {:?} desc = {}", e.code(), e.message())
}

/// The capabilities a controller service announces.
async fn capabilities(c: &Client) -> Result<Vec<i32>, tonic_csi::Status> {
    let caps = c
        .controller
        .clone()
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await?
        .into_inner();
    Ok(caps
        .capabilities
        .into_iter()
        .filter_map(|c| {
            c.r#type
                .map(|controller_service_capability::Type::Rpc(r)| r.r#type)
        })
        .collect())
}

/// Connects to the driver's controller endpoint at `socket` (retrying until it answers),
/// then runs the sidecars its capabilities call for until `stop`.
pub async fn run(client: kube::Client, socket: PathBuf, mut stop: watch::Receiver<bool>) {
    use controller_service_capability::rpc::Type;
    let (driver, name, caps) = loop {
        let attempt = async {
            let c = Client::connect(&socket).await.map_err(|e| e.to_string())?;
            let name = c.driver_name().await.map_err(|e| status_text(&e))?;
            let caps = capabilities(&c).await.map_err(|e| status_text(&e))?;
            Ok::<_, String>((c, name, caps))
        };
        match attempt.await {
            Ok(v) => break v,
            Err(e) => {
                tracing::info!(socket = %socket.display(), error = %e, "waiting for the CSI driver")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    };
    tracing::info!(driver = %name, "CSI sidecars starting");
    let ctx = Context {
        client: client.clone(),
        driver,
        name,
    };
    let factory = Arc::new(InformerFactory::new(client));
    let mut tasks = Vec::new();
    if caps.contains(&(Type::CreateDeleteVolume as i32)) {
        tasks.push(provisioner::start(ctx.clone(), &factory, stop.clone()));
    }
    tasks.push(attacher::start(
        ctx.clone(),
        &factory,
        caps.contains(&(Type::PublishUnpublishVolume as i32)),
        stop.clone(),
    ));
    if caps.contains(&(Type::ExpandVolume as i32)) {
        tasks.push(resizer::start(ctx, &factory, stop.clone()));
    }
    tasks.extend(factory.start(stop));
    futures::future::join_all(tasks).await;
}
