//! The contract between Kubernetes and a cloud, and the controllers that use it.
//!
//! [`CloudProvider`] mirrors k8s.io/cloud-provider's `Interface`: a provider offers some of
//! [`LoadBalancer`], [`InstancesV2`] and [`Routes`], and answers with the sentinel errors
//! upstream defines ([`Error::InstanceNotFound`], [`Error::NotImplemented`],
//! [`Error::ImplementedElsewhere`]) or a [`Error::RetryAfter`] (upstream's `api.RetryError`)
//! when the controller should come back later without counting a failure. Another cloud is
//! plugged in by implementing these traits; [`kumo::KumoCloud`] (the `kumo cloud`) is the
//! first provider.
//!
//! [`ccm`] is the cloud-controller-manager: the cloud node, cloud node-lifecycle, service and
//! route controllers, each an API client acting through the provider only.

pub mod ccm;
pub mod kumo;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, NodeAddress, Service};

/// What a provider answers when it cannot do what was asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Another component does this (upstream's `cloudprovider.ImplementedElsewhere`); the
    /// caller skips the work without an error.
    #[error("implemented by alternate to cloud provider")]
    ImplementedElsewhere,
    /// The node's instance does not exist (upstream's `cloudprovider.InstanceNotFound`).
    #[error("instance not found")]
    InstanceNotFound,
    /// The provider does not offer this (upstream's `cloudprovider.NotImplemented`).
    #[error("unimplemented")]
    NotImplemented,
    /// Not done yet, and not a failure: try again after `after` (upstream's
    /// `api.RetryError`); the message is the provider's.
    #[error("{message}")]
    RetryAfter { message: String, after: Duration },
    /// Any other failure, with the cloud's message (shown to users in events).
    #[error("{0}")]
    Cloud(String),
}

/// A provider's answer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A cloud, as k8s.io/cloud-provider's `Interface`. Each capability is optional: `None`
/// means the provider does not offer it, and the controllers that need it do not start.
pub trait CloudProvider: Send + Sync + 'static {
    /// The provider's name, the scheme of its providerIDs (`<name>://...`).
    fn provider_name(&self) -> &str;
    /// Load balancers for Services of type LoadBalancer.
    fn load_balancer(&self) -> Option<&dyn LoadBalancer>;
    /// Instances behind nodes.
    fn instances_v2(&self) -> Option<&dyn InstancesV2>;
    /// The route table that carries pod traffic between nodes.
    fn routes(&self) -> Option<&dyn Routes>;
    /// Whether the provider can tell this cluster's resources from another's.
    fn has_cluster_id(&self) -> bool {
        true
    }
}

/// Load balancers (upstream's `cloudprovider.LoadBalancer`). `cluster_name` is the
/// controller manager's `--cluster-name` (default `kubernetes`).
#[async_trait]
pub trait LoadBalancer: Send + Sync {
    /// The balancer's status if it exists.
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>>;
    /// The name the provider gives the Service's balancer.
    fn get_load_balancer_name(&self, cluster_name: &str, service: &Service) -> String;
    /// Creates or updates the balancer to serve `service` on `nodes` and returns its status.
    /// Must not modify the Service.
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus>;
    /// Points the existing balancer at `nodes`.
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<()>;
    /// Deletes the balancer if it exists; Ok when it is gone.
    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<()>;
}

/// What the cloud knows about a node's instance (upstream's `cloudprovider.InstanceMetadata`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InstanceMetadata {
    /// `<provider>://...`; the node controller sets it when the node has none.
    pub provider_id: String,
    /// Becomes the `node.kubernetes.io/instance-type` label.
    pub instance_type: String,
    /// The node's addresses (InternalIP, ExternalIP, Hostname, ...).
    pub node_addresses: Vec<NodeAddress>,
    /// Becomes `topology.kubernetes.io/zone`.
    pub zone: String,
    /// Becomes `topology.kubernetes.io/region`.
    pub region: String,
    /// More labels for the node.
    pub additional_labels: BTreeMap<String, String>,
}

/// Instances behind nodes (upstream's `cloudprovider.InstancesV2`); a node is looked up by
/// its providerID when it has one, else by name.
#[async_trait]
pub trait InstancesV2: Send + Sync {
    /// Whether the node's instance exists (false only when the cloud knows it is gone).
    async fn instance_exists(&self, node: &Node) -> Result<bool>;
    /// Whether the node's instance exists but is shut down.
    async fn instance_shutdown(&self, node: &Node) -> Result<bool>;
    /// The instance's metadata; [`Error::InstanceNotFound`] when there is none.
    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata>;
}

/// One route of the cluster's pod network (upstream's `cloudprovider.Route`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Route {
    /// The provider's name for the route.
    pub name: String,
    /// The node that receives traffic for `destination_cidr`.
    pub target_node: String,
    /// Whether `target_node_addresses` is filled in.
    pub enable_node_addresses: bool,
    /// The target node's addresses, for providers that route by address.
    pub target_node_addresses: Vec<NodeAddress>,
    /// The pod CIDR the route carries.
    pub destination_cidr: String,
    /// The target no longer exists; the route controller deletes blackholed routes.
    pub blackhole: bool,
}

/// The cluster's route table (upstream's `cloudprovider.Routes`).
#[async_trait]
pub trait Routes: Send + Sync {
    /// The routes that belong to the cluster.
    async fn list_routes(&self, cluster_name: &str) -> Result<Vec<Route>>;
    /// Creates a route; `name_hint` is the node's UID, which the provider may use to name it.
    async fn create_route(&self, cluster_name: &str, name_hint: &str, route: &Route) -> Result<()>;
    /// Deletes a route.
    async fn delete_route(&self, cluster_name: &str, route: &Route) -> Result<()>;
}

/// The balancer name upstream derives from a Service: "a" + the UID without dashes, at most
/// 32 characters (`cloudprovider.DefaultLoadBalancerName`).
pub fn default_load_balancer_name(service: &Service) -> String {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    let mut name: String = std::iter::once('a')
        .chain(uid.chars().filter(|c| *c != '-'))
        .collect();
    name.truncate(32);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_name_is_a_plus_uid_without_dashes_cut_at_32() {
        let mut svc = Service::default();
        svc.metadata.uid = Some("1b4e28ba-2fa1-11d2-883f-0016d3cca427".into());
        let name = default_load_balancer_name(&svc);
        assert_eq!(name, "a1b4e28ba2fa111d2883f0016d3cca42");
        assert_eq!(name.len(), 32);
    }
}
