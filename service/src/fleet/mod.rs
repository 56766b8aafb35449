//! The fleet: sessions spread over several Docker engines behind one API.
//!
//! Each engine is a [`Cell`]: the whole per-engine `stack` of a single-engine service
//! (sandbox factory, egress, helper runtime, warm pool, snapshots, sessions, reaper), built over
//! a [`ScopedEngine`](crate::engine::scoped::ScopedEngine) that prefixes the ids it hands out
//! with the engine's name (so any replica finds a session's engine from its id alone) and cuts
//! calls short when the engine is down. Locks, activity records and metrics are shared by every
//! cell.
//!
//! Without `ENGINES_FILE` the fleet is one cell over the engine of today, with no health checks
//! and no prefix: the service behaves as it always did.
//!
//! With it, the roles are split:
//! - `routing`: the cell list, swapped whole on a change, and where an id or a new session goes;
//! - `cell`: one engine, its state and what was last seen of it;
//! - `health`: each engine checked every second, flipped after `ENGINE_DOWN_AFTER` /
//!   `ENGINE_UP_AFTER` checks in a row; a down engine's calls fail at once and those in flight
//!   are cut;
//! - `discovery`: the engines file, watched; engines come and go, a changed capacity or drain
//!   applies at once, a bad file keeps the last good list;
//! - [`placement`]: pure, the engine a session goes to and how a pool's size is spread;
//! - `connector`: how an engine is reached (Docker, or fakes in tests).
//! - [`FleetError`]: what the fleet refuses about its engines (an unknown one's ids, one down,
//!   draining or full), defined here rather than among the sessions' errors below.

mod cell;
mod connector;
mod discovery;
mod error;
mod health;
pub mod placement;
mod routing;
mod stack;

/// The engines file's watch: applied again at each change.
struct FileWatch {
    fleet: std::sync::Weak<Fleet>,
    watch: tokio::sync::Mutex<discovery::Watch>,
}

impl crate::background::Background for FileWatch {
    fn name(&self) -> &'static str {
        "fleet: engines file"
    }

    async fn round(self: Arc<Self>) -> std::ops::ControlFlow<()> {
        let Some(fleet) = self.fleet.upgrade() else {
            return std::ops::ControlFlow::Break(());
        };
        fleet.reload();
        std::ops::ControlFlow::Continue(())
    }

    async fn pause(&self) {
        self.watch.lock().await.changed().await;
    }

    fn waits_first(&self) -> bool {
        true
    }
}

/// The pools' spread over the engines, every [`SPREAD_EVERY`].
struct Spread(std::sync::Weak<Fleet>);

impl crate::background::Background for Spread {
    fn name(&self) -> &'static str {
        "fleet: pools' spread"
    }

    async fn round(self: Arc<Self>) -> std::ops::ControlFlow<()> {
        let Some(fleet) = self.0.upgrade() else {
            return std::ops::ControlFlow::Break(());
        };
        fleet.spread_pools();
        std::ops::ControlFlow::Continue(())
    }

    async fn pause(&self) {
        tokio::time::sleep(SPREAD_EVERY).await;
    }
}

#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;

pub use cell::{Cell, EngineState, EngineStatus};
pub use connector::{Connector, DockerConnector};
pub use error::FleetError;
pub use health::{HEALTH_EVERY, PING_TIMEOUT};

use crate::api::StartSessionRequest;
use crate::config::{Config, EngineSpec};
use crate::coordination::activity::SessionActivity;
use crate::coordination::lock::SessionLocks;
use crate::engine::ContainerEngine;
use crate::sessions::{Listed, Sessions};
use crate::telemetry::metrics::{EngineLabels, Metrics};
use crate::telemetry::runtime_probe::RuntimeHealth;
use discovery::EnginesFile;
use health::Probe;
use routing::Roster;
use stack::{Shared, abort_all};

/// How often each warm pool's size is spread again over the engines (they come up, go down,
/// drain).
const SPREAD_EVERY: Duration = Duration::from_secs(2);

/// Every engine sessions may be on.
pub struct Fleet {
    shared: Shared,
    cells: Roster,
    /// The engines file and how engines are reached, when there is a fleet.
    file: Option<EnginesFile>,
    probe: Option<Arc<Probe>>,
    started: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        abort_all(&self.tasks);
    }
}

impl Fleet {
    /// The single engine of a deployment without `ENGINES_FILE` (`engine` is metered).
    pub fn single(
        config: Arc<Config>,
        engine: Arc<dyn ContainerEngine>,
        locks: Arc<dyn SessionLocks>,
        activity: Arc<dyn SessionActivity>,
        metrics: Arc<Metrics>,
        helper: Option<crate::shared_file::SharedFile>,
    ) -> Arc<Self> {
        let shared = Shared {
            runtime: Arc::new(RuntimeHealth::new(&metrics)),
            config,
            locks,
            activity,
            metrics,
            helper,
        };
        let cell = Cell::single(engine, &shared);
        Arc::new(Self {
            shared,
            cells: Roster::new(vec![cell]),
            file: None,
            probe: None,
            started: AtomicBool::new(false),
            tasks: Mutex::default(),
        })
    }

    /// The engines of `config.fleet` (its file as read at start-up), reached through
    /// `connector`; nothing is contacted before [`Fleet::start`].
    pub fn from_file(
        config: Arc<Config>,
        locks: Arc<dyn SessionLocks>,
        activity: Arc<dyn SessionActivity>,
        metrics: Arc<Metrics>,
        helper: Option<crate::shared_file::SharedFile>,
        connector: Arc<dyn Connector>,
    ) -> Arc<Self> {
        let file = config
            .fleet
            .engines_file
            .clone()
            .map(|path| EnginesFile::new(path, metrics.clone()));
        let probe = Arc::new(Probe {
            connector,
            metrics: metrics.clone(),
            deployment: config.deployment.clone(),
            down_after: config.fleet.down_after,
            up_after: config.fleet.up_after,
        });
        let shared = Shared {
            runtime: Arc::new(RuntimeHealth::new(&metrics)),
            config: config.clone(),
            locks,
            activity,
            metrics,
            helper,
        };
        let cells = config
            .fleet
            .engines
            .iter()
            .map(|spec| Cell::remote(spec, &shared))
            .collect();
        Arc::new(Self {
            shared,
            cells: Roster::new(cells),
            file,
            probe: Some(probe),
            started: AtomicBool::new(false),
            tasks: Mutex::default(),
        })
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.shared.config
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// What the probes of the sandboxes' runtime found, on every engine.
    pub fn runtime_health(&self) -> &Arc<RuntimeHealth> {
        &self.shared.runtime
    }

    pub fn is_fleet(&self) -> bool {
        self.file.is_some()
    }

    pub fn cells(&self) -> Vec<Arc<Cell>> {
        self.cells.all().to_vec()
    }

    /// The cells of the engines that are up: what a deployment-wide listing asks (a down
    /// engine's lists nothing until it is back).
    pub fn up_cells(&self) -> Vec<Arc<Cell>> {
        self.cells().into_iter().filter(|c| c.is_up()).collect()
    }

    /// The one cell of a deployment without a fleet, or the fleet's default engine.
    pub fn default_cell(&self) -> Option<Arc<Cell>> {
        self.cells.by_prefix(None)
    }

    /// Starts the background work: every cell's reaper and warm-pool refill and, in a fleet,
    /// health checks, the pools' spread and the file's watch.
    pub fn start(self: &Arc<Self>) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        for cell in self.cells.all().iter() {
            self.start_cell(cell);
        }
        let Some(file) = &self.file else { return };
        let watching = crate::background::spawn(Arc::new(FileWatch {
            fleet: Arc::downgrade(self),
            watch: tokio::sync::Mutex::new(discovery::Watch::start(file.path())),
        }));
        let spreading = crate::background::spawn(Arc::new(Spread(Arc::downgrade(self))));
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend([watching, spreading]);
    }

    fn start_cell(&self, cell: &Arc<Cell>) {
        let Some(probe) = &self.probe else {
            // The single engine is always up: its reaper and refill start now.
            return cell.stack().start();
        };
        // A fleet's engine gets its reaper and refill once it first answers (its health check
        // starts them): before, every one of their calls would fail.
        if let Some(check) = health::Check::new(cell, probe.clone()) {
            cell.hold(crate::background::spawn(Arc::new(check)));
        }
    }

    /// A clean shutdown of every cell's refill (builds in flight finish).
    pub async fn shutdown(&self) {
        abort_all(&self.tasks);
        let cells = self.cells.all();
        futures::future::join_all(cells.iter().map(|c| c.stack().shutdown())).await;
    }

    /// Reads the engines file again and applies it if it changed and checks out.
    fn reload(&self) {
        let Some(specs) = self.file.as_ref().and_then(|f| f.changed()) else {
            return;
        };
        self.apply(&specs);
        if self.started.load(Ordering::SeqCst) {
            for cell in self.cells.all().iter().filter(|c| !c.is_started()) {
                self.start_cell(cell);
            }
        }
        self.spread_pools();
        tracing::info!(engines = ?specs.iter().map(|s| &s.name).collect::<Vec<_>>(), "engines file applied");
    }

    /// Makes the cells match `specs`: new engines get a cell (not started), removed ones lose
    /// theirs (their sessions answer 404 until the engine is listed again), changed capacity or
    /// drain applies in place, a changed endpoint or TLS gets a new connection.
    fn apply(&self, specs: &[EngineSpec]) {
        let gone = self
            .cells
            .apply(specs, |spec| Cell::remote(spec, &self.shared));
        for cell in gone {
            let name = cell.name();
            if specs.iter().any(|s| s.name == name) {
                tracing::info!(engine = %name, "engine's endpoint or TLS changed: reconnecting");
                continue;
            }
            tracing::info!(engine = %name, "engine removed from the fleet");
            let labels = EngineLabels { engine: name };
            let metrics = &self.shared.metrics;
            metrics.fleet.up.remove(&labels);
            metrics.fleet.sessions.remove(&labels);
            metrics.fleet.draining.remove(&labels);
        }
    }

    /// The cell an id (of a session or a snapshot) names: 404 for an engine not in the fleet,
    /// 503 while it is down.
    pub fn cell_of(&self, id: &str) -> Result<Arc<Cell>, FleetError> {
        self.cells.route(id)
    }

    /// Every session of the deployment on every engine that answers (a fleet's down engine
    /// lists nothing until it is back), in no order.
    pub async fn inventory(&self) -> Result<Vec<Listed>, FleetError> {
        let cells = self.up_cells();
        let lists = futures::future::join_all(
            cells
                .iter()
                .map(|c| async move { c.sessions().inventory(&c.name()).await }),
        );
        let mut all = Vec::new();
        for listed in lists.await {
            all.extend(listed?);
        }
        Ok(all)
    }

    /// The sessions of the engine holding session `id`.
    pub fn at(&self, id: &str) -> Result<Arc<Sessions>, FleetError> {
        Ok(self.cell_of(id)?.sessions().clone())
    }

    /// [`Fleet::at`] for an operation that makes `count` new sessions there (a fork): the
    /// engine must be able to take them all, as placement would decide for a create.
    pub fn at_for_new(&self, id: &str, count: u32) -> Result<Arc<Sessions>, FleetError> {
        let cell = self.admit_at(id, None, count)?;
        cell.place(count);
        Ok(cell.sessions().clone())
    }

    /// The cell holding `id` (a snapshot or a session to fork), if that engine can take
    /// `count` sessions of `memory` now: the checks (and the 503) of placement, on that engine
    /// alone.
    fn admit_at(&self, id: &str, memory: Option<i64>, count: u32) -> Result<Arc<Cell>, FleetError> {
        let cell = self.cell_of(id)?;
        let need = routing::need(self.runtime(), memory, count);
        match routing::admit(&cell, &need)? {
            Some(why) if self.is_fleet() => {
                let no = placement::NoEngine(vec![why]);
                self.shared.metrics.fleet.placements_refused.inc();
                tracing::warn!(reason = %no, "session refused: its engine cannot take it");
                Err(FleetError::NoEngine(no.to_string()))
            }
            _ => Ok(cell),
        }
    }

    fn runtime(&self) -> &str {
        self.shared.config.sessions.runtime.as_str()
    }

    /// Creates a session where it should go: a snapshot's engine for a session from a
    /// snapshot, else an engine with a warm member for it, else where placement says.
    pub async fn create(&self, req: &StartSessionRequest) -> Result<String, FleetError> {
        let cell = match &req.snapshot_id {
            Some(id) => self.admit_at(id, req.memory_bytes, 1)?,
            None => self.place(req)?,
        };
        cell.place(1);
        let made = cell.sessions().create(req).await;
        if made.is_err() {
            cell.unplace(1);
        }
        Ok(made?)
    }

    /// The engine a new session goes to.
    fn place(&self, req: &StartSessionRequest) -> Result<Arc<Cell>, FleetError> {
        let cells = self.cells.all();
        if !self.is_fleet() {
            return cells
                .first()
                .cloned()
                .ok_or(FleetError::NoEngine("no engine".into()));
        }
        let need = routing::need(self.runtime(), req.memory_bytes, 1);
        routing::place(&cells, req, &need).map_err(|no| {
            self.shared.metrics.fleet.placements_refused.inc();
            tracing::warn!(reason = %no, "session refused: no engine can take it");
            FleetError::NoEngine(no.to_string())
        })
    }

    /// Spreads each warm pool's configured size over the engines that can take sessions now.
    fn spread_pools(&self) {
        routing::spread_pools(&self.cells.all(), &routing::need(self.runtime(), None, 1));
    }

    /// `GET /engines/`.
    pub fn statuses(&self) -> Vec<EngineStatus> {
        self.cells.all().iter().map(|c| c.status()).collect()
    }
}
