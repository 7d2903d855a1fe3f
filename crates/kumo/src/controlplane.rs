//! The control plane as kubeadm lays it out: a static pod manifest per component in the
//! control-plane node's manifest directory, so that its kubelet shows them as mirror pods
//! (`kube-apiserver-<node>`, ...) in `kube-system`. The components themselves run in the
//! `kumo up` process; the pods stand for them, and their health is the components' own:
//! kubeadm's probes go to the real endpoints on loopback (the API server's `/livez` and
//! `/readyz`, the controller-manager's `/healthz`, the scheduler's `/livez` and `/readyz`).
//! With the embedded store, which lives inside the API server, there is no `etcd` pod (as
//! with kubeadm's external etcd); a machine with a stacked etcd member (`crate::etcd`) has
//! one, probed on the member's metrics port.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};

/// Where the control plane's components serve.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// The API server's secure port.
    pub apiserver: u16,
    /// The controller-manager's and the scheduler's secure ports, when they run.
    pub controller_manager: Option<u16>,
    pub scheduler: Option<u16>,
    /// kube-apiserver's `--advertise-address` (127.0.0.1 when `None`).
    pub advertise_address: Option<std::net::IpAddr>,
    /// The machine's stacked etcd member, when the store is etcd.
    pub etcd: Option<EtcdPod>,
}

/// The cluster's name and address ranges, as kubeadm's ClusterConfiguration gives them
/// (`clusterName`, `networking.podSubnet`, `networking.serviceSubnet`): the
/// controller-manager hands nodes their pod ranges from the pod subnet, the
/// cloud-controller-manager names the cloud's routes and load balancers after the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Networking {
    pub cluster_name: String,
    pub pod_subnet: String,
    pub service_subnet: String,
}

impl Networking {
    /// The cluster DNS Service's address, as kubeadm picks it: the Service range's 10th
    /// address (`10.96.0.10`), where the kubelets point ClusterFirst pods.
    pub fn dns_ip(&self) -> String {
        let net = kumo_apiserver::registry::parse_service_cidr(&self.service_subnet)
            .map_or(std::net::Ipv4Addr::new(10, 96, 0, 0), |(net, _)| net);
        std::net::Ipv4Addr::from(u32::from(net).saturating_add(10)).to_string()
    }
}

impl Default for Networking {
    /// kubeadm's defaults (`kubernetes`, `10.96.0.0/12`), with the pod subnet kumo's own
    /// cluster uses.
    fn default() -> Self {
        Networking {
            cluster_name: "kubernetes".into(),
            pod_subnet: crate::cluster::CLUSTER_CIDR.into(),
            service_subnet: crate::cluster::SERVICE_CIDR.into(),
        }
    }
}

/// A stacked etcd member as its static pod shows it.
#[derive(Clone, Debug)]
pub struct EtcdPod {
    /// The member's command line (`etcd --name=...`).
    pub command: Vec<String>,
    pub client_url: String,
    pub metrics_port: u16,
    /// Its data directory.
    pub data_dir: std::path::PathBuf,
    /// The paths its liveness and readiness probes ask (`crate::etcd::health_paths`).
    pub health: (&'static str, &'static str),
}

/// The manifest file names this module owns.
const FILES: &[&str] = &[
    "etcd.yaml",
    "kube-apiserver.yaml",
    "kube-controller-manager.yaml",
    "kube-scheduler.yaml",
];

/// kubeadm's probe of a component's health endpoint on loopback.
fn probe(port: u16, path: &str, period: u64, failures: u64, initial_delay: u64) -> Value {
    let mut p = json!({
        "httpGet": {"host": "127.0.0.1", "path": path, "port": port, "scheme": "HTTPS"},
        "periodSeconds": period,
        "timeoutSeconds": 15,
        "failureThreshold": failures,
    });
    if initial_delay > 0 {
        p["initialDelaySeconds"] = json!(initial_delay);
    }
    p
}

/// kubeadm's probe of etcd's metrics listener (plain HTTP on loopback).
fn http_probe(port: u16, path: &str, period: u64, failures: u64, initial_delay: u64) -> Value {
    let mut p = probe(port, path, period, failures, initial_delay);
    p["httpGet"]["scheme"] = json!("HTTP");
    p
}

/// The etcd image kubeadm v1.37 runs.
const ETCD_IMAGE_TAG: &str = "3.7.0-0";

fn host_path(name: &str, path: &Path, kind: &str) -> (Value, Value) {
    let mount_path = path.display().to_string();
    (
        json!({"name": name, "hostPath": {"path": mount_path, "type": kind}}),
        json!({"name": name, "mountPath": mount_path, "readOnly": true}),
    )
}

/// A control-plane static pod (labels, priority and security as kubeadm writes them).
fn pod(
    component: &str,
    command: Vec<String>,
    cpu: &str,
    probes: Value,
    mounts: &[(Value, Value)],
) -> Value {
    let image = format!(
        "registry.k8s.io/{component}:{}",
        kumo_apiserver::KUBERNETES_VERSION
    );
    let mut container = json!({
        "name": component,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "resources": {"requests": {"cpu": cpu}},
        "volumeMounts": mounts.iter().map(|m| m.1.clone()).collect::<Vec<_>>(),
    });
    if let Some(m) = probes.as_object() {
        for (k, v) in m {
            container[k] = v.clone();
        }
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": component,
            "namespace": "kube-system",
            "labels": {"component": component, "tier": "control-plane"},
        },
        "spec": {
            "hostNetwork": true,
            "priority": 2000001000,
            "priorityClassName": "system-node-critical",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
            "volumes": mounts.iter().map(|m| m.0.clone()).collect::<Vec<_>>(),
        },
    })
}

/// The manifests of the components in `ep`, for a cluster whose data directory is
/// `data_dir`: (file name, pod).
pub fn manifests(data_dir: &Path, ep: &Endpoints, net: &Networking) -> Vec<(&'static str, Value)> {
    let pki = data_dir.join("pki");
    let certs = host_path("k8s-certs", &pki, "DirectoryOrCreate");
    let mut out = Vec::new();
    let port = ep.apiserver;
    let advertise = ep
        .advertise_address
        .unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
    if let Some(e) = &ep.etcd {
        let mut etcd = pod(
            "etcd",
            e.command.clone(),
            "100m",
            json!({
                "livenessProbe": http_probe(e.metrics_port, e.health.0, 10, 8, 10),
                "readinessProbe": http_probe(e.metrics_port, e.health.1, 1, 3, 0),
                "startupProbe": http_probe(e.metrics_port, e.health.1, 10, 24, 10),
            }),
            &[
                host_path("etcd-certs", &pki.join("etcd"), "DirectoryOrCreate"),
                host_path("etcd-data", &e.data_dir, "DirectoryOrCreate"),
            ],
        );
        etcd["metadata"]["annotations"] = json!({
            "kubeadm.kubernetes.io/etcd.advertise-client-urls": e.client_url,
        });
        etcd["spec"]["containers"][0]["image"] =
            json!(format!("registry.k8s.io/etcd:{ETCD_IMAGE_TAG}"));
        out.push(("etcd.yaml", etcd));
    }
    let mut command = vec![
        "kube-apiserver".into(),
        format!("--advertise-address={advertise}"),
        "--allow-privileged=true".into(),
        "--authorization-mode=Node,RBAC".into(),
        format!("--client-ca-file={}", pki.join("ca.crt").display()),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--enable-bootstrap-token-auth=true".into(),
    ];
    if let Some(e) = &ep.etcd {
        command.extend([
            format!("--etcd-cafile={}", pki.join("etcd/ca.crt").display()),
            format!(
                "--etcd-certfile={}",
                pki.join("apiserver-etcd-client.crt").display()
            ),
            format!(
                "--etcd-keyfile={}",
                pki.join("apiserver-etcd-client.key").display()
            ),
            format!("--etcd-servers={}", e.client_url),
        ]);
    }
    command.extend([
        format!("--secure-port={port}"),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-cluster-ip-range={}", net.service_subnet),
    ]);
    let mut api = pod(
        "kube-apiserver",
        command,
        "250m",
        json!({
            "livenessProbe": probe(port, "/livez", 10, 8, 10),
            "readinessProbe": probe(port, "/readyz", 1, 3, 0),
            "startupProbe": probe(port, "/livez", 10, 24, 10),
        }),
        std::slice::from_ref(&certs),
    );
    api["metadata"]["annotations"] = json!({
        "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint": format!("{advertise}:{port}"),
    });
    out.push(("kube-apiserver.yaml", api));
    if let Some(p) = ep.controller_manager {
        let conf = data_dir.join("controller-manager.conf");
        out.push((
            "kube-controller-manager.yaml",
            pod(
                "kube-controller-manager",
                vec![
                    "kube-controller-manager".into(),
                    "--allocate-node-cidrs=true".into(),
                    format!("--authentication-kubeconfig={}", conf.display()),
                    format!("--authorization-kubeconfig={}", conf.display()),
                    "--bind-address=127.0.0.1".into(),
                    format!("--cluster-cidr={}", net.pod_subnet),
                    format!("--cluster-name={}", net.cluster_name),
                    format!(
                        "--cluster-signing-cert-file={}",
                        pki.join("ca.crt").display()
                    ),
                    format!(
                        "--cluster-signing-key-file={}",
                        pki.join("ca.key").display()
                    ),
                    "--controllers=*,bootstrapsigner,tokencleaner".into(),
                    format!("--kubeconfig={}", conf.display()),
                    "--leader-elect=true".into(),
                    format!("--secure-port={p}"),
                    format!("--service-cluster-ip-range={}", net.service_subnet),
                    "--use-service-account-credentials=true".into(),
                ],
                "200m",
                json!({
                    "livenessProbe": probe(p, "/healthz", 10, 8, 10),
                    "startupProbe": probe(p, "/healthz", 10, 24, 10),
                }),
                &[
                    certs.clone(),
                    host_path("kubeconfig", &conf, "FileOrCreate"),
                ],
            ),
        ));
    }
    if let Some(p) = ep.scheduler {
        let conf = data_dir.join("scheduler.conf");
        out.push((
            "kube-scheduler.yaml",
            pod(
                "kube-scheduler",
                vec![
                    "kube-scheduler".into(),
                    format!("--authentication-kubeconfig={}", conf.display()),
                    format!("--authorization-kubeconfig={}", conf.display()),
                    "--bind-address=127.0.0.1".into(),
                    format!("--kubeconfig={}", conf.display()),
                    "--leader-elect=true".into(),
                    format!("--secure-port={p}"),
                ],
                "100m",
                json!({
                    "livenessProbe": probe(p, "/livez", 10, 8, 10),
                    "readinessProbe": probe(p, "/readyz", 1, 3, 0),
                    "startupProbe": probe(p, "/livez", 10, 24, 10),
                }),
                &[host_path("kubeconfig", &conf, "FileOrCreate")],
            ),
        ));
    }
    out
}

/// Writes the manifests into `dir` (only those that changed, so the kubelet keeps the
/// running pods) and removes those of components that no longer run.
pub fn write_manifests(
    dir: &Path,
    data_dir: &Path,
    ep: &Endpoints,
    net: &Networking,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let wanted = manifests(data_dir, ep, net);
    for (file, pod) in &wanted {
        let path = dir.join(file);
        let text = serde_yaml::to_string(pod).context("encoding a static pod")?;
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    for file in FILES {
        if !wanted.iter().any(|(f, _)| f == file) {
            let _ = std::fs::remove_file(dir.join(file));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_are_kubeadms_with_the_real_ports() {
        let ep = Endpoints {
            apiserver: 6443,
            controller_manager: Some(10257),
            scheduler: None,
            advertise_address: None,
            etcd: None,
        };
        let m = manifests(Path::new("/d"), &ep, &Networking::default());
        let names: Vec<&str> = m.iter().map(|(f, _)| *f).collect();
        assert_eq!(
            names,
            ["kube-apiserver.yaml", "kube-controller-manager.yaml"]
        );
        let api = &m[0].1;
        assert_eq!(
            api["spec"]["containers"][0]["image"],
            "registry.k8s.io/kube-apiserver:v1.37.2"
        );
        assert_eq!(
            api["spec"]["containers"][0]["readinessProbe"]["httpGet"],
            json!({"host": "127.0.0.1", "path": "/readyz", "port": 6443, "scheme": "HTTPS"})
        );
        assert_eq!(api["metadata"]["labels"]["tier"], "control-plane");
        let cm = &m[1].1["spec"]["containers"][0];
        assert_eq!(cm["livenessProbe"]["httpGet"]["port"], 10257);
        assert!(cm.get("readinessProbe").is_none());
    }

    #[test]
    fn a_stacked_member_is_an_etcd_pod_and_the_api_servers_store() {
        let ep = Endpoints {
            apiserver: 40000,
            controller_manager: None,
            scheduler: None,
            advertise_address: Some("10.0.1.5".parse().unwrap()),
            etcd: Some(EtcdPod {
                command: vec!["etcd".into(), "--name=cp-1".into()],
                client_url: "https://127.0.0.1:40001".into(),
                metrics_port: 40002,
                data_dir: "/m/var/lib/etcd".into(),
                health: ("/livez", "/readyz"),
            }),
        };
        let m = manifests(Path::new("/d"), &ep, &Networking::default());
        assert_eq!(m[0].0, "etcd.yaml");
        let etcd = &m[0].1;
        assert_eq!(
            etcd["metadata"]["annotations"]["kubeadm.kubernetes.io/etcd.advertise-client-urls"],
            "https://127.0.0.1:40001"
        );
        let c = &etcd["spec"]["containers"][0];
        assert_eq!(c["command"], json!(["etcd", "--name=cp-1"]));
        assert_eq!(
            c["readinessProbe"]["httpGet"],
            json!({"host": "127.0.0.1", "path": "/readyz", "port": 40002, "scheme": "HTTP"})
        );
        let api = &m[1].1;
        let flags: Vec<&str> = api["spec"]["containers"][0]["command"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f.as_str())
            .collect();
        assert!(flags.contains(&"--advertise-address=10.0.1.5"), "{flags:?}");
        assert!(
            flags.contains(&"--etcd-servers=https://127.0.0.1:40001"),
            "{flags:?}"
        );
        assert!(
            flags.contains(&"--etcd-certfile=/d/pki/apiserver-etcd-client.crt"),
            "{flags:?}"
        );
        assert_eq!(
            api["metadata"]["annotations"]
                ["kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint"],
            "10.0.1.5:40000"
        );
    }
}
