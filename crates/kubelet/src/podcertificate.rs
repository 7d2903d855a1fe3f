//! The podCertificate projection (certificates.k8s.io/v1 PodCertificateRequest), as
//! upstream's podcertificate manager does it: for each projected `podCertificate` source of
//! a pod, a private key of the requested type is made on the node, a PodCertificateRequest
//! carrying a stub PKCS#10 request signed by it (the proof of possession) is created for
//! the pod, its ServiceAccount and node, and once a signer has issued it the key and the
//! certificate chain become the volume's files. Until then, or when the request is denied
//! or failed, the volume cannot be set up (the pod waits with FailedMount, retried).
//!
//! The keys never leave the kubelet. Key types: ECDSAP256, ECDSAP384 and ED25519 (what this
//! kubelet's crypto library generates); RSA3072, RSA4096 and ECDSAP521 fail to set up the
//! volume with a message saying so.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use base64::Engine;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use serde_json::{json, Map, Value};

const API: &str = "/apis/certificates.k8s.io/v1";

/// A projection: pod uid, volume name, source index.
type Key = (String, String, usize);

#[derive(Clone, Debug)]
enum State {
    /// A request was made; waiting for the signer.
    Wait { key_pem: String, request: String },
    /// Issued: the key and chain, and when to ask for a new one.
    Fresh {
        key_pem: String,
        chain: String,
        refresh_at: Option<Timestamp>,
        /// A renewal under way: (key, request).
        renewing: Option<(String, String)>,
    },
    /// Denied or failed for good (the message the volume shows).
    Final(String),
}

/// Every projection of every pod on this node.
static STORE: LazyLock<Mutex<HashMap<Key, State>>> = LazyLock::new(Mutex::default);

fn store() -> std::sync::MutexGuard<'static, HashMap<Key, State>> {
    STORE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The entry name of a projection in the pod's sources.
pub fn key(volume: &str, index: usize) -> String {
    format!("{volume}/{index}")
}

fn str_at<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// A new private key (PKCS#8 PEM) and a stub PKCS#10 request signed by it (DER).
fn key_and_proof(key_type: &str) -> Result<(String, Vec<u8>), String> {
    let alg = match key_type {
        "ECDSAP256" => &rcgen::PKCS_ECDSA_P256_SHA256,
        "ECDSAP384" => &rcgen::PKCS_ECDSA_P384_SHA384,
        "ED25519" => &rcgen::PKCS_ED25519,
        "RSA3072" | "RSA4096" | "ECDSAP521" => {
            return Err(format!(
                "while generating keypair: key type {key_type:?} is not supported by this kubelet (ECDSAP256, ECDSAP384, ED25519)"
            ))
        }
        other => return Err(format!("while generating keypair: unknown key type {other:?}")),
    };
    let key =
        rcgen::KeyPair::generate_for(alg).map_err(|e| format!("while generating keypair: {e}"))?;
    let mut params = rcgen::CertificateParams::default();
    // A stub request: no subject, only the key and its signature.
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params
        .serialize_request(&key)
        .map_err(|e| format!("while generating stub PKCS#10 request: {e}"))?;
    Ok((key.serialize_pem(), csr.der().to_vec()))
}

async fn get(client: &Client, path: String) -> Result<Value, String> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request::<Value>(req)
        .await
        .map_err(|e| e.to_string())
}

/// Creates the PodCertificateRequest of `source` for `pod`; returns its name.
async fn create_request(
    client: &Client,
    pod: &Value,
    source: &Value,
    der: &[u8],
) -> Result<String, String> {
    let ns = str_at(pod, "/metadata/namespace");
    let sa = match str_at(pod, "/spec/serviceAccountName") {
        "" => "default",
        s => s,
    };
    let node = str_at(pod, "/spec/nodeName");
    let sa_obj = get(
        client,
        format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}"),
    )
    .await?;
    let node_obj = get(client, format!("/api/v1/nodes/{node}")).await?;
    let mut spec = json!({
        "signerName": source.get("signerName").cloned().unwrap_or(Value::Null),
        "podName": str_at(pod, "/metadata/name"),
        "podUID": str_at(pod, "/metadata/uid"),
        "serviceAccountName": sa,
        "serviceAccountUID": str_at(&sa_obj, "/metadata/uid"),
        "nodeName": node,
        "nodeUID": str_at(&node_obj, "/metadata/uid"),
        "stubPKCS10Request": base64::engine::general_purpose::STANDARD.encode(der),
    });
    if let Some(m) = source.get("maxExpirationSeconds") {
        spec["maxExpirationSeconds"] = m.clone();
    }
    if let Some(a) = source.get("userAnnotations").filter(|a| a.is_object()) {
        spec["unverifiedUserAnnotations"] = a.clone();
    }
    let body = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "PodCertificateRequest",
        "metadata": {
            "namespace": ns,
            "generateName": "req-",
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod",
                "name": str_at(pod, "/metadata/name"), "uid": str_at(pod, "/metadata/uid"),
            }],
        },
        "spec": spec,
    });
    let req = http::Request::post(format!("{API}/namespaces/{ns}/podcertificaterequests"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let created: Value = client
        .request(req)
        .await
        .map_err(|e| format!("while creating on API: {e}"))?;
    Ok(str_at(&created, "/metadata/name").to_owned())
}

/// What became of a request: None while pending, Ok((chain, refresh at)) when issued,
/// Err(message) when denied or failed.
async fn outcome(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<(String, Option<Timestamp>)>, String> {
    let pcr = get(
        client,
        format!("{API}/namespaces/{ns}/podcertificaterequests/{name}"),
    )
    .await
    .map_err(|e| format!("reading PodCertificateRequest {ns}/{name}: {e}"))?;
    for c in pcr
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if str_at(c, "/status") != "True" {
            continue;
        }
        let (reason, message) = (str_at(c, "/reason"), str_at(c, "/message"));
        match str_at(c, "/type") {
            "Issued" => {
                let chain = str_at(&pcr, "/status/certificateChain").to_owned();
                let refresh = str_at(&pcr, "/status/beginRefreshAt").parse().ok();
                return Ok(Some((chain, refresh)));
            }
            "Denied" => {
                return Err(format!(
                    "PodCertificateRequest was permanently denied: reason={reason:?} message={message:?}"
                ))
            }
            "Failed" => {
                return Err(format!(
                    "PodCertificateRequest was permanently failed: reason={reason:?} message={message:?}"
                ))
            }
            _ => {}
        }
    }
    Ok(None)
}

/// One projection's step: make or follow its request; the credential when there is one.
async fn step(
    client: &Client,
    pod: &Value,
    source: &Value,
    k: &Key,
) -> Result<(String, String), String> {
    let ns = str_at(pod, "/metadata/namespace");
    let current = store().get(k).cloned();
    match current {
        None => {
            let (key_pem, der) = key_and_proof(str_at(source, "/keyType"))?;
            let request = create_request(client, pod, source, &der).await?;
            store().insert(k.clone(), State::Wait { key_pem, request });
            Err("credential bundle is not issued yet".into())
        }
        Some(State::Wait { key_pem, request }) => match outcome(client, ns, &request).await {
            Ok(None) => Err("credential bundle is not issued yet".into()),
            Ok(Some((chain, refresh_at))) => {
                store().insert(
                    k.clone(),
                    State::Fresh {
                        key_pem: key_pem.clone(),
                        chain: chain.clone(),
                        refresh_at,
                        renewing: None,
                    },
                );
                Ok((key_pem, chain))
            }
            Err(e) if e.starts_with("PodCertificateRequest was permanently") => {
                store().insert(k.clone(), State::Final(e.clone()));
                Err(e)
            }
            Err(e) => Err(e),
        },
        Some(State::Fresh {
            key_pem,
            chain,
            refresh_at,
            renewing,
        }) => {
            let due = refresh_at.is_some_and(|t| t <= Timestamp::now());
            match renewing {
                None if due => {
                    // Renew beside the credential in use, which stays until replaced.
                    if let Ok((new_key, der)) = key_and_proof(str_at(source, "/keyType")) {
                        if let Ok(request) = create_request(client, pod, source, &der).await {
                            if let Some(State::Fresh { renewing, .. }) = store().get_mut(k) {
                                *renewing = Some((new_key, request));
                            }
                        }
                    }
                }
                Some((new_key, request)) => {
                    if let Ok(Some((new_chain, refresh_at))) = outcome(client, ns, &request).await {
                        store().insert(
                            k.clone(),
                            State::Fresh {
                                key_pem: new_key.clone(),
                                chain: new_chain.clone(),
                                refresh_at,
                                renewing: None,
                            },
                        );
                        return Ok((new_key, new_chain));
                    }
                }
                None => {}
            }
            Ok((key_pem, chain))
        }
        Some(State::Final(e)) => Err(e),
    }
}

/// The credentials of `pod`'s podCertificate projections, by [`key`]: `{"key", "chain"}`
/// when issued, `{"error"}` otherwise.
pub async fn fetch(client: &Client, pod: &Value) -> Map<String, Value> {
    let uid = str_at(pod, "/metadata/uid").to_owned();
    let mut out = Map::new();
    for vol in pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let vname = str_at(vol, "/name");
        for (i, src) in vol
            .pointer("/projected/sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let Some(pc) = src.get("podCertificate") else {
                continue;
            };
            let k = (uid.clone(), vname.to_owned(), i);
            let entry = match step(client, pod, pc, &k).await {
                Ok((key_pem, chain)) => json!({"key": key_pem, "chain": chain}),
                Err(e) => json!({"error": e}),
            };
            out.insert(key(vname, i), entry);
        }
    }
    out
}

/// Forgets the projections of a pod that is gone.
pub fn forget(pod_uid: &str) {
    store().retain(|(uid, _, _), _| uid != pod_uid);
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer;

    #[test]
    fn keys_and_stub_requests() {
        for t in ["ECDSAP256", "ECDSAP384", "ED25519"] {
            let (pem, der) = key_and_proof(t).unwrap();
            assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{t}");
            let (_, csr) =
                x509_parser::certification_request::X509CertificationRequest::from_der(&der)
                    .unwrap();
            csr.verify_signature().unwrap();
            assert_eq!(csr.certification_request_info.subject.iter().count(), 0);
        }
        let e = key_and_proof("RSA3072").unwrap_err();
        assert!(e.contains("not supported"), "{e}");
    }
}
