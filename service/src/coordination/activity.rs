//! When each session was last used, for the reaper's idle check of running sessions.
//!
//! Every session-scoped operation touches its session when it takes the session lock and again
//! when it lets go ([`touch_on_release`]); the closing touch happens *before* the lock is released,
//! so a reaper that gets the lock next always sees it. A command that runs longer than the idle
//! window therefore never leaves a stale record behind, and while it runs it holds the lock, which
//! the reaper needs before it removes anything.
//!
//! Two trackers behind [`SessionActivity`]:
//! - [`LocalActivity`] (no `REDIS_URL`): a map in this process. Idle running sessions are reaped on
//!   a single instance too, which the reference cannot do without Redis.
//! - [`RedisActivity`]: one key per session (`daiv-sandbox:session-activity:<id>`, Unix ms), with a
//!   TTL of twice the idle window, so records of removed sessions clean themselves up and an expired
//!   record can only mean "idle for longer than the window".
//!
//! A session with no record counts as idle since its creation, but never since before the tracker
//! began recording ([`SessionActivity::since`]: the process start, or the first sweep after a Redis
//! flush). So a restart or a flushed Redis gives every running session a fresh idle window instead
//! of getting it reaped at the next sweep.
//!
//! Recording is best-effort: a failed touch is logged, never fails a request.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;

use super::lock::LockGuard;
use super::redis::{RedisUnavailable, bounded};
use crate::ids::is_session_id;

const ACTIVITY_PREFIX: &str = "daiv-sandbox:session-activity:";
const SINCE_KEY: &str = "daiv-sandbox:activity-since";
/// Records kept when idle reaping is off (nobody reads them, but they cost nothing).
const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
const YEAR_MS: u64 = 365 * 24 * 3600 * 1000;
/// Local records beyond this count are pruned by age on the next touch.
const LOCAL_PRUNE_ABOVE: usize = 4096;

#[derive(Debug, thiserror::Error)]
#[error("activity records unavailable: {0}")]
pub struct ActivityError(String);

impl From<RedisUnavailable> for ActivityError {
    fn from(e: RedisUnavailable) -> Self {
        ActivityError(e.0)
    }
}

#[async_trait::async_trait]
pub trait SessionActivity: Send + Sync + 'static {
    /// Records that the session is in use now. Best-effort: failures are logged.
    async fn touch(&self, session_id: &str);
    /// The last touch of each session, `None` where there is no record.
    async fn last_seen(&self, ids: &[String]) -> Result<Vec<Option<SystemTime>>, ActivityError>;
    /// Since when this tracker has been recording: absence of a record says nothing before that.
    async fn since(&self) -> Result<SystemTime, ActivityError>;
    /// Drops the record of a removed session. Best-effort.
    async fn forget(&self, session_id: &str);
    /// Drops records of sessions not in `live` (called by the reaper with every session it saw).
    /// Shared records expire by themselves, so the default does nothing.
    async fn retain(&self, live: &HashSet<String>) {
        let _ = live;
    }
}

/// How long a record is worth keeping: twice the idle window, so an expired one still proves
/// idleness.
pub fn retention(max_idle: Option<Duration>) -> Duration {
    max_idle
        .map(|d| d.saturating_mul(2).max(Duration::from_secs(60)))
        .unwrap_or(DEFAULT_RETENTION)
}

// === impl LocalActivity ===

/// In-process records; see the module docs for why a single instance tracks activity at all.
pub struct LocalActivity {
    records: Mutex<HashMap<String, SystemTime>>,
    since: SystemTime,
    retention: Duration,
}

impl LocalActivity {
    pub fn new(max_idle: Option<Duration>) -> Self {
        Self::starting_at(SystemTime::now(), max_idle)
    }

    /// A tracker that claims to have been recording since `since` (tests set the clock).
    pub fn starting_at(since: SystemTime, max_idle: Option<Duration>) -> Self {
        Self {
            records: Mutex::default(),
            since,
            retention: retention(max_idle),
        }
    }

    /// Sets a record directly (tests use it to age a session).
    pub fn record(&self, session_id: &str, at: SystemTime) {
        if let Ok(mut records) = self.records.lock() {
            records.insert(session_id.to_string(), at);
        }
    }

    pub fn len(&self) -> usize {
        self.records.lock().map(|r| r.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait::async_trait]
impl SessionActivity for LocalActivity {
    async fn touch(&self, session_id: &str) {
        let now = SystemTime::now();
        let Ok(mut records) = self.records.lock() else {
            return;
        };
        records.insert(session_id.to_string(), now);
        // Without a reaper nothing else prunes: keep memory bounded by age.
        if records.len() > LOCAL_PRUNE_ABOVE {
            let keep_after = now.checked_sub(self.retention).unwrap_or(UNIX_EPOCH);
            records.retain(|_, at| *at >= keep_after);
        }
    }

    async fn last_seen(&self, ids: &[String]) -> Result<Vec<Option<SystemTime>>, ActivityError> {
        let records = self
            .records
            .lock()
            .map_err(|_| ActivityError("activity table poisoned".into()))?;
        Ok(ids.iter().map(|id| records.get(id).copied()).collect())
    }

    async fn since(&self) -> Result<SystemTime, ActivityError> {
        Ok(self.since)
    }

    async fn forget(&self, session_id: &str) {
        if let Ok(mut records) = self.records.lock() {
            records.remove(session_id);
        }
    }

    async fn retain(&self, live: &HashSet<String>) {
        if let Ok(mut records) = self.records.lock() {
            records.retain(|id, _| live.contains(id));
        }
    }
}

// === impl RedisActivity ===

/// Records shared by every replica. Round trips: touch 1, `last_seen` 1 (`MGET`), `since` 1.
pub struct RedisActivity {
    conn: ConnectionManager,
    retention: Duration,
}

impl RedisActivity {
    pub fn new(conn: ConnectionManager, max_idle: Option<Duration>) -> Self {
        Self {
            conn,
            retention: retention(max_idle),
        }
    }
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn from_unix_ms(ms: i64) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_millis(u64::try_from(ms).ok()?))
}

#[async_trait::async_trait]
impl SessionActivity for RedisActivity {
    async fn touch(&self, session_id: &str) {
        let mut conn = self.conn.clone();
        // Redis refuses expiries past its clock's range: a year is "forever" here.
        let ttl_ms = u64::try_from(self.retention.as_millis())
            .unwrap_or(u64::MAX)
            .min(YEAR_MS);
        let set = bounded(
            redis::cmd("SET")
                .arg(format!("{ACTIVITY_PREFIX}{session_id}"))
                .arg(unix_ms(SystemTime::now()))
                .arg("PX")
                .arg(ttl_ms)
                .query_async::<()>(&mut conn),
        )
        .await;
        if let Err(e) = set {
            tracing::warn!(session_id, error = %e, "could not record session activity");
        }
    }

    async fn last_seen(&self, ids: &[String]) -> Result<Vec<Option<SystemTime>>, ActivityError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = ids
            .iter()
            .map(|id| format!("{ACTIVITY_PREFIX}{id}"))
            .collect();
        let mut conn = self.conn.clone();
        // MGET of one key returns a bare value in some clients' typing: always ask for a list.
        let raw: Vec<Option<String>> =
            bounded(redis::cmd("MGET").arg(&keys).query_async(&mut conn)).await?;
        // Junk is "no record", never "idle since 1970".
        Ok(raw
            .into_iter()
            .map(|v| v.and_then(|s| s.parse::<i64>().ok()).and_then(from_unix_ms))
            .collect())
    }

    async fn since(&self) -> Result<SystemTime, ActivityError> {
        let mut conn = self.conn.clone();
        // First caller (or the first after a flush) sets it; everyone reads the same value.
        let (raw,): (Option<String>,) = bounded(
            redis::pipe()
                .cmd("SET")
                .arg(SINCE_KEY)
                .arg(unix_ms(SystemTime::now()))
                .arg("NX")
                .ignore()
                .cmd("GET")
                .arg(SINCE_KEY)
                .query_async(&mut conn),
        )
        .await?;
        raw.and_then(|s| s.parse::<i64>().ok())
            .and_then(from_unix_ms)
            .ok_or_else(|| ActivityError("unreadable activity epoch".into()))
    }

    async fn forget(&self, session_id: &str) {
        let mut conn = self.conn.clone();
        let del = bounded(
            redis::cmd("DEL")
                .arg(format!("{ACTIVITY_PREFIX}{session_id}"))
                .query_async::<()>(&mut conn),
        )
        .await;
        if let Err(e) = del {
            tracing::debug!(session_id, error = %e, "could not forget session activity");
        }
    }
}

// === touch on release ===

/// Wraps a held session lock so that dropping it first records activity, then releases the lock,
/// in that order (see the module docs for why the order matters). Ids that cannot be sessions
/// are not recorded.
pub fn touch_on_release(
    activity: Arc<dyn SessionActivity>,
    session_id: &str,
    held: LockGuard,
) -> LockGuard {
    on_release(activity, session_id, held, false)
}

/// Like [`touch_on_release`] for a request that removes the session: its activity record is
/// deleted instead of refreshed, so nothing of a removed session lingers (in Redis, a key with
/// a TTL of hours).
pub fn forget_on_release(
    activity: Arc<dyn SessionActivity>,
    session_id: &str,
    held: LockGuard,
) -> LockGuard {
    on_release(activity, session_id, held, true)
}

fn on_release(
    activity: Arc<dyn SessionActivity>,
    session_id: &str,
    held: LockGuard,
    forget: bool,
) -> LockGuard {
    if !is_session_id(session_id) {
        return held;
    }
    LockGuard::new(TouchThenRelease {
        activity,
        session_id: session_id.to_string(),
        held: Some(held),
        forget,
    })
}

struct TouchThenRelease {
    activity: Arc<dyn SessionActivity>,
    session_id: String,
    held: Option<LockGuard>,
    forget: bool,
}

impl Drop for TouchThenRelease {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        let activity = self.activity.clone();
        let id = std::mem::take(&mut self.session_id);
        let forget = self.forget;
        // Drop cannot await; without a runtime the lock is released as is.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if forget {
                    activity.forget(&id).await;
                } else {
                    activity.touch(&id).await;
                }
                drop(held);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordination::lock::{LocalLocks, LockError, SessionLocks};

    const ID: &str = "0000000000000000000000000000000000000000000000000000000000000001";

    #[tokio::test]
    async fn closing_touch_lands_before_the_lock_is_free() -> Result<(), LockError> {
        let activity = Arc::new(LocalActivity::starting_at(UNIX_EPOCH, None));
        activity.record(ID, UNIX_EPOCH);
        let locks = LocalLocks::default();
        let held = locks.acquire(ID, Duration::ZERO).await?;
        let before = SystemTime::now();
        drop(touch_on_release(activity.clone(), ID, held));
        // Whoever gets the lock next sees the closing touch.
        let _next = locks.acquire(ID, Duration::from_secs(5)).await?;
        let seen = activity
            .last_seen(&[ID.to_string()])
            .await
            .map_err(|e| LockError::Unavailable(e.to_string()))?;
        assert!(seen[0].is_some_and(|t| t >= before), "{seen:?}");
        Ok(())
    }

    #[tokio::test]
    async fn ids_that_are_not_sessions_are_not_recorded() -> Result<(), LockError> {
        let activity = Arc::new(LocalActivity::new(None));
        let locks = LocalLocks::default();
        let held = locks.acquire("junk", Duration::ZERO).await?;
        drop(touch_on_release(activity.clone(), "junk", held));
        let _next = locks.acquire("junk", Duration::from_secs(5)).await?;
        assert!(activity.is_empty());
        Ok(())
    }

    #[tokio::test]
    async fn retain_drops_records_of_vanished_sessions() {
        let activity = LocalActivity::new(None);
        activity.touch("a").await;
        activity.touch("b").await;
        activity.retain(&HashSet::from(["b".to_string()])).await;
        let seen = activity
            .last_seen(&["a".to_string(), "b".to_string()])
            .await
            .unwrap_or_default();
        assert!(seen[0].is_none() && seen[1].is_some(), "{seen:?}");
    }

    #[test]
    fn records_outlive_the_idle_window() {
        assert_eq!(
            retention(Some(Duration::from_secs(100))),
            Duration::from_secs(200)
        );
        assert_eq!(
            retention(Some(Duration::from_secs(1))),
            Duration::from_secs(60)
        );
        assert_eq!(retention(None), DEFAULT_RETENTION);
        assert_eq!(retention(Some(Duration::MAX)), Duration::MAX);
    }
}
