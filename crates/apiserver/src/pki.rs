//! The cluster's certificates, laid out like kubeadm's `/etc/kubernetes`: in `<data-dir>/pki`
//! the cluster CA (`ca`), the API server's serving certificate (`apiserver`), its client
//! certificate towards kubelets (`apiserver-kubelet-client`), the front-proxy CA and client;
//! in `<data-dir>` one kubeconfig per identity (`admin.conf`, `super-admin.conf`,
//! `controller-manager.conf`, `scheduler.conf`, `cloud-controller-manager.conf`) and, on
//! demand, one per kubelet (`kubelets/<node>.conf`).
//!
//! Everything is created at first start and reused afterwards, except the serving
//! certificate, which is reissued when the flags ask for names it lacks. Keys and
//! kubeconfigs are written with mode 0600, certificates 0644. [`renew`] and
//! [`check_expiration`] are `kumo certs renew` and `kumo certs check-expiration`
//! (kubeadm's `certs` commands): a renewed leaf keeps its subject and SANs, gets a new key
//! and a new year, and is signed by the same CA. The running API server picks up a renewed
//! serving certificate within a second ([`ServingCertResolver`]); the components using a
//! renewed kubeconfig read it when they (re)start.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};
use x509_parser::extensions::GeneralName;

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
    #[error("{path}: {why}")]
    Invalid { path: PathBuf, why: String },
    /// The CA certificate is present without its key (kubeadm's external CA mode).
    #[error("{0} certificate authority is external (no key): cannot issue certificates")]
    ExternalCa(String),
    #[error("{0} is not a valid certificate for this cluster")]
    Unknown(String),
}

type Result<T> = std::result::Result<T, PkiError>;

/// The cluster name in the kubeconfigs kumo writes.
pub const CLUSTER_NAME: &str = "kumo";

/// kubeadm's validity periods: CA ten years, leaf certificates one year.
const CA_DAYS: i64 = 3650;
const LEAF_DAYS: i64 = 365;

/// The certificate authority, loaded or created.
pub struct Ca {
    pub cert_pem: String,
    key: Option<KeyPair>,
    /// kubeadm's name for it (`ca`, `front-proxy-ca`).
    name: String,
}

/// A certificate and its key, PEM-encoded.
#[derive(Clone)]
pub struct CertAndKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What a leaf certificate says: kept across renewals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeafParams {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub server_auth: bool,
    pub client_auth: bool,
}

impl LeafParams {
    /// A client certificate: CN is the user name, O the groups.
    pub fn client(user: &str, groups: &[&str]) -> LeafParams {
        LeafParams {
            common_name: user.to_owned(),
            organizations: groups.iter().map(|g| (*g).to_owned()).collect(),
            client_auth: true,
            ..Default::default()
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PkiError + '_ {
    move |source| PkiError::Io {
        path: path.to_owned(),
        source,
    }
}

fn invalid(path: &Path, why: impl std::fmt::Display) -> PkiError {
    PkiError::Invalid {
        path: path.to_owned(),
        why: why.to_string(),
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

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(io_err(path))
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = OffsetDateTime::now_utc();
    // Like kubeadm, valid from a little before now, to tolerate clock skew.
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + Duration::days(days);
}

/// The DER of the first certificate in `pem`.
fn first_der(pem: &str) -> Option<Vec<u8>> {
    rustls_pemfile::certs(&mut pem.as_bytes())
        .next()?
        .ok()
        .map(|c| c.as_ref().to_vec())
}

/// What kumo needs to know of a certificate on disk.
#[derive(Clone, Debug)]
pub struct CertInfo {
    pub params: LeafParams,
    pub not_after: OffsetDateTime,
    pub serial: Vec<u8>,
}

/// Reads the subject, SANs, usages, expiry and serial of a PEM certificate.
pub fn cert_info(pem: &str) -> Option<CertInfo> {
    let der = first_der(pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let subject = cert.subject();
    let mut params = LeafParams {
        common_name: subject
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .unwrap_or_default()
            .to_owned(),
        organizations: subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .map(str::to_owned)
            .collect(),
        ..Default::default()
    };
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => params.dns_names.push((*d).to_owned()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => {
                        let a: [u8; 4] = (*b).try_into().ok()?;
                        params.ips.push(IpAddr::from(a));
                    }
                    16 => {
                        let a: [u8; 16] = (*b).try_into().ok()?;
                        params.ips.push(IpAddr::from(a));
                    }
                    _ => {}
                },
                _ => {}
            }
        }
    }
    if let Ok(Some(eku)) = cert.extended_key_usage() {
        params.server_auth = eku.value.server_auth;
        params.client_auth = eku.value.client_auth;
    }
    Some(CertInfo {
        params,
        not_after: cert.validity().not_after.to_datetime(),
        serial: cert.raw_serial().to_vec(),
    })
}

impl Ca {
    /// Loads `dir/ca.crt` and `dir/ca.key`, or creates them (the cluster CA).
    pub fn load_or_create(dir: &Path) -> Result<Ca> {
        Ca::load_or_create_named(dir, "ca", "kubernetes")
    }

    /// Loads `dir/<name>.crt` (and `.key` when present), or creates both with `cn`.
    pub fn load_or_create_named(dir: &Path, name: &str, cn: &str) -> Result<Ca> {
        if let Some(ca) = Ca::load(dir, name)? {
            return Ok(ca);
        }
        let ca = Ca::generate(name, cn)?;
        if let Some(key) = ca.key_pem() {
            write_file(&dir.join(format!("{name}.key")), key.as_bytes(), 0o600)?;
        }
        write_file(
            &dir.join(format!("{name}.crt")),
            ca.cert_pem.as_bytes(),
            0o644,
        )?;
        Ok(ca)
    }

    /// A new CA held in memory (not written anywhere): `name` is kubeadm's name for it,
    /// `cn` its subject. Cluster API's control-plane provider makes a cluster's CAs so.
    pub fn generate(name: &str, cn: &str) -> Result<Ca> {
        let key_pair = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::KeyCertSign,
        ];
        validity(&mut params, CA_DAYS);
        let cert = params.self_signed(&key_pair)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key: Some(key_pair),
            name: name.to_owned(),
        })
    }

    /// A CA from its PEM certificate and key (a Secret's `tls.crt` and `tls.key`).
    pub fn from_pem(name: &str, cert_pem: &str, key_pem: &str) -> Result<Ca> {
        Ok(Ca {
            cert_pem: cert_pem.to_owned(),
            key: Some(KeyPair::from_pem(key_pem)?),
            name: name.to_owned(),
        })
    }

    /// The CA's key, PEM (PKCS#8), if it has one.
    pub fn key_pem(&self) -> Option<String> {
        self.key.as_ref().map(KeyPair::serialize_pem)
    }

    /// Loads `dir/<name>.crt` and, when present, its key; `None` without a certificate.
    pub fn load(dir: &Path, name: &str) -> Result<Option<Ca>> {
        let crt = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        if !crt.exists() {
            return Ok(None);
        }
        let cert_pem = read(&crt)?;
        if first_der(&cert_pem).is_none() {
            return Err(invalid(&crt, "no PEM certificate"));
        }
        let key = if key.exists() {
            Some(KeyPair::from_pem(&read(&key)?).map_err(|e| invalid(&key, e))?)
        } else {
            None
        };
        Ok(Some(Ca {
            cert_pem,
            key,
            name: name.to_owned(),
        }))
    }

    /// Whether the CA's key is absent (kubeadm's "externally managed").
    pub fn external(&self) -> bool {
        self.key.is_none()
    }

    /// Whether `cert_pem` is signed by this CA and still valid.
    pub fn verifies(&self, cert_pem: &str) -> bool {
        let (Some(ca_der), Some(der)) = (first_der(&self.cert_pem), first_der(cert_pem)) else {
            return false;
        };
        let (Ok((_, ca)), Ok((_, cert))) = (
            x509_parser::parse_x509_certificate(&ca_der),
            x509_parser::parse_x509_certificate(&der),
        ) else {
            return false;
        };
        cert.issuer() == ca.subject()
            && cert.verify_signature(Some(ca.public_key())).is_ok()
            && cert.validity().is_valid()
    }

    /// Issues a certificate with `params` (a new key), valid for a year.
    pub fn issue(&self, leaf: &LeafParams) -> Result<CertAndKey> {
        let key = self
            .key
            .as_ref()
            .ok_or_else(|| PkiError::ExternalCa(self.name.clone()))?;
        let key_pair = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        for o in &leaf.organizations {
            dn.push(DnType::OrganizationName, o.as_str());
        }
        dn.push(DnType::CommonName, leaf.common_name.as_str());
        params.distinguished_name = dn;
        for d in &leaf.dns_names {
            params
                .subject_alt_names
                .push(SanType::DnsName(d.clone().try_into()?));
        }
        for ip in &leaf.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if leaf.server_auth {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if leaf.client_auth {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        validity(&mut params, LEAF_DAYS);
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, key)?;
        let cert = params.signed_by(&key_pair, &issuer)?;
        Ok(CertAndKey {
            cert_pem: cert.pem(),
            key_pem: key_pair.serialize_pem(),
        })
    }

    /// Issues a serving certificate for these DNS names and IP addresses.
    pub fn issue_serving(&self, cn: &str, dns: &[String], ips: &[IpAddr]) -> Result<CertAndKey> {
        self.issue(&LeafParams {
            common_name: cn.to_owned(),
            dns_names: dns.to_vec(),
            ips: ips.to_vec(),
            server_auth: true,
            ..Default::default()
        })
    }

    /// Issues a client certificate: CN is the user name, O the groups.
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<CertAndKey> {
        self.issue(&LeafParams::client(user, groups))
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
            cert_pem: read(&crt)?,
            key_pem: read(&key)?,
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
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let context = format!("{user}@{cluster}");
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {server}\n  name: {cluster}\ncontexts:\n- context:\n    cluster: {cluster}\n    user: {user}\n  name: {context}\ncurrent-context: {context}\npreferences: {{}}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {crt}\n    client-key-data: {key}\n",
        ca = b64(ca_pem),
        crt = b64(&client.cert_pem),
        key = b64(&client.key_pem),
    )
}

/// One identity with a kubeconfig in the data directory, as kubeadm names them.
pub struct KubeconfigSpec {
    /// File name in the data directory, also its name for `kumo certs`.
    pub file: &'static str,
    pub user: &'static str,
    pub groups: &'static [&'static str],
    /// kubeadm's description, printed by `kumo certs renew`.
    pub long_name: &'static str,
}

/// The kubeconfigs written at first start. kubeadm writes the first four; the
/// cloud-controller-manager's identity is `system:cloud-controller-manager` (no group),
/// the user the cloud providers' RBAC manifests bind, mirroring
/// `system:kube-controller-manager`.
pub const KUBECONFIGS: &[KubeconfigSpec] = &[
    KubeconfigSpec {
        file: "admin.conf",
        user: "kubernetes-admin",
        groups: &["kubeadm:cluster-admins"],
        long_name: "certificate embedded in the kubeconfig file for the admin to use and for kubeadm itself",
    },
    KubeconfigSpec {
        file: "super-admin.conf",
        user: "kubernetes-super-admin",
        groups: &["system:masters"],
        long_name: "certificate embedded in the kubeconfig file for the super-admin",
    },
    KubeconfigSpec {
        file: "controller-manager.conf",
        user: "system:kube-controller-manager",
        groups: &[],
        long_name: "certificate embedded in the kubeconfig file for the controller manager to use",
    },
    KubeconfigSpec {
        file: "scheduler.conf",
        user: "system:kube-scheduler",
        groups: &[],
        long_name: "certificate embedded in the kubeconfig file for the scheduler manager to use",
    },
    KubeconfigSpec {
        file: "cloud-controller-manager.conf",
        user: "system:cloud-controller-manager",
        groups: &[],
        long_name:
            "certificate embedded in the kubeconfig file for the cloud controller manager to use",
    },
];

/// One leaf certificate in `<data-dir>/pki`.
pub struct LeafSpec {
    pub name: &'static str,
    /// The CA that signs it.
    pub ca: &'static str,
    pub long_name: &'static str,
}

/// The leaf certificates in `pki/`, with kubeadm's names.
pub const LEAVES: &[LeafSpec] = &[
    LeafSpec {
        name: "apiserver",
        ca: "ca",
        long_name: "certificate for serving the Kubernetes API",
    },
    LeafSpec {
        name: "apiserver-kubelet-client",
        ca: "ca",
        long_name: "certificate for the API server to connect to kubelet",
    },
    LeafSpec {
        name: "front-proxy-client",
        ca: "front-proxy-ca",
        long_name: "certificate for the front proxy client",
    },
];

/// The CAs (kubeadm's names and common names).
pub const CAS: &[(&str, &str)] = &[("ca", "kubernetes"), ("front-proxy-ca", "front-proxy-ca")];

/// kubeadm's subject of `apiserver-kubelet-client` (v1.29+: not system:masters).
const KUBELET_CLIENT_CN: &str = "kube-apiserver-kubelet-client";
const KUBELET_CLIENT_GROUP: &str = "kubeadm:cluster-admins";

/// The names and addresses the serving certificate is for: localhost, 127.0.0.1, the
/// host name, the in-cluster names of the `kubernetes` Service, the advertised address and
/// the bound one (when it is not a wildcard). The Service's cluster IP depends on the
/// Service range; the API server adds it ([`crate::ApiServerConfig::service_cluster_ip_range`]).
pub fn apiserver_sans(advertise: Option<IpAddr>, bind: IpAddr) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns: Vec<String> = vec!["localhost".into()];
    if let Some(h) = hostname() {
        dns.push(h);
    }
    for d in [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ] {
        if !dns.iter().any(|x| x == d) {
            dns.push(d.to_owned());
        }
    }
    let mut ips: Vec<IpAddr> = vec![IpAddr::from([127, 0, 0, 1])];
    for ip in advertise.into_iter().chain(Some(bind)) {
        if !ip.is_unspecified() && !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    (dns, ips)
}

/// The host name, lower-cased as kubeadm's node name, when it is a valid DNS name.
fn hostname() -> Option<String> {
    let raw = fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .ok()?;
    let h = raw.trim().to_ascii_lowercase();
    let ok = !h.is_empty()
        && h.len() <= 253
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    ok.then_some(h)
}

/// What [`ensure`] hands the server.
pub struct Pki {
    /// The cluster CA (clients are verified against it).
    pub ca_pem: String,
    /// The serving certificate and key.
    pub serving: CertAndKey,
    /// `<data-dir>/admin.conf`.
    pub admin_kubeconfig: PathBuf,
}

/// Creates what is missing of the PKI and the kubeconfigs in `data_dir`, as kubeadm's
/// `init phase certs` and `init phase kubeconfig` do, and reuses what exists. The
/// serving certificate is reissued when it lacks one of `dns`/`ips` (the flags changed),
/// is not signed by the CA, or has expired. Kubeconfigs that exist keep their
/// certificate; their server URL is updated to `server`.
pub fn ensure(data_dir: &Path, server: &str, dns: &[String], ips: &[IpAddr]) -> Result<Pki> {
    let pki = data_dir.join("pki");
    let ca = Ca::load_or_create(&pki)?;
    let front_proxy_ca = Ca::load_or_create_named(&pki, "front-proxy-ca", "front-proxy-ca")?;

    let serving = LeafParams {
        common_name: "kube-apiserver".into(),
        dns_names: dns.to_vec(),
        ips: ips.to_vec(),
        server_auth: true,
        ..Default::default()
    };
    let serving = ensure_leaf(&pki, "apiserver", &ca, &serving, |have| {
        dns.iter().all(|d| have.dns_names.contains(d)) && ips.iter().all(|i| have.ips.contains(i))
    })?;
    ensure_leaf(
        &pki,
        "apiserver-kubelet-client",
        &ca,
        &LeafParams::client(KUBELET_CLIENT_CN, &[KUBELET_CLIENT_GROUP]),
        |_| true,
    )?;
    ensure_leaf(
        &pki,
        "front-proxy-client",
        &front_proxy_ca,
        &LeafParams::client("front-proxy-client", &[]),
        |_| true,
    )?;
    for spec in KUBECONFIGS {
        ensure_kubeconfig(
            &data_dir.join(spec.file),
            &ca,
            server,
            spec.user,
            spec.groups,
        )?;
    }
    Ok(Pki {
        ca_pem: ca.cert_pem.clone(),
        serving,
        admin_kubeconfig: data_dir.join("admin.conf"),
    })
}

/// The certificates of a stacked etcd member and of the API server as its client, as
/// kubeadm's `init phase certs etcd-*` and `apiserver-etcd-client` make them from the etcd
/// CA (`pki/etcd/ca`, created when missing): `etcd/server` and `etcd/peer` for `node` at
/// localhost, 127.0.0.1, ::1 and `ips`, `etcd/healthcheck-client`, and
/// `apiserver-etcd-client`.
pub fn ensure_etcd(data_dir: &Path, node: &str, ips: &[IpAddr]) -> Result<()> {
    let pki = data_dir.join("pki");
    let etcd = pki.join("etcd");
    let ca = Ca::load_or_create_named(&etcd, "ca", "etcd-ca")?;
    let mut all_ips: Vec<IpAddr> = vec![
        IpAddr::from([127, 0, 0, 1]),
        IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ];
    for ip in ips {
        if !all_ips.contains(ip) {
            all_ips.push(*ip);
        }
    }
    let member = LeafParams {
        common_name: node.to_owned(),
        dns_names: vec!["localhost".into(), node.to_owned()],
        ips: all_ips.clone(),
        server_auth: true,
        client_auth: true,
        ..Default::default()
    };
    let fits = |have: &LeafParams| {
        member.dns_names.iter().all(|d| have.dns_names.contains(d))
            && all_ips.iter().all(|i| have.ips.contains(i))
    };
    ensure_leaf(&etcd, "server", &ca, &member, fits)?;
    ensure_leaf(&etcd, "peer", &ca, &member, fits)?;
    ensure_leaf(
        &etcd,
        "healthcheck-client",
        &ca,
        &LeafParams::client("kube-etcd-healthcheck-client", &[]),
        |_| true,
    )?;
    ensure_leaf(
        &pki,
        "apiserver-etcd-client",
        &ca,
        &LeafParams::client("kube-apiserver-etcd-client", &[]),
        |_| true,
    )?;
    Ok(())
}

/// Reuses `pki/<name>.crt`/`.key` when the CA signed it, it is valid and `fits`;
/// otherwise issues `want` and writes it.
fn ensure_leaf(
    pki: &Path,
    name: &str,
    ca: &Ca,
    want: &LeafParams,
    fits: impl Fn(&LeafParams) -> bool,
) -> Result<CertAndKey> {
    let crt = pki.join(format!("{name}.crt"));
    let key = pki.join(format!("{name}.key"));
    if crt.exists() && key.exists() {
        let have = CertAndKey {
            cert_pem: read(&crt)?,
            key_pem: read(&key)?,
        };
        let usable = cert_info(&have.cert_pem).is_some_and(|i| fits(&i.params))
            && ca.verifies(&have.cert_pem);
        if usable {
            return Ok(have);
        }
        tracing::info!(certificate = name, "reissuing certificate");
    }
    let ck = ca.issue(want)?;
    write_file(&key, ck.key_pem.as_bytes(), 0o600)?;
    write_file(&crt, ck.cert_pem.as_bytes(), 0o644)?;
    Ok(ck)
}

/// The client certificate and key embedded in a kubeconfig, and its server URL.
struct EmbeddedClient {
    text: String,
    cert_b64: String,
    key_b64: String,
    server: String,
}

fn read_kubeconfig(path: &Path) -> Result<EmbeddedClient> {
    let text = read(path)?;
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| invalid(path, e))?;
    let field = |v: &serde_yaml::Value, keys: &[&str]| -> Option<String> {
        let mut v = v;
        for k in keys {
            v = v.get(*k)?;
        }
        v.as_str().map(str::to_owned)
    };
    let user = doc
        .get("users")
        .and_then(|u| u.get(0))
        .ok_or_else(|| invalid(path, "no user"))?;
    let cluster = doc
        .get("clusters")
        .and_then(|c| c.get(0))
        .ok_or_else(|| invalid(path, "no cluster"))?;
    Ok(EmbeddedClient {
        cert_b64: field(user, &["user", "client-certificate-data"])
            .ok_or_else(|| invalid(path, "no client-certificate-data"))?,
        key_b64: field(user, &["user", "client-key-data"])
            .ok_or_else(|| invalid(path, "no client-key-data"))?,
        server: field(cluster, &["cluster", "server"]).unwrap_or_default(),
        text,
    })
}

fn unb64(s: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// The client certificate (PEM) embedded in the kubeconfig at `path`.
pub fn kubeconfig_cert(path: &Path) -> Result<String> {
    let kc = read_kubeconfig(path)?;
    unb64(&kc.cert_b64).ok_or_else(|| invalid(path, "client-certificate-data is not base64 PEM"))
}

/// Writes the kubeconfig at `path` for `user` unless one with a certificate the CA signed
/// exists; an existing one gets `server` as its server URL.
fn ensure_kubeconfig(
    path: &Path,
    ca: &Ca,
    server: &str,
    user: &str,
    groups: &[&str],
) -> Result<()> {
    if path.exists() {
        if let Ok(kc) = read_kubeconfig(path) {
            let cert = unb64(&kc.cert_b64).unwrap_or_default();
            if ca.verifies(&cert) && unb64(&kc.key_b64).is_some() {
                if kc.server != server && !kc.server.is_empty() {
                    let text = kc.text.replace(
                        &format!("server: {}\n", kc.server),
                        &format!("server: {server}\n"),
                    );
                    write_file(path, text.as_bytes(), 0o600)?;
                }
                return Ok(());
            }
        }
        tracing::info!(kubeconfig = %path.display(), "reissuing kubeconfig");
    }
    let client = ca.issue_client(user, groups)?;
    write_file(
        path,
        kubeconfig(CLUSTER_NAME, server, &ca.cert_pem, user, &client).as_bytes(),
        0o600,
    )
}

/// The kubeconfig of kubelet `node` (`system:node:<node>` in `system:nodes`, as the Node
/// authorizer expects): `<data-dir>/kubelets/<node>.conf`, created on first use and
/// reused afterwards (its server URL follows `server`).
pub fn kubelet_kubeconfig(data_dir: &Path, node: &str, server: &str) -> Result<PathBuf> {
    let valid = !node.is_empty()
        && node.len() <= 253
        && node
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !node.starts_with(['-', '.'])
        && !node.ends_with(['-', '.']);
    let path = data_dir.join("kubelets").join(format!("{node}.conf"));
    if !valid {
        return Err(invalid(&path, "node name is not a DNS subdomain"));
    }
    let ca = Ca::load_or_create(&data_dir.join("pki"))?;
    ensure_kubeconfig(
        &path,
        &ca,
        server,
        &format!("system:node:{node}"),
        &["system:nodes"],
    )?;
    Ok(path)
}

/// The kube-proxy's kubeconfig: `<data-dir>/kube-proxy.conf` for user `system:kube-proxy`
/// (the user the bootstrap policy binds to `system:node-proxier`), created on first use.
pub fn kube_proxy_kubeconfig(data_dir: &Path, server: &str) -> Result<PathBuf> {
    user_kubeconfig(data_dir, "kube-proxy.conf", "system:kube-proxy", server)
}

/// A kubeconfig `<data-dir>/<file>` for `user` (no groups: what it may do is what RBAC
/// binds to that user), created on first use.
pub fn user_kubeconfig(data_dir: &Path, file: &str, user: &str, server: &str) -> Result<PathBuf> {
    let path = data_dir.join(file);
    let ca = Ca::load_or_create(&data_dir.join("pki"))?;
    ensure_kubeconfig(&path, &ca, server, user, &[])?;
    Ok(path)
}

/// The serving certificate as the TLS layer asks for it: `pki/apiserver.crt` and `.key`,
/// read again when they change on disk (looked at once a second at most), as
/// kube-apiserver's dynamic serving certificate controller does, so `kumo certs renew
/// apiserver` takes effect without a restart. A pair that does not load (half written,
/// mismatched) leaves the previous one in service.
pub struct ServingCertResolver {
    crt: PathBuf,
    key: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    state: Mutex<Served>,
}

struct Served {
    stamp: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
    key: Arc<rustls::sign::CertifiedKey>,
}

fn certified(
    cert_pem: &str,
    key_pem: &str,
    provider: &rustls::crypto::CryptoProvider,
) -> Option<rustls::sign::CertifiedKey> {
    let chain: Vec<rustls::pki_types::CertificateDer<'static>> =
        rustls_pemfile::certs(&mut cert_pem.as_bytes())
            .collect::<std::result::Result<_, _>>()
            .ok()?;
    if chain.is_empty() {
        return None;
    }
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes()).ok()??;
    rustls::sign::CertifiedKey::from_der(chain, key, provider).ok()
}

fn mtime(p: &Path) -> Option<SystemTime> {
    fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl ServingCertResolver {
    /// Serves `serving` (the pair [`ensure`] left in `data_dir/pki`) and follows the files.
    pub fn new(
        data_dir: &Path,
        serving: &CertAndKey,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<ServingCertResolver> {
        let crt = data_dir.join("pki/apiserver.crt");
        let key = data_dir.join("pki/apiserver.key");
        let loaded = certified(&serving.cert_pem, &serving.key_pem, &provider)
            .ok_or_else(|| invalid(&crt, "serving certificate and key do not load"))?;
        Ok(ServingCertResolver {
            state: Mutex::new(Served {
                stamp: (mtime(&crt), mtime(&key)),
                checked: Instant::now(),
                key: Arc::new(loaded),
            }),
            crt,
            key,
            provider,
        })
    }
}

impl std::fmt::Debug for ServingCertResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCertResolver")
            .field("crt", &self.crt)
            .finish()
    }
}

impl rustls::server::ResolvesServerCert for ServingCertResolver {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let mut s = self.state.lock().ok()?;
        if s.checked.elapsed() >= std::time::Duration::from_secs(1) {
            s.checked = Instant::now();
            let stamp = (mtime(&self.crt), mtime(&self.key));
            if stamp != s.stamp {
                let pair = (fs::read_to_string(&self.crt), fs::read_to_string(&self.key));
                if let (Ok(c), Ok(k)) = pair {
                    if let Some(new) = certified(&c, &k, &self.provider) {
                        tracing::info!(certificate = %self.crt.display(), "serving certificate reloaded");
                        s.key = Arc::new(new);
                        s.stamp = stamp;
                    }
                }
            }
        }
        Some(s.key.clone())
    }
}

/// One certificate `kumo certs` manages.
pub struct Managed {
    /// kubeadm's name: `apiserver`, `admin.conf`, ...
    pub name: &'static str,
    pub long_name: &'static str,
    pub ca: &'static str,
    kind: ManagedKind,
}

enum ManagedKind {
    Leaf,
    Kubeconfig,
}

/// Every certificate `kumo certs` manages, sorted by name as kubeadm lists them.
pub fn managed() -> Vec<Managed> {
    let mut all: Vec<Managed> = LEAVES
        .iter()
        .map(|l| Managed {
            name: l.name,
            long_name: l.long_name,
            ca: l.ca,
            kind: ManagedKind::Leaf,
        })
        .chain(KUBECONFIGS.iter().map(|k| Managed {
            name: k.file,
            long_name: k.long_name,
            ca: "ca",
            kind: ManagedKind::Kubeconfig,
        }))
        .collect();
    all.sort_by_key(|m| m.name);
    all
}

impl Managed {
    fn path(&self, data_dir: &Path) -> PathBuf {
        match self.kind {
            ManagedKind::Leaf => data_dir.join("pki").join(format!("{}.crt", self.name)),
            ManagedKind::Kubeconfig => data_dir.join(self.name),
        }
    }

    /// The certificate's PEM, `None` when it does not exist.
    fn cert_pem(&self, data_dir: &Path) -> Result<Option<String>> {
        let path = self.path(data_dir);
        if !path.exists() {
            return Ok(None);
        }
        match self.kind {
            ManagedKind::Leaf => read(&path).map(Some),
            ManagedKind::Kubeconfig => kubeconfig_cert(&path).map(Some),
        }
    }
}

/// Renews one certificate (kubeadm's name, e.g. `apiserver` or `admin.conf`) with the
/// same subject, SANs and usages, a new key and a new year, signed by the same CA.
/// Returns the line kubeadm prints.
pub fn renew(data_dir: &Path, name: &str) -> Result<String> {
    let m = managed()
        .into_iter()
        .find(|m| m.name == name)
        .ok_or_else(|| PkiError::Unknown(name.to_owned()))?;
    let Some(old) = m.cert_pem(data_dir)? else {
        return Ok(format!("MISSING! {}", m.long_name));
    };
    let pki = data_dir.join("pki");
    let ca = Ca::load(&pki, m.ca)?.ok_or_else(|| {
        invalid(
            &pki.join(format!("{}.crt", m.ca)),
            "certificate authority missing",
        )
    })?;
    if ca.external() {
        return Ok(format!(
            "Detected external {}, {} can't be renewed",
            m.ca, m.long_name
        ));
    }
    let path = m.path(data_dir);
    let params = cert_info(&old)
        .ok_or_else(|| invalid(&path, "not a PEM certificate"))?
        .params;
    let new = ca.issue(&params)?;
    match m.kind {
        ManagedKind::Leaf => {
            write_file(
                &pki.join(format!("{name}.key")),
                new.key_pem.as_bytes(),
                0o600,
            )?;
            write_file(&path, new.cert_pem.as_bytes(), 0o644)?;
        }
        ManagedKind::Kubeconfig => {
            // Replace only the two values, keeping whatever else the file says.
            let kc = read_kubeconfig(&path)?;
            let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
            let text = kc
                .text
                .replace(&kc.cert_b64, &b64(&new.cert_pem))
                .replace(&kc.key_b64, &b64(&new.key_pem));
            write_file(&path, text.as_bytes(), 0o600)?;
        }
    }
    Ok(format!("{} renewed", m.long_name))
}

/// kubeadm's line after `renew all`.
pub const RENEW_ALL_DONE: &str = "Done renewing certificates. You must restart the kube-apiserver, kube-controller-manager, kube-scheduler and etcd, so that they can use the new certificates.";

/// Go's `duration.ShortHumanDuration`, as kubeadm prints residual times.
pub fn short_human_duration(d: Duration) -> String {
    let seconds = d.whole_seconds();
    if seconds < -1 {
        "<invalid>".into()
    } else if seconds < 0 {
        "0s".into()
    } else if seconds < 60 {
        format!("{seconds}s")
    } else if d.whole_minutes() < 60 {
        format!("{}m", d.whole_minutes())
    } else if d.whole_hours() < 24 {
        format!("{}h", d.whole_hours())
    } else if d.whole_hours() < 24 * 365 {
        format!("{}d", d.whole_hours() / 24)
    } else {
        format!("{}y", d.whole_hours() / 24 / 365)
    }
}

/// kubeadm's expiry format, `Jan 02, 2006 15:04 MST` (always UTC here).
fn expiry(t: OffsetDateTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{} {:02}, {} {:02}:{:02} UTC",
        MONTHS[usize::from(u8::from(t.month())) - 1],
        t.day(),
        t.year(),
        t.hour(),
        t.minute()
    )
}

/// Go's text/tabwriter as kubeadm configures it (minwidth 10, padding 3, blanks): each
/// tab-terminated cell is padded to its column's width; the text after the last tab is
/// written as is; a line without tabs ends the block of aligned lines.
fn tabwrite(lines: &[String]) -> String {
    let mut out = String::new();
    let mut block: Vec<Vec<&str>> = Vec::new();
    let flush = |block: &mut Vec<Vec<&str>>, out: &mut String| {
        let columns = block.iter().map(|c| c.len() - 1).max().unwrap_or(0);
        let mut widths = vec![10usize; columns];
        for cells in block.iter() {
            for (i, c) in cells.iter().take(cells.len() - 1).enumerate() {
                widths[i] = widths[i].max(c.chars().count() + 3);
            }
        }
        for cells in block.drain(..) {
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    out.push_str(c);
                } else {
                    out.push_str(c);
                    out.push_str(&" ".repeat(widths[i] - c.chars().count()));
                }
            }
            out.push('\n');
        }
    };
    for l in lines {
        if l.contains('\t') {
            block.push(l.split('\t').collect());
        } else {
            flush(&mut block, &mut out);
            out.push_str(l);
            out.push('\n');
        }
    }
    flush(&mut block, &mut out);
    out
}

/// `kumo certs check-expiration`: kubeadm's two tables (certificates, then CAs).
pub fn check_expiration(data_dir: &Path) -> Result<String> {
    let now = OffsetDateTime::now_utc();
    let pki = data_dir.join("pki");
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let mut lines = vec![
        "CERTIFICATE\tEXPIRES\tRESIDUAL TIME\tCERTIFICATE AUTHORITY\tEXTERNALLY MANAGED".to_owned(),
    ];
    for m in managed() {
        let info = m.cert_pem(data_dir)?.and_then(|p| cert_info(&p));
        let Some(info) = info else {
            lines.push(format!("!MISSING! {}\t\t\t\t", m.name));
            continue;
        };
        let external = match Ca::load(&pki, m.ca)? {
            Some(ca) => ca.external(),
            None => false,
        };
        lines.push(format!(
            "{}\t{}\t{}\t{}\t{:<8}",
            m.name,
            expiry(info.not_after),
            short_human_duration(info.not_after - now),
            m.ca,
            yes_no(external)
        ));
    }
    lines.push(String::new());
    lines.push("CERTIFICATE AUTHORITY\tEXPIRES\tRESIDUAL TIME\tEXTERNALLY MANAGED".to_owned());
    for (name, _) in CAS {
        let ca = Ca::load(&pki, name)?;
        let info = ca.as_ref().and_then(|c| cert_info(&c.cert_pem));
        match (ca, info) {
            (Some(ca), Some(info)) => lines.push(format!(
                "{}\t{}\t{}\t{:<8}",
                name,
                expiry(info.not_after),
                short_human_duration(info.not_after - now),
                yes_no(ca.external())
            )),
            _ => lines.push(format!("!MISSING! {name}\t\t\t")),
        }
    }
    Ok(tabwrite(&lines))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_human_durations() {
        assert_eq!(short_human_duration(Duration::seconds(-5)), "<invalid>");
        assert_eq!(short_human_duration(Duration::seconds(59)), "59s");
        assert_eq!(short_human_duration(Duration::minutes(59)), "59m");
        assert_eq!(short_human_duration(Duration::hours(23)), "23h");
        assert_eq!(
            short_human_duration(Duration::days(365) - Duration::minutes(1)),
            "364d"
        );
        assert_eq!(short_human_duration(Duration::days(3650)), "10y");
        assert_eq!(
            short_human_duration(Duration::days(3650) - Duration::minutes(1)),
            "9y"
        );
    }

    #[test]
    fn tabwriter_like_go() {
        let out = tabwrite(&[
            "A\tBB\tlast".into(),
            "CCCCCCCCCCCC\tD\tx".into(),
            String::new(),
            "E\tF".into(),
        ]);
        assert_eq!(
            out,
            "A              BB        last\nCCCCCCCCCCCC   D         x\n\nE         F\n"
        );
    }

    #[test]
    fn expiry_format() {
        let t = time::Date::from_calendar_date(2027, time::Month::January, 5)
            .expect("date")
            .with_hms(3, 4, 0)
            .expect("time")
            .assume_utc();
        assert_eq!(expiry(t), "Jan 05, 2027 03:04 UTC");
    }

    #[test]
    fn verifies_only_its_own_certificates() {
        let a = tempfile::tempdir().expect("tempdir");
        let b = tempfile::tempdir().expect("tempdir");
        let ca_a = Ca::load_or_create(a.path()).expect("ca a");
        let ca_b = Ca::load_or_create(b.path()).expect("ca b");
        let leaf = ca_a.issue_client("u", &["g"]).expect("issue");
        assert!(ca_a.verifies(&leaf.cert_pem));
        assert!(!ca_b.verifies(&leaf.cert_pem));
        assert!(!ca_a.verifies("garbage"));
        let info = cert_info(&leaf.cert_pem).expect("info");
        assert_eq!(info.params, LeafParams::client("u", &["g"]));
    }

    #[test]
    fn kubelet_names_are_checked() {
        let d = tempfile::tempdir().expect("tempdir");
        assert!(kubelet_kubeconfig(d.path(), "../x", "https://127.0.0.1:1").is_err());
        assert!(kubelet_kubeconfig(d.path(), "", "https://127.0.0.1:1").is_err());
        let p = kubelet_kubeconfig(d.path(), "node-1", "https://127.0.0.1:1").expect("conf");
        let info = cert_info(&kubeconfig_cert(&p).expect("cert")).expect("info");
        assert_eq!(info.params.common_name, "system:node:node-1");
        assert_eq!(info.params.organizations, vec!["system:nodes"]);
        // Reused, with the server URL following the argument.
        let again = kubelet_kubeconfig(d.path(), "node-1", "https://127.0.0.1:2").expect("conf");
        let text = fs::read_to_string(&again).expect("read");
        assert!(text.contains("server: https://127.0.0.1:2\n"));
        assert_eq!(
            cert_info(&kubeconfig_cert(&again).expect("cert"))
                .expect("info")
                .serial,
            info.serial
        );
    }
}
