//! The fleet: sessions spread over several Docker engines behind one API.
//!
//! Each engine is a [`Cell`]: the whole per-engine stack of a single-engine service (sandbox
//! factory, egress, helper runtime, warm pool, snapshots, sessions, reaper), built over a
//! [`ScopedEngine`] that prefixes the ids it hands out with the engine's name (so any replica
//! finds a session's engine from its id alone) and cuts calls short when the engine is down.
//! Locks, activity records and metrics are shared by every cell.
//!
//! Without `ENGINES_FILE` the fleet is one cell over the engine of today, with no health checks
//! and no prefix: the service behaves as it always did.
//!
//! With it, for each engine a health task pings every [`HEALTH_EVERY`] (an answer within
//! [`PING_TIMEOUT`] or the engine is down: calls on it fail at once and the ones in flight are
//! cut), counts its sessions and now and then reads its runtimes and images. A new session goes
//! where [`placement::place`] says; a warm pool's size is spread over the engines by
//! [`placement::spread`]. The file is read again when it changes: engines come and go, and a
//! changed capacity or drain applies at once; a bad file keeps the last good list.

pub mod placement;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::api::StartSessionRequest;
use crate::config::{Config, EngineSpec};
use crate::coordination::activity::SessionActivity;
use crate::coordination::lock::SessionLocks;
use crate::egress::Egress;
use crate::engine::credentials::CredentialStore;
use crate::engine::docker::DockerEngine;
use crate::engine::scoped::{Link, ScopedEngine};
use crate::engine::{
    ContainerEngine, ContainerStatus, DEPLOYMENT_LABEL, MEMORY_LABEL, ROLE_LABEL, ROLE_SANDBOX,
};
use crate::ids::{fnv, split_engine};
use crate::pool::{Pool, Refill};
use crate::reaper::Reaper;
use crate::runtime::{HelperRuntime, SessionRuntime};
use crate::sandbox::{SandboxFactory, SessionError};
use crate::sessions::Sessions;
use crate::telemetry::engine::{DEFAULT_ENGINE, MeteredEngine};
use crate::telemetry::metrics::{EngineLabels, Metrics};

/// How often each engine is pinged.
pub const HEALTH_EVERY: Duration = Duration::from_secs(1);
/// A ping not answered within this marks the engine down.
pub const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a (re)connection to an engine may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Runtimes and images are read again every this many health checks.
const INFO_EVERY: u32 = 10;
/// How often the engines file is checked for changes.
const FILE_EVERY: Duration = Duration::from_secs(2);

/// What every cell shares.
#[derive(Clone)]
struct Shared {
    config: Arc<Config>,
    locks: Arc<dyn SessionLocks>,
    activity: Arc<dyn SessionActivity>,
    metrics: Arc<Metrics>,
    helper: Option<Bytes>,
    credentials: CredentialStore,
}

/// What the health task last saw of an engine.
#[derive(Debug, Default, Clone)]
struct Seen {
    sessions: u32,
    memory_used: u64,
    runtimes: Option<Vec<String>>,
    images: HashSet<String>,
}

/// An engine's state as one placement decision reads it.
struct Reading {
    up: bool,
    spec: EngineSpec,
    seen: Seen,
    placed: u32,
}

impl Reading {
    /// The engine as placement sees it: with its sessions counted (`counts`), or by its
    /// capacity alone (a pool's spread); no image held, no warm member.
    fn view(&self, counts: bool) -> placement::View<'_> {
        placement::View {
            name: &self.spec.name,
            up: self.up,
            draining: self.spec.drain,
            runtimes: self.seen.runtimes.as_deref(),
            sessions: if counts {
                self.seen.sessions + self.placed
            } else {
                0
            },
            max_sessions: self.spec.max_sessions,
            memory_used: if counts { self.seen.memory_used } else { 0 },
            memory_bytes: self.spec.memory_bytes,
            has_image: false,
            warm: false,
        }
    }
}

/// One engine of the fleet with its own stack.
pub struct Cell {
    spec: RwLock<EngineSpec>,
    /// `None` for the single engine of a deployment without a fleet (always up).
    link: Option<Arc<Link>>,
    sessions: Arc<Sessions>,
    refill: Arc<Refill>,
    seen: Mutex<Seen>,
    /// Sessions placed here since the last count (counted until the next one sees them).
    placed: AtomicU32,
    /// Whether its reaper and refill run.
    background: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Cell {
    fn drop(&mut self) {
        abort_all(&self.tasks);
    }
}

/// Stops every task in `tasks`.
fn abort_all(tasks: &Mutex<Vec<JoinHandle<()>>>) {
    for t in tasks.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        t.abort();
    }
}

/// An engine's state for `GET /engines/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EngineState {
    Up,
    Down,
    Draining,
}

/// One engine in `GET /engines/` (never its endpoint or TLS files).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EngineStatus {
    pub name: String,
    pub state: EngineState,
    /// Sessions (warm-pool members included) it holds, as last counted.
    pub sessions: u32,
    pub max_sessions: Option<u32>,
}

impl Cell {
    /// The stack of a single-engine service over `engine` (already metered).
    fn build(
        engine: Arc<dyn ContainerEngine>,
        link: Option<Arc<Link>>,
        spec: EngineSpec,
        shared: &Shared,
    ) -> Arc<Self> {
        let config = shared.config.clone();
        // A CA file that cannot be read was already refused by config validation; reading it
        // again here can only fail on a race, which then disables egress loudly.
        let egress = match Egress::load(engine.clone(), config.clone()) {
            Ok(e) => e.map(Arc::new),
            Err(e) => {
                tracing::error!(engine = %spec.name, error = %e, "egress CA unreadable; egress sessions disabled");
                None
            }
        };
        let runtime: Arc<dyn SessionRuntime> = Arc::new(
            HelperRuntime::new(
                engine.clone(),
                config.sessions.run_uid,
                config.sessions.run_gid,
            )
            .with_helper(shared.helper.clone()),
        );
        let factory = Arc::new(SandboxFactory::new(
            engine,
            config.clone(),
            egress,
            shared.helper.clone(),
        ));
        let pool = Arc::new(Pool::new(
            factory.clone(),
            runtime.clone(),
            shared.metrics.clone(),
        ));
        let sessions = Arc::new(Sessions::new(
            factory,
            pool.clone(),
            runtime,
            shared.locks.clone(),
            shared.activity.clone(),
            shared.metrics.clone(),
        ));
        let refill = Refill::new(pool, shared.locks.clone());
        Arc::new(Self {
            spec: RwLock::new(spec),
            link,
            sessions,
            refill,
            seen: Mutex::default(),
            placed: AtomicU32::new(0),
            background: AtomicBool::new(false),
            tasks: Mutex::default(),
        })
    }

    pub fn name(&self) -> String {
        self.spec().name
    }

    fn spec(&self) -> EngineSpec {
        self.spec.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn prefix(&self) -> Option<String> {
        self.spec().prefix().map(str::to_string)
    }

    pub fn sessions(&self) -> &Arc<Sessions> {
        &self.sessions
    }

    pub fn is_up(&self) -> bool {
        self.link.as_ref().is_none_or(|l| l.is_up())
    }

    pub fn state(&self) -> EngineState {
        if !self.is_up() {
            EngineState::Down
        } else if self.spec().drain {
            EngineState::Draining
        } else {
            EngineState::Up
        }
    }

    fn seen(&self) -> Seen {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Starts the engine's reaper and warm-pool refill, once.
    fn start_background(&self, shared: &Shared) {
        if self.background.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut tasks = Vec::new();
        if shared.config.reaper.enabled {
            tasks.push(Arc::new(Reaper::new(self.sessions.clone())).spawn());
        }
        if let Some(t) = self.refill.spawn() {
            tasks.push(t);
        }
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(tasks);
    }

    /// What placement reads of the engine, taken once per decision.
    fn reading(&self) -> Reading {
        Reading {
            up: self.is_up(),
            spec: self.spec(),
            seen: self.seen(),
            placed: self.placed.load(Ordering::Relaxed),
        }
    }

    /// The engine's health, checked until the cell is dropped (fleet only). The task holds the
    /// cell weakly: a cell removed from the fleet is dropped, which stops its tasks.
    async fn watch(cell: std::sync::Weak<Self>, shared: Shared) {
        let Some(link) = cell.upgrade().and_then(|c| c.link.clone()) else {
            return;
        };
        let labels = EngineLabels {
            engine: link.name().to_string(),
        };
        shared.metrics.engine_up.get_or_create(&labels).set(0);
        let mut tick = 0u32;
        let mut ticks = tokio::time::interval(HEALTH_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(this) = cell.upgrade() else { return };
            let was_up = link.is_up();
            let engine = match link.engine() {
                Some(e) => Some(e),
                None => this.connect(&link, &shared).await,
            };
            let mut up = match &engine {
                Some(e) => matches!(
                    tokio::time::timeout(PING_TIMEOUT, e.ping()).await,
                    Ok(Ok(()))
                ),
                None => false,
            };
            // An engine is up once placement knows what it offers: its runtimes and images are
            // read before it takes its first session, then every INFO_EVERY checks.
            if let Some(e) = engine.as_ref().filter(|_| up)
                && (!was_up || tick.is_multiple_of(INFO_EVERY))
            {
                match tokio::time::timeout(PING_TIMEOUT, e.info()).await {
                    Ok(Ok(info)) => {
                        let mut seen = this.seen.lock().unwrap_or_else(|e| e.into_inner());
                        seen.runtimes = Some(info.runtimes);
                        seen.images = info.images.into_iter().collect();
                    }
                    _ => up = was_up,
                }
            }
            link.set_up(up);
            shared
                .metrics
                .engine_up
                .get_or_create(&labels)
                .set(u64::from(up));
            shared
                .metrics
                .engine_draining
                .get_or_create(&labels)
                .set(u64::from(this.spec().drain));
            match (was_up, up) {
                (false, true) => {
                    tracing::info!(engine = %link.name(), "engine up");
                    tick = 1;
                    this.start_background(&shared);
                    // Its share of the pools may be owed.
                    this.sessions.pool().wake();
                }
                (true, false) => {
                    link.disconnect();
                    // An error (reported to Sentry once per outage); its 503s are warnings.
                    tracing::error!(engine = %link.name(), "engine down: not answering its ping; its sessions answer 503 until it is back")
                }
                _ => {}
            }
            let Some(engine) = engine.filter(|_| up) else {
                continue;
            };
            this.count(&*engine, &shared, &labels).await;
            tick = tick.wrapping_add(1);
        }
    }

    async fn connect(&self, link: &Link, shared: &Shared) -> Option<Arc<dyn ContainerEngine>> {
        let spec = self.spec();
        let connecting = DockerEngine::connect_endpoint(
            &spec.endpoint,
            spec.tls.as_ref(),
            shared.credentials.clone(),
        );
        match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok(docker)) => {
                let metered: Arc<dyn ContainerEngine> = Arc::new(MeteredEngine::named(
                    Arc::new(docker),
                    shared.metrics.clone(),
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
    async fn count(&self, engine: &dyn ContainerEngine, shared: &Shared, labels: &EngineLabels) {
        let deployment = shared.config.deployment.as_str();
        let labels_of_ours = [(ROLE_LABEL, ROLE_SANDBOX), (DEPLOYMENT_LABEL, deployment)];
        let listing = engine.list(&labels_of_ours);
        // Short: a hung list must not hold back the next ping (death is noticed by pings).
        let Ok(Ok(list)) = tokio::time::timeout(PING_TIMEOUT / 2, listing).await else {
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
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.sessions = sessions;
            seen.memory_used = memory_used;
        }
        self.placed.store(0, Ordering::Relaxed);
        shared
            .metrics
            .engine_sessions
            .get_or_create(labels)
            .set(u64::from(sessions));
    }

    fn status(&self) -> EngineStatus {
        let spec = self.spec();
        EngineStatus {
            name: spec.name.clone(),
            state: self.state(),
            sessions: self.seen().sessions + self.placed.load(Ordering::Relaxed),
            max_sessions: spec.max_sessions,
        }
    }
}

/// Every engine sessions may be on.
pub struct Fleet {
    shared: Shared,
    /// In the file's order.
    cells: RwLock<Vec<Arc<Cell>>>,
    /// The engines file, when there is a fleet.
    file: Option<PathBuf>,
    /// The file's content last applied (valid or not), to notice a change.
    file_seen: Mutex<Option<Vec<u8>>>,
    started: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Fleet {
    /// The single engine of a deployment without `ENGINES_FILE` (`engine` is metered).
    pub fn single(
        config: Arc<Config>,
        engine: Arc<dyn ContainerEngine>,
        locks: Arc<dyn SessionLocks>,
        activity: Arc<dyn SessionActivity>,
        metrics: Arc<Metrics>,
        helper: Option<Bytes>,
    ) -> Arc<Self> {
        let shared = Shared {
            config,
            locks,
            activity,
            metrics,
            helper,
            credentials: CredentialStore::from_env(),
        };
        let spec = EngineSpec {
            name: DEFAULT_ENGINE.to_string(),
            endpoint: String::new(),
            tls: None,
            max_sessions: None,
            memory_bytes: None,
            drain: false,
            default: true,
        };
        let cell = Cell::build(engine, None, spec, &shared);
        Arc::new(Self {
            shared,
            cells: RwLock::new(vec![cell]),
            file: None,
            file_seen: Mutex::default(),
            started: AtomicBool::new(false),
            tasks: Mutex::default(),
        })
    }

    /// The engines of `config.fleet` (its file as read at start-up); nothing is contacted
    /// before [`Fleet::start`].
    pub fn from_file(
        config: Arc<Config>,
        locks: Arc<dyn SessionLocks>,
        activity: Arc<dyn SessionActivity>,
        metrics: Arc<Metrics>,
        helper: Option<Bytes>,
        credentials: CredentialStore,
    ) -> Arc<Self> {
        let shared = Shared {
            config: config.clone(),
            locks,
            activity,
            metrics,
            helper,
            credentials,
        };
        let fleet = Arc::new(Self {
            shared,
            cells: RwLock::default(),
            file: config.fleet.engines_file.clone(),
            file_seen: Mutex::default(),
            started: AtomicBool::new(false),
            tasks: Mutex::default(),
        });
        fleet.apply(&config.fleet.engines);
        if let Some(path) = &fleet.file {
            *fleet.file_seen.lock().unwrap_or_else(|e| e.into_inner()) = std::fs::read(path).ok();
        }
        fleet.shared.metrics.engines_file_valid.set(1);
        fleet
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.shared.config
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    pub fn is_fleet(&self) -> bool {
        self.file.is_some()
    }

    pub fn cells(&self) -> Vec<Arc<Cell>> {
        self.cells.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The one cell of a deployment without a fleet, or the fleet's default engine.
    pub fn default_cell(&self) -> Option<Arc<Cell>> {
        self.cells().into_iter().find(|c| c.prefix().is_none())
    }

    /// Starts the background work: every cell's reaper and warm-pool refill and, in a fleet,
    /// health checks, the pools' spread and the file's watch.
    pub fn start(self: &Arc<Self>) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        for cell in self.cells() {
            self.start_cell(&cell);
        }
        if self.is_fleet() {
            let me = Arc::downgrade(self);
            let watcher = tokio::spawn(async move {
                let mut ticks = tokio::time::interval(FILE_EVERY);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    ticks.tick().await;
                    let Some(fleet) = me.upgrade() else { return };
                    fleet.reload();
                    fleet.spread_pools();
                }
            });
            self.tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(watcher);
        }
    }

    fn start_cell(self: &Arc<Self>, cell: &Arc<Cell>) {
        let mut tasks = Vec::new();
        if self.is_fleet() {
            let (cell, shared) = (Arc::downgrade(cell), self.shared.clone());
            tasks.push(tokio::spawn(async move {
                // A panic in a check is logged and the checks go on: an engine nobody checks
                // would stay in its last state for good.
                while let Err(e) = tokio::spawn(Cell::watch(cell.clone(), shared.clone())).await {
                    tracing::error!(error = %e, "fleet: an engine's health check crashed");
                    tokio::time::sleep(HEALTH_EVERY).await;
                }
            }));
        }
        cell.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(tasks);
        // A fleet's engine gets its reaper and refill once it first answers (its health check
        // starts them): before, every one of their calls would fail.
        if !self.is_fleet() {
            cell.start_background(&self.shared);
        }
    }

    /// A clean shutdown of every cell's refill (builds in flight finish).
    pub async fn shutdown(&self) {
        abort_all(&self.tasks);
        let cells = self.cells();
        futures::future::join_all(cells.iter().map(|c| c.refill.shutdown())).await;
    }

    /// Reads the engines file again if it changed, applying a valid one.
    fn reload(self: &Arc<Self>) {
        let Some(path) = &self.file else { return };
        let Ok(text) = std::fs::read(path) else {
            // A file being replaced may be missing for a moment; a missing one is a bad one.
            return self.refuse(None, "the engines file cannot be read");
        };
        {
            let mut seen = self.file_seen.lock().unwrap_or_else(|e| e.into_inner());
            if seen.as_deref() == Some(&text[..]) {
                return;
            }
            *seen = Some(text.clone());
        }
        match crate::config::parse_engines(&text) {
            Ok(specs) => {
                self.apply(&specs);
                for cell in self.cells() {
                    if cell
                        .tasks
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .is_empty()
                    {
                        self.start_cell(&cell);
                    }
                }
                self.shared.metrics.engines_file_valid.set(1);
                tracing::info!(engines = ?specs.iter().map(|s| &s.name).collect::<Vec<_>>(), "engines file applied");
            }
            Err(why) => self.refuse(Some(text), &why),
        }
    }

    fn refuse(&self, text: Option<Vec<u8>>, why: &str) {
        let mut seen = self.file_seen.lock().unwrap_or_else(|e| e.into_inner());
        // Said once per bad content, not every check.
        if text.is_some() || seen.is_some() {
            self.shared.metrics.engines_file_errors.inc();
            self.shared.metrics.engines_file_valid.set(0);
            tracing::error!(file = ?self.file, error = why, "engines file refused; keeping the last good list");
        }
        *seen = text;
    }

    /// Makes the cells match `specs`: new engines get a cell (not started), removed ones lose
    /// theirs (their sessions answer 404 until the engine is listed again), changed capacity or
    /// drain applies in place, a changed endpoint or TLS gets a new connection.
    fn apply(&self, specs: &[EngineSpec]) {
        let mut cells = self.cells.write().unwrap_or_else(|e| e.into_inner());
        let old: HashMap<String, Arc<Cell>> = cells.drain(..).map(|c| (c.name(), c)).collect();
        for spec in specs {
            let keep = old.get(&spec.name).filter(|c| c.spec().same_link(spec));
            let cell = match keep {
                Some(cell) => {
                    *cell.spec.write().unwrap_or_else(|e| e.into_inner()) = spec.clone();
                    cell.clone()
                }
                None => {
                    let link = Link::new(&spec.name);
                    let engine: Arc<dyn ContainerEngine> =
                        Arc::new(ScopedEngine::new(link.clone(), spec.prefix()));
                    let cell = Cell::build(engine, Some(link), spec.clone(), &self.shared);
                    // Nothing is built on a new engine before the spread gives it a share.
                    for (key, _) in cell.sessions.pool().configured() {
                        cell.sessions.pool().set_target(key, 0);
                    }
                    cell
                }
            };
            cells.push(cell);
        }
        for (name, cell) in old {
            if !cells.iter().any(|c| Arc::ptr_eq(c, &cell)) {
                tracing::info!(engine = %name, "engine removed from the fleet");
                let labels = EngineLabels { engine: name };
                self.shared.metrics.engine_up.remove(&labels);
                self.shared.metrics.engine_sessions.remove(&labels);
                self.shared.metrics.engine_draining.remove(&labels);
            }
        }
    }

    /// The cell an id (of a session or a snapshot) names: 404 for an engine not in the fleet,
    /// 503 while it is down.
    pub fn cell_of(&self, id: &str) -> Result<Arc<Cell>, SessionError> {
        let prefix = split_engine(id).0;
        let cell = self
            .cells()
            .into_iter()
            .find(|c| c.prefix().as_deref() == prefix)
            .ok_or(SessionError::NotFound)?;
        if !cell.is_up() {
            return Err(SessionError::EngineDown(cell.name()));
        }
        Ok(cell)
    }

    /// The sessions of the engine holding session `id`.
    pub fn at(&self, id: &str) -> Result<Arc<Sessions>, SessionError> {
        Ok(self.cell_of(id)?.sessions.clone())
    }

    /// [`Fleet::at`] for an operation that makes `count` new sessions there (a fork): the
    /// engine must be able to take them all, as placement would decide for a create.
    pub fn at_for_new(&self, id: &str, count: u32) -> Result<Arc<Sessions>, SessionError> {
        let need = self.need(None, count);
        let cell = self.admit_at(id, &need)?;
        cell.placed.fetch_add(count, Ordering::Relaxed);
        Ok(cell.sessions.clone())
    }

    /// What a new session asks of an engine.
    fn need(&self, memory: Option<i64>, count: u32) -> placement::Need<'_> {
        placement::Need {
            runtime: self.shared.config.sessions.runtime.as_str(),
            memory: memory.and_then(|m| u64::try_from(m).ok()).unwrap_or(0),
            count,
        }
    }

    /// The cell holding `id` (a snapshot or a session to fork), if that engine can take what
    /// `need` asks now: the checks (and the 503) of placement, on that engine alone.
    fn admit_at(&self, id: &str, need: &placement::Need<'_>) -> Result<Arc<Cell>, SessionError> {
        let cell = self.cell_of(id)?;
        let reading = cell.reading();
        if reading.spec.drain {
            return Err(SessionError::EngineDraining(cell.name()));
        }
        if !self.is_fleet() {
            return Ok(cell);
        }
        match placement::refusal(&reading.view(true), need) {
            None => Ok(cell),
            Some(why) => {
                let no = placement::NoEngine(vec![why]);
                self.shared.metrics.placements_refused.inc();
                tracing::warn!(reason = %no, "session refused: its engine cannot take it");
                Err(SessionError::NoEngine(no.to_string()))
            }
        }
    }

    /// Creates a session where it should go: a snapshot's engine for a session from a
    /// snapshot, else an engine with a warm member for it, else where placement says.
    pub async fn create(&self, req: &StartSessionRequest) -> Result<String, SessionError> {
        let cell = match &req.snapshot_id {
            Some(id) => self.admit_at(id, &self.need(req.memory_bytes, 1))?,
            None => self.place(req)?,
        };
        cell.placed.fetch_add(1, Ordering::Relaxed);
        let made = cell.sessions.create(req).await;
        if made.is_err() {
            let _ = cell
                .placed
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
        made
    }

    /// The engine a new session goes to.
    fn place(&self, req: &StartSessionRequest) -> Result<Arc<Cell>, SessionError> {
        let cells = self.cells();
        if !self.is_fleet() {
            return cells
                .into_iter()
                .next()
                .ok_or(SessionError::NoEngine("no engine".into()));
        }
        let egress = req.egress.is_some();
        let image = with_tag(&req.base_image);
        let readings: Vec<Reading> = cells.iter().map(|c| c.reading()).collect();
        let views: Vec<placement::View<'_>> = readings
            .iter()
            .zip(&cells)
            .map(|(r, c)| placement::View {
                has_image: r.seen.images.contains(&image),
                warm: c.sessions.pool().has_ready(&req.base_image, egress),
                ..r.view(true)
            })
            .collect();
        let need = self.need(req.memory_bytes, 1);
        match placement::place(&views, &need, &mut rand::rng()) {
            Ok(i) => Ok(cells[i].clone()),
            Err(no) => {
                self.shared.metrics.placements_refused.inc();
                tracing::warn!(reason = %no, "session refused: no engine can take it");
                Err(SessionError::NoEngine(no.to_string()))
            }
        }
    }

    /// Spreads each warm pool's configured size over the engines that can take sessions now;
    /// a snapshot's pool stays on the snapshot's engine.
    fn spread_pools(&self) {
        let cells = self.cells();
        let readings: Vec<Reading> = cells.iter().map(|c| c.reading()).collect();
        // Capacity only (not the current counts): a spread that moved with every count would
        // retire members on one engine to build them on another.
        let views: Vec<placement::View<'_>> = readings.iter().map(|r| r.view(false)).collect();
        let need = self.need(None, 1);
        let Some(first) = cells.first() else { return };
        for (key, size) in first.sessions.pool().configured().to_vec() {
            let shares: Vec<u32> = match &key.snapshot {
                Some(id) => {
                    let prefix = split_engine(id).0;
                    cells
                        .iter()
                        .enumerate()
                        .map(|(i, c)| {
                            let here = c.prefix().as_deref() == prefix;
                            if here && views[i].up && !views[i].draining {
                                size
                            } else {
                                0
                            }
                        })
                        .collect()
                }
                None => placement::spread(
                    &views,
                    &need,
                    size,
                    fnv(format!("{}|{}", key.kind.as_str(), key.image).as_bytes()),
                ),
            };
            for (cell, share) in cells.iter().zip(shares) {
                cell.sessions.pool().set_target(&key, share);
            }
        }
    }

    /// `GET /engines/`.
    pub fn statuses(&self) -> Vec<EngineStatus> {
        self.cells().iter().map(|c| c.status()).collect()
    }
}

/// `image` with `:latest` when it names no tag or digest (how the engine lists it).
fn with_tag(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains(':') || image.contains('@') {
        image.to_string()
    } else {
        format!("{image}:latest")
    }
}
