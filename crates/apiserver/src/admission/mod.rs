//! The admission chain: plugins that change (mutating phase) or refuse (validating phase)
//! a write after it is authorized and before it is stored, in upstream's order.
//!
//! Plugins that only need the object and a few stored objects it names live in the
//! resource's strategy (`Strategy::admit_create`: ServiceAccount, Priority,
//! DefaultTolerationSeconds, DefaultStorageClass) and NamespaceLifecycle in `rest`; the
//! plugins here need more: the requesting user (NodeRestriction), other collections
//! (LimitRanger, ResourceQuota, PodSecurity's namespace labels, RuntimeClass) or the
//! network (webhooks).
//! `rest` runs [`Chain::admit`] after the strategy's admission and [`Chain::validate`]
//! after the strategy's validation, for creates, updates (every retry of an update runs
//! them again, as upstream's GuaranteedUpdate does) and deletes.

pub mod certificates;
pub mod limitranger;
pub mod map;
pub mod noderestriction;
pub mod podsecurity;
pub mod pvcresize;
pub mod quota;
pub mod runtimeclass;
pub mod taintnodes;
pub mod vap;
pub mod webhook;

use std::sync::Arc;

use async_trait::async_trait;
use kumo_apimachinery::status::ApiError;
use serde_json::Value;

use crate::auth::UserInfo;
use crate::registry::Resource;
use crate::rest::Rest;

/// What a write does to its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    /// As an AdmissionReview names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// The write being admitted.
pub struct Attributes<'a> {
    pub operation: Operation,
    pub resource: &'a Resource,
    /// `status`, `binding`, `scale`, ... or none.
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    /// The stored object of an update or a delete.
    pub old: Option<&'a Value>,
    pub user: &'a UserInfo,
    pub dry_run: bool,
    /// CreateOptions, UpdateOptions, PatchOptions or DeleteOptions, as a webhook sees them.
    pub options: Value,
    /// The verbs, for plugins that read other objects (through `rest.store` or the watch
    /// caches).
    pub rest: &'a Rest,
}

impl Attributes<'_> {
    /// The stored object at storage key `key` (a cluster-scoped object a plugin consults,
    /// such as a RuntimeClass or a StorageClass), decoded; `None` when there is none.
    pub async fn stored(&self, key: &str) -> Result<Option<Value>, ApiError> {
        let (kv, _) = self
            .rest
            .store
            .get(key.as_bytes(), None)
            .await
            .map_err(ApiError::internal)?;
        kv.map(|kv| serde_json::from_slice(&kv.value).map_err(ApiError::internal))
            .transpose()
    }
}

/// One admission plugin. Both phases default to "no opinion".
#[async_trait]
pub trait Plugin: Send + Sync {
    /// Upstream's name for it (`NodeRestriction`, `ValidatingAdmissionWebhook`, ...).
    fn name(&self) -> &'static str;
    /// The mutating phase: may change `obj` (the new object; none on delete).
    async fn admit(&self, _a: &Attributes<'_>, _obj: Option<&mut Value>) -> Result<(), ApiError> {
        Ok(())
    }
    /// The validating phase: may only refuse.
    async fn validate(&self, _a: &Attributes<'_>, _obj: Option<&Value>) -> Result<(), ApiError> {
        Ok(())
    }
}

/// The plugins, in order.
#[derive(Clone, Default)]
pub struct Chain {
    plugins: Vec<Arc<dyn Plugin>>,
}

impl Chain {
    pub fn new(plugins: Vec<Arc<dyn Plugin>>) -> Chain {
        Chain { plugins }
    }

    /// The names of the plugins, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.plugins.iter().map(|p| p.name()).collect()
    }

    /// Runs every plugin's mutating phase in order; the first error refuses the write.
    pub async fn admit(
        &self,
        a: &Attributes<'_>,
        mut obj: Option<&mut Value>,
    ) -> Result<(), ApiError> {
        for p in &self.plugins {
            p.admit(a, obj.as_deref_mut()).await?;
        }
        Ok(())
    }

    /// Runs every plugin's validating phase in order; the first error refuses the write.
    pub async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        for p in &self.plugins {
            p.validate(a, obj).await?;
        }
        Ok(())
    }
}
