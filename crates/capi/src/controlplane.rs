//! The kubeadm control-plane provider's controller: a KubeadmControlPlane makes its
//! cluster's certificates (`<cluster>-ca`, `-etcd`, `-proxy`, `-sa`) and the
//! `<cluster>-kubeconfig` Secret, and its control-plane Machines (each with a KubeadmConfig
//! from `spec.kubeadmConfigSpec` and an infrastructure machine cloned from
//! `spec.machineTemplate.spec.infrastructureRef`), the first running `kubeadm init`; it
//! reports the replicas, the version and whether the control plane is initialized and
//! available.
//!
//! One replica: kumo's control-plane machines keep the cluster's state in the API
//! server's embedded store, which a second control-plane machine cannot share (that
//! needs stacked etcd); more replicas are refused in the ScalingUp condition.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use kumo_client::worker::SyncError;
use serde_json::{json, Value};

use crate::object::*;
use crate::{
    certs, Error, Manager, CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, CONTROL_PLANE_NAME_LABEL,
    KCP_FINALIZER,
};

/// The most control-plane replicas a kumo workload cluster has (see the module docs).
pub const MAX_REPLICAS: i64 = 1;

pub async fn sync(m: &Manager, key: &str) -> Result<(), SyncError> {
    let Some(k) = m.control_planes.get(key) else {
        return Ok(());
    };
    let ns = k.namespace();
    let cluster_name = k.label(CLUSTER_NAME_LABEL).map(str::to_owned).or_else(|| {
        k.controller_of_kind::<ClusterKind>()
            .map(|o| o.name.clone())
    });
    let machines = Manager::controlled_by(m.machines.list(), &*k);
    if k.deleting() {
        return m.delete_children(&*k, &machines, KCP_FINALIZER).await;
    }
    let Some(cluster_name) = cluster_name else {
        // The Cluster controller labels and owns its control plane.
        return Err(SyncError::After(Duration::from_secs(1)));
    };
    if m.add_finalizer(&*k, KCP_FINALIZER).await? {
        return Ok(());
    }
    let Some(cluster) = m.clusters.get(&format!("{ns}/{cluster_name}")) else {
        return Err(SyncError::After(Duration::from_secs(1)));
    };
    let host = str_at(&cluster.spec, "/controlPlaneEndpoint/host").unwrap_or_default();
    let port = cluster
        .spec
        .pointer("/controlPlaneEndpoint/port")
        .and_then(Value::as_i64)
        .unwrap_or(6443);
    if !bool_at(&cluster.status, "/initialization/infrastructureProvisioned") || host.is_empty() {
        let conditions = [Condition::new("Available", false, "NotAvailable")
            .message("Waiting for the cluster's infrastructure and control-plane endpoint")];
        let status =
            json!({"conditions": merge_conditions(&k.status, &conditions, k.metadata.generation)});
        m.patch_status(&*k, status).await?;
        return Err(SyncError::After(Duration::from_secs(1)));
    }
    let pairs =
        certs::lookup_or_generate(&m.client, ns, &cluster_name, Some(k.owner_ref())).await?;
    ensure_kubeconfig(
        m,
        &k,
        &cluster_name,
        &format!("https://{host}:{port}"),
        &pairs,
    )
    .await?;

    let want = k.spec.get("replicas").and_then(Value::as_i64).unwrap_or(1);
    let live: Vec<_> = machines.iter().filter(|x| !x.deleting()).collect();
    let have = live.len() as i64;
    let ready = live.iter().filter(|x| is_true(&x.status, "Ready")).count() as i64;
    // Initialized once the workload cluster's API answers (upstream: once kubeadm init
    // has left its kubeadm-config ConfigMap there).
    let mut initialized = bool_at(&k.status, "/initialization/controlPlaneInitialized");
    if !initialized && have > 0 {
        if let Ok(Some(remote)) = m.remote.client(ns, &cluster_name).await {
            let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(remote);
            initialized = nss.get_opt("kube-system").await.ok().flatten().is_some();
        }
    }
    let mut scaling_up = Condition::new("ScalingUp", false, "NotScalingUp");
    if have < want.min(MAX_REPLICAS) && (have == 0 || (initialized && ready == have)) {
        let name = format!("{}-{}", k.name(), crate::random_suffix());
        create_machine(m, &k, &cluster, &cluster_name, &name, have == 0).await?;
        m.event(
            &*k,
            "Normal",
            "SuccessfulCreate",
            format!("Machine {name} created"),
        )
        .await;
        scaling_up = Condition::new("ScalingUp", true, "ScalingUp")
            .message(format!("Scaling up from {have} to {want} replicas"));
    } else if want > MAX_REPLICAS {
        scaling_up = Condition::new("ScalingUp", false, "ScalingUpBlocked").message(format!(
            "kumo's control planes keep their state in the API server's embedded store: at most {MAX_REPLICAS} replica (spec.replicas is {want})"
        ));
    } else if have < want {
        scaling_up = Condition::new("ScalingUp", true, "ScalingUp")
            .message(format!("Scaling up from {have} to {want} replicas"));
    }
    if have > want {
        if let Some(x) = live
            .iter()
            .max_by_key(|x| x.metadata.creation_timestamp.clone().map(|t| t.0))
        {
            let _ = m
                .api::<MachineKind>(ns)
                .delete(x.name(), &DeleteParams::background())
                .await;
        }
    }
    let available = initialized && ready > 0;
    let mut conditions = vec![
        Condition::new("Deleting", false, "NotDeleting"),
        Condition::new("Paused", false, "NotPaused"),
        Condition::new("CertificatesAvailable", true, "Available"),
        if initialized {
            Condition::new("Initialized", true, "Initialized")
        } else {
            Condition::new("Initialized", false, "NotInitialized")
                .message("Control plane not yet initialized")
        },
        if available {
            Condition::new("Available", true, "Available")
        } else {
            Condition::new("Available", false, "NotAvailable")
                .message("There are no healthy control plane Machines yet")
        },
        scaling_up,
        Condition::new("MachinesUpToDate", true, "UpToDate"),
    ];
    // ScalingDown and MachinesReady as every set of replicas reports them; ScalingUp above.
    conditions.extend(
        crate::scaling_conditions(have, want, ready)
            .into_iter()
            .filter(|c| c.type_ != "ScalingUp"),
    );
    let version = k.spec.get("version").cloned().unwrap_or(Value::Null);
    let status = json!({
        "replicas": have, "readyReplicas": ready, "availableReplicas": ready, "upToDateReplicas": have,
        "version": version,
        "selector": format!("{CLUSTER_NAME_LABEL}={cluster_name},{CONTROL_PLANE_LABEL}"),
        "initialization": {"controlPlaneInitialized": initialized},
        "observedGeneration": k.metadata.generation,
        "conditions": merge_conditions(&k.status, &conditions, k.metadata.generation),
    });
    m.patch_status(&*k, status).await?;
    if !available {
        return Err(SyncError::After(Duration::from_secs(1)));
    }
    Ok(())
}

/// The `<cluster>-kubeconfig` Secret, made once (owned by the control plane).
async fn ensure_kubeconfig(
    m: &Manager,
    k: &KubeadmControlPlane,
    cluster: &str,
    server: &str,
    pairs: &[certs::Pair],
) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(m.client.clone(), k.namespace());
    let name = crate::remote::kubeconfig_secret(cluster);
    if secrets.get_opt(&name).await?.is_some() {
        return Ok(());
    }
    let ca = pairs
        .iter()
        .find(|p| p.purpose.suffix == certs::CLUSTER_CA.suffix)
        .ok_or_else(|| Error::Invalid("the cluster has no CA".into()))?;
    let text = certs::admin_kubeconfig(cluster, server, ca)?;
    let s = certs::cluster_secret(
        k.namespace(),
        &name,
        cluster,
        Some(k.owner_ref()),
        vec![("value", text.into_bytes())],
    );
    match secrets.create(&PostParams::default(), &s).await {
        Ok(_) => Ok(()),
        Err(e) if kumo_client::error::is_already_exists(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A control-plane Machine with its KubeadmConfig (`init`: the first one) and cloned
/// infrastructure machine, in the control-plane failure domain with the fewest machines.
async fn create_machine(
    m: &Manager,
    k: &KubeadmControlPlane,
    cluster: &Cluster,
    cluster_name: &str,
    name: &str,
    init: bool,
) -> Result<(), Error> {
    let ns = k.namespace();
    let labels = BTreeMap::from([
        (CLUSTER_NAME_LABEL.to_owned(), cluster_name.to_owned()),
        (CONTROL_PLANE_LABEL.to_owned(), String::new()),
        (CONTROL_PLANE_NAME_LABEL.to_owned(), k.name().to_owned()),
    ]);
    let mut config_spec = k
        .spec
        .get("kubeadmConfigSpec")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if let Some(o) = config_spec.as_object_mut() {
        if init {
            o.remove("joinConfiguration");
        } else {
            o.remove("initConfiguration");
            let join = o.entry("joinConfiguration").or_insert_with(|| json!({}));
            if join.get("controlPlane").is_none() {
                join["controlPlane"] = json!({});
            }
        }
    }
    let mut cfg = KubeadmConfig::new(ns, name, config_spec);
    cfg.metadata.labels = Some(labels.clone());
    cfg.metadata.owner_references = Some(vec![k.owner_ref()]);
    match m
        .api::<KubeadmConfigKind>(ns)
        .create(&PostParams::default(), &cfg)
        .await
    {
        Ok(_) => {}
        Err(e) if kumo_client::error::is_already_exists(&e) => {}
        Err(e) => return Err(e.into()),
    }
    let infra_template = k
        .spec
        .pointer("/machineTemplate/spec/infrastructureRef")
        .cloned()
        .ok_or_else(|| {
            Error::Invalid("spec.machineTemplate.spec.infrastructureRef is not set".into())
        })?;
    let infra = m
        .refs
        .clone_template(ns, &infra_template, name, &labels, k.owner_ref())
        .await?;
    let failure_domain = pick_failure_domain(m, cluster, ns, cluster_name);
    let mut spec = json!({
        "clusterName": cluster_name,
        "version": k.spec.get("version").cloned().unwrap_or(Value::Null),
        "bootstrap": {"configRef": cfg.contract_ref()},
        "infrastructureRef": infra,
    });
    if let Some(fd) = failure_domain {
        spec["failureDomain"] = fd.into();
    }
    let mut x = Machine::new(ns, name, spec);
    x.metadata.labels = Some(labels);
    x.metadata.owner_references = Some(vec![k.owner_ref()]);
    match m
        .api::<MachineKind>(ns)
        .create(&PostParams::default(), &x)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if kumo_client::error::is_already_exists(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn pick_failure_domain(
    m: &Manager,
    cluster: &Cluster,
    ns: &str,
    cluster_name: &str,
) -> Option<String> {
    let domains: Vec<String> = cluster
        .status
        .get("failureDomains")
        .and_then(Value::as_array)?
        .iter()
        .filter(|d| {
            d.get("controlPlane")
                .and_then(Value::as_bool)
                .unwrap_or(false)
        })
        .filter_map(|d| d.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect();
    let used = |d: &str| {
        m.machines
            .list()
            .iter()
            .filter(|x| {
                x.namespace() == ns
                    && x.cluster_name() == Some(cluster_name)
                    && str_at(&x.spec, "/failureDomain") == Some(d)
            })
            .count()
    };
    domains.into_iter().min_by_key(|d| used(d))
}
