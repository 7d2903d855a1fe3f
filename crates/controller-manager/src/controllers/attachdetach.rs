//! persistentvolume-attach-detach-controller for CSI volumes: a volume is attached to a
//! node while a pod scheduled there uses it (a VolumeAttachment `csi-<sha256>` the
//! driver's attacher acts on) and detached (the VolumeAttachment deleted) once no pod
//! there does and the node no longer reports it in `volumesInUse` (or after 6 minutes,
//! or when the node is gone). The pods get upstream's events: `SuccessfulAttachVolume`,
//! `FailedAttachVolume` with the attacher's error, and "Waiting for detach" while a
//! single-node volume is still attached elsewhere. The nodes' `status.volumesAttached`
//! lists what is attached to them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_already_exists, is_not_found};
use kumo_client::informer::{Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

use super::replicaset::record_event;

const SERVICE_ACCOUNT: &str = "attachdetach-controller";
/// Its events' component.
pub const COMPONENT: &str = "attachdetach-controller";
/// Nodes whose volumes this controller attaches say so.
pub const MANAGED: &str = "volumes.kubernetes.io/controller-managed-attach-detach";
/// How long a volume a node still reports in use waits before it is detached anyway.
const MAX_WAIT_FOR_UNMOUNT: Duration = Duration::from_secs(360);
/// Everything is looked at again this often (upstream's reconciler loop period is 100 ms;
/// kumo reacts to changes and re-checks at this pace).
const RESYNC: Duration = Duration::from_secs(5);
const KEY: &str = "reconcile";

use kumo_csi::{attachment_name, unique_name};

/// One volume wanted on one node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Want {
    pv: String,
    driver: String,
    handle: String,
    node: String,
    single_node: bool,
}

struct Ctl {
    client: ClientSource,
    pods: Arc<Informer<Pod>>,
    nodes: Arc<Informer<Node>>,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    volumes: Arc<Informer<PersistentVolume>>,
    attachments: Arc<Informer<VolumeAttachment>>,
    drivers: Arc<Informer<CSIDriver>>,
    /// Attachment errors already reported (by VolumeAttachment: its error message), and
    /// successes reported (by VolumeAttachment).
    reported: Mutex<HashMap<String, String>>,
    /// When a no longer wanted volume was first found still in use on its node.
    unmount_wait: Mutex<HashMap<String, Instant>>,
    /// "Waiting for detach" reported, by (pv, node).
    waiting: Mutex<BTreeSet<(String, String)>>,
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("volumes");
    let pods = factory.informer::<Pod>();
    let nodes = factory.informer::<Node>();
    let claims = factory.informer::<PersistentVolumeClaim>();
    let volumes = factory.informer::<PersistentVolume>();
    let attachments = factory.informer::<VolumeAttachment>();
    let drivers = factory.informer::<CSIDriver>();
    // One reconcile of everything per change: the desired and actual states are small.
    macro_rules! wake {
        ($inf:expr) => {{
            let q = queue.clone();
            $inf.add_handler(move |_c| q.add(KEY.to_owned()));
        }};
    }
    wake!(pods);
    wake!(claims);
    wake!(volumes);
    wake!(attachments);
    {
        let q = queue.clone();
        nodes.add_handler(move |c| {
            // Heartbeats change nothing here; volumesInUse and the node's coming and
            // going do.
            let relevant = match c {
                Change::Updated { old, new } => {
                    old.status.as_ref().map(|s| &s.volumes_in_use)
                        != new.status.as_ref().map(|s| &s.volumes_in_use)
                        || old.metadata.annotations != new.metadata.annotations
                }
                _ => true,
            };
            if relevant {
                q.add(KEY.to_owned());
            }
        });
    }
    tokio::spawn(async move {
        tracing::info!("Starting attach detach controller");
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            pods,
            nodes,
            claims,
            volumes,
            attachments,
            drivers,
            reported: Mutex::new(HashMap::new()),
            unmount_wait: Mutex::new(HashMap::new()),
            waiting: Mutex::new(BTreeSet::new()),
        });
        let synced = async {
            ctl.pods.wait_synced().await;
            ctl.nodes.wait_synced().await;
            ctl.claims.wait_synced().await;
            ctl.volumes.wait_synced().await;
            ctl.attachments.wait_synced().await;
            ctl.drivers.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        {
            let (q, mut stop) = (queue.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(RESYNC) => q.add(KEY.to_owned()),
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
            });
        }
        queue.add(KEY.to_owned());
        let tasks = run_workers_of("attachdetach", queue, 1, stop, &ctl, |c, _| async move {
            c.reconcile().await
        });
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down attach detach controller");
    })
}

fn pod_done(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

impl Ctl {
    fn attach_required(&self, driver: &str) -> bool {
        self.drivers
            .get(driver)
            .is_none_or(|d| d.spec.attach_required != Some(false))
    }

    fn managed(&self, node: &str) -> bool {
        self.nodes.get(node).is_some_and(|n| {
            n.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(MANAGED))
                .map(String::as_str)
                == Some("true")
        })
    }

    /// Volumes wanted per node, with the pods that want each.
    fn desired(&self) -> BTreeMap<Want, Vec<Arc<Pod>>> {
        let mut out: BTreeMap<Want, Vec<Arc<Pod>>> = BTreeMap::new();
        for p in self.pods.list() {
            let Some(node) = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty())
            else {
                continue;
            };
            if pod_done(&p) || !self.managed(&node) {
                continue;
            }
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let pname = p.metadata.name.clone().unwrap_or_default();
            for v in p
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .into_iter()
                .flatten()
            {
                let claim = if let Some(c) = &v.persistent_volume_claim {
                    c.claim_name.clone()
                } else if v.ephemeral.is_some() {
                    format!("{pname}-{}", v.name)
                } else {
                    continue;
                };
                let Some(c) = self.claims.get(&format!("{ns}/{claim}")) else {
                    continue;
                };
                let Some(pv_name) = c
                    .spec
                    .as_ref()
                    .and_then(|s| s.volume_name.clone())
                    .filter(|v| !v.is_empty())
                else {
                    continue;
                };
                let Some(pv) = self.volumes.get(&pv_name) else {
                    continue;
                };
                let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
                    continue;
                };
                if !self.attach_required(&csi.driver) {
                    continue;
                }
                let modes = pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.access_modes.clone())
                    .unwrap_or_default();
                let single_node = !modes
                    .iter()
                    .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany");
                out.entry(Want {
                    pv: pv_name,
                    driver: csi.driver.clone(),
                    handle: csi.volume_handle.clone(),
                    node: node.clone(),
                    single_node,
                })
                .or_default()
                .push(p.clone());
            }
        }
        out
    }

    async fn event(&self, pods: &[Arc<Pod>], type_: &str, reason: &str, msg: &str) {
        for p in pods {
            record_event(&self.client, COMPONENT, &**p, type_, reason, msg.to_owned()).await;
        }
    }

    async fn reconcile(&self) -> Result<(), SyncError> {
        let desired = self.desired();
        let attachments: HashMap<String, Arc<VolumeAttachment>> = self
            .attachments
            .list()
            .into_iter()
            .map(|va| (va.metadata.name.clone().unwrap_or_default(), va))
            .collect();
        let api: Api<VolumeAttachment> = Api::all(self.client.get());
        let wanted_names: BTreeSet<String> = desired
            .keys()
            .map(|w| attachment_name(&w.handle, &w.driver, &w.node))
            .collect();
        let mut failures = Vec::new();

        // Detach what no pod wants, once its node has let it go.
        for (name, va) in &attachments {
            if wanted_names.contains(name) || va.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let node = &va.spec.node_name;
            let pv = va
                .spec
                .source
                .persistent_volume_name
                .clone()
                .unwrap_or_default();
            let csi = self
                .volumes
                .get(&pv)
                .and_then(|v| v.spec.as_ref().and_then(|s| s.csi.clone()));
            // Only attachments this controller makes (of a CSI volume, named as it names
            // them) are its to detach: one someone else made is left alone, as upstream's
            // controller only detaches what it attached.
            let Some(csi) = csi.filter(|c| {
                c.driver == va.spec.attacher
                    && attachment_name(&c.volume_handle, &c.driver, node) == *name
                    && (self.managed(node) || self.nodes.get(node).is_none())
            }) else {
                continue;
            };
            let handle = csi.volume_handle;
            let unique = unique_name(&va.spec.attacher, &handle);
            let in_use = self.nodes.get(node).is_some_and(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.volumes_in_use.as_ref())
                    .is_some_and(|v| v.contains(&unique))
            });
            if in_use {
                let since = *self
                    .unmount_wait
                    .lock()
                    .entry(name.clone())
                    .or_insert_with(Instant::now);
                if since.elapsed() < MAX_WAIT_FOR_UNMOUNT {
                    continue;
                }
                tracing::warn!(volume = %pv, node = %node, "detaching a volume its node still reports in use: the wait for its unmount is over");
            }
            self.unmount_wait.lock().remove(name);
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => failures.push(e.to_string()),
            }
        }

        // Attach what pods want.
        for (w, pods) in &desired {
            let name = attachment_name(&w.handle, &w.driver, &w.node);
            if w.single_node {
                // Still attached to another node: wait for that detach.
                let elsewhere: Vec<&Arc<VolumeAttachment>> = attachments
                    .values()
                    .filter(|va| {
                        va.spec.source.persistent_volume_name.as_deref() == Some(w.pv.as_str())
                            && va.spec.node_name != w.node
                    })
                    .collect();
                if !elsewhere.is_empty() {
                    let key = (w.pv.clone(), w.node.clone());
                    if self.waiting.lock().insert(key) {
                        let users: Vec<String> = desired
                            .iter()
                            .filter(|(o, _)| o.pv == w.pv && o.node != w.node)
                            .flat_map(|(_, ps)| ps.iter())
                            .filter(|p| p.metadata.namespace == pods[0].metadata.namespace)
                            .filter_map(|p| p.metadata.name.clone())
                            .collect();
                        let detail = if users.is_empty() {
                            "Volume is already exclusively attached to one node, waiting on detach before it can be attached to another node".to_owned()
                        } else {
                            format!("Volume is already used by pod(s) {}", users.join(", "))
                        };
                        let msg = format!("Waiting for detach for volume \"{}\" {detail}", w.pv);
                        self.event(pods, "Warning", "FailedAttachVolume", &msg)
                            .await;
                    }
                    continue;
                }
                self.waiting.lock().remove(&(w.pv.clone(), w.node.clone()));
            }
            match attachments.get(&name) {
                None => {
                    let va: VolumeAttachment = serde_json::from_value(json!({
                        "apiVersion": "storage.k8s.io/v1",
                        "kind": "VolumeAttachment",
                        "metadata": {"name": name},
                        "spec": {
                            "attacher": w.driver,
                            "nodeName": w.node,
                            "source": {"persistentVolumeName": w.pv},
                        },
                    }))
                    .map_err(|e| SyncError::Failed(e.to_string()))?;
                    match api.create(&PostParams::default(), &va).await {
                        Ok(_) => {}
                        Err(e) if is_already_exists(&e) => {}
                        Err(e) => failures.push(e.to_string()),
                    }
                }
                Some(va) => {
                    let st = va.status.clone().unwrap_or_default();
                    let report = if st.attached {
                        Some((
                            "Normal",
                            "SuccessfulAttachVolume",
                            format!("AttachVolume.Attach succeeded for volume \"{}\" ", w.pv),
                            "attached".to_owned(),
                        ))
                    } else {
                        st.attach_error
                            .as_ref()
                            .and_then(|e| e.message.clone())
                            .map(|m| {
                                (
                                    "Warning",
                                    "FailedAttachVolume",
                                    format!(
                                        "AttachVolume.Attach failed for volume \"{}\" : {m}",
                                        w.pv
                                    ),
                                    format!(
                                        "{m}@{:?}",
                                        st.attach_error.as_ref().and_then(|e| e.time.clone())
                                    ),
                                )
                            })
                    };
                    if let Some((type_, reason, msg, mark)) = report {
                        let fresh = self.reported.lock().get(&name) != Some(&mark);
                        if fresh {
                            self.reported.lock().insert(name.clone(), mark);
                            self.event(pods, type_, reason, &msg).await;
                        }
                    }
                }
            }
        }
        self.reported.lock().retain(|n, _| wanted_names.contains(n));

        // The nodes' volumesAttached.
        let mut attached: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for va in attachments.values() {
            if !va.status.as_ref().is_some_and(|s| s.attached)
                || va.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            let pv = va
                .spec
                .source
                .persistent_volume_name
                .clone()
                .unwrap_or_default();
            let Some(handle) = self.volumes.get(&pv).and_then(|v| {
                v.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .map(|c| c.volume_handle.clone())
            }) else {
                continue;
            };
            attached
                .entry(va.spec.node_name.clone())
                .or_default()
                .push(unique_name(&va.spec.attacher, &handle));
        }
        let nodes_api: Api<Node> = Api::all(self.client.get());
        for n in self.nodes.list() {
            let name = n.metadata.name.clone().unwrap_or_default();
            let mut want = attached.remove(&name).unwrap_or_default();
            want.sort();
            let have: Vec<String> = n
                .status
                .as_ref()
                .and_then(|s| s.volumes_attached.as_ref())
                .map(|v| v.iter().map(|a| a.name.clone()).collect())
                .unwrap_or_default();
            if have == want {
                continue;
            }
            let list: Vec<_> = want
                .iter()
                .map(|u| json!({"name": u, "devicePath": ""}))
                .collect();
            let patch = json!({"status": {"volumesAttached": list}});
            if let Err(e) = nodes_api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                if !is_not_found(&e) {
                    failures.push(e.to_string());
                }
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(SyncError::Failed(failures.join("; ")))
        }
    }
}
