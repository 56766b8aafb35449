//! What an operation holds (its admission slot, its lock: `Ops::apply` takes them) kept by the
//! response body until the answer has been sent or the client has gone away: a download, a
//! streamed listing, a file tool's answer.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::response::Response;

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
