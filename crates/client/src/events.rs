//! Core/v1 events as client-go's legacy recorder writes them for kumo's components: one Event
//! per distinct source, object, type, reason and message (the EventCorrelator's key);
//! a repeat bumps that Event's `count` and `lastTimestamp` instead of making a new one.
//! The recorded keys live in one process-wide map, bounded like client-go's LRU. Failures
//! are logged, never fatal.

use std::collections::HashMap;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Resource;
use parking_lot::Mutex;
use serde_json::json;

use crate::clients::ClientSource;

/// A recorded event: its namespace, name and count.
type Recorded = (String, String, i32);

/// Events recorded, by correlation key.
static SEEN: LazyLock<Mutex<HashMap<String, Recorded>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Upstream's LRU size for event correlation.
const MAX_SEEN: usize = 4096;

/// The reference an event makes to `obj` (kind, apiVersion, namespace, name, uid,
/// resourceVersion).
pub fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    let m = obj.meta();
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        ..Default::default()
    }
}

/// Records an event about `object` from `component` (events of cluster-scoped objects go
/// to `default`, as upstream's recorder puts them).
pub async fn record(
    client: &ClientSource,
    component: &str,
    object: ObjectReference,
    type_: &str,
    reason: &str,
    msg: String,
) {
    record_from(&client.get(), component, None, object, type_, reason, msg).await
}

/// [`record`] with the client to write with and the host the component runs on (the
/// kubelet names its node: `source.host` and `reportingInstance`).
pub async fn record_from(
    client: &kube::Client,
    component: &str,
    host: Option<&str>,
    object: ObjectReference,
    type_: &str,
    reason: &str,
    msg: String,
) {
    let ns = object
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into());
    let key = format!(
        "{component}\u{0}{}\u{0}{}\u{0}{}\u{0}{ns}\u{0}{}\u{0}{}\u{0}{}\u{0}{type_}\u{0}{reason}\u{0}{msg}",
        host.unwrap_or(""),
        object.api_version.as_deref().unwrap_or(""),
        object.kind.as_deref().unwrap_or(""),
        object.name.as_deref().unwrap_or(""),
        object.field_path.as_deref().unwrap_or(""),
        object.uid.as_deref().unwrap_or(""),
    );
    let now = Timestamp::now();
    let prior = SEEN.lock().get(&key).cloned();
    if let Some((ev_ns, ev_name, count)) = prior {
        let patch = json!({"count": count + 1, "lastTimestamp": Time(now)});
        let api: Api<Event> = Api::namespaced(client.clone(), &ev_ns);
        if api
            .patch(&ev_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .is_ok()
        {
            SEEN.lock().insert(key, (ev_ns, ev_name, count + 1));
            return;
        }
    }
    let name = format!(
        "{}.{:x}",
        object.name.as_deref().unwrap_or_default(),
        now.as_nanosecond()
    );
    let ev = Event {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: object,
        reason: Some(reason.into()),
        message: Some(msg),
        type_: Some(type_.into()),
        source: Some(EventSource {
            component: Some(component.into()),
            host: host.map(str::to_owned),
        }),
        reporting_component: Some(component.into()),
        reporting_instance: host.map(str::to_owned),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    match api.create(&PostParams::default(), &ev).await {
        Ok(_) => {
            let mut seen = SEEN.lock();
            if seen.len() >= MAX_SEEN {
                seen.clear();
            }
            seen.insert(key, (ns, name, 1));
        }
        Err(e) => tracing::warn!(component, reason, error = %e, "recording an event failed"),
    }
}
