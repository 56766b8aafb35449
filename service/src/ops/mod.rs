//! Operations on a session: the way a front door (the REST routes, MCP, E2B) reaches one.
//!
//! Each operation is a type ([`Op`]) that says what it needs before it runs: its admission
//! class, whether it takes the session's lock, and whether the session must be running (all
//! but those on its life: a pause, a deadline, a close).
//! [`Ops::apply`] finds the engine holding the session, takes the slot, the lock and the
//! running check once, in that order, and hands the operation the [`Reached`] session, whose
//! workspace does not check again. A door decodes its request into an operation, applies it and
//! renders the answer or the [`ApiError`] its own way: no door restates an admission class, a
//! lock order or a running check, and none calls another door.
//!
//! The background processes' operations are here ([`processes`]), the runs of commands, whole
//! or streamed ([`runs`]), the one-shot seed ([`seed`]), the agent's file tools (the reference's
//! `fs/*`) and the data plane's fs ops on paths anywhere ([`fs`]), its raw files and watches
//! ([`files`]), a port's connections ([`ports`]), the session's life: E2B's `connect`, a pause, a
//! deadline, a close ([`lifecycle`]), and its snapshots and forks ([`snapshots`]). Where a door
//! still reaches the domain past them is pinned in `control-plane/tests/layering.rs`.

pub mod deployment;
pub mod files;
pub mod fs;
pub mod inventory;
pub mod lifecycle;
pub mod ports;
pub mod processes;
pub mod runs;
pub mod seed;
pub mod snapshots;

use std::future::Future;
use std::sync::Arc;

use crate::admission::{Admission, Slot};
use crate::config::Config;
use crate::coordination::lock::LockGuard;
use crate::engine::ContainerInfo;
use crate::error::ApiError;
use crate::fleet::{Cell, Fleet};
use crate::ids::SessionId;
use crate::sessions::Sessions;
use crate::sessions::Workspace;

/// The admission slot an operation takes before anything else (see [`crate::admission`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// None: the operation holds little memory (runs, processes, reads of state).
    Free,
    Create,
    Seed,
    /// One of the session's fs slots, then one of the total.
    Fs,
}

/// How an operation stands to the session's other work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Beside whatever runs in it (reads, background processes): no lock; the session made to
    /// run (a stopped one is restarted under its lock).
    Beside,
    /// In the session's order (writes): its lock, held until the operation's answer is done
    /// with, then the session made to run.
    Ordered,
    /// Its lock, and the session as it stands (stopped or paused): what acts on its life (a
    /// pause, a deadline, a stop) and must not thaw it first.
    Held,
    /// A removal's lock, which does not wait behind a busy session (see
    /// [`Sessions::lock_to_remove`]): taken if free within a moment, else the removal goes
    /// ahead without it.
    Removal,
}

/// One use case on a session.
pub trait Op: Send {
    type Output: Send;
    const ADMIT: Admit;
    const ACCESS: Access;
    /// The operation, on its session found running (and locked, and admitted, as declared).
    fn apply(self, at: Reached) -> impl Future<Output = Result<Self::Output, ApiError>> + Send;

    /// An answer the request and the settings alone give, before the slot, the lock and the
    /// running check (a body declared over a limit is refused without waiting for a busy
    /// session).
    fn answer_early(&self, _config: &Config) -> Option<Self::Output> {
        None
    }
}

/// A session as an operation gets it: the engine's stack holding it, its lock and slot if the
/// operation takes them (released when this is dropped, or kept by a streamed answer through
/// [`Reached::into_hold`]).
pub struct Reached {
    pub id: SessionId,
    pub sessions: Arc<Sessions>,
    /// The engine holding it (a fleet's cell; the single engine's otherwise).
    cell: Arc<Cell>,
    /// What the running check found, before it thawed or restarted the session (an
    /// [`Access::Ordered`] operation's).
    pub found: Option<ContainerInfo>,
    held: Option<LockGuard>,
    slot: Option<Slot>,
}

/// What a streamed answer keeps until it ends: the lock and the slot of its operation.
pub struct Hold {
    _held: Option<LockGuard>,
    _slot: Option<Slot>,
}

/// An answer with what its operation holds (its slot, its lock) until the door has sent it (a
/// download streamed).
pub struct Held<T> {
    pub answer: T,
    pub hold: Hold,
}

impl Reached {
    /// The session's workspace, found running for this operation: no second check.
    pub fn workspace(&self) -> Workspace<'_> {
        self.sessions.workspace(&self.id).checked()
    }

    /// The name of the engine holding it.
    pub fn engine(&self) -> String {
        self.cell.name()
    }

    /// The lock and slot, for an answer that outlives [`Op::apply`].
    pub fn into_hold(self) -> Hold {
        Hold {
            _held: self.held,
            _slot: self.slot,
        }
    }
}

/// The door to every session of the fleet.
#[derive(Clone)]
pub struct Ops {
    fleet: Arc<Fleet>,
    admission: Arc<Admission>,
    ports: Arc<ports::PortStreams>,
}

impl Ops {
    pub fn new(
        fleet: Arc<Fleet>,
        admission: Arc<Admission>,
        ports: Arc<ports::PortStreams>,
    ) -> Self {
        Self {
            fleet,
            admission,
            ports,
        }
    }

    /// The fleet, for what is not an operation on one session yet (creates, MCP's fs calls).
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// The admission slots, for the same.
    pub fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// Every session's connections to its ports.
    pub fn ports(&self) -> &Arc<ports::PortStreams> {
        &self.ports
    }

    /// Session `id` as the listing shows it, without making it run.
    pub async fn info(&self, id: &SessionId) -> Result<crate::api::SessionInfo, ApiError> {
        let cell = self.fleet.cell_of(id)?;
        Ok(cell.sessions().info(id, &cell.name()).await?.info)
    }

    /// Session `id`'s sampled CPU, memory and disk between `start` and `end` (Unix seconds),
    /// without making it run.
    pub async fn metrics(
        &self,
        id: &SessionId,
        start: Option<i64>,
        end: Option<i64>,
    ) -> Result<Vec<crate::api::MetricsSample>, ApiError> {
        Ok(self.fleet.at(id)?.metrics(id, start, end).await?)
    }

    /// Whether session `id` exists (404 if not), without making it run.
    pub async fn exists(&self, id: &SessionId) -> Result<(), ApiError> {
        let cell = self.fleet.cell_of(id)?;
        cell.sessions().info(id, &cell.name()).await?;
        Ok(())
    }

    /// The session whose engine id starts with `short` (a preview host's), from a listing of
    /// every engine's sessions; 404 for none or more than one.
    pub async fn resolve_short(&self, short: &str) -> Result<SessionId, ApiError> {
        let listed = self.fleet.inventory().await?;
        let mut found = listed
            .iter()
            .filter_map(|l| SessionId::parse(&l.info.session_id).ok())
            .filter(|id| id.raw().starts_with(short));
        match (found.next(), found.next()) {
            (Some(id), None) => Ok(id),
            _ => Err(ApiError::NotFound),
        }
    }

    /// A connection to `port` inside session `id` (see [`ports::OpenPort`]).
    pub async fn open_port(
        &self,
        id: &SessionId,
        port: u16,
    ) -> Result<ports::Connection, ApiError> {
        let streams = self.ports.clone();
        self.apply(id, ports::OpenPort { port, streams }).await
    }

    /// A connection to the session's code interpreter ([`ports::CODE_INTERPRETER_PORT`]),
    /// waiting up to [`ports::CODE_INTERPRETER_START`] for it to listen; a session whose image
    /// starts none is a conflict that says so.
    pub async fn open_code_interpreter(
        &self,
        id: &SessionId,
    ) -> Result<ports::Connection, ApiError> {
        let deadline = tokio::time::Instant::now() + ports::CODE_INTERPRETER_START;
        loop {
            match self.open_port(id, ports::CODE_INTERPRETER_PORT).await {
                Err(ApiError::PortClosed(_)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(ApiError::PortClosed(_)) => {
                    return Err(ApiError::Conflict(format!(
                        "this session runs no code interpreter: nothing listens on port {} in its \
                         sandbox (create it from an image that starts one, such as {})",
                        ports::CODE_INTERPRETER_PORT,
                        crate::config::DEFAULT_CODE_INTERPRETER_IMAGE
                    )));
                }
                other => return other,
            }
        }
    }

    /// Applies `op` to session `id`: its engine (404 for one not in the fleet, 503 while it is
    /// down), then its admission slot, its lock, the running check, once each.
    pub async fn apply<O: Op>(&self, id: &SessionId, op: O) -> Result<O::Output, ApiError> {
        if let Some(answer) = op.answer_early(self.fleet.config()) {
            return Ok(answer);
        }
        let at = self.reach(id, O::ADMIT, O::ACCESS).await?;
        op.apply(at).await
    }

    /// [`Ops::apply`], where a paused session stays paused when `keep_paused` (envd's view: a
    /// paused sandbox is not running until `connect` resumes it): refused as paused
    /// ([`ApiError::Paused`]), not thawed.
    pub async fn apply_keeping_paused<O: Op>(
        &self,
        id: &SessionId,
        op: O,
        keep_paused: bool,
    ) -> Result<O::Output, ApiError> {
        crate::sessions::keep_paused_if(keep_paused, self.apply(id, op)).await
    }

    async fn reach(
        &self,
        id: &SessionId,
        admit: Admit,
        access: Access,
    ) -> Result<Reached, ApiError> {
        let cell = self.fleet.cell_of(id)?;
        let sessions = cell.sessions().clone();
        let slot = match admit {
            Admit::Free => None,
            Admit::Create => Some(self.admission.create().await?),
            Admit::Seed => Some(self.admission.seed().await?),
            Admit::Fs => Some(self.admission.fs(id).await?),
        };
        let (held, found) = match access {
            Access::Beside => {
                sessions.running_unlocked(id).await?;
                (None, None)
            }
            Access::Ordered => {
                let held = sessions.lock(id).await?;
                let found = sessions.ensure_running(id).await?;
                (Some(held), Some(found))
            }
            Access::Held => (Some(sessions.lock(id).await?), None),
            Access::Removal => (sessions.lock_to_remove(id).await?, None),
        };
        Ok(Reached {
            id: id.clone(),
            sessions,
            cell,
            found,
            held,
            slot,
        })
    }
}
