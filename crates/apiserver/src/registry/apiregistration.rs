//! apiregistration.k8s.io/v1 APIServices: the kube-aggregator's list of API group
//! versions. As kube-apiserver's autoregister controller does at start, each built-in
//! group version has a "Local" APIService (always Available); one with a `spec.service`
//! is an extension API server that `crate::aggregator` proxies to and checks.

use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Value};

use super::printing::{col, keep_status};
use super::{age_of, name_of, str_at, Column, Registry, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![Resource {
        group: "apiregistration.k8s.io",
        version: "v1",
        kind: "APIService",
        plural: "apiservices",
        singular: "apiservice",
        namespaced: false,
        short_names: &[],
        categories: &["api-extensions"],
        subresources: &["status"],
        strategy: Box::new(ApiServices),
    }]
}

/// kube-apiserver's group and version priorities (its apiVersionPriorities table) for
/// the group versions kumo serves; a group version missing here gets no APIService, as
/// upstream skips it.
const PRIORITIES: &[(&str, &str, i64, i64)] = &[
    ("", "v1", 18000, 1),
    ("events.k8s.io", "v1", 17750, 15),
    ("apps", "v1", 17800, 15),
    ("authentication.k8s.io", "v1", 17700, 15),
    ("authorization.k8s.io", "v1", 17600, 15),
    ("autoscaling", "v1", 17500, 15),
    ("autoscaling", "v2", 17500, 30),
    ("batch", "v1", 17400, 15),
    ("certificates.k8s.io", "v1", 17300, 15),
    ("networking.k8s.io", "v1", 17200, 15),
    ("policy", "v1", 17100, 15),
    ("rbac.authorization.k8s.io", "v1", 17000, 15),
    ("storage.k8s.io", "v1", 16800, 15),
    ("apiextensions.k8s.io", "v1", 16700, 15),
    ("admissionregistration.k8s.io", "v1", 16700, 15),
    ("scheduling.k8s.io", "v1", 16600, 15),
    ("coordination.k8s.io", "v1", 16500, 15),
    ("node.k8s.io", "v1", 16300, 15),
    ("discovery.k8s.io", "v1", 16200, 15),
    ("resource.k8s.io", "v1", 16200, 21),
    ("flowcontrol.apiserver.k8s.io", "v1", 16100, 21),
    ("storagemigration.k8s.io", "v1", 15800, 15),
];

/// Whether `group` is one of kube-apiserver's built-in groups (the rest are custom
/// resources' groups, at group priority 1000).
pub fn is_builtin_group(group: &str) -> bool {
    PRIORITIES.iter().any(|(g, ..)| *g == group)
}

/// The Local APIServices of the served built-in group versions: (object, status).
pub fn local_api_services(registry: &Registry) -> Vec<(Value, Value)> {
    let mut served: Vec<(&str, &str)> = vec![("", "v1")];
    for (g, versions) in registry.groups() {
        for v in versions {
            served.push((g, v));
        }
    }
    PRIORITIES
        .iter()
        .filter(|(g, v, ..)| served.contains(&(*g, *v)))
        .map(|(g, v, group_priority, version_priority)| {
            let obj = json!({
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {
                    "name": format!("{v}.{g}"),
                    "labels": {"kube-aggregator.kubernetes.io/automanaged": "onstart"},
                },
                "spec": {
                    "group": g, "version": v,
                    "groupPriorityMinimum": group_priority, "versionPriority": version_priority,
                },
            });
            (obj, local_status())
        })
        .collect()
}

/// The status the local availability controller gives an APIService this server serves.
fn local_status() -> Value {
    json!({"status": {"conditions": [{
        "type": "Available",
        "status": "True",
        "reason": "Local",
        "message": "Local APIServices are always available",
        "lastTransitionTime": crate::time::now_rfc3339(),
    }]}})
}

/// The label of the APIServices the API server keeps itself; `true` marks those of
/// custom resource definitions.
const AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";

/// Keeps one Local APIService per served version of the stored custom resource
/// definitions (`crds`), as kube-apiserver's crdRegistrationController and autoregister
/// controller do: created with group priority 1000 and version priority 100 and the
/// `automanaged: "true"` label, deleted once no definition serves that version.
pub(crate) async fn sync_custom_resource_api_services(
    rest: &crate::rest::Rest,
    registry: &Registry,
    crds: &[Value],
) -> anyhow::Result<()> {
    let mut wanted: Vec<(String, String)> = Vec::new();
    for crd in crds {
        let group = str_at(crd, "/spec/group");
        for v in crd
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|v| v.get("served").and_then(Value::as_bool) == Some(true))
        {
            let pair = (group.to_owned(), str_at(v, "/name").to_owned());
            if !pair.0.is_empty() && !pair.1.is_empty() && !wanted.contains(&pair) {
                wanted.push(pair);
            }
        }
    }
    let page = rest
        .store
        .range(kumo_storage::RangeRequest {
            prefix: b"/registry/apiservices/".to_vec(),
            ..Default::default()
        })
        .await?;
    let mut existing = Vec::new();
    for kv in &page.kvs {
        let Ok(obj) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        let name = name_of(&obj).to_owned();
        let managed = obj
            .pointer("/metadata/labels")
            .and_then(|l| l.get(AUTOMANAGED))
            .and_then(Value::as_str)
            == Some("true");
        if managed && !wanted.iter().any(|(g, v)| name == format!("{v}.{g}")) {
            match rest.store.delete(&kv.key, Some(kv.mod_revision)).await {
                Ok(_)
                | Err(kumo_storage::StorageError::NotFound)
                | Err(kumo_storage::StorageError::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        existing.push(name);
    }
    for (g, v) in wanted {
        let name = format!("{v}.{g}");
        if existing.contains(&name) {
            continue;
        }
        let obj = json!({
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": name, "labels": {AUTOMANAGED: "true"}},
            "spec": {"group": g, "version": v, "groupPriorityMinimum": 1000, "versionPriority": 100},
        });
        crate::server::ensure(
            rest,
            registry,
            ("apiregistration.k8s.io", "v1", "apiservices"),
            None,
            &obj,
            None,
            Some(&local_status()),
        )
        .await?;
    }
    Ok(())
}

struct ApiServices;

impl Strategy for ApiServices {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    fn default(&self, obj: &mut Value) {
        // SetDefaults_ServiceReference: the Service's port is 443 unless given.
        if let Some(svc) = obj
            .pointer_mut("/spec/service")
            .and_then(Value::as_object_mut)
        {
            svc.entry("port").or_insert(json!(443));
        }
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        keep_status(new, old);
    }

    fn validate_name(&self, name: &str) -> Vec<String> {
        // `<version>.<group>`; the core group's is `v1.`.
        match name.split_once('.') {
            Some((v, _)) if !v.is_empty() => Vec::new(),
            _ => vec![format!("\"{name}\" must be in the form <version>.<group>")],
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        let name = name_of(obj);
        let (group, version) = (str_at(obj, "/spec/group"), str_at(obj, "/spec/version"));
        if version.is_empty() {
            errs.push(FieldError::required(&spec.child("version"), ""));
        }
        if name != format!("{version}.{group}") {
            errs.push(FieldError::invalid(
                &Path::new("metadata").child("name"),
                name,
                format!("must be `spec.version+\".\"+spec.group`: \"{version}.{group}\""),
            ));
        }
        let priority = |k: &str| {
            obj.pointer(&format!("/spec/{k}"))
                .and_then(Value::as_i64)
                .unwrap_or(0)
        };
        let group_priority = priority("groupPriorityMinimum");
        if !(1..=20000).contains(&group_priority) {
            errs.push(FieldError::invalid(
                &spec.child("groupPriorityMinimum"),
                group_priority,
                "must be positive and less than 20000",
            ));
        }
        let version_priority = priority("versionPriority");
        if !(1..=1000).contains(&version_priority) {
            errs.push(FieldError::invalid(
                &spec.child("versionPriority"),
                version_priority,
                "must be positive and less than 1000",
            ));
        }
        errs
    }

    fn validate_update(&self, new: &Value, _old: &Value) -> Vec<FieldError> {
        self.validate(new)
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "Service",
                "string",
                "The reference to the service that hosts this API endpoint.",
            ),
            col("Available", "string", "Whether this service is available."),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let service = match obj.pointer("/spec/service").filter(|s| !s.is_null()) {
            Some(s) => format!("{}/{}", str_at(s, "/namespace"), str_at(s, "/name")),
            None => "Local".into(),
        };
        let available = obj
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| c["type"] == "Available"))
            .map(|c| {
                let status = c["status"].as_str().unwrap_or("Unknown");
                match c["reason"].as_str() {
                    Some(r) if status != "True" && !r.is_empty() => format!("{status} ({r})"),
                    _ => status.to_owned(),
                }
            })
            .unwrap_or_else(|| "Unknown".into());
        vec![
            json!(name_of(obj)),
            json!(service),
            json!(available),
            json!(age_of(obj)),
        ]
    }
}
