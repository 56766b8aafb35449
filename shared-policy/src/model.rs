//! The policy file as it is written to disk and sent over the API (serde types).
//!
//! This is the only definition of the contract between the control plane (which validates and
//! writes it) and the egress gateway (which enforces it). Unknown fields are ignored, never
//! rejected, so a newer writer does not break an older reader.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

/// The sidecar config: `{"policy": {...}, "secrets": {...}}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PolicyFile {
    /// Which hosts and methods are reachable, and which get a credential.
    #[serde(default)]
    pub policy: EgressPolicy,
    /// Named credentials that rules inject with `inject`. They never enter the sandbox.
    #[serde(default, deserialize_with = "null_as_default")]
    pub secrets: BTreeMap<String, HeaderSecret>,
    /// An opaque label of this policy, written by whoever installs the file. The gateway reports
    /// the version it enforces on its health listener (never on the proxy port the sandbox
    /// reaches), in audit lines and in metrics; absent = none reported. The control plane writes
    /// a keyed hash of [`PolicyFile::content`], so a version tells nothing about the secrets to
    /// anyone without the deployment's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// State a front door keeps with the policy it derived from it, so that one acknowledged
    /// install changes both (OpenSandbox's credential vault: its revision, credentials and
    /// bindings, from which the door writes `credential` rules and `secrets`). The gateway never
    /// reads it. It can hold credential values, so it is redacted as a secret value is, lives
    /// only where the policy does (never in the sandbox), and the control plane's API never
    /// takes it from a caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub door: Option<SecretValue>,
}

// === impl PolicyFile ===

impl PolicyFile {
    /// The canonical bytes of the content (everything but `version`): what a version labels.
    /// Secret values are part of it, so a label made from it must be keyed (an unkeyed hash
    /// of a short secret can be inverted or checked against guesses offline).
    pub fn content(&self) -> Vec<u8> {
        let mut copy = self.clone();
        copy.version = None;
        serde_json::to_vec(&copy).unwrap_or_default()
    }

    /// The same policy, labelled `version`.
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }
}

/// The `policy` block.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EgressPolicy {
    /// What happens to a host that no rule lists.
    #[serde(default)]
    pub default: DefaultAction,
    /// Which allowed connections are TLS-intercepted (MITM) rather than tunnelled untouched.
    #[serde(default)]
    pub intercept: InterceptMode,
    /// Per-host rules, evaluated in order.
    #[serde(default, deserialize_with = "null_as_default")]
    pub rules: Vec<Rule>,
    /// `"enforce"` (default) or `"shadow"`: report-only, every decision is evaluated and
    /// audited, but denied requests are let through (without any credential). For operators
    /// rolling out a policy; the control plane's API refuses it.
    #[serde(default, skip_serializing_if = "PolicyMode::is_enforce")]
    pub mode: PolicyMode,
}

/// `policy.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PolicyMode {
    /// Denials are enforced.
    #[default]
    Enforce,
    /// Report-only: denials are audited (`"enforced": false`) and let through.
    Shadow,
}

impl PolicyMode {
    /// True for the default.
    pub fn is_enforce(&self) -> bool {
        *self == Self::Enforce
    }
}

/// `policy.default`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DefaultAction {
    /// Allowlist: only hosts with a matching rule are reachable.
    #[default]
    Deny,
    /// Denylist: every host is reachable, except that a listed host's method restriction applies.
    Allow,
}

/// `policy.intercept`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InterceptMode {
    /// MITM every allowed connection.
    #[default]
    All,
    /// MITM only hosts whose rule injects a credential or restricts methods; tunnel the rest.
    Credentialed,
}

/// One entry of `policy.rules`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Rule {
    /// Host glob (fnmatch-style `*`, `?`, `[...]`), matched case-insensitively against the
    /// normalised host (lower case, no trailing dot, IDNA punycode, no port), or an IP address
    /// (IPv6 bare or in brackets), matched as an address. Must not include a port.
    pub host: String,
    /// Permitted HTTP methods; `["*"]` permits all. Upper-cased when read. Must not be empty.
    #[serde(default = "any_method", deserialize_with = "upper_case_methods")]
    #[schemars(with = "Vec<String>", length(min = 1))]
    pub methods: Vec<String>,
    /// Name of a secret (a key of `secrets`) whose header is set on requests to this host.
    #[serde(default)]
    pub inject: Option<String>,
    /// Request paths this rule applies to: globs on the path (no query string), each starting
    /// with `/`; `*` and `?` stay within one segment, `**` spans segments (`/api/v4/projects/**`).
    /// Absent = every path. A rule with paths is always intercepted (paths are only visible
    /// after TLS is terminated), and its `inject` applies only on matching paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub paths: Option<Vec<String>>,
    /// What a match does: `allow` (the default, omitted when written), `deny`, or `credential`.
    #[serde(default, skip_serializing_if = "RuleAction::is_allow")]
    pub action: RuleAction,
}

/// `rules[].action`. Rules are scanned in order; `allow` and `deny` rules decide, `credential`
/// rules only supply a credential.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RuleAction {
    /// The host is reachable with the rule's methods (and paths), with its `inject`.
    #[default]
    Allow,
    /// The host is unreachable (every method), even under `default: allow`, unless an earlier
    /// rule allows it: a denylist entry, or an exception carved out of a later wildcard.
    /// Takes no `inject` and no `paths`, and its `methods` must be `["*"]`.
    Deny,
    /// Reachability is decided by the other rules and the default, never by this one; when
    /// they allow a request to its host, with one of its methods, on one of its paths, and the
    /// deciding rule injects nothing, this rule's `inject` is set (the first such rule's).
    /// Requires `inject`. For credentials that must not widen what is reachable (OpenSandbox's
    /// credential vault bindings).
    Credential,
}

impl RuleAction {
    /// True for the default.
    pub fn is_allow(&self) -> bool {
        *self == Self::Allow
    }
}

/// One entry of `secrets`: a header to set, and its value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HeaderSecret {
    /// Header name (an RFC 7230 token), for example `Authorization` or `PRIVATE-TOKEN`.
    pub header: String,
    /// Header value. Redacted in every log line; never forwarded to the sandbox.
    pub value: SecretValue,
}

/// A credential value. `Debug` and `Display` print `***`, so it cannot leak through a log line
/// or an error message by accident; [`SecretValue::expose`] is the one way to read it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct SecretValue(String);

// === impl SecretValue ===

impl SecretValue {
    /// Wraps a credential value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The raw value: only for putting it on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(***)")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

// === serde helpers ===

fn any_method() -> Vec<String> {
    vec!["*".to_owned()]
}

/// Methods are compared upper-case (the reference upper-cases on read), so `get` means `GET`.
fn upper_case_methods<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let methods = Vec::<String>::deserialize(d)?;
    Ok(methods
        .into_iter()
        .map(|m| m.to_ascii_uppercase())
        .collect())
}

/// `"secrets": null` and `"rules": null` mean "none", as in the reference (`or {}`).
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
