//! The Container Storage Interface (CSI v1) as kumo uses it.
//!
//! [`spec`] is the spec's messages and services (the `bpfman-csi` crate, generated from the
//! spec's protobuf; [`grpc`] the tonic it is built on). A CSI driver is three gRPC services
//! on one Unix socket: identity, controller and node. [`endpoint`] connects to such a socket
//! ([`Client`]) and serves one. Nothing here knows a particular driver or cloud.

pub mod endpoint;

pub use bpfman_csi::v1 as spec;
pub use endpoint::{serve, Client, Error};
pub use tonic_csi as grpc;

/// The topology key of a node's zone (a driver's `accessible_topology` segments use it
/// when they follow the well-known labels).
pub const ZONE_KEY: &str = "topology.kubernetes.io/zone";
