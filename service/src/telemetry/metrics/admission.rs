//! Admission's classes (`crate::admission`): slots held, requests queued and refused.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{Counter, Gauge, add};

/// An admission class (`create`, `seed`, `fs`, `fs_session`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub class: &'static str,
}

/// `admission_refused_total`: a class and why (`queue_full`, `timeout`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub class: &'static str,
    pub reason: &'static str,
}

pub struct AdmissionMetrics {
    /// Requests holding a slot of a class.
    pub in_flight: Family<ClassLabels, Gauge>,
    /// Requests queued for a slot of a class.
    pub waiting: Family<ClassLabels, Gauge>,
    /// Requests answered 429, by class and reason.
    pub refused: Family<RefusedLabels, Counter>,
}

impl AdmissionMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            in_flight: add(
                r,
                "admission_in_flight",
                "Requests holding a slot, by admission class (create, seed, fs, fs_session)",
                Family::default(),
            ),
            waiting: add(
                r,
                "admission_waiting",
                "Requests queued for a slot, by admission class",
                Family::default(),
            ),
            refused: add(
                r,
                "admission_refused",
                "Requests answered 429 for want of a slot, by admission class and reason (queue_full, timeout)",
                Family::default(),
            ),
        }
    }
}
