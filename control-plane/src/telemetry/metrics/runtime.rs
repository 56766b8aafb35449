//! The sandboxes' runtime as the start-up probe found it (`telemetry::runtime_probe`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{Gauge, add};

/// `runtime_sound`: the sandboxes' OCI runtime (`runsc`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeLabels {
    pub runtime: &'static str,
}

pub struct RuntimeMetrics {
    /// 1 when the probe found `ls` and `stat` working, 0 when they failed; absent while not known.
    pub sound: Family<RuntimeLabels, Gauge>,
}

impl RuntimeMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            sound: add(
                r,
                "runtime_sound",
                "Whether the start-up probe found ls and stat working under the sandboxes' runtime (1) or failing (0)",
                Family::default(),
            ),
        }
    }
}
