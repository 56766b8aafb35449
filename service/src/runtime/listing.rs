//! `ls` and `glob` on a session's channel, streamed. The helper finds every entry before it sends
//! the first (and refuses a listing over the request's `max_bytes` with `too_large`), so the first
//! frame decides: a `listing` event and the answer is all of it, or a RESPONSE with the op's fs
//! error. The entries then come out of the helper a chunk at a time: the request's bounded inbox
//! is the only buffer (at most 64 chunks of about 64 KiB), whatever the listing's size.
//!
//! Every chunk is hostile input: each is parsed into entries (no other shape passes), and a
//! helper that sends more entries or more bytes than it announced, or more than `max_bytes`,
//! loses the channel and the stream ends with an error.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use sandbox_protocol::frame::MAX_PAYLOAD;
use sandbox_protocol::message::{Event, Request};
use sandbox_protocol::wire::{FsEntry, LISTING_FRAME_MAX};

use super::calls::{answer, lost, op_error};
use super::channel::{Caps, Incoming, RequestHandle, Violation};
use super::helper::{CallError, HelperRuntime};
use super::{ANSWER_GRACE, Answer, EXTRACT_STALL, FS_DEADLINE, HelperError};

/// What an `ls` or `glob` found: the helper's answer without a listing (the op's wire response,
/// its `error` set), or the listing, streaming.
pub enum Listing {
    Answer(Answer),
    Stream(ListingStream),
}

/// A listing under way.
pub struct ListingStream {
    /// Entries announced: exactly these many follow.
    pub entries: u64,
    /// Their JSON, each with a comma, as the helper counted it (at most the request's bound).
    pub bytes: u64,
    /// The entries, a chunk at a time, in the listing's order. Ends with an error if the helper
    /// stopped early or broke its word; dropping it cancels the listing in the helper.
    pub chunks: BoxStream<'static, Result<Vec<FsEntry>, HelperError>>,
}

/// How long a listing's consumer (an HTTP client reading slowly) may leave its inbox full before
/// the listing is given up: meanwhile the session's other requests wait on its channel.
const LISTING_STALL: Duration = Duration::from_secs(30);

impl HelperRuntime {
    pub(super) async fn listing(&self, id: &str, request: Request) -> Result<Listing, HelperError> {
        let max_bytes = match &request {
            Request::Ls { max_bytes, .. } | Request::Glob { max_bytes, .. } => *max_bytes,
            _ => return Err(HelperError::Rejected("not a listing".into())),
        };
        // Chunks of whole entries (one long path alone); the answer is `{}` or an fs error,
        // whose message names the request's path (as long as the client made it).
        let caps = Caps {
            data: LISTING_FRAME_MAX,
            response: MAX_PAYLOAD,
        };
        let request = Arc::new(request);
        self.with_retry(id, true, |chan| {
            let request = request.clone();
            Box::pin(async move {
                let mut h = chan
                    .request_abandoned_after(&request, caps, Some(LISTING_STALL))
                    .await
                    .map_err(|e| lost(e, false))?;
                // The helper's search has the op's deadline; past it the channel is wrong.
                let first = tokio::time::timeout(FS_DEADLINE + ANSWER_GRACE, h.recv())
                    .await
                    .map_err(|_| CallError::Helper(HelperError::NoAnswer))?
                    .map_err(|e| lost(e, false))?;
                match first {
                    Incoming::Event(Event::Listing { entries, bytes }) if bytes <= max_bytes => {
                        Ok(Listing::Stream(ListingStream {
                            entries,
                            bytes,
                            chunks: chunks(h, entries, bytes),
                        }))
                    }
                    Incoming::Response(payload) => {
                        let ok = answer(&h, &payload, op_error)?;
                        Ok(Listing::Answer(Answer {
                            ok,
                            output: Bytes::new(),
                        }))
                    }
                    _ => {
                        h.channel().condemn(Violation::BadAnswer);
                        Err(CallError::Helper(HelperError::UnexpectedAnswer))
                    }
                }
            })
        })
        .await
    }
}

/// What the stream has seen so far.
struct Seen {
    entries: u64,
    /// Bytes of DATA payloads, less one per chunk: an honest helper's chunk is its entries'
    /// JSON with a comma each, plus one bracket more than its commas.
    bytes: u64,
    done: bool,
}

/// The DATA frames of a listing as chunks of entries: exactly `entries`, in at most `bytes` of
/// JSON, then the answer.
fn chunks(
    h: RequestHandle,
    entries: u64,
    bytes: u64,
) -> BoxStream<'static, Result<Vec<FsEntry>, HelperError>> {
    let seen = Seen {
        entries: 0,
        bytes: 0,
        done: false,
    };
    Box::pin(futures::stream::unfold(
        (h, seen),
        move |(mut h, mut seen)| async move {
            if seen.done {
                return None;
            }
            let broke = |h: &RequestHandle| {
                h.channel().condemn(Violation::BadAnswer);
                HelperError::UnexpectedAnswer
            };
            let msg = match tokio::time::timeout(EXTRACT_STALL, h.recv()).await {
                Ok(Ok(m)) => m,
                Ok(Err(_)) => {
                    seen.done = true;
                    return Some((Err(HelperError::Lost), (h, seen)));
                }
                Err(_) => {
                    seen.done = true;
                    return Some((Err(HelperError::NoAnswer), (h, seen)));
                }
            };
            match msg {
                Incoming::Data(d) => {
                    seen.bytes += (d.len() as u64).saturating_sub(1);
                    let parsed = serde_json::from_slice::<Vec<FsEntry>>(&d);
                    let Ok(chunk) = parsed else {
                        seen.done = true;
                        return Some((Err(broke(&h)), (h, seen)));
                    };
                    seen.entries += chunk.len() as u64;
                    if seen.entries > entries || seen.bytes > bytes {
                        seen.done = true;
                        return Some((Err(broke(&h)), (h, seen)));
                    }
                    Some((Ok(chunk), (h, seen)))
                }
                Incoming::Response(payload) => {
                    seen.done = true;
                    match answer(&h, &payload, op_error) {
                        Ok(_) if seen.entries == entries => None,
                        Ok(_) => Some((Err(broke(&h)), (h, seen))),
                        Err(CallError::Helper(e)) => Some((Err(e), (h, seen))),
                        Err(CallError::Lost { .. }) => Some((Err(HelperError::Lost), (h, seen))),
                    }
                }
                Incoming::Event(_) | Incoming::Stderr(_) | Incoming::Eof | Incoming::Window(_) => {
                    seen.done = true;
                    Some((Err(broke(&h)), (h, seen)))
                }
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use sandbox_protocol::frame::{encode, encode_json, kind};
    use tokio::sync::mpsc;

    use super::*;
    use crate::engine::{AttachedExec, EngineError};
    use crate::runtime::channel::Channel;

    /// A channel to a helper whose frames the test writes, and a listing request on it (id 1).
    async fn listing_on_a_fake_helper() -> (
        Arc<Channel>,
        RequestHandle,
        mpsc::Sender<Result<Bytes, EngineError>>,
    ) {
        let (tx, rx) = mpsc::channel(16);
        let output = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
        .boxed();
        let mut ready = Vec::new();
        encode_json(
            0,
            kind::EVENT,
            &Event::Ready {
                protocol: sandbox_protocol::VERSION,
                version: "test".into(),
                pid: 1,
            },
            &mut ready,
        );
        let _ = tx.send(Ok(Bytes::from(ready))).await;
        let exec = AttachedExec {
            output,
            input: Box::pin(tokio::io::sink()),
        };
        let chan = Channel::open(exec).await.expect("ready");
        let request = Request::Glob {
            pattern: "*".into(),
            path: "/workspace".into(),
            prune: vec![],
            max_bytes: 1000,
            deadline_ms: 1000,
        };
        let caps = Caps {
            data: LISTING_FRAME_MAX,
            response: MAX_PAYLOAD,
        };
        let h = chan.request(&request, caps).await.expect("sent");
        (chan, h, tx)
    }

    async fn frame(tx: &mpsc::Sender<Result<Bytes, EngineError>>, kind: u8, payload: &[u8]) {
        let mut b = Vec::new();
        encode(1, kind, payload, &mut b);
        let _ = tx.send(Ok(Bytes::from(b))).await;
    }

    const ENTRY: &[u8] = br#"[{"path":"/workspace/a","is_dir":false}]"#;

    #[tokio::test]
    async fn a_listing_yields_what_was_announced_then_ends() {
        let (chan, h, tx) = listing_on_a_fake_helper().await;
        let mut s = chunks(h, 2, 2 * 39);
        frame(&tx, kind::DATA, ENTRY).await;
        frame(&tx, kind::DATA, ENTRY).await;
        frame(&tx, kind::RESPONSE, br#"{"ok":{}}"#).await;
        assert_eq!(
            s.next().await.map(|c| c.map(|c| c.len()).ok()),
            Some(Some(1))
        );
        assert_eq!(
            s.next().await.map(|c| c.map(|c| c.len()).ok()),
            Some(Some(1))
        );
        assert!(s.next().await.is_none());
        assert!(!chan.is_closed());
    }

    #[tokio::test]
    async fn a_helper_that_breaks_its_word_loses_the_channel() {
        // More entries than announced.
        let (chan, h, tx) = listing_on_a_fake_helper().await;
        let mut s = chunks(h, 1, 1000);
        frame(
            &tx,
            kind::DATA,
            br#"[{"path":"/workspace/a","is_dir":false},{"path":"/workspace/b","is_dir":false}]"#,
        )
        .await;
        assert!(matches!(
            s.next().await,
            Some(Err(HelperError::UnexpectedAnswer))
        ));
        assert!(s.next().await.is_none());
        assert_eq!(chan.violation(), Some(Violation::BadAnswer));
        // More bytes than announced.
        let (chan, h, tx) = listing_on_a_fake_helper().await;
        let mut s = chunks(h, 1, 10);
        frame(&tx, kind::DATA, ENTRY).await;
        assert!(matches!(
            s.next().await,
            Some(Err(HelperError::UnexpectedAnswer))
        ));
        assert!(chan.is_closed());
        // A chunk that is not entries.
        let (chan, h, tx) = listing_on_a_fake_helper().await;
        let mut s = chunks(h, 1, 1000);
        frame(&tx, kind::DATA, br#"{"entries":[]}"#).await;
        assert!(matches!(
            s.next().await,
            Some(Err(HelperError::UnexpectedAnswer))
        ));
        assert!(chan.is_closed());
        // Fewer entries than announced: the stream fails, never ends as if whole.
        let (_chan, h, tx) = listing_on_a_fake_helper().await;
        let mut s = chunks(h, 2, 1000);
        frame(&tx, kind::DATA, ENTRY).await;
        frame(&tx, kind::RESPONSE, br#"{"ok":{}}"#).await;
        assert!(matches!(s.next().await, Some(Ok(_))));
        assert!(matches!(s.next().await, Some(Err(_))));
        assert!(s.next().await.is_none());
    }
}
