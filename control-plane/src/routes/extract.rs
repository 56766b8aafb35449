//! What the session routes take from a request before their handler runs: the path's
//! `{session_id}`, parsed once into a [`SessionId`] ([`Id`]: an id that cannot be a session's
//! is 404, as an unknown one is). The route then applies an operation (`crate::ops`), which
//! finds the engine holding the session and takes the slot, the lock and the running check.

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;

use super::render::HttpError;
use crate::error::ApiError;
use crate::ids::SessionId;

/// The path's `{session_id}`, or 404.
pub struct Id(pub SessionId);

impl<S: Send + Sync> FromRequestParts<S> for Id {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let id = param(parts, state, "session_id")
            .await
            .and_then(|raw| SessionId::parse(&raw).ok())
            .ok_or(ApiError::NotFound)?;
        Ok(Self(id))
    }
}

/// The path parameter `name` (percent-decoded), if the route has it.
pub async fn param<S: Send + Sync>(parts: &mut Parts, state: &S, name: &str) -> Option<String> {
    let params = RawPathParams::from_request_parts(parts, state).await.ok()?;
    params
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}
