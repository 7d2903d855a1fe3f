//! The protobuf form of `/openapi/v2` (gnostic's `openapi.v2.Document`), which is the only
//! form client-go asks for: kubectl validates `kind: List` manifests on the client against
//! it, and falls back to it for strategic merge patches.
//!
//! Only what those clients read is encoded: `swagger`, `info` and the `definitions` (with
//! their vendor extensions, e.g. `x-kubernetes-group-version-kind`); the paths are left
//! empty (the JSON form has them). Vendor extension values are gnostic `Any`s whose `yaml`
//! holds the value as JSON text, which YAML readers accept.

use serde_json::Value;

/// Protobuf wire writer.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn string(&mut self, field: u32, s: &str) {
        self.bytes(field, s.as_bytes());
    }

    fn message(&mut self, field: u32, m: Writer) {
        self.bytes(field, &m.0);
    }

    fn bool(&mut self, field: u32, b: bool) {
        self.key(field, 0);
        self.varint(u64::from(b));
    }

    fn double(&mut self, field: u32, f: f64) {
        self.key(field, 1);
        self.0.extend_from_slice(&f.to_le_bytes());
    }
}

/// `Any { yaml }` holding a JSON value.
fn any(v: &Value) -> Writer {
    let mut w = Writer::default();
    w.string(2, &v.to_string());
    w
}

/// `NamedAny { name, value }`.
fn named_any(name: &str, v: &Value) -> Writer {
    let mut w = Writer::default();
    w.string(1, name);
    w.message(2, any(v));
    w
}

/// `NamedSchema { name, value }`.
fn named_schema(name: &str, s: &Value) -> Writer {
    let mut w = Writer::default();
    w.string(1, name);
    w.message(2, schema(s));
    w
}

/// A v2-form schema as gnostic's `Schema`.
fn schema(s: &Value) -> Writer {
    let mut w = Writer::default();
    let Some(m) = s.as_object() else {
        return w;
    };
    let str_of = |k: &str| m.get(k).and_then(Value::as_str);
    if let Some(r) = str_of("$ref") {
        w.string(1, r);
    }
    if let Some(f) = str_of("format") {
        w.string(2, f);
    }
    if let Some(d) = str_of("description") {
        w.string(4, d);
    }
    if let Some(d) = m.get("default") {
        w.message(5, any(d));
    }
    if let Some(x) = m.get("maximum").and_then(Value::as_f64) {
        w.double(7, x);
    }
    if let Some(x) = m.get("minimum").and_then(Value::as_f64) {
        w.double(9, x);
    }
    if let Some(true) = m.get("uniqueItems").and_then(Value::as_bool) {
        w.bool(16, true);
    }
    for r in m
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(r) = r.as_str() {
            w.string(19, r);
        }
    }
    for e in m
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        w.message(20, any(e));
    }
    match m.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut a = Writer::default();
            a.bool(2, *b);
            w.message(21, a);
        }
        Some(s @ Value::Object(_)) => {
            let mut a = Writer::default();
            a.message(1, schema(s));
            w.message(21, a);
        }
        _ => {}
    }
    if let Some(t) = str_of("type") {
        let mut ti = Writer::default();
        ti.string(1, t);
        w.message(22, ti);
    }
    if let Some(i) = m.get("items") {
        let mut ii = Writer::default();
        ii.message(1, schema(i));
        w.message(23, ii);
    }
    for a in m
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        w.message(24, schema(a));
    }
    if let Some(props) = m.get("properties").and_then(Value::as_object) {
        let mut p = Writer::default();
        for (name, ps) in props {
            p.message(1, named_schema(name, ps));
        }
        w.message(25, p);
    }
    for (k, v) in m.iter().filter(|(k, _)| k.starts_with("x-")) {
        w.message(31, named_any(k, v));
    }
    w
}

/// The protobuf document from the v2-form definitions, by name.
pub fn document<'a>(version: &str, definitions: impl Iterator<Item = (&'a str, Value)>) -> Vec<u8> {
    let mut doc = Writer::default();
    doc.string(1, "2.0");
    let mut info = Writer::default();
    info.string(1, "Kubernetes");
    info.string(2, version);
    doc.message(2, info);
    doc.message(8, Writer::default());
    let mut defs = Writer::default();
    for (name, s) in definitions {
        defs.message(1, named_schema(name, &s));
    }
    doc.message(9, defs);
    doc.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wire_format() {
        let mut w = Writer::default();
        w.varint(300);
        assert_eq!(w.0, [0xac, 0x02]);
        let s = schema(&json!({"type": "string", "x-a": [1]}));
        // type = 22 (TypeItem { value = 1 }), vendor_extension = 31 (NamedAny).
        assert_eq!(
            s.0,
            [
                0xb2, 0x01, 8, 0x0a, 6, b's', b't', b'r', b'i', b'n', b'g', //
                0xfa, 0x01, 12, 0x0a, 3, b'x', b'-', b'a', 0x12, 5, 0x12, 3, b'[', b'1', b']'
            ]
        );
    }
}
