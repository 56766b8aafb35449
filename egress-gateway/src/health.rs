//! The health listener: `GET /-/health/` answers `200` and the enforced policy's version, on an
//! address of its own (`--health-listen`, loopback by default), never on the proxy port.
//!
//! Two reasons it is not the proxy port. The version labels a policy whose secrets the sandbox
//! must not learn anything about, and the sandbox reaches the proxy port. And the sandbox can
//! hold every connection slot of the proxy port, so an acknowledgement asked there (the control
//! plane's `health --expect-version`, run inside the gateway) would fail while the new policy is
//! in fact enforced. Loopback in the gateway's network namespace is reachable by an exec inside
//! the gateway and by nothing in the sandbox's namespace; its slots are its own.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::body::{Body, full};
use crate::proxy::{Ctx, HEALTH_PATH, VERSION_HEADER, wants_json};

/// Health connections served at once; more are closed at accept. Only processes inside the
/// gateway's namespace get here, and a probe is one short request.
pub const MAX_HEALTH_CONNECTIONS: usize = 16;
/// A health connection is closed after this, whatever it is doing.
pub const HEALTH_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves the health endpoint on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<Ctx>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(MAX_HEALTH_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => {
                let tcp = match accepted {
                    Ok((tcp, _)) => tcp,
                    Err(error) => {
                        warn!(%error, "health accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    debug!("health connection limit reached; closing");
                    continue;
                };
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    let service = service_fn(move |req| {
                        let ctx = ctx.clone();
                        async move { Ok::<_, Infallible>(answer(&req, &ctx)) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEALTH_CONNECTION_TIMEOUT)
                        .serve_connection(TokioIo::new(tcp), service);
                    if let Ok(Err(error)) =
                        tokio::time::timeout(HEALTH_CONNECTION_TIMEOUT, conn).await
                    {
                        debug!(%error, "health connection ended with an error");
                    }
                });
            }
        }
    }
}

fn answer(req: &Request<Incoming>, ctx: &Ctx) -> Response<Body> {
    let path = req.uri().path();
    if req.method() != http::Method::GET
        || (path != HEALTH_PATH && path != HEALTH_PATH.trim_end_matches('/'))
    {
        let mut resp = Response::new(full("not found\n"));
        *resp.status_mut() = StatusCode::NOT_FOUND;
        return resp;
    }
    health_response(ctx, wants_json(req.headers()))
}

/// `200`, the enforced policy's version in [`VERSION_HEADER`], and `ok` (or, for a client that
/// accepts JSON, `{"status", "policy", "policy_version", "shadow"}`).
pub fn health_response(ctx: &Ctx, json: bool) -> Response<Body> {
    let policy = ctx.policy.current();
    let mut resp = if json {
        let doc = serde_json::json!({
            "status": "ok",
            "policy": if policy.is_deny_all() { "unavailable" } else { "loaded" },
            "policy_version": policy.version(),
            "shadow": ctx.shadow_for(&policy),
        });
        let mut resp = Response::new(full(format!("{doc}\n")));
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    } else {
        Response::new(full("ok\n"))
    };
    if let Some(v) = policy.version().and_then(|v| HeaderValue::from_str(v).ok()) {
        resp.headers_mut().insert(VERSION_HEADER, v);
    }
    resp
}
