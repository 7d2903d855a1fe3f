//! `kumo bench api` against a real kube-apiserver (the reference, `scripts/reference up`):
//! every verb at every concurrency answers, without errors, and the namespace the benchmark
//! made is gone afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

const VERBS: [&str; 10] = [
    "create",
    "get",
    "list",
    "list-paged",
    "list-all",
    "update",
    "patch-merge",
    "patch-strategic",
    "watch",
    "delete",
];
const CONCURRENCY: [usize; 2] = [1, 4];

fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// A reference control plane in a temporary directory, stopped on drop.
struct Reference {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Reference {
    fn up() -> Reference {
        let root = repo_root();
        let apiserver = root.join(".reference/bin/kube-apiserver");
        assert!(
            apiserver.exists(),
            "{} is missing: run `scripts/reference build --no-e2e` (or `scripts/reference build`) \
             first; this test needs the reference kube-apiserver",
            apiserver.display()
        );
        let tmp = tempfile::tempdir().unwrap();
        // `up` makes the directory itself (and refuses one it did not make).
        let dir = tmp.path().join("reference");
        let out = Command::new(root.join("scripts/reference"))
            .args(["up", "--dir"])
            .arg(&dir)
            .output()
            .unwrap();
        let reference = Reference { dir, _tmp: tmp };
        assert!(
            out.status.success(),
            "scripts/reference up failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        reference
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("scripts/reference"))
            .args(["down", "--dir"])
            .arg(&self.dir)
            .output();
    }
}

#[test]
fn bench_api_against_the_reference() {
    let reference = Reference::up();
    let kubeconfig = reference.dir.join("admin.kubeconfig");
    let out = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["bench", "api", "--kubeconfig"])
        .arg(&kubeconfig)
        .args([
            "--seconds",
            "1",
            "--concurrency",
            "1,4",
            "--objects",
            "50",
            "--reference-dir",
        ])
        .arg(&reference.dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kumo bench api failed:\n{stdout}\n{stderr}"
    );

    // The table: a header line, then one row per resource, verb and concurrency.
    let mut lines = stdout.lines();
    let header = lines
        .by_ref()
        .find(|l| l.starts_with("resource "))
        .unwrap_or_else(|| panic!("no table in the output:\n{stdout}"));
    let columns: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        columns,
        [
            "resource", "verb", "conc", "ops", "ops/s", "p50", "ms", "p99", "ms", "errors", "409s",
            "cli", "cpu", "srv", "cpu", "oth", "cpu"
        ],
        "table header changed:\n{stdout}"
    );
    let rows: Vec<Vec<&str>> = lines
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    for verb in VERBS {
        for conc in CONCURRENCY {
            let row = rows
                .iter()
                .find(|r| r[0] == "configmaps" && r[1] == verb && r[2] == conc.to_string())
                .unwrap_or_else(|| panic!("no row for {verb} at concurrency {conc}:\n{stdout}"));
            let ops: u64 = row[3].parse().unwrap();
            let ops_per_sec: f64 = row[4].parse().unwrap();
            let p99: f64 = row[6].parse().unwrap();
            let errors: u64 = row[7].parse().unwrap();
            assert!(
                ops > 0 && ops_per_sec > 0.0,
                "{verb} at {conc}: no throughput:\n{stdout}"
            );
            assert!(p99 > 0.0, "{verb} at {conc}: no latency:\n{stdout}");
            assert_eq!(errors, 0, "{verb} at {conc}: errors:\n{stdout}\n{stderr}");
        }
    }
    assert_eq!(
        rows.len(),
        VERBS.len() * CONCURRENCY.len(),
        "unexpected rows:\n{stdout}"
    );
    assert!(
        stdout.contains("memory of kube-apiserver (pid ")
            && stdout.contains("with the 50 objects stored: "),
        "no memory with the objects stored:\n{stdout}"
    );
    assert!(
        stdout.contains("memory of kube-apiserver (pid ")
            && stdout.contains("memory of etcd (pid "),
        "no server memory in the output:\n{stdout}"
    );

    // The namespace it made is gone.
    let ns = stdout
        .lines()
        .find_map(|l| l.strip_prefix("namespace: "))
        .unwrap_or_else(|| panic!("no namespace line:\n{stdout}"))
        .trim()
        .to_owned();
    assert!(ns.starts_with("kumo-bench-"), "namespace {ns}");
    assert!(
        stdout.contains(&format!("namespace {ns} deleted")),
        "no deletion reported:\n{stdout}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let req = http::Request::get(format!("/api/v1/namespaces/{ns}"))
            .body(kube::client::Body::empty())
            .unwrap();
        client.send(req).await.unwrap().status()
    });
    assert_eq!(
        status,
        http::StatusCode::NOT_FOUND,
        "namespace {ns} still exists"
    );
}
