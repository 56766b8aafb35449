//! One engine of the fleet ([`Cell`]): its [`Stack`], the [`Link`] its health check drives, and
//! what that check last saw of it, read by placement.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::task::JoinHandle;

use super::placement;
use super::stack::{Shared, Stack, abort_all};
use crate::config::EngineSpec;
use crate::engine::ContainerEngine;
use crate::engine::metered::DEFAULT_ENGINE;
use crate::engine::scoped::{Link, ScopedEngine};
use crate::pool::Pool;
use crate::reaper::Reaper;
use crate::sessions::Sessions;
use crate::snapshots::Snapshots;
use crate::telemetry::runtime_probe::ImageProbes;

/// What the health check last saw of an engine.
#[derive(Debug, Default, Clone)]
pub(super) struct Seen {
    pub sessions: u32,
    pub memory_used: u64,
    pub runtimes: Option<Vec<String>>,
    pub images: HashSet<String>,
}

/// An engine's state as one placement decision reads it.
pub(super) struct Reading {
    pub up: bool,
    pub spec: Arc<EngineSpec>,
    pub seen: Seen,
    pub placed: u32,
}

impl Reading {
    /// The engine as placement sees it: with its sessions counted (`counts`), or by its
    /// capacity alone (a pool's spread); no image held, no warm member.
    pub fn view(&self, counts: bool) -> placement::View<'_> {
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

pub use crate::api::{EngineState, EngineStatus};

/// One engine of the fleet with its own stack.
pub struct Cell {
    /// Name and prefix never change for a cell: a file that changes either gets a new cell.
    name: String,
    prefix: Option<String>,
    /// Capacity and drain, replaced in place by a new file; read without a lock or a clone.
    spec: ArcSwap<EngineSpec>,
    /// `None` for the single engine of a deployment without a fleet (always up).
    link: Option<Arc<Link>>,
    stack: Stack,
    seen: Mutex<Seen>,
    /// Sessions placed here since the last count (counted until the next one sees them).
    placed: AtomicU32,
    /// Its health check (a fleet's engine only).
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Cell {
    fn drop(&mut self) {
        abort_all(&self.tasks);
    }
}

impl Cell {
    /// The one engine of a deployment without a fleet, over `engine` (already metered).
    pub(super) fn single(engine: Arc<dyn ContainerEngine>, shared: &Shared) -> Arc<Self> {
        let spec = EngineSpec {
            name: DEFAULT_ENGINE.to_string(),
            endpoint: String::new(),
            tls: None,
            max_sessions: None,
            memory_bytes: None,
            drain: false,
            default: true,
        };
        Self::new(engine, None, spec, shared)
    }

    /// A fleet's engine, not connected yet (down until its health check says otherwise). Its
    /// share of each warm pool is 0 until the spread gives it one.
    pub(super) fn remote(spec: &EngineSpec, shared: &Shared) -> Arc<Self> {
        let link = Link::new(&spec.name);
        let engine: Arc<dyn ContainerEngine> =
            Arc::new(ScopedEngine::new(link.clone(), spec.prefix()));
        let cell = Self::new(engine, Some(link), spec.clone(), shared);
        let pool = cell.pool();
        for (key, _) in pool.configured() {
            pool.set_target(key, 0);
        }
        cell
    }

    fn new(
        engine: Arc<dyn ContainerEngine>,
        link: Option<Arc<Link>>,
        spec: EngineSpec,
        shared: &Shared,
    ) -> Arc<Self> {
        Arc::new(Self {
            name: spec.name.clone(),
            prefix: spec.prefix().map(str::to_string),
            stack: Stack::build(engine, &spec.name, shared),
            spec: ArcSwap::from_pointee(spec),
            link,
            seen: Mutex::default(),
            placed: AtomicU32::new(0),
            tasks: Mutex::default(),
        })
    }

    pub fn name(&self) -> String {
        self.name.clone()
    }

    pub(super) fn name_str(&self) -> &str {
        &self.name
    }

    /// The prefix of its ids (`None` for the default engine).
    pub(super) fn prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    pub(super) fn spec(&self) -> Arc<EngineSpec> {
        self.spec.load_full()
    }

    /// Takes a new file's capacity and drain (the caller checked it reaches the same engine).
    pub(super) fn respec(&self, spec: &EngineSpec) {
        self.spec.store(Arc::new(spec.clone()));
    }

    pub(super) fn link(&self) -> Option<&Arc<Link>> {
        self.link.as_ref()
    }

    pub(super) fn stack(&self) -> &Stack {
        &self.stack
    }

    pub fn sessions(&self) -> &Arc<Sessions> {
        self.stack.sessions()
    }

    /// Its engine (metered; scoped for a fleet's).
    pub fn engine(&self) -> &Arc<dyn ContainerEngine> {
        self.stack.engine()
    }

    pub fn pool(&self) -> &Arc<Pool> {
        self.stack.pool()
    }

    /// The probes of the images its sessions use (under `runsc` only).
    pub fn image_probes(&self) -> Option<&Arc<ImageProbes>> {
        self.stack.image_probes()
    }

    pub fn snapshots(&self) -> &Arc<Snapshots> {
        self.stack.snapshots()
    }

    /// Its reaper (started with the stack when `REAPER_ENABLED`).
    pub fn reaper(&self) -> &Arc<Reaper> {
        self.stack.reaper()
    }

    pub fn is_up(&self) -> bool {
        self.link.as_ref().is_none_or(|l| l.is_up())
    }

    pub(super) fn is_draining(&self) -> bool {
        self.spec.load().drain
    }

    pub fn state(&self) -> EngineState {
        if !self.is_up() {
            EngineState::Down
        } else if self.is_draining() {
            EngineState::Draining
        } else {
            EngineState::Up
        }
    }

    fn seen(&self) -> Seen {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records the engine's runtimes and images.
    pub(super) fn saw_info(&self, runtimes: Vec<String>, images: Vec<String>) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.runtimes = Some(runtimes);
        seen.images = images.into_iter().collect();
    }

    /// Records a count of its sessions: the placements before it are in it now.
    pub(super) fn saw_count(&self, sessions: u32, memory_used: u64) {
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.sessions = sessions;
            seen.memory_used = memory_used;
        }
        self.placed.store(0, Ordering::Relaxed);
    }

    /// Counts `count` sessions about to be made here until the next count sees them.
    pub(super) fn place(&self, count: u32) {
        self.placed.fetch_add(count, Ordering::Relaxed);
    }

    /// Takes back a placement whose session was not made.
    pub(super) fn unplace(&self, count: u32) {
        let _ = self
            .placed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(count))
            });
    }

    /// Holds `task` until the cell is dropped.
    pub(super) fn hold(&self, task: JoinHandle<()>) {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
    }

    /// Whether its health check (or, alone, its background work) was started.
    pub(super) fn is_started(&self) -> bool {
        !self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// What placement reads of the engine, taken once per decision.
    pub(super) fn reading(&self) -> Reading {
        Reading {
            up: self.is_up(),
            spec: self.spec(),
            seen: self.seen(),
            placed: self.placed.load(Ordering::Relaxed),
        }
    }

    pub(super) fn status(&self) -> EngineStatus {
        let spec = self.spec();
        EngineStatus {
            name: self.name.clone(),
            state: self.state(),
            sessions: self.seen().sessions + self.placed.load(Ordering::Relaxed),
            max_sessions: spec.max_sessions,
            snapshot_layers: self.snapshots().layer_report(),
        }
    }
}
