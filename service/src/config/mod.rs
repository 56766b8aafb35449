//! `DAIV_SANDBOX_*` settings: names, defaults and meanings follow the reference README's table.
//!
//! Every variable is parsed and validated at start-up; all problems are collected and reported at
//! once, each naming its variable, so an operator fixes a deployment in one round trip.
//! A value may also come from a file under `/run/secrets/` named after the variable (as Docker and
//! Kubernetes secrets are mounted); the environment wins over the file, and an empty value counts
//! as unset.
//!
//! # Layout
//! Settings come in groups, each a struct with its own `load` (in a module of the same name) over
//! the shared readers of `parse`, so a subsystem receives (and a reader finds) only what concerns
//! it:
//! - [`ServerConfig`] (`server`): where the API listens, its key and path prefix;
//! - [`SessionsConfig`] (`sessions`): runtime, user, network, helper, command timeouts and
//!   per-session limits;
//! - [`ReaperConfig`] (`reaper`): the sweep's schedule and the lifetimes it enforces;
//! - [`EgressConfig`] (`egress`): the gateway sidecar, its CA, reach and networks;
//! - [`CoordinationConfig`] (`coordination`): Redis for locks and activity, lock durations;
//! - [`TelemetryConfig`] (`telemetry`): environment, log level, Sentry;
//! - [`PoolConfig`] (`pool`): the warm pools;
//! - [`AdmissionConfig`] (`admission`): how many creates, seeds and fs operations run at once,
//!   and how long a request waits for a slot;
//! - [`FleetConfig`] (`fleet`): the Docker engines sessions are placed on (`ENGINES_FILE`).
//!
//! [`load`] runs every group's `load` on one parser, which records each problem instead of
//! stopping at it, then checks what spans groups; only then does it fail, listing them all.

mod admission;
mod coordination;
mod e2b;
mod egress;
mod fleet;
mod ingress;
mod mcp;
mod opensandbox;
mod parse;
mod pool;
mod reaper;
mod server;
mod sessions;
mod snapshots;
mod telemetry;
#[cfg(test)]
mod tests;

pub use admission::AdmissionConfig;
pub use coordination::CoordinationConfig;
pub use e2b::{DEFAULT_CODE_INTERPRETER_IMAGE, DefaultNetwork, E2bConfig};
pub use egress::{EgressCa, EgressConfig};
pub use fleet::{
    Endpoint, EngineSpec, FleetConfig, TlsFiles, endpoint_kind, parse_engines, read_engines,
};
pub use ingress::IngressConfig;
pub use mcp::McpConfig;
pub use opensandbox::OpenSandboxConfig;
pub use parse::{ProcessEnv, Source};
pub use pool::PoolConfig;
pub use reaper::ReaperConfig;
pub use server::ServerConfig;
pub use sessions::{DEFAULT_PRUNE_DIRS, Runtime, SessionsConfig};
pub use snapshots::{SnapshotConfig, SnapshotLayers, SnapshotState};
pub use telemetry::{Environment, LogLevel, SentryConfig, TelemetryConfig};

use parse::Parser;

pub const PREFIX: &str = "DAIV_SANDBOX_";

pub use crate::secret::Secret;

#[derive(Debug, Clone)]
pub struct Config {
    /// Name of this deployment, carried by everything it creates: replicas of one deployment
    /// share it, and the reaper never touches another deployment's sessions on a shared engine.
    /// Every group's resources carry it, so it belongs to none of them.
    pub deployment: String,
    pub server: ServerConfig,
    pub sessions: SessionsConfig,
    pub reaper: ReaperConfig,
    pub egress: EgressConfig,
    pub coordination: CoordinationConfig,
    pub telemetry: TelemetryConfig,
    pub pool: PoolConfig,
    pub admission: AdmissionConfig,
    pub snapshots: SnapshotConfig,
    pub fleet: FleetConfig,
    /// The MCP endpoint (`/mcp`).
    pub mcp: McpConfig,
    /// E2B's API on its own port.
    pub e2b: E2bConfig,
    /// OpenSandbox's API on its own port.
    pub opensandbox: OpenSandboxConfig,
    /// Reaching servers inside sandboxes (`/session/{id}/ports/...`).
    pub ingress: IngressConfig,
}

/// Every invalid variable, one per line.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n{}", .0.join("\n"))]
pub struct ConfigError(pub Vec<String>);

/// Parses and validates every setting; `Err` lists each bad variable.
pub fn load(src: &dyn Source) -> Result<Config, ConfigError> {
    let mut p = Parser::new(src);
    let server = ServerConfig::load(&mut p);
    let telemetry = TelemetryConfig::load(&mut p);
    let sessions = SessionsConfig::load(&mut p);
    let egress = EgressConfig::load(&mut p);
    let coordination = CoordinationConfig::load(&mut p);
    let reaper = ReaperConfig::load(&mut p);
    let deployment = deployment(&mut p);
    let pool = PoolConfig::load(&mut p);
    let admission = AdmissionConfig::load(&mut p);
    let snapshots = SnapshotConfig::load(&mut p);
    let fleet = FleetConfig::load(&mut p);
    let mcp = McpConfig::load(&mut p);
    let e2b = E2bConfig::load(&mut p);
    let opensandbox = OpenSandboxConfig::load(&mut p);
    let ingress = IngressConfig::load(&mut p);

    // Across groups: a warm egress session is a whole triad, so it needs the CA.
    if !pool.egress.is_empty() && egress.ca.is_none() {
        p.errors.push(format!(
            "{PREFIX}WARM_POOL_EGRESS: egress sessions need {PREFIX}EGRESS_CA_CERT_FILE and {PREFIX}EGRESS_CA_KEY_FILE"
        ));
    }

    if e2b.default_network == DefaultNetwork::Allow && egress.ca.is_none() {
        p.errors.push(format!(
            "{PREFIX}E2B_DEFAULT_NETWORK=allow: the gateway needs {PREFIX}EGRESS_CA_CERT_FILE and {PREFIX}EGRESS_CA_KEY_FILE"
        ));
    }

    p.finish()?;
    Ok(Config {
        deployment,
        server,
        sessions,
        reaper,
        egress,
        coordination,
        telemetry,
        pool,
        admission,
        snapshots,
        fleet,
        mcp,
        e2b,
        opensandbox,
        ingress,
    })
}

/// `DEPLOYMENT`: a name fit for a Docker label value and a Redis key part.
fn deployment(p: &mut Parser<'_>) -> String {
    let deployment = p.string_or("DEPLOYMENT", "default");
    if deployment.is_empty()
        || deployment.len() > 63
        || !deployment
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        let raw = deployment.clone();
        p.fail(
            "DEPLOYMENT",
            &raw,
            "expected up to 63 letters, digits, '-', '_' or '.'",
        );
    }
    deployment
}

/// A configuration from `DAIV_SANDBOX_*` pairs (names without the prefix) over an API key, for
/// in-process tests; panics on an invalid test setup.
#[cfg(any(test, feature = "test-util"))]
pub fn for_tests(api_key: &str, extra: &[(&str, &str)]) -> std::sync::Arc<Config> {
    use std::collections::HashMap;

    let mut env: HashMap<String, String> = HashMap::from([("API_KEY".into(), api_key.into())]);
    for (k, v) in extra {
        env.insert(k.to_string(), v.to_string());
    }
    match load(&env) {
        Ok(c) => std::sync::Arc::new(c),
        Err(e) => panic!("test config invalid: {e}"),
    }
}
