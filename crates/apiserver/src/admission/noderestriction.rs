//! NodeRestriction: a kubelet (`system:node:<name>` in `system:nodes`) may change only
//! its own Node, Lease and CSINode, the pods bound to it (status, delete, evict), create
//! only its own mirror pods, and request tokens only for pods bound to it, with upstream's
//! messages. Upstream runs it in the mutating phase (it is an `Admit` plugin), so its
//! refusals come before validation errors; so does this one.

use async_trait::async_trait;
use base64::Engine;
use kumo_apimachinery::status::{ApiError, GroupResource};
use serde_json::Value;

use super::quota::{forbidden, get_stored};
use super::{Attributes, Operation, Plugin};
use crate::auth::{names, UserInfo};

/// The annotation of a mirror pod (a kubelet's static pod as the API shows it).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The node-lease namespace.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The labels a kubelet may set on its Node (kubeletapis.IsKubeletLabel).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

/// Label namespaces a kubelet may use, with their subdomains.
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// The `NodeRestriction` admission plugin.
pub struct NodeRestriction;

/// NodeIdentity: `(node name, is a node)`; the name may be empty.
fn node_identity(u: &UserInfo) -> Option<&str> {
    let name = u.name.strip_prefix(names::NODE_PREFIX)?;
    u.in_group(names::NODES).then_some(name)
}

fn str_at<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// Go's `%q` of a plain string.
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Semantic equality of two optional JSON values: absent, null, `[]` and `{}` are one.
fn sem_eq(a: Option<&Value>, b: Option<&Value>) -> bool {
    fn empty(v: Option<&Value>) -> bool {
        match v {
            None | Some(Value::Null) => true,
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Object(o)) => o.is_empty(),
            _ => false,
        }
    }
    if empty(a) && empty(b) {
        return true;
    }
    a == b
}

#[async_trait]
impl Plugin for NodeRestriction {
    fn name(&self) -> &'static str {
        "NodeRestriction"
    }

    async fn admit(&self, a: &Attributes<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        if a.operation == Operation::Connect {
            return Ok(());
        }
        let Some(node) = node_identity(a.user) else {
            return Ok(());
        };
        let obj = obj.map(|o| &*o);
        if node.is_empty() {
            return Err(forbidden(
                a,
                obj,
                &format!("could not determine node from user {}", q(&a.user.name)),
            ));
        }
        let sub = a.subresource.unwrap_or("");
        match (a.resource.group, a.resource.plural) {
            ("", "pods") => match sub {
                "" => admit_pod(a, node, obj).await,
                "status" => admit_pod_status(a, node, obj),
                "eviction" => admit_pod_eviction(a, node, obj).await,
                other => Err(forbidden(
                    a,
                    obj,
                    &format!(
                        "unexpected pod subresource {}, only 'status' and 'eviction' are allowed",
                        q(other)
                    ),
                )),
            },
            ("", "nodes") => admit_node(a, node, obj),
            ("", "persistentvolumeclaims") => match sub {
                "status" => admit_pvc_status(a, node, obj),
                _ => Err(forbidden(a, obj, "may only update PVC status")),
            },
            ("", "serviceaccounts") => admit_service_account(a, obj).await,
            ("coordination.k8s.io", "leases") => admit_lease(a, node, obj),
            ("storage.k8s.io", "csinodes") => admit_csinode(a, node, obj),
            ("resource.k8s.io", "resourceslices") => admit_resource_slice(a, node, obj),
            ("certificates.k8s.io", "certificatesigningrequests") => admit_csr(a, node, obj),
            _ => Ok(()),
        }
    }
}

/// A forbidden answer for an object that is not what the resource holds.
fn unexpected_type(a: &Attributes<'_>) -> ApiError {
    forbidden(a, None, "unexpected type <nil>")
}

async fn admit_pod(a: &Attributes<'_>, node: &str, obj: Option<&Value>) -> Result<(), ApiError> {
    match a.operation {
        Operation::Create => admit_pod_create(a, node, obj).await,
        Operation::Delete => {
            let Some(existing) = a.old else {
                return Err(ApiError::not_found(&GroupResource::new("", "pods"), a.name));
            };
            if str_at(existing, "/spec/nodeName") != node {
                return Err(forbidden(
                    a,
                    obj,
                    &format!(
                        "node {} can only delete pods with spec.nodeName set to itself",
                        q(node)
                    ),
                ));
            }
            Ok(())
        }
        op => Err(forbidden(
            a,
            obj,
            &format!(
                "unexpected operation {}, node {} can only create and delete mirror pods",
                q(op.as_str()),
                q(node)
            ),
        )),
    }
}

async fn admit_pod_create(
    a: &Attributes<'_>,
    node: &str,
    obj: Option<&Value>,
) -> Result<(), ApiError> {
    let Some(pod) = obj else {
        return Err(unexpected_type(a));
    };
    let deny = |why: String| Err(forbidden(a, Some(pod), &why));
    let mirror = pod
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|m| m.contains_key(MIRROR_ANNOTATION));
    if !mirror {
        return deny(format!(
            "pod does not have {} annotation, node {} can only create mirror pods",
            q(MIRROR_ANNOTATION),
            q(node)
        ));
    }
    if str_at(pod, "/spec/nodeName") != node {
        return deny(format!(
            "node {} can only create pods with spec.nodeName set to itself",
            q(node)
        ));
    }
    let owners = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    match owners {
        [] => {
            return deny(format!(
                "node {} can only create pods with an owner reference set to itself",
                q(node)
            ))
        }
        [owner] => {
            if str_at(owner, "/apiVersion") != "v1"
                || str_at(owner, "/kind") != "Node"
                || str_at(owner, "/name") != node
            {
                return deny(format!(
                    "node {} can only create pods with an owner reference set to itself",
                    q(node)
                ));
            }
            if owner.get("controller").and_then(Value::as_bool) != Some(true) {
                return deny(format!(
                    "node {} can only create pods with a controller owner reference set to itself",
                    q(node)
                ));
            }
            if owner.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true) {
                return deny(format!(
                    "node {} must not set blockOwnerDeletion on an owner reference",
                    q(node)
                ));
            }
            let Some(n) = get_stored(a, format!("/registry/nodes/{node}")).await? else {
                return Err(ApiError::not_found(&GroupResource::new("", "nodes"), node));
            };
            let (want, got) = (str_at(&n, "/metadata/uid"), str_at(owner, "/uid"));
            if want != got {
                return deny(format!(
                    "node {node} UID mismatch: expected {got} got {want}"
                ));
            }
        }
        _ => {
            return deny(format!(
                "node {} can only create pods with a single owner reference set to itself",
                q(node)
            ))
        }
    }
    match api_object_reference(pod) {
        Ok(None) => Ok(()),
        Ok(Some(what)) => deny(format!(
            "node {} can not create pods that reference {what}",
            q(node)
        )),
        Err(e) => deny(format!("error checking mirror pod for API references: {e}")),
    }
}

/// The containers of every kind.
fn all_containers(pod: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(move |l| {
            pod.pointer(&format!("/spec/{l}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
}

fn present(v: &Value, p: &str) -> bool {
    v.pointer(p).is_some_and(|x| !x.is_null())
}

fn volumes(pod: &Value) -> &[Value] {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Whether the pod names a secret anywhere (VisitPodSecretNames).
fn references_secrets(pod: &Value) -> bool {
    if pod
        .pointer("/spec/imagePullSecrets")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        return true;
    }
    let in_containers = all_containers(pod).any(|c| {
        let env_from = c.get("envFrom").and_then(Value::as_array);
        let env = c.get("env").and_then(Value::as_array);
        env_from.is_some_and(|e| e.iter().any(|x| present(x, "/secretRef")))
            || env.is_some_and(|e| e.iter().any(|x| present(x, "/valueFrom/secretKeyRef")))
    });
    if in_containers {
        return true;
    }
    volumes(pod).iter().any(|v| {
        [
            "/azureFile",
            "/cephfs/secretRef",
            "/cinder/secretRef",
            "/flexVolume/secretRef",
            "/rbd/secretRef",
            "/secret",
            "/scaleIO/secretRef",
            "/iscsi/secretRef",
            "/storageos/secretRef",
            "/csi/nodePublishSecretRef",
        ]
        .iter()
        .any(|p| present(v, p))
            || v.pointer("/projected/sources")
                .and_then(Value::as_array)
                .is_some_and(|s| s.iter().any(|s| present(s, "/secret")))
    })
}

/// Whether the pod names a configmap anywhere (VisitPodConfigmapNames).
fn references_configmaps(pod: &Value) -> bool {
    let in_containers = all_containers(pod).any(|c| {
        let env_from = c.get("envFrom").and_then(Value::as_array);
        let env = c.get("env").and_then(Value::as_array);
        env_from.is_some_and(|e| e.iter().any(|x| present(x, "/configMapRef")))
            || env.is_some_and(|e| e.iter().any(|x| present(x, "/valueFrom/configMapKeyRef")))
    });
    in_containers
        || volumes(pod).iter().any(|v| {
            present(v, "/configMap")
                || v.pointer("/projected/sources")
                    .and_then(Value::as_array)
                    .is_some_and(|s| s.iter().any(|s| present(s, "/configMap")))
        })
}

/// Volume sources that need nothing from the API.
const LOCAL_VOLUMES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "cephfs",
    "cinder",
    "downwardAPI",
    "emptyDir",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// HasAPIObjectReference: what API objects the pod refers to, if any.
fn api_object_reference(pod: &Value) -> Result<Option<&'static str>, String> {
    if !str_at(pod, "/spec/serviceAccountName").is_empty() {
        return Ok(Some("serviceaccounts"));
    }
    if references_secrets(pod) {
        return Ok(Some("secrets"));
    }
    if references_configmaps(pod) {
        return Ok(Some("configmaps"));
    }
    if pod
        .pointer("/spec/resourceClaims")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty())
    {
        return Ok(Some("resourceclaims"));
    }
    for v in volumes(pod) {
        let name = str_at(v, "/name");
        let source = v
            .as_object()
            .and_then(|o| o.iter().find(|(k, x)| *k != "name" && !x.is_null()))
            .map(|(k, _)| k.as_str())
            .unwrap_or("");
        if LOCAL_VOLUMES.contains(&source) {
            continue;
        }
        let what = match source {
            "configMap" => "configmaps (via configmap volumes)",
            "secret" => "secrets (via secret volumes)",
            "csi" => "csidrivers (via CSI volumes)",
            "glusterfs" => "endpoints (via glusterFS volumes)",
            "persistentVolumeClaim" => "persistentvolumeclaims",
            "ephemeral" => "persistentvolumeclaims (via ephemeral volumes)",
            "azureFile" => "secrets (via azureFile volumes)",
            "projected" => {
                let sources = v
                    .pointer("/projected/sources")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                for s in sources {
                    let what = if present(s, "/configMap") {
                        "configmaps (via projected volumes)"
                    } else if present(s, "/secret") {
                        "secrets (via projected volumes)"
                    } else if present(s, "/serviceAccountToken") {
                        "serviceaccounts (via projected volumes)"
                    } else if present(s, "/clusterTrustBundle") {
                        "clustertrustbundles"
                    } else if present(s, "/podCertificate") {
                        "podcertificates"
                    } else if present(s, "/downwardAPI") {
                        continue;
                    } else {
                        return Err(format!("unknown source for projected volume {}", q(name)));
                    };
                    return Ok(Some(what));
                }
                continue;
            }
            _ => return Err(format!("unknown volume type for volume  {}", q(name))),
        };
        return Ok(Some(what));
    }
    Ok(None)
}

fn admit_pod_status(a: &Attributes<'_>, node: &str, obj: Option<&Value>) -> Result<(), ApiError> {
    if a.operation != Operation::Update {
        return Err(forbidden(
            a,
            obj,
            &format!("unexpected operation {}", q(a.operation.as_str())),
        ));
    }
    let (Some(old), Some(new)) = (a.old, obj) else {
        return Err(unexpected_type(a));
    };
    let deny = |why: String| Err(forbidden(a, Some(new), &why));
    if str_at(old, "/spec/nodeName") != node {
        return deny(format!(
            "node {} can only update pod status for pods with spec.nodeName set to itself",
            q(node)
        ));
    }
    // What a node may not change through pod status, with what it is told.
    const KEPT: &[(&str, &str)] = &[
        (
            "/metadata/labels",
            "cannot update labels through pod status",
        ),
        (
            "/status/resourceClaimStatuses",
            "cannot update resource claim statues",
        ),
        (
            "/status/extendedResourceClaimStatus",
            "cannot update extended resource claim status",
        ),
        (
            "/status/nodeAllocatableResourceClaimStatuses",
            "cannot update node allocatable resource claim statuses",
        ),
    ];
    for (pointer, why) in KEPT {
        if !sem_eq(old.pointer(pointer), new.pointer(pointer)) {
            return deny(format!("node {} {why}", q(node)));
        }
    }
    Ok(())
}

async fn admit_pod_eviction(
    a: &Attributes<'_>,
    node: &str,
    obj: Option<&Value>,
) -> Result<(), ApiError> {
    if a.operation != Operation::Create {
        return Err(forbidden(
            a,
            obj,
            &format!("unexpected operation {}", a.operation.as_str()),
        ));
    }
    let Some(eviction) = obj else {
        return Err(unexpected_type(a));
    };
    let mut pod_name = a.name;
    if pod_name.is_empty() {
        pod_name = str_at(eviction, "/metadata/name");
        if pod_name.is_empty() {
            return Err(forbidden(
                a,
                obj,
                "could not determine pod from request data",
            ));
        }
    }
    let ns = a.namespace.unwrap_or("");
    let Some(pod) = get_stored(a, format!("/registry/pods/{ns}/{pod_name}")).await? else {
        return Err(ApiError::not_found(
            &GroupResource::new("", "pods"),
            pod_name,
        ));
    };
    if str_at(&pod, "/spec/nodeName") != node {
        return Err(forbidden(
            a,
            obj,
            &format!("node {node} can only evict pods with spec.nodeName set to itself"),
        ));
    }
    Ok(())
}

fn admit_pvc_status(a: &Attributes<'_>, node: &str, obj: Option<&Value>) -> Result<(), ApiError> {
    if a.operation != Operation::Update {
        return Err(forbidden(
            a,
            obj,
            &format!("unexpected operation {}", q(a.operation.as_str())),
        ));
    }
    let (Some(old), Some(new)) = (a.old, obj) else {
        return Err(unexpected_type(a));
    };
    // Everything but the capacity, the conditions and the allocated resources must stay.
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
            m.remove("managedFields");
        }
        if let Some(s) = v.get_mut("status").and_then(Value::as_object_mut) {
            for k in [
                "capacity",
                "conditions",
                "allocatedResourceStatuses",
                "allocatedResources",
            ] {
                s.remove(k);
            }
        }
        v
    };
    let (o, n) = (strip(old), strip(new));
    if o != n {
        return Err(forbidden(
            a,
            obj,
            &format!(
                "node {} is not allowed to update fields other than status.quantity and status.conditions: {}",
                q(node),
                json_diff(&o, &n)
            ),
        ));
    }
    Ok(())
}

/// The paths where two JSON values differ, as `path: old -> new` lines.
fn json_diff(a: &Value, b: &Value) -> String {
    fn walk(path: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<String>) {
        match (a, b) {
            (Some(Value::Object(x)), Some(Value::Object(y))) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    walk(&format!("{path}.{k}"), x.get(k), y.get(k), out);
                }
            }
            (x, y) if x != y => {
                let show =
                    |v: Option<&Value>| v.map(Value::to_string).unwrap_or_else(|| "<none>".into());
                out.push(format!("{path}: {} -> {}", show(x), show(y)));
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", Some(a), Some(b), &mut out);
    out.join("; ")
}

/// Whether a label key is in the kubernetes.io or k8s.io namespaces.
fn label_namespace(key: &str) -> &str {
    key.split_once('/').map(|(ns, _)| ns).unwrap_or("")
}

fn is_kubernetes_label(key: &str) -> bool {
    let ns = label_namespace(key);
    ns == "kubernetes.io"
        || ns.ends_with(".kubernetes.io")
        || ns == "k8s.io"
        || ns.ends_with(".k8s.io")
}

fn is_kubelet_label(key: &str) -> bool {
    if KUBELET_LABELS.contains(&key) {
        return true;
    }
    let ns = label_namespace(key);
    KUBELET_LABEL_NAMESPACES
        .iter()
        .any(|a| ns == *a || ns.ends_with(&format!(".{a}")))
}

/// The keys of the labels that differ between two label maps, sorted.
fn modified_labels(a: Option<&Value>, b: Option<&Value>) -> std::collections::BTreeSet<String> {
    let map = |v: Option<&Value>| v.and_then(Value::as_object).cloned().unwrap_or_default();
    let (a, b) = (map(a), map(b));
    a.keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

/// getForbiddenLabels: the node-restriction.kubernetes.io labels and the kubernetes.io
/// and k8s.io labels a kubelet has no business setting.
fn forbidden_labels(modified: &std::collections::BTreeSet<String>) -> Vec<String> {
    modified
        .iter()
        .filter(|k| {
            let ns = label_namespace(k);
            ns == "node-restriction.kubernetes.io"
                || ns.ends_with(".node-restriction.kubernetes.io")
                || (is_kubernetes_label(k) && !is_kubelet_label(k))
        })
        .cloned()
        .collect()
}

fn admit_node(a: &Attributes<'_>, node: &str, obj: Option<&Value>) -> Result<(), ApiError> {
    if a.name != node {
        return Err(forbidden(
            a,
            obj,
            &format!(
                "node {} is not allowed to modify node {}",
                q(node),
                q(a.name)
            ),
        ));
    }
    let deny = |why: String| Err(forbidden(a, obj, &why));
    match a.operation {
        Operation::Create => {
            let Some(n) = obj else {
                return Err(unexpected_type(a));
            };
            if present(n, "/spec/configSource") {
                return deny(format!(
                    "node {} is not allowed to create pods with a non-nil configSource",
                    q(node)
                ));
            }
            let bad = forbidden_labels(&modified_labels(n.pointer("/metadata/labels"), None));
            if !bad.is_empty() {
                return deny(format!(
                    "node {} is not allowed to set the following labels: {}",
                    q(node),
                    bad.join(", ")
                ));
            }
        }
        Operation::Update => {
            let (Some(n), Some(old)) = (obj, a.old) else {
                return Err(unexpected_type(a));
            };
            if present(n, "/spec/configSource")
                && n.pointer("/spec/configSource") != old.pointer("/spec/configSource")
            {
                return deny(format!(
                    "node {} is not allowed to update configSource to a new non-nil configSource",
                    q(node)
                ));
            }
            if !sem_eq(n.pointer("/spec/taints"), old.pointer("/spec/taints")) {
                return deny(format!("node {} is not allowed to modify taints", q(node)));
            }
            if !sem_eq(
                n.pointer("/metadata/ownerReferences"),
                old.pointer("/metadata/ownerReferences"),
            ) {
                return deny(format!(
                    "node {} is not allowed to modify ownerReferences",
                    q(node)
                ));
            }
            let bad = forbidden_labels(&modified_labels(
                n.pointer("/metadata/labels"),
                old.pointer("/metadata/labels"),
            ));
            if !bad.is_empty() {
                return deny(format!(
                    "is not allowed to modify labels: {}",
                    bad.join(", ")
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// serviceaccounts/token: a node may request only tokens bound to a pod bound to it.
async fn admit_service_account(a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
    if a.operation != Operation::Create || a.subresource != Some("token") {
        return Ok(());
    }
    let Some(tr) = obj else {
        return Err(unexpected_type(a));
    };
    let deny = |why: &str| Err(forbidden(a, Some(tr), why));
    let Some(r) = tr.pointer("/spec/boundObjectRef").filter(|r| !r.is_null()) else {
        return deny("node requested token not bound to a pod");
    };
    if str_at(r, "/apiVersion") != "v1"
        || str_at(r, "/kind") != "Pod"
        || str_at(r, "/name").is_empty()
    {
        return deny("node requested token not bound to a pod");
    }
    let uid = str_at(r, "/uid");
    if uid.is_empty() {
        return deny("node requested token with a pod binding without a uid");
    }
    let ns = a.namespace.unwrap_or("");
    let name = str_at(r, "/name");
    let Some(pod) = get_stored(a, format!("/registry/pods/{ns}/{name}")).await? else {
        return Err(ApiError::not_found(&GroupResource::new("", "pods"), name));
    };
    if str_at(&pod, "/metadata/uid") != uid {
        return deny(&format!("the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"));
    }
    let node = node_identity(a.user).unwrap_or("");
    if str_at(&pod, "/spec/nodeName") != node {
        return deny("node requested token bound to a pod scheduled on a different node");
    }
    // ServiceAccountNodeAudienceRestriction: the audience must be one the pod uses.
    let audiences = tr
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let audience = match audiences {
        [] => "",
        [one] => one.as_str().unwrap_or(""),
        _ => return deny("node may only request 0 or 1 audiences"),
    };
    if pod_references_audience(a, &pod, audience).await? {
        return Ok(());
    }
    deny(&format!(
        "{} is not authorized to request tokens for audience {}",
        a.user.name,
        q(audience)
    ))
}

/// Whether a projected token of the pod, or a CSI driver one of its volumes uses, asks for
/// this audience.
async fn pod_references_audience(
    a: &Attributes<'_>,
    pod: &Value,
    audience: &str,
) -> Result<bool, ApiError> {
    let ns = str_at(pod, "/metadata/namespace");
    for v in volumes(pod) {
        let projected = v
            .pointer("/projected/sources")
            .and_then(Value::as_array)
            .is_some_and(|s| {
                s.iter().any(|s| {
                    present(s, "/serviceAccountToken")
                        && str_at(s, "/serviceAccountToken/audience") == audience
                })
            });
        if projected {
            return Ok(true);
        }
        let claim = if present(v, "/ephemeral/volumeClaimTemplate") {
            Some(format!(
                "{}-{}",
                str_at(pod, "/metadata/name"),
                str_at(v, "/name")
            ))
        } else if present(v, "/persistentVolumeClaim") {
            Some(str_at(v, "/persistentVolumeClaim/claimName").to_owned())
        } else {
            None
        };
        let driver = if let Some(claim) = claim {
            let Some(pvc) =
                get_stored(a, format!("/registry/persistentvolumeclaims/{ns}/{claim}")).await?
            else {
                continue;
            };
            let pv_name = str_at(&pvc, "/spec/volumeName").to_owned();
            match get_stored(a, format!("/registry/persistentvolumes/{pv_name}")).await? {
                Some(pv) => str_at(&pv, "/spec/csi/driver").to_owned(),
                None => continue,
            }
        } else {
            str_at(v, "/csi/driver").to_owned()
        };
        if driver.is_empty() {
            continue;
        }
        if let Some(d) = get_stored(a, format!("/registry/csidrivers/{driver}")).await? {
            let has = d
                .pointer("/spec/tokenRequests")
                .and_then(Value::as_array)
                .is_some_and(|t| t.iter().any(|t| str_at(t, "/audience") == audience));
            if has {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn admit_lease(a: &Attributes<'_>, node: &str, obj: Option<&Value>) -> Result<(), ApiError> {
    if a.namespace != Some(NODE_LEASE_NAMESPACE) {
        return Err(forbidden(
            a,
            obj,
            &format!(
                "can only access leases in the {} system namespace",
                q(NODE_LEASE_NAMESPACE)
            ),
        ));
    }
    let name = if a.operation == Operation::Create {
        obj.map(|o| str_at(o, "/metadata/name")).unwrap_or("")
    } else {
        a.name
    };
    if name != node {
        return Err(forbidden(
            a,
            obj,
            "can only access node lease with the same name as the requesting node",
        ));
    }
    Ok(())
}

fn admit_csinode(a: &Attributes<'_>, node: &str, obj: Option<&Value>) -> Result<(), ApiError> {
    let name = if a.operation == Operation::Create {
        obj.map(|o| str_at(o, "/metadata/name")).unwrap_or("")
    } else {
        a.name
    };
    if name != node {
        return Err(forbidden(
            a,
            obj,
            "can only access CSINode with the same name as the requesting node",
        ));
    }
    if a.subresource == Some("status") {
        // The CSIVolumeHealth feature (alpha) is off.
        return Err(forbidden(
            a,
            obj,
            "CSIVolumeHealth feature gate is disabled",
        ));
    }
    Ok(())
}

fn admit_resource_slice(
    a: &Attributes<'_>,
    node: &str,
    obj: Option<&Value>,
) -> Result<(), ApiError> {
    let (subject, verb) = match a.operation {
        Operation::Create => (obj, "create"),
        Operation::Delete => (a.old, "delete"),
        _ => return Ok(()),
    };
    let Some(slice) = subject else {
        return Err(unexpected_type(a));
    };
    if slice.pointer("/spec/nodeName").and_then(Value::as_str) != Some(node) {
        return Err(forbidden(
            a,
            obj,
            &format!("can only {verb} ResourceSlice with the same NodeName as the requesting node"),
        ));
    }
    Ok(())
}

fn admit_csr(a: &Attributes<'_>, node: &str, obj: Option<&Value>) -> Result<(), ApiError> {
    if a.operation != Operation::Create {
        return Ok(());
    }
    let Some(csr) = obj else {
        return Err(unexpected_type(a));
    };
    let signer = str_at(csr, "/spec/signerName");
    if signer != "kubernetes.io/kubelet-serving"
        && signer != "kubernetes.io/kube-apiserver-client-kubelet"
    {
        return Ok(());
    }
    let cn = match csr_common_name(str_at(csr, "/spec/request")) {
        Ok(cn) => cn,
        Err(e) => return Err(forbidden(a, obj, &format!("unable to parse csr: {e}"))),
    };
    if cn != format!("system:node:{node}") {
        return Err(forbidden(
            a,
            obj,
            &format!("can only create a node CSR with CN=system:node:{node}"),
        ));
    }
    Ok(())
}

/// The subject common name of a base64 PEM CERTIFICATE REQUEST.
fn csr_common_name(b64: &str) -> Result<String, String> {
    use x509_parser::prelude::FromDer;
    let pem_bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| e.to_string())?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem_bytes)
        .map_err(|_| "PEM block type must be CERTIFICATE REQUEST".to_owned())?;
    if pem.label != "CERTIFICATE REQUEST" {
        return Err("PEM block type must be CERTIFICATE REQUEST".into());
    }
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
            .map_err(|e| e.to_string())?;
    let cn = req
        .certification_request_info
        .subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or("")
        .to_owned();
    Ok(cn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn api_references() {
        let pod = |spec: Value| json!({"spec": spec});
        assert_eq!(api_object_reference(&pod(json!({}))), Ok(None));
        assert_eq!(
            api_object_reference(&pod(json!({"serviceAccountName": "default"}))),
            Ok(Some("serviceaccounts"))
        );
        assert_eq!(
            api_object_reference(&pod(
                json!({"containers": [{"env": [{"name": "a", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]})
            )),
            Ok(Some("secrets"))
        );
        assert_eq!(
            api_object_reference(&pod(
                json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]})
            )),
            Ok(Some("persistentvolumeclaims"))
        );
        assert_eq!(
            api_object_reference(&pod(
                json!({"volumes": [{"name": "v", "emptyDir": {}}, {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]})
            )),
            Ok(Some("serviceaccounts (via projected volumes)"))
        );
        assert_eq!(
            api_object_reference(&pod(json!({"volumes": [{"name": "v", "madeUp": {}}]}))),
            Err("unknown volume type for volume  \"v\"".to_owned())
        );
    }

    #[test]
    fn node_labels() {
        let modified = modified_labels(
            Some(
                &json!({"kubernetes.io/hostname": "n", "node-role.kubernetes.io/master": "", "foo.node-restriction.kubernetes.io/x": "1", "example.com/a": "b", "node.kubernetes.io/exclude": ""}),
            ),
            None,
        );
        assert_eq!(
            forbidden_labels(&modified),
            vec![
                "foo.node-restriction.kubernetes.io/x",
                "node-role.kubernetes.io/master"
            ]
        );
    }
}
