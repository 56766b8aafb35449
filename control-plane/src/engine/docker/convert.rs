//! The engine's types in Docker's terms and back: the container a [`ContainerSpec`] asks of the
//! daemon, what its inspect and list answers say as [`ContainerInfo`], and its errors, states and
//! timestamps in ours. No daemon calls here: the calls are in the parent module.

use std::collections::HashMap;

use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum, ContainerSummary,
    EndpointIpamConfig, EndpointSettings, HostConfig, HostConfigLogConfig, Mount, MountType,
    NetworkingConfig,
};

use crate::engine::{
    ContainerInfo, ContainerSpec, ContainerStatus, EngineError, MANAGED_LABEL, NetworkAttach,
};

pub(super) fn map_err(e: BollardError) -> EngineError {
    match e {
        BollardError::DockerResponseServerError {
            status_code,
            message,
        } => match status_code {
            404 => EngineError::NotFound,
            409 => EngineError::Conflict(message),
            400 | 403 | 422 => EngineError::Rejected(message),
            _ => EngineError::Unavailable(message),
        },
        other => EngineError::Unavailable(other.to_string()),
    }
}

fn status_of(s: Option<ContainerStateStatusEnum>) -> ContainerStatus {
    match s {
        Some(ContainerStateStatusEnum::CREATED) => ContainerStatus::Created,
        Some(ContainerStateStatusEnum::RUNNING) => ContainerStatus::Running,
        Some(ContainerStateStatusEnum::PAUSED) => ContainerStatus::Paused,
        Some(ContainerStateStatusEnum::RESTARTING) => ContainerStatus::Restarting,
        Some(ContainerStateStatusEnum::EXITED) => ContainerStatus::Exited,
        Some(ContainerStateStatusEnum::DEAD) => ContainerStatus::Dead,
        Some(other) => ContainerStatus::Other(other.to_string()),
        None => ContainerStatus::Other(String::new()),
    }
}

/// Docker's RFC 3339 timestamps as Unix seconds.
pub(super) fn unix_seconds(rfc3339: &str) -> Option<i64> {
    time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

pub(super) fn managed_filter(labels: &[(&str, &str)]) -> HashMap<String, Vec<String>> {
    let mut label_filters = vec![format!("{MANAGED_LABEL}=true")];
    label_filters.extend(labels.iter().map(|(k, v)| format!("{k}={v}")));
    HashMap::from([("label".to_string(), label_filters)])
}

pub(super) fn env_list(env: &[(String, String)]) -> Vec<String> {
    env.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

pub(super) fn parse_rfc3339(t: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
}

/// The container a [`ContainerSpec`] asks for: its image, limits, network, mounts and logging.
/// Every container drops all capabilities but those its spec keeps, and runs with
/// `no-new-privileges`.
pub(super) fn create_body(spec: &ContainerSpec) -> ContainerCreateBody {
    let (network_mode, endpoints) = match &spec.network {
        NetworkAttach::None => ("none".to_string(), None),
        NetworkAttach::Network { name, ip } => {
            let endpoint = EndpointSettings {
                ipam_config: ip.map(|ip| EndpointIpamConfig {
                    ipv4_address: Some(ip.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            };
            (
                name.clone(),
                Some(HashMap::from([(name.clone(), endpoint)])),
            )
        }
    };
    let host_config = HostConfig {
        memory: spec.memory_bytes,
        nano_cpus: spec.nano_cpus,
        pids_limit: Some(spec.pids_limit),
        network_mode: Some(network_mode),
        cap_drop: Some(vec!["ALL".to_string()]),
        cap_add: (!spec.cap_add.is_empty()).then(|| spec.cap_add.clone()),
        sysctls: (!spec.sysctls.is_empty()).then(|| spec.sysctls.iter().cloned().collect()),
        security_opt: Some(vec!["no-new-privileges:true".to_string()]),
        runtime: Some(spec.runtime.clone()),
        init: Some(spec.init),
        log_config: (!spec.log_options.is_empty()).then(|| HostConfigLogConfig {
            typ: Some("json-file".to_string()),
            config: Some(spec.log_options.iter().cloned().collect()),
        }),
        mounts: (!spec.volumes.is_empty()).then(|| {
            spec.volumes
                .iter()
                .map(|target| Mount {
                    target: Some(target.clone()),
                    typ: Some(MountType::VOLUME),
                    ..Default::default()
                })
                .collect()
        }),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        cmd: spec.cmd.clone(),
        entrypoint: spec.entrypoint.clone(),
        env: Some(env_list(&spec.env)),
        labels: Some(spec.labels.clone()),
        user: spec.user.clone(),
        host_config: Some(host_config),
        networking_config: Some(NetworkingConfig {
            endpoints_config: endpoints,
        }),
        network_disabled: Some(matches!(spec.network, NetworkAttach::None)),
        ..Default::default()
    }
}

/// An inspected container; `id` stands in when the daemon leaves the id out.
pub(super) fn info_from_inspect(id: &str, c: ContainerInspectResponse) -> ContainerInfo {
    let state = c.state.unwrap_or_default();
    let host = c.host_config.unwrap_or_default();
    ContainerInfo {
        id: c.id.unwrap_or_else(|| id.to_string()),
        name: c
            .name
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_string(),
        image_id: c.image,
        status: status_of(state.status),
        created: c.created.as_deref().and_then(unix_seconds),
        labels: c.config.and_then(|c| c.labels).unwrap_or_default(),
        finished_at: state
            .finished_at
            .filter(|t| !t.is_empty() && !t.starts_with("0001-")),
        memory_bytes: host.memory.filter(|m| *m > 0),
        nano_cpus: host.nano_cpus.filter(|n| *n > 0),
    }
}

/// A container from the list API, which has no stop time or limits; `None` without an id.
pub(super) fn info_from_summary(c: ContainerSummary) -> Option<ContainerInfo> {
    Some(ContainerInfo {
        id: c.id?,
        name: c
            .names
            .unwrap_or_default()
            .first()
            .map(|n| n.trim_start_matches('/').to_string())
            .unwrap_or_default(),
        image_id: c.image_id,
        created: c.created,
        status: match c.state.map(|s| s.to_string()).as_deref() {
            Some("running") => ContainerStatus::Running,
            Some("exited") => ContainerStatus::Exited,
            Some("created") => ContainerStatus::Created,
            Some("dead") => ContainerStatus::Dead,
            Some("paused") => ContainerStatus::Paused,
            Some("restarting") => ContainerStatus::Restarting,
            other => ContainerStatus::Other(other.unwrap_or_default().to_string()),
        },
        labels: c.labels.unwrap_or_default(),
        finished_at: None,
        memory_bytes: None,
        nano_cpus: None,
    })
}
