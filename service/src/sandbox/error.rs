//! What can go wrong with a session or the sandbox behind it, once its request's values are
//! accepted: defined where sandboxes are built, the lowest layer that fails this way (the pool
//! and the sessions above use it too). A request's bad values are [`ValidationError`]s, wrapped
//! here where one call can fail both ways; the pool's own failures are `pool::PoolError`, and
//! the engines' (down, draining, full) `fleet::FleetError`. The texts are what a client is
//! told; the HTTP status of each is decided in the HTTP layer's `error.rs`, not here.

use super::ValidationError;
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
    /// The session has egress parts, but this instance (a replica without the CA) cannot
    /// manage them.
    #[error("egress is not configured on this instance")]
    EgressUnavailableHere,
    /// A policy refresh for a network-isolated session.
    #[error("session has no egress proxy: a network-isolated session has nothing to refresh")]
    NoEgressProxy,
    /// A stopped session's container would not start again.
    #[error("session could not be restarted: {}", .0.public())]
    RestartFailed(#[source] EngineError),
    /// Pause (or another operation that needs a running session) on a stopped one.
    #[error("Session is not running")]
    NotRunning,
    /// A paused session reached through a front door that must not thaw it (E2B's envd: only
    /// E2B's `connect` resumes a sandbox); see `sessions::keep_paused`.
    #[error("Session is paused: resume it first")]
    Paused,
    #[error(transparent)]
    Validation(#[from] ValidationError),
    /// No user for a new sandbox (`RUN_UID_RANGE` used up, or the engine's listing failed).
    #[error(transparent)]
    User(#[from] super::UserError),
    #[error(transparent)]
    Snapshot(#[from] crate::snapshots::SnapshotError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Egress(#[from] EgressError),
    #[error(transparent)]
    Helper(#[from] HelperError),
}
