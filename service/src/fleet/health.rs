//! A fleet engine's health: pinged every [`HEALTH_EVERY`] (an answer within [`PING_TIMEOUT`] or
//! the check failed), flipped up or down only after `ENGINE_UP_AFTER` / `ENGINE_DOWN_AFTER`
//! checks in a row say so ([`Health`], the rule of pingora's `observe_health`): one slow ping is
//! not an outage, and an outage cuts every call in flight. An up engine's sessions are counted
//! every check and its runtimes and images read now and then, for placement.

use std::ops::ControlFlow;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::cell::Cell;
use super::connector::Connector;
use crate::engine::metered::MeteredEngine;
use crate::engine::scoped::Link;
use crate::engine::{
    ContainerEngine, ContainerStatus, DEPLOYMENT_LABEL, MEMORY_LABEL, ROLE_LABEL, ROLE_SANDBOX,
};
use crate::telemetry::metrics::{EngineLabels, Metrics};

/// How often each engine is pinged.
pub const HEALTH_EVERY: Duration = Duration::from_secs(1);
/// A ping not answered within this is a failed check.
pub const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a (re)connection to an engine may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Runtimes and images are read again every this many checks.
const INFO_EVERY: u32 = 10;

/// Whether an engine is up, from consecutive observations: a state flips only when `after` of
/// them in a row disagree with it; one that agrees starts the count again.
#[derive(Debug, Clone)]
pub struct Health {
    up: bool,
    /// Observations in a row that disagreed with `up`.
    streak: u32,
    down_after: u32,
    up_after: u32,
}

impl Health {
    /// Starting `up` or not, flipping down after `down_after` failed checks in a row and up
    /// after `up_after` answered ones (each at least 1).
    pub fn new(up: bool, down_after: u32, up_after: u32) -> Self {
        Self {
            up,
            streak: 0,
            down_after: down_after.max(1),
            up_after: up_after.max(1),
        }
    }

    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Counts one check (`ok`: the engine answered); true when the state flipped.
    pub fn observe(&mut self, ok: bool) -> bool {
        if ok == self.up {
            self.streak = 0;
            return false;
        }
        self.streak += 1;
        let after = if ok { self.up_after } else { self.down_after };
        if self.streak < after {
            return false;
        }
        self.up = ok;
        self.streak = 0;
        true
    }

    /// Checks in a row that disagreed with the state so far.
    pub fn streak(&self) -> u32 {
        self.streak
    }
}

/// What every engine's health check uses.
pub(super) struct Probe {
    pub connector: Arc<dyn Connector>,
    pub metrics: Arc<Metrics>,
    /// Only this deployment's sandboxes are counted.
    pub deployment: String,
    pub down_after: u32,
    pub up_after: u32,
}

/// One engine's health checks, every [`HEALTH_EVERY`] while its cell lives: a ping (a new
/// client first when it has none), its runtimes and images read before it takes its first
/// session and every [`INFO_EVERY`] checks, its state flipped after enough checks in a row, its
/// sessions counted. A check restarted after a panic goes on from the engine's state.
pub(super) struct Check {
    cell: Weak<Cell>,
    probe: Arc<Probe>,
    link: Arc<Link>,
    labels: EngineLabels,
    /// The engine's health and the count of checks (rounds run one at a time).
    state: tokio::sync::Mutex<(Health, u32)>,
    /// When the last check began: the next is due [`HEALTH_EVERY`] after it, however long it
    /// took (a slow ping does not stretch the time to notice an outage).
    began: std::sync::Mutex<tokio::time::Instant>,
}

impl Check {
    /// The checks of `cell`'s engine (`None` for a cell with no link to check).
    pub(super) fn new(cell: &Arc<Cell>, probe: Arc<Probe>) -> Option<Self> {
        let link = cell.link().cloned()?;
        let labels = EngineLabels {
            engine: link.name().to_string(),
        };
        let health = Health::new(link.is_up(), probe.down_after, probe.up_after);
        probe
            .metrics
            .fleet
            .up
            .get_or_create(&labels)
            .set(u64::from(health.is_up()));
        Some(Self {
            cell: Arc::downgrade(cell),
            probe,
            link,
            labels,
            state: tokio::sync::Mutex::new((health, 0)),
            began: std::sync::Mutex::new(tokio::time::Instant::now()),
        })
    }
}

impl crate::background::Background for Check {
    fn name(&self) -> &'static str {
        "fleet: health check"
    }

    async fn pause(&self) {
        let began = *self.began.lock().unwrap_or_else(|e| e.into_inner());
        tokio::time::sleep_until(began + HEALTH_EVERY).await;
    }

    async fn round(self: Arc<Self>) -> ControlFlow<()> {
        *self.began.lock().unwrap_or_else(|e| e.into_inner()) = tokio::time::Instant::now();
        let Some(this) = self.cell.upgrade() else {
            return ControlFlow::Break(());
        };
        let (link, probe, labels) = (&self.link, &*self.probe, &self.labels);
        let metrics = &probe.metrics;
        let mut state = self.state.lock().await;
        let (health, tick) = &mut *state;
        let was_up = health.is_up();
        let engine = match link.engine() {
            Some(e) => Some(e),
            None => connect(&this, link, probe).await,
        };
        let mut ok = match &engine {
            Some(e) => matches!(
                tokio::time::timeout(PING_TIMEOUT, e.ping()).await,
                Ok(Ok(()))
            ),
            None => false,
        };
        // An engine is up once placement knows what it offers: its runtimes and images are
        // read before it takes its first session, then every INFO_EVERY checks. A failed read
        // neither proves nor disproves anything: the check then agrees with the state.
        if let Some(e) = engine.as_ref().filter(|_| ok)
            && (!was_up || tick.is_multiple_of(INFO_EVERY))
        {
            match tokio::time::timeout(PING_TIMEOUT, e.info()).await {
                Ok(Ok(info)) => this.saw_info(info.runtimes, info.images),
                _ => ok = was_up,
            }
        }
        let flipped = health.observe(ok);
        let up = health.is_up();
        link.set_up(up);
        metrics.fleet.up.get_or_create(labels).set(u64::from(up));
        metrics
            .fleet
            .draining
            .get_or_create(labels)
            .set(u64::from(this.spec().drain));
        match (flipped, up) {
            (true, true) => {
                tracing::info!(engine = %link.name(), "engine up");
                *tick = 1;
                this.stack().start();
                // Its share of the pools may be owed.
                this.pool().wake();
            }
            (true, false) => {
                link.disconnect();
                // An error (reported to Sentry once per outage); its 503s are warnings.
                tracing::error!(engine = %link.name(), checks = probe.down_after, "engine down: not answering its ping; its sessions answer 503 until it is back")
            }
            (false, true) if !ok => {
                tracing::warn!(engine = %link.name(), missed = health.streak(), of = probe.down_after, "engine missed a health check")
            }
            _ => {}
        }
        let Some(engine) = engine.filter(|_| ok && up) else {
            return ControlFlow::Continue(());
        };
        count(&this, &*engine, probe, labels).await;
        *tick = tick.wrapping_add(1);
        ControlFlow::Continue(())
    }
}

/// A new client of the cell's engine, linked, or `None` when it cannot be reached now.
async fn connect(cell: &Cell, link: &Link, probe: &Probe) -> Option<Arc<dyn ContainerEngine>> {
    let spec = cell.spec();
    let connecting = probe.connector.connect(&spec);
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok(engine)) => {
            let metered: Arc<dyn ContainerEngine> = Arc::new(MeteredEngine::named(
                engine,
                probe.metrics.clone(),
                &spec.name,
            ));
            link.connect(metered.clone());
            tracing::info!(engine = %spec.name, "engine connected");
            Some(metered)
        }
        Ok(Err(e)) => {
            tracing::debug!(engine = %spec.name, error = %e, "engine not reachable");
            None
        }
        Err(_) => None,
    }
}

/// Counts the sessions (running or paused, warm-pool members included) and their memory.
async fn count(cell: &Cell, engine: &dyn ContainerEngine, probe: &Probe, labels: &EngineLabels) {
    let ours = [
        (ROLE_LABEL, ROLE_SANDBOX),
        (DEPLOYMENT_LABEL, probe.deployment.as_str()),
    ];
    // Short: a hung list must not hold back the next ping (death is noticed by pings).
    let Ok(Ok(list)) = tokio::time::timeout(PING_TIMEOUT / 2, engine.list(&ours)).await else {
        return;
    };
    let live: Vec<_> = list
        .iter()
        .filter(|c| {
            c.is_running()
                || c.status == ContainerStatus::Paused
                || c.status == ContainerStatus::Created
        })
        .collect();
    let memory_used = live
        .iter()
        .filter_map(|c| c.label(MEMORY_LABEL)?.parse::<u64>().ok())
        .sum();
    let sessions = u32::try_from(live.len()).unwrap_or(u32::MAX);
    cell.saw_count(sessions, memory_used);
    probe
        .metrics
        .fleet
        .sessions
        .get_or_create(labels)
        .set(u64::from(sessions));
}

#[cfg(test)]
mod tests {
    use super::Health;

    #[test]
    fn a_state_flips_only_after_enough_checks_in_a_row() {
        let mut h = Health::new(true, 3, 2);
        assert!(!h.observe(false) && !h.observe(false));
        // One answer in between starts the count again.
        assert!(!h.observe(true));
        assert!(!h.observe(false) && !h.observe(false) && h.is_up());
        assert!(h.observe(false));
        assert!(!h.is_up());
        assert!(!h.observe(true) && !h.is_up());
        assert!(h.observe(true) && h.is_up());
        // Agreeing checks change nothing.
        assert!(!h.observe(true) && h.is_up() && h.streak() == 0);
    }

    #[test]
    fn a_threshold_of_one_flips_at_once() {
        let mut h = Health::new(false, 1, 1);
        assert!(h.observe(true) && h.is_up());
        assert!(h.observe(false) && !h.is_up());
        // Zero is taken as one.
        let mut h = Health::new(true, 0, 0);
        assert!(h.observe(false));
    }
}
