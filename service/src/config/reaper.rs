//! How long sessions live: the reaper's schedule and the age, count and idleness past which it
//! removes them.

use std::time::Duration;

use super::parse::Parser;

#[derive(Debug, Clone)]
pub struct ReaperConfig {
    pub enabled: bool,
    pub interval: Duration,
    /// How long a stopped session is kept.
    pub session_grace: Duration,
    pub max_stopped_sessions: u32,
    /// `None` disables idle reaping of running sessions.
    pub running_session_max_idle: Option<Duration>,
    /// `None` (the default) disables it: age since creation past which a session is removed
    /// whatever it does (a backstop for sessions kept busy for good).
    pub session_max_lifetime: Option<Duration>,
}

impl ReaperConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let enabled = p.bool_or("REAPER_ENABLED", true);
        let interval = p.seconds_or("REAPER_INTERVAL_SECONDS", 600);
        if interval.is_zero() {
            p.fail("REAPER_INTERVAL_SECONDS", "0", "must be at least 1");
        }
        let session_grace = p.seconds_or("SESSION_GRACE_SECONDS", 43_200);
        let max_stopped_sessions = p.parse_or::<u32>("MAX_STOPPED_SESSIONS", 50);
        let running_session_max_idle =
            Some(p.seconds_or("RUNNING_SESSION_MAX_IDLE_SECONDS", 14_400)).filter(|d| !d.is_zero());
        let session_max_lifetime =
            Some(p.seconds_or("SESSION_MAX_LIFETIME_SECONDS", 0)).filter(|d| !d.is_zero());

        Self {
            enabled,
            interval,
            session_grace,
            max_stopped_sessions,
            running_session_max_idle,
            session_max_lifetime,
        }
    }
}
