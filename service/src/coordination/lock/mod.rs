//! Per-session locks: one request at a time per session; others wait up to
//! `SESSION_LOCK_WAIT_SECONDS` and then get 409.
//!
//! [`SessionLocks`] is the seam: [`LocalLocks`] serialises requests inside one process (no
//! `REDIS_URL`), [`RedisLocks`] across every replica sharing one Redis. The reaper takes the same
//! locks (with no wait) before it removes anything, so a session with a request in flight is never
//! removed from under it; and it asks [`SessionLocks::try_lead`] so that only one replica sweeps
//! per tick.

use std::time::Duration;

use super::redis::RedisUnavailable;

mod local;
pub mod redis;

pub use local::LocalLocks;
pub use redis::RedisLocks;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Somebody else held the lock for the whole wait.
    #[error("timed out waiting for the session lock")]
    Timeout,
    /// The lock backend did not answer in time or refused: the request cannot be serialised, so
    /// it must not run (503, retryable).
    #[error("session lock backend unavailable: {0}")]
    Unavailable(String),
}

impl From<RedisUnavailable> for LockError {
    fn from(e: RedisUnavailable) -> Self {
        LockError::Unavailable(e.0)
    }
}

/// Held for the duration of one operation; dropping it releases the lock.
pub struct LockGuard {
    _inner: Box<dyn Send + Sync>,
}

impl LockGuard {
    pub fn new(inner: impl Send + Sync + 'static) -> Self {
        Self {
            _inner: Box::new(inner),
        }
    }
}

#[async_trait::async_trait]
pub trait SessionLocks: Send + Sync + 'static {
    /// The lock of `session_id`, waiting at most `wait` (zero: one attempt only).
    async fn acquire(&self, session_id: &str, wait: Duration) -> Result<LockGuard, LockError>;

    /// Claims the reaper's leadership of deployment `name` for `term` without waiting: `Ok(true)`
    /// means this replica sweeps now. The claim is not released after the sweep, so replicas whose
    /// ticks are out of phase still sweep once per `term` between them. A single process always
    /// leads.
    async fn try_lead(&self, name: &str, term: Duration) -> Result<bool, LockError> {
        let _ = (name, term);
        Ok(true)
    }
}
