//! The cloud's own CA and serving certificate, and the files clients find it by.
//!
//! At first start the data directory gets `ca.crt`/`ca.key` (CN `kumo-cloud-ca`) and
//! `server.crt`/`server.key` for `localhost`, `127.0.0.1`, `::1` and the bind address; the
//! serving certificate is reissued when the bind address is not in it. Each start writes
//! `endpoint.json` (URL and CA file); `credentials.json` (0600) holds the admin access key.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use serde::{Deserialize, Serialize};

use crate::state::write_atomic;

/// `ca.crt`.
pub const CA_FILE: &str = "ca.crt";
/// `endpoint.json`.
pub const ENDPOINT_FILE: &str = "endpoint.json";
/// `credentials.json`.
pub const CREDENTIALS_FILE: &str = "credentials.json";

/// `endpoint.json`: where the cloud serves and the CA that signed its certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointFile {
    /// e.g. `https://127.0.0.1:38443`.
    pub url: String,
    /// Absolute path of `ca.crt`.
    pub ca_file: PathBuf,
    /// `kumo-1`.
    pub region: String,
}

/// `credentials.json`: an access key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsFile {
    /// Access key id.
    pub access_key_id: String,
    /// Secret.
    pub secret_access_key: String,
}

fn gen_err(e: rcgen::Error) -> String {
    format!("generating the cloud's certificates: {e}")
}

fn read(p: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(p) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

fn write_public(p: &Path, data: &str) -> Result<(), String> {
    write_atomic(p, data.as_bytes())?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// The CA's certificate PEM and the serving certificate and key PEMs, created or loaded.
pub struct Pki {
    /// CA certificate PEM.
    pub ca_pem: String,
    /// Serving certificate PEM.
    pub cert_pem: String,
    /// Serving key PEM.
    pub key_pem: String,
}

/// Loads or creates the CA and a serving certificate covering `bind`.
pub fn ensure(dir: &Path, bind: IpAddr) -> Result<Pki, String> {
    let ca_crt = dir.join(CA_FILE);
    let ca_key = dir.join("ca.key");
    let (ca_pem, ca_key_pem) = match (read(&ca_crt)?, read(&ca_key)?) {
        (Some(c), Some(k)) => (c, k),
        _ => {
            let key = KeyPair::generate().map_err(gen_err)?;
            let mut p = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
            let mut dn = DistinguishedName::new();
            dn.push(DnType::CommonName, "kumo-cloud-ca");
            p.distinguished_name = dn;
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyCertSign,
            ];
            validity(&mut p, 3650);
            let cert = p.self_signed(&key).map_err(gen_err)?;
            write_atomic(&ca_key, key.serialize_pem().as_bytes())?;
            write_public(&ca_crt, &cert.pem())?;
            (cert.pem(), key.serialize_pem())
        }
    };
    let crt = dir.join("server.crt");
    let key = dir.join("server.key");
    let ips: Vec<IpAddr> = {
        let mut v: Vec<IpAddr> = vec![[127, 0, 0, 1].into(), std::net::Ipv6Addr::LOCALHOST.into()];
        if !bind.is_unspecified() && !v.contains(&bind) {
            v.push(bind);
        }
        v
    };
    let marker = dir.join("server.sans");
    let sans = ips
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    if let (Some(c), Some(k), Some(m)) = (read(&crt)?, read(&key)?, read(&marker)?) {
        if m == sans {
            return Ok(Pki {
                ca_pem,
                cert_pem: c,
                key_pem: k,
            });
        }
    }
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|e| format!("ca.key: {e}"))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, &ca_key).map_err(gen_err)?;
    let leaf = KeyPair::generate().map_err(gen_err)?;
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "kumo-cloud");
    p.distinguished_name = dn;
    p.subject_alt_names
        .push(SanType::DnsName("localhost".try_into().map_err(gen_err)?));
    for ip in &ips {
        p.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut p, 365);
    let cert = p.signed_by(&leaf, &issuer).map_err(gen_err)?;
    write_atomic(&key, leaf.serialize_pem().as_bytes())?;
    write_public(&crt, &cert.pem())?;
    write_public(&marker, &sans)?;
    Ok(Pki {
        ca_pem,
        cert_pem: cert.pem(),
        key_pem: leaf.serialize_pem(),
    })
}

fn validity(p: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::minutes(5);
    p.not_after = now + time::Duration::days(days);
}

/// The TLS server configuration (HTTP/2 and HTTP/1.1 by ALPN).
pub fn server_config(pki: &Pki) -> Result<Arc<rustls::ServerConfig>, String> {
    let certs = rustls_pemfile::certs(&mut pki.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("server.crt: {e}"))?;
    let key = rustls_pemfile::private_key(&mut pki.key_pem.as_bytes())
        .map_err(|e| format!("server.key: {e}"))?
        .ok_or("server.key: no private key")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("serving certificate: {e}"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A TLS client configuration trusting only `ca_pem`, offering HTTP/2.
pub fn client_config(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        let c = c.map_err(|e| format!("CA certificate: {e}"))?;
        roots.add(c).map_err(|e| format!("CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("no CA certificate in the CA file".to_owned());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}
