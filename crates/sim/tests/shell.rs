//! The sim runtime's containers run their scripts over the pod's simulated files: what
//! one container writes to an emptyDir the next one reads, a restart sees what the last
//! attempt left, exec probes read the files as of their time.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime};

use kumo_sim::runtime::fs::{Mount, Source};
use kumo_sim::runtime::{ContainerConfig, Runtime, Sim, State};

fn config(name: &str, script: &str) -> ContainerConfig {
    ContainerConfig {
        name: name.into(),
        image: "busybox".into(),
        command: vec!["/bin/sh".into(), "-c".into()],
        args: vec![script.into()],
        hostname: "pod-0".into(),
        pod_ip: "10.244.0.7".into(),
        mounts: vec![Mount {
            path: "/data".into(),
            source: Source::EmptyDir("data".into()),
            read_only: false,
            sub_path: String::new(),
            tmpfs: false,
        }],
        ..Default::default()
    }
}

fn run(sim: &Sim, sandbox: &str, c: &ContainerConfig) -> String {
    let id = sim
        .create_container(sandbox, c, "busybox@sha256:x")
        .unwrap();
    sim.start_container(&id).expect("start");
    id
}

fn exit_code(sim: &Sim, id: &str) -> Option<i32> {
    match sim.container_status(id).expect("status").state {
        State::Exited { exit_code, .. } => Some(exit_code),
        _ => None,
    }
}

#[test]
fn containers_share_the_pods_files() {
    let sim = Sim::default();
    let sb = sim
        .run_pod_sandbox(&kumo_cri::SandboxConfig {
            uid: "u1".into(),
            ..Default::default()
        })
        .unwrap();
    let init = run(
        &sim,
        &sb,
        &config("init", "echo ready > /data/state; echo private > /tmp/own"),
    );
    assert_eq!(exit_code(&sim, &init), Some(0));
    let main = run(
        &sim,
        &sb,
        &config(
            "main",
            "cat /data/state; if [ -f /tmp/own ]; then exit 9; fi; grep -q ready /data/state || exit 2; exit 5",
        ),
    );
    assert_eq!(exit_code(&sim, &main), Some(5));
    assert!(sim
        .read_logs(&main)
        .expect("logs")
        .contains("stdout F ready\n"));
    // The e2e Job's failOnce: the first attempt fails and leaves a marker, the restart
    // finds it.
    let script = "if [[ -r /data/foo ]]\nthen\n  exit 0\nelse\n  touch /data/foo\n  exit 1\nfi";
    let first = run(&sim, &sb, &config("job", script));
    assert_eq!(exit_code(&sim, &first), Some(1));
    let second = run(&sim, &sb, &config("job", script));
    assert_eq!(exit_code(&sim, &second), Some(0));
    // Another pod has its own emptyDir.
    let other = sim
        .run_pod_sandbox(&kumo_cri::SandboxConfig {
            uid: "u2".into(),
            ..Default::default()
        })
        .unwrap();
    let third = run(&sim, &other, &config("job", script));
    assert_eq!(exit_code(&sim, &third), Some(1));
    // Removing the sandbox forgets its files.
    sim.remove_pod_sandbox(&sb);
    let sb = sim
        .run_pod_sandbox(&kumo_cri::SandboxConfig {
            uid: "u1".into(),
            ..Default::default()
        })
        .unwrap();
    let again = run(&sim, &sb, &config("job", script));
    assert_eq!(exit_code(&sim, &again), Some(1));
}

#[test]
fn exec_probes_see_the_files_of_their_time() {
    let sim = Sim::default();
    let sb = sim
        .run_pod_sandbox(&kumo_cri::SandboxConfig {
            uid: "u1".into(),
            ..Default::default()
        })
        .unwrap();
    let id = run(
        &sim,
        &sb,
        &config(
            "c",
            "echo ok > /tmp/health; sleep 10; rm -rf /tmp/health; sleep 600",
        ),
    );
    let cmd = vec!["cat".to_owned(), "/tmp/health".to_owned()];
    let now = SystemTime::now();
    let second = Duration::from_secs(1);
    assert_eq!(sim.probe_exec(&id, &cmd, now, second), Some(true));
    assert_eq!(
        sim.probe_exec(&id, &cmd, now + Duration::from_secs(11), second),
        Some(false)
    );
    // A probe that takes longer than its timeout fails.
    let slow = vec!["/bin/sh".to_owned(), "-c".to_owned(), "sleep 10".to_owned()];
    assert_eq!(sim.probe_exec(&id, &slow, now, second), Some(false));
    assert_eq!(
        sim.probe_exec(&id, &slow, now, Duration::from_secs(20)),
        Some(true)
    );
}

#[test]
fn projected_files_follow_their_source() {
    let sim = Sim::default();
    let sb = sim
        .run_pod_sandbox(&kumo_cri::SandboxConfig {
            uid: "u1".into(),
            ..Default::default()
        })
        .unwrap();
    let files = |v: &str| {
        let mut m = std::collections::BTreeMap::new();
        m.insert("data-1".to_owned(), (v.as_bytes().to_vec(), 0o644));
        m
    };
    let mut c = config(
        "c",
        "while true; do cat /etc/cm/data-1; echo; sleep 1; done",
    );
    c.mounts = vec![Mount {
        path: "/etc/cm".into(),
        source: Source::Files(files("value-1")),
        read_only: true,
        sub_path: String::new(),
        tmpfs: true,
    }];
    let id = run(&sim, &sb, &c);
    assert!(sim.read_logs(&id).expect("logs").contains("value-1"));
    let mut updated = c.clone();
    updated.mounts[0].source = Source::Files(files("value-2"));
    sim.refresh_volumes(&id, &updated);
    std::thread::sleep(Duration::from_millis(1100));
    let logs = sim.read_logs(&id).expect("logs");
    assert!(
        logs.contains("value-1") && logs.contains("value-2"),
        "{logs}"
    );
    // What it printed before the update stays as it was.
    assert!(logs.find("value-1") < logs.find("value-2"));
}
