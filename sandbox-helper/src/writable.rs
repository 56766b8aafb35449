//! `writable-paths --uids A-B --gids C-D [--except /p1,/p2,...]`: the paths of an image that
//! a sandbox user could create files in or change, outside the paths the service puts on
//! volumes. None means the image's own filesystem cannot change under a sandbox, so a
//! snapshot can skip `docker commit`.
//!
//! The service runs it as root in a throwaway container of the image. The sandbox user has a
//! uid in A..=B, a primary gid in C..=D, no supplementary groups and no capabilities, so an
//! entry is reported when its owner is in the uid range (an owner can `chmod` it, whatever
//! its mode), its mode has `S_IWOTH`, or its group is in the gid range and its mode has
//! `S_IWGRP`. Whether the sandbox can reach the entry is not asked: reporting too much only
//! costs a commit. Symlinks are never reported: changing one takes write access to its
//! directory, reported on its own.
//!
//! The walk is fd-relative, as in `copy_tree` (`openat` with `O_NOFOLLOW`, `fstatat` with
//! `AT_SYMLINK_NOFOLLOW`), so no symlink is followed. It stays on the root's filesystem (an
//! entry of another `st_dev` is skipped: `/proc`, `/sys`, `/dev`, bind mounts, volumes), skips
//! the `--except` paths, descends into every directory, reported or not (a closed directory
//! may hold an open one), and holds one descriptor per level, so at most [`MAX_DEPTH`] levels
//! are walked (`deep` says some were not). Past [`MAX_PATHS`] found it stops: the answer is
//! settled.

use std::ffi::{CStr, OsStr};
use std::fmt;
use std::io;
use std::ops::RangeInclusive;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use serde::Serialize;

/// The most directory levels (the root included) walked, each holding a descriptor: well
/// under the common soft `RLIMIT_NOFILE` of 1024.
pub const MAX_DEPTH: usize = 256;

/// The most paths listed: enough to say why a commit is needed.
pub const MAX_PATHS: usize = 64;

/// What the walk found: printed as the one JSON line of a successful `writable-paths`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Found {
    /// Each path a sandbox user could change, from the root, shown absolute (a non-UTF-8
    /// name lossily), in walk order.
    pub paths: Vec<String>,
    /// More than [`MAX_PATHS`] were found; the walk stopped there.
    pub truncated: bool,
    /// Some directory lay deeper than [`MAX_DEPTH`] levels and was not walked.
    pub deep: bool,
}

/// Why the walk stopped: at `path` (shown absolute from the root), doing `reason`.
#[derive(Debug)]
pub struct WalkError {
    pub path: PathBuf,
    pub reason: String,
}

impl fmt::Display for WalkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Escaped: a name may hold a newline, and the message must stay one line.
        let path = self.path.to_string_lossy();
        write!(f, "{}: {}", path.escape_debug(), self.reason)
    }
}

impl std::error::Error for WalkError {}

/// The command's flags: `--uids A-B --gids C-D [--except /p1,/p2,...]`, in any order, each
/// once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub uids: RangeInclusive<u32>,
    pub gids: RangeInclusive<u32>,
    pub except: Vec<PathBuf>,
}

impl Args {
    /// `None` for anything else: a missing or repeated flag, a range not `A-B` with A <= B, an
    /// empty or relative `--except` path (which would never match).
    pub fn parse(args: &[&str]) -> Option<Self> {
        let (mut uids, mut gids, mut except) = (None, None, None);
        for pair in args.chunks(2) {
            let [flag, value] = pair else { return None };
            let slot = match *flag {
                "--uids" => &mut uids,
                "--gids" => &mut gids,
                "--except" => &mut except,
                _ => return None,
            };
            if slot.replace(*value).is_some() {
                return None;
            }
        }
        let except = match except {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|p| p.starts_with('/').then(|| PathBuf::from(p)))
                .collect::<Option<_>>()?,
        };
        Some(Self {
            uids: range(uids?)?,
            gids: range(gids?)?,
            except,
        })
    }
}

fn range(s: &str) -> Option<RangeInclusive<u32>> {
    let (a, b) = s.split_once('-')?;
    let (a, b) = (a.parse().ok()?, b.parse().ok()?);
    (a <= b).then_some(a..=b)
}

/// `writable-paths ...` over `/`: the JSON of [`Found`] on stdout and exit 0; a failure, one
/// line naming the path on stderr and exit 1.
pub fn command(args: &Args) -> ExitCode {
    let found = writable_paths(
        Path::new("/"),
        args.uids.clone(),
        args.gids.clone(),
        &args.except,
    );
    let line = found
        .map_err(|e| e.to_string())
        .and_then(|found| serde_json::to_string(&found).map_err(|e| e.to_string()));
    match line {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("daiv-sandbox-helper: writable-paths: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The entries under the directory `root` (itself included) that a user with a uid in `uids`
/// and a gid in `gids` could change (see the module doc), skipping those whose path from
/// `root`, shown absolute, is in `except`. `root`'s last component may not be a symlink; the
/// components before it are trusted.
pub fn writable_paths(
    root: &Path,
    uids: RangeInclusive<u32>,
    gids: RangeInclusive<u32>,
    except: &[PathBuf],
) -> Result<Found, WalkError> {
    let mut walk = Walk {
        uids,
        gids,
        except,
        dev: 0,
        found: Found::default(),
    };
    if walk.excepted(b"") {
        return Ok(walk.found);
    }
    let fd = open_dir(CWD, root).map_err(fail(b"", "cannot open"))?;
    let st = rustix::fs::fstat(&fd).map_err(fail(b"", "cannot stat"))?;
    walk.dev = st.st_dev;
    if walk.note(&st, b"") {
        return Ok(walk.found);
    }
    let mut stack = vec![Level {
        dir: Dir::new(fd).map_err(fail(b"", "cannot list"))?,
        rel: Vec::new(),
    }];
    while let Some(top) = stack.last_mut() {
        let entry = match top.dir.read() {
            Some(Ok(entry)) => entry,
            Some(Err(e)) => return Err(fail(&top.rel, "cannot list")(e)),
            None => {
                stack.pop();
                continue;
            }
        };
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let depth = stack.len();
        let Some(parent) = stack.last() else { break };
        match walk.entry(parent, name, depth)? {
            Next::Skip => {}
            Next::Descend(level) => stack.push(level),
            Next::Stop => break,
        }
    }
    Ok(walk.found)
}

/// A directory being walked: its stream and its path from the root (no leading `/`).
struct Level {
    dir: Dir,
    rel: Vec<u8>,
}

impl Level {
    fn fd(&self) -> Result<BorrowedFd<'_>, WalkError> {
        self.dir.fd().map_err(fail(&self.rel, "cannot read"))
    }
}

/// What follows an entry.
enum Next {
    Skip,
    Descend(Level),
    /// [`MAX_PATHS`] passed: nothing more changes the answer.
    Stop,
}

/// The walk's state across entries.
struct Walk<'a> {
    uids: RangeInclusive<u32>,
    gids: RangeInclusive<u32>,
    except: &'a [PathBuf],
    /// The root's filesystem, the only one walked.
    dev: u64,
    found: Found,
}

impl Walk<'_> {
    /// Judges one entry of `parent`, at `depth` levels (the root's entries at 1).
    fn entry(&mut self, parent: &Level, name: &CStr, depth: usize) -> Result<Next, WalkError> {
        let rel = join(&parent.rel, name.to_bytes());
        if self.excepted(&rel) {
            return Ok(Next::Skip);
        }
        let st = rustix::fs::statat(parent.fd()?, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(fail(&rel, "cannot stat"))?;
        if st.st_dev != self.dev {
            return Ok(Next::Skip);
        }
        if self.note(&st, &rel) {
            return Ok(Next::Stop);
        }
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Ok(Next::Skip);
        }
        if depth >= MAX_DEPTH {
            self.found.deep = true;
            return Ok(Next::Skip);
        }
        let fd = open_dir(parent.fd()?, name).map_err(fail(&rel, "cannot open"))?;
        let opened = rustix::fs::fstat(&fd).map_err(fail(&rel, "cannot stat"))?;
        // Another inode by now (a mount, a swap) is not what was judged.
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino) {
            return Err(failed(&rel, "changed while being walked".to_string()));
        }
        Ok(Next::Descend(Level {
            dir: Dir::new(fd).map_err(fail(&rel, "cannot list"))?,
            rel,
        }))
    }

    /// Lists `rel` when a sandbox user could change it; true once past [`MAX_PATHS`].
    fn note(&mut self, st: &Stat, rel: &[u8]) -> bool {
        if !self.changeable(st) {
            return false;
        }
        if self.found.paths.len() == MAX_PATHS {
            self.found.truncated = true;
            return true;
        }
        let path = absolute(rel);
        self.found
            .paths
            .push(String::from_utf8_lossy(&path).into_owned());
        false
    }

    fn changeable(&self, st: &Stat) -> bool {
        let mode = st.st_mode;
        FileType::from_raw_mode(mode) != FileType::Symlink
            && (self.uids.contains(&st.st_uid)
                || mode & 0o002 != 0
                || (self.gids.contains(&st.st_gid) && mode & 0o020 != 0))
    }

    fn excepted(&self, rel: &[u8]) -> bool {
        let path = absolute(rel);
        let path = Path::new(OsStr::from_bytes(&path));
        self.except.iter().any(|e| e == path)
    }
}

/// Opens a directory for listing without following a final symlink.
fn open_dir<P: rustix::path::Arg>(dir: impl AsFd, path: P) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        dir,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// A path from the root as the sandbox sees it: `/` then `rel`.
fn absolute(rel: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(1 + rel.len());
    path.push(b'/');
    path.extend_from_slice(rel);
    path
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

fn failed(rel: &[u8], reason: String) -> WalkError {
    WalkError {
        path: PathBuf::from(OsStr::from_bytes(&absolute(rel))),
        reason,
    }
}

/// For `map_err`: a failed syscall at `rel`, doing `what`.
fn fail<'a>(rel: &'a [u8], what: &'a str) -> impl FnOnce(Errno) -> WalkError + 'a {
    move |e| failed(rel, format!("{what}: {}", io::Error::from(e)))
}

#[cfg(test)]
mod tests {
    //! These run as root (here and in CI): they chown to other ids.

    use std::fs;
    use std::os::unix::fs::{PermissionsExt, lchown, symlink};

    use super::*;

    /// A temporary directory holding `root` (0755, root's) and `outside` beside it.
    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (root, outside) = (tmp.path().join("root"), tmp.path().join("outside"));
        fs::create_dir(&root).expect("root");
        fs::create_dir(&outside).expect("outside");
        chmod(&root, 0o755);
        (tmp, root, outside)
    }

    /// A directory with exactly `mode` (mkdir's passes the umask) and owner.
    fn dir(p: &Path, mode: u32, uid: u32, gid: u32) {
        fs::create_dir(p).expect("mkdir");
        lchown(p, Some(uid), Some(gid)).expect("chown");
        chmod(p, mode);
    }

    fn chmod(p: &Path, mode: u32) {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
    }

    /// The sorted paths found, with the flags.
    fn find(
        root: &Path,
        uids: RangeInclusive<u32>,
        gids: RangeInclusive<u32>,
        except: &[&str],
    ) -> (Vec<String>, bool, bool) {
        let except: Vec<PathBuf> = except.iter().map(PathBuf::from).collect();
        let found = writable_paths(root, uids, gids, &except).expect("walk");
        let mut paths = found.paths;
        paths.sort();
        (paths, found.truncated, found.deep)
    }

    /// The sandbox's usual ids, and none of the tree's.
    const UIDS: RangeInclusive<u32> = 1000..=1000;
    const GIDS: RangeInclusive<u32> = 1000..=1000;

    #[test]
    fn nothing_writable_is_an_empty_list() {
        let (_tmp, root, _outside) = setup();
        dir(&root.join("etc"), 0o755, 0, 0);
        fs::write(root.join("etc/passwd"), b"x").expect("write");
        chmod(&root.join("etc/passwd"), 0o644);
        let found = writable_paths(&root, UIDS, GIDS, &[]).expect("walk");
        assert_eq!(found, Found::default());
        assert_eq!(
            serde_json::to_string(&found).expect("json"),
            r#"{"paths":[],"truncated":false,"deep":false}"#
        );
    }

    #[test]
    fn a_sticky_world_writable_dir_is_reported() {
        let (_tmp, root, _outside) = setup();
        dir(&root.join("tmp"), 0o1777, 0, 0);
        let found = writable_paths(&root, UIDS, GIDS, &[]).expect("walk");
        assert_eq!(found.paths, ["/tmp"]);
        assert_eq!(
            serde_json::to_string(&found).expect("json"),
            r#"{"paths":["/tmp"],"truncated":false,"deep":false}"#
        );
    }

    #[test]
    fn a_closed_dir_is_walked_for_open_children() {
        let (_tmp, root, _outside) = setup();
        dir(&root.join("run"), 0o755, 0, 0);
        dir(&root.join("run/lock"), 0o777, 0, 0);
        assert_eq!(
            find(&root, UIDS, GIDS, &[]),
            (vec!["/run/lock".to_string()], false, false)
        );
    }

    #[test]
    fn an_owner_in_the_uid_range_can_change_whatever_the_mode() {
        let (_tmp, root, _outside) = setup();
        fs::write(root.join("f"), b"x").expect("write");
        lchown(root.join("f"), Some(1500), Some(0)).expect("chown");
        chmod(&root.join("f"), 0o444);
        assert_eq!(find(&root, 1000..=2000, GIDS, &[]).0, ["/f"]);
        assert!(find(&root, 1000..=1000, GIDS, &[]).0.is_empty());
    }

    #[test]
    fn a_group_writable_dir_is_reported_for_its_group_only() {
        let (_tmp, root, _outside) = setup();
        dir(&root.join("shared"), 0o775, 0, 1000);
        assert_eq!(find(&root, UIDS, 1000..=1000, &[]).0, ["/shared"]);
        assert!(find(&root, UIDS, 5..=5, &[]).0.is_empty());
        // Its group without the write bit: nothing.
        chmod(&root.join("shared"), 0o755);
        assert!(find(&root, UIDS, 1000..=1000, &[]).0.is_empty());
    }

    #[test]
    fn symlinks_are_neither_reported_nor_followed() {
        let (_tmp, root, outside) = setup();
        chmod(&outside, 0o1777);
        symlink(&outside, root.join("link")).expect("symlink");
        // A link owned by a sandbox uid is no more changeable than its directory.
        lchown(root.join("link"), Some(1000), Some(1000)).expect("lchown");
        // Behind the link, were it followed: a dir the sandbox could write.
        dir(&outside.join("open"), 0o777, 1000, 1000);
        assert_eq!(find(&root, UIDS, GIDS, &[]), (vec![], false, false));
    }

    #[test]
    fn excepted_paths_are_not_reported_nor_walked() {
        let (_tmp, root, _outside) = setup();
        dir(&root.join("workspace"), 0o755, 0, 0);
        dir(&root.join("workspace/tmp"), 0o1777, 0, 0);
        dir(&root.join("home"), 0o755, 0, 0);
        dir(&root.join("home/sandbox"), 0o755, 1000, 1000);
        dir(&root.join("var"), 0o755, 0, 0);
        dir(&root.join("var/tmp"), 0o1777, 0, 0);
        // A trailing slash names the same path.
        let except = ["/workspace", "/home/sandbox/"];
        assert_eq!(find(&root, UIDS, GIDS, &except).0, ["/var/tmp"]);
        assert_eq!(
            find(&root, UIDS, GIDS, &[]).0,
            ["/home/sandbox", "/var/tmp", "/workspace/tmp"]
        );
        // The root excepted: nothing is walked.
        assert!(find(&root, UIDS, GIDS, &["/"]).0.is_empty());
    }

    #[test]
    fn the_root_itself_and_every_kind_of_entry_are_judged() {
        let (_tmp, root, _outside) = setup();
        chmod(&root, 0o777);
        rustix::fs::mkfifoat(CWD, root.join("pipe"), Mode::empty()).expect("fifo");
        chmod(&root.join("pipe"), 0o666);
        let _listener = std::os::unix::net::UnixListener::bind(root.join("sock")).expect("bind");
        chmod(&root.join("sock"), 0o777);
        fs::write(root.join("file"), b"x").expect("write");
        chmod(&root.join("file"), 0o646);
        fs::write(root.join("closed"), b"x").expect("write");
        chmod(&root.join("closed"), 0o664);
        assert_eq!(
            find(&root, UIDS, GIDS, &[]).0,
            ["/", "/file", "/pipe", "/sock"]
        );
    }

    #[test]
    fn past_the_cap_the_list_is_truncated() {
        let (_tmp, root, _outside) = setup();
        for i in 0..MAX_PATHS {
            dir(&root.join(format!("d{i:02}")), 0o777, 0, 0);
        }
        let found = writable_paths(&root, UIDS, GIDS, &[]).expect("walk");
        assert_eq!((found.paths.len(), found.truncated), (MAX_PATHS, false));

        dir(&root.join("one-more"), 0o777, 0, 0);
        let found = writable_paths(&root, UIDS, GIDS, &[]).expect("walk");
        assert_eq!((found.paths.len(), found.truncated), (MAX_PATHS, true));
    }

    #[test]
    fn past_the_depth_limit_dirs_are_judged_but_not_walked() {
        let (_tmp, root, _outside) = setup();
        // Built fd-relative: the path would grow long.
        let mut level = open_dir(CWD, &root).expect("open");
        for _ in 1..MAX_DEPTH {
            rustix::fs::mkdirat(&level, "d", Mode::from_raw_mode(0o755)).expect("mkdir");
            level = open_dir(&level, "d").expect("open");
        }
        // MAX_DEPTH levels, the root included: all walked.
        rustix::fs::mkfifoat(&level, "p", Mode::empty()).expect("fifo");
        rustix::fs::chmodat(&level, "p", Mode::from_raw_mode(0o666), AtFlags::empty())
            .expect("chmod");
        let (paths, truncated, deep) = find(&root, UIDS, GIDS, &[]);
        assert_eq!(paths.len(), 1);
        assert!(paths[0].ends_with("/d/p"), "{paths:?}");
        assert!(!truncated && !deep);

        // One more level: judged (it is open) but not walked (its open child is not seen).
        rustix::fs::mkdirat(&level, "deeper", Mode::empty()).expect("mkdir");
        rustix::fs::chmodat(
            &level,
            "deeper",
            Mode::from_raw_mode(0o777),
            AtFlags::empty(),
        )
        .expect("chmod");
        let deeper = open_dir(&level, "deeper").expect("open");
        rustix::fs::mkdirat(&deeper, "hidden", Mode::empty()).expect("mkdir");
        rustix::fs::chmodat(
            &deeper,
            "hidden",
            Mode::from_raw_mode(0o777),
            AtFlags::empty(),
        )
        .expect("chmod");
        let (paths, _, deep) = find(&root, UIDS, GIDS, &[]);
        assert_eq!(paths.len(), 2);
        assert!(paths.iter().any(|p| p.ends_with("/d/deeper")), "{paths:?}");
        assert!(deep);
    }

    #[test]
    fn other_filesystems_are_skipped() {
        // A tmpfs mounted inside the tree stands for /proc, /dev or a volume.
        let (_tmp, root, _outside) = setup();
        dir(&root.join("mnt"), 0o755, 0, 0);
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=1777", "tmpfs"])
            .arg(root.join("mnt"))
            .status();
        // The helper's tests run as root, as copy-tree's do: a mount that fails is a failure.
        assert!(mounted.is_ok_and(|s| s.success()), "mount tmpfs");
        let found = writable_paths(&root, UIDS, GIDS, &[]);
        let _ = std::process::Command::new("umount")
            .arg(root.join("mnt"))
            .status();
        assert_eq!(found.expect("walk"), Found::default());
    }

    #[test]
    fn names_are_shown_lossily_and_errors_on_one_line() {
        let (_tmp, root, _outside) = setup();
        let name = OsStr::from_bytes(b"caf\xe9\nx");
        dir(&root.join(name), 0o777, 0, 0);
        assert_eq!(find(&root, UIDS, GIDS, &[]).0, ["/caf\u{fffd}\nx"]);

        let err = writable_paths(&root.join("missing"), UIDS, GIDS, &[]).expect_err("missing");
        assert_eq!(err.path, Path::new("/"));
        assert!(err.to_string().starts_with("/: cannot open: "), "{err}");
        let err = failed(b"caf\n", "cannot list: x".into()).to_string();
        assert_eq!(err, "/caf\\n: cannot list: x");
    }

    #[test]
    fn flags_parse_in_any_order_and_refuse_the_rest() {
        let parse = |s: &str| Args::parse(&s.split_whitespace().collect::<Vec<_>>());
        assert_eq!(
            parse("--uids 1000-1999 --gids 1000-1000 --except /workspace,/home/sandbox"),
            Some(Args {
                uids: 1000..=1999,
                gids: 1000..=1000,
                except: vec!["/workspace".into(), "/home/sandbox".into()],
            })
        );
        assert_eq!(
            parse("--gids 5-6 --uids 7-7"),
            Some(Args {
                uids: 7..=7,
                gids: 5..=6,
                except: Vec::new(),
            })
        );
        for bad in [
            "",
            "--uids 1-2",
            "--gids 1-2",
            "--uids 1-2 --gids 1-2 --uids 1-2",
            "--uids 2-1 --gids 1-2",
            "--uids 1 --gids 1-2",
            "--uids 1- --gids 1-2",
            "--uids -1-2 --gids 1-2",
            "--uids 1-2 --gids 1-x",
            "--uids 1-2 --gids 1-2 --except",
            "--uids 1-2 --gids 1-2 --except relative",
            "--uids 1-2 --gids 1-2 --except /a,,/b",
            "--uids 1-2 --gids 1-2 --max 3",
            "--uids 1-2 --gids 1-2 extra",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
