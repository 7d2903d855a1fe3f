//! What the tests of `kumo up --runtime containerd` share: kubectl, polling, the host's
//! network as `ip` shows it, and a cluster run that checks, after `kumo down`, that no
//! process, mount, namespace or cgroup is left and the host's network is as it was.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

pub fn kubectl(kc: &Path, args: &[&str]) -> Out {
    kubectl_in(kc, args, None)
}

pub fn kubectl_in(kc: &Path, args: &[&str], stdin: Option<&str>) -> Out {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kc)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub fn ok(kc: &Path, args: &[&str]) -> String {
    let o = kubectl(kc, args);
    assert!(o.ok, "kubectl {args:?}: {}", o.stderr);
    o.stdout
}

/// Polls `f` until it gives Some, failing after `secs` with `what`.
pub fn eventually<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

pub fn jsonpath(kc: &Path, what: &str, path: &str) -> String {
    kubectl(kc, &["get", what, "-o", &format!("jsonpath={path}")]).stdout
}

/// The host's own links, addresses and routes (without counters and lifetimes).
pub fn host_network() -> String {
    let mut out = String::new();
    for args in [
        &["-o", "link", "show"][..],
        &["-o", "addr", "show"],
        &["route", "show", "table", "all"],
        &["rule", "show"],
    ] {
        let o = Command::new("ip").args(args).output().unwrap();
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

/// The processes whose command line mentions `dir` (containerd and its shims are started
/// with paths under the data directory).
pub fn processes_under(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(&needle) && pid != std::process::id() {
            found.push(format!("{pid}: {text}"));
        }
    }
    found
}

pub fn crictl() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.reference/bin/crictl");
    assert!(
        p.is_file(),
        "{} missing: scripts/reference build makes it",
        p.display()
    );
    p
}

/// Runs `kumo up -d --runtime containerd` with `args` in a fresh data directory, hands
/// `exercise` the kubeconfig, the data directory and what `kumo up` printed, then runs
/// `kumo down` and checks that nothing of the cluster is left: processes, mounts, the
/// machines' and the VPC's namespaces, cgroups, records; and that the host's links,
/// addresses, routes and rules are as before. On a failure the log's warnings and tail
/// are printed.
pub fn with_real_cluster(args: &[&str], exercise: impl FnOnce(&Path, &Path, &str)) {
    kumo_node::prerequisites().expect("the containerd runtime's prerequisites");
    let before = host_network();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("c");
    let kumo = env!("CARGO_BIN_EXE_kumo");
    let up = Command::new(kumo)
        .args(["up", "-d", "--runtime", "containerd", "--port", "0"])
        .args(args)
        .args(["--kubeconfig-update=false", "--data-dir"])
        .arg(&data)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&up.stdout).into_owned();
    let kc = data.join("admin.conf");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(printed.contains("kumo: ready"), "{printed}");
        exercise(&kc, &data, &printed)
    }));
    // What the nodes' machines and the VPC are, to check they are gone after.
    // (The nodes' machines, and Cluster API's under their instances.)
    let recorded = |dir: PathBuf, sub: &str| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path().join(sub).join("node.json"))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let mut files = recorded(data.join("nodes"), "");
    files.extend(recorded(data.join("machines"), "node"));
    let records: Vec<(PathBuf, serde_json::Value)> = files
        .into_iter()
        .filter_map(|p| Some((p.clone(), std::fs::read_to_string(&p).ok()?)))
        .filter_map(|(p, t)| Some((p, serde_json::from_str(&t).ok()?)))
        .collect();
    let vpc: Option<serde_json::Value> =
        std::fs::read_to_string(data.join("cloud").join("vpc").join("vpc.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
    let down = Command::new(kumo)
        .args(["down", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    if let Err(e) = result {
        let log = std::fs::read_to_string(data.join("kumo.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        // The warnings tell why a node did not come up; the tail what happened last.
        let warned: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .take(30)
            .collect();
        eprintln!(
            "kumo up printed:\n{printed}\nwarnings:\n{}\nlog tail:\n{}",
            warned.join("\n"),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        std::panic::resume_unwind(e);
    }
    assert!(up.status.success(), "kumo up: {printed}");
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    // Nothing of the nodes' machines is left.
    let left = processes_under(&data);
    assert!(left.is_empty(), "processes left: {left:#?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*data.to_string_lossy()),
        "mounts left: {mounts}"
    );
    assert!(!records.is_empty(), "the nodes recorded their machines");
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout);
    for (file, r) in &records {
        let name = r["netns"].as_str().unwrap();
        assert!(!netns.contains(name), "namespace {name} left");
        let cgroup = format!(
            "/sys/fs/cgroup/memory{}",
            r["cgroup_root"].as_str().unwrap()
        );
        assert!(!Path::new(&cgroup).exists(), "{cgroup} left");
        assert!(!file.exists(), "{} still recorded", file.display());
    }
    if let Some(v) = &vpc {
        for key in ["netns", "public_netns"] {
            let name = v[key].as_str().unwrap();
            assert!(!netns.contains(name), "the VPC's namespace {name} left");
        }
    }
    assert_eq!(host_network(), before, "the host's network changed");
}
