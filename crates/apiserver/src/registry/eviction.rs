//! `pods/eviction`: a pod is deleted only if its PodDisruptionBudget allows one more
//! disruption, which the eviction takes (status.disruptionsAllowed decremented, the pod
//! recorded in status.disruptedPods) before deleting it, as upstream's EvictionREST does.
//! `kubectl drain` evicts through it.

use std::collections::BTreeMap;

use async_trait::async_trait;
use kumo_apimachinery::selector::LabelSelector;
use kumo_apimachinery::status::{ApiError, Cause, Details, GroupResource};
use serde_json::{json, Value};

use crate::auth::{Review, ReviewContext};
use crate::negotiate::Accept;
use crate::registry::{name_of, Registry, Resource};
use crate::rest::{Reply, Request, Rest};

/// The eviction subresource of pods.
pub struct Eviction;

/// The most pods a PDB's status may list as disrupted (upstream's MaxDisruptedPodSize).
const MAX_DISRUPTED_PODS: usize = 2000;

fn request<'a>(
    query: &'a BTreeMap<String, String>,
    content_type: &'a str,
    body: &'a [u8],
) -> Request<'a> {
    Request {
        query,
        accept: Accept::OBJECT,
        content_type: Some(content_type),
        body,
    }
}

fn object(reply: Reply) -> Result<Value, ApiError> {
    match reply {
        Reply::Json(_, v) => Ok(v),
        Reply::Raw(_, b) => serde_json::from_slice(&b).map_err(ApiError::internal),
        Reply::Stream(_) => Err(ApiError::internal("unexpected stream")),
    }
}

fn find(
    registry: &Registry,
    group: &str,
    version: &str,
    plural: &str,
) -> Result<std::sync::Arc<Resource>, ApiError> {
    registry
        .find(group, version, plural)
        .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn i64_at(v: &Value, p: &str) -> i64 {
    v.pointer(p).and_then(Value::as_i64).unwrap_or(0)
}

/// 429 TooManyRequests with a DisruptionBudget cause.
fn too_many_requests(retry_after: u32, cause: String) -> ApiError {
    ApiError {
        code: 429,
        reason: "TooManyRequests",
        message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        details: Some(Box::new(Details {
            causes: vec![Cause {
                reason: "DisruptionBudget".into(),
                message: cause,
                field: String::new(),
            }],
            retry_after_seconds: Some(retry_after),
            ..Default::default()
        })),
    }
}

impl Eviction {
    /// The budgets in the pod's namespace whose selector matches it (a missing selector
    /// matches nothing).
    async fn budgets(
        rest: &Rest,
        pdbs: &Resource,
        ns: &str,
        pod: &Value,
    ) -> Result<Vec<Value>, ApiError> {
        let query = BTreeMap::new();
        let list = object(
            rest.list(pdbs, Some(ns), &request(&query, "application/json", &[]))
                .await?,
        )?;
        let labels: BTreeMap<String, String> = pod
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(list
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|pdb| {
                pdb.pointer("/spec/selector")
                    .filter(|s| !s.is_null())
                    .and_then(|s| LabelSelector::from_json(s).ok())
                    .is_some_and(|sel| sel.matches(&labels))
            })
            .cloned()
            .collect())
    }

    /// Takes one disruption from `pdb` (upstream's checkAndDecrement): 429 while the
    /// budget allows none or is not yet processed.
    async fn take_disruption(
        rest: &Rest,
        pdbs: &Resource,
        ns: &str,
        pod_name: &str,
        mut pdb: Value,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let name = name_of(&pdb).to_owned();
        for attempt in 0..5 {
            if attempt > 0 {
                let query = BTreeMap::new();
                pdb = object(
                    rest.get(
                        pdbs,
                        Some(ns),
                        &name,
                        &request(&query, "application/json", &[]),
                    )
                    .await?,
                )?;
            }
            if i64_at(&pdb, "/status/observedGeneration") < i64_at(&pdb, "/metadata/generation") {
                return Err(too_many_requests(
                    10,
                    format!("The disruption budget {name} is still being processed by the server."),
                ));
            }
            let allowed = i64_at(&pdb, "/status/disruptionsAllowed");
            let gr = GroupResource::new("policy", "poddisruptionbudget");
            if allowed < 0 {
                return Err(ApiError::forbidden(
                    &gr,
                    &name,
                    "pdb disruptions allowed is negative",
                ));
            }
            let disrupted = pdb
                .pointer("/status/disruptedPods")
                .and_then(Value::as_object)
                .map_or(0, |m| m.len());
            if disrupted > MAX_DISRUPTED_PODS {
                return Err(ApiError::forbidden(
                    &gr,
                    &name,
                    "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
                ));
            }
            if allowed == 0 {
                return Err(too_many_requests(
                    0,
                    format!(
                        "The disruption budget {name} needs {} healthy pods and has {} currently",
                        i64_at(&pdb, "/status/desiredHealthy"),
                        i64_at(&pdb, "/status/currentHealthy")
                    ),
                ));
            }
            if dry_run {
                return Ok(());
            }
            let generation = i64_at(&pdb, "/metadata/generation");
            let status = pdb
                .as_object_mut()
                .map(|o| o.entry("status").or_insert_with(|| json!({})))
                .ok_or_else(|| ApiError::internal("budget is not an object"))?;
            status["disruptionsAllowed"] = json!(allowed - 1);
            if !status.get("disruptedPods").is_some_and(Value::is_object) {
                status["disruptedPods"] = json!({});
            }
            status["disruptedPods"][pod_name] = json!(crate::time::now_rfc3339());
            if allowed - 1 == 0 {
                set_condition(
                    status,
                    json!({
                        "type": "DisruptionAllowed",
                        "status": "False",
                        "reason": "InsufficientPods",
                        "message": "",
                        "observedGeneration": generation,
                        "lastTransitionTime": crate::time::now_rfc3339(),
                    }),
                );
            }
            // The resourceVersion in the body makes the write a compare-and-swap.
            let body = pdb.to_string();
            let query = BTreeMap::new();
            match rest
                .update(
                    pdbs,
                    Some(ns),
                    &name,
                    Some("status"),
                    &request(&query, "application/json", body.as_bytes()),
                )
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ApiError::timeout(format!(
            "couldn't update PodDisruptionBudget \"{name}\" due to conflicts"
        )))
    }
}

/// Replaces the condition of the same type, or adds it.
fn set_condition(status: &mut Value, cond: Value) {
    if !status.get("conditions").is_some_and(Value::is_array) {
        status["conditions"] = json!([]);
    }
    if let Some(list) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        match list.iter_mut().find(|c| c["type"] == cond["type"]) {
            Some(c) if c["status"] == cond["status"] => {
                c["reason"] = cond["reason"].clone();
                c["message"] = cond["message"].clone();
            }
            Some(c) => *c = cond,
            None => list.push(cond),
        }
    }
}

#[async_trait]
impl Review for Eviction {
    fn serves(&self) -> (&'static str, &'static str, &'static str) {
        ("", "pods", "eviction")
    }

    async fn create(&self, ctx: ReviewContext<'_>) -> Result<(u16, Value), ApiError> {
        let ns = ctx.namespace.unwrap_or("default");
        let name = ctx.name.unwrap_or("");
        if ctx.body.get("kind").and_then(Value::as_str) != Some("Eviction") {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type Eviction): {}",
                ctx.body
                    .get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or("no kind")
            )));
        }
        if ctx.body.pointer("/metadata/name").and_then(Value::as_str) != Some(name) {
            return Err(ApiError::bad_request(
                "name in URL does not match name in Eviction object",
            ));
        }
        let pods = find(ctx.registry, "", "v1", "pods")?;
        let pdbs = find(ctx.registry, "policy", "v1", "poddisruptionbudgets")?;
        let mut delete_options = ctx
            .body
            .get("deleteOptions")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        let dry_run = ctx.dry_run
            || delete_options
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v == "All"));
        if dry_run {
            delete_options["dryRun"] = json!(["All"]);
        }
        let query = BTreeMap::new();
        let pod = object(
            ctx.rest
                .get(
                    &pods,
                    Some(ns),
                    name,
                    &request(&query, "application/json", &[]),
                )
                .await?,
        )?;
        let phase = crate::registry::str_at(&pod, "/status/phase");
        // A terminal, pending or terminating pod disrupts nothing more: deleted directly.
        let ignore_budget = matches!(phase, "Succeeded" | "Failed" | "Pending")
            || pod
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|v| !v.is_null());
        if !ignore_budget {
            let budgets = Self::budgets(ctx.rest, &pdbs, ns, &pod).await?;
            if budgets.len() > 1 {
                return Err(ApiError {
                    code: 500,
                    reason: "",
                    message: "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into(),
                    details: None,
                });
            }
            if let Some(pdb) = budgets.into_iter().next() {
                let unhealthy = !is_ready(&pod);
                let always_allow =
                    crate::registry::str_at(&pdb, "/spec/unhealthyPodEvictionPolicy")
                        == "AlwaysAllow";
                let healthy_enough = i64_at(&pdb, "/status/currentHealthy")
                    >= i64_at(&pdb, "/status/desiredHealthy")
                    && i64_at(&pdb, "/status/desiredHealthy") > 0;
                if unhealthy && (always_allow || healthy_enough) {
                    // An unready pod does not count towards the budget: delete it, but
                    // only as it is now.
                    if delete_options
                        .pointer("/preconditions/resourceVersion")
                        .is_none()
                    {
                        delete_options["preconditions"]["resourceVersion"] = pod
                            .pointer("/metadata/resourceVersion")
                            .cloned()
                            .unwrap_or(Value::Null);
                    }
                } else {
                    Self::take_disruption(ctx.rest, &pdbs, ns, name, pdb, dry_run).await?;
                }
            }
        }
        if !dry_run {
            // The preconditions hold for the pod the condition is added to (upstream's
            // addConditionAndDeletePod), and the resourceVersion one then follows that write.
            let gr = GroupResource::new("", "Pod");
            let want = |f: &str| {
                delete_options
                    .pointer(&format!("/preconditions/{f}"))
                    .and_then(Value::as_str)
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned)
            };
            let have =
                |f: &str| crate::registry::str_at(&pod, &format!("/metadata/{f}")).to_owned();
            if let Some(uid) = want("uid").filter(|u| *u != have("uid")) {
                return Err(ApiError::conflict(&gr, name, &format!(
                    "the UID in the precondition ({uid}) does not match the UID in record ({}). The object might have been deleted and then recreated",
                    have("uid")
                )));
            }
            if let Some(rv) = want("resourceVersion").filter(|r| *r != have("resourceVersion")) {
                return Err(ApiError::conflict(&gr, name, &format!(
                    "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({}). The object might have been modified",
                    have("resourceVersion")
                )));
            }
            // The pod is told why it goes (the DisruptionTarget condition).
            let patch = json!({"status": {"conditions": [{
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
                "lastTransitionTime": crate::time::now_rfc3339(),
            }]}})
            .to_string();
            let updated = object(
                ctx.rest
                    .patch(
                        &pods,
                        Some(ns),
                        name,
                        Some("status"),
                        &request(
                            &query,
                            "application/strategic-merge-patch+json",
                            patch.as_bytes(),
                        ),
                    )
                    .await?,
            )?;
            if want("resourceVersion").is_some() {
                delete_options["preconditions"]["resourceVersion"] = updated
                    .pointer("/metadata/resourceVersion")
                    .cloned()
                    .unwrap_or(Value::Null);
            }
        }
        let body = delete_options.to_string();
        ctx.rest
            .delete(
                &pods,
                Some(ns),
                name,
                &request(&query, "application/json", body.as_bytes()),
            )
            .await?;
        Ok((
            201,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        ))
    }
}
