//! kube-proxy's HTTP health endpoints on a real node, served in the node's namespace:
//! the proxy's own (`/healthz` and `/livez` on 10256) and, per Service with
//! `externalTrafficPolicy: Local`, its `healthCheckNodePort`, which a cloud load
//! balancer's health check asks whether this node has endpoints of the Service (200 with
//! their count, else 503), as upstream's healthcheck server answers.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tokio::task::JoinHandle;

/// The proxy's own health port (`--healthz-bind-address` 0.0.0.0:10256).
pub const HEALTHZ_PORT: u16 = 10256;
/// The proxy's metrics port (`--metrics-bind-address`; upstream's default binds it to
/// 127.0.0.1:10249, here every address of the node's namespace: no one else is there).
pub const METRICS_PORT: u16 = 10249;

const JSON: &str = "application/json";

/// One Service's health-check port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceHealth {
    pub namespace: String,
    pub name: String,
    /// Its ready endpoints on this node.
    pub local_endpoints: usize,
}

struct Served {
    namespace: String,
    name: String,
    local: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

/// The node's health servers.
pub struct HealthServers {
    netns: Option<PathBuf>,
    /// Whether the proxy synced its rules lately (what `/healthz` reports).
    healthy: Arc<AtomicBool>,
    proxy: Option<JoinHandle<()>>,
    metrics: Option<JoinHandle<()>>,
    services: HashMap<u16, Served>,
}

impl HealthServers {
    /// Health servers in namespace `netns` (this process's when `None`).
    pub fn new(netns: Option<PathBuf>) -> HealthServers {
        HealthServers {
            netns,
            healthy: Arc::new(AtomicBool::new(false)),
            proxy: None,
            metrics: None,
            services: HashMap::new(),
        }
    }

    /// Serves `metrics` on `/metrics` (10249).
    pub fn serve_metrics(&mut self, metrics: Arc<crate::metrics::ProxyMetrics>) {
        if self.metrics.is_some() {
            return;
        }
        match self.listen(METRICS_PORT) {
            Ok(l) => {
                self.metrics = Some(tokio::spawn(serve(l, move |path| {
                    if path != "/metrics" {
                        return (
                            StatusCode::NOT_FOUND,
                            "text/plain",
                            "404 page not found\n".to_owned(),
                        );
                    }
                    (
                        StatusCode::OK,
                        "text/plain; version=0.0.4; charset=utf-8",
                        metrics.render(),
                    )
                })))
            }
            Err(e) => tracing::warn!(error = %e, "kube-proxy's metrics port"),
        }
    }

    /// Records whether the last sync worked; starts `/healthz` on first use.
    pub fn set_proxy_healthy(&mut self, ok: bool) {
        self.healthy.store(ok, Ordering::Relaxed);
        if self.proxy.is_none() {
            let healthy = self.healthy.clone();
            match self.listen(HEALTHZ_PORT) {
                Ok(l) => {
                    self.proxy = Some(tokio::spawn(serve(l, move |path| {
                        let ok = healthy.load(Ordering::Relaxed);
                        if path != "/healthz" && path != "/livez" {
                            return (
                                StatusCode::NOT_FOUND,
                                "text/plain",
                                "404 page not found\n".to_owned(),
                            );
                        }
                        let now = crate::nft::rfc3339_now();
                        let body = serde_json::json!({
                            "lastUpdated": now, "currentTime": now, "nodeEligible": true,
                        });
                        let code = if ok {
                            StatusCode::OK
                        } else {
                            StatusCode::SERVICE_UNAVAILABLE
                        };
                        (code, JSON, body.to_string())
                    })))
                }
                Err(e) => tracing::warn!(error = %e, "kube-proxy's healthz port"),
            }
        }
    }

    /// Serves exactly `wanted` (health-check node port → Service and its local endpoints).
    pub fn sync(&mut self, wanted: &BTreeMap<u16, ServiceHealth>) {
        self.services.retain(|port, s| {
            let keep = wanted
                .get(port)
                .is_some_and(|w| w.namespace == s.namespace && w.name == s.name);
            if !keep {
                s.task.abort();
            }
            keep
        });
        for (port, w) in wanted {
            if let Some(s) = self.services.get(port) {
                s.local.store(w.local_endpoints, Ordering::Relaxed);
                continue;
            }
            let listener = match self.listen(*port) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(port, service = %format!("{}/{}", w.namespace, w.name), error = %e, "health check node port");
                    continue;
                }
            };
            let local = Arc::new(AtomicUsize::new(w.local_endpoints));
            let (ns, name, count) = (w.namespace.clone(), w.name.clone(), local.clone());
            let task = tokio::spawn(serve(listener, move |_path| {
                let n = count.load(Ordering::Relaxed);
                let body = serde_json::json!({
                    "service": {"namespace": ns, "name": name},
                    "localEndpoints": n,
                    "serviceProxyHealthy": true,
                });
                let code = if n > 0 {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                (code, JSON, body.to_string())
            }));
            self.services.insert(
                *port,
                Served {
                    namespace: w.namespace.clone(),
                    name: w.name.clone(),
                    local,
                    task,
                },
            );
        }
    }

    /// A listener on `port` of every address, in the node's namespace.
    fn listen(&self, port: u16) -> std::io::Result<tokio::net::TcpListener> {
        let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        let listener = match &self.netns {
            Some(ns) => {
                let ns = ns.clone();
                std::thread::spawn(move || {
                    let f = std::fs::File::open(&ns)?;
                    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::other)?;
                    std::net::TcpListener::bind(addr)
                })
                .join()
                .map_err(|_| std::io::Error::other("the listening thread panicked"))??
            }
            None => std::net::TcpListener::bind(addr)?,
        };
        listener.set_nonblocking(true)?;
        tokio::net::TcpListener::from_std(listener)
    }
}

impl Drop for HealthServers {
    fn drop(&mut self) {
        for t in self.proxy.iter().chain(self.metrics.iter()) {
            t.abort();
        }
        for s in self.services.values() {
            s.task.abort();
        }
    }
}

/// Serves HTTP/1.1 on `listener`, every request answered by `answer(path)`: status,
/// content type, body. (kumo-dns's `/health` and `/ready` are served with it too.)
pub async fn serve<F>(listener: tokio::net::TcpListener, answer: F)
where
    F: Fn(&str) -> (StatusCode, &'static str, String) + Send + Sync + 'static,
{
    let answer = Arc::new(answer);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let answer = answer.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let (code, content_type, body) = answer(req.uri().path());
                let weight = (content_type == JSON)
                    .then(|| serde_json::from_str::<serde_json::Value>(&body).ok())
                    .flatten()
                    .and_then(|v| v.get("localEndpoints").and_then(|n| n.as_u64()));
                let mut resp = Response::builder()
                    .status(code)
                    .header("Content-Type", content_type)
                    .header("X-Content-Type-Options", "nosniff");
                if let Some(w) = weight {
                    resp = resp.header("X-Load-Balancing-Endpoint-Weight", w.to_string());
                }
                let resp = resp
                    .body(Full::new(Bytes::from(body)))
                    .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}
