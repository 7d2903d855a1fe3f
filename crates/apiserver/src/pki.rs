//! The cluster's certificates, generated at first start and laid out like kubeadm's
//! `/etc/kubernetes/pki`: a CA, the API server's serving certificate, and client
//! certificates for the identities that get a kubeconfig.
//!
//! Keys are written with mode 0600. Nothing here is ever committed: it is created at run
//! time in the data directory.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// PKI errors.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, PkiError>;

/// kubeadm's validity periods: CA ten years, leaf certificates one year.
const CA_DAYS: i64 = 3650;
const LEAF_DAYS: i64 = 365;

/// The certificate authority, loaded or created.
pub struct Ca {
    pub cert_pem: String,
    key: KeyPair,
}

/// A certificate and its key, PEM-encoded.
pub struct CertAndKey {
    pub cert_pem: String,
    pub key_pem: String,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PkiError + '_ {
    move |source| PkiError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `data` to `path` with `mode`, creating parent directories.
pub fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(data).map_err(io_err(path))?;
    // The mode given at creation does not apply to an existing file.
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err(path))?;
    Ok(())
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = OffsetDateTime::now_utc();
    // Like kubeadm, valid from a little before now, to tolerate clock skew.
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + Duration::days(days);
}

impl Ca {
    /// Loads `dir/ca.crt` and `dir/ca.key`, or creates them.
    pub fn load_or_create(dir: &Path) -> Result<Ca> {
        let crt = dir.join("ca.crt");
        let key = dir.join("ca.key");
        if crt.exists() && key.exists() {
            let cert_pem = fs::read_to_string(&crt).map_err(io_err(&crt))?;
            let key_pem = fs::read_to_string(&key).map_err(io_err(&key))?;
            return Ok(Ca {
                cert_pem,
                key: KeyPair::from_pem(&key_pem)?,
            });
        }
        let key_pair = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "kubernetes");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::KeyCertSign,
        ];
        validity(&mut params, CA_DAYS);
        let cert = params.self_signed(&key_pair)?;
        write_file(&key, key_pair.serialize_pem().as_bytes(), 0o600)?;
        write_file(&crt, cert.pem().as_bytes(), 0o644)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key: key_pair,
        })
    }

    fn issuer(&self) -> Result<Issuer<'_, &KeyPair>> {
        Ok(Issuer::from_ca_cert_pem(&self.cert_pem, &self.key)?)
    }

    /// Issues a serving certificate for these DNS names and IP addresses.
    pub fn issue_serving(&self, cn: &str, dns: &[String], ips: &[IpAddr]) -> Result<CertAndKey> {
        let key_pair = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        for d in dns {
            params
                .subject_alt_names
                .push(SanType::DnsName(d.clone().try_into()?));
        }
        for ip in ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params, LEAF_DAYS);
        let cert = params.signed_by(&key_pair, &self.issuer()?)?;
        Ok(CertAndKey {
            cert_pem: cert.pem(),
            key_pem: key_pair.serialize_pem(),
        })
    }

    /// Issues a client certificate: CN is the user name, O the groups.
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<CertAndKey> {
        let key_pair = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        for g in groups {
            dn.push(DnType::OrganizationName, *g);
        }
        dn.push(DnType::CommonName, user);
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        validity(&mut params, LEAF_DAYS);
        let cert = params.signed_by(&key_pair, &self.issuer()?)?;
        Ok(CertAndKey {
            cert_pem: cert.pem(),
            key_pem: key_pair.serialize_pem(),
        })
    }
}

/// Loads `dir/<name>.crt` and `.key`, or issues them with `issue` and writes them.
pub fn load_or_issue(
    dir: &Path,
    name: &str,
    issue: impl FnOnce() -> Result<CertAndKey>,
) -> Result<CertAndKey> {
    let crt = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    if crt.exists() && key.exists() {
        return Ok(CertAndKey {
            cert_pem: fs::read_to_string(&crt).map_err(io_err(&crt))?,
            key_pem: fs::read_to_string(&key).map_err(io_err(&key))?,
        });
    }
    let ck = issue()?;
    write_file(&key, ck.key_pem.as_bytes(), 0o600)?;
    write_file(&crt, ck.cert_pem.as_bytes(), 0o644)?;
    Ok(ck)
}

/// A kubeconfig for one identity with embedded certificates (like kubeadm's admin.conf).
pub fn kubeconfig(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    client: &CertAndKey,
) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let context = format!("{user}@{cluster}");
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {server}\n  name: {cluster}\ncontexts:\n- context:\n    cluster: {cluster}\n    user: {user}\n  name: {context}\ncurrent-context: {context}\npreferences: {{}}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {crt}\n    client-key-data: {key}\n",
        ca = b64(ca_pem),
        crt = b64(&client.cert_pem),
        key = b64(&client.key_pem),
    )
}
