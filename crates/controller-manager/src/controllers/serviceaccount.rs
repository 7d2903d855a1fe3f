//! serviceaccount-controller: the `default` ServiceAccount in every active namespace,
//! created again when it is deleted.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_already_exists, namespace_terminating};
use kumo_client::informer::{Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

/// The ServiceAccounts ensured in every namespace.
const ENSURE: &[&str] = &["default"];

struct Ctl {
    client: ClientSource,
    namespaces: Arc<Informer<Namespace>>,
    accounts: Arc<Informer<ServiceAccount>>,
}

/// Registers the handlers and returns the controller task (workers start once the caches synced).
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("serviceaccount");
    let namespaces = factory.informer::<Namespace>();
    let accounts = factory.informer::<ServiceAccount>();
    let q = queue.clone();
    accounts.add_handler(move |c| {
        if let Change::Deleted(sa) = c {
            if let Some(ns) = &sa.metadata.namespace {
                q.add(ns.clone());
            }
        }
    });
    let q = queue.clone();
    namespaces.add_handler(move |c| match c {
        Change::Added(ns) | Change::Updated { new: ns, .. } => {
            if let Some(n) = &ns.metadata.name {
                q.add(n.clone());
            }
        }
        Change::Deleted(_) => {}
    });
    tokio::spawn(async move {
        tracing::info!("Starting service account controller");
        let Some(client) = client_for(&clients, "service-account-controller", &mut stop).await
        else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            namespaces,
            accounts,
        });
        let synced = async {
            ctl.accounts.wait_synced().await;
            ctl.namespaces.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let tasks = run_workers_of(
            "serviceaccount",
            queue,
            1,
            stop,
            &ctl,
            |c, key| async move { c.sync(&key).await },
        );
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down service account controller");
    })
}

impl Ctl {
    async fn sync(&self, ns: &str) -> Result<(), SyncError> {
        let Some(namespace) = self.namespaces.get(ns) else {
            return Ok(());
        };
        let phase = namespace.status.as_ref().and_then(|s| s.phase.as_deref());
        if phase != Some("Active") {
            return Ok(());
        }
        let mut failures = Vec::new();
        for name in ENSURE {
            if self.accounts.get(&format!("{ns}/{name}")).is_some() {
                continue;
            }
            let sa = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some((*name).to_owned()),
                    namespace: Some(ns.to_owned()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let api: Api<ServiceAccount> = Api::namespaced(self.client.get(), ns);
            if let Err(e) = api.create(&PostParams::default(), &sa).await {
                // A namespace being deleted refuses new objects; that is not a failure.
                if !is_already_exists(&e) && !namespace_terminating(&e) {
                    failures.push(kumo_client::error::message(&e));
                }
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(SyncError::Failed(failures.join(", ")))
        }
    }
}
