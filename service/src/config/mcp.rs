//! The MCP endpoint (`/mcp`): its transport mode, the DNS-rebinding guard's hosts and origins,
//! how many sessions it keeps and for how long, and the bounds of a request and of a tool's
//! answer.

use std::time::Duration;

use super::parse::Parser;

#[derive(Debug, Clone)]
pub struct McpConfig {
    /// Serve every request on its own, without an MCP session (`MCP_STATELESS`): for clients
    /// behind load balancers, or replicas that share nothing. Default: sessions
    /// (`Mcp-Session-Id`), kept in this process.
    pub stateless: bool,
    /// MCP sessions this process keeps at once (`MCP_MAX_SESSIONS`): past it a new session
    /// replaces the least recently used idle one, or is refused with 503 when none is idle.
    /// Each costs about 55 KiB (see docs/operations/admission.md).
    pub max_sessions: usize,
    /// How long a session with no request in flight and no stream open is kept
    /// (`MCP_SESSION_IDLE_SECONDS`). A connected client holds its `GET` stream open, so this
    /// ends the sessions of clients that went without closing theirs.
    pub session_idle: Duration,
    /// `Host` values (`name` or `name:port`) the endpoint answers (`MCP_ALLOWED_HOSTS`, comma
    /// separated); a request naming any other host is a 403, so a web page cannot reach the
    /// service through DNS rebinding. Default: loopback only. `*` alone turns the check off.
    pub allowed_hosts: Vec<String>,
    /// Browser `Origin` values (`scheme://host[:port]`, `:*` for any port) allowed to call
    /// (`MCP_ALLOWED_ORIGINS`); a request without `Origin` (every non-browser client) passes.
    /// Default: loopback origins. `*` alone turns the check off.
    pub allowed_origins: Vec<String>,
    /// Largest request body, checked as it arrives (`MCP_MAX_REQUEST_BYTES`): 413 past it.
    pub max_request_bytes: usize,
    /// Most bytes of command output one `run` answers with, shared by its commands
    /// (`MCP_RUN_OUTPUT_BYTES`); the middle of a longer output is replaced by a marker.
    pub run_output_bytes: usize,
}

/// What the DNS-rebinding guard lets through when nothing is set.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];
pub const LOOPBACK_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "http://127.0.0.1:*",
    "http://[::1]:*",
    "https://localhost:*",
    "https://127.0.0.1:*",
    "https://[::1]:*",
];

impl McpConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let stateless = p.bool_or("MCP_STATELESS", false);
        let max_sessions = p.parse_or::<usize>("MCP_MAX_SESSIONS", 1000);
        if !(1..=1_000_000).contains(&max_sessions) {
            p.fail(
                "MCP_MAX_SESSIONS",
                &max_sessions.to_string(),
                "must be between 1 and 1000000",
            );
        }
        let session_idle = p.seconds_or("MCP_SESSION_IDLE_SECONDS", 120);
        if !(1..=86_400).contains(&session_idle.as_secs()) {
            p.fail(
                "MCP_SESSION_IDLE_SECONDS",
                &session_idle.as_secs().to_string(),
                "must be between 1 and 86400",
            );
        }
        let allowed_hosts = list(p, "MCP_ALLOWED_HOSTS", &LOOPBACK_HOSTS);
        let allowed_origins = list(p, "MCP_ALLOWED_ORIGINS", &LOOPBACK_ORIGINS);
        for o in &allowed_origins {
            if o != "*" && o != "null" && !o.contains("://") {
                let raw = o.clone();
                p.fail(
                    "MCP_ALLOWED_ORIGINS",
                    &raw,
                    "each origin needs its scheme (http://host:port, :* for any port)",
                );
            }
        }
        let max_request_bytes = p.parse_or::<usize>("MCP_MAX_REQUEST_BYTES", 8 * 1024 * 1024);
        if max_request_bytes < 1024 {
            p.fail(
                "MCP_MAX_REQUEST_BYTES",
                &max_request_bytes.to_string(),
                "must be at least 1024",
            );
        }
        let run_output_bytes = p.parse_or::<usize>("MCP_RUN_OUTPUT_BYTES", 64 * 1024);
        if run_output_bytes < 1024 {
            p.fail(
                "MCP_RUN_OUTPUT_BYTES",
                &run_output_bytes.to_string(),
                "must be at least 1024",
            );
        }
        Self {
            stateless,
            max_sessions: max_sessions.clamp(1, 1_000_000),
            session_idle: session_idle.clamp(Duration::from_secs(1), Duration::from_secs(86_400)),
            allowed_hosts,
            allowed_origins,
            max_request_bytes: max_request_bytes.max(1024),
            run_output_bytes: run_output_bytes.max(1024),
        }
    }

    /// `*` alone: the host check is off.
    pub fn any_host(&self) -> bool {
        self.allowed_hosts.iter().any(|h| h == "*")
    }

    /// `*` alone: the origin check is off.
    pub fn any_origin(&self) -> bool {
        self.allowed_origins.iter().any(|o| o == "*")
    }
}

/// A comma-separated list, blanks dropped; `default` when unset.
fn list(p: &mut Parser<'_>, key: &str, default: &[&str]) -> Vec<String> {
    match p.get(key) {
        Some(raw) => raw
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
        None => default.iter().map(|s| s.to_string()).collect(),
    }
}
