//! Authorization through the real kubectl: `kubectl auth can-i` (SelfSubjectAccessReview,
//! SelfSubjectRulesReview, impersonation), SubjectAccessReview and
//! LocalSubjectAccessReview with their validation, and the Node authorizer seen by a
//! kubelet's client certificate (`system:node:n1` in `system:nodes`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{k, k_in, out_json, start, Out};
use kumo_apiserver::pki;

fn server_url(admin: &Path) -> String {
    let text = std::fs::read_to_string(admin).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_owned()
}

/// A kubeconfig with a client certificate the cluster CA issued for `user` in `groups`.
fn cert_kubeconfig(data_dir: &Path, admin: &Path, user: &str, groups: &[&str]) -> PathBuf {
    let ca = pki::Ca::load_or_create(&data_dir.join("pki")).unwrap();
    let cert = ca.issue_client(user, groups).unwrap();
    let path = data_dir.join(format!("{}.conf", user.replace(':', "-")));
    let text = pki::kubeconfig("kumo", &server_url(admin), &ca.cert_pem, user, &cert);
    std::fs::write(&path, text).unwrap();
    path
}

async fn create_json(kc: &Path, doc: &str) -> Out {
    k_in(None, kc, &["create", "-f", "-", "-o", "json"], Some(doc)).await
}

/// Runs kubectl until `check` accepts its output (the authorizer's graph follows the store
/// by a watch, so a write is seen a moment later), failing after 10 s.
async fn eventually(kc: &Path, args: &[&str], check: impl Fn(&Out) -> bool) -> Out {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = k(kc, args).await;
        if check(&out) || std::time::Instant::now() > deadline {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn can_i_and_access_reviews() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    // Discovery lists the four reviews, create-only.
    let out = k(
        &kc,
        &[
            "api-resources",
            "--api-group=authorization.k8s.io",
            "-o",
            "wide",
        ],
    )
    .await;
    assert_eq!(
        out.stdout,
        "\
NAME                        SHORTNAMES   APIVERSION                NAMESPACED   KIND                       VERBS    CATEGORIES
localsubjectaccessreviews                authorization.k8s.io/v1   true         LocalSubjectAccessReview   create   
selfsubjectaccessreviews                 authorization.k8s.io/v1   false        SelfSubjectAccessReview    create   
selfsubjectrulesreviews                  authorization.k8s.io/v1   false        SelfSubjectRulesReview     create   
subjectaccessreviews                     authorization.k8s.io/v1   false        SubjectAccessReview        create   
",
        "{}",
        out.stderr
    );

    // SelfSubjectAccessReview.
    let out = k(&kc, &["auth", "can-i", "create", "pods"]).await;
    assert_eq!((out.ok, out.stdout.trim()), (true, "yes"), "{}", out.stderr);
    // As a service account that nothing is bound to (impersonated).
    let out = k(
        &kc,
        &[
            "auth",
            "can-i",
            "get",
            "secrets",
            "--as=system:serviceaccount:default:x",
        ],
    )
    .await;
    assert_eq!((out.ok, out.stdout.trim()), (false, "no"), "{}", out.stderr);
    let out = k(&kc, &["auth", "can-i", "get", "/healthz", "--as=alice"]).await;
    assert_eq!(out.stdout.trim(), "yes", "{}", out.stderr);

    // SelfSubjectRulesReview: the cluster admin's wildcard rules, and what every
    // authenticated user gets, in upstream's table.
    let out = k(&kc, &["auth", "can-i", "--list"]).await;
    assert!(out.ok, "{}", out.stderr);
    let lines: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "Resources",
            "Non-Resource",
            "URLs",
            "Resource",
            "Names",
            "Verbs"
        ]
    );
    assert!(
        lines.contains(&vec!["*.*", "[]", "[]", "[*]"]),
        "{}",
        out.stdout
    );
    assert!(lines.contains(&vec!["[*]", "[]", "[*]"]), "{}", out.stdout);
    let out = k(&kc, &["auth", "can-i", "--list", "--as=alice"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "\
Resources                                       Non-Resource URLs   Resource Names   Verbs
selfsubjectreviews.authentication.k8s.io        []                  []               [create]
selfsubjectaccessreviews.authorization.k8s.io   []                  []               [create]
selfsubjectrulesreviews.authorization.k8s.io    []                  []               [create]
                                                [/api/*]            []               [get]
                                                [/api]              []               [get]
                                                [/apis/*]           []               [get]
                                                [/apis]             []               [get]
                                                [/healthz]          []               [get]
                                                [/healthz]          []               [get]
                                                [/livez]            []               [get]
                                                [/livez]            []               [get]
                                                [/openapi/*]        []               [get]
                                                [/openapi]          []               [get]
                                                [/readyz]           []               [get]
                                                [/readyz]           []               [get]
                                                [/version/]         []               [get]
                                                [/version/]         []               [get]
                                                [/version]          []               [get]
                                                [/version]          []               [get]
"
    );
    // A node's rules cannot be listed: the list is marked incomplete.
    let out = k(
        &kc,
        &[
            "auth",
            "can-i",
            "--list",
            "--as=system:node:n1",
            "--as-group=system:nodes",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "the list may be incomplete: node authorizer does not support user rule resolution"
        ),
        "{}",
        out.stderr
    );

    // SubjectAccessReview through `kubectl create -f`.
    let sar = |user: &str, groups: &str, attrs: &str| {
        format!(
            "apiVersion: authorization.k8s.io/v1\nkind: SubjectAccessReview\nspec:\n  user: {user}\n  groups: {groups}\n  {attrs}\n"
        )
    };
    let out = create_json(
        &kc,
        &sar(
            "alice",
            "[dev]",
            "resourceAttributes: {namespace: default, verb: get, resource: pods}",
        ),
    )
    .await;
    let v = out_json(&out);
    assert_eq!(v["kind"], "SubjectAccessReview");
    assert_eq!(v["status"], serde_json::json!({"allowed": false}));
    assert_eq!(v["spec"]["resourceAttributes"]["resource"], "pods");
    let out = create_json(
        &kc,
        &sar(
            "bob",
            "[system:masters]",
            "resourceAttributes: {verb: delete, resource: nodes}",
        ),
    )
    .await;
    assert_eq!(
        out_json(&out)["status"],
        serde_json::json!({"allowed": true})
    );
    let out = create_json(
        &kc,
        &sar(
            "alice",
            "[system:authenticated]",
            "nonResourceAttributes: {path: /version, verb: get}",
        ),
    )
    .await;
    // Which of the bindings that allow it is named depends on upstream's (map) order.
    let status = out_json(&out)["status"].clone();
    assert_eq!(status["allowed"], true, "{status}");
    let reason = status["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("RBAC: allowed by ClusterRoleBinding ")
            && reason.ends_with(" to Group \"system:authenticated\""),
        "{reason}"
    );
    // A review's user is only in the groups it names.
    let out = create_json(
        &kc,
        &sar(
            "alice",
            "[]",
            "nonResourceAttributes: {path: /version, verb: get}",
        ),
    )
    .await;
    assert_eq!(
        out_json(&out)["status"],
        serde_json::json!({"allowed": false})
    );
    // Plain `kubectl create` names nothing: the review has no name.
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-"],
        Some(&sar(
            "alice",
            "[]",
            "resourceAttributes: {verb: get, resource: pods}",
        )),
    )
    .await;
    assert_eq!(
        out.stdout.trim(),
        "subjectaccessreview.authorization.k8s.io/<unknown> created",
        "{}",
        out.stderr
    );

    // Validation, with upstream's messages.
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-"],
        Some("apiVersion: authorization.k8s.io/v1\nkind: SubjectAccessReview\nspec:\n  resourceAttributes: {verb: get, resource: pods}\n"),
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "The request is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified"
    );
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-"],
        Some("apiVersion: authorization.k8s.io/v1\nkind: SubjectAccessReview\nspec:\n  user: a\n"),
    )
    .await;
    assert_eq!(
        out.stderr.trim(),
        "The request is invalid: spec: Invalid value: null: exactly one of nonResourceAttributes or resourceAttributes must be specified"
    );
    // LocalSubjectAccessReview: the attributes' namespace must be the review's.
    let lsar = "apiVersion: authorization.k8s.io/v1\nkind: LocalSubjectAccessReview\nmetadata: {namespace: default}\nspec:\n  user: a\n  resourceAttributes: {namespace: other, verb: get, resource: pods}\n";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(lsar)).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "The request is invalid: spec.resourceAttributes.namespace: Invalid value: \"other\": must match metadata.namespace"
    );
    let ok = lsar.replace("namespace: other", "namespace: default");
    let out = create_json(&kc, &ok).await;
    let v = out_json(&out);
    assert_eq!(v["metadata"]["namespace"], "default");
    assert_eq!(v["status"]["allowed"], false);
    // Reviews are create-only.
    let out = k(
        &kc,
        &[
            "get",
            "--raw",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(out.stderr.contains("MethodNotAllowed"), "{}", out.stderr);
}

const NODE_OBJECTS: &str = "\
apiVersion: v1
kind: ServiceAccount
metadata: {name: default}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
---
apiVersion: v1
kind: Secret
metadata: {name: s1}
stringData: {k: v}
---
apiVersion: v1
kind: Secret
metadata: {name: s2}
stringData: {k: v}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm1}
data: {k: v}
---
apiVersion: v1
kind: Pod
metadata: {name: p1}
spec:
  nodeName: n1
  containers:
  - name: c
    image: nginx
    envFrom: [{configMapRef: {name: cm1}}]
  volumes:
  - name: s
    secret: {secretName: s1}
---
apiVersion: v1
kind: Pod
metadata: {name: p2}
spec:
  nodeName: n2
  containers:
  - name: c
    image: nginx
    env: [{name: X, valueFrom: {secretKeyRef: {name: s2, key: k}}}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_authorizer() {
    let (server, dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(NODE_OBJECTS)).await;
    assert!(out.ok, "{}", out.stderr);
    let n1 = cert_kubeconfig(dir.path(), &kc, "system:node:n1", &["system:nodes"]);

    // What its pods reference.
    let out = eventually(&n1, &["get", "secret", "s1", "-o", "name"], |o| o.ok).await;
    assert_eq!(out.stdout.trim(), "secret/s1", "{}", out.stderr);
    let out = k(&n1, &["get", "configmap", "cm1", "-o", "name"]).await;
    assert_eq!(out.stdout.trim(), "configmap/cm1", "{}", out.stderr);
    let out = k(&n1, &["get", "serviceaccount", "default", "-o", "name"]).await;
    assert_eq!(
        out.stdout.trim(),
        "serviceaccount/default",
        "{}",
        out.stderr
    );
    // ... and nothing else.
    let out = k(&n1, &["get", "secret", "s2"]).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "Error from server (Forbidden): secrets \"s2\" is forbidden: User \"system:node:n1\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": node: no relationship found between node 'n1' and this object"
    );
    let out = k(&n1, &["get", "secrets"]).await;
    assert!(
        out.stderr.contains("cannot list resource \"secrets\" in API group \"\" in the namespace \"default\": node: No Object name found"),
        "{}",
        out.stderr
    );

    // Its own Node, not the others.
    let out = k(&n1, &["get", "node", "n1", "-o", "name"]).await;
    assert_eq!(out.stdout.trim(), "node/n1", "{}", out.stderr);
    let out = k(&n1, &["get", "node", "n2"]).await;
    assert_eq!(
        out.stderr.trim(),
        "Error from server (Forbidden): nodes \"n2\" is forbidden: User \"system:node:n1\" cannot get resource \"nodes\" in API group \"\" at the cluster scope: node: node 'n1' cannot read 'n2', only its own Node object"
    );
    let out = k(&n1, &["get", "nodes"]).await;
    assert!(
        out.stderr
            .contains("node: node 'n1' cannot read all nodes, only its own Node object"),
        "{}",
        out.stderr
    );

    // Pods: the ones bound to it, listed by node.
    let out = k(
        &n1,
        &[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=n1",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(out.stdout.trim(), "pod/p1", "{}", out.stderr);
    let out = k(&n1, &["get", "pods", "-A"]).await;
    assert!(
        out.stderr
            .contains("node: can only list/watch pods with spec.nodeName field selector"),
        "{}",
        out.stderr
    );
    let out = k(&n1, &["get", "pod", "p2"]).await;
    assert!(
        out.stderr
            .contains("node: no relationship found between node 'n1' and this object"),
        "{}",
        out.stderr
    );

    // The system:node rules: services; nothing for deployments (and no reason).
    let out = k(&n1, &["get", "services", "-o", "name"]).await;
    assert_eq!(out.stdout.trim(), "service/kubernetes", "{}", out.stderr);
    let out = k(&n1, &["get", "deployments"]).await;
    assert_eq!(
        out.stderr.trim(),
        "Error from server (Forbidden): deployments.apps is forbidden: User \"system:node:n1\" cannot list resource \"deployments\" in API group \"apps\" in the namespace \"default\""
    );

    // The graph follows the store: a new pod brings its references, a deleted one takes
    // them away.
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-"],
        Some("apiVersion: v1\nkind: Pod\nmetadata: {name: p3}\nspec:\n  nodeName: n1\n  containers: [{name: c, image: nginx}]\n  volumes: [{name: s, projected: {sources: [{secret: {name: s2}}]}}]\n"),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = eventually(&n1, &["get", "secret", "s2", "-o", "name"], |o| o.ok).await;
    assert_eq!(out.stdout.trim(), "secret/s2", "{}", out.stderr);
    let out = k(&kc, &["delete", "pod", "p1", "--grace-period=0", "--force"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = eventually(&n1, &["get", "secret", "s1"], |o| !o.ok).await;
    assert!(
        out.stderr.contains("no relationship found"),
        "{}",
        out.stderr
    );

    // The same answer through a SubjectAccessReview.
    let out = create_json(
        &kc,
        "apiVersion: authorization.k8s.io/v1\nkind: SubjectAccessReview\nspec:\n  user: system:node:n1\n  groups: [system:nodes]\n  resourceAttributes: {namespace: default, verb: get, resource: configmaps, name: nope}\n",
    )
    .await;
    assert_eq!(
        out_json(&out)["status"],
        serde_json::json!({"allowed": false, "reason": "node: no relationship found between node 'n1' and this object"})
    );
    let out = create_json(
        &kc,
        "apiVersion: authorization.k8s.io/v1\nkind: SubjectAccessReview\nspec:\n  user: system:node:n1\n  groups: [system:nodes]\n  resourceAttributes: {verb: list, resource: pods, fieldSelector: {rawSelector: spec.nodeName}}\n",
    )
    .await;
    assert_eq!(
        out_json(&out)["status"],
        serde_json::json!({
            "allowed": false,
            "reason": "node: can only list/watch pods with spec.nodeName field selector",
            "evaluationError": "spec.resourceAttributes.fieldSelector ignored due to parse error"
        })
    );
}
