//! storage.k8s.io/v1: StorageClasses, CSIDrivers, CSINodes, VolumeAttachments,
//! CSIStorageCapacities and VolumeAttributesClasses.

use kumo_apimachinery::validation::{is_dns1123_subdomain, is_qualified_name, FieldError, Path};
use serde_json::{json, Value};

use super::printing::{arr, bool_at, col, created_at, keep_status, set, CREATED_AT};
use super::{age_of, default_field, name_of, str_at, Column, Resource, Strategy};

const GROUP: &str = "storage.k8s.io";

pub(super) fn resources() -> Vec<Resource> {
    let r =
        |kind, plural, singular, short_names, subresources, strategy: Box<dyn Strategy>| Resource {
            group: GROUP,
            version: "v1",
            kind,
            plural,
            singular,
            namespaced: false,
            short_names,
            categories: &[],
            subresources,
            strategy,
        };
    vec![
        r(
            "StorageClass",
            "storageclasses",
            "storageclass",
            &["sc"],
            &[],
            Box::new(StorageClasses),
        ),
        r(
            "CSIDriver",
            "csidrivers",
            "csidriver",
            &[],
            &[],
            Box::new(CsiDrivers),
        ),
        r(
            "CSINode",
            "csinodes",
            "csinode",
            &[],
            &["status"],
            Box::new(CsiNodes),
        ),
        r(
            "VolumeAttachment",
            "volumeattachments",
            "volumeattachment",
            &[],
            &["status"],
            Box::new(VolumeAttachments),
        ),
        Resource {
            namespaced: true,
            ..r(
                "CSIStorageCapacity",
                "csistoragecapacities",
                "csistoragecapacity",
                &[],
                &[],
                Box::new(CsiStorageCapacities),
            )
        },
        r(
            "VolumeAttributesClass",
            "volumeattributesclasses",
            "volumeattributesclass",
            &["vac"],
            &[],
            Box::new(VolumeAttributesClasses),
        ),
    ]
}

/// The annotations that mark the default StorageClass.
const DEFAULT_CLASS_ANNOTATIONS: [&str; 2] = [
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
];

/// Whether a StorageClass is marked as the default one.
pub(super) fn is_default_class(obj: &Value) -> bool {
    let annotations = obj.pointer("/metadata/annotations");
    DEFAULT_CLASS_ANNOTATIONS
        .iter()
        .any(|a| annotations.and_then(|m| m.get(*a)).and_then(Value::as_str) == Some("true"))
}

const RECLAIM_POLICIES: [&str; 2] = ["Delete", "Retain"];
const BINDING_MODES: [&str; 2] = ["Immediate", "WaitForFirstConsumer"];

struct StorageClasses;

fn default_storage_class(obj: &mut Value) {
    default_field(obj, "reclaimPolicy", json!("Delete"));
    default_field(obj, "volumeBindingMode", json!("Immediate"));
}

impl Strategy for StorageClasses {
    fn prepare_create(&self, obj: &mut Value) {
        default_storage_class(obj);
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        default_storage_class(new);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let provisioner = str_at(obj, "/provisioner");
        for msg in is_qualified_name(&provisioner.to_lowercase()) {
            if !provisioner.is_empty() {
                errs.push(FieldError::invalid(
                    &Path::new("provisioner"),
                    provisioner,
                    msg,
                ));
            }
        }
        let policy = str_at(obj, "/reclaimPolicy");
        if !RECLAIM_POLICIES.contains(&policy) {
            errs.push(FieldError::not_supported(
                &Path::new("reclaimPolicy"),
                policy,
                &RECLAIM_POLICIES,
            ));
        }
        let mode = str_at(obj, "/volumeBindingMode");
        if !BINDING_MODES.contains(&mode) {
            errs.push(FieldError::not_supported(
                &Path::new("volumeBindingMode"),
                mode,
                &BINDING_MODES,
            ));
        }
        if provisioner.is_empty() {
            errs.push(FieldError::required(&Path::new("provisioner"), ""));
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        for field in [
            "provisioner",
            "parameters",
            "reclaimPolicy",
            "volumeBindingMode",
        ] {
            if new.get(field) != old.get(field) {
                errs.push(FieldError::invalid(
                    &Path::new(field),
                    Value::Null,
                    "field is immutable",
                ));
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "Provisioner",
                "string",
                "provisioner indicates the type of the provisioner.",
            ),
            col(
                "ReclaimPolicy",
                "string",
                "What happens to provisioned volumes when released.",
            ),
            col(
                "VolumeBindingMode",
                "string",
                "When volumes are provisioned and bound.",
            ),
            col(
                "AllowVolumeExpansion",
                "string",
                "Whether volumes of the class may be expanded.",
            ),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let mut name = name_of(obj).to_owned();
        if is_default_class(obj) {
            name.push_str(" (default)");
        }
        let or = |p: &str, d: &'static str| match str_at(obj, p) {
            "" => d.to_owned(),
            s => s.to_owned(),
        };
        vec![
            json!(name),
            json!(str_at(obj, "/provisioner")),
            json!(or("/reclaimPolicy", "Delete")),
            json!(or("/volumeBindingMode", "Immediate")),
            json!(bool_at(obj, "/allowVolumeExpansion", false)),
            json!(age_of(obj)),
        ]
    }
}

struct CsiDrivers;

fn default_csi_driver(obj: &mut Value) {
    if !obj.get("spec").is_some_and(Value::is_object) {
        set(obj, "spec", json!({}));
    }
    let spec = &mut obj["spec"];
    for (k, v) in [
        ("attachRequired", json!(true)),
        ("fsGroupPolicy", json!("ReadWriteOnceWithFSType")),
        ("podInfoOnMount", json!(false)),
        ("preventPodSchedulingIfMissing", json!(false)),
        ("requiresRepublish", json!(false)),
        ("seLinuxMount", json!(false)),
        ("storageCapacity", json!(false)),
        ("volumeLifecycleModes", json!(["Persistent"])),
    ] {
        default_field(spec, k, v);
    }
}

impl Strategy for CsiDrivers {
    fn prepare_create(&self, obj: &mut Value) {
        default_csi_driver(obj);
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        default_csi_driver(new);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        for (i, m) in arr(obj, "/spec/volumeLifecycleModes").iter().enumerate() {
            let m = m.as_str().unwrap_or("");
            if !matches!(m, "Persistent" | "Ephemeral") {
                errs.push(FieldError::not_supported(
                    &spec.child("volumeLifecycleModes").index(i),
                    m,
                    &["Ephemeral", "Persistent"],
                ));
            }
        }
        let policy = str_at(obj, "/spec/fsGroupPolicy");
        if !matches!(policy, "File" | "None" | "ReadWriteOnceWithFSType") {
            errs.push(FieldError::not_supported(
                &spec.child("fsGroupPolicy"),
                policy,
                &["File", "None", "ReadWriteOnceWithFSType"],
            ));
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        for field in ["attachRequired", "fsGroupPolicy", "volumeLifecycleModes"] {
            let (n, o) = (
                new.pointer(&format!("/spec/{field}")),
                old.pointer(&format!("/spec/{field}")),
            );
            if n != o {
                errs.push(FieldError::invalid(
                    &Path::new("spec").child(field),
                    n.cloned().unwrap_or(Value::Null),
                    "field is immutable",
                ));
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "AttachRequired",
                "boolean",
                "Whether the driver needs an attach operation.",
            ),
            col(
                "PodInfoOnMount",
                "boolean",
                "Whether the driver needs pod information on mount.",
            ),
            col(
                "StorageCapacity",
                "boolean",
                "Whether the driver publishes storage capacity.",
            ),
            col(
                "TokenRequests",
                "string",
                "Audiences of the service account tokens the driver needs.",
            ),
            col(
                "RequiresRepublish",
                "boolean",
                "Whether NodePublishVolume is called periodically.",
            ),
            col(
                "Modes",
                "string",
                "The volume lifecycle modes the driver supports.",
            ),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let tokens = match obj.pointer("/spec/tokenRequests").and_then(Value::as_array) {
            None => "<unset>".to_owned(),
            Some(t) => t
                .iter()
                .map(|t| str_at(t, "/audience"))
                .collect::<Vec<_>>()
                .join(","),
        };
        let modes: Vec<&str> = arr(obj, "/spec/volumeLifecycleModes")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let modes = if modes.is_empty() {
            "<none>".to_owned()
        } else {
            modes.join(",")
        };
        vec![
            json!(name_of(obj)),
            json!(bool_at(obj, "/spec/attachRequired", true)),
            json!(bool_at(obj, "/spec/podInfoOnMount", false)),
            json!(bool_at(obj, "/spec/storageCapacity", false)),
            json!(tokens),
            json!(bool_at(obj, "/spec/requiresRepublish", false)),
            json!(modes),
            json!(age_of(obj)),
        ]
    }
}

struct CsiNodes;

/// A driver's `topologyKeys` is always present, `null` when empty (it has no omitempty).
fn default_csi_node(obj: &mut Value) {
    if let Some(drivers) = obj
        .pointer_mut("/spec/drivers")
        .and_then(Value::as_array_mut)
    {
        for d in drivers.iter_mut().filter(|d| d.is_object()) {
            default_field(d, "topologyKeys", Value::Null);
        }
    }
}

impl Strategy for CsiNodes {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_csi_node(obj);
        set(obj, "status", json!({}));
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_csi_node(new);
        keep_status(new, old);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (i, d) in arr(obj, "/spec/drivers").iter().enumerate() {
            let path = Path::new("spec").child("drivers").index(i);
            let name = str_at(d, "/name");
            if name.is_empty() {
                errs.push(FieldError::required(&path.child("name"), ""));
            } else if !seen.insert(name) {
                errs.push(FieldError::duplicate(&path.child("name"), name));
            }
            if str_at(d, "/nodeID").is_empty() {
                errs.push(FieldError::required(&path.child("nodeID"), ""));
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "Drivers",
                "integer",
                "Drivers indicates the number of CSI drivers registered on the node",
            ),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(arr(obj, "/spec/drivers").len()),
            json!(age_of(obj)),
        ]
    }
}

struct VolumeAttachments;

impl Strategy for VolumeAttachments {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    fn prepare_create(&self, obj: &mut Value) {
        set(obj, "status", json!({"attached": false}));
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        keep_status(new, old);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        let sources = ["persistentVolumeName", "inlineVolumeSpec"]
            .iter()
            .filter(|s| {
                obj.pointer(&format!("/spec/source/{s}"))
                    .is_some_and(|v| !v.is_null() && v != "")
            })
            .count();
        if sources != 1 {
            errs.push(FieldError::required(
                &spec.child("source"),
                "must specify exactly one of inlineVolumeSpec and persistentVolumeName",
            ));
        }
        let node = str_at(obj, "/spec/nodeName");
        for msg in is_dns1123_subdomain(node) {
            errs.push(FieldError::invalid(&spec.child("nodeName"), node, msg));
        }
        if str_at(obj, "/spec/attacher").is_empty() {
            errs.push(FieldError::required(&spec.child("attacher"), ""));
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        super::apps::immutable(&mut errs, new, old, "/spec", &Path::new("spec"));
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            Column {
                format: "name",
                ..col(
                    "Attacher",
                    "string",
                    "The volume driver that attaches the volume.",
                )
            },
            col("PV", "string", "The persistent volume to attach."),
            col("Node", "string", "The node the volume is attached to."),
            col("Attached", "boolean", "Whether the volume is attached."),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/attacher")),
            json!(str_at(obj, "/spec/source/persistentVolumeName")),
            json!(str_at(obj, "/spec/nodeName")),
            json!(bool_at(obj, "/status/attached", false)),
            json!(age_of(obj)),
        ]
    }
}

struct CsiStorageCapacities;

impl Strategy for CsiStorageCapacities {
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let class = str_at(obj, "/storageClassName");
        let path = Path::new("storageClassName");
        if class.is_empty() {
            return vec![FieldError::required(&path, "")];
        }
        is_dns1123_subdomain(class)
            .into_iter()
            .map(|msg| FieldError::invalid(&path, class, msg))
            .collect()
    }

    fn columns(&self) -> Vec<Column> {
        vec![Column::NAME, CREATED_AT]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![json!(name_of(obj)), created_at(obj)]
    }
}

struct VolumeAttributesClasses;

impl Strategy for VolumeAttributesClasses {
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        if str_at(obj, "/driverName").is_empty() {
            return vec![FieldError::required(&Path::new("driverName"), "")];
        }
        Vec::new()
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        for field in ["driverName", "parameters"] {
            if new.get(field) != old.get(field) {
                errs.push(FieldError::invalid(
                    &Path::new(field),
                    new.get(field).cloned().unwrap_or(Value::Null),
                    "field is immutable",
                ));
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("DriverName", "string", "The CSI driver of the class."),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/driverName")),
            json!(age_of(obj)),
        ]
    }
}
