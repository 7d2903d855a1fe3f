//! node.k8s.io/v1 RuntimeClasses.

use kumo_apimachinery::validation::{is_dns1123_label, FieldError, Path};
use serde_json::{json, Value};

use super::printing::col;
use super::{age_of, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![Resource {
        group: "node.k8s.io",
        version: "v1",
        kind: "RuntimeClass",
        plural: "runtimeclasses",
        singular: "runtimeclass",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[],
        strategy: Box::new(RuntimeClasses),
    }]
}

struct RuntimeClasses;

impl Strategy for RuntimeClasses {
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let handler = str_at(obj, "/handler");
        let path = Path::new("handler");
        if handler.is_empty() {
            return vec![FieldError::required(&path, "")];
        }
        is_dns1123_label(handler)
            .into_iter()
            .map(|msg| FieldError::invalid(&path, handler, msg))
            .collect()
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        if new.get("handler") != old.get("handler") {
            errs.push(FieldError::invalid(
                &Path::new("handler"),
                str_at(new, "/handler"),
                "field is immutable",
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![Column::NAME, col("Handler", "string", ""), Column::AGE]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/handler")),
            json!(age_of(obj)),
        ]
    }
}
