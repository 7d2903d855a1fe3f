//! The typed round trip of kube-apiserver, as far as it shows: what an object loses on its
//! way into storage because its Go type's JSON leaves empty `omitempty` fields out
//! (`metadata.labels: {}` after the last label is removed, `finalizers: []`,
//! `spec.template.metadata.labels: {}`, `workingDir: ""`). Applied to every object written
//! (and to the answer of a dry run) before the no-op check, so that a write that only
//! empties such a field compares equal to the stored object, as upstream's byte comparison
//! does.

use serde_json::Value;

/// Removes the fields upstream would not store: for a built-in kind, everywhere the
/// protobuf schema marks them `omitempty`; for any other object (custom resources), in
/// `metadata` only, which upstream reads into the Go `ObjectMeta` while keeping the rest of
/// the body as sent.
pub fn normalize(obj: &mut Value) {
    if kumo_apimachinery::protobuf::omit_empty(obj) {
        return;
    }
    if let Some(meta) = obj.get_mut("metadata") {
        kumo_apimachinery::protobuf::omit_empty_meta(meta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn custom_resources_lose_empty_metadata_only() {
        let mut cr = json!({"apiVersion": "ex.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "labels": {}, "annotations": {}, "finalizers": []},
            "spec": {"a": {}, "b": [], "c": ""}});
        normalize(&mut cr);
        assert_eq!(
            cr,
            json!({"apiVersion": "ex.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                "spec": {"a": {}, "b": [], "c": ""}})
        );
    }

    #[test]
    fn built_in_objects_lose_empty_omitempty_fields() {
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "labels": {}}, "data": {}, "immutable": false});
        normalize(&mut cm);
        // `immutable` is a *bool: a set false stays.
        assert_eq!(
            cm,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                "immutable": false})
        );
    }
}
