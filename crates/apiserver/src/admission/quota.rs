//! ResourceQuota admission (upstream's `ResourceQuota` plugin, validating phase).
//!
//! Every create (and the updates the evaluators care about) of an object in a namespace
//! with ResourceQuotas is charged against each matching quota's `status.hard`; the new
//! `status.used` is written back with a compare-and-swap before the object is stored, as
//! upstream's quota evaluator does, so two writers cannot both take the last unit.
//! Quotas without `status.hard` (not yet seen by the quota controller) constrain nothing,
//! as upstream. What an object charges, and which quotas' scopes it is in, are the rules
//! of `kumo_apimachinery::quota`, shared with the quota controller.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kumo_apimachinery::quota::{
    add_lists, claim_usage_changed, is_terminating, list_json, lists_equal, mask, pretty_print,
    scope_selectors, Evaluator, IGNORED_RESOURCES,
};
use kumo_apimachinery::status::{ApiError, GroupResource};
use kumo_storage::{RangeRequest, StorageError};
use serde_json::Value;

use super::{Attributes, Operation, Plugin};

pub use kumo_apimachinery::quantity::{Format, Quantity};
pub use kumo_apimachinery::quota::{
    aggregate_containers, container_resources, pod_level_resources_set, resource_list, ResourceList,
};

// ---------------------------------------------------------------------------------------
// Shared admission helpers
// ---------------------------------------------------------------------------------------

/// admission.NewForbidden: `<resource> "<name>" is forbidden: <why>`, the name being the
/// request's, else the object's generateName, else `Unknown`.
pub fn forbidden(a: &Attributes<'_>, obj: Option<&Value>, why: &str) -> ApiError {
    let gr = a.resource.group_resource();
    let name = if !a.name.is_empty() {
        a.name.to_owned()
    } else {
        obj.and_then(|o| o.pointer("/metadata/generateName"))
            .and_then(Value::as_str)
            .filter(|g| !g.is_empty())
            .unwrap_or("Unknown")
            .to_owned()
    };
    ApiError::forbidden(&gr, &name, why)
}

/// The objects stored under `prefix`, with their revisions.
pub async fn list_stored(
    a: &Attributes<'_>,
    prefix: String,
) -> Result<Vec<(Value, i64)>, ApiError> {
    let page = a
        .rest
        .store
        .range(RangeRequest {
            prefix: prefix.into_bytes(),
            start: None,
            limit: 0,
            revision: None,
        })
        .await
        .map_err(ApiError::internal)?;
    let mut out = Vec::with_capacity(page.kvs.len());
    for kv in page.kvs {
        let v: Value = serde_json::from_slice(&kv.value).map_err(ApiError::internal)?;
        out.push((v, kv.mod_revision));
    }
    Ok(out)
}

/// One stored object, if it exists.
pub async fn get_stored(a: &Attributes<'_>, key: String) -> Result<Option<Value>, ApiError> {
    let (kv, _) = a
        .rest
        .store
        .get(key.as_bytes(), None)
        .await
        .map_err(ApiError::internal)?;
    match kv {
        Some(kv) => Ok(Some(
            serde_json::from_slice(&kv.value).map_err(ApiError::internal)?,
        )),
        None => Ok(None),
    }
}

/// Whether the evaluator charges this request (Handles, and for updates the changes
/// that move usage): creates; pod updates that enter or leave the Terminating scope and
/// resizes; service and claim updates; claim status updates that change the allocated
/// storage or the attributes classes.
fn handles(ev: &Evaluator, a: &Attributes<'_>, obj: &Value) -> bool {
    let sub = a.subresource.unwrap_or("");
    match ev {
        Evaluator::Pods => match sub {
            "" => {
                if a.operation == Operation::Update {
                    if let Some(old) = a.old {
                        if is_terminating(obj) != is_terminating(old) {
                            return true;
                        }
                    }
                }
                a.operation == Operation::Create
            }
            "resize" => a.operation == Operation::Update,
            _ => false,
        },
        Evaluator::Services => {
            sub.is_empty() && matches!(a.operation, Operation::Create | Operation::Update)
        }
        Evaluator::Claims => match sub {
            "" => matches!(a.operation, Operation::Create | Operation::Update),
            "status" => claim_usage_changed(a.old.unwrap_or(&Value::Null), obj),
            _ => false,
        },
        Evaluator::Count { .. } => sub.is_empty() && a.operation == Operation::Create,
    }
}

// ---------------------------------------------------------------------------------------
// The plugin
// ---------------------------------------------------------------------------------------

/// The `ResourceQuota` admission plugin.
#[derive(Default)]
pub struct ResourceQuota {
    /// One lock per namespace: upstream evaluates a namespace's requests one batch at a
    /// time, so the usage a request reads is the one the previous request wrote.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The resourcequotas resource, for the managed fields of the usage writes.
    quotas: std::sync::OnceLock<Option<Arc<crate::registry::Resource>>>,
}

/// A quota as read: its name, stored JSON and revision.
struct StoredQuota {
    name: String,
    obj: Value,
    rev: i64,
}

impl StoredQuota {
    fn hard(&self) -> ResourceList {
        resource_list(self.obj.pointer("/status/hard"))
    }
    fn used(&self) -> ResourceList {
        resource_list(self.obj.pointer("/status/used"))
    }
    fn selectors(&self) -> Vec<Value> {
        scope_selectors(&self.obj)
    }
}

impl ResourceQuota {
    pub fn new() -> ResourceQuota {
        ResourceQuota::default()
    }

    /// Records the usage write in managedFields as kube-apiserver's own status update
    /// (upstream writes it through its loopback client).
    fn track(&self, old: &Value, new: &mut Value) {
        let res = self
            .quotas
            .get_or_init(|| crate::registry::Registry::builtin().find("", "v1", "resourcequotas"));
        let Some(res) = res else { return };
        let query = BTreeMap::from([("fieldManager".to_owned(), "kube-apiserver".to_owned())]);
        // Bookkeeping only: a failure leaves the entries as they were.
        let _ = crate::fieldmanager::track_update(
            res,
            Some("status"),
            &query,
            crate::fieldmanager::Options::Update,
            Some(old),
            new,
        );
    }

    /// Forgets a namespace's lock nobody else holds or waits for.
    fn unlock(&self, ns: &str, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        // Ours and the map's: clones are only made under the map's lock.
        if Arc::strong_count(&lock) == 2 {
            locks.remove(ns);
        }
    }

    fn lock_for(&self, ns: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(ns.to_owned()).or_default().clone()
    }

    async fn read_quotas(
        a: &Attributes<'_>,
        ns: &str,
        only: Option<&BTreeSet<String>>,
    ) -> Result<Vec<StoredQuota>, ApiError> {
        let quotas = list_stored(a, format!("/registry/resourcequotas/{ns}/")).await?;
        Ok(quotas
            .into_iter()
            .filter_map(|(obj, rev)| {
                let name = obj.pointer("/metadata/name")?.as_str()?.to_owned();
                Some(StoredQuota { name, obj, rev })
            })
            .filter(|q| only.is_none_or(|o| o.contains(&q.name)))
            .collect())
    }

    /// CheckRequest: the new `status.used` of each quota the request charges, or why the
    /// request is refused.
    fn check(
        ev: &Evaluator,
        quotas: &[StoredQuota],
        a: &Attributes<'_>,
        obj: &Value,
    ) -> Result<Vec<Option<ResourceList>>, ApiError> {
        let now = crate::time::now_secs();
        let mut interesting = Vec::new();
        for (i, q) in quotas.iter().enumerate() {
            let hard = q.hard();
            let restricted = ev.matching(hard.keys());
            let matches_scope = q.selectors().iter().all(|s| ev.matches_scope(s, obj));
            if restricted.is_empty() || !matches_scope {
                continue;
            }
            if let Err(e) = ev.constraints(&restricted, obj) {
                return Err(forbidden(
                    a,
                    Some(obj),
                    &format!("failed quota: {}: {e}", q.name),
                ));
            }
            let used = q.used();
            if restricted.iter().any(|r| !used.contains_key(r)) {
                // Sorted, as upstream's message.
                let names: Vec<String> = restricted.into_iter().collect();
                return Err(forbidden(
                    a,
                    Some(obj),
                    &format!(
                        "status unknown for quota: {}, resources: {}",
                        q.name,
                        names.join(",")
                    ),
                ));
            }
            interesting.push(i);
        }
        let input = ev.usage(obj, now);
        let negative: Vec<&str> = input
            .iter()
            .filter(|(_, q)| q.is_negative())
            .map(|(k, _)| k.as_str())
            .collect();
        if !negative.is_empty() {
            return Err(forbidden(
                a,
                Some(obj),
                &format!(
                    "quota usage is negative for resource(s): {}",
                    negative.join(",")
                ),
            ));
        }
        let mut deltas: BTreeMap<usize, ResourceList> =
            interesting.iter().map(|i| (*i, input.clone())).collect();
        if a.operation == Operation::Update {
            let Some(old) = a.old else {
                return Err(forbidden(
                    a,
                    Some(obj),
                    "unable to get previous usage since prior version of object was not found",
                ));
            };
            let prev = ev.usage(old, now);
            // SubtractWithNonNegativeResult.
            let delta: ResourceList = input
                .iter()
                .map(|(k, q)| {
                    let d = match prev.get(k) {
                        Some(p) => q.sub(p),
                        None => *q,
                    };
                    (
                        k.clone(),
                        if d.is_negative() { Quantity::zero() } else { d },
                    )
                })
                .collect();
            for i in &interesting {
                let q = &quotas[*i];
                if q.selectors().iter().all(|s| ev.matches_scope(s, old)) {
                    deltas.insert(*i, delta.clone());
                }
            }
        }
        deltas.retain(|_, d| {
            d.retain(|_, q| !q.is_zero());
            !d.is_empty()
        });
        let mut out = vec![None; quotas.len()];
        for (i, delta) in deltas {
            let q = &quotas[i];
            let hard = q.hard();
            let used = q.used();
            let requested = mask(&delta, hard.keys());
            let new_used = add_lists(&used, &requested);
            if a.subresource != Some("status") {
                let exceeded: Vec<String> = mask(&new_used, requested.keys())
                    .iter()
                    .filter(|(k, v)| hard.get(*k).is_some_and(|h| *v > h))
                    .map(|(k, _)| k.clone())
                    .collect();
                if !exceeded.is_empty() {
                    return Err(forbidden(
                        a,
                        Some(obj),
                        &format!(
                            "exceeded quota: {}, requested: {}, used: {}, limited: {}",
                            q.name,
                            pretty_print(&mask(&requested, &exceeded)),
                            pretty_print(&mask(&used, &exceeded)),
                            pretty_print(&mask(&hard, &exceeded)),
                        ),
                    ));
                }
            }
            if !lists_equal(&new_used, &used) {
                out[i] = Some(new_used);
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Plugin for ResourceQuota {
    fn name(&self) -> &'static str {
        "ResourceQuota"
    }

    async fn validate(&self, a: &Attributes<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        let Some(ns) = a.namespace.filter(|n| !n.is_empty()) else {
            return Ok(());
        };
        let (group, plural) = (a.resource.group, a.resource.plural);
        if IGNORED_RESOURCES.contains(&(group, plural)) {
            return Ok(());
        }
        let ev = Evaluator::of(group, plural);
        // Deletes and connects charge nothing: no evaluator handles them.
        let Some(obj) = obj else { return Ok(()) };
        if !handles(&ev, a, obj) {
            return Ok(());
        }
        let lock = self.lock_for(ns);
        let result = {
            let _guard = lock.lock().await;
            self.charge(a, ns, &ev, obj).await
        };
        self.unlock(ns, lock);
        result
    }
}

impl ResourceQuota {
    /// Charges the request to the namespace's quotas (under the namespace's lock).
    async fn charge(
        &self,
        a: &Attributes<'_>,
        ns: &str,
        ev: &Evaluator,
        obj: &Value,
    ) -> Result<(), ApiError> {
        let mut only: Option<BTreeSet<String>> = None;
        // The first try and three retries on conflicting quota writes (checkQuotas).
        let mut last_err = None;
        for _ in 0..4 {
            let quotas = Self::read_quotas(a, ns, only.as_ref()).await?;
            if quotas.is_empty() {
                return match last_err {
                    Some(e) => Err(e),
                    None => Ok(()),
                };
            }
            let updates = Self::check(ev, &quotas, a, obj)?;
            if a.dry_run {
                return Ok(());
            }
            let mut failed = BTreeSet::new();
            for (q, used) in quotas.iter().zip(updates) {
                let Some(used) = used else { continue };
                let mut stored = q.obj.clone();
                stored["status"]["used"] = list_json(&used);
                self.track(&q.obj, &mut stored);
                let bytes = serde_json::to_vec(&stored).map_err(ApiError::internal)?;
                let key = format!("/registry/resourcequotas/{ns}/{}", q.name);
                match a
                    .rest
                    .store
                    .update(key.as_bytes(), bytes, Some(q.rev))
                    .await
                {
                    Ok(_) => {}
                    Err(StorageError::Conflict { .. }) | Err(StorageError::NotFound) => {
                        last_err = Some(ApiError::stale_update(
                            &GroupResource::new("", "resourcequotas"),
                            &q.name,
                        ));
                        failed.insert(q.name.clone());
                    }
                    Err(e) => return Err(ApiError::internal(e)),
                }
            }
            if failed.is_empty() {
                return Ok(());
            }
            only = Some(failed);
        }
        Err(last_err.unwrap_or_else(|| ApiError::internal("resource quota evaluation failed")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> String {
        Quantity::parse(s)
            .map(|q| q.to_string())
            .unwrap_or_else(|| "ERR".into())
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(q("0"), "0");
        assert_eq!(q("1"), "1");
        assert_eq!(q("1000m"), "1");
        assert_eq!(q("1.5"), "1500m");
        assert_eq!(q("0.5"), "500m");
        assert_eq!(q("1500"), "1500");
        assert_eq!(q("2000"), "2k");
        assert_eq!(q("1Gi"), "1Gi");
        assert_eq!(q("1024Mi"), "1Gi");
        assert_eq!(q("1536Mi"), "1536Mi");
        assert_eq!(q("512"), "512");
        assert_eq!(q("1e3"), "1e3");
        assert_eq!(q("128974848"), "128974848");
        assert_eq!(q("129e6"), "129e6");
        assert_eq!(q("123Mi"), "123Mi");
        assert_eq!(q("0.1Ki"), "102400m");
        assert_eq!(q("1n"), "1n");
        assert_eq!(q("0.0000000001"), "1n");
        assert_eq!(q("abc"), "ERR");
        assert_eq!(q("1Xi"), "ERR");
        assert_eq!(q(""), "ERR");
        assert_eq!(q("-1"), "-1");
        assert_eq!(q("1e2147483647"), "ERR");
        assert_eq!(q("1e-50"), "1e-9");
        assert_eq!(q("99999999999999999999999999999999999999999"), "ERR");
    }

    #[test]
    fn arithmetic_keeps_formats() {
        let zero = Quantity::zero();
        let gi = Quantity::parse("1Gi").expect("parses");
        assert_eq!(zero.add(&gi).to_string(), "1Gi");
        assert_eq!(gi.add(&gi).to_string(), "2Gi");
        let m = Quantity::parse("500m").expect("parses");
        assert_eq!(m.add(&m).to_string(), "1");
        assert_eq!(m.milli_value(), 500);
        assert_eq!(m.value(), 1);
    }
}
