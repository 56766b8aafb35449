//! Sessions' lifecycle and the commands run in them (`sessions`, the reaper).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{Counter, Histogram, add, histogram};

/// `sessions_closed_total`: `stop` or `remove`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub mode: &'static str,
}

pub struct SessionMetrics {
    pub created: Counter,
    pub closed: Family<ModeLabels, Counter>,
    /// Removed by the reaper (expired, over the stopped cap, idle).
    pub reaped: Counter,
    pub reaper_failures: Counter,
    /// Commands executed, one per entry of a run request.
    pub commands: Counter,
    /// Whole run requests, all their commands.
    pub command_batches: Histogram,
}

impl SessionMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            created: add(
                r,
                "sessions_created",
                "Sessions created",
                Counter::default(),
            ),
            closed: add(
                r,
                "sessions_closed",
                "Sessions closed through the API, by mode (stop or remove)",
                Family::default(),
            ),
            reaped: add(
                r,
                "sessions_reaped",
                "Sessions removed by the reaper (expired, over the stopped cap, idle)",
                Counter::default(),
            ),
            reaper_failures: add(
                r,
                "reaper_failures",
                "Reaper sweeps or removals that failed",
                Counter::default(),
            ),
            commands: add(
                r,
                "commands",
                "Commands run (each entry of a run request that was executed)",
                Counter::default(),
            ),
            command_batches: add(
                r,
                "command_batch_duration_seconds",
                "Duration of run requests (all their commands), successful or not",
                histogram(),
            ),
        }
    }
}
