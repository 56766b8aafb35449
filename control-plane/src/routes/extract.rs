//! What the session routes take from a request before their handler runs: the path's
//! `{session_id}`, parsed once into a [`SessionId`] ([`Id`]: an id that cannot be a session's
//! is 404, as an unknown one is), the sessions of the engine holding it ([`Session`]: 404 for an
//! engine not in the fleet, 503 while it is down), and its lock ([`Locked`]), taken once the
//! body has been read.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::render::HttpError;
use crate::coordination::lock::LockGuard;
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

impl Session {
    /// The session's lock (see [`Sessions::lock`]).
    pub async fn lock(&self) -> Result<LockGuard, HttpError> {
        Ok(self.sessions.lock(&self.id).await?)
    }
}

/// A [`Session`] with its lock held, and the request's body `T` ([`NoBody`] for none), read
/// first: a body that is not the operation's is refused (422) without waiting behind a busy
/// session; then the lock (409 once `SESSION_LOCK_WAIT_SECONDS` have passed, 503 when the lock
/// backend is down).
pub struct Locked<T = NoBody> {
    pub id: SessionId,
    pub sessions: Arc<Sessions>,
    pub body: T,
    /// Released when dropped (a streaming run hands it to the stream).
    pub held: LockGuard,
}

/// A request whose body is not read.
pub struct NoBody;

impl<S: Send + Sync> FromRequest<S> for NoBody {
    type Rejection = std::convert::Infallible;

    async fn from_request(_req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self)
    }
}

impl<S, T> FromRequest<S> for Locked<T>
where
    Arc<Fleet>: FromRef<S>,
    S: Send + Sync,
    T: FromRequest<S> + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let (mut parts, body) = req.into_parts();
        let session = Session::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let body = T::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        let held = session.lock().await.map_err(IntoResponse::into_response)?;
        Ok(Self {
            id: session.id,
            sessions: session.sessions,
            body,
            held,
        })
    }
}
