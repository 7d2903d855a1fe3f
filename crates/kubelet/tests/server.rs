//! The kubelet's HTTPS API against an in-process API server: authentication (client
//! certificates of the cluster CA, bearer tokens through TokenReview, anonymous refused
//! with 401), authorization through SubjectAccessReview with upstream's attributes (403
//! text as upstream's), and `/containerLogs` with its query parameters.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{k, until_within};
use kumo_apiserver::pki;
use kumo_kubelet::prober::AnyServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Who the test client is.
enum Cred<'a> {
    None,
    Cert(&'a pki::CertAndKey),
    Token(&'a str),
}

/// One HTTPS GET to the kubelet: (status, body); `None` when the handshake fails.
async fn get(port: u16, path: &str, cred: Cred<'_>) -> Option<(u16, String)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
    let tls = match &cred {
        Cred::Cert(c) => {
            let certs = rustls_pemfile::certs(&mut c.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls_pemfile::private_key(&mut c.key_pem.as_bytes())
                .unwrap()
                .unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
        _ => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut io = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .ok()?;
    let auth = match cred {
        Cred::Token(t) => format!("Authorization: Bearer {t}\r\n"),
        _ => String::new(),
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    io.write_all(req.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    let _ = io.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_api_authenticates_authorizes_and_serves_logs() {
    let (server, dir) = common::start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    let pki_dir = dir.path().join("pki");
    let ca = pki::Ca::load_or_create(&pki_dir).unwrap();
    // The port it got is in the Node's daemonEndpoints.
    let port = common::start_serving_kubelet(dir.path(), &admin, "s1").await;

    // Anonymous: 401, as upstream's kubelet with anonymous auth off.
    assert_eq!(
        get(port, "/healthz", Cred::None).await,
        Some((401, "Unauthorized".into()))
    );
    // A token the TokenReview refuses: 401 too.
    assert_eq!(
        get(port, "/healthz", Cred::Token("garbage")).await,
        Some((401, "Unauthorized".into()))
    );
    // A certificate of another CA does not get through the handshake.
    let other = pki::Ca::load_or_create(&dir.path().join("other")).unwrap();
    let stranger = other.issue_client("mallory", &[]).unwrap();
    assert_eq!(get(port, "/healthz", Cred::Cert(&stranger)).await, None);
    // A known user without rights: upstream's 403 text, both attributes tried.
    let jane = ca.issue_client("jane", &[]).unwrap();
    assert_eq!(
        get(port, "/healthz", Cred::Cert(&jane)).await,
        Some((
            403,
            "Forbidden (user=jane, verb=get, resource=nodes, subresource(s)=[healthz proxy])\n"
                .into()
        ))
    );
    assert_eq!(
        get(port, "/containerLogs/default/p/c", Cred::Cert(&jane))
            .await
            .map(|r| r.1),
        Some("Forbidden (user=jane, verb=get, resource=nodes, subresource(s)=[proxy])\n".into())
    );
    // The API server's client certificate (kubeadm:cluster-admins → cluster-admin).
    let apiserver = pki::CertAndKey {
        cert_pem: std::fs::read_to_string(pki_dir.join("apiserver-kubelet-client.crt")).unwrap(),
        key_pem: std::fs::read_to_string(pki_dir.join("apiserver-kubelet-client.key")).unwrap(),
    };
    assert_eq!(
        get(port, "/healthz", Cred::Cert(&apiserver)).await,
        Some((200, "ok".into()))
    );
    // A ServiceAccount token, allowed nodes/proxy through RBAC.
    common::default_service_account(&admin, dir.path()).await;
    for args in [
        &[
            "create",
            "clusterrole",
            "node-proxy",
            "--verb=get",
            "--resource=nodes/proxy",
        ][..],
        &[
            "create",
            "clusterrolebinding",
            "node-proxy",
            "--clusterrole=node-proxy",
            "--serviceaccount=default:default",
        ],
    ] {
        let (ok, _, err) = k(&admin, args).await;
        assert!(ok, "{err}");
    }
    let (ok, token, err) = k(&admin, &["create", "token", "default"]).await;
    assert!(ok, "{err}");
    let token = token.trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // RBAC follows its objects by watch, and a denial is cached for 30 s: the
        // container logs path is asked only once the binding is visible.
        let (_, out, _) = k(
            &admin,
            &[
                "auth",
                "can-i",
                "get",
                "nodes",
                "--subresource=proxy",
                "--as=system:serviceaccount:default:default",
            ],
        )
        .await;
        if out.trim() == "yes" {
            break;
        }
        assert!(Instant::now() < deadline, "binding not visible");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        get(port, "/containerLogs/default/nope/c", Cred::Token(&token)).await,
        Some((404, "pod \"nope\" does not exist\n".into()))
    );

    // A pod on the node: its logs with upstream's query parameters.
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  nodeName: s1\n  containers:\n  - name: c\n    image: busybox\n    command: [sh, -c, 'echo one; echo two >&2; printf \"three\\n\"; sleep 3600']\n";
    let f = dir.path().join("p.yaml");
    std::fs::write(&f, pod).unwrap();
    let (ok, _, err) = k(&admin, &["create", "-f", f.to_str().unwrap()]).await;
    assert!(ok, "{err}");
    until_within(
        30,
        &admin,
        &["get", "pod", "p", "-o", "jsonpath={.status.phase}"],
        "pod runs",
        |o| o == "Running",
    )
    .await;
    let logs = |q: &'static str| {
        let token = token.clone();
        async move {
            get(
                port,
                &format!("/containerLogs/default/p/c{q}"),
                Cred::Token(&token),
            )
            .await
            .unwrap()
        }
    };
    assert_eq!(logs("").await, (200, "one\ntwo\nthree\n".into()));
    assert_eq!(logs("?tailLines=2").await, (200, "two\nthree\n".into()));
    assert_eq!(logs("?tail=all").await, (200, "one\ntwo\nthree\n".into()));
    assert_eq!(logs("?limitBytes=5").await, (200, "one\nt".into()));
    assert_eq!(logs("?stream=Stderr").await, (200, "two\n".into()));
    assert_eq!(
        logs("?sinceTime=2999-01-01T00:00:00Z").await,
        (200, String::new())
    );
    assert_eq!(logs("?sinceSeconds=600").await.1, "one\ntwo\nthree\n");
    let (code, body) = logs("?timestamps=true&tailLines=1").await;
    assert_eq!(code, 200);
    let (ts, line) = body.split_once(' ').unwrap();
    assert_eq!(line, "three\n");
    assert!(ts.len() == 30 && ts.ends_with('Z'), "{body}");
    assert_eq!(
        logs("?tailLines=-1").await,
        (422, r#"{"message": "Invalid request."}"#.into())
    );
    assert_eq!(
        logs("?follow=maybe").await,
        (400, r#"{"message": "Unable to decode query."}"#.into())
    );
    assert_eq!(
        logs("?previous=true").await,
        (
            400,
            "previous terminated container \"c\" in pod \"p\" not found".into()
        )
    );
    assert_eq!(
        get(port, "/containerLogs/default/p/nope", Cred::Token(&token))
            .await
            .unwrap(),
        (404, "container \"nope\" not found in pod \"p\"\n".into())
    );
    assert_eq!(
        get(port, "/nothing-here", Cred::Cert(&apiserver))
            .await
            .unwrap(),
        (404, "404 page not found\n".into())
    );
}
