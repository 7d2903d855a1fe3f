//! The driver over its gRPC socket, as the sidecars and the kubelet call it, against a real
//! kumo cloud, with real mounts (a loop device, ext4, bind mounts). Needs root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use kumo_cloud::{
    CloudConfig, CloudServer, InstanceState, RunInstanceRequest, UpdateQuotasRequest,
};
use kumo_csi::endpoint::Services;
use kumo_csi::grpc::Code;
use kumo_csi::spec::*;
use kumo_disk::mount::{is_mount_point, Loop};

/// Unmounts what the test mounted under its directory and frees its loop devices, even
/// when an assertion failed half way.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut mounts: Vec<&str> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| Path::new(m).starts_with(&self.0))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
        for f in std::fs::read_dir(self.0.join("cloud/volumes"))
            .into_iter()
            .flatten()
            .flatten()
        {
            for d in loops(&f.path()) {
                let _ = Command::new("losetup").args(["-d", &d]).status();
            }
        }
    }
}

fn loops(file: &Path) -> Vec<String> {
    let out = Command::new("losetup")
        .arg("-j")
        .arg(file)
        .output()
        .expect("losetup");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(':').next().map(str::to_owned))
        .collect()
}

fn mount_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            },
        )),
    }
}

fn zone(z: &str) -> Topology {
    Topology {
        segments: HashMap::from([(kumo_csi::ZONE_KEY.to_owned(), z.to_owned())]),
    }
}

#[tokio::test]
async fn the_driver_provisions_attaches_mounts_grows_and_deletes_cloud_volumes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = std::fs::canonicalize(tmp.path()).expect("dir");
    let _cleanup = Cleanup(dir.clone());
    let cloud = CloudServer::start(CloudConfig::new(dir.join("cloud")))
        .await
        .expect("cloud");
    let admin = cloud.client().expect("client");
    let mut ids = Vec::new();
    for z in ["kumo-1a", "kumo-1a", "kumo-1b"] {
        let i = admin
            .run_instance(&RunInstanceRequest {
                zone: Some(z.into()),
                ..Default::default()
            })
            .await
            .expect("run");
        admin
            .wait_for_instance_state(&i.id, InstanceState::Running, Duration::from_secs(10))
            .await
            .expect("running");
        ids.push(i.id);
    }
    let key = admin
        .create_access_key("csi-controller")
        .await
        .expect("key");
    let csi = admin
        .with_credentials(
            &key.access_key_id,
            key.secret_access_key.as_deref().expect("secret"),
        )
        .expect("csi client");

    let sock = dir.join("plugin/csi.sock");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let services = Services {
        identity: kumo_disk::Identity { controller: true },
        controller: Some(kumo_disk::Controller::new(csi)),
        node: Some(kumo_disk::Node::new(
            &ids[0],
            "kumo-1a",
            Arc::new(Loop::new(dir.join("cloud"))),
        )),
    };
    let s = sock.clone();
    let server = tokio::spawn(async move {
        kumo_csi::serve(&s, services, async {
            let _ = stopped.await;
        })
        .await
    });
    let mut client = None;
    for _ in 0..100 {
        if let Ok(c) = kumo_csi::Client::connect(&sock).await {
            client = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = client.expect("the driver's socket answers");
    assert_eq!(c.driver_name().await.expect("info"), "disk.csi.kumo.dev");
    let mut node = c.node.clone();
    let mut ctl = c.controller.clone();

    let info = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.node_id, ids[0]);
    assert_eq!(info.max_volumes_per_node, 25);
    assert_eq!(info.accessible_topology, Some(zone("kumo-1a")));

    // CreateVolume: the preferred zone, whole GiB, idempotent by name.
    let create = CreateVolumeRequest {
        name: "pvc-0f0e".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: (1 << 30) + 1,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap()],
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![zone("kumo-1a"), zone("kumo-1b")],
            preferred: vec![zone("kumo-1a")],
        }),
        parameters: HashMap::from([("csi.storage.k8s.io/pvc/name".into(), "data".into())]),
        ..Default::default()
    };
    let vol = ctl
        .create_volume(create.clone())
        .await
        .expect("create")
        .into_inner();
    let vol = vol.volume.expect("volume");
    assert_eq!(vol.capacity_bytes, 2 << 30);
    assert_eq!(vol.accessible_topology, vec![zone("kumo-1a")]);
    let again = ctl
        .create_volume(create.clone())
        .await
        .expect("again")
        .into_inner();
    assert_eq!(again.volume.expect("volume").volume_id, vol.volume_id);
    let cloud_vol = admin
        .describe_volume(&vol.volume_id)
        .await
        .expect("in the cloud");
    assert_eq!(
        cloud_vol
            .tags
            .get("kubernetes.io/created-for/pvc/name")
            .map(String::as_str),
        Some("data")
    );
    let mut bad = create.clone();
    bad.parameters.insert("iops".into(), "3000".into());
    let e = ctl.create_volume(bad).await.expect_err("unknown parameter");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // Staging before the controller attached the disk is refused.
    let stage = NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: dir.join("kubelet/globalmount").display().to_string(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    };
    let e = node
        .node_stage_volume(stage.clone())
        .await
        .expect_err("not attached");
    assert_eq!(e.code(), Code::InvalidArgument);

    // A deny policy on the cloud's AttachVolume comes back as the cloud said it.
    let policy = admin
        .deny("AttachVolume", Some(&key.access_key_id))
        .await
        .expect("deny");
    let publish = ControllerPublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: ids[0].clone(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    };
    let e = ctl
        .controller_publish_volume(publish.clone())
        .await
        .expect_err("denied");
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().starts_with("AccessDenied: "), "{}", e.message());
    admin.delete_policy(&policy.id).await.expect("allow");

    let published = ctl
        .controller_publish_volume(publish.clone())
        .await
        .expect("attach")
        .into_inner();
    assert_eq!(
        published
            .publish_context
            .get("devicePath")
            .map(String::as_str),
        Some("/dev/vdb")
    );
    let mut elsewhere = publish.clone();
    elsewhere.node_id = ids[1].clone();
    let e = ctl
        .controller_publish_volume(elsewhere)
        .await
        .expect_err("in use");
    assert_eq!(e.code(), Code::FailedPrecondition);

    // Stage (format once, mount), publish (bind), write; then all the way down and up
    // again: the data is on the disk.
    let mut stage = stage;
    stage.publish_context = published.publish_context.clone();
    let staging = PathBuf::from(&stage.staging_target_path);
    let target = dir.join("kubelet/pods/p1/mount");
    let publish_req = |target: &Path| NodePublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        publish_context: published.publish_context.clone(),
        staging_target_path: stage.staging_target_path.clone(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    };
    node.node_stage_volume(stage.clone()).await.expect("stage");
    node.node_stage_volume(stage.clone())
        .await
        .expect("stage is idempotent");
    assert!(is_mount_point(&staging));
    node.node_publish_volume(publish_req(&target))
        .await
        .expect("publish");
    assert!(is_mount_point(&target));
    std::fs::write(target.join("greeting"), "hello from pod 1").expect("write");
    let unpublish = |t: &Path| NodeUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        target_path: t.display().to_string(),
    };
    let unstage = NodeUnstageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
    };
    node.node_unpublish_volume(unpublish(&target))
        .await
        .expect("unpublish");
    assert!(!target.exists());
    node.node_unstage_volume(unstage.clone())
        .await
        .expect("unstage");
    assert!(!staging.exists());
    let file = kumo_cloud::server::volume_file(&dir.join("cloud"), &vol.volume_id);
    assert!(loops(&file).is_empty(), "the loop device is freed");

    node.node_stage_volume(stage.clone())
        .await
        .expect("stage again");
    let target2 = dir.join("kubelet/pods/p2/mount");
    node.node_publish_volume(publish_req(&target2))
        .await
        .expect("publish again");
    assert_eq!(
        std::fs::read_to_string(target2.join("greeting")).expect("read"),
        "hello from pod 1"
    );

    // Grow: the cloud's volume, then the file system, online.
    let grown = ctl
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 3 << 30,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .expect("expand")
        .into_inner();
    assert_eq!(
        (grown.capacity_bytes, grown.node_expansion_required),
        (3 << 30, true)
    );
    let stats = |path: &Path| NodeGetVolumeStatsRequest {
        volume_id: vol.volume_id.clone(),
        volume_path: path.display().to_string(),
        staging_target_path: String::new(),
    };
    let before = node
        .node_get_volume_stats(stats(&target2))
        .await
        .expect("stats")
        .into_inner();
    let total = |r: &NodeGetVolumeStatsResponse| {
        r.usage
            .iter()
            .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
            .map(|u| u.total)
            .unwrap_or(0)
    };
    assert!(total(&before) < 2 << 30, "{}", total(&before));
    let expand = |path: &Path, staging: &str| NodeExpandVolumeRequest {
        volume_id: vol.volume_id.clone(),
        volume_path: path.display().to_string(),
        staging_target_path: staging.to_owned(),
        ..Default::default()
    };
    match node
        .node_expand_volume(expand(&target2, &stage.staging_target_path))
        .await
    {
        Ok(_) => {}
        Err(e) => {
            // Without CAP_SYS_RESOURCE a mounted ext4 does not grow: the driver says so,
            // and the next staging grows it.
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            assert!(e.message().contains("CAP_SYS_RESOURCE"), "{}", e.message());
            node.node_unpublish_volume(unpublish(&target2))
                .await
                .expect("unpublish");
            node.node_unstage_volume(unstage.clone())
                .await
                .expect("unstage");
            node.node_stage_volume(stage.clone())
                .await
                .expect("stage grown");
            node.node_publish_volume(publish_req(&target2))
                .await
                .expect("publish");
        }
    }
    let after = node
        .node_get_volume_stats(stats(&target2))
        .await
        .expect("stats")
        .into_inner();
    assert!(total(&after) > (5 << 30) / 2, "grown to {}", total(&after));
    assert_eq!(
        std::fs::read_to_string(target2.join("greeting")).expect("read"),
        "hello from pod 1"
    );

    // An xfs volume grows while mounted.
    let mut xfs_cap = mount_cap();
    if let Some(volume_capability::AccessType::Mount(m)) = &mut xfs_cap.access_type {
        m.fs_type = "xfs".into();
    }
    let x = ctl
        .create_volume(CreateVolumeRequest {
            name: "pvc-xfs".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 1 << 30,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![xfs_cap.clone()],
            ..Default::default()
        })
        .await
        .expect("xfs volume")
        .into_inner()
        .volume
        .expect("volume");
    let ctx = ctl
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: x.volume_id.clone(),
            node_id: ids[0].clone(),
            volume_capability: Some(xfs_cap.clone()),
            ..Default::default()
        })
        .await
        .expect("attach xfs")
        .into_inner()
        .publish_context;
    assert_eq!(ctx.get("devicePath").map(String::as_str), Some("/dev/vdc"));
    let xstaging = dir.join("kubelet/xfs-globalmount").display().to_string();
    let xtarget = dir.join("kubelet/pods/p3/mount");
    node.node_stage_volume(NodeStageVolumeRequest {
        volume_id: x.volume_id.clone(),
        publish_context: ctx.clone(),
        staging_target_path: xstaging.clone(),
        volume_capability: Some(xfs_cap.clone()),
        ..Default::default()
    })
    .await
    .expect("stage xfs");
    node.node_publish_volume(NodePublishVolumeRequest {
        volume_id: x.volume_id.clone(),
        publish_context: ctx,
        staging_target_path: xstaging.clone(),
        target_path: xtarget.display().to_string(),
        volume_capability: Some(xfs_cap),
        ..Default::default()
    })
    .await
    .expect("publish xfs");
    ctl.controller_expand_volume(ControllerExpandVolumeRequest {
        volume_id: x.volume_id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: 2 << 30,
            limit_bytes: 0,
        }),
        ..Default::default()
    })
    .await
    .expect("expand xfs");
    let mut xexpand = expand(&xtarget, &xstaging);
    xexpand.volume_id = x.volume_id.clone();
    let grown = node
        .node_expand_volume(xexpand)
        .await
        .expect("xfs grows online")
        .into_inner();
    assert!(
        grown.capacity_bytes > (3 << 30) / 2,
        "{}",
        grown.capacity_bytes
    );
    node.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: x.volume_id.clone(),
        target_path: xtarget.display().to_string(),
    })
    .await
    .expect("unpublish xfs");
    node.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: x.volume_id.clone(),
        staging_target_path: xstaging,
    })
    .await
    .expect("unstage xfs");

    // Down, detach, delete (twice: the second finds nothing and succeeds).
    node.node_unpublish_volume(unpublish(&target2))
        .await
        .expect("unpublish");
    node.node_unstage_volume(unstage).await.expect("unstage");
    let detach = ControllerUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: ids[0].clone(),
        ..Default::default()
    };
    ctl.controller_unpublish_volume(detach.clone())
        .await
        .expect("detach");
    ctl.controller_unpublish_volume(detach)
        .await
        .expect("detach is idempotent");
    let delete = DeleteVolumeRequest {
        volume_id: vol.volume_id.clone(),
        ..Default::default()
    };
    ctl.delete_volume(delete.clone()).await.expect("delete");
    ctl.delete_volume(delete)
        .await
        .expect("delete is idempotent");
    assert!(!file.exists());

    // The cloud's quota is the provisioner's ResourceExhausted.
    admin
        .set_quotas(&UpdateQuotasRequest {
            max_volumes: Some(0),
            ..Default::default()
        })
        .await
        .expect("quota");
    let mut other = create;
    other.name = "pvc-2".into();
    let e = ctl.create_volume(other).await.expect_err("quota");
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(
        e.message().starts_with("VolumeLimitExceeded: "),
        "{}",
        e.message()
    );

    let _ = stop.send(());
    server.await.expect("join").expect("served");
    assert!(!sock.exists(), "the socket is removed");
    cloud.shutdown().await;
}
