//! Helpers: a cloud in process on 127.0.0.1:0, and raw HTTP requests to it.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use kumo_cloud::{CloudConfig, CloudServer, Hypervisor, HypervisorError, Instance, InstanceState};
use parking_lot::Mutex;

/// Records every boot and halt.
#[derive(Default)]
pub struct Recorder {
    pub calls: Mutex<Vec<(String, String)>>,
    pub fail_boot: Mutex<bool>,
}

#[async_trait::async_trait]
impl Hypervisor for Recorder {
    async fn boot(&self, i: &Instance) -> Result<(), HypervisorError> {
        self.calls.lock().push(("boot".into(), i.id.clone()));
        if *self.fail_boot.lock() {
            return Err(HypervisorError("no kubelet binary".into()));
        }
        Ok(())
    }
    async fn halt(&self, i: &Instance) -> Result<(), HypervisorError> {
        self.calls.lock().push(("halt".into(), i.id.clone()));
        Ok(())
    }
}

impl Recorder {
    pub fn count(&self, what: &str, id: &str) -> usize {
        self.calls
            .lock()
            .iter()
            .filter(|(w, i)| w == what && i == id)
            .count()
    }
}

pub async fn start(dir: &Path) -> (CloudServer, kumo_cloud::Client, Arc<Recorder>) {
    start_with(dir, |_| {}).await
}

pub async fn start_with(
    dir: &Path,
    f: impl FnOnce(&mut CloudConfig),
) -> (CloudServer, kumo_cloud::Client, Arc<Recorder>) {
    let rec = Arc::new(Recorder::default());
    let mut cfg = CloudConfig::new(dir);
    cfg.hypervisor = rec.clone();
    f(&mut cfg);
    let s = CloudServer::start(cfg).await.expect("cloud starts");
    let c = s.client().expect("client");
    (s, c, rec)
}

pub async fn running(c: &kumo_cloud::Client, id: &str) -> Instance {
    c.wait_for_instance_state(id, InstanceState::Running, Duration::from_secs(10))
        .await
        .expect("running")
}

pub struct Raw {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: serde_json::Value,
}

/// One HTTP/1.1 request over TLS; `auth` is the whole Authorization header value.
pub async fn raw(
    server: &CloudServer,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &[u8],
) -> Raw {
    let ca = std::fs::read_to_string(&server.ca_file).expect("ca");
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca.as_bytes()) {
        roots.add(c.expect("pem")).expect("add");
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(server.local_addr)
        .await
        .expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(
            rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name"),
            tcp,
        )
        .await
        .expect("tls");
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1");
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let resp = send
        .send_request(
            req.body(Full::new(Bytes::copy_from_slice(body)))
                .expect("request"),
        )
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    Raw {
        status,
        headers,
        body,
    }
}

pub fn admin_auth(dir: &Path) -> String {
    let c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("credentials.json")).expect("credentials"))
            .expect("json");
    format!(
        "Bearer {}:{}",
        c["accessKeyId"].as_str().expect("id"),
        c["secretAccessKey"].as_str().expect("secret")
    )
}
