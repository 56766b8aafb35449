//! Sessions: the lifecycle of a session, over the sandboxes the factory and the pool build.
//!
//! A session is a sandbox container of this deployment (see [`crate::sandbox`]); its id is the
//! container id, and all its state lives in the container and its labels, so any replica (or a
//! restarted control plane) can serve any session. [`Sessions::create`] validates a request,
//! takes a warm-pool member when one matches ([`crate::pool`]), else reserves the egress token
//! (egress only) and builds a sandbox cold. The other operations find the session, start it
//! again when it was stopped, run commands through the session runtime, refresh its egress
//! policy and close it. Requests on one session are ordered by its lock ([`Sessions::lock`]),
//! which also records the session's activity for the reaper. Each operation records its own
//! metrics (sessions created and closed, commands and their batches, forks, pauses, snapshots).
//!
//! Ids from outside arrive as [`SessionId`]s, checked once at the edge; the operations take
//! them as they are. Ids the engine handed out (a fork's, the reaper's listing) are its own.
//!
//! Docker round trips: create, see [`crate::sandbox`]; commands and fs ops go over the helper's
//! channel (none); status = inspect (+ start when stopped); close = inspect + stop/remove.
//!
//! # Layout
//! - `lifecycle`: create, close, pause, egress refresh.
//! - `run`: commands, and the [`Workspace`] handle of the operations inside a session.
//! - `fork`: snapshots and forks.
//! - `lock`: the session's lock and its activity.
//! - `record`: what a caller attached to a session (metadata, deadline), kept beside it.
//! - `inventory`: the sessions as the listing shows them.
//! - `samples`: each running session's CPU, memory and disk, sampled.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::coordination::activity::SessionActivity;
use crate::coordination::lock::SessionLocks;
use crate::egress::{Egress, Triad};
use crate::engine::{
    ContainerEngine, ContainerInfo, DEPLOYMENT_LABEL, EngineError, ROLE_LABEL, ROLE_SANDBOX,
};
use crate::pool::Pool;
use crate::runtime::SessionRuntime;
use crate::sandbox::SandboxFactory;
use crate::snapshots::Snapshots;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::runtime_probe::ImageProbes;

mod deadlines;
mod fork;
mod inventory;
mod lifecycle;
mod lock;
mod record;
mod run;
mod samples;

pub use crate::ids::SessionId;
pub use crate::sandbox::{MAX_TIMEOUT_SECS, SessionError, ValidationError};
pub use deadlines::Deadlines;
pub use fork::ForkPlan;
pub use inventory::Listed;
pub use record::{Lifetime, Record, check_timeout};
pub use run::{Workspace, check_run};

/// Longest a force delete waits for a busy session's lock before it removes the session anyway.
pub const FORCE_LOCK_WAIT: Duration = Duration::from_secs(1);

tokio::task_local! {
    /// Set while a front door whose sandboxes are not running while paused calls in (E2B's
    /// envd: there only `connect` resumes a sandbox): a paused session then answers
    /// [`SessionError::Paused`] instead of being thawed.
    static KEEP_PAUSED: ();
}

/// Runs `f` with paused sessions kept paused (see [`KEEP_PAUSED`]).
pub async fn keep_paused<F: std::future::Future>(f: F) -> F::Output {
    KEEP_PAUSED.scope((), f).await
}

/// Whether the running task keeps paused sessions paused: a task it spawns to go on with its
/// work (a process's events, followed) carries it on with [`keep_paused_if`].
pub fn keeping_paused() -> bool {
    KEEP_PAUSED.try_with(|_| ()).is_ok()
}

/// Runs `f` keeping paused sessions paused when `keep` (what [`keeping_paused`] said).
pub async fn keep_paused_if<F: std::future::Future>(keep: bool, f: F) -> F::Output {
    if keep { keep_paused(f).await } else { f.await }
}

pub struct Sessions {
    factory: Arc<SandboxFactory>,
    pool: Arc<Pool>,
    runtime: Arc<dyn SessionRuntime>,
    locks: Arc<dyn SessionLocks>,
    /// Touched by [`Sessions::lock`] at the start and end of every session operation.
    activity: Arc<dyn SessionActivity>,
    metrics: Arc<Metrics>,
    /// This replica's samples of each running session (`GET .../metrics/`).
    samples: samples::Samples,
    /// Under `runsc`: each new session's image probed on its first use, and the warning of a
    /// session whose image was found unsound.
    probes: Option<Arc<ImageProbes>>,
    /// The deadlines its records set, for the reaper's deadline watch.
    deadlines: Arc<Deadlines>,
}

impl Sessions {
    pub fn new(
        factory: Arc<SandboxFactory>,
        pool: Arc<Pool>,
        runtime: Arc<dyn SessionRuntime>,
        locks: Arc<dyn SessionLocks>,
        activity: Arc<dyn SessionActivity>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            factory,
            pool,
            runtime,
            locks,
            activity,
            metrics,
            samples: samples::Samples::default(),
            probes: None,
            deadlines: Arc::default(),
        }
    }

    /// The deadlines its records set (see [`Deadlines`]).
    pub fn deadlines(&self) -> &Arc<Deadlines> {
        &self.deadlines
    }

    /// The service's metrics, for an operation that counts what it does.
    pub fn service_metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// With the probes of the runtime (`None`: no probing, as under `runc`).
    pub fn with_image_probes(mut self, probes: Option<Arc<ImageProbes>>) -> Self {
        self.probes = probes;
        self
    }

    /// The runtime's warning for session `info` (see [`ImageProbes::warning`]).
    fn warning_of(&self, info: &ContainerInfo) -> Option<String> {
        let probes = self.probes.as_ref()?;
        probes.warning(info.image_id.as_deref()?)
    }

    /// The runtime's warning for session `id`, when its image was found unsound: one inspect,
    /// and none while no image of this engine was.
    pub async fn runtime_warning(&self, id: &SessionId) -> Option<String> {
        if !self.probes.as_ref()?.any_unsound() {
            return None;
        }
        self.warning_of(&self.find(id).await.ok()?)
    }

    fn engine(&self) -> &dyn ContainerEngine {
        &**self.factory.engine()
    }

    /// How often the sampler reads each running session (`None`: it does not run).
    pub fn config_metrics_interval(&self) -> Option<Duration> {
        self.config().sessions.metrics_interval
    }

    pub(crate) fn config(&self) -> &Config {
        self.factory.config()
    }

    fn snapshots(&self) -> &Snapshots {
        self.factory.snapshots()
    }

    fn egress(&self) -> Option<&Arc<Egress>> {
        self.factory.egress()
    }

    /// The egress that manages a session's triad, or the 503 of a replica without the CA.
    fn egress_here(&self) -> Result<&Arc<Egress>, SessionError> {
        self.egress().ok_or(SessionError::EgressUnavailableHere)
    }

    /// Opens the session's helper channel in the background.
    fn warm(&self, id: &str) {
        crate::runtime::warm_in_background(&self.runtime, id);
    }

    /// The managed sandbox container behind `id`, or 404. `id` is a checked [`SessionId`] or
    /// one the engine handed out: a full container id, never a name or a prefix that could reach
    /// a container that is not a session.
    async fn find(&self, id: &str) -> Result<ContainerInfo, SessionError> {
        let info = self.engine().inspect(id).await?;
        // Another deployment's session is not ours to run, read or delete, even on a shared
        // engine with a shared key: it is simply not found. Nor is a warm-pool member until it
        // is claimed (its name says so: labels cannot change).
        if !info.is_managed()
            || info.labels.get(ROLE_LABEL).map(String::as_str) != Some(ROLE_SANDBOX)
            || info.labels.get(DEPLOYMENT_LABEL) != Some(&self.config().deployment)
            || crate::pool::is_unclaimed(&info)
        {
            return Err(SessionError::NotFound);
        }
        Ok(info)
    }

    /// Starts a stopped session so the next operation finds it warm. An egress session's
    /// gateway is checked even when the sandbox runs: one killed behind the service's back is
    /// started again (its policy file, the latest one, is kept in its container), so the sandbox
    /// never stays cut off.
    ///
    /// A paused session is thawed: its gateway (by [`Egress::ensure_gateway`]) and itself, side
    /// by side (the request waits for both; a process that resumes first and reaches for a
    /// still-frozen gateway has its connection queued by the kernel, not refused). One its
    /// deadline paused gets a deadline again first: its last timeout, from now.
    pub async fn ensure_running(&self, id: &SessionId) -> Result<ContainerInfo, SessionError> {
        self.started(id).await
    }

    /// [`Self::ensure_running`] on a checked id or one of the engine's.
    async fn started(&self, id: &str) -> Result<ContainerInfo, SessionError> {
        let info = self.find(id).await?;
        self.start_found(id, info).await
    }

    /// [`Self::started`] for the session `info` just found.
    async fn start_found(
        &self,
        id: &str,
        info: ContainerInfo,
    ) -> Result<ContainerInfo, SessionError> {
        let triad = Triad::of(&info);
        if info.is_paused() {
            if keeping_paused() {
                return Err(SessionError::Paused);
            }
            // Paused by its deadline: the deadline is armed again before anything thaws.
            self.rearm_deadline(id).await?;
            let gateway = async {
                match &triad {
                    Some(triad) => self
                        .egress_here()?
                        .ensure_gateway(triad)
                        .await
                        .map_err(SessionError::from),
                    None => Ok(()),
                }
            };
            let (gateway, sandbox) = tokio::join!(gateway, self.engine().unpause(id));
            match sandbox {
                Ok(()) => {}
                Err(EngineError::NotFound) => return Err(SessionError::NotFound),
                // Thawed by another request meanwhile.
                Err(EngineError::Conflict(_)) => {}
                Err(e) => return Err(SessionError::RestartFailed(e)),
            }
            gateway?;
            tracing::info!(session_id = %id, "session thawed");
            return Ok(info);
        }
        if info.is_running() && triad.is_none() {
            return Ok(info);
        }
        // The gateway first, listening before the sandbox's first command runs.
        if let Some(triad) = triad {
            self.egress_here()?.ensure_gateway(&triad).await?;
        }
        if info.is_running() {
            return Ok(info);
        }
        match self.engine().start(id).await {
            Ok(()) => {
                self.warm(id);
                Ok(info)
            }
            Err(EngineError::NotFound) => Err(SessionError::NotFound),
            Err(e) => Err(SessionError::RestartFailed(e)),
        }
    }

    /// Whether everything the running session `info` needs runs: its gateway, if it has one.
    async fn gateway_up(&self, info: &ContainerInfo) -> Result<bool, SessionError> {
        match (Triad::of(info), self.egress()) {
            (None, _) => Ok(true),
            (Some(triad), Some(egress)) => Ok(egress.gateway_running(&triad).await?),
            (Some(_), None) => Ok(false),
        }
    }
}
