//! How the fleet reaches an engine its file lists: the seam in-process tests put fake engines
//! behind ([`Connector`]), and Docker's client for the service ([`DockerConnector`]).

use std::sync::Arc;

use crate::config::EngineSpec;
use crate::engine::credentials::CredentialStore;
use crate::engine::docker::DockerEngine;
use crate::engine::{ContainerEngine, EngineError};

/// Opens a client of one engine. The fleet calls it when an engine joins and again after each
/// outage (a restarted engine gets fresh sockets); it meters and scopes what it gets itself.
#[async_trait::async_trait]
pub trait Connector: Send + Sync {
    /// A client of the engine `spec` names; an error when it cannot be reached (tried again at
    /// the next health check).
    async fn connect(&self, spec: &EngineSpec) -> Result<Arc<dyn ContainerEngine>, EngineError>;
}

/// Docker engines over their `unix://` socket or `tcp://` with mutual TLS, pulling with the
/// service's registry credentials.
pub struct DockerConnector {
    credentials: CredentialStore,
}

impl DockerConnector {
    pub fn new(credentials: CredentialStore) -> Self {
        Self { credentials }
    }
}

#[async_trait::async_trait]
impl Connector for DockerConnector {
    async fn connect(&self, spec: &EngineSpec) -> Result<Arc<dyn ContainerEngine>, EngineError> {
        let docker = DockerEngine::connect_endpoint(
            &spec.endpoint,
            spec.tls.as_ref(),
            self.credentials.clone(),
        )
        .await?;
        Ok(Arc::new(docker))
    }
}
