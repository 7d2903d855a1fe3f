//! The RuntimeClass admission plugin: a pod that names a RuntimeClass gets its pod
//! overhead and scheduling constraints (nodeSelector, tolerations) on create, and is
//! refused when the class does not exist, as upstream's plugin does.

use async_trait::async_trait;
use kumo_apimachinery::status::{ApiError, GroupResource};
use serde_json::{json, Value};

use super::{Attributes, Operation, Plugin};

/// The RuntimeClass admission plugin.
pub struct RuntimeClass;

fn pod_forbidden(a: &Attributes<'_>, why: String) -> ApiError {
    ApiError::forbidden(&GroupResource::new("", "pods"), a.name, &why)
}

#[async_trait]
impl Plugin for RuntimeClass {
    fn name(&self) -> &'static str {
        "RuntimeClass"
    }

    async fn admit(&self, a: &Attributes<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        let Some(pod) = obj else { return Ok(()) };
        if a.operation != Operation::Create
            || a.subresource.is_some()
            || !a.resource.group.is_empty()
            || a.resource.plural != "pods"
        {
            return Ok(());
        }
        let Some(class) = pod
            .pointer("/spec/runtimeClassName")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
        else {
            return Ok(());
        };
        let Some(rc) = a
            .stored(&format!("/registry/runtimeclasses/{class}"))
            .await?
        else {
            return Err(pod_forbidden(
                a,
                format!("pod rejected: RuntimeClass \"{class}\" not found"),
            ));
        };
        let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
            return Ok(());
        };
        // The class's pod overhead, unless the pod already says the same.
        if let Some(fixed) = rc.pointer("/overhead/podFixed").filter(|f| f.is_object()) {
            match spec.get("overhead") {
                Some(o) if !o.is_null() && o != fixed => return Err(pod_forbidden(
                    a,
                    "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"
                        .into(),
                )),
                _ => {
                    spec.insert("overhead".into(), fixed.clone());
                }
            }
        }
        // Its scheduling constraints: the node selector merged (a conflict refuses the
        // pod), the tolerations added.
        if let Some(sel) = rc
            .pointer("/scheduling/nodeSelector")
            .and_then(Value::as_object)
        {
            let target = spec.entry("nodeSelector").or_insert_with(|| json!({}));
            if let Some(t) = target.as_object_mut() {
                for (k, v) in sel {
                    match t.get(k) {
                        Some(existing) if existing != v => {
                            return Err(pod_forbidden(
                                a,
                                format!("pod rejected: conflict: runtimeClass.scheduling.nodeSelector[{k}] = {}; pod.spec.nodeSelector[{k}] = {}", v.as_str().unwrap_or(""), existing.as_str().unwrap_or("")),
                            ));
                        }
                        _ => {
                            t.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
        }
        if let Some(tols) = rc
            .pointer("/scheduling/tolerations")
            .and_then(Value::as_array)
        {
            let target = spec.entry("tolerations").or_insert_with(|| json!([]));
            if let Some(t) = target.as_array_mut() {
                for tol in tols {
                    if !t.contains(tol) {
                        t.push(tol.clone());
                    }
                }
            }
        }
        Ok(())
    }
}
