//! The reaper: a background sweep that frees what clients left behind.
//!
//! Every `REAPER_INTERVAL_SECONDS` one replica (the one that wins [`SessionLocks::try_lead`]; with
//! Redis the claim lasts one interval, so replicas sweep once per interval between them) runs
//! [`Reaper::sweep`], which removes:
//! 1. stopped sessions stopped for longer than `SESSION_GRACE_SECONDS`;
//! 2. the oldest stopped sessions beyond `MAX_STOPPED_SESSIONS` (by stop time; a stop time that
//!    cannot be read sorts as newest, so it is evicted last);
//! 3. running sessions idle for longer than `RUNNING_SESSION_MAX_IDLE_SECONDS` (see [`activity`]
//!    for what "idle" means; a session never touched counts from its creation);
//! 4. orphaned egress gateways and networks: those whose egress token no sandbox carries, once the
//!    newest of them is older than the grace period (a session being created has its network and
//!    gateway before its sandbox);
//! 5. with `SESSION_MAX_LIFETIME_SECONDS`, sessions created longer ago than that, whatever they do
//!    (a backstop: taken even while a request holds their lock);
//! 6. snapshots past their TTL, then the oldest beyond `SNAPSHOT_MAX_COUNT` and
//!    `SNAPSHOT_MAX_BYTES`, and the payload of snapshots without a record (deleted ones, forks'
//!    once the forks are gone) and workspaces of sessions that are gone (see
//!    [`Snapshots::sweep`](crate::snapshots::Snapshots::sweep)).
//!
//! A paused session counts as stopped for the grace period, from its last request (the pause
//! itself); it is never taken for the stopped-session cap.
//!
//! Unclaimed warm-pool members are left alone (each sweep wakes the pool's refill, which
//! replaces dead and stale ones); claimed ones are sessions like any other.
//!
//! Safety: every removal takes the session's lock without waiting (busy: skipped until the next
//! sweep) and re-checks its condition under the lock, because a request may have restarted or used
//! the session since the listing. A request in flight holds the lock, so it never loses its session
//! (but to the lifetime backstop). Whether an idle session's background processes still run is
//! asked of its helper within [`PROCESS_CHECK`]: a sandbox that does not answer is not in use, and
//! the idle sessions are checked side by side, so no sandbox holds up the sweep.
//! Sessions are removed through [`Sessions::close`] with `force`, which also tears down an egress
//! session's gateway and network; orphans go through the same [`egress::teardown`], under the lock
//! [`egress::lock_key`].
//!
//! Failures are logged and counted, never fatal: a sweep that fails (or panics) is retried at the
//! next tick. Docker round trips per sweep: 1 list of sandboxes, 1 inspect per stopped sandbox
//! (the list API has no stop time), 1 list of gateways, 1 list of networks; per removal 1 inspect
//! (re-check) + the close (inspect + remove, plus the egress teardown).
//!
//! [`activity`]: crate::coordination::activity

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::time::unix_secs;

use futures::StreamExt;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::coordination::activity::SessionActivity;
use crate::coordination::lock::{LockError, SessionLocks};
use crate::egress;
use crate::engine::{
    ContainerInfo, ContainerStatus, DEPLOYMENT_LABEL, EGRESS_LABEL, EngineError, ROLE_LABEL,
    ROLE_SANDBOX,
};
use crate::sessions::{SessionError, Sessions};
use crate::telemetry::metrics::Metrics;

/// Concurrent inspects while reading stop times.
const INSPECT_CONCURRENCY: usize = 8;
/// Idle sessions checked (and removed) side by side.
const IDLE_CONCURRENCY: usize = 8;
/// Longest a snapshot's payload or a session's workspace may go without its record or container
/// before the sweep takes it for garbage (a snapshot or create in flight has them first).
pub const PAYLOAD_GUARD: Duration = Duration::from_secs(600);
/// Longest an idle session's helper may take to say whether background processes run.
pub const PROCESS_CHECK: Duration = Duration::from_secs(5);

/// The sweep's settings, from the `DAIV_SANDBOX_*` ones.
#[derive(Debug, Clone)]
pub struct Policy {
    pub interval: Duration,
    pub grace: Duration,
    pub max_stopped: usize,
    /// `None`: running sessions are never reaped for idleness.
    pub max_idle: Option<Duration>,
    /// `None`: sessions are never removed for their age alone.
    pub max_lifetime: Option<Duration>,
    /// Only this deployment's resources are swept (`DAIV_SANDBOX_DEPLOYMENT`): several
    /// deployments may share one engine (and one Redis).
    pub deployment: String,
}

impl Policy {
    pub fn from_config(c: &Config) -> Self {
        Self {
            interval: c.reaper.interval,
            grace: c.reaper.session_grace,
            max_stopped: usize::try_from(c.reaper.max_stopped_sessions).unwrap_or(usize::MAX),
            max_idle: c.reaper.running_session_max_idle,
            max_lifetime: c.reaper.session_max_lifetime,
            deployment: c.deployment.clone(),
        }
    }
}

/// What one sweep did; ids of removed sessions per reason, tokens of removed orphans.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Sweep {
    pub expired: Vec<String>,
    pub over_cap: Vec<String>,
    pub idle: Vec<String>,
    /// Removed for their age (`SESSION_MAX_LIFETIME_SECONDS`).
    pub lifetime: Vec<String>,
    pub orphans: Vec<String>,
    /// Snapshots removed by retention.
    pub snapshots: Vec<String>,
    /// Candidates skipped because a request held their lock.
    pub busy: Vec<String>,
    /// Removals that failed (logged); retried at the next sweep.
    pub failed: usize,
}

impl Sweep {
    pub fn removed(&self) -> usize {
        self.expired.len()
            + self.over_cap.len()
            + self.idle.len()
            + self.lifetime.len()
            + self.orphans.len()
    }

    /// Records what became of `id`, removed (or not) for `why`.
    fn record(&mut self, id: &str, why: Why, outcome: Outcome) {
        let id = id.to_string();
        match outcome {
            Outcome::Removed => match why {
                Why::Expired => self.expired.push(id),
                Why::OverCap => self.over_cap.push(id),
                Why::Idle => self.idle.push(id),
                Why::Lifetime => self.lifetime.push(id),
            },
            Outcome::Busy => self.busy.push(id),
            Outcome::Failed => self.failed += 1,
            Outcome::Kept => {}
        }
    }
}

/// What one guarded removal came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Removed,
    /// A request held its lock, or it is in use: kept until the next sweep.
    Busy,
    /// Back in use, or gone already.
    Kept,
    Failed,
}

#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    #[error("listing managed resources failed: {0}")]
    Engine(#[from] EngineError),
}

#[derive(Debug, Clone, Copy)]
enum Why {
    Expired,
    OverCap,
    Idle,
    Lifetime,
}

pub struct Reaper {
    sessions: Arc<Sessions>,
    /// What the replicas take turns on: the deployment, and in a fleet the engine too (each
    /// engine is swept on its own).
    lead: String,
    locks: Arc<dyn SessionLocks>,
    activity: Arc<dyn SessionActivity>,
    policy: Policy,
    metrics: Arc<Metrics>,
}

impl Reaper {
    /// A reaper over `sessions`: the same engine, locks and activity records as the API it runs
    /// beside.
    pub fn new(sessions: Arc<Sessions>) -> Self {
        let deployment = &sessions.config().deployment;
        let lead = match sessions.engine().id_prefix() {
            Some(engine) => format!("{deployment}@{engine}"),
            None => deployment.clone(),
        };
        Self {
            lead,
            locks: sessions.locks().clone(),
            activity: sessions.activity().clone(),
            policy: Policy::from_config(sessions.config()),
            metrics: sessions.metrics().clone(),
            sessions,
        }
    }

    /// Sweeps every interval (the first right away) until the task is aborted.
    pub fn spawn(self: Arc<Self>) -> JoinHandle<()> {
        tokio::spawn(async move {
            // `interval` panics on zero; the setting forbids it, a hand-built policy might not.
            let every = self.policy.interval.max(Duration::from_millis(100));
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let me = self.clone();
                // Its own task: a panic in one sweep is logged and the next tick still comes.
                if let Err(e) = tokio::spawn(async move { me.tick().await }).await {
                    tracing::error!(error = %e, "reaper: sweep crashed");
                }
            }
        })
    }

    /// One tick: sweep if this replica leads for this interval.
    pub async fn tick(&self) {
        match self.locks.try_lead(&self.lead, self.policy.interval).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!("reaper: another replica sweeps this interval");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "reaper: cannot claim the sweep; skipping this tick");
                return;
            }
        }
        tracing::debug!("reaper: sweeping");
        let swept = self.sweep(SystemTime::now()).await;
        match &swept {
            Ok(s) => {
                let reaped = s.expired.len() + s.over_cap.len() + s.idle.len() + s.lifetime.len();
                self.metrics.sessions_reaped.inc_by(reaped as u64);
                self.metrics.reaper_failures.inc_by(s.failed as u64);
            }
            Err(_) => {
                self.metrics.reaper_failures.inc();
            }
        }
        match swept {
            Ok(s) if s.removed() > 0 || !s.snapshots.is_empty() || s.failed > 0 => tracing::info!(
                expired = ?s.expired,
                over_cap = ?s.over_cap,
                idle = ?s.idle,
                lifetime = ?s.lifetime,
                orphans = ?s.orphans,
                snapshots = ?s.snapshots,
                busy = s.busy.len(),
                failed = s.failed,
                "reaper: sweep done"
            ),
            Ok(s) => tracing::debug!(busy = s.busy.len(), "reaper: nothing to remove"),
            Err(e) => tracing::warn!(error = %e, "reaper: sweep failed"),
        }
    }

    /// Label filters for this deployment's resources of `role` (and egress `token`).
    fn mine<'a>(&'a self, role: &'a str, token: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
        let mut labels = vec![
            (ROLE_LABEL, role),
            (DEPLOYMENT_LABEL, self.policy.deployment.as_str()),
        ];
        if let Some(token) = token {
            labels.push((EGRESS_LABEL, token));
        }
        labels
    }

    /// One sweep as of `now` (tests pass a clock of their own).
    pub async fn sweep(&self, now: SystemTime) -> Result<Sweep, ReaperError> {
        let mut out = Sweep::default();
        let engine = self.sessions.engine();
        let all = engine.list(&self.mine(ROLE_SANDBOX, None)).await?;
        // Unclaimed warm-pool members are not sessions: the pool's refill replaces those that
        // died or went stale (woken below). Their egress tokens still count as live.
        let sandboxes: Vec<ContainerInfo> = all
            .iter()
            .filter(|c| !crate::pool::is_unclaimed(c))
            .cloned()
            .collect();

        let sandboxes = match self.policy.max_lifetime {
            Some(max) => self.sweep_lifetime(sandboxes, max, now, &mut out).await,
            None => sandboxes,
        };
        self.sweep_stopped(&sandboxes, now, &mut out).await;
        if let Some(max_idle) = self.policy.max_idle {
            self.sweep_idle(&sandboxes, max_idle, now, &mut out).await;
        }
        let live: HashSet<String> = sandboxes.iter().map(|c| c.id.clone()).collect();
        self.activity.retain(&live).await;
        // Sessions removed by anyone (a force delete racing a process list, by hand) leave the
        // running-processes gauge here.
        self.metrics.retain_processes(&live);
        self.sweep_orphans(&all, now, &mut out).await?;
        self.sweep_snapshots(now, &mut out).await;
        self.sessions.pool().wake();
        Ok(out)
    }

    /// Snapshot retention and the collection of unused snapshot payload and workspaces; their
    /// gauges. Payload younger than the grace period (at most [`PAYLOAD_GUARD`]) is left: it may
    /// belong to a snapshot or session being made.
    async fn sweep_snapshots(&self, now: SystemTime, out: &mut Sweep) {
        let snapshots = self.sessions.snapshots();
        let guard = self.policy.grace.min(PAYLOAD_GUARD);
        match snapshots.sweep(now, guard).await {
            Ok(deleted) => out.snapshots = deleted,
            Err(e) => {
                tracing::warn!(error = %e, "reaper: snapshot sweep failed");
                out.failed += 1;
            }
        }
        if let Ok(all) = snapshots.list().await {
            self.metrics.snapshots_held.set(all.len() as u64);
            let bytes: u64 = all.iter().map(|s| s.size).sum();
            self.metrics.snapshot_bytes.set(bytes);
        }
    }

    async fn sweep_stopped(&self, sandboxes: &[ContainerInfo], now: SystemTime, out: &mut Sweep) {
        let engine = self.sessions.engine();
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
        for info in stopped {
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

    async fn sweep_idle(
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
    async fn sweep_lifetime(
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
            && stopped_at(info).is_some_and(|t| {
                t.saturating_add(i128::from(self.policy.grace.as_secs()) * NANOS) <= unix_nanos(now)
            })
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
    async fn remove_guarded(&self, id: &str, why: Why, now: SystemTime) -> Outcome {
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
        let info = match self.sessions.engine().inspect(id).await {
            Ok(i) => i,
            Err(EngineError::NotFound) => return Outcome::Kept,
            Err(e) => {
                tracing::warn!(session_id = %id, error = %e, "reaper: cannot re-check session");
                return Outcome::Failed;
            }
        };
        let still = match why {
            Why::Expired => self.expired(&info, now).await,
            Why::OverCap => !info.is_running() && !info.is_paused(),
            Why::Idle => info.is_running() && self.still_idle(&info, now).await,
            Why::Lifetime => true,
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
                    self.metrics.observe_processes(id, Some(n as u64));
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
        let outcome = match self.sessions.close(id, true).await {
            Ok(()) | Err(SessionError::NotFound) => {
                tracing::info!(session_id = %id, ?why, "reaper: session removed");
                self.activity.forget(id).await;
                self.metrics.observe_processes(id, None);
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

    /// Removes the triads' parts ([`egress::leftovers`]) whose token no sandbox carries, once
    /// the newest of them is past the grace period, through the same [`egress::teardown`] as a
    /// session close.
    async fn sweep_orphans(
        &self,
        sandboxes: &[ContainerInfo],
        now: SystemTime,
        out: &mut Sweep,
    ) -> Result<(), ReaperError> {
        let engine = self.sessions.engine();
        let leftovers = egress::leftovers(engine, &self.policy.deployment).await?;
        let live: HashSet<&str> = sandboxes
            .iter()
            .filter_map(|c| c.label(EGRESS_LABEL))
            .collect();
        let now_secs = unix_secs(now);
        let grace = secs_i64(self.policy.grace);
        for (token, found) in &leftovers {
            let token = token.as_str();
            // An unknown creation time counts as now.
            let created = found.newest(now_secs);
            if live.contains(token) || created.saturating_add(grace) > now_secs {
                continue;
            }
            let held = match self
                .locks
                .acquire(&egress::lock_key(token), Duration::ZERO)
                .await
            {
                Ok(h) => h,
                Err(LockError::Timeout) => {
                    out.busy.push(egress::lock_key(token));
                    continue;
                }
                Err(e) => {
                    tracing::warn!(token, error = %e, "reaper: cannot lock egress token");
                    out.failed += 1;
                    continue;
                }
            };
            // Re-check under the lock: a sandbox may have appeared for this token since.
            match engine.list(&self.mine(ROLE_SANDBOX, Some(token))).await {
                Ok(found) if found.is_empty() => {}
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(token, error = %e, "reaper: cannot re-check egress token");
                    out.failed += 1;
                    continue;
                }
            }
            let ok = egress::teardown(engine, &found.parts).await;
            drop(held);
            if ok {
                tracing::info!(token, "reaper: orphaned egress gateway/network removed");
                out.orphans.push(token.to_string());
            } else {
                tracing::warn!(
                    token,
                    "reaper: orphaned egress gateway/network not all removed"
                );
                out.failed += 1;
            }
        }
        Ok(())
    }
}

/// How long a running session has been idle as of `now`: since its last touch, or its creation
/// when never touched, but never since before the tracker began recording. `None` when that moment
/// is after `now` or unknown.
fn idle_for(
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
fn stopped_at(info: &ContainerInfo) -> Option<i128> {
    let finished = info.finished_at.as_deref().and_then(|t| {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
            .ok()
            .map(|t| t.unix_timestamp_nanos())
            .filter(|n| *n > 0)
    });
    match (finished, &info.status) {
        (Some(t), _) => Some(t),
        (None, ContainerStatus::Created) => info.created.map(|s| i128::from(s) * NANOS),
        (None, _) => None,
    }
}

const NANOS: i128 = 1_000_000_000;

fn unix_nanos(t: SystemTime) -> i128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX))
        .unwrap_or(0)
}

fn secs_i64(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
