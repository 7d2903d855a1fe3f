//! Authentication and RBAC authorization through the real kubectl: requests without
//! credentials get 401 except the health and version endpoints, a certificate's CN and O
//! are the user and groups, RBAC bindings decide, impersonation is authorized, and the
//! 403 messages are kube-apiserver's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{k, start, Out};
use kumo_apiserver::pki;

/// A kubeconfig for `user` in `groups`, signed by the server's CA.
fn user_kubeconfig(data_dir: &Path, server: &str, user: &str, groups: &[&str]) -> PathBuf {
    let ca = pki::Ca::load_or_create(&data_dir.join("pki")).unwrap();
    let cert = ca.issue_client(user, groups).unwrap();
    let path = data_dir.join(format!("{user}.conf"));
    std::fs::write(
        &path,
        pki::kubeconfig("kumo", server, &ca.cert_pem, user, &cert),
    )
    .unwrap();
    path
}

fn server_url(admin: &Path) -> String {
    let text = std::fs::read_to_string(admin).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_owned()
}

/// Retries `f` until it succeeds: RBAC changes reach the authorizer through a watch.
async fn eventually(what: &str, mut f: impl AsyncFnMut() -> Out) -> Out {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = f().await;
        if out.ok || Instant::now() > deadline {
            assert!(out.ok, "{what}: {}", out.stderr);
            return out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `curl` of `path` without credentials: (HTTP code, body).
fn curl_anonymous(data_dir: &Path, server: &str, path: &str) -> (String, String) {
    let out = std::process::Command::new("curl")
        .args(["-s", "--cacert"])
        .arg(data_dir.join("pki/ca.crt"))
        .args(["-w", "\n%{http_code}", &format!("{server}{path}")])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_owned(), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn anonymous_requests_reach_only_health_and_version() {
    let (server, dir) = start().await;
    let url = server_url(&server.admin_kubeconfig);
    for path in [
        "/healthz",
        "/livez",
        "/readyz",
        "/version",
        "/readyz?verbose",
    ] {
        let (code, _) = tokio::task::block_in_place(|| curl_anonymous(dir.path(), &url, path));
        assert_eq!(code, "200", "{path}");
    }
    for path in [
        "/api",
        "/apis",
        "/metrics",
        "/openapi/v2",
        "/api/v1/namespaces/default/pods",
    ] {
        let (code, body) = tokio::task::block_in_place(|| curl_anonymous(dir.path(), &url, path));
        assert_eq!(code, "401", "{path}");
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["reason"], "Unauthorized");
        assert_eq!(status["message"], "Unauthorized");
    }
    // An invalid bearer token is refused too, even where anonymous requests are not.
    let token = token_kubeconfig(dir.path(), &url, "not-a-valid-token");
    let out = k(&token, &["get", "pods"]).await;
    assert!(
        out.stderr.contains("You must be logged in to the server"),
        "{}",
        out.stderr
    );
}

/// A kubeconfig with a bearer token.
fn token_kubeconfig(data_dir: &Path, server: &str, token: &str) -> PathBuf {
    use base64::Engine;
    let ca = std::fs::read_to_string(data_dir.join("pki/ca.crt")).unwrap();
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    let path = data_dir.join("token.conf");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {server}\n  name: c\ncontexts:\n- context:\n    cluster: c\n    user: t\n  name: c\ncurrent-context: c\nusers:\n- name: t\n  user:\n    token: {token}\n"
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rbac_decides_with_upstream_messages() {
    let (server, dir) = start().await;
    let admin = server.admin_kubeconfig.clone();
    let url = server_url(&admin);
    let jane = user_kubeconfig(dir.path(), &url, "jane", &["devs"]);

    // No binding: forbidden, in kube-apiserver's words.
    let out = k(&jane, &["get", "pods"]).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "Error from server (Forbidden): pods is forbidden: User \"jane\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    let out = k(&jane, &["get", "--raw", "/metrics"]).await;
    assert!(
        out.stderr
            .contains("forbidden: User \"jane\" cannot get path \"/metrics\""),
        "{}",
        out.stderr
    );
    let out = k(&jane, &["get", "nodes"]).await;
    assert!(
        out.stderr.contains("nodes is forbidden: User \"jane\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"),
        "{}",
        out.stderr
    );
    // Discovery and health are open to every authenticated user (system:discovery,
    // system:public-info-viewer).
    assert!(k(&jane, &["get", "--raw", "/apis"]).await.ok);
    assert!(k(&jane, &["get", "--raw", "/healthz"]).await.ok);

    // A Role bound to the user: get and list, not delete.
    assert!(
        k(&admin, &["create", "configmap", "x", "--from-literal=a=b"])
            .await
            .ok
    );
    let out = k(
        &admin,
        &[
            "create",
            "role",
            "reader",
            "--verb=get,list",
            "--resource=configmaps",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &admin,
        &[
            "create",
            "rolebinding",
            "jane-reads",
            "--role=reader",
            "--user=jane",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually("jane lists configmaps", async || {
        k(&jane, &["get", "configmaps"]).await
    })
    .await;
    assert!(k(&jane, &["get", "configmap", "x"]).await.ok);
    let out = k(&jane, &["delete", "configmap", "x"]).await;
    assert_eq!(
        out.stderr.trim(),
        "Error from server (Forbidden): configmaps \"x\" is forbidden: User \"jane\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"default\""
    );
    // Only in the binding's namespace.
    let out = k(&jane, &["get", "configmaps", "-n", "kube-system"]).await;
    assert!(!out.ok);

    // Through a group, cluster-wide, with a subresource.
    let out = k(
        &admin,
        &[
            "create",
            "clusterrole",
            "scaler",
            "--verb=get,patch",
            "--resource=deployments.apps,deployments.apps/scale",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &admin,
        &[
            "create",
            "clusterrolebinding",
            "devs-scale",
            "--clusterrole=scaler",
            "--group=devs",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&admin, &["create", "deployment", "web", "--image=nginx"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually("jane scales through the group's binding", async || {
        k(&jane, &["scale", "deployment", "web", "--replicas=3"]).await
    })
    .await;
    let out = k(&jane, &["delete", "deployment", "web"]).await;
    assert!(out.stderr.contains("deployments.apps \"web\" is forbidden: User \"jane\" cannot delete resource \"deployments\" in API group \"apps\" in the namespace \"default\""), "{}", out.stderr);

    // A binding to a role that does not exist is named in the reason.
    let out = k(
        &admin,
        &[
            "create",
            "rolebinding",
            "ghost",
            "--clusterrole=no-such-role",
            "--user=jane",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = k(&jane, &["get", "secrets"]).await;
        let expected = ": RBAC: clusterrole.rbac.authorization.k8s.io \"no-such-role\" not found";
        if out.stderr.contains(expected) {
            break;
        }
        assert!(Instant::now() < deadline, "{}", out.stderr);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn impersonation_is_authorized() {
    let (server, dir) = start().await;
    let admin = server.admin_kubeconfig.clone();
    let jane = user_kubeconfig(dir.path(), &server_url(&admin), "jane", &[]);

    // The admin may impersonate; the request is then decided as the impersonated user.
    let out = k(&admin, &["get", "pods", "--as=bob"]).await;
    assert_eq!(
        out.stderr.trim(),
        "Error from server (Forbidden): pods is forbidden: User \"bob\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    let out = k(
        &admin,
        &["get", "pods", "--as=bob", "--as-group=system:masters"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    // A user without the impersonate verb may not.
    let out = k(&jane, &["get", "pods", "--as=bob"]).await;
    assert_eq!(
        out.stderr.trim(),
        "Error from server (Forbidden): users \"bob\" is forbidden: User \"jane\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
    );
    let out = k(
        &jane,
        &["get", "pods", "--as=system:serviceaccount:default:builder"],
    )
    .await;
    assert!(
        out.stderr.contains("serviceaccounts \"builder\" is forbidden: User \"jane\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"default\""),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rbac_refuses_privilege_escalation() {
    let (server, dir) = start().await;
    let admin = server.admin_kubeconfig.clone();
    let jane = user_kubeconfig(dir.path(), &server_url(&admin), "jane", &[]);
    // jane may manage Roles and RoleBindings and read configmaps, nothing else.
    for args in [
        &[
            "create",
            "role",
            "role-maker",
            "--verb=create,update,get",
            "--resource=roles.rbac.authorization.k8s.io,rolebindings.rbac.authorization.k8s.io",
        ][..],
        &[
            "create",
            "role",
            "cm-reader",
            "--verb=get,list",
            "--resource=configmaps",
        ],
        &[
            "create",
            "rolebinding",
            "jane-rm",
            "--role=role-maker",
            "--user=jane",
        ],
        &[
            "create",
            "rolebinding",
            "jane-cm",
            "--role=cm-reader",
            "--user=jane",
        ],
    ] {
        let out = k(&admin, args).await;
        assert!(out.ok, "{args:?}: {}", out.stderr);
    }
    // A role with rules she holds: allowed (retried until her bindings arrived).
    eventually("jane grants what she holds", async || {
        k(
            &jane,
            &[
                "create",
                "role",
                "r0",
                "--verb=get",
                "--resource=configmaps",
            ],
        )
        .await
    })
    .await;
    // More than she holds: refused with the missing rules, as kube-apiserver words it.
    let out = k(
        &jane,
        &[
            "create",
            "role",
            "r1",
            "--verb=get,list",
            "--resource=pods,secrets",
            "--resource=deployments.apps",
        ],
    )
    .await;
    assert_eq!(
        out.stderr.trim(),
        "Error from server (Forbidden): roles.rbac.authorization.k8s.io \"r1\" is forbidden: user \"jane\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"get\" \"list\"]}\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"list\"]}\n{APIGroups:[\"apps\"], Resources:[\"deployments\"], Verbs:[\"get\" \"list\"]}"
    );
    // Binding a role she does not hold is refused; one she holds is allowed.
    let out = k(
        &admin,
        &[
            "create",
            "clusterrole",
            "pod-admin",
            "--verb=*",
            "--resource=pods",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &jane,
        &[
            "create",
            "rolebinding",
            "b1",
            "--clusterrole=pod-admin",
            "--user=bob",
        ],
    )
    .await;
    assert!(
        out.stderr.contains("rolebindings.rbac.authorization.k8s.io \"b1\" is forbidden: user \"jane\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"*\"]}"),
        "{}",
        out.stderr
    );
    let out = k(
        &jane,
        &[
            "create",
            "rolebinding",
            "b2",
            "--role=cm-reader",
            "--user=bob",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    // A binding to a role that does not exist: upstream's NotFound.
    let out = k(
        &jane,
        &[
            "create",
            "rolebinding",
            "b3",
            "--role=nonexist",
            "--user=bob",
        ],
    )
    .await;
    assert!(
        out.stderr
            .contains("rolebindings.rbac.authorization.k8s.io \"nonexist\" not found"),
        "{}",
        out.stderr
    );
    // With `bind` on the role she may bind it without holding it.
    let out = k(
        &admin,
        &[
            "create",
            "clusterrole",
            "binder",
            "--verb=bind",
            "--resource=clusterroles.rbac.authorization.k8s.io",
            "--resource-name=pod-admin",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &admin,
        &[
            "create",
            "rolebinding",
            "jane-binder",
            "--clusterrole=binder",
            "--user=jane",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually("jane binds with the bind verb", async || {
        k(
            &jane,
            &[
                "create",
                "rolebinding",
                "b4",
                "--clusterrole=pod-admin",
                "--user=bob",
            ],
        )
        .await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn service_account_issuer_discovery() {
    use base64::Engine;
    let (server, _dir) = start().await;
    let admin = server.admin_kubeconfig.clone();
    let out = k(
        &admin,
        &["get", "--raw", "/.well-known/openid-configuration"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let config: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        config["issuer"],
        "https://kubernetes.default.svc.cluster.local"
    );
    assert!(config["jwks_uri"]
        .as_str()
        .unwrap()
        .ends_with("/openid/v1/jwks"));
    let out = k(&admin, &["get", "--raw", "/openid/v1/jwks"]).await;
    let jwks: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let key = &jwks["keys"][0];
    assert_eq!(
        (key["kty"].as_str(), key["alg"].as_str()),
        (Some("EC"), Some("ES256"))
    );
    // Tokens name the published key.
    assert!(k(&admin, &["create", "sa", "reader"]).await.ok);
    let out = k(&admin, &["create", "token", "reader"]).await;
    assert!(out.ok, "{}", out.stderr);
    let header = out.stdout.trim().split('.').next().unwrap();
    let header: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(header)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["kid"], key["kid"]);
    assert_eq!(header["alg"], "ES256");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certificates_from_another_ca_are_refused() {
    let (server, dir) = start().await;
    let admin = server.admin_kubeconfig.clone();
    // A certificate for a system:masters user, signed by a CA the server does not trust.
    let other = tempfile::tempdir().unwrap();
    let rogue_ca = pki::Ca::load_or_create(other.path()).unwrap();
    let cert = rogue_ca
        .issue_client("mallory", &["system:masters"])
        .unwrap();
    let ca = std::fs::read_to_string(dir.path().join("pki/ca.crt")).unwrap();
    let path = dir.path().join("mallory.conf");
    std::fs::write(
        &path,
        pki::kubeconfig("kumo", &server_url(&admin), &ca, "mallory", &cert),
    )
    .unwrap();
    let out = k(&path, &["get", "secrets", "-A"]).await;
    assert!(!out.ok, "a certificate from another CA was accepted");
    // As kube-apiserver: the handshake succeeds and authentication fails with 401 (worded
    // by kubectl's discovery when its cache is cold, else from the Status).
    let unauthorized = |stderr: &str| {
        let last = stderr.trim().lines().last().unwrap_or("");
        last == "error: You must be logged in to the server (Unauthorized)"
            || last == "error: You must be logged in to the server (the server has asked for the client to provide credentials)"
    };
    assert!(unauthorized(&out.stderr), "{}", out.stderr);

    // A certificate of the cluster CA that has expired: 401 as well, even on the paths
    // anonymous requests may reach (a bad credential is not the absence of one).
    let expired = expired_client_cert(dir.path(), "old-admin", &["system:masters"]);
    let path = dir.path().join("expired.conf");
    std::fs::write(
        &path,
        pki::kubeconfig("kumo", &server_url(&admin), &ca, "old-admin", &expired),
    )
    .unwrap();
    let out = k(&path, &["get", "namespaces"]).await;
    assert!(unauthorized(&out.stderr), "{}", out.stderr);
    let out = k(&path, &["get", "--raw", "/healthz"]).await;
    assert!(
        out.stderr.contains("(Unauthorized)"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    // The server is unharmed.
    assert!(k(&admin, &["get", "namespaces"]).await.ok);
}

/// A client certificate of the cluster CA for `user` that expired yesterday.
fn expired_client_cert(data_dir: &Path, user: &str, groups: &[&str]) -> pki::CertAndKey {
    let pem = |f: &str| std::fs::read_to_string(data_dir.join("pki").join(f)).unwrap();
    let ca_key = rcgen::KeyPair::from_pem(&pem("ca.key")).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&pem("ca.crt"), ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut dn = rcgen::DistinguishedName::new();
    for g in groups {
        dn.push(rcgen::DnType::OrganizationName, *g);
    }
    dn.push(rcgen::DnType::CommonName, user);
    params.distinguished_name = dn;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(2);
    params.not_after = now - time::Duration::days(1);
    let cert = params.signed_by(&key, &issuer).unwrap();
    pki::CertAndKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}
