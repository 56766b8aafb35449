//! A stream cut short resets its HTTP/1.1 connection. envd's connection drops when its sandbox
//! goes mid-stream, and E2B's SDK tells a dropped connection (a read error, which makes it ask
//! `/health` and say the sandbox was killed) from a malformed answer (an HTTP/1.1 body that ends
//! early with a FIN, which it takes for the sandbox's timeout). So a body that fails on this port
//! sets `SO_LINGER` 0 on its socket first: the connection's close is then a reset. HTTP/2 needs
//! none of it (a failed body resets only its stream).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::middleware::Next;
use axum::response::Response;
use axum::serve::IncomingStream;
use http_body_util::BodyExt;

/// The connection's socket, as every request on it sees it: a second descriptor of it (closed
/// with the connection's service, so the socket's last close is the connection's).
#[derive(Clone)]
pub struct Socket(Option<Arc<OwnedFd>>);

/// Taken once per connection, which is also where it gets `TCP_NODELAY`: streamed answers are
/// many small writes, so no Nagle delay (as on the main port).
impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for Socket {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        let tcp = stream.io();
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        Socket(tcp.as_fd().try_clone_to_owned().ok().map(Arc::new))
    }
}

/// The middleware: an HTTP/1 answer whose body fails resets the connection.
pub async fn reset_on_cut(req: Request, next: Next) -> Response {
    let socket = req
        .extensions()
        .get::<ConnectInfo<Socket>>()
        .and_then(|c| c.0.0.clone());
    let http1 = req.version() < http::Version::HTTP_2;
    let response = next.run(req).await;
    let Some(socket) = socket.filter(|_| http1) else {
        return response;
    };
    let (parts, body) = response.into_parts();
    let body = body.map_err(move |e| {
        if let Err(err) = socket2::SockRef::from(&*socket).set_linger(Some(Duration::ZERO)) {
            tracing::debug!(error = %err, "SO_LINGER not set on a cut connection");
        }
        e
    });
    Response::from_parts(parts, Body::new(body))
}
