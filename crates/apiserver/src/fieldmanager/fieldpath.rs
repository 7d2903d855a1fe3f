//! Field paths and sets of them, as structured-merge-diff has them, and their FieldsV1
//! encoding (`f:name`, `k:{"name":"web"}`, `v:"x"`, `i:0`, `.`).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{json, Map, Value};

/// One step of a path into an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pe {
    /// A field of a struct or a key of a map.
    Field(String),
    /// An item of an associative list, by its key fields (sorted by name).
    Key(Vec<(String, Value)>),
    /// An item of a set, by its value.
    Value(Value),
    /// An item of an atomic list, by its position.
    Index(i64),
}

impl Pe {
    fn rank(&self) -> u8 {
        match self {
            Pe::Field(_) => 0,
            Pe::Key(_) => 1,
            Pe::Value(_) => 2,
            Pe::Index(_) => 3,
        }
    }

    /// The FieldsV1 key of this element.
    pub fn encode(&self) -> String {
        match self {
            Pe::Field(f) => format!("f:{f}"),
            Pe::Key(k) => {
                let m: Map<String, Value> = k.iter().cloned().collect();
                format!("k:{}", Value::Object(m))
            }
            Pe::Value(v) => format!("v:{v}"),
            Pe::Index(i) => format!("i:{i}"),
        }
    }

    /// Parses a FieldsV1 key.
    pub fn decode(s: &str) -> Result<Pe, String> {
        let (prefix, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("invalid path element: {s}"))?;
        match prefix {
            "f" => Ok(Pe::Field(rest.to_owned())),
            "k" => match serde_json::from_str::<Value>(rest) {
                Ok(Value::Object(m)) => Ok(Pe::Key(m.into_iter().collect())),
                _ => Err(format!("invalid key: {rest}")),
            },
            "v" => serde_json::from_str(rest)
                .map(Pe::Value)
                .map_err(|e| format!("invalid value {rest}: {e}")),
            "i" => rest
                .parse()
                .map(Pe::Index)
                .map_err(|e| format!("invalid index {rest}: {e}")),
            _ => Err(format!("unknown path element type: {prefix}")),
        }
    }
}

fn cmp_values(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Null => 0,
            Value::Bool(_) => 1,
            Value::Number(_) => 2,
            Value::String(_) => 3,
            Value::Array(_) => 4,
            Value::Object(_) => 5,
        }
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x
            .as_f64()
            .partial_cmp(&y.as_f64())
            .unwrap_or(Ordering::Equal),
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        _ => rank(a)
            .cmp(&rank(b))
            .then_with(|| a.to_string().cmp(&b.to_string())),
    }
}

impl Ord for Pe {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Pe::Field(a), Pe::Field(b)) => a.cmp(b),
            (Pe::Key(a), Pe::Key(b)) => {
                for ((ka, va), (kb, vb)) in a.iter().zip(b) {
                    let o = ka.cmp(kb).then_with(|| cmp_values(va, vb));
                    if o != Ordering::Equal {
                        return o;
                    }
                }
                a.len().cmp(&b.len())
            }
            (Pe::Value(a), Pe::Value(b)) => cmp_values(a, b),
            (Pe::Index(a), Pe::Index(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for Pe {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Pe {
    /// As in conflict messages: `.name`, `[name="web"]`, `[="x"]`, `[0]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pe::Field(n) => write!(f, ".{n}"),
            Pe::Key(k) => {
                let parts: Vec<String> = k.iter().map(|(n, v)| format!("{n}={v}")).collect();
                write!(f, "[{}]", parts.join(","))
            }
            Pe::Value(v) => write!(f, "[={v}]"),
            Pe::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// A path, printed as upstream prints it (`.data.key`).
pub struct PathDisplay<'a>(pub &'a [Pe]);

impl fmt::Display for PathDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|pe| write!(f, "{pe}"))
    }
}

/// A set of paths: the paths ending here (`members`) and those going further
/// (`children`, never empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Set {
    members: BTreeSet<Pe>,
    children: BTreeMap<Pe, Set>,
}

impl Set {
    pub fn new() -> Set {
        Set::default()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.is_empty()
    }

    /// Adds a path (the empty path is no member of any set).
    pub fn insert(&mut self, path: &[Pe]) {
        match path {
            [] => {}
            [pe] => {
                self.members.insert(pe.clone());
            }
            [pe, rest @ ..] => self.children.entry(pe.clone()).or_default().insert(rest),
        }
    }

    /// Whether the path is a member.
    pub fn has(&self, path: &[Pe]) -> bool {
        match path {
            [] => false,
            [pe] => self.members.contains(pe),
            [pe, rest @ ..] => self.children.get(pe).is_some_and(|c| c.has(rest)),
        }
    }

    pub fn member(&self, pe: &Pe) -> bool {
        self.members.contains(pe)
    }

    pub fn child(&self, pe: &Pe) -> Option<&Set> {
        self.children.get(pe)
    }

    pub fn union(&self, other: &Set) -> Set {
        let mut out = self.clone();
        out.members.extend(other.members.iter().cloned());
        for (pe, c) in &other.children {
            let merged = match out.children.get(pe) {
                Some(mine) => mine.union(c),
                None => c.clone(),
            };
            out.children.insert(pe.clone(), merged);
        }
        out
    }

    /// The paths of `self` that are not paths of `other`.
    pub fn difference(&self, other: &Set) -> Set {
        let members = self.members.difference(&other.members).cloned().collect();
        let mut children = BTreeMap::new();
        for (pe, c) in &self.children {
            let d = match other.children.get(pe) {
                Some(o) => c.difference(o),
                None => c.clone(),
            };
            if !d.is_empty() {
                children.insert(pe.clone(), d);
            }
        }
        Set { members, children }
    }

    pub fn intersection(&self, other: &Set) -> Set {
        let members = self.members.intersection(&other.members).cloned().collect();
        let mut children = BTreeMap::new();
        for (pe, c) in &self.children {
            if let Some(o) = other.children.get(pe) {
                let i = c.intersection(o);
                if !i.is_empty() {
                    children.insert(pe.clone(), i);
                }
            }
        }
        Set { members, children }
    }

    /// The paths of `self` that neither are members of `other` nor lie under one.
    pub fn recursive_difference(&self, other: &Set) -> Set {
        let members = self.members.difference(&other.members).cloned().collect();
        let mut children = BTreeMap::new();
        for (pe, c) in &self.children {
            if other.members.contains(pe) {
                continue;
            }
            let d = match other.children.get(pe) {
                Some(o) => c.recursive_difference(o),
                None => c.clone(),
            };
            if !d.is_empty() {
                children.insert(pe.clone(), d);
            }
        }
        Set { members, children }
    }

    /// Every member path, in order.
    pub fn paths(&self) -> Vec<Vec<Pe>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<Pe>, out: &mut Vec<Vec<Pe>>) {
        let keys: BTreeSet<&Pe> = self.members.iter().chain(self.children.keys()).collect();
        for pe in keys {
            prefix.push(pe.clone());
            if self.members.contains(pe) {
                out.push(prefix.clone());
            }
            if let Some(c) = self.children.get(pe) {
                c.collect(prefix, out);
            }
            prefix.pop();
        }
    }

    /// The FieldsV1 form.
    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        for pe in &self.members {
            m.insert(pe.encode(), json!({}));
        }
        for (pe, c) in &self.children {
            let mut inner = c.to_fields_v1();
            if self.members.contains(pe) {
                if let Some(o) = inner.as_object_mut() {
                    o.insert(".".into(), json!({}));
                }
            }
            m.insert(pe.encode(), inner);
        }
        Value::Object(m)
    }

    /// Parses the FieldsV1 form.
    pub fn from_fields_v1(v: &Value) -> Result<Set, String> {
        let m = v
            .as_object()
            .ok_or_else(|| "FieldsV1 must be an object".to_owned())?;
        let mut set = Set::new();
        for (k, inner) in m {
            if k == "." {
                continue;
            }
            let pe = Pe::decode(k)?;
            let o = inner
                .as_object()
                .ok_or_else(|| format!("FieldsV1 at {k} must be an object"))?;
            if o.is_empty() || o.contains_key(".") {
                set.members.insert(pe.clone());
            }
            let child = Set::from_fields_v1(inner)?;
            if !child.is_empty() {
                set.children.insert(pe, child);
            }
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_v1_round_trip() {
        let v = json!({
            "f:data": {".": {}, "f:key": {}},
            "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:image": {}}}},
            "f:metadata": {"f:finalizers": {"v:\"a\"": {}}},
        });
        let s = Set::from_fields_v1(&v).unwrap();
        assert!(s.has(&[Pe::Field("data".into())]));
        assert!(!s.has(&[Pe::Field("spec".into())]));
        assert_eq!(s.to_fields_v1(), v);
        let paths: Vec<String> = s
            .paths()
            .iter()
            .map(|p| PathDisplay(p).to_string())
            .collect();
        assert_eq!(
            paths,
            [
                ".data",
                ".data.key",
                ".metadata.finalizers[=\"a\"]",
                ".spec.containers[name=\"web\"]",
                ".spec.containers[name=\"web\"].image",
            ]
        );
    }

    #[test]
    fn set_algebra() {
        let f = |s: &str| Pe::Field(s.into());
        let mut a = Set::new();
        a.insert(&[f("data")]);
        a.insert(&[f("data"), f("x")]);
        let mut b = Set::new();
        b.insert(&[f("data"), f("x")]);
        let d = a.difference(&b);
        assert!(d.has(&[f("data")]) && !d.has(&[f("data"), f("x")]));
        let mut top = Set::new();
        top.insert(&[f("data")]);
        assert!(a.recursive_difference(&top).is_empty());
        assert_eq!(a.intersection(&b), b);
    }
}
