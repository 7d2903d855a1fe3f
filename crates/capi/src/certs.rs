//! A workload cluster's certificates as Cluster API keeps them: the Secrets `<cluster>-ca`,
//! `-etcd`, `-proxy` (front proxy) and `-sa` (service-account key pair), type
//! `cluster.x-k8s.io/secret`, keys `tls.crt` and `tls.key`, labelled with the cluster's
//! name; and the `<cluster>-kubeconfig` Secret (key `value`) an admin of it uses.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};
use kumo_apiserver::pki::Ca;

use crate::Error;

/// The Secrets' type.
pub const SECRET_TYPE: &str = "cluster.x-k8s.io/secret";

/// One certificate pair of a cluster, by its Secret's suffix and kubeadm's file name.
#[derive(Clone, Copy, Debug)]
pub struct Purpose {
    pub suffix: &'static str,
    /// kubeadm's name under /etc/kubernetes/pki (`ca`, `etcd/ca`, `front-proxy-ca`, `sa`).
    pub file: &'static str,
    pub cn: &'static str,
}

pub const CLUSTER_CA: Purpose = Purpose {
    suffix: "ca",
    file: "ca",
    cn: "kubernetes",
};
pub const ETCD_CA: Purpose = Purpose {
    suffix: "etcd",
    file: "etcd/ca",
    cn: "etcd-ca",
};
pub const FRONT_PROXY_CA: Purpose = Purpose {
    suffix: "proxy",
    file: "front-proxy-ca",
    cn: "front-proxy-ca",
};
pub const SERVICE_ACCOUNT: Purpose = Purpose {
    suffix: "sa",
    file: "sa",
    cn: "",
};
pub const ALL: [Purpose; 4] = [CLUSTER_CA, ETCD_CA, FRONT_PROXY_CA, SERVICE_ACCOUNT];

/// A Secret of cluster `cluster` as Cluster API keeps them: type [`SECRET_TYPE`], the
/// cluster-name label, owned by `owner`.
pub fn cluster_secret(
    namespace: &str,
    name: &str,
    cluster: &str,
    owner: Option<OwnerReference>,
    data: Vec<(&str, Vec<u8>)>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                crate::CLUSTER_NAME_LABEL.into(),
                cluster.into(),
            )])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k.to_owned(), ByteString(v)))
                .collect(),
        ),
        ..Default::default()
    }
}

/// A certificate pair, PEM.
#[derive(Clone, Debug)]
pub struct Pair {
    pub purpose: Purpose,
    pub cert: String,
    pub key: String,
}

fn data(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()?
        .get(key)
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
}

/// The cluster's certificate pairs: each read from its Secret, or generated and stored
/// (owned by `owner`) when missing (upstream's LookupOrGenerate).
pub async fn lookup_or_generate(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
    owner: Option<OwnerReference>,
) -> Result<Vec<Pair>, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut out = Vec::new();
    for p in ALL {
        let name = format!("{cluster}-{}", p.suffix);
        if let Some(s) = secrets.get_opt(&name).await? {
            if let (Some(cert), Some(key)) = (data(&s, "tls.crt"), data(&s, "tls.key")) {
                out.push(Pair {
                    purpose: p,
                    cert,
                    key,
                });
                continue;
            }
        }
        let pair = generate(p)?;
        let secret = cluster_secret(
            namespace,
            &name,
            cluster,
            owner.clone(),
            vec![
                ("tls.crt", pair.cert.clone().into_bytes()),
                ("tls.key", pair.key.clone().into_bytes()),
            ],
        );
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => out.push(pair),
            // Made meanwhile by the other provider: read it.
            Err(e) if kumo_client::error::is_already_exists(&e) => {
                let s = secrets.get(&name).await?;
                let (Some(cert), Some(key)) = (data(&s, "tls.crt"), data(&s, "tls.key")) else {
                    return Err(Error::Invalid(format!(
                        "{namespace}/{name} has no tls.crt and tls.key"
                    )));
                };
                out.push(Pair {
                    purpose: p,
                    cert,
                    key,
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

fn generate(p: Purpose) -> Result<Pair, Error> {
    if p.suffix == SERVICE_ACCOUNT.suffix {
        // The service-account signing key: an ECDSA P-256 pair, the public half as `tls.crt`.
        let kp = rcgen::KeyPair::generate().map_err(|e| Error::Invalid(e.to_string()))?;
        return Ok(Pair {
            purpose: p,
            cert: kp.public_key_pem(),
            key: kp.serialize_pem(),
        });
    }
    let ca = Ca::generate(p.file, p.cn).map_err(|e| Error::Invalid(e.to_string()))?;
    let key = ca.key_pem().unwrap_or_default();
    Ok(Pair {
        purpose: p,
        cert: ca.cert_pem.clone(),
        key,
    })
}

/// kubeadm's discovery hash of a CA: `sha256:` and the hex SHA-256 of its
/// SubjectPublicKeyInfo.
pub fn ca_cert_hash(ca_pem: &str) -> Result<String, Error> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes())
        .map_err(|e| Error::Invalid(format!("the CA certificate: {e}")))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| Error::Invalid(format!("the CA certificate: {e}")))?;
    let digest = ring::digest::digest(&ring::digest::SHA256, cert.public_key().raw);
    Ok(format!(
        "sha256:{}",
        digest
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
}

/// An admin kubeconfig of cluster `cluster` at `server` (`https://host:port`): user
/// `<cluster>-admin` with a client certificate for `kubernetes-admin` in `system:masters`,
/// signed by the cluster CA, as upstream's kubeconfig Secret holds.
pub fn admin_kubeconfig(cluster: &str, server: &str, ca: &Pair) -> Result<String, Error> {
    let ca_obj =
        Ca::from_pem("ca", &ca.cert, &ca.key).map_err(|e| Error::Invalid(e.to_string()))?;
    let leaf = ca_obj
        .issue_client("kubernetes-admin", &["system:masters"])
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user = format!("{cluster}-admin");
    let context = format!("{user}@{cluster}");
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\ncontexts:\n- name: {context}\n  context:\n    cluster: {cluster}\n    user: {user}\ncurrent-context: {context}\npreferences: {{}}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(&ca.cert),
        b64(&leaf.cert_pem),
        b64(&leaf.key_pem),
    ))
}
