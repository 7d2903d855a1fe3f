//! The kubeadm bootstrap provider's output: a machine's bootstrap data, cloud-init
//! (`#cloud-config`) that writes the cluster's certificates and a kubeadm configuration
//! (kubeadm.k8s.io/v1beta4) and runs `kubeadm init` or `kubeadm join`, as upstream's
//! KubeadmConfig controller renders it. The machine image (kumo's hypervisor) reads it.

use serde_json::{json, Value};

use crate::certs::Pair;

/// kubeadm's configuration API version the bootstrap data is written in.
pub const KUBEADM_API: &str = "kubeadm.k8s.io/v1beta4";
/// Where the init configuration is written.
pub const INIT_CONFIG_PATH: &str = "/run/kubeadm/kubeadm.yaml";
/// Where the join configuration is written.
pub const JOIN_CONFIG_PATH: &str = "/run/kubeadm/kubeadm-join-config.yaml";
/// The file the commands leave when they succeed (CAPI's bootstrap success sentinel).
pub const SENTINEL: &str = "/run/cluster-api/bootstrap-success.complete";

/// What the cluster tells its machines.
#[derive(Clone, Debug, Default)]
pub struct ClusterFacts {
    pub name: String,
    /// `host:port`.
    pub endpoint: String,
    pub version: String,
    pub pod_cidr: Option<String>,
    pub service_cidr: Option<String>,
    pub dns_domain: Option<String>,
}

/// A file of cloud-init's `write_files`.
fn file(path: &str, permissions: &str, content: &str) -> Value {
    json!({"path": path, "owner": "root:root", "permissions": permissions, "content": content})
}

/// The certificate files of a control-plane machine (`/etc/kubernetes/pki/...`).
fn cert_files(certs: &[Pair]) -> Vec<Value> {
    let mut v = Vec::new();
    for p in certs {
        let base = format!("/etc/kubernetes/pki/{}", p.purpose.file);
        let (crt, key) = if p.purpose.suffix == crate::certs::SERVICE_ACCOUNT.suffix {
            (format!("{base}.pub"), format!("{base}.key"))
        } else {
            (format!("{base}.crt"), format!("{base}.key"))
        };
        v.push(file(&crt, "0640", &p.cert));
        v.push(file(&key, "0600", &p.key));
    }
    v
}

/// A YAML stream of `docs`.
fn yaml_stream(docs: &[Value]) -> String {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(d).unwrap_or_default());
    }
    out
}

/// The kubeadm ClusterConfiguration: the KubeadmConfig's, with what the Cluster decides.
fn cluster_configuration(spec: &Value, facts: &ClusterFacts) -> Value {
    let mut c = spec
        .get("clusterConfiguration")
        .cloned()
        .unwrap_or_else(|| json!({}));
    c["apiVersion"] = KUBEADM_API.into();
    c["kind"] = "ClusterConfiguration".into();
    c["clusterName"] = facts.name.clone().into();
    c["controlPlaneEndpoint"] = facts.endpoint.clone().into();
    c["kubernetesVersion"] = facts.version.clone().into();
    let mut net = json!({});
    if let Some(p) = &facts.pod_cidr {
        net["podSubnet"] = p.clone().into();
    }
    if let Some(s) = &facts.service_cidr {
        net["serviceSubnet"] = s.clone().into();
    }
    if let Some(d) = &facts.dns_domain {
        net["dnsDomain"] = d.clone().into();
    }
    c["networking"] = net;
    c
}

/// The node registration of a kubeadm configuration, its name the machine's host name
/// unless the KubeadmConfig gives one.
fn node_registration(section: Option<&Value>) -> Value {
    let mut n = section
        .and_then(|s| s.get("nodeRegistration"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    if n.get("name").is_none() {
        n["name"] = "{{ ds.meta_data.local_hostname }}".into();
    }
    n
}

fn cloud_config(files: Vec<Value>, command: String, spec: &Value) -> String {
    let mut runcmd: Vec<Value> = spec
        .get("preKubeadmCommands")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    runcmd.push(command.into());
    runcmd.extend(
        spec.get("postKubeadmCommands")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    );
    let mut files = files;
    files.extend(
        spec.get("files")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f.get("content").is_some()),
    );
    let doc = json!({"write_files": files, "runcmd": runcmd});
    format!(
        "## template: jinja\n#cloud-config\n{}",
        serde_yaml::to_string(&doc).unwrap_or_default()
    )
}

/// `kubeadm init`'s bootstrap data for the first control-plane machine.
pub fn init_data(spec: &Value, facts: &ClusterFacts, certs: &[Pair]) -> String {
    let mut init = spec
        .get("initConfiguration")
        .cloned()
        .unwrap_or_else(|| json!({}));
    init["apiVersion"] = KUBEADM_API.into();
    init["kind"] = "InitConfiguration".into();
    init["nodeRegistration"] = node_registration(spec.get("initConfiguration"));
    let config = yaml_stream(&[cluster_configuration(spec, facts), init]);
    let mut files = cert_files(certs);
    files.push(file(INIT_CONFIG_PATH, "0640", &config));
    cloud_config(
        files,
        format!("kubeadm init --config {INIT_CONFIG_PATH} && echo success > {SENTINEL}"),
        spec,
    )
}

/// `kubeadm join`'s bootstrap data: with the bootstrap `token` and the CA's hash; a
/// control-plane machine (`certs` given) gets the cluster's certificates too.
pub fn join_data(
    spec: &Value,
    facts: &ClusterFacts,
    token: &str,
    ca_hash: &str,
    certs: Option<&[Pair]>,
) -> String {
    let mut join = spec
        .get("joinConfiguration")
        .cloned()
        .unwrap_or_else(|| json!({}));
    join["apiVersion"] = KUBEADM_API.into();
    join["kind"] = "JoinConfiguration".into();
    join["nodeRegistration"] = node_registration(spec.get("joinConfiguration"));
    join["discovery"] = json!({"bootstrapToken": {
        "apiServerEndpoint": facts.endpoint,
        "token": token,
        "caCertHashes": [ca_hash],
    }});
    let mut files = Vec::new();
    if let Some(certs) = certs {
        files = cert_files(certs);
        if join.get("controlPlane").is_none() {
            join["controlPlane"] = json!({});
        }
    }
    files.push(file(JOIN_CONFIG_PATH, "0640", &yaml_stream(&[join])));
    cloud_config(
        files,
        format!("kubeadm join --config {JOIN_CONFIG_PATH} && echo success > {SENTINEL}"),
        spec,
    )
}

/// The group a bootstrap token's kubelets join in (kubeadm's default node token).
pub const DEFAULT_NODE_TOKEN_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// The Secret `kube-system/bootstrap-token-<id>` of bootstrap token `id.secret`, for
/// authentication and signing, in [`DEFAULT_NODE_TOKEN_GROUP`], expiring at `expiration`
/// (RFC 3339).
pub fn bootstrap_token_secret(
    id: &str,
    secret: &str,
    description: &str,
    expiration: &str,
) -> k8s_openapi::api::core::v1::Secret {
    let data = [
        ("description", description),
        ("token-id", id),
        ("token-secret", secret),
        ("expiration", expiration),
        ("usage-bootstrap-authentication", "true"),
        ("usage-bootstrap-signing", "true"),
        ("auth-extra-groups", DEFAULT_NODE_TOKEN_GROUP),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    k8s_openapi::api::core::v1::Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(format!("bootstrap-token-{id}")),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".into()),
        string_data: Some(data),
        ..Default::default()
    }
}

/// A new bootstrap token, `[a-z0-9]{6}.[a-z0-9]{16}`.
pub fn new_token() -> (String, String) {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let random = |n: usize| -> String {
        (0..n)
            .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
            .collect()
    };
    (random(6), random(16))
}
