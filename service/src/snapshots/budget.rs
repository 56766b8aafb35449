//! What a snapshot may hold: the per-snapshot cap and the room the deployment's cap leaves,
//! reserved before the freeze and spent as the workspace is copied.

use super::*;

/// Bytes reserved in this process (see [`Snapshots::reserve`]).
#[derive(Debug, Default)]
pub(super) struct Ledger {
    in_flight: HashMap<String, u64>,
    pub(super) forks: HashMap<String, u64>,
    /// What [`Pin`]s hold, with their counts.
    pins: HashMap<String, usize>,
}

impl Ledger {
    /// What the sweep leaves alone whatever its age: what is pinned (see [`Pin`]; a snapshot
    /// being taken is pinned from before its payload exists).
    pub(super) fn protected(&self) -> HashSet<String> {
        self.pins.keys().cloned().collect()
    }

    fn total(&self) -> u64 {
        self.in_flight
            .values()
            .chain(self.forks.values())
            .fold(0u64, |a, b| a.saturating_add(*b))
    }
}

/// What a snapshot being taken may hold, reserved against the deployment's total until it is
/// recorded or discarded.
pub(super) struct Reservation<'a> {
    snapshots: &'a Snapshots,
    id: String,
    /// The writable layer's bytes, as measured.
    layer: u64,
    /// What the deployment's snapshots held when it was made.
    held: u64,
    /// Most bytes the workspace copy may add to the writable layer's.
    pub(super) copy_budget: u64,
}

impl Reservation<'_> {
    /// The refusal for a copy that passed its budget after `copied` bytes: the per-snapshot
    /// cap's or the deployment's, whichever it passed.
    pub(super) fn refusal(&self, copied: u64) -> SnapshotError {
        let caps = &self.snapshots.config.snapshots;
        let found = self.layer.saturating_add(copied);
        if found > caps.size_max {
            SnapshotError::TooLarge {
                cap: caps.size_max,
                found,
                where_: "at least, counted as the workspace was copied",
            }
        } else {
            SnapshotError::NoRoom {
                held: self.held,
                need: found,
                cap: caps.max_bytes,
            }
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.snapshots.ledger().in_flight.remove(&self.id);
    }
}

/// Keeps the reaper's sweep off something this replica is making: a snapshot's payload before
/// its record is written (or, for a fork's, before the forks' containers hold it), a
/// copy-on-write workspace before its session's container exists. The sweep's age guard alone
/// cannot: Docker dates objects to the second, so under a short `SESSION_GRACE_SECONDS`
/// something made a moment ago already looks old. Released when dropped.
pub struct Pin<'a> {
    snapshots: &'a Snapshots,
    key: String,
}

impl std::fmt::Debug for Pin<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Pin").field(&self.key).finish()
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let mut ledger = self.snapshots.ledger();
        if let Some(n) = ledger.pins.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                ledger.pins.remove(&self.key);
            }
        }
    }
}

impl Snapshots {
    /// Pins `key` (a snapshot id or a workspace token) until the pin is dropped.
    pub(super) fn pin(&self, key: &str) -> Pin<'_> {
        *self.ledger().pins.entry(key.to_string()).or_default() += 1;
        Pin {
            snapshots: self,
            key: key.to_string(),
        }
    }

    pub(super) fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Measures the session's writable layer (its home, `/tmp`, whatever it changed outside
    /// the workspace: what the commit writes) and refuses up front what the caps cannot hold:
    /// over `SNAPSHOT_SIZE_MAX_BYTES`, or more than the room `SNAPSHOT_MAX_BYTES` leaves (the
    /// records, deleted snapshots' layers still held, this replica's forks and snapshots in
    /// flight counted). The workspace is bounded
    /// as it is copied ([`Reservation::copy_budget`]). Without `measure` (a snapshot that
    /// keeps nothing of the writable layer) that layer counts for nothing.
    pub(super) async fn reserve(
        &self,
        id: &str,
        info: &ContainerInfo,
        measure: bool,
    ) -> Result<Reservation<'_>, SnapshotError> {
        let caps = &self.config.snapshots;
        let layer = match measure {
            true => self.engine.writable_bytes(&info.id).await?.unwrap_or(0),
            false => 0,
        };
        if layer > caps.size_max {
            return Err(SnapshotError::TooLarge {
                cap: caps.size_max,
                found: layer,
                where_: "outside /workspace (the container's own files)",
            });
        }
        let recorded = self
            .list()
            .await?
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.size))
            .saturating_add(self.held_bytes().await?);
        let mut ledger = self.ledger();
        let held = recorded.saturating_add(ledger.total());
        let room = caps.max_bytes.saturating_sub(held);
        if layer >= room {
            return Err(SnapshotError::NoRoom {
                held,
                need: layer.max(1),
                cap: caps.max_bytes,
            });
        }
        ledger.in_flight.insert(id.to_string(), layer);
        let copy_budget = (caps.size_max - layer).min(room - layer);
        Ok(Reservation {
            snapshots: self,
            id: id.to_string(),
            layer,
            held,
            copy_budget,
        })
    }
}
