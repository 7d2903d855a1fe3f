//! The Container Storage Interface (CSI v1) as kumo uses it.
//!
//! [`spec`] is the spec's messages and services (the `bpfman-csi` crate, generated from the
//! spec's protobuf; [`grpc`] the tonic it is built on). A CSI driver is three gRPC services
//! on one Unix socket: identity, controller and node. [`endpoint`] connects to such a socket
//! ([`Client`]) and serves one. Nothing here knows a particular driver or cloud.

pub mod endpoint;
pub mod sidecar;

pub use bpfman_csi::v1 as spec;
pub use endpoint::{serve, Client, Error};
pub use tonic_csi as grpc;

/// The VolumeAttachment of a volume on a node, as upstream's CSI attacher names it:
/// `csi-` and the hex SHA-256 of the volume handle, the driver and the node, run together.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    format!("csi-{}", hex_sha256(&format!("{handle}{driver}{node}")))
}

/// The name the attach-detach controller and a node's `volumesInUse`/`volumesAttached`
/// know a CSI volume by.
pub fn unique_name(driver: &str, handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{handle}")
}

/// The capability a PersistentVolume is used with: a file system of `fs_type` mounted
/// with `mount_flags`, its access mode from the volume's access modes (ReadWriteOncePod,
/// then ReadWriteMany, ReadWriteOnce, ReadOnlyMany, as upstream's CSI plugin picks).
pub fn mount_capability(
    modes: &[String],
    fs_type: &str,
    mount_flags: Vec<String>,
) -> spec::VolumeCapability {
    use spec::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
    let has = |m: &str| modes.iter().any(|x| x == m);
    let mode = if has("ReadWriteOncePod") {
        Mode::SingleNodeSingleWriter
    } else if has("ReadWriteMany") {
        Mode::MultiNodeMultiWriter
    } else if has("ReadWriteOnce") {
        Mode::SingleNodeWriter
    } else if has("ReadOnlyMany") {
        Mode::MultiNodeReaderOnly
    } else {
        Mode::SingleNodeWriter
    };
    spec::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            mount_flags,
            volume_mount_group: String::new(),
        })),
    }
}

/// Lower-case hex SHA-256 (the kubelet's staging directories are named by it too).
pub fn hex_sha256(s: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, s.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The topology key of a node's zone (a driver's `accessible_topology` segments use it
/// when they follow the well-known labels).
pub const ZONE_KEY: &str = "topology.kubernetes.io/zone";

#[cfg(test)]
mod tests {
    #[test]
    fn access_modes_become_csi_modes() {
        use super::spec::volume_capability::access_mode::Mode;
        let mode = |m: &[&str]| {
            let modes: Vec<String> = m.iter().map(|s| (*s).to_owned()).collect();
            super::mount_capability(&modes, "", Vec::new())
                .access_mode
                .map(|a| a.mode)
        };
        assert_eq!(
            mode(&["ReadWriteOnce"]),
            Some(Mode::SingleNodeWriter as i32)
        );
        assert_eq!(
            mode(&["ReadWriteOncePod"]),
            Some(Mode::SingleNodeSingleWriter as i32)
        );
        assert_eq!(
            mode(&["ReadOnlyMany"]),
            Some(Mode::MultiNodeReaderOnly as i32)
        );
        assert_eq!(
            mode(&["ReadWriteMany"]),
            Some(Mode::MultiNodeMultiWriter as i32)
        );
        assert_eq!(
            mode(&["ReadWriteOnce", "ReadOnlyMany"]),
            Some(Mode::SingleNodeWriter as i32)
        );
    }

    #[test]
    fn names_are_upstreams() {
        assert_eq!(
            super::hex_sha256(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let n = super::attachment_name("vol-1", "disk.csi.kumo.dev", "node-a");
        assert_eq!(
            n,
            format!("csi-{}", super::hex_sha256("vol-1disk.csi.kumo.devnode-a"))
        );
        assert_eq!(n.len(), 68);
        assert_eq!(
            super::unique_name("disk.csi.kumo.dev", "vol-1"),
            "kubernetes.io/csi/disk.csi.kumo.dev^vol-1"
        );
    }
}
