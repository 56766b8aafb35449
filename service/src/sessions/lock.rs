//! The session's lock: requests on one session are ordered by it, and taking and releasing it
//! records the session's activity for the reaper.

use crate::coordination::activity;
use crate::coordination::lock::{LockError, LockGuard};
use crate::telemetry::metrics::observe_duration;

use super::{FORCE_LOCK_WAIT, SessionError, SessionId, Sessions};

impl Sessions {
    /// Records activity on session `id` for the reaper, for an operation that reached it
    /// without the running check (ingress's trusted connections), which records it otherwise.
    pub async fn touch(&self, id: &SessionId) {
        self.activity.touch(id).await;
    }

    /// For operations that may overlap a running command (read-only fs ops, background
    /// processes): no lock while the session runs; a stopped session is restarted under its
    /// lock, as every other operation does.
    pub async fn running_unlocked(&self, id: &SessionId) -> Result<(), SessionError> {
        let info = self.find(id).await?;
        if info.is_running() && self.gateway_up(&info).await? {
            self.activity.touch(id).await;
            return Ok(());
        }
        let _held = self.lock(id).await?;
        self.started(id).await?;
        Ok(())
    }

    /// The session's lock for a force delete, which does not wait behind anything: taken if
    /// it is free within [`FORCE_LOCK_WAIT`], else the removal goes ahead without it (the
    /// request holding it then fails: its session is gone). Its activity record is deleted.
    pub async fn lock_to_remove(&self, id: &SessionId) -> Result<Option<LockGuard>, SessionError> {
        let wait = self.config().coordination.lock_wait.min(FORCE_LOCK_WAIT);
        match self.locks.acquire(id, wait).await {
            Ok(held) => Ok(Some(activity::forget_on_release(
                self.activity.clone(),
                id,
                held,
            ))),
            Err(LockError::Timeout) => {
                tracing::info!(
                    session_id = %id,
                    "force delete of a busy session: removing it anyway"
                );
                self.activity.forget(id).await;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The session's lock, or 409 once `SESSION_LOCK_WAIT_SECONDS` have passed (503 when the
    /// lock backend is down). Touches the session's activity now and again when the guard drops,
    /// before the lock is released.
    pub async fn lock(&self, id: &SessionId) -> Result<LockGuard, SessionError> {
        let waiting = std::time::Instant::now();
        let held = self
            .locks
            .acquire(id, self.config().coordination.lock_wait)
            .await;
        observe_duration(&self.metrics.locks.waits, waiting.elapsed());
        if let Err(LockError::Timeout) = &held {
            self.metrics.locks.busy.inc();
        }
        let held = held?;
        self.activity.touch(id).await;
        Ok(activity::touch_on_release(self.activity.clone(), id, held))
    }
}
