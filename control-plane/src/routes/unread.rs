//! `Connection: close` on a response to a request whose body the handler left unread.
//!
//! A handler that refuses a request from its headers alone (a bad token, `user=root`, a body
//! over its limit) drops the body unread. Hyper then drains what has already arrived and, if
//! the body is not all there, closes the connection once the response is written, without
//! saying so in it. A client that reuses that keep-alive connection at once sees it closed
//! under its next request ("connection closed before message completed": E2B's SDK writing a
//! file right after a refused `commands.run(user="root")`). Saying `Connection: close` in the
//! response is what HTTP/1.1 asks of a server that will close: the client opens a new
//! connection instead.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, Version, header};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Body as _, Frame, SizeHint};

/// What became of a request body: read to its end, or dropped before it.
#[derive(Default)]
struct Fate {
    ended: AtomicBool,
    dropped_unread: AtomicBool,
}

/// The request's body, reporting its fate.
struct Watched {
    inner: Body,
    fate: Arc<Fate>,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.fate.ended.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if !self.fate.ended.load(Ordering::Acquire) && !self.inner.is_end_stream() {
            self.fate.dropped_unread.store(true, Ordering::Release);
        }
    }
}

/// Runs the request and marks its response `Connection: close` when the handler dropped the
/// body unread (HTTP/1 only: HTTP/2 closes streams, not connections). A body still held when
/// the response leaves (a stream that reads its input while it answers) is left alone.
pub async fn close_unread(req: Request, next: Next) -> Response {
    let http1 = req.version() <= Version::HTTP_11;
    let fate = Arc::new(Fate::default());
    let req = req.map(|inner| {
        Body::new(Watched {
            inner,
            fate: fate.clone(),
        })
    });
    let mut response = next.run(req).await;
    // An upgrade (101) says `Connection: upgrade`, and a handler that already chose keeps it.
    let decided = response.status() == axum::http::StatusCode::SWITCHING_PROTOCOLS
        || response.headers().contains_key(header::CONNECTION);
    if http1 && !decided && fate.dropped_unread.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::routing::post;
    use tower::ServiceExt;

    fn app() -> Router {
        Router::new()
            .route("/refuse", post(|| async { "refused" }))
            .route(
                "/read",
                post(|body: Bytes| async move { body.len().to_string() }),
            )
            .layer(axum::middleware::from_fn(close_unread))
    }

    async fn connection(uri: &str, body: Body) -> Option<HeaderValue> {
        let req = Request::post(uri).body(body).expect("request");
        let resp = app().oneshot(req).await.expect("infallible");
        resp.headers().get(header::CONNECTION).cloned()
    }

    /// A body that never ends: a client that sent its headers and not yet its body.
    fn pending() -> Body {
        Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>())
    }

    #[tokio::test]
    async fn a_body_left_unread_closes_the_connection_and_a_read_or_empty_one_does_not() {
        assert_eq!(
            connection("/refuse", pending()).await,
            Some(HeaderValue::from_static("close"))
        );
        assert_eq!(
            connection("/refuse", Body::from("some bytes")).await,
            Some(HeaderValue::from_static("close"))
        );
        assert_eq!(connection("/refuse", Body::empty()).await, None);
        assert_eq!(connection("/read", Body::from("some bytes")).await, None);
    }
}
