//! Bounds on what the multipart parser buffers before the seed handler sees a part.
//!
//! multer 3 keeps everything between a part's boundary line and the blank line (CRLFCRLF) that
//! ends its headers in memory until that line arrives, and everything before the first boundary
//! until the boundary arrives: a body that sends neither grows the service's memory with it.
//! [`Guarded`] sits between the request body and the parser, follows the body with the grammar
//! multer uses (the first `--boundary` anywhere; then `--` ends the body, or optional spaces and
//! tabs and a CRLF open a part; its headers run to the first CRLFCRLF; its data to the next
//! CRLF `--boundary`), and fails the stream when more than [`PART_HEADERS_MAX`] bytes pass
//! before the first boundary or in one part's header block, or when a body opens more than
//! [`MAX_PARTS`] parts. multer then reports a stream error; the [`Tripwire`] says why.
//! Part data and whatever follows the closing boundary pass untouched.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::{Stream, StreamExt};

/// Most bytes of one part's header block (boundary line to CRLFCRLF), and of the preamble.
pub const PART_HEADERS_MAX: usize = 16 * 1024;

/// Most parts in one body.
pub const MAX_PARTS: usize = 64;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A bound the body went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("multipart part headers exceed {PART_HEADERS_MAX} bytes")]
    PartHeaders,
    #[error("multipart body has more than {PART_HEADERS_MAX} bytes before its first boundary")]
    Preamble,
    #[error("multipart body has more than {MAX_PARTS} parts")]
    TooManyParts,
}

/// Set when a [`Guarded`] stream refused its body; shared with whoever handles the parser's error.
#[derive(Debug, Clone, Default)]
pub struct Tripwire(Arc<OnceLock<Violation>>);

impl Tripwire {
    pub fn get(&self) -> Option<Violation> {
        self.0.get().copied()
    }
}

/// A body stream that fails once the body goes over a bound (see the module docs).
pub struct Guarded<S> {
    inner: S,
    scanner: Scanner,
    tripwire: Tripwire,
}

impl<S> Guarded<S> {
    pub fn new(inner: S, boundary: &str, tripwire: Tripwire) -> Self {
        Self {
            inner,
            scanner: Scanner::new(boundary),
            tripwire,
        }
    }
}

impl<S, E> Stream for Guarded<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: Into<BoxError>,
{
    type Item = Result<Bytes, BoxError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(v) = this.tripwire.get() {
            return Poll::Ready(Some(Err(Box::new(v))));
        }
        match this.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(chunk))) => match this.scanner.feed(&chunk) {
                Ok(()) => Poll::Ready(Some(Ok(chunk))),
                Err(v) => {
                    let _ = this.tripwire.0.set(v);
                    Poll::Ready(Some(Err(Box::new(v))))
                }
            },
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Finds a fixed pattern in a byte stream fed one byte at a time (Knuth–Morris–Pratt, so a
/// pattern split across chunks, or overlapping itself, is found where `memmem` would find it).
#[derive(Debug)]
struct Matcher {
    pattern: Vec<u8>,
    /// `fail[i]`: length of the longest proper prefix of `pattern[..=i]` that is also its suffix.
    fail: Vec<usize>,
    matched: usize,
}

impl Matcher {
    fn new(pattern: &[u8]) -> Self {
        let mut fail = vec![0; pattern.len()];
        let mut k = 0;
        for i in 1..pattern.len() {
            while k > 0 && pattern[i] != pattern[k] {
                k = fail[k - 1];
            }
            if pattern[i] == pattern[k] {
                k += 1;
            }
            fail[i] = k;
        }
        Self {
            pattern: pattern.to_vec(),
            fail,
            matched: 0,
        }
    }

    /// Whether `b` completes the pattern; the search then starts afresh.
    fn push(&mut self, b: u8) -> bool {
        while self.matched > 0 && self.pattern[self.matched] != b {
            self.matched = self.fail[self.matched - 1];
        }
        if self.pattern[self.matched] == b {
            self.matched += 1;
        }
        if self.matched == self.pattern.len() {
            self.matched = 0;
            return true;
        }
        false
    }
}

/// Where the body is, in multer's grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before the first `--boundary`; `n` bytes so far.
    Preamble { n: usize },
    /// Right after a `--boundary`: `--` closes the body, anything else opens a part. `dash`: one
    /// `-` seen.
    Delimiter { n: usize, dash: bool },
    /// Spaces and tabs after a boundary (multer's transport padding); `cr`: the CR of the CRLF
    /// that must follow seen.
    Padding { n: usize, cr: bool },
    /// Inside a part's header block.
    Headers { n: usize },
    /// Inside a part's data.
    Data,
    /// After something multer refuses (it fails the body there): still bounded, in case it
    /// read on.
    Malformed { n: usize },
    /// After the closing boundary: multer reads no further.
    Closed,
}

/// The body's position and the bounds' counters.
#[derive(Debug)]
struct Scanner {
    at: At,
    /// `--boundary`: the first delimiter.
    first: Matcher,
    /// CRLF `--boundary`: every later one.
    next: Matcher,
    /// CRLFCRLF: the end of a header block.
    blank: Matcher,
    parts: usize,
}

impl Scanner {
    fn new(boundary: &str) -> Self {
        Self {
            at: At::Preamble { n: 0 },
            first: Matcher::new(format!("--{boundary}").as_bytes()),
            next: Matcher::new(format!("\r\n--{boundary}").as_bytes()),
            blank: Matcher::new(b"\r\n\r\n"),
            parts: 0,
        }
    }

    fn feed(&mut self, chunk: &[u8]) -> Result<(), Violation> {
        let mut i = 0;
        while i < chunk.len() {
            if self.at == At::Closed {
                return Ok(());
            }
            if self.at == At::Data && self.next.matched == 0 {
                // Fast path through part data: nothing can start a delimiter before a CR.
                match chunk[i..].iter().position(|b| *b == b'\r') {
                    Some(p) => i += p,
                    None => return Ok(()),
                }
            }
            self.step(chunk[i])?;
            i += 1;
        }
        Ok(())
    }

    fn step(&mut self, b: u8) -> Result<(), Violation> {
        let header_byte = |n: usize| {
            if n + 1 > PART_HEADERS_MAX {
                Err(Violation::PartHeaders)
            } else {
                Ok(n + 1)
            }
        };
        self.at = match self.at {
            At::Preamble { n } => {
                if self.first.push(b) {
                    At::Delimiter { n: 0, dash: false }
                } else if n + 1 > PART_HEADERS_MAX {
                    return Err(Violation::Preamble);
                } else {
                    At::Preamble { n: n + 1 }
                }
            }
            At::Delimiter { n, dash: false } => {
                let n = header_byte(n)?;
                match b {
                    b'-' => At::Delimiter { n, dash: true },
                    b' ' | b'\t' => At::Padding { n, cr: false },
                    b'\r' => At::Padding { n, cr: true },
                    _ => At::Malformed { n },
                }
            }
            At::Delimiter { n, dash: true } => {
                if b == b'-' {
                    At::Closed
                } else {
                    At::Malformed { n: header_byte(n)? }
                }
            }
            At::Padding { n, cr } => {
                let n = header_byte(n)?;
                match (cr, b) {
                    (false, b' ' | b'\t') => At::Padding { n, cr: false },
                    (false, b'\r') => At::Padding { n, cr: true },
                    (true, b'\n') => {
                        self.parts += 1;
                        if self.parts > MAX_PARTS {
                            return Err(Violation::TooManyParts);
                        }
                        At::Headers { n }
                    }
                    _ => At::Malformed { n },
                }
            }
            At::Headers { n } => {
                let n = header_byte(n)?;
                if self.blank.push(b) {
                    At::Data
                } else {
                    At::Headers { n }
                }
            }
            At::Data => {
                if self.next.push(b) {
                    At::Delimiter { n: 0, dash: false }
                } else {
                    At::Data
                }
            }
            At::Malformed { n } => At::Malformed { n: header_byte(n)? },
            At::Closed => At::Closed,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: &str = "XyZboundary";

    fn part(name: &str, extra_headers: &str, data: &[u8]) -> Vec<u8> {
        let mut v = format!(
            "--{B}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"a.tar\"\r\n{extra_headers}Content-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        v.extend_from_slice(data);
        v.extend_from_slice(b"\r\n");
        v
    }

    fn multipart_body(parts: &[Vec<u8>]) -> Vec<u8> {
        let mut v = b"preamble text\r\n".to_vec();
        for p in parts {
            v.extend_from_slice(p);
        }
        v.extend_from_slice(format!("--{B}--\r\nepilogue").as_bytes());
        v
    }

    /// Parses `body`, fed in chunks of `chunk` bytes, through the guard and multer: the fields'
    /// names and data, and the bytes the guard passed on.
    async fn parse(
        body: &[u8],
        chunk: usize,
    ) -> (Result<Vec<(String, Vec<u8>)>, String>, Vec<u8>, Tripwire) {
        let chunks: Vec<Result<Bytes, std::io::Error>> = body
            .chunks(chunk)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let tripwire = Tripwire::default();
        let guarded = Guarded::new(futures::stream::iter(chunks), B, tripwire.clone());
        let tap = seen.clone();
        let stream = guarded.inspect(move |item| {
            if let (Ok(bytes), Ok(mut seen)) = (item, tap.lock()) {
                seen.extend_from_slice(bytes);
            }
        });
        let mut mp = multer::Multipart::new(stream, B);
        let result = async {
            let mut fields = Vec::new();
            while let Some(mut f) = mp.next_field().await.map_err(|e| e.to_string())? {
                let name = f.name().unwrap_or_default().to_string();
                let mut data = Vec::new();
                while let Some(c) = f.chunk().await.map_err(|e| e.to_string())? {
                    data.extend_from_slice(&c);
                }
                fields.push((name, data));
            }
            Ok(fields)
        }
        .await;
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        (result, seen, tripwire)
    }

    fn tricky_data() -> Vec<u8> {
        // Data that looks like delimiters and header ends without being one.
        let mut d = b"\r\n--XyZboundarX\r\n\r\n\r\n-\r\n--XyZ\r\r\n--\r\n-".to_vec();
        d.extend((0..=255u8).cycle().take(3000));
        d
    }

    #[tokio::test]
    async fn normal_bodies_pass_untouched_at_any_chunking() {
        let body = multipart_body(&[
            part("repo_archive", "", &tricky_data()),
            part("skills_archive", "X-Other: 1\r\n", b""),
            part("x", "", b"--XyZboundar"),
        ]);
        for chunk in [1, 2, 3, 7, 64, 1000, body.len()] {
            let (fields, seen, trip) = parse(&body, chunk).await;
            let fields = fields.unwrap_or_else(|e| panic!("chunk {chunk}: {e}"));
            assert_eq!(seen, body, "chunk {chunk}");
            assert_eq!(trip.get(), None);
            let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                ["repo_archive", "skills_archive", "x"],
                "chunk {chunk}"
            );
            assert_eq!(fields[0].1, tricky_data());
            assert_eq!(fields[2].1, b"--XyZboundar");
        }
    }

    #[tokio::test]
    async fn headers_up_to_the_limit_and_transport_padding_are_accepted() {
        // A header block of exactly PART_HEADERS_MAX bytes after the boundary, counting the
        // boundary line's CRLF and the blank line.
        let fixed = "\r\nContent-Disposition: form-data; name=\"a\"\r\nX-Pad: \r\n\r\n".len();
        let pad = "p".repeat(PART_HEADERS_MAX - fixed);
        let mut body = format!(
            "--{B}\r\nContent-Disposition: form-data; name=\"a\"\r\nX-Pad: {pad}\r\n\r\nhi\r\n"
        )
        .into_bytes();
        body.extend_from_slice(
            format!("--{B} \t \r\nContent-Disposition: form-data; name=\"b\"\r\n\r\nyo\r\n--{B}--")
                .as_bytes(),
        );
        let (fields, _, trip) = parse(&body, 5).await;
        assert_eq!(trip.get(), None, "{fields:?}");
        let fields = fields.unwrap_or_default();
        assert_eq!(fields.len(), 2);
        assert_eq!(fields[0].1, b"hi");
        assert_eq!(fields[1].1, b"yo");
        // One byte more is refused.
        let body = String::from_utf8_lossy(&body).replacen("X-Pad: ", "X-Pad: p", 1);
        let (fields, _, trip) = parse(body.as_bytes(), 5).await;
        assert!(fields.is_err());
        assert_eq!(trip.get(), Some(Violation::PartHeaders));
    }

    #[tokio::test]
    async fn endless_part_headers_are_refused_at_any_chunking() {
        let mut body = part("repo_archive", "", b"ok");
        body.extend_from_slice(format!("--{B}\r\nX-Endless: ").as_bytes());
        body.extend(std::iter::repeat_n(b'a', 200_000));
        for chunk in [1, 3, 4096, body.len()] {
            let (fields, seen, trip) = parse(&body, chunk).await;
            assert!(fields.is_err(), "chunk {chunk}: {fields:?}");
            assert_eq!(trip.get(), Some(Violation::PartHeaders), "chunk {chunk}");
            assert!(
                seen.len() <= 2 * PART_HEADERS_MAX + 200,
                "chunk {chunk}: {} bytes passed",
                seen.len()
            );
        }
        // Header lines that never end in a blank line are refused too.
        let mut body = format!("--{B}\r\n").into_bytes();
        for _ in 0..10_000 {
            body.extend_from_slice(b"X-A: b\r\n");
        }
        let (_, _, trip) = parse(&body, 1).await;
        assert_eq!(trip.get(), Some(Violation::PartHeaders));
        // After a malformed delimiter, multer stops; should it read on, that is bounded too.
        let mut s = Scanner::new(B);
        let mut body = format!("--{B}x").into_bytes();
        body.extend(std::iter::repeat_n(b'a', PART_HEADERS_MAX));
        assert_eq!(s.feed(&body), Err(Violation::PartHeaders));
    }

    #[tokio::test]
    async fn preamble_and_part_count_are_bounded() {
        let body = vec![b'a'; PART_HEADERS_MAX + 1];
        let (fields, _, trip) = parse(&body, 100).await;
        assert!(fields.is_err());
        assert_eq!(trip.get(), Some(Violation::Preamble));
        let many: Vec<Vec<u8>> = (0..MAX_PARTS)
            .map(|i| part(&format!("f{i}"), "", b"x"))
            .collect();
        let (fields, _, trip) = parse(&multipart_body(&many), 13).await;
        assert_eq!(trip.get(), None);
        assert_eq!(fields.map(|f| f.len()), Ok(MAX_PARTS));
        let many: Vec<Vec<u8>> = (0..=MAX_PARTS)
            .map(|i| part(&format!("f{i}"), "", b"x"))
            .collect();
        let (fields, _, trip) = parse(&multipart_body(&many), 13).await;
        assert!(fields.is_err());
        assert_eq!(trip.get(), Some(Violation::TooManyParts));
    }

    #[test]
    fn the_matcher_finds_overlapping_and_split_patterns() {
        let mut m = Matcher::new(b"--ab--abc");
        let hay = b"---ab--ab--abc";
        let hits: Vec<usize> = hay
            .iter()
            .enumerate()
            .filter_map(|(i, b)| m.push(*b).then_some(i))
            .collect();
        assert_eq!(hits, [13]);
    }
}
