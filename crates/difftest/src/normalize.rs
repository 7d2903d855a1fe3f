//! Normalisation: volatile values are replaced by markers, on each side, before the two
//! responses are compared. Every rule is in [`RULES`]; docs/REFERENCE.md lists them too.
//!
//! Path patterns: `.`-separated keys, `*` (any one key), `[*]` (any array element) and
//! `**` (any number of keys and elements, including none). A path rule replaces a present,
//! non-null value (unless it is one of the rule's `keep` values) and does not descend into it.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::diff::Segment;

/// What a rule matches.
#[derive(Debug, Clone, Copy)]
pub enum Match {
    /// A JSON path pattern.
    Path(&'static str),
    /// A string value that looks like an RFC 3339 time, under a key named `time` or ending in
    /// `Time` or `Timestamp`.
    TimeKey,
    /// The cells of a `Table`'s `Age` columns.
    TableAge,
    /// Substrings of every string (values, object keys, compared headers).
    Text(TextRule),
}

/// The substring rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextRule {
    /// The scenario's namespace, random per run and side.
    Namespace,
    /// A name the server generated from `metadata.generateName` (learned from responses).
    GeneratedName,
    /// A UUID (8-4-4-4-12 hex digits).
    Uuid,
    /// The 5 random characters of the service-account token volume `kube-api-access-xxxxx`.
    TokenVolume,
    /// A resourceVersion seen in a response, as a whole number in a `message`.
    ResourceVersionInMessage,
}

/// One normalisation rule.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// What it matches.
    pub matches: Match,
    /// The marker that replaces the value (for `GeneratedName`: after the prefix).
    pub replacement: &'static str,
    /// Values left alone.
    pub keep: &'static [&'static str],
    /// Only for responses to this request path (without query), when set.
    pub only_path: Option<&'static str>,
    /// Why the value is volatile.
    pub why: &'static str,
}

const fn path(pattern: &'static str, replacement: &'static str, why: &'static str) -> Rule {
    Rule {
        matches: Match::Path(pattern),
        replacement,
        keep: &[],
        only_path: None,
        why,
    }
}

const fn version(field: &'static str) -> Rule {
    Rule {
        matches: Match::Path(field),
        replacement: "<build>",
        keep: &[],
        only_path: Some("/version"),
        why: "build information of the binary",
    }
}

const fn text(rule: TextRule, replacement: &'static str, why: &'static str) -> Rule {
    Rule {
        matches: Match::Text(rule),
        replacement,
        keep: &[],
        only_path: None,
        why,
    }
}

/// Every normalisation rule, in the order they are tried.
pub static RULES: &[Rule] = &[
    path("**.metadata.uid", "<uid>", "random per object"),
    path(
        "**.metadata.resourceVersion",
        "<rv>",
        "the store's revision (objects, lists, Tables, watch events and bookmarks)",
    ),
    path("**.metadata.creationTimestamp", "<timestamp>", "wall clock"),
    path("**.metadata.deletionTimestamp", "<timestamp>", "wall clock"),
    path(
        "**.metadata.managedFields[*].time",
        "<timestamp>",
        "wall clock",
    ),
    path(
        "**.metadata.continue",
        "<continue>",
        "opaque token that encodes a revision",
    ),
    path(
        "**.metadata.selfLink",
        "<self-link>",
        "not set since 1.20; if present, server-specific",
    ),
    Rule {
        matches: Match::Path("**.spec.clusterIP"),
        replacement: "<cluster-ip>",
        keep: &["None", ""],
        only_path: None,
        why: "allocated at random from the service CIDR",
    },
    Rule {
        matches: Match::Path("**.spec.clusterIPs[*]"),
        replacement: "<cluster-ip>",
        keep: &["None"],
        only_path: None,
        why: "allocated at random from the service CIDR",
    },
    path(
        "**.spec.ports[*].nodePort",
        "<node-port>",
        "allocated at random from the node-port range",
    ),
    path(
        "**.spec.healthCheckNodePort",
        "<node-port>",
        "allocated at random from the node-port range",
    ),
    path(
        "**.serverAddressByClientCIDRs[*].serverAddress",
        "<server-address>",
        "the server's own host:port",
    ),
    version("gitCommit"),
    version("gitTreeState"),
    version("buildDate"),
    version("goVersion"),
    version("compiler"),
    version("platform"),
    Rule {
        matches: Match::TimeKey,
        replacement: "<timestamp>",
        keep: &[],
        only_path: None,
        why: "wall clock (event times, condition transition times, ...)",
    },
    Rule {
        matches: Match::TableAge,
        replacement: "<age>",
        keep: &[],
        only_path: None,
        why: "time since creation",
    },
    text(
        TextRule::GeneratedName,
        "<generated>",
        "random suffix added to metadata.generateName",
    ),
    text(
        TextRule::Namespace,
        "{{ns}}",
        "random suffix per run and side",
    ),
    text(
        TextRule::Uuid,
        "<uid>",
        "uids in owner references, Status details and messages",
    ),
    text(
        TextRule::TokenVolume,
        "kube-api-access-<random>",
        "random suffix of the projected service-account token volume",
    ),
    text(
        TextRule::ResourceVersionInMessage,
        "<rv>",
        "revisions quoted in Status messages (preconditions, too old resource version)",
    ),
];

/// Header names never compared (they differ on every response); only `Content-Type`,
/// `Warning` and a request's `compare_headers` are compared at all.
pub const VOLATILE_HEADERS: &[&str] = &[
    "date",
    "audit-id",
    "x-kubernetes-pf-flowschema-uid",
    "x-kubernetes-pf-prioritylevel-uid",
];

/// What one side has learned so far in a scenario: its namespace, the names the server
/// generated and the resourceVersions it returned.
#[derive(Debug, Clone, Default)]
pub struct Learned {
    namespaces: Vec<String>,
    /// (generated name, generateName prefix), longest name first.
    generated: Vec<(String, String)>,
    resource_versions: BTreeSet<String>,
}

impl Learned {
    /// A side whose scenario namespace is `namespace`.
    pub fn new(namespace: &str) -> Self {
        Learned {
            namespaces: vec![namespace.to_string()],
            ..Default::default()
        }
    }

    /// Learns generated names and resourceVersions from a raw (not yet normalised) body.
    pub fn learn(&mut self, body: &Value) {
        match body {
            Value::Object(m) => {
                if let Some(Value::Object(meta)) = m.get("metadata") {
                    if let (Some(Value::String(prefix)), Some(Value::String(name))) =
                        (meta.get("generateName"), meta.get("name"))
                    {
                        if name.len() > prefix.len()
                            && name.starts_with(prefix.as_str())
                            && !self.generated.iter().any(|(n, _)| n == name)
                        {
                            self.generated.push((name.clone(), prefix.clone()));
                            self.generated.sort_by_key(|g| std::cmp::Reverse(g.0.len()));
                        }
                    }
                    if let Some(Value::String(rv)) = meta.get("resourceVersion") {
                        if !rv.is_empty() && rv.bytes().all(|b| b.is_ascii_digit()) {
                            self.resource_versions.insert(rv.clone());
                        }
                    }
                }
                m.values().for_each(|v| self.learn(v));
            }
            Value::Array(a) => a.iter().for_each(|v| self.learn(v)),
            _ => {}
        }
    }

    /// Applies the text rules to a string (`in_message`: it is the value of a `message` key).
    pub fn text(&self, s: &str, in_message: bool) -> String {
        let mut out = s.to_string();
        for rule in RULES {
            let Match::Text(t) = rule.matches else {
                continue;
            };
            out = match t {
                TextRule::GeneratedName => {
                    let mut o = out;
                    for (name, prefix) in &self.generated {
                        if o.contains(name.as_str()) {
                            o = o.replace(name.as_str(), &format!("{prefix}{}", rule.replacement));
                        }
                    }
                    o
                }
                TextRule::Namespace => {
                    let mut o = out;
                    for ns in &self.namespaces {
                        if o.contains(ns.as_str()) {
                            o = o.replace(ns.as_str(), rule.replacement);
                        }
                    }
                    o
                }
                TextRule::Uuid => replace_uuids(&out, rule.replacement),
                TextRule::TokenVolume => replace_token_volume(&out, rule.replacement),
                TextRule::ResourceVersionInMessage if in_message => {
                    replace_numbers(&out, &self.resource_versions, rule.replacement)
                }
                TextRule::ResourceVersionInMessage => out,
            };
        }
        out
    }
}

/// Normalises a response body in place. `request_path` is the request's path without query.
pub fn normalize(body: &mut Value, request_path: &str, learned: &Learned) {
    let rules: Vec<(&Rule, Vec<Pat>)> = RULES
        .iter()
        .filter(|r| r.only_path.is_none_or(|p| p == request_path))
        .filter_map(|r| match r.matches {
            Match::Path(p) => Some((r, parse_pattern(p))),
            _ => None,
        })
        .collect();
    let mut path = Vec::new();
    walk(body, &mut path, &rules, learned);
}

fn walk(v: &mut Value, path: &mut Vec<Segment>, rules: &[(&Rule, Vec<Pat>)], learned: &Learned) {
    if !v.is_null() {
        for (rule, pat) in rules {
            if matches(pat, path) {
                if v.as_str().is_some_and(|s| rule.keep.contains(&s)) {
                    return;
                }
                *v = Value::String(rule.replacement.to_string());
                return;
            }
        }
    }
    let key = match path.last() {
        Some(Segment::Key(k)) => Some(k.as_str()),
        _ => None,
    };
    match v {
        Value::String(s) => {
            if key.is_some_and(is_time_key) && looks_like_time(s) {
                *s = rule_for(Match::TimeKey).to_string();
            } else {
                let n = learned.text(s, key == Some("message"));
                *s = n;
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter_mut().enumerate() {
                path.push(Segment::Index(i));
                walk(x, path, rules, learned);
                path.pop();
            }
        }
        Value::Object(m) => {
            let old = std::mem::take(m);
            for (k, mut x) in old {
                path.push(Segment::Key(k.clone()));
                walk(&mut x, path, rules, learned);
                path.pop();
                m.insert(learned.text(&k, false), x);
            }
            table_ages(m);
        }
        _ => {}
    }
}

fn rule_for(kind: Match) -> &'static str {
    RULES
        .iter()
        .find(|r| std::mem::discriminant(&r.matches) == std::mem::discriminant(&kind))
        .map_or("<normalised>", |r| r.replacement)
}

/// A `Table` (meta.k8s.io): the cells of columns named `Age` become `<age>`.
fn table_ages(m: &mut serde_json::Map<String, Value>) {
    if m.get("kind").and_then(Value::as_str) != Some("Table") {
        return;
    }
    let ages: Vec<usize> = m
        .get("columnDefinitions")
        .and_then(Value::as_array)
        .map(|cols| {
            cols.iter()
                .enumerate()
                .filter(|(_, c)| c.get("name").and_then(Value::as_str) == Some("Age"))
                .map(|(i, _)| i)
                .collect()
        })
        .unwrap_or_default();
    if ages.is_empty() {
        return;
    }
    let marker = rule_for(Match::TableAge);
    if let Some(Value::Array(rows)) = m.get_mut("rows") {
        for row in rows {
            if let Some(Value::Array(cells)) = row.get_mut("cells") {
                for &i in &ages {
                    if let Some(c) = cells.get_mut(i) {
                        *c = Value::String(marker.to_string());
                    }
                }
            }
        }
    }
}

fn is_time_key(k: &str) -> bool {
    k == "time" || k.ends_with("Time") || k.ends_with("Timestamp")
}

/// `2026-12-02T16:52:54Z`, `2026-12-02T16:52:54.123456Z`, `...+01:00`.
fn looks_like_time(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 20
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && (s.ends_with('Z') || b[b.len() - 6] == b'+' || b[b.len() - 6] == b'-')
}

#[derive(Debug, Clone, PartialEq)]
enum Pat {
    Key(String),
    AnyKey,
    AnyIndex,
    AnyDepth,
}

fn parse_pattern(p: &str) -> Vec<Pat> {
    let mut out = Vec::new();
    for part in p.split('.') {
        let (name, indexes) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        match name {
            "**" => out.push(Pat::AnyDepth),
            "*" => out.push(Pat::AnyKey),
            "" => {}
            k => out.push(Pat::Key(k.to_string())),
        }
        for _ in 0..indexes.matches("[*]").count() {
            out.push(Pat::AnyIndex);
        }
    }
    out
}

fn matches(pat: &[Pat], path: &[Segment]) -> bool {
    match (pat.first(), path.first()) {
        (None, None) => true,
        (Some(Pat::AnyDepth), _) => {
            matches(&pat[1..], path) || (!path.is_empty() && matches(pat, &path[1..]))
        }
        (None, Some(_)) | (Some(_), None) => false,
        (Some(Pat::Key(k)), Some(Segment::Key(s))) if k == s => matches(&pat[1..], &path[1..]),
        (Some(Pat::AnyKey), Some(Segment::Key(_))) => matches(&pat[1..], &path[1..]),
        (Some(Pat::AnyIndex), Some(Segment::Index(_))) => matches(&pat[1..], &path[1..]),
        _ => false,
    }
}

fn is_hex(b: u8) -> bool {
    b.is_ascii_hexdigit()
}

fn is_uuid_at(b: &[u8], i: usize) -> bool {
    const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];
    let mut j = i;
    for (n, g) in GROUPS.iter().enumerate() {
        if j + g > b.len() || !b[j..j + g].iter().copied().all(is_hex) {
            return false;
        }
        j += g;
        if n < 4 {
            if b.get(j) != Some(&b'-') {
                return false;
            }
            j += 1;
        }
    }
    let before_ok = i == 0 || !b[i - 1].is_ascii_alphanumeric();
    let after_ok = b.get(j).is_none_or(|c| !c.is_ascii_alphanumeric());
    before_ok && after_ok
}

fn replace_uuids(s: &str, marker: &str) -> String {
    let b = s.as_bytes();
    if b.len() < 36 {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut copied = 0;
    while i + 36 <= b.len() {
        if is_uuid_at(b, i) {
            out.push_str(&s[copied..i]);
            out.push_str(marker);
            i += 36;
            copied = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&s[copied..]);
    out
}

fn replace_token_volume(s: &str, marker: &str) -> String {
    const PREFIX: &str = "kube-api-access-";
    if !s.contains(PREFIX) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(PREFIX) {
        let after = &rest[i + PREFIX.len()..];
        let b = after.as_bytes();
        let random = b.len() >= 5
            && b[..5]
                .iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && b.get(5).is_none_or(|c| !c.is_ascii_alphanumeric());
        out.push_str(&rest[..i]);
        if random {
            out.push_str(marker);
            rest = &after[5..];
        } else {
            out.push_str(PREFIX);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Replaces whole numbers (runs of digits) that are in `set`.
fn replace_numbers(s: &str, set: &BTreeSet<String>, marker: &str) -> String {
    if set.is_empty() || !s.bytes().any(|b| b.is_ascii_digit()) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        if !digits.is_empty() {
            if set.contains(digits.as_str()) {
                out.push_str(marker);
            } else {
                out.push_str(digits);
            }
            digits.clear();
        }
    };
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    out
}

/// The normalised value of a compared header.
pub fn normalize_header(value: &str, learned: &Learned) -> String {
    learned.text(value, false)
}

/// The rules as a text table (for `docs/REFERENCE.md` and `--help`-style listings).
pub fn describe_rules() -> String {
    let mut out = String::new();
    for r in RULES {
        let what = match r.matches {
            Match::Path(p) => format!("`{p}`"),
            Match::TimeKey => "string under a key `time`, `*Time` or `*Timestamp` that looks like an RFC 3339 time".into(),
            Match::TableAge => "`Table` cells in columns named `Age`".into(),
            Match::Text(t) => format!("text: {t:?}"),
        };
        let scope = r
            .only_path
            .map(|p| format!(" (only {p})"))
            .unwrap_or_default();
        let keep = if r.keep.is_empty() {
            String::new()
        } else {
            format!(" (keeps {:?})", r.keep)
        };
        out.push_str(&format!(
            "- {what}{scope}{keep} → `{}`: {}\n",
            r.replacement, r.why
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn norm(mut v: Value, path: &str, learned: &Learned) -> Value {
        normalize(&mut v, path, learned);
        v
    }

    #[test]
    fn patterns() {
        let p = parse_pattern("**.metadata.managedFields[*].time");
        assert_eq!(
            p,
            vec![
                Pat::AnyDepth,
                Pat::Key("metadata".into()),
                Pat::Key("managedFields".into()),
                Pat::AnyIndex,
                Pat::Key("time".into())
            ]
        );
        let k = |s: &str| Segment::Key(s.into());
        assert!(matches(
            &p,
            &[
                k("metadata"),
                k("managedFields"),
                Segment::Index(3),
                k("time")
            ]
        ));
        assert!(matches(
            &p,
            &[
                k("items"),
                Segment::Index(0),
                k("metadata"),
                k("managedFields"),
                Segment::Index(0),
                k("time")
            ]
        ));
        assert!(!matches(
            &p,
            &[k("metadata"), k("managedFields"), k("time")]
        ));
        assert!(matches(&parse_pattern("gitCommit"), &[k("gitCommit")]));
        assert!(!matches(
            &parse_pattern("gitCommit"),
            &[k("x"), k("gitCommit")]
        ));
    }

    #[test]
    fn object_metadata_and_lists() {
        let learned = Learned::new("ns-abcde");
        let got = norm(
            json!({
                "kind": "ConfigMapList",
                "metadata": {"resourceVersion": "120", "continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIwfQ"},
                "items": [{
                    "metadata": {
                        "name": "a", "namespace": "ns-abcde",
                        "uid": "a122d5e7-95c9-4247-b66d-69d8a1d584f6",
                        "resourceVersion": "119", "creationTimestamp": "2026-12-02T16:52:54Z",
                        "managedFields": [{"manager": "m", "time": "2026-12-02T16:52:54Z"}],
                        "ownerReferences": [{"uid": "b122d5e7-95c9-4247-b66d-69d8a1d584f6"}]
                    },
                    "data": {"k": "v"}
                }]
            }),
            "/api/v1/namespaces/ns-abcde/configmaps",
            &learned,
        );
        assert_eq!(
            got,
            json!({
                "kind": "ConfigMapList",
                "metadata": {"resourceVersion": "<rv>", "continue": "<continue>"},
                "items": [{
                    "metadata": {
                        "name": "a", "namespace": "{{ns}}", "uid": "<uid>",
                        "resourceVersion": "<rv>", "creationTimestamp": "<timestamp>",
                        "managedFields": [{"manager": "m", "time": "<timestamp>"}],
                        "ownerReferences": [{"uid": "<uid>"}]
                    },
                    "data": {"k": "v"}
                }]
            })
        );
    }

    #[test]
    fn empty_continue_and_service_none_are_kept() {
        let learned = Learned::new("x-aaaaa");
        let got = norm(
            json!({"metadata": {"continue": null}, "spec": {"clusterIP": "None", "clusterIPs": ["None"],
                   "ports": [{"port": 80, "nodePort": 31234}]}}),
            "/",
            &learned,
        );
        assert_eq!(
            got,
            json!({"metadata": {"continue": null}, "spec": {"clusterIP": "None", "clusterIPs": ["None"],
                   "ports": [{"port": 80, "nodePort": "<node-port>"}]}})
        );
        let got = norm(
            json!({"spec": {"clusterIP": "10.96.12.7", "clusterIPs": ["10.96.12.7"]}}),
            "/",
            &learned,
        );
        assert_eq!(
            got,
            json!({"spec": {"clusterIP": "<cluster-ip>", "clusterIPs": ["<cluster-ip>"]}})
        );
    }

    #[test]
    fn version_fields_only_on_version() {
        let learned = Learned::default();
        let v = json!({"major": "1", "gitVersion": "v1.37.2", "gitCommit": "abc", "goVersion": "go1.26.8"});
        assert_eq!(
            norm(v.clone(), "/version", &learned),
            json!({"major": "1", "gitVersion": "v1.37.2", "gitCommit": "<build>", "goVersion": "<build>"})
        );
        assert_eq!(norm(v.clone(), "/api", &learned), v);
    }

    #[test]
    fn generated_names_namespaces_and_messages() {
        let mut learned = Learned::new("005-watch-k2j9x");
        let raw = json!({"metadata": {"generateName": "gen-", "name": "gen-x7k2p", "resourceVersion": "4711"}});
        learned.learn(&raw);
        let got = norm(
            json!({
                "metadata": {"generateName": "gen-", "name": "gen-x7k2p", "resourceVersion": "4711"},
                "message": "Precondition failed: ResourceVersion in precondition: 4711, ResourceVersion in object meta: 47110",
                "other": "configmaps \"gen-x7k2p\" not found in 005-watch-k2j9x, rv 4711",
                "spec": {"volumes": [{"name": "kube-api-access-wqhjf"}]},
                "status": {"conditions": [{"lastTransitionTime": "2026-12-02T16:52:54Z", "reason": "2026-12-02T16:52:54Z"}]}
            }),
            "/x",
            &learned,
        );
        assert_eq!(
            got,
            json!({
                "metadata": {"generateName": "gen-", "name": "gen-<generated>", "resourceVersion": "<rv>"},
                "message": "Precondition failed: ResourceVersion in precondition: <rv>, ResourceVersion in object meta: 47110",
                "other": "configmaps \"gen-<generated>\" not found in {{ns}}, rv 4711",
                "spec": {"volumes": [{"name": "kube-api-access-<random>"}]},
                "status": {"conditions": [{"lastTransitionTime": "<timestamp>", "reason": "2026-12-02T16:52:54Z"}]}
            })
        );
        assert_eq!(
            normalize_header("299 - \"x in 005-watch-k2j9x\"", &learned),
            "299 - \"x in {{ns}}\""
        );
    }

    #[test]
    fn table_age_cells() {
        let learned = Learned::default();
        let got = norm(
            json!({"kind": "Table", "columnDefinitions": [{"name": "Name"}, {"name": "Data"}, {"name": "Age"}],
                   "rows": [{"cells": ["a", 1, "3s"], "object": {"metadata": {"uid": "u"}}}]}),
            "/",
            &learned,
        );
        assert_eq!(
            got,
            json!({"kind": "Table", "columnDefinitions": [{"name": "Name"}, {"name": "Data"}, {"name": "Age"}],
                   "rows": [{"cells": ["a", 1, "<age>"], "object": {"metadata": {"uid": "<uid>"}}}]})
        );
    }

    #[test]
    fn uuids_need_boundaries() {
        assert_eq!(
            replace_uuids("uid a122d5e7-95c9-4247-b66d-69d8a1d584f6.", "<uid>"),
            "uid <uid>."
        );
        let not = "xa122d5e7-95c9-4247-b66d-69d8a1d584f6";
        assert_eq!(replace_uuids(not, "<uid>"), not);
        assert_eq!(
            replace_token_volume("kube-api-access-abcdef kube-api-access-", "<r>"),
            "kube-api-access-abcdef kube-api-access-"
        );
    }

    #[test]
    fn rules_are_described() {
        let d = describe_rules();
        assert_eq!(d.lines().count(), RULES.len());
        assert!(d.contains("**.metadata.uid"));
    }
}
