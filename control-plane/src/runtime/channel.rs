//! One framed, multiplexed channel to a session's helper: a long-lived attached exec whose stdin
//! and stdout carry the frames of `sandbox_helper::protocol`.
//!
//! A writer task owns the exec's stdin and a reader task its stdout. Requests get an id and a
//! bounded inbox; the reader routes each frame to its request's inbox by id. When the stream
//! ends (the helper died, the container stopped, the engine went away), every open request sees
//! its inbox close and the channel reports itself closed, so the next call opens a fresh one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use sandbox_helper::protocol::{self, FrameDecoder, kind};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::engine::{AttachedExec, EngineError};

/// Frames waiting for the writer; a full queue makes senders wait (backpressure to the caller).
const OUTBOX: usize = 64;
/// Frames waiting for one request's consumer; a slow consumer slows the reader for all.
const INBOX: usize = 64;
/// How long a fresh helper may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// What the helper sent for one request.
#[derive(Debug)]
pub enum Incoming {
    Event(serde_json::Value),
    Data(Bytes),
    Response(serde_json::Value),
}

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The channel ended (before or during the request).
    #[error("the session helper's channel closed")]
    Closed,
    #[error("the session helper did not start: {0}")]
    Start(String),
    #[error("the session helper broke the protocol: {0}")]
    Protocol(String),
}

type Inboxes = Arc<Mutex<HashMap<u32, mpsc::Sender<Incoming>>>>;

pub struct Channel {
    outbox: mpsc::Sender<Vec<u8>>,
    inboxes: Inboxes,
    next_id: AtomicU32,
    closed: Arc<AtomicBool>,
}

impl Channel {
    /// Takes over an attached exec running `daiv-sandbox-helper serve` and waits for its ready
    /// event.
    pub async fn open(exec: AttachedExec) -> Result<Arc<Self>, ChannelError> {
        let AttachedExec { output, mut input } = exec;
        let (outbox, mut rx) = mpsc::channel::<Vec<u8>>(OUTBOX);
        let inboxes: Inboxes = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();

        let writer_closed = closed.clone();
        tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                if input.write_all(&frame).await.is_err() {
                    break;
                }
                // Coalesce what is already queued into one flush.
                while let Ok(more) = rx.try_recv() {
                    if input.write_all(&more).await.is_err() {
                        writer_closed.store(true, Ordering::SeqCst);
                        return;
                    }
                }
                if input.flush().await.is_err() {
                    break;
                }
            }
            writer_closed.store(true, Ordering::SeqCst);
            let _ = input.shutdown().await;
        });

        let reader_inboxes = inboxes.clone();
        let reader_closed = closed.clone();
        tokio::spawn(async move {
            let mut output = output;
            let mut decoder = FrameDecoder::new();
            let mut ready = Some(ready_tx);
            'read: while let Some(chunk) = output.next().await {
                let Ok(chunk) = chunk else { break };
                decoder.push(&chunk);
                loop {
                    let frame = match decoder.next_frame() {
                        Ok(Some(f)) => f,
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "session helper sent a malformed frame");
                            break 'read;
                        }
                    };
                    if frame.id == 0 {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(Ok(()));
                        }
                        continue;
                    }
                    let msg = match frame.kind {
                        kind::DATA => Incoming::Data(Bytes::from(frame.payload)),
                        kind::EVENT | kind::RESPONSE => {
                            let Ok(v) = serde_json::from_slice(&frame.payload) else {
                                tracing::warn!("session helper sent invalid JSON");
                                break 'read;
                            };
                            if frame.kind == kind::EVENT {
                                Incoming::Event(v)
                            } else {
                                Incoming::Response(v)
                            }
                        }
                        _ => continue,
                    };
                    let last = matches!(msg, Incoming::Response(_));
                    let inbox = {
                        let mut map = lock(&reader_inboxes);
                        if last {
                            map.remove(&frame.id)
                        } else {
                            map.get(&frame.id).cloned()
                        }
                    };
                    if let Some(inbox) = inbox {
                        // A consumer that went away has cancelled; its frames are dropped.
                        let _ = inbox.send(msg).await;
                    }
                }
            }
            reader_closed.store(true, Ordering::SeqCst);
            if let Some(tx) = ready.take() {
                let _ = tx.send(Err("it exited before saying it was ready".to_string()));
            }
            // Dropping the senders closes every open request's inbox.
            lock(&reader_inboxes).clear();
        });

        match tokio::time::timeout(READY_TIMEOUT, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(Arc::new(Self {
                outbox,
                inboxes,
                next_id: AtomicU32::new(1),
                closed,
            })),
            Ok(Ok(Err(why))) => Err(ChannelError::Start(why)),
            Ok(Err(_)) => Err(ChannelError::Start("no answer".to_string())),
            Err(_) => Err(ChannelError::Start(format!(
                "not ready within {READY_TIMEOUT:?}"
            ))),
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst) || self.outbox.is_closed()
    }

    /// Starts a request. The returned handle cancels it in the helper if dropped unfinished.
    pub async fn request(
        self: &Arc<Self>,
        body: &serde_json::Value,
    ) -> Result<RequestHandle, ChannelError> {
        if self.is_closed() {
            return Err(ChannelError::Closed);
        }
        let id = loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                break id;
            }
        };
        let (tx, rx) = mpsc::channel(INBOX);
        lock(&self.inboxes).insert(id, tx);
        let payload = serde_json::to_vec(body)
            .map_err(|e| ChannelError::Protocol(format!("unencodable request: {e}")))?;
        let mut handle = RequestHandle {
            channel: self.clone(),
            id,
            inbox: rx,
            finished: false,
        };
        handle.send(kind::REQUEST, &payload).await?;
        Ok(handle)
    }
}

/// One request in flight on a [`Channel`].
pub struct RequestHandle {
    channel: Arc<Channel>,
    id: u32,
    inbox: mpsc::Receiver<Incoming>,
    finished: bool,
}

impl RequestHandle {
    async fn send(&mut self, kind: u8, payload: &[u8]) -> Result<(), ChannelError> {
        let mut frame = Vec::with_capacity(payload.len() + 9);
        protocol::encode(self.id, kind, payload, &mut frame);
        self.channel
            .outbox
            .send(frame)
            .await
            .map_err(|_| ChannelError::Closed)
    }

    /// Streams input to the request (write content, a seed's tar), in frames of at most the
    /// protocol's payload limit.
    pub async fn send_data(&mut self, data: &[u8]) -> Result<(), ChannelError> {
        for piece in data.chunks(protocol::MAX_PAYLOAD.min(256 * 1024)) {
            self.send(kind::DATA, piece).await?;
        }
        Ok(())
    }

    pub async fn send_eof(&mut self) -> Result<(), ChannelError> {
        self.send(kind::EOF, &[]).await
    }

    /// The next frame for this request; `Err(Closed)` when the channel ended first.
    pub async fn recv(&mut self) -> Result<Incoming, ChannelError> {
        match self.inbox.recv().await {
            Some(msg) => {
                if matches!(msg, Incoming::Response(_)) {
                    self.finished = true;
                }
                Ok(msg)
            }
            None => {
                self.finished = true;
                Err(ChannelError::Closed)
            }
        }
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // The client went away or the caller gave up: the helper kills what the request runs.
        lock(&self.channel.inboxes).remove(&self.id);
        let mut frame = Vec::with_capacity(9);
        protocol::encode(self.id, kind::CANCEL, &[], &mut frame);
        if self.channel.outbox.try_send(frame.clone()).is_err() {
            let outbox = self.channel.outbox.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = outbox.send(frame).await;
                });
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl From<EngineError> for ChannelError {
    fn from(e: EngineError) -> Self {
        ChannelError::Start(e.to_string())
    }
}
