//! Commands on a session, and the [`Workspace`] handle the operations inside one (fs ops, a
//! seed, background processes) go through.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::api::{RunRequest, RunResponse, RunResult};
use crate::config::Config;
use crate::coordination::lock::LockGuard;
use crate::engine::ContainerEngine;
use crate::layout;
use crate::runtime::{HelperError, RunEvent, RunSpec, SessionRuntime};
use crate::telemetry::metrics::{Metrics, observe_duration};
use sandbox_protocol::message::{ProcList, ProcRequest};

use super::{MAX_TIMEOUT_SECS, SessionError, SessionId, Sessions, ValidationError};

/// What an operation inside session `id` reaches: its helper's channel (and the engine, for
/// what predates the helper), the settings, and the metrics it records. Made by
/// [`Sessions::workspace`]; the operation makes sure the session runs first
/// ([`Workspace::beside`], [`Workspace::ordered`]) or its caller did.
pub struct Workspace<'a> {
    sessions: &'a Sessions,
    pub id: &'a SessionId,
    pub runtime: &'a dyn SessionRuntime,
    pub engine: &'a dyn ContainerEngine,
    pub config: &'a Config,
    pub metrics: &'a Metrics,
    /// The session was found running for this operation already (`crate::ops`): the checks
    /// below are not made again, each an inspect.
    checked: bool,
}

impl Workspace<'_> {
    /// Beside whatever runs in the session (reads, processes): see
    /// [`Sessions::running_unlocked`].
    pub async fn beside(&self) -> Result<(), SessionError> {
        if self.checked {
            return Ok(());
        }
        self.sessions.running_unlocked(self.id).await
    }

    /// This handle for an operation whose session was just found running (see
    /// [`Workspace::beside`]).
    pub fn checked(self) -> Self {
        Self {
            checked: true,
            ..self
        }
    }

    /// In the session's order (writes): its lock, held until the guard drops, and the session
    /// running.
    pub async fn ordered(&self) -> Result<LockGuard, SessionError> {
        let held = self.sessions.lock(self.id).await?;
        self.sessions.started(self.id).await?;
        Ok(held)
    }
}

/// A run request's values, before anything waits for its session: a command with a NUL (which
/// no shell can be given), a timeout past [`MAX_TIMEOUT_SECS`].
pub fn check_run(req: &RunRequest) -> Result<(), ValidationError> {
    if let Some(bad) = req.commands.iter().find(|c| c.contains('\0')) {
        return Err(ValidationError::NulInCommand(crate::text::shown(
            &bad.replace('\0', "\\0"),
        )));
    }
    if req.timeout.is_some_and(|secs| secs > MAX_TIMEOUT_SECS) {
        return Err(ValidationError::TimeoutTooLong);
    }
    Ok(())
}

impl Sessions {
    /// The handle of the operations inside session `id`.
    pub fn workspace<'a>(&'a self, id: &'a SessionId) -> Workspace<'a> {
        Workspace {
            sessions: self,
            id,
            runtime: &*self.runtime,
            engine: self.engine(),
            config: self.config(),
            metrics: &self.metrics,
            checked: false,
        }
    }

    /// Runs the commands in order through the session's helper, the session found running and
    /// its lock held by the caller (`crate::ops`); `spec` from [`Self::run_spec`], `None` for
    /// nothing to run. A timed-out command ends the request: it and everything it started are
    /// killed, the rest are skipped.
    pub async fn run(
        &self,
        id: &SessionId,
        spec: Option<&RunSpec>,
    ) -> Result<RunResponse, SessionError> {
        let Some(spec) = spec else {
            return Ok(RunResponse {
                results: Vec::new(),
            });
        };
        let started = std::time::Instant::now();
        let ran = self.runtime.run(id, spec).await;
        observe_duration(&self.metrics.sessions.command_batches, started.elapsed());
        let results = ran?;
        self.metrics.sessions.commands.inc_by(results.len() as u64);
        Ok(RunResponse { results })
    }

    /// What the helper is asked to run for `req` (checked by [`check_run`]), with the
    /// deployment's timeout and output caps; `None` when there is nothing to run.
    pub fn run_spec(&self, req: &RunRequest) -> Option<RunSpec> {
        if req.commands.is_empty() {
            return None;
        }
        let sessions = &self.config().sessions;
        let timeout = match req.timeout {
            Some(0) => None,
            Some(secs) => Some(Duration::from_secs(secs)),
            None => sessions.command_timeout,
        };
        Some(RunSpec {
            commands: req.commands.clone(),
            fail_fast: req.fail_fast,
            timeout,
            output_cap: sessions.output_max_bytes,
            run_output_cap: sessions.run_output_max_bytes,
            workdir: layout::REPO.to_string(),
            env: Vec::new(),
        })
    }

    /// Runs `spec` (from [`Self::run_spec`], under the lock the caller holds), reporting output
    /// and each command's end on `events` as they happen; counted as [`Self::run`] is. Dropping
    /// the future cancels the batch.
    pub async fn run_streaming(
        &self,
        id: &SessionId,
        spec: &RunSpec,
        events: mpsc::Sender<RunEvent>,
    ) -> Result<Vec<RunResult>, HelperError> {
        self.metrics.processes.streamed_runs.inc();
        let started = std::time::Instant::now();
        let ran = self.runtime.run_streaming(id, spec, Some(events)).await;
        observe_duration(&self.metrics.sessions.command_batches, started.elapsed());
        if let Ok(results) = &ran {
            self.metrics.sessions.commands.inc_by(results.len() as u64);
        }
        ran
    }

    /// Background processes running in session `id` of the engine's listing (for the reaper,
    /// which must not take a busy job for idle).
    pub async fn live_processes(&self, id: &str) -> Result<usize, SessionError> {
        let list: ProcList = self
            .runtime
            .process(id, ProcRequest::List, None)
            .await?
            .parse()?;
        Ok(list.processes.iter().filter(|p| p.running).count())
    }
}
