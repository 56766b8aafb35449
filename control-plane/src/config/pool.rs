//! The warm pools: how many sessions of which image are kept ready, isolated and with egress.

use super::parse::Parser;

#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Warm pool of isolated sessions: (image, members) (`WARM_POOL`); empty = none.
    pub isolated: Vec<(String, u32)>,
    /// Warm pool of egress sessions (whole triads), likewise (`WARM_POOL_EGRESS`).
    pub egress: Vec<(String, u32)>,
    /// Remove this deployment's unclaimed pool members on a clean shutdown (default: kept for
    /// the next start).
    pub remove_on_shutdown: bool,
}

impl PoolConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let targets = |p: &mut Parser<'_>, key: &str| match p.get(key) {
            None => Vec::new(),
            Some(raw) => crate::pool::parse_targets(&raw).unwrap_or_else(|why| {
                p.fail(key, &raw, why);
                Vec::new()
            }),
        };
        let isolated = targets(p, "WARM_POOL");
        let egress = targets(p, "WARM_POOL_EGRESS");
        let remove_on_shutdown = p.bool_or("WARM_POOL_REMOVE_ON_SHUTDOWN", false);

        Self {
            isolated,
            egress,
            remove_on_shutdown,
        }
    }
}
