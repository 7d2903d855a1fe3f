//! `kumo up` starts what has landed and tells the user how to reach it with kubectl.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn kumo_up_prints_a_working_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["up", "--port", "0", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut kubeconfig = None;
    let mut printed = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        printed.push(line.clone());
        if let Some(path) = line.trim().strip_prefix("export KUBECONFIG=") {
            kubeconfig = Some(path.to_owned());
            break;
        }
    }
    let kubeconfig = kubeconfig.unwrap_or_else(|| panic!("no KUBECONFIG line in {printed:?}"));
    assert!(
        printed[0].starts_with("kumo: API server ready at https://127.0.0.1:"),
        "{printed:?}"
    );
    let out = Command::new("kubectl")
        .args(["get", "namespaces", "-o", "name"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/default"));
}
