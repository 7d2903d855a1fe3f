//! Differential cases: inputs and the answers k8s.io/apimachinery v0.37.2 gives for them,
//! recorded by `tests/upstream/oracle` (see its main.go) over inputs from
//! `tests/upstream/gen.py`. Each line of `tests/data/upstream_cases.jsonl` is one case; set
//! `KUMO_APIMACHINERY_CASES` to another file of the same shape to check a bigger run.

use std::collections::BTreeMap;

use kumo_apimachinery::selector::{ApiLabelSelector, FieldSelector, LabelSelector, Operator};
use kumo_apimachinery::validation::{self as v, BadValue, FieldError, Path};
use serde_json::Value;

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn rendered(errs: &[FieldError]) -> Vec<String> {
    errs.iter().map(ToString::to_string).collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Expands the `#{N}` references of a packed case (see `tests/upstream/pack.py`) to the
/// messages of the dictionary line; the input itself is never packed.
fn unpack(v: &mut Value, msgs: &[String]) {
    match v {
        Value::String(s) if s.contains("#{") => {
            let mut out = String::with_capacity(s.len());
            let mut rest = s.as_str();
            while let Some(at) = rest.find("#{") {
                out.push_str(&rest[..at]);
                let tail = &rest[at + 2..];
                let msg = tail
                    .find('}')
                    .and_then(|end| Some((tail[..end].parse::<usize>().ok()?, end)))
                    .and_then(|(i, end)| Some((msgs.get(i)?, end)));
                match msg {
                    Some((m, end)) => {
                        out.push_str(m);
                        rest = &tail[end + 1..];
                    }
                    None => {
                        out.push_str("#{");
                        rest = tail;
                    }
                }
            }
            out.push_str(rest);
            *s = out;
        }
        Value::Array(items) => items.iter_mut().for_each(|i| unpack(i, msgs)),
        Value::Object(map) => {
            for (k, item) in map.iter_mut() {
                if k != "in" {
                    unpack(item, msgs);
                }
            }
        }
        _ => {}
    }
}

/// Checks one case; returns a description of the first difference.
fn check(case: &Value) -> Result<(), String> {
    let kind = case["t"].as_str().unwrap_or_default();
    let input = &case["in"];
    let s = input.as_str().unwrap_or_default();
    let diff = |what: &str, got: &dyn std::fmt::Debug, want: &dyn std::fmt::Debug| {
        Err(format!(
            "{kind} {input}: {what}\n   got: {got:?}\n  want: {want:?}"
        ))
    };
    match kind {
        "label" => match (LabelSelector::parse(s), case.get("ok")) {
            (Ok(sel), Some(ok)) => {
                if sel.to_string() != ok.as_str().unwrap_or_default() {
                    return diff("string form", &sel.to_string(), ok);
                }
                if sel.is_empty() != case["empty"].as_bool().unwrap_or_default() {
                    return diff("empty", &sel.is_empty(), &case["empty"]);
                }
            }
            (Err(e), None) => {
                if e.message != case["err"].as_str().unwrap_or_default() {
                    return diff("error", &e.message, &case["err"]);
                }
            }
            (got, _) => return diff("outcome", &got, case),
        },
        "field" => match (FieldSelector::parse(s), case.get("ok")) {
            (Ok(sel), Some(ok)) => {
                if sel.to_string() != ok.as_str().unwrap_or_default() {
                    return diff("string form", &sel.to_string(), ok);
                }
                let got: Vec<Vec<String>> = sel
                    .requirements()
                    .iter()
                    .map(|r| vec![r.field.clone(), r.operator.to_string(), r.value.clone()])
                    .collect();
                let want: Vec<Vec<String>> = case["reqs"]
                    .as_array()
                    .map(|a| a.iter().map(strings).collect())
                    .unwrap_or_default();
                if got != want {
                    return diff("requirements", &got, &want);
                }
            }
            (Err(e), None) => {
                if e.message != case["err"].as_str().unwrap_or_default() {
                    return diff("error", &e.message, &case["err"]);
                }
            }
            (got, _) => return diff("outcome", &got, case),
        },
        "v" => {
            let validators: [(&str, Vec<String>); 15] = [
                ("dns1123_label", v::is_dns1123_label(s)),
                ("dns1123_subdomain", v::is_dns1123_subdomain(s)),
                ("dns1035_label", v::is_dns1035_label(s)),
                ("qualified_name", v::is_qualified_name(s)),
                ("label_value", v::is_valid_label_value(s)),
                ("c_identifier", v::is_c_identifier(s)),
                ("config_map_key", v::is_config_map_key(s)),
                ("env_var_name", v::is_env_var_name(s)),
                ("port_name", v::is_valid_port_name(s)),
                ("percent", v::is_valid_percent(s)),
                ("http_header_name", v::is_http_header_name(s)),
                (
                    "wildcard_dns1123_subdomain",
                    v::is_wildcard_dns1123_subdomain(s),
                ),
                ("name_subdomain_prefix", v::name_is_dns_subdomain(s, true)),
                ("name_label_prefix", v::name_is_dns_label(s, true)),
                ("name_1035_prefix", v::name_is_dns1035_label(s, true)),
            ];
            for (name, got) in validators {
                let want = strings(&case[name]);
                if got != want {
                    return diff(name, &got, &want);
                }
            }
            let map = BTreeMap::from([(s.to_owned(), s.to_owned())]);
            let got = rendered(&v::validate_labels(
                &map,
                &Path::new("metadata").child("labels"),
            ));
            if got != strings(&case["labels"]) {
                return diff("labels", &got, &case["labels"]);
            }
            let map = BTreeMap::from([(s.to_owned(), "v".to_owned())]);
            let got = rendered(&v::validate_annotations(
                &map,
                &Path::new("metadata").child("annotations"),
            ));
            if got != strings(&case["annotations"]) {
                return diff("annotations", &got, &case["annotations"]);
            }
            let got = FieldError::invalid(&Path::new("metadata").child("name"), s, "d").to_string();
            if got != case["quote"].as_str().unwrap_or_default() {
                return diff("quote", &got, &case["quote"]);
            }
            let got = FieldError::invalid(
                &Path::new("x"),
                BadValue::Json(Value::from(vec![s.to_owned()])),
                "",
            )
            .to_string();
            if got != case["json_quote"].as_str().unwrap_or_default() {
                return diff("json_quote", &got, &case["json_quote"]);
            }
        }
        "json" => {
            if case.get("decode_err").is_some() {
                return Ok(());
            }
            let got = LabelSelector::from_json(input);
            let several_labels = input["matchLabels"]
                .as_object()
                .is_some_and(|m| m.len() > 1);
            match (&got, case.get("ok")) {
                (Ok(sel), Some(ok)) => {
                    if sel.to_string() != ok.as_str().unwrap_or_default() {
                        return diff("string form", &sel.to_string(), ok);
                    }
                    if sel.is_empty() != case["empty"].as_bool().unwrap_or_default() {
                        return diff("empty", &sel.is_empty(), &case["empty"]);
                    }
                }
                // Upstream visits matchLabels in Go's random map order: with several bad
                // labels the one it reports first varies.
                (Err(_), None) if several_labels => {}
                (Err(e), None) => {
                    if e.message != case["err"].as_str().unwrap_or_default() {
                        return diff("error", &e.message, &case["err"]);
                    }
                }
                (got, _) => return diff("outcome", got, case),
            }
            if !input.is_null() {
                let api: ApiLabelSelector =
                    serde_json::from_value(input.clone()).map_err(|e| e.to_string())?;
                let got = rendered(&v::validate_label_selector(
                    &api,
                    v::LabelSelectorValidationOptions::default(),
                    &Path::new("spec").child("selector"),
                ));
                // Again Go's map order: compare as multisets.
                if sorted(got.clone()) != sorted(strings(&case["validate"])) {
                    return diff("validate", &got, &case["validate"]);
                }
            }
        }
        other => return Err(format!("unknown case kind {other}")),
    }
    Ok(())
}

#[test]
fn upstream_cases() {
    let path = std::env::var("KUMO_APIMACHINERY_CASES").unwrap_or_else(|_| {
        format!(
            "{}/tests/data/upstream_cases.jsonl",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let text = std::fs::read_to_string(&path).expect("read the cases file");
    let mut failures = Vec::new();
    let mut count = 0;
    let mut msgs = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut case: Value = serde_json::from_str(line).expect("a JSON case");
        if case["t"] == "msgs" {
            msgs = strings(&case["msgs"]);
            continue;
        }
        unpack(&mut case, &msgs);
        count += 1;
        if let Err(e) = check(&case) {
            failures.push(e);
        }
    }
    assert!(count > 0, "no cases in {path}");
    for f in failures.iter().take(20) {
        eprintln!("{f}\n");
    }
    assert!(
        failures.is_empty(),
        "{} of {count} cases differ from upstream",
        failures.len()
    );
    // Keep the operator names in sync with upstream's `selection.Operator` strings.
    assert_eq!(Operator::GreaterThan.as_str(), "gt");
}
