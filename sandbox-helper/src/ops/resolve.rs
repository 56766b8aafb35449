//! Path resolution confined to the workspace root, the point of this crate.
//!
//! Commands in the sandbox can plant symlinks anywhere in the workspace and swap them while an op
//! runs, so no path is ever handed to the kernel whole. Every component is opened from the fd of
//! the directory before it with `O_PATH | O_NOFOLLOW`; a symlink is read with `readlinkat` and
//! its target spliced into the remaining components by us: absolute targets must lie under
//! `/workspace` (resolution restarts at the root fd), `..` pops our own stack of directory fds
//! and so never climbs above the root, and at most [`MAX_HOPS`] links are followed. Whatever a
//! racing command does, each step lands on an entry inside the tree we started from.
//!
//! (A directory renamed out of the tree while we hold its fd would take us with it; in
//! production `/workspace` is its own volume, and rename across mounts fails with `EXDEV`.)

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use rustix::fd::OwnedFd;
use rustix::fs::{FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use sandbox_protocol::layout::WORKSPACE;

/// Symlinks followed in one resolution (the kernel's own limit).
pub const MAX_HOPS: usize = 40;

/// Why a path did not resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolveError {
    /// A syscall failed on a component: `NOENT`, `ACCES`, `NOTDIR` (a non-directory where a
    /// directory is needed), ...
    Errno(Errno),
    /// A symlink's target lies outside the workspace.
    Outside,
    /// More than [`MAX_HOPS`] symlinks.
    Loop,
    /// The path leads into the service's own directory (a root opened with
    /// [`Root::open_anywhere`]).
    Denied,
}

impl From<Errno> for ResolveError {
    fn from(e: Errno) -> Self {
        ResolveError::Errno(e)
    }
}

/// How to treat the path's last component.
#[derive(Debug, Clone, Copy, Default)]
pub struct Opts {
    /// Follow a final symlink (`read`, `edit`, directory ops); else return the link itself.
    pub follow_final: bool,
    /// Create missing intermediate directories (0755) on the way (`write`, `extract`).
    pub create_parents: bool,
    /// An absent final component is fine (`write`, `delete`): `stat` is then `None`.
    pub missing_ok: bool,
}

/// Where a path landed.
pub struct Resolved {
    /// The directory holding the final entry, or the final directory itself when `name` is
    /// `None` (the root, or a path ending in `..` through a link).
    pub dir: OwnedFd,
    pub name: Option<OsString>,
    /// The final entry's `lstat`, `None` when it is absent.
    pub stat: Option<Stat>,
}

impl Resolved {
    pub fn file_type(&self) -> Option<FileType> {
        self.stat
            .as_ref()
            .map(|s| FileType::from_raw_mode(s.st_mode))
    }

    /// Opens the final entry with `flags | O_NOFOLLOW | O_CLOEXEC`: a symlink swapped in since
    /// resolution fails with `ELOOP` instead of being followed.
    pub fn open(&self, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match &self.name {
            Some(n) => rustix::fs::openat(&self.dir, n.as_os_str(), flags, mode),
            None => rustix::fs::openat(&self.dir, ".", flags, mode),
        }
    }

    /// Opens the final entry as a directory for reading its entries.
    pub fn open_dir(&self) -> Result<OwnedFd, Errno> {
        self.open(
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NONBLOCK,
            Mode::empty(),
        )
    }
}

/// The workspace root, held open for the helper's lifetime.
pub struct Root {
    fd: OwnedFd,
    /// Where absolute symlink targets must lie: `/workspace`, or `""` (anywhere) for a root
    /// opened with [`Root::open_anywhere`].
    prefix: &'static str,
    /// `(st_dev, st_ino)` of a directory no resolution may enter.
    deny: Option<(u64, u64)>,
}

impl Root {
    pub fn open(dir: &Path) -> std::io::Result<Root> {
        let fd = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root {
            fd,
            prefix: WORKSPACE,
            deny: None,
        })
    }

    /// The container's `/`, for the data plane's ops on paths anywhere: absolute symlink targets
    /// restart at `/`, and no step may enter `deny` (the service's own directory, recognised by
    /// its device and inode, so no other name of it, a bind mount or `/proc/self/root/...`,
    /// leads in either).
    pub fn open_anywhere(deny: &Path) -> std::io::Result<Root> {
        let fd = rustix::fs::open(
            "/",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let st = rustix::fs::stat(deny)?;
        Ok(Root {
            fd,
            prefix: "",
            deny: Some((st.st_dev, st.st_ino)),
        })
    }

    pub fn denied(&self, st: &Stat) -> bool {
        self.deny == Some((st.st_dev, st.st_ino))
    }

    fn dup(&self) -> Result<OwnedFd, Errno> {
        rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    }

    /// Resolves a validated wire path (`/workspace/...`).
    pub fn resolve(&self, wire: &str, opts: Opts) -> Result<Resolved, ResolveError> {
        let rel = wire.strip_prefix(WORKSPACE).unwrap_or(wire);
        self.resolve_bytes(rel.as_bytes(), opts)
    }

    /// Resolves raw path bytes relative to the root (leading slashes ignored).
    pub fn resolve_bytes(&self, rel: &[u8], opts: Opts) -> Result<Resolved, ResolveError> {
        let mut queue: VecDeque<Vec<u8>> = components(rel).collect();
        let mut stack: Vec<OwnedFd> = vec![self.dup()?];
        let mut hops = 0usize;
        while let Some(comp) = queue.pop_front() {
            if comp == b".." {
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            let last = queue.is_empty();
            let Some(cur) = stack.last() else {
                return Err(Errno::INVAL.into());
            };
            let name = OsString::from_vec(comp);
            let fd = match rustix::fs::openat(
                cur,
                name.as_os_str(),
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if last && opts.missing_ok => {
                    return Ok(Resolved {
                        dir: pop(stack)?,
                        name: Some(name),
                        stat: None,
                    });
                }
                Err(Errno::NOENT) if !last && opts.create_parents => {
                    match make_dir(cur, &name, 0o755) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    // Open it like any other component: whatever is there now is checked.
                    queue.push_front(name.into_vec());
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let st = rustix::fs::fstat(&fd)?;
            if self.denied(&st) {
                return Err(ResolveError::Denied);
            }
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory if !last => stack.push(fd),
                FileType::Symlink if !last || opts.follow_final => {
                    hops += 1;
                    if hops > MAX_HOPS {
                        return Err(ResolveError::Loop);
                    }
                    let target = rustix::fs::readlinkat(&fd, "", Vec::new())?.into_bytes();
                    if target.is_empty() {
                        return Err(Errno::NOENT.into());
                    }
                    let rest: Vec<Vec<u8>> = if target.starts_with(b"/") {
                        let ws = self.prefix.as_bytes();
                        let under = target
                            .strip_prefix(ws)
                            .filter(|r| r.is_empty() || r[0] == b'/');
                        let Some(under) = under else {
                            return Err(ResolveError::Outside);
                        };
                        stack.truncate(1);
                        components(under).collect()
                    } else {
                        components(&target).collect()
                    };
                    for c in rest.into_iter().rev() {
                        queue.push_front(c);
                    }
                }
                _ if last => {
                    return Ok(Resolved {
                        dir: pop(stack)?,
                        name: Some(name),
                        stat: Some(st),
                    });
                }
                _ => return Err(Errno::NOTDIR.into()),
            }
        }
        // Ended on the root, `.` or `..`: the final entry is the directory on top of the stack.
        let dir = pop(stack)?;
        let st = rustix::fs::fstat(&dir)?;
        if self.denied(&st) {
            return Err(ResolveError::Denied);
        }
        Ok(Resolved {
            dir,
            name: None,
            stat: Some(st),
        })
    }
}

fn pop(mut stack: Vec<OwnedFd>) -> Result<OwnedFd, Errno> {
    stack.pop().ok_or(Errno::INVAL)
}

/// Path components, empty and `.` ones dropped.
pub fn components(path: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    path.split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
}

/// `mkdirat` then an exact `fchmod` (the umask would otherwise decide), through an fd opened
/// without following links so a racing symlink cannot redirect the chmod.
pub fn make_dir(dir: &OwnedFd, name: &OsString, mode: u32) -> Result<(), Errno> {
    rustix::fs::mkdirat(dir, name.as_os_str(), Mode::from_raw_mode(mode))?;
    if let Ok(fd) = rustix::fs::openat(
        dir,
        name.as_os_str(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, tempfile::TempDir, Root) {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::fs::write(root.path().join("a/b/f"), b"x").unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        let r = Root::open(root.path()).unwrap();
        (root, outside, r)
    }

    const FOLLOW: Opts = Opts {
        follow_final: true,
        create_parents: false,
        missing_ok: false,
    };

    #[test]
    fn links_resolve_inside_and_are_refused_outside() {
        let (root, outside, r) = setup();
        let p = root.path();
        symlink("b/f", p.join("a/rel")).unwrap();
        symlink("/workspace/a/b", p.join("abs")).unwrap();
        symlink(outside.path().join("secret"), p.join("out")).unwrap();
        symlink("../../../../../../../etc/passwd", p.join("a/up")).unwrap();
        symlink("loop", p.join("loop")).unwrap();
        let res = r.resolve("/workspace/a/rel", FOLLOW).unwrap();
        assert_eq!(res.file_type(), Some(FileType::RegularFile));
        assert_eq!(res.name.as_deref(), Some(std::ffi::OsStr::new("f")));
        let res = r.resolve("/workspace/abs/f", FOLLOW).unwrap();
        assert_eq!(res.file_type(), Some(FileType::RegularFile));
        assert_eq!(
            r.resolve("/workspace/out", FOLLOW).err(),
            Some(ResolveError::Outside)
        );
        // `..` stops at the root: this names <root>/etc/passwd, which does not exist.
        assert_eq!(
            r.resolve("/workspace/a/up", FOLLOW).err(),
            Some(ResolveError::Errno(Errno::NOENT))
        );
        assert_eq!(
            r.resolve("/workspace/loop", FOLLOW).err(),
            Some(ResolveError::Loop)
        );
        // Not following the final link returns the link itself.
        let res = r.resolve("/workspace/out", Opts::default()).unwrap();
        assert_eq!(res.file_type(), Some(FileType::Symlink));
        assert_eq!(
            r.resolve("/workspace/a/b/f/x", FOLLOW).err(),
            Some(ResolveError::Errno(Errno::NOTDIR))
        );
        let res = r.resolve("/workspace", FOLLOW).unwrap();
        assert!(res.name.is_none());
        assert_eq!(res.file_type(), Some(FileType::Directory));
    }

    #[test]
    fn parents_are_created_and_missing_finals_allowed() {
        let (root, _o, r) = setup();
        let opts = Opts {
            follow_final: false,
            create_parents: true,
            missing_ok: true,
        };
        let res = r.resolve("/workspace/n/e/w/file", opts).unwrap();
        assert!(res.stat.is_none());
        assert!(root.path().join("n/e/w").is_dir());
    }
}
