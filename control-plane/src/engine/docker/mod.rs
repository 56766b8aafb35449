//! [`ContainerEngine`] over the Docker Engine API (bollard). The only module that imports bollard.
//!
//! This file makes the daemon calls; `convert` translates between the engine's types and
//! bollard's models (specs, inspect and list answers, errors, states, timestamps).

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{
    EndpointIpamConfig, EndpointSettings, ExecConfig, Ipam, IpamConfig, NetworkConnectRequest,
    NetworkCreateRequest,
};
use bollard::query_parameters::{
    CreateImageOptions, ListContainersOptions, RemoveContainerOptions, StopContainerOptions,
    UploadToContainerOptions,
};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use super::credentials::{CredentialStore, Registry};
use super::reference::names_image;
use super::{
    AttachedExec, CommitSpec, ContainerEngine, ContainerInfo, ContainerSpec, EngineError,
    EngineInfo, ExecSpec, ExecStream, ImageInfo, NetworkInfo, NetworkSpec, PullFailure, VolumeInfo,
    VolumeSpec,
};

mod convert;

use convert::{
    create_body, docker_credentials, env_list, info_from_inspect, info_from_summary,
    managed_filter, map_err, parse_rfc3339, pull_failure, unix_seconds, url_safe_registry_auth,
    with_default_tag,
};

/// Upper bound on one Docker API call that is not a stream; a daemon that hangs longer is
/// treated as unavailable rather than holding a request (and its session lock) forever.
const API_TIMEOUT_SECS: u64 = 120;

pub struct DockerEngine {
    docker: Docker,
    /// Registry credentials for pulls, looked up per pull.
    credentials: CredentialStore,
}

impl DockerEngine {
    /// Connects through `DOCKER_HOST` or the local socket, and negotiates the API version so an
    /// older daemon (20.10 speaks 1.41) accepts our requests. Pulls use the credentials of
    /// `credentials` (the process's Docker client config in production).
    pub async fn connect(credentials: CredentialStore) -> Result<Self, EngineError> {
        let docker =
            Docker::connect_with_defaults().map_err(|e| EngineError::Unavailable(e.to_string()))?;
        Self::negotiate(docker, credentials).await
    }

    /// Connects to a fleet's engine: a `unix://` socket, or `tcp://` with mutual TLS when `tls`
    /// is given (plain TCP otherwise, for an engine behind a tunnel of the operator's). Fails when
    /// the engine does not answer (the fleet tries again).
    pub async fn connect_endpoint(
        endpoint: &str,
        tls: Option<&crate::config::TlsFiles>,
        credentials: CredentialStore,
    ) -> Result<Self, EngineError> {
        let version = bollard::API_DEFAULT_VERSION;
        let docker = match (crate::config::endpoint_kind(endpoint), tls) {
            (Some(crate::config::Endpoint::Unix), _) => {
                Docker::connect_with_unix(endpoint, API_TIMEOUT_SECS, version)
            }
            (Some(crate::config::Endpoint::Tcp), Some(tls)) => mutual_tls(endpoint, tls, version),
            (Some(crate::config::Endpoint::Tcp), None) => {
                Docker::connect_with_http(endpoint, API_TIMEOUT_SECS, version)
            }
            (None, _) => {
                return Err(EngineError::Rejected(format!(
                    "not an engine endpoint: {endpoint}"
                )));
            }
        }
        .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        Self::negotiate(docker, credentials).await
    }

    async fn negotiate(docker: Docker, credentials: CredentialStore) -> Result<Self, EngineError> {
        let docker = docker
            .with_timeout(Duration::from_secs(API_TIMEOUT_SECS))
            .with_request_modifier(|mut req| {
                url_safe_registry_auth(req.headers_mut());
                req
            });
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        Ok(Self {
            docker,
            credentials,
        })
    }

    /// The credentials to pull `image` with, in bollard's form, and where they came from (for
    /// the log). A lookup that fails is logged (never a value) and the pull goes anonymous: a
    /// public image still pulls, a private one is refused as unauthenticated.
    async fn pull_credentials(
        &self,
        image: &str,
        registry: &Registry,
    ) -> (Option<bollard::auth::DockerCredentials>, String) {
        match self.credentials.lookup(registry).await {
            Ok(Some(c)) => {
                let source = c.source.to_string();
                (Some(docker_credentials(c)), source)
            }
            Ok(None) => (None, "none".to_string()),
            Err(e) => {
                tracing::warn!(image, registry = registry.server(), error = %e, "registry credentials unavailable; pulling without");
                (None, "none (lookup failed)".to_string())
            }
        }
    }
}

/// A Docker client for `tcp://host:port` over mutual TLS: the fleet's CA is the only one trusted
/// and the client certificate is presented; connections are kept and reused, without Nagle's
/// delay. (bollard's own TLS transport opens a connection per request with Nagle on: the
/// request's last segment then waits for the engine's delayed ACK, 40 ms a call.)
fn mutual_tls(
    endpoint: &str,
    tls: &crate::config::TlsFiles,
    version: &bollard::ClientVersion,
) -> Result<Docker, bollard::errors::Error> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &str, path: &std::path::Path, e: &dyn std::fmt::Display| {
        bollard::errors::Error::IOError {
            err: std::io::Error::other(format!("{what} {}: {e}", path.display())),
        }
    };
    let mut roots = rustls::RootCertStore::empty();
    let cas = CertificateDer::pem_file_iter(&tls.ca)
        .map_err(|e| bad("CA", &tls.ca, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("CA", &tls.ca, &e))?;
    for ca in cas {
        roots.add(ca).map_err(|e| bad("CA", &tls.ca, &e))?;
    }
    let certs = CertificateDer::pem_file_iter(&tls.cert)
        .map_err(|e| bad("certificate", &tls.cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("certificate", &tls.cert, &e))?;
    // The key's content never reaches an error or the log: only its path.
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| bad("key", &tls.key, &e))?;
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| bad("certificate", &tls.cert, &e))?;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(3)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(https);
    let host = endpoint.trim_start_matches("tcp://");
    Docker::connect_with_custom_transport(
        move |req: bollard::BollardRequest| {
            let client = client.clone();
            async move {
                client
                    .request(req)
                    .await
                    .map_err(bollard::errors::Error::from)
            }
        },
        Some(format!("https://{host}")),
        API_TIMEOUT_SECS,
        version,
    )
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

    async fn info(&self) -> Result<EngineInfo, EngineError> {
        let info = self.docker.info().await.map_err(map_err)?;
        let images = self
            .docker
            .list_images(Some(bollard::query_parameters::ListImagesOptions {
                all: false,
                ..Default::default()
            }))
            .await
            .map_err(map_err)?;
        Ok(EngineInfo {
            runtimes: info
                .runtimes
                .map(|r| r.into_keys().collect())
                .unwrap_or_default(),
            images: images
                .into_iter()
                .flat_map(|i| i.repo_tags)
                .filter(|t| t != "<none>:<none>")
                .collect(),
        })
    }

    async fn ensure_image(&self, image: &str) -> Result<ImageInfo, EngineError> {
        match self.inspect_image(image).await {
            Ok(found) if names_image(image, &found) => return Ok(found),
            // Only a name of hex digits can resolve by id: a prefix of an id the engine holds
            // (another deployment's snapshot, say). Refused as such, and never pulled: its
            // repository would be Docker Hub's.
            Ok(_) => {
                return Err(EngineError::ImageUnavailable {
                    image: image.to_string(),
                    failure: PullFailure::InvalidReference,
                    reason: "the name resolves to an image by its id, not by a tag".into(),
                });
            }
            Err(EngineError::NotFound) => {}
            Err(other) => return Err(other),
        }
        let registry = Registry::of_image(image);
        let (credentials, source) = self.pull_credentials(image, &registry).await;
        let opts = CreateImageOptions {
            // The daemon pulls every tag of an untagged name; the CLI (and the reference's SDK)
            // mean `latest`.
            from_image: Some(with_default_tag(image)),
            ..Default::default()
        };
        let failed = |status: Option<u16>, reason: String| {
            let failure = pull_failure(status, &reason);
            tracing::warn!(image, registry = registry.server(), credentials = %source, failure = ?failure, error = %reason, "image pull failed");
            EngineError::ImageUnavailable {
                image: image.to_string(),
                failure,
                reason,
            }
        };
        let mut progress = self.docker.create_image(Some(opts), None, credentials);
        while let Some(item) = progress.next().await {
            match item {
                Ok(info) => {
                    if let Some(detail) = info.error_detail {
                        let status = detail.code.and_then(|c| u16::try_from(c).ok());
                        return Err(failed(status, detail.message.unwrap_or_default()));
                    }
                }
                Err(BollardError::DockerResponseServerError {
                    status_code,
                    message,
                }) => return Err(failed(Some(status_code), message)),
                Err(BollardError::DockerStreamError { error }) => return Err(failed(None, error)),
                Err(other) => return Err(EngineError::Unavailable(other.to_string())),
            }
        }
        // A pull stream can end "successfully" without the image (daemon quirks): check.
        match self.inspect_image(image).await {
            Ok(found) if names_image(image, &found) => {
                tracing::info!(image, credentials = %source, "image pulled");
                Ok(found)
            }
            Ok(_) => Err(EngineError::ImageUnavailable {
                image: image.to_string(),
                failure: PullFailure::Missing,
                reason: "the pulled image does not carry this name".into(),
            }),
            Err(e) => Err(EngineError::ImageUnavailable {
                image: image.to_string(),
                failure: PullFailure::Missing,
                reason: e.to_string(),
            }),
        }
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, EngineError> {
        let body = create_body(spec);
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
                    bollard::body_stream(futures::stream::iter(slices(skeleton))),
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
        Ok(info_from_inspect(id, c))
    }

    async fn writable_bytes(&self, id: &str) -> Result<Option<u64>, EngineError> {
        let c = self
            .docker
            .inspect_container(
                id,
                Some(bollard::query_parameters::InspectContainerOptions { size: true }),
            )
            .await
            .map_err(map_err)?;
        Ok(c.size_rw.and_then(|s| u64::try_from(s).ok()))
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
        Ok(found.into_iter().filter_map(info_from_summary).collect())
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

    async fn pause(&self, id: &str) -> Result<(), EngineError> {
        self.docker.pause_container(id).await.map_err(map_err)
    }

    async fn unpause(&self, id: &str) -> Result<(), EngineError> {
        self.docker.unpause_container(id).await.map_err(map_err)
    }

    async fn commit(&self, id: &str, spec: &CommitSpec) -> Result<String, EngineError> {
        let (repo, tag) = spec
            .reference
            .rsplit_once(':')
            .unwrap_or((spec.reference.as_str(), "latest"));
        let config = bollard::models::ContainerConfig {
            env: Some(env_list(&spec.env)),
            labels: Some(spec.labels.clone()),
            entrypoint: Some(spec.entrypoint.clone()),
            cmd: Some(spec.cmd.clone()),
            user: Some(spec.user.clone()),
            ..Default::default()
        };
        let made = self
            .docker
            .commit_container(
                bollard::query_parameters::CommitContainerOptions {
                    container: Some(id.to_string()),
                    repo: Some(repo.to_string()),
                    tag: Some(tag.to_string()),
                    pause: false,
                    ..Default::default()
                },
                config,
            )
            .await
            .map_err(map_err)?;
        Ok(made.id)
    }

    async fn inspect_image(&self, reference: &str) -> Result<ImageInfo, EngineError> {
        let i = self
            .docker
            .inspect_image(reference)
            .await
            .map_err(map_err)?;
        let config = i.config.unwrap_or_default();
        Ok(ImageInfo {
            id: i.id.unwrap_or_default(),
            tags: i.repo_tags.unwrap_or_default(),
            digests: i.repo_digests.unwrap_or_default(),
            labels: config.labels.unwrap_or_default(),
            size: i.size.unwrap_or_default(),
            created: i.created.as_deref().and_then(unix_seconds),
            env: config.env.unwrap_or_default(),
            parent: None,
        })
    }

    async fn list_images(&self, labels: &[(&str, &str)]) -> Result<Vec<ImageInfo>, EngineError> {
        let found = self
            .docker
            .list_images(Some(bollard::query_parameters::ListImagesOptions {
                all: false,
                filters: Some(managed_filter(labels)),
                ..Default::default()
            }))
            .await
            .map_err(map_err)?;
        Ok(found
            .into_iter()
            .map(|i| ImageInfo {
                id: i.id,
                tags: i
                    .repo_tags
                    .into_iter()
                    .filter(|t| t != "<none>:<none>")
                    .collect(),
                digests: i.repo_digests,
                labels: i.labels,
                size: i.size,
                created: Some(i.created),
                env: Vec::new(),
                parent: (!i.parent_id.is_empty()).then_some(i.parent_id),
            })
            .collect())
    }

    async fn remove_image(&self, reference: &str) -> Result<(), EngineError> {
        self.docker
            .remove_image(
                reference,
                Some(bollard::query_parameters::RemoveImageOptions {
                    force: false,
                    noprune: false,
                    ..Default::default()
                }),
                None,
            )
            .await
            .map(drop)
            .map_err(map_err)
    }

    async fn create_volume(&self, spec: &VolumeSpec) -> Result<VolumeInfo, EngineError> {
        let v = self
            .docker
            .create_volume(bollard::models::VolumeCreateRequest {
                name: Some(spec.name.clone()),
                driver: Some("local".to_string()),
                driver_opts: (!spec.driver_opts.is_empty()).then(|| spec.driver_opts.clone()),
                labels: Some(spec.labels.clone()),
                ..Default::default()
            })
            .await
            .map_err(map_err)?;
        Ok(volume_info(v))
    }

    async fn inspect_volume(&self, name: &str) -> Result<VolumeInfo, EngineError> {
        let v = self.docker.inspect_volume(name).await.map_err(map_err)?;
        Ok(volume_info(v))
    }

    async fn list_volumes(&self, labels: &[(&str, &str)]) -> Result<Vec<VolumeInfo>, EngineError> {
        let found = self
            .docker
            .list_volumes(Some(bollard::query_parameters::ListVolumesOptions {
                filters: Some(managed_filter(labels)),
            }))
            .await
            .map_err(map_err)?;
        Ok(found
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(volume_info)
            .collect())
    }

    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        self.docker
            .remove_volume(
                name,
                Some(bollard::query_parameters::RemoveVolumeOptions { force: false }),
            )
            .await
            .map_err(map_err)
    }
}

fn volume_info(v: bollard::models::Volume) -> VolumeInfo {
    VolumeInfo {
        name: v.name,
        mountpoint: v.mountpoint,
        labels: v.labels,
        created: v.created_at.as_deref().and_then(unix_seconds),
    }
}

/// Bytes of an archive handed to the HTTP client at a time. It copies what it is given into its
/// write buffer: the whole skeleton at once (3 MB, most of it the helper binary, shared by every
/// create) would be one copy per create in flight.
const UPLOAD_SLICE: usize = 64 * 1024;

/// `data` as slices of [`UPLOAD_SLICE`] bytes, sharing its buffer.
fn slices(data: &Bytes) -> Vec<Bytes> {
    (0..data.len())
        .step_by(UPLOAD_SLICE)
        .map(|at| data.slice(at..(at + UPLOAD_SLICE).min(data.len())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_the_buffer_and_cover_it() {
        let data = Bytes::from(vec![7u8; 3 * UPLOAD_SLICE + 5]);
        let parts = slices(&data);
        assert_eq!(
            parts.iter().map(Bytes::len).collect::<Vec<_>>(),
            [UPLOAD_SLICE, UPLOAD_SLICE, UPLOAD_SLICE, 5]
        );
        assert_eq!(parts[1].as_ptr(), data[UPLOAD_SLICE..].as_ptr());
        assert!(slices(&Bytes::new()).is_empty());
    }
}
