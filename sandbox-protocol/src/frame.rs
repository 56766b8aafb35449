//! Frames: the envelope of every message either way (`len | id | kind | payload`, see the crate
//! docs). No I/O dependencies: [`FrameDecoder`] serves async readers (the control plane's),
//! [`read_frame`] blocking ones (the helper's, the supervisor's).

use std::fmt;
use std::io::{self, Read};

use serde::Serialize;

/// Largest payload of one frame, either way; a larger frame is a protocol error.
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;
/// Largest command-output payload the helper puts in one DATA frame.
pub const MAX_DATA_CHUNK: usize = 64 * 1024;
/// Largest DATA payload of a `connect`, either way (protocol 7): fewer frames for bulk
/// transfers through a sandbox's port.
pub const RELAY_CHUNK: usize = 256 * 1024;
/// Bytes before the payload: `len: u32`, `id: u32`, `kind: u8`.
pub const HEADER_LEN: usize = 9;

/// Frame kinds.
pub mod kind {
    /// client→helper: JSON [`Request`](crate::message::Request); starts request `id`.
    pub const REQUEST: u8 = 1;
    /// Both ways: raw bytes (request input, or the running command's output).
    pub const DATA: u8 = 2;
    /// client→helper, empty: end of the request's input.
    pub const EOF: u8 = 3;
    /// client→helper, empty: abandon the request.
    pub const CANCEL: u8 = 4;
    /// helper→client: JSON [`Event`](crate::message::Event).
    pub const EVENT: u8 = 5;
    /// helper→client: JSON [`Response`](crate::message::Response), the request's last frame.
    pub const RESPONSE: u8 = 6;
    /// helper→client: raw bytes the running command wrote to its stderr, in a `run` that asked
    /// for its streams apart (protocol 4); its stdout stays DATA.
    pub const STDERR: u8 = 7;
    /// Both ways, a `connect`'s (protocol 7): four bytes, big-endian, of DATA the sender may
    /// now send more. helper→client EOF (kind 3) ends the connection's read side.
    pub const WINDOW: u8 = 8;
}

/// A WINDOW frame's payload.
pub fn window_payload(bytes: u32) -> [u8; 4] {
    bytes.to_be_bytes()
}

/// The bytes a WINDOW frame grants; `None` for a payload that is not four bytes.
pub fn window_bytes(payload: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(payload.try_into().ok()?))
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub id: u32,
    pub kind: u8,
    pub payload: Vec<u8>,
}

/// The byte stream is not a valid frame sequence: the channel cannot be trusted any more.
#[derive(Debug)]
pub enum ProtocolError {
    /// `len` below 5 (no room for `id` and `kind`).
    ShortFrame(u32),
    /// Payload over [`MAX_PAYLOAD`].
    Oversize(usize),
    /// The stream ended inside a frame.
    Truncated,
    Io(io::Error),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ShortFrame(len) => write!(f, "frame length {len} is below 5"),
            Self::Oversize(n) => write!(
                f,
                "frame payload of {n} bytes exceeds the {MAX_PAYLOAD}-byte limit"
            ),
            Self::Truncated => write!(f, "the stream ended inside a frame"),
            Self::Io(e) => write!(f, "reading frames failed: {e}"),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Appends one frame to `out`. The caller keeps `payload` within [`MAX_PAYLOAD`].
pub fn encode(id: u32, kind: u8, payload: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(payload.len() + 5).unwrap_or(u32::MAX);
    out.reserve(HEADER_LEN + payload.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&id.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
}

/// Serialises `msg` as a JSON frame of `kind`.
pub fn encode_json<T: Serialize>(id: u32, kind: u8, msg: &T, out: &mut Vec<u8>) {
    // Serialising these plain types cannot fail; an empty object keeps the frame well-formed.
    let payload = serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec());
    encode(id, kind, &payload, out);
}

/// Checks a header's `len` field, returning the payload length.
fn payload_len(header: &[u8; 4]) -> Result<usize, ProtocolError> {
    let len = u32::from_be_bytes(*header);
    if len < 5 {
        return Err(ProtocolError::ShortFrame(len));
    }
    let n = len as usize - 5;
    if n > MAX_PAYLOAD {
        return Err(ProtocolError::Oversize(n));
    }
    Ok(n)
}

fn split_header(h: &[u8]) -> (u32, u8) {
    let id = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    (id, h[8])
}

/// Incremental decoder: feed it whatever the transport delivered, take complete frames out.
/// An oversize length is rejected as soon as its 4 bytes arrive, before any payload is buffered.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    start: usize,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Buffers `bytes` (any split, down to one byte at a time).
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 64 * 1024 && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `None` until one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtocolError> {
        let avail = &self.buf[self.start..];
        if avail.len() < 4 {
            return Ok(None);
        }
        let n = payload_len(&[avail[0], avail[1], avail[2], avail[3]])?;
        if avail.len() < HEADER_LEN + n {
            return Ok(None);
        }
        let (id, kind) = split_header(&avail[..HEADER_LEN]);
        let payload = avail[HEADER_LEN..HEADER_LEN + n].to_vec();
        self.start += HEADER_LEN + n;
        Ok(Some(Frame { id, kind, payload }))
    }

    /// Bytes buffered but not yet returned as frames (nonzero at end of stream = truncated).
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// Reads one frame; `Ok(None)` on a clean end of stream (between frames).
pub fn read_frame(r: &mut impl Read) -> Result<Option<Frame>, ProtocolError> {
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ProtocolError::Truncated),
            Ok(n) => {
                got += n;
                if got >= 4 {
                    payload_len(&[header[0], header[1], header[2], header[3]])?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ProtocolError::Io(e)),
        }
    }
    let n = payload_len(&[header[0], header[1], header[2], header[3]])?;
    let (id, kind) = split_header(&header);
    let mut payload = vec![0u8; n];
    r.read_exact(&mut payload).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ProtocolError::Truncated
        } else {
            ProtocolError::Io(e)
        }
    })?;
    Ok(Some(Frame { id, kind, payload }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn frames(stream: &[u8], step: usize) -> Vec<Frame> {
        let mut d = FrameDecoder::new();
        let mut out = Vec::new();
        for chunk in stream.chunks(step) {
            d.push(chunk);
            while let Some(f) = d.next_frame().unwrap() {
                out.push(f);
            }
        }
        assert_eq!(d.pending(), 0);
        out
    }

    #[test]
    fn frames_round_trip_split_byte_by_byte() {
        let mut s = Vec::new();
        encode(7, kind::REQUEST, br#"{"op":"ping"}"#, &mut s);
        encode(8, kind::EOF, b"", &mut s);
        encode(u32::MAX, kind::DATA, &vec![0xab; 70_000], &mut s);
        assert_eq!(&s[..9], &[0, 0, 0, 18, 0, 0, 0, 7, 1]);
        for step in [1, 3, 9, 4096, s.len()] {
            let f = frames(&s, step);
            assert_eq!(f.len(), 3);
            assert_eq!(
                (f[0].id, f[0].kind, &f[0].payload[..]),
                (7, 1, &br#"{"op":"ping"}"#[..])
            );
            assert_eq!((f[1].id, f[1].kind, f[1].payload.len()), (8, 3, 0));
            assert_eq!((f[2].id, f[2].payload.len()), (u32::MAX, 70_000));
        }
        let mut r = &s[..];
        assert_eq!(read_frame(&mut r).unwrap().unwrap().id, 7);
        assert_eq!(read_frame(&mut r).unwrap().unwrap().id, 8);
        assert_eq!(read_frame(&mut r).unwrap().unwrap().id, u32::MAX);
        assert!(read_frame(&mut r).unwrap().is_none());
    }

    #[test]
    fn oversize_and_short_frames_are_rejected_early() {
        let len = (MAX_PAYLOAD as u32 + 6).to_be_bytes();
        let mut d = FrameDecoder::new();
        d.push(&len);
        assert!(matches!(d.next_frame(), Err(ProtocolError::Oversize(_))));
        assert!(matches!(
            read_frame(&mut &len[..]),
            Err(ProtocolError::Oversize(_))
        ));
        // Exactly the limit is fine.
        let mut s = Vec::new();
        encode(1, kind::DATA, &vec![0; MAX_PAYLOAD], &mut s);
        assert_eq!(frames(&s, 1 << 16)[0].payload.len(), MAX_PAYLOAD);
        let mut d = FrameDecoder::new();
        d.push(&[0, 0, 0, 4, 0, 0, 0, 1]);
        assert!(matches!(d.next_frame(), Err(ProtocolError::ShortFrame(4))));
        assert!(matches!(
            read_frame(&mut &s[..100]),
            Err(ProtocolError::Truncated)
        ));
    }
}
