//! The management side of `kumo up --cluster-api`: Cluster API's CRDs and controllers
//! (`kumo-capi`) and the kumo cloud's infrastructure provider (`kumo-capk`) installed as
//! `clusterctl init --infrastructure kumo` would, each manager an API client with an
//! identity and ClusterRole of its own; the provider with a cloud access key of its own.
//! The workload clusters' machines boot on this host's hypervisor ([`crate::kubeadm`]).
//!
//! [`LoopbackPublisher`] publishes the control-plane load balancers on loopback: a port
//! of 127.0.0.1 whose connections go to a healthy target of the load balancer, the
//! target's API server found on this host (the VIPs are never routed from it).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use tokio::sync::watch;

/// Installs Cluster API and the kumo provider and starts their managers (they run as
/// long as the process).
pub async fn start(
    data_dir: &Path,
    cloud_dir: &Path,
    cloud: &kumo_cloud::Client,
    admin: &kube::Client,
    server: &str,
    tenants: Arc<crate::kubeadm::Tenants>,
) -> Result<()> {
    kumo_capi::crds::install(admin)
        .await
        .context("installing Cluster API")?;
    kumo_capk::install(admin)
        .await
        .context("installing the kumo infrastructure provider")?;
    let capi_kc = kumo_apiserver::pki::user_kubeconfig(
        data_dir,
        "cluster-api.conf",
        kumo_capi::crds::MANAGER_USER,
        server,
    )?;
    let capk_kc = kumo_apiserver::pki::user_kubeconfig(
        data_dir,
        "cluster-api-provider-kumo.conf",
        kumo_capk::MANAGER_USER,
        server,
    )?;
    let capi_client = crate::hypervisor::kube_client(&capi_kc).await?;
    let capk_client = crate::hypervisor::kube_client(&capk_kc).await?;
    let (provider_cloud, _) = crate::cluster::cloud_credentials(
        cloud_dir,
        cloud,
        &data_dir.join("cluster-api-provider-kumo.cloud.json"),
        "cluster-api-provider-kumo",
    )
    .await?;
    let (stop_tx, stop) = watch::channel(false);
    // They run as long as the process.
    std::mem::forget(stop_tx);
    // The members of clusters on real machines show no etcd pods; the machines' host
    // tells where they serve.
    let members: Arc<dyn kumo_capi::etcd::Members> = tenants.clone();
    let manager = kumo_capi::Manager::start_with(capi_client, stop.clone(), Some(members));
    std::mem::forget(manager);
    let publisher = Arc::new(LoopbackPublisher {
        cloud: provider_cloud.clone(),
        tenants,
        published: Mutex::new(HashMap::new()),
    });
    kumo_capk::start(capk_client, provider_cloud, publisher, stop);
    Ok(())
}

/// Load balancers published on 127.0.0.1 (see the module documentation).
pub struct LoopbackPublisher {
    cloud: kumo_cloud::Client,
    tenants: Arc<crate::kubeadm::Tenants>,
    published: Mutex<HashMap<String, (SocketAddr, tokio::task::JoinHandle<()>)>>,
}

#[async_trait::async_trait]
impl kumo_capk::Publisher for LoopbackPublisher {
    async fn publish(
        &self,
        lb: &str,
        port: u16,
        preferred: Option<u16>,
    ) -> Result<SocketAddr, String> {
        if let Some((addr, _)) = self
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(lb)
        {
            return Ok(*addr);
        }
        let listener = match preferred {
            Some(p) => match tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, p)).await {
                Ok(l) => l,
                Err(_) => tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                    .await
                    .map_err(|e| e.to_string())?,
            },
            None => tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .map_err(|e| e.to_string())?,
        };
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (cloud, tenants, name) = (self.cloud.clone(), self.tenants.clone(), lb.to_owned());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    continue;
                };
                let (cloud, tenants, name) = (cloud.clone(), tenants.clone(), name.clone());
                tokio::spawn(async move {
                    let Some(to) = target(&cloud, &tenants, &name, port).await else {
                        // No healthy target: the connection is refused, as by the VIP.
                        return;
                    };
                    if let Ok(mut up) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                    }
                });
            }
        });
        self.published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lb.to_owned(), (addr, task));
        tracing::info!(load_balancer = %lb, %addr, "load balancer published on loopback");
        Ok(addr)
    }

    async fn unpublish(&self, lb: &str) {
        if let Some((_, task)) = self
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(lb)
        {
            task.abort();
        }
    }
}

/// A healthy target of load balancer `name` whose API server runs on this host, chosen
/// at random as the cloud's load balancers choose.
async fn target(
    cloud: &kumo_cloud::Client,
    tenants: &crate::kubeadm::Tenants,
    name: &str,
    port: u16,
) -> Option<SocketAddr> {
    let lb = cloud.find_load_balancer(name).await.ok()??;
    if !lb.listeners.iter().any(|l| l.port == port) {
        return None;
    }
    let up: Vec<SocketAddr> = lb
        .targets
        .iter()
        .filter(|t| t.health == kumo_cloud::TargetHealthState::Healthy)
        .filter_map(|t| tenants.api_address(&t.instance_id))
        .collect();
    if up.is_empty() {
        return None;
    }
    Some(up[rand::random_range(0..up.len())])
}
