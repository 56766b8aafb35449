//! What can go wrong building a warm-pool member or applying a request to a claimed one. None
//! of it reaches a client: a failed build is logged and counted (and retried by a later
//! round), a failed claim removes the member and the create goes cold. So there is no HTTP
//! mapping for it; the texts are the log's.

use crate::coordination::lock::LockError;
use crate::egress::EgressError;
use crate::engine::EngineError;
use crate::sandbox::{SessionError, ValidationError};
use crate::snapshots::SnapshotError;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A claimed member was expected to have a gateway and has none.
    #[error("the pool member has no egress gateway")]
    MemberWithoutGateway,
    /// A member changed name while it was being made ready.
    #[error("member renamed under us")]
    MemberRenamed,
    /// A build stuck on its engine, given up after this many seconds.
    #[error("a member's build took over {0} s")]
    BuildTimedOut(i64),
    /// The sandbox build itself (the factory's).
    #[error(transparent)]
    Build(#[from] SessionError),
    #[error(transparent)]
    Validation(#[from] ValidationError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Egress(#[from] EgressError),
}
