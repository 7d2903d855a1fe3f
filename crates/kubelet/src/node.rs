//! The kubelet's Node: registration (labels, taints, addresses, providerID as upstream's
//! kubelet sets them), node status (conditions, capacity, nodeInfo) and the Lease heartbeat
//! in `kube-node-lease`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, GetParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use crate::{KubeletConfig, Result, KUBELET_VERSION};
use kumo_cri::Runtime;

/// The taint a node registers with under an external cloud provider, until the cloud
/// node controller initializes it.
pub const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// How long a lease lasts and how often it is renewed (upstream's defaults).
pub const LEASE_DURATION_SECONDS: i32 = 40;
pub const LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(10);

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The Node object the kubelet registers.
fn node_object(cfg: &KubeletConfig, runtime: &dyn Runtime) -> Value {
    let mut labels = json!({
        "beta.kubernetes.io/arch": arch(),
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": arch(),
        "kubernetes.io/hostname": cfg.node_name,
        "kubernetes.io/os": "linux",
    });
    for (k, v) in &cfg.node_labels {
        labels[k] = json!(v);
    }
    let mut taints: Vec<Value> = cfg
        .register_with_taints
        .iter()
        .map(|t| {
            let mut v = json!({"key": t.key, "effect": t.effect});
            if !t.value.is_empty() {
                v["value"] = json!(t.value);
            }
            v
        })
        .collect();
    let mut annotations = json!({"volumes.kubernetes.io/controller-managed-attach-detach": "true"});
    if cfg.cloud_provider_external {
        taints.push(json!({"key": UNINITIALIZED_TAINT, "value": "true", "effect": "NoSchedule"}));
        if let Some(ip) = cfg.node_ip {
            annotations["alpha.kubernetes.io/provided-node-ip"] = json!(ip.to_string());
        }
    }
    let mut spec = json!({});
    if !taints.is_empty() {
        spec["taints"] = json!(taints);
    }
    if let Some(p) = &cfg.provider_id {
        spec["providerID"] = json!(p);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": cfg.node_name, "labels": labels, "annotations": annotations},
        "spec": spec,
        "status": status(cfg, runtime, None),
    })
}

/// The addresses the kubelet reports: none under an external cloud provider (the cloud
/// node controller sets them), else the node IP and the host name.
fn addresses(cfg: &KubeletConfig) -> Vec<Value> {
    if cfg.cloud_provider_external {
        return Vec::new();
    }
    let ip = cfg
        .node_ip
        .map(|i| i.to_string())
        .unwrap_or_else(|| "127.0.0.1".into());
    vec![
        json!({"type": "InternalIP", "address": ip}),
        json!({"type": "Hostname", "address": cfg.node_name}),
    ]
}

/// Node status: conditions in upstream's order with its reasons and messages, capacity,
/// nodeInfo. `old` keeps the transition times of conditions that did not change.
pub fn status(cfg: &KubeletConfig, runtime: &dyn Runtime, old: Option<&Value>) -> Value {
    let now = now();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        let previous = old
            .and_then(|o| o.get("conditions"))
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|c| c["type"] == type_));
        let transition = match previous {
            Some(p) if p["status"] == status => p["lastTransitionTime"].clone(),
            _ => json!(now),
        };
        json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": transition,
        })
    };
    let capacity = json!({
        "cpu": cfg.cpu, "memory": cfg.memory, "pods": cfg.max_pods.to_string(),
        "ephemeral-storage": "100Gi", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
    });
    let (rt_name, rt_version) = runtime.version();
    let machine_id = {
        let d = ring::digest::digest(&ring::digest::SHA256, cfg.node_name.as_bytes());
        d.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    // The machine's own OS when containers run on it; the simulator says what it is.
    fn os_image(runtime: &str) -> String {
        if runtime == "sim" {
            return "kumo (simulated runtime)".into();
        }
        std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                    .map(|v| v.trim_matches('"').to_owned())
            })
            .unwrap_or_else(|| "Linux".into())
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    json!({
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            match runtime.not_ready() {
                None => condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                Some(why) => condition("Ready", "False", "KubeletNotReady", &why),
            },
        ],
        "addresses": addresses(cfg),
        "capacity": capacity,
        "allocatable": capacity,
        "daemonEndpoints": {"kubeletEndpoint": {"Port": cfg.kubelet_port()}},
        // NodeDeclaredFeatures: what this kubelet implements of upstream's registry (the
        // API server then leaves port-forward's WebSocket tunnel to the kubelet).
        "declaredFeatures": ["ExtendWebSocketsToKubelet"],
        "nodeInfo": {
            "machineID": machine_id,
            "systemUUID": machine_id,
            "bootID": BOOT_ID.as_str(),
            "kernelVersion": kernel,
            "osImage": os_image(&rt_name),
            "containerRuntimeVersion": format!("{rt_name}://{rt_version}"),
            "kubeletVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": arch(),
        },
    })
}

static BOOT_ID: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| uuid::Uuid::new_v4().to_string());

/// Registers the Node, retrying with backoff (100 ms doubling to 7 s, as upstream) until
/// the API server takes it; an existing Node of the same name is kept and its status
/// refreshed. Returns the Node and whether this call created it.
pub async fn register(
    client: &Client,
    cfg: &KubeletConfig,
    runtime: &dyn Runtime,
) -> Result<(Node, bool)> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut delay = Duration::from_millis(100);
    loop {
        let node: Node = serde_json::from_value(node_object(cfg, runtime))
            .map_err(|e| crate::Error::Invalid(e.to_string()))?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(n) => return Ok((n, true)),
            Err(kube::Error::Api(e)) if e.code == 409 => match nodes.get(&cfg.node_name).await {
                Ok(n) => return Ok((n, false)),
                Err(e) => tracing::warn!(error = %e, "reading the existing node"),
            },
            Err(e) => tracing::warn!(node = %cfg.node_name, error = %e, "unable to register node"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(7));
    }
}

/// The in-tree volume plugins whose CSI migration is on (all of them since it went GA),
/// as the kubelet's CSI plugin lists them in its CSINode, sorted.
const MIGRATED_PLUGINS: &str = "kubernetes.io/aws-ebs,kubernetes.io/azure-disk,kubernetes.io/azure-file,kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/portworx-volume,kubernetes.io/vsphere-volume";
const MIGRATED_PLUGINS_ANNOTATION: &str = "storage.alpha.kubernetes.io/migrated-plugins";

/// Publishes the node's CSINode as upstream's CSI node-info manager does at start
/// (InitializeCSINodeWithAnnotation): named after the node, owned by it, no drivers (none
/// registers with the sim runtime), the migrated-plugins annotation. One owned by an
/// older Node of the same name is deleted and made anew. Retries with backoff.
pub async fn ensure_csi_node(client: &Client, node_name: &str, node_uid: &str) {
    let api: Api<CSINode> = Api::all(client.clone());
    let mut delay = Duration::from_millis(500);
    for _ in 0..10 {
        match try_csi_node(&api, node_name, node_uid).await {
            Ok(()) => return,
            Err(e) => tracing::info!(node = node_name, error = %e, "Failed to publish CSINode"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

async fn try_csi_node(api: &Api<CSINode>, node_name: &str, node_uid: &str) -> Result<(), String> {
    let current = api.get_opt(node_name).await.map_err(|e| e.to_string())?;
    let Some(current) = current else {
        let body = json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSINode",
            "metadata": {
                "name": node_name,
                "annotations": {MIGRATED_PLUGINS_ANNOTATION: MIGRATED_PLUGINS},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}],
            },
            "spec": {"drivers": []},
        });
        let csi: CSINode = serde_json::from_value(body).map_err(|e| e.to_string())?;
        return api
            .create(&PostParams::default(), &csi)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
    };
    let mut current = serde_json::to_value(&current).map_err(|e| e.to_string())?;
    let owners = current
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let owned = owners
        .iter()
        .any(|o| o["kind"] == "Node" && o["name"] == node_name && o["uid"] == node_uid);
    if !owned {
        let old = owners
            .iter()
            .find(|o| o["kind"] == "Node")
            .and_then(|o| o["uid"].as_str())
            .unwrap_or("")
            .to_owned();
        api.delete(node_name, &Default::default())
            .await
            .map_err(|e| format!("error deleting existing CSINode {node_name:?}: {e}"))?;
        return Err(format!(
            "CSINode {node_name:?} was owned by different node (oldNodeID={old:?}, newNodeID={node_uid:?}), deleted it"
        ));
    }
    if current.pointer("/metadata/annotations/storage.alpha.kubernetes.io~1migrated-plugins")
        == Some(&json!(MIGRATED_PLUGINS))
    {
        return Ok(());
    }
    current["metadata"]["annotations"][MIGRATED_PLUGINS_ANNOTATION] = json!(MIGRATED_PLUGINS);
    let csi: CSINode = serde_json::from_value(current).map_err(|e| e.to_string())?;
    api.replace(node_name, &PostParams::default(), &csi)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Renews the node's Lease every 10 s (plus up to 4 % jitter), as upstream's lease
/// controller does: the Lease is read once (created, owned by the Node, when missing), then
/// each renewal is one update of the Lease last written. After a failure (a conflict, an
/// error) the next try reads it again, a second later.
pub async fn heartbeat(client: Client, cfg: Arc<KubeletConfig>, node_uid: String) {
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let mut latest: Option<Lease> = None;
    loop {
        let wait = match renew_lease(&leases, &cfg.node_name, &node_uid, latest.take()).await {
            Ok(lease) => {
                latest = Some(lease);
                let jitter = (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0 * 0.04;
                LEASE_RENEW_INTERVAL.mul_f64(1.0 + jitter)
            }
            Err(e) => {
                tracing::warn!(node = %cfg.node_name, error = %e, "failed to renew lease");
                Duration::from_secs(1)
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// One renewal: `latest` (or the stored Lease, or a new one) with this node holding it now.
async fn renew_lease(
    leases: &Api<Lease>,
    node: &str,
    node_uid: &str,
    latest: Option<Lease>,
) -> std::result::Result<Lease, kube::Error> {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.to_owned(),
        uid: node_uid.to_owned(),
        ..Default::default()
    };
    let stored = match latest {
        Some(l) => Some(l),
        None => leases.get_opt(node).await?,
    };
    let Some(mut lease) = stored else {
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(node.to_owned()),
                namespace: Some("kube-node-lease".into()),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some(node.to_owned()),
                lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
                renew_time: Some(now),
                ..Default::default()
            }),
        };
        return leases.create(&PostParams::default(), &lease).await;
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(node.to_owned());
    spec.lease_duration_seconds = Some(LEASE_DURATION_SECONDS);
    spec.renew_time = Some(now);
    // A Lease left without its owner (made by someone else) gets the Node as owner.
    if lease
        .metadata
        .owner_references
        .as_ref()
        .is_none_or(Vec::is_empty)
        && !node_uid.is_empty()
    {
        lease.metadata.owner_references = Some(vec![owner]);
    }
    leases.replace(node, &PostParams::default(), &lease).await
}

/// `Node <name> status is now: <reason>`, the kubelet's node status event.
fn node_status_event(node: &str, uid: &str, reason: &'static str) -> crate::events::Record {
    crate::events::Record {
        kind: "Node",
        namespace: String::new(),
        name: node.to_owned(),
        uid: uid.to_owned(),
        field_path: None,
        warning: false,
        reason: reason.into(),
        message: format!("Node {node} status is now: {reason}"),
    }
}

/// The events of the condition setters for conditions whose status changes from `old`
/// to `new` (e.g. from Unknown after the node controller marked a silent node).
fn condition_events(node: &str, uid: &str, old: &Value, new: &Value) -> Vec<crate::events::Record> {
    let status_of = |v: &Value, t: &str| -> String {
        v.get("conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == t))
            .and_then(|c| c["status"].as_str())
            .unwrap_or("")
            .to_owned()
    };
    let mut out = Vec::new();
    for (t, on_true, on_other) in [
        (
            "MemoryPressure",
            "NodeHasInsufficientMemory",
            "NodeHasSufficientMemory",
        ),
        (
            "DiskPressure",
            "NodeHasDiskPressure",
            "NodeHasNoDiskPressure",
        ),
        (
            "PIDPressure",
            "NodeHasInsufficientPID",
            "NodeHasSufficientPID",
        ),
        ("Ready", "NodeReady", "NodeNotReady"),
    ] {
        let (before, after) = (status_of(old, t), status_of(new, t));
        // A new Ready condition records nothing (upstream's ReadyCondition setter).
        if after.is_empty() || before == after || (t == "Ready" && before.is_empty()) {
            continue;
        }
        let reason = if after == "True" { on_true } else { on_other };
        out.push(node_status_event(node, uid, reason));
    }
    out
}

/// Computes node status every `status_update_frequency` and patches it when it changed
/// (beyond heartbeat times) or every 5 minutes.
pub async fn status_loop(client: Client, cfg: Arc<KubeletConfig>, runtime: Arc<dyn Runtime>) {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut last_report = std::time::Instant::now();
    let mut was_unschedulable = false;
    let mut ready = false;
    loop {
        // Until the node is ready (a runtime whose network waits for the pod range), its
        // status is looked at often, as upstream's fast status update at start.
        let every = if ready {
            cfg.status_update_frequency
        } else {
            cfg.status_update_frequency.min(Duration::from_millis(500))
        };
        tokio::time::sleep(every).await;
        // From the API server's cache, as upstream's kubelet reads it first; a stale copy
        // only costs a conflict, and the status patch carries no precondition anyway.
        let current = match nodes.get_with(&cfg.node_name, &GetParams::any()).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(node = %cfg.node_name, error = %e, "error getting node");
                continue;
            }
        };
        let old = serde_json::to_value(&current.status).unwrap_or(Value::Null);
        let mut new = status(&cfg, &*runtime, Some(&old));
        let uid = current.metadata.uid.clone().unwrap_or_default();
        let mut records = condition_events(&cfg.node_name, &uid, &old, &new);
        // The NodeUnschedulable setter: cordoning and uncordoning, as this kubelet saw it.
        let unschedulable = current
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if unschedulable != was_unschedulable {
            let reason = if unschedulable {
                "NodeNotSchedulable"
            } else {
                "NodeSchedulable"
            };
            records.push(node_status_event(&cfg.node_name, &uid, reason));
            was_unschedulable = unschedulable;
        }
        crate::events::emit(&client, &cfg.node_name, records);
        if cfg.cloud_provider_external {
            // The cloud node controller owns the addresses: the patch leaves them alone
            // (the node read may be a cached copy from before the controller set them).
            if let Some(o) = new.as_object_mut() {
                o.remove("addresses");
            }
        }
        let strip = |v: &Value| {
            let mut v = crate::pods::without_nulls(v);
            if let Some(cs) = v.get_mut("conditions").and_then(Value::as_array_mut) {
                for c in cs {
                    if let Some(c) = c.as_object_mut() {
                        c.remove("lastHeartbeatTime");
                    }
                }
            }
            v
        };
        ready = new
            .get("conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .is_some_and(|c| c["status"] == "True");
        let (mut old_cmp, new_cmp) = (strip(&old), strip(&new));
        // Conditions other components own (NetworkUnavailable) are not this one's change.
        let mine: Vec<Value> = new_cmp
            .get("conditions")
            .and_then(Value::as_array)
            .map(|cs| cs.iter().map(|c| c["type"].clone()).collect())
            .unwrap_or_default();
        if let Some(cs) = old_cmp.get_mut("conditions").and_then(Value::as_array_mut) {
            cs.retain(|c| mine.contains(&c["type"]));
        }
        let changed = [
            "conditions",
            "capacity",
            "allocatable",
            "nodeInfo",
            "addresses",
            "declaredFeatures",
        ]
        .iter()
        .filter(|k| !(cfg.cloud_provider_external && **k == "addresses"))
        .any(|k| old_cmp.get(k) != new_cmp.get(k));
        if !changed && last_report.elapsed() < Duration::from_secs(300) {
            continue;
        }
        match nodes
            .patch_status(
                &cfg.node_name,
                &PatchParams::default(),
                // Strategic: conditions merge by type, so that those other components
                // own (the route controller's NetworkUnavailable) stay.
                &Patch::Strategic(json!({"status": new})),
            )
            .await
        {
            Ok(_) => last_report = std::time::Instant::now(),
            Err(e) => {
                tracing::warn!(node = %cfg.node_name, error = %e, "error updating node status")
            }
        }
    }
}
