//! The kubelet's events (core/v1, source component `kubelet`), as upstream's recorder
//! writes them: about pods (Pulling, Pulled, Created, Started, Killing, BackOff, Failed)
//! and about its node (Starting, NodeHasSufficientMemory, ..., NodeReady).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use serde_json::Value;

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

/// Writes events in the background through the shared recorder (a repeat bumps the
/// Event's count); a failure is only logged, as upstream's recorder.
pub fn emit(client: &Client, node: &str, records: Vec<Record>) {
    if records.is_empty() {
        return;
    }
    let client = client.clone();
    let node = node.to_owned();
    tokio::spawn(async move {
        for r in records {
            let object = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some(r.kind.into()),
                name: Some(r.name.clone()),
                // A reference without a uid leaves it out (omitempty).
                uid: Some(r.uid.clone()).filter(|u| !u.is_empty()),
                namespace: Some(r.namespace.clone()).filter(|_| r.kind == "Pod"),
                field_path: r.field_path.clone(),
                ..Default::default()
            };
            let type_ = if r.warning { "Warning" } else { "Normal" };
            kumo_client::events::record_from(
                &client,
                "kubelet",
                Some(&node),
                object,
                type_,
                &r.reason,
                r.message,
            )
            .await;
        }
    });
}
