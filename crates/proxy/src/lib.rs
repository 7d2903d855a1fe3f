//! kumo's kube-proxy: an API client (user `system:kube-proxy`, which the bootstrap policy
//! binds to `system:node-proxier`) that watches Services, EndpointSlices and Nodes and
//! programs a data plane ([`dataplane::Dataplane`]; the simulator's in-process network
//! implements it today), as kube-proxy programs a node's iptables/nftables rules:
//!
//! * every ClusterIP:port (and `externalIPs`), every node IP:nodePort of a NodePort or
//!   LoadBalancer Service, and every LoadBalancer ingress IP:port goes to the Service's
//!   ready endpoints (pod IP:targetPort from its EndpointSlices); `externalTrafficPolicy:
//!   Local` keeps a node's NodePort to the endpoints on that node; a Service without
//!   ready endpoints rejects connections;
//! * the cluster DNS records (CoreDNS's part, kept here so one watch serves both; see
//!   [`dataplane::Rr`]): A, SRV and PTR records of each Service and of a headless
//!   Service's ready endpoints, a CNAME for an ExternalName Service.
//!
//! Everything comes from watches through the shared informers of
//! [`kumo_client::informer`]; the proxy never reads storage.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
pub mod conntrack;
pub mod dataplane;
pub mod health;
pub mod metrics;
pub mod nft;

use dataplane::{Dataplane, Protocol, RData, Rr, Rule, ServiceEntry, CLUSTER_DOMAIN};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Proxy errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Client(#[from] kumo_client::Error),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// The label naming an EndpointSlice's Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The caches the rules are computed from.
struct State {
    services: Arc<Informer<Service>>,
    slices: Arc<Informer<EndpointSlice>>,
    /// `None` for a consumer of the records only (the DNS server), which may not list
    /// Nodes.
    nodes: Option<Arc<Informer<Node>>>,
    dataplane: Arc<dyn Dataplane>,
}

impl State {
    /// Programs Service `key` (`ns/name`) from the caches, or removes it.
    fn sync(&self, key: &str) {
        let Some(svc) = self.services.get(key) else {
            self.dataplane.remove_service(key);
            return;
        };
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let slices: Vec<Arc<EndpointSlice>> = self
            .slices
            .list()
            .into_iter()
            .filter(|s| {
                s.metadata.namespace.as_deref() == Some(ns.as_str())
                    && s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(SERVICE_NAME_LABEL))
                        == Some(&name)
            })
            .collect();
        let nodes = self.nodes.as_ref().map(|n| n.list()).unwrap_or_default();
        match service_entry(&svc, &slices, &nodes) {
            Some(entry) => self.dataplane.set_service(key, entry),
            None => self.dataplane.remove_service(key),
        }
    }

    fn sync_all(&self) {
        let keys: BTreeSet<String> = self
            .services
            .list()
            .iter()
            .map(|s| key_of(s.as_ref()))
            .collect();
        self.dataplane.retain_services(&|k: &str| keys.contains(k));
        for k in &keys {
            self.sync(k);
        }
    }
}

/// A node's addresses that NodePorts answer on (InternalIP and ExternalIP).
fn node_ips(node: &Node) -> Vec<IpAddr> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// What a Service programs: its rules and DNS records (`None`: nothing to program).
pub fn service_entry(
    svc: &Service,
    slices: &[Arc<EndpointSlice>],
    nodes: &[Arc<Node>],
) -> Option<ServiceEntry> {
    let spec = svc.spec.as_ref()?;
    let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref()?;
    let fqdn = format!("{name}.{ns}.svc.{CLUSTER_DOMAIN}");
    if ty == "ExternalName" {
        // No rules; the name is an alias of the external one.
        let target = spec.external_name.as_deref().unwrap_or_default();
        let records = if target.is_empty() {
            Vec::new()
        } else {
            vec![Rr::new(&fqdn, RData::Cname(target.to_owned()))]
        };
        return Some(ServiceEntry {
            rules: Vec::new(),
            records,
            affinity: None,
        });
    }
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let cluster_ips: Vec<IpAddr> = spec
        .cluster_ips
        .clone()
        .unwrap_or_else(|| spec.cluster_ip.iter().cloned().collect())
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    let external_ips: Vec<IpAddr> = spec
        .external_ips
        .iter()
        .flatten()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    let lb_ips: Vec<IpAddr> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ing| {
            ing.iter()
                // ipMode Proxy: the load balancer itself proxies, traffic arrives at nodes.
                .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
                .filter_map(|i| i.ip.as_deref().and_then(|ip| ip.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    let local = spec.external_traffic_policy.as_deref() == Some("Local");
    // ClientIP affinity, 10800 s (3 hours) unless the Service says otherwise.
    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        let secs = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u64::try_from(t).ok())
            .unwrap_or(10800);
        std::time::Duration::from_secs(secs)
    });
    let mut rules = Vec::new();
    let mut all_ready: BTreeSet<IpAddr> = BTreeSet::new();
    // Ready endpoint address → its hostname (headless Services publish it).
    let mut hostnames: std::collections::BTreeMap<IpAddr, Option<String>> = Default::default();
    let mut records = Vec::new();
    for port in spec.ports.iter().flatten() {
        let protocol = Protocol::parse(port.protocol.as_deref());
        let pname = port.name.clone().unwrap_or_default();
        // (endpoint, its node) for each ready endpoint of this port, and for each one
        // still serving while it terminates (used only where no ready one is).
        let mut eps: Vec<(SocketAddr, Option<String>)> = Vec::new();
        let mut terminating: Vec<(SocketAddr, Option<String>)> = Vec::new();
        for slice in slices {
            let Some(sp) = slice.ports.iter().flatten().find(|p| {
                p.name.clone().unwrap_or_default() == pname
                    && Protocol::parse(p.protocol.as_deref()) == protocol
            }) else {
                continue;
            };
            let Some(target) = sp.port.and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            for ep in slice.endpoints.iter().flatten() {
                let c = ep.conditions.as_ref();
                let ready = c.and_then(|c| c.ready) != Some(false);
                let serving_terminating = c.and_then(|c| c.serving) == Some(true)
                    && c.and_then(|c| c.terminating) == Some(true);
                if !ready {
                    if serving_terminating {
                        for a in &ep.addresses {
                            if let Ok(ip) = a.parse::<IpAddr>() {
                                let sa = SocketAddr::new(ip, target);
                                if !terminating.iter().any(|(e, _)| *e == sa) {
                                    terminating.push((sa, ep.node_name.clone()));
                                }
                            }
                        }
                    }
                    continue;
                }
                for a in &ep.addresses {
                    if let Ok(ip) = a.parse::<IpAddr>() {
                        let h = hostnames.entry(ip).or_default();
                        if h.is_none() {
                            h.clone_from(&ep.hostname);
                        }
                        let sa = SocketAddr::new(ip, target);
                        if !eps.iter().any(|(e, _)| *e == sa) {
                            eps.push((sa, ep.node_name.clone()));
                        }
                    }
                }
            }
        }
        all_ready.extend(eps.iter().map(|(e, _)| e.ip()));
        // SRV for a named port: the Service's name, or for a headless Service each ready
        // endpoint's own name, on the port it listens on.
        if !pname.is_empty() {
            let proto = match protocol {
                Protocol::Tcp => "tcp",
                Protocol::Udp => "udp",
                Protocol::Sctp => "sctp",
            };
            let srv = format!("_{pname}._{proto}.{fqdn}");
            if headless {
                let mut seen = BTreeSet::new();
                for (e, _) in &eps {
                    if seen.insert(*e) {
                        let target = format!("{}.{fqdn}", endpoint_label(e.ip(), &hostnames));
                        let weight = (100 / eps.len().max(1)) as u16;
                        records.push(Rr::new(
                            &srv,
                            RData::Srv {
                                priority: 0,
                                weight,
                                port: e.port(),
                                target,
                            },
                        ));
                    }
                }
            } else if let Ok(port) = u16::try_from(port.port) {
                records.push(Rr::new(
                    &srv,
                    RData::Srv {
                        priority: 0,
                        weight: 100,
                        port,
                        target: fqdn.clone(),
                    },
                ));
            }
        }
        // kube-proxy's fallback: with no ready endpoint, the serving terminating ones
        // take the traffic (DNS keeps naming the ready ones only).
        let routed = if eps.is_empty() { &terminating } else { &eps };
        let everywhere: Vec<SocketAddr> = routed.iter().map(|(e, _)| *e).collect();
        let Ok(svc_port) = u16::try_from(port.port) else {
            continue;
        };
        if !headless {
            for ip in cluster_ips.iter().chain(&external_ips).chain(&lb_ips) {
                rules.push(Rule {
                    frontend: SocketAddr::new(*ip, svc_port),
                    protocol,
                    endpoints: everywhere.clone(),
                });
            }
        }
        let node_port = port.node_port.and_then(|p| u16::try_from(p).ok());
        if let (Some(np), "NodePort" | "LoadBalancer") = (node_port, ty) {
            for node in nodes {
                let node_name = node.metadata.name.clone();
                let endpoints: Vec<SocketAddr> = if local {
                    let on_node = |set: &[(SocketAddr, Option<String>)]| -> Vec<SocketAddr> {
                        set.iter()
                            .filter(|(_, n)| *n == node_name)
                            .map(|(e, _)| *e)
                            .collect()
                    };
                    match on_node(&eps) {
                        ready if ready.is_empty() => on_node(&terminating),
                        ready => ready,
                    }
                } else {
                    everywhere.clone()
                };
                for ip in node_ips(node) {
                    rules.push(Rule {
                        frontend: SocketAddr::new(ip, np),
                        protocol,
                        endpoints: endpoints.clone(),
                    });
                }
            }
        }
    }
    if headless {
        for ip in &all_ready {
            let own = format!("{}.{fqdn}", endpoint_label(*ip, &hostnames));
            records.push(Rr::new(&fqdn, RData::A(*ip)));
            records.push(Rr::new(&own, RData::A(*ip)));
            records.push(Rr::new(&dataplane::reverse_name(*ip), RData::Ptr(own)));
        }
    } else {
        for ip in &cluster_ips {
            records.push(Rr::new(&fqdn, RData::A(*ip)));
            records.push(Rr::new(
                &dataplane::reverse_name(*ip),
                RData::Ptr(fqdn.clone()),
            ));
        }
    }
    // kube-proxy leaves Services another proxy implements (and headless ones) alone; their
    // DNS records are CoreDNS's and stay.
    let labels = svc.metadata.labels.as_ref();
    let other_proxy = labels.is_some_and(|l| {
        l.contains_key(SERVICE_PROXY_NAME_LABEL) || l.contains_key(HEADLESS_LABEL)
    });
    Some(ServiceEntry {
        rules: if other_proxy { Vec::new() } else { rules },
        records,
        affinity,
    })
}

/// The label naming the proxy that implements a Service in place of kube-proxy.
const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// The label that marks a Service headless for the proxies.
const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// The leftmost label of a headless Service's endpoint: its hostname, else its address
/// with dashes (`10-244-0-5`).
fn endpoint_label(
    ip: IpAddr,
    hostnames: &std::collections::BTreeMap<IpAddr, Option<String>>,
) -> String {
    match hostnames.get(&ip) {
        Some(Some(h)) if !h.is_empty() => h.clone(),
        _ => ip.to_string().replace(['.', ':'], "-"),
    }
}

/// A running proxy.
pub struct Proxy {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    services: Arc<Informer<Service>>,
    slices: Arc<Informer<EndpointSlice>>,
    nodes: Option<Arc<Informer<Node>>>,
}

impl Proxy {
    /// Starts watching through `client` and programming `dataplane`.
    pub fn start(client: Client, dataplane: Arc<dyn Dataplane>) -> Proxy {
        Proxy::start_with(client, dataplane, true)
    }

    /// As [`Proxy::start`]; without `watch_nodes` no node port rule is computed (for a
    /// data plane that keeps only the DNS records, with CoreDNS's permissions).
    pub fn start_with(client: Client, dataplane: Arc<dyn Dataplane>, watch_nodes: bool) -> Proxy {
        let factory = InformerFactory::new(client);
        let state = Arc::new(State {
            services: factory.informer::<Service>(),
            slices: factory.informer::<EndpointSlice>(),
            nodes: watch_nodes.then(|| factory.informer::<Node>()),
            dataplane,
        });
        let s = state.clone();
        state.services.add_handler(move |c| {
            let obj = match c {
                Change::Added(o) | Change::Deleted(o) => o,
                Change::Updated { new, .. } => new,
            };
            s.sync(&key_of(obj));
        });
        let s = state.clone();
        state.slices.add_handler(move |c| {
            let obj = match c {
                Change::Added(o) | Change::Deleted(o) => o,
                Change::Updated { new, .. } => new,
            };
            let ns = obj.metadata.namespace.as_deref().unwrap_or_default();
            if let Some(svc) = obj
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
            {
                s.sync(&format!("{ns}/{svc}"));
            }
        });
        let s = state.clone();
        let nodes = state.nodes.clone();
        nodes.iter().for_each(|n| {
            n.add_handler({
                let s = s.clone();
                move |c| {
                    match c {
                        Change::Added(n) | Change::Updated { new: n, .. } => {
                            let name = n.metadata.name.clone().unwrap_or_default();
                            s.dataplane.set_node(&name, node_ips(n));
                        }
                        Change::Deleted(n) => {
                            let name = n.metadata.name.clone().unwrap_or_default();
                            s.dataplane.set_node(&name, Vec::new());
                        }
                    }
                    // NodePorts answer on every node's addresses.
                    if s.services.has_synced() {
                        s.sync_all();
                    }
                }
            })
        });
        let (stop, rx) = watch::channel(false);
        let tasks = factory.start(rx);
        Proxy {
            stop,
            tasks,
            services: state.services.clone(),
            slices: state.slices.clone(),
            nodes: state.nodes.clone(),
        }
    }

    /// Waits until the first lists of Services, EndpointSlices and Nodes are programmed.
    pub async fn wait_synced(&self) {
        self.services.wait_synced().await;
        self.slices.wait_synced().await;
        if let Some(n) = &self.nodes {
            n.wait_synced().await;
        }
    }

    /// Runs until the watches end (they end only when stopped).
    pub async fn wait(mut self) {
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Runs the proxy with the identity of `kubeconfig` until its watches end.
pub async fn run(kubeconfig: &Path, dataplane: Arc<dyn Dataplane>) -> Result<(), Error> {
    let config = kumo_client::clients::config_from_kubeconfig(kubeconfig).await?;
    let client = kumo_client::transport::client(config)?;
    Proxy::start(client, dataplane).wait().await;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// With no ready endpoint, the serving terminating ones take the traffic; DNS and the
    /// ready set are untouched.
    #[test]
    fn terminating_endpoints_take_over_when_none_is_ready() {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.50", "clusterIPs": ["10.96.0.50"],
                "ports": [{"port": 80, "protocol": "TCP"}]}
        }))
        .unwrap();
        let slice = |conds: serde_json::Value| -> Arc<EndpointSlice> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "web-x", "namespace": "default",
                        "labels": {SERVICE_NAME_LABEL: "web"}},
                    "addressType": "IPv4",
                    "ports": [{"port": 8080, "protocol": "TCP"}],
                    "endpoints": [
                        {"addresses": ["10.244.0.5"], "conditions": conds},
                        {"addresses": ["10.244.0.6"],
                         "conditions": {"ready": false, "serving": false, "terminating": true}}
                    ]
                }))
                .unwrap(),
            )
        };
        let endpoints = |s: Arc<EndpointSlice>| -> Vec<String> {
            let e = service_entry(&svc, &[s], &[]).unwrap();
            e.rules[0].endpoints.iter().map(|a| a.to_string()).collect()
        };
        let terminating =
            slice(serde_json::json!({"ready": false, "serving": true, "terminating": true}));
        assert_eq!(endpoints(terminating), ["10.244.0.5:8080"]);
        let ready =
            slice(serde_json::json!({"ready": true, "serving": true, "terminating": false}));
        assert_eq!(endpoints(ready), ["10.244.0.5:8080"]);
        let gone =
            slice(serde_json::json!({"ready": false, "serving": false, "terminating": true}));
        assert!(endpoints(gone).is_empty());
    }

    /// A Service another proxy implements gets no rules from kube-proxy's role, but its
    /// DNS records stay (CoreDNS's role).
    #[test]
    fn services_of_another_proxy_get_no_rules() {
        let svc = |labels: Option<(&str, &str)>| -> Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web", "namespace": "default",
                    "labels": labels.map(|(k, v)| serde_json::json!({k: v})).unwrap_or_default()},
                "spec": {"clusterIP": "10.96.0.50", "clusterIPs": ["10.96.0.50"],
                    "ports": [{"port": 80, "protocol": "TCP"}]}
            }))
            .unwrap()
        };
        let plain = service_entry(&svc(None), &[], &[]).unwrap();
        assert!(!plain.rules.is_empty());
        for label in [SERVICE_PROXY_NAME_LABEL, HEADLESS_LABEL] {
            let other = service_entry(&svc(Some((label, "x"))), &[], &[]).unwrap();
            assert!(other.rules.is_empty(), "{label}");
            assert_eq!(other.records, plain.records);
        }
    }
}
