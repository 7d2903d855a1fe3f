//! The workload cluster's stacked etcd as the KubeadmControlPlane controller reaches it
//! (upstream's etcd client of a workload cluster): the members' client URLs come from the
//! annotations of the cluster's etcd pods, the client certificate is issued in memory from
//! the cluster's etcd CA (`<cluster>-etcd`). A control-plane machine leaves the etcd
//! cluster before it is deleted, so the members left keep their quorum.
//!
//! Upstream dials the etcd pods through the workload API server's port-forward; kumo's
//! control-plane machines serve their members on this host's loopback, where the
//! annotations point. A cluster whose machines show no etcd pods (kumo's real runtime,
//! whose kubelets run no static pods) has its members found by the process that boots
//! the machines ([`Members`]), by each control-plane Machine's provider ID.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::object::str_at;
use crate::{certs, Error, Manager, CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL};

/// The annotation kubeadm puts on each etcd pod.
const CLIENT_URLS: &str = "kubeadm.kubernetes.io/etcd.advertise-client-urls";

fn etcd_err(e: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("etcd: {e}"))
}

/// Where the members of clusters that show no etcd pods serve, as the machines' host
/// knows them.
pub trait Members: Send + Sync {
    /// The client URL of the member on the machine with provider ID `provider_id`.
    fn client_url(&self, provider_id: &str) -> Option<String>;
}

/// The client URLs of cluster `ns/cluster`'s members other than the one on node `leaving`,
/// by its control-plane Machines' provider IDs.
fn located(
    m: &Manager,
    members: &dyn Members,
    ns: &str,
    cluster: &str,
    leaving: &str,
) -> Vec<String> {
    m.machines
        .list()
        .iter()
        .filter(|x| x.namespace() == ns && x.label(CLUSTER_NAME_LABEL) == Some(cluster))
        .filter(|x| x.label(CONTROL_PLANE_LABEL).is_some())
        .filter(|x| str_at(&x.status, "/nodeRef/name") != Some(leaving))
        .filter_map(|x| members.client_url(str_at(&x.spec, "/providerID")?))
        .collect()
}

/// A client of workload cluster `ns/cluster`'s etcd through the members other than
/// `leaving` (a node name); None while the cluster has no etcd pods to ask.
async fn client(
    m: &Manager,
    ns: &str,
    cluster: &str,
    leaving: &str,
) -> Result<Option<etcd_client::Client>, Error> {
    let Some(remote) = m.remote.client(ns, cluster).await? else {
        return Ok(None);
    };
    let pods: Api<Pod> = Api::namespaced(remote, "kube-system");
    let list = pods
        .list(&ListParams::default().labels("component=etcd,tier=control-plane"))
        .await?;
    let mut endpoints: Vec<String> = list
        .items
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(leaving))
        .filter_map(|p| p.metadata.annotations.as_ref()?.get(CLIENT_URLS).cloned())
        .collect();
    if endpoints.is_empty() {
        if let Some(members) = &m.etcd_members {
            endpoints = located(m, members.as_ref(), ns, cluster, leaving);
        }
    }
    if endpoints.is_empty() {
        return Ok(None);
    }
    let pairs = certs::lookup_or_generate(&m.client, ns, cluster, None).await?;
    let ca = pairs
        .iter()
        .find(|p| p.purpose.suffix == certs::ETCD_CA.suffix)
        .ok_or_else(|| Error::NotFound(format!("{ns}/{cluster}-etcd")))?;
    let issuer = kumo_apiserver::pki::Ca::from_pem("etcd/ca", &ca.cert, &ca.key)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let leaf = issuer
        .issue_client("cluster-api.x-k8s.io", &[])
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(ca.cert.clone()))
        .identity(etcd_client::Identity::from_pem(leaf.cert_pem, leaf.key_pem));
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        .with_tls(tls);
    // The first member that answers: the pods may still include members that are gone
    // (mirror pods of deleted nodes wait for the pod garbage collector).
    let mut last = None;
    for e in endpoints {
        match etcd_client::Client::connect([e.as_str()], Some(options.clone())).await {
            Ok(mut c) => match c.status().await {
                Ok(_) => return Ok(Some(c)),
                Err(err) => last = Some(err),
            },
            Err(err) => last = Some(err),
        }
    }
    Err(etcd_err(last.map_or_else(
        || "no member answers".to_owned(),
        |e| e.to_string(),
    )))
}

/// Removes node `node`'s member from cluster `ns/cluster`'s etcd; whether it is gone
/// (false: the cluster's etcd could not be asked yet).
pub async fn remove_member(
    m: &Manager,
    ns: &str,
    cluster: &str,
    node: &str,
) -> Result<bool, Error> {
    let Some(mut c) = client(m, ns, cluster, node).await? else {
        return Ok(false);
    };
    let list = c.member_list().await.map_err(etcd_err)?;
    for member in list.members() {
        if member.name() == node {
            c.member_remove(member.id()).await.map_err(etcd_err)?;
            tracing::info!(cluster, node, "etcd member removed");
        }
    }
    Ok(true)
}

/// How many of cluster `ns/cluster`'s etcd members are voting members (None while its
/// etcd cannot be asked).
pub async fn voting_members(m: &Manager, ns: &str, cluster: &str) -> Result<Option<usize>, Error> {
    let Some(mut c) = client(m, ns, cluster, "").await? else {
        return Ok(None);
    };
    let list = c.member_list().await.map_err(etcd_err)?;
    Ok(Some(
        list.members().iter().filter(|m| !m.is_learner()).count(),
    ))
}
