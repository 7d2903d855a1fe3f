//! A node's machine for real: containerd in a namespace of its own, a pod sandbox and a
//! busybox container run through the CRI client, and nothing left on the host after.
//! Needs root, containerd, runc, the CNI plugins and the offline images
//! (busybox-static; scripts/test installs them).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use kumo_cri::{ContainerConfig, Runtime, SandboxConfig, State};
use kumo_cri_remote::{Options, RemoteRuntime};
use kumo_node::{NodeHost, NodeSpec};

fn images(dir: &std::path::Path) -> Vec<PathBuf> {
    kumo_node::images::build(dir).expect("packing the offline images")
}

/// The host's own links, addresses, routes and namespaces, to compare before and after.
fn host_network() -> String {
    let mut out = String::new();
    for args in [
        &["-o", "link", "show"][..],
        &["-o", "addr", "show"],
        &["route", "show", "table", "all"],
    ] {
        let o = Command::new("ip").args(args).output().expect("ip");
        // Link counters and states change by themselves; names and addresses do not.
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let words: Vec<&str> = line
                .split_whitespace()
                .filter(|w| !w.starts_with("valid_lft") && !w.starts_with("preferred_lft"))
                .collect();
            out.push_str(&words.join(" "));
            out.push('\n');
        }
    }
    out
}

#[test]
fn a_container_runs_on_containerd_in_the_nodes_namespace_and_leaves_nothing() {
    kumo_node::prerequisites().expect("the containerd runtime's prerequisites");
    let before = host_network();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("nodes").join("n1");
    std::fs::create_dir_all(&dir).unwrap();
    // Whatever happens below, the machine goes before the directory does.
    let _guard = kumo_node::TeardownGuard(dir.clone());
    let host = NodeHost::start(&NodeSpec {
        name: "n1".into(),
        dir: dir.clone(),
        images: images(tmp.path()),
    })
    .expect("starting the node's containerd");
    let rt = RemoteRuntime::connect(Options {
        socket: host.socket(),
        root_dir: dir.join("kubelet"),
        pod_logs_dir: dir.join("pods"),
        netns: Some(host.netns_path()),
    })
    .expect("connecting to containerd");
    assert_eq!(rt.version().0, "containerd");
    rt.update_pod_cidr("10.244.7.0/24").expect("pod range");
    let sandbox = rt
        .run_pod_sandbox(&SandboxConfig {
            name: "p".into(),
            namespace: "default".into(),
            uid: "uid-1".into(),
            hostname: "p".into(),
            cgroup_parent: format!("{}/kubepods/besteffort/poduid-1", host.record().cgroup_root),
            ..Default::default()
        })
        .expect("sandbox");
    let ip = rt.pod_sandbox_ip(&sandbox).expect("the sandbox's address");
    assert!(ip.to_string().starts_with("10.244.7."), "{ip}");
    let image = rt
        .image_status("docker.io/library/busybox:latest")
        .expect("busybox was imported");
    let mut files = BTreeMap::new();
    files.insert("/etc/hosts".to_owned(), format!("{ip}\tp\n"));
    let id = rt
        .create_container(
            &sandbox,
            &ContainerConfig {
                name: "c".into(),
                image: "busybox".into(),
                command: vec!["sh".into(), "-c".into()],
                args: vec!["echo hello from $(hostname); cat /etc/hosts; echo bye > /dev/termination-log; exit 3".into()],
                termination_message_path: "/dev/termination-log".into(),
                memory_limit_bytes: Some(32 << 20),
                files,
                ..Default::default()
            },
            &image,
        )
        .expect("container");
    rt.start_container(&id).expect("start");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let s = rt.container_status(&id).expect("status");
        if matches!(s.state, State::Exited { .. }) {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the container did not exit: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        matches!(status.state, State::Exited { exit_code: 3, .. }),
        "{status:?}"
    );
    assert_eq!(status.message.as_deref(), Some("bye\n"));
    let logs = rt.read_logs(&id).expect("logs");
    assert!(logs.contains(" stdout F hello from p"), "{logs}");
    assert!(logs.contains(&format!("{ip}\tp")), "{logs}");
    // A memory-backed emptyDir is a tmpfs; fsGroup owns it (setgid) and a non-root
    // user in that group writes to it.
    let id = rt
        .create_container(
            &sandbox,
            &ContainerConfig {
                name: "vol".into(),
                image: "busybox".into(),
                command: vec!["sh".into(), "-c".into()],
                args: vec!["stat -c '%a %g' /cache; grep ' /cache ' /proc/mounts | cut -d' ' -f3; id -G; touch /cache/x && echo wrote".into()],
                user: Some((1000, Some(1000))),
                fs_group: Some(1234),
                mounts: vec![kumo_cri::Mount {
                    path: "/cache".into(),
                    source: kumo_cri::Source::EmptyDir("cache".into()),
                    read_only: false,
                    sub_path: String::new(),
                    tmpfs: true,
                }],
                ..Default::default()
            },
            &image,
        )
        .expect("container");
    rt.start_container(&id).expect("start");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !matches!(
        rt.container_status(&id).expect("status").state,
        State::Exited { .. }
    ) {
        assert!(
            Instant::now() < deadline,
            "the volume container did not exit"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs = rt.read_logs(&id).expect("logs");
    for want in [
        " stdout F 2777 1234",
        " stdout F tmpfs",
        "1234",
        " stdout F wrote",
    ] {
        assert!(logs.contains(want), "{want:?} not in {logs}");
    }
    rt.remove_pod_sandbox(&sandbox);
    // Image garbage collection: a few MB of images in 100 GiB are below the threshold;
    // past it (0 % here), every image no container uses goes, the sandbox image aside.
    assert_eq!(
        rt.collect_images(85, 80, 100 << 30).unwrap(),
        Vec::<String>::new()
    );
    let removed = rt.collect_images(0, 0, 100 << 30).expect("image gc");
    assert!(removed.iter().any(|i| i.contains("busybox")), "{removed:?}");
    assert!(rt
        .image_status("docker.io/library/busybox:latest")
        .is_none());
    assert!(rt.image_status(kumo_node::PAUSE_IMAGE).is_some());
    drop(rt);
    kumo_node::teardown(host.dir()).expect("teardown");
    assert!(!host.netns_path().exists());
    assert_eq!(host_network(), before, "the host's network changed");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*tmp.path().to_string_lossy()),
        "mounts left:\n{mounts}"
    );
    let cgroup = format!("/sys/fs/cgroup/memory{}", host.record().cgroup_root);
    assert!(!std::path::Path::new(&cgroup).exists(), "{cgroup} left");
}
