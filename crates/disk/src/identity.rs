//! The identity service.

use kumo_csi::grpc::{Request, Response, Status};
use kumo_csi::spec::{
    identity_server, plugin_capability, GetPluginCapabilitiesRequest,
    GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse, PluginCapability,
    ProbeRequest, ProbeResponse,
};

/// Who the driver is; `controller` says whether this endpoint serves the controller
/// service (the node plugins do not).
#[derive(Clone, Copy, Debug)]
pub struct Identity {
    /// Whether the controller service is served here.
    pub controller: bool,
}

fn service(t: plugin_capability::service::Type) -> PluginCapability {
    PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    }
}

#[kumo_csi::grpc::async_trait]
impl identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: crate::DRIVER.to_owned(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::service::Type;
        let mut capabilities = vec![service(Type::VolumeAccessibilityConstraints)];
        if self.controller {
            capabilities.push(service(Type::ControllerService));
            capabilities.push(PluginCapability {
                r#type: Some(plugin_capability::Type::VolumeExpansion(
                    plugin_capability::VolumeExpansion {
                        r#type: plugin_capability::volume_expansion::Type::Online as i32,
                    },
                )),
            });
        }
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
