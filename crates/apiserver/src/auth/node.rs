//! The Node authorizer (upstream's plugin/pkg/auth/authorizer/node): a kubelet
//! (`system:node:<name>` in `system:nodes`) may read the secrets, configmaps, claims,
//! volumes and service accounts of the pods bound to its node, its own Node and Lease, and
//! what the bootstrap `system:node` ClusterRole grants, and nothing else.
//!
//! What is bound where is kept in an in-memory graph, loaded before the server serves and
//! kept current by one store watch per resource, so `authorize` never waits. The answers
//! (decisions and reasons) are upstream's; the graph is simpler than upstream's vertices and
//! edges but answers the same reachability questions: a pod is reached from its node, what
//! a pod references from the pod, a PersistentVolume from its bound claim and the
//! kubelet-visible secrets of a PersistentVolume from that volume.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use kumo_apimachinery::selector::{FieldSelector, Operator};
use kumo_storage::{RangeRequest, Revision, StorageError, Store, WatchEvent};
use serde_json::Value;

use super::rbac::Rule;
use super::{names, Attributes, Authorizer, Decision, RuleList, UserInfo};

/// The prefix upstream's union authorizer puts before this authorizer's reasons.
const REASON_PREFIX: &str = "node: ";

/// The namespace of node leases.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The storage prefixes the graph follows, each with what it holds.
const SOURCES: &[(&str, Source)] = &[
    ("/registry/pods/", Source::Pods),
    ("/registry/persistentvolumes/", Source::Volumes),
    ("/registry/volumeattachments/", Source::Attachments),
    ("/registry/resourceslices/", Source::Slices),
    (
        "/registry/podcertificaterequests/",
        Source::PodCertificateRequests,
    ),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Pods,
    Volumes,
    Attachments,
    Slices,
    PodCertificateRequests,
}

/// What one pod bound to a node references (in its own namespace).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct PodRefs {
    node: String,
    service_account: String,
    secrets: BTreeSet<String>,
    configmaps: BTreeSet<String>,
    claims: BTreeSet<String>,
    resource_claims: BTreeSet<String>,
}

/// A bound PersistentVolume: its claim and the secrets a kubelet reads to mount it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct VolumeRefs {
    claim: (String, String),
    secrets: BTreeSet<(String, String)>,
}

/// Who is bound where.
#[derive(Debug, Default)]
struct Graph {
    /// Pods with a node, by (namespace, name).
    pods: HashMap<(String, String), PodRefs>,
    /// The pods of each node.
    by_node: HashMap<String, BTreeSet<(String, String)>>,
    /// PersistentVolumes with a claimRef, by name.
    volumes: HashMap<String, VolumeRefs>,
    /// VolumeAttachments, ResourceSlices: name → node.
    attachments: HashMap<String, String>,
    slices: HashMap<String, String>,
    /// PodCertificateRequests: (namespace, name) → node.
    pcrs: HashMap<(String, String), String>,
}

impl Graph {
    fn clear(&mut self, source: Source) {
        match source {
            Source::Pods => {
                self.pods.clear();
                self.by_node.clear();
            }
            Source::Volumes => self.volumes.clear(),
            Source::Attachments => self.attachments.clear(),
            Source::Slices => self.slices.clear(),
            Source::PodCertificateRequests => self.pcrs.clear(),
        }
    }

    fn put(&mut self, source: Source, obj: &Value) {
        let name = str_at(obj, "/metadata/name").to_owned();
        let namespace = str_at(obj, "/metadata/namespace").to_owned();
        match source {
            Source::Pods => {
                self.delete_pod(&namespace, &name);
                if let Some(refs) = pod_refs(obj) {
                    self.by_node
                        .entry(refs.node.clone())
                        .or_default()
                        .insert((namespace.clone(), name.clone()));
                    self.pods.insert((namespace, name), refs);
                }
            }
            Source::Volumes => match volume_refs(obj) {
                Some(v) => {
                    self.volumes.insert(name, v);
                }
                None => {
                    self.volumes.remove(&name);
                }
            },
            Source::Attachments => {
                put_or_remove(&mut self.attachments, name, str_at(obj, "/spec/nodeName"))
            }
            Source::Slices => put_or_remove(&mut self.slices, name, str_at(obj, "/spec/nodeName")),
            Source::PodCertificateRequests => put_or_remove(
                &mut self.pcrs,
                (namespace, name),
                str_at(obj, "/spec/nodeName"),
            ),
        }
    }

    /// Removes the object stored under `key` (`<prefix><namespace>/<name>` or
    /// `<prefix><name>`).
    fn delete(&mut self, source: Source, rest_of_key: &str) {
        let namespaced = || {
            rest_of_key
                .split_once('/')
                .map(|(ns, n)| (ns.to_owned(), n.to_owned()))
        };
        match source {
            Source::Pods => {
                if let Some((ns, n)) = namespaced() {
                    self.delete_pod(&ns, &n);
                }
            }
            Source::Volumes => {
                self.volumes.remove(rest_of_key);
            }
            Source::Attachments => {
                self.attachments.remove(rest_of_key);
            }
            Source::Slices => {
                self.slices.remove(rest_of_key);
            }
            Source::PodCertificateRequests => {
                if let Some(k) = namespaced() {
                    self.pcrs.remove(&k);
                }
            }
        }
    }

    fn delete_pod(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(old) = self.pods.remove(&key) {
            if let Some(set) = self.by_node.get_mut(&old.node) {
                set.remove(&key);
                if set.is_empty() {
                    self.by_node.remove(&old.node);
                }
            }
        }
    }

    /// Whether a pod on `node` in `namespace` references what `refers` looks for.
    fn node_pod_refers(
        &self,
        node: &str,
        namespace: &str,
        refers: impl Fn(&PodRefs) -> bool,
    ) -> bool {
        let Some(pods) = self.by_node.get(node) else {
            return false;
        };
        pods.range((namespace.to_owned(), String::new())..)
            .take_while(|(ns, _)| ns == namespace)
            .filter_map(|k| self.pods.get(k))
            .any(refers)
    }

    fn volume_reached(&self, node: &str, volume: &VolumeRefs) -> bool {
        let (ns, claim) = &volume.claim;
        self.node_pod_refers(node, ns, |p| p.claims.contains(claim))
    }

    /// Whether `node` has a path to the object (upstream's hasPathFrom).
    fn reaches(&self, node: &str, kind: Kind, namespace: &str, name: &str) -> bool {
        match kind {
            Kind::Pod => self
                .pods
                .get(&(namespace.to_owned(), name.to_owned()))
                .is_some_and(|p| p.node == node),
            Kind::Secret => {
                self.node_pod_refers(node, namespace, |p| p.secrets.contains(name))
                    || self.volumes.values().any(|v| {
                        v.secrets.iter().any(|(ns, n)| ns == namespace && n == name)
                            && self.volume_reached(node, v)
                    })
            }
            Kind::ConfigMap => {
                self.node_pod_refers(node, namespace, |p| p.configmaps.contains(name))
            }
            Kind::Claim => self.node_pod_refers(node, namespace, |p| p.claims.contains(name)),
            Kind::ResourceClaim => {
                self.node_pod_refers(node, namespace, |p| p.resource_claims.contains(name))
            }
            Kind::ServiceAccount => {
                self.node_pod_refers(node, namespace, |p| p.service_account == name)
            }
            Kind::Volume => self
                .volumes
                .get(name)
                .is_some_and(|v| self.volume_reached(node, v)),
            Kind::Attachment => self.attachments.get(name).is_some_and(|n| n == node),
            Kind::Slice => self.slices.get(name).is_some_and(|n| n == node),
            Kind::PodCertificateRequest => self
                .pcrs
                .get(&(namespace.to_owned(), name.to_owned()))
                .is_some_and(|n| n == node),
        }
    }
}

fn put_or_remove<K: std::hash::Hash + Eq>(map: &mut HashMap<K, String>, key: K, node: &str) {
    if node.is_empty() {
        map.remove(&key);
    } else {
        map.insert(key, node.to_owned());
    }
}

/// The kinds of object the graph answers for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pod,
    Secret,
    ConfigMap,
    Claim,
    Volume,
    ResourceClaim,
    Attachment,
    ServiceAccount,
    Slice,
    PodCertificateRequest,
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn array<'a>(v: &'a Value, pointer: &str) -> impl Iterator<Item = &'a Value> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| a.iter())
        .into_iter()
        .flatten()
}

/// What a pod bound to a node references (upstream's AddPod: the service account,
/// VisitPodSecretNames, VisitPodConfigmapNames, claims of persistentVolumeClaim and
/// ephemeral volumes, PodClaims); `None` for a pod not bound yet. Mirror pods reference
/// nothing.
fn pod_refs(pod: &Value) -> Option<PodRefs> {
    let node = str_at(pod, "/spec/nodeName");
    if node.is_empty() {
        return None;
    }
    let mut refs = PodRefs {
        node: node.to_owned(),
        ..Default::default()
    };
    let mirror = pod
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some();
    if mirror {
        return Some(refs);
    }
    refs.service_account = str_at(pod, "/spec/serviceAccountName").to_owned();
    let mut secret = |n: &str| {
        if !n.is_empty() {
            refs.secrets.insert(n.to_owned());
        }
    };
    for r in array(pod, "/spec/imagePullSecrets") {
        secret(str_at(r, "/name"));
    }
    let containers = [
        "/spec/initContainers",
        "/spec/containers",
        "/spec/ephemeralContainers",
    ];
    for c in containers.iter().flat_map(|p| array(pod, p)) {
        for e in array(c, "/envFrom") {
            secret(str_at(e, "/secretRef/name"));
        }
        for e in array(c, "/env") {
            secret(str_at(e, "/valueFrom/secretKeyRef/name"));
        }
    }
    let pod_name = str_at(pod, "/metadata/name");
    for v in array(pod, "/spec/volumes") {
        // A volume has one source; upstream visits the first it knows of.
        if v.get("secret").is_some() {
            secret(str_at(v, "/secret/secretName"));
        } else if let Some(p) = v.get("projected") {
            for s in array(p, "/sources") {
                if s.get("secret").is_some() {
                    secret(str_at(s, "/secret/name"));
                }
            }
        } else if v.get("azureFile").is_some() {
            secret(str_at(v, "/azureFile/secretName"));
        } else {
            for (source, field) in [
                ("cephfs", "secretRef"),
                ("cinder", "secretRef"),
                ("flexVolume", "secretRef"),
                ("rbd", "secretRef"),
                ("scaleIO", "secretRef"),
                ("iscsi", "secretRef"),
                ("storageos", "secretRef"),
                ("csi", "nodePublishSecretRef"),
            ] {
                if let Some(s) = v.get(source) {
                    secret(str_at(s, &format!("/{field}/name")));
                    break;
                }
            }
        }
    }
    let mut configmap = |n: &str| {
        if !n.is_empty() {
            refs.configmaps.insert(n.to_owned());
        }
    };
    for c in containers.iter().flat_map(|p| array(pod, p)) {
        for e in array(c, "/envFrom") {
            configmap(str_at(e, "/configMapRef/name"));
        }
        for e in array(c, "/env") {
            configmap(str_at(e, "/valueFrom/configMapKeyRef/name"));
        }
    }
    for v in array(pod, "/spec/volumes") {
        if let Some(p) = v.get("projected") {
            for s in array(p, "/sources") {
                if s.get("configMap").is_some() {
                    configmap(str_at(s, "/configMap/name"));
                }
            }
        } else if v.get("configMap").is_some() {
            configmap(str_at(v, "/configMap/name"));
        }
    }
    for v in array(pod, "/spec/volumes") {
        let claim = if v.get("persistentVolumeClaim").is_some() {
            str_at(v, "/persistentVolumeClaim/claimName").to_owned()
        } else if v.get("ephemeral").is_some() {
            // The claim the ephemeral volume controller creates: <pod>-<volume>.
            format!("{pod_name}-{}", str_at(v, "/name"))
        } else {
            String::new()
        };
        if !claim.is_empty() {
            refs.claims.insert(claim);
        }
    }
    for c in array(pod, "/spec/resourceClaims") {
        let direct = str_at(c, "/resourceClaimName");
        let name = if !direct.is_empty() {
            direct
        } else if c.get("resourceClaimTemplateName").is_some() {
            let claim = str_at(c, "/name");
            array(pod, "/status/resourceClaimStatuses")
                .find(|s| str_at(s, "/name") == claim)
                .map(|s| str_at(s, "/resourceClaimName"))
                .unwrap_or("")
        } else {
            ""
        };
        if !name.is_empty() {
            refs.resource_claims.insert(name.to_owned());
        }
    }
    let extended = str_at(pod, "/status/extendedResourceClaimStatus/resourceClaimName");
    if !extended.is_empty() {
        refs.resource_claims.insert(extended.to_owned());
    }
    Some(refs)
}

/// A PersistentVolume's claim and kubelet-visible secrets (upstream's AddPV and
/// VisitPVSecretNames); `None` when it is not bound to a claim.
fn volume_refs(pv: &Value) -> Option<VolumeRefs> {
    let claim_ns = str_at(pv, "/spec/claimRef/namespace");
    let claim_name = str_at(pv, "/spec/claimRef/name");
    pv.pointer("/spec/claimRef").filter(|c| c.is_object())?;
    let mut v = VolumeRefs {
        claim: (claim_ns.to_owned(), claim_name.to_owned()),
        secrets: BTreeSet::new(),
    };
    let spec = pv.get("spec").unwrap_or(&Value::Null);
    let mut add = |ns: &str, name: &str| {
        if !name.is_empty() {
            v.secrets.insert((ns.to_owned(), name.to_owned()));
        }
    };
    // The secret's own namespace where the source has one, else the claim's.
    let own_or_claim = |s: &Value, pointer: &str| -> String {
        let ns = str_at(s, pointer);
        if ns.is_empty() {
            claim_ns.to_owned()
        } else {
            ns.to_owned()
        }
    };
    if let Some(s) = spec.get("azureFile") {
        add(
            &own_or_claim(s, "/secretNamespace"),
            str_at(s, "/secretName"),
        );
    } else if let Some(s) = spec.get("cinder") {
        add(
            str_at(s, "/secretRef/namespace"),
            str_at(s, "/secretRef/name"),
        );
    } else if let Some(s) = spec.get("storageos") {
        add(
            str_at(s, "/secretRef/namespace"),
            str_at(s, "/secretRef/name"),
        );
    } else if let Some(s) = spec.get("csi") {
        // The controller's publish and expand secrets are not for the kubelet.
        for r in [
            "nodePublishSecretRef",
            "nodeStageSecretRef",
            "nodeExpandSecretRef",
        ] {
            add(
                str_at(s, &format!("/{r}/namespace")),
                str_at(s, &format!("/{r}/name")),
            );
        }
    } else {
        for source in ["cephfs", "flexVolume", "rbd", "scaleIO", "iscsi"] {
            if let Some(s) = spec.get(source) {
                add(
                    &own_or_claim(s, "/secretRef/namespace"),
                    str_at(s, "/secretRef/name"),
                );
                break;
            }
        }
    }
    Some(v)
}

/// The node a user is, as upstream's default NodeIdentifier reads it: `Some("")` for a
/// member of `system:nodes` named just `system:node:`.
fn node_identity(user: &UserInfo) -> Option<&str> {
    let name = user.name.strip_prefix(names::NODE_PREFIX)?;
    user.in_group(names::NODES).then_some(name)
}

/// The Node authorizer.
pub struct NodeAuthorizer {
    graph: RwLock<Graph>,
    /// The rules of the bootstrap `system:node` ClusterRole (upstream's NodeRules()).
    rules: Vec<Rule>,
}

fn allow() -> Decision {
    Decision::Allow(String::new())
}

fn no_opinion(reason: impl Into<String>) -> Decision {
    let reason = reason.into();
    if reason.is_empty() {
        Decision::NoOpinion(reason)
    } else {
        Decision::NoOpinion(format!("{REASON_PREFIX}{reason}"))
    }
}

/// Errors starting the Node authorizer.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("reading {prefix}: {source}")]
    Store {
        prefix: &'static str,
        source: StorageError,
    },
    #[error("the bootstrap policy: {0}")]
    Policy(String),
}

impl NodeAuthorizer {
    /// Loads the graph from the store and keeps following it in background tasks.
    pub async fn start(store: Arc<dyn Store>) -> Result<Arc<NodeAuthorizer>, StartError> {
        let auth = Arc::new(NodeAuthorizer {
            graph: RwLock::new(Graph::default()),
            rules: node_rules().map_err(StartError::Policy)?,
        });
        for &(prefix, source) in SOURCES {
            let rev = auth
                .reload(&*store, prefix, source)
                .await
                .map_err(|source| StartError::Store { prefix, source })?;
            tokio::spawn(Arc::clone(&auth).follow(store.clone(), prefix, source, rev));
        }
        Ok(auth)
    }

    /// An authorizer over no objects.
    #[cfg(test)]
    fn empty() -> Result<NodeAuthorizer, String> {
        Ok(NodeAuthorizer {
            graph: RwLock::new(Graph::default()),
            rules: node_rules()?,
        })
    }

    // Each change is applied whole under the write lock, so a poisoned lock still holds a
    // consistent graph.
    fn read(&self) -> RwLockReadGuard<'_, Graph> {
        self.graph.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Graph> {
        self.graph.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces what the graph knows of `source` with what the store holds now.
    async fn reload(
        &self,
        store: &dyn Store,
        prefix: &str,
        source: Source,
    ) -> Result<Revision, StorageError> {
        let page = store
            .range(RangeRequest {
                prefix: prefix.as_bytes().to_vec(),
                start: None,
                limit: 0,
                revision: None,
            })
            .await?;
        let objects: Vec<Value> = page
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
            .collect();
        let mut g = self.write();
        g.clear(source);
        for o in &objects {
            g.put(source, o);
        }
        Ok(page.revision)
    }

    async fn follow(
        self: Arc<Self>,
        store: Arc<dyn Store>,
        prefix: &'static str,
        source: Source,
        mut rev: Revision,
    ) {
        loop {
            match store.watch(prefix.as_bytes(), rev + 1).await {
                Ok(mut events) => {
                    while let Some(ev) = events.next().await {
                        let Ok(ev) = ev else { break };
                        rev = rev.max(ev.revision());
                        self.apply(prefix, source, ev);
                    }
                }
                Err(e) => tracing::warn!(prefix, error = %e, "node authorizer: watch failed"),
            }
            // The watch ended (compaction, a lost connection): read everything again.
            tokio::time::sleep(Duration::from_millis(100)).await;
            match self.reload(&*store, prefix, source).await {
                Ok(r) => rev = r,
                Err(e) => tracing::warn!(prefix, error = %e, "node authorizer: reload failed"),
            }
        }
    }

    fn apply(&self, prefix: &str, source: Source, ev: WatchEvent) {
        match ev {
            WatchEvent::Put { kv, .. } => match serde_json::from_slice::<Value>(&kv.value) {
                Ok(obj) => self.write().put(source, &obj),
                Err(e) => tracing::warn!(prefix, error = %e, "node authorizer: undecodable object"),
            },
            WatchEvent::Delete { key, .. } => {
                let key = String::from_utf8_lossy(&key);
                if let Some(rest) = key.strip_prefix(prefix) {
                    self.write().delete(source, rest);
                }
            }
            WatchEvent::Progress(_) => {}
        }
    }

    /// Adds or replaces an object, as a watch event would.
    #[cfg(test)]
    fn put(&self, resource: &str, obj: &Value) {
        if let Some(&(_, source)) = SOURCES
            .iter()
            .find(|(p, _)| p.trim_end_matches('/').rsplit('/').next() == Some(resource))
        {
            self.write().put(source, obj);
        }
    }

    fn has_path(&self, node: &str, kind: Kind, attrs: &Attributes) -> Decision {
        if attrs.name.is_empty() {
            return no_opinion("No Object name found");
        }
        if self
            .read()
            .reaches(node, kind, &attrs.namespace, &attrs.name)
        {
            allow()
        } else {
            no_opinion(format!(
                "no relationship found between node '{node}' and this object"
            ))
        }
    }

    fn read_namespaced(&self, node: &str, kind: Kind, a: &Attributes) -> Decision {
        if !matches!(a.verb.as_str(), "get" | "list" | "watch") {
            return no_opinion("can only read resources of this type");
        }
        if !a.subresource.is_empty() {
            return no_opinion("cannot read subresource");
        }
        if a.namespace.is_empty() {
            return no_opinion("can only read namespaced object of this type");
        }
        self.has_path(node, kind, a)
    }

    fn get_only(&self, node: &str, kind: Kind, a: &Attributes) -> Decision {
        if a.verb != "get" {
            return no_opinion("can only get individual resources of this type");
        }
        if !a.subresource.is_empty() {
            return no_opinion("cannot get subresource");
        }
        self.has_path(node, kind, a)
    }

    fn claim(&self, node: &str, a: &Attributes) -> Decision {
        if a.subresource != "status" {
            return self.get_only(node, Kind::Claim, a);
        }
        if !matches!(a.verb.as_str(), "update" | "patch") {
            return no_opinion("can only get/update/patch this type");
        }
        self.has_path(node, Kind::Claim, a)
    }

    fn service_account(&self, node: &str, a: &Attributes) -> Decision {
        // KubeletServiceAccountTokenForCredentialProviders is on by default in v1.37.
        if a.verb == "get" && a.subresource.is_empty() {
            return self.read_namespaced(node, Kind::ServiceAccount, a);
        }
        if a.verb != "create" || a.name.is_empty() {
            return no_opinion("can only create tokens for individual service accounts");
        }
        if a.subresource != "token" {
            return no_opinion("can only create token subresource of serviceaccount");
        }
        self.has_path(node, Kind::ServiceAccount, a)
    }

    fn lease(node: &str, a: &Attributes) -> Decision {
        if !matches!(
            a.verb.as_str(),
            "get" | "create" | "update" | "patch" | "delete"
        ) {
            return no_opinion("can only get, create, update, patch, or delete a node lease");
        }
        if a.namespace != NODE_LEASE_NAMESPACE {
            return no_opinion(format!(
                "can only access leases in the \"{NODE_LEASE_NAMESPACE}\" system namespace"
            ));
        }
        if a.verb != "create" && a.name != node {
            return no_opinion(
                "can only access node lease with the same name as the requesting node",
            );
        }
        allow()
    }

    fn csinode(node: &str, a: &Attributes) -> Decision {
        match a.subresource.as_str() {
            "" => {
                if !matches!(
                    a.verb.as_str(),
                    "get" | "create" | "update" | "patch" | "delete"
                ) {
                    return no_opinion("can only get, create, update, patch, or delete a CSINode");
                }
            }
            // CSIVolumeHealth is off by default.
            "status" => {
                return no_opinion("CSINode status access requires CSIVolumeHealth feature")
            }
            _ => return no_opinion("cannot authorize CSINode subresources"),
        }
        if a.verb != "create" && a.name != node {
            return no_opinion("can only access CSINode with the same name as the requesting node");
        }
        allow()
    }

    fn slice(&self, node: &str, a: &Attributes) -> Decision {
        if !a.subresource.is_empty() {
            return no_opinion("cannot authorize ResourceSlice subresources");
        }
        match a.verb.as_str() {
            "create" => allow(),
            "get" | "update" | "patch" | "delete" => self.has_path(node, Kind::Slice, a),
            "watch" | "list" | "deletecollection" => {
                if selects_node(a, node) {
                    allow()
                } else {
                    no_opinion("can only list/watch/deletecollection resourceslices with nodeName field selector")
                }
            }
            _ => no_opinion("only the following verbs are allowed for a ResourceSlice: get, watch, list, create, update, patch, delete, deletecollection"),
        }
    }

    fn pod_certificate_request(&self, node: &str, a: &Attributes) -> Decision {
        if !a.subresource.is_empty() {
            return no_opinion(
                "nodes may not access the status subresource of PodCertificateRequests",
            );
        }
        match a.verb.as_str() {
            "create" => allow(),
            "get" => self.has_path(node, Kind::PodCertificateRequest, a),
            "list" | "watch" => {
                if selects_node(a, node) {
                    allow()
                } else {
                    no_opinion(
                        "can only list/watch podcertificaterequests with nodeName field selector",
                    )
                }
            }
            v => no_opinion(format!("nodes may not {v} podcertificaterequests")),
        }
    }

    fn node(node: &str, a: &Attributes) -> Decision {
        match (a.subresource.as_str(), a.verb.as_str()) {
            ("", "create" | "update" | "patch") => allow(),
            ("", "get" | "list" | "watch") => {
                if a.name == node {
                    allow()
                } else if a.name.is_empty() {
                    no_opinion(format!(
                        "node '{node}' cannot read all nodes, only its own Node object"
                    ))
                } else {
                    no_opinion(format!(
                        "node '{node}' cannot read '{}', only its own Node object",
                        a.name
                    ))
                }
            }
            ("status", "update" | "patch") => allow(),
            _ => no_opinion(""),
        }
    }

    fn pod(&self, node: &str, a: &Attributes) -> Decision {
        match (a.subresource.as_str(), a.verb.as_str()) {
            ("", "get") => self.get_only(node, Kind::Pod, a),
            ("", "list" | "watch") => {
                if selects_node(a, node) {
                    allow()
                } else if !a.name.is_empty() {
                    self.has_path(node, Kind::Pod, a)
                } else {
                    no_opinion("can only list/watch pods with spec.nodeName field selector")
                }
            }
            ("", "create" | "delete") => allow(),
            ("status", "update" | "patch") => allow(),
            ("eviction", "create") => allow(),
            _ => no_opinion(""),
        }
    }
}

/// Whether the request's field selector asks for `spec.nodeName=<node>`.
fn selects_node(a: &Attributes, node: &str) -> bool {
    FieldSelector::parse(&a.field_selector).is_ok_and(|s| {
        s.requirements().iter().any(|r| {
            r.field == "spec.nodeName" && r.operator == Operator::Equals && r.value == node
        })
    })
}

/// The rules of the `system:node` ClusterRole of the bootstrap policy.
fn node_rules() -> Result<Vec<Rule>, String> {
    let doc: Value = serde_yaml::from_str(include_str!("../registry/rbac_bootstrap.yaml"))
        .map_err(|e| e.to_string())?;
    let role = array(&doc, "/clusterroles")
        .find(|r| str_at(r, "/metadata/name") == "system:node")
        .ok_or("no system:node ClusterRole")?;
    let strings = |v: &Value, k: &str| -> Vec<String> {
        array(v, &format!("/{k}"))
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    Ok(array(role, "/rules")
        .map(|r| Rule {
            verbs: strings(r, "verbs"),
            api_groups: strings(r, "apiGroups"),
            resources: strings(r, "resources"),
            resource_names: strings(r, "resourceNames"),
            non_resource_urls: strings(r, "nonResourceURLs"),
        })
        .collect())
}

impl Authorizer for NodeAuthorizer {
    fn authorize(&self, a: &Attributes) -> Decision {
        let Some(node) = node_identity(&a.user) else {
            return no_opinion("");
        };
        if node.is_empty() {
            return no_opinion(format!("unknown node for user \"{}\"", a.user.name));
        }
        if a.resource_request {
            match (a.api_group.as_str(), a.resource.as_str()) {
                ("", "secrets") => return self.read_namespaced(node, Kind::Secret, a),
                ("", "configmaps") => return self.read_namespaced(node, Kind::ConfigMap, a),
                ("", "persistentvolumeclaims") => return self.claim(node, a),
                ("", "persistentvolumes") => return self.get_only(node, Kind::Volume, a),
                ("resource.k8s.io", "resourceclaims") => {
                    return self.get_only(node, Kind::ResourceClaim, a)
                }
                ("storage.k8s.io", "volumeattachments") => {
                    return self.get_only(node, Kind::Attachment, a)
                }
                ("", "serviceaccounts") => return self.service_account(node, a),
                ("coordination.k8s.io", "leases") => return Self::lease(node, a),
                ("storage.k8s.io", "csinodes") => return Self::csinode(node, a),
                ("resource.k8s.io", "resourceslices") => return self.slice(node, a),
                ("", "nodes") => return Self::node(node, a),
                ("", "pods") => return self.pod(node, a),
                ("certificates.k8s.io", "podcertificaterequests") => {
                    return self.pod_certificate_request(node, a)
                }
                _ => {}
            }
        }
        if self.rules.iter().any(|r| r.allows(a)) {
            allow()
        } else {
            no_opinion("")
        }
    }

    fn rules_for(&self, user: &UserInfo, _namespace: &str) -> Option<RuleList> {
        if node_identity(user).is_some() {
            return Some(RuleList {
                incomplete: true,
                evaluation_error: "node authorizer does not support user rule resolution".into(),
                ..Default::default()
            });
        }
        Some(RuleList::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node_user(n: &str) -> UserInfo {
        UserInfo::authenticated(format!("system:node:{n}"), vec![names::NODES.into()])
    }

    fn attrs(
        user: &UserInfo,
        verb: &str,
        group: &str,
        res: &str,
        ns: &str,
        name: &str,
    ) -> Attributes {
        Attributes {
            user: user.clone(),
            verb: verb.into(),
            resource_request: true,
            api_group: group.into(),
            resource: res.into(),
            namespace: ns.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    fn pod(name: &str, node: &str, spec: Value) -> Value {
        let mut spec = spec;
        spec["nodeName"] = json!(node);
        json!({"metadata": {"namespace": "ns", "name": name}, "spec": spec})
    }

    fn allowed(a: &NodeAuthorizer, at: &Attributes) -> bool {
        matches!(a.authorize(at), Decision::Allow(_))
    }

    #[test]
    fn pods_give_their_node_what_they_reference() {
        let a = NodeAuthorizer::empty().expect("policy");
        a.put(
            "pods",
            &pod(
                "p1",
                "n1",
                json!({
                    "serviceAccountName": "sa1",
                    "imagePullSecrets": [{"name": "pull"}],
                    "containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "env"}}, {"configMapRef": {"name": "cm-env"}}],
                        "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "key", "key": "k"}}}]}],
                    "volumes": [
                        {"name": "v1", "secret": {"secretName": "vol"}},
                        {"name": "v2", "projected": {"sources": [{"configMap": {"name": "cm-proj"}}, {"secret": {"name": "proj"}}]}},
                        {"name": "v3", "persistentVolumeClaim": {"claimName": "data"}},
                        {"name": "v4", "ephemeral": {"volumeClaimTemplate": {}}}
                    ]
                }),
            ),
        );
        a.put(
            "pods",
            &pod(
                "p2",
                "n2",
                json!({"volumes": [{"name": "v", "secret": {"secretName": "other"}}]}),
            ),
        );
        let n1 = node_user("n1");
        for s in ["pull", "env", "key", "vol", "proj"] {
            assert!(
                allowed(&a, &attrs(&n1, "get", "", "secrets", "ns", s)),
                "{s}"
            );
        }
        for c in ["cm-env", "cm-proj"] {
            assert!(
                allowed(&a, &attrs(&n1, "watch", "", "configmaps", "ns", c)),
                "{c}"
            );
        }
        assert!(allowed(
            &a,
            &attrs(&n1, "get", "", "persistentvolumeclaims", "ns", "data")
        ));
        assert!(allowed(
            &a,
            &attrs(&n1, "get", "", "persistentvolumeclaims", "ns", "p1-v4")
        ));
        assert!(allowed(
            &a,
            &attrs(&n1, "get", "", "serviceaccounts", "ns", "sa1")
        ));
        let mut token = attrs(&n1, "create", "", "serviceaccounts", "ns", "sa1");
        token.subresource = "token".into();
        assert!(allowed(&a, &token));
        assert!(allowed(&a, &attrs(&n1, "get", "", "pods", "ns", "p1")));
        assert_eq!(
            a.authorize(&attrs(&n1, "get", "", "secrets", "ns", "other")),
            Decision::NoOpinion(
                "node: no relationship found between node 'n1' and this object".into()
            )
        );
        assert_eq!(
            a.authorize(&attrs(&n1, "get", "", "secrets", "other-ns", "vol")),
            Decision::NoOpinion(
                "node: no relationship found between node 'n1' and this object".into()
            )
        );
        assert_eq!(
            a.authorize(&attrs(&n1, "delete", "", "secrets", "ns", "vol")),
            Decision::NoOpinion("node: can only read resources of this type".into())
        );
        assert!(!allowed(&a, &attrs(&n1, "get", "", "pods", "ns", "p2")));
        // Deleting the pod takes its references away; moving it moves them.
        a.write().delete(Source::Pods, "ns/p1");
        assert!(!allowed(&a, &attrs(&n1, "get", "", "secrets", "ns", "vol")));
        a.put(
            "pods",
            &pod(
                "p2",
                "n1",
                json!({"volumes": [{"name": "v", "secret": {"secretName": "other"}}]}),
            ),
        );
        assert!(allowed(
            &a,
            &attrs(&n1, "get", "", "secrets", "ns", "other")
        ));
        assert!(!allowed(
            &a,
            &attrs(&node_user("n2"), "get", "", "secrets", "ns", "other")
        ));
    }

    #[test]
    fn volumes_through_their_claims() {
        let a = NodeAuthorizer::empty().expect("policy");
        a.put(
            "pods",
            &pod(
                "p",
                "n1",
                json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}),
            ),
        );
        a.put(
            "persistentvolumes",
            &json!({"metadata": {"name": "pv1"}, "spec": {"claimRef": {"namespace": "ns", "name": "c"},
                "csi": {"driver": "d", "volumeHandle": "h", "nodePublishSecretRef": {"namespace": "sec", "name": "pub"},
                        "controllerPublishSecretRef": {"namespace": "sec", "name": "ctrl"}}}}),
        );
        let n1 = node_user("n1");
        assert!(allowed(
            &a,
            &attrs(&n1, "get", "", "persistentvolumes", "", "pv1")
        ));
        assert!(allowed(&a, &attrs(&n1, "get", "", "secrets", "sec", "pub")));
        assert!(!allowed(
            &a,
            &attrs(&n1, "get", "", "secrets", "sec", "ctrl")
        ));
        let n2 = node_user("n2");
        assert!(!allowed(
            &a,
            &attrs(&n2, "get", "", "persistentvolumes", "", "pv1")
        ));
        assert!(!allowed(
            &a,
            &attrs(&n2, "get", "", "secrets", "sec", "pub")
        ));
    }

    #[test]
    fn nodes_leases_pods_and_the_node_rules() {
        let a = NodeAuthorizer::empty().expect("policy");
        let n1 = node_user("n1");
        assert!(allowed(&a, &attrs(&n1, "get", "", "nodes", "", "n1")));
        assert_eq!(
            a.authorize(&attrs(&n1, "list", "", "nodes", "", "")),
            Decision::NoOpinion(
                "node: node 'n1' cannot read all nodes, only its own Node object".into()
            )
        );
        assert_eq!(
            a.authorize(&attrs(&n1, "get", "", "nodes", "", "n2")),
            Decision::NoOpinion(
                "node: node 'n1' cannot read 'n2', only its own Node object".into()
            )
        );
        assert!(allowed(
            &a,
            &attrs(
                &n1,
                "update",
                "coordination.k8s.io",
                "leases",
                "kube-node-lease",
                "n1"
            )
        ));
        assert!(!allowed(
            &a,
            &attrs(
                &n1,
                "update",
                "coordination.k8s.io",
                "leases",
                "kube-node-lease",
                "n2"
            )
        ));
        let mut list = attrs(&n1, "list", "", "pods", "", "");
        assert_eq!(
            a.authorize(&list),
            Decision::NoOpinion(
                "node: can only list/watch pods with spec.nodeName field selector".into()
            )
        );
        list.field_selector = "spec.nodeName=n1".into();
        assert!(allowed(&a, &list));
        list.field_selector = "spec.nodeName==n2".into();
        assert!(!allowed(&a, &list));
        // From the system:node rules.
        assert!(allowed(&a, &attrs(&n1, "list", "", "services", "", "")));
        assert!(allowed(&a, &attrs(&n1, "create", "", "events", "ns", "")));
        assert!(allowed(
            &a,
            &attrs(
                &n1,
                "create",
                "authentication.k8s.io",
                "tokenreviews",
                "",
                ""
            )
        ));
        assert_eq!(
            a.authorize(&attrs(&n1, "list", "apps", "deployments", "ns", "")),
            Decision::NoOpinion(String::new())
        );
        // Not a node: no opinion, whatever the request.
        let other = UserInfo::authenticated("system:node:n1", vec![]);
        assert_eq!(
            a.authorize(&attrs(&other, "list", "", "services", "", "")),
            Decision::NoOpinion(String::new())
        );
        let unnamed = node_user("");
        assert_eq!(
            a.authorize(&attrs(&unnamed, "get", "", "nodes", "", "x")),
            Decision::NoOpinion("node: unknown node for user \"system:node:\"".into())
        );
        let rules = a.rules_for(&n1, "default").expect("rules");
        assert!(rules.incomplete);
        assert_eq!(
            rules.evaluation_error,
            "node authorizer does not support user rule resolution"
        );
    }
}
