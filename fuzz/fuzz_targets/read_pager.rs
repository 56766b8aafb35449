//! The fs `read` pager (`text::page`): a file in, one page of lines out.
//!
//! Input: byte 0 = page size in lines (1..=64, or a huge limit when 0), byte 1 = repeat count
//! (the body is repeated `1 + b1 * b1 * 8` times, up to 640 KiB, so files reach past the
//! 512000-byte page cap),
//! bytes 2..6 = read sizes, then the body. Invariants, beyond "no panic":
//! - empty file ⇔ `Empty`; not UTF-8 ⇔ `Binary` (the whole file, when it fits) or
//!   `BinaryTooLarge`;
//! - text: paging from 0 by `end_line` visits every line once; the pages (truncated ones up to
//!   their last complete line) join to the file's lines (LF-split, a CR before each LF dropped);
//!   `total_lines` is the same on every page; a page is never over `READ_MAX_BYTES`; an offset
//!   at or past the end is `OffsetBeyond` with the same total;
//! - the result does not depend on how reads split the file;
//! - memory is about one page, whatever the file's size.
#![no_main]

use daiv_sandbox_fuzz::{Chunked, Counting, measure};
use libfuzzer_sys::fuzz_target;
use sandbox_helper::ops::text::{Page, page};
use sandbox_protocol::wire::{READ_MAX_BYTES, TRUNCATION_MARKER};

#[global_allocator]
static ALLOC: Counting = Counting;

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let limit = match data[0] & 63 {
        0 => u64::MAX / 2,
        n => u64::from(n),
    };
    let times = 1 + usize::from(data[1]) * usize::from(data[1]) * 8;
    let sizes = &data[2..6];
    let body = &data[6..];
    let file = body.repeat(times.min((640 << 10) / body.len().max(1) + 1));
    check(&file, limit, sizes);
});

fn check(file: &[u8], limit: u64, sizes: &[u8]) {
    let read = |offset: u64, limit: u64, split: bool| -> Page {
        let (page, mem) = measure(|| {
            if split {
                // Reads of a few bytes for small files, a few KiB for big ones (time).
                let scale = if file.len() > 64 << 10 { 1024 } else { 1 };
                let sizes: Vec<u8> = sizes.to_vec();
                let mut r = Chunked::new(file, &sizes);
                r.sizes.iter_mut().for_each(|n| *n *= scale);
                page(r, offset, limit)
            } else {
                page(file, offset, limit)
            }
        });
        let page = page.expect("reading a slice cannot fail");
        // The preview, the raw window, the page and its cut copy (growing once), and two slices
        // (16 bytes each) per line of the window: bounded by the page cap, whatever the file's
        // size.
        let lines = file
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            .min(READ_MAX_BYTES)
            + 1;
        let bound = 8 * READ_MAX_BYTES + 32 * lines;
        assert!(mem.peak <= bound, "peak {} bytes (bound {bound})", mem.peak);
        page
    };
    let first = read(0, limit, true);
    assert_eq!(
        first,
        read(0, limit, false),
        "result depends on the read sizes"
    );
    let first_limit = limit;

    if file.is_empty() {
        assert_eq!(first, Page::Empty);
        return;
    }
    let Ok(text) = std::str::from_utf8(file) else {
        if file.len() > READ_MAX_BYTES {
            assert_eq!(first, Page::BinaryTooLarge);
        } else {
            assert_eq!(first, Page::Binary(file.to_vec()));
        }
        return;
    };
    // The reference: LF-split lines, a trailing LF ends the last line, one CR before LF dropped.
    let mut want: Vec<&str> = text.split('\n').collect();
    if text.ends_with('\n') {
        want.pop();
    }
    let want: Vec<&str> = want
        .iter()
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let total = want.len() as u64;
    // At most about 4 pages per file: each page reads the file from the start.
    let limit = limit.max(total / 4 + 1);
    let first = if limit == first_limit {
        first
    } else {
        read(0, limit, true)
    };

    let mut got: Vec<String> = Vec::new();
    let mut offset = 0u64;
    let mut p = first;
    loop {
        let Page::Text {
            content,
            total_lines,
            end_line,
            truncated,
        } = p
        else {
            panic!("text file paged as {p:?}");
        };
        assert_eq!(total_lines, total, "total_lines at offset {offset}");
        assert!(
            content.len() <= READ_MAX_BYTES,
            "page of {} bytes",
            content.len()
        );
        assert!(end_line <= total && end_line >= offset);
        let lines = end_line - offset;
        if truncated {
            let body = content
                .strip_suffix(TRUNCATION_MARKER)
                .expect("a truncated page ends with the marker");
            // The complete lines come first, then at most part of the next one.
            let complete = &want[offset as usize..end_line as usize];
            let joined = complete.join("\n");
            assert!(
                body.starts_with(&joined),
                "truncated page does not start with its lines"
            );
            if end_line < total && lines < limit {
                let next = want[end_line as usize];
                let partial = &body[joined.len()..];
                let partial = partial.strip_prefix('\n').unwrap_or(partial);
                assert!(
                    next.starts_with(partial) || partial.is_empty() || next.len() > partial.len()
                );
            }
            if lines == 0 {
                // One line longer than a page: it cannot be read whole; its head is the page.
                assert!(want[offset as usize].len() + TRUNCATION_MARKER.len() > READ_MAX_BYTES);
                return;
            }
            got.extend(complete.iter().map(|s| s.to_string()));
        } else {
            assert!(lines <= limit);
            assert!(
                lines == limit || end_line == total,
                "short page before the end"
            );
            let page_lines: Vec<&str> = if lines == 0 {
                Vec::new()
            } else {
                content.split('\n').collect()
            };
            assert_eq!(
                page_lines.len() as u64,
                lines,
                "line count of page at {offset}"
            );
            got.extend(page_lines.iter().map(|s| s.to_string()));
        }
        if end_line >= total {
            break;
        }
        offset = end_line;
        p = read(offset, limit, offset % 2 == 0);
    }
    assert_eq!(got, want, "pages do not join to the file");
    assert_eq!(read(total, limit, false), Page::OffsetBeyond { total });
}
