//! certificatesigningrequest-signing-controller (csrsigning): issues the approved requests
//! of the four `kubernetes.io/` signers from the cluster CA (`--cluster-signing-cert-file`,
//! `--cluster-signing-key-file`, as kubeadm passes `pki/ca.crt` and `pki/ca.key`). A request
//! its signer does not accept gets the `Failed` condition (reason
//! `SignerValidationFailure`) and no certificate. Certificates last
//! `--cluster-signing-duration` (8760h) or the request's `expirationSeconds`, clamped to
//! [10 min, that duration] and to the CA's own expiry, and are backdated 5 minutes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use rcgen::{
    CertificateParams, DistinguishedName, DnType, DnValue, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType, SerialNumber, SubjectPublicKeyInfo,
};
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use x509_parser::prelude::FromDer;

use super::{
    condition, has_certificate, parse_request, validate_apiserver_client, validate_kubelet_client,
    validate_kubelet_serving, Request, KUBELET_CLIENT, KUBELET_SERVING, KUBE_APISERVER_CLIENT,
    LEGACY_UNKNOWN, SERVICE_ACCOUNT,
};
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::informer::{Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers, wait_for_sync, SyncError};

/// `--cluster-signing-duration`'s default: 8760h0m0s.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(8760 * 3600);
/// How far back certificates start, and twice it the shortest they last.
const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// Certificates shorter than this are not shortened by the backdate.
const SHORT: Duration = Duration::from_secs(8 * 3600);

/// The csrsigning flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--cluster-signing-cert-file`: the CA certificate (PEM).
    pub cert_file: Option<PathBuf>,
    /// `--cluster-signing-key-file`: its key (PEM).
    pub key_file: Option<PathBuf>,
    /// `--cluster-signing-duration`: the longest certificate issued.
    pub duration: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            cert_file: None,
            key_file: None,
            duration: DEFAULT_DURATION,
        }
    }
}

impl Settings {
    /// Upstream's flag validation.
    pub fn validate(&self) -> Result<(), String> {
        match (&self.cert_file, &self.key_file) {
            (None, Some(_)) => Err("cannot specify key without cert".into()),
            (Some(_), None) => Err("cannot specify cert without key".into()),
            _ => Ok(()),
        }
    }
}

/// The loaded CA.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    not_after: OffsetDateTime,
}

impl Ca {
    /// Reads the CA certificate and key.
    pub fn load(settings: &Settings) -> Result<Option<Ca>, String> {
        let (Some(cert), Some(key)) = (&settings.cert_file, &settings.key_file) else {
            return Ok(None);
        };
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p)
                .map_err(|e| format!("error reading CA file {}: {e}", p.display()))
        };
        Ca::from_pem(&read(cert)?, &read(key)?).map(Some)
    }

    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, String> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| format!("error reading CA key: {e}"))?;
        let (_, block) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| format!("error reading CA cert: {e}"))?;
        let cert = block
            .parse_x509()
            .map_err(|e| format!("error reading CA cert: {e}"))?;
        let not_after = cert.validity().not_after.to_datetime();
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .map_err(|e| format!("error reading CA cert: {e}"))?;
        Ok(Ca { issuer, not_after })
    }

    /// Issues the certificate of `req` for `usages`, lasting `ttl` from `now` (PEM).
    pub fn sign(
        &self,
        req: &Request,
        usages: &[String],
        ttl: Duration,
        now: OffsetDateTime,
    ) -> Result<String, String> {
        let mut params = CertificateParams::default();
        params.distinguished_name = subject(&req.subject)?;
        for d in &req.dns_names {
            params.subject_alt_names.push(SanType::DnsName(
                d.clone().try_into().map_err(|e| format!("{e}"))?,
            ));
        }
        for ip in &req.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        for e in &req.emails {
            params.subject_alt_names.push(SanType::Rfc822Name(
                e.clone().try_into().map_err(|e| format!("{e}"))?,
            ));
        }
        for u in &req.uris {
            params.subject_alt_names.push(SanType::URI(
                u.clone().try_into().map_err(|e| format!("{e}"))?,
            ));
        }
        let (key_usages, ext) = key_usages(usages)?;
        params.key_usages = key_usages;
        params.extended_key_usages = ext;
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(SerialNumber::from_slice(&rand::random::<[u8; 16]>()));
        let ttl = time::Duration::try_from(ttl).map_err(|e| e.to_string())?;
        let backdate = time::Duration::try_from(BACKDATE).map_err(|e| e.to_string())?;
        let short = time::Duration::try_from(SHORT).map_err(|e| e.to_string())?;
        params.not_before = now - backdate;
        params.not_after = if ttl < short {
            now + ttl
        } else {
            now + ttl - backdate
        };
        if params.not_after > self.not_after {
            params.not_after = self.not_after;
        }
        if params.not_before >= self.not_after {
            return Err(format!(
                "the signer has expired: NotAfter={}",
                self.not_after
            ));
        }
        if params.not_after < now {
            return Err(format!(
                "refusing to sign a certificate that expired in the past: NotAfter={}",
                params.not_after
            ));
        }
        let key = SubjectPublicKeyInfo::from_der(&req.public_key).map_err(|e| e.to_string())?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| e.to_string())?;
        Ok(cert.pem())
    }
}

/// The request's subject, attribute by attribute. kumo's certificate writer keeps one value
/// per attribute type; a subject repeating one is refused rather than issued altered.
fn subject(der: &[u8]) -> Result<DistinguishedName, String> {
    let (_, name) = x509_parser::x509::X509Name::from_der(der).map_err(|e| e.to_string())?;
    let mut dn = DistinguishedName::new();
    for rdn in name.iter() {
        for attr in rdn.iter() {
            let oid: Vec<u64> = attr
                .attr_type()
                .iter()
                .map(Iterator::collect)
                .unwrap_or_default();
            let ty = DnType::from_oid(&oid);
            if dn.get(&ty).is_some() {
                return Err(format!(
                    "subjects repeating an attribute ({}) are not supported by this signer",
                    attr.attr_type()
                ));
            }
            let value = attr.as_str().map_err(|e| e.to_string())?;
            dn.push(ty, DnValue::Utf8String(value.to_owned()));
        }
    }
    Ok(dn)
}

/// The key usages and extended key usages of `spec.usages` (upstream's KeyUsagesFromStrings),
/// the extended ones in Go's order.
fn key_usages(
    usages: &[String],
) -> Result<(Vec<KeyUsagePurpose>, Vec<ExtendedKeyUsagePurpose>), String> {
    let mut ku = Vec::new();
    let mut ext: Vec<(u8, ExtendedKeyUsagePurpose)> = Vec::new();
    let mut unknown = Vec::new();
    for u in usages {
        let k = match u.as_str() {
            "signing" | "digital signature" => Some(KeyUsagePurpose::DigitalSignature),
            "content commitment" => Some(KeyUsagePurpose::ContentCommitment),
            "key encipherment" => Some(KeyUsagePurpose::KeyEncipherment),
            "key agreement" => Some(KeyUsagePurpose::KeyAgreement),
            "data encipherment" => Some(KeyUsagePurpose::DataEncipherment),
            "cert sign" => Some(KeyUsagePurpose::KeyCertSign),
            "crl sign" => Some(KeyUsagePurpose::CrlSign),
            "encipher only" => Some(KeyUsagePurpose::EncipherOnly),
            "decipher only" => Some(KeyUsagePurpose::DecipherOnly),
            _ => None,
        };
        if let Some(k) = k {
            if !ku.contains(&k) {
                ku.push(k);
            }
            continue;
        }
        let e = match u.as_str() {
            "any" => (0, ExtendedKeyUsagePurpose::Any),
            "server auth" => (1, ExtendedKeyUsagePurpose::ServerAuth),
            "client auth" => (2, ExtendedKeyUsagePurpose::ClientAuth),
            "code signing" => (3, ExtendedKeyUsagePurpose::CodeSigning),
            "email protection" | "s/mime" => (4, ExtendedKeyUsagePurpose::EmailProtection),
            "ipsec end system" => (
                5,
                ExtendedKeyUsagePurpose::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 5]),
            ),
            "ipsec tunnel" => (
                6,
                ExtendedKeyUsagePurpose::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 6]),
            ),
            "ipsec user" => (
                7,
                ExtendedKeyUsagePurpose::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 7]),
            ),
            "timestamping" => (8, ExtendedKeyUsagePurpose::TimeStamping),
            "ocsp signing" => (9, ExtendedKeyUsagePurpose::OcspSigning),
            "microsoft sgc" => (
                10,
                ExtendedKeyUsagePurpose::Other(vec![1, 3, 6, 1, 4, 1, 311, 10, 3, 3]),
            ),
            "netscape sgc" => (
                11,
                ExtendedKeyUsagePurpose::Other(vec![2, 16, 840, 1, 113_730, 4, 1]),
            ),
            _ => {
                unknown.push(format!("{u:?}"));
                continue;
            }
        };
        if !ext.iter().any(|(o, _)| *o == e.0) {
            ext.push(e);
        }
    }
    if !unknown.is_empty() {
        return Err(format!(
            "unrecognized usage values: [{}]",
            unknown.join(" ")
        ));
    }
    ext.sort_by_key(|(o, _)| *o);
    Ok((ku, ext.into_iter().map(|(_, e)| e).collect()))
}

/// How long the certificate of `csr` lasts: its expirationSeconds clamped to
/// [2 × backdate, the configured duration], else the configured duration.
pub fn ttl_of(csr: &CertificateSigningRequest, max: Duration) -> Duration {
    match csr.spec.expiration_seconds {
        None => max,
        Some(s) => {
            let asked = Duration::from_secs(u64::try_from(s).unwrap_or(0));
            asked.clamp(2 * BACKDATE, max.max(2 * BACKDATE))
        }
    }
}

/// What the signer of `signer_name` requires of a request.
fn validate(signer_name: &str, req: &Request, usages: &[String]) -> Result<(), String> {
    match signer_name {
        KUBELET_CLIENT => validate_kubelet_client(req, usages),
        KUBELET_SERVING => validate_kubelet_serving(req, usages),
        KUBE_APISERVER_CLIENT => validate_apiserver_client(usages),
        _ => Ok(()),
    }
}

fn ours(csr: &CertificateSigningRequest) -> bool {
    [
        KUBE_APISERVER_CLIENT,
        KUBELET_CLIENT,
        KUBELET_SERVING,
        LEGACY_UNKNOWN,
    ]
    .contains(&csr.spec.signer_name.as_str())
}

/// Approved, not failed, not issued: to be signed.
fn to_sign(csr: &CertificateSigningRequest) -> bool {
    ours(csr)
        && condition(csr, "Approved").is_some()
        && condition(csr, "Failed").is_none()
        && !has_certificate(csr)
}

struct Ctl {
    client: ClientSource,
    csrs: Arc<Informer<CertificateSigningRequest>>,
    ca: Ca,
    duration: Duration,
}

/// Registers the handlers and returns the controller task; None (logged) when no CA was
/// configured, as kube-controller-manager skips the controller then.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    settings: &Settings,
    mut stop: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let ca = match Ca::load(settings) {
        Ok(Some(ca)) => ca,
        Ok(None) => {
            tracing::info!("Skipping CSR signer controller because no csr cert/key was specified");
            return None;
        }
        Err(e) => {
            tracing::error!(error = %e, "failed to start certificate controller \"csrsigning\"");
            return None;
        }
    };
    let duration = settings.duration;
    let queue = factory.queue::<String>("certificate");
    let csrs = factory.informer::<CertificateSigningRequest>();
    let q = queue.clone();
    csrs.add_handler(move |c| match c {
        Change::Added(csr) | Change::Updated { new: csr, .. } => {
            if to_sign(csr) {
                if let Some(n) = &csr.metadata.name {
                    q.add(n.clone());
                }
            }
        }
        Change::Deleted(_) => {}
    });
    Some(tokio::spawn(async move {
        tracing::info!("Starting certificate controller \"csrsigning\"");
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            csrs,
            ca,
            duration,
        });
        if !wait_for_sync(&mut stop, ctl.csrs.wait_synced()).await {
            return;
        }
        let c = ctl.clone();
        let tasks = run_workers("csrsigning", queue, 5, stop, move |key| {
            let c = c.clone();
            async move { c.sync(&key).await }
        });
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down certificate controller \"csrsigning\"");
    }))
}

impl Ctl {
    async fn sync(&self, name: &str) -> Result<(), SyncError> {
        let Some(csr) = self.csrs.get(name) else {
            return Ok(());
        };
        if !to_sign(&csr) {
            return Ok(());
        }
        let req = parse_request(&csr.spec.request.0)
            .map_err(|e| SyncError::Failed(format!("unable to parse csr {name:?}: {e}")))?;
        let usages = csr.spec.usages.clone().unwrap_or_default();
        let mut updated = (*csr).clone();
        let status = updated.status.get_or_insert_with(Default::default);
        let issued = validate(&csr.spec.signer_name, &req, &usages).and_then(|()| {
            let ttl = ttl_of(&csr, self.duration);
            self.ca.sign(&req, &usages, ttl, OffsetDateTime::now_utc())
        });
        match issued {
            Ok(pem) => status.certificate = Some(ByteString(pem.into_bytes())),
            Err(message) => {
                tracing::info!(csr = name, %message, "signer refused the request");
                status.conditions.get_or_insert_with(Vec::new).push(
                    CertificateSigningRequestCondition {
                        type_: "Failed".into(),
                        status: "True".into(),
                        reason: Some("SignerValidationFailure".into()),
                        message: Some(message),
                        last_update_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                        ..Default::default()
                    },
                );
            }
        }
        let api: Api<CertificateSigningRequest> = Api::all(self.client.get());
        api.replace_status(name, &PostParams::default(), &updated)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::csr_pem;
    use super::*;

    fn test_ca(days: i64) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, "kubernetes");
        p.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        p.not_after = OffsetDateTime::now_utc() + time::Duration::days(days);
        let cert = p.self_signed(&key).unwrap();
        Ca::from_pem(&cert.pem(), &key.serialize_pem()).unwrap()
    }

    #[test]
    fn issues_what_was_asked_within_the_bounds() {
        let ca = test_ca(3650);
        let req =
            parse_request(csr_pem("system:node:n1", &["system:nodes"], &[]).as_bytes()).unwrap();
        let usages = vec!["digital signature".to_string(), "client auth".to_string()];
        let now = OffsetDateTime::now_utc();
        let pem = ca.sign(&req, &usages, DEFAULT_DURATION, now).unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let cert = block.parse_x509().unwrap();
        let cn: Vec<_> = cert
            .subject()
            .iter_common_name()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(cn, ["system:node:n1"]);
        let o: Vec<_> = cert
            .subject()
            .iter_organization()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(o, ["system:nodes"]);
        assert_eq!(
            cert.issuer()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            "kubernetes"
        );
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert!(cert.key_usage().unwrap().unwrap().value.digital_signature());
        assert!(!cert.is_ca());
        let nb = cert.validity().not_before.to_datetime();
        let na = cert.validity().not_after.to_datetime();
        assert!((now - nb - time::Duration::minutes(5)).abs() < time::Duration::seconds(2));
        // A year, less the backdate.
        let want = now + time::Duration::hours(8760) - time::Duration::minutes(5);
        assert!((na - want).abs() < time::Duration::seconds(2));

        // Capped by the CA's own expiry.
        let short_ca = test_ca(10);
        let pem = short_ca.sign(&req, &usages, DEFAULT_DURATION, now).unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let na = block
            .parse_x509()
            .unwrap()
            .validity()
            .not_after
            .to_datetime();
        assert!(na <= now + time::Duration::days(10) + time::Duration::seconds(1));

        assert_eq!(
            key_usages(&["bogus".to_string()]).unwrap_err(),
            "unrecognized usage values: [\"bogus\"]"
        );
    }

    #[test]
    fn expiration_seconds_are_clamped() {
        let mut csr = CertificateSigningRequest::default();
        assert_eq!(ttl_of(&csr, DEFAULT_DURATION), DEFAULT_DURATION);
        csr.spec.expiration_seconds = Some(3600);
        assert_eq!(ttl_of(&csr, DEFAULT_DURATION), Duration::from_secs(3600));
        csr.spec.expiration_seconds = Some(60);
        assert_eq!(ttl_of(&csr, DEFAULT_DURATION), Duration::from_secs(600));
        csr.spec.expiration_seconds = Some(i32::MAX);
        assert_eq!(ttl_of(&csr, DEFAULT_DURATION), DEFAULT_DURATION);
    }
}
