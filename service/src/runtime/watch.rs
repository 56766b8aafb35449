//! A watch on a session's channel: armed (or refused) before the caller answers its client, then
//! the helper's changes handed over through a bounded queue that never waits for the client: a
//! client that reads slowly gets an `overflow` where changes were dropped, and the channel, which
//! every request of the session shares, is never held up by it.

use sandbox_protocol::files::FileAnswer;
use sandbox_protocol::message::{Event, Request};
use sandbox_protocol::wire::FsError;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::channel::{Caps, Incoming};
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
                            Ok(Incoming::Event(ev @ (Event::Change { .. } | Event::Overflow))) => {
                                ev
                            }
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
                Ok(WatchOpen::Armed {
                    watches,
                    changes: rx,
                })
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
