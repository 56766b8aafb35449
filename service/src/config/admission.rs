//! How much work the service takes on at once: the slots of each class of request (creates,
//! seeds, fs operations in total and per session) and the short queue in front of them. Each
//! in-flight request of a class costs memory; the slots make the service's peak a function of
//! these settings instead of how many requests arrive together (docs/operations/admission.md).

use std::time::Duration;

use super::parse::Parser;

/// Longest queue wait the settings accept: past a few minutes a client's own timeout fires first.
const MAX_QUEUE_SECONDS: f64 = 300.0;

#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// Session creates in flight (`MAX_CONCURRENT_CREATES`).
    pub creates: usize,
    /// Seeds in flight (`MAX_CONCURRENT_SEEDS`).
    pub seeds: usize,
    /// fs operations in flight over all sessions (`MAX_CONCURRENT_FS_OPS`).
    pub fs_ops: usize,
    /// fs operations in flight on one session (`MAX_CONCURRENT_FS_OPS_PER_SESSION`).
    pub fs_ops_per_session: usize,
    /// Longest a request waits for a slot before a 429 (`ADMISSION_QUEUE_SECONDS`; zero: none).
    pub queue_wait: Duration,
    /// Most requests waiting for a slot, per class (and per session for the per-session bound);
    /// one more is a 429 at once (`ADMISSION_QUEUE_LENGTH`).
    pub queue_length: usize,
}

impl AdmissionConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let mut slots = |key: &str, default: usize| {
            let n = p.parse_or::<usize>(key, default);
            if !(1..=4096).contains(&n) {
                let raw = n.to_string();
                p.fail(key, &raw, "must be between 1 and 4096");
                return default;
            }
            n
        };
        let creates = slots("MAX_CONCURRENT_CREATES", 8);
        let seeds = slots("MAX_CONCURRENT_SEEDS", 4);
        let fs_ops = slots("MAX_CONCURRENT_FS_OPS", 32);
        let fs_ops_per_session = slots("MAX_CONCURRENT_FS_OPS_PER_SESSION", 8);

        let queue_wait = match p.get("ADMISSION_QUEUE_SECONDS") {
            None => Duration::from_secs(30),
            Some(raw) => match raw.trim().parse::<f64>() {
                Ok(v) if v.is_finite() && (0.0..=MAX_QUEUE_SECONDS).contains(&v) => {
                    Duration::from_secs_f64(v)
                }
                _ => {
                    p.fail(
                        "ADMISSION_QUEUE_SECONDS",
                        &raw,
                        "expected seconds between 0 and 300",
                    );
                    Duration::from_secs(30)
                }
            },
        };
        let queue_length = p.parse_or::<usize>("ADMISSION_QUEUE_LENGTH", 64);
        if queue_length > 65_536 {
            let raw = queue_length.to_string();
            p.fail("ADMISSION_QUEUE_LENGTH", &raw, "must be at most 65536");
        }

        Self {
            creates,
            seeds,
            fs_ops,
            fs_ops_per_session,
            queue_wait,
            queue_length: queue_length.min(65_536),
        }
    }
}
