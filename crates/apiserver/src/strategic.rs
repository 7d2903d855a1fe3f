//! Strategic merge patch (`application/strategic-merge-patch+json`) for the built-in types.
//!
//! Like a JSON merge patch, except that lists the Go types mark with a patch merge key
//! (`containers` by `name`, `volumeMounts` by `mountPath`, ...) are merged element by
//! element, lists of strings marked `merge` (`finalizers`) are merged as sets, and the
//! directives `$patch` (`delete`, `replace`, `merge`), `$deleteFromPrimitiveList/<field>`,
//! `$setElementOrder/<field>` and `$retainKeys` are honoured. Upstream reads the merge
//! keys from the Go struct tags; here they are a table by field name, which is unambiguous
//! for the built-in types but `ports` (containers by `containerPort`, services by `port`).

use serde_json::{Map, Value};

/// How a list field is patched.
enum ListStrategy {
    /// Elements are objects matched by this key.
    ByKey(&'static str),
    /// A list of scalars merged as a set.
    Set,
    /// Replaced as a whole (the merge-patch behaviour).
    Replace,
}

fn list_strategy(field: &str, orig: &[Value], patch: &[Value]) -> ListStrategy {
    let has = |k: &str| orig.iter().chain(patch.iter()).any(|e| e.get(k).is_some());
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates"
        | "secrets" => ListStrategy::ByKey("name"),
        "volumeMounts" => ListStrategy::ByKey("mountPath"),
        "volumeDevices" => ListStrategy::ByKey("devicePath"),
        "hostAliases" => ListStrategy::ByKey("ip"),
        "podIPs" | "hostIPs" => ListStrategy::ByKey("ip"),
        "conditions" | "addresses" => ListStrategy::ByKey("type"),
        "ownerReferences" => ListStrategy::ByKey("uid"),
        "topologySpreadConstraints" => ListStrategy::ByKey("topologyKey"),
        "ports" if has("containerPort") => ListStrategy::ByKey("containerPort"),
        "ports" if has("port") => ListStrategy::ByKey("port"),
        "finalizers" => ListStrategy::Set,
        _ => ListStrategy::Replace,
    }
}

/// Applies a strategic merge patch to `doc`.
pub fn apply(doc: &mut Value, patch: &Value) {
    merge_value(doc, patch);
}

fn merge_value(doc: &mut Value, patch: &Value) {
    match (doc.as_object_mut(), patch.as_object()) {
        (Some(d), Some(p)) => merge_map(d, p),
        _ => {
            let mut p = patch.clone();
            strip_directives(&mut p);
            *doc = p;
        }
    }
}

/// Removes patch directives from a value that is inserted as is.
fn strip_directives(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !k.starts_with('$'));
            for x in m.values_mut() {
                strip_directives(x);
            }
        }
        Value::Array(a) => {
            a.retain(|e| e.get("$patch").and_then(Value::as_str) != Some("delete"));
            for x in a {
                strip_directives(x);
            }
        }
        _ => {}
    }
}

fn merge_map(doc: &mut Map<String, Value>, patch: &Map<String, Value>) {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut p = Value::Object(patch.clone());
            strip_directives(&mut p);
            if let Value::Object(p) = p {
                *doc = p;
            }
            return;
        }
        Some("delete") => {
            doc.clear();
            return;
        }
        _ => {}
    }
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        doc.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(list), Some(gone)) = (
                doc.get_mut(field).and_then(Value::as_array_mut),
                v.as_array(),
            ) {
                list.retain(|e| !gone.contains(e));
            }
            continue;
        }
        if let Some(field) = k.strip_prefix("$setElementOrder/") {
            // An order for a list the patch does not otherwise touch.
            if !patch.contains_key(field) {
                if let (Some(Value::Array(list)), Some(order)) = (doc.get_mut(field), v.as_array())
                {
                    let original = list.clone();
                    reorder(field, list, &original, order);
                }
            }
            continue;
        }
        if k.starts_with('$') {
            // $patch and $retainKeys are handled above.
            continue;
        }
        if v.is_null() {
            doc.remove(k);
            continue;
        }
        let order = patch
            .get(&format!("$setElementOrder/{k}"))
            .and_then(Value::as_array);
        match (doc.get_mut(k), v) {
            (Some(Value::Array(orig)), Value::Array(p)) => merge_list(k, orig, p, order),
            (Some(d), _) => merge_value(d, v),
            (None, _) => {
                let mut p = v.clone();
                strip_directives(&mut p);
                if matches!(&p, Value::Object(m) if m.is_empty()) && is_delete_all(v) {
                    continue;
                }
                doc.insert(k.clone(), p);
            }
        }
    }
}

fn is_delete_all(v: &Value) -> bool {
    v.get("$patch").and_then(Value::as_str) == Some("delete")
}

/// The identity of a list element for ordering: its merge key's value (or the element
/// itself in a list of scalars).
fn ident<'a>(field: &str, list: &[Value], e: &'a Value) -> &'a Value {
    match list_strategy(field, list, std::slice::from_ref(e)) {
        ListStrategy::ByKey(key) => e.get(key).unwrap_or(e),
        _ => e,
    }
}

/// Upstream's element order after a merge (normalizeElementOrder): the elements the patch
/// names, in the patch's order (or `$setElementOrder`'s), interleaved with the elements
/// only the server had, in their old order; where the two cannot be compared (an element
/// new to the list), the patch's element goes first.
fn reorder(field: &str, merged: &mut Vec<Value>, original: &[Value], order: &[Value]) {
    let ids: Vec<Value> = order
        .iter()
        .map(|e| ident(field, original, e).clone())
        .collect();
    let pos_in = |list: &[Value], id: &Value| -> Option<usize> {
        list.iter().position(|e| ident(field, original, e) == id)
    };
    let (mut mine, theirs): (Vec<Value>, Vec<Value>) = std::mem::take(merged)
        .into_iter()
        .partition(|e| ids.contains(ident(field, original, e)));
    mine.sort_by_key(|e| ids.iter().position(|i| i == ident(field, original, e)));
    let (mut left, mut right) = (theirs.into_iter().peekable(), mine.into_iter().peekable());
    while left.peek().is_some() || right.peek().is_some() {
        let take_left = match (left.peek(), right.peek()) {
            (Some(_), None) => true,
            (None, _) => false,
            (Some(l), Some(r)) => {
                let li = pos_in(original, ident(field, original, l));
                let ri = pos_in(original, ident(field, original, r));
                matches!((li, ri), (Some(a), Some(b)) if a < b)
            }
        };
        let next = if take_left { left.next() } else { right.next() };
        merged.extend(next);
    }
}

fn merge_list(field: &str, orig: &mut Vec<Value>, patch: &[Value], order: Option<&Vec<Value>>) {
    // `[{"$patch": "replace"}, ...]` replaces the list with the other elements.
    if patch
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        let mut rest: Vec<Value> = patch
            .iter()
            .filter(|e| e.get("$patch").is_none())
            .cloned()
            .collect();
        for e in &mut rest {
            strip_directives(e);
        }
        *orig = rest;
        return;
    }
    match list_strategy(field, orig, patch) {
        ListStrategy::Replace => {
            let mut p = Value::Array(patch.to_vec());
            strip_directives(&mut p);
            if let Value::Array(p) = p {
                *orig = p;
            }
        }
        ListStrategy::Set => {
            let original = orig.clone();
            for e in patch {
                if !orig.contains(e) {
                    orig.push(e.clone());
                }
            }
            let order = order.cloned().unwrap_or_else(|| patch.to_vec());
            reorder(field, orig, &original, &order);
        }
        ListStrategy::ByKey(key) => {
            let original = orig.clone();
            for e in patch {
                let Some(id) = e.get(key) else {
                    continue;
                };
                let pos = orig.iter().position(|o| o.get(key) == Some(id));
                if is_delete_all(e) {
                    if let Some(i) = pos {
                        orig.remove(i);
                    }
                    continue;
                }
                match pos {
                    Some(i) => merge_value(&mut orig[i], e),
                    None => {
                        let mut n = e.clone();
                        strip_directives(&mut n);
                        orig.push(n);
                    }
                }
            }
            // The patch's own order leaves out its deletions.
            let order = order.cloned().unwrap_or_else(|| {
                patch
                    .iter()
                    .filter(|e| !is_delete_all(e) && e.get(key).is_some())
                    .cloned()
                    .collect()
            });
            reorder(field, orig, &original, &order);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn containers_merge_by_name() {
        // New elements go first, as on kube-apiserver (env [A] + patch [B] is [B, A] there).
        let mut doc = json!({"spec": {"containers": [
            {"name": "a", "image": "x", "env": [{"name": "A", "value": "1"}]},
            {"name": "b", "image": "y"},
        ], "finalizers": ["f1"]}});
        apply(
            &mut doc,
            &json!({"spec": {"containers": [
                {"name": "a", "image": "x2", "env": [{"name": "B", "value": "2"}]},
                {"name": "b", "$patch": "delete"},
                {"name": "c", "image": "z"},
            ], "finalizers": ["f2"]}}),
        );
        assert_eq!(
            doc,
            json!({"spec": {"containers": [
                {"name": "a", "image": "x2", "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]},
                {"name": "c", "image": "z"},
            ], "finalizers": ["f2", "f1"]}})
        );
    }

    #[test]
    fn unknown_lists_are_replaced_and_null_deletes() {
        let mut doc = json!({"args": ["a", "b"], "data": {"k": "v", "gone": "x"}});
        apply(&mut doc, &json!({"args": ["c"], "data": {"gone": null}}));
        assert_eq!(doc, json!({"args": ["c"], "data": {"k": "v"}}));
    }

    #[test]
    fn element_order_is_upstreams() {
        // A new element goes before the elements only the server had (observed on
        // kube-apiserver: patching in container zz gives zz, db).
        let mut doc = json!({"containers": [{"name": "db", "image": "a"}]});
        apply(
            &mut doc,
            &json!({"containers": [{"name": "zz", "image": "b"}]}),
        );
        assert_eq!(doc["containers"][0]["name"], "zz");
        assert_eq!(doc["containers"][1]["name"], "db");
        // Elements the patch names keep the patch's order, interleaved with the rest.
        let mut doc = json!({"env": [{"name": "A"}, {"name": "B"}, {"name": "C"}]});
        apply(
            &mut doc,
            &json!({"env": [{"name": "C", "value": "3"}, {"name": "A", "value": "1"}]}),
        );
        let names: Vec<&str> = doc["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["B", "C", "A"]);
        // $setElementOrder orders a list the patch does not otherwise change.
        let mut doc =
            json!({"containers": [{"name": "a"}, {"name": "b"}], "finalizers": ["x", "y"]});
        apply(
            &mut doc,
            &json!({"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                    "$setElementOrder/finalizers": ["y", "x"], "finalizers": ["y"]}),
        );
        assert_eq!(doc["containers"], json!([{"name": "b"}, {"name": "a"}]));
        assert_eq!(doc["finalizers"], json!(["y", "x"]));
    }

    #[test]
    fn directives() {
        let mut doc = json!({"finalizers": ["a", "b"], "m": {"x": 1, "y": 2}});
        apply(
            &mut doc,
            &json!({"$deleteFromPrimitiveList/finalizers": ["a"], "m": {"$patch": "replace", "z": 3}}),
        );
        assert_eq!(doc, json!({"finalizers": ["b"], "m": {"z": 3}}));
    }
}
