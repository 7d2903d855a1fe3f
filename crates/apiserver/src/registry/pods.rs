//! core/v1 Pods and ServiceAccounts.
//!
//! Pods get upstream's defaults (SetDefaults_Pod, SetDefaults_PodSpec, SetDefaults_Container)
//! and the work of the admission plugins that change a new pod: ServiceAccount (the
//! `default` account, which must exist, and its token volume), Priority (priority 0 unless
//! a built-in class is named) and DefaultTolerationSeconds.

use kumo_apimachinery::status::{ApiError, GroupResource};
use kumo_apimachinery::validation::{is_dns1123_label, FieldError, Path};
use serde_json::{json, Value};

use super::{age_of, default_field, name_of, or_none, str_at, Column, Lookup, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource {
            group: "",
            version: "v1",
            kind: "Pod",
            plural: "pods",
            singular: "pod",
            namespaced: true,
            short_names: &["po"],
            categories: &["all"],
            subresources: &[
                "binding",
                "ephemeralcontainers",
                "eviction",
                "resize",
                "status",
            ],
            strategy: Box::new(Pods),
        },
        Resource {
            group: "",
            version: "v1",
            kind: "ServiceAccount",
            plural: "serviceaccounts",
            singular: "serviceaccount",
            namespaced: true,
            short_names: &["sa"],
            categories: &[],
            subresources: &["token"],
            strategy: Box::new(ServiceAccounts),
        },
    ]
}

struct Pods;

const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";

/// The container lists of a pod spec that defaulting and validation walk.
pub(super) const CONTAINER_LISTS: [&str; 2] = ["initContainers", "containers"];

fn containers_mut<'a>(obj: &'a mut Value, list: &str) -> Vec<&'a mut Value> {
    obj.get_mut("spec")
        .and_then(|s| s.get_mut(list))
        .and_then(Value::as_array_mut)
        .map(|a| a.iter_mut().collect())
        .unwrap_or_default()
}

fn containers<'a>(obj: &'a Value, list: &str) -> &'a [Value] {
    obj.get("spec")
        .and_then(|s| s.get(list))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// The list at `obj[key]` (empty when absent).
fn list_at<'a>(obj: &'a Value, key: &str) -> &'a [Value] {
    obj.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// SetDefaults_Container and the container parts of SetDefaults_Pod.
pub(super) fn default_container(c: &mut Value) {
    if !c.is_object() {
        return;
    }
    let image = str_at(c, "/image");
    if str_at(c, "/imagePullPolicy").is_empty() {
        // The tag is what follows the last ':' after the last '/'; a digest pins the image.
        let last = image.rsplit('/').next().unwrap_or("");
        let tag = if image.contains('@') {
            Some("digest")
        } else {
            last.split_once(':').map(|(_, t)| t)
        };
        let policy = match tag {
            None | Some("latest") => "Always",
            Some(_) => "IfNotPresent",
        };
        c["imagePullPolicy"] = json!(policy);
    }
    default_field(c, "terminationMessagePath", json!("/dev/termination-log"));
    default_field(c, "terminationMessagePolicy", json!("File"));
    default_field(c, "resources", json!({}));
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = c.get_mut(probe).filter(|p| p.is_object()) {
            default_field(p, "timeoutSeconds", json!(1));
            default_field(p, "periodSeconds", json!(10));
            default_field(p, "successThreshold", json!(1));
            default_field(p, "failureThreshold", json!(3));
            default_handler(p);
        }
    }
    for hook in ["postStart", "preStop"] {
        if let Some(h) = c.pointer_mut(&format!("/lifecycle/{hook}")) {
            default_handler(h);
        }
    }
    if let Some(env) = c.get_mut("env").and_then(Value::as_array_mut) {
        for e in env {
            if let Some(f) = e.pointer_mut("/valueFrom/fieldRef") {
                default_field(f, "apiVersion", json!("v1"));
            }
        }
    }
    if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            if str_at(p, "/protocol").is_empty() && p.is_object() {
                p["protocol"] = json!("TCP");
            }
        }
    }
}

/// Requests default to the limits (SetDefaults_Pod: pods only, not templates).
pub(super) fn default_requests(c: &mut Value) {
    if let Some(r) = c.get_mut("resources").and_then(Value::as_object_mut) {
        if let Some(limits) = r.get("limits").and_then(Value::as_object).cloned() {
            let req = r.entry("requests").or_insert_with(|| json!({}));
            if let Some(req) = req.as_object_mut() {
                for (k, v) in limits {
                    req.entry(k).or_insert(v);
                }
            }
        }
    }
}

/// The defaults of a pod spec, in a pod or a pod template: SetDefaults_PodSpec with the
/// defaults of its containers and volumes.
pub(crate) fn default_pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    for list in CONTAINER_LISTS {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs {
                default_container(c);
            }
        }
    }
    if let Some(vs) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
        for v in vs {
            default_volume(v);
        }
    }
    default_field(spec, "restartPolicy", json!("Always"));
    default_field(spec, "terminationGracePeriodSeconds", json!(30));
    default_field(spec, "dnsPolicy", json!("ClusterFirst"));
    default_field(spec, "securityContext", json!({}));
    default_field(spec, "schedulerName", json!("default-scheduler"));
    // The deprecated serviceAccount mirrors serviceAccountName.
    if str_at(spec, "/serviceAccountName").is_empty() {
        let sa = str_at(spec, "/serviceAccount").to_owned();
        if !sa.is_empty() {
            spec["serviceAccountName"] = json!(sa);
        }
    }
    let sa = str_at(spec, "/serviceAccountName").to_owned();
    if !sa.is_empty() {
        spec["serviceAccount"] = json!(sa);
    }
}

/// The checks of upstream's ValidatePodTemplateSpec on a template at `path` (labels and
/// annotations of its metadata, which upstream reports as `<path>.labels`, then its spec).
pub(crate) fn validate_pod_template(template: &Value, path: &Path) -> Vec<FieldError> {
    let string_map = |k: &str| -> std::collections::BTreeMap<String, String> {
        template
            .pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut errs = kumo_apimachinery::validation::validate_labels(
        &string_map("labels"),
        &path.child("labels"),
    );
    errs.extend(kumo_apimachinery::validation::validate_annotations(
        &string_map("annotations"),
        &path.child("annotations"),
    ));
    let spec = template.get("spec").unwrap_or(&Value::Null);
    errs.extend(validate_pod_spec(spec, &path.child("spec")));
    if !list_at(spec, "ephemeralContainers").is_empty() {
        errs.push(FieldError::forbidden(
            &path.child("spec").child("ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
    errs
}

/// SetDefaults_HTTPGetAction and SetDefaults_GRPCAction in a probe or lifecycle handler.
fn default_handler(h: &mut Value) {
    if let Some(g) = h.get_mut("httpGet").filter(|g| g.is_object()) {
        default_field(g, "path", json!("/"));
        default_field(g, "scheme", json!("HTTP"));
    }
    if let Some(g) = h.get_mut("grpc").filter(|g| g.is_object()) {
        default_field(g, "service", json!(""));
    }
}

/// SetDefaults_Volume and the defaultMode of the volume sources that have one.
fn default_volume(v: &mut Value) {
    let Some(o) = v.as_object_mut() else { return };
    if o.keys().all(|k| k == "name") {
        o.insert("emptyDir".into(), json!({}));
    }
    for source in ["secret", "configMap", "projected", "downwardAPI"] {
        if let Some(s) = o.get_mut(source).filter(|s| s.is_object()) {
            default_field(s, "defaultMode", json!(420));
            if let Some(items) = s.get_mut("items").and_then(Value::as_array_mut) {
                for i in items {
                    if let Some(f) = i.get_mut("fieldRef") {
                        default_field(f, "apiVersion", json!("v1"));
                    }
                }
            }
        }
    }
    if let Some(h) = o.get_mut("hostPath").filter(|h| h.is_object()) {
        default_field(h, "type", json!(""));
    }
}

/// A Quantity as a number (enough to compare requests with limits).
fn quantity(v: &Value) -> Option<f64> {
    kumo_apimachinery::quantity::Quantity::from_json(v).map(|q| q.as_f64())
}

/// Upstream's requirementsQOS: the class of one set of resource requirements, from cpu and
/// memory (`request_default`: a missing request counts as the limit, which is what the
/// API's defaulting makes of it).
fn requirements_qos(res: Option<&Value>, request_default: bool) -> &'static str {
    use kumo_apimachinery::quantity::Quantity;
    let map = |kind: &str| res.and_then(|r| r.get(kind)).and_then(Value::as_object);
    if map("requests").is_none_or(|m| m.is_empty()) && map("limits").is_none_or(|m| m.is_empty()) {
        return "BestEffort";
    }
    let get = |kind: &str, name: &str| {
        map(kind)
            .and_then(|m| m.get(name))
            .and_then(Quantity::from_json)
    };
    let mut qos = None;
    for name in ["cpu", "memory"] {
        let limit = get("limits", name);
        let request = get("requests", name).or(if request_default { limit } else { None });
        let (request, limit) = (
            request.unwrap_or_else(Quantity::zero),
            limit.unwrap_or_else(Quantity::zero),
        );
        let class = if request != limit {
            "Burstable"
        } else if request.is_zero() {
            "BestEffort"
        } else {
            "Guaranteed"
        };
        match qos {
            _ if class == "Burstable" => return class,
            None => qos = Some(class),
            Some(q) if q != class => return "Burstable",
            Some(_) => {}
        }
    }
    qos.unwrap_or("BestEffort")
}

/// The QoS class of a pod, as upstream's ComputePodQOS: pod-level resources decide when they
/// name cpu, memory or hugepages; otherwise every container's class, combined (one
/// Burstable, or a mix, makes the pod Burstable).
pub(super) fn qos_class(pod: &Value) -> &'static str {
    let pod_level = pod.pointer("/spec/resources");
    let supported = |kind: &str| {
        pod_level
            .and_then(|r| r.get(kind))
            .and_then(Value::as_object)
            .is_some_and(|m| {
                m.keys()
                    .any(|k| k == "cpu" || k == "memory" || k.starts_with("hugepages-"))
            })
    };
    if supported("requests") || supported("limits") {
        return requirements_qos(pod_level, true);
    }
    let mut qos = None;
    for list in CONTAINER_LISTS {
        for c in containers(pod, list) {
            let class = requirements_qos(c.get("resources"), false);
            match qos {
                _ if class == "Burstable" => return class,
                None => qos = Some(class),
                Some(q) if q != class => return "Burstable",
                Some(_) => {}
            }
        }
    }
    qos.unwrap_or("BestEffort")
}

/// Five characters of upstream's generated-name alphabet.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().into_bytes()[..5]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// The projected volume of the service account token.
fn token_volume_source() -> Value {
    json!({
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
            {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}, "path": "namespace"}]}},
        ],
    })
}

/// The ServiceAccount admission plugin's mountServiceAccountToken.
fn mount_token(pod: &mut Value) {
    let volumes = containers(pod, "volumes");
    let existing = volumes
        .iter()
        .map(|v| str_at(v, "/name"))
        .find(|n| n.starts_with(TOKEN_VOLUME_PREFIX))
        .map(str::to_owned);
    let has_volume = existing.is_some();
    let name = existing.unwrap_or_else(|| format!("{TOKEN_VOLUME_PREFIX}{}", random_suffix()));
    let mount = json!({"name": name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
    let mut needed = false;
    for list in CONTAINER_LISTS {
        for c in containers_mut(pod, list) {
            let Some(o) = c.as_object_mut() else { continue };
            let mounts = o.entry("volumeMounts").or_insert_with(|| json!([]));
            let Some(m) = mounts.as_array_mut() else {
                continue;
            };
            if !m
                .iter()
                .any(|v| str_at(v, "/mountPath") == TOKEN_MOUNT_PATH)
            {
                m.push(mount.clone());
                needed = true;
            }
            if m.is_empty() {
                o.remove("volumeMounts");
            }
        }
    }
    if needed && !has_volume {
        if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
            let v = spec.entry("volumes").or_insert_with(|| json!([]));
            if let Some(v) = v.as_array_mut() {
                v.push(json!({"name": name, "projected": token_volume_source()}));
            }
        }
    }
}

/// The PriorityClasses kube-apiserver creates at start-up.
fn builtin_priority(class: &str) -> Option<i64> {
    match class {
        "system-node-critical" => Some(2_000_001_000),
        "system-cluster-critical" => Some(2_000_000_000),
        _ => None,
    }
}

const DEFAULT_TOLERATIONS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// What the DefaultTolerationSeconds and ServiceAccount admission plugins set on a new pod.
/// They run after the field manager has recorded the request, so these fields are not
/// owned by the request's manager.
fn admit_defaults(spec: &mut Value, mirror: bool) {
    default_tolerations(spec);
    // ServiceAccount admission: the default account (mirror pods are left alone).
    if mirror {
        return;
    }
    if str_at(spec, "/serviceAccountName").is_empty() {
        let sa = match str_at(spec, "/serviceAccount") {
            "" => "default".to_owned(),
            s => s.to_owned(),
        };
        spec["serviceAccountName"] = json!(sa);
    }
    let sa = str_at(spec, "/serviceAccountName").to_owned();
    spec["serviceAccount"] = json!(sa);
}

/// DefaultTolerationSeconds admission: 300 s tolerations of the not-ready and unreachable
/// NoExecute taints, unless the pod already tolerates them.
fn default_tolerations(spec: &mut Value) {
    if let Some(s) = spec.as_object_mut() {
        let t = s.entry("tolerations").or_insert_with(|| json!([]));
        if let Some(t) = t.as_array_mut() {
            for key in DEFAULT_TOLERATIONS {
                let present = t.iter().any(|x| {
                    let k = str_at(x, "/key");
                    let effect = str_at(x, "/effect");
                    (k == key || k.is_empty()) && (effect.is_empty() || effect == "NoExecute")
                });
                if !present {
                    t.push(json!({
                        "key": key,
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": 300,
                    }));
                }
            }
        }
    }
}

impl Strategy for Pods {
    // Upstream's status strategy takes the request's metadata except the owner references
    // (old kubelets corrupted them); the deletion timestamp never changes on update.
    fn prepare_status_update(&self, new: &mut Value, old: &Value) {
        super::keep_old_metadata(new, old, &["ownerReferences"]);
    }

    fn prepare_subresource_update(&self, sub: &str, new: &mut Value, old: &Value) {
        super::pod_subresources::prepare_update(sub, new, old)
    }

    fn validate_subresource_update(&self, sub: &str, new: &Value, old: &Value) -> Vec<FieldError> {
        super::pod_subresources::validate_update(sub, new, old)
    }

    fn tracked_request(&self, sub: &str, request: &Value, old: &Value) -> Option<Value> {
        super::pod_subresources::tracked_request(sub, request, old)
    }

    fn post_subresources(&self) -> &'static [&'static str] {
        &["binding"]
    }

    /// pods/binding, as upstream's binding storage does it: the scheduler's way to put a
    /// pod on a node.
    fn post_subresource(
        &self,
        sub: &str,
        name: &str,
        body: &Value,
        current: &Value,
    ) -> Result<Value, ApiError> {
        if sub != "binding" {
            return Err(ApiError::bad_request(format!(
                "subresource {sub} takes no POST"
            )));
        }
        bind(name, body, current)
    }

    fn prepare_create(&self, obj: &mut Value) {
        self.default(obj);
        let qos = qos_class(obj);
        obj["status"] = json!({"phase": "Pending", "qosClass": qos});
    }

    fn default(&self, obj: &mut Value) {
        if let Some(o) = obj.as_object_mut() {
            if !o.get("spec").is_some_and(Value::is_object) {
                o.insert("spec".into(), json!({}));
            }
        }
        default_pod_spec(&mut obj["spec"]);
        for list in CONTAINER_LISTS {
            for c in containers_mut(obj, list) {
                default_requests(c);
            }
        }
        let spec = &mut obj["spec"];
        default_field(spec, "enableServiceLinks", json!(true));
        if spec.get("hostNetwork") == Some(&json!(true)) {
            // Host-network pods expose their container ports on the host.
            for list in CONTAINER_LISTS {
                if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
                    // (The rest of each container was defaulted above.)
                    for c in cs {
                        if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
                            for p in ports {
                                if p.get("hostPort").is_none() {
                                    let cp = p.get("containerPort").cloned();
                                    if let Some(cp) = cp {
                                        p["hostPort"] = cp;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn admission_lookups(&self, obj: &Value) -> Vec<Lookup> {
        let ns = str_at(obj, "/metadata/namespace");
        // The account admission will default (see `admit_defaults`).
        let sa = match str_at(obj, "/spec/serviceAccountName") {
            "" => "default",
            sa => sa,
        };
        let pods = GroupResource::new("", "pods");
        let mut out = Vec::new();
        // Mirror pods (static pods of the kubelet) keep their spec.
        if obj
            .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
            .is_none()
        {
            out.push(Lookup {
                what: "serviceaccount",
                key: format!("/registry/serviceaccounts/{ns}/{sa}"),
                missing: ApiError::forbidden(
                    &pods,
                    name_of(obj),
                    &format!(
                        "error looking up service account {ns}/{sa}: serviceaccount \"{sa}\" not found"
                    ),
                ),
            });
        }
        let class = str_at(obj, "/spec/priorityClassName");
        if !class.is_empty() && builtin_priority(class).is_none() {
            out.push(Lookup {
                what: "priorityclass",
                key: format!("/registry/priorityclasses/{class}"),
                missing: ApiError::forbidden(
                    &pods,
                    name_of(obj),
                    &format!("no PriorityClass with name {class} was found"),
                ),
            });
        }
        out
    }

    // Priority: a pod that names no class gets the global default one, if any.
    fn admission_lists(&self, obj: &Value) -> Vec<(&'static str, String)> {
        if str_at(obj, "/spec/priorityClassName").is_empty() {
            vec![("priorityclasses", "/registry/priorityclasses/".to_owned())]
        } else {
            Vec::new()
        }
    }

    fn admit_create(
        &self,
        obj: &mut Value,
        found: &[(&'static str, Value)],
    ) -> Result<(), ApiError> {
        let mirror = obj
            .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
            .is_some();
        admit_defaults(&mut obj["spec"], mirror);
        let get = |what: &str| found.iter().find(|(w, _)| *w == what).map(|(_, v)| v);
        // Priority: the class's value, which the pod may not contradict. Without a class,
        // the global default one's (the lowest if several), else 0.
        let mut class = str_at(obj, "/spec/priorityClassName").to_owned();
        let default_class = get("priorityclasses")
            .and_then(Value::as_array)
            .and_then(|all| {
                all.iter()
                    .filter(|pc| pc.get("globalDefault") == Some(&json!(true)))
                    .min_by_key(|pc| pc.get("value").and_then(Value::as_i64).unwrap_or(0))
            });
        if let Some(pc) = default_class.filter(|_| class.is_empty()) {
            class = str_at(pc, "/metadata/name").to_owned();
            obj["spec"]["priorityClassName"] = json!(class);
        }
        let named = get("priorityclass").or(default_class);
        let (priority, policy) = match (builtin_priority(&class), named) {
            (Some(p), _) => (p, "PreemptLowerPriority".to_owned()),
            (None, Some(pc)) => (
                pc.get("value").and_then(Value::as_i64).unwrap_or(0),
                match str_at(pc, "/preemptionPolicy") {
                    "" => "PreemptLowerPriority".to_owned(),
                    p => p.to_owned(),
                },
            ),
            (None, None) => (0, "PreemptLowerPriority".to_owned()),
        };
        let pods = GroupResource::new("", "pods");
        if let Some(given) = obj.pointer("/spec/priority").and_then(Value::as_i64) {
            if given != priority {
                return Err(ApiError::forbidden(
                    &pods,
                    name_of(obj),
                    &format!("the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {priority} from the given PriorityClass name"),
                ));
            }
        }
        let given_policy = str_at(obj, "/spec/preemptionPolicy").to_owned();
        if !given_policy.is_empty() && given_policy != policy {
            return Err(ApiError::forbidden(
                &pods,
                name_of(obj),
                &format!("the string value of PreemptionPolicy ({given_policy}) must not be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name"),
            ));
        }
        obj["spec"]["priority"] = json!(priority);
        obj["spec"]["preemptionPolicy"] = json!(policy);
        let Some(sa) = get("serviceaccount") else {
            return Ok(());
        };
        let automount = obj
            .pointer("/spec/automountServiceAccountToken")
            .and_then(Value::as_bool)
            .or_else(|| {
                sa.get("automountServiceAccountToken")
                    .and_then(Value::as_bool)
            })
            .unwrap_or(true);
        if automount {
            mount_token(obj);
        }
        let has_secrets = obj
            .pointer("/spec/imagePullSecrets")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if !has_secrets {
            if let Some(ips) = sa
                .get("imagePullSecrets")
                .and_then(Value::as_array)
                .filter(|a| !a.is_empty())
            {
                obj["spec"]["imagePullSecrets"] = json!(ips);
            }
        }
        Ok(())
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        // Status changes only through pods/status.
        if let Some(o) = new.as_object_mut() {
            o.insert(
                "status".into(),
                old.get("status").cloned().unwrap_or_else(|| json!({})),
            );
        }
        // DefaultTolerationSeconds admits updates too: an update that drops the default
        // tolerations gets them back (and so only adds tolerations).
        if let Some(spec) = new.get_mut("spec") {
            default_tolerations(spec);
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_pod_spec(obj.get("spec").unwrap_or(&Value::Null), &Path::new("spec"))
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        validate_pod_update(new, old)
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn graceful_delete(&self, obj: &Value, opts: &Value) -> Option<i64> {
        // Upstream's CheckGracefulDelete: pods on a node get their grace period; the
        // kubelet removes them. Pods without a node, or finished, go at once.
        let period = opts
            .get("gracePeriodSeconds")
            .and_then(Value::as_i64)
            .or_else(|| {
                obj.pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
            })
            .unwrap_or(0);
        let phase = str_at(obj, "/status/phase");
        if str_at(obj, "/spec/nodeName").is_empty() || matches!(phase, "Failed" | "Succeeded") {
            return Some(0);
        }
        Some(if period < 0 { 1 } else { period })
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            Column {
                name: "Ready",
                type_: "string",
                format: "",
                description: "The aggregate readiness state of this pod for accepting traffic.",
                priority: 0,
            },
            Column {
                name: "Status",
                type_: "string",
                format: "",
                description: "The aggregate status of the containers in this pod.",
                priority: 0,
            },
            Column {
                name: "Restarts",
                type_: "string",
                format: "",
                description: "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                priority: 0,
            },
            Column::AGE,
            Column {
                name: "IP",
                type_: "string",
                format: "",
                description: "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
                priority: 1,
            },
            Column {
                name: "Node",
                type_: "string",
                format: "",
                description: "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename",
                priority: 1,
            },
            Column {
                name: "Nominated Node",
                type_: "string",
                format: "",
                description: "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled.",
                priority: 1,
            },
            Column {
                name: "Readiness Gates",
                type_: "string",
                format: "",
                description: "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates",
                priority: 1,
            },
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let row = pod_row(obj);
        vec![
            json!(name_of(obj)),
            json!(format!("{}/{}", row.ready, row.total)),
            json!(row.reason),
            json!(row.restarts),
            json!(age_of(obj)),
            json!(or_none(str_at(obj, "/status/podIP"))),
            json!(or_none(str_at(obj, "/spec/nodeName"))),
            json!(or_none(str_at(obj, "/status/nominatedNodeName"))),
            json!(readiness_gates(obj)),
        ]
    }

    fn watch_index(&self) -> Option<crate::cache::WatchIndex> {
        // Every kubelet watches its node's pods: a pod's change goes to its node's only.
        Some(crate::cache::WatchIndex {
            field: "spec.nodeName",
            value: |obj| str_at(obj, "/spec/nodeName").to_owned(),
        })
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        let host_network = obj
            .pointer("/spec/hostNetwork")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let pod_ip = obj
            .pointer("/status/podIPs/0/ip")
            .and_then(Value::as_str)
            .unwrap_or("");
        vec![
            ("spec.nodeName", str_at(obj, "/spec/nodeName").to_owned()),
            (
                "spec.restartPolicy",
                str_at(obj, "/spec/restartPolicy").to_owned(),
            ),
            (
                "spec.schedulerName",
                str_at(obj, "/spec/schedulerName").to_owned(),
            ),
            (
                "spec.serviceAccountName",
                str_at(obj, "/spec/serviceAccountName").to_owned(),
            ),
            ("spec.hostNetwork", host_network.to_string()),
            ("status.phase", str_at(obj, "/status/phase").to_owned()),
            ("status.podIP", pod_ip.to_owned()),
            // Accepted by upstream's field label conversion but absent from the pod's
            // field set, so it only ever matches "".
            ("status.podIPs", String::new()),
            (
                "status.nominatedNodeName",
                str_at(obj, "/status/nominatedNodeName").to_owned(),
            ),
        ]
    }
}

/// What the pod printer shows.
struct PodRow {
    ready: usize,
    total: usize,
    reason: String,
    restarts: String,
}

/// A terminated state as the printer names it: its reason, else `<prefix>Signal:<n>` or
/// `<prefix>ExitCode:<n>`.
fn terminated_reason(t: &Value, prefix: &str) -> String {
    match str_at(t, "/reason") {
        "" => match t.get("signal").and_then(Value::as_i64).unwrap_or(0) {
            0 => format!(
                "{prefix}ExitCode:{}",
                t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
            ),
            sig => format!("{prefix}Signal:{sig}"),
        },
        r => format!("{prefix}{r}"),
    }
}

/// Upstream's printPod: READY counts the containers and the started sidecars (init
/// containers with `restartPolicy: Always`), STATUS explains the first unfinished init
/// container, else the last container's state; RESTARTS counts the init containers'
/// restarts only while the pod initializes, the sidecars' always.
fn pod_row(pod: &Value) -> PodRow {
    let spec_inits = containers(pod, "initContainers");
    let sidecar = |name: &str| {
        spec_inits
            .iter()
            .any(|c| str_at(c, "/name") == name && str_at(c, "/restartPolicy") == "Always")
    };
    let total = containers(pod, "containers").len()
        + spec_inits
            .iter()
            .filter(|c| str_at(c, "/restartPolicy") == "Always")
            .count();
    let mut reason = str_at(pod, "/status/phase").to_owned();
    if !str_at(pod, "/status/reason").is_empty() {
        reason = str_at(pod, "/status/reason").to_owned();
    }
    let conditions = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if conditions
        .iter()
        .any(|c| str_at(c, "/type") == "PodScheduled" && str_at(c, "/reason") == "SchedulingGated")
    {
        reason = "SchedulingGated".to_owned();
    }
    let finished_at = |s: &Value| {
        s.pointer("/lastState/terminated/finishedAt")
            .and_then(Value::as_str)
            .and_then(crate::time::parse_rfc3339)
    };
    let later = |a: Option<i64>, b: Option<i64>| match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    let mut restarts = 0i64;
    let mut last_restart: Option<i64> = None;
    let mut sidecar_restarts = 0i64;
    let mut sidecar_last_restart: Option<i64> = None;
    let mut ready = 0;
    let mut initializing = false;
    let inits = pod
        .pointer("/status/initContainerStatuses")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (i, s) in inits.iter().enumerate() {
        let count = s.get("restartCount").and_then(Value::as_i64).unwrap_or(0);
        restarts += count;
        last_restart = later(last_restart, finished_at(s));
        let is_sidecar = sidecar(str_at(s, "/name"));
        if is_sidecar {
            sidecar_restarts += count;
            sidecar_last_restart = later(sidecar_last_restart, finished_at(s));
        }
        let term = s.pointer("/state/terminated");
        let waiting = str_at(s, "/state/waiting/reason");
        if term.and_then(|t| t.get("exitCode")).and_then(Value::as_i64) == Some(0) {
            continue;
        }
        if is_sidecar && s.get("started") == Some(&json!(true)) {
            if s.get("ready") == Some(&json!(true)) {
                ready += 1;
            }
            continue;
        }
        reason = if let Some(t) = term {
            terminated_reason(t, "Init:")
        } else if !waiting.is_empty() && waiting != "PodInitializing" {
            format!("Init:{waiting}")
        } else {
            format!("Init:{i}/{}", spec_inits.len())
        };
        initializing = true;
        break;
    }
    let initialized = conditions
        .iter()
        .any(|c| str_at(c, "/type") == "Initialized" && str_at(c, "/status") == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = sidecar_last_restart;
        let mut has_running = false;
        let mut error_reason = String::new();
        let statuses = pod
            .pointer("/status/containerStatuses")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for s in statuses.iter().rev() {
            restarts += s.get("restartCount").and_then(Value::as_i64).unwrap_or(0);
            last_restart = later(last_restart, finished_at(s));
            let waiting = str_at(s, "/state/waiting/reason");
            if !waiting.is_empty() {
                reason = waiting.to_owned();
            } else if let Some(t) = s.pointer("/state/terminated") {
                reason = terminated_reason(t, "");
                if t.get("exitCode").and_then(Value::as_i64).unwrap_or(0) != 0 {
                    error_reason = reason.clone();
                }
            } else if s.get("ready") == Some(&json!(true)) && s.pointer("/state/running").is_some()
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" {
            let pod_ready = conditions
                .iter()
                .any(|c| str_at(c, "/type") == "Ready" && str_at(c, "/status") == "True");
            if has_running && pod_ready {
                reason = "Running".to_owned();
            } else if !error_reason.is_empty() {
                reason = error_reason;
            } else if has_running {
                reason = "NotReady".to_owned();
            }
        }
    }
    let phase = str_at(pod, "/status/phase");
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        if str_at(pod, "/status/reason") == "NodeLost" {
            reason = "Unknown".to_owned();
        } else if phase != "Failed" && phase != "Succeeded" {
            reason = "Terminating".to_owned();
        }
    }
    let restarts = match last_restart {
        Some(t) if restarts > 0 => format!(
            "{restarts} ({} ago)",
            crate::time::human_duration(crate::time::now_secs() - t)
        ),
        _ => restarts.to_string(),
    };
    PodRow {
        ready,
        total,
        reason,
        restarts,
    }
}

fn readiness_gates(pod: &Value) -> String {
    let gates = pod
        .pointer("/spec/readinessGates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if gates.is_empty() {
        return "<none>".to_owned();
    }
    let conditions = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let met = gates
        .iter()
        .filter(|g| {
            let t = str_at(g, "/conditionType");
            conditions
                .iter()
                .any(|c| str_at(c, "/type") == t && str_at(c, "/status") == "True")
        })
        .count();
    format!("{met}/{}", gates.len())
}

fn port_range(errs: &mut Vec<FieldError>, path: &Path, v: i64) {
    if !(1..=65535).contains(&v) {
        errs.push(FieldError::invalid(
            path,
            json!(v),
            "must be between 1 and 65535, inclusive",
        ));
    }
}

/// The essentials of upstream's ValidatePodSpec on the pod spec `spec` at `spec_path`
/// (`spec` of a pod, `spec.template.spec` of a workload), with its paths and messages.
/// The spec fields an update may change, as upstream's ValidatePodUpdate lists them.
const UPDATABLE_POD_SPEC_FIELDS: &str = "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// Upstream's ValidatePodUpdate: the whole spec is valid, and only images,
/// activeDeadlineSeconds (set, or lowered), tolerations (added, or their seconds changed),
/// scheduling gates (removed), a negative grace period (to 1) and, while the pod is gated,
/// node selector additions and node affinity may change.
fn validate_pod_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let spec_path = Path::new("spec");
    let null = Value::Null;
    let (ns, os) = (
        new.get("spec").unwrap_or(&null),
        old.get("spec").unwrap_or(&null),
    );
    let mut errs = validate_pod_spec(ns, &spec_path);
    for name in ["containers", "initContainers"] {
        let path = spec_path.child(name);
        let (n, o) = (list_at(ns, name), list_at(os, name));
        if n.len() != o.len() {
            errs.push(FieldError::forbidden(
                &path,
                "pod updates may not add or remove containers",
            ));
            return errs;
        }
        for (i, c) in n.iter().enumerate() {
            let image = str_at(c, "/image");
            if image.trim() != image {
                errs.push(FieldError::invalid(
                    &path.index(i).child("image"),
                    image,
                    "must not have leading or trailing whitespace",
                ));
            }
        }
    }
    let deadline = spec_path.child("activeDeadlineSeconds");
    match (
        ns.get("activeDeadlineSeconds"),
        os.get("activeDeadlineSeconds").and_then(Value::as_i64),
    ) {
        (Some(v), old_deadline) => {
            let n = v.as_i64().unwrap_or(-1);
            if !(0..=i64::from(i32::MAX)).contains(&n) {
                errs.push(FieldError::invalid(
                    &deadline,
                    v.clone(),
                    kumo_apimachinery::validation::inclusive_range_error(0, i32::MAX.into()),
                ));
                return errs;
            }
            if old_deadline.is_some_and(|o| o < n) {
                errs.push(FieldError::invalid(
                    &deadline,
                    v.clone(),
                    "must be less than or equal to previous value",
                ));
                return errs;
            }
        }
        // Upstream renders the nil pointer as the string "null".
        (None, Some(_)) => errs.push(FieldError::invalid(
            &deadline,
            "null",
            "must not update from a positive integer to nil value",
        )),
        (None, None) => {}
    }
    // Tolerations: each old one stays, with any tolerationSeconds.
    let without_seconds = |t: &Value| {
        let mut t = t.clone();
        if let Some(o) = t.as_object_mut() {
            o.remove("tolerationSeconds");
        }
        t
    };
    let new_tolerations: Vec<Value> = list_at(ns, "tolerations")
        .iter()
        .map(without_seconds)
        .collect();
    if list_at(os, "tolerations")
        .iter()
        .any(|t| !new_tolerations.contains(&without_seconds(t)))
    {
        errs.push(FieldError::forbidden(
            &spec_path.child("tolerations"),
            "existing toleration can not be modified except its tolerationSeconds",
        ));
    }
    // Scheduling gates: only removals.
    let old_gates: Vec<&str> = list_at(os, "schedulingGates")
        .iter()
        .map(|g| str_at(g, "/name"))
        .collect();
    for (i, g) in list_at(ns, "schedulingGates").iter().enumerate() {
        let name = str_at(g, "/name");
        if !old_gates.contains(&name) {
            errs.push(FieldError::forbidden(
                &spec_path.child("schedulingGates").index(i).child("name"),
                format!("only deletion is allowed, but found new scheduling gate '{name}'"),
            ));
        }
    }
    if ns == os {
        return errs;
    }
    // Everything else must be as it was: put the updatable fields back and compare.
    let mut munged = ns.clone();
    for name in CONTAINER_LISTS {
        let olds = list_at(os, name);
        if let Some(cs) = munged.get_mut(name).and_then(Value::as_array_mut) {
            for (c, o) in cs.iter_mut().zip(olds) {
                match o.get("image") {
                    Some(img) => c["image"] = img.clone(),
                    None => {
                        if let Some(c) = c.as_object_mut() {
                            c.remove("image");
                        }
                    }
                }
            }
        }
    }
    let mut restore = vec!["activeDeadlineSeconds", "schedulingGates", "tolerations"];
    let old_grace = os
        .get("terminationGracePeriodSeconds")
        .and_then(Value::as_i64);
    if old_grace.is_some_and(|g| g < 0)
        && munged
            .get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            == Some(1)
    {
        restore.push("terminationGracePeriodSeconds");
    }
    if !list_at(os, "schedulingGates").is_empty() {
        // A gated pod may gain node selector entries and change its node affinity.
        let old_selector = os.get("nodeSelector").and_then(Value::as_object);
        let new_selector = ns.get("nodeSelector").and_then(Value::as_object);
        if let Some(o) = old_selector {
            if o.iter()
                .any(|(k, v)| new_selector.and_then(|n| n.get(k)) != Some(v))
            {
                errs.push(FieldError::invalid(
                    &spec_path.child("nodeSelector"),
                    ns.get("nodeSelector").cloned().unwrap_or(Value::Null),
                    "only additions to spec.nodeSelector are allowed (no mutations or deletions)",
                ));
            }
        }
        restore.push("nodeSelector");
        if os
            .pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution")
            .is_none()
        {
            let old_affinity = os.pointer("/affinity/nodeAffinity").cloned();
            if let Some(m) = munged.as_object_mut() {
                let a = m.entry("affinity").or_insert_with(|| json!({}));
                match (a.as_object_mut(), old_affinity) {
                    (Some(a), Some(na)) => {
                        a.insert("nodeAffinity".into(), na);
                    }
                    (Some(a), None) => {
                        a.remove("nodeAffinity");
                    }
                    _ => {}
                }
                if m.get("affinity")
                    .and_then(Value::as_object)
                    .is_some_and(|a| a.is_empty())
                    && os.get("affinity").is_none()
                {
                    m.remove("affinity");
                }
            }
        }
    }
    if let Some(m) = munged.as_object_mut() {
        for k in restore {
            match os.get(k) {
                Some(v) => m.insert(k.to_owned(), v.clone()),
                None => m.remove(k),
            };
        }
    }
    if &munged != os {
        errs.push(FieldError::forbidden(
            &spec_path,
            format!("pod updates may not change fields other than {UPDATABLE_POD_SPEC_FIELDS}"),
        ));
    }
    errs
}

pub(crate) fn validate_pod_spec(spec: &Value, spec_path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    let mut volumes = std::collections::BTreeSet::new();
    for (i, v) in list_at(spec, "volumes").iter().enumerate() {
        let sources = v.pointer("/projected/sources").and_then(Value::as_array);
        for (j, source) in sources.into_iter().flatten().enumerate() {
            if let Some(pc) = source.get("podCertificate") {
                let p = spec_path
                    .child("volumes")
                    .index(i)
                    .child("projected")
                    .child("sources")
                    .index(j)
                    .child("podCertificate");
                super::podcertificates::validate_projection(pc, &p, &mut errs);
            }
        }
        let path = spec_path.child("volumes").index(i).child("name");
        let name = str_at(v, "/name");
        if name.is_empty() {
            errs.push(FieldError::required(&path, ""));
        } else {
            for msg in is_dns1123_label(name) {
                errs.push(FieldError::invalid(&path, name.to_owned(), msg));
            }
            if !volumes.insert(name.to_owned()) {
                errs.push(FieldError::duplicate(&path, name.to_owned()));
            }
        }
    }
    if list_at(spec, "containers").is_empty() {
        errs.push(FieldError::required(&spec_path.child("containers"), ""));
    }
    for list in CONTAINER_LISTS {
        for (i, c) in list_at(spec, list).iter().enumerate() {
            let path = spec_path.child(list).index(i);
            let name = str_at(c, "/name");
            if name.is_empty() {
                errs.push(FieldError::required(&path.child("name"), ""));
            } else {
                for msg in is_dns1123_label(name) {
                    errs.push(FieldError::invalid(
                        &path.child("name"),
                        name.to_owned(),
                        msg,
                    ));
                }
                if !names.insert(name.to_owned()) {
                    errs.push(FieldError::duplicate(&path.child("name"), name.to_owned()));
                }
            }
            if str_at(c, "/image").trim().is_empty() {
                errs.push(FieldError::required(&path.child("image"), ""));
            }
            if let Some(ports) = c.get("ports").and_then(Value::as_array) {
                for (j, p) in ports.iter().enumerate() {
                    let pp = path.child("ports").index(j);
                    match p.get("containerPort").and_then(Value::as_i64).unwrap_or(0) {
                        0 => errs.push(FieldError::required(&pp.child("containerPort"), "")),
                        v => port_range(&mut errs, &pp.child("containerPort"), v),
                    }
                    if let Some(h) = p.get("hostPort").and_then(Value::as_i64) {
                        if h != 0 {
                            port_range(&mut errs, &pp.child("hostPort"), h);
                        }
                    }
                    let proto = str_at(p, "/protocol");
                    if !matches!(proto, "TCP" | "UDP" | "SCTP") {
                        errs.push(FieldError::not_supported(
                            &pp.child("protocol"),
                            proto.to_owned(),
                            &["SCTP", "TCP", "UDP"],
                        ));
                    }
                }
            }
            for (j, e) in list_at(c, "env").iter().enumerate() {
                let ep = path.child("env").index(j).child("name");
                let name = str_at(e, "/name");
                if name.is_empty() {
                    errs.push(FieldError::required(&ep, ""));
                } else {
                    // RelaxedEnvironmentVariableValidation (GA): printable ASCII but '='.
                    if name
                        .chars()
                        .any(|ch| !(' '..='~').contains(&ch) || ch == '=')
                    {
                        errs.push(FieldError::invalid(
                            &ep,
                            name.to_owned(),
                            "a valid environment variable name must consist only of printable ASCII characters other than '='",
                        ));
                    }
                }
            }
            for (j, m) in list_at(c, "volumeMounts").iter().enumerate() {
                let mp = path.child("volumeMounts").index(j);
                let name = str_at(m, "/name");
                if name.is_empty() {
                    errs.push(FieldError::required(&mp.child("name"), ""));
                } else if !volumes.contains(name) {
                    errs.push(FieldError::not_found(&mp.child("name"), name.to_owned()));
                }
                if str_at(m, "/mountPath").is_empty() {
                    errs.push(FieldError::required(&mp.child("mountPath"), ""));
                }
            }
            // Requests may not exceed limits.
            let limits = c
                .pointer("/resources/limits")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            if let Some(requests) = c.pointer("/resources/requests").and_then(Value::as_object) {
                for (k, v) in requests {
                    let Some(l) = limits.get(k) else { continue };
                    if let (Some(rq), Some(lq)) = (quantity(v), quantity(l)) {
                        if rq > lq + 1e-12 {
                            let shown = |q: &Value| match q {
                                Value::String(s) => s.clone(),
                                other => other.to_string(),
                            };
                            errs.push(FieldError::invalid(
                                &path.child("resources").child("requests"),
                                shown(v),
                                format!("must be less than or equal to {k} limit of {}", shown(l)),
                            ));
                        }
                    }
                }
            }
        }
    }
    let rp = str_at(spec, "/restartPolicy");
    if !matches!(rp, "Always" | "OnFailure" | "Never") {
        errs.push(FieldError::not_supported(
            &spec_path.child("restartPolicy"),
            rp.to_owned(),
            &["Always", "OnFailure", "Never"],
        ));
    }
    let dns = str_at(spec, "/dnsPolicy");
    if !matches!(
        dns,
        "ClusterFirstWithHostNet" | "ClusterFirst" | "Default" | "None"
    ) {
        errs.push(FieldError::not_supported(
            &spec_path.child("dnsPolicy"),
            dns.to_owned(),
            &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
        ));
    }
    errs.extend(validate_sysctls(
        spec,
        &spec_path.child("securityContext").child("sysctls"),
    ));
    errs
}

/// Upstream's validateSysctls for a new pod: names are sysctl names, given once, and the
/// ones namespaced by the network or IPC namespace are refused when the pod shares it
/// with the host.
fn validate_sysctls(spec: &Value, path: &Path) -> Vec<FieldError> {
    const MAX_LEN: usize = 253;
    let segment_ok = |seg: &str| {
        let b = seg.as_bytes();
        let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        match (b.first(), b.last()) {
            (Some(f), Some(l)) => {
                alnum(f) && alnum(l) && b.iter().all(|c| alnum(c) || *c == b'-' || *c == b'_')
            }
            _ => false,
        }
    };
    let mut errs = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let sysctls = spec
        .pointer("/securityContext/sysctls")
        .and_then(Value::as_array);
    for (i, s) in sysctls.map(Vec::as_slice).unwrap_or(&[]).iter().enumerate() {
        let p = path.index(i).child("name");
        let name = str_at(s, "/name");
        if name.is_empty() {
            errs.push(FieldError::required(&p, ""));
        } else if name.len() > MAX_LEN || !name.split(['.', '/']).all(segment_ok) {
            errs.push(FieldError::invalid(
                &p,
                name.to_owned(),
                format!("must have at most {MAX_LEN} characters and match regex ^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$"),
            ));
        } else if !seen.insert(name) {
            errs.push(FieldError::duplicate(&p, name.to_owned()));
        }
        // The namespace a sysctl belongs to (component-helpers' GetNamespace), with
        // slashes read as dots.
        let dotted = name.replace('/', ".");
        let ipc = dotted == "kernel.sem"
            || ["kernel.shm", "kernel.msg", "fs.mqueue."]
                .iter()
                .any(|x| dotted.starts_with(x));
        if spec.get("hostNetwork") == Some(&json!(true)) && dotted.starts_with("net.") {
            errs.push(FieldError::invalid(
                &p,
                name.to_owned(),
                "may not be specified when 'hostNetwork' is true",
            ));
        } else if spec.get("hostIPC") == Some(&json!(true)) && ipc {
            errs.push(FieldError::invalid(
                &p,
                name.to_owned(),
                "may not be specified when 'hostIPC' is true",
            ));
        }
    }
    errs
}

struct ServiceAccounts;

impl Strategy for ServiceAccounts {}

/// The pod `current` bound to the node a Binding names (spec.nodeName, the Binding's
/// annotations, and the PodScheduled condition), or upstream's error.
fn bind(name: &str, binding: &Value, current: &Value) -> Result<Value, ApiError> {
    let gr = GroupResource::new("", "pods/binding");
    if str_at(binding, "/metadata/name") != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Binding object",
        ));
    }
    let target = Path::new("target");
    let mut errs = Vec::new();
    let kind = str_at(binding, "/target/kind");
    if !kind.is_empty() && kind != "Node" {
        errs.push(FieldError::not_supported(
            &target.child("kind"),
            kind,
            &["Node", "<empty>"],
        ));
    }
    let node = str_at(binding, "/target/name");
    if node.is_empty() {
        errs.push(FieldError::required(&target.child("name"), ""));
    }
    if !errs.is_empty() {
        // Upstream answers these as a bare internal error carrying the aggregate.
        let list: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        return Err(ApiError {
            code: 500,
            reason: "",
            message: format!("[{}]", list.join(", ")),
            details: None,
        });
    }
    if current.pointer("/metadata/deletionTimestamp").is_some() {
        return Err(ApiError::conflict(
            &gr,
            name,
            &format!("pod {name} is being deleted, cannot be assigned to a host"),
        ));
    }
    let assigned = str_at(current, "/spec/nodeName");
    if !assigned.is_empty() {
        return Err(ApiError::conflict(
            &gr,
            name,
            &format!("pod {name} is already assigned to node {assigned:?}"),
        ));
    }
    if current
        .pointer("/spec/schedulingGates")
        .and_then(Value::as_array)
        .is_some_and(|g| !g.is_empty())
    {
        return Err(ApiError::conflict(
            &gr,
            name,
            &format!("pod {name} has non-empty .spec.schedulingGates"),
        ));
    }
    let mut pod = current.clone();
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("nodeName".into(), json!(node));
    }
    if let Some(annotations) = binding
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        if let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
            let target = meta.entry("annotations").or_insert_with(|| json!({}));
            if let Some(t) = target.as_object_mut() {
                for (k, v) in annotations {
                    t.insert(k.clone(), v.clone());
                }
            }
        }
    }
    set_pod_scheduled(&mut pod);
    // The pod is placed: a nomination (from preemption) no longer applies.
    if let Some(status) = pod.get_mut("status").and_then(Value::as_object_mut) {
        status.remove("nominatedNodeName");
    }
    Ok(pod)
}

/// Sets the PodScheduled condition to True (its transition time moves only if it changed).
fn set_pod_scheduled(pod: &mut Value) {
    let Some(obj) = pod.as_object_mut() else {
        return;
    };
    let status = obj.entry("status").or_insert_with(|| json!({}));
    let Some(status) = status.as_object_mut() else {
        return;
    };
    let conditions = status.entry("conditions").or_insert_with(|| json!([]));
    let Some(conditions) = conditions.as_array_mut() else {
        return;
    };
    let now = crate::time::now_rfc3339();
    match conditions
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("PodScheduled"))
    {
        Some(c) if c.get("status").and_then(Value::as_str) == Some("True") => {}
        Some(c) => {
            c["status"] = json!("True");
            c["lastTransitionTime"] = json!(now);
            if let Some(o) = c.as_object_mut() {
                o.remove("reason");
                o.remove("message");
            }
        }
        None => conditions.push(json!({
            "type": "PodScheduled",
            "status": "True",
            "lastProbeTime": null,
            "lastTransitionTime": now,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A running pod as stored: defaulted, with the default tolerations.
    fn stored_pod() -> Value {
        let mut pod = json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [{"name": "c", "image": "busybox"}],
                "initContainers": [{"name": "i", "image": "busybox"}],
                "schedulingGates": [{"name": "example.com/a"}, {"name": "example.com/b"}],
                "nodeSelector": {"disk": "ssd"},
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
            },
        });
        Pods.prepare_create(&mut pod);
        Pods.default(&mut pod);
        default_tolerations(&mut pod["spec"]);
        pod
    }

    fn update_errors(change: impl FnOnce(&mut Value)) -> Vec<String> {
        let old = stored_pod();
        let mut new = old.clone();
        change(&mut new);
        Pods.prepare_update(&mut new, &old);
        Pods.validate_update(&new, &old)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn pod_updates_allow_what_upstream_allows() {
        // Replacing the tolerations: admission puts the default ones back, so this adds one.
        let errs = update_errors(|p| {
            p["spec"]["tolerations"] = json!([
                {"key": "k", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "foo", "operator": "Equal", "value": "bar", "effect": "NoSchedule"},
            ])
        });
        assert_eq!(errs, Vec::<String>::new());
        let errs = update_errors(|p| p["spec"]["tolerations"][0]["tolerationSeconds"] = json!(60));
        assert_eq!(errs, Vec::<String>::new());
        let errs = update_errors(|p| {
            p["spec"]["containers"][0]["image"] = json!("nginx");
            p["spec"]["initContainers"][0]["image"] = json!("pause");
            p["spec"]["activeDeadlineSeconds"] = json!(5000);
            p["spec"]["schedulingGates"] = json!([{"name": "example.com/b"}]);
            p["spec"]["nodeSelector"]["zone"] = json!("a");
        });
        assert_eq!(errs, Vec::<String>::new());
    }

    #[test]
    fn pod_updates_refuse_what_upstream_refuses() {
        let errs = update_errors(|p| p["spec"]["tolerations"][0]["effect"] = json!("NoExecute"));
        assert_eq!(
            errs,
            ["spec.tolerations: Forbidden: existing toleration can not be modified except its tolerationSeconds"]
        );
        let errs = update_errors(|p| {
            p["spec"]["schedulingGates"] =
                json!([{"name": "example.com/a"}, {"name": "example.com/c"}])
        });
        assert_eq!(
            errs,
            ["spec.schedulingGates[1].name: Forbidden: only deletion is allowed, but found new scheduling gate 'example.com/c'"]
        );
        let errs = update_errors(|p| p["spec"]["nodeSelector"] = json!({"disk": "hdd"}));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].contains("only additions to spec.nodeSelector are allowed"),
            "{errs:?}"
        );
        let errs = update_errors(|p| p["spec"]["containers"][0]["name"] = json!("d"));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].starts_with("spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`"), "{errs:?}");
        let errs = update_errors(|p| {
            if let Some(c) = p["spec"]["containers"].as_array_mut() {
                c.push(json!({"name": "e", "image": "x"}));
            }
        });
        assert_eq!(
            errs,
            ["spec.containers: Forbidden: pod updates may not add or remove containers"]
        );
    }

    #[test]
    fn sysctl_names_are_checked_as_upstream() {
        let spec = json!({"securityContext": {"sysctls": [
            {"name": "foo-", "value": "bar"},
            {"name": "kernel.shmmax", "value": "1"},
            {"name": "safe-and-unsafe", "value": "1"},
            {"name": "bar..", "value": "42"},
            {"name": "net/ipv4/ip_forward", "value": "1"},
            {"name": "kernel.shmmax", "value": "2"},
        ]}, "hostNetwork": true});
        let errs: Vec<String> = validate_sysctls(&spec, &Path::new("spec.securityContext.sysctls"))
            .iter()
            .map(ToString::to_string)
            .collect();
        let regex = r"must have at most 253 characters and match regex ^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$";
        assert_eq!(
            errs,
            [
                format!(r#"spec.securityContext.sysctls[0].name: Invalid value: "foo-": {regex}"#),
                format!(r#"spec.securityContext.sysctls[3].name: Invalid value: "bar..": {regex}"#),
                r#"spec.securityContext.sysctls[4].name: Invalid value: "net/ipv4/ip_forward": may not be specified when 'hostNetwork' is true"#.to_owned(),
                r#"spec.securityContext.sysctls[5].name: Duplicate value: "kernel.shmmax""#.to_owned(),
            ]
        );
    }

    #[test]
    fn active_deadline_only_goes_down() {
        let old = {
            let mut p = stored_pod();
            p["spec"]["activeDeadlineSeconds"] = json!(100);
            p
        };
        let mut new = old.clone();
        new["spec"]["activeDeadlineSeconds"] = json!(200);
        let errs: Vec<String> = Pods
            .validate_update(&new, &old)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(errs, ["spec.activeDeadlineSeconds: Invalid value: 200: must be less than or equal to previous value"]);
        new["spec"]
            .as_object_mut()
            .map(|s| s.remove("activeDeadlineSeconds"));
        let errs: Vec<String> = Pods
            .validate_update(&new, &old)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(errs, ["spec.activeDeadlineSeconds: Invalid value: \"null\": must not update from a positive integer to nil value"]);
    }

    fn pull_policy(image: &str) -> String {
        let mut c = json!({"name": "c", "image": image});
        default_container(&mut c);
        c["imagePullPolicy"].as_str().unwrap_or("").to_owned()
    }

    #[test]
    fn image_pull_policy_follows_the_tag() {
        assert_eq!(pull_policy("nginx"), "Always");
        assert_eq!(pull_policy("nginx:latest"), "Always");
        assert_eq!(pull_policy("registry:5000/nginx"), "Always");
        assert_eq!(pull_policy("registry:5000/nginx:1.27"), "IfNotPresent");
        assert_eq!(pull_policy("nginx@sha256:abcd"), "IfNotPresent");
    }

    fn pod(resources: Value) -> Value {
        let mut c = json!({"name": "c", "image": "x", "resources": resources});
        default_container(&mut c);
        default_requests(&mut c);
        json!({"spec": {"containers": [c]}})
    }

    #[test]
    fn qos_classes() {
        assert_eq!(qos_class(&pod(json!({}))), "BestEffort");
        assert_eq!(
            qos_class(&pod(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))),
            "Guaranteed"
        );
        assert_eq!(
            qos_class(&pod(json!({
                "requests": {"cpu": "1000m", "memory": "1024Mi"},
                "limits": {"cpu": "1", "memory": "1Gi"},
            }))),
            "Guaranteed"
        );
        assert_eq!(
            qos_class(&pod(json!({"requests": {"cpu": "100m"}}))),
            "Burstable"
        );
        assert_eq!(
            qos_class(&pod(json!({
                "requests": {"cpu": "100m", "memory": "64Mi"},
                "limits": {"cpu": "200m", "memory": "64Mi"},
            }))),
            "Burstable"
        );
        // Only cpu given, equal: memory is best effort, so the mix is Burstable.
        assert_eq!(
            qos_class(&pod(json!({"limits": {"cpu": "1"}}))),
            "Burstable"
        );
        // One Guaranteed and one BestEffort container make a Burstable pod.
        let mut p = pod(json!({"limits": {"cpu": "1", "memory": "1Gi"}}));
        p["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "d", "image": "x"}));
        assert_eq!(qos_class(&p), "Burstable");
        // Pod-level resources decide (a missing request is its limit, as defaulted).
        let mut p = pod(json!({}));
        p["spec"]["resources"] = json!({"limits": {"cpu": "1", "memory": "1Gi"}});
        assert_eq!(qos_class(&p), "Guaranteed");
        p["spec"]["resources"] = json!({"requests": {"cpu": "1"}});
        assert_eq!(qos_class(&p), "Burstable");
    }
}
