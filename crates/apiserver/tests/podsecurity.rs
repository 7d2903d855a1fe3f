//! The PodSecurity admission plugin driven by the real kubectl: namespace labels pick the
//! level, enforce refuses pods with upstream's message, warn (and workload controllers)
//! only warn, label changes warn about existing pods and bad label values are refused. The
//! expected texts are the reference kube-apiserver v1.37.2's answers to the same commands.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

mod common;
use common::*;

const RESTRICTED_NGINX: &str = "violates PodSecurity \"restricted:latest\": \
allowPrivilegeEscalation != false (container \"p\" must set securityContext.allowPrivilegeEscalation=false), \
unrestricted capabilities (container \"p\" must set securityContext.capabilities.drop=[\"ALL\"]), \
runAsNonRoot != true (pod or container \"p\" must set securityContext.runAsNonRoot=true), \
seccompProfile (pod or container \"p\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")";

const COMPLIANT_POD: &str = "apiVersion: v1
kind: Pod
metadata: {name: good}
spec:
  securityContext:
    runAsNonRoot: true
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: c
    image: nginx
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}
";

/// A namespace with its default service account (no controller makes it here), labeled.
async fn namespace(kc: &Path, ns: &str, labels: &[&str]) {
    let out = k(kc, &["create", "namespace", ns]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(kc, &["-n", ns, "create", "serviceaccount", "default"]).await;
    assert!(out.ok, "{}", out.stderr);
    if !labels.is_empty() {
        let mut args = vec!["label", "namespace", ns];
        args.extend_from_slice(labels);
        let out = k(kc, &args).await;
        assert!(out.ok, "{}", out.stderr);
        assert_eq!(out.stderr, "");
    }
}

/// The `Warning: ` lines kubectl printed.
fn warnings(out: &Out) -> Vec<String> {
    out.stderr
        .lines()
        .filter_map(|l| l.strip_prefix("Warning: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restricted_namespace_refuses_plain_pod_and_accepts_compliant_one() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    namespace(&kc, "r", &["pod-security.kubernetes.io/enforce=restricted"]).await;

    let out = k(&kc, &["-n", "r", "run", "p", "--image=nginx"]).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        format!("Error from server (Forbidden): pods \"p\" is forbidden: {RESTRICTED_NGINX}")
    );
    // The Status is upstream's: 403 Forbidden naming the pod.
    let out = k(
        &kc,
        &[
            "-n",
            "r",
            "run",
            "p",
            "--image=nginx",
            "--dry-run=server",
            "-v=8",
        ],
    )
    .await;
    assert!(!out.ok);
    let body = out
        .stderr
        .lines()
        .skip_while(|l| !l.contains("\"Response Body\""))
        .nth(1)
        .expect("kubectl -v=8 logs the response body");
    let status: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(status["code"], 403);
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(
        status["details"],
        serde_json::json!({"name": "p", "kind": "pods"})
    );
    assert_eq!(
        status["message"],
        format!("pods \"p\" is forbidden: {RESTRICTED_NGINX}")
    );
    assert!(k(&kc, &["-n", "r", "get", "pod", "p"])
        .await
        .stderr
        .contains("NotFound"));

    let out = k_in(
        None,
        &kc,
        &["-n", "r", "apply", "-f", "-"],
        Some(COMPLIANT_POD),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(warnings(&out), Vec::<String>::new());
    assert_eq!(out.stdout.trim(), "pod/good created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warn_level_warns_and_creates() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    namespace(&kc, "w", &["pod-security.kubernetes.io/warn=baseline"]).await;

    let out = k(
        &kc,
        &["-n", "w", "run", "p", "--image=nginx", "--privileged"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        warnings(&out),
        vec!["would violate PodSecurity \"baseline:latest\": privileged (container \"p\" must not set securityContext.privileged=true)"]
    );
    assert!(k(&kc, &["-n", "w", "get", "pod", "p"]).await.ok);
    // A pod that meets the warn level gets no warning.
    let out = k(&kc, &["-n", "w", "run", "q", "--image=nginx"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(warnings(&out), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_only_warn_under_enforce() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    namespace(&kc, "r", &["pod-security.kubernetes.io/enforce=restricted"]).await;

    let out = k(
        &kc,
        &["-n", "r", "create", "deployment", "d", "--image=nginx"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "deployment.apps/d created");
    assert_eq!(
        warnings(&out),
        vec!["would violate PodSecurity \"restricted:latest\": \
allowPrivilegeEscalation != false (container \"nginx\" must set securityContext.allowPrivilegeEscalation=false), \
unrestricted capabilities (container \"nginx\" must set securityContext.capabilities.drop=[\"ALL\"]), \
runAsNonRoot != true (pod or container \"nginx\" must set securityContext.runAsNonRoot=true), \
seccompProfile (pod or container \"nginx\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"]
    );
    let out = k(
        &kc,
        &[
            "-n",
            "r",
            "create",
            "cronjob",
            "cj",
            "--image=busybox",
            "--schedule=* * * * *",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(warnings(&out).len(), 1, "{}", out.stderr);
    assert!(warnings(&out)[0].contains("(container \"cj\" must set"));
    // Scaling touches a subresource: nothing to check.
    let out = k(
        &kc,
        &["-n", "r", "scale", "deployment", "d", "--replicas=2"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(warnings(&out), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baseline_refuses_privileged_and_host_network() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    namespace(&kc, "b", &["pod-security.kubernetes.io/enforce=baseline"]).await;

    let out = k(
        &kc,
        &["-n", "b", "run", "p", "--image=nginx", "--privileged"],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        "Error from server (Forbidden): pods \"p\" is forbidden: violates PodSecurity \"baseline:latest\": \
privileged (container \"p\" must not set securityContext.privileged=true)"
    );
    let out = k(
        &kc,
        &[
            "-n",
            "b",
            "run",
            "q",
            "--image=nginx",
            "--overrides={\"spec\":{\"hostNetwork\":true}}",
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        "Error from server (Forbidden): pods \"q\" is forbidden: violates PodSecurity \"baseline:latest\": \
host namespaces (hostNetwork=true)"
    );
    // Plain nginx meets baseline; warn follows the enforce level, so no warning either.
    let out = k(&kc, &["-n", "b", "run", "ok", "--image=nginx"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(warnings(&out), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labeling_a_namespace_warns_about_existing_pods() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    namespace(&kc, "w2", &[]).await;
    for (name, extra) in [
        ("p", "--privileged"),
        ("q", "--overrides={\"spec\":{\"hostNetwork\":true}}"),
        ("q2", "--overrides={\"spec\":{\"hostNetwork\":true}}"),
        ("q3", "--overrides={\"spec\":{\"hostNetwork\":true}}"),
        ("ok", "--labels=a=b"),
    ] {
        let out = k(&kc, &["-n", "w2", "run", name, "--image=nginx", extra]).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let out = k(
        &kc,
        &[
            "label",
            "ns",
            "w2",
            "pod-security.kubernetes.io/enforce=baseline",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "namespace/w2 labeled");
    assert_eq!(
        warnings(&out),
        vec![
            "existing pods in namespace \"w2\" violate the new PodSecurity enforce level \"baseline:latest\"",
            "p: privileged",
            "q (and 2 other pods): host namespaces",
        ]
    );
    let out = k(
        &kc,
        &[
            "label",
            "ns",
            "w2",
            "pod-security.kubernetes.io/enforce=restricted",
            "--overwrite",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let restricted = "allowPrivilegeEscalation != false, unrestricted capabilities, runAsNonRoot != true, seccompProfile";
    assert_eq!(
        warnings(&out),
        vec![
            "existing pods in namespace \"w2\" violate the new PodSecurity enforce level \"restricted:latest\"".to_owned(),
            format!("ok: {restricted}"),
            format!("p: privileged, {restricted}"),
            format!("q (and 2 other pods): host namespaces, {restricted}"),
        ]
    );
    // Relaxing the level checks nothing.
    let out = k(
        &kc,
        &[
            "label",
            "ns",
            "w2",
            "pod-security.kubernetes.io/enforce=baseline",
            "--overwrite",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(warnings(&out), Vec::<String>::new());
    // A version change at the same level checks again.
    let out = k(
        &kc,
        &[
            "label",
            "ns",
            "w2",
            "pod-security.kubernetes.io/enforce-version=v1.20",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        warnings(&out)[0],
        "existing pods in namespace \"w2\" violate the new PodSecurity enforce level \"baseline:v1.20\""
    );

    // Existing violating pods stay; updates that leave images alone are not checked, an
    // image change is.
    let out = k(&kc, &["-n", "w2", "label", "pod", "p", "x=y"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["-n", "w2", "set", "image", "pod/p", "p=nginx:1.27"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            "pods \"p\" is forbidden: violates PodSecurity \"baseline:v1.20\": privileged (container \"p\" must not set securityContext.privileged=true)"
        ),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_label_values_are_refused() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    namespace(&kc, "x", &[]).await;

    let out = k(
        &kc,
        &[
            "label",
            "ns",
            "x",
            "pod-security.kubernetes.io/enforce=bogus",
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        "The Namespace \"x\" is invalid: metadata.labels[pod-security.kubernetes.io/enforce]: \
Invalid value: \"bogus\": must be one of privileged, baseline, restricted"
    );
    let ns = "apiVersion: v1
kind: Namespace
metadata:
  name: bad
  labels:
    pod-security.kubernetes.io/enforce-version: v2.0
    pod-security.kubernetes.io/warn: x
";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(ns)).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        "The Namespace \"bad\" is invalid: \n\
* metadata.labels[pod-security.kubernetes.io/enforce-version]: Invalid value: \"v2.0\": must be \"latest\" or \"v1.x\"\n\
* metadata.labels[pod-security.kubernetes.io/warn]: Invalid value: \"x\": must be one of privileged, baseline, restricted"
    );
    assert!(k(&kc, &["get", "ns", "bad"])
        .await
        .stderr
        .contains("NotFound"));
}

/// The audit mode: what fails the audit level, and the level enforced, are recorded as
/// upstream's annotations on the request's audit events; an exempt user is recorded too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_mode_annotates_the_audit_events() {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  resources: [{group: \"\", resources: [pods]}]\n- level: None\n",
    )
    .unwrap();
    let log = dir.path().join("audit.log");
    let mut cfg = kumo_apiserver::ApiServerConfig::new(dir.path().join("data"));
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    cfg.audit_policy_file = Some(policy);
    cfg.audit_log_path = Some(log.clone());
    let server = kumo_apiserver::ApiServer::start(cfg).await.unwrap();
    let kc = server.admin_kubeconfig.clone();
    for args in [
        vec!["create", "namespace", "audited"],
        vec![
            "label",
            "namespace",
            "audited",
            "pod-security.kubernetes.io/audit=restricted",
            "pod-security.kubernetes.io/enforce=baseline",
        ],
        vec!["-n", "audited", "create", "serviceaccount", "default"],
    ] {
        let out = k(&kc, &args).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let out = k_in(
        None,
        &kc,
        &["create", "-n", "audited", "-f", "-"],
        Some("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: p, image: nginx}]\n"),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    // Audit alone never refuses nor warns.
    assert!(!out.stderr.contains("PodSecurity"), "{}", out.stderr);
    let event = loop {
        let found = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|e| {
                e["verb"] == "create"
                    && e["objectRef"]["resource"] == "pods"
                    && e["stage"] == "ResponseComplete"
            });
        if let Some(e) = found {
            break e;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let ann = &event["annotations"];
    assert_eq!(
        ann["pod-security.kubernetes.io/enforce-policy"],
        "baseline:latest"
    );
    assert_eq!(
        ann["pod-security.kubernetes.io/audit-violations"],
        format!(
            "would violate{}",
            RESTRICTED_NGINX.strip_prefix("violates").unwrap()
        )
    );
}
