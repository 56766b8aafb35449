//! The forward proxy, one phase per module, reading top to bottom like the protocol:
//! [`serve`] accepts HTTP/1.1 on the listener, [`route`] splits CONNECT from absolute-form,
//! [`connect`] decides reachability and opens a [`tunnel`] or a [`mitm`] session, and
//! [`request`] handles every HTTP request the gateway can see.

pub mod body;
pub mod connect;
pub mod mitm;
pub mod request;
pub mod tunnel;
pub mod upstream;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use shared_policy::Host;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use self::body::Body;
use self::request::Binding;
use crate::audit::AuditSink;
use crate::ca::CertificateAuthority;
use crate::error::{DenyCode, ProxyError};
use crate::guard::AddressGuard;
use crate::policy_store::PolicyStore;

/// A client must finish sending request headers within this (slowloris).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// On SIGTERM, in-flight exchanges get this long before the process exits. Short: the sandbox it
/// serves is being stopped too, and a stop must not wait out the engine's kill timeout.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// The reason-code header on a 403.
pub const DENIED_HEADER: &str = "x-egress-denied";
/// Origin-form path that answers 200 when the gateway is listening (readiness probes).
pub const HEALTH_PATH: &str = "/-/health/";

/// Everything a connection needs, shared.
pub struct Ctx {
    /// The live policy.
    pub policy: Arc<PolicyStore>,
    /// Leaf minting.
    pub ca: Arc<CertificateAuthority>,
    /// DNS + address checks.
    pub guard: Arc<AddressGuard>,
    /// Pooled upstream clients for MITM'd and plaintext requests.
    pub upstreams: upstream::Upstreams,
    /// Session id for the audit log.
    pub session: Arc<str>,
    /// Audit destination.
    pub audit: Arc<dyn AuditSink>,
    /// Tunnels and MITM sessions outlive their CONNECT request: tracked for graceful shutdown.
    pub tasks: TaskTracker,
}

/// Accepts connections until `shutdown` resolves, then drains for at most [`SHUTDOWN_GRACE`].
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<Ctx>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let stop = CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let _ = tcp.set_nodelay(true);
                    let span = info_span!("conn", client = %peer);
                    ctx.tasks.spawn(accept_conn(tcp, peer, ctx.clone(), stop.clone()).instrument(span));
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    info!("shutting down");
    stop.cancel();
    ctx.tasks.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, ctx.tasks.wait())
        .await
        .is_err()
    {
        info!(
            remaining = ctx.tasks.len(),
            "shutdown grace elapsed; closing remaining connections"
        );
    }
    Ok(())
}

/// One client connection: HTTP/1.1 with upgrades (CONNECT). Idle keep-alive connections close
/// at once on shutdown; a request in flight finishes first.
async fn accept_conn(
    tcp: tokio::net::TcpStream,
    _peer: SocketAddr,
    ctx: Arc<Ctx>,
    stop: CancellationToken,
) {
    let service = service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(route(req, ctx).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(tcp), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        res = conn.as_mut() => res,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(error) = result {
        debug!(%error, "client connection ended with an error");
    }
}

/// CONNECT, absolute-form plaintext, or (origin-form) the health probe.
async fn route(req: Request<Incoming>, ctx: Arc<Ctx>) -> Response<Body> {
    if req.method() == Method::CONNECT {
        return connect::connect(req, ctx).await;
    }
    let uri = req.uri();
    match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(host)) => match Host::parse(host) {
            Ok(host) => {
                let binding = Arc::new(Binding {
                    host,
                    port: uri.port_u16().unwrap_or(80),
                    tls: false,
                });
                request::handle(req, binding, ctx).await
            }
            Err(_) => error_response(&ProxyError::BadRequest("invalid host")),
        },
        // `GET https://...` to a proxy asks it to originate TLS; clients use CONNECT for that.
        (Some(_), Some(_)) => error_response(&ProxyError::BadRequest("use CONNECT for https")),
        _ if uri.path() == HEALTH_PATH || uri.path() == HEALTH_PATH.trim_end_matches('/') => {
            Response::new(body::full("ok\n"))
        }
        _ => error_response(&ProxyError::BadRequest(
            "not a proxy request (absolute-form or CONNECT expected)",
        )),
    }
}

/// 403 with the reason code in [`DENIED_HEADER`] and a plain-text body saying why.
/// The answer to a refused or failed exchange, with its audit record completed (decision,
/// reason, status, duration); the caller writes the record.
pub fn refuse(
    err: &ProxyError,
    record: &mut crate::audit::AuditRecord,
    started: std::time::Instant,
) -> Response<Body> {
    let denied = matches!(err, ProxyError::Denied(_));
    let resp = match err {
        ProxyError::Denied(code) => deny_response(*code),
        other => error_response(other),
    };
    record.decision = if denied { "deny" } else { "error" };
    record.reason = err.code();
    record.status = Some(resp.status().as_u16());
    record.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    resp
}

pub fn deny_response(code: DenyCode) -> Response<Body> {
    let text = format!("egress denied ({}): {}\n", code.code(), code.describe());
    let mut resp = Response::new(body::full(text));
    *resp.status_mut() = StatusCode::FORBIDDEN;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp.headers_mut()
        .insert(DENIED_HEADER, HeaderValue::from_static(code.code()));
    resp
}

/// The response for any other error (status from [`ProxyError::status`]); details stay in the log.
pub fn error_response(err: &ProxyError) -> Response<Body> {
    if let ProxyError::Denied(code) = err {
        return deny_response(*code);
    }
    let status = err.status().unwrap_or(StatusCode::BAD_GATEWAY);
    let text = match err {
        ProxyError::BadRequest(why) => format!("egress: bad request: {why}\n"),
        other => format!(
            "egress: {} ({})\n",
            status.canonical_reason().unwrap_or("error"),
            other.code()
        ),
    };
    let mut resp = Response::new(body::full(text));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
