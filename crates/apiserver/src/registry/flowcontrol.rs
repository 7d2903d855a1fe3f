//! flowcontrol.apiserver.k8s.io/v1 FlowSchemas and PriorityLevelConfigurations, with the
//! configuration kube-apiserver creates at start (`flowcontrol_bootstrap.yaml`). Stored and
//! validated; kumo does not yet apply API Priority and Fairness to requests.

use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Value};

use super::printing::{arr, col, keep_status, set};
use super::{age_of, default_field, name_of, str_at, Column, Resource, Strategy};

const GROUP: &str = "flowcontrol.apiserver.k8s.io";

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource {
            group: GROUP,
            version: "v1",
            kind: "FlowSchema",
            plural: "flowschemas",
            singular: "flowschema",
            namespaced: false,
            short_names: &[],
            categories: &[],
            subresources: &["status"],
            strategy: Box::new(FlowSchemas),
        },
        Resource {
            group: GROUP,
            version: "v1",
            kind: "PriorityLevelConfiguration",
            plural: "prioritylevelconfigurations",
            singular: "prioritylevelconfiguration",
            namespaced: false,
            short_names: &[],
            categories: &[],
            subresources: &["status"],
            strategy: Box::new(PriorityLevels),
        },
    ]
}

struct FlowSchemas;

fn default_flow_schema(obj: &mut Value) {
    if let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) {
        default_field(spec, "matchingPrecedence", json!(1000));
    }
}

impl Strategy for FlowSchemas {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_flow_schema(obj);
        set(obj, "status", json!({}));
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_flow_schema(new);
        keep_status(new, old);
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        let precedence = obj
            .pointer("/spec/matchingPrecedence")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let problem = match precedence {
            p if p <= 0 => Some("must be a positive value"),
            p if p > 10000 => Some("must not be greater than 10000"),
            _ => None,
        };
        if let Some(msg) = problem {
            errs.push(FieldError::invalid(
                &spec.child("matchingPrecedence"),
                precedence,
                msg,
            ));
        }
        if str_at(obj, "/spec/priorityLevelConfiguration/name").is_empty() {
            errs.push(FieldError::required(
                &spec.child("priorityLevelConfiguration").child("name"),
                "must reference a priority level",
            ));
        }
        let method = str_at(obj, "/spec/distinguisherMethod/type");
        if obj
            .pointer("/spec/distinguisherMethod")
            .is_some_and(|d| !d.is_null())
            && !matches!(method, "ByUser" | "ByNamespace")
        {
            errs.push(FieldError::not_supported(
                &spec.child("distinguisherMethod").child("type"),
                method,
                &["ByNamespace", "ByUser"],
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "PriorityLevel",
                "string",
                "The priority level the matching requests go to.",
            ),
            col(
                "MatchingPrecedence",
                "string",
                "Lower values are matched first.",
            ),
            col(
                "DistinguisherMethod",
                "string",
                "How flows of the matching requests are told apart.",
            ),
            Column::AGE,
            col(
                "MissingPL",
                "string",
                "references a broken or non-existent PriorityLevelConfiguration",
            ),
        ]
    }

    fn row_order(&self, a: &Value, b: &Value) -> std::cmp::Ordering {
        let precedence = |o: &Value| {
            o.pointer("/spec/matchingPrecedence")
                .and_then(Value::as_i64)
                .unwrap_or(0)
        };
        precedence(a)
            .cmp(&precedence(b))
            .then_with(|| name_of(a).cmp(name_of(b)))
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let method = match str_at(obj, "/spec/distinguisherMethod/type") {
            "" => "<none>",
            m => m,
        };
        let missing = arr(obj, "/status/conditions")
            .iter()
            .find(|c| str_at(c, "/type") == "Dangling")
            .map_or("?", |c| str_at(c, "/status"));
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/priorityLevelConfiguration/name")),
            json!(obj
                .pointer("/spec/matchingPrecedence")
                .and_then(Value::as_i64)
                .unwrap_or(0)),
            json!(method),
            json!(age_of(obj)),
            json!(missing),
        ]
    }
}

struct PriorityLevels;

/// The v1 defaults of a priority level's `limited` or `exempt` section.
fn default_priority_level(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    if let Some(l) = spec.get_mut("limited").filter(|l| l.is_object()) {
        default_field(l, "nominalConcurrencyShares", json!(30));
        default_field(l, "lendablePercent", json!(0));
        default_field(l, "limitResponse", json!({"type": "Reject"}));
        if let Some(q) = l
            .pointer_mut("/limitResponse/queuing")
            .filter(|q| q.is_object())
        {
            default_field(q, "queues", json!(64));
            default_field(q, "handSize", json!(8));
            default_field(q, "queueLengthLimit", json!(50));
        }
    }
    if let Some(e) = spec.get_mut("exempt").filter(|e| e.is_object()) {
        default_field(e, "nominalConcurrencyShares", json!(0));
        default_field(e, "lendablePercent", json!(0));
    }
}

impl Strategy for PriorityLevels {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_priority_level(obj);
        set(obj, "status", json!({}));
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_priority_level(new);
        keep_status(new, old);
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        let t = str_at(obj, "/spec/type");
        let has = |k: &str| {
            obj.pointer(&format!("/spec/{k}"))
                .is_some_and(|v| !v.is_null())
        };
        match t {
            "Limited" => {
                if !has("limited") {
                    errs.push(FieldError::required(
                        &spec.child("limited"),
                        "must not be empty when type is Limited",
                    ));
                }
                if has("exempt") {
                    errs.push(FieldError::forbidden(
                        &spec.child("exempt"),
                        "must be nil if the type is Limited",
                    ));
                }
            }
            "Exempt" => {
                if has("limited") {
                    errs.push(FieldError::forbidden(
                        &spec.child("limited"),
                        "must be nil if the type is not Limited",
                    ));
                }
            }
            other => errs.push(FieldError::not_supported(
                &spec.child("type"),
                other,
                &["Exempt", "Limited"],
            )),
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Type", "string", "Whether the level is limited or exempt."),
            col(
                "NominalConcurrencyShares",
                "string",
                "The level's share of the server's concurrency.",
            ),
            col("Queues", "string", "The number of queues of the level."),
            col(
                "HandSize",
                "string",
                "The queues each flow is shuffle-sharded to.",
            ),
            col(
                "QueueLengthLimit",
                "string",
                "The requests each queue may hold.",
            ),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let none = || json!("<none>");
        let limited = obj.pointer("/spec/limited").filter(|l| l.is_object());
        let num = |v: Option<&Value>| v.and_then(Value::as_i64).map_or_else(none, |n| json!(n));
        let (ncs, queues, hand, qll) = match limited {
            None => (none(), none(), none(), none()),
            Some(l) => {
                let q = l
                    .pointer("/limitResponse/queuing")
                    .filter(|q| q.is_object());
                (
                    json!(l
                        .get("nominalConcurrencyShares")
                        .and_then(Value::as_i64)
                        .unwrap_or(0)),
                    q.map_or_else(none, |q| num(q.get("queues"))),
                    q.map_or_else(none, |q| num(q.get("handSize"))),
                    q.map_or_else(none, |q| num(q.get("queueLengthLimit"))),
                )
            }
        };
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/type")),
            ncs,
            queues,
            hand,
            qll,
            json!(age_of(obj)),
        ]
    }
}

/// The annotation that lets the server keep a bootstrap object's spec up to date.
pub(super) const AUTOUPDATE_SPEC: &str = "apf.kubernetes.io/autoupdate-spec";

/// A FlowSchema with the `Dangling=False` condition the APF configuration controller
/// sets when the referenced priority level exists.
pub(super) fn found_status(schema: &Value) -> Value {
    let mut out = schema.clone();
    let level = str_at(schema, "/spec/priorityLevelConfiguration/name");
    out["status"] = json!({"conditions": [{
        "type": "Dangling",
        "status": "False",
        "reason": "Found",
        "message": format!("This FlowSchema references the PriorityLevelConfiguration object named \"{level}\" and it exists"),
        "lastTransitionTime": crate::time::now_rfc3339(),
    }]});
    out
}

/// The mandatory and suggested configuration: (plural, object), levels first.
pub(super) fn bootstrap_objects() -> Result<Vec<(&'static str, Value)>, serde_yaml::Error> {
    let doc: Value = serde_yaml::from_str(include_str!("flowcontrol_bootstrap.yaml"))?;
    let mut out = Vec::new();
    for (plural, kind) in [
        ("prioritylevelconfigurations", "PriorityLevelConfiguration"),
        ("flowschemas", "FlowSchema"),
    ] {
        for obj in arr(&doc, &format!("/{plural}")) {
            let mut obj = obj.clone();
            obj["apiVersion"] = json!(format!("{GROUP}/v1"));
            obj["kind"] = json!(kind);
            out.push((plural, obj));
        }
    }
    Ok(out)
}
