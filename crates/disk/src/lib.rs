//! `disk.csi.kumo.dev`: the kumo cloud's CSI driver, the part of the cloud a cluster's
//! storage stands on (as `ebs.csi.aws.com` is for EC2's volumes).
//!
//! - [`Controller`] (one per cluster): CreateVolume in the zone the topology asks for,
//!   DeleteVolume, ControllerPublish/Unpublish as the cloud's attach and detach, and
//!   ControllerExpandVolume, all through the cloud's API with the driver's own credentials,
//!   so the cloud's quotas, deny policies and faults apply to it.
//! - [`Node`] (one per instance): NodeGetInfo (the instance id and its zone), and staging,
//!   publishing, measuring and growing a volume on the instance through a [`Mounter`]:
//!   [`mount::Loop`] for a real node (the volume's file as a loop device with an ext4 file
//!   system, bind-mounted into pods), [`mount::Directories`] for a simulated one (the
//!   directories a mount would make, no file system: the simulator holds the data).
//! - [`Identity`] answers who the driver is and what it can do.

// The services answer tonic's `Status` (their traits say so); the helpers that build one
// pass it on unboxed like the trait methods.
#![allow(clippy::result_large_err)]

pub mod controller;
pub mod identity;
pub mod mount;
pub mod node;

pub use controller::Controller;
pub use identity::Identity;
pub use mount::Mounter;
pub use node::Node;

/// The driver's name.
pub const DRIVER: &str = "disk.csi.kumo.dev";
/// Volumes an instance can have attached (`/dev/vdb` to `/dev/vdz`).
pub const MAX_VOLUMES_PER_NODE: i64 = 25;
/// The key of the publish context that names the device the volume is attached as.
pub const DEVICE_PATH: &str = "devicePath";

/// A cloud error as the gRPC status a CSI driver answers with (the cloud's code and
/// message kept in the status's message, as the sidecars show it in events).
pub fn status_of(e: &kumo_cloud::Error) -> kumo_csi::grpc::Status {
    use kumo_csi::grpc::{Code, Status};
    let code = match e {
        kumo_cloud::Error::Api { status, code, .. } => match (*status, code.as_str()) {
            (404, _) => Code::NotFound,
            (403, _) | (401, _) => Code::PermissionDenied,
            (_, kumo_cloud::codes::VOLUME_LIMIT_EXCEEDED)
            | (_, kumo_cloud::codes::ATTACHMENT_LIMIT_EXCEEDED) => Code::ResourceExhausted,
            (_, kumo_cloud::codes::IDEMPOTENT_PARAMETER_MISMATCH) => Code::AlreadyExists,
            (_, kumo_cloud::codes::VOLUME_IN_USE) | (_, kumo_cloud::codes::INCORRECT_STATE) => {
                Code::FailedPrecondition
            }
            (400, _) => Code::InvalidArgument,
            (503, _) => Code::Unavailable,
            _ => Code::Internal,
        },
        kumo_cloud::Error::Timeout(_) => Code::DeadlineExceeded,
        kumo_cloud::Error::Transport(_) => Code::Unavailable,
        kumo_cloud::Error::Decode(_) | kumo_cloud::Error::Config(_) => Code::Internal,
    };
    let msg = match e {
        kumo_cloud::Error::Api { code, message, .. } => format!("{code}: {message}"),
        other => other.to_string(),
    };
    Status::new(code, msg)
}
