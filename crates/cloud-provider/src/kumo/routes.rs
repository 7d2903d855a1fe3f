//! The VPC's main route table as the cluster's routes.

use async_trait::async_trait;

use super::KumoCloud;
use crate::{Error, Result, Route, Routes};

#[async_trait]
impl Routes for KumoCloud {
    async fn list_routes(&self, _cluster_name: &str) -> Result<Vec<Route>> {
        Err(Error::NotImplemented)
    }
    async fn create_route(
        &self,
        _cluster_name: &str,
        _name_hint: &str,
        _route: &Route,
    ) -> Result<()> {
        Err(Error::NotImplemented)
    }
    async fn delete_route(&self, _cluster_name: &str, _route: &Route) -> Result<()> {
        Err(Error::NotImplemented)
    }
}
