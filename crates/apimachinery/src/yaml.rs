//! YAML bodies as upstream reads them (sigs.k8s.io/yaml over yaml.v2): a lax decode in which
//! a repeated mapping key keeps its last value, and the strict check that names each repeated
//! key with its line as yaml.v2 does (`line 9: key "foo" already set in map`).
//!
//! serde_yaml's `Value` refuses repeated keys outright, so the lax decode has its own visitor;
//! serde_yaml reports no position of a key, so the strict check walks yaml-rust2's events,
//! which carry each node's line.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// A YAML document that could not be read, worded as yaml.v2 words it
/// (`yaml: line 2: did not find expected key`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Error(String);

/// yaml.v2's nesting limit, named in its error.
const GO_MAX_DEPTH: usize = 10_000;

/// Decodes a YAML (or JSON) document into JSON; a repeated key keeps its last value, and
/// keys that are not strings (`1:`, `true:`) become their text, as sigs.k8s.io/yaml does.
/// Of a stream of documents only the first counts, as yaml.v2's Unmarshal reads it.
pub fn from_slice_lax(body: &[u8]) -> Result<Value, Error> {
    match serde_yaml::Deserializer::from_slice(body).next() {
        Some(doc) => Lax.deserialize(doc).map_err(|e| Error(go_message(&e))),
        None => Ok(Value::Null),
    }
}

/// yaml.v2's text for a libyaml error that serde_yaml (over the same C library's port)
/// renders as `<problem> at line L column C[, <context>[ at line L2 column C2]]`.
///
/// yaml.v2 names one line: the problem mark's if it is past the first line, else the
/// context mark's; both are counted from 0, except a scanner error's problem line, counted
/// from 1 (its mark has not moved past the line yet). serde_yaml prints the context mark
/// only where it differs from the problem mark.
fn go_message(e: &serde_yaml::Error) -> String {
    let text = e.to_string();
    if text.starts_with("recursion limit exceeded") {
        return format!("yaml: exceeded max depth of {GO_MAX_DEPTH}");
    }
    let (head, context) = match text.split_once(", ") {
        Some((h, c)) if c.starts_with("while ") => (h, Some(c)),
        _ => (text.as_str(), None),
    };
    let (problem, problem_line) = split_mark(head);
    let context_line = context.and_then(|c| split_mark(c).1);
    let scanner = context.is_some_and(|c| c.starts_with("while scanning"))
        || SCANNER_PROBLEMS_WITHOUT_CONTEXT.contains(&problem);
    let zero_based = |l: Option<usize>| l.map(|l| l.saturating_sub(1)).filter(|l| *l != 0);
    let line = zero_based(problem_line)
        .map(|l| if scanner { l + 1 } else { l })
        .or_else(|| zero_based(context_line));
    match line {
        Some(l) => format!("yaml: line {l}: {problem}"),
        None => format!("yaml: {problem}"),
    }
}

/// libyaml's scanner errors that carry no context (so no "while scanning").
const SCANNER_PROBLEMS_WITHOUT_CONTEXT: &[&str] = &[
    "mapping values are not allowed in this context",
    "block sequence entries are not allowed in this context",
    "mapping keys are not allowed in this context",
];

/// `<text> at line L column C` into the text and L (1-based).
fn split_mark(s: &str) -> (&str, Option<usize>) {
    match s.rsplit_once(" at line ") {
        Some((text, mark)) => {
            let line = mark.split(' ').next().and_then(|l| l.parse().ok());
            (text, line)
        }
        None => (s, None),
    }
}

/// yaml.v2's strict errors of a document that [`from_slice_lax`] reads: one
/// `line N: key "k" already set in map` per repeated key, in document order (lines count
/// from 1, the body's first line). Empty when there are none, or when the document does not
/// parse (the lax decode reports that).
pub fn duplicate_keys(body: &[u8]) -> Vec<String> {
    let Ok(text) = std::str::from_utf8(body) else {
        return Vec::new();
    };
    let mut dups = Dups::default();
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    if parser.load(&mut dups, false).is_err() {
        return Vec::new();
    }
    dups.found
}

/// The strict walk over the parser's events: which keys each open mapping has seen.
#[derive(Default)]
struct Dups {
    open: Vec<Frame>,
    found: Vec<String>,
}

enum Frame {
    Seq,
    /// The keys so far, and whether the next node is a key.
    Map {
        keys: Vec<String>,
        at_key: bool,
    },
}

impl Dups {
    /// A node starts: a key (its text, None for a collection or an alias) or a value.
    fn node(&mut self, key: Option<String>, line: usize) {
        if let Some(Frame::Map { keys, at_key }) = self.open.last_mut() {
            if *at_key {
                if let Some(k) = key {
                    if keys.contains(&k) {
                        self.found
                            .push(format!("line {line}: key {k} already set in map"));
                    } else {
                        keys.push(k);
                    }
                }
            }
            *at_key = !*at_key;
        }
    }
}

impl yaml_rust2::parser::MarkedEventReceiver for Dups {
    fn on_event(&mut self, ev: yaml_rust2::parser::Event, mark: yaml_rust2::scanner::Marker) {
        use yaml_rust2::parser::Event;
        match ev {
            Event::Scalar(text, style, _, _) => self.node(Some(go_key(&text, style)), mark.line()),
            Event::Alias(_) => self.node(None, mark.line()),
            Event::SequenceStart(..) => {
                self.node(None, mark.line());
                self.open.push(Frame::Seq);
            }
            Event::MappingStart(..) => {
                self.node(None, mark.line());
                self.open.push(Frame::Map {
                    keys: Vec::new(),
                    at_key: true,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                self.open.pop();
            }
            _ => {}
        }
    }
}

/// A key as yaml.v2 prints it with Go's `%#v`: strings quoted, plain numbers, booleans and
/// null as they are.
fn go_key(text: &str, style: yaml_rust2::scanner::TScalarStyle) -> String {
    let plain = style == yaml_rust2::scanner::TScalarStyle::Plain;
    let bare = plain
        && (text.parse::<i64>().is_ok()
            || text.parse::<f64>().is_ok()
            || matches!(text, "true" | "false" | "null" | "~" | ""));
    if bare {
        text.to_owned()
    } else {
        format!("{text:?}")
    }
}

/// The text of a mapping key: strings as they are, other scalars as YAML prints them.
fn key_text(v: Value) -> String {
    match v {
        Value::String(s) => s,
        Value::Null => "null".to_owned(),
        other => other.to_string(),
    }
}

#[derive(Clone, Copy)]
struct Lax;

impl<'de> DeserializeSeed<'de> for Lax {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Lax {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("{v} has no JSON form")))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Lax)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key_seed(Lax)? {
            let v = map.next_value_seed(Lax)?;
            // The last of repeated keys wins, as in yaml.v2's lax decode.
            out.insert(key_text(k), v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lax_keeps_the_last_of_repeated_keys() {
        let v = from_slice_lax(b"a: 1\nb:\n  c: x\n  c: y\n1: one\ntrue: t\n~: n\n").unwrap();
        assert_eq!(
            v,
            json!({"a": 1, "b": {"c": "y"}, "1": "one", "true": "t", "null": "n"})
        );
        assert_eq!(
            from_slice_lax(br#"{"a": [1, 2.5, "x", null, false]}"#).unwrap(),
            json!({"a": [1, 2.5, "x", null, false]})
        );
        assert!(from_slice_lax(b"a: [1, 2\n").is_err());
        // The first of several documents, as yaml.v2's Unmarshal.
        assert_eq!(
            from_slice_lax(b"a: 1\n---\nb: 2\n").unwrap(),
            json!({"a": 1})
        );
        assert_eq!(from_slice_lax(b"").unwrap(), Value::Null);
    }

    #[test]
    fn errors_are_worded_as_yaml_v2() {
        let err = |b: &str| from_slice_lax(b.as_bytes()).unwrap_err().to_string();
        // kube-apiserver v1.37.2's answers for these bodies.
        assert_eq!(
            err("metadata:\n  name: broken\n data: [\n"),
            "yaml: line 2: did not find expected key"
        );
        assert_eq!(
            err(&"[".repeat(20_000)),
            "yaml: exceeded max depth of 10000"
        );
        assert_eq!(
            err("a: b: c\n"),
            "yaml: mapping values are not allowed in this context"
        );
        assert_eq!(
            err("metadata:\n  name: \"open\n"),
            "yaml: line 3: found unexpected end of stream"
        );
        assert_eq!(
            err("metadata:\n\tname: tabbed\n"),
            "yaml: line 2: found character that cannot start any token"
        );
    }

    #[test]
    fn strict_names_each_repeated_key_with_its_line() {
        // Upstream's conformance body: a leading blank line, so `foo: foo2` is line 9.
        let body = "\napiVersion: v1\nkind: Noxu\nmetadata:\n  name: mytest\nspec:\n  unknown: uk1\n  foo: foo1\n  foo: foo2\n  cronSpec: x\n";
        assert_eq!(
            duplicate_keys(body.as_bytes()),
            [r#"line 9: key "foo" already set in map"#]
        );
        let two = "a: 1\nb:\n  - x: 1\n    x: 2\na: 3\n";
        assert_eq!(
            duplicate_keys(two.as_bytes()),
            [
                r#"line 4: key "x" already set in map"#,
                r#"line 5: key "a" already set in map"#
            ]
        );
        assert!(duplicate_keys(b"a: 1\nb: 2\n").is_empty());
        assert!(duplicate_keys(b"a: [1, 2\n").is_empty());
        assert_eq!(
            duplicate_keys(br#"{"a": 1, "a": 2}"#),
            [r#"line 1: key "a" already set in map"#]
        );
    }
}
