//! The kubeadm bootstrap provider's controller: a KubeadmConfig owned by a Machine gets its
//! bootstrap data Secret (same name, type `cluster.x-k8s.io/secret`, keys `value` and
//! `format`) once the Cluster's infrastructure is ready: `kubeadm init` for the first
//! control-plane machine, `kubeadm join` with a bootstrap token made in the workload
//! cluster for the others once the control plane is initialized.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kumo_client::worker::SyncError;
use serde_json::{json, Value};

use crate::kubeadm::{self, ClusterFacts};
use crate::object::*;
use crate::{certs, Error, Manager};

/// How long a join token lives (upstream's default `--bootstrap-token-ttl`, 15 minutes).
const TOKEN_TTL_SECS: i64 = 15 * 60;

pub async fn sync(m: &Manager, key: &str) -> Result<(), SyncError> {
    let Some(cfg) = m.configs.get(key) else {
        return Ok(());
    };
    if cfg.deleting() {
        return Ok(());
    }
    if cfg.status.get("dataSecretName").is_some() {
        return Ok(());
    }
    let ns = cfg.namespace();
    let Some(owner) = cfg.controller_of_kind::<MachineKind>() else {
        return set_waiting(
            m,
            &cfg,
            "WaitingForMachine",
            "Waiting for a Machine to own this KubeadmConfig",
        )
        .await;
    };
    let Some(machine) = m.machines.get(&format!("{ns}/{}", owner.name)) else {
        return Err(SyncError::After(Duration::from_secs(1)));
    };
    let cluster_name = machine.cluster_name().unwrap_or_default().to_owned();
    let Some(cluster) = m.clusters.get(&format!("{ns}/{cluster_name}")) else {
        return set_waiting(
            m,
            &cfg,
            "WaitingForClusterInfrastructureReady",
            "Waiting for the Cluster",
        )
        .await;
    };
    if !bool_at(&cluster.status, "/initialization/infrastructureProvisioned") {
        return set_waiting(
            m,
            &cfg,
            "WaitingForClusterInfrastructureReady",
            "Waiting for Cluster status.initialization.infrastructureProvisioned to be true",
        )
        .await;
    }
    let host = str_at(&cluster.spec, "/controlPlaneEndpoint/host").unwrap_or_default();
    let port = cluster
        .spec
        .pointer("/controlPlaneEndpoint/port")
        .and_then(Value::as_i64)
        .unwrap_or(6443);
    if host.is_empty() {
        return set_waiting(
            m,
            &cfg,
            "WaitingForClusterInfrastructureReady",
            "Waiting for Cluster spec.controlPlaneEndpoint",
        )
        .await;
    }
    let facts = ClusterFacts {
        name: cluster_name.clone(),
        endpoint: format!("{host}:{port}"),
        version: str_at(&machine.spec, "/version")
            .unwrap_or("v1.37.2")
            .to_owned(),
        pod_cidr: cluster
            .spec
            .pointer("/clusterNetwork/pods/cidrBlocks/0")
            .and_then(Value::as_str)
            .map(str::to_owned),
        service_cidr: cluster
            .spec
            .pointer("/clusterNetwork/services/cidrBlocks/0")
            .and_then(Value::as_str)
            .map(str::to_owned),
        dns_domain: str_at(&cluster.spec, "/clusterNetwork/serviceDomain").map(str::to_owned),
    };
    let control_plane = machine.label(crate::CONTROL_PLANE_LABEL).is_some();
    let initialized = bool_at(&cluster.status, "/initialization/controlPlaneInitialized");
    let is_init = control_plane
        && !initialized
        && (cfg.spec.get("initConfiguration").is_some()
            || cfg.spec.get("clusterConfiguration").is_some());
    let data = if is_init {
        let pairs = certs::lookup_or_generate(&m.client, ns, &cluster_name, None).await?;
        kubeadm::init_data(&cfg.spec, &facts, &pairs)
    } else {
        if !initialized {
            return set_waiting(
                m,
                &cfg,
                "WaitingForControlPlaneInitialized",
                "Waiting for Cluster status.initialization.controlPlaneInitialized to be true",
            )
            .await;
        }
        let Some(remote) = m.remote.client(ns, &cluster_name).await? else {
            return Err(SyncError::After(Duration::from_secs(1)));
        };
        let token = create_token(&remote).await?;
        let pairs = certs::lookup_or_generate(&m.client, ns, &cluster_name, None).await?;
        let ca = pairs
            .iter()
            .find(|p| p.purpose.suffix == certs::CLUSTER_CA.suffix)
            .ok_or_else(|| Error::Invalid("the cluster has no CA".into()))?;
        let hash = certs::ca_cert_hash(&ca.cert)?;
        let cp_certs = (control_plane
            && cfg
                .spec
                .pointer("/joinConfiguration/controlPlane")
                .is_some())
        .then_some(pairs.as_slice());
        kubeadm::join_data(&cfg.spec, &facts, &token, &hash, cp_certs)
    };
    let secret = certs::cluster_secret(
        ns,
        cfg.name(),
        &cluster_name,
        Some(cfg.owner_ref()),
        vec![
            ("value", data.into_bytes()),
            ("format", b"cloud-config".to_vec()),
        ],
    );
    let secrets: Api<Secret> = Api::namespaced(m.client.clone(), ns);
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {}
        Err(e) if kumo_client::error::is_already_exists(&e) => {}
        Err(e) => return Err(Error::from(e).into()),
    }
    let conditions = [
        Condition::new("Ready", true, "Ready"),
        Condition::new("DataSecretAvailable", true, "Available"),
        Condition::new("CertificatesAvailable", true, "Available"),
        Condition::new("Paused", false, "NotPaused"),
    ];
    let status = json!({
        "dataSecretName": cfg.name(),
        "initialization": {"dataSecretCreated": true},
        "observedGeneration": cfg.metadata.generation,
        "conditions": merge_conditions(&cfg.status, &conditions, cfg.metadata.generation),
    });
    m.patch_status(&*cfg, status).await?;
    Ok(())
}

async fn set_waiting(
    m: &Manager,
    cfg: &KubeadmConfig,
    reason: &'static str,
    msg: &str,
) -> Result<(), SyncError> {
    let conditions = [
        Condition::new("Ready", false, "NotReady"),
        Condition::new("DataSecretAvailable", false, reason).message(msg),
        Condition::new("Paused", false, "NotPaused"),
    ];
    let status = json!({
        "initialization": {"dataSecretCreated": false},
        "observedGeneration": cfg.metadata.generation,
        "conditions": merge_conditions(&cfg.status, &conditions, cfg.metadata.generation),
    });
    m.patch_status(cfg, status).await?;
    Err(SyncError::After(Duration::from_secs(1)))
}

/// A bootstrap token in the workload cluster (kube-system/bootstrap-token-<id>) that
/// kubelets join with, for authentication and signing.
async fn create_token(remote: &kube::Client) -> Result<String, Error> {
    let (id, secret) = kubeadm::new_token();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    let expiration =
        kumo_apimachinery::time::format_rfc3339(now + TOKEN_TTL_SECS).unwrap_or_default();
    let s = kubeadm::bootstrap_token_secret(
        &id,
        &secret,
        "token generated by cluster-api-bootstrap-provider-kubeadm",
        &expiration,
    );
    let api: Api<Secret> = Api::namespaced(remote.clone(), "kube-system");
    api.create(&PostParams::default(), &s).await?;
    Ok(format!("{id}.{secret}"))
}
