//! TLS bootstrap (`--bootstrap-kubeconfig`), as upstream's kubelet does it when joining
//! with a bootstrap token: while `--kubeconfig` holds no usable client certificate, the
//! kubelet makes an ECDSA P-256 key, asks for a `kubernetes.io/kube-apiserver-client-kubelet`
//! certificate for `system:node:<name>` / `system:nodes` with a CertificateSigningRequest
//! (named from a digest of its key, subject and usages, so a restart reuses it), waits for
//! the controller-manager to approve and sign it, stores certificate and key in
//! `<cert-dir>/kubelet-client-<time>.pem` behind the `kubelet-client-current.pem` link, and
//! writes `--kubeconfig` to use it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, PostParams};
use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use kube::runtime::{watcher, WatchStreamExt};
use rcgen::PublicKeyData;

use crate::{Error, Result};

const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// What an ECDSA key's kubelet client certificate is for.
const USAGES: [&str; 2] = ["digital signature", "client auth"];
/// How long the kubelet waits for its certificate.
const WAIT: Duration = Duration::from_secs(3600);

/// Makes sure `kubeconfig` holds a valid client certificate, bootstrapping one with the
/// credentials of `bootstrap` when it does not (upstream's LoadClientCert).
pub async fn load_client_cert(
    kubeconfig: &Path,
    bootstrap: &Path,
    cert_dir: &Path,
    node: &str,
) -> Result<()> {
    if client_config_still_valid(kubeconfig) {
        tracing::info!(path = %kubeconfig.display(), "Kubeconfig exists and is valid, skipping bootstrap");
        return Ok(());
    }
    let bad = |message: String| Error::Kubeconfig {
        path: bootstrap.to_owned(),
        message,
    };
    let boot = Kubeconfig::read_from(bootstrap).map_err(|e| bad(e.to_string()))?;
    let client = crate::client(bootstrap).await?;
    std::fs::create_dir_all(cert_dir).map_err(|e| io(cert_dir, e))?;
    let key_path = cert_dir.join("kubelet-client.key.tmp");
    let key = load_or_generate_key(&key_path)?;
    let csr_pem = request(&key, node)?;
    let name = csr_name(&key, node);
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let csr = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(csr_pem.into_bytes()),
            signer_name: SIGNER.into(),
            usages: Some(USAGES.iter().map(|u| (*u).to_owned()).collect()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &csr).await {
        Ok(_) => tracing::info!(csr = %name, "Waiting for client certificate to be issued"),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            tracing::info!(csr = %name, "csr for this node already exists, reusing")
        }
        Err(e) => return Err(e.into()),
    }
    let cert = tokio::time::timeout(WAIT, wait_for_certificate(&api, &name))
        .await
        .map_err(|_| {
            Error::Invalid(format!("timed out waiting for csr {name:?} to be issued"))
        })??;
    let current = store(cert_dir, &cert, &key.serialize_pem())?;
    write_kubeconfig(kubeconfig, &boot, bootstrap.parent(), &current)?;
    let _ = std::fs::remove_file(&key_path);
    tracing::info!(path = %kubeconfig.display(), "Client certificate issued; kubeconfig written");
    Ok(())
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Invalid(format!("{}: {e}", path.display()))
}

/// Whether the kubeconfig exists, loads, and every client certificate in it is unexpired.
fn client_config_still_valid(path: &Path) -> bool {
    let Ok(kc) = Kubeconfig::read_from(path) else {
        return false;
    };
    let ctx = kc.current_context.clone().unwrap_or_default();
    let user = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.user.clone().unwrap_or_default());
    let Some(auth) = user.and_then(|u| {
        kc.auth_infos
            .iter()
            .find(|a| a.name == u)
            .and_then(|a| a.auth_info.clone())
    }) else {
        return false;
    };
    let pem = if let Some(data) = &auth.client_certificate_data {
        match base64::engine::general_purpose::STANDARD.decode(data.trim()) {
            Ok(p) => p,
            Err(_) => return false,
        }
    } else if let Some(file) = &auth.client_certificate {
        let p = path.parent().unwrap_or(Path::new(".")).join(file);
        match std::fs::read(p) {
            Ok(p) => p,
            Err(_) => return false,
        }
    } else {
        return false;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let mut any = false;
    for block in x509_parser::pem::Pem::iter_from_buffer(&pem) {
        let Ok(block) = block else { return false };
        if block.label != "CERTIFICATE" {
            continue;
        }
        let Ok(cert) = block.parse_x509() else {
            return false;
        };
        if cert.validity().not_after.timestamp() < now {
            tracing::info!(
                "part of the existing bootstrap client certificate in {} is expired",
                path.display()
            );
            return false;
        }
        any = true;
    }
    any
}

/// The private key at `path`, made (ECDSA P-256, mode 0600) if there is none.
fn load_or_generate_key(path: &Path) -> Result<rcgen::KeyPair> {
    if let Ok(pem) = std::fs::read_to_string(path) {
        if let Ok(k) = rcgen::KeyPair::from_pem(&pem) {
            return Ok(k);
        }
    }
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| Error::Invalid(format!("generating the client key: {e}")))?;
    write_private(path, key.serialize_pem().as_bytes())?;
    Ok(key)
}

fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io(path, e))?;
    f.write_all(data).map_err(|e| io(path, e))
}

/// The PEM CSR for the node's client certificate.
fn request(key: &rcgen::KeyPair, node: &str) -> Result<String> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(|e| Error::Invalid(e.to_string()))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params
        .serialize_request(key)
        .and_then(|r| r.pem())
        .map_err(|e| Error::Invalid(format!("making the certificate request: {e}")))
}

/// `node-csr-` and the SHA-512/256 of the key, subject and usages, each base64url-encoded
/// and followed by `|` (upstream's digestedName): the same inputs give the same name.
fn csr_name(key: &rcgen::KeyPair, node: &str) -> String {
    let enc = |d: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(d);
    let mut input = String::new();
    let mut write = |d: &[u8]| {
        input.push_str(&enc(d));
        input.push('|');
    };
    write(&key.subject_public_key_info());
    write(format!("system:node:{node}").as_bytes());
    write(b"system:nodes");
    for u in USAGES {
        write(u.as_bytes());
    }
    let digest = ring::digest::digest(&ring::digest::SHA512_256, input.as_bytes());
    format!("node-csr-{}", enc(digest.as_ref()))
}

/// Watches the CSR until it is issued (its PEM certificate), denied or failed.
async fn wait_for_certificate(api: &Api<CertificateSigningRequest>, name: &str) -> Result<String> {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api.clone(), cfg).applied_objects().boxed();
    let mut uid: Option<String> = None;
    while let Some(csr) = events.try_next().await.map_err(|e| {
        Error::Invalid(format!(
            "cannot watch on the certificate signing request: {e}"
        ))
    })? {
        match (&uid, &csr.metadata.uid) {
            (None, u) => uid = u.clone(),
            (Some(a), Some(b)) if a != b => {
                return Err(Error::Invalid(format!("csr {name:?} changed UIDs")))
            }
            _ => {}
        }
        let conditions = csr
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        for c in &conditions {
            let reason = c.reason.clone().unwrap_or_default();
            let message = c.message.clone().unwrap_or_default();
            match c.type_.as_str() {
                "Denied" => {
                    return Err(Error::Invalid(format!(
                    "certificate signing request is denied, reason: {reason}, message: {message}"
                )))
                }
                "Failed" => {
                    return Err(Error::Invalid(format!(
                        "certificate signing request failed, reason: {reason}, message: {message}"
                    )))
                }
                _ => {}
            }
        }
        let approved = conditions.iter().any(|c| c.type_ == "Approved");
        let cert = csr.status.as_ref().and_then(|s| s.certificate.as_ref());
        match cert {
            Some(c) if approved && !c.0.is_empty() => {
                return String::from_utf8(c.0.clone())
                    .map_err(|e| Error::Invalid(format!("the issued certificate: {e}")))
            }
            _ if approved => tracing::info!(
                csr = name,
                "certificate signing request is approved, waiting to be issued"
            ),
            _ => {}
        }
    }
    Err(Error::Invalid(format!("csr {name:?} was deleted")))
}

/// Writes certificate and key to `kubelet-client-<time>.pem` and points
/// `kubelet-client-current.pem` at it; returns the latter's path.
fn store(dir: &Path, cert: &str, key: &str) -> Result<PathBuf> {
    let stamp = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%d-%H-%M-%S")
        .to_string();
    let file = dir.join(format!("kubelet-client-{stamp}.pem"));
    let mut pem = cert.trim_end().to_owned();
    pem.push('\n');
    pem.push_str(key);
    write_private(&file, pem.as_bytes())?;
    let updated = dir.join("kubelet-client-updated.pem");
    let current = dir.join("kubelet-client-current.pem");
    let _ = std::fs::remove_file(&updated);
    std::os::unix::fs::symlink(&file, &updated).map_err(|e| io(&updated, e))?;
    std::fs::rename(&updated, &current).map_err(|e| io(&current, e))?;
    Ok(current)
}

/// The kubeconfig upstream's kubelet writes: the bootstrap kubeconfig's cluster as
/// `default-cluster`, the stored certificate as `default-auth`.
fn write_kubeconfig(
    path: &Path,
    boot: &Kubeconfig,
    boot_dir: Option<&Path>,
    cert: &Path,
) -> Result<()> {
    let ctx = boot.current_context.clone().unwrap_or_default();
    let cluster_name = boot
        .contexts
        .iter()
        .find(|c| c.name == ctx)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .unwrap_or_default();
    let mut cluster: Cluster = boot
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| Error::Invalid("the bootstrap kubeconfig names no cluster".into()))?;
    // A CA file relative to the bootstrap kubeconfig stays valid from the new one.
    if let (Some(ca), Some(dir)) = (&cluster.certificate_authority, boot_dir) {
        cluster.certificate_authority = Some(dir.join(ca).display().to_string());
    }
    let cert = cert.display().to_string();
    let kc = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "default-cluster".into(),
            cluster: Some(cluster),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "default-auth".into(),
            auth_info: Some(AuthInfo {
                client_certificate: Some(cert.clone()),
                client_key: Some(cert),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "default-context".into(),
            context: Some(Context {
                cluster: "default-cluster".into(),
                user: Some("default-auth".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("default-context".into()),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Default::default()
    };
    let text = serde_yaml::to_string(&kc).map_err(|e| Error::Invalid(e.to_string()))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    }
    write_private(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_csr_name_follows_key_and_node() {
        let k1 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let k2 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let a = csr_name(&k1, "n1");
        assert!(a.starts_with("node-csr-"), "{a}");
        // 32 bytes of SHA-512/256 in unpadded base64url.
        assert_eq!(a.len(), "node-csr-".len() + 43);
        assert_eq!(a, csr_name(&k1, "n1"));
        assert_ne!(a, csr_name(&k1, "n2"));
        assert_ne!(a, csr_name(&k2, "n1"));
    }

    #[test]
    fn keys_are_kept_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.tmp");
        let k = load_or_generate_key(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            load_or_generate_key(&p).unwrap().serialize_pem(),
            k.serialize_pem()
        );
        assert!(!client_config_still_valid(&dir.path().join("missing")));
    }
}
