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
//! 6. sessions past their own deadline (`timeout_seconds`): removed, or paused when their
//!    `on_timeout` says so (then reaped as any paused session); records of sessions that are gone
//!    (see [`crate::sessions`]'s `record`). The [`DeadlineWatch`] does this within a second of
//!    each deadline, with or without the sweeps; the sweep is the backstop and arms the watch
//!    with the deadlines it finds;
//! 7. snapshots past their TTL, then the oldest beyond `SNAPSHOT_MAX_COUNT` and
//!    `SNAPSHOT_MAX_BYTES`, and the payload of snapshots without a record (deleted ones, forks'
//!    once the forks are gone) and workspaces of sessions that are gone (see
//!    [`Snapshots::sweep`](crate::snapshots::Snapshots::sweep)).
//!
//! A paused session counts as stopped for the grace period, from its last request (the pause
//! itself); it is never taken for the stopped-session cap. A sandbox created and never started
//! is a create in flight for [`CREATE_GUARD`], then stopped since its creation.
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
//! Sessions are removed through [`Sessions::remove`] (what a force close does), which also tears
//! down an egress session's gateway and network; orphans go through the same
//! [`egress::teardown`], under the lock [`egress::lock_key`].
//!
//! A reaper is built from its engine's parts ([`Parts`]) where that engine's stack is wired (see
//! [`crate::fleet`]).
//!
//! # Layout
//! - `remove`: which sessions a sweep takes, and the guarded removal.
//!
//! Failures are logged and counted, never fatal: a sweep that fails (or panics) is retried at the
//! next tick. Docker round trips per sweep: 1 list of sandboxes, 1 inspect per stopped sandbox
//! (the list API has no stop time), 1 list of gateways, 1 list of networks; per removal 1 inspect
//! (re-check) + the close (inspect + remove, plus the egress teardown).
//!
//! [`activity`]: crate::coordination::activity

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::config::Config;
use crate::coordination::activity::SessionActivity;
use crate::coordination::lock::{LockError, SessionLocks};
use crate::egress;
use crate::engine::{
    ContainerEngine, ContainerInfo, DEPLOYMENT_LABEL, EGRESS_LABEL, EngineError, ROLE_LABEL,
    ROLE_SANDBOX,
};
use crate::pool::Pool;
use crate::sessions::Sessions;
use crate::snapshots::Snapshots;
use crate::telemetry::metrics::Metrics;
use crate::time::unix_secs;

mod remove;

use remove::secs_i64;

/// A sweep every interval (the first right away), while the cell's stack runs.
impl crate::background::Background for Reaper {
    fn name(&self) -> &'static str {
        "reaper"
    }

    async fn round(self: Arc<Self>) -> std::ops::ControlFlow<()> {
        self.tick().await;
        std::ops::ControlFlow::Continue(())
    }

    async fn pause(&self) {
        // The setting forbids zero; a hand-built policy might not.
        tokio::time::sleep(self.policy.interval.max(Duration::from_millis(100))).await;
    }
}

/// The deadline watch: each session ended (or paused) within a second of its deadline, as
/// [`crate::sessions::Deadlines`] says it comes due, by the sweep's own guarded removal (the
/// record re-read under the lock). Every replica watches the deadlines it knows; the lock keeps
/// two from acting on one session.
pub struct DeadlineWatch(pub Arc<Reaper>);

/// A session busy at its deadline is tried again this much later; one that failed, later still
/// (the sweep retries it too).
const BUSY_RETRY_SECS: i64 = 1;
const FAILED_RETRY_SECS: i64 = 30;

impl crate::background::Background for DeadlineWatch {
    fn name(&self) -> &'static str {
        "deadline watch"
    }

    async fn round(self: Arc<Self>) -> std::ops::ControlFlow<()> {
        let deadlines = self.0.sessions.deadlines().clone();
        deadlines.wait(crate::time::unix_millis()).await;
        let now = crate::time::unix_now();
        for id in deadlines.take_due(now) {
            let outcome = self
                .0
                .remove_guarded(&id, Why::Deadline, SystemTime::now())
                .await;
            match outcome {
                Outcome::Removed | Outcome::Paused => {
                    self.0.metrics.sessions.reaped.inc();
                }
                Outcome::Busy => deadlines.arm(&id, now + BUSY_RETRY_SECS),
                Outcome::Failed => {
                    self.0.metrics.sessions.reaper_failures.inc();
                    deadlines.arm(&id, now + FAILED_RETRY_SECS);
                }
                Outcome::Kept => {}
            }
        }
        std::ops::ControlFlow::Continue(())
    }

    async fn pause(&self) {}
}

#[cfg(test)]
use remove::{NANOS, creating, idle_for, stopped_at};

/// Concurrent inspects while reading stop times.
const INSPECT_CONCURRENCY: usize = 8;
/// Idle sessions checked (and removed) side by side.
const IDLE_CONCURRENCY: usize = 8;
/// Longest a snapshot's payload or a session's workspace may go without its record or container
/// before the sweep takes it for garbage (a snapshot or create in flight has them first).
pub const PAYLOAD_GUARD: Duration = Duration::from_secs(600);
/// Longest a sandbox may stay created and never started while its create is in flight (the
/// create, the skeleton's put and the start are engine calls of up to 120 s each): younger, it is
/// neither expired nor counted against the stopped cap, however short the grace period. Counted
/// from its creation second, which the engine reports truncated.
pub const CREATE_GUARD: Duration = Duration::from_secs(600);
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
    /// Past their own deadline: removed, and paused.
    pub timed_out: Vec<String>,
    pub paused: Vec<String>,
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
            + self.timed_out.len()
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
                Why::Deadline => self.timed_out.push(id),
            },
            Outcome::Paused => self.paused.push(id),
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
    /// Paused at its deadline (`on_timeout: pause`).
    Paused,
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
    /// Its own deadline passed.
    Deadline,
}

/// What one engine's reaper sweeps with: that engine's stack (its engine, sessions, warm pool
/// and snapshots) and the locks, activity records and metrics the API beside it shares.
pub struct Parts {
    pub engine: Arc<dyn ContainerEngine>,
    /// Removes sessions (as a force close does) and asks their helpers about processes.
    pub sessions: Arc<Sessions>,
    pub pool: Arc<Pool>,
    pub snapshots: Arc<Snapshots>,
    pub locks: Arc<dyn SessionLocks>,
    pub activity: Arc<dyn SessionActivity>,
    pub metrics: Arc<Metrics>,
}

pub struct Reaper {
    engine: Arc<dyn ContainerEngine>,
    sessions: Arc<Sessions>,
    pool: Arc<Pool>,
    snapshots: Arc<Snapshots>,
    /// What the replicas take turns on: the deployment, and in a fleet the engine too (each
    /// engine is swept on its own).
    lead: String,
    locks: Arc<dyn SessionLocks>,
    activity: Arc<dyn SessionActivity>,
    policy: Policy,
    metrics: Arc<Metrics>,
}

impl Reaper {
    /// A reaper over `parts`, sweeping by `policy`.
    pub fn new(parts: Parts, policy: Policy) -> Self {
        let lead = match parts.engine.id_prefix() {
            Some(engine) => format!("{}@{engine}", policy.deployment),
            None => policy.deployment.clone(),
        };
        Self {
            engine: parts.engine,
            sessions: parts.sessions,
            pool: parts.pool,
            snapshots: parts.snapshots,
            lead,
            locks: parts.locks,
            activity: parts.activity,
            policy,
            metrics: parts.metrics,
        }
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
                let reaped = s.expired.len()
                    + s.over_cap.len()
                    + s.idle.len()
                    + s.lifetime.len()
                    + s.timed_out.len();
                self.metrics.sessions.reaped.inc_by(reaped as u64);
                self.metrics
                    .sessions
                    .reaper_failures
                    .inc_by(s.failed as u64);
            }
            Err(_) => {
                self.metrics.sessions.reaper_failures.inc();
            }
        }
        match swept {
            Ok(s)
                if s.removed() > 0
                    || !s.paused.is_empty()
                    || !s.snapshots.is_empty()
                    || s.failed > 0 =>
            {
                tracing::info!(
                    expired = ?s.expired,
                    over_cap = ?s.over_cap,
                    idle = ?s.idle,
                    lifetime = ?s.lifetime,
                    timed_out = ?s.timed_out,
                    paused = ?s.paused,
                    orphans = ?s.orphans,
                    snapshots = ?s.snapshots,
                    busy = s.busy.len(),
                    failed = s.failed,
                    "reaper: sweep done"
                )
            }
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
        let all = self.engine.list(&self.mine(ROLE_SANDBOX, None)).await?;
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
        let sandboxes = self.sweep_deadlines(sandboxes, now, &mut out).await;
        self.sweep_stopped(&sandboxes, now, &mut out).await;
        if let Some(max_idle) = self.policy.max_idle {
            self.sweep_idle(&sandboxes, max_idle, now, &mut out).await;
        }
        let live: HashSet<String> = sandboxes.iter().map(|c| c.id.clone()).collect();
        self.activity.retain(&live).await;
        // Sessions removed by anyone (a force delete racing a process list, by hand) leave the
        // running-processes gauge here.
        self.metrics.processes.retain(&live);
        self.sweep_orphans(&all, now, &mut out).await?;
        self.sweep_snapshots(now, &mut out).await;
        self.pool.wake();
        Ok(out)
    }

    /// Snapshot retention and the collection of unused snapshot payload and workspaces; their
    /// gauges. Payload younger than the grace period (at most [`PAYLOAD_GUARD`]) is left: it may
    /// belong to a snapshot or session being made.
    async fn sweep_snapshots(&self, now: SystemTime, out: &mut Sweep) {
        let snapshots = &self.snapshots;
        let guard = self.policy.grace.min(PAYLOAD_GUARD);
        match snapshots.sweep(now, guard).await {
            Ok(deleted) => out.snapshots = deleted,
            Err(e) => {
                tracing::warn!(error = %e, "reaper: snapshot sweep failed");
                out.failed += 1;
            }
        }
        // The shared helper's writers a crash left, and its other builds' volumes.
        if let Some(helper) = self.pool.factory().shared_helper() {
            let now = crate::time::unix_secs(now);
            let guard = i64::try_from(guard.as_secs()).unwrap_or(i64::MAX);
            let old = |created: Option<i64>| created.unwrap_or(now).saturating_add(guard) <= now;
            if let Err(e) = helper.sweep(old).await {
                tracing::warn!(error = %e, "reaper: shared helper sweep failed");
                out.failed += 1;
            }
        }
        if let Ok(all) = snapshots.list().await {
            self.metrics.snapshots.held.set(all.len() as u64);
            let bytes: u64 = all.iter().map(|s| s.size).sum();
            self.metrics.snapshots.bytes.set(bytes);
        }
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
        let engine = &*self.engine;
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

#[cfg(test)]
mod tests;
