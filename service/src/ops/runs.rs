//! Commands run on a session (`POST /session/{id}/`, MCP's `run`), in its order: under its
//! lock, the session found running once, answered whole or streamed as the commands print.

use std::sync::Arc;

use super::{Access, Admit, Op, Reached};
use crate::api::{RunRequest, RunResponse, RunStreamLine};
use crate::error::ApiError;
use crate::processes;
/// The lines of a streamed run, as [`StreamRun`] answers them.
pub use crate::processes::RunLines;
use crate::sessions::check_run;

/// A batch of commands, answered when the last one ends.
pub struct Run(RunRequest);

impl Run {
    /// The request's values checked before anything waits for the session (422/400).
    pub fn new(req: RunRequest) -> Result<Self, ApiError> {
        check_run(&req)?;
        Ok(Self(req))
    }
}

/// A batch's answer, and the runtime's warning about the session's image when a command failed
/// and the probe found commands failing in that image.
pub struct Ran {
    pub response: RunResponse,
    pub warning: Option<String>,
}

impl Op for Run {
    type Output = Ran;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Ordered;

    async fn apply(self, at: Reached) -> Result<Ran, ApiError> {
        let spec = at.sessions.run_spec(&self.0);
        let response = at.sessions.run(&at.id, spec.as_ref()).await?;
        let failed = response.results.iter().any(|r| r.exit_code != 0);
        // The output stays the commands' own; the warning travels beside it.
        let warning = match failed {
            true => at.sessions.runtime_warning(&at.id).await,
            false => None,
        };
        Ok(Ran { response, warning })
    }
}

/// A batch of commands streamed as they print and end (see [`processes::stream_run`]); the lock
/// is held until the batch ends or the receiver is dropped, which cancels it.
pub struct StreamRun(RunRequest);

impl StreamRun {
    /// The request's values checked before anything waits for the session (422/400).
    pub fn new(req: RunRequest) -> Result<Self, ApiError> {
        check_run(&req)?;
        Ok(Self(req))
    }
}

/// A streamed batch: its lines, and the runtime's warning about the session's image (said up
/// front, the results being still to come).
pub struct Streaming {
    pub lines: RunLines,
    pub warning: Option<String>,
}

impl Op for StreamRun {
    type Output = Streaming;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Ordered;

    async fn apply(self, at: Reached) -> Result<Streaming, ApiError> {
        let warning = at.sessions.runtime_warning(&at.id).await;
        let lines = match at.sessions.run_spec(&self.0) {
            Some(spec) => {
                let heartbeat = at.sessions.config().sessions.stream_heartbeat;
                let (sessions, id) = (Arc::clone(&at.sessions), at.id.clone());
                processes::stream_run(sessions, id, spec, at.into_hold(), heartbeat)
            }
            None => {
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                let _ = tx.try_send(Ok(RunStreamLine::Done {
                    results: Vec::new(),
                }));
                rx
            }
        };
        Ok(Streaming { lines, warning })
    }
}
