//! A structural diff of two JSON values: every path where they differ, with both values.

use std::fmt;

use serde_json::Value;

/// One step of a path into a JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// An object member.
    Key(String),
    /// An array element.
    Index(usize),
}

/// A path into a JSON value, shown as `spec.containers[0].image`, with keys that are not
/// plain words quoted: `metadata.labels["app.kubernetes.io/name"]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JsonPath(pub Vec<Segment>);

impl JsonPath {
    /// The segments.
    pub fn segments(&self) -> &[Segment] {
        &self.0
    }

    /// The last key on the path, if the last segment is a key.
    pub fn last_key(&self) -> Option<&str> {
        match self.0.last() {
            Some(Segment::Key(k)) => Some(k),
            _ => None,
        }
    }
}

fn plain_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == ':' || c == '$')
}

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(whole body)");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Segment::Key(k) if plain_key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Segment::Key(k) => write!(f, "[{}]", Value::String(k.clone()))?,
                Segment::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// The two values at a path where they differ; `None` is "absent on that side".
#[derive(Debug, Clone, PartialEq)]
pub struct ValueDiff {
    /// Where.
    pub path: JsonPath,
    /// The left value, or `None` when the left side has nothing there.
    pub left: Option<Value>,
    /// The right value, or `None` when the right side has nothing there.
    pub right: Option<Value>,
}

/// Every path at which `left` and `right` differ. Objects are compared member by member
/// (left's order, then members only the right has), arrays element by element, and
/// anything else (including a type change) as a whole.
pub fn diff_values(left: &Value, right: &Value) -> Vec<ValueDiff> {
    let mut out = Vec::new();
    let mut path = Vec::new();
    walk(left, right, &mut path, &mut out);
    out
}

fn walk(left: &Value, right: &Value, path: &mut Vec<Segment>, out: &mut Vec<ValueDiff>) {
    match (left, right) {
        (Value::Object(l), Value::Object(r)) => {
            for (k, lv) in l {
                path.push(Segment::Key(k.clone()));
                match r.get(k) {
                    Some(rv) => walk(lv, rv, path, out),
                    None => out.push(ValueDiff {
                        path: JsonPath(path.clone()),
                        left: Some(lv.clone()),
                        right: None,
                    }),
                }
                path.pop();
            }
            for (k, rv) in r {
                if !l.contains_key(k) {
                    path.push(Segment::Key(k.clone()));
                    out.push(ValueDiff {
                        path: JsonPath(path.clone()),
                        left: None,
                        right: Some(rv.clone()),
                    });
                    path.pop();
                }
            }
        }
        (Value::Array(l), Value::Array(r)) => {
            for i in 0..l.len().max(r.len()) {
                path.push(Segment::Index(i));
                match (l.get(i), r.get(i)) {
                    (Some(lv), Some(rv)) => walk(lv, rv, path, out),
                    (lv, rv) => out.push(ValueDiff {
                        path: JsonPath(path.clone()),
                        left: lv.cloned(),
                        right: rv.cloned(),
                    }),
                }
                path.pop();
            }
        }
        (l, r) => {
            if l != r {
                out.push(ValueDiff {
                    path: JsonPath(path.clone()),
                    left: Some(l.clone()),
                    right: Some(r.clone()),
                });
            }
        }
    }
}

/// A value in a report line: compact JSON, cut after `max` characters.
pub fn show(v: Option<&Value>, max: usize) -> String {
    match v {
        None => "<absent>".to_string(),
        Some(v) => {
            let s = v.to_string();
            if s.chars().count() > max {
                let cut: String = s.chars().take(max).collect();
                format!("{cut}…")
            } else {
                s
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lines(l: Value, r: Value) -> Vec<String> {
        diff_values(&l, &r)
            .iter()
            .map(|d| {
                format!(
                    "{}: {} vs {}",
                    d.path,
                    show(d.left.as_ref(), 80),
                    show(d.right.as_ref(), 80)
                )
            })
            .collect()
    }

    #[test]
    fn equal_values_have_no_diff() {
        let v = json!({"a": [1, {"b": null}], "c": "x"});
        assert!(diff_values(&v, &v.clone()).is_empty());
    }

    #[test]
    fn lists_each_differing_path() {
        // Member order depends on serde_json's `preserve_order` feature: compare sorted.
        let mut got = lines(
            json!({"spec": {"containers": [{"name": "c", "imagePullPolicy": "IfNotPresent"}]},
                   "metadata": {"labels": {"app.kubernetes.io/name": "a", "x": "1"}}, "only_left": 1}),
            json!({"spec": {"containers": [{"name": "c", "imagePullPolicy": "Always"}]},
                   "metadata": {"labels": {"app.kubernetes.io/name": "b", "x": "1"}}, "only_right": true}),
        );
        got.sort();
        assert_eq!(
            got,
            vec![
                r#"metadata.labels["app.kubernetes.io/name"]: "a" vs "b""#,
                "only_left: 1 vs <absent>",
                "only_right: <absent> vs true",
                r#"spec.containers[0].imagePullPolicy: "IfNotPresent" vs "Always""#,
            ]
        );
    }

    #[test]
    fn arrays_of_different_length_and_type_changes() {
        let got = lines(
            json!({"a": [1, 2, 3], "b": 1}),
            json!({"a": [1, 5], "b": "1"}),
        );
        assert_eq!(
            got,
            vec!["a[1]: 2 vs 5", "a[2]: 3 vs <absent>", r#"b: 1 vs "1""#]
        );
        assert_eq!(
            lines(json!([1]), json!({"k": 1})),
            vec![r#"(whole body): [1] vs {"k":1}"#]
        );
    }

    #[test]
    fn long_values_are_cut() {
        let long = Value::String("x".repeat(200));
        assert_eq!(show(Some(&long), 10).chars().count(), 11);
        assert_eq!(show(None, 10), "<absent>");
    }
}
