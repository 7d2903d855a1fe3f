//! What the kubelet puts into a container's config: its environment (literal values,
//! `$(VAR)` references, the downward API's fields and resources, ConfigMap and Secret
//! keys, `envFrom`) and its command line with `$(VAR)` expanded. ConfigMaps and Secrets
//! are read from the API (as the node, so the Node authorizer applies) before the pod's
//! containers are created, and travel with the pod under [`SOURCES`].

use std::collections::BTreeMap;

use base64::Engine;
use kube::Client;
use serde_json::{json, Value};

use crate::expansion;
use kumo_cri::{ContainerConfig, Files, Mount, Source};

/// Where a prepared pod carries what its environment refers to: `{"configmaps": {name:
/// data}, "secrets": {name: data}, "allocatable": {cpu, memory}, "hostIP": ip,
/// "clusterDNS": [ip]}`.
pub const SOURCES: &str = "kumo.sources";

/// The sources' key of the ConfigMaps' binaryData (name → key → value).
const BINARY_DATA: &str = "configmapBinaryData";

/// A base64 value as the sources keep it: text as a string, other bytes as
/// `{"bytes": base64}`; undecodable base64 is empty.
fn stored_bytes(b64: &str) -> Value {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap_or_default();
    match String::from_utf8(bytes) {
        Ok(text) => json!(text),
        Err(_) => json!({ "bytes": b64 }),
    }
}

/// The bytes of a sources value (a string, or `{"bytes": base64}`).
fn value_bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::String(s) => Some(s.clone().into_bytes()),
        _ => v
            .get("bytes")
            .and_then(Value::as_str)
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok()),
    }
}

/// The text of a sources value, for an environment variable.
fn value_text(v: &Value) -> Option<String> {
    value_bytes(v).map(|b| String::from_utf8_lossy(&b).into_owned())
}

pub(crate) fn str_at(v: &Value, p: &str) -> String {
    v.pointer(p)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// The names of the ConfigMaps and Secrets the pod's containers take environment from.
fn referenced(pod: &Value) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    for list in ["initContainers", "containers"] {
        for c in pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
                if let Some(n) = e
                    .pointer("/valueFrom/configMapKeyRef/name")
                    .and_then(Value::as_str)
                {
                    cms.push(n.to_owned());
                }
                if let Some(n) = e
                    .pointer("/valueFrom/secretKeyRef/name")
                    .and_then(Value::as_str)
                {
                    secrets.push(n.to_owned());
                }
            }
            for e in c
                .get("envFrom")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(n) = e.pointer("/configMapRef/name").and_then(Value::as_str) {
                    cms.push(n.to_owned());
                }
                if let Some(n) = e.pointer("/secretRef/name").and_then(Value::as_str) {
                    secrets.push(n.to_owned());
                }
            }
        }
    }
    // The registry credentials the pod's images are pulled with.
    for s in pod
        .pointer("/spec/imagePullSecrets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(n) = s.get("name").and_then(Value::as_str) {
            secrets.push(n.to_owned());
        }
    }
    // ConfigMap and Secret volumes, the service account's projected one too (its
    // `kube-root-ca.crt`).
    for v in pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let projected = v
            .pointer("/projected/sources")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for src in std::iter::once(v).chain(projected.iter()) {
            if let Some(n) = src.pointer("/configMap/name").and_then(Value::as_str) {
                cms.push(n.to_owned());
            }
            for p in ["/secret/secretName", "/secret/name"] {
                if let Some(n) = src.pointer(p).and_then(Value::as_str) {
                    secrets.push(n.to_owned());
                }
            }
        }
    }
    cms.sort();
    cms.dedup();
    secrets.sort();
    secrets.dedup();
    (cms, secrets)
}

/// The projected service account tokens of `pod`'s volumes, keyed `<volume>/<path>`:
/// each requested as the kubelet's token manager does (TokenRequest bound to the pod, with
/// the source's audience and expiration), and reused from `previous` sources until 80 %
/// of its lifetime has passed. A token that cannot be had is left out.
async fn tokens(
    client: &Client,
    pod: &Value,
    previous: Option<&Value>,
) -> serde_json::Map<String, Value> {
    let ns = str_at(pod, "/metadata/namespace");
    let sa = match str_at(pod, "/spec/serviceAccountName") {
        s if s.is_empty() => "default".to_owned(),
        s => s,
    };
    let now = unix_now();
    let mut out = serde_json::Map::new();
    for v in pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for src in v
            .pointer("/projected/sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(t) = src.get("serviceAccountToken") else {
                continue;
            };
            let key = format!("{}/{}", str_at(v, "/name"), str_at(t, "/path"));
            let kept = previous
                .and_then(|p| {
                    p.pointer(&format!(
                        "/tokens/{}",
                        key.replace('~', "~0").replace('/', "~1")
                    ))
                })
                .filter(|k| k["refreshAt"].as_u64().is_some_and(|r| r > now));
            if let Some(k) = kept {
                out.insert(key, k.clone());
                continue;
            }
            let ttl = t
                .get("expirationSeconds")
                .and_then(Value::as_u64)
                .unwrap_or(3600);
            let mut spec = json!({
                "expirationSeconds": ttl,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                    "name": str_at(pod, "/metadata/name"), "uid": str_at(pod, "/metadata/uid")},
            });
            let audience = str_at(t, "/audience");
            if !audience.is_empty() {
                spec["audiences"] = json!([audience]);
            }
            let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
            let Ok(req) = http::Request::post(format!(
                "/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"
            ))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.to_string().into_bytes()) else {
                continue;
            };
            match client.request::<Value>(req).await {
                Ok(tr) => {
                    let token = str_at(&tr, "/status/token");
                    out.insert(
                        key,
                        json!({"token": token, "refreshAt": now + ttl * 8 / 10}),
                    );
                }
                Err(e) => {
                    tracing::warn!(pod = %str_at(pod, "/metadata/name"), "token request: {e}")
                }
            }
        }
    }
    out
}

/// The cluster DNS the kubelet gave `pod` under [`SOURCES`] (its default without).
fn cluster_dns(pod: &Value) -> Vec<String> {
    match pod
        .pointer(&format!("/{SOURCES}/clusterDNS"))
        .and_then(Value::as_array)
    {
        Some(ips) => ips
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        None => vec![crate::resolv::CLUSTER_DNS.to_owned()],
    }
}

/// Reads what `pod`'s environment refers to, to be put under [`SOURCES`]; `previous`:
/// what was read for it before (tokens are reused from it while fresh).
pub async fn sources(
    client: &Client,
    pod: &Value,
    previous: Option<&Value>,
    host_ip: &str,
    cpu: &str,
    memory: &str,
) -> Value {
    let ns = str_at(pod, "/metadata/namespace");
    let (cms, secrets) = referenced(pod);
    let mut sources = json!({
        "fetchedAt": unix_now(),
        "configmaps": {},
        "secrets": {},
        BINARY_DATA: {},
        "allocatable": {"cpu": cpu, "memory": memory},
        "hostIP": host_ip,
    });
    // Services become environment variables (enableServiceLinks, default true); the
    // `kubernetes` Service of `default` always does.
    let links = pod
        .pointer("/spec/enableServiceLinks")
        .and_then(Value::as_bool)
        != Some(false);
    let mut services = Vec::new();
    let mut lists = vec![("default".to_owned(), true)];
    if links {
        lists.insert(0, (ns.clone(), false));
    }
    for (list_ns, master_only) in lists {
        // From the API server's watch cache (`resourceVersion=0`): upstream's kubelet reads
        // Services from an informer, which is no more current than that.
        let Ok(req) = http::Request::get(format!(
            "/api/v1/namespaces/{list_ns}/services?resourceVersion=0"
        ))
        .body(Vec::new()) else {
            continue;
        };
        if let Ok(list) = client.request::<Value>(req).await {
            for svc in list["items"].as_array().into_iter().flatten() {
                let name = str_at(svc, "/metadata/name");
                if master_only && (name != "kubernetes" || (links && ns == "default")) {
                    continue;
                }
                services.push(svc.clone());
            }
        }
    }
    sources["serviceEnv"] = json!(service_env(&services));
    sources["tokens"] = Value::Object(tokens(client, pod, previous).await);
    sources["trustBundles"] = Value::Object(crate::trustbundle::fetch(client, pod).await);
    sources["podCertificates"] = Value::Object(crate::podcertificate::fetch(client, pod).await);
    // Refreshes read the API server's watch cache (`resourceVersion=0`): upstream's kubelet
    // watches the objects it mounts instead of reading them from etcd every few seconds.
    // The first read is a quorum read, so a pod made right after its ConfigMap finds it.
    let query = if previous.is_some() {
        "?resourceVersion=0"
    } else {
        ""
    };
    for (kind, names) in [("configmaps", cms), ("secrets", secrets)] {
        for name in names {
            let req = http::Request::get(format!("/api/v1/namespaces/{ns}/{kind}/{name}{query}"))
                .body(Vec::new());
            let Ok(req) = req else { continue };
            if let Ok(obj) = client.request::<Value>(req).await {
                let mut data = obj.get("data").cloned().unwrap_or(json!({}));
                // A Secret's values are bytes: text as a string, anything else as
                // `{"bytes": base64}` (files get the bytes; variables the text, as Go's
                // string(bytes) gives them).
                if kind == "secrets" {
                    if let Some(m) = data.as_object_mut() {
                        for v in m.values_mut() {
                            *v = stored_bytes(v.as_str().unwrap_or(""));
                        }
                    }
                }
                // A ConfigMap's binaryData shows in volumes only, never in variables.
                if let Some(bin) = obj.get("binaryData").filter(|b| b.is_object()) {
                    let mut bin = bin.clone();
                    for v in bin.as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
                        *v = stored_bytes(v.as_str().unwrap_or(""));
                    }
                    sources[BINARY_DATA][&name] = bin;
                }
                sources[kind][&name] = data;
            }
        }
    }
    sources
}

/// The environment variables of Services, as the kubelet makes them (`<NAME>_SERVICE_HOST`
/// and the Docker link variables).
fn service_env(services: &[Value]) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for svc in services {
        let ip = str_at(svc, "/spec/clusterIP");
        if ip.is_empty() || ip == "None" {
            continue;
        }
        let name = str_at(svc, "/metadata/name")
            .to_uppercase()
            .replace('-', "_");
        let ports: Vec<&Value> = svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .map(|p| p.iter().collect())
            .unwrap_or_default();
        let Some(first) = ports.first() else { continue };
        env.push((format!("{name}_SERVICE_HOST"), ip.clone()));
        env.push((format!("{name}_SERVICE_PORT"), first["port"].to_string()));
        for p in &ports {
            let pname = p["name"].as_str().unwrap_or("");
            if !pname.is_empty() {
                env.push((
                    format!(
                        "{name}_SERVICE_PORT_{}",
                        pname.to_uppercase().replace('-', "_")
                    ),
                    p["port"].to_string(),
                ));
            }
        }
        let proto = |p: &Value| p["protocol"].as_str().unwrap_or("TCP").to_owned();
        let url = |p: &Value| format!("{}://{ip}:{}", proto(p).to_lowercase(), p["port"]);
        env.push((format!("{name}_PORT"), url(first)));
        for p in &ports {
            let prefix = format!("{name}_PORT_{}_{}", p["port"], proto(p).to_uppercase());
            env.push((prefix.clone(), url(p)));
            env.push((format!("{prefix}_PROTO"), proto(p).to_lowercase()));
            env.push((format!("{prefix}_PORT"), p["port"].to_string()));
            env.push((format!("{prefix}_ADDR"), ip.clone()));
        }
    }
    env
}

/// The volumes of `pod` (with its sources) that cannot be set up, with upstream's reason:
/// a ConfigMap, Secret or ClusterTrustBundle that a non-optional volume or projection
/// refers to and that does not exist. The kubelet starts no container until there are
/// none (the pod stays ContainerCreating, with `FailedMount` events).
pub fn mount_failures(pod: &Value) -> Vec<(String, String)> {
    mount_failures_with(pod, pod.get(SOURCES))
}

/// [`mount_failures`] of `pod` with `sources`.
fn mount_failures_with(pod: &Value, sources: Option<&Value>) -> Vec<(String, String)> {
    let optional = |v: &Value| v.get("optional").and_then(Value::as_bool) == Some(true);
    // A ConfigMap or Secret reference (`name_key` names it) that is required and missing.
    let missing = |v: Option<&Value>, what: &str, kind: &str, name_key: &str| {
        let v = v.filter(|v| !optional(v))?;
        let name = str_at(v, name_key);
        let found = sources
            .and_then(|s| s.get(kind))
            .and_then(|m| m.get(&name))
            .is_some();
        (!found).then(|| format!("{what} \"{name}\" not found"))
    };
    let mut out = Vec::new();
    for vol in pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let vname = str_at(vol, "/name");
        let mut why = Vec::new();
        // A podCertificate projection waits for its certificate (or was refused one).
        for (i, src) in vol
            .pointer("/projected/sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if src.get("podCertificate").is_none() {
                continue;
            }
            let entry = sources
                .and_then(|s| s.get("podCertificates"))
                .and_then(|m| m.get(crate::podcertificate::key(&vname, i)));
            match entry {
                Some(e) if e.get("key").is_some() => {}
                Some(e) => why.push(str_at(e, "/error")),
                None => why.push("credential bundle is not issued yet".to_owned()),
            }
        }
        why.extend(missing(
            vol.get("configMap"),
            "configmap",
            "configmaps",
            "/name",
        ));
        why.extend(missing(
            vol.get("secret"),
            "secret",
            "secrets",
            "/secretName",
        ));
        for src in vol
            .pointer("/projected/sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            why.extend(missing(
                src.get("configMap"),
                "configmap",
                "configmaps",
                "/name",
            ));
            why.extend(missing(src.get("secret"), "secret", "secrets", "/name"));
            if let Some(ctb) = src.get("clusterTrustBundle").filter(|c| !optional(c)) {
                if crate::trustbundle::content(sources, ctb).is_empty() {
                    why.push(match ctb.get("name").and_then(Value::as_str) {
                        Some(n) => {
                            format!("clustertrustbundle.certificates.k8s.io \"{n}\" not found")
                        }
                        None => "combined trust bundle is empty".to_owned(),
                    });
                }
            }
        }
        let why = match why.len() {
            0 => None,
            1 => Some(why.remove(0)),
            _ => Some(format!("[{}]", why.join(", "))),
        };
        if let Some(why) = why {
            out.push((
                vname.clone(),
                format!("MountVolume.SetUp failed for volume \"{vname}\" : {why}"),
            ));
        }
        // A persistent volume its driver could not mount says how itself.
        if let Some(message) = disk_entry(sources, &vname)
            .and_then(|e| e.get("error"))
            .and_then(Value::as_str)
        {
            out.push((vname, message.to_owned()));
        }
    }
    out
}

/// Whether `vol` is a persistent volume (a claim, or a generic ephemeral volume's).
fn is_persistent(vol: &Value) -> bool {
    vol.get("persistentVolumeClaim").is_some() || vol.get("ephemeral").is_some()
}

/// What the volume manager said of the pod's persistent volume `name` (see
/// [`crate::csi::Volumes::mount`]).
fn disk_entry<'a>(sources: Option<&'a Value>, name: &str) -> Option<&'a Value> {
    sources?.get(crate::csi::DISKS)?.get(name)
}

/// Whether a persistent volume of the pod is not mounted yet (its claim not bound, its
/// volume not attached): its containers wait, without an event.
pub fn mounts_pending(pod: &Value) -> bool {
    mounts_pending_with(pod, pod.get(SOURCES))
}

fn mounts_pending_with(pod: &Value, sources: Option<&Value>) -> bool {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| is_persistent(v))
        .any(|v| {
            disk_entry(sources, &str_at(v, "/name")).is_none_or(|e| {
                e.get("disk").is_none() && e.get("hostPath").is_none() && e.get("error").is_none()
            })
        })
}

/// `pod` with its sources.
pub fn with_sources(pod: &Value, sources: &Value) -> Value {
    let mut pod = pod.clone();
    pod[SOURCES] = sources.clone();
    pod
}

/// A quantity as a number (`1250m` → 1.25, `64Mi` → 67108864).
fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(q.len());
    let (n, suffix) = q.split_at(split);
    let n: f64 = n.parse().ok()?;
    let m = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => return None,
    };
    Some(n * m)
}

/// A resourceFieldRef's value: the container's limit or request (a limit defaults to the
/// node's allocatable, a request to the limit), divided by the divisor, rounded up.
fn resource_field(pod: &Value, spec: &Value, r: &Value) -> String {
    let resource = str_at(r, "/resource");
    let container = match r.get("containerName").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["name"] == n))
            .unwrap_or(spec),
        _ => spec,
    };
    let Some((kind, name)) = resource.split_once('.') else {
        return String::new();
    };
    let allocatable = pod
        .pointer(&format!("/{SOURCES}/allocatable/{name}"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_default();
    let limit = container
        .pointer(&format!("/resources/limits/{name}"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let value = match kind {
        "limits" => limit.unwrap_or(allocatable),
        _ => container
            .pointer(&format!("/resources/requests/{name}"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or(limit)
            .unwrap_or_else(|| "0".into()),
    };
    let divisor = r
        .get("divisor")
        .and_then(|d| {
            d.as_str()
                .map(str::to_owned)
                .or_else(|| Some(d.to_string()))
        })
        .and_then(|d| quantity(&d))
        .filter(|d| *d > 0.0)
        .unwrap_or(1.0);
    match quantity(&value) {
        Some(v) => format!("{}", (v / divisor - 1e-9).ceil().max(0.0) as i64),
        None => String::new(),
    }
}

/// The config of container `spec` of a prepared `pod`, as the kubelet builds it, or why it
/// cannot be built (upstream's CreateContainerConfigError message): a required ConfigMap,
/// Secret or key of the environment that is missing, or a bad volume subPath.
pub fn container_config(
    pod: &Value,
    spec: &Value,
    annotations: &BTreeMap<String, String>,
    pod_ip: &str,
    attempt: u32,
) -> Result<ContainerConfig, String> {
    let host_ip = pod
        .pointer(&format!("/{SOURCES}/hostIP"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| str_at(pod, "/status/hostIP"));
    let source =
        |kind: &str, name: &str| pod.pointer(&format!("/{SOURCES}/{kind}/{name}")).cloned();
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
        env.retain(|(n, _)| *n != k);
        env.push((k, v));
    };
    // Service variables first, then envFrom; env entries win over both.
    if let Some(list) = pod
        .pointer(&format!("/{SOURCES}/serviceEnv"))
        .and_then(Value::as_array)
    {
        for kv in list {
            if let (Some(k), Some(v)) = (kv[0].as_str(), kv[1].as_str()) {
                set(&mut env, k.to_owned(), v.to_owned());
            }
        }
    }
    for e in spec
        .get("envFrom")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let prefix = str_at(e, "/prefix");
        let data = if let Some(r) = e.get("configMapRef") {
            required_source(&source, r, "configmaps", "configmap")?
        } else if let Some(r) = e.get("secretRef") {
            required_source(&source, r, "secrets", "secret")?
        } else {
            None
        };
        if let Some(m) = data.as_ref().and_then(Value::as_object) {
            for (k, v) in m {
                set(
                    &mut env,
                    format!("{prefix}{k}"),
                    value_text(v).unwrap_or_default(),
                );
            }
        }
    }
    for e in spec
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = str_at(e, "/name");
        let value = if let Some(v) = e.get("value").and_then(Value::as_str) {
            expansion::expand(v, &env)
        } else if let Some(path) = e
            .pointer("/valueFrom/fieldRef/fieldPath")
            .and_then(Value::as_str)
        {
            match path {
                "metadata.name" => str_at(pod, "/metadata/name"),
                "metadata.namespace" => str_at(pod, "/metadata/namespace"),
                "metadata.uid" => str_at(pod, "/metadata/uid"),
                "spec.nodeName" => str_at(pod, "/spec/nodeName"),
                "spec.serviceAccountName" => str_at(pod, "/spec/serviceAccountName"),
                "status.podIP" | "status.podIPs" => pod_ip.to_owned(),
                "status.hostIP" | "status.hostIPs" => host_ip.clone(),
                p => {
                    let key = p
                        .strip_prefix("metadata.labels['")
                        .map(|k| ("labels", k))
                        .or_else(|| {
                            p.strip_prefix("metadata.annotations['")
                                .map(|k| ("annotations", k))
                        });
                    match key {
                        Some((field, k)) => pod
                            .pointer(&format!("/metadata/{field}"))
                            .and_then(|m| m.get(k.trim_end_matches("']")))
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                        None => String::new(),
                    }
                }
            }
        } else if let Some(r) = e.pointer("/valueFrom/resourceFieldRef") {
            resource_field(pod, spec, r)
        } else if let Some(r) = e.pointer("/valueFrom/configMapKeyRef") {
            match key_ref(pod, &source, r, ("configmaps", "configmap", "ConfigMap"))? {
                Some(v) => v,
                None => continue,
            }
        } else if let Some(r) = e.pointer("/valueFrom/secretKeyRef") {
            match key_ref(pod, &source, r, ("secrets", "secret", "Secret"))? {
                Some(v) => v,
                None => continue,
            }
        } else {
            String::new()
        };
        set(&mut env, name, value);
    }
    let list = |k: &str| -> Vec<String> {
        spec.get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str())
            .map(|a| expansion::expand(a, &env))
            .collect()
    };
    let command = list("command");
    let args = list("args");
    let mut hostname = str_at(pod, "/spec/hostname");
    if hostname.is_empty() {
        hostname = str_at(pod, "/metadata/name");
        hostname.truncate(63);
    }
    let mut mounts = mounts(pod, spec, pod_ip, &host_ip, &env)?;
    if spec
        .pointer("/securityContext/readOnlyRootFilesystem")
        .and_then(Value::as_bool)
        == Some(true)
    {
        mounts.push(Mount {
            path: "/".into(),
            source: Source::Files(BTreeMap::new()),
            read_only: true,
            sub_path: String::new(),
            tmpfs: false,
        });
    }
    let mut files = BTreeMap::new();
    let host_network = pod
        .pointer("/spec/hostNetwork")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    files.insert(
        "/etc/hosts".to_owned(),
        if host_network {
            kumo_cri::NODE_HOSTS.to_owned()
        } else {
            etc_hosts(pod, pod_ip, &hostname)
        },
    );
    // The process's status, for the CPUs it may run on (every CPU of the node: the sim
    // has no CPU manager).
    let cpus = pod
        .pointer(&format!("/{SOURCES}/allocatable/cpu"))
        .and_then(Value::as_str)
        .and_then(kumo_apimachinery::quantity::Quantity::parse)
        .map(|q| (q.milli_value().max(1000) as u64).div_ceil(1000))
        .unwrap_or(1);
    files.insert(
        "/proc/self/status".to_owned(),
        format!(
            "Name:\tsh\nState:\tS (sleeping)\nPid:\t1\nPPid:\t0\nCpus_allowed_list:\t0-{}\n",
            cpus - 1
        ),
    );
    // The pod's sysctls, where `sysctl` reads them; a few namespaced defaults besides.
    for (k, v) in [
        ("kernel.shm_rmid_forced", "0"),
        ("net.ipv4.ip_forward", "1"),
    ] {
        files.insert(
            format!("/proc/sys/{}", k.replace('.', "/")),
            format!("{v}\n"),
        );
    }
    for sc in pod
        .pointer("/spec/securityContext/sysctls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = str_at(sc, "/name").replace('.', "/");
        files.insert(
            format!("/proc/sys/{key}"),
            format!("{}\n", str_at(sc, "/value")),
        );
    }
    files.insert(
        "/etc/resolv.conf".to_owned(),
        crate::resolv::pod_resolv_conf(pod, &cluster_dns(pod)),
    );
    let security = |key: &str| {
        spec.pointer(&format!("/securityContext/{key}"))
            .or_else(|| pod.pointer(&format!("/spec/securityContext/{key}")))
            .and_then(Value::as_i64)
    };
    let user = match (security("runAsUser"), security("runAsGroup")) {
        (Some(u), g) => Some((u, g)),
        (None, Some(g)) => Some((0, Some(g))),
        (None, None) => None,
    };
    let limit = |r: &str| {
        spec.pointer(&format!("/resources/limits/{r}"))
            .and_then(Value::as_str)
            .and_then(kumo_apimachinery::quantity::Quantity::parse)
    };
    let capabilities = |k: &str| -> Vec<String> {
        spec.pointer(&format!("/securityContext/capabilities/{k}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    let spec_flag = |p: &str| spec.pointer(p).and_then(Value::as_bool).unwrap_or(false);
    Ok(ContainerConfig {
        fs_group: pod
            .pointer("/spec/securityContext/fsGroup")
            .and_then(Value::as_i64),
        supplemental_groups: pod
            .pointer("/spec/securityContext/supplementalGroups")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_i64)
            .collect(),
        working_dir: str_at(spec, "/workingDir"),
        read_only_root_filesystem: spec_flag("/securityContext/readOnlyRootFilesystem"),
        capabilities_add: capabilities("add"),
        capabilities_drop: capabilities("drop"),
        stdin: spec_flag("/stdin"),
        stdin_once: spec_flag("/stdinOnce"),
        tty: spec_flag("/tty"),
        user,
        cpu_request_millis: spec
            .pointer("/resources/requests/cpu")
            .and_then(Value::as_str)
            .and_then(kumo_apimachinery::quantity::Quantity::parse)
            .map(|q| q.milli_value().max(0) as u64),
        cpu_limit_millis: limit("cpu").map(|q| q.milli_value().max(0) as u64),
        memory_limit_bytes: limit("memory").map(|q| q.value().max(0) as u64),
        privileged: spec.pointer("/securityContext/privileged") == Some(&Value::Bool(true)),
        no_new_privs: spec.pointer("/securityContext/allowPrivilegeEscalation")
            == Some(&Value::Bool(false)),
        mounts,
        files,
        name: str_at(spec, "/name"),
        image: str_at(spec, "/image"),
        annotations: annotations.clone(),
        command,
        args,
        env,
        hostname,
        pod_ip: pod_ip.to_owned(),
        attempt,
        termination_message_path: str_at(spec, "/terminationMessagePath"),
        fallback_to_logs_on_error: str_at(spec, "/terminationMessagePolicy")
            == "FallbackToLogsOnError",
    })
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Whether `pod` has volumes whose files the kubelet keeps up to date (ConfigMap,
/// Secret, downward API, projected; not the service account's own).
pub fn has_projected_volumes(pod: &Value) -> bool {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|v| {
            !str_at(v, "/name").starts_with("kube-api-access-")
                && ["configMap", "secret", "downwardAPI", "projected"]
                    .iter()
                    .any(|k| v.get(*k).is_some())
        })
}

/// Whether the sources read for `pod` are to be read again: its volumes follow their
/// ConfigMaps and Secrets, re-read every 5 s (every second while one is missing), and a
/// projected token is renewed once 80 % of its lifetime has passed.
pub fn sources_stale(pod: &Value, sources: &Value) -> bool {
    let now = unix_now();
    let token_due = sources["tokens"].as_object().is_some_and(|ts| {
        ts.values()
            .any(|t| t["refreshAt"].as_u64().is_some_and(|r| r <= now))
    });
    let age = now.saturating_sub(sources["fetchedAt"].as_u64().unwrap_or(0));
    token_due
        || (has_projected_volumes(pod) && age >= 5)
        // A volume that cannot be set up is retried every second.
        || (age >= 1
            && (!mount_failures_with(pod, Some(sources)).is_empty()
                || mounts_pending_with(pod, Some(sources))))
}

/// The kubelet-managed `/etc/hosts` of a pod (pod network).
fn etc_hosts(pod: &Value, pod_ip: &str, hostname: &str) -> String {
    let mut s = String::from("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n");
    let subdomain = str_at(pod, "/spec/subdomain");
    if subdomain.is_empty() {
        s.push_str(&format!("{pod_ip}\t{hostname}\n"));
    } else {
        let ns = str_at(pod, "/metadata/namespace");
        s.push_str(&format!(
            "{pod_ip}\t{hostname}.{subdomain}.{ns}.svc.cluster.local\t{hostname}\n"
        ));
    }
    let aliases = pod
        .pointer("/spec/hostAliases")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !aliases.is_empty() {
        s.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            let names: Vec<&str> = a
                .get("hostnames")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            s.push_str(&format!("{}\t{}\n", str_at(&a, "/ip"), names.join("\t")));
        }
    }
    s
}

/// A downward API field's value, as the kubelet writes it to an env var or a file.
fn field_value(pod: &Value, path: &str, pod_ip: &str, host_ip: &str) -> String {
    match path {
        "metadata.name" => str_at(pod, "/metadata/name"),
        "metadata.namespace" => str_at(pod, "/metadata/namespace"),
        "metadata.uid" => str_at(pod, "/metadata/uid"),
        "metadata.labels" | "metadata.annotations" => {
            let field = &path["metadata.".len()..];
            let mut lines = Vec::new();
            if let Some(m) = pod
                .pointer(&format!("/metadata/{field}"))
                .and_then(Value::as_object)
            {
                // Sorted, `key="value"` (Go-quoted), one per line.
                for (k, v) in m {
                    let v = v.as_str().unwrap_or("");
                    lines.push(format!(
                        "{k}={}",
                        serde_json::to_string(v).unwrap_or_default()
                    ));
                }
            }
            lines.sort();
            lines.join("\n")
        }
        "spec.nodeName" => str_at(pod, "/spec/nodeName"),
        "spec.serviceAccountName" => str_at(pod, "/spec/serviceAccountName"),
        "status.podIP" | "status.podIPs" => pod_ip.to_owned(),
        "status.hostIP" | "status.hostIPs" => host_ip.to_owned(),
        p => {
            let key = p
                .strip_prefix("metadata.labels['")
                .map(|k| ("labels", k))
                .or_else(|| {
                    p.strip_prefix("metadata.annotations['")
                        .map(|k| ("annotations", k))
                });
            match key {
                Some((field, k)) => pod
                    .pointer(&format!("/metadata/{field}"))
                    .and_then(|m| m.get(k.trim_end_matches("']")))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                None => String::new(),
            }
        }
    }
}

fn mode_of(v: &Value, key: &str, default: u32) -> u32 {
    v.get(key)
        .and_then(Value::as_u64)
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or(default)
}

/// The files of a ConfigMap or Secret volume source (`items` select and rename keys):
/// `data`'s values and, for a ConfigMap, its binaryData's.
fn key_files(src: &Value, data: &[Option<&Value>], mode: u32, files: &mut Files) {
    let value = |key: &str| {
        data.iter()
            .flatten()
            .find_map(|d| d.get(key))
            .and_then(value_bytes)
    };
    match src.get("items").and_then(Value::as_array) {
        Some(items) => {
            for it in items {
                if let Some(v) = value(&str_at(it, "/key")) {
                    files.insert(str_at(it, "/path"), (v, mode_of(it, "mode", mode)));
                }
            }
        }
        None => {
            for d in data.iter().flatten().filter_map(|d| d.as_object()) {
                for (k, v) in d {
                    files.insert(k.clone(), (value_bytes(v).unwrap_or_default(), mode));
                }
            }
        }
    }
}

/// The files a volume shows, for the sim runtime.
fn volume_source(
    pod: &Value,
    spec: &Value,
    vol: &Value,
    pod_ip: &str,
    host_ip: &str,
) -> (Source, bool) {
    use Source;
    let name = str_at(vol, "/name");
    if let Some(e) = vol.get("emptyDir") {
        return (Source::EmptyDir(name), str_at(e, "/medium") == "Memory");
    }
    if let Some(h) = vol.get("hostPath") {
        return (Source::HostPath(str_at(h, "/path")), false);
    }
    if is_persistent(vol) {
        // As the volume manager mounted it (the containers wait until it did); a read-only
        // claim is made read-only in `mounts`.
        let entry = disk_entry(pod.get(SOURCES), &name);
        if let Some(d) = entry.and_then(|e| e.get("disk")) {
            return (
                Source::Disk {
                    id: str_at(d, "/id"),
                    path: str_at(d, "/path"),
                },
                false,
            );
        }
        if let Some(p) = entry
            .and_then(|e| e.get("hostPath"))
            .and_then(Value::as_str)
        {
            return (Source::HostPath(p.to_owned()), false);
        }
        return (Source::EmptyDir(name), false);
    }
    let mut files = BTreeMap::new();
    let data = |kind: &str, n: &str| pod.pointer(&format!("/{SOURCES}/{kind}/{n}")).cloned();
    let binary = |n: &str| {
        pod.pointer(&format!("/{SOURCES}/{BINARY_DATA}/{n}"))
            .cloned()
    };
    let downward = |src: &Value, mode: u32, files: &mut Files| {
        for it in src
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let value = if let Some(p) = it.pointer("/fieldRef/fieldPath").and_then(Value::as_str) {
                field_value(pod, p, pod_ip, host_ip)
            } else if let Some(r) = it.get("resourceFieldRef") {
                resource_field(pod, spec, r)
            } else {
                continue;
            };
            files.insert(
                str_at(it, "/path"),
                (value.into_bytes(), mode_of(it, "mode", mode)),
            );
        }
    };
    if let Some(c) = vol.get("configMap") {
        let mode = mode_of(c, "defaultMode", 0o644);
        let n = str_at(c, "/name");
        let (text, bin) = (data("configmaps", &n), binary(&n));
        key_files(c, &[text.as_ref(), bin.as_ref()], mode, &mut files);
    } else if let Some(c) = vol.get("secret") {
        let mode = mode_of(c, "defaultMode", 0o644);
        let secret = data("secrets", &str_at(c, "/secretName"));
        key_files(c, &[secret.as_ref()], mode, &mut files);
    } else if let Some(d) = vol.get("downwardAPI") {
        downward(d, mode_of(d, "defaultMode", 0o644), &mut files);
    } else if let Some(p) = vol.get("projected") {
        let mode = mode_of(p, "defaultMode", 0o644);
        for (index, src) in p
            .get("sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(pc) = src.get("podCertificate") {
                let cred = pod
                    .get(SOURCES)
                    .and_then(|s| s.get("podCertificates"))
                    .and_then(|m| m.get(crate::podcertificate::key(&name, index)));
                let (key, chain) = (
                    cred.map(|c| str_at(c, "/key")).unwrap_or_default(),
                    cred.map(|c| str_at(c, "/chain")).unwrap_or_default(),
                );
                // Private keys are the owner's only, as upstream's projection writes them
                // (0600 with a user or fsGroup; the default mode otherwise).
                for (k, content) in [
                    ("credentialBundlePath", format!("{key}{chain}")),
                    ("keyPath", key.clone()),
                    ("certificateChainPath", chain.clone()),
                ] {
                    let path = str_at(pc, &format!("/{k}"));
                    if !path.is_empty() {
                        files.insert(path, (content.into_bytes(), mode));
                    }
                }
                continue;
            }
            if let Some(c) = src.get("configMap") {
                let n = str_at(c, "/name");
                if n == "kube-root-ca.crt" && data("configmaps", &n).is_none() {
                    files.insert(
                        "ca.crt".into(),
                        (b"-----BEGIN CERTIFICATE-----\n".to_vec(), mode),
                    );
                    continue;
                }
                let (text, bin) = (data("configmaps", &n), binary(&n));
                key_files(c, &[text.as_ref(), bin.as_ref()], mode, &mut files);
            } else if let Some(c) = src.get("secret") {
                let secret = data("secrets", &str_at(c, "/name"));
                key_files(c, &[secret.as_ref()], mode, &mut files);
            } else if let Some(d) = src.get("downwardAPI") {
                downward(d, mode, &mut files);
            } else if let Some(c) = src.get("clusterTrustBundle") {
                files.insert(
                    str_at(c, "/path"),
                    (
                        crate::trustbundle::content(pod.get(SOURCES), c).into_bytes(),
                        mode,
                    ),
                );
            } else if let Some(t) = src.get("serviceAccountToken") {
                let key = format!("{name}/{}", str_at(t, "/path"));
                let token = pod
                    .get(SOURCES)
                    .and_then(|s| s.get("tokens"))
                    .and_then(|ts| ts.get(&key))
                    .map(|k| str_at(k, "/token"))
                    .unwrap_or_default();
                files.insert(str_at(t, "/path"), (token.into_bytes(), mode));
            }
        }
    } else if let Some(img) = vol.get("image") {
        // An image volume: the image's files, read-only (the runtime mounts them).
        return (Source::Image(str_at(img, "/reference")), true);
    } else {
        return (Source::EmptyDir(name), false);
    }
    (Source::Files(files), true)
}

/// The volume mounts of container `spec`, for the sim runtime.
fn mounts(
    pod: &Value,
    spec: &Value,
    pod_ip: &str,
    host_ip: &str,
    env: &[(String, String)],
) -> Result<Vec<Mount>, String> {
    let vols = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    spec.get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let name = str_at(m, "/name");
            let vol = vols.iter().find(|v| str_at(v, "/name") == name)?;
            let sub_path = match sub_path(m, env) {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            };
            let (source, tmpfs) = volume_source(pod, spec, vol, pod_ip, host_ip);
            Some(Ok(Mount {
                path: str_at(m, "/mountPath"),
                source,
                // A claim mounted read-only (the pod's volume or its volume says so) is
                // read-only in every container.
                read_only: m.get("readOnly").and_then(Value::as_bool).unwrap_or(false)
                    || (is_persistent(vol)
                        && disk_entry(pod.get(SOURCES), &str_at(vol, "/name"))
                            .and_then(|e| e.get("readOnly"))
                            .and_then(Value::as_bool)
                            == Some(true)),
                sub_path,
                tmpfs,
            }))
        })
        .collect()
}

/// A mount's subPath, its subPathExpr expanded against the environment (every reference
/// must have a non-empty value); relative and without `..`, as the kubelet's makeMounts
/// requires.
fn sub_path(mount: &Value, env: &[(String, String)]) -> Result<String, String> {
    let path = match mount.get("subPathExpr").and_then(Value::as_str) {
        Some(e) if !e.is_empty() => {
            let mut missing = std::collections::BTreeSet::new();
            let expanded =
                expansion::expand_with(e, |name| match env.iter().rev().find(|(k, _)| k == name) {
                    Some((_, v)) if !v.is_empty() => Some(v.clone()),
                    found => {
                        missing.insert(name.to_owned());
                        found.map(|(_, v)| v.clone())
                    }
                });
            if !missing.is_empty() {
                let names: Vec<String> = missing.into_iter().collect();
                return Err(format!("missing value for {}", names.join(", ")));
            }
            expanded
        }
        _ => str_at(mount, "/subPath"),
    };
    if path.starts_with('/') {
        return Err(format!(
            "error SubPath `{path}` must not be an absolute path"
        ));
    }
    if path.split('/').any(|p| p == "..") {
        return Err(format!(
            "unable to provision SubPath `{path}`: must not contain '..'"
        ));
    }
    Ok(path)
}

/// The data of the ConfigMap or Secret an `envFrom` entry names; None when it is missing
/// but optional, upstream's NotFound message when missing and required.
fn required_source(
    source: &impl Fn(&str, &str) -> Option<Value>,
    r: &Value,
    kind: &str,
    what: &str,
) -> Result<Option<Value>, String> {
    let name = str_at(r, "/name");
    match source(kind, &name) {
        Some(d) => Ok(Some(d)),
        None if r.get("optional").and_then(Value::as_bool) == Some(true) => Ok(None),
        None => Err(format!("{what} \"{name}\" not found")),
    }
}

/// The value of a `configMapKeyRef` or `secretKeyRef` (`kinds`: sources key, the kind as
/// the NotFound error and as the missing-key error name it); None when it is missing but
/// optional (the variable is not set).
fn key_ref(
    pod: &Value,
    source: &impl Fn(&str, &str) -> Option<Value>,
    r: &Value,
    (kind, what, title): (&str, &str, &str),
) -> Result<Option<String>, String> {
    let optional = r.get("optional").and_then(Value::as_bool) == Some(true);
    let Some(data) = required_source(source, r, kind, what)? else {
        return Ok(None);
    };
    let key = str_at(r, "/key");
    match data.get(&key).and_then(value_text) {
        Some(v) => Ok(Some(v)),
        None if optional => Ok(None),
        None => Err(format!(
            "couldn't find key {key} in {title} {}/{}",
            str_at(pod, "/metadata/namespace"),
            str_at(r, "/name")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_non_optional_sources_fail_their_volumes() {
        let pod = json!({"spec": {"volumes": [
            {"name": "cm", "configMap": {"name": "gone"}},
            {"name": "opt", "configMap": {"name": "gone", "optional": true}},
            {"name": "sec", "secret": {"secretName": "there"}},
            {"name": "proj", "projected": {"sources": [
                {"configMap": {"name": "there-too"}},
                {"clusterTrustBundle": {"name": "ctb", "path": "ca.pem"}},
                {"clusterTrustBundle": {"signerName": "a.b/c", "path": "x.pem", "optional": true}},
            ]}},
        ]}});
        let sources = json!({"configmaps": {"there-too": {}}, "secrets": {"there": {}},
            "trustBundles": {"name:ctb": {"missing": true}}});
        assert_eq!(
            mount_failures(&with_sources(&pod, &sources)),
            vec![
                (
                    "cm".to_owned(),
                    "MountVolume.SetUp failed for volume \"cm\" : configmap \"gone\" not found"
                        .to_owned()
                ),
                (
                    "proj".to_owned(),
                    "MountVolume.SetUp failed for volume \"proj\" : clustertrustbundle.certificates.k8s.io \"ctb\" not found".to_owned()
                ),
            ]
        );
        let all = json!({"configmaps": {"gone": {}, "there-too": {}}, "secrets": {"there": {}},
            "trustBundles": {"name:ctb": {"pem": "PEM"}}});
        assert!(mount_failures(&with_sources(&pod, &all)).is_empty());
    }

    #[test]
    fn environment() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c"}]},
            SOURCES: {
                "configmaps": {"cm": {"k": "from-cm", "X": "x"}},
                "secrets": {"s": {"pw": "hunter2"}},
                "allocatable": {"cpu": "4", "memory": "8Gi"},
                "hostIP": "10.0.0.1",
            },
        });
        let spec = json!({
            "name": "c",
            "command": ["sh", "-c"],
            "args": ["echo $(A) $(CPU) $$(A)"],
            "resources": {"limits": {"cpu": "1250m", "memory": "64Mi"}, "requests": {"memory": "32Mi"}},
            "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "P_"}],
            "env": [
                {"name": "A", "value": "a-$(P_X)"},
                {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory"}}},
                {"name": "DEFMEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
                {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            ],
        });
        let c = container_config(&pod, &spec, &BTreeMap::new(), "10.244.0.9", 0).unwrap();
        let env: BTreeMap<_, _> = c.env.iter().cloned().collect();
        assert_eq!(env["P_k"], "from-cm");
        assert_eq!(env["A"], "a-x");
        assert_eq!(env["CPU"], "2");
        assert_eq!(env["MEM"], "33554432");
        assert_eq!(env["DEFMEM"], "64");
        assert_eq!(env["CM"], "from-cm");
        assert_eq!(env["PW"], "hunter2");
        assert_eq!(env["HOST"], "10.0.0.1");
        assert_eq!(env["APP"], "web");
        assert_eq!(c.command, ["sh", "-c"]);
        assert_eq!(c.args, ["echo a-x 2 $(A)"]);
        assert_eq!(c.hostname, "p");
        assert!(c.files["/etc/hosts"].ends_with("10.244.0.9\tp\n"));
        let mut aliased = pod.clone();
        aliased["spec"]["hostAliases"] =
            json!([{"ip": "123.45.67.89", "hostnames": ["foo", "bar"]}]);
        aliased["spec"]["volumes"] = json!([{"name": "cm", "configMap": {"name": "cm", "items": [{"key": "k", "path": "sub/k"}]}}]);
        let mut spec2 = spec.clone();
        spec2["volumeMounts"] = json!([{"name": "cm", "mountPath": "/etc/c"}, {"name": "cm", "mountPath": "/x", "subPathExpr": "$(A)"}]);
        let c = container_config(&aliased, &spec2, &BTreeMap::new(), "10.244.0.9", 0).unwrap();
        assert!(c.files["/etc/hosts"]
            .contains("# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n"));
        let mut want = BTreeMap::new();
        want.insert("sub/k".to_owned(), (b"from-cm".to_vec(), 0o644));
        assert_eq!(c.mounts[0].source, Source::Files(want));
        assert_eq!(c.mounts[1].sub_path, "a-x");
        let env = service_env(&[json!({
            "metadata": {"name": "foo-svc"},
            "spec": {"clusterIP": "10.96.0.5", "ports": [{"name": "http", "port": 8765, "protocol": "TCP"}]},
        })]);
        let env: BTreeMap<_, _> = env.into_iter().collect();
        assert_eq!(env["FOO_SVC_SERVICE_HOST"], "10.96.0.5");
        assert_eq!(env["FOO_SVC_SERVICE_PORT_HTTP"], "8765");
        assert_eq!(env["FOO_SVC_PORT"], "tcp://10.96.0.5:8765");
        assert_eq!(env["FOO_SVC_PORT_8765_TCP_ADDR"], "10.96.0.5");
    }

    #[test]
    fn binary_data_reaches_files_as_bytes_and_variables_as_text() {
        let bin = [0xde_u8, 0xca, 0xfe, 0xba, 0xd0, 0xfe, 0xff];
        let b64 = base64::engine::general_purpose::STANDARD.encode(bin);
        let text = base64::engine::general_purpose::STANDARD.encode("s3cret");
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": {}},
            "spec": {"volumes": [
                {"name": "cm", "configMap": {"name": "cm"}},
                {"name": "sec", "secret": {"secretName": "sec"}},
            ]},
            SOURCES: {
                "configmaps": {"cm": {"data-1": "value-1"}},
                BINARY_DATA: {"cm": {"dump.bin": stored_bytes(&b64)}},
                "secrets": {"sec": {"bin": stored_bytes(&b64), "pw": stored_bytes(&text)}},
            },
        });
        let spec = json!({"name": "c", "image": "busybox",
            "volumeMounts": [{"name": "cm", "mountPath": "/cm"}, {"name": "sec", "mountPath": "/sec"}],
            "envFrom": [{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "sec"}}]});
        let c = container_config(&pod, &spec, &BTreeMap::new(), "10.244.0.9", 0).unwrap();
        let files = |i: usize| match &c.mounts[i].source {
            Source::Files(f) => f.clone(),
            other => panic!("not files: {other:?}"),
        };
        assert_eq!(files(0)["dump.bin"].0, bin);
        assert_eq!(files(0)["data-1"].0, b"value-1");
        assert_eq!(files(1)["bin"].0, bin);
        assert_eq!(files(1)["pw"].0, b"s3cret");
        let env: BTreeMap<_, _> = c.env.iter().cloned().collect();
        // binaryData never becomes a variable; a Secret's bytes do, as text.
        assert!(!env.contains_key("dump.bin"));
        assert_eq!(env["data-1"], "value-1");
        assert_eq!(env["pw"], "s3cret");
        assert_eq!(env["bin"], String::from_utf8_lossy(&bin));
    }

    #[test]
    fn configs_that_cannot_be_made_say_why_as_the_kubelet_does() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": {}},
            "spec": {"volumes": [{"name": "w", "emptyDir": {}}]},
            SOURCES: {"configmaps": {"cm": {"k": "v"}}, "secrets": {}},
        });
        let err = |spec: Value| {
            container_config(&pod, &spec, &BTreeMap::new(), "10.244.0.9", 0)
                .err()
                .unwrap_or_default()
        };
        let with_sub_path = |env: Value, expr: &str| {
            json!({"name": "c", "env": env,
                "volumeMounts": [{"name": "w", "mountPath": "/m", "subPathExpr": expr}]})
        };
        assert_eq!(
            err(with_sub_path(
                json!([{"name": "P", "value": "/tmp"}]),
                "$(P)"
            )),
            "error SubPath `/tmp` must not be an absolute path"
        );
        assert_eq!(
            err(with_sub_path(json!([{"name": "P", "value": ".."}]), "$(P)")),
            "unable to provision SubPath `..`: must not contain '..'"
        );
        let annotation = json!([{"name": "A", "valueFrom": {"fieldRef":
            {"fieldPath": "metadata.annotations['mysubpath']"}}}, {"name": "P", "value": "foo"}]);
        assert_eq!(
            err(with_sub_path(annotation, "$(A)/$(P)/$(Z)")),
            "missing value for A, Z"
        );
        let env = |e: Value| json!({"name": "c", "env": [e]});
        assert_eq!(
            err(env(
                json!({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nope"}}})
            )),
            "couldn't find key nope in ConfigMap ns/cm"
        );
        assert_eq!(
            err(env(
                json!({"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}})
            )),
            "secret \"gone\" not found"
        );
        assert_eq!(
            err(json!({"name": "c", "envFrom": [{"configMapRef": {"name": "gone"}}]})),
            "configmap \"gone\" not found"
        );
        // Optional references that are missing set nothing.
        let c = container_config(
            &pod,
            &json!({"name": "c", "envFrom": [{"secretRef": {"name": "gone", "optional": true}}],
                "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nope", "optional": true}}}]}),
            &BTreeMap::new(),
            "10.244.0.9",
            0,
        )
        .unwrap();
        assert!(!c.env.iter().any(|(k, _)| k == "X"), "{:?}", c.env);
    }
}
