//! The route controller (upstream's `RouteController`, `node-route-controller`): every
//! `--route-reconciliation-period` it makes the cloud's routes match the nodes' pod CIDRs.
//! Each podCIDR of each node gets a route to that node; a route inside `--cluster-cidr`
//! that no node wants, or whose target is gone (blackhole), is deleted; routes outside the
//! cluster CIDR are left alone. Each node's `NetworkUnavailable` condition then says
//! whether all of its routes exist (`RouteCreated`) or not (`NoRouteCreated`), and a failed
//! creation is a `FailedToCreateRoute` event on the node.
//!
//! As upstream with the alpha gate `CloudControllerManagerWatchBasedRoutesReconciliation`
//! off (its default in v1.37), reconciliation is periodic only, not triggered by node
//! changes.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kumo_client::clients::ClientSource;
use kumo_client::error::{is_conflict, message};
use kumo_client::events;
use kumo_client::informer::{Informer, InformerFactory};
use kumo_client::worker::{client_for, wait_for_sync};
use serde_json::json;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use super::Context;
use crate::{Route, Routes};

/// The event source (upstream's recorder component).
pub const COMPONENT: &str = "route_controller";
/// The node condition the controller owns.
pub const CONDITION: &str = "NetworkUnavailable";
/// The condition's reason and message once all of a node's routes exist.
pub const REASON_CREATED: &str = "RouteCreated";
/// The condition's message with [`REASON_CREATED`].
pub const MESSAGE_CREATED: &str = "RouteController created a route";
/// The condition's reason while a route of the node is missing.
pub const REASON_NOT_CREATED: &str = "NoRouteCreated";
/// The condition's message with [`REASON_NOT_CREATED`].
pub const MESSAGE_NOT_CREATED: &str = "RouteController failed to create a route";
/// The event of a failed creation.
pub const FAILED_TO_CREATE_ROUTE: &str = "FailedToCreateRoute";

/// Upstream's maxConcurrentRouteOperations: route calls in flight at once.
const MAX_CONCURRENT_ROUTE_OPERATIONS: usize = 200;
/// Upstream's updateNetworkConditionBackoff: 5 tries, 100 ms with a jitter of 1.0.
const UPDATE_STEPS: u32 = 5;
const UPDATE_DELAY: Duration = Duration::from_millis(100);

/// What a pod CIDR of a node needs (upstream's routeAction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// The route exists.
    Keep,
    /// The route is missing.
    Add,
    /// The route exists with stale node addresses: deleted, then created.
    Update,
}

impl Action {
    /// Upstream's names, as its log lines print them.
    fn as_str(self) -> &'static str {
        match self {
            Action::Keep => "keep",
            Action::Add => "add",
            Action::Update => "update",
        }
    }
}

/// What the reconcile knows about one target node (upstream's routeNode): its current
/// routes and, per pod CIDR, what it needs.
#[derive(Default)]
struct RouteNode {
    routes: Vec<Route>,
    actions: BTreeMap<String, Action>,
}

/// A parsed CIDR: the network's first and last address in its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cidr {
    v6: bool,
    first: u128,
    last: u128,
}

impl Cidr {
    /// `a.b.c.d/n` or an IPv6 CIDR; leading zeros in IPv4 octets are accepted, as
    /// netutils.ParseCIDRSloppy does.
    fn parse(s: &str) -> Option<Cidr> {
        let (ip, len) = s.trim().split_once('/')?;
        let prefix: u32 = len.parse().ok()?;
        let ip: IpAddr = ip.parse().ok().or_else(|| sloppy_v4(ip))?;
        let (v6, bits, addr) = match ip {
            IpAddr::V4(a) => (false, 32, u128::from(u32::from(a))),
            IpAddr::V6(a) => (true, 128, u128::from(a)),
        };
        if prefix > bits {
            return None;
        }
        let host = bits - prefix;
        let host_mask = if host >= 128 {
            u128::MAX
        } else {
            (1u128 << host) - 1
        };
        Some(Cidr {
            v6,
            first: addr & !host_mask,
            last: addr | host_mask,
        })
    }

    fn contains(&self, v6: bool, addr: u128) -> bool {
        self.v6 == v6 && self.first <= addr && addr <= self.last
    }
}

fn sloppy_v4(s: &str) -> Option<IpAddr> {
    let octets: Vec<u8> = s
        .split('.')
        .map(|o| o.parse::<u8>().ok())
        .collect::<Option<_>>()?;
    let o: [u8; 4] = octets.try_into().ok()?;
    Some(IpAddr::from(o))
}

/// `--cluster-cidr` as upstream's processCIDRs and startRouteController check it: one or
/// two comma-separated CIDRs, two only when one of each family.
fn cluster_cidrs(flag: &str) -> Result<Vec<Cidr>, String> {
    let mut out = Vec::new();
    for s in flag.trim().split(',') {
        out.push(Cidr::parse(s).ok_or_else(|| format!("invalid CIDR address: {s}"))?);
    }
    let dual_stack = out.iter().any(|c| c.v6) && out.iter().any(|c| !c.v6);
    if out.len() > 1 && !dual_stack {
        return Err(format!(
            "len of ClusterCIDRs=={} and they are not configured as dual stack (at least one from each IPFamily",
            out.len()
        ));
    }
    if out.len() > 2 {
        return Err(format!(
            "length of clusterCIDRs is:{} more than max allowed of 2",
            out.len()
        ));
    }
    Ok(out)
}

/// A duration as Go's `time.Duration.String` prints it (upstream's messages embed it).
fn go_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    let frac = |whole: u128, rem: u128, width: usize| {
        let f = format!("{rem:0width$}");
        let f = f.trim_end_matches('0');
        if f.is_empty() {
            whole.to_string()
        } else {
            format!("{whole}.{f}")
        }
    };
    match ns {
        0 => "0s".to_owned(),
        1..=999 => format!("{ns}ns"),
        1_000..=999_999 => format!("{}µs", frac(ns / 1_000, ns % 1_000, 3)),
        1_000_000..=999_999_999 => {
            format!("{}ms", frac(ns / 1_000_000, ns % 1_000_000, 6))
        }
        _ => {
            let secs = ns / 1_000_000_000;
            let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
            let mut out = String::new();
            if h > 0 {
                out.push_str(&format!("{h}h"));
            }
            if h > 0 || m > 0 {
                out.push_str(&format!("{m}m"));
            }
            out.push_str(&frac(s, ns % 1_000_000_000, 9));
            out.push('s');
            out
        }
    }
}

/// `base` plus up to `base` again (wait.Backoff's Jitter 1.0).
fn jittered(base: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    base + base.mul_f64(f64::from(nanos % 1000) / 1000.0)
}

struct Ctl {
    ctx: Arc<Context>,
    client: ClientSource,
    nodes: Arc<Informer<Node>>,
    cluster_cidrs: Vec<Cidr>,
}

/// Registers the controller's handlers on `factory` and starts its workers.
pub fn start(
    ctx: Arc<Context>,
    factory: &InformerFactory,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let mut stop = stop;
    let nodes = factory.informer::<Node>();
    tokio::spawn(async move {
        // Upstream refuses to start the controller (and the CCM) on a bad --cluster-cidr.
        let flag = ctx.config.cluster_cidr.clone().unwrap_or_default();
        let cluster_cidrs = match cluster_cidrs(&flag) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("node-route-controller: not started: --cluster-cidr {flag:?}: {e}");
                return;
            }
        };
        let Some(client) = client_for(&ctx.clients, "route-controller", &mut stop).await else {
            return;
        };
        let ctl = Ctl {
            ctx,
            client,
            nodes,
            cluster_cidrs,
        };
        tracing::info!("Starting route controller");
        if !wait_for_sync(&mut stop, ctl.nodes.wait_synced()).await {
            return;
        }
        // Like wait.NonSlidingUntil: the period runs from the start of each pass.
        let period = ctl.ctx.config.route_reconciliation_period;
        loop {
            let next = tokio::time::Instant::now() + period;
            if let Err(e) = ctl.reconcile_node_routes().await {
                tracing::error!("Couldn't reconcile node routes: {e}");
            }
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        tracing::info!("Shutting down route controller");
    })
}

/// The node's `NetworkUnavailable` condition's status and reason.
fn network_condition(node: &Node) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn pod_cidrs(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

fn node_name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

/// Upstream's getRouteAction: keep a route to `cidr` unless it carries node addresses
/// that differ from the node's.
fn route_action(
    routes: &[Route],
    cidr: &str,
    addrs: &[k8s_openapi::api::core::v1::NodeAddress],
) -> Action {
    match routes.iter().find(|r| r.destination_cidr == cidr) {
        None => Action::Add,
        Some(r) if !r.enable_node_addresses => Action::Keep,
        Some(r) => {
            let same = addrs.len() == r.target_node_addresses.len()
                && addrs.iter().all(|a| r.target_node_addresses.contains(a));
            if same {
                Action::Keep
            } else {
                tracing::info!(
                    "Node addresses have changed from {:?} to {:?}",
                    r.target_node_addresses,
                    addrs
                );
                Action::Update
            }
        }
    }
}

impl Ctl {
    fn routes(&self) -> Option<&dyn Routes> {
        self.ctx.cloud.routes()
    }

    async fn reconcile_node_routes(&self) -> Result<(), String> {
        let Some(routes) = self.routes() else {
            return Ok(());
        };
        let list = routes
            .list_routes(&self.ctx.config.cluster_name)
            .await
            .map_err(|e| format!("error listing routes: {e}"))?;
        let nodes = self.nodes.list();
        self.reconcile(routes, &nodes, list).await;
        Ok(())
    }

    /// Whether `route` is inside the cluster CIDR(s) (its first or last address is).
    fn is_responsible_for_route(&self, route: &Route) -> bool {
        let Some(c) = Cidr::parse(&route.destination_cidr) else {
            tracing::error!(
                "Ignoring route {}, unparsable CIDR: invalid CIDR address: {}",
                route.name,
                route.destination_cidr
            );
            return false;
        };
        self.cluster_cidrs
            .iter()
            .any(|cc| cc.contains(c.v6, c.first) || cc.contains(c.v6, c.last))
    }

    async fn reconcile(&self, routes_api: &dyn Routes, nodes: &[Arc<Node>], routes: Vec<Route>) {
        let cluster = self.ctx.config.cluster_name.as_str();
        // Each target node's routes, then what each of its pod CIDRs needs.
        let mut route_map: BTreeMap<String, RouteNode> = BTreeMap::new();
        for r in &routes {
            if r.target_node.is_empty() {
                continue;
            }
            route_map
                .entry(r.target_node.clone())
                .or_default()
                .routes
                .push(r.clone());
        }
        for node in nodes {
            let cidrs = pod_cidrs(node);
            if cidrs.is_empty() {
                // Not assigned a CIDR yet.
                continue;
            }
            let name = node_name(node);
            let addrs = node
                .status
                .as_ref()
                .and_then(|s| s.addresses.clone())
                .unwrap_or_default();
            let rn = route_map.entry(name.clone()).or_default();
            for cidr in cidrs {
                let action = route_action(&rn.routes, &cidr, &addrs);
                tracing::info!(
                    "action for Node {name:?} with CIDR {cidr:?}: {:?}",
                    action.as_str()
                );
                rn.actions.insert(cidr, action);
            }
        }

        let limiter = Semaphore::new(MAX_CONCURRENT_ROUTE_OPERATIONS);
        let limiter = &limiter;

        // Delete blackholed routes and the ones no node wants (or that must be recreated).
        let should_delete = |node: &str, cidr: &str| match route_map.get(node) {
            None => true,
            Some(rn) => match rn.actions.get(cidr) {
                Some(Action::Keep) => false,
                other => {
                    tracing::info!("route should be deleted, spec: exist: {}, action: {:?}, Node {node:?}, CIDR {cidr:?}", other.is_some(), other.map_or("", |a| a.as_str()));
                    true
                }
            },
        };
        let deletes = join_all(
            routes
                .iter()
                .filter(|r| self.is_responsible_for_route(r))
                .filter(|r| r.blackhole || should_delete(&r.target_node, &r.destination_cidr))
                .map(|r| async move {
                    let start = Instant::now();
                    let _permit = limiter.acquire().await;
                    tracing::info!("Deleting route {} {}", r.name, r.destination_cidr);
                    match routes_api.delete_route(cluster, r).await {
                        Ok(()) => tracing::info!(
                            "Deleted route {} {} after {}",
                            r.name,
                            r.destination_cidr,
                            go_duration(start.elapsed())
                        ),
                        Err(e) => tracing::error!(
                            "Could not delete route {} {} after {}: {e}",
                            r.name,
                            r.destination_cidr,
                            go_duration(start.elapsed())
                        ),
                    }
                }),
        );

        // Create the missing routes (and the ones being updated).
        let mut wanted = Vec::new();
        for node in nodes {
            let name = node_name(node);
            for cidr in pod_cidrs(node) {
                let action = route_map.get(&name).and_then(|rn| rn.actions.get(&cidr));
                if matches!(action, Some(Action::Add | Action::Update)) {
                    wanted.push((node.clone(), name.clone(), cidr));
                }
            }
        }
        let creates = join_all(wanted.into_iter().map(|(node, name, cidr)| async move {
            let route = Route {
                target_node: name.clone(),
                target_node_addresses: node
                    .status
                    .as_ref()
                    .and_then(|s| s.addresses.clone())
                    .unwrap_or_default(),
                destination_cidr: cidr.clone(),
                ..Default::default()
            };
            let name_hint = node.metadata.uid.clone().unwrap_or_default();
            let start = Instant::now();
            let result = {
                let _permit = limiter.acquire().await;
                tracing::info!(
                    "Creating route for node {name} {cidr} with hint {name_hint}, throttled {}",
                    go_duration(start.elapsed())
                );
                routes_api.create_route(cluster, &name_hint, &route).await
            };
            match result {
                Ok(()) => {
                    tracing::info!(
                        "Created route for node {name} {cidr} with hint {name_hint} after {}",
                        go_duration(start.elapsed())
                    );
                    Some((name, cidr))
                }
                Err(e) => {
                    let msg = format!(
                        "Could not create route {name_hint} {cidr} for node {name} after {}: {e}",
                        go_duration(start.elapsed())
                    );
                    let reference = ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Node".into()),
                        name: Some(name.clone()),
                        uid: node.metadata.uid.clone(),
                        ..Default::default()
                    };
                    events::record(
                        &self.client,
                        COMPONENT,
                        reference,
                        "Warning",
                        FAILED_TO_CREATE_ROUTE,
                        msg,
                    )
                    .await;
                    tracing::error!(
                        "Could not create route {name_hint} {cidr} for node {name}: {e}"
                    );
                    None
                }
            }
        }));

        // With node addresses in routes, an updated route is deleted before it is created
        // again (kubernetes#98359); otherwise both run at once.
        let created = if routes.first().is_some_and(|r| r.enable_node_addresses) {
            deletes.await;
            creates.await
        } else {
            futures::future::join(deletes, creates).await.1
        };
        for (name, cidr) in created.into_iter().flatten() {
            if let Some(rn) = route_map.get_mut(&name) {
                rn.actions.insert(cidr, Action::Keep);
            }
        }

        // Each node's condition says whether all of its routes exist.
        join_all(nodes.iter().filter_map(|node| {
            let rn = route_map.get(&node_name(node))?;
            let created = if rn.actions.is_empty() {
                tracing::info!(
                    "node {} has no routes assigned to it. NodeNetworkUnavailable will be set to true",
                    node_name(node)
                );
                false
            } else {
                rn.actions.values().all(|a| *a == Action::Keep)
            };
            Some(async move {
                if let Err(e) = self.update_networking_condition(node, created).await {
                    tracing::error!("failed to update networking condition: {e}");
                }
            })
        }))
        .await;
    }

    /// Sets NetworkUnavailable (False/RouteCreated or True/NoRouteCreated) unless it already
    /// says so; heartbeat and transition times are both now, as upstream's SetNodeCondition.
    async fn update_networking_condition(
        &self,
        node: &Node,
        routes_created: bool,
    ) -> Result<(), String> {
        let name = node_name(node);
        let current = network_condition(node);
        let (status, reason, message_) = if routes_created {
            ("False", REASON_CREATED, MESSAGE_CREATED)
        } else {
            ("True", REASON_NOT_CREATED, MESSAGE_NOT_CREATED)
        };
        if current
            .as_ref()
            .is_some_and(|(s, r)| s == status && r == reason)
        {
            tracing::debug!(
                "set node {name} with NodeNetworkUnavailable={} was canceled because it is already set",
                !routes_created
            );
            return Ok(());
        }
        tracing::info!(
            "Patching node status {name} with {routes_created} previous condition was:{current:?}"
        );
        let api: Api<Node> = Api::all(self.client.get());
        let mut step = 0;
        loop {
            step += 1;
            let now = Time(Timestamp::now());
            let patch = json!({"status": {"conditions": [{
                "type": CONDITION,
                "status": status,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
                "reason": reason,
                "message": message_,
            }]}});
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if is_conflict(&e) && step < UPDATE_STEPS => {
                    tracing::debug!("Error updating node {name}, retrying: {}", message(&e));
                    tokio::time::sleep(jittered(UPDATE_DELAY)).await;
                }
                Err(e) => {
                    let msg = message(&e);
                    tracing::error!("Error updating node {name}: {msg}");
                    return Err(msg);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_go_does() {
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(Duration::from_nanos(450)), "450ns");
        assert_eq!(go_duration(Duration::from_nanos(1_500)), "1.5µs");
        assert_eq!(go_duration(Duration::from_micros(2_345)), "2.345ms");
        assert_eq!(go_duration(Duration::from_millis(1_500)), "1.5s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
    }

    #[test]
    fn cluster_cidr_flag_and_responsibility() {
        let c = cluster_cidrs("10.244.0.0/16").expect("one");
        assert_eq!(c.len(), 1);
        let inside = Cidr::parse("10.244.3.0/24").expect("cidr");
        assert!(c[0].contains(false, inside.first));
        let outside = Cidr::parse("192.168.0.0/24").expect("cidr");
        assert!(!c[0].contains(false, outside.first) && !c[0].contains(false, outside.last));
        // Upstream looks only at a route's ends: a wider route is not the cluster's.
        let wide = Cidr::parse("10.0.0.0/8").expect("cidr");
        assert!(!c[0].contains(false, wide.first) && !c[0].contains(false, wide.last));
        assert!(cluster_cidrs("10.244.0.0/16,fd00::/48").is_ok());
        assert!(cluster_cidrs("10.244.0.0/16,10.245.0.0/16").is_err());
        assert!(cluster_cidrs("").is_err());
        assert!(cluster_cidrs("010.244.0.0/16").is_ok());
    }

    #[test]
    fn actions_keep_add_update() {
        let r = Route {
            destination_cidr: "10.244.1.0/24".into(),
            ..Default::default()
        };
        assert_eq!(
            route_action(std::slice::from_ref(&r), "10.244.1.0/24", &[]),
            Action::Keep
        );
        assert_eq!(
            route_action(std::slice::from_ref(&r), "10.244.2.0/24", &[]),
            Action::Add
        );
        let with_addrs = Route {
            enable_node_addresses: true,
            ..r
        };
        let addr = k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.5".into(),
        };
        assert_eq!(
            route_action(&[with_addrs], "10.244.1.0/24", &[addr]),
            Action::Update
        );
    }
}
