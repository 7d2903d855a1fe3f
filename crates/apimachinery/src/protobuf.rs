//! Kubernetes protobuf (`application/vnd.kubernetes.protobuf`) for the built-in API types.
//!
//! Go clients (kubectl's typed clients, client-go) send built-in objects in this form and do
//! not fall back to JSON on 415. A body is the 4-byte magic `k8s\0` followed by a
//! `runtime.Unknown` message: `typeMeta {apiVersion, kind}`, `raw` (the object's own
//! message), `contentEncoding` and `contentType`.
//!
//! [`decode`] turns a body into the JSON the same object has in `application/json`: what
//! upstream gets by unmarshalling the protobuf into the Go struct and marshalling that with
//! encoding/json. gogo-protobuf writes every non-pointer field, zero or not (an empty
//! `generateName`, `generation: 0`, an empty `creationTimestamp` message), so the decoder
//! applies the Go struct's JSON rules: `omitempty`/`omitzero` drop zero values of
//! non-pointer fields, pointers are present exactly when they are on the wire, nil slices and
//! maps without `omitempty` are `null`, structs are always objects. The custom JSON forms of
//! apimachinery are kept: `Time` (RFC 3339 seconds, `null` when zero), `MicroTime` (six
//! fractional digits), `Duration` (Go's duration string), `Quantity` (its string),
//! `IntOrString` (number or string), `RawExtension`/`FieldsV1`/apiextensions `JSON` (the
//! embedded JSON; an embedded protobuf object is decoded too), `[]byte` (base64), the
//! apiextensions `JSONSchemaPropsOr*` unions, and Go slice types such as `ExtraValue`.
//!
//! [`encode`] is the reverse and writes what gogo-protobuf writes: fields in number order,
//! every non-pointer field, map entries sorted by key; for a body decoded from a Go client,
//! `encode(&decode(body)?)` gives back the same bytes.
//!
//! The schema (message names, field numbers and types, and the Go fields' JSON names and
//! shapes) is generated from k8s.io/api, k8s.io/apimachinery and
//! k8s.io/apiextensions-apiserver v0.37.2 by `scripts/gen-proto-schema` into
//! `protobuf/schema.txt`, and parsed once on first use.

pub(crate) mod gotime;
mod omit;
mod schema;
mod wire;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{Map, Number, Value};

pub use omit::{omit_empty, omit_empty_meta};
use schema::{Field, Label, Message, Scalar, Schema, Special, Ty};
use wire::{put_bytes, put_key, put_varint, Reader, WireValue, FIXED32, FIXED64, LEN, VARINT};

/// The 4 bytes every Kubernetes protobuf body starts with.
pub const MAGIC: [u8; 4] = *b"k8s\x00";

/// The media type of Kubernetes protobuf.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Messages nest at most this deep (the object itself is depth 1).
pub const MAX_DEPTH: usize = 100;

/// Why a body could not be decoded, or an object encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtobufError {
    #[error(
        "provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]"
    )]
    BadMagic,
    #[error("protobuf: truncated varint at byte {offset}")]
    TruncatedVarint { offset: usize },
    #[error("protobuf: varint longer than 10 bytes at byte {offset}")]
    VarintOverflow { offset: usize },
    #[error("protobuf: length {len} at byte {offset} runs past the end ({remaining} bytes left)")]
    TruncatedLength {
        offset: usize,
        len: u64,
        remaining: usize,
    },
    #[error("protobuf: truncated fixed-width value at byte {offset}")]
    TruncatedFixed { offset: usize },
    #[error("protobuf: invalid wire type {wire_type} at byte {offset}")]
    InvalidWireType { offset: usize, wire_type: u8 },
    #[error("protobuf: illegal field number {number} at byte {offset}")]
    InvalidFieldNumber { offset: usize, number: u64 },
    #[error("protobuf: wrong wire type {found} for field {message}.{field} (want {expected})")]
    WireTypeMismatch {
        message: &'static str,
        field: &'static str,
        found: u8,
        expected: u8,
    },
    #[error("Object 'Kind' is missing in the protobuf envelope (apiVersion {api_version:?})")]
    MissingKind { api_version: String },
    #[error("Object 'apiVersion' is missing in the protobuf envelope (kind {kind:?})")]
    MissingVersion { kind: String },
    #[error("no kind {kind:?} is registered for version {api_version:?} in the protobuf schema")]
    UnknownKind { api_version: String, kind: String },
    #[error("protobuf: messages nested deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("protobuf: invalid UTF-8 in string field {message}.{field}")]
    InvalidUtf8 {
        message: &'static str,
        field: &'static str,
    },
    #[error("protobuf: invalid value for {message}.{field}: {reason}")]
    InvalidValue {
        message: &'static str,
        field: &'static str,
        reason: String,
    },
    #[error("protobuf: unsupported content encoding {0:?}")]
    UnsupportedEncoding(String),
    #[error("protobuf: cannot encode {path}: {reason}")]
    Encode { path: String, reason: String },
    #[error("protobuf schema: {0}")]
    Schema(String),
}

/// Whether `body` starts with the Kubernetes protobuf magic.
pub fn is_protobuf(body: &[u8]) -> bool {
    body.starts_with(&MAGIC)
}

/// Whether `kind` in `api_version` is a built-in type the protobuf schema covers (custom
/// resources are not: upstream serves them as JSON only).
pub fn is_known_kind(api_version: &str, kind: &str) -> bool {
    schema::schema().is_ok_and(|s| s.kind(api_version, kind).is_some())
}

/// Decodes a Kubernetes protobuf body into the object's JSON, `apiVersion` and `kind` set
/// from the envelope.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let schema = schema::schema()?;
    Decoder { schema }.envelope(body, None, 1)
}

/// As [`decode`], with the `apiVersion` and `kind` to assume when the envelope leaves them
/// empty (upstream defaults them from the request's resource).
pub fn decode_with_defaults(
    body: &[u8],
    api_version: &str,
    kind: &str,
) -> Result<Value, ProtobufError> {
    let schema = schema::schema()?;
    Decoder { schema }.envelope(body, Some((api_version, kind)), 1)
}

/// Encodes an object (with `apiVersion` and `kind`) as a Kubernetes protobuf body.
pub fn encode(obj: &Value) -> Result<Vec<u8>, ProtobufError> {
    let schema = schema::schema()?;
    Encoder { schema }.envelope(obj, 1)
}

/// One event of a protobuf watch stream: `{"type": ..., "object": {...}}` as the
/// `WatchEvent` kube-apiserver frames (the object travels as a full protobuf body inside
/// it), prefixed with its big-endian 32-bit length.
pub fn encode_watch_frame(event: &Value) -> Result<Vec<u8>, ProtobufError> {
    let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
    let object = event
        .get("object")
        .ok_or_else(|| encode_err(&Path::Root, "watch event without an object"))?;
    let raw_object = encode(object)?;
    let mut raw_extension = Vec::with_capacity(raw_object.len() + 8);
    put_bytes(&mut raw_extension, 1, &raw_object);
    // The stream's own messages are raw (upstream's protobuf RawSerializer): no magic
    // and no Unknown envelope around the WatchEvent; only the embedded object has them.
    let mut body = Vec::with_capacity(raw_extension.len() + 16);
    put_bytes(&mut body, 1, kind.as_bytes());
    put_bytes(&mut body, 2, &raw_extension);
    let len =
        u32::try_from(body.len()).map_err(|_| encode_err(&Path::Root, "watch event too large"))?;
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

fn mismatch(m: &Message, f: &Field, found: u8, expected: u8) -> ProtobufError {
    ProtobufError::WireTypeMismatch {
        message: m.name,
        field: f.json,
        found,
        expected,
    }
}

fn invalid(m: &Message, f: &Field, reason: impl Into<String>) -> ProtobufError {
    ProtobufError::InvalidValue {
        message: m.name,
        field: f.json,
        reason: reason.into(),
    }
}

/// What the wire held for one field of a message.
enum Slot<'a> {
    Absent,
    /// A singular scalar: the last occurrence wins.
    One(WireValue<'a>),
    /// A singular message: occurrences merge, which is decoding their concatenation.
    Parts(Vec<&'a [u8]>),
    /// Repeated and map fields: every occurrence (packed runs as one `Len`).
    Many(Vec<WireValue<'a>>),
}

/// The parsed `runtime.Unknown` envelope.
struct Envelope<'a> {
    api_version: &'a str,
    kind: &'a str,
    raw: &'a [u8],
    content_encoding: &'a str,
}

fn envelope_str<'a>(v: WireValue<'a>, field: &'static str) -> Result<&'a str, ProtobufError> {
    match v {
        WireValue::Len(b) => std::str::from_utf8(b).map_err(|_| ProtobufError::InvalidUtf8 {
            message: "k8s.io.apimachinery.pkg.runtime.Unknown",
            field,
        }),
        other => Err(ProtobufError::WireTypeMismatch {
            message: "k8s.io.apimachinery.pkg.runtime.Unknown",
            field,
            found: other.wire_type(),
            expected: LEN,
        }),
    }
}

fn parse_envelope(data: &[u8]) -> Result<Envelope<'_>, ProtobufError> {
    let mut env = Envelope {
        api_version: "",
        kind: "",
        raw: &[],
        content_encoding: "",
    };
    let mut r = Reader::new(data);
    while !r.is_empty() {
        match r.field()? {
            (1, v) => {
                let WireValue::Len(tm) = v else {
                    return Err(ProtobufError::WireTypeMismatch {
                        message: "k8s.io.apimachinery.pkg.runtime.Unknown",
                        field: "typeMeta",
                        found: v.wire_type(),
                        expected: LEN,
                    });
                };
                let mut t = Reader::new(tm);
                while !t.is_empty() {
                    match t.field()? {
                        (1, v) => env.api_version = envelope_str(v, "typeMeta.apiVersion")?,
                        (2, v) => env.kind = envelope_str(v, "typeMeta.kind")?,
                        _ => {}
                    }
                }
            }
            (2, WireValue::Len(raw)) => env.raw = raw,
            (2, v) => {
                return Err(ProtobufError::WireTypeMismatch {
                    message: "k8s.io.apimachinery.pkg.runtime.Unknown",
                    field: "raw",
                    found: v.wire_type(),
                    expected: LEN,
                })
            }
            (3, v) => env.content_encoding = envelope_str(v, "contentEncoding")?,
            (4, v) => {
                envelope_str(v, "contentType")?;
            }
            _ => {}
        }
    }
    Ok(env)
}

struct Decoder<'s> {
    schema: &'s Schema,
}

impl Decoder<'_> {
    fn envelope(
        &self,
        body: &[u8],
        defaults: Option<(&str, &str)>,
        depth: usize,
    ) -> Result<Value, ProtobufError> {
        if depth > MAX_DEPTH {
            return Err(ProtobufError::TooDeep);
        }
        let data = body.strip_prefix(&MAGIC).ok_or(ProtobufError::BadMagic)?;
        let env = parse_envelope(data)?;
        if !env.content_encoding.is_empty() {
            return Err(ProtobufError::UnsupportedEncoding(
                env.content_encoding.to_string(),
            ));
        }
        let (mut api_version, mut kind) = (env.api_version, env.kind);
        if let Some((default_version, default_kind)) = defaults {
            if api_version.is_empty() {
                api_version = default_version;
            }
            if kind.is_empty() {
                kind = default_kind;
            }
        }
        if kind.is_empty() {
            return Err(ProtobufError::MissingKind {
                api_version: api_version.to_string(),
            });
        }
        if api_version.is_empty() {
            return Err(ProtobufError::MissingVersion {
                kind: kind.to_string(),
            });
        }
        let index =
            self.schema
                .kind(api_version, kind)
                .ok_or_else(|| ProtobufError::UnknownKind {
                    api_version: api_version.to_string(),
                    kind: kind.to_string(),
                })?;
        let mut obj = self.object(&self.schema.messages[index], env.raw, depth)?;
        obj.insert("apiVersion".into(), Value::String(api_version.into()));
        obj.insert("kind".into(), Value::String(kind.into()));
        Ok(Value::Object(obj))
    }

    /// What the wire holds for each field of `m`, in `m.fields` order.
    fn collect<'a>(&self, m: &Message, data: &'a [u8]) -> Result<Vec<Slot<'a>>, ProtobufError> {
        let mut slots: Vec<Slot<'a>> = m.fields.iter().map(|_| Slot::Absent).collect();
        let mut r = Reader::new(data);
        while !r.is_empty() {
            let (number, value) = r.field()?;
            // Unknown fields are skipped, as Go does.
            let Some(i) = m.field_index(number) else {
                continue;
            };
            let f = &m.fields[i];
            let found = value.wire_type();
            match f.label {
                Label::Single => {
                    let expected = f.ty.wire_type();
                    if found != expected {
                        return Err(mismatch(m, f, found, expected));
                    }
                    match (f.ty, value) {
                        (Ty::Message(_), WireValue::Len(b)) => match &mut slots[i] {
                            Slot::Parts(parts) => parts.push(b),
                            slot => *slot = Slot::Parts(vec![b]),
                        },
                        _ => slots[i] = Slot::One(value),
                    }
                }
                Label::Repeated | Label::Map(_) => {
                    let expected = match f.label {
                        Label::Map(_) => LEN,
                        _ => f.ty.wire_type(),
                    };
                    // Numeric repeated fields may come packed.
                    let packed = found == LEN
                        && matches!(f.label, Label::Repeated)
                        && matches!(f.ty, Ty::Scalar(s) if s.wire_type() != LEN);
                    if found != expected && !packed {
                        return Err(mismatch(m, f, found, expected));
                    }
                    match &mut slots[i] {
                        Slot::Many(items) => items.push(value),
                        slot => *slot = Slot::Many(vec![value]),
                    }
                }
            }
        }
        Ok(slots)
    }

    /// A message's JSON: an object for plain structs, the custom form for the special ones.
    fn message(&self, m: &Message, data: &[u8], depth: usize) -> Result<Value, ProtobufError> {
        if depth > MAX_DEPTH {
            return Err(ProtobufError::TooDeep);
        }
        match m.special {
            Special::None => self.object(m, data, depth).map(Value::Object),
            _ => self.special(m, data, depth),
        }
    }

    fn object(
        &self,
        m: &Message,
        data: &[u8],
        depth: usize,
    ) -> Result<Map<String, Value>, ProtobufError> {
        if depth > MAX_DEPTH {
            return Err(ProtobufError::TooDeep);
        }
        let slots = self.collect(m, data)?;
        let mut out = Map::new();
        let mut inlined = Vec::new();
        for (f, slot) in m.fields.iter().zip(slots) {
            if f.skip {
                continue;
            }
            let Some(value) = self.field(m, f, slot, depth)? else {
                continue;
            };
            if f.inline {
                if let Value::Object(fields) = value {
                    inlined.push(fields);
                }
            } else {
                out.insert(f.json.to_string(), value);
            }
        }
        // Go: a field of the struct itself wins over a promoted field of the same name.
        for fields in inlined {
            for (k, v) in fields {
                out.entry(k).or_insert(v);
            }
        }
        Ok(out)
    }

    /// One field's JSON value, or `None` when encoding/json leaves it out.
    fn field(
        &self,
        m: &Message,
        f: &Field,
        slot: Slot<'_>,
        depth: usize,
    ) -> Result<Option<Value>, ProtobufError> {
        let omit = f.omitempty || f.omitzero;
        // What a nil pointer, slice or map becomes.
        let nil = || if omit { None } else { Some(Value::Null) };
        match f.label {
            Label::Repeated => {
                let items = match slot {
                    Slot::Many(items) => self.repeated(m, f, &items, depth)?,
                    _ => Vec::new(),
                };
                Ok(if items.is_empty() {
                    nil()
                } else {
                    Some(Value::Array(items))
                })
            }
            Label::Map(key) => {
                let entries = match slot {
                    Slot::Many(entries) => self.map(m, f, key, &entries, depth)?,
                    _ => Map::new(),
                };
                Ok(if entries.is_empty() {
                    nil()
                } else {
                    Some(Value::Object(entries))
                })
            }
            Label::Single => match (f.ty, slot) {
                (Ty::Scalar(Scalar::Bytes), Slot::One(WireValue::Len(b))) => {
                    Ok(if b.is_empty() && f.omitempty {
                        None
                    } else {
                        Some(Value::String(BASE64.encode(b)))
                    })
                }
                (Ty::Scalar(Scalar::Bytes), _) => Ok(nil()),
                (Ty::Scalar(s), Slot::One(v)) => {
                    let value = self.scalar(m, f, s, v)?;
                    Ok(if !f.pointer && omit && is_zero_scalar(&value) {
                        None
                    } else {
                        Some(value)
                    })
                }
                (Ty::Scalar(s), _) => Ok(if f.pointer || omit {
                    nil()
                } else {
                    Some(zero_scalar(s))
                }),
                (Ty::Message(i), slot) => {
                    let sub = &self.schema.messages[i];
                    let value = match slot {
                        Slot::Parts(parts) => {
                            let value = if parts.len() == 1 {
                                self.message(sub, parts[0], depth + 1)?
                            } else {
                                self.message(sub, &parts.concat(), depth + 1)?
                            };
                            // gogo makes a Go slice type that is on the wire non-nil, even
                            // when it has no items.
                            match value {
                                Value::Null if sub.special == Special::List => {
                                    Value::Array(Vec::new())
                                }
                                value => value,
                            }
                        }
                        _ if f.pointer => return Ok(nil()),
                        _ => self.message(sub, &[], depth + 1)?,
                    };
                    if f.pointer {
                        return Ok(Some(value));
                    }
                    // A non-pointer struct: omitempty never drops it, omitzero drops the
                    // zero value; a Go slice type is dropped by omitempty when empty.
                    let drop = match sub.special {
                        Special::List => {
                            omit && value.as_array().is_none_or(|items| items.is_empty())
                        }
                        Special::Time | Special::MicroTime => f.omitzero && value.is_null(),
                        _ => f.omitzero && value == self.message(sub, &[], depth + 1)?,
                    };
                    Ok(if drop { None } else { Some(value) })
                }
            },
        }
    }

    fn scalar(
        &self,
        m: &Message,
        f: &Field,
        s: Scalar,
        v: WireValue<'_>,
    ) -> Result<Value, ProtobufError> {
        Ok(match (s, v) {
            (Scalar::String, WireValue::Len(b)) => Value::String(
                std::str::from_utf8(b)
                    .map_err(|_| ProtobufError::InvalidUtf8 {
                        message: m.name,
                        field: f.json,
                    })?
                    .to_string(),
            ),
            (Scalar::Bytes, WireValue::Len(b)) => Value::String(BASE64.encode(b)),
            (Scalar::Bool, WireValue::Varint(n)) => Value::Bool(n != 0),
            (Scalar::Int32, WireValue::Varint(n)) => Value::from(i64::from(n as i32)),
            (Scalar::Int64, WireValue::Varint(n)) => Value::from(n as i64),
            (Scalar::Uint32, WireValue::Varint(n)) => Value::from(n as u32),
            (Scalar::Uint64, WireValue::Varint(n)) => Value::from(n),
            (Scalar::Double, WireValue::Fixed64(bits)) => float(m, f, f64::from_bits(bits))?,
            (Scalar::Float, WireValue::Fixed32(bits)) => {
                float(m, f, f64::from(f32::from_bits(bits)))?
            }
            (s, v) => return Err(mismatch(m, f, v.wire_type(), s.wire_type())),
        })
    }

    fn repeated(
        &self,
        m: &Message,
        f: &Field,
        items: &[WireValue<'_>],
        depth: usize,
    ) -> Result<Vec<Value>, ProtobufError> {
        let mut out = Vec::with_capacity(items.len());
        for &item in items {
            match (f.ty, item) {
                (Ty::Message(i), WireValue::Len(b)) => {
                    out.push(self.message(&self.schema.messages[i], b, depth + 1)?)
                }
                (Ty::Scalar(s), WireValue::Len(b)) if s.wire_type() != LEN => {
                    // A packed run.
                    let mut r = Reader::new(b);
                    while !r.is_empty() {
                        let v = match s.wire_type() {
                            VARINT => WireValue::Varint(r.varint()?),
                            FIXED64 => WireValue::Fixed64(r.fixed64()?),
                            _ => WireValue::Fixed32(r.fixed32()?),
                        };
                        out.push(self.scalar(m, f, s, v)?);
                    }
                }
                (Ty::Scalar(s), v) => out.push(self.scalar(m, f, s, v)?),
                (Ty::Message(_), v) => return Err(mismatch(m, f, v.wire_type(), LEN)),
            }
        }
        Ok(out)
    }

    fn map(
        &self,
        m: &Message,
        f: &Field,
        key_type: Scalar,
        entries: &[WireValue<'_>],
        depth: usize,
    ) -> Result<Map<String, Value>, ProtobufError> {
        let mut out = Map::new();
        for &entry in entries {
            let WireValue::Len(b) = entry else {
                return Err(mismatch(m, f, entry.wire_type(), LEN));
            };
            let mut key = None;
            let mut value = None;
            let mut r = Reader::new(b);
            while !r.is_empty() {
                match r.field()? {
                    (1, v) => key = Some(v),
                    (2, v) => value = Some(v),
                    _ => {}
                }
            }
            let key = match key {
                Some(k) => match self.scalar(m, f, key_type, k)? {
                    Value::String(s) => s,
                    other => other.to_string(),
                },
                None => match zero_scalar(key_type) {
                    Value::String(s) => s,
                    other => other.to_string(),
                },
            };
            let value = match (f.ty, value) {
                (Ty::Message(i), v) => {
                    let sub = &self.schema.messages[i];
                    let b = match v {
                        Some(WireValue::Len(b)) => b,
                        None => &[],
                        Some(v) => return Err(mismatch(m, f, v.wire_type(), LEN)),
                    };
                    match self.message(sub, b, depth + 1)? {
                        // gogo starts a map value of a Go slice type as an empty, non-nil
                        // slice: `[]`, not null.
                        Value::Null if sub.special == Special::List => Value::Array(Vec::new()),
                        value => value,
                    }
                }
                (Ty::Scalar(s), Some(v)) => self.scalar(m, f, s, v)?,
                (Ty::Scalar(s), None) => zero_scalar(s),
            };
            out.insert(key, value);
        }
        Ok(out)
    }

    /// The custom JSON forms.
    fn special(&self, m: &Message, data: &[u8], depth: usize) -> Result<Value, ProtobufError> {
        let slots = self.collect(m, data)?;
        let slot = |number: u32| -> Option<(&Field, &Slot<'_>)> {
            let i = m.field_index(number)?;
            Some((&m.fields[i], &slots[i]))
        };
        let varint = |number: u32| -> u64 {
            match slot(number) {
                Some((_, Slot::One(WireValue::Varint(n)))) => *n,
                _ => 0,
            }
        };
        let bytes = |number: u32| -> Option<&[u8]> {
            match slot(number) {
                Some((_, Slot::One(WireValue::Len(b)))) => Some(b),
                _ => None,
            }
        };
        let string = |number: u32| -> Result<Option<String>, ProtobufError> {
            match slot(number) {
                Some((f, Slot::One(v))) => match self.scalar(m, f, Scalar::String, *v)? {
                    Value::String(s) => Ok(Some(s)),
                    _ => Ok(None),
                },
                _ => Ok(None),
            }
        };
        // Decodes field `number` as the JSON of its (pointer) message, if present.
        let sub = |number: u32| -> Result<Option<Value>, ProtobufError> {
            match slot(number) {
                Some((f, Slot::Parts(parts))) => match f.ty {
                    Ty::Message(i) => self
                        .message(&self.schema.messages[i], &parts.concat(), depth + 1)
                        .map(Some),
                    Ty::Scalar(_) => Ok(None),
                },
                _ => Ok(None),
            }
        };
        let list = |number: u32| -> Result<Vec<Value>, ProtobufError> {
            match slot(number) {
                Some((f, Slot::Many(items))) => self.repeated(m, f, items, depth),
                _ => Ok(Vec::new()),
            }
        };
        let first = || {
            m.fields
                .first()
                .ok_or_else(|| ProtobufError::Schema(m.name.into()))
        };

        Ok(match m.special {
            Special::Time | Special::MicroTime => {
                if data.is_empty() {
                    return Ok(Value::Null);
                }
                let secs = varint(1) as i64;
                let micro = m.special == Special::MicroTime;
                let (secs, nanos) = if micro {
                    // Go truncates to microseconds (towards zero), then normalises.
                    let nanos = i64::from(varint(2) as i32);
                    gotime::normalise(secs, nanos - nanos % 1000)
                } else {
                    // Time drops the nanoseconds.
                    (secs, 0)
                };
                if secs == gotime::GO_ZERO_UNIX && nanos == 0 {
                    return Ok(Value::Null);
                }
                let micros = micro.then_some((nanos / 1000) as u32);
                match gotime::format_rfc3339(secs, micros) {
                    Some(s) => Value::String(s),
                    None => return Err(invalid(m, first()?, format!("time {secs}s out of range"))),
                }
            }
            Special::Duration => Value::String(gotime::format_duration(varint(1) as i64)),
            Special::Quantity => Value::String(string(1)?.unwrap_or_else(|| "0".into())),
            Special::IntOrString => match varint(1) {
                0 => Value::from(i64::from(varint(2) as i32)),
                1 => Value::String(string(3)?.unwrap_or_default()),
                t => {
                    return Err(invalid(
                        m,
                        first()?,
                        format!("impossible IntOrString.Type {t}"),
                    ))
                }
            },
            Special::RawExtension => match bytes(1) {
                None => Value::Null,
                Some(raw) => self.embedded(m, first()?, raw, depth)?,
            },
            Special::FieldsV1 | Special::Json => match bytes(1) {
                None | Some([]) => Value::Null,
                Some(raw) => embedded_json(m, first()?, raw)?,
            },
            Special::SchemaOrArray => {
                let items = list(2)?;
                if !items.is_empty() {
                    Value::Array(items)
                } else {
                    sub(1)?.unwrap_or(Value::Null)
                }
            }
            Special::SchemaOrBool => match sub(2)? {
                Some(schema) => schema,
                None => Value::Bool(varint(1) != 0),
            },
            Special::SchemaOrStringArray => {
                let items = list(2)?;
                if !items.is_empty() {
                    Value::Array(items)
                } else {
                    sub(1)?.unwrap_or(Value::Null)
                }
            }
            Special::List => {
                let items = list(1)?;
                if items.is_empty() {
                    Value::Null
                } else {
                    Value::Array(items)
                }
            }
            Special::None => Value::Object(self.object(m, data, depth)?),
        })
    }

    /// A RawExtension's bytes: JSON, or a nested protobuf object.
    fn embedded(
        &self,
        m: &Message,
        f: &Field,
        raw: &[u8],
        depth: usize,
    ) -> Result<Value, ProtobufError> {
        if is_protobuf(raw) {
            return self.envelope(raw, None, depth + 1);
        }
        if raw.is_empty() {
            return Ok(Value::Null);
        }
        embedded_json(m, f, raw)
    }
}

fn embedded_json(m: &Message, f: &Field, raw: &[u8]) -> Result<Value, ProtobufError> {
    // The first bytes Go's RawExtension recognises as JSON.
    match raw.first() {
        Some(b'\t' | b'\r' | b'\n' | b' ' | b'{' | b'[' | b'n' | b't' | b'f' | b'"' | b'-')
        | Some(b'0'..=b'9') => {
            serde_json::from_slice(raw).map_err(|e| invalid(m, f, format!("embedded JSON: {e}")))
        }
        _ => Err(invalid(
            m,
            f,
            "embedded data is neither JSON nor Kubernetes protobuf",
        )),
    }
}

fn float(m: &Message, f: &Field, x: f64) -> Result<Value, ProtobufError> {
    if !x.is_finite() {
        return Err(invalid(m, f, format!("unsupported value {x}")));
    }
    // encoding/json writes integral floats without a fraction (1, not 1.0).
    if x.fract() == 0.0 && x.abs() < 9.2e18 {
        return Ok(Value::from(x as i64));
    }
    Ok(Number::from_f64(x).map_or(Value::Null, Value::Number))
}

fn zero_scalar(s: Scalar) -> Value {
    match s {
        Scalar::String | Scalar::Bytes => Value::String(String::new()),
        Scalar::Bool => Value::Bool(false),
        _ => Value::from(0),
    }
}

fn is_zero_scalar(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Null => true,
        _ => false,
    }
}

struct Encoder<'s> {
    schema: &'s Schema,
}

/// Where in the object the encoder is, rendered only for errors.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Field(&'a Path<'a>, &'static str),
    Index(&'a Path<'a>, usize),
    Key(&'a Path<'a>, &'a str),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Field(parent, name) => {
                if !matches!(parent, Path::Root) {
                    write!(f, "{parent}.")?;
                }
                write!(f, "{name}")
            }
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
            Path::Key(parent, k) => write!(f, "{parent}[{k:?}]"),
        }
    }
}

fn encode_err(path: &Path<'_>, reason: impl Into<String>) -> ProtobufError {
    let path = path.to_string();
    ProtobufError::Encode {
        path: if path.is_empty() {
            "the object".into()
        } else {
            path
        },
        reason: reason.into(),
    }
}

fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

impl Encoder<'_> {
    fn envelope(&self, obj: &Value, depth: usize) -> Result<Vec<u8>, ProtobufError> {
        if depth > MAX_DEPTH {
            return Err(ProtobufError::TooDeep);
        }
        let map = obj
            .as_object()
            .ok_or_else(|| encode_err(&Path::Root, "not a JSON object"))?;
        let text = |key: &str| map.get(key).and_then(Value::as_str).unwrap_or("");
        let (api_version, kind) = (text("apiVersion"), text("kind"));
        if kind.is_empty() {
            return Err(ProtobufError::MissingKind {
                api_version: api_version.into(),
            });
        }
        if api_version.is_empty() {
            return Err(ProtobufError::MissingVersion { kind: kind.into() });
        }
        let index =
            self.schema
                .kind(api_version, kind)
                .ok_or_else(|| ProtobufError::UnknownKind {
                    api_version: api_version.into(),
                    kind: kind.into(),
                })?;
        let mut raw = Vec::new();
        self.fields(
            &self.schema.messages[index],
            map,
            &Path::Root,
            depth,
            &mut raw,
        )?;

        let mut type_meta = Vec::new();
        put_bytes(&mut type_meta, 1, api_version.as_bytes());
        put_bytes(&mut type_meta, 2, kind.as_bytes());
        let mut out = Vec::with_capacity(raw.len() + type_meta.len() + 16);
        out.extend_from_slice(&MAGIC);
        put_bytes(&mut out, 1, &type_meta);
        put_bytes(&mut out, 2, &raw);
        put_bytes(&mut out, 3, b"");
        put_bytes(&mut out, 4, b"");
        Ok(out)
    }

    /// Writes the fields of a plain struct message read from a JSON object.
    fn fields(
        &self,
        m: &Message,
        obj: &Map<String, Value>,
        path: &Path<'_>,
        depth: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ProtobufError> {
        if depth > MAX_DEPTH {
            return Err(ProtobufError::TooDeep);
        }
        for f in &m.fields {
            if f.skip {
                continue;
            }
            let fpath = Path::Field(path, f.json);
            if f.inline {
                // The embedded struct's fields live in this same JSON object.
                if let Ty::Message(i) = f.ty {
                    let mut body = Vec::new();
                    self.fields(&self.schema.messages[i], obj, path, depth + 1, &mut body)?;
                    put_bytes(out, f.number, &body);
                }
                continue;
            }
            let v = present(obj.get(f.json));
            match f.label {
                Label::Repeated => {
                    let Some(v) = v else { continue };
                    let items = v
                        .as_array()
                        .ok_or_else(|| encode_err(&fpath, "expected an array"))?;
                    for (n, item) in items.iter().enumerate() {
                        let ipath = Path::Index(&fpath, n);
                        self.value(f.number, f.ty, Some(item), &ipath, depth, out)?;
                    }
                }
                Label::Map(key_type) => {
                    let Some(v) = v else { continue };
                    let entries = v
                        .as_object()
                        .ok_or_else(|| encode_err(&fpath, "expected an object"))?;
                    let mut keys: Vec<&String> = entries.keys().collect();
                    keys.sort();
                    for key in keys {
                        let epath = Path::Key(&fpath, key);
                        let mut entry = Vec::new();
                        let key_value = Value::String(key.clone());
                        let key_value = match key_type {
                            Scalar::String => key_value,
                            _ => serde_json::from_str(key).unwrap_or(key_value),
                        };
                        self.value(
                            1,
                            Ty::Scalar(key_type),
                            Some(&key_value),
                            &epath,
                            depth,
                            &mut entry,
                        )?;
                        let value = entries.get(key.as_str());
                        match f.ty {
                            // A nil []byte value is left out; everything else is written.
                            Ty::Scalar(Scalar::Bytes) if present(value).is_none() => {}
                            _ => self.value(2, f.ty, value, &epath, depth, &mut entry)?,
                        }
                        put_bytes(out, f.number, &entry);
                    }
                }
                Label::Single => {
                    // Pointers, []byte and Go slice types are written only when non-nil.
                    let nil_skips = f.pointer
                        || match f.ty {
                            Ty::Scalar(s) => s == Scalar::Bytes,
                            Ty::Message(i) => self.schema.messages[i].special == Special::List,
                        };
                    if nil_skips && v.is_none() {
                        continue;
                    }
                    self.value(f.number, f.ty, v, &fpath, depth, out)?;
                }
            }
        }
        Ok(())
    }

    /// Writes one value (absent or null: the zero value) as field `number`.
    fn value(
        &self,
        number: u32,
        ty: Ty,
        v: Option<&Value>,
        path: &Path<'_>,
        depth: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ProtobufError> {
        let v = present(v);
        match ty {
            Ty::Scalar(s) => scalar(number, s, v, path, out),
            Ty::Message(i) => {
                let mut body = Vec::new();
                self.message(&self.schema.messages[i], v, path, depth + 1, &mut body)?;
                put_bytes(out, number, &body);
                Ok(())
            }
        }
    }

    /// Writes a message's body from its JSON (absent or null: the zero value).
    fn message(
        &self,
        m: &Message,
        v: Option<&Value>,
        path: &Path<'_>,
        depth: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ProtobufError> {
        if depth > MAX_DEPTH {
            return Err(ProtobufError::TooDeep);
        }
        let v = present(v);
        let first_ty = |number: u32| {
            m.field(number)
                .map(|f| f.ty)
                .ok_or_else(|| ProtobufError::Schema(m.name.into()))
        };
        match m.special {
            Special::None => {
                let empty = Map::new();
                let obj = match v {
                    None => &empty,
                    Some(Value::Object(obj)) => obj,
                    Some(_) => return Err(encode_err(path, "expected an object")),
                };
                self.fields(m, obj, path, depth, out)
            }
            Special::Time | Special::MicroTime => {
                let Some(v) = v else { return Ok(()) };
                let s = v
                    .as_str()
                    .ok_or_else(|| encode_err(path, "expected an RFC 3339 string"))?;
                let (secs, nanos) = gotime::parse_rfc3339(s)
                    .ok_or_else(|| encode_err(path, format!("invalid RFC 3339 time {s:?}")))?;
                let micro = m.special == Special::MicroTime;
                // Go's zero time marshals as an empty message.
                let kept = if micro { nanos - nanos % 1000 } else { nanos };
                if secs == gotime::GO_ZERO_UNIX && kept == 0 {
                    return Ok(());
                }
                put_key(out, 1, VARINT);
                put_varint(out, secs as u64);
                // Time writes whole seconds only.
                put_key(out, 2, VARINT);
                put_varint(out, if micro { u64::from(kept) } else { 0 });
                Ok(())
            }
            Special::Duration => {
                let d = match v {
                    None => 0,
                    Some(Value::String(s)) => gotime::parse_duration(s)
                        .ok_or_else(|| encode_err(path, format!("invalid duration {s:?}")))?,
                    Some(_) => return Err(encode_err(path, "expected a duration string")),
                };
                put_key(out, 1, VARINT);
                put_varint(out, d as u64);
                Ok(())
            }
            Special::Quantity => {
                let s = match v {
                    None => "0".to_string(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    Some(_) => return Err(encode_err(path, "expected a quantity")),
                };
                put_bytes(out, 1, s.as_bytes());
                Ok(())
            }
            Special::IntOrString => {
                let (t, i, s) = match v {
                    None => (0, 0, ""),
                    Some(Value::String(s)) => (1, 0, s.as_str()),
                    Some(Value::Number(n)) => {
                        let i = n
                            .as_i64()
                            .and_then(|i| i32::try_from(i).ok())
                            .ok_or_else(|| encode_err(path, format!("{n} is not an int32")))?;
                        (0, i, "")
                    }
                    Some(_) => return Err(encode_err(path, "expected a number or a string")),
                };
                put_key(out, 1, VARINT);
                put_varint(out, t);
                put_key(out, 2, VARINT);
                put_varint(out, i64::from(i) as u64);
                put_bytes(out, 3, s.as_bytes());
                Ok(())
            }
            Special::RawExtension | Special::FieldsV1 | Special::Json => {
                if let Some(v) = v {
                    let raw = serde_json::to_vec(v).map_err(|e| encode_err(path, e.to_string()))?;
                    put_bytes(out, 1, &raw);
                }
                Ok(())
            }
            Special::SchemaOrArray | Special::SchemaOrStringArray => match v {
                None => Ok(()),
                Some(Value::Array(items)) => {
                    let ty = first_ty(2)?;
                    for (n, item) in items.iter().enumerate() {
                        self.value(2, ty, Some(item), &Path::Index(path, n), depth, out)?;
                    }
                    Ok(())
                }
                Some(obj @ Value::Object(_)) => {
                    self.value(1, first_ty(1)?, Some(obj), path, depth, out)
                }
                Some(_) => Err(encode_err(path, "expected an object or an array")),
            },
            Special::SchemaOrBool => {
                let (allows, schema) = match v {
                    None => (false, None),
                    Some(Value::Bool(b)) => (*b, None),
                    Some(obj @ Value::Object(_)) => (true, Some(obj)),
                    Some(_) => return Err(encode_err(path, "expected an object or a boolean")),
                };
                put_key(out, 1, VARINT);
                put_varint(out, u64::from(allows));
                if let Some(schema) = schema {
                    self.value(2, first_ty(2)?, Some(schema), path, depth, out)?;
                }
                Ok(())
            }
            Special::List => {
                let Some(v) = v else { return Ok(()) };
                let items = v
                    .as_array()
                    .ok_or_else(|| encode_err(path, "expected an array"))?;
                let ty = first_ty(1)?;
                for (n, item) in items.iter().enumerate() {
                    self.value(1, ty, Some(item), &Path::Index(path, n), depth, out)?;
                }
                Ok(())
            }
        }
    }
}

fn integer(v: &Value, path: &Path<'_>) -> Result<i64, ProtobufError> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| {
                n.as_f64()
                    .filter(|x| x.fract() == 0.0 && x.abs() < 9.2e18)
                    .map(|x| x as i64)
            })
            .ok_or_else(|| encode_err(path, format!("{n} is not an integer"))),
        _ => Err(encode_err(path, "expected a number")),
    }
}

/// Writes one scalar as field `number` (absent: the zero value).
fn scalar(
    number: u32,
    s: Scalar,
    v: Option<&Value>,
    path: &Path<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ProtobufError> {
    match s {
        Scalar::String => {
            let text = match v {
                None => "",
                Some(Value::String(t)) => t,
                Some(_) => return Err(encode_err(path, "expected a string")),
            };
            put_bytes(out, number, text.as_bytes());
        }
        Scalar::Bytes => {
            let bytes = match v {
                None => Vec::new(),
                Some(Value::String(t)) => BASE64
                    .decode(t)
                    .map_err(|e| encode_err(path, format!("invalid base64: {e}")))?,
                Some(_) => return Err(encode_err(path, "expected a base64 string")),
            };
            put_bytes(out, number, &bytes);
        }
        Scalar::Bool => {
            let b = match v {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(encode_err(path, "expected a boolean")),
            };
            put_key(out, number, VARINT);
            put_varint(out, u64::from(b));
        }
        Scalar::Int32 | Scalar::Int64 | Scalar::Uint32 | Scalar::Uint64 => {
            let n = match v {
                None => 0,
                Some(v) => integer(v, path)?,
            };
            let fits = match s {
                Scalar::Int32 => i32::try_from(n).is_ok(),
                Scalar::Uint32 => u32::try_from(n).is_ok(),
                Scalar::Uint64 => n >= 0,
                _ => true,
            };
            if !fits {
                return Err(encode_err(path, format!("{n} is out of range")));
            }
            put_key(out, number, VARINT);
            put_varint(out, n as u64);
        }
        Scalar::Double | Scalar::Float => {
            let x = match v {
                None => 0.0,
                Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
                Some(_) => return Err(encode_err(path, "expected a number")),
            };
            if s == Scalar::Double {
                put_key(out, number, FIXED64);
                out.extend_from_slice(&x.to_bits().to_le_bytes());
            } else {
                put_key(out, number, FIXED32);
                out.extend_from_slice(&(x as f32).to_bits().to_le_bytes());
            }
        }
    }
    Ok(())
}
