//! Snapshots and forks: how long snapshots are kept, how many and how large they may be, one and in all,
//! and how many forks one request may make.

use std::time::Duration;

use super::parse::Parser;

/// Largest `FORK_MAX_COUNT` the settings accept.
const MAX_FORKS: u32 = 64;

#[derive(Debug, Clone)]
pub struct SnapshotConfig {
    /// Lifetime of a snapshot whose request gives no `ttl_seconds` (`SNAPSHOT_TTL_SECONDS`;
    /// 0 = kept until deleted or evicted by the caps).
    pub default_ttl: Option<Duration>,
    /// Most snapshots of this deployment kept; the oldest beyond it are removed
    /// (`SNAPSHOT_MAX_COUNT`).
    pub max_count: u32,
    /// Most bytes all snapshots of this deployment may hold; the oldest beyond it are removed
    /// (`SNAPSHOT_MAX_BYTES`).
    pub max_bytes: u64,
    /// Most bytes one snapshot (or a fork's) may hold, at the apparent size of its files
    /// (`SNAPSHOT_SIZE_MAX_BYTES`): measured before the freeze and counted during the copy, so
    /// a sandbox cannot turn sparse files into that much host disk.
    pub size_max: u64,
    /// Most forks one request may ask for (`FORK_MAX_COUNT`).
    pub fork_max: u32,
    /// Whether sessions from snapshots mount overlays over their layers where the engine can
    /// (`SNAPSHOT_LAYERS=auto`, probed per engine) or always get a copy (`copy`).
    pub layers: SnapshotLayers,
    /// Where a new session keeps what its user writes (`SNAPSHOT_STATE`): `commit`, the
    /// container's own layer outside `/workspace`, which a snapshot commits; `volumes`, every
    /// writable directory on a volume of its own, which a snapshot copies as layers and never
    /// commits (see `snapshots`).
    pub state: SnapshotState,
}

/// `SNAPSHOT_STATE`: see [`SnapshotConfig::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotState {
    Commit,
    Volumes,
}

/// `SNAPSHOT_LAYERS`: how sessions from snapshots get their workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotLayers {
    /// Overlays over the snapshot's layers on an engine whose start-up probe mounts one;
    /// copies elsewhere.
    Auto,
    /// A copy of the snapshot's layer on every engine (an operator's choice, e.g. a kernel
    /// whose overlayfs they do not trust with `userxattr`).
    Copy,
}

impl SnapshotConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let default_ttl =
            Some(p.seconds_or("SNAPSHOT_TTL_SECONDS", 7 * 24 * 3600)).filter(|d| !d.is_zero());
        let max_count = p.parse_or::<u32>("SNAPSHOT_MAX_COUNT", 100);
        let max_bytes = p.parse_or::<u64>("SNAPSHOT_MAX_BYTES", 50 * 1024 * 1024 * 1024);
        let size_max = p.parse_or::<u64>("SNAPSHOT_SIZE_MAX_BYTES", 10 * 1024 * 1024 * 1024);
        if size_max == 0 {
            p.fail(
                "SNAPSHOT_SIZE_MAX_BYTES",
                "0",
                "must be at least 1 (a snapshot holds at least its records)".to_string(),
            );
        }
        let fork_max = p.parse_or::<u32>("FORK_MAX_COUNT", 16);
        if !(1..=MAX_FORKS).contains(&fork_max) {
            p.fail(
                "FORK_MAX_COUNT",
                &fork_max.to_string(),
                format!("must be between 1 and {MAX_FORKS}"),
            );
        }
        let layers = p.choice(
            "SNAPSHOT_LAYERS",
            SnapshotLayers::Auto,
            &[
                ("auto", SnapshotLayers::Auto),
                ("copy", SnapshotLayers::Copy),
            ],
        );
        let state = p.choice(
            "SNAPSHOT_STATE",
            SnapshotState::Volumes,
            &[
                ("commit", SnapshotState::Commit),
                ("volumes", SnapshotState::Volumes),
            ],
        );
        Self {
            layers,
            state,
            default_ttl,
            max_count,
            max_bytes,
            size_max,
            fork_max: fork_max.clamp(1, MAX_FORKS),
        }
    }
}
