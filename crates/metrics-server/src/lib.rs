//! `kumo metrics-server`: the resource metrics API, `metrics.k8s.io/v1beta1` NodeMetrics
//! and PodMetrics, as kubernetes-sigs/metrics-server serves it: an extension API server
//! behind the `v1beta1.metrics.k8s.io` APIService, which the API server's aggregator
//! proxies `kubectl top` and the horizontal-pod-autoscaler to.
//!
//! * [`scrape`]: every resolution (15 s, as the add-on's manifest sets it), each node's
//!   kubelet `/metrics/resource` through the API server's node proxy (kumo's nodes live on
//!   a network the host does not route to; the API server reaches every kubelet), and
//!   usage computed from the last two points.
//! * [`api`]: the HTTPS API. Requests proxied by the aggregator are trusted by its
//!   front-proxy client certificate (the `requestheader-*` keys of the
//!   `kube-system/extension-apiserver-authentication` ConfigMap), others by TokenReview;
//!   each is authorized with a SubjectAccessReview (delegated authentication and
//!   authorization, as every extension API server does).
//!
//! The server speaks over any byte stream ([`MetricsServer::serve`]): `kumo up` hands it the
//! connections its simulated pod network makes to the metrics-server pod, and
//! `kumo metrics-server` a TCP listener.

pub mod api;
pub mod scrape;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

/// The image of metrics-server that `kumo up`'s add-on runs (and stands for).
pub const IMAGE: &str = "registry.k8s.io/metrics-server/metrics-server:v0.8.0";
/// The port its container serves on (`--secure-port`, the add-on's manifest).
pub const PORT: u16 = 10250;
/// The scrape interval of the add-on's manifest (`--metric-resolution`).
pub const RESOLUTION: Duration = Duration::from_secs(15);

/// What can go wrong starting the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("serving certificate: {0}")]
    Tls(String),
    #[error("reading kube-system/extension-apiserver-authentication: {0}")]
    Authentication(String),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A client with metrics-server's identity, asked for anew for each batch of requests
/// (its ServiceAccount token rotates).
pub type ClientFn = Arc<dyn Fn() -> kube::Client + Send + Sync>;

/// How to run it.
pub struct Config {
    /// Clients with metrics-server's identity (its ServiceAccount).
    pub client: ClientFn,
    /// How often the kubelets are scraped.
    pub resolution: Duration,
}

/// A running metrics server.
pub struct MetricsServer {
    api: Arc<api::Api>,
    tls: tokio_rustls::TlsAcceptor,
    scraper: tokio::task::JoinHandle<()>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.scraper.abort();
    }
}

impl MetricsServer {
    /// Reads the aggregator's trust from the cluster, makes a self-signed serving
    /// certificate (as metrics-server does without `--tls-cert-file`) and starts scraping.
    pub async fn start(cfg: Config) -> Result<Arc<MetricsServer>, Error> {
        let store = scrape::Store::new(cfg.resolution);
        let (api, tls) = api::Api::new(cfg.client.clone(), store.clone()).await?;
        let scraper = tokio::spawn(scrape::run(cfg.client, store));
        Ok(Arc::new(MetricsServer {
            api,
            tls: tokio_rustls::TlsAcceptor::from(tls),
            scraper,
        }))
    }

    /// Serves one connection (TLS, then HTTP/1.1 or HTTP/2) on a task of its own.
    pub fn serve<S>(&self, io: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (tls, api) = (self.tls.clone(), self.api.clone());
        tokio::spawn(async move {
            match tls.accept(io).await {
                Ok(stream) => api.serve(stream).await,
                Err(e) => tracing::debug!(error = %e, "metrics-server: TLS handshake failed"),
            }
        });
    }

    /// Serves HTTPS on `addr` until the process ends; returns the bound address.
    pub async fn listen(self: &Arc<Self>, addr: SocketAddr) -> Result<SocketAddr, Error> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Listen { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| Error::Listen { addr, source })?;
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((tcp, _)) => me.serve(tcp),
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics-server: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Ok(local)
    }
}
