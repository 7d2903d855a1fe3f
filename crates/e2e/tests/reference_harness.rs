#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The reference harness end to end (issue 3): `scripts/reference up --with-controllers`
//! gives a working v1.37.2 control plane, and `scripts/conformance` runs the CI subset of the
//! conformance tests (`conformance/ci-reference.txt`) against it, all passing, with a JUnit
//! report naming each test and a `results.txt` line for each.
//!
//! Needs the reference binaries (`scripts/reference build`; scripts/test builds them) and
//! kubectl on PATH: without them it fails, saying what to run. Takes about a minute.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use kumo_e2e::{
    repo_root, require_command, require_reference_binaries, run, ReferenceCluster,
    REFERENCE_BINARIES,
};

#[test]
fn reference_control_plane_and_conformance_runner() {
    if let Err(e) = require_reference_binaries(REFERENCE_BINARIES) {
        panic!("{e:#}");
    }
    if let Err(e) = require_command("kubectl") {
        panic!("{e:#}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let cluster = ReferenceCluster::up(&tmp.path().join("reference"), true)
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!(
        "reference up in {:.1}s: {}",
        t0.elapsed().as_secs_f64(),
        cluster.up_output().lines().next().unwrap_or_default()
    );

    check_control_plane(&cluster);
    let t1 = Instant::now();
    check_conformance_runner(&cluster, &tmp.path().join("conformance"));
    eprintln!(
        "conformance CI subset in {:.1}s",
        t1.elapsed().as_secs_f64()
    );

    cluster.down().unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("whole test in {:.1}s", t0.elapsed().as_secs_f64());
}

/// readyz, api-resources and version, as a person would check them with kubectl.
fn check_control_plane(cluster: &ReferenceCluster) {
    let readyz = cluster
        .kubectl(&["get", "--raw", "/readyz?verbose"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        readyz.trim_end().ends_with("readyz check passed"),
        "/readyz?verbose does not end with `readyz check passed`:\n{readyz}"
    );

    let resources = cluster
        .kubectl(&["api-resources", "-o", "name"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    // `-o name` prints `pods`, `deployments.apps`, `leases.coordination.k8s.io`, ...
    let names: BTreeSet<&str> = resources
        .lines()
        .filter_map(|l| l.split('.').next())
        .filter(|n| !n.is_empty())
        .collect();
    for want in ["pods", "deployments", "leases", "customresourcedefinitions"] {
        assert!(
            names.contains(want),
            "kubectl api-resources does not list {want}:\n{resources}"
        );
    }
    let count = resources.lines().filter(|l| !l.trim().is_empty()).count();
    assert!(
        count >= 60,
        "kubectl api-resources lists only {count} resources (want >= 60):\n{resources}"
    );

    let version = cluster
        .kubectl(&["version", "-o", "json"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let version: serde_json::Value = serde_json::from_str(&version)
        .unwrap_or_else(|e| panic!("kubectl version -o json: {e}:\n{version}"));
    assert_eq!(
        version["serverVersion"]["gitVersion"], "v1.37.2",
        "server version: {version:#}"
    );
}

/// `scripts/conformance --list conformance/ci-reference.txt`: every listed test passes, and
/// the JUnit file and results.txt say so test by test.
fn check_conformance_runner(cluster: &ReferenceCluster, out: &Path) {
    let list = repo_root().join("conformance/ci-reference.txt");
    let names = listed_tests(&list);
    assert!(
        (5..=12).contains(&names.len()),
        "{} lists {} tests; the CI subset is meant to be 5 to 12 fast ones",
        list.display(),
        names.len()
    );

    let result = run(Command::new(repo_root().join("scripts/conformance"))
        .arg("--list")
        .arg(&list)
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .arg("--out")
        .arg(out)
        .args(["--timeout", "3m"]))
    .unwrap();
    let last = result.stdout.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!("{} passed, 0 failed", names.len()),
        "the last line of scripts/conformance is not `{} passed, 0 failed`:\n{result}",
        names.len()
    );
    assert!(result.status.success(), "{result}");

    let junit_path = out.join("junit.xml");
    let junit = std::fs::read_to_string(&junit_path)
        .unwrap_or_else(|e| panic!("{}: {e}\n{result}", junit_path.display()));
    for name in &names {
        let status = junit_status(&junit, name)
            .unwrap_or_else(|| panic!("{} does not name `{name}`", junit_path.display()));
        assert_eq!(status, "passed", "JUnit status of `{name}`");
    }

    let results = std::fs::read_to_string(out.join("results.txt")).unwrap();
    let got: BTreeSet<&str> = results.lines().collect();
    let want: BTreeSet<String> = names.iter().map(|n| format!("passed\t{n}")).collect();
    let want: BTreeSet<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(
        got, want,
        "results.txt is not one `passed` line per listed test"
    );
    assert_eq!(
        results.lines().count(),
        names.len(),
        "results.txt:\n{results}"
    );
}

/// The test names in a list file: one a line; blank lines and `#` comments skipped.
fn listed_tests(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// The `status` attribute of the JUnit `<testcase>` for the test named `name`. Ginkgo names
/// it `[It] <full name>`, followed by ` [<labels>]` when the test has labels.
fn junit_status<'a>(junit: &'a str, name: &str) -> Option<&'a str> {
    let needle = format!("<testcase name=\"[It] {}", xml_escape(name));
    junit.match_indices(&needle).find_map(|(at, _)| {
        let rest = &junit[at + needle.len()..];
        // After the name: the end of the attribute, or one ` [labels]` group and its end.
        let tail = &rest[..rest.find('"')?];
        let labels_only = tail.starts_with(" [") && tail.ends_with(']') && !tail[2..].contains('[');
        if !(tail.is_empty() || labels_only) {
            return None; // a longer name that starts with this one
        }
        let tag = &rest[..rest.find('>')?];
        let status = &tag[tag.find("status=\"")? + "status=\"".len()..];
        Some(&status[..status.find('"')?])
    })
}

/// Escapes text as Go's encoding/xml does in attribute values (Ginkgo's JUnit reporter).
fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            '\t' => out.push_str("&#x9;"),
            '\n' => out.push_str("&#xA;"),
            '\r' => out.push_str("&#xD;"),
            c => out.push(c),
        }
    }
    out
}
