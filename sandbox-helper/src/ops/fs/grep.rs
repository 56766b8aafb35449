//! `grep`'s matching of one file: line by line over a bounded buffer, binary files (a NUL byte)
//! yielding nothing, as GNU grep's output did once the old parser dropped its "Binary file"
//! line.

use std::fs::File;
use std::io::Read;

use rustix::fd::OwnedFd;
use rustix::fs::FileType;
use sandbox_protocol::wire::{FsGrepMatch, GREP_MAX_MATCHES};

use super::file_type;
use crate::ops::{OpError, Stop};

/// Longest line grep matches against; the rest of a longer line is not searched (memory stays
/// bounded on minified or binary-like text without NULs).
const GREP_MAX_LINE: usize = 16 * 1024 * 1024;

/// Greps one open file line by line into `matches` (at most one past the cap).
pub(super) fn search(
    fd: OwnedFd,
    re: &regex::bytes::Regex,
    shown: &str,
    matches: &mut Vec<FsGrepMatch>,
    stop: &Stop<'_>,
) -> Result<(), OpError> {
    match rustix::fs::fstat(&fd) {
        Ok(st) if file_type(&st) == FileType::RegularFile => {}
        _ => return Ok(()),
    }
    let mut file = File::from(fd);
    let mut buf = vec![0u8; 64 * 1024];
    let mut carry: Vec<u8> = Vec::new();
    let mut line_no = 0u64;
    let emit = |line: &[u8], line_no: u64, matches: &mut Vec<FsGrepMatch>| {
        if re.is_match(line) {
            let text = String::from_utf8_lossy(line);
            matches.push(FsGrepMatch {
                path: shown.to_string(),
                line: line_no,
                text: text.strip_suffix('\r').unwrap_or(&text).to_string(),
            });
        }
        matches.len() <= GREP_MAX_MATCHES
    };
    loop {
        stop.check()?;
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Ok(()),
        };
        let chunk = &buf[..n];
        if memchr::memchr(0, chunk).is_some() {
            return Ok(());
        }
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', chunk) {
            line_no += 1;
            let more = if carry.is_empty() {
                emit(&chunk[start..nl], line_no, matches)
            } else {
                let room = GREP_MAX_LINE.saturating_sub(carry.len());
                carry.extend_from_slice(&chunk[start..nl.min(start + room)]);
                let more = emit(&carry, line_no, matches);
                carry.clear();
                more
            };
            if !more {
                return Ok(());
            }
            start = nl + 1;
        }
        let room = GREP_MAX_LINE.saturating_sub(carry.len());
        carry.extend_from_slice(&chunk[start..n.min(start + room)]);
    }
    if !carry.is_empty() {
        emit(&carry, line_no + 1, matches);
    }
    Ok(())
}
