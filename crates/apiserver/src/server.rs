//! The HTTPS listener and start-up: store, certificates, admin kubeconfig, the namespaces
//! every cluster has, then serving.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kumo_storage::embedded::{EmbeddedConfig, EmbeddedStore};
use kumo_storage::etcd::EtcdStore;
use kumo_storage::{CompactionConfig, Limits, Store};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::handler::{self, State};
use crate::negotiate::{Accept, Output};
use crate::pki;
use crate::registry::Registry;
use crate::rest::{self, Rest};

/// Where the API server keeps its state.
#[derive(Clone, Debug)]
pub enum StoreConfig {
    /// The embedded store in `<data-dir>/store`.
    Embedded,
    /// A real etcd cluster.
    Etcd(Vec<String>),
}

/// Settings of `kumo apiserver`.
#[derive(Clone, Debug)]
pub struct ApiServerConfig {
    /// Address to listen on (port 0 picks a free one).
    pub bind: SocketAddr,
    /// Certificates, kubeconfigs and (for the embedded store) data.
    pub data_dir: PathBuf,
    pub store: StoreConfig,
    /// Extra IP address for the serving certificate and the kubeconfig.
    pub advertise_address: Option<IpAddr>,
}

impl ApiServerConfig {
    /// Defaults: 127.0.0.1:6443, the embedded store.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        ApiServerConfig {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 6443),
            data_dir: data_dir.into(),
            store: StoreConfig::Embedded,
            advertise_address: None,
        }
    }
}

/// A running API server.
pub struct ApiServer {
    /// The address it listens on.
    pub local_addr: SocketAddr,
    /// The admin kubeconfig it wrote.
    pub admin_kubeconfig: PathBuf,
    /// Time from start to serving.
    pub startup: std::time::Duration,
    task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    /// Starts serving; returns once the listener is up and the cluster is bootstrapped.
    pub async fn start(cfg: ApiServerConfig) -> Result<ApiServer> {
        let started = Instant::now();
        std::fs::create_dir_all(&cfg.data_dir)
            .with_context(|| format!("creating {}", cfg.data_dir.display()))?;
        let store: Arc<dyn Store> = match &cfg.store {
            StoreConfig::Embedded => {
                EmbeddedStore::open(EmbeddedConfig::new(cfg.data_dir.join("store"))).await?
            }
            StoreConfig::Etcd(endpoints) => {
                EtcdStore::connect(endpoints, Limits::default(), CompactionConfig::default())
                    .await?
            }
        };
        let listener = TcpListener::bind(cfg.bind)
            .await
            .with_context(|| format!("listening on {}", cfg.bind))?;
        let local_addr = listener.local_addr()?;

        // Certificates, laid out like kubeadm's.
        let pki_dir = cfg.data_dir.join("pki");
        let ca = pki::Ca::load_or_create(&pki_dir)?;
        let mut ips: Vec<IpAddr> = vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)),
        ];
        if let Some(a) = cfg.advertise_address {
            ips.push(a);
        }
        if !cfg.bind.ip().is_unspecified() && !ips.contains(&cfg.bind.ip()) {
            ips.push(cfg.bind.ip());
        }
        let mut dns: Vec<String> = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        if let Ok(h) = std::fs::read_to_string("/etc/hostname") {
            let h = h.trim();
            if !h.is_empty() && !dns.iter().any(|d| d == h) {
                dns.push(h.to_owned());
            }
        }
        // The serving certificate is issued anew at every start (its SANs follow the flags).
        let serving = ca.issue_serving("kube-apiserver", &dns, &ips)?;
        pki::write_file(
            &pki_dir.join("apiserver.key"),
            serving.key_pem.as_bytes(),
            0o600,
        )?;
        pki::write_file(
            &pki_dir.join("apiserver.crt"),
            serving.cert_pem.as_bytes(),
            0o644,
        )?;
        let admin = pki::load_or_issue(&pki_dir, "admin", || {
            ca.issue_client("kubernetes-admin", &["kubeadm:cluster-admins"])
        })?;
        let host = match (cfg.advertise_address, local_addr.ip()) {
            (Some(a), _) => a,
            (None, ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            (None, ip) => ip,
        };
        let server_url = format!("https://{}", SocketAddr::new(host, local_addr.port()));
        let admin_kubeconfig = cfg.data_dir.join("admin.conf");
        pki::write_file(
            &admin_kubeconfig,
            pki::kubeconfig(
                "kumo",
                &server_url,
                &ca.cert_pem,
                "kubernetes-admin",
                &admin,
            )
            .as_bytes(),
            0o600,
        )?;

        let tls = tls_config(&ca.cert_pem, &serving)?;
        let rest = Arc::new(Rest::new(store.clone()));
        let registry = Registry::builtin();
        bootstrap_namespaces(&rest, &registry).await?;
        let state = Arc::new(State {
            registry,
            rest,
            address: SocketAddr::new(host, local_addr.port()).to_string(),
            checks: vec![
                ("etcd", Arc::new(|| true)),
                ("poststarthook/bootstrap-namespaces", Arc::new(|| true)),
            ],
        });
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let task = tokio::spawn(serve(listener, acceptor, state));
        let startup = started.elapsed();
        tracing::info!(address = %local_addr, ?startup, "kumo apiserver serving");
        Ok(ApiServer {
            local_addr,
            admin_kubeconfig,
            startup,
            task,
        })
    }

    /// Waits until the server stops (it runs until the process ends).
    pub async fn wait(self) -> Result<()> {
        self.task.await.context("server task failed")
    }
}

fn tls_config(ca_pem: &str, serving: &pki::CertAndKey) -> Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> =
        rustls_pemfile::certs(&mut serving.cert_pem.as_bytes()).collect::<Result<_, _>>()?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut serving.key_pem.as_bytes())?
        .context("serving key missing")?;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    // Client certificates are verified against the cluster CA when presented; requests
    // without one reach authentication as anonymous (health and version stay reachable).
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

async fn serve(listener: TcpListener, acceptor: TlsAcceptor, state: Arc<State>) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let state = state.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let service = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, std::convert::Infallible>(handler::handle(state, req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(e) = builder.serve_connection(TokioIo::new(tls), service).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

/// The namespaces every cluster has.
async fn bootstrap_namespaces(rest: &Rest, registry: &Registry) -> Result<()> {
    let Some(ns) = registry.find("", "v1", "namespaces") else {
        return Ok(());
    };
    let query = Default::default();
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        let body = body.to_string();
        let req = rest::Request {
            query: &query,
            accept: Accept {
                output: Output::Object,
                yaml: false,
            },
            content_type: Some("application/json"),
            body: body.as_bytes(),
        };
        match rest.create(&ns, None, &req).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => anyhow::bail!("creating namespace {name}: {}", e.message),
        }
    }
    Ok(())
}
