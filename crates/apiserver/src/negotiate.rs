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
        None => {
            return Some(Accept {
                output: Output::Object,
                yaml: false,
            })
        }
        Some(h) if h.trim().is_empty() => {
            return Some(Accept {
                output: Output::Object,
                yaml: false,
            })
        }
        Some(h) => h,
    };
    for r in parse_ranges(header) {
        let yaml = match r.essence {
            "application/json" | "application/*" | "*/*" => false,
            "application/yaml" => true,
            _ => continue,
        };
        let param = |k: &str| r.params.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v);
        let output = match (param("as"), param("g"), param("v")) {
            (None, _, _) => Output::Object,
            (Some("Table"), Some("meta.k8s.io"), Some("v1")) => Output::Table,
            (
                Some("PartialObjectMetadata" | "PartialObjectMetadataList"),
                Some("meta.k8s.io"),
                Some("v1"),
            ) => Output::Metadata,
            // v1beta1 tables, aggregated discovery documents and the like are not served
            // here; a later range of the header may be.
            _ => continue,
        };
        return Some(Accept { output, yaml });
    }
    None
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
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError::request_entity_too_large(MAX_BODY_BYTES));
    }
    let essence = content_type
        .and_then(|c| c.split(';').next())
        .map(str::trim)
        .unwrap_or("application/json");
    let value: Value = match essence {
        "application/json" | "" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: {e}",
                "object"
            ))
        })?,
        "application/yaml" => {
            let v: serde_yaml::Value = serde_yaml::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))?;
            serde_json::to_value(v)
                .map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))?
        }
        "application/vnd.kubernetes.protobuf" => kumo_apimachinery::protobuf::decode(body)
            .map_err(|e| {
                ApiError::bad_request(format!(
                    "the object provided is unrecognized (must be of type object): {e}"
                ))
            })?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if depth(&value) > MAX_DEPTH {
        return Err(ApiError::bad_request(format!(
            "the object provided is nested more than {MAX_DEPTH} levels deep"
        )));
    }
    Ok(value)
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
                yaml: false
            })
        );
        let h = "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(choose(Some(h)).map(|a| a.output), Some(Output::Object));
        assert_eq!(choose(Some("application/yaml")).map(|a| a.yaml), Some(true));
        assert_eq!(choose(Some("text/html")), None);
        assert_eq!(choose(None).map(|a| a.output), Some(Output::Object));
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
        let big = vec![b' '; MAX_BODY_BYTES + 1];
        assert_eq!(decode_body(None, &big).unwrap_err().code, 413);
    }
}
