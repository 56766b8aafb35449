//! `ls`, `read`, `grep`, `glob`, `write`, `edit`, `delete`: the control plane's former shell
//! scripts done natively, with the same responses and messages, every path going through
//! [`Root::resolve`]. Messages name only the wire path the client gave.
//!
//! The ops are here; by mechanism: `walk` (trees, never through a symlink, and their globs),
//! `grep` (matching one file), `listing` (the bounded, chunked answer of `ls` and `glob`),
//! `errno` (what a failed syscall tells the client).

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use sandbox_protocol::message::ErrorKind;
use sandbox_protocol::wire::*;

use super::ere;
use super::resolve::{Opts, ResolveError, Resolved, Root};
use super::text::{Page, page_checked, replace};
use super::{Input, OpError, Stop, fail};

pub(crate) mod errno;
mod grep;
mod listing;
mod walk;

use errno::{denied, errno_fail, io_fail, open_err, resolve_err};
use grep::search;
pub use listing::Listing;
pub(crate) use walk::open_child_dir;
use walk::{glob_matcher, prune_set, read_dir_within, walk};

const FOLLOW: Opts = Opts {
    follow_final: true,
    create_parents: false,
    missing_ok: false,
};

/// The context of one fs op.
pub struct Fs<'a> {
    pub root: &'a Root,
    pub stop: &'a Stop<'a>,
}

fn path_arg(path: &str, allow_root: bool) -> Result<String, OpError> {
    validate_path(path, allow_root).map_err(|m| fail(FsErrorCode::InvalidPath, m))
}

fn file_type(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// `path/rel`, the way the old scripts rebuilt what `find` printed.
fn join(path: &str, rel: &[u8]) -> String {
    format!(
        "{}/{}",
        path.trim_end_matches('/'),
        String::from_utf8_lossy(rel)
    )
}

static EDIT_SEQ: AtomicU64 = AtomicU64::new(0);

impl Fs<'_> {
    /// Resolves `path` (following links) to a directory and opens it for listing.
    fn open_dir_op(&self, path: &str) -> Result<OwnedFd, OpError> {
        let res = self
            .root
            .resolve(path, FOLLOW)
            .map_err(|e| resolve_err(e, path))?;
        if res.file_type() != Some(FileType::Directory) {
            return Err(fail(
                FsErrorCode::NotADirectory,
                format!("{path} is not a directory"),
            ));
        }
        res.open_dir().map_err(|e| match e {
            Errno::NOTDIR | Errno::LOOP => fail(
                FsErrorCode::NotADirectory,
                format!("{path} is not a directory"),
            ),
            e => open_err(e, path),
        })
    }

    /// A halt if the request was stopped, else an I/O failure while reading.
    fn io_or_halt(&self, e: std::io::Error) -> OpError {
        match self.stop.check() {
            Err(h) => OpError::Halt(h),
            Ok(()) => fail(
                FsErrorCode::ExecFailed,
                format!("reading the file failed: {e}"),
            ),
        }
    }

    // === ls ===

    /// One directory level, every entry, directories first then the rest, each sorted; more
    /// than `max_bytes` of JSON is `too_large`.
    pub fn ls(&self, path: &str, max_bytes: u64) -> Result<Listing, OpError> {
        let path = path_arg(path, true)?;
        let fd = self.open_dir_op(&path)?;
        let mut listing = Listing::new(&path, max_bytes);
        let names =
            read_dir_within(&fd, self.stop, max_bytes)?.ok_or_else(|| listing.too_large())?;
        for (name, ft) in names {
            listing.push(FsEntry {
                path: join(&path, &name),
                is_dir: ft == FileType::Directory,
            })?;
        }
        listing
            .entries
            .sort_by(|a, b| b.is_dir.cmp(&a.is_dir).then_with(|| a.path.cmp(&b.path)));
        Ok(listing)
    }

    // === glob ===

    /// Every path under `path` matching the glob, relative to `path`; pruned directories are
    /// never entered. Sorted by path. More than `max_bytes` of JSON is `too_large` (the walk
    /// stops there).
    pub fn glob(
        &self,
        pattern: &str,
        path: &str,
        prune: &[String],
        max_bytes: u64,
    ) -> Result<Listing, OpError> {
        let path = path_arg(path, true)?;
        let pattern = pattern
            .trim_start_matches(&format!("{path}/"))
            .trim_start_matches('/');
        let matcher = glob_matcher(pattern)?;
        let prunes = prune_set(prune);
        let fd = self.open_dir_op(&path)?;
        let mut listing = Listing::new(&path, max_bytes);
        walk(fd, &prunes, self.stop, |_, rel, _, ft| {
            if matcher.is_match(Path::new(OsStr::from_bytes(rel))) {
                listing.push(FsEntry {
                    path: join(&path, rel),
                    is_dir: ft == FileType::Directory,
                })?;
            }
            Ok(true)
        })?;
        listing.entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(listing)
    }

    // === grep ===

    /// POSIX ERE search over regular files only (never FIFOs or devices, never through
    /// symlinks while walking), stopping at the first match past [`GREP_MAX_MATCHES`]. A file
    /// with a NUL byte is binary: GNU grep printed "Binary file ... matches" for it, which the
    /// old parser dropped, so from its first NUL-bearing chunk on it yields nothing.
    pub fn grep(
        &self,
        pattern: &str,
        path: &str,
        glob: Option<&str>,
        prune: &[String],
    ) -> Result<FsGrepResponse, OpError> {
        let path = path_arg(path, true)?;
        let basename = glob
            .filter(|g| !g.is_empty())
            .map(glob_matcher)
            .transpose()?;
        let re = ere::compile(pattern).map_err(|_| {
            fail(
                FsErrorCode::InvalidPattern,
                format!("invalid regular expression (POSIX ERE): {pattern:?}"),
            )
        })?;
        let prunes = prune_set(prune);
        let res = self
            .root
            .resolve(&path, FOLLOW)
            .map_err(|e| resolve_err(e, &path))?;
        let mut matches = Vec::new();
        match res.file_type() {
            Some(FileType::Directory) => {
                let fd = res.open_dir().map_err(|e| open_err(e, &path))?;
                walk(fd, &prunes, self.stop, |dir, rel, name, ft| {
                    if ft != FileType::RegularFile || name.contains(&b'\n') {
                        return Ok(true);
                    }
                    if let Some(m) = &basename
                        && !m.is_match(OsStr::from_bytes(name))
                    {
                        return Ok(true);
                    }
                    let Ok(fd) = rustix::fs::openat(
                        dir,
                        OsStr::from_bytes(name),
                        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                        Mode::empty(),
                    ) else {
                        return Ok(true);
                    };
                    search(fd, &re, &join(&path, rel), &mut matches, self.stop)?;
                    Ok(matches.len() <= GREP_MAX_MATCHES)
                })?;
            }
            Some(FileType::RegularFile) => {
                let fd = res
                    .open(OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())
                    .map_err(|e| open_err(e, &path))?;
                let base = path.rsplit('/').next().unwrap_or_default();
                if basename.as_ref().is_none_or(|m| m.is_match(base)) {
                    search(fd, &re, &path, &mut matches, self.stop)?;
                }
            }
            // A FIFO, device or socket is never read: the answer comes at once.
            _ => {}
        }
        let truncated = matches.len() > GREP_MAX_MATCHES;
        matches.truncate(GREP_MAX_MATCHES);
        Ok(FsGrepResponse {
            matches,
            truncated,
            error: None,
        })
    }

    // === read ===

    /// Resolves (following links) and opens a regular file; anything else is refused before a
    /// byte is read.
    fn open_file(&self, path: &str, flags: OFlags) -> Result<(File, Stat, Resolved), OpError> {
        let res = self
            .root
            .resolve(path, FOLLOW)
            .map_err(|e| resolve_err(e, path))?;
        match res.file_type() {
            Some(FileType::RegularFile) => {}
            Some(FileType::Directory) => {
                return Err(fail(
                    FsErrorCode::IsADirectory,
                    format!("{path} is a directory"),
                ));
            }
            _ => {
                return Err(fail(
                    FsErrorCode::ExecFailed,
                    format!("{path} is not a regular file"),
                ));
            }
        }
        let fd = res
            .open(flags | OFlags::NONBLOCK, Mode::empty())
            .map_err(|e| open_err(e, path))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| errno_fail(e, path))?;
        if file_type(&st) != FileType::RegularFile {
            return Err(fail(
                FsErrorCode::ExecFailed,
                format!("{path} is not a regular file"),
            ));
        }
        Ok((File::from(fd), st, res))
    }

    /// Pages a file (see [`page_checked`]).
    pub fn read(&self, path: &str, offset: u64, limit: u64) -> Result<FsReadResponse, OpError> {
        let path = path_arg(path, false)?;
        let (file, _, _) = self.open_file(&path, OFlags::RDONLY)?;
        let page = page_checked(&file, offset, limit.max(1), &mut || self.stop.check_io())
            .map_err(|e| self.io_or_halt(e))?;
        Ok(match page {
            Page::Empty => FsReadResponse {
                content: Some(EMPTY_FILE_SENTINEL.to_string()),
                encoding: Some("utf-8".into()),
                ..Default::default()
            },
            Page::Binary(bytes) => FsReadResponse {
                content: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
                encoding: Some("base64".into()),
                ..Default::default()
            },
            Page::BinaryTooLarge => {
                return Err(fail(
                    FsErrorCode::TooLarge,
                    format!("Binary file exceeds maximum preview size of {READ_MAX_BYTES} bytes"),
                ));
            }
            Page::OffsetBeyond { total } => {
                return Err(fail(
                    FsErrorCode::InvalidOffset,
                    format!("Line offset {offset} exceeds file length ({total} lines)"),
                ));
            }
            Page::Text {
                content,
                total_lines,
                end_line,
                truncated,
            } => FsReadResponse {
                content: Some(content),
                encoding: Some("utf-8".into()),
                total_lines: Some(total_lines),
                end_line: Some(end_line),
                truncated,
                error: None,
            },
        })
    }

    // === write ===

    /// Create-only: missing parents are created (0755), the file with `O_CREAT | O_EXCL |
    /// O_NOFOLLOW` and exactly `mode & 0o777`; the content comes from `input`. A failure after
    /// creation removes the partial file.
    pub fn write(
        &self,
        path: &str,
        mode: u32,
        input: &mut Input,
    ) -> Result<FsWriteResponse, OpError> {
        let path = path_arg(path, false)?;
        if let Err(why) = sandbox_protocol::files::permission_bits(mode) {
            return Err(OpError::Fail(ErrorKind::BadRequest, why));
        }
        let exists = || {
            fail(
                FsErrorCode::AlreadyExists,
                format!(
                    "Cannot write to {path} because it already exists. Read and then make an edit, or write to a new path."
                ),
            )
        };
        let cannot_create = || {
            fail(
                FsErrorCode::PermissionDenied,
                format!("permission denied: cannot create {path}"),
            )
        };
        let opts = Opts {
            follow_final: false,
            create_parents: true,
            missing_ok: true,
        };
        let res = self.root.resolve(&path, opts).map_err(|e| match e {
            ResolveError::Errno(Errno::NOTDIR | Errno::EXIST) => fail(
                FsErrorCode::ExecFailed,
                format!("a parent of {path} is not a directory"),
            ),
            ResolveError::Errno(Errno::ACCESS | Errno::PERM) => cannot_create(),
            e => resolve_err(e, &path),
        })?;
        let Some(name) = res.name.clone().filter(|_| res.stat.is_none()) else {
            return Err(exists());
        };
        let mode = mode & 0o777;
        let fd = res
            .open(
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
                Mode::from_raw_mode(mode),
            )
            .map_err(|e| match e {
                Errno::EXIST => exists(),
                Errno::ACCESS | Errno::PERM => cannot_create(),
                e => errno_fail(e, &path),
            })?;
        let written = (|| -> Result<(), OpError> {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| errno_fail(e, &path))?;
            let mut file = File::from(fd);
            while let Some(chunk) = input.next(self.stop)? {
                file.write_all(&chunk).map_err(|e| io_fail(e, &path))?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            let _ = rustix::fs::unlinkat(&res.dir, name.as_os_str(), AtFlags::empty());
            return Err(e);
        }
        Ok(FsWriteResponse {
            ok: true,
            error: None,
        })
    }

    // === edit ===

    /// Read, replace, write back atomically (a temporary file in the same directory, renamed
    /// over the file), following symlinks to the file they name and keeping its mode.
    pub fn edit(
        &self,
        path: &str,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<FsEditResponse, OpError> {
        let path = path_arg(path, false)?;
        if old.is_empty() {
            return Err(fail(
                FsErrorCode::StringNotFound,
                "old must not be empty: give the exact text to replace",
            ));
        }
        // Read-write open: the kernel refuses a file the sandbox user may not write.
        let (file, st, res) = self.open_file(&path, OFlags::RDWR)?;
        let too_large = || {
            fail(
                FsErrorCode::TooLarge,
                format!("{path} is larger than the {EDIT_MAX_BYTES}-byte edit limit"),
            )
        };
        if st.st_size as u64 > EDIT_MAX_BYTES {
            return Err(too_large());
        }
        let mut raw = Vec::with_capacity(st.st_size as usize);
        (&file)
            .take(EDIT_MAX_BYTES + 1)
            .read_to_end(&mut raw)
            .map_err(|e| self.io_or_halt(e))?;
        if raw.len() as u64 > EDIT_MAX_BYTES {
            return Err(too_large());
        }
        let text = String::from_utf8(raw).map_err(|_| {
            fail(
                FsErrorCode::NotATextFile,
                format!("{path} is not a UTF-8 text file"),
            )
        })?;
        let (updated, count) = replace(&text, old, new, replace_all)?;
        self.stop.check()?;
        let Some(name) = res.name.as_ref() else {
            return Err(fail(
                FsErrorCode::IsADirectory,
                format!("{path} is a directory"),
            ));
        };
        let mode = Mode::from_raw_mode(st.st_mode & 0o777);
        let tmp = format!(
            ".daiv-edit-{}-{}",
            std::process::id(),
            EDIT_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let fd = rustix::fs::openat(
            &res.dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            mode,
        )
        .map_err(|e| match e {
            Errno::ACCESS | Errno::PERM => denied(&path),
            e => errno_fail(e, &path),
        })?;
        let done = (|| -> Result<(), OpError> {
            rustix::fs::fchmod(&fd, mode).map_err(|e| errno_fail(e, &path))?;
            let mut out = File::from(fd);
            out.write_all(updated.as_bytes())
                .map_err(|e| io_fail(e, &path))?;
            rustix::fs::renameat(&res.dir, tmp.as_str(), &res.dir, name.as_os_str()).map_err(|e| {
                match e {
                    Errno::ACCESS | Errno::PERM => denied(&path),
                    e => errno_fail(e, &path),
                }
            })
        })();
        if let Err(e) = done {
            let _ = rustix::fs::unlinkat(&res.dir, tmp.as_str(), AtFlags::empty());
            return Err(e);
        }
        Ok(FsEditResponse {
            occurrences: Some(count as u64),
            error: None,
        })
    }

    // === delete ===

    /// Removes a file (or a symlink itself, never its target); directories are refused.
    /// Idempotent: an absent path is `removed: false`.
    pub fn delete(&self, path: &str) -> Result<FsDeleteResponse, OpError> {
        let path = path_arg(path, false)?;
        let absent = FsDeleteResponse {
            ok: true,
            removed: false,
            error: None,
        };
        let opts = Opts {
            follow_final: false,
            create_parents: false,
            missing_ok: true,
        };
        let res = match self.root.resolve(&path, opts) {
            Ok(r) => r,
            Err(ResolveError::Errno(Errno::NOENT | Errno::NOTDIR)) => return Ok(absent),
            Err(e) => return Err(resolve_err(e, &path)),
        };
        let is_dir = || fail(FsErrorCode::IsADirectory, format!("{path} is a directory"));
        let (Some(name), Some(ft)) = (res.name.as_ref(), res.file_type()) else {
            return if res.stat.is_none() {
                Ok(absent)
            } else {
                Err(is_dir())
            };
        };
        if ft == FileType::Directory {
            return Err(is_dir());
        }
        match rustix::fs::unlinkat(&res.dir, name.as_os_str(), AtFlags::empty()) {
            Ok(()) => Ok(FsDeleteResponse {
                ok: true,
                removed: true,
                error: None,
            }),
            Err(Errno::NOENT) => Ok(absent),
            Err(Errno::ISDIR) => Err(is_dir()),
            Err(Errno::ACCESS | Errno::PERM) => Err(denied(&path)),
            Err(e) => Err(errno_fail(e, &path)),
        }
    }
}
