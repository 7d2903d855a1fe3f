//! core/v1 Events, and the events.k8s.io/v1 view of the same objects (stored as core/v1
//! Events, as kube-apiserver stores them).

use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Value};

use super::{default_field, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource {
            group: "",
            version: "v1",
            kind: "Event",
            plural: "events",
            singular: "event",
            namespaced: true,
            short_names: &["ev"],
            categories: &[],
            subresources: &[],
            strategy: Box::new(Events),
        },
        Resource {
            group: "events.k8s.io",
            version: "v1",
            kind: "Event",
            plural: "events",
            singular: "event",
            namespaced: true,
            short_names: &["ev"],
            categories: &[],
            subresources: &[],
            strategy: Box::new(EventsV1),
        },
    ]
}

struct Events;

/// The fields core/v1 Event always serialises (no omitempty upstream).
fn normalise(obj: &mut Value) {
    for k in ["eventTime", "firstTimestamp", "lastTimestamp"] {
        if let Some(o) = obj.as_object_mut() {
            o.entry(k).or_insert(Value::Null);
        }
    }
    default_field(obj, "involvedObject", json!({}));
    default_field(obj, "source", json!({}));
    default_field(obj, "reportingComponent", json!(""));
    default_field(obj, "reportingInstance", json!(""));
}

fn column(name: &'static str, priority: u8, description: &'static str) -> Column {
    Column {
        name,
        type_: "string",
        format: "",
        description,
        priority,
    }
}

/// A timestamp's age, `<unknown>` when unset.
fn since(obj: &Value, k: &str) -> String {
    crate::time::age(obj.get(k).and_then(Value::as_str))
}

impl Strategy for Events {
    fn default_gc_policy(&self) -> super::GcPolicy {
        super::GcPolicy::Unsupported
    }
    fn prepare_create(&self, obj: &mut Value) {
        normalise(obj);
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        normalise(new);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_event(obj, false)
    }

    fn columns(&self) -> Vec<Column> {
        event_columns()
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        event_cells(obj)
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        event_fields(obj)
    }
}

fn event_columns() -> Vec<Column> {
    vec![
            column("Last Seen", 0, "The time at which the most recent occurrence of this event was recorded."),
            column("Type", 0, "Type of this event (Normal, Warning), new types could be added in the future"),
            column("Reason", 0, "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
            column("Object", 0, "The object that this event is about."),
            column("Subobject", 1, "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2]. For example, if the object reference is to a container within a pod, this would take on a value like: \"spec.containers{name}\" (where \"name\" refers to the name of the container that triggered the event) or if no container name is specified \"spec.containers[2]\" (container with index 2 in this pod). This syntax is chosen only to have some well-defined way of referencing a part of an object."),
            column("Source", 1, "The component reporting this event. Should be a short machine understandable string."),
            column("Message", 0, "A human-readable description of the status of this operation."),
            column("First Seen", 1, "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)"),
            column("Count", 1, "The number of times this event has occurred."),
            Column {
                priority: 1,
                ..Column::NAME
            },
        ]
}

/// Upstream's printEvent (always wide on the server).
fn event_cells(obj: &Value) -> Vec<Value> {
    // Upstream's printEvent (wide).
    let mut first = since(obj, "firstTimestamp");
    if obj.get("firstTimestamp").is_none_or(Value::is_null) {
        first = since(obj, "eventTime");
    }
    let mut last = since(obj, "lastTimestamp");
    if obj.get("lastTimestamp").is_none_or(Value::is_null) {
        last = first.clone();
    }
    let mut count = obj.get("count").and_then(Value::as_i64).unwrap_or(0);
    if let Some(series) = obj.get("series").filter(|s| s.is_object()) {
        last = crate::time::age(series.get("lastObservedTime").and_then(Value::as_str));
        count = series.get("count").and_then(Value::as_i64).unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let kind = str_at(obj, "/involvedObject/kind").to_lowercase();
    let target = match str_at(obj, "/involvedObject/name") {
        "" => kind,
        n => format!("{kind}/{n}"),
    };
    let first_non_empty = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_owned()
        } else {
            a.to_owned()
        }
    };
    let component = first_non_empty(
        str_at(obj, "/source/component"),
        str_at(obj, "/reportingComponent"),
    );
    let instance = first_non_empty(
        str_at(obj, "/source/host"),
        str_at(obj, "/reportingInstance"),
    );
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last),
        json!(str_at(obj, "/type")),
        json!(str_at(obj, "/reason")),
        json!(target),
        json!(str_at(obj, "/involvedObject/fieldPath")),
        json!(source),
        json!(str_at(obj, "/message").trim()),
        json!(first),
        json!(count),
        json!(str_at(obj, "/metadata/name")),
    ]
}

fn event_fields(obj: &Value) -> Vec<(&'static str, String)> {
    let s = |p: &str| str_at(obj, p).to_owned();
    let source = match str_at(obj, "/source/component") {
        "" => s("/reportingComponent"),
        c => c.to_owned(),
    };
    vec![
        ("involvedObject.kind", s("/involvedObject/kind")),
        ("involvedObject.namespace", s("/involvedObject/namespace")),
        ("involvedObject.name", s("/involvedObject/name")),
        ("involvedObject.uid", s("/involvedObject/uid")),
        ("involvedObject.apiVersion", s("/involvedObject/apiVersion")),
        (
            "involvedObject.resourceVersion",
            s("/involvedObject/resourceVersion"),
        ),
        ("involvedObject.fieldPath", s("/involvedObject/fieldPath")),
        ("reason", s("/reason")),
        ("reportingComponent", s("/reportingComponent")),
        ("source", source),
        ("type", s("/type")),
    ]
}

/// upstream's ValidateEventCreate/legacyValidateEvent, on the core form. `strict`: the
/// request came through events.k8s.io/v1.
fn validate_event(obj: &Value, strict: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ns = str_at(obj, "/metadata/namespace");
    let involved = str_at(obj, "/involvedObject/namespace");
    let ns_path = Path::new("involvedObject").child("namespace");
    let mismatch = || {
        FieldError::invalid(
            &ns_path,
            involved.to_owned(),
            "does not match event.namespace",
        )
    };
    let event_time = obj.get("eventTime").is_some_and(|t| !t.is_null());
    let controller_path = if strict {
        "reportingController"
    } else {
        "reportingComponent"
    };
    if !event_time {
        if involved.is_empty() {
            if !ns.is_empty() && ns != "default" {
                errs.push(mismatch());
            }
        } else if ns != involved {
            errs.push(mismatch());
        }
    } else {
        if involved.is_empty() && ns != "default" && ns != "kube-system" {
            errs.push(mismatch());
        }
        let rc = str_at(obj, "/reportingComponent");
        if rc.is_empty() {
            errs.push(FieldError::required(&Path::new(controller_path), ""));
        } else {
            for msg in kumo_apimachinery::validation::is_qualified_name(rc) {
                errs.push(FieldError::invalid(
                    &Path::new(controller_path),
                    rc.to_owned(),
                    msg,
                ));
            }
        }
        for (field, limit, required) in [
            ("reportingInstance", 128, true),
            ("action", 128, true),
            ("reason", 128, true),
            ("message", 1024, false),
        ] {
            let v = str_at(obj, &format!("/{field}"));
            if required && v.is_empty() {
                errs.push(FieldError::required(&Path::new(field), ""));
            }
            if v.len() > limit {
                errs.push(FieldError::invalid(
                    &Path::new(field),
                    "",
                    format!("can have at most {limit} characters"),
                ));
            }
        }
    }
    if !strict {
        return errs;
    }
    if !event_time {
        errs.push(FieldError::required(&Path::new("eventTime"), ""));
    }
    let t = str_at(obj, "/type");
    if t != "Normal" && t != "Warning" {
        errs.push(FieldError::invalid(
            &Path::new("type"),
            "",
            format!("has invalid value: {t}"),
        ));
    }
    for k in ["firstTimestamp", "lastTimestamp"] {
        if obj.get(k).is_some_and(|v| !v.is_null()) {
            errs.push(FieldError::invalid(&Path::new(k), "", "needs to be unset"));
        }
    }
    if obj.get("count").and_then(Value::as_i64).unwrap_or(0) != 0 {
        errs.push(FieldError::invalid(
            &Path::new("count"),
            "",
            "needs to be unset",
        ));
    }
    if !str_at(obj, "/source/component").is_empty() || !str_at(obj, "/source/host").is_empty() {
        errs.push(FieldError::invalid(
            &Path::new("source"),
            "",
            "needs to be unset",
        ));
    }
    errs
}

/// events.k8s.io/v1 field names and their core/v1 counterparts.
const V1_FIELDS: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("reportingController", "reportingComponent"),
];

/// An events.k8s.io/v1 Event as a core/v1 Event.
fn to_core(mut obj: Value) -> Value {
    if let Some(o) = obj.as_object_mut() {
        for (v1, core) in V1_FIELDS {
            o.remove(core);
            if let Some(v) = o.remove(v1) {
                o.insert(core.to_owned(), v);
            }
        }
        o.insert("apiVersion".into(), json!("v1"));
    }
    obj
}

/// A core/v1 Event as an events.k8s.io/v1 Event (omitting what upstream omits when empty).
fn from_core(mut obj: Value) -> Value {
    if let Some(o) = obj.as_object_mut() {
        for (v1, core) in V1_FIELDS {
            o.remove(v1);
            if let Some(v) = o.remove(core) {
                o.insert(v1.to_owned(), v);
            }
        }
        for k in [
            "reportingController",
            "reportingInstance",
            "action",
            "reason",
            "note",
            "type",
        ] {
            if o.get(k).is_some_and(|v| v.as_str() == Some("")) {
                o.remove(k);
            }
        }
        if o.get("deprecatedCount").and_then(Value::as_i64) == Some(0) {
            o.remove("deprecatedCount");
        }
        if o.contains_key("apiVersion") {
            o.insert("apiVersion".into(), json!("events.k8s.io/v1"));
        }
    }
    obj
}

/// events.k8s.io/v1 Events: the same objects, converted on the way in and out.
struct EventsV1;

impl Strategy for EventsV1 {
    fn default_gc_policy(&self) -> super::GcPolicy {
        super::GcPolicy::Unsupported
    }
    fn prepare_create(&self, obj: &mut Value) {
        let mut core = to_core(obj.take());
        normalise(&mut core);
        *obj = from_core(core);
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        self.prepare_create(new);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_event(&to_core(obj.clone()), true)
    }

    fn validate_update(&self, new: &Value, _old: &Value) -> Vec<FieldError> {
        validate_event(&to_core(new.clone()), false)
    }

    fn stored_form(&self, obj: Value) -> Result<Value, kumo_apimachinery::status::ApiError> {
        Ok(to_core(obj))
    }

    fn served_form(&self, obj: Value) -> Result<Value, kumo_apimachinery::status::ApiError> {
        Ok(from_core(obj))
    }

    fn converts(&self) -> bool {
        true
    }

    fn columns(&self) -> Vec<Column> {
        event_columns()
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        event_cells(&to_core(obj.clone()))
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        let s = |p: &str| str_at(obj, p).to_owned();
        vec![
            ("regarding.kind", s("/regarding/kind")),
            ("regarding.namespace", s("/regarding/namespace")),
            ("regarding.name", s("/regarding/name")),
            ("regarding.uid", s("/regarding/uid")),
            ("regarding.apiVersion", s("/regarding/apiVersion")),
            ("regarding.resourceVersion", s("/regarding/resourceVersion")),
            ("regarding.fieldPath", s("/regarding/fieldPath")),
            ("reason", s("/reason")),
            ("reportingController", s("/reportingController")),
            ("type", s("/type")),
        ]
    }
}
