//! `kumo cloud ...` as a user runs it: the real binary serves a cloud on loopback, and the
//! client commands drive it through the data directory (or the environment).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Kills the server when the test ends, even on a failed assertion.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["cloud", "serve", "--port", "0", "--data-dir"])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kumo cloud serve");
    let stdout = child.stdout.take().expect("stdout");
    let server = Server(child);
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().expect("a line").expect("utf-8");
    let second = lines.next().expect("a line").expect("utf-8");
    // Keep draining so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (server, format!("{first}\n{second}"))
}

fn kumo(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kumo"))
        .arg("cloud")
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .env_remove("KUMO_CLOUD_DATA_DIR")
        .output()
        .expect("kumo cloud")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let o = kumo(dir, args);
    assert!(
        o.status.success(),
        "kumo cloud {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fails(dir: &Path, args: &[&str]) -> String {
    let o = kumo(dir, args);
    assert!(!o.status.success(), "kumo cloud {args:?} succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn wait_for(dir: &Path, args: &[&str], needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = ok(dir, args);
        if out.contains(needle) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "{args:?} never showed {needle}:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kumo_cloud_cli() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let (_server, banner) = serve(dir);
    assert!(
        banner.contains("region kumo-1 serving on https://127.0.0.1:"),
        "{banner}"
    );
    assert!(banner.contains("credentials.json"), "{banner}");

    let out = ok(
        dir,
        &["instance", "run", "--name", "node-1", "--zone", "kumo-1a"],
    );
    assert!(
        out.contains("launched in kumo-1a with private IP 10.0.1.4"),
        "{out}"
    );
    let id = out
        .split_whitespace()
        .find(|w| w.starts_with("i-"))
        .expect("an instance id")
        .to_owned();
    assert_eq!(id.len(), 19);

    let table = wait_for(dir, &["instances", "list"], "running");
    let header = table.lines().next().expect("header");
    assert!(header.starts_with("ID") && header.contains("STATE") && header.contains("PRIVATE-IP"));
    assert!(table.contains(&id) && table.contains("ip-10-0-1-4.kumo-1.compute.internal"));

    assert!(ok(dir, &["instance", "stop", &id]).contains("stopping"));
    wait_for(dir, &["instances", "list", "--state", "stopped"], &id);
    ok(dir, &["instance", "start", &id]);
    wait_for(
        dir,
        &[
            "instances",
            "list",
            "--state",
            "running",
            "--tag",
            "Name=node-1",
        ],
        &id,
    );

    let err = fails(dir, &["instance", "stop", "i-00000000000000000"]);
    assert!(
        err.starts_with("error: InvalidInstanceID.NotFound: The instance ID 'i-00000000000000000' does not exist"),
        "{err}"
    );

    // A deny policy, then lifted.
    assert!(ok(dir, &["policy", "deny", "RunInstances"]).contains("deny RunInstances"));
    let err = fails(dir, &["instance", "run", "--name", "node-2"]);
    assert!(
        err.contains("AccessDenied") && err.contains("RunInstances"),
        "{err}"
    );
    assert!(ok(dir, &["policy", "list"]).contains("RunInstances"));
    assert!(ok(dir, &["policy", "allow", "RunInstances"]).contains("allowed again"));
    ok(dir, &["instance", "run", "--name", "node-2"]);

    // Faults.
    ok(
        dir,
        &[
            "faults",
            "set",
            "--operation",
            "DescribeInstances",
            "--error-rate",
            "1.0",
        ],
    );
    let err = fails(dir, &["instances", "list"]);
    assert!(err.contains("ServiceUnavailable"), "{err}");
    assert!(ok(dir, &["faults", "list"]).contains("DescribeInstances"));
    ok(dir, &["faults", "clear"]);
    ok(dir, &["instances", "list"]);
    let err = fails(
        dir,
        &[
            "faults",
            "set",
            "--operation",
            "RunInstances",
            "--error-rate",
            "2",
        ],
    );
    assert!(err.contains("InvalidParameterValue"), "{err}");

    let lbs = ok(dir, &["lbs", "list"]);
    assert!(lbs.starts_with("ID") && lbs.contains("VIP"), "{lbs}");
    let routes = ok(dir, &["routes", "list"]);
    assert!(
        routes.contains("10.0.0.0/16") && routes.contains("local"),
        "{routes}"
    );

    // Another credential, given by flags alone, and a deny policy for it only.
    let key: serde_json::Value =
        serde_json::from_str(&ok(dir, &["access-keys", "create", "ccm"])).expect("key json");
    let id_ = key["accessKeyId"].as_str().expect("id").to_owned();
    let secret = key["secretAccessKey"].as_str().expect("secret").to_owned();
    let endpoint: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("endpoint.json")).expect("endpoint"))
            .expect("json");
    let as_ccm = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kumo"))
            .arg("cloud")
            .args(args)
            .args(["--endpoint", endpoint["url"].as_str().expect("url")])
            .args(["--access-key-id", &id_, "--secret-access-key", &secret])
            .arg("--ca-file")
            .arg(dir.join("ca.crt"))
            .env_remove("KUMO_CLOUD_DATA_DIR")
            .env("HOME", dir.join("no-home"))
            .output()
            .expect("kumo")
    };
    let o = as_ccm(&["instances", "list"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&id));
    ok(
        dir,
        &["policy", "deny", "DescribeInstances", "--credential", &id_],
    );
    let o = as_ccm(&["instances", "list"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("AccessDenied") && err.contains(&id_),
        "{err}"
    );
    ok(dir, &["instances", "list"]);
    ok(
        dir,
        &["policy", "allow", "DescribeInstances", "--credential", &id_],
    );
    assert!(as_ccm(&["instances", "list"]).status.success());

    // The environment works as well as --data-dir.
    let o = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["cloud", "instances", "list", "-o", "json"])
        .env("KUMO_CLOUD_DATA_DIR", dir)
        .output()
        .expect("kumo");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v.as_array().expect("array").len(), 2);

    assert!(ok(dir, &["instance", "terminate", &id]).contains("terminating"));
    wait_for(dir, &["instances", "list", "--state", "terminated"], &id);
    let err = fails(dir, &["instance", "start", &id]);
    assert!(err.contains("IncorrectInstanceState"), "{err}");

    // SIGTERM stops the cloud cleanly; a new one on the same directory has everything.
    let before = ok(dir, &["instances", "list", "-o", "json"]);
    let mut server = _server;
    let st = Command::new("kill")
        .arg(server.0.id().to_string())
        .status()
        .expect("kill");
    assert!(st.success());
    let code = server.0.wait().expect("wait");
    assert!(code.success(), "{code:?}");
    assert!(!dir.join("cloud.pid").exists());
    let (_server2, _) = serve(dir);
    assert_eq!(ok(dir, &["instances", "list", "-o", "json"]), before);
}

#[test]
fn client_commands_without_a_cloud_explain_what_is_missing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let o = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["cloud", "instances", "list", "--data-dir"])
        .arg(tmp.path())
        .output()
        .expect("kumo");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("endpoint.json"), "{err}");
}
