//! One framed, multiplexed channel to a session's helper: a long-lived attached exec whose stdin
//! and stdout carry the frames of `sandbox_protocol`.
//!
//! A writer task owns the exec's stdin and a reader task its stdout. Requests get an id and a
//! bounded inbox; the reader routes each frame to its request's inbox by id. When the stream
//! ends (the helper died, the container stopped, the engine went away), every open request sees
//! its inbox close and the channel reports itself closed, so the next call opens a fresh one.
//!
//! Everything the helper sends is hostile input: the helper runs inside the sandbox. The reader
//! looks at each frame's header before its payload and keeps a payload only when the frame is
//! one its request can take: of a kind the helper may send, no larger than that kind allows for
//! that request ([`Caps`]). A frame for a request that has ended (its client left, it was
//! cancelled) is skipped as it streams by, never buffered. Anything else — a kind the helper
//! never sends, an id never issued, an oversized frame, an event that is not one, or too much
//! traffic for ended requests — is a [`Violation`]: the channel is closed at once, every open
//! request fails, and the runtime waits before it opens another one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use sandbox_protocol::frame::{HEADER_LEN, MAX_PAYLOAD, encode, kind};
use sandbox_protocol::message::{Event, Request};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::engine::{AttachedExec, EngineError};

/// Frames waiting for the writer; a full queue makes senders wait (backpressure to the caller).
const OUTBOX: usize = 64;
/// Frames waiting for one request's consumer; a slow consumer slows the reader for all.
const INBOX: usize = 64;
/// How long a fresh helper may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest event: `ready`, `started` and `finished` are a few dozen bytes; a watch's `change`
/// names a path (4 KiB at most) twice, with its entry's owner and group.
const EVENT_MAX: usize = 16 * 1024;
/// Bytes of frames for ended requests the channel skips before it calls the traffic a
/// violation: a cancelled command is killed within milliseconds, so its last output is far less.
/// The count restarts with every frame for a live request.
const SKIP_BUDGET: u64 = 64 * 1024 * 1024;

/// The largest frames one request takes from the helper, by kind.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// A DATA frame (command output, a poll's output).
    pub data: usize,
    /// The RESPONSE frame.
    pub response: usize,
}

impl Caps {
    /// A request whose answer is a few fields and that streams no data.
    pub const SMALL: Caps = Caps {
        data: 0,
        response: 64 * 1024,
    };
}

/// What the helper sent for one request.
#[derive(Debug)]
pub enum Incoming {
    Event(Event),
    Data(Bytes),
    /// What the running command of a split `run` wrote to its stderr.
    Stderr(Bytes),
    /// The RESPONSE payload, still JSON: the caller parses it into the op's own type.
    Response(Bytes),
    /// A `connect`'s: the connection's read side ended.
    Eof,
    /// A `connect`'s: the helper took this many more bytes of DATA.
    Window(u32),
}

/// Why the channel stopped trusting the helper.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("frame length {0} is below the header's 5 bytes")]
    ShortFrame(u32),
    #[error("frame kind {0} is not one the helper sends")]
    Kind(u8),
    #[error("frame for request {0}, which was never issued")]
    UnknownId(u32),
    #[error("{what} of {len} bytes over the {cap}-byte limit for its request")]
    Oversize {
        what: &'static str,
        len: usize,
        cap: usize,
    },
    #[error("an event that is not one of the protocol's")]
    BadEvent,
    #[error("the helper was not ready first")]
    NotReady,
    #[error("over {SKIP_BUDGET} bytes of frames for requests that ended")]
    Flood,
    #[error("an answer that is not the protocol's")]
    BadAnswer,
}

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The channel ended (before or during the request).
    #[error("the session helper's channel closed")]
    Closed,
    #[error("the session helper did not start: {0}")]
    Start(String),
    /// The helper speaks another protocol (a session made by another build): it is not spoken
    /// to at all.
    #[error(
        "the session helper speaks protocol {spoken} (helper {helper}), this control plane {}",
        sandbox_protocol::VERSION
    )]
    Version { spoken: u32, helper: String },
    #[error("the session helper broke the protocol: {0}")]
    Protocol(String),
}

struct Inbox {
    tx: mpsc::Sender<Incoming>,
    caps: Caps,
    /// How long its consumer may leave a full inbox before the request is given up (see
    /// [`Channel::request_abandoned_after`]); `None`: the reader waits for it.
    stall: Option<Duration>,
    /// A `connect`'s (see [`Channel::connect`]): takes EOF and WINDOW frames too.
    relay: bool,
}

#[derive(Default)]
struct Book {
    live: HashMap<u32, Inbox>,
    /// Ids below this were issued.
    next: u32,
}

type Shared = Arc<Mutex<Book>>;

pub struct Channel {
    outbox: mpsc::Sender<Vec<u8>>,
    book: Shared,
    next_id: AtomicU32,
    closed: Arc<AtomicBool>,
    /// Set once the helper broke the protocol: the runtime does not reopen at once.
    violated: Arc<Mutex<Option<Violation>>>,
}

/// Where a frame's payload goes.
enum Route {
    /// To this request's inbox (`None`: the ready event, taken by the reader itself), with how
    /// long its consumer may stall.
    Keep(Option<(mpsc::Sender<Incoming>, Option<Duration>)>),
    /// Nowhere: its request ended. Counted down as it streams by, never stored.
    Skip,
}

/// A frame whose payload is still arriving.
struct Pending {
    id: u32,
    kind: u8,
    remaining: usize,
    route: Route,
    payload: Vec<u8>,
}

impl Channel {
    /// Takes over an attached exec running `daiv-sandbox-helper serve` and waits for its ready
    /// event.
    pub async fn open(exec: AttachedExec) -> Result<Arc<Self>, ChannelError> {
        let AttachedExec { output, mut input } = exec;
        let (outbox, mut rx) = mpsc::channel::<Vec<u8>>(OUTBOX);
        let book: Shared = Arc::new(Mutex::new(Book {
            live: HashMap::new(),
            next: 1,
        }));
        let closed = Arc::new(AtomicBool::new(false));
        let violated = Arc::new(Mutex::new(None));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<(), ChannelError>>();

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

        let reader = Reader {
            book: book.clone(),
            outbox: outbox.clone(),
            ready: Some(ready_tx),
            skipped: 0,
        };
        let reader_closed = closed.clone();
        let reader_violated = violated.clone();
        tokio::spawn(async move {
            let mut reader = reader;
            let ended = reader.run(output).await;
            reader_closed.store(true, Ordering::SeqCst);
            // Before its ready event, whatever ends the stream (the container stopped under the
            // exec, an engine's message) is a failed start, the opener's to report: no channel
            // was given to anyone, so there is no protocol to have broken.
            if let Some(tx) = reader.ready.take() {
                let why = match &ended {
                    Err(v) => format!("it ended before saying it was ready: {v}"),
                    Ok(()) => "it exited before saying it was ready".to_string(),
                };
                let _ = tx.send(Err(ChannelError::Start(why)));
            } else if let Err(v) = ended {
                tracing::warn!(violation = %v, "session helper broke the protocol; channel closed");
                *lock(&reader_violated) = Some(v);
            }
            // Dropping the senders closes every open request's inbox.
            lock(&reader.book).live.clear();
        });

        match tokio::time::timeout(READY_TIMEOUT, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(Arc::new(Self {
                outbox,
                book,
                next_id: AtomicU32::new(1),
                closed,
                violated,
            })),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(ChannelError::Start("no answer".to_string())),
            Err(_) => Err(ChannelError::Start(format!(
                "not ready within {READY_TIMEOUT:?}"
            ))),
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst) || self.outbox.is_closed()
    }

    /// Why the helper lost the channel's trust, if it did.
    pub fn violation(&self) -> Option<Violation> {
        lock(&self.violated).clone()
    }

    /// Closes the channel because an answer broke the protocol (the reader cannot see that:
    /// answers are parsed by their requests).
    pub fn condemn(&self, v: Violation) {
        tracing::warn!(violation = %v, "session helper broke the protocol; channel closed");
        *lock(&self.violated) = Some(v);
        self.closed.store(true, Ordering::SeqCst);
        lock(&self.book).live.clear();
    }

    /// Starts a request taking at most `caps` from the helper. The returned handle cancels it in
    /// the helper if dropped unfinished. A consumer that stops taking its frames slows the
    /// reader, so every request of the channel (a run's output is worth waiting for).
    pub async fn request(
        self: &Arc<Self>,
        body: &Request,
        caps: Caps,
    ) -> Result<RequestHandle, ChannelError> {
        self.request_abandoned_after(body, caps, None).await
    }

    /// [`Self::request`], but a consumer that leaves its inbox full for `stall` loses the
    /// request instead: it is cancelled in the helper, its frames are skipped, its inbox ends.
    /// For a download whose client stopped reading: the session's other requests go on.
    pub async fn request_abandoned_after(
        self: &Arc<Self>,
        body: &Request,
        caps: Caps,
        stall: Option<Duration>,
    ) -> Result<RequestHandle, ChannelError> {
        self.start(body, caps, stall, false).await
    }

    /// Starts a `connect` (`body`): its inbox takes the helper's EOF and WINDOW frames, and
    /// never fills, as the helper sends no more DATA than the caller granted.
    pub async fn connect(
        self: &Arc<Self>,
        body: &Request,
        caps: Caps,
    ) -> Result<RequestHandle, ChannelError> {
        self.start(body, caps, None, true).await
    }

    async fn start(
        self: &Arc<Self>,
        body: &Request,
        caps: Caps,
        stall: Option<Duration>,
        relay: bool,
    ) -> Result<RequestHandle, ChannelError> {
        if self.is_closed() {
            return Err(ChannelError::Closed);
        }
        let payload = serde_json::to_vec(body)
            .map_err(|e| ChannelError::Protocol(format!("unencodable request: {e}")))?;
        let (tx, rx) = mpsc::channel(INBOX);
        let id = {
            let mut book = lock(&self.book);
            let id = loop {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                if id != 0 {
                    break id;
                }
            };
            book.next = book.next.max(id.wrapping_add(1));
            book.live.insert(
                id,
                Inbox {
                    tx,
                    caps,
                    stall,
                    relay,
                },
            );
            id
        };
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

/// The reader's side: the frame currently streaming in, and what it decided about it.
struct Reader {
    book: Shared,
    /// To cancel a request whose consumer stalled.
    outbox: mpsc::Sender<Vec<u8>>,
    ready: Option<tokio::sync::oneshot::Sender<Result<(), ChannelError>>>,
    /// Bytes skipped for ended requests since the last frame for a live one.
    skipped: u64,
}

impl Reader {
    /// Reads frames until the stream ends (`Ok`) or the helper breaks the protocol.
    async fn run(
        &mut self,
        mut output: futures::stream::BoxStream<'static, Result<Bytes, EngineError>>,
    ) -> Result<(), Violation> {
        let mut header = [0u8; HEADER_LEN];
        let mut have = 0usize;
        let mut current: Option<Pending> = None;
        while let Some(chunk) = output.next().await {
            let Ok(chunk) = chunk else { return Ok(()) };
            let mut rest: &[u8] = &chunk;
            while !rest.is_empty() {
                match current.as_mut() {
                    None => {
                        let take = (HEADER_LEN - have).min(rest.len());
                        header[have..have + take].copy_from_slice(&rest[..take]);
                        have += take;
                        rest = &rest[take..];
                        if have == HEADER_LEN {
                            have = 0;
                            let frame = self.admit(&header)?;
                            if frame.remaining == 0 {
                                self.deliver(frame).await?;
                            } else {
                                current = Some(frame);
                            }
                        }
                    }
                    Some(frame) => {
                        let take = frame.remaining.min(rest.len());
                        if let Route::Keep(_) = frame.route {
                            frame.payload.extend_from_slice(&rest[..take]);
                        }
                        frame.remaining -= take;
                        rest = &rest[take..];
                        if frame.remaining == 0
                            && let Some(frame) = current.take()
                        {
                            self.deliver(frame).await?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Decides about a frame from its header alone, before any of its payload is read.
    fn admit(&mut self, h: &[u8; HEADER_LEN]) -> Result<Pending, Violation> {
        let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        if len < 5 {
            return Err(Violation::ShortFrame(len));
        }
        let n = len as usize - 5;
        let id = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let k = h[8];
        if !matches!(
            k,
            kind::DATA | kind::STDERR | kind::EVENT | kind::RESPONSE | kind::EOF | kind::WINDOW
        ) {
            return Err(Violation::Kind(k));
        }
        let within = |what, cap: usize| {
            if n > cap {
                Err(Violation::Oversize { what, len: n, cap })
            } else {
                Ok(())
            }
        };
        match k {
            kind::EVENT => within("an event", EVENT_MAX)?,
            kind::EOF => within("an EOF", 0)?,
            kind::WINDOW => within("a window", 4)?,
            _ => {}
        }
        let pending = |route| Pending {
            id,
            kind: k,
            remaining: n,
            route,
            payload: Vec::new(),
        };
        if id == 0 {
            // Only the ready event, once, before anything else.
            if self.ready.is_none() || k != kind::EVENT {
                return Err(Violation::UnknownId(0));
            }
            return Ok(pending(Route::Keep(None)));
        }
        if self.ready.is_some() {
            return Err(Violation::NotReady);
        }
        let book = lock(&self.book);
        if id >= book.next {
            return Err(Violation::UnknownId(id));
        }
        let Some(inbox) = book.live.get(&id) else {
            drop(book);
            self.skipped += (n + HEADER_LEN) as u64;
            if self.skipped > SKIP_BUDGET {
                return Err(Violation::Flood);
            }
            return Ok(pending(Route::Skip));
        };
        match k {
            kind::DATA | kind::STDERR => within("a data frame", inbox.caps.data)?,
            kind::RESPONSE => within("a response", inbox.caps.response.min(MAX_PAYLOAD))?,
            // Only a connection ends its read side or grants more.
            kind::EOF | kind::WINDOW if !inbox.relay => return Err(Violation::Kind(k)),
            _ => {}
        }
        let to = (inbox.tx.clone(), inbox.stall);
        drop(book);
        self.skipped = 0;
        let mut frame = pending(Route::Keep(Some(to)));
        frame.payload.reserve_exact(n);
        Ok(frame)
    }

    /// Hands a complete frame to its request (or takes the ready event).
    async fn deliver(&mut self, frame: Pending) -> Result<(), Violation> {
        let Pending {
            id,
            kind: k,
            route,
            payload,
            ..
        } = frame;
        let Route::Keep(to) = route else {
            return Ok(());
        };
        let msg = match k {
            kind::DATA => Incoming::Data(Bytes::from(payload)),
            kind::STDERR => Incoming::Stderr(Bytes::from(payload)),
            kind::RESPONSE => Incoming::Response(Bytes::from(payload)),
            kind::EOF => Incoming::Eof,
            kind::WINDOW => Incoming::Window(
                sandbox_protocol::frame::window_bytes(&payload).ok_or(Violation::BadAnswer)?,
            ),
            _ => Incoming::Event(
                serde_json::from_slice::<Event>(&payload).map_err(|_| Violation::BadEvent)?,
            ),
        };
        if id == 0 {
            let Incoming::Event(Event::Ready {
                protocol: spoken,
                version,
                ..
            }) = msg
            else {
                return Err(Violation::BadEvent);
            };
            // A helper of another protocol (an older session's) is not spoken to at all.
            let ready = if spoken == sandbox_protocol::VERSION {
                Ok(())
            } else {
                Err(ChannelError::Version {
                    spoken,
                    helper: version.chars().take(32).collect(),
                })
            };
            if let Some(tx) = self.ready.take() {
                let _ = tx.send(ready);
            }
            return Ok(());
        }
        if k == kind::RESPONSE {
            // The request's last frame: it is no longer live.
            lock(&self.book).live.remove(&id);
        }
        let Some((to, stall)) = to else {
            return Ok(());
        };
        // A consumer that went away has cancelled; its frames are dropped.
        let Some(stall) = stall else {
            let _ = to.send(msg).await;
            return Ok(());
        };
        if tokio::time::timeout(stall, to.send(msg)).await.is_err() {
            tracing::warn!(
                request = id,
                stalled_s = stall.as_secs(),
                "a request's consumer stopped taking its frames: the request is given up"
            );
            lock(&self.book).live.remove(&id);
            let mut frame = Vec::with_capacity(HEADER_LEN);
            encode(id, kind::CANCEL, &[], &mut frame);
            let outbox = self.outbox.clone();
            tokio::spawn(async move {
                let _ = outbox.send(frame).await;
            });
        }
        Ok(())
    }
}

/// One request in flight on a [`Channel`].
pub struct RequestHandle {
    channel: Arc<Channel>,
    id: u32,
    inbox: mpsc::Receiver<Incoming>,
    finished: bool,
}

/// Queues one frame of request `id` for the writer.
async fn send_frame(
    channel: &Channel,
    id: u32,
    kind: u8,
    payload: &[u8],
) -> Result<(), ChannelError> {
    let mut frame = Vec::with_capacity(payload.len() + HEADER_LEN);
    encode(id, kind, payload, &mut frame);
    channel
        .outbox
        .send(frame)
        .await
        .map_err(|_| ChannelError::Closed)
}

impl RequestHandle {
    async fn send(&mut self, kind: u8, payload: &[u8]) -> Result<(), ChannelError> {
        send_frame(&self.channel, self.id, kind, payload).await
    }

    /// Streams input to the request (write content, a seed's tar), in frames of at most the
    /// protocol's payload limit.
    pub async fn send_data(&mut self, data: &[u8]) -> Result<(), ChannelError> {
        for piece in data.chunks(MAX_PAYLOAD.min(256 * 1024)) {
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

    /// The channel this request runs on.
    pub fn channel(&self) -> &Arc<Channel> {
        &self.channel
    }

    /// A second way to send this request's frames, for a task other than the one receiving
    /// (a connection's two directions). Dropping it does not cancel the request.
    pub fn sender(&self) -> RequestSender {
        RequestSender {
            channel: self.channel.clone(),
            id: self.id,
        }
    }
}

/// Sends frames for a request another task receives (see [`RequestHandle::sender`]).
#[derive(Clone)]
pub struct RequestSender {
    channel: Arc<Channel>,
    id: u32,
}

impl RequestSender {
    /// One frame of `kind`; `Err(Closed)` once the channel is gone.
    pub async fn send(&self, kind: u8, payload: &[u8]) -> Result<(), ChannelError> {
        send_frame(&self.channel, self.id, kind, payload).await
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // The client went away or the caller gave up: the helper kills what the request runs.
        lock(&self.channel.book).live.remove(&self.id);
        let mut frame = Vec::with_capacity(HEADER_LEN);
        encode(self.id, kind::CANCEL, &[], &mut frame);
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

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::frame::encode_json;

    /// A helper whose stdout the test writes: what it sends, frame by frame.
    struct FakeHelper {
        out: mpsc::Sender<Result<Bytes, EngineError>>,
    }

    impl FakeHelper {
        async fn send(&self, bytes: Vec<u8>) {
            let _ = self.out.send(Ok(Bytes::from(bytes))).await;
        }

        async fn frame(&self, id: u32, kind: u8, payload: &[u8]) {
            let mut b = Vec::new();
            encode(id, kind, payload, &mut b);
            self.send(b).await;
        }

        /// A frame of `len` payload bytes, streamed in 64 KiB pieces.
        async fn big(&self, id: u32, kind: u8, len: usize) {
            let mut header = Vec::new();
            header.extend_from_slice(&u32::try_from(len + 5).unwrap_or(u32::MAX).to_be_bytes());
            header.extend_from_slice(&id.to_be_bytes());
            header.push(kind);
            self.send(header).await;
            let mut left = len;
            while left > 0 {
                let n = left.min(64 * 1024);
                self.send(vec![b'x'; n]).await;
                left -= n;
            }
        }
    }

    async fn open_with(protocol: u32) -> (Result<Arc<Channel>, ChannelError>, FakeHelper) {
        let (tx, rx) = mpsc::channel(4);
        let output = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
        .boxed();
        let exec = AttachedExec {
            output,
            input: Box::pin(tokio::io::sink()),
        };
        let helper = FakeHelper { out: tx };
        let mut ready = Vec::new();
        encode_json(
            0,
            kind::EVENT,
            &Event::Ready {
                protocol,
                version: "test".into(),
                pid: 1,
            },
            &mut ready,
        );
        helper.send(ready).await;
        (Channel::open(exec).await, helper)
    }

    async fn open() -> (Arc<Channel>, FakeHelper) {
        let (chan, helper) = open_with(sandbox_protocol::VERSION).await;
        (chan.expect("ready"), helper)
    }

    async fn closed_with(chan: &Channel) -> Option<Violation> {
        for _ in 0..200 {
            if chan.is_closed() {
                return chan.violation();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }

    #[tokio::test]
    async fn a_helper_of_another_protocol_is_not_spoken_to() {
        let (chan, _helper) = open_with(sandbox_protocol::VERSION + 1).await;
        let Err(ChannelError::Version { spoken, .. }) = chan else {
            panic!("opened a channel to a helper of another protocol");
        };
        assert_eq!(spoken, sandbox_protocol::VERSION + 1);
    }

    #[tokio::test]
    async fn frames_for_ids_never_issued_close_the_channel() {
        let (chan, helper) = open().await;
        helper.frame(7, kind::RESPONSE, br#"{"ok":{}}"#).await;
        assert_eq!(closed_with(&chan).await, Some(Violation::UnknownId(7)));
        assert!(matches!(
            chan.request(&Request::Ping, Caps::SMALL).await,
            Err(ChannelError::Closed)
        ));
    }

    #[tokio::test]
    async fn kinds_the_helper_never_sends_and_oversized_events_close_the_channel() {
        let (chan, helper) = open().await;
        let _h = chan
            .request(&Request::Ping, Caps::SMALL)
            .await
            .expect("sent");
        helper.frame(1, kind::REQUEST, b"{}").await;
        assert_eq!(
            closed_with(&chan).await,
            Some(Violation::Kind(kind::REQUEST))
        );

        let (chan, helper) = open().await;
        let _h = chan
            .request(&Request::Ping, Caps::SMALL)
            .await
            .expect("sent");
        helper.frame(1, kind::EVENT, &[b' '; EVENT_MAX + 1]).await;
        assert!(matches!(
            closed_with(&chan).await,
            Some(Violation::Oversize { .. })
        ));

        let (chan, helper) = open().await;
        let _h = chan
            .request(&Request::Ping, Caps::SMALL)
            .await
            .expect("sent");
        helper.frame(1, kind::EVENT, br#"{"a":1}"#).await;
        assert_eq!(closed_with(&chan).await, Some(Violation::BadEvent));
    }

    #[tokio::test]
    async fn a_frame_over_its_requests_cap_closes_the_channel_before_it_is_read() {
        let (chan, helper) = open().await;
        let mut h = chan
            .request(&Request::Ping, Caps::SMALL)
            .await
            .expect("sent");
        // Only the header is sent: the decision needs nothing more.
        let mut header = Vec::new();
        header.extend_from_slice(&((16u32 << 20) + 5).to_be_bytes());
        header.extend_from_slice(&1u32.to_be_bytes());
        header.push(kind::RESPONSE);
        helper.send(header).await;
        assert!(matches!(
            closed_with(&chan).await,
            Some(Violation::Oversize {
                what: "a response",
                ..
            })
        ));
        assert!(matches!(h.recv().await, Err(ChannelError::Closed)));
    }

    #[tokio::test]
    async fn frames_of_ended_requests_are_skipped_and_a_flood_of_them_closes_the_channel() {
        let (chan, helper) = open().await;
        let ended = chan
            .request(&Request::Ping, Caps::SMALL)
            .await
            .expect("sent");
        drop(ended); // cancelled: its late frames are skipped, not buffered, not delivered
        helper.big(1, kind::DATA, 16 << 20).await;
        let mut live = chan
            .request(&Request::Ping, Caps::SMALL)
            .await
            .expect("sent");
        helper.frame(2, kind::RESPONSE, br#"{"ok":{}}"#).await;
        match live.recv().await {
            Ok(Incoming::Response(b)) => assert_eq!(&b[..], br#"{"ok":{}}"#),
            other => panic!("{other:?}"),
        }
        assert!(!chan.is_closed());
        // Past the budget with no live request answered in between: a flood.
        for _ in 0..5 {
            helper.big(1, kind::DATA, 16 << 20).await;
        }
        assert_eq!(closed_with(&chan).await, Some(Violation::Flood));
    }

    /// A download whose client stopped reading: its request is given up after its stall, and
    /// the session's other requests are answered; a request without one is waited for.
    #[tokio::test]
    async fn a_stalled_consumer_loses_its_request_not_the_channel() {
        let (chan, helper) = open().await;
        let caps = Caps {
            data: 1024,
            response: 1024,
        };
        let mut stalled = chan
            .request_abandoned_after(&Request::Ping, caps, Some(Duration::from_millis(200)))
            .await
            .expect("sent");
        let mut other = chan.request(&Request::Ping, caps).await.expect("sent");
        // More than its inbox holds, never read.
        for _ in 0..INBOX + 8 {
            helper.frame(1, kind::DATA, b"chunk").await;
        }
        helper.frame(2, kind::RESPONSE, br#"{"ok":{}}"#).await;
        let answered = tokio::time::timeout(Duration::from_secs(5), other.recv()).await;
        assert!(
            matches!(answered, Ok(Ok(Incoming::Response(_)))),
            "{answered:?}"
        );
        assert!(!chan.is_closed());
        // What it had queued, then the end of its inbox.
        let mut got = 0;
        while let Ok(Incoming::Data(_)) = stalled.recv().await {
            got += 1;
        }
        assert!((INBOX..INBOX + 8).contains(&got), "{got}");
    }

    #[tokio::test]
    async fn output_and_answers_reach_their_request() {
        let (chan, helper) = open().await;
        let caps = Caps {
            data: 1024,
            response: 1024,
        };
        let mut h = chan.request(&Request::Ping, caps).await.expect("sent");
        let mut ev = Vec::new();
        encode_json(1, kind::EVENT, &Event::Started { index: 0 }, &mut ev);
        helper.send(ev).await;
        helper.frame(1, kind::DATA, b"hello").await;
        helper.frame(1, kind::RESPONSE, br#"{"ok":{}}"#).await;
        assert!(matches!(
            h.recv().await,
            Ok(Incoming::Event(Event::Started { index: 0 }))
        ));
        assert!(matches!(h.recv().await, Ok(Incoming::Data(d)) if &d[..] == b"hello"));
        assert!(matches!(h.recv().await, Ok(Incoming::Response(_))));
        assert!(!chan.is_closed());
    }
}
