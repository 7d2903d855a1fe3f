//! What carries the VPC's packets. The cloud keeps the route table; the owner of the
//! process provides the [`Network`] that makes it real (`kumo up` on the real runtime
//! programs it into the VPC's network namespace). Like the hypervisor, the cloud crate
//! itself knows nothing of namespaces.

use std::net::Ipv4Addr;

use async_trait::async_trait;

/// One route as the network carries it: packets to `destination` go to the private
/// address of the instance the route names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NextHop {
    /// A canonical CIDR (`10.244.1.0/24`).
    pub destination: String,
    /// The target instance's private address.
    pub via: Ipv4Addr,
}

/// One load balancer as the network carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbRoute {
    /// The load balancer's id.
    pub id: String,
    /// Its VIP.
    pub vip: Ipv4Addr,
    /// Its listeners.
    pub listeners: Vec<crate::model::Listener>,
    /// The private addresses of the targets its health check finds healthy.
    pub targets: Vec<Ipv4Addr>,
}

/// The VPC's data plane.
#[async_trait]
pub trait Network: Send + Sync + 'static {
    /// Makes the VPC carry exactly these routes (beyond its own range), replacing what it
    /// carried before. Called when they change, and once at start.
    async fn set_routes(&self, routes: &[NextHop]) -> Result<(), String>;

    /// Whether packets are real: targets' health then comes from [`Network::probe`]
    /// (else from the instances' states).
    fn probes(&self) -> bool {
        false
    }

    /// One health check of `target` as `check` says (from inside the VPC).
    async fn probe(
        &self,
        _target: std::net::SocketAddr,
        _check: &crate::model::HealthCheck,
    ) -> bool {
        true
    }

    /// Makes the VPC carry exactly these load balancers. Called when they or their
    /// healthy targets change.
    async fn set_load_balancers(&self, _lbs: &[LbRoute]) -> Result<(), String> {
        Ok(())
    }
}

/// A network of records only: routes change nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopNetwork;

#[async_trait]
impl Network for NoopNetwork {
    async fn set_routes(&self, _: &[NextHop]) -> Result<(), String> {
        Ok(())
    }
}
