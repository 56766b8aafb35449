//! A sandbox's own servers through OpenSandbox's endpoints: `GET .../endpoints/{port}` for a
//! port other than execd's and egress's names `/ports/{id}/{port}` on this listener, with that
//! port's token in its headers; the request goes on through the ingress relay
//! ([`crate::routes::ports`]), as every door's port traffic does. No token of this door, nor
//! its API key, reaches the sandbox's server.

use axum::extract::{Path, Request};
use axum::response::{IntoResponse, Response};

use super::{
    API_KEY_HEADER, EGRESS_TOKEN_HEADER, EXECD_TOKEN_HEADER, Failure, OpenSandbox,
    PORT_TOKEN_HEADER, session_id,
};
use axum::extract::State;

/// `ANY /ports/{id}/{port}`: the server's root.
pub async fn relay_root(
    State(s): State<OpenSandbox>,
    Path((id, port)): Path<(String, String)>,
    req: Request,
) -> Response {
    forward(s, &id, &port, "", req).await
}

/// `ANY /ports/{id}/{port}/{*path}`.
pub async fn relay(
    State(s): State<OpenSandbox>,
    Path((id, port, path)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    forward(s, &id, &port, &path, req).await
}

async fn forward(s: OpenSandbox, id: &str, port: &str, path: &str, mut req: Request) -> Response {
    let target = session_id(id).and_then(|id| {
        let port: u16 = port
            .parse()
            .map_err(|_| Failure::bad_request(format!("port {port:?}: 1 to 65535")))?;
        crate::ops::ports::check_port(port)?;
        Ok((id, port))
    });
    let (id, port) = match target {
        Ok(t) => t,
        Err(f) => return f.into_response(),
    };
    let mut path_and_query = format!("/{path}");
    if let Some(q) = req.uri().query() {
        path_and_query.push('?');
        path_and_query.push_str(q);
    }
    // The service's credentials stay here: the server is the sandbox's, and untrusted.
    for h in [
        PORT_TOKEN_HEADER,
        EXECD_TOKEN_HEADER,
        EGRESS_TOKEN_HEADER,
        API_KEY_HEADER,
    ] {
        req.headers_mut().remove(h);
    }
    let ops = s.ops.clone();
    crate::routes::ports::forward_with_key(ops, id, port, path_and_query, req).await
}
