//! The kubelet's events (core/v1, source component `kubelet`), as upstream's recorder
//! writes them: about pods (Pulling, Pulled, Created, Started, Killing, BackOff, Failed)
//! and about its node (Starting, NodeHasSufficientMemory, ..., NodeReady).

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::{json, Value};

/// One event to record.
#[derive(Clone, Debug)]
pub struct Record {
    /// The object: `Pod` or `Node`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.containers{name}` for container events.
    pub field_path: Option<String>,
    pub warning: bool,
    pub reason: std::borrow::Cow<'static, str>,
    pub message: String,
}

impl Record {
    /// An event about a container of `pod`.
    pub fn container(
        pod: &Value,
        container: &str,
        init: bool,
        warning: bool,
        reason: impl Into<std::borrow::Cow<'static, str>>,
        message: String,
    ) -> Record {
        let s = |p: &str| {
            pod.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let ephemeral = pod
            .pointer("/spec/ephemeralContainers")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.get("name").and_then(Value::as_str) == Some(container))
            });
        let list = if init {
            "initContainers"
        } else if ephemeral {
            "ephemeralContainers"
        } else {
            "containers"
        };
        Record {
            kind: "Pod",
            namespace: s("/metadata/namespace"),
            name: s("/metadata/name"),
            uid: s("/metadata/uid"),
            field_path: Some(format!("spec.{list}{{{container}}}")),
            warning,
            reason: reason.into(),
            message,
        }
    }

    /// An event about `pod` itself.
    pub fn pod(pod: &Value, warning: bool, reason: String, message: String) -> Record {
        let s = |p: &str| {
            pod.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        Record {
            kind: "Pod",
            namespace: s("/metadata/namespace"),
            name: s("/metadata/name"),
            uid: s("/metadata/uid"),
            field_path: None,
            warning,
            reason: reason.into(),
            message,
        }
    }
}

/// Writes events in the background; a failure is only logged, as upstream's recorder.
pub fn emit(client: &Client, node: &str, records: Vec<Record>) {
    if records.is_empty() {
        return;
    }
    let client = client.clone();
    let node = node.to_owned();
    tokio::spawn(async move {
        for r in records {
            let now = k8s_openapi::jiff::Timestamp::now();
            let stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
            let ns = if r.namespace.is_empty() {
                "default".to_owned()
            } else {
                r.namespace.clone()
            };
            let mut involved = json!({"kind": r.kind, "name": r.name, "apiVersion": "v1"});
            // A reference without a uid leaves it out (omitempty).
            if !r.uid.is_empty() {
                involved["uid"] = json!(r.uid);
            }
            if r.kind == "Pod" {
                involved["namespace"] = json!(ns);
            }
            if let Some(f) = &r.field_path {
                involved["fieldPath"] = json!(f);
            }
            let body = json!({
                "metadata": {"name": format!("{}.{:x}", r.name, now.as_nanosecond()), "namespace": ns},
                "involvedObject": involved,
                "reason": &*r.reason,
                "message": r.message,
                "source": {"component": "kubelet", "host": node},
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
                "type": if r.warning { "Warning" } else { "Normal" },
                "reportingComponent": "kubelet",
                "reportingInstance": node,
            });
            let Ok(ev) = serde_json::from_value::<Event>(body) else {
                continue;
            };
            let api: Api<Event> = Api::namespaced(client.clone(), &ns);
            if let Err(e) = api.create(&PostParams::default(), &ev).await {
                tracing::debug!(reason = &*r.reason, error = %e, "recording an event");
            }
        }
    });
}
