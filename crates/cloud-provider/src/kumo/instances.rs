//! Instances behind nodes.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;

use super::KumoCloud;
use crate::{Error, InstanceMetadata, InstancesV2, Result};

#[async_trait]
impl InstancesV2 for KumoCloud {
    async fn instance_exists(&self, _node: &Node) -> Result<bool> {
        Err(Error::NotImplemented)
    }
    async fn instance_shutdown(&self, _node: &Node) -> Result<bool> {
        Err(Error::NotImplemented)
    }
    async fn instance_metadata(&self, _node: &Node) -> Result<InstanceMetadata> {
        Err(Error::NotImplemented)
    }
}
