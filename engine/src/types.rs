//! The engine's own types: what is asked of it (specs) and what it answers (infos, streams).
//! Never bollard's models: the code above the seam sees only these.

use std::collections::HashMap;

use bytes::Bytes;
use futures::stream::BoxStream;
use sandbox_common::archive::Part;

use crate::{EngineError, MANAGED_LABEL};

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
    /// Named volumes (name, path) mounted read-only, without Docker's copy either: what many
    /// containers share and none may change (the helper's binary).
    pub read_only_volumes: Vec<(String, String)>,
    /// Host directories (host path, path) bound without the mounts under them (non-recursive):
    /// what the service's own workers read and write by path, never a sandbox.
    pub host_dirs: Vec<(String, String)>,
    /// `json-file` log options (`max-size`, `max-file`): what a container prints cannot fill
    /// the host's disk. Empty = the daemon's defaults.
    pub log_options: Vec<(String, String)>,
    /// Removed by the engine once it exits (a throwaway the service may not live to remove: a
    /// runtime probe's).
    pub auto_remove: bool,
    /// A tar archive extracted at `/` before the container starts (none when empty): the
    /// workspace skeleton, with ownership carried by the entries (no `chown` in the container,
    /// which gVisor forbids). In parts sent one after the other, whose concatenation is the
    /// archive: a part many containers share is sent from its one buffer, or read from its one
    /// private file as it is sent (the helper binary), and only a container's own part (its
    /// environment file) is built per container.
    pub skeleton: Vec<Part>,
}

impl ContainerSpec {
    /// A spec of `image` with nothing else set, for tests to fill in.
    #[cfg(any(test, feature = "test-util"))]
    pub fn for_tests(image: &str) -> Self {
        Self {
            name: None,
            image: image.into(),
            entrypoint: None,
            cmd: None,
            env: Vec::new(),
            labels: HashMap::new(),
            user: None,
            cap_add: Vec::new(),
            sysctls: Vec::new(),
            init: false,
            runtime: "runc".into(),
            memory_bytes: None,
            nano_cpus: None,
            pids_limit: 0,
            network: NetworkAttach::None,
            volumes: Vec::new(),
            named_volumes: Vec::new(),
            read_only_volumes: Vec::new(),
            host_dirs: Vec::new(),
            log_options: Vec::new(),
            auto_remove: false,
            skeleton: Vec::new(),
        }
    }

    /// The skeleton's parts as one archive, read whole (`Ok(None)` without a skeleton): for the
    /// fake and tests; the engine streams the parts.
    pub fn skeleton_archive(&self) -> std::io::Result<Option<Bytes>> {
        if self.skeleton.is_empty() {
            return Ok(None);
        }
        sandbox_common::archive::concat(&self.skeleton).map(Some)
    }
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
    /// Its volumes as (path in the container, volume name), anonymous ones included, from an
    /// inspect only.
    pub volumes: Vec<(String, String)>,
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

/// A container's resource counters at one moment ([`ContainerEngine::stats`](crate::ContainerEngine::stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContainerStats {
    /// CPU time used since the container started, in nanoseconds (user + system).
    pub cpu_total_ns: u64,
    /// CPUs the host offers the container (its limit, if any, is the caller's to apply).
    pub online_cpus: u32,
    /// Memory charged to the container, in bytes, page cache included.
    pub mem_usage: u64,
    /// The reclaimable page cache within `mem_usage` (inactive file pages).
    pub mem_cache: u64,
    /// Its memory limit; the host's memory when it has none.
    pub mem_limit: u64,
}

/// An image made from a container by [`ContainerEngine::commit`](crate::ContainerEngine::commit). Everything the image's config
/// says is given here: the container's own config is not carried over into it (its environment
/// holds the egress settings), but Docker merges the container's environment into the image's,
/// so every name of it must be given a value here. Docker 20.10 also keeps the container's own
/// config beside it, as the image's `container_config` (environment, labels, command as
/// created): nothing a snapshot must not keep may be in a container's config.
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
