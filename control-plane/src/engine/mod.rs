//! The one seam between the control plane and a container engine.
//!
//! Handlers and session logic see only [`ContainerEngine`] and the domain types here, never
//! bollard's models, so they are tested in-process against [`fake::FakeEngine`] and a Kubernetes
//! backend could be added without touching them. [`docker::DockerEngine`] is the only module that
//! talks to Docker.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;

pub mod credentials;
pub mod docker;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod reference;
pub mod scoped;

/// Label carried by every container the service creates; sessions are found again through it, so
/// a restarted control plane needs no database.
pub const MANAGED_LABEL: &str = "daiv.sandbox.managed";
/// What a managed container is: [`ROLE_SANDBOX`] or the egress sidecar.
pub const ROLE_LABEL: &str = "daiv.sandbox.role";
pub const ROLE_SANDBOX: &str = "sandbox";
pub const ROLE_EGRESS_GATEWAY: &str = "egress-gateway";
pub const ROLE_EGRESS_NETWORK: &str = "egress-network";
/// The deployment (`DAIV_SANDBOX_DEPLOYMENT`) that created a container or network.
pub const DEPLOYMENT_LABEL: &str = "daiv.sandbox.deployment";
/// Base image the session was asked for (diagnostics and the reaper's logs).
pub const IMAGE_LABEL: &str = "daiv.sandbox.image";
/// The memory limit (bytes) a sandbox was created with, when it has one: what a fleet's engine
/// counts against its `memory_bytes` without an inspect per session.
pub const MEMORY_LABEL: &str = "daiv.sandbox.memory";
/// Token shared by the three parts of an egress session (sandbox, gateway, internal network), so
/// each can be found from the others and orphans can be swept.
pub const EGRESS_LABEL: &str = "daiv.sandbox.egress";
/// `uid:gid` of the sandbox's helper, on sandboxes whose helper has a uid of its own (see
/// `sandbox_helper::identity`); its channel is opened as root with this and
/// [`SANDBOX_USER_LABEL`]. Sandboxes without it (created by earlier versions) run their helper as
/// the sandbox user.
pub const HELPER_USER_LABEL: &str = "daiv.sandbox.helper-user";
/// `uid:gid` commands run as in the sandbox.
pub const SANDBOX_USER_LABEL: &str = "daiv.sandbox.sandbox-user";
/// On a snapshot's Docker objects: the snapshot id; on a session made from a snapshot: the
/// snapshot it was made from (see [`crate::snapshots`]).
pub const SNAPSHOT_LABEL: &str = "daiv.sandbox.snapshot";
/// On a session whose workspace is a copy-on-write overlay over a snapshot, and on the overlay's
/// volumes: the token naming those volumes, so they go with the session.
pub const WORKSPACE_LABEL: &str = "daiv.sandbox.workspace";
pub const ROLE_SNAPSHOT: &str = "snapshot";
pub const ROLE_SNAPSHOT_DATA: &str = "snapshot-data";
pub const ROLE_WORKSPACE: &str = "workspace";
/// On a warm-pool member: which pool (`isolated` or `egress`) it was made for. Labels cannot
/// change after create, so whether a member was claimed is told by its name (see
/// [`crate::pool`]).
pub const POOL_LABEL: &str = "daiv.sandbox.pool";
/// On a warm-pool member: a hash of everything its spec was built from (image, runtime, user,
/// limits, helper, egress settings); a member whose hash is not the current one is replaced.
pub const POOL_SPEC_LABEL: &str = "daiv.sandbox.pool.spec";

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("not found")]
    NotFound,
    #[error("conflict: {0}")]
    Conflict(String),
    /// The image is absent locally and could not be pulled: `failure` says why in our words,
    /// `reason` in the engine's (for the log only).
    #[error("image {image:?} is not available ({failure:?}): {reason}")]
    ImageUnavailable {
        image: String,
        failure: PullFailure,
        reason: String,
    },
    /// The request was refused by the engine (bad parameters): the caller's fault.
    #[error("{0}")]
    Rejected(String),
    /// The engine did not answer or failed: retryable infrastructure trouble.
    #[error("container engine error: {0}")]
    Unavailable(String),
}

/// Why a pull failed, as far as a client may know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullFailure {
    /// The registry refused access (401/403): no credentials, or not valid ones.
    Denied,
    /// Docker Hub's answer for both a missing repository and a private one without access.
    DeniedOrMissing,
    /// The registry does not have the repository, tag or digest.
    Missing,
    InvalidReference,
    /// The registry did not answer (or not as a registry).
    Unreachable,
}

impl PullFailure {
    /// In our words, after "it is not present locally, and".
    pub fn describe(self) -> &'static str {
        match self {
            PullFailure::Denied => "the registry refused access for lack of valid credentials",
            PullFailure::DeniedOrMissing => {
                "the registry does not have it or refused access for lack of valid credentials"
            }
            PullFailure::Missing => "the registry does not have it",
            PullFailure::InvalidReference => "the image reference is not valid",
            PullFailure::Unreachable => "the registry could not be reached",
        }
    }
}

impl EngineError {
    /// What a client may be told. The daemon's own messages stay in the log: they name host
    /// storage paths, registries and internal ids (`Display` keeps them, for the log).
    pub fn public(&self) -> String {
        match self {
            EngineError::NotFound => "not found".to_string(),
            EngineError::Conflict(_) => "the container engine reported a conflict".to_string(),
            EngineError::ImageUnavailable {
                image,
                failure: PullFailure::InvalidReference,
                ..
            } => format!("image {image:?} is not available: the image reference is not valid"),
            EngineError::ImageUnavailable { image, failure, .. } => format!(
                "image {image:?} is not available: it is not present locally, and {}",
                failure.describe()
            ),
            EngineError::Rejected(_) => {
                "the container engine rejected the request's parameters".to_string()
            }
            EngineError::Unavailable(_) => {
                "the container engine is unavailable; retry later".to_string()
            }
        }
    }
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

/// Network attachment of a new container.
#[derive(Debug, Clone, PartialEq)]
pub enum NetworkAttach {
    /// No interface but loopback (`network_mode=none`).
    None,
    /// Attached to the named network only, at a fixed address when given.
    Network {
        name: String,
        ip: Option<std::net::IpAddr>,
    },
}

/// Everything needed to create a container; the engine adds nothing of its own.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    /// The container's name; `None` lets the engine pick one.
    pub name: Option<String>,
    pub image: String,
    /// `None` keeps the image's entrypoint.
    pub entrypoint: Option<Vec<String>>,
    /// `None` keeps the image's command.
    pub cmd: Option<Vec<String>>,
    pub env: Vec<(String, String)>,
    pub labels: HashMap<String, String>,
    /// `uid:gid` the container's processes start as; `None` keeps the image's user.
    pub user: Option<String>,
    /// Capabilities kept (`CAP_` names without the prefix); every other one is dropped.
    pub cap_add: Vec<String>,
    /// Kernel parameters of the container's own namespaces (`net.*`).
    pub sysctls: Vec<(String, String)>,
    /// Docker's init (tini) as PID 1.
    pub init: bool,
    pub runtime: String,
    pub memory_bytes: Option<i64>,
    pub nano_cpus: Option<i64>,
    pub pids_limit: i64,
    pub network: NetworkAttach,
    /// Anonymous volumes mounted at these paths: created with the container, removed with it.
    pub volumes: Vec<String>,
    /// Named volumes (name, path) mounted without Docker's copy of the image's content into
    /// them; their lifecycle is the caller's.
    pub named_volumes: Vec<(String, String)>,
    /// `json-file` log options (`max-size`, `max-file`): what a container prints cannot fill
    /// the host's disk. Empty = the daemon's defaults.
    pub log_options: Vec<(String, String)>,
    /// A tar archive extracted at `/` before the container starts: the workspace skeleton, with
    /// ownership carried by the entries (no `chown` in the container, which gVisor forbids).
    pub skeleton: Option<Bytes>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerStatus {
    Created,
    Running,
    Paused,
    Restarting,
    Exited,
    Dead,
    Other(String),
}

#[derive(Debug, Clone)]
pub struct ContainerInfo {
    pub id: String,
    /// The container's current name, without Docker's leading `/`.
    pub name: String,
    /// The id of the image the container was created from.
    pub image_id: Option<String>,
    pub status: ContainerStatus,
    /// Unix seconds the container was created.
    pub created: Option<i64>,
    pub labels: HashMap<String, String>,
    /// RFC 3339 time the container last stopped, when it did.
    pub finished_at: Option<String>,
    pub memory_bytes: Option<i64>,
    pub nano_cpus: Option<i64>,
    /// The container's environment (`KEY=VALUE`), from an inspect only (the list API has none).
    pub env: Vec<String>,
}

impl ContainerInfo {
    pub fn is_running(&self) -> bool {
        matches!(
            self.status,
            ContainerStatus::Running | ContainerStatus::Restarting
        )
    }

    pub fn is_paused(&self) -> bool {
        self.status == ContainerStatus::Paused
    }

    /// A label's value; an empty one counts as absent. A session made from a snapshot inherits
    /// the snapshot image's labels, where the source's own `daiv.sandbox.*` labels are blanked
    /// (an image keeps every label its container had unless given another value).
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub fn is_managed(&self) -> bool {
        self.labels.get(MANAGED_LABEL).map(String::as_str) == Some("true")
    }
}

/// An image made from a container by [`ContainerEngine::commit`]. Everything the image's config
/// says is given here: the container's own config is not carried over (its environment holds the
/// caller's variables and the egress settings), but Docker merges the container's environment
/// into the image's, so every name of it must be given a value here.
#[derive(Debug, Clone)]
pub struct CommitSpec {
    /// `repository:tag` the image is tagged with.
    pub reference: String,
    pub labels: HashMap<String, String>,
    pub env: Vec<(String, String)>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub user: String,
}

/// A local image.
#[derive(Debug, Clone, Default)]
pub struct ImageInfo {
    pub id: String,
    /// `repository:tag` references; empty for a dangling image.
    pub tags: Vec<String>,
    /// `repository@digest` references (pulled images), for inspected images only.
    pub digests: Vec<String>,
    pub labels: HashMap<String, String>,
    /// Bytes of the image with its parents.
    pub size: i64,
    /// Unix seconds the image was made.
    pub created: Option<i64>,
    /// The image's config environment (`KEY=VALUE`), for inspected images only.
    pub env: Vec<String>,
    /// The image's parent, for a committed image.
    pub parent: Option<String>,
}

/// A named volume of the local driver.
#[derive(Debug, Clone, Default)]
pub struct VolumeSpec {
    pub name: String,
    pub labels: HashMap<String, String>,
    /// Local driver options (`type`, `device`, `o`); empty = a plain directory.
    pub driver_opts: HashMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct VolumeInfo {
    pub name: String,
    /// Where the daemon's host keeps the volume's data (a directory of the engine's host).
    pub mountpoint: String,
    pub labels: HashMap<String, String>,
    /// Unix seconds the volume was created.
    pub created: Option<i64>,
}

/// What an engine offers, for placement.
#[derive(Debug, Clone, Default)]
pub struct EngineInfo {
    /// The OCI runtimes it knows (`runc`, `runsc`, ...).
    pub runtimes: Vec<String>,
    /// The `repository:tag` references of its images.
    pub images: Vec<String>,
}

/// A user-defined bridge network.
#[derive(Debug, Clone)]
pub struct NetworkSpec {
    pub name: String,
    /// No route out: members reach each other only.
    pub internal: bool,
    /// A subnet of our choosing, so members can have fixed addresses that survive restarts.
    pub subnet: Option<String>,
    /// No address of the host on this network (the bridge's `inhibit_ipv4`): members cannot
    /// open connections to the host itself, whatever it listens on. Docker's internal-network
    /// rules filter forwarded traffic only; traffic to the bridge's own address is the host's
    /// INPUT and would be accepted.
    pub no_host_address: bool,
    pub labels: HashMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct NetworkInfo {
    pub id: String,
    pub name: String,
    pub labels: HashMap<String, String>,
    /// Unix seconds the network was created.
    pub created: Option<i64>,
}

/// A process to start in a running container.
#[derive(Debug, Clone)]
pub struct ExecSpec {
    pub cmd: Vec<String>,
    pub user: String,
    pub workdir: Option<String>,
    pub env: Vec<(String, String)>,
}

/// A started process: its merged output as it is produced, and an id to ask for its exit code
/// once the output ends.
pub struct ExecStream {
    pub exec_id: String,
    pub output: BoxStream<'static, Result<Bytes, EngineError>>,
}

/// A started process with its stdin open: the session helper's channel. `output` is its stdout
/// only (stderr is the process's own diagnostics and goes to the service's log); closing the
/// connection (dropping both halves) is how it ends.
pub struct AttachedExec {
    pub output: BoxStream<'static, Result<Bytes, EngineError>>,
    pub input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
}

#[async_trait::async_trait]
pub trait ContainerEngine: Send + Sync + 'static {
    /// Is the engine answering?
    async fn ping(&self) -> Result<(), EngineError>;
    /// Its runtimes and images (a fleet's placement reads them).
    async fn info(&self) -> Result<EngineInfo, EngineError>;
    /// The prefix of the ids of the sessions and snapshots this engine holds in a fleet (see
    /// [`scoped::ScopedEngine`]); `None` for the default engine, whose ids carry none.
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
    async fn inspect_image(&self, reference: &str) -> Result<ImageInfo, EngineError>;
    /// Images (dangling ones too) carrying all of `labels`.
    async fn list_images(&self, labels: &[(&str, &str)]) -> Result<Vec<ImageInfo>, EngineError>;
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
