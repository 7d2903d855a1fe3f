//! PodSecurity: the Pod Security Standards admission plugin (k8s.io/pod-security-admission
//! as kube-apiserver runs it in-tree).
//!
//! A namespace's labels `pod-security.kubernetes.io/{enforce,audit,warn}[-version]` pick a
//! level (privileged, baseline, restricted) and a version (`latest`, `v1.x`) per mode. Pods
//! that fail the enforce level are refused (403); pods and pod templates of workload
//! controllers that fail the warn level get a warning. Namespace label values are validated,
//! and tightening a namespace's enforce level warns about the pods already there.
//! What was decided goes on the request's audit events as upstream's annotations:
//! `pod-security.kubernetes.io/enforce-policy` (the level:version enforced),
//! `audit-violations` (what fails the audit level) and `exempt` (namespace, user or
//! runtimeClass).

mod checks;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kumo_apimachinery::status::{ApiError, GroupResource};
use kumo_apimachinery::validation::{FieldError, Path};
use kumo_storage::RangeRequest;
use serde_json::{Map, Value};

pub use checks::{evaluate, Aggregate, Level, LevelVersion, Version, Violation};

use super::{Attributes, Operation, Plugin};

const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";
const ENFORCE_VERSION_LABEL: &str = "pod-security.kubernetes.io/enforce-version";
const AUDIT_LABEL: &str = "pod-security.kubernetes.io/audit";
const ENFORCE_POLICY_ANNOTATION: &str = "pod-security.kubernetes.io/enforce-policy";
const AUDIT_VIOLATIONS_ANNOTATION: &str = "pod-security.kubernetes.io/audit-violations";
const EXEMPT_ANNOTATION: &str = "pod-security.kubernetes.io/exempt";
const AUDIT_VERSION_LABEL: &str = "pod-security.kubernetes.io/audit-version";
const WARN_LABEL: &str = "pod-security.kubernetes.io/warn";
const WARN_VERSION_LABEL: &str = "pod-security.kubernetes.io/warn-version";

/// At most this many existing pods are checked when a namespace's enforce level changes.
const NAMESPACE_MAX_PODS_TO_CHECK: usize = 3000;
/// ... and for at most this long.
const NAMESPACE_POD_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// The level and version of each mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub enforce: LevelVersion,
    pub audit: LevelVersion,
    pub warn: LevelVersion,
}

impl Policy {
    fn fully_privileged(&self) -> bool {
        [self.enforce, self.audit, self.warn]
            .iter()
            .all(|lv| lv.level == Level::Privileged)
    }

    /// Both privileged, or the same level and version, in every mode.
    fn equivalent(&self, other: &Policy) -> bool {
        let eq = |a: &LevelVersion, b: &LevelVersion| {
            (a.level == Level::Privileged && b.level == Level::Privileged) || a == b
        };
        eq(&self.enforce, &other.enforce)
            && eq(&self.audit, &other.audit)
            && eq(&self.warn, &other.warn)
    }
}

impl Default for Policy {
    /// kube-apiserver's default configuration: privileged:latest in every mode.
    fn default() -> Self {
        let lv = LevelVersion {
            level: Level::Privileged,
            version: Version::Latest,
        };
        Policy {
            enforce: lv,
            audit: lv,
            warn: lv,
        }
    }
}

/// The PodSecurityConfiguration: defaults and exemptions (none by default, as upstream).
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub defaults: Policy,
    pub exempt_namespaces: Vec<String>,
    pub exempt_usernames: Vec<String>,
    pub exempt_runtime_classes: Vec<String>,
}

/// The admission plugin (`Default`: kube-apiserver's default configuration).
#[derive(Default)]
pub struct PodSecurity {
    config: Config,
}

impl PodSecurity {
    /// The plugin with a PodSecurityConfiguration's defaults and exemptions.
    pub fn new(config: Config) -> PodSecurity {
        PodSecurity { config }
    }

    fn exempt_namespace(&self, ns: &str) -> bool {
        !ns.is_empty() && self.config.exempt_namespaces.iter().any(|n| n == ns)
    }

    fn exempt_user(&self, user: &str) -> bool {
        !user.is_empty() && self.config.exempt_usernames.iter().any(|n| n == user)
    }

    fn exempt_runtime_class(&self, spec: &Value) -> bool {
        let rc = spec
            .get("runtimeClassName")
            .and_then(Value::as_str)
            .unwrap_or("");
        !rc.is_empty() && self.config.exempt_runtime_classes.iter().any(|n| n == rc)
    }
}

/// The resources whose objects embed a pod template, and where it is.
fn template_of<'a>(group: &str, plural: &str, obj: &'a Value) -> Option<Option<&'a Value>> {
    let t = match (group, plural) {
        ("", "podtemplates") => obj.get("template"),
        ("", "replicationcontrollers")
        | ("apps", "replicasets")
        | ("apps", "deployments")
        | ("apps", "statefulsets")
        | ("apps", "daemonsets")
        | ("batch", "jobs") => obj.get("spec").and_then(|s| s.get("template")),
        ("batch", "cronjobs") => obj
            .get("spec")
            .and_then(|s| s.get("jobTemplate"))
            .and_then(|j| j.get("spec"))
            .and_then(|s| s.get("template")),
        _ => return None,
    };
    Some(t.filter(|t| !t.is_null()))
}

/// Pod subresources that cannot change what the policy looks at.
const IGNORED_POD_SUBRESOURCES: &[&str] = &[
    "exec",
    "attach",
    "binding",
    "eviction",
    "log",
    "portforward",
    "proxy",
    "status",
];

static EMPTY: Value = Value::Null;

fn labels(obj: &Value) -> Map<String, Value> {
    obj.get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// Resolves a namespace's labels to its policy, falling back to `defaults`, as upstream's
/// PolicyToEvaluate: an unparsable enforce level means restricted (fail closed), an
/// unparsable audit or warn level privileged (fail open), an unparsable version latest.
/// The errors are the labels' field errors.
pub fn policy_to_evaluate(
    labels: &Map<String, Value>,
    defaults: Policy,
) -> (Policy, Vec<FieldError>) {
    let mut p = defaults;
    let mut errs = Vec::new();
    if labels.is_empty() {
        return (p, errs);
    }
    let path = Path::new("metadata").child("labels");
    let get = |k: &str| labels.get(k).map(|v| v.as_str().unwrap_or(""));
    let level = |k: &str, errs: &mut Vec<FieldError>| -> Option<Option<Level>> {
        let v = get(k)?;
        let parsed = Level::parse(v);
        if parsed.is_none() {
            errs.push(FieldError::invalid(
                &path.key(k),
                v,
                "must be one of privileged, baseline, restricted",
            ));
        }
        Some(parsed)
    };
    let version = |k: &str, errs: &mut Vec<FieldError>| -> Option<Version> {
        let v = get(k)?;
        let parsed = Version::parse(v);
        if parsed.is_none() {
            errs.push(FieldError::invalid(
                &path.key(k),
                v,
                "must be \"latest\" or \"v1.x\"",
            ));
        }
        Some(parsed.unwrap_or(Version::Latest))
    };
    let mut has_enforce_level = false;
    if let Some(l) = level(ENFORCE_LABEL, &mut errs) {
        has_enforce_level = l.is_some();
        p.enforce.level = l.unwrap_or(Level::Restricted);
    }
    if let Some(v) = version(ENFORCE_VERSION_LABEL, &mut errs) {
        p.enforce.version = v;
    }
    if let Some(l) = level(AUDIT_LABEL, &mut errs) {
        p.audit.level = l.unwrap_or(Level::Privileged);
    }
    if let Some(v) = version(AUDIT_VERSION_LABEL, &mut errs) {
        p.audit.version = v;
    }
    let has_warn_level = get(WARN_LABEL).is_some();
    if let Some(l) = level(WARN_LABEL, &mut errs) {
        p.warn.level = l.unwrap_or(Level::Privileged);
    }
    let has_warn_version = get(WARN_VERSION_LABEL).is_some();
    if let Some(v) = version(WARN_VERSION_LABEL, &mut errs) {
        p.warn.version = v;
    }
    // Warn defaults to an explicitly set, stricter enforce level.
    if !has_warn_level && has_enforce_level && p.enforce.level > p.warn.level {
        p.warn.level = p.enforce.level;
        if !has_warn_version {
            p.warn.version = p.enforce.version;
        }
    }
    (p, errs)
}

/// Whether a pod update changes anything the checks could see differently: upstream looks at
/// the container lists and images only (the rest of a pod's spec is immutable).
fn significant_pod_update(new: &Value, old: &Value) -> bool {
    let list = |o: &'_ Value, k: &str| -> Vec<Value> {
        o.get("spec")
            .and_then(|s| s.get(k))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let image = |c: &Value| c.get("image").and_then(Value::as_str).map(str::to_owned);
    for k in ["containers", "initContainers"] {
        let (n, o) = (list(new, k), list(old, k));
        if n.len() != o.len() || n.iter().zip(&o).any(|(a, b)| image(a) != image(b)) {
            return true;
        }
    }
    let old_ephemeral = list(old, "ephemeralContainers");
    for c in list(new, "ephemeralContainers") {
        match old_ephemeral
            .iter()
            .find(|o| o.get("name") == c.get("name"))
        {
            None => return true,
            Some(o) if image(o) != image(&c) => return true,
            Some(_) => {}
        }
    }
    false
}

/// `"s"` as Go's `%q` prints a plain string.
fn quoted(s: impl std::fmt::Display) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

impl PodSecurity {
    async fn namespace_labels(
        &self,
        a: &Attributes<'_>,
        ns: &str,
    ) -> Result<Map<String, Value>, String> {
        let key = format!("/registry/namespaces/{ns}");
        match a.rest.store.get(key.as_bytes(), None).await {
            Ok((Some(kv), _)) => {
                let obj: Value = serde_json::from_slice(&kv.value).map_err(|e| e.to_string())?;
                Ok(labels(&obj))
            }
            Ok((None, _)) => Err(format!("namespaces \"{ns}\" not found")),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn validate_namespace(&self, a: &Attributes<'_>, obj: &Value) -> Result<(), ApiError> {
        if a.subresource.is_some() {
            return Ok(());
        }
        let new_labels = labels(obj);
        let (new_policy, new_errs) = policy_to_evaluate(&new_labels, self.config.defaults);
        match a.operation {
            Operation::Create => {
                if !new_errs.is_empty() {
                    return Err(crate::rest::invalid(a.resource, a.name, &new_errs));
                }
                if self.exempt_namespace(a.name) {
                    self.exempt_namespace_warning(a.name, &new_policy, &new_labels);
                }
                Ok(())
            }
            Operation::Update => {
                let old_labels = a.old.map(labels).unwrap_or_default();
                let (old_policy, old_errs) = policy_to_evaluate(&old_labels, self.config.defaults);
                if !new_errs.is_empty() && (old_errs.is_empty() || new_errs != old_errs) {
                    return Err(crate::rest::invalid(a.resource, a.name, &new_errs));
                }
                let (new, old) = (new_policy.enforce, old_policy.enforce);
                if new == old
                    || new.level == Level::Privileged
                    || (new.version == old.version && new.level <= old.level)
                {
                    return Ok(());
                }
                if self.exempt_namespace(a.name) {
                    self.exempt_namespace_warning(a.name, &new_policy, &new_labels);
                    return Ok(());
                }
                for w in self.evaluate_pods_in_namespace(a, a.name, new).await {
                    crate::rest::warn(w);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Warns that an exempt namespace's own non-default policy is ignored.
    fn exempt_namespace_warning(&self, ns: &str, policy: &Policy, labels: &Map<String, Value>) {
        if policy.fully_privileged() || policy.equivalent(&self.config.defaults) {
            return;
        }
        let mut parts = Vec::new();
        let modes = [
            (
                "enforce",
                policy.enforce,
                ENFORCE_LABEL,
                ENFORCE_VERSION_LABEL,
            ),
            ("audit", policy.audit, AUDIT_LABEL, AUDIT_VERSION_LABEL),
            ("warn", policy.warn, WARN_LABEL, WARN_VERSION_LABEL),
        ];
        for (mode, lv, level_label, version_label) in modes {
            if lv.level != Level::Privileged
                && (labels.contains_key(level_label) || labels.contains_key(version_label))
            {
                parts.push(format!("{mode}={lv}"));
            }
        }
        crate::rest::warn(format!(
            "namespace {} is exempt from Pod Security, and the policy ({}) will be ignored",
            quoted(ns),
            parts.join(", ")
        ));
    }

    /// The warnings for existing pods that fail a namespace's new enforce level: one line per
    /// distinct set of reasons, naming the lexically first pod and how many others share it.
    async fn evaluate_pods_in_namespace(
        &self,
        a: &Attributes<'_>,
        ns: &str,
        enforce: LevelVersion,
    ) -> Vec<String> {
        let deadline = Instant::now() + NAMESPACE_POD_CHECK_TIMEOUT;
        let prefix = format!("/registry/pods/{ns}/").into_bytes();
        let pods: Vec<Value> = match a
            .rest
            .store
            .range(RangeRequest {
                prefix,
                start: None,
                limit: 0,
                revision: None,
            })
            .await
        {
            Ok(r) => r
                .kvs
                .iter()
                .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
                .collect(),
            Err(_) => {
                return vec![
                    "failed to list pods while checking new PodSecurity enforce level".into(),
                ]
            }
        };
        let pods = self.prioritize_pods(pods);
        let total = pods.len();
        let mut checked = total.min(NAMESPACE_MAX_PODS_TO_CHECK);
        let mut order: Vec<String> = Vec::new();
        let mut counts: HashMap<String, (String, usize)> = HashMap::new();
        for (i, pod) in pods.iter().take(checked).enumerate() {
            let meta = pod.get("metadata").unwrap_or(&EMPTY);
            let spec = pod.get("spec").unwrap_or(&EMPTY);
            let r = evaluate(enforce, meta, spec);
            if !r.allowed() {
                let name = meta
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                let reasons = r.reasons();
                match counts.get_mut(&reasons) {
                    Some(c) => {
                        if name < c.0 {
                            c.0 = name;
                        }
                        c.1 += 1;
                    }
                    None => {
                        order.push(reasons.clone());
                        counts.insert(reasons, (name, 1));
                    }
                }
            }
            if Instant::now() >= deadline {
                checked = i + 1;
                break;
            }
        }
        let mut warnings = Vec::new();
        if checked < total {
            warnings.push(format!(
                "new PodSecurity enforce level only checked against the first {checked} of {total} existing pods"
            ));
        }
        if !order.is_empty() {
            warnings.push(format!(
                "existing pods in namespace {} violate the new PodSecurity enforce level {}",
                quoted(ns),
                quoted(enforce)
            ));
        }
        let mut pod_warnings: Vec<String> = order
            .into_iter()
            .map(|reasons| {
                let (name, n) = counts.get(&reasons).cloned().unwrap_or_default();
                match n {
                    0 => reasons,
                    1 => format!("{name}: {reasons}"),
                    2 => format!("{name} (and 1 other pod): {reasons}"),
                    n => format!("{name} (and {} other pods): {reasons}", n - 1),
                }
            })
            .collect();
        pod_warnings.sort();
        warnings.extend(pod_warnings);
        warnings
    }

    /// Drops pods of exempt runtime classes and checks one pod per controller before the
    /// other replicas, so the limits cut replicas first.
    fn prioritize_pods(&self, pods: Vec<Value>) -> Vec<Value> {
        let mut first = Vec::new();
        let mut replicas = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        for pod in pods {
            if self.exempt_runtime_class(pod.get("spec").unwrap_or(&EMPTY)) {
                continue;
            }
            let controller = pod
                .get("metadata")
                .and_then(|m| m.get("ownerReferences"))
                .and_then(Value::as_array)
                .and_then(|refs| {
                    refs.iter()
                        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
                })
                .map(|r| {
                    r.get("uid")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                });
            match controller {
                None => first.push(pod),
                Some(uid) if seen.contains(&uid) => replicas.push(pod),
                Some(uid) => {
                    seen.insert(uid);
                    first.push(pod);
                }
            }
        }
        first.extend(replicas);
        first
    }

    /// Whether the namespace or the user is exempt, recorded as upstream's `exempt`
    /// annotation.
    fn exempt(&self, a: &Attributes<'_>, ns: &str) -> bool {
        let why = if self.exempt_namespace(ns) {
            "namespace"
        } else if self.exempt_user(&a.user.name) {
            "user"
        } else {
            return false;
        };
        crate::audit::annotate(EXEMPT_ANNOTATION, why);
        true
    }

    async fn validate_pod(&self, a: &Attributes<'_>, obj: &Value) -> Result<(), ApiError> {
        if a.subresource
            .is_some_and(|s| IGNORED_POD_SUBRESOURCES.contains(&s))
        {
            return Ok(());
        }
        let ns = a.namespace.unwrap_or("");
        if self.exempt(a, ns) {
            return Ok(());
        }
        let labels = self.namespace_labels(a, ns).await.map_err(|_| {
            ApiError::internal(format!("failed to lookup namespace {}", quoted(ns)))
        })?;
        let (policy, errs) = policy_to_evaluate(&labels, self.config.defaults);
        if errs.is_empty() && policy.fully_privileged() {
            return Ok(());
        }
        if a.operation == Operation::Update {
            if let Some(old) = a.old {
                if !significant_pod_update(obj, old) {
                    return Ok(());
                }
            }
        }
        let meta = obj.get("metadata").unwrap_or(&EMPTY);
        let spec = obj.get("spec").unwrap_or(&EMPTY);
        self.evaluate_pod(a, &policy, meta, spec, true)
    }

    async fn validate_controller(
        &self,
        a: &Attributes<'_>,
        template: Option<&Value>,
    ) -> Result<(), ApiError> {
        if a.subresource.is_some() {
            return Ok(());
        }
        let ns = a.namespace.unwrap_or("");
        if self.exempt(a, ns) {
            return Ok(());
        }
        // Controllers are never refused: a failed lookup lets them through.
        let Ok(labels) = self.namespace_labels(a, ns).await else {
            return Ok(());
        };
        let (policy, errs) = policy_to_evaluate(&labels, self.config.defaults);
        if errs.is_empty()
            && policy.warn.level == Level::Privileged
            && policy.audit.level == Level::Privileged
        {
            return Ok(());
        }
        let Some(template) = template else {
            return Ok(());
        };
        let meta = template.get("metadata").unwrap_or(&EMPTY);
        let spec = template.get("spec").unwrap_or(&EMPTY);
        self.evaluate_pod(a, &policy, meta, spec, false)
    }

    /// Refuses a pod failing the enforce level (when `enforce`), else warns if it fails the
    /// warn level.
    fn evaluate_pod(
        &self,
        a: &Attributes<'_>,
        policy: &Policy,
        meta: &Value,
        spec: &Value,
        enforce: bool,
    ) -> Result<(), ApiError> {
        if self.exempt_runtime_class(spec) {
            crate::audit::annotate(EXEMPT_ANNOTATION, "runtimeClass");
            return Ok(());
        }
        let mut cached: BTreeMap<String, Aggregate> = BTreeMap::new();
        let mut refused = None;
        if enforce {
            crate::audit::annotate(ENFORCE_POLICY_ANNOTATION, &policy.enforce.to_string());
            let result = evaluate(policy.enforce, meta, spec);
            if !result.allowed() {
                refused = Some(ApiError::forbidden(
                    &GroupResource::new(a.resource.group, a.resource.plural),
                    a.name,
                    &format!(
                        "violates PodSecurity {}: {}",
                        quoted(policy.enforce),
                        result.details()
                    ),
                ));
            }
            cached.insert(policy.enforce.to_string(), result);
        }
        // The audit level is recorded whether or not the pod is refused.
        let audit = match cached.get(&policy.audit.to_string()) {
            Some(r) => r.clone(),
            None => evaluate(policy.audit, meta, spec),
        };
        if !audit.allowed() {
            crate::audit::annotate(
                AUDIT_VIOLATIONS_ANNOTATION,
                &format!(
                    "would violate PodSecurity {}: {}",
                    quoted(policy.audit),
                    audit.details()
                ),
            );
        }
        if let Some(e) = refused {
            return Err(e);
        }
        let warn = match cached.remove(&policy.warn.to_string()) {
            Some(r) => r,
            None => evaluate(policy.warn, meta, spec),
        };
        if !warn.allowed() {
            crate::rest::warn(format!(
                "would violate PodSecurity {}: {}",
                quoted(policy.warn),
                warn.details()
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Plugin for PodSecurity {
    fn name(&self) -> &'static str {
        "PodSecurity"
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        if !matches!(a.operation, Operation::Create | Operation::Update) {
            return Ok(());
        }
        let Some(obj) = obj else {
            return Ok(());
        };
        match (a.resource.group, a.resource.plural) {
            ("", "namespaces") => self.validate_namespace(a, obj).await,
            ("", "pods") => self.validate_pod(a, obj).await,
            (group, plural) => match template_of(group, plural, obj) {
                Some(template) => self.validate_controller(a, template).await,
                None => Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn labels_resolve_as_upstream() {
        let (p, errs) = policy_to_evaluate(
            &map(json!({ENFORCE_LABEL: "restricted"})),
            Policy::default(),
        );
        assert!(errs.is_empty());
        assert_eq!(p.enforce.to_string(), "restricted:latest");
        // Warn follows an explicit, stricter enforce level.
        assert_eq!(p.warn.to_string(), "restricted:latest");
        assert_eq!(p.audit.to_string(), "privileged:latest");

        let (p, errs) = policy_to_evaluate(
            &map(json!({ENFORCE_LABEL: "bogus", WARN_LABEL: "x", ENFORCE_VERSION_LABEL: "v1.24"})),
            Policy::default(),
        );
        assert_eq!(p.enforce.to_string(), "restricted:v1.24");
        assert_eq!(p.warn.to_string(), "privileged:latest");
        let msgs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            msgs,
            vec![
                "metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: \"bogus\": must be one of privileged, baseline, restricted",
                "metadata.labels[pod-security.kubernetes.io/warn]: Invalid value: \"x\": must be one of privileged, baseline, restricted",
            ]
        );
    }

    #[test]
    fn only_image_and_container_changes_are_significant() {
        let old = json!({"spec": {"containers": [{"name": "c", "image": "a"}]}});
        let mut new = old.clone();
        new["metadata"] = json!({"labels": {"x": "y"}});
        new["spec"]["activeDeadlineSeconds"] = json!(5);
        assert!(!significant_pod_update(&new, &old));
        new["spec"]["containers"][0]["image"] = json!("b");
        assert!(significant_pod_update(&new, &old));
        let mut eph = old.clone();
        eph["spec"]["ephemeralContainers"] = json!([{"name": "d", "image": "busybox"}]);
        assert!(significant_pod_update(&eph, &old));
        assert!(!significant_pod_update(&eph, &eph));
    }
}
