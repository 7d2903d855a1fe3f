//! Instances behind nodes: a node's instance is the one its providerID names, or, before
//! it has one, the instance (not terminated) whose name is the node's name.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kumo_cloud::{Instance, InstanceFilter, InstanceState};

use super::{cloud_error, instance_id, provider_id, KumoCloud};
use crate::{Error, InstanceMetadata, InstancesV2, Result};

impl KumoCloud {
    /// The node's instance as the cloud describes it (terminated ones included when named
    /// by providerID); [`Error::InstanceNotFound`] when the cloud has none.
    async fn node_instance(&self, node: &Node) -> Result<Instance> {
        let pid = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .unwrap_or_default();
        if !pid.is_empty() {
            let id = instance_id(pid).ok_or_else(|| {
                Error::Cloud(format!("providerID {pid:?} is not a kumo providerID"))
            })?;
            return self
                .client()
                .describe_instance(id)
                .await
                .map_err(cloud_error);
        }
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let filter = InstanceFilter {
            name: Some(name.to_owned()),
            ..Default::default()
        };
        let mut found: Vec<Instance> = self
            .client()
            .list_instances(&filter)
            .await
            .map_err(cloud_error)?
            .into_iter()
            .filter(|i| i.state != InstanceState::Terminated)
            .collect();
        match found.len() {
            0 => Err(Error::InstanceNotFound),
            1 => Ok(found.remove(0)),
            n => Err(Error::Cloud(format!(
                "found {n} instances named {name:?}, expected one"
            ))),
        }
    }
}

/// InternalIP, InternalDNS and Hostname, as AWS reports them (empty ones left out).
fn addresses(i: &Instance) -> Vec<NodeAddress> {
    let addr = |type_: &str, address: &str| NodeAddress {
        type_: type_.into(),
        address: address.into(),
    };
    let mut out = Vec::new();
    if !i.private_ip.is_empty() {
        out.push(addr("InternalIP", &i.private_ip));
    }
    if !i.private_dns_name.is_empty() {
        out.push(addr("InternalDNS", &i.private_dns_name));
        out.push(addr("Hostname", &i.private_dns_name));
    }
    out
}

#[async_trait]
impl InstancesV2 for KumoCloud {
    async fn instance_exists(&self, node: &Node) -> Result<bool> {
        match self.node_instance(node).await {
            Ok(i) => Ok(i.state != InstanceState::Terminated),
            Err(Error::InstanceNotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool> {
        match self.node_instance(node).await {
            Ok(i) => Ok(matches!(
                i.state,
                InstanceState::Stopped | InstanceState::Stopping
            )),
            Err(Error::InstanceNotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata> {
        let i = self.node_instance(node).await?;
        if i.state == InstanceState::Terminated {
            return Err(Error::InstanceNotFound);
        }
        Ok(InstanceMetadata {
            provider_id: provider_id(&i.zone, &i.id),
            instance_type: i.instance_type.clone(),
            node_addresses: addresses(&i),
            zone: i.zone.clone(),
            region: i.region.clone(),
            additional_labels: Default::default(),
        })
    }
}
