//! E2B's API on a port of its own (`E2B_PORT`, off unless set): the templates its `templateID`
//! names and what a sandbox created without `network` gets.

use std::collections::BTreeMap;

use super::parse::Parser;

/// The image `templateID: "base"` names unless `E2B_TEMPLATES` says otherwise: the project's
/// Debian image (`make images`), which has the user `user` and its home.
pub const DEFAULT_BASE_IMAGE: &str = "daiv-sandbox-debian:local";
/// The image of `code-interpreter-v1`, the template E2B's `e2b-code-interpreter` SDK creates by
/// default: the Debian image with Jupyter's kernels and the data libraries, whose helper starts
/// the code interpreter on port 49999 (`make images`).
pub const DEFAULT_CODE_INTERPRETER_IMAGE: &str = "daiv-sandbox-code-interpreter:local";

/// What a sandbox created without `network` (and without `allow_internet_access`) gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultNetwork {
    /// No network, as every session here without an egress policy.
    None,
    /// The egress gateway with `default: allow` (needs the egress CA).
    Allow,
}

#[derive(Debug, Clone)]
pub struct E2bConfig {
    /// The port of the E2B listener (`E2B_PORT`): the control API and envd, told apart by the
    /// `E2b-Sandbox-Id` header. `None`: not served.
    pub port: Option<u16>,
    /// Template name → image (`E2B_TEMPLATES`, a JSON object). A `templateID` that is neither a
    /// name here nor one of this deployment's snapshot ids is a 404.
    pub templates: BTreeMap<String, String>,
    /// `E2B_DEFAULT_NETWORK`: `none` (default) or `allow`.
    pub default_network: DefaultNetwork,
}

impl E2bConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let port = match p.get("E2B_PORT").filter(|s| !s.trim().is_empty()) {
            None => None,
            Some(raw) => match raw.trim().parse::<u16>() {
                Ok(0) | Err(_) => {
                    p.fail("E2B_PORT", &raw, "expected a port number (1-65535)");
                    None
                }
                Ok(port) => Some(port),
            },
        };
        let templates = match p.get("E2B_TEMPLATES").filter(|s| !s.trim().is_empty()) {
            None => BTreeMap::from([
                ("base".to_string(), DEFAULT_BASE_IMAGE.to_string()),
                (
                    "code-interpreter-v1".to_string(),
                    DEFAULT_CODE_INTERPRETER_IMAGE.to_string(),
                ),
            ]),
            Some(raw) => match serde_json::from_str::<BTreeMap<String, String>>(&raw) {
                Ok(map)
                    if map
                        .iter()
                        .all(|(k, v)| valid_name(k) && !v.trim().is_empty()) =>
                {
                    map
                }
                Ok(_) => {
                    p.fail(
                        "E2B_TEMPLATES",
                        &raw,
                        "each name must be 1 to 128 of [A-Za-z0-9._:/-] and each image non-blank",
                    );
                    BTreeMap::new()
                }
                Err(e) => {
                    p.fail(
                        "E2B_TEMPLATES",
                        &raw,
                        format!("expected a JSON object of name to image: {e}"),
                    );
                    BTreeMap::new()
                }
            },
        };
        let default_network = p.choice(
            "E2B_DEFAULT_NETWORK",
            DefaultNetwork::None,
            &[
                ("none", DefaultNetwork::None),
                ("allow", DefaultNetwork::Allow),
            ],
        );
        Self {
            port,
            templates,
            default_network,
        }
    }
}

fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b))
}
