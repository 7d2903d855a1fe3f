//! Authentication by x509 client certificate. The TLS handshake only checks that the
//! client holds the certificate's key; the chain (the cluster CA, the client-auth usage,
//! the validity period) is verified here, so a bad certificate gets upstream's 401 rather
//! than a failed handshake. The user is the subject's CommonName and the groups its
//! Organizations, as upstream's x509 authenticator reads them.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;

use super::UserInfo;

/// What a connection's client certificate says about its requests' user.
#[derive(Clone, Debug)]
pub enum ClientCert {
    /// None presented.
    Absent,
    /// A certificate of the cluster CA that names a user.
    User(Arc<UserInfo>),
    /// Presented but not valid (another CA, expired, no client-auth usage, no name): its
    /// requests fail authentication unless a bearer token authenticates them.
    Invalid,
}

/// Verifies client certificate chains against the cluster CA at authentication time.
#[derive(Debug, Clone)]
pub struct Verifier(pub Arc<dyn ClientCertVerifier>);

impl Verifier {
    /// The connection's certificate chain (leaf first), judged.
    pub fn check(&self, chain: Option<&[CertificateDer<'static>]>) -> ClientCert {
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
            return ClientCert::Absent;
        };
        if let Err(e) = self
            .0
            .verify_client_cert(leaf, intermediates, UnixTime::now())
        {
            tracing::debug!(error = %e, "client certificate refused");
            return ClientCert::Invalid;
        }
        match user_of(leaf) {
            Some(u) => ClientCert::User(Arc::new(u)),
            None => ClientCert::Invalid,
        }
    }
}

/// Accepts any client certificate in the handshake (the client still proves it holds the
/// key: the handshake signatures are checked), leaving the chain to [`Verifier`], as
/// kube-apiserver requests client certificates without verifying them in TLS.
#[derive(Debug)]
pub struct DeferredVerifier(pub Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for DeferredVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.0.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The user of a verified client certificate (DER), or `None` when it names no user.
pub fn user_of(cert_der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_owned();
    if name.is_empty() {
        return None;
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_owned)
        .collect();
    let mut user = UserInfo::authenticated(name, groups);
    // Which certificate authenticated, as upstream records it (shown by `kubectl auth
    // whoami` and in audit events).
    let digest = ring::digest::digest(&ring::digest::SHA256, cert_der);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    user.extra.insert(
        "authentication.kubernetes.io/credential-id".into(),
        vec![format!("X509SHA256={hex}")],
    );
    Some(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cn_and_organizations() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = crate::pki::Ca::load_or_create(dir.path()).expect("ca");
        let ck = ca
            .issue_client("system:node:n1", &["system:nodes"])
            .expect("issue");
        let der = rustls_pemfile::certs(&mut ck.cert_pem.as_bytes())
            .next()
            .expect("one cert")
            .expect("pem");
        let u = user_of(&der).expect("user");
        assert_eq!(u.name, "system:node:n1");
        assert_eq!(u.groups, vec!["system:nodes", "system:authenticated"]);
        assert_eq!(u.node_name(), Some("n1"));
        let id = &u.extra["authentication.kubernetes.io/credential-id"][0];
        assert!(id.starts_with("X509SHA256=") && id.len() == 11 + 64, "{id}");
        assert!(user_of(b"not a certificate").is_none());
    }
}
