//! `/metrics`: kube-apiserver's request metrics, read with `kubectl get --raw /metrics`
//! after real kubectl requests. Label values are what kube-apiserver v1.37.2 reports for
//! the same requests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

mod common;
use common::*;

async fn scrape(kc: &Path) -> String {
    let out = k(kc, &["get", "--raw", "/metrics"]).await;
    assert!(out.ok, "{}", out.stderr);
    out.stdout
}

/// The value of the sample `name{labels}` (labels as printed), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

fn labels(verb: &str, resource: &str, scope: &str, extra: &str) -> String {
    format!(
        "component=\"apiserver\",dry_run=\"{extra}\",group=\"\",resource=\"{resource}\",scope=\"{scope}\",subresource=\"\",verb=\"{verb}\",version=\"v1\""
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_and_timed() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let before = scrape(&kc).await;
    for t in [
        "apiserver_request_total",
        "apiserver_request_duration_seconds",
    ] {
        assert!(before.contains(&format!("# HELP {t} [STABLE] ")), "{t}");
    }
    assert!(before.contains("# TYPE apiserver_request_total counter"));
    assert!(before.contains("# TYPE apiserver_request_duration_seconds histogram"));
    assert!(before.contains("# TYPE apiserver_longrunning_requests gauge"));
    assert!(before.contains("# TYPE process_start_time_seconds gauge"));
    let rss = sample(&before, "process_resident_memory_bytes").unwrap();
    assert!(rss > 1e6, "{rss}");
    let start = sample(&before, "process_start_time_seconds").unwrap();
    assert!(start > 1.7e9, "{start}");

    assert!(
        k(&kc, &["create", "configmap", "a", "--from-literal=k=v"])
            .await
            .ok
    );
    assert!(k(&kc, &["create", "configmap", "b"]).await.ok);
    assert!(!k(&kc, &["create", "configmap", "b"]).await.ok);
    assert!(
        k(&kc, &["create", "configmap", "c", "--dry-run=server"])
            .await
            .ok
    );
    assert!(k(&kc, &["get", "configmap", "a"]).await.ok);
    assert!(k(&kc, &["get", "configmaps"]).await.ok);
    assert!(k(&kc, &["get", "configmaps", "-A"]).await.ok);
    assert!(k(&kc, &["label", "configmap", "a", "x=y"]).await.ok);
    let apply = k_in(
        None,
        &kc,
        &["apply", "--server-side", "-f", "-"],
        Some("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: d}\ndata: {k: w}\n"),
    )
    .await;
    assert!(apply.ok, "{}", apply.stderr);
    assert!(k(&kc, &["delete", "configmap", "b"]).await.ok);

    let text = scrape(&kc).await;
    let total = |code: u16, l: &str| {
        sample(
            &text,
            &format!("apiserver_request_total{{code=\"{code}\",{l}}}"),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(
        total(201, &labels("POST", "configmaps", "resource", "")),
        2.0
    );
    assert_eq!(
        total(409, &labels("POST", "configmaps", "resource", "")),
        1.0
    );
    assert_eq!(
        total(201, &labels("POST", "configmaps", "resource", "All")),
        1.0
    );
    assert!(total(200, &labels("GET", "configmaps", "resource", "")) >= 1.0);
    assert_eq!(
        total(200, &labels("LIST", "configmaps", "namespace", "")),
        1.0
    );
    assert_eq!(
        total(200, &labels("LIST", "configmaps", "cluster", "")),
        1.0
    );
    assert_eq!(
        total(200, &labels("PATCH", "configmaps", "resource", "")),
        1.0
    );
    assert_eq!(
        total(201, &labels("APPLY", "configmaps", "resource", "")),
        1.0
    );
    assert_eq!(
        total(200, &labels("DELETE", "configmaps", "resource", "")),
        1.0
    );

    // The histogram of the creates: cumulative buckets ending in _count.
    let l = labels("POST", "configmaps", "resource", "");
    let mut last = 0.0;
    let mut buckets = 0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&format!(
            "apiserver_request_duration_seconds_bucket{{{l},le=\""
        )) else {
            continue;
        };
        let v: f64 = rest.rsplit_once(' ').unwrap().1.parse().unwrap();
        assert!(v >= last, "{line}");
        last = v;
        buckets += 1;
    }
    assert_eq!(buckets, 24, "23 bounds and +Inf");
    let count = sample(
        &text,
        &format!("apiserver_request_duration_seconds_count{{{l}}}"),
    )
    .unwrap();
    assert_eq!(count, 3.0, "2 created, 1 conflict");
    assert_eq!(last, count);
    assert!(text.contains(&format!(
        "apiserver_request_duration_seconds_bucket{{{l},le=\"0.005\"}}"
    )));
    assert!(
        sample(
            &text,
            &format!("apiserver_request_duration_seconds_sum{{{l}}}")
        )
        .unwrap()
            > 0.0
    );

    // Stored objects, per resource.
    let cms = sample(
        &text,
        "apiserver_resource_objects{group=\"\",resource=\"configmaps\"}",
    )
    .unwrap();
    assert!(cms >= 1.0, "{cms}");
    let ns = sample(
        &text,
        "apiserver_resource_objects{group=\"\",resource=\"namespaces\"}",
    )
    .unwrap();
    assert!(ns >= 4.0, "{ns}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_are_long_running() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let gauge = "apiserver_longrunning_requests{component=\"apiserver\",group=\"\",resource=\"configmaps\",scope=\"namespace\",subresource=\"\",verb=\"WATCH\",version=\"v1\"}";
    let mut child = std::process::Command::new(kubectl_bin(None))
        .args([
            "--kubeconfig",
            kc.to_str().unwrap(),
            "get",
            "configmaps",
            "-w",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut open = None;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        open = sample(&scrape(&kc).await, gauge);
        if open == Some(1.0) {
            break;
        }
    }
    assert_eq!(open, Some(1.0));
    child.kill().unwrap();
    child.wait().unwrap();
    let mut text = String::new();
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        text = scrape(&kc).await;
        if sample(&text, gauge) == Some(0.0) {
            break;
        }
    }
    assert_eq!(sample(&text, gauge), Some(0.0));
    // Counted once it ended, as upstream does when the handler returns.
    let total = format!(
        "apiserver_request_total{{code=\"200\",{}}}",
        labels("WATCH", "configmaps", "namespace", "")
    );
    assert_eq!(sample(&text, &total), Some(1.0));
}
