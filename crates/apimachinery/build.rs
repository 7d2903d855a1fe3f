//! Adds upstream's descriptions to the embedded OpenAPI schema facts.
//!
//! `src/openapi_schemas.txt` holds the built-in types' schemas without prose. The
//! descriptions are not this repository's to write: k8s-openapi generates its JSON schemas
//! (feature `schemars`) with every description of the Kubernetes API. This script asks
//! k8s-openapi for the schema of each definition's type (`build/k8s_types.rs`) and writes
//! the facts with the definition's and its properties' descriptions to
//! `$OUT_DIR/openapi_schemas.txt`, which the crate embeds.

use std::collections::HashMap;
use std::fmt::Write as _;

use k8s_openapi::schemars::{JsonSchema, SchemaGenerator};
use serde_json::Value;

/// The descriptions of one definition: its own and its properties'.
#[derive(Default)]
struct Described {
    description: Option<String>,
    properties: HashMap<String, String>,
}

fn describe<T: JsonSchema>(gen: &mut SchemaGenerator, out: &mut HashMap<String, Described>) {
    let schema = T::json_schema(gen).to_value();
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
    let d = Described {
        description: text(schema.get("description")),
        properties: schema
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, p)| Some((k.clone(), text(p.get("description"))?)))
            .collect(),
    };
    out.insert(T::schema_name().into_owned(), d);
}

fn main() {
    println!("cargo:rerun-if-changed=src/openapi_schemas.txt");
    println!("cargo:rerun-if-changed=build/k8s_types.rs");
    let mut gen = SchemaGenerator::default();
    let mut described = HashMap::new();
    macro_rules! k8s_types {
        ($($t:ty),* $(,)?) => {
            { $(describe::<$t>(&mut gen, &mut described);)* }
        };
    }
    include!("build/k8s_types.rs");

    let facts = std::fs::read_to_string("src/openapi_schemas.txt")
        .expect("src/openapi_schemas.txt is part of the crate");
    let mut out = String::with_capacity(facts.len() * 4);
    for line in facts.lines() {
        let mut parts = line.splitn(3, ' ');
        let (Some(name), Some(gvks), Some(json), false) = (
            parts.next(),
            parts.next(),
            parts.next(),
            line.starts_with('#'),
        ) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let Some(d) = described.get(name) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let mut schema: Value = serde_json::from_str(json).expect("the facts are JSON");
        if let (Some(text), Some(o)) = (&d.description, schema.as_object_mut()) {
            o.insert("description".into(), Value::String(text.clone()));
        }
        if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            for (k, p) in props.iter_mut() {
                if let (Some(text), Some(o)) = (d.properties.get(k), p.as_object_mut()) {
                    o.insert("description".into(), Value::String(text.clone()));
                }
            }
        }
        let _ = writeln!(out, "{name} {gvks} {schema}");
    }
    let dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(format!("{dir}/openapi_schemas.txt"), out).expect("OUT_DIR is writable");
}
