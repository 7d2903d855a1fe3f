//! Cluster API's objects as the controllers handle them: metadata typed, spec and status
//! JSON (the CRDs' schemas are upstream's; the controllers read the few fields they act on),
//! one Rust type per kind so that informers and clients stay typed by kind.

use std::borrow::Cow;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::core::NamespaceResourceScope;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A kind of the management API: its group, version, kind and plural.
pub trait Kind: Send + Sync + 'static {
    const GROUP: &'static str;
    const VERSION: &'static str;
    const KIND: &'static str;
    const PLURAL: &'static str;
}

/// An object of kind `K`.
#[derive(Serialize, Deserialize)]
pub struct Obj<K> {
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Value,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub status: Value,
    #[serde(skip)]
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Obj<K> {
    fn clone(&self) -> Self {
        Obj {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            metadata: self.metadata.clone(),
            spec: self.spec.clone(),
            status: self.status.clone(),
            _kind: PhantomData,
        }
    }
}

impl<K: Kind> std::fmt::Debug for Obj<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{}",
            K::KIND,
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }
}

impl<K: Kind> kube::Resource for Obj<K> {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        K::KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        K::GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        K::VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        K::PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<K: Kind> Obj<K> {
    /// A new object `namespace/name` with `spec`.
    pub fn new(namespace: &str, name: &str, spec: Value) -> Self {
        Obj {
            api_version: api_version::<K>(),
            kind: K::KIND.into(),
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            spec,
            status: Value::Null,
            _kind: PhantomData,
        }
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace(), self.name())
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }

    /// The Cluster this object belongs to: `spec.clusterName`, else the cluster-name label.
    pub fn cluster_name(&self) -> Option<&str> {
        self.spec
            .get("clusterName")
            .and_then(Value::as_str)
            .or_else(|| self.label(crate::CLUSTER_NAME_LABEL))
    }

    pub fn deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    pub fn has_finalizer(&self, f: &str) -> bool {
        self.metadata
            .finalizers
            .as_ref()
            .is_some_and(|fs| fs.iter().any(|x| x == f))
    }

    /// A controller owner reference to this object.
    pub fn owner_ref(&self) -> OwnerReference {
        OwnerReference {
            api_version: api_version::<K>(),
            kind: K::KIND.into(),
            name: self.name().into(),
            uid: self.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    /// The object's controller, if of kind `O`.
    pub fn controller_of_kind<O: Kind>(&self) -> Option<&OwnerReference> {
        self.metadata.owner_references.as_ref()?.iter().find(|o| {
            o.controller == Some(true) && o.kind == O::KIND && o.api_version == api_version::<O>()
        })
    }

    /// A `{apiGroup, kind, name}` reference to this object (v1beta2's contract reference).
    pub fn contract_ref(&self) -> Value {
        json!({"apiGroup": K::GROUP, "kind": K::KIND, "name": self.name()})
    }
}

/// `group/version` of `K`.
pub fn api_version<K: Kind>() -> String {
    format!("{}/{}", K::GROUP, K::VERSION)
}

macro_rules! kinds {
    ($($ty:ident => $group:expr, $kind:expr, $plural:expr;)*) => {$(
        #[doc = concat!("`", $kind, "` (", $group, ").")]
        pub struct $ty;
        impl Kind for $ty {
            const GROUP: &'static str = $group;
            const VERSION: &'static str = "v1beta2";
            const KIND: &'static str = $kind;
            const PLURAL: &'static str = $plural;
        }
    )*};
}

kinds! {
    ClusterKind => "cluster.x-k8s.io", "Cluster", "clusters";
    MachineKind => "cluster.x-k8s.io", "Machine", "machines";
    MachineSetKind => "cluster.x-k8s.io", "MachineSet", "machinesets";
    MachineDeploymentKind => "cluster.x-k8s.io", "MachineDeployment", "machinedeployments";
    MachineHealthCheckKind => "cluster.x-k8s.io", "MachineHealthCheck", "machinehealthchecks";
    KubeadmControlPlaneKind => "controlplane.cluster.x-k8s.io", "KubeadmControlPlane", "kubeadmcontrolplanes";
    KubeadmConfigKind => "bootstrap.cluster.x-k8s.io", "KubeadmConfig", "kubeadmconfigs";
    KubeadmConfigTemplateKind => "bootstrap.cluster.x-k8s.io", "KubeadmConfigTemplate", "kubeadmconfigtemplates";
}

pub type Cluster = Obj<ClusterKind>;
pub type Machine = Obj<MachineKind>;
pub type MachineSet = Obj<MachineSetKind>;
pub type MachineDeployment = Obj<MachineDeploymentKind>;
pub type KubeadmControlPlane = Obj<KubeadmControlPlaneKind>;
pub type KubeadmConfig = Obj<KubeadmConfigKind>;
pub type MachineHealthCheck = Obj<MachineHealthCheckKind>;

/// `value` at the JSON pointer `path` of `v`, as a string.
pub fn str_at<'a>(v: &'a Value, path: &str) -> Option<&'a str> {
    v.pointer(path).and_then(Value::as_str)
}

/// `value` at `path`, as a bool (false when absent).
pub fn bool_at(v: &Value, path: &str) -> bool {
    v.pointer(path).and_then(Value::as_bool).unwrap_or(false)
}

/// Now, as Kubernetes writes times (RFC 3339, seconds).
pub fn now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    kumo_apimachinery::time::format_rfc3339(secs).unwrap_or_default()
}

/// A metav1.Condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Condition {
    pub fn new(type_: &'static str, status: bool, reason: &'static str) -> Condition {
        Condition {
            type_,
            status,
            reason,
            message: String::new(),
        }
    }

    pub fn message(mut self, m: impl Into<String>) -> Condition {
        self.message = m.into();
        self
    }
}

/// `old`'s conditions with `set` applied: a condition whose status changed gets a new
/// lastTransitionTime, others keep theirs (metav1's SetStatusCondition).
pub fn merge_conditions(old: &Value, set: &[Condition], generation: Option<i64>) -> Value {
    let mut out: Vec<Value> = old
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for c in set {
        let status = if c.status { "True" } else { "False" };
        let prev = out
            .iter()
            .position(|v| v.get("type").and_then(Value::as_str) == Some(c.type_));
        let transition = prev
            .and_then(|i| {
                let p = &out[i];
                (p.get("status").and_then(Value::as_str) == Some(status))
                    .then(|| p.get("lastTransitionTime").cloned())
                    .flatten()
            })
            .unwrap_or_else(|| Value::String(now()));
        // metav1.Condition's message is required (empty when there is nothing to say).
        let mut v = json!({
            "type": c.type_,
            "status": status,
            "reason": c.reason,
            "message": c.message,
            "lastTransitionTime": transition,
        });
        if let Some(g) = generation {
            v["observedGeneration"] = g.into();
        }
        match prev {
            Some(i) => out[i] = v,
            None => out.push(v),
        }
    }
    Value::Array(out)
}

/// Condition `type_` of `status`, if set.
pub fn condition_of<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status
        .get("conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

/// Whether condition `type_` of `status` is True.
pub fn is_true(status: &Value, type_: &str) -> bool {
    status
        .get("conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some(type_)
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}
