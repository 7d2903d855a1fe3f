//! Events through the events.k8s.io/v1 API, as client-go's tools/events recorder writes
//! them (the scheduler's): one Event per (object, reason, action, note) and, for repeats
//! within six minutes, a `series` count on the existing one. The legacy core/v1
//! recorder is [`crate::events`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use parking_lot::Mutex;
use serde_json::json;

/// How long a repeat is folded into the earlier event's series.
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// How often expired series entries are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Records a component's events.
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    series: Mutex<Series>,
}

/// Recent events by what they say: (event name, count, last seen).
struct Series {
    entries: HashMap<String, (String, i32, Instant)>,
    last_sweep: Instant,
}

impl Recorder {
    /// A recorder reporting as `controller` (`default-scheduler`) from `instance`.
    pub fn new(client: Client, controller: &str, instance: String) -> Self {
        Recorder {
            client,
            controller: controller.to_owned(),
            instance,
            series: Mutex::new(Series {
                entries: HashMap::new(),
                last_sweep: Instant::now(),
            }),
        }
    }

    /// Records an event about `pod`; failures are logged, never returned.
    pub async fn pod_event(&self, pod: &Pod, type_: &str, reason: &str, action: &str, note: &str) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        let key = format!(
            "{ns}/{name}/{}/{reason}/{action}/{note}",
            pod.metadata.uid.as_deref().unwrap_or_default()
        );
        let now = MicroTime(Timestamp::now());
        let repeat = {
            let instant = Instant::now();
            let mut s = self.series.lock();
            // Expired entries go in a sweep now and then, not on every event: one event per
            // pod scheduled would otherwise walk every event of the last six minutes.
            if instant.saturating_duration_since(s.last_sweep) > SWEEP_EVERY {
                s.last_sweep = instant;
                s.entries
                    .retain(|_, (_, _, at)| instant.saturating_duration_since(*at) < SERIES_WINDOW);
            }
            match s.entries.get_mut(&key) {
                Some((ev, count, at)) if instant.saturating_duration_since(*at) < SERIES_WINDOW => {
                    *count += 1;
                    *at = instant;
                    Some((ev.clone(), *count))
                }
                _ => None,
            }
        };
        if let Some((ev, count)) = repeat {
            let patch = json!({"series": {"count": count, "lastObservedTime": now}});
            match api
                .patch(&ev, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "patching event series failed; creating a new event")
                }
            }
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let ev_name = format!("{name}.{nanos:x}");
        let body = json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": ev_name, "namespace": ns},
            "eventTime": now,
            "action": action,
            "reason": reason,
            "note": note,
            "type": type_,
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "regarding": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": name,
                "namespace": ns,
                "uid": pod.metadata.uid,
                "resourceVersion": pod.metadata.resource_version,
            },
        });
        let ev: Event = match serde_json::from_value(body) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "building event failed");
                return;
            }
        };
        match api.create(&PostParams::default(), &ev).await {
            Ok(_) => {
                self.series
                    .lock()
                    .entries
                    .insert(key, (ev_name, 1, Instant::now()));
            }
            Err(e) => tracing::warn!(error = %e, reason, "recording event failed"),
        }
    }
}
