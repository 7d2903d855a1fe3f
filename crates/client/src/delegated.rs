//! Delegated authentication and authorization, as a component that serves its own HTTPS
//! endpoint does it (k8s.io/apiserver's delegating authenticator and authorizer, what
//! kube-controller-manager, kube-scheduler and metrics-server run): the trust comes from
//! `kube-system/extension-apiserver-authentication`, which the API server publishes.
//!
//! Who asks: the user a client certificate names when the cluster's client CA
//! (`client-ca-file`) signed it (common name, organizations as groups); the user the
//! aggregator's front proxy names in its headers when the front-proxy CA
//! (`requestheader-client-ca-file`) signed its certificate with an allowed name; else the
//! user of a bearer token, by TokenReview; else `system:anonymous`. What they may do: a
//! SubjectAccessReview, its answer kept for a while.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;
use k8s_openapi::api::core::v1::ConfigMap;
use parking_lot::Mutex;
use rustls::pki_types::CertificateDer;
use serde_json::{json, Value};

use crate::error::{Error, Result};

/// How long an authorization decision is reused (the delegating authorizer's cache).
const DECISION_TTL: Duration = Duration::from_secs(10);

/// Gives the client to call the API server with (a component's credentials may rotate).
pub type ClientFn = Arc<dyn Fn() -> kube::Client + Send + Sync>;

/// Who asks.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// The user of a request with no credentials.
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }
}

/// What a request is, for authorization.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Attributes {
    Resource {
        group: String,
        version: String,
        verb: String,
        resource: String,
        namespace: String,
        name: String,
    },
    NonResource {
        path: String,
        verb: String,
    },
}

impl Attributes {
    /// upstream's Forbidden message for `user` (`forbidden: User "x" cannot get path
    /// "/metrics"`, or the resource's).
    pub fn forbidden(&self, user: &User) -> String {
        match self {
            Attributes::NonResource { path, verb } => {
                format!(
                    "forbidden: User {:?} cannot {verb} path {path:?}",
                    user.name
                )
            }
            Attributes::Resource {
                group,
                verb,
                resource,
                namespace,
                ..
            } => {
                let scope = if namespace.is_empty() {
                    "at the cluster scope".to_owned()
                } else {
                    format!("in the namespace {namespace:?}")
                };
                format!(
                    "{resource}.{group} is forbidden: User {:?} cannot {verb} resource {resource:?} in API group {group:?} {scope}",
                    user.name
                )
            }
        }
    }
}

/// The aggregator's front-proxy trust: its CA's subjects, the names its client
/// certificate may have, and the headers that carry the user.
#[derive(Clone, Debug, Default)]
struct RequestHeader {
    ca_subjects: Vec<Vec<u8>>,
    allowed_names: Vec<String>,
    username_headers: Vec<String>,
    group_headers: Vec<String>,
    extra_prefixes: Vec<String>,
}

/// The delegating authenticator and authorizer.
pub struct Delegated {
    client: ClientFn,
    /// The subjects of the client CA's certificates.
    client_ca_subjects: Vec<Vec<u8>>,
    request_header: Option<RequestHeader>,
    decisions: Mutex<HashMap<(User, Attributes), (Instant, bool)>>,
}

/// A JSON array held in a ConfigMap value (`["X-Remote-User"]`).
fn json_list(cm: &ConfigMap, key: &str) -> Vec<String> {
    cm.data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// The certificates of a PEM bundle, and their subjects (DER).
fn certs_of(pem: &str) -> (Vec<CertificateDer<'static>>, Vec<Vec<u8>>) {
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut pem.as_bytes())
        .flatten()
        .collect();
    let subjects = certs
        .iter()
        .filter_map(|c| {
            x509_parser::parse_x509_certificate(c.as_ref())
                .ok()
                .map(|(_, x)| x.subject().as_raw().to_vec())
        })
        .collect();
    (certs, subjects)
}

impl Delegated {
    /// Reads the cluster's authentication trust and returns the delegator with the
    /// verifier of client certificates (both CAs; a client without one may still come
    /// with a token, or as anonymous). `None` verifier: the cluster publishes no CA.
    pub async fn load(
        client: ClientFn,
    ) -> Result<(
        Delegated,
        Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    )> {
        let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client(), "kube-system");
        let auth = cms.get("extension-apiserver-authentication").await?;
        let data = |k: &str| auth.data.as_ref().and_then(|d| d.get(k)).cloned();
        let mut roots = rustls::RootCertStore::empty();
        let mut client_ca_subjects = Vec::new();
        if let Some(pem) = data("client-ca-file") {
            let (certs, subjects) = certs_of(&pem);
            for c in certs {
                roots.add(c).map_err(|e| Error::Tls(e.to_string()))?;
            }
            client_ca_subjects = subjects;
        }
        let request_header = match data("requestheader-client-ca-file") {
            Some(pem) => {
                let (certs, ca_subjects) = certs_of(&pem);
                for c in certs {
                    roots.add(c).map_err(|e| Error::Tls(e.to_string()))?;
                }
                Some(RequestHeader {
                    ca_subjects,
                    allowed_names: json_list(&auth, "requestheader-allowed-names"),
                    username_headers: json_list(&auth, "requestheader-username-headers"),
                    group_headers: json_list(&auth, "requestheader-group-headers"),
                    extra_prefixes: json_list(&auth, "requestheader-extra-headers-prefix"),
                })
            }
            None => None,
        };
        let verifier = if roots.is_empty() {
            None
        } else {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| Error::Tls(e.to_string()))?;
            Some(v)
        };
        let delegated = Delegated {
            client,
            client_ca_subjects,
            request_header,
            decisions: Mutex::default(),
        };
        Ok((delegated, verifier))
    }

    /// Whether the connection's verified client certificate is the front proxy's (the
    /// request-header CA signed it and its name is allowed).
    pub fn is_front_proxy(&self, peer: Option<&[CertificateDer<'_>]>) -> bool {
        let (Some(rh), Some(leaf)) = (&self.request_header, peer.and_then(|p| p.first())) else {
            return false;
        };
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf.as_ref()) else {
            return false;
        };
        if !rh.ca_subjects.iter().any(|s| s == cert.issuer().as_raw()) {
            return false;
        }
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .unwrap_or_default();
        rh.allowed_names.is_empty() || rh.allowed_names.iter().any(|n| n == cn)
    }

    /// The user of a request on a connection whose verified client certificates are
    /// `peer`; `None` when its credentials are refused (401), anonymous when it has none.
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        peer: Option<&[CertificateDer<'_>]>,
    ) -> Option<User> {
        if self.is_front_proxy(peer) {
            return self.user_in_request_headers(headers);
        }
        if let Some(leaf) = peer.and_then(|p| p.first()) {
            if let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf.as_ref()) {
                if self
                    .client_ca_subjects
                    .iter()
                    .any(|s| s == cert.issuer().as_raw())
                {
                    let subject = cert.subject();
                    let name = subject
                        .iter_common_name()
                        .next()
                        .and_then(|c| c.as_str().ok())?
                        .to_owned();
                    let groups = subject
                        .iter_organization()
                        .filter_map(|o| o.as_str().ok().map(str::to_owned))
                        .collect();
                    return Some(User {
                        name,
                        groups,
                        extra: BTreeMap::new(),
                    });
                }
            }
        }
        let Some(auth) = headers.get(http::header::AUTHORIZATION) else {
            return Some(User::anonymous());
        };
        let token = auth
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")?
            .trim()
            .to_owned();
        let review = json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token},
        });
        let r = self
            .post("/apis/authentication.k8s.io/v1/tokenreviews", &review)
            .await?;
        if r.pointer("/status/authenticated") != Some(&Value::Bool(true)) {
            return None;
        }
        let u = r.pointer("/status/user")?;
        Some(User {
            name: u.get("username")?.as_str()?.to_owned(),
            groups: serde_json::from_value(u.get("groups").cloned().unwrap_or(json!([])))
                .unwrap_or_default(),
            extra: serde_json::from_value(u.get("extra").cloned().unwrap_or(json!({})))
                .unwrap_or_default(),
        })
    }

    /// The user the front proxy names in its headers.
    fn user_in_request_headers(&self, headers: &HeaderMap) -> Option<User> {
        let rh = self.request_header.as_ref()?;
        let all = |names: &[String]| -> Vec<String> {
            names
                .iter()
                .flat_map(|n| headers.get_all(n.as_str()).iter())
                .filter_map(|v| v.to_str().ok().map(str::to_owned))
                .collect()
        };
        let name = all(&rh.username_headers).into_iter().next()?;
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in headers {
            for p in &rh.extra_prefixes {
                if let Some(key) = k.as_str().strip_prefix(&p.to_ascii_lowercase()) {
                    if let Ok(v) = v.to_str() {
                        extra.entry(key.to_owned()).or_default().push(v.to_owned());
                    }
                }
            }
        }
        Some(User {
            name,
            groups: all(&rh.group_headers),
            extra,
        })
    }

    async fn post(&self, path: &str, body: &Value) -> Option<Value> {
        let req = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(body).ok()?)
            .ok()?;
        match (self.client)().request::<Value>(req).await {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::info!(error = %e, path, "delegated review failed");
                None
            }
        }
    }

    /// Whether `user` may do `attrs` (a SubjectAccessReview, its answer kept a while).
    pub async fn authorize(&self, user: &User, attrs: &Attributes) -> bool {
        let key = (user.clone(), attrs.clone());
        if let Some((at, allowed)) = self.decisions.lock().get(&key) {
            if at.elapsed() < DECISION_TTL {
                return *allowed;
            }
        }
        let mut spec = json!({"user": user.name, "groups": user.groups, "extra": user.extra});
        match attrs {
            Attributes::Resource {
                group,
                version,
                verb,
                resource,
                namespace,
                name,
            } => {
                spec["resourceAttributes"] = json!({
                    "group": group, "version": version, "resource": resource, "verb": verb,
                    "namespace": namespace, "name": name,
                });
            }
            Attributes::NonResource { path, verb } => {
                spec["nonResourceAttributes"] = json!({"path": path, "verb": verb});
            }
        }
        let review = json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec,
        });
        let allowed = self
            .post(
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                &review,
            )
            .await
            .and_then(|r| r.pointer("/status/allowed").and_then(Value::as_bool))
            .unwrap_or(false);
        let mut d = self.decisions.lock();
        if d.len() > 4096 {
            d.clear();
        }
        d.insert(key, (Instant::now(), allowed));
        allowed
    }
}
