//! Why a policy file was refused. The `Display` text is meant for an API's 422 `detail` and for
//! the gateway's log: it names the offending field, and never contains a secret value.

use thiserror::Error;

/// A policy that cannot be enforced as written. The gateway treats any of these as deny-all.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Not JSON, or JSON of the wrong shape. The text has quoted and back-ticked spans blanked
    /// ([`redact`]), since a misplaced secret value could otherwise be echoed into a log.
    #[error("policy is not valid: {0}")]
    Parse(String),
    /// `policy.rules[i].host` is empty, has whitespace or characters no host has, or is not a glob.
    #[error("policy.rules[{index}].host: {reason}")]
    InvalidHost {
        /// Rule position.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// `policy.rules[i].methods` is empty or has something that is not a method token.
    #[error("policy.rules[{index}].methods: {reason}")]
    InvalidMethods {
        /// Rule position.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// `policy.rules[i].paths` is empty or has a glob that is not a path glob.
    #[error("policy.rules[{index}].paths: {reason}")]
    InvalidPaths {
        /// Rule position.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// `policy.rules[i].action` does not fit the rest of the rule.
    #[error("policy.rules[{index}].action: {reason}")]
    InvalidAction {
        /// Rule position.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// Refused at the API only: a front door's state is written by the service, never taken.
    #[error("door: written by the service itself, never accepted in a request")]
    DoorNotAllowed,
    /// Refused at the API only: report-only mode is for operators, not for the agent.
    #[error(
        "policy.mode \"shadow\" (report-only) is not accepted here; it is an operator setting of the gateway"
    )]
    ShadowNotAllowed,
    /// `policy.rules[i].inject` names no entry of `secrets`.
    #[error("policy.rules[{index}].inject: no secret named {name:?}")]
    UnknownSecret {
        /// Rule position.
        index: usize,
        /// The missing secret's name.
        name: String,
    },
    /// `secrets.NAME.header` is not an RFC 7230 token, or is a header that framing depends on.
    #[error("secrets.{name}.header: {reason}")]
    InvalidHeaderName {
        /// Secret name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `secrets.NAME.value` is not a header value: it has a control character (CR, LF and NUL
    /// would split the request; the rest would fail every request). The value is never named.
    #[error(
        "secrets.{name}.value: not a valid HTTP header value: control characters (CR, LF, NUL, DEL and the like) are not allowed; tab is"
    )]
    InvalidHeaderValue {
        /// Secret name.
        name: String,
    },
    /// Refused at the API only: default deny with no rules reaches nothing at all.
    #[error(
        "policy.default is \"deny\" and policy.rules is empty, so no host would be reachable; \
         add rules, or omit egress for a network-isolated session"
    )]
    NothingReachable,
}

// === impl PolicyError ===

impl PolicyError {
    /// Wraps a serde error with its string literals blanked out.
    pub(crate) fn parse(err: &serde_json::Error) -> Self {
        Self::Parse(redact(&err.to_string()))
    }
}

/// Blanks the quoted and back-ticked spans of a serde message to `…`: serde quotes the offending
/// value (`invalid type: string "…"`, `unknown variant `…``), and a misplaced secret must reach
/// neither an API's 422 nor the gateway's log. The one redactor of both.
pub fn redact(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut inside: Option<char> = None;
    for ch in message.chars() {
        match inside {
            Some(close) if ch == close => {
                out.push('…');
                out.push(ch);
                inside = None;
            }
            Some(_) => {}
            None if ch == '`' || ch == '"' => {
                out.push(ch);
                inside = Some(ch);
            }
            None => out.push(ch),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blanks_quoted_strings() {
        assert_eq!(
            redact(r#"invalid type: string "ghp_secret", expected a map at line 1"#),
            r#"invalid type: string "…", expected a map at line 1"#
        );
        assert_eq!(
            redact("unknown variant `ghp_secret`, expected `allow`"),
            "unknown variant `…`, expected `…`"
        );
    }
}
