//! Where a request goes: the list of cells ([`Roster`]), read without a lock on every request
//! and swapped whole when the engines file changes, the cell an id names, and the engine a new
//! session or a warm pool's members go to (over [`placement`]'s pure functions).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::FleetError;
use super::cell::{Cell, Reading};
use super::placement::{self, Need, NoEngine};
use crate::api::StartSessionRequest;
use crate::config::EngineSpec;
use crate::ids::{fnv, split_engine};

/// The fleet's cells, in the file's order.
pub(super) struct Roster {
    cells: ArcSwap<Vec<Arc<Cell>>>,
    /// Serializes changes (a load, change and store would otherwise race another).
    changing: Mutex<()>,
}

impl Roster {
    pub fn new(cells: Vec<Arc<Cell>>) -> Self {
        Self {
            cells: ArcSwap::from_pointee(cells),
            changing: Mutex::new(()),
        }
    }

    /// The cells now: a snapshot a later change does not alter.
    pub fn all(&self) -> Arc<Vec<Arc<Cell>>> {
        self.cells.load_full()
    }

    /// The cell whose ids carry `prefix` (`None`: the default engine's).
    pub fn by_prefix(&self, prefix: Option<&str>) -> Option<Arc<Cell>> {
        self.cells
            .load()
            .iter()
            .find(|c| c.prefix() == prefix)
            .cloned()
    }

    /// The cell an id (of a session or a snapshot) names: 404 for an engine not in the fleet,
    /// 503 while it is down.
    pub fn route(&self, id: &str) -> Result<Arc<Cell>, FleetError> {
        let cell = self
            .by_prefix(split_engine(id).0)
            .ok_or(FleetError::UnknownEngine)?;
        if !cell.is_up() {
            return Err(FleetError::EngineDown(cell.name()));
        }
        Ok(cell)
    }

    /// Makes the cells match `specs`: an engine still reached the same way keeps its cell (a
    /// changed capacity or drain applies in place), a new one (or a changed endpoint, TLS or
    /// default) gets a cell from `build`. Returns the cells no longer listed.
    pub fn apply(
        &self,
        specs: &[EngineSpec],
        mut build: impl FnMut(&EngineSpec) -> Arc<Cell>,
    ) -> Vec<Arc<Cell>> {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.cells.load_full();
        let mut by_name: HashMap<&str, &Arc<Cell>> =
            old.iter().map(|c| (c.name_str(), c)).collect();
        let mut cells = Vec::with_capacity(specs.len());
        for spec in specs {
            let kept = by_name
                .get(spec.name.as_str())
                .filter(|c| c.spec().same_link(spec))
                .map(|c| Arc::clone(c));
            cells.push(match kept {
                Some(cell) => {
                    by_name.remove(spec.name.as_str());
                    cell.respec(spec);
                    cell
                }
                None => build(spec),
            });
        }
        let gone = by_name.into_values().cloned().collect();
        self.cells.store(Arc::new(cells));
        gone
    }
}

/// What a new session asks of an engine.
pub(super) fn need(runtime: &str, memory: Option<i64>, count: u32) -> Need<'_> {
    Need {
        runtime,
        memory: memory.and_then(|m| u64::try_from(m).ok()).unwrap_or(0),
        count,
    }
}

/// Whether `cell` (a snapshot's, a session's to fork) can take what `need` asks now: the checks
/// of placement on that engine alone. `Err` for a draining engine; `Ok(Some(why))` for a refusal.
pub(super) fn admit(cell: &Cell, need: &Need<'_>) -> Result<Option<String>, FleetError> {
    let reading = cell.reading();
    if reading.spec.drain {
        return Err(FleetError::EngineDraining(cell.name()));
    }
    Ok(placement::refusal(&reading.view(true), need))
}

/// The engine a new session goes to, among `cells`.
pub(super) fn place(
    cells: &[Arc<Cell>],
    req: &StartSessionRequest,
    need: &Need<'_>,
) -> Result<Arc<Cell>, NoEngine> {
    let egress = req.egress.is_some();
    let image = with_tag(&req.base_image);
    let readings: Vec<Reading> = cells.iter().map(|c| c.reading()).collect();
    let views: Vec<placement::View<'_>> = readings
        .iter()
        .zip(cells)
        .map(|(r, c)| placement::View {
            has_image: r.seen.images.contains(&image),
            warm: c.pool().has_ready(&req.base_image, egress),
            ..r.view(true)
        })
        .collect();
    placement::place(&views, need, &mut rand::rng()).map(|i| cells[i].clone())
}

/// Spreads each warm pool's configured size over the engines that can take sessions now; a
/// snapshot's pool stays on the snapshot's engine.
pub(super) fn spread_pools(cells: &[Arc<Cell>], need: &Need<'_>) {
    let readings: Vec<Reading> = cells.iter().map(|c| c.reading()).collect();
    // Capacity only (not the current counts): a spread that moved with every count would
    // retire members on one engine to build them on another.
    let views: Vec<placement::View<'_>> = readings.iter().map(|r| r.view(false)).collect();
    let Some(first) = cells.first() else { return };
    for (key, size) in first.pool().configured().to_vec() {
        let shares: Vec<u32> = match &key.snapshot {
            Some(id) => {
                let prefix = split_engine(id).0;
                cells
                    .iter()
                    .zip(&views)
                    .map(|(c, v)| {
                        let here = c.prefix() == prefix;
                        if here && v.up && !v.draining { size } else { 0 }
                    })
                    .collect()
            }
            None => placement::spread(
                &views,
                need,
                size,
                fnv(format!("{}|{}", key.kind.as_str(), key.image).as_bytes()),
            ),
        };
        for (cell, share) in cells.iter().zip(shares) {
            cell.pool().set_target(&key, share);
        }
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
