//! The Kubernetes CEL library (k8s.io/apiserver/pkg/cel/library) on top of the standard
//! environment: list functions (`isSorted`, `sum`, `min`, `max`, `indexOf`,
//! `lastIndexOf`), regex (`find`, `findAll`), `url`, `quantity`.
//!
//! Each function converts its arguments to [`Value`]s, computes, and converts back.

use std::sync::Arc;

use cel::common::types::{DYN_TYPE, INT_TYPE, LIST_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::objects::Opaque;
use cel::{DeclarationError, Env, ExecutionError, Value};
use kumo_apimachinery::quantity::Quantity;

type R = Result<Value, ExecutionError>;

/// Declares `$name` as a `fn` overload over [`Value`]s computed by `$body`.
macro_rules! lib_fn {
    ($name:ident, |$args:ident| $body:expr) => {
        fn $name<'b, 'v>(raw: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
            let $args = values(&raw)?;
            let $args: &[Value] = &$args;
            let out: R = $body;
            back(out?)
        }
    };
}

fn values(raw: &[CowVal<'_, '_>]) -> Result<Vec<Value>, ExecutionError> {
    raw.iter().map(|a| Value::try_from(a.as_ref())).collect()
}

fn back<'b, 'v>(v: Value) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let b: Box<dyn Val> = v.try_into()?;
    Ok(CowVal::Owned(b))
}

fn err(function: &str, msg: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, msg)
}

/// Registers the library on `env`.
pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_member_overload("isSorted", "list_is_sorted", LIST_TYPE, vec![], is_sorted)?;
    env.add_member_overload("sum", "list_sum", LIST_TYPE, vec![], sum)?;
    env.add_member_overload("min", "list_min", LIST_TYPE, vec![], min)?;
    env.add_member_overload("max", "list_max", LIST_TYPE, vec![], max)?;
    env.add_member_overload(
        "indexOf",
        "list_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list_last_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        last_index_of,
    )?;
    env.add_member_overload("find", "string_find", STRING_TYPE, vec![STRING_TYPE], find)?;
    env.add_member_overload(
        "findAll",
        "string_find_all",
        STRING_TYPE,
        vec![STRING_TYPE],
        find_all,
    )?;
    env.add_member_overload(
        "findAll",
        "string_find_all_n",
        STRING_TYPE,
        vec![STRING_TYPE, INT_TYPE],
        find_all_n,
    )?;
    env.add_overload("url", "string_to_url", vec![STRING_TYPE], url)?;
    env.add_overload("isURL", "is_url_string", vec![STRING_TYPE], is_url)?;
    for (name, f) in [
        ("getScheme", url_scheme as cel::common::functions::Function),
        ("getHost", url_host),
        ("getHostname", url_hostname),
        ("getPort", url_port),
        ("getEscapedPath", url_path),
    ] {
        env.add_member_overload(name, &format!("url_{name}"), DYN_TYPE, vec![], f)?;
    }
    env.add_overload(
        "quantity",
        "string_to_quantity",
        vec![STRING_TYPE],
        quantity,
    )?;
    env.add_overload(
        "isQuantity",
        "is_quantity_string",
        vec![STRING_TYPE],
        is_quantity,
    )?;
    for (name, f) in [
        (
            "isInteger",
            q_is_integer as cel::common::functions::Function,
        ),
        ("asInteger", q_as_integer),
        ("asApproximateFloat", q_as_float),
        ("sign", q_sign),
    ] {
        env.add_member_overload(name, &format!("quantity_{name}"), DYN_TYPE, vec![], f)?;
    }
    for (name, f) in [
        ("add", q_add as cel::common::functions::Function),
        ("sub", q_sub),
        ("compareTo", q_compare),
        ("isGreaterThan", q_greater),
        ("isLessThan", q_less),
    ] {
        env.add_member_overload(
            name,
            &format!("quantity_{name}"),
            DYN_TYPE,
            vec![DYN_TYPE],
            f,
        )?;
    }
    Ok(())
}

fn list<'a>(v: &'a [Value], function: &str) -> Result<&'a [Value], ExecutionError> {
    match v.first() {
        Some(Value::List(l)) => Ok(l.as_slice()),
        _ => Err(err(function, "no such overload")),
    }
}

/// Orders two comparable values (numbers across int/uint/double, strings, bools, bytes,
/// durations, timestamps).
fn order(a: &Value, b: &Value, function: &str) -> Result<std::cmp::Ordering, ExecutionError> {
    use Value::*;
    let num = |v: &Value| match v {
        Int(i) => Some(*i as f64),
        UInt(u) => Some(*u as f64),
        Float(f) => Some(*f),
        _ => None,
    };
    match (a, b) {
        (Int(x), Int(y)) => Ok(x.cmp(y)),
        (UInt(x), UInt(y)) => Ok(x.cmp(y)),
        (String(x), String(y)) => Ok(x.cmp(y)),
        (Bool(x), Bool(y)) => Ok(x.cmp(y)),
        (Bytes(x), Bytes(y)) => Ok(x.cmp(y)),
        (Duration(x), Duration(y)) => Ok(x.cmp(y)),
        (Timestamp(x), Timestamp(y)) => Ok(x.cmp(y)),
        _ => match (num(a), num(b)) {
            (Some(x), Some(y)) => x
                .partial_cmp(&y)
                .ok_or_else(|| err(function, "NaN values cannot be ordered")),
            _ => Err(err(function, "no such overload")),
        },
    }
}

lib_fn!(is_sorted, |a| {
    let l = list(a, "isSorted")?;
    let mut sorted = true;
    for w in l.windows(2) {
        if order(&w[0], &w[1], "isSorted")? == std::cmp::Ordering::Greater {
            sorted = false;
        }
    }
    Ok(Value::Bool(sorted))
});

lib_fn!(sum, |a| {
    let l = list(a, "sum")?;
    let mut acc = match l.first() {
        None | Some(Value::Int(_)) => Value::Int(0),
        Some(Value::UInt(_)) => Value::UInt(0),
        Some(Value::Float(_)) => Value::Float(0.0),
        Some(Value::Duration(_)) => Value::Duration(Default::default()),
        Some(_) => return Err(err("sum", "no such overload")),
    };
    for x in l {
        acc = match (&acc, x) {
            (Value::Int(s), Value::Int(v)) => Value::Int(
                s.checked_add(*v)
                    .ok_or_else(|| err("sum", "integer overflow"))?,
            ),
            (Value::UInt(s), Value::UInt(v)) => Value::UInt(
                s.checked_add(*v)
                    .ok_or_else(|| err("sum", "unsigned integer overflow"))?,
            ),
            (Value::Float(s), Value::Float(v)) => Value::Float(s + v),
            (Value::Duration(s), Value::Duration(v)) => Value::Duration(*s + *v),
            _ => return Err(err("sum", "no such overload")),
        };
    }
    Ok(acc)
});

fn extreme(a: &[Value], function: &str, want: std::cmp::Ordering) -> R {
    let l = list(a, function)?;
    let Some(mut best) = l.first() else {
        return Err(err(
            function,
            format!("{function}(list) argument must not be empty"),
        ));
    };
    for x in &l[1..] {
        if order(x, best, function)? == want {
            best = x;
        }
    }
    Ok(best.clone())
}

lib_fn!(min, |a| extreme(a, "min", std::cmp::Ordering::Less));
lib_fn!(max, |a| extreme(a, "max", std::cmp::Ordering::Greater));

lib_fn!(index_of, |a| {
    let l = list(a, "indexOf")?;
    let x = a.get(1).unwrap_or(&Value::Null);
    Ok(Value::Int(
        l.iter().position(|v| v == x).map_or(-1, |i| i as i64),
    ))
});

lib_fn!(last_index_of, |a| {
    let l = list(a, "lastIndexOf")?;
    let x = a.get(1).unwrap_or(&Value::Null);
    Ok(Value::Int(
        l.iter().rposition(|v| v == x).map_or(-1, |i| i as i64),
    ))
});

fn string_arg<'a>(a: &'a [Value], i: usize, function: &str) -> Result<&'a str, ExecutionError> {
    match a.get(i) {
        Some(Value::String(s)) => Ok(s.as_str()),
        _ => Err(err(function, "no such overload")),
    }
}

fn regex(pattern: &str, function: &str) -> Result<regex::Regex, ExecutionError> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| err(function, e))
}

lib_fn!(find, |a| {
    let s = string_arg(a, 0, "find")?;
    let re = regex(string_arg(a, 1, "find")?, "find")?;
    Ok(Value::String(Arc::new(
        re.find(s).map_or("", |m| m.as_str()).to_owned(),
    )))
});

fn find_all_limit(a: &[Value], n: i64) -> R {
    let s = string_arg(a, 0, "findAll")?;
    let re = regex(string_arg(a, 1, "findAll")?, "findAll")?;
    let take = if n < 0 { usize::MAX } else { n as usize };
    Ok(Value::List(Arc::new(
        re.find_iter(s)
            .take(take)
            .map(|m| Value::String(Arc::new(m.as_str().to_owned())))
            .collect(),
    )))
}

lib_fn!(find_all, |a| find_all_limit(a, -1));
lib_fn!(find_all_n, |a| {
    let n = match a.get(2) {
        Some(Value::Int(n)) => *n,
        _ => -1,
    };
    find_all_limit(a, n)
});

/// A parsed URL (upstream's `URL` type): scheme, host (with port) and escaped path.
#[derive(Debug, PartialEq, Eq)]
struct Url {
    scheme: String,
    host: String,
    path: String,
}

impl Opaque for Url {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.URL"
    }
}

/// Parses an absolute URI or absolute path, as url.ParseRequestURI.
fn parse_url(s: &str) -> Option<Url> {
    if s.starts_with('/') {
        return Some(Url {
            scheme: String::new(),
            host: String::new(),
            path: s.split(['?', '#']).next().unwrap_or("").to_owned(),
        });
    }
    let (scheme, rest) = s.split_once(':')?;
    let valid_scheme = scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid_scheme || s.contains(' ') {
        return None;
    }
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (host, path) = match rest.strip_prefix("//") {
        Some(r) => match r.find('/') {
            Some(i) => (r[..i].to_owned(), r[i..].to_owned()),
            None => (r.to_owned(), String::new()),
        },
        None => (String::new(), rest.to_owned()),
    };
    Some(Url {
        scheme: scheme.to_owned(),
        host,
        path,
    })
}

lib_fn!(url, |a| {
    let s = string_arg(a, 0, "url")?;
    match parse_url(s) {
        Some(u) => Ok(Value::Opaque(Arc::new(u))),
        None => Err(err("url", format!("URL parse error during conversion from string: parse \"{s}\": invalid URI for request"))),
    }
});

lib_fn!(is_url, |a| Ok(Value::Bool(
    parse_url(string_arg(a, 0, "isURL")?).is_some()
)));

fn url_of<'a>(a: &'a [Value], function: &str) -> Result<&'a Url, ExecutionError> {
    match a.first() {
        Some(Value::Opaque(o)) => o
            .downcast_ref::<Url>()
            .ok_or_else(|| err(function, "no such overload")),
        _ => Err(err(function, "no such overload")),
    }
}

fn str_value(s: &str) -> Value {
    Value::String(Arc::new(s.to_owned()))
}

/// The host without its port (IPv6 brackets removed).
fn hostname(host: &str) -> &str {
    if let Some(r) = host.strip_prefix('[') {
        return r.split(']').next().unwrap_or("");
    }
    host.split(':').next().unwrap_or("")
}

lib_fn!(url_scheme, |a| Ok(str_value(
    &url_of(a, "getScheme")?.scheme
)));
lib_fn!(url_host, |a| Ok(str_value(&url_of(a, "getHost")?.host)));
lib_fn!(url_hostname, |a| Ok(str_value(hostname(
    &url_of(a, "getHostname")?.host
))));
lib_fn!(url_port, |a| {
    let h = &url_of(a, "getPort")?.host;
    let after = match h.rfind(']') {
        Some(i) => &h[i + 1..],
        None => h.as_str(),
    };
    Ok(str_value(after.rsplit_once(':').map_or("", |(_, p)| p)))
});
lib_fn!(url_path, |a| Ok(str_value(
    &url_of(a, "getEscapedPath")?.path
)));

/// A `resource.Quantity` as a CEL value.
#[derive(Debug, PartialEq, Eq)]
struct Q(Quantity);

impl Opaque for Q {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

lib_fn!(quantity, |a| {
    let s = string_arg(a, 0, "quantity")?;
    match Quantity::parse(s) {
        Some(q) => Ok(Value::Opaque(Arc::new(Q(q)))),
        None => Err(err("quantity", "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")),
    }
});

lib_fn!(is_quantity, |a| Ok(Value::Bool(
    Quantity::parse(string_arg(a, 0, "isQuantity")?).is_some()
)));

fn q_at<'a>(a: &'a [Value], i: usize, function: &str) -> Result<&'a Quantity, ExecutionError> {
    match a.get(i) {
        Some(Value::Opaque(o)) => o
            .downcast_ref::<Q>()
            .map(|q| &q.0)
            .ok_or_else(|| err(function, "no such overload")),
        _ => Err(err(function, "no such overload")),
    }
}

lib_fn!(q_is_integer, |a| {
    let q = q_at(a, 0, "isInteger")?;
    Ok(Value::Bool(
        q.milli_value() % 1000 == 0 && i64::try_from(q.value()).is_ok(),
    ))
});
lib_fn!(q_as_integer, |a| {
    let q = q_at(a, 0, "asInteger")?;
    if q.milli_value() % 1000 != 0 {
        return Err(err("asInteger", "cannot convert value to integer"));
    }
    i64::try_from(q.value())
        .map(Value::Int)
        .map_err(|_| err("asInteger", "cannot convert value to integer"))
});
lib_fn!(q_as_float, |a| Ok(Value::Float(
    q_at(a, 0, "asApproximateFloat")?.as_f64()
)));
lib_fn!(q_sign, |a| {
    let q = q_at(a, 0, "sign")?;
    Ok(Value::Int(if q.is_zero() {
        0
    } else if q.is_negative() {
        -1
    } else {
        1
    }))
});

/// The second operand of quantity arithmetic: a quantity or an int.
fn q_operand(a: &[Value], function: &str) -> Result<Quantity, ExecutionError> {
    match a.get(1) {
        Some(Value::Int(i)) => Ok(Quantity::int(*i)),
        _ => q_at(a, 1, function).cloned(),
    }
}

lib_fn!(q_add, |a| Ok(Value::Opaque(Arc::new(Q(q_at(
    a, 0, "add"
)?
.add(&q_operand(a, "add")?))))));
lib_fn!(q_sub, |a| Ok(Value::Opaque(Arc::new(Q(q_at(
    a, 0, "sub"
)?
.sub(&q_operand(a, "sub")?))))));
lib_fn!(q_compare, |a| Ok(Value::Int(
    match q_at(a, 0, "compareTo")?.cmp(q_at(a, 1, "compareTo")?) {
        std::cmp::Ordering::Less => -1,
        std::cmp::Ordering::Equal => 0,
        std::cmp::Ordering::Greater => 1,
    }
)));
lib_fn!(q_greater, |a| Ok(Value::Bool(
    q_at(a, 0, "isGreaterThan")? > q_at(a, 1, "isGreaterThan")?
)));
lib_fn!(q_less, |a| Ok(Value::Bool(
    q_at(a, 0, "isLessThan")? < q_at(a, 1, "isLessThan")?
)));
