//! external-attacher's role: a VolumeAttachment of the driver is attached with
//! ControllerPublishVolume (its status then `attached: true` with the publish context as
//! `attachmentMetadata`, or the error as `attachError`, retried with back-off) and, once
//! being deleted, detached with ControllerUnpublishVolume before its finalizer goes. A
//! driver that does not publish gets its attachments marked attached as they come.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{
    CSINode, VolumeAttachment, VolumeAttachmentStatus, VolumeError,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::error::{is_conflict, is_not_found};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::RateLimiter;

use super::{status_text, Context};
use crate::spec::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};

/// The annotation with the node's id in the driver.
pub const NODE_ID: &str = "csi.alpha.kubernetes.io/node-id";

/// The attacher's finalizer for `driver` (`external-attacher/` and the name with every
/// character but letters, digits and `-` made a `-`).
pub fn finalizer(driver: &str) -> String {
    let mut s: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if s.ends_with('-') {
        s.push('X');
    }
    format!("external-attacher/{s}")
}

struct Ctl {
    ctx: Context,
    publishes: bool,
    attachments: Arc<Informer<VolumeAttachment>>,
    volumes: Arc<Informer<PersistentVolume>>,
    csi_nodes: Arc<Informer<CSINode>>,
}

/// Registers the handler and returns the task.
pub fn start(
    ctx: Context,
    factory: &InformerFactory,
    publishes: bool,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let limiter = RateLimiter::new(Duration::from_secs(1), Duration::from_secs(300), 10.0, 100);
    let queue = factory.queue_with_limiter::<String>("csi-attacher", limiter);
    let attachments = factory.informer::<VolumeAttachment>();
    let volumes = factory.informer::<PersistentVolume>();
    let csi_nodes = factory.informer::<CSINode>();
    let (q, name) = (queue.clone(), ctx.name.clone());
    attachments.add_handler(move |c| {
        // Status changes (this sidecar's own error reports among them) do not enqueue: a
        // failed attach is retried on the queue's back-off, not at once.
        let v = match c {
            Change::Added(v) => v,
            Change::Updated { old, new }
                if old.spec != new.spec
                    || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp =>
            {
                new
            }
            _ => return,
        };
        if v.spec.attacher == name {
            q.add(key_of(v));
        }
    });
    tokio::spawn(async move {
        let ctl = Arc::new(Ctl {
            ctx,
            publishes,
            attachments,
            volumes,
            csi_nodes,
        });
        let synced = async {
            ctl.attachments.wait_synced().await;
            ctl.volumes.wait_synced().await;
            ctl.csi_nodes.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let tasks = run_workers_of("csi-attacher", queue, 4, stop, &ctl, |c, key| async move {
            c.sync(&key).await
        });
        futures::future::join_all(tasks).await;
    })
}

fn error_now(message: String) -> VolumeError {
    VolumeError {
        message: Some(message),
        time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        error_code: None,
    }
}

impl Ctl {
    fn api(&self) -> Api<VolumeAttachment> {
        Api::all(self.ctx.client.clone())
    }

    async fn replace(&self, va: &VolumeAttachment) -> Result<VolumeAttachment, SyncError> {
        let name = va.metadata.name.clone().unwrap_or_default();
        self.api()
            .replace(&name, &PostParams::default(), va)
            .await
            .map_err(|e| {
                if is_conflict(&e) {
                    SyncError::Conflict(e.to_string())
                } else {
                    e.into()
                }
            })
    }

    async fn set_status(
        &self,
        va: &VolumeAttachment,
        status: VolumeAttachmentStatus,
    ) -> Result<(), SyncError> {
        if va.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let mut n = va.clone();
        n.status = Some(status);
        let name = va.metadata.name.clone().unwrap_or_default();
        match self
            .api()
            .replace_status(&name, &PostParams::default(), &n)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) if is_conflict(&e) => Err(SyncError::Conflict(e.to_string())),
            Err(e) => Err(e.into()),
        }
    }

    /// The volume handle and read-only flag of the attachment's volume.
    fn volume(&self, va: &VolumeAttachment) -> Result<(String, bool, Vec<String>, String), String> {
        let pv_name = va
            .spec
            .source
            .persistent_volume_name
            .clone()
            .ok_or_else(|| "VolumeAttachment has no persistentVolumeName source".to_owned())?;
        let pv = self
            .volumes
            .get(&pv_name)
            .ok_or_else(|| format!("persistentvolume {pv_name:?} not found"))?;
        let spec = pv.spec.clone().unwrap_or_default();
        let csi = spec
            .csi
            .ok_or_else(|| format!("persistentvolume {pv_name} is not a CSI volume"))?;
        Ok((
            csi.volume_handle,
            csi.read_only.unwrap_or(false),
            spec.access_modes.unwrap_or_default(),
            csi.fs_type.unwrap_or_default(),
        ))
    }

    /// The node's id in the driver (its CSINode entry).
    fn node_id(&self, node: &str) -> Result<String, String> {
        let csi = self
            .csi_nodes
            .get(node)
            .ok_or_else(|| format!("CSINode {node} not found"))?;
        csi.spec
            .drivers
            .iter()
            .find(|d| d.name == self.ctx.name)
            .map(|d| d.node_id.clone())
            .ok_or_else(|| format!("CSINode {node} does not contain driver {}", self.ctx.name))
    }

    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let Some(va) = self.attachments.get(key) else {
            return Ok(());
        };
        let mut va = (*va).clone();
        let fin = finalizer(&self.ctx.name);
        let has_fin = va.metadata.finalizers.iter().flatten().any(|f| *f == fin);
        if va.metadata.deletion_timestamp.is_some() {
            if !has_fin {
                return Ok(());
            }
            if self.publishes {
                let node_id = self.node_id(&va.spec.node_name);
                let handle = self.volume(&va).map(|v| v.0);
                if let (Ok(node_id), Ok(handle)) = (node_id, handle) {
                    let r = self
                        .ctx
                        .driver
                        .controller
                        .clone()
                        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                            volume_id: handle,
                            node_id,
                            ..Default::default()
                        })
                        .await;
                    if let Err(e) = r {
                        let msg = status_text(&e);
                        let st = VolumeAttachmentStatus {
                            detach_error: Some(error_now(msg.clone())),
                            ..va.status.clone().unwrap_or_default()
                        };
                        self.set_status(&va, st).await?;
                        return Err(SyncError::Failed(msg));
                    }
                }
            }
            if let Some(f) = va.metadata.finalizers.as_mut() {
                f.retain(|f| *f != fin);
            }
            return match self.replace(&va).await {
                Ok(_) => Ok(()),
                Err(SyncError::Failed(e)) if e.contains("not found") => Ok(()),
                Err(e) => Err(e),
            };
        }
        if va.status.as_ref().is_some_and(|s| s.attached) {
            return Ok(());
        }
        if !self.publishes {
            return self
                .set_status(
                    &va,
                    VolumeAttachmentStatus {
                        attached: true,
                        ..Default::default()
                    },
                )
                .await;
        }
        let node_id = match self.node_id(&va.spec.node_name) {
            Ok(n) => n,
            Err(e) => {
                let st = VolumeAttachmentStatus {
                    attached: false,
                    attach_error: Some(error_now(e.clone())),
                    ..Default::default()
                };
                self.set_status(&va, st).await?;
                return Err(SyncError::Failed(e));
            }
        };
        if !has_fin
            || va
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(NODE_ID))
                != Some(&node_id)
        {
            if !has_fin {
                va.metadata
                    .finalizers
                    .get_or_insert_with(Vec::new)
                    .push(fin);
            }
            va.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(NODE_ID.to_owned(), node_id.clone());
            va = self.replace(&va).await?;
        }
        let (handle, read_only, modes, fs_type) = match self.volume(&va) {
            Ok(v) => v,
            Err(e) => return Err(SyncError::Failed(e)),
        };
        let r = self
            .ctx
            .driver
            .controller
            .clone()
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: handle,
                node_id,
                volume_capability: Some(crate::mount_capability(&modes, &fs_type, Vec::new())),
                readonly: read_only,
                ..Default::default()
            })
            .await;
        match r {
            Ok(resp) => {
                let meta: BTreeMap<String, String> =
                    resp.into_inner().publish_context.into_iter().collect();
                self.set_status(
                    &va,
                    VolumeAttachmentStatus {
                        attached: true,
                        attachment_metadata: (!meta.is_empty()).then_some(meta),
                        attach_error: None,
                        detach_error: None,
                    },
                )
                .await
            }
            Err(e) => {
                let msg = status_text(&e);
                let st = VolumeAttachmentStatus {
                    attached: false,
                    attach_error: Some(error_now(msg.clone())),
                    ..Default::default()
                };
                self.set_status(&va, st).await?;
                Err(SyncError::Failed(msg))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizers_are_named_as_upstream_names_them() {
        assert_eq!(
            finalizer("disk.csi.kumo.dev"),
            "external-attacher/disk-csi-kumo-dev"
        );
        assert_eq!(
            finalizer("ebs.csi.aws.com"),
            "external-attacher/ebs-csi-aws-com"
        );
        assert_eq!(finalizer("x."), "external-attacher/x-X");
    }
}
