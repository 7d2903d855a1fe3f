//! root-ca-certificate-publisher-controller: the ConfigMap `kube-root-ca.crt` with the
//! cluster CA (`ca.crt`) in every namespace, restored when it is changed or deleted.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_not_found, namespace_terminating};
use kumo_client::informer::{Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

/// The ConfigMap's name.
pub const CONFIG_MAP: &str = "kube-root-ca.crt";
/// The annotation that says what the ConfigMap is for.
pub const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
/// Upstream's text of that annotation.
pub const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

struct Ctl {
    client: ClientSource,
    root_ca: String,
    config_maps: Arc<Informer<ConfigMap>>,
}

/// Registers the handlers and returns the controller task (workers start once the caches synced).
pub fn start(
    clients: Arc<ClientBuilder>,
    root_ca: String,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("root_ca_cert_publisher");
    let namespaces = factory.informer::<Namespace>();
    let config_maps = factory.informer::<ConfigMap>();
    let q = queue.clone();
    config_maps.add_handler(move |c| {
        let cm = match c {
            Change::Updated { new, .. } => new,
            Change::Deleted(cm) => cm,
            Change::Added(_) => return,
        };
        if cm.metadata.name.as_deref() == Some(CONFIG_MAP) {
            if let Some(ns) = &cm.metadata.namespace {
                q.add(ns.clone());
            }
        }
    });
    let q = queue.clone();
    namespaces.add_handler(move |c| {
        let ns = match c {
            Change::Added(ns) => ns,
            Change::Updated { new, .. } => {
                let active = new.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Active");
                if !active {
                    return;
                }
                new
            }
            Change::Deleted(_) => return,
        };
        if let Some(n) = &ns.metadata.name {
            q.add(n.clone());
        }
    });
    tokio::spawn(async move {
        tracing::info!("Starting root CA cert publisher controller");
        let Some(client) = client_for(&clients, "root-ca-cert-publisher", &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            root_ca,
            config_maps,
        });
        if !wait_for_sync(&mut stop, ctl.config_maps.wait_synced()).await {
            return;
        }
        let tasks = run_workers_of(
            "root-ca-cert-publisher",
            queue,
            1,
            stop,
            &ctl,
            |c, key| async move { c.sync(&key).await },
        );
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down root CA cert publisher controller");
    })
}

impl Ctl {
    fn data(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("ca.crt".to_owned(), self.root_ca.clone())])
    }

    async fn sync(&self, ns: &str) -> Result<(), SyncError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.get(), ns);
        let Some(cm) = self.config_maps.get(&format!("{ns}/{CONFIG_MAP}")) else {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(CONFIG_MAP.into()),
                    namespace: Some(ns.into()),
                    annotations: Some(BTreeMap::from([(
                        DESCRIPTION_ANNOTATION.to_owned(),
                        DESCRIPTION.to_owned(),
                    )])),
                    ..Default::default()
                },
                data: Some(self.data()),
                ..Default::default()
            };
            return match api.create(&PostParams::default(), &cm).await {
                Ok(_) => Ok(()),
                // The namespace is gone or going: nothing to publish.
                Err(e) if is_not_found(&e) || namespace_terminating(&e) => Ok(()),
                Err(e) => Err(e.into()),
            };
        };
        let described = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DESCRIPTION_ANNOTATION))
            .is_some_and(|d| !d.is_empty());
        if cm.data.as_ref() == Some(&self.data()) && described {
            return Ok(());
        }
        let mut cm = (*cm).clone();
        cm.data = Some(self.data());
        cm.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(DESCRIPTION_ANNOTATION.into(), DESCRIPTION.into());
        api.replace(CONFIG_MAP, &PostParams::default(), &cm).await?;
        Ok(())
    }
}
