//! The forward proxy, one phase per module, reading top to bottom like the protocol:
//! [`serve`] accepts HTTP/1.1 on the listener, [`route`] splits CONNECT from absolute-form,
//! [`connect`] decides reachability and opens a [`tunnel`] or a [`mitm`] session, and
//! [`request`] handles every HTTP request the gateway can see. The bodies they answer with are
//! [`crate::body`]'s.

pub mod connect;
pub mod io;
pub mod mitm;
pub mod request;
pub mod tunnel;
pub mod upstream;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use shared_policy::Host;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use self::io::{Activity, Metered};
use self::request::Binding;
use crate::audit::AuditSink;
use crate::body::{self, Body};
use crate::ca::CertificateAuthority;
use crate::error::{DenyCode, ProxyError};
use crate::guard::AddressGuard;
use crate::policy_store::PolicyStore;

/// A client must finish sending request headers within this (slowloris). hyper starts it again
/// whenever an HTTP/1.1 connection waits for its next request, so it is also the keep-alive
/// idle timeout.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A client connection on which no byte moves, either way, for this long is closed: a tunnel, a
/// MITM session (HTTP/2 included) or a plaintext exchange. Longer than the upstream response-head
/// timeout, so a slow answer is never cut by it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Client connections served at once by default; more are closed at accept.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// hyper's per-connection HTTP/1.1 buffer limit (default ~400 KiB), which bounds what a half-sent
/// request head can make the gateway hold; a longer head gets 431. Applies to the client side of
/// plaintext and MITM'd HTTP/1.1 (HTTP/2 header lists are capped at 16 KiB by hyper).
pub const MAX_BUF_SIZE: usize = 64 * 1024;
/// On SIGTERM, in-flight exchanges get this long before the process exits. Short: the sandbox it
/// serves is being stopped too, and a stop must not wait out the engine's kill timeout.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// The reason-code header on a 403.
pub const DENIED_HEADER: &str = "x-egress-denied";
/// The health path, answered on the health listener ([`crate::health`]) only: on the proxy port
/// it is a 400 like any other origin-form request.
pub const HEALTH_PATH: &str = shared_policy::sidecar::HEALTH_PATH;
/// The enforced policy's `version`, on health answers (never on the proxy port).
pub const VERSION_HEADER: &str = shared_policy::sidecar::VERSION_HEADER;

/// Resource bounds of one gateway. The defaults are the constants above; tests shorten the
/// timeouts to observe them.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Client connections at once, tunnels and MITM sessions included (each is one client TCP
    /// connection); more are closed at accept.
    pub max_connections: usize,
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// See [`IDLE_TIMEOUT`].
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// One accepted client connection: its slot under [`Limits::max_connections`] and its activity
/// clock. The tunnel or MITM session that a CONNECT turns it into holds it too, so the slot is
/// free only when the client's socket is closed.
pub struct ClientConn {
    _slot: OwnedSemaphorePermit,
    /// Last byte moved on the client socket.
    pub activity: Arc<Activity>,
}

impl std::fmt::Debug for ClientConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientConn")
    }
}

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
    /// Connection cap and timeouts.
    pub limits: Limits,
    /// Report-only for every policy (`--shadow`), besides a policy's own `mode: "shadow"`.
    pub shadow: bool,
    /// Counters (decisions are counted by the audit sink; latency here).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Hosts reachable in plain HTTP on private addresses, with their credential
    /// (`--plain-http-hosts`; development stacks only).
    pub plain_http: Vec<shared_policy::sidecar::PlainHttpHost>,
}

impl Ctx {
    /// Whether `policy`'s denials are only reported. Never for the deny-all stand-in: a missing
    /// or broken policy is enforced even in shadow mode (fail closed).
    pub fn shadow_for(&self, policy: &shared_policy::Evaluator) -> bool {
        !policy.is_deny_all() && (self.shadow || policy.is_shadow())
    }

    /// Whether a plaintext request to `host:port` falls under the operator's plain-HTTP opt-in.
    pub fn plain_http(&self, host: &Host, port: u16) -> bool {
        self.plain_http.iter().any(|p| p.matches(host, port))
    }
}

/// The denial that stands when `policy` decides `allowed` for `reason`: none when it allows, or
/// when it denies but only reports (shadow mode, for a policy decision).
pub fn enforced_denial(
    ctx: &Ctx,
    policy: &shared_policy::Evaluator,
    allowed: bool,
    reason: shared_policy::Reason,
) -> Option<DenyCode> {
    let code = DenyCode::Policy(reason);
    if allowed || (ctx.shadow_for(policy) && shadowable(code)) {
        None
    } else {
        Some(code)
    }
}

/// Writes the policy's verdict into `record` (its version, reason and rule) and says what
/// becomes of the exchange: `Ok(true)` it may go on, `Ok(false)` it is denied but only reported
/// (`record.enforced` is then false), `Err` the denial that stands.
pub fn verdict(
    ctx: &Ctx,
    policy: &shared_policy::Evaluator,
    record: &mut crate::audit::AuditRecord,
    allowed: bool,
    reason: shared_policy::Reason,
    rule: Option<usize>,
) -> Result<bool, ProxyError> {
    record.policy_version = policy.version().map(str::to_owned);
    record.reason = reason.code();
    record.rule = rule.and_then(|i| policy.rule_host(i)).map(str::to_owned);
    if let Some(code) = enforced_denial(ctx, policy, allowed, reason) {
        return Err(ProxyError::Denied(code));
    }
    if !allowed {
        record.enforced = false;
    }
    Ok(allowed)
}

/// Whether a denial with `code` may be let through in shadow mode: only the policy's own
/// decisions are report-only; the hardening checks (destination binding, address guard,
/// credentials only over TLS) always apply.
pub fn shadowable(code: DenyCode) -> bool {
    use shared_policy::Reason;
    matches!(
        code,
        DenyCode::Policy(
            Reason::HostNotListed
                | Reason::MethodNotAllowed
                | Reason::PathNotAllowed
                | Reason::RuleDenied
        )
    )
}

/// Accepts connections until `shutdown` resolves, then drains for at most [`SHUTDOWN_GRACE`].
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<Ctx>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let stop = CancellationToken::new();
    let slots = Arc::new(Semaphore::new(
        ctx.limits.max_connections.min(Semaphore::MAX_PERMITS),
    ));
    // Connections closed since the limit was last reached: logged once per burst, not per socket.
    let mut refused = 0u64;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        // Closed before a byte is read, so the cap bounds what a sandbox can make
                        // the gateway hold (buffers, TLS state, tunnels).
                        if refused == 0 {
                            warn!(limit = ctx.limits.max_connections, "connection limit reached; closing new connections");
                        }
                        refused += 1;
                        drop(tcp);
                        continue;
                    };
                    if refused > 0 {
                        info!(refused, "below the connection limit again");
                        refused = 0;
                    }
                    set_nodelay(&tcp);
                    let span = info_span!("conn", client = %peer);
                    ctx.tasks.spawn(accept_conn(tcp, slot, ctx.clone(), stop.clone()).instrument(span));
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

/// Small writes (TLS records, request heads) go out at once: every socket the gateway accepts
/// or opens has Nagle's algorithm off.
pub(crate) fn set_nodelay(tcp: &TcpStream) {
    if let Err(error) = tcp.set_nodelay(true) {
        debug!(%error, "cannot set TCP_NODELAY");
    }
}

/// The HTTP/1.1 server side for clients (the proxy socket and MITM'd HTTP/1.1): bounded buffers
/// and a header-read timeout.
pub(crate) fn http1_server(limits: &Limits) -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_BUF_SIZE);
    builder
}

/// One client connection: HTTP/1.1 with upgrades (CONNECT). Idle keep-alive connections close
/// at once on shutdown; a request in flight finishes first.
async fn accept_conn(
    tcp: TcpStream,
    slot: OwnedSemaphorePermit,
    ctx: Arc<Ctx>,
    stop: CancellationToken,
) {
    let activity = Activity::new();
    let client = Arc::new(ClientConn {
        _slot: slot,
        activity: activity.clone(),
    });
    let limits = ctx.limits.clone();
    let service = service_fn(move |req| {
        let (ctx, client) = (ctx.clone(), client.clone());
        async move { Ok::<_, Infallible>(route(req, ctx, client).await) }
    });
    let io = TokioIo::new(Metered::new(tcp, Some(activity.clone())));
    let conn = http1_server(&limits)
        .serve_connection(io, service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        res = conn.as_mut() => res,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = activity.idle_for(limits.idle_timeout) => {
            debug!("client connection idle; closing");
            Ok(())
        }
    };
    if let Err(error) = result {
        debug!(%error, "client connection ended with an error");
    }
}

/// CONNECT or absolute-form plaintext; anything else (origin-form, the health path included:
/// it has a listener of its own) is a 400.
async fn route(req: Request<Incoming>, ctx: Arc<Ctx>, client: Arc<ClientConn>) -> Response<Body> {
    if req.method() == Method::CONNECT {
        return connect::connect(req, ctx, client).await;
    }
    let uri = req.uri();
    match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(host)) => match Host::parse(host) {
            Ok(host) => {
                let binding = Arc::new(Binding {
                    host,
                    port: uri.port_u16().unwrap_or(80),
                    tls: false,
                    client: Some(client),
                });
                request::handle(req, binding, ctx).await
            }
            Err(_) => error_response(&ProxyError::BadRequest("invalid host")),
        },
        // `GET https://...` to a proxy asks it to originate TLS; clients use CONNECT for that.
        (Some(_), Some(_)) => error_response(&ProxyError::BadRequest("use CONNECT for https")),
        _ => error_response(&ProxyError::BadRequest(
            "not a proxy request (absolute-form or CONNECT expected)",
        )),
    }
}

/// Whether the client asked for JSON: an `Accept` media range `application/json` or `*/*+json`
/// (`application/problem+json`, ...) with a non-zero `q`. `*/*` alone keeps the plain text.
pub fn wants_json(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
            let zero = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            !zero && (media == "application/json" || media.ends_with("+json"))
        })
}

/// The answer to a refused or failed exchange, with its audit record completed (decision,
/// reason, status, duration); the caller writes the record. A denial is a 403 with the reason
/// code in [`DENIED_HEADER`], and a JSON body when `json` (see [`deny_response`]).
///
/// The policy's version is not in it: the agent has nothing to compare it with (the API never
/// returns it), the operator has it in the audit line of the same denial, and any label of the
/// policy tells the sandbox when its policy changed and whether two policies are the same.
pub fn refuse(
    err: &ProxyError,
    record: &mut crate::audit::AuditRecord,
    started: std::time::Instant,
    json: bool,
) -> Response<Body> {
    let denied = matches!(err, ProxyError::Denied(_));
    record.decision = if denied { "deny" } else { "error" };
    record.enforced = true;
    record.reason = err.code();
    let resp = match err {
        ProxyError::Denied(code) if json => deny_json_response(*code, record),
        ProxyError::Denied(code) => deny_response(*code),
        other => error_response(other),
    };
    record.status = Some(resp.status().as_u16());
    record.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    resp
}

/// The typed denial: `{"error": "egress_denied", "reason", "detail", "host", "method", "rule"?,
/// "path"?}`. No policy version (see [`refuse`]).
pub fn deny_json_response(code: DenyCode, record: &crate::audit::AuditRecord) -> Response<Body> {
    let mut doc = serde_json::json!({
        "error": "egress_denied",
        "reason": code.code(),
        "detail": code.describe(),
        "host": record.host,
        "method": record.method,
    });
    if let Some(map) = doc.as_object_mut() {
        if let Some(rule) = &record.rule {
            map.insert("rule".into(), rule.clone().into());
        }
        if let Some(path) = &record.path {
            map.insert("path".into(), path.clone().into());
        }
    }
    let mut resp = Response::new(body::full(format!("{doc}\n")));
    *resp.status_mut() = StatusCode::FORBIDDEN;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut()
        .insert(DENIED_HEADER, HeaderValue::from_static(code.code()));
    resp
}

/// 403 with the reason code in [`DENIED_HEADER`] and a plain-text body saying why.
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
