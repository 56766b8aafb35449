//! The data plane's ops on paths anywhere in the container: `stat`, `mkdir`, `move`, `list`,
//! and raw file reads (streamed in chunks) and writes (streamed into a temporary file beside
//! the target, renamed over it). They run on a thread acting as the sandbox user, so the kernel
//! decides what may be read or written; every path goes through a [`Root::open_anywhere`]
//! resolution, which refuses the service's own directory under any name. Messages name only
//! the path the client gave.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use sandbox_protocol::files::*;
use sandbox_protocol::frame::MAX_DATA_CHUNK;
use sandbox_protocol::message::ByteRange;
use sandbox_protocol::wire::{FsError, FsErrorCode, LIST_MAX_ENTRIES};

use super::fs::errno::{denied, errno_fail, io_fail, open_err, resolve_err};
use super::resolve::{Opts, ResolveError, Resolved, Root};
use super::{Input, OpError, Stop, fail};

/// The context of one data-plane op. `path` arguments are already where the helper finds them
/// (`/workspace/...` mapped under the served root); `shown` is what messages name.
pub struct Files<'a> {
    pub root: &'a Root,
    pub stop: &'a Stop<'a>,
}

const FOLLOW: Opts = Opts {
    follow_final: true,
    create_parents: false,
    missing_ok: false,
};

const NOFOLLOW: Opts = Opts {
    follow_final: false,
    create_parents: false,
    missing_ok: false,
};

fn no_space(path: &str) -> OpError {
    fail(
        FsErrorCode::NoSpace,
        format!("{path}: no space left on device"),
    )
}

/// A failed syscall of these ops: the codes of the seven ops' table, plus `not_empty`,
/// `already_exists` and `no_space`.
fn errno_err(e: Errno, path: &str) -> OpError {
    match e {
        Errno::NOSPC | Errno::DQUOT => no_space(path),
        Errno::NOTEMPTY => fail(
            FsErrorCode::NotEmpty,
            format!("{path}: directory not empty"),
        ),
        Errno::EXIST => fail(FsErrorCode::AlreadyExists, format!("{path} already exists")),
        Errno::ISDIR => fail(FsErrorCode::IsADirectory, format!("{path} is a directory")),
        Errno::NOTDIR => fail(
            FsErrorCode::NotADirectory,
            format!("a component of {path} is not a directory"),
        ),
        Errno::ACCESS | Errno::PERM | Errno::ROFS => denied(path),
        Errno::NOENT => fail(FsErrorCode::NotFound, format!("{path} does not exist")),
        e => errno_fail(e, path),
    }
}

fn resolve_any(root: &Root, path: &str, shown: &str, opts: Opts) -> Result<Resolved, OpError> {
    root.resolve_bytes(path.as_bytes(), opts)
        .map_err(|e| resolve_err(e, shown))
}

/// `rwxr-xr-x` with the type letter in front.
fn permissions(ft: FileType, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match ft {
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        FileType::Fifo => 'p',
        FileType::Socket => 's',
        FileType::CharacterDevice => 'c',
        FileType::BlockDevice => 'b',
        _ => '-',
    });
    let bits = [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o040, 'r'),
        (0o020, 'w'),
        (0o010, 'x'),
        (0o004, 'r'),
        (0o002, 'w'),
        (0o001, 'x'),
    ];
    for (i, (bit, c)) in bits.into_iter().enumerate() {
        let special = match i {
            2 => mode & 0o4000 != 0,
            5 => mode & 0o2000 != 0,
            8 => mode & 0o1000 != 0,
            _ => false,
        };
        let set = mode & bit != 0;
        s.push(match (special, set, i) {
            (true, true, 8) => 't',
            (true, false, 8) => 'T',
            (true, true, _) => 's',
            (true, false, _) => 'S',
            (false, true, _) => c,
            (false, false, _) => '-',
        });
    }
    s
}

/// The name of `id` in a `name:x:id:...` database (`/etc/passwd`, `/etc/group`), else the id.
fn name_of(db: &str, id: u32) -> String {
    std::fs::read_to_string(db)
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                let mut f = l.split(':');
                let name = f.next()?;
                let _ = f.next()?;
                (f.next()?.parse::<u32>().ok()? == id).then(|| name.to_string())
            })
        })
        .unwrap_or_else(|| id.to_string())
}

/// An entry from its `lstat` (and, for a symlink, its target read from `dir`).
pub(crate) fn entry(path: &str, dir: &OwnedFd, name: Option<&OsStr>, st: &Stat) -> FileEntry {
    let ft = FileType::from_raw_mode(st.st_mode);
    let symlink_target = (ft == FileType::Symlink)
        .then(|| {
            let name = name?;
            rustix::fs::readlinkat(dir, name, Vec::new())
                .ok()
                .map(|t| String::from_utf8_lossy(t.as_bytes()).into_owned())
        })
        .flatten();
    let mode = st.st_mode & 0o7777;
    let metadata = match (ft, name) {
        (FileType::RegularFile | FileType::Directory, Some(name)) => {
            super::xattr::read_at(dir, name)
        }
        _ => Default::default(),
    };
    FileEntry {
        name: path
            .rsplit('/')
            .find(|c| !c.is_empty())
            .unwrap_or("/")
            .to_string(),
        path: path.to_string(),
        entry_type: match ft {
            FileType::RegularFile => EntryType::File,
            FileType::Directory => EntryType::Directory,
            FileType::Symlink => EntryType::Symlink,
            _ => EntryType::Other,
        },
        size: u64::try_from(st.st_size).unwrap_or(0),
        mode,
        permissions: permissions(ft, mode),
        owner: name_of("/etc/passwd", st.st_uid),
        group: name_of("/etc/group", st.st_gid),
        mtime: st.st_mtime,
        symlink_target,
        metadata,
    }
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl Files<'_> {
    /// `path` itself (a final symlink is described, not followed).
    pub fn stat(&self, path: &str, shown: &str) -> Result<FsStatResponse, OpError> {
        let res = resolve_any(self.root, path, shown, NOFOLLOW)?;
        let st = res
            .stat
            .ok_or_else(|| fail(FsErrorCode::NotFound, format!("{shown} does not exist")))?;
        Ok(FsStatResponse {
            entry: Some(entry(shown, &res.dir, res.name.as_deref(), &st)),
            error: None,
        })
    }

    pub fn mkdir(
        &self,
        path: &str,
        shown: &str,
        parents: bool,
    ) -> Result<FsMkdirResponse, OpError> {
        let opts = Opts {
            follow_final: false,
            create_parents: parents,
            missing_ok: true,
        };
        let res = resolve_any(self.root, path, shown, opts)?;
        match (&res.stat, &res.name) {
            (Some(st), _) => {
                if parents && FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                    Ok(FsMkdirResponse {
                        ok: true,
                        created: false,
                        error: None,
                    })
                } else {
                    Err(errno_err(Errno::EXIST, shown))
                }
            }
            (None, Some(name)) => {
                super::resolve::make_dir(&res.dir, name, 0o755).map_err(|e| errno_err(e, shown))?;
                Ok(FsMkdirResponse {
                    ok: true,
                    created: true,
                    error: None,
                })
            }
            (None, None) => Err(errno_err(Errno::EXIST, shown)),
        }
    }

    /// `rename(2)`: the source itself (a symlink is moved, not followed); an existing
    /// destination file is replaced, a non-empty destination directory is `not_empty`.
    pub fn rename(
        &self,
        source: &str,
        source_shown: &str,
        destination: &str,
        destination_shown: &str,
    ) -> Result<FsMoveResponse, OpError> {
        let src = resolve_any(self.root, source, source_shown, NOFOLLOW)?;
        let Some(src_name) = src.name.as_ref().filter(|_| src.stat.is_some()) else {
            return Err(fail(
                FsErrorCode::InvalidPath,
                format!("cannot move {source_shown}"),
            ));
        };
        let opts = Opts {
            follow_final: false,
            create_parents: false,
            missing_ok: true,
        };
        let dst = resolve_any(self.root, destination, destination_shown, opts)?;
        let Some(dst_name) = dst.name.as_ref() else {
            return Err(errno_err(Errno::EXIST, destination_shown));
        };
        let renamed = rustix::fs::renameat(
            &src.dir,
            src_name.as_os_str(),
            &dst.dir,
            dst_name.as_os_str(),
        );
        // Across filesystems (the workspace volume and the container's own layer): a file is
        // copied beside its destination, renamed over it, then the source goes.
        let renamed = match (renamed, src.file_type()) {
            (Err(Errno::XDEV), Some(FileType::RegularFile)) => {
                let src_mode = src.stat.map_or(0o644, |st| st.st_mode & 0o7777);
                self.copy_across(
                    (&src.dir, src_name, source_shown),
                    (&dst.dir, dst_name, destination_shown),
                    src_mode,
                )?;
                rustix::fs::unlinkat(&src.dir, src_name.as_os_str(), AtFlags::empty())
                    .map_err(|e| errno_err(e, source_shown))?;
                Ok(())
            }
            (r, _) => r,
        };
        renamed.map_err(|e| match e {
                Errno::XDEV => fail(
                    FsErrorCode::ExecFailed,
                    format!(
                        "cannot move {source_shown} to {destination_shown}: they are on different filesystems, and only a file is copied across (move a directory with a command's `mv`)"
                    ),
                ),
                Errno::INVAL => fail(
                    FsErrorCode::InvalidPath,
                    format!("cannot move {source_shown} into itself"),
                ),
                Errno::NOENT => errno_err(e, source_shown),
                e => errno_err(e, destination_shown),
            })?;
        Ok(FsMoveResponse {
            ok: true,
            error: None,
        })
    }

    /// Copies regular file `from` (never through a symlink) to a temporary file beside `to`, with
    /// mode `mode`, then renames it over `to`: a reader of `to` sees the old or the new file.
    fn copy_across(
        &self,
        (from_dir, from, from_shown): (&OwnedFd, &OsString, &str),
        (to_dir, to, to_shown): (&OwnedFd, &OsString, &str),
        mode: u32,
    ) -> Result<(), OpError> {
        let src = rustix::fs::openat(
            from_dir,
            from.as_os_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| errno_err(e, from_shown))?;
        let tmp = OsString::from(format!(
            ".{}.daiv-move-{}-{}",
            String::from_utf8_lossy(to.as_bytes()),
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let fd = rustix::fs::openat(
            to_dir,
            tmp.as_os_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode & 0o777),
        )
        .map_err(|e| errno_err(e, to_shown))?;
        let copied = (|| -> Result<(), OpError> {
            self.stop.check()?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o777))
                .map_err(|e| errno_err(e, to_shown))?;
            let (mut r, mut w) = (File::from(src), File::from(fd));
            std::io::copy(&mut r, &mut w).map_err(|e| match e.raw_os_error() {
                Some(n) => errno_err(Errno::from_raw_os_error(n), to_shown),
                None => io_fail(e, to_shown),
            })?;
            rustix::fs::renameat(to_dir, tmp.as_os_str(), to_dir, to.as_os_str())
                .map_err(|e| errno_err(e, to_shown))
        })();
        if copied.is_err() {
            let _ = rustix::fs::unlinkat(to_dir, tmp.as_os_str(), AtFlags::empty());
        }
        copied
    }

    /// Entries `depth` levels down, never through a symlink nor into the service directory,
    /// sorted by path, at most [`LIST_MAX_ENTRIES`].
    pub fn list(&self, path: &str, shown: &str, depth: u32) -> Result<FsListResponse, OpError> {
        let depth = depth.clamp(1, LIST_MAX_DEPTH);
        let res = resolve_any(self.root, path, shown, FOLLOW)?;
        if res.file_type() != Some(FileType::Directory) {
            return Err(fail(
                FsErrorCode::NotADirectory,
                format!("{shown} is not a directory"),
            ));
        }
        let fd = res.open_dir().map_err(|e| open_err(e, shown))?;
        let mut entries = Vec::new();
        let mut truncated = false;
        // (directory fd, its shown path, its depth)
        let mut todo: Vec<(OwnedFd, String, u32)> = vec![(fd, shown.to_string(), 1)];
        'walk: while let Some((dir, at, level)) = todo.pop() {
            self.stop.check()?;
            let Ok(mut rd) = rustix::fs::Dir::read_from(&dir) else {
                continue;
            };
            while let Some(Ok(e)) = rd.read() {
                let name = e.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                let name = OsStr::from_bytes(name);
                let Ok(st) = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
                    continue;
                };
                if entries.len() >= LIST_MAX_ENTRIES {
                    truncated = true;
                    break 'walk;
                }
                let child = format!(
                    "{}/{}",
                    at.trim_end_matches('/'),
                    String::from_utf8_lossy(name.as_bytes())
                );
                entries.push(entry(&child, &dir, Some(name), &st));
                if level < depth
                    && FileType::from_raw_mode(st.st_mode) == FileType::Directory
                    && !self.root.denied(&st)
                    && let Ok(sub) = super::fs::open_child_dir(&dir, name.as_bytes())
                    && rustix::fs::fstat(&sub).is_ok_and(|s| !self.root.denied(&s))
                {
                    todo.push((sub, child, level + 1));
                }
            }
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(FsListResponse {
            entries,
            truncated,
            error: None,
        })
    }

    /// Opens a regular file for a raw read: its fd and size.
    pub fn open_read(&self, path: &str, shown: &str) -> Result<(File, u64), OpError> {
        let res = resolve_any(self.root, path, shown, FOLLOW)?;
        match res.file_type() {
            Some(FileType::RegularFile) => {}
            Some(FileType::Directory) => {
                return Err(fail(
                    FsErrorCode::IsADirectory,
                    format!("{shown} is a directory"),
                ));
            }
            _ => {
                return Err(fail(
                    FsErrorCode::ExecFailed,
                    format!("{shown} is not a regular file"),
                ));
            }
        }
        let fd = res
            .open(OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())
            .map_err(|e| open_err(e, shown))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| errno_err(e, shown))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(fail(
                FsErrorCode::ExecFailed,
                format!("{shown} is not a regular file"),
            ));
        }
        Ok((File::from(fd), u64::try_from(st.st_size).unwrap_or(0)))
    }

    /// Streams `length` bytes from `start` through `send`, a chunk at a time; the bytes sent.
    pub fn send_range(
        &self,
        file: &File,
        start: u64,
        length: u64,
        shown: &str,
        send: &mut dyn FnMut(&[u8]),
    ) -> Result<u64, OpError> {
        let mut buf = vec![0u8; MAX_DATA_CHUNK];
        let mut sent = 0u64;
        while sent < length {
            self.stop.check()?;
            let want = usize::try_from((length - sent).min(buf.len() as u64)).unwrap_or(0);
            let n = match file.read_at(&mut buf[..want], start + sent) {
                Ok(0) => break, // the file shrank: what there was
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_fail(e, shown)),
            };
            send(&buf[..n]);
            sent += n as u64;
        }
        Ok(sent)
    }

    /// Writes the input to a temporary file beside `path` and renames it over `path`, or, with
    /// `in_place`, to `path` itself (truncated first).
    pub fn write(
        &self,
        path: &str,
        shown: &str,
        how: WriteHow,
        input: &mut Input,
    ) -> Result<FileAnswer, OpError> {
        let WriteHow {
            mode,
            parents,
            max_bytes,
            in_place,
            metadata,
        } = how;
        let opts = Opts {
            follow_final: true,
            create_parents: parents,
            missing_ok: true,
        };
        let res = self
            .root
            .resolve_bytes(path.as_bytes(), opts)
            .map_err(|e| match e {
                ResolveError::Errno(Errno::NOENT) if !parents => fail(
                    FsErrorCode::NotFound,
                    format!("a parent directory of {shown} does not exist (parents=false)"),
                ),
                e => resolve_err(e, shown),
            })?;
        let Some(name) = res.name.clone() else {
            return Err(fail(
                FsErrorCode::IsADirectory,
                format!("{shown} is a directory"),
            ));
        };
        let existing_mode = match res.file_type() {
            None => None,
            Some(FileType::RegularFile) => res.stat.as_ref().map(|s| s.st_mode & 0o777),
            Some(FileType::Directory) => {
                return Err(fail(
                    FsErrorCode::IsADirectory,
                    format!("{shown} is a directory"),
                ));
            }
            Some(_) => {
                return Err(fail(
                    FsErrorCode::ExecFailed,
                    format!("{shown} is not a regular file"),
                ));
            }
        };
        let new_mode = mode.or(existing_mode).unwrap_or(0o644) & 0o777;
        // In place: the file itself; its bits set when it is new or a mode was asked for.
        // In place with metadata: truncated only once the metadata is set, so a file system
        // that refuses it leaves the file as it was.
        let (target, flags) = if in_place {
            let trunc = if metadata.is_some() {
                OFlags::empty()
            } else {
                OFlags::TRUNC
            };
            (name.clone(), trunc)
        } else {
            let tmp = OsString::from(format!(
                ".{}.daiv-put-{}-{}",
                String::from_utf8_lossy(name.as_bytes()),
                std::process::id(),
                TMP_SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            (tmp, OFlags::EXCL)
        };
        let fd = rustix::fs::openat(
            &res.dir,
            target.as_os_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC | flags,
            Mode::from_raw_mode(new_mode),
        )
        .map_err(|e| errno_err(e, shown))?;
        let set_mode = !in_place || existing_mode.is_none() || mode.is_some();
        let written = (|| -> Result<u64, OpError> {
            if set_mode {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(new_mode))
                    .map_err(|e| errno_err(e, shown))?;
            }
            if let Some(m) = &metadata
                && let Err(e) = super::xattr::replace(&fd, m)
            {
                // A file made for this write goes with it (a temporary one goes below).
                if in_place && existing_mode.is_none() {
                    let _ = rustix::fs::unlinkat(&res.dir, target.as_os_str(), AtFlags::empty());
                }
                return Err(match e {
                    Errno::NOTSUP => fail(
                        FsErrorCode::ExecFailed,
                        format!("{shown}: this file system keeps no file metadata"),
                    ),
                    Errno::NOSPC | Errno::TOOBIG | Errno::RANGE => fail(
                        FsErrorCode::TooLarge,
                        format!("{shown}: the metadata is more than this file system keeps"),
                    ),
                    e => errno_err(e, shown),
                });
            }
            if in_place && metadata.is_some() {
                rustix::fs::ftruncate(&fd, 0).map_err(|e| errno_err(e, shown))?;
            }
            let mut file = File::from(fd);
            let mut total = 0u64;
            while let Some(chunk) = input.next(self.stop)? {
                total += chunk.len() as u64;
                if total > max_bytes {
                    return Err(fail(
                        FsErrorCode::TooLarge,
                        format!("{shown}: the content is over the {max_bytes}-byte limit"),
                    ));
                }
                file.write_all(&chunk).map_err(|e| match e.raw_os_error() {
                    Some(n) => errno_err(Errno::from_raw_os_error(n), shown),
                    None => io_fail(e, shown),
                })?;
            }
            if !in_place {
                rustix::fs::renameat(&res.dir, target.as_os_str(), &res.dir, name.as_os_str())
                    .map_err(|e| errno_err(e, shown))?;
            }
            Ok(total)
        })();
        match written {
            Ok(bytes) => Ok(FileAnswer { bytes, error: None }),
            Err(e) => {
                if !in_place {
                    let _ = rustix::fs::unlinkat(&res.dir, target.as_os_str(), AtFlags::empty());
                }
                Err(e)
            }
        }
    }
}

/// How [`Files::write`] writes: the request's `mode`, `parents`, `max_bytes`, `in_place` and
/// `metadata`.
#[derive(Debug, Clone)]
pub struct WriteHow {
    pub mode: Option<u32>,
    pub parents: bool,
    pub max_bytes: u64,
    pub in_place: bool,
    pub metadata: Option<std::collections::BTreeMap<String, String>>,
}

/// The part of a `size`-byte file a range names: `(start, length)`, or `invalid_range`.
pub fn range_of(range: Option<ByteRange>, size: u64) -> Result<(u64, u64), FsError> {
    let Some(r) = range else {
        return Ok((0, size));
    };
    let bad = || {
        FsError::new(
            FsErrorCode::InvalidRange,
            format!("the range is outside the file's {size} bytes"),
        )
    };
    match (r.first, r.last) {
        (Some(first), last) => {
            if first >= size || last.is_some_and(|l| l < first) {
                return Err(bad());
            }
            let end = last.map_or(size - 1, |l| l.min(size - 1));
            Ok((first, end - first + 1))
        }
        (None, Some(suffix)) => {
            if suffix == 0 || size == 0 {
                return Err(bad());
            }
            let n = suffix.min(size);
            Ok((size - n, n))
        }
        (None, None) => Ok((0, size)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ranges_resolve_as_http_says() {
        let r = |first, last| Some(ByteRange { first, last });
        assert_eq!(range_of(None, 10).unwrap(), (0, 10));
        assert_eq!(range_of(r(Some(2), Some(4)), 10).unwrap(), (2, 3));
        assert_eq!(range_of(r(Some(2), None), 10).unwrap(), (2, 8));
        assert_eq!(range_of(r(Some(2), Some(99)), 10).unwrap(), (2, 8));
        assert_eq!(range_of(r(None, Some(3)), 10).unwrap(), (7, 3));
        assert_eq!(range_of(r(None, Some(30)), 10).unwrap(), (0, 10));
        for bad in [r(Some(10), None), r(Some(5), Some(4)), r(None, Some(0))] {
            assert_eq!(
                range_of(bad, 10).unwrap_err().code,
                FsErrorCode::InvalidRange
            );
        }
        assert_eq!(range_of(None, 0).unwrap(), (0, 0));
    }

    #[test]
    fn permissions_read_as_ls_prints_them() {
        assert_eq!(permissions(FileType::Directory, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(FileType::RegularFile, 0o4755), "-rwsr-xr-x");
        assert_eq!(permissions(FileType::Directory, 0o1777), "drwxrwxrwt");
        assert_eq!(permissions(FileType::RegularFile, 0o644), "-rw-r--r--");
    }
}
