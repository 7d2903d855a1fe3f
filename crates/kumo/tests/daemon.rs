//! `kumo up -d`, `kumo status` and `kumo down` as a user runs them: the real binary in the
//! background, the real kubectl against the kubeconfig it prints.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn kumo(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .output()
        .expect("kumo runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Stops the background kumo when the test ends, even on a failed assertion.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = kumo(&["down"], &self.0);
    }
}

/// Whether the process is there (a zombie waiting for its reaper is not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit_once(')').map(|(_, r)| r.trim_start().to_owned());
            !state.is_some_and(|r| r.starts_with('Z') || r.starts_with('X'))
        })
        .unwrap_or(false)
}

/// `kumo up -d` without the cloud: this test is about the daemon, not the cloud.
fn up_args() -> Vec<&'static str> {
    vec!["up", "-d", "--port", "0", "--no-cloud"]
}

#[test]
fn up_detached_status_and_down() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kumo");
    let started = Instant::now();
    let out = kumo(&up_args(), &dir);
    let _down = Down(dir.clone());
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "kumo up -d failed:\n{stdout}\n{}",
        text(&out.stderr)
    );
    eprintln!("kumo up -d returned in {:?}", started.elapsed());
    // It printed what the foreground `kumo up` prints, then where it runs.
    assert!(
        stdout.starts_with("kumo: API server ready at https://127.0.0.1:"),
        "{stdout}"
    );
    let kubeconfig = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("export KUBECONFIG="))
        .unwrap_or_else(|| panic!("no KUBECONFIG line in {stdout}"))
        .to_owned();
    let pid: u32 = stdout
        .split("running in the background (pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {stdout}"));
    assert_eq!(
        std::fs::read_to_string(dir.join("kumo.pid"))
            .unwrap()
            .trim(),
        pid.to_string()
    );
    assert!(alive(pid), "pid {pid} is not running");
    assert!(dir.join("kumo.log").exists());

    // The cluster answers right away.
    let k = Command::new("kubectl")
        .args(["get", "namespaces", "-o", "name"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(k.status.success(), "{}", text(&k.stderr));
    assert!(text(&k.stdout).contains("namespace/default"));

    // `kumo status` shows the process, the API server and the components' leases.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let out = kumo(&["status"], &dir);
        let s = text(&out.stdout);
        let fresh = |name: &str| {
            s.lines()
                .any(|l| l.starts_with(name) && l.contains(" fresh "))
        };
        if out.status.success() && fresh("kube-controller-manager") && fresh("kube-scheduler") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "kumo status never showed both leases fresh:\n{s}\n{}",
            text(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(status.contains(&format!("running (pid {pid})")), "{status}");
    assert!(status.contains("ready (/readyz ok)"), "{status}");
    assert!(status.contains("COMPONENT"), "{status}");
    assert!(status.contains("cloud-controller-manager"), "{status}");
    assert!(status.contains("  cloud:      "), "{status}");

    // A second one on the same data directory is refused, and the first keeps running.
    let again = kumo(&up_args(), &dir);
    assert!(!again.status.success(), "a second kumo up -d started");
    let err = text(&again.stderr);
    assert!(
        err.contains("already running") && err.contains(&pid.to_string()),
        "{err}"
    );
    assert!(alive(pid));
    // So is a foreground one.
    let fg = kumo(&["up", "--port", "0"], &dir);
    assert!(!fg.status.success(), "a foreground kumo up started");
    assert!(
        text(&fg.stderr).contains("already running"),
        "{}",
        text(&fg.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("kumo.pid"))
            .unwrap()
            .trim(),
        pid.to_string()
    );

    // `kumo down` stops it and removes the pid file.
    let down = kumo(&["down"], &dir);
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert!(
        text(&down.stdout).contains(&format!("stopped (pid {pid})")),
        "{}",
        text(&down.stdout)
    );
    assert!(!alive(pid), "pid {pid} still runs after kumo down");
    assert!(!dir.join("kumo.pid").exists());
    // It went on SIGTERM, saying so, not on SIGKILL.
    let log = std::fs::read_to_string(dir.join("kumo.log")).unwrap();
    assert!(log.contains("kumo: SIGTERM received, stopping"), "{log}");

    // Nothing runs any more: status says so (exit 1), down says so (exit 0).
    let st = kumo(&["status"], &dir);
    assert_eq!(st.status.code(), Some(1));
    assert!(
        text(&st.stdout).contains("not running"),
        "{}",
        text(&st.stdout)
    );
    let down = kumo(&["down"], &dir);
    assert!(down.status.success());
    assert!(
        text(&down.stdout).contains("kumo is not running on"),
        "{}",
        text(&down.stdout)
    );
    // The doctor says there is nobody to ask rather than failing obscurely.
    let dr = kumo(&["doctor", "service", "web"], &dir);
    assert_eq!(dr.status.code(), Some(1));
    let out = text(&dr.stdout);
    assert!(
        out.starts_with("PROBLEM: the API server at https://127.0.0.1:"),
        "{out}"
    );
    assert!(out.contains("no kumo runs on"), "{out}");
}

#[test]
fn up_detached_reports_a_failed_start_with_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kumo");
    // The port is taken, so the API server cannot listen and `kumo up` exits.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut args = up_args();
    let i = args.iter().position(|a| *a == "0").unwrap();
    args[i] = &port;
    let out = kumo(&args, &dir);
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "kumo up -d on a taken port succeeded"
    );
    assert!(
        err.contains("before the cluster was ready") && err.contains("kumo.log"),
        "{err}"
    );
    assert!(!dir.join("kumo.pid").exists());
}
