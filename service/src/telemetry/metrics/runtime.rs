//! The sandboxes' runtime as its probes found it (`telemetry::runtime_probe`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{Gauge, add};

/// `runtime_sound`: the sandboxes' OCI runtime (`runsc`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeLabels {
    pub runtime: &'static str,
}

/// `runtime_probed_images`: the runtime, and a verdict (`sound`, `unsound`, `unknown`). Images
/// are counted, never named: an image name is a client's input.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ImageVerdictLabels {
    pub runtime: &'static str,
    pub verdict: &'static str,
}

pub struct RuntimeMetrics {
    /// 1 when the probes found `ls` and `stat` working, 0 when they failed in an image; absent
    /// while not known.
    pub sound: Family<RuntimeLabels, Gauge>,
    /// The images probed (each on its first use, per engine), by verdict.
    pub images: Family<ImageVerdictLabels, Gauge>,
}

impl RuntimeMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            sound: add(
                r,
                "runtime_sound",
                "Whether the runtime probes found ls and stat working under the sandboxes' runtime (1) or failing in an image (0)",
                Family::default(),
            ),
            images: add(
                r,
                "runtime_probed_images",
                "Images sessions used that the runtime probe checked, by verdict (sound, unsound, unknown)",
                Family::default(),
            ),
        }
    }
}
