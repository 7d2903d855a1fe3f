//! Randomized robustness: 200 000 random and grammar-aware mutated inputs go through both
//! selector parsers and the validators. Nothing may panic; every label selector that parses
//! must parse again from its string form to an equal selector (and print the same); every
//! field selector that parses must parse again from its string form to the same terms.

use std::collections::BTreeMap;

use kumo_apimachinery::selector::{FieldSelector, LabelSelector};
use kumo_apimachinery::validation::{self as v, BadValue, FieldError, Path};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CASES: usize = 200_000;

const KEYS: &[&str] = &[
    "a",
    "x",
    "app",
    "in",
    "notin",
    "exists",
    "example.com/app",
    "A_b.C",
    "1",
];
const BAD_KEYS: &[&str] = &["a/b/c", "-a", "a-", "/a", "a/", "é", "Example.com/x"];
const VALUES: &[&str] = &["", "b", "1", "007", "in", "notin", "a.b", "x_y", "Z"];
const BAD_VALUES: &[&str] = &["-5", "+5", "é", "-a", "a-", "1.5"];
const OPS: &[&str] = &["=", "==", "!=", ">", "<"];
const BAD_OPS: &[&str] = &[" in ", " notin ", "", " ", "!", "(", ")", ",", "=>", "!=="];
/// Characters mutations draw from: the grammar's symbols, whitespace, NUL, escapes, and
/// multi-byte characters (so that byte-level code meets character boundaries).
const CHARS: &[char] = &[
    'a',
    'b',
    'x',
    'A',
    'Z',
    '0',
    '9',
    '-',
    '_',
    '.',
    '/',
    '=',
    '!',
    '(',
    ')',
    ',',
    '<',
    '>',
    ' ',
    '\t',
    '\n',
    '\r',
    '\0',
    '\\',
    '"',
    '*',
    '%',
    'é',
    'İ',
    '\u{212a}',
    '\u{a0}',
    '\u{200b}',
    '😀',
    '\u{7f}',
    '\u{378}',
    '\u{e0001}',
];

fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from[rng.random_range(0..from.len())]
}

fn random_string(rng: &mut StdRng, max_len: usize) -> String {
    let len = rng.random_range(0..=max_len);
    (0..len)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())])
        .collect()
}

/// Mostly from the good list, sometimes from the bad one.
fn pick2<'a>(rng: &mut StdRng, good: &[&'a str], bad: &[&'a str]) -> &'a str {
    if rng.random_bool(0.96) {
        pick(rng, good)
    } else {
        pick(rng, bad)
    }
}

fn label_requirement(rng: &mut StdRng) -> String {
    let key = if rng.random_bool(0.05) {
        "k".repeat(rng.random_range(62..=65))
    } else {
        pick2(rng, KEYS, BAD_KEYS).to_owned()
    };
    match rng.random_range(0..10) {
        0 => key,
        1 => format!("!{key}"),
        2 | 3 => {
            let op = if rng.random_bool(0.5) { "in" } else { "notin" };
            let n = rng.random_range(0..4);
            let vals: Vec<&str> = (0..n).map(|_| pick2(rng, VALUES, BAD_VALUES)).collect();
            format!("{key} {op} ({})", vals.join(","))
        }
        _ => {
            let op = pick2(rng, OPS, BAD_OPS);
            let value = pick2(rng, VALUES, BAD_VALUES);
            format!("{key}{op}{value}")
        }
    }
}

fn mutate(rng: &mut StdRng, s: &str) -> String {
    let mut chars: Vec<char> = s.chars().collect();
    for _ in 0..rng.random_range(1..=3) {
        let at = rng.random_range(0..=chars.len());
        match rng.random_range(0..3) {
            0 => chars.insert(at, CHARS[rng.random_range(0..CHARS.len())]),
            1 if !chars.is_empty() => {
                chars.remove(at.min(chars.len() - 1));
            }
            _ if !chars.is_empty() => {
                let i = at.min(chars.len() - 1);
                chars[i] = CHARS[rng.random_range(0..CHARS.len())];
            }
            _ => {}
        }
    }
    chars.into_iter().collect()
}

fn label_input(rng: &mut StdRng) -> String {
    if rng.random_bool(0.2) {
        return random_string(rng, 16);
    }
    let n = rng.random_range(1..=3);
    let reqs: Vec<String> = (0..n).map(|_| label_requirement(rng)).collect();
    let sep = if rng.random_bool(0.8) { "," } else { " , " };
    let s = reqs.join(sep);
    if rng.random_bool(0.25) {
        mutate(rng, &s)
    } else {
        s
    }
}

fn field_input(rng: &mut StdRng) -> String {
    if rng.random_bool(0.3) {
        return random_string(rng, 16);
    }
    let n = rng.random_range(1..=3);
    let terms: Vec<String> = (0..n)
        .map(|_| {
            let field = pick(
                rng,
                &["metadata.name", "a", "", "spec.nodeName", "a\\,b", "x y"],
            );
            let op = pick(rng, &["=", "==", "!=", "", "!"]);
            let value = random_string(rng, 4);
            format!("{field}{op}{value}")
        })
        .collect();
    let s = terms.join(",");
    if rng.random_bool(0.3) {
        mutate(rng, &s)
    } else {
        s
    }
}

fn validator_input(rng: &mut StdRng) -> String {
    match rng.random_range(0..4) {
        0 => random_string(rng, 8),
        1 => {
            let n = *[0usize, 1, 62, 63, 64, 252, 253, 254]
                .get(rng.random_range(0..8))
                .unwrap_or(&1);
            let mut s: String = (0..n)
                .map(|_| ['a', 'b', '0', '-', '.'][rng.random_range(0..5)])
                .collect();
            if rng.random_bool(0.5) {
                s.push('-');
            }
            s
        }
        2 => format!("{}/{}", random_string(rng, 6), random_string(rng, 6)),
        _ => {
            let key = pick2(rng, KEYS, BAD_KEYS);
            mutate(rng, key)
        }
    }
}

fn check_label(input: &str) {
    let Ok(sel) = LabelSelector::parse(input) else {
        return;
    };
    let shown = sel.to_string();
    let again = LabelSelector::parse(&shown)
        .unwrap_or_else(|e| panic!("{input:?} printed as {shown:?}, which fails: {e}"));
    assert_eq!(again, sel, "{input:?} printed as {shown:?}");
    assert_eq!(again.to_string(), shown, "{input:?}");
    let labels: BTreeMap<String, String> = sel
        .requirements()
        .iter()
        .map(|r| {
            let value = r.values().first().cloned().unwrap_or_default();
            (r.key().to_owned(), value)
        })
        .collect();
    let _ = sel.matches(&labels);
}

fn check_field(input: &str) {
    let Ok(sel) = FieldSelector::parse(input) else {
        return;
    };
    let shown = sel.to_string();
    let again = FieldSelector::parse(&shown)
        .unwrap_or_else(|e| panic!("{input:?} printed as {shown:?}, which fails: {e}"));
    let mut want = sel.requirements().to_vec();
    let mut got = again.requirements().to_vec();
    want.sort_by(|a, b| (&a.field, &a.value).cmp(&(&b.field, &b.value)));
    got.sort_by(|a, b| (&a.field, &a.value).cmp(&(&b.field, &b.value)));
    assert_eq!(got, want, "{input:?} printed as {shown:?}");
    let _ = sel.matches(|f: &str| Some(f.to_owned()));
}

fn check_validators(s: &str) {
    let path = Path::new("metadata");
    let mut n = 0;
    for f in [
        v::is_dns1123_label,
        v::is_dns1123_subdomain,
        v::is_dns1035_label,
        v::is_qualified_name,
        v::is_valid_label_value,
        v::is_c_identifier,
        v::is_config_map_key,
        v::is_env_var_name,
        v::is_valid_port_name,
        v::is_valid_percent,
        v::is_http_header_name,
        v::is_wildcard_dns1123_subdomain,
    ] {
        n += f(s).len();
    }
    for f in [
        v::name_is_dns_subdomain,
        v::name_is_dns_label,
        v::name_is_dns1035_label,
    ] {
        n += f(s, true).len() + f(s, false).len();
    }
    let m = BTreeMap::from([(s.to_owned(), s.to_owned())]);
    n += v::validate_labels(&m, &path.child("labels")).len();
    n += v::validate_annotations(&m, &path.child("annotations")).len();
    let errs = v::validate_object_meta_name(s, s, v::name_is_dns_subdomain, &path);
    let json = FieldError::invalid(&path, BadValue::Json(serde_json::json!([s])), s);
    let _ = v::invalid_message("Pod", s, &errs) + &json.to_string();
    std::hint::black_box(n);
}

#[test]
fn selectors_and_validators_never_panic_and_round_trip() {
    let mut rng = StdRng::seed_from_u64(0x6b75_6d6f);
    let (mut label_inputs, mut parsed) = (0, 0);
    for i in 0..CASES {
        match i % 4 {
            0 | 1 => {
                let input = label_input(&mut rng);
                label_inputs += 1;
                parsed += usize::from(LabelSelector::parse(&input).is_ok());
                check_label(&input);
                if i % 8 == 0 {
                    // the other parser and the validators on the same text
                    check_field(&input);
                    check_validators(&input);
                }
            }
            2 => {
                let input = field_input(&mut rng);
                check_field(&input);
                if i % 8 == 2 {
                    check_label(&input);
                }
            }
            _ => {
                let input = validator_input(&mut rng);
                check_validators(&input);
                check_label(&input);
            }
        }
    }
    // the generator must keep producing valid selectors, or the round trip checks little
    assert!(
        parsed * 4 > label_inputs,
        "only {parsed} of {label_inputs} label selectors parsed"
    );
}
