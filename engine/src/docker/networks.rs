//! User-defined bridge networks: the egress sessions' internal networks.

use std::collections::HashMap;

use bollard::models::{
    EndpointIpamConfig, EndpointSettings, Ipam, IpamConfig, NetworkConnectRequest,
    NetworkCreateRequest,
};

use super::DockerEngine;
use super::convert::{managed_filter, map_err, unix_seconds};
use crate::{EngineError, NetworkInfo, NetworkSpec};

pub(super) async fn create_network(
    engine: &DockerEngine,
    spec: &NetworkSpec,
) -> Result<String, EngineError> {
    let ipam = spec.subnet.as_ref().map(|subnet| Ipam {
        config: Some(vec![IpamConfig {
            subnet: Some(subnet.clone()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let created = engine
        .docker
        .create_network(NetworkCreateRequest {
            name: spec.name.clone(),
            driver: Some("bridge".to_string()),
            internal: Some(spec.internal),
            ipam,
            options: spec.no_host_address.then(|| {
                HashMap::from([(
                    "com.docker.network.bridge.inhibit_ipv4".to_string(),
                    "true".to_string(),
                )])
            }),
            labels: Some(spec.labels.clone()),
            ..Default::default()
        })
        .await
        .map_err(map_err)?;
    Ok(created.id)
}

pub(super) async fn remove_network(
    engine: &DockerEngine,
    id_or_name: &str,
) -> Result<(), EngineError> {
    engine
        .docker
        .remove_network(id_or_name)
        .await
        .map_err(map_err)
}

pub(super) async fn connect_network(
    engine: &DockerEngine,
    network: &str,
    container: &str,
    ip: Option<std::net::IpAddr>,
) -> Result<(), EngineError> {
    let endpoint = EndpointSettings {
        ipam_config: ip.map(|ip| EndpointIpamConfig {
            ipv4_address: Some(ip.to_string()),
            ..Default::default()
        }),
        ..Default::default()
    };
    engine
        .docker
        .connect_network(
            network,
            NetworkConnectRequest {
                container: container.to_string(),
                endpoint_config: Some(endpoint),
            },
        )
        .await
        .map_err(map_err)
}

pub(super) async fn list_networks(
    engine: &DockerEngine,
    labels: &[(&str, &str)],
) -> Result<Vec<NetworkInfo>, EngineError> {
    let found = engine
        .docker
        .list_networks(Some(bollard::query_parameters::ListNetworksOptions {
            filters: Some(managed_filter(labels)),
        }))
        .await
        .map_err(map_err)?;
    Ok(found
        .into_iter()
        .filter_map(|n| {
            Some(NetworkInfo {
                id: n.id?,
                name: n.name.unwrap_or_default(),
                labels: n.labels.unwrap_or_default(),
                created: n.created.as_deref().and_then(unix_seconds),
            })
        })
        .collect())
}
