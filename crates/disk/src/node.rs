//! The node service of one instance.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kumo_csi::grpc::{Request, Response, Status};
use kumo_csi::spec::{
    node_server, node_service_capability, volume_capability, volume_usage, NodeExpandVolumeRequest,
    NodeExpandVolumeResponse, NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse,
    NodeGetInfoRequest, NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeServiceCapability,
    NodeStageVolumeRequest, NodeStageVolumeResponse, NodeUnpublishVolumeRequest,
    NodeUnpublishVolumeResponse, NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, Topology,
    VolumeCapability, VolumeUsage,
};

use crate::mount::{MountError, Mounter};
use crate::{DEVICE_PATH, MAX_VOLUMES_PER_NODE};

/// The node service of the instance `instance_id` in `zone`.
#[derive(Clone)]
pub struct Node {
    instance_id: String,
    zone: String,
    mounter: Arc<dyn Mounter>,
}

impl Node {
    /// The node plugin of an instance, mounting with `mounter`.
    pub fn new(instance_id: &str, zone: &str, mounter: Arc<dyn Mounter>) -> Node {
        Node {
            instance_id: instance_id.to_owned(),
            zone: zone.to_owned(),
            mounter,
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Mounter) -> Result<T, MountError> + Send + 'static,
    ) -> Result<T, Status> {
        let m = self.mounter.clone();
        tokio::task::spawn_blocking(move || f(m.as_ref()))
            .await
            .map_err(|e| Status::internal(format!("mount task: {e}")))?
            .map_err(|e| match e {
                MountError::NoDisk(_) => Status::not_found(e.to_string()),
                MountError::FsType(_) => Status::invalid_argument(e.to_string()),
                MountError::NotOnline(_) => Status::failed_precondition(e.to_string()),
                other => Status::internal(other.to_string()),
            })
    }
}

fn rpc(t: node_service_capability::rpc::Type) -> NodeServiceCapability {
    NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

fn required(field: &str, v: &str) -> Result<PathBuf, Status> {
    if v.is_empty() {
        Err(Status::invalid_argument(format!("{field} is required")))
    } else {
        Ok(PathBuf::from(v))
    }
}

/// The file system type a capability asks for.
fn fs_type(cap: Option<&VolumeCapability>) -> Result<String, Status> {
    let cap = cap.ok_or_else(|| Status::invalid_argument("volume capability is required"))?;
    crate::controller::check_capabilities(std::slice::from_ref(cap))?;
    Ok(match &cap.access_type {
        Some(volume_capability::AccessType::Mount(m)) => m.fs_type.clone(),
        _ => String::new(),
    })
}

#[kumo_csi::grpc::async_trait]
impl node_server::Node for Node {
    #[tracing::instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_stage_volume(
        &self,
        req: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let r = req.into_inner();
        required("volume_id", &r.volume_id)?;
        let staging = required("staging_target_path", &r.staging_target_path)?;
        let fs = fs_type(r.volume_capability.as_ref())?;
        // A disk is on the instance once the controller attached it, which says as what.
        if r.publish_context
            .get(DEVICE_PATH)
            .is_none_or(|d| d.is_empty())
        {
            return Err(Status::invalid_argument(format!(
                "publish context has no {DEVICE_PATH}: the volume is not attached to this node"
            )));
        }
        let id = r.volume_id.clone();
        self.blocking(move |m| m.stage(&id, &staging, &fs)).await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    #[tracing::instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_unstage_volume(
        &self,
        req: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let r = req.into_inner();
        required("volume_id", &r.volume_id)?;
        let staging = required("staging_target_path", &r.staging_target_path)?;
        let id = r.volume_id.clone();
        self.blocking(move |m| m.unstage(&id, &staging)).await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    #[tracing::instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = req.into_inner();
        required("volume_id", &r.volume_id)?;
        let staging = required("staging_target_path", &r.staging_target_path)?;
        let target = required("target_path", &r.target_path)?;
        fs_type(r.volume_capability.as_ref())?;
        let ro = r.readonly;
        self.blocking(move |m| m.publish(&staging, &target, ro))
            .await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    #[tracing::instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        required("volume_id", &r.volume_id)?;
        let target = required("target_path", &r.target_path)?;
        self.blocking(move |m| m.unpublish(&target)).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let r = req.into_inner();
        required("volume_id", &r.volume_id)?;
        let path = required("volume_path", &r.volume_path)?;
        if !Path::new(&path).exists() {
            return Err(Status::not_found(format!(
                "volume path {} does not exist",
                path.display()
            )));
        }
        let Some(u) = self.blocking(move |m| m.usage(&path)).await? else {
            return Err(Status::unimplemented(
                "a simulated node has no file system to measure",
            ));
        };
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage: vec![
                VolumeUsage {
                    available: n(u.bytes_available),
                    total: n(u.bytes_total),
                    used: n(u.bytes_used),
                    unit: volume_usage::Unit::Bytes as i32,
                },
                VolumeUsage {
                    available: n(u.inodes_free),
                    total: n(u.inodes_total),
                    used: n(u.inodes_used),
                    unit: volume_usage::Unit::Inodes as i32,
                },
            ],
            volume_condition: None,
        }))
    }

    #[tracing::instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn node_expand_volume(
        &self,
        req: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        required("volume_id", &r.volume_id)?;
        let staging = if r.staging_target_path.is_empty() {
            required("volume_path", &r.volume_path)?
        } else {
            PathBuf::from(&r.staging_target_path)
        };
        let id = r.volume_id.clone();
        let grown = self.blocking(move |m| m.expand(&id, &staging)).await?;
        let asked = r.capacity_range.map_or(0, |c| c.required_bytes);
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: grown.map_or(asked, |b| i64::try_from(b).unwrap_or(i64::MAX)),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(Type::StageUnstageVolume),
                rpc(Type::GetVolumeStats),
                rpc(Type::ExpandVolume),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.instance_id.clone(),
            max_volumes_per_node: MAX_VOLUMES_PER_NODE,
            accessible_topology: Some(Topology {
                segments: HashMap::from([(kumo_csi::ZONE_KEY.to_owned(), self.zone.clone())]),
            }),
        }))
    }
}
