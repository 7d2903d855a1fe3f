//! Helpers the kubectl-driven tests share: start an in-process `kumo apiserver` on a
//! temporary directory and run the real kubectl against it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kumo_apiserver::{ApiServer, ApiServerConfig};

pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// kubectl (or `kubectl.1.NN` from the directory of the real kubectl binary).
pub fn kubectl_bin(version: Option<&str>) -> PathBuf {
    let base = std::fs::canonicalize(which("kubectl")).unwrap();
    match version {
        None => base,
        Some(v) => base.with_file_name(format!("kubectl.{v}")),
    }
}

pub fn which(name: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not on PATH"))
}

pub fn run(bin: &Path, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Out {
    let mut child = Command::new(bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().unwrap();
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub async fn start() -> (ApiServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ApiServerConfig::new(dir.path());
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let server = ApiServer::start(cfg).await.unwrap();
    (server, dir)
}

/// Runs kubectl on a blocking thread so the in-process server keeps serving.
pub async fn k(kubeconfig: &Path, args: &[&str]) -> Out {
    k_in(None, kubeconfig, args, None).await
}

pub async fn k_in(
    version: Option<&str>,
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Out {
    let bin = kubectl_bin(version);
    let kc = kubeconfig.to_owned();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&bin, &kc, &a, stdin.as_deref())
    })
    .await
    .unwrap()
}

/// The next line a watcher printed, failing after 20 s.
pub async fn next_line(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("watch event within 20 s")
        .expect("watcher still running")
}

pub fn out_json(out: &Out) -> serde_json::Value {
    assert!(out.ok, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

/// The answer to a request made with curl.
pub struct Http {
    pub code: u16,
    pub body: serde_json::Value,
    /// The `Warning` headers, as sent.
    pub warnings: Vec<String>,
}

/// A request by curl with the admin's client certificate (taken from its kubeconfig), for
/// what kubectl cannot send (apply patches written by hand, an error's whole Status).
/// `body` is (Content-Type, text).
pub fn curl(
    dir: &Path,
    admin: &Path,
    method: &str,
    path: &str,
    body: Option<(&str, &str)>,
) -> Http {
    use base64::Engine;
    let kc: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(admin).unwrap()).unwrap();
    let field = |k: &str| {
        let b64 = kc["users"][0]["user"][k].as_str().unwrap();
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap()
    };
    let (cert, key) = (dir.join("curl-admin.crt"), dir.join("curl-admin.key"));
    std::fs::write(&cert, field("client-certificate-data")).unwrap();
    std::fs::write(&key, field("client-key-data")).unwrap();
    let server = kc["clusters"][0]["cluster"]["server"].as_str().unwrap();
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-D", "-", "-X", method, "--cacert"])
        .arg(dir.join("pki/ca.crt"))
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key);
    if let Some((content_type, text)) = body {
        cmd.args(["-H", &format!("Content-Type: {content_type}")])
            .args(["--data-binary", text]);
    }
    let out = cmd
        .arg(format!("{server}{path}"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, answer) = text.split_once("\r\n\r\n").unwrap();
    Http {
        code: head.split_whitespace().nth(1).unwrap().parse().unwrap(),
        body: serde_json::from_str(answer).unwrap(),
        warnings: head
            .lines()
            .filter_map(|l| {
                let (name, value) = l.split_once(": ")?;
                name.eq_ignore_ascii_case("warning")
                    .then(|| value.to_owned())
            })
            .collect(),
    }
}
