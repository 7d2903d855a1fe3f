//! The MachineHealthCheck controller: the Machines its selector picks in its Cluster are
//! checked against their Nodes in the workload cluster — a Node that never appeared
//! within `checks.nodeStartupTimeoutSeconds` (600 s by default), one that was deleted, or
//! one with an unhealthy condition held past its timeout marks the Machine
//! `HealthCheckSucceeded` False and `OwnerRemediated` False (WaitingForRemediation); its
//! owner (a MachineSet) then replaces it, if `remediation.triggerIf` allows it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kumo_client::worker::SyncError;
use serde_json::{json, Value};

use crate::object::*;
use crate::{Error, Manager};

/// v1beta2's default `checks.nodeStartupTimeoutSeconds`.
const NODE_STARTUP_TIMEOUT_SECS: i64 = 600;

fn seconds_since(rfc3339: Option<&str>) -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    rfc3339
        .and_then(kumo_apimachinery::time::parse_rfc3339)
        .map_or(0, |t| now - t)
}

/// Whether `labels` match `selector` (matchLabels and matchExpressions).
fn selects(selector: &Value, labels: &std::collections::BTreeMap<String, String>) -> bool {
    if let Some(ml) = selector.get("matchLabels").and_then(Value::as_object) {
        if !ml
            .iter()
            .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
        {
            return false;
        }
    }
    for e in selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let has = labels.get(key);
        let ok = match e
            .get("operator")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "In" => has.is_some_and(|v| values.contains(&v.as_str())),
            "NotIn" => has.is_none_or(|v| !values.contains(&v.as_str())),
            "Exists" => has.is_some(),
            "DoesNotExist" => has.is_none(),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Why a Machine is unhealthy, if it is: (reason, message).
fn check(x: &Machine, node: Option<&Node>, spec: &Value) -> Option<(&'static str, String)> {
    let Some(node) = node else {
        if let Some(n) = str_at(&x.status, "/nodeRef/name") {
            return Some((
                "NodeDeleted",
                format!("Health check failed: Node {n} has been deleted"),
            ));
        }
        let timeout = spec
            .pointer("/checks/nodeStartupTimeoutSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(NODE_STARTUP_TIMEOUT_SECS);
        let since = x
            .status
            .get("conditions")
            .and_then(Value::as_array)
            .and_then(|cs| {
                cs.iter().find(|c| {
                    c.get("type").and_then(Value::as_str) == Some("InfrastructureReady")
                        && c.get("status").and_then(Value::as_str) == Some("True")
                })
            })
            .and_then(|c| {
                c.get("lastTransitionTime")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .or_else(|| {
                x.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
            });
        if timeout > 0 && seconds_since(since.as_deref()) > timeout {
            return Some((
                "NodeStartupTimeout",
                format!(
                    "Health check failed: Node failed to report startup in {}",
                    human(timeout)
                ),
            ));
        }
        return None;
    };
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref())?;
    for u in spec
        .pointer("/checks/unhealthyNodeConditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(t), Some(st)) = (
            u.get("type").and_then(Value::as_str),
            u.get("status").and_then(Value::as_str),
        ) else {
            continue;
        };
        let timeout = u.get("timeoutSeconds").and_then(Value::as_i64).unwrap_or(0);
        if let Some(c) = conditions.iter().find(|c| c.type_ == t && c.status == st) {
            let since = c.last_transition_time.as_ref().map(|t| t.0.to_string());
            if seconds_since(since.as_deref()) >= timeout {
                return Some(("UnhealthyNode", format!("Health check failed: Condition {t} on Node is reported as {st} for more than {}", human(timeout))));
            }
        }
    }
    None
}

/// Go's Duration printing for whole seconds (`5m0s`, `10s`).
fn human(secs: i64) -> String {
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

pub async fn sync(m: &Manager, key: &str) -> Result<(), SyncError> {
    let Some(h) = m.health_checks.get(key) else {
        return Ok(());
    };
    if h.deleting() {
        return Ok(());
    }
    let ns = h.namespace();
    let cluster = h
        .spec
        .get("clusterName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let selector = h.spec.get("selector").cloned().unwrap_or_default();
    let targets: Vec<_> = m
        .machines
        .list()
        .into_iter()
        .filter(|x| {
            x.namespace() == ns
                && x.cluster_name() == Some(cluster.as_str())
                && !x.deleting()
                && selects(
                    &selector,
                    x.metadata.labels.as_ref().unwrap_or(&Default::default()),
                )
        })
        .collect();
    let Some(remote) = m.remote.client(ns, &cluster).await? else {
        return Err(SyncError::After(Duration::from_secs(2)));
    };
    let nodes: Api<Node> = Api::all(remote);
    let nodes = nodes
        .list(&Default::default())
        .await
        .map_err(Error::from)?
        .items;
    let mut unhealthy = Vec::new();
    for x in &targets {
        let node = str_at(&x.status, "/nodeRef/name")
            .and_then(|n| {
                nodes
                    .iter()
                    .find(|nd| nd.metadata.name.as_deref() == Some(n))
            })
            .or_else(|| {
                let pid = str_at(&x.spec, "/providerID")?;
                nodes
                    .iter()
                    .find(|nd| nd.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(pid))
            });
        match check(x, node, &h.spec) {
            Some(why) => unhealthy.push((x.clone(), why)),
            None => {
                m.set_conditions(
                    &**x,
                    &[Condition::new(
                        "HealthCheckSucceeded",
                        true,
                        "HealthCheckSucceeded",
                    )],
                )
                .await?;
            }
        }
    }
    let expected = targets.len() as i64;
    let healthy = expected - unhealthy.len() as i64;
    let max_unhealthy = h
        .spec
        .pointer("/remediation/triggerIf/unhealthyLessThanOrEqualTo")
        .map(|v| match v {
            Value::String(s) if s.ends_with('%') => {
                s.trim_end_matches('%').parse::<i64>().unwrap_or(100) * expected / 100
            }
            Value::String(s) => s.parse().unwrap_or(expected),
            v => v.as_i64().unwrap_or(expected),
        })
        .unwrap_or(expected);
    let allowed = (unhealthy.len() as i64) <= max_unhealthy;
    for (x, (reason, msg)) in &unhealthy {
        let mut cs =
            vec![Condition::new("HealthCheckSucceeded", false, reason).message(msg.clone())];
        if allowed {
            cs.push(
                Condition::new("OwnerRemediated", false, "WaitingForRemediation")
                    .message("Waiting for remediation"),
            );
        }
        if !is_true(&x.status, "HealthCheckSucceeded")
            && x.status
                .get("conditions")
                .is_some_and(|c| c.to_string().contains(reason))
        {
            // Marked before.
        } else {
            m.event(
                &**x,
                "Normal",
                "MachineMarkedUnhealthy",
                format!(
                    "Machine {} has been marked as unhealthy by {}",
                    x.key(),
                    h.key()
                ),
            )
            .await;
        }
        m.set_conditions(&**x, &cs).await?;
    }
    let conditions = [
        if allowed {
            Condition::new("RemediationAllowed", true, "RemediationAllowed")
        } else {
            Condition::new("RemediationAllowed", false, "TooManyUnhealthy")
                .message(format!("Remediation is not allowed, the number of not started or unhealthy machines exceeds maxUnhealthy (total: {expected}, unhealthy: {}, maxUnhealthy: {max_unhealthy})", unhealthy.len()))
        },
        Condition::new("Paused", false, "NotPaused"),
        Condition::new("Deleting", false, "NotDeleting"),
    ];
    let status = json!({
        "expectedMachines": expected,
        "currentHealthy": healthy,
        "remediationsAllowed": if allowed { max_unhealthy - unhealthy.len() as i64 } else { 0 },
        "targets": targets.iter().map(|x| x.name().to_owned()).collect::<Vec<_>>(),
        "observedGeneration": h.metadata.generation,
        "conditions": merge_conditions(&h.status, &conditions, h.metadata.generation),
    });
    m.patch_status(&*h, status).await?;
    // Node conditions age without an event here.
    Err(SyncError::After(Duration::from_secs(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_go_does() {
        assert_eq!(human(10), "10s");
        assert_eq!(human(300), "5m0s");
        assert_eq!(human(600), "10m0s");
        assert_eq!(human(3725), "1h2m5s");
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels = [("a".to_owned(), "1".to_owned())].into_iter().collect();
        assert!(selects(&json!({"matchLabels": {"a": "1"}}), &labels));
        assert!(!selects(&json!({"matchLabels": {"a": "2"}}), &labels));
        assert!(selects(
            &json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "3"]}]}),
            &labels
        ));
        assert!(!selects(
            &json!({"matchExpressions": [{"key": "b", "operator": "Exists"}]}),
            &labels
        ));
    }
}
