//! Authentication by x509 client certificate: the TLS layer has already verified the
//! chain against the cluster CA (and the client-auth usage and validity); the user is the
//! subject's CommonName and the groups its Organizations, as upstream's x509 authenticator
//! reads them.

use super::UserInfo;

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
