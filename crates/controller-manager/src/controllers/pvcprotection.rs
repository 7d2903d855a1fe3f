//! persistentvolumeclaim-protection-controller: a PVC being deleted keeps its
//! `kubernetes.io/pvc-protection` finalizer while a scheduled pod uses it, and loses it
//! once none does, so the claim goes. A PVC not being deleted that lacks the finalizer
//! gets it (claims made before the admission plugin added it).
//!
//! "Uses" is upstream's podUsesPVCForDeletion: a pod bound to a node names the claim in a
//! `persistentVolumeClaim` volume, or its `ephemeral` volume made the claim and the pod
//! is not shut down (deleted with grace 0). The informer's pods are asked first; only
//! when none uses the claim is a live list of the namespace's pods read, so a pod the
//! cache has not seen yet still protects it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, PostParams};

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::is_not_found;
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const SERVICE_ACCOUNT: &str = "pvc-protection-controller";
/// The finalizer the PersistentVolumeClaimProtection admission plugin adds.
pub const FINALIZER: &str = "kubernetes.io/pvc-protection";

/// Whether the object is being deleted and still holds `finalizer` (IsDeletionCandidate).
pub(crate) fn deletion_candidate(meta: &kube::api::ObjectMeta, finalizer: &str) -> bool {
    meta.deletion_timestamp.is_some() && has_finalizer(meta, finalizer)
}

/// Whether the object is not being deleted and lacks `finalizer` (NeedToAddFinalizer).
pub(crate) fn needs_finalizer(meta: &kube::api::ObjectMeta, finalizer: &str) -> bool {
    meta.deletion_timestamp.is_none() && !has_finalizer(meta, finalizer)
}

fn has_finalizer(meta: &kube::api::ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// A pod deleted with grace 0: done with its volumes, only waiting for removal.
fn shut_down(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && pod.metadata.deletion_grace_period_seconds == Some(0)
}

/// Whether the pod keeps the claim from being deleted (podUsesPVCForDeletion).
fn pod_uses(pod: &Pod, claim: &PersistentVolumeClaim) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    if spec.node_name.as_deref().unwrap_or_default().is_empty()
        || pod.metadata.namespace != claim.metadata.namespace
    {
        return false;
    }
    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    spec.volumes.iter().flatten().any(|v| {
        if let Some(p) = &v.persistent_volume_claim {
            return p.claim_name == claim_name;
        }
        // An ephemeral volume's claim is `<pod>-<volume>`, owned by the pod.
        v.ephemeral.is_some()
            && !shut_down(pod)
            && format!("{pod_name}-{}", v.name) == claim_name
            && claim
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == pod.metadata.uid.as_ref())
    })
}

/// The claims a pod names, as queue keys.
fn claim_keys(pod: &Pod) -> Vec<String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes
        .into_iter()
        .flatten()
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(p), _) => Some(format!("{ns}/{}", p.claim_name)),
            (None, Some(_)) => Some(format!("{ns}/{pod_name}-{}", v.name)),
            _ => None,
        })
        .collect()
}

struct Ctl {
    client: ClientSource,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    pods: Arc<Informer<Pod>>,
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("pvcprotection");
    let claims = factory.informer::<PersistentVolumeClaim>();
    let pods = factory.informer::<Pod>();
    let q = queue.clone();
    claims.add_handler(move |c| {
        if let Change::Added(c) | Change::Updated { new: c, .. } = c {
            if deletion_candidate(&c.metadata, FINALIZER) || needs_finalizer(&c.metadata, FINALIZER)
            {
                q.add(key_of(c));
            }
        }
    });
    // A pod that goes, finishes or shuts down may release its claims.
    let q = queue.clone();
    pods.add_handler(move |c| {
        let pod = match c {
            Change::Deleted(p) => p,
            Change::Updated { new, .. } => new,
            Change::Added(_) => return,
        };
        claim_keys(pod).into_iter().for_each(|k| q.add(k));
    });
    tokio::spawn(async move {
        tracing::info!("Starting PVC protection controller");
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            claims,
            pods,
        });
        let synced = async {
            ctl.claims.wait_synced().await;
            ctl.pods.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let tasks = run_workers_of("pvcprotection", queue, 1, stop, &ctl, |c, key| async move {
            c.process(&key).await
        });
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down PVC protection controller");
    })
}

impl Ctl {
    async fn process(&self, key: &str) -> Result<(), SyncError> {
        let Some(claim) = self.claims.get(key) else {
            return Ok(());
        };
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.get(), ns);
        if deletion_candidate(&claim.metadata, FINALIZER) {
            if self.in_use(&claim).await? {
                tracing::debug!(pvc = key, "Keeping PVC because it is being used");
                return Ok(());
            }
            let mut c = (*claim).clone();
            if let Some(f) = c.metadata.finalizers.as_mut() {
                f.retain(|x| x != FINALIZER);
            }
            return match api.replace(name, &PostParams::default(), &c).await {
                Ok(_) => {
                    tracing::debug!(pvc = key, "Removed protection finalizer from PVC");
                    Ok(())
                }
                Err(e) if is_not_found(&e) => Ok(()),
                Err(e) => Err(e.into()),
            };
        }
        if needs_finalizer(&claim.metadata, FINALIZER) {
            let mut c = (*claim).clone();
            c.metadata
                .finalizers
                .get_or_insert_with(Vec::new)
                .push(FINALIZER.to_owned());
            match api.replace(name, &PostParams::default(), &c).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Whether a pod uses the claim: the cache first, then a live list.
    async fn in_use(&self, claim: &PersistentVolumeClaim) -> Result<bool, SyncError> {
        if self.pods.list().iter().any(|p| pod_uses(p, claim)) {
            return Ok(true);
        }
        let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.get(), ns);
        let live = pods.list(&ListParams::default()).await?;
        Ok(live.items.iter().any(|p| pod_uses(p, claim)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        EphemeralVolumeSource, PersistentVolumeClaimVolumeSource, PodSpec, Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use kube::api::ObjectMeta;

    fn claim(name: &str, owner_uid: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                owner_references: owner_uid.map(|u| {
                    vec![OwnerReference {
                        uid: u.into(),
                        controller: Some(true),
                        kind: "Pod".into(),
                        name: "p".into(),
                        api_version: "v1".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn pod(node: Option<&str>, volumes: Vec<Volume>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(Into::into),
                volumes: Some(volumes),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pvc_volume(claim: &str) -> Volume {
        Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ephemeral_volume(name: &str) -> Volume {
        Volume {
            name: name.into(),
            ephemeral: Some(EphemeralVolumeSource::default()),
            ..Default::default()
        }
    }

    #[test]
    fn scheduled_pods_naming_the_claim_use_it() {
        let c = claim("data", None);
        assert!(pod_uses(&pod(Some("n1"), vec![pvc_volume("data")]), &c));
        assert!(!pod_uses(&pod(None, vec![pvc_volume("data")]), &c));
        assert!(!pod_uses(&pod(Some("n1"), vec![pvc_volume("other")]), &c));
    }

    #[test]
    fn ephemeral_claims_are_used_by_their_own_pod_until_it_shuts_down() {
        let mine = claim("p-scratch", Some("u1"));
        let theirs = claim("p-scratch", Some("u2"));
        let mut p = pod(Some("n1"), vec![ephemeral_volume("scratch")]);
        assert!(pod_uses(&p, &mine));
        assert!(!pod_uses(&p, &theirs));
        assert_eq!(claim_keys(&p), ["ns/p-scratch"]);
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        p.metadata.deletion_grace_period_seconds = Some(0);
        assert!(!pod_uses(&p, &mine));
    }

    #[test]
    fn finalizer_states() {
        let mut m = ObjectMeta::default();
        assert!(needs_finalizer(&m, FINALIZER));
        m.finalizers = Some(vec![FINALIZER.into()]);
        assert!(!needs_finalizer(&m, FINALIZER));
        assert!(!deletion_candidate(&m, FINALIZER));
        m.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(deletion_candidate(&m, FINALIZER));
    }
}
