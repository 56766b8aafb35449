//! The MITM session: terminate the client's TLS with a minted leaf (after checking its SNI against
//! the CONNECT host), then serve HTTP/1.1 or HTTP/2 (by ALPN) and hand each request to
//! [`super::request::handle`], which decides per request with the current policy.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::server::Acceptor;
use shared_policy::Host;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;

use super::request::{self, Binding};
use super::{ClientConn, Ctx, http1_server};
use crate::audit::AuditRecord;
use crate::error::{DenyCode, ProxyError};

/// Per-stream send buffer towards an h2 client: larger than hyper's default so a download is
/// not throttled to small bursts between window updates; bounded, so memory stays per-stream.
const H2_SEND_BUFFER: usize = 1024 * 1024;

/// The client's TLS handshake with the gateway must finish within this.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs one MITM session to completion, or until no byte has moved for the idle timeout.
pub async fn serve<C>(
    io: C,
    binding: Arc<Binding>,
    ctx: Arc<Ctx>,
    client: Arc<ClientConn>,
) -> Result<(), ProxyError>
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let timed_out = || ProxyError::client("TLS handshake timed out");
    let start = tokio::time::timeout(
        TLS_HANDSHAKE_TIMEOUT,
        LazyConfigAcceptor::new(Acceptor::default(), io),
    )
    .await
    .map_err(|_| timed_out())?
    .map_err(ProxyError::client)?;
    // Destination binding, TLS layer: the name the client asks the TLS server for must be the
    // CONNECT host. Without SNI (IP literals) the CONNECT host stands; the Host check still runs.
    let sni = start.client_hello().server_name().map(Host::parse);
    if let Some(sni) = sni
        && sni.as_ref().ok() != Some(&binding.host)
    {
        refuse_sni(&binding, &ctx, started);
        return Err(ProxyError::Denied(DenyCode::SniMismatch));
    }
    let config = ctx.ca.server_config(&binding.host)?;
    let tls = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, start.into_stream(config))
        .await
        .map_err(|_| timed_out())?
        .map_err(ProxyError::client)?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());

    let limits = ctx.limits.clone();
    let service = service_fn(move |req| {
        let binding = binding.clone();
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(request::handle(req, binding, ctx).await) }
    });
    let io = TokioIo::new(tls);
    let served = async {
        if h2 {
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_send_buf_size(H2_SEND_BUFFER)
                .serve_connection(io, service)
                .await
        } else {
            // Upgrades: a WebSocket handshake that the policy allows is handed to
            // `request::upgrade` once the upstream answers 101.
            http1_server(&limits)
                .serve_connection(io, service)
                .with_upgrades()
                .await
        }
    };
    // HTTP/2 has no header-read timeout and an idle h2 connection is never closed by hyper: the
    // activity clock of the client socket covers both protocols.
    tokio::select! {
        res = served => res.map_err(ProxyError::client),
        () = client.activity.idle_for(limits.idle_timeout) => {
            tracing::debug!("mitm session idle; closing");
            Ok(())
        }
    }
}

fn refuse_sni(binding: &Binding, ctx: &Ctx, started: Instant) {
    let mut record = AuditRecord::start(
        &ctx.session,
        "mitm",
        "CONNECT",
        binding.host.as_str(),
        binding.port,
        None,
    );
    record.reason = DenyCode::SniMismatch.code();
    record.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    ctx.audit.record(&record);
}
