//! The PersistentVolumeClaimResize admission plugin: a claim may ask for more storage only
//! if its class (the same before and after) allows volume expansion, as upstream's plugin
//! refuses it otherwise.

use async_trait::async_trait;
use kumo_apimachinery::quantity::Quantity;
use kumo_apimachinery::status::{ApiError, GroupResource};
use serde_json::Value;

use super::{Attributes, Operation, Plugin};

/// The PersistentVolumeClaimResize admission plugin.
pub struct PersistentVolumeClaimResize;

fn request(pvc: &Value) -> Option<Quantity> {
    Quantity::parse(pvc.pointer("/spec/resources/requests/storage")?.as_str()?)
}

fn class(pvc: &Value) -> String {
    pvc.pointer("/metadata/annotations")
        .and_then(|a| a.get(kumo_apimachinery::storage::BETA_STORAGE_CLASS))
        .or_else(|| pvc.pointer("/spec/storageClassName"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

#[async_trait]
impl Plugin for PersistentVolumeClaimResize {
    fn name(&self) -> &'static str {
        "PersistentVolumeClaimResize"
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        let (Some(new), Some(old)) = (obj, a.old) else {
            return Ok(());
        };
        if a.operation != Operation::Update
            || a.subresource.is_some()
            || !a.resource.group.is_empty()
            || a.resource.plural != "persistentvolumeclaims"
        {
            return Ok(());
        }
        match (request(new), request(old)) {
            (Some(n), Some(o)) if n > o => {}
            _ => return Ok(()),
        }
        let refuse = || {
            ApiError::forbidden(
                &GroupResource::new("", "persistentvolumeclaims"),
                a.name,
                "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
            )
        };
        let name = class(new);
        if name.is_empty() || class(old) != name {
            return Err(refuse());
        }
        let allowed = a
            .stored(&format!("/registry/storageclasses/{name}"))
            .await?
            .and_then(|sc| sc.get("allowVolumeExpansion").and_then(Value::as_bool))
            == Some(true);
        if allowed {
            Ok(())
        } else {
            Err(refuse())
        }
    }
}
