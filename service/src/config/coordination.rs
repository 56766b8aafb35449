//! What replicas share: the Redis that holds the session locks, the activity records and the
//! reaper's leadership (unset: everything stays in this process), and how long a lock is held and
//! waited for.

use std::time::Duration;

use super::parse::Parser;
use super::{PREFIX, Secret};

#[derive(Debug, Clone)]
pub struct CoordinationConfig {
    /// `None`: in-process locks and activity (a single replica).
    pub redis_url: Option<Secret>,
    pub lock_ttl: Duration,
    /// How long a request waits for its session's lock before a 409.
    pub lock_wait: Duration,
    pub lock_refresh: Duration,
}

impl CoordinationConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let redis_url = p.get("REDIS_URL").map(Secret::new);
        if let Some(url) = &redis_url
            && !(url.expose().starts_with("redis://")
                || url.expose().starts_with("rediss://")
                || url.expose().starts_with("unix://"))
        {
            p.errors.push(format!(
                "{PREFIX}REDIS_URL: expected a redis://, rediss:// or unix:// URL (value not shown)"
            ));
        }
        let lock_ttl = p.seconds_or("SESSION_LOCK_TTL_SECONDS", 900);
        if lock_ttl.is_zero() {
            p.fail("SESSION_LOCK_TTL_SECONDS", "0", "must be at least 1");
        }
        let lock_wait = p.float_seconds_or("SESSION_LOCK_WAIT_SECONDS", 30.0);
        let lock_refresh = p.float_seconds_or("SESSION_LOCK_REFRESH_SECONDS", 30.0);

        Self {
            redis_url,
            lock_ttl,
            lock_wait,
            lock_refresh,
        }
    }
}
