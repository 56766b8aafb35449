//! The blind tunnel for allowed, non-intercepted hosts. The TLS stays end to end, but the
//! ClientHello is read first: its SNI must name the CONNECT host, or a client could open a tunnel
//! to an allowed host's address and reach another name behind the same front (domain fronting).
//! A tunnel is decided at CONNECT and re-checked on every policy reload: one the current policy
//! would not open as a blind tunnel any more is closed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shared_policy::Host;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, info};

use super::io::Metered;
use super::{ClientConn, Ctx};
use crate::audit::AuditRecord;
use crate::error::DenyCode;

/// The client has this long to send its ClientHello.
pub const CLIENT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A ClientHello larger than this is refused (they are a few hundred bytes; post-quantum key
/// shares make them a few KiB).
const MAX_CLIENT_HELLO: usize = 64 * 1024;
/// Per-direction copy buffer. Larger than tokio's 8 KiB default: a TLS record is up to 16 KiB,
/// and fewer, larger reads and writes are what keeps a tunnel near direct throughput. Memory per
/// tunnel stays fixed (2 x this).
const TUNNEL_BUFFER: usize = 64 * 1024;

/// Why the start of the stream could not be read as a ClientHello.
enum HelloError {
    NotTls,
    Io,
}

/// What a blind tunnel carries besides its two streams.
pub struct Tunnel {
    /// The CONNECT host (normalised).
    pub host: Host,
    /// The tunnel's audit line, completed and written when it closes.
    pub record: AuditRecord,
    /// When the CONNECT arrived.
    pub started: Instant,
    /// The client connection (its slot and activity clock).
    pub client: Arc<ClientConn>,
    /// Policy reloads since the CONNECT decision.
    pub changes: watch::Receiver<u64>,
}

/// Why the copy loop stopped.
enum Ended {
    /// Either side closed (or failed).
    Closed,
    /// No byte moved for the idle timeout.
    Idle,
    /// A reload: the current policy would not open this blind tunnel.
    Revoked(DenyCode),
}

/// Checks the ClientHello, then copies bytes both ways until either side closes, the tunnel
/// idles out, or a policy reload revokes it. Writes the audit line at the end, with the byte
/// counts.
pub async fn run<C>(client: C, mut upstream: TcpStream, tunnel: Tunnel, ctx: Arc<Ctx>)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let Tunnel {
        host,
        mut record,
        started,
        client: conn,
        mut changes,
    } = tunnel;
    // Counts what the client sent (the ClientHello included) and received.
    let mut client = Metered::new(client, None);
    let hello = tokio::time::timeout(CLIENT_HELLO_TIMEOUT, read_client_hello(&mut client)).await;
    let outcome = match hello {
        Ok(Ok((bytes, sni))) => match sni.as_deref().map(Host::parse) {
            // No SNI (an IP literal target, typically): the CONNECT host stands.
            None => Ok(bytes),
            Some(Ok(sni)) if sni == host => Ok(bytes),
            Some(_) => Err(DenyCode::SniMismatch),
        },
        Ok(Err(HelloError::NotTls)) => Err(DenyCode::TlsRequired),
        Ok(Err(HelloError::Io)) | Err(_) => {
            record.decision = "error";
            record.reason = "client-failed";
            finish(&mut record, started, &ctx);
            return;
        }
    };
    let hello = match outcome {
        Ok(bytes) => bytes,
        Err(code) => {
            // The 200 is already sent; closing the stream is the refusal.
            record.decision = "deny";
            record.reason = code.code();
            finish(&mut record, started, &ctx);
            return;
        }
    };
    if upstream.write_all(&hello).await.is_ok() {
        let ended = {
            let copy = tokio::io::copy_bidirectional_with_sizes(
                &mut client,
                &mut upstream,
                TUNNEL_BUFFER,
                TUNNEL_BUFFER,
            );
            tokio::pin!(copy);
            let mut watching = true;
            loop {
                tokio::select! {
                    res = &mut copy => {
                        if let Err(error) = res {
                            debug!(%error, "tunnel closed with an error");
                        }
                        break Ended::Closed;
                    }
                    () = conn.activity.idle_for(ctx.limits.idle_timeout) => break Ended::Idle,
                    changed = changes.changed(), if watching => match changed {
                        Ok(()) => if let Some(code) = revoked(&ctx, &host) {
                            break Ended::Revoked(code);
                        },
                        Err(_) => watching = false,
                    },
                }
            }
        };
        match ended {
            Ended::Closed => {}
            Ended::Idle => debug!("tunnel idle; closing"),
            Ended::Revoked(code) => {
                info!(host = %host, reason = code.code(), "policy reload revoked a blind tunnel; closing it");
                record.decision = "deny";
                record.reason = code.code();
            }
        }
    }
    record.bytes_up = client.read;
    record.bytes = client.written;
    finish(&mut record, started, &ctx);
}

/// Why the current policy would no longer open this blind tunnel, if it would not: the host is
/// denied now, or must now be intercepted (a tunnel cannot enforce methods or inject).
fn revoked(ctx: &Ctx, host: &Host) -> Option<DenyCode> {
    let policy = ctx.policy.current();
    let decision = policy.decide_connect(host);
    if let Some(code) = super::enforced_denial(ctx, &policy, decision.allowed, decision.reason) {
        Some(code)
    } else if !decision.allowed {
        // Report-only: the tunnel stays; its closing line records the open.
        None
    } else if decision.intercept {
        Some(DenyCode::InterceptRequired)
    } else {
        None
    }
}

fn finish(record: &mut AuditRecord, started: Instant, ctx: &Ctx) {
    record.mode = "tunnel";
    record.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    ctx.audit.record(record);
}

/// Reads until rustls has a complete ClientHello; returns the raw bytes (to replay upstream)
/// and the SNI.
async fn read_client_hello<C: AsyncRead + Unpin>(
    client: &mut C,
) -> Result<(Vec<u8>, Option<String>), HelloError> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut seen = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await.map_err(|_| HelloError::Io)?;
        if n == 0 {
            return Err(HelloError::Io);
        }
        // A TLS stream starts with a handshake record (0x16); anything else is not TLS.
        if seen.is_empty() && chunk[0] != 0x16 {
            return Err(HelloError::NotTls);
        }
        seen.extend_from_slice(&chunk[..n]);
        if seen.len() > MAX_CLIENT_HELLO {
            return Err(HelloError::NotTls);
        }
        let mut rest = &chunk[..n];
        while !rest.is_empty() {
            match acceptor.read_tls(&mut rest) {
                Ok(0) | Err(_) => return Err(HelloError::NotTls),
                Ok(_) => {}
            }
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let sni = accepted.client_hello().server_name().map(str::to_owned);
                return Ok((seen, sni));
            }
            Ok(None) => {}
            Err(_) => return Err(HelloError::NotTls),
        }
    }
}
