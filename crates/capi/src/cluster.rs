//! The Cluster controller: owns its infrastructure cluster and control plane, takes the
//! control-plane endpoint and failure domains from the infrastructure, follows the control
//! plane's initialization, probes the workload cluster, and summarises it all in the
//! phase and the v1beta2 conditions (Available, InfrastructureReady,
//! ControlPlaneInitialized, ControlPlaneAvailable, WorkersAvailable, RemoteConnectionProbe,
//! Deleting, Paused). Deleting a Cluster deletes its workers, its control plane and its
//! infrastructure, in that order, before the finalizer goes.

use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kumo_client::worker::SyncError;
use serde_json::{json, Value};

use crate::object::*;
use crate::{Error, Manager, CLUSTER_FINALIZER};

pub async fn sync(m: &Manager, key: &str) -> Result<(), SyncError> {
    let Some(c) = m.clusters.get(key) else {
        if let Some((ns, name)) = key.split_once('/') {
            m.remote.forget(ns, name);
        }
        return Ok(());
    };
    if c.deleting() {
        return delete(m, &c).await;
    }
    if m.add_finalizer(&*c, CLUSTER_FINALIZER).await? {
        return Ok(());
    }
    let ns = c.namespace();
    let paused = c
        .spec
        .get("paused")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut conditions = vec![
        Condition::new("Deleting", false, "NotDeleting"),
        Condition::new(
            "Paused",
            paused,
            if paused { "Paused" } else { "NotPaused" },
        ),
    ];
    if paused {
        let status = status_with(&c, json!({}), &conditions);
        return Ok(m.patch_status(&*c, status).await?);
    }
    let mut status = json!({});
    // The infrastructure cluster.
    let infra_ref = c
        .spec
        .get("infrastructureRef")
        .cloned()
        .filter(|r| r.get("name").is_some());
    let mut infra_ready = false;
    if let Some(r) = &infra_ref {
        match m.refs.get(ns, r).await? {
            Some(infra) => {
                m.refs.adopt(ns, r, &infra, c.owner_ref(), c.name()).await?;
                infra_ready = bool_at(&infra.data, "/status/initialization/provisioned");
                let endpoint = infra.data.pointer("/spec/controlPlaneEndpoint").cloned();
                let ours = str_at(&c.spec, "/controlPlaneEndpoint/host").unwrap_or_default();
                if let Some(ep) = endpoint.filter(|e| {
                    e.get("host")
                        .and_then(Value::as_str)
                        .is_some_and(|h| !h.is_empty())
                }) {
                    if ours.is_empty() {
                        m.api::<ClusterKind>(ns)
                            .patch(
                                c.name(),
                                &PatchParams::default(),
                                &Patch::Merge(json!({"spec": {"controlPlaneEndpoint": ep}})),
                            )
                            .await
                            .map_err(Error::from)?;
                    }
                }
                if let Some(fd) = infra.data.pointer("/status/failureDomains") {
                    status["failureDomains"] = fd.clone();
                }
                conditions.push(if infra_ready {
                    Condition::new("InfrastructureReady", true, "Ready")
                } else {
                    Condition::new("InfrastructureReady", false, "NotReady")
                        .message(format!("{} is not ready", ref_text(r)))
                });
            }
            None => conditions.push(
                Condition::new("InfrastructureReady", false, "InfrastructureDoesNotExist")
                    .message(format!("{} does not exist", ref_text(r))),
            ),
        }
    }
    status["initialization"] = json!({"infrastructureProvisioned": infra_ready});
    // The control plane.
    let mut cp_initialized = false;
    let mut cp_available = false;
    if let Some(r) = c
        .spec
        .get("controlPlaneRef")
        .cloned()
        .filter(|r| r.get("name").is_some())
    {
        if let Some(cp) = m.refs.get(ns, &r).await? {
            m.refs.adopt(ns, &r, &cp, c.owner_ref(), c.name()).await?;
            let st = cp.data.get("status").cloned().unwrap_or_default();
            cp_initialized = bool_at(&st, "/initialization/controlPlaneInitialized");
            cp_available = is_true(&st, "Available");
            let n = |k: &str| st.get(k).cloned().unwrap_or(Value::Null);
            status["controlPlane"] = json!({
                "desiredReplicas": cp.data.pointer("/spec/replicas").cloned().unwrap_or(Value::Null),
                "replicas": n("replicas"), "readyReplicas": n("readyReplicas"),
                "availableReplicas": n("availableReplicas"), "upToDateReplicas": n("upToDateReplicas"),
            });
        }
        conditions.push(if cp_initialized {
            Condition::new("ControlPlaneInitialized", true, "Initialized")
        } else {
            Condition::new("ControlPlaneInitialized", false, "NotInitialized")
                .message("Control plane not yet initialized")
        });
        conditions.push(if cp_available {
            Condition::new("ControlPlaneAvailable", true, "Available")
        } else {
            Condition::new("ControlPlaneAvailable", false, "NotAvailable")
                .message(format!("{} is not available", ref_text(&r)))
        });
    }
    status["initialization"]["controlPlaneInitialized"] = cp_initialized.into();
    // The workers: MachineDeployments and the Machines not of the control plane.
    let mds: Vec<_> = m
        .deployments
        .list()
        .into_iter()
        .filter(|d| d.namespace() == ns && d.cluster_name() == Some(c.name()))
        .collect();
    let workers: Vec<_> = m
        .machines
        .list()
        .into_iter()
        .filter(|x| {
            x.namespace() == ns
                && x.cluster_name() == Some(c.name())
                && x.label(crate::CONTROL_PLANE_LABEL).is_none()
        })
        .collect();
    let unavailable: Vec<String> = mds
        .iter()
        .filter(|d| !is_true(&d.status, "Available"))
        .map(|d| format!("MachineDeployment {}", d.name()))
        .collect();
    conditions.push(if mds.is_empty() {
        Condition::new("WorkersAvailable", true, "NoWorkers")
    } else if unavailable.is_empty() {
        Condition::new("WorkersAvailable", true, "Available")
    } else {
        Condition::new("WorkersAvailable", false, "NotAvailable")
            .message(format!("{} not available", unavailable.join(", ")))
    });
    let count = |f: &dyn Fn(&Machine) -> bool| workers.iter().filter(|w| f(w)).count();
    status["workers"] = json!({
        "desiredReplicas": mds.iter().map(|d| d.spec.get("replicas").and_then(Value::as_i64).unwrap_or(1)).sum::<i64>(),
        "replicas": workers.len(),
        "readyReplicas": count(&|w| is_true(&w.status, "Ready")),
        "availableReplicas": count(&|w| is_true(&w.status, "Available")),
        "upToDateReplicas": count(&|w| is_true(&w.status, "UpToDate")),
    });
    // Whether the workload cluster answers.
    let probe = if cp_initialized {
        match m.remote.client(ns, c.name()).await {
            Ok(Some(client)) => {
                let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
                nodes
                    .list_metadata(&ListParams::default().limit(1))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
            Ok(None) => Err("no kubeconfig Secret".into()),
            Err(e) => Err(e.to_string()),
        }
    } else {
        Err("Remote connection not established yet".into())
    };
    conditions.push(match &probe {
        Ok(()) => Condition::new("RemoteConnectionProbe", true, "ProbeSucceeded"),
        Err(e) => Condition::new("RemoteConnectionProbe", false, "ProbeFailed").message(e.clone()),
    });
    let not_ok: Vec<String> = conditions
        .iter()
        .filter(|x| {
            [
                "InfrastructureReady",
                "ControlPlaneAvailable",
                "WorkersAvailable",
                "RemoteConnectionProbe",
            ]
            .contains(&x.type_)
                && !x.status
        })
        .map(|x| {
            format!(
                "* {}: {}",
                x.type_,
                if x.message.is_empty() {
                    x.reason.to_owned()
                } else {
                    x.message.clone()
                }
            )
        })
        .collect();
    conditions.push(if not_ok.is_empty() {
        Condition::new("Available", true, "Available")
    } else {
        Condition::new("Available", false, "NotAvailable").message(not_ok.join("\n"))
    });
    let endpoint_set = !str_at(&c.spec, "/controlPlaneEndpoint/host")
        .unwrap_or_default()
        .is_empty();
    status["phase"] = if infra_ready && endpoint_set {
        "Provisioned"
    } else if infra_ref.is_some() {
        "Provisioning"
    } else {
        "Pending"
    }
    .into();
    let status = status_with(&c, status, &conditions);
    m.patch_status(&*c, status).await?;
    Ok(())
}

fn status_with(c: &Cluster, mut status: Value, conditions: &[Condition]) -> Value {
    status["conditions"] = merge_conditions(&c.status, conditions, c.metadata.generation);
    status["observedGeneration"] = c.metadata.generation.into();
    status
}

fn ref_text(r: &Value) -> String {
    format!(
        "{} {}",
        r.get("kind").and_then(Value::as_str).unwrap_or_default(),
        r.get("name").and_then(Value::as_str).unwrap_or_default()
    )
}

/// Deletion: workers first, then the control plane, then the infrastructure.
async fn delete(m: &Manager, c: &Cluster) -> Result<(), SyncError> {
    let ns = c.namespace();
    let mine = |o: Option<&str>| o == Some(c.name());
    let dp = DeleteParams::background();
    let mut waiting = None;
    for d in m
        .deployments
        .list()
        .iter()
        .filter(|d| d.namespace() == ns && mine(d.cluster_name()))
    {
        if !d.deleting() {
            let _ = m
                .api::<MachineDeploymentKind>(ns)
                .delete(d.name(), &dp)
                .await;
        }
        waiting = Some("WaitingForWorkersDeletion");
    }
    for s in m
        .machine_sets
        .list()
        .iter()
        .filter(|s| s.namespace() == ns && mine(s.cluster_name()))
    {
        if s.controller_of_kind::<MachineDeploymentKind>().is_none() && !s.deleting() {
            let _ = m.api::<MachineSetKind>(ns).delete(s.name(), &dp).await;
        }
        waiting = Some("WaitingForWorkersDeletion");
    }
    let workers: Vec<_> = m
        .machines
        .list()
        .into_iter()
        .filter(|x| {
            x.namespace() == ns
                && mine(x.cluster_name())
                && x.label(crate::CONTROL_PLANE_LABEL).is_none()
        })
        .collect();
    for w in &workers {
        if w.metadata
            .owner_references
            .as_ref()
            .is_none_or(|o| o.is_empty())
            && !w.deleting()
        {
            let _ = m.api::<MachineKind>(ns).delete(w.name(), &dp).await;
        }
        waiting = Some("WaitingForWorkersDeletion");
    }
    // Then the control plane, then the infrastructure, each once the one before is gone.
    for (field, reason) in [
        ("controlPlaneRef", "WaitingForControlPlaneDeletion"),
        ("infrastructureRef", "WaitingForInfrastructureDeletion"),
    ] {
        if waiting.is_some() {
            break;
        }
        if let Some(r) = c.spec.get(field).filter(|r| r.get("name").is_some()) {
            if m.refs.delete(ns, r).await? {
                waiting = Some(reason);
            }
        }
    }
    match waiting {
        Some(reason) => {
            let mut status = c.status.clone();
            if !status.is_object() {
                status = json!({});
            }
            status["phase"] = "Deleting".into();
            status["conditions"] = merge_conditions(
                &c.status,
                &[Condition::new("Deleting", true, reason)],
                c.metadata.generation,
            );
            m.patch_status(c, status).await?;
            Err(SyncError::After(std::time::Duration::from_millis(500)))
        }
        None => {
            m.remote.forget(ns, c.name());
            m.remove_finalizer(c, CLUSTER_FINALIZER).await?;
            Ok(())
        }
    }
}
