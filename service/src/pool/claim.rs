//! What a claim writes into a member's name (its labels were written for the pool): when it was
//! claimed and the limits it applied, read back by the session listing without an inspect.

use crate::api::StartSessionRequest;
use crate::engine::{ContainerInfo, POOL_LABEL};

use super::CLAIMED;

/// What a claimed member's name says of its session: when it was claimed and the limits the
/// claim applied. Its labels were written for the pool (no limits, the member's creation time),
/// so the session listing reads these instead, without an inspect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Claim {
    /// Unix seconds.
    pub at: i64,
    pub memory_bytes: Option<i64>,
    pub nano_cpus: Option<i64>,
}

impl Claim {
    pub(super) fn for_request(req: &StartSessionRequest) -> Self {
        Self {
            at: crate::time::unix_now(),
            memory_bytes: req.memory_bytes,
            nano_cpus: req.cpus.map(crate::api::nano_cpus),
        }
    }

    /// The claimed name of the member `token`: `daiv-claimed-<token>.t<at>[.m<bytes>][.c<nano>]`.
    pub(super) fn name(&self, token: &str) -> String {
        let mut name = format!("{CLAIMED}{token}.t{}", self.at);
        if let Some(m) = self.memory_bytes {
            name.push_str(&format!(".m{m}"));
        }
        if let Some(c) = self.nano_cpus {
            name.push_str(&format!(".c{c}"));
        }
        name
    }

    /// The claim a claimed member's name records (`None` for any other container).
    pub fn of(info: &ContainerInfo) -> Option<Self> {
        info.label(POOL_LABEL)?;
        let rest = info.name.strip_prefix(CLAIMED)?;
        let mut claim = Self::default();
        for part in rest.split('.').skip(1) {
            let (tag, value) = part.split_at_checked(1)?;
            let value: i64 = value.parse().ok()?;
            match tag {
                "t" => claim.at = value,
                "m" => claim.memory_bytes = Some(value),
                "c" => claim.nano_cpus = Some(value),
                _ => {}
            }
        }
        Some(claim)
    }
}
