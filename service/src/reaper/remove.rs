//! Which sessions a sweep takes and how: the stopped past the grace period or beyond the cap,
//! the idle, those past their lifetime; each removal guarded by the session's lock and its
//! condition read again under it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;

use super::{IDLE_CONCURRENCY, INSPECT_CONCURRENCY, Outcome, PROCESS_CHECK, Reaper, Sweep, Why};
use crate::coordination::lock::LockError;
use crate::engine::{ContainerInfo, ContainerStatus, EngineError};
use crate::sessions::SessionError;
use crate::time::unix_secs;

impl Reaper {
    pub(super) async fn sweep_stopped(
        &self,
        sandboxes: &[ContainerInfo],
        now: SystemTime,
        out: &mut Sweep,
    ) {
        let engine = &*self.engine;
        let ids: Vec<&str> = sandboxes
            .iter()
            .filter(|c| !c.is_running())
            .map(|c| c.id.as_str())
            .collect();
        let mut stopped = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(INSPECT_CONCURRENCY) {
            let found = futures::future::join_all(chunk.iter().map(|id| engine.inspect(id))).await;
            stopped.extend(found.into_iter().filter_map(Result::ok));
        }

        let mut survivors = Vec::new();
        // A create in flight is not a stopped session: its sandbox is `created` until started.
        for info in stopped.into_iter().filter(|c| !creating(c, now)) {
            if self.expired(&info, now).await {
                let outcome = self.remove_guarded(&info.id, Why::Expired, now).await;
                out.record(&info.id, Why::Expired, outcome);
            } else if !info.is_paused() {
                survivors.push(info);
            }
        }
        if survivors.len() > self.policy.max_stopped {
            let now_nanos = unix_nanos(now);
            survivors.sort_by_key(|c| stopped_at(c).unwrap_or(now_nanos));
            let excess = survivors.len() - self.policy.max_stopped;
            for info in &survivors[..excess] {
                let outcome = self.remove_guarded(&info.id, Why::OverCap, now).await;
                out.record(&info.id, Why::OverCap, outcome);
            }
        }
    }

    pub(super) async fn sweep_idle(
        &self,
        sandboxes: &[ContainerInfo],
        max_idle: Duration,
        now: SystemTime,
        out: &mut Sweep,
    ) {
        let running: Vec<&ContainerInfo> = sandboxes.iter().filter(|c| c.is_running()).collect();
        if running.is_empty() {
            return;
        }
        let ids: Vec<String> = running.iter().map(|c| c.id.clone()).collect();
        let seen = match self.activity.last_seen(&ids).await {
            Ok(s) => s,
            Err(e) => {
                // Unknown is not idle: skip rather than guess.
                tracing::warn!(error = %e, "reaper: activity unreadable; idle sessions kept this sweep");
                return;
            }
        };
        let since = match self.activity.since().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "reaper: activity unreadable; idle sessions kept this sweep");
                return;
            }
        };
        let idle: Vec<String> = running
            .into_iter()
            .zip(seen)
            .filter(|(info, seen)| {
                idle_for(*seen, info.created, since, now).is_some_and(|d| d >= max_idle)
            })
            .map(|(info, _)| info.id.clone())
            .collect();
        // Side by side: each asks its helper about processes, and one that does not answer
        // costs its own check's deadline, not the others'.
        let checks = idle.into_iter().map(|id| {
            Box::pin(async move {
                let outcome = self.remove_guarded(&id, Why::Idle, now).await;
                (id, outcome)
            })
        });
        let outcomes: Vec<(String, Outcome)> = futures::stream::iter(checks)
            .buffer_unordered(IDLE_CONCURRENCY)
            .collect()
            .await;
        for (id, outcome) in outcomes {
            out.record(&id, Why::Idle, outcome);
        }
    }

    /// Removes the sessions past the lifetime backstop; returns the others.
    pub(super) async fn sweep_lifetime(
        &self,
        sandboxes: Vec<ContainerInfo>,
        max: Duration,
        now: SystemTime,
        out: &mut Sweep,
    ) -> Vec<ContainerInfo> {
        let now_secs = unix_secs(now);
        let max = secs_i64(max);
        let mut kept = Vec::with_capacity(sandboxes.len());
        for info in sandboxes {
            let old = info
                .created
                .is_some_and(|c| c.saturating_add(max) <= now_secs);
            if old {
                let outcome = self.remove_guarded(&info.id, Why::Lifetime, now).await;
                out.record(&info.id, Why::Lifetime, outcome);
            } else {
                kept.push(info);
            }
        }
        kept
    }

    /// Ends the sessions past their own deadline (removed, or paused: a paused one stays in the
    /// list, for the grace period's reaping) and removes the records of sessions that are gone;
    /// returns the sessions left.
    pub(super) async fn sweep_deadlines(
        &self,
        sandboxes: Vec<ContainerInfo>,
        now: SystemTime,
        out: &mut Sweep,
    ) -> Vec<ContainerInfo> {
        let volumes = match self.sessions.record_volumes_all().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "reaper: session records unreadable; deadlines not enforced this sweep");
                out.failed += 1;
                return sandboxes;
            }
        };
        let records = crate::sessions::Sessions::newest_of(&volumes);
        let now_secs = unix_secs(now);
        let mut kept = Vec::with_capacity(sandboxes.len());
        for info in sandboxes {
            let due = records
                .get(&info.id)
                .is_some_and(|r| r.deadline.is_some_and(|d| d <= now_secs));
            // A deadline to come, perhaps another replica's: the deadline watch takes it then.
            if let Some(d) = records.get(&info.id).and_then(|r| r.deadline)
                && d > now_secs
                && !info.is_paused()
            {
                self.sessions.deadlines().arm(&info.id, d);
            }
            // A paused session stays paused: its deadline did its work.
            if !due
                || info.is_paused()
                || (!info.is_running() && self.pauses_at(&records, &info.id))
            {
                kept.push(info);
                continue;
            }
            let outcome = self.remove_guarded(&info.id, Why::Deadline, now).await;
            out.record(&info.id, Why::Deadline, outcome);
            if outcome != Outcome::Removed {
                kept.push(info);
            }
        }
        // Records of sessions that are gone, once past the grace a create in flight needs (its
        // container exists before its record, but this sweep listed containers first).
        let live: std::collections::HashSet<&str> = kept.iter().map(|c| c.id.as_str()).collect();
        let guard_ms = i64::try_from(self.policy.grace.min(super::PAYLOAD_GUARD).as_millis())
            .unwrap_or(i64::MAX);
        let now_ms = unix_secs(now).saturating_mul(1000);
        for (session, volume, record) in volumes {
            if live.contains(session.as_str())
                || record.written_ms.saturating_add(guard_ms) > now_ms
            {
                continue;
            }
            if let Err(e) = self.sessions.remove_record_volume(&volume).await {
                tracing::debug!(volume, error = %e, "reaper: a gone session's record not removed");
            }
        }
        kept
    }

    fn pauses_at(
        &self,
        records: &std::collections::HashMap<String, crate::sessions::Record>,
        id: &str,
    ) -> bool {
        records
            .get(id)
            .is_some_and(|r| r.on_timeout == crate::api::OnTimeout::Pause)
    }

    /// Stopped (or paused, counted from its last request) for longer than the grace period.
    async fn expired(&self, info: &ContainerInfo, now: SystemTime) -> bool {
        if info.is_paused() {
            let seen = self
                .activity
                .last_seen(std::slice::from_ref(&info.id))
                .await;
            let since = self.activity.since().await;
            return match (seen, since) {
                (Ok(seen), Ok(since)) => {
                    let seen = seen.into_iter().next().flatten();
                    idle_for(seen, info.created, since, now).is_some_and(|d| d >= self.policy.grace)
                }
                _ => false,
            };
        }
        !info.is_running()
            && !creating(info, now)
            && stopped_at(info).is_some_and(|t| {
                t.saturating_add(i128::from(self.policy.grace.as_secs()) * NANOS) <= unix_nanos(now)
            })
    }

    /// Still past its deadline, read again under the lock (it may have been moved since), and
    /// not a stopped session its deadline would only pause.
    async fn past_deadline(&self, info: &ContainerInfo, now: SystemTime) -> bool {
        matches!(
            self.sessions.record(&info.id).await,
            Ok(Some(r)) if r.deadline.is_some_and(|d| d <= unix_secs(now))
                && (info.is_running() || r.on_timeout != crate::api::OnTimeout::Pause)
        )
    }

    /// Still idle, read again under the lock: a request may have come and gone since the listing.
    async fn still_idle(&self, info: &ContainerInfo, now: SystemTime) -> bool {
        let Some(max_idle) = self.policy.max_idle else {
            return false;
        };
        let seen = self
            .activity
            .last_seen(std::slice::from_ref(&info.id))
            .await;
        let since = self.activity.since().await;
        match (seen, since) {
            (Ok(seen), Ok(since)) => {
                let seen = seen.into_iter().next().flatten();
                idle_for(seen, info.created, since, now).is_some_and(|d| d >= max_idle)
            }
            _ => false,
        }
    }

    /// Removes a session if its lock is free and its condition still holds under the lock (the
    /// lifetime backstop takes a busy session too).
    pub(super) async fn remove_guarded(&self, id: &str, why: Why, now: SystemTime) -> Outcome {
        let held = match self.locks.acquire(id, Duration::ZERO).await {
            Ok(h) => Some(h),
            Err(LockError::Timeout) if matches!(why, Why::Lifetime) => None,
            Err(LockError::Timeout) => {
                tracing::debug!(session_id = %id, ?why, "reaper: session busy; kept");
                return Outcome::Busy;
            }
            Err(e) => {
                tracing::warn!(session_id = %id, error = %e, "reaper: cannot lock session");
                return Outcome::Failed;
            }
        };
        let info = match self.engine.inspect(id).await {
            Ok(i) => i,
            Err(EngineError::NotFound) => return Outcome::Kept,
            Err(e) => {
                tracing::warn!(session_id = %id, error = %e, "reaper: cannot re-check session");
                return Outcome::Failed;
            }
        };
        let still = match why {
            Why::Expired => self.expired(&info, now).await,
            Why::OverCap => !info.is_running() && !info.is_paused() && !creating(&info, now),
            Why::Idle => info.is_running() && self.still_idle(&info, now).await,
            Why::Lifetime => true,
            // As the sweep picks them: a paused session stays paused (its client's pause, or its
            // deadline's), a stopped one that pauses on timeout is left for the grace period.
            Why::Deadline => !info.is_paused() && self.past_deadline(&info, now).await,
        };
        if !still {
            tracing::debug!(session_id = %id, ?why, "reaper: session back in use; kept");
            return Outcome::Kept;
        }
        // A background job still running is use, however long since the last request; a
        // sandbox that does not say so in time is not in use.
        if matches!(why, Why::Idle) {
            let live = tokio::time::timeout(PROCESS_CHECK, self.sessions.live_processes(id)).await;
            match live {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => {
                    self.metrics.processes.observe(id, Some(n as u64));
                    tracing::debug!(session_id = %id, processes = n, "reaper: background processes run; kept");
                    self.activity.touch(id).await;
                    return Outcome::Busy;
                }
                Ok(Err(e)) => {
                    tracing::debug!(session_id = %id, error = %e, "reaper: cannot list processes")
                }
                Err(_) => tracing::info!(
                    session_id = %id,
                    "reaper: the session's helper did not say within {PROCESS_CHECK:?} whether processes run; taken as idle"
                ),
            }
        }
        if matches!(why, Why::Deadline)
            && matches!(self.sessions.record(id).await, Ok(Some(r)) if r.on_timeout == crate::api::OnTimeout::Pause)
        {
            let outcome = match self.sessions.pause_at_deadline(id).await {
                Ok(()) => {
                    tracing::info!(session_id = %id, "reaper: session paused at its deadline");
                    // Done: a request that thaws it is not to see it paused again; the thaw
                    // arms a new deadline (see `Sessions::clear_deadline`).
                    if let Err(e) = self.sessions.clear_deadline(id).await {
                        tracing::warn!(session_id = %id, error = %e, "reaper: a paused session's deadline not cleared");
                    }
                    Outcome::Paused
                }
                Err(SessionError::NotFound) => Outcome::Kept,
                Err(e) => {
                    tracing::warn!(session_id = %id, error = %e, "reaper: pausing at the deadline failed");
                    Outcome::Failed
                }
            };
            drop(held);
            return outcome;
        }
        let outcome = match self.sessions.remove(id).await {
            Ok(()) | Err(SessionError::NotFound) => {
                tracing::info!(session_id = %id, ?why, "reaper: session removed");
                self.activity.forget(id).await;
                self.metrics.processes.observe(id, None);
                Outcome::Removed
            }
            Err(e) => {
                tracing::warn!(session_id = %id, error = %e, "reaper: session removal failed");
                Outcome::Failed
            }
        };
        drop(held);
        outcome
    }
}

/// How long a running session has been idle as of `now`: since its last touch, or its creation
/// when never touched, but never since before the tracker began recording. `None` when that moment
/// is after `now` or unknown.
pub(super) fn idle_for(
    seen: Option<SystemTime>,
    created: Option<i64>,
    since: SystemTime,
    now: SystemTime,
) -> Option<Duration> {
    let from = match seen {
        Some(t) => t,
        None => UNIX_EPOCH.checked_add(Duration::from_secs(u64::try_from(created?).ok()?))?,
    };
    now.duration_since(from.max(since)).ok()
}

/// When a non-running sandbox stopped, in Unix nanoseconds (several sessions stopped within one
/// second must still sort oldest first): its `FinishedAt`, or its creation for one that never
/// started.
pub(super) fn stopped_at(info: &ContainerInfo) -> Option<i128> {
    let finished = info
        .finished_at
        .as_deref()
        .and_then(crate::time::parse_rfc3339)
        .map(|t| t.unix_timestamp_nanos())
        .filter(|n| *n > 0);
    match (finished, &info.status) {
        (Some(t), _) => Some(t),
        (None, ContainerStatus::Created) => info.created.map(|s| i128::from(s) * NANOS),
        (None, _) => None,
    }
}

/// Created, never started, and younger than [`CREATE_GUARD`](super::CREATE_GUARD): a create in
/// flight (the sweep listed it between its create and its start).
pub(super) fn creating(info: &ContainerInfo, now: SystemTime) -> bool {
    let never_started = info
        .finished_at
        .as_deref()
        .and_then(crate::time::parse_rfc3339)
        .is_none_or(|t| t.unix_timestamp_nanos() <= 0);
    matches!(info.status, ContainerStatus::Created)
        && never_started
        && info.created.is_some_and(|c| {
            // The creation second is truncated: one more second for what it dropped.
            (i128::from(c) + 1) * NANOS + super::CREATE_GUARD.as_nanos() as i128 > unix_nanos(now)
        })
}

pub(super) const NANOS: i128 = 1_000_000_000;

pub(super) fn unix_nanos(t: SystemTime) -> i128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX))
        .unwrap_or(0)
}

pub(super) fn secs_i64(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}
