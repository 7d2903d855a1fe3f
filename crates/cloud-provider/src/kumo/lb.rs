//! Load balancers for Services of type LoadBalancer.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use super::KumoCloud;
use crate::{Error, LoadBalancer, Result};

#[async_trait]
impl LoadBalancer for KumoCloud {
    async fn get_load_balancer(
        &self,
        _cluster_name: &str,
        _service: &Service,
    ) -> Result<Option<LoadBalancerStatus>> {
        Err(Error::NotImplemented)
    }
    fn get_load_balancer_name(&self, _cluster_name: &str, service: &Service) -> String {
        crate::default_load_balancer_name(service)
    }
    async fn ensure_load_balancer(
        &self,
        _cluster_name: &str,
        _service: &Service,
        _nodes: &[Node],
    ) -> Result<LoadBalancerStatus> {
        Err(Error::NotImplemented)
    }
    async fn update_load_balancer(
        &self,
        _cluster_name: &str,
        _service: &Service,
        _nodes: &[Node],
    ) -> Result<()> {
        Err(Error::NotImplemented)
    }
    async fn ensure_load_balancer_deleted(
        &self,
        _cluster_name: &str,
        _service: &Service,
    ) -> Result<()> {
        Err(Error::NotImplemented)
    }
}
