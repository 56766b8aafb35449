//! What the evaluator answers: a decision and its stable reason.

use crate::model::SecretValue;

/// Stable reason codes: they go to the agent in `X-Egress-Denied` and to the audit log, so
/// renaming one is a breaking change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Allowed: a rule matched host (and method, for a request).
    RuleAllowed,
    /// Allowed: no rule lists the host and the default is `allow`.
    DefaultAllow,
    /// Denied: no rule lists the host and the default is `deny`.
    HostNotListed,
    /// Denied: a rule lists the host, but no rule for it permits this method.
    MethodNotAllowed,
    /// Denied: the policy file is missing or invalid, so everything is denied (fail closed).
    PolicyUnavailable,
    /// Denied: a rule for the host permits this method, but only on other paths (or the path
    /// is ambiguous: dot segments, encoded slashes, empty segments).
    PathNotAllowed,
    /// Denied: the first rule that decides for this host is a `deny` rule.
    RuleDenied,
}

// === impl Reason ===

impl Reason {
    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            Self::RuleAllowed => "rule-allowed",
            Self::DefaultAllow => "default-allow",
            Self::HostNotListed => "host-not-listed",
            Self::MethodNotAllowed => "method-not-allowed",
            Self::PolicyUnavailable => "policy-unavailable",
            Self::PathNotAllowed => "path-not-allowed",
            Self::RuleDenied => "rule-denied",
        }
    }

    /// One sentence for the 403 body and for `policy explain`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::RuleAllowed => "a rule allows this host and method",
            Self::DefaultAllow => "no rule lists this host and the policy default is allow",
            Self::HostNotListed => "no rule lists this host and the policy default is deny",
            Self::MethodNotAllowed => "a rule lists this host but does not permit this method",
            Self::PolicyUnavailable => {
                "the egress policy is missing or invalid, so all egress is denied"
            }
            Self::PathNotAllowed => {
                "a rule lists this host and method but not this path (dot segments and encoded slashes never match)"
            }
            Self::RuleDenied => "a rule denies this host",
        }
    }
}

/// The outcome of a CONNECT (reachability) check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectDecision {
    /// Whether the tunnel may open.
    pub allowed: bool,
    /// Whether TLS must be terminated (MITM) so requests can be checked or credentialed.
    pub intercept: bool,
    /// Why.
    pub reason: Reason,
    /// Index of the rule that decided, if one did.
    pub rule: Option<usize>,
}

/// A header to set on the upstream request, replacing any the client sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// Header name (validated token).
    pub header: String,
    /// Header value (validated: [`is_header_value`](super::is_header_value)).
    pub value: SecretValue,
}

/// The outcome of a check on one HTTP request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestDecision {
    /// Whether the request may go upstream.
    pub allowed: bool,
    /// Why.
    pub reason: Reason,
    /// Index of the rule that decided: the allowing rule, or for a method denial the first rule
    /// whose host matched.
    pub rule: Option<usize>,
    /// The credential to inject, if the allowing rule names one.
    pub inject: Option<Injection>,
}
