//! Discovery documents: `/version`, `/api`, `/apis`, `/api/v1`, `/apis/<group>[/<version>]`.

use serde_json::{json, Value};

use crate::registry::Registry;

/// `/version`. The git version carries kumo's own version as semver build metadata, so
/// version comparisons see v1.37.2.
pub fn version() -> Value {
    let (major, minor) = ("1", "37");
    json!({
        "major": major,
        "minor": minor,
        "emulationMajor": major,
        "emulationMinor": minor,
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "36",
        "gitVersion": format!("{}+kumo.{}", crate::KUBERNETES_VERSION, env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    })
}

/// The architecture name as Go (and so Kubernetes) spells it.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_doc(name: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(Value::Null),
    })
}

/// `/apis`.
pub fn group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .iter()
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`, if served.
pub fn group(registry: &Registry, name: &str) -> Option<Value> {
    let groups = registry.groups();
    let (g, vs) = groups.iter().find(|(g, _)| *g == name)?;
    let mut doc = group_doc(g, vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

/// The `storageVersionHash` of a stored resource: base64 of the first 8 bytes of the
/// SHA-256 of its storage version's `group/version/kind`, as kube-apiserver computes it
/// (the same for every version a resource is served at). None for what is not stored
/// (reviews, bindings: no watch).
fn storage_version_hash(r: &crate::registry::Resource) -> Option<String> {
    use base64::Engine;
    if !r.verbs().contains(&"watch") {
        return None;
    }
    // Where kube-apiserver stores a resource in another group version than it serves.
    let (group, version, kind) = match (r.group, r.plural) {
        ("events.k8s.io", "events") => ("", "v1", "Event"),
        ("autoscaling", "horizontalpodautoscalers") => ("autoscaling", "v2", r.kind),
        _ => (r.group, r.version, r.kind),
    };
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{group}/{version}/{kind}").as_bytes(),
    );
    Some(base64::engine::general_purpose::STANDARD.encode(&digest.as_ref()[..8]))
}

/// `/api/v1` or `/apis/<group>/<version>`, if served.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in registry.in_group_version(group, version) {
        let mut doc = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            doc["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            doc["categories"] = json!(r.categories);
        }
        if let Some(h) = storage_version_hash(&r) {
            doc["storageVersionHash"] = json!(h);
        }
        resources.push(doc);
        for sub in subresources_of(&r) {
            let (g, v, k) = subresource_kind(&r, sub);
            let mut doc = json!({
                "name": format!("{}/{}", r.plural, sub),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": k,
                "verbs": subresource_verbs(sub),
            });
            if g != r.group || v != r.version {
                doc["group"] = json!(g);
                doc["version"] = json!(v);
            }
            resources.push(doc);
        }
    }
    if resources.is_empty() {
        return None;
    }
    // kube-apiserver lists resources and their subresources by name.
    resources.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    // kube-apiserver's core list carries no apiVersion; the group lists do.
    let mut doc = json!({"kind": "APIResourceList"});
    if !group.is_empty() {
        doc["apiVersion"] = json!("v1");
    }
    doc["groupVersion"] = json!(gv);
    doc["resources"] = Value::Array(resources);
    Some(doc)
}

/// The verbs of a subresource.
fn subresource_verbs(sub: &str) -> &'static [&'static str] {
    match sub {
        "finalize" => &["update"],
        "binding" | "token" | "eviction" => &["create"],
        "attach" | "exec" | "portforward" => &["create", "get"],
        "log" => &["get"],
        "proxy" => &["create", "delete", "get", "patch", "update"],
        _ => &["get", "patch", "update"],
    }
}

/// The subresources discovery lists for `r`: its own, and the ones the kubelet proxy
/// (`crate::proxy`) serves for pods and nodes, which never reach the REST routes.
fn subresources_of(r: &crate::registry::Resource) -> Vec<&'static str> {
    let mut subs: Vec<&'static str> = r.subresources.to_vec();
    match (r.group, r.plural) {
        ("", "pods") => subs.extend(["attach", "exec", "log", "portforward", "proxy"]),
        ("", "nodes") => subs.push("proxy"),
        // Answered by `crate::resource_proxy`, outside the REST routes.
        ("", "services") => subs.push("proxy"),
        _ => {}
    }
    subs
}

/// The group, version and kind a subresource serves (its own resource's, unless it takes
/// another type, as `scale` takes autoscaling/v1 Scale).
fn subresource_kind(
    r: &crate::registry::Resource,
    sub: &str,
) -> (&'static str, &'static str, &'static str) {
    match (r.plural, sub) {
        (_, "scale") => ("autoscaling", "v1", "Scale"),
        (_, "token") => ("authentication.k8s.io", "v1", "TokenRequest"),
        (_, "eviction") => ("policy", "v1", "Eviction"),
        (_, "binding") => ("", r.version, "Binding"),
        ("pods", "attach") => ("", r.version, "PodAttachOptions"),
        ("pods", "exec") => ("", r.version, "PodExecOptions"),
        ("pods", "portforward") => ("", r.version, "PodPortForwardOptions"),
        ("nodes", "proxy") => ("", r.version, "NodeProxyOptions"),
        ("pods", "proxy") => ("", r.version, "PodProxyOptions"),
        ("services", "proxy") => ("", r.version, "ServiceProxyOptions"),
        _ => (r.group, r.version, r.kind),
    }
}

/// Content type of an aggregated discovery document (apidiscovery.k8s.io/v2).
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The resources of one group version in aggregated discovery form, by name.
fn aggregated_resources(registry: &Registry, group: &str, version: &str) -> Vec<Value> {
    let kind = |k: &str| json!({"group": "", "version": "", "kind": k});
    let mut out: Vec<Value> = registry
        .in_group_version(group, version)
        .map(|r| {
            let mut doc = json!({
                "resource": r.plural,
                "responseKind": kind(r.kind),
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": r.singular,
                "verbs": r.verbs(),
            });
            if !r.short_names.is_empty() {
                doc["shortNames"] = json!(r.short_names);
            }
            if !r.categories.is_empty() {
                doc["categories"] = json!(r.categories);
            }
            let mut subs = subresources_of(&r);
            subs.sort_unstable();
            if !subs.is_empty() {
                doc["subresources"] = subs
                    .iter()
                    .map(|s| {
                        let (g, v, k) = subresource_kind(&r, s);
                        let response = if g == r.group && v == r.version {
                            kind(k)
                        } else {
                            json!({"group": g, "version": v, "kind": k})
                        };
                        json!({
                            "subresource": s,
                            "responseKind": response,
                            "verbs": subresource_verbs(s),
                        })
                    })
                    .collect();
            }
            doc
        })
        .collect();
    out.sort_by(|a, b| a["resource"].as_str().cmp(&b["resource"].as_str()));
    out
}

/// `/api` (`core`) or `/apis` as an aggregated discovery document: every group, version
/// and resource served, in one answer.
pub fn aggregated(registry: &Registry, core: bool) -> Value {
    let version = |g: &str, v: &str| {
        json!({
            "version": v,
            "resources": aggregated_resources(registry, g, v),
            "freshness": "Current",
        })
    };
    let items: Vec<Value> = if core {
        vec![json!({"metadata": {}, "versions": [version("", "v1")]})]
    } else {
        registry
            .groups()
            .iter()
            .map(|(g, vs)| {
                let versions: Vec<Value> = vs.iter().map(|v| version(g, v)).collect();
                json!({"metadata": {"name": g}, "versions": versions})
            })
            .collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}
