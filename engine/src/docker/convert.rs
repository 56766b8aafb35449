//! The engine's types in Docker's terms and back: the container a [`ContainerSpec`] asks of the
//! daemon, what its inspect and list answers say as [`ContainerInfo`], and its errors, states and
//! timestamps in ours. No daemon calls here: the calls are in the area modules beside it.

use std::collections::HashMap;

use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum, ContainerSummary,
    EndpointIpamConfig, EndpointSettings, HostConfig, HostConfigLogConfig, Mount, MountType,
    NetworkingConfig,
};

use crate::credentials::RegistryCredential;
use crate::{
    ContainerInfo, ContainerSpec, ContainerStatus, EngineError, MANAGED_LABEL, NetworkAttach,
    PullFailure, ROLE_LABEL, ROLE_SANDBOX,
};

/// Why a pull failed, from the daemon's status (when it gives one: 20.10 answers most registry
/// errors with a 500) and its message.
pub(super) fn pull_failure(status: Option<u16>, message: &str) -> PullFailure {
    let m = message.to_ascii_lowercase();
    let says = |words: &[&str]| words.iter().any(|w| m.contains(w));
    if says(&[
        "invalid reference",
        "invalid repository name",
        "invalid tag",
        "must be lowercase",
    ]) {
        PullFailure::InvalidReference
    } else if says(&["pull access denied"]) {
        // Docker Hub: "pull access denied for X, repository does not exist or may require
        // 'docker login'".
        PullFailure::DeniedOrMissing
    } else if matches!(status, Some(401 | 403))
        || says(&[
            "unauthorized",
            "authentication required",
            "no basic auth credentials",
            "denied",
            "forbidden",
        ])
    {
        PullFailure::Denied
    } else if status == Some(404)
        || says(&[
            "manifest unknown",
            "not found",
            "name unknown",
            "does not exist",
        ])
    {
        PullFailure::Missing
    } else if status == Some(400) {
        PullFailure::InvalidReference
    } else {
        PullFailure::Unreachable
    }
}

/// `image` with `:latest` when it has neither a tag nor a digest, as the Docker CLI pulls it
/// (the daemon would pull every tag).
pub(super) fn with_default_tag(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') || last.contains(':') {
        image.to_string()
    } else {
        format!("{image}:latest")
    }
}

/// A credential as bollard sends it (`X-Registry-Auth`).
pub(super) fn docker_credentials(c: RegistryCredential) -> bollard::auth::DockerCredentials {
    let expose = |s: Option<sandbox_common::secret::Secret>| s.map(|s| s.expose().to_string());
    bollard::auth::DockerCredentials {
        username: c.username,
        password: expose(c.password),
        identitytoken: expose(c.identity_token),
        registrytoken: expose(c.registry_token),
        serveraddress: Some(c.server),
        ..Default::default()
    }
}

/// bollard 0.21 encodes `X-Registry-Auth` with the standard base64 alphabet; the daemon decodes
/// it with the URL-safe one and, when that fails (a `+` or `/` in the encoding: one credential
/// in five with symbols in it), pulls anonymously without a word. Re-encoded here, on every
/// request that carries the header.
pub(super) fn url_safe_registry_auth(headers: &mut http::HeaderMap) {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    let Some(value) = headers.get("x-registry-auth") else {
        return;
    };
    let reencoded = value
        .to_str()
        .ok()
        .and_then(|v| STANDARD.decode(v).ok())
        .and_then(|json| http::HeaderValue::from_str(&URL_SAFE.encode(json)).ok());
    if let Some(v) = reencoded {
        headers.insert("x-registry-auth", v);
    }
}

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
        auto_remove: spec.auto_remove.then_some(true),
        log_config: (!spec.log_options.is_empty()).then(|| HostConfigLogConfig {
            typ: Some("json-file".to_string()),
            config: Some(spec.log_options.iter().cloned().collect()),
        }),
        mounts: (!spec.volumes.is_empty()
            || !spec.named_volumes.is_empty()
            || !spec.read_only_volumes.is_empty()
            || !spec.host_dirs.is_empty())
        .then(|| {
            let anonymous = spec.volumes.iter().map(|target| Mount {
                target: Some(target.clone()),
                typ: Some(MountType::VOLUME),
                ..Default::default()
            });
            let writable = spec.named_volumes.iter().map(|v| (v, false));
            let read_only = spec.read_only_volumes.iter().map(|v| (v, true));
            let named = writable.chain(read_only).map(|((name, target), ro)| Mount {
                target: Some(target.clone()),
                source: Some(name.clone()),
                typ: Some(MountType::VOLUME),
                read_only: ro.then_some(true),
                volume_options: Some(bollard::models::MountVolumeOptions {
                    no_copy: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            });
            let binds = spec.host_dirs.iter().map(|(source, target)| Mount {
                target: Some(target.clone()),
                source: Some(source.clone()),
                typ: Some(MountType::BIND),
                bind_options: Some(bollard::models::MountBindOptions {
                    non_recursive: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            });
            anonymous.chain(named).chain(binds).collect()
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
        // `NetworkDisabled` beside network mode `none` (nothing but loopback either way): Docker
        // then writes no resolv.conf naming the host's resolver. Not for a sandbox under gVisor:
        // there Docker leaves loopback unconfigured and gVisor (host networking) keeps it down,
        // so no server in the sandbox could be reached, not even by its own helper. (The
        // service's other containers under gVisor, its runtime probes, need no loopback, and
        // runsc fails their `exec`s with one.)
        network_disabled: Some(
            matches!(spec.network, NetworkAttach::None)
                && !(is_gvisor(&spec.runtime) && is_sandbox(spec)),
        ),
        ..Default::default()
    }
}

/// Whether `runtime` is gVisor's (`runsc`, or a name an operator registered it under that says
/// so).
fn is_gvisor(runtime: &str) -> bool {
    runtime.contains("runsc") || runtime.contains("gvisor")
}

/// Whether `spec` is a session's sandbox (by its role label).
fn is_sandbox(spec: &ContainerSpec) -> bool {
    spec.labels.get(ROLE_LABEL).map(String::as_str) == Some(ROLE_SANDBOX)
}

/// An inspected container; `id` stands in when the daemon leaves the id out.
pub(super) fn info_from_inspect(id: &str, c: ContainerInspectResponse) -> ContainerInfo {
    let state = c.state.unwrap_or_default();
    let host = c.host_config.unwrap_or_default();
    let config = c.config.unwrap_or_default();
    let env = config.env.clone().unwrap_or_default();
    let volumes = c
        .mounts
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.typ.as_deref() == Some("volume"))
        .filter_map(|m| Some((m.destination?, m.name?)))
        .collect();
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
        labels: config.labels.unwrap_or_default(),
        finished_at: state
            .finished_at
            .filter(|t| !t.is_empty() && !t.starts_with("0001-")),
        memory_bytes: host.memory.filter(|m| *m > 0),
        nano_cpus: host.nano_cpus.filter(|n| *n > 0),
        env,
        volumes,
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
        env: Vec::new(),
        volumes: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};

    /// The daemon's words (Docker 20.10, a distribution registry with htpasswd, Docker Hub).
    #[test]
    fn pull_failures_are_told_apart() {
        for (status, message, want) in [
            (
                Some(500),
                r#"Head "http://127.0.0.1:5000/v2/private/busybox/manifests/1": no basic auth credentials"#,
                PullFailure::Denied,
            ),
            (
                Some(500),
                "unauthorized: authentication required",
                PullFailure::Denied,
            ),
            (
                Some(403),
                "denied: requested access to the resource is denied",
                PullFailure::Denied,
            ),
            (Some(401), "", PullFailure::Denied),
            (
                Some(404),
                "pull access denied for nope, repository does not exist or may require 'docker login'",
                PullFailure::DeniedOrMissing,
            ),
            (
                Some(404),
                "manifest for 127.0.0.1:5000/private/busybox:nope not found: manifest unknown: manifest unknown",
                PullFailure::Missing,
            ),
            (
                Some(500),
                r#"Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused"#,
                PullFailure::Unreachable,
            ),
            (
                Some(400),
                "invalid reference format: repository name must be lowercase",
                PullFailure::InvalidReference,
            ),
            (None, "unexpected EOF", PullFailure::Unreachable),
        ] {
            assert_eq!(pull_failure(status, message), want, "{message}");
        }
    }

    /// An isolated sandbox: no resolv.conf naming the host's resolver under runc; under gVisor,
    /// a loopback its helper can reach.
    #[test]
    fn an_isolated_container_is_network_disabled_but_under_gvisor() {
        let spec = |runtime: &str, network| ContainerSpec {
            runtime: runtime.into(),
            network,
            labels: [(ROLE_LABEL.to_string(), ROLE_SANDBOX.to_string())].into(),
            ..ContainerSpec::for_tests("img")
        };
        let disabled = |s: &ContainerSpec| create_body(s).network_disabled;
        assert_eq!(disabled(&spec("runc", NetworkAttach::None)), Some(true));
        assert_eq!(disabled(&spec("runsc", NetworkAttach::None)), Some(false));
        // A probe under gVisor (not a sandbox) stays disabled.
        let probe = ContainerSpec {
            labels: [(ROLE_LABEL.to_string(), "runtime-probe".to_string())].into(),
            ..spec("runsc", NetworkAttach::None)
        };
        assert_eq!(disabled(&probe), Some(true));
        let attached = NetworkAttach::Network {
            name: "n".into(),
            ip: None,
        };
        assert_eq!(disabled(&spec("runc", attached)), Some(false));
    }

    #[test]
    fn untagged_names_pull_latest_only() {
        for (image, want) in [
            ("busybox", "busybox:latest"),
            ("busybox:1", "busybox:1"),
            ("127.0.0.1:5000/img", "127.0.0.1:5000/img:latest"),
            ("127.0.0.1:5000/img:2", "127.0.0.1:5000/img:2"),
            ("img@sha256:abcd", "img@sha256:abcd"),
        ] {
            assert_eq!(with_default_tag(image), want);
        }
    }

    /// `???` encodes to `Pz8/`: a header the daemon would fail to decode and ignore.
    #[test]
    fn the_registry_auth_header_is_re_encoded_url_safe() {
        let json = r#"{"username":"a","password":"???>>>"}"#;
        let standard = STANDARD.encode(json);
        assert!(standard.contains(['+', '/']), "{standard}");
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "X-Registry-Auth",
            http::HeaderValue::from_str(&standard).expect("header"),
        );
        url_safe_registry_auth(&mut headers);
        let sent = headers
            .get("x-registry-auth")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(!sent.contains(['+', '/']), "{sent}");
        assert_eq!(URL_SAFE.decode(sent).ok().as_deref(), Some(json.as_bytes()));
        // Other requests are left alone.
        let mut none = http::HeaderMap::new();
        url_safe_registry_auth(&mut none);
        assert!(none.is_empty());
    }
}
