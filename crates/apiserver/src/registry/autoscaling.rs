//! autoscaling/v2 HorizontalPodAutoscalers, also served as autoscaling/v1.
//!
//! Both versions share the stored objects, which are autoscaling/v2. autoscaling/v1 shows
//! the CPU utilization target as `targetCPUUtilizationPercentage` and keeps what it has no
//! field for in upstream's round-trip annotations (other metrics, behavior, conditions).

use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Value};

use super::apps::{col, int_at, keep_status, object_at};
use super::{age_of, default_field, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    let hpa = |version, strategy| Resource {
        group: "autoscaling",
        version,
        kind: "HorizontalPodAutoscaler",
        plural: "horizontalpodautoscalers",
        singular: "horizontalpodautoscaler",
        namespaced: true,
        short_names: &["hpa"],
        categories: &["all"],
        subresources: &["status"],
        strategy,
    };
    vec![
        hpa("v2", Box::new(HorizontalPodAutoscalers)),
        hpa("v1", Box::new(HorizontalPodAutoscalersV1)),
    ]
}

struct HorizontalPodAutoscalers;

/// The CPU utilization an HPA without metrics aims at.
const DEFAULT_CPU_UTILIZATION: i64 = 80;

/// Scaling rules of `behavior` when given: upstream's defaults for what is left out.
fn default_behavior(spec: &mut Value) {
    let Some(b) = spec.get_mut("behavior").filter(|b| b.is_object()) else {
        return;
    };
    let up = json!({
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 15},
            {"type": "Percent", "value": 100, "periodSeconds": 15},
        ],
    });
    let down = json!({
        "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
    });
    for (k, defaults) in [("scaleUp", up), ("scaleDown", down)] {
        let rules = object_at(b, &format!("/{k}"));
        if let Some(d) = defaults.as_object() {
            for (field, v) in d {
                default_field(rules, field, v.clone());
            }
        }
    }
}

fn default_hpa(obj: &mut Value) {
    let spec = object_at(obj, "/spec");
    default_field(spec, "minReplicas", json!(1));
    if spec
        .get("metrics")
        .and_then(Value::as_array)
        .is_none_or(|m| m.is_empty())
    {
        spec["metrics"] = json!([{
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION},
            },
        }]);
    }
    default_behavior(spec);
}

/// upstream's validateMetricTarget.
fn validate_target(errs: &mut Vec<FieldError>, t: &Value, path: &Path) {
    let ty = str_at(t, "/type");
    if ty.is_empty() {
        errs.push(FieldError::required(
            &path.child("type"),
            "must specify a metric target type",
        ));
    }
    if !matches!(ty, "Utilization" | "Value" | "AverageValue") {
        errs.push(FieldError::invalid(
            &path.child("type"),
            ty.to_owned(),
            "must be either Utilization, Value, or AverageValue",
        ));
    }
    if let Some(u) = int_at(t, "/averageUtilization").filter(|u| *u < 1) {
        errs.push(FieldError::invalid(
            &path.child("averageUtilization"),
            json!(u),
            "must be greater than 0",
        ));
    }
}

fn validate_hpa(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = Path::new("spec");
    // Errors of upstream's declarative validation come after the others.
    let mut declarative = Vec::new();
    // HPAScaleToZero is on in v1.37: minReplicas may be 0.
    let min = int_at(obj, "/spec/minReplicas");
    if let Some(m) = min.filter(|m| *m < 0) {
        errs.push(FieldError::invalid(
            &spec.child("minReplicas"),
            json!(m),
            "must be greater than or equal to 0",
        ));
    }
    let max = int_at(obj, "/spec/maxReplicas").unwrap_or(0);
    if max == 0 {
        declarative.push(FieldError::required(&spec.child("maxReplicas"), ""));
    } else if max < 0 {
        errs.push(FieldError::invalid(
            &spec.child("maxReplicas"),
            json!(max),
            "must be greater than or equal to 1",
        ));
    }
    if min.is_some_and(|m| max < m) {
        errs.push(FieldError::invalid(
            &spec.child("maxReplicas"),
            json!(max),
            "must be greater than or equal to `minReplicas`",
        ));
    }
    let rpath = spec.child("scaleTargetRef");
    for field in ["kind", "name"] {
        let v = str_at(obj, &format!("/spec/scaleTargetRef/{field}"));
        if v.is_empty() {
            declarative.push(FieldError::required(&rpath.child(field), ""));
        } else if v == "." || v == ".." {
            errs.push(FieldError::invalid(
                &rpath.child(field),
                v.to_owned(),
                format!("may not be '{v}'"),
            ));
        } else if let Some(bad) = ["/", "%"].iter().find(|s| v.contains(**s)) {
            errs.push(FieldError::invalid(
                &rpath.child(field),
                v.to_owned(),
                format!("may not contain '{bad}'"),
            ));
        }
    }
    let av = str_at(obj, "/spec/scaleTargetRef/apiVersion");
    let problem = if av.matches('/').count() > 1 {
        Some(format!("unexpected GroupVersion string: {av}"))
    } else if !av.contains('/') {
        // The target's group must be named (an empty group is the core group's).
        Some("apiVersion must specify API group".to_owned())
    } else {
        None
    };
    if let Some(msg) = problem {
        errs.push(FieldError::invalid(
            &rpath.child("apiVersion"),
            av.to_owned(),
            msg,
        ));
    }
    let metrics = obj
        .pointer("/spec/metrics")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    for (i, m) in metrics.iter().enumerate() {
        let mp = spec.child("metrics").index(i);
        let ty = str_at(m, "/type");
        if ty.is_empty() {
            errs.push(FieldError::required(
                &mp.child("type"),
                "must specify a metric source type",
            ));
        }
        const TYPES: [&str; 5] = [
            "ContainerResource",
            "External",
            "Object",
            "Pods",
            "Resource",
        ];
        if !TYPES.contains(&ty) {
            errs.push(FieldError::not_supported(
                &mp.child("type"),
                ty.to_owned(),
                &TYPES,
            ));
        }
        if let Some(r) = m.get("resource").filter(|r| r.is_object()) {
            let rp = mp.child("resource");
            if str_at(r, "/name").is_empty() {
                errs.push(FieldError::required(
                    &rp.child("name"),
                    "must specify a resource name",
                ));
            }
            let t = r.get("target").unwrap_or(&Value::Null);
            validate_target(&mut errs, t, &rp.child("target"));
            let has = |k: &str| t.get(k).is_some_and(|v| !v.is_null());
            if !has("averageUtilization") && !has("averageValue") {
                errs.push(FieldError::required(
                    &rp.child("target").child("averageUtilization"),
                    "must set either a target raw value or a target utilization",
                ));
            }
            if has("averageUtilization") && has("averageValue") {
                errs.push(FieldError::forbidden(
                    &rp.child("target").child("averageValue"),
                    "may not set both a target raw value and a target utilization",
                ));
            }
        }
    }
    if min == Some(0)
        && !metrics
            .iter()
            .any(|m| matches!(str_at(m, "/type"), "Object" | "External"))
    {
        errs.push(FieldError::forbidden(
            &spec.child("metrics"),
            "must specify at least one Object or External metric to support scaling to zero replicas",
        ));
    }
    if let Some(b) = obj.pointer("/spec/behavior").filter(|b| b.is_object()) {
        for rules in ["scaleUp", "scaleDown"] {
            if let Some(r) = b.get(rules).filter(|r| r.is_object()) {
                validate_scaling_rules(&mut errs, r, &spec.child("behavior").child(rules));
            }
        }
    }
    errs.extend(declarative);
    errs
}

/// Longest scaling policy period and stabilization window (seconds).
const MAX_PERIOD_SECONDS: i64 = 1800;
const MAX_STABILIZATION_WINDOW_SECONDS: i64 = 3600;

/// upstream's validateScalingRules.
fn validate_scaling_rules(errs: &mut Vec<FieldError>, r: &Value, path: &Path) {
    if let Some(w) = int_at(r, "/stabilizationWindowSeconds") {
        let wp = path.child("stabilizationWindowSeconds");
        if w < 0 {
            errs.push(FieldError::invalid(
                &wp,
                json!(w),
                "must be greater than or equal to zero",
            ));
        }
        if w > MAX_STABILIZATION_WINDOW_SECONDS {
            errs.push(FieldError::invalid(
                &wp,
                json!(w),
                format!("must be less than or equal to {MAX_STABILIZATION_WINDOW_SECONDS}"),
            ));
        }
    }
    if let Some(p) = r.get("selectPolicy").and_then(Value::as_str) {
        if !matches!(p, "Disabled" | "Max" | "Min") {
            errs.push(FieldError::not_supported(
                &path.child("selectPolicy"),
                p.to_owned(),
                &["Disabled", "Max", "Min"],
            ));
        }
    }
    let ppath = path.child("policies");
    let policies = r
        .get("policies")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if policies.is_empty() {
        errs.push(FieldError::required(
            &ppath,
            "must specify at least one Policy",
        ));
    }
    for (i, p) in policies.iter().enumerate() {
        let ip = ppath.index(i);
        let ty = str_at(p, "/type");
        if !matches!(ty, "Pods" | "Percent") {
            errs.push(FieldError::not_supported(
                &ip.child("type"),
                ty.to_owned(),
                &["Percent", "Pods"],
            ));
        }
        let value = int_at(p, "/value").unwrap_or(0);
        if value <= 0 {
            errs.push(FieldError::invalid(
                &ip.child("value"),
                json!(value),
                "must be greater than zero",
            ));
        }
        let period = int_at(p, "/periodSeconds").unwrap_or(0);
        if period <= 0 {
            errs.push(FieldError::invalid(
                &ip.child("periodSeconds"),
                json!(period),
                "must be greater than zero",
            ));
        }
        if period > MAX_PERIOD_SECONDS {
            errs.push(FieldError::invalid(
                &ip.child("periodSeconds"),
                json!(period),
                format!("must be less than or equal to {MAX_PERIOD_SECONDS}"),
            ));
        }
    }
}

/// A Quantity as the printers show it.
fn quantity(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// upstream's formatHPAMetrics: `<current>/<target>` per metric, two at most.
fn format_metrics(obj: &Value) -> String {
    let specs = obj
        .pointer("/spec/metrics")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if specs.is_empty() {
        return "<none>".to_owned();
    }
    let statuses = obj
        .pointer("/status/currentMetrics")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let unknown = || "<unknown>".to_owned();
    let mut list = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let status = statuses.get(i);
        let current = |source: &str, field: &str| {
            status
                .and_then(|s| s.get(source))
                .and_then(|s| quantity(s.pointer(&format!("/current/{field}"))))
        };
        let target = |source: &str, field: &str| {
            quantity(spec.pointer(&format!("/{source}/target/{field}"))).unwrap_or_default()
        };
        let entry = match str_at(spec, "/type") {
            source @ ("External" | "Object") => {
                let key = source.to_lowercase();
                if spec
                    .pointer(&format!("/{key}/target/averageValue"))
                    .is_some()
                {
                    format!(
                        "{}/{} (avg)",
                        current(&key, "averageValue").unwrap_or_else(unknown),
                        target(&key, "averageValue")
                    )
                } else {
                    format!(
                        "{}/{}",
                        current(&key, "value").unwrap_or_else(unknown),
                        target(&key, "value")
                    )
                }
            }
            "Pods" => format!(
                "{}/{}",
                current("pods", "averageValue").unwrap_or_else(unknown),
                target("pods", "averageValue")
            ),
            source @ ("Resource" | "ContainerResource") => {
                let key = if source == "Resource" {
                    "resource"
                } else {
                    "containerResource"
                };
                let name = str_at(spec, &format!("/{key}/name"));
                if spec
                    .pointer(&format!("/{key}/target/averageValue"))
                    .is_some()
                {
                    format!(
                        "{name}: {}/{}",
                        current(key, "averageValue").unwrap_or_else(unknown),
                        target(key, "averageValue")
                    )
                } else {
                    let cur = current(key, "averageUtilization")
                        .map(|u| format!("{u}%"))
                        .unwrap_or_else(unknown);
                    let tgt = spec
                        .pointer(&format!("/{key}/target/averageUtilization"))
                        .and_then(Value::as_i64)
                        .map(|u| format!("{u}%"))
                        .unwrap_or_else(|| "<auto>".to_owned());
                    format!("{name}: {cur}/{tgt}")
                }
            }
            _ => "<unknown type>".to_owned(),
        };
        list.push(entry);
    }
    let count = list.len();
    if count > 2 {
        list.truncate(2);
        format!("{} + {} more...", list.join(", "), count - 2)
    } else {
        list.join(", ")
    }
}

impl Strategy for HorizontalPodAutoscalers {
    fn prepare_create(&self, obj: &mut Value) {
        default_hpa(obj);
        obj["status"] = json!({"currentMetrics": null, "desiredReplicas": 0});
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_hpa(new);
        keep_status(new, old);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_hpa(obj)
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Reference", "string", "The scaled resource."),
            col("Targets", "string", "Current and target metric values."),
            col("MinPods", "string", "Lower limit of replicas."),
            col("MaxPods", "string", "Upper limit of replicas."),
            col("Replicas", "string", "Current number of replicas."),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let min = match int_at(obj, "/spec/minReplicas") {
            Some(m) => m.to_string(),
            None => "<unset>".to_owned(),
        };
        vec![
            json!(name_of(obj)),
            json!(format!(
                "{}/{}",
                str_at(obj, "/spec/scaleTargetRef/kind"),
                str_at(obj, "/spec/scaleTargetRef/name")
            )),
            json!(format_metrics(obj)),
            json!(min),
            json!(int_at(obj, "/spec/maxReplicas").unwrap_or(0)),
            json!(int_at(obj, "/status/currentReplicas").unwrap_or(0)),
            json!(age_of(obj)),
        ]
    }
}

// ---------------------------------------------------------------------------------------
// autoscaling/v1
// ---------------------------------------------------------------------------------------

/// The annotations autoscaling/v1 keeps v2 fields in.
const METRIC_SPECS: &str = "autoscaling.alpha.kubernetes.io/metrics";
const METRIC_STATUSES: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
const BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";
const CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";

/// Where each field of a v1 metric source (or status) lives in its v2 form, per source
/// type: (v2 source key, v1 field, v2 pointer inside the source).
const SPEC_FIELDS: &[(&str, &str, &str)] = &[
    ("object", "target", "/describedObject"),
    ("object", "metricName", "/metric/name"),
    ("object", "selector", "/metric/selector"),
    ("object", "targetValue", "/target/value"),
    ("object", "averageValue", "/target/averageValue"),
    ("pods", "metricName", "/metric/name"),
    ("pods", "selector", "/metric/selector"),
    ("pods", "targetAverageValue", "/target/averageValue"),
    ("resource", "name", "/name"),
    (
        "resource",
        "targetAverageUtilization",
        "/target/averageUtilization",
    ),
    ("resource", "targetAverageValue", "/target/averageValue"),
    ("containerResource", "name", "/name"),
    ("containerResource", "container", "/container"),
    (
        "containerResource",
        "targetAverageUtilization",
        "/target/averageUtilization",
    ),
    (
        "containerResource",
        "targetAverageValue",
        "/target/averageValue",
    ),
    ("external", "metricName", "/metric/name"),
    ("external", "metricSelector", "/metric/selector"),
    ("external", "targetValue", "/target/value"),
    ("external", "targetAverageValue", "/target/averageValue"),
];

const STATUS_FIELDS: &[(&str, &str, &str)] = &[
    ("object", "target", "/describedObject"),
    ("object", "metricName", "/metric/name"),
    ("object", "selector", "/metric/selector"),
    ("object", "currentValue", "/current/value"),
    ("object", "averageValue", "/current/averageValue"),
    ("pods", "metricName", "/metric/name"),
    ("pods", "selector", "/metric/selector"),
    ("pods", "currentAverageValue", "/current/averageValue"),
    ("resource", "name", "/name"),
    (
        "resource",
        "currentAverageUtilization",
        "/current/averageUtilization",
    ),
    ("resource", "currentAverageValue", "/current/averageValue"),
    ("containerResource", "name", "/name"),
    ("containerResource", "container", "/container"),
    (
        "containerResource",
        "currentAverageUtilization",
        "/current/averageUtilization",
    ),
    (
        "containerResource",
        "currentAverageValue",
        "/current/averageValue",
    ),
    ("external", "metricName", "/metric/name"),
    ("external", "metricSelector", "/metric/selector"),
    ("external", "currentValue", "/current/value"),
    ("external", "currentAverageValue", "/current/averageValue"),
];

/// Field order of the v1 types in the annotations (Go writes struct fields in order).
const V1_FIELD_ORDER: &[&str] = &[
    "type",
    "object",
    "pods",
    "resource",
    "containerResource",
    "external",
    "status",
    "lastTransitionTime",
    "reason",
    "message",
    "target",
    "kind",
    "metricName",
    "name",
    "apiVersion",
    "metricSelector",
    "targetValue",
    "currentValue",
    "targetAverageUtilization",
    "currentAverageUtilization",
    "targetAverageValue",
    "currentAverageValue",
    "selector",
    "averageValue",
    "container",
    "matchLabels",
    "matchExpressions",
    "key",
    "operator",
    "values",
];

/// JSON with object keys in the order of `V1_FIELD_ORDER` (others after, sorted).
fn ordered_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by_key(|k| {
                V1_FIELD_ORDER
                    .iter()
                    .position(|o| o == k)
                    .unwrap_or(V1_FIELD_ORDER.len())
            });
            let fields: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:{}", Value::from(k.as_str()), ordered_json(&m[*k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(ordered_json).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

/// The behavior annotation: upstream marshals its internal type, which has no JSON
/// names, so the keys are Go's field names and unset rules are null.
fn behavior_annotation(b: &Value) -> String {
    let or_null = |v: Option<&Value>| v.map_or_else(|| "null".to_owned(), Value::to_string);
    let rules = |r: Option<&Value>| match r.filter(|r| r.is_object()) {
        None => "null".to_owned(),
        Some(r) => {
            let policies = match r.get("policies").and_then(Value::as_array) {
                None => "null".to_owned(),
                Some(ps) => format!(
                    "[{}]",
                    ps.iter()
                        .map(|p| format!(
                            "{{\"Type\":{},\"Value\":{},\"PeriodSeconds\":{}}}",
                            or_null(p.get("type")),
                            or_null(p.get("value")),
                            or_null(p.get("periodSeconds"))
                        ))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            };
            format!(
                "{{\"StabilizationWindowSeconds\":{},\"SelectPolicy\":{},\"Policies\":{policies},\"Tolerance\":{}}}",
                or_null(r.get("stabilizationWindowSeconds")),
                or_null(r.get("selectPolicy")),
                or_null(r.get("tolerance"))
            )
        }
    };
    format!(
        "{{\"ScaleUp\":{},\"ScaleDown\":{}}}",
        rules(b.get("scaleUp")),
        rules(b.get("scaleDown"))
    )
}

/// The behavior annotation read back (Go matches field names without regard to case):
/// keys in their JSON form, nulls dropped.
fn behavior_from_annotation(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (source_key(&k), behavior_from_annotation(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(behavior_from_annotation).collect()),
        other => other,
    }
}

/// The source key of a metric type (`Resource` → `resource`).
fn source_key(ty: &str) -> String {
    let mut c = ty.chars();
    c.next()
        .map(|f| f.to_ascii_lowercase().to_string() + c.as_str())
        .unwrap_or_default()
}

/// A v2 metric (spec or status) in its v1 form.
fn metric_to_v1(m: &Value, fields: &[(&str, &str, &str)]) -> Value {
    let ty = str_at(m, "/type");
    let key = source_key(ty);
    let mut src = json!({});
    if let Some(v2) = m.get(&key) {
        for (_, v1_field, pointer) in fields.iter().filter(|(k, _, _)| *k == key) {
            if let Some(v) = v2.pointer(pointer) {
                src[*v1_field] = v.clone();
            }
        }
    }
    json!({"type": ty, key: src})
}

/// A v1 metric (spec or status) in its v2 form; `spec` adds the target's type.
fn metric_to_v2(m: &Value, fields: &[(&str, &str, &str)], spec: bool) -> Value {
    let ty = str_at(m, "/type");
    let key = source_key(ty);
    let mut src = json!({});
    if let Some(v1) = m.get(&key) {
        for (_, v1_field, pointer) in fields.iter().filter(|(k, _, _)| *k == key) {
            if let Some(v) = v1.get(*v1_field) {
                let (parent, field) = pointer.rsplit_once('/').unwrap_or(("", pointer));
                object_at(&mut src, parent)[field] = v.clone();
            }
        }
        if spec {
            let has = |f: &str| v1.get(f).is_some_and(|v| !v.is_null());
            let target_type = match key.as_str() {
                "object" if has("averageValue") => "AverageValue",
                "object" => "Value",
                "pods" => "AverageValue",
                "external" if has("targetValue") => "Value",
                "external" => "AverageValue",
                _ if has("targetAverageUtilization") => "Utilization",
                _ => "AverageValue",
            };
            object_at(&mut src, "/target")["type"] = json!(target_type);
        }
    }
    json!({"type": ty, key: src})
}

/// Whether a v2 metric is the CPU utilization target v1 has a field for.
fn is_cpu_utilization(m: &Value, current: bool) -> bool {
    let field = if current {
        "/resource/current/averageUtilization"
    } else {
        "/resource/target/averageUtilization"
    };
    str_at(m, "/type") == "Resource"
        && str_at(m, "/resource/name") == "cpu"
        && m.pointer(field).is_some_and(|v| !v.is_null())
}

fn annotations_mut(obj: &mut Value) -> &mut Value {
    object_at(obj, "/metadata/annotations")
}

/// Drops the round-trip annotations (and an annotations map they leave empty).
fn drop_round_trip_annotations(obj: &mut Value) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            let had = a.len();
            for k in [METRIC_SPECS, METRIC_STATUSES, BEHAVIOR, CONDITIONS] {
                a.remove(k);
            }
            if a.is_empty() && had > 0 {
                meta.remove("annotations");
            }
        }
    }
}

/// A stored (autoscaling/v2) HPA as autoscaling/v1 shows it.
fn to_v1(mut obj: Value) -> Value {
    let empty = Vec::new();
    let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = obj.get("status").cloned().unwrap_or_else(|| json!({}));
    let metrics = spec
        .get("metrics")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let current = status
        .get("currentMetrics")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let conditions = status
        .get("conditions")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty());
    drop_round_trip_annotations(&mut obj);
    let others: Vec<Value> = metrics
        .iter()
        .filter(|m| !is_cpu_utilization(m, false))
        .map(|m| metric_to_v1(m, SPEC_FIELDS))
        .collect();
    if !others.is_empty() {
        annotations_mut(&mut obj)[METRIC_SPECS] = json!(ordered_json(&Value::from(others)));
    }
    if !current.is_empty() {
        let v1: Vec<Value> = current
            .iter()
            .map(|m| metric_to_v1(m, STATUS_FIELDS))
            .collect();
        annotations_mut(&mut obj)[METRIC_STATUSES] = json!(ordered_json(&Value::from(v1)));
    }
    if let Some(b) = spec.get("behavior").filter(|b| !b.is_null()) {
        annotations_mut(&mut obj)[BEHAVIOR] = json!(behavior_annotation(b));
    }
    if let Some(c) = conditions {
        annotations_mut(&mut obj)[CONDITIONS] = json!(ordered_json(&Value::from(c.clone())));
    }
    let mut v1_spec = json!({});
    for k in ["scaleTargetRef", "minReplicas", "maxReplicas"] {
        if let Some(v) = spec.get(k) {
            v1_spec[k] = v.clone();
        }
    }
    if let Some(u) = metrics
        .iter()
        .find(|m| is_cpu_utilization(m, false))
        .and_then(|m| m.pointer("/resource/target/averageUtilization"))
    {
        v1_spec["targetCPUUtilizationPercentage"] = u.clone();
    }
    let mut v1_status = json!({
        "currentReplicas": status.get("currentReplicas").cloned().unwrap_or(json!(0)),
        "desiredReplicas": status.get("desiredReplicas").cloned().unwrap_or(json!(0)),
    });
    for k in ["observedGeneration", "lastScaleTime"] {
        if let Some(v) = status.get(k) {
            v1_status[k] = v.clone();
        }
    }
    if let Some(u) = current
        .iter()
        .filter(|m| is_cpu_utilization(m, true))
        .filter_map(|m| m.pointer("/resource/current/averageUtilization"))
        .next_back()
    {
        v1_status["currentCPUUtilizationPercentage"] = u.clone();
    }
    obj["apiVersion"] = json!("autoscaling/v1");
    obj["spec"] = v1_spec;
    obj["status"] = v1_status;
    obj
}

/// An autoscaling/v1 HPA in its stored (autoscaling/v2) form.
fn to_v2(mut obj: Value) -> Value {
    let annotation = |k: &str| -> Option<Value> {
        obj.pointer("/metadata/annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
            .and_then(|s| serde_json::from_str(s).ok())
    };
    let others = annotation(METRIC_SPECS);
    let statuses = annotation(METRIC_STATUSES);
    let behavior = annotation(BEHAVIOR)
        .map(behavior_from_annotation)
        .filter(|b| b.as_object().is_some_and(|m| !m.is_empty()));
    let conditions = annotation(CONDITIONS);
    let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = obj.get("status").cloned();
    let mut v2_spec = json!({});
    for k in ["scaleTargetRef", "minReplicas", "maxReplicas"] {
        if let Some(v) = spec.get(k) {
            v2_spec[k] = v.clone();
        }
    }
    let cpu = |u: &Value| json!({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": u}}});
    let mut metrics: Vec<Value> = others
        .as_ref()
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|m| metric_to_v2(m, SPEC_FIELDS, true))
                .collect()
        })
        .unwrap_or_default();
    if let Some(u) = spec
        .get("targetCPUUtilizationPercentage")
        .filter(|u| !u.is_null())
    {
        metrics.push(cpu(u));
    }
    if metrics.is_empty() {
        metrics.push(cpu(&json!(DEFAULT_CPU_UTILIZATION)));
    }
    v2_spec["metrics"] = Value::from(metrics);
    if let Some(b) = behavior {
        v2_spec["behavior"] = b;
    }
    if let Some(status) = status {
        let mut v2_status = json!({
            "currentReplicas": status.get("currentReplicas").cloned().unwrap_or(json!(0)),
            "desiredReplicas": status.get("desiredReplicas").cloned().unwrap_or(json!(0)),
            "currentMetrics": null,
        });
        for k in ["observedGeneration", "lastScaleTime"] {
            if let Some(v) = status.get(k) {
                v2_status[k] = v.clone();
            }
        }
        if let Some(u) = status
            .get("currentCPUUtilizationPercentage")
            .filter(|u| !u.is_null())
        {
            v2_status["currentMetrics"] = json!([{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": u}}}]);
        }
        if let Some(a) = statuses.as_ref().and_then(Value::as_array) {
            let current: Vec<Value> = a
                .iter()
                .map(|m| metric_to_v2(m, STATUS_FIELDS, false))
                .collect();
            v2_status["currentMetrics"] = Value::from(current);
        }
        if let Some(c) = conditions {
            v2_status["conditions"] = c;
        }
        // A v2 HPA's currentReplicas is left out when 0.
        if v2_status["currentReplicas"] == json!(0) {
            if let Some(o) = v2_status.as_object_mut() {
                o.remove("currentReplicas");
            }
        }
        obj["status"] = v2_status;
    }
    drop_round_trip_annotations(&mut obj);
    obj["apiVersion"] = json!("autoscaling/v2");
    obj["spec"] = v2_spec;
    obj
}

/// autoscaling/v1: the v2 rules applied to the v2 form.
struct HorizontalPodAutoscalersV1;

impl Strategy for HorizontalPodAutoscalersV1 {
    fn prepare_create(&self, obj: &mut Value) {
        let mut v2 = to_v2(obj.clone());
        HorizontalPodAutoscalers.prepare_create(&mut v2);
        *obj = to_v1(v2);
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        let mut v2 = to_v2(new.clone());
        HorizontalPodAutoscalers.prepare_update(&mut v2, &to_v2(old.clone()));
        *new = to_v1(v2);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        HorizontalPodAutoscalers.validate(&to_v2(obj.clone()))
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn stored_form(&self, obj: Value) -> Result<Value, kumo_apimachinery::status::ApiError> {
        Ok(to_v2(obj))
    }

    fn served_form(&self, obj: Value) -> Result<Value, kumo_apimachinery::status::ApiError> {
        Ok(to_v1(obj))
    }

    fn converts(&self) -> bool {
        true
    }

    fn columns(&self) -> Vec<Column> {
        HorizontalPodAutoscalers.columns()
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        HorizontalPodAutoscalers.cells(&to_v2(obj.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_column() {
        let mut h = json!({"spec": {"maxReplicas": 3, "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}});
        default_hpa(&mut h);
        assert_eq!(format_metrics(&h), "cpu: <unknown>/80%");
        assert!(validate_hpa(&h).is_empty());
    }

    #[test]
    fn behavior_annotation_round_trip() {
        let b = json!({"scaleDown": {"stabilizationWindowSeconds": 60, "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}});
        let a = behavior_annotation(&b);
        assert_eq!(
            a,
            r#"{"ScaleUp":null,"ScaleDown":{"StabilizationWindowSeconds":60,"SelectPolicy":null,"Policies":[{"Type":"Percent","Value":100,"PeriodSeconds":15}],"Tolerance":null}}"#
        );
        let back = behavior_from_annotation(serde_json::from_str(&a).unwrap());
        assert_eq!(back, b);
    }
}
