//! `X-API-Key` authentication for the API routes (health and version stay open).

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;

use std::sync::Arc;

use crate::config::Config;
use crate::error::ApiError;

pub const HEADER: &str = "x-api-key";

pub async fn require_api_key(
    State(config): State<Arc<Config>>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(given) = req.headers().get(HEADER) else {
        return Err(ApiError::MissingApiKey);
    };
    // Constant-time over the bytes; a length mismatch is not secret.
    let expected = config.server.api_key.expose().as_bytes();
    if !bool::from(given.as_bytes().ct_eq(expected)) {
        return Err(ApiError::InvalidApiKey);
    }
    Ok(next.run(req).await)
}
