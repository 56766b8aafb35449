//! [`MeteredEngine`]: counts and times every container-engine call, and its errors by kind.
//!
//! A wrapper at the engine seam rather than counters inside the Docker implementation: every
//! call is covered once, whatever backend sits behind the trait, and the round trips per API
//! operation (DESIGN.md asks us to count them) show up as `engine_call_duration_seconds_count`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::BoxStream;

use super::metrics::{EngineErrorLabels, Metrics, OpLabels, observe_duration};
use crate::engine::{
    CommitSpec, ContainerEngine, ContainerInfo, ContainerSpec, EngineError, ExecSpec, ExecStream,
    ImageInfo, NetworkInfo, NetworkSpec, VolumeInfo, VolumeSpec,
};

pub struct MeteredEngine {
    inner: Arc<dyn ContainerEngine>,
    metrics: Arc<Metrics>,
    /// The engine's name in the fleet, a label of every figure.
    name: String,
}

/// The name of the one engine of a service without a fleet.
pub const DEFAULT_ENGINE: &str = "default";

impl MeteredEngine {
    pub fn new(inner: Arc<dyn ContainerEngine>, metrics: Arc<Metrics>) -> Self {
        Self::named(inner, metrics, DEFAULT_ENGINE)
    }

    /// Counts under the fleet engine `name`.
    pub fn named(inner: Arc<dyn ContainerEngine>, metrics: Arc<Metrics>, name: &str) -> Self {
        Self {
            inner,
            metrics,
            name: name.to_string(),
        }
    }

    fn record<T>(
        &self,
        op: &'static str,
        started: Instant,
        r: Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        tracing::trace!(op, engine = %self.name, elapsed = ?started.elapsed(), ok = r.is_ok(), "engine call done");
        observe_duration(
            &self.metrics.engine_calls.get_or_create(&OpLabels {
                op,
                engine: self.name.clone(),
            }),
            started.elapsed(),
        );
        if let Err(e) = &r {
            self.metrics
                .engine_errors
                .get_or_create(&EngineErrorLabels {
                    op,
                    kind: kind(e),
                    engine: self.name.clone(),
                })
                .inc();
        }
        r
    }
}

/// A stable label for an error kind (never its message, which carries ids and paths).
pub fn kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::NotFound => "not_found",
        EngineError::Conflict(_) => "conflict",
        EngineError::ImageUnavailable { .. } => "image_unavailable",
        EngineError::Rejected(_) => "rejected",
        EngineError::Unavailable(_) => "unavailable",
    }
}

macro_rules! metered {
    ($self:ident, $op:literal, $call:expr) => {{
        let started = Instant::now();
        tracing::trace!(op = $op, engine = %$self.name, "engine call");
        let r = $call.await;
        $self.record($op, started, r)
    }};
}

#[async_trait::async_trait]
impl ContainerEngine for MeteredEngine {
    async fn ping(&self) -> Result<(), EngineError> {
        metered!(self, "ping", self.inner.ping())
    }
    async fn info(&self) -> Result<crate::engine::EngineInfo, EngineError> {
        metered!(self, "info", self.inner.info())
    }
    fn id_prefix(&self) -> Option<&str> {
        self.inner.id_prefix()
    }
    async fn ensure_image(&self, image: &str) -> Result<ImageInfo, EngineError> {
        metered!(self, "ensure_image", self.inner.ensure_image(image))
    }
    async fn create(&self, spec: &ContainerSpec) -> Result<String, EngineError> {
        metered!(self, "create", self.inner.create(spec))
    }
    async fn start(&self, id: &str) -> Result<(), EngineError> {
        metered!(self, "start", self.inner.start(id))
    }
    async fn inspect(&self, id: &str) -> Result<ContainerInfo, EngineError> {
        metered!(self, "inspect", self.inner.inspect(id))
    }
    async fn writable_bytes(&self, id: &str) -> Result<Option<u64>, EngineError> {
        metered!(self, "writable_bytes", self.inner.writable_bytes(id))
    }
    async fn stop(&self, id: &str, grace: Duration) -> Result<(), EngineError> {
        metered!(self, "stop", self.inner.stop(id, grace))
    }
    async fn remove(&self, id: &str) -> Result<(), EngineError> {
        metered!(self, "remove", self.inner.remove(id))
    }
    async fn exec(&self, id: &str, spec: &ExecSpec) -> Result<ExecStream, EngineError> {
        metered!(self, "exec", self.inner.exec(id, spec))
    }
    async fn exec_attached(
        &self,
        id: &str,
        spec: &ExecSpec,
    ) -> Result<crate::engine::AttachedExec, EngineError> {
        metered!(self, "exec_attached", self.inner.exec_attached(id, spec))
    }
    async fn exec_exit_code(&self, exec_id: &str) -> Result<Option<i64>, EngineError> {
        metered!(self, "exec_inspect", self.inner.exec_exit_code(exec_id))
    }
    async fn put_archive(
        &self,
        id: &str,
        path: &str,
        tar: BoxStream<'static, Result<Bytes, std::io::Error>>,
    ) -> Result<(), EngineError> {
        metered!(self, "put_archive", self.inner.put_archive(id, path, tar))
    }
    async fn get_archive(
        &self,
        id: &str,
        path: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, EngineError>>, EngineError> {
        metered!(self, "get_archive", self.inner.get_archive(id, path))
    }
    async fn wait_for_log(
        &self,
        id: &str,
        needle: &str,
        timeout: Duration,
    ) -> Result<(), EngineError> {
        metered!(
            self,
            "wait_for_log",
            self.inner.wait_for_log(id, needle, timeout)
        )
    }
    async fn rename(&self, current: &str, new: &str) -> Result<(), EngineError> {
        metered!(self, "rename", self.inner.rename(current, new))
    }
    async fn update_limits(
        &self,
        id: &str,
        memory_bytes: Option<i64>,
        nano_cpus: Option<i64>,
    ) -> Result<(), EngineError> {
        metered!(
            self,
            "update",
            self.inner.update_limits(id, memory_bytes, nano_cpus)
        )
    }
    async fn image_id(&self, image: &str) -> Result<String, EngineError> {
        metered!(self, "inspect_image", self.inner.image_id(image))
    }
    async fn list(&self, labels: &[(&str, &str)]) -> Result<Vec<ContainerInfo>, EngineError> {
        metered!(self, "list", self.inner.list(labels))
    }
    async fn create_network(&self, spec: &NetworkSpec) -> Result<String, EngineError> {
        metered!(self, "create_network", self.inner.create_network(spec))
    }
    async fn remove_network(&self, id_or_name: &str) -> Result<(), EngineError> {
        metered!(
            self,
            "remove_network",
            self.inner.remove_network(id_or_name)
        )
    }
    async fn connect_network(
        &self,
        network: &str,
        container: &str,
        ip: Option<std::net::IpAddr>,
    ) -> Result<(), EngineError> {
        metered!(
            self,
            "connect_network",
            self.inner.connect_network(network, container, ip)
        )
    }
    async fn list_networks(
        &self,
        labels: &[(&str, &str)],
    ) -> Result<Vec<NetworkInfo>, EngineError> {
        metered!(self, "list_networks", self.inner.list_networks(labels))
    }
    async fn pause(&self, id: &str) -> Result<(), EngineError> {
        metered!(self, "pause", self.inner.pause(id))
    }
    async fn unpause(&self, id: &str) -> Result<(), EngineError> {
        metered!(self, "unpause", self.inner.unpause(id))
    }
    async fn commit(&self, id: &str, spec: &CommitSpec) -> Result<String, EngineError> {
        metered!(self, "commit", self.inner.commit(id, spec))
    }
    async fn inspect_image(&self, reference: &str) -> Result<ImageInfo, EngineError> {
        metered!(self, "inspect_image", self.inner.inspect_image(reference))
    }
    async fn list_images(&self, labels: &[(&str, &str)]) -> Result<Vec<ImageInfo>, EngineError> {
        metered!(self, "list_images", self.inner.list_images(labels))
    }
    async fn remove_image(&self, reference: &str) -> Result<(), EngineError> {
        metered!(self, "remove_image", self.inner.remove_image(reference))
    }
    async fn create_volume(&self, spec: &VolumeSpec) -> Result<VolumeInfo, EngineError> {
        metered!(self, "create_volume", self.inner.create_volume(spec))
    }
    async fn inspect_volume(&self, name: &str) -> Result<VolumeInfo, EngineError> {
        metered!(self, "inspect_volume", self.inner.inspect_volume(name))
    }
    async fn list_volumes(&self, labels: &[(&str, &str)]) -> Result<Vec<VolumeInfo>, EngineError> {
        metered!(self, "list_volumes", self.inner.list_volumes(labels))
    }
    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        metered!(self, "remove_volume", self.inner.remove_volume(name))
    }
}
