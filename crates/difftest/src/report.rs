//! The report: what differs, request by request.

use std::fmt;

use crate::diff::{show, ValueDiff};

/// How many body differences of one request the text report shows.
const MAX_SHOWN: usize = 40;
/// How long a value may be in the text report.
const MAX_VALUE: usize = 160;

/// Which side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideId {
    /// The first (`--left`) side.
    Left,
    /// The second (`--right`) side.
    Right,
}

impl fmt::Display for SideId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SideId::Left => "left",
            SideId::Right => "right",
        })
    }
}

/// One difference found in one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Difference {
    /// Different status codes.
    Status {
        /// Left status code.
        left: u16,
        /// Right status code.
        right: u16,
    },
    /// One side got no answer (transport error), or the request could not be built for it
    /// (a capture it needs is missing), or a capture failed.
    Failed {
        /// Which side.
        side: SideId,
        /// What happened.
        error: String,
    },
    /// A side answered another status than the corpus's `expect_status`.
    Expectation {
        /// Which side.
        side: SideId,
        /// `expect_status`.
        expected: u16,
        /// What it answered.
        got: u16,
    },
    /// A compared header differs (after normalisation).
    Header {
        /// Lowercase header name.
        name: String,
        /// Left value (`None`: absent).
        left: Option<String>,
        /// Right value (`None`: absent).
        right: Option<String>,
    },
    /// The JSON bodies differ at a path (after normalisation).
    Body(ValueDiff),
    /// The bodies are of different kinds (JSON, text, empty, binary).
    BodyKind {
        /// Left kind.
        left: String,
        /// Right kind.
        right: String,
    },
    /// Text bodies differ: the first differing line.
    Text {
        /// Line number (1-based).
        line: usize,
        /// Left line (`None`: no such line).
        left: Option<String>,
        /// Right line.
        right: Option<String>,
    },
}

fn quoted(v: &Option<String>) -> String {
    match v {
        Some(s) => show(Some(&serde_json::Value::String(s.clone())), MAX_VALUE),
        None => "<absent>".into(),
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::Status { left, right } => write!(f, "status: {left} vs {right}"),
            Difference::Failed { side, error } => write!(f, "{side} side: {error}"),
            Difference::Expectation {
                side,
                expected,
                got,
            } => write!(f, "{side} side: expected status {expected}, got {got}"),
            Difference::Header { name, left, right } => {
                write!(f, "header {name}: {} vs {}", quoted(left), quoted(right))
            }
            Difference::Body(d) => write!(
                f,
                "body {}: {} vs {}",
                d.path,
                show(d.left.as_ref(), MAX_VALUE),
                show(d.right.as_ref(), MAX_VALUE)
            ),
            Difference::BodyKind { left, right } => write!(f, "body: {left} vs {right}"),
            Difference::Text { line, left, right } => {
                write!(f, "body line {line}: {} vs {}", quoted(left), quoted(right))
            }
        }
    }
}

/// The outcome of one request of the corpus.
#[derive(Debug, Clone)]
pub struct RequestReport {
    /// Scenario (corpus file stem).
    pub scenario: String,
    /// The request's name.
    pub name: String,
    /// Method.
    pub method: String,
    /// Path as written in the corpus (with placeholders).
    pub path: String,
    /// Status code the left side answered (`None`: no answer).
    pub left_status: Option<u16>,
    /// Status code the right side answered.
    pub right_status: Option<u16>,
    /// What differs, after normalisation.
    pub differences: Vec<Difference>,
    /// The corpus's `known_difference` for this request.
    pub known_difference: Option<String>,
}

impl RequestReport {
    /// Something differs and the corpus does not explain it.
    pub fn is_unexplained(&self) -> bool {
        !self.differences.is_empty() && self.known_difference.is_none()
    }

    /// Something differs and the corpus explains why.
    pub fn is_explained(&self) -> bool {
        !self.differences.is_empty() && self.known_difference.is_some()
    }

    /// Both sides answered with this status class (2 for 2xx, 4 for 4xx...).
    pub fn both_answered(&self, class: u16) -> bool {
        let is = |s: Option<u16>| s.is_some_and(|s| s / 100 == class);
        is(self.left_status) && is(self.right_status)
    }

    fn title(&self) -> String {
        format!(
            "{} / {}  ({} {})",
            self.scenario, self.name, self.method, self.path
        )
    }

    fn write_differences(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut body_shown = 0;
        let mut body_hidden = 0;
        for d in &self.differences {
            if matches!(d, Difference::Body(_)) {
                if body_shown == MAX_SHOWN {
                    body_hidden += 1;
                    continue;
                }
                body_shown += 1;
            }
            writeln!(f, "    {d}")?;
        }
        if body_hidden > 0 {
            writeln!(f, "    ... and {body_hidden} more body differences")?;
        }
        Ok(())
    }
}

/// A scenario that could not run (its namespace could not be created).
#[derive(Debug, Clone)]
pub struct ScenarioError {
    /// Scenario.
    pub scenario: String,
    /// What went wrong.
    pub error: String,
}

/// Everything one run of the corpus found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The left side's label.
    pub left: String,
    /// The right side's label.
    pub right: String,
    /// Every request that was sent, in order.
    pub requests: Vec<RequestReport>,
    /// Scenarios that could not run.
    pub scenario_errors: Vec<ScenarioError>,
}

impl Report {
    /// No unexplained difference and every scenario ran.
    pub fn is_empty(&self) -> bool {
        self.scenario_errors.is_empty() && !self.requests.iter().any(RequestReport::is_unexplained)
    }

    /// Requests with a difference the corpus does not explain.
    pub fn unexplained(&self) -> impl Iterator<Item = &RequestReport> {
        self.requests.iter().filter(|r| r.is_unexplained())
    }

    /// Requests with a difference the corpus explains (`known_difference`).
    pub fn explained(&self) -> impl Iterator<Item = &RequestReport> {
        self.requests.iter().filter(|r| r.is_explained())
    }

    /// Requests with a `known_difference` that showed no difference this time.
    pub fn stale_known_differences(&self) -> impl Iterator<Item = &RequestReport> {
        self.requests
            .iter()
            .filter(|r| r.differences.is_empty() && r.known_difference.is_some())
    }

    /// The request named `name` of `scenario`.
    pub fn request(&self, scenario: &str, name: &str) -> Option<&RequestReport> {
        self.requests
            .iter()
            .find(|r| r.scenario == scenario && r.name == name)
    }

    /// `N requests, M with differences (K explained)`.
    pub fn summary(&self) -> String {
        let with = self
            .requests
            .iter()
            .filter(|r| !r.differences.is_empty())
            .count();
        let explained = self.explained().count();
        let mut s = format!(
            "{} requests, {} with differences ({} explained)",
            self.requests.len(),
            with,
            explained
        );
        if !self.scenario_errors.is_empty() {
            s.push_str(&format!(
                ", {} scenarios could not run",
                self.scenario_errors.len()
            ));
        }
        s
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "left: {}, right: {}", self.left, self.right)?;
        for e in &self.scenario_errors {
            writeln!(f, "{}: could not run: {}", e.scenario, e.error)?;
        }
        let unexplained: Vec<_> = self.unexplained().collect();
        if !unexplained.is_empty() {
            writeln!(f, "\ndifferences (left vs right):")?;
            for r in unexplained {
                writeln!(f, "  {}", r.title())?;
                r.write_differences(f)?;
            }
        }
        let explained: Vec<_> = self.explained().collect();
        if !explained.is_empty() {
            writeln!(f, "\nexplained differences (left vs right):")?;
            for r in explained {
                writeln!(
                    f,
                    "  {}\n    known difference: {}",
                    r.title(),
                    r.known_difference.as_deref().unwrap_or_default()
                )?;
                r.write_differences(f)?;
            }
        }
        let stale: Vec<_> = self.stale_known_differences().collect();
        if !stale.is_empty() {
            writeln!(
                f,
                "\nknown differences that did not occur (remove them from the corpus?):"
            )?;
            for r in stale {
                writeln!(
                    f,
                    "  {}: {}",
                    r.title(),
                    r.known_difference.as_deref().unwrap_or_default()
                )?;
            }
        }
        writeln!(f, "\n{}", self.summary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::{JsonPath, Segment};

    fn req(name: &str, diffs: Vec<Difference>, known: Option<&str>) -> RequestReport {
        RequestReport {
            scenario: "001-x".into(),
            name: name.into(),
            method: "GET".into(),
            path: "/api".into(),
            left_status: Some(200),
            right_status: Some(200),
            differences: diffs,
            known_difference: known.map(String::from),
        }
    }

    #[test]
    fn report_text() {
        let body = Difference::Body(ValueDiff {
            path: JsonPath(vec![Segment::Key("spec".into()), Segment::Index(0)]),
            left: Some(serde_json::json!("a")),
            right: None,
        });
        let report = Report {
            left: "a".into(),
            right: "b".into(),
            requests: vec![
                req("same", vec![], None),
                req(
                    "differs",
                    vec![
                        Difference::Status {
                            left: 200,
                            right: 404,
                        },
                        body,
                    ],
                    None,
                ),
                req(
                    "explained",
                    vec![Difference::Status { left: 1, right: 2 }],
                    Some("because"),
                ),
                req("stale", vec![], Some("old reason")),
            ],
            scenario_errors: vec![],
        };
        assert!(!report.is_empty());
        let text = report.to_string();
        assert!(text.contains("  001-x / differs  (GET /api)\n    status: 200 vs 404\n    body spec[0]: \"a\" vs <absent>\n"), "{text}");
        assert!(text.contains("known difference: because"), "{text}");
        assert!(
            text.contains("001-x / stale  (GET /api): old reason"),
            "{text}"
        );
        assert!(
            text.ends_with("4 requests, 2 with differences (1 explained)\n"),
            "{text}"
        );
        let clean = Report {
            requests: vec![req("same", vec![], None)],
            ..Default::default()
        };
        assert!(clean.is_empty());
    }
}
