//! The memory bound on tar records: the tar crate reads a long-name, long-link or PAX record
//! whole, however large its header says it is, so [`TarGuard`] follows the block structure
//! ahead of it and refuses the archive at such a header (see the parent module's docs).

use std::cell::Cell;
use std::io::{self, Read};

use tar::Header;

use super::{PATH_MAX, PAX_MAX, SanitizeError, shown};

/// Where [`TarGuard`] is in the archive's block structure.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Inside a header block, `filled` of its 512 bytes seen.
    Header { filled: usize },
    /// Inside a record's data and padding: `left` bytes to the next header. The first `keep` of
    /// them are kept (a PAX record, for its `size`); `pax` says the record is one.
    Body { left: u64, keep: u64, pax: bool },
    /// After the end-of-archive block: the tar reader stops there, nothing is interpreted.
    End,
    /// A header whose size the tar reader cannot parse either was passed on: it fails on it, and
    /// any further read is refused rather than passed on untracked.
    Lost,
    /// Refused: every further read fails.
    Failed,
}

/// Follows the tar block structure between the decompressor and [`tar::Archive`] and refuses
/// the archive at the header of a record the tar crate would read whole (see the module docs),
/// so that record is never read. The refusal is left in `refused` for
/// [`sanitize`](super::sanitize) to report; the tar reader only sees an I/O error.
///
/// It tracks sizes exactly as tar 0.4's `next_entry_raw`/`next_entry` do: the size field through
/// [`Header::entry_size`] (octal or base-256), overridden by the `size` of a preceding PAX `x`
/// record (one with a ustar or GNU magic: others are plain members to the tar crate) for the
/// next header that is not itself an `L`, `K`, `x` or `g`.
pub(super) struct TarGuard<'a, R> {
    inner: R,
    phase: Phase,
    header: Header,
    /// A PAX `x` record was read since the last member: the `size` it carries, if any.
    pax: Option<Option<u64>>,
    /// The PAX record passing by (at most [`PAX_MAX`] bytes).
    record: Vec<u8>,
    refused: &'a Cell<Option<SanitizeError>>,
}

impl<'a, R: Read> TarGuard<'a, R> {
    pub(super) fn new(inner: R, refused: &'a Cell<Option<SanitizeError>>) -> Self {
        Self {
            inner,
            phase: Phase::Header { filled: 0 },
            header: Header::new_old(),
            pax: None,
            record: Vec::new(),
            refused,
        }
    }

    /// Moves through `data`, which has just been read.
    fn observe(&mut self, mut data: &[u8]) -> Result<(), SanitizeError> {
        while !data.is_empty() {
            match self.phase {
                Phase::Header { filled } => {
                    let n = (512 - filled).min(data.len());
                    self.header.as_mut_bytes()[filled..filled + n].copy_from_slice(&data[..n]);
                    data = &data[n..];
                    self.phase = if filled + n == 512 {
                        self.at_header()?
                    } else {
                        Phase::Header { filled: filled + n }
                    };
                }
                Phase::Body { left, keep, pax } => {
                    let n = left.min(data.len() as u64);
                    let kept = keep.min(n);
                    // `kept` <= PAX_MAX, so both fit in usize.
                    self.record.extend_from_slice(&data[..kept as usize]);
                    data = &data[n as usize..];
                    self.phase = if n == left {
                        self.after_body(pax)
                    } else {
                        Phase::Body {
                            left: left - n,
                            keep: keep - kept,
                            pax,
                        }
                    };
                }
                Phase::End | Phase::Lost | Phase::Failed => return Ok(()),
            }
        }
        Ok(())
    }

    /// A whole header has been seen: refuse it, or work out where the next one starts.
    fn at_header(&mut self) -> Result<Phase, SanitizeError> {
        let h = &self.header;
        if h.as_bytes().iter().all(|b| *b == 0) {
            return Ok(Phase::End);
        }
        let kind = h.entry_type();
        if kind.is_gnu_sparse() {
            return Err(SanitizeError::Sparse(shown(&h.path_bytes())));
        }
        let Ok(mut size) = h.entry_size() else {
            return Ok(Phase::Lost);
        };
        let is_pax = kind.is_pax_local_extensions() || kind.is_pax_global_extensions();
        if kind.is_gnu_longname() && size > PATH_MAX {
            return Err(SanitizeError::NameTooLong);
        }
        if kind.is_gnu_longlink() && size > PATH_MAX {
            return Err(SanitizeError::LinkTooLong);
        }
        if is_pax && size > PAX_MAX {
            return Err(SanitizeError::PaxTooLarge { size });
        }
        let extension = is_pax || kind.is_gnu_longname() || kind.is_gnu_longlink();
        let recognized = h.as_gnu().is_some() || h.as_ustar().is_some();
        // The tar crate reads recognised `L`, `K` and `x` records ahead of the member they
        // describe; anything else is handed out as a member, and the PAX state starts afresh.
        let leads = recognized
            && (kind.is_gnu_longname() || kind.is_gnu_longlink() || kind.is_pax_local_extensions());
        if !leads {
            if let Some(Some(pax_size)) = self.pax.filter(|_| !extension) {
                size = pax_size;
            }
            self.pax = None;
        }
        let keeps_pax = recognized && kind.is_pax_local_extensions();
        let Some(padded) = size.checked_add(511).map(|s| s & !511) else {
            return Ok(Phase::Lost); // the tar crate fails with "size overflow"
        };
        self.record.clear();
        if padded == 0 {
            return Ok(self.after_body(keeps_pax));
        }
        Ok(Phase::Body {
            left: padded,
            keep: if keeps_pax { size } else { 0 },
            pax: keeps_pax,
        })
    }

    fn after_body(&mut self, pax: bool) -> Phase {
        if pax {
            self.pax = Some(pax_size(&self.record));
            self.record = Vec::new();
        }
        Phase::Header { filled: 0 }
    }
}

/// The `size` of a PAX record, parsed as tar 0.4's `pax_extensions_value` does: the first `size`
/// key wins, and a malformed record before it, or a bad value, means none.
fn pax_size(record: &[u8]) -> Option<u64> {
    for ext in tar::PaxExtensions::new(record) {
        let ext = ext.ok()?;
        if ext.key() != Ok("size") {
            continue;
        }
        return ext.value().ok()?.parse::<u64>().ok();
    }
    None
}

impl<R: Read> Read for TarGuard<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.phase {
            Phase::Failed => return Err(io::Error::other("archive refused")),
            Phase::Lost => return Err(io::Error::other("invalid tar header")),
            _ => {}
        }
        let n = self.inner.read(buf)?;
        if let Err(e) = self.observe(&buf[..n]) {
            self.phase = Phase::Failed;
            let msg = e.to_string();
            self.refused.set(Some(e));
            return Err(io::Error::other(msg));
        }
        Ok(n)
    }
}
