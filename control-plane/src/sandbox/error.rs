//! What can go wrong with a session or the sandbox behind it, named by cause: defined where
//! sandboxes are built, the lowest layer that needs it (the pool and the sessions above use it
//! too). The texts are what a client is told; the HTTP status of each is decided in the HTTP
//! layer's `error.rs`, not here.

use super::{MAX_TIMEOUT_SECS, MIN_MEMORY_BYTES};
use crate::coordination::lock::LockError;
use crate::egress::EgressError;
use crate::engine::EngineError;
use crate::runtime::HelperError;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No managed sandbox of this deployment has this id (or it is an unclaimed pool member).
    #[error("Session not found or already closed")]
    NotFound,
    /// The session's lock could not be had: held past the wait, or its backend is down.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// Egress was asked for, but this instance has no egress CA. The text is the reference's:
    /// DAIV looks for "egress proxy" in it to tell its operator what to configure.
    #[error("egress requires the egress proxy, which is not configured on this deployment")]
    EgressNotConfigured,
    /// The session has egress parts, but this instance (a replica without the CA) cannot
    /// manage them.
    #[error("egress is not configured on this instance")]
    EgressUnavailableHere,
    /// A policy refresh for a network-isolated session.
    #[error("session has no egress proxy: a network-isolated session has nothing to refresh")]
    NoEgressProxy,
    /// A claimed warm-pool member was expected to have a gateway and has none.
    #[error("the pool member has no egress gateway")]
    MemberWithoutGateway,
    /// A warm-pool member changed name while it was being made ready.
    #[error("member renamed under us")]
    MemberRenamed,
    #[error("base_image is not a valid image reference: {0:?}")]
    InvalidImage(String),
    #[error(
        "base_image must be a repository reference (name[:tag] or name@digest), not an image id"
    )]
    ImageById,
    /// A snapshot's image given as `base_image` (by its tag or under another name).
    #[error("base_image names a snapshot's image: create from a snapshot with snapshot_id")]
    SnapshotAsImage,
    #[error("memory_bytes must be at least {MIN_MEMORY_BYTES} (6 MiB)")]
    MemoryTooSmall,
    #[error("cpus must be a number between 0.01 and 1024")]
    InvalidCpus,
    /// A caller's environment that breaks [`crate::api::Environment`]'s rule (an MCP tool's
    /// arguments; a request's body is checked as it is read).
    #[error(transparent)]
    InvalidEnvironment(#[from] crate::api::InvalidEnvironment),
    /// The command, shortened and with its NULs shown as `\0`.
    #[error("command contains a NUL byte: {0:?}")]
    NulInCommand(String),
    #[error("timeout must be at most {MAX_TIMEOUT_SECS} seconds (0 = none)")]
    TimeoutTooLong,
    /// A stopped session's container would not start again.
    #[error("session could not be restarted: {}", .0.public())]
    RestartFailed(#[source] EngineError),
    /// The engine does not answer its ping (the health check).
    #[error("Docker client is not responding")]
    EngineNotResponding(#[source] EngineError),
    /// `base_image` and `snapshot_id` name different images.
    #[error("base_image does not match the snapshot's base image {0:?}")]
    SnapshotImageMismatch(String),
    /// Pause (or another operation that needs a running session) on a stopped one.
    #[error("Session is not running")]
    NotRunning,
    #[error("count must be between 1 and {0}")]
    ForkCount(u32),
    /// The fleet's engine holding the session (or snapshot) is marked down.
    #[error("engine {0}, which holds it, is down; retry later")]
    EngineDown(String),
    /// The fleet's engine holding the snapshot (or the session to fork) takes no new sessions.
    #[error("engine {0}, which holds it, is draining: it takes no new sessions")]
    EngineDraining(String),
    /// No engine of the fleet can take a new session: the reason for each.
    #[error("{0}")]
    NoEngine(String),
    #[error(transparent)]
    Snapshot(#[from] crate::snapshots::SnapshotError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Egress(#[from] EgressError),
    #[error(transparent)]
    Helper(#[from] HelperError),
}
