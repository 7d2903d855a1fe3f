//! horizontal-pod-autoscaler-controller: every sync period (15 s) each
//! HorizontalPodAutoscaler (autoscaling/v2) reads its target's scale subresource (any kind
//! that has one), computes the replicas each metric asks for from the resource metrics API
//! (`metrics.k8s.io`: Resource and ContainerResource metrics, Utilization or AverageValue
//! targets), takes the largest, bounds it by min/max replicas, the downscale stabilization
//! window and the scaling policies of `spec.behavior` (or, without one, upstream's legacy
//! rules), writes the scale, and records upstream's conditions (AbleToScale, ScalingActive,
//! ScalingLimited), status (currentMetrics, replicas, lastScaleTime) and events
//! (SuccessfulRescale, FailedGetScale, FailedGetResourceMetric, ...).
//!
//! Pods, Object and External metrics need the custom and external metrics APIs, which
//! kumo does not serve: those metrics fail with the API's absence as their error.

pub mod replicas;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::{
    ContainerResourceMetricStatus, HPAScalingRules, HorizontalPodAutoscaler,
    HorizontalPodAutoscalerCondition, HorizontalPodAutoscalerStatus, MetricSpec, MetricStatus,
    MetricValueStatus, ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kumo_apimachinery::selector::LabelSelector;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::events;
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};
use kumo_client::workqueue::WorkQueue;
use replicas::{PodMetric, Readiness, Tolerances};

const SERVICE_ACCOUNT: &str = "horizontal-pod-autoscaler";
const COMPONENT: &str = "horizontal-pod-autoscaler";

/// The controller's flags, with kube-controller-manager's defaults.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// `--horizontal-pod-autoscaler-sync-period`.
    pub sync_period: Duration,
    /// `--horizontal-pod-autoscaler-tolerance`.
    pub tolerance: f64,
    /// `--horizontal-pod-autoscaler-downscale-stabilization`.
    pub downscale_stabilization: Duration,
    pub readiness: Readiness,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            sync_period: Duration::from_secs(15),
            tolerance: 0.1,
            downscale_stabilization: Duration::from_secs(300),
            readiness: Readiness::default(),
        }
    }
}

/// A past recommendation or scale change, kept in memory per HPA.
#[derive(Clone, Copy, Debug)]
struct Timed {
    value: i32,
    at: Timestamp,
}

/// What the controller remembers of an HPA between syncs.
#[derive(Debug, Default)]
struct Memory {
    recommendations: Vec<Timed>,
    scale_up: Vec<Timed>,
    scale_down: Vec<Timed>,
}

struct Ctl {
    client: ClientSource,
    hpas: Arc<Informer<HorizontalPodAutoscaler>>,
    pods: Arc<Informer<Pod>>,
    queue: Arc<WorkQueue<String>>,
    settings: Settings,
    memory: Mutex<HashMap<String, Memory>>,
    /// Keys with a sync already scheduled (one per period, whatever the events).
    scheduled: Arc<Mutex<HashSet<String>>>,
    /// Each HPA's last selector (for AmbiguousSelector).
    selectors: Mutex<HashMap<String, (String, LabelSelector)>>,
}

/// Queues `key` one sync period from now, unless it already waits.
fn schedule(
    queue: &Arc<WorkQueue<String>>,
    scheduled: &Arc<Mutex<HashSet<String>>>,
    key: String,
    after: Duration,
) {
    if !scheduled.lock().insert(key.clone()) {
        return;
    }
    let (queue, scheduled) = (Arc::downgrade(queue), scheduled.clone());
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        scheduled.lock().remove(&key);
        if let Some(q) = queue.upgrade() {
            q.add(key);
        }
    });
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    settings: Settings,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("horizontalpodautoscaler");
    let hpas = factory.informer::<HorizontalPodAutoscaler>();
    let pods = factory.informer::<Pod>();
    let scheduled: Arc<Mutex<HashSet<String>>> = Arc::default();
    let (q, s) = (queue.clone(), scheduled.clone());
    hpas.add_handler(move |c| match c {
        // As upstream's rate limiter: a new or changed HPA is looked at a period later.
        Change::Added(h) | Change::Updated { new: h, .. } => {
            schedule(&q, &s, key_of(h), settings.sync_period)
        }
        Change::Deleted(_) => {}
    });
    tokio::spawn(async move {
        tracing::info!("Starting HPA controller");
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            hpas,
            pods,
            queue: queue.clone(),
            settings,
            memory: Mutex::default(),
            scheduled,
            selectors: Mutex::default(),
        });
        if !wait_for_sync(&mut stop, async {
            ctl.hpas.wait_synced().await;
            ctl.pods.wait_synced().await;
        })
        .await
        {
            return;
        }
        let tasks = run_workers_of(
            "horizontalpodautoscaler",
            queue,
            5,
            stop,
            &ctl,
            |c, key| async move { c.process(&key).await },
        );
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down HPA controller");
    })
}

/// The autoscaling/v1 Scale of a target.
struct Scale {
    /// The Scale object as read (written back with a new spec.replicas).
    object: Value,
    /// Where it lives.
    path: String,
    replicas: i32,
    selector: String,
}

/// A condition to set: type, status, reason, message.
type Cond = (&'static str, &'static str, String, String);

fn set_condition(status: &mut HorizontalPodAutoscalerStatus, c: Cond, now: Timestamp) {
    let (type_, st, reason, message) = c;
    let list = status.conditions.get_or_insert_with(Vec::new);
    match list.iter_mut().find(|x| x.type_ == type_) {
        Some(x) => {
            if x.status != st {
                x.last_transition_time = Some(Time(now));
            }
            x.status = st.to_owned();
            x.reason = Some(reason);
            x.message = Some(message);
        }
        None => list.push(HorizontalPodAutoscalerCondition {
            type_: type_.to_owned(),
            status: st.to_owned(),
            reason: Some(reason),
            message: Some(message),
            last_transition_time: Some(Time(now)),
            ..Default::default()
        }),
    }
}

fn cond(
    type_: &'static str,
    status: &'static str,
    reason: &str,
    message: impl Into<String>,
) -> Cond {
    (type_, status, reason.to_owned(), message.into())
}

/// The quantity of `millis` of a resource (`250m`; memory in binary units, `64Mi`).
fn quantity(resource: &str, millis: i64) -> K8sQuantity {
    if resource == "memory" && millis % 1000 == 0 {
        let bytes = millis / 1000;
        if bytes % 1024 == 0 {
            if let Some(q) =
                kumo_apimachinery::quantity::Quantity::parse(&format!("{}Ki", bytes / 1024))
            {
                return K8sQuantity(q.to_string());
            }
        }
        return K8sQuantity(bytes.to_string());
    }
    let q = kumo_apimachinery::quantity::Quantity::parse(&format!("{millis}m"));
    K8sQuantity(
        q.map(|q| q.to_string())
            .unwrap_or_else(|| format!("{millis}m")),
    )
}

fn millis(q: &K8sQuantity) -> Option<i64> {
    kumo_apimachinery::quantity::Quantity::parse(&q.0).map(|q| q.milli_value() as i64)
}

/// One metric's outcome: replicas, its name for messages, its status.
struct MetricOutcome {
    replicas: i32,
    name: String,
    status: MetricStatus,
}

/// A metric that failed: the event and condition reason, the error they carry, and that
/// error as the sync returns it (wrapped with the metric's name).
struct MetricFailure {
    reason: &'static str,
    cause: String,
    error: String,
}

impl MetricFailure {
    fn new(reason: &'static str, cause: String, error: String) -> Self {
        MetricFailure {
            reason,
            cause,
            error,
        }
    }
}

impl Ctl {
    async fn event(&self, hpa: &HorizontalPodAutoscaler, type_: &str, reason: &str, msg: String) {
        events::record(
            &self.client,
            COMPONENT,
            events::reference(hpa),
            type_,
            reason,
            msg,
        )
        .await;
    }

    async fn process(&self, key: &str) -> Result<(), SyncError> {
        let Some(hpa) = self.hpas.get(key) else {
            self.memory.lock().remove(key);
            self.selectors.lock().remove(key);
            return Ok(());
        };
        if let Err(e) = self.reconcile(key, &hpa).await {
            tracing::info!(hpa = key, error = %e, "horizontal pod autoscaler sync failed");
        }
        schedule(
            &self.queue,
            &self.scheduled,
            key.to_owned(),
            self.settings.sync_period,
        );
        Ok(())
    }

    /// Reads the target's scale through its scale subresource.
    async fn get_scale(&self, hpa: &HorizontalPodAutoscaler) -> Result<Scale, String> {
        let ns = hpa.metadata.namespace.as_deref().unwrap_or_default();
        let target = &hpa.spec.scale_target_ref;
        let api_version = target.api_version.as_deref().unwrap_or("");
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None if !api_version.is_empty() => ("", api_version),
            None => {
                return Err(format!(
                    "invalid API version in scale target reference: unexpected GroupVersion string: {api_version}"
                ))
            }
        };
        let gvk = kube::api::GroupVersionKind::gvk(group, version, &target.kind);
        let (ar, _) = kube::discovery::pinned_kind(&self.client.get(), &gvk)
            .await
            .map_err(|e| format!("unable to determine resource for scale target reference: {e}"))?;
        let base = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = format!("{base}/namespaces/{ns}/{}/{}/scale", ar.plural, target.name);
        let req = http::Request::get(&path)
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let object: Value = self.client.get().request(req).await.map_err(|e| {
            format!(
                "failed to query scale subresource for {}/{ns}/{}: {}",
                target.kind,
                target.name,
                kumo_client::error::message(&e)
            )
        })?;
        Ok(Scale {
            replicas: object
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0) as i32,
            selector: object
                .pointer("/status/selector")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            object,
            path,
        })
    }

    /// Writes `replicas` into the scale, reading it again on a conflict.
    async fn update_scale(
        &self,
        hpa: &HorizontalPodAutoscaler,
        mut scale: Scale,
        replicas: i32,
    ) -> Result<(), String> {
        for attempt in 0..5 {
            scale.object["spec"]["replicas"] = json!(replicas);
            let body = serde_json::to_vec(&scale.object).map_err(|e| e.to_string())?;
            let req = http::Request::put(&scale.path)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(body)
                .map_err(|e| e.to_string())?;
            match self.client.get().request::<Value>(req).await {
                Ok(_) => return Ok(()),
                Err(e) if kumo_client::error::is_conflict(&e) && attempt < 4 => {
                    scale = self.get_scale(hpa).await?;
                }
                Err(e) => return Err(kumo_client::error::message(&e)),
            }
        }
        Err("too many conflicts".into())
    }

    /// The pods' metrics of `resource` from the resource metrics API, by pod name.
    async fn pod_metrics(
        &self,
        ns: &str,
        selector: &str,
        resource: &str,
        container: Option<&str>,
    ) -> Result<HashMap<String, PodMetric>, String> {
        let path = format!(
            "/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods?labelSelector={}",
            url_escape(selector)
        );
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let list: Value = self.client.get().request(req).await.map_err(|e| {
            format!(
                "unable to get metrics for resource {resource}: unable to fetch metrics from resource metrics API: {}",
                kumo_client::error::message(&e)
            )
        })?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        if items.is_empty() {
            return Err(format!(
                "unable to get metrics for resource {resource}: no metrics returned from resource metrics API"
            ));
        }
        let mut out = HashMap::new();
        for m in &items {
            let name = m
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let ts = m
                .get("timestamp")
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<Timestamp>().ok())
                .unwrap_or_else(Timestamp::now);
            let window = m
                .get("window")
                .and_then(Value::as_str)
                .and_then(kumo_apimachinery::time::parse_go_duration)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            let containers = m["containers"].as_array().cloned().unwrap_or_default();
            let value = match container {
                Some(c) => {
                    let Some(found) = containers.iter().find(|x| x["name"] == c) else {
                        return Err(format!(
                            "failed to get container metrics: container {c} not present in metrics for pod {ns}/{name}"
                        ));
                    };
                    found
                        .pointer(&format!("/usage/{resource}"))
                        .and_then(Value::as_str)
                        .and_then(|q| millis(&K8sQuantity(q.to_owned())))
                }
                None => {
                    // Every container's, or the pod is left out (missing).
                    let vals: Option<Vec<i64>> = containers
                        .iter()
                        .map(|x| {
                            x.pointer(&format!("/usage/{resource}"))
                                .and_then(Value::as_str)
                                .and_then(|q| millis(&K8sQuantity(q.to_owned())))
                        })
                        .collect();
                    vals.filter(|v| !v.is_empty()).map(|v| v.iter().sum())
                }
            };
            if let Some(value) = value {
                out.insert(
                    name.to_owned(),
                    PodMetric {
                        timestamp: ts,
                        window_secs: window,
                        value,
                    },
                );
            }
        }
        Ok(out)
    }

    /// One metric spec's replicas.
    async fn metric_replicas(
        &self,
        hpa: &HorizontalPodAutoscaler,
        spec: &MetricSpec,
        current: i32,
        selector: &str,
        pods: &[&Pod],
        tol: Tolerances,
    ) -> Result<MetricOutcome, MetricFailure> {
        let ns = hpa.metadata.namespace.as_deref().unwrap_or_default();
        let now = Timestamp::now();
        let (resource, container, target, reason) = match spec.type_.as_str() {
            "Resource" => {
                let r = spec.resource.as_ref().ok_or_else(|| {
                    let e = "resource metric without a resource".to_owned();
                    MetricFailure::new("FailedGetResourceMetric", e.clone(), e)
                })?;
                (
                    r.name.clone(),
                    None,
                    r.target.clone(),
                    "FailedGetResourceMetric",
                )
            }
            "ContainerResource" => {
                let r = spec.container_resource.as_ref().ok_or_else(|| {
                    let e = "container resource metric without a resource".to_owned();
                    MetricFailure::new("FailedGetContainerResourceMetric", e.clone(), e)
                })?;
                (
                    r.name.clone(),
                    Some(r.container.clone()),
                    r.target.clone(),
                    "FailedGetContainerResourceMetric",
                )
            }
            "Pods" => {
                let cause = "unable to get metric: no custom metrics API (custom.metrics.k8s.io) registered".to_owned();
                return Err(MetricFailure::new(
                    "FailedGetPodsMetric",
                    cause.clone(),
                    format!("failed to get pods metric value: {cause}"),
                ));
            }
            "Object" => {
                let cause = "unable to get metric: no custom metrics API (custom.metrics.k8s.io) registered".to_owned();
                return Err(MetricFailure::new(
                    "FailedGetObjectMetric",
                    cause.clone(),
                    format!("failed to get object metric value: {cause}"),
                ));
            }
            "External" => {
                let name = spec
                    .external
                    .as_ref()
                    .map(|e| e.metric.name.clone())
                    .unwrap_or_default();
                let cause = "unable to get external metric: no external metrics API (external.metrics.k8s.io) registered".to_owned();
                return Err(MetricFailure::new(
                    "FailedGetExternalMetric",
                    cause.clone(),
                    format!("failed to get {name} external metric value: {cause}"),
                ));
            }
            other => {
                let e = format!("unknown metric source type {other:?}");
                return Err(MetricFailure::new("InvalidMetricSourceType", e.clone(), e));
            }
        };
        // The error's wrapping: the resource for Resource, the container for
        // ContainerResource.
        let wrap = |e: String| MetricFailure {
            reason,
            error: match &container {
                Some(c) => format!("failed to get {c} container metric value: {e}"),
                None => format!("failed to get {resource} resource metric value: {e}"),
            },
            cause: e,
        };
        let suffix = if container.is_some() {
            " container"
        } else {
            ""
        };
        let metrics = |kind: &str| {
            let kind = kind.to_owned();
            let (resource, container) = (resource.clone(), container.clone());
            async move {
                self.pod_metrics(ns, selector, &resource, container.as_deref())
                    .await
                    .map_err(|e| format!("failed to get {resource} {kind}: {e}"))
            }
        };
        if let Some(avg) = target.average_value.as_ref() {
            let target_millis = millis(avg).unwrap_or(0);
            let m = metrics("usage").await.map_err(wrap)?;
            let r = replicas::average_value_replicas(
                current,
                target_millis,
                &resource,
                m,
                pods,
                tol,
                self.settings.readiness,
                now,
            )
            .map_err(|e| wrap(format!("failed to get {resource} usage: {e}")))?;
            let current = MetricValueStatus {
                average_value: Some(quantity(&resource, r.average_millis)),
                ..Default::default()
            };
            return Ok(MetricOutcome {
                replicas: r.replicas,
                name: format!("{resource}{suffix} resource"),
                status: status_of(&resource, container.as_deref(), current),
            });
        }
        let Some(util) = target.average_utilization else {
            return Err(wrap("invalid resource metric source: neither an average utilization target nor an average value (usage) target was set".into()));
        };
        let m = metrics("utilization").await.map_err(wrap)?;
        let r = replicas::utilization_replicas(
            current,
            util,
            &resource,
            container.as_deref(),
            m,
            pods,
            tol,
            self.settings.readiness,
            now,
        )
        .map_err(|e| wrap(format!("failed to get {resource} utilization: {e}")))?;
        let current = MetricValueStatus {
            average_utilization: r.utilization,
            average_value: Some(quantity(&resource, r.average_millis)),
            ..Default::default()
        };
        Ok(MetricOutcome {
            replicas: r.replicas,
            name: format!("{resource}{suffix} resource utilization (percentage of request)"),
            status: status_of(&resource, container.as_deref(), current),
        })
    }

    /// The tolerances: the flag's, or `spec.behavior`'s per direction.
    fn tolerances(&self, hpa: &HorizontalPodAutoscaler) -> Tolerances {
        let b = hpa.spec.behavior.as_ref();
        let of = |r: Option<&HPAScalingRules>| {
            r.and_then(|r| r.tolerance.as_ref())
                .and_then(|q| kumo_apimachinery::quantity::Quantity::parse(&q.0))
                .map(|q| q.as_f64())
                .unwrap_or(self.settings.tolerance)
        };
        Tolerances {
            down: of(b.and_then(|b| b.scale_down.as_ref())),
            up: of(b.and_then(|b| b.scale_up.as_ref())),
        }
    }

    async fn reconcile(&self, key: &str, hpa: &Arc<HorizontalPodAutoscaler>) -> Result<(), String> {
        let now = Timestamp::now();
        let old_status = hpa.status.clone().unwrap_or_default();
        let mut status = old_status.clone();
        let spec = hpa.spec.clone();
        let min = spec.min_replicas.unwrap_or(1);
        let max = spec.max_replicas;

        let scale = match self.get_scale(hpa).await {
            Ok(s) => s,
            Err(e) => {
                self.event(hpa, "Warning", "FailedGetScale", e.clone())
                    .await;
                set_condition(
                    &mut status,
                    cond(
                        "AbleToScale",
                        "False",
                        "FailedGetScale",
                        format!(
                            "the HPA controller was unable to get the target's current scale: {e}"
                        ),
                    ),
                    now,
                );
                self.write_status(hpa, &old_status, status).await;
                return Err(e);
            }
        };
        set_condition(
            &mut status,
            cond(
                "AbleToScale",
                "True",
                "SucceededGetScale",
                "the HPA controller was able to get the target's current scale",
            ),
            now,
        );
        let current = scale.replicas;
        {
            // The first look at an HPA starts its history with the current count.
            let mut mem = self.memory.lock();
            let m = mem.entry(key.to_owned()).or_default();
            if m.recommendations.is_empty() {
                m.recommendations.push(Timed {
                    value: current,
                    at: now,
                });
            }
        }

        let mut metric_statuses: Option<Vec<MetricStatus>> = None;
        let mut error = None;
        let (desired, reason) = if current == 0 && min != 0 {
            set_condition(
                &mut status,
                cond(
                    "ScalingActive",
                    "False",
                    "ScalingDisabled",
                    "scaling is disabled since the replica count of the target is zero",
                ),
                now,
            );
            (0, String::new())
        } else if current > max {
            (
                max,
                "Current number of replicas above Spec.MaxReplicas".to_owned(),
            )
        } else if current < min {
            (
                min,
                "Current number of replicas below Spec.MinReplicas".to_owned(),
            )
        } else {
            match self
                .compute(
                    key,
                    hpa,
                    &spec.metrics.clone().unwrap_or_default(),
                    &scale,
                    &mut status,
                    now,
                )
                .await
            {
                Err((statuses, e)) => {
                    status.current_replicas = Some(current);
                    status.current_metrics = Some(statuses);
                    self.event(hpa, "Warning", "FailedComputeMetricsReplicas", e.clone())
                        .await;
                    self.write_status(hpa, &old_status, status).await;
                    return Err(format!(
                        "failed to compute desired number of replicas based on listed metrics for {}: {e}",
                        reference(hpa)
                    ));
                }
                Ok((metric_desired, name, statuses, partial)) => {
                    metric_statuses = Some(statuses);
                    error = partial;
                    let reason = if metric_desired > current {
                        format!("{name} above target")
                    } else {
                        "All metrics below target".to_owned()
                    };
                    let normalized = match &spec.behavior {
                        None => {
                            self.normalize(key, metric_desired, current, min, max, &mut status, now)
                        }
                        Some(_) => self.normalize_with_behavior(
                            key,
                            hpa,
                            metric_desired,
                            current,
                            min,
                            max,
                            &mut status,
                            now,
                        ),
                    };
                    (normalized, reason)
                }
            }
        };

        let mut rescaled = false;
        let mut desired = desired;
        if desired != current {
            match self.update_scale(hpa, scale, desired).await {
                Ok(()) => {
                    rescaled = true;
                    set_condition(&mut status, cond("AbleToScale", "True", "SucceededRescale",
                        format!("the HPA controller was able to update the target scale to {desired}")), now);
                    self.event(
                        hpa,
                        "Normal",
                        "SuccessfulRescale",
                        format!("New size: {desired}; reason: {reason}"),
                    )
                    .await;
                    if spec.behavior.is_some() {
                        self.store_scale_event(key, current, desired, now);
                    }
                }
                Err(e) => {
                    self.event(
                        hpa,
                        "Warning",
                        "FailedRescale",
                        format!("New size: {desired}; reason: {reason}; error: {e}"),
                    )
                    .await;
                    set_condition(
                        &mut status,
                        cond(
                            "AbleToScale",
                            "False",
                            "FailedUpdateScale",
                            format!(
                                "the HPA controller was unable to update the target scale: {e}"
                            ),
                        ),
                        now,
                    );
                    status.current_replicas = Some(current);
                    if let Some(ms) = metric_statuses {
                        status.current_metrics = Some(ms);
                    }
                    self.write_status(hpa, &old_status, status).await;
                    return Err(format!("failed to rescale {}: {e}", reference(hpa)));
                }
            }
        } else {
            desired = current;
        }
        status.current_replicas = Some(current);
        status.desired_replicas = desired;
        if let Some(ms) = metric_statuses {
            status.current_metrics = Some(ms);
        }
        if rescaled {
            status.last_scale_time = Some(Time(now));
        }
        self.write_status(hpa, &old_status, status).await;
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every metric's replicas, the largest with its name; statuses in spec order (a
    /// failed one is an empty status). Fails outright when every metric failed, or when
    /// some failed and the rest would scale down.
    async fn compute(
        &self,
        key: &str,
        hpa: &HorizontalPodAutoscaler,
        metrics: &[MetricSpec],
        scale: &Scale,
        status: &mut HorizontalPodAutoscalerStatus,
        now: Timestamp,
    ) -> Result<(i32, String, Vec<MetricStatus>, Option<String>), (Vec<MetricStatus>, String)> {
        let ns = hpa.metadata.namespace.as_deref().unwrap_or_default();
        if scale.selector.is_empty() {
            let e = "selector is required".to_owned();
            self.event(hpa, "Warning", "SelectorRequired", e.clone())
                .await;
            set_condition(
                status,
                cond(
                    "ScalingActive",
                    "False",
                    "InvalidSelector",
                    "the HPA target's scale is missing a selector",
                ),
                now,
            );
            return Err((Vec::new(), e));
        }
        let selector = match LabelSelector::parse(&scale.selector) {
            Ok(s) => s,
            Err(e) => {
                let msg = format!(
                    "couldn't convert selector into a corresponding internal selector object: {e}"
                );
                self.event(hpa, "Warning", "InvalidSelector", msg.clone())
                    .await;
                set_condition(
                    status,
                    cond("ScalingActive", "False", "InvalidSelector", msg.clone()),
                    now,
                );
                return Err((Vec::new(), msg));
            }
        };
        let all_pods = self.pods.list();
        let pods: Vec<&Pod> = all_pods
            .iter()
            .map(|p| p.as_ref())
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
            .filter(|p| selector.matches(&p.metadata.labels.clone().unwrap_or_default()))
            .collect();
        // Pods selected by another HPA of the namespace too: ambiguous.
        let others: Vec<String> = {
            let mut sel = self.selectors.lock();
            sel.insert(key.to_owned(), (ns.to_owned(), selector.clone()));
            sel.iter()
                .filter(|(k, (n, s))| {
                    k.as_str() != key
                        && n == ns
                        && pods
                            .iter()
                            .any(|p| s.matches(&p.metadata.labels.clone().unwrap_or_default()))
                })
                .map(|(k, _)| k.clone())
                .collect()
        };
        if !others.is_empty() && !pods.is_empty() {
            let mut names: Vec<String> = others
                .iter()
                .chain(std::iter::once(&key.to_owned()))
                .map(|k| {
                    let (n, name) = k.split_once('/').unwrap_or(("", k));
                    format!("{{{n} {name}}}")
                })
                .collect();
            names.sort();
            let msg = format!(
                "pods by selector {} are controlled by multiple HPAs: [{}]",
                scale.selector,
                names.join(" ")
            );
            self.event(hpa, "Warning", "AmbiguousSelector", msg.clone())
                .await;
            set_condition(
                status,
                cond("ScalingActive", "False", "AmbiguousSelector", msg.clone()),
                now,
            );
            return Err((Vec::new(), msg));
        }
        let tol = self.tolerances(hpa);
        let mut statuses = vec![MetricStatus::default(); metrics.len()];
        let mut best: Option<(i32, String)> = None;
        let mut invalid = 0;
        let mut first: Option<MetricFailure> = None;
        for (i, m) in metrics.iter().enumerate() {
            match self
                .metric_replicas(hpa, m, scale.replicas, &scale.selector, &pods, tol)
                .await
            {
                Ok(o) => {
                    statuses[i] = o.status;
                    if best.as_ref().is_none_or(|(r, _)| o.replicas > *r) {
                        best = Some((o.replicas, o.name));
                    }
                }
                Err(f) => {
                    self.event(hpa, "Warning", f.reason, f.cause.clone()).await;
                    invalid += 1;
                    if first.is_none() {
                        first = Some(f);
                    }
                }
            }
        }
        let fail_condition = |status: &mut HorizontalPodAutoscalerStatus, f: &MetricFailure| {
            set_condition(
                status,
                cond(
                    "ScalingActive",
                    "False",
                    f.reason,
                    format!(
                        "the HPA was unable to compute the replica count: {}",
                        f.cause
                    ),
                ),
                now,
            );
        };
        let partial = first.as_ref().map(|f| {
            format!(
                "invalid metrics ({invalid} invalid out of {}), first error is: {}",
                metrics.len(),
                f.error
            )
        });
        match (best, first) {
            (None, Some(f)) => {
                fail_condition(status, &f);
                Err((statuses, partial.unwrap_or(f.error)))
            }
            (Some((r, _)), Some(f)) if r < scale.replicas => {
                fail_condition(status, &f);
                Err((statuses, partial.unwrap_or(f.error)))
            }
            (Some((r, name)), _) => {
                set_condition(status, cond("ScalingActive", "True", "ValidMetricFound",
                    format!("the HPA was able to successfully calculate a replica count from {name}")), now);
                Ok((r, name, statuses, partial))
            }
            (None, None) => Err((statuses, "no metrics".into())),
        }
    }

    /// Without `spec.behavior`: the highest recommendation of the downscale
    /// stabilization window, then min/max and the 2×-or-4 scale-up limit.
    #[allow(clippy::too_many_arguments)]
    fn normalize(
        &self,
        key: &str,
        desired: i32,
        current: i32,
        min: i32,
        max: i32,
        status: &mut HorizontalPodAutoscalerStatus,
        now: Timestamp,
    ) -> i32 {
        let window = self.settings.downscale_stabilization.as_secs() as i64;
        let stabilized = {
            let mut mem = self.memory.lock();
            let m = mem.entry(key.to_owned()).or_default();
            let cutoff = now.as_second() - window;
            let mut best = desired;
            for r in &m.recommendations {
                if r.at.as_second() > cutoff {
                    best = best.max(r.value);
                }
            }
            match m
                .recommendations
                .iter_mut()
                .find(|r| r.at.as_second() <= cutoff)
            {
                Some(slot) => {
                    *slot = Timed {
                        value: desired,
                        at: now,
                    }
                }
                None => m.recommendations.push(Timed {
                    value: desired,
                    at: now,
                }),
            }
            best
        };
        if stabilized != desired {
            set_condition(status, cond("AbleToScale", "True", "ScaleDownStabilized",
                "recent recommendations were higher than current one, applying the highest recent recommendation"), now);
        } else {
            set_condition(
                status,
                cond(
                    "AbleToScale",
                    "True",
                    "ReadyForNewScale",
                    "recommended size matches current size",
                ),
                now,
            );
        }
        let scale_up_limit = (2 * current).max(4);
        let (upper, upper_reason, upper_msg) = if max > scale_up_limit {
            (
                scale_up_limit,
                "ScaleUpLimit",
                "the desired replica count is increasing faster than the maximum scale rate",
            )
        } else {
            (
                max,
                "TooManyReplicas",
                "the desired replica count is more than the maximum replica count",
            )
        };
        let (result, reason, msg) = if stabilized < min {
            (
                min,
                "TooFewReplicas",
                "the desired replica count is less than the minimum replica count",
            )
        } else if stabilized > upper {
            (upper, upper_reason, upper_msg)
        } else {
            (
                stabilized,
                "DesiredWithinRange",
                "the desired count is within the acceptable range",
            )
        };
        let limited = if result == stabilized {
            "False"
        } else {
            "True"
        };
        set_condition(status, cond("ScalingLimited", limited, reason, msg), now);
        result
    }

    /// With `spec.behavior`: stabilization per direction, then the policies' rate limits
    /// over the recorded scale events, then min/max.
    #[allow(clippy::too_many_arguments)]
    fn normalize_with_behavior(
        &self,
        key: &str,
        hpa: &HorizontalPodAutoscaler,
        desired: i32,
        current: i32,
        min: i32,
        max: i32,
        status: &mut HorizontalPodAutoscalerStatus,
        now: Timestamp,
    ) -> i32 {
        let behavior = hpa.spec.behavior.clone().unwrap_or_default();
        let up = behavior.scale_up.clone().unwrap_or_else(default_scale_up);
        let mut down = behavior
            .scale_down
            .clone()
            .unwrap_or_else(default_scale_down);
        if down.stabilization_window_seconds.is_none() {
            down.stabilization_window_seconds =
                Some(self.settings.downscale_stabilization.as_secs() as i32);
        }
        let up_window = i64::from(up.stabilization_window_seconds.unwrap_or(0));
        let down_window = i64::from(down.stabilization_window_seconds.unwrap_or(300));
        let (rec, scale_up_events, scale_down_events) = {
            let mut mem = self.memory.lock();
            let m = mem.entry(key.to_owned()).or_default();
            let mut up_rec = desired;
            let mut down_rec = desired;
            for r in &m.recommendations {
                if r.at.as_second() > now.as_second() - up_window {
                    up_rec = up_rec.min(r.value);
                }
                if r.at.as_second() > now.as_second() - down_window {
                    down_rec = down_rec.max(r.value);
                }
            }
            let rec = current.max(up_rec).min(down_rec);
            let longest = up_window.max(down_window);
            match m
                .recommendations
                .iter_mut()
                .find(|r| r.at.as_second() <= now.as_second() - longest)
            {
                Some(slot) => {
                    *slot = Timed {
                        value: desired,
                        at: now,
                    }
                }
                None => m.recommendations.push(Timed {
                    value: desired,
                    at: now,
                }),
            }
            (rec, m.scale_up.clone(), m.scale_down.clone())
        };
        if rec != desired {
            if desired >= current {
                set_condition(status, cond("AbleToScale", "True", "ScaleUpStabilized",
                    "recent recommendations were lower than current one, applying the lowest recent recommendation"), now);
            } else {
                set_condition(status, cond("AbleToScale", "True", "ScaleDownStabilized",
                    "recent recommendations were higher than current one, applying the highest recent recommendation"), now);
            }
        } else {
            set_condition(
                status,
                cond(
                    "AbleToScale",
                    "True",
                    "ReadyForNewScale",
                    "recommended size matches current size",
                ),
                now,
            );
        }
        let changed_in = |events: &[Timed], period: i64| -> i32 {
            events
                .iter()
                .filter(|e| e.at.as_second() > now.as_second() - period)
                .map(|e| e.value)
                .sum()
        };
        // The policies' limit on this change: each policy proposes a count from the count
        // at the start of its period; Max takes the largest change, Min the smallest.
        let rate_limit = |rules: &HPAScalingRules, up: bool| -> i32 {
            let select = rules.select_policy.as_deref().unwrap_or("Max");
            if select == "Disabled" {
                return current;
            }
            let proposals = rules.policies.iter().flatten().map(|p| {
                let period = i64::from(p.period_seconds);
                let start = current - changed_in(&scale_up_events, period)
                    + changed_in(&scale_down_events, period);
                let percent = f64::from(p.value) / 100.0;
                match (p.type_.as_str(), up) {
                    ("Pods", true) => start + p.value,
                    ("Pods", false) => start - p.value,
                    (_, true) => (f64::from(start) * (1.0 + percent)).ceil() as i32,
                    (_, false) => (f64::from(start) * (1.0 - percent)) as i32,
                }
            });
            let pick = if (select == "Min") == up {
                proposals.min()
            } else {
                proposals.max()
            };
            pick.unwrap_or(current)
        };
        let (result, reason, msg) = if rec > current {
            let mut limit = rate_limit(&up, true);
            limit = limit.max(current);
            let (upper, r, m) = if max > limit {
                (
                    limit,
                    "ScaleUpLimit",
                    "the desired replica count is increasing faster than the maximum scale rate",
                )
            } else {
                (
                    max,
                    "TooManyReplicas",
                    "the desired replica count is more than the maximum replica count",
                )
            };
            if rec > upper {
                (upper, r, m)
            } else {
                (
                    rec,
                    "DesiredWithinRange",
                    "the desired count is within the acceptable range",
                )
            }
        } else if rec < current {
            let mut limit = rate_limit(&down, false);
            limit = limit.min(current);
            let (lower, r, m) = if min < limit {
                (
                    limit,
                    "ScaleDownLimit",
                    "the desired replica count is decreasing faster than the maximum scale rate",
                )
            } else {
                (
                    min,
                    "TooFewReplicas",
                    "the desired replica count is less than the minimum replica count",
                )
            };
            if rec < lower {
                (lower, r, m)
            } else {
                (
                    rec,
                    "DesiredWithinRange",
                    "the desired count is within the acceptable range",
                )
            }
        } else {
            (
                rec,
                "DesiredWithinRange",
                "the desired count is within the acceptable range",
            )
        };
        let result = result.clamp(min.min(max), max);
        let limited = if result == rec { "False" } else { "True" };
        set_condition(status, cond("ScalingLimited", limited, reason, msg), now);
        result
    }

    /// Remembers a scale change for the policies' periods.
    fn store_scale_event(&self, key: &str, from: i32, to: i32, now: Timestamp) {
        let mut mem = self.memory.lock();
        let m = mem.entry(key.to_owned()).or_default();
        let events = if to > from {
            &mut m.scale_up
        } else {
            &mut m.scale_down
        };
        // Older than any policy period (30 min at most): forgotten.
        events.retain(|e| e.at.as_second() > now.as_second() - 1800);
        events.push(Timed {
            value: (to - from).abs(),
            at: now,
        });
    }

    /// Writes the status when it changed.
    async fn write_status(
        &self,
        hpa: &HorizontalPodAutoscaler,
        old: &HorizontalPodAutoscalerStatus,
        status: HorizontalPodAutoscalerStatus,
    ) {
        if &status == old {
            return;
        }
        let ns = hpa.metadata.namespace.as_deref().unwrap_or_default();
        let name = hpa.metadata.name.as_deref().unwrap_or_default();
        let mut updated = hpa.clone();
        updated.status = Some(status);
        let api: Api<HorizontalPodAutoscaler> = Api::namespaced(self.client.get(), ns);
        if let Err(e) = api
            .replace_status(name, &PostParams::default(), &updated)
            .await
        {
            let msg = kumo_client::error::message(&e);
            self.event(hpa, "Warning", "FailedUpdateStatus", msg.clone())
                .await;
            tracing::info!(hpa = name, error = %msg, "failed to update status");
        }
    }
}

/// The Kind/namespace/name of the HPA's target, for messages.
fn reference(hpa: &HorizontalPodAutoscaler) -> String {
    let ns = hpa.metadata.namespace.as_deref().unwrap_or_default();
    let t = &hpa.spec.scale_target_ref;
    format!("{}/{ns}/{}", t.kind, t.name)
}

fn status_of(resource: &str, container: Option<&str>, current: MetricValueStatus) -> MetricStatus {
    match container {
        Some(c) => MetricStatus {
            type_: "ContainerResource".into(),
            container_resource: Some(ContainerResourceMetricStatus {
                container: c.to_owned(),
                name: resource.to_owned(),
                current,
            }),
            ..Default::default()
        },
        None => MetricStatus {
            type_: "Resource".into(),
            resource: Some(ResourceMetricStatus {
                name: resource.to_owned(),
                current,
            }),
            ..Default::default()
        },
    }
}

fn default_scale_up() -> HPAScalingRules {
    use k8s_openapi::api::autoscaling::v2::HPAScalingPolicy;
    HPAScalingRules {
        stabilization_window_seconds: Some(0),
        select_policy: Some("Max".into()),
        policies: Some(vec![
            HPAScalingPolicy {
                type_: "Pods".into(),
                value: 4,
                period_seconds: 15,
            },
            HPAScalingPolicy {
                type_: "Percent".into(),
                value: 100,
                period_seconds: 15,
            },
        ]),
        ..Default::default()
    }
}

fn default_scale_down() -> HPAScalingRules {
    use k8s_openapi::api::autoscaling::v2::HPAScalingPolicy;
    HPAScalingRules {
        select_policy: Some("Max".into()),
        policies: Some(vec![HPAScalingPolicy {
            type_: "Percent".into(),
            value: 100,
            period_seconds: 15,
        }]),
        ..Default::default()
    }
}

/// A query value, percent-encoded.
fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
