//! Walking a tree below an open directory, never following a symlink, and the globs that pick
//! and prune what it visits.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use globset::{GlobBuilder, GlobMatcher, GlobSet, GlobSetBuilder};
use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;
use sandbox_protocol::wire::FsErrorCode;

use super::errno::errno_fail;
use super::file_type;
use crate::ops::{OpError, Stop, fail};

/// A `glob` pattern (over paths relative to the walk's start) or grep's `glob` (over basenames):
/// `*` stays within one component, `**` crosses them, `\` escapes; an invalid one is
/// `invalid_pattern`.
pub(super) fn glob_matcher(pattern: &str) -> Result<GlobMatcher, OpError> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| fail(FsErrorCode::InvalidPattern, format!("invalid glob: {e}")))
}

/// Directory basename globs, as `find -name` took them; an invalid one matches nothing.
pub(super) fn prune_set(prune: &[String]) -> GlobSet {
    let mut b = GlobSetBuilder::new();
    for p in prune.iter().filter(|p| !p.is_empty()) {
        if let Ok(g) = GlobBuilder::new(p)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
        {
            b.add(g);
        }
    }
    b.build().unwrap_or_else(|_| GlobSet::empty())
}

/// A directory's entries: each name and its type.
pub(super) type Names = Vec<(Vec<u8>, FileType)>;

/// A directory's entries (without `.` and `..`), sorted by name; types not reported by
/// `readdir` are looked up without following links.
pub(super) fn read_dir(fd: &OwnedFd, stop: &Stop<'_>) -> Result<Names, OpError> {
    Ok(read_dir_within(fd, stop, u64::MAX)?.unwrap_or_default())
}

/// [`read_dir`], or `None` as soon as the names come to more than `max_name_bytes` (a listing
/// of them would be larger still): a huge directory is not read whole to be refused.
pub(super) fn read_dir_within(
    fd: &OwnedFd,
    stop: &Stop<'_>,
    max_name_bytes: u64,
) -> Result<Option<Names>, OpError> {
    let mut dir = Dir::read_from(fd).map_err(|e| errno_fail(e, "directory"))?;
    let mut out = Vec::new();
    let mut names = 0u64;
    while let Some(entry) = dir.read() {
        let Ok(entry) = entry else { break };
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names += name.len() as u64;
        if names > max_name_bytes {
            return Ok(None);
        }
        let mut ft = entry.file_type();
        if ft == FileType::Unknown {
            ft = rustix::fs::statat(fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| file_type(&st))
                .unwrap_or(FileType::Unknown);
        }
        out.push((name.to_vec(), ft));
        if out.len() % 4096 == 0 {
            stop.check()?;
        }
    }
    out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(Some(out))
}

pub(crate) fn open_child_dir(dir: &OwnedFd, name: &[u8]) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        dir,
        OsStr::from_bytes(name),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Depth-first, pre-order, sorted walk below `fd` that never follows a symlink; pruned
/// directories are neither visited nor entered, unreadable ones are skipped (as `find
/// 2>/dev/null` did). `visit(dir, rel, name, type)` returns `false` to stop the walk.
pub(super) fn walk(
    fd: OwnedFd,
    prune: &GlobSet,
    stop: &Stop<'_>,
    mut visit: impl FnMut(&OwnedFd, &[u8], &[u8], FileType) -> Result<bool, OpError>,
) -> Result<(), OpError> {
    struct Frame {
        fd: OwnedFd,
        rel: Vec<u8>,
        entries: std::vec::IntoIter<(Vec<u8>, FileType)>,
    }
    let entries = read_dir(&fd, stop)?.into_iter();
    let mut stack = vec![Frame {
        fd,
        rel: Vec::new(),
        entries,
    }];
    let mut seen = 0u64;
    while let Some(top) = stack.last_mut() {
        let Some((name, ft)) = top.entries.next() else {
            stack.pop();
            continue;
        };
        seen += 1;
        if seen.is_multiple_of(256) {
            stop.check()?;
        }
        let mut rel = top.rel.clone();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(&name);
        if ft == FileType::Directory && prune.is_match(OsStr::from_bytes(&name)) {
            continue;
        }
        if !visit(&top.fd, &rel, &name, ft)? {
            return Ok(());
        }
        if ft == FileType::Directory
            && let Ok(child) = open_child_dir(&top.fd, &name)
        {
            let entries = read_dir(&child, stop)?.into_iter();
            stack.push(Frame {
                fd: child,
                rel,
                entries,
            });
        }
    }
    Ok(())
}
