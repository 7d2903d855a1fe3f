//! The clients controllers write with. With `--use-service-account-credentials` (what
//! kubeadm sets) each controller acts as its own ServiceAccount in kube-system (e.g.
//! `system:serviceaccount:kube-system:namespace-controller`, which the bootstrap RBAC
//! policy binds to `system:controller:namespace-controller`): the ServiceAccount is
//! created if missing and a TokenRequest token is used as a bearer token, renewed when 80 %
//! of its lifetime has passed (client-go's DynamicControllerClientBuilder). Without it,
//! every controller uses the controller-manager's own credentials.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::Client;
use parking_lot::RwLock;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::error::{is_already_exists, is_not_found, Error, Result};

/// The namespace of the controllers' ServiceAccounts.
const NAMESPACE: &str = "kube-system";
/// The lifetime asked for in each TokenRequest.
const EXPIRATION_SECONDS: i64 = 3600;
/// The share of the lifetime left when the token is renewed.
const LEEWAY_PERCENT: u32 = 20;

/// A client that may be replaced while in use (its token rotates); call [`Self::get`] for
/// each request or batch of requests.
#[derive(Clone)]
pub struct ClientSource(Arc<RwLock<Client>>);

impl ClientSource {
    /// A client that never changes.
    pub fn fixed(client: Client) -> Self {
        ClientSource(Arc::new(RwLock::new(client)))
    }

    /// The current client.
    pub fn get(&self) -> Client {
        self.0.read().clone()
    }
}

/// Hands out one client per controller.
pub struct ClientBuilder {
    root: Client,
    base: kube::Config,
    service_accounts: bool,
    stop: watch::Receiver<bool>,
}

impl ClientBuilder {
    /// `root` is the controller-manager's own client, made from `base`.
    pub fn new(
        root: Client,
        base: kube::Config,
        service_accounts: bool,
        stop: watch::Receiver<bool>,
    ) -> Self {
        ClientBuilder {
            root,
            base,
            service_accounts,
            stop,
        }
    }

    /// The controller-manager's own client (informers, leader election).
    pub fn root(&self) -> Client {
        self.root.clone()
    }

    /// The client of the controller whose ServiceAccount is `name`.
    pub async fn client(&self, name: &str) -> Result<ClientSource> {
        if !self.service_accounts {
            return Ok(ClientSource::fixed(self.root.clone()));
        }
        let (client, renew_in) = self.token_client(name).await?;
        let source = ClientSource::fixed(client);
        let shared = source.clone();
        let name = name.to_owned();
        let mut stop = self.stop.clone();
        let builder = ClientBuilder {
            root: self.root.clone(),
            base: self.base.clone(),
            service_accounts: true,
            stop: self.stop.clone(),
        };
        tokio::spawn(async move {
            let mut wait = renew_in;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                match builder.token_client(&name).await {
                    Ok((client, next)) => {
                        *shared.0.write() = client;
                        wait = next;
                    }
                    Err(e) => {
                        tracing::warn!(service_account = %name, error = %e, "renewing the controller's token failed");
                        wait = Duration::from_secs(10);
                    }
                }
            }
        });
        Ok(source)
    }

    /// A client with a fresh token for `kube-system/<name>`, and when to renew it. Tries
    /// four times, 0.5 s apart and doubling, as upstream.
    async fn token_client(&self, name: &str) -> Result<(Client, Duration)> {
        let mut delay = Duration::from_millis(500);
        let mut last = String::new();
        for _ in 0..4 {
            match self.request_token(name).await {
                Ok((token, lifetime)) => {
                    let mut cfg = self.base.clone();
                    // Only the token: the controller must not also present our certificate.
                    cfg.auth_info = serde_json::from_value(json!({ "token": token }))
                        .map_err(|e| Error::Client(e.to_string()))?;
                    let client = crate::transport::client(cfg)?;
                    let lifetime = lifetime.max(Duration::from_secs(600));
                    let renew = lifetime - lifetime * LEEWAY_PERCENT / 100;
                    return Ok((client, renew));
                }
                Err(e) => {
                    tracing::warn!(service_account = name, error = %e, "get token failed");
                    last = e.to_string();
                }
            }
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
        Err(Error::Client(format!(
            "failed to get token for {NAMESPACE}/{name}: {last}"
        )))
    }

    async fn request_token(&self, name: &str) -> Result<(String, Duration)> {
        self.get_or_create_service_account(name).await?;
        let body = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": EXPIRATION_SECONDS},
        });
        let req = http::Request::post(format!(
            "/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{name}/token"
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body).unwrap_or_default())
        .map_err(|e| Error::Client(e.to_string()))?;
        let tr: Value = self.root.request(req).await?;
        let token = tr["status"]["token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Error::Client("the TokenRequest answer has no token".into()))?
            .to_owned();
        let lifetime = tr["status"]["expirationTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|t| {
                let secs = t
                    .duration_since(k8s_openapi::jiff::Timestamp::now())
                    .as_secs()
                    .max(0);
                Duration::from_secs(secs as u64)
            })
            .unwrap_or(Duration::from_secs(EXPIRATION_SECONDS as u64));
        Ok((token, lifetime))
    }

    async fn get_or_create_service_account(&self, name: &str) -> Result<()> {
        let api: Api<ServiceAccount> = Api::namespaced(self.root.clone(), NAMESPACE);
        match api.get(name).await {
            Ok(_) => return Ok(()),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
        let namespaces: Api<Namespace> = Api::all(self.root.clone());
        if let Err(e) = namespaces.get(NAMESPACE).await {
            if is_not_found(&e) {
                let ns = Namespace {
                    metadata: ObjectMeta {
                        name: Some(NAMESPACE.into()),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                match namespaces.create(&PostParams::default(), &ns).await {
                    Ok(_) => {}
                    Err(e) if is_already_exists(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NAMESPACE.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &sa).await {
            Ok(_) => Ok(()),
            Err(e) if is_already_exists(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// The client configuration a kubeconfig file describes (its current context), with the
/// file named in the error when it cannot be read or used.
pub async fn config_from_kubeconfig(path: &std::path::Path) -> Result<kube::Config> {
    let bad = |message: String| Error::Kubeconfig {
        path: path.display().to_string(),
        message,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map(as_client_go)
        .map_err(|e| bad(e.to_string()))
}

/// `cfg` behaving as client-go's: a 503 or 429 is the caller's to handle. kube's default
/// retry policy repeats them up to 15 times with a back-off growing to 1000 s, so one
/// discovery of an unavailable aggregated API (`metrics.k8s.io` before its pod runs)
/// would hold the garbage collector's or the namespace controller's discovery for minutes.
pub fn as_client_go(mut cfg: kube::Config) -> kube::Config {
    cfg.default_retry = false;
    cfg
}
