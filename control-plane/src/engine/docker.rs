//! [`ContainerEngine`] over the Docker Engine API (bollard). The only module that imports bollard.

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, ContainerStateStatusEnum, EndpointIpamConfig, EndpointSettings,
    ExecConfig, HostConfig, HostConfigLogConfig, Ipam, IpamConfig, Mount, MountType,
    NetworkConnectRequest, NetworkCreateRequest, NetworkingConfig,
};
use bollard::query_parameters::{
    CreateImageOptions, ListContainersOptions, RemoveContainerOptions, StopContainerOptions,
    UploadToContainerOptions,
};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use super::{
    AttachedExec, ContainerEngine, ContainerInfo, ContainerSpec, ContainerStatus, EngineError,
    ExecSpec, ExecStream, MANAGED_LABEL, NetworkAttach, NetworkInfo, NetworkSpec,
};

/// Upper bound on one Docker API call that is not a stream; a daemon that hangs longer is
/// treated as unavailable rather than holding a request (and its session lock) forever.
const API_TIMEOUT_SECS: u64 = 120;

pub struct DockerEngine {
    docker: Docker,
}

impl DockerEngine {
    /// Connects through `DOCKER_HOST` or the local socket, and negotiates the API version so an
    /// older daemon (20.10 speaks 1.41) accepts our requests.
    pub async fn connect() -> Result<Self, EngineError> {
        let docker = Docker::connect_with_defaults()
            .map_err(|e| EngineError::Unavailable(e.to_string()))?
            .with_timeout(Duration::from_secs(API_TIMEOUT_SECS));
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        Ok(Self { docker })
    }
}

fn map_err(e: BollardError) -> EngineError {
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
fn unix_seconds(rfc3339: &str) -> Option<i64> {
    time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

fn managed_filter(labels: &[(&str, &str)]) -> HashMap<String, Vec<String>> {
    let mut label_filters = vec![format!("{MANAGED_LABEL}=true")];
    label_filters.extend(labels.iter().map(|(k, v)| format!("{k}={v}")));
    HashMap::from([("label".to_string(), label_filters)])
}

fn env_list(env: &[(String, String)]) -> Vec<String> {
    env.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// An exec's output as bollard delivers it, and its stdin when attached.
type ExecOutput = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<bollard::container::LogOutput, BollardError>> + Send>,
>;

impl DockerEngine {
    /// Creates and starts an exec, attached to its output (and to its stdin with `stdin`).
    async fn start_exec(
        &self,
        id: &str,
        spec: &ExecSpec,
        stdin: bool,
    ) -> Result<
        (
            String,
            ExecOutput,
            std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
        ),
        EngineError,
    > {
        let created = self
            .docker
            .create_exec(
                id,
                ExecConfig {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    attach_stdin: Some(stdin),
                    tty: Some(false),
                    cmd: Some(spec.cmd.clone()),
                    user: Some(spec.user.clone()),
                    working_dir: spec.workdir.clone(),
                    env: Some(env_list(&spec.env)),
                    ..Default::default()
                },
            )
            .await
            .map_err(map_err)?;
        let started = self
            .docker
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: Some(if stdin { 256 * 1024 } else { 64 * 1024 }),
                }),
            )
            .await
            .map_err(map_err)?;
        let StartExecResults::Attached { output, input } = started else {
            return Err(EngineError::Unavailable(
                "exec started detached".to_string(),
            ));
        };
        Ok((created.id, output, input))
    }
}

#[async_trait::async_trait]
impl ContainerEngine for DockerEngine {
    async fn ping(&self) -> Result<(), EngineError> {
        self.docker.ping().await.map(|_| ()).map_err(map_err)
    }

    async fn ensure_image(&self, image: &str) -> Result<(), EngineError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => return Ok(()),
            Err(e) => match map_err(e) {
                EngineError::NotFound => {}
                other => return Err(other),
            },
        }
        let opts = CreateImageOptions {
            from_image: Some(image.to_string()),
            ..Default::default()
        };
        let mut progress = self.docker.create_image(Some(opts), None, None);
        while let Some(item) = progress.next().await {
            let unavailable = |reason: String| EngineError::ImageUnavailable {
                image: image.to_string(),
                reason,
            };
            match item {
                Ok(info) => {
                    if let Some(detail) = info.error_detail {
                        return Err(unavailable(detail.message.unwrap_or_default()));
                    }
                }
                Err(BollardError::DockerResponseServerError { message, .. }) => {
                    return Err(unavailable(message));
                }
                Err(BollardError::DockerStreamError { error }) => return Err(unavailable(error)),
                Err(other) => return Err(EngineError::Unavailable(other.to_string())),
            }
        }
        // A pull stream can end "successfully" without the image (daemon quirks): check.
        self.docker
            .inspect_image(image)
            .await
            .map(|_| ())
            .map_err(|e| EngineError::ImageUnavailable {
                image: image.to_string(),
                reason: map_err(e).to_string(),
            })
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, EngineError> {
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
        let body = ContainerCreateBody {
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
        };
        let options =
            spec.name
                .as_ref()
                .map(|name| bollard::query_parameters::CreateContainerOptions {
                    name: Some(name.clone()),
                    ..Default::default()
                });
        let created = self
            .docker
            .create_container(options, body)
            .await
            .map_err(map_err)?;
        if let Some(skeleton) = &spec.skeleton {
            let put = self
                .docker
                .upload_to_container(
                    &created.id,
                    Some(UploadToContainerOptions {
                        path: "/".to_string(),
                        ..Default::default()
                    }),
                    bollard::body_full(skeleton.clone()),
                )
                .await
                .map_err(map_err);
            if let Err(e) = put {
                // Nothing half-made is left behind.
                let _ = self.remove(&created.id).await;
                return Err(e);
            }
        }
        Ok(created.id)
    }

    async fn start(&self, id: &str) -> Result<(), EngineError> {
        self.docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(map_err)
    }

    async fn inspect(&self, id: &str) -> Result<ContainerInfo, EngineError> {
        let c = self
            .docker
            .inspect_container(
                id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .map_err(map_err)?;
        let state = c.state.unwrap_or_default();
        let host = c.host_config.unwrap_or_default();
        Ok(ContainerInfo {
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
        })
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<(), EngineError> {
        let t = i32::try_from(grace.as_secs()).unwrap_or(i32::MAX);
        match self
            .docker
            .stop_container(
                id,
                Some(StopContainerOptions {
                    t: Some(t),
                    ..Default::default()
                }),
            )
            .await
        {
            // 304: already stopped.
            Err(BollardError::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            other => other.map_err(map_err),
        }
    }

    async fn remove(&self, id: &str) -> Result<(), EngineError> {
        self.docker
            .remove_container(
                id,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await
            .map_err(map_err)
    }

    async fn exec(&self, id: &str, spec: &ExecSpec) -> Result<ExecStream, EngineError> {
        let (exec_id, output, _) = self.start_exec(id, spec, false).await?;
        let output = output
            .map_ok(|chunk| chunk.into_bytes())
            .map_err(map_err)
            .boxed();
        Ok(ExecStream { exec_id, output })
    }

    async fn exec_attached(&self, id: &str, spec: &ExecSpec) -> Result<AttachedExec, EngineError> {
        let (exec_id, output, input) = self.start_exec(id, spec, true).await?;
        let output = output
            .try_filter_map(move |chunk| {
                let exec_id = exec_id.clone();
                async move {
                    Ok(match chunk {
                        bollard::container::LogOutput::StdOut { message } => Some(message),
                        bollard::container::LogOutput::StdErr { message } => {
                            tracing::debug!(exec_id = %exec_id, line = %String::from_utf8_lossy(&message).trim_end(), "session helper");
                            None
                        }
                        _ => None,
                    })
                }
            })
            .map_err(map_err)
            .boxed();
        Ok(AttachedExec { output, input })
    }

    async fn exec_exit_code(&self, exec_id: &str) -> Result<Option<i64>, EngineError> {
        let info = self.docker.inspect_exec(exec_id).await.map_err(map_err)?;
        if info.running == Some(true) {
            return Ok(None);
        }
        Ok(info.exit_code)
    }

    async fn put_archive(
        &self,
        id: &str,
        path: &str,
        tar: BoxStream<'static, Result<Bytes, std::io::Error>>,
    ) -> Result<(), EngineError> {
        self.docker
            .upload_to_container(
                id,
                Some(UploadToContainerOptions {
                    path: path.to_string(),
                    ..Default::default()
                }),
                bollard::body_try_stream(tar),
            )
            .await
            .map_err(map_err)
    }

    async fn get_archive(
        &self,
        id: &str,
        path: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, EngineError>>, EngineError> {
        let mut stream = self
            .docker
            .download_from_container(
                id,
                Some(bollard::query_parameters::DownloadFromContainerOptions {
                    path: path.to_string(),
                }),
            )
            .map_err(map_err)
            .boxed();
        // The daemon's answer (404 for a missing path) arrives as the first item: surface it as
        // the call's error rather than as a broken stream.
        match stream.next().await {
            None => Ok(futures::stream::empty().boxed()),
            Some(Err(e)) => Err(e),
            Some(Ok(first)) => Ok(futures::stream::once(async move { Ok(first) })
                .chain(stream)
                .boxed()),
        }
    }

    async fn wait_for_log(
        &self,
        id: &str,
        needle: &str,
        timeout: Duration,
    ) -> Result<(), EngineError> {
        // Only this start's lines count: a previous start's "listening" must not pass for it.
        // The boundary is the previous run's end (every line it logged is older), not this
        // start's `StartedAt`, which the daemon records after the process may already have
        // logged.
        let previous_end = self
            .docker
            .inspect_container(
                id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .map_err(map_err)?
            .state
            .and_then(|s| s.finished_at)
            .and_then(|t| parse_rfc3339(&t))
            .filter(|t| t.year() > 1);
        let opts = bollard::query_parameters::LogsOptions {
            follow: true,
            stdout: true,
            stderr: true,
            timestamps: true,
            since: previous_end.map_or(0, |t| t.unix_timestamp() as i32),
            ..Default::default()
        };
        let mut logs = self.docker.logs(id, Some(opts));
        // Each line is "<RFC 3339 timestamp> <text>"; lines can be split across frames.
        let mut pending = String::new();
        let search = async {
            while let Some(frame) = logs.next().await {
                let frame = frame.map_err(map_err)?;
                pending.push_str(&String::from_utf8_lossy(&frame.into_bytes()));
                while let Some(nl) = pending.find('\n') {
                    let line: String = pending.drain(..=nl).collect();
                    let (ts, text) = line.split_once(' ').unwrap_or(("", &line));
                    let current = match (previous_end, parse_rfc3339(ts)) {
                        (Some(end), Some(t)) => t > end,
                        _ => true,
                    };
                    if current && text.contains(needle) {
                        return Ok(());
                    }
                }
                if pending.len() > 64 * 1024 {
                    pending.clear();
                }
            }
            Err(EngineError::Unavailable(format!(
                "container {id} exited before logging {needle:?}"
            )))
        };
        tokio::time::timeout(timeout, search).await.map_err(|_| {
            EngineError::Unavailable(format!("container {id} not ready in {timeout:?}"))
        })?
    }

    async fn rename(&self, current: &str, new: &str) -> Result<(), EngineError> {
        self.docker
            .rename_container(
                current,
                bollard::query_parameters::RenameContainerOptions {
                    name: new.to_string(),
                },
            )
            .await
            .map_err(map_err)
    }

    async fn update_limits(
        &self,
        id: &str,
        memory_bytes: Option<i64>,
        nano_cpus: Option<i64>,
    ) -> Result<(), EngineError> {
        let body = bollard::models::ContainerUpdateBody {
            memory: memory_bytes,
            // What the daemon sets at create when only the memory is given.
            memory_swap: memory_bytes.map(|m| m.saturating_mul(2)),
            nano_cpus,
            ..Default::default()
        };
        self.docker
            .update_container(id, body)
            .await
            .map_err(map_err)
    }

    async fn image_id(&self, image: &str) -> Result<String, EngineError> {
        let found = self.docker.inspect_image(image).await.map_err(map_err)?;
        found
            .id
            .ok_or_else(|| EngineError::Unavailable(format!("image {image} has no id")))
    }

    async fn list(&self, labels: &[(&str, &str)]) -> Result<Vec<ContainerInfo>, EngineError> {
        let filters = managed_filter(labels);
        let found = self
            .docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(map_err)?;
        Ok(found
            .into_iter()
            .filter_map(|c| {
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
            })
            .collect())
    }

    async fn create_network(&self, spec: &NetworkSpec) -> Result<String, EngineError> {
        let ipam = spec.subnet.as_ref().map(|subnet| Ipam {
            config: Some(vec![IpamConfig {
                subnet: Some(subnet.clone()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let created = self
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

    async fn remove_network(&self, id_or_name: &str) -> Result<(), EngineError> {
        self.docker
            .remove_network(id_or_name)
            .await
            .map_err(map_err)
    }

    async fn connect_network(
        &self,
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
        self.docker
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

    async fn list_networks(
        &self,
        labels: &[(&str, &str)],
    ) -> Result<Vec<NetworkInfo>, EngineError> {
        let found = self
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
}

fn parse_rfc3339(t: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
}
