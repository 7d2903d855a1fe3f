//! ClusterTrustBundle projections (`projected.sources[].clusterTrustBundle`), as upstream's
//! kubelet clustertrustbundle manager serves them: one bundle by name, or every bundle of a
//! signer whose labels match a selector (a missing selector matches nothing, an empty one
//! everything). The anchors are deduplicated and written back as `CERTIFICATE` PEM blocks.
//!
//! What was read travels with the pod's sources under `trustBundles`, keyed by [`key`]:
//! `{"pem": ...}`, or `{"missing": true}` when nothing matched (an optional projection is
//! then an empty file).

use std::collections::BTreeSet;

use base64::Engine;
use kube::Client;
use serde_json::{json, Value};

const API: &str = "/apis/certificates.k8s.io/v1/clustertrustbundles";

/// Where a projection's anchors are kept in the pod's sources.
pub fn key(src: &Value) -> String {
    if let Some(name) = src.get("name").and_then(Value::as_str) {
        return format!("name:{name}");
    }
    let signer = src.get("signerName").and_then(Value::as_str).unwrap_or("");
    match src.get("labelSelector").filter(|s| !s.is_null()) {
        Some(sel) => format!("signer:{signer}:{}", selector_string(sel)),
        None => format!("signer:{signer}:<nil>"),
    }
}

/// A LabelSelector as the `labelSelector` query parameter spells it.
fn selector_string(sel: &Value) -> String {
    let mut parts = Vec::new();
    for (k, v) in sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        parts.push(format!("{k}={}", v.as_str().unwrap_or("")));
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let k = e.get("key").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        match e.get("operator").and_then(Value::as_str).unwrap_or("") {
            "In" => parts.push(format!("{k} in ({})", values.join(","))),
            "NotIn" => parts.push(format!("{k} notin ({})", values.join(","))),
            "Exists" => parts.push(k.to_owned()),
            "DoesNotExist" => parts.push(format!("!{k}")),
            _ => {}
        }
    }
    parts.join(",")
}

/// Percent-encodes a query parameter value.
fn query_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The deduplicated anchors of `bundles` (PEM text each), as `CERTIFICATE` blocks.
/// Upstream shuffles them once per kubelet start; here they are in DER order.
fn normalize<'a>(bundles: impl IntoIterator<Item = &'a str>) -> String {
    let mut anchors = BTreeSet::new();
    for bundle in bundles {
        let mut body: Option<String> = None;
        for line in bundle.lines() {
            let line = line.trim();
            if line.starts_with("-----BEGIN ") {
                body = Some(String::new());
            } else if line.starts_with("-----END ") {
                if let Some(b) = body.take() {
                    if let Ok(der) = base64::engine::general_purpose::STANDARD.decode(b) {
                        anchors.insert(der);
                    }
                }
            } else if let Some(b) = body.as_mut() {
                // PEM headers (`Key: value`) are not part of the body.
                if !line.contains(':') {
                    b.push_str(line);
                }
            }
        }
    }
    let mut out = String::new();
    for der in anchors {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        for chunk in b64.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(chunk));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

fn trust_bundle(ctb: &Value) -> &str {
    ctb.pointer("/spec/trustBundle")
        .and_then(Value::as_str)
        .unwrap_or("")
}

async fn get(client: &Client, path: String) -> Result<Value, kube::Error> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request::<Value>(req).await
}

/// Reads the bundles `pod`'s projections name. A read that fails for another reason than
/// "not found" leaves its entry out (the projection is an empty file until a later read).
pub async fn fetch(client: &Client, pod: &Value) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    let sources = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/projected/sources").and_then(Value::as_array))
        .flatten()
        .filter_map(|s| s.get("clusterTrustBundle"))
        .cloned()
        .collect::<Vec<Value>>();
    for src in &sources {
        let key = key(src);
        if out.contains_key(&key) {
            continue;
        }
        let entry = if let Some(name) = src.get("name").and_then(Value::as_str) {
            match get(client, format!("{API}/{name}")).await {
                Ok(ctb) => json!({"pem": normalize([trust_bundle(&ctb)])}),
                Err(kube::Error::Api(e)) if e.code == 404 => json!({"missing": true}),
                Err(e) => {
                    tracing::warn!(bundle = %name, "reading a ClusterTrustBundle: {e}");
                    continue;
                }
            }
        } else {
            let signer = src.get("signerName").and_then(Value::as_str).unwrap_or("");
            match src.get("labelSelector").filter(|s| !s.is_null()) {
                // No selector matches nothing.
                None => json!({"missing": true}),
                Some(sel) => {
                    let path = format!(
                        "{API}?labelSelector={}",
                        query_escape(&selector_string(sel))
                    );
                    match get(client, path).await {
                        Ok(list) => {
                            let items: Vec<&Value> = list["items"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter(|c| {
                                    c.pointer("/spec/signerName").and_then(Value::as_str)
                                        == Some(signer)
                                })
                                .collect();
                            if items.is_empty() {
                                json!({"missing": true})
                            } else {
                                json!({"pem": normalize(items.into_iter().map(trust_bundle))})
                            }
                        }
                        Err(e) => {
                            tracing::warn!(signer = %signer, "listing ClusterTrustBundles: {e}");
                            continue;
                        }
                    }
                }
            }
        };
        out.insert(key, entry);
    }
    out
}

/// The file content of projection `src` from the pod's sources (empty when missing).
pub fn content(sources: Option<&Value>, src: &Value) -> String {
    sources
        .and_then(|s| s.get("trustBundles"))
        .and_then(|t| t.get(key(src)))
        .and_then(|e| e.get("pem"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(der: &[u8]) -> String {
        let b = base64::engine::general_purpose::STANDARD.encode(der);
        format!("-----BEGIN CERTIFICATE-----\n{b}\n-----END CERTIFICATE-----\n")
    }

    #[test]
    fn anchors_are_deduplicated_and_rewritten() {
        let (a, b) = (pem(b"anchor-a"), pem(b"anchor-b"));
        let both = format!("{b}\n{a}");
        let out = normalize([both.as_str(), a.as_str()]);
        assert_eq!(out, format!("{a}{b}"));
        // Long bodies are wrapped at 64 columns.
        let long = pem(&[7u8; 100]);
        let out = normalize([long.as_str()]);
        assert!(out.lines().all(|l| l.len() <= 64), "{out}");
        assert_eq!(out.lines().count(), 5);
        assert_eq!(normalize(["not pem"]), "");
    }

    #[test]
    fn keys_and_selectors() {
        assert_eq!(key(&json!({"name": "b1", "path": "p"})), "name:b1");
        assert_eq!(
            key(&json!({"signerName": "x.io/s", "path": "p"})),
            "signer:x.io/s:<nil>"
        );
        assert_eq!(
            key(&json!({"signerName": "x.io/s", "labelSelector": {}})),
            "signer:x.io/s:"
        );
        let sel = json!({"matchLabels": {"alive": "true"}, "matchExpressions": [
            {"key": "a", "operator": "In", "values": ["1", "2"]},
            {"key": "b", "operator": "DoesNotExist"}]});
        assert_eq!(selector_string(&sel), "alive=true,a in (1,2),!b");
        assert_eq!(query_escape("a in (1,2)"), "a%20in%20%281%2C2%29");
    }

    #[test]
    fn content_reads_the_sources() {
        let src = json!({"name": "b1", "path": "ca.pem"});
        let sources = json!({"trustBundles": {"name:b1": {"pem": "PEM"}}});
        assert_eq!(content(Some(&sources), &src), "PEM");
        let missing = json!({"trustBundles": {"name:b1": {"missing": true}}});
        assert_eq!(content(Some(&missing), &src), "");
        assert_eq!(content(None, &src), "");
    }
}
