//! The kumo cloud (`kumo cloud`) as a [`CloudProvider`]: instances behind nodes, load
//! balancers for Services, and the VPC's main route table, all through the cloud's typed
//! [`kumo_cloud::Client`].
//!
//! A node's instance is found by its providerID `kumo://<zone>/<instance-id>` or, before
//! the node has one, by the instance whose name is the node's name (the kubelet of an
//! instance registers under the instance's name).

mod instances;
mod lb;
mod routes;

use crate::{CloudProvider, Error, InstancesV2, LoadBalancer, Routes};

/// The provider name, the scheme of providerIDs.
pub const PROVIDER_NAME: &str = "kumo";

/// The kumo cloud as a provider.
#[derive(Clone)]
pub struct KumoCloud {
    client: kumo_cloud::Client,
}

impl KumoCloud {
    /// A provider that talks to the cloud through `client` (its credentials are the
    /// cloud-controller-manager's).
    pub fn new(client: kumo_cloud::Client) -> Self {
        KumoCloud { client }
    }

    /// The cloud client.
    pub fn client(&self) -> &kumo_cloud::Client {
        &self.client
    }
}

impl CloudProvider for KumoCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }
}

/// `kumo://<zone>/<instance-id>`.
pub fn provider_id(zone: &str, instance_id: &str) -> String {
    format!("{PROVIDER_NAME}://{zone}/{instance_id}")
}

/// The instance id in a providerID `kumo://<zone>/<id>` (also `kumo:///<id>` and
/// `kumo://<id>`); None when it is not a kumo providerID.
pub fn instance_id(provider_id: &str) -> Option<&str> {
    let rest = provider_id.strip_prefix("kumo://")?;
    let id = rest.rsplit('/').next()?;
    (id.starts_with("i-") && id.len() > 2).then_some(id)
}

/// The cloud's error as the provider's: a missing instance is [`Error::InstanceNotFound`];
/// throttling with `Retry-After` is [`Error::RetryAfter`]; anything else keeps the cloud's
/// code and message, which end up in events (`SyncLoadBalancerFailed`, ...).
pub fn cloud_error(e: kumo_cloud::Error) -> Error {
    match &e {
        kumo_cloud::Error::Api { code, .. } if code == kumo_cloud::codes::INSTANCE_NOT_FOUND => {
            Error::InstanceNotFound
        }
        kumo_cloud::Error::Api {
            code,
            message,
            retry_after: Some(after),
            ..
        } => Error::RetryAfter {
            message: format!("{code}: {message}"),
            after: *after,
        },
        kumo_cloud::Error::Api { code, message, .. } => Error::Cloud(format!("{code}: {message}")),
        other => Error::Cloud(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip() {
        let id = provider_id("kumo-1a", "i-0123456789abcdef0");
        assert_eq!(id, "kumo://kumo-1a/i-0123456789abcdef0");
        assert_eq!(instance_id(&id), Some("i-0123456789abcdef0"));
        assert_eq!(instance_id("kumo:///i-0abc"), Some("i-0abc"));
        assert_eq!(instance_id("aws:///ap-northeast-1a/i-0abc"), None);
        assert_eq!(instance_id("kumo://kumo-1a/"), None);
    }
}
