//! Content negotiation: what the client sent (JSON or YAML) and what it accepts back
//! (an object, a `Table`, `PartialObjectMetadata`, JSON or YAML).

use kumo_apimachinery::status::ApiError;
use serde_json::Value;

/// Largest request body read (kube-apiserver's limit is 3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// How deeply nested a decoded body may be (JSON bombs are refused, not recursed into).
pub const MAX_DEPTH: usize = 100;

/// The representation an answer is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The object or list itself.
    Object,
    /// `meta.k8s.io/v1` Table.
    Table,
    /// `meta.k8s.io/v1` PartialObjectMetadata (or its List).
    Metadata,
}

/// The chosen answer format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accept {
    pub output: Output,
    pub yaml: bool,
    /// The Table or PartialObjectMetadata asked for is meta.k8s.io/v1beta1 (still served
    /// upstream, the same objects under that version).
    pub beta: bool,
}

impl Accept {
    /// The object itself, as JSON.
    pub const OBJECT: Accept = Accept {
        output: Output::Object,
        yaml: false,
        beta: false,
    };

    /// Names `doc` (a Table or PartialObjectMetadata answer) with the meta.k8s.io version
    /// asked for.
    pub fn version_meta(&self, doc: &mut serde_json::Value) {
        if !self.beta || doc.get("apiVersion").and_then(|v| v.as_str()) != Some("meta.k8s.io/v1") {
            return;
        }
        let beta = serde_json::Value::from("meta.k8s.io/v1beta1");
        if let Some(items) = doc.get_mut("items").and_then(|i| i.as_array_mut()) {
            for item in items {
                if item.get("apiVersion").and_then(|v| v.as_str()) == Some("meta.k8s.io/v1") {
                    item["apiVersion"] = beta.clone();
                }
            }
        }
        doc["apiVersion"] = beta;
    }
}

/// One media range of an Accept header.
struct MediaRange<'a> {
    essence: &'a str,
    params: Vec<(&'a str, &'a str)>,
}

fn parse_ranges(header: &str) -> Vec<MediaRange<'_>> {
    header
        .split(',')
        .filter_map(|part| {
            let mut it = part.split(';');
            let essence = it.next()?.trim();
            let params = it
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.trim(), v.trim().trim_matches('"')))
                })
                .collect();
            Some(MediaRange { essence, params })
        })
        .collect()
}

/// Chooses the representation from an Accept header, in the client's order of preference.
/// `None` when nothing acceptable is served (the caller answers 406).
pub fn choose(header: Option<&str>) -> Option<Accept> {
    let header = match header {
        None => return Some(Accept::OBJECT),
        Some(h) if h.trim().is_empty() => return Some(Accept::OBJECT),
        Some(h) => h,
    };
    for r in parse_ranges(header) {
        let yaml = match r.essence {
            // Protobuf is JSON inside the server, encoded on the way out (`protobuf`).
            "application/json" | "application/*" | "*/*" | PROTOBUF => false,
            "application/yaml" => true,
            _ => continue,
        };
        let param = |k: &str| r.params.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v);
        let output = match (param("as"), param("g"), param("v")) {
            (None, _, _) => Output::Object,
            (Some("Table"), Some("meta.k8s.io"), Some("v1" | "v1beta1")) => Output::Table,
            (
                Some("PartialObjectMetadata" | "PartialObjectMetadataList"),
                Some("meta.k8s.io"),
                Some("v1" | "v1beta1"),
            ) => Output::Metadata,
            // Aggregated discovery documents and the like are not served here; a later
            // range of the header may be.
            _ => continue,
        };
        let beta = output != Output::Object && param("v") == Some("v1beta1");
        return Some(Accept { output, yaml, beta });
    }
    None
}

/// What a resource route produces: an Accept header that matches none of these is refused
/// by kube-apiserver's router; one that does but asks for an unserved view (a v1beta1
/// Table, say) by its negotiation.
const PRODUCES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];

/// The 406 of an endpoint that cannot give the representation asked for (kube-apiserver's
/// negotiation error, listing what it serializes).
pub fn not_acceptable_here() -> ApiError {
    ApiError::not_acceptable(PRODUCES)
}

/// The 406 for an Accept header [`choose`] found nothing in, worded as kube-apiserver
/// words it: its router's (listing the route's representations, watch streams included
/// for collections) or its negotiation's.
pub fn not_acceptable(header: Option<&str>, collection: bool) -> ApiError {
    let routable = parse_ranges(header.unwrap_or(""))
        .iter()
        .any(|r| matches!(r.essence, "*/*" | "application/*") || PRODUCES.contains(&r.essence));
    if routable {
        return ApiError::not_acceptable(PRODUCES);
    }
    let mut available = PRODUCES.join(", ");
    if collection {
        available.push_str(
            ", application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch",
        );
    }
    let mut e = ApiError::not_acceptable(&[]);
    e.message = format!("406: Not Acceptable\n\nAvailable representations: {available}");
    e.details = Some(Box::default());
    e
}

/// Whether `path` names a collection of a resource (`/api/v1/pods`,
/// `/apis/apps/v1/namespaces/ns/deployments`), which also serves watches.
pub fn is_collection_path(path: &str) -> bool {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segs.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => return false,
    };
    matches!(rest, [_] | ["namespaces", _, _])
}

/// Kubernetes' protobuf media type.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// How the answer [`choose`] picked is written when the client asked for protobuf first:
/// `Some(json_too)`, where `json_too` says whether the header also accepts JSON (the
/// fallback for kinds protobuf does not cover, as custom resources). None: not protobuf.
pub fn protobuf(header: Option<&str>) -> Option<bool> {
    let ranges = parse_ranges(header?);
    let first = ranges.iter().position(|r| {
        matches!(
            r.essence,
            "application/json" | "application/*" | "*/*" | "application/yaml" | PROTOBUF
        ) && (r.essence != PROTOBUF || !r.params.iter().any(|(k, _)| *k == "as"))
    })?;
    if ranges[first].essence != PROTOBUF {
        return None;
    }
    Some(
        ranges[first + 1..]
            .iter()
            .any(|r| matches!(r.essence, "application/json" | "application/*" | "*/*")),
    )
}

/// Whether the client prefers the aggregated discovery document (apidiscovery.k8s.io/v2
/// `APIGroupDiscoveryList`) for `/api` and `/apis`: it is the first range of the Accept
/// header that is served.
pub fn wants_aggregated_discovery(header: Option<&str>) -> bool {
    for r in parse_ranges(header.unwrap_or("")) {
        if !matches!(r.essence, "application/json" | "application/*" | "*/*") {
            continue;
        }
        let param = |k: &str| r.params.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v);
        match (param("g"), param("v"), param("as")) {
            (Some("apidiscovery.k8s.io"), Some("v2"), Some("APIGroupDiscoveryList")) => {
                return true
            }
            (None, None, None) => return false,
            // Other versions (v2beta1, gone in 1.33) are not served.
            _ => continue,
        }
    }
    false
}

/// Decodes a request body as JSON or YAML according to its Content-Type.
pub fn decode_body(content_type: Option<&str>, body: &[u8]) -> Result<Value, ApiError> {
    decode_body_as("object", content_type, body)
}

/// kube-apiserver's summary of an undecodable body in its error: `<empty>`, the first 30
/// bytes of something that looks like JSON, else their hex.
fn summarize(body: &[u8]) -> String {
    const MAX: usize = 30;
    let cut = &body[..body.len().min(MAX)];
    let more = if body.len() > MAX { " ..." } else { "" };
    match body.first() {
        None => "<empty>".to_owned(),
        Some(b'{') => format!("{}{more}", String::from_utf8_lossy(cut)),
        Some(_) => {
            let hex: String = cut.iter().map(|b| format!("{b:02x}")).collect();
            format!("{hex}{more}")
        }
    }
}

/// [`decode_body`] for an endpoint that takes a `kind`, named in the error for a body that
/// is not JSON (Go's scanner message, as kube-apiserver words it).
pub fn decode_body_as(
    kind: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Value, ApiError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError::request_entity_too_large(MAX_BODY_BYTES));
    }
    let essence = content_type
        .and_then(|c| c.split(';').next())
        .map(str::trim)
        .unwrap_or("application/json");
    let value: Value = match essence {
        "application/json" | "" => serde_json::from_slice(body).map_err(|e| {
            let syntax = kumo_apimachinery::gojson::syntax_error(body);
            // Valid JSON deeper than the decoder goes (serde_json stops at 128 levels): the
            // same refusal as for 101–128 levels below, not a parse error.
            if syntax.is_none() && e.to_string().starts_with("recursion limit exceeded") {
                return too_deep();
            }
            let why = syntax.unwrap_or_else(|| e.to_string());
            ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; json parse error: {why} ({})",
                summarize(body)
            ))
        })?,
        // Lax, as upstream's decode: a repeated key keeps its last value (field validation
        // reports it, see openapi::check_fields).
        "application/yaml" => {
            let unrecognized = |why: String| {
                ApiError::bad_request(format!(
                    "the object provided is unrecognized (must be of type {kind}): {why} ({})",
                    summarize(body)
                ))
            };
            kumo_apimachinery::yaml::from_slice_lax(body).map_err(|e| unrecognized(e.to_string()))?
        }
        "application/vnd.kubernetes.protobuf" => kumo_apimachinery::protobuf::decode(body)
            .map_err(|e| {
                ApiError::bad_request(format!(
                    "the object provided is unrecognized (must be of type object): {e}"
                ))
            })?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    // Upstream first reads apiVersion and kind into a struct, which only an object fills.
    if let Some(t) = go_json_type(&value).filter(|_| !value.is_object() && essence != PROTOBUF) {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; json parse error: json: cannot unmarshal {t} into Go value of type {GO_TYPE_META} ({})",
            summarize(body)
        )));
    }
    if depth(&value) > MAX_DEPTH {
        return Err(too_deep());
    }
    Ok(value)
}

/// kumo's refusal of a body nested deeper than [`MAX_DEPTH`]. Upstream decodes up to
/// 10 000 levels (Go's stacks grow); kumo bounds every recursive pass over an object
/// (field validation, patches, managedFields, admission, storage) by refusing deeper
/// bodies up front, so none can exhaust a fixed-size thread stack. Deeper than 10 000 is
/// Go's syntax error on both.
fn too_deep() -> ApiError {
    ApiError::bad_request(format!(
        "the object provided is nested more than {MAX_DEPTH} levels deep"
    ))
}

/// How Go prints the anonymous struct upstream's serializer decodes apiVersion and kind
/// into, in its unmarshal errors.
pub const GO_TYPE_META: &str = "struct { APIVersion string \"json:\\\"apiVersion,omitempty\\\"\"; Kind string \"json:\\\"kind,omitempty\\\"\" }";

/// The JSON type name Go's decoder uses in its errors (None for null, which decodes into
/// anything).
pub fn go_json_type(v: &Value) -> Option<&'static str> {
    match v {
        Value::Null => None,
        Value::Bool(_) => Some("bool"),
        Value::Number(_) => Some("number"),
        Value::String(_) => Some("string"),
        Value::Array(_) => Some("array"),
        Value::Object(_) => Some("object"),
    }
}

/// Nesting depth of a value, without recursion (so a deep value cannot overflow the stack).
pub fn depth(v: &Value) -> usize {
    let mut max = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_get_accept_header_picks_table() {
        let h = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(
            choose(Some(h)),
            Some(Accept {
                output: Output::Table,
                yaml: false,
                beta: false,
            })
        );
        let h = "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(
            choose(Some(h)),
            Some(Accept {
                output: Output::Table,
                yaml: false,
                beta: true,
            })
        );
        let mut doc = serde_json::json!({"apiVersion": "meta.k8s.io/v1", "kind": "Table"});
        choose(Some(h))
            .unwrap_or(Accept::OBJECT)
            .version_meta(&mut doc);
        assert_eq!(doc["apiVersion"], "meta.k8s.io/v1beta1");
        assert_eq!(choose(Some("application/yaml")).map(|a| a.yaml), Some(true));
        assert_eq!(choose(Some("text/html")), None);
        assert_eq!(choose(None).map(|a| a.output), Some(Output::Object));
    }

    #[test]
    fn protobuf_accept_headers() {
        // client-go's default for built-in types.
        let h = "application/vnd.kubernetes.protobuf, */*";
        assert_eq!(choose(Some(h)).map(|a| a.output), Some(Output::Object));
        assert_eq!(protobuf(Some(h)), Some(true));
        assert_eq!(protobuf(Some(PROTOBUF)), Some(false));
        assert_eq!(
            protobuf(Some(
                "application/json, application/vnd.kubernetes.protobuf"
            )),
            None
        );
        assert_eq!(protobuf(None), None);
        let table =
            "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io, application/json";
        assert_eq!(protobuf(Some(table)), None);
    }

    #[test]
    fn aggregated_discovery_accept() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert!(wants_aggregated_discovery(Some(kubectl)));
        assert!(!wants_aggregated_discovery(Some("application/json")));
        assert!(!wants_aggregated_discovery(None));
        let old = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert!(!wants_aggregated_discovery(Some(old)));
    }

    #[test]
    fn bodies() {
        assert!(decode_body(Some("application/json"), b"{\"a\":1}").is_ok());
        assert_eq!(
            decode_body(Some("application/json"), b"{")
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            decode_body(Some("application/yaml"), b"a: [")
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            decode_body(Some("application/vnd.kubernetes.protobuf"), b"x")
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            decode_body(Some("application/cbor"), b"x")
                .unwrap_err()
                .code,
            415
        );
        let deep = "[".repeat(200) + &"]".repeat(200);
        let e = decode_body(Some("application/json"), deep.as_bytes()).unwrap_err();
        assert_eq!(e.code, 400);
        // One refusal from 101 levels to Go's limit, whichever decoder stage meets it;
        // past 10 000, Go's own syntax error.
        for (levels, message) in [
            (
                120,
                "the object provided is nested more than 100 levels deep",
            ),
            (
                5000,
                "the object provided is nested more than 100 levels deep",
            ),
            (10_001, "invalid character '[' exceeded max depth"),
        ] {
            let body = format!(
                "{{\"kind\":\"ConfigMap\",\"extra\":{}{}}}",
                "[".repeat(levels),
                "]".repeat(levels)
            );
            let e = decode_body(Some("application/json"), body.as_bytes()).unwrap_err();
            assert_eq!(e.code, 400);
            assert!(
                e.to_status()["message"].as_str().unwrap().contains(message),
                "{levels}: {}",
                e.to_status()
            );
        }
        let big = vec![b' '; MAX_BODY_BYTES + 1];
        assert_eq!(decode_body(None, &big).unwrap_err().code, 413);
    }
}
