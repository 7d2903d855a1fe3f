//! endpoints-controller: the legacy core/v1 Endpoints of every Service with a selector:
//! ready pods under `addresses`, others under `notReadyAddresses`, subsets packed by
//! the ports the pods resolve the Service's target ports to, at most 1000 addresses
//! (`endpoints.kubernetes.io/over-capacity: truncated` beyond). Deleted with the Service.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::endpointslice::{
    find_port, is_external_name, is_pod_ready, is_service_ip_set, pod_ips, pods_for,
    queue_pod_services, rv, selector, set_trigger_time, should_pod_be_in_endpoints,
    should_set_hostname, TriggerTimeTracker, LABEL_HEADLESS,
};
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_not_found, message, namespace_terminating};
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

/// The label marking Endpoints this controller manages.
pub const LABEL_MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";
/// Its value: the controller's name.
pub const CONTROLLER_NAME: &str = "endpoint-controller";
/// The annotation set when addresses were left out.
pub const OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
/// The most addresses an Endpoints object keeps.
pub const MAX_CAPACITY: usize = 1000;
/// Endpoints used as leader-election locks carry this; they are never cleaned up.
const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

struct Ctl {
    client: ClientSource,
    services: Arc<Informer<Service>>,
    pods: Arc<Informer<Pod>>,
    endpoints: Arc<Informer<Endpoints>>,
    triggers: TriggerTimeTracker,
    /// The resourceVersion of our last write per Service, so a sync does not act on a
    /// cache that has not seen it yet.
    written: Mutex<HashMap<String, u64>>,
}

/// Registers the handlers and returns the controller task (workers start once the caches synced).
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("endpoint");
    let services = factory.informer::<Service>();
    let pods = factory.informer::<Pod>();
    let endpoints = factory.informer::<Endpoints>();
    let q = queue.clone();
    services.add_handler(move |c| {
        let (Change::Added(s) | Change::Updated { new: s, .. } | Change::Deleted(s)) = c;
        q.add(key_of(s));
    });
    let q = queue.clone();
    let svcs = services.clone();
    pods.add_handler(move |c| queue_pod_services(&svcs, &q, c));
    let q = queue.clone();
    endpoints.add_handler(move |c| {
        if let Change::Deleted(e) = c {
            q.add(key_of(e));
        }
    });
    tokio::spawn(async move {
        tracing::info!("Starting endpoint controller");
        let Some(client) = client_for(&clients, "endpoint-controller", &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            services,
            pods,
            endpoints,
            triggers: TriggerTimeTracker::default(),
            written: Mutex::new(HashMap::new()),
        });
        let synced = async {
            ctl.services.wait_synced().await;
            ctl.pods.wait_synced().await;
            ctl.endpoints.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        // Endpoints left behind by Services deleted while no controller ran.
        for e in ctl.endpoints.list() {
            let leader = e
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(LEADER_ANNOTATION));
            if !leader {
                queue.add(key_of(e.as_ref()));
            }
        }
        let tasks = run_workers_of("endpoint", queue, 5, stop, &ctl, |c, key| async move {
            c.sync(&key).await
        });
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down endpoint controller");
    })
}

/// The address of the pod in the Service's IP family.
fn address_for(svc: &Service, pod: &Pod) -> Option<EndpointAddress> {
    let spec = svc.spec.as_ref();
    let want_v6 = match spec
        .and_then(|s| s.ip_families.as_ref())
        .and_then(|f| f.first())
    {
        Some(f) => f == "IPv6",
        None if is_service_ip_set(svc) => spec
            .and_then(|s| s.cluster_ip.as_deref())
            .is_some_and(|ip| ip.contains(':')),
        None => pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .is_some_and(|ip| ip.contains(':')),
    };
    let ip = pod_ips(pod)
        .into_iter()
        .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok())
        .find(|ip| ip.is_ipv6() == want_v6)?;
    Some(EndpointAddress {
        ip: ip.to_string(),
        // An empty node name would not validate; upstream's pods with IPs always have one.
        node_name: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        }),
        hostname: should_set_hostname(pod, svc)
            .then(|| pod.spec.as_ref().and_then(|s| s.hostname.clone()))
            .flatten(),
    })
}

fn addr_key(a: &EndpointAddress) -> (String, String) {
    (
        a.ip.clone(),
        a.target_ref
            .as_ref()
            .and_then(|t| t.uid.clone())
            .unwrap_or_default(),
    )
}

fn port_sort_key(p: &EndpointPort) -> (String, i32, String, String) {
    (
        p.name.clone().unwrap_or_default(),
        p.port,
        p.protocol.clone().unwrap_or_else(|| "TCP".into()),
        p.app_protocol.clone().unwrap_or_default(),
    )
}

/// Upstream's RepackSubsets: one subset per distinct set of addresses, carrying every
/// port those addresses offer; an address not ready on a port is not ready there.
pub(crate) fn repack(subsets: &[EndpointSubset]) -> Vec<EndpointSubset> {
    // An address by IP and pod UID; `None` stands for "no ports" (headless).
    type Addr = (String, String);
    type Port = Option<(String, i32, String, String)>;
    type ReadyByAddr = BTreeMap<Addr, bool>;
    let mut addrs: BTreeMap<(String, String), EndpointAddress> = BTreeMap::new();
    let mut ports: BTreeMap<Port, (Option<EndpointPort>, ReadyByAddr)> = BTreeMap::new();
    for ss in subsets {
        let ps: Vec<Option<&EndpointPort>> = match ss.ports.as_deref() {
            Some(p) if !p.is_empty() => p.iter().map(Some).collect(),
            _ => vec![None],
        };
        for p in ps {
            let entry = ports
                .entry(p.map(port_sort_key))
                .or_insert_with(|| (p.cloned(), BTreeMap::new()));
            for (list, ready) in [(&ss.addresses, true), (&ss.not_ready_addresses, false)] {
                for a in list.iter().flatten() {
                    let k = addr_key(a);
                    addrs.entry(k.clone()).or_insert_with(|| a.clone());
                    let r = entry.1.entry(k).or_insert(ready);
                    *r = *r && ready;
                }
            }
        }
    }
    let mut groups: BTreeMap<Vec<(Addr, bool)>, Vec<EndpointPort>> = BTreeMap::new();
    for (_, (port, set)) in ports {
        let g = groups.entry(set.into_iter().collect()).or_default();
        g.extend(port);
    }
    groups
        .into_iter()
        .map(|(set, ports)| {
            let pick = |ready: bool| {
                let v: Vec<EndpointAddress> = set
                    .iter()
                    .filter(|(_, r)| *r == ready)
                    .filter_map(|(k, _)| addrs.get(k).cloned())
                    .collect();
                (!v.is_empty()).then_some(v)
            };
            EndpointSubset {
                addresses: pick(true),
                not_ready_addresses: pick(false),
                ports: (!ports.is_empty()).then_some(ports),
            }
        })
        .collect()
}

/// Subsets in a form that compares equal when only the pods' resourceVersions or the
/// API's defaults differ.
fn canonical(subsets: &[EndpointSubset]) -> Vec<EndpointSubset> {
    let clean = |l: &Option<Vec<EndpointAddress>>| {
        let v: Vec<EndpointAddress> = l
            .iter()
            .flatten()
            .map(|a| {
                let mut a = a.clone();
                if let Some(t) = a.target_ref.as_mut() {
                    t.resource_version = None;
                }
                a
            })
            .collect();
        (!v.is_empty()).then_some(v)
    };
    subsets
        .iter()
        .map(|ss| {
            let ports: Vec<EndpointPort> = ss
                .ports
                .iter()
                .flatten()
                .map(|p| EndpointPort {
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                    ..p.clone()
                })
                .collect();
            EndpointSubset {
                addresses: clean(&ss.addresses),
                not_ready_addresses: clean(&ss.not_ready_addresses),
                ports: (!ports.is_empty()).then_some(ports),
            }
        })
        .collect()
}

/// Whether the labels are the Service's plus ours (upstream's labelsCorrectForEndpoints).
fn labels_correct(ep: &BTreeMap<String, String>, svc: &BTreeMap<String, String>) -> bool {
    if ep.get(LABEL_MANAGED_BY).map(String::as_str) != Some(CONTROLLER_NAME) {
        return false;
    }
    let mut skipped = 0;
    for (k, v) in ep {
        if k == LABEL_HEADLESS || k == LABEL_MANAGED_BY {
            skipped += 1;
        } else if svc.get(k) != Some(v) {
            return false;
        }
    }
    svc.len() == ep.len() - skipped
}

fn count(subsets: &[EndpointSubset]) -> (usize, usize) {
    subsets.iter().fold((0, 0), |(r, n), ss| {
        (
            r + ss.addresses.as_ref().map_or(0, Vec::len),
            n + ss.not_ready_addresses.as_ref().map_or(0, Vec::len),
        )
    })
}

/// Whether the over-capacity annotation matches the subsets (absent and within capacity).
fn capacity_annotation_correct(
    annotations: Option<&BTreeMap<String, String>>,
    subsets: &[EndpointSubset],
) -> bool {
    let (r, n) = count(subsets);
    r + n <= MAX_CAPACITY && !annotations.is_some_and(|a| a.contains_key(OVER_CAPACITY))
}

/// Keeps at most [`MAX_CAPACITY`] addresses, ready ones first, each subset keeping its
/// share (upstream's truncateEndpoints); true if anything was dropped.
pub(crate) fn truncate(subsets: &mut [EndpointSubset]) -> bool {
    let (ready, not_ready) = count(subsets);
    if ready + not_ready <= MAX_CAPACITY {
        return false;
    }
    let truncate_ready = ready > MAX_CAPACITY;
    let (max, total) = if truncate_ready {
        (MAX_CAPACITY, ready)
    } else {
        (MAX_CAPACITY - ready, not_ready)
    };
    let mut can_add = max;
    for ss in subsets.iter_mut() {
        let list = if truncate_ready {
            &mut ss.addresses
        } else {
            &mut ss.not_ready_addresses
        };
        let n = list.as_ref().map_or(0, Vec::len);
        // The share is rounded up, so the last subsets may get less than theirs.
        let share = (n * max).div_ceil(total.max(1)).min(can_add);
        if let Some(l) = list.as_mut() {
            l.truncate(share);
        }
        can_add -= list.as_ref().map_or(0, Vec::len);
        if truncate_ready {
            ss.not_ready_addresses = None;
        }
    }
    true
}

impl Ctl {
    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let api: Api<Endpoints> = Api::namespaced(self.client.get(), ns);
        let Some(svc) = self.services.get(key) else {
            // The Service is gone: so are its Endpoints.
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
            self.triggers.delete(key);
            self.written.lock().remove(key);
            return Ok(());
        };
        if is_external_name(&svc) || selector(&svc).is_none() {
            // No endpoints from here: ExternalName Services have none, and those without
            // a selector (like `kubernetes`) get theirs from elsewhere.
            return Ok(());
        }
        let pods = pods_for(&self.pods, &svc);
        let trigger = self.triggers.compute(&svc, &pods);
        let spec = svc.spec.clone().unwrap_or_default();
        let publish = spec.publish_not_ready_addresses.unwrap_or(false);
        let svc_ports = spec.ports.clone().unwrap_or_default();
        let headless = spec.cluster_ip.as_deref() == Some("None");
        let mut subsets = Vec::new();
        for pod in &pods {
            if !should_pod_be_in_endpoints(pod, publish) {
                continue;
            }
            let Some(addr) = address_for(&svc, pod) else {
                continue;
            };
            let ready = publish || is_pod_ready(pod);
            let subset = |port: Option<EndpointPort>| EndpointSubset {
                addresses: ready.then(|| vec![addr.clone()]),
                not_ready_addresses: (!ready).then(|| vec![addr.clone()]),
                ports: port.map(|p| vec![p]),
            };
            if svc_ports.is_empty() {
                // A headless Service may have no ports.
                if headless {
                    subsets.push(subset(None));
                }
                continue;
            }
            for sp in &svc_ports {
                let Some(port) = find_port(pod, sp) else {
                    continue;
                };
                subsets.push(subset(Some(EndpointPort {
                    name: sp.name.clone().filter(|n| !n.is_empty()),
                    port,
                    protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                    app_protocol: sp.app_protocol.clone(),
                })));
            }
        }
        let subsets = repack(&subsets);

        let current = self.endpoints.get(key);
        if let Some(cur) = &current {
            let written = self.written.lock().get(key).copied();
            if written.is_some_and(|w| rv(&cur.metadata) < w) {
                return Err(SyncError::After(Duration::from_millis(100)));
            }
            let have = cur.subsets.clone().unwrap_or_default();
            let want = canonical(&subsets);
            let svc_labels = svc.metadata.labels.clone().unwrap_or_default();
            if (canonical(&have) == want || canonical(&repack(&have)) == want)
                && labels_correct(
                    cur.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
                    &svc_labels,
                )
                && capacity_annotation_correct(cur.metadata.annotations.as_ref(), &have)
            {
                return Ok(());
            }
        }
        let mut ep = current.as_deref().cloned().unwrap_or_else(|| Endpoints {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(ns.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        });
        let mut subsets = subsets;
        set_trigger_time(&mut ep.metadata, trigger);
        let annotations = ep.metadata.annotations.get_or_insert_with(BTreeMap::new);
        if truncate(&mut subsets) {
            annotations.insert(OVER_CAPACITY.into(), "truncated".into());
        } else {
            annotations.remove(OVER_CAPACITY);
        }
        ep.subsets = (!subsets.is_empty()).then_some(subsets);
        let mut labels = svc.metadata.labels.clone().unwrap_or_default();
        if is_service_ip_set(&svc) {
            labels.remove(LABEL_HEADLESS);
        } else {
            labels.insert(LABEL_HEADLESS.into(), String::new());
        }
        labels.insert(LABEL_MANAGED_BY.into(), CONTROLLER_NAME.into());
        ep.metadata.labels = Some(labels);

        let res = match &current {
            None => api.create(&PostParams::default(), &ep).await,
            Some(_) => api.replace(name, &PostParams::default(), &ep).await,
        };
        match res {
            Ok(w) => {
                self.written.lock().insert(key.to_owned(), rv(&w.metadata));
                Ok(())
            }
            // A namespace being deleted refuses new objects: drop the item.
            Err(e) if current.is_none() && namespace_terminating(&e) => Ok(()),
            Err(e) => {
                let what = if current.is_none() {
                    format!("Failed to create endpoint for service {key}")
                } else {
                    format!("Failed to update endpoint {key}")
                };
                Err(SyncError::Failed(format!("{what}: {}", message(&e))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(ip: &str) -> EndpointAddress {
        EndpointAddress {
            ip: ip.into(),
            ..Default::default()
        }
    }

    fn port(n: i32) -> EndpointPort {
        EndpointPort {
            port: n,
            protocol: Some("TCP".into()),
            ..Default::default()
        }
    }

    #[test]
    fn repack_groups_ports_by_address_set() {
        let one = |ip: &str, ready: bool, p: i32| EndpointSubset {
            addresses: ready.then(|| vec![addr(ip)]),
            not_ready_addresses: (!ready).then(|| vec![addr(ip)]),
            ports: Some(vec![port(p)]),
        };
        let out = repack(&[
            one("10.0.0.2", true, 80),
            one("10.0.0.1", true, 80),
            one("10.0.0.1", true, 443),
            one("10.0.0.2", false, 443),
        ]);
        assert_eq!(out.len(), 2, "{out:?}");
        let p80 = out
            .iter()
            .find(|s| s.ports.as_ref().is_some_and(|p| p[0].port == 80))
            .expect("80");
        let ips: Vec<&str> = p80
            .addresses
            .iter()
            .flatten()
            .map(|a| a.ip.as_str())
            .collect();
        assert_eq!(ips, ["10.0.0.1", "10.0.0.2"]);
        let p443 = out
            .iter()
            .find(|s| s.ports.as_ref().is_some_and(|p| p[0].port == 443))
            .expect("443");
        assert_eq!(p443.not_ready_addresses.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn truncation_keeps_ready_first() {
        let many = |n: usize, base: u32| -> Vec<EndpointAddress> {
            (0..n)
                .map(|i| addr(&std::net::Ipv4Addr::from(base + i as u32).to_string()))
                .collect()
        };
        let mut ss = vec![EndpointSubset {
            addresses: Some(many(900, 0x0a00_0000)),
            not_ready_addresses: Some(many(300, 0x0b00_0000)),
            ports: Some(vec![port(80)]),
        }];
        assert!(truncate(&mut ss));
        assert_eq!(count(&ss), (900, 100));
        let mut small = vec![EndpointSubset {
            addresses: Some(many(10, 0x0a00_0000)),
            ..Default::default()
        }];
        assert!(!truncate(&mut small));
    }
}
