//! The storage annotations and the class rule that the volume controllers, the scheduler's
//! VolumeBinding, the CSI sidecars and admission share (upstream keeps them in
//! component-helpers' storage/volume).

use std::collections::BTreeMap;

/// The class, as older clients name it; wins over `spec.storageClassName`.
pub const BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// On a claim: the node the scheduler picked for its first consumer.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// On a claim: the provisioner asked to make its volume.
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The same, as older provisioners read it.
pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// On a volume: who provisioned it.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// On a claim whose binding is done.
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// On a volume (claim) whose claimRef (volumeName) the controller set.
pub const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";

/// A claim's or a volume's class: the beta annotation, else the field, else none ("").
pub fn class_of(annotations: Option<&BTreeMap<String, String>>, field: Option<&str>) -> String {
    annotations
        .and_then(|a| a.get(BETA_STORAGE_CLASS))
        .map(String::as_str)
        .or(field)
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_beta_annotation_wins_over_the_field() {
        let beta = BTreeMap::from([(BETA_STORAGE_CLASS.to_owned(), "old".to_owned())]);
        assert_eq!(class_of(Some(&beta), Some("new")), "old");
        assert_eq!(class_of(None, Some("new")), "new");
        assert_eq!(class_of(None, None), "");
    }
}
