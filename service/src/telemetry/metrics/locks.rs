//! The per-session lock (`sessions::lock`): how long requests wait for it, and how often in vain.

use prometheus_client::registry::Registry;

use super::{Counter, Histogram, add, histogram};

pub struct LockMetrics {
    /// Time to acquire, acquired or not.
    pub waits: Histogram,
    /// Requests answered 409 because the lock stayed held.
    pub busy: Counter,
}

impl LockMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            waits: add(
                r,
                "session_lock_wait_seconds",
                "Time spent acquiring a session lock, acquired or not",
                histogram(),
            ),
            busy: add(
                r,
                "session_lock_busy",
                "Requests answered 409 because the session lock stayed held",
                Counter::default(),
            ),
        }
    }
}
