//! What the fleet refuses about its engines, before (or instead of) asking one: an id naming
//! no engine of the fleet (404, as a missing session), an engine down, draining or without room
//! (503s of an outage the health checks already reported), no engine answering the health
//! check. Defined here, in the layer that raises them; a call that goes on into a cell's
//! sessions fails with their [`SessionError`] as well. The texts are what a client is told.

use crate::engine::EngineError;
use crate::sessions::SessionError;

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The id's engine prefix names no engine of the fleet: for a client, no such session.
    #[error("Session not found or already closed")]
    UnknownEngine,
    /// The engine holding the session (or snapshot) is marked down.
    #[error("engine {0}, which holds it, is down; retry later")]
    EngineDown(String),
    /// The engine holding the snapshot (or the session to fork) takes no new sessions.
    #[error("engine {0}, which holds it, is draining: it takes no new sessions")]
    EngineDraining(String),
    /// No engine of the fleet can take a new session: the reason for each.
    #[error("{0}")]
    NoEngine(String),
    /// The engine does not answer its ping (the health check), or no engine of a fleet is up.
    #[error("Docker client is not responding")]
    EngineNotResponding(#[source] EngineError),
    #[error(transparent)]
    Session(#[from] SessionError),
}
