//! A session's life: create (validate → claim → else reserve + build), close, pause and thaw,
//! its egress policy's refresh.

use crate::api::StartSessionRequest;
use crate::egress::{self, Triad};
use crate::engine::{ContainerInfo, EngineError, WORKSPACE_LABEL};
use crate::sandbox::EgressPolicy;
use crate::snapshots::Snapshot;
use crate::telemetry::metrics::ModeLabels;
use shared_policy::PolicyFile;

use super::{Lifetime, SessionError, SessionId, Sessions, ValidationError};

impl Sessions {
    /// Creates and starts a session: validate, then a ready warm-pool member when one matches
    /// the request, else a cold build (for egress, with a token reserved for the triad's
    /// parts). Nothing is left behind when a step fails. Its idle time starts now (a claimed
    /// member was made long before).
    ///
    /// With `snapshot_id`, the session starts from that snapshot (see [`crate::snapshots`]):
    /// `base_image` may be omitted, and when given must be the snapshot's.
    pub async fn create(&self, req: &StartSessionRequest) -> Result<String, SessionError> {
        let lifetime = Lifetime::of(req)?;
        let id = self.create_any(req).await?;
        if let Err(e) = self.record_new(&id, &lifetime).await {
            // All or nothing: a session without the record its request asked for is removed.
            if let Err(e) = self.shut(&id, true).await {
                tracing::warn!(session_id = %id, error = %e, "a session whose record failed was not removed");
            }
            return Err(e);
        }
        Ok(id)
    }

    /// From a snapshot or an image: the session's container.
    async fn create_any(&self, req: &StartSessionRequest) -> Result<String, SessionError> {
        let Some(snapshot_id) = &req.snapshot_id else {
            return self.create_from(req, None).await;
        };
        let snapshot = self.snapshots().get(snapshot_id).await?;
        if !req.base_image.is_empty() && req.base_image != snapshot.base_image {
            return Err(ValidationError::SnapshotImageMismatch(snapshot.base_image).into());
        }
        let req = StartSessionRequest {
            base_image: snapshot.base_image.clone(),
            snapshot_id: req.snapshot_id.clone(),
            environment: req.environment.clone(),
            memory_bytes: req.memory_bytes,
            cpus: req.cpus,
            egress: req.egress.clone(),
            ..Default::default()
        };
        self.create_from(&req, Some(&snapshot)).await
    }

    /// Validate, then a warm-pool member, else a cold build.
    async fn create_from(
        &self,
        req: &StartSessionRequest,
        from: Option<&Snapshot>,
    ) -> Result<String, SessionError> {
        let egress = self.factory.validate(req)?;
        let policy = egress.as_ref().map(|e| &e.policy);
        let id = match self.pool.claim(req, policy).await {
            Some(id) => {
                tracing::info!(session_id = %id, image = %req.base_image, "session claimed from the warm pool");
                id
            }
            None => {
                let id = self.build(req, egress.as_ref(), from).await?;
                tracing::info!(
                    session_id = %id,
                    image = %req.base_image,
                    snapshot_id = from.map(|s| s.id.as_str()),
                    egress = egress.is_some(),
                    "session created"
                );
                id
            }
        };
        // The create answers with the helper's channel open (a claimed member's was opened
        // when it became ready), so its first command costs what every later one does. A
        // failure to open is the first command's to report, as it would be later.
        self.runtime.warm(&id).await;
        self.made(&id).await;
        Ok(id)
    }

    /// A new session's bookkeeping: its channel opened in the background, its image probed in
    /// the background on its first use under `runsc`, its idle time started, counted.
    pub(super) async fn made(&self, id: &str) {
        self.warm(id);
        if let Some(probes) = &self.probes {
            probes.on_session(id);
        }
        self.activity.touch(id).await;
        self.metrics.sessions.created.inc();
    }

    /// A cold build: for egress, with a token reserved for the triad's parts.
    pub(super) async fn build(
        &self,
        req: &StartSessionRequest,
        egress: Option<&EgressPolicy>,
        from: Option<&Snapshot>,
    ) -> Result<String, SessionError> {
        match egress {
            None => self.factory.build(req, None, None, from).await,
            Some(plan) => {
                let reservation = plan
                    .egress
                    .reserve(&*self.locks, self.config().coordination.lock_wait)
                    .await?;
                self.factory
                    .build(req, Some((plan, &reservation)), None, from)
                    .await
            }
        }
    }

    /// `DELETE /session/{id}/` (the caller holds the lock, or [`Self::lock_to_remove`] let the
    /// removal go ahead without it): stops the session (kept warm for reuse), or removes it
    /// with `force`. Its processes died with it.
    pub async fn close(&self, id: &SessionId, force: bool) -> Result<(), SessionError> {
        self.shut(id, force).await?;
        self.metrics.processes.observe(id, None);
        let mode = if force { "remove" } else { "stop" };
        self.metrics
            .sessions
            .closed
            .get_or_create(&ModeLabels { mode })
            .inc();
        Ok(())
    }

    /// Removes session `id` of the engine's listing, as a force close does (for the reaper,
    /// which holds its lock and counts what it reaps).
    pub async fn remove(&self, id: &str) -> Result<(), SessionError> {
        self.shut(id, true).await
    }

    /// Stops the session, or removes it with `force` (with its gateway and network, and the
    /// workspace of a session from a snapshot).
    pub(super) async fn shut(&self, id: &str, force: bool) -> Result<(), SessionError> {
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
        if force {
            self.remove_records(id).await;
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

    /// `POST /session/{id}/pause/` (the caller holds the lock): the sandbox and its gateway,
    /// frozen side by side with their memory and processes. A paused session answers 204 at once.
    pub async fn pause(&self, id: &SessionId) -> Result<(), SessionError> {
        self.pause_id(id).await
    }

    /// The reaper's pause of a session whose deadline passed with `on_timeout: pause` (it holds
    /// the lock).
    pub async fn pause_at_deadline(&self, id: &str) -> Result<(), SessionError> {
        self.pause_id(id).await
    }

    async fn pause_id(&self, id: &str) -> Result<(), SessionError> {
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
        self.metrics.snapshots.pauses.inc();
        tracing::info!(session_id = %id, "session paused");
        Ok(())
    }

    /// The session, thawed when paused (gateway first), else as it is (a stopped session
    /// stays stopped: a snapshot reads it as it is).
    pub(super) async fn thawed(&self, id: &str) -> Result<ContainerInfo, SessionError> {
        let info = self.find(id).await?;
        if !info.is_paused() {
            return Ok(info);
        }
        self.start_found(id, info).await?;
        // As it is now, running.
        self.find(id).await
    }

    /// `PUT /session/{id}/egress/`: a new policy for a live session, without restarting anything.
    pub async fn refresh_egress(
        &self,
        id: &SessionId,
        body: &serde_json::Value,
    ) -> Result<(), SessionError> {
        let info = self.find(id).await?;
        let Some(triad) = Triad::of(&info) else {
            return Err(SessionError::NoEgressProxy);
        };
        let policy = egress::parse_policy(body)?;
        self.egress_here()?.refresh(&triad, &policy).await?;
        tracing::info!(session_id = %id, "egress policy refreshed");
        Ok(())
    }

    /// The policy (secrets and door state included) a session's gateway enforces now: for a
    /// door that derives the next policy from it. Never rendered whole.
    pub async fn current_egress(&self, id: &SessionId) -> Result<PolicyFile, SessionError> {
        let info = self.find(id).await?;
        let Some(triad) = Triad::of(&info) else {
            return Err(SessionError::NoEgressProxy);
        };
        Ok(self.egress_here()?.current_policy(&triad).await?)
    }

    /// Installs `policy`, written by a door (with its `door` state), acknowledged as a refresh
    /// is; checked as the API checks a caller's policy, but for the state the door keeps.
    pub async fn install_door_egress(
        &self,
        id: &SessionId,
        policy: &PolicyFile,
    ) -> Result<(), SessionError> {
        let info = self.find(id).await?;
        let Some(triad) = Triad::of(&info) else {
            return Err(SessionError::NoEgressProxy);
        };
        let mut checked = policy.clone();
        checked.door = None;
        shared_policy::validate_for_api(&checked).map_err(egress::EgressError::from)?;
        self.egress_here()?.refresh(&triad, policy).await?;
        tracing::info!(session_id = %id, "egress policy replaced by a door");
        Ok(())
    }
}
