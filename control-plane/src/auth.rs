//! `X-API-Key` authentication for the API routes (health and version stay open).

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;

use std::sync::Arc;

use crate::config::Config;
use crate::error::ApiError;

pub const HEADER: &str = "x-api-key";

/// Why a presented key was refused; each door renders it its own way (REST's 401/403
/// `{"detail"}`, MCP's with `WWW-Authenticate`, E2B's 401 `{code, message}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRefusal {
    Missing,
    Invalid,
}

/// The one check of a key a door was given against the deployment's: every door calls it.
/// Constant-time over the bytes; a length mismatch is not secret.
pub fn check_key(config: &Config, given: Option<&[u8]>) -> Result<(), KeyRefusal> {
    let given = given.ok_or(KeyRefusal::Missing)?;
    let expected = config.server.api_key.expose().as_bytes();
    if bool::from(given.ct_eq(expected)) {
        Ok(())
    } else {
        Err(KeyRefusal::Invalid)
    }
}

pub async fn require_api_key(
    State(config): State<Arc<Config>>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let given = req.headers().get(HEADER).map(|v| v.as_bytes());
    check_key(&config, given).map_err(|e| match e {
        KeyRefusal::Missing => ApiError::MissingApiKey,
        KeyRefusal::Invalid => ApiError::InvalidApiKey,
    })?;
    Ok(next.run(req).await)
}
