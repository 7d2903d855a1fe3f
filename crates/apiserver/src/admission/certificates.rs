//! The certificates.k8s.io admission plugins, as upstream's: approving a
//! CertificateSigningRequest takes the `approve` verb on the synthetic `signers` resource
//! named by its signerName (CertificateApproval), issuing its certificate takes `sign`
//! (CertificateSigning), and nobody gets a `system:masters` client certificate from the
//! kube-apiserver-client signer (CertificateSubjectRestriction).

use std::sync::Arc;

use async_trait::async_trait;
use kumo_apimachinery::status::ApiError;
use serde_json::Value;

use super::quota::forbidden;
use super::{Attributes, Operation, Plugin};
use crate::auth::{authorize_with, Attributes as AuthzAttributes, Authorizer, Decision};

/// The signer whose certificates the API server itself trusts as client certificates.
const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";

/// Whether `a` is a write to `certificatesigningrequests` (with `sub` as subresource).
fn is_csr(a: &Attributes<'_>, sub: Option<&str>) -> bool {
    a.resource.group == "certificates.k8s.io"
        && a.resource.plural == "certificatesigningrequests"
        && a.subresource.filter(|s| !s.is_empty()) == sub
}

/// The signerName of the stored object: a request may not change it to get past the check.
fn old_signer<'v>(a: &'v Attributes<'_>) -> &'v str {
    a.old
        .and_then(|o| o.pointer("/spec/signerName"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Upstream's IsAuthorizedForSignerName: `verb` on `signers/<signerName>`, else on
/// `signers/<domain>/*`.
fn authorized_for_signer(
    authorizers: &[Arc<dyn Authorizer>],
    a: &Attributes<'_>,
    verb: &str,
    signer: &str,
) -> bool {
    let ask = |name: String| {
        let attrs = AuthzAttributes {
            user: a.user.clone(),
            verb: verb.to_owned(),
            resource_request: true,
            api_group: "certificates.k8s.io".into(),
            api_version: "*".into(),
            resource: "signers".into(),
            name,
            ..Default::default()
        };
        matches!(authorize_with(authorizers, &attrs), Decision::Allow(_))
    };
    if ask(signer.to_owned()) {
        return true;
    }
    let domain = signer.split('/').next().unwrap_or(signer);
    ask(format!("{domain}/*"))
}

/// `CertificateApproval`: updates of `certificatesigningrequests/approval`.
pub struct CertificateApproval {
    authorizers: Vec<Arc<dyn Authorizer>>,
}

impl CertificateApproval {
    pub fn new(authorizers: Vec<Arc<dyn Authorizer>>) -> Self {
        CertificateApproval { authorizers }
    }
}

#[async_trait]
impl Plugin for CertificateApproval {
    fn name(&self) -> &'static str {
        "CertificateApproval"
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        if a.operation != Operation::Update || !is_csr(a, Some("approval")) {
            return Ok(());
        }
        let signer = old_signer(a);
        if authorized_for_signer(&self.authorizers, a, "approve", signer) {
            return Ok(());
        }
        Err(forbidden(
            a,
            obj,
            &format!("user not permitted to approve requests with signerName {signer:?}"),
        ))
    }
}

/// `CertificateSigning`: updates of `certificatesigningrequests/status` that change the
/// certificate or the conditions.
pub struct CertificateSigning {
    authorizers: Vec<Arc<dyn Authorizer>>,
}

impl CertificateSigning {
    pub fn new(authorizers: Vec<Arc<dyn Authorizer>>) -> Self {
        CertificateSigning { authorizers }
    }
}

#[async_trait]
impl Plugin for CertificateSigning {
    fn name(&self) -> &'static str {
        "CertificateSigning"
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        if a.operation != Operation::Update || !is_csr(a, Some("status")) {
            return Ok(());
        }
        let at = |v: Option<&Value>, p: &str| v.and_then(|o| o.pointer(p)).cloned();
        let changed = |p: &str| {
            let (old, new) = (at(a.old, p), at(obj, p));
            let empty = |v: &Option<Value>| match v {
                None | Some(Value::Null) => true,
                Some(Value::String(s)) => s.is_empty(),
                Some(Value::Array(l)) => l.is_empty(),
                _ => false,
            };
            !(old == new || empty(&old) && empty(&new))
        };
        if !changed("/status/certificate") && !changed("/status/conditions") {
            return Ok(());
        }
        let signer = old_signer(a);
        if authorized_for_signer(&self.authorizers, a, "sign", signer) {
            return Ok(());
        }
        Err(forbidden(
            a,
            obj,
            &format!("user not permitted to sign requests with signerName {signer:?}"),
        ))
    }
}

/// `CertificateSubjectRestriction`: creates of kube-apiserver-client requests.
pub struct CertificateSubjectRestriction;

#[async_trait]
impl Plugin for CertificateSubjectRestriction {
    fn name(&self) -> &'static str {
        "CertificateSubjectRestriction"
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        if a.operation != Operation::Create || !is_csr(a, None) {
            return Ok(());
        }
        let Some(csr) = obj else { return Ok(()) };
        if csr.pointer("/spec/signerName").and_then(Value::as_str) != Some(KUBE_APISERVER_CLIENT) {
            return Ok(());
        }
        let orgs = request_organizations(csr)
            .map_err(|e| forbidden(a, obj, &format!("failed to parse CSR: {e}")))?;
        if orgs.iter().any(|o| o == "system:masters") {
            return Err(forbidden(
                a,
                obj,
                "use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed",
            ));
        }
        Ok(())
    }
}

/// The subject organizations of the CSR in `spec.request` (base64 of a PEM block).
fn request_organizations(csr: &Value) -> Result<Vec<String>, String> {
    use base64::Engine;
    use x509_parser::prelude::FromDer;
    let b64 = csr
        .pointer("/spec/request")
        .and_then(Value::as_str)
        .unwrap_or("");
    let pem = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| e.to_string())?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem)
        .map_err(|_| "PEM block type must be CERTIFICATE REQUEST".to_owned())?;
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
            .map_err(|e| e.to_string())?;
    Ok(req
        .certification_request_info
        .subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn organizations_are_read_from_the_request() {
        use base64::Engine;
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "mallory");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        let csr = serde_json::json!({"spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(pem),
        }});
        assert_eq!(request_organizations(&csr).unwrap(), ["system:masters"]);
        let bad = serde_json::json!({"spec": {"request": "bm90IGEgY3Ny"}});
        assert!(request_organizations(&bad).is_err());
    }
}
