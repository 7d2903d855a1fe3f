//! persistentvolume-binder-controller: binds claims to volumes and keeps their phases.
//!
//! A claim with no volume gets the smallest Available volume of its class that fits it
//! (capacity, access modes, volume mode, selector), or one pre-bound to it; with none, a
//! class with a provisioner gets the claim handed to it (the storage-provisioner
//! annotations, `ExternalProvisioning`), unless the class waits for the first consumer and
//! the scheduler has not picked a node (`WaitForFirstConsumer`). Binding writes the
//! volume's claimRef, then its phase, then the claim's volumeName and annotations, then its
//! phase, as upstream does. A volume whose claim is gone is Released; its reclaim policy
//! then applies (Retain keeps it; Delete of a volume a CSI driver provisioned is the
//! external provisioner's to do). Everything is looked at again every 15 s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimStatus,
    PersistentVolumeStatus, Pod,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube::Resource;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_apimachinery::quantity::Quantity;
use kumo_apimachinery::selector::LabelSelector;
use kumo_apimachinery::storage::class_of;
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::is_not_found;
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

use super::replicaset::record_event;

const SERVICE_ACCOUNT: &str = "persistent-volume-binder";
/// The component its events come from.
pub const COMPONENT: &str = "persistentvolume-controller";
pub use kumo_apimachinery::storage::{
    BETA_STORAGE_PROVISIONER, BIND_COMPLETED, BOUND_BY_CONTROLLER, PROVISIONED_BY, SELECTED_NODE,
    STORAGE_PROVISIONER,
};
/// Upstream's `--pvclaimbinder-sync-period`.
const RESYNC: Duration = Duration::from_secs(15);

struct Ctl {
    client: ClientSource,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    volumes: Arc<Informer<PersistentVolume>>,
    classes: Arc<Informer<StorageClass>>,
    pods: Arc<Informer<Pod>>,
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("persistentvolume");
    let claims = factory.informer::<PersistentVolumeClaim>();
    let volumes = factory.informer::<PersistentVolume>();
    let classes = factory.informer::<StorageClass>();
    let pods = factory.informer::<Pod>();
    let q = queue.clone();
    claims.add_handler(move |c| match c {
        Change::Added(v) | Change::Updated { new: v, .. } => q.add(format!("claim:{}", key_of(v))),
        // Its volume is Released now.
        Change::Deleted(v) => {
            if let Some(pv) = v
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_ref())
                .filter(|n| !n.is_empty())
            {
                q.add(format!("volume:{pv}"));
            }
        }
    });
    let q = queue.clone();
    volumes.add_handler(move |c| {
        let v = match c {
            Change::Added(v) | Change::Updated { new: v, .. } | Change::Deleted(v) => v,
        };
        if !matches!(c, Change::Deleted(_)) {
            q.add(format!("volume:{}", key_of(v)));
        }
        if let Some(r) = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
            q.add(format!(
                "claim:{}/{}",
                r.namespace.as_deref().unwrap_or(""),
                r.name.as_deref().unwrap_or("")
            ));
        }
    });
    tokio::spawn(async move {
        tracing::info!("Starting persistent volume controller");
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            claims,
            volumes,
            classes,
            pods,
        });
        let synced = async {
            ctl.claims.wait_synced().await;
            ctl.volumes.wait_synced().await;
            ctl.classes.wait_synced().await;
            ctl.pods.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        {
            // The periodic resync: every claim and volume again.
            let (ctl, q, mut stop) = (ctl.clone(), queue.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(RESYNC) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                    for c in ctl.claims.list() {
                        q.add(format!("claim:{}", key_of(&*c)));
                    }
                    for v in ctl.volumes.list() {
                        q.add(format!("volume:{}", key_of(&*v)));
                    }
                }
            });
        }
        let tasks = run_workers_of(
            "persistentvolume",
            queue,
            1,
            stop,
            &ctl,
            |c, key| async move {
                match key.split_once(':') {
                    Some(("claim", k)) => c.sync_claim(k).await,
                    Some(("volume", k)) => c.sync_volume(k).await,
                    _ => Ok(()),
                }
            },
        );
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down persistent volume controller");
    })
}

fn annotation<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

fn set_annotation(meta: &mut kube::api::ObjectMeta, key: &str, value: &str) {
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_owned(), value.to_owned());
}

/// A claim's class ("" for none).
pub fn claim_class(c: &PersistentVolumeClaim) -> String {
    class_of(
        c.metadata.annotations.as_ref(),
        c.spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref()),
    )
}

/// A volume's class ("" for none).
pub fn volume_class(v: &PersistentVolume) -> String {
    class_of(
        v.metadata.annotations.as_ref(),
        v.spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref()),
    )
}

fn phase_of_volume(v: &PersistentVolume) -> &str {
    v.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn storage(
    q: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Option<Quantity> {
    Quantity::parse(&q?.get("storage")?.0)
}

fn requested(c: &PersistentVolumeClaim) -> Option<Quantity> {
    storage(
        c.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref()),
    )
}

fn capacity(v: &PersistentVolume) -> Option<Quantity> {
    storage(v.spec.as_ref().and_then(|s| s.capacity.as_ref()))
}

fn volume_mode(m: Option<&String>) -> &str {
    m.map_or("Filesystem", String::as_str)
}

/// Whether `v` is pre-bound to `c` (its claimRef names it, with its uid if it has one).
fn pre_bound_to(v: &PersistentVolume, c: &PersistentVolumeClaim) -> bool {
    v.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| {
            r.name == c.metadata.name
                && r.namespace == c.metadata.namespace
                && r.uid
                    .as_ref()
                    .is_none_or(|u| u.is_empty() || Some(u) == c.metadata.uid.as_ref())
        })
}

/// Why `v` cannot hold `c` (checkVolumeSatisfyClaim), `None` when it can.
fn unsatisfied(v: &PersistentVolume, c: &PersistentVolumeClaim) -> Option<&'static str> {
    if v.metadata.deletion_timestamp.is_some() {
        return Some("the volume is marked for deletion");
    }
    match (requested(c), capacity(v)) {
        (Some(want), Some(have)) if have < want => return Some("requested PV is too small"),
        _ => {}
    }
    if volume_class(v) != claim_class(c) {
        return Some("storageClassName does not match");
    }
    let (vs, cs) = (v.spec.as_ref(), c.spec.as_ref());
    if volume_mode(vs.and_then(|s| s.volume_mode.as_ref()))
        != volume_mode(cs.and_then(|s| s.volume_mode.as_ref()))
    {
        return Some("incompatible volumeMode");
    }
    let have: Vec<&String> = vs
        .and_then(|s| s.access_modes.as_ref())
        .into_iter()
        .flatten()
        .collect();
    let want = cs
        .and_then(|s| s.access_modes.as_ref())
        .into_iter()
        .flatten();
    if want.into_iter().any(|m| !have.contains(&m)) {
        return Some("incompatible accessMode");
    }
    None
}

impl Ctl {
    fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
        (!name.is_empty()).then(|| self.classes.get(name)).flatten()
    }

    /// The best volume for an unbound claim (findBestMatchForClaim): one pre-bound to it,
    /// else the smallest Available one that satisfies it and its selector. `delay`: only a
    /// pre-bound one (its class waits for the first consumer's node).
    fn best_match(&self, c: &PersistentVolumeClaim, delay: bool) -> Option<Arc<PersistentVolume>> {
        let selector = c
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .and_then(|s| serde_json::to_value(s).ok())
            .and_then(|s| LabelSelector::from_json(&s).ok());
        let mut best: Option<(Quantity, Arc<PersistentVolume>)> = None;
        for v in self.volumes.list() {
            if unsatisfied(&v, c).is_some() {
                continue;
            }
            if pre_bound_to(&v, c) {
                return Some(v);
            }
            let claimed = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some();
            if delay || claimed || phase_of_volume(&v) != "Available" {
                continue;
            }
            if let Some(sel) = &selector {
                let labels = v.metadata.labels.clone().unwrap_or_default();
                if !sel.matches(&labels) {
                    continue;
                }
            }
            let Some(cap) = capacity(&v) else { continue };
            if best.as_ref().is_none_or(|(b, _)| cap < *b) {
                best = Some((cap, v));
            }
        }
        best.map(|(_, v)| v)
    }

    async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: &str,
        reason: &str,
        msg: String,
    ) {
        record_event(&self.client, COMPONENT, obj, type_, reason, msg).await;
    }

    fn claims_api(&self, ns: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.get(), ns)
    }

    fn volumes_api(&self) -> Api<PersistentVolume> {
        Api::all(self.client.get())
    }

    async fn sync_claim(&self, key: &str) -> Result<(), SyncError> {
        let Some(c) = self.claims.get(key) else {
            return Ok(());
        };
        let bound = annotation(&c.metadata, BIND_COMPLETED).is_some();
        let volume_name = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if !bound {
            if volume_name.is_empty() {
                return self.sync_unbound_claim(&c).await;
            }
            // Pre-bound (or provisioned for it): the volume it names.
            let Some(v) = self.volumes.get(&volume_name) else {
                // Not there (yet): the claim waits.
                return self.set_claim_phase(&c, "Pending", None).await;
            };
            if unsatisfied(&v, &c).is_some() {
                let why = unsatisfied(&v, &c).unwrap_or_default();
                self.event(
                    &*c,
                    "Warning",
                    "VolumeMismatch",
                    format!("Cannot bind to requested volume {volume_name:?}: {why}"),
                )
                .await;
                return self.set_claim_phase(&c, "Pending", None).await;
            }
            let claim_ref = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
            if claim_ref.is_none() || pre_bound_to(&v, &c) {
                return self.bind(&v, &c).await;
            }
            self.event(
                &*c,
                "Warning",
                "FailedBinding",
                format!("volume {volume_name:?} already bound to a different claim."),
            )
            .await;
            return self.set_claim_phase(&c, "Pending", None).await;
        }
        // Bound: check it still is.
        if volume_name.is_empty() {
            return self
                .lose(&c, "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!")
                .await;
        }
        let Some(v) = self.volumes.get(&volume_name) else {
            return self
                .lose(
                    &c,
                    "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
                )
                .await;
        };
        let claim_ref = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        match claim_ref {
            None => self.bind(&v, &c).await,
            Some(r) if r.uid == c.metadata.uid => {
                // Both point at each other: the claim's status follows.
                if c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
                    self.set_claim_phase(&c, "Bound", Some(&v)).await?;
                }
                Ok(())
            }
            Some(_) => {
                if c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Lost") {
                    self.event(
                        &*c,
                        "Warning",
                        "ClaimMisbound",
                        "Two claims are bound to the same volume, this one is bound incorrectly"
                            .into(),
                    )
                    .await;
                }
                self.set_claim_phase(&c, "Lost", None).await
            }
        }
    }

    async fn lose(&self, c: &PersistentVolumeClaim, msg: &str) -> Result<(), SyncError> {
        if c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Lost") {
            self.event(c, "Warning", "ClaimLost", msg.to_owned()).await;
        }
        self.set_claim_phase(c, "Lost", None).await
    }

    async fn sync_unbound_claim(&self, c: &PersistentVolumeClaim) -> Result<(), SyncError> {
        let class_name = claim_class(c);
        let class = self.class(&class_name);
        let delay = class
            .as_ref()
            .and_then(|k| k.volume_binding_mode.as_deref())
            == Some("WaitForFirstConsumer");
        let selected = annotation(&c.metadata, SELECTED_NODE).is_some_and(|n| !n.is_empty());
        if let Some(v) = self.best_match(c, delay && !selected) {
            return self.bind(&v, c).await;
        }
        if delay && !selected {
            // Unscheduled pods that use it, if any, are named.
            let ns = c.metadata.namespace.as_deref().unwrap_or("");
            let name = c.metadata.name.as_deref().unwrap_or("");
            let mut waiting: Vec<String> = self
                .pods
                .list()
                .into_iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
                .filter(|p| {
                    p.spec
                        .as_ref()
                        .is_some_and(|s| s.node_name.as_deref().unwrap_or("").is_empty())
                })
                .filter(|p| {
                    p.spec
                        .as_ref()
                        .and_then(|s| s.volumes.as_ref())
                        .into_iter()
                        .flatten()
                        .any(|v| {
                            v.persistent_volume_claim
                                .as_ref()
                                .is_some_and(|pvc| pvc.claim_name == name)
                                || (v.ephemeral.is_some()
                                    && format!(
                                        "{}-{}",
                                        p.metadata.name.as_deref().unwrap_or(""),
                                        v.name
                                    ) == name)
                        })
                })
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            waiting.sort();
            let msg = match waiting.len() {
                0 => (
                    "WaitForFirstConsumer",
                    "waiting for first consumer to be created before binding".to_owned(),
                ),
                1 => (
                    "WaitForPodScheduled",
                    format!("waiting for pod {} to be scheduled", waiting[0]),
                ),
                _ => (
                    "WaitForPodScheduled",
                    format!("waiting for pods {} to be scheduled", waiting.join(",")),
                ),
            };
            self.event(c, "Normal", msg.0, msg.1).await;
            return self.set_claim_phase(c, "Pending", None).await;
        }
        match class {
            Some(k) if !k.provisioner.is_empty() => {
                // Handed to the external provisioner the class names.
                let wants = |key| annotation(&c.metadata, key) != Some(k.provisioner.as_str());
                if wants(STORAGE_PROVISIONER) || wants(BETA_STORAGE_PROVISIONER) {
                    let mut n = c.clone();
                    set_annotation(&mut n.metadata, STORAGE_PROVISIONER, &k.provisioner);
                    set_annotation(&mut n.metadata, BETA_STORAGE_PROVISIONER, &k.provisioner);
                    let ns = c.metadata.namespace.as_deref().unwrap_or("");
                    let name = c.metadata.name.as_deref().unwrap_or("");
                    match self
                        .claims_api(ns)
                        .replace(name, &PostParams::default(), &n)
                        .await
                    {
                        Ok(_) => {}
                        Err(e) if is_not_found(&e) => return Ok(()),
                        Err(e) => return Err(e.into()),
                    }
                }
                self.event(
                    c,
                    "Normal",
                    "ExternalProvisioning",
                    format!("Waiting for a volume to be created either by the external provisioner '{}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.", k.provisioner),
                )
                .await;
                self.set_claim_phase(c, "Pending", None).await
            }
            _ if class_name.is_empty() => {
                self.event(
                    c,
                    "Normal",
                    "FailedBinding",
                    "no persistent volumes available for this claim and no storage class is set"
                        .into(),
                )
                .await;
                self.set_claim_phase(c, "Pending", None).await
            }
            _ => {
                self.event(
                    c,
                    "Warning",
                    "ProvisioningFailed",
                    format!("storageclass.storage.k8s.io {class_name:?} not found"),
                )
                .await;
                self.set_claim_phase(c, "Pending", None).await
            }
        }
    }

    /// Binds `v` and `c` to each other, step by step (each step written before the next).
    async fn bind(&self, v: &PersistentVolume, c: &PersistentVolumeClaim) -> Result<(), SyncError> {
        let ns = c.metadata.namespace.clone().unwrap_or_default();
        let name = c.metadata.name.clone().unwrap_or_default();
        let pv_name = v.metadata.name.clone().unwrap_or_default();
        let want_ref = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            uid: c.metadata.uid.clone(),
            resource_version: c.metadata.resource_version.clone(),
            field_path: None,
        };
        let current = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        let mut v = v.clone();
        if current.is_none_or(|r| r.uid != c.metadata.uid) {
            if current.is_none() {
                set_annotation(&mut v.metadata, BOUND_BY_CONTROLLER, "yes");
            }
            v.spec.get_or_insert_with(Default::default).claim_ref = Some(want_ref);
            v = match self
                .volumes_api()
                .replace(&pv_name, &PostParams::default(), &v)
                .await
            {
                Ok(v) => v,
                Err(e) if is_not_found(&e) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
        }
        if phase_of_volume(&v) != "Bound" {
            let mut s = v.clone();
            s.status = Some(PersistentVolumeStatus {
                phase: Some("Bound".into()),
                last_phase_transition_time: Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::now(),
                    ),
                ),
                ..s.status.unwrap_or_default()
            });
            v = self
                .volumes_api()
                .replace_status(&pv_name, &PostParams::default(), &s)
                .await?;
        }
        let mut n = c.clone();
        let spec = n.spec.get_or_insert_with(Default::default);
        let mut changed = false;
        if spec.volume_name.as_deref().unwrap_or("").is_empty() {
            spec.volume_name = Some(pv_name.clone());
            set_annotation(&mut n.metadata, BOUND_BY_CONTROLLER, "yes");
            changed = true;
        }
        if annotation(&n.metadata, BIND_COMPLETED).is_none() {
            set_annotation(&mut n.metadata, BIND_COMPLETED, "yes");
            changed = true;
        }
        let n = if changed {
            match self
                .claims_api(&ns)
                .replace(&name, &PostParams::default(), &n)
                .await
            {
                Ok(n) => n,
                Err(e) if is_not_found(&e) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        } else {
            n
        };
        self.set_claim_phase(&n, "Bound", Some(&v)).await
    }

    /// Writes the claim's phase (with the volume's modes and capacity when Bound).
    async fn set_claim_phase(
        &self,
        c: &PersistentVolumeClaim,
        phase: &str,
        v: Option<&PersistentVolume>,
    ) -> Result<(), SyncError> {
        let old = c.status.clone().unwrap_or_default();
        let mut st = PersistentVolumeClaimStatus {
            phase: Some(phase.to_owned()),
            ..old.clone()
        };
        if let (Some(v), "Bound") = (v, phase) {
            if old.phase.as_deref() != Some("Bound") {
                let vs = v.spec.clone().unwrap_or_default();
                st.access_modes = vs.access_modes;
                st.capacity = vs.capacity;
            }
        }
        if phase != "Bound" && old.phase.as_deref() != Some("Bound") {
            st.access_modes = None;
            st.capacity = None;
        }
        if st == old {
            return Ok(());
        }
        let mut n = c.clone();
        n.status = Some(st);
        let ns = c.metadata.namespace.clone().unwrap_or_default();
        let name = c.metadata.name.clone().unwrap_or_default();
        match self
            .claims_api(&ns)
            .replace_status(&name, &PostParams::default(), &n)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn set_volume_phase(&self, v: &PersistentVolume, phase: &str) -> Result<(), SyncError> {
        if phase_of_volume(v) == phase {
            return Ok(());
        }
        let mut n = v.clone();
        n.status = Some(PersistentVolumeStatus {
            phase: Some(phase.to_owned()),
            last_phase_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            )),
            ..Default::default()
        });
        let name = v.metadata.name.clone().unwrap_or_default();
        match self
            .volumes_api()
            .replace_status(&name, &PostParams::default(), &n)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn sync_volume(&self, key: &str) -> Result<(), SyncError> {
        let Some(v) = self.volumes.get(key) else {
            return Ok(());
        };
        let Some(r) = v.spec.as_ref().and_then(|s| s.claim_ref.clone()) else {
            return self.set_volume_phase(&v, "Available").await;
        };
        if r.uid.as_deref().unwrap_or("").is_empty() {
            // Pre-bound by its maker: Available until its claim binds.
            return self.set_volume_phase(&v, "Available").await;
        }
        let claim_key = format!(
            "{}/{}",
            r.namespace.as_deref().unwrap_or(""),
            r.name.as_deref().unwrap_or("")
        );
        let claim = self
            .claims
            .get(&claim_key)
            .filter(|c| c.metadata.uid == r.uid);
        let Some(c) = claim else {
            // Its claim is gone: Released, then its reclaim policy.
            if !matches!(phase_of_volume(&v), "Released" | "Failed") {
                self.set_volume_phase(&v, "Released").await?;
            }
            return self.reclaim(&v).await;
        };
        let claim_volume = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if claim_volume.is_empty() {
            // The claim binds it on its own sync.
            return Ok(());
        }
        if claim_volume == key {
            return self.set_volume_phase(&v, "Bound").await;
        }
        // The claim is bound to another volume.
        let provisioned = annotation(&v.metadata, PROVISIONED_BY).is_some();
        let policy = v
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            .unwrap_or("Retain");
        if provisioned && policy == "Delete" {
            self.set_volume_phase(&v, "Released").await?;
            return self.reclaim(&v).await;
        }
        let mut n = (*v).clone();
        if annotation(&n.metadata, BOUND_BY_CONTROLLER).is_some() {
            if let Some(s) = n.spec.as_mut() {
                s.claim_ref = None;
            }
            if let Some(a) = n.metadata.annotations.as_mut() {
                a.remove(BOUND_BY_CONTROLLER);
            }
        } else if let Some(r) = n.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
            r.uid = None;
        }
        match self
            .volumes_api()
            .replace(key, &PostParams::default(), &n)
            .await
        {
            Ok(n) => self.set_volume_phase(&n, "Available").await,
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// A Released volume's reclaim policy.
    async fn reclaim(&self, v: &PersistentVolume) -> Result<(), SyncError> {
        let policy = v
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            .unwrap_or("Retain");
        match policy {
            "Retain" => Ok(()),
            "Delete" => {
                let external = annotation(&v.metadata, PROVISIONED_BY)
                    .is_some_and(|p| !p.starts_with("kubernetes.io/"))
                    || v.spec.as_ref().is_some_and(|s| s.csi.is_some());
                if !external {
                    // No in-tree deleter here: a volume made by hand stays, failed.
                    self.event(v, "Warning", "VolumeFailedDelete", "error getting deleter volume plugin for volume: no deletable volume plugin matched".into()).await;
                    return self.set_volume_phase(v, "Failed").await;
                }
                // The external provisioner deletes it.
                Ok(())
            }
            "Recycle" => {
                self.event(
                    v,
                    "Warning",
                    "VolumeFailedRecycle",
                    "No recycler plugin found for the volume!".into(),
                )
                .await;
                self.set_volume_phase(v, "Failed").await
            }
            _ => {
                self.event(
                    v,
                    "Warning",
                    "VolumeUnknownReclaimPolicy",
                    "Volume has unrecognized PersistentVolumeReclaimPolicy".into(),
                )
                .await;
                self.set_volume_phase(v, "Failed").await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    fn claim(size: &str, class: &str, modes: &[&str]) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: kube::api::ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(modes.iter().map(|m| (*m).to_owned()).collect()),
                storage_class_name: Some(class.into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".to_owned(), Q(size.into()))])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn volume(size: &str, class: &str, modes: &[&str]) -> PersistentVolume {
        PersistentVolume {
            metadata: kube::api::ObjectMeta {
                name: Some("v".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(modes.iter().map(|m| (*m).to_owned()).collect()),
                storage_class_name: Some(class.into()),
                capacity: Some(BTreeMap::from([("storage".to_owned(), Q(size.into()))])),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn a_volume_satisfies_a_claim_as_upstream_checks_it() {
        let c = claim("1Gi", "fast", &["ReadWriteOnce"]);
        assert_eq!(
            unsatisfied(&volume("1Gi", "fast", &["ReadWriteOnce"]), &c),
            None
        );
        assert_eq!(
            unsatisfied(
                &volume("2Gi", "fast", &["ReadWriteOnce", "ReadOnlyMany"]),
                &c
            ),
            None
        );
        assert_eq!(
            unsatisfied(&volume("512Mi", "fast", &["ReadWriteOnce"]), &c),
            Some("requested PV is too small")
        );
        assert_eq!(
            unsatisfied(&volume("1Gi", "slow", &["ReadWriteOnce"]), &c),
            Some("storageClassName does not match")
        );
        assert_eq!(
            unsatisfied(&volume("1Gi", "fast", &["ReadOnlyMany"]), &c),
            Some("incompatible accessMode")
        );
        let mut block = volume("1Gi", "fast", &["ReadWriteOnce"]);
        if let Some(s) = block.spec.as_mut() {
            s.volume_mode = Some("Block".into());
        }
        assert_eq!(unsatisfied(&block, &c), Some("incompatible volumeMode"));
    }

    #[test]
    fn pre_binding_names_the_claim_and_its_uid_if_given() {
        let c = claim("1Gi", "", &["ReadWriteOnce"]);
        let mut v = volume("1Gi", "", &["ReadWriteOnce"]);
        assert!(!pre_bound_to(&v, &c));
        if let Some(s) = v.spec.as_mut() {
            s.claim_ref = Some(ObjectReference {
                name: Some("c".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            });
        }
        assert!(pre_bound_to(&v, &c));
        if let Some(r) = v.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
            r.uid = Some("other".into());
        }
        assert!(!pre_bound_to(&v, &c));
    }
}
