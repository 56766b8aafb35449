//! The one place a cause becomes a class: an HTTP status, a stable code where the route is not
//! the reference's, and a retry-after. The front doors render it (the routes as FastAPI's
//! `{"detail": ...}` body, MCP as `{code, cause, remediation}`, E2B as its Connect and REST
//! errors); none decides a class of its own.
//!
//! Domain modules return errors named by what happened, each defined in the layer that raises
//! it: a request's bad values ([`ValidationError`]), a session's trouble ([`SessionError`]), the
//! fleet's engines ([`FleetError`]), and [`EgressError`], [`HelperError`], [`ProcessError`],
//! [`SeedError`], [`FsOpError`], admission's [`Refused`], the engine's and the locks' own (the
//! warm pool's `PoolError` never leaves the pool). Each `From<Cause> for ApiError` below picks
//! the class. Two rules hold for every rendering: the daemon's messages never reach it (they
//! name host paths and registries: logged here instead), and neither does anything secret
//! (policy parse errors are redacted by `shared_policy::redact`).
//!
//! # Layout
//! - [`ErrorBody`], [`ApiError`] and its status, code, retry-after and log line.
//! - `From<Cause> for ApiError`, one per cause enum, each one `match`.

use http::StatusCode;

use crate::admission::Refused;
pub use crate::api::ErrorBody;
use crate::coordination::lock::LockError;
use crate::egress::EgressError;
use crate::engine::EngineError;
use crate::fleet::FleetError;
use crate::processes::ProcessError;
use crate::runtime::HelperError;
use crate::sessions::{SessionError, ValidationError};
use crate::workspace::fs::FsOpError;
use crate::workspace::seed::SeedError;

/// The HTTP classes of error responses, each with its client-facing text. Built from a cause
/// (below) or by the API key check; nothing else decides a status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("API Key header is missing")]
    MissingApiKey,
    #[error("Invalid API Key")]
    InvalidApiKey,
    #[error("Session not found or already closed")]
    NotFound,
    /// A process the session does not have: the session's 404 and wording, as the reference's
    /// routes answer; MCP's renderer tells it apart.
    #[error("Session not found or already closed")]
    NoSuchProcess,
    /// A 404 for something other than a session (a snapshot).
    #[error("{0}")]
    NotFoundDetail(String),
    /// The session is paused and the caller keeps it so (E2B's envd, a pause in progress): 409,
    /// which E2B renders as a sandbox that is not running.
    #[error("Session is paused: resume it first")]
    Paused,
    /// The session lock could not be acquired in time.
    #[error("Session is busy: another request holds its lock; retry later")]
    Busy,
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    BadRequest(String),
    /// The body parsed but its values are unacceptable (FastAPI answers these with 422).
    #[error("{0}")]
    Unprocessable(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The deployment's storage for it is full (its snapshots' byte cap): 507.
    #[error("{0}")]
    InsufficientStorage(String),
    /// A limit is reached: a session's live background processes, or every slot of an
    /// admission class. `retry_after` (whole seconds, at least 1) becomes `Retry-After`.
    #[error("{detail}")]
    TooManyRequests {
        detail: String,
        retry_after: Option<std::time::Duration>,
    },
    /// What was asked for existed but is no longer kept (a process's events past its buffer).
    #[error("{0}")]
    Gone(String),
    /// Retryable infrastructure trouble: Docker not answering, a restart that failed.
    #[error("{0}")]
    Unavailable(String),
    /// A 503 for an outage the service already knows and reported once (a fleet's engine down
    /// or drained, no engine with room): logged as a warning, not reported per request.
    #[error("{0}")]
    Outage(String),
    /// A credential that does not open what was asked (a port token of another session or
    /// port, an expired one): 403.
    #[error("{0}")]
    Forbidden(String),
    /// Nothing in the sandbox listens on the port asked for: 502, code `port_closed`.
    #[error("{0}")]
    PortClosed(String),
    /// Details go to the log, never to the client.
    #[error("Internal server error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MissingApiKey | ApiError::InvalidApiKey | ApiError::Forbidden(_) => {
                StatusCode::FORBIDDEN
            }
            ApiError::NotFound | ApiError::NoSuchProcess | ApiError::NotFoundDetail(_) => {
                StatusCode::NOT_FOUND
            }
            ApiError::Busy | ApiError::Paused | ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Gone(_) => StatusCode::GONE,
            ApiError::Unavailable(_) | ApiError::Outage(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::PortClosed(_) => StatusCode::BAD_GATEWAY,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable code beside `detail`, for the errors of routes the reference does not have
    /// (its routes' bodies stay `{"detail"}` alone).
    pub fn code(&self) -> Option<&'static str> {
        match self {
            ApiError::PortClosed(_) => Some("port_closed"),
            _ => None,
        }
    }
}

impl ApiError {
    /// How long a refused caller should wait (whole seconds, at least 1): the `Retry-After` of
    /// a 429.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::TooManyRequests {
                retry_after: Some(after),
                ..
            } => Some(after.as_secs_f64().ceil().max(1.0) as u64),
            _ => None,
        }
    }

    /// What every door logs of an error it answers: an outage once as a warning, any other
    /// server error in full (its cause never goes to the client).
    pub fn log(&self) {
        if let ApiError::Outage(_) = self {
            tracing::warn!(error = ?self, "request refused: outage");
        } else if let ApiError::PortClosed(_) = self {
            // The sandbox's server is not up (yet): the client's to know, no fault here.
            tracing::debug!(error = ?self, "request refused: nothing listens on the port");
        } else if self.status().is_server_error() {
            tracing::error!(error = ?self, "request failed");
        }
    }
}

// === impl From<Cause> for ApiError ===

/// Engine errors reaching a handler unqualified: a missing container is a missing session, a
/// refused request is the caller's, anything else is the engine's trouble and retryable.
/// The daemon's message is logged here and never sent.
impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        if !matches!(e, EngineError::NotFound) {
            tracing::warn!(error = %e, "container engine error");
        }
        match e {
            EngineError::NotFound => ApiError::NotFound,
            e @ EngineError::Conflict(_) => ApiError::Conflict(e.public()),
            e @ (EngineError::ImageUnavailable { .. } | EngineError::Rejected(_)) => {
                ApiError::BadRequest(e.public())
            }
            e @ EngineError::Unavailable(_) => ApiError::Unavailable(e.public()),
        }
    }
}

/// An engine failure in the words of `context`, for a 503: logged in full, public in short.
fn unavailable(context: impl std::fmt::Display, e: &EngineError) -> ApiError {
    tracing::warn!(error = %e, "{context}");
    ApiError::Unavailable(format!("{context}: {}", e.public()))
}

/// A lock held past the wait is a busy session (409, retry later); a lock backend that is down
/// means the request cannot be serialised (503).
impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Timeout => ApiError::Busy,
            LockError::Unavailable(m) => ApiError::Unavailable(m),
        }
    }
}

/// A missing session is a 404, a stopped one a 409; a replica that cannot manage a session's
/// egress, or a restart that failed, is retryable (503).
impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        use SessionError as E;
        match e {
            E::NotFound => ApiError::NotFound,
            E::Lock(e) => e.into(),
            E::Paused => ApiError::Paused,
            E::NoEgressProxy | E::NotRunning => ApiError::Conflict(e.to_string()),
            E::EgressUnavailableHere => ApiError::Unavailable(e.to_string()),
            E::RestartFailed(e) => unavailable("session could not be restarted", &e),
            E::Validation(e) => e.into(),
            E::User(crate::sandbox::UserError::Exhausted) => ApiError::Unavailable(e.to_string()),
            E::User(crate::sandbox::UserError::Engine(e)) => e.into(),
            E::Snapshot(e) => e.into(),
            E::Engine(e) => e.into(),
            E::Egress(e) => e.into(),
            E::Helper(e) => e.into(),
        }
    }
}

/// A request's values: 422 (FastAPI's status for a body that parsed but is unacceptable), but
/// 400 for a request this deployment cannot serve as asked (egress where none is configured, the
/// reference's 400; an image that is a snapshot's, or not the snapshot's).
impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        use ValidationError as E;
        match e {
            E::EgressNotConfigured => {
                // The client reads the reference's sentence; the operator reads what to set.
                tracing::warn!(
                    "a session asked for egress: set DAIV_SANDBOX_EGRESS_CA_CERT_FILE and \
                     DAIV_SANDBOX_EGRESS_CA_KEY_FILE to enable the egress proxy"
                );
                ApiError::BadRequest(e.to_string())
            }
            E::SnapshotImageMismatch(_) | E::SnapshotAsImage => ApiError::BadRequest(e.to_string()),
            E::InvalidImage(_)
            | E::ImageById
            | E::MemoryTooSmall
            | E::InvalidCpus
            | E::InvalidEnvironment(_)
            | E::NulInCommand(_)
            | E::TimeoutTooLong
            | E::SessionTimeout
            | E::InvalidMetadata(_)
            | E::ForkCount(_) => ApiError::Unprocessable(e.to_string()),
        }
    }
}

/// A caller's environment that breaks the one rule of every environment: a request's bad value.
impl From<crate::api::InvalidEnvironment> for ApiError {
    fn from(e: crate::api::InvalidEnvironment) -> Self {
        ValidationError::from(e).into()
    }
}

/// An id naming no engine of the fleet is a missing session (404); an engine down, draining
/// or full is an outage already reported (503, a warning per request); an engine not
/// answering the health check is a plain 503.
impl From<FleetError> for ApiError {
    fn from(e: FleetError) -> Self {
        use FleetError as E;
        match e {
            E::UnknownEngine => ApiError::NotFound,
            E::EngineDown(_) | E::EngineDraining(_) | E::NoEngine(_) => {
                ApiError::Outage(e.to_string())
            }
            E::EngineNotResponding(_) => ApiError::Unavailable(e.to_string()),
            E::Session(e) => e.into(),
        }
    }
}

impl From<EgressError> for ApiError {
    fn from(e: EgressError) -> Self {
        use EgressError as E;
        match e {
            E::MalformedPolicy(_) | E::InvalidPolicy(_) => ApiError::Unprocessable(e.to_string()),
            E::GatewayUnavailable { context, source } => unavailable(context, &source),
            E::NotAcknowledged { .. } | E::NoFreeSubnet(_) => ApiError::Unavailable(e.to_string()),
            E::Encode(e) => ApiError::Internal(e.into()),
            E::PolicyUnreadable(_) => ApiError::Unavailable(e.to_string()),
            E::GatewayPredatesActions => ApiError::Conflict(e.to_string()),
            E::Engine(e) => e.into(),
        }
    }
}

impl From<crate::snapshots::SnapshotError> for ApiError {
    fn from(e: crate::snapshots::SnapshotError) -> Self {
        use crate::snapshots::SnapshotError as E;
        match e {
            E::NotFound => ApiError::NotFoundDetail(e.to_string()),
            E::InvalidName | E::InvalidTtl | E::Uncopyable { .. } => {
                ApiError::Unprocessable(e.to_string())
            }
            E::UnusableMountpoint | E::LayersUnmountable { .. } => {
                ApiError::Unavailable(e.to_string())
            }
            E::TooLarge { .. } => ApiError::PayloadTooLarge(e.to_string()),
            E::NoRoom { .. } => ApiError::InsufficientStorage(e.to_string()),
            E::Engine(e) => e.into(),
        }
    }
}

/// The helper's refusals keep their meaning; everything else about it is retryable (503),
/// never a wrong answer.
impl From<HelperError> for ApiError {
    fn from(e: HelperError) -> Self {
        use HelperError as E;
        match e {
            E::Engine(e) => e.into(),
            E::NoSuchProcess => ApiError::NoSuchProcess,
            E::ProcessConflict(m) => ApiError::Conflict(m),
            // Retryable once one of the session's processes ends: when is not ours to say.
            E::ProcessLimit(m) => ApiError::TooManyRequests {
                detail: m,
                retry_after: None,
            },
            E::Rejected(m) | E::ProcessIo(m) => ApiError::Unprocessable(m),
            E::ProcessGone(m) => ApiError::Gone(m),
            E::PortClosed(_) => ApiError::PortClosed(e.to_string()),
            E::ArchiveRefused => ApiError::Unprocessable(e.to_string()),
            E::Unstartable(_)
            | E::OtherProtocol(_)
            | E::Lost
            | E::Channel(_)
            | E::DeadlineExceeded
            | E::Failed
            | E::NoAnswer
            | E::Untrusted
            | E::UnexpectedAnswer => ApiError::Unavailable(e.to_string()),
        }
    }
}

impl From<ProcessError> for ApiError {
    fn from(e: ProcessError) -> Self {
        use ProcessError as E;
        match e {
            E::InvalidWorkdir(_)
            | E::InvalidProcessId
            | E::InvalidTag
            | E::InvalidTerminalSize
            | E::InvalidEnvironment(_)
            | E::EmptyCommand
            | E::NulInCommand
            | E::InvalidWait => ApiError::Unprocessable(e.to_string()),
            // An id that cannot exist answers like a missing session, as the reference does.
            E::NoSuchProcess => ApiError::NoSuchProcess,
            E::StdinTooLarge => ApiError::PayloadTooLarge(e.to_string()),
            E::Session(e) => e.into(),
            E::Helper(e) => e.into(),
        }
    }
}

impl From<SeedError> for ApiError {
    fn from(e: SeedError) -> Self {
        use SeedError as E;
        match e {
            E::AlreadySeeded => ApiError::Conflict(e.to_string()),
            E::NotMultipart
            | E::BodyBound(_)
            | E::MalformedMultipart(_)
            | E::NoArchive
            | E::UploadUnreadable(_)
            | E::BadArchive { .. } => ApiError::Unprocessable(e.to_string()),
            E::UploadTooLarge(_) | E::OverBudget { .. } => ApiError::PayloadTooLarge(e.to_string()),
            E::HelperStoppedReading => ApiError::Unavailable(e.to_string()),
            E::Sanitiser(_) => ApiError::Internal(e.into()),
            E::Engine(e) => e.into(),
            E::Helper(e) => e.into(),
        }
    }
}

impl From<FsOpError> for ApiError {
    fn from(e: FsOpError) -> Self {
        match e {
            FsOpError::ModeOutOfRange(_) | FsOpError::InvalidBase64(_) => {
                ApiError::Unprocessable(e.to_string())
            }
            FsOpError::Helper(e) => e.into(),
        }
    }
}

/// No slot of an admission class came free in time: retryable, and the client is told when.
impl From<Refused> for ApiError {
    fn from(e: Refused) -> Self {
        ApiError::TooManyRequests {
            retry_after: Some(e.retry_after),
            detail: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_details_never_reach_the_client() {
        let e = ApiError::Internal(anyhow::anyhow!("secret path /etc/shadow"));
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.to_string(), "Internal server error");
    }

    #[test]
    fn engine_errors_map_to_the_documented_statuses() {
        let cases = [
            (EngineError::NotFound, StatusCode::NOT_FOUND),
            (EngineError::Conflict("x".into()), StatusCode::CONFLICT),
            (EngineError::Rejected("x".into()), StatusCode::BAD_REQUEST),
            (
                EngineError::ImageUnavailable {
                    image: "i".into(),
                    failure: crate::engine::PullFailure::Denied,
                    reason: "r".into(),
                },
                StatusCode::BAD_REQUEST,
            ),
            (
                EngineError::Unavailable("x".into()),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
        ];
        for (engine, status) in cases {
            assert_eq!(ApiError::from(engine).status(), status);
        }
    }

    #[test]
    fn daemon_messages_never_reach_the_client() {
        let leaky = "open /var/lib/docker/fuse-overlayfs/abc/merged/etc: too many levels";
        for e in [
            EngineError::Conflict(leaky.into()),
            EngineError::Rejected(leaky.into()),
            EngineError::Unavailable(leaky.into()),
            EngineError::ImageUnavailable {
                image: "busybox:nope".into(),
                failure: crate::engine::PullFailure::Missing,
                reason: format!("manifest unknown at registry.internal.corp {leaky}"),
            },
        ] {
            let body = ApiError::from(e).to_string();
            assert!(!body.contains("/var/lib/docker"), "{body}");
            assert!(!body.contains("corp"), "{body}");
        }
        let gateway = EgressError::GatewayUnavailable {
            context: "egress gateway could not start",
            source: EngineError::Unavailable(leaky.into()),
        };
        let restart = SessionError::RestartFailed(EngineError::Unavailable(leaky.into()));
        for e in [ApiError::from(gateway), ApiError::from(restart)] {
            assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert!(!e.to_string().contains("/var/lib"), "{e}");
        }
    }

    /// A pull the registry refused: the base image's is the caller's (400, naming the image and
    /// the reason); the gateway image's is the deployment's (503, the reference's sentence).
    /// The daemon's words stay in the log either way.
    #[test]
    fn denied_pulls_say_so_in_our_words() {
        let denied = |image: &str| EngineError::ImageUnavailable {
            image: image.into(),
            failure: crate::engine::PullFailure::Denied,
            reason: "Head \"http://10.0.0.9:5000/v2/x/manifests/1\": no basic auth credentials"
                .into(),
        };
        let base = ApiError::from(denied("127.0.0.1:5000/private/img:1"));
        assert_eq!(base.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            base.to_string(),
            "image \"127.0.0.1:5000/private/img:1\" is not available: it is not present \
             locally, and the registry refused access for lack of valid credentials"
        );
        let gateway = ApiError::from(EgressError::GatewayUnavailable {
            context: crate::egress::GATEWAY_IMAGE_FAILED,
            source: denied("127.0.0.1:5000/private/egress:1"),
        });
        assert_eq!(gateway.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = gateway.to_string();
        assert!(body.starts_with("Egress proxy failed to start: "), "{body}");
        assert!(body.contains("refused access"), "{body}");
        for e in [base.to_string(), body] {
            assert!(!e.contains("10.0.0.9") && !e.contains("basic auth"), "{e}");
        }
    }

    /// The statuses and bodies clients (and DAIV's schemas) rely on, pinned per cause.
    #[test]
    fn causes_map_to_their_statuses_and_texts() {
        let cases: Vec<(ApiError, StatusCode, &str)> = vec![
            (
                SessionError::NotFound.into(),
                StatusCode::NOT_FOUND,
                "Session not found or already closed",
            ),
            (
                SessionError::Lock(LockError::Timeout).into(),
                StatusCode::CONFLICT,
                "Session is busy: another request holds its lock; retry later",
            ),
            (
                SessionError::Lock(LockError::Unavailable("redis down".into())).into(),
                StatusCode::SERVICE_UNAVAILABLE,
                "redis down",
            ),
            (
                ValidationError::EgressNotConfigured.into(),
                StatusCode::BAD_REQUEST,
                "egress requires the egress proxy, which is not configured on this deployment",
            ),
            (
                SessionError::NoEgressProxy.into(),
                StatusCode::CONFLICT,
                "session has no egress proxy: a network-isolated session has nothing to refresh",
            ),
            (
                ValidationError::TimeoutTooLong.into(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "timeout must be at most 604800 seconds (0 = none)",
            ),
            (
                ValidationError::InvalidImage("a b".into()).into(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "base_image is not a valid image reference: \"a b\"",
            ),
            (
                SessionError::EgressUnavailableHere.into(),
                StatusCode::SERVICE_UNAVAILABLE,
                "egress is not configured on this instance",
            ),
            (
                FleetError::EngineDown("b".into()).into(),
                StatusCode::SERVICE_UNAVAILABLE,
                "engine b, which holds it, is down; retry later",
            ),
            (
                FleetError::EngineNotResponding(EngineError::Unavailable("x".into())).into(),
                StatusCode::SERVICE_UNAVAILABLE,
                "Docker client is not responding",
            ),
            (
                EgressError::NotAcknowledged {
                    detail: " (no exit code)",
                }
                .into(),
                StatusCode::SERVICE_UNAVAILABLE,
                "the egress gateway did not enforce the new policy within 5 s (no exit code)",
            ),
            (
                EgressError::InvalidPolicy(shared_policy::PolicyError::NothingReachable).into(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid egress policy: policy.default is \"deny\" and policy.rules is empty, so no \
                 host would be reachable; add rules, or omit egress for a network-isolated session",
            ),
            (
                HelperError::Lost.into(),
                StatusCode::SERVICE_UNAVAILABLE,
                "the session's helper went away during the operation; retry",
            ),
            (
                HelperError::DeadlineExceeded.into(),
                StatusCode::SERVICE_UNAVAILABLE,
                "the operation took longer than 30s and was stopped",
            ),
            (
                HelperError::Rejected("bad glob".into()).into(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "bad glob",
            ),
            (
                HelperError::NoSuchProcess.into(),
                StatusCode::NOT_FOUND,
                "Session not found or already closed",
            ),
            (
                HelperError::ProcessLimit("too many".into()).into(),
                StatusCode::TOO_MANY_REQUESTS,
                "too many",
            ),
            (
                ProcessError::StdinTooLarge.into(),
                StatusCode::PAYLOAD_TOO_LARGE,
                "stdin writes are limited to 1048576 bytes per request",
            ),
            (
                ProcessError::NoSuchProcess.into(),
                StatusCode::NOT_FOUND,
                "Session not found or already closed",
            ),
            (
                SeedError::AlreadySeeded.into(),
                StatusCode::CONFLICT,
                "Session already seeded: seeding is one-shot per session",
            ),
            (
                SeedError::UploadTooLarge(10).into(),
                StatusCode::PAYLOAD_TOO_LARGE,
                "archive exceeds the limit of 10 bytes (DAIV_SANDBOX_SEED_MAX_BYTES)",
            ),
            (
                FsOpError::ModeOutOfRange(
                    sandbox_protocol::files::permission_bits(70000).expect_err("out of range"),
                )
                .into(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "mode must be between 0 and 4095 (0o7777), got 70000",
            ),
        ];
        for (e, status, text) in cases {
            assert_eq!((e.status(), e.to_string().as_str()), (status, text));
        }
    }

    #[test]
    fn policy_parse_errors_are_redacted_in_the_body() {
        let parsed = serde_json::from_value::<shared_policy::PolicyFile>(
            serde_json::json!({"policy": {"default": "ghp_supersecret"}}),
        );
        let Err(e) = parsed else {
            panic!("expected a parse error");
        };
        let e = ApiError::from(EgressError::MalformedPolicy(e));
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(!e.to_string().contains("ghp_supersecret"), "{e}");
        assert!(e.to_string().starts_with("invalid egress policy: "), "{e}");
    }
}
