//! Sessions: the lifecycle of a session, over the sandboxes the factory and the pool build.
//!
//! A session is a sandbox container of this deployment (see [`crate::sandbox`]); its id is the
//! container id, and all its state lives in the container and its labels, so any replica (or a
//! restarted control plane) can serve any session. [`Sessions::create`] validates a request,
//! takes a warm-pool member when one matches ([`crate::pool`]), else reserves the egress token
//! (egress only) and builds a sandbox cold. The other operations find the session, start it
//! again when it was stopped, run commands through the session runtime, refresh its egress
//! policy and close it. Requests on one session are ordered by its lock ([`Sessions::lock`]),
//! which also records the session's activity for the reaper.
//!
//! Docker round trips: create, see [`crate::sandbox`]; commands and fs ops go over the helper's
//! channel (none); status = inspect (+ start when stopped); close = inspect + stop/remove.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::api::{RunRequest, RunResponse, StartSessionRequest};
use crate::config::Config;
use crate::coordination::activity::{self, SessionActivity};
use crate::coordination::lock::{LockError, LockGuard, SessionLocks};
use crate::egress::{self, Egress, Triad};
use crate::engine::{
    ContainerEngine, ContainerInfo, DEPLOYMENT_LABEL, EngineError, ROLE_LABEL, ROLE_SANDBOX,
    WORKSPACE_LABEL,
};
use crate::ids::is_session_id;
use crate::layout;
use crate::pool::Pool;
use crate::runtime::{RunSpec, SessionRuntime};
use crate::sandbox::SandboxFactory;
use crate::snapshots::{Keep, Snapshot, SnapshotRequest, Snapshots, Timings};
use crate::telemetry::metrics::{Metrics, observe_duration};
use sandbox_protocol::message::{ProcList, ProcRequest};

pub use crate::sandbox::{MAX_TIMEOUT_SECS, SessionError};

/// Longest a force delete waits for a busy session's lock before it removes the session anyway.
pub const FORCE_LOCK_WAIT: Duration = Duration::from_secs(1);

pub struct Sessions {
    factory: Arc<SandboxFactory>,
    pool: Arc<Pool>,
    runtime: Arc<dyn SessionRuntime>,
    locks: Arc<dyn SessionLocks>,
    /// Touched by [`Sessions::lock`] at the start and end of every session operation.
    activity: Arc<dyn SessionActivity>,
    metrics: Arc<Metrics>,
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
        }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub fn engine(&self) -> &dyn ContainerEngine {
        &**self.factory.engine()
    }

    pub fn config(&self) -> &Arc<Config> {
        self.factory.config()
    }

    pub fn runtime(&self) -> &dyn SessionRuntime {
        &*self.runtime
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn locks(&self) -> &Arc<dyn SessionLocks> {
        &self.locks
    }

    pub fn activity(&self) -> &Arc<dyn SessionActivity> {
        &self.activity
    }

    fn egress(&self) -> Option<&Arc<Egress>> {
        self.factory.egress()
    }

    /// Whether sandboxes get the helper (the service refuses to start without it).
    pub fn has_helper(&self) -> bool {
        self.factory.helper().is_some()
    }

    /// Opens the session's helper channel in the background.
    fn warm(&self, id: &str) {
        crate::runtime::warm_in_background(&self.runtime, id);
    }

    /// Creates and starts a session: validate, then a ready warm-pool member when one matches
    /// the request, else a cold build (for egress, with a token reserved for the triad's
    /// parts). Nothing is left behind when a step fails.
    ///
    /// With `snapshot_id`, the session starts from that snapshot (see [`crate::snapshots`]):
    /// `base_image` may be omitted, and when given must be the snapshot's.
    pub async fn create(&self, req: &StartSessionRequest) -> Result<String, SessionError> {
        let Some(snapshot_id) = &req.snapshot_id else {
            return self.create_from(req, None).await;
        };
        let snapshot = self.snapshots().get(snapshot_id).await?;
        if !req.base_image.is_empty() && req.base_image != snapshot.base_image {
            return Err(SessionError::SnapshotImageMismatch(snapshot.base_image));
        }
        let req = StartSessionRequest {
            base_image: snapshot.base_image.clone(),
            snapshot_id: req.snapshot_id.clone(),
            environment: req.environment.clone(),
            memory_bytes: req.memory_bytes,
            cpus: req.cpus,
            egress: req.egress.clone(),
        };
        self.create_from(&req, Some(&snapshot)).await
    }

    /// Validate, then a warm-pool member, else a cold build.
    async fn create_from(
        &self,
        req: &StartSessionRequest,
        from: Option<&Snapshot>,
    ) -> Result<String, SessionError> {
        let policy = self.factory.validate(req)?;
        if let Some(id) = self.pool.claim(req, policy.as_ref()).await {
            tracing::info!(session_id = %id, image = %req.base_image, "session claimed from the warm pool");
            self.warm(&id);
            return Ok(id);
        }
        let id = self.build(req, policy.as_ref(), from).await?;
        tracing::info!(
            session_id = %id,
            image = %req.base_image,
            snapshot_id = from.map(|s| s.id.as_str()),
            egress = policy.is_some(),
            "session created"
        );
        self.warm(&id);
        Ok(id)
    }

    /// A cold build: for egress, with a token reserved for the triad's parts.
    async fn build(
        &self,
        req: &StartSessionRequest,
        policy: Option<&shared_policy::PolicyFile>,
        from: Option<&Snapshot>,
    ) -> Result<String, SessionError> {
        match policy {
            None => self.factory.build(req, None, None, from).await,
            Some(policy) => {
                let egress = self.factory.egress_or_400()?;
                let reservation = egress
                    .reserve(&*self.locks, self.config().coordination.lock_wait)
                    .await?;
                self.factory
                    .build(req, Some((policy, &reservation)), None, from)
                    .await
            }
        }
    }

    pub fn snapshots(&self) -> &Arc<Snapshots> {
        self.factory.snapshots()
    }

    /// `POST /session/{id}/snapshot/` (the caller holds the session's lock).
    pub async fn snapshot(
        &self,
        id: &str,
        req: &SnapshotRequest,
    ) -> Result<(Snapshot, Timings), SessionError> {
        let info = self.thawed(id).await?;
        self.flush(&info).await;
        let (snapshot, timings) = self.snapshots().take(&info, req, Keep::Recorded).await?;
        self.metrics.snapshots_taken.inc();
        tracing::info!(
            session_id = %id,
            snapshot_id = %snapshot.id,
            size_bytes = snapshot.size,
            frozen_ms = timings.frozen.as_millis() as u64,
            commit_ms = timings.commit.as_millis() as u64,
            copy_ms = timings.copy.as_millis() as u64,
            "snapshot taken"
        );
        Ok((snapshot, timings))
    }

    /// `POST /session/{id}/fork/` (the caller holds the source's lock): a snapshot without a
    /// record, then `count` sessions from it side by side, each with the source's egress
    /// policy (its own gateway) and limits. All or nothing.
    pub async fn fork(
        &self,
        id: &str,
        count: u32,
        environment: Option<std::collections::BTreeMap<String, String>>,
        parallel: usize,
    ) -> Result<Vec<String>, SessionError> {
        let cap = self.config().snapshots.fork_max;
        if !(1..=cap).contains(&count) {
            return Err(SessionError::ForkCount(cap));
        }
        let info = self.thawed(id).await?;
        let policy = match Triad::of(&info) {
            Some(triad) => Some(
                self.egress()
                    .ok_or(SessionError::EgressUnavailableHere)?
                    .current_policy(&triad)
                    .await?,
            ),
            None => None,
        };
        self.flush(&info).await;
        let (snapshot, _) = self
            .snapshots()
            .take(&info, &SnapshotRequest::default(), Keep::ForForks)
            .await?;
        let req = StartSessionRequest {
            base_image: snapshot.base_image.clone(),
            snapshot_id: Some(snapshot.id.clone()),
            environment: match environment {
                Some(e) => Some(e),
                None => Some(self.caller_env(&info).await?),
            },
            memory_bytes: info.memory_bytes,
            cpus: info.nano_cpus.map(|n| n as f64 / 1e9),
            egress: None,
        };
        // As many at a time as the request holds create slots for (see `Admission`).
        let builds = (0..count).map(|_| self.build(&req, policy.as_ref(), Some(&snapshot)));
        let results: Vec<_> = futures::stream::iter(builds)
            .buffer_unordered(parallel.max(1))
            .collect()
            .await;
        let (made, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
        let made: Vec<String> = made.into_iter().filter_map(Result::ok).collect();
        if let Some(Err(e)) = failed.into_iter().next() {
            for fork in &made {
                if let Err(e) = self.close(fork, true).await {
                    tracing::warn!(session_id = %fork, error = %e, "fork: a made fork not removed");
                }
            }
            self.snapshots().release(&snapshot.id).await;
            return Err(e);
        }
        // Its payload goes once the forks are gone (the reaper's sweep).
        self.snapshots().release(&snapshot.id).await;
        self.metrics.forks.inc_by(u64::from(count));
        for fork in &made {
            self.warm(fork);
        }
        tracing::info!(session_id = %id, forks = ?made, "session forked");
        Ok(made)
    }

    /// Under gVisor, file data a sandbox wrote may still sit in the sandbox kernel's cache, where
    /// neither a commit nor an archive of the host's files sees it: `sync` writes it out before
    /// the freeze. (runc's page cache is the host's: nothing to do.) Best effort: a sandbox
    /// without `sync` is snapshotted as the host sees it.
    ///
    /// Either way the session's channel is open (and answering) before the freeze: see
    /// [`Self::settle`].
    async fn flush(&self, info: &ContainerInfo) {
        if !info.is_running() {
            return;
        }
        if self.config().sessions.runtime.as_str() != "runsc" {
            return self.settle(&info.id).await;
        }
        let spec = RunSpec {
            commands: vec!["sync".to_string()],
            fail_fast: true,
            timeout: Some(Duration::from_secs(30)),
            output_cap: 4096,
            run_output_cap: 4096,
            workdir: layout::REPO.to_string(),
            env: Vec::new(),
        };
        if let Err(e) = self.runtime.run(&info.id, &spec).await {
            tracing::warn!(session_id = %info.id, error = %e, "snapshot: sync before the freeze failed");
        }
    }

    /// Waits until no exec of ours is starting in the session, before it is frozen: an exec
    /// frozen half-way (`runc init` joining the container's cgroup) holds the container in the
    /// runtime's shim, and the thaw then waits behind it for good, taking the Docker daemon's
    /// lock on the container with it. The helper's channel is the exec a fresh session opens in
    /// the background ([`Self::warm`]); a request on it waits for an open in flight and proves
    /// the exec started. Every other exec of a session is made under its lock, which the freezing
    /// request holds.
    async fn settle(&self, id: &str) {
        if let Err(e) = self.runtime.seeded(id).await {
            tracing::debug!(session_id = %id, error = %e, "the helper's channel did not answer before a freeze");
        }
    }

    /// What the caller asked for in the environment of the session `info`: its container's
    /// variables without its image's, the sandbox's own and the egress settings.
    async fn caller_env(
        &self,
        info: &ContainerInfo,
    ) -> Result<std::collections::BTreeMap<String, String>, SessionError> {
        let image_env = match &info.image_id {
            Some(image) => self.engine().inspect_image(image).await?.env,
            None => Vec::new(),
        };
        // A variable of the image, as the image sets it (one the caller gave another value,
        // including one a snapshot's image blanked, is the caller's).
        let in_image = |kv: &str| image_env.iter().any(|ie| ie == kv);
        // A claimed warm-pool member's environment is in its environment file, applied on top.
        let claimed: Vec<(String, String)> =
            crate::engine::read_file(self.engine(), &info.id, layout::ENV_FILE, 1024 * 1024)
                .await?
                .and_then(|json| serde_json::from_slice(&json).ok())
                .unwrap_or_default();
        let mut env: std::collections::BTreeMap<String, String> = info
            .env
            .iter()
            .filter(|kv| !in_image(kv))
            .filter_map(|kv| kv.split_once('='))
            .filter(|(k, _)| !crate::sandbox::BASE_ENV_NAMES.contains(k) && !egress::sets_env(k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.extend(claimed.into_iter().filter(|(k, _)| !egress::sets_env(k)));
        Ok(env)
    }

    /// `POST /session/{id}/pause/` (the caller holds the lock): the sandbox and its gateway,
    /// frozen side by side with their memory and processes. A paused session answers 204 at once.
    pub async fn pause(&self, id: &str) -> Result<(), SessionError> {
        let info = self.find(id).await?;
        if info.is_paused() {
            return Ok(());
        }
        if !info.is_running() {
            return Err(SessionError::NotRunning);
        }
        self.settle(id).await;
        let triad = Triad::of(&info);
        let gateway = async {
            match (&triad, self.egress()) {
                (Some(triad), Some(egress)) => egress.pause_gateway(triad).await,
                _ => Ok(()),
            }
        };
        let (sandbox, gateway) = tokio::join!(self.engine().pause(id), gateway);
        if sandbox.is_err() || gateway.is_err() {
            // Half-paused is worse than running: thaw whatever froze.
            if sandbox.is_ok() {
                let _ = self.engine().unpause(id).await;
            }
            if gateway.is_ok()
                && let (Some(triad), Some(egress)) = (&triad, self.egress())
            {
                let _ = egress.ensure_gateway(triad).await;
            }
            sandbox?;
            gateway?;
        }
        self.metrics.pauses.inc();
        tracing::info!(session_id = %id, "session paused");
        Ok(())
    }

    /// The session, thawed when paused (gateway first), else as it is (a stopped session
    /// stays stopped: a snapshot reads it as it is).
    async fn thawed(&self, id: &str) -> Result<ContainerInfo, SessionError> {
        let info = self.find(id).await?;
        if !info.is_paused() {
            return Ok(info);
        }
        self.ensure_running(id).await?;
        self.find(id).await
    }

    /// `PUT /session/{id}/egress/`: a new policy for a live session, without restarting anything.
    pub async fn refresh_egress(
        &self,
        id: &str,
        body: &serde_json::Value,
    ) -> Result<(), SessionError> {
        let info = self.find(id).await?;
        let Some(triad) = Triad::of(&info) else {
            return Err(SessionError::NoEgressProxy);
        };
        let policy = egress::parse_policy(body)?;
        let egress = self.egress().ok_or(SessionError::EgressUnavailableHere)?;
        egress.refresh(&triad, &policy).await?;
        tracing::info!(session_id = %id, "egress policy refreshed");
        Ok(())
    }

    /// The managed sandbox container behind `id`, or 404. Ids are full container ids only: a name
    /// or a prefix could reach a container that is not a session.
    pub async fn find(&self, id: &str) -> Result<ContainerInfo, SessionError> {
        if !is_session_id(id) {
            return Err(SessionError::NotFound);
        }
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
    /// still-frozen gateway has its connection queued by the kernel, not refused).
    pub async fn ensure_running(&self, id: &str) -> Result<ContainerInfo, SessionError> {
        let info = self.find(id).await?;
        let triad = Triad::of(&info);
        if info.is_paused() {
            let gateway = async {
                match &triad {
                    Some(triad) => self
                        .egress()
                        .ok_or(SessionError::EgressUnavailableHere)?
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
            self.egress()
                .ok_or(SessionError::EgressUnavailableHere)?
                .ensure_gateway(&triad)
                .await?;
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
    pub async fn gateway_up(&self, info: &ContainerInfo) -> Result<bool, SessionError> {
        match (Triad::of(info), self.egress()) {
            (None, _) => Ok(true),
            (Some(triad), Some(egress)) => Ok(egress.gateway_running(&triad).await?),
            (Some(_), None) => Ok(false),
        }
    }

    /// Stops the session (kept warm for reuse), or removes it with `force`.
    pub async fn close(&self, id: &str, force: bool) -> Result<(), SessionError> {
        let info = self.find(id).await?;
        let triad = Triad::of(&info);
        self.runtime.forget(id);
        // A frozen process cannot take SIGTERM: a paused session is thawed to stop gracefully,
        // and before a removal too (the engine would otherwise kill it frozen and resume it
        // itself, a path where a runtime that fails to resume holds the container).
        if info.is_paused() {
            if let (Some(triad), Some(egress)) = (&triad, self.egress()) {
                let _ = egress.ensure_gateway(triad).await;
            }
            let _ = self.engine().unpause(id).await;
        }
        let result = if force {
            self.engine().remove(id).await
        } else {
            self.engine()
                .stop(id, self.config().sessions.stop_timeout)
                .await
        };
        match result {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        if force && let Some(token) = info.label(WORKSPACE_LABEL) {
            self.snapshots().remove_workspace(token).await;
        }
        // Removal needs only the engine, so it happens even where egress is not configured.
        match (triad, self.egress()) {
            (Some(triad), _) if force => {
                egress::teardown(self.engine(), &triad.parts()).await;
            }
            (Some(triad), Some(egress)) => egress.stop(&triad).await,
            _ => {}
        }
        Ok(())
    }

    /// Runs the commands in order through the session's helper. A timed-out command ends the
    /// request: it and everything it started are killed, the rest are skipped.
    pub async fn run(&self, id: &str, req: &RunRequest) -> Result<RunResponse, SessionError> {
        let Some(spec) = self.run_spec(id, req).await? else {
            return Ok(RunResponse {
                results: Vec::new(),
            });
        };
        let results = self.runtime.run(id, &spec).await?;
        Ok(RunResponse { results })
    }

    /// Checks a run request and makes sure the session runs; `None` when there is nothing to run.
    pub async fn run_spec(
        &self,
        id: &str,
        req: &RunRequest,
    ) -> Result<Option<RunSpec>, SessionError> {
        if let Some(bad) = req.commands.iter().find(|c| c.contains('\0')) {
            return Err(SessionError::NulInCommand(crate::text::shown(
                &bad.replace('\0', "\\0"),
            )));
        }
        let timeout = match req.timeout {
            Some(0) => None,
            Some(secs) if secs > MAX_TIMEOUT_SECS => {
                return Err(SessionError::TimeoutTooLong);
            }
            Some(secs) => Some(Duration::from_secs(secs)),
            None => self.config().sessions.command_timeout,
        };
        self.ensure_running(id).await?;
        if req.commands.is_empty() {
            return Ok(None);
        }
        Ok(Some(RunSpec {
            commands: req.commands.clone(),
            fail_fast: req.fail_fast,
            timeout,
            output_cap: self.config().sessions.output_max_bytes,
            run_output_cap: self.config().sessions.run_output_max_bytes,
            workdir: layout::REPO.to_string(),
            env: Vec::new(),
        }))
    }

    /// Background processes running in the session (for the reaper, which must not take a busy
    /// job for idle).
    pub async fn live_processes(&self, id: &str) -> Result<usize, SessionError> {
        let list: ProcList = self
            .runtime
            .process(id, ProcRequest::List, None)
            .await?
            .parse()?;
        Ok(list.processes.iter().filter(|p| p.running).count())
    }

    // === the session's lock ===

    /// For operations that may overlap a running command (read-only fs ops, background
    /// processes): no lock while the session runs; a stopped session is restarted under its
    /// lock, as every other operation does.
    pub async fn running_unlocked(&self, session_id: &str) -> Result<(), SessionError> {
        let info = self.find(session_id).await?;
        if info.is_running() && self.gateway_up(&info).await? {
            self.activity.touch(session_id).await;
            return Ok(());
        }
        let _held = self.lock(session_id).await?;
        self.ensure_running(session_id).await?;
        Ok(())
    }

    /// The session's lock for a force delete, which does not wait behind anything: taken if
    /// it is free within [`FORCE_LOCK_WAIT`], else the removal goes ahead without it (the
    /// request holding it then fails: its session is gone). Its activity record is deleted.
    pub async fn lock_to_remove(
        &self,
        session_id: &str,
    ) -> Result<Option<LockGuard>, SessionError> {
        let wait = self.config().coordination.lock_wait.min(FORCE_LOCK_WAIT);
        match self.locks.acquire(session_id, wait).await {
            Ok(held) => Ok(Some(activity::forget_on_release(
                self.activity.clone(),
                session_id,
                held,
            ))),
            Err(LockError::Timeout) => {
                tracing::info!(
                    session_id,
                    "force delete of a busy session: removing it anyway"
                );
                self.activity.forget(session_id).await;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The session's lock, or 409 once `SESSION_LOCK_WAIT_SECONDS` have passed (503 when the
    /// lock backend is down). Touches the session's activity now and again when the guard drops,
    /// before the lock is released.
    pub async fn lock(&self, session_id: &str) -> Result<LockGuard, SessionError> {
        let held = self.acquire(session_id).await?;
        if is_session_id(session_id) {
            self.activity.touch(session_id).await;
        }
        Ok(activity::touch_on_release(
            self.activity.clone(),
            session_id,
            held,
        ))
    }

    async fn acquire(&self, session_id: &str) -> Result<LockGuard, SessionError> {
        let waiting = std::time::Instant::now();
        let held = self
            .locks
            .acquire(session_id, self.config().coordination.lock_wait)
            .await;
        observe_duration(&self.metrics.lock_waits, waiting.elapsed());
        if let Err(LockError::Timeout) = &held {
            self.metrics.lock_busy.inc();
        }
        Ok(held?)
    }
}
