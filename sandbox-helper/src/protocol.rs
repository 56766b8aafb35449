//! Frames and messages of the helper protocol (version [`VERSION`]); the crate docs describe it
//! in full. No I/O dependencies: [`FrameDecoder`] serves async readers, [`read_frame`] blocking
//! ones, and both sides share these types so they cannot drift apart.

use std::fmt;
use std::io::{self, Read};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Protocol version announced in the `ready` event.
pub const VERSION: u32 = 1;
/// Largest payload of one frame, either way; a larger frame is a protocol error.
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;
/// Largest command-output payload the helper puts in one DATA frame.
pub const MAX_DATA_CHUNK: usize = 64 * 1024;
/// Bytes before the payload: `len: u32`, `id: u32`, `kind: u8`.
pub const HEADER_LEN: usize = 9;
/// Default `deadline_ms` of fs requests.
pub const DEFAULT_DEADLINE_MS: u64 = 30_000;

/// Frame kinds.
pub mod kind {
    /// client→helper: JSON [`super::Request`]; starts request `id`.
    pub const REQUEST: u8 = 1;
    /// Both ways: raw bytes (request input, or the running command's output).
    pub const DATA: u8 = 2;
    /// client→helper, empty: end of the request's input.
    pub const EOF: u8 = 3;
    /// client→helper, empty: abandon the request.
    pub const CANCEL: u8 = 4;
    /// helper→client: JSON [`super::Event`].
    pub const EVENT: u8 = 5;
    /// helper→client: JSON [`super::Response`], the request's last frame.
    pub const RESPONSE: u8 = 6;
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

// === messages ===

fn default_deadline() -> u64 {
    DEFAULT_DEADLINE_MS
}

fn default_limit() -> u64 {
    2000
}

fn default_mode() -> u32 {
    0o644
}

fn default_output_cap() -> u64 {
    16 * 1024 * 1024
}

fn default_workdir() -> String {
    crate::layout::REPO.to_string()
}

/// A REQUEST frame's payload. Paths are wire paths (`/workspace/...`), validated again by the
/// helper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Ping,
    /// Whether the session was seeded: the root-owned [`SEED_MARKER`](crate::layout::SEED_MARKER)
    /// exists (the one path outside the workspace the helper looks at). Answers [`SeededInfo`].
    Seeded,
    Run {
        commands: Vec<String>,
        #[serde(default)]
        fail_fast: bool,
        /// Per command, from its start; `null` or 0: no limit.
        #[serde(default)]
        timeout_ms: Option<u64>,
        /// Output bytes sent per command; the rest is only counted (`omitted`).
        #[serde(default = "default_output_cap")]
        output_cap: u64,
        #[serde(default = "default_workdir")]
        workdir: String,
        /// Overrides on top of the helper's own environment.
        #[serde(default)]
        env: Vec<(String, String)>,
    },
    Ls {
        path: String,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    Read {
        path: String,
        #[serde(default)]
        offset: u64,
        #[serde(default = "default_limit")]
        limit: u64,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    Grep {
        pattern: String,
        path: String,
        #[serde(default)]
        glob: Option<String>,
        /// Directory basename globs pruned at any depth (server list + request `exclude`).
        #[serde(default)]
        prune: Vec<String>,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    Glob {
        pattern: String,
        path: String,
        #[serde(default)]
        prune: Vec<String>,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    /// Content follows as DATA frames, then EOF.
    Write {
        path: String,
        #[serde(default = "default_mode")]
        mode: u32,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    Edit {
        path: String,
        old: String,
        new: String,
        #[serde(default)]
        replace_all: bool,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    Delete {
        path: String,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    /// A sanitised tar stream follows as DATA frames, then EOF. No deadline unless given.
    Extract {
        dest: String,
        #[serde(default)]
        deadline_ms: Option<u64>,
    },
    /// Empties `dest` (keeps `dest` itself). No deadline unless given.
    Clear {
        dest: String,
        #[serde(default)]
        deadline_ms: Option<u64>,
    },
    /// A background process request, relayed to the container's supervisor
    /// (`ops::procs`). For `stdin`, the bytes follow as DATA frames, then EOF; a `poll`
    /// answers with one DATA frame of output before its RESPONSE.
    Proc {
        request: ProcRequest,
    },
}

/// A background-process request: what `serve` relays to the container's supervisor
/// (`ops::procs`), there answered on an abstract unix socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum ProcRequest {
    Start {
        command: String,
        /// Already a path the helper can use (serve maps `/workspace/...` under its root).
        workdir: String,
        #[serde(default)]
        env: Vec<(String, String)>,
        /// Live processes allowed at once; more is a `limit` error.
        max_live: u32,
        /// Output kept per process; older bytes are dropped.
        buffer_bytes: u64,
    },
    List,
    Poll {
        process_id: String,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        wait_ms: u64,
        max_bytes: u64,
    },
    /// The bytes follow as one DATA frame; `eof` closes the process's stdin afterwards.
    Stdin {
        process_id: String,
        #[serde(default)]
        eof: bool,
    },
    Kill {
        process_id: String,
    },
}

/// One process as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    pub process_id: String,
    pub command: String,
    pub running: bool,
    pub exit_code: Option<i64>,
}

/// A poll's answer; the output itself is the DATA frame before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollInfo {
    pub process_id: String,
    pub running: bool,
    pub exit_code: Option<i64>,
    /// Where the returned output starts (later than asked when older bytes were dropped).
    pub offset: u64,
    pub next_offset: u64,
    /// Bytes before `offset` were dropped from the buffer.
    pub truncated: bool,
}

/// Why a request produced no `ok` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request (JSON, kind, fields) is malformed.
    BadRequest,
    /// CANCEL arrived before the answer.
    Cancelled,
    /// `deadline_ms` passed.
    Deadline,
    /// The operation failed on the helper's side (I/O, response too large, ...).
    Io,
    /// A bug in the helper.
    Internal,
    /// The thing named (a background process) does not exist.
    NotFound,
    /// The request does not fit the target's state (stdin of a process that ended).
    Conflict,
    /// A per-session limit (live background processes) is reached.
    Limit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseError {
    pub kind: ErrorKind,
    pub message: String,
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for ResponseError {}

/// A RESPONSE frame's payload: `{"ok": value}` or `{"error": {"kind", "message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok(serde_json::Value),
    Error(ResponseError),
}

impl Response {
    /// `{"ok": value}`.
    pub fn ok<T: Serialize>(value: &T) -> Response {
        match serde_json::to_value(value) {
            Ok(v) => Response::Ok(v),
            Err(e) => Response::error(ErrorKind::Internal, format!("serialising: {e}")),
        }
    }

    /// `{"ok": {}}`.
    pub fn empty() -> Response {
        Response::Ok(serde_json::Value::Object(serde_json::Map::new()))
    }

    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Response {
        Response::Error(ResponseError {
            kind,
            message: message.into(),
        })
    }

    /// The `ok` value as `T`; an error response, or an `ok` not shaped like `T`, is an `Err`.
    pub fn into_result<T: DeserializeOwned>(self) -> Result<T, ResponseError> {
        match self {
            Response::Ok(v) => serde_json::from_value(v).map_err(|e| ResponseError {
                kind: ErrorKind::Internal,
                message: format!("unexpected ok value: {e}"),
            }),
            Response::Error(e) => Err(e),
        }
    }
}

/// An EVENT frame's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// Sent once on id 0 when the helper starts.
    Ready {
        protocol: u32,
        version: String,
        pid: u32,
    },
    /// Command `index` of a `run` began; DATA frames that follow are its output.
    Started { index: u32 },
    /// Command `index` ended.
    Finished {
        index: u32,
        /// Exit code, 128 + signal when killed, 124 on timeout, 127 without a shell.
        exit_code: i64,
        /// Output bytes over `output_cap`, counted but not sent.
        omitted: u64,
        timed_out: bool,
    },
}

/// The `ok` value of `extract`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtractStats {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Bytes of regular-file content written.
    pub bytes: u64,
    /// Members refused (a symlink or non-directory in the way, unsupported type, bad name).
    #[serde(default)]
    pub skipped: u64,
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

    #[test]
    fn messages_have_the_documented_json() {
        let r: Request = serde_json::from_str(
            r#"{"op":"run","commands":["true"],"fail_fast":true,"timeout_ms":null,"output_cap":5,"workdir":"/workspace/repo","env":[["A","b"]]}"#,
        )
        .unwrap();
        assert!(matches!(r, Request::Run { ref env, .. } if env == &[("A".into(), "b".into())]));
        let r: Request = serde_json::from_str(r#"{"op":"read","path":"/workspace/a"}"#).unwrap();
        assert_eq!(
            r,
            Request::Read {
                path: "/workspace/a".into(),
                offset: 0,
                limit: 2000,
                deadline_ms: 30_000
            }
        );
        assert_eq!(
            serde_json::to_string(&Response::empty()).unwrap(),
            r#"{"ok":{}}"#
        );
        assert_eq!(
            serde_json::to_string(&Response::error(ErrorKind::BadRequest, "x")).unwrap(),
            r#"{"error":{"kind":"bad_request","message":"x"}}"#
        );
        assert_eq!(
            serde_json::to_string(&Event::Finished {
                index: 1,
                exit_code: 2,
                omitted: 0,
                timed_out: false
            })
            .unwrap(),
            r#"{"type":"finished","index":1,"exit_code":2,"omitted":0,"timed_out":false}"#
        );
        let stats: ExtractStats = Response::ok(&ExtractStats {
            files: 1,
            ..Default::default()
        })
        .into_result()
        .unwrap();
        assert_eq!(stats.files, 1);
    }
}

/// The answer to [`Request::Seeded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeededInfo {
    pub seeded: bool,
}

/// Largest header line of `write-file`'s input.
pub const WRITE_HEADER_MAX: usize = 4096;

/// `write-file`'s input: this header as one JSON line, then exactly `len` bytes of content.
/// Input that ends before the content is complete writes nothing, so a writer opened ahead of
/// use (a warm-pool member's) and dropped unused never touches its file; nor does `write-file`
/// wait for the end of its input (a half-close the engine's attach stream may not carry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteHeader {
    pub len: u64,
    /// Appended to the command run after the write (a value known only when writing).
    #[serde(default)]
    pub args: Vec<String>,
}

impl WriteHeader {
    /// The header line and `content`, ready for `write-file`'s stdin.
    pub fn frame(content: &[u8], args: Vec<String>) -> Vec<u8> {
        let header = Self {
            len: content.len() as u64,
            args,
        };
        let mut out = serde_json::to_vec(&header).unwrap_or_default();
        out.push(b'\n');
        out.extend_from_slice(content);
        out
    }
}
