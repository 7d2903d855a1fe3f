//! token-cleaner-controller (tokencleaner): deletes a bootstrap token Secret (type
//! `bootstrap.kubernetes.io/token` in kube-system) once its `expiration` has passed; one not
//! expired yet is looked at again when it will be. An unparseable expiration counts as
//! expired, as upstream's.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::is_not_found;
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

const SERVICE_ACCOUNT: &str = "token-cleaner";
const TOKEN_TYPE: &str = "bootstrap.kubernetes.io/token";
const NAMESPACE: &str = "kube-system";

fn is_token(s: &Secret) -> bool {
    s.type_.as_deref() == Some(TOKEN_TYPE) && s.metadata.namespace.as_deref() == Some(NAMESPACE)
}

/// How long until the token expires: None if it never does, zero if it has.
pub fn time_left(s: &Secret, now: Timestamp) -> Option<Duration> {
    let raw = s.data.as_ref()?.get("expiration")?;
    let text = String::from_utf8_lossy(&raw.0);
    let Ok(at) = text.parse::<Timestamp>() else {
        tracing::info!(
            secret = %key_of(s),
            "Unparseable expiration time ({text}). Treating as expired."
        );
        return Some(Duration::ZERO);
    };
    let left = at.duration_since(now);
    Some(Duration::try_from(left).unwrap_or(Duration::ZERO))
}

struct Ctl {
    client: ClientSource,
    secrets: Arc<Informer<Secret>>,
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("token_cleaner");
    let secrets = factory.informer::<Secret>();
    let q = queue.clone();
    secrets.add_handler(move |c| match c {
        Change::Added(s) | Change::Updated { new: s, .. } => {
            if is_token(s) {
                q.add(key_of(s));
            }
        }
        Change::Deleted(_) => {}
    });
    tokio::spawn(async move {
        tracing::info!("Starting token cleaner controller");
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl { client, secrets });
        if !wait_for_sync(&mut stop, ctl.secrets.wait_synced()).await {
            return;
        }
        let tasks = run_workers_of("token_cleaner", queue, 1, stop, &ctl, |c, key| async move {
            c.sync(&key).await
        });
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down token cleaner controller");
    })
}

impl Ctl {
    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let Some(secret) = self.secrets.get(key) else {
            return Ok(());
        };
        if !is_token(&secret) || secret.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        match time_left(&secret, Timestamp::now()) {
            None => Ok(()),
            Some(left) if !left.is_zero() => Err(SyncError::After(left)),
            Some(_) => {
                let name = secret.metadata.name.as_deref().unwrap_or_default();
                tracing::info!(secret = key, "Deleting expired secret");
                let api: Api<Secret> = Api::namespaced(self.client.get(), NAMESPACE);
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: secret.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match api.delete(name, &dp).await {
                    Ok(_) => Ok(()),
                    Err(e) if is_not_found(&e) || kumo_client::error::is_conflict(&e) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn token(expiration: Option<&str>) -> Secret {
        let mut s = Secret {
            type_: Some(TOKEN_TYPE.into()),
            ..Default::default()
        };
        s.metadata.namespace = Some(NAMESPACE.into());
        s.metadata.name = Some("bootstrap-token-abcdef".into());
        s.data = Some(
            expiration
                .map(|e| ("expiration".to_string(), ByteString(e.as_bytes().to_vec())))
                .into_iter()
                .collect(),
        );
        s
    }

    #[test]
    fn expirations() {
        let now: Timestamp = "2026-12-04T10:00:00Z".parse().unwrap();
        assert!(is_token(&token(None)));
        assert_eq!(time_left(&token(None), now), None);
        assert_eq!(
            time_left(&token(Some("2026-12-04T10:00:30Z")), now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            time_left(&token(Some("2026-12-04T09:00:00Z")), now),
            Some(Duration::ZERO)
        );
        assert_eq!(time_left(&token(Some("soon")), now), Some(Duration::ZERO));
    }
}
