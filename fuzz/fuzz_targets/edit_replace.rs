//! The fs `edit` replacer (`text::replace`), against a simple reference implementation.
//!
//! Input: byte 0 (bit 0 = `replace_all`), then `text \0 old \0 new` (lossy UTF-8). The
//! reference: try `old` as given, then with CRLF line endings, then with LF (`new` converted
//! the same way); the first that occurs wins; count its non-overlapping occurrences left to
//! right; more than one without `replace_all` is `multiple_occurrences`; none at all is
//! `string_not_found`; otherwise replace the first (or every) occurrence. Invariants: the
//! result and the count equal the reference's, and the error code is the reference's.
#![no_main]

use daiv_sandbox_fuzz::split_once;
use libfuzzer_sys::fuzz_target;
use sandbox_helper::ops::text::replace;
use sandbox_protocol::wire::FsErrorCode;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let replace_all = flags & 1 == 1;
    let (text, rest) = split_once(rest, 0);
    let (old, new) = split_once(rest, 0);
    let text = String::from_utf8_lossy(text);
    let old = String::from_utf8_lossy(old);
    let new = String::from_utf8_lossy(new);
    // `edit` refuses an empty `old` before replacing.
    if old.is_empty() {
        return;
    }
    let got = replace(&text, &old, &new, replace_all);
    let want = reference(&text, &old, &new, replace_all);
    match (got, want) {
        (Ok(g), Ok(w)) => assert_eq!(g, w),
        (Err(e), Err(code)) => {
            assert_eq!(e.code, code, "{}", e.message);
            assert!(!e.message.is_empty());
        }
        (g, w) => panic!("replace gave {g:?}, the reference {w:?}"),
    }
});

/// Occurrences of `pat` in `s`, left to right, not overlapping: their byte offsets.
fn find_all(s: &[u8], pat: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + pat.len() <= s.len() {
        if &s[i..i + pat.len()] == pat {
            out.push(i);
            i += pat.len();
        } else {
            i += 1;
        }
    }
    out
}

fn to_lf(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\r' && b.get(i + 1) == Some(&b'\n') {
            out.push(b'\n');
            i += 2;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("still UTF-8")
}

fn to_crlf(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if c == '\n' {
            out.push('\r');
        }
        out.push(c);
    }
    out
}

fn reference(text: &str, old: &str, new: &str, all: bool) -> Result<(String, usize), FsErrorCode> {
    let old_lf = to_lf(old);
    let new_lf = to_lf(new);
    let candidates = [
        (old.to_string(), new.to_string()),
        (to_crlf(&old_lf), to_crlf(&new_lf)),
        (old_lf, new_lf),
    ];
    for (o, n) in &candidates {
        let at = find_all(text.as_bytes(), o.as_bytes());
        if at.is_empty() {
            continue;
        }
        if at.len() > 1 && !all {
            return Err(FsErrorCode::MultipleOccurrences);
        }
        let take = if all { at.len() } else { 1 };
        let mut out = Vec::new();
        let mut last = 0;
        for &i in &at[..take] {
            out.extend_from_slice(&text.as_bytes()[last..i]);
            out.extend_from_slice(n.as_bytes());
            last = i + o.len();
        }
        out.extend_from_slice(&text.as_bytes()[last..]);
        return Ok((String::from_utf8(out).expect("UTF-8"), at.len()));
    }
    Err(FsErrorCode::StringNotFound)
}
