//! stdout: one writer thread owns it and serialises whole frames from every request thread,
//! flushing whenever it has nothing more queued.

use std::io::{BufWriter, Write};
use std::sync::mpsc::{SyncSender, sync_channel};

use sandbox_protocol::frame::{MAX_PAYLOAD, encode, encode_json, kind};
use sandbox_protocol::message::{ErrorKind, Event, Response};

/// Frames queued for stdout; a full queue makes producers wait (a slow client slows commands
/// instead of growing memory).
const OUT_QUEUE: usize = 256;

/// The sending side of stdout.
#[derive(Clone)]
pub(super) struct Out {
    tx: SyncSender<Vec<u8>>,
}

impl Out {
    /// Starts the writer thread. When stdout fails the client is gone: the process exits.
    pub(super) fn stdout() -> Out {
        let (tx, rx) = sync_channel::<Vec<u8>>(OUT_QUEUE);
        std::thread::Builder::new()
            .name("stdout".into())
            .spawn(move || {
                let mut w = BufWriter::with_capacity(128 * 1024, std::io::stdout().lock());
                while let Ok(frame) = rx.recv() {
                    let mut ok = w.write_all(&frame).is_ok();
                    while ok && let Ok(more) = rx.try_recv() {
                        ok = w.write_all(&more).is_ok();
                    }
                    if !ok || w.flush().is_err() {
                        // The client is gone; nothing more can be said.
                        std::process::exit(0);
                    }
                }
            })
            .map_err(|e| eprintln!("daiv-sandbox-helper: {e}"))
            .ok();
        Out { tx }
    }

    pub(super) fn frame(&self, id: u32, kind: u8, payload: &[u8]) {
        let mut buf = Vec::new();
        encode(id, kind, payload, &mut buf);
        let _ = self.tx.send(buf);
    }

    pub(super) fn event(&self, id: u32, event: &Event) {
        let mut buf = Vec::new();
        encode_json(id, kind::EVENT, event, &mut buf);
        let _ = self.tx.send(buf);
    }

    /// Sends a response, replaced by an `io` error when it would exceed the frame limit.
    pub(super) fn response(&self, id: u32, response: &Response) {
        let payload = serde_json::to_vec(response).unwrap_or_else(|_| b"{}".to_vec());
        if payload.len() > MAX_PAYLOAD {
            let too_big = Response::error(
                ErrorKind::Io,
                format!(
                    "the response is {} bytes, over the {MAX_PAYLOAD}-byte frame limit: narrow the request",
                    payload.len()
                ),
            );
            let mut buf = Vec::new();
            encode_json(id, kind::RESPONSE, &too_big, &mut buf);
            let _ = self.tx.send(buf);
            return;
        }
        self.frame(id, kind::RESPONSE, &payload);
    }
}
