//! Nodes: cluster-scoped, with a `status` subresource and the printer's STATUS and ROLES
//! (the not-ready taint of a new node is `admission::taintnodes`).

use std::collections::{BTreeMap, BTreeSet};

use kumo_apimachinery::validation::{self, FieldError, Path};
use serde_json::{json, Value};

use super::{age_of, default_field, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![Resource {
        group: "",
        version: "v1",
        kind: "Node",
        plural: "nodes",
        singular: "node",
        namespaced: false,
        short_names: &["no"],
        categories: &[],
        subresources: &["status"],
        strategy: Box::new(Nodes),
    }]
}

const COL_STATUS: Column = Column {
    name: "Status",
    type_: "string",
    format: "",
    description: "The status of the node",
    priority: 0,
};
const COL_ROLES: Column = Column {
    name: "Roles",
    type_: "string",
    format: "",
    description: "The roles of the node",
    priority: 0,
};
const COL_VERSION: Column = Column {
    name: "Version",
    type_: "string",
    format: "",
    description: "Kubelet Version reported by the node.",
    priority: 0,
};
const COL_INTERNAL_IP: Column = Column {
    name: "Internal-IP",
    type_: "string",
    format: "",
    description: "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).",
    priority: 1,
};
const COL_EXTERNAL_IP: Column = Column {
    name: "External-IP",
    type_: "string",
    format: "",
    description: "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).",
    priority: 1,
};
const COL_OS_IMAGE: Column = Column {
    name: "OS-Image",
    type_: "string",
    format: "",
    description:
        "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
    priority: 1,
};
const COL_KERNEL_VERSION: Column = Column {
    name: "Kernel-Version",
    type_: "string",
    format: "",
    description: "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
    priority: 1,
};
const COL_CONTAINER_RUNTIME: Column = Column {
    name: "Container-Runtime",
    type_: "string",
    format: "",
    description: "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
    priority: 1,
};

const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];
const ROLE_PREFIX: &str = "node-role.kubernetes.io/";
const ROLE_LABEL: &str = "kubernetes.io/role";

struct Nodes;

/// The status fields a NodeStatus always serializes (they are not pointers upstream), and
/// allocatable defaulted to capacity when a client sends only capacity.
fn default_status(node: &mut Value) {
    let Some(o) = node.as_object_mut() else {
        return;
    };
    let status = o.entry("status").or_insert_with(|| json!({}));
    if !status.is_object() {
        *status = json!({});
    }
    if status.get("allocatable").is_none_or(Value::is_null) {
        if let Some(capacity) = status.get("capacity").filter(|c| c.is_object()).cloned() {
            default_field(status, "allocatable", capacity);
        }
    }
    default_field(status, "daemonEndpoints", json!({}));
    if let Some(de) = status.get_mut("daemonEndpoints") {
        default_field(de, "kubeletEndpoint", json!({}));
        if let Some(ke) = de.get_mut("kubeletEndpoint") {
            default_field(ke, "Port", json!(0));
        }
    }
    default_field(status, "nodeInfo", json!({}));
    if let Some(info) = status.get_mut("nodeInfo") {
        for k in [
            "machineID",
            "systemUUID",
            "bootID",
            "kernelVersion",
            "osImage",
            "containerRuntimeVersion",
            "kubeletVersion",
            "kubeProxyVersion",
            "operatingSystem",
            "architecture",
        ] {
            default_field(info, k, json!(""));
        }
    }
}

impl Strategy for Nodes {
    fn prepare_create(&self, obj: &mut Value) {
        default_status(obj);
        // The not-ready taint of a new node is TaintNodesByCondition's (admission).
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        if let Some(o) = new.as_object_mut() {
            o.insert(
                "status".into(),
                old.get("status").cloned().unwrap_or_else(|| json!({})),
            );
        }
    }

    fn prepare_status_update(&self, new: &mut Value, _old: &Value) {
        default_status(new);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        // Upstream validates the taints under `metadata`.
        let path = Path::new("metadata").child("taints");
        let taints = obj
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for (i, t) in taints.iter().enumerate() {
            let p = path.index(i);
            errs.extend(validation::validate_label_name(
                str_at(t, "/key"),
                &p.child("key"),
            ));
            let value = str_at(t, "/value");
            if !value.is_empty() {
                for msg in validation::is_valid_label_value(value) {
                    errs.push(FieldError::invalid(&p.child("value"), value, msg));
                }
            }
            let effect = str_at(t, "/effect");
            if effect.is_empty() {
                errs.push(FieldError::required(&p.child("effect"), ""));
            } else if !TAINT_EFFECTS.contains(&effect) {
                errs.push(FieldError::not_supported(
                    &p.child("effect"),
                    effect,
                    TAINT_EFFECTS,
                ));
            }
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        // A node range is handed out once (the node-ipam controller may set it when
        // there is none) and never changed.
        let cidrs = |o: &Value| -> Vec<Value> {
            o.pointer("/spec/podCIDRs")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let (was, now) = (cidrs(old), cidrs(new));
        if !was.is_empty() {
            let changed = if was.len() == now.len() {
                was.iter().zip(&now).filter(|(a, b)| a != b).count()
            } else {
                1
            };
            for _ in 0..changed {
                errs.push(FieldError::forbidden(
                    &Path::new("spec").child("podCIDRs"),
                    "node updates may not change podCIDR except from \"\" to valid",
                ));
            }
        }
        // The cloud provider sets providerID once.
        let (was, now) = (
            str_at(old, "/spec/providerID"),
            str_at(new, "/spec/providerID"),
        );
        let path = Path::new("spec").child("providerID");
        if !was.is_empty() && !now.is_empty() && was != now {
            errs.push(FieldError::invalid(
                &path,
                Value::Null,
                "field cannot be modified once set",
            ));
        }
        if !was.is_empty() && now.is_empty() {
            errs.push(FieldError::invalid(
                &path,
                Value::Null,
                "field cannot be cleared once set",
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            COL_STATUS,
            COL_ROLES,
            Column::AGE,
            COL_VERSION,
            COL_INTERNAL_IP,
            COL_EXTERNAL_IP,
            COL_OS_IMAGE,
            COL_KERNEL_VERSION,
            COL_CONTAINER_RUNTIME,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let unknown = |s: &str| {
            if s.is_empty() {
                "<unknown>".to_owned()
            } else {
                s.to_owned()
            }
        };
        let kernel = str_at(obj, "/status/nodeInfo/kernelVersion");
        let arch = str_at(obj, "/status/nodeInfo/architecture");
        let kernel = if kernel.is_empty() || arch.is_empty() {
            unknown(kernel)
        } else {
            format!("{kernel} ({arch})")
        };
        vec![
            json!(name_of(obj)),
            json!(node_status(obj)),
            json!(roles(obj)),
            json!(age_of(obj)),
            json!(str_at(obj, "/status/nodeInfo/kubeletVersion")),
            json!(address(obj, "InternalIP")),
            json!(address(obj, "ExternalIP")),
            json!(unknown(str_at(obj, "/status/nodeInfo/osImage"))),
            json!(kernel),
            json!(unknown(str_at(
                obj,
                "/status/nodeInfo/containerRuntimeVersion"
            ))),
        ]
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        let unschedulable = obj
            .pointer("/spec/unschedulable")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        vec![("spec.unschedulable", unschedulable.to_string())]
    }
}

/// `Ready`, `NotReady` or `Unknown` from the Ready condition, then `SchedulingDisabled`
/// for a cordoned node.
fn node_status(node: &Value) -> String {
    let conditions: BTreeMap<&str, &str> = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|c| (str_at(c, "/type"), str_at(c, "/status")))
                .collect()
        })
        .unwrap_or_default();
    let mut status = vec![match conditions.get("Ready") {
        Some(&"True") => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }];
    if node
        .pointer("/spec/unschedulable")
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        status.push("SchedulingDisabled");
    }
    status.join(",")
}

/// Roles from `node-role.kubernetes.io/<role>` labels and `kubernetes.io/role=<role>`,
/// sorted, or `<none>`.
fn roles(node: &Value) -> String {
    let mut roles = BTreeSet::new();
    if let Some(labels) = node.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let v = v.as_str().unwrap_or("");
            if let Some(role) = k.strip_prefix(ROLE_PREFIX).filter(|r| !r.is_empty()) {
                roles.insert(role.to_owned());
            } else if k == ROLE_LABEL && !v.is_empty() {
                roles.insert(v.to_owned());
            }
        }
    }
    if roles.is_empty() {
        "<none>".into()
    } else {
        roles.into_iter().collect::<Vec<_>>().join(",")
    }
}

/// The first address of a type, or `<none>`.
fn address(node: &Value, kind: &str) -> String {
    node.pointer("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|x| str_at(x, "/type") == kind))
        .map(|x| str_at(x, "/address").to_owned())
        .unwrap_or_else(|| "<none>".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_roles_as_the_printer_shows_them() {
        let node = json!({
            "metadata": {"labels": {
                "node-role.kubernetes.io/worker": "",
                "node-role.kubernetes.io/control-plane": "",
                "kubernetes.io/role": "master",
            }},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        });
        assert_eq!(node_status(&node), "NotReady,SchedulingDisabled");
        assert_eq!(roles(&node), "control-plane,master,worker");
        assert_eq!(node_status(&json!({})), "Unknown");
        assert_eq!(roles(&json!({})), "<none>");
    }

    #[test]
    fn allocatable_defaults_to_capacity() {
        let mut node = json!({"status": {"capacity": {"cpu": "4", "pods": "110"}}});
        default_status(&mut node);
        assert_eq!(
            node["status"]["allocatable"],
            json!({"cpu": "4", "pods": "110"})
        );
        // What the kubelet reports stays.
        let mut node = json!({"status": {"capacity": {"cpu": "4"}, "allocatable": {"cpu": "3"}}});
        default_status(&mut node);
        assert_eq!(node["status"]["allocatable"], json!({"cpu": "3"}));
        let mut node = json!({"status": {}});
        default_status(&mut node);
        assert!(node["status"].get("allocatable").is_none());
    }
}
