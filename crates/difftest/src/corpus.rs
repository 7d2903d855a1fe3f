//! The corpus: one YAML file per scenario, an ordered list of requests.
//!
//! ```yaml
//! description: what the scenario covers
//! requests:
//!   - name: create a configmap            # unique within the file
//!     method: POST
//!     path: /api/v1/namespaces/{{ns}}/configmaps?fieldManager=difftest
//!     headers: {Accept: application/json} # optional
//!     body: {metadata: {name: one}}       # optional, sent as JSON (Content-Type application/json
//!                                         # unless `headers` says otherwise)
//!     body_raw: "..."                     # or: sent verbatim; needs a Content-Type header
//!     body_repeat: 1000                   # optional: body_raw sent this many times over
//!                                         # (size limits, deep nesting)
//!     capture: {rv: /metadata/resourceVersion}   # name -> JSON pointer into this response
//!     watch: {events: 3, timeout_seconds: 5}     # read up to 3 watch events, at most 5 s
//!     expect_status: 201                  # optional: both sides must answer this
//!     ignore_body: false                  # optional: compare status and headers only
//!     compare_headers: [etag]             # optional: headers compared besides
//!                                         # Content-Type and Warning
//!     known_difference: "why"             # optional: a difference here is explained
//! ```
//!
//! `{{ns}}` is the scenario's namespace (created fresh for each run and side) and
//! `{{name}}` a value captured by an earlier request of the same scenario, on the same side.
//! Placeholders are substituted in the path, the header values, the string values of `body`
//! and in `body_raw`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// The placeholder for the scenario's namespace.
pub const NAMESPACE_PLACEHOLDER: &str = "ns";

/// A corpus file could not be read or is not a valid scenario.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", file.display())]
pub struct CorpusError {
    /// The file (or directory) at fault.
    pub file: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl CorpusError {
    fn new(file: &Path, message: impl Into<String>) -> Self {
        CorpusError {
            file: file.to_path_buf(),
            message: message.into(),
        }
    }
}

/// One scenario: a corpus file.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The file's stem, e.g. `003-configmaps`.
    pub name: String,
    /// Where it was loaded from.
    pub file: PathBuf,
    /// Free text from the file.
    pub description: Option<String>,
    /// The requests, in order.
    pub requests: Vec<RequestSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    #[serde(default)]
    description: Option<String>,
    requests: Vec<RequestSpec>,
}

/// One request of a scenario, as written in the corpus.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpec {
    /// Unique within the scenario; the report names requests by it.
    pub name: String,
    /// HTTP method (GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS).
    pub method: String,
    /// Path with query, e.g. `/api/v1/namespaces/{{ns}}/pods?limit=2`.
    pub path: String,
    /// Request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A body, written as YAML and sent as JSON.
    #[serde(default)]
    pub body: Option<Value>,
    /// A body sent verbatim (YAML, patches); needs a `Content-Type` header.
    #[serde(default)]
    pub body_raw: Option<String>,
    /// `body_raw` is sent this many times over, so that the corpus can hold a body over
    /// the size limit or nested thousands deep in one line.
    #[serde(default)]
    pub body_repeat: Option<usize>,
    /// Values to capture from this response: placeholder name -> JSON pointer.
    #[serde(default)]
    pub capture: BTreeMap<String, String>,
    /// This is a watch: read events from the stream.
    #[serde(default)]
    pub watch: Option<WatchSpec>,
    /// The status code both sides are expected to answer.
    #[serde(default)]
    pub expect_status: Option<u16>,
    /// Compare status and headers only (for large or unstable bodies).
    #[serde(default)]
    pub ignore_body: bool,
    /// Headers compared in addition to Content-Type and Warning.
    #[serde(default)]
    pub compare_headers: Vec<String>,
    /// A difference in this request is known, for this reason.
    #[serde(default)]
    pub known_difference: Option<String>,
}

/// How to read a watch response.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchSpec {
    /// Stop after this many events.
    pub events: usize,
    /// Stop after this long even with fewer events.
    #[serde(default = "default_watch_timeout")]
    pub timeout_seconds: u64,
}

fn default_watch_timeout() -> u64 {
    5
}

const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];

/// Loads every `*.yaml` / `*.yml` file of `dir`, sorted by file name.
pub fn load_corpus(dir: &Path) -> Result<Vec<Scenario>, CorpusError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| CorpusError::new(dir, format!("cannot read the corpus directory: {e}")))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| CorpusError::new(dir, e.to_string()))?;
        let path = entry.path();
        if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            files.push(path);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(CorpusError::new(dir, "no *.yaml scenario files"));
    }
    files.iter().map(|f| load_scenario(f)).collect()
}

/// Loads and checks one scenario file.
pub fn load_scenario(file: &Path) -> Result<Scenario, CorpusError> {
    let text = std::fs::read_to_string(file).map_err(|e| CorpusError::new(file, e.to_string()))?;
    let name = file
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| CorpusError::new(file, "file name is not UTF-8"))?
        .to_string();
    parse_scenario(&name, file, &text)
}

/// Parses and checks a scenario from its YAML text.
pub fn parse_scenario(name: &str, file: &Path, text: &str) -> Result<Scenario, CorpusError> {
    let parsed: ScenarioFile =
        serde_yaml::from_str(text).map_err(|e| CorpusError::new(file, e.to_string()))?;
    let scenario = Scenario {
        name: name.to_string(),
        file: file.to_path_buf(),
        description: parsed.description,
        requests: parsed.requests,
    };
    check(&scenario).map_err(|m| CorpusError::new(file, m))?;
    Ok(scenario)
}

fn check(s: &Scenario) -> Result<(), String> {
    if s.requests.is_empty() {
        return Err("no requests".into());
    }
    let mut names = BTreeSet::new();
    let mut known: BTreeSet<String> = BTreeSet::from([NAMESPACE_PLACEHOLDER.to_string()]);
    for r in &s.requests {
        let at = |m: String| format!("request {:?}: {m}", r.name);
        if !names.insert(r.name.as_str()) {
            return Err(at("duplicate name".into()));
        }
        if !METHODS.contains(&r.method.as_str()) {
            return Err(at(format!(
                "method {:?} is not one of {}",
                r.method,
                METHODS.join(", ")
            )));
        }
        if !r.path.starts_with('/') {
            return Err(at("path must start with /".into()));
        }
        if r.body.is_some() && r.body_raw.is_some() {
            return Err(at("body and body_raw are exclusive".into()));
        }
        if r.body_repeat.is_some() && r.body_raw.is_none() {
            return Err(at("body_repeat needs body_raw".into()));
        }
        if r.body_raw.is_some() && !has_header(&r.headers, "content-type") {
            return Err(at("body_raw needs a Content-Type header".into()));
        }
        if let Some(w) = &r.watch {
            if w.events == 0 || w.timeout_seconds == 0 {
                return Err(at("watch needs events >= 1 and timeout_seconds >= 1".into()));
            }
        }
        if let Some(code) = r.expect_status {
            if !(100..600).contains(&code) {
                return Err(at(format!("expect_status {code} is not an HTTP status")));
            }
        }
        // Every placeholder must be the namespace or captured by an earlier request.
        let mut texts: Vec<&str> = vec![&r.path];
        texts.extend(r.headers.values().map(String::as_str));
        if let Some(raw) = &r.body_raw {
            texts.push(raw);
        }
        let mut body_strings = Vec::new();
        if let Some(body) = &r.body {
            collect_strings(body, &mut body_strings);
        }
        texts.extend(body_strings.iter().map(String::as_str));
        for t in texts {
            for p in placeholders(t).map_err(at)? {
                if !known.contains(&p) {
                    return Err(at(format!(
                        "placeholder {{{{{p}}}}} is neither ns nor captured by an earlier request"
                    )));
                }
            }
        }
        for (name, pointer) in &r.capture {
            if !is_placeholder_name(name) || name == NAMESPACE_PLACEHOLDER {
                return Err(at(format!("capture name {name:?} is not allowed")));
            }
            if !(pointer.is_empty() || pointer.starts_with('/')) {
                return Err(at(format!(
                    "capture {name}: {pointer:?} is not a JSON pointer"
                )));
            }
            known.insert(name.clone());
        }
    }
    Ok(())
}

pub(crate) fn has_header(headers: &BTreeMap<String, String>, name: &str) -> bool {
    headers.keys().any(|k| k.eq_ignore_ascii_case(name))
}

fn collect_strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| collect_strings(x, out)),
        Value::Object(m) => m.values().for_each(|x| collect_strings(x, out)),
        _ => {}
    }
}

fn is_placeholder_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The placeholder names used in `text`, in order.
pub fn placeholders(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("unterminated placeholder in {text:?}"))?;
        let name = after[..end].trim();
        if !is_placeholder_name(name) {
            return Err(format!("bad placeholder {{{{{name}}}}} in {text:?}"));
        }
        out.push(name.to_string());
        rest = &after[end + 2..];
    }
    Ok(out)
}

/// Replaces every `{{name}}` in `text` with its value; an unknown name is an error.
pub fn substitute(text: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("unterminated placeholder in {text:?}"))?;
        let name = after[..end].trim();
        let value = vars
            .get(name)
            .ok_or_else(|| format!("no value for {{{{{name}}}}}"))?;
        out.push_str(value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// [`substitute`] in every string value of a JSON body.
pub fn substitute_value(v: &Value, vars: &BTreeMap<String, String>) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) => Value::String(substitute(s, vars)?),
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|x| substitute_value(x, vars))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| Ok((k.clone(), substitute_value(x, vars)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(text: &str) -> Result<Scenario, CorpusError> {
        parse_scenario("t", Path::new("t.yaml"), text)
    }

    #[test]
    fn substitutes_placeholders() {
        let vars = BTreeMap::from([
            ("ns".to_string(), "a-1".to_string()),
            ("rv".to_string(), "42".to_string()),
        ]);
        assert_eq!(
            substitute("/x/{{ns}}/y?rv={{ rv }}", &vars).unwrap(),
            "/x/a-1/y?rv=42"
        );
        assert!(substitute("{{nope}}", &vars).is_err());
        assert!(substitute("{{ns", &vars).is_err());
        let body: Value = serde_json::json!({"metadata": {"namespace": "{{ns}}", "n": 1}});
        assert_eq!(
            substitute_value(&body, &vars).unwrap(),
            serde_json::json!({"metadata": {"namespace": "a-1", "n": 1}})
        );
    }

    #[test]
    fn checks_placeholders_and_fields() {
        let ok = parse(
            "requests:\n- {name: a, method: GET, path: /x, capture: {rv: /metadata/resourceVersion}}\n\
             - {name: b, method: GET, path: '/x?rv={{rv}}&ns={{ns}}'}\n",
        );
        assert!(ok.is_ok(), "{ok:?}");
        let early = parse("requests:\n- {name: a, method: GET, path: '/x?rv={{rv}}'}\n");
        assert!(early.unwrap_err().message.contains("{{rv}}"));
        let dup = parse(
            "requests:\n- {name: a, method: GET, path: /x}\n- {name: a, method: GET, path: /y}\n",
        );
        assert!(dup.unwrap_err().message.contains("duplicate"));
        let raw = parse("requests:\n- {name: a, method: POST, path: /x, body_raw: 'a: 1'}\n");
        assert!(raw.unwrap_err().message.contains("Content-Type"));
        let unknown = parse("requests:\n- {name: a, method: GET, path: /x, bogus: 1}\n");
        assert!(unknown.unwrap_err().message.contains("bogus"));
        let method = parse("requests:\n- {name: a, method: get, path: /x}\n");
        assert!(method.is_err());
    }
}
