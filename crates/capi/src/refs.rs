//! Objects named by a v1beta2 contract reference (`{apiGroup, kind, name}`): the version
//! comes from the CRD's contract label (`cluster.x-k8s.io/v1beta2: <versions>`, the last
//! one), as upstream's contract resolution reads it.

use std::collections::HashMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use parking_lot::Mutex;
use serde_json::Value;

use crate::Error;

/// The contract label of v1beta2 providers' CRDs.
pub const CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";

/// Resolves references through the management cluster's CRDs.
pub struct Refs {
    client: kube::Client,
    cache: Mutex<HashMap<(String, String), ApiResource>>,
}

impl Refs {
    pub fn new(client: kube::Client) -> Refs {
        Refs {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The resource of `group`/`kind` at its contract version.
    pub async fn resource(&self, group: &str, kind: &str) -> Result<ApiResource, Error> {
        let key = (group.to_owned(), kind.to_owned());
        if let Some(r) = self.cache.lock().get(&key) {
            return Ok(r.clone());
        }
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let list = crds
            .list(&ListParams::default().labels(CONTRACT_LABEL))
            .await?;
        for c in list.items {
            if c.spec.group != group || c.spec.names.kind != kind {
                continue;
            }
            let version = c
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(CONTRACT_LABEL))
                .and_then(|v| v.rsplit('_').next())
                .unwrap_or_default()
                .to_owned();
            let gvk = GroupVersionKind::gvk(group, &version, kind);
            let ar = ApiResource::from_gvk_with_plural(&gvk, &c.spec.names.plural);
            self.cache.lock().insert(key, ar.clone());
            return Ok(ar);
        }
        Err(Error::Invalid(format!(
            "no CRD of {kind}.{group} carries the {CONTRACT_LABEL} contract label"
        )))
    }

    /// The API of the object `reference` names in `namespace`.
    pub async fn api(
        &self,
        namespace: &str,
        reference: &Value,
    ) -> Result<(Api<DynamicObject>, String), Error> {
        let (group, kind, name) = parts(reference);
        if kind.is_empty() || name.is_empty() {
            return Err(Error::Invalid(format!(
                "an incomplete reference {reference}"
            )));
        }
        let ar = self.resource(group, kind).await?;
        Ok((
            Api::namespaced_with(self.client.clone(), namespace, &ar),
            name.to_owned(),
        ))
    }

    /// The object `reference` names, if it exists.
    pub async fn get(
        &self,
        namespace: &str,
        reference: &Value,
    ) -> Result<Option<DynamicObject>, Error> {
        let (api, name) = self.api(namespace, reference).await?;
        Ok(api.get_opt(&name).await?)
    }

    /// Deletes the object `reference` names (once); whether it still exists.
    pub async fn delete(&self, namespace: &str, reference: &Value) -> Result<bool, Error> {
        let Some(obj) = self.get(namespace, reference).await? else {
            return Ok(false);
        };
        if obj.metadata.deletion_timestamp.is_none() {
            let (api, name) = self.api(namespace, reference).await?;
            let _ = api
                .delete(&name, &kube::api::DeleteParams::background())
                .await;
        }
        Ok(true)
    }

    /// Makes `owner` the controller of `obj` (the object `reference` names) and labels it
    /// with cluster `cluster`: a template's clone is owned by whoever made it until its
    /// Machine takes it, so any other controller reference is demoted.
    pub async fn adopt(
        &self,
        namespace: &str,
        reference: &Value,
        obj: &DynamicObject,
        owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
        cluster: &str,
    ) -> Result<(), Error> {
        let owned = obj.metadata.owner_references.as_ref().is_some_and(|os| {
            os.iter()
                .any(|o| o.uid == owner.uid && o.controller == Some(true))
        });
        let labelled = obj
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::CLUSTER_NAME_LABEL))
            .map(String::as_str)
            == Some(cluster);
        if owned && labelled {
            return Ok(());
        }
        let mut owners: Vec<_> = obj
            .metadata
            .owner_references
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|o| o.uid != owner.uid)
            .map(|mut o| {
                o.controller = Some(false);
                o
            })
            .collect();
        owners.push(owner);
        let (api, name) = self.api(namespace, reference).await?;
        api.patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {
                "ownerReferences": owners,
                "labels": {crate::CLUSTER_NAME_LABEL: cluster},
                "resourceVersion": obj.metadata.resource_version,
            }})),
        )
        .await?;
        Ok(())
    }

    /// Creates `name` from template `reference` (its `spec.template`), with `labels`,
    /// the cloned-from annotations and `owner`, as upstream's external.CreateFromTemplate.
    pub async fn clone_template(
        &self,
        namespace: &str,
        reference: &Value,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
        owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ) -> Result<Value, Error> {
        let (group, kind, _) = parts(reference);
        let template = self.get(namespace, reference).await?.ok_or_else(|| {
            Error::NotFound(format!(
                "{kind} {namespace}/{}",
                reference
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            ))
        })?;
        let target_kind = kind.strip_suffix("Template").unwrap_or(kind);
        let tmpl = template
            .data
            .get("spec")
            .and_then(|s| s.get("template"))
            .cloned()
            .unwrap_or_default();
        let ar = self.resource(group, kind).await?;
        let mut obj = serde_json::json!({
            "apiVersion": ar.api_version,
            "kind": target_kind,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": tmpl.pointer("/metadata/labels").cloned().unwrap_or_else(|| serde_json::json!({})),
                "annotations": tmpl.pointer("/metadata/annotations").cloned().unwrap_or_else(|| serde_json::json!({})),
                "ownerReferences": [owner],
            },
            "spec": tmpl.get("spec").cloned().unwrap_or_else(|| serde_json::json!({})),
        });
        for (k, v) in labels {
            obj["metadata"]["labels"][k] = v.clone().into();
        }
        obj["metadata"]["annotations"][crate::CLONED_FROM_NAME] =
            template.metadata.name.clone().unwrap_or_default().into();
        obj["metadata"]["annotations"][crate::CLONED_FROM_GROUPKIND] =
            format!("{kind}.{group}").into();
        let target = ApiResource {
            kind: target_kind.to_owned(),
            plural: ar
                .plural
                .strip_suffix("templates")
                .map(|p| format!("{p}s"))
                .unwrap_or(ar.plural.clone()),
            ..ar
        };
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &target);
        let dynobj: DynamicObject = serde_json::from_value(obj)
            .map_err(|e| Error::Invalid(format!("cloning {kind}: {e}")))?;
        match api.create(&PostParams::default(), &dynobj).await {
            Ok(_) => {}
            Err(e) if kumo_client::error::is_already_exists(&e) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(serde_json::json!({"apiGroup": group, "kind": target_kind, "name": name}))
    }
}

/// A contract reference's (apiGroup, kind, name), empty where missing.
fn parts(reference: &Value) -> (&str, &str, &str) {
    let field = |k: &str| reference.get(k).and_then(Value::as_str).unwrap_or_default();
    (field("apiGroup"), field("kind"), field("name"))
}
