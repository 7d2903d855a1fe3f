//! CEL validation rules of CustomResourceDefinitions (`x-kubernetes-validations`), as
//! apiextensions-apiserver checks them: each rule compiled when the definition is written
//! (rejected with `compilation failed: ...`), then evaluated against every custom resource
//! written, with `self` bound to the value at the rule's schema node and, for transition
//! rules, `oldSelf` to the correlated value of the object being updated.
//!
//! The interpreter is the `cel` crate; [`library`] adds the Kubernetes CEL library. There is
//! no static type checker: compile-time checks cover syntax, undeclared names and functions,
//! and fields of `self` the schema does not declare. Cost is bounded by a size estimate
//! taken before evaluation rather than upstream's cost model, so that no input can hang the
//! server.

mod library;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use cel::objects::{Key, Map, OptionalValue};
use cel::{Context, Env, ExecutionError, Program, Value as CelValue};
use kumo_apimachinery::validation::{BadValue, FieldError, Path};
use serde_json::Value;

/// Upper bound of the work one evaluation may do, upstream's per-call limit; the work is
/// taken as 3 × (number of values the rule can see) ^ (comprehension nesting).
const COST_LIMIT: u128 = 1_000_000;

/// Upstream's StaticEstimatedCostLimit: one rule's estimated cost, times the number of
/// values its node may have.
const RULE_COST_LIMIT: u128 = 10_000_000;

/// Upstream's StaticEstimatedCRDCostLimit: all rules of a schema together.
const CRD_COST_LIMIT: u128 = 100_000_000;

/// Rules whose compiled form is kept, keyed by source (cleared when full).
const CACHE_SIZE: usize = 4096;

/// The environment every rule is compiled and run in: the standard library, the strings
/// and lists extensions and the Kubernetes library.
fn env() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        let full = cel::extensions::strings(&mut env)
            .and_then(|()| library::register(&mut env))
            .is_ok();
        if full {
            Arc::new(env)
        } else {
            tracing::error!("CEL: registering the Kubernetes library failed");
            Arc::new(Env::stdlib())
        }
    })
}

/// One `x-kubernetes-validations` entry.
#[derive(Clone, Debug, Default)]
pub struct Rule {
    pub rule: String,
    pub message: String,
    pub message_expression: String,
    pub reason: Option<String>,
    pub field_path: String,
    pub optional_old_self: Option<bool>,
}

impl Rule {
    /// The rule from its JSON form.
    pub fn from_json(v: &Value) -> Rule {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        Rule {
            rule: s("rule"),
            message: s("message"),
            message_expression: s("messageExpression"),
            reason: v.get("reason").and_then(Value::as_str).map(str::to_owned),
            field_path: s("fieldPath"),
            optional_old_self: v.get("optionalOldSelf").and_then(Value::as_bool),
        }
    }

    /// The rule as Go's encoding/json prints the internal struct in a CRD validation error
    /// (fields in declaration order, `<`, `>` and `&` escaped).
    pub fn go_json(&self) -> String {
        let q = |s: &str| {
            serde_json::to_string(s)
                .unwrap_or_default()
                .replace('<', "\\u003c")
                .replace('>', "\\u003e")
                .replace('&', "\\u0026")
                .replace('\u{2028}', "\\u2028")
                .replace('\u{2029}', "\\u2029")
        };
        let reason = self.reason.as_deref().map_or("null".to_owned(), q);
        let optional = self
            .optional_old_self
            .map_or("null".to_owned(), |b| b.to_string());
        format!(
            "{{\"Rule\":{},\"Message\":{},\"MessageExpression\":{},\"Reason\":{reason},\"FieldPath\":{},\"OptionalOldSelf\":{optional}}}",
            q(&self.rule),
            q(&self.message),
            q(&self.message_expression),
            q(&self.field_path),
        )
    }

    /// `message`, or `failed rule: <rule>` (upstream's ruleMessageOrDefault).
    fn message_or_default(&self) -> String {
        if self.message.is_empty() {
            format!("failed rule: {}", self.rule.trim())
        } else {
            self.message.trim().to_owned()
        }
    }

    /// The rule's name in evaluation errors: its message, else its source.
    fn error_string(&self) -> &str {
        if self.message.is_empty() {
            self.rule.trim()
        } else {
            self.message.trim()
        }
    }
}

/// A compiled expression and what the checks learnt of it.
pub struct Compiled {
    program: Program,
    /// The type names of its struct literals (`Object{...}`, `JSONPatch{...}`).
    structs: Vec<String>,
    /// Whether it reads `oldSelf` (a transition rule).
    pub uses_old_self: bool,
    /// The deepest nesting of comprehensions (`all`, `map`, ...), for the cost bound.
    loops: u32,
    /// The estimated cost of one evaluation (see [`Checker::walk`]).
    cost: u128,
}

/// Compiles `src` for a schema node: `Err` carries upstream's `ERROR: <input>:L:C: ...`
/// text (without the `compilation failed: ` prefix).
pub fn compile(src: &str, schema: &Value) -> Result<Arc<Compiled>, String> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Compiled>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = format!("{src}\u{0}{}", schema_fingerprint(schema));
    if let Some(c) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok(c);
    }
    let program = env().compile(src).map_err(|errs| {
        errs.errors
            .iter()
            .map(|e| {
                let (line, col) = (e.pos.0.max(1), e.pos.1.max(1));
                error_text(src, line as usize, col as usize, &e.msg)
            })
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let mut check = Checker {
        program: &program,
        roots: if schema.is_null() {
            ADMISSION_ROOTS
        } else {
            &["self", "oldSelf"]
        },
        src,
        errors: Vec::new(),
        uses_old_self: false,
    };
    let (loops, cost) = check.walk(program.expression(), &mut Vec::new(), Some(schema), 0);
    check.errors.dedup();
    if !check.errors.is_empty() {
        return Err(check.errors.join("\n"));
    }
    let mut structs = std::collections::BTreeSet::new();
    struct_names(program.expression(), &mut structs, 0);
    let compiled = Arc::new(Compiled {
        uses_old_self: check.uses_old_self,
        structs: structs.into_iter().collect(),
        program,
        loops,
        cost,
    });
    if let Ok(mut c) = cache.lock() {
        if c.len() >= CACHE_SIZE {
            c.clear();
        }
        c.insert(key, compiled.clone());
    }
    Ok(compiled)
}

/// What the field checks depend on in a schema: its properties, recursively (a cheap key).
fn schema_fingerprint(schema: &Value) -> String {
    schema.to_string()
}

/// `ERROR: <input>:L:C: msg` with the source line and a caret, as cel-go prints issues.
fn error_text(src: &str, line: usize, col: usize, msg: &str) -> String {
    let text = src.lines().nth(line - 1).unwrap_or("");
    format!(
        "ERROR: <input>:{line}:{col}: {msg}\n | {text}\n | {}^",
        ".".repeat(col - 1)
    )
}

/// The variables of admission policy expressions (a `null` schema compiles for them).
const ADMISSION_ROOTS: &[&str] = &[
    "object",
    "oldObject",
    "request",
    "params",
    "namespaceObject",
    "variables",
    "authorizer",
];

/// Names that resolve without a declaration: types and function namespaces.
const BUILTIN_IDENTS: &[&str] = &[
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "dyn",
    "duration",
    "timestamp",
    "optional",
    "strings",
    "math",
    "lists",
    "sets",
    "google",
];

/// Functions the environment declares (macros are expanded before the check).
const FUNCTIONS: &[&str] = &[
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "type",
    "dyn",
    "duration",
    "timestamp",
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
    "charAt",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "trim",
    "replace",
    "split",
    "substring",
    "join",
    "format",
    "reverse",
    "strings.quote",
    "isSorted",
    "sum",
    "min",
    "max",
    "find",
    "findAll",
    "url",
    "isURL",
    "getScheme",
    "getHost",
    "getHostname",
    "getPort",
    "getEscapedPath",
    "getQuery",
    "quantity",
    "isQuantity",
    "isInteger",
    "asInteger",
    "asApproximateFloat",
    "sign",
    "add",
    "sub",
    "compareTo",
    "isGreaterThan",
    "isLessThan",
    "optional.of",
    "optional.none",
    "optional.ofNonZeroValue",
    "hasValue",
    "value",
    "orValue",
    "or",
];

/// Compile-time checks over the expanded expression.
struct Checker<'a> {
    program: &'a Program,
    /// The variables declared at the root.
    roots: &'static [&'static str],
    src: &'a str,
    errors: Vec<String>,
    uses_old_self: bool,
}

impl Checker<'_> {
    fn err_at(&mut self, id: u64, msg: String) {
        let (line, col) = match self.program.source_info().offset_for(id) {
            Some((start, _)) => {
                let start = start as usize;
                let before = self.src.get(..start).unwrap_or(self.src);
                let line = before.matches('\n').count() + 1;
                let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                (line, col)
            }
            None => (1, 1),
        };
        self.errors.push(error_text(self.src, line, col, &msg));
    }

    /// Walks `e` with the comprehension variables in scope; `self_schema` is the schema of
    /// `self`. Returns the deepest comprehension nesting and an estimate of the cost
    /// (one unit per call or field selection, each loop body times the most elements its
    /// range may hold, as the schema bounds it).
    fn walk(
        &mut self,
        e: &IdedExpr,
        scope: &mut Vec<String>,
        self_schema: Option<&Value>,
        depth: u32,
    ) -> (u32, u128) {
        if depth > 200 {
            return (0, 0);
        }
        let sum = |this: &mut Self, xs: &[&IdedExpr], scope: &mut Vec<String>| {
            xs.iter().fold((0u32, 0u128), |(l, c), x| {
                let (l2, c2) = this.walk(x, scope, self_schema, depth + 1);
                (l.max(l2), c.saturating_add(c2))
            })
        };
        match &e.expr {
            Expr::Ident(name) => {
                if name == "oldSelf" {
                    self.uses_old_self = true;
                } else if !self.roots.contains(&name.as_str())
                    && !scope.iter().any(|s| s == name)
                    && !BUILTIN_IDENTS.contains(&name.as_str())
                    && !name.starts_with('@')
                    && !name.starts_with("__")
                {
                    self.err_at(
                        e.id,
                        format!("undeclared reference to '{name}' (in container '')"),
                    );
                }
                (0, 0)
            }
            Expr::Select(sel) => {
                if let Some(schema) = self_schema {
                    if let Some(segments) = e.expr_segments() {
                        if matches!(
                            segments.first().map(String::as_str),
                            Some("self" | "oldSelf")
                        ) && !scope.iter().any(|s| s == &segments[0])
                        {
                            self.check_fields(e, schema);
                        }
                    }
                }
                let (l, c) = sum(self, &[&sel.operand], scope);
                (l, c.saturating_add(1))
            }
            Expr::Call(call) => {
                let name = call.func_name.as_str();
                let qualified = call
                    .target
                    .as_ref()
                    .and_then(|t| t.expr_segments())
                    .map(|s| format!("{}.{name}", s.join(".")));
                let known = name.starts_with('_')
                    || name.starts_with('@')
                    || name == "!_"
                    || FUNCTIONS.contains(&name)
                    || qualified.as_deref().is_some_and(|q| FUNCTIONS.contains(&q));
                if !known {
                    self.err_at(
                        e.id,
                        format!("undeclared reference to '{name}' (in container '')"),
                    );
                }
                let mut parts: Vec<&IdedExpr> = call.args.iter().collect();
                // A namespaced call's target is a namespace, not a value.
                if let Some(t) = call.target.as_ref().filter(|_| {
                    !qualified
                        .as_deref()
                        .is_some_and(|q| q.starts_with("optional.") || q.starts_with("strings."))
                }) {
                    parts.push(t);
                }
                let (l, c) = sum(self, &parts, scope);
                (l, c.saturating_add(1))
            }
            Expr::Comprehension(c) => {
                let card = match (self_schema, c.iter_range.expr_segments()) {
                    (Some(schema), Some(segs))
                        if segs.first().map(String::as_str) == Some("self")
                            && !scope.iter().any(|s| s == "self") =>
                    {
                        schema_at(schema, &segs[1..]).map_or(UNBOUNDED, cardinality)
                    }
                    (Some(schema), _) => max_cardinality(schema, 0),
                    (None, _) => UNBOUNDED,
                };
                let (l0, c0) = sum(self, &[&c.iter_range, &c.accu_init], scope);
                let pushed = 2 + usize::from(c.iter_var2.is_some());
                scope.push(c.iter_var.clone());
                scope.push(c.accu_var.clone());
                if let Some(v) = &c.iter_var2 {
                    scope.push(v.clone());
                }
                let (l1, body) = sum(self, &[&c.loop_cond, &c.loop_step], scope);
                let (l2, result) = sum(self, &[&c.result], scope);
                scope.truncate(scope.len() - pushed);
                (
                    l0.max(l1 + 1).max(l2),
                    c0.saturating_add(card.saturating_mul(body.max(1)))
                        .saturating_add(result),
                )
            }
            Expr::List(l) => {
                let parts: Vec<&IdedExpr> = l.elements.iter().collect();
                sum(self, &parts, scope)
            }
            Expr::Map(m) => {
                let parts: Vec<&IdedExpr> = m
                    .entries
                    .iter()
                    .flat_map(|x| match &x.expr {
                        EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                        EntryExpr::StructField(f) => vec![&f.value],
                    })
                    .collect();
                sum(self, &parts, scope)
            }
            Expr::Struct(st) => {
                let parts: Vec<&IdedExpr> = st
                    .entries
                    .iter()
                    .map(|x| match &x.expr {
                        EntryExpr::MapEntry(me) => &me.value,
                        EntryExpr::StructField(f) => &f.value,
                    })
                    .collect();
                sum(self, &parts, scope)
            }
            Expr::Literal(_) | Expr::Unspecified => (0, 0),
        }
    }

    /// `self.a.b`: each field must be declared by the schema it is selected from, as the
    /// type checker requires (`undefined field 'b'`).
    fn check_fields(&mut self, e: &IdedExpr, schema: &Value) {
        // Collect the select chain from the root outwards.
        let mut chain: Vec<(&str, u64)> = Vec::new();
        let mut cur = e;
        while let Expr::Select(sel) = &cur.expr {
            if sel.test {
                // has(self.x): checked the same way.
            }
            chain.push((sel.field.as_str(), cur.id));
            cur = &sel.operand;
        }
        chain.reverse();
        let mut s = schema;
        for (field, id) in chain {
            match declared(s, field) {
                Lookup::Field(next) => s = next,
                Lookup::Open => return,
                Lookup::Undefined => {
                    self.err_at(id, format!("undefined field '{field}'"));
                    return;
                }
            }
        }
    }
}

trait Segments {
    fn expr_segments(&self) -> Option<Vec<String>>;
}

impl Segments for IdedExpr {
    fn expr_segments(&self) -> Option<Vec<String>> {
        let mut out = Vec::new();
        let mut cur = self;
        loop {
            match &cur.expr {
                Expr::Ident(n) => {
                    out.push(n.clone());
                    out.reverse();
                    return Some(out);
                }
                Expr::Select(s) => {
                    out.push(s.field.clone());
                    cur = &s.operand;
                }
                _ => return None,
            }
        }
    }
}

/// The most elements of a list or map the schema leaves unbounded: a 3 MiB request of
/// 3-byte elements.
const UNBOUNDED: u128 = 3 * 1024 * 1024 / 3;

/// How many elements a value of schema `s` may hold (1 for a scalar).
fn cardinality(s: &Value) -> u128 {
    let bound = |k: &str| s.get(k).and_then(Value::as_u64).map(u128::from);
    match s.get("type").and_then(Value::as_str) {
        Some("array") => bound("maxItems").unwrap_or(UNBOUNDED),
        Some("object") if s.get("additionalProperties").is_some_and(Value::is_object) => {
            bound("maxProperties").unwrap_or(UNBOUNDED)
        }
        Some("object") => bound("maxProperties").unwrap_or_else(|| {
            s.get("properties")
                .and_then(Value::as_object)
                .map_or(UNBOUNDED, |p| p.len().max(1) as u128)
        }),
        Some("string") => bound("maxLength").unwrap_or(UNBOUNDED),
        _ => 1,
    }
}

/// The largest cardinality of a collection in `s` (a loop over a computed range).
fn max_cardinality(s: &Value, depth: usize) -> u128 {
    if depth > 8 {
        return 1;
    }
    let own = match s.get("type").and_then(Value::as_str) {
        Some("array") | Some("object") => cardinality(s),
        _ => 1,
    };
    let children = s
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|p| p.values())
        .chain(s.get("items"))
        .chain(s.get("additionalProperties").filter(|a| a.is_object()))
        .map(|c| max_cardinality(c, depth + 1))
        .max()
        .unwrap_or(1);
    own.max(children)
}

/// The schema of `self.<segs...>`, when declared.
fn schema_at<'a>(s: &'a Value, segs: &[String]) -> Option<&'a Value> {
    let mut cur = s;
    for f in segs {
        match declared(cur, f) {
            Lookup::Field(n) => cur = n,
            _ => return None,
        }
    }
    Some(cur)
}

enum Lookup<'a> {
    Field(&'a Value),
    /// Any field may be there (a map, preserved unknown fields, no schema).
    Open,
    Undefined,
}

/// The schema of `field` selected from a value of schema `s`.
fn declared<'a>(s: &'a Value, field: &str) -> Lookup<'a> {
    if s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        || s.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || s.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true))
    {
        return Lookup::Open;
    }
    if let Some(add) = s.get("additionalProperties") {
        return match add {
            Value::Object(_) => Lookup::Field(add),
            _ => Lookup::Open,
        };
    }
    match s.get("type").and_then(Value::as_str) {
        Some("object") => {}
        None => return Lookup::Open,
        Some(_) => return Lookup::Undefined,
    }
    match s.get("properties").and_then(|p| p.get(field)) {
        Some(p) => Lookup::Field(p),
        None if s.get("properties").is_none() && s.get("type").is_none() => Lookup::Open,
        None => Lookup::Undefined,
    }
}

/// Checks every rule of `schema` (a structural `openAPIV3Schema`) for the definition's
/// validation: compile errors at `<path>.x-kubernetes-validations[i].rule`, as upstream.
pub fn check_schema(schema: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let mut costs = Vec::new();
    check_node(schema, path, errs, 0, 1, &mut costs);
    let total = costs.iter().fold(0u128, |t, (_, c)| t.saturating_add(*c));
    if total > CRD_COST_LIMIT {
        costs.sort_by_key(|c| std::cmp::Reverse(c.1));
        for (p, _) in costs.iter().take(4) {
            errs.push(FieldError::forbidden(
                p,
                "contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema",
            ));
        }
        errs.push(FieldError::forbidden(
            path,
            cost_error(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                total,
                CRD_COST_LIMIT,
            ),
        ));
    }
}

/// Upstream's getCostErrorMessage.
fn cost_error(what: &str, cost: u128, limit: u128) -> String {
    let factor = cost as f64 / limit as f64;
    let shown = if factor > 100.0 {
        "more than 100x".to_owned()
    } else if factor < 1.5 {
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!("{what} exceeds budget by factor of {shown} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)")
}

/// [`check_schema`] for one node, which may appear `times` times in an object; the
/// estimated cost of each rule is added to `costs`.
fn check_node(
    schema: &Value,
    path: &Path,
    errs: &mut Vec<FieldError>,
    depth: usize,
    times: u128,
    costs: &mut Vec<(Path, u128)>,
) {
    if depth > 64 {
        return;
    }
    let Some(obj) = schema.as_object() else {
        return;
    };
    if let Some(rules) = obj
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        let rooted;
        let schema = if depth == 0 {
            rooted = with_type_and_object_meta(schema);
            &rooted
        } else {
            schema
        };
        let rpath = path.child("x-kubernetes-validations");
        for (i, r) in rules.iter().enumerate() {
            let rule = Rule::from_json(r);
            if rule.rule.trim().is_empty() {
                continue;
            }
            let compiled = compile(&rule.rule, schema);
            if let Ok(c) = &compiled {
                let cost = c.cost.saturating_mul(times);
                if cost > RULE_COST_LIMIT {
                    errs.push(FieldError::forbidden(
                        &rpath.index(i).child("rule"),
                        cost_error("estimated rule cost", cost, RULE_COST_LIMIT),
                    ));
                }
                costs.push((rpath.index(i).child("rule"), cost));
            }
            match compiled {
                // The value is Go's JSON of the rule struct, in its field order.
                Err(e) => errs.push(FieldError::invalid(
                    &rpath.index(i).child("rule"),
                    BadValue::Omitted,
                    format!("{}: compilation failed: {e}", rule.go_json()),
                )),
                Ok(c) => {
                    if rule.optional_old_self.is_some() && !c.uses_old_self {
                        errs.push(FieldError::invalid(
                            &rpath.index(i).child("optionalOldSelf"),
                            rule.optional_old_self.unwrap_or(false),
                            "may not be set if oldSelf is not used in rule",
                        ));
                    }
                }
            }
            if !rule.message_expression.trim().is_empty() {
                if let Err(e) = compile(&rule.message_expression, schema) {
                    errs.push(FieldError::invalid(
                        &rpath.index(i).child("messageExpression"),
                        BadValue::Omitted,
                        format!(
                            "{}: messageExpression compilation failed: {e}",
                            rule.go_json()
                        ),
                    ));
                }
            }
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, s) in props {
            let p = path.child("properties").key(k);
            check_node(s, &p, errs, depth + 1, times, costs);
        }
    }
    if let Some(s) = obj.get("additionalProperties").filter(|s| s.is_object()) {
        let n = times.saturating_mul(cardinality(schema));
        check_node(
            s,
            &path.child("additionalProperties"),
            errs,
            depth + 1,
            n,
            costs,
        );
    }
    if let Some(s) = obj.get("items").filter(|s| s.is_object()) {
        let n = times.saturating_mul(cardinality(schema));
        check_node(s, &path.child("items"), errs, depth + 1, n, costs);
    }
}

/// Whether `schema` has any rule at all (most do not: they skip the walk).
pub fn has_rules(schema: &Value) -> bool {
    schema.to_string().contains("\"x-kubernetes-validations\"")
}

/// Evaluates the rules of `schema` over `new` (the whole custom resource; `old` the stored
/// object on update), appending upstream's field errors.
pub fn validate(schema: &Value, new: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let root = Path::new("<nil>");
    let mut w = Walker { errs, stop: false };
    w.node(schema, new, old, &root, true, 0);
}

struct Walker<'a> {
    errs: &'a mut Vec<FieldError>,
    /// Set when a rule ran out of budget: no further rules are run.
    stop: bool,
}

/// The child path of the root (`<nil>`) or of a field.
fn child(path: &Path, name: &str) -> Path {
    if path.as_str() == "<nil>" {
        Path::new(name)
    } else {
        path.child(name)
    }
}

impl Walker<'_> {
    fn node(
        &mut self,
        schema: &Value,
        v: &Value,
        old: Option<&Value>,
        path: &Path,
        root: bool,
        depth: usize,
    ) {
        if self.stop || depth > 64 || v.is_null() {
            return;
        }
        if let Some(rules) = schema
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
        {
            self.rules(schema, rules, v, old, path, root);
        }
        match v {
            Value::Object(m) => {
                let props = schema.get("properties").and_then(Value::as_object);
                let add = schema.get("additionalProperties").filter(|a| a.is_object());
                for (k, x) in m {
                    if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                        continue;
                    }
                    // Declared fields are `a.b`, map values `a[key]`.
                    let (s, p) = match props.and_then(|p| p.get(k)) {
                        Some(s) => (Some(s), child(path, k)),
                        None => (add, path.key(k)),
                    };
                    if let Some(s) = s {
                        let o = old.and_then(|o| o.get(k));
                        self.node(s, x, o, &p, false, depth + 1);
                    }
                }
            }
            Value::Array(items) => {
                let Some(s) = schema.get("items") else {
                    return;
                };
                let keys: Vec<&str> =
                    if schema.get("x-kubernetes-list-type") == Some(&Value::String("map".into())) {
                        schema
                            .get("x-kubernetes-list-map-keys")
                            .and_then(Value::as_array)
                            .map(|k| k.iter().filter_map(Value::as_str).collect())
                            .unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                let olds = old.and_then(Value::as_array);
                for (i, x) in items.iter().enumerate() {
                    let o = if keys.is_empty() {
                        None
                    } else {
                        olds.and_then(|olds| {
                            olds.iter()
                                .find(|o| keys.iter().all(|k| o.get(*k) == x.get(*k)))
                        })
                    };
                    self.node(s, x, o, &path.index(i), false, depth + 1);
                }
            }
            _ => {}
        }
    }

    fn rules(
        &mut self,
        schema: &Value,
        rules: &[Value],
        v: &Value,
        old: Option<&Value>,
        path: &Path,
        root: bool,
    ) {
        let rooted;
        let schema = if root {
            rooted = with_type_and_object_meta(schema);
            &rooted
        } else {
            schema
        };
        let type_ = schema.get("type").and_then(Value::as_str).unwrap_or("");
        let this = to_cel(schema, &self_value(v, root), 0);
        let old_val = old.map(|o| to_cel(schema, &self_value(o, root), 0));
        // Ratcheting: an unchanged value keeps passing rules that do not read oldSelf.
        let unchanged = old.is_some_and(|o| o == v);
        let size = count(v).saturating_add(old.map_or(0, count)) as u128;
        for r in rules {
            let rule = Rule::from_json(r);
            if rule.rule.trim().is_empty() {
                continue;
            }
            let compiled = match compile(&rule.rule, schema) {
                Ok(c) => c,
                Err(e) => {
                    self.errs.push(FieldError::invalid(
                        path,
                        type_,
                        format!("rule compile error: compilation failed: {e}"),
                    ));
                    continue;
                }
            };
            let optional = rule.optional_old_self == Some(true);
            if compiled.uses_old_self && old.is_none() && !optional {
                continue;
            }
            if size.saturating_pow(compiled.loops).saturating_mul(3) > COST_LIMIT {
                self.errs.push(FieldError::invalid(
                    path,
                    type_,
                    format!(
                        "'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: {}",
                        rule.error_string()
                    ),
                ));
                self.stop = true;
                return;
            }
            let old_binding = if optional {
                Some(CelValue::Opaque(Arc::new(match &old_val {
                    Some(o) => OptionalValue::of(o.clone()),
                    None => OptionalValue::none(),
                })))
            } else {
                old_val.clone()
            };
            let result = run(&compiled, &this, old_binding.as_ref());
            match result {
                Ok(CelValue::Bool(true)) => continue,
                Ok(CelValue::Bool(false)) => {}
                Ok(other) => {
                    self.errs.push(FieldError::invalid(
                        path,
                        type_,
                        format!(
                            "rule did not evaluate to a boolean ({}) evaluating rule: {}",
                            type_of(&other),
                            rule.error_string()
                        ),
                    ));
                    continue;
                }
                Err(e) => {
                    let msg = exec_error(&e);
                    let detail = if msg.starts_with("no such overload") {
                        format!("'{msg}': call arguments did not match a supported operator, function or macro signature for rule: {}", rule.error_string())
                    } else {
                        format!("{msg} evaluating rule: {}", rule.error_string())
                    };
                    self.errs.push(FieldError::invalid(path, type_, detail));
                    continue;
                }
            }
            if unchanged && !compiled.uses_old_self {
                continue;
            }
            let mut at = path.clone();
            for seg in field_path_segments(&rule.field_path) {
                at = child(&at, &seg);
            }
            let detail = self
                .message_expression(&rule, schema, &this, old_val.as_ref(), size)
                .unwrap_or_else(|| rule.message_or_default());
            let value: BadValue = match v {
                Value::Object(_) | Value::Array(_) => BadValue::Omitted,
                Value::String(s) => BadValue::String(s.clone()),
                Value::Bool(b) => BadValue::Bool(*b),
                Value::Number(n) if n.is_i64() => BadValue::Int(n.as_i64().unwrap_or(0)),
                other => BadValue::Json(other.clone()),
            };
            self.errs.push(match rule.reason.as_deref() {
                Some("FieldValueForbidden") => FieldError::forbidden(&at, detail),
                Some("FieldValueRequired") => FieldError::required(&at, detail),
                Some("FieldValueDuplicate") => FieldError::duplicate(&at, value),
                _ => FieldError::invalid(&at, value, detail),
            });
        }
    }

    /// The evaluated `messageExpression`, or `None` to use the message.
    fn message_expression(
        &mut self,
        rule: &Rule,
        schema: &Value,
        this: &CelValue,
        old: Option<&CelValue>,
        size: u128,
    ) -> Option<String> {
        if rule.message_expression.trim().is_empty() {
            return None;
        }
        let c = compile(&rule.message_expression, schema).ok()?;
        if size.saturating_pow(c.loops).saturating_mul(3) > COST_LIMIT {
            return None;
        }
        match run(&c, this, old) {
            Ok(CelValue::String(s)) => {
                let t = s.trim();
                (!t.is_empty() && !t.contains('\n') && t.len() <= 5 * 1024).then(|| t.to_owned())
            }
            _ => None,
        }
    }
}

/// The path segments of a rule's `fieldPath` (`.a.b`, `.a['b.c']`, `.a[0]`).
fn field_path_segments(p: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = p.trim();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            out.push(r[..end].to_owned());
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']").unwrap_or(r.len());
            out.push(r[..end].to_owned());
            rest = r.get(end + 2..).unwrap_or("");
        } else {
            out.push(rest.to_owned());
            break;
        }
    }
    out
}

/// The root schema as rules see it: with `apiVersion`, `kind` and `metadata.name` and
/// `generateName` declared (upstream's WithTypeAndObjectMeta).
fn with_type_and_object_meta(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Some(o) = s.as_object_mut() {
        let props = o
            .entry("properties")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(p) = props.as_object_mut() {
            let string = serde_json::json!({"type": "string"});
            p.insert("apiVersion".into(), string.clone());
            p.insert("kind".into(), string.clone());
            p.insert(
                "metadata".into(),
                serde_json::json!({"type": "object", "properties": {
                    "name": string.clone(), "generateName": string}}),
            );
        }
    }
    s
}

/// `self` at the resource root: the body with `apiVersion`, `kind` and the `metadata`
/// fields rules may read (name and generateName).
fn self_value(v: &Value, root: bool) -> Value {
    if !root {
        return v.clone();
    }
    let mut out = v.clone();
    if let Some(o) = out.as_object_mut() {
        if let Some(m) = o.get("metadata").and_then(Value::as_object) {
            let mut meta = serde_json::Map::new();
            for k in ["name", "generateName"] {
                if let Some(x) = m.get(k) {
                    meta.insert(k.to_owned(), x.clone());
                }
            }
            o.insert("metadata".into(), Value::Object(meta));
        }
    }
    out
}

/// How many values `v` holds (itself included).
fn count(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(count).sum::<usize>(),
        Value::Object(m) => 1 + m.values().map(count).sum::<usize>(),
        Value::String(s) => 1 + s.len() / 64,
        _ => 1,
    }
}

/// The JSON value as CEL sees it under `schema` (`number` fields are doubles).
fn to_cel(schema: &Value, v: &Value, depth: usize) -> CelValue {
    if depth > 128 {
        return CelValue::Null;
    }
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => {
            if schema.get("type").and_then(Value::as_str) == Some("number") {
                CelValue::Float(n.as_f64().unwrap_or(0.0))
            } else if let Some(i) = n.as_i64() {
                CelValue::Int(i)
            } else if let Some(u) = n.as_u64() {
                CelValue::UInt(u)
            } else {
                CelValue::Float(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(a) => {
            let items = schema.get("items").unwrap_or(&Value::Null);
            CelValue::List(Arc::new(
                a.iter().map(|x| to_cel(items, x, depth + 1)).collect(),
            ))
        }
        Value::Object(m) => {
            let props = schema.get("properties");
            let add = schema.get("additionalProperties").filter(|a| a.is_object());
            let map: HashMap<Key, CelValue> = m
                .iter()
                .map(|(k, x)| {
                    let s = props.and_then(|p| p.get(k)).or(add).unwrap_or(&Value::Null);
                    (Key::String(Arc::new(k.clone())), to_cel(s, x, depth + 1))
                })
                .collect();
            CelValue::Map(Map { map: Arc::new(map) })
        }
    }
}

/// Runs `c` with `self` (and `oldSelf` when given).
fn run(c: &Compiled, this: &CelValue, old: Option<&CelValue>) -> Result<CelValue, ExecutionError> {
    let mut ctx = Context::with_env(env().clone());
    ctx.add_variable_from_value("self", this.clone());
    if let Some(o) = old {
        ctx.add_variable_from_value("oldSelf", o.clone());
    }
    c.program.execute(&ctx)
}

/// An evaluation error in cel-go's words where they are known.
fn exec_error(e: &ExecutionError) -> String {
    match e {
        ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        ExecutionError::DivisionByZero(_) => "division by zero".to_owned(),
        ExecutionError::NoSuchOverload(_) => "no such overload".to_owned(),
        other => {
            let s = other.to_string();
            let mut c = s.chars();
            match c.next() {
                Some(f) => f.to_lowercase().chain(c).collect(),
                None => s,
            }
        }
    }
}

/// The CEL type name of a value, for messages.
fn type_of(v: &CelValue) -> &'static str {
    match v {
        CelValue::List(_) => "list",
        CelValue::Map(_) => "map",
        CelValue::Int(_) => "int",
        CelValue::UInt(_) => "uint",
        CelValue::Float(_) => "double",
        CelValue::String(_) => "string",
        CelValue::Bytes(_) => "bytes",
        CelValue::Bool(_) => "bool",
        CelValue::Null => "null_type",
        _ => "dyn",
    }
}

/// The variables of an admission policy expression (`object`, `oldObject`, `request`,
/// `params`, `namespaceObject`, `variables`), for [`Activation::eval`].
#[derive(Default)]
pub struct Activation {
    vars: Vec<(String, CelValue)>,
    /// The policy's `variables`, in order.
    variables: Vec<(String, CelValue)>,
    /// How many values the inputs hold, for the cost bound.
    size: u128,
}

/// What an admission expression evaluated to.
pub enum Outcome {
    Bool(bool),
    String(String),
    /// Another type (its CEL type name).
    Other(&'static str),
}

impl Activation {
    /// Binds `name` to a JSON value (`null` for none).
    pub fn bind(&mut self, name: &str, v: Option<&Value>) {
        let v = v.unwrap_or(&Value::Null);
        self.size = self.size.saturating_add(count(v) as u128);
        self.vars
            .push((name.to_owned(), to_cel(&Value::Null, v, 0)));
    }

    fn run(&self, src: &str) -> Result<CelValue, String> {
        let c = compile(src, &Value::Null).map_err(|e| format!("compilation failed: {e}"))?;
        if self.size.max(1).saturating_pow(c.loops).saturating_mul(3) > COST_LIMIT {
            return Err("operation cancelled: actual cost limit exceeded".to_owned());
        }
        let mut ctx = Context::with_env(env_with(&c.structs));
        for (k, v) in &self.vars {
            ctx.add_variable_from_value(k.as_str(), v.clone());
        }
        let vars: HashMap<Key, CelValue> = self
            .variables
            .iter()
            .map(|(k, v)| (Key::String(Arc::new(k.clone())), v.clone()))
            .collect();
        ctx.add_variable_from_value(
            "variables",
            CelValue::Map(Map {
                map: Arc::new(vars),
            }),
        );
        c.program.execute(&ctx).map_err(|e| exec_error(&e))
    }

    /// Evaluates a policy variable and makes it visible to later expressions as
    /// `variables.<name>` (a failed one stays unset: reading it fails).
    pub fn define(&mut self, name: &str, src: &str) {
        if let Ok(v) = self.run(src) {
            self.variables.push((name.to_owned(), v));
        }
    }

    /// Evaluates `src` to JSON (a mutation: an `Object{...}` or a list of `JSONPatch{...}`).
    pub fn eval_json(&self, src: &str) -> Result<Value, String> {
        to_json(&self.run(src)?, 0)
    }

    /// Evaluates `src`; `Err` is the evaluation error in cel-go's words.
    pub fn eval(&self, src: &str) -> Result<Outcome, String> {
        Ok(match self.run(src)? {
            CelValue::Bool(b) => Outcome::Bool(b),
            CelValue::String(s) => Outcome::String(s.as_str().to_owned()),
            other => Outcome::Other(type_of(&other)),
        })
    }
}

/// Whether `name` is a type a mutation expression may construct: `Object` and the types of
/// its fields (`Object.spec`, `Object.spec.template`, ...), and `JSONPatch`.
fn constructible(name: &str) -> bool {
    name == "Object" || name.starts_with("Object.") || name == "JSONPatch"
}

/// The type names of the struct literals in `e`.
fn struct_names(e: &IdedExpr, out: &mut std::collections::BTreeSet<String>, depth: usize) {
    if depth > 256 {
        return;
    }
    if let Expr::Struct(st) = &e.expr {
        out.insert(st.type_name.clone());
    }
    let mut each = |x: &IdedExpr| struct_names(x, out, depth + 1);
    match &e.expr {
        Expr::Call(c) => {
            if let Some(t) = &c.target {
                each(t);
            }
            c.args.iter().for_each(each);
        }
        Expr::Comprehension(c) => {
            for x in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                each(x);
            }
        }
        Expr::List(l) => l.elements.iter().for_each(each),
        Expr::Map(m) => {
            for x in &m.entries {
                match &x.expr {
                    EntryExpr::MapEntry(me) => {
                        each(&me.key);
                        each(&me.value);
                    }
                    EntryExpr::StructField(f) => each(&f.value),
                }
            }
        }
        Expr::Select(sel) => each(&sel.operand),
        Expr::Struct(st) => {
            for x in &st.entries {
                match &x.expr {
                    EntryExpr::MapEntry(me) => each(&me.value),
                    EntryExpr::StructField(f) => each(&f.value),
                }
            }
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}

/// A struct type of mutation expressions: a literal makes the map of its fields, which
/// is what the object (or JSON patch operation) is in JSON.
struct ObjectType(cel::common::types::Type);

impl cel::StructType for ObjectType {
    fn get_type(&self) -> &cel::common::types::Type {
        &self.0
    }

    fn new_value<'b, 'v>(
        &self,
        fields: std::collections::BTreeMap<String, cel::common::value::CowVal<'b, 'v>>,
    ) -> Result<Box<dyn cel::common::value::Val + 'v>, ExecutionError> {
        let map: HashMap<cel::common::types::CelMapKey<'v>, Box<dyn cel::common::value::Val + 'v>> =
            fields
                .into_iter()
                .map(|(k, v)| (cel::common::types::CelMapKey::from(k), v.into_owned()))
                .collect();
        Ok(Box::new(cel::common::types::CelMap::from(map)))
    }
}

/// [`env`] with the struct types `names` (those [`constructible`]), kept per set of names.
fn env_with(names: &[String]) -> Arc<Env> {
    static ENVS: OnceLock<Mutex<HashMap<Vec<String>, Arc<Env>>>> = OnceLock::new();
    let names: Vec<String> = names.iter().filter(|n| constructible(n)).cloned().collect();
    if names.is_empty() {
        return env().clone();
    }
    let envs = ENVS.get_or_init(Default::default);
    if let Some(e) = envs.lock().ok().and_then(|m| m.get(&names).cloned()) {
        return e;
    }
    let mut e = Env::stdlib();
    let mut ok = cel::extensions::strings(&mut e)
        .and_then(|()| library::register(&mut e))
        .is_ok();
    for n in &names {
        ok &= e
            .add_type(ObjectType(cel::common::types::Type::new_struct(n.clone())))
            .is_ok();
    }
    if !ok {
        tracing::error!("CEL: building the mutation environment failed");
        return env().clone();
    }
    let e = Arc::new(e);
    if let Ok(mut m) = envs.lock() {
        if m.len() >= CACHE_SIZE {
            m.clear();
        }
        m.insert(names, e.clone());
    }
    e
}

/// A CEL value as JSON (durations and timestamps as their strings, bytes as base64).
fn to_json(v: &CelValue, depth: usize) -> Result<Value, String> {
    if depth > 128 {
        return Err("value nested too deeply".into());
    }
    Ok(match v {
        CelValue::Null => Value::Null,
        CelValue::Bool(b) => Value::Bool(*b),
        CelValue::Int(i) => Value::from(*i),
        CelValue::UInt(u) => Value::from(*u),
        CelValue::Float(f) => serde_json::Number::from_f64(*f)
            .map(Value::Number)
            .ok_or("a number JSON cannot hold")?,
        CelValue::String(s) => Value::String(s.as_str().to_owned()),
        CelValue::Bytes(b) => {
            use base64::Engine;
            Value::String(base64::engine::general_purpose::STANDARD.encode(b.as_slice()))
        }
        CelValue::List(l) => Value::Array(
            l.iter()
                .map(|x| to_json(x, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        CelValue::Map(m) => {
            let mut out = serde_json::Map::new();
            for (k, x) in m.map.iter() {
                let Key::String(k) = k else {
                    return Err("a map key that is not a string".into());
                };
                out.insert(k.as_str().to_owned(), to_json(x, depth + 1)?);
            }
            Value::Object(out)
        }
        CelValue::Duration(d) => {
            Value::String(format!("{}s", d.num_milliseconds() as f64 / 1000.0))
        }
        CelValue::Timestamp(t) => Value::String(t.to_rfc3339()),
        other => return Err(format!("a value of type {}", type_of(other))),
    })
}

/// Whether `src` compiles as an admission expression; `Err` is the compiler's message.
pub fn compile_expression(src: &str) -> Result<(), String> {
    compile(src, &Value::Null).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutation_expressions_construct_objects_and_patches() {
        let mut act = Activation::default();
        act.bind("object", Some(&json!({"spec": {"replicas": 1}})));
        assert_eq!(
            act.eval_json("Object{spec: Object.spec{replicas: object.spec.replicas + 1336}}"),
            Ok(json!({"spec": {"replicas": 1337}}))
        );
        assert_eq!(
            act.eval_json(r#"Object{metadata: Object.metadata{annotations: {"a": "b"}}}"#),
            Ok(json!({"metadata": {"annotations": {"a": "b"}}}))
        );
        assert_eq!(
            act.eval_json(r#"[JSONPatch{op: "add", path: "/spec/x", value: [1, "two"]}]"#),
            Ok(json!([{"op": "add", "path": "/spec/x", "value": [1, "two"]}]))
        );
        // Only those types: any other struct literal is unknown.
        assert!(act.eval_json("acme.Account{id: 1}").is_err());
    }
    use serde_json::json;

    fn eval(rule: &str, this: Value) -> Result<CelValue, String> {
        let c = compile(rule, &json!({})).map_err(|e| e.to_string())?;
        run(&c, &to_cel(&json!({}), &this, 0), None).map_err(|e| exec_error(&e))
    }

    #[test]
    fn core_and_library() {
        let t = |r: &str, v: Value| {
            assert_eq!(eval(r, v), Ok(CelValue::Bool(true)), "{r}");
        };
        t("self.a.all(x, x > 0)", json!({"a": [1, 2]}));
        t("has(self.a) && !has(self.b)", json!({"a": 1}));
        t(
            "self.a.isSorted() && self.a.sum() == 6",
            json!({"a": [1, 2, 3]}),
        );
        t(
            "self.a.min() == 1 && self.a.max() == 3",
            json!({"a": [3, 1, 2]}),
        );
        t(
            "self.a.indexOf(2) == 1 && self.a.lastIndexOf(2) == 2",
            json!({"a": [1, 2, 2]}),
        );
        t("'abc123'.find('[0-9]+') == '123'", json!({}));
        t("'a1b22'.findAll('[0-9]+') == ['1', '22']", json!({}));
        t("'abc'.indexOf('c') == 2", json!({}));
        t("self.s.lowerAscii() == 'ab'", json!({"s": "AB"}));
        t("quantity('1Gi').isGreaterThan(quantity('1G'))", json!({}));
        t("isQuantity('1Gi') && !isQuantity('x')", json!({}));
        t(
            "url('https://k8s.io:443/p?q=1').getHost() == 'k8s.io:443'",
            json!({}),
        );
        t(
            "self.a.exists_one(x, x == 1) && self.a.map(x, x * 2) == [2, 4]",
            json!({"a": [1, 2]}),
        );
    }

    #[test]
    fn compile_errors_read_as_upstream() {
        let schema = json!({"type": "object", "properties": {"replicas": {"type": "integer"}}});
        let e = compile("foo == 1", &schema).err().unwrap_or_default();
        assert_eq!(
            e,
            "ERROR: <input>:1:1: undeclared reference to 'foo' (in container '')\n | foo == 1\n | ^"
        );
        let e = compile("self.nosuch > 1", &schema)
            .err()
            .unwrap_or_default();
        assert_eq!(
            e,
            "ERROR: <input>:1:5: undefined field 'nosuch'\n | self.nosuch > 1\n | ....^"
        );
        assert!(compile("self.replicas >", &schema)
            .err()
            .unwrap_or_default()
            .starts_with("ERROR: <input>:1:16: Syntax error: mismatched input '<EOF>'"));
        assert!(compile("self.replicas > 1", &schema).is_ok());
    }
}
