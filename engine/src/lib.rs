//! The one seam between daiv-sandbox's control plane and a container engine.
//!
//! Handlers and session logic see only [`ContainerEngine`] and the domain types here, never
//! bollard's models, so they are tested in-process against `fake::FakeEngine` (feature
//! `test-util`) and a Kubernetes backend could be added without touching them.
//! [`docker::DockerEngine`] is the only module that talks to Docker.
//!
//! # Layout
//! - this file: the trait; [`labels`], [`error`] and [`types`]: what it speaks in.
//! - [`decorate`]: the one list of the trait's verbs, and [`Decorate`], through which an engine
//!   that wraps another writes only what it changes: [`ScopedEngine`] (a fleet engine's ids and
//!   health, [`scoped`]) and [`MeteredEngine`] (every call counted and timed, [`metered`], with
//!   its metric group [`EngineMetrics`]).
//! - [`docker`]: the Docker adapter, split by area (the daemon and its transport, containers,
//!   exec, images, networks, volumes, and the conversions to and from bollard's models).
//! - [`credentials`]: the registry credentials Docker's pulls use; [`reference`](mod@reference): image
//!   references held against what the engine resolved them to.
//! - `fake` (feature `test-util`): an in-memory engine for in-process tests.
//!
//! Adding a verb: declare it on [`ContainerEngine`], give it its line in [`decorate`]'s list
//! (its metric label, which arguments are container ids, what of its answer a decorator maps),
//! write it in its area's file of [`docker`], and in the fake.

use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;

pub mod credentials;
pub mod decorate;
pub mod docker;
pub mod error;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod labels;
pub mod metered;
pub mod reference;
pub mod scoped;
pub mod types;

pub use decorate::Decorate;
pub use error::{EngineError, PullFailure};
pub use labels::*;
pub use metered::{EngineMetrics, MeteredEngine};
pub use scoped::{Link, ScopedEngine};
pub use types::{
    AttachedExec, CommitSpec, ContainerInfo, ContainerSpec, ContainerStats, ContainerStatus,
    EngineInfo, ExecSpec, ExecStream, ImageInfo, NetworkAttach, NetworkInfo, NetworkSpec,
    VolumeInfo, VolumeSpec,
};

#[async_trait::async_trait]
pub trait ContainerEngine: Send + Sync + 'static {
    /// Is the engine answering?
    async fn ping(&self) -> Result<(), EngineError>;
    /// Its runtimes and images (a fleet's placement reads them).
    async fn info(&self) -> Result<EngineInfo, EngineError>;
    /// The prefix of the ids of the sessions and snapshots this engine holds in a fleet (see
    /// [`ScopedEngine`]); `None` for the default engine, whose ids carry none.
    fn id_prefix(&self) -> Option<&str> {
        None
    }
    /// Makes `image` available locally, pulling it only when absent (with the registry
    /// credentials the engine's client config holds for it, see [`credentials`]). A failed pull
    /// leaves nothing behind. An image the engine holds counts only when `image` is one of its
    /// own tags or digests ([`reference::names_image`]): a name that resolves by id (a prefix
    /// of one) is an invalid reference, never another image. Answers the image as inspected.
    async fn ensure_image(&self, image: &str) -> Result<ImageInfo, EngineError>;
    /// Creates (and seeds the skeleton of) a container without starting it.
    async fn create(&self, spec: &ContainerSpec) -> Result<String, EngineError>;
    async fn start(&self, id: &str) -> Result<(), EngineError>;
    async fn inspect(&self, id: &str) -> Result<ContainerInfo, EngineError>;
    /// The apparent size of the container's writable layer, as the daemon walks it (so a
    /// sparse file counts at its full length: what a commit or an archive of it would write).
    /// `None` when the engine cannot say. A walk of the layer: not for a hot path.
    async fn writable_bytes(&self, id: &str) -> Result<Option<u64>, EngineError> {
        let _ = id;
        Ok(None)
    }
    /// The container's CPU and memory counters now, from its cgroup as the engine reads it
    /// (one call, no second reading: a rate is the caller's, from two samples). `None` when the
    /// engine cannot say (a stopped container, a runtime without statistics).
    async fn stats(&self, id: &str) -> Result<Option<ContainerStats>, EngineError> {
        let _ = id;
        Ok(None)
    }
    async fn stop(&self, id: &str, grace: Duration) -> Result<(), EngineError>;
    /// Removes the container, running or not, with its anonymous volumes.
    async fn remove(&self, id: &str) -> Result<(), EngineError>;
    async fn exec(&self, id: &str, spec: &ExecSpec) -> Result<ExecStream, EngineError>;
    /// Starts a process with stdin attached, for a long-lived framed channel.
    async fn exec_attached(&self, id: &str, spec: &ExecSpec) -> Result<AttachedExec, EngineError>;
    /// `None` while the process still runs.
    async fn exec_exit_code(&self, exec_id: &str) -> Result<Option<i64>, EngineError>;
    /// Extracts a tar stream at `path` inside the container.
    async fn put_archive(
        &self,
        id: &str,
        path: &str,
        tar: BoxStream<'static, Result<Bytes, std::io::Error>>,
    ) -> Result<(), EngineError>;
    /// A tar stream of `path` inside the container: a file, a directory's whole subtree, or a
    /// symlink itself (the last component is not followed). [`EngineError::NotFound`] when the
    /// path does not exist. Streamed so that reading a large file needs no large buffer.
    async fn get_archive(
        &self,
        id: &str,
        path: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, EngineError>>, EngineError>;
    /// Waits until the container's log (stdout or stderr) contains `needle`, up to `timeout`.
    async fn wait_for_log(
        &self,
        id: &str,
        needle: &str,
        timeout: Duration,
    ) -> Result<(), EngineError>;
    /// Renames the container now named `current` to `new`. A compare-and-swap on the name: it
    /// fails ([`EngineError::NotFound`], or [`EngineError::Rejected`] when the container already
    /// has that name) for every caller but one when several rename the same `current` to the
    /// same `new` at once, whichever replica they come from.
    async fn rename(&self, current: &str, new: &str) -> Result<(), EngineError>;
    /// Changes a running container's memory limit (swap: twice as much, as at create) and CPU
    /// quota; `None` leaves one unchanged. A runtime that cannot (gVisor) answers an error.
    async fn update_limits(
        &self,
        id: &str,
        memory_bytes: Option<i64>,
        nano_cpus: Option<i64>,
    ) -> Result<(), EngineError>;
    /// The id the local image `image` resolves to now ([`EngineError::NotFound`] if absent).
    async fn image_id(&self, image: &str) -> Result<String, EngineError>;
    /// Managed containers carrying all of `labels` (`key=value`).
    async fn list(&self, labels: &[(&str, &str)]) -> Result<Vec<ContainerInfo>, EngineError>;
    async fn create_network(&self, spec: &NetworkSpec) -> Result<String, EngineError>;
    async fn remove_network(&self, id_or_name: &str) -> Result<(), EngineError>;
    /// Attaches a created (or running) container to a network, at `ip` when given.
    async fn connect_network(
        &self,
        network: &str,
        container: &str,
        ip: Option<std::net::IpAddr>,
    ) -> Result<(), EngineError>;
    /// Managed networks carrying all of `labels`.
    async fn list_networks(&self, labels: &[(&str, &str)])
    -> Result<Vec<NetworkInfo>, EngineError>;
    /// Freezes every process of the container (the cgroup freezer), memory kept.
    async fn pause(&self, id: &str) -> Result<(), EngineError>;
    async fn unpause(&self, id: &str) -> Result<(), EngineError>;
    /// An image of the container's filesystem changes over its image, without pausing it (the
    /// caller freezes it first when it must be consistent). Returns the image id.
    async fn commit(&self, id: &str, spec: &CommitSpec) -> Result<String, EngineError>;
    /// Gives image `source` (an id or a reference) the further reference `reference`: a
    /// snapshot that commits nothing keeps its base image by it.
    async fn tag_image(&self, source: &str, reference: &str) -> Result<(), EngineError>;
    async fn inspect_image(&self, reference: &str) -> Result<ImageInfo, EngineError>;
    /// Images (dangling ones too) carrying all of `labels`.
    async fn list_images(&self, labels: &[(&str, &str)]) -> Result<Vec<ImageInfo>, EngineError>;
    /// The references (`repository:tag`) in `repository`, whatever their images' labels: a
    /// tag made by [`Self::tag_image`] carries its image's labels, not ours.
    async fn image_tags(&self, repository: &str) -> Result<Vec<String>, EngineError>;
    /// Removes an image reference (and the image once nothing else refers to it).
    /// [`EngineError::Conflict`] while a container uses it.
    async fn remove_image(&self, reference: &str) -> Result<(), EngineError>;
    async fn create_volume(&self, spec: &VolumeSpec) -> Result<VolumeInfo, EngineError>;
    async fn inspect_volume(&self, name: &str) -> Result<VolumeInfo, EngineError>;
    /// Volumes carrying all of `labels`.
    async fn list_volumes(&self, labels: &[(&str, &str)]) -> Result<Vec<VolumeInfo>, EngineError>;
    /// [`EngineError::Conflict`] while a container uses it.
    async fn remove_volume(&self, name: &str) -> Result<(), EngineError>;
}

/// The content of the regular file `path` in container `id`, read through an archive (the
/// container may be stopped or paused); `None` when there is no such file. At most `max` bytes
/// are read: a longer file is an error.
pub async fn read_file(
    engine: &dyn ContainerEngine,
    id: &str,
    path: &str,
    max: usize,
) -> Result<Option<Vec<u8>>, EngineError> {
    use futures::TryStreamExt;
    let stream = match engine.get_archive(id, path).await {
        Ok(s) => s,
        Err(EngineError::NotFound) => return Ok(None),
        Err(e) => return Err(e),
    };
    // The tar framing adds headers and padding around the content.
    let limit = max.saturating_add(64 * 1024);
    let tar: Vec<u8> = stream
        .try_fold(Vec::new(), |mut acc, chunk| async move {
            if acc.len() + chunk.len() > limit {
                return Err(EngineError::Rejected(format!("{path} is too large")));
            }
            acc.extend_from_slice(&chunk);
            Ok(acc)
        })
        .await?;
    let bad = |e: std::io::Error| EngineError::Unavailable(format!("archive of {path}: {e}"));
    let mut archive = tar::Archive::new(&tar[..]);
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let mut data = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(&mut entry, max as u64 + 1),
            &mut data,
        )
        .map_err(bad)?;
        if data.len() > max {
            return Err(EngineError::Rejected(format!("{path} is too large")));
        }
        return Ok(Some(data));
    }
    Ok(None)
}
