//! The certificate controllers (upstream's pkg/controller/certificates): `approver`
//! (csrapproving) approves kubelet client CertificateSigningRequests after a
//! SubjectAccessReview, `signer` (csrsigning) issues the approved ones from the cluster CA,
//! `cleaner` (csrcleaner) deletes the old ones. This module holds what they share: the
//! parsed request and the per-signer rules.

pub mod approver;
pub mod cleaner;
pub mod signer;

use std::collections::BTreeSet;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

/// The ServiceAccount the three controllers act as.
pub const SERVICE_ACCOUNT: &str = "certificate-controller";

pub const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
pub const KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
pub const LEGACY_UNKNOWN: &str = "kubernetes.io/legacy-unknown";

/// What the controllers read from `spec.request`.
#[derive(Debug, Default, Clone)]
pub struct Request {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub emails: Vec<String>,
    pub ips: Vec<std::net::IpAddr>,
    pub uris: Vec<String>,
    /// The DER SubjectPublicKeyInfo.
    pub public_key: Vec<u8>,
    /// The DER subject.
    pub subject: Vec<u8>,
}

/// Parses the PEM CERTIFICATE REQUEST of `spec.request` and checks its signature.
pub fn parse_request(pem: &[u8]) -> Result<Request, String> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|_| "PEM block type must be CERTIFICATE REQUEST".to_owned())?;
    if block.label != "CERTIFICATE REQUEST" && block.label != "NEW CERTIFICATE REQUEST" {
        return Err("PEM block type must be CERTIFICATE REQUEST".into());
    }
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
            .map_err(|e| e.to_string())?;
    csr.verify_signature()
        .map_err(|e| format!("unable to verify certificate request signature: {e}"))?;
    let info = &csr.certification_request_info;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue| {
        a.as_str().map(str::to_owned).unwrap_or_default()
    };
    let mut r = Request {
        common_name: info
            .subject
            .iter_common_name()
            .next()
            .map(text)
            .unwrap_or_default(),
        organizations: info.subject.iter_organization().map(text).collect(),
        public_key: info.subject_pki.raw.to_vec(),
        subject: info.subject.as_raw().to_vec(),
        ..Default::default()
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => r.dns_names.push((*d).to_owned()),
                    GeneralName::RFC822Name(e) => r.emails.push((*e).to_owned()),
                    GeneralName::URI(u) => r.uris.push((*u).to_owned()),
                    GeneralName::IPAddress(b) => {
                        if let Ok(a) = <[u8; 4]>::try_from(*b) {
                            r.ips.push(a.into());
                        } else if let Ok(a) = <[u8; 16]>::try_from(*b) {
                            r.ips.push(a.into());
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(r)
}

/// The condition of `type_` that is True, if any.
pub fn condition<'a>(
    csr: &'a CertificateSigningRequest,
    type_: &str,
) -> Option<&'a CertificateSigningRequestCondition> {
    csr.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

/// Whether the request has been issued a certificate.
pub fn has_certificate(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
}

fn usage_set(usages: &[String]) -> BTreeSet<&str> {
    usages.iter().map(String::as_str).collect()
}

/// Go's `%v` of a sorted string list: `[a b c]`.
fn go_list(items: &[&str]) -> String {
    format!("[{}]", items.join(" "))
}

/// ValidateKubeletClientCSR: what a kubelet client certificate request must look like.
pub fn validate_kubelet_client(r: &Request, usages: &[String]) -> Result<(), String> {
    if r.organizations != ["system:nodes"] {
        return Err("subject organization is not system:nodes".into());
    }
    if !r.dns_names.is_empty() {
        return Err("DNS subjectAltNames are not allowed".into());
    }
    if !r.emails.is_empty() {
        return Err("Email subjectAltNames are not allowed".into());
    }
    if !r.ips.is_empty() {
        return Err("IP subjectAltNames are not allowed".into());
    }
    if !r.uris.is_empty() {
        return Err("URI subjectAltNames are not allowed".into());
    }
    if !r.common_name.starts_with("system:node:") {
        return Err("subject common name does not begin with system:node:".into());
    }
    let with_key = ["client auth", "digital signature", "key encipherment"];
    let u = usage_set(usages);
    if u != BTreeSet::from(with_key) && u != BTreeSet::from(["client auth", "digital signature"]) {
        return Err(format!("usages did not match {}", go_list(&with_key)));
    }
    Ok(())
}

/// ValidateKubeletServingCSR: what a kubelet serving certificate request must look like.
pub fn validate_kubelet_serving(r: &Request, usages: &[String]) -> Result<(), String> {
    if r.organizations != ["system:nodes"] {
        return Err("subject organization is not system:nodes".into());
    }
    if r.dns_names.is_empty() && r.ips.is_empty() {
        return Err("DNS or IP subjectAltName is required".into());
    }
    if !r.emails.is_empty() {
        return Err("Email subjectAltNames are not allowed".into());
    }
    if !r.uris.is_empty() {
        return Err("URI subjectAltNames are not allowed".into());
    }
    let with_key = ["digital signature", "key encipherment", "server auth"];
    let u = usage_set(usages);
    if u != BTreeSet::from(with_key) && u != BTreeSet::from(["digital signature", "server auth"]) {
        return Err(format!("usages did not match {}", go_list(&with_key)));
    }
    if !r.common_name.starts_with("system:node:") {
        return Err("subject common name does not begin with system:node:".into());
    }
    Ok(())
}

/// What the kube-apiserver-client signer accepts: client usages only, client auth among them.
pub fn validate_apiserver_client(usages: &[String]) -> Result<(), String> {
    for u in usages {
        if !["digital signature", "key encipherment", "client auth"].contains(&u.as_str()) {
            return Err(format!("invalid usage for client certificate: {u}"));
        }
    }
    if !usages.iter().any(|u| u == "client auth") {
        return Err("missing required usage for client certificate: client auth".into());
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A PEM CSR for `cn` / `orgs` with `dns` SANs.
    pub(crate) fn csr_pem(cn: &str, orgs: &[&str], dns: &[&str]) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn usages(u: &[&str]) -> Vec<String> {
        u.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn kubelet_client_requests_are_recognized() {
        let ok =
            parse_request(csr_pem("system:node:n1", &["system:nodes"], &[]).as_bytes()).unwrap();
        assert_eq!(ok.common_name, "system:node:n1");
        assert_eq!(ok.organizations, ["system:nodes"]);
        let u = usages(&["digital signature", "client auth"]);
        assert_eq!(validate_kubelet_client(&ok, &u), Ok(()));
        let u3 = usages(&["key encipherment", "digital signature", "client auth"]);
        assert_eq!(validate_kubelet_client(&ok, &u3), Ok(()));
        assert_eq!(
            validate_kubelet_client(&ok, &usages(&["client auth"])),
            Err("usages did not match [client auth digital signature key encipherment]".into())
        );
        let bad_org = parse_request(csr_pem("system:node:n1", &["x"], &[]).as_bytes()).unwrap();
        assert_eq!(
            validate_kubelet_client(&bad_org, &u),
            Err("subject organization is not system:nodes".into())
        );
        let bad_cn = parse_request(csr_pem("alice", &["system:nodes"], &[]).as_bytes()).unwrap();
        assert_eq!(
            validate_kubelet_client(&bad_cn, &u),
            Err("subject common name does not begin with system:node:".into())
        );
        let dns = parse_request(csr_pem("system:node:n1", &["system:nodes"], &["n1"]).as_bytes())
            .unwrap();
        assert_eq!(dns.dns_names, ["n1"]);
        assert_eq!(
            validate_kubelet_client(&dns, &u),
            Err("DNS subjectAltNames are not allowed".into())
        );
        let serving = usages(&["digital signature", "server auth"]);
        assert_eq!(validate_kubelet_serving(&dns, &serving), Ok(()));
        assert_eq!(
            validate_kubelet_serving(&ok, &serving),
            Err("DNS or IP subjectAltName is required".into())
        );
    }

    #[test]
    fn client_usages() {
        assert_eq!(
            validate_apiserver_client(&usages(&["digital signature", "client auth"])),
            Ok(())
        );
        assert_eq!(
            validate_apiserver_client(&usages(&["server auth", "client auth"])),
            Err("invalid usage for client certificate: server auth".into())
        );
        assert_eq!(
            validate_apiserver_client(&usages(&["digital signature"])),
            Err("missing required usage for client certificate: client auth".into())
        );
    }

    #[test]
    fn garbage_is_not_a_request() {
        assert!(parse_request(b"not pem").is_err());
        let cert = rcgen::CertificateParams::new(vec!["x".to_string()])
            .unwrap()
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap()
            .pem();
        assert_eq!(
            parse_request(cert.as_bytes()).unwrap_err(),
            "PEM block type must be CERTIFICATE REQUEST"
        );
    }
}
