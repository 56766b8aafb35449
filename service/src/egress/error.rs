//! What can go wrong with a session's egress: a policy the API refuses, or a gateway that does
//! not do its part. The HTTP status of each is decided in [`crate::error`], not here.

use crate::engine::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The body is not a policy file. The message never echoes the body's strings: a
    /// misplaced secret must not come back in a 422.
    #[error("invalid egress policy: {}", shared_policy::redact(&.0.to_string()))]
    MalformedPolicy(#[source] serde_json::Error),
    /// A policy file the API does not accept (bad globs, unknown secrets, nothing reachable).
    #[error("invalid egress policy: {0}")]
    InvalidPolicy(#[from] shared_policy::PolicyError),
    /// The gateway (or its image) did not answer for `context`; the daemon's message stays in
    /// the log.
    #[error("{context}: {}", .source.public())]
    GatewayUnavailable {
        context: &'static str,
        #[source]
        source: EngineError,
    },
    /// The gateway did not report the new policy's version in time; `detail` says how it
    /// failed, when that is not plain silence.
    #[error(
        "the egress gateway did not enforce the new policy within {} s{detail}",
        super::POLICY_ACK_TIMEOUT.as_secs()
    )]
    NotAcknowledged { detail: &'static str },
    /// Every subnet tried for the internal network overlapped an existing one.
    #[error("no free subnet for the egress network in {0}")]
    NoFreeSubnet(ipnet::Ipv4Net),
    /// The policy could not be serialised for the gateway.
    #[error("egress policy could not be encoded")]
    Encode(#[source] serde_json::Error),
    /// The policy has `deny` or `credential` rules and the session's gateway was made before
    /// them: it would enforce them as `allow` rules, so the policy is not installed.
    #[error(
        "this session's egress gateway was made before deny and credential rules and would read \
         them as allow rules; recreate the session to use them"
    )]
    GatewayPredatesActions,
    /// A gateway's policy file could not be read back (for a fork); says nothing of its content.
    #[error("the egress gateway's policy could not be read: {0}")]
    PolicyUnreadable(&'static str),
    /// Any other engine failure while building or wiring the triad.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl EgressError {
    /// `context`'s engine failure, as a gateway that is not available.
    pub(super) fn gateway(context: &'static str) -> impl FnOnce(EngineError) -> Self {
        move |source| Self::GatewayUnavailable { context, source }
    }
}
