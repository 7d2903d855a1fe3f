//! Load balancers for Services of type LoadBalancer: one kumo load balancer per Service,
//! named [`crate::default_load_balancer_name`], with a listener per Service port (port →
//! NodePort), the nodes' instances as targets, and a health check on the first NodePort
//! (or kube-proxy's `/healthz` on the healthCheckNodePort when `externalTrafficPolicy` is
//! `Local`, so only nodes with local endpoints get traffic).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use kumo_cloud::{
    CreateLoadBalancerRequest, HealthCheck, InstanceFilter, InstanceState, Listener, Protocol,
    UpdateLoadBalancerRequest,
};

use super::{cloud_error, instance_id, KumoCloud};
use crate::{Error, LoadBalancer, Result};

/// The tag naming the cluster that owns a balancer (`kubernetes.io/cluster/<name>`), as
/// upstream clouds tag what they create for a cluster.
pub const TAG_CLUSTER_PREFIX: &str = "kubernetes.io/cluster/";
/// The tag naming the Service (`<namespace>/<name>`) a balancer serves.
pub const TAG_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The path kube-proxy serves a Local Service's health on its healthCheckNodePort.
const HEALTH_CHECK_PATH: &str = "/healthz";

/// The listeners of the Service: one per port, to its NodePort.
fn listeners(service: &Service) -> Result<Vec<Listener>> {
    let spec = service.spec.as_ref();
    let ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or_default();
    if ports.is_empty() {
        return Err(Error::Cloud(format!(
            "service {} has no ports: a load balancer needs at least one",
            ns_name(service)
        )));
    }
    ports
        .iter()
        .map(|p| {
            let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
                "TCP" => Protocol::Tcp,
                "UDP" => Protocol::Udp,
                other => {
                    return Err(Error::Cloud(format!(
                        "Protocol {other} is not supported by the kumo load balancer: TCP or UDP"
                    )))
                }
            };
            let port = u16::try_from(p.port).ok().filter(|p| *p != 0);
            let node_port = p
                .node_port
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n != 0);
            match (port, node_port) {
                (Some(port), Some(target_port)) => Ok(Listener {
                    port,
                    protocol,
                    target_port,
                }),
                _ => Err(Error::Cloud(format!(
                    "service {} port {}/{}: the kumo load balancer forwards to a NodePort and the port has none",
                    ns_name(service),
                    p.port,
                    protocol.as_str()
                ))),
            }
        })
        .collect()
}

/// TCP on the first NodePort; HTTP `/healthz` on the healthCheckNodePort for
/// `externalTrafficPolicy: Local`.
fn health_check(service: &Service, listeners: &[Listener]) -> HealthCheck {
    let spec = service.spec.as_ref();
    let local = spec.and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
    let hc_port = spec
        .and_then(|s| s.health_check_node_port)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0);
    match hc_port {
        Some(port) if local => HealthCheck {
            protocol: "HTTP".into(),
            port,
            path: Some(HEALTH_CHECK_PATH.into()),
            ..HealthCheck::default()
        },
        _ => HealthCheck {
            protocol: "TCP".into(),
            port: listeners.first().map(|l| l.target_port).unwrap_or_default(),
            ..HealthCheck::default()
        },
    }
}

fn ns_name(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

fn tags(cluster_name: &str, service: &Service) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            format!("{TAG_CLUSTER_PREFIX}{cluster_name}"),
            "owned".into(),
        ),
        (TAG_SERVICE_NAME.into(), ns_name(service)),
    ])
}

/// The balancer's VIP as the Service's ingress. Only the IP, as clouds with VIPs (GCE,
/// OpenStack) report it: with a hostname too, `kubectl get svc` would show both, cut short.
fn status(lb: &kumo_cloud::LoadBalancer) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            ip: Some(lb.vip.clone()).filter(|s| !s.is_empty()),
            ip_mode: Some("VIP".into()),
            ..Default::default()
        }]),
    }
}

impl KumoCloud {
    /// The instance ids behind `nodes`: from the providerID, else the live instance named
    /// as the node. Nodes without a live instance are left out (the cloud refuses unknown
    /// or terminated targets).
    async fn targets(&self, nodes: &[Node]) -> Result<Vec<String>> {
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let filter = InstanceFilter {
            states: vec![
                InstanceState::Pending,
                InstanceState::Running,
                InstanceState::Stopping,
                InstanceState::Stopped,
                InstanceState::ShuttingDown,
            ],
            ..Default::default()
        };
        let live = self
            .client()
            .list_instances(&filter)
            .await
            .map_err(cloud_error)?;
        let ids: BTreeSet<&str> = live.iter().map(|i| i.id.as_str()).collect();
        let by_name: HashMap<&str, &str> = live
            .iter()
            .filter(|i| !i.name.is_empty())
            .map(|i| (i.name.as_str(), i.id.as_str()))
            .collect();
        let mut out = Vec::new();
        for node in nodes {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            let from_provider_id = node
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .and_then(instance_id);
            let id = match from_provider_id {
                Some(id) => ids.get(id).copied(),
                None => by_name.get(name).copied(),
            };
            match id {
                Some(id) if !out.iter().any(|o| o == id) => out.push(id.to_owned()),
                Some(_) => {}
                None => tracing::warn!(
                    node = name,
                    "no live instance for the node; left out of the load balancer"
                ),
            }
        }
        Ok(out)
    }

    async fn find(&self, name: &str) -> Result<Option<kumo_cloud::LoadBalancer>> {
        self.client()
            .find_load_balancer(name)
            .await
            .map_err(cloud_error)
    }
}

fn same_targets(current: &[kumo_cloud::Target], wanted: &[String]) -> bool {
    let a: BTreeSet<&str> = current.iter().map(|t| t.instance_id.as_str()).collect();
    let b: BTreeSet<&str> = wanted.iter().map(String::as_str).collect();
    a == b
}

#[async_trait]
impl LoadBalancer for KumoCloud {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>> {
        let name = self.get_load_balancer_name(cluster_name, service);
        Ok(self.find(&name).await?.as_ref().map(status))
    }

    fn get_load_balancer_name(&self, _cluster_name: &str, service: &Service) -> String {
        crate::default_load_balancer_name(service)
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus> {
        let name = self.get_load_balancer_name(cluster_name, service);
        let listeners = listeners(service)?;
        let health_check = health_check(service, &listeners);
        let tags = tags(cluster_name, service);
        let targets = self.targets(nodes).await?;
        let lb = match self.find(&name).await? {
            None => {
                let req = CreateLoadBalancerRequest {
                    name,
                    listeners,
                    targets,
                    health_check: Some(health_check),
                    tags,
                };
                self.client()
                    .create_load_balancer(&req)
                    .await
                    .map_err(cloud_error)?
            }
            Some(lb) => {
                let req = UpdateLoadBalancerRequest {
                    listeners: (lb.listeners != listeners).then_some(listeners),
                    targets: (!same_targets(&lb.targets, &targets)).then_some(targets),
                    health_check: (lb.health_check != health_check).then_some(health_check),
                    // Keep tags others added; ours win.
                    tags: (!tags.iter().all(|(k, v)| lb.tags.get(k) == Some(v))).then(|| {
                        let mut t = lb.tags.clone();
                        t.extend(tags);
                        t
                    }),
                };
                if req == UpdateLoadBalancerRequest::default() {
                    lb
                } else {
                    self.client()
                        .update_load_balancer(&lb.id, &req)
                        .await
                        .map_err(cloud_error)?
                }
            }
        };
        Ok(status(&lb))
    }

    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<()> {
        let name = self.get_load_balancer_name(cluster_name, service);
        let Some(lb) = self.find(&name).await? else {
            return Err(Error::Cloud(format!(
                "{}: the load balancer '{name}' does not exist",
                kumo_cloud::codes::LOAD_BALANCER_NOT_FOUND
            )));
        };
        let targets = self.targets(nodes).await?;
        if same_targets(&lb.targets, &targets) {
            return Ok(());
        }
        let req = UpdateLoadBalancerRequest {
            targets: Some(targets),
            ..Default::default()
        };
        self.client()
            .update_load_balancer(&lb.id, &req)
            .await
            .map_err(cloud_error)?;
        Ok(())
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<()> {
        let name = self.get_load_balancer_name(cluster_name, service);
        let Some(lb) = self.find(&name).await? else {
            return Ok(());
        };
        match self.client().delete_load_balancer(&lb.id).await {
            Ok(_) => Ok(()),
            // Deleted meanwhile: gone is what was asked for.
            Err(e) if e.code() == Some(kumo_cloud::codes::LOAD_BALANCER_NOT_FOUND) => Ok(()),
            Err(e) => Err(cloud_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    fn svc(ports: &[(i32, &str, i32)], local_hc: Option<i32>) -> Service {
        Service {
            metadata: kube::api::ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(port, proto, np)| ServicePort {
                            port: *port,
                            protocol: Some((*proto).into()),
                            node_port: Some(*np),
                            ..Default::default()
                        })
                        .collect(),
                ),
                external_traffic_policy: Some(
                    if local_hc.is_some() {
                        "Local"
                    } else {
                        "Cluster"
                    }
                    .into(),
                ),
                health_check_node_port: local_hc,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn listeners_map_ports_to_node_ports() {
        let s = svc(&[(80, "TCP", 30080), (53, "UDP", 30053)], None);
        let l = listeners(&s).expect("listeners");
        assert_eq!(
            l,
            vec![
                Listener {
                    port: 80,
                    protocol: Protocol::Tcp,
                    target_port: 30080
                },
                Listener {
                    port: 53,
                    protocol: Protocol::Udp,
                    target_port: 30053
                },
            ]
        );
        let hc = health_check(&s, &l);
        assert_eq!(
            (hc.protocol.as_str(), hc.port, hc.path),
            ("TCP", 30080, None)
        );
        assert!(listeners(&svc(&[(80, "SCTP", 30080)], None)).is_err());
        assert!(listeners(&svc(&[(80, "TCP", 0)], None)).is_err());
    }

    #[test]
    fn local_policy_checks_the_health_check_node_port() {
        let s = svc(&[(80, "TCP", 30080)], Some(32000));
        let hc = health_check(&s, &listeners(&s).expect("listeners"));
        assert_eq!(hc.protocol, "HTTP");
        assert_eq!(hc.port, 32000);
        assert_eq!(hc.path.as_deref(), Some("/healthz"));
        let t = tags("kubernetes", &s);
        assert_eq!(t["kubernetes.io/cluster/kubernetes"], "owned");
        assert_eq!(t["kubernetes.io/service-name"], "default/web");
    }
}
