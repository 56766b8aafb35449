//! Pure text logic of `read` and `edit`, ported from the control plane's scripts era unchanged
//! except for the bound on counting `total_lines` ([`SCAN_PAST_PAGE`]).

use std::io::Read;

use sandbox_protocol::wire::{FsError, FsErrorCode, READ_MAX_BYTES, TRUNCATION_MARKER};

/// Bytes read past the requested page only to count `total_lines`; beyond this the count is the
/// lines seen so far, so a page near the start of a huge file stays cheap.
pub const SCAN_PAST_PAGE: u64 = 64 * 1024 * 1024;

#[derive(Debug, PartialEq)]
pub enum Page {
    Empty,
    Binary(Vec<u8>),
    BinaryTooLarge,
    OffsetBeyond {
        total: u64,
    },
    Text {
        content: String,
        total_lines: u64,
        end_line: u64,
        truncated: bool,
    },
}

/// Incremental UTF-8 validation across chunk boundaries.
struct Utf8Check {
    ok: bool,
    pending: Vec<u8>,
}

impl Utf8Check {
    fn feed(&mut self, mut chunk: &[u8]) {
        if !self.ok {
            return;
        }
        while !self.pending.is_empty() && !chunk.is_empty() {
            self.pending.push(chunk[0]);
            chunk = &chunk[1..];
            match std::str::from_utf8(&self.pending) {
                Ok(_) => self.pending.clear(),
                Err(e) if e.error_len().is_some() => {
                    self.ok = false;
                    return;
                }
                Err(_) => {}
            }
        }
        if !self.pending.is_empty() {
            return;
        }
        if let Err(e) = std::str::from_utf8(chunk) {
            if e.error_len().is_some() {
                self.ok = false;
            } else {
                self.pending = chunk[e.valid_up_to()..].to_vec();
            }
        }
    }

    /// Valid so far; a character cut by a scan that stopped early does not count against it.
    fn valid(&self, stopped: bool) -> bool {
        self.ok && (stopped || self.pending.is_empty())
    }
}

/// [`page_checked`] without a cancellation check.
pub fn page(r: impl Read, offset: u64, limit: u64) -> std::io::Result<Page> {
    page_checked(r, offset, limit, &mut || Ok(()))
}

/// Pages a file: lines `[offset, offset + limit)` (0-indexed), joined by `\n` (CR of CRLF
/// dropped), capped at [`READ_MAX_BYTES`] with [`TRUNCATION_MARKER`]. Memory: one page plus the
/// binary preview, whatever the file's size. Reading stops [`SCAN_PAST_PAGE`] bytes after the
/// page. `check` runs between chunks; its error aborts the read (cancel, deadline).
pub fn page_checked(
    mut r: impl Read,
    offset: u64,
    limit: u64,
    check: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Result<Page> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut utf8 = Utf8Check {
        ok: true,
        pending: Vec::new(),
    };
    let mut size: u64 = 0;
    let mut prefix: Vec<u8> = Vec::new(); // first READ_MAX_BYTES + 1 bytes, for a binary preview
    let mut window: Vec<u8> = Vec::new(); // raw bytes of the requested lines
    let mut overflow = false;
    let mut line: u64 = 0; // index of the line being read
    let mut last_byte = b'\n';
    let end = offset.saturating_add(limit);
    let mut past_page: u64 = 0;
    let mut stopped = false;
    loop {
        check()?;
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let chunk = &buf[..n];
        utf8.feed(chunk);
        size += n as u64;
        if prefix.len() <= READ_MAX_BYTES {
            let take = (READ_MAX_BYTES + 1 - prefix.len()).min(n);
            prefix.extend_from_slice(&chunk[..take]);
        }
        let mut start = 0;
        for (i, b) in chunk.iter().enumerate() {
            if *b == b'\n' {
                if line >= offset && line < end && !overflow {
                    push_capped(&mut window, &chunk[start..=i], &mut overflow);
                }
                line += 1;
                start = i + 1;
            }
        }
        if start < n && line >= offset && line < end && !overflow {
            push_capped(&mut window, &chunk[start..], &mut overflow);
        }
        last_byte = chunk[n - 1];
        if line >= end {
            past_page += n as u64;
            if past_page > SCAN_PAST_PAGE {
                stopped = true;
                break;
            }
        }
    }
    if size == 0 {
        return Ok(Page::Empty);
    }
    if !utf8.valid(stopped) {
        if size > READ_MAX_BYTES as u64 {
            return Ok(Page::BinaryTooLarge);
        }
        return Ok(Page::Binary(prefix));
    }
    let total = line + u64::from(last_byte != b'\n');
    if offset >= total {
        return Ok(Page::OffsetBeyond { total });
    }
    // `window` is valid UTF-8 except possibly a character cut by the raw cap at its end.
    let valid = match std::str::from_utf8(&window) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&window[..e.valid_up_to()]).unwrap_or_default(),
    };
    let mut lines: Vec<&str> = valid.split('\n').collect();
    // A trailing newline leaves an empty last piece that is not a line.
    let last_complete = if valid.ends_with('\n') {
        lines.pop();
        true
    } else {
        // Complete if the file ended there (not cut by the cap).
        !overflow
    };
    let lines: Vec<&str> = lines
        .iter()
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let content = lines.join("\n");
    let complete_count = if last_complete {
        lines.len()
    } else {
        lines.len().saturating_sub(1)
    };
    if content.len() <= READ_MAX_BYTES && !overflow {
        return Ok(Page::Text {
            content,
            total_lines: total,
            end_line: offset + lines.len() as u64,
            truncated: false,
        });
    }
    let mut cut = READ_MAX_BYTES
        .saturating_sub(TRUNCATION_MARKER.len())
        .min(content.len());
    while !content.is_char_boundary(cut) {
        cut -= 1;
    }
    // Lines whose whole text lies before the cut are complete.
    let mut pos = 0usize;
    let mut complete = 0u64;
    for (i, l) in lines.iter().enumerate().take(complete_count) {
        pos += l.len();
        if pos > cut {
            break;
        }
        complete = i as u64 + 1;
        pos += 1;
    }
    let mut out = content[..cut].to_string();
    out.push_str(TRUNCATION_MARKER);
    Ok(Page::Text {
        content: out,
        total_lines: total,
        end_line: offset + complete,
        truncated: true,
    })
}

fn push_capped(window: &mut Vec<u8>, data: &[u8], overflow: &mut bool) {
    let room = (READ_MAX_BYTES + 1).saturating_sub(window.len());
    if data.len() > room {
        window.extend_from_slice(&data[..room]);
        *overflow = true;
    } else {
        window.extend_from_slice(data);
    }
}

/// Exact-substring replacement, CRLF-aware: tries `old` as given, then with CRLF line endings,
/// then with LF. The error messages follow deepagents', which DAIV's client shows verbatim.
pub fn replace(
    text: &str,
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<(String, usize), FsError> {
    let old_lf = old.replace("\r\n", "\n");
    let new_lf = new.replace("\r\n", "\n");
    let old_crlf = old_lf.replace('\n', "\r\n");
    let new_crlf = new_lf.replace('\n', "\r\n");
    let candidates = [
        (old, new),
        (old_crlf.as_str(), new_crlf.as_str()),
        (old_lf.as_str(), new_lf.as_str()),
    ];
    let found = candidates.iter().find_map(|(o, n)| {
        let c = text.matches(o).count();
        (c > 0).then_some((*o, *n, c))
    });
    let Some((o, n, count)) = found else {
        let text_lf = text.replace("\r\n", "\n");
        if old_lf.len() > 1
            && let Some(stripped) = old_lf.strip_suffix('\n')
            && text_lf.ends_with(stripped)
        {
            let times = text_lf.matches(stripped).count();
            let msg = if times == 1 {
                "old_string ends with a newline, but the file does not end with a newline. Retry with the trailing newline removed from old_string (and from new_string if it also ends with a newline).".to_string()
            } else {
                format!(
                    "old_string ends with a newline, but the file does not end with a newline. With the trailing newline removed, old_string would appear {times} times in the file. Retry with the trailing newline removed and add surrounding context so the match is unique."
                )
            };
            return Err(FsError::new(FsErrorCode::StringNotFound, msg));
        }
        return Err(FsError::new(
            FsErrorCode::StringNotFound,
            "String not found in file: old must match the file's text exactly (whitespace and indentation included).",
        ));
    };
    if count > 1 && !replace_all {
        return Err(FsError::new(
            FsErrorCode::MultipleOccurrences,
            format!(
                "String appears {count} times in file. Use replace_all=True to replace all instances, or provide a more specific string with surrounding context."
            ),
        ));
    }
    let updated = if replace_all {
        text.replace(o, n)
    } else {
        text.replacen(o, n, 1)
    };
    Ok((updated, count))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn text(p: Page) -> (String, u64, u64, bool) {
        match p {
            Page::Text {
                content,
                total_lines,
                end_line,
                truncated,
            } => (content, total_lines, end_line, truncated),
            other => panic!("not text: {other:?}"),
        }
    }

    #[test]
    fn pages_by_line_with_totals() -> std::io::Result<()> {
        let f = b"a\nb\nc\nd\n";
        assert_eq!(
            text(page(&f[..], 0, 2000)?),
            ("a\nb\nc\nd".into(), 4, 4, false)
        );
        assert_eq!(text(page(&f[..], 1, 2)?), ("b\nc".into(), 4, 3, false));
        assert_eq!(
            text(page(&b"x\r\ny"[..], 0, 10)?),
            ("x\ny".into(), 2, 2, false)
        );
        assert_eq!(page(&f[..], 4, 1)?, Page::OffsetBeyond { total: 4 });
        assert_eq!(page(&b""[..], 5, 1)?, Page::Empty);
        Ok(())
    }

    #[test]
    fn binary_is_detected_and_capped() -> std::io::Result<()> {
        assert_eq!(
            page(&b"\xff\x00ab"[..], 0, 10)?,
            Page::Binary(b"\xff\x00ab".to_vec())
        );
        let big = vec![0xffu8; READ_MAX_BYTES + 1];
        assert_eq!(page(&big[..], 0, 10)?, Page::BinaryTooLarge);
        Ok(())
    }

    #[test]
    fn long_pages_are_cut_with_a_marker_and_end_line() -> std::io::Result<()> {
        let line = "x".repeat(1000);
        let file = format!("{line}\n").repeat(1000);
        let (content, total, end, truncated) = text(page(file.as_bytes(), 0, 2000)?);
        assert!(truncated);
        assert!(content.len() <= READ_MAX_BYTES);
        assert!(content.ends_with(TRUNCATION_MARKER));
        assert_eq!(total, 1000);
        assert_eq!(
            end,
            ((READ_MAX_BYTES - TRUNCATION_MARKER.len()) / 1001) as u64
        );
        // One line longer than the cap: no complete line at all.
        let huge = "y".repeat(READ_MAX_BYTES * 2);
        let (_, total, end, truncated) = text(page(huge.as_bytes(), 0, 10)?);
        assert_eq!((total, end, truncated), (1, 0, true));
        Ok(())
    }

    /// A reader of `n` lines of `"line\n"`, generated on the fly.
    struct Lines {
        left: u64,
    }

    impl Read for Lines {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let mut n = 0;
            while self.left > 0 && n + 5 <= buf.len() {
                buf[n..n + 5].copy_from_slice(b"line\n");
                n += 5;
                self.left -= 1;
            }
            Ok(n)
        }
    }

    #[test]
    fn counting_lines_stops_64_mib_past_the_page() -> std::io::Result<()> {
        // 100 MiB of lines: the count stops near 64 MiB past the page, well short of the total.
        let all = 100 * 1024 * 1024 / 5;
        let (content, total, end, _) = text(page(Lines { left: all }, 0, 2)?);
        assert_eq!((content.as_str(), end), ("line\nline", 2));
        assert!(total < all, "{total}");
        let floor = SCAN_PAST_PAGE / 5;
        assert!(total >= floor && total <= floor + 64 * 1024, "{total}");
        // A smaller file is counted exactly.
        let (_, total, _, _) = text(page(Lines { left: 1000 }, 10, 2)?);
        assert_eq!(total, 1000);
        Ok(())
    }

    #[test]
    fn a_check_error_aborts_the_read() {
        let mut calls = 0;
        let r = page_checked(Lines { left: 1 << 20 }, 0, 1 << 30, &mut || {
            calls += 1;
            if calls > 2 {
                Err(std::io::Error::other("stop"))
            } else {
                Ok(())
            }
        });
        assert!(r.is_err());
    }

    #[test]
    fn utf8_split_across_chunks_is_still_text() {
        let mut c = Utf8Check {
            ok: true,
            pending: Vec::new(),
        };
        let s = "héllo".as_bytes();
        c.feed(&s[..2]);
        assert!(!c.valid(false));
        c.feed(&s[2..]);
        assert!(c.valid(false));
    }

    #[test]
    fn edit_rules() {
        let ok = |r: Result<(String, usize), FsError>| r.unwrap();
        let code = |r: Result<(String, usize), FsError>| {
            let e = r.unwrap_err();
            (e.code, e.message)
        };
        assert_eq!(ok(replace("a b a", "b", "c", false)), ("a c a".into(), 1));
        assert_eq!(ok(replace("a b a", "a", "c", true)), ("c b c".into(), 2));
        assert_eq!(
            code(replace("a b a", "a", "c", false)).0,
            FsErrorCode::MultipleOccurrences
        );
        assert_eq!(
            code(replace("abc", "x", "y", false)).0,
            FsErrorCode::StringNotFound
        );
        assert_eq!(
            ok(replace("l1\r\nl2\r\n", "l1\nl2", "m1\nm2", false)),
            ("m1\r\nm2\r\n".into(), 1)
        );
        let (c, msg) = code(replace("end", "end\n", "x", false));
        assert_eq!(c, FsErrorCode::StringNotFound);
        assert!(msg.contains("trailing newline"), "{msg}");
        let (_, msg) = code(replace("end end", "end\n", "x", false));
        assert!(msg.contains("appear 2 times"), "{msg}");
    }
}
