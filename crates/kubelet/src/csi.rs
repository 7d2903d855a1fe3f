//! The kubelet's CSI volume plugin and its share of the volume manager: the CSI drivers
//! of this node registered (the Node's `csi.volume.kubernetes.io/nodeid` annotation and
//! topology labels, the CSINode's driver entry), and the persistent volumes of its pods
//! (claims, generic ephemeral volumes) staged and published through their driver, then
//! unpublished and unstaged when the pods go. `status.volumesInUse` says which volumes are
//! mounted here, so the attach-detach controller does not detach them under a pod.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use kumo_csi::spec::{
    NodeGetInfoRequest, NodePublishVolumeRequest, NodeStageVolumeRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};
use serde_json::{json, Value};

use crate::env::str_at;

/// The Node annotation mapping each registered driver to this node's id in it.
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";
/// Where in `sources` the pods' persistent volumes are (by pod volume name).
pub const DISKS: &str = "disks";

/// A volume staged on this node.
#[derive(Clone, Debug)]
struct Staged {
    driver: String,
    handle: String,
    path: PathBuf,
    /// The pods (uids) that have it published.
    users: BTreeSet<String>,
}

/// How long a failed file system resize waits before it is tried again.
const EXPAND_RETRY: Duration = Duration::from_secs(60);

/// A volume published for one pod.
#[derive(Clone, Debug)]
struct Published {
    /// The pod's volume name.
    volume: String,
    /// The pod's namespace and name, and its claim's name.
    namespace: String,
    pod: String,
    claim: String,
    /// `kubernetes.io/csi/<driver>^<handle>`.
    unique: String,
    handle: String,
    target: PathBuf,
    /// What the pod's mount shows (see [`DISKS`]).
    entry: Value,
}

#[derive(Default)]
struct State {
    staged: HashMap<String, Staged>,
    published: HashMap<String, Vec<Published>>,
    /// The volumesInUse last reported.
    reported: Option<Vec<String>>,
    /// When growing a volume's file system last failed (retried a minute later).
    expand_failed: HashMap<String, std::time::Instant>,
}

/// The node's CSI drivers and what they mounted.
pub struct Volumes {
    client: Client,
    node: String,
    root: Option<PathBuf>,
    drivers: tokio::sync::RwLock<BTreeMap<String, kumo_csi::Client>>,
    state: Mutex<State>,
}

use kumo_csi::{attachment_name, hex_sha256, unique_name};

fn status_text(e: &kumo_csi::grpc::Status) -> String {
    format!("rpc error: code = {:?} desc = {}", e.code(), e.message())
}

/// The capability the PersistentVolume `pv` is used with.
fn capability(pv: &Value, fs_type: &str) -> VolumeCapability {
    let list = |p: &str| -> Vec<String> {
        pv.pointer(p)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.as_str().map(str::to_owned))
            .collect()
    };
    kumo_csi::mount_capability(
        &list("/spec/accessModes"),
        fs_type,
        list("/spec/mountOptions"),
    )
}

fn string_map(v: Option<&Value>) -> HashMap<String, String> {
    v.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

/// What a pod's volume waits for (no event: the pod is ContainerCreating meanwhile).
fn waiting(why: impl Into<String>) -> Value {
    json!({"waiting": why.into()})
}

/// A volume that cannot be mounted: a `FailedMount` event with `message`.
fn failed(message: impl Into<String>) -> Value {
    json!({"error": message.into()})
}

impl Volumes {
    /// The volume manager of node `node`, its kubelet's directory `root`.
    pub fn new(client: Client, node: &str, root: Option<PathBuf>) -> Arc<Volumes> {
        Arc::new(Volumes {
            client,
            node: node.to_owned(),
            root,
            drivers: tokio::sync::RwLock::new(BTreeMap::new()),
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the node plugin at `socket`, retrying (with backoff, up to 30 s apart)
    /// until it answers and the API has its registration.
    pub async fn register(self: Arc<Self>, socket: PathBuf) {
        let mut delay = Duration::from_millis(200);
        loop {
            match self.try_register(&socket).await {
                Ok(name) => {
                    tracing::info!(node = %self.node, driver = %name, socket = %socket.display(), "CSI driver registered");
                    return;
                }
                Err(e) => {
                    tracing::info!(node = %self.node, socket = %socket.display(), error = %e, "registering a CSI driver")
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(30));
        }
    }

    async fn try_register(&self, socket: &Path) -> Result<String, String> {
        let c = kumo_csi::Client::connect(socket)
            .await
            .map_err(|e| e.to_string())?;
        let name = c.driver_name().await.map_err(|e| status_text(&e))?;
        let info = c
            .node
            .clone()
            .node_get_info(NodeGetInfoRequest {})
            .await
            .map_err(|e| status_text(&e))?
            .into_inner();
        if info.node_id.is_empty() {
            return Err(format!("driver {name} reported an empty node id"));
        }
        let topology: BTreeMap<String, String> = info
            .accessible_topology
            .map(|t| t.segments.into_iter().collect())
            .unwrap_or_default();
        self.update_node(&name, &info.node_id, &topology).await?;
        self.update_csi_node(&name, &info.node_id, &topology, info.max_volumes_per_node)
            .await?;
        self.drivers.write().await.insert(name.clone(), c);
        Ok(name)
    }

    /// The nodeid annotation and the topology labels, as upstream's node info manager.
    async fn update_node(
        &self,
        driver: &str,
        node_id: &str,
        topology: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let node = api.get(&self.node).await.map_err(|e| e.to_string())?;
        let meta = &node.metadata;
        let mut ids: BTreeMap<String, String> = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODE_ID_ANNOTATION))
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default();
        let labels = meta.labels.clone().unwrap_or_default();
        for (k, v) in topology {
            if let Some(existing) = labels.get(k).filter(|e| *e != v) {
                return Err(format!(
                    "detected topology value collision: driver reported {k:?}:{v:?} but existing label is {k:?}:{existing:?}"
                ));
            }
        }
        let unchanged = ids.get(driver).is_some_and(|i| i == node_id)
            && topology.iter().all(|(k, v)| labels.get(k) == Some(v));
        if unchanged {
            return Ok(());
        }
        ids.insert(driver.to_owned(), node_id.to_owned());
        let patch = json!({"metadata": {
            "resourceVersion": meta.resource_version,
            "annotations": {NODE_ID_ANNOTATION: serde_json::to_string(&ids).map_err(|e| e.to_string())?},
            "labels": topology,
        }});
        api.patch(&self.node, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// The driver's entry in the node's CSINode (made by the kubelet at start).
    async fn update_csi_node(
        &self,
        driver: &str,
        node_id: &str,
        topology: &BTreeMap<String, String>,
        max_volumes: i64,
    ) -> Result<(), String> {
        let api: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(self.client.clone());
        let current = api
            .get_opt(&self.node)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("CSINode {:?} is not there yet", self.node))?;
        let mut v = serde_json::to_value(&current).map_err(|e| e.to_string())?;
        let mut entry = json!({
            "name": driver,
            "nodeID": node_id,
            "topologyKeys": topology.keys().collect::<Vec<_>>(),
        });
        if max_volumes > 0 {
            entry["allocatable"] = json!({"count": max_volumes.min(i64::from(i32::MAX))});
        }
        let mut drivers: Vec<Value> = v
            .pointer("/spec/drivers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if drivers.contains(&entry) {
            return Ok(());
        }
        drivers.retain(|d| d["name"] != driver);
        drivers.push(entry);
        v["spec"]["drivers"] = Value::Array(drivers);
        let csi = serde_json::from_value(v).map_err(|e| e.to_string())?;
        api.replace(&self.node, &PostParams::default(), &csi)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// What each persistent volume of `pod` shows, by the pod's volume name: `{"disk":
    /// {"id", "path"}}` (published by its driver), `{"hostPath": path}` (a hostPath or local
    /// PersistentVolume), `{"waiting": why}` or `{"error": message}`. Mounts what it can.
    pub async fn mount(&self, pod: &Value) -> Value {
        let mut out = serde_json::Map::new();
        let uid = str_at(pod, "/metadata/uid");
        for vol in pod
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = str_at(vol, "/name");
            let (claim, read_only, ephemeral) = if let Some(c) = vol.get("persistentVolumeClaim") {
                (
                    str_at(c, "/claimName"),
                    c.get("readOnly").and_then(Value::as_bool) == Some(true),
                    false,
                )
            } else if vol.get("ephemeral").is_some() {
                (
                    format!("{}-{name}", str_at(pod, "/metadata/name")),
                    false,
                    true,
                )
            } else {
                continue;
            };
            let published = self
                .lock()
                .published
                .get(&uid)
                .and_then(|p| p.iter().find(|p| p.volume == name).map(|p| p.entry.clone()));
            let entry = match published {
                Some(e) => e,
                None => {
                    self.mount_one(pod, &uid, &name, &claim, read_only, ephemeral)
                        .await
                }
            };
            out.insert(name, entry);
        }
        Value::Object(out)
    }

    async fn mount_one(
        &self,
        pod: &Value,
        uid: &str,
        volume: &str,
        claim: &str,
        read_only: bool,
        ephemeral: bool,
    ) -> Value {
        let ns = str_at(pod, "/metadata/namespace");
        let get = |path: String| {
            let client = self.client.clone();
            async move {
                let req = http::Request::get(path).body(Vec::new()).ok()?;
                match client.request::<Value>(req).await {
                    Ok(v) => Some(Ok(v)),
                    Err(kube::Error::Api(s)) if s.code == 404 => None,
                    Err(e) => Some(Err(e.to_string())),
                }
            }
        };
        let pvc = match get(format!("/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")).await
        {
            Some(Ok(p)) => p,
            Some(Err(e)) => return waiting(e),
            None => {
                return failed(format!(
                    "MountVolume.SetUp failed for volume \"{volume}\" : persistentvolumeclaim \"{claim}\" not found"
                ))
            }
        };
        if ephemeral {
            let owned = pvc
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|o| o["uid"] == uid && o["controller"] == true);
            if !owned {
                return failed(format!(
                    "MountVolume.SetUp failed for volume \"{volume}\" : PVC {ns}/{claim} was not created for pod {ns}/{} (pod is not owner)",
                    str_at(pod, "/metadata/name")
                ));
            }
        }
        let pv_name = str_at(&pvc, "/spec/volumeName");
        if str_at(&pvc, "/status/phase") != "Bound" || pv_name.is_empty() {
            return waiting(format!("PVC {ns}/{claim} is not bound"));
        }
        let pv = match get(format!("/api/v1/persistentvolumes/{pv_name}")).await {
            Some(Ok(p)) => p,
            Some(Err(e)) => return waiting(e),
            None => return waiting(format!("persistentvolume {pv_name:?} not found")),
        };
        let read_only =
            read_only || pv.pointer("/spec/csi/readOnly").and_then(Value::as_bool) == Some(true);
        if let Some(p) = pv
            .pointer("/spec/hostPath/path")
            .or_else(|| pv.pointer("/spec/local/path"))
            .and_then(Value::as_str)
        {
            let entry = json!({"hostPath": p, "readOnly": read_only});
            self.lock()
                .published
                .entry(uid.to_owned())
                .or_default()
                .push(Published {
                    volume: volume.to_owned(),
                    namespace: str_at(pod, "/metadata/namespace"),
                    pod: str_at(pod, "/metadata/name"),
                    claim: claim.to_owned(),
                    unique: String::new(),
                    handle: String::new(),
                    target: PathBuf::new(),
                    entry: entry.clone(),
                });
            return entry;
        }
        let Some(csi) = pv.pointer("/spec/csi") else {
            return failed(format!(
                "MountVolume.SetUp failed for volume \"{pv_name}\" : the volume's source is not supported by this kubelet (CSI, hostPath and local are)"
            ));
        };
        let driver = str_at(csi, "/driver");
        let handle = str_at(csi, "/volumeHandle");
        let Some(root) = self.root.clone() else {
            return failed(format!(
                "MountVolume.MountDevice failed for volume \"{pv_name}\" : the kubelet has no root directory for CSI volumes"
            ));
        };
        let Some(client) = self.drivers.read().await.get(&driver).cloned() else {
            return failed(format!(
                "MountVolume.MountDevice failed for volume \"{pv_name}\" : kubernetes.io/csi: attacher.MountDevice failed to create newCsiDriverClient: driver name {driver} not found in the list of registered CSI drivers"
            ));
        };
        // Attached first, unless the driver says it needs no attaching.
        let attach_required =
            match get(format!("/apis/storage.k8s.io/v1/csidrivers/{driver}")).await {
                Some(Ok(d)) => {
                    d.pointer("/spec/attachRequired").and_then(Value::as_bool) != Some(false)
                }
                _ => true,
            };
        let mut publish_context = HashMap::new();
        if attach_required {
            let va_name = attachment_name(&handle, &driver, &self.node);
            match get(format!(
                "/apis/storage.k8s.io/v1/volumeattachments/{va_name}"
            ))
            .await
            {
                Some(Ok(va)) if va.pointer("/status/attached") == Some(&json!(true)) => {
                    publish_context = string_map(va.pointer("/status/attachmentMetadata"));
                }
                Some(Err(e)) => return waiting(e),
                _ => {
                    return waiting(format!(
                        "volume {pv_name} is not attached to node {} yet",
                        self.node
                    ))
                }
            }
        }
        let unique = unique_name(&driver, &handle);
        let fs_type = str_at(csi, "/fsType");
        let cap = capability(&pv, &fs_type);
        let context = string_map(csi.get("volumeAttributes"));
        let staging = root
            .join("plugins/kubernetes.io/csi")
            .join(&driver)
            .join(hex_sha256(&handle))
            .join("globalmount");
        let already = self.lock().staged.contains_key(&unique);
        if !already {
            // A fresh stage grows a file system that could not grow while mounted: its
            // resize is tried again at once.
            self.lock().expand_failed.remove(&unique);
            // Reported in use before it is mounted, so it is not detached under the mount.
            self.lock().staged.insert(
                unique.clone(),
                Staged {
                    driver: driver.clone(),
                    handle: handle.clone(),
                    path: staging.clone(),
                    users: BTreeSet::new(),
                },
            );
            self.report_in_use().await;
            if let Some(dir) = staging.parent() {
                let _ = std::fs::create_dir_all(dir);
                let _ = std::fs::write(
                    dir.join("vol_data.json"),
                    json!({"driverName": driver, "volumeHandle": handle}).to_string(),
                );
            }
            let staged = client
                .node
                .clone()
                .node_stage_volume(NodeStageVolumeRequest {
                    volume_id: handle.clone(),
                    publish_context: publish_context.clone(),
                    staging_target_path: staging.display().to_string(),
                    volume_capability: Some(cap.clone()),
                    secrets: HashMap::new(),
                    volume_context: context.clone(),
                })
                .await;
            if let Err(e) = staged {
                self.lock().staged.remove(&unique);
                self.report_in_use().await;
                return failed(format!(
                    "MountVolume.MountDevice failed for volume \"{pv_name}\" : {}",
                    status_text(&e)
                ));
            }
        }
        let dir = root
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~csi")
            .join(pv_name.replace('/', "~"));
        let target = dir.join("mount");
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(
            dir.join("vol_data.json"),
            json!({
                "specVolID": pv_name,
                "volumeHandle": handle,
                "driverName": driver,
                "nodeName": self.node,
                "volumeLifecycleMode": "Persistent",
                "attachmentID": attachment_name(&handle, &driver, &self.node),
            })
            .to_string(),
        );
        let published = client
            .node
            .clone()
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: handle.clone(),
                publish_context,
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(cap),
                readonly: read_only,
                secrets: HashMap::new(),
                volume_context: context,
            })
            .await;
        if let Err(e) = published {
            self.release_unused(&unique).await;
            return failed(format!(
                "MountVolume.SetUp failed for volume \"{pv_name}\" : {}",
                status_text(&e)
            ));
        }
        let entry = json!({
            "disk": {"id": handle, "path": target.display().to_string()},
            "readOnly": read_only,
        });
        let mut st = self.lock();
        if let Some(s) = st.staged.get_mut(&unique) {
            s.users.insert(uid.to_owned());
        }
        st.published
            .entry(uid.to_owned())
            .or_default()
            .push(Published {
                volume: volume.to_owned(),
                namespace: ns.clone(),
                pod: str_at(pod, "/metadata/name"),
                claim: claim.to_owned(),
                unique,
                handle,
                target,
                entry: entry.clone(),
            });
        entry
    }

    /// Looks every 2 s for claims mounted here whose resize waits for this node (the
    /// volume manager's resize check), and finishes them.
    pub async fn expand_pending(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let mounted: Vec<(String, Published)> = self
                .lock()
                .published
                .iter()
                .flat_map(|(uid, ps)| ps.iter().map(move |p| (uid.clone(), p.clone())))
                .filter(|(_, p)| !p.unique.is_empty())
                .collect();
            for (uid, p) in mounted {
                self.expand_if_pending(&uid, &p).await;
            }
        }
    }

    /// Finishes a resize of the claim's volume on this node (NodeExpandVolume) when the
    /// resizer left it pending here, then writes the claim's new capacity, as upstream's
    /// node expander does.
    async fn expand_if_pending(&self, uid: &str, p: &Published) {
        let (ns, claim) = (p.namespace.clone(), p.claim.as_str());
        let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &ns);
        let Ok(Some(pvc)) = api.get_opt(claim).await else {
            return;
        };
        let st = pvc.status.clone().unwrap_or_default();
        let pending = st
            .allocated_resource_statuses
            .as_ref()
            .and_then(|m| m.get("storage"))
            .map(String::as_str)
            == Some("NodeResizePending");
        let Some(size) = st
            .allocated_resources
            .as_ref()
            .and_then(|m| m.get("storage"))
            .cloned()
        else {
            return;
        };
        if !pending {
            return;
        }
        if self
            .lock()
            .expand_failed
            .get(&p.unique)
            .is_some_and(|t| t.elapsed() < EXPAND_RETRY)
        {
            return;
        }
        let (driver, staging) = match self.lock().staged.get(&p.unique) {
            Some(s) => (s.driver.clone(), s.path.clone()),
            None => return,
        };
        let Some(client) = self.drivers.read().await.get(&driver).cloned() else {
            return;
        };
        let pv_name = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        let bytes = kumo_apimachinery::quantity::Quantity::parse(&size.0)
            .map(|q| i64::try_from(q.value()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let r = client
            .node
            .clone()
            .node_expand_volume(kumo_csi::spec::NodeExpandVolumeRequest {
                volume_id: p.handle.clone(),
                volume_path: p.target.display().to_string(),
                capacity_range: Some(kumo_csi::spec::CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                staging_target_path: staging.display().to_string(),
                volume_capability: None,
                secrets: HashMap::new(),
            })
            .await;
        let pod_event =
            |warning: bool, reason: &'static str, message: String| crate::events::Record {
                kind: "Pod",
                namespace: ns.clone(),
                name: p.pod.clone(),
                uid: uid.to_owned(),
                field_path: None,
                warning,
                reason: reason.into(),
                message,
            };
        if let Err(e) = r {
            self.lock()
                .expand_failed
                .insert(p.unique.clone(), std::time::Instant::now());
            crate::events::emit(
                &self.client,
                &self.node,
                vec![pod_event(
                    true,
                    "FileSystemResizeFailed",
                    format!(
                        "MountVolume.NodeExpandVolume failed for volume \"{pv_name}\" : {}",
                        status_text(&e)
                    ),
                )],
            );
            return;
        }
        self.lock().expand_failed.remove(&p.unique);
        let mut n = pvc.clone();
        let s = n.status.get_or_insert_with(Default::default);
        s.capacity = Some(BTreeMap::from([("storage".to_owned(), size)]));
        if let Some(m) = s.allocated_resource_statuses.as_mut() {
            m.remove("storage");
        }
        if s.allocated_resource_statuses
            .as_ref()
            .is_some_and(|m| m.is_empty())
        {
            s.allocated_resource_statuses = None;
        }
        if let Some(c) = s.conditions.as_mut() {
            c.retain(|c| {
                !matches!(
                    c.type_.as_str(),
                    "FileSystemResizePending" | "Resizing" | "NodeResizeError"
                )
            });
        }
        if let Err(e) = api.replace_status(claim, &PostParams::default(), &n).await {
            tracing::warn!(node = %self.node, claim, error = %e, "writing the claim's resized capacity");
            return;
        }
        let message = format!(
            "MountVolume.NodeExpandVolume succeeded for volume \"{pv_name}\" {}",
            self.node
        );
        let mut claim_event = pod_event(false, "FileSystemResizeSuccessful", message.clone());
        claim_event.kind = "PersistentVolumeClaim";
        claim_event.name = claim.to_owned();
        claim_event.uid = pvc.metadata.uid.clone().unwrap_or_default();
        crate::events::emit(
            &self.client,
            &self.node,
            vec![
                pod_event(false, "FileSystemResizeSuccessful", message),
                claim_event,
            ],
        );
    }

    /// Unpublishes the volumes of pod `uid` (its containers are gone) and unstages those
    /// no other pod here uses.
    pub async fn release(&self, uid: &str) {
        let Some(published) = self.lock().published.remove(uid) else {
            return;
        };
        for p in published {
            if p.unique.is_empty() {
                continue;
            }
            let driver = self.lock().staged.get(&p.unique).map(|s| s.driver.clone());
            let client = match driver {
                Some(d) => self.drivers.read().await.get(&d).cloned(),
                None => None,
            };
            if let Some(c) = &client {
                let r = c
                    .node
                    .clone()
                    .node_unpublish_volume(NodeUnpublishVolumeRequest {
                        volume_id: p.handle.clone(),
                        target_path: p.target.display().to_string(),
                    })
                    .await;
                if let Err(e) = r {
                    tracing::warn!(node = %self.node, pod = uid, volume = %p.volume, error = %status_text(&e), "UnmountVolume.TearDown failed");
                }
            }
            if let Some(s) = self.lock().staged.get_mut(&p.unique) {
                s.users.remove(uid);
            }
            self.release_unused(&p.unique).await;
        }
    }

    /// Unstages `unique` if no pod uses it.
    async fn release_unused(&self, unique: &str) {
        let staged = {
            let st = self.lock();
            match st.staged.get(unique) {
                Some(s) if s.users.is_empty() => s.clone(),
                _ => return,
            }
        };
        let client = self.drivers.read().await.get(&staged.driver).cloned();
        if let Some(c) = client {
            let r = c
                .node
                .clone()
                .node_unstage_volume(NodeUnstageVolumeRequest {
                    volume_id: staged.handle.clone(),
                    staging_target_path: staged.path.display().to_string(),
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(node = %self.node, volume = %unique, error = %status_text(&e), "UnmountDevice failed");
                return;
            }
        }
        {
            let mut st = self.lock();
            if st.staged.get(unique).is_some_and(|s| s.users.is_empty()) {
                st.staged.remove(unique);
            }
        }
        self.report_in_use().await;
    }

    /// Writes `status.volumesInUse` when the staged set changed.
    async fn report_in_use(&self) {
        let now: Vec<String> = {
            let st = self.lock();
            let mut v: Vec<String> = st.staged.keys().cloned().collect();
            v.sort();
            if st.reported.as_ref() == Some(&v) {
                return;
            }
            v
        };
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let patch = json!({"status": {"volumesInUse": now}});
        match api
            .patch_status(&self.node, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => self.lock().reported = Some(now),
            Err(e) => tracing::warn!(node = %self.node, error = %e, "reporting volumesInUse"),
        }
    }
}
