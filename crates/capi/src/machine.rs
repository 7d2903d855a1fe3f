//! The Machine controller: owns its bootstrap config and infrastructure machine, takes the
//! bootstrap data Secret's name from the one and the providerID, addresses and failure
//! domain from the other, finds its Node in the workload cluster by providerID (nodeRef,
//! nodeInfo, the Node's annotations naming the Machine), and reports the phase (Pending →
//! Provisioning → Provisioned → Running → Deleting) and the v1beta2 conditions. Deleting a
//! Machine deletes its infrastructure and bootstrap objects, then its Node.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kumo_client::worker::SyncError;
use serde_json::{json, Value};

use crate::object::*;
use crate::{Error, Manager, CLUSTER_NAME_LABEL, MACHINE_FINALIZER};

pub async fn sync(m: &Manager, key: &str) -> Result<(), SyncError> {
    let Some(x) = m.machines.get(key) else {
        return Ok(());
    };
    let ns = x.namespace();
    let cluster = x.cluster_name().unwrap_or_default().to_owned();
    if x.deleting() {
        return delete(m, &x, &cluster).await;
    }
    if m.add_finalizer(&*x, MACHINE_FINALIZER).await? {
        return Ok(());
    }
    if x.label(CLUSTER_NAME_LABEL) != Some(cluster.as_str()) {
        m.patch_meta(&*x, json!({"labels": {CLUSTER_NAME_LABEL: cluster}}))
            .await?;
        return Ok(());
    }
    let mut spec_patch = json!({});
    let mut status = json!({});
    let mut conditions = vec![
        Condition::new("Deleting", false, "NotDeleting"),
        Condition::new("Paused", false, "NotPaused"),
    ];
    // UpToDate is the owner's to say: here for a MachineDeployment's machine (its
    // MachineSet's template against the deployment's, as upstream's machine controller);
    // a KubeadmControlPlane sets it on its own machines.
    if let Some(c) = crate::machineset::deployment_up_to_date(m, &x) {
        conditions.push(c);
    }
    // Bootstrap.
    let mut data_secret = str_at(&x.spec, "/bootstrap/dataSecretName").map(str::to_owned);
    if let Some(r) = x
        .spec
        .pointer("/bootstrap/configRef")
        .filter(|r| r.get("name").is_some())
    {
        match m.refs.get(ns, r).await? {
            Some(cfg) => {
                m.refs.adopt(ns, r, &cfg, x.owner_ref(), &cluster).await?;
                if data_secret.is_none() {
                    if let Some(s) = cfg
                        .data
                        .pointer("/status/dataSecretName")
                        .and_then(Value::as_str)
                    {
                        spec_patch["bootstrap"] = json!({"dataSecretName": s});
                        data_secret = Some(s.to_owned());
                    }
                }
            }
            None if data_secret.is_none() => {
                conditions.push(Condition::new(
                    "BootstrapConfigReady",
                    false,
                    "BootstrapConfigDoesNotExist",
                ));
            }
            None => {}
        }
    }
    conditions.push(match &data_secret {
        Some(_) => Condition::new("BootstrapConfigReady", true, "DataSecretProvided"),
        None => Condition::new("BootstrapConfigReady", false, "NotReady")
            .message("Bootstrap data not available yet"),
    });
    // Infrastructure.
    let mut provisioned = false;
    let mut provider_id = str_at(&x.spec, "/providerID").map(str::to_owned);
    if let Some(r) = x
        .spec
        .get("infrastructureRef")
        .filter(|r| r.get("name").is_some())
    {
        match m.refs.get(ns, r).await? {
            Some(infra) => {
                m.refs.adopt(ns, r, &infra, x.owner_ref(), &cluster).await?;
                provisioned = bool_at(&infra.data, "/status/initialization/provisioned");
                if provider_id.is_none() {
                    if let Some(p) = infra
                        .data
                        .pointer("/spec/providerID")
                        .and_then(Value::as_str)
                    {
                        spec_patch["providerID"] = p.into();
                        provider_id = Some(p.to_owned());
                    }
                }
                if let Some(a) = infra.data.pointer("/status/addresses") {
                    status["addresses"] = a.clone();
                }
                if x.spec.get("failureDomain").is_none() {
                    if let Some(fd) = infra
                        .data
                        .pointer("/spec/failureDomain")
                        .and_then(Value::as_str)
                    {
                        spec_patch["failureDomain"] = fd.into();
                    }
                }
                conditions.push(if provisioned {
                    Condition::new("InfrastructureReady", true, "Ready")
                } else {
                    Condition::new("InfrastructureReady", false, "NotReady").message(format!(
                        "{} {} is not ready",
                        infra
                            .types
                            .as_ref()
                            .map(|t| t.kind.as_str())
                            .unwrap_or_default(),
                        infra.metadata.name.clone().unwrap_or_default()
                    ))
                });
            }
            None => conditions.push(
                Condition::new(
                    "InfrastructureReady",
                    false,
                    if provisioned {
                        "InfrastructureDeleted"
                    } else {
                        "InfrastructureDoesNotExist"
                    },
                )
                .message("the infrastructure machine does not exist"),
            ),
        }
    }
    if spec_patch.as_object().is_some_and(|o| !o.is_empty()) {
        m.api::<MachineKind>(ns)
            .patch(
                x.name(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec_patch})),
            )
            .await
            .map_err(Error::from)?;
        return Ok(());
    }
    if let Some(fd) = x.spec.get("failureDomain") {
        status["failureDomain"] = fd.clone();
    }
    status["initialization"] = json!({
        "bootstrapDataSecretCreated": data_secret.is_some(),
        "infrastructureProvisioned": provisioned,
    });
    // The Node.
    let mut node_ready = false;
    let had_node = x.status.pointer("/nodeRef/name").is_some();
    if let Some(pid) = &provider_id {
        match node_of(m, &x, &cluster, pid).await {
            Ok(Some(node)) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                status["nodeRef"] = json!({"name": name});
                if let Some(info) = node.status.as_ref().and_then(|s| s.node_info.as_ref()) {
                    status["nodeInfo"] = serde_json::to_value(info).unwrap_or_default();
                }
                let ready = node
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
                node_ready = ready.is_some_and(|c| c.status == "True");
                conditions.push(match ready.map(|c| c.status.as_str()) {
                    Some("True") => Condition::new("NodeReady", true, "NodeReady"),
                    Some("False") => Condition::new("NodeReady", false, "NodeNotReady")
                        .message(ready.and_then(|c| c.message.clone()).unwrap_or_default()),
                    _ => Condition::new("NodeReady", false, "NodeReadyUnknown"),
                });
                conditions.push(if node_ready {
                    Condition::new("NodeHealthy", true, "NodeHealthy")
                } else {
                    Condition::new("NodeHealthy", false, "NodeNotHealthy")
                        .message(format!("Node {name} is not ready"))
                });
                annotate_node(m, &x, &cluster, &node).await;
            }
            Ok(None) if had_node => {
                status["nodeRef"] = x.status.get("nodeRef").cloned().unwrap_or_default();
                conditions.push(
                    Condition::new("NodeReady", false, "NodeDeleted")
                        .message("Node has been deleted"),
                );
                conditions.push(
                    Condition::new("NodeHealthy", false, "NodeDeleted")
                        .message("Node has been deleted"),
                );
            }
            Ok(None) => {
                conditions.push(
                    Condition::new("NodeReady", false, "NodeDoesNotExist").message(format!(
                        "Waiting for a Node with spec.providerID {pid} to exist"
                    )),
                );
                conditions.push(
                    Condition::new("NodeHealthy", false, "NodeDoesNotExist").message(format!(
                        "Waiting for a Node with spec.providerID {pid} to exist"
                    )),
                );
            }
            Err(e) => {
                if had_node {
                    status["nodeRef"] = x.status.get("nodeRef").cloned().unwrap_or_default();
                }
                conditions.push(
                    Condition::new("NodeReady", false, "ConnectionDown").message(e.to_string()),
                );
                conditions.push(
                    Condition::new("NodeHealthy", false, "ConnectionDown").message(e.to_string()),
                );
            }
        }
    } else {
        conditions.push(
            Condition::new("NodeReady", false, "NodeDoesNotExist")
                .message("Waiting for the infrastructure to report spec.providerID"),
        );
        conditions.push(
            Condition::new("NodeHealthy", false, "NodeDoesNotExist")
                .message("Waiting for the infrastructure to report spec.providerID"),
        );
    }
    let ready = data_secret.is_some() && provisioned && node_ready;
    conditions.push(if ready {
        Condition::new("Ready", true, "Ready")
    } else {
        Condition::new("Ready", false, "NotReady")
    });
    conditions.push(if ready {
        Condition::new("Available", true, "Available")
    } else {
        Condition::new("Available", false, "NotReady")
    });
    status["phase"] = if status.get("nodeRef").is_some() {
        "Running"
    } else if provisioned || provider_id.is_some() {
        "Provisioned"
    } else if data_secret.is_some() {
        "Provisioning"
    } else {
        "Pending"
    }
    .into();
    status["conditions"] = merge_conditions(&x.status, &conditions, x.metadata.generation);
    status["observedGeneration"] = x.metadata.generation.into();
    m.patch_status(&*x, status).await?;
    if !ready {
        return Err(SyncError::After(Duration::from_secs(1)));
    }
    Ok(())
}

/// The workload cluster's Node whose spec.providerID is `pid`.
async fn node_of(
    m: &Manager,
    x: &Machine,
    cluster: &str,
    pid: &str,
) -> Result<Option<Node>, Error> {
    let Some(client) = m.remote.client(x.namespace(), cluster).await? else {
        return Err(Error::Invalid("the cluster has no kubeconfig yet".into()));
    };
    let nodes: Api<Node> = Api::all(client);
    let list = nodes.list(&Default::default()).await?;
    Ok(list
        .items
        .into_iter()
        .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(pid)))
}

/// The annotations upstream puts on a Machine's Node.
async fn annotate_node(m: &Manager, x: &Machine, cluster: &str, node: &Node) {
    let (kind, owner) = x
        .metadata
        .owner_references
        .as_ref()
        .and_then(|os| os.iter().find(|o| o.controller == Some(true)))
        .map(|o| (o.kind.clone(), o.name.clone()))
        .unwrap_or_default();
    let want = json!({
        "cluster.x-k8s.io/cluster-name": cluster,
        "cluster.x-k8s.io/cluster-namespace": x.namespace(),
        "cluster.x-k8s.io/machine": x.name(),
        "cluster.x-k8s.io/owner-kind": kind,
        "cluster.x-k8s.io/owner-name": owner,
    });
    let have = node.metadata.annotations.clone().unwrap_or_default();
    let missing = want.as_object().is_some_and(|w| {
        w.iter()
            .any(|(k, v)| have.get(k).map(String::as_str) != v.as_str())
    });
    if !missing {
        return;
    }
    let Ok(Some(client)) = m.remote.client(x.namespace(), cluster).await else {
        return;
    };
    let nodes: Api<Node> = Api::all(client);
    let name = node.metadata.name.clone().unwrap_or_default();
    if let Err(e) = nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": want}})),
        )
        .await
    {
        tracing::debug!(machine = %x.key(), node = %name, error = %e, "annotating the node");
    }
}

/// Upstream's default `spec.deletion.nodeDeletionTimeoutSeconds`.
const NODE_DELETION_TIMEOUT_SECONDS: i64 = 10;

/// Whether machine `x`'s node deletion is still tried: its deletion began less than its
/// node deletion timeout ago (0: no timeout).
fn node_deletion_pending(x: &Machine) -> bool {
    let timeout = x
        .spec
        .pointer("/deletion/nodeDeletionTimeoutSeconds")
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(NODE_DELETION_TIMEOUT_SECONDS);
    match &x.metadata.deletion_timestamp {
        _ if timeout == 0 => true,
        Some(t) => {
            let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(t.0);
            elapsed.as_secs() < timeout
        }
        None => true,
    }
}

async fn delete(m: &Manager, x: &Machine, cluster: &str) -> Result<(), SyncError> {
    let ns = x.namespace();
    let mut reason = None;
    for (path, why) in [
        ("/infrastructureRef", "WaitingForInfrastructureDeletion"),
        ("/bootstrap/configRef", "WaitingForBootstrapDeletion"),
    ] {
        let Some(r) = x.spec.pointer(path).filter(|r| r.get("name").is_some()) else {
            continue;
        };
        if m.refs.delete(ns, r).await? {
            reason.get_or_insert(why);
        }
    }
    match reason {
        Some(r) => {
            let mut status = if x.status.is_object() {
                x.status.clone()
            } else {
                json!({})
            };
            status["phase"] = "Deleting".into();
            status["conditions"] = merge_conditions(
                &x.status,
                &[Condition::new("Deleting", true, r)],
                x.metadata.generation,
            );
            m.patch_status(x, status).await?;
            Err(SyncError::After(Duration::from_millis(500)))
        }
        None => {
            // The Node last, once its machine is gone (as upstream: a kubelet still
            // running would register it again). Nothing is drained first here.
            // A Machine deleted before it recorded its nodeRef still has a Node: found by
            // providerID.
            let mut node = str_at(&x.status, "/nodeRef/name").map(str::to_owned);
            if node.is_none() {
                if let Some(pid) = str_at(&x.spec, "/providerID") {
                    if let Ok(Some(n)) = node_of(m, x, cluster, pid).await {
                        node = n.metadata.name;
                    }
                }
            }
            if let Some(node) = node.as_deref() {
                if let Ok(Some(client)) = m.remote.client(ns, cluster).await {
                    let nodes: Api<Node> = Api::all(client);
                    match nodes.delete(node, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(e) if kumo_client::error::is_not_found(&e) => {}
                        // Tried again until the machine's node deletion timeout is over
                        // (the workload's API may be moving: a control-plane machine
                        // that served it has just gone), then left, as upstream.
                        Err(e) if node_deletion_pending(x) => {
                            tracing::info!(machine = %x.key(), node, error = %e, "deleting the node; retrying");
                            m.event(
                                x,
                                "Warning",
                                "FailedDeleteNode",
                                format!("error deleting Machine's node: {e}"),
                            )
                            .await;
                            return Err(SyncError::After(Duration::from_secs(2)));
                        }
                        Err(e) => {
                            tracing::info!(machine = %x.key(), node, error = %e, "Node deletion timeout expired, continuing without Node deletion.")
                        }
                    }
                }
            }
            m.remove_finalizer(x, MACHINE_FINALIZER).await?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    fn deleted(ago: i64, spec: Value) -> Machine {
        let mut x = Machine::new("ns", "m", spec);
        let at = Timestamp::now()
            .checked_sub(SignedDuration::from_secs(ago))
            .unwrap();
        x.metadata.deletion_timestamp = Some(Time(at));
        x
    }

    #[test]
    fn a_node_deletion_is_retried_until_the_machines_timeout() {
        assert!(node_deletion_pending(&deleted(3, json!({}))));
        assert!(!node_deletion_pending(&deleted(11, json!({}))));
        let longer = json!({"deletion": {"nodeDeletionTimeoutSeconds": 60}});
        assert!(node_deletion_pending(&deleted(30, longer)));
        let never = json!({"deletion": {"nodeDeletionTimeoutSeconds": 0}});
        assert!(node_deletion_pending(&deleted(3600, never)));
    }
}
