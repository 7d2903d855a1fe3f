//! The kubeadm control-plane provider's controller: a KubeadmControlPlane makes its
//! cluster's certificates (`<cluster>-ca`, `-etcd`, `-proxy`, `-sa`) and the
//! `<cluster>-kubeconfig` Secret, and its control-plane Machines (each with a KubeadmConfig
//! from `spec.kubeadmConfigSpec` and an infrastructure machine cloned from
//! `spec.machineTemplate.spec.infrastructureRef`), the first running `kubeadm init`; it
//! reports the replicas, the version and whether the control plane is initialized and
//! available.
//!
//! Each control-plane machine runs a stacked etcd member (kubeadm's default), so the
//! replicas are odd, as upstream's validation wants: a new machine is created only once
//! every existing one is ready, and it joins with `kubeadm join --control-plane`.

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
    {
        // A machine this control plane created and its cache does not show yet: the
        // replica count read from the cache would be short by one.
        let mut expected = m.expected_machines.lock();
        if let Some((name, at)) = expected.get(key) {
            let seen = m
                .machines
                .list()
                .iter()
                .any(|x| x.namespace() == k.namespace() && x.name() == name);
            // A watch that lost it (or its deletion first) must not block forever.
            if seen || at.elapsed() > Duration::from_secs(30) {
                expected.remove(key);
            } else {
                return Err(SyncError::After(Duration::from_millis(200)));
            }
        }
    }
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
    // Remediation (upstream's reconcileUnhealthyMachines): one machine at a time, never
    // the last, and only while the others are ready, so the etcd quorum holds; the
    // machine leaves etcd before it goes, and scaling up replaces it.
    if let Some(x) = live
        .iter()
        .find(|x| crate::machineset::is_waiting_remediation(x))
    {
        let others_ready = live
            .iter()
            .filter(|y| y.name() != x.name())
            .all(|y| is_true(&y.status, "Ready"));
        let blocked = if have <= 1 {
            Some((
                "CannotBeRemediated",
                "KubeadmControlPlane can't remediate if current replicas are less or equal to 1",
            ))
        } else if !others_ready {
            Some(("RemediationDeferred", "KubeadmControlPlane waiting for control plane machine provisioning to complete before triggering remediation"))
        } else {
            None
        };
        if let Some((reason, message)) = blocked {
            let cs = [Condition::new("OwnerRemediated", false, reason).message(message)];
            let conditions = merge_conditions(&x.status, &cs, x.metadata.generation);
            m.patch_status(&**x, json!({"conditions": conditions}))
                .await?;
        } else {
            let cs = [Condition::new("OwnerRemediated", false, "MachineDeleting")
                .message("Machine is deleting")];
            let conditions = merge_conditions(&x.status, &cs, x.metadata.generation);
            m.patch_status(&**x, json!({"conditions": conditions}))
                .await?;
            remove_machine(m, &k, &cluster_name, x, "deleted by remediation").await?;
            return Err(SyncError::After(Duration::from_secs(1)));
        }
    }
    let mut scaling_up = Condition::new("ScalingUp", false, "NotScalingUp");
    if want % 2 == 0 {
        scaling_up = Condition::new("ScalingUp", false, "ScalingUpBlocked").message(format!(
            "spec.replicas is {want}: a control plane with stacked etcd has an odd number of replicas"
        ));
    } else if have < want && (have == 0 || (initialized && ready == have)) {
        let name = format!("{}-{}", k.name(), crate::random_suffix());
        create_machine(m, &k, &cluster, &cluster_name, &name, &machines).await?;
        m.expected_machines
            .lock()
            .insert(key.to_owned(), (name.clone(), std::time::Instant::now()));
        m.event(
            &*k,
            "Normal",
            "SuccessfulCreate",
            format!("Machine {name} created"),
        )
        .await;
        scaling_up = Condition::new("ScalingUp", true, "ScalingUp")
            .message(format!("Scaling up from {have} to {want} replicas"));
    } else if have < want {
        scaling_up = Condition::new("ScalingUp", true, "ScalingUp")
            .message(format!("Scaling up from {have} to {want} replicas"));
    }
    if have > want && initialized && ready == have {
        // Upstream's choice: the oldest machine of the failure domain with the most.
        let in_domain = |d: Option<&str>| {
            live.iter()
                .filter(|y| str_at(&y.spec, "/failureDomain") == d)
                .count()
        };
        if let Some(x) = live.iter().min_by_key(|x| {
            (
                std::cmp::Reverse(in_domain(str_at(&x.spec, "/failureDomain"))),
                x.metadata.creation_timestamp.clone().map(|t| t.0),
            )
        }) {
            remove_machine(m, &k, &cluster_name, x, "deleted").await?;
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

/// Deletes control-plane machine `x` once its member is out of the cluster's etcd
/// (nothing to remove for a machine that never got a node), with a `SuccessfulDelete`
/// event saying `Machine <name> <why>`.
async fn remove_machine(
    m: &Manager,
    k: &KubeadmControlPlane,
    cluster: &str,
    x: &Machine,
    why: &str,
) -> Result<(), SyncError> {
    let ns = k.namespace();
    if let Some(node) = str_at(&x.status, "/nodeRef/name") {
        if !crate::etcd::remove_member(m, ns, cluster, node).await? {
            return Err(SyncError::After(Duration::from_secs(1)));
        }
    }
    let _ = m
        .api::<MachineKind>(ns)
        .delete(x.name(), &DeleteParams::background())
        .await;
    m.event(
        k,
        "Normal",
        "SuccessfulDelete",
        format!("Machine {} {why}", x.name()),
    )
    .await;
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
    machines: &[std::sync::Arc<Machine>],
) -> Result<(), Error> {
    let init = machines.iter().all(|x| x.deleting());
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
    let failure_domain = pick_failure_domain(cluster, machines);
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

/// The control-plane failure domain with the fewest of this control plane's machines
/// (workers do not count: they spread on their own).
fn pick_failure_domain(cluster: &Cluster, machines: &[std::sync::Arc<Machine>]) -> Option<String> {
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
        machines
            .iter()
            .filter(|x| !x.deleting() && str_at(&x.spec, "/failureDomain") == Some(d))
            .count()
    };
    domains.into_iter().min_by_key(|d| used(d))
}
