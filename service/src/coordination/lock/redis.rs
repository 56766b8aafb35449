//! Locks shared by every replica through one Redis, used when `REDIS_URL` is set.
//!
//! A lock is the key `daiv-sandbox:session-lock:<session>` holding a random token:
//! - acquire: `SET key token NX PX ttl`, retried with a short backoff (10 ms doubling to 100 ms)
//!   until `SESSION_LOCK_WAIT_SECONDS` have passed, then [`LockError::Timeout`] (409);
//! - while held, a task tied to the guard extends the TTL every `SESSION_LOCK_REFRESH_SECONDS`,
//!   but only while the key still holds our token (Lua compare-and-expire): a lock that expired
//!   and was taken by another replica is never stolen back;
//! - on drop, the guard deletes the key only if it still holds our token (Lua compare-and-delete),
//!   so a late release never frees somebody else's lock; the release is retried while Redis does
//!   not answer. An acquisition that failed mid-flight (timeout) releases its token the same way,
//!   because a stalled Redis executes the buffered `SET` when it resumes. A holder that dies
//!   without releasing (process killed) stops refreshing, and the lock frees itself after its TTL.
//!
//! Redis trouble fails fast: every call goes through the shared connection's bounded calls
//! ([`crate::coordination::redis`]), and any error is [`LockError::Unavailable`] (503), never a
//! hang.
//!
//! Round trips: acquire 1 per attempt; refresh 1 per interval; release 1 (in the background).

use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;
use tokio::task::JoinHandle;

use super::{LockError, LockGuard, SessionLocks};
use crate::backoff::Backoff;
use crate::coordination::redis::bounded;
const POLL_MIN: Duration = Duration::from_millis(10);
const POLL_MAX: Duration = Duration::from_millis(100);
const YEAR_MS: u64 = 365 * 24 * 3600 * 1000;
/// How long a release keeps retrying while Redis does not answer.
const RELEASE_PATIENCE: Duration = Duration::from_secs(3600);

const LOCK_PREFIX: &str = "daiv-sandbox:session-lock:";
/// One leader per deployment: deployments sharing a Redis sweep independently.
const LEADER_PREFIX: &str = "daiv-sandbox:reaper-leader:";

/// Extends the TTL only while the key still holds our token.
const REFRESH: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Deletes the key only while it still holds our token.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

pub struct RedisLocks {
    conn: ConnectionManager,
    ttl: Duration,
    refresh: Duration,
}

impl RedisLocks {
    /// `refresh` is clamped below `ttl / 2`: a lock refreshed less often than it expires would
    /// be lost mid-request to the next waiter.
    pub fn new(conn: ConnectionManager, ttl: Duration, refresh: Duration) -> Self {
        let ceiling = ttl / 2;
        let refresh = if refresh >= ceiling {
            tracing::warn!(
                ?ttl,
                ?refresh,
                "SESSION_LOCK_REFRESH_SECONDS must be well under SESSION_LOCK_TTL_SECONDS; using TTL/3"
            );
            ttl / 3
        } else {
            refresh
        };
        Self { conn, ttl, refresh }
    }

    /// Redis refuses expiries past its clock's range: a year is "forever" for a lock.
    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis())
            .unwrap_or(u64::MAX)
            .clamp(1, YEAR_MS)
    }

    /// One `SET NX PX` attempt.
    async fn try_set(&self, key: &str, token: &str, ttl_ms: u64) -> Result<bool, LockError> {
        let mut conn = self.conn.clone();
        let set: Option<String> = bounded(
            redis::cmd("SET")
                .arg(key)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .query_async(&mut conn),
        )
        .await?;
        Ok(set.is_some())
    }
}

fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[async_trait::async_trait]
impl SessionLocks for RedisLocks {
    async fn acquire(&self, session_id: &str, wait: Duration) -> Result<LockGuard, LockError> {
        let key = format!("{LOCK_PREFIX}{session_id}");
        let token = new_token();
        let mut backoff = Backoff::exponential(POLL_MIN, POLL_MAX, wait);
        loop {
            match self.try_set(&key, &token, self.ttl_ms()).await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    // The SET may still reach Redis later (a stalled server executes what it had
                    // buffered once it resumes) and would then hold the lock for a whole TTL
                    // with nobody to release it: take it back as soon as Redis answers again.
                    tokio::spawn(release_until_answered(Arc::new(Held {
                        conn: self.conn.clone(),
                        key,
                        token,
                    })));
                    return Err(e);
                }
            }
            if !backoff.wait().await {
                return Err(LockError::Timeout);
            }
        }
        let held = Arc::new(Held {
            conn: self.conn.clone(),
            key,
            token,
        });
        let refresher = tokio::spawn(refresh_loop(held.clone(), self.refresh, self.ttl_ms()));
        Ok(LockGuard::new(RedisGuard {
            held: Some(held),
            refresher,
        }))
    }

    async fn try_lead(&self, name: &str, term: Duration) -> Result<bool, LockError> {
        let term_ms = u64::try_from(term.as_millis())
            .unwrap_or(u64::MAX)
            .clamp(1, YEAR_MS);
        self.try_set(&format!("{LEADER_PREFIX}{name}"), &new_token(), term_ms)
            .await
    }
}

/// What a held lock needs to refresh and release itself.
struct Held {
    conn: ConnectionManager,
    key: String,
    token: String,
}

impl Held {
    async fn run(&self, script: &str, extra: Option<u64>) -> Result<i64, LockError> {
        let mut conn = self.conn.clone();
        let script = Script::new(script);
        let mut invocation = script.key(&self.key);
        invocation.arg(&self.token);
        if let Some(v) = extra {
            invocation.arg(v);
        }
        Ok(bounded(invocation.invoke_async(&mut conn)).await?)
    }
}

/// Keeps the lock alive while its guard lives. A transient Redis error is retried at the next
/// interval (the TTL leaves room for several); a lock found no longer ours ends the loop.
async fn refresh_loop(held: Arc<Held>, every: Duration, ttl_ms: u64) {
    loop {
        tokio::time::sleep(every).await;
        match held.run(REFRESH, Some(ttl_ms)).await {
            Ok(1) => {}
            Ok(_) => {
                tracing::warn!(key = %held.key, "session lock lost (expired and possibly taken by another request)");
                return;
            }
            Err(e) => tracing::warn!(key = %held.key, error = %e, "session lock refresh failed"),
        }
    }
}

/// Deletes the lock if it holds our token, retrying while Redis does not answer: a lock left
/// behind would block its session for a whole TTL. Done once the key is deleted, or once Redis
/// has twice answered that it is not ours, a second apart (by then anything sent before on another
/// connection has been executed too). Gives up after [`RELEASE_PATIENCE`]; the TTL then applies.
async fn release_until_answered(held: Arc<Held>) {
    let mut backoff = Backoff::fixed(Duration::from_secs(1), RELEASE_PATIENCE);
    let mut answered = 0;
    let mut warned = false;
    loop {
        match held.run(RELEASE, None).await {
            Ok(1) => return,
            Ok(_) => {
                answered += 1;
                if answered >= 2 {
                    return;
                }
            }
            Err(e) if !warned => {
                tracing::warn!(key = %held.key, error = %e, "session lock release failed; retrying");
                warned = true;
            }
            Err(_) => {}
        }
        if !backoff.wait().await {
            break;
        }
    }
    tracing::warn!(key = %held.key, "session lock not released; it expires after its TTL");
}

struct RedisGuard {
    held: Option<Arc<Held>>,
    refresher: JoinHandle<()>,
}

impl Drop for RedisGuard {
    fn drop(&mut self) {
        self.refresher.abort();
        let Some(held) = self.held.take() else {
            return;
        };
        // Drop cannot await: release in the background. Without a runtime (shutdown) the lock
        // simply expires after its TTL.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(release_until_answered(held));
        }
    }
}
