//! The data plane's raw file calls on a session's channel: a read streamed out of the helper a
//! frame at a time (the request's bounded inbox is the only buffer: the control plane holds at
//! most 64 frames of 64 KiB per read, whatever the file's size), and a write streamed in (the
//! channel's bounded outbox the only buffer).

use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use sandbox_protocol::files::FileAnswer;
use sandbox_protocol::frame::MAX_DATA_CHUNK;
use sandbox_protocol::message::{ByteRange, Event, Request};
use tokio::sync::mpsc;

use super::channel::{Caps, Incoming, RequestHandle};
use super::helper::HelperRuntime;
use super::{EXTRACT_STALL, HelperError};

/// A raw read under way: the file's size, the part that follows, and its bytes. The stream ends
/// with an error if the helper stopped before `length` bytes (the HTTP body is then cut short);
/// dropping it cancels the read in the helper.
pub struct FileStream {
    pub size: u64,
    pub start: u64,
    pub length: u64,
    pub body: BoxStream<'static, std::io::Result<Bytes>>,
}

/// What a raw read found: its stream, or the fs-level refusal (`not_found`, `invalid_range`, ...).
pub enum FileRead {
    Stream(FileStream),
    Refused(sandbox_protocol::wire::FsError),
}

/// How long a download's client may stop reading (with every buffer on the way full) before the
/// download is cut: meanwhile the session's other requests wait, as they share its channel.
const DOWNLOAD_STALL: std::time::Duration = std::time::Duration::from_secs(30);

fn io_error(what: &str) -> std::io::Error {
    std::io::Error::other(what.to_string())
}

impl HelperRuntime {
    pub(super) async fn read_file(
        &self,
        id: &str,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<FileRead, HelperError> {
        let chan = self.channel(id).await?;
        let request = Request::FileRead {
            path: path.to_string(),
            range,
        };
        let caps = Caps {
            data: MAX_DATA_CHUNK,
            response: Caps::SMALL.response,
        };
        // A client that stops reading must not hold up the session's other requests.
        let mut h = chan
            .request_abandoned_after(&request, caps, Some(DOWNLOAD_STALL))
            .await
            .map_err(|_| HelperError::Lost)?;
        let first = tokio::time::timeout(EXTRACT_STALL, h.recv())
            .await
            .map_err(|_| HelperError::NoAnswer)?
            .map_err(|_| HelperError::Lost)?;
        match first {
            Incoming::Event(Event::File {
                size,
                start,
                length,
            }) => Ok(FileRead::Stream(FileStream {
                size,
                start,
                length,
                body: body(h, length),
            })),
            Incoming::Response(payload) => {
                let answer: FileAnswer = parse(&h, &payload)?;
                match answer.error {
                    Some(e) => Ok(FileRead::Refused(e)),
                    None => Err(HelperError::UnexpectedAnswer),
                }
            }
            _ => {
                h.channel().condemn(super::channel::Violation::BadAnswer);
                Err(HelperError::UnexpectedAnswer)
            }
        }
    }

    pub(super) async fn write_file(
        &self,
        id: &str,
        request: Request,
        mut body: mpsc::Receiver<std::io::Result<Bytes>>,
    ) -> Result<FileAnswer, HelperError> {
        let chan = self.channel(id).await?;
        let mut h = chan
            .request(&request, Caps::SMALL)
            .await
            .map_err(|_| HelperError::Lost)?;
        while let Some(chunk) = body.recv().await {
            // The producer failed (the body was over the cap, the client left): dropping the
            // handle cancels the write and the helper removes its temporary file.
            let Ok(chunk) = chunk else {
                return Err(HelperError::ArchiveRefused);
            };
            match tokio::time::timeout(EXTRACT_STALL, h.send_data(&chunk)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(HelperError::Lost),
                Err(_) => return Err(HelperError::NoAnswer),
            }
        }
        h.send_eof().await.map_err(|_| HelperError::Lost)?;
        loop {
            let msg = tokio::time::timeout(EXTRACT_STALL, h.recv())
                .await
                .map_err(|_| HelperError::NoAnswer)?
                .map_err(|_| HelperError::Lost)?;
            if let Incoming::Response(payload) = msg {
                return parse(&h, &payload);
            }
        }
    }
}

/// A RESPONSE of a raw file op as its [`FileAnswer`]; anything else condemns the channel.
pub(super) fn parse(h: &RequestHandle, payload: &[u8]) -> Result<FileAnswer, HelperError> {
    use sandbox_protocol::message::Response;
    match serde_json::from_slice::<Response<FileAnswer>>(payload) {
        Ok(Response::Ok(a)) => Ok(a),
        Ok(Response::Error(e)) => {
            tracing::warn!(kind = ?e.kind, message = %e.message, "session helper error");
            Err(match e.kind {
                sandbox_protocol::message::ErrorKind::BadRequest => {
                    HelperError::Rejected(e.message)
                }
                _ => HelperError::Failed,
            })
        }
        Err(_) => {
            h.channel().condemn(super::channel::Violation::BadAnswer);
            Err(HelperError::UnexpectedAnswer)
        }
    }
}

/// The DATA frames of a read as a byte stream: exactly `length` bytes, then the answer.
fn body(h: RequestHandle, length: u64) -> BoxStream<'static, std::io::Result<Bytes>> {
    let h = Arc::new(tokio::sync::Mutex::new(h));
    Box::pin(futures::stream::unfold(
        (h, 0u64, false),
        move |(h, got, done)| async move {
            if done {
                return None;
            }
            let mut guard = h.lock().await;
            loop {
                let msg = match tokio::time::timeout(EXTRACT_STALL, guard.recv()).await {
                    Ok(Ok(m)) => m,
                    Ok(Err(_)) => {
                        drop(guard);
                        return Some((
                            Err(io_error("the session's helper went away")),
                            (h, got, true),
                        ));
                    }
                    Err(_) => {
                        drop(guard);
                        return Some((
                            Err(io_error("the session's helper stalled")),
                            (h, got, true),
                        ));
                    }
                };
                match msg {
                    Incoming::Data(d) => {
                        let got = got + d.len() as u64;
                        if got > length {
                            guard
                                .channel()
                                .condemn(super::channel::Violation::BadAnswer);
                            drop(guard);
                            return Some((
                                Err(io_error("more bytes than announced")),
                                (h, got, true),
                            ));
                        }
                        drop(guard);
                        return Some((Ok(d), (h, got, false)));
                    }
                    Incoming::Response(payload) => {
                        let answer = parse(&guard, &payload);
                        drop(guard);
                        return match answer {
                            Ok(a) if a.error.is_none() && got == length => None,
                            // Stopped early (the file shrank, the op failed): cut the body.
                            _ => Some((Err(io_error("the file ended early")), (h, got, true))),
                        };
                    }
                    Incoming::Event(_)
                    | Incoming::Stderr(_)
                    | Incoming::Eof
                    | Incoming::Window(_) => {}
                }
            }
        },
    ))
}
