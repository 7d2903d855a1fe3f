//! The kubelet's `/portForward` in its WebSocket channel form (`v4.channel.k8s.io`, the
//! ports in the query: what the language clients use, kubectl speaking SPDY instead; see
//! crates/kumo/tests/portforward.rs), against an in-process API server: the sim nginx
//! answers on the data channel of port 80, the runtime's error comes on the error
//! channel of a port nothing listens on, and bad requests get upstream's answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{k, until_within};
use kumo_apiserver::pki;
use kumo_kubelet::prober::AnyServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

async fn connect(port: u16, cert: &pki::CertAndKey) -> Tls {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = rustls_pemfile::certs(&mut cert.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls_pemfile::private_key(&mut cert.key_pem.as_bytes())
        .unwrap()
        .unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_client_auth_cert(certs, key)
        .unwrap();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .unwrap()
}

/// The response head (up to the blank line), read byte by byte.
async fn read_head(io: &mut Tls) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        if io.read_exact(&mut b).await.is_err() {
            break;
        }
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// The body after `head`, by its Content-Length.
async fn read_body(io: &mut Tls, head: &str) -> String {
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .expect("content-length");
    let mut b = vec![0u8; len];
    io.read_exact(&mut b).await.unwrap();
    String::from_utf8(b).unwrap()
}

/// A WebSocket upgrade of `path` with `protocol`: the response head.
async fn upgrade(io: &mut Tls, path: &str, protocol: &str) -> String {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n"
    );
    io.write_all(req.as_bytes()).await.unwrap();
    read_head(io).await
}

/// One server frame: (opcode, payload); None at the end.
async fn frame(io: &mut Tls) -> Option<(u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    tokio::time::timeout(Duration::from_secs(10), io.read_exact(&mut h))
        .await
        .ok()?
        .ok()?;
    let mut len = u64::from(h[1] & 0x7f);
    if len == 126 {
        let mut b = [0u8; 2];
        io.read_exact(&mut b).await.ok()?;
        len = u64::from(u16::from_be_bytes(b));
    } else if len == 127 {
        let mut b = [0u8; 8];
        io.read_exact(&mut b).await.ok()?;
        len = u64::from_be_bytes(b);
    }
    let mut p = vec![0u8; len as usize];
    io.read_exact(&mut p).await.ok()?;
    Some((h[0] & 0x0f, p))
}

/// A masked binary client frame.
async fn send(io: &mut Tls, payload: &[u8]) {
    let mask = [1u8, 2, 3, 4];
    let mut f = vec![0x82];
    assert!(payload.len() < 126);
    f.push(0x80 | payload.len() as u8);
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    io.write_all(&f).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn port_forward_websocket_channels() {
    let (server, dir) = common::start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    let pki_dir = dir.path().join("pki");
    let ca = pki::Ca::load_or_create(&pki_dir).unwrap();
    let client = ca.issue_client("pf-admin", &["system:masters"]).unwrap();
    let port = common::start_serving_kubelet(dir.path(), &admin, "pf1").await;
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\nspec:\n  nodeName: pf1\n  containers:\n  - name: nginx\n    image: nginx:1.29.1\n";
    common::default_service_account(&admin, dir.path()).await;
    std::fs::write(dir.path().join("web.yaml"), pod).unwrap();
    let (ok, _, err) = k(
        &admin,
        &[
            "create",
            "-f",
            dir.path().join("web.yaml").to_str().unwrap(),
        ],
    )
    .await;
    assert!(ok, "{err}");
    until_within(
        30,
        &admin,
        &["get", "pod", "web", "-o", "jsonpath={.status.phase}"],
        "web runs",
        |o| o == "Running",
    )
    .await;

    // Ports 80 and 81: channels 0/1 and 2/3, each opened with its port.
    let mut io = connect(port, &client).await;
    let head = upgrade(
        &mut io,
        "/portForward/default/web?port=80&port=81",
        "v4.channel.k8s.io",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-protocol: v4.channel.k8s.io\r\n"),
        "{head}"
    );
    let mut opened = Vec::new();
    for _ in 0..4 {
        let (op, p) = frame(&mut io).await.expect("port message");
        assert_eq!(op, 0x2);
        opened.push(p);
    }
    opened.sort();
    assert_eq!(
        opened,
        vec![
            vec![0, 80, 0],
            vec![1, 80, 0],
            vec![2, 81, 0],
            vec![3, 81, 0]
        ]
    );
    send(
        &mut io,
        b"\x00GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n",
    )
    .await;
    let mut data = Vec::new();
    let mut errors = Vec::new();
    let mut closed = false;
    while let Some((op, p)) = frame(&mut io).await {
        match (op, p.split_first()) {
            (0x8, _) => {
                closed = true;
                break;
            }
            (0x2, Some((0, rest))) => data.extend_from_slice(rest),
            (0x2, Some((3, rest))) => errors.extend_from_slice(rest),
            other => panic!("unexpected frame {other:?}"),
        }
    }
    assert!(closed, "no close frame");
    let data = String::from_utf8_lossy(&data);
    assert!(
        data.starts_with("HTTP/1.1 200 OK\r\nServer: nginx/1.29.1\r\n"),
        "{data}"
    );
    let errors = String::from_utf8_lossy(&errors);
    assert!(
        errors.starts_with("error forwarding port 81 to pod sandbox-")
            && errors.contains("failed to connect to localhost:81 inside namespace \"sandbox-")
            && errors.contains("dial tcp4 127.0.0.1:81: connect: connection refused"),
        "{errors}"
    );

    // Upstream's refusals.
    let mut io = connect(port, &client).await;
    let head = upgrade(&mut io, "/portForward/default/web", "v4.channel.k8s.io").await;
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
    let body = read_body(&mut io, &head).await;
    assert!(
        body.contains("query parameter \"port\" is required"),
        "{body}"
    );
    let mut io = connect(port, &client).await;
    let head = upgrade(
        &mut io,
        "/portForward/default/nope?port=80",
        "v4.channel.k8s.io",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 404 "), "{head}");
    let body = read_body(&mut io, &head).await;
    assert!(body.contains("pod does not exist"), "{body}");
}
