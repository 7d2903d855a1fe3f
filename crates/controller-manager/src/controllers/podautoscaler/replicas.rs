//! The replica calculator: how many replicas a resource metric asks for, from the pods'
//! usage (the resource metrics API) and requests, as upstream's ReplicaCalculator computes
//! it — pods being deleted or failed are ignored, pending (and, for CPU, not yet ready)
//! pods and pods without metrics are counted pessimistically, and a ratio within the
//! tolerance keeps the current count.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

/// One pod's usage from the metrics API (millis of the resource), with the metric's
/// timestamp and window.
#[derive(Clone, Copy, Debug)]
pub struct PodMetric {
    pub timestamp: Timestamp,
    pub window_secs: f64,
    pub value: i64,
}

/// The tolerance band around a usage ratio of 1 (scale down, scale up).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerances {
    pub down: f64,
    pub up: f64,
}

impl Tolerances {
    fn within(&self, ratio: f64) -> bool {
        (1.0 - self.down..=1.0 + self.up).contains(&ratio)
    }
}

/// The controller's timing settings for CPU readiness.
#[derive(Clone, Copy, Debug)]
pub struct Readiness {
    /// `--horizontal-pod-autoscaler-cpu-initialization-period` (5 min).
    pub cpu_initialization_secs: i64,
    /// `--horizontal-pod-autoscaler-initial-readiness-delay` (30 s).
    pub initial_readiness_delay_secs: i64,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            cpu_initialization_secs: 300,
            initial_readiness_delay_secs: 30,
        }
    }
}

/// What a computation found.
#[derive(Clone, Debug, PartialEq)]
pub struct Replicas {
    pub replicas: i32,
    /// Utilization in percent of the requests (Utilization targets).
    pub utilization: Option<i32>,
    /// The raw average usage, in millis.
    pub average_millis: i64,
    pub timestamp: Timestamp,
}

fn name(p: &Pod) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

/// The pods split as upstream's groupPods does: (ready count, unready, missing, ignored).
fn group_pods(
    pods: &[&Pod],
    metrics: &HashMap<String, PodMetric>,
    resource: &str,
    readiness: Readiness,
    now: Timestamp,
) -> (usize, Vec<String>, Vec<String>, Vec<String>) {
    let (mut ready, mut unready, mut missing, mut ignored) =
        (0, Vec::new(), Vec::new(), Vec::new());
    for p in pods {
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("");
        if p.metadata.deletion_timestamp.is_some() || phase == "Failed" {
            ignored.push(name(p).to_owned());
            continue;
        }
        if phase == "Pending" {
            unready.push(name(p).to_owned());
            continue;
        }
        let Some(m) = metrics.get(name(p)) else {
            missing.push(name(p).to_owned());
            continue;
        };
        if resource == "cpu" && !cpu_ready(p, m, readiness, now) {
            unready.push(name(p).to_owned());
            continue;
        }
        ready += 1;
    }
    (ready, unready, missing, ignored)
}

/// Whether a pod's CPU sample can be trusted: it has been ready long enough that the
/// sample does not include its start-up burst.
fn cpu_ready(p: &Pod, m: &PodMetric, r: Readiness, now: Timestamp) -> bool {
    let status = p.status.as_ref();
    let cond = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    let (Some(cond), Some(start)) = (cond, status.and_then(|s| s.start_time.as_ref())) else {
        return false;
    };
    let start = start.0.as_second();
    let ready = cond.status == "True";
    let transition = cond
        .last_transition_time
        .as_ref()
        .map(|t| t.0.as_second())
        .unwrap_or(start);
    if start + r.cpu_initialization_secs > now.as_second() {
        // In the initialization period: ready, and measured entirely after it became so.
        let measured_from = m.timestamp.as_second() - m.window_secs as i64;
        return ready && measured_from >= transition;
    }
    // Past it: unready only if it never became ready.
    ready || start + r.initial_readiness_delay_secs <= transition
}

/// The sum of the pods' requests of `resource` (millis), by pod name: every container's
/// (and sidecar's), or just `container`'s.
pub fn requests(
    pods: &[&Pod],
    resource: &str,
    container: Option<&str>,
) -> Result<HashMap<String, i64>, String> {
    let mut out = HashMap::new();
    for p in pods {
        let spec = p.spec.as_ref();
        let mut containers: Vec<&k8s_openapi::api::core::v1::Container> = spec
            .map(|s| s.containers.iter().collect())
            .unwrap_or_default();
        containers.extend(
            spec.and_then(|s| s.init_containers.as_ref())
                .into_iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always")),
        );
        let mut total = 0i64;
        let mut found = container.is_none();
        for c in containers {
            if let Some(want) = container {
                if c.name != want {
                    continue;
                }
                found = true;
            }
            let q = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(resource));
            match q.and_then(|q| kumo_apimachinery::quantity::Quantity::parse(&q.0)) {
                Some(q) => total += q.milli_value() as i64,
                None => {
                    return Err(format!(
                        "missing request for {resource} in container {} of Pod {}",
                        c.name,
                        name(p)
                    ))
                }
            }
        }
        if !found {
            return Err(format!(
                "container {} not found in Pod {}",
                container.unwrap_or_default(),
                name(p)
            ));
        }
        out.insert(name(p).to_owned(), total);
    }
    Ok(out)
}

/// What a target makes of the pods' usage: the usage ratio against the target, the
/// utilization and average usage the status shows, and what a pod without a metric is
/// taken to use when scaling down.
trait Target {
    fn ratio(&self, metrics: &HashMap<String, PodMetric>) -> Result<Usage, String>;
    fn missing_on_scale_down(&self, pod: &str) -> i64;
}

/// A usage ratio, with the utilization (percent) and average usage (millis) behind it.
struct Usage {
    ratio: f64,
    utilization: Option<i32>,
    average: i64,
}

/// Percent of the pods' requests.
struct Utilization {
    target: i32,
    requests: HashMap<String, i64>,
}

impl Target for Utilization {
    fn ratio(&self, metrics: &HashMap<String, PodMetric>) -> Result<Usage, String> {
        let (mut used, mut requested, mut n) = (0i64, 0i64, 0i64);
        for (pod, m) in metrics {
            if let Some(r) = self.requests.get(pod) {
                used += m.value;
                requested += r;
                n += 1;
            }
        }
        if requested == 0 {
            return Err("no metrics returned matched known pods".into());
        }
        let utilization = (used * 100 / requested) as i32;
        Ok(Usage {
            ratio: f64::from(utilization) / f64::from(self.target),
            utilization: Some(utilization),
            average: used / n,
        })
    }

    fn missing_on_scale_down(&self, pod: &str) -> i64 {
        self.requests.get(pod).copied().unwrap_or(0) * i64::from(self.target.max(100)) / 100
    }
}

/// An average value per pod (millis).
struct AverageValue(i64);

impl Target for AverageValue {
    fn ratio(&self, metrics: &HashMap<String, PodMetric>) -> Result<Usage, String> {
        let average = metrics.values().map(|x| x.value).sum::<i64>() / metrics.len().max(1) as i64;
        Ok(Usage {
            ratio: average as f64 / self.0.max(1) as f64,
            utilization: None,
            average,
        })
    }

    fn missing_on_scale_down(&self, _pod: &str) -> i64 {
        self.0
    }
}

/// The replica calculation both kinds of target share: group the pods, drop the metrics
/// of unready and ignored pods, then (once `target` is known) scale by the ratio, filling
/// in missing and unready pods pessimistically for the direction of the change.
#[allow(clippy::too_many_arguments)]
fn calculate<T: Target>(
    current: i32,
    resource: &str,
    mut metrics: HashMap<String, PodMetric>,
    pods: &[&Pod],
    tol: Tolerances,
    readiness: Readiness,
    now: Timestamp,
    target: impl FnOnce() -> Result<T, String>,
) -> Result<Replicas, String> {
    if pods.is_empty() {
        return Err("no pods returned by selector while calculating replica count".into());
    }
    let timestamp = metrics.values().next().map(|m| m.timestamp).unwrap_or(now);
    let (ready, unready, missing, ignored) = group_pods(pods, &metrics, resource, readiness, now);
    for n in unready.iter().chain(&ignored) {
        metrics.remove(n);
    }
    if metrics.is_empty() {
        return Err("did not receive metrics for targeted pods (pods might be unready)".into());
    }
    let target = target()?;
    let usage = target.ratio(&metrics)?;
    let ratio = usage.ratio;
    let rebalance_unready = !unready.is_empty() && ratio > 1.0;
    let result = |replicas| Replicas {
        replicas,
        utilization: usage.utilization,
        average_millis: usage.average,
        timestamp,
    };
    if missing.is_empty() && !rebalance_unready {
        if tol.within(ratio) {
            return Ok(result(current));
        }
        return Ok(result((ratio * ready as f64).ceil() as i32));
    }
    let filled = |value| PodMetric {
        timestamp,
        window_secs: 0.0,
        value,
    };
    for pod in &missing {
        let value = if ratio < 1.0 {
            target.missing_on_scale_down(pod)
        } else {
            0
        };
        metrics.insert(pod.clone(), filled(value));
    }
    if rebalance_unready {
        for pod in &unready {
            metrics.insert(pod.clone(), filled(0));
        }
    }
    let new_ratio = target.ratio(&metrics)?.ratio;
    if tol.within(new_ratio) || (ratio < 1.0 && new_ratio > 1.0) || (ratio > 1.0 && new_ratio < 1.0)
    {
        return Ok(result(current));
    }
    let replicas = (new_ratio * metrics.len() as f64).ceil() as i32;
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return Ok(result(current));
    }
    Ok(result(replicas))
}

/// Replicas for a Utilization target (percent of requests).
#[allow(clippy::too_many_arguments)]
pub fn utilization_replicas(
    current: i32,
    target: i32,
    resource: &str,
    container: Option<&str>,
    metrics: HashMap<String, PodMetric>,
    pods: &[&Pod],
    tol: Tolerances,
    readiness: Readiness,
    now: Timestamp,
) -> Result<Replicas, String> {
    calculate(
        current,
        resource,
        metrics,
        pods,
        tol,
        readiness,
        now,
        || {
            Ok(Utilization {
                target,
                requests: requests(pods, resource, container)?,
            })
        },
    )
}

/// Replicas for an AverageValue target (`target_millis` per pod).
#[allow(clippy::too_many_arguments)]
pub fn average_value_replicas(
    current: i32,
    target_millis: i64,
    resource: &str,
    metrics: HashMap<String, PodMetric>,
    pods: &[&Pod],
    tol: Tolerances,
    readiness: Readiness,
    now: Timestamp,
) -> Result<Replicas, String> {
    calculate(
        current,
        resource,
        metrics,
        pods,
        tol,
        readiness,
        now,
        || Ok(AverageValue(target_millis)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, PodCondition, PodSpec, PodStatus, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    const TOL: Tolerances = Tolerances { down: 0.1, up: 0.1 };

    fn pod(name: &str, cpu_request: &str, ready_since: i64) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some([("cpu".to_owned(), Q(cpu_request.into()))].into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                start_time: Some(Time(Timestamp::from_second(ready_since - 60).unwrap())),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(Timestamp::from_second(ready_since).unwrap())),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn metric(now: Timestamp, value: i64) -> PodMetric {
        PodMetric {
            timestamp: now,
            window_secs: 15.0,
            value,
        }
    }

    #[test]
    fn scales_up_by_the_usage_ratio() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let long_ago = now.as_second() - 3600;
        let pods = [pod("a", "200m", long_ago), pod("b", "200m", long_ago)];
        let refs: Vec<&Pod> = pods.iter().collect();
        // 300m each of 200m requested: 150 %, target 50 % → ratio 3 → 6 replicas.
        let m = HashMap::from([
            ("a".into(), metric(now, 300)),
            ("b".into(), metric(now, 300)),
        ]);
        let r = utilization_replicas(2, 50, "cpu", None, m, &refs, TOL, Readiness::default(), now)
            .unwrap();
        assert_eq!(r.replicas, 6);
        assert_eq!(r.utilization, Some(150));
        assert_eq!(r.average_millis, 300);
    }

    #[test]
    fn within_tolerance_keeps_the_count() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let long_ago = now.as_second() - 3600;
        let pods = [pod("a", "100m", long_ago)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let m = HashMap::from([("a".into(), metric(now, 52))]);
        let r = utilization_replicas(1, 50, "cpu", None, m, &refs, TOL, Readiness::default(), now)
            .unwrap();
        assert_eq!(r.replicas, 1);
    }

    #[test]
    fn missing_pods_damp_a_scale_down() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let long_ago = now.as_second() - 3600;
        let pods = [pod("a", "100m", long_ago), pod("b", "100m", long_ago)];
        let refs: Vec<&Pod> = pods.iter().collect();
        // a uses 10 %, b has no metric: taken as using 100 % for a scale down, so the
        // average is 55 % against 50 % → within tolerance, no change.
        let m = HashMap::from([("a".into(), metric(now, 10))]);
        let r = utilization_replicas(2, 50, "cpu", None, m, &refs, TOL, Readiness::default(), now)
            .unwrap();
        assert_eq!(r.replicas, 2);
    }

    #[test]
    fn average_value_targets_scale_by_the_mean() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let long_ago = now.as_second() - 3600;
        let pods = [pod("a", "100m", long_ago), pod("b", "100m", long_ago)];
        let refs: Vec<&Pod> = pods.iter().collect();
        // 300m average against 100m per pod: three times the pods.
        let m = HashMap::from([
            ("a".into(), metric(now, 200)),
            ("b".into(), metric(now, 400)),
        ]);
        let r = average_value_replicas(2, 100, "cpu", m, &refs, TOL, Readiness::default(), now)
            .unwrap();
        assert_eq!(
            (r.replicas, r.utilization, r.average_millis),
            (6, None, 300)
        );
        // b has no metric: for a scale down it counts as using the target.
        let m = HashMap::from([("a".into(), metric(now, 10))]);
        let r = average_value_replicas(2, 100, "cpu", m, &refs, TOL, Readiness::default(), now)
            .unwrap();
        assert_eq!(r.replicas, 2);
    }

    #[test]
    fn a_pod_without_a_request_is_an_error() {
        let mut p = pod("a", "1", 0);
        p.spec.as_mut().unwrap().containers[0].resources = None;
        let refs = [&p];
        assert_eq!(
            requests(&refs, "cpu", None).unwrap_err(),
            "missing request for cpu in container c of Pod a"
        );
    }
}
