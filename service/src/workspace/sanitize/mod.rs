//! The seed sanitiser: reads a (possibly compressed) tar and writes a plain tar that is safe to
//! extract as root into the container, member by member, so memory does not depend on the
//! archive's size.
//!
//! Escape safety rests on three guards together; weakening one re-opens the others:
//! - member names: absolute names and `..` components reject the whole archive;
//! - symlinks: kept only when their target is relative and lexically stays inside the root
//!   without passing through an earlier symlink, and no later symlink may take the name of a
//!   directory some earlier target walked through;
//! - no member is written through or over a symlink (a path that traverses an emitted symlink,
//!   or a name already emitted, is skipped: first wins).
//!
//! Everything else is normalised: owner `RUN_UID:RUN_GID`, modes as `chmod -R a+rX,u+w` with
//! setuid/setgid/sticky cleared, missing parents synthesised as sandbox-owned directories
//! (otherwise Docker would create them root-owned), hardlinks/devices/FIFOs dropped.
//!
//! # Memory
//! The tar crate reads a GNU long-name/long-link (`L`/`K`) or PAX (`x`) record whole into memory,
//! however large its header says it is, and a few KB of gzip can claim gigabytes. `TarGuard`
//! sits between the decompressor and the tar reader and follows the block structure itself
//! (header, then `size` rounded up to 512, the size octal or base-256 and overridden by a PAX
//! `size` record exactly as the tar crate does it; a zero block ends the archive). It refuses the
//! archive when it sees the header of an `L`/`K` record larger than [`PATH_MAX`] or of an
//! `x`/`g` record larger than [`PAX_MAX`], before the tar reader is handed that header. Names and
//! symlink targets that arrive some other way (a PAX `path`/`linkpath`) are held to the same
//! [`PATH_MAX`]. GNU sparse (`S`) members refuse the archive: the tar crate reads their
//! extended sparse maps as extra blocks that no `size` field accounts for, so following the
//! structure would mean re-implementing its sparse parser, and the member would only be dropped
//! (it is not a regular file); GNU tar writes them only with `--sparse`.
//!
//! Names in errors and log lines go through [`shown`]: at most [`SHOWN_MAX`] characters.
//!
//! # Layout
//! - `decode`: compression detection, decompressors with bounded memory, and the decompressed
//!   byte count against [`Budget`];
//! - `guard`: `TarGuard`, the block-structure tracker behind the memory bounds above;
//! - `names`: the first guard (member names) and mode normalisation;
//! - `emit`: the other two guards (symlinks, no write through or over one), synthesised
//!   parents, and the output tar.
//!
//! This file holds the public types and [`sanitize`], which chains them: decoder, `Counted`,
//! `TarGuard`, the tar reader, then `State` writing the output tar.

use std::cell::Cell;
use std::io::{self, Read, Write};

use tar::{Builder, EntryType};

mod decode;
mod emit;
mod guard;
mod names;
#[cfg(test)]
mod tests;

pub use decode::{Compression, detect};
pub use names::normalize_mode;

use decode::{Counted, decoder};
use emit::{MemberError, State, Watched};
use guard::TarGuard;

/// Linux's `PATH_MAX`, which counts the terminating NUL: the largest GNU `L`/`K` record (the name
/// plus its NUL, as GNU tar writes it) accepted; names and link targets must be shorter.
pub const PATH_MAX: u64 = 4096;

/// The largest PAX extended header (`x` or `g`) accepted; real ones are a few hundred bytes.
pub const PAX_MAX: u64 = 64 * 1024;

/// Most characters of a hostile name (or text quoting one) put in an error or a log line.
pub const SHOWN_MAX: usize = 200;

/// Why an archive was refused as a whole.
#[derive(Debug, thiserror::Error)]
pub enum SanitizeError {
    #[error("archive member has an absolute name: {0}")]
    Absolute(String),
    #[error("archive member name contains '..': {0}")]
    Traversal(String),
    #[error(
        "archive member name is longer than {} bytes (PATH_MAX is {PATH_MAX} with the terminating NUL)",
        PATH_MAX - 1
    )]
    NameTooLong,
    #[error(
        "archive member's link target is longer than {} bytes (PATH_MAX is {PATH_MAX} with the terminating NUL)",
        PATH_MAX - 1
    )]
    LinkTooLong,
    #[error("archive has a PAX extended header of {size} bytes; at most {PAX_MAX} are accepted")]
    PaxTooLarge { size: u64 },
    #[error("archive member {0} is a GNU sparse file, which is not supported")]
    Sparse(String),
    #[error(
        "archive exceeds the limit of {limit} bytes (decompressed; DAIV_SANDBOX_SEED_MAX_BYTES)"
    )]
    TooLarge { limit: u64 },
    #[error("archive exceeds the limit of {limit} members (DAIV_SANDBOX_SEED_MAX_MEMBERS)")]
    TooManyMembers { limit: u64 },
    #[error("invalid or truncated archive: {0}")]
    Corrupt(String),
    /// The consumer of the sanitised tar went away (its own error says why).
    #[error("the sanitised archive could not be delivered")]
    OutputClosed,
}

/// Limits shared by all archives of one seed request, and what is left of them. Every entry the
/// sanitiser emits counts as a member, the parent directories it synthesises included: a name
/// like `a/a/…/a` would otherwise create thousands of directories for one member.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub max_bytes: u64,
    pub max_members: u64,
    pub bytes_used: u64,
    pub members_used: u64,
}

impl Budget {
    pub fn new(max_bytes: u64, max_members: u64) -> Self {
        Self {
            max_bytes,
            max_members,
            bytes_used: 0,
            members_used: 0,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub uid: u64,
    pub gid: u64,
    /// Every emitted name is put under this directory (e.g. `repo`), itself emitted first; the
    /// tar is extracted one level up (`/workspace`), so a missing or replaced destination is
    /// recreated with the sandbox's ownership.
    pub prefix: String,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub members: u64,
    pub skipped: u64,
}

/// `raw` for an error or a log line: lossy UTF-8, escaped and quoted like `{:?}`, and cut after
/// [`SHOWN_MAX`] characters with a marker giving its real length (`"abc"…(32768 bytes)`), so a
/// hostile name cannot make a response body or a log line grow with it.
pub fn shown(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut escaped = text.escape_debug();
    let mut out = String::with_capacity(SHOWN_MAX + 24);
    out.push('"');
    out.extend(escaped.by_ref().take(SHOWN_MAX));
    out.push('"');
    if escaped.next().is_some() {
        out.push_str(&format!("…({} bytes)", raw.len()));
    }
    out
}

/// Free text (such as a tar crate error, which may quote a header's name) cut like [`shown`].
fn cut(text: &str) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(SHOWN_MAX).collect();
    if chars.next().is_some() {
        format!("{head}…({} bytes)", text.len())
    } else {
        head
    }
}

/// Sanitises `input` (plain or compressed tar) into a plain tar on `output`.
pub fn sanitize<R: Read, W: Write>(
    input: R,
    output: W,
    opts: &Options,
    budget: &mut Budget,
) -> Result<Stats, SanitizeError> {
    let exceeded = Cell::new(false);
    let out_failed = Cell::new(false);
    let refused = Cell::new(None);
    let member_limit = budget.max_members;
    let size_limit = budget.max_bytes;
    let classify = |e: io::Error, exceeded: bool, out_failed: bool| {
        if exceeded {
            SanitizeError::TooLarge { limit: size_limit }
        } else if out_failed {
            SanitizeError::OutputClosed
        } else {
            SanitizeError::Corrupt(cut(&e.to_string()))
        }
    };
    let decoded = decoder(input).map_err(|e| classify(e, false, false))?;
    let members_used = budget.members_used;
    let counted = Counted {
        inner: decoded,
        budget,
        exceeded: &exceeded,
    };
    let mut archive = tar::Archive::new(TarGuard::new(counted, &refused));
    let mut builder = Builder::new(Watched {
        inner: output,
        failed: &out_failed,
    });
    let mut st = State::new(opts, members_used, member_limit);
    let mut archive_members = 0u64;
    let result = (|| -> Result<(), SanitizeError> {
        let io_err = |e: io::Error| match refused.take() {
            Some(r) => r,
            None => classify(e, exceeded.get(), out_failed.get()),
        };
        st.emit_root(&mut builder).map_err(io_err)?;
        let entries = archive.entries().map_err(io_err)?;
        for entry in entries {
            let entry = entry.map_err(io_err)?;
            let etype = entry.header().entry_type();
            if matches!(etype, EntryType::XGlobalHeader | EntryType::XHeader) {
                continue;
            }
            archive_members += 1;
            st.count_member().map_err(|e| match e {
                MemberError::Refused(r) => r,
                MemberError::Io(e) => io_err(e),
            })?;
            st.member(entry, &mut builder).map_err(|e| match e {
                MemberError::Refused(r) => r,
                MemberError::Io(e) => io_err(e),
            })?;
        }
        builder.finish().map_err(io_err)?;
        Ok(())
    })();
    drop(builder);
    drop(archive);
    budget.members_used = st.members_used;
    result?;
    if st.skipped > 0 {
        tracing::warn!(
            skipped = st.skipped,
            members = archive_members,
            prefix = %opts.prefix,
            "archive sanitisation dropped members"
        );
    }
    Ok(Stats {
        members: archive_members,
        skipped: st.skipped,
    })
}
