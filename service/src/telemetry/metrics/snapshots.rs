//! Snapshots, forks and pauses (`sessions::fork`, `sessions::lifecycle`, the reaper's count).

use prometheus_client::registry::Registry;

use super::{Counter, Gauge, add};

pub struct SnapshotMetrics {
    /// Taken through the API.
    pub taken: Counter,
    /// Sessions made by forks.
    pub forks: Counter,
    /// Sessions paused.
    pub pauses: Counter,
    /// Snapshots of this deployment and the bytes they hold, as the reaper last counted them.
    pub held: Gauge,
    pub bytes: Gauge,
}

impl SnapshotMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            taken: add(
                r,
                "snapshots_taken",
                "Snapshots taken through the API",
                Counter::default(),
            ),
            forks: add(r, "forks", "Sessions made by forks", Counter::default()),
            pauses: add(r, "pauses", "Sessions paused", Counter::default()),
            held: add(
                r,
                "snapshots_held",
                "Snapshots of this deployment, as the reaper last counted them",
                Gauge::default(),
            ),
            bytes: add(
                r,
                "snapshot_bytes",
                "Bytes held by this deployment's snapshots, as the reaper last counted them",
                Gauge::default(),
            ),
        }
    }
}
