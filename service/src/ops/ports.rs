//! Ingress: a connection to a port inside a session, for the doors to serve HTTP, WebSockets
//! or raw TCP over. Beside the session's work (no lock: a long stream never blocks a command),
//! the session made to run (a paused one thaws: wake on traffic). Each session's connections
//! are counted and bounded ([`PortStreams`]); each closes after the deployment's idle time.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{Access, Admit, Op, Reached};
use crate::error::ApiError;
use crate::runtime::{PortStream, PortTraffic};
use crate::telemetry::metrics::Metrics;

/// The lowest port a connection may name: below it are the system's services, never an app's.
pub const FIRST_PORT: u16 = 1024;
/// How long a session whose helper answered a connection is trusted to be running (see
/// [`crate::ops::Ops::open_port`]).
pub const RECENTLY_RUNNING: Duration = Duration::from_secs(2);
/// How long a trusted connection waits for the helper before the session is checked.
pub const TRUSTED_ANSWER: Duration = Duration::from_millis(250);

/// The code interpreter's port inside a sandbox (E2B's `JUPYTER_PORT`): an image that serves one
/// (`daiv-sandbox-code-interpreter:local`, E2B's `code-interpreter-v1`) starts it there.
pub const CODE_INTERPRETER_PORT: u16 = 49999;
/// How long a connection to the code interpreter waits for it to listen: it starts with the
/// sandbox, a few milliseconds after the helper does, and a client may call at once.
pub const CODE_INTERPRETER_START: Duration = Duration::from_secs(5);

/// Whether `port` may be reached (the helper itself listens on none).
pub fn check_port(port: u16) -> Result<(), ApiError> {
    if port < FIRST_PORT {
        return Err(ApiError::Unprocessable(format!(
            "port {port} is refused: only ports {FIRST_PORT} to 65535 can be reached"
        )));
    }
    Ok(())
}

/// What a session's connections did, as `GET /session/{id}/ports` answers.
#[derive(Debug, Default, Clone, Copy, Serialize, utoipa::ToSchema)]
pub struct PortUsage {
    /// Connections open now.
    pub open: u64,
    /// Connections opened since the service started.
    pub opened: u64,
    /// Bytes clients sent to the session's ports.
    pub bytes_in: u64,
    /// Bytes the session's ports sent to clients.
    pub bytes_out: u64,
}

/// Every session's connections: counted, bounded, their bytes summed; and when each session's
/// helper last answered one.
#[derive(Default)]
pub struct PortStreams {
    by_session: Mutex<HashMap<String, PortUsage>>,
    answered: Mutex<HashMap<String, Instant>>,
}

impl PortStreams {
    fn with<T>(&self, id: &str, f: impl FnOnce(&mut PortUsage) -> T) -> T {
        let mut map = self
            .by_session
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let usage = map.entry(id.to_string()).or_default();
        let out = f(usage);
        if usage.open == 0 && usage.opened == 0 {
            map.remove(id);
        }
        out
    }

    /// Session `id`'s usage.
    pub fn usage(&self, id: &str) -> PortUsage {
        self.by_session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .copied()
            .unwrap_or_default()
    }

    /// Forgets a session that was removed.
    pub fn forget(&self, id: &str) {
        self.by_session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        self.answered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// Whether session `id`'s helper answered a connection within [`RECENTLY_RUNNING`].
    pub fn recently_running(&self, id: &str) -> bool {
        self.answered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .is_some_and(|t| t.elapsed() < RECENTLY_RUNNING)
    }

    fn answered(&self, id: &str) {
        let mut map = self.answered.lock().unwrap_or_else(PoisonError::into_inner);
        // Sessions long quiet are dropped as the map is written: it holds the active ones.
        if map.len() > 1024 {
            map.retain(|_, t| t.elapsed() < RECENTLY_RUNNING);
        }
        map.insert(id.to_string(), Instant::now());
    }
}

/// An open connection to a port inside a session: an `AsyncRead + AsyncWrite`. Dropping it
/// closes the connection and counts its bytes.
pub struct Connection {
    stream: PortStream,
    traffic: Arc<PortTraffic>,
    session: String,
    streams: Arc<PortStreams>,
    metrics: Arc<Metrics>,
    idle: Duration,
    idle_check: Pin<Box<tokio::time::Sleep>>,
}

impl Connection {
    /// Whether no byte crossed it for the deployment's idle time (the check re-arms itself).
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.idle_check.as_mut().poll(cx).is_pending() {
                return false;
            }
            let idle = self.traffic.idle();
            if idle >= self.idle {
                return true;
            }
            let next = tokio::time::Instant::now() + (self.idle - idle);
            self.idle_check.as_mut().reset(next);
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let sent = self.traffic.sent.load(Ordering::Relaxed);
        let received = self.traffic.received.load(Ordering::Relaxed);
        self.metrics.ports.open.dec();
        self.metrics.ports.bytes_in.inc_by(sent);
        self.metrics.ports.bytes_out.inc_by(received);
        self.streams.with(&self.session, |u| {
            u.open = u.open.saturating_sub(1);
            u.bytes_in += sent;
            u.bytes_out += received;
        });
    }
}

fn timed_out() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the connection was idle past the deployment's limit",
    )
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Pending if self.idle_expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write(cx, buf) {
            Poll::Pending if self.idle_expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Opens a connection to `port` inside the session.
pub struct OpenPort {
    pub port: u16,
    pub streams: Arc<PortStreams>,
}

impl Op for OpenPort {
    type Output = Connection;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<Connection, ApiError> {
        check_port(self.port)?;
        let ws = at.workspace();
        let config = ws.config;
        let metrics = at.sessions.service_metrics().clone();
        let id = at.id.to_string();
        let limit = config.ingress.streams_per_session as u64;
        let full = || {
            metrics.ports.refused.inc();
            ApiError::TooManyRequests {
                detail: format!(
                    "the session has {limit} connections to its ports open, its limit; retry once one closes"
                ),
                retry_after: Some(Duration::from_secs(1)),
            }
        };
        if self.streams.usage(&id).open >= limit {
            return Err(full());
        }
        // Counted once open: a connect given up half-way (its caller went) counts nothing.
        let opened = ws.runtime.connect(&id, self.port).await;
        let stream = match opened {
            Ok(s) => s,
            Err(e) => {
                if matches!(e, crate::runtime::HelperError::PortClosed(_)) {
                    self.streams.answered(&id);
                }
                metrics.ports.refused.inc();
                return Err(e.into());
            }
        };
        self.streams.answered(&id);
        let admitted = self.streams.with(&id, |u| {
            if u.open >= limit {
                return false;
            }
            u.open += 1;
            u.opened += 1;
            true
        });
        if !admitted {
            return Err(full());
        }
        metrics.ports.opened.inc();
        metrics.ports.open.inc();
        let idle = config.ingress.idle;
        Ok(Connection {
            traffic: stream.traffic(),
            stream,
            session: id,
            streams: self.streams,
            metrics,
            idle,
            idle_check: Box::pin(tokio::time::sleep(idle)),
        })
    }
}
