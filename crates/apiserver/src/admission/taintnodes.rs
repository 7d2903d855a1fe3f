//! TaintNodesByCondition (mutating): a Node is created with the
//! `node.kubernetes.io/not-ready:NoSchedule` taint, so nothing is scheduled onto it
//! before the node lifecycle controller has seen it become Ready and removed the taint.

use async_trait::async_trait;
use kumo_apimachinery::status::ApiError;
use serde_json::{json, Value};

use super::{Attributes, Operation, Plugin};

/// The taint key of a node that is not ready (v1.TaintNodeNotReady).
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// The `TaintNodesByCondition` admission plugin.
pub struct TaintNodesByCondition;

#[async_trait]
impl Plugin for TaintNodesByCondition {
    fn name(&self) -> &'static str {
        "TaintNodesByCondition"
    }

    async fn admit(&self, a: &Attributes<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        if a.operation != Operation::Create
            || !a.resource.group.is_empty()
            || a.resource.plural != "nodes"
            || a.subresource.is_some_and(|s| !s.is_empty())
        {
            return Ok(());
        }
        let Some(node) = obj else { return Ok(()) };
        add_not_ready_taint(node);
        Ok(())
    }
}

/// Appends the not-ready taint unless a taint with its key and effect is there.
fn add_not_ready_taint(node: &mut Value) {
    let Some(o) = node.as_object_mut() else {
        return;
    };
    let spec = o.entry("spec").or_insert_with(|| json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return;
    };
    let taints = spec.entry("taints").or_insert_with(|| json!([]));
    if taints.is_null() {
        *taints = json!([]);
    }
    let Some(taints) = taints.as_array_mut() else {
        return;
    };
    // Taint.MatchTaint: same key and effect.
    let present = taints.iter().any(|t| {
        t.get("key").and_then(Value::as_str) == Some(NOT_READY)
            && t.get("effect").and_then(Value::as_str) == Some("NoSchedule")
    });
    if !present {
        taints.push(json!({"key": NOT_READY, "effect": "NoSchedule"}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_the_taint_once() {
        let mut n = json!({"metadata": {"name": "n"}});
        add_not_ready_taint(&mut n);
        add_not_ready_taint(&mut n);
        assert_eq!(
            n["spec"]["taints"],
            json!([{"key": NOT_READY, "effect": "NoSchedule"}])
        );
        let mut n =
            json!({"spec": {"taints": [{"key": "a", "value": "b", "effect": "NoExecute"}]}});
        add_not_ready_taint(&mut n);
        assert_eq!(n["spec"]["taints"].as_array().map(Vec::len), Some(2));
    }
}
