//! The fleet's engines and its engines file (`fleet`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{Counter, Gauge, add};

/// An engine of the fleet.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineLabels {
    pub engine: String,
}

pub struct FleetMetrics {
    /// 1 while an engine of the fleet answers, 0 while it is down.
    pub up: Family<EngineLabels, Gauge>,
    /// 1 while an engine is drained (no new sessions).
    pub draining: Family<EngineLabels, Gauge>,
    /// Sessions (warm-pool members included) an engine holds, as last counted.
    pub sessions: Family<EngineLabels, Gauge>,
    /// Creates refused because no engine could take a session.
    pub placements_refused: Counter,
    /// 1 while the engines file last read was valid, 0 while a bad one is ignored.
    pub file_valid: Gauge,
    /// Changes of the engines file that were refused (the last good list kept).
    pub file_errors: Counter,
}

impl FleetMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            up: add(
                r,
                "engine_up",
                "Whether an engine of the fleet answers (1) or is down (0)",
                Family::default(),
            ),
            draining: add(
                r,
                "engine_draining",
                "Whether an engine of the fleet is drained: no new sessions (1)",
                Family::default(),
            ),
            sessions: add(
                r,
                "engine_sessions",
                "Sessions (warm-pool members included) an engine holds, as last counted",
                Family::default(),
            ),
            placements_refused: add(
                r,
                "placements_refused",
                "Session creates refused because no engine could take one",
                Counter::default(),
            ),
            file_valid: add(
                r,
                "engines_file_valid",
                "Whether the engines file last read was valid (1) or is ignored for the last good one (0)",
                Gauge::default(),
            ),
            file_errors: add(
                r,
                "engines_file_errors",
                "Changes of the engines file refused as invalid",
                Counter::default(),
            ),
        }
    }
}
