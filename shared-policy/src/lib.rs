//! Egress policy: the file format shared by the control plane (which validates and writes it)
//! and the egress gateway (which enforces it). No I/O, no async, no logging: data in, decision out.
//!
//! # Layout
//! - [`model`]: the serde types of the policy file (`{"policy": {...}, "secrets": {...}}`).
//! - [`host`]: host normalisation (case, trailing dot, IDNA, port, IP literals).
//! - [`eval`]: validation, and the [`Evaluator`] that answers CONNECT and per-request decisions.
//! - [`error`]: [`PolicyError`], whose text is suitable for an API's 422 `detail`, and the one
//!   redactor of serde messages, [`redact`] (the control plane uses it too).
//!
//! # Reason codes
//! Stable, sent to the agent in `X-Egress-Denied` and to the audit log (see [`Reason::code`]):
//! `rule-allowed`, `default-allow`, `host-not-listed`, `method-not-allowed`, `path-not-allowed`,
//! `policy-unavailable`.
//! The gateway adds its own for checks outside the policy (destination binding, address guard).
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod error;
pub mod eval;
pub mod host;
pub mod model;
pub mod sidecar;

pub use error::{PolicyError, redact};
pub use eval::{
    ConnectDecision, Evaluator, Injection, Reason, RequestDecision, is_header_value,
    path_is_ambiguous, validate, validate_for_api, warnings,
};
pub use host::{Host, HostError};
pub use model::{
    DefaultAction, EgressPolicy, HeaderSecret, InterceptMode, PolicyFile, PolicyMode, Rule,
    RuleAction, SecretValue,
};

/// The JSON Schema of the policy file, generated from [`PolicyFile`]. The committed copy is
/// `shared-policy/policy.schema.json`; a test fails when it is stale.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(PolicyFile);
    let mut text = serde_json::to_string_pretty(&schema).unwrap_or_default();
    text.push('\n');
    text
}
