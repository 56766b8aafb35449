//! `extract` (a seed tar into a directory) and `clear` (empty a directory), neither ever
//! following a symlink below the destination.
//!
//! The control plane sanitised the archive already (regular files, directories, relative
//! symlinks, names relative to `dest`); the helper trusts none of that: `..` members are
//! refused, parents are entered with `O_NOFOLLOW | O_DIRECTORY` (a symlink where a directory is
//! needed refuses the member, counted as skipped), files are created with `O_CREAT | O_EXCL |
//! O_NOFOLLOW`. Names are bytes throughout, so non-UTF-8 names survive.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;
use sandbox_protocol::layout::WORKSPACE;
use sandbox_protocol::message::{ErrorKind, ExtractStats};
use sandbox_protocol::wire::validate_path;

use super::resolve::{Opts, ResolveError, Root, components, make_dir};
use super::{Input, OpError, Stop};

fn io_err(message: String) -> OpError {
    OpError::Fail(ErrorKind::Io, message)
}

fn describe(e: Errno) -> String {
    io::Error::from_raw_os_error(e.raw_os_error()).to_string()
}

/// Resolves `dest` (following links inside the workspace), creating it and its parents when
/// `create`; returns it opened as a directory, or `None` when absent and not created.
fn open_dest(root: &Root, dest: &str, create: bool) -> Result<Option<OwnedFd>, OpError> {
    let opts = Opts {
        follow_final: true,
        create_parents: create,
        missing_ok: true,
    };
    let res = root.resolve(dest, opts).map_err(|e| match e {
        ResolveError::Outside => io_err(format!(
            "{dest}: a symbolic link on the way leads outside {WORKSPACE}"
        )),
        ResolveError::Loop => io_err(format!("{dest}: too many levels of symbolic links")),
        ResolveError::Denied => io_err(format!("{dest}: the service's directory is out of reach")),
        ResolveError::Errno(e) => io_err(format!("{dest}: {}", describe(e))),
    })?;
    if res.stat.is_none() {
        if !create {
            return Ok(None);
        }
        if let Some(name) = &res.name {
            match make_dir(&res.dir, name, 0o755) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(io_err(format!("{dest}: {}", describe(e)))),
            }
        }
    } else if res.file_type() != Some(FileType::Directory) {
        return Err(io_err(format!("{dest} is not a directory")));
    }
    res.open_dir()
        .map(Some)
        .map_err(|e| io_err(format!("{dest}: {}", describe(e))))
}

fn open_dir_nofollow(dir: &OwnedFd, name: &[u8]) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        dir,
        OsStr::from_bytes(name),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// The directory for a member's parent components, created (0755) where missing; a symlink or
/// non-directory on the way is an error.
fn open_parents(dest: &OwnedFd, comps: &[Vec<u8>]) -> Result<Option<OwnedFd>, Errno> {
    let mut cur: Option<OwnedFd> = None;
    for c in comps {
        let base = cur.as_ref().unwrap_or(dest);
        let next = match open_dir_nofollow(base, c) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                match make_dir(base, &OsString::from_vec(c.clone()), 0o755) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e),
                }
                open_dir_nofollow(base, c)?
            }
            Err(e) => return Err(e),
        };
        cur = Some(next);
    }
    Ok(cur)
}

/// Removes a non-directory in the way (a later tar member replaces an earlier one); a directory
/// stays and the member is refused.
fn replace_non_dir(dir: &OwnedFd, name: &OsStr) -> bool {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::Directory => {
            rustix::fs::unlinkat(dir, name, AtFlags::empty()).is_ok()
        }
        _ => false,
    }
}

/// Extracts the tar stream of `input` into `dest`, then reads the input to its end.
pub fn extract(
    root: &Root,
    dest: &str,
    input: &mut Input,
    stop: &Stop<'_>,
) -> Result<ExtractStats, OpError> {
    let dest = validate_path(dest, true).map_err(|m| OpError::Fail(ErrorKind::BadRequest, m))?;
    let dest_fd =
        open_dest(root, &dest, true)?.ok_or_else(|| io_err(format!("{dest}: not created")))?;
    let mut stats = ExtractStats::default();
    {
        let reader = input.reader(stop);
        let mut archive = tar::Archive::new(reader);
        let halt_or = |e: io::Error, what: &str| match stop.check() {
            Err(h) => OpError::Halt(h),
            Ok(()) => io_err(format!("{what}: {e}")),
        };
        let entries = archive
            .entries()
            .map_err(|e| halt_or(e, "reading the archive failed"))?;
        // The last member's parent directory, reused while members stay in it.
        let mut last_parent: Option<(Vec<Vec<u8>>, Option<OwnedFd>)> = None;
        for entry in entries {
            stop.check()?;
            let mut entry = entry.map_err(|e| halt_or(e, "reading the archive failed"))?;
            let name = entry.path_bytes().into_owned();
            let comps: Vec<Vec<u8>> = components(&name).collect();
            let Some((leaf, parents)) = comps.split_last() else {
                continue; // "./": dest itself
            };
            if comps.iter().any(|c| c == b"..") {
                stats.skipped += 1;
                continue;
            }
            let cached = last_parent.as_ref().is_some_and(|(p, _)| p == parents);
            if !cached {
                match open_parents(&dest_fd, parents) {
                    Ok(fd) => last_parent = Some((parents.to_vec(), fd)),
                    Err(_) => {
                        last_parent = None;
                        stats.skipped += 1;
                        continue;
                    }
                }
            }
            let Some((_, parent)) = &last_parent else {
                continue;
            };
            let dir = parent.as_ref().unwrap_or(&dest_fd);
            let leaf_os = OsStr::from_bytes(leaf);
            let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
            let shown = String::from_utf8_lossy(&name).into_owned();
            match entry.header().entry_type() {
                tar::EntryType::Directory => {
                    let mode = mode | 0o700;
                    let made = match make_dir(dir, &leaf_os.to_os_string(), mode) {
                        Ok(()) => true,
                        Err(Errno::EXIST) => {
                            // An existing directory is fine (its mode is updated); anything
                            // else in the way refuses the member.
                            match rustix::fs::openat(
                                dir,
                                leaf_os,
                                OFlags::RDONLY
                                    | OFlags::DIRECTORY
                                    | OFlags::NOFOLLOW
                                    | OFlags::CLOEXEC,
                                Mode::empty(),
                            ) {
                                Ok(fd) => {
                                    let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode));
                                    true
                                }
                                Err(_) => false,
                            }
                        }
                        Err(e) => return Err(io_err(format!("{shown}: {}", describe(e)))),
                    };
                    if made {
                        stats.dirs += 1;
                    } else {
                        stats.skipped += 1;
                    }
                    // A cached parent may be this very path re-created; keep it simple.
                    last_parent = None;
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let flags = OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC;
                    let m = Mode::from_raw_mode(mode);
                    let fd = match rustix::fs::openat(dir, leaf_os, flags, m) {
                        Err(Errno::EXIST) if replace_non_dir(dir, leaf_os) => {
                            rustix::fs::openat(dir, leaf_os, flags, m)
                        }
                        r => r,
                    };
                    let fd = match fd {
                        Ok(fd) => fd,
                        Err(Errno::EXIST | Errno::ISDIR | Errno::LOOP) => {
                            stats.skipped += 1;
                            continue;
                        }
                        Err(e) => return Err(io_err(format!("{shown}: {}", describe(e)))),
                    };
                    let _ = rustix::fs::fchmod(&fd, m);
                    let mut file = File::from(fd);
                    let n = io::copy(&mut entry, &mut file)
                        .map_err(|e| halt_or(e, &format!("writing {shown} failed")))?;
                    if let Ok(mtime) = entry.header().mtime() {
                        let t = Timespec {
                            tv_sec: mtime as _,
                            tv_nsec: 0,
                        };
                        let _ = rustix::fs::futimens(
                            &file,
                            &Timestamps {
                                last_access: t,
                                last_modification: t,
                            },
                        );
                    }
                    stats.files += 1;
                    stats.bytes += n;
                }
                tar::EntryType::Symlink => {
                    let Some(target) = entry.link_name_bytes() else {
                        stats.skipped += 1;
                        continue;
                    };
                    let target = OsStr::from_bytes(&target);
                    let r = match rustix::fs::symlinkat(target, dir, leaf_os) {
                        Err(Errno::EXIST) if replace_non_dir(dir, leaf_os) => {
                            rustix::fs::symlinkat(target, dir, leaf_os)
                        }
                        r => r,
                    };
                    match r {
                        Ok(()) => stats.symlinks += 1,
                        Err(Errno::EXIST) => stats.skipped += 1,
                        Err(e) => return Err(io_err(format!("{shown}: {}", describe(e)))),
                    }
                }
                _ => stats.skipped += 1,
            }
        }
    }
    input.drain(stop)?;
    Ok(stats)
}

/// Removes everything inside `dest`, never following a symlink (links are removed, not
/// entered); `dest` itself stays. An absent `dest` is already clear.
pub fn clear(root: &Root, dest: &str, stop: &Stop<'_>) -> Result<(), OpError> {
    let dest = validate_path(dest, true).map_err(|m| OpError::Fail(ErrorKind::BadRequest, m))?;
    let Some(fd) = open_dest(root, &dest, false)? else {
        return Ok(());
    };
    let fail = |e: Errno| io_err(format!("clearing {dest} failed: {}", describe(e)));
    struct Frame {
        fd: OwnedFd,
        /// This directory's name in the frame below, removed once it is empty.
        name: Option<Vec<u8>>,
        pending: Vec<Vec<u8>>,
    }
    let names = |fd: &OwnedFd| -> Result<Vec<Vec<u8>>, Errno> {
        let mut dir = Dir::read_from(fd)?;
        let mut v = Vec::new();
        while let Some(e) = dir.read() {
            let e = e?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                v.push(n.to_vec());
            }
        }
        Ok(v)
    };
    let pending = names(&fd).map_err(fail)?;
    let mut stack = vec![Frame {
        fd,
        name: None,
        pending,
    }];
    let mut seen = 0u64;
    while let Some(top) = stack.last_mut() {
        seen += 1;
        if seen.is_multiple_of(256) {
            stop.check()?;
        }
        let Some(name) = top.pending.pop() else {
            let done = stack.pop();
            if let (Some(done), Some(below)) = (done, stack.last())
                && let Some(n) = done.name
            {
                drop(done.fd);
                rustix::fs::unlinkat(&below.fd, OsStr::from_bytes(&n), AtFlags::REMOVEDIR)
                    .map_err(fail)?;
            }
            continue;
        };
        let os = OsStr::from_bytes(&name);
        match rustix::fs::unlinkat(&top.fd, os, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::ISDIR | Errno::PERM) => {
                let child = rustix::fs::openat(
                    &top.fd,
                    os,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(fail)?;
                let pending = names(&child).map_err(fail)?;
                stack.push(Frame {
                    fd: child,
                    name: Some(name),
                    pending,
                });
            }
            Err(e) => return Err(fail(e)),
        }
    }
    Ok(())
}
