//! kubeadm's addons, created once as `kubeadm init` creates them: CoreDNS (the `coredns`
//! Deployment behind the `kube-dns` Service at 10.96.0.10, with its ServiceAccount,
//! ClusterRole and Corefile) and kube-proxy (a DaemonSet on every node, with its
//! ServiceAccount bound to `system:node-proxier`). Their pods run on the simulated
//! runtime and stand for the work done in the `kumo up` process: name resolution and
//! Service routing are the shared simulated network's, programmed by the one kube-proxy
//! the process runs. Also metrics-server (as k3s ships it, and as kubeadm clusters add it:
//! its ServiceAccount, RBAC, Deployment, Service and the `v1beta1.metrics.k8s.io`
//! APIService), whose pod's connections are served by the `kumo-metrics-server` the process
//! runs. Objects that exist are left as they are (a user's changes stay).

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::{json, Value};

/// kubeadm's CoreDNS image for this Kubernetes version.
pub const COREDNS_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.12.1";

const COREFILE: &str = ".:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
";

/// kubeadm's kube-proxy configuration (the fields it sets), for a cluster whose pods are
/// in `pod_subnet`.
fn kube_proxy_config(pod_subnet: &str) -> String {
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clusterCIDR: {pod_subnet}
mode: iptables
"
    )
}

/// Creates `obj` unless an object of its name exists.
async fn create<K>(api: Api<K>, obj: Value) -> Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
    // Looked up first: creating an existing Service fails on its ClusterIP before its
    // name (422, as upstream), not with AlreadyExists.
    if api
        .get_opt(&name)
        .await
        .with_context(|| format!("reading {name}"))?
        .is_some()
    {
        return Ok(());
    }
    let typed: K = serde_json::from_value(obj).with_context(|| format!("addon object {name}"))?;
    match api.create(&PostParams::default(), &typed).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {name}")),
    }
}

/// metrics-server's objects, after its upstream manifest (components.yaml of v0.8.0). Its
/// ClusterRole also grants `nodes/proxy`: kumo's metrics-server reaches the kubelets through
/// the API server's node proxy (see `kumo_metrics_server::scrape`).
async fn metrics_server(client: &Client) -> Result<()> {
    let ns = "kube-system";
    let labels = json!({"k8s-app": "metrics-server"});
    create(
        Api::<ServiceAccount>::namespaced(client.clone(), ns),
        json!({"metadata": {"name": "metrics-server", "namespace": ns, "labels": labels}}),
    )
    .await?;
    let cr: Api<ClusterRole> = Api::all(client.clone());
    let crb: Api<ClusterRoleBinding> = Api::all(client.clone());
    create(
        cr.clone(),
        json!({
            "metadata": {"name": "system:aggregated-metrics-reader", "labels": {
                "k8s-app": "metrics-server",
                "rbac.authorization.k8s.io/aggregate-to-admin": "true",
                "rbac.authorization.k8s.io/aggregate-to-edit": "true",
                "rbac.authorization.k8s.io/aggregate-to-view": "true",
            }},
            "rules": [{"apiGroups": ["metrics.k8s.io"], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}],
        }),
    )
    .await?;
    create(
        cr,
        json!({
            "metadata": {"name": "system:metrics-server", "labels": labels},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes/metrics", "nodes/proxy"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
            ],
        }),
    )
    .await?;
    create(
        Api::<RoleBinding>::namespaced(client.clone(), ns),
        json!({
            "metadata": {"name": "metrics-server-auth-reader", "namespace": ns, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "extension-apiserver-authentication-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "metrics-server", "namespace": ns}],
        }),
    )
    .await?;
    for (name, role) in [
        (
            "metrics-server:system:auth-delegator",
            "system:auth-delegator",
        ),
        ("system:metrics-server", "system:metrics-server"),
    ] {
        create(
            crb.clone(),
            json!({
                "metadata": {"name": name, "labels": labels},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "metrics-server", "namespace": ns}],
            }),
        )
        .await?;
    }
    create(
        Api::<Service>::namespaced(client.clone(), ns),
        json!({
            "metadata": {"name": "metrics-server", "namespace": ns, "labels": labels},
            "spec": {
                "selector": labels,
                "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": "https"}],
            },
        }),
    )
    .await?;
    create(
        Api::<Deployment>::namespaced(client.clone(), ns),
        json!({
            "metadata": {"name": "metrics-server", "namespace": ns, "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "strategy": {"rollingUpdate": {"maxUnavailable": 0}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "priorityClassName": "system-cluster-critical",
                        "serviceAccountName": "metrics-server",
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                        "containers": [{
                            "name": "metrics-server",
                            "image": kumo_metrics_server::IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "args": [
                                "--cert-dir=/tmp",
                                format!("--secure-port={}", kumo_metrics_server::PORT),
                                "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
                                "--kubelet-use-node-status-port",
                                "--metric-resolution=15s",
                            ],
                            "ports": [{"name": "https", "containerPort": kumo_metrics_server::PORT, "protocol": "TCP"}],
                            "readinessProbe": {
                                "httpGet": {"path": "/readyz", "port": "https", "scheme": "HTTPS"},
                                "initialDelaySeconds": 20, "periodSeconds": 10, "failureThreshold": 3,
                            },
                            "livenessProbe": {
                                "httpGet": {"path": "/livez", "port": "https", "scheme": "HTTPS"},
                                "periodSeconds": 10, "failureThreshold": 3,
                            },
                            "resources": {"requests": {"cpu": "100m", "memory": "200Mi"}},
                            "securityContext": {
                                "allowPrivilegeEscalation": false,
                                "capabilities": {"drop": ["ALL"]},
                                "readOnlyRootFilesystem": true,
                                "runAsNonRoot": true,
                                "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                            "volumeMounts": [{"name": "tmp-dir", "mountPath": "/tmp"}],
                        }],
                        "volumes": [{"name": "tmp-dir", "emptyDir": {}}],
                    },
                },
            },
        }),
    )
    .await?;
    create(
        Api::<APIService>::all(client.clone()),
        json!({
            "metadata": {"name": "v1beta1.metrics.k8s.io", "labels": labels},
            "spec": {
                "group": "metrics.k8s.io",
                "version": "v1beta1",
                "service": {"name": "metrics-server", "namespace": ns},
                "insecureSkipTLSVerify": true,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        }),
    )
    .await?;
    Ok(())
}

/// Creates the addons that do not exist yet, for the simulated runtime.
pub async fn ensure(client: &Client, net: &crate::controlplane::Networking) -> Result<()> {
    coredns(client, &DnsPods::Simulated, &net.dns_ip()).await?;
    kube_proxy(client, &net.pod_subnet).await?;
    metrics_server(client).await
}

/// Creates the addons of a cluster on the real runtime: the `coredns` pods run the kumo
/// binary's cluster DNS (`kumo dns`), mounted from this machine into an image that holds
/// its libraries. kube-proxy runs in the `kumo up` process, one per node in the node's
/// namespace, so it has no DaemonSet here.
pub async fn ensure_real(
    client: &Client,
    kumo_binary: &std::path::Path,
    dns_ip: &str,
) -> Result<()> {
    coredns(
        client,
        &DnsPods::Kumo {
            binary: kumo_binary.to_owned(),
        },
        dns_ip,
    )
    .await
}

/// What the `coredns` pods run.
enum DnsPods {
    /// Upstream's image, on the simulated runtime (the process's shared network answers).
    Simulated,
    /// `kumo dns` from the binary at `binary`, in [`DNS_IMAGE`].
    Kumo { binary: std::path::PathBuf },
}

/// The image the real runtime's `coredns` pods run: the kumo binary's libraries (the
/// binary itself is mounted from the machine).
pub fn dns_image() -> String {
    format!("kumo.dev/kumo-dns:v{}", env!("CARGO_PKG_VERSION"))
}

/// Where the `coredns` pods find the kumo binary.
pub const DNS_BINARY_MOUNT: &str = "/kumo/kumo";

/// CoreDNS and the `kube-dns` Service at `dns_ip` (the kubelets' clusterDNS).
async fn coredns(client: &Client, pods: &DnsPods, dns_ip: &str) -> Result<()> {
    let ns = "kube-system";
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let cm: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cr: Api<ClusterRole> = Api::all(client.clone());
    let crb: Api<ClusterRoleBinding> = Api::all(client.clone());

    create(
        sa.clone(),
        json!({"metadata": {"name": "coredns", "namespace": ns}}),
    )
    .await?;
    create(
        cr,
        json!({
            "metadata": {"name": "system:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        }),
    )
    .await?;
    create(
        crb.clone(),
        json!({
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": ns}],
        }),
    )
    .await?;
    create(
        cm.clone(),
        json!({"metadata": {"name": "coredns", "namespace": ns}, "data": {"Corefile": COREFILE}}),
    )
    .await?;
    let dns_labels = json!({"k8s-app": "kube-dns"});
    let mut container = json!({
        "name": "coredns",
        "image": COREDNS_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": ["-conf", "/etc/coredns/Corefile"],
    });
    let mut volumes = vec![
        json!({"name": "config-volume", "configMap": {"name": "coredns", "items": [{"key": "Corefile", "path": "Corefile"}]}}),
    ];
    let mut mounts =
        vec![json!({"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": true})];
    if let DnsPods::Kumo { binary } = pods {
        container["image"] = json!(dns_image());
        container["command"] = json!([DNS_BINARY_MOUNT, "dns"]);
        container["args"] = json!(["--conf", "/etc/coredns/Corefile"]);
        volumes.push(json!({"name": "kumo", "hostPath": {"path": binary, "type": "File"}}));
        mounts.push(json!({"name": "kumo", "mountPath": DNS_BINARY_MOUNT, "readOnly": true}));
    }
    let rest = json!({
        "resources": {"limits": {"memory": "170Mi"}, "requests": {"cpu": "100m", "memory": "70Mi"}},
        "ports": [
            {"name": "dns", "containerPort": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 9153, "protocol": "TCP"},
            {"name": "liveness-probe", "containerPort": 8080, "protocol": "TCP"},
            {"name": "readiness-probe", "containerPort": 8181, "protocol": "TCP"},
        ],
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "liveness-probe", "scheme": "HTTP"},
            "initialDelaySeconds": 60, "timeoutSeconds": 5, "successThreshold": 1, "failureThreshold": 5,
        },
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "readiness-probe", "scheme": "HTTP"}},
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
            "readOnlyRootFilesystem": true,
        },
        "volumeMounts": mounts,
    });
    if let (Some(c), Some(r)) = (container.as_object_mut(), rest.as_object()) {
        c.extend(r.clone());
    }
    create(
        Api::<Service>::namespaced(client.clone(), ns),
        json!({
            "metadata": {
                "name": "kube-dns",
                "namespace": ns,
                "labels": {"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"},
                "annotations": {"prometheus.io/port": "9153", "prometheus.io/scrape": "true"},
            },
            "spec": {
                "clusterIP": dns_ip,
                "selector": dns_labels,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                    {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153},
                ],
            },
        }),
    )
    .await?;
    create(
        Api::<Deployment>::namespaced(client.clone(), ns),
        json!({
            "metadata": {"name": "coredns", "namespace": ns, "labels": dns_labels},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": dns_labels},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": dns_labels},
                    "spec": {
                        "priorityClassName": "system-cluster-critical",
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                        "tolerations": [
                            {"key": "CriticalAddonsOnly", "operator": "Exists"},
                            {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
                        ],
                        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                            "weight": 100,
                            "podAffinityTerm": {
                                "labelSelector": {"matchExpressions": [{"key": "k8s-app", "operator": "In", "values": ["kube-dns"]}]},
                                "topologyKey": "kubernetes.io/hostname",
                            },
                        }]}},
                        "containers": [container],
                        "volumes": volumes,
                    },
                },
            },
        }),
    )
    .await?;
    Ok(())
}

async fn kube_proxy(client: &Client, pod_subnet: &str) -> Result<()> {
    let ns = "kube-system";
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let cm: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let crb: Api<ClusterRoleBinding> = Api::all(client.clone());
    create(
        sa,
        json!({"metadata": {"name": "kube-proxy", "namespace": ns}}),
    )
    .await?;
    create(
        crb,
        json!({
            "metadata": {"name": "kubeadm:node-proxier"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-proxier"},
            "subjects": [{"kind": "ServiceAccount", "name": "kube-proxy", "namespace": ns}],
        }),
    )
    .await?;
    create(
        cm,
        json!({"metadata": {"name": "kube-proxy", "namespace": ns, "labels": {"app": "kube-proxy"}}, "data": {"config.conf": kube_proxy_config(pod_subnet)}}),
    )
    .await?;
    let proxy_labels = json!({"k8s-app": "kube-proxy"});
    create(
        Api::<DaemonSet>::namespaced(client.clone(), ns),
        json!({
            "metadata": {"name": "kube-proxy", "namespace": ns, "labels": proxy_labels},
            "spec": {
                "selector": {"matchLabels": proxy_labels},
                "updateStrategy": {"type": "RollingUpdate"},
                "template": {
                    "metadata": {"labels": proxy_labels},
                    "spec": {
                        "priorityClassName": "system-node-critical",
                        "hostNetwork": true,
                        "serviceAccountName": "kube-proxy",
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [{
                            "name": "kube-proxy",
                            "image": format!("registry.k8s.io/kube-proxy:{}", kumo_apiserver::KUBERNETES_VERSION),
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=$(NODE_NAME)"],
                            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}}],
                            "securityContext": {"privileged": true},
                            "volumeMounts": [
                                {"name": "kube-proxy", "mountPath": "/var/lib/kube-proxy"},
                                {"name": "xtables-lock", "mountPath": "/run/xtables.lock"},
                                {"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": true},
                            ],
                        }],
                        "volumes": [
                            {"name": "kube-proxy", "configMap": {"name": "kube-proxy"}},
                            {"name": "xtables-lock", "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}},
                            {"name": "lib-modules", "hostPath": {"path": "/lib/modules"}},
                        ],
                    },
                },
            },
        }),
    )
    .await?;
    Ok(())
}
