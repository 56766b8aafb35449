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

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::{self, Chain, Cursor, Read, Write};
use std::os::unix::ffi::OsStrExt;

use tar::{Builder, EntryType, Header};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Bzip2,
    Xz,
    Zstd,
}

/// Compression from the first bytes (magic numbers); anything else is read as a plain tar.
pub fn detect(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(b"BZh") {
        Compression::Bzip2
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
        Compression::Xz
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
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

type Peeked<R> = Chain<Cursor<Vec<u8>>, R>;

/// Reads up to 6 bytes to detect the compression, then returns a reader of the whole input,
/// decompressed.
fn decoder<'a, R: Read + 'a>(mut input: R) -> io::Result<Box<dyn Read + 'a>> {
    let mut head = Vec::with_capacity(6);
    let mut buf = [0u8; 6];
    while head.len() < 6 {
        let n = input.read(&mut buf[..6 - head.len()])?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let kind = detect(&head);
    let whole: Peeked<R> = Cursor::new(head).chain(input);
    Ok(match kind {
        Compression::None => Box::new(whole),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(whole)),
        Compression::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(whole)),
        Compression::Xz => Box::new(xz_decoder(whole, DECODER_MEMORY)?),
        Compression::Zstd => {
            let mut d = zstd::stream::read::Decoder::new(whole)?;
            // The format allows windows of up to 2 GiB; the archive says which it wants.
            d.window_log_max(DECODER_MEMORY.ilog2())?;
            Box::new(d)
        }
    })
}

/// Most memory a decompressor may take for its window or dictionary (xz -9 and zstd -19 fit):
/// an archive's header chooses it, so without a bound ~200 KB of upload could claim gigabytes.
const DECODER_MEMORY: u64 = 128 * 1024 * 1024;

/// An xz decoder (concatenated streams) that refuses archives needing more than `memlimit`.
fn xz_decoder<R: Read>(r: R, memlimit: u64) -> io::Result<liblzma::read::XzDecoder<R>> {
    let stream =
        liblzma::stream::Stream::new_stream_decoder(memlimit, liblzma::stream::CONCATENATED)
            .map_err(io::Error::other)?;
    Ok(liblzma::read::XzDecoder::new_stream(r, stream))
}

/// Counts decompressed bytes against the budget; going over is an error the tar reader passes up.
struct Counted<'a, R> {
    inner: R,
    budget: &'a mut Budget,
    exceeded: &'a Cell<bool>,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.budget.bytes_used += n as u64;
        if self.budget.bytes_used > self.budget.max_bytes {
            self.exceeded.set(true);
            return Err(io::Error::other("size limit exceeded"));
        }
        Ok(n)
    }
}

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
/// so that record is never read. The refusal is left in `refused` for [`sanitize`] to report;
/// the tar reader only sees an I/O error.
///
/// It tracks sizes exactly as tar 0.4's `next_entry_raw`/`next_entry` do: the size field through
/// [`Header::entry_size`] (octal or base-256), overridden by the `size` of a preceding PAX `x`
/// record (one with a ustar or GNU magic: others are plain members to the tar crate) for the
/// next header that is not itself an `L`, `K`, `x` or `g`.
struct TarGuard<'a, R> {
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
    fn new(inner: R, refused: &'a Cell<Option<SanitizeError>>) -> Self {
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

/// Remembers whether the consumer failed, so its error is not reported as a corrupt archive.
struct Watched<'a, W> {
    inner: W,
    failed: &'a Cell<bool>,
}

impl<W: Write> Write for Watched<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf).inspect_err(|_| self.failed.set(true))
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().inspect_err(|_| self.failed.set(true))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink,
}

/// The per-archive bookkeeping behind the rules in the module docs.
struct State {
    uid: u64,
    gid: u64,
    prefix: Vec<u8>,
    /// Every emitted name (relative to the root) and what it is.
    emitted: HashMap<Vec<u8>, Kind>,
    /// Directories that an accepted symlink target walked through lexically: a later symlink
    /// with one of these names would make that earlier target resolve elsewhere.
    walked: HashSet<Vec<u8>>,
    skipped: u64,
    /// Entries counted against the budget's member limit (all archives of the request so far).
    members_used: u64,
    member_limit: u64,
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
    let mut st = State {
        uid: opts.uid,
        gid: opts.gid,
        prefix: opts.prefix.as_bytes().to_vec(),
        emitted: HashMap::new(),
        walked: HashSet::new(),
        skipped: 0,
        members_used,
        member_limit,
    };
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

enum MemberError {
    Refused(SanitizeError),
    Io(io::Error),
}

impl From<io::Error> for MemberError {
    fn from(e: io::Error) -> Self {
        MemberError::Io(e)
    }
}

/// `name` split into components, or `None` for the root itself (`.`, `./`).
fn normalize(raw: &[u8]) -> Result<Option<Vec<&[u8]>>, SanitizeError> {
    if raw.len() as u64 >= PATH_MAX {
        return Err(SanitizeError::NameTooLong);
    }
    if raw.starts_with(b"/") {
        return Err(SanitizeError::Absolute(shown(raw)));
    }
    let comps: Vec<&[u8]> = raw
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    if comps.iter().any(|c| *c == b"..") {
        return Err(SanitizeError::Traversal(shown(raw)));
    }
    Ok((!comps.is_empty()).then_some(comps))
}

/// Modes as `chmod a+rX,u+w`, special bits cleared.
pub fn normalize_mode(mode: u32, is_dir: bool) -> u32 {
    let base = mode & 0o777;
    let mut m = base | 0o444 | 0o200;
    if is_dir || base & 0o111 != 0 {
        m |= 0o111;
    }
    m
}

impl State {
    fn out_name(&self, rel: &[u8]) -> Vec<u8> {
        let mut n = self.prefix.clone();
        n.push(b'/');
        n.extend_from_slice(rel);
        n
    }

    fn header(&self, kind: EntryType, mode: u32, mtime: u64) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(self.uid);
        h.set_gid(self.gid);
        h.set_mtime(mtime);
        h.set_size(0);
        h
    }

    fn emit_root<W: Write>(&mut self, b: &mut Builder<W>) -> io::Result<()> {
        let mut h = self.header(EntryType::Directory, 0o755, 0);
        let name = self.prefix.clone();
        b.append_data(&mut h, OsStr::from_bytes(&name), io::empty())
    }

    /// One more entry against the member limit.
    fn count_member(&mut self) -> Result<(), MemberError> {
        self.members_used += 1;
        if self.members_used > self.member_limit {
            return Err(MemberError::Refused(SanitizeError::TooManyMembers {
                limit: self.member_limit,
            }));
        }
        Ok(())
    }

    fn emit_dir<W: Write>(
        &mut self,
        b: &mut Builder<W>,
        rel: &[u8],
        mode: u32,
        mtime: u64,
    ) -> io::Result<()> {
        let mut h = self.header(EntryType::Directory, mode, mtime);
        let name = self.out_name(rel);
        b.append_data(&mut h, OsStr::from_bytes(&name), io::empty())?;
        self.emitted.insert(rel.to_vec(), Kind::Dir);
        Ok(())
    }

    /// Sandbox-owned entries for every ancestor not yet emitted, top-down; each one counts as a
    /// member.
    fn ensure_parents<W: Write>(
        &mut self,
        b: &mut Builder<W>,
        comps: &[&[u8]],
    ) -> Result<(), MemberError> {
        for i in 1..comps.len() {
            let ancestor = comps[..i].join(&b'/');
            if !self.emitted.contains_key(&ancestor) {
                self.count_member()?;
                self.emit_dir(b, &ancestor, 0o755, 0)?;
            }
        }
        Ok(())
    }

    /// Whether some proper ancestor of `comps` was emitted as anything but a directory.
    fn ancestor_not_dir(&self, comps: &[&[u8]]) -> Option<Kind> {
        (1..comps.len()).find_map(|i| {
            let ancestor = comps[..i].join(&b'/');
            self.emitted
                .get(&ancestor)
                .copied()
                .filter(|k| *k != Kind::Dir)
        })
    }

    fn skip(&mut self, name: &[u8], why: &str) {
        self.skipped += 1;
        tracing::warn!(member = %shown(name), reason = why, "skipping archive member");
    }

    fn member<R: Read, W: Write>(
        &mut self,
        mut entry: tar::Entry<'_, R>,
        b: &mut Builder<W>,
    ) -> Result<(), MemberError> {
        let raw = entry.path_bytes().into_owned();
        let Some(comps) = normalize(&raw).map_err(MemberError::Refused)? else {
            return Ok(());
        };
        let rel = comps.join(&b'/');
        let header = entry.header();
        let mut etype = header.entry_type();
        if etype.is_file() && raw.ends_with(b"/") {
            etype = EntryType::Directory; // pre-POSIX tars mark directories by a trailing slash
        }
        let mode = header.mode()?;
        let mtime = header.mtime().unwrap_or(0);
        let kind = match etype {
            EntryType::Regular | EntryType::Continuous => Kind::File,
            EntryType::Directory => Kind::Dir,
            EntryType::Symlink => Kind::Symlink,
            _ => {
                self.skip(
                    &raw,
                    "unsupported type: only files, directories and symlinks",
                );
                return Ok(());
            }
        };
        if kind == Kind::Symlink
            && entry
                .link_name_bytes()
                .is_some_and(|t| t.len() as u64 >= PATH_MAX)
        {
            return Err(MemberError::Refused(SanitizeError::LinkTooLong));
        }
        match self.ancestor_not_dir(&comps) {
            Some(Kind::Symlink) => {
                self.skip(&raw, "path traverses a symlink");
                return Ok(());
            }
            Some(_) => {
                self.skip(&raw, "a parent path is a file");
                return Ok(());
            }
            None => {}
        }
        if let Some(prev) = self.emitted.get(&rel).copied() {
            if !(prev == Kind::Dir && kind == Kind::Dir) {
                self.skip(&raw, "name already used by an earlier member (first wins)");
            }
            return Ok(());
        }
        match kind {
            Kind::Dir => {
                self.ensure_parents(b, &comps)?;
                self.emit_dir(b, &rel, normalize_mode(mode, true), mtime)?;
            }
            Kind::Symlink => {
                let target = entry.link_name_bytes().map(|t| t.into_owned());
                let Some(target) = target else {
                    self.skip(&raw, "symlink without a target");
                    return Ok(());
                };

                let Some(walked) = self.target_walk(&comps, &target) else {
                    self.skip(&raw, "symlink target is absolute or escapes the root");
                    return Ok(());
                };
                if self.walked.contains(&rel) || walked.contains(&rel) {
                    self.skip(&raw, "an earlier symlink's target walks through this name");
                    return Ok(());
                }
                self.ensure_parents(b, &comps)?;
                let mut h = self.header(EntryType::Symlink, 0o777, mtime);
                let name = self.out_name(&rel);
                b.append_link(&mut h, OsStr::from_bytes(&name), OsStr::from_bytes(&target))?;
                self.emitted.insert(rel, Kind::Symlink);
                self.walked.extend(walked);
            }
            Kind::File => {
                self.ensure_parents(b, &comps)?;
                let mut h = self.header(EntryType::Regular, normalize_mode(mode, false), mtime);
                h.set_size(entry.size());
                let name = self.out_name(&rel);
                b.append_data(&mut h, OsStr::from_bytes(&name), &mut entry)?;
                self.emitted.insert(rel, Kind::File);
            }
        }
        Ok(())
    }

    /// The directories a relative symlink target walks through, or `None` when the target is
    /// absolute, empty, climbs above the root, or passes through an emitted symlink (lexical
    /// `..` is meaningless there). The final component may itself be a symlink.
    fn target_walk(&self, name: &[&[u8]], target: &[u8]) -> Option<Vec<Vec<u8>>> {
        if target.is_empty() || target.starts_with(b"/") {
            return None;
        }
        let mut cur: Vec<&[u8]> = name[..name.len() - 1].to_vec();
        let steps: Vec<&[u8]> = target
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect();
        let mut walked = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            if *step == b".." {
                cur.pop()?;
            } else {
                cur.push(step);
            }
            if i + 1 < steps.len() && !cur.is_empty() {
                let prefix = cur.join(&b'/');
                if self.emitted.get(&prefix) == Some(&Kind::Symlink) {
                    return None;
                }
                walked.push(prefix);
            }
        }
        Some(walked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Member = (&'static str, EntryType, &'static str, u32);

    fn archive(members: &[Member]) -> Vec<u8> {
        let mut b = Builder::new(Vec::new());
        for (name, kind, data_or_target, mode) in members {
            let mut h = Header::new_ustar();
            h.set_entry_type(*kind);
            h.set_mode(*mode);
            h.set_uid(0);
            h.set_gid(0);
            // Write names raw: the tar crate's setters refuse `..` and absolute names, which is
            // exactly what a hostile archive carries.
            let raw = name.as_bytes();
            h.as_old_mut().name[..raw.len()].copy_from_slice(raw);
            if *kind == EntryType::Symlink || *kind == EntryType::Link {
                let t = data_or_target.as_bytes();
                h.as_old_mut().linkname[..t.len()].copy_from_slice(t);
                h.set_size(0);
                h.set_cksum();
                b.append(&h, io::empty()).unwrap_or_default();
            } else {
                h.set_size(data_or_target.len() as u64);
                h.set_cksum();
                b.append(&h, data_or_target.as_bytes()).unwrap_or_default();
            }
        }
        b.into_inner().unwrap_or_default()
    }

    #[derive(Debug, PartialEq)]
    struct Out {
        name: String,
        kind: EntryType,
        mode: u32,
        uid: u64,
        gid: u64,
        link: Option<String>,
        data: String,
    }

    fn run(input: &[u8]) -> Result<(Vec<Out>, Stats), SanitizeError> {
        run_from(input)
    }

    fn run_from(input: impl Read) -> Result<(Vec<Out>, Stats), SanitizeError> {
        let mut out = Vec::new();
        let mut budget = Budget::new(1 << 30, 1000);
        let opts = Options {
            uid: 1000,
            gid: 1001,
            prefix: "repo".into(),
        };
        let stats = sanitize(input, &mut out, &opts, &mut budget)?;
        let mut a = tar::Archive::new(&out[..]);
        let mut v = Vec::new();
        for e in a
            .entries()
            .map_err(|e| SanitizeError::Corrupt(e.to_string()))?
        {
            let mut e = e.map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
            let mut data = String::new();
            e.read_to_string(&mut data).unwrap_or_default();
            let h = e.header();
            v.push(Out {
                name: String::from_utf8_lossy(&e.path_bytes())
                    .trim_end_matches('/')
                    .to_string(),
                kind: h.entry_type(),
                mode: h.mode().unwrap_or(0),
                uid: h.uid().unwrap_or(0),
                gid: h.gid().unwrap_or(0),
                link: e
                    .link_name_bytes()
                    .map(|l| String::from_utf8_lossy(&l).into_owned()),
                data,
            });
        }
        Ok((v, stats))
    }

    fn names(v: &[Out]) -> Vec<&str> {
        v.iter().map(|o| o.name.as_str()).collect()
    }

    const F: EntryType = EntryType::Regular;
    const D: EntryType = EntryType::Directory;
    const L: EntryType = EntryType::Symlink;

    #[test]
    fn absolute_names_reject_the_archive() {
        let r = run(&archive(&[("/etc/passwd", F, "x", 0o644)]));
        assert!(matches!(r, Err(SanitizeError::Absolute(_))), "{r:?}");
    }

    #[test]
    fn dotdot_rejects_the_archive() {
        for name in ["../evil", "a/../../evil", "a/.."] {
            let r = run(&archive(&[(name, F, "x", 0o644)]));
            assert!(
                matches!(r, Err(SanitizeError::Traversal(_))),
                "{name}: {r:?}"
            );
        }
    }

    #[test]
    fn leading_dot_slash_is_stripped_and_root_entries_ignored() -> Result<(), SanitizeError> {
        let (v, s) = run(&archive(&[
            ("./", D, "", 0o755),
            ("./a.txt", F, "hi", 0o644),
        ]))?;
        assert_eq!(names(&v), ["repo", "repo/a.txt"]);
        assert_eq!(v[1].data, "hi");
        assert_eq!(s.skipped, 0);
        Ok(())
    }

    #[test]
    fn ownership_is_the_sandbox_user() -> Result<(), SanitizeError> {
        let (v, _) = run(&archive(&[("d/", D, "", 0o700), ("d/f", F, "x", 0o600)]))?;
        assert!(v.iter().all(|o| o.uid == 1000 && o.gid == 1001), "{v:?}");
        Ok(())
    }

    #[test]
    fn modes_are_normalised_like_chmod_a_plus_r_big_x_u_plus_w() -> Result<(), SanitizeError> {
        let (v, _) = run(&archive(&[
            ("d/", D, "", 0o700),
            ("d/plain", F, "x", 0o400),
            ("d/exec", F, "x", 0o700),
        ]))?;
        let mode = |n: &str| v.iter().find(|o| o.name == n).map(|o| o.mode);
        assert_eq!(mode("repo/d"), Some(0o755));
        assert_eq!(mode("repo/d/plain"), Some(0o644));
        assert_eq!(mode("repo/d/exec"), Some(0o755));
        Ok(())
    }

    #[test]
    fn setuid_setgid_sticky_are_cleared() -> Result<(), SanitizeError> {
        let (v, _) = run(&archive(&[("s", F, "x", 0o6755), ("t/", D, "", 0o1777)]))?;
        assert!(v.iter().all(|o| o.mode & 0o7000 == 0), "{v:?}");
        Ok(())
    }

    #[test]
    fn hardlinks_devices_fifos_are_dropped_and_counted() -> Result<(), SanitizeError> {
        let (v, s) = run(&archive(&[
            ("f", F, "x", 0o644),
            ("hard", EntryType::Link, "f", 0o644),
            ("dev", EntryType::Char, "", 0o644),
            ("blk", EntryType::Block, "", 0o644),
            ("fifo", EntryType::Fifo, "", 0o644),
        ]))?;
        assert_eq!(names(&v), ["repo", "repo/f"]);
        assert_eq!(s.skipped, 4);
        Ok(())
    }

    #[test]
    fn missing_parents_are_synthesised_with_sandbox_ownership() -> Result<(), SanitizeError> {
        let (v, _) = run(&archive(&[("a/b/c.txt", F, "x", 0o644)]))?;
        assert_eq!(names(&v), ["repo", "repo/a", "repo/a/b", "repo/a/b/c.txt"]);
        assert!(v[1].kind == D && v[1].mode == 0o755 && v[1].uid == 1000);
        Ok(())
    }

    #[test]
    fn duplicate_names_first_wins() -> Result<(), SanitizeError> {
        let (v, s) = run(&archive(&[
            ("f", F, "first", 0o644),
            ("f", F, "second", 0o644),
            ("f", D, "", 0o755),
        ]))?;
        assert_eq!(names(&v), ["repo", "repo/f"]);
        assert_eq!(v[1].data, "first");
        assert_eq!(s.skipped, 2);
        Ok(())
    }

    #[test]
    fn relative_inside_symlinks_are_kept() -> Result<(), SanitizeError> {
        let (v, s) = run(&archive(&[
            ("docs/readme", F, "x", 0o644),
            ("docs/link", L, "readme", 0o777),
            ("top", L, "docs/../docs/readme", 0o777),
        ]))?;
        assert_eq!(s.skipped, 0);
        assert_eq!(v.iter().filter(|o| o.kind == L).count(), 2);
        Ok(())
    }

    #[test]
    fn absolute_and_escaping_symlinks_are_dropped() -> Result<(), SanitizeError> {
        let (v, s) = run(&archive(&[
            ("abs", L, "/etc/passwd", 0o777),
            ("up", L, "../outside", 0o777),
            ("a/deep", L, "../../outside", 0o777),
            ("empty", L, "", 0o777),
        ]))?;
        assert_eq!(names(&v), ["repo"]);
        assert_eq!(s.skipped, 4);
        Ok(())
    }

    #[test]
    fn symlink_chains_through_earlier_symlinks_are_refused() -> Result<(), SanitizeError> {
        // a/b -> .. is inside, but c -> a/b/../z would really resolve through it, above the root.
        let (v, s) = run(&archive(&[
            ("a/b", L, "..", 0o777),
            ("c", L, "a/b/../z", 0o777),
        ]))?;
        assert_eq!(names(&v), ["repo", "repo/a", "repo/a/b"]);
        assert_eq!(s.skipped, 1);
        // The same pair in the other order: the later symlink is refused instead.
        let (v, s) = run(&archive(&[
            ("c", L, "a/b/../z", 0o777),
            ("a/b", L, "..", 0o777),
        ]))?;
        assert_eq!(names(&v), ["repo", "repo/c"]);
        assert_eq!(s.skipped, 1);
        Ok(())
    }

    #[test]
    fn no_write_through_or_over_a_symlink() -> Result<(), SanitizeError> {
        let (v, s) = run(&archive(&[
            ("d/", D, "", 0o755),
            ("link", L, "d", 0o777),
            ("link/f", F, "through", 0o644),
            ("link", F, "over", 0o644),
            ("d", L, "x", 0o777),
        ]))?;
        assert_eq!(names(&v), ["repo", "repo/d", "repo/link"]);
        assert_eq!(s.skipped, 3);
        Ok(())
    }

    #[test]
    fn a_file_is_never_a_parent() -> Result<(), SanitizeError> {
        let (v, s) = run(&archive(&[("f", F, "x", 0o644), ("f/g", F, "y", 0o644)]))?;
        assert_eq!(names(&v), ["repo", "repo/f"]);
        assert_eq!(s.skipped, 1);
        Ok(())
    }

    #[test]
    fn limits_are_enforced() {
        let big = "x".repeat(10_000);
        let input = archive(&[("a", F, Box::leak(big.into_boxed_str()), 0o644)]);
        let opts = Options {
            uid: 1,
            gid: 1,
            prefix: "repo".into(),
        };
        let mut budget = Budget::new(4096, 100);
        let r = sanitize(&input[..], io::sink(), &opts, &mut budget);
        assert!(
            matches!(r, Err(SanitizeError::TooLarge { limit: 4096 })),
            "{r:?}"
        );
        let input = archive(&[
            ("a", F, "", 0o644),
            ("b", F, "", 0o644),
            ("c", F, "", 0o644),
        ]);
        let mut budget = Budget::new(1 << 20, 2);
        let r = sanitize(&input[..], io::sink(), &opts, &mut budget);
        assert!(
            matches!(r, Err(SanitizeError::TooManyMembers { limit: 2 })),
            "{r:?}"
        );
    }

    #[test]
    fn synthesised_parents_count_as_members() {
        // Found by fuzz/fuzz_targets/sanitize.rs (fuzz/regressions/sanitize/): one member with a
        // deep name emitted a directory per component, none of them counted, so 200,000 members
        // could create hundreds of millions of directories.
        let opts = Options {
            uid: 1,
            gid: 1,
            prefix: "repo".into(),
        };
        let input = archive(&[("a/b/c/d.txt", F, "x", 0o644)]);
        let mut budget = Budget::new(1 << 20, 3);
        let r = sanitize(&input[..], io::sink(), &opts, &mut budget);
        assert!(
            matches!(r, Err(SanitizeError::TooManyMembers { limit: 3 })),
            "{r:?}"
        );
        let mut budget = Budget::new(1 << 20, 4);
        let stats = sanitize(&input[..], io::sink(), &opts, &mut budget);
        assert!(matches!(stats, Ok(Stats { members: 1, .. })), "{stats:?}");
        assert_eq!(budget.members_used, 4);
        // A 4000-byte name of 2000 components, in a GNU long-name record.
        let mut rec = "a/".repeat(1999).into_bytes();
        rec.extend_from_slice(b"f\0");
        let mut input = block(b'L', b"././@LongLink", rec.len() as u64, false);
        input.extend(padded(&rec));
        input.extend(block(b'0', b"short", 0, false));
        input.extend(end());
        let mut out = Vec::new();
        let mut budget = Budget::new(1 << 30, 1000);
        let r = sanitize(&input[..], &mut out, &opts, &mut budget);
        assert!(
            matches!(r, Err(SanitizeError::TooManyMembers { limit: 1000 })),
            "{r:?}"
        );
        assert!(out.len() < 4 << 20, "{} bytes emitted", out.len());
    }

    #[test]
    fn garbage_is_corrupt_and_compression_is_detected() -> Result<(), SanitizeError> {
        let r = run(b"this is not a tar archive at all, just some text that goes on and on .......................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................");
        assert!(matches!(r, Err(SanitizeError::Corrupt(_))), "{r:?}");
        let plain = archive(&[("a.txt", F, "hello", 0o644)]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&plain)
            .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
        let gz = gz
            .finish()
            .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
        let zst =
            zstd::encode_all(&plain[..], 1).map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
        let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
        bz.write_all(&plain)
            .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
        let bz = bz
            .finish()
            .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
        let mut xz = liblzma::write::XzEncoder::new(Vec::new(), 1);
        xz.write_all(&plain)
            .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
        let xz = xz
            .finish()
            .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
        for (kind, bytes) in [
            (Compression::None, &plain),
            (Compression::Gzip, &gz),
            (Compression::Zstd, &zst),
            (Compression::Bzip2, &bz),
            (Compression::Xz, &xz),
        ] {
            assert_eq!(detect(bytes), kind);
            let (v, _) = run(bytes)?;
            assert_eq!(v[1].data, "hello", "{kind:?}");
        }
        Ok(())
    }

    // === The memory bounds (TarGuard) and hostile names in messages ===

    const MIB: u64 = 1 << 20;

    /// A GNU-magic header block; `size` written octal, or base-256 when `base256`.
    fn block(kind: u8, name: &[u8], size: u64, base256: bool) -> Vec<u8> {
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::new(kind));
        h.set_mode(0o644);
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        if base256 {
            let field = &mut h.as_old_mut().size;
            field.fill(0);
            field[0] = 0x80;
            field[4..].copy_from_slice(&size.to_be_bytes());
        } else {
            h.set_size(size);
        }
        h.set_cksum();
        h.as_bytes().to_vec()
    }

    /// `data` padded to whole blocks.
    fn padded(data: &[u8]) -> Vec<u8> {
        let mut v = data.to_vec();
        v.resize(data.len().div_ceil(512) * 512, 0);
        v
    }

    /// A PAX record: `len key=value\n`, the length counting itself.
    fn pax_record(key: &str, value: &str) -> Vec<u8> {
        let rest = format!(" {key}={value}\n");
        let mut len = rest.len() + 1;
        while format!("{len}{rest}").len() != len {
            len += 1;
        }
        format!("{len}{rest}").into_bytes()
    }

    fn end() -> Vec<u8> {
        vec![0; 1024]
    }

    /// A reader counting the bytes pulled from it.
    struct Pulled<R> {
        inner: R,
        n: std::rc::Rc<Cell<u64>>,
    }

    impl<R: Read> Read for Pulled<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.n.set(self.n.get() + n as u64);
            Ok(n)
        }
    }

    /// Sanitises `head` followed by `tail` bytes of `a`, the way a 100 MiB hostile record would
    /// arrive; returns the result and how many bytes were pulled from the input.
    fn run_counted(head: Vec<u8>, tail: u64) -> (Result<(Vec<Out>, Stats), SanitizeError>, u64) {
        let n = std::rc::Rc::new(Cell::new(0));
        let input = Pulled {
            inner: Cursor::new(head).chain(io::repeat(b'a').take(tail)),
            n: n.clone(),
        };
        let r = run_from(input);
        (r, n.get())
    }

    #[test]
    fn oversized_long_name_link_and_pax_records_fail_before_they_are_read() {
        for (kind, size, what) in [
            (b'L', 100 * MIB, "L"),
            (b'K', 100 * MIB, "K"),
            (b'x', 100 * MIB, "x"),
            (b'g', 100 * MIB, "g"),
            (b'L', PATH_MAX + 1, "L just over"),
            (b'x', PAX_MAX + 1, "x just over"),
        ] {
            let (r, pulled) = run_counted(block(kind, b"././@LongLink", size, false), size);
            match (kind, &r) {
                (b'L', Err(SanitizeError::NameTooLong))
                | (b'K', Err(SanitizeError::LinkTooLong))
                | (b'x' | b'g', Err(SanitizeError::PaxTooLarge { .. })) => {}
                _ => panic!("{what}: {r:?}"),
            }
            assert!(pulled < MIB, "{what}: {pulled} bytes read");
        }
        let e = run_counted(block(b'L', b"x", 100 * MIB, false), 0).0.err();
        assert_eq!(
            e.map(|e| e.to_string()).as_deref(),
            Some(
                "archive member name is longer than 4095 bytes (PATH_MAX is 4096 with the terminating NUL)"
            )
        );
    }

    #[test]
    fn a_compressed_bomb_in_a_long_name_record_is_not_decompressed() -> Result<(), SanitizeError> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let io = |e: io::Error| SanitizeError::Corrupt(e.to_string());
        gz.write_all(&block(b'L', b"././@LongLink", 100 * MIB, false))
            .map_err(io)?;
        io::copy(&mut io::repeat(b'a').take(8 * MIB), &mut gz).map_err(io)?;
        let gz = gz.finish().map_err(io)?;
        let mut budget = Budget::new(1 << 30, 1000);
        let opts = Options {
            uid: 1,
            gid: 1,
            prefix: "repo".into(),
        };
        let r = sanitize(&gz[..], io::sink(), &opts, &mut budget);
        assert!(matches!(r, Err(SanitizeError::NameTooLong)), "{r:?}");
        assert!(
            budget.bytes_used < MIB,
            "{} bytes decompressed",
            budget.bytes_used
        );
        Ok(())
    }

    #[test]
    fn names_and_link_targets_up_to_path_max_pass_and_longer_ones_are_refused() {
        // Through GNU L/K records, as the tar crate's Builder writes them (name + NUL).
        let long = |len: usize| "n".repeat(len);
        let build = |file: &str, link: Option<&str>| {
            let mut b = Builder::new(Vec::new());
            let mut h = Header::new_gnu();
            h.set_size(2);
            h.set_mode(0o644);
            b.append_data(&mut h, file, &b"hi"[..]).unwrap_or_default();
            if let Some(target) = link {
                let mut h = Header::new_gnu();
                h.set_entry_type(EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, "link", target).unwrap_or_default();
            }
            b.into_inner().unwrap_or_default()
        };
        let ok = long(4095);
        let r = run(&build(&ok, Some(&ok)));
        let (v, s) = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.skipped, 0);
        assert_eq!(v.last().map(|o| o.link.as_deref()), Some(Some(ok.as_str())));
        assert!(
            v.iter()
                .any(|o| o.name == format!("repo/{ok}") && o.data == "hi")
        );
        let too_long = long(4097);
        let r = run(&build(&too_long, None));
        assert!(matches!(r, Err(SanitizeError::NameTooLong)), "{r:?}");
        let r = run(&build("f", Some(&too_long)));
        assert!(matches!(r, Err(SanitizeError::LinkTooLong)), "{r:?}");
        // Through PAX `path` / `linkpath`, which the PAX bound lets reach 64 KiB.
        let big = "a".repeat(5000);
        for (key, want_name) in [("path", true), ("linkpath", false)] {
            let rec = pax_record(key, &big);
            let mut input = block(b'x', b"pax", rec.len() as u64, false);
            input.extend(padded(&rec));
            input.extend(block(b'2', b"link", 0, false));
            input.extend(end());
            let r = run(&input);
            match r {
                Err(SanitizeError::NameTooLong) if want_name => {}
                Err(SanitizeError::LinkTooLong) if !want_name => {}
                r => panic!("{key}: {r:?}"),
            }
        }
    }

    /// Data that is a valid, hostile `L` header: only a tracker that lost the block structure
    /// takes it for one.
    fn decoy(len: usize) -> Vec<u8> {
        let mut d = block(b'L', b"././@LongLink", 100 * MIB, false);
        d.resize(len, b'z');
        d
    }

    #[test]
    fn a_pax_size_overrides_the_header_size_and_tracking_follows_it() -> Result<(), SanitizeError> {
        // The header says 0, PAX says 1024: the 1024 bytes (a decoy header) are data.
        let rec = pax_record("size", "1024");
        let mut input = block(b'x', b"pax", rec.len() as u64, false);
        input.extend(padded(&rec));
        input.extend(block(b'0', b"big", 0, false));
        input.extend(decoy(1024));
        input.extend(block(b'0', b"after", 2, false));
        input.extend(padded(b"ok"));
        input.extend(end());
        let (v, _) = run(&input)?;
        assert_eq!(names(&v), ["repo", "repo/big", "repo/after"]);
        assert_eq!(v[1].data.len(), 1024);
        assert_eq!(v[2].data, "ok");
        // The header says 1024, PAX says 0: the next block is a header, and a hostile one.
        let rec = pax_record("size", "0");
        let mut input = block(b'x', b"pax", rec.len() as u64, false);
        input.extend(padded(&rec));
        input.extend(block(b'0', b"empty", 1024, false));
        input.extend(block(b'L', b"././@LongLink", 100 * MIB, false));
        let (r, pulled) = run_counted(input, 100 * MIB);
        assert!(matches!(r, Err(SanitizeError::NameTooLong)), "{r:?}");
        assert!(pulled < MIB, "{pulled}");
        // Like the tar crate, no override from a PAX record without ustar/GNU magic (a plain
        // member to it), nor across a global header (which takes the pending record).
        let mut v7 = Header::new_old();
        v7.set_entry_type(EntryType::XHeader);
        v7.set_size(rec.len() as u64);
        v7.set_cksum();
        let global = pax_record("comment", "hi");
        for lead in [
            [v7.as_bytes().to_vec(), padded(&rec)].concat(),
            [
                block(b'x', b"pax", rec.len() as u64, false),
                padded(&rec),
                block(b'g', b"global", global.len() as u64, false),
                padded(&global),
            ]
            .concat(),
        ] {
            let mut input = lead;
            input.extend(block(b'0', b"big", 1024, false));
            input.extend(decoy(1024));
            input.extend(end());
            let (v, _) = run(&input)?;
            assert_eq!(names(&v), ["repo", "repo/big"]);
            assert_eq!(v[1].data.len(), 1024);
        }
        Ok(())
    }

    #[test]
    fn base256_sizes_are_followed() -> Result<(), SanitizeError> {
        let mut input = block(b'0', b"b256", 600, true);
        input.extend(padded(&decoy(600)));
        input.extend(block(b'0', b"after", 2, false));
        input.extend(padded(b"ok"));
        input.extend(end());
        let (v, _) = run(&input)?;
        assert_eq!(names(&v), ["repo", "repo/b256", "repo/after"]);
        assert_eq!(v[1].data.len(), 600);
        assert_eq!(v[2].data, "ok");
        let mut input = block(b'0', b"b256", 600, true);
        input.extend(padded(&[b'x'; 600]));
        input.extend(block(b'L', b"././@LongLink", 100 * MIB, true));
        let (r, pulled) = run_counted(input, 100 * MIB);
        assert!(matches!(r, Err(SanitizeError::NameTooLong)), "{r:?}");
        assert!(pulled < MIB, "{pulled}");
        Ok(())
    }

    #[test]
    fn gnu_sparse_members_refuse_the_archive() {
        let mut input = block(b'S', b"holes", 0, false);
        input.extend(end());
        let r = run(&input);
        match r {
            Err(e @ SanitizeError::Sparse(_)) => {
                assert!(
                    e.to_string().contains("\"holes\" is a GNU sparse file"),
                    "{e}"
                );
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn hostile_names_are_cut_in_messages() {
        assert_eq!(shown(b"a\"b\n"), r#""a\"b\n""#);
        let long = format!("../{}", "a".repeat(32 * 1024));
        let s = shown(long.as_bytes());
        assert_eq!(
            s.chars().count(),
            SHOWN_MAX + 2 + "…(32771 bytes)".chars().count()
        );
        assert!(s.ends_with("\"…(32771 bytes)"), "{s}");
        // Escapes count: 200 characters of output, whatever the input.
        let ctl = vec![1u8; 1000];
        assert!(shown(&ctl).len() < SHOWN_MAX + 40, "{}", shown(&ctl));
        assert!(cut(&"e".repeat(1000)).ends_with("…(1000 bytes)"));
        // A traversal with a name just under PATH_MAX: the message stays short.
        let name = format!("../{}", "a".repeat(4000));
        // The Builder refuses `..`: write the L record by hand.
        let mut rec = name.clone().into_bytes();
        rec.push(0);
        let mut input = block(b'L', b"././@LongLink", rec.len() as u64, false);
        input.extend(padded(&rec));
        input.extend(block(b'0', b"short", 0, false));
        input.extend(end());
        let r = run(&input);
        let msg = match r {
            Err(e @ SanitizeError::Traversal(_)) => e.to_string(),
            r => panic!("{r:?}"),
        };
        assert!(msg.len() < 300, "{} bytes: {msg}", msg.len());
        assert!(msg.ends_with("…(4003 bytes)"), "{msg}");
    }

    mod roundtrip {
        use super::*;
        use proptest::prelude::*;

        /// Hands out the input in the chunk sizes given, round and round.
        struct Chunked<'a> {
            data: &'a [u8],
            sizes: Vec<usize>,
            i: usize,
        }

        impl Read for Chunked<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let want = self.sizes[self.i % self.sizes.len()];
                self.i += 1;
                let n = want.min(buf.len()).min(self.data.len());
                buf[..n].copy_from_slice(&self.data[..n]);
                self.data = &self.data[n..];
                Ok(n)
            }
        }

        /// How a generated member is written.
        #[derive(Debug, Clone, Copy)]
        enum Style {
            /// The Builder's own way: a GNU `L` record when the name is long.
            Plain,
            /// After a PAX record with a comment and a matching `size`.
            PaxComment,
            /// Header size 0, the real size in a PAX record only.
            PaxSizeOnly,
            /// The name in a PAX `path` record (header name short).
            PaxPath,
        }

        fn style() -> impl Strategy<Value = Style> {
            prop_oneof![
                Just(Style::Plain),
                Just(Style::PaxComment),
                Just(Style::PaxSizeOnly),
                Just(Style::PaxPath),
            ]
        }

        type Want = (String, EntryType, String, Option<String>);

        /// An archive of generated members (name length, data length, style, plus a symlink to
        /// it), and the sanitised members it calls for.
        fn build(members: &[(usize, usize, Style, bool)]) -> io::Result<(Vec<u8>, Vec<Want>)> {
            let mut b = Builder::new(Vec::new());
            let mut want: Vec<Want> = vec![("repo".into(), D, String::new(), None)];
            for (i, (name_len, data_len, style, link)) in members.iter().enumerate() {
                let name = format!("{i}-{}", "n".repeat(*name_len));
                let data: String = (0..*data_len)
                    .map(|j| (b'a' + ((i + j) % 26) as u8) as char)
                    .collect();
                let mut h = Header::new_gnu();
                h.set_mode(0o644);
                h.set_size(data.len() as u64);
                let size = data.len().to_string();
                let mut records: Vec<(&str, &[u8])> = vec![("size", size.as_bytes())];
                match style {
                    Style::Plain => records.clear(),
                    Style::PaxComment => records.push(("comment", &b"generated"[..])),
                    Style::PaxSizeOnly => h.set_size(0),
                    Style::PaxPath => records.push(("path", name.as_bytes())),
                }
                if !records.is_empty() {
                    b.append_pax_extensions(records)?;
                }
                if matches!(style, Style::PaxPath) {
                    h.set_path("short")?;
                    h.set_cksum();
                    b.append(&h, data.as_bytes())?;
                } else {
                    b.append_data(&mut h, &name, data.as_bytes())?;
                }
                want.push((format!("repo/{name}"), F, data, None));
                if *link {
                    let mut h = Header::new_gnu();
                    h.set_entry_type(L);
                    h.set_mode(0o777);
                    h.set_size(0);
                    let link_name = format!("l{i}");
                    b.append_link(&mut h, &link_name, &name)?;
                    want.push((format!("repo/{link_name}"), L, String::new(), Some(name)));
                }
            }
            Ok((b.into_inner()?, want))
        }

        fn fail(e: impl std::fmt::Display) -> TestCaseError {
            TestCaseError::fail(e.to_string())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]
            #[test]
            fn normal_archives_sanitise_as_before(
                members in proptest::collection::vec(
                    (1usize..4000, 0usize..1500, style(), any::<bool>()),
                    1..6,
                ),
                sizes in proptest::collection::vec(1usize..1300, 1..5),
            ) {
                let (input, want) = build(&members).map_err(fail)?;
                // The guard passes every byte on, unchanged, and refuses nothing.
                let refused = Cell::new(None);
                let mut through = Vec::new();
                let chunked = Chunked { data: &input, sizes: sizes.clone(), i: 0 };
                TarGuard::new(chunked, &refused).read_to_end(&mut through).map_err(fail)?;
                prop_assert!(through == input);
                prop_assert!(refused.take().is_none());
                // And the sanitised archive is what the members call for.
                let (out, stats) = run_from(Chunked { data: &input, sizes, i: 0 }).map_err(fail)?;
                prop_assert_eq!(stats.skipped, 0);
                let got: Vec<Want> =
                    out.into_iter().map(|o| (o.name, o.kind, o.data, o.link)).collect();
                prop_assert_eq!(got, want);
            }
        }
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        /// Resolves `path` (components under the root) through the emitted tree, following
        /// symlinks like the kernel: `Ok(None)` when it leaves the root, `Err(())` for a loop
        /// (ELOOP: harmless, nothing is written).
        fn resolve(
            tree: &HashMap<String, (EntryType, String)>,
            path: &[String],
            depth: u32,
        ) -> Result<Option<Vec<String>>, ()> {
            if depth > 40 {
                return Err(());
            }
            let mut cur: Vec<String> = Vec::new();
            for comp in path {
                if comp == ".." {
                    if cur.pop().is_none() {
                        return Ok(None);
                    }
                    continue;
                }
                cur.push(comp.clone());
                let key = cur.join("/");
                if let Some((L, target)) = tree.get(&key).map(|(k, t)| (*k, t)) {
                    if target.starts_with('/') {
                        return Ok(None);
                    }
                    let mut next: Vec<String> = cur[..cur.len() - 1].to_vec();
                    next.extend(
                        target
                            .split('/')
                            .filter(|c| !c.is_empty() && *c != ".")
                            .map(String::from),
                    );
                    match resolve(tree, &next, depth + 1)? {
                        Some(resolved) => cur = resolved,
                        None => return Ok(None),
                    }
                }
            }
            Ok(Some(cur))
        }

        fn member() -> impl Strategy<Value = (String, u8, String)> {
            let comp = prop_oneof![
                Just("a".to_string()),
                Just("b".to_string()),
                Just("..".to_string()),
                Just(".".to_string()),
                Just("c".to_string()),
            ];
            (
                proptest::collection::vec(comp.clone(), 1..4).prop_map(|v| v.join("/")),
                0u8..4,
                proptest::collection::vec(comp, 1..4).prop_map(|v| v.join("/")),
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            #[test]
            fn no_member_lands_outside_the_root(members in proptest::collection::vec(member(), 1..8)) {
                let mut b = Builder::new(Vec::new());
                for (name, kind, target) in &members {
                    let mut h = Header::new_ustar();
                    let kind = match kind { 0 => F, 1 => D, _ => L };
                    h.set_entry_type(kind);
                    h.set_mode(0o644);
                    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
                    if kind == L {
                        h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
                    }
                    h.set_size(0);
                    h.set_cksum();
                    b.append(&h, io::empty()).unwrap_or_default();
                }
                let input = b.into_inner().unwrap_or_default();
                let Ok((out, _)) = run(&input) else { return Ok(()); };
                let mut tree = HashMap::new();
                for o in &out {
                    let rel = o.name.strip_prefix("repo").unwrap_or("").trim_start_matches('/');
                    prop_assert!(o.name == "repo" || o.name.starts_with("repo/"));
                    if !rel.is_empty() {
                        tree.insert(rel.to_string(), (o.kind, o.link.clone().unwrap_or_default()));
                    }
                }
                // Extraction in order: each member's parent must resolve inside the root at the
                // time it is written, and every symlink must resolve inside it at the end.
                let mut so_far: HashMap<String, (EntryType, String)> = HashMap::new();
                for o in &out {
                    let rel = o.name.strip_prefix("repo").unwrap_or("").trim_start_matches('/');
                    if rel.is_empty() { continue; }
                    let comps: Vec<String> = rel.split('/').map(String::from).collect();
                    let parent = resolve(&so_far, &comps[..comps.len() - 1], 0);
                    prop_assert!(parent != Ok(None), "{rel} written outside the root: {out:?}");
                    so_far.insert(rel.to_string(), (o.kind, o.link.clone().unwrap_or_default()));
                }
                for (rel, (kind, _)) in &tree {
                    if *kind == L {
                        let comps: Vec<String> = rel.split('/').map(String::from).collect();
                        prop_assert!(resolve(&tree, &comps, 0) != Ok(None), "{rel} escapes: {out:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn an_xz_archive_needing_more_decoder_memory_than_allowed_is_refused() {
        use std::io::Write;
        // Preset 6: an 8 MiB dictionary, far over a 1 MiB limit, well under the real one.
        let mut xz = liblzma::write::XzEncoder::new(Vec::new(), 6);
        xz.write_all(&vec![b'a'; 64 * 1024]).expect("compress");
        let xz = xz.finish().expect("finish");
        let mut out = Vec::new();
        let refused = xz_decoder(&xz[..], 1024 * 1024)
            .and_then(|mut d| std::io::Read::read_to_end(&mut d, &mut out));
        assert!(
            refused.is_err(),
            "decoded {} bytes under a 1 MiB limit",
            out.len()
        );
        let mut d = xz_decoder(&xz[..], DECODER_MEMORY).expect("decoder");
        out.clear();
        std::io::Read::read_to_end(&mut d, &mut out).expect("decodes within the real limit");
        assert_eq!(out.len(), 64 * 1024);
    }
}
