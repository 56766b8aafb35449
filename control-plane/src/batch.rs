//! Running a request's commands in one `docker exec`: a small POSIX `sh` driver runs them in
//! order and frames each command's output with markers, and [`BatchParser`] splits the stream
//! back into per-command results.
//!
//! Docker round trips, not bytes, dominate command latency: one exec costs create + start
//! (+ inspect), so ten commands in ten execs cost ten times that. The driver makes a request cost
//! one exec whatever its length.
//!
//! Framing: the driver prints its pid first (it leads the exec's process group, which a timeout
//! kills whole), then `\x1e<nonce>:B\n` before and `\x1e<nonce>:E:<rc>\n` after each command.
//! The nonce is random per request, so ordinary output cannot end a command early; a command that
//! goes out of its way to forge markers only confuses its own results.

/// The driver. Arguments: nonce, fail-fast flag (1/0), then the commands. stderr is merged into
/// stdout so the output interleaves as produced; bash with pipefail where the image has bash,
/// else sh with pipefail where the shell knows it (busybox does, dash does not).
pub const DRIVER: &str = r#"n=$1; ff=$2; shift 2
echo "$$"
exec 2>&1
if command -v bash >/dev/null 2>&1; then r=bash
elif (set -o pipefail) 2>/dev/null; then r=shpf
else r=sh; fi
for c in "$@"; do
  printf '\036%s:B\n' "$n"
  case $r in
    bash) bash -o pipefail -c "$c" ;;
    shpf) sh -o pipefail -c "$c" ;;
    *) sh -c "$c" ;;
  esac
  rc=$?
  printf '\036%s:E:%d\n' "$n" "$rc"
  if [ "$ff" = 1 ] && [ "$rc" -ne 0 ]; then exit 0; fi
done"#;

/// Upper bound on the argument bytes of one exec: the kernel's limit on a single argument
/// string is 128 KiB and the whole argv ~2 MiB; longer batches are split across execs.
pub const MAX_BATCH_BYTES: usize = 96 * 1024;

/// Splits commands into batches that fit one exec's arguments (a single larger command still
/// gets a batch of its own, and the kernel decides).
pub fn batches(commands: &[String]) -> Vec<&[String]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = 0;
    for (i, c) in commands.iter().enumerate() {
        if i > start && size + c.len() > MAX_BATCH_BYTES {
            out.push(&commands[start..i]);
            start = i;
            size = 0;
        }
        size += c.len() + 1;
    }
    if start < commands.len() {
        out.push(&commands[start..]);
    }
    out
}

/// What the stream said happened.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// The next command started (its deadline starts now).
    Started,
    Finished {
        output: String,
        exit_code: i64,
    },
}

/// Splits the driver's stream into per-command outputs, keeping at most `cap` bytes of each and
/// only counting the rest: the service's memory does not depend on what a command prints.
pub struct BatchParser {
    marker: Vec<u8>,
    cap: usize,
    header: Option<Vec<u8>>,
    pid: Option<u32>,
    pending: Vec<u8>,
    current: Option<Capped>,
}

/// Longest tail of a marker line we wait for before deciding it was not one.
const MAX_MARKER_LINE: usize = 32;

impl BatchParser {
    pub fn new(nonce: &str, cap: usize) -> Self {
        let mut marker = vec![0x1e];
        marker.extend_from_slice(nonce.as_bytes());
        marker.push(b':');
        Self {
            marker,
            cap,
            header: Some(Vec::new()),
            pid: None,
            pending: Vec::new(),
            current: None,
        }
    }

    /// The driver's pid (its process group), once its first line arrived.
    pub fn pid(&self) -> Option<u32> {
        self.pid.filter(|p| *p > 1)
    }

    /// Is a command running (started, not finished)?
    pub fn in_command(&self) -> bool {
        self.current.is_some()
    }

    /// The output so far of the command that did not finish (timeout, or the stream ended).
    pub fn take_unfinished(&mut self) -> Option<String> {
        let mut cur = self.current.take()?;
        cur.keep(&std::mem::take(&mut self.pending));
        Some(cur.finish())
    }

    pub fn push(&mut self, mut chunk: &[u8]) -> Vec<Event> {
        if let Some(header) = &mut self.header {
            match chunk.iter().position(|b| *b == b'\n') {
                Some(nl) => {
                    header.extend_from_slice(&chunk[..nl]);
                    self.pid = std::str::from_utf8(header)
                        .ok()
                        .and_then(|s| s.trim().parse().ok());
                    self.header = None;
                    chunk = &chunk[nl + 1..];
                }
                None => {
                    header.extend_from_slice(chunk);
                    if header.len() > MAX_MARKER_LINE {
                        self.header = None;
                    }
                    return Vec::new();
                }
            }
        }
        self.pending.extend_from_slice(chunk);
        let mut events = Vec::new();
        loop {
            match find(&self.pending, &self.marker) {
                Some(at) => {
                    // Everything before the marker belongs to the running command.
                    self.flush(at);
                    let line_start = self.marker.len();
                    let Some(nl) = self.pending[line_start..].iter().position(|b| *b == b'\n')
                    else {
                        if self.pending.len() - line_start > MAX_MARKER_LINE {
                            // Not a marker line after all: it is output.
                            self.flush(1);
                            continue;
                        }
                        break;
                    };
                    let line = self.pending[line_start..line_start + nl].to_vec();
                    self.pending.drain(..line_start + nl + 1);
                    if let Some(event) = self.marker_line(&line) {
                        events.push(event);
                    }
                }
                None => {
                    // Keep what could be the start of a marker split across chunks.
                    let keep = self.marker.len().saturating_sub(1).min(self.pending.len());
                    let upto = self.pending.len() - keep;
                    self.flush(upto);
                    break;
                }
            }
        }
        events
    }

    fn marker_line(&mut self, line: &[u8]) -> Option<Event> {
        if line == b"B" {
            self.current = Some(Capped::new(self.cap));
            return Some(Event::Started);
        }
        let rc = line.strip_prefix(b"E:")?;
        let exit_code = std::str::from_utf8(rc).ok()?.trim().parse().ok()?;
        let output = self.current.take().map(Capped::finish).unwrap_or_default();
        Some(Event::Finished { output, exit_code })
    }

    /// Moves `pending[..upto]` into the running command's output (bytes between commands come
    /// from background jobs of earlier ones and are dropped).
    fn flush(&mut self, upto: usize) {
        if upto == 0 {
            return;
        }
        if let Some(cur) = &mut self.current {
            cur.keep(&self.pending[..upto]);
        }
        self.pending.drain(..upto);
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// At most `cap` bytes kept; the rest counted and replaced by a marker line.
struct Capped {
    cap: usize,
    kept: Vec<u8>,
    dropped: u64,
}

impl Capped {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            kept: Vec::new(),
            dropped: 0,
        }
    }

    fn keep(&mut self, chunk: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len());
        let take = room.min(chunk.len());
        self.kept.extend_from_slice(&chunk[..take]);
        self.dropped += (chunk.len() - take) as u64;
    }

    fn finish(self) -> String {
        let mut s = String::from_utf8_lossy(&self.kept).into_owned();
        if self.dropped > 0 {
            s.push_str(&format!(
                "\n[daiv-sandbox: output truncated: {} bytes omitted; the limit is {} bytes]\n",
                self.dropped, self.cap
            ));
        }
        s
    }
}

/// A fresh nonce for one request.
pub fn nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&[u8]], cap: usize) -> (Vec<Event>, BatchParser) {
        let mut p = BatchParser::new("abc", cap);
        let mut events = Vec::new();
        for c in chunks {
            events.extend(p.push(c));
        }
        (events, p)
    }

    fn finished(output: &str, exit_code: i64) -> Event {
        Event::Finished {
            output: output.to_string(),
            exit_code,
        }
    }

    #[test]
    fn splits_commands_and_exit_codes() {
        let (events, p) = run(
            &[b"42\n\x1eabc:B\nhello\n\x1eabc:E:0\n\x1eabc:B\nno newline\x1eabc:E:3\n"],
            100,
        );
        assert_eq!(p.pid(), Some(42));
        assert_eq!(
            events,
            vec![
                Event::Started,
                finished("hello\n", 0),
                Event::Started,
                finished("no newline", 3)
            ]
        );
    }

    #[test]
    fn markers_split_across_chunks_byte_by_byte() {
        let stream = b"7\n\x1eabc:B\nout\x1eab\x1eabc:E:12\n";
        let chunks: Vec<&[u8]> = stream.chunks(1).collect();
        let (events, _) = run(&chunks, 100);
        assert_eq!(events, vec![Event::Started, finished("out\x1eab", 12)]);
    }

    #[test]
    fn another_nonce_is_just_output() {
        let (events, _) = run(&[b"7\n\x1eabc:B\n\x1exyz:E:0\n\x1eabc:E:0\n"], 100);
        assert_eq!(events, vec![Event::Started, finished("\x1exyz:E:0\n", 0)]);
    }

    #[test]
    fn output_is_capped_with_a_marker_and_memory_bounded() {
        let mut p = BatchParser::new("abc", 10);
        p.push(b"7\n\x1eabc:B\n");
        for _ in 0..10_000 {
            p.push(b"0123456789");
            assert!(p.pending.len() < 64);
        }
        let events = p.push(b"\x1eabc:E:0\n");
        let [Event::Finished { output, .. }] = &events[..] else {
            panic!("{events:?}");
        };
        assert!(
            output.starts_with("0123456789\n[daiv-sandbox: output truncated: 99990 bytes omitted")
        );
    }

    #[test]
    fn an_unfinished_command_keeps_its_output() {
        let (_, mut p) = run(&[b"7\n\x1eabc:B\npartial"], 100);
        assert!(p.in_command());
        assert_eq!(p.take_unfinished().as_deref(), Some("partial"));
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        let (events, _) = run(&[b"7\n\x1eabc:B\n\xff\xfeok\x1eabc:E:0\n"], 100);
        assert_eq!(events[1], finished("\u{fffd}\u{fffd}ok", 0));
    }

    #[test]
    fn batches_respect_the_argument_budget() {
        let small: Vec<String> = (0..10).map(|i| format!("echo {i}")).collect();
        assert_eq!(batches(&small).len(), 1);
        let big: Vec<String> = (0..4).map(|_| "x".repeat(60 * 1024)).collect();
        let b = batches(&big);
        assert_eq!(b.len(), 4);
        assert_eq!(b.iter().map(|s| s.len()).sum::<usize>(), 4);
        assert!(batches(&[]).is_empty());
    }
}
