//! OpenSandbox's API on a port of its own (`OPENSANDBOX_PORT`, off unless set).

use super::parse::Parser;

#[derive(Debug, Clone, Default)]
pub struct OpenSandboxConfig {
    /// The port of the OpenSandbox listener (`OPENSANDBOX_PORT`): its lifecycle API under `/v1`
    /// and, at the endpoints it answers, each sandbox's execd. `None`: not served.
    pub port: Option<u16>,
}

impl OpenSandboxConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let port = match p.get("OPENSANDBOX_PORT").filter(|s| !s.trim().is_empty()) {
            None => None,
            Some(raw) => match raw.trim().parse::<u16>() {
                Ok(0) | Err(_) => {
                    p.fail("OPENSANDBOX_PORT", &raw, "expected a port number (1-65535)");
                    None
                }
                Ok(port) => Some(port),
            },
        };
        Self { port }
    }
}
