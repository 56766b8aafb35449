//! `watch`: the changes under a directory anywhere, from inotify, as the sandbox user (the kernel
//! decides what may be watched; the service's own directory is refused under any name, as every
//! data-plane path is).
//!
//! Each directory is opened (resolved as every data-plane path is) and watched through
//! `/proc/self/fd/N`, so a symlink swapped in after the resolution is never followed; the fd is
//! closed at once (an open one would keep a removed directory's inode, and its `remove`, alive),
//! and an entry is resolved again when a change is reported. Recursive: every subdirectory at arming,
//! and each one created later, as it appears (what it already holds then is reported as created).
//! Memory is bounded: the kernel's queue overflows into an `overflow` event, the watches stop at
//! [`MAX_WATCHES`] (also an `overflow`), and a slow client slows this thread (the helper's
//! output queue is bounded) rather than growing anything.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fd::{AsRawFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use sandbox_protocol::files::FileEntry;
use sandbox_protocol::message::{ChangeKind, Event};
use sandbox_protocol::wire::FsErrorCode;

use super::files::entry;
use super::fs::errno::{io_fail, open_err, resolve_err};
use super::resolve::{Opts, Root};
use super::{OpError, Stop, TICK, fail};

/// Most directories one watch holds (and file descriptors it keeps open).
pub const MAX_WATCHES: usize = 8192;

/// Most entries a watch remembers from scanning new directories (to tell a scanned entry from
/// the kernel's later report of the same one); past it, such an entry may be reported twice.
const MAX_SCANNED: usize = 65_536;

const FOLLOW: Opts = Opts {
    follow_final: true,
    create_parents: false,
    missing_ok: false,
};

fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
        | WatchMask::EXCL_UNLINK
}

/// One watched directory: where the helper finds it, and the path the client knows it by.
struct Dir {
    host: String,
    shown: String,
}

struct Watcher<'a> {
    root: &'a Root,
    ino: Inotify,
    dirs: HashMap<WatchDescriptor, Dir>,
    recursive: bool,
    /// Changes sent so far.
    sent: u64,
    /// An `overflow` was sent for the watch limit (once is enough).
    full: bool,
    /// Entries a scan of a new directory reported as created, by inode: one created between the
    /// watch's arming and the scan is also in the kernel's queue, and that report is dropped.
    scanned: HashMap<(WatchDescriptor, OsString), u64>,
}

/// Entry `name` of `dir` and its inode.
fn stat_entry(dir: &OwnedFd, name: &OsStr, path: &str) -> Option<(FileEntry, u64)> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    Some((entry(path, dir, Some(name), &st), st.st_ino))
}

fn child(shown: &str, name: &OsStr) -> String {
    format!(
        "{}/{}",
        shown.trim_end_matches('/'),
        String::from_utf8_lossy(name.as_bytes())
    )
}

impl Watcher<'_> {
    /// Watches directory `fd` (and, recursive, what is below it); `scan` reports what it holds
    /// as created (a directory that appeared after arming). Answers the first directory's watch;
    /// failing that is the error, any below it is skipped.
    fn add(
        &mut self,
        fd: OwnedFd,
        dir: Dir,
        scan: bool,
        emit: &mut dyn FnMut(Event),
    ) -> std::io::Result<Option<WatchDescriptor>> {
        let mut first = None;
        let mut todo = vec![(fd, dir)];
        while let Some((fd, dir)) = todo.pop() {
            if self.dirs.len() >= MAX_WATCHES {
                if !self.full {
                    self.full = true;
                    emit(Event::Overflow);
                }
                break;
            }
            let at = format!("/proc/self/fd/{}", fd.as_raw_fd());
            let wd = match self.ino.watches().add(&at, mask()) {
                Ok(wd) => wd,
                Err(e) if first.is_none() => return Err(e),
                Err(_) => continue,
            };
            first.get_or_insert_with(|| wd.clone());
            if (self.recursive || scan)
                && let Ok(mut rd) = rustix::fs::Dir::read_from(&fd)
            {
                while let Some(Ok(e)) = rd.read() {
                    let name = OsStr::from_bytes(e.file_name().to_bytes()).to_owned();
                    if name == "." || name == ".." {
                        continue;
                    }
                    let path = child(&dir.shown, &name);
                    if scan {
                        let found = stat_entry(&fd, &name, &path);
                        if let Some((_, ino)) = &found
                            && self.scanned.len() < MAX_SCANNED
                        {
                            self.scanned.insert((wd.clone(), name.clone()), *ino);
                        }
                        let entry = found.map(|(e, _)| e);
                        self.change(ChangeKind::Create, path.clone(), entry, emit);
                    }
                    if self.recursive
                        && let Some(sub) = self.open_sub(&fd, &name)
                    {
                        let host = child(&dir.host, &name);
                        todo.push((sub, Dir { host, shown: path }));
                    }
                }
            }
            self.dirs.insert(wd, dir);
        }
        Ok(first)
    }

    /// Subdirectory `name` of `dir`, never through a symlink nor into the service directory.
    fn open_sub(&self, dir: &OwnedFd, name: &OsString) -> Option<OwnedFd> {
        let fd = rustix::fs::openat(
            dir,
            name.as_os_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        (!self.root.denied(&st)).then_some(fd)
    }

    /// Watched directory `dir`, opened again.
    fn reopen(&self, dir: &Dir) -> Option<OwnedFd> {
        let res = self.root.resolve_bytes(dir.host.as_bytes(), FOLLOW).ok()?;
        res.open_dir().ok()
    }

    fn change(
        &mut self,
        change: ChangeKind,
        path: String,
        entry: Option<FileEntry>,
        emit: &mut dyn FnMut(Event),
    ) {
        self.sent += 1;
        emit(Event::Change {
            change,
            path,
            entry: entry.map(Box::new),
        });
    }
}

/// Watches directory `path` (`shown` in messages) until `stop` says the client went, or the
/// directory itself is removed or moved. `emit` sends events. Answers the changes sent. `ino` is
/// the instance to watch with, created by the caller as the helper's own uid (its per-uid
/// limits are then out of the sandbox's reach), or why it could not be.
pub fn watch(
    root: &Root,
    ino: std::io::Result<Inotify>,
    path: &str,
    shown: &str,
    recursive: bool,
    stop: &Stop<'_>,
    emit: &mut dyn FnMut(Event),
) -> Result<u64, OpError> {
    let res = root
        .resolve_bytes(path.as_bytes(), FOLLOW)
        .map_err(|e| resolve_err(e, shown))?;
    if res.file_type() != Some(FileType::Directory) {
        return Err(fail(
            FsErrorCode::NotADirectory,
            format!("{shown} is not a directory"),
        ));
    }
    let fd = res.open_dir().map_err(|e| open_err(e, shown))?;
    let ino = ino.map_err(|e| io_fail(e, shown))?;
    let mut w = Watcher {
        root,
        ino,
        dirs: HashMap::new(),
        recursive,
        sent: 0,
        full: false,
        scanned: HashMap::new(),
    };
    let dir = Dir {
        host: path.to_string(),
        shown: shown.to_string(),
    };
    let top = w.add(fd, dir, false, emit).map_err(|e| io_fail(e, shown))?;
    emit(Event::Armed {
        watches: u32::try_from(w.dirs.len()).unwrap_or(u32::MAX),
    });
    let Some(top) = top else {
        return Ok(w.sent);
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        stop.check()?;
        let ts = Timespec {
            tv_sec: 0,
            tv_nsec: TICK.as_nanos() as _,
        };
        let mut fds = [PollFd::new(&w.ino, PollFlags::IN)];
        if rustix::event::poll(&mut fds, Some(&ts)).unwrap_or(0) == 0 {
            continue;
        }
        // Owned, so the watcher may be changed (new directories) while they are handled.
        let events: Vec<(WatchDescriptor, EventMask, Option<OsString>)> =
            match w.ino.read_events(&mut buf) {
                Ok(evs) => evs
                    .map(|e| (e.wd, e.mask, e.name.map(OsStr::to_owned)))
                    .collect(),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(io_fail(e, shown)),
            };
        let mut last_write: Option<(WatchDescriptor, OsString)> = None;
        for (wd, m, name) in events {
            if m.contains(EventMask::Q_OVERFLOW) {
                emit(Event::Overflow);
                continue;
            }
            if m.contains(EventMask::IGNORED) {
                w.dirs.remove(&wd);
                w.scanned.retain(|(d, _), _| d != &wd);
                if wd == top {
                    return Ok(w.sent);
                }
                continue;
            }
            if wd == top && m.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF) {
                let kind = if m.contains(EventMask::DELETE_SELF) {
                    ChangeKind::Remove
                } else {
                    ChangeKind::Rename
                };
                w.change(kind, shown.to_string(), None, emit);
                return Ok(w.sent);
            }
            let (Some(name), Some(dir)) = (name, w.dirs.get(&wd)) else {
                continue;
            };
            let path = child(&dir.shown, &name);
            let kind = if m.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
                ChangeKind::Create
            } else if m.contains(EventMask::MODIFY) {
                // Writes to one file in a row are one change.
                if last_write.as_ref() == Some(&(wd.clone(), name.clone())) {
                    continue;
                }
                ChangeKind::Write
            } else if m.contains(EventMask::DELETE) {
                ChangeKind::Remove
            } else if m.contains(EventMask::MOVED_FROM) {
                ChangeKind::Rename
            } else if m.contains(EventMask::ATTRIB) {
                ChangeKind::Chmod
            } else {
                continue;
            };
            last_write = (kind == ChangeKind::Write).then(|| (wd.clone(), name.clone()));
            let fd = match kind {
                ChangeKind::Remove | ChangeKind::Rename => None,
                _ => w.reopen(dir),
            };
            let host = child(&dir.host, &name);
            let found = fd.as_ref().and_then(|fd| stat_entry(fd, &name, &path));
            // A scan's entry leaves the memory with the first later report of its name: the
            // kernel's report of the very same creation is dropped, anything else is news.
            let scanned = w.scanned.remove(&(wd.clone(), name.clone()));
            if kind == ChangeKind::Create
                && scanned.is_some()
                && scanned == found.as_ref().map(|(_, ino)| *ino)
            {
                continue;
            }
            let entry = found.map(|(e, _)| e);
            let new_dir = kind == ChangeKind::Create && w.recursive && m.contains(EventMask::ISDIR);
            let sub = fd
                .as_ref()
                .filter(|_| new_dir)
                .and_then(|fd| w.open_sub(fd, &name));
            w.change(kind, path.clone(), entry, emit);
            if let Some(sub) = sub {
                let _ = w.add(sub, Dir { host, shown: path }, true, emit);
            }
        }
    }
}
