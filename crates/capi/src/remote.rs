//! Clients of workload clusters, from their `<cluster>-kubeconfig` Secrets (upstream's
//! ClusterCache): one per cluster, made again when the Secret changes.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use parking_lot::Mutex;

use crate::Error;

/// The kubeconfig Secret's name for cluster `name`.
pub fn kubeconfig_secret(cluster: &str) -> String {
    format!("{cluster}-kubeconfig")
}

pub struct Remote {
    client: kube::Client,
    /// `namespace/cluster` → the Secret's resourceVersion and the client made from it.
    cache: Mutex<HashMap<String, (String, kube::Client)>>,
}

impl Remote {
    pub fn new(client: kube::Client) -> Remote {
        Remote {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// A client of workload cluster `namespace/cluster`; None while it has no kubeconfig.
    pub async fn client(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<Option<kube::Client>, Error> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let Some(secret) = secrets.get_opt(&kubeconfig_secret(cluster)).await? else {
            return Ok(None);
        };
        let rv = secret.metadata.resource_version.clone().unwrap_or_default();
        let key = format!("{namespace}/{cluster}");
        if let Some((seen, c)) = self.cache.lock().get(&key) {
            if *seen == rv {
                return Ok(Some(c.clone()));
            }
        }
        let Some(value) = secret.data.as_ref().and_then(|d| d.get("value")) else {
            return Ok(None);
        };
        let text = String::from_utf8(value.0.clone()).map_err(|_| {
            Error::Invalid(format!("{namespace}/{cluster}-kubeconfig is not UTF-8"))
        })?;
        let kc = kube::config::Kubeconfig::from_yaml(&text)
            .map_err(|e| Error::Invalid(format!("{namespace}/{cluster}-kubeconfig: {e}")))?;
        let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| Error::Invalid(format!("{namespace}/{cluster}-kubeconfig: {e}")))?;
        cfg.connect_timeout = Some(std::time::Duration::from_secs(2));
        cfg.read_timeout = Some(std::time::Duration::from_secs(10));
        let c = kumo_client::transport::client(kumo_client::clients::as_client_go(cfg))?;
        self.cache.lock().insert(key, (rv, c.clone()));
        Ok(Some(c))
    }

    /// Forgets cluster `namespace/cluster` (deleted).
    pub fn forget(&self, namespace: &str, cluster: &str) {
        self.cache.lock().remove(&format!("{namespace}/{cluster}"));
    }
}
