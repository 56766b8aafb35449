//! The API's error type and its one mapping to HTTP: status plus FastAPI's `{"detail": ...}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::api::ErrorBody;
use crate::engine::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("API Key header is missing")]
    MissingApiKey,
    #[error("Invalid API Key")]
    InvalidApiKey,
    #[error("Session not found or already closed")]
    NotFound,
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
    /// A per-session limit is reached (live background processes).
    #[error("{0}")]
    TooManyRequests(String),
    /// Retryable infrastructure trouble: Docker not answering, a restart that failed.
    #[error("{0}")]
    Unavailable(String),
    /// Details go to the log, never to the client.
    #[error("Internal server error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MissingApiKey | ApiError::InvalidApiKey => StatusCode::FORBIDDEN,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::Busy | ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// Engine errors reaching a handler unqualified: a missing container is a missing session, a
/// refused request is the caller's, anything else is the engine's trouble and retryable.
/// The daemon's message is logged here and never sent: it can name host paths and registries.
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
pub fn unavailable(context: &str, e: &EngineError) -> ApiError {
    tracing::warn!(error = %e, "{context}");
    ApiError::Unavailable(format!("{context}: {}", e.public()))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error = ?self, "request failed");
        }
        (
            status,
            Json(ErrorBody {
                detail: self.to_string(),
            }),
        )
            .into_response()
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
                reason: format!("manifest unknown at registry.internal.corp {leaky}"),
            },
        ] {
            let body = ApiError::from(e).to_string();
            assert!(!body.contains("/var/lib/docker"), "{body}");
            assert!(!body.contains("corp"), "{body}");
        }
        let e = unavailable(
            "egress gateway could not start",
            &EngineError::Unavailable(leaky.into()),
        );
        assert!(!e.to_string().contains("/var/lib"), "{e}");
    }
}
