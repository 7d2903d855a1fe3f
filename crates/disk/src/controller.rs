//! The controller service: volumes are the cloud's volumes, publishing is attaching.

use std::collections::{BTreeMap, HashMap};

use kumo_cloud::{CreateVolumeRequest, VolumeFilter, ZONES};
use kumo_csi::grpc::{Request, Response, Status};
use kumo_csi::spec::{
    controller_server, controller_service_capability, volume_capability,
    ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerGetVolumeRequest, ControllerGetVolumeResponse, ControllerModifyVolumeRequest,
    ControllerModifyVolumeResponse, ControllerPublishVolumeRequest,
    ControllerPublishVolumeResponse, ControllerServiceCapability, ControllerUnpublishVolumeRequest,
    ControllerUnpublishVolumeResponse, CreateSnapshotRequest, CreateSnapshotResponse,
    CreateVolumeResponse, DeleteSnapshotRequest, DeleteSnapshotResponse, DeleteVolumeRequest,
    DeleteVolumeResponse, GetCapacityRequest, GetCapacityResponse, ListSnapshotsRequest,
    ListSnapshotsResponse, ListVolumesRequest, ListVolumesResponse, Topology, TopologyRequirement,
    ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse, VolumeCapability,
};

use crate::{status_of, DEVICE_PATH};

const GIB: i64 = 1 << 30;

/// Parameters the external provisioner passes with `--extra-create-metadata`, kept as the
/// volume's tags (the claim and volume it was made for).
const METADATA: [(&str, &str); 3] = [
    (
        "csi.storage.k8s.io/pvc/name",
        "kubernetes.io/created-for/pvc/name",
    ),
    (
        "csi.storage.k8s.io/pvc/namespace",
        "kubernetes.io/created-for/pvc/namespace",
    ),
    (
        "csi.storage.k8s.io/pv/name",
        "kubernetes.io/created-for/pv/name",
    ),
];

/// The controller service over the cloud's API.
#[derive(Clone, Debug)]
pub struct Controller {
    cloud: kumo_cloud::Client,
}

impl Controller {
    /// A controller that calls the cloud with `cloud` (its credentials are the driver's).
    pub fn new(cloud: kumo_cloud::Client) -> Controller {
        Controller { cloud }
    }
}

fn rpc(t: controller_service_capability::rpc::Type) -> ControllerServiceCapability {
    ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(
            controller_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

/// Checks what a volume is asked to be used as: a file system, on one node.
pub fn check_capabilities(caps: &[VolumeCapability]) -> Result<(), Status> {
    use volume_capability::access_mode::Mode;
    if caps.is_empty() {
        return Err(Status::invalid_argument("volume capabilities are required"));
    }
    for c in caps {
        if let Some(volume_capability::AccessType::Block(_)) = c.access_type {
            return Err(Status::invalid_argument(
                "access type block is not supported: kumo disks are file systems",
            ));
        }
        let mode = c
            .access_mode
            .as_ref()
            .and_then(|m| Mode::try_from(m.mode).ok())
            .unwrap_or(Mode::Unknown);
        match mode {
            Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter => {}
            other => {
                return Err(Status::invalid_argument(format!(
                "access mode {} is not supported: a kumo disk is attached to one node at a time",
                other.as_str_name()
            )))
            }
        }
    }
    Ok(())
}

/// The zone a volume is created in: the first preferred topology's, else the first
/// requisite one's, else the region's first zone.
fn zone_of(req: Option<&TopologyRequirement>) -> Result<String, Status> {
    let Some(req) = req else {
        return Ok(ZONES[0].to_owned());
    };
    let zone = |t: &Topology| t.segments.get(kumo_csi::ZONE_KEY).cloned();
    let requisite: Vec<String> = req.requisite.iter().filter_map(zone).collect();
    let chosen = req
        .preferred
        .iter()
        .filter_map(zone)
        .find(|z| requisite.is_empty() || requisite.contains(z))
        .or_else(|| requisite.first().cloned())
        .unwrap_or_else(|| ZONES[0].to_owned());
    if !ZONES.contains(&chosen.as_str()) {
        return Err(Status::invalid_argument(format!(
            "topology zone {chosen:?} is not a zone of the kumo cloud ({})",
            ZONES.join(", ")
        )));
    }
    Ok(chosen)
}

fn topology(zone: &str) -> Topology {
    Topology {
        segments: HashMap::from([(kumo_csi::ZONE_KEY.to_owned(), zone.to_owned())]),
    }
}

/// Bytes asked for as whole GiB (at least one).
fn size_gib(required: i64, limit: i64) -> Result<u64, Status> {
    if required < 0 || limit < 0 {
        return Err(Status::invalid_argument("capacity must not be negative"));
    }
    let gib = ((required + GIB - 1) / GIB).max(1);
    if limit > 0 && gib * GIB > limit {
        return Err(Status::out_of_range(format!(
            "{required} bytes rounded up to whole GiB ({gib} GiB) exceeds the limit of {limit} bytes"
        )));
    }
    u64::try_from(gib).map_err(|_| Status::out_of_range("capacity too large"))
}

fn cloud_volume(v: &kumo_cloud::Volume) -> kumo_csi::spec::Volume {
    kumo_csi::spec::Volume {
        capacity_bytes: i64::try_from(v.size_gib).unwrap_or(i64::MAX / GIB) * GIB,
        volume_id: v.id.clone(),
        volume_context: HashMap::new(),
        content_source: None,
        accessible_topology: vec![topology(&v.zone)],
    }
}

fn required(field: &str, v: &str) -> Result<(), Status> {
    if v.is_empty() {
        Err(Status::invalid_argument(format!("{field} is required")))
    } else {
        Ok(())
    }
}

#[kumo_csi::grpc::async_trait]
impl controller_server::Controller for Controller {
    #[tracing::instrument(skip_all, fields(name = %req.get_ref().name))]
    async fn create_volume(
        &self,
        req: Request<kumo_csi::spec::CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let r = req.into_inner();
        required("name", &r.name)?;
        check_capabilities(&r.volume_capabilities)?;
        if r.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "volume content source (snapshots, clones) is not supported",
            ));
        }
        let mut tags = BTreeMap::new();
        for (k, v) in &r.parameters {
            match METADATA.iter().find(|(p, _)| p == k) {
                Some((_, tag)) => {
                    tags.insert((*tag).to_owned(), v.clone());
                }
                None => {
                    return Err(Status::invalid_argument(format!(
                        "invalid parameter key {k:?} for CreateVolume"
                    )))
                }
            }
        }
        let range = r.capacity_range.unwrap_or_default();
        let size_gib = size_gib(range.required_bytes, range.limit_bytes)?;
        let zone = zone_of(r.accessibility_requirements.as_ref())?;
        tags.insert("kumo.dev/csi-driver".to_owned(), crate::DRIVER.to_owned());
        let v = self
            .cloud
            .create_volume(&CreateVolumeRequest {
                name: r.name,
                zone,
                size_gib,
                tags,
            })
            .await
            .map_err(|e| status_of(&e))?;
        tracing::info!(volume = %v.id, zone = %v.zone, size_gib = v.size_gib, "created");
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(cloud_volume(&v)),
        }))
    }

    #[tracing::instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn delete_volume(
        &self,
        req: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let r = req.into_inner();
        required("volume_id", &r.volume_id)?;
        match self.cloud.delete_volume(&r.volume_id).await {
            // Deleting what is gone succeeds: the call is idempotent.
            Err(e) if !e.is_not_found() => Err(status_of(&e)),
            _ => Ok(Response::new(DeleteVolumeResponse {})),
        }
    }

    #[tracing::instrument(skip_all, fields(volume = %req.get_ref().volume_id, node = %req.get_ref().node_id))]
    async fn controller_publish_volume(
        &self,
        req: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let r = req.into_inner();
        required("volume_id", &r.volume_id)?;
        required("node_id", &r.node_id)?;
        let cap = r
            .volume_capability
            .ok_or_else(|| Status::invalid_argument("volume capability is required"))?;
        check_capabilities(std::slice::from_ref(&cap))?;
        let v = self
            .cloud
            .attach_volume(&r.volume_id, &r.node_id)
            .await
            .map_err(|e| status_of(&e))?;
        let device = v.attachment.map(|a| a.device).unwrap_or_default();
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context: HashMap::from([(DEVICE_PATH.to_owned(), device)]),
        }))
    }

    #[tracing::instrument(skip_all, fields(volume = %req.get_ref().volume_id, node = %req.get_ref().node_id))]
    async fn controller_unpublish_volume(
        &self,
        req: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        required("volume_id", &r.volume_id)?;
        let v = match self.cloud.describe_volume(&r.volume_id).await {
            Ok(v) => v,
            // A volume that is gone is not attached anywhere.
            Err(e) if e.is_not_found() => {
                return Ok(Response::new(ControllerUnpublishVolumeResponse {}))
            }
            Err(e) => return Err(status_of(&e)),
        };
        let attached_here = v
            .attachment
            .as_ref()
            .is_some_and(|a| r.node_id.is_empty() || a.instance_id == r.node_id);
        if attached_here {
            let node = (!r.node_id.is_empty()).then_some(r.node_id.as_str());
            self.cloud
                .detach_volume(&r.volume_id, node)
                .await
                .map_err(|e| status_of(&e))?;
        }
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let r = req.into_inner();
        required("volume_id", &r.volume_id)?;
        self.cloud
            .describe_volume(&r.volume_id)
            .await
            .map_err(|e| status_of(&e))?;
        let ok = check_capabilities(&r.volume_capabilities);
        Ok(Response::new(ValidateVolumeCapabilitiesResponse {
            message: ok
                .as_ref()
                .err()
                .map(|e| e.message().to_owned())
                .unwrap_or_default(),
            confirmed: ok.ok().map(|()| {
                kumo_csi::spec::validate_volume_capabilities_response::Confirmed {
                    volume_context: r.volume_context,
                    volume_capabilities: r.volume_capabilities,
                    parameters: r.parameters,
                    mutable_parameters: r.mutable_parameters,
                }
            }),
        }))
    }

    async fn list_volumes(
        &self,
        _: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let list = self
            .cloud
            .list_volumes(&VolumeFilter::default())
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(ListVolumesResponse {
            entries: list
                .iter()
                .map(|v| kumo_csi::spec::list_volumes_response::Entry {
                    volume: Some(cloud_volume(v)),
                    status: None,
                })
                .collect(),
            next_token: String::new(),
        }))
    }

    async fn get_capacity(
        &self,
        _: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        Err(Status::unimplemented("GetCapacity is not supported"))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::rpc::Type;
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: vec![
                rpc(Type::CreateDeleteVolume),
                rpc(Type::PublishUnpublishVolume),
                rpc(Type::ExpandVolume),
                rpc(Type::ListVolumes),
            ],
        }))
    }

    async fn create_snapshot(
        &self,
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not supported"))
    }

    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not supported"))
    }

    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Err(Status::unimplemented("snapshots are not supported"))
    }

    #[tracing::instrument(skip_all, fields(volume = %req.get_ref().volume_id))]
    async fn controller_expand_volume(
        &self,
        req: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        required("volume_id", &r.volume_id)?;
        let range = r
            .capacity_range
            .ok_or_else(|| Status::invalid_argument("capacity range is required"))?;
        let want = size_gib(range.required_bytes, range.limit_bytes)?;
        let v = self
            .cloud
            .describe_volume(&r.volume_id)
            .await
            .map_err(|e| status_of(&e))?;
        let v = if v.size_gib >= want {
            v
        } else {
            self.cloud
                .modify_volume(&r.volume_id, want)
                .await
                .map_err(|e| status_of(&e))?
        };
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: cloud_volume(&v).capacity_bytes,
            node_expansion_required: true,
        }))
    }

    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ControllerGetVolume is not supported",
        ))
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ControllerModifyVolume is not supported",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_whole_gib_within_the_limit() {
        assert_eq!(size_gib(0, 0).ok(), Some(1));
        assert_eq!(size_gib(1, 0).ok(), Some(1));
        assert_eq!(size_gib(GIB + 1, 0).ok(), Some(2));
        assert_eq!(size_gib(5 * GIB, 5 * GIB).ok(), Some(5));
        assert!(size_gib(GIB + 1, GIB + 1).is_err());
        assert!(size_gib(-1, 0).is_err());
    }

    #[test]
    fn the_zone_is_the_preferred_one_within_the_requisite() {
        let t = |z: &str| topology(z);
        assert_eq!(zone_of(None).ok().as_deref(), Some("kumo-1a"));
        let req = TopologyRequirement {
            requisite: vec![t("kumo-1b"), t("kumo-1c")],
            preferred: vec![t("kumo-1a"), t("kumo-1c")],
        };
        assert_eq!(zone_of(Some(&req)).ok().as_deref(), Some("kumo-1c"));
        let req = TopologyRequirement {
            requisite: vec![t("kumo-1b")],
            preferred: vec![],
        };
        assert_eq!(zone_of(Some(&req)).ok().as_deref(), Some("kumo-1b"));
        let req = TopologyRequirement {
            requisite: vec![t("mars-1a")],
            preferred: vec![],
        };
        assert!(zone_of(Some(&req)).is_err());
    }
}
