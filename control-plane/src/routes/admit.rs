//! The admission layer in front of `/files` (see [`crate::admission`]; the other operations take
//! their slots in `Ops::apply`, and [`holding`] keeps an operation's until its answer is sent): each takes its class's slot before
//! the handler reads the body, and hands it to the response body, so the slot is held until
//! the answer has been sent or the client has gone away.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{RawPathParams, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use std::sync::Arc;

use super::render::HttpError;
use crate::admission::Admission;

/// `POST /session/{id}/fs/{op}`: a slot of the session's and one of the total.
pub async fn fs(
    State(admission): State<Arc<Admission>>,
    params: RawPathParams,
    req: Request,
    next: Next,
) -> Result<Response, HttpError> {
    let session_id = params
        .iter()
        .find(|(k, _)| *k == "session_id")
        .map(|(_, v)| v)
        .unwrap_or_default();
    let slot = admission.fs(session_id).await?;
    Ok(holding(next.run(req).await, slot))
}

/// `response` whose body keeps `keep` (a slot, an operation's hold) until it is sent in full or
/// dropped.
pub fn holding<K: Send + Unpin + 'static>(response: Response, keep: K) -> Response {
    response.map(|inner| Body::new(Holding { inner, _keep: keep }))
}

/// A response body that releases what its request holds when it is done with.
struct Holding<K> {
    inner: Body,
    _keep: K,
}

impl<K: Send + Unpin + 'static> HttpBody for Holding<K> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
