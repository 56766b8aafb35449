//! The gateway's errors: [`ProxyError`] for one proxied exchange (mapped to a status in exactly
//! one place, [`ProxyError::status`]), [`ConfigError`] for startup, and [`CaError`] for the CA
//! (loading its pair, minting a leaf), which both wrap.

use std::path::PathBuf;

use http::StatusCode;
use shared_policy::Reason;
use thiserror::Error;

/// CA problems: loading the pair at startup, or minting a leaf.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CaError {
    /// The CA certificate PEM is unusable.
    #[error("CA certificate: {0}")]
    Cert(String),
    /// The CA key PEM is unusable (PKCS#8 ECDSA, Ed25519 or RSA expected).
    #[error("CA key: {0}")]
    Key(String),
    /// rcgen or rustls refused to build a leaf.
    #[error("minting a leaf: {0}")]
    Mint(String),
}

/// Why the gateway refused a request: the policy's reason, or one of the gateway's own checks.
/// [`DenyCode::code`] is what the agent sees in `X-Egress-Denied` and the audit log records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyCode {
    /// The policy said no (`host-not-listed`, `method-not-allowed`, `path-not-allowed`,
    /// `policy-unavailable`).
    Policy(Reason),
    /// The TLS SNI names another host than the CONNECT authority (domain fronting).
    SniMismatch,
    /// The request's Host / `:authority` names another host than the connection is bound to.
    HostMismatch,
    /// The destination resolves to a non-global address outside the allowed CIDRs (SSRF guard).
    AddressNotAllowed,
    /// The rule injects a credential but the request is plaintext: credentials only go over TLS.
    /// Also used for a non-TLS stream inside a CONNECT tunnel, whose destination we cannot bind.
    TlsRequired,
    /// TRACE or TRACK on a request that would carry a credential: the origin echoes the request,
    /// injected header included, back to the sandbox.
    CredentialEcho,
    /// A blind tunnel closed on a policy reload because the host must now be intercepted (it
    /// gained an injection or a method restriction, or `intercept` became `all`). Audit only.
    InterceptRequired,
    /// A WebSocket closed on a policy reload because the policy no longer grants the credential
    /// it was opened with (removed, or another one). Audit only.
    CredentialChanged,
}

// === impl DenyCode ===

impl DenyCode {
    /// The stable reason code.
    pub fn code(self) -> &'static str {
        match self {
            Self::Policy(r) => r.code(),
            Self::SniMismatch => "sni-mismatch",
            Self::HostMismatch => "host-mismatch",
            Self::AddressNotAllowed => "address-not-allowed",
            Self::TlsRequired => "tls-required",
            Self::CredentialEcho => "credential-echo",
            Self::InterceptRequired => "intercept-required",
            Self::CredentialChanged => "credential-changed",
        }
    }

    /// One sentence for the 403 body.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Policy(r) => r.describe(),
            Self::SniMismatch => "the TLS server name differs from the CONNECT host",
            Self::HostMismatch => {
                "the Host header differs from the host this connection is bound to"
            }
            Self::AddressNotAllowed => {
                "the host resolves to a private or otherwise non-global address"
            }
            Self::TlsRequired => "this destination is only reachable over TLS (HTTPS via CONNECT)",
            Self::CredentialEcho => {
                "TRACE and TRACK echo the request, so they are refused where a credential is injected"
            }
            Self::InterceptRequired => {
                "the policy changed and this host's TLS must now be intercepted; reconnect"
            }
            Self::CredentialChanged => {
                "the policy changed the credential this connection was opened with; reconnect"
            }
        }
    }
}

/// What went wrong with one proxied exchange, and on which side.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// A check refused it: 403 with the reason code.
    #[error("egress denied: {}", .0.code())]
    Denied(DenyCode),
    /// The client sent something a proxy cannot act on: 400.
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// Name resolution failed: 502.
    #[error("cannot resolve {host}: {reason}")]
    Resolve {
        /// The name.
        host: String,
        /// Resolver's message.
        reason: String,
    },
    /// TCP connect or upstream TLS failed, or the upstream broke the exchange: 502.
    #[error("upstream failed")]
    Upstream(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The upstream did not answer within its phase's timeout: 504.
    #[error("upstream timed out ({phase})")]
    UpstreamTimeout {
        /// Which phase.
        phase: &'static str,
    },
    /// Minting a leaf certificate failed: 500.
    #[error("certificate minting failed")]
    Mint(#[from] CaError),
    /// The client went away or broke the protocol: nobody to answer.
    #[error("client connection failed")]
    Client(#[source] Box<dyn std::error::Error + Send + Sync>),
}

// === impl ProxyError ===

impl ProxyError {
    /// The one mapping from error to HTTP status. `None` = no response can be sent.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Denied(_) => Some(StatusCode::FORBIDDEN),
            Self::BadRequest(_) => Some(StatusCode::BAD_REQUEST),
            Self::Resolve { .. } | Self::Upstream(_) => Some(StatusCode::BAD_GATEWAY),
            Self::UpstreamTimeout { .. } => Some(StatusCode::GATEWAY_TIMEOUT),
            Self::Mint(_) => Some(StatusCode::INTERNAL_SERVER_ERROR),
            Self::Client(_) => None,
        }
    }

    /// The reason code for the audit log.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Denied(d) => d.code(),
            Self::BadRequest(_) => "bad-request",
            Self::Resolve { .. } => "resolve-failed",
            Self::Upstream(_) => "upstream-failed",
            Self::UpstreamTimeout { .. } => "upstream-timeout",
            Self::Mint(_) => "mint-failed",
            Self::Client(_) => "client-failed",
        }
    }

    pub(crate) fn upstream(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Upstream(e.into())
    }

    pub(crate) fn client(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Client(e.into())
    }
}

/// Startup configuration that cannot work. Reported once, before listening.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A file named by the configuration cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The CA certificate or key is unusable.
    #[error("CA: {0}")]
    Ca(#[from] CaError),
    /// The upstream CA bundle has no usable certificate.
    #[error("upstream CA bundle {path}: {reason}")]
    Bundle {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Any other invalid setting (names the flag).
    #[error("{0}")]
    Invalid(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_mapping() {
        let cases: Vec<(ProxyError, Option<u16>)> = vec![
            (ProxyError::Denied(DenyCode::SniMismatch), Some(403)),
            (ProxyError::BadRequest("x"), Some(400)),
            (
                ProxyError::Resolve {
                    host: "a".into(),
                    reason: "b".into(),
                },
                Some(502),
            ),
            (ProxyError::upstream("x"), Some(502)),
            (ProxyError::UpstreamTimeout { phase: "connect" }, Some(504)),
            (ProxyError::Mint(CaError::Mint("x".into())), Some(500)),
            (ProxyError::client("gone"), None),
        ];
        for (err, want) in cases {
            assert_eq!(err.status().map(|s| s.as_u16()), want, "{err}");
        }
    }
}
