//! `copy-tree FROM TO [FROM TO...] [--max-bytes N]`: a faithful copy of a directory tree that an untrusted
//! sandbox wrote (an overlayfs upper directory, frozen by now) into a fresh directory that
//! becomes an immutable overlay lower layer.
//!
//! The service runs it as root in a throwaway, network-less container (CHOWN, DAC_OVERRIDE,
//! FOWNER, FSETID, MKNOD), so nothing in the tree may steer it: the walk is fd-relative
//! throughout (`openat` with `O_NOFOLLOW`, `fstatat` with `AT_SYMLINK_NOFOLLOW`,
//! `readlinkat`, and `mkdirat`/`openat(O_EXCL)`/`symlinkat`/`mknodat`/`linkat` relative to the
//! destination directory's fd), so no symlink in FROM or TO is ever followed, and each opened
//! source is checked to be the inode `fstatat` saw. Names are bytes throughout.
//!
//! What is copied, since overlayfs reads all of it: directories; regular files with their
//! holes (`SEEK_DATA`/`SEEK_HOLE`, then `ftruncate` to the full length, so a trailing hole
//! stays one); symlinks (the target copied, never read through); FIFOs; character and block
//! devices with their rdev (whiteouts are character devices 0/0); hard links among
//! non-directories (the first copy linked again); owner and group as numbers; the mode with
//! setuid, setgid and sticky (set after the owner, since `chown` clears setuid); access and
//! modification times with nanoseconds (a directory's once its contents are done, since they
//! change it); every `user.*` extended attribute of files and directories (overlayfs with
//! `userxattr` keeps `user.overlay.opaque`, `user.overlay.redirect`, ... there; other
//! namespaces are not the sandbox's to carry over, and symlinks and device nodes cannot hold
//! `user.*`). Sockets are skipped: nothing can listen on a copy. TO's root takes FROM root's
//! owner, mode, `user.*` attributes and times.
//!
//! # Descriptors and depth
//! The walk is iterative, and each directory level holds two descriptors (the source
//! directory's stream and the destination directory) until its contents are done, so a level
//! is never re-resolved by path. That caps the levels at [`MAX_DEPTH`]: 256 levels stay under
//! about 520 descriptors, within the common soft `RLIMIT_NOFILE` of 1024, and a deeper tree
//! (hostile, or pathological past `PATH_MAX` anyway) is refused rather than copied in part.
//! A hard link is made by its first copy's path from TO's root (only directories this walk
//! made lie on it), so one whose path passes `PATH_MAX` fails the copy.

use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{
    AtFlags, CWD, Dir, FileType, Gid, Mode, OFlags, SeekFrom, Stat, Timespec, Timestamps, Uid,
    XattrFlags,
};
use rustix::io::Errno;
use serde::Serialize;

/// The most directory levels (the root included) open at once; see the module doc.
pub const MAX_DEPTH: usize = 256;

/// The kernel's limit on both an attribute list and one value (`XATTR_LIST_MAX`,
/// `XATTR_SIZE_MAX`), so one buffer of this size always suffices.
const XATTR_MAX: usize = 64 * 1024;

/// Bytes per `copy_file_range` call or `pread`/`pwrite` round.
const CHUNK: usize = 1 << 20;

/// What a copy copied: printed as the one JSON line of a successful `copy-tree`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Copied {
    /// What the copy counts against `--max-bytes`: the regular files' apparent sizes
    /// (`st_size`, each hard-linked inode once) and, for every entry, what an archive of it
    /// would spend beside its data ([`entry_bytes`], and its `user.*` attributes), so that a
    /// tree of empty directories or long names weighs what it does in a tar copy.
    pub bytes: u64,
    /// Entries created below TO (every kind, each hard link included; not the root).
    pub files: u64,
}

/// Why a copy stopped; TO holds a partial copy then, to be thrown away.
#[derive(Debug)]
pub enum CopyError {
    /// The bytes counted ([`Copied::bytes`]) would pass `--max-bytes` (exit code 3).
    OverCap { cap: u64 },
    /// The tree is not one this copies (deeper than [`MAX_DEPTH`], a device node other than
    /// a whiteout) at `path` relative to FROM: the sandbox's doing, not the host's (exit 4).
    Refused { path: PathBuf, reason: String },
    /// Anything else, at `path` relative to FROM (empty for the root itself).
    Failed { path: PathBuf, reason: String },
}

impl fmt::Display for CopyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OverCap { cap } => write!(f, "over cap: {cap} bytes"),
            // Escaped: a name may hold a newline, and the message must stay one line.
            Self::Failed { path, reason } | Self::Refused { path, reason }
                if path.as_os_str().is_empty() =>
            {
                write!(f, ".: {reason}")
            }
            Self::Failed { path, reason } | Self::Refused { path, reason } => {
                write!(f, "{}: {reason}", path.to_string_lossy().escape_debug())
            }
        }
    }
}

impl std::error::Error for CopyError {}

/// `copy-tree FROM TO [FROM TO...] [--max-bytes N]`: the JSON of [`Copied`] (all pairs'
/// sum) on stdout and exit 0; over the cap, `over cap: N bytes` on stderr and exit 3; any other
/// failure, one line naming the path relative to its FROM on stderr and exit 1.
pub fn command(pairs: &[(&Path, &Path)], max_bytes: Option<u64>) -> ExitCode {
    match copy_trees(pairs, max_bytes) {
        Ok(copied) => match serde_json::to_string(&copied) {
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("daiv-sandbox-helper: copy-tree: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e @ CopyError::OverCap { .. }) => {
            eprintln!("{e}");
            ExitCode::from(3)
        }
        Err(e @ CopyError::Refused { .. }) => {
            eprintln!("daiv-sandbox-helper: copy-tree: refused: {e}");
            ExitCode::from(4)
        }
        Err(e) => {
            eprintln!("daiv-sandbox-helper: copy-tree: {e}");
            ExitCode::FAILURE
        }
    }
}

/// [`copy_tree`] of each pair in turn, under one budget: a TO that does not exist is made
/// (owner-only; its copy takes FROM root's attributes) in its parent, which is trusted (the
/// service's layer worker copies a session's volumes, each into a directory of the new layer).
pub fn copy_trees(pairs: &[(&Path, &Path)], max_bytes: Option<u64>) -> Result<Copied, CopyError> {
    let mut total = Copied::default();
    for (from, to) in pairs {
        match rustix::fs::mkdir(*to, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(fail(b"", "cannot create the destination")(e)),
        }
        let left = max_bytes.map(|m| m.saturating_sub(total.bytes));
        let copied = copy_tree(from, to, left).map_err(|e| match e {
            CopyError::OverCap { .. } => CopyError::OverCap {
                cap: max_bytes.unwrap_or(u64::MAX),
            },
            e => e,
        })?;
        total.bytes = total.bytes.saturating_add(copied.bytes);
        total.files = total.files.saturating_add(copied.files);
    }
    Ok(total)
}

/// Copies the tree under the directory `from` into the existing directory `to` (see the
/// module doc); `max_bytes` caps the bytes counted ([`Copied::bytes`]), checked before each
/// entry is made.
/// Neither path's last component may be a symlink; the components before it are trusted.
pub fn copy_tree(from: &Path, to: &Path, max_bytes: Option<u64>) -> Result<Copied, CopyError> {
    let src = open_dir(CWD, from).map_err(fail(b"", "cannot open the source"))?;
    let dst = open_dir(CWD, to).map_err(fail(b"", "cannot open the destination"))?;
    let src_stat = rustix::fs::fstat(&src).map_err(fail(b"", "cannot stat the source"))?;
    let dst_stat = rustix::fs::fstat(&dst).map_err(fail(b"", "cannot stat the destination"))?;
    let to_root = dst
        .try_clone()
        .map_err(|e| failed(b"", format!("cannot duplicate the destination: {e}")))?;
    let mut walk = Walk::new(to_root, &dst_stat, max_bytes);
    walk.not_destination(&src_stat, b"")?;
    let mut stack = vec![Frame {
        src: Dir::new(src).map_err(fail(b"", "cannot list"))?,
        dst,
        stat: src_stat,
        rel: Vec::new(),
    }];
    while let Some(top) = stack.last_mut() {
        let entry = match top.src.read() {
            Some(Ok(entry)) => entry,
            Some(Err(e)) => return Err(fail(&top.rel, "cannot list")(e)),
            None => {
                if let Some(done) = stack.pop() {
                    walk.finish_dir(&done)?;
                }
                continue;
            }
        };
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let depth = stack.len();
        let Some(parent) = stack.last() else { break };
        if let Some(child) = walk.entry(parent, name, depth)? {
            stack.push(child);
        }
    }
    Ok(walk.copied)
}

/// A directory being copied: its source stream, its copy, its source stat (applied once its
/// contents are done) and its path relative to FROM.
struct Frame {
    src: Dir,
    dst: OwnedFd,
    stat: Stat,
    rel: Vec<u8>,
}

impl Frame {
    fn src_fd(&self) -> Result<BorrowedFd<'_>, CopyError> {
        self.src.fd().map_err(fail(&self.rel, "cannot read"))
    }
}

/// The walk's state across entries.
struct Walk {
    /// TO's root, which hard links name their first copy from.
    to_root: OwnedFd,
    /// TO's root (dev, ino): met in FROM, the copy would copy itself.
    to_id: (u64, u64),
    /// (dev, ino) of each non-directory with more than one link, to its first copy's path
    /// relative to TO (every directory on that path is one this walk made).
    links: HashMap<(u64, u64), Vec<u8>>,
    copied: Copied,
    max_bytes: Option<u64>,
    /// The `pread`/`pwrite` buffer, allocated once `copy_file_range` is refused.
    data: Vec<u8>,
    /// Whether `copy_file_range` still works between these filesystems.
    kernel_copy: bool,
    names: Vec<u8>,
    value: Vec<u8>,
}

impl Walk {
    fn new(to_root: OwnedFd, to_stat: &Stat, max_bytes: Option<u64>) -> Self {
        Self {
            to_root,
            to_id: inode(to_stat),
            links: HashMap::new(),
            copied: Copied::default(),
            max_bytes,
            data: Vec::new(),
            kernel_copy: true,
            names: vec![0; XATTR_MAX],
            value: vec![0; XATTR_MAX],
        }
    }

    /// Copies one entry of `parent`; returns the directory to descend into, if it is one.
    fn entry(
        &mut self,
        parent: &Frame,
        name: &CStr,
        depth: usize,
    ) -> Result<Option<Frame>, CopyError> {
        let rel = join(&parent.rel, name.to_bytes());
        let st = rustix::fs::statat(parent.src_fd()?, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(fail(&rel, "cannot stat"))?;
        let kind = FileType::from_raw_mode(st.st_mode);
        if kind == FileType::Socket {
            return Ok(None);
        }
        // A symlink's `st_size` is its target's length; a file's data is charged with it.
        let target = if kind == FileType::Symlink {
            usize::try_from(st.st_size).unwrap_or(usize::MAX)
        } else {
            0
        };
        self.charge(entry_bytes(rel.len(), target))?;
        if kind == FileType::Directory {
            return self.dir(parent, name, rel, &st, depth).map(Some);
        }
        let key = inode(&st);
        if st.st_nlink > 1
            && let Some(first) = self.links.get(&key)
        {
            rustix::fs::linkat(
                &self.to_root,
                OsStr::from_bytes(first),
                &parent.dst,
                name,
                AtFlags::empty(),
            )
            .map_err(fail(&rel, "cannot link"))?;
            self.copied.files += 1;
            return Ok(None);
        }
        match kind {
            FileType::RegularFile => self.file(parent, name, &rel, &st)?,
            FileType::Symlink => symlink(parent, name, &rel, &st)?,
            FileType::Fifo | FileType::CharacterDevice | FileType::BlockDevice => {
                node(parent, name, &rel, &st, kind)?;
            }
            _ => return Err(failed(&rel, "unknown file type".to_string())),
        }
        if st.st_nlink > 1 {
            self.links.insert(key, rel);
        }
        self.copied.files += 1;
        Ok(None)
    }

    /// Creates a directory's copy and opens both; its metadata waits for [`Walk::finish_dir`].
    fn dir(
        &mut self,
        parent: &Frame,
        name: &CStr,
        rel: Vec<u8>,
        st: &Stat,
        depth: usize,
    ) -> Result<Frame, CopyError> {
        if depth >= MAX_DEPTH {
            return Err(CopyError::Refused {
                path: PathBuf::from(OsStr::from_bytes(&rel)),
                reason: format!("deeper than {MAX_DEPTH} levels"),
            });
        }
        let src = open_dir(parent.src_fd()?, name).map_err(fail(&rel, "cannot open"))?;
        let stat = rustix::fs::fstat(&src).map_err(fail(&rel, "cannot stat"))?;
        same_inode(st, &stat, &rel)?;
        self.not_destination(&stat, &rel)?;
        // Owner-only until its contents are done (the walk is root, so it still enters).
        rustix::fs::mkdirat(&parent.dst, name, Mode::from_raw_mode(0o700))
            .map_err(fail(&rel, "cannot create"))?;
        let dst = open_dir(&parent.dst, name).map_err(fail(&rel, "cannot open the copy"))?;
        self.copied.files += 1;
        Ok(Frame {
            src: Dir::new(src).map_err(fail(&rel, "cannot list"))?,
            dst,
            stat,
            rel,
        })
    }

    /// A directory's attributes, owner, mode and times, once nothing more goes into it.
    fn finish_dir(&mut self, frame: &Frame) -> Result<(), CopyError> {
        let rel = &frame.rel;
        let attrs = copy_user_xattrs(
            frame.src_fd()?,
            frame.dst.as_fd(),
            &mut self.names,
            &mut self.value,
        )
        .map_err(fail(rel, "cannot copy extended attributes"))?;
        self.charge(attrs)?;
        set_owner_mode_times(&frame.dst, &frame.stat).map_err(fail(rel, "cannot set"))
    }

    /// A regular file, after the cap check: data with its holes, then attributes, owner,
    /// mode and times.
    fn file(
        &mut self,
        parent: &Frame,
        name: &CStr,
        rel: &[u8],
        st: &Stat,
    ) -> Result<(), CopyError> {
        let size = u64::try_from(st.st_size).unwrap_or(0);
        self.charge(size)?;
        // Non-blocking and no controlling terminal, should the name no longer be the file
        // `fstatat` saw; the fstat below refuses it then.
        let src = rustix::fs::openat(
            parent.src_fd()?,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(fail(rel, "cannot open"))?;
        same_inode(
            st,
            &rustix::fs::fstat(&src).map_err(fail(rel, "cannot stat"))?,
            rel,
        )?;
        let dst = rustix::fs::openat(
            &parent.dst,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(fail(rel, "cannot create"))?;
        self.copy_data(&src, &dst, size)
            .map_err(fail(rel, "cannot copy the data"))?;
        rustix::fs::ftruncate(&dst, size).map_err(fail(rel, "cannot set the length"))?;
        let attrs = copy_user_xattrs(src.as_fd(), dst.as_fd(), &mut self.names, &mut self.value)
            .map_err(fail(rel, "cannot copy extended attributes"))?;
        self.charge(attrs)?;
        set_owner_mode_times(&dst, st).map_err(fail(rel, "cannot set"))
    }

    /// Counts `n` more bytes, refusing past the cap.
    fn charge(&mut self, n: u64) -> Result<(), CopyError> {
        self.copied.bytes = self.copied.bytes.saturating_add(n);
        match self.max_bytes {
            Some(cap) if self.copied.bytes > cap => Err(CopyError::OverCap { cap }),
            _ => Ok(()),
        }
    }

    /// Copies `src`'s data ranges below `size` to the same offsets in `dst`, leaving its holes
    /// unwritten.
    fn copy_data(&mut self, src: &OwnedFd, dst: &OwnedFd, size: u64) -> Result<(), Errno> {
        let mut pos = 0;
        while pos < size {
            let start = match rustix::fs::seek(src, SeekFrom::Data(pos)) {
                Ok(start) => start,
                // Nothing but a hole from here on.
                Err(Errno::NXIO) => return Ok(()),
                // No hole support: all of it is data.
                Err(Errno::INVAL | Errno::OPNOTSUPP) => pos,
                Err(e) => return Err(e),
            };
            if start >= size {
                return Ok(());
            }
            let end = match rustix::fs::seek(src, SeekFrom::Hole(start)) {
                Ok(end) => end.min(size),
                Err(Errno::INVAL | Errno::OPNOTSUPP) => size,
                Err(e) => return Err(e),
            };
            if end <= start {
                return Ok(());
            }
            if !self.copy_range(src, dst, start, end)? {
                // The file ended early: the length is set from the stat anyway.
                return Ok(());
            }
            pos = end;
        }
        Ok(())
    }

    /// Copies bytes `start..end` at the same offsets; false when `src` ended first.
    fn copy_range(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        start: u64,
        end: u64,
    ) -> Result<bool, Errno> {
        let mut off = start;
        while off < end {
            let want = usize::try_from(end - off).unwrap_or(CHUNK).min(CHUNK);
            if self.kernel_copy {
                let (mut off_in, mut off_out) = (off, off);
                match rustix::fs::copy_file_range(
                    src,
                    Some(&mut off_in),
                    dst,
                    Some(&mut off_out),
                    want,
                ) {
                    // Some filesystems answer 0 short of the end: the reads below say
                    // whether the file really ended.
                    Ok(0) => {}
                    Ok(n) => {
                        off += n as u64;
                        continue;
                    }
                    Err(Errno::INTR) => continue,
                    // Across filesystems, or not offered here (old kernel, seccomp, the
                    // filesystem): plain reads and writes from now on.
                    Err(
                        Errno::XDEV | Errno::NOSYS | Errno::INVAL | Errno::OPNOTSUPP | Errno::PERM,
                    ) => self.kernel_copy = false,
                    Err(e) => return Err(e),
                }
            }
            if self.data.is_empty() {
                self.data = vec![0; CHUNK];
            }
            let buf = &mut self.data[..want];
            let n = match rustix::io::pread(src, &mut *buf, off) {
                Ok(0) => return Ok(false),
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e),
            };
            let mut written = 0;
            while written < n {
                match rustix::io::pwrite(dst, &buf[written..n], off + written as u64) {
                    Ok(0) => return Err(Errno::IO),
                    Ok(w) => written += w,
                    Err(Errno::INTR) => {}
                    Err(e) => return Err(e),
                }
            }
            off += n as u64;
        }
        Ok(true)
    }

    /// Refuses a source directory that is TO's root: TO inside FROM would copy itself.
    fn not_destination(&self, st: &Stat, rel: &[u8]) -> Result<(), CopyError> {
        if inode(st) == self.to_id {
            return Err(failed(rel, "is the destination".to_string()));
        }
        Ok(())
    }
}

/// A symlink: its target copied as bytes (never resolved), then owner and times (a
/// symlink's mode means nothing on Linux).
fn symlink(parent: &Frame, name: &CStr, rel: &[u8], st: &Stat) -> Result<(), CopyError> {
    let target = rustix::fs::readlinkat(parent.src_fd()?, name, Vec::new())
        .map_err(fail(rel, "cannot read the link"))?;
    rustix::fs::symlinkat(target.as_c_str(), &parent.dst, name)
        .map_err(fail(rel, "cannot create"))?;
    chown_at(parent, name, rel, st)?;
    times_at(parent, name, rel, st)
}

/// The owner of `name` (made by this walk in `parent`), never through a link.
fn chown_at(parent: &Frame, name: &CStr, rel: &[u8], st: &Stat) -> Result<(), CopyError> {
    rustix::fs::chownat(
        &parent.dst,
        name,
        Some(owner(st)),
        Some(group(st)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(fail(rel, "cannot set the owner"))
}

/// The times of `name` (made by this walk in `parent`), never through a link.
fn times_at(parent: &Frame, name: &CStr, rel: &[u8], st: &Stat) -> Result<(), CopyError> {
    rustix::fs::utimensat(&parent.dst, name, &times(st), AtFlags::SYMLINK_NOFOLLOW)
        .map_err(fail(rel, "cannot set the times"))
}

/// A FIFO or device node with the same rdev, then owner, mode and times.
fn node(
    parent: &Frame,
    name: &CStr,
    rel: &[u8],
    st: &Stat,
    kind: FileType,
) -> Result<(), CopyError> {
    // A sandbox has no `CAP_MKNOD`: its upper holds overlay's whiteouts (character devices
    // 0/0) and FIFOs, never another device, which a root copy would make real.
    let whiteout = kind == FileType::CharacterDevice && st.st_rdev == 0;
    if !whiteout && kind != FileType::Fifo {
        return Err(CopyError::Refused {
            path: PathBuf::from(OsStr::from_bytes(rel)),
            reason: "a device node other than a whiteout".into(),
        });
    }
    rustix::fs::mknodat(
        &parent.dst,
        name,
        kind,
        Mode::from_raw_mode(0o600),
        st.st_rdev as _,
    )
    .map_err(fail(rel, "cannot create"))?;
    chown_at(parent, name, rel, st)?;
    // `fchmodat` follows a final symlink, but this name is the node just made, in a directory
    // only this walk writes to.
    rustix::fs::chmodat(&parent.dst, name, mode(st), AtFlags::empty())
        .map_err(fail(rel, "cannot set the mode"))?;
    times_at(parent, name, rel, st)
}

/// Owner, then mode (after, since `chown` clears setuid and setgid), then times, on an fd.
fn set_owner_mode_times(fd: &OwnedFd, st: &Stat) -> Result<(), Errno> {
    rustix::fs::fchown(fd, Some(owner(st)), Some(group(st)))?;
    rustix::fs::fchmod(fd, mode(st))?;
    rustix::fs::futimens(fd, &times(st))
}

/// What an archive spends on an entry beside its data, as a tar copy counts it: a 512-byte
/// header, and a long-name record (a header and the name in 512-byte blocks) for a path or a
/// symlink target past the header's 100 bytes.
pub fn entry_bytes(path: usize, target: usize) -> u64 {
    let long = |len: usize| {
        if len > 100 {
            512 + (len as u64 + 1).div_ceil(512) * 512
        } else {
            0
        }
    };
    512 + long(path) + long(target)
}

/// Copies every `user.*` attribute of `src` to `dst`, answering the bytes of their names and
/// values; a source filesystem without attributes has none to copy.
fn copy_user_xattrs(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    names: &mut [u8],
    value: &mut [u8],
) -> Result<u64, Errno> {
    let mut copied = 0u64;
    let len = match rustix::fs::flistxattr(src, &mut *names) {
        Ok(len) => len,
        Err(Errno::OPNOTSUPP) => return Ok(0),
        Err(e) => return Err(e),
    };
    let list = names.get(..len).unwrap_or_default();
    for name in list.split(|&b| b == 0) {
        if !name.starts_with(b"user.") {
            continue;
        }
        let name = OsStr::from_bytes(name);
        let len = match rustix::fs::fgetxattr(src, name, &mut *value) {
            Ok(len) => len,
            Err(Errno::NODATA) => continue,
            Err(e) => return Err(e),
        };
        let value = value.get(..len).unwrap_or_default();
        rustix::fs::fsetxattr(dst, name, value, XattrFlags::empty())?;
        copied += (name.len() + value.len()) as u64;
    }
    Ok(copied)
}

/// Opens a directory without following a final symlink, readable for listing and for
/// `fgetxattr`/`fsetxattr` (which an `O_PATH` fd cannot do).
fn open_dir<P: rustix::path::Arg>(dir: impl AsFd, path: P) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        dir,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Refuses an opened source that is not the inode `fstatat` saw under its name.
fn same_inode(seen: &Stat, opened: &Stat, rel: &[u8]) -> Result<(), CopyError> {
    if inode(seen) != inode(opened) {
        return Err(failed(rel, "changed while being copied".to_string()));
    }
    Ok(())
}

fn inode(st: &Stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

fn owner(st: &Stat) -> Uid {
    Uid::from_raw(st.st_uid)
}

fn group(st: &Stat) -> Gid {
    Gid::from_raw(st.st_gid)
}

fn mode(st: &Stat) -> Mode {
    Mode::from_raw_mode(st.st_mode & 0o7777)
}

fn times(st: &Stat) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: st.st_atime as _,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: Timespec {
            tv_sec: st.st_mtime as _,
            tv_nsec: st.st_mtime_nsec as _,
        },
    }
}

fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut rel = Vec::with_capacity(parent.len() + 1 + name.len());
    if !parent.is_empty() {
        rel.extend_from_slice(parent);
        rel.push(b'/');
    }
    rel.extend_from_slice(name);
    rel
}

fn failed(rel: &[u8], reason: String) -> CopyError {
    CopyError::Failed {
        path: PathBuf::from(OsStr::from_bytes(rel)),
        reason,
    }
}

/// For `map_err`: a failed syscall at `rel`, doing `what`.
fn fail<'a>(rel: &'a [u8], what: &'a str) -> impl FnOnce(Errno) -> CopyError + 'a {
    move |e| failed(rel, format!("{what}: {}", io::Error::from(e)))
}

#[cfg(test)]
mod tests {
    //! These run as root (here and in CI): they chown to other ids and make device nodes.

    use std::fs;
    use std::io::{Seek, SeekFrom as IoSeek, Write};
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};

    use super::*;

    /// A temporary directory holding `src` and an empty `dst`.
    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
        fs::create_dir(&src).expect("src");
        fs::create_dir(&dst).expect("dst");
        (tmp, src, dst)
    }

    fn lstat(p: &Path) -> fs::Metadata {
        fs::symlink_metadata(p).expect("lstat")
    }

    fn write(p: &Path, content: &[u8], mode: u32) {
        fs::write(p, content).expect("write");
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
    }

    fn set_times(p: &Path, atime: (i64, i64), mtime: (i64, i64)) {
        let ts = |(tv_sec, tv_nsec)| Timespec { tv_sec, tv_nsec };
        let times = Timestamps {
            last_access: ts(atime),
            last_modification: ts(mtime),
        };
        rustix::fs::utimensat(CWD, p, &times, AtFlags::SYMLINK_NOFOLLOW).expect("utimensat");
    }

    /// What every entry is charged beside its data ([`entry_bytes`] of a short name).
    const HEADER: u64 = 512;

    fn xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
        let mut buf = vec![0; XATTR_MAX];
        match rustix::fs::lgetxattr(p, name, &mut buf[..]) {
            Ok(n) => Some(buf[..n].to_vec()),
            Err(Errno::NODATA) => None,
            Err(e) => panic!("lgetxattr {}: {e}", p.display()),
        }
    }

    fn failure(e: CopyError) -> (PathBuf, String) {
        match e {
            CopyError::Failed { path, reason } => (path, reason),
            e => panic!("unexpected {e}"),
        }
    }

    /// The layer worker's shape: each volume into a directory of the layer that the copy
    /// makes, the root's mode carried over, and one budget for all of them.
    #[test]
    fn pairs_make_their_destinations_and_share_one_budget() {
        let (tmp, src, dst) = setup();
        let other = tmp.path().join("other");
        fs::create_dir(&other).expect("mkdir");
        fs::set_permissions(&other, fs::Permissions::from_mode(0o1777)).expect("chmod");
        fs::write(src.join("a"), [1; 600]).expect("write");
        fs::write(other.join("b"), [2; 600]).expect("write");
        let (home, tmpdir) = (dst.join("home"), dst.join("tmp"));
        let pairs = [
            (src.as_path(), home.as_path()),
            (other.as_path(), tmpdir.as_path()),
        ];
        let copied = copy_trees(&pairs, None).expect("copy");
        assert_eq!(
            copied,
            Copied {
                bytes: 2 * (HEADER + 600),
                files: 2
            }
        );
        assert_eq!(fs::read(home.join("a")).expect("a"), [1; 600]);
        assert_eq!(fs::read(tmpdir.join("b")).expect("b"), [2; 600]);
        assert_eq!(lstat(&tmpdir).mode() & 0o7777, 0o1777);

        // Each pair alone is within 1,500 bytes; both are not.
        let (_tmp2, _, dst2) = setup();
        let (h2, t2) = (dst2.join("home"), dst2.join("tmp"));
        let pairs = [
            (src.as_path(), h2.as_path()),
            (other.as_path(), t2.as_path()),
        ];
        let err = copy_trees(&pairs, Some(1_500)).expect_err("over the shared budget");
        assert!(matches!(err, CopyError::OverCap { cap: 1_500 }), "{err}");
    }

    #[test]
    fn copies_nested_dirs_files_and_modes_with_setuid() {
        let (_tmp, src, dst) = setup();
        fs::create_dir_all(src.join("a/b/c")).expect("mkdir");
        write(&src.join("a/secret"), b"shh", 0o600);
        write(&src.join("a/b/tool"), b"#!/bin/sh\n", 0o755);
        write(&src.join("a/b/c/suid"), b"elf", 0o4755);
        write(&src.join("a/b/c/sgid"), b"elf", 0o2711);
        fs::set_permissions(src.join("a/b"), fs::Permissions::from_mode(0o750)).expect("chmod");
        fs::set_permissions(src.join("a/b/c"), fs::Permissions::from_mode(0o1777)).expect("chmod");
        fs::write(src.join("top"), b"").expect("write");

        let copied = copy_tree(&src, &dst, None).expect("copy");
        // a, a/secret, a/b, a/b/tool, a/b/c, a/b/c/suid, a/b/c/sgid, top
        assert_eq!(
            copied,
            Copied {
                bytes: 8 * HEADER + 19,
                files: 8
            }
        );
        assert_eq!(fs::read(dst.join("a/secret")).expect("read"), b"shh");
        assert_eq!(
            fs::read(dst.join("a/b/tool")).expect("read"),
            b"#!/bin/sh\n"
        );
        assert_eq!(fs::read(dst.join("top")).expect("read"), b"");
        let mode = |p: &str| lstat(&dst.join(p)).mode() & 0o7777;
        assert_eq!(mode("a/secret"), 0o600);
        assert_eq!(mode("a/b/tool"), 0o755);
        assert_eq!(mode("a/b/c/suid"), 0o4755);
        assert_eq!(mode("a/b/c/sgid"), 0o2711);
        assert_eq!(mode("a/b"), 0o750);
        assert_eq!(mode("a/b/c"), 0o1777);
    }

    #[test]
    fn symlinks_are_copied_never_followed() {
        let (tmp, src, dst) = setup();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).expect("mkdir");
        fs::write(outside.join("loot"), b"not for the copy").expect("write");
        symlink("/etc/shadow", src.join("abs")).expect("symlink");
        symlink("../outside", src.join("dir")).expect("symlink");
        symlink("../outside/loot", src.join("file")).expect("symlink");
        symlink("nowhere", src.join("dangling")).expect("symlink");

        let copied = copy_tree(&src, &dst, None).expect("copy");
        assert_eq!(
            copied,
            Copied {
                bytes: 4 * HEADER,
                files: 4
            }
        );
        for (name, target) in [
            ("abs", "/etc/shadow"),
            ("dir", "../outside"),
            ("file", "../outside/loot"),
            ("dangling", "nowhere"),
        ] {
            assert!(lstat(&dst.join(name)).file_type().is_symlink(), "{name}");
            assert_eq!(
                fs::read_link(dst.join(name)).expect("readlink"),
                Path::new(target)
            );
        }
        // FROM's root as a symlink is refused too.
        let linked = tmp.path().join("linked");
        symlink(&src, &linked).expect("symlink");
        let other = tmp.path().join("other");
        fs::create_dir(&other).expect("mkdir");
        let (path, reason) = failure(copy_tree(&linked, &other, None).expect_err("a link"));
        assert_eq!(path, Path::new(""));
        assert!(reason.starts_with("cannot open the source"), "{reason}");
    }

    #[test]
    fn a_sparse_gigabyte_stays_sparse() {
        let (_tmp, src, dst) = setup();
        let f = fs::File::create(src.join("big")).expect("create");
        f.set_len(1 << 30).expect("truncate");
        drop(f);

        let copied = copy_tree(&src, &dst, None).expect("copy");
        assert_eq!(
            copied,
            Copied {
                bytes: HEADER + (1 << 30),
                files: 1
            }
        );
        let meta = lstat(&dst.join("big"));
        assert_eq!(meta.len(), 1 << 30);
        assert!(meta.blocks() < 64, "{} blocks", meta.blocks());
    }

    #[test]
    fn data_between_holes_lands_at_its_offsets() {
        let (_tmp, src, dst) = setup();
        let mut f = fs::File::create(src.join("holey")).expect("create");
        f.seek(IoSeek::Start(8 << 20)).expect("seek");
        f.write_all(&[7; 5000]).expect("write");
        f.set_len(64 << 20).expect("truncate");
        drop(f);
        let mut dense: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        dense.extend_from_slice(b"tail");
        fs::write(src.join("dense"), &dense).expect("write");

        copy_tree(&src, &dst, None).expect("copy");
        assert_eq!(
            fs::read(dst.join("holey")).expect("read"),
            fs::read(src.join("holey")).expect("read")
        );
        let meta = lstat(&dst.join("holey"));
        assert_eq!(meta.len(), 64 << 20);
        assert!(meta.blocks() < 1024, "{} blocks", meta.blocks());
        assert_eq!(fs::read(dst.join("dense")).expect("read"), dense);
    }

    #[test]
    fn reads_and_writes_copy_the_same_when_copy_file_range_is_refused() {
        let (_tmp, src, dst) = setup();
        let mut f = fs::File::create(src.join("f")).expect("create");
        f.write_all(b"head").expect("write");
        f.seek(IoSeek::Start(4 << 20)).expect("seek");
        let middle: Vec<u8> = (0..(CHUNK as u32 * 2 + 17))
            .map(|i| (i % 253) as u8)
            .collect();
        f.write_all(&middle).expect("write");
        f.set_len(16 << 20).expect("truncate");
        drop(f);
        let size = lstat(&src.join("f")).len();

        let to_root = open_dir(CWD, &dst).expect("open");
        let stat = rustix::fs::fstat(&to_root).expect("fstat");
        let mut walk = Walk::new(to_root, &stat, None);
        walk.kernel_copy = false;
        let from = rustix::fs::open(src.join("f"), OFlags::RDONLY, Mode::empty()).expect("open");
        let to = rustix::fs::open(
            dst.join("f"),
            OFlags::WRONLY | OFlags::CREATE,
            Mode::from_raw_mode(0o600),
        )
        .expect("create");
        walk.copy_data(&from, &to, size).expect("copy");
        rustix::fs::ftruncate(&to, size).expect("truncate");
        assert!(!walk.kernel_copy);
        assert_eq!(
            fs::read(dst.join("f")).expect("read"),
            fs::read(src.join("f")).expect("read")
        );
        assert!(lstat(&dst.join("f")).blocks() < 8192);
    }

    #[test]
    fn hard_links_stay_linked_and_count_once() {
        let (_tmp, src, dst) = setup();
        fs::create_dir(src.join("sub")).expect("mkdir");
        fs::write(src.join("a"), [1; 100]).expect("write");
        fs::hard_link(src.join("a"), src.join("sub/b")).expect("link");
        fs::write(src.join("c"), [2; 50]).expect("write");
        rustix::fs::mknodat(
            CWD,
            src.join("wh1"),
            FileType::CharacterDevice,
            Mode::empty(),
            0,
        )
        .expect("mknod");
        fs::hard_link(src.join("wh1"), src.join("sub/wh2")).expect("link");

        // a, sub, sub/b, c, wh1, sub/wh2; the linked 100 bytes count once, so 150 fits.
        let copied = copy_tree(&src, &dst, Some(6 * HEADER + 150)).expect("copy");
        assert_eq!(
            copied,
            Copied {
                bytes: 6 * HEADER + 150,
                files: 6
            }
        );
        let (a, b) = (lstat(&dst.join("a")), lstat(&dst.join("sub/b")));
        assert_eq!(a.ino(), b.ino());
        assert_eq!(a.nlink(), 2);
        assert_eq!(
            lstat(&dst.join("wh1")).ino(),
            lstat(&dst.join("sub/wh2")).ino()
        );
        assert_ne!(a.ino(), lstat(&dst.join("c")).ino());
    }

    #[test]
    fn whiteouts_are_copied_and_other_devices_refused() {
        let (_tmp, src, dst) = setup();
        fs::create_dir(src.join("d")).expect("mkdir");
        // mknod's mode passes the umask: chmod states it.
        let mknod = |name: &str, kind, mode, dev| {
            let mode = Mode::from_raw_mode(mode);
            rustix::fs::mknodat(CWD, src.join(name), kind, mode, dev).expect("mknod");
            rustix::fs::chmodat(CWD, src.join(name), mode, AtFlags::empty()).expect("chmod");
        };
        mknod("d/gone", FileType::CharacterDevice, 0, 0);
        let copied = copy_tree(&src, &dst, None).expect("copy");
        assert_eq!(
            copied,
            Copied {
                bytes: 2 * HEADER,
                files: 2
            }
        );
        let gone = lstat(&dst.join("d/gone"));
        assert!(gone.file_type().is_char_device());
        assert_eq!(gone.rdev(), 0);
        assert_eq!(gone.mode() & 0o7777, 0);

        // A real device (which no sandbox can make) refuses the copy rather than making it.
        for (name, kind, dev) in [
            ("null", FileType::CharacterDevice, rustix::fs::makedev(1, 3)),
            ("disk", FileType::BlockDevice, rustix::fs::makedev(8, 1)),
        ] {
            let (_tmp, src2, dst2) = setup();
            let mode = Mode::from_raw_mode(0o666);
            rustix::fs::mknodat(CWD, src2.join(name), kind, mode, dev).expect("mknod");
            let err = copy_tree(&src2, &dst2, None).expect_err("a device");
            assert!(matches!(err, CopyError::Refused { .. }), "{err}");
            assert!(err.to_string().starts_with(name), "{err}");
            assert!(std::fs::symlink_metadata(dst2.join(name)).is_err());
        }
    }

    #[test]
    fn fifos_are_copied_and_sockets_skipped() {
        let (_tmp, src, dst) = setup();
        rustix::fs::mkfifoat(CWD, src.join("pipe"), Mode::from_raw_mode(0o640)).expect("fifo");
        rustix::fs::chmodat(
            CWD,
            src.join("pipe"),
            Mode::from_raw_mode(0o640),
            AtFlags::empty(),
        )
        .expect("chmod");
        let _listener = std::os::unix::net::UnixListener::bind(src.join("sock")).expect("bind");

        let copied = copy_tree(&src, &dst, None).expect("copy");
        assert_eq!(
            copied,
            Copied {
                bytes: HEADER,
                files: 1
            }
        );
        let pipe = lstat(&dst.join("pipe"));
        assert!(pipe.file_type().is_fifo());
        assert_eq!(pipe.mode() & 0o7777, 0o640);
        assert!(!dst.join("sock").exists());
    }

    #[test]
    fn user_xattrs_are_copied_and_others_ignored() {
        let (_tmp, src, dst) = setup();
        fs::create_dir(src.join("opaque")).expect("mkdir");
        fs::write(src.join("opaque/f"), b"x").expect("write");
        let set = |p: &Path, name: &str, value: &[u8]| {
            rustix::fs::lsetxattr(p, name, value, XattrFlags::empty()).expect("setxattr");
        };
        set(&src.join("opaque"), "user.overlay.opaque", b"y");
        set(
            &src.join("opaque/f"),
            "user.overlay.redirect",
            b"/elsewhere",
        );
        set(&src.join("opaque/f"), "user.empty", b"");
        set(&src.join("opaque/f"), "trusted.overlay.opaque", b"y");
        set(&src, "user.root", b"r");

        copy_tree(&src, &dst, None).expect("copy");
        let get = |p: &str, name| xattr(&dst.join(p), name);
        assert_eq!(
            get("opaque", "user.overlay.opaque").as_deref(),
            Some(&b"y"[..])
        );
        assert_eq!(
            get("opaque/f", "user.overlay.redirect").as_deref(),
            Some(&b"/elsewhere"[..])
        );
        assert_eq!(get("opaque/f", "user.empty").as_deref(), Some(&b""[..]));
        assert_eq!(get("opaque/f", "trusted.overlay.opaque"), None);
        assert_eq!(get("", "user.root").as_deref(), Some(&b"r"[..]));
    }

    #[test]
    fn ownership_is_copied_by_number() {
        let (_tmp, src, dst) = setup();
        fs::create_dir(src.join("dir")).expect("mkdir");
        fs::write(src.join("dir/file"), b"x").expect("write");
        write(&src.join("suid"), b"x", 0o4755);
        symlink("dir/file", src.join("link")).expect("symlink");
        rustix::fs::mkfifoat(CWD, src.join("pipe"), Mode::from_raw_mode(0o600)).expect("fifo");
        for name in ["", "dir", "dir/file", "suid", "link", "pipe"] {
            std::os::unix::fs::lchown(src.join(name), Some(1234), Some(5678)).expect("lchown");
        }
        // chown cleared setuid: put it back, as the sandbox would have.
        fs::set_permissions(src.join("suid"), fs::Permissions::from_mode(0o4755)).expect("chmod");

        copy_tree(&src, &dst, None).expect("copy");
        for name in ["", "dir", "dir/file", "suid", "link", "pipe"] {
            let meta = lstat(&dst.join(name));
            assert_eq!((meta.uid(), meta.gid()), (1234, 5678), "{name:?}");
        }
        assert_eq!(lstat(&dst.join("suid")).mode() & 0o7777, 0o4755);
    }

    #[test]
    fn times_are_preserved_to_the_nanosecond() {
        let (_tmp, src, dst) = setup();
        fs::create_dir(src.join("dir")).expect("mkdir");
        fs::write(src.join("dir/file"), b"x").expect("write");
        symlink("dir/file", src.join("link")).expect("symlink");
        rustix::fs::mkfifoat(CWD, src.join("pipe"), Mode::from_raw_mode(0o600)).expect("fifo");
        let stamps = [
            (
                "dir/file",
                (1_600_000_001, 11),
                (1_500_000_001, 123_456_789),
            ),
            ("dir", (1_600_000_002, 22), (1_500_000_002, 987_654_321)),
            ("link", (1_600_000_003, 33), (1_500_000_003, 5)),
            ("pipe", (1_600_000_004, 44), (1_500_000_004, 999_999_999)),
            ("", (1_600_000_005, 55), (1_500_000_005, 1)),
        ];
        // Contents first, their directories after, as a directory's own entries change it.
        for (name, atime, mtime) in stamps {
            set_times(&src.join(name), atime, mtime);
        }

        copy_tree(&src, &dst, None).expect("copy");
        for (name, atime, mtime) in stamps {
            let meta = lstat(&dst.join(name));
            assert_eq!((meta.mtime(), meta.mtime_nsec()), mtime, "{name:?} mtime");
            assert_eq!((meta.atime(), meta.atime_nsec()), atime, "{name:?} atime");
        }
    }

    #[test]
    fn the_byte_cap_stops_the_copy() {
        let (_tmp, src, dst) = setup();
        fs::create_dir(src.join("d")).expect("mkdir");
        fs::write(src.join("d/one"), [0; 600]).expect("write");
        fs::write(src.join("d/two"), [0; 600]).expect("write");
        fs::hard_link(src.join("d/one"), src.join("again")).expect("link");

        let err = copy_tree(&src, &dst, Some(1000)).expect_err("over the cap");
        assert!(matches!(err, CopyError::OverCap { cap: 1000 }), "{err}");
        assert_eq!(err.to_string(), "over cap: 1000 bytes");

        // At the cap exactly it fits, the hard link's data counted once (its header too).
        let dst2 = dst.with_file_name("dst2");
        fs::create_dir(&dst2).expect("mkdir");
        let cap = 4 * HEADER + 1200;
        let copied = copy_tree(&src, &dst2, Some(cap)).expect("fits");
        assert_eq!(
            copied,
            Copied {
                bytes: cap,
                files: 4
            }
        );
    }

    /// Entries without data count as an archive of them would: a tree of empty directories
    /// with long names, and attributes, is stopped by a cap its (zero) file bytes would pass.
    #[test]
    fn directories_long_names_and_attributes_count_against_the_cap() {
        let (_tmp, src, dst) = setup();
        let long = "d".repeat(150);
        for i in 0..20 {
            fs::create_dir(src.join(format!("{long}{i:02}"))).expect("mkdir");
        }
        // 20 entries, each a header and a long-name record (a header and one block).
        let each = entry_bytes(152, 0);
        assert_eq!(each, 3 * HEADER);
        let err = copy_tree(&src, &dst, Some(20 * each - 1)).expect_err("over the cap");
        assert!(matches!(err, CopyError::OverCap { .. }), "{err}");
        let dst2 = dst.with_file_name("dst2");
        fs::create_dir(&dst2).expect("mkdir");
        let copied = copy_tree(&src, &dst2, Some(20 * each)).expect("fits");
        assert_eq!(copied.bytes, 20 * each);

        // A symlink's long target, and a file's attributes, count too.
        let (_tmp, src, dst) = setup();
        symlink("t".repeat(600), src.join("l")).expect("symlink");
        fs::write(src.join("f"), b"").expect("write");
        rustix::fs::lsetxattr(src.join("f"), "user.big", &[7u8; 1000], XattrFlags::empty())
            .expect("setxattr");
        let copied = copy_tree(&src, &dst, None).expect("copy");
        assert_eq!(
            copied.bytes,
            entry_bytes(1, 600) + HEADER + "user.big".len() as u64 + 1000
        );
        assert_eq!(entry_bytes(1, 600), HEADER + HEADER + 2 * HEADER);
    }

    #[test]
    fn a_tree_deeper_than_the_limit_is_refused() {
        let (_tmp, src, dst) = setup();
        // Built fd-relative: the path would grow long.
        let mut dir = open_dir(CWD, &src).expect("open");
        for _ in 1..MAX_DEPTH {
            rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o755)).expect("mkdir");
            dir = open_dir(&dir, "d").expect("open");
        }
        // MAX_DEPTH levels, the root included: fine.
        let copied = copy_tree(&src, &dst, None).expect("copy");
        assert_eq!(copied.files, MAX_DEPTH as u64 - 1);

        rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o755)).expect("mkdir");
        let dst2 = dst.with_file_name("dst2");
        fs::create_dir(&dst2).expect("mkdir");
        let (path, reason) = match copy_tree(&src, &dst2, None).expect_err("too deep") {
            CopyError::Refused { path, reason } => (path, reason),
            e => panic!("not a refusal: {e}"),
        };
        assert_eq!(path.components().count(), MAX_DEPTH);
        assert_eq!(reason, format!("deeper than {MAX_DEPTH} levels"));
    }

    #[test]
    fn errors_name_the_path_relative_to_the_source() {
        let (tmp, src, dst) = setup();
        fs::create_dir_all(src.join("a/b/new\nline")).expect("mkdir");
        // TO already holds `a`: the copy stops there.
        fs::create_dir(dst.join("a")).expect("mkdir");
        let message = copy_tree(&src, &dst, None).expect_err("exists").to_string();
        assert!(message.starts_with("a: cannot create: "), "{message}");
        assert!(
            !message.contains(&*tmp.path().to_string_lossy()),
            "{message}"
        );
        // Deeper, and a newline in a name stays escaped: the message is one line.
        let message = copy_tree(&src, &src.join("a/b/new\nline"), None)
            .expect_err("inside")
            .to_string();
        assert_eq!(message, "a/b/new\\nline: is the destination");
    }

    #[test]
    fn a_destination_inside_the_source_is_refused() {
        let (_tmp, src, _dst) = setup();
        let inner = src.join("x/inner");
        fs::create_dir_all(&inner).expect("mkdir");
        let (path, reason) = failure(copy_tree(&src, &inner, None).expect_err("inside"));
        assert_eq!(path, Path::new("x/inner"));
        assert_eq!(reason, "is the destination");
    }

    #[test]
    fn the_roots_take_the_source_roots_owner_and_mode() {
        let (_tmp, src, dst) = setup();
        fs::set_permissions(&src, fs::Permissions::from_mode(0o751)).expect("chmod");
        std::os::unix::fs::lchown(&src, Some(42), Some(43)).expect("chown");
        let copied = copy_tree(&src, &dst, None).expect("copy");
        assert_eq!(copied, Copied::default());
        let meta = lstat(&dst);
        assert_eq!(meta.mode() & 0o7777, 0o751);
        assert_eq!((meta.uid(), meta.gid()), (42, 43));
        assert_eq!(
            serde_json::to_string(&copied).expect("json"),
            r#"{"bytes":0,"files":0}"#
        );
    }
}
