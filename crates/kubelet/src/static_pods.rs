//! Static pods: manifests in the pod manifest path (staticPodPath), read at start and
//! rescanned every 20 s, defaulted as upstream's kubelet does (name `<name>-<node>`,
//! namespace `default`, the config hash/source/seen annotations, a NoExecute toleration),
//! each with a mirror pod in the API so `kubectl get pods` shows it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::KubeletConfig;

/// The annotations upstream uses for static and mirror pods.
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// How often the directory is read again.
pub const RESCAN: Duration = Duration::from_secs(20);

/// The static pods of the manifest directory.
pub struct Source {
    cfg: Arc<KubeletConfig>,
    /// By file name: the defaulted pod.
    pods: BTreeMap<String, Value>,
    /// When each pod (by hash) was first seen.
    seen: BTreeMap<String, String>,
    last_scan: Option<Instant>,
}

impl Source {
    pub fn new(cfg: Arc<KubeletConfig>) -> Source {
        Source {
            cfg,
            pods: BTreeMap::new(),
            seen: BTreeMap::new(),
            last_scan: None,
        }
    }

    /// Reads the directory again when it is due (or `force`).
    pub fn rescan(&mut self, force: bool) {
        let Some(dir) = self.cfg.pod_manifest_path.clone() else {
            return;
        };
        if !force
            && self
                .last_scan
                .is_some_and(|t| t.elapsed() < self.cfg.static_pod_rescan)
        {
            return;
        }
        self.last_scan = Some(Instant::now());
        let mut pods = BTreeMap::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "reading the static pod path");
                self.pods.clear();
                return;
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
                Err(why) => {
                    tracing::warn!(file = %path.display(), error = %why, "could not process manifest file")
                }
            }
        }
        self.pods = pods;
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
        s.rescan(true);
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
}
