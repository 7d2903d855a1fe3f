//! batch/v1 Jobs and CronJobs.
//!
//! Jobs get upstream's defaults (SetDefaults_Job) and, unless `manualSelector` is set, the
//! selector the job strategy generates: the job's uid under
//! `batch.kubernetes.io/controller-uid`, with the uid and name labels on the template.

use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Value};

use super::apps::{
    col, container_cells, format_label_selector, immutable, int_at, keep_status, nonneg, object_at,
    validate_selector_matches, CONTAINERS, IMAGES, SELECTOR,
};
use super::pods::validate_pod_template;
use super::{age_of, default_field, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource {
            group: "batch",
            version: "v1",
            kind: "Job",
            plural: "jobs",
            singular: "job",
            namespaced: true,
            short_names: &[],
            categories: &["all"],
            subresources: &["status"],
            strategy: Box::new(Jobs),
        },
        Resource {
            group: "batch",
            version: "v1",
            kind: "CronJob",
            plural: "cronjobs",
            singular: "cronjob",
            namespaced: true,
            short_names: &["cj"],
            categories: &["all"],
            subresources: &["status"],
            strategy: Box::new(CronJobs),
        },
    ]
}

const CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
const JOB_NAME: &str = "batch.kubernetes.io/job-name";
const LEGACY_CONTROLLER_UID: &str = "controller-uid";
const LEGACY_JOB_NAME: &str = "job-name";

/// SetDefaults_Job on the job spec at `spec`, with the template's pod defaults.
fn default_job_spec(spec: &mut Value) {
    if spec.get("completions").is_none_or(Value::is_null)
        && spec.get("parallelism").is_none_or(Value::is_null)
    {
        spec["completions"] = json!(1);
        spec["parallelism"] = json!(1);
    }
    default_field(spec, "parallelism", json!(1));
    let per_index = spec
        .get("backoffLimitPerIndex")
        .is_some_and(|v| !v.is_null());
    default_field(
        spec,
        "backoffLimit",
        json!(if per_index { i64::from(i32::MAX) } else { 6 }),
    );
    default_field(spec, "completionMode", json!("NonIndexed"));
    default_field(spec, "suspend", json!(false));
    let failure_policy = spec.get("podFailurePolicy").is_some_and(|v| !v.is_null());
    default_field(
        spec,
        "podReplacementPolicy",
        json!(if failure_policy {
            "Failed"
        } else {
            "TerminatingOrFailed"
        }),
    );
    default_field(spec, "manualSelector", json!(false));
    if let Some(rules) = spec
        .pointer_mut("/podFailurePolicy/rules")
        .and_then(Value::as_array_mut)
    {
        for r in rules {
            if let Some(ps) = r.get_mut("onPodConditions").and_then(Value::as_array_mut) {
                for p in ps {
                    default_field(p, "status", json!("True"));
                }
            }
        }
    }
    super::apps::default_template(spec, "/template");
}

/// The job strategy's generateSelector: the uid and name labels on the template and the
/// uid in the selector (what is already there is kept).
fn generate_selector(obj: &mut Value) {
    let uid = str_at(obj, "/metadata/uid").to_owned();
    let name = name_of(obj).to_owned();
    let labels = object_at(obj, "/spec/template/metadata/labels");
    for (k, v) in [
        (LEGACY_JOB_NAME, &name),
        (JOB_NAME, &name),
        (LEGACY_CONTROLLER_UID, &uid),
        (CONTROLLER_UID, &uid),
    ] {
        default_field(labels, k, json!(v));
    }
    let selector = object_at(obj, "/spec/selector/matchLabels");
    default_field(selector, CONTROLLER_UID, json!(uid));
}

struct Jobs;

/// The label `key` of the template must be `want` (upstream's ValidateHasLabel).
fn has_label(errs: &mut Vec<FieldError>, template: &Value, key: &str, want: &str) {
    let path = Path::new("spec")
        .child("template")
        .child("metadata")
        .child("labels")
        .key(key);
    let labels = template.pointer("/metadata/labels");
    match labels.and_then(|l| l.get(key)).and_then(Value::as_str) {
        None => errs.push(FieldError::required(&path, want)),
        Some(v) if v != want => errs.push(FieldError::invalid(
            &path,
            labels.cloned().unwrap_or(Value::Null),
            format!("must be '{want}'"),
        )),
        Some(_) => {}
    }
}

/// upstream's validateJobSpec on the job spec `spec` at `path`.
fn validate_job_spec(errs: &mut Vec<FieldError>, spec: &Value, path: &Path) {
    for field in [
        "parallelism",
        "completions",
        "activeDeadlineSeconds",
        "backoffLimit",
        "ttlSecondsAfterFinished",
        "backoffLimitPerIndex",
        "maxFailedIndexes",
    ] {
        nonneg(errs, spec, &format!("/{field}"), &path.child(field));
    }
    let present = |k: &str| spec.get(k).is_some_and(|v| !v.is_null());
    if present("maxFailedIndexes") && !present("backoffLimitPerIndex") {
        errs.push(FieldError::required(
            &path.child("backoffLimitPerIndex"),
            "when maxFailedIndexes is specified",
        ));
    }
    let mode = spec.get("completionMode").and_then(Value::as_str);
    if let Some(m) = mode {
        if !matches!(m, "NonIndexed" | "Indexed") {
            errs.push(FieldError::not_supported(
                &path.child("completionMode"),
                m.to_owned(),
                &["NonIndexed", "Indexed"],
            ));
        }
        if m == "Indexed" {
            if !present("completions") {
                errs.push(FieldError::required(
                    &path.child("completions"),
                    "when completion mode is Indexed",
                ));
            }
            if let Some(p) = int_at(spec, "/parallelism").filter(|p| *p > 100_000) {
                errs.push(FieldError::invalid(
                    &path.child("parallelism"),
                    json!(p),
                    "must be less than or equal to 100000 when completion mode is Indexed",
                ));
            }
        }
    }
    if matches!(mode, None | Some("NonIndexed")) {
        for field in ["backoffLimitPerIndex", "maxFailedIndexes"] {
            if let Some(v) = spec.get(field).filter(|v| !v.is_null()) {
                errs.push(FieldError::invalid(
                    &path.child(field),
                    v.clone(),
                    "requires indexed completion mode",
                ));
            }
        }
    }
    if let Some(pfp) = spec.get("podFailurePolicy").filter(|p| !p.is_null()) {
        validate_pod_failure_policy(errs, spec, pfp, &path.child("podFailurePolicy"));
    }
    if let Some(sp) = spec.get("successPolicy").filter(|p| !p.is_null()) {
        if mode != Some("Indexed") {
            errs.push(FieldError::invalid(
                &path.child("successPolicy"),
                sp.clone(),
                "requires indexed completion mode",
            ));
        }
    }
    if let Some(p) = spec.get("podReplacementPolicy").and_then(Value::as_str) {
        if present("podFailurePolicy") {
            if p != "Failed" {
                errs.push(FieldError::not_supported(
                    &path.child("podReplacementPolicy"),
                    p.to_owned(),
                    &["Failed"],
                ));
            }
        } else if !matches!(p, "Failed" | "TerminatingOrFailed") {
            errs.push(FieldError::not_supported(
                &path.child("podReplacementPolicy"),
                p.to_owned(),
                &["Failed", "TerminatingOrFailed"],
            ));
        }
    }
    let template = spec.get("template").unwrap_or(&Value::Null);
    let tpath = path.child("template");
    errs.extend(validate_pod_template(template, &tpath));
    let rp_path = tpath.child("spec").child("restartPolicy");
    match str_at(template, "/spec/restartPolicy") {
        "Always" | "" => errs.push(FieldError::required(
            &rp_path,
            "valid values: \"OnFailure\", \"Never\"",
        )),
        "OnFailure" if present("podFailurePolicy") => errs.push(FieldError::invalid(
            &rp_path,
            "OnFailure",
            "only \"Never\" is supported when podFailurePolicy is specified",
        )),
        "OnFailure" | "Never" => {}
        other => errs.push(FieldError::not_supported(
            &rp_path,
            other.to_owned(),
            &["OnFailure", "Never"],
        )),
    }
}

/// upstream's validatePodFailurePolicy.
fn validate_pod_failure_policy(errs: &mut Vec<FieldError>, spec: &Value, pfp: &Value, path: &Path) {
    const ACTIONS: [&str; 4] = ["Count", "FailIndex", "FailJob", "Ignore"];
    let rules_path = path.child("rules");
    let rules = pfp
        .get("rules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if rules.len() > 20 {
        errs.push(FieldError::too_many(&rules_path, rules.len() as i64, 20));
    }
    let names: Vec<&str> = ["containers", "initContainers"]
        .iter()
        .flat_map(|l| {
            spec.pointer(&format!("/template/spec/{l}"))
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or(&[])
        })
        .map(|c| str_at(c, "/name"))
        .collect();
    // Go's %q of a list of strings.
    let quoted = |vs: &[&str]| {
        format!(
            "[{}]",
            vs.iter()
                .map(|v| format!("{v:?}"))
                .collect::<Vec<_>>()
                .join(" ")
        )
    };
    for (i, rule) in rules.iter().enumerate() {
        let rp = rules_path.index(i);
        let action_path = rp.child("action");
        match str_at(rule, "/action") {
            "" => errs.push(FieldError::required(
                &action_path,
                format!("valid values: {}", quoted(&ACTIONS)),
            )),
            "FailIndex" => {
                if spec.get("backoffLimitPerIndex").is_none_or(Value::is_null) {
                    errs.push(FieldError::invalid(
                        &action_path,
                        "FailIndex",
                        "requires the backoffLimitPerIndex to be set",
                    ));
                }
            }
            a if ACTIONS.contains(&a) => {}
            a => errs.push(FieldError::not_supported(
                &action_path,
                a.to_owned(),
                &ACTIONS,
            )),
        }
        let on_exit = rule.get("onExitCodes").filter(|v| !v.is_null());
        let on_conditions = rule
            .get("onPodConditions")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty());
        if let Some(oe) = on_exit {
            let ep = rp.child("onExitCodes");
            let op_path = ep.child("operator");
            let op = str_at(oe, "/operator");
            match op {
                "" => errs.push(FieldError::required(
                    &op_path,
                    format!("valid values: {}", quoted(&["In", "NotIn"])),
                )),
                "In" | "NotIn" => {}
                other => errs.push(FieldError::not_supported(
                    &op_path,
                    other.to_owned(),
                    &["In", "NotIn"],
                )),
            }
            if let Some(c) = oe.get("containerName").and_then(Value::as_str) {
                if !names.contains(&c) {
                    errs.push(FieldError::invalid(
                        &ep.child("containerName"),
                        c.to_owned(),
                        "must be one of the container or initContainer names in the pod template",
                    ));
                }
            }
            let vp = ep.child("values");
            let raw = oe.get("values").cloned().unwrap_or(Value::Null);
            let values: Vec<i64> = raw
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_i64).collect())
                .unwrap_or_default();
            if values.is_empty() {
                errs.push(FieldError::invalid(
                    &vp,
                    raw.clone(),
                    "at least one value is required",
                ));
            } else if values.len() > 255 {
                errs.push(FieldError::too_many(&vp, values.len() as i64, 255));
            }
            let mut seen = std::collections::BTreeSet::new();
            for (j, v) in values.iter().enumerate() {
                if op == "In" && *v == 0 {
                    errs.push(FieldError::invalid(
                        &vp.index(j),
                        json!(v),
                        "must not be 0 for the In operator",
                    ));
                }
                if !seen.insert(*v) {
                    errs.push(FieldError::duplicate(&vp.index(j), json!(v)));
                }
            }
            if values.windows(2).any(|w| w[0] > w[1]) {
                errs.push(FieldError::invalid(&vp, raw, "must be ordered"));
            }
        }
        if let Some(patterns) = on_conditions {
            let cp = rp.child("onPodConditions");
            if patterns.len() > 20 {
                errs.push(FieldError::too_many(&cp, patterns.len() as i64, 20));
            }
            for (j, pat) in patterns.iter().enumerate() {
                let pp = cp.index(j);
                let ty = str_at(pat, "/type");
                for msg in kumo_apimachinery::validation::is_qualified_name(ty) {
                    errs.push(FieldError::invalid(&pp.child("type"), ty.to_owned(), msg));
                }
                let statuses = ["False", "True", "Unknown"];
                match str_at(pat, "/status") {
                    "" => errs.push(FieldError::required(
                        &pp.child("status"),
                        format!("valid values: {}", quoted(&statuses)),
                    )),
                    st if statuses.contains(&st) => {}
                    st => errs.push(FieldError::not_supported(
                        &pp.child("status"),
                        st.to_owned(),
                        &statuses,
                    )),
                }
            }
        }
        match (on_exit.is_some(), on_conditions.is_some()) {
            (true, true) => errs.push(FieldError::invalid(
                &rp,
                kumo_apimachinery::validation::BadValue::Omitted,
                "specifying both OnExitCodes and OnPodConditions is not supported",
            )),
            (false, false) => errs.push(FieldError::invalid(
                &rp,
                kumo_apimachinery::validation::BadValue::Omitted,
                "specifying one of OnExitCodes and OnPodConditions is required",
            )),
            _ => {}
        }
    }
}

/// upstream's ValidateJobSpec: validateJobSpec, the selector, and the selector against the
/// template's labels.
fn validate_job_spec_and_selector(errs: &mut Vec<FieldError>, obj: &Value) {
    let spec = obj.get("spec").unwrap_or(&Value::Null);
    let path = Path::new("spec");
    validate_job_spec(errs, spec, &path);
    let sel = spec.get("selector").filter(|s| !s.is_null());
    match sel {
        None => errs.push(FieldError::required(&path.child("selector"), "")),
        Some(s) => {
            if let Ok(api) = serde_json::from_value(s.clone()) {
                errs.extend(kumo_apimachinery::validation::validate_label_selector(
                    &api,
                    Default::default(),
                    &path.child("selector"),
                ));
            }
        }
    }
    let template = spec.get("template").unwrap_or(&Value::Null);
    if sel.is_some() {
        validate_selector_matches(errs, sel, template, &path.child("template"));
    }
}

impl Strategy for Jobs {
    fn default_gc_policy(&self) -> super::GcPolicy {
        super::GcPolicy::OrphanDependents
    }
    fn default_gc_warning(&self) -> Option<&'static str> {
        Some("child pods are preserved by default when jobs are deleted; set propagationPolicy=Background to remove them or set propagationPolicy=Orphan to suppress this warning")
    }
    fn validate_status_update(&self, new: &Value, _old: &Value) -> Vec<FieldError> {
        // The counts upstream always checks (its other status rules depend on the job's
        // state and the controller's options).
        let mut errs = Vec::new();
        let status = Path::new("status");
        for field in ["active", "succeeded", "failed", "ready", "terminating"] {
            nonneg(
                &mut errs,
                new,
                &format!("/status/{field}"),
                &status.child(field),
            );
        }
        errs
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_job_spec(object_at(obj, "/spec"));
        if obj.pointer("/spec/manualSelector") != Some(&json!(true)) {
            generate_selector(obj);
        }
        // Upstream's defaulting shares the template's labels with a job without labels.
        let template_labels = obj.pointer("/spec/template/metadata/labels").cloned();
        if let Some(l) = template_labels.filter(|l| l.as_object().is_some_and(|m| !m.is_empty())) {
            let meta = object_at(obj, "/metadata");
            if meta
                .get("labels")
                .and_then(Value::as_object)
                .is_none_or(|m| m.is_empty())
            {
                meta["labels"] = l;
            }
        }
        obj["status"] = json!({});
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_job_spec(object_at(new, "/spec"));
        keep_status(new, old);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        if obj.pointer("/spec/manualSelector") != Some(&json!(true))
            && obj.pointer("/spec/selector").is_some_and(|s| !s.is_null())
        {
            let uid = str_at(obj, "/metadata/uid");
            let name = name_of(obj);
            let template = obj.pointer("/spec/template").unwrap_or(&Value::Null);
            has_label(&mut errs, template, LEGACY_CONTROLLER_UID, uid);
            has_label(&mut errs, template, LEGACY_JOB_NAME, name);
            has_label(&mut errs, template, CONTROLLER_UID, uid);
            has_label(&mut errs, template, JOB_NAME, name);
            let expected: std::collections::BTreeMap<String, String> = [
                (CONTROLLER_UID, uid),
                (JOB_NAME, name),
                (LEGACY_CONTROLLER_UID, uid),
                (LEGACY_JOB_NAME, name),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
            let sel = obj.pointer("/spec/selector");
            if let Some(s) = super::apps::label_selector(sel) {
                if !s.matches(&expected) {
                    errs.push(FieldError::invalid(
                        &Path::new("spec").child("selector"),
                        sel.cloned().unwrap_or(Value::Null),
                        "`selector` not auto-generated",
                    ));
                }
            }
        }
        validate_job_spec_and_selector(&mut errs, obj);
        name_allows_completions(&mut errs, obj);
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        validate_job_spec_and_selector(&mut errs, new);
        let spec = Path::new("spec");
        if str_at(new, "/spec/completionMode") != "Indexed" {
            immutable(
                &mut errs,
                new,
                old,
                "/spec/completions",
                &spec.child("completions"),
            );
        } else if new.pointer("/spec/completions") != old.pointer("/spec/completions") {
            if let Some(c) = int_at(new, "/spec/completions") {
                if Some(c) != int_at(new, "/spec/parallelism") {
                    errs.push(FieldError::invalid(
                        &spec.child("completions"),
                        json!(c),
                        "can only be modified in tandem with spec.parallelism",
                    ));
                }
            }
        }
        immutable(
            &mut errs,
            new,
            old,
            "/spec/selector",
            &spec.child("selector"),
        );
        // The template may change only while the job is suspended, and then only its
        // scheduling directives.
        let directives = |t: Option<&Value>| {
            let mut t = t.cloned().unwrap_or(Value::Null);
            if let Some(m) = t.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("labels");
                m.remove("annotations");
            }
            if let Some(s) = t.get_mut("spec").and_then(Value::as_object_mut) {
                for k in ["nodeSelector", "tolerations", "schedulingGates"] {
                    s.remove(k);
                }
                if let Some(a) = s.get_mut("affinity").and_then(Value::as_object_mut) {
                    a.remove("nodeAffinity");
                    if a.is_empty() {
                        s.remove("affinity");
                    }
                }
            }
            t
        };
        let (nt, ot) = (new.pointer("/spec/template"), old.pointer("/spec/template"));
        let suspended = old.pointer("/spec/suspend") == Some(&json!(true));
        let changed = if suspended {
            directives(nt) != directives(ot)
        } else {
            nt != ot
        };
        if changed {
            // Upstream shows its internal template, whose metadata is inline.
            let mut shown = nt.cloned().unwrap_or(Value::Null);
            if let Some(o) = shown.as_object_mut() {
                if let Some(Value::Object(m)) = o.remove("metadata") {
                    let spec = o.remove("spec");
                    o.extend(m);
                    if let Some(s) = spec {
                        o.insert("spec".into(), s);
                    }
                }
            }
            errs.push(FieldError::invalid(
                &spec.child("template"),
                shown,
                "field is immutable",
            ));
        }
        for field in [
            "completionMode",
            "podFailurePolicy",
            "backoffLimitPerIndex",
            "managedBy",
            "successPolicy",
        ] {
            immutable(
                &mut errs,
                new,
                old,
                &format!("/spec/{field}"),
                &spec.child(field),
            );
        }
        name_allows_completions(&mut errs, new);
        errs
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Status", "string", "Status of the job."),
            col("Completions", "string", "Pods that succeeded."),
            col("Duration", "string", "Time required to complete the job."),
            Column::AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let succeeded = int_at(obj, "/status/succeeded").unwrap_or(0);
        let completions = match int_at(obj, "/spec/completions") {
            Some(c) => format!("{succeeded}/{c}"),
            None => match int_at(obj, "/spec/parallelism").unwrap_or(0) {
                p if p > 1 => format!("{succeeded}/1 of {p}"),
                _ => format!("{succeeded}/1"),
            },
        };
        let time = |p: &str| {
            obj.pointer(p)
                .and_then(Value::as_str)
                .and_then(crate::time::parse_rfc3339)
        };
        let duration = match (time("/status/startTime"), time("/status/completionTime")) {
            (None, _) => String::new(),
            (Some(s), None) => crate::time::human_duration(crate::time::now_secs() - s),
            (Some(s), Some(c)) => crate::time::human_duration(c - s),
        };
        let condition = |t: &str| {
            obj.pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| str_at(c, "/type") == t))
                .is_some_and(|c| str_at(c, "/status") == "True")
        };
        let status = if condition("Complete") {
            "Complete"
        } else if condition("Failed") {
            "Failed"
        } else if obj.pointer("/metadata/deletionTimestamp").is_some() {
            "Terminating"
        } else if condition("Suspended") {
            "Suspended"
        } else if condition("FailureTarget") {
            "FailureTarget"
        } else if condition("SuccessCriteriaMet") {
            "SuccessCriteriaMet"
        } else {
            "Running"
        };
        let (names, images) = container_cells(obj, "/spec/template/spec");
        vec![
            json!(name_of(obj)),
            json!(status),
            json!(completions),
            json!(duration),
            json!(age_of(obj)),
            json!(names),
            json!(images),
            json!(format_label_selector(obj.pointer("/spec/selector"))),
        ]
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        let succeeded = int_at(obj, "/status/succeeded").unwrap_or(0);
        vec![("status.successful", succeeded.to_string())]
    }
}

/// An Indexed job's pods are named `<job>-<index>`, which must be a DNS label.
fn name_allows_completions(errs: &mut Vec<FieldError>, obj: &Value) {
    if str_at(obj, "/spec/completionMode") != "Indexed" {
        return;
    }
    let Some(c) = int_at(obj, "/spec/completions").filter(|c| *c > 0) else {
        return;
    };
    let name = name_of(obj);
    let hostname = format!("{name}-{}", c - 1);
    if !kumo_apimachinery::validation::is_dns1123_label(&hostname).is_empty() {
        errs.push(FieldError::invalid(
            &Path::new("metadata").child("name"),
            name.to_owned(),
            format!("will not able to create pod with invalid DNS label: {hostname}"),
        ));
    }
}

// ---------------------------------------------------------------------------------------
// CronJobs
// ---------------------------------------------------------------------------------------

struct CronJobs;

fn default_cron_job(obj: &mut Value) {
    let spec = object_at(obj, "/spec");
    default_field(spec, "concurrencyPolicy", json!("Allow"));
    default_field(spec, "suspend", json!(false));
    default_field(spec, "successfulJobsHistoryLimit", json!(3));
    default_field(spec, "failedJobsHistoryLimit", json!(1));
    // SetDefaults_Job does not apply to the job template; its pod template gets the pod
    // defaults.
    default_field(object_at(obj, "/spec/jobTemplate"), "metadata", json!({}));
    super::apps::default_template(obj, "/spec/jobTemplate/spec/template");
}

fn validate_cron_job(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let path = Path::new("spec");
    let schedule = str_at(obj, "/spec/schedule");
    let time_zone = obj.pointer("/spec/timeZone").and_then(Value::as_str);
    if schedule.is_empty() {
        errs.push(FieldError::required(&path.child("schedule"), ""));
    } else {
        let allow_tz = old.is_some_and(|o| str_at(o, "/spec/schedule").contains("TZ"));
        if let Err(e) = parse_cron(schedule) {
            errs.push(FieldError::invalid(
                &path.child("schedule"),
                schedule.to_owned(),
                e,
            ));
        }
        if allow_tz && schedule.contains("TZ") && time_zone.is_some() {
            errs.push(FieldError::invalid(
                &path.child("schedule"),
                schedule.to_owned(),
                "cannot use both timeZone field and TZ or CRON_TZ in schedule",
            ));
        } else if !allow_tz && schedule.contains("TZ") {
            errs.push(FieldError::invalid(
                &path.child("schedule"),
                schedule.to_owned(),
                "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
            ));
        }
    }
    nonneg(
        &mut errs,
        obj,
        "/spec/startingDeadlineSeconds",
        &path.child("startingDeadlineSeconds"),
    );
    let tz_changed =
        old.is_none_or(|o| o.pointer("/spec/timeZone") != obj.pointer("/spec/timeZone"));
    if let Some(tz) = time_zone.filter(|_| tz_changed) {
        validate_time_zone(&mut errs, tz, &path.child("timeZone"));
    }
    match str_at(obj, "/spec/concurrencyPolicy") {
        "Allow" | "Forbid" | "Replace" => {}
        "" => errs.push(FieldError::required(&path.child("concurrencyPolicy"), "")),
        other => errs.push(FieldError::not_supported(
            &path.child("concurrencyPolicy"),
            other.to_owned(),
            &["Allow", "Forbid", "Replace"],
        )),
    }
    let jt = path.child("jobTemplate");
    let job_spec = obj
        .pointer("/spec/jobTemplate/spec")
        .unwrap_or(&Value::Null);
    validate_job_spec(&mut errs, job_spec, &jt.child("spec"));
    if let Some(s) = job_spec.get("selector").filter(|s| !s.is_null()) {
        errs.push(FieldError::invalid(
            &jt.child("spec").child("selector"),
            s.clone(),
            "`selector` will be auto-generated",
        ));
    }
    if job_spec.get("manualSelector") == Some(&json!(true)) {
        errs.push(FieldError::not_supported(
            &jt.child("spec").child("manualSelector"),
            json!(true),
            &["nil", "false"],
        ));
    }
    nonneg(
        &mut errs,
        obj,
        "/spec/successfulJobsHistoryLimit",
        &path.child("successfulJobsHistoryLimit"),
    );
    nonneg(
        &mut errs,
        obj,
        "/spec/failedJobsHistoryLimit",
        &path.child("failedJobsHistoryLimit"),
    );
    errs
}

/// upstream's validateTimeZone, with the system's time zone database.
fn validate_time_zone(errs: &mut Vec<FieldError>, tz: &str, path: &Path) {
    if tz.is_empty() {
        errs.push(FieldError::invalid(
            path,
            tz.to_owned(),
            "timeZone must be nil or non-empty string",
        ));
        return;
    }
    let valid_part = |p: &str| {
        p != "."
            && p != ".."
            && !p.starts_with('-')
            && !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+'))
    };
    if !tz.split('/').all(valid_part) {
        errs.push(FieldError::invalid(
            path,
            tz.to_owned(),
            format!("unknown time zone {tz}"),
        ));
        return;
    }
    if tz.eq_ignore_ascii_case("Local") {
        errs.push(FieldError::invalid(
            path,
            tz.to_owned(),
            "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones",
        ));
        return;
    }
    let db = std::path::Path::new("/usr/share/zoneinfo");
    if tz != "UTC" && db.is_dir() && !db.join(tz).is_file() {
        errs.push(FieldError::invalid(
            path,
            tz.to_owned(),
            format!("unknown time zone {tz}"),
        ));
    }
}

/// Parses a cron schedule as the standard parser upstream uses (five fields, or a
/// descriptor such as `@hourly`), with its error messages.
fn parse_cron(spec: &str) -> Result<(), String> {
    if spec.is_empty() {
        return Err("empty spec string".into());
    }
    let mut spec = spec;
    if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
        let i = spec.find(' ').unwrap_or(spec.len());
        spec = spec[i..].trim();
    }
    if let Some(d) = spec.strip_prefix('@') {
        return match d {
            "yearly" | "annually" | "monthly" | "weekly" | "daily" | "midnight" | "hourly" => {
                Ok(())
            }
            _ if d.starts_with("every ") => Ok(()),
            _ => Err(format!("unrecognized descriptor: {spec}")),
        };
    }
    let fields: Vec<&str> = spec.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected exactly 5 fields, found {}: [{}]",
            fields.len(),
            fields.join(" ")
        ));
    }
    const MONTHS: &[&str] = &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    const DAYS: &[&str] = &["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
    let bounds: [(u64, u64, &[&str], u64); 5] = [
        (0, 59, &[], 0),
        (0, 23, &[], 0),
        (1, 31, &[], 0),
        (1, 12, MONTHS, 1),
        (0, 6, DAYS, 0),
    ];
    for (field, (min, max, names, first)) in fields.iter().zip(bounds) {
        for expr in field.split(',').filter(|e| !e.is_empty()) {
            cron_range(expr, min, max, names, first)?;
        }
    }
    Ok(())
}

fn cron_int(expr: &str) -> Result<u64, String> {
    match expr.parse::<i64>() {
        Ok(n) if n < 0 => Err(format!("negative number ({n}) not allowed: {expr}")),
        Ok(n) => Ok(n as u64),
        Err(e) => {
            let why = if matches!(
                e.kind(),
                std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow
            ) {
                "value out of range"
            } else {
                "invalid syntax"
            };
            Err(format!(
                "failed to parse int from {expr}: strconv.Atoi: parsing {}: {why}",
                kumo_apimachinery::validation::go_quote(expr)
            ))
        }
    }
}

fn cron_range(expr: &str, min: u64, max: u64, names: &[&str], first: u64) -> Result<(), String> {
    let int_or_name = |s: &str| -> Result<u64, String> {
        let lower = s.to_ascii_lowercase();
        match names.iter().position(|n| *n == lower) {
            Some(i) => Ok(i as u64 + first),
            None => cron_int(s),
        }
    };
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_high: Vec<&str> = range_and_step[0].split('-').collect();
    let (start, mut end) = if low_high[0] == "*" || low_high[0] == "?" {
        (min, max)
    } else {
        let start = int_or_name(low_high[0])?;
        match low_high.len() {
            1 => (start, start),
            2 => (start, int_or_name(low_high[1])?),
            _ => return Err(format!("too many hyphens: {expr}")),
        }
    };
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            let step = cron_int(range_and_step[1])?;
            if low_high.len() == 1 {
                end = max;
            }
            step
        }
        _ => return Err(format!("too many slashes: {expr}")),
    };
    if start < min {
        return Err(format!(
            "beginning of range ({start}) below minimum ({min}): {expr}"
        ));
    }
    if end > max {
        return Err(format!(
            "end of range ({end}) above maximum ({max}): {expr}"
        ));
    }
    if start > end {
        return Err(format!(
            "beginning of range ({start}) beyond end of range ({end}): {expr}"
        ));
    }
    if step == 0 {
        return Err(format!("step of range should be a positive number: {expr}"));
    }
    Ok(())
}

impl Strategy for CronJobs {
    fn prepare_create(&self, obj: &mut Value) {
        default_cron_job(obj);
        obj["status"] = json!({});
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_cron_job(new);
        keep_status(new, old);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = validate_cron_job(obj, None);
        let name = name_of(obj);
        // The controller appends an 11-character suffix to job names.
        if name.len() > 52 {
            errs.push(FieldError::invalid(
                &Path::new("metadata").child("name"),
                name.to_owned(),
                "must be no more than 52 characters",
            ));
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        validate_cron_job(new, Some(old))
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Schedule", "string", "The schedule in Cron format."),
            col("Timezone", "string", "The time zone of the schedule."),
            col("Suspend", "boolean", "Whether new runs are suspended."),
            col("Active", "integer", "Jobs currently running."),
            col("Last Schedule", "string", "When a job was last scheduled."),
            Column::AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let last = match obj
            .pointer("/status/lastScheduleTime")
            .and_then(Value::as_str)
        {
            Some(t) => crate::time::age(Some(t)),
            None => "<none>".to_owned(),
        };
        let tz = obj
            .pointer("/spec/timeZone")
            .and_then(Value::as_str)
            .unwrap_or("<none>");
        let suspend = match obj.pointer("/spec/suspend").and_then(Value::as_bool) {
            Some(b) => if b { "True" } else { "False" }.to_owned(),
            None => "<unset>".to_owned(),
        };
        let active = obj
            .pointer("/status/active")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let (names, images) = container_cells(obj, "/spec/jobTemplate/spec/template/spec");
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/schedule")),
            json!(tz),
            json!(suspend),
            json!(active),
            json!(last),
            json!(age_of(obj)),
            json!(names),
            json!(images),
            json!(format_label_selector(
                obj.pointer("/spec/jobTemplate/spec/selector")
            )),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_schedules() {
        assert!(parse_cron("*/5 * * * *").is_ok());
        assert!(parse_cron("@hourly").is_ok());
        assert!(parse_cron("* * * JAN-MAR MON").is_ok());
        assert_eq!(
            parse_cron("hello").unwrap_err(),
            "expected exactly 5 fields, found 1: [hello]"
        );
        assert_eq!(
            parse_cron("61 * * * *").unwrap_err(),
            "end of range (61) above maximum (59): 61"
        );
        assert_eq!(
            parse_cron("*/0 * * * *").unwrap_err(),
            "step of range should be a positive number: */0"
        );
        assert_eq!(
            parse_cron("a * * * *").unwrap_err(),
            "failed to parse int from a: strconv.Atoi: parsing \"a\": invalid syntax"
        );
        assert_eq!(
            parse_cron("5-1 * * * *").unwrap_err(),
            "beginning of range (5) beyond end of range (1): 5-1"
        );
    }

    #[test]
    fn job_defaults_and_selector() {
        let mut j = json!({"metadata": {"name": "j", "uid": "u1"}, "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}});
        Jobs.prepare_create(&mut j);
        assert_eq!(j["spec"]["completions"], 1);
        assert_eq!(j["spec"]["backoffLimit"], 6);
        assert_eq!(j["spec"]["selector"]["matchLabels"][CONTROLLER_UID], "u1");
        assert_eq!(j["spec"]["template"]["metadata"]["labels"][JOB_NAME], "j");
        assert_eq!(j["metadata"]["labels"][LEGACY_JOB_NAME], "j");
        assert!(Jobs.validate(&j).is_empty(), "{:?}", Jobs.validate(&j));
    }
}
