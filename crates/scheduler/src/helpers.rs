//! Matching helpers shared by the plugins: label selectors, node selector terms and
//! tolerations, with upstream's semantics (component-helpers/scheduling/corev1).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Empty label map for objects without labels.
pub fn labels_of(m: &Option<BTreeMap<String, String>>) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    m.as_ref().unwrap_or(&EMPTY)
}

/// Whether `sel` selects `labels` (`metav1.LabelSelectorAsSelector`; a missing selector
/// selects nothing, an empty one everything). `extra` adds `key In (values)` requirements
/// (matchLabelKeys).
pub fn selector_matches(
    sel: Option<&LabelSelector>,
    extra: &[(String, String)],
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(sel) = sel else { return false };
    for (k, v) in sel.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return false;
        }
    }
    for e in sel.match_expressions.iter().flatten() {
        let vals = e.values.as_deref().unwrap_or_default();
        let ok = match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| vals.contains(v)),
            "NotIn" => !labels.get(&e.key).is_some_and(|v| vals.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    extra.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let vals = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| vals.contains(v)),
        "NotIn" => !value.is_some_and(|v| vals.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value, vals) else {
                return false;
            };
            let (Ok(v), Ok(b)) = (v.parse::<i64>(), bound.parse::<i64>()) else {
                return false;
            };
            if r.operator == "Gt" {
                v > b
            } else {
                v < b
            }
        }
        _ => false,
    }
}

/// Whether one node selector term matches the node: all expressions on labels and all
/// fields (only `metadata.name`); a term with neither matches nothing.
pub fn term_matches(t: &NodeSelectorTerm, node: &Node) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = labels_of(&node.metadata.labels);
    if !exprs
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key)))
    {
        return false;
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    fields.iter().all(|r| {
        // Only metadata.name is a supported field; other fields never match.
        r.key == "metadata.name"
            && matches!(r.operator.as_str(), "In" | "NotIn")
            && requirement_matches(r, Some(&name))
    })
}

/// Whether any term of the node selector matches.
pub fn node_selector_matches(sel: &NodeSelector, node: &Node) -> bool {
    sel.node_selector_terms
        .iter()
        .any(|t| term_matches(t, node))
}

/// The pod's nodeSelector and required node affinity both hold for the node
/// (upstream's `RequiredNodeAffinity.Match`).
pub fn pod_matches_node_selector_and_affinity(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = &pod.spec else { return true };
    let labels = labels_of(&node.metadata.labels);
    for (k, v) in spec.node_selector.iter().flatten() {
        if labels.get(k) != Some(v) {
            return false;
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        Some(sel) => node_selector_matches(sel, node),
        None => true,
    }
}

/// `Toleration.ToleratesTaint`.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(e) = t.effect.as_deref().filter(|e| !e.is_empty()) {
        if e != taint.effect {
            return false;
        }
    }
    let key = t.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "" | "Equal" => {
            t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// The first taint (of those `filter` keeps) that no toleration tolerates.
pub fn untolerated_taint<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    filter: impl Fn(&Taint) -> bool,
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| filter(t))
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// The pod's tolerations.
pub fn tolerations_of(pod: &Pod) -> &[Toleration] {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

/// The node's taints.
pub fn taints_of(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// `namespace/name`.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `spec.priority`, 0 when unset.
pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: serde_json::Value) -> Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n1", "labels": labels}}))
            .expect("node")
    }

    fn term(v: serde_json::Value) -> NodeSelectorTerm {
        serde_json::from_value(v).expect("term")
    }

    #[test]
    fn node_selector_operators() {
        let n = node(serde_json::json!({"cores": "8", "zone": "a"}));
        let ok = |t| term_matches(&term(t), &n);
        assert!(ok(
            serde_json::json!({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]})
        ));
        assert!(!ok(
            serde_json::json!({"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["4"]}]})
        ));
        // Gt/Lt need exactly one integer value and an integer label.
        assert!(!ok(
            serde_json::json!({"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["1"]}]})
        ));
        assert!(ok(
            serde_json::json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]})
        ));
        assert!(ok(
            serde_json::json!({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]})
        ));
        assert!(ok(
            serde_json::json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]})
        ));
        assert!(!ok(
            serde_json::json!({"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["n1"]}]})
        ));
        // An empty term matches nothing.
        assert!(!ok(serde_json::json!({})));
    }

    #[test]
    fn tolerations() {
        let taint = |k: &str, v: &str, e: &str| Taint {
            key: k.into(),
            value: Some(v.into()),
            effect: e.into(),
            ..Default::default()
        };
        let tol =
            |v: serde_json::Value| -> Toleration { serde_json::from_value(v).expect("toleration") };
        let t = taint("k", "v", "NoExecute");
        assert!(tolerates(
            &tol(serde_json::json!({"key": "k", "value": "v"})),
            &t
        ));
        assert!(tolerates(
            &tol(serde_json::json!({"operator": "Exists"})),
            &t
        ));
        assert!(!tolerates(
            &tol(serde_json::json!({"key": "k", "value": "v", "effect": "NoSchedule"})),
            &t
        ));
        assert!(!tolerates(
            &tol(serde_json::json!({"key": "k", "value": "w"})),
            &t
        ));
        let taints = [taint("a", "", "PreferNoSchedule"), t.clone()];
        let hard = |t: &Taint| t.effect == "NoSchedule" || t.effect == "NoExecute";
        assert_eq!(
            untolerated_taint(&taints, &[], hard).map(|t| t.key.as_str()),
            Some("k")
        );
        assert!(untolerated_taint(
            &taints,
            &[tol(serde_json::json!({"key": "k", "operator": "Exists"}))],
            hard
        )
        .is_none());
    }
}
