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
            if !remove_machine(m, &k, &cluster_name, x, "deleted by remediation").await? {
                return Err(SyncError::After(Duration::from_secs(1)));
            }
            return Err(SyncError::After(Duration::from_secs(1)));
        }
    }
    // Which machines differ from what the control plane asks for now; each machine's
    // UpToDate condition says why (KCP owns that condition for its machines).
    let mut outdated = Vec::new();
    for x in &live {
        let why = not_up_to_date(m, &k, x).await?;
        m.set_conditions(&***x, &[up_to_date_condition(x, &why)])
            .await?;
        if !why.is_empty() {
            outdated.push(*x);
        }
    }
    let surge = max_surge(&k.spec);
    // A rollout (upstream's rollingUpdate): one new machine beside the others while fewer
    // than replicas + maxSurge exist, then an outdated one goes; repeat until none is left.
    let rolling = !outdated.is_empty() && want % 2 == 1;
    let mut scaling_up = Condition::new("ScalingUp", false, "NotScalingUp");
    if want % 2 == 0 {
        scaling_up = Condition::new("ScalingUp", false, "ScalingUpBlocked").message(format!(
            "spec.replicas is {want}: a control plane with stacked etcd has an odd number of replicas"
        ));
    } else if (have < want || (rolling && have < want + surge))
        && (have == 0 || (initialized && ready == have))
    {
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
        if have < want {
            scaling_up = Condition::new("ScalingUp", true, "ScalingUp")
                .message(format!("Scaling up from {have} to {want} replicas"));
        }
    } else if have < want {
        scaling_up = Condition::new("ScalingUp", true, "ScalingUp")
            .message(format!("Scaling up from {have} to {want} replicas"));
    }
    // Whether a machine that should go waits for the cluster's etcd to be asked.
    let mut etcd_blocked = false;
    if (have > want || (rolling && have >= want + surge)) && initialized && ready == have {
        // Upstream's choice: an outdated machine if there is one, the oldest of the
        // failure domain with the most.
        let in_domain = |d: Option<&str>| {
            live.iter()
                .filter(|y| str_at(&y.spec, "/failureDomain") == d)
                .count()
        };
        let candidates = if outdated.is_empty() {
            &live
        } else {
            &outdated
        };
        if let Some(x) = candidates.iter().min_by_key(|x| {
            (
                std::cmp::Reverse(in_domain(str_at(&x.spec, "/failureDomain"))),
                x.metadata.creation_timestamp.clone().map(|t| t.0),
            )
        }) {
            etcd_blocked = !remove_machine(m, &k, &cluster_name, x, "deleted").await?;
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
        machines_up_to_date(&live),
        crate::rolling_out(live.iter().map(|x| &***x)),
    ];
    // ScalingDown and MachinesReady as every set of replicas reports them; ScalingUp above.
    conditions.extend(
        crate::scaling_conditions(have, want, ready)
            .into_iter()
            .filter(|c| c.type_ != "ScalingUp")
            .map(|c| {
                // Upstream's preflight check on etcd, worded as its message.
                if c.type_ == "ScalingDown" && have > want && etcd_blocked {
                    c.message(format!(
                        "Scaling down from {have} to {want} replicas is blocked because:\n* waiting for etcd cluster to become healthy"
                    ))
                } else {
                    c
                }
            }),
    );
    let version = k.spec.get("version").cloned().unwrap_or(Value::Null);
    let status = json!({
        "replicas": have, "readyReplicas": ready, "availableReplicas": ready,
        "upToDateReplicas": live.iter().filter(|x| is_true(&x.status, "UpToDate")).count(),
        "version": version,
        "selector": format!("{CLUSTER_NAME_LABEL}={cluster_name},{CONTROL_PLANE_LABEL}"),
        "initialization": {"controlPlaneInitialized": initialized},
        "observedGeneration": k.metadata.generation,
        "conditions": merge_conditions(&k.status, &conditions, k.metadata.generation),
    });
    m.patch_status(&*k, status).await?;
    if !available || etcd_blocked {
        return Err(SyncError::After(Duration::from_secs(1)));
    }
    Ok(())
}

/// Deletes control-plane machine `x` once its member is out of the cluster's etcd
/// (nothing to remove for a machine that never got a node), with a `SuccessfulDelete`
/// event saying `Machine <name> <why>`; false (nothing deleted) while the cluster's etcd
/// cannot be asked.
async fn remove_machine(
    m: &Manager,
    k: &KubeadmControlPlane,
    cluster: &str,
    x: &Machine,
    why: &str,
) -> Result<bool, SyncError> {
    let ns = k.namespace();
    if let Some(node) = str_at(&x.status, "/nodeRef/name") {
        if !crate::etcd::remove_member(m, ns, cluster, node).await? {
            return Ok(false);
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
    Ok(true)
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

/// `spec.rollout.strategy.rollingUpdate.maxSurge` (1 by default; upstream allows 0 or 1).
fn max_surge(spec: &Value) -> i64 {
    spec.pointer("/rollout/strategy/rollingUpdate/maxSurge")
        .and_then(Value::as_i64)
        .unwrap_or(1)
        .clamp(0, 1)
}

/// Why control-plane machine `x` differs from what `k` asks for now, as upstream's
/// UpToDate condition lists it (without the leading "* "): `spec.rollout.after` passed
/// since it was made, another version, another KubeadmConfig, an infrastructure machine
/// cloned from another template. Empty: it is up to date.
async fn not_up_to_date(
    m: &Manager,
    k: &KubeadmControlPlane,
    x: &Machine,
) -> Result<Vec<String>, Error> {
    let mut why = Vec::new();
    let after = str_at(&k.spec, "/rollout/after").and_then(kumo_apimachinery::time::parse_rfc3339);
    let created = x
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    if let (Some(after), Some(created)) = (after, created) {
        if after <= now && created < after {
            why.push("KubeadmControlPlane spec.rolloutAfter expired".to_owned());
        }
    }
    let want = str_at(&k.spec, "/version").unwrap_or_default();
    let have = str_at(&x.spec, "/version").unwrap_or_default();
    if want != have {
        why.push(format!("Version {have}, {want} required"));
    }
    let ns = k.namespace();
    if let Some(name) = str_at(&x.spec, "/bootstrap/configRef/name") {
        if let Some(cfg) = m.configs.get(&format!("{ns}/{name}")) {
            let desired = k.spec.get("kubeadmConfigSpec").cloned().unwrap_or_default();
            if config_facts(&cfg.spec) != config_facts(&desired) {
                why.push("KubeadmConfig is not up-to-date".to_owned());
            }
        }
    }
    if let Some(infra) = x.spec.get("infrastructureRef") {
        if let Some(obj) = m.refs.get(ns, infra).await? {
            let annotations = obj.metadata.annotations.unwrap_or_default();
            let template = k.spec.pointer("/machineTemplate/spec/infrastructureRef");
            let field = |k: &str| {
                template
                    .and_then(|t| t.get(k))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            };
            let group_kind = format!("{}.{}", field("kind"), field("apiGroup"));
            // Machines without the annotations (adopted ones) are not compared, as upstream.
            if let (Some(n), Some(gk)) = (
                annotations.get(crate::CLONED_FROM_NAME),
                annotations.get(crate::CLONED_FROM_GROUPKIND),
            ) {
                if n != field("name") || *gk != group_kind {
                    let kind = str_at(infra, "/kind").unwrap_or("InfrastructureMachine");
                    why.push(format!("{kind} is not up-to-date"));
                }
            }
        }
    }
    Ok(why)
}

/// What of a KubeadmConfigSpec makes a machine: everything but the init and join
/// configurations, which differ by design between the first machine and the others.
fn config_facts(spec: &Value) -> Value {
    let mut v = spec.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("initConfiguration");
        o.remove("joinConfiguration");
    }
    v
}

/// A control-plane machine's UpToDate condition: the reasons it is outdated, or a node
/// whose kubelet runs another version than the machine asks for (upstream's Updating).
fn up_to_date_condition(x: &Machine, why: &[String]) -> Condition {
    if !why.is_empty() {
        let lines: Vec<String> = why.iter().map(|w| format!("* {w}")).collect();
        return Condition::new("UpToDate", false, "NotUpToDate").message(lines.join("\n"));
    }
    let kubelet = str_at(&x.status, "/nodeInfo/kubeletVersion").unwrap_or_default();
    let version = str_at(&x.spec, "/version").unwrap_or_default();
    // Compared without pre-release or build suffixes: kumo's kubelet says it is
    // `v1.37.2-kumo`, Kubernetes v1.37.2 built by kumo, as vendors' builds do.
    let core = |v: &str| v.split(['-', '+']).next().unwrap_or_default().to_owned();
    if !kubelet.is_empty() && !version.is_empty() && core(kubelet) != core(version) {
        return Condition::new("UpToDate", false, "Updating").message(format!(
            "* Node.status.nodeInfo.kubeletVersion {kubelet}, {version} required"
        ));
    }
    Condition::new("UpToDate", true, "UpToDate")
}

/// KCP's MachinesUpToDate: its machines' UpToDate conditions aggregated (those that are
/// not, grouped by what they say, as upstream's aggregate messages).
fn machines_up_to_date(live: &[&std::sync::Arc<Machine>]) -> Condition {
    if live.is_empty() {
        return Condition::new("MachinesUpToDate", true, "NoReplicas");
    }
    let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for x in live {
        if let Some(c) = condition_of(&x.status, "UpToDate") {
            if c.get("status").and_then(Value::as_str) == Some("False") {
                let msg = c.get("message").and_then(Value::as_str).unwrap_or_default();
                groups.entry(msg.to_owned()).or_default().push(x.name());
            }
        }
    }
    if groups.is_empty() {
        return Condition::new("MachinesUpToDate", true, "UpToDate");
    }
    let mut lines = Vec::new();
    for (msg, names) in groups {
        let noun = if names.len() == 1 {
            "Machine"
        } else {
            "Machines"
        };
        lines.push(format!("* {noun} {}:", names.join(", ")));
        lines.extend(msg.lines().map(|l| format!("  {l}")));
    }
    Condition::new("MachinesUpToDate", false, "NotUpToDate").message(lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str, version: &str, status: Value) -> std::sync::Arc<Machine> {
        let mut x = Machine::new("ns", name, json!({"version": version}));
        x.status = status;
        std::sync::Arc::new(x)
    }

    #[test]
    fn up_to_date_says_why_or_that_the_kubelet_differs() {
        let x = machine("a", "v1.37.2", json!({}));
        let c = up_to_date_condition(&x, &["Version v1.36.0, v1.37.2 required".into()]);
        assert_eq!((c.status, c.reason), (false, "NotUpToDate"));
        assert_eq!(c.message, "* Version v1.36.0, v1.37.2 required");
        let x = machine(
            "a",
            "v1.38.0",
            json!({"nodeInfo": {"kubeletVersion": "v1.37.2"}}),
        );
        let c = up_to_date_condition(&x, &[]);
        assert_eq!((c.status, c.reason), (false, "Updating"));
        assert_eq!(
            c.message,
            "* Node.status.nodeInfo.kubeletVersion v1.37.2, v1.38.0 required"
        );
        let x = machine(
            "a",
            "v1.37.2",
            json!({"nodeInfo": {"kubeletVersion": "v1.37.2-kumo"}}),
        );
        assert!(up_to_date_condition(&x, &[]).status);
    }

    #[test]
    fn rollout_conditions_aggregate_the_machines() {
        let outdated = |name: &str, msg: &str| {
            machine(
                name,
                "v1.37.2",
                json!({"conditions": [{"type": "UpToDate", "status": "False", "reason": "NotUpToDate", "message": msg}]}),
            )
        };
        let fresh = machine(
            "c",
            "v1.37.2",
            json!({"conditions": [{"type": "UpToDate", "status": "True", "reason": "UpToDate", "message": ""}]}),
        );
        let a = outdated(
            "a",
            "* KumoMachine is not up-to-date\n* Version v1.36.0, v1.37.2 required",
        );
        let b = outdated(
            "b",
            "* KumoMachine is not up-to-date\n* Version v1.36.0, v1.37.2 required",
        );
        let live = vec![&a, &b, &fresh];
        let r = crate::rolling_out(live.iter().map(|x| &***x));
        assert_eq!((r.status, r.reason), (true, "RollingOut"));
        assert_eq!(
            r.message,
            "Rolling out 2 not up-to-date replicas\n* Version v1.36.0, v1.37.2 required\n* KumoMachine is not up-to-date"
        );
        let u = machines_up_to_date(&live);
        assert_eq!((u.status, u.reason), (false, "NotUpToDate"));
        assert_eq!(
            u.message,
            "* Machines a, b:\n  * KumoMachine is not up-to-date\n  * Version v1.36.0, v1.37.2 required"
        );
        let only = vec![&fresh];
        assert!(machines_up_to_date(&only).status);
        assert!(!crate::rolling_out(only.iter().map(|x| &***x)).status);
    }

    #[test]
    fn init_and_join_do_not_make_a_config_outdated() {
        let kcp = json!({"clusterConfiguration": {"a": 1}, "initConfiguration": {"x": 1}, "joinConfiguration": {}});
        let joined =
            json!({"clusterConfiguration": {"a": 1}, "joinConfiguration": {"controlPlane": {}}});
        assert_eq!(config_facts(&kcp), config_facts(&joined));
        let changed = json!({"clusterConfiguration": {"a": 2}});
        assert_ne!(config_facts(&kcp), config_facts(&changed));
        assert_eq!(max_surge(&json!({})), 1);
        assert_eq!(
            max_surge(&json!({"rollout": {"strategy": {"rollingUpdate": {"maxSurge": 0}}}})),
            0
        );
    }
}
