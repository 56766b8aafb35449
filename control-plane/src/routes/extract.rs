//! What the session routes take from a request before their handler runs: the path's
//! `{session_id}`, parsed once into a [`SessionId`] ([`Id`]: an id that cannot be a session's
//! is 404, as an unknown one is), the sessions of the engine holding it ([`Session`]: 404 for an
//! engine not in the fleet, 503 while it is down) for the one route that reaches a session's
//! processes past the operations (a terminal's WebSocket, whose every keystroke would otherwise
//! cost a running check). Every other route applies an operation (`crate::ops`), which takes the
//! slot, the lock and the running check.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts, RawPathParams};
use axum::http::request::Parts;

use super::render::HttpError;
use crate::error::ApiError;
use crate::fleet::Fleet;
use crate::ids::SessionId;
use crate::sessions::Sessions;

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

/// The session a request names and the sessions of the engine holding it.
pub struct Session {
    pub id: SessionId,
    pub sessions: Arc<Sessions>,
}

impl<S> FromRequestParts<S> for Session
where
    Arc<Fleet>: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let Id(id) = Id::from_request_parts(parts, state).await?;
        let sessions = Arc::<Fleet>::from_ref(state).at(&id)?;
        Ok(Self { id, sessions })
    }
}
