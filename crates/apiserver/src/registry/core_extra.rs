//! core/v1 LimitRanges, ResourceQuotas, PersistentVolumes and PersistentVolumeClaims.

use kumo_apimachinery::status::ApiError;
use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Map, Value};

use super::printing::{access_modes, arr, col, created_at, keep_status, set, wide, CREATED_AT};
use super::storage::is_default_class;
use super::{age_of, default_field, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    let r = |kind,
             plural,
             singular,
             namespaced,
             short: &'static [&'static str],
             subresources,
             strategy: Box<dyn Strategy>| Resource {
        group: "",
        version: "v1",
        kind,
        plural,
        singular,
        namespaced,
        short_names: short,
        categories: &[],
        subresources,
        strategy,
    };
    vec![
        r(
            "LimitRange",
            "limitranges",
            "limitrange",
            true,
            &["limits"],
            &[],
            Box::new(LimitRanges),
        ),
        r(
            "ResourceQuota",
            "resourcequotas",
            "resourcequota",
            true,
            &["quota"],
            &["status"],
            Box::new(ResourceQuotas),
        ),
        r(
            "PersistentVolume",
            "persistentvolumes",
            "persistentvolume",
            false,
            &["pv"],
            &["status"],
            Box::new(PersistentVolumes),
        ),
        r(
            "PersistentVolumeClaim",
            "persistentvolumeclaims",
            "persistentvolumeclaim",
            true,
            &["pvc"],
            &["status"],
            Box::new(PersistentVolumeClaims),
        ),
    ]
}

struct LimitRanges;

/// SetDefaults_LimitRangeItem: a container's default limit falls back to its max, its
/// default request to the default limit, then to the min.
fn default_limit_range(obj: &mut Value) {
    let Some(items) = obj
        .pointer_mut("/spec/limits")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for item in items
        .iter_mut()
        .filter(|i| str_at(i, "/type") == "Container")
    {
        let get = |item: &Value, k: &str| {
            item.get(k)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default()
        };
        let mut default = get(item, "default");
        let mut request = get(item, "defaultRequest");
        for (k, v) in get(item, "max") {
            default.entry(k).or_insert(v);
        }
        for (k, v) in default.iter().chain(get(item, "min").iter()) {
            request.entry(k.clone()).or_insert(v.clone());
        }
        for (k, m) in [("default", default), ("defaultRequest", request)] {
            if !m.is_empty() {
                item[k] = Value::Object(m);
            }
        }
    }
}

impl Strategy for LimitRanges {
    fn prepare_create(&self, obj: &mut Value) {
        default_limit_range(obj);
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        default_limit_range(new);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        for (i, item) in arr(obj, "/spec/limits").iter().enumerate() {
            let path = Path::new("spec").child("limits").index(i).child("type");
            if str_at(item, "/type").is_empty() {
                errs.push(FieldError::required(&path, ""));
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![Column::NAME, CREATED_AT]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![json!(name_of(obj)), created_at(obj)]
    }
}

struct ResourceQuotas;

impl Strategy for ResourceQuotas {
    fn prepare_create(&self, obj: &mut Value) {
        set(obj, "status", json!({}));
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        keep_status(new, old);
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "Request",
                "string",
                "Usage and hard limit of the quota's requests.",
            ),
            col(
                "Limit",
                "string",
                "Usage and hard limit of the quota's limits.",
            ),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        // `resource: used/hard` for each resource of status.hard, sorted; limits.* apart.
        let (mut request, mut limit) = (Vec::new(), Vec::new());
        let hard = obj
            .pointer("/status/hard")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for (k, h) in &hard {
            let used = obj.pointer(&format!(
                "/status/used/{}",
                k.replace('~', "~0").replace('/', "~1")
            ));
            let cell = format!("{k}: {}/{}", quantity(used), quantity(Some(h)));
            if k.split('.').count() > 1 && k.starts_with("limits.") {
                limit.push(cell);
            } else {
                request.push(cell);
            }
        }
        vec![
            json!(name_of(obj)),
            json!(request.join(", ")),
            json!(limit.join(", ")),
            json!(age_of(obj)),
        ]
    }
}

/// A Quantity as printed (`0` when absent).
fn quantity(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "0".to_owned(),
    }
}

/// The volume sources a PersistentVolume may name (exactly one).
const PV_SOURCES: [&str; 22] = [
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "cinder",
    "cephfs",
    "fc",
    "flocker",
    "flexVolume",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "local",
    "storageos",
    "csi",
];

const ACCESS_MODES: [&str; 4] = [
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];

fn validate_access_modes(obj: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    for m in arr(obj, "/spec/accessModes") {
        let m = m.as_str().unwrap_or("");
        if !ACCESS_MODES.contains(&m) {
            errs.push(FieldError::not_supported(path, m, &ACCESS_MODES));
        }
    }
}

/// Adds a finalizer if absent (StorageObjectInUseProtection admission).
fn add_finalizer(obj: &mut Value, finalizer: &str) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let f = meta.entry("finalizers").or_insert_with(|| json!([]));
    if let Some(f) = f.as_array_mut() {
        if !f.iter().any(|v| v == finalizer) {
            f.push(json!(finalizer));
        }
    }
}

/// The class of a volume or claim: the field, or the beta annotation it replaced.
fn class_of(obj: &Value, field: &str) -> String {
    match str_at(obj, field) {
        "" => str_at(
            obj,
            "/metadata/annotations/volume.beta.kubernetes.io~1storage-class",
        )
        .to_owned(),
        s => s.to_owned(),
    }
}

fn unset_or(obj: &Value, pointer: &str) -> String {
    match str_at(obj, pointer) {
        "" => "<unset>".to_owned(),
        s => s.to_owned(),
    }
}

/// `Terminating` for an object being deleted, else its phase.
fn phase(obj: &Value) -> &str {
    if obj
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        "Terminating"
    } else {
        str_at(obj, "/status/phase")
    }
}

struct PersistentVolumes;

impl Strategy for PersistentVolumes {
    fn prepare_create(&self, obj: &mut Value) {
        if !obj.get("spec").is_some_and(Value::is_object) {
            set(obj, "spec", json!({}));
        }
        let spec = &mut obj["spec"];
        default_field(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
        default_field(spec, "volumeMode", json!("Filesystem"));
        if let Some(h) = spec.get_mut("hostPath").filter(|h| h.is_object()) {
            default_field(h, "type", json!(""));
        }
        set(
            obj,
            "status",
            json!({"phase": "Pending", "lastPhaseTransitionTime": crate::time::now_rfc3339()}),
        );
        add_finalizer(obj, "kubernetes.io/pv-protection");
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        keep_status(new, old);
    }

    fn prepare_status_update(&self, new: &mut Value, old: &Value) {
        // The phase transition time follows phase changes.
        if str_at(new, "/status/phase") != str_at(old, "/status/phase") {
            if let Some(s) = new.get_mut("status").and_then(Value::as_object_mut) {
                s.insert(
                    "lastPhaseTransitionTime".into(),
                    json!(crate::time::now_rfc3339()),
                );
            }
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        if arr(obj, "/spec/accessModes").is_empty() {
            errs.push(FieldError::required(&spec.child("accessModes"), ""));
        }
        validate_access_modes(obj, &spec.child("accessModes"), &mut errs);
        let capacity = obj
            .pointer("/spec/capacity")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if capacity.is_empty() {
            errs.push(FieldError::required(&spec.child("capacity"), ""));
        }
        if !capacity.contains_key("storage") || capacity.len() != 1 {
            errs.push(FieldError::not_supported(
                &spec.child("capacity"),
                Value::Null,
                &["storage"],
            ));
        }
        let sources = PV_SOURCES
            .iter()
            .filter(|s| {
                obj.pointer(&format!("/spec/{s}"))
                    .is_some_and(|v| !v.is_null())
            })
            .count();
        if sources == 0 {
            errs.push(FieldError::required(&spec, "must specify a volume type"));
        } else if sources > 1 {
            errs.push(FieldError::forbidden(
                &spec,
                "may not specify more than 1 volume type",
            ));
        }
        let policy = str_at(obj, "/spec/persistentVolumeReclaimPolicy");
        if !matches!(policy, "Delete" | "Recycle" | "Retain") {
            errs.push(FieldError::not_supported(
                &spec.child("persistentVolumeReclaimPolicy"),
                policy,
                &["Delete", "Recycle", "Retain"],
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Capacity", "string", "The capacity of the volume."),
            col(
                "Access Modes",
                "string",
                "The ways the volume can be mounted.",
            ),
            col(
                "Reclaim Policy",
                "string",
                "What happens to the volume when released from its claim.",
            ),
            col("Status", "string", "The phase of the volume."),
            col("Claim", "string", "The claim bound to the volume."),
            col("StorageClass", "string", "StorageClass of the pv"),
            col(
                "VolumeAttributesClass",
                "string",
                "VolumeAttributesClass of the pv",
            ),
            col("Reason", "string", "Why the volume is in its phase."),
            Column::AGE,
            wide(
                "VolumeMode",
                "string",
                "Whether the volume is a filesystem or a block device.",
            ),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let claim = match obj.pointer("/spec/claimRef").filter(|c| c.is_object()) {
            Some(c) => format!("{}/{}", str_at(c, "/namespace"), str_at(c, "/name")),
            None => String::new(),
        };
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/capacity/storage")),
            json!(access_modes(arr(obj, "/spec/accessModes"))),
            json!(str_at(obj, "/spec/persistentVolumeReclaimPolicy")),
            json!(phase(obj)),
            json!(claim),
            json!(class_of(obj, "/spec/storageClassName")),
            json!(unset_or(obj, "/spec/volumeAttributesClassName")),
            json!(str_at(obj, "/status/reason")),
            json!(age_of(obj)),
            json!(unset_or(obj, "/spec/volumeMode")),
        ]
    }
}

struct PersistentVolumeClaims;

/// Whether a claim names no class at all (neither the field, even empty, nor the beta
/// annotation), so the default class applies.
fn wants_default_class(obj: &Value) -> bool {
    obj.pointer("/spec/storageClassName")
        .is_none_or(Value::is_null)
        && obj
            .pointer("/metadata/annotations/volume.beta.kubernetes.io~1storage-class")
            .is_none()
}

impl Strategy for PersistentVolumeClaims {
    fn prepare_create(&self, obj: &mut Value) {
        if !obj.get("spec").is_some_and(Value::is_object) {
            set(obj, "spec", json!({}));
        }
        default_field(&mut obj["spec"], "volumeMode", json!("Filesystem"));
        set(obj, "status", json!({"phase": "Pending"}));
        add_finalizer(obj, "kubernetes.io/pvc-protection");
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        keep_status(new, old);
    }

    fn admission_lists(&self, obj: &Value) -> Vec<(&'static str, String)> {
        if wants_default_class(obj) {
            vec![("storageclasses", "/registry/storageclasses/".to_owned())]
        } else {
            Vec::new()
        }
    }

    fn admit_create(
        &self,
        obj: &mut Value,
        found: &[(&'static str, Value)],
    ) -> Result<(), ApiError> {
        // DefaultStorageClass admission: a claim that names no class gets the default one,
        // the newest if several are marked.
        let mut defaults: Vec<&Value> = found
            .iter()
            .filter(|(w, _)| *w == "storageclasses")
            .flat_map(|(_, v)| v.as_array().into_iter().flatten())
            .filter(|c| is_default_class(c))
            .collect();
        defaults.sort_by(|a, b| {
            let created = |c: &Value| str_at(c, "/metadata/creationTimestamp").to_owned();
            created(b)
                .cmp(&created(a))
                .then_with(|| name_of(a).cmp(name_of(b)))
        });
        if let (Some(class), Some(spec)) = (
            defaults.first(),
            obj.get_mut("spec").and_then(Value::as_object_mut),
        ) {
            spec.insert("storageClassName".into(), json!(name_of(class)));
        }
        Ok(())
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        if arr(obj, "/spec/accessModes").is_empty() {
            errs.push(FieldError::required(
                &spec.child("accessModes"),
                "at least 1 access mode is required",
            ));
        }
        validate_access_modes(obj, &spec.child("accessModes"), &mut errs);
        let requests: Map<String, Value> = obj
            .pointer("/spec/resources/requests")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if !requests.contains_key("storage") {
            errs.push(FieldError::required(
                &spec.child("resources").key("storage"),
                "",
            ));
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        // Only the requested size (and a few fields) may change once created.
        let strip = |v: &Value| {
            let mut s = v.get("spec").cloned().unwrap_or_else(|| json!({}));
            if let Some(o) = s.as_object_mut() {
                o.remove("resources");
                o.remove("volumeAttributesClassName");
                // Binding fills in the volume name of a claim that has none.
                if str_at(old, "/spec/volumeName").is_empty() {
                    o.remove("volumeName");
                }
            }
            s
        };
        if strip(new) != strip(old) {
            errs.push(FieldError::forbidden(
                &Path::new("spec"),
                "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Status", "string", "The phase of the claim."),
            col("Volume", "string", "The volume bound to the claim."),
            col("Capacity", "string", "The capacity of the bound volume."),
            col(
                "Access Modes",
                "string",
                "The access modes of the bound volume.",
            ),
            col("StorageClass", "string", "StorageClass of the pvc"),
            col(
                "VolumeAttributesClass",
                "string",
                "VolumeAttributesClass of the pvc",
            ),
            Column::AGE,
            wide(
                "VolumeMode",
                "string",
                "Whether the claim wants a filesystem or a block device.",
            ),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let volume = str_at(obj, "/spec/volumeName");
        let (capacity, modes) = if volume.is_empty() {
            (String::new(), String::new())
        } else {
            (
                str_at(obj, "/status/capacity/storage").to_owned(),
                access_modes(arr(obj, "/status/accessModes")),
            )
        };
        vec![
            json!(name_of(obj)),
            json!(phase(obj)),
            json!(volume),
            json!(capacity),
            json!(modes),
            json!(class_of(obj, "/spec/storageClassName")),
            json!(unset_or(obj, "/spec/volumeAttributesClassName")),
            json!(age_of(obj)),
            json!(unset_or(obj, "/spec/volumeMode")),
        ]
    }
}
