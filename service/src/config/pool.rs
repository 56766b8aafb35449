//! The warm pools: how many sessions of which image are kept ready, isolated and with egress.

use super::parse::Parser;

#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Warm pool of isolated sessions: (image, members) (`WARM_POOL`); empty = none.
    pub isolated: Vec<(String, u32)>,
    /// Warm pool of egress sessions (whole triads), likewise (`WARM_POOL_EGRESS`).
    pub egress: Vec<(String, u32)>,
    /// Warm pool of isolated sessions from a snapshot: (snapshot id, members)
    /// (`WARM_POOL_SNAPSHOTS`, `SNAPSHOT_ID=COUNT,...`).
    pub snapshots: Vec<(String, u32)>,
    /// Remove this deployment's unclaimed pool members on a clean shutdown (default: kept for
    /// the next start).
    pub remove_on_shutdown: bool,
}

impl PoolConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let targets = |p: &mut Parser<'_>, key: &str| match p.get(key) {
            None => Vec::new(),
            Some(raw) => parse_targets(&raw).unwrap_or_else(|why| {
                p.fail(key, &raw, why);
                Vec::new()
            }),
        };
        let isolated = targets(p, "WARM_POOL");
        let egress = targets(p, "WARM_POOL_EGRESS");
        let snapshots = targets(p, "WARM_POOL_SNAPSHOTS");
        if let Some((bad, _)) = snapshots.iter().find(|(id, _)| !is_snapshot_id(id)) {
            let bad = bad.clone();
            p.fail(
                "WARM_POOL_SNAPSHOTS",
                &bad,
                "expected SNAPSHOT_ID=COUNT with snapshot ids (32 hex digits)",
            );
        }
        let remove_on_shutdown = p.bool_or("WARM_POOL_REMOVE_ON_SHUTDOWN", false);

        Self {
            isolated,
            egress,
            snapshots,
            remove_on_shutdown,
        }
    }
}

use crate::ids::is_snapshot_id;

/// Largest member count per image.
const MAX_MEMBERS: u32 = 64;

/// `IMAGE=COUNT[,IMAGE=COUNT...]`; a count of 0 configures nothing for that image.
pub fn parse_targets(raw: &str) -> Result<Vec<(String, u32)>, String> {
    let mut out: Vec<(String, u32)> = Vec::new();
    for item in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((image, count)) = item.rsplit_once('=') else {
            return Err(format!("{item:?}: expected IMAGE=COUNT"));
        };
        let image = image.trim();
        if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("{item:?}: not an image reference"));
        }
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| format!("{item:?}: the count must be a whole number"))?;
        if count > MAX_MEMBERS {
            return Err(format!("{item:?}: at most {MAX_MEMBERS} members per image"));
        }
        if out.iter().any(|(i, _)| i == image) {
            return Err(format!("{image:?} is listed twice"));
        }
        if count > 0 {
            out.push((image.to_string(), count));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn targets_parse_and_are_validated() {
        assert_eq!(
            parse_targets(" a:1=2, registry:5000/b@sha256:00=1 ,c=0"),
            Ok(vec![
                ("a:1".to_string(), 2),
                ("registry:5000/b@sha256:00".to_string(), 1)
            ])
        );
        assert_eq!(parse_targets(""), Ok(Vec::new()));
        for bad in ["a", "a=x", "=2", "a=2,a=1", "a=65", "a b=1"] {
            assert!(parse_targets(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn settings_are_read_and_an_egress_pool_needs_the_ca() {
        let env = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let c =
            crate::config::load(&env(&[("API_KEY", "k"), ("WARM_POOL", "a:1=3")])).expect("valid");
        assert_eq!(c.pool.isolated, vec![("a:1".to_string(), 3)]);
        assert!(c.pool.egress.is_empty() && !c.pool.remove_on_shutdown);
        let Err(e) = crate::config::load(&env(&[
            ("API_KEY", "k"),
            ("WARM_POOL", "a:1=x"),
            ("WARM_POOL_EGRESS", "a:1=1"),
        ])) else {
            panic!("accepted");
        };
        let e = e.to_string();
        assert!(
            e.contains("DAIV_SANDBOX_WARM_POOL=") && e.contains("WARM_POOL_EGRESS: egress"),
            "{e}"
        );
    }
}
