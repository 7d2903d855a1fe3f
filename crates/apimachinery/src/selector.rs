//! Label and field selectors, as k8s.io/apimachinery's `pkg/labels` and `pkg/fields`, with
//! upstream's grammar, canonical string forms and error messages.
//!
//! Label selectors (`?labelSelector=`, `kubectl -l`):
//!
//! ```text
//! <selector>    ::= <requirement> | <requirement> "," <selector>
//! <requirement> ::= [!] KEY [ ("in" | "notin") "(" VALUE { "," VALUE } ")"
//!                           | ("=" | "==" | "!=" | ">" | "<") VALUE ]
//! ```
//!
//! KEY is a qualified name and VALUE a label value (both checked, with upstream's messages);
//! the empty string selects everything. Field selectors (`?fieldSelector=`) are comma-separated
//! `field=value`, `field==value` and `field!=value` terms, with `\,`, `\=` and `\\` escapes in
//! values.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::validation::{
    aggregate_message, go_quote, is_qualified_name, is_valid_label_value, BadValue, FieldError,
    FieldErrorKind, Path,
};

/// A selector that cannot be parsed or built; the message is upstream's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SelectorError {
    pub message: String,
}

impl SelectorError {
    fn new(message: impl Into<String>) -> Self {
        SelectorError {
            message: message.into(),
        }
    }
}

/// The operator of a requirement (upstream's `selection.Operator`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operator {
    DoesNotExist,
    Equals,
    DoubleEquals,
    In,
    NotEquals,
    NotIn,
    Exists,
    GreaterThan,
    LessThan,
}

impl Operator {
    /// Upstream's string for the operator: `!`, `=`, `==`, `in`, `!=`, `notin`, `exists`,
    /// `gt`, `lt`.
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::DoesNotExist => "!",
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::In => "in",
            Operator::NotEquals => "!=",
            Operator::NotIn => "notin",
            Operator::Exists => "exists",
            Operator::GreaterThan => "gt",
            Operator::LessThan => "lt",
        }
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The binary operators, in the order upstream lists them in its parse errors.
const BINARY_OPERATORS: &str = "in, notin, =, ==, !=, gt, lt";

// ---------------------------------------------------------------------------------------------
// Requirements
// ---------------------------------------------------------------------------------------------

/// One requirement of a label selector: a key, an operator and values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    /// A checked requirement, as upstream's `NewRequirement`: the key must be a qualified
    /// name; `In`/`NotIn` need at least one value; `=`, `==`, `!=` exactly one; `Exists` and
    /// `DoesNotExist` none; `gt`/`lt` exactly one integer; every value a label value. The error
    /// lists every problem, e.g. `values[0][app]: Invalid value: "a b": ...`.
    pub fn new(
        key: impl Into<String>,
        operator: Operator,
        values: Vec<String>,
    ) -> Result<Requirement, SelectorError> {
        new_requirement(key.into(), operator, values, None, false)
            .map_err(|errs| SelectorError::new(aggregate_message(&errs).unwrap_or_default()))
    }

    /// A requirement built without any check.
    pub fn new_unchecked(key: impl Into<String>, operator: Operator, values: Vec<String>) -> Self {
        Requirement {
            key: key.into(),
            operator,
            values,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values in the order given (sorted and without duplicates when parsed).
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether a set of labels satisfies this requirement. A missing key satisfies `!=`,
    /// `notin` and `!`; `gt`/`lt` need a label whose value is an integer.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_by(|k| labels.get(k).map(String::as_str))
    }

    /// [`Requirement::matches`] over any lookup of label values.
    pub fn matches_by<'a, F>(&self, get: F) -> bool
    where
        F: Fn(&str) -> Option<&'a str>,
    {
        let has_value = |v: &str| self.values.iter().any(|x| x == v);
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                get(&self.key).is_some_and(has_value)
            }
            Operator::NotIn | Operator::NotEquals => !get(&self.key).is_some_and(has_value),
            Operator::Exists => get(&self.key).is_some(),
            Operator::DoesNotExist => get(&self.key).is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(label) = get(&self.key).and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let [value] = self.values.as_slice() else {
                    return false;
                };
                let Ok(value) = value.parse::<i64>() else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    label > value
                } else {
                    label < value
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    /// Upstream's canonical form: `!k`, `k`, `k=v`, `k==v`, `k!=v`, `k>5`, `k<5`,
    /// `k in (a,b)`, `k notin (a,b)`, with several values sorted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let (op, parens) = match self.operator {
            Operator::Equals => ("=", false),
            Operator::DoubleEquals => ("==", false),
            Operator::NotEquals => ("!=", false),
            Operator::In => (" in ", true),
            Operator::NotIn => (" notin ", true),
            Operator::GreaterThan => (">", false),
            Operator::LessThan => ("<", false),
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
        };
        f.write_str(op)?;
        if parens {
            f.write_str("(")?;
        }
        if let [only] = self.values.as_slice() {
            f.write_str(only)?;
        } else {
            let mut sorted: Vec<&str> = self.values.iter().map(String::as_str).collect();
            sorted.sort_unstable();
            f.write_str(&sorted.join(","))?;
        }
        if parens {
            f.write_str(")")?;
        }
        Ok(())
    }
}

fn path_or(path: Option<&Path>, child: &str) -> Path {
    match path {
        Some(p) => p.child(child),
        None => Path::new(child),
    }
}

/// Upstream's `validateLabelKey`: one error joining every problem with `; `.
fn validate_label_key(key: &str, field: String) -> Option<FieldError> {
    let errs = is_qualified_name(key);
    if errs.is_empty() {
        return None;
    }
    Some(FieldError {
        field,
        kind: FieldErrorKind::Invalid,
        bad_value: BadValue::String(key.to_owned()),
        message: errs.join("; "),
    })
}

/// Upstream's `NewRequirement`. `empty_is_nil` renders an empty value list as `null` (what a
/// nil Go slice encodes to) instead of `[]`.
fn new_requirement(
    key: String,
    operator: Operator,
    values: Vec<String>,
    path: Option<&Path>,
    empty_is_nil: bool,
) -> Result<Requirement, Vec<FieldError>> {
    let mut errs = Vec::new();
    if let Some(e) = validate_label_key(&key, path_or(path, "key").as_str().to_owned()) {
        errs.push(e);
    }
    let values_path = path_or(path, "values");
    let values_json = || {
        if values.is_empty() && empty_is_nil {
            BadValue::Json(serde_json::Value::Null)
        } else {
            BadValue::Json(serde_json::Value::from(values.clone()))
        }
    };
    match operator {
        Operator::In | Operator::NotIn => {
            if values.is_empty() {
                errs.push(FieldError::invalid(
                    &values_path,
                    values_json(),
                    "for 'in', 'notin' operators, values set can't be empty",
                ));
            }
        }
        Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => {
            if values.len() != 1 {
                errs.push(FieldError::invalid(
                    &values_path,
                    values_json(),
                    "exact-match compatibility requires one single value",
                ));
            }
        }
        Operator::Exists | Operator::DoesNotExist => {
            if !values.is_empty() {
                errs.push(FieldError::invalid(
                    &values_path,
                    values_json(),
                    "values set must be empty for exists and does not exist",
                ));
            }
        }
        Operator::GreaterThan | Operator::LessThan => {
            if values.len() != 1 {
                errs.push(FieldError::invalid(
                    &values_path,
                    values_json(),
                    "for 'Gt', 'Lt' operators, exactly one value is required",
                ));
            }
            for (i, v) in values.iter().enumerate() {
                if v.parse::<i64>().is_err() {
                    errs.push(FieldError::invalid(
                        &values_path.index(i),
                        v.as_str(),
                        "for 'Gt', 'Lt' operators, the value must be an integer",
                    ));
                }
            }
        }
    }
    for (i, v) in values.iter().enumerate() {
        let msgs = is_valid_label_value(v);
        if !msgs.is_empty() {
            errs.push(FieldError::invalid(
                &values_path.index(i).key(&key),
                v.as_str(),
                msgs.join("; "),
            ));
        }
    }
    if errs.is_empty() {
        Ok(Requirement {
            key,
            operator,
            values,
        })
    } else {
        Err(errs)
    }
}

// ---------------------------------------------------------------------------------------------
// Label selectors
// ---------------------------------------------------------------------------------------------

/// A label selector: the AND of its requirements, kept sorted by key. The empty selector
/// selects everything; [`LabelSelector::nothing`] (a null metav1.LabelSelector) selects
/// nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

impl LabelSelector {
    /// The selector that matches every set of labels (the empty string).
    pub fn everything() -> Self {
        LabelSelector::default()
    }

    /// The selector that matches nothing (what a null metav1.LabelSelector converts to).
    pub fn nothing() -> Self {
        LabelSelector {
            requirements: Vec::new(),
            nothing: true,
        }
    }

    /// Parses the string form of a label selector (upstream's `labels.Parse`). Errors carry
    /// upstream's messages, e.g. `unable to parse requirement: found '', expected: identifier`
    /// or `found ',', expected: !, identifier, or 'end of string'`.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        Self::parse_at(selector, None)
    }

    /// [`LabelSelector::parse`] with the field errors of requirements placed under `path`
    /// (upstream's `field.WithPath` option).
    pub fn parse_with_path(selector: &str, path: &Path) -> Result<Self, SelectorError> {
        Self::parse_at(selector, Some(path))
    }

    fn parse_at(selector: &str, path: Option<&Path>) -> Result<Self, SelectorError> {
        let mut parser = Parser::new(selector, path);
        let mut requirements = parser.parse().map_err(SelectorError::new)?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            requirements,
            nothing: false,
        })
    }

    /// The selector of a metav1.LabelSelector given as JSON (upstream's
    /// `LabelSelectorAsSelector`): `null` selects nothing, `{}` everything; `matchLabels`
    /// become `=` requirements and `matchExpressions` `in`, `notin`, exists and `!`.
    pub fn from_json(value: &serde_json::Value) -> Result<Self, SelectorError> {
        if value.is_null() {
            return Ok(Self::nothing());
        }
        let api: ApiLabelSelector = serde_json::from_value(value.clone())
            .map_err(|e| SelectorError::new(format!("invalid label selector: {e}")))?;
        Self::from_api(Some(&api))
    }

    /// [`LabelSelector::from_json`] from the decoded metav1.LabelSelector; `None` is a null
    /// selector, which selects nothing.
    pub fn from_api(selector: Option<&ApiLabelSelector>) -> Result<Self, SelectorError> {
        let Some(api) = selector else {
            return Ok(Self::nothing());
        };
        if api.match_labels.is_empty() && api.match_expressions.is_empty() {
            return Ok(Self::everything());
        }
        let to_err = |errs: Vec<FieldError>| {
            SelectorError::new(aggregate_message(&errs).unwrap_or_default())
        };
        let mut requirements = Vec::new();
        for (k, v) in &api.match_labels {
            let r = new_requirement(k.clone(), Operator::Equals, vec![v.clone()], None, true)
                .map_err(to_err)?;
            requirements.push(r);
        }
        for expr in &api.match_expressions {
            let op = match expr.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    return Err(SelectorError::new(format!(
                        "{} is not a valid label selector operator",
                        go_quote(other)
                    )))
                }
            };
            let r = new_requirement(expr.key.clone(), op, expr.values.clone(), None, true)
                .map_err(to_err)?;
            requirements.push(r);
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            requirements,
            nothing: false,
        })
    }

    /// A selector requiring exactly these labels, without checking them (upstream's
    /// `SelectorFromSet`).
    pub fn from_set(labels: &BTreeMap<String, String>) -> Self {
        LabelSelector {
            requirements: labels
                .iter()
                .map(|(k, v)| Requirement::new_unchecked(k, Operator::Equals, vec![v.clone()]))
                .collect(),
            nothing: false,
        }
    }

    /// [`LabelSelector::from_set`] with every key and value checked (upstream's
    /// `ValidatedSelectorFromSet`).
    pub fn from_set_validated(labels: &BTreeMap<String, String>) -> Result<Self, SelectorError> {
        let mut requirements = Vec::with_capacity(labels.len());
        for (k, v) in labels {
            requirements.push(Requirement::new(k, Operator::Equals, vec![v.clone()])?);
        }
        Ok(LabelSelector {
            requirements,
            nothing: false,
        })
    }

    /// Adds a requirement (the selector stays sorted by key). Adding to the nothing selector
    /// leaves it matching nothing, as upstream.
    pub fn add(&mut self, requirement: Requirement) {
        if self.nothing {
            return;
        }
        self.requirements.push(requirement);
        self.requirements.sort_by(|a, b| a.key.cmp(&b.key));
    }

    /// Whether the labels satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_by(|k| labels.get(k).map(String::as_str))
    }

    /// [`LabelSelector::matches`] over any lookup of label values.
    pub fn matches_by<'a, F>(&self, get: F) -> bool
    where
        F: Fn(&str) -> Option<&'a str>,
    {
        !self.nothing && self.requirements.iter().all(|r| r.matches_by(&get))
    }

    /// True when the selector does not restrict anything (upstream's `Empty()`); the nothing
    /// selector is not empty.
    pub fn is_empty(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }

    /// True only for the selector that matches nothing.
    pub fn matches_nothing(&self) -> bool {
        self.nothing
    }

    /// The requirements, sorted by key (none for the nothing selector).
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// The value a label must have to match, when one requirement on `key` pins it (`=`, `==`
    /// or `in` with one value); upstream's `RequiresExactMatch`.
    pub fn requires_exact_match(&self, key: &str) -> Option<&str> {
        let r = self.requirements.iter().find(|r| r.key == key)?;
        match (r.operator, r.values.as_slice()) {
            (Operator::Equals | Operator::DoubleEquals | Operator::In, [only]) => Some(only),
            _ => None,
        }
    }
}

impl fmt::Display for LabelSelector {
    /// Upstream's `String()`: the requirements' canonical forms joined by `,` (empty for
    /// everything and for nothing).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

// ---------------------------------------------------------------------------------------------
// metav1.LabelSelector
// ---------------------------------------------------------------------------------------------

/// A metav1.LabelSelector as it appears in objects (`spec.selector` of a Deployment). Nulls
/// decode as empty values, as Go decodes them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "RawApiLabelSelector")]
pub struct ApiLabelSelector {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<ApiLabelSelectorRequirement>,
}

/// One `matchExpressions` entry of a metav1.LabelSelector.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "RawApiLabelSelectorRequirement")]
pub struct ApiLabelSelectorRequirement {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist` (anything else is kept, and rejected when
    /// converted or validated).
    pub operator: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawApiLabelSelector {
    #[serde(default)]
    match_labels: Option<BTreeMap<String, Option<String>>>,
    #[serde(default)]
    match_expressions: Option<Vec<Option<RawApiLabelSelectorRequirement>>>,
}

#[derive(Deserialize)]
struct RawApiLabelSelectorRequirement {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    operator: Option<String>,
    #[serde(default)]
    values: Option<Vec<Option<String>>>,
}

impl From<RawApiLabelSelectorRequirement> for ApiLabelSelectorRequirement {
    fn from(raw: RawApiLabelSelectorRequirement) -> Self {
        ApiLabelSelectorRequirement {
            key: raw.key.unwrap_or_default(),
            operator: raw.operator.unwrap_or_default(),
            values: raw
                .values
                .unwrap_or_default()
                .into_iter()
                .map(Option::unwrap_or_default)
                .collect(),
        }
    }
}

impl From<RawApiLabelSelector> for ApiLabelSelector {
    fn from(raw: RawApiLabelSelector) -> Self {
        ApiLabelSelector {
            match_labels: raw
                .match_labels
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.unwrap_or_default()))
                .collect(),
            match_expressions: raw
                .match_expressions
                .unwrap_or_default()
                .into_iter()
                .map(|r| r.map(Into::into).unwrap_or_default())
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The label selector lexer and parser
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    Error,
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

fn keyword(s: &[u8]) -> Option<Token> {
    Some(match s {
        b")" => Token::ClosedPar,
        b"," => Token::Comma,
        b"!" => Token::DoesNotExist,
        b"==" => Token::DoubleEquals,
        b"=" => Token::Equals,
        b">" => Token::GreaterThan,
        b"in" => Token::In,
        b"<" => Token::LessThan,
        b"!=" => Token::NotEquals,
        b"notin" => Token::NotIn,
        b"(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(ch: u8) -> bool {
    matches!(ch, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special_symbol(ch: u8) -> bool {
    matches!(ch, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// Upstream's lexer works on bytes, and its `read` answers 0 at the end of the input, so a NUL
/// byte inside the input behaves as upstream's does: it ends the selector where a token would
/// start, and is skipped where it ends an identifier or an operator.
struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    fn read(&mut self) -> u8 {
        match self.s.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    fn scan_id_or_keyword(&mut self) -> (Token, String) {
        let mut buffer = Vec::new();
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if is_special_symbol(ch) || is_whitespace(ch) {
                self.unread();
                break;
            }
            buffer.push(ch);
        }
        let tok = keyword(&buffer).unwrap_or(Token::Identifier);
        // Identifiers end at ASCII bytes, so they are whole UTF-8 sequences.
        (tok, String::from_utf8_lossy(&buffer).into_owned())
    }

    fn scan_special_symbol(&mut self) -> (Token, String) {
        let mut buffer = Vec::new();
        let mut last: Option<Token> = None;
        let mut last_len = 0;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if !is_special_symbol(ch) {
                self.unread();
                break;
            }
            buffer.push(ch);
            if let Some(tok) = keyword(&buffer) {
                last = Some(tok);
                last_len = buffer.len();
            } else if last.is_some() {
                self.unread();
                break;
            }
        }
        match last {
            Some(tok) => (
                tok,
                String::from_utf8_lossy(&buffer[..last_len]).into_owned(),
            ),
            None => (
                Token::Error,
                format!(
                    "error expected: keyword found '{}'",
                    String::from_utf8_lossy(&buffer)
                ),
            ),
        }
    }

    fn lex(&mut self) -> (Token, String) {
        let mut ch = self.read();
        while is_whitespace(ch) {
            ch = self.read();
        }
        if ch == 0 {
            return (Token::EndOfString, String::new());
        }
        self.unread();
        if is_special_symbol(ch) {
            self.scan_special_symbol()
        } else {
            self.scan_id_or_keyword()
        }
    }
}

/// Whether `in` and `notin` are operators (after a key) or plain identifiers (everywhere else).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser<'p> {
    items: Vec<(Token, String)>,
    position: usize,
    path: Option<&'p Path>,
}

impl<'p> Parser<'p> {
    fn new(selector: &str, path: Option<&'p Path>) -> Self {
        let mut lexer = Lexer {
            s: selector.as_bytes(),
            pos: 0,
        };
        let mut items = Vec::new();
        loop {
            let item = lexer.lex();
            let end = item.0 == Token::EndOfString;
            items.push(item);
            if end {
                break;
            }
        }
        Parser {
            items,
            position: 0,
            path,
        }
    }

    fn item(&self, at: usize, ctx: Context) -> (Token, String) {
        let (tok, lit) = self
            .items
            .get(at)
            .cloned()
            .unwrap_or((Token::EndOfString, String::new()));
        match tok {
            Token::In | Token::NotIn if ctx == Context::Values => (Token::Identifier, lit),
            _ => (tok, lit),
        }
    }

    fn lookahead(&self, ctx: Context) -> (Token, String) {
        self.item(self.position, ctx)
    }

    fn consume(&mut self, ctx: Context) -> (Token, String) {
        self.position += 1;
        self.item(self.position - 1, ctx)
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Context::Values);
            match tok {
                Token::Identifier | Token::DoesNotExist => {
                    let r = self
                        .parse_requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(r);
                    let (t, l) = self.consume(Context::Values);
                    match t {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (t2, l2) = self.lookahead(Context::Values);
                            if t2 != Token::Identifier && t2 != Token::DoesNotExist {
                                return Err(format!(
                                    "found '{l2}', expected: identifier after ','"
                                ));
                            }
                        }
                        _ => return Err(format!("found '{l}', expected: ',' or 'end of string'")),
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    ))
                }
            }
        }
    }

    fn new_requirement(
        &self,
        key: String,
        op: Operator,
        values: Vec<String>,
    ) -> Result<Requirement, String> {
        new_requirement(key, op, values, self.path, false)
            .map_err(|errs| aggregate_message(&errs).unwrap_or_default())
    }

    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, op) = self.parse_key_and_infer_operator()?;
        if let Some(op @ (Operator::Exists | Operator::DoesNotExist)) = op {
            return self.new_requirement(key, op, Vec::new());
        }
        let op = self.parse_operator()?;
        let values = match op {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        self.new_requirement(key, op, values.into_iter().collect())
    }

    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let mut op = None;
        let (mut tok, mut lit) = self.consume(Context::Values);
        if tok == Token::DoesNotExist {
            op = Some(Operator::DoesNotExist);
            (tok, lit) = self.consume(Context::Values);
        }
        if tok != Token::Identifier {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        let field = self
            .path
            .map_or_else(|| "<nil>".to_owned(), |p| p.as_str().to_owned());
        if let Some(e) = validate_label_key(&lit, field) {
            return Err(e.to_string());
        }
        let (t, _) = self.lookahead(Context::Values);
        if (t == Token::EndOfString || t == Token::Comma) && op != Some(Operator::DoesNotExist) {
            op = Some(Operator::Exists);
        }
        Ok((lit, op))
    }

    fn parse_operator(&mut self) -> Result<Operator, String> {
        let (tok, lit) = self.consume(Context::KeyAndOperator);
        Ok(match tok {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => return Err(format!("found '{lit}', expected: {BINARY_OPERATORS}")),
        })
    }

    fn parse_values(&mut self) -> Result<BTreeSet<String>, String> {
        let (tok, lit) = self.consume(Context::Values);
        if tok != Token::OpenPar {
            // Upstream's wording has no colon after the found token here.
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (tok, lit) = self.lookahead(Context::Values);
        match tok {
            Token::Identifier | Token::Comma => {
                let set = self.parse_identifiers_list()?;
                let (tok, _) = self.consume(Context::Values);
                if tok != Token::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(set)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    fn parse_identifiers_list(&mut self) -> Result<BTreeSet<String>, String> {
        let mut set = BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(Context::Values);
            match tok {
                Token::Identifier => {
                    set.insert(lit);
                    let (tok2, lit2) = self.lookahead(Context::Values);
                    match tok2 {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(set),
                        _ => return Err(format!("found '{lit2}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if set.is_empty() {
                        set.insert(String::new());
                    }
                    let (tok2, _) = self.lookahead(Context::Values);
                    if tok2 == Token::ClosedPar || tok2 == Token::Comma {
                        set.insert(String::new());
                    }
                    if tok2 == Token::ClosedPar {
                        return Ok(set);
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        let (tok, _) = self.lookahead(Context::Values);
        if tok == Token::EndOfString || tok == Token::Comma {
            return Ok(BTreeSet::from([String::new()]));
        }
        let (tok, lit) = self.consume(Context::Values);
        if tok == Token::Identifier {
            return Ok(BTreeSet::from([lit]));
        }
        Err(format!("found '{lit}', expected: identifier"))
    }
}

// ---------------------------------------------------------------------------------------------
// Field selectors
// ---------------------------------------------------------------------------------------------

/// One term of a field selector: `field=value` (operator [`Operator::Equals`], also for `==`)
/// or `field!=value` ([`Operator::NotEquals`]). The value is unescaped.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldRequirement {
    pub field: String,
    pub operator: Operator,
    pub value: String,
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.operator == Operator::NotEquals {
            "!="
        } else {
            "="
        };
        write!(f, "{}{op}{}", self.field, escape_field_value(&self.value))
    }
}

/// A field selector: the AND of its terms. Field names are not checked here; the caller
/// checks them against the resource's supported field labels with
/// [`FieldSelector::requirements`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// The selector that matches everything (the empty string).
    pub fn everything() -> Self {
        FieldSelector::default()
    }

    /// A one-term `field=value` selector.
    pub fn one_term_equal(field: impl Into<String>, value: impl Into<String>) -> Self {
        FieldSelector {
            requirements: vec![FieldRequirement {
                field: field.into(),
                operator: Operator::Equals,
                value: value.into(),
            }],
        }
    }

    /// A selector requiring every `field=value` of the map.
    pub fn from_set(fields: &BTreeMap<String, String>) -> Self {
        FieldSelector {
            requirements: fields
                .iter()
                .map(|(f, v)| FieldRequirement {
                    field: f.clone(),
                    operator: Operator::Equals,
                    value: v.clone(),
                })
                .collect(),
        }
    }

    /// Parses a field selector (upstream's `fields.ParseSelector`): terms split on unescaped
    /// commas and sorted, empty terms skipped, each term split at its first `!=`, `==` or `=`,
    /// values unescaped. A term with an empty field and an empty value selects everything and
    /// is dropped.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let mut parts = split_terms(selector);
        parts.sort_unstable();
        let mut requirements = Vec::new();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((lhs, op, rhs)) = split_term(part) else {
                return Err(SelectorError::new(format!(
                    "invalid selector: '{selector}'; can't understand '{part}'"
                )));
            };
            let value = unescape_field_value(rhs)?;
            if lhs.is_empty() && value.is_empty() {
                continue;
            }
            requirements.push(FieldRequirement {
                field: lhs.to_owned(),
                operator: op,
                value,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// The terms, in the order of the sorted input terms.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// True when the selector does not restrict anything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object whose fields are looked up by `get` satisfies every term; a field
    /// `get` does not know reads as the empty string, as upstream's `fields.Set`.
    pub fn matches<F, S>(&self, get: F) -> bool
    where
        F: Fn(&str) -> Option<S>,
        S: AsRef<str>,
    {
        self.requirements.iter().all(|r| {
            let actual = get(&r.field);
            let actual = actual.as_ref().map_or("", AsRef::as_ref);
            if r.operator == Operator::NotEquals {
                actual != r.value
            } else {
                actual == r.value
            }
        })
    }

    /// The value `field` must have, when a `=` term pins it (upstream's
    /// `RequiresExactMatch`).
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.operator != Operator::NotEquals && r.field == field)
            .map(|r| r.value.as_str())
    }

    /// Rewrites every term's field and value (upstream's `Transform`, used to convert field
    /// labels between versions); terms turned into an empty field and value are dropped.
    pub fn transform<E, F>(self, mut f: F) -> Result<Self, E>
    where
        F: FnMut(&str, &str) -> Result<(String, String), E>,
    {
        let mut requirements = Vec::with_capacity(self.requirements.len());
        for r in self.requirements {
            let (field, value) = f(&r.field, &r.value)?;
            if field.is_empty() && value.is_empty() {
                continue;
            }
            requirements.push(FieldRequirement {
                field,
                operator: r.operator,
                value,
            });
        }
        Ok(FieldSelector { requirements })
    }
}

impl fmt::Display for FieldSelector {
    /// Upstream's `String()`: the terms joined by `,`, `==` written as `=`, values escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for FieldSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Escapes `\`, `,` and `=` in a field selector value with a backslash.
pub fn escape_field_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Undoes [`escape_field_value`]; any other escape, a trailing backslash, or an unescaped `,`
/// or `=` is an error worded as upstream (which prints the offending character as its code
/// point number: `unescaped character in value: 61` for `=`).
pub fn unescape_field_value(s: &str) -> Result<String, SelectorError> {
    if !s.contains(['\\', ',', '=']) {
        return Ok(s.to_owned());
    }
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            if matches!(c, '\\' | ',' | '=') {
                out.push(c);
            } else {
                return Err(SelectorError::new(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                )));
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            ',' | '=' => {
                return Err(SelectorError::new(format!(
                    "invalid field selector: unescaped character in value: {}",
                    c as u32
                )))
            }
            c => out.push(c),
        }
    }
    if in_slash {
        return Err(SelectorError::new(
            "invalid field selector: invalid escape sequence: \\",
        ));
    }
    Ok(out)
}

/// Splits on commas not preceded by a backslash (a backslash escapes whatever follows it).
fn split_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in selector.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&selector[start..i]);
            start = i + 1;
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// Splits a term at the first position where `!=`, `==` or `=` starts.
fn split_term(term: &str) -> Option<(&str, Operator, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for (op_str, op) in [
            ("!=", Operator::NotEquals),
            ("==", Operator::Equals),
            ("=", Operator::Equals),
        ] {
            if let Some(rhs) = rest.strip_prefix(op_str) {
                return Some((&term[..i], op, rhs));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    //! Inputs and outcomes from upstream's test tables (pkg/labels/selector_test.go,
    //! pkg/fields/selector_test.go) and answers of upstream v0.37.2 to further inputs.

    use super::*;

    fn set(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn parse(s: &str) -> LabelSelector {
        match LabelSelector::parse(s) {
            Ok(sel) => sel,
            Err(e) => panic!("{s:?} should parse: {e}"),
        }
    }

    fn parse_err(s: &str) -> String {
        match LabelSelector::parse(s) {
            Ok(sel) => panic!("{s:?} should not parse, got {sel}"),
            Err(e) => e.message,
        }
    }

    const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
    const NAME_PART_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

    #[test]
    fn good_selectors_restring_without_spaces() {
        for s in [
            "x=a,y=b,z=c",
            "",
            "x!=a,y=b",
            "x=",
            "x= ",
            "x=,z= ",
            "x= ,z= ",
            "!x",
            "x>1",
            "x>1,z<5",
        ] {
            assert_eq!(parse(s).to_string(), s.replace(' ', ""), "{s:?}");
        }
        for s in ["x=a||y=b", "x==a==b", "!x=a", "x<a"] {
            parse_err(s);
        }
    }

    #[test]
    fn parse_is_deterministic() {
        assert_eq!(parse("x=a,a=x").to_string(), "a=x,x=a");
        assert_eq!(parse("a=x,x=a"), parse("x=a,a=x"));
    }

    #[test]
    fn canonical_forms() {
        for (input, want) in [
            ("\rx", "x"),
            (
                "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
                "0.1.2.domain/99 notin (10.10.100.1,tick.tack.clock)",
            ),
            ("foo  in\t (abc)", "foo in (abc)"),
            ("x notin\n (abc)", "x notin (abc)"),
            ("x  notin\t\t\t(abc,def)", "x notin (abc,def)"),
            ("x in (abc,)", "x in (,abc)"),
            ("x in (abc,abc)", "x in (abc)"),
            ("x in ()", "x in ()"),
            ("x in (a,,)", "x in (,a)"),
            ("x in (a,,a,,a,,a,,)", "x in (,a)"),
            (
                "x notin (abc,,def),bar,z in (),w",
                "bar,w,x notin (,abc,def),z in ()",
            ),
            ("x,y in (a)", "x,y in (a)"),
            ("x notin ( )", "x notin ()"),
            ("x notin (, a)", "x notin (,a)"),
            ("a ", "a"),
            ("a in (x,y,notin, z,in)", "a in (in,notin,x,y,z)"),
            ("key in ( value1, value2 )", "key in (value1,value2)"),
            ("x in (),y", "x in (),y"),
            ("exists", "exists"),
            ("in", "in"),
            ("in in (in)", "in in (in)"),
            ("notin=in", "notin=in"),
            ("x==y", "x==y"),
            ("x!=", "x!="),
            ("x !=y", "x!=y"),
            ("x>9223372036854775807", "x>9223372036854775807"),
            ("x<007", "x<007"),
            ("!x,y", "!x,y"),
            ("a = b , c != d", "a=b,c!=d"),
            ("A_b.C=x", "A_b.C=x"),
            ("example.com/app=x", "example.com/app=x"),
            // A NUL byte ends the input where a token would start and is skipped after an
            // identifier or operator, as upstream's byte lexer does.
            ("x\0", "x"),
            ("x=\0y", "x=y"),
            ("x=y,\0z", "x=y,z"),
            ("\0", ""),
            ("x=y \0", "x=y"),
            ("  ", ""),
        ] {
            assert_eq!(parse(input).to_string(), want, "{input:?}");
        }
    }

    #[test]
    fn parse_errors_as_upstream() {
        let nil_key = |key: &str, msg: &str| {
            format!("unable to parse requirement: <nil>: Invalid value: \"{key}\": {msg}")
        };
        let long = "a".repeat(64);
        let cases: Vec<(String, String)> = vec![
            ("x==a==b".into(), "found '==', expected: ',' or 'end of string'".into()),
            ("!x=a".into(), "found '=', expected: ',' or 'end of string'".into()),
            (
                "x<a".into(),
                "unable to parse requirement: values[0]: Invalid value: \"a\": for 'Gt', 'Lt' operators, the value must be an integer".into(),
            ),
            (
                "x>".into(),
                "unable to parse requirement: values[0]: Invalid value: \"\": for 'Gt', 'Lt' operators, the value must be an integer".into(),
            ),
            (
                "x>99999999999999999999".into(),
                "unable to parse requirement: values[0]: Invalid value: \"99999999999999999999\": for 'Gt', 'Lt' operators, the value must be an integer".into(),
            ),
            (
                "x=a||y=b".into(),
                format!("unable to parse requirement: values[0][x]: Invalid value: \"a||y\": {LABEL_VALUE_MSG}"),
            ),
            (
                "x>-a".into(),
                format!("unable to parse requirement: [values[0]: Invalid value: \"-a\": for 'Gt', 'Lt' operators, the value must be an integer, values[0][x]: Invalid value: \"-a\": {LABEL_VALUE_MSG}]"),
            ),
            (
                format!("x={long}"),
                format!("unable to parse requirement: values[0][x]: Invalid value: \"{long}\": must be no more than 63 bytes"),
            ),
            ("x,,y".into(), "found ',', expected: identifier after ','".into()),
            (",x,y".into(), "found ',', expected: !, identifier, or 'end of string'".into()),
            (
                "x nott in (y)".into(),
                "unable to parse requirement: found 'nott', expected: in, notin, =, ==, !=, gt, lt".into(),
            ),
            ("a in (xyz),".into(), "found '', expected: identifier after ','".into()),
            ("a in (xyz)b notin ()".into(), "found 'b', expected: ',' or 'end of string'".into()),
            (
                "a in (xyz abc)".into(),
                "unable to parse requirement: found 'abc', expected: ',' or ')'".into(),
            ),
            (
                "a notin(".into(),
                "unable to parse requirement: found '', expected: ',', ')' or identifier".into(),
            ),
            (
                "a (".into(),
                "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt".into(),
            ),
            ("(".into(), "found '(', expected: !, identifier, or 'end of string'".into()),
            ("!".into(), "unable to parse requirement: found '', expected: identifier".into()),
            ("!!x".into(), "unable to parse requirement: found '!', expected: identifier".into()),
            ("x in a".into(), "unable to parse requirement: found 'a' expected: '('".into()),
            ("x in".into(), "unable to parse requirement: found '' expected: '('".into()),
            (
                "x in (a,(".into(),
                "unable to parse requirement: found '(', expected: ',', or identifier".into(),
            ),
            ("x=(a)".into(), "unable to parse requirement: found '(', expected: identifier".into()),
            ("x===y".into(), "unable to parse requirement: found '=', expected: identifier".into()),
            ("x>=1".into(), "unable to parse requirement: found '=', expected: identifier".into()),
            (
                "bad key=x".into(),
                "unable to parse requirement: found 'key', expected: in, notin, =, ==, !=, gt, lt".into(),
            ),
            (
                "x\0y".into(),
                "unable to parse requirement: found 'y', expected: in, notin, =, ==, !=, gt, lt".into(),
            ),
            ("-a=b".into(), nil_key("-a", NAME_PART_MSG)),
            ("/a".into(), nil_key("/a", "prefix part must be non-empty")),
            ("a/".into(), nil_key("a/", &format!("name part must be non-empty; {NAME_PART_MSG}"))),
            (format!("{long}=x"), nil_key(&long, "name part must be no more than 63 bytes")),
            (
                "a/b/c=x".into(),
                nil_key("a/b/c", "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(parse_err(&input), want, "{input:?}");
        }
    }

    #[test]
    fn parse_with_path_places_errors() {
        let p = Path::new("spec").child("selector");
        let e = LabelSelector::parse_with_path("-a", &p).unwrap_err();
        assert_eq!(
            e.message,
            format!("unable to parse requirement: spec.selector: Invalid value: \"-a\": {NAME_PART_MSG}")
        );
        let e = LabelSelector::parse_with_path("x>a", &p).unwrap_err();
        assert_eq!(
            e.message,
            "unable to parse requirement: spec.selector.values[0]: Invalid value: \"a\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
    }

    #[test]
    fn selector_matches() {
        let yes = |s: &str, l: &[(&str, &str)]| assert!(parse(s).matches(&set(l)), "{s} {l:?}");
        let no = |s: &str, l: &[(&str, &str)]| assert!(!parse(s).matches(&set(l)), "{s} {l:?}");
        yes("", &[("x", "y")]);
        yes("x=y", &[("x", "y")]);
        yes("x=y,z=w", &[("x", "y"), ("z", "w")]);
        yes("x!=y,z!=w", &[("x", "z"), ("z", "a")]);
        yes("notin=in", &[("notin", "in")]);
        yes("x", &[("x", "z")]);
        yes("!x", &[("y", "z")]);
        yes("x>1", &[("x", "2")]);
        yes("x<1", &[("x", "0")]);
        no("x=z", &[]);
        no("x=y", &[("x", "z")]);
        no("x=y,z=w", &[("x", "w"), ("z", "w")]);
        no("x!=y,z!=w", &[("x", "z"), ("z", "w")]);
        no("x", &[("y", "z")]);
        no("!x", &[("x", "z")]);
        no("x>1", &[("x", "0")]);
        no("x<1", &[("x", "2")]);
        let labels = [("foo", "bar"), ("baz", "blah")];
        yes("foo=bar", &labels);
        yes("baz=blah", &labels);
        yes("foo=bar,baz=blah", &labels);
        no("foo=blah", &labels);
        no("baz=bar", &labels);
        no("foo=bar,foobar=bar,baz=blah", &labels);
        // set-based requirements
        yes("x in (foo),y notin (alpha)", &[("x", "foo"), ("y", "baz")]);
        no("x in (foo),y in (alpha)", &[("x", "foo"), ("y", "baz")]);
        yes("x notin (),y", &[("y", "")]);
        yes("!x,y", &[("y", "")]);
        no("x notin (),!y", &[("y", "")]);
        no("x in ()", &[("y", "baz")]);
        yes("z>1", &[("z", "2")]);
        no("z>1", &[("z", "v2")]);
        yes("z<5", &[("z", "-3")]);
        yes("z>1", &[("z", "+2")]);
        no("z>1", &[]);
    }

    #[test]
    fn requirement_constructor() {
        let err = |k: &str, op: Operator, vals: &[&str]| {
            Requirement::new(k, op, vals.iter().map(|v| (*v).to_owned()).collect())
                .err()
                .map(|e| e.message)
        };
        assert_eq!(
            err("x1", Operator::In, &[]).as_deref(),
            Some(
                "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty"
            )
        );
        assert_eq!(err("x3", Operator::In, &["foo"]), None);
        assert_eq!(
            err("x5", Operator::Equals, &["bar", "foo"]).as_deref(),
            Some("values: Invalid value: [\"bar\",\"foo\"]: exact-match compatibility requires one single value")
        );
        assert_eq!(err("x6", Operator::Exists, &[]), None);
        assert_eq!(err("x7", Operator::DoesNotExist, &[]), None);
        assert_eq!(
            err("x8", Operator::Exists, &["foo"]).as_deref(),
            Some("values: Invalid value: [\"foo\"]: values set must be empty for exists and does not exist")
        );
        assert_eq!(err("x11", Operator::GreaterThan, &["1"]), None);
        assert_eq!(
            err("x13", Operator::GreaterThan, &[]).as_deref(),
            Some("values: Invalid value: []: for 'Gt', 'Lt' operators, exactly one value is required")
        );
        assert_eq!(
            err("x14", Operator::GreaterThan, &["bar"]).as_deref(),
            Some("values[0]: Invalid value: \"bar\": for 'Gt', 'Lt' operators, the value must be an integer")
        );
        assert!(err(&"a".repeat(254), Operator::Exists, &[])
            .is_some_and(|e| e.starts_with("key: Invalid value: \"aaaa")));
        assert_eq!(
            err("x17", Operator::Equals, &["a b"]),
            Some(format!(
                "values[0][x17]: Invalid value: \"a b\": {LABEL_VALUE_MSG}"
            ))
        );
        // several problems: bracketed, in order
        assert_eq!(
            err("-k", Operator::In, &[]),
            Some(format!(
                "[key: Invalid value: \"-k\": {NAME_PART_MSG}, values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty]"
            ))
        );
    }

    #[test]
    fn requirement_strings() {
        let r = |k: &str, op: Operator, vals: &[&str]| {
            Requirement::new_unchecked(k, op, vals.iter().map(|v| (*v).to_owned()).collect())
        };
        let sel = |reqs: Vec<Requirement>| {
            let mut s = LabelSelector::everything();
            for q in reqs {
                s.add(q);
            }
            s.to_string()
        };
        assert_eq!(
            sel(vec![
                r("x", Operator::In, &["abc", "def"]),
                r("y", Operator::NotIn, &["jkl"]),
                r("z", Operator::Exists, &[]),
            ]),
            "x in (abc,def),y notin (jkl),z"
        );
        assert_eq!(
            sel(vec![
                r("x", Operator::NotIn, &["abc", "def"]),
                r("y", Operator::NotEquals, &["jkl"]),
                r("z", Operator::DoesNotExist, &[]),
            ]),
            "x notin (abc,def),y!=jkl,!z"
        );
        assert_eq!(
            sel(vec![
                r("x", Operator::NotIn, &["abc"]),
                r("y", Operator::In, &["jkl", "mno"]),
                r("z", Operator::NotIn, &[""]),
            ]),
            "x notin (abc),y in (jkl,mno),z notin ()"
        );
        assert_eq!(
            sel(vec![
                r("x", Operator::Equals, &["abc"]),
                r("y", Operator::DoubleEquals, &["jkl"]),
                r("z", Operator::NotEquals, &["a"]),
                r("z", Operator::Exists, &[]),
            ]),
            "x=abc,y==jkl,z!=a,z"
        );
        assert_eq!(
            sel(vec![
                r("x", Operator::GreaterThan, &["2"]),
                r("y", Operator::LessThan, &["8"]),
                r("z", Operator::Exists, &[]),
            ]),
            "x>2,y<8,z"
        );
        // several values are printed sorted, without reordering the requirement itself
        let q = r("environment", Operator::In, &["prod", "dev", "dev"]);
        assert_eq!(q.to_string(), "environment in (dev,dev,prod)");
        assert_eq!(q.values(), ["prod", "dev", "dev"]);
        assert_eq!(
            r("environment", Operator::NotIn, &["dev"]).to_string(),
            "environment notin (dev)"
        );
    }

    #[test]
    fn requires_exact_match() {
        let r = |k: &str, op: Operator, vals: &[&str]| {
            Requirement::new_unchecked(k, op, vals.iter().map(|v| (*v).to_owned()).collect())
        };
        let sel = |reqs: Vec<Requirement>| {
            let mut s = LabelSelector::everything();
            for q in reqs {
                s.add(q);
            }
            s
        };
        assert_eq!(
            sel(vec![r("key", Operator::In, &["value"])]).requires_exact_match("key"),
            Some("value")
        );
        assert_eq!(
            sel(vec![r("key", Operator::In, &["value", "value2"])]).requires_exact_match("key"),
            None
        );
        let two = sel(vec![
            r("key", Operator::In, &["value", "value1"]),
            r("key2", Operator::In, &["value2"]),
        ]);
        assert_eq!(two.requires_exact_match("key2"), Some("value2"));
        for op in [Operator::Equals, Operator::DoubleEquals] {
            assert_eq!(
                sel(vec![r("key", op, &["value"])]).requires_exact_match("key"),
                Some("value")
            );
        }
        assert_eq!(
            sel(vec![r("key", Operator::NotEquals, &["value"])]).requires_exact_match("key"),
            None
        );
    }

    #[test]
    fn everything_nothing_and_sets() {
        let all = LabelSelector::everything();
        assert!(all.is_empty() && all.matches(&set(&[("x", "y")])) && !all.matches_nothing());
        assert!(parse("").is_empty());
        let none = LabelSelector::nothing();
        assert!(!none.is_empty() && none.matches_nothing() && !none.matches(&set(&[])));
        assert_eq!(none.to_string(), "");

        let labels = set(&[("foo", "bar"), ("baz", "blah")]);
        for s in [
            set(&[]),
            set(&[("foo", "bar")]),
            set(&[("baz", "blah")]),
            set(&[("foo", "bar"), ("baz", "blah")]),
        ] {
            assert!(LabelSelector::from_set(&s).matches(&labels));
        }
        assert!(!LabelSelector::from_set(&set(&[("foo", "=blah")])).matches(&labels));
        assert_eq!(
            LabelSelector::from_set(&set(&[("app", "foo"), ("a", "b")])).to_string(),
            "a=b,app=foo"
        );
        assert_eq!(
            LabelSelector::from_set_validated(&set(&[(
                "Key",
                "axahm2EJ8Phiephe2eixohbee9eGeiyees1thuozi1xoh0GiuH3diewi8iem7Nui"
            )]))
            .unwrap_err()
            .message,
            "values[0][Key]: Invalid value: \"axahm2EJ8Phiephe2eixohbee9eGeiyees1thuozi1xoh0GiuH3diewi8iem7Nui\": must be no more than 63 bytes"
        );
    }

    #[test]
    fn from_json_as_label_selector_as_selector() {
        use serde_json::json;
        let ok = |v: serde_json::Value| match LabelSelector::from_json(&v) {
            Ok(s) => s,
            Err(e) => panic!("{v}: {e}"),
        };
        let err = |v: serde_json::Value| LabelSelector::from_json(&v).unwrap_err().message;
        assert!(ok(json!(null)).matches_nothing());
        assert!(ok(json!({})).is_empty());
        assert!(ok(json!({"matchLabels": null, "matchExpressions": []})).is_empty());
        assert_eq!(
            ok(json!({"matchLabels": {"z": "1"}, "matchExpressions": [
                {"key": "a", "operator": "Exists"},
                {"key": "m", "operator": "NotIn", "values": ["q", "p"]}
            ]}))
            .to_string(),
            "a,m notin (p,q),z=1"
        );
        // values keep their order and duplicates (only the string form sorts them)
        let s = ok(json!({"matchExpressions": [
            {"key": "a", "operator": "In", "values": ["y", "x", "y"]}
        ]}));
        assert_eq!(s.requirements()[0].values(), ["y", "x", "y"]);
        assert_eq!(s.to_string(), "a in (x,y,y)");
        assert!(s.matches(&set(&[("a", "x")])));
        assert_eq!(
            ok(json!({"matchLabels": {"app": null}})).to_string(),
            "app="
        );
        assert_eq!(
            err(json!({"matchExpressions": [{"key": "a", "operator": "Foo"}]})),
            "\"Foo\" is not a valid label selector operator"
        );
        assert_eq!(
            err(json!({"matchExpressions": [{"key": "a"}]})),
            "\"\" is not a valid label selector operator"
        );
        assert_eq!(
            err(json!({"matchExpressions": [{"key": "a", "operator": "In"}]})),
            "values: Invalid value: null: for 'in', 'notin' operators, values set can't be empty"
        );
        assert_eq!(
            err(json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]})),
            "values: Invalid value: [\"x\"]: values set must be empty for exists and does not exist"
        );
        assert_eq!(
            err(json!({"matchLabels": {"bad key": "x"}})),
            format!("key: Invalid value: \"bad key\": {NAME_PART_MSG}")
        );
        assert!(err(json!({"matchLabels": "x"})).starts_with("invalid label selector: "));
    }

    #[test]
    fn field_selector_parse() {
        let ok = |s: &str| match FieldSelector::parse(s) {
            Ok(sel) => sel.to_string(),
            Err(e) => panic!("{s:?}: {e}"),
        };
        let err = |s: &str| FieldSelector::parse(s).unwrap_err().message;
        for s in ["x=a,y=b,z=c", "", "x!=a,y=b", r"x=a||y\=b", r"x=a\=\=b"] {
            assert_eq!(ok(s), s);
        }
        for (input, want) in [
            (
                "a=avalue,b==bvalue,c!=cvalue",
                "a=avalue,b=bvalue,c!=cvalue",
            ),
            ("a=a,", "a=a"),
            (",a=a", "a=a"),
            (r"k=\,,k2=v2", r"k2=v2,k=\,"),
            (r"k=\\,k2=v2", r"k2=v2,k=\\"),
            (r"k=\\\,,k2=v2", r"k2=v2,k=\\\,"),
            ("함=수,목=록", "목=록,함=수"),
            ("x=a,a=x", "a=x,x=a"),
            ("=", ""),
            ("==", ""),
            ("!=", ""),
            ("=x", "=x"),
            (",,", ""),
            ("a = b", "a = b"),
            ("a!b=c", "a!b=c"),
            ("a=!b", "a=!b"),
            ("a==", "a="),
            (r"f\,g=h", r"f\,g=h"),
            ("z=1,a=2,m!=3", "a=2,m!=3,z=1"),
        ] {
            assert_eq!(ok(input), want, "{input:?}");
        }
        for (input, want) in [
            (
                "x=a||y=b",
                "invalid field selector: unescaped character in value: 61",
            ),
            (
                "x==a==b",
                "invalid field selector: unescaped character in value: 61",
            ),
            ("x=a,b", "invalid selector: 'x=a,b'; can't understand 'b'"),
            (
                "x in (a)",
                "invalid selector: 'x in (a)'; can't understand 'x in (a)'",
            ),
            (
                "x in (a,b,c)",
                "invalid selector: 'x in (a,b,c)'; can't understand 'b'",
            ),
            ("x", "invalid selector: 'x'; can't understand 'x'"),
            ("a!b", "invalid selector: 'a!b'; can't understand 'a!b'"),
            (
                r"k=\a\b\",
                r"invalid field selector: invalid escape sequence: \a",
            ),
            (
                r"k=\",
                r"invalid field selector: invalid escape sequence: \",
            ),
            (
                r"a=\!",
                r"invalid field selector: invalid escape sequence: \!",
            ),
            (
                r"a=\😀",
                r"invalid field selector: invalid escape sequence: \😀",
            ),
        ] {
            assert_eq!(err(input), want, "{input:?}");
        }
        let sel = FieldSelector::parse("spec.nodeName=n1,status.phase!=Running,metadata.name==x")
            .unwrap_or_default();
        let reqs: Vec<(&str, Operator, &str)> = sel
            .requirements()
            .iter()
            .map(|r| (r.field.as_str(), r.operator, r.value.as_str()))
            .collect();
        assert_eq!(
            reqs,
            [
                ("metadata.name", Operator::Equals, "x"),
                ("spec.nodeName", Operator::Equals, "n1"),
                ("status.phase", Operator::NotEquals, "Running"),
            ]
        );
    }

    #[test]
    fn field_value_escaping() {
        for (raw, escaped) in [
            ("", ""),
            ("a", "a"),
            ("=", r"\="),
            (",", r"\,"),
            (r"\", r"\\"),
            (r"\=\,\", r"\\\=\\\,\\"),
        ] {
            assert_eq!(escape_field_value(raw), escaped);
            assert_eq!(unescape_field_value(escaped).as_deref(), Ok(raw));
        }
        for bad in [r"\", r"\\\", r"\a"] {
            assert!(unescape_field_value(bad)
                .unwrap_err()
                .message
                .starts_with("invalid field selector: invalid escape sequence: "));
        }
    }

    #[test]
    fn field_selector_matches() {
        let fields = set(&[("foo", "bar"), ("baz", "blah"), ("complex", r"=value\,\")]);
        let get = |f: &str| fields.get(f).cloned();
        let m = |s: &str| {
            FieldSelector::parse(s)
                .map(|sel| sel.matches(get))
                .unwrap_or(false)
        };
        assert!(m(""));
        assert!(m("foo=bar"));
        assert!(m("baz=blah"));
        assert!(m("foo=bar,baz=blah"));
        assert!(m(r"foo=bar,baz=blah,complex=\=value\\\,\\"));
        assert!(!m("foo=blah"));
        assert!(!m("baz=bar"));
        assert!(!m("foo=bar,foobar=bar,baz=blah"));
        // a missing field reads as ""
        assert!(m("missing="));
        assert!(m("missing!=x"));
        assert!(!m("missing!="));
        let xy = set(&[("x", "y")]);
        assert!(FieldSelector::one_term_equal("x", "y").matches(|f: &str| xy.get(f)));
        assert!(!FieldSelector::one_term_equal("x", "z").matches(|f: &str| xy.get(f)));
    }

    #[test]
    fn field_selector_exact_match_and_transform() {
        let sel = FieldSelector::parse("a=b,test=c,x!=y").unwrap_or_default();
        assert_eq!(sel.requires_exact_match("test"), Some("c"));
        assert_eq!(sel.requires_exact_match("x"), None);
        assert_eq!(sel.requires_exact_match("none"), None);
        assert!(FieldSelector::everything().is_empty());
        let t = sel
            .transform(|f, v| -> Result<_, String> {
                if f == "a" {
                    Ok((String::new(), String::new()))
                } else {
                    Ok((format!("spec.{f}"), v.to_uppercase()))
                }
            })
            .unwrap_or_default();
        assert_eq!(t.to_string(), "spec.test=C,spec.x!=Y");
        let e = FieldSelector::parse("a=b")
            .unwrap_or_default()
            .transform(|f, _| Err(format!("field label not supported: {f}")));
        assert_eq!(e, Err("field label not supported: a".to_owned()));
    }
}
