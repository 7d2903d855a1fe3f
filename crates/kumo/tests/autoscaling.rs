//! Resource metrics and the HorizontalPodAutoscaler as a user meets them, on `kumo up -d`
//! with the real kubectl: the metrics-server add-on's APIService becomes Available,
//! `kubectl top` answers, and the HPA walkthrough (php-apache from
//! `registry.k8s.io/hpa-example`, `kubectl autoscale --cpu-percent=50`, a busybox loop of
//! wget as the load) scales up with upstream's event, then back down once the load stops.
//! The usage is the simulated runtime's model (each request costs php-apache 100 ms of
//! CPU), read through the whole real path: kubelet `/metrics/resource` → metrics-server →
//! aggregator → HPA controller → scale subresource.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

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

struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = kumo(&["down"], &self.0);
    }
}

fn k(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", user_kubeconfig(dir))
        .output()
        .unwrap();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let (ok, out, err) = k(dir, args);
    assert!(ok, "kubectl {args:?}: {err}");
    out
}

fn eventually<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs} s: {what}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

const PHP_APACHE: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: php-apache}
spec:
  selector: {matchLabels: {run: php-apache}}
  template:
    metadata: {labels: {run: php-apache}}
    spec:
      containers:
      - name: php-apache
        image: registry.k8s.io/hpa-example
        ports: [{containerPort: 80}]
        resources:
          limits: {cpu: 500m}
          requests: {cpu: 200m}
---
apiVersion: v1
kind: Service
metadata: {name: php-apache, labels: {run: php-apache}}
spec:
  ports: [{port: 80}]
  selector: {run: php-apache}
"#;

#[test]
fn top_and_the_hpa_walkthrough() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kumo");
    let out = kumo(&["up", "-d", "--port", "0", "--no-cloud"], &dir);
    let _down = Down(dir.clone());
    assert!(out.status.success(), "{}", text(&out.stderr));

    // The add-on's APIService is served once its pod is Ready.
    eventually(90, "v1beta1.metrics.k8s.io Available", || {
        let (_, o, _) = k(
            &dir,
            &[
                "get",
                "apiservice",
                "v1beta1.metrics.k8s.io",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
            ],
        );
        (o == "True").then_some(())
    });
    // kubectl top: the node, and the add-ons' pods, once two scrapes are in.
    let nodes = eventually(90, "kubectl top nodes", || {
        let (ok, o, _) = k(&dir, &["top", "nodes"]);
        (ok && o.lines().count() > 1).then_some(o)
    });
    let header: Vec<&str> = nodes.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)"]
    );
    let row: Vec<&str> = nodes.lines().nth(1).unwrap().split_whitespace().collect();
    assert!(row[1].ends_with('m') && row[3].ends_with("Mi"), "{nodes}");
    let pods = eventually(60, "kubectl top pods -n kube-system", || {
        let (ok, o, _) = k(&dir, &["top", "pods", "-n", "kube-system"]);
        (ok && o.contains("coredns-")).then_some(o)
    });
    assert!(pods.starts_with("NAME"), "{pods}");

    // The walkthrough.
    let manifest = dir.with_file_name("php-apache.yaml");
    std::fs::write(&manifest, PHP_APACHE).unwrap();
    ok(&dir, &["apply", "-f", manifest.to_str().unwrap()]);
    let o = ok(
        &dir,
        &[
            "autoscale",
            "deployment",
            "php-apache",
            "--cpu-percent=50",
            "--min=1",
            "--max=5",
        ],
    );
    assert_eq!(
        o,
        "horizontalpodautoscaler.autoscaling/php-apache autoscaled\n"
    );
    // Idle, it says so: metrics found, no reason to scale.
    eventually(90, "the HPA sees the idle target", || {
        let (_, o, _) = k(&dir, &["get", "hpa", "php-apache"]);
        o.lines()
            .nth(1)
            .filter(|l| l.contains("cpu: ") && l.contains("%/50%") && !l.contains("<unknown>"))
            .map(str::to_owned)
    });
    ok(
        &dir,
        &[
            "run",
            "load-generator",
            "--image=busybox:1.28",
            "--restart=Never",
            "--",
            "/bin/sh",
            "-c",
            "while sleep 0.01; do wget -q -O- http://php-apache; done",
        ],
    );
    let up = eventually(180, "SuccessfulRescale up", || {
        let (_, o, _) = k(
            &dir,
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=php-apache,reason=SuccessfulRescale",
                "-o",
                "jsonpath={.items[*].message}",
            ],
        );
        o.contains("above target").then_some(o)
    });
    assert!(
        up.contains("reason: cpu resource utilization (percentage of request) above target"),
        "{up}"
    );
    assert!(up.starts_with("New size: "), "{up}");
    let replicas: i32 = ok(
        &dir,
        &[
            "get",
            "deployment",
            "php-apache",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
    )
    .parse()
    .unwrap();
    assert!((2..=5).contains(&replicas), "{replicas}");
    let conditions = ok(
        &dir,
        &[
            "get",
            "hpa.v2.autoscaling",
            "php-apache",
            "-o",
            "jsonpath={range .status.conditions[*]}{.type}={.status}/{.reason};{end}",
        ],
    );
    assert!(
        conditions.contains("ScalingActive=True/ValidMetricFound"),
        "{conditions}"
    );

    // Without load it comes back down (no stabilization window, to keep the test short).
    ok(
        &dir,
        &[
            "patch",
            "hpa",
            "php-apache",
            "--type=merge",
            "-p",
            r#"{"spec":{"behavior":{"scaleDown":{"stabilizationWindowSeconds":0}}}}"#,
        ],
    );
    ok(&dir, &["delete", "pod", "load-generator", "--wait=false"]);
    eventually(180, "scaled back to 1", || {
        let (_, o, _) = k(
            &dir,
            &[
                "get",
                "deployment",
                "php-apache",
                "-o",
                "jsonpath={.spec.replicas}",
            ],
        );
        (o == "1").then_some(())
    });
    let (_, down, _) = k(
        &dir,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=php-apache,reason=SuccessfulRescale",
            "-o",
            "jsonpath={.items[*].message}",
        ],
    );
    assert!(
        down.contains("New size: 1; reason: All metrics below target"),
        "{down}"
    );
}
