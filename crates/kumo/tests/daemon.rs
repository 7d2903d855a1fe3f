//! `kumo up -d`, `kumo status` and `kumo down` as a user runs them: the real binary in the
//! background, its context merged into the user's kubeconfig (`$KUBECONFIG`, a file of the
//! test's), the real kubectl with no export.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The user's kubeconfig of a test: beside the data directory, never the developer's.
fn user_kubeconfig(dir: &Path) -> PathBuf {
    dir.with_file_name("user.conf")
}

fn kumo(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .env("KUBECONFIG", user_kubeconfig(dir))
        .output()
        .expect("kumo runs")
}

/// `kumo ARGS` with no --data-dir: the cluster of the kubeconfig's current context.
fn kumo_plain(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(args)
        .env("KUBECONFIG", user_kubeconfig(dir))
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
    assert!(
        stdout.contains(&format!(
            "kumo: context kumo-kumo set in {} (now current)",
            user_kubeconfig(&dir).display()
        )),
        "{stdout}"
    );
    let kubeconfig = user_kubeconfig(&dir);
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

    // `kumo status` (no --data-dir: the current context's cluster) shows the process, the
    // API server and the components' leases.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let out = kumo_plain(&["status"], &dir);
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
    // ... and takes its context out of the user's kubeconfig, as `kind delete cluster`.
    assert!(
        text(&down.stdout).contains("context kumo-kumo removed from"),
        "{}",
        text(&down.stdout)
    );
    let user = std::fs::read_to_string(user_kubeconfig(&dir)).unwrap();
    assert!(!user.contains("kumo-kumo"), "{user}");
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

/// A failed start is told in one line, naming what holds the port.
#[test]
fn up_detached_reports_a_failed_start_in_one_line() {
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
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "port {port} on 127.0.0.1 is held by another program"
        )) && err.contains("kumo.log"),
        "{err}"
    );
    assert!(!dir.join("kumo.pid").exists());
}

/// Two clusters side by side, as kind runs them: the second gets a context of its own,
/// and asking for the first one's port names the cluster that holds it.
#[test]
fn a_second_cluster_runs_beside_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("one");
    let two = tmp.path().join("two");
    let out = kumo(&up_args(), &one);
    let _down_one = Down(one.clone());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let port = std::fs::read_to_string(one.join("admin.conf"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("server: https://127.0.0.1:")
                .map(str::to_owned)
        })
        .unwrap();
    // Same user kubeconfig for both (they sit in the same directory).
    let taken = kumo(&["up", "-d", "--no-cloud", "--port", &port], &two);
    assert!(!taken.status.success());
    let err = text(&taken.stderr);
    assert!(
        err.contains(&format!(
            "port {port} on 127.0.0.1 is held by the kumo cluster on {}",
            one.display()
        )),
        "{err}"
    );
    let out = kumo(&up_args(), &two);
    let _down_two = Down(two.clone());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let contexts = Command::new("kubectl")
        .args(["config", "get-contexts", "-o", "name"])
        .env("KUBECONFIG", user_kubeconfig(&one))
        .output()
        .unwrap();
    assert_eq!(text(&contexts.stdout), "kumo-one\nkumo-two\n");
    for ctx in ["kumo-one", "kumo-two"] {
        let k = Command::new("kubectl")
            .args(["--context", ctx, "get", "ns", "default", "-o", "name"])
            .env("KUBECONFIG", user_kubeconfig(&one))
            .output()
            .unwrap();
        assert!(k.status.success(), "{ctx}: {}", text(&k.stderr));
    }
    // `kumo get kubeconfig` prints the cluster's own, named as in the merged one.
    let got = kumo(&["get", "kubeconfig"], &two);
    assert!(got.status.success(), "{}", text(&got.stderr));
    assert!(
        text(&got.stdout).contains("current-context: kumo-two"),
        "{}",
        text(&got.stdout)
    );
}
