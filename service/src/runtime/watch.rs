//! A watch on a session's channel: armed (or refused) before the caller answers its client, then
//! the helper's changes handed over through a bounded queue that never waits for the client: a
//! client that reads slowly gets an `overflow` where changes were dropped, and the channel, which
//! every request of the session shares, is never held up by it.

use sandbox_protocol::files::FileAnswer;
use sandbox_protocol::message::{Event, Request};
use sandbox_protocol::wire::FsError;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::channel::{Caps, Incoming, RequestHandle};
use super::helper::HelperRuntime;
use super::{EXTRACT_STALL, HelperError};

/// Changes queued for one watch's client at most.
pub const WATCH_QUEUE: usize = 1024;

/// What a watch found: armed (`watches` directories) with its changes (`change` and `overflow`
/// events; the stream ends when the watched directory goes), or the fs-level refusal.
pub enum WatchOpen {
    Armed {
        watches: u32,
        changes: mpsc::Receiver<Event>,
    },
    Refused(FsError),
}

impl HelperRuntime {
    pub(super) async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<WatchOpen, HelperError> {
        let chan = self.channel(id).await?;
        let request = Request::Watch {
            path: path.to_string(),
            recursive,
        };
        let caps = Caps {
            data: 0,
            response: Caps::SMALL.response,
        };
        let mut h = chan
            .request(&request, caps)
            .await
            .map_err(|_| HelperError::Lost)?;
        // Arming walks the tree (recursive): as long as a seed's stall may be.
        let first = tokio::time::timeout(EXTRACT_STALL, h.recv())
            .await
            .map_err(|_| HelperError::NoAnswer)?
            .map_err(|_| HelperError::Lost)?;
        match first {
            Incoming::Event(Event::Armed { watches }) => {
                let changes = hand_over(h);
                Ok(WatchOpen::Armed { watches, changes })
            }
            Incoming::Response(payload) => {
                let answer: FileAnswer = super::files::parse(&h, &payload)?;
                match answer.error {
                    Some(e) => Ok(WatchOpen::Refused(e)),
                    None => Err(HelperError::UnexpectedAnswer),
                }
            }
            _ => {
                h.channel().condemn(super::channel::Violation::BadAnswer);
                Err(HelperError::UnexpectedAnswer)
            }
        }
    }
}

/// The changes of an armed watch, handed over from its request through a queue of
/// [`WATCH_QUEUE`] that never waits for the client: past it, changes are dropped and an
/// `overflow` says so as soon as there is room again. Dropping the receiver cancels the watch.
fn hand_over(mut h: RequestHandle) -> mpsc::Receiver<Event> {
    let (tx, rx) = mpsc::channel(WATCH_QUEUE);
    tokio::spawn(async move {
        // Changes were dropped since the last one queued: say so first.
        let mut lost = false;
        loop {
            let msg = tokio::select! {
                // The client went: dropping the handle cancels the watch.
                _ = tx.closed() => return,
                // Room again after changes were dropped: say so at once, not
                // with the next change (there may be none).
                permit = tx.reserve(), if lost => {
                    if let Ok(p) = permit {
                        p.send(Event::Overflow);
                        lost = false;
                    }
                    continue;
                }
                m = h.recv() => m,
            };
            let ev = match msg {
                Ok(Incoming::Event(ev @ (Event::Change { .. } | Event::Overflow))) => ev,
                Ok(
                    Incoming::Event(_)
                    | Incoming::Data(_)
                    | Incoming::Stderr(_)
                    | Incoming::Eof
                    | Incoming::Window(_),
                ) => {
                    continue;
                }
                // The directory went (the helper answered), or the channel did.
                Ok(Incoming::Response(_)) | Err(_) => return,
            };
            if lost {
                continue;
            }
            match tx.try_send(ev) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => lost = true,
                Err(TrySendError::Closed(_)) => return,
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use futures::StreamExt;
    use sandbox_protocol::frame::{encode_json, kind};
    use sandbox_protocol::message::{ChangeKind, Event, Request};
    use tokio::sync::mpsc;

    use super::*;
    use crate::engine::{AttachedExec, EngineError};
    use crate::runtime::channel::Channel;

    fn event(id: u32, ev: &Event) -> Result<Bytes, EngineError> {
        let mut b = Vec::new();
        encode_json(id, kind::EVENT, ev, &mut b);
        Ok(Bytes::from(b))
    }

    fn change(n: usize) -> Event {
        Event::Change {
            change: ChangeKind::Create,
            path: format!("/workspace/f{n}"),
            entry: None,
        }
    }

    /// A client that does not read gets the first `WATCH_QUEUE` changes, then an `overflow` in
    /// place of those dropped, then the changes after it: the queue is bounded, nothing is lost
    /// without an `overflow`, and the channel the session's other requests share keeps serving.
    #[tokio::test]
    async fn a_watch_read_by_no_one_drops_past_its_queue_and_says_so() {
        let (tx, rx) = mpsc::channel(64);
        let output = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
        .boxed();
        let ready = Event::Ready {
            protocol: sandbox_protocol::VERSION,
            version: "test".into(),
            pid: 1,
        };
        tx.send(event(0, &ready)).await.expect("ready sent");
        let exec = AttachedExec {
            output,
            input: Box::pin(tokio::io::sink()),
        };
        let chan = Channel::open(exec).await.expect("ready");
        let watch = Request::Watch {
            path: "/workspace".into(),
            recursive: true,
        };
        let h = chan.request(&watch, Caps::SMALL).await.expect("sent");
        let mut changes = hand_over(h);

        let flood = WATCH_QUEUE + 500;
        for n in 0..flood {
            tx.send(event(1, &change(n))).await.expect("change sent");
        }
        // Another request on the same channel is answered meanwhile.
        let other = Request::Watch {
            path: "/tmp".into(),
            recursive: false,
        };
        let mut h2 = chan.request(&other, Caps::SMALL).await.expect("sent");
        tx.send(event(2, &Event::Armed { watches: 1 }))
            .await
            .expect("armed sent");
        assert!(matches!(
            h2.recv().await,
            Ok(Incoming::Event(Event::Armed { watches: 1 }))
        ));

        let path = |ev: &Event| match ev {
            Event::Change { path, .. } => Some(path.clone()),
            _ => None,
        };
        for n in 0..WATCH_QUEUE {
            let ev = changes.recv().await.expect("a queued change");
            assert_eq!(path(&ev), Some(format!("/workspace/f{n}")), "in order");
        }
        assert!(
            matches!(changes.recv().await, Some(Event::Overflow)),
            "the dropped changes are said to be lost"
        );
        tx.send(event(1, &change(flood)))
            .await
            .expect("change sent");
        let after = changes.recv().await.expect("the next change");
        assert_eq!(path(&after), Some(format!("/workspace/f{flood}")));
        assert!(!chan.is_closed());
    }
}
