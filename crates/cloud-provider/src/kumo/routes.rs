//! The VPC's main route table as the cluster's routes. The table is shared (other
//! clusters, hand-made routes), so a cluster's routes are told apart by name
//! (`<cluster-name>-<node UID>`) and description (`Kubernetes cluster <cluster-name>: pods
//! of node <node>`). A route's target is the node's instance, the one named as the node;
//! the instance's name is the route's target node, and a terminated or vanished instance
//! makes the route a blackhole, which the route controller deletes.

use std::collections::HashMap;

use async_trait::async_trait;
use kumo_cloud::{codes, Instance, InstanceFilter, InstanceState, RouteState};

use super::{cloud_error, KumoCloud};
use crate::{Error, Result, Route, Routes};

/// The start of the description of every route of `cluster`.
fn description_prefix(cluster: &str) -> String {
    format!("Kubernetes cluster {cluster}: pods of node ")
}

/// The node a route of `cluster` was created for, from its name and description; None
/// when the route is not the cluster's.
fn owned_by(cluster: &str, r: &kumo_cloud::Route) -> Option<String> {
    if r.origin != "CreateRoute" || !r.name.starts_with(&format!("{cluster}-")) {
        return None;
    }
    r.description
        .strip_prefix(&description_prefix(cluster))
        .map(str::to_owned)
}

impl KumoCloud {
    /// The instance (not terminated) behind the node a route targets: the one named as the
    /// node, else the one whose private IP is among the node's InternalIP addresses.
    async fn route_target(&self, route: &Route) -> Result<Instance> {
        let alive = |list: Vec<Instance>| -> Vec<Instance> {
            list.into_iter()
                .filter(|i| i.state != InstanceState::Terminated)
                .collect()
        };
        let by_name = InstanceFilter {
            name: Some(route.target_node.clone()),
            ..Default::default()
        };
        let mut found = alive(
            self.client()
                .list_instances(&by_name)
                .await
                .map_err(cloud_error)?,
        );
        if found.is_empty() {
            for a in &route.target_node_addresses {
                if a.type_ != "InternalIP" {
                    continue;
                }
                let by_ip = InstanceFilter {
                    private_ip: Some(a.address.clone()),
                    ..Default::default()
                };
                found = alive(
                    self.client()
                        .list_instances(&by_ip)
                        .await
                        .map_err(cloud_error)?,
                );
                if !found.is_empty() {
                    break;
                }
            }
        }
        match found.len() {
            0 => Err(Error::InstanceNotFound),
            1 => Ok(found.remove(0)),
            n => Err(Error::Cloud(format!(
                "found {n} instances for node {:?}, expected one",
                route.target_node
            ))),
        }
    }
}

#[async_trait]
impl Routes for KumoCloud {
    async fn list_routes(&self, cluster_name: &str) -> Result<Vec<Route>> {
        let table = self
            .client()
            .main_route_table()
            .await
            .map_err(cloud_error)?;
        let mine: Vec<(kumo_cloud::Route, String)> = table
            .routes
            .into_iter()
            .filter_map(|r| owned_by(cluster_name, &r).map(|node| (r, node)))
            .collect();
        if mine.is_empty() {
            return Ok(Vec::new());
        }
        // Terminated instances included: their routes are blackholes.
        let filter = InstanceFilter {
            ids: mine.iter().map(|(r, _)| r.instance_id.clone()).collect(),
            ..Default::default()
        };
        let instances: HashMap<String, Instance> = self
            .client()
            .list_instances(&filter)
            .await
            .map_err(cloud_error)?
            .into_iter()
            .map(|i| (i.id.clone(), i))
            .collect();
        Ok(mine
            .into_iter()
            .map(|(r, node)| {
                let instance = instances.get(&r.instance_id);
                let gone = instance.is_none_or(|i| i.state == InstanceState::Terminated);
                Route {
                    name: r.name,
                    target_node: instance.map_or(node, |i| i.name.clone()),
                    destination_cidr: r.destination_cidr,
                    blackhole: gone || r.state == RouteState::Blackhole,
                    ..Default::default()
                }
            })
            .collect())
    }

    async fn create_route(&self, cluster_name: &str, name_hint: &str, route: &Route) -> Result<()> {
        let instance = self.route_target(route).await?;
        let table = self
            .client()
            .main_route_table()
            .await
            .map_err(cloud_error)?;
        // A route to the same CIDR: done if it already points at the instance; a blackhole
        // left behind is replaced (as AWS's provider does).
        if let Some(existing) = table
            .routes
            .iter()
            .find(|r| r.destination_cidr == route.destination_cidr)
        {
            if existing.instance_id == instance.id && existing.state == RouteState::Active {
                return Ok(());
            }
            if existing.state == RouteState::Blackhole {
                tracing::info!(
                    "replacing blackhole route {} {}",
                    existing.name,
                    existing.destination_cidr
                );
                match self
                    .client()
                    .delete_route(&table.id, &existing.destination_cidr)
                    .await
                {
                    Ok(_) => {}
                    Err(kumo_cloud::Error::Api { code, .. }) if code == codes::ROUTE_NOT_FOUND => {}
                    Err(e) => return Err(cloud_error(e)),
                }
            }
        }
        let req = kumo_cloud::CreateRouteRequest {
            destination_cidr: route.destination_cidr.clone(),
            instance_id: instance.id,
            name: format!("{cluster_name}-{name_hint}"),
            description: format!("{}{}", description_prefix(cluster_name), route.target_node),
        };
        self.client()
            .create_route(&table.id, &req)
            .await
            .map_err(cloud_error)?;
        Ok(())
    }

    async fn delete_route(&self, _cluster_name: &str, route: &Route) -> Result<()> {
        let table = self
            .client()
            .main_route_table()
            .await
            .map_err(cloud_error)?;
        match self
            .client()
            .delete_route(&table.id, &route.destination_cidr)
            .await
        {
            Ok(_) => Ok(()),
            // Already gone: what was asked is done.
            Err(kumo_cloud::Error::Api { code, .. }) if code == codes::ROUTE_NOT_FOUND => Ok(()),
            Err(e) => Err(cloud_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, description: &str) -> kumo_cloud::Route {
        kumo_cloud::Route {
            destination_cidr: "10.244.1.0/24".into(),
            instance_id: "i-0123456789abcdef0".into(),
            name: name.into(),
            description: description.into(),
            state: RouteState::Active,
            origin: "CreateRoute".into(),
        }
    }

    #[test]
    fn routes_belong_to_their_cluster_only() {
        let ours = route(
            "kubernetes-uid",
            "Kubernetes cluster kubernetes: pods of node n1",
        );
        assert_eq!(owned_by("kubernetes", &ours).as_deref(), Some("n1"));
        assert_eq!(owned_by("kubernetes-2", &ours), None);
        let other = route(
            "kubernetes-2-uid",
            "Kubernetes cluster kubernetes-2: pods of node n1",
        );
        assert_eq!(owned_by("kubernetes", &other), None);
        assert_eq!(owned_by("kubernetes", &route("manual", "by hand")), None);
    }
}
