//! The audit trail: exactly one JSON line per decision.
//!
//! Built from typed fields only, so nothing can smuggle in a secret: there is no field for a header
//! value, and the path is recorded without its query string (tokens often travel there).

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// One decision. Field names are the stable log vocabulary.
#[derive(Debug, Clone, Serialize)]
pub struct AuditRecord {
    /// RFC 3339 UTC.
    pub time: String,
    /// The sandbox session this gateway serves.
    pub session: String,
    /// `tunnel` (blind), `mitm` (terminated TLS), `forward` (plaintext absolute-form), `connect`.
    pub mode: &'static str,
    /// HTTP method (`CONNECT` for tunnel decisions).
    pub method: String,
    /// Normalised destination host.
    pub host: String,
    /// Destination port.
    pub port: u16,
    /// Path without query string; absent for CONNECT.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `allow`, `deny` or `error`.
    pub decision: &'static str,
    /// `false` when the decision was only reported (shadow mode): a `deny` that was let through.
    pub enforced: bool,
    /// Stable reason code.
    pub reason: &'static str,
    /// Host glob of the deciding rule, if one decided.
    pub rule: Option<String>,
    /// Name (never value) of the injected header, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub injected: Option<String>,
    /// A plaintext exchange under the operator's plain-HTTP opt-in (`--plain-http-hosts`): sent
    /// in clear to a private address, its credential (`injected`) included. Absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub plain_http_opt_in: bool,
    /// Status sent to the client (200 for an opened tunnel), if a response was sent.
    pub status: Option<u16>,
    /// Body (or tunnel) bytes sent to the client.
    pub bytes: u64,
    /// Body (or tunnel) bytes sent upstream.
    pub bytes_up: u64,
    /// From decision to end of the exchange.
    pub duration_ms: u64,
    /// The `version` of the policy that decided, if the file has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<String>,
}

// === impl AuditRecord ===

impl AuditRecord {
    /// A record for one exchange, stamped now; until the exchange says otherwise it is a denial
    /// with no reason, so a record written early never reads as an allow.
    pub fn start(
        session: &str,
        mode: &'static str,
        method: &str,
        host: &str,
        port: u16,
        path: Option<String>,
    ) -> Self {
        Self {
            time: now_rfc3339(),
            session: session.to_owned(),
            mode,
            method: method.to_owned(),
            host: host.to_owned(),
            port,
            path,
            decision: "deny",
            enforced: true,
            reason: "",
            rule: None,
            injected: None,
            plain_http_opt_in: false,
            status: None,
            bytes: 0,
            bytes_up: 0,
            duration_ms: 0,
            policy_version: None,
        }
    }
}

/// Where audit lines go.
pub trait AuditSink: Send + Sync + 'static {
    /// Records one decision.
    fn record(&self, record: &AuditRecord);
}

/// The production sink: one line on stdout (diagnostic logs go to stderr).
#[derive(Debug, Default)]
pub struct StdoutSink;

impl AuditSink for StdoutSink {
    fn record(&self, record: &AuditRecord) {
        if let Ok(mut line) = serde_json::to_vec(record) {
            line.push(b'\n');
            let _ = std::io::stdout().lock().write_all(&line);
        }
    }
}

/// Keeps lines in memory: for tests and embedding.
#[derive(Debug, Default)]
pub struct MemorySink {
    lines: Mutex<Vec<String>>,
}

impl MemorySink {
    /// A new, empty sink.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The lines recorded so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl AuditSink for MemorySink {
    fn record(&self, record: &AuditRecord) {
        if let (Ok(line), Ok(mut lines)) = (serde_json::to_string(record), self.lines.lock()) {
            lines.push(line);
        }
    }
}

/// Now, as RFC 3339.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
