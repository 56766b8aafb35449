//! The answer of `ls` and `glob`: every entry, all found before the first is sent and counted
//! in bytes of JSON as they are found, so a listing over its bound is the error `too_large`
//! (the walk stops there) and never half an answer; then sent as DATA chunks of whole entries.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use sandbox_protocol::wire::{FsEntry, FsErrorCode, LISTING_CHUNK, LISTING_FRAME_MAX};

use crate::ops::{Halt, OpError, fail};

/// Counts the bytes a serialiser writes, keeping none.
struct Count(u64);

impl io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// An entry's JSON length.
fn json_len(e: &FsEntry) -> u64 {
    let mut c = Count(0);
    // Writing a string and a bool into a counter cannot fail.
    let _ = serde_json::to_writer(&mut c, e);
    c.0
}

/// A listing being gathered within `max` bytes of JSON (each entry's, plus its comma).
pub struct Listing {
    pub entries: Vec<FsEntry>,
    bytes: u64,
    max: u64,
    /// The path the listing is of, for the error.
    shown: String,
}

impl Listing {
    pub fn new(shown: &str, max: u64) -> Self {
        Self {
            entries: Vec::new(),
            bytes: 0,
            max,
            shown: shown.to_string(),
        }
    }

    /// The error of a listing over its bound.
    pub fn too_large(&self) -> OpError {
        fail(
            FsErrorCode::TooLarge,
            format!(
                "the listing of {} is over the {}-byte limit on an answer: narrow the path or the pattern, or exclude directories",
                self.shown, self.max
            ),
        )
    }

    /// Whether `n` more bytes would still fit.
    fn fits(&self, n: u64) -> bool {
        self.bytes.saturating_add(n) <= self.max
    }

    /// Adds an entry; one past the bound is [`Self::too_large`].
    pub fn push(&mut self, e: FsEntry) -> Result<(), OpError> {
        let n = json_len(&e);
        if n + 2 > LISTING_FRAME_MAX as u64 {
            return Err(fail(
                FsErrorCode::TooLarge,
                format!(
                    "a path under {} is over the {LISTING_FRAME_MAX}-byte limit on one entry",
                    self.shown
                ),
            ));
        }
        if !self.fits(n + 1) {
            return Err(self.too_large());
        }
        self.bytes += n + 1;
        self.entries.push(e);
        Ok(())
    }

    /// How many entries (`len`, as a `u64` for the wire).
    pub fn count(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Bytes of JSON: every entry's, with a comma each.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Sends the entries in order through `send`, each chunk a JSON array of whole entries of
    /// at most [`LISTING_CHUNK`] bytes (a larger entry alone). Only a cancel stops it: the
    /// deadline was the search's, and the client's pace sets this part.
    pub fn send(self, send: &mut dyn FnMut(&[u8]), cancelled: &AtomicBool) -> Result<(), Halt> {
        let mut chunk = Vec::with_capacity(LISTING_CHUNK);
        let mut entry = Vec::new();
        for e in &self.entries {
            entry.clear();
            // Serialising a string and a bool cannot fail.
            let _ = serde_json::to_writer(&mut entry, e);
            if !chunk.is_empty() && chunk.len() + entry.len() + 1 > LISTING_CHUNK {
                chunk.push(b']');
                if cancelled.load(Ordering::Relaxed) {
                    return Err(Halt::Cancelled);
                }
                send(&chunk);
                chunk.clear();
            }
            chunk.push(if chunk.is_empty() { b'[' } else { b',' });
            chunk.extend_from_slice(&entry);
        }
        if !chunk.is_empty() {
            chunk.push(b']');
            send(&chunk);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(i: usize) -> FsEntry {
        FsEntry {
            path: format!("/workspace/repo/f{i:05}.py"),
            is_dir: false,
        }
    }

    fn sent(l: Listing) -> Vec<Vec<u8>> {
        let mut chunks = Vec::new();
        l.send(&mut |c| chunks.push(c.to_vec()), &AtomicBool::new(false))
            .unwrap();
        chunks
    }

    #[test]
    fn every_entry_is_sent_in_chunks_of_whole_entries() {
        let mut l = Listing::new("/workspace/repo", u64::MAX);
        for i in 0..5000 {
            l.push(entry(i)).unwrap();
        }
        // `{"path":"/workspace/repo/f00000.py","is_dir":false}` and its comma.
        assert_eq!(l.bytes(), 5000 * 52);
        assert_eq!(l.count(), 5000);
        let chunks = sent(l);
        assert!(chunks.len() > 1, "{}", chunks.len());
        let mut all = Vec::new();
        for c in &chunks {
            assert!(c.len() <= LISTING_CHUNK, "{}", c.len());
            all.extend(serde_json::from_slice::<Vec<FsEntry>>(c).unwrap());
        }
        assert_eq!(all, (0..5000).map(entry).collect::<Vec<_>>());
    }

    #[test]
    fn the_bound_counts_json_and_refuses_one_entry_past_it() {
        // Room for exactly three entries of 52 bytes each.
        let mut l = Listing::new("/workspace/repo", 3 * 52);
        for i in 0..3 {
            l.push(entry(i)).unwrap();
        }
        let Err(OpError::Fs(e)) = l.push(entry(3)) else {
            panic!("a fourth entry fits");
        };
        assert_eq!(e.code, FsErrorCode::TooLarge);
        assert!(e.message.contains("/workspace/repo"), "{}", e.message);
        assert!(e.message.contains("156-byte"), "{}", e.message);
        // Escapes count as what is sent.
        let mut l = Listing::new("/workspace", 1000);
        l.push(FsEntry {
            path: "/workspace/\"\n".into(),
            is_dir: true,
        })
        .unwrap();
        assert_eq!(
            l.bytes() as usize,
            r#"{"path":"/workspace/\"\n","is_dir":true},"#.len()
        );
    }

    #[test]
    fn one_entry_over_the_frame_goes_nowhere_and_a_large_one_goes_alone() {
        let mut l = Listing::new("/workspace", u64::MAX);
        let long = |n: usize| FsEntry {
            path: format!("/workspace/{}", "a/".repeat(n)),
            is_dir: true,
        };
        let Err(OpError::Fs(e)) = l.push(long(LISTING_FRAME_MAX / 2)) else {
            panic!("an entry over a frame fits");
        };
        assert_eq!(e.code, FsErrorCode::TooLarge);
        l.push(entry(0)).unwrap();
        l.push(long(LISTING_CHUNK / 2)).unwrap();
        l.push(entry(1)).unwrap();
        let chunks = sent(l);
        assert_eq!(chunks.len(), 3);
        assert!(chunks[1].len() > LISTING_CHUNK);
    }

    #[test]
    fn a_cancel_stops_the_sending() {
        let mut l = Listing::new("/workspace/repo", u64::MAX);
        for i in 0..5000 {
            l.push(entry(i)).unwrap();
        }
        let mut n = 0;
        let r = l.send(&mut |_| n += 1, &AtomicBool::new(true));
        assert_eq!(r, Err(Halt::Cancelled));
        assert_eq!(n, 0);
    }
}
