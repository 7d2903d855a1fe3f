//! A CustomResourceDefinition's `Webhook` conversion (`spec.conversion.webhook`): objects
//! change version by a `ConversionReview` (apiextensions.k8s.io v1, or v1beta1 when that
//! is the first of `conversionReviewVersions` known) posted to the webhook, checked and
//! merged back as upstream's webhook converter does: the converted object keeps the
//! original's metadata but for its labels and annotations, and must keep its kind, name,
//! namespace and uid.
//!
//! The strategies' conversion hooks are synchronous (they run inside the list, watch and
//! write paths), as upstream's converter is: a call blocks its worker thread with
//! [`tokio::task::block_in_place`], which hands the thread's other tasks to another worker.

use std::sync::Arc;
use std::time::Duration;

use kumo_apimachinery::status::ApiError;
use kumo_storage::Store;
use serde_json::{json, Map, Value};

use crate::resource_proxy::PodNetwork;
use crate::webhook_client::Client;
use kumo_apimachinery::validation::go_quote;

/// How long a conversion call may take (upstream's webhook client default).
const TIMEOUT: Duration = Duration::from_secs(30);

/// What a conversion call reaches the webhook through.
#[derive(Clone)]
pub struct Network {
    pub store: Arc<dyn Store>,
    pub pod_network: Option<Arc<dyn PodNetwork>>,
}

/// The conversion webhook of one definition.
pub(super) struct WebhookConverter {
    client: Client,
    /// The ConversionReview version sent (`v1` or `v1beta1`), if any is known.
    review_version: Option<&'static str>,
    group: String,
    kind: String,
    net: Network,
}

impl WebhookConverter {
    /// The converter of `crd` (its `spec.conversion.webhook`), if its strategy is
    /// `Webhook`.
    pub(super) fn of(crd: &Value, net: &Network) -> Option<WebhookConverter> {
        let conv = crd.pointer("/spec/conversion")?;
        if conv.get("strategy").and_then(Value::as_str) != Some("Webhook") {
            return None;
        }
        let hook = conv.get("webhook").unwrap_or(&Value::Null);
        let review_version = hook
            .get("conversionReviewVersions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find_map(|v| match v {
                "v1" => Some("v1"),
                "v1beta1" => Some("v1beta1"),
                _ => None,
            });
        let text = |p: &str| crd.pointer(p).and_then(Value::as_str).unwrap_or("");
        Some(WebhookConverter {
            client: Client::from_config(
                hook.get("clientConfig").unwrap_or(&Value::Null),
                TIMEOUT,
                String::new(),
                "kube-apiserver",
            ),
            review_version,
            group: text("/spec/group").to_owned(),
            kind: text("/spec/names/kind").to_owned(),
            net: net.clone(),
        })
    }

    /// `obj` in version `version` of the group, converted by the webhook unless it is in
    /// that version already (or empty: nothing but apiVersion and kind).
    pub(super) fn convert_blocking(&self, obj: Value, version: &str) -> Result<Value, ApiError> {
        let desired = format!("{}/{version}", self.group);
        let from = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let empty = obj.as_object().is_some_and(|o| {
            o.len() == 2 && o.contains_key("apiVersion") && o.contains_key("kind")
        });
        if from == desired || empty {
            let mut obj = obj;
            if let Some(o) = obj.as_object_mut() {
                o.insert("apiVersion".into(), Value::String(desired));
            }
            return Ok(obj);
        }
        let gvk = format!("{from}, Kind={}", self.kind);
        let call = self.convert(&obj, &desired);
        let result = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| h.block_on(call))
            }
            // A single-threaded runtime (tests) cannot lend its thread: the call runs on a
            // runtime of its own.
            _ => std::thread::scope(|s| {
                s.spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())?
                        .block_on(call)
                })
                .join()
                .unwrap_or_else(|_| Err("the conversion call panicked".into()))
            }),
        };
        result.map_err(|why| ApiError::internal(format!("conversion webhook for {gvk} {why}")))
    }

    /// Posts the review and merges the converted object into `obj`. The error is worded
    /// after `conversion webhook for <gvk> `.
    async fn convert(&self, obj: &Value, desired: &str) -> Result<Value, String> {
        let version = self
            .review_version
            .ok_or("failed: no supported conversion review versions")?;
        let uid = uuid::Uuid::new_v4().to_string();
        let review = json!({
            "kind": "ConversionReview",
            "apiVersion": format!("apiextensions.k8s.io/{version}"),
            "request": {"uid": uid, "desiredAPIVersion": desired, "objects": [obj]},
        });
        let body = serde_json::to_vec(&review).map_err(|e| format!("failed: {e}"))?;
        let bytes = self
            .client
            .post(&*self.net.store, self.net.pod_network.as_ref(), body)
            .await
            .map_err(|e| format!("failed: {e}"))?;
        let resp: Value = serde_json::from_slice(&bytes).map_err(|e| format!("failed: {e}"))?;
        let failed = |why: String| format!("failed: {why}");
        if version == "v1" {
            let got = format!(
                "{}, Kind={}",
                resp.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                resp.get("kind").and_then(Value::as_str).unwrap_or("")
            );
            if got != "apiextensions.k8s.io/v1, Kind=ConversionReview" {
                return Err(failed(format!(
                    "expected webhook response of apiextensions.k8s.io/v1, Kind=ConversionReview, got {got}"
                )));
            }
        }
        let r = resp
            .get("response")
            .filter(|r| r.is_object())
            .ok_or_else(|| failed("no response provided".into()))?;
        if version == "v1" {
            let got = r.get("uid").and_then(Value::as_str).unwrap_or("");
            if got != uid {
                return Err(failed(format!(
                    "expected response.uid={}, got {}",
                    go_quote(&uid),
                    go_quote(got)
                )));
            }
        }
        let status = r
            .pointer("/result/status")
            .and_then(Value::as_str)
            .unwrap_or("");
        if status != "Success" {
            return Err(failed(
                match r.pointer("/result/message").and_then(Value::as_str) {
                    Some(m) if !m.is_empty() => m.to_owned(),
                    _ => format!("response.result.status was '{status}', not 'Success'"),
                },
            ));
        }
        let converted = r
            .get("convertedObjects")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let Some(out) = converted.first() else {
            return Err(format!("returned {} objects, expected 1", converted.len()));
        };
        let invalid = |why: String| format!("returned invalid object at index 0: {why}");
        let got_version = out.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if got_version != desired {
            return Err(invalid(format!(
                "invalid groupVersion (expected {desired}, received {got_version})"
            )));
        }
        let kind = |v: &Value| {
            v.get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        if kind(out) != kind(obj) {
            return Err(invalid(format!(
                "invalid kind (expected {}, received {})",
                kind(obj),
                kind(out)
            )));
        }
        let mut out = out.clone();
        let meta = |v: &Value, k: &str| {
            v.pointer(&format!("/metadata/{k}"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        for (k, what) in [("name", "name"), ("namespace", "namespace"), ("uid", "UID")] {
            if meta(obj, k) != meta(&out, k) {
                return Err(invalid(format!(
                    "must have the same {what}: {} != {}",
                    meta(obj, k),
                    meta(&out, k)
                )));
            }
        }
        restore_meta(obj, &mut out).map_err(|why| format!("returned invalid metadata: {why}"))?;
        Ok(out)
    }
}

/// Upstream's restoreObjectMeta: the original's metadata, with the converted object's
/// labels and annotations (which must be strings).
fn restore_meta(original: &Value, converted: &mut Value) -> Result<(), String> {
    let answered = match converted.get("metadata") {
        None => return Err("missing metadata in converted object".into()),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err("invalid metadata in converted object".into()),
    };
    let mut meta: Map<String, Value> = original
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for fld in ["labels", "annotations"] {
        match answered.get(fld) {
            None | Some(Value::Null) => {
                meta.remove(fld);
            }
            Some(Value::Object(m)) => {
                if let Some((k, _)) = m.iter().find(|(_, v)| !v.is_string()) {
                    return Err(format!(
                        "metadata.{fld}[{k}] must be a string in converted object"
                    ));
                }
                meta.insert(fld.into(), Value::Object(m.clone()));
            }
            Some(_) => return Err(format!("invalid metadata.{fld} in converted object")),
        }
    }
    if let Some(o) = converted.as_object_mut() {
        o.insert("metadata".into(), Value::Object(meta));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_comes_from_the_original_but_labels_and_annotations() {
        let original = json!({"metadata": {"name": "a", "uid": "u", "labels": {"x": "1"},
            "annotations": {"k": "v"}, "resourceVersion": "7"}});
        let mut converted = json!({"apiVersion": "g/v2", "metadata": {"name": "a", "uid": "u",
            "labels": {"y": "2"}, "resourceVersion": "0", "generation": 9}});
        restore_meta(&original, &mut converted).expect("restored");
        assert_eq!(
            converted["metadata"],
            json!({"name": "a", "uid": "u", "labels": {"y": "2"}, "resourceVersion": "7"})
        );
        let mut bad = json!({"metadata": {"labels": {"n": 1}}});
        assert!(restore_meta(&original, &mut bad).is_err());
        assert!(restore_meta(&original, &mut json!({})).is_err());
    }
}
