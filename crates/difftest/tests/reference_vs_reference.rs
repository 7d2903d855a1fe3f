//! The harness proves itself against the real kube-apiserver: the whole corpus replayed
//! against two reference instances shows no difference, and against a deliberately altered
//! instance shows exactly the alteration.
//!
//! Needs the reference binaries (`scripts/reference build`); starts its own instances with
//! `scripts/reference up --dir <temp>` and stops them with `down`, at most two at a time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use kumo_difftest::{run_corpus, run_scenarios, Difference, Report, Side, DEFAULT_CORPUS};

/// The flags that make the altered instance differ: AlwaysPullImages sets every container's
/// imagePullPolicy to Always, and the not-ready toleration the DefaultTolerationSeconds
/// plugin adds to every pod gets 60 s instead of 300 s.
const ALTERED_FLAGS: &str = "--enable-admission-plugins=NodeRestriction,AlwaysPullImages \
                             --default-not-ready-toleration-seconds=60";

/// The tests run one after the other so that at most two instances run at once.
static SERIAL: Mutex<()> = Mutex::new(());

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// Reference instances; `down` for each on drop, in parallel.
struct References {
    dirs: Vec<PathBuf>,
    _tmp: tempfile::TempDir,
}

impl References {
    /// Starts one instance per entry (in parallel); `Some(flags)` adds kube-apiserver flags
    /// through `KUMO_REFERENCE_APISERVER_EXTRA_FLAGS`.
    fn up(instances: &[Option<&str>]) -> References {
        let root = repo_root();
        for bin in ["kube-apiserver", "etcd"] {
            let path = root.join(".reference/bin").join(bin);
            assert!(
                path.exists(),
                "{} is missing: run `scripts/reference build` first (see docs/REFERENCE.md); \
                 this test needs the reference kube-apiserver and does not skip without it",
                path.display()
            );
        }
        let tmp = tempfile::Builder::new()
            .prefix("kumo-difftest-")
            .tempdir()
            .expect("temp dir");
        let mut refs = References {
            dirs: Vec::new(),
            _tmp: tmp,
        };
        let mut children = Vec::new();
        for (i, extra) in instances.iter().enumerate() {
            let dir = refs._tmp.path().join(format!("ref{i}"));
            let mut cmd = Command::new(root.join("scripts/reference"));
            cmd.args(["up", "--dir"]).arg(&dir);
            cmd.env_remove("KUMO_REFERENCE_APISERVER_EXTRA_FLAGS");
            if let Some(flags) = extra {
                cmd.env("KUMO_REFERENCE_APISERVER_EXTRA_FLAGS", flags);
            }
            let child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run scripts/reference up");
            refs.dirs.push(dir);
            children.push(child);
        }
        let mut failures = Vec::new();
        for (child, dir) in children.into_iter().zip(&refs.dirs) {
            let out = child
                .wait_with_output()
                .expect("wait for scripts/reference up");
            if !out.status.success() {
                failures.push(format!(
                    "scripts/reference up --dir {} failed ({}):\n{}{}",
                    dir.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        refs
    }

    fn kubeconfig(&self, i: usize) -> PathBuf {
        self.dirs[i].join("admin.kubeconfig")
    }
}

impl Drop for References {
    fn drop(&mut self) {
        let root = repo_root();
        let children: Vec<_> = self
            .dirs
            .iter()
            .filter_map(|dir| {
                Command::new(root.join("scripts/reference"))
                    .args(["down", "--dir"])
                    .arg(dir)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .ok()
            })
            .collect();
        for mut c in children {
            let _ = c.wait();
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

async fn sides(refs: &References) -> (Side, Side) {
    let left = Side::from_kubeconfig("reference", &refs.kubeconfig(0))
        .await
        .expect("left side");
    let right = Side::from_kubeconfig("reference-2", &refs.kubeconfig(1))
        .await
        .expect("right side");
    (left, right)
}

fn status(report: &Report, scenario: &str, request: &str) -> (Option<u16>, Option<u16>) {
    let r = report
        .request(scenario, request)
        .unwrap_or_else(|| panic!("no request {scenario} / {request} in the report"));
    (r.left_status, r.right_status)
}

#[test]
fn identical_references_have_no_differences() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let refs = References::up(&[None, None]);
    let started = t0.elapsed();
    let rt = runtime();
    let t1 = Instant::now();
    let report = rt.block_on(async {
        let (left, right) = sides(&refs).await;
        run_corpus(&left, &right, DEFAULT_CORPUS.as_ref(), None)
            .await
            .expect("corpus loads")
    });
    eprintln!(
        "{report}\n(instances up in {started:.1?}, corpus replayed in {:.1?})",
        t1.elapsed()
    );

    assert!(
        report.is_empty(),
        "two identical reference servers differ:\n{report}"
    );
    assert_eq!(report.explained().count(), 0);

    // The corpus really exercised the servers: nearly every request got a 2xx or 4xx answer
    // on both sides (the rest are documented 500s of kube-apiserver).
    let total = report.requests.len();
    let answered = report
        .requests
        .iter()
        .filter(|r| r.both_answered(2) || r.both_answered(4))
        .count();
    assert!(total >= 100, "only {total} requests in the corpus");
    assert!(
        answered * 10 >= total * 9,
        "only {answered} of {total} requests got a 2xx/4xx answer on both sides"
    );

    // Each class of error really happened, on both sides.
    let invalid = report
        .requests
        .iter()
        .filter(|r| r.scenario == "007-validation" && r.left_status == Some(422))
        .filter(|r| r.right_status == Some(422))
        .count();
    assert!(
        invalid >= 8,
        "only {invalid} validation requests got 422 on both sides"
    );
    for (scenario, request, code) in [
        ("007-validation", "invalid name", 422),
        ("007-validation", "pod without containers", 422),
        ("007-validation", "invalid label key", 422),
        ("007-validation", "invalid label value", 422),
        ("008-conflicts", "create again", 409),
        ("008-conflicts", "update with a stale resourceVersion", 409),
        (
            "010-server-side-apply",
            "apply conflicting with another manager",
            409,
        ),
        ("015-http-errors", "unknown resource", 404),
        ("015-http-errors", "PUT on a collection", 405),
        ("015-http-errors", "unsupported Accept on a list", 406),
        ("015-http-errors", "unsupported Content-Type", 415),
        ("011-watch", "watch everything from the revision", 200),
        ("012-table", "pods as Table", 200),
        ("016-dry-run", "get after the dry-run create", 404),
    ] {
        assert_eq!(
            status(&report, scenario, request),
            (Some(code), Some(code)),
            "{scenario} / {request}"
        );
    }
    drop(refs);
    eprintln!("total {:.1?}", t0.elapsed());
}

#[test]
fn altered_reference_differences_are_listed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let refs = References::up(&[None, Some(ALTERED_FLAGS)]);
    let rt = runtime();
    let (report, explained) = rt.block_on(async {
        let (left, right) = sides(&refs).await;
        let report = run_corpus(&left, &right, DEFAULT_CORPUS.as_ref(), None)
            .await
            .expect("corpus loads");
        // The same pod scenario with its differing requests marked as known.
        let mut pods = kumo_difftest::load_corpus(DEFAULT_CORPUS.as_ref())
            .expect("corpus loads")
            .into_iter()
            .find(|s| s.name == "006-pods")
            .expect("006-pods");
        for r in &mut pods.requests {
            r.known_difference = Some("the right side runs AlwaysPullImages".into());
        }
        let explained = run_scenarios(&left, &right, &[pods]).await;
        (report, explained)
    });
    let text = report.to_string();
    eprintln!("{text}");

    assert!(!report.is_empty(), "the altered server shows no difference");
    // Exactly the alteration, nothing else: every difference is one of the two fields.
    let mut pull_policy = 0;
    let mut toleration = 0;
    for r in report.unexplained() {
        for d in &r.differences {
            let Difference::Body(d) = d else {
                panic!(
                    "{} / {}: unexpected difference {d}\n{text}",
                    r.scenario, r.name
                );
            };
            let path = d.path.to_string();
            let values = (d.left.clone(), d.right.clone());
            if r.scenario == "020-pod-subresources" {
                // Pods with init, sidecar and ephemeral containers: every pull policy
                // differs, and the subresource updates, which send the pod back with the
                // left side's defaults, own more fields on the right.
                if path.contains("managedFields") {
                    // Who owns what differs; the values are checked below.
                } else if path.ends_with("imagePullPolicy") {
                    assert_eq!(
                        values,
                        (Some("IfNotPresent".into()), Some("Always".into())),
                        "{path}"
                    );
                } else {
                    assert!(
                        path.ends_with("tolerationSeconds"),
                        "unexpected difference {path}\n{text}"
                    );
                    assert_eq!(values, (Some(300.into()), Some(60.into())), "{path}");
                }
            } else if path.ends_with("spec.containers[0].imagePullPolicy") {
                assert_eq!(
                    values,
                    (Some("IfNotPresent".into()), Some("Always".into())),
                    "{path}"
                );
                pull_policy += 1;
            } else if path.ends_with("spec.tolerations[0].tolerationSeconds") {
                assert_eq!(values, (Some(300.into()), Some(60.into())), "{path}");
                toleration += 1;
            } else {
                panic!(
                    "{} / {}: unexpected difference {path}\n{text}",
                    r.scenario, r.name
                );
            }
        }
    }
    assert!(pull_policy >= 5 && toleration >= 5, "{text}");
    assert_eq!(pull_policy, toleration, "{text}");
    // In readable form, under the request's name.
    assert!(
        text.contains(
            "  006-pods / create  (POST /api/v1/namespaces/{{ns}}/pods)\n    \
             body spec.containers[0].imagePullPolicy: \"IfNotPresent\" vs \"Always\"\n    \
             body spec.tolerations[0].tolerationSeconds: 300 vs 60\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "body items[1].spec.containers[0].imagePullPolicy: \"IfNotPresent\" vs \"Always\""
        ),
        "{text}"
    );
    let with = report
        .requests
        .iter()
        .filter(|r| !r.differences.is_empty())
        .count();
    assert!(
        text.trim_end().ends_with(&format!(
            "{} requests, {with} with differences (0 explained)",
            report.requests.len()
        )),
        "{text}"
    );
    // Requests that return no pod are the same on both sides.
    for (scenario, request) in [
        ("002-configmaps", "get"),
        ("009-patches", "create a deployment"),
        ("006-pods", "create before the service account exists"),
    ] {
        let r = report.request(scenario, request).expect("request");
        assert!(r.differences.is_empty(), "{scenario} / {request}");
    }

    // known_difference turns them into explained differences.
    assert!(explained.is_empty(), "{explained}");
    assert!(explained.explained().count() >= 5, "{explained}");
    assert!(explained
        .to_string()
        .contains("known difference: the right side runs AlwaysPullImages"));
    drop(refs);
    eprintln!("total {:.1?}", t0.elapsed());
}
