//! What replicas of one deployment agree on: who may work on a session now ([`lock`]), when each
//! session was last used ([`activity`]) and which replica sweeps ([`lock::SessionLocks::try_lead`]).
//!
//! Without `REDIS_URL` all of it lives in this process; with it, in one Redis that every replica
//! shares. Both go through [`Coordination::from_config`], so the locks and the activity records
//! use the same connection ([`redis`]) with the same timeouts, and one setting switches them
//! together: a replica never holds Redis locks beside in-process activity, or the reverse.
//!
//! # Layout
//! - [`lock`]: the [`lock::SessionLocks`] seam, in-process and Redis locks.
//! - [`activity`]: the [`activity::SessionActivity`] seam, in-process and Redis records, and the
//!   guards that touch a session before its lock is released.
//! - [`redis`]: the shared lazy connection and the bounded call every Redis operation goes through.

use std::sync::Arc;

pub mod activity;
pub mod lock;
pub mod redis;

use activity::{LocalActivity, RedisActivity, SessionActivity};
use lock::{LocalLocks, RedisLocks, SessionLocks};
use redis::RedisUnavailable;

use crate::config::Config;

/// The session locks and the activity tracker of this process, built together.
pub struct Coordination {
    pub locks: Arc<dyn SessionLocks>,
    pub activity: Arc<dyn SessionActivity>,
}

impl Coordination {
    /// In-process locks and activity (a single replica).
    pub fn local(config: &Config) -> Self {
        Self {
            locks: Arc::new(LocalLocks::default()),
            activity: Arc::new(LocalActivity::new(config.reaper.running_session_max_idle)),
        }
    }

    /// Redis-backed locks and activity over one connection when `REDIS_URL` is set, in-process
    /// otherwise. The connection is lazy: the service starts while Redis is down and answers 503
    /// until it is back. Fails only on a URL the client cannot use.
    pub fn from_config(config: &Config) -> Result<Self, RedisUnavailable> {
        let c = &config.coordination;
        let Some(url) = &c.redis_url else {
            return Ok(Self::local(config));
        };
        let conn = redis::connect(url)?;
        Ok(Self {
            locks: Arc::new(RedisLocks::new(conn.clone(), c.lock_ttl, c.lock_refresh)),
            activity: Arc::new(RedisActivity::new(
                conn,
                config.reaper.running_session_max_idle,
            )),
        })
    }
}
