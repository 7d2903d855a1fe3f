//! `kumo doctor service NAME` and `kumo doctor node NAME`: why a Service's external address
//! is (not) decided and why a node is (not) initialized by the cloud, worked out from who is
//! (not) there. The evidence comes from the API server (the object, its events, the
//! cloud-controller-manager's Lease, the nodes) and from the cloud (the load balancer or
//! instance, deny policies, faults). The verdict is printed first, then the evidence.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Event, Node, Pod, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kumo_cloud_provider::ccm::node::TAINT_UNINITIALIZED;
use kumo_cloud_provider::ccm::nodelifecycle::TAINT_SHUTDOWN;
use kumo_cloud_provider::ccm::service::{
    LABEL_NODE_EXCLUDE_BALANCERS, LOAD_BALANCER_CLEANUP_FINALIZER, TO_BE_DELETED_TAINT,
};

use crate::status::{self, LeaseState};
use kumo::kubeconfig::{ClusterArgs, Target};

/// What to examine.
#[derive(clap::Subcommand)]
pub enum Doctor {
    /// Why a Service of type LoadBalancer has (no) external address.
    Service {
        /// The Service's name.
        name: String,
        /// Its namespace.
        #[arg(short = 'n', long, default_value = "default")]
        namespace: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Why a node is (not) initialized by the cloud, (not) Ready, or gone.
    Node {
        /// The node's name.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

/// The cloud's load-balancer actions, any of which the service controller may need.
const LB_ACTIONS: &[&str] = &[
    "DescribeLoadBalancers",
    "CreateLoadBalancer",
    "UpdateLoadBalancer",
    "DeleteLoadBalancer",
];
/// The event reasons of the service controller.
const SERVICE_REASONS: &[&str] = &[
    "EnsuringLoadBalancer",
    "EnsuredLoadBalancer",
    "SyncLoadBalancerFailed",
    "UpdatedLoadBalancer",
    "UpdateLoadBalancerFailed",
    "DeletingLoadBalancer",
    "DeletedLoadBalancer",
    "DeleteLoadBalancerFailed",
    "UnAvailableLoadBalancer",
    "LoadbalancerIP",
    "ExternalTrafficPolicy",
    "HealthCheckNodePort",
    "Type",
];
/// How long a cloud call may take before the doctor gives up on it.
const CLOUD_TIMEOUT: Duration = Duration::from_secs(5);

/// A verdict with its evidence.
struct Report {
    healthy: bool,
    verdict: String,
    evidence: Vec<String>,
}

impl Report {
    fn print(&self) {
        let mark = if self.healthy { "OK" } else { "PROBLEM" };
        println!("{mark}: {}", self.verdict);
        println!("Evidence:");
        for e in &self.evidence {
            println!("  - {e}");
        }
    }
}

/// Runs the doctor and prints its report; Ok(true) when no problem was found.
pub async fn run(what: Doctor) -> Result<bool> {
    let args = match &what {
        Doctor::Service { cluster, .. } | Doctor::Node { cluster, .. } => cluster.clone(),
    };
    let target = match kumo::kubeconfig::target(&args).await {
        Ok(t) => t,
        Err(e) => {
            Report {
                healthy: false,
                verdict: format!("there is no cluster to ask: {e:#}"),
                evidence: Vec::new(),
            }
            .print();
            return Ok(false);
        }
    };
    if let Some(report) = unreachable(&target).await {
        report.print();
        return Ok(false);
    }
    let report = match what {
        Doctor::Service {
            name, namespace, ..
        } => service(&target, &namespace, &name).await?,
        Doctor::Node { name, .. } => node(&target, &name).await?,
    };
    report.print();
    Ok(report.healthy)
}

/// A report when the API server cannot be asked at all.
async fn unreachable(target: &Target) -> Option<Report> {
    let running = match &target.data_dir {
        Some(dir) => crate::daemon::running(dir)
            .map(|pid| format!("kumo runs on {} (pid {pid})", dir.display()))
            .unwrap_or_else(|| format!("no kumo runs on {}", dir.display())),
        None => format!("credentials: {}", target.source),
    };
    match status::readyz(&target.client).await {
        Ok(_) => None,
        Err(e) => Some(Report {
            healthy: false,
            verdict: format!("the API server at {} does not answer: {e:#}", target.url),
            evidence: vec![running],
        }),
    }
}

/// The cloud of the cluster's data directory, or why there is none to ask.
fn cloud(target: &Target) -> Result<kumo_cloud::Client, String> {
    let Some(dir) = &target.data_dir else {
        return Err(format!(
            "no kumo data directory known for {} (pass --data-dir)",
            target.source
        ));
    };
    let cloud_dir = dir.join("cloud");
    if !cloud_dir.exists() {
        return Err(format!(
            "no cloud in {} (a cluster without a cloud, e.g. `kumo up --no-cloud`)",
            cloud_dir.display()
        ));
    }
    kumo_cloud::Client::from_data_dir(&cloud_dir).map_err(|e| format!("cannot reach it: {e}"))
}

/// A cloud call with [`CLOUD_TIMEOUT`], its error as text.
async fn ask<T>(
    f: impl std::future::Future<Output = Result<T, kumo_cloud::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(CLOUD_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer in {} s", CLOUD_TIMEOUT.as_secs())),
    }
}

fn lease_line(lease: &Option<LeaseState>) -> String {
    match lease {
        None => "Lease kube-system/cloud-controller-manager: none (no cloud-controller-manager has ever led here)".into(),
        Some(l) => format!(
            "Lease kube-system/cloud-controller-manager: holder {}, renewed {}: {}",
            if l.holder.is_empty() { "(none)" } else { &l.holder },
            l.renewed_ago
                .map(|a| format!("{} ago", status::human(a)))
                .unwrap_or_else(|| "never".into()),
            if l.fresh {
                "fresh, a cloud-controller-manager is running"
            } else {
                "stale, its holder stopped renewing it"
            }
        ),
    }
}

fn ccm_running(lease: &Option<LeaseState>) -> bool {
    lease
        .as_ref()
        .is_some_and(|l| l.fresh && !l.holder.is_empty())
}

/// When the event last happened.
fn event_time(e: &Event) -> Option<Timestamp> {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The events about `kind`/`name` in `namespace`, oldest first.
async fn events_of(
    client: &kube::Client,
    namespace: &str,
    kind: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<Vec<Event>> {
    let all = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    let mut evs: Vec<Event> = all
        .items
        .into_iter()
        .filter(|e| {
            let o = &e.involved_object;
            o.kind.as_deref() == Some(kind)
                && o.name.as_deref() == Some(name)
                && match (uid, o.uid.as_deref()) {
                    (Some(want), Some(got)) if !got.is_empty() => want == got,
                    _ => true,
                }
        })
        .collect();
    evs.sort_by_key(event_time);
    Ok(evs)
}

fn event_line(e: &Event, now: Timestamp) -> String {
    let when = event_time(e)
        .map(|t| format!("{} ago", status::human(status::age(now, t))))
        .unwrap_or_else(|| "-".into());
    let count = e
        .count
        .filter(|c| *c > 1)
        .map(|c| format!(" x{c}"))
        .unwrap_or_default();
    let source = e
        .source
        .as_ref()
        .and_then(|s| s.component.clone())
        .or_else(|| e.reporting_component.clone())
        .unwrap_or_default();
    format!(
        "event {} {}{count} ({when}, from {}): {}",
        e.type_.as_deref().unwrap_or("Normal"),
        e.reason.as_deref().unwrap_or_default(),
        if source.is_empty() { "?" } else { &source },
        e.message.as_deref().unwrap_or_default()
    )
}

/// Why a node would not be a load-balancer target (None: it is one), as the service
/// controller's stable node set filters them: deleted nodes, the exclude label (unless
/// it parses as false), the cluster autoscaler's to-be-deleted taint. Readiness does not
/// count.
fn ineligible(n: &Node) -> Option<String> {
    if n.metadata.deletion_timestamp.is_some() {
        return Some("being deleted".into());
    }
    let exclude = n
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_NODE_EXCLUDE_BALANCERS));
    if let Some(v) = exclude {
        // Go's strconv.ParseBool: only a false value keeps the node in.
        if !matches!(v.as_str(), "0" | "f" | "F" | "false" | "FALSE" | "False") {
            return Some(format!("label {LABEL_NODE_EXCLUDE_BALANCERS}={v}"));
        }
    }
    let taints = n.spec.as_ref().and_then(|s| s.taints.as_ref());
    if taints.is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT)) {
        return Some(format!("taint {TO_BE_DELETED_TAINT}"));
    }
    None
}

/// The deny statements covering one of `actions`, as evidence lines.
fn denying<'a>(
    policies: &'a [kumo_cloud::PolicyStatement],
    actions: &[&str],
) -> Vec<&'a kumo_cloud::PolicyStatement> {
    policies
        .iter()
        .filter(|p| {
            p.effect == "Deny"
                && actions.iter().any(|a| match p.action.strip_suffix('*') {
                    Some(prefix) => a.starts_with(prefix),
                    None => p.action == *a,
                })
        })
        .collect()
}

fn policy_text(p: &kumo_cloud::PolicyStatement) -> String {
    format!(
        "{} {} {} for {}",
        p.id,
        p.effect,
        p.action,
        p.credential
            .as_deref()
            .map(|c| format!("credential {c}"))
            .unwrap_or_else(|| "every credential".into())
    )
}

/// The CCM components whose events show a controller at work.
const CCM_COMPONENTS: &[&str] = &[
    "cloud-node-controller",
    "cloud-node-lifecycle-controller",
    "service-controller",
    "route-controller",
];

/// Which cloud-controller-manager controllers left events anywhere in the cluster (events
/// live an hour, so this is what was seen at work lately).
async fn controllers_seen(client: &kube::Client) -> Result<Vec<String>> {
    let all = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let mut seen: Vec<String> = all
        .items
        .iter()
        .filter_map(|e| {
            e.source
                .as_ref()
                .and_then(|s| s.component.clone())
                .or_else(|| e.reporting_component.clone())
        })
        .filter(|c| CCM_COMPONENTS.contains(&c.as_str()))
        .collect();
    seen.sort();
    seen.dedup();
    Ok(seen)
}

/// The `--controllers` flag of a cloud-controller-manager pod in kube-system (a static
/// pod as kubeadm runs it, or a Deployment's), if one runs there: (pod, flag value).
async fn ccm_pod_controllers(client: &kube::Client) -> Result<Option<(String, String)>> {
    let pods = Api::<Pod>::namespaced(client.clone(), "kube-system")
        .list(&ListParams::default())
        .await?;
    for p in &pods.items {
        let name = p.metadata.name.clone().unwrap_or_default();
        let component = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("component").or_else(|| l.get("k8s-app")))
            .cloned()
            .unwrap_or_default();
        if !name.starts_with("cloud-controller-manager")
            && !component.contains("cloud-controller-manager")
        {
            continue;
        }
        let words = p
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .flat_map(|c| c.command.iter().flatten().chain(c.args.iter().flatten()));
        let mut next_is_value = false;
        for w in words {
            if next_is_value {
                return Ok(Some((name, w.clone())));
            }
            if let Some(v) = w.strip_prefix("--controllers=") {
                return Ok(Some((name, v.to_owned())));
            }
            next_is_value = w == "--controllers";
        }
        // Without the flag every controller runs.
        return Ok(Some((name, "*".into())));
    }
    Ok(None)
}

/// The Service doctor.
async fn service(target: &Target, namespace: &str, name: &str) -> Result<Report> {
    let client = target.client.clone();
    let dir = target;
    let now = Timestamp::now();
    let mut ev = Vec::new();
    let Some(svc) = Api::<Service>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(Report {
            healthy: false,
            verdict: format!("Service {namespace}/{name} does not exist"),
            evidence: vec![format!("kubectl -n {namespace} get svc {name}: NotFound")],
        });
    };
    let spec = svc.spec.clone().unwrap_or_default();
    let type_ = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
    let ports: Vec<String> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| match p.node_port {
            Some(np) => format!("{}:{np}/{}", p.port, p.protocol.as_deref().unwrap_or("TCP")),
            None => format!("{}/{}", p.port, p.protocol.as_deref().unwrap_or("TCP")),
        })
        .collect();
    ev.push(format!(
        "type {type_}, clusterIP {}, ports {}",
        spec.cluster_ip.as_deref().unwrap_or("<none>"),
        if ports.is_empty() {
            "<none>".into()
        } else {
            ports.join(",")
        }
    ));
    // The endpoints behind it (what the nodes' NodePorts lead to).
    let slices = Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(
        client.clone(),
        namespace,
    )
    .list(&kube::api::ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
    .await?;
    let (mut ready_eps, mut serving_eps) = (0, 0);
    for s in &slices.items {
        for e in s.endpoints.iter().flatten() {
            let c = e.conditions.as_ref();
            if c.and_then(|c| c.ready).unwrap_or(true) {
                ready_eps += 1;
            } else if c.and_then(|c| c.serving).unwrap_or(false) {
                serving_eps += 1;
            }
        }
    }
    ev.push(format!(
        "endpoints: {ready_eps} ready{}",
        if serving_eps > 0 {
            format!(", {serving_eps} terminating but still serving")
        } else {
            String::new()
        }
    ));
    if type_ != "LoadBalancer" {
        return Ok(Report {
            healthy: true,
            verdict: format!(
                "Service {namespace}/{name} is of type {type_}: no load balancer is made for it, so there is no external address to wait for"
            ),
            evidence: ev,
        });
    }
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.clone())
        .unwrap_or_default();
    let lb_status = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .map(|l| serde_json::to_string(l).unwrap_or_default())
        .unwrap_or_else(|| "{}".into());
    let external: Vec<String> = ingress
        .iter()
        .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
        .collect();
    ev.push(format!(
        "status.loadBalancer: {lb_status} (EXTERNAL-IP {})",
        if external.is_empty() {
            "<pending>".into()
        } else {
            external.join(",")
        }
    ));
    let class = spec.load_balancer_class.clone();
    ev.push(match &class {
        None => "spec.loadBalancerClass: unset (the cloud-controller-manager's service controller is the one to act)".into(),
        Some(c) => format!("spec.loadBalancerClass: {c} (the service controller skips it; only a controller of {c} acts on it)"),
    });
    let finalizer = svc
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == LOAD_BALANCER_CLEANUP_FINALIZER);
    ev.push(if finalizer {
        format!("finalizer {LOAD_BALANCER_CLEANUP_FINALIZER}: present (the service controller has taken it on)")
    } else {
        format!("finalizer {LOAD_BALANCER_CLEANUP_FINALIZER}: absent (no service controller has taken it on)")
    });
    let events = events_of(
        &client,
        namespace,
        "Service",
        name,
        svc.metadata.uid.as_deref(),
    )
    .await?;
    let lb_events: Vec<&Event> = events
        .iter()
        .filter(|e| SERVICE_REASONS.contains(&e.reason.as_deref().unwrap_or_default()))
        .collect();
    if events.is_empty() {
        ev.push("events: none (nobody has reconciled this Service)".into());
    }
    for e in events.iter().rev().take(6).rev() {
        ev.push(event_line(e, now));
    }
    let lease = status::lease(&client, "cloud-controller-manager").await?;
    ev.push(lease_line(&lease));
    let seen = controllers_seen(&client).await?;
    ev.push(format!(
        "cloud-controller-manager controllers seen at work (events, cluster-wide): {}",
        if seen.is_empty() {
            "none".into()
        } else {
            seen.join(", ")
        }
    ));
    let pod_flag = ccm_pod_controllers(&client).await?;
    // Whether the pod's flag enables the service controller (None: unknown).
    let service_enabled = pod_flag.as_ref().and_then(|(pod, flag)| {
        ev.push(format!("pod kube-system/{pod}: --controllers={flag}"));
        kumo_cloud_provider::ccm::resolve_controllers(std::slice::from_ref(flag))
            .ok()
            .map(|on| on.contains(&"service-lb-controller"))
    });
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let excluded: Vec<String> = nodes
        .iter()
        .filter_map(|n| {
            ineligible(n)
                .map(|why| format!("{} ({why})", n.metadata.name.as_deref().unwrap_or_default()))
        })
        .collect();
    ev.push(format!(
        "nodes eligible as load-balancer targets: {} of {}{}",
        nodes.len() - excluded.len(),
        nodes.len(),
        if excluded.is_empty() {
            String::new()
        } else {
            format!("; left out: {}", excluded.join(", "))
        }
    ));
    let unwell: Vec<String> = nodes
        .iter()
        .filter(|n| ineligible(n).is_none())
        .filter_map(|n| {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            let taints = n.spec.as_ref().and_then(|s| s.taints.as_ref());
            if taints.is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED)) {
                return Some(format!("{name} (not initialized by the cloud)"));
            }
            let ready = status::node_ready(n);
            (ready != "True").then(|| format!("{name} (Ready={ready})"))
        })
        .collect();
    if !unwell.is_empty() {
        ev.push(format!(
            "targets that cannot serve yet (the service controller keeps them; the cloud's health check leaves them out): {}",
            unwell.join(", ")
        ));
    }

    // The cloud's view.
    let lb_name = kumo_cloud_provider::default_load_balancer_name(&svc);
    let mut deny: Vec<kumo_cloud::PolicyStatement> = Vec::new();
    let mut cloud_lb = None;
    match cloud(dir) {
        Err(why) => ev.push(format!("cloud: {why}")),
        Ok(c) => {
            match ask(c.find_load_balancer(&lb_name)).await {
                Ok(Some(lb)) => {
                    ev.push(format!(
                        "cloud: load balancer {lb_name} is {} ({}), VIP {}, DNS {}, {} target(s)",
                        lb.id,
                        lb.state,
                        lb.vip,
                        lb.dns_name,
                        lb.targets.len()
                    ));
                    for t in &lb.targets {
                        ev.push(format!(
                            "cloud: target {} is {}{}",
                            t.instance_id,
                            serde_json::to_value(t.health)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_owned))
                                .unwrap_or_default(),
                            t.reason
                                .as_deref()
                                .map(|r| format!(" ({r})"))
                                .unwrap_or_default()
                        ));
                    }
                    cloud_lb = Some(lb);
                }
                Ok(None) => ev.push(format!("cloud: no load balancer named {lb_name}")),
                Err(e) => ev.push(format!("cloud: looking up load balancer {lb_name}: {e}")),
            }
            match ask(c.policies()).await {
                Ok(ps) => {
                    deny = denying(&ps, LB_ACTIONS).into_iter().cloned().collect();
                    if deny.is_empty() {
                        ev.push("cloud: no deny policy on load-balancer actions".into());
                    }
                    for p in &deny {
                        ev.push(format!("cloud: deny policy {}", policy_text(p)));
                    }
                }
                Err(e) => ev.push(format!("cloud: reading policies: {e}")),
            }
            match ask(c.faults()).await {
                Ok(f) => {
                    for (op, f) in f
                        .iter()
                        .filter(|(op, _)| *op == "*" || op.contains("LoadBalancer"))
                    {
                        ev.push(format!(
                            "cloud: fault on {op}: error rate {} ({}), latency {} ms",
                            f.error_rate, f.error_code, f.latency_ms
                        ));
                    }
                }
                Err(e) => ev.push(format!("cloud: reading faults: {e}")),
            }
        }
    }

    // The real data plane: does the VIP answer from the internet?
    let mut vip_silent = Vec::new();
    if let (Some(lb), Some(dir)) = (&cloud_lb, &target.data_dir) {
        for l in &lb.listeners {
            let addr = format!("{}:{}", lb.vip, l.port);
            let Ok(sa) = addr.parse::<std::net::SocketAddr>() else {
                continue;
            };
            if l.protocol != kumo_cloud::Protocol::Tcp {
                continue;
            }
            match kumo::machine::vip_answers(dir, sa) {
                None => {}
                Some(true) => ev.push(format!(
                    "data plane: {addr} accepts connections from the internet"
                )),
                Some(false) => {
                    ev.push(format!(
                        "data plane: {addr} refuses or drops connections from the internet"
                    ));
                    vip_silent.push(addr);
                }
            }
        }
    }
    let last_lb_event = lb_events.last().copied();
    let reason_of = |e: &Event| e.reason.clone().unwrap_or_default();
    let (healthy, verdict) = if !external.is_empty() && !vip_silent.is_empty() {
        let healthy_targets = cloud_lb.as_ref().map_or(0, |lb| {
            lb.targets
                .iter()
                .filter(|t| t.health == kumo_cloud::TargetHealthState::Healthy)
                .count()
        });
        (
            false,
            format!(
                "EXTERNAL-IP is {} but {} does not answer: {}",
                external.join(","),
                vip_silent.join(", "),
                if ready_eps + serving_eps == 0 {
                    "the Service has no ready endpoint: every node rejects its node port, and the cloud's health check will mark the targets unhealthy".to_owned()
                } else if healthy_targets == 0 {
                    "the cloud's health check finds no target healthy (no ready endpoint behind the node ports, or for externalTrafficPolicy: Local none on any node)".to_owned()
                } else {
                    format!("{healthy_targets} target(s) are healthy, yet the connection fails: the nodes' kube-proxy rules are the next place to look (`kumo node exec NODE -- nft list table ip kube-proxy`)")
                }
            ),
        )
    } else if !external.is_empty() {
        (
            true,
            format!(
                "EXTERNAL-IP is {}: the {} wrote it into status.loadBalancer{}",
                external.join(","),
                match &class {
                    None => "service controller".to_string(),
                    Some(c) => format!("controller of loadBalancerClass {c}"),
                },
                match &cloud_lb {
                    Some(lb) => format!(" (cloud load balancer {})", lb.id),
                    None => String::new(),
                }
            ),
        )
    } else if let Some(c) = &class {
        (
            false,
            format!(
                "spec.loadBalancerClass is {c:?}: the cloud-controller-manager's service controller only handles Services without a class, and no controller for {c:?} has acted on it"
            ),
        )
    } else if !ccm_running(&lease) {
        (
            false,
            format!(
                "no cloud-controller-manager is running ({}): nobody runs the service controller, so nobody creates a load balancer or writes EXTERNAL-IP",
                match &lease {
                    None => "no Lease kube-system/cloud-controller-manager".to_string(),
                    Some(_) => "the Lease kube-system/cloud-controller-manager is stale".to_string(),
                }
            ),
        )
    } else if let Some(e) = last_lb_event.filter(|e| reason_of(e) == "SyncLoadBalancerFailed") {
        let msg = e.message.clone().unwrap_or_default();
        let matched = deny.iter().find(|p| msg.contains(&p.id)).or_else(|| {
            (msg.contains("AccessDenied"))
                .then(|| deny.first())
                .flatten()
        });
        (
            false,
            format!(
                "the cloud refused the load balancer: {msg}{}",
                match matched {
                    Some(p) => format!(
                        " [deny policy {}; `kumo cloud policy allow {}` lifts it]",
                        policy_text(p),
                        p.action
                    ),
                    None => String::new(),
                }
            ),
        )
    } else if service_enabled == Some(false) || (!finalizer && lb_events.is_empty()) {
        (
            false,
            format!(
                "the cloud-controller-manager ({}) runs without its service controller ({}): no finalizer and no events, nobody reconciles this Service",
                lease.as_ref().map(|l| l.holder.as_str()).unwrap_or_default(),
                match &pod_flag {
                    Some((_, flag)) if service_enabled == Some(false) => format!("--controllers={flag}"),
                    _ => "e.g. --controllers=cloud-node,cloud-node-lifecycle".into(),
                }
            ),
        )
    } else if let Some(p) = deny.first() {
        (
            false,
            format!(
                "the cloud denies load-balancer actions ({}); the service controller will fail with AccessDenied",
                policy_text(p)
            ),
        )
    } else if last_lb_event.is_some_and(|e| reason_of(e) == "EnsuringLoadBalancer") {
        (
            false,
            "not decided yet: the service controller is creating the load balancer (EnsuringLoadBalancer without EnsuredLoadBalancer)".into(),
        )
    } else {
        (
            false,
            "EXTERNAL-IP is not set and the evidence names no cause; the cloud-controller-manager's log has the rest".into(),
        )
    };
    Ok(Report {
        healthy,
        verdict,
        evidence: ev,
    })
}

/// The Node doctor.
async fn node(target: &Target, name: &str) -> Result<Report> {
    let client = target.client.clone();
    let dir = target;
    let now = Timestamp::now();
    let mut ev = Vec::new();
    let lease = status::lease(&client, "cloud-controller-manager").await?;
    let node = Api::<Node>::all(client.clone()).get_opt(name).await?;
    let events = events_of(&client, "default", "Node", name, None).await?;
    let cloud = cloud(dir);
    // The node's instance: by providerID, else by the instance's name (the kubelet on an
    // instance registers under its name).
    let provider_id = node
        .as_ref()
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.provider_id.clone())
        .filter(|p| !p.is_empty());
    let mut instance = None;
    match &cloud {
        Err(why) => ev.push(format!("cloud: {why}")),
        Ok(c) => {
            let by_id = provider_id
                .as_deref()
                .and_then(kumo_cloud_provider::kumo::instance_id);
            let found = match by_id {
                Some(id) => ask(c.describe_instance(id)).await.map(Some),
                None => {
                    let filter = kumo_cloud::InstanceFilter {
                        name: Some(name.to_owned()),
                        ..Default::default()
                    };
                    ask(c.list_instances(&filter)).await.map(|is| {
                        is.into_iter()
                            .max_by(|a, b| a.launch_time.cmp(&b.launch_time))
                    })
                }
            };
            match found {
                Ok(Some(i)) => {
                    ev.push(format!(
                        "cloud: instance {} ({}) is {}{}, {} in {}, private IP {}",
                        i.id,
                        if i.name.is_empty() {
                            "no name"
                        } else {
                            &i.name
                        },
                        i.state.as_str(),
                        i.state_reason
                            .as_ref()
                            .map(|r| if r.message.starts_with(&r.code) {
                                format!(" ({})", r.message)
                            } else {
                                format!(" ({}: {})", r.code, r.message)
                            })
                            .unwrap_or_default(),
                        i.instance_type,
                        i.zone,
                        if i.private_ip.is_empty() {
                            "-"
                        } else {
                            &i.private_ip
                        }
                    ));
                    instance = Some(i);
                }
                Ok(None) => ev.push(format!(
                    "cloud: no instance named {name}{}",
                    provider_id
                        .as_deref()
                        .map(|p| format!(" or with providerID {p}"))
                        .unwrap_or_default()
                )),
                Err(e) => ev.push(format!("cloud: looking up the instance: {e}")),
            }
        }
    }
    let Some(node) = node else {
        for e in events.iter().rev().take(6).rev() {
            ev.push(event_line(e, now));
        }
        ev.push(lease_line(&lease));
        let gone = instance.as_ref().filter(|i| {
            matches!(
                i.state,
                kumo_cloud::InstanceState::Terminated | kumo_cloud::InstanceState::ShuttingDown
            )
        });
        let verdict = match gone {
            Some(i) => format!(
                "Node {name} does not exist: its instance {} is {}, and the cloud node-lifecycle controller deletes the Node of an instance that is gone",
                i.id,
                i.state.as_str()
            ),
            None => format!("Node {name} does not exist"),
        };
        return Ok(Report {
            healthy: false,
            verdict,
            evidence: ev,
        });
    };
    ev.insert(
        0,
        format!(
            "spec.providerID: {}",
            provider_id.as_deref().unwrap_or("<none>")
        ),
    );
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let taint_keys: Vec<String> = taints
        .iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    ev.push(format!(
        "taints: {}",
        if taint_keys.is_empty() {
            "none".into()
        } else {
            taint_keys.join(", ")
        }
    ));
    let uninitialized = taints.iter().any(|t| t.key == TAINT_UNINITIALIZED);
    let shutdown = taints.iter().any(|t| t.key == TAINT_SHUTDOWN);
    let addresses: Vec<String> = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
        .iter()
        .map(|a| format!("{}={}", a.type_, a.address))
        .collect();
    ev.push(format!(
        "addresses: {}",
        if addresses.is_empty() {
            "none".into()
        } else {
            addresses.join(", ")
        }
    ));
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let label = |k: &str| labels.get(k).cloned().unwrap_or_else(|| "-".into());
    ev.push(format!(
        "labels: zone {}, region {}, instance-type {}",
        label("topology.kubernetes.io/zone"),
        label("topology.kubernetes.io/region"),
        label("node.kubernetes.io/instance-type")
    ));
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .cloned();
    let ready_status = ready
        .as_ref()
        .map(|c| c.status.clone())
        .unwrap_or_else(|| "Unknown".into());
    ev.push(match &ready {
        None => "condition Ready: none posted yet".into(),
        Some(c) => format!(
            "condition Ready={} ({}{}){}",
            c.status,
            c.reason.as_deref().unwrap_or_default(),
            c.message
                .as_deref()
                .filter(|m| !m.is_empty())
                .map(|m| format!(": {m}"))
                .unwrap_or_default(),
            c.last_heartbeat_time
                .as_ref()
                .map(|t| format!(
                    ", last heartbeat {} ago",
                    status::human(status::age(now, t.0))
                ))
                .unwrap_or_default()
        ),
    });
    ev.push(lease_line(&lease));
    for e in events.iter().rev().take(6).rev() {
        ev.push(event_line(e, now));
    }
    let running = instance
        .as_ref()
        .map(|i| i.state == kumo_cloud::InstanceState::Running);
    let (healthy, verdict) = if uninitialized {
        if !ccm_running(&lease) {
            (false, format!(
                "no cloud-controller-manager is running: nobody initializes {name}, so the {TAINT_UNINITIALIZED} taint stays and pods that do not tolerate it stay Pending"
            ))
        } else if cloud.is_ok() && instance.is_none() {
            (false, format!(
                "the cloud has no instance for {name}: the cloud node controller finds a node's instance by providerID or by name, and without one it cannot initialize the node (the {TAINT_UNINITIALIZED} taint stays)"
            ))
        } else {
            (false, format!(
                "the cloud-controller-manager runs but has not initialized {name}: its cloud node controller is off (--controllers without cloud-node) or failing (see the events and its log); the {TAINT_UNINITIALIZED} taint stays"
            ))
        }
    } else if shutdown {
        (false, format!(
            "the instance of {name} is shut down ({TAINT_SHUTDOWN}): `kumo cloud instance start {}` brings it back",
            instance.as_ref().map(|i| i.id.as_str()).unwrap_or("ID")
        ))
    } else if ready_status != "True" {
        (false, format!(
            "{name} is NotReady (Ready={ready_status}{}): its kubelet is not posting a healthy status{}",
            ready.as_ref().and_then(|c| c.reason.as_deref()).map(|r| format!(", {r}")).unwrap_or_default(),
            match &instance {
                Some(i) if i.state != kumo_cloud::InstanceState::Running => format!("; its instance {} is {}", i.id, i.state.as_str()),
                _ => String::new(),
            }
        ))
    } else if running == Some(false) {
        let i = instance
            .as_ref()
            .map(|i| (i.id.as_str(), i.state.as_str()))
            .unwrap_or_default();
        (
            false,
            format!(
                "{name} is Ready but its instance {} is {}: its kubelet still posts Ready, and the cloud node-lifecycle controller only acts on a NotReady node",
                i.0, i.1
            ),
        )
    } else if provider_id.is_none() {
        (true, format!("{name} is Ready and not managed by a cloud (no providerID: its kubelet runs without --cloud-provider=external)"))
    } else {
        (
            true,
            format!(
                "{name} is initialized by the cloud (providerID {}) and Ready",
                provider_id.as_deref().unwrap_or_default()
            ),
        )
    };
    Ok(Report {
        healthy,
        verdict,
        evidence: ev,
    })
}
