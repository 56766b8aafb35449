//! Ingress's byte stream: a `connect` on the session's channel (protocol 7) as a
//! [`PortStream`], an `AsyncRead + AsyncWrite` the doors serve HTTP, WebSockets or raw TCP
//! over. Three tasks pump it: one takes the helper's frames (grants at once, DATA into a queue
//! never longer than this side granted), one writes that queue to the caller (granting the
//! helper more as the caller reads), one sends what the caller writes within the helper's
//! grants. A caller that stops reading holds at most [`PORT_WINDOW`] bytes here and slows its
//! own connection only; the channel's other requests go on.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sandbox_protocol::frame::{RELAY_CHUNK, kind, window_payload};
use sandbox_protocol::message::{ErrorKind, Event, Request, Response};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use super::channel::{Caps, Incoming};
use super::{HelperError, HelperRuntime};

/// Bytes of DATA the service lets the helper send ahead of the caller's reading.
pub const PORT_WINDOW: u32 = 1024 * 1024;
/// How long the helper may take to say whether its port answered.
const CONNECT_ANSWER: Duration = Duration::from_secs(10);
/// The in-memory pipe between the pumps and the caller.
const PIPE: usize = 256 * 1024;

/// Bytes that crossed a connection, each way, as it goes.
#[derive(Debug)]
pub struct PortTraffic {
    /// From the caller to the sandbox's port.
    pub sent: AtomicU64,
    /// From the port to the caller.
    pub received: AtomicU64,
    /// Milliseconds since `opened` of the last byte either way.
    last_ms: AtomicU64,
    opened: Instant,
}

impl PortTraffic {
    fn new() -> Self {
        Self {
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
            opened: Instant::now(),
        }
    }

    fn touch(&self) {
        self.last_ms
            .store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long no byte crossed either way.
    pub fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.opened.elapsed().saturating_sub(last)
    }
}

/// A connection to a port inside a session. Dropping it closes the connection (the helper's
/// request is cancelled).
pub struct PortStream {
    io: DuplexStream,
    traffic: Arc<PortTraffic>,
    pumps: [JoinHandle<()>; 3],
}

impl PortStream {
    /// What crossed it so far.
    pub fn traffic(&self) -> Arc<PortTraffic> {
        self.traffic.clone()
    }
}

impl Drop for PortStream {
    fn drop(&mut self) {
        for pump in &self.pumps {
            pump.abort();
        }
    }
}

impl AsyncRead for PortStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl HelperRuntime {
    pub(super) async fn connect_port(
        &self,
        id: &str,
        port: u16,
    ) -> Result<PortStream, HelperError> {
        let chan = self.channel(id).await?;
        let request = Request::Connect {
            port,
            window: PORT_WINDOW,
        };
        let caps = Caps {
            data: RELAY_CHUNK,
            response: Caps::SMALL.response,
        };
        let mut h = chan
            .connect(&request, caps)
            .await
            .map_err(|_| HelperError::Lost)?;
        let first = tokio::time::timeout(CONNECT_ANSWER, h.recv())
            .await
            .map_err(|_| HelperError::NoAnswer)?
            .map_err(|_| HelperError::Lost)?;
        let granted = match first {
            Incoming::Event(Event::Connected { window }) => window,
            Incoming::Response(payload) => {
                return Err(match serde_json::from_slice::<Response>(&payload) {
                    Ok(Response::Error(e)) if e.kind == ErrorKind::Refused => {
                        HelperError::PortClosed(port)
                    }
                    Ok(Response::Error(e)) => {
                        tracing::warn!(error = %e, port, "the session's helper could not connect");
                        HelperError::Failed
                    }
                    _ => HelperError::UnexpectedAnswer,
                });
            }
            _ => return Err(HelperError::UnexpectedAnswer),
        };

        let (ours, theirs) = tokio::io::duplex(PIPE);
        let (mut from_caller, mut to_caller) = tokio::io::split(ours);
        let traffic = Arc::new(PortTraffic::new());
        let credit = Arc::new(Semaphore::new(granted as usize));
        let (queue_tx, mut queue) = mpsc::unbounded_channel::<Option<Bytes>>();
        let sender = h.sender();

        // The helper's frames: grants at once, DATA and the read side's end queued.
        let frames = {
            let credit = credit.clone();
            tokio::spawn(async move {
                loop {
                    match h.recv().await {
                        Ok(Incoming::Data(b)) => {
                            if queue_tx.send(Some(b)).is_err() {
                                break;
                            }
                        }
                        Ok(Incoming::Window(n)) => credit.add_permits(n as usize),
                        Ok(Incoming::Eof) => {
                            let _ = queue_tx.send(None);
                        }
                        Ok(Incoming::Response(_)) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                // The connection ended: the caller reads what is queued, then its end.
                credit.close();
                let _ = queue_tx.send(None);
            })
        };
        // The queue to the caller, granting the helper what the caller took.
        let deliver = {
            let (sender, traffic) = (sender.clone(), traffic.clone());
            tokio::spawn(async move {
                while let Some(Some(b)) = queue.recv().await {
                    if to_caller.write_all(&b).await.is_err() {
                        return;
                    }
                    traffic
                        .received
                        .fetch_add(b.len() as u64, Ordering::Relaxed);
                    traffic.touch();
                    let n = u32::try_from(b.len()).unwrap_or(u32::MAX);
                    if sender.send(kind::WINDOW, &window_payload(n)).await.is_err() {
                        break;
                    }
                }
                let _ = to_caller.shutdown().await;
            })
        };
        // What the caller writes, within the helper's grants; its shutdown a half close.
        let send = {
            let traffic = traffic.clone();
            tokio::spawn(async move {
                // A chunk never waits for more than the helper can ever grant.
                let mut buf = vec![0u8; RELAY_CHUNK.min(granted as usize).max(1)];
                loop {
                    let n = match from_caller.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let Ok(permit) = credit.acquire_many(n as u32).await else {
                        return;
                    };
                    permit.forget();
                    if sender.send(kind::DATA, &buf[..n]).await.is_err() {
                        return;
                    }
                    traffic.sent.fetch_add(n as u64, Ordering::Relaxed);
                    traffic.touch();
                }
                let _ = sender.send(kind::EOF, &[]).await;
            })
        };
        Ok(PortStream {
            io: theirs,
            traffic,
            pumps: [frames, deliver, send],
        })
    }
}
