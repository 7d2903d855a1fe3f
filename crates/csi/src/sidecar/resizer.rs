//! external-resizer's role: a bound claim of the driver asking for more than its capacity
//! is expanded with ControllerExpandVolume (conditions `Resizing`, then
//! `FileSystemResizePending` while the node grows the file system, with
//! `allocatedResources` and `allocatedResourceStatuses` as upstream keeps them), the
//! volume's capacity raised; the kubelet of the node that mounts it finishes the resize.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::Resource;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_apimachinery::quantity::Quantity;
use kumo_client::error::{is_conflict, is_not_found};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::RateLimiter;

use super::{status_text, Context};
use crate::spec::{CapacityRange, ControllerExpandVolumeRequest};

/// Its events' component.
pub const COMPONENT: &str = "external-resizer";
/// What a claim's file system waits for once its volume grew.
pub const FS_RESIZE_PENDING_MESSAGE: &str =
    "Waiting for user to (re-)start a pod to finish file system resize of volume on node.";

struct Ctl {
    ctx: Context,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    volumes: Arc<Informer<PersistentVolume>>,
}

fn storage(m: Option<&BTreeMap<String, Q>>) -> Option<Quantity> {
    Quantity::parse(&m?.get("storage")?.0)
}

fn requested(c: &PersistentVolumeClaim) -> Option<Quantity> {
    storage(c.spec.as_ref()?.resources.as_ref()?.requests.as_ref())
}

fn capacity(c: &PersistentVolumeClaim) -> Option<Quantity> {
    storage(c.status.as_ref()?.capacity.as_ref())
}

/// Registers the handler and returns the task.
pub fn start(
    ctx: Context,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let limiter = RateLimiter::new(Duration::from_secs(1), Duration::from_secs(300), 10.0, 100);
    let queue = factory.queue_with_limiter::<String>("csi-resizer", limiter);
    let claims = factory.informer::<PersistentVolumeClaim>();
    let volumes = factory.informer::<PersistentVolume>();
    let q = queue.clone();
    claims.add_handler(move |c| {
        // A new request, or a capacity reached: not the resizer's own status reports.
        let v = match c {
            Change::Added(v) => v,
            Change::Updated { old, new }
                if requested(old) != requested(new) || capacity(old) != capacity(new) =>
            {
                new
            }
            _ => return,
        };
        if matches!((requested(v), capacity(v)), (Some(r), Some(c)) if r > c) {
            q.add(key_of(v));
        }
    });
    tokio::spawn(async move {
        let ctl = Arc::new(Ctl {
            ctx,
            claims,
            volumes,
        });
        let synced = async {
            ctl.claims.wait_synced().await;
            ctl.volumes.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let tasks = run_workers_of("csi-resizer", queue, 2, stop, &ctl, |c, key| async move {
            c.sync(&key).await
        });
        futures::future::join_all(tasks).await;
    })
}

/// The claim's conditions without those of `types`, and `add` if given.
fn replace_conditions(
    st: &mut k8s_openapi::api::core::v1::PersistentVolumeClaimStatus,
    types: &[&str],
    add: Option<PersistentVolumeClaimCondition>,
) {
    let mut conds: Vec<_> = st
        .conditions
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|x| !types.contains(&x.type_.as_str()))
        .collect();
    conds.extend(add);
    st.conditions = Some(conds);
}

fn condition(type_: &str, message: &str) -> PersistentVolumeClaimCondition {
    PersistentVolumeClaimCondition {
        type_: type_.to_owned(),
        status: "True".into(),
        last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        message: (!message.is_empty()).then(|| message.to_owned()),
        ..Default::default()
    }
}

impl Ctl {
    async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: &str,
        reason: &str,
        msg: String,
    ) {
        self.ctx.event(COMPONENT, obj, type_, reason, msg).await;
    }

    async fn write_status(
        &self,
        c: &PersistentVolumeClaim,
    ) -> Result<PersistentVolumeClaim, SyncError> {
        let ns = c.metadata.namespace.clone().unwrap_or_default();
        let name = c.metadata.name.clone().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), &ns);
        api.replace_status(&name, &PostParams::default(), c)
            .await
            .map_err(|e| {
                if is_conflict(&e) {
                    SyncError::Conflict(e.to_string())
                } else {
                    e.into()
                }
            })
    }

    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let Some(c) = self.claims.get(key) else {
            return Ok(());
        };
        let (Some(want), Some(have)) = (requested(&c), capacity(&c)) else {
            return Ok(());
        };
        if want <= have || c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            return Ok(());
        }
        let pv_name = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        let Some(pv) = self.volumes.get(&pv_name) else {
            return Ok(());
        };
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.clone()) else {
            return Ok(());
        };
        if csi.driver != self.ctx.name {
            return Ok(());
        }
        let want_q = c
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .cloned()
            .unwrap_or_default();
        // Resizing: what is being allocated, in progress.
        let mut n = (*c).clone();
        {
            let st = n.status.get_or_insert_with(Default::default);
            st.allocated_resources = Some(BTreeMap::from([("storage".to_owned(), want_q.clone())]));
            st.allocated_resource_statuses = Some(BTreeMap::from([(
                "storage".to_owned(),
                "ControllerResizeInProgress".to_owned(),
            )]));
            replace_conditions(
                st,
                &[
                    "Resizing",
                    "ControllerResizeError",
                    "FileSystemResizePending",
                ],
                Some(condition("Resizing", "")),
            );
        }
        let n = self.write_status(&n).await?;
        self.event(
            &n,
            "Normal",
            "Resizing",
            format!("External resizer is resizing volume {pv_name}"),
        )
        .await;
        let bytes = i64::try_from(want.value()).unwrap_or(i64::MAX);
        let r = self
            .ctx
            .driver
            .controller
            .clone()
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: csi.volume_handle.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await;
        let resp = match r {
            Ok(r) => r.into_inner(),
            Err(e) => {
                let msg = status_text(&e);
                let mut f = n.clone();
                let st = f.status.get_or_insert_with(Default::default);
                let why = format!(
                    "resize volume {pv_name:?} by resizer {:?} failed: {msg}",
                    self.ctx.name
                );
                replace_conditions(
                    st,
                    &["Resizing"],
                    Some(condition("ControllerResizeError", &why)),
                );
                st.allocated_resource_statuses = None;
                self.write_status(&f).await?;
                self.event(&f, "Warning", "VolumeResizeFailed", msg.clone())
                    .await;
                return Err(SyncError::Failed(msg));
            }
        };
        // The volume is as large as asked.
        let mut v = (*pv).clone();
        if let Some(s) = v.spec.as_mut() {
            s.capacity
                .get_or_insert_with(BTreeMap::new)
                .insert("storage".to_owned(), want_q.clone());
        }
        let pvs: Api<PersistentVolume> = Api::all(self.ctx.client.clone());
        match pvs.replace(&pv_name, &PostParams::default(), &v).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let mut d = n.clone();
        let st = d.status.get_or_insert_with(Default::default);
        if resp.node_expansion_required {
            replace_conditions(
                st,
                &["Resizing"],
                Some(condition(
                    "FileSystemResizePending",
                    FS_RESIZE_PENDING_MESSAGE,
                )),
            );
            st.allocated_resource_statuses = Some(BTreeMap::from([(
                "storage".to_owned(),
                "NodeResizePending".to_owned(),
            )]));
            self.write_status(&d).await?;
            self.event(
                &d,
                "Normal",
                "FileSystemResizeRequired",
                "Require file system resize of volume on node".into(),
            )
            .await;
        } else {
            st.capacity = Some(BTreeMap::from([("storage".to_owned(), want_q)]));
            st.allocated_resource_statuses = None;
            replace_conditions(st, &["Resizing"], None);
            self.write_status(&d).await?;
            self.event(
                &d,
                "Normal",
                "VolumeResizeSuccessful",
                "Resize volume succeeded".into(),
            )
            .await;
        }
        Ok(())
    }
}
