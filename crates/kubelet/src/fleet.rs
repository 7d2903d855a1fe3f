//! Many simulated nodes in one process (`kumo kubelet --sim-nodes N`), for scale tests.
//!
//! Each node is a whole kubelet (registration, lease, status, pod workers on its own `sim`
//! runtime), as `kumo kubelet` runs one. They share a few HTTP/2 connections: every request of
//! node X goes through the same client, with `Impersonate-User: system:node:X` and
//! `Impersonate-Group: system:nodes`, so the API server authorizes and admits it as that
//! kubelet (Node authorizer, NodeRestriction) while the process holds one set of
//! credentials: an identity that may impersonate nodes (KWOK runs as one too).

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use kube::client::Body;
use kube::Client;

use crate::{KubeletConfig, Result};

/// Nodes that may register at the same time.
const CONCURRENT_REGISTRATIONS: usize = 64;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Nodes that share one HTTP/2 connection: a pod watch each plus their requests, well
/// under the streams a server allows per connection (kube-apiserver: 1000; Go: 250).
const NODES_PER_CONNECTION: usize = 100;

/// The group of every node identity.
const NODES_GROUP: &str = "system:nodes";

/// A client over one HTTP/2 connection (kube's own client speaks HTTP/1.1, one connection
/// per watch: thousands of simulated kubelets would each hold a TLS connection for their
/// pod watch, on both sides).
pub fn h2_client(config: &kube::Config) -> Result<Client> {
    use kube::client::ConfigExt;
    let mut tls = config.rustls_client_config().map_err(crate::Error::Api)?;
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnector::from((http, Arc::new(tls)));
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build::<_, Body>(https);
    let svc = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(crate::Error::Api)?)
        .map_err(|e: hyper_util::client::legacy::Error| -> BoxError { Box::new(e) })
        .service(hyper);
    Ok(Client::new(svc, config.default_namespace.clone()))
}

/// A client that speaks as `system:node:<node>` through `base`'s connections.
pub fn node_client(base: &Client, node: &str) -> Result<Client> {
    let user = HeaderValue::from_str(&format!("system:node:{node}"))
        .map_err(|e| crate::Error::Invalid(format!("node name {node:?}: {e}")))?;
    let svc = Impersonate {
        base: base.clone(),
        user,
    };
    Ok(Client::new(svc, base.default_namespace().to_owned()))
}

/// Adds the impersonation headers of one node to each request.
#[derive(Clone)]
struct Impersonate {
    base: Client,
    user: HeaderValue,
}

impl tower_service::Service<Request<Body>> for Impersonate {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, std::result::Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let headers = req.headers_mut();
        headers.insert("impersonate-user", self.user.clone());
        headers.insert("impersonate-group", HeaderValue::from_static(NODES_GROUP));
        let base = self.base.clone();
        Box::pin(async move { base.send(req).await })
    }
}

/// The names of `count` nodes named after `base`.
pub fn node_names(base: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{base}-{i}")).collect()
}

/// Runs `count` simulated nodes configured like `cfg` (named `<cfg.node_name>-<i>`; no
/// kubelet API, static pods or pod network) until the process ends. A node whose kubelet
/// stops is started again, as `kumo up` does with its kubelets.
pub async fn run(cfg: KubeletConfig, count: usize) -> Result<()> {
    let config = crate::config(&cfg.kubeconfig).await?;
    let bases = (0..count.div_ceil(NODES_PER_CONNECTION).max(1))
        .map(|_| h2_client(&config))
        .collect::<Result<Vec<_>>>()?;
    let gate = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_REGISTRATIONS));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, name) in node_names(&cfg.node_name, count).into_iter().enumerate() {
        let client = node_client(&bases[i / NODES_PER_CONNECTION], &name)?;
        let mut node = cfg.clone();
        node.node_name = name;
        node.server = None;
        node.pod_manifest_path = None;
        let gate = gate.clone();
        tasks.spawn(async move {
            loop {
                if let Err(e) = crate::run_with(node.clone(), client.clone(), Some(&gate)).await {
                    tracing::error!(node = %node.node_name, error = %e, "kubelet stopped; restarting");
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
    }
    tracing::info!(nodes = count, "simulated nodes started");
    while tasks.join_next().await.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_count_from_zero() {
        assert_eq!(node_names("sim", 3), ["sim-0", "sim-1", "sim-2"]);
        assert!(node_names("sim", 0).is_empty());
    }
}
