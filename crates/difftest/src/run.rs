//! Replaying scenarios against both sides and comparing the answers.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::corpus::{self, has_header, RequestSpec, Scenario, NAMESPACE_PLACEHOLDER};
use crate::diff::diff_values;
use crate::normalize::{normalize, normalize_header, Learned};
use crate::report::{Difference, Report, RequestReport, ScenarioError, SideId};
use crate::side::{Exchange, Prepared, RawBody, Side};

/// Headers compared on every request (besides a request's `compare_headers`).
pub const COMPARED_HEADERS: &[&str] = &["content-type", "warning"];

/// The label every scenario namespace carries (its value is the scenario name).
pub const SCENARIO_LABEL: &str = "kumo-difftest/scenario";

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The corpus is broken.
    #[error(transparent)]
    Corpus(#[from] corpus::CorpusError),
    /// `--only` matched nothing.
    #[error("no scenario matches {0:?}")]
    NoMatch(String),
}

/// Loads the corpus in `dir` and replays it (the scenarios whose name contains `only`, or
/// all) against both sides.
pub async fn run_corpus(
    left: &Side,
    right: &Side,
    dir: &Path,
    only: Option<&str>,
) -> Result<Report, RunError> {
    let mut scenarios = corpus::load_corpus(dir)?;
    if let Some(only) = only {
        scenarios.retain(|s| s.name.contains(only));
        if scenarios.is_empty() {
            return Err(RunError::NoMatch(only.to_string()));
        }
    }
    Ok(run_scenarios(left, right, &scenarios).await)
}

/// Replays scenarios, one after the other; each request goes to both sides at once.
pub async fn run_scenarios(left: &Side, right: &Side, scenarios: &[Scenario]) -> Report {
    let mut report = Report {
        left: format!("{} ({})", left.label(), left.kubeconfig().display()),
        right: format!("{} ({})", right.label(), right.kubeconfig().display()),
        ..Default::default()
    };
    for s in scenarios {
        run_scenario(left, right, s, &mut report).await;
    }
    report
}

/// Per-side state within a scenario.
struct SideState {
    vars: BTreeMap<String, String>,
    learned: Learned,
}

async fn run_scenario(left: &Side, right: &Side, scenario: &Scenario, report: &mut Report) {
    let ns_left = namespace_name(&scenario.name);
    let ns_right = namespace_name(&scenario.name);
    let (l, r) = tokio::join!(
        create_namespace(left, &ns_left, &scenario.name),
        create_namespace(right, &ns_right, &scenario.name)
    );
    let errors: Vec<String> = [(SideId::Left, l), (SideId::Right, r)]
        .into_iter()
        .filter_map(|(side, res)| res.err().map(|e| format!("{side} side: {e}")))
        .collect();
    if errors.is_empty() {
        let mut states = [SideState::new(&ns_left), SideState::new(&ns_right)];
        for spec in &scenario.requests {
            let r = run_request(left, right, scenario, spec, &mut states).await;
            report.requests.push(r);
        }
    } else {
        report.scenario_errors.push(ScenarioError {
            scenario: scenario.name.clone(),
            error: format!("creating its namespace failed: {}", errors.join("; ")),
        });
    }
    // Best effort: without a namespace controller the namespaces stay Terminating.
    let _ = tokio::join!(
        delete_namespace(left, &ns_left),
        delete_namespace(right, &ns_right)
    );
}

impl SideState {
    fn new(ns: &str) -> Self {
        SideState {
            vars: BTreeMap::from([(NAMESPACE_PLACEHOLDER.to_string(), ns.to_string())]),
            learned: Learned::new(ns),
        }
    }
}

/// `<scenario>-<5 random characters>`, a valid namespace name.
fn namespace_name(scenario: &str) -> String {
    let mut base: String = scenario
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(50)
        .collect();
    base = base.trim_matches('-').to_string();
    if base.is_empty() {
        base = "difftest".into();
    }
    format!("{base}-{}", random_suffix())
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    let mut n = h.finish();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

async fn create_namespace(side: &Side, ns: &str, scenario: &str) -> Result<(), String> {
    let label: String = scenario.chars().take(63).collect();
    let body = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": ns, "labels": {SCENARIO_LABEL: label}},
    });
    let ex = side
        .send(
            Prepared {
                method: "POST".into(),
                path: "/api/v1/namespaces".into(),
                headers: vec![("Content-Type".into(), "application/json".into())],
                body: body.to_string().into_bytes(),
            },
            None,
        )
        .await?;
    if ex.status == 201 {
        Ok(())
    } else {
        let text = match &ex.body {
            RawBody::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            RawBody::Events(_) => String::new(),
        };
        Err(format!(
            "POST /api/v1/namespaces: {}: {}",
            ex.status,
            text.trim()
        ))
    }
}

async fn delete_namespace(side: &Side, ns: &str) -> Result<(), String> {
    side.send(
        Prepared {
            method: "DELETE".into(),
            path: format!("/api/v1/namespaces/{ns}"),
            headers: vec![],
            body: vec![],
        },
        None,
    )
    .await
    .map(|_| ())
}

fn prepare(spec: &RequestSpec, vars: &BTreeMap<String, String>) -> Result<Prepared, String> {
    let path = corpus::substitute(&spec.path, vars)?;
    let mut headers = Vec::new();
    for (k, v) in &spec.headers {
        headers.push((k.clone(), corpus::substitute(v, vars)?));
    }
    let body = if let Some(body) = &spec.body {
        if !has_header(&spec.headers, "content-type") {
            headers.push(("Content-Type".into(), "application/json".into()));
        }
        corpus::substitute_value(body, vars)?
            .to_string()
            .into_bytes()
    } else if let Some(raw) = &spec.body_raw {
        corpus::substitute(raw, vars)?
            .repeat(spec.body_repeat.unwrap_or(1))
            .into_bytes()
    } else {
        Vec::new()
    };
    Ok(Prepared {
        method: spec.method.clone(),
        path,
        headers,
        body,
    })
}

/// A response body, parsed.
#[derive(Debug, Clone, PartialEq)]
enum Body {
    Empty,
    Json(Value),
    Text(String),
    Binary(usize),
}

impl Body {
    fn kind(&self) -> String {
        match self {
            Body::Empty => "empty".into(),
            Body::Json(_) => "JSON".into(),
            Body::Text(_) => "text".into(),
            Body::Binary(n) => format!("{n} bytes of binary data"),
        }
    }
}

fn parse_body(ex: &Exchange) -> Body {
    let bytes = match &ex.body {
        RawBody::Events(events) => return Body::Json(Value::Array(events.clone())),
        RawBody::Bytes(b) => b,
    };
    if bytes.is_empty() {
        return Body::Empty;
    }
    let content_type = ex.header("content-type").unwrap_or_default();
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if media.contains("json") || media.is_empty() {
        if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
            return Body::Json(v);
        }
    }
    if media.contains("yaml") {
        if let Ok(v) = serde_yaml::from_slice::<Value>(bytes) {
            return Body::Json(v);
        }
    }
    match std::str::from_utf8(bytes) {
        Ok(s) if !media.contains("protobuf") => Body::Text(s.to_string()),
        _ => Body::Binary(bytes.len()),
    }
}

/// What one side did for one request.
enum Outcome {
    Answered { ex: Exchange, body: Body },
    Failed(String),
}

async fn send_side(
    side: &Side,
    spec: &RequestSpec,
    vars: &BTreeMap<String, String>,
) -> Result<Exchange, String> {
    let prepared = prepare(spec, vars).map_err(|e| format!("not sent: {e}"))?;
    let watch = spec
        .watch
        .as_ref()
        .map(|w| (w.events, Duration::from_secs(w.timeout_seconds)));
    side.send(prepared, watch).await
}

async fn run_request(
    left: &Side,
    right: &Side,
    scenario: &Scenario,
    spec: &RequestSpec,
    states: &mut [SideState; 2],
) -> RequestReport {
    let (l, r) = tokio::join!(
        send_side(left, spec, &states[0].vars),
        send_side(right, spec, &states[1].vars)
    );
    let request_path = spec.path.split('?').next().unwrap_or_default();
    let mut differences = Vec::new();
    let mut outcomes = Vec::new();
    for ((side, res), state) in [(SideId::Left, l), (SideId::Right, r)]
        .into_iter()
        .zip(states.iter_mut())
    {
        let outcome = match res {
            Err(e) => Outcome::Failed(e),
            Ok(ex) => {
                let mut body = parse_body(&ex);
                // Captures and learning see the raw body; comparison sees it normalised.
                if let Body::Json(v) = &body {
                    state.learned.learn(v);
                }
                for (name, pointer) in &spec.capture {
                    match capture(&body, pointer) {
                        Some(value) => {
                            state.vars.insert(name.clone(), value);
                        }
                        None => {
                            state.vars.remove(name);
                            differences.push(Difference::Failed {
                                side,
                                error: format!(
                                    "capture {name}: nothing at {pointer:?} in the response"
                                ),
                            });
                        }
                    }
                }
                // Path-scoped rules (/version) name the path as written in the corpus.
                match &mut body {
                    _ if spec.ignore_body => {}
                    Body::Json(v) => normalize(v, request_path, &state.learned),
                    Body::Text(t) => *t = state.learned.text(t, false),
                    _ => {}
                }
                dump(scenario, spec, side, &ex, &body);
                Outcome::Answered { ex, body }
            }
        };
        if let (Some(expected), Outcome::Answered { ex, .. }) = (spec.expect_status, &outcome) {
            if ex.status != expected {
                differences.push(Difference::Expectation {
                    side,
                    expected,
                    got: ex.status,
                });
            }
        }
        outcomes.push((side, outcome));
    }
    let status = |o: &Outcome| match o {
        Outcome::Answered { ex, .. } => Some(ex.status),
        Outcome::Failed(_) => None,
    };
    let (left_status, right_status) = (status(&outcomes[0].1), status(&outcomes[1].1));
    match (&outcomes[0].1, &outcomes[1].1) {
        (Outcome::Answered { ex: le, body: lb }, Outcome::Answered { ex: re, body: rb }) => {
            let mut found = compare(spec, le, lb, re, rb, states);
            found.append(&mut differences);
            differences = found;
        }
        _ => {
            for (side, o) in &outcomes {
                if let Outcome::Failed(e) = o {
                    differences.insert(
                        0,
                        Difference::Failed {
                            side: *side,
                            error: e.clone(),
                        },
                    );
                }
            }
        }
    }
    RequestReport {
        scenario: scenario.name.clone(),
        name: spec.name.clone(),
        method: spec.method.clone(),
        path: spec.path.clone(),
        left_status,
        right_status,
        differences,
        known_difference: spec.known_difference.clone(),
    }
}

/// The environment variable naming a directory to write every normalised response to.
pub const DUMP_ENV: &str = "KUMO_DIFFTEST_DUMP";

/// With `KUMO_DIFFTEST_DUMP=DIR`, writes `DIR/<scenario>/<request>.<side>.json`: status,
/// headers and the normalised body, for writing and debugging corpus files.
fn dump(scenario: &Scenario, spec: &RequestSpec, side: SideId, ex: &Exchange, body: &Body) {
    let Some(dir) = std::env::var_os(DUMP_ENV) else {
        return;
    };
    let file_name: String = spec
        .name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let index = scenario
        .requests
        .iter()
        .position(|r| r.name == spec.name)
        .unwrap_or_default();
    let dir = Path::new(&dir).join(&scenario.name);
    let body = match body {
        Body::Json(v) => v.clone(),
        Body::Text(t) => Value::String(t.clone()),
        other => Value::String(other.kind()),
    };
    let record = json!({
        "request": {"method": spec.method, "path": spec.path},
        "status": ex.status,
        "headers": ex.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>(),
        "body": body,
    });
    let text = serde_json::to_string_pretty(&record).unwrap_or_default();
    let path = dir.join(format!("{index:03}-{file_name}.{side}.json"));
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, text)) {
        tracing::warn!("{DUMP_ENV}: cannot write {}: {e}", path.display());
    }
}

fn capture(body: &Body, pointer: &str) -> Option<String> {
    match body {
        Body::Json(v) => match v.pointer(pointer)? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        },
        Body::Text(t) if pointer.is_empty() => Some(t.clone()),
        _ => None,
    }
}

fn compare(
    spec: &RequestSpec,
    le: &Exchange,
    lb: &Body,
    re: &Exchange,
    rb: &Body,
    states: &[SideState; 2],
) -> Vec<Difference> {
    let mut out = Vec::new();
    if le.status != re.status {
        out.push(Difference::Status {
            left: le.status,
            right: re.status,
        });
    }
    let mut names: Vec<String> = COMPARED_HEADERS.iter().map(|s| s.to_string()).collect();
    for h in &spec.compare_headers {
        let h = h.to_ascii_lowercase();
        if !names.contains(&h) {
            names.push(h);
        }
    }
    for name in names {
        let l = le
            .header(&name)
            .map(|v| normalize_header(&v, &states[0].learned));
        let r = re
            .header(&name)
            .map(|v| normalize_header(&v, &states[1].learned));
        if l != r {
            out.push(Difference::Header {
                name,
                left: l,
                right: r,
            });
        }
    }
    if spec.ignore_body {
        return out;
    }
    match (lb, rb) {
        (Body::Json(l), Body::Json(r)) => {
            out.extend(diff_values(l, r).into_iter().map(Difference::Body));
        }
        (Body::Text(l), Body::Text(r)) if l != r => {
            let (ll, rl): (Vec<&str>, Vec<&str>) = (l.lines().collect(), r.lines().collect());
            let line = (0..ll.len().max(rl.len()))
                .find(|&i| ll.get(i) != rl.get(i))
                .unwrap_or(0);
            out.push(Difference::Text {
                line: line + 1,
                left: ll.get(line).map(|s| s.to_string()),
                right: rl.get(line).map(|s| s.to_string()),
            });
        }
        (l, r) if std::mem::discriminant(l) != std::mem::discriminant(r) => {
            out.push(Difference::BodyKind {
                left: l.kind(),
                right: r.kind(),
            });
        }
        (Body::Binary(l), Body::Binary(r)) if l != r => out.push(Difference::BodyKind {
            left: lb.kind(),
            right: rb.kind(),
        }),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn namespace_names_are_valid_labels() {
        let a = namespace_name("003-CRUD_configmaps");
        assert!(a.starts_with("003-crud-configmaps-"), "{a}");
        assert_eq!(a.len(), "003-crud-configmaps-".len() + 5);
        assert!(a
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        let long = namespace_name(&"x".repeat(100));
        assert!(long.len() <= 63);
        assert_ne!(namespace_name("a"), namespace_name("a"));
    }

    #[test]
    fn prepare_substitutes_and_sets_content_type() {
        let spec: RequestSpec = serde_yaml::from_str(
            "{name: a, method: POST, path: '/api/v1/namespaces/{{ns}}/configmaps', body: {metadata: {name: '{{n}}'}}}",
        )
        .unwrap();
        let vars = BTreeMap::from([
            ("ns".to_string(), "x-1".to_string()),
            ("n".to_string(), "cm".to_string()),
        ]);
        let p = prepare(&spec, &vars).unwrap();
        assert_eq!(p.path, "/api/v1/namespaces/x-1/configmaps");
        assert_eq!(
            p.headers,
            vec![("Content-Type".to_string(), "application/json".to_string())]
        );
        assert_eq!(p.body, br#"{"metadata":{"name":"cm"}}"#.to_vec());
        assert!(prepare(&spec, &BTreeMap::new()).is_err());
    }

    #[test]
    fn bodies_are_parsed_by_content_type() {
        let ex = |ct: &str, body: &str| Exchange {
            status: 200,
            headers: vec![("content-type".into(), ct.into())],
            body: RawBody::Bytes(body.as_bytes().to_vec()),
        };
        assert_eq!(
            parse_body(&ex("application/json", "{\"a\":1}")),
            Body::Json(json!({"a": 1}))
        );
        assert_eq!(
            parse_body(&ex("application/yaml", "a: 1\n")),
            Body::Json(json!({"a": 1}))
        );
        assert_eq!(
            parse_body(&ex("text/plain; charset=utf-8", "ok")),
            Body::Text("ok".into())
        );
        assert_eq!(parse_body(&ex("application/json", "")), Body::Empty);
        assert_eq!(
            parse_body(&ex("application/vnd.kubernetes.protobuf", "k8s\0")),
            Body::Binary(4)
        );
        assert_eq!(
            capture(&Body::Json(json!({"m": {"rv": "7", "n": 3}})), "/m/rv").as_deref(),
            Some("7")
        );
        assert_eq!(
            capture(&Body::Json(json!({"m": {"n": 3}})), "/m/n").as_deref(),
            Some("3")
        );
        assert_eq!(capture(&Body::Json(json!({})), "/m"), None);
    }
}
