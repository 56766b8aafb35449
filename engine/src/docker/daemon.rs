//! The daemon itself: how it is reached (its socket, plain TCP, or mutual TLS over our own
//! pooled transport), the API version both speak, and the calls about the engine as a whole.

use std::time::Duration;

use bollard::Docker;
use sandbox_common::endpoint::{Endpoint, TlsFiles, endpoint_kind};

use super::convert::{map_err, url_safe_registry_auth};
use super::{API_TIMEOUT_SECS, DockerEngine};
use crate::credentials::CredentialStore;
use crate::{EngineError, EngineInfo};

impl DockerEngine {
    /// Connects through `DOCKER_HOST` or the local socket, and negotiates the API version so an
    /// older daemon (20.10 speaks 1.41) accepts our requests. A `DOCKER_HOST` over TLS (`https://`,
    /// or `DOCKER_TLS_VERIFY` with `DOCKER_CERT_PATH`'s certificates) goes through bollard's own
    /// TLS transport (its `ssl` feature), as the Docker CLI's would. Pulls use the credentials of
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
        tls: Option<&TlsFiles>,
        credentials: CredentialStore,
    ) -> Result<Self, EngineError> {
        let version = bollard::API_DEFAULT_VERSION;
        let docker = match (endpoint_kind(endpoint), tls) {
            (Some(Endpoint::Unix), _) => {
                Docker::connect_with_unix(endpoint, API_TIMEOUT_SECS, version)
            }
            (Some(Endpoint::Tcp), Some(tls)) => mutual_tls(endpoint, tls, version),
            (Some(Endpoint::Tcp), None) => {
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
}

/// A Docker client for `tcp://host:port` over mutual TLS: the fleet's CA is the only one trusted
/// and the client certificate is presented; connections are kept and reused, without Nagle's
/// delay. (bollard's own TLS transport opens a connection per request with Nagle on: the
/// request's last segment then waits for the engine's delayed ACK, 40 ms a call.)
fn mutual_tls(
    endpoint: &str,
    tls: &TlsFiles,
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

pub(super) async fn ping(engine: &DockerEngine) -> Result<(), EngineError> {
    engine.docker.ping().await.map(|_| ()).map_err(map_err)
}

pub(super) async fn info(engine: &DockerEngine) -> Result<EngineInfo, EngineError> {
    let info = engine.docker.info().await.map_err(map_err)?;
    let images = engine
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
