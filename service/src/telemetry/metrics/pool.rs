//! The warm pool (`pool`): members ready, claimed, missed and built.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{Counter, Gauge, Histograms, add, histograms};

/// A warm pool: a configured image and the kind (`isolated`, `egress`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub image: String,
    pub kind: &'static str,
}

/// `pool_misses_total`: a pool and why a request went cold (`empty`, `limits`, `apply`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolMissLabels {
    pub image: String,
    pub kind: &'static str,
    pub reason: &'static str,
}

/// `pool_refill_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

pub struct PoolMetrics {
    /// Ready members per (image, kind), as this replica last counted them.
    pub size: Family<PoolLabels, Gauge>,
    pub claims: Family<PoolLabels, Counter>,
    /// Requests a pool was configured for that went cold, by (image, kind, reason).
    pub misses: Family<PoolMissLabels, Counter>,
    pub refill_failures: Family<PoolLabels, Counter>,
    /// Time to build one member, by kind.
    pub refills: Histograms<KindLabels>,
    /// Ready members per pool and engine (a fleet's engines each count their own); only their
    /// sum per pool, `size`, is exported.
    by_engine: Mutex<HashMap<(PoolLabels, String), u64>>,
}

impl PoolMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            size: add(
                r,
                "pool_size",
                "Ready warm-pool members by image and kind, as this replica last counted them",
                Family::default(),
            ),
            claims: add(
                r,
                "pool_claims",
                "Sessions handed out from the warm pool, by image and kind",
                Family::default(),
            ),
            misses: add(
                r,
                "pool_misses",
                "Requests for a pooled image and kind created cold, by reason (empty, limits, apply)",
                Family::default(),
            ),
            refill_failures: add(
                r,
                "pool_refill_failures",
                "Warm-pool members that could not be built, or pools that could not be checked",
                Family::default(),
            ),
            refills: add(
                r,
                "pool_refill_duration_seconds",
                "Time to build one warm-pool member (create, start and, for egress, the triad)",
                histograms(),
            ),
            by_engine: Mutex::default(),
        }
    }

    /// Sets, or moves by `delta` when `set` is `None`, the ready members of pool `labels` on
    /// `engine`; `size` shows the sum over the engines.
    pub fn members(&self, labels: &PoolLabels, engine: &str, set: Option<u64>, delta: i64) {
        let mut counts = self
            .by_engine
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = counts
            .entry((labels.clone(), engine.to_string()))
            .or_default();
        *n = match set {
            Some(v) => v,
            None => n.saturating_add_signed(delta),
        };
        let total = counts
            .iter()
            .filter(|((l, _), _)| l == labels)
            .map(|(_, n)| *n)
            .sum();
        self.size.get_or_create(labels).set(total);
    }
}
