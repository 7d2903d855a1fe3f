//! endpointslice-mirroring-controller: the Endpoints of a Service without a selector
//! (written by hand or by another controller) are mirrored into EndpointSlices, so that
//! everything reading slices (the service proxy, DNS) sees them.
//!
//! As upstream: one group of slices per set of ports and address family, at most 1000
//! addresses mirrored per Endpoints subset (the rest reported with a
//! TooManyAddressesToMirror event), invalid IPs skipped (InvalidIPAddress). Mirrored
//! slices carry the Endpoints' labels and annotations (less the trigger time and the
//! last applied configuration), `kubernetes.io/service-name`, the managed-by label
//! `endpointslicemirroring-controller.k8s.io`, and the Endpoints as controller owner.
//! Endpoints labelled `endpointslice.kubernetes.io/skip-mirror=true` (what the
//! endpoints controller writes) or holding a leader-election record are not mirrored;
//! neither are they once the Service is gone or gains a selector, and their slices go.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort as CorePort, Endpoints, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::endpointslice::{LABEL_MANAGED_BY, LABEL_SERVICE_NAME, LAST_CHANGE_TRIGGER_TIME};
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::error::{is_not_found, message, namespace_terminating};
use kumo_client::events;
use kumo_client::informer::{key_of, Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers_of, wait_for_sync, SyncError};

/// The value of the managed-by label on mirrored slices.
pub const CONTROLLER_NAME: &str = "endpointslicemirroring-controller.k8s.io";
/// The label that keeps an Endpoints object from being mirrored.
pub const LABEL_SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
/// Upstream's default `--mirroring-max-endpoints-per-subset`.
const MAX_ENDPOINTS_PER_SUBSET: usize = 1000;
const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
const COMPONENT: &str = "endpoint-slice-mirroring-controller";

/// Whether the Endpoints object is one to mirror (shouldMirror).
fn should_mirror(e: &Endpoints) -> bool {
    let skip = e
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SKIP_MIRROR))
        .is_some_and(|v| v == "true");
    let leader = e
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(LEADER_ANNOTATION));
    !skip && !leader
}

/// The `namespace/endpoints` key of a slice this controller mirrors.
fn mirrored(s: &EndpointSlice) -> Option<String> {
    let labels = s.metadata.labels.as_ref()?;
    if labels.get(LABEL_MANAGED_BY).map(String::as_str) != Some(CONTROLLER_NAME) {
        return None;
    }
    let name = labels.get(LABEL_SERVICE_NAME).filter(|n| !n.is_empty())?;
    let ns = s.metadata.namespace.as_deref().unwrap_or_default();
    Some(format!("{ns}/{name}"))
}

/// One slice as the Endpoints ask for it: its ports, address type and endpoints.
#[derive(Debug, Clone, PartialEq)]
struct Group {
    ports: Vec<EndpointPort>,
    address_type: String,
    endpoints: Vec<Endpoint>,
}

/// What the Endpoints' subsets ask for, grouped by ports and address type, with the
/// numbers of invalid and skipped addresses.
fn desired(e: &Endpoints) -> (Vec<Group>, usize, usize) {
    let mut groups: Vec<Group> = Vec::new();
    let (mut invalid, mut skipped) = (0, 0);
    for subset in e.subsets.iter().flatten() {
        let mut ports: Vec<EndpointPort> = subset
            .ports
            .iter()
            .flatten()
            .map(|p: &CorePort| EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(p.port),
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        ports.sort_by(|a, b| (&a.name, a.port).cmp(&(&b.name, b.port)));
        let ready = subset.addresses.iter().flatten().map(|a| (a, true));
        let not_ready = subset
            .not_ready_addresses
            .iter()
            .flatten()
            .map(|a| (a, false));
        let mut added = 0;
        let mut total = 0;
        for (a, is_ready) in ready.chain(not_ready) {
            total += 1;
            if added >= MAX_ENDPOINTS_PER_SUBSET {
                continue;
            }
            let Some((ep, family)) = to_endpoint(a, is_ready) else {
                invalid += 1;
                continue;
            };
            added += 1;
            match groups
                .iter_mut()
                .find(|g| g.ports == ports && g.address_type == family)
            {
                Some(g) => {
                    if !g.endpoints.contains(&ep) {
                        g.endpoints.push(ep);
                    }
                }
                None => groups.push(Group {
                    ports: ports.clone(),
                    address_type: family.into(),
                    endpoints: vec![ep],
                }),
            }
        }
        skipped += total - added;
    }
    (groups, invalid, skipped)
}

/// An Endpoints address as a slice endpoint, with its address type; None for an address
/// that is no IP.
fn to_endpoint(a: &EndpointAddress, ready: bool) -> Option<(Endpoint, &'static str)> {
    let ip: IpAddr = a.ip.parse().ok()?;
    let family = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
    Some((
        Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                ..Default::default()
            }),
            target_ref: a.target_ref.clone(),
            node_name: a.node_name.clone(),
            hostname: a.hostname.clone().filter(|h| !h.is_empty()),
            ..Default::default()
        },
        family,
    ))
}

/// The metadata of the Endpoints' mirrored slices (newEndpointSlice).
fn slice_meta(e: &Endpoints) -> ObjectMeta {
    let name = e.metadata.name.clone().unwrap_or_default();
    let mut labels = e.metadata.labels.clone().unwrap_or_default();
    labels.insert(LABEL_SERVICE_NAME.into(), name.clone());
    labels.insert(LABEL_MANAGED_BY.into(), CONTROLLER_NAME.into());
    let annotations: BTreeMap<String, String> = e
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != LAST_CHANGE_TRIGGER_TIME && k.as_str() != LAST_APPLIED)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ObjectMeta {
        namespace: e.metadata.namespace.clone(),
        generate_name: Some(format!("{name}-")),
        labels: Some(labels),
        annotations: Some(annotations),
        owner_references: Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Endpoints".into(),
            name,
            uid: e.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..Default::default()
    }
}

struct Ctl {
    client: ClientSource,
    endpoints: Arc<Informer<Endpoints>>,
    services: Arc<Informer<Service>>,
    slices: Arc<Informer<EndpointSlice>>,
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("endpoint_slice_mirroring");
    let endpoints = factory.informer::<Endpoints>();
    let services = factory.informer::<Service>();
    let slices = factory.informer::<EndpointSlice>();
    let q = queue.clone();
    endpoints.add_handler(move |c| match c {
        Change::Added(e) => {
            if should_mirror(e) {
                q.add(key_of(e));
            }
        }
        Change::Updated { old, new } => {
            if should_mirror(old) || should_mirror(new) {
                q.add(key_of(new));
            }
        }
        Change::Deleted(e) => q.add(key_of(e)),
    });
    let q = queue.clone();
    services.add_handler(move |c| {
        let no_selector = |s: &Service| s.spec.as_ref().and_then(|s| s.selector.as_ref()).is_none();
        match c {
            Change::Added(s) | Change::Deleted(s) => {
                if no_selector(s) {
                    q.add(key_of(s));
                }
            }
            Change::Updated { old, new } => {
                if no_selector(old) != no_selector(new) {
                    q.add(key_of(new));
                }
            }
        }
    });
    let q = queue.clone();
    slices.add_handler(move |c| match c {
        Change::Added(s) | Change::Deleted(s) => mirrored(s).into_iter().for_each(|k| q.add(k)),
        Change::Updated { old, new } => {
            for k in [mirrored(old), mirrored(new)].into_iter().flatten() {
                q.add(k);
            }
        }
    });
    tokio::spawn(async move {
        tracing::info!("Starting EndpointSliceMirroring controller");
        let Some(client) =
            client_for(&clients, "endpointslicemirroring-controller", &mut stop).await
        else {
            return;
        };
        let ctl = Arc::new(Ctl {
            client,
            endpoints,
            services,
            slices,
        });
        let synced = async {
            ctl.endpoints.wait_synced().await;
            ctl.services.wait_synced().await;
            ctl.slices.wait_synced().await;
        };
        if !wait_for_sync(&mut stop, synced).await {
            return;
        }
        let tasks = run_workers_of(
            "endpointslicemirroring",
            queue,
            5,
            stop,
            &ctl,
            |c, key| async move { c.sync(&key).await },
        );
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down EndpointSliceMirroring controller");
    })
}

impl Ctl {
    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let existing: Vec<Arc<EndpointSlice>> = self
            .slices
            .list()
            .into_iter()
            .filter(|s| mirrored(s).as_deref() == Some(key))
            .collect();
        let endpoints = self.endpoints.get(key).filter(|e| should_mirror(e));
        let service = self
            .services
            .get(key)
            .filter(|s| s.spec.as_ref().and_then(|s| s.selector.as_ref()).is_none());
        let api: Api<EndpointSlice> = Api::namespaced(self.client.get(), ns);
        let (Some(endpoints), Some(_)) = (endpoints, service) else {
            return self.delete(&api, existing.iter().map(|s| &**s)).await;
        };
        let (groups, invalid, skipped) = desired(&endpoints);
        if invalid > 0 {
            events::record(
                &self.client,
                COMPONENT,
                events::reference(&*endpoints),
                "Warning",
                "InvalidIPAddress",
                format!("Skipped {invalid} invalid IP addresses when mirroring to EndpointSlices"),
            )
            .await;
        }
        if skipped > invalid {
            events::record(
                &self.client,
                COMPONENT,
                events::reference(&*endpoints),
                "Warning",
                "TooManyAddressesToMirror",
                format!("A max of {MAX_ENDPOINTS_PER_SUBSET} addresses can be mirrored to EndpointSlices per Endpoints subset. {} addresses were skipped", skipped - invalid),
            )
            .await;
        }
        let meta = slice_meta(&endpoints);
        let mut unused: Vec<&EndpointSlice> = existing.iter().map(|s| &**s).collect();
        for g in groups {
            // The existing slice of the same ports and family is updated when it differs.
            let found = unused.iter().position(|s| {
                s.ports.as_deref().unwrap_or_default() == g.ports
                    && s.address_type == g.address_type
            });
            let mut want = EndpointSlice {
                metadata: meta.clone(),
                address_type: g.address_type,
                endpoints: Some(g.endpoints),
                ports: Some(g.ports),
            };
            match found.map(|i| unused.remove(i)) {
                Some(s) => {
                    let same = s.endpoints == want.endpoints
                        && s.metadata.labels == want.metadata.labels
                        && s.metadata.annotations.clone().unwrap_or_default()
                            == want.metadata.annotations.clone().unwrap_or_default();
                    if same {
                        continue;
                    }
                    let slice_name = s.metadata.name.clone().unwrap_or_default();
                    want.metadata.name = Some(slice_name.clone());
                    want.metadata.generate_name = None;
                    want.metadata.resource_version = s.metadata.resource_version.clone();
                    if let Err(e) = api
                        .replace(&slice_name, &PostParams::default(), &want)
                        .await
                    {
                        return Err(SyncError::Failed(format!(
                            "failed to update {slice_name} EndpointSlice for Endpoints {key}: {}",
                            message(&e)
                        )));
                    }
                }
                None => match api.create(&PostParams::default(), &want).await {
                    Ok(_) => {}
                    Err(e) if namespace_terminating(&e) => return Ok(()),
                    Err(e) => {
                        return Err(SyncError::Failed(format!(
                            "failed to create EndpointSlice for Endpoints {ns}/{name}: {}",
                            message(&e)
                        )))
                    }
                },
            }
        }
        self.delete(&api, unused.into_iter()).await
    }

    async fn delete<'a>(
        &self,
        api: &Api<EndpointSlice>,
        slices: impl Iterator<Item = &'a EndpointSlice>,
    ) -> Result<(), SyncError> {
        for s in slices {
            let name = s.metadata.name.clone().unwrap_or_default();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::EndpointSubset;

    fn endpoints(addresses: &[&str], not_ready: &[&str]) -> Endpoints {
        let addr = |ips: &[&str]| {
            Some(
                ips.iter()
                    .map(|ip| EndpointAddress {
                        ip: (*ip).into(),
                        ..Default::default()
                    })
                    .collect(),
            )
        };
        Endpoints {
            metadata: ObjectMeta {
                name: Some("svc".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                labels: Some(BTreeMap::from([("app".into(), "x".into())])),
                annotations: Some(BTreeMap::from([
                    (LAST_APPLIED.into(), "{}".into()),
                    ("note".into(), "kept".into()),
                ])),
                ..Default::default()
            },
            subsets: Some(vec![EndpointSubset {
                addresses: addr(addresses),
                not_ready_addresses: addr(not_ready),
                ports: Some(vec![CorePort {
                    port: 80,
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
            }]),
        }
    }

    #[test]
    fn addresses_are_grouped_by_family_with_their_readiness() {
        let (groups, invalid, skipped) =
            desired(&endpoints(&["10.1.2.3", "fd00::1", "nope"], &["10.1.2.4"]));
        assert_eq!((invalid, skipped), (1, 1));
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].address_type, "IPv4");
        let v4: Vec<(String, Option<bool>)> = groups[0]
            .endpoints
            .iter()
            .map(|e| {
                (
                    e.addresses[0].clone(),
                    e.conditions.as_ref().and_then(|c| c.ready),
                )
            })
            .collect();
        assert_eq!(
            v4,
            [
                ("10.1.2.3".into(), Some(true)),
                ("10.1.2.4".into(), Some(false))
            ]
        );
        assert_eq!(groups[1].address_type, "IPv6");
        assert_eq!(groups[0].ports[0].port, Some(80));
        assert_eq!(groups[0].ports[0].name.as_deref(), Some(""));
    }

    #[test]
    fn at_most_1000_addresses_per_subset() {
        let ips: Vec<String> = (0..1005)
            .map(|i| format!("10.0.{}.{}", i / 250, i % 250))
            .collect();
        let refs: Vec<&str> = ips.iter().map(String::as_str).collect();
        let (groups, invalid, skipped) = desired(&endpoints(&refs, &[]));
        assert_eq!((invalid, skipped), (0, 5));
        assert_eq!(groups[0].endpoints.len(), 1000);
    }

    #[test]
    fn slices_carry_the_endpoints_labels_annotations_and_owner() {
        let e = endpoints(&["10.1.2.3"], &[]);
        let m = slice_meta(&e);
        let labels = m.labels.unwrap_or_default();
        assert_eq!(labels["app"], "x");
        assert_eq!(labels[LABEL_SERVICE_NAME], "svc");
        assert_eq!(labels[LABEL_MANAGED_BY], CONTROLLER_NAME);
        let annotations = m.annotations.unwrap_or_default();
        assert_eq!(annotations.get("note").map(String::as_str), Some("kept"));
        assert!(!annotations.contains_key(LAST_APPLIED));
        let owner = &m.owner_references.unwrap_or_default()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Endpoints", "u1", Some(true))
        );
        assert_eq!(m.generate_name.as_deref(), Some("svc-"));
        let mut skip = e.clone();
        skip.metadata.labels = Some(BTreeMap::from([(LABEL_SKIP_MIRROR.into(), "true".into())]));
        assert!(should_mirror(&e) && !should_mirror(&skip));
    }
}
