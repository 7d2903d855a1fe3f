//! external-provisioner's role: a claim whose storage-provisioner annotation names the
//! driver (and, for a class that waits for its first consumer, whose node the scheduler
//! picked) gets a volume from CreateVolume and a PersistentVolume `pvc-<claim uid>`
//! pre-bound to it, which the persistentvolume controller then binds. A Released volume
//! of the driver with reclaim policy Delete is deleted with DeleteVolume, then its object,
//! once no VolumeAttachment holds it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, PostParams};
use kube::Resource;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_apimachinery::quantity::Quantity;
use kumo_apimachinery::storage::{
    class_of, BETA_STORAGE_PROVISIONER, PROVISIONED_BY, SELECTED_NODE, STORAGE_PROVISIONER,
};
use kumo_client::error::{is_conflict, is_not_found};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::RateLimiter;

use super::{status_text, Context};
use crate::spec::{
    volume_capability, CapacityRange, CreateVolumeRequest, DeleteVolumeRequest, Topology,
    TopologyRequirement,
};

/// The finalizer that keeps a volume's object until its storage is deleted.
pub const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
const PARAMETER_PREFIX: &str = "csi.storage.k8s.io/";
const FS_TYPE: &str = "csi.storage.k8s.io/fstype";
/// Its events' component.
pub const COMPONENT: &str = "external-provisioner";

struct Ctl {
    ctx: Context,
    identity: String,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    volumes: Arc<Informer<PersistentVolume>>,
    classes: Arc<Informer<StorageClass>>,
    csi_nodes: Arc<Informer<CSINode>>,
    nodes: Arc<Informer<Node>>,
    attachments: Arc<Informer<VolumeAttachment>>,
}

fn annotation<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Registers the handlers and returns the task.
pub fn start(
    ctx: Context,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    // As the sidecar's --retry-interval-start and -max: 1 s doubling to 5 min.
    let limiter = || RateLimiter::new(Duration::from_secs(1), Duration::from_secs(300), 10.0, 100);
    let claims_q = factory.queue_with_limiter::<String>("csi-provisioner-claims", limiter());
    let volumes_q = factory.queue_with_limiter::<String>("csi-provisioner-volumes", limiter());
    let claims = factory.informer::<PersistentVolumeClaim>();
    let volumes = factory.informer::<PersistentVolume>();
    let classes = factory.informer::<StorageClass>();
    let csi_nodes = factory.informer::<CSINode>();
    let nodes = factory.informer::<Node>();
    let attachments = factory.informer::<VolumeAttachment>();
    let (q, name) = (claims_q.clone(), ctx.name.clone());
    claims.add_handler(move |c| {
        if let Change::Added(v) | Change::Updated { new: v, .. } = c {
            let mine = annotation(&v.metadata, STORAGE_PROVISIONER)
                .or_else(|| annotation(&v.metadata, BETA_STORAGE_PROVISIONER))
                == Some(name.as_str());
            let unbound = v
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .unwrap_or("")
                .is_empty();
            if mine && unbound {
                q.add(key_of(v));
            }
        }
    });
    let q = volumes_q.clone();
    volumes.add_handler(move |c| {
        if let Change::Added(v) | Change::Updated { new: v, .. } = c {
            q.add(key_of(v));
        }
    });
    let q = volumes_q.clone();
    attachments.add_handler(move |c| {
        // A volume waiting to be deleted may go once its attachment is gone.
        if let Change::Deleted(va) = c {
            if let Some(pv) = va.spec.source.persistent_volume_name.as_ref() {
                q.add(pv.clone());
            }
        }
    });
    let identity = format!(
        "{}-{}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default(),
        std::process::id() % 10_000,
        ctx.name
    );
    tokio::spawn(async move {
        let ctl = Arc::new(Ctl {
            ctx,
            identity,
            claims,
            volumes,
            classes,
            csi_nodes,
            nodes,
            attachments,
        });
        let synced = async {
            ctl.claims.wait_synced().await;
            ctl.volumes.wait_synced().await;
            ctl.classes.wait_synced().await;
            ctl.csi_nodes.wait_synced().await;
            ctl.nodes.wait_synced().await;
            ctl.attachments.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let mut tasks = run_workers_of(
            "csi-provisioner-claims",
            claims_q,
            4,
            stop.clone(),
            &ctl,
            |c, key| async move { c.provision(&key).await },
        );
        tasks.extend(run_workers_of(
            "csi-provisioner-volumes",
            volumes_q,
            2,
            stop,
            &ctl,
            |c, key| async move { c.sync_volume(&key).await },
        ));
        futures::future::join_all(tasks).await;
    })
}

fn claim_class(c: &PersistentVolumeClaim) -> String {
    class_of(
        c.metadata.annotations.as_ref(),
        c.spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref()),
    )
}

/// Bytes as a quantity in the largest binary unit that divides them.
fn bytes_quantity(b: i64) -> String {
    for (unit, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        if b > 0 && b % (1i64 << shift) == 0 {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

impl Ctl {
    fn client(&self) -> kube::Client {
        self.ctx.client.clone()
    }

    async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: &str,
        reason: &str,
        msg: String,
    ) {
        self.ctx.event(COMPONENT, obj, type_, reason, msg).await;
    }

    /// The topology segments of `node` for the driver's keys (from its CSINode).
    fn node_topology(&self, node: &str) -> Option<HashMap<String, String>> {
        let csi = self.csi_nodes.get(node)?;
        let keys = csi
            .spec
            .drivers
            .iter()
            .find(|d| d.name == self.ctx.name)?
            .topology_keys
            .clone()
            .unwrap_or_default();
        let labels = self
            .nodes
            .get(node)?
            .metadata
            .labels
            .clone()
            .unwrap_or_default();
        keys.iter()
            .map(|k| Some((k.clone(), labels.get(k)?.clone())))
            .collect()
    }

    /// What the volume may be accessible from: the selected node's topology; else the
    /// class's allowedTopologies; else every node of the driver's.
    fn requirement(
        &self,
        class: &StorageClass,
        selected: Option<&str>,
    ) -> Result<Option<TopologyRequirement>, String> {
        if let Some(node) = selected {
            let t = self.node_topology(node).ok_or_else(|| {
                format!("error generating accessibility requirements: no topology key found on CSINode {node}")
            })?;
            let t = Topology { segments: t };
            return Ok(Some(TopologyRequirement {
                requisite: vec![t.clone()],
                preferred: vec![t],
            }));
        }
        let mut all: BTreeSet<BTreeMap<String, String>> = BTreeSet::new();
        if let Some(terms) = class.allowed_topologies.as_ref().filter(|t| !t.is_empty()) {
            for term in terms {
                let mut combos: Vec<BTreeMap<String, String>> = vec![BTreeMap::new()];
                for e in term.match_label_expressions.iter().flatten() {
                    combos = combos
                        .into_iter()
                        .flat_map(|c| {
                            e.values.iter().map(move |v| {
                                let mut c = c.clone();
                                c.insert(e.key.clone(), v.clone());
                                c
                            })
                        })
                        .collect();
                }
                all.extend(combos.into_iter().filter(|c| !c.is_empty()));
            }
        } else {
            for n in self.csi_nodes.list() {
                let name = n.metadata.name.clone().unwrap_or_default();
                if let Some(t) = self.node_topology(&name).filter(|t| !t.is_empty()) {
                    all.insert(t.into_iter().collect());
                }
            }
        }
        if all.is_empty() {
            return Ok(None);
        }
        let topologies: Vec<Topology> = all
            .into_iter()
            .map(|s| Topology {
                segments: s.into_iter().collect(),
            })
            .collect();
        Ok(Some(TopologyRequirement {
            requisite: topologies.clone(),
            preferred: topologies,
        }))
    }

    async fn provision(&self, key: &str) -> Result<(), SyncError> {
        let Some(claim) = self.claims.get(key) else {
            return Ok(());
        };
        if !claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .unwrap_or("")
            .is_empty()
            || claim.metadata.deletion_timestamp.is_some()
        {
            return Ok(());
        }
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let pv_name = format!("pvc-{uid}");
        if self.volumes.get(&pv_name).is_some() {
            return Ok(());
        }
        let class_name = claim_class(&claim);
        let Some(class) = self.classes.get(&class_name) else {
            return Err(SyncError::Failed(format!(
                "storageclass {class_name:?} not found"
            )));
        };
        if class.provisioner != self.ctx.name {
            return Ok(());
        }
        let selected = annotation(&claim.metadata, SELECTED_NODE).filter(|n| !n.is_empty());
        if class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
            && selected.is_none()
        {
            return Ok(());
        }
        let ns = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        self.event(
            &*claim,
            "Normal",
            "Provisioning",
            format!("External provisioner is provisioning volume for claim \"{ns}/{name}\""),
        )
        .await;
        match self.create(&claim, &class, &pv_name, selected).await {
            Ok(()) => {
                self.event(
                    &*claim,
                    "Normal",
                    "ProvisioningSucceeded",
                    format!("Successfully provisioned volume {pv_name}"),
                )
                .await;
                Ok(())
            }
            Err(e) => {
                self.event(&*claim, "Warning", "ProvisioningFailed", e.clone())
                    .await;
                Err(SyncError::Failed(e))
            }
        }
    }

    async fn create(
        &self,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
        pv_name: &str,
        selected: Option<&str>,
    ) -> Result<(), String> {
        let class_name = class.metadata.name.clone().unwrap_or_default();
        let fail =
            |e: String| format!("failed to provision volume with StorageClass {class_name:?}: {e}");
        let spec = claim.spec.clone().unwrap_or_default();
        let modes = spec.access_modes.clone().unwrap_or_default();
        let request = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .and_then(|q| Quantity::parse(&q.0))
            .map(|q| i64::try_from(q.value()).unwrap_or(i64::MAX))
            .ok_or_else(|| fail("claim has no storage request".into()))?;
        let mut params: HashMap<String, String> = HashMap::new();
        let mut fs_type = String::new();
        for (k, v) in class.parameters.clone().unwrap_or_default() {
            if k == FS_TYPE || k.eq_ignore_ascii_case("fstype") {
                fs_type = v;
            } else if !k.starts_with(PARAMETER_PREFIX) {
                params.insert(k, v);
            }
        }
        // What --extra-create-metadata passes.
        params.insert(
            "csi.storage.k8s.io/pvc/name".into(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        params.insert(
            "csi.storage.k8s.io/pvc/namespace".into(),
            claim.metadata.namespace.clone().unwrap_or_default(),
        );
        params.insert("csi.storage.k8s.io/pv/name".into(), pv_name.to_owned());
        let requirement = self.requirement(class, selected).map_err(fail)?;
        let mut cap = crate::mount_capability(&modes, &fs_type, Vec::new());
        if spec.volume_mode.as_deref() == Some("Block") {
            // A raw block device is asked for as one: a driver without them refuses it.
            cap.access_type = Some(volume_capability::AccessType::Block(
                volume_capability::BlockVolume {},
            ));
        }
        let created = self
            .ctx
            .driver
            .controller
            .clone()
            .create_volume(CreateVolumeRequest {
                name: pv_name.to_owned(),
                capacity_range: Some(CapacityRange {
                    required_bytes: request,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap],
                parameters: params,
                accessibility_requirements: requirement,
                ..Default::default()
            })
            .await
            .map_err(|e| fail(status_text(&e)))?
            .into_inner()
            .volume
            .ok_or_else(|| fail("the driver answered no volume".into()))?;
        let capacity = if created.capacity_bytes > 0 {
            created.capacity_bytes
        } else {
            request
        };
        if capacity < request {
            return Err(fail(format!(
                "created volume capacity {capacity} less than requested capacity {request}"
            )));
        }
        let mut attributes: BTreeMap<String, String> =
            created.volume_context.clone().into_iter().collect();
        attributes.insert(
            "storage.kubernetes.io/csiProvisionerIdentity".into(),
            self.identity.clone(),
        );
        let affinity = (!created.accessible_topology.is_empty()).then(|| {
            json!({"required": {"nodeSelectorTerms": created.accessible_topology.iter().map(|t| {
                let mut keys: Vec<_> = t.segments.iter().collect();
                keys.sort();
                json!({"matchExpressions": keys.into_iter().map(|(k, v)| json!({"key": k, "operator": "In", "values": [v]})).collect::<Vec<_>>()})
            }).collect::<Vec<_>>()}})
        });
        let policy = class
            .reclaim_policy
            .clone()
            .unwrap_or_else(|| "Delete".into());
        let mut pv = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": pv_name,
                "annotations": {
                    PROVISIONED_BY: self.ctx.name,
                    "volume.kubernetes.io/provisioner-deletion-secret-name": "",
                    "volume.kubernetes.io/provisioner-deletion-secret-namespace": "",
                },
            },
            "spec": {
                "accessModes": modes,
                "capacity": {"storage": bytes_quantity(capacity)},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": claim.metadata.namespace,
                    "name": claim.metadata.name,
                    "uid": claim.metadata.uid,
                    "resourceVersion": claim.metadata.resource_version,
                },
                "persistentVolumeReclaimPolicy": policy,
                "storageClassName": class_name,
                "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
                "csi": {
                    "driver": self.ctx.name,
                    "volumeHandle": created.volume_id,
                    "volumeAttributes": attributes,
                },
            },
        });
        if !fs_type.is_empty() {
            pv["spec"]["csi"]["fsType"] = json!(fs_type);
        }
        if let Some(a) = affinity {
            pv["spec"]["nodeAffinity"] = a;
        }
        if let Some(o) = &class.mount_options {
            pv["spec"]["mountOptions"] = json!(o);
        }
        if policy == "Delete" {
            pv["metadata"]["finalizers"] = json!([FINALIZER]);
        }
        let pv: PersistentVolume = serde_json::from_value(pv).map_err(|e| fail(e.to_string()))?;
        let api: Api<PersistentVolume> = Api::all(self.client());
        match api.create(&PostParams::default(), &pv).await {
            Ok(_) => Ok(()),
            Err(e) if kumo_client::error::is_already_exists(&e) => Ok(()),
            Err(e) => {
                // The storage is not left behind for a volume object that is not there.
                let _ = self
                    .ctx
                    .driver
                    .controller
                    .clone()
                    .delete_volume(DeleteVolumeRequest {
                        volume_id: created.volume_id.clone(),
                        ..Default::default()
                    })
                    .await;
                Err(format!(
                    "Error creating provisioned PV object for claim {}/{}: {e}. Deleting the volume.",
                    claim.metadata.namespace.as_deref().unwrap_or(""),
                    claim.metadata.name.as_deref().unwrap_or("")
                ))
            }
        }
    }

    fn mine(&self, pv: &PersistentVolume) -> bool {
        annotation(&pv.metadata, PROVISIONED_BY) == Some(self.ctx.name.as_str())
            || pv
                .spec
                .as_ref()
                .and_then(|s| s.csi.as_ref())
                .is_some_and(|c| c.driver == self.ctx.name)
                && annotation(&pv.metadata, PROVISIONED_BY).is_some()
    }

    /// Deletes a Released volume of the driver with reclaim policy Delete; keeps the
    /// finalizer only on volumes whose policy is Delete.
    async fn sync_volume(&self, key: &str) -> Result<(), SyncError> {
        let Some(pv) = self.volumes.get(key) else {
            return Ok(());
        };
        if !self.mine(&pv) {
            return Ok(());
        }
        let spec = pv.spec.clone().unwrap_or_default();
        let policy = spec
            .persistent_volume_reclaim_policy
            .clone()
            .unwrap_or_default();
        let phase = pv
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let api: Api<PersistentVolume> = Api::all(self.client());
        let has_finalizer = pv
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER);
        if policy != "Delete" {
            if has_finalizer {
                let mut n = (*pv).clone();
                if let Some(f) = n.metadata.finalizers.as_mut() {
                    f.retain(|f| f != FINALIZER);
                }
                return self.write(&api, key, &n).await;
            }
            return Ok(());
        }
        if phase != "Released" {
            if !has_finalizer && phase == "Bound" && pv.metadata.deletion_timestamp.is_none() {
                let mut n = (*pv).clone();
                n.metadata
                    .finalizers
                    .get_or_insert_with(Vec::new)
                    .push(FINALIZER.to_owned());
                return self.write(&api, key, &n).await;
            }
            return Ok(());
        }
        if let Some(va) = self
            .attachments
            .list()
            .into_iter()
            .find(|va| va.spec.source.persistent_volume_name.as_deref() == Some(key))
        {
            return Err(SyncError::Failed(format!(
                "persistentvolume {key} is still attached to node {}",
                va.spec.node_name
            )));
        }
        let handle = spec
            .csi
            .as_ref()
            .map(|c| c.volume_handle.clone())
            .unwrap_or_default();
        let deleted = self
            .ctx
            .driver
            .controller
            .clone()
            .delete_volume(DeleteVolumeRequest {
                volume_id: handle,
                ..Default::default()
            })
            .await;
        if let Err(e) = deleted {
            let msg = status_text(&e);
            self.event(&*pv, "Warning", "VolumeFailedDelete", msg.clone())
                .await;
            return Err(SyncError::Failed(msg));
        }
        if has_finalizer {
            let mut n = (*pv).clone();
            if let Some(f) = n.metadata.finalizers.as_mut() {
                f.retain(|f| f != FINALIZER);
            }
            self.write(&api, key, &n).await?;
        }
        match api.delete(key, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn write(
        &self,
        api: &Api<PersistentVolume>,
        key: &str,
        pv: &PersistentVolume,
    ) -> Result<(), SyncError> {
        match api.replace(key, &PostParams::default(), pv).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) if is_conflict(&e) => Err(SyncError::Conflict(e.to_string())),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_print_in_whole_binary_units() {
        assert_eq!(bytes_quantity(1 << 30), "1Gi");
        assert_eq!(bytes_quantity(3 << 30), "3Gi");
        assert_eq!(bytes_quantity(1536 << 20), "1536Mi");
        assert_eq!(bytes_quantity(1000), "1000");
    }
}
