//! A session's files: fs operations and seeds (`workspace`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::Registry;

use super::{Counter, Histograms, add, histograms};

/// `fs_op_duration_seconds`: the op and its outcome (`ok`, an fs error code, or `api_error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FsLabels {
    pub op: &'static str,
    pub code: String,
}

/// `seed_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

pub struct WorkspaceMetrics {
    pub fs_ops: Histograms<FsLabels>,
    pub seeds: Histograms<OutcomeLabels>,
    /// Decompressed bytes written by successful seeds.
    pub seed_bytes: Counter,
}

impl WorkspaceMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            fs_ops: add(
                r,
                "fs_op_duration_seconds",
                "fs operations by op and outcome code (ok, an fs error code, or api_error)",
                histograms(),
            ),
            seeds: add(
                r,
                "seed_duration_seconds",
                "Seed requests by outcome",
                histograms(),
            ),
            seed_bytes: add(
                r,
                "seed_bytes",
                "Decompressed archive bytes written by successful seeds",
                Counter::default(),
            ),
        }
    }
}
