//! Static pods: manifests in the pod manifest path (staticPodPath), read at start,
//! rescanned every 20 s and on the directory's file events (inotify), defaulted as upstream's kubelet does (name `<name>-<node>`,
//! namespace `default`, the config hash/source/seen annotations, a NoExecute toleration),
//! each with a mirror pod in the API so `kubectl get pods` shows it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use inotify::{EventMask, Inotify, WatchMask};
use tokio::sync::Notify;

use serde_json::{json, Value};

use crate::KubeletConfig;

/// The annotations upstream uses for static and mirror pods.
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// How often the directory is read again.
pub const RESCAN: Duration = Duration::from_secs(20);
/// How long the directory must be quiet after a file event before it is read.
const SETTLE: Duration = Duration::from_millis(100);

/// The static pods of the manifest directory.
pub struct Source {
    cfg: Arc<KubeletConfig>,
    /// By file name: the defaulted pod.
    pods: BTreeMap<String, Value>,
    /// When each pod (by hash) was first seen.
    seen: BTreeMap<String, String>,
    last_scan: Option<Instant>,
    /// Set by the file watcher: the directory changed since the last scan.
    dirty: Arc<AtomicBool>,
    /// By file path: the error last reported, so a bad file is reported once, not every scan.
    reported: BTreeMap<String, String>,
}

/// A manifest that could not be turned into a static pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub path: String,
    pub error: String,
}

impl Source {
    pub fn new(cfg: Arc<KubeletConfig>) -> Source {
        Source {
            cfg,
            pods: BTreeMap::new(),
            seen: BTreeMap::new(),
            last_scan: None,
            dirty: Arc::default(),
            reported: BTreeMap::new(),
        }
    }

    /// Watches the manifest directory for file events, which make the next
    /// [`rescan`](Self::rescan) read it and wake `wake`, so that a new, changed or removed
    /// manifest takes effect at once rather than at the next 20 s rescan.
    pub fn watch_files(&self, wake: Arc<Notify>) {
        let Some(dir) = self.cfg.pod_manifest_path.clone() else {
            return;
        };
        let (dirty, retry) = (self.dirty.clone(), self.cfg.static_pod_rescan);
        tokio::spawn(async move {
            loop {
                if let Err(e) = watch_dir(&dir, &dirty, &wake).await {
                    tracing::debug!(dir = %dir.display(), error = %e, "watching the static pod path");
                }
                // The directory is missing, was removed or moved: the periodic rescan covers
                // it meanwhile; the watch is set up again later.
                tokio::time::sleep(retry).await;
            }
        });
    }

    /// Reads the directory again when it is due, when a file event came, or on `force`.
    /// Returns the manifests rejected for a new reason since they were last reported.
    pub fn rescan(&mut self, force: bool) -> Vec<Rejected> {
        let Some(dir) = self.cfg.pod_manifest_path.clone() else {
            return Vec::new();
        };
        let changed = self.dirty.swap(false, Ordering::AcqRel);
        if !force
            && !changed
            && self
                .last_scan
                .is_some_and(|t| t.elapsed() < self.cfg.static_pod_rescan)
        {
            return Vec::new();
        }
        self.last_scan = Some(Instant::now());
        let mut pods = BTreeMap::new();
        let mut rejected = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "reading the static pod path");
                self.pods.clear();
                return Vec::new();
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            // Hidden files are skipped, as upstream does.
            if name.starts_with('.') || !path.is_file() {
                continue;
            }
            match self.load(&path) {
                Ok(pod) => {
                    pods.insert(name, pod);
                }
                Err(why) => rejected.push(Rejected {
                    path: path.display().to_string(),
                    error: why,
                }),
            }
        }
        self.pods = pods;
        let mut fresh = Vec::new();
        let mut reported = BTreeMap::new();
        for r in rejected {
            if self.reported.get(&r.path) != Some(&r.error) {
                tracing::warn!(file = %r.path, error = %r.error, "could not process manifest file");
                fresh.push(r.clone());
            }
            reported.insert(r.path, r.error);
        }
        // A file fixed or removed is reported again if it breaks again.
        self.reported = reported;
        fresh
    }

    fn load(&mut self, path: &Path) -> Result<Value, String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        let yaml: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| e.to_string())?;
        let pod: Value = serde_json::to_value(yaml).map_err(|e| e.to_string())?;
        if pod.get("kind").and_then(Value::as_str) != Some("Pod") {
            return Err("the manifest is not a Pod".into());
        }
        self.default(pod, &path.display().to_string())
    }

    /// Upstream's applyDefaults for file sources, and its refusal of pods that reference
    /// API objects.
    fn default(&mut self, mut pod: Value, source: &str) -> Result<Value, String> {
        let node = self.cfg.node_name.to_lowercase();
        let spec = pod.get("spec").cloned().unwrap_or(json!({}));
        if spec
            .get("serviceAccountName")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err("a static pod may not use a service account".into());
        }
        let volumes = spec
            .get("volumes")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for v in &volumes {
            for k in [
                "secret",
                "configMap",
                "persistentVolumeClaim",
                "projected",
                "csi",
                "ephemeral",
            ] {
                if v.get(k).is_some() {
                    return Err(format!("a static pod may not use a {k} volume"));
                }
            }
        }
        let containers = ["containers", "initContainers", "ephemeralContainers"]
            .iter()
            .flat_map(|k| {
                spec.get(*k)
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>();
        for c in &containers {
            let refs_env = c
                .get("envFrom")
                .and_then(Value::as_array)
                .is_some_and(|e| !e.is_empty())
                || c.get("env").and_then(Value::as_array).is_some_and(|e| {
                    e.iter().any(|v| {
                        v.pointer("/valueFrom/secretKeyRef").is_some()
                            || v.pointer("/valueFrom/configMapKeyRef").is_some()
                    })
                });
            if refs_env {
                return Err("a static pod may not reference API objects in env".into());
            }
        }
        // The uid is a hash of the pod's source and content, so an edited file is a new
        // pod (it restarts) and an unchanged one keeps its identity across rescans.
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(format!("host:{node}").as_bytes());
        ctx.update(format!("file:{source}").as_bytes());
        ctx.update(pod.to_string().as_bytes());
        let digest = ctx.finish();
        let hash: String = digest.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let name = pod
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if name.is_empty() {
            return Err("the pod has no name".into());
        }
        let meta = pod
            .as_object_mut()
            .map(|o| o.entry("metadata").or_insert_with(|| json!({})))
            .ok_or("the pod is not an object")?;
        meta["name"] = json!(format!("{name}-{node}"));
        if meta
            .get("namespace")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            meta["namespace"] = json!("default");
        }
        meta["uid"] = json!(hash);
        let seen = self
            .seen
            .entry(hash.clone())
            .or_insert_with(|| k8s_openapi::jiff::Timestamp::now().to_string())
            .clone();
        if !meta.get("annotations").is_some_and(Value::is_object) {
            meta["annotations"] = json!({});
        }
        meta["annotations"][CONFIG_HASH] = json!(hash);
        meta["annotations"][CONFIG_SOURCE] = json!("file");
        meta["annotations"][CONFIG_SEEN] = json!(seen);
        let spec = pod
            .as_object_mut()
            .map(|o| o.entry("spec").or_insert_with(|| json!({})))
            .ok_or("the pod is not an object")?;
        spec["nodeName"] = json!(self.cfg.node_name);
        if !spec.get("tolerations").is_some_and(Value::is_array) {
            spec["tolerations"] = json!([]);
        }
        if let Some(t) = spec.get_mut("tolerations").and_then(Value::as_array_mut) {
            t.push(json!({"operator": "Exists", "effect": "NoExecute"}));
        }
        Ok(pod)
    }

    /// The static pods, defaulted.
    pub fn pods(&self) -> Vec<Value> {
        self.pods.values().cloned().collect()
    }
}

/// Marks `dirty` and wakes `wake` on each event in `dir` until the watch ends (the directory
/// was removed or moved away) or fails.
async fn watch_dir(dir: &Path, dirty: &AtomicBool, wake: &Notify) -> std::io::Result<()> {
    let inotify = Inotify::init()?;
    inotify.watches().add(
        dir,
        WatchMask::CREATE
            | WatchMask::CLOSE_WRITE
            | WatchMask::MODIFY
            | WatchMask::ATTRIB
            | WatchMask::DELETE
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF,
    )?;
    // A scan after the watch is set up sees what changed before it.
    dirty.store(true, Ordering::Release);
    wake.notify_one();
    let mut events = inotify.into_event_stream([0u8; 4096])?;
    let gone = EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED;
    let mut pending = false;
    loop {
        // Events are gathered until the directory is quiet for a moment, so that a file
        // being written is read whole, not when it was just created empty.
        let next = if pending {
            match tokio::time::timeout(SETTLE, events.next()).await {
                Ok(ev) => ev,
                Err(_) => {
                    pending = false;
                    dirty.store(true, Ordering::Release);
                    wake.notify_one();
                    continue;
                }
            }
        } else {
            events.next().await
        };
        let Some(ev) = next else { break };
        let ev = ev?;
        if ev.mask.intersects(gone) {
            break;
        }
        // Editors' swap and temporary files are hidden; upstream skips them too.
        let hidden = ev
            .name
            .as_ref()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        pending |= !hidden;
    }
    dirty.store(true, Ordering::Release);
    wake.notify_one();
    Ok(())
}

/// The mirror pod of a static pod: the same pod in the API, marked with the config.mirror
/// annotation and owned by the Node (as the Node authorizer and NodeRestriction require).
pub fn mirror_of(pod: &Value, node_name: &str, node_uid: &str) -> Value {
    let mut m = pod.clone();
    let hash = pod
        .pointer(&format!(
            "/metadata/annotations/{}",
            CONFIG_HASH.replace('/', "~1")
        ))
        .cloned()
        .unwrap_or(Value::Null);
    if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("uid");
        meta.remove("resourceVersion");
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.insert(CONFIG_MIRROR.into(), hash);
        }
        meta.insert(
            "ownerReferences".into(),
            json!([{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": true}]),
        );
    }
    if let Some(o) = m.as_object_mut() {
        o.remove("status");
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_pods_are_defaulted_and_refused_as_upstream() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("web.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static-web\nspec:\n  containers:\n  - name: web\n    image: nginx\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("bad.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bad\nspec:\n  serviceAccountName: x\n  containers:\n  - name: c\n    image: nginx\n",
        )
        .expect("write");
        std::fs::write(dir.path().join(".hidden.yaml"), "garbage: [").expect("write");
        let mut cfg = KubeletConfig::new("/dev/null", "W1");
        cfg.pod_manifest_path = Some(dir.path().to_owned());
        let mut s = Source::new(Arc::new(cfg));
        let rejected = s.rescan(true);
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert!(rejected[0].path.ends_with("bad.yaml"));
        assert_eq!(
            rejected[0].error,
            "a static pod may not use a service account"
        );
        // Reported once, not on every scan; again when its error changes.
        assert_eq!(s.rescan(true), vec![]);
        std::fs::write(dir.path().join("bad.yaml"), "kind: Pod\nspec: [").expect("write");
        let again = s.rescan(true);
        assert_eq!(again.len(), 1);
        assert!(again[0].error.contains("while parsing"), "{again:?}");
        let pods = s.pods();
        assert_eq!(pods.len(), 1);
        let p = &pods[0];
        assert_eq!(p["metadata"]["name"], "static-web-w1");
        assert_eq!(p["metadata"]["namespace"], "default");
        assert_eq!(p["metadata"]["annotations"][CONFIG_SOURCE], "file");
        assert_eq!(
            p["metadata"]["annotations"][CONFIG_HASH],
            p["metadata"]["uid"]
        );
        assert_eq!(p["spec"]["nodeName"], "W1");
        assert_eq!(p["spec"]["tolerations"][0]["effect"], "NoExecute");
        let m = mirror_of(p, "W1", "u-1");
        assert_eq!(
            m["metadata"]["annotations"][CONFIG_MIRROR],
            p["metadata"]["uid"]
        );
        assert_eq!(m["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert!(m["metadata"].get("uid").is_none());
    }

    #[tokio::test]
    async fn a_file_event_makes_the_next_rescan_read_the_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = KubeletConfig::new("/dev/null", "w1");
        cfg.pod_manifest_path = Some(dir.path().to_owned());
        cfg.static_pod_rescan = Duration::from_secs(3600);
        let mut s = Source::new(Arc::new(cfg));
        s.rescan(true);
        assert!(s.pods().is_empty());
        let wake = Arc::new(Notify::new());
        s.watch_files(wake.clone());
        // The watch being set up wakes once; a rescan then finds the directory unchanged.
        tokio::time::timeout(Duration::from_secs(10), wake.notified())
            .await
            .expect("the watch is set up");
        s.rescan(false);
        // Not due for an hour: only file events make the rescan read the directory again.
        std::fs::write(
            dir.path().join("web.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: web\n    image: nginx\n",
        )
        .expect("write");
        tokio::time::timeout(Duration::from_secs(10), wake.notified())
            .await
            .expect("a file event");
        assert_eq!(s.rescan(false), vec![], "the file is read whole");
        assert_eq!(s.pods().len(), 1);
        assert_eq!(s.pods()[0]["metadata"]["name"], "web-w1");
        std::fs::remove_file(dir.path().join("web.yaml")).expect("remove");
        tokio::time::timeout(Duration::from_secs(10), wake.notified())
            .await
            .expect("a file event");
        s.rescan(false);
        assert!(s.pods().is_empty());
    }
}
